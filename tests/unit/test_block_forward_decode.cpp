// Block-quantised experts with gpt-oss's expert biases (b1, b3, b2) and clamped SwiGLU, through
// nn::Experts as a model runs them: the full forward (all of a sequence's rows at once, segments of
// many rows) against decode (one token: a row a segment). What each path computes
// (backend/cpu/grouped_gemm.cpp, gemv.h): a segment of at most kGemvMaxRows rows goes to the GEMV,
// which rounds its input rows to the weights' partner format (Q8_0 inputs for q8_0 weights,
// ggml's q8_0 blocks for mxfp4, q8_k for q4_k / q6_k) and sums in integers; a larger segment
// widens the weights exactly and multiplies the f32 rows. Decode is always the former; a full
// forward mixes both, segment by segment (so a model's logits from the two differ at the positions
// whose experts got more than 8 rows: the documented rounding, not a defect; and, rarely, where an
// input near a rounding boundary rounds differently: test_block_forward_decode_gpt_oss.cpp).
// Checked here, for mxfp4, q8_0, q4_k and q6_k weights on three seeds:
//   - each path against a double reference that rounds as that path does (GEMV segments: the
//     inputs of W1/W3 and of W2 rounded with the library's own quantisers; wide segments: none),
//     stage by stage (h, h3, a, y), within f32's summation bound;
//   - the rounded and unrounded references differ by far more than that bound, so a segment that
//     took the other path (or a lost bias, a clamp, a wrong expert's rows) shows;
//   - rows of GEMV segments: forward and decode give the same bits; rows of wide segments: they
//     differ within a bound derived from the rounding (below), and by more than 0.
// Shapes: M rows, D model width, F expert hidden width, E experts.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/quant_blocks.h"
#include "moe/nn/experts.h"
#include "moe/param.h"
#include "moe/rng.h"

using namespace moe;

namespace {

constexpr int64_t kD = 256, kF = 256;  // whole 256-blocks (q4_k / q6_k rows and q8_k inputs)
// Segments: 1, 3 and 8 rows (the GEMV), an empty one, 20 and 9 rows (widened, two groups' slots).
const std::vector<int32_t> kOffsets = {0, 1, 4, 4, 12, 32, 41};
constexpr int64_t kE = 6, kM = 41;
const SwigluClamp kClamp = {1.702f, 7.0f};  // gpt-oss's
// f32 summation of n terms in any order is within n u sum |terms| of the exact sum (u = 2^-24):
// n = 256 here, plus one for a bias.
constexpr double kGamma = 257.0 / 16777216.0;

std::vector<float> normals(int64_t n, uint64_t seed, uint64_t part, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  const uint64_t key = rng_key(seed, {0xfd, part});
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] = scale * rng_normal(key, static_cast<uint64_t>(i));
  return v;
}

// One weight format: its tensor as the kernels read it, its dequantised values, and how the GEMV
// rounds an input row (the values it multiplies).
struct Format {
  std::string name;
  bool q8_0 = false;
  cpu::BlockFormat block = cpu::BlockFormat::mxfp4;

  // w [E, out, in] f32 -> the quantised tensor; `values` gets what it dequantises to.
  Tensor weights(const std::vector<float>& w, int64_t out, int64_t in,
                 std::vector<float>& values) const {
    values.assign(w.size(), 0.0f);
    const int64_t rows = kE * out;
    const int64_t rb = q8_0 ? cpu::q8_row_bytes(in) : cpu::block_row_bytes(block, in);
    Tensor t = Tensor::empty({kE, out, rb}, DType::u8);
    auto* bytes = static_cast<uint8_t*>(t.raw());
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = w.data() + r * in;
      float* dst = values.data() + r * in;
      if (q8_0) {
        cpu::quantize_q8_0_row(src, in, bytes + r * rb);
        cpu::dequantize_q8_0_row(bytes + r * rb, in, dst);
      } else {
        cpu::quantize_row(block, src, in, bytes + r * rb);
        cpu::dequantize_row(block, bytes + r * rb, in, dst);
      }
    }
    return q8_0 ? cpu::pack_q8_0(t, in) : cpu::block_rows(t, block);
  }

  // x [n] as the GEMV multiplies it.
  std::vector<double> rounded(const float* x, int64_t n) const {
    std::vector<double> out(static_cast<size_t>(n));
    if (q8_0) {
      std::vector<int8_t> q(static_cast<size_t>(n));
      std::vector<float> scale(static_cast<size_t>(cpu::q8_blocks(n)));
      cpu::quantize_q8_input_row(x, n, q.data(), scale.data());
      for (int64_t i = 0; i < n; ++i)
        out[size_t(i)] = double(q[size_t(i)]) * double(scale[size_t(i / cpu::kQ8Block)]);
      return out;
    }
    const cpu::BlockFormat partner = cpu::dot_partner(block);
    std::vector<uint8_t> bytes(static_cast<size_t>(cpu::block_row_bytes(partner, n)));
    std::vector<float> back(static_cast<size_t>(n));
    cpu::quantize_row(partner, x, n, bytes.data());
    cpu::dequantize_row(partner, bytes.data(), n, back.data());
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = back[size_t(i)];
    return out;
  }
  // The partner's block: each input moves by at most input_move(max|x| of its block).
  int64_t input_block() const {
    return q8_0 ? cpu::kQ8Block : cpu::block_elems(cpu::dot_partner(block));
  }
  // Half a step, max|x| / 254; a Q8_0 partner (Q8_0 inputs, mxfp4's) keeps its step in f16, as
  // ggml, and the values were rounded against the f32 step s = max|x| / 127: 127 |f16(s) - s|
  // more, below 127 max(s 2^-11, 2^-25) (half an f16 ulp, normal or subnormal).
  double input_move(double amax) const {
    const bool f16_step = q8_0 || cpu::dot_partner(block) == cpu::BlockFormat::q8_0;
    const double f16_rounding = amax * std::ldexp(1.0, -11) + 127 * std::ldexp(1.0, -25);
    return amax / 254.0 + (f16_step ? f16_rounding : 0.0);
  }
};

// A layer's experts: the weights quantised, and their dequantised values and biases (f32).
struct Layer {
  std::vector<float> w1, w3, w2, b1, b3, b2;  // dequantised [E,F,D], [E,F,D], [E,D,F]; biases
  ParamSet ps;
  nn::Experts experts;

  static nn::ExpertsConfig config() {
    nn::ExpertsConfig c{kE, kD, kF, Activation::swiglu_clamped, true};
    c.clamp = kClamp;
    return c;
  }
  Layer(const Format& f, uint64_t seed) : ps(seed), experts(ps, "x", config()) {
    // W1/W3 x ~ 4 (rows of 256 inputs ~ 1, weights 0.25): the clamp at 7 bites on some elements.
    put(experts.w1(), f.weights(normals(kE * kF * kD, seed, 1, 0.25f), kF, kD, w1));
    put(*experts.w3(), f.weights(normals(kE * kF * kD, seed, 2, 0.25f), kF, kD, w3));
    put(experts.w2(), f.weights(normals(kE * kD * kF, seed, 3, 0.05f), kD, kF, w2));
    b1 = normals(kE * kF, seed, 4, 1.0f);
    b3 = normals(kE * kF, seed, 5, 1.0f);
    b2 = normals(kE * kD, seed, 6, 1.0f);
    set(*experts.b1(), b1);
    set(*experts.b3(), b3);
    set(*experts.b2(), b2);
  }
  static void put(Param& p, const Tensor& t) {
    p.value = t;
    p.compute = t;
  }
  static void set(Param& p, const std::vector<float>& v) {
    REQUIRE(p.value.numel() == int64_t(v.size()));
    std::memcpy(p.value.data<float>(), v.data(), v.size() * sizeof(float));
    p.refresh_compute();
  }
};

int64_t expert_of(int64_t row) {
  return std::upper_bound(kOffsets.begin(), kOffsets.end(), int32_t(row)) - kOffsets.begin() - 1;
}
bool gemv_row(int64_t row) {
  const int64_t e = expert_of(row);
  return cpu::gemv_applies(kOffsets[size_t(e) + 1] - kOffsets[size_t(e)]);
}

// out[o] = sum_j W[e, o, j] v[j] + b[e, o] in double, and the sum of |terms| (for kGamma).
void product(const std::vector<float>& w, const std::vector<float>& b, int64_t e, int64_t out,
             int64_t in, const std::vector<double>& v, std::vector<double>& y,
             std::vector<double>& size) {
  y.assign(size_t(out), 0.0);
  size.assign(size_t(out), 0.0);
  for (int64_t o = 0; o < out; ++o) {
    const float* row = w.data() + (e * out + o) * in;
    double s = b[size_t(e * out + o)], a = std::fabs(s);
    for (int64_t j = 0; j < in; ++j) {
      s += double(row[j]) * v[size_t(j)];
      a += std::fabs(double(row[j]) * v[size_t(j)]);
    }
    y[size_t(o)] = s;
    size[size_t(o)] = a;
  }
}

double clamped_swiglu(double h, double h3) {
  const double g = std::min(h, double(kClamp.limit));
  const double u = std::min(std::max(h3, -double(kClamp.limit)), double(kClamp.limit));
  return (u + 1.0) * g / (1.0 + std::exp(-double(kClamp.alpha) * g));
}

// The clamped SwiGLU's f32 error: rounding alpha g moves exp's argument by |alpha g| u, the
// sigmoid by (1 - s) of that relative; exp (within 1 ulp, kernels/activations.h), 1 + e, the
// division, g s, u + 1 and the product add 7 roundings more, each relative to its result: at most
// (|alpha g| + 8) u of |a| (u = 2^-24), plus a denormal's worth.
double activation_error(float h, double a) {
  const double g = std::min(double(h), double(kClamp.limit));
  return (std::fabs(double(kClamp.alpha) * g) + 8.0) / 16777216.0 * std::fabs(a) + 1e-37;
}

struct Run {
  Tensor y;
  nn::Experts::Saved saved;
};

// The full forward: all rows, segments kOffsets.
Run forward(const Layer& l, const Tensor& x) {
  Run r;
  r.y = l.experts.forward(x, kOffsets, &r.saved);
  return r;
}

// Decode: each row alone, a segment of one row at its expert (what one token's step runs). The
// saved intermediates are gathered into [M, F] tensors.
Run decode(const Layer& l, const Tensor& x) {
  Run r;
  r.y = Tensor::empty({kM, kD});
  r.saved.h = Tensor::empty({kM, kF});
  r.saved.h3 = Tensor::empty({kM, kF});
  r.saved.a = Tensor::empty({kM, kF});
  for (int64_t i = 0; i < kM; ++i) {
    const int64_t e = expert_of(i);
    std::vector<int32_t> offsets(size_t(kE + 1), 0);
    for (int64_t k = e + 1; k <= kE; ++k) offsets[size_t(k)] = 1;
    nn::Experts::Saved s;
    const Tensor y = l.experts.forward(x.rows(i, i + 1), offsets, &s);
    auto copy = [i](const Tensor& from, Tensor& to, int64_t n) {
      std::memcpy(to.data<float>() + i * n, from.data<float>(), size_t(n) * sizeof(float));
    };
    copy(y, r.y, kD);
    copy(s.h, r.saved.h, kF);
    copy(s.h3, r.saved.h3, kF);
    copy(s.a, r.saved.a, kF);
  }
  return r;
}

std::vector<double> as_double(const float* v, int64_t n) { return {v, v + n}; }

// Worst |got - want| / bound over a stage's elements (must be <= 1).
double worst_ratio(const float* got, const std::vector<double>& want,
                   const std::vector<double>& bound) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / bound[i]);
  return worst;
}

// Row i of run r against the double reference that rounds (or not) as its path does: h and h3
// from x, a from the run's own h and h3, y from the run's own a, each within f32's summation
// bound (the activation: within activation_error).
// Returns how far the reference that rounds the other way lies from the run's y, in units of
// that bound (large: a run on the other path would fail).
double check_row(const Format& f, const Layer& l, const Tensor& x, const Run& r, int64_t i,
                 bool rounds) {
  const int64_t e = expert_of(i);
  const std::vector<double> xe = as_double(x.data<float>() + i * kD, kD);
  const std::vector<double> xr = rounds ? f.rounded(x.data<float>() + i * kD, kD) : xe;
  std::vector<double> h, h3, y, size, bound(static_cast<size_t>(kF));
  product(l.w1, l.b1, e, kF, kD, xr, h, size);
  for (size_t j = 0; j < size.size(); ++j) bound[j] = kGamma * size[j] + 1e-30;
  CHECK(worst_ratio(r.saved.h.data<float>() + i * kF, h, bound) <= 1.0);
  product(l.w3, l.b3, e, kF, kD, xr, h3, size);
  for (size_t j = 0; j < size.size(); ++j) bound[j] = kGamma * size[j] + 1e-30;
  CHECK(worst_ratio(r.saved.h3.data<float>() + i * kF, h3, bound) <= 1.0);
  const float* hs = r.saved.h.data<float>() + i * kF;
  const float* h3s = r.saved.h3.data<float>() + i * kF;
  std::vector<double> a(static_cast<size_t>(kF));
  for (int64_t j = 0; j < kF; ++j) {
    a[size_t(j)] = clamped_swiglu(hs[j], h3s[j]);
    bound[size_t(j)] = activation_error(hs[j], a[size_t(j)]);
  }
  CHECK(worst_ratio(r.saved.a.data<float>() + i * kF, a, bound) <= 1.0);
  const float* as = r.saved.a.data<float>() + i * kF;
  const std::vector<double> ae = as_double(as, kF);
  const std::vector<double> ar = f.rounded(as, kF);
  std::vector<double> other, other_size;
  product(l.w2, l.b2, e, kD, kF, rounds ? ar : ae, y, size);
  product(l.w2, l.b2, e, kD, kF, rounds ? ae : ar, other, other_size);
  std::vector<double> ybound(static_cast<size_t>(kD));
  for (size_t j = 0; j < size.size(); ++j) ybound[j] = kGamma * size[j] + 1e-30;
  CHECK(worst_ratio(r.y.data<float>() + i * kD, y, ybound) <= 1.0);
  return worst_ratio(r.y.data<float>() + i * kD, other, ybound);
}

// The bound on |y_forward - y_decode| for a row of a wide segment, element by element, from the
// rounding alone. Decode rounds x: each input moves by at most input_move (about max|x| / 254)
// of its partner block, so h (and h3) move by at most e1 = sum over blocks of that times sum |W1|
// over the block. The clamps are 1-Lipschitz and g sigmoid(alpha g) has slope at most 1.0999 (its
// sup, for any alpha > 0), so with a = (u + 1) G(g): |da| <= e3 (|G(g)| + 1.1 e1) + |u + 1| 1.1 e1
// (g, u the forward's clamped values). y moves by sum |W2| |da| from that, plus decode's rounding
// of its own a (input_move(max|a|) a block times sum |W2| over it), plus both paths' f32
// summation (2 kGamma sums).
std::vector<double> gap_bound(const Format& f, const Layer& l, const Tensor& x, const Run& fwd,
                              const Run& dec, int64_t i) {
  const int64_t e = expert_of(i), block = f.input_block();
  // Over row `row` of w [.., n]: sum over blocks of input_move(max|v|) x sum |w|, and sum |w v|.
  auto moved = [block, &f](const float* v, int64_t n, const std::vector<float>& w, int64_t row) {
    double s = 0;
    for (int64_t b0 = 0; b0 < n; b0 += block) {
      double amax = 0, wsum = 0;
      for (int64_t j = b0; j < std::min(n, b0 + block); ++j) {
        amax = std::max(amax, std::fabs(double(v[j])));
        wsum += std::fabs(double(w[size_t(row * n + j)]));
      }
      s += f.input_move(amax) * wsum;
    }
    return s;
  };
  auto terms = [](const float* v, int64_t n, const std::vector<float>& w, int64_t row, double b) {
    double s = std::fabs(b);
    for (int64_t j = 0; j < n; ++j) s += std::fabs(double(w[size_t(row * n + j)]) * double(v[j]));
    return s;
  };
  const float* xs = x.data<float>() + i * kD;
  const float* hs = fwd.saved.h.data<float>() + i * kF;
  const float* h3s = fwd.saved.h3.data<float>() + i * kF;
  const double alpha = kClamp.alpha, limit = kClamp.limit;
  std::vector<double> da(static_cast<size_t>(kF));
  for (int64_t j = 0; j < kF; ++j) {
    const int64_t row = e * kF + j;
    // 2.5 kGamma: both paths' summations, and the rounded inputs' magnitude (<= 1 + 1/254 x's).
    const double e1 =
        moved(xs, kD, l.w1, row) + 2.5 * kGamma * terms(xs, kD, l.w1, row, l.b1[size_t(row)]);
    const double e3 =
        moved(xs, kD, l.w3, row) + 2.5 * kGamma * terms(xs, kD, l.w3, row, l.b3[size_t(row)]);
    const double g = std::min(double(hs[j]), limit);
    const double u = std::min(std::max(double(h3s[j]), -limit), limit);
    const double G = g / (1.0 + std::exp(-alpha * g));
    da[size_t(j)] = e3 * (std::fabs(G) + 1.1 * e1) + std::fabs(u + 1) * 1.1 * e1 +
                    2 * activation_error(hs[j], clamped_swiglu(hs[j], h3s[j]));
  }
  const float* ad = dec.saved.a.data<float>() + i * kF;
  std::vector<double> bound(static_cast<size_t>(kD));
  for (int64_t d = 0; d < kD; ++d) {
    double s = moved(ad, kF, l.w2, e * kD + d), terms = std::fabs(double(l.b2[size_t(e * kD + d)]));
    for (int64_t j = 0; j < kF; ++j) {
      const double w = std::fabs(double(l.w2[size_t((e * kD + d) * kF + j)]));
      s += w * da[size_t(j)];
      terms += w * std::fabs(double(ad[j]));
    }
    bound[size_t(d)] = s + 2.5 * kGamma * terms;
  }
  return bound;
}

}  // namespace

TEST_CASE(
    "block experts: forward and decode each match their own rounding, gpt-oss biases and "
    "clamp",
    "[block_weights][forward_decode]") {
  REQUIRE(cpu::gemv_applies(8));
  REQUIRE_FALSE(cpu::gemv_applies(9));
  const Format formats[] = {{"mxfp4", false, cpu::BlockFormat::mxfp4},
                            {"q8_0", true, cpu::BlockFormat::mxfp4},
                            {"q4_k", false, cpu::BlockFormat::q4_k},
                            {"q6_k", false, cpu::BlockFormat::q6_k}};
  for (const Format& f : formats) {
    for (uint64_t seed : {23, 24, 25}) {
      INFO(f.name << ", seed " << seed);
      const Layer l(f, seed);
      const Tensor x = Tensor::from_vector({kM, kD}, normals(kM * kD, seed, 7, 1.0f));
      const Run fwd = forward(l, x), dec = decode(l, x);
      double worst_other = 1e300, worst_gap = 0, clamped = 0;
      for (int64_t i = 0; i < kM; ++i) {
        INFO("row " << i << " (expert " << expert_of(i) << ")");
        const bool narrow = gemv_row(i);
        worst_other = std::min(worst_other, check_row(f, l, x, fwd, i, narrow));
        worst_other = std::min(worst_other, check_row(f, l, x, dec, i, true));
        const float* yf = fwd.y.data<float>() + i * kD;
        const float* yd = dec.y.data<float>() + i * kD;
        if (narrow) {  // the same GEMV, one row or eight: the same bits
          CHECK(std::memcmp(yf, yd, kD * sizeof(float)) == 0);
          continue;
        }
        const std::vector<double> bound = gap_bound(f, l, x, fwd, dec, i);
        for (int64_t d = 0; d < kD; ++d) {
          const double gap = std::fabs(double(yf[d]) - double(yd[d]));
          CHECK(gap <= bound[size_t(d)]);
          worst_gap = std::max(worst_gap, gap / bound[size_t(d)]);
        }
        for (int64_t j = 0; j < kF; ++j)
          clamped += fwd.saved.h.data<float>()[i * kF + j] > kClamp.limit ||
                     std::fabs(fwd.saved.h3.data<float>()[i * kF + j]) > kClamp.limit;
      }
      INFO("forward vs decode on wide rows: worst gap " << worst_gap
                                                        << " of its bound; the "
                                                           "other path's reference at least "
                                                        << worst_other << " f32 bounds away");
      CHECK(worst_gap > 0);       // the paths do differ there: the inputs were rounded
      CHECK(worst_other > 10.0);  // the two references are told apart, row by row
      CHECK(clamped > 0);         // the clamp bit
    }
  }
}
