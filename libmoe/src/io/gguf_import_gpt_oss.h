// GGUF import of llama.cpp's "gpt-oss" (OpenAI gpt-oss-20b / -120b) as our gpt_oss: the keys only
// gpt-oss has and what its graph fixes (the inverse of io/gguf_gpt_oss.cpp). Its tensors are
// io/gguf_import.cpp's table with the o bias, the sinks, the router bias and the experts' biases
// (Flavour::bias, sinks, router_logit_bias). Private to libmoe.
#pragma once
#include "io/gguf_keys.h"
#include "moe/models/config.h"

namespace moe::io::gguf {

// The window (attention.sliding_window, on the even layers as llama.cpp's graph slides them; a
// sliding_window_pattern other than that refused by name), YaRN's betas, the clamped SwiGLU's
// constants llama.cpp fixes (alpha 1.702, limit 7) and experts in every layer. YaRN's range is
// truncated, as llama.cpp runs it (ModelConfig's default).
void gpt_oss_config(const Keys& k, ModelConfig& mc);

}  // namespace moe::io::gguf
