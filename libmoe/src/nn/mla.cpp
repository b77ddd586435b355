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

// Every source's rows of `unit` features back to back (source i from row base[i]), then one zero
// row: what the gathers below index.
struct UnitRows {
  Tensor buffer;
  std::vector<int64_t> base;
  int64_t zero_row = 0;
};

UnitRows unit_rows(const std::vector<Tensor>& sources, int64_t unit) {
  UnitRows u;
  const Device device = sources.at(0).device();
  int64_t rows = 0;
  for (const Tensor& source : sources) {
    u.base.push_back(rows);
    rows += source.numel() / unit;
  }
  u.zero_row = rows;
  u.buffer = Tensor::empty({rows + 1, unit}, DType::f32, device);
  for (size_t i = 0; i < sources.size(); ++i)
    u.buffer.rows(u.base[i], u.base[i] + sources[i].numel() / unit)
        .copy_from(sources[i].reshape({sources[i].numel() / unit, unit}));
  u.buffer.rows(u.zero_row, u.zero_row + 1).zero();
  return u;
}

// [index.size() * unit / width, width]: the buffer's rows `index`, in order.
Tensor gather_units(const UnitRows& u, const std::vector<int32_t>& index, int64_t unit,
                    int64_t width) {
  const Device device = u.buffer.device();
  const int64_t count = static_cast<int64_t>(index.size());
  const Tensor ids = Tensor::from_vector({count}, index).to(device);
  Tensor out = Tensor::empty({count, unit}, DType::f32, device);
  ops::gather_rows(u.buffer, ids, out);
  return out.reshape({count * unit / width, width});
}

// out [N, sum of widths] whose token n is the pieces of sources[*][n] in order; every source is
// [N, C_i] f32 on one device, every width and column a multiple of unit.
Tensor gather_columns(const std::vector<Tensor>& sources, const std::vector<Piece>& row,
                      int64_t unit) {
  const int64_t n = sources.at(0).dim(0);
  const UnitRows u = unit_rows(sources, unit);
  int64_t width = 0;
  for (const Piece& p : row) width += p.width;
  std::vector<int32_t> index;
  index.reserve(static_cast<size_t>(n * width / unit));
  for (int64_t t = 0; t < n; ++t)
    for (const Piece& p : row)
      for (int64_t j = 0; j < p.width / unit; ++j)
        index.push_back(static_cast<int32_t>(
            p.src < 0 ? u.zero_row
                      : u.base[p.src] + t * (sources[p.src].dim(1) / unit) + p.col / unit + j));
  return gather_units(u, index, unit, width);
}

// src [N, heads * stride] -> [heads * N, width], row h * N + n holding columns
// [h * stride + col, + width) of token n: each head's part as one matrix (the absorbed products
// are per head).
Tensor heads_first(const Tensor& src, int64_t heads, int64_t stride, int64_t col, int64_t width) {
  const int64_t n = src.dim(0), unit = std::gcd(std::gcd(stride, col), width);
  const UnitRows u = unit_rows({src}, unit);
  std::vector<int32_t> index;
  index.reserve(static_cast<size_t>(heads * n * width / unit));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < width / unit; ++j)
        index.push_back(static_cast<int32_t>((t * heads * stride + h * stride + col) / unit + j));
  return gather_units(u, index, unit, width);
}

// heads_first's inverse for a whole row: [heads * N, width] -> [N, heads * width].
Tensor tokens_first(const Tensor& src, int64_t heads) {
  const int64_t width = src.dim(1), n = src.dim(0) / heads;
  const UnitRows u = unit_rows({src}, width);
  std::vector<int32_t> index;
  index.reserve(static_cast<size_t>(heads * n));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads; ++h) index.push_back(static_cast<int32_t>(h * n + t));
  return gather_units(u, index, width, heads * width);
}

// A weight [out, in] as f32 in its own layout (see Mla::key_weight_f32); undefined when f32.
Tensor weight_f32(const Tensor& w, int64_t out, int64_t in) {
  if (w.dtype() == DType::f32) return Tensor();
  if (w.dtype() == DType::bf16 || w.dtype() == DType::f16) return w.to(DType::f32);
  // Quantised rows: I W^T = W^T [in, out] through the kernel, then transposed back.
  std::vector<float> eye(static_cast<size_t>(in * in), 0.0f);
  for (int64_t i = 0; i < in; ++i) eye[static_cast<size_t>(i * in + i)] = 1.0f;
  Tensor wt = Tensor::empty({in, out}, DType::f32, w.device());
  ops::gemm(Tensor::from_vector({in, in}, eye).to(w.device()), false, w, true, wt);
  return heads_first(wt, out, 1, 0, 1).reshape({out, in});
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

Tensor Mla::queries(const Tensor& x, Saved* saved) const {
  if (q_) return q_->forward(x);
  Tensor cq = q_a_norm_->forward(q_a_->forward(x), saved ? &saved->q_norm : nullptr);
  if (saved) saved->cq = cq;
  return q_b_->forward(cq);
}

Mla::Projected Mla::project(const Tensor& x, Saved* saved) const {
  Projected p;
  p.q = queries(x, saved);
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

Mla::Latent Mla::project_latent(const Tensor& x) const {
  Latent p;
  p.q = queries(x, nullptr);
  p.c = kv_a_norm_.forward(kv_a_.forward(x), nullptr);
  p.k_pe = k_rope_.forward(x);
  return p;
}

Tensor Mla::latent_rows(const Tensor& c, const Tensor& k_pe) const {
  const int64_t rank = config_.kv_lora_rank, rope = config_.qk_rope;
  return gather_columns({c, k_pe}, {{0, 0, rank}, {1, 0, rope}}, std::gcd(rank, rope));
}

Tensor Mla::key_weight_f32() const {
  return weight_f32(k_b_.weight().w(), heads_ * config_.qk_nope, config_.kv_lora_rank);
}

Tensor Mla::value_weight_f32() const {
  return weight_f32(v_b_.weight().w(), heads_ * config_.v_head_dim, config_.kv_lora_rank);
}

Tensor Mla::absorb_queries(const Tensor& q, const Tensor& key_weight, float scale) const {
  const int64_t n = q.dim(0), rank = config_.kv_lora_rank, nope = config_.qk_nope;
  const int64_t rope = config_.qk_rope, hd = config_.head_dim();
  const Tensor& w = key_weight.defined() ? key_weight : k_b_.weight().w();
  const Tensor q_nope = heads_first(q, heads_, hd, rope, nope);  // [H*N, nope]
  Tensor absorbed = Tensor::empty({heads_ * n, rank}, DType::f32, q.device());
  for (int64_t h = 0; h < heads_; ++h) {  // q_nope_h [N, nope] W_UK_h [nope, c]
    Tensor out = absorbed.rows(h * n, (h + 1) * n);
    ops::gemm(q_nope.rows(h * n, (h + 1) * n), false, w.rows(h * nope, (h + 1) * nope), false, out);
  }
  // Token n, head h: [absorbed row h*N + n | q's RoPE part of head h].
  const int64_t unit = std::gcd(std::gcd(rank, rope), nope);
  const UnitRows u = unit_rows({absorbed, q}, unit);
  std::vector<int32_t> index;
  index.reserve(static_cast<size_t>(n * heads_ * latent_width() / unit));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < heads_; ++h) {
      for (int64_t j = 0; j < rank / unit; ++j)
        index.push_back(static_cast<int32_t>(u.base[0] + (h * n + t) * (rank / unit) + j));
      for (int64_t j = 0; j < rope / unit; ++j)
        index.push_back(static_cast<int32_t>(u.base[1] + (t * heads_ * hd + h * hd) / unit + j));
    }
  Tensor out = gather_units(u, index, unit, heads_ * latent_width());
  ops::scale(out, scale);
  return out;
}

Tensor Mla::absorb_values(const Tensor& ctx, const Tensor& value_weight) const {
  const int64_t n = ctx.dim(0), rank = config_.kv_lora_rank, vd = config_.v_head_dim;
  const Tensor& w = value_weight.defined() ? value_weight : v_b_.weight().w();
  const Tensor latent = heads_first(ctx, heads_, latent_width(), 0, rank);  // [H*N, c]
  Tensor values = Tensor::empty({heads_ * n, vd}, DType::f32, ctx.device());
  for (int64_t h = 0; h < heads_; ++h) {  // ctx_h [N, c] W_UV_h^T
    Tensor out = values.rows(h * n, (h + 1) * n);
    ops::gemm(latent.rows(h * n, (h + 1) * n), false, w.rows(h * vd, (h + 1) * vd), true, out);
  }
  return tokens_first(values, heads_);
}

}  // namespace moe::nn
