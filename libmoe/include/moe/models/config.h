// The model's shape and numerics: everything needed to rebuild it from a checkpoint.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "moe/dtype.h"
#include "moe/nn/common.h"

namespace moe {

enum class Arch { gpt, mixtral };
Arch parse_arch(const std::string& name);  // UsageError naming the accepted values
const char* arch_name(Arch arch);

struct ModelConfig {
  Arch arch = Arch::gpt;
  int64_t vocab_size = 256;  // byte-level by default
  int64_t layers = 4;
  int64_t d_model = 128;
  int64_t heads = 4;
  int64_t kv_heads = 0;  // 0 = heads (no grouping); mixtral may use fewer
  int64_t d_ff = 512;    // hidden width of dense MLPs and of each expert
  int64_t seq = 128;     // context length (learned positions for gpt)
  int64_t experts = 8;   // experts per MoE layer unless experts_per_layer says otherwise
  std::vector<int64_t> experts_per_layer;  // resolved by resolve(): one entry per layer, 0 = dense
  int64_t moe_every = 2;                   // every K-th layer (layers K-1, 2K-1, ...) is MoE
  int64_t top_k = 2;
  double capacity_factor = 0;  // 0 = dropless
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0.001;
  bool residual_moe = false;    // PR-MoE: dense MLP + one (top-1) expert
  bool normalize_topk = false;  // renormalise top-k gate weights (mixtral default)
  double router_jitter = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000;
  DType dtype = DType::f32;  // parameter and activation storage

  int64_t kv_heads_resolved() const { return kv_heads ? kv_heads : heads; }
  bool is_moe_layer(int64_t layer) const { return experts_per_layer.at(layer) > 0; }
  int64_t num_moe_layers() const;
  // The block index of each MoE layer, in order (MoE layer l is block moe_blocks()[l]).
  std::vector<int64_t> moe_blocks() const;
  bool tied_embeddings() const { return arch == Arch::gpt; }

  // Fill experts_per_layer from experts/moe_every (or expand a per-MoE-layer list), then check
  // every constraint; throws UsageError with the flag names a user typed.
  void resolve();
  void validate() const;
};

nlohmann::json to_json(const ModelConfig& config);
ModelConfig model_config_from_json(const nlohmann::json& j);  // Error naming the missing/bad key

}  // namespace moe
