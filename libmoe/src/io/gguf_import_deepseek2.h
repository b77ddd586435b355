// GGUF import of llama.cpp's "deepseek2" (DeepSeek-V2, V2-Lite, V3, R1, Kimi K2) as our
// deepseek_v3: the keys only deepseek2 has, and its latent-attention tensors back to our params
// (the inverse of io/gguf_deepseek2.cpp). The rest is io/gguf_import.cpp's, as for glm4moe.
// Private to libmoe.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/gguf_keys.h"
#include "moe/io/gguf_import.h"
#include "moe/models/config.h"

namespace moe::io::gguf {

// The latent attention's widths (q_lora_rank, kv_lora_rank, qk_nope / qk_rope / v head dims) from
// deepseek2's keys, checked against its absorbed attention's (one key/value head of kv_lora_rank +
// rope features).
void deepseek2_attention_config(const Keys& k, ModelConfig& mc);
// The routing, the leading dense layers, the shared experts and YaRN's log multiplier.
void deepseek2_config(const Keys& k, ModelConfig& mc);
// Block `i`'s latent-attention params, in nn::Mla's order, each with the file tensor it comes from.
void deepseek2_attention_tensors(const ModelConfig& mc, int64_t i,
                                 std::vector<GgufTensorPlan>& out);
// Our param from the file tensor's values (f32, the file's row-major order): its rows picked, or
// each head's [c, dn] transposed.
std::vector<float> deepseek2_values(const GgufTensorPlan& t, const std::vector<float>& file);
// Refuses those params' file tensors in a block type (they are read as floats).
void refuse_rearranged_blocks(const GgufFile& f, const std::vector<GgufTensorPlan>& plan);

}  // namespace moe::io::gguf
