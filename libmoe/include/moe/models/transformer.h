// Decoder-only MoE transformer: token embedding (+ learned positions for gpt), blocks, final norm,
// LM head (tied for gpt), cross-entropy. Shapes: ids [B, T], N = B*T, V vocabulary, D width.
#pragma once
#include <memory>
#include <vector>

#include "moe/models/config.h"
#include "moe/models/flavour.h"
#include "moe/nn/block.h"
#include "moe/nn/embedding.h"
#include "moe/nn/norm.h"
#include "moe/param.h"

namespace moe {

struct ForwardStats {
  double loss = 0;                // mean cross-entropy over predicted tokens
  double aux_loss = 0;            // sum over MoE layers of the load-balancing loss
  double z_loss = 0;              // sum over MoE layers of the router z-loss
  double total = 0;               // loss + aux_coef * aux_loss + z_coef * z_loss
  std::vector<nn::MoEStats> moe;  // one per MoE layer, in layer order
};

class Transformer {
 public:
  // Parameters are created in `params` (seeded by its seed, stored in its dtype).
  Transformer(const ModelConfig& config, ParamSet& params);

  // Forward and backward of one batch; accumulates gradients into the ParamSet. ids/targets [B,T]
  // i32.
  ForwardStats forward_backward(const Tensor& ids, const Tensor& targets,
                                const nn::RouterStep& step);
  // Forward only (no jitter, nothing saved). When row_nll is non-null it receives [B*T] per-token
  // NLL.
  ForwardStats evaluate(const Tensor& ids, const Tensor& targets, Tensor* row_nll = nullptr) const;
  // Logits [B*T, V] for ids [B,T].
  Tensor logits(const Tensor& ids) const;

  const ModelConfig& config() const { return config_; }
  const Flavour& flavour() const { return flavour_; }
  // Parameters that one token activates (experts counted k times per MoE layer).
  int64_t active_params_per_token() const;

 private:
  Tensor embed(const Tensor& ids, int64_t batch, int64_t seq) const;
  Tensor head(const Tensor& h) const;
  // Embedding and blocks; MoE statistics go into stats, activations into saved when non-null.
  Tensor forward_blocks(const Tensor& ids, const Tensor& targets, const nn::RouterStep& step,
                        std::vector<nn::Block::Saved>* saved, ForwardStats& stats) const;
  void finish_stats(ForwardStats& stats) const;

  ModelConfig config_;
  Flavour flavour_;
  ParamSet& params_;
  std::unique_ptr<nn::Embedding> tokens_, positions_;
  std::vector<std::unique_ptr<nn::Block>> blocks_;
  std::unique_ptr<nn::Norm> final_norm_;
  Param* head_ = nullptr;  // [V, D]: the token table when tied
};

}  // namespace moe
