// Routing trace version 1, the validating reader with row-range reads (the writer is
// trace_writer.cpp). Layout:
// docs/FORMATS.md ("Routing trace, version 1").
// Shape letters: N tokens, L MoE layers, k top-k, E experts of a layer, Emax max E, B batches.
#include "moe/io/trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "io/json_attrs.h"
#include "io/trace_checks.h"
#include "io/trace_layout.h"
#include "moe/io/hdf5.h"

namespace moe::io {

using namespace trace_layout;

namespace {

std::string join_ints(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += str(i ? ", " : "", dims[i]);
  return s + "]";
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
    const std::string place = attribute_place("trace", name, "model_config");
    info.model_config = read_json_attr(file, "model_config", place, root);
    check_model_config(info.model_config, place);
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

std::vector<std::vector<int64_t>> TraceReader::summed_loads() const {
  const Impl& r = impl();
  const std::vector<int64_t> all = loads();
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(r.L));
  for (int64_t l = 0; l < r.L; ++l) {
    std::vector<int64_t>& counts = out[static_cast<size_t>(l)];
    counts.assign(static_cast<size_t>(info().experts.at(static_cast<size_t>(l))), 0);
    for (int64_t b = 0; b < r.B; ++b)
      for (size_t e = 0; e < counts.size(); ++e)
        counts[e] += all[static_cast<size_t>((b * r.L + l) * r.Emax) + e];
  }
  return out;
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
