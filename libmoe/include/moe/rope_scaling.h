// What RoPE's frequencies are beyond theta: a value type the ops take and every backend reads (in
// core, beside op_types.h, so that the op table and the backends share it without including the
// op layer). The per-pair math is kernels::rope_inv_freq, single-source for CPU and CUDA.
#pragma once
#include <cstdint>

namespace moe::ops {

// YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models";
// transformers' rope_type "yarn"): pair i of a head's rd rotated features turns at
//   inv_freq_i = theta^(-2i/rd) (1 - r_i) + theta^(-2i/rd) / factor * r_i,
//   r_i = clamp((i - ramp_low) / ramp_width, 0, 1)
// (pairs below ramp_low keep their trained frequency, pairs past ramp_low + ramp_width are
// interpolated by `factor`, a linear ramp between), and cos and sin are multiplied by
// attention_factor. ops::yarn_scaling computes these from a model's YaRN settings.
// The default (factor 1, attention_factor 1) is plain RoPE, computed exactly as before YaRN
// existed (the kernels take the plain branch: the same bits).
struct RopeScaling {
  float factor = 1.0f;
  float ramp_low = 0.0f, ramp_width = 1.0f;  // in pairs; ramp_width > 0
  float attention_factor = 1.0f;
  bool plain() const { return factor == 1.0f && attention_factor == 1.0f; }
  bool operator==(const RopeScaling& o) const {
    return factor == o.factor && ramp_low == o.ramp_low && ramp_width == o.ramp_width &&
           attention_factor == o.attention_factor;
  }
};

// YaRN's settings as a Hugging Face config names them (rope_type "yarn"); ops::yarn_scaling
// (moe/ops/dense.h) turns them into a RoPE's RopeScaling. 0 means absent for original_ctx (then
// required), mscale, mscale_all_dim and attention_factor (derived).
struct YarnSettings {
  double factor = 1;
  double original_ctx = 0;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 0, mscale_all_dim = 0, attention_factor = 0;
  bool truncate = true;
};

}  // namespace moe::ops
