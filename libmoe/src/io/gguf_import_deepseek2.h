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
// Rows `rows` of `bytes` (rows of row_bytes bytes), in that order: the rows of a param picked
// from a tensor kept in blocks or Q8_0 rows (each row is quantised on its own: its bytes move
// whole). k_b (head_transpose) is never kept so: its blocks run along the file's rows of dn, ours
// are rows of c; it is dequantised (the block format's values) and stored as floats.
std::vector<uint8_t> pick_row_bytes(const std::vector<uint8_t>& bytes,
                                    const std::vector<int64_t>& rows, size_t row_bytes);
// A note for the report naming the k_b tensors dequantised from a block type, by type.
void note_dequantised(const GgufFile& f, const std::vector<GgufTensorPlan>& plan,
                      GgufImportReport& rep);

}  // namespace moe::io::gguf
