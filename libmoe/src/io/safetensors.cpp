// safetensors reader and writer (see moe/io/safetensors.h for the format and the checks).
#include "moe/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/json_text.h"
#include "io/files.h"
#include "moe/error.h"
#include "moe/io/atomic_file.h"

namespace moe::io {

namespace {

struct DTypeInfo {
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1},
    {"U16", 2},  {"I16", 2}, {"F16", 2}, {"BF16", 2},    {"U32", 4},     {"I32", 4},
    {"F32", 4},  {"U64", 8}, {"I64", 8}, {"F64", 8},
};

// Every failure names the file and what was being done with it: reading (the reader, the
// default) or writing it.
[[noreturn]] void fail(const std::string& path, const std::string& cause) {
  throw Error(str("safetensors file '", path, "': ", cause));
}

[[noreturn]] void fail_writing(const std::string& path, const std::string& cause) {
  throw Error(str("cannot write safetensors file '", path, "': ", cause));
}

// Reads exactly `size` bytes at `offset`; false on a short read (truncated file).
bool read_at(int fd, void* buffer, size_t size, uint64_t offset, int* err) {
  auto* out = static_cast<char*>(buffer);
  while (size > 0) {
    ssize_t got = ::pread(fd, out, size, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    if (got == 0) {
      *err = 0;
      return false;
    }
    out += got;
    size -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

// A non-negative JSON integer, or fail naming `what`.
uint64_t json_u64(const nlohmann::json& value, const std::string& path, const std::string& what) {
  if (!value.is_number_integer() ||
      (value.is_number_integer() && !value.is_number_unsigned() && value.get<int64_t>() < 0))
    fail(path, str(what, " must be a non-negative integer (got ", value.dump(), ")"));
  return value.get<uint64_t>();
}

// a * b, or fail on overflow of 64 bits.
uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& path, const std::string& what) {
  if (a != 0 && b > UINT64_MAX / a) fail(path, str(what, ": size overflows 64 bits"));
  return a * b;
}

}  // namespace

size_t safetensors_dtype_size(const std::string& name) {
  for (const DTypeInfo& d : kDTypes)
    if (name == d.name) return d.size;
  return 0;
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
    case DType::q8_0:
    case DType::q4_k:
    case DType::q6_k:
    case DType::mxfp4:
      throw Error(str(dtype_name(dtype),
                      " weights exist in memory only (a quantised checkpoint's files hold their "
                      "rows as u8): a safetensors file has no type for them"));
  }
  throw Error(str("dtype ", static_cast<int>(dtype), " has no safetensors type"));
}

bool dtype_from_safetensors(const std::string& name, DType* out) {
  static const std::pair<const char*, DType> kMap[] = {{"F32", DType::f32}, {"BF16", DType::bf16},
                                                       {"F16", DType::f16}, {"I32", DType::i32},
                                                       {"I64", DType::i64}, {"U8", DType::u8}};
  for (const auto& [n, d] : kMap)
    if (name == n) {
      if (out) *out = d;
      return true;
    }
  return false;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail(path, str("cannot open: ", std::strerror(errno)));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(path, str("cannot stat: ", std::strerror(errno)));
    if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
    const uint64_t file_size = static_cast<uint64_t>(st.st_size);
    if (file_size < 8)
      fail(path, str("truncated file: ", file_size,
                     " bytes, shorter than the 8-byte header length field"));
    unsigned char length_bytes[8];
    int err = 0;
    if (!read_at(fd_, length_bytes, 8, 0, &err))
      fail(path, str("cannot read the header length: ", err ? std::strerror(err) : "short read"));
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | length_bytes[i];
    if (header_len > kSafetensorsMaxHeader)
      fail(path, str("header length ", header_len, " bytes exceeds the format's limit of 100 MB (",
                     kSafetensorsMaxHeader, " bytes)"));
    if (header_len > file_size - 8)
      fail(path, str("header length ", header_len, " runs beyond the end of the file (", file_size,
                     " bytes: truncated, or not a safetensors file)"));
    if (header_len < 2)
      fail(path, str("header of ", header_len, " bytes cannot hold a JSON object"));
    std::string header(static_cast<size_t>(header_len), '\0');
    if (!read_at(fd_, header.data(), header.size(), 8, &err))
      fail(path, str("cannot read the header: ", err ? std::strerror(err) : "short read"));
    data_start_ = 8 + header_len;
    const uint64_t data_size = file_size - data_start_;

    // Parse, noticing top-level names given twice (JSON parsers keep only one of them).
    std::string duplicate;
    bool has_duplicate = false;
    std::set<std::string> seen;
    auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string()) {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!seen.insert(key).second && !has_duplicate) {
          has_duplicate = true;
          duplicate = key;
        }
      }
      return true;
    };
    nlohmann::json root;
    try {
      root = nlohmann::json::parse(header, on_event);
    } catch (const nlohmann::json::exception& e) {
      fail(path, str("its header is not valid JSON: ", json_error_words(e)));
    }
    if (!root.is_object())
      fail(path, str("header is JSON but not an object (", root.type_name(), ")"));
    if (has_duplicate) fail(path, str("duplicate tensor name '", duplicate, "' in the header"));

    for (auto it = root.begin(); it != root.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& value = it.value();
      if (name == "__metadata__") {
        if (!value.is_object())
          fail(path,
               str("__metadata__ must be an object of strings (got ", value.type_name(), ")"));
        for (auto m = value.begin(); m != value.end(); ++m) {
          if (!m.value().is_string())
            fail(path, str("__metadata__ value of '", m.key(), "' is not a string (",
                           m.value().dump(), ")"));
          metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      const std::string what = str("tensor '", name, "'");
      if (!value.is_object()) fail(path, str(what, ": entry is not an object"));
      if (!value.contains("dtype") || !value["dtype"].is_string())
        fail(path, str(what, ": missing or non-string \"dtype\""));
      if (!value.contains("shape") || !value["shape"].is_array())
        fail(path, str(what, ": missing or non-array \"shape\""));
      if (!value.contains("data_offsets") || !value["data_offsets"].is_array() ||
          value["data_offsets"].size() != 2)
        fail(path, str(what, ": \"data_offsets\" must be an array of two offsets"));
      SafetensorsEntry entry;
      entry.name = name;
      entry.dtype = value["dtype"].get<std::string>();
      const size_t element_size = safetensors_dtype_size(entry.dtype);
      if (element_size == 0) fail(path, str(what, ": unknown dtype '", entry.dtype, "'"));
      uint64_t elements = 1;
      for (const nlohmann::json& d : value["shape"]) {
        const uint64_t dim = json_u64(d, path, str(what, ": shape dimension"));
        if (dim > static_cast<uint64_t>(INT64_MAX))
          fail(path, str(what, ": shape dimension too large"));
        entry.shape.push_back(static_cast<int64_t>(dim));
        elements = checked_mul(elements, dim, path, what);
      }
      entry.begin = json_u64(value["data_offsets"][0], path, str(what, ": data_offsets[0]"));
      entry.end = json_u64(value["data_offsets"][1], path, str(what, ": data_offsets[1]"));
      if (entry.begin > entry.end)
        fail(path, str(what, ": data_offsets [", entry.begin, ", ", entry.end,
                       "] end before they begin"));
      const uint64_t bytes = checked_mul(elements, element_size, path, what);
      if (entry.end - entry.begin != bytes)
        fail(path, str(what, ": data_offsets [", entry.begin, ", ", entry.end, "] hold ",
                       entry.end - entry.begin, " bytes, but shape ", shape_str(entry.shape),
                       " of ", entry.dtype, " needs ", bytes, " (size does not match shape)"));
      if (entry.end > data_size)
        fail(path, str(what, ": data_offsets [", entry.begin, ", ", entry.end,
                       "] run beyond the end of the file (the data section holds ", data_size,
                       " bytes: truncated file)"));
      entries_.push_back(std::move(entry));
    }

    // The entries must tile [0, data_size) exactly.
    std::stable_sort(entries_.begin(), entries_.end(),
                     [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                       return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                     });
    uint64_t covered = 0;
    const SafetensorsEntry* previous = nullptr;
    for (const SafetensorsEntry& e : entries_) {
      if (e.begin > covered)
        fail(path, str("hole in the data section: bytes [", covered, ", ", e.begin,
                       ") belong to no tensor (before '", e.name, "')"));
      if (e.begin < covered)
        fail(path,
             str("tensors '", previous->name, "' and '", e.name, "' overlap (data_offsets [",
                 previous->begin, ", ", previous->end, "] and [", e.begin, ", ", e.end, "])"));
      covered = e.end;
      if (e.end > e.begin || !previous) previous = &e;
    }
    if (covered != data_size)
      fail(path, str("hole in the data section: bytes [", covered, ", ", data_size,
                     ") after the last tensor belong to no tensor"));
    for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(other.fd_),
      data_start_(other.data_start_),
      entries_(std::move(other.entries_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {
  other.fd_ = -1;
}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    data_start_ = other.data_start_;
    entries_ = std::move(other.entries_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
    other.fd_ = -1;
  }
  return *this;
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

Tensor SafetensorsReader::read(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) fail(path_, str("no tensor '", name, "'"));
  return read_rows(name, 0, e->shape.empty() ? 1 : e->shape[0]);
}

Tensor SafetensorsReader::read_rows(const std::string& name, int64_t begin, int64_t end) const {
  const SafetensorsEntry* e = find(name);
  if (!e) fail(path_, str("no tensor '", name, "'"));
  const int64_t rows = e->shape.empty() ? 1 : e->shape[0];
  MOE_CHECK(0 <= begin && begin <= end && end <= rows, "safetensors file '", path_, "': rows [",
            begin, ", ", end, ") of tensor '", name, "' ", shape_str(e->shape), " do not exist");
  Shape shape = e->shape;
  if (!shape.empty()) shape[0] = end - begin;
  const int64_t per_row = rows > 0 ? shape_numel(e->shape) / rows : 0;
  return read_elements(name, begin * per_row, shape);
}

Tensor SafetensorsReader::read_elements(const std::string& name, int64_t first,
                                        const Shape& shape) const {
  const SafetensorsEntry* e = find(name);
  if (!e) fail(path_, str("no tensor '", name, "'"));
  DType dtype;
  if (!dtype_from_safetensors(e->dtype, &dtype))
    fail(path_, str("tensor '", name, "' has dtype ", e->dtype,
                    ", which has no moe equivalent (readable: F32, BF16, F16, I32, I64, U8)"));
  MOE_CHECK(fd_ >= 0, "safetensors file '", path_, "': the reader is closed");
  const int64_t count = shape_numel(shape);
  MOE_CHECK(0 <= first && 0 <= count && first + count <= shape_numel(e->shape),
            "safetensors file '", path_, "': elements [", first, ", ", first + count,
            ") of tensor '", name, "' ", shape_str(e->shape), " do not exist");
  Tensor t = Tensor::empty(shape, dtype);
  const uint64_t at = data_start_ + e->begin + static_cast<uint64_t>(first) * dtype_size(dtype);
  int err = 0;
  if (t.nbytes() > 0 && !read_at(fd_, t.raw(), t.nbytes(), at, &err))
    fail(path_, str("cannot read tensor '", name, "': ",
                    err ? std::strerror(err) : "short read (file truncated since it was opened)"));
  t.set_name(name);
  return t;
}

namespace {

// The bytes of `nt` at the file's position: a held tensor's, a deferred one read whole, a streamed
// one read expert by expert (its rows are the experts, in order). False when a write fails.
bool write_values(std::FILE* f, const NamedTensor& nt) {
  auto write = [f](const Tensor& t) {
    return std::fwrite(t.raw(), 1, t.nbytes(), f) == t.nbytes();
  };
  if (nt.held()) return write(nt.tensor);
  if (nt.is_deferred()) return write(nt.whole().to(Device{}));
  for (int64_t e = 0; e < nt.shape()[0]; ++e)
    if (!write(nt.expert_slice(e).to(Device{}))) return false;
  return true;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Build the header first: every check happens before a byte is written.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const NamedTensor& nt : tensors) {
    const Tensor& t = nt.tensor;
    if (nt.name.empty() || nt.name == "__metadata__")
      fail_writing(path, str("cannot write a tensor named '", nt.name, "'"));
    if (!names.insert(nt.name).second)
      fail_writing(path, str("tensor '", nt.name, "' given twice"));
    if (nt.held() && !t.defined()) fail_writing(path, str("tensor '", nt.name, "' is undefined"));
    if (nt.held() && t.device().kind != Device::cpu)
      fail_writing(path, str("tensor ", t.describe(), " is not on the CPU"));
    if (nt.shard.defined())
      fail_writing(
          path, str("tensor '", nt.name, "' is a shard of a larger tensor; write whole tensors"));
    const uint64_t bytes = static_cast<uint64_t>(shape_numel(nt.shape())) * dtype_size(nt.dtype());
    nlohmann::ordered_json entry;
    try {
      entry["dtype"] = safetensors_dtype_name(nt.dtype());
    } catch (const Error& e) {
      fail_writing(path, str("tensor '", nt.name, "': ", e.what()));
    }
    entry["shape"] = nt.shape();
    entry["data_offsets"] = {offset, offset + bytes};
    header[nt.name] = entry;
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data starts 8-byte aligned
  if (text.size() > kSafetensorsMaxHeader)
    fail_writing(path, str("header of ", text.size(), " bytes exceeds the 100 MB limit"));

  AtomicFile out(path);
  const std::string& tmp = out.temp();
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail_writing(path, str("cannot create '", tmp, "': ", std::strerror(errno)));
  auto abandon = [&](const std::string& cause) {
    if (f) std::fclose(f);
    f = nullptr;
    out.abandon();
    fail_writing(path, cause);
  };
  unsigned char length_bytes[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>((n >> (8 * i)) & 0xff);
  bool ok = std::fwrite(length_bytes, 1, 8, f) == 8 &&
            std::fwrite(text.data(), 1, text.size(), f) == text.size();
  try {
    for (size_t i = 0; ok && i < tensors.size(); ++i) ok = write_values(f, tensors[i]);
  } catch (const Error&) {  // a lazy tensor's source failed (its message names file and tensor)
    std::fclose(f);
    out.abandon();
    throw;
  }
  if (!ok) abandon(str("write failed: ", std::strerror(errno)));
  std::FILE* closing = f;
  f = nullptr;
  if (std::fclose(closing) != 0) abandon(str("close failed: ", std::strerror(errno)));
  try {
    out.commit();
  } catch (const Error& e) {
    abandon(e.what());
  }
  out.sync_directory();
}

}  // namespace moe::io
