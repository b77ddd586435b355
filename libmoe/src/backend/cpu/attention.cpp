// Causal scaled-dot-product attention with grouped-query heads, forward and backward.
// Shapes: q, ctx [B*T, H*hd]; k, v [B*T, KV*hd]; probs [B, H, T, T]; query head h reads kv head
// h / (H/KV). The per (batch, head) products go to BLAS as one batch (cpu::sgemm_batch: tiles
// fixed by the shape, one parallel loop over all heads' tiles); the causal row softmax and its
// backward (kernels/attention.h, shared with CUDA) run in one OpenMP loop over all B*H*T rows.
// Scores above the diagonal are computed by the GEMM and then overwritten with exact zeros.
#include "kernels/attention.h"

#include <cmath>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/parallel.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#ifdef MOE_HAVE_CUDA
#include "backend/cuda/dense_ops.h"
#endif

namespace moe::ops {

namespace {

// One product per (batch, head), as one batch: `shape` holds what the products share (transposes,
// sizes, scalars, leading dimensions); operands(b, h, problem) sets its a, b and c.
template <class Fn>
void per_head_batch(int64_t batch, int64_t heads, const cpu::GemmProblem& shape, Fn&& operands) {
  std::vector<cpu::GemmProblem> problems(static_cast<size_t>(batch * heads), shape);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      operands(b, h, problems[static_cast<size_t>(b * heads + h)]);
  cpu::sgemm_batch(problems.data(), problems.size());
}

void check_attention(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                     const AttentionShape& s) {
  MOE_CHECK(s.batch >= 0 && s.seq >= 0 && s.heads > 0 && s.kv_heads > 0 && s.head_dim > 0 &&
                s.heads % s.kv_heads == 0,
            op, ": bad shape: batch ", s.batch, ", seq ", s.seq, ", heads ", s.heads, ", kv_heads ",
            s.kv_heads, ", head_dim ", s.head_dim);
  const int64_t n = s.batch * s.seq;
  q.expect_shape({n, s.heads * s.head_dim}, op);
  k.expect_shape({n, s.kv_heads * s.head_dim}, op);
  v.expect_shape({n, s.kv_heads * s.head_dim}, op);
  q.expect_dtype(DType::f32, op);
  k.expect_dtype(DType::f32, op);
  v.expect_dtype(DType::f32, op);
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionShape& s,
                       Tensor& probs, Tensor& ctx) {
  [[maybe_unused]] const Device device =
      require_backend("attention_forward", {&q, &k, &v, &probs, &ctx});
  check_attention("attention_forward", q, k, v, s);
  probs.expect_shape({s.batch, s.heads, s.seq, s.seq}, "attention_forward probs");
  probs.expect_dtype(DType::f32, "attention_forward probs");
  ctx.expect_shape(q.shape(), "attention_forward context");
  ctx.expect_dtype(DType::f32, "attention_forward context");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::attention_forward(q, k, v, s, probs, ctx);
#endif
  const int64_t T = s.seq, hd = s.head_dim, H = s.heads, KV = s.kv_heads, group = H / KV;
  const int64_t ldq = H * hd, ldk = KV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qs = q.data<float>();
  const float* ks = k.data<float>();
  const float* vs = v.data<float>();
  float* ps = probs.data<float>();
  float* cs = ctx.data<float>();

  per_head_batch(
      s.batch, H,
      cpu::GemmProblem{false, true, T, T, hd, scale, nullptr, ldq, nullptr, ldk, 0.0f, nullptr, T},
      [&](int64_t b, int64_t h, cpu::GemmProblem& p) {
        p.a = qs + b * T * ldq + h * hd;
        p.b = ks + b * T * ldk + (h / group) * hd;
        p.c = ps + (b * H + h) * T * T;
      });
  const int64_t rows = s.batch * H * T;
#pragma omp parallel for schedule(static) if (rows * T >= cpu::kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    kernels::causal_softmax_row(ps + r * T, r % T + 1, T);  // query r % T sees keys 0..r % T
  }
  per_head_batch(
      s.batch, H,
      cpu::GemmProblem{false, false, T, hd, T, 1.0f, nullptr, T, nullptr, ldk, 0.0f, nullptr, ldq},
      [&](int64_t b, int64_t h, cpu::GemmProblem& p) {
        p.a = ps + (b * H + h) * T * T;
        p.b = vs + b * T * ldk + (h / group) * hd;
        p.c = cs + b * T * ldq + h * hd;
      });
}

int64_t CachedRows::tokens() const {
  int64_t n = 0;
  for (int64_t c : count) n += c;
  return n;
}

void CachedRows::check(int64_t slots, int64_t capacity, const char* what) const {
  const size_t r = count.size();
  MOE_CHECK(slot.size() == r && start.size() == r, what, ": ", r, " counts, ", slot.size(),
            " slots and ", start.size(), " starts");
  std::vector<bool> used(static_cast<size_t>(slots > 0 ? slots : 0), false);
  for (size_t i = 0; i < r; ++i) {
    MOE_CHECK(count[i] >= 1 && start[i] >= 0 && slot[i] >= 0 && slot[i] < slots, what, ": row ", i,
              " has count ", count[i], ", start ", start[i], ", slot ", slot[i], " (of ", slots,
              ")");
    MOE_CHECK(!used[static_cast<size_t>(slot[i])], what, ": slot ", slot[i], " appears twice");
    used[static_cast<size_t>(slot[i])] = true;
    MOE_CHECK(start[i] + count[i] <= capacity, what, ": row ", i, " reaches position ",
              start[i] + count[i], ", beyond the cache's ", capacity);
  }
}

void attention_forward_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              int64_t heads, int64_t kv_heads, const CachedRows& rows,
                              Tensor& ctx) {
  const char* op = "attention_forward_cached";
  [[maybe_unused]] const Device device = require_backend(op, {&q, &k_cache, &v_cache, &ctx});
  MOE_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && k_cache.ndim() == 3 &&
                q.ndim() == 2 && q.dim(1) % heads == 0,
            op, ": bad shape: q ", q.describe(), ", k cache ", k_cache.describe(), ", heads ",
            heads, ", kv_heads ", kv_heads);
  const int64_t H = heads, KV = kv_heads, group = H / KV, hd = q.dim(1) / H;
  const int64_t slots = k_cache.dim(0), capacity = k_cache.dim(1);
  const int64_t ldq = H * hd, ldk = KV * hd;
  rows.check(slots, capacity, op);
  q.expect_shape({rows.tokens(), ldq}, op);
  k_cache.expect_shape({slots, capacity, ldk}, "attention_forward_cached k cache");
  v_cache.expect_shape({slots, capacity, ldk}, "attention_forward_cached v cache");
  ctx.expect_shape(q.shape(), "attention_forward_cached context");
  for (const Tensor* t : {&q, &k_cache, &v_cache, static_cast<const Tensor*>(&ctx)})
    t->expect_dtype(DType::f32, op);
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda)
    return cuda::attention_forward_cached(q, k_cache, v_cache, heads, kv_heads, rows, ctx);
#endif
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qs = q.data<float>();
  const float* ks = k_cache.data<float>();
  const float* vs = v_cache.data<float>();
  float* cs = ctx.data<float>();

  // Each (row, head) is independent: one OpenMP loop over them, each with its own scores buffer
  // (the products inside run on the calling thread; their bits do not depend on which one).
  const int64_t n_rows = rows.rows();
  std::vector<int64_t> first(static_cast<size_t>(n_rows) + 1, 0);  // a row's first token in q/ctx
  int64_t work = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    first[r + 1] = first[r] + rows.count[r];
    work += rows.count[r] * (rows.start[r] + rows.count[r]) * hd * H;
  }
#pragma omp parallel if (n_rows * H > 1 && work >= cpu::kParallelWork)
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 1)
    for (int64_t rh = 0; rh < n_rows * H; ++rh) {
      const int64_t r = rh / H, h = rh % H;
      const int64_t t = rows.count[r], start = rows.start[r], keys = start + t;
      const int64_t slot_offset = rows.slot[r] * capacity * ldk;
      scores.resize(static_cast<size_t>(t * keys));
      float* ps = scores.data();
      const int64_t q_offset = first[r] * ldq + h * hd, kv_offset = slot_offset + (h / group) * hd;
      cpu::sgemm(false, true, t, keys, hd, scale, qs + q_offset, ldq, ks + kv_offset, ldk, 0.0f, ps,
                 keys);
      for (int64_t i = 0; i < t; ++i)  // query i sits at start + i: keys 0..start+i visible
        kernels::causal_softmax_row(ps + i * keys, start + i + 1, keys);
      cpu::sgemm(false, false, t, hd, keys, 1.0f, ps, keys, vs + kv_offset, ldk, 0.0f,
                 cs + q_offset, ldq);
    }
  }
}

void attention_backward(const Tensor& dctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& probs, const AttentionShape& s, Tensor& dq, Tensor& dk,
                        Tensor& dv) {
  [[maybe_unused]] const Device device =
      require_backend("attention_backward", {&dctx, &q, &k, &v, &probs, &dq, &dk, &dv});
  check_attention("attention_backward", q, k, v, s);
  dctx.expect_shape(q.shape(), "attention_backward dctx");
  dctx.expect_dtype(DType::f32, "attention_backward dctx");
  probs.expect_shape({s.batch, s.heads, s.seq, s.seq}, "attention_backward probs");
  probs.expect_dtype(DType::f32, "attention_backward probs");
  dq.expect_shape(q.shape(), "attention_backward dq");
  dk.expect_shape(k.shape(), "attention_backward dk");
  dv.expect_shape(v.shape(), "attention_backward dv");
  dq.expect_dtype(DType::f32, "attention_backward dq");
  dk.expect_dtype(DType::f32, "attention_backward dk");
  dv.expect_dtype(DType::f32, "attention_backward dv");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda)
    return cuda::attention_backward(dctx, q, k, v, probs, s, dq, dk, dv);
#endif
  const int64_t T = s.seq, hd = s.head_dim, H = s.heads, KV = s.kv_heads, group = H / KV;
  const int64_t ldq = H * hd, ldk = KV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* gs = dctx.data<float>();
  const float* qs = q.data<float>();
  const float* ks = k.data<float>();
  const float* vs = v.data<float>();
  const float* ps = probs.data<float>();
  float* dqs = dq.data<float>();
  float* dks = dk.data<float>();
  float* dvs = dv.data<float>();

  // dS = scale * softmax_backward(P, dctx V^T), causal part only.
  Tensor dscores = Tensor::empty({s.batch, H, T, T});
  float* ds = dscores.data<float>();
  per_head_batch(
      s.batch, H,
      cpu::GemmProblem{false, true, T, T, hd, 1.0f, nullptr, ldq, nullptr, ldk, 0.0f, nullptr, T},
      [&](int64_t b, int64_t h, cpu::GemmProblem& p) {
        p.a = gs + b * T * ldq + h * hd;
        p.b = vs + b * T * ldk + (h / group) * hd;
        p.c = ds + (b * H + h) * T * T;
      });
  const int64_t rows = s.batch * H * T;
#pragma omp parallel for schedule(static) if (rows * T >= cpu::kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    kernels::causal_softmax_backward_row(ps + r * T, ds + r * T, r % T + 1, T, scale);
  }
  per_head_batch(
      s.batch, H,
      cpu::GemmProblem{false, false, T, hd, T, 1.0f, nullptr, T, nullptr, ldk, 0.0f, nullptr, ldq},
      [&](int64_t b, int64_t h, cpu::GemmProblem& p) {
        p.a = ds + (b * H + h) * T * T;
        p.b = ks + b * T * ldk + (h / group) * hd;
        p.c = dqs + b * T * ldq + h * hd;
      });
  // The query heads of a group all add into their kv head's dk and dv: the first writes, the
  // others add in head order, one batch (over batch x kv heads) per position in the group.
  for (int64_t g = 0; g < group; ++g) {
    const float beta = g == 0 ? 0.0f : 1.0f;
    std::vector<cpu::GemmProblem> problems;
    problems.reserve(static_cast<size_t>(2 * s.batch * KV));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t kv = 0; kv < KV; ++kv) {
        const int64_t h = kv * group + g;
        const int64_t kv_offset = b * T * ldk + kv * hd, q_offset = b * T * ldq + h * hd;
        problems.push_back({true, false, T, hd, T, 1.0f, ds + (b * H + h) * T * T, T, qs + q_offset,
                            ldq, beta, dks + kv_offset, ldk});
        problems.push_back({true, false, T, hd, T, 1.0f, ps + (b * H + h) * T * T, T, gs + q_offset,
                            ldq, beta, dvs + kv_offset, ldk});
      }
    cpu::sgemm_batch(problems.data(), problems.size());
  }
}

}  // namespace moe::ops
