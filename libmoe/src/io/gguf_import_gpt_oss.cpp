// GGUF import of llama.cpp's gpt-oss (see io/gguf_import_gpt_oss.h).
#include "io/gguf_import_gpt_oss.h"

namespace moe::io::gguf {

void gpt_oss_config(const Keys& k, ModelConfig& mc) {
  const std::string a = "gpt-oss.";
  // llama.cpp's gpt-oss reads the pattern when present (every n-th layer full, n = 2: the odd
  // ones); its converter writes none, and its default is that one.
  const std::string pattern = a + "attention.sliding_window_pattern";
  if (k.has(pattern) && k.integer(pattern) != 2)
    k.fail(pattern, "sets other layers to slide than the even ones (0, 2, ...): not supported");
  const int64_t window = k.integer_or(a + "attention.sliding_window", 0);
  if (window < 0) k.fail(a + "attention.sliding_window", str("is ", window));
  mc.sliding_window = window > 0 && window < mc.seq ? window : 0;  // else nothing slides
  mc.window_layers.clear();
  for (int64_t i = 0; mc.sliding_window > 0 && i < mc.layers; i += 2) mc.window_layers.push_back(i);
  if (mc.rope_type == RopeType::yarn) {
    mc.yarn.beta_fast = k.real_or(a + "rope.scaling.yarn_beta_fast", 32.0);
    mc.yarn.beta_slow = k.real_or(a + "rope.scaling.yarn_beta_slow", 1.0);
    if (!(mc.yarn.beta_fast > 0 && mc.yarn.beta_slow > 0))
      k.fail(a + "rope.scaling.yarn_beta_fast", "or yarn_beta_slow is not > 0");
  }
  mc.swiglu_alpha = 1.702;  // llama.cpp's graph's constants (no key holds them)
  mc.swiglu_limit = 7.0;
  mc.experts_per_layer.assign(static_cast<size_t>(mc.layers), mc.experts);
}

}  // namespace moe::io::gguf
