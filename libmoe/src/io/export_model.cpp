// The checks export_hf and export_gguf share (see io/export_model.h).
#include "io/export_model.h"

#include "moe/error.h"
#include "moe/nn/router.h"

namespace moe::io {

ExportModel::ExportModel(const Checkpoint& ckpt, const std::string& who, const std::string& target)
    : who_(who), target_(target), mc_(model_config_from_json(ckpt.model_config)) {
  if (mc_.arch == Arch::gpt)
    throw Error(str(who,
                    ": only the mixtral flavour and the families built on it (qwen2_moe, "
                    "qwen3_moe, olmoe, glm4_moe, deepseek_v3, gpt_oss) have a form "
                    "there (this model is gpt: learned positions, LayerNorm, GELU)"));
  if (ckpt.sharding.rank >= 0)
    throw Error(str(who, ": this is rank ", ckpt.sharding.rank,
                    "'s shard of a sharded checkpoint; merge "
                    "it first"));
  check_layers();
  if (mc_.residual_moe) throw Error(str(who, ": residual MoE (PR-MoE) has no ", target, " form"));
  // GLM-4-MoE's router (DeepSeek-V3's): sigmoid scores with a selection bias; the others softmax.
  const bool glm = mc_.arch == Arch::glm4_moe || mc_.arch == Arch::deepseek_v3;
  // DeepSeek-V2's router: a softmax over the experts (deepseek_v3 with softmax scoring).
  const bool v2 = mc_.arch == Arch::deepseek_v3 && mc_.router_scoring == nn::RouterScoring::softmax;
  // Qwen's dense_ff is HF intermediate_size, the width of dense layers these files can name
  // (mlp_only_layers) though every layer here has experts (check_layers).
  const bool qwen = mc_.arch == Arch::qwen2_moe || mc_.arch == Arch::qwen3_moe;
  if (!glm && mc_.router_scoring != nn::RouterScoring::softmax)
    throw Error(str(who, ": ", target,
                    " routes by a softmax over the experts; this model's "
                    "router scores with a sigmoid (router_scoring ",
                    router_scoring_name(mc_.router_scoring), ")"));
  if (glm && !v2 && mc_.router_scoring != nn::RouterScoring::sigmoid)
    throw Error(str(who, ": ", target, " scores experts with a sigmoid; this model's router uses ",
                    router_scoring_name(mc_.router_scoring)));
  const char* glm_only = mc_.rope_dim != 0            ? "partial RoPE (rope_dim)"
                         : mc_.dense_ff != 0 && !qwen ? "dense layers of their own width (dense_ff)"
                         : mc_.router_groups != 1     ? "group-limited routing (router_groups)"
                         : mc_.routed_scale != 1.0    ? "scaled gate weights (routed_scale)"
                         : mc_.qkv_bias || mc_.qk_norm ? "q/k/v biases or qk-norm options"
                                                       : nullptr;
  if (!glm && glm_only)
    throw Error(
        str(who, ": ", target, " has no ", glm_only, "; this model uses it (glm4_moe has)"));
  for (const NamedTensor& nt : ckpt.params) {
    if (nt.shard.defined())
      throw Error(str(who, ": parameter '", nt.name, "' is a shard; merge the checkpoint first"));
    params_[nt.name] = &nt;
  }
}

// Experts in every layer, the same number E in each; glm4_moe: dense layers first
// (first_k_dense_replace), then MoE layers of E experts each.
void ExportModel::check_layers() {
  const bool glm = mc_.arch == Arch::glm4_moe || mc_.arch == Arch::deepseek_v3;
  for (int64_t i = 0; i < mc_.layers; ++i) {
    const int64_t experts = mc_.experts_per_layer[static_cast<size_t>(i)];
    if (experts == 0 && !(glm && experts_ == 0))
      throw Error(str(who_, ": layer ", i, " is dense (no experts); ", target_,
                      glm ? " has dense layers only before the first MoE layer"
                          : " has experts in every layer"));
    if (experts > 0 && experts_ > 0 && experts != experts_)
      throw Error(str(who_, ": ", target_,
                      " has the same number of experts in every MoE layer; layer ", i, " has ",
                      experts, ", an earlier one ", experts_));
    if (experts > 0) experts_ = experts;
  }
  if (experts_ == 0) throw Error(str(who_, ": the model has no MoE layer; ", target_, " has"));
}

const NamedTensor& ExportModel::param(const std::string& name, const Shape& shape) {
  auto it = params_.find(name);
  if (it == params_.end()) throw Error(str(who_, ": the checkpoint has no parameter '", name, "'"));
  if (it->second->shape() != shape)
    throw Error(str(who_, ": parameter '", name, "' is ", shape_str(it->second->shape()),
                    ", expected ", shape_str(shape)));
  used_.insert(name);
  return *it->second;
}

const NamedTensor& ExportModel::router_weight(const std::string& block, int64_t experts,
                                              int64_t d_model) {
  const NamedTensor& w = param(block + "moe.router.weight", {experts, d_model});
  const std::string center = block + "moe.router.center";
  if (!params_.count(center)) return w;
  const NamedTensor& c = param(center, {d_model});
  NamedTensor& folded = folded_[w.name];
  folded = w;
  folded.tensor = nn::center_router_weight(w.whole(), c.whole());
  folded.source = nullptr;  // held now, whatever w was
  folded.deferred = nullptr;
  return folded;
}

ModelConfig ExportModel::recorded_config() const {
  ModelConfig c = mc_;
  c.router_center_rate = 0;
  // `experts` as the MoE layers hold them (a model trained with --experts-per-layer 0,4 keeps the
  // default 8 there), so that a reader checking the record against the file's expert count
  // (GGUF expert_count, HF num_experts) finds it agrees.
  c.experts = experts_;
  return c;
}

void ExportModel::refuse_unused() const {
  for (const auto& [name, nt] : params_)
    if (!used_.count(name))
      throw Error(str(who_, ": parameter '", name, "' has no place in ", target_));
}

}  // namespace moe::io
