// Multi-head Latent Attention's projections (DeepSeek-V2/V3). The attention core wants q, k and v
// as [N, heads x head dim]; MLA's k joins a RoPE part shared by the heads to each head's own part,
// and its values are narrower than its keys. Those column layouts are made by one row gather
// (ops::gather_rows, on every backend) over rows of `unit` features, unit dividing every width.
#include "moe/nn/mla.h"

#include <numeric>

#include "moe/ops/core.h"
#include "moe/ops/moe.h"

namespace moe::nn {

namespace {

// Columns [col, col + width) of source `src` (-1: zeros) for every token.
struct Piece {
  int src;
  int64_t col, width;
};

// out [N, sum of widths] whose token n is the pieces of sources[*][n] in order; every source is
// [N, C_i] f32 on one device, every width and column a multiple of unit.
Tensor gather_columns(const std::vector<Tensor>& sources, const std::vector<Piece>& row,
                      int64_t unit) {
  const int64_t n = sources.at(0).dim(0);
  const Device device = sources[0].device();
  std::vector<int64_t> base(sources.size());
  int64_t rows = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    base[i] = rows;
    rows += sources[i].numel() / unit;
  }
  const int64_t zero_row = rows;
  Tensor buffer = Tensor::empty({rows + 1, unit}, DType::f32, device);
  for (size_t i = 0; i < sources.size(); ++i)
    buffer.rows(base[i], base[i] + sources[i].numel() / unit)
        .copy_from(sources[i].reshape({sources[i].numel() / unit, unit}));
  buffer.rows(zero_row, zero_row + 1).zero();
  int64_t width = 0;
  for (const Piece& p : row) width += p.width;
  std::vector<int32_t> index;
  index.reserve(static_cast<size_t>(n * width / unit));
  for (int64_t t = 0; t < n; ++t)
    for (const Piece& p : row)
      for (int64_t j = 0; j < p.width / unit; ++j)
        index.push_back(static_cast<int32_t>(
            p.src < 0 ? zero_row
                      : base[p.src] + t * (sources[p.src].dim(1) / unit) + p.col / unit + j));
  const Tensor ids = Tensor::from_vector({static_cast<int64_t>(index.size())}, index).to(device);
  Tensor out = Tensor::empty({n * width / unit, unit}, DType::f32, device);
  ops::gather_rows(buffer, ids, out);
  return out.reshape({n, width});
}

int64_t unit_of(const MlaConfig& c) {
  return std::gcd(std::gcd(c.qk_nope, c.qk_rope), c.v_head_dim);
}

MlaConfig checked(const std::string& prefix, int64_t d_model, int64_t heads, const MlaConfig& c) {
  MOE_USAGE_CHECK(d_model > 0 && heads > 0, "attention ", prefix, ": d_model ", d_model,
                  " and heads ", heads, " must be positive");
  MOE_USAGE_CHECK(c.kv_lora_rank > 0 && c.q_lora_rank >= 0 && c.qk_nope > 0 && c.qk_rope > 0 &&
                      c.qk_rope % 2 == 0 && c.v_head_dim > 0 && c.v_head_dim <= c.head_dim(),
                  "attention ", prefix, ": latent attention needs kv_lora_rank > 0 (got ",
                  c.kv_lora_rank, "), q_lora_rank >= 0 (got ", c.q_lora_rank,
                  "), qk_nope > 0 (got ", c.qk_nope, "), an even qk_rope > 0 (got ", c.qk_rope,
                  ") and 0 < v_head_dim <= qk_nope + qk_rope (got ", c.v_head_dim, ")");
  return c;
}

}  // namespace

Mla::Mla(ParamSet& ps, const std::string& prefix, int64_t d_model, int64_t heads,
         const MlaConfig& config, float norm_eps, float init_std)
    : config_(checked(prefix, d_model, heads, config)),
      heads_(heads),
      kv_a_(ps, prefix + ".kv_a", d_model, config_.kv_lora_rank, false, init_std),
      k_rope_(ps, prefix + ".k_rope", d_model, config_.qk_rope, false, init_std),
      k_b_(ps, prefix + ".k_b", config_.kv_lora_rank, heads * config_.qk_nope, false, init_std),
      v_b_(ps, prefix + ".v_b", config_.kv_lora_rank, heads * config_.v_head_dim, false, init_std),
      kv_a_norm_(ps, prefix + ".kv_a_norm", config_.kv_lora_rank, NormKind::rmsnorm, norm_eps) {
  const int64_t q_out = heads * config_.head_dim();
  if (config_.q_lora_rank > 0) {
    q_a_ = std::make_unique<Linear>(ps, prefix + ".q_a", d_model, config_.q_lora_rank, false,
                                    init_std);
    q_a_norm_ = std::make_unique<Norm>(ps, prefix + ".q_a_norm", config_.q_lora_rank,
                                       NormKind::rmsnorm, norm_eps);
    q_b_ =
        std::make_unique<Linear>(ps, prefix + ".q_b", config_.q_lora_rank, q_out, false, init_std);
  } else {
    q_ = std::make_unique<Linear>(ps, prefix + ".q", d_model, q_out, false, init_std);
  }
}

Mla::Projected Mla::project(const Tensor& x, Saved* saved) const {
  Projected p;
  if (q_) {
    p.q = q_->forward(x);
  } else {
    Tensor cq = q_a_norm_->forward(q_a_->forward(x), saved ? &saved->q_norm : nullptr);
    p.q = q_b_->forward(cq);
    if (saved) saved->cq = cq;
  }
  Tensor ckv = kv_a_.forward(x);
  Tensor c = kv_a_norm_.forward(ckv, saved ? &saved->kv_norm : nullptr);
  p.k_pe = k_rope_.forward(x);
  p.k_nope = k_b_.forward(c);
  p.v = v_b_.forward(c);
  if (saved) {
    saved->x = x;
    saved->ckv = c;  // k_b / v_b's input
  }
  return p;
}

Tensor Mla::keys(const Tensor& k_pe, const Tensor& k_nope) const {
  std::vector<Piece> row;
  for (int64_t h = 0; h < heads_; ++h) {
    row.push_back({0, 0, config_.qk_rope});
    row.push_back({1, h * config_.qk_nope, config_.qk_nope});
  }
  return gather_columns({k_pe, k_nope}, row, unit_of(config_));
}

Tensor Mla::pad_values(const Tensor& v) const {
  const int64_t vd = config_.v_head_dim, pad = config_.head_dim() - vd;
  if (pad == 0) return v;
  std::vector<Piece> row;
  for (int64_t h = 0; h < heads_; ++h) {
    row.push_back({0, h * vd, vd});
    row.push_back({-1, 0, pad});
  }
  return gather_columns({v}, row, unit_of(config_));
}

Tensor Mla::unpad_values(const Tensor& v) const {
  const int64_t vd = config_.v_head_dim, hd = config_.head_dim();
  if (vd == hd) return v;
  std::vector<Piece> row;
  for (int64_t h = 0; h < heads_; ++h) row.push_back({0, h * hd, vd});
  return gather_columns({v}, row, unit_of(config_));
}

void Mla::keys_backward(const Tensor& dk, Tensor& dk_pe, Tensor& dk_nope) const {
  const int64_t hd = config_.head_dim(), unit = unit_of(config_);
  std::vector<Piece> nope;
  for (int64_t h = 0; h < heads_; ++h)
    nope.push_back({0, h * hd + config_.qk_rope, config_.qk_nope});
  dk_nope = gather_columns({dk}, nope, unit);
  // k_pe is every head's: its gradient is the sum of the heads' (in head order).
  dk_pe = gather_columns({dk}, {{0, 0, config_.qk_rope}}, unit);
  for (int64_t h = 1; h < heads_; ++h)
    ops::axpy(1.0f, gather_columns({dk}, {{0, h * hd, config_.qk_rope}}, unit), dk_pe);
}

Tensor Mla::backward(const Tensor& dq, const Tensor& dk_pe, const Tensor& dk_nope, const Tensor& dv,
                     const Saved& saved) {
  MOE_CHECK(saved.x.defined() && saved.ckv.defined(), "attention ", kv_a_.weight().name,
            ": backward without a saved forward");
  Tensor dx = Tensor::empty(saved.x.shape(), DType::f32, saved.x.device());
  if (q_) {
    q_->backward_into(dq, saved.x, dx, false);
  } else {
    Tensor dcq = q_b_->backward(dq, saved.cq);
    q_a_->backward_into(q_a_norm_->backward(dcq, saved.q_norm), saved.x, dx, false);
  }
  Tensor dc = k_b_.backward(dk_nope, saved.ckv);
  ops::axpy(1.0f, v_b_.backward(dv, saved.ckv), dc);
  kv_a_.backward_into(kv_a_norm_.backward(dc, saved.kv_norm), saved.x, dx, true);
  k_rope_.backward_into(dk_pe, saved.x, dx, true);
  return dx;
}

}  // namespace moe::nn
