// Latent attention's decode (DeepSeek-V2/V3's MLA; the absorbed projections of the DeepSeek-V2
// paper, section 2.1): the cache holds each position's normalised kv latent c and its rotated
// k_pe (kv_lora_rank + qk_rope floats, against H * (hd + vd) for full keys and values), and the
// attention runs over it as one kv head shared by the H query heads: query head h is
// [q_nope_h W_UK_h | q_rope_h], the context it gathers (sum_j p_j c_j) goes out through W_UV_h
// (Mla::absorb_queries / absorb_values). Shape letters: N new tokens, H heads, c kv_lora_rank.
//
// Against the uncached forward (keys c W_UK^T, values c W_UV^T, made per position) the scores and
// outputs are the same sums taken in another order: q . (W_UK c) becomes (q W_UK) . c, and
// W_UV (sum_j p_j c_j) replaces sum_j p_j (W_UV c_j). In f32 each order rounds differently, so
// logits agree to rounding (a few ulps of the products' terms), not bit for bit. Prefill takes
// this path too: the cache is filled from it, and a continued prefill (start > 0) needs no keys
// or values of earlier positions that the cache no longer holds.
#include <cmath>

#include "moe/nn/attention.h"
#include "moe/ops/dense.h"

namespace moe::nn {

AttentionCache Attention::make_latent_cache(int64_t slots, int64_t capacity) const {
  const Device device = o_->weight().value.device();  // the cache lives with the weights
  AttentionCache cache;
  cache.latent = Tensor::zeros({slots, capacity, mla_->latent_width()}, DType::f32, device)
                     .set_name("attn.latent_cache");
  cache.key_weight = mla_->key_weight_f32();
  cache.value_weight = mla_->value_weight_f32();
  return cache;
}

Tensor Attention::forward_cached_latent(const Tensor& x, const ops::CachedRows& rows,
                                        AttentionCache& cache) const {
  const int64_t n = rows.tokens(), width = mla_->latent_width();
  MOE_CHECK(x.ndim() == 2 && x.dim(0) == n && x.dim(1) == config_.d_model, "attention ", name_,
            ": cached input ", x.describe(), " expected [", n, ",", config_.d_model, "]");
  MOE_CHECK(cache.latent.defined() && cache.latent.ndim() == 3 && cache.latent.dim(2) == width,
            "attention ", name_, ": its cache must hold the latent (", width,
            " features a position), not ",
            cache.positions().defined() ? cache.positions().describe() : std::string("nothing"));
  const int64_t capacity = cache.latent.dim(1);
  rows.check(cache.latent.dim(0), capacity, "attention cache");
  Mla::Latent p = mla_->project_latent(x);
  int64_t first = 0;
  for (int64_t r = 0; r < rows.rows(); ++r) {  // each row at its own positions
    const int64_t t = rows.count[r], start = rows.start[r];
    Tensor qr = p.q.rows(first, first + t), kr = p.k_pe.rows(first, first + t);
    ops::rope_forward(qr, 1, t, config_.heads, config_.rope_theta, qr, start, config_.rope_dim,
                      config_.rope_scaling);
    // k_pe is every head's: one head of qk_rope features, all of them rotating.
    ops::rope_forward(kr, 1, t, 1, config_.rope_theta, kr, start, config_.rope_dim,
                      config_.rope_scaling);
    first += t;
  }
  const Tensor latent = mla_->latent_rows(p.c, p.k_pe);
  Tensor positions = cache.latent.reshape({cache.latent.dim(0) * capacity, width});
  first = 0;
  for (int64_t r = 0; r < rows.rows(); ++r) {  // a copy, not memcpy: the cache may be on a GPU
    const int64_t t = rows.count[r], at = rows.slot[r] * capacity + rows.start[r];
    positions.rows(at, at + t).copy_from(latent.rows(first, first + t));
    first += t;
  }
  // The uncached path's softmax scale, score_scale/sqrt(hd) (DeepSeek's YaRN mscale^2 in
  // score_scale). The attention op scales by 1/sqrt of its own head width (the latent's): the
  // absorbed queries carry the ratio.
  const float softmax_scale = config_.score_scale / std::sqrt(static_cast<float>(head_dim_));
  const float carried = softmax_scale * std::sqrt(static_cast<float>(width));
  const Tensor q = mla_->absorb_queries(p.q, cache.key_weight, carried);
  Tensor ctx = Tensor::empty(q.shape(), DType::f32, q.device());
  ops::attention_forward_cached(q, cache.latent, cache.latent, config_.heads, 1, rows, ctx);
  return o_->forward(mla_->absorb_values(ctx, cache.value_weight));
}

}  // namespace moe::nn
