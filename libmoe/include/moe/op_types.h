// Value types that ops take and every backend implements against: they live in core so that the
// op table (core/backend.h), the ops (moe/ops/*.h, which re-export them) and the backends share
// one definition without a backend including the op layer or nn/.
#pragma once
#include <cstdint>
#include <vector>

namespace moe {

// gelu: W2 gelu(W1 x + b1) + b2 (gpt);  swiglu: W2 (silu(W1 x) * W3 x) (mixtral);
// swiglu_clamped (gpt-oss): g = min(W1 x + b1, limit), u = clamp(W3 x + b3, -limit, limit),
// W2 ((u + 1) * g * sigmoid(alpha g)) + b2, with SwigluClamp's alpha and limit.
enum class Activation { gelu, swiglu, swiglu_clamped };

// Whether the activation gates a second projection (W3): swiglu and swiglu_clamped.
constexpr bool gated(Activation activation) { return activation != Activation::gelu; }

// The clamped SwiGLU's constants (gpt-oss's config.json: swiglu_alpha, swiglu_limit). Its gradient
// is zero where a clamp bites (W1 x + b1 > limit; |W3 x + b3| > limit) and passes at exactly
// +-limit, as torch's clamp / min do.
struct SwigluClamp {
  float alpha = 1.702f;
  float limit = 7.0f;
};

}  // namespace moe

namespace moe::ops {

// Causal self-attention shape: B batch, T sequence, H query heads, KV key/value heads, hd head dim.
// window: sliding-window attention, each query seeing the last `window` positions, itself
// included (kernels::window_first_key); 0 = every earlier position.
struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t window = 0;
};

// Incremental (cached) attention, for generation. A ragged batch of R rows: row r brings
// count[r] >= 1 new tokens, consecutive in q/ctx and in row order (N = sum of counts), which sit
// at positions start[r] .. start[r] + count[r] - 1 of cache slot slot[r] (distinct slots).
// window: as AttentionShape's (0 = none): a query at position p sees the cached positions
// max(0, p - window + 1) .. p.
struct CachedRows {
  std::vector<int64_t> slot, start, count;
  int64_t window = 0;
  int64_t rows() const { return static_cast<int64_t>(count.size()); }
  int64_t tokens() const;  // N
  // Throws moe::Error unless the three have one entry per row, counts >= 1, starts >= 0, slots in
  // [0, slots) and distinct, and start + count <= capacity.
  void check(int64_t slots, int64_t capacity, const char* what) const;
};

}  // namespace moe::ops
