// HDF5 helpers: checked calls, error-stack capture, files, groups, attributes, tensor datasets.
#include "moe/io/hdf5.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>
#include <system_error>

#include "io/hdf5_driver.h"
#include "io/hdf5_errors.h"
#include "moe/arena.h"
#include "moe/io/input.h"
#include "moe/log.h"

namespace moe::io::h5 {

namespace {

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

bool mentions(const std::vector<std::string>& causes, const char* word) {
  return std::any_of(causes.begin(), causes.end(),
                     [&](const std::string& c) { return c.find(word) != std::string::npos; });
}

// The file a writer was creating, as the user named it: its temporary ("x.h5.tmp-123",
// "x.h5.convert-123", see AtomicFile) without the suffix.
std::string shown_name(const std::string& path) {
  static const std::regex temporary(R"(\.(tmp|convert)-[0-9]+$)");
  return std::regex_replace(path, temporary, "");
}

[[noreturn]] void refuse_open(const char* what, const std::string& name, uintmax_t size) {
  const ErrorStack errors = take_errors();
  MOE_LOG_DEBUG("H5Fopen('", name, "') failed: ", join(errors.causes, "; "));
  if (mentions(errors.causes, "truncated"))
    throw Error(str(what, " '", name, "': truncated file (", size,
                    " bytes, fewer than the HDF5 superblock records)"));
  throw Error(str(what, " '", name, "': cannot open as HDF5: ", cause_in_words(errors)));
}

std::string child_path(const std::string& parent, const std::string& name) {
  if (parent.empty() || parent == "/") return "/" + name;
  return parent + "/" + name;
}

Space scalar_space(const Where& where) { return Space(MOE_H5(where, H5Screate(H5S_SCALAR))); }

// Exact names only: a checkpoint must say precisely what its bytes are.
std::optional<DType> dtype_from_name(const std::string& name) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
    if (name == dtype_name(d)) return d;
  return std::nullopt;
}

std::string type_summary(hid_t type) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  const char* name = cls == H5T_FLOAT     ? "float"
                     : cls == H5T_INTEGER ? "integer"
                     : cls == H5T_STRING  ? "string"
                                          : "non-numeric";
  std::string s = str(size, "-byte ", name);
  if (cls == H5T_FLOAT) {
    size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) >= 0)
      s += str(" (sign ", spos, ", exponent ", esize, " bits at ", epos, ", mantissa ", msize,
               " bits, bias ", H5Tget_ebias(type), ")");
  }
  H5Eclear2(H5E_DEFAULT);
  return s;
}

}  // namespace

std::string Where::describe() const { return str("'", file, "' ", object); }

Session::Session() {
  static std::recursive_mutex mutex;
  lock_ = std::unique_lock<std::recursive_mutex>(mutex);
  // We report errors ourselves, with the file and object; HDF5 must not print to stderr.
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

// ---- files ------------------------------------------------------------------------------------

Plist file_access_plist(const Where& where) {
  Plist fapl(MOE_H5(where, H5Pcreate(H5P_FILE_ACCESS)));
  // 1.10 object formats: checksummed superblock (v3), object headers, B-trees and chunk indexes
  // (the 1.8 formats index chunks with unchecksummed v1 B-trees). See docs/FORMATS.md.
  MOE_H5(where, H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110));
  MOE_H5(where, H5Pset_file_locking(fapl, true, true));
  return fapl;
}

void keep_compact(hid_t object_create_plist, bool links, const Where& where) {
  // Links and attributes stay in the (checksummed) object header instead of moving to a fractal
  // heap past 8 of them: libhdf5 1.10 crashes on a damaged dense link table
  // (H5G__link_release_table frees entries it never filled).
  MOE_H5(where, H5Pset_attr_phase_change(object_create_plist, kMaxCompact, kMaxCompact));
  if (links) MOE_H5(where, H5Pset_link_phase_change(object_create_plist, kMaxCompact, kMaxCompact));
}

Plist file_create_plist(const Where& where) {
  Plist fcpl(MOE_H5(where, H5Pcreate(H5P_FILE_CREATE)));
  keep_compact(fcpl, true, where);  // the root group
  // Aggregators, no free-space manager: the padding before an aligned chunk (kDataAlignment) is
  // left empty instead of handed to the next small allocation, so small chunks (biases) are not
  // scattered into those gaps and chunks written in order lie in order (a frozen layer stays one
  // extent). Files are written once, never grown in place: nothing is lost by not tracking space.
  MOE_H5(where, H5Pset_file_space_strategy(fcpl, H5F_FSPACE_STRATEGY_AGGR, 0, 1));
  return fcpl;
}

WriteFile create_file(const std::string& path, hid_t fapl) {
  Where where{path, "/"};
  Plist own_fapl;
  if (fapl < 0) {
    own_fapl = file_access_plist(where);
    fapl = own_fapl;
  }
  // Data of a page or more starts on a page: a tensor's chunk (an expert's) can then be mapped
  // where it lies (docs/FORMATS.md "Mapped weights"); at most a page lost per such chunk.
  MOE_H5(where, H5Pset_alignment(fapl, kDataAlignment, kDataAlignment));
  auto status = std::make_shared<WriteStatus>();
  use_moe_driver(fapl, status, where);
  Plist fcpl = file_create_plist(where);
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, fapl);
  if (id < 0) {
    const ErrorStack errors = take_errors();
    MOE_LOG_DEBUG("H5Fcreate('", path, "') failed: ", join(errors.causes, "; "));
    const std::string directory = directory_problem(path);
    throw Error(str("cannot create '", shown_name(path),
                    "': ", directory.empty() ? cause_in_words(errors) : directory));
  }
  return WriteFile(File(id), std::move(status));
}

WriteFile open_file_readwrite(const std::string& path) {
  Where where{path, "/"};
  Plist fapl = file_access_plist(where);
  auto status = std::make_shared<WriteStatus>();
  use_moe_driver(fapl, status, where);
  File file(MOE_H5(where, H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl)));
  return WriteFile(std::move(file), std::move(status));
}

void WriteFile::close(const Where& where) {
  if (!file_.valid()) return;
  ErrorStack errors;
  const herr_t flushed = H5Fflush(file_, H5F_SCOPE_GLOBAL);
  if (flushed < 0) errors = take_errors();
  status_->closing = true;  // from here a failed write is recorded, and H5Fclose still succeeds
  const herr_t closed = H5Fclose(file_.release());
  if (closed < 0) {
    ErrorStack more = take_errors();
    if (flushed >= 0) errors = std::move(more);
  }
  if (status_->error)
    throw Error(
        str(where.describe(), ": ", status_->what, " failed: ", std::strerror(status_->error)));
  if (flushed < 0 || closed < 0) {
    MOE_LOG_DEBUG(where.describe(), ": H5Fflush/H5Fclose failed: ", join(errors.causes, "; "));
    throw Error(str(where.describe(), ": closing the file failed: ", cause_in_words(errors)));
  }
}

void WriteFile::abandon() noexcept {
  if (!file_.valid()) return;
  // Whatever is still unwritten is dropped: the caller removes the file.
  if (status_ && !status_->error) {
    status_->error = ECANCELED;
    status_->what = "abandoned";
  }
  if (status_) status_->closing = true;
  H5Fclose(file_.release());
  H5Eclear2(H5E_DEFAULT);
}

File open_file_readonly(const std::string& path, const char* what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) throw Error(str(what, " '", path, "': no such file"));
  check_input_file(path, what);  // a device may never end, a FIFO blocks
  uintmax_t size = fs::file_size(path, ec);
  if (!ec && size == 0) throw Error(str(what, " '", path, "': empty file (0 bytes), not HDF5"));

  htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 < 0) {
    const ErrorStack errors = take_errors();
    MOE_LOG_DEBUG("H5Fis_hdf5('", path, "') failed: ", join(errors.causes, "; "));
    throw Error(str(what, " '", path, "': cannot be read as HDF5: ", cause_in_words(errors)));
  }
  if (is_hdf5 == 0)
    throw Error(
        str(what, " '", path, "': not an HDF5 file (no HDF5 signature in its ", size, " bytes)"));

  Where where{path, "/"};
  Plist fapl = file_access_plist(where);
  use_moe_driver(fapl, nullptr, where);  // checks global heaps before HDF5 parses them
  hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  if (id < 0) {
    refuse_open(what, path, size);
  }
  return File(id);
}

namespace {

// Name HDF5 sees for an in-memory file. Unique per open (HDF5 treats two core-driver files with
// the same name as the same file) and in a directory that does not exist (opening an image fails
// when a file of that name exists on disk).
std::string image_file_name() {
  static uint64_t counter = 0;  // guarded by the h5::Session lock
  return str("/nonexistent-moe-image/", ::getpid(), "-", ++counter);
}

bool has_hdf5_signature(const std::string& bytes) {
  static const char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  // The superblock sits at 0, 512, 1024, 2048, ... (a user block may precede it).
  for (size_t at = 0; at + 8 <= bytes.size(); at = at ? at * 2 : 512)
    if (std::memcmp(bytes.data() + at, kSignature, 8) == 0) return true;
  return false;
}

}  // namespace

File open_image(const std::string& bytes, const std::string& name, const char* what) {
  if (bytes.empty()) throw Error(str(what, " '", name, "': empty file (0 bytes), not HDF5"));
  if (!has_hdf5_signature(bytes))
    throw Error(str(what, " '", name, "': not an HDF5 file (no HDF5 signature in its ",
                    bytes.size(), " bytes)"));
  constexpr size_t kImageIncrement = size_t(1)
                                     << 20;  // core driver growth step (unused: read-only)
  Where where{name, "/"};
  Plist fapl = file_access_plist(where);
  MOE_H5(where, H5Pset_fapl_core(fapl, kImageIncrement, false));
  MOE_H5(where, H5Pset_file_image(fapl, const_cast<char*>(bytes.data()), bytes.size()));
  // Our driver checks an old file's global heaps as HDF5 reads them; the core driver does not.
  if (const std::string heap = damaged_image_heap(bytes); !heap.empty())
    throw Error(str(what, " '", name, "': ", heap));
  hid_t id = H5Fopen(image_file_name().c_str(), H5F_ACC_RDONLY, fapl);
  if (id < 0) {
    refuse_open(what, name, bytes.size());
  }
  return File(id);
}

Group create_group(hid_t parent, const std::string& name, const Where& where) {
  Where w = where.at(child_path(where.object, name));
  Plist gcpl(MOE_H5(w, H5Pcreate(H5P_GROUP_CREATE)));
  MOE_H5(w, H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED));
  keep_compact(gcpl, true, w);
  return Group(MOE_H5(w, H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT)));
}

Group open_group(hid_t parent, const std::string& name, const Where& where) {
  Where w = where.at(child_path(where.object, name));
  if (!has_link(parent, name, where)) throw Error(str(w.describe(), ": missing group"));
  return Group(MOE_H5(w, H5Gopen2(parent, name.c_str(), H5P_DEFAULT)));
}

bool has_link(hid_t parent, const std::string& name, const Where& where) {
  return MOE_H5(where, H5Lexists(parent, name.c_str(), H5P_DEFAULT)) > 0;
}

namespace {

std::string link_name_at(hid_t group, H5_index_t index, H5_iter_order_t order, hsize_t i,
                         const Where& where) {
  ssize_t length =
      MOE_H5(where, H5Lget_name_by_idx(group, ".", index, order, i, nullptr, 0, H5P_DEFAULT));
  std::string name(static_cast<size_t>(length) + 1, '\0');
  MOE_H5(where, H5Lget_name_by_idx(group, ".", index, order, i, name.data(), name.size(),
                                   H5P_DEFAULT));
  name.resize(static_cast<size_t>(length));
  return name;
}

// The names of a dense group without a creation-order index (links past 8 kept in a fractal heap),
// never through libhdf5's table of links: H5Lget_name_by_idx builds one whenever the requested
// order has no index of its own, and on a damaged heap that builder frees entries it never
// filled (free(): invalid pointer, SIGSEGV).
// The name index's own order walks its checksummed B-tree; each link's creation order then comes
// from a lookup by name, and the names are sorted as the group's declared order wants them.
std::vector<std::string> dense_link_names(hid_t group, hsize_t count, bool tracked,
                                          const Where& where) {
  std::vector<std::pair<int64_t, std::string>> links;
  for (hsize_t i = 0; i < count; ++i) {
    std::string name = link_name_at(group, H5_INDEX_NAME, H5_ITER_NATIVE, i, where);
    H5L_info_t info{};
    MOE_H5(where, H5Lget_info(group, name.c_str(), &info, H5P_DEFAULT));
    if (tracked && !info.corder_valid)
      throw Error(str(where.describe(), ": the file is damaged: link '", name,
                      "' has no creation order in a group that tracks it"));
    links.emplace_back(tracked ? info.corder : 0, std::move(name));
  }
  std::sort(links.begin(), links.end());
  for (size_t i = 1; tracked && i < links.size(); ++i)
    if (links[i].first == links[i - 1].first)
      throw Error(str(where.describe(), ": the file is damaged: links '", links[i - 1].second,
                      "' and '", links[i].second, "' share a creation order"));
  std::vector<std::string> names;
  for (auto& [order, name] : links) names.push_back(std::move(name));
  return names;
}

}  // namespace

std::vector<std::string> list_links(hid_t group, const Where& where) {
  Plist gcpl(MOE_H5(where, H5Gget_create_plist(group)));
  unsigned order_flags = 0;
  MOE_H5(where, H5Pget_link_creation_order(gcpl, &order_flags));
  const bool tracked = (order_flags & H5P_CRT_ORDER_TRACKED) != 0;
  H5G_info_t group_info{};
  MOE_H5(where, H5Gget_info(group, &group_info));
  if (group_info.storage_type == H5G_STORAGE_TYPE_DENSE && !(order_flags & H5P_CRT_ORDER_INDEXED))
    return dense_link_names(group, group_info.nlinks, tracked, where);
  // Compact groups (today's files), dense groups with a creation-order index (earlier builds':
  // libhdf5 walks that checksummed B-tree) and symbol tables: one name at a time, never
  // H5Literate, which builds the table of links for every group.
  const H5_index_t index = tracked ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  std::vector<std::string> names;
  for (hsize_t i = 0; i < group_info.nlinks; ++i)
    names.push_back(link_name_at(group, index, H5_ITER_INC, i, where));
  return names;
}

// ---- attributes -------------------------------------------------------------------------------

bool has_attr(hid_t object, const char* name, const Where& where) {
  return MOE_H5(where, H5Aexists(object, name)) > 0;
}

namespace {

Attr create_attr(hid_t object, const char* name, hid_t type, hid_t space, const Where& where) {
  if (has_attr(object, name, where)) MOE_H5(where, H5Adelete(object, name));
  return Attr(MOE_H5(where, H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT)));
}

Attr open_attr(hid_t object, const char* name, const Where& where) {
  if (!has_attr(object, name, where))
    throw Error(str(where.describe(), ": missing attribute '", name, "'"));
  return Attr(MOE_H5(where, H5Aopen(object, name, H5P_DEFAULT)));
}

hssize_t attr_elements(hid_t attr, const Where& where) {
  Space space(MOE_H5(where, H5Aget_space(attr)));
  return MOE_H5(where, H5Sget_simple_extent_npoints(space));
}

void expect_class(hid_t attr, H5T_class_t expected, const char* name, const char* what,
                  const Where& where) {
  Type type(MOE_H5(where, H5Aget_type(attr)));
  if (MOE_H5(where, H5Tget_class(type)) != expected)
    throw Error(str(where.describe(), ": attribute '", name, "' is a ", type_summary(type),
                    ", expected ", what));
}

}  // namespace

void write_string_attr(hid_t object, const char* name, const std::string& value,
                       const Where& where) {
  // Fixed-length, exactly the text's size, null-padded: the bytes live in the checksummed object
  // header. A variable-length string would put them in the global heap, which has no checksum
  // and whose damage crashes or hangs libhdf5.
  Type type(MOE_H5(where, H5Tcopy(H5T_C_S1)));
  MOE_H5(where, H5Tset_size(type, std::max<size_t>(1, value.size())));
  MOE_H5(where, H5Tset_strpad(type, H5T_STR_NULLPAD));
  MOE_H5(where, H5Tset_cset(type, H5T_CSET_UTF8));
  Space space = scalar_space(where);
  Attr attr = create_attr(object, name, type, space, where);
  std::string padded = value;
  padded.resize(std::max<size_t>(1, value.size()), '\0');
  MOE_H5(where, H5Awrite(attr, type, padded.data()));
}

std::string read_string_attr(hid_t object, const char* name, const Where& where) {
  Attr attr = open_attr(object, name, where);
  expect_class(attr, H5T_STRING, name, "a string", where);
  if (attr_elements(attr, where) != 1)
    throw Error(str(where.describe(), ": attribute '", name, "' is not a single string"));
  Type file_type(MOE_H5(where, H5Aget_type(attr)));
  Type mem_type(MOE_H5(where, H5Tcopy(file_type)));
  if (MOE_H5(where, H5Tis_variable_str(file_type)) > 0) {
    char* text = nullptr;
    MOE_H5(where, H5Aread(attr, mem_type, &text));
    std::string value = text ? text : "";
    if (text) H5free_memory(text);
    return value;
  }
  size_t size = H5Tget_size(file_type);
  if (size == 0) fail(where, "H5Tget_size(file_type)", __FILE__, __LINE__);
  std::vector<char> buffer(size + 1, '\0');
  MOE_H5(where, H5Aread(attr, mem_type, buffer.data()));
  std::string value(buffer.data(), strnlen(buffer.data(), size));
  if (H5Tget_strpad(file_type) == H5T_STR_SPACEPAD) value.erase(value.find_last_not_of(' ') + 1);
  return value;
}

namespace {

void write_scalar_attr(hid_t object, const char* name, hid_t file_type, hid_t mem_type,
                       const void* value, const Where& where) {
  Space space = scalar_space(where);
  Attr attr = create_attr(object, name, file_type, space, where);
  MOE_H5(where, H5Awrite(attr, mem_type, value));
}

// Any stored integer type, converted by HDF5 to `mem_type` (range-checked by the library).
void read_single_integer(hid_t object, const char* name, hid_t mem_type, void* value,
                         const Where& where) {
  Attr attr = open_attr(object, name, where);
  expect_class(attr, H5T_INTEGER, name, "an integer", where);
  if (attr_elements(attr, where) != 1)
    throw Error(str(where.describe(), ": attribute '", name, "' is not a single integer"));
  MOE_H5(where, H5Aread(attr, mem_type, value));
}

}  // namespace

void write_int_attr(hid_t object, const char* name, int64_t value, const Where& where,
                    hid_t file_type) {
  write_scalar_attr(object, name, file_type, H5T_NATIVE_INT64, &value, where);
}

int64_t read_int_attr(hid_t object, const char* name, const Where& where) {
  int64_t value = 0;
  read_single_integer(object, name, H5T_NATIVE_INT64, &value, where);
  return value;
}

void write_uint_attr(hid_t object, const char* name, uint64_t value, const Where& where) {
  write_scalar_attr(object, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value, where);
}

uint64_t read_uint_attr(hid_t object, const char* name, const Where& where) {
  uint64_t value = 0;
  read_single_integer(object, name, H5T_NATIVE_UINT64, &value, where);
  return value;
}

void write_int32_array_attr(hid_t object, const char* name, const std::vector<int>& values,
                            const Where& where) {
  hsize_t n = values.size();
  Space space(MOE_H5(where, H5Screate_simple(1, &n, nullptr)));
  Attr attr = create_attr(object, name, H5T_STD_I32LE, space, where);
  if (n) MOE_H5(where, H5Awrite(attr, H5T_NATIVE_INT, values.data()));
}

std::vector<int> read_int32_array_attr(hid_t object, const char* name, const Where& where) {
  Attr attr = open_attr(object, name, where);
  expect_class(attr, H5T_INTEGER, name, "an integer array", where);
  Space space(MOE_H5(where, H5Aget_space(attr)));
  H5S_class_t cls = MOE_H5(where, H5Sget_simple_extent_type(space));
  if (cls == H5S_NULL) return {};
  if (cls != H5S_SIMPLE || MOE_H5(where, H5Sget_simple_extent_ndims(space)) != 1)
    throw Error(str(where.describe(), ": attribute '", name, "' is not a one-dimensional array"));
  std::vector<int> values(static_cast<size_t>(MOE_H5(where, H5Sget_simple_extent_npoints(space))));
  if (!values.empty()) MOE_H5(where, H5Aread(attr, H5T_NATIVE_INT, values.data()));
  return values;
}

// ---- types and tensor datasets ----------------------------------------------------------------

Type dtype_type(DType dtype) {
  Where where{"(memory)", str("HDF5 type for ", dtype_name(dtype))};
  auto copy = [&](hid_t base) { return Type(MOE_H5(where, H5Tcopy(base))); };
  switch (dtype) {
    case DType::f32:
      return copy(H5T_IEEE_F32LE);
    case DType::f16:
    case DType::bf16: {
      // Shrink a copy of IEEE f32: the fields first (so they fit), then the size, then the bias.
      bool half = dtype == DType::f16;
      Type type = copy(H5T_IEEE_F32LE);
      MOE_H5(where, H5Tset_fields(type, 15, half ? 10 : 7, half ? 5 : 8, 0, half ? 10 : 7));
      MOE_H5(where, H5Tset_size(type, 2));
      MOE_H5(where, H5Tset_ebias(type, half ? 15 : 127));
      return type;
    }
    case DType::i32:
      return copy(H5T_STD_I32LE);
    case DType::i64:
      return copy(H5T_STD_I64LE);
    case DType::u8:
      return copy(H5T_STD_U8LE);
    case DType::q8_0:
    case DType::q4_k:
    case DType::q6_k:
    case DType::mxfp4:
      throw Error(str("no HDF5 type for ", dtype_name(dtype),
                      " weights: they exist in memory only (files hold their rows as u8)"));
  }
  throw Error(str("no HDF5 type for dtype ", static_cast<int>(dtype)));
}

std::optional<DType> dtype_from_type(hid_t type) {
  Where where{"(memory)", "HDF5 type comparison"};
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    Type candidate = dtype_type(d);
    if (MOE_H5(where, H5Tequal(type, candidate)) > 0) return d;
  }
  return std::nullopt;
}

std::vector<hsize_t> chunk_shape(const Shape& shape, size_t element_size, bool expert,
                                 size_t max_bytes) {
  if (shape.empty() || shape_numel(shape) == 0) return {};
  std::vector<hsize_t> chunk(shape.begin(), shape.end());
  if (expert) chunk[0] = 1;
  auto bytes_from = [&](size_t d) {
    size_t b = element_size;
    for (size_t i = d; i < chunk.size(); ++i) b *= chunk[i];
    return b;
  };
  // Cut the outermost dimensions first: row chunks of the largest height that fits.
  for (size_t d = 0; d < chunk.size() && bytes_from(0) > max_bytes; ++d) {
    size_t inner = bytes_from(d + 1);
    hsize_t rows = std::max<size_t>(1, max_bytes / inner);
    chunk[d] = std::min(chunk[d], rows);
  }
  return chunk;
}

namespace {

// A tensor dataset as write_tensor creates it (layout, filter), its data not yet written.
Dataset create_tensor_dataset(hid_t parent, const std::string& name, const Shape& shape,
                              DType dtype, bool expert, const Where& w, size_t max_chunk_bytes) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Space space =
      shape.empty()
          ? scalar_space(w)
          : Space(MOE_H5(w, H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
  Plist dcpl(MOE_H5(w, H5Pcreate(H5P_DATASET_CREATE)));
  MOE_H5(w, H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  keep_compact(dcpl, false, w);
  std::vector<hsize_t> chunk = chunk_shape(shape, dtype_size(dtype), expert, max_chunk_bytes);
  if (!chunk.empty()) {
    MOE_H5(w, H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
    MOE_H5(w, H5Pset_fletcher32(dcpl));
  } else {
    // Rank 0 or no elements: cannot be chunked, so no Fletcher32; a compact layout keeps the
    // (at most 8) bytes inside the checksummed object header instead.
    MOE_H5(w, H5Pset_layout(dcpl, H5D_COMPACT));
  }
  Type type = dtype_type(dtype);
  return Dataset(
      MOE_H5(w, H5Dcreate2(parent, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
}

// The attributes of a tensor dataset (written after its data, for streamed and whole alike).
void write_tensor_attrs(hid_t dataset, const Shape& shape, DType dtype, bool expert, const Where& w,
                        const ParamShard* shard) {
  write_string_attr(dataset, "dtype", dtype_name(dtype), w);
  write_int_attr(dataset, "expert", expert ? 1 : 0, w, H5T_STD_U8LE);
  if (shard && shard->defined()) {
    MOE_CHECK(shard->local_shape() == shape, w.describe(), ": ", shape_str(shape), " ",
              dtype_name(dtype), " is not the shard [", shard->start, ", ",
              shard->start + shard->count, ") of dimension ", shard->dim, " of ",
              shape_str(shard->global));
    std::vector<hsize_t> n{shard->global.size()};
    Space attr_space(MOE_H5(w, H5Screate_simple(1, n.data(), nullptr)));
    Attr attr(MOE_H5(w, H5Acreate2(dataset, "shard_shape", H5T_STD_I64LE, attr_space, H5P_DEFAULT,
                                   H5P_DEFAULT)));
    MOE_H5(w, H5Awrite(attr, H5T_NATIVE_INT64, shard->global.data()));
    attr.close(w);
    write_int_attr(dataset, "shard_dim", shard->dim, w, H5T_STD_I32LE);
    write_int_attr(dataset, "shard_start", shard->start, w, H5T_STD_I64LE);
  }
}

}  // namespace

void write_tensor(hid_t parent, const std::string& name, const Tensor& device_tensor, bool expert,
                  const Where& where, size_t max_chunk_bytes, const ParamShard* shard) {
  Where w = where.at(child_path(where.object, name));
  MOE_CHECK(device_tensor.defined(), w.describe(), ": tensor is undefined");
  // A device tensor is written from a host copy.
  const Tensor tensor = device_tensor.to(Device{});
  MOE_CHECK(!expert || tensor.ndim() >= 1, w.describe(), ": expert tensor ", tensor.describe(),
            " needs a leading expert dimension");
  Dataset dataset = create_tensor_dataset(parent, name, tensor.shape(), tensor.dtype(), expert, w,
                                          max_chunk_bytes);
  if (tensor.numel() > 0) {
    Type type = dtype_type(tensor.dtype());
    MOE_H5(w, H5Dwrite(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.raw()));
  }
  write_tensor_attrs(dataset, tensor.shape(), tensor.dtype(), expert, w, shard);
}

void write_expert_rows(hid_t parent, const std::string& name, const Shape& shape, DType dtype,
                       const std::function<Tensor(int64_t)>& expert, const Where& where,
                       size_t max_chunk_bytes, const ParamShard* shard) {
  Where w = where.at(child_path(where.object, name));
  MOE_CHECK(!shape.empty(), w.describe(),
            ": a streamed expert tensor needs a leading expert "
            "dimension, its shape is ",
            shape_str(shape));
  MOE_CHECK(expert, w.describe(), ": a streamed tensor has no source of expert slices");
  Dataset dataset = create_tensor_dataset(parent, name, shape, dtype, true, w, max_chunk_bytes);
  const Shape rest(shape.begin() + 1, shape.end());
  if (shape_numel(shape) > 0) {
    Type type = dtype_type(dtype);
    std::vector<hsize_t> start(shape.size(), 0), count(shape.begin(), shape.end());
    count[0] = 1;
    Space file_space(MOE_H5(w, H5Dget_space(dataset)));
    Space mem_space(
        MOE_H5(w, H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr)));
    for (int64_t e = 0; e < shape[0]; ++e) {
      // One slice alive at a time: the previous one is released before the next is read.
      const Tensor slice = expert(e).to(Device{});
      MOE_CHECK(slice.defined() && slice.dtype() == dtype &&
                    (slice.shape() == rest || slice.shape() == Shape(count.begin(), count.end())),
                w.describe(), ": expert ", e, "'s slice is ",
                slice.defined() ? slice.describe() : std::string("undefined"), ", expected ",
                shape_str(rest), " ", dtype_name(dtype));
      start[0] = static_cast<hsize_t>(e);
      MOE_H5(w, H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                    nullptr));
      MOE_H5(w, H5Dwrite(dataset, type, mem_space, file_space, H5P_DEFAULT, slice.raw()));
    }
  }
  write_tensor_attrs(dataset, shape, dtype, true, w, shard);
}

DatasetInfo dataset_info(hid_t dataset, const Where& w) {
  DatasetInfo info;
  Space space(MOE_H5(w, H5Dget_space(dataset)));
  H5S_class_t cls = MOE_H5(w, H5Sget_simple_extent_type(space));
  if (cls == H5S_SIMPLE) {
    int rank = MOE_H5(w, H5Sget_simple_extent_ndims(space));
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    MOE_H5(w, H5Sget_simple_extent_dims(space, dims.data(), nullptr));
    info.shape.assign(dims.begin(), dims.end());
  } else if (cls != H5S_SCALAR) {
    throw Error(str(w.describe(), ": dataset has no data space (null dataspace)"));
  }

  Type type(MOE_H5(w, H5Dget_type(dataset)));
  if (has_attr(dataset, "dtype", w)) {
    std::string name = read_string_attr(dataset, "dtype", w);
    std::optional<DType> dtype = dtype_from_name(name);
    if (!dtype)
      throw Error(str(w.describe(), ": unknown dtype attribute '", name,
                      "' (expected f32, bf16, f16, i32, i64 or u8)"));
    Type expected = dtype_type(*dtype);
    if (MOE_H5(w, H5Tequal(type, expected)) <= 0)
      throw Error(str(w.describe(), ": dtype attribute says ", name, " but the HDF5 type is a ",
                      type_summary(type)));
    info.dtype = *dtype;
  } else {
    std::optional<DType> dtype = dtype_from_type(type);
    if (!dtype) throw Error(str(w.describe(), ": unsupported HDF5 type, a ", type_summary(type)));
    info.dtype = *dtype;
  }
  if (has_attr(dataset, "expert", w)) info.expert = read_int_attr(dataset, "expert", w) != 0;
  if (info.expert && info.shape.empty())
    throw Error(str(w.describe(), ": marked as an expert tensor but has rank 0"));
  if (has_attr(dataset, "shard_shape", w)) {
    Attr attr(MOE_H5(w, H5Aopen(dataset, "shard_shape", H5P_DEFAULT)));
    Space attr_space(MOE_H5(w, H5Aget_space(attr)));
    const hssize_t n = MOE_H5(w, H5Sget_simple_extent_npoints(attr_space));
    if (n != static_cast<hssize_t>(info.shape.size()))
      throw Error(str(w.describe(), ": shard_shape has ", n, " dimensions, the dataset ",
                      info.shape.size()));
    info.shard.global.resize(static_cast<size_t>(n));
    MOE_H5(w, H5Aread(attr, H5T_NATIVE_INT64, info.shard.global.data()));
    info.shard.dim = static_cast<int>(read_int_attr(dataset, "shard_dim", w));
    info.shard.start = read_int_attr(dataset, "shard_start", w);
    const int dim = info.shard.dim;
    if (dim < 0 || dim >= static_cast<int>(n))
      throw Error(str(w.describe(), ": shard_dim ", dim, " is not a dimension of ",
                      shape_str(info.shard.global)));
    info.shard.count = info.shape[static_cast<size_t>(dim)];
    if (info.shard.start < 0 ||
        info.shard.start + info.shard.count > info.shard.global[static_cast<size_t>(dim)] ||
        info.shard.local_shape() != info.shape)
      throw Error(str(w.describe(), ": a ", shape_str(info.shape), " dataset is not the shard at ",
                      info.shard.start, " of dimension ", dim, " of ",
                      shape_str(info.shard.global)));
  }
  return info;
}

namespace {

void expect_outside_arena(const Where& w) {
  MOE_CHECK(ArenaScope::current() == nullptr, w.describe(),
            ": tensors read from files must not live in the activation arena; read them outside "
            "an ArenaScope");
}

}  // namespace

void check_storage_fits(hid_t dataset, const Where& where) {
  Plist dcpl(MOE_H5(where, H5Dget_create_plist(dataset)));
  if (MOE_H5(where, H5Pget_layout(dcpl)) != H5D_CHUNKED) return;
  const hid_t file = MOE_H5(where, H5Iget_file_id(dataset));
  H5F_info2_t info{};
  hsize_t file_bytes = 0;
  const herr_t got = H5Fget_info2(file, &info) < 0 ? -1 : H5Fget_filesize(file, &file_bytes);
  H5Fclose(file);  // H5Iget_file_id opened a reference
  if (got < 0) fail(where, "H5Fget_info2 / H5Fget_filesize", __FILE__, __LINE__);
  // Files written now (superblock 3, 1.10 formats) checksum their chunk indexes: a damaged record
  // fails there. Only earlier builds' v1 B-trees need the walk below (it visits every chunk, and
  // the expert ring reads one expert row at a time).
  if (info.super.version >= 3) return;
  const hsize_t stored = H5Dget_storage_size(dataset);  // sums the chunk index's records
  if (stored > file_bytes)
    throw Error(str(where.describe(), ": damaged chunk index: the dataset's chunks claim ", stored,
                    " bytes, the file has ", file_bytes));
}

Tensor read_tensor(hid_t parent, const std::string& name, const Where& where, DatasetInfo* out) {
  Where w = where.at(child_path(where.object, name));
  expect_outside_arena(w);
  if (!has_link(parent, name, where)) throw Error(str(w.describe(), ": no such dataset"));
  Dataset dataset(MOE_H5(w, H5Dopen2(parent, name.c_str(), H5P_DEFAULT)));
  DatasetInfo info = dataset_info(dataset, w);
  Tensor tensor = Tensor::empty(info.shape, info.dtype);
  tensor.set_name(name);
  if (tensor.numel() > 0) {
    Type type = dtype_type(info.dtype);
    check_storage_fits(dataset, w);
    MOE_H5(w, H5Dread(dataset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, tensor.raw()));
  }
  if (out) *out = info;
  return tensor;
}

Tensor read_tensor_row(hid_t parent, const std::string& name, int64_t index, const Where& where) {
  Where w = where.at(child_path(where.object, name));
  expect_outside_arena(w);
  if (!has_link(parent, name, where)) throw Error(str(w.describe(), ": no such dataset"));
  Dataset dataset(MOE_H5(w, H5Dopen2(parent, name.c_str(), H5P_DEFAULT)));
  DatasetInfo info = dataset_info(dataset, w);
  if (info.shape.empty())
    throw Error(str(w.describe(), ": cannot take row ", index, " of a rank-0 dataset"));
  if (index < 0 || index >= info.shape[0])
    throw Error(str(w.describe(), ": index ", index, " out of range for leading dimension ",
                    info.shape[0], " (shape ", shape_str(info.shape), ")"));

  Shape rest(info.shape.begin() + 1, info.shape.end());
  Tensor tensor = Tensor::empty(rest, info.dtype);
  tensor.set_name(str(name, "[", index, "]"));
  if (tensor.numel() == 0) return tensor;

  std::vector<hsize_t> start(info.shape.size(), 0), count(info.shape.begin(), info.shape.end());
  start[0] = static_cast<hsize_t>(index);
  count[0] = 1;
  Space file_space(MOE_H5(w, H5Dget_space(dataset)));
  MOE_H5(w, H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                nullptr));
  Space mem_space(
      MOE_H5(w, H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr)));
  Type type = dtype_type(info.dtype);
  check_storage_fits(dataset, w);
  MOE_H5(w, H5Dread(dataset, type, mem_space, file_space, H5P_DEFAULT, tensor.raw()));
  return tensor;
}

}  // namespace moe::io::h5
