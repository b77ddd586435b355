// Models for inference from a checkpoint file or a sharded checkpoint directory (see
// moe/infer/model.h). Shapes: E experts of a layer, R ranks of the expert-parallel group.
#include "moe/infer/model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <map>

#include "backend/cpu/gemv.h"
#include "backend/cpu/quant_blocks.h"
#include "io/gguf_blocks.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/io/convert.h"
#include "moe/io/finite.h"
#include "moe/log.h"
#include "moe/models/memory.h"
#include "moe/nn/router.h"
#include "moe/settings.h"
#include "moe/timer.h"
#include "offload/checkpoint_experts.h"

namespace moe::infer {

namespace {

// A sharded checkpoint directory (moe-train --ep, moe-convert partition), opened with every
// expert tensor streamed: rank 0's file gives the configurations, the position and the
// replicated tensors; the files together hold each expert tensor's slices. The slices index the
// rank-major order of the experts (rank 0's, then rank 1's, ...): position g of MoE block b is
// expert order[b][g] (/sharding expert_rank; the identity for the trainer's contiguous layout).
struct Sharded {
  std::vector<io::Checkpoint> heads;  // per file
  struct Slice {
    const io::NamedTensor* tensor = nullptr;
    int64_t local = 0;
  };
  std::map<std::string, std::vector<Slice>> positions;  // expert tensor -> [E] by position
  std::map<int64_t, std::vector<int>> order;            // MoE block -> expert at each position

  const io::Checkpoint& head() const { return heads.front(); }
};

Sharded open_sharded(const std::string& dir) {
  Sharded s;
  const std::vector<std::string> files = io::checkpoint_files({dir});
  for (const std::string& file : files)
    s.heads.push_back(
        io::load_checkpoint(file, false, [](bool, const std::string&) { return true; }));
  const io::Sharding& layout = s.head().sharding;
  MOE_CHECK(!layout.shard_embedding, "'", dir, "' splits the token embedding over its ranks (",
            flag_for(Setting::shard_embedding),
            "); inference needs it whole: merge it first (moe-convert merge ", dir,
            " -o merged.h5)");
  for (size_t f = 0; f < s.heads.size(); ++f) {
    for (const io::NamedTensor& nt : s.heads[f].params) {
      if (!nt.expert) continue;
      const int64_t count = nt.shape().at(0);
      const int64_t start = nt.shard.defined() ? nt.shard.start : 0;
      const int64_t total = nt.shard.defined() ? nt.shard.global.at(0) : count;
      std::vector<Sharded::Slice>& at = s.positions[nt.name];
      at.resize(static_cast<size_t>(total));
      for (int64_t i = 0; i < count && start + i < total; ++i)
        if (!at[static_cast<size_t>(start + i)].tensor)  // replicas (data parallelism): the first
          at[static_cast<size_t>(start + i)] = {&nt, i};
    }
  }
  for (const auto& [name, at] : s.positions)
    for (size_t g = 0; g < at.size(); ++g)
      MOE_CHECK(at[g].tensor, "'", dir, "' holds no file with expert position ", g, " of '", name,
                "' (a rank file is missing?)");
  // expert_rank: the per-layer maps (expert -> rank), concatenated over the MoE blocks in order.
  const ModelConfig mc = model_config_from_json(s.head().model_config);
  size_t next = 0;
  for (int64_t b = 0; b < mc.layers; ++b) {
    if (!mc.is_moe_layer(b)) continue;
    const int64_t E = mc.experts_per_layer.at(static_cast<size_t>(b));
    std::vector<int>& order = s.order[b];
    if (layout.expert_rank.empty()) {
      for (int64_t e = 0; e < E; ++e) order.push_back(static_cast<int>(e));
      continue;
    }
    MOE_CHECK(next + static_cast<size_t>(E) <= layout.expert_rank.size(), "'", dir,
              "': /sharding expert_rank has ", layout.expert_rank.size(),
              " entries, fewer than the model's experts");
    for (int r = 0; r < layout.ep_size; ++r)
      for (int64_t e = 0; e < E; ++e)
        if (layout.expert_rank[next + static_cast<size_t>(e)] == r)
          order.push_back(static_cast<int>(e));
    MOE_CHECK(static_cast<int64_t>(order.size()) == E, "'", dir,
              "': /sharding expert_rank of block ", b, " places experts on ranks outside [0, ",
              layout.ep_size, ")");
    next += static_cast<size_t>(E);
  }
  return s;
}

bool identity(const std::vector<int>& order) {
  for (size_t g = 0; g < order.size(); ++g)
    if (order[g] != static_cast<int>(g)) return false;
  return true;
}

// Whether the CPU kernels read the parameter's stored value in place, with no f32 compute copy:
// bf16/f16 weight matrices (ops::gemm and grouped_gemm widen them on the fly). The loader and
// lean_for_inference both follow this rule.
bool reads_in_place(const Param& p) {
  const DType dtype = p.value.dtype();
  return (dtype == DType::bf16 || dtype == DType::f16) && io::quantizable(p.name, p.value.shape());
}

// The compute tensor of a parameter whose value the loader has written: its value where the
// kernels read it in place (moving the model to a GPU makes f32 copies there), so loading never
// holds an f32 copy of the matrices; anything else gets its f32 copy.
void finish_loaded(Param& p) {
  if (reads_in_place(p))
    p.compute = p.value;
  else
    p.refresh_compute();
}

// How a tensor of the file reached the loader: read (its values checked as always), or mapped
// (io::map_checkpoint). A mapped tensor the kernels read unchanged becomes the parameter's value
// itself, and its values are scanned only when the caller asked to verify: a scan would make
// every page of the model resident (docs/FORMATS.md "Mapped weights").
struct Source {
  bool mapped = false;
  bool verify = false;
};

// Whether `tensor` (of `source`) becomes p's value as it is: a mapped weight matrix or expert
// tensor of p's own dtype. Anything else (norms, biases, routers, centers: small, and some are
// rewritten at load; a dtype converted) is copied, so nothing ever writes through a mapping.
bool adopt(const Param& p, const Tensor& tensor, const Source& source) {
  return source.mapped && tensor.dtype() == p.value.dtype() && tensor.shape() == p.value.shape() &&
         (p.expert || io::quantizable(p.name, p.value.shape()));
}

// One expert's chunk, checked as every loader checks it, copied into row `row` of p's value.
void put_expert(Param& p, int64_t row, const Tensor& one, const std::string& source,
                int64_t expert) {
  const int64_t per_expert = p.value.numel() / p.value.dim(0);
  MOE_CHECK(one.numel() == per_expert && one.dtype() == p.value.dtype(), "'", source, "': expert ",
            expert, " of '", p.name, "' is ", one.describe(), ", the model expects ", per_expert,
            " ", dtype_name(p.value.dtype()), " elements");
  io::check_finite(str("'", source, "'"), str(p.name, " (expert ", expert, ")"), one);
  std::memcpy(static_cast<std::byte*>(p.value.raw()) + row * one.nbytes(), one.raw(), one.nbytes());
}

// Builds m.params and m.model for m.config, after checking they fit in memory: the resident
// parameters at least (experts not read, or only this rank's slice of them, are left out of the
// bound).
void build_model(LoadedModel& m, const std::string& source, bool experts,
                 const nn::Parallel* parallel) {
  const bool sliced_experts = parallel && parallel->shards_experts();
  const double params = parameter_lower_bound(m.config, experts && !sliced_experts ? 1 : 0);
  check_fits_in_memory(params * double(dtype_size(m.config.dtype)),
                       str("the model in '", source, "'"),
                       str(params, " parameters of ", dtype_name(m.config.dtype)));
  m.params = std::make_unique<ParamSet>(0, m.config.dtype);
  m.params->skip_initial_values(true);  // every parameter is read from the file next
  m.params->skip_gradients(true);       // forward passes only
  m.model = std::make_unique<Transformer>(m.config, *m.params, parallel);
  m.params->skip_initial_values(false);
  m.params->skip_gradients(false);
}

// A Q8_0 weight (moe-convert quantize): u8 rows [.., out, q8_row_bytes(in)], packed into the
// kernels' row groups (DType::q8_0 [.., out, q8_group_row_bytes(in)], backend/cpu/gemv.h), become
// the parameter's value and what the kernels read (ops::gemm / grouped_gemm take them as x W^T).
// Every block scale is checked finite (a corrupted scale would score garbage silently).
void put_q8_0(Param& p, const Tensor& tensor, const std::string& source) {
  const Shape& shape = p.value.shape();
  Shape expect = shape;
  expect.back() = cpu::q8_row_bytes(shape.back());
  MOE_CHECK(tensor.shape() == expect, "'", source, "': Q8_0 tensor ", tensor.describe(),
            " does not hold parameter ", p.name, shape_str(shape), " (expected u8",
            shape_str(expect), ")");
  const int64_t in = shape.back(), rows = p.value.numel() / in, row_bytes = expect.back();
  offload::check_block_scales(cpu::BlockFormat::q8_0, tensor.data<uint8_t>(), rows, row_bytes, in,
                              str("'", source, "': tensor '", p.name, "'"),
                              "a Q8_0 scale is finite and >= 0");
  p.value = cpu::pack_q8_0(tensor, in);
  p.value.set_name(p.name);
  p.compute = p.value;
  p.grad = Tensor();
}

// A "q8_0" tensor of a block recipe (import-gguf of llama.cpp's mixes): GGUF's q8_0 blocks, the
// same bytes as our Q8_0 rows rearranged (io::q8_blocks_to_rows, which refuses a damaged block),
// so it becomes a Q8_0 parameter as put_q8_0 makes one and runs on the Q8_0 kernels.
void put_q8_0_blocks(Param& p, const Tensor& tensor, const std::string& source) {
  const Shape& shape = p.value.shape();
  const int64_t in = shape.back();
  MOE_CHECK(in % io::kQ8Block == 0, "'", source, "': tensor '", p.name, "' ", shape_str(shape),
            " is listed as q8_0, but its rows of ", in, " elements are not whole blocks of ",
            io::kQ8Block);
  Shape expect = shape;
  expect.back() = cpu::block_row_bytes(cpu::BlockFormat::q8_0, in);
  MOE_CHECK(tensor.dtype() == DType::u8 && tensor.shape() == expect, "'", source, "': q8_0 tensor ",
            tensor.describe(), " does not hold parameter ", p.name, shape_str(shape),
            " (expected u8", shape_str(expect), ")");
  Shape rows_shape = shape;
  rows_shape.back() = cpu::q8_row_bytes(in);
  Tensor rows = Tensor::empty(rows_shape, DType::u8);
  const std::vector<uint8_t> bytes =
      io::q8_blocks_to_rows(str("'", source, "': tensor '", p.name, "'"), tensor.data<uint8_t>(),
                            p.value.numel() / in, in);
  if (!bytes.empty()) std::memcpy(rows.raw(), bytes.data(), bytes.size());
  put_q8_0(p, rows, source);
}

// A block-format weight (moe-convert quantize --type q4_k, q6_k, mxfp4, q4_k_m; model_config
// tensor_formats names its format): u8 rows [.., out, block_row_bytes(format, in)], GGUF's bytes,
// become the parameter's value and what the kernels read, unchanged (cpu::block_rows: DType q4_k,
// q6_k or mxfp4; ops::gemm / grouped_gemm take them as x W^T). Every block's scales are checked
// finite first, as put_q8_0 checks its scales (a damaged scale would score garbage silently).
// A "q8_0" tensor (import-gguf's mixes) goes to put_q8_0_blocks.
// Returns whether the tensor was adopted as the value (mapped).
bool put_blocks(Param& p, const Tensor& tensor, const std::string& format_name,
                const std::string& source, const Source& from) {
  if (format_name == "q8_0") {
    put_q8_0_blocks(p, tensor, source);
    return false;
  }
  cpu::BlockFormat format;
  try {
    format = cpu::parse_block_format(format_name);
    (void)cpu::dtype_of_block_format(format);  // a weight format (not q8_k or q8_0)
  } catch (const Error& e) {
    throw Error(str("'", source, "': tensor '", p.name, "' is listed in tensor_formats as '",
                    format_name, "': ", e.what()));
  }
  const Shape& shape = p.value.shape();
  const int64_t in = shape.back(), per_block = cpu::block_elems(format);
  MOE_CHECK(in % per_block == 0, "'", source, "': tensor '", p.name, "' ", shape_str(shape),
            " is listed as ", format_name, ", but its rows of ", in,
            " elements are not whole blocks of ", per_block);
  Shape expect = shape;
  expect.back() = cpu::block_row_bytes(format, in);
  MOE_CHECK(tensor.dtype() == DType::u8 && tensor.shape() == expect, "'", source,
            "': ", format_name, " tensor ", tensor.describe(), " does not hold parameter ", p.name,
            shape_str(shape), " (expected u8", shape_str(expect), ")");
  // A mapped tensor is the value as it is (the kernels read GGUF's bytes); its scales are checked
  // only when verifying (the scan would touch every page).
  const bool mapped = from.mapped && (p.expert || io::quantizable(p.name, shape));
  const int64_t rows = mapped && !from.verify ? 0 : p.value.numel() / in;
  offload::check_block_scales(format, tensor.data<uint8_t>(), rows, expect.back(), in,
                              str("'", source, "': tensor '", p.name, "'"),
                              str("a ", format_name, " block's scales are finite"));
  p.value =
      mapped ? tensor.view_as(cpu::dtype_of_block_format(format)) : cpu::block_rows(tensor, format);
  p.value.set_name(p.name);
  p.compute = p.value;
  p.grad = Tensor();
  return mapped;
}

// A whole (non-expert or unsliced) tensor of `source` into its parameter, checked as every loader
// checks it: a parameter of the model, its shape and dtype, finite (never score or serve garbage).
// `block_format`: the tensor's block format (io::block_format_of), "" for none. `from`: whether
// it is mapped (a weight matrix then becomes the value itself: see adopt). Returns whether it did.
bool put_param(ParamSet& params, const std::string& name, const Tensor& tensor,
               const std::string& source, const std::string& block_format = "",
               const Source& from = {}) {
  Param* p = params.find(name);
  MOE_CHECK(p, "'", source, "': tensor '", name, "' is not a parameter of its own model");
  if (!block_format.empty()) return put_blocks(*p, tensor, block_format, source, from);
  if (tensor.dtype() == DType::u8 && io::quantizable(name, p->value.shape())) {
    put_q8_0(*p, tensor, source);
    return false;
  }
  MOE_CHECK(tensor.shape() == p->value.shape() &&
                (tensor.dtype() == p->value.dtype() || io::converts_on_load(*p, tensor.dtype())),
            "'", source, "': tensor ", tensor.describe(), " does not match parameter ",
            p->value.describe());
  const bool adopted = adopt(*p, tensor, from);
  if (!adopted || from.verify) io::check_finite(str("'", source, "'"), name, tensor);
  if (adopted) {
    p->value = tensor;
    p->value.set_name(name);
  } else {
    p->value.copy_from(tensor);
  }
  finish_loaded(*p);
  return adopted;
}

// Sets m from a sharded directory (see load_model).
void load_sharded(LoadedModel& m, const std::string& dir, bool experts,
                  const nn::Parallel* parallel) {
  const Sharded s = open_sharded(dir);
  io::refuse_quantized(s.head().model_config, dir, "a sharded checkpoint directory");
  m.config = model_config_from_json(s.head().model_config);
  m.provenance = s.head().provenance;
  m.step = s.head().state.step;
  build_model(m, dir, experts, parallel);
  // Each rank of an expert-parallel group holds a contiguous range of positions: rank r's range
  // is then exactly the experts the files put on r. The router's rows are reordered the same way,
  // so position g scores as expert order[g] did: the same model with its experts relabelled.
  const bool relabel = parallel && parallel->shards_experts();
  size_t matched = 0;
  for (const io::NamedTensor& nt : s.head().params) {
    if (nt.expert) continue;
    MOE_CHECK(!nt.shard.defined(), "'", dir, "': '", nt.name, "' is split over the ranks");
    Tensor tensor = nt.tensor;
    const int64_t b = block_of_name(nt.name);
    // The router's rows, and its selection and logit biases' entries, follow their experts.
    if (relabel && s.order.count(b) && !identity(s.order.at(b)) &&
        (nt.name == str("blocks.", b, ".moe.router.weight") ||
         nt.name == str("blocks.", b, ".moe.router.bias") ||
         nt.name == str("blocks.", b, ".moe.router.logit_bias"))) {
      const std::vector<int>& order = s.order.at(b);
      Tensor rows = Tensor::empty(tensor.shape(), tensor.dtype());
      const size_t row_bytes = tensor.nbytes() / order.size();
      for (size_t g = 0; g < order.size(); ++g)
        std::memcpy(static_cast<std::byte*>(rows.raw()) + g * row_bytes,
                    static_cast<const std::byte*>(tensor.raw()) + order[g] * row_bytes, row_bytes);
      tensor = rows;
    }
    put_param(*m.params, nt.name, tensor, dir);
    ++matched;
  }
  for (Param* p : m.params->all()) {
    if (!p->expert) continue;
    auto it = s.positions.find(p->name);
    MOE_CHECK(it != s.positions.end(), "'", dir, "' holds no tensor '", p->name, "'");
    const Shape& global = p->shard.defined() ? p->shard.global : p->value.shape();
    MOE_CHECK(static_cast<int64_t>(it->second.size()) == global.at(0), "'", dir, "': '", p->name,
              "' has ", it->second.size(), " experts, the model ", global.at(0));
    ++matched;
    if (!experts) continue;
    const std::vector<int>& order = s.order.at(block_of_name(p->name));
    std::vector<int64_t> position_of(order.size());
    for (size_t g = 0; g < order.size(); ++g) position_of[static_cast<size_t>(order[g])] = g;
    const int64_t first = p->shard.defined() ? p->shard.start : 0;
    for (int64_t row = 0; row < p->value.dim(0); ++row) {
      // relabelled: this rank's positions; otherwise every expert in id order.
      const int64_t g = relabel ? first + row : position_of[static_cast<size_t>(first + row)];
      const Sharded::Slice& slice = it->second[static_cast<size_t>(g)];
      put_expert(*p, row, slice.tensor->expert_slice(slice.local), dir,
                 order[static_cast<size_t>(g)]);
    }
    finish_loaded(*p);
  }
  MOE_CHECK(matched == m.params->size(), "'", dir, "' holds ", matched, " of the model's ",
            m.params->size(), " parameters");
}

}  // namespace

LoadedModel load_model(const std::string& given, bool experts, const nn::Parallel* parallel,
                       const LoadOptions& options) {
  const io::CheckpointRef ref = io::resolve_checkpoint(given);  // a run directory: its last.h5
  if (ref.sharded) {
    MOE_CHECK(!(parallel && parallel->placement), "'", given,
              "' is a sharded checkpoint directory; ", flag_for(Setting::popularity),
              " places the experts of one checkpoint file: merge it first (moe-convert merge ",
              given, " -o merged.h5)");
    LoadedModel m;
    load_sharded(m, ref.path, experts, parallel);
    return m;
  }
  const std::string& path = ref.path;
  const Timer timer;
  LoadedModel m;
  const nlohmann::json config = io::read_model_config(path);
  m.quantization = io::quantization_of(config);
  // An expert store (the ring, the cache) holds quantised experts as the resident model does;
  // the ranks of expert parallelism do not.
  if (parallel && !parallel->expert_store && !m.quantization.empty())
    io::refuse_quantized(config, path, str("expert parallelism (", flag_for(Setting::ep), ")"));
  m.config = model_config_from_json(config);
  // build_model sizes every parameter: a model that cannot fit is refused before (quantised
  // weights: at least half a byte each, q4_k's and mxfp4's size).
  const bool resident_experts = experts && !(parallel && parallel->shards_experts());
  check_inference_weights(m.config, resident_experts ? 1.0 : 0.0,
                          m.quantization.empty() ? double(dtype_size(m.config.dtype)) : 0.5,
                          str("'", path, "'"),
                          resident_experts ? "the experts resident"
                                           : "without the experts: streamed, or on other ranks");
  build_model(m, path, experts, parallel);
  size_t matched = 0, mapped = 0;
  int64_t mapped_bytes = 0;
  auto take = [&](const std::string& name, const Tensor& tensor, const Source& from = {}) {
    if (put_param(*m.params, name, tensor, path, io::block_format_of(config, name), from)) {
      ++mapped;
      mapped_bytes += static_cast<int64_t>(tensor.nbytes());
    }
    ++matched;
  };
  if (experts && !(parallel && parallel->shards_experts())) {
    // Parameters, no optimizer state; the experts (most of an MoE model) streamed into their
    // parameters one expert at a time, so the process never holds a second copy of them (Q8_0
    // tensors are read whole and packed into their parameters, each held twice until packed).
    // The other tensors are read whole first and each released once copied: they are held twice
    // until then. Mapped (options.map): the weights that io::map_checkpoint maps are neither
    // read nor copied; the rest is read as above.
    const bool stream = m.quantization.empty();
    const io::StreamFilter filter = [stream](bool, const std::string&) { return stream; };
    io::Checkpoint ckpt = options.map ? io::map_checkpoint(path, filter, {options.verify})
                                      : io::load_checkpoint(path, false, filter);
    MOE_CHECK(ckpt.sharding.rank < 0, "'", path, "' is rank ", ckpt.sharding.rank,
              "'s shard of a sharded checkpoint; inference needs a whole checkpoint");
    m.provenance = ckpt.provenance;
    m.step = ckpt.state.step;
    for (io::NamedTensor& nt : ckpt.params) {
      if (!nt.streamed()) {  // held, or mapped now (deferred): one mapping at a time
        take(nt.name, nt.whole(), Source{nt.mapped, options.verify});
        nt.tensor = Tensor();
        nt.deferred = nullptr;
        continue;
      }
      Param* p = m.params->find(nt.name);
      MOE_CHECK(p && p->expert && !p->shard.defined() && nt.shape() == p->value.shape(), "'", path,
                "': expert tensor '", nt.name, "' ", shape_str(nt.shape()),
                p ? str(" does not match parameter ", p->value.describe())
                  : std::string(" is not a parameter of its own model"));
      for (int64_t e = 0; e < p->value.dim(0); ++e) put_expert(*p, e, nt.source->read(e), path, e);
      finish_loaded(*p);
      ++matched;
    }
  } else {  // one tensor at a time; experts not read, or only this rank's slice
    for (const std::string& name : io::list_params(path)) {
      Param* p = m.params->find(name);
      if (p && p->expert) {
        ++matched;
        if (!experts || !p->shard.defined()) continue;
        for (int64_t e = 0; e < p->shard.count; ++e)
          put_expert(*p, e, io::read_expert(path, name, p->shard.start + e), path,
                     p->shard.start + e);
        finish_loaded(*p);
        continue;
      }
      take(name, io::read_param(path, name));
    }
  }
  MOE_CHECK(matched == m.params->size(), "'", path, "' holds ", matched, " of the model's ",
            m.params->size(), " parameters");
  MOE_LOG_DEBUG("'", path, "': ", mapped, " of ", matched, " parameters mapped from the file (",
                mapped_bytes, " bytes), the others read",
                options.verify ? ", mapped weights verified" : "", "; opened in ", timer.seconds(),
                " s");
  return m;
}

void fold_router_centers(ParamSet& params) {
  const std::string suffix = ".center";  // blocks.i.moe.router.center
  for (Param* c : params.all()) {
    if (!c->name.ends_with(".moe.router" + suffix)) continue;
    Param& w = params.at(c->name.substr(0, c->name.size() - suffix.size()) + ".weight");
    const Tensor host = nn::center_router_weight(w.w(), c->w());
    if (host.raw() == w.w().raw()) continue;  // a zero center: W' = W
    const Tensor folded = host.to(w.value.device());
    if (w.compute.raw() == w.value.raw()) w.value = folded;  // f32: the value is the compute copy
    w.compute = folded;
    c->value.copy_from(Tensor::zeros(c->value.shape(), c->value.dtype()).to(c->value.device()));
    c->refresh_compute();
  }
}

size_t lean_for_inference(ParamSet& params) {
  size_t released = 0;
  for (Param* p : params.all()) {
    if (p->offloaded) continue;
    MOE_CHECK(p->value.device().kind == Device::cpu, "lean_for_inference: '", p->name, "' is on ",
              p->value.device().str(), "; 16-bit weights are read in place on the CPU");
    if (p->grad.defined()) released += p->grad.nbytes();
    p->grad = Tensor();
    if (reads_in_place(*p) && p->compute.raw() != p->value.raw()) {
      released += p->compute.nbytes();
      p->compute = p->value;  // the kernels read the 16-bit values (ops::gemm, grouped_gemm)
    }
  }
#if defined(__GLIBC__)
  // glibc keeps freed heap memory (its mmap threshold grows with each large free): hand it back,
  // or the process's resident set would not shrink with the model.
  malloc_trim(0);
#endif
  return released;
}

LoadedModel load_ring_model(const std::string& path) {
  const io::CheckpointRef ref = io::resolve_checkpoint(path);
  MOE_CHECK(!ref.sharded, "'", path,
            "' is a sharded checkpoint directory; the expert ring streams the experts of one "
            "checkpoint file: merge it first (moe-convert merge ",
            path, " -o merged.h5)");
  auto ring = std::make_unique<offload::ExpertRing>(ref.path);
  auto view = std::make_unique<nn::Parallel>();
  view->expert_store = ring.get();
  LoadedModel m = load_model(ref.path, false, view.get());
  m.ring = std::move(ring);
  m.view = std::move(view);
  return m;
}

}  // namespace moe::infer
