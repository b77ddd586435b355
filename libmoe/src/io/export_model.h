// What the exporters to other formats share (export_hf: Hugging Face safetensors; export_gguf:
// llama.cpp): the checks that a checkpoint is a model those formats can hold, and its parameters
// by name, each taken once with its shape checked, so that a parameter no output tensor took is
// refused by name rather than silently dropped. Private to libmoe (io/hf_export.cpp,
// io/gguf_write.cpp).
// Shape letters: E experts of a layer.
#pragma once
#include <map>
#include <set>
#include <string>

#include "moe/io/checkpoint.h"
#include "moe/models/config.h"

namespace moe::io {

class ExportModel {
 public:
  // Checks that `ckpt` is a whole checkpoint (not a rank's shard, no sharded parameter) of one of
  // the RoPE families (mixtral, qwen2_moe, qwen3_moe, olmoe with softmax routing, experts in every
  // layer; glm4_moe with sigmoid routing, dense layers first; deepseek_v3 as glm4_moe, or with
  // DeepSeek-V2's softmax routing; gpt_oss with softmax routing, experts in every layer), the
  // same number E in each MoE layer, and no PR-MoE. `who` prefixes every message
  // ("Hugging Face export"), `target` names the output's model in them ("HF Mixtral", "llama.cpp's
  // qwen2moe").
  ExportModel(const Checkpoint& ckpt, const std::string& who, const std::string& target);

  const ModelConfig& config() const { return mc_; }
  int64_t experts() const { return experts_; }  // of each MoE layer
  // The parameter `name`, which must have `shape`; marks it used.
  const NamedTensor& param(const std::string& name, const Shape& shape);
  // The router weight [E, D] of the MoE block whose names start with `block` ("blocks.3."): with a
  // center (a centred router, ModelConfig::router_center_rate) the weight its logits use,
  // nn::center_router_weight(W, c), in W's dtype; marks both used. Exports write it as a plain
  // router, and record the model with router_center_rate 0 (recorded_config).
  const NamedTensor& router_weight(const std::string& block, int64_t experts, int64_t d_model);
  // The model config an export records: config() as the files hold it (no centring).
  ModelConfig recorded_config() const;
  // Throws naming the first parameter no call to param() took.
  void refuse_unused() const;

 private:
  void check_layers();
  std::string who_, target_;
  ModelConfig mc_;
  int64_t experts_ = 0;
  std::map<std::string, const NamedTensor*> params_;
  std::set<std::string> used_;
  std::map<std::string, NamedTensor> folded_;  // router weights with their center folded in
};

}  // namespace moe::io
