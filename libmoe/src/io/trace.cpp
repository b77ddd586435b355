// Routing trace version 1: streaming writer (extendible chunked datasets, atomic rename, or for
// "-" a temporary file streamed to stdout) and validating reader with row-range reads. Layout:
// docs/FORMATS.md ("Routing trace, version 1").
// Shape letters: N tokens, L MoE layers, k top-k, E experts of a layer, Emax max E, B batches.
#include "moe/io/trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "io/files.h"
#include "io/trace_checks.h"
#include "moe/io/hdf5.h"

namespace moe::io {

namespace {

using h5::Where;

const char* const kLayersGroup = "layers";
const char* const kTokensGroup = "tokens";
const char* const kBatchesGroup = "batches";

constexpr unsigned kDeflateLevel = 1;                 // fast; ids and loads compress well
constexpr size_t kBatchChunkBytes = size_t(1) << 20;  // batch datasets: chunks up to 1 MiB
constexpr hsize_t kBatchChunkRowsMax = 64;            // ... of at most 64 batches
constexpr size_t kCompactBytes = 32 << 10;            // /layers tables stored compact up to this

std::string join_ints(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += str(i ? ", " : "", dims[i]);
  return s + "]";
}

std::string dump_json(const nlohmann::json& value, const std::string& who) {
  try {
    return value.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(who, ": model_config cannot be written as JSON: ", e.what()));
  }
}

// The rules shared by writer and reader; `who` names the file ("trace 'x.h5'").
void check_info(const TraceInfo& info, const std::string& who) {
  const int64_t L = info.layers();
  if (L < 1) throw Error(str(who, ": a trace needs at least one MoE layer (experts is empty)"));
  if (static_cast<int64_t>(info.moe_blocks.size()) != L)
    throw Error(str(who, ": moe_blocks has ", info.moe_blocks.size(), " entries but experts has ",
                    L, " (one of each per MoE layer)"));
  if (info.top_k < 1) throw Error(str(who, ": top_k is ", info.top_k, ", must be >= 1"));
  for (int64_t l = 0; l < L; ++l) {
    const int64_t E = info.experts[static_cast<size_t>(l)];
    const int64_t block = info.moe_blocks[static_cast<size_t>(l)];
    if (E < 1 || E > INT32_MAX)
      throw Error(str(who, ": MoE layer ", l, " (block ", block, ") has ", E, " experts"));
    if (info.top_k > E)
      throw Error(str(who, ": top_k ", info.top_k, " exceeds the ", E, " experts of MoE layer ", l,
                      " (block ", block, ")"));
    if (block < 0 || (l > 0 && block <= info.moe_blocks[static_cast<size_t>(l - 1)]))
      throw Error(
          str(who, ": moe_blocks must be increasing block indices >= 0, entry ", l, " is ", block));
  }
}

// ---- dataset helpers ----------------------------------------------------------------------------

std::string child(const std::string& group, const char* name) { return str("/", group, "/", name); }

// A 1-D int64 dataset written whole (the /layers tables): contiguous, no filter.
void write_i64_vector(hid_t group, const char* name, const std::vector<int64_t>& values,
                      const Where& where) {
  hsize_t n = values.size();
  h5::Space space(MOE_H5(where, H5Screate_simple(1, &n, nullptr)));
  // Compact (inside the checksummed object header) while it fits a header message; contiguous
  // storage has no checksum.
  h5::Plist dcpl(MOE_H5(where, H5Pcreate(H5P_DATASET_CREATE)));
  if (n * sizeof(int64_t) <= kCompactBytes) MOE_H5(where, H5Pset_layout(dcpl, H5D_COMPACT));
  h5::Dataset ds(
      MOE_H5(where, H5Dcreate2(group, name, H5T_STD_I64LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT)));
  if (n)
    MOE_H5(where, H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
  ds.close(where);
}

// An empty dataset [0, rest...] extendible along its first dimension, chunked
// [chunk_rows, rest...] with shuffle + deflate + Fletcher32; its chunk cache holds two chunks.
h5::Dataset create_extendible(hid_t group, const char* name, hid_t file_type,
                              const std::vector<hsize_t>& rest, hsize_t chunk_rows,
                              const Where& where) {
  std::vector<hsize_t> dims{0}, maxdims{H5S_UNLIMITED}, chunk{chunk_rows};
  for (hsize_t d : rest) {
    dims.push_back(d);
    maxdims.push_back(d);
    chunk.push_back(d);
  }
  const int rank = static_cast<int>(dims.size());
  h5::Space space(MOE_H5(where, H5Screate_simple(rank, dims.data(), maxdims.data())));
  h5::Plist dcpl(MOE_H5(where, H5Pcreate(H5P_DATASET_CREATE)));
  MOE_H5(where, H5Pset_chunk(dcpl, rank, chunk.data()));
  MOE_H5(where, H5Pset_shuffle(dcpl));
  MOE_H5(where, H5Pset_deflate(dcpl, kDeflateLevel));
  MOE_H5(where, H5Pset_fletcher32(dcpl));
  size_t chunk_bytes = H5Tget_size(file_type);
  for (hsize_t c : chunk) chunk_bytes *= c;
  h5::Plist dapl(MOE_H5(where, H5Pcreate(H5P_DATASET_ACCESS)));
  MOE_H5(where, H5Pset_chunk_cache(dapl, H5D_CHUNK_CACHE_NSLOTS_DEFAULT,
                                   std::max<size_t>(size_t(1) << 20, 2 * chunk_bytes), 1.0));
  return h5::Dataset(
      MOE_H5(where, H5Dcreate2(group, name, file_type, space, H5P_DEFAULT, dcpl, dapl)));
}

// The row hyperslab [start, start + rows) x rest of `dataset`'s file space, and a matching memory
// space. rows > 0.
std::pair<h5::Space, h5::Space> row_spaces(hid_t dataset, hsize_t start, hsize_t rows,
                                           const std::vector<hsize_t>& rest, const Where& where) {
  std::vector<hsize_t> offset(rest.size() + 1, 0), count{rows};
  offset[0] = start;
  count.insert(count.end(), rest.begin(), rest.end());
  h5::Space file_space(MOE_H5(where, H5Dget_space(dataset)));
  MOE_H5(where, H5Sselect_hyperslab(file_space, H5S_SELECT_SET, offset.data(), nullptr,
                                    count.data(), nullptr));
  h5::Space mem_space(
      MOE_H5(where, H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr)));
  return {std::move(file_space), std::move(mem_space)};
}

// Grows `dataset` from `old_rows` to `old_rows + rows` rows and writes `data` into the new ones.
void append_rows(hid_t dataset, hsize_t old_rows, hsize_t rows, const std::vector<hsize_t>& rest,
                 hid_t mem_type, const void* data, const Where& where) {
  if (rows == 0) return;
  std::vector<hsize_t> dims{old_rows + rows};
  dims.insert(dims.end(), rest.begin(), rest.end());
  MOE_H5(where, H5Dset_extent(dataset, dims.data()));
  auto [file_space, mem_space] = row_spaces(dataset, old_rows, rows, rest, where);
  MOE_H5(where, H5Dwrite(dataset, mem_type, mem_space, file_space, H5P_DEFAULT, data));
}

void read_rows(hid_t dataset, hsize_t start, hsize_t rows, const std::vector<hsize_t>& rest,
               hid_t mem_type, void* data, const Where& where) {
  if (rows == 0) return;
  auto [file_space, mem_space] = row_spaces(dataset, start, rows, rest, where);
  h5::check_storage_fits(dataset, where);
  MOE_H5(where, H5Dread(dataset, mem_type, mem_space, file_space, H5P_DEFAULT, data));
}

// ---- files ------------------------------------------------------------------------------------

std::string read_all(std::FILE* in, const char* what) {
  std::string bytes;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, in)) > 0) bytes.append(buffer, n);
  if (std::ferror(in))
    throw Error(str("trace '-': cannot read ", what, ": ", std::strerror(errno)));
  return bytes;
}

// ---- reading: attributes and dataset checks ---------------------------------------------------

std::string optional_string_attr(hid_t object, const char* name, const Where& where) {
  return h5::has_attr(object, name, where) ? h5::read_string_attr(object, name, where)
                                           : std::string();
}

// Opens dataset `name` of `group` and checks its HDF5 type is exactly `type` and its rank.
h5::Dataset open_checked(hid_t group, const std::string& group_name, const char* name, hid_t type,
                         const char* type_name, int rank, const Where& root,
                         std::vector<hsize_t>& dims) {
  Where group_where = root.at("/" + group_name);
  Where w = root.at(child(group_name, name));
  if (!h5::has_link(group, name, group_where)) throw Error(str(w.describe(), ": missing dataset"));
  h5::Dataset ds(MOE_H5(w, H5Dopen2(group, name, H5P_DEFAULT)));
  h5::Type stored(MOE_H5(w, H5Dget_type(ds)));
  if (MOE_H5(w, H5Tequal(stored, type)) <= 0)
    throw Error(str(w.describe(), ": HDF5 type is not ", type_name));
  h5::Space space(MOE_H5(w, H5Dget_space(ds)));
  if (MOE_H5(w, H5Sget_simple_extent_type(space)) != H5S_SIMPLE)
    throw Error(str(w.describe(), ": not a ", rank, "-dimensional dataset"));
  int stored_rank = MOE_H5(w, H5Sget_simple_extent_ndims(space));
  if (stored_rank != rank)
    throw Error(str(w.describe(), ": has ", stored_rank, " dimensions, expected ", rank));
  dims.assign(static_cast<size_t>(rank), 0);
  MOE_H5(w, H5Sget_simple_extent_dims(space, dims.data(), nullptr));
  return ds;
}

std::vector<int64_t> read_i64_vector(hid_t group, const std::string& group_name, const char* name,
                                     const Where& root) {
  std::vector<hsize_t> dims;
  h5::Dataset ds =
      open_checked(group, group_name, name, H5T_STD_I64LE, "H5T_STD_I64LE (int64)", 1, root, dims);
  std::vector<int64_t> values(static_cast<size_t>(dims[0]));
  if (!values.empty()) {
    h5::check_storage_fits(ds, root.at(child(group_name, name)));
    MOE_H5(root.at(child(group_name, name)),
           H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()));
  }
  return values;
}

}  // namespace

int64_t TraceInfo::max_experts() const {
  return experts.empty() ? 0 : *std::max_element(experts.begin(), experts.end());
}

// ================================================================================================
// TraceWriter

struct TraceWriter::Impl {
  std::string path;  // as given ("-" for an in-memory image)
  std::string temp;  // path.tmp-<pid>; empty for "-"
  std::FILE* image_out = nullptr;
  Where root;
  TraceInfo info;
  int64_t L = 0, k = 0, Emax = 0;
  int64_t tokens = 0, batches = 0;
  bool closed = false, failed = false;

  h5::WriteFile file;
  h5::Dataset tok_experts, tok_gates, tok_ids;
  h5::Dataset b_step, b_tokens, b_loads, b_dropped;

  std::string who() const { return str("trace '", path, "'"); }

  std::vector<h5::Dataset*> datasets() {
    return {&tok_experts, &tok_gates, &tok_ids, &b_step, &b_tokens, &b_loads, &b_dropped};
  }

  void reset_handles() noexcept {
    for (h5::Dataset* d : datasets()) d->reset();
    file.abandon();
  }

  void remove_temp() noexcept {
    if (temp.empty()) return;
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
  }

  ~Impl() {
    if (closed) return;
    try {
      h5::Session session;
      reset_handles();
    } catch (...) {
    }
    remove_temp();
  }

  void create(int64_t chunk_tokens);
  void check_batch(const TraceBatch& batch) const;
  void write_batch(const TraceBatch& batch);
  void finish();
};

void TraceWriter::Impl::create(int64_t chunk_tokens) {
  const hsize_t uL = static_cast<hsize_t>(L), uk = static_cast<hsize_t>(k);
  const hsize_t uE = static_cast<hsize_t>(Emax);
  if (chunk_tokens < 1)
    throw Error(str(who(), ": chunk_tokens is ", chunk_tokens, ", must be >= 1"));
  const size_t row_bytes = static_cast<size_t>(uL * uk) * sizeof(int32_t);
  if (static_cast<size_t>(chunk_tokens) > h5::kMaxChunkBytes / row_bytes)
    throw Error(str(who(), ": chunk_tokens ", chunk_tokens, " makes chunks of more than ",
                    h5::kMaxChunkBytes, " bytes (", row_bytes, " bytes per token)"));
  const size_t batch_row_bytes = static_cast<size_t>(uL * uE) * sizeof(int64_t);
  const hsize_t batch_rows =
      std::clamp<hsize_t>(kBatchChunkBytes / batch_row_bytes, 1, kBatchChunkRowsMax);
  if (batch_row_bytes > h5::kMaxChunkBytes)
    throw Error(str(who(), ": ", L, " layers x ", Emax, " experts is too large a loads row"));

  const Provenance& p = info.provenance;
  const std::string created = p.time.empty() ? utc_timestamp() : p.time;
  const std::string model_config = dump_json(info.model_config, who());

  try {
    file = h5::create_file(temp);
  } catch (const Error& e) {
    throw Error(str(who(), ": cannot create the temporary file '", temp, "': ", e.what()));
  }

  {
    Provenance stamped = p;
    stamped.time = created;
    write_producer_attrs(file, kTraceFormat, kTraceVersion, stamped, root);
    h5::Group r(MOE_H5(root, H5Gopen2(file, "/", H5P_DEFAULT)));
    h5::write_string_attr(r, "model_config", model_config, root);
    h5::write_int_attr(r, "top_k", k, root, H5T_STD_I64LE);
    h5::write_string_attr(r, "source", info.source, root);
  }
  {
    h5::Group g = h5::create_group(file, kLayersGroup, root);
    write_i64_vector(g, "moe_blocks", info.moe_blocks, root.at(child(kLayersGroup, "moe_blocks")));
    write_i64_vector(g, "experts", info.experts, root.at(child(kLayersGroup, "experts")));
    g.close(root.at(str("/", kLayersGroup)));
  }
  {
    h5::Group g = h5::create_group(file, kTokensGroup, root);
    const hsize_t rows = static_cast<hsize_t>(chunk_tokens);
    tok_experts = create_extendible(g, "experts", H5T_STD_I32LE, {uL, uk}, rows,
                                    root.at(child(kTokensGroup, "experts")));
    tok_gates = create_extendible(g, "gates", H5T_IEEE_F32LE, {uL, uk}, rows,
                                  root.at(child(kTokensGroup, "gates")));
    tok_ids =
        create_extendible(g, "ids", H5T_STD_I32LE, {}, rows, root.at(child(kTokensGroup, "ids")));
    g.close(root.at(str("/", kTokensGroup)));
  }
  {
    h5::Group g = h5::create_group(file, kBatchesGroup, root);
    b_step = create_extendible(g, "step", H5T_STD_I64LE, {}, batch_rows,
                               root.at(child(kBatchesGroup, "step")));
    b_tokens = create_extendible(g, "tokens", H5T_STD_I64LE, {}, batch_rows,
                                 root.at(child(kBatchesGroup, "tokens")));
    b_loads = create_extendible(g, "loads", H5T_STD_I64LE, {uL, uE}, batch_rows,
                                root.at(child(kBatchesGroup, "loads")));
    b_dropped = create_extendible(g, "dropped", H5T_STD_I64LE, {uL}, batch_rows,
                                  root.at(child(kBatchesGroup, "dropped")));
    g.close(root.at(str("/", kBatchesGroup)));
  }
}

void TraceWriter::Impl::check_batch(const TraceBatch& batch) const {
  const int64_t N = batch.tokens();
  const std::string at = str(who(), ": append (batch ", batches, ", step ", batch.step, "): ");
  auto expect_size = [&](size_t got, int64_t want, const char* what, const char* shape) {
    if (static_cast<int64_t>(got) != want)
      throw Error(str(at, what, " has ", got, " values, expected ", want, " (", shape,
                      " with N = ", N, ", L = ", L, ", k = ", k, ", Emax = ", Emax, ")"));
  };
  if (batch.step < -1)
    throw Error(str(at, "step ", batch.step, " is negative (-1 means no training step)"));
  expect_size(batch.experts.size(), N * L * k, "experts", "[N, L, k]");
  expect_size(batch.gates.size(), N * L * k, "gates", "[N, L, k]");
  expect_size(batch.loads.size(), L * Emax, "loads", "[L, Emax]");
  expect_size(batch.dropped.size(), L, "dropped", "[L]");
  for (int64_t t = 0; t < N; ++t) {
    const int32_t id = batch.token_ids[static_cast<size_t>(t)];
    if (id < 0) throw Error(str(at, "token_ids[", t, "] = ", id, " is negative"));
  }
  for (int64_t t = 0; t < N; ++t)
    for (int64_t l = 0; l < L; ++l) {
      const int64_t E = info.experts[static_cast<size_t>(l)];
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = batch.experts[static_cast<size_t>((t * L + l) * k + j)];
        if (e < 0 || e >= E)
          throw Error(str(at, "experts[token ", t, ", layer ", l, " (block ",
                          info.moe_blocks[static_cast<size_t>(l)], "), choice ", j, "] = ", e,
                          " is outside [0, ", E, ")"));
      }
    }
  for (int64_t l = 0; l < L; ++l) {
    const int64_t E = info.experts[static_cast<size_t>(l)];
    for (int64_t e = 0; e < Emax; ++e) {
      const int64_t v = batch.loads[static_cast<size_t>(l * Emax + e)];
      if (v < 0) throw Error(str(at, "loads[layer ", l, ", expert ", e, "] = ", v, " is negative"));
      if (e >= E && v != 0)
        throw Error(str(at, "loads[layer ", l, ", expert ", e, "] = ", v, " but layer ", l,
                        " has only ", E, " experts (entries beyond a layer's E must be 0)"));
    }
    const int64_t d = batch.dropped[static_cast<size_t>(l)];
    if (d < 0) throw Error(str(at, "dropped[layer ", l, "] = ", d, " is negative"));
  }
}

void TraceWriter::Impl::write_batch(const TraceBatch& batch) {
  const hsize_t uL = static_cast<hsize_t>(L), uk = static_cast<hsize_t>(k);
  const hsize_t uE = static_cast<hsize_t>(Emax);
  const hsize_t n = static_cast<hsize_t>(batch.tokens()), old = static_cast<hsize_t>(tokens);
  const hsize_t b = static_cast<hsize_t>(batches);
  append_rows(tok_experts, old, n, {uL, uk}, H5T_NATIVE_INT32, batch.experts.data(),
              root.at(child(kTokensGroup, "experts")));
  append_rows(tok_gates, old, n, {uL, uk}, H5T_NATIVE_FLOAT, batch.gates.data(),
              root.at(child(kTokensGroup, "gates")));
  append_rows(tok_ids, old, n, {}, H5T_NATIVE_INT32, batch.token_ids.data(),
              root.at(child(kTokensGroup, "ids")));
  const int64_t count = batch.tokens();
  append_rows(b_step, b, 1, {}, H5T_NATIVE_INT64, &batch.step,
              root.at(child(kBatchesGroup, "step")));
  append_rows(b_tokens, b, 1, {}, H5T_NATIVE_INT64, &count,
              root.at(child(kBatchesGroup, "tokens")));
  append_rows(b_loads, b, 1, {uL, uE}, H5T_NATIVE_INT64, batch.loads.data(),
              root.at(child(kBatchesGroup, "loads")));
  append_rows(b_dropped, b, 1, {uL}, H5T_NATIVE_INT64, batch.dropped.data(),
              root.at(child(kBatchesGroup, "dropped")));
}

void TraceWriter::Impl::finish() {
  // Datasets first (closing one writes its cached chunks), then everything else to the file.
  for (h5::Dataset* d : datasets()) d->close(root);
  MOE_H5(root, H5Fflush(file, H5F_SCOPE_GLOBAL));
  file.close(root);   // a failure to close (the last metadata write) is a failed save
  if (path == "-") {  // the finished file's bytes are the image: stream them out
    std::FILE* in = std::fopen(temp.c_str(), "rb");
    if (!in) throw Error(str(who(), ": cannot reopen '", temp, "': ", std::strerror(errno)));
    std::vector<char> buffer(size_t(1) << 20);
    size_t got = 0;
    bool ok = true;
    while (ok && (got = std::fread(buffer.data(), 1, buffer.size(), in)) > 0)
      ok = std::fwrite(buffer.data(), 1, got, image_out) == got;
    ok = ok && !std::ferror(in) && std::fflush(image_out) == 0;
    const int err = errno;
    std::fclose(in);
    remove_temp();
    if (!ok) throw Error(str(who(), ": cannot write the file image: ", std::strerror(err)));
    return;
  }
  fsync_path(temp, false);
  rename_into_place(temp, path);
}

TraceWriter::TraceWriter(const std::string& path, const TraceInfo& info, int64_t chunk_tokens,
                         std::FILE* image_out)
    : impl_(std::make_unique<Impl>()) {
  h5::Session session;
  Impl& w = *impl_;
  w.path = path;
  w.image_out = image_out;
  w.root = Where{path, "/"};
  w.info = info;
  if (path.empty()) throw Error("trace: empty output path");
  if (path == "-" && !image_out) throw Error("trace '-': no FILE* to write the image to");
  if (path != "-") check_replaceable(path);
  check_info(info, w.who());
  if (info.source != "record" && info.source != "train")
    throw Error(str(w.who(), ": source is '", info.source, "', expected 'record' or 'train'"));
  if (w.info.provenance.time.empty()) w.info.provenance.time = utc_timestamp();
  w.L = info.layers();
  w.k = info.top_k;
  w.Emax = info.max_experts();
  // "-": written to a temporary file too (memory stays flat), whose bytes close() sends out.
  static std::atomic<int> images{0};
  w.temp = path == "-" ? (std::filesystem::temp_directory_path() /
                          str("moe-trace-", ::getpid(), "-", ++images, ".h5"))
                             .string()
                       : str(path, ".tmp-", ::getpid());
  try {
    w.create(chunk_tokens);
  } catch (...) {
    w.reset_handles();
    w.remove_temp();
    w.closed = true;  // nothing left to clean up
    throw;
  }
}

TraceWriter::~TraceWriter() = default;
TraceWriter::TraceWriter(TraceWriter&&) noexcept = default;
TraceWriter& TraceWriter::operator=(TraceWriter&&) noexcept = default;

void TraceWriter::append(const TraceBatch& batch) {
  MOE_CHECK(impl_, "trace: append on a moved-from writer");
  h5::Session session;
  Impl& w = *impl_;
  if (w.closed) throw Error(str(w.who(), ": append after close()"));
  if (w.failed) throw Error(str(w.who(), ": append after an earlier write failed"));
  w.check_batch(batch);  // nothing is written unless the whole batch is valid
  try {
    w.write_batch(batch);
  } catch (...) {
    w.failed = true;
    throw;
  }
  w.tokens += batch.tokens();
  w.batches += 1;
}

void TraceWriter::close() {
  MOE_CHECK(impl_, "trace: close on a moved-from writer");
  h5::Session session;
  Impl& w = *impl_;
  if (w.closed) return;
  if (w.failed) throw Error(str(w.who(), ": cannot close, an earlier write failed"));
  try {
    w.finish();
  } catch (const Error& e) {
    w.failed = true;
    w.reset_handles();
    w.remove_temp();
    w.closed = true;
    throw Error(str("saving trace '", w.path, "': ", e.what()));
  }
  w.closed = true;
  if (w.path == "-") return;
  try {
    fsync_path(parent_directory(w.path), true);
  } catch (const Error& e) {
    throw Error(
        str("saved trace '", w.path, "' but could not make the rename durable: ", e.what()));
  }
}

int64_t TraceWriter::tokens() const { return impl_ ? impl_->tokens : 0; }
int64_t TraceWriter::batches() const { return impl_ ? impl_->batches : 0; }
const TraceInfo& TraceWriter::info() const {
  MOE_CHECK(impl_, "trace: info of a moved-from writer");
  return impl_->info;
}

// ================================================================================================
// TraceReader

struct TraceReader::Impl {
  std::string name;
  Where root;
  TraceInfo info;
  int64_t N = 0, B = 0, L = 0, k = 0, Emax = 0;
  std::vector<int64_t> offsets;  // [B + 1]

  h5::File file;
  h5::Dataset tok_experts, tok_gates, tok_ids;
  h5::Dataset b_step, b_tokens, b_loads, b_dropped;

  ~Impl() {
    try {
      h5::Session session;
      for (h5::Dataset* d :
           {&tok_experts, &tok_gates, &tok_ids, &b_step, &b_tokens, &b_loads, &b_dropped})
        d->reset();
      file.reset();
    } catch (...) {
    }
  }

  void load();  // validates and reads the metadata of the open `file`
  std::vector<int64_t> read_batch_i64(const h5::Dataset& ds, const char* ds_name, int64_t first,
                                      int64_t count, const std::vector<hsize_t>& rest) const;
};

void TraceReader::Impl::load() {
  const std::string who = str("trace '", name, "'");
  if (!h5::has_attr(file, "format", root))
    throw Error(str(who, ": not a moe trace (no 'format' attribute)"));
  const std::string format = h5::read_string_attr(file, "format", root);
  if (format == kCheckpointFormat)
    throw Error(str(who, ": not a moe trace: it is a moe checkpoint (format '", format,
                    "'); a trace has format '", kTraceFormat, "'"));
  if (format != kTraceFormat)
    throw Error(
        str(who, ": not a moe trace (format is '", format, "', expected '", kTraceFormat, "')"));
  if (!h5::has_attr(file, "format_version", root))
    throw Error(str(who, ": no 'format_version' attribute"));
  const int64_t version = h5::read_int_attr(file, "format_version", root);
  if (version != kTraceVersion)
    throw Error(
        str(who, ": trace format version ", version, ", this build reads version ", kTraceVersion));

  {
    const std::string text = h5::read_string_attr(file, "model_config", root);
    try {
      info.model_config = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(str(root.describe(), ": attribute 'model_config' is not valid JSON: ", e.what()));
    }
  }
  info.top_k = h5::read_int_attr(file, "top_k", root);
  info.source = h5::read_string_attr(file, "source", root);
  info.provenance.tool = optional_string_attr(file, "producer_tool", root);
  info.provenance.version = optional_string_attr(file, "producer_version", root);
  info.provenance.git = optional_string_attr(file, "producer_git", root);
  info.provenance.argv = optional_string_attr(file, "argv", root);
  info.provenance.time = optional_string_attr(file, "created", root);

  {
    h5::Group g = h5::open_group(file, kLayersGroup, root);
    info.moe_blocks = read_i64_vector(g, kLayersGroup, "moe_blocks", root);
    info.experts = read_i64_vector(g, kLayersGroup, "experts", root);
  }
  check_info(info, who);
  L = info.layers();
  k = info.top_k;
  Emax = info.max_experts();
  const hsize_t uL = static_cast<hsize_t>(L), uk = static_cast<hsize_t>(k);
  const hsize_t uE = static_cast<hsize_t>(Emax);

  auto expect_dims = [&](const std::vector<hsize_t>& dims, const std::vector<hsize_t>& want,
                         const std::string& object, const char* why) {
    if (dims != want)
      throw Error(str(root.at(object).describe(), ": shape ", join_ints(dims), ", expected ",
                      join_ints(want), " (", why, ")"));
  };
  {
    h5::Group g = h5::open_group(file, kTokensGroup, root);
    std::vector<hsize_t> de, dg, di;
    tok_experts = open_checked(g, kTokensGroup, "experts", H5T_STD_I32LE, "H5T_STD_I32LE (int32)",
                               3, root, de);
    tok_gates = open_checked(g, kTokensGroup, "gates", H5T_IEEE_F32LE, "H5T_IEEE_F32LE (float32)",
                             3, root, dg);
    tok_ids =
        open_checked(g, kTokensGroup, "ids", H5T_STD_I32LE, "H5T_STD_I32LE (int32)", 1, root, di);
    N = static_cast<int64_t>(de[0]);
    expect_dims(de, {de[0], uL, uk}, child(kTokensGroup, "experts"),
                "[N, L, k] with L from /layers and k = top_k");
    expect_dims(dg, de, child(kTokensGroup, "gates"), "the shape of /tokens/experts");
    expect_dims(di, {de[0]}, child(kTokensGroup, "ids"), "[N], N from /tokens/experts");
  }
  {
    h5::Group g = h5::open_group(file, kBatchesGroup, root);
    const char* i64 = "H5T_STD_I64LE (int64)";
    std::vector<hsize_t> ds, dt, dl, dd;
    b_step = open_checked(g, kBatchesGroup, "step", H5T_STD_I64LE, i64, 1, root, ds);
    b_tokens = open_checked(g, kBatchesGroup, "tokens", H5T_STD_I64LE, i64, 1, root, dt);
    b_loads = open_checked(g, kBatchesGroup, "loads", H5T_STD_I64LE, i64, 3, root, dl);
    b_dropped = open_checked(g, kBatchesGroup, "dropped", H5T_STD_I64LE, i64, 2, root, dd);
    B = static_cast<int64_t>(ds[0]);
    expect_dims(dt, {ds[0]}, child(kBatchesGroup, "tokens"), "[B], B from /batches/step");
    expect_dims(dl, {ds[0], uL, uE}, child(kBatchesGroup, "loads"),
                "[B, L, Emax], B from /batches/step, L and Emax from /layers");
    expect_dims(dd, {ds[0], uL}, child(kBatchesGroup, "dropped"),
                "[B, L], B from /batches/step, L from /layers");
  }
  std::vector<int64_t> counts = read_batch_i64(b_tokens, "tokens", 0, B, {});
  offsets.assign(1, 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t c = counts[static_cast<size_t>(b)];
    if (c < 0)
      throw Error(str(root.at(child(kBatchesGroup, "tokens")).describe(), ": batch ", b, " has ", c,
                      " tokens"));
    offsets.push_back(offsets.back() + c);
  }
  if (offsets.back() != N)
    throw Error(str(who, ": /batches/tokens sums to ", offsets.back(), " tokens but /tokens has ",
                    N, " rows"));
}

std::vector<int64_t> TraceReader::Impl::read_batch_i64(const h5::Dataset& ds, const char* ds_name,
                                                       int64_t first, int64_t count,
                                                       const std::vector<hsize_t>& rest) const {
  size_t per_row = 1;
  for (hsize_t d : rest) per_row *= static_cast<size_t>(d);
  std::vector<int64_t> values(static_cast<size_t>(count) * per_row);
  const Where where = root.at(child(kBatchesGroup, ds_name));
  read_rows(ds, static_cast<hsize_t>(first), static_cast<hsize_t>(count), rest, H5T_NATIVE_INT64,
            values.data(), where);
  // The writer's rules, checked on every read (io/trace_checks.h).
  const std::string name(ds_name);
  if (name == "loads") check_trace_loads(values, info.experts, Emax, first, where.describe());
  if (name == "dropped") check_trace_dropped(values, L, first, where.describe());
  if (name == "step") check_trace_steps(values, first, where.describe());
  return values;
}

TraceReader::TraceReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TraceReader::TraceReader(const std::string& path) {
  if (path == "-") {
    std::string bytes = read_all(stdin, "standard input");
    *this = from_image(std::move(bytes), "-");
    return;
  }
  h5::Session session;
  auto impl = std::make_unique<Impl>();
  impl->name = path;
  impl->root = Where{path, "/"};
  impl->file = h5::open_file_readonly(path, "trace");
  impl->load();
  impl_ = std::move(impl);
}

TraceReader TraceReader::from_image(std::string bytes, const std::string& name) {
  h5::Session session;
  auto impl = std::make_unique<Impl>();
  impl->name = name;
  impl->root = Where{name, "/"};
  impl->file = h5::open_image(bytes, name, "trace");  // HDF5 keeps its own copy
  impl->load();
  return TraceReader(std::move(impl));
}

TraceReader::~TraceReader() = default;
TraceReader::TraceReader(TraceReader&&) noexcept = default;
TraceReader& TraceReader::operator=(TraceReader&&) noexcept = default;

const TraceReader::Impl& TraceReader::impl() const {
  MOE_CHECK(impl_, "trace: use of a moved-from TraceReader");
  return *impl_;
}

const TraceInfo& TraceReader::info() const { return impl().info; }
const std::string& TraceReader::name() const { return impl().name; }
int64_t TraceReader::tokens() const { return impl().N; }
int64_t TraceReader::batches() const { return impl().B; }
int64_t TraceReader::layers() const { return impl().L; }
int64_t TraceReader::max_experts() const { return impl().Emax; }
std::vector<int64_t> TraceReader::batch_offsets() const { return impl().offsets; }

void TraceReader::read_tokens(int64_t begin, int64_t end, std::vector<int32_t>& experts,
                              std::vector<float>* gates, std::vector<int32_t>* token_ids) const {
  const Impl& r = impl();
  if (begin < 0 || begin > end || end > r.N)
    throw Error(str("trace '", r.name, "': tokens [", begin, ", ", end,
                    ") are not a range of the trace's ", r.N, " tokens"));
  h5::Session session;
  const int64_t n = end - begin;
  const hsize_t uL = static_cast<hsize_t>(r.L), uk = static_cast<hsize_t>(r.k);
  const size_t cells = static_cast<size_t>(n * r.L * r.k);
  experts.resize(cells);
  read_rows(r.tok_experts, static_cast<hsize_t>(begin), static_cast<hsize_t>(n), {uL, uk},
            H5T_NATIVE_INT32, experts.data(), r.root.at(child(kTokensGroup, "experts")));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t l = 0; l < r.L; ++l) {
      const int64_t E = r.info.experts[static_cast<size_t>(l)];
      for (int64_t j = 0; j < r.k; ++j) {
        const int32_t e = experts[static_cast<size_t>((t * r.L + l) * r.k + j)];
        if (e < 0 || e >= E)
          throw Error(str(r.root.at(child(kTokensGroup, "experts")).describe(), ": token ",
                          begin + t, ", layer ", l, ", choice ", j, ": expert ", e,
                          " is outside [0, ", E, ")"));
      }
    }
  if (gates) {
    gates->resize(cells);
    read_rows(r.tok_gates, static_cast<hsize_t>(begin), static_cast<hsize_t>(n), {uL, uk},
              H5T_NATIVE_FLOAT, gates->data(), r.root.at(child(kTokensGroup, "gates")));
  }
  if (token_ids) {
    token_ids->resize(static_cast<size_t>(n));
    read_rows(r.tok_ids, static_cast<hsize_t>(begin), static_cast<hsize_t>(n), {}, H5T_NATIVE_INT32,
              token_ids->data(), r.root.at(child(kTokensGroup, "ids")));
  }
}

std::vector<int64_t> TraceReader::batch_steps() const {
  const Impl& r = impl();
  h5::Session session;
  return r.read_batch_i64(r.b_step, "step", 0, r.B, {});
}

std::vector<int64_t> TraceReader::batch_tokens() const {
  const Impl& r = impl();
  std::vector<int64_t> counts(static_cast<size_t>(r.B));
  for (int64_t b = 0; b < r.B; ++b)
    counts[static_cast<size_t>(b)] =
        r.offsets[static_cast<size_t>(b + 1)] - r.offsets[static_cast<size_t>(b)];
  return counts;
}

std::vector<int64_t> TraceReader::loads() const {
  const Impl& r = impl();
  h5::Session session;
  return r.read_batch_i64(r.b_loads, "loads", 0, r.B,
                          {static_cast<hsize_t>(r.L), static_cast<hsize_t>(r.Emax)});
}

std::vector<int64_t> TraceReader::dropped() const {
  const Impl& r = impl();
  h5::Session session;
  return r.read_batch_i64(r.b_dropped, "dropped", 0, r.B, {static_cast<hsize_t>(r.L)});
}

TraceBatch TraceReader::read_batch(int64_t b) const {
  const Impl& r = impl();
  if (b < 0 || b >= r.B)
    throw Error(
        str("trace '", r.name, "': batch ", b, " out of range, the trace has ", r.B, " batches"));
  h5::Session session;
  TraceBatch batch;
  batch.step = r.read_batch_i64(r.b_step, "step", b, 1, {})[0];
  read_tokens(r.offsets[static_cast<size_t>(b)], r.offsets[static_cast<size_t>(b + 1)],
              batch.experts, &batch.gates, &batch.token_ids);
  batch.loads = r.read_batch_i64(r.b_loads, "loads", b, 1,
                                 {static_cast<hsize_t>(r.L), static_cast<hsize_t>(r.Emax)});
  batch.dropped = r.read_batch_i64(r.b_dropped, "dropped", b, 1, {static_cast<hsize_t>(r.L)});
  return batch;
}

#undef MOE_TRACE_READER_IMPL

}  // namespace moe::io
