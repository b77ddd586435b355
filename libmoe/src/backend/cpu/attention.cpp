// Causal scaled-dot-product attention with grouped-query heads, forward and backward.
// Shapes: q, ctx [B*T, H*hd]; k, v [B*T, KV*hd]; probs [B, H, T, T]; query head h reads kv head
// h / (H/KV). The per (batch, head) products go to BLAS as one batch (sgemm_batch: tiles
// fixed by the shape, one parallel loop over all heads' tiles); the causal row softmax and its
// backward (kernels/attention.h, shared with CUDA; the CPU runs them at its widest vector copy,
// activation_rows.h, with the same bits) run in one OpenMP loop over all B*H*T rows.
// Each product is cut into blocks of query rows (push_causal) that skip what lies wholly above
// the diagonal; scores above it inside a block are computed and then overwritten with exact
// zeros, as the softmax writes zeros past the visible keys.
// Attention sinks (gpt-oss; ops/dense.h): a row of head h with sinks runs
// kernels::causal_softmax_sink_row itself (the body a GPU thread runs, not a vector copy), and the
// backward takes each row's sink term (kernels::sink_gradient_row) before the row's backward.
#include "kernels/attention.h"

#include <cmath>
#include <vector>

#include "backend/cpu/activation_rows.h"
#include "backend/cpu/backend.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemv.h"
#include "backend/cpu/gemv_internal.h"
#include "backend/cpu/task_pool.h"
#include "core/parallel.h"

namespace moe::cpu {

namespace {

// How a product of one head meets the causal mask (T x T, query i sees keys 0..i):
// - scores: C [T, T] = A [T, K] op(B), only C[i, j <= i] wanted (Q K^T, dctx V^T);
// - left: C [T, N] = P [T, T] B [T, N] with P zero above the diagonal (P V, dS K);
// - left_transposed: C [T, N] = P^T B, P^T zero below it (dS^T Q, P^T dctx).
enum class Causal { scores, left, left_transposed };

// Query rows per block: at least 32 (each block packs its keys again, so smaller blocks trade
// more packing for less work left out; 32 was not tuned), at most 8 blocks a head (a block of rows
// r0..r1 does the work of r1 rows of the full product, so 8 blocks do 9/16 of it, 4 blocks 5/8).
int64_t causal_block_rows(int64_t T) { return std::max<int64_t>(32, (T + 7) / 8); }
int64_t causal_blocks(int64_t T) {
  const int64_t rows = causal_block_rows(T);
  return (T + rows - 1) / rows;
}

// Appends `p` (one head's whole product) cut into row blocks that leave out the zero or unwanted
// part: block r0..r1 of scores stops at column r1; of left, at key r1 (P's later columns are zero
// in its rows); of left_transposed, it starts at query r0 (P^T's rows r0.. are zero before it).
// Bits: with the AVX-512 tile kernel (gemm_kernel.h), which sums each element in one FMA chain
// from +0 while K fits one k block (T <= 256), an element is the full product's sum less terms
// that are exactly 0 x finite (leading or trailing), which leave such a chain as it is. Longer T
// moves the k-block boundaries, and the CBLAS kernel sums as the BLAS does: the results are then
// as accurate but not the full product's bits (the same at every thread count either way).
void push_causal(std::vector<GemmProblem>& out, const GemmProblem& p, Causal kind, int64_t T) {
  const int64_t rows = causal_block_rows(T);
  for (int64_t r0 = 0; r0 < T; r0 += rows) {
    const int64_t r1 = std::min(T, r0 + rows);
    GemmProblem q = p;
    q.m = r1 - r0;
    q.c = p.c + r0 * p.ldc;
    switch (kind) {
      case Causal::scores:  // rows r0..r1 of A; columns 0..r1 of op(B) start where B does
        q.a = p.a + r0 * p.lda;
        q.n = r1;
        break;
      case Causal::left:  // rows r0..r1 and keys 0..r1 of P; B's rows 0..r1
        q.a = p.a + r0 * p.lda;
        q.k = r1;
        break;
      case Causal::left_transposed:  // P^T rows r0..r1 = P's columns, queries r0..T = P's rows
        q.a = p.a + r0 * p.lda + r0;
        q.b = p.b + r0 * p.ldb;
        q.k = T - r0;
        break;
    }
    out.push_back(q);
  }
}

// Softmax of score row p (visible keys of `keys`) with head sink `sink` when has_sink, else the
// plain row at the CPU's widest copy.
void softmax_row(float* p, int64_t visible, int64_t keys, bool has_sink, float sink) {
  if (has_sink) {
    kernels::causal_softmax_sink_row(p, visible, keys, sink);
  } else {
    causal_softmax_row(p, visible, keys);
  }
}

// One product per (batch, head), as one batch: `shape` holds what the products share (transposes,
// sizes, scalars, leading dimensions); operands(b, h, problem) sets its a, b and c.
template <class Fn>
void per_head_batch(int64_t batch, int64_t heads, const GemmProblem& shape, Causal kind,
                    Fn&& operands) {
  std::vector<GemmProblem> problems;
  problems.reserve(static_cast<size_t>(batch * heads * causal_blocks(shape.m)));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      GemmProblem p = shape;
      operands(b, h, p);
      push_causal(problems, p, kind, shape.m);
    }
  sgemm_batch(problems.data(), problems.size());
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                       const ops::AttentionShape& s, const Tensor& sinks, Tensor& probs,
                       Tensor& ctx) {
  const int64_t T = s.seq, hd = s.head_dim, H = s.heads, KV = s.kv_heads, group = H / KV;
  const int64_t ldq = H * hd, ldk = KV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qs = q.data<float>();
  const float* ks = k.data<float>();
  const float* vs = v.data<float>();
  float* ps = probs.data<float>();
  float* cs = ctx.data<float>();
  const float* sink = sinks.defined() ? sinks.data<float>() : nullptr;

  per_head_batch(
      s.batch, H,
      GemmProblem{false, true, T, T, hd, scale, nullptr, ldq, nullptr, ldk, 0.0f, nullptr, T},
      Causal::scores, [&](int64_t b, int64_t h, GemmProblem& p) {
        p.a = qs + b * T * ldq + h * hd;
        p.b = ks + b * T * ldk + (h / group) * hd;
        p.c = ps + (b * H + h) * T * T;
      });
  const int64_t rows = s.batch * H * T;
#pragma omp parallel for schedule(static) if (rows * T >= kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {  // query r % T sees keys 0..r % T (its window's last ones)
    kernels::mask_before_window(ps + r * T, kernels::window_first_key(r % T, s.window));
    softmax_row(ps + r * T, r % T + 1, T, sink != nullptr, sink ? sink[(r / T) % H] : 0.0f);
  }
  per_head_batch(
      s.batch, H,
      GemmProblem{false, false, T, hd, T, 1.0f, nullptr, T, nullptr, ldk, 0.0f, nullptr, ldq},
      Causal::left, [&](int64_t b, int64_t h, GemmProblem& p) {
        p.a = ps + (b * H + h) * T * T;
        p.b = vs + b * T * ldk + (h / group) * hd;
        p.c = cs + b * T * ldq + h * hd;
      });
}

// A decode step's products for one head and its one new query by plain loops instead of two
// tiled-sgemm calls (their tiling and packing for a product of one query by ~100 keys of 64; the
// attention part of a Q8_0 batch-1 step fell from ~0.21 to ~0.16 ms, docs/PERFORMANCE.md). The
// query sits at position start, so it sees keys 0..start: scores s[j] = scale * (q . k_j) (16
// lanes, lane l summing elements l, l + 16, ... by a multiply then an add, then the GEMV's fixed
// tree over the lanes), the causal softmax, then ctx[e] = sum over the keys, in order, of p[j]
// v_j[e] (a multiply then an add). One order whatever thread runs it, and whatever the vector
// width: this file builds without contraction into FMAs (libmoe/CMakeLists.txt), so the AVX-512
// loops (where the CPU has them) give the baseline loops' bits, as the softmax's copies do. k and
// v rows ldk apart from key 0, ps [start + 1].
namespace {
void decode_scores_plain(const float* q, const float* k, int64_t ldk, int64_t keys, int64_t hd,
                         float scale, float* ps) {
  using gemv_detail::kLanes;
  for (int64_t j = 0; j < keys; ++j) {
    const float* kj = k + j * ldk;
    float lane[kLanes] = {};
    int64_t e = 0;
    for (; e + kLanes <= hd; e += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lane[l] += q[e + l] * kj[e + l];
    for (int64_t l = 0; e + l < hd; ++l) lane[l] += q[e + l] * kj[e + l];
    ps[j] = scale * gemv_detail::reduce_lanes(lane);
  }
}

void decode_context_plain(const float* ps, const float* v, int64_t ldk, int64_t keys, int64_t hd,
                          float* ctx) {
  for (int64_t e = 0; e < hd; ++e) ctx[e] = 0.0f;
  for (int64_t j = 0; j < keys; ++j) {
    const float pj = ps[j];
    const float* vj = v + j * ldk;
    for (int64_t e = 0; e < hd; ++e) ctx[e] += pj * vj[e];
  }
}

#if MOE_GEMV_X86
// GCC 12 reports its own _mm512_undefined_ps() inside the shuffle intrinsics as maybe
// uninitialised (a false positive: every lane is written), as in gemv.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The same operations, 16 lanes in one register. A lane past hd adds +0 (0 x 0) to a lane that
// started at +0 and only ever had products added: it stays what the plain loop leaves it.
// gemv_detail::reduce_lanes in registers: lane l + lane l + half for half 8, 4, 2, 1, the same
// additions in the same order.
MOE_TARGET_GEMV512 inline float reduce_lanes_avx512(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(0, 0, 3, 2)));  // lanes 8-15
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(0, 0, 0, 1)));  // lanes 4-7
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(0, 0, 3, 2)));        // lanes 2-3
  v = _mm512_add_ps(v, _mm512_permute_ps(v, _MM_SHUFFLE(0, 0, 0, 1)));        // lane 1
  return _mm512_cvtss_f32(v);
}

MOE_TARGET_GEMV512 void decode_scores_avx512(const float* q, const float* k, int64_t ldk,
                                             int64_t keys, int64_t hd, float scale, float* ps) {
  using gemv_detail::kLanes;
  for (int64_t j = 0; j < keys; ++j) {
    const float* kj = k + j * ldk;
    __m512 lanes = _mm512_setzero_ps();
    for (int64_t e = 0; e < hd; e += kLanes) {
      const __mmask16 m = hd - e >= kLanes ? __mmask16(0xffff) : __mmask16((1u << (hd - e)) - 1u);
      lanes = _mm512_add_ps(
          lanes, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, q + e), _mm512_maskz_loadu_ps(m, kj + e)));
    }
    ps[j] = scale * reduce_lanes_avx512(lanes);
  }
}

MOE_TARGET_GEMV512 void decode_context_avx512(const float* ps, const float* v, int64_t ldk,
                                              int64_t keys, int64_t hd, float* ctx) {
  using gemv_detail::kLanes;
  for (int64_t e = 0; e < hd; e += kLanes) {
    const __mmask16 m = hd - e >= kLanes ? __mmask16(0xffff) : __mmask16((1u << (hd - e)) - 1u);
    __m512 c = _mm512_setzero_ps();
    for (int64_t j = 0; j < keys; ++j)
      c = _mm512_add_ps(
          c, _mm512_mul_ps(_mm512_set1_ps(ps[j]), _mm512_maskz_loadu_ps(m, v + j * ldk + e)));
    _mm512_mask_storeu_ps(ctx + e, m, c);
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
}  // namespace

void decode_head(const float* q, const float* k, const float* v, int64_t ldk, int64_t start,
                 int64_t hd, float scale, float* ps, float* ctx, bool wide, float sink) {
  const int64_t keys = start + 1;
  const bool has_sink = sink > -INFINITY;
#if MOE_GEMV_X86
  if (wide) {
    decode_scores_avx512(q, k, ldk, keys, hd, scale, ps);
    softmax_row(ps, keys, keys, has_sink, sink);
    decode_context_avx512(ps, v, ldk, keys, hd, ctx);
    return;
  }
#endif
  decode_scores_plain(q, k, ldk, keys, hd, scale, ps);
  softmax_row(ps, keys, keys, has_sink, sink);
  decode_context_plain(ps, v, ldk, keys, hd, ctx);
}

void attention_forward_cached(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              int64_t heads, int64_t kv_heads, const ops::CachedRows& rows,
                              const Tensor& sinks, Tensor& ctx) {
  const int64_t H = heads, KV = kv_heads, group = H / KV, hd = q.dim(1) / H;
  const int64_t capacity = k_cache.dim(1);
  const int64_t ldq = H * hd, ldk = KV * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* qs = q.data<float>();
  const float* ks = k_cache.data<float>();
  const float* vs = v_cache.data<float>();
  float* cs = ctx.data<float>();
  const float* sink = sinks.defined() ? sinks.data<float>() : nullptr;

  // Each (row, head) is independent, each with its thread's own scores buffer, kept between
  // calls (no per-step allocation). The products inside run on the calling thread; their bits do
  // not depend on which one. Decode steps (a few new tokens per row, products too small for
  // sgemm to split) run the pairs on the decode task pool (task_pool.h), the threads their GEMVs
  // run on, where no thread waits for a late one; prefill keeps an OpenMP loop.
  const int64_t n_rows = rows.rows();
  thread_local std::vector<int64_t> first;  // a row's first token in q/ctx
  first.assign(static_cast<size_t>(n_rows) + 1, 0);
  int64_t work = 0;
  bool decode = true;
  for (int64_t r = 0; r < n_rows; ++r) {
    first[r + 1] = first[r] + rows.count[r];
    const int64_t keys = rows.start[r] + rows.count[r];
    work += rows.count[r] * keys * hd * H;
    decode = decode && rows.count[r] <= kGemvMaxRows && rows.count[r] * keys * hd < (1 << 20);
  }
  const int64_t* firsts = first.data();
  auto row_head = [&, firsts](int64_t rh) {
    thread_local std::vector<float> scores;
    const int64_t r = rh / H, h = rh % H;
    const float head_sink = sink ? sink[h] : 0.0f;
    const int64_t t = rows.count[r], start = rows.start[r], keys = start + t;
    const int64_t slot_offset = rows.slot[r] * capacity * ldk;
    if (scores.size() < static_cast<size_t>(t * keys)) scores.resize(static_cast<size_t>(t * keys));
    float* ps = scores.data();
    const int64_t q_offset = firsts[r] * ldq + h * hd, kv_offset = slot_offset + (h / group) * hd;
    // One new token after cached ones: decode_head. A prefill (start 0) keeps the full
    // forward's products, so its logits equal the full forward's bit for bit.
    // A window's decode step reads only the keys inside it (the cache keeps the older ones).
    if (t == 1 && start > 0) {
      const int64_t first_key = kernels::window_first_key(start, rows.window);
      const int64_t from = kv_offset + first_key * ldk;
      decode_head(qs + q_offset, ks + from, vs + from, ldk, start - first_key, hd, scale, ps,
                  cs + q_offset, gemv_detail::avx512_available(), sink ? head_sink : -INFINITY);
      return;
    }
    sgemm(false, true, t, keys, hd, scale, qs + q_offset, ldq, ks + kv_offset, ldk, 0.0f, ps, keys);
    for (int64_t i = 0; i < t; ++i) {  // query i sits at start + i: keys 0..start+i visible
      kernels::mask_before_window(ps + i * keys, kernels::window_first_key(start + i, rows.window));
      softmax_row(ps + i * keys, start + i + 1, keys, sink != nullptr, head_sink);
    }
    sgemm(false, false, t, hd, keys, 1.0f, ps, keys, vs + kv_offset, ldk, 0.0f, cs + q_offset, ldq);
  };
  const int64_t pairs = n_rows * H;
  if (decode) {
    run_tasks(pairs, work >= kParallelWork ? num_threads() : 1, row_head);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) if (pairs > 1 && work >= kParallelWork)
  for (int64_t rh = 0; rh < pairs; ++rh) row_head(rh);
}

void attention_backward(const Tensor& dctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& probs, const ops::AttentionShape& s, const Tensor& /*sinks*/,
                        Tensor& dq, Tensor& dk, Tensor& dv, Tensor* dsinks) {
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
      GemmProblem{false, true, T, T, hd, 1.0f, nullptr, ldq, nullptr, ldk, 0.0f, nullptr, T},
      Causal::scores, [&](int64_t b, int64_t h, GemmProblem& p) {
        p.a = gs + b * T * ldq + h * hd;
        p.b = vs + b * T * ldk + (h / group) * hd;
        p.c = ds + (b * H + h) * T * T;
      });
  // With sinks, each row's sink term first (it reads dctx V^T, which the row's backward
  // replaces), then per head their sum in a fixed order (kernels::sink_gradient_sum).
  const int64_t rows = s.batch * H * T;
  std::vector<float> sink_terms(dsinks ? static_cast<size_t>(rows) : 0);
  float* terms = sink_terms.data();
#pragma omp parallel for schedule(static) if (rows * T >= kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    if (terms) terms[r] = kernels::sink_gradient_row(ps + r * T, ds + r * T, r % T + 1);
    causal_softmax_backward_row(ps + r * T, ds + r * T, r % T + 1, T, scale);
  }
  for (int64_t h = 0; terms && h < H; ++h)
    kernels::sink_gradient_sum(terms, s.batch, H, T, h, dsinks->data<float>());
  per_head_batch(
      s.batch, H,
      GemmProblem{false, false, T, hd, T, 1.0f, nullptr, T, nullptr, ldk, 0.0f, nullptr, ldq},
      Causal::left, [&](int64_t b, int64_t h, GemmProblem& p) {
        p.a = ds + (b * H + h) * T * T;
        p.b = ks + b * T * ldk + (h / group) * hd;
        p.c = dqs + b * T * ldq + h * hd;
      });
  // The query heads of a group all add into their kv head's dk and dv: the first writes, the
  // others add in head order, one batch (over batch x kv heads) per position in the group.
  for (int64_t g = 0; g < group; ++g) {
    const float beta = g == 0 ? 0.0f : 1.0f;
    std::vector<GemmProblem> problems;
    problems.reserve(static_cast<size_t>(2 * s.batch * KV * causal_blocks(T)));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t kv = 0; kv < KV; ++kv) {
        const int64_t h = kv * group + g;
        const int64_t kv_offset = b * T * ldk + kv * hd, q_offset = b * T * ldq + h * hd;
        push_causal(problems,
                    {true, false, T, hd, T, 1.0f, ds + (b * H + h) * T * T, T, qs + q_offset, ldq,
                     beta, dks + kv_offset, ldk},
                    Causal::left_transposed, T);
        push_causal(problems,
                    {true, false, T, hd, T, 1.0f, ps + (b * H + h) * T * T, T, gs + q_offset, ldq,
                     beta, dvs + kv_offset, ldk},
                    Causal::left_transposed, T);
      }
    sgemm_batch(problems.data(), problems.size());
  }
}

}  // namespace moe::cpu
