// Decoder-only MoE transformer: token embedding (+ learned positions for gpt), blocks, final norm,
// LM head (tied for gpt), cross-entropy. Shapes: ids [B, T], N = B*T, V vocabulary, D width.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "moe/models/config.h"
#include "moe/models/flavour.h"
#include "moe/nn/block.h"
#include "moe/nn/embedding.h"
#include "moe/nn/norm.h"
#include "moe/nn/parallel.h"
#include "moe/nn/recompute.h"
#include "moe/nn/sharded_embedding.h"
#include "moe/param.h"

namespace moe {

struct ForwardStats {
  double loss = 0;                // mean cross-entropy over predicted tokens
  double aux_loss = 0;            // sum over MoE layers of the load-balancing loss
  double z_loss = 0;              // sum over MoE layers of the router z-loss
  double total = 0;               // loss + aux_coef * aux_loss + z_coef * z_loss
  std::vector<nn::MoEStats> moe;  // one per MoE layer, in layer order
  // forward_backward with recomputation, and evaluate: the most bytes the caller's activation
  // arena and the scratch held together (0 without recomputation; the caller's arena alone tells
  // the rest). evaluate's leaves out what the MoE layers' expert blocks hold in their own scratch
  // when a batch has more tokens than a block.
  size_t activation_peak_bytes = 0;
};

// Called during backward with parameters whose gradients are final for this step (a block's,
// as soon as its backward is done; the embeddings, final norm and head last): the trainer starts
// reducing them while backward goes on.
using GradsReady = std::function<void(std::span<Param* const>)>;

// A loss on the logits that replaces the built-in cross-entropy of forward_backward (knowledge
// distillation). Called once per batch with its ids [B,T] i32, the targets flattened to [N] i32
// (negative = ignored), the logits [N,V] f32 and dlogits [N,V] f32 (allocated, contents
// undefined); returns the loss (a mean over predicted tokens, what ForwardStats::loss reports) and
// must write every element of dlogits with d(loss)/d(logits). Backward starts from there.
using LogitsLoss = std::function<double(const Tensor& ids, const Tensor& targets,
                                        const Tensor& logits, Tensor& dlogits)>;

// Parameters materialised around their use (--zero 3, parallel::DenseShards): gather(g) before
// group g's parameters are read, release(g) after; g is a block's index, or -1 for the embeddings,
// final norm and head (gathered from the start of forward to the end of backward). A block is
// gathered for its forward and again for its backward (recomputation included); `backward` says
// which (backward accumulates into the group's gradients between the two calls).
struct ParamHooks {
  std::function<void(int64_t group, bool backward)> gather, release;
};

// How a training pass runs beyond its batch: gradient accumulation and activation recomputation.
struct TrainPass {
  GradsReady grads_ready;  // may be empty
  LogitsLoss loss;         // empty: the cross-entropy
  // The gradients accumulated are those of loss_scale x (the pass's loss + aux_coef x aux_loss +
  // z_coef x z_loss): 1/N for each of the N equal micro-batches of a step, so that their sum is
  // the gradient of the step's mean loss. ForwardStats report the unscaled values.
  float loss_scale = 1.0f;
  // What backward recomputes instead of keeping (moe/nn/recompute.h). The parameters' gradients
  // are bitwise those of Recompute::none; under data or expert parallelism `block` runs the
  // block's collectives (load all-reduce, expert all-to-all) again in backward, `moe` none.
  nn::Recompute recompute = nn::Recompute::none;
  ParamHooks params;  // both empty: every parameter is always resident
};

// Called around each block of a forward pass with the block's index (expert offload: make the
// block's experts resident before, release them after). Either may be empty.
struct BlockHooks {
  std::function<void(int64_t block)> before, after;
};

// Options of an evaluation forward pass.
struct EvalOptions {
  Tensor* row_nll = nullptr;       // receives [B*T] per-token NLL when non-null
  bool capture_routing = false;    // fill ForwardStats::moe[i].choices / gates (traces)
  bool router_input_sums = false;  // centred routers: fill ForwardStats::moe[i].input_sum
  const BlockHooks* hooks = nullptr;
  // Run only the first `blocks` blocks (0: all): no head, no loss (ForwardStats::loss 0), the
  // statistics of the MoE layers among them (router-centre calibration: layer by layer).
  int64_t blocks = 0;
  // Rows of logits made at once (0: 64 MiB of them, at least 256 rows): the LM head and the loss
  // run on blocks of rows, so activation memory does not grow with N x V.
  int64_t logit_block_rows = 0;
  // Tokens the MoE layers' experts run on at once (0: 256 MiB of their rows; RouterStep).
  int64_t expert_block_tokens = 0;
  // When set, sees each block of logits as it is made: rows [first, first + logits.dim(0)) of the
  // flattened [B*T] positions, logits [rows, V] f32 on the model's device, valid only during the
  // call (per-token log-probabilities, ranks and top-n without holding [N, V]).
  std::function<void(const Tensor& logits, int64_t first)> logit_rows = nullptr;
};

// Key/value caches of incremental forward passes (generation, Transformer::forward_cached): per
// block K and V [slots, capacity, KV*hd] fp32 (keys after RoPE), or for latent attention (MLA)
// the latent [slots, capacity, kv_lora_rank + qk_rope] (nn::AttentionCache), and the tokens each
// slot holds.
// A slot holds one sequence; clear() (or setting a slot's length to 0) starts it over: positions
// at or past a slot's length are never read. Make it outside an ArenaScope that is reset while
// the cache lives (its tensors would come from the arena).
struct KVCache {
  std::vector<nn::AttentionCache> blocks;
  std::vector<int64_t> length;  // per slot: positions 0..length-1 are cached
  int64_t slots() const { return static_cast<int64_t>(length.size()); }
  int64_t capacity() const { return blocks.empty() ? 0 : blocks.front().capacity(); }
  // What one more position of one slot costs, every block together.
  int64_t bytes_per_token() const {
    int64_t bytes = 0;
    for (const nn::AttentionCache& block : blocks) bytes += block.bytes_per_token();
    return bytes;
  }
  void clear() { length.assign(length.size(), 0); }
};

class Transformer {
 public:
  // Parameters are created in `params` (seeded by its seed, stored in its dtype). parallel: the
  // layout over ranks (moe/nn/parallel.h), null for one process; it must outlive the model, and
  // with it forward passes are collective over its groups. Expert parameters then hold this rank's
  // experts and a sharded token table its columns (ParamShard), with the single-process values.
  // A sharded embedding needs an untied head (mixtral): the tied head would need the whole table.
  Transformer(const ModelConfig& config, ParamSet& params, const nn::Parallel* parallel = nullptr);

  // Forward and backward of one batch; accumulates gradients into the ParamSet. ids/targets [B,T]
  // i32. grads_ready (optional) sees every parameter exactly once, in backward order.
  ForwardStats forward_backward(const Tensor& ids, const Tensor& targets,
                                const nn::RouterStep& step, const GradsReady& grads_ready = {});
  // The same with `loss` in place of the cross-entropy (an empty loss: the cross-entropy).
  // ForwardStats::loss is then loss's value; the aux and z losses are added as usual.
  ForwardStats forward_backward(const Tensor& ids, const Tensor& targets,
                                const nn::RouterStep& step, const GradsReady& grads_ready,
                                const LogitsLoss& loss);
  // The same under `pass` (ForwardStats::activation_peak_bytes reports recomputation's memory).
  ForwardStats forward_backward(const Tensor& ids, const Tensor& targets,
                                const nn::RouterStep& step, const TrainPass& pass);
  // Forward only (no jitter, nothing saved). When row_nll is non-null it receives [B*T] per-token
  // NLL.
  ForwardStats evaluate(const Tensor& ids, const Tensor& targets, Tensor* row_nll = nullptr) const;
  ForwardStats evaluate(const Tensor& ids, const Tensor& targets, const EvalOptions& options) const;
  // Logits [B*T, V] for ids [B,T].
  Tensor logits(const Tensor& ids) const;

  // Incremental (cached) forward for generation, nothing saved, no jitter. A ragged batch of R
  // rows: ids [N] i32 (or any shape of N elements) holds row r's counts[r] >= 1 new tokens, rows
  // in order; row r continues cache slot slots[r] (distinct) at its positions
  // cache.length[slot] .. + counts[r] - 1, which must stay below config().seq and the cache's
  // capacity; the slot's length then grows by counts[r]. Returns the logits [R, V] of each row's
  // last new token: what logits() gives at that position of the whole sequence (bitwise for a
  // single row's prefill; otherwise up to how BLAS blocks the rows of a GEMM). The MoE layers
  // see exactly the N new tokens. hooks (may be null) are called around every block.
  Tensor forward_cached(const Tensor& ids, const std::vector<int64_t>& counts,
                        const std::vector<int64_t>& slots, KVCache& cache,
                        const BlockHooks* hooks = nullptr) const;
  // ids [B, t]: row b continues slot b.
  Tensor forward_cached(const Tensor& ids, KVCache& cache, const BlockHooks* hooks = nullptr) const;
  // Empty caches for `slots` sequences of up to `capacity` tokens (0: config().seq; at most that).
  KVCache make_cache(int64_t slots, int64_t capacity = 0) const;

  const ModelConfig& config() const { return config_; }
  // Where the parameters live; batches passed to forward/evaluate must be there too.
  Device device() const { return params_.device(); }
  const Flavour& flavour() const { return flavour_; }
  // Parameters that one token activates (experts counted k times per MoE layer).
  int64_t active_params_per_token() const;
  // Parameters of the whole model, those other ranks hold included.
  int64_t num_params() const;

 private:
  Tensor embed(const Tensor& ids, int64_t batch, int64_t seq,
               nn::ShardedEmbedding::Saved* sharded_saved) const;
  Tensor head(const Tensor& h) const;
  // The mean cross-entropy of the LM head on final hidden rows h [N, D] against targets [N] (each
  // row's into row_nll when given), the logits made at most `block` rows at a time (0: the
  // default of EvalOptions::logit_block_rows) in the scratch: [rows, V] at once, never [N, V].
  // The mean as ops::cross_entropy takes it.
  double loss_by_rows(const Tensor& h, const Tensor& targets, Tensor* row_nll, int64_t block,
                      const std::function<void(const Tensor&, int64_t)>& logit_rows = {}) const;
  // Embedding and blocks (the first `blocks` of them; <= 0: all); MoE statistics go into stats,
  // activations into saved when non-null.
  Tensor forward_blocks(const Tensor& ids, const Tensor& targets, const nn::RouterStep& step,
                        std::vector<nn::Block::Saved>* saved,
                        nn::ShardedEmbedding::Saved* sharded_saved, ForwardStats& stats,
                        const BlockHooks* hooks = nullptr,
                        std::vector<Tensor>* block_inputs = nullptr, int64_t blocks = 0) const;
  void finish_stats(ForwardStats& stats) const;

  ModelConfig config_;
  Flavour flavour_;
  ParamSet& params_;
  std::unique_ptr<nn::Embedding> tokens_, positions_;
  std::unique_ptr<nn::ShardedEmbedding> sharded_tokens_;  // instead of tokens_ when sharded
  std::vector<std::vector<Param*>> block_params_;         // per block, in creation order
  std::vector<Param*> outer_params_;                      // embeddings, final norm, head
  std::vector<std::unique_ptr<nn::Block>> blocks_;
  std::unique_ptr<nn::Norm> final_norm_;
  Param* head_ = nullptr;  // [V, D]: the token table when tied
  // Recomputed activations of forward_backward, and in inference each block's activations and
  // each block of logits (mutable: forward_blocks and evaluate are const).
  mutable nn::Scratch scratch_;
};

// Rows of logits a block when EvalOptions::logit_block_rows is 0: 16 Mi floats (64 MiB) of them,
// at least 256 rows (V 50,304: 333 rows). models/memory's estimate cuts its blocks the same.
int64_t default_logit_block_rows(int64_t vocab);

// The block index of the first "blocks.<n>." in a parameter name (also inside an optimizer
// tensor's name, "adam.m.blocks.3.attn.wq"), else -1: where a tensor sits in the model.
int64_t block_of_name(const std::string& name);

}  // namespace moe
