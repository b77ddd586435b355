// Routing trace version 1, the streaming writer: extendible chunked datasets written batch by
// batch into an AtomicFile (renamed over the path by close()), or for "-" a temporary file
// streamed to stdout. Layout: docs/FORMATS.md ("Routing trace, version 1").
// Shape letters: N tokens, L MoE layers, k top-k, E experts of a layer, Emax max E, B batches.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "io/files.h"
#include "io/trace_checks.h"
#include "io/trace_layout.h"
#include "moe/io/atomic_file.h"
#include "moe/io/hdf5.h"
#include "moe/io/trace.h"

namespace moe::io {

using namespace trace_layout;

namespace {

constexpr unsigned kDeflateLevel = 1;                 // fast; ids and loads compress well
constexpr size_t kBatchChunkBytes = size_t(1) << 20;  // batch datasets: chunks up to 1 MiB
constexpr hsize_t kBatchChunkRowsMax = 64;            // ... of at most 64 batches
constexpr size_t kCompactBytes = 32 << 10;            // /layers tables stored compact up to this

std::string dump_json(const nlohmann::json& value, const std::string& who) {
  try {
    return value.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(who, ": model_config cannot be written as JSON: ", e.what()));
  }
}

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

}  // namespace

// ================================================================================================
// TraceWriter

struct TraceWriter::Impl {
  std::string path;               // as given ("-" for an in-memory image)
  std::optional<AtomicFile> out;  // the file's temp and its rename; none for "-"
  std::string temp;               // where HDF5 writes: out->temp(), or the image's temp for "-"
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
    if (out) return out->abandon();
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
    throw Error(str(who(), ": ", e.what()));  // "cannot create 'x.h5': <why>"
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
  out->commit();
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
  if (path != "-") w.out.emplace(path);  // refuses a device, FIFO or link before any work
  check_info(info, w.who());
  if (info.source != "record" && info.source != "train")
    throw Error(str(w.who(), ": source is '", info.source, "', expected 'record' or 'train'"));
  if (w.info.provenance.time.empty()) w.info.provenance.time = utc_timestamp();
  w.L = info.layers();
  w.k = info.top_k;
  w.Emax = info.max_experts();
  // "-": written to a temporary file too (memory stays flat), whose bytes close() sends out.
  static std::atomic<int> images{0};
  if (path == "-") {
    w.temp = (std::filesystem::temp_directory_path() /
              str("moe-trace-", ::getpid(), "-", ++images, ".h5"))
                 .string();
  } else {
    w.temp = w.out->temp();
  }
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
    w.out->sync_directory();
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

}  // namespace moe::io
