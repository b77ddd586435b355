// YaRN RoPE in double precision, written from the YaRN paper (Peng et al. 2023) and transformers'
// _compute_yarn_parameters / yarn_apply_mscale, never from our kernels: the per-pair inverse
// frequency, the gain on cos and sin, and DeepSeek's softmax factor. factor 0: no YaRN.
//   C(b) = d ln(original / (2 pi b)) / (2 ln theta)   (the pair that turns b times in `original`)
//   lo = max(floor(C(beta_fast)), 0), hi = min(ceil(C(beta_slow)), d - 1)  (no floor / ceil
//        when truncate is false, as gpt-oss sets); hi += 0.001 when lo == hi
//   inv_freq_i = theta^(-2i/d) (1 - r_i) + theta^(-2i/d) / factor r_i,
//   r_i = clamp((i - lo) / (hi - lo), 0, 1)
//   gain = m(mscale) / m(mscale_all_dim) with both set, else m(1); m(x) = 0.1 x ln(factor) + 1
//   score factor (DeepSeek-V2/V3 only) = m(mscale_all_dim)^2 with mscale_all_dim set, else 1
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace moe::test {

struct YarnRef {
  double factor = 0, original = 0, beta_fast = 32, beta_slow = 1, mscale = 0, mscale_all_dim = 0;
  bool truncate = true;
  bool on() const { return factor > 0; }
  double m(double x) const { return factor <= 1 ? 1.0 : 0.1 * x * std::log(factor) + 1.0; }
  double inv_freq(int64_t i, int64_t d, double theta) const {
    const double trained = std::pow(theta, -double(2 * i) / double(d));
    if (!on()) return trained;
    auto pair_of = [&](double beta) {
      return double(d) * std::log(original / (beta * 2.0 * 3.141592653589793)) /
             (2.0 * std::log(theta));
    };
    double lo = pair_of(beta_fast), hi = pair_of(beta_slow);
    if (truncate) lo = std::floor(lo), hi = std::ceil(hi);
    lo = std::max(lo, 0.0), hi = std::min(hi, double(d - 1));
    if (lo == hi) hi += 0.001;
    const double r = std::clamp((double(i) - lo) / (hi - lo), 0.0, 1.0);
    return trained * (1.0 - r) + trained / factor * r;
  }
  double rope_gain() const {
    if (!on()) return 1.0;
    return mscale > 0 && mscale_all_dim > 0 ? m(mscale) / m(mscale_all_dim) : m(1.0);
  }
  double score_gain() const {
    return on() && mscale_all_dim > 0 ? m(mscale_all_dim) * m(mscale_all_dim) : 1.0;
  }
};

}  // namespace moe::test
