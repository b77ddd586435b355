#include "moe/models/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "moe/models/memory.h"
#include "moe/nn/loss.h"
#include "moe/ops/core.h"
#include "moe/ops/moe.h"
#include "moe/settings.h"

namespace moe {

namespace {

// Block `index` of the model, as the values nn::Block is built from.
nn::BlockConfig block_config(const ModelConfig& config, const Flavour& flavour, int64_t index) {
  nn::BlockConfig b;
  b.layers = config.layers;
  b.d_model = config.d_model;
  b.heads = config.heads;
  b.kv_heads = config.kv_heads_resolved();
  b.d_ff = config.d_ff;
  b.head_dim = config.head_dim_resolved();
  b.experts = config.experts_per_layer.at(index);
  b.top_k = config.top_k;
  b.residual_moe = config.residual_moe;
  b.normalize_topk = config.normalize_topk;
  b.router_jitter = config.router_jitter;
  b.capacity_factor = config.capacity_factor;
  b.norm_eps = config.norm_eps;
  b.rope_theta = config.rope_theta;
  b.rope_scaling = config.rope_scaling();
  b.score_scale = config.attention_scale();
  b.norm = flavour.norm;
  b.activation = flavour.activation;
  b.bias = flavour.bias;
  b.learned_positions = flavour.learned_positions;
  b.qk_norm = flavour.qk_norm;
  b.qkv_bias = flavour.qkv_bias;
  b.shared_expert_ff = config.shared_expert_ff;
  b.shared_expert_gate = flavour.shared_expert_gate;
  b.router_scoring = config.router_scoring;
  b.router_selection_bias = config.router_selection_bias();
  b.router_center = config.router_center();
  b.rope_dim = config.rope_dim;
  b.dense_ff = config.dense_ff;
  b.router_groups = config.router_groups;
  b.router_group_topk = config.router_group_topk;
  b.router_gate_scale = config.routed_scale;
  b.window = config.window_of(index);
  b.sinks = flavour.sinks;
  b.router_logit_bias = flavour.router_logit_bias;
  b.clamp =
      SwigluClamp{static_cast<float>(config.swiglu_alpha), static_cast<float>(config.swiglu_limit)};
  if (config.mla())
    b.mla = nn::MlaConfig{config.q_lora_rank, config.kv_lora_rank, config.qk_nope_dim,
                          config.qk_rope_dim, config.v_head_dim};
  return b;
}

}  // namespace

Transformer::Transformer(const ModelConfig& config, ParamSet& params, const nn::Parallel* parallel)
    : config_(config), flavour_(flavour_of(config)), params_(params) {
  config_.validate();
  MOE_CHECK(params.dtype() == config.dtype, "model dtype ", dtype_name(config.dtype),
            " differs from the parameter set's ", dtype_name(params.dtype()));
  const float init_std = 0.02f;
  const size_t first_param = params.size();
  if (parallel && parallel->embedding) {
    MOE_USAGE_CHECK(!flavour_.tied_head, flag_for(Setting::shard_embedding),
                    " needs an untied LM head, but the ", arch_name(config.arch),
                    " flavour ties it to the token table (use ", flag_for(Setting::arch),
                    " mixtral)");
    sharded_tokens_ = std::make_unique<nn::ShardedEmbedding>(
        params, "embed.tokens", config.vocab_size, config.d_model, init_std, *parallel->embedding);
  } else {
    tokens_ = std::make_unique<nn::Embedding>(params, "embed.tokens", config.vocab_size,
                                              config.d_model, init_std);
  }
  if (flavour_.learned_positions)
    positions_ = std::make_unique<nn::Embedding>(params, "embed.positions", config.seq,
                                                 config.d_model, init_std / 2);
  std::vector<Param*> all = params.all();
  outer_params_.assign(all.begin() + static_cast<std::ptrdiff_t>(first_param), all.end());
  for (int64_t i = 0; i < config.layers; ++i) {
    const size_t before = params.size();
    blocks_.push_back(
        std::make_unique<nn::Block>(params, block_config(config_, flavour_, i), i, parallel));
    all = params.all();
    block_params_.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(before), all.end());
  }
  // Each MoE block knows the next one, for an expert store that reads ahead (nn::Block::lookahead).
  for (size_t i = blocks_.size(), next = blocks_.size(); i-- > 0;) {
    if (!blocks_[i]->has_moe()) continue;
    if (next < blocks_.size()) blocks_[i]->set_next_moe(blocks_[next].get());
    next = i;
  }
  const size_t after_blocks = params.size();
  final_norm_ = std::make_unique<nn::Norm>(params, "final_norm", config.d_model, flavour_.norm,
                                           static_cast<float>(config.norm_eps));
  head_ = flavour_.tied_head ? &tokens_->table()
                             : &params.add("lm_head.weight", {config.vocab_size, config.d_model},
                                           Init::normal(init_std));
  all = params.all();
  outer_params_.insert(outer_params_.end(), all.begin() + static_cast<std::ptrdiff_t>(after_blocks),
                       all.end());
}

int64_t Transformer::num_params() const {
  int64_t total = 0;
  for (const Param* p : std::as_const(params_).all()) total += p->logical_numel();
  return total;
}

int64_t Transformer::active_params_per_token() const {
  int64_t total = 0;
  for (const Param* p : std::as_const(params_).all()) {
    if (!p->expert) {
      total += p->logical_numel();
    } else {  // the leading dimension indexes the E experts; a token uses k of them
      // p->shape, not p->value: an offloaded expert parameter has no value tensor.
      total += p->numel() / p->shape[0] * (config_.residual_moe ? 1 : config_.top_k);
    }
  }
  return total;
}

// Position of every token of a [B,T] batch flattened to [B*T]: 0..T-1, B times.
static Tensor position_ids(int64_t n, int64_t seq) {
  Tensor pos = Tensor::empty({n}, DType::i32);
  int32_t* p = pos.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(i % seq);
  return pos;
}

Tensor Transformer::embed(const Tensor& ids, int64_t batch, int64_t seq,
                          nn::ShardedEmbedding::Saved* sharded_saved) const {
  MOE_CHECK(seq <= config_.seq, "sequence of ", seq, " tokens is longer than the model's context (",
            config_.seq, ")");
  Tensor flat = ids.reshape({batch * seq});
  Tensor x =
      sharded_tokens_ ? sharded_tokens_->forward(flat, sharded_saved) : tokens_->forward(flat);
  if (positions_) {
    ops::axpy(1.0f, positions_->forward(position_ids(batch * seq, seq).to(ids.device())), x);
  }
  return x;
}

Tensor Transformer::head(const Tensor& h) const {
  Tensor logits = Tensor::empty({h.dim(0), config_.vocab_size}, DType::f32, h.device());
  ops::gemm(h, false, head_->w(), true, logits);
  return logits;
}

Tensor Transformer::logits(const Tensor& ids) const {
  nn::RouterStep step;
  step.training = false;
  ForwardStats stats;
  Tensor x = forward_blocks(ids, ids, step, nullptr, nullptr, stats);
  return head(final_norm_->forward(x, nullptr));
}

KVCache Transformer::make_cache(int64_t slots, int64_t capacity) const {
  if (capacity == 0) capacity = config_.seq;
  MOE_CHECK(slots >= 0 && capacity > 0 && capacity <= config_.seq, "KV cache of ", slots,
            " slots and ", capacity, " positions (the model's context is ", config_.seq, ")");
  // Refused with the figures before allocating, rather than by a failed allocation part-way.
  const double per_token = kv_cache_bytes_per_token(config_);
  check_free_memory(per_token * double(slots) * double(capacity),
                    str("a KV cache of ", slots, " sequences of ", capacity, " positions (",
                        format_bytes(per_token), " a position)"));
  KVCache cache;
  for (const auto& block : blocks_) cache.blocks.push_back(block->make_cache(slots, capacity));
  cache.length.assign(static_cast<size_t>(slots), 0);
  return cache;
}

Tensor Transformer::forward_cached(const Tensor& ids, KVCache& cache,
                                   const BlockHooks* hooks) const {
  MOE_CHECK(ids.ndim() == 2, "forward_cached: ids ", ids.describe(), " must be [B,t]");
  const int64_t batch = ids.dim(0);
  std::vector<int64_t> counts(static_cast<size_t>(batch), ids.dim(1)), slots;
  for (int64_t b = 0; b < batch; ++b) slots.push_back(b);
  return forward_cached(ids, counts, slots, cache, hooks);
}

Tensor Transformer::forward_cached(const Tensor& ids, const std::vector<int64_t>& counts,
                                   const std::vector<int64_t>& slots, KVCache& cache,
                                   const BlockHooks* hooks) const {
  MOE_CHECK(cache.blocks.size() == blocks_.size(), "forward_cached: a cache of ",
            cache.blocks.size(), " blocks for a model of ", blocks_.size());
  ids.expect_dtype(DType::i32, "forward_cached ids");
  ops::CachedRows rows;
  rows.count = counts;
  rows.slot = slots;
  for (int64_t slot : slots) {
    MOE_CHECK(slot >= 0 && slot < cache.slots(), "forward_cached: slot ", slot, " of a cache of ",
              cache.slots());
    rows.start.push_back(cache.length[static_cast<size_t>(slot)]);
  }
  rows.check(cache.slots(), std::min(cache.capacity(), config_.seq), "forward_cached");
  const int64_t n = rows.tokens(), num_rows = rows.rows(), width = config_.d_model;
  MOE_CHECK(ids.numel() == n, "forward_cached: ids ", ids.describe(), " for ", n, " new tokens");

  const Device on = device();  // host ids are uploaded to the model's device
  Tensor flat = ids.reshape({n}).to(on);
  Tensor x = sharded_tokens_ ? sharded_tokens_->forward(flat, nullptr) : tokens_->forward(flat);
  if (positions_) {
    Tensor pos = Tensor::empty({n}, DType::i32);
    int32_t* p = pos.data<int32_t>();
    for (int64_t r = 0, i = 0; r < num_rows; ++r)
      for (int64_t t = 0; t < rows.count[r]; ++t) p[i++] = static_cast<int32_t>(rows.start[r] + t);
    ops::axpy(1.0f, positions_->forward(pos.to(on)), x);
  }
  // bf16/f16 models store parameters in 16 bits; activations stay f32 (docs/FORMATS.md, dtypes).
  for (size_t i = 0; i < blocks_.size(); ++i) {
    nn::RouterStep step;
    step.training = false;
    step.layer = static_cast<int64_t>(i);
    if (hooks && hooks->before) hooks->before(static_cast<int64_t>(i));
    x = blocks_[i]->forward_cached(x, rows, cache.blocks[i], step, nullptr);
    if (hooks && hooks->after) hooks->after(static_cast<int64_t>(i));
  }
  for (int64_t r = 0; r < num_rows; ++r)
    cache.length[static_cast<size_t>(rows.slot[r])] += rows.count[r];

  // The last new token of each row.
  std::vector<int32_t> ends(static_cast<size_t>(num_rows));
  for (int64_t r = 0, end = 0; r < num_rows; ++r) {
    end += rows.count[r];
    ends[static_cast<size_t>(r)] = static_cast<int32_t>(end - 1);
  }
  Tensor last = Tensor::empty({num_rows, width}, DType::f32, on);
  ops::gather_rows(x, Tensor::from_vector({num_rows}, ends).to(on), last);
  return head(final_norm_->forward(last, nullptr));
}

ForwardStats Transformer::evaluate(const Tensor& ids, const Tensor& targets,
                                   Tensor* row_nll) const {
  EvalOptions options;
  options.row_nll = row_nll;
  return evaluate(ids, targets, options);
}

ForwardStats Transformer::evaluate(const Tensor& ids, const Tensor& targets,
                                   const EvalOptions& options) const {
  nn::RouterStep step;
  step.training = false;
  step.capture_routing = options.capture_routing;
  step.input_sums = options.router_input_sums;
  step.expert_block_tokens = options.expert_block_tokens;
  scratch_.reset_peak();
  ForwardStats stats;
  Tensor x = forward_blocks(ids, targets, step, nullptr, nullptr, stats, options.hooks, nullptr,
                            options.blocks);
  if (options.blocks > 0 && options.blocks < config_.layers) {
    MOE_CHECK(!options.row_nll, "evaluate: a pass of ", options.blocks, " of ", config_.layers,
              " blocks has no per-token loss");
    finish_stats(stats);
    return stats;
  }
  stats.loss = loss_by_rows(final_norm_->forward(x, nullptr), targets.reshape({ids.numel()}),
                            options.row_nll, options.logit_block_rows, options.logit_rows);
  finish_stats(stats);
  stats.activation_peak_bytes = scratch_.peak_bytes();
  return stats;
}

double Transformer::loss_by_rows(
    const Tensor& h, const Tensor& targets, Tensor* row_nll, int64_t block,
    const std::function<void(const Tensor&, int64_t)>& logit_rows) const {
  MOE_CHECK(block >= 0, "evaluate: ", block, " logit rows a block");
  if (block == 0) block = default_logit_block_rows(config_.vocab_size);
  const int64_t n = h.dim(0);
  Tensor nll = Tensor::empty({n}, DType::f32, h.device());
  // Blocks of equal size (none shorter than half a block; one block when n <= block): every head
  // product keeps its shape class, and the logits of a block live only in the scratch.
  const int64_t blocks = (n + block - 1) / block, rows = blocks ? (n + blocks - 1) / blocks : 1;
  for (int64_t a = 0; a < n; a += rows) {
    const int64_t b = std::min(n, a + rows);
    Tensor into = nll.rows(a, b);
    scratch_.run(
        [&] {
          Tensor part;
          const Tensor logits = head(h.rows(a, b));
          if (logit_rows) logit_rows(logits, a);
          nn::cross_entropy(logits, targets.rows(a, b), nullptr, 1.0f, &part);
          return part;
        },
        &into);
  }
  // The mean as ops::cross_entropy takes it: in double, in row order, over counted rows.
  const Tensor host_nll = nll.to(Device{}), host_targets = targets.to(Device{});
  double sum = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n; ++i)
    if (host_targets.data<int32_t>()[i] >= 0) {
      sum += host_nll.data<float>()[i];
      ++counted;
    }
  if (row_nll) *row_nll = nll;
  return counted ? sum / static_cast<double>(counted) : 0.0;
}

Tensor Transformer::forward_blocks(const Tensor& ids, const Tensor& targets,
                                   const nn::RouterStep& step, std::vector<nn::Block::Saved>* saved,
                                   nn::ShardedEmbedding::Saved* sharded_saved, ForwardStats& stats,
                                   const BlockHooks* hooks, std::vector<Tensor>* block_inputs,
                                   int64_t blocks) const {
  MOE_CHECK(ids.ndim() == 2 && targets.shape() == ids.shape(), "batch: ids ", ids.describe(),
            " and targets ", targets.describe(), " must both be [B,T]");
  int64_t batch = ids.dim(0), seq = ids.dim(1);
  Tensor x = embed(ids, batch, seq, sharded_saved);  // f32 activations whatever the dtype
  if (saved) saved->resize(blocks_.size());
  const size_t run =
      blocks > 0 ? std::min(blocks_.size(), static_cast<size_t>(blocks)) : blocks_.size();
  for (size_t i = 0; i < run; ++i) {
    nn::RouterStep s = step;
    s.layer = static_cast<int64_t>(i);
    nn::MoEStats ms;
    if (hooks && hooks->before) hooks->before(static_cast<int64_t>(i));
    if (block_inputs) {  // --recompute block: keep the input, the block's activations are scratch
      block_inputs->push_back(x);
      // A throwaway Saved: the block runs exactly as when saving (the same kernels and bits).
      x = scratch_.run([&] {
        nn::Block::Saved unused;
        return blocks_[i]->forward(x, batch, seq, s, &unused, &ms);
      });
    } else if (saved) {
      x = blocks_[i]->forward(x, batch, seq, s, &(*saved)[i], &ms);
    } else {  // inference: the block's activations are scratch, its output overwrites its input
      x = scratch_.run([&] { return blocks_[i]->forward(x, batch, seq, s, nullptr, &ms); }, &x);
    }
    if (hooks && hooks->after) hooks->after(static_cast<int64_t>(i));
    if (blocks_[i]->has_moe()) {
      stats.aux_loss += ms.aux_loss;
      stats.z_loss += ms.z_loss;
      stats.moe.push_back(std::move(ms));
    }
  }
  return x;
}

void Transformer::finish_stats(ForwardStats& stats) const {
  stats.total =
      stats.loss + config_.aux_loss_coef * stats.aux_loss + config_.z_loss_coef * stats.z_loss;
}

ForwardStats Transformer::forward_backward(const Tensor& ids, const Tensor& targets,
                                           const nn::RouterStep& step,
                                           const GradsReady& grads_ready) {
  return forward_backward(ids, targets, step, grads_ready, LogitsLoss{});
}

ForwardStats Transformer::forward_backward(const Tensor& ids, const Tensor& targets,
                                           const nn::RouterStep& step,
                                           const GradsReady& grads_ready, const LogitsLoss& loss) {
  TrainPass pass;
  pass.grads_ready = grads_ready;
  pass.loss = loss;
  return forward_backward(ids, targets, step, pass);
}

ForwardStats Transformer::forward_backward(const Tensor& ids, const Tensor& targets,
                                           const nn::RouterStep& step, const TrainPass& pass) {
  MOE_CHECK(pass.loss_scale > 0 && std::isfinite(pass.loss_scale), "forward_backward: loss_scale ",
            pass.loss_scale, " must be finite and > 0");
  const GradsReady& grads_ready = pass.grads_ready;
  const LogitsLoss& loss = pass.loss;
  const bool block_recompute = pass.recompute == nn::Recompute::block;
  int64_t batch = ids.dim(0), seq = ids.dim(1), n = ids.numel();
  ForwardStats stats;
  std::vector<nn::Block::Saved> saved(blocks_.size());
  std::vector<Tensor> block_inputs;
  if (pass.recompute == nn::Recompute::moe)
    for (nn::Block::Saved& s : saved) s.moe.recompute_experts = &scratch_;
  scratch_.reset_peak();
  nn::ShardedEmbedding::Saved sharded_saved;
  const ParamHooks& params = pass.params;
  BlockHooks around;  // the forward's
  if (params.gather) around.before = [&](int64_t g) { params.gather(g, false); };
  if (params.release) around.after = [&](int64_t g) { params.release(g, false); };
  if (params.gather) params.gather(-1, true);
  // A model built for forward passes only (infer::load_model) holds no gradients: say so, rather
  // than fail inside the first backward kernel (checked once group -1 is gathered: ZeRO-3's
  // gradients exist only then).
  for (const Param* p : outer_params_)
    MOE_CHECK(p->grad.defined() || p->frozen || p->offloaded, "forward_backward: parameter '",
              p->name, "' holds no gradient: this model was built for forward passes only");
  Tensor x = forward_blocks(ids, targets, step, block_recompute ? nullptr : &saved, &sharded_saved,
                            stats, &around, block_recompute ? &block_inputs : nullptr);
  nn::Norm::Saved final_saved;
  Tensor h = final_norm_->forward(x, &final_saved);
  Tensor logits = head(h);
  Tensor dlogits = Tensor::empty(logits.shape(), DType::f32, logits.device());
  Tensor flat_targets = targets.reshape({n});
  if (loss) {
    stats.loss = loss(ids, flat_targets, logits, dlogits);
    if (pass.loss_scale != 1.0f) ops::scale(dlogits, pass.loss_scale);
  } else {
    stats.loss = nn::cross_entropy(logits, flat_targets, &dlogits, pass.loss_scale);
  }
  finish_stats(stats);

  // Backward, in reverse.
  ops::gemm(dlogits, true, h, false, head_->grad, 1.0f, 1.0f);  // dW_head += dlogits^T h
  Tensor dh = Tensor::empty(h.shape(), DType::f32, h.device());
  ops::gemm(dlogits, false, head_->w(), false, dh);
  Tensor dx = final_norm_->backward(dh, final_saved);
  const float aux_scale = static_cast<float>(config_.aux_loss_coef * pass.loss_scale);
  const float z_scale = static_cast<float>(config_.z_loss_coef * pass.loss_scale);
  for (size_t i = blocks_.size(); i-- > 0;) {
    if (params.gather) params.gather(static_cast<int64_t>(i), true);
    if (block_recompute) {
      // The block's forward again, saving, in the scratch (its statistics were taken the first
      // time), then its backward; dx is overwritten in place with the block's input gradient.
      nn::RouterStep again = step;
      again.layer = static_cast<int64_t>(i);
      again.capture_routing = false;
      scratch_.run(
          [&] {
            nn::Block::Saved s;
            nn::MoEStats unused;
            blocks_[i]->forward(block_inputs[i], batch, seq, again, &s, &unused);
            return blocks_[i]->backward(dx, s, aux_scale, z_scale);
          },
          &dx);
    } else {
      dx = blocks_[i]->backward(dx, saved[i], aux_scale, z_scale);
    }
    if (grads_ready) grads_ready(block_params_[i]);
    if (params.release) params.release(static_cast<int64_t>(i), true);
  }
  Tensor flat_ids = ids.reshape({n});
  if (sharded_tokens_)
    sharded_tokens_->backward(dx, sharded_saved);
  else
    tokens_->backward(dx, flat_ids);
  if (positions_) {
    positions_->backward(dx, position_ids(n, seq).to(ids.device()));
  }
  if (grads_ready) grads_ready(outer_params_);
  if (params.release) params.release(-1, true);
  stats.activation_peak_bytes = scratch_.peak_bytes();
  return stats;
}

int64_t default_logit_block_rows(int64_t vocab) {
  return std::max<int64_t>(256, (int64_t(1) << 24) / std::max<int64_t>(vocab, 1));
}

int64_t block_of_name(const std::string& name) {
  for (size_t at = name.find("blocks."); at != std::string::npos;
       at = name.find("blocks.", at + 1)) {
    if (at > 0 && name[at - 1] != '.') continue;
    size_t i = at + 7, j = i;
    while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
    if (j > i && j < name.size() && name[j] == '.') return std::stoll(name.substr(i, j - i));
  }
  return -1;
}

}  // namespace moe
