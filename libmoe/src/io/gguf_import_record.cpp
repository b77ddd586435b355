// GGUF import: our export's model-config record against the file's keys (see
// io/gguf_import_record.h).
#include "io/gguf_import_record.h"

#include <algorithm>

#include "moe/error.h"

namespace moe::io::gguf {

namespace {

// Group-limited routing as the keys hold it: groups that all take part are one group.
std::pair<int64_t, int64_t> grouping(const ModelConfig& c) {
  if (c.router_groups > 1 && c.router_group_topk < c.router_groups)
    return {c.router_groups, c.router_group_topk};
  return {1, 1};
}

// glm4moe's keys and tensors beyond the others' (their sigmoid router carries its selection
// bias in the file: exp_probs_b).
// (The dense layers' width matters only where there are dense layers; experts_per_layer is
// compared in same_math.)
bool same_glm_math(const ModelConfig& a, const ModelConfig& b) {
  const bool dense = std::count(a.experts_per_layer.begin(), a.experts_per_layer.end(), 0) > 0;
  return (!dense || a.dense_ff_resolved() == b.dense_ff_resolved()) &&
         a.rope_dim_resolved() == b.rope_dim_resolved() && a.qkv_bias == b.qkv_bias &&
         a.qk_norm == b.qk_norm && grouping(a) == grouping(b) &&
         float(a.routed_scale) == float(b.routed_scale);
}

// The keys hold f32 eps and theta: a record agrees when its values round to
// them.
bool same_math(const ModelConfig& a, const ModelConfig& b) {
  const bool keyed = a.arch == Arch::glm4_moe || a.arch == Arch::deepseek_v3;
  if (keyed && !same_glm_math(a, b)) return false;
  // deepseek2's latent widths, and YaRN's mscale_all_dim as its f32 log multiplier holds it.
  if (a.arch == Arch::deepseek_v3 &&
      (a.q_lora_rank != b.q_lora_rank || a.kv_lora_rank != b.kv_lora_rank ||
       a.qk_nope_dim != b.qk_nope_dim || a.qk_rope_dim != b.qk_rope_dim ||
       a.v_head_dim != b.v_head_dim ||
       float(0.1 * a.yarn.mscale_all_dim) != float(0.1 * b.yarn.mscale_all_dim) ||
       a.yarn.mscale != a.yarn.mscale_all_dim || b.yarn.mscale != b.yarn.mscale_all_dim))
    return false;
  // A selection bias only where the file holds one (glm4moe's and deepseek2's exp_probs_b).
  const bool biased = keyed || (!a.router_selection_bias() && !b.router_selection_bias());
  return a.arch == b.arch && a.vocab_size == b.vocab_size && a.layers == b.layers &&
         a.d_model == b.d_model && a.heads == b.heads &&
         a.head_dim_resolved() == b.head_dim_resolved() &&
         a.kv_heads_resolved() == b.kv_heads_resolved() && a.d_ff == b.d_ff &&
         a.shared_expert_ff == b.shared_expert_ff && a.experts_per_layer == b.experts_per_layer &&
         a.experts == b.experts && a.top_k == b.top_k && a.normalize_topk == b.normalize_topk &&
         a.residual_moe == b.residual_moe && a.router_scoring == b.router_scoring && biased &&
         !a.router_center() && !b.router_center() && float(a.norm_eps) == float(b.norm_eps) &&
         float(a.rope_theta) == float(b.rope_theta) && a.tie_embeddings == b.tie_embeddings &&
         a.rope_type == b.rope_type && a.rope_scaling() == b.rope_scaling();
}

}  // namespace

void adopt_record(const Keys& k, ModelConfig& mc, GgufImportReport& rep) {
  if (k.has("moe.model_config")) {
    try {
      ModelConfig recorded =
          model_config_from_json(nlohmann::json::parse(k.text("moe.model_config")));
      recorded.resolve();
      if (same_math(recorded, mc)) {
        recorded.dtype = mc.dtype;
        mc = recorded;
        rep.notes.push_back("model config taken from the exporter's record (moe.model_config)");
      } else {
        rep.notes.push_back("moe.model_config disagrees with the file's keys: ignored");
      }
    } catch (const std::exception& e) {
      rep.notes.push_back(str("moe.model_config unreadable (", e.what(), "): ignored"));
    }
  }
  try {
    mc.resolve();
  } catch (const Error& e) {
    throw Error(str("'", k.path(), "': not a model we can build: ", e.what()));
  }
}

}  // namespace moe::io::gguf
