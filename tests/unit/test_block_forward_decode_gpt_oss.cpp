// A gpt-oss model holding its experts as MXFP4 blocks (import-hf --keep-mxfp4; g2's report, issue
// 44/43): its full forward and its cached decode, each against a double reference that rounds the
// experts' inputs as that path does (test_block_forward_decode.cpp states the paths: an expert
// segment of <= 8 rows goes to the GEMV, which rounds the inputs of W1/W3 and of W2 to ggml's q8_0
// blocks; a larger one widens the weights and multiplies f32 rows). Decode runs one token a step,
// so every segment is the GEMV's; the full forward of 12 tokens (top-2 of 4 experts: 24 rows) gives
// some expert more than 8 rows in some layer, and its rows are not rounded.
// The references are g2's attention, norms and router (support/hf_gpt_oss.h) with the experts
// here (the clamped SwiGLU with b1, b3, b2), their inputs rounded by the library's own quantiser
// where the path rounds. One more effect, found here (seed 25): an input lying within ~1e-4 of a
// step from a rounding boundary may round the other way in one path than in the other (or the
// reference), since their f32 sums differ in the last bits (the full forward's dense products run
// the tiled sgemm above 8 rows, decode's the GEMV), and one such element moves a logit by ~1% of
// the logits' scale (nudging it in the reference brought seed 25 back to 1.4e-6). So each
// reference marks the first position whose rounding comes within kAmbiguous of a boundary; before
// it each path lies within 1e-4 of the logits' scale of its reference (f32's rounding, as
// test_hf_gpt_oss.cpp argues), after it within 2e-2 (the documented rounding bound). The forward
// and decode logits differ, element by element, by at most what the rounding moves the references
// apart (computed exactly, in double, through the whole model) plus those tolerances.
// Shapes: V vocabulary, D hidden, F expert hidden, E experts, L layers, T tokens.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/quant_blocks.h"
#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "support/hf_gpt_oss.h"

using namespace moe;
using namespace moe::test::hf;

namespace {

constexpr int64_t kT = 12;

// The smallest distance, in steps, from a rounding boundary that the paths and the references are
// sure to round alike: the model's f32 inputs to the quantiser and the reference's doubles differ
// by about 1e-6 of their size (the logits agree to 5e-7 where no rounding is near a boundary), and
// an input is at most 127 steps, so 2.5e-4 of a step (twice 127e-6) leaves both on one side.
constexpr double kAmbiguous = 2.5e-4;

// x as the GEMV multiplies it against MXFP4 weights: ggml's q8_0 blocks of the f32 values.
// `near` is set when an element lies within kAmbiguous of a rounding boundary (q = round(x / d),
// d = max|x| / 127 of its block of 32): the f32 path may round it the other way, moving a logit by
// up to about 1% of the logits' scale (seen: seed 25, 4.6e-5 of a step, 0.9%).
Vec rounded(const Vec& x, bool& near) {
  const int64_t n = int64_t(x.size());
  for (int64_t b = 0; b < n; b += 32) {
    double amax = 0;
    for (int64_t j = b; j < b + 32; ++j) amax = std::max(amax, std::fabs(x[size_t(j)]));
    const double id = amax > 0 ? 127.0 / amax : 0.0;
    for (int64_t j = b; j < b + 32; ++j) {
      const double v = x[size_t(j)] * id;
      near = near || std::fabs(v - std::floor(v) - 0.5) < kAmbiguous;
    }
  }
  const std::vector<float> f(x.begin(), x.end());
  std::vector<uint8_t> bytes(size_t(cpu::block_row_bytes(cpu::BlockFormat::q8_0, n)));
  std::vector<float> back(static_cast<size_t>(n));
  cpu::quantize_row(cpu::BlockFormat::q8_0, f.data(), n, bytes.data());
  cpu::dequantize_row(cpu::BlockFormat::q8_0, bytes.data(), n, back.data());
  return Vec(back.begin(), back.end());
}

// The top-k of layer `p`'s router for x (support/hf_gpt_oss.h's order), and the softmax weights.
std::vector<std::pair<int64_t, double>> route(const TinyGptOss& t,
                                              const std::map<std::string, Tensor>& w,
                                              const std::string& p, const Vec& x) {
  const Vec br = values(w, p + "mlp.router.bias");
  const Vec logits = linear(values(w, p + "mlp.router.weight"), x, t.E, &br);
  std::vector<int64_t> order(static_cast<size_t>(t.E));
  for (int64_t e = 0; e < t.E; ++e) order[size_t(e)] = e;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  double sum = 0;
  for (int64_t j = 0; j < t.k; ++j)
    sum += std::exp(logits[size_t(order[size_t(j)])] - logits[size_t(order[0])]);
  std::vector<std::pair<int64_t, double>> out;
  for (int64_t j = 0; j < t.k; ++j) {
    const int64_t e = order[size_t(j)];
    out.push_back({e, std::exp(logits[size_t(e)] - logits[size_t(order[0])]) / sum});
  }
  return out;
}

// One expert of layer `p` on x (rounded where the path rounds): the clamped SwiGLU with b1, b3, b2.
Vec expert(const TinyGptOss& t, const std::map<std::string, Tensor>& w, const std::string& p,
           int64_t e, const Vec& x_in, bool round, bool& near) {
  const std::string m = p + "mlp.experts.";
  const Vec gu = values(w, m + "gate_up_proj"), gub = values(w, m + "gate_up_proj_bias");
  const Vec dn = values(w, m + "down_proj"), dnb = values(w, m + "down_proj_bias");
  const Vec x = round ? rounded(x_in, near) : x_in;
  const int64_t F2 = 2 * t.F;
  Vec act(static_cast<size_t>(t.F));
  for (int64_t f = 0; f < t.F; ++f) {
    double gate = gub[size_t(e * F2 + 2 * f)], up = gub[size_t(e * F2 + 2 * f + 1)];
    for (int64_t d = 0; d < t.D; ++d) {
      gate += x[size_t(d)] * gu[size_t((e * t.D + d) * F2 + 2 * f)];
      up += x[size_t(d)] * gu[size_t((e * t.D + d) * F2 + 2 * f + 1)];
    }
    gate = std::min(gate, t.limit);
    up = std::clamp(up, -t.limit, t.limit);
    act[size_t(f)] = (up + 1.0) * gate / (1.0 + std::exp(-t.alpha * gate));
  }
  if (round) act = rounded(act, near);
  Vec y(static_cast<size_t>(t.D));
  for (int64_t d = 0; d < t.D; ++d) {
    y[size_t(d)] = dnb[size_t(e * t.D + d)];
    for (int64_t f = 0; f < t.F; ++f)
      y[size_t(d)] += act[size_t(f)] * dn[size_t((e * t.F + f) * t.D + d)];
  }
  return y;
}

struct Reference {
  Vec logits;          // [T, V]
  int64_t wide = 0;    // (layer, expert) segments left unrounded
  int64_t clear = kT;  // positions before the first rounding near a boundary (causal: safe)
};

// Logits for one sequence, rounding as decode does (every expert's inputs), or as the full forward
// does (`forward`: only an expert holding at most kGemvMaxRows of the sequence's rows in its
// layer, by this reference's own routing).
Reference reference(const TinyGptOss& t, const std::map<std::string, Tensor>& w,
                    const std::vector<int32_t>& ids, bool forward) {
  Reference out;
  const Vec embed = values(w, "model.embed_tokens.weight");
  std::vector<Vec> h(static_cast<size_t>(kT));
  for (int64_t r = 0; r < kT; ++r)
    h[size_t(r)] =
        Vec(embed.begin() + ids[size_t(r)] * t.D, embed.begin() + (ids[size_t(r)] + 1) * t.D);
  for (int64_t l = 0; l < t.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    gpt_oss_attention(t, w, p, l, h, 1, kT);
    const Vec ln2 = values(w, p + "post_attention_layernorm.weight");
    std::vector<Vec> x(static_cast<size_t>(kT));
    std::vector<std::vector<std::pair<int64_t, double>>> chosen(static_cast<size_t>(kT));
    std::vector<int64_t> rows(static_cast<size_t>(t.E), 0);
    for (int64_t r = 0; r < kT; ++r) {
      x[size_t(r)] = rms_norm(h[size_t(r)], ln2, t.eps);
      chosen[size_t(r)] = route(t, w, p, x[size_t(r)]);
      for (const auto& c : chosen[size_t(r)]) ++rows[size_t(c.first)];
    }
    for (int64_t e = 0; e < t.E; ++e) out.wide += forward && !cpu::gemv_applies(rows[size_t(e)]);
    for (int64_t r = 0; r < kT; ++r)
      for (const auto& [e, weight] : chosen[size_t(r)]) {
        bool near = false;
        const bool round = !forward || cpu::gemv_applies(rows[size_t(e)]);
        const Vec y = expert(t, w, p, e, x[size_t(r)], round, near);
        if (near) out.clear = std::min(out.clear, r);
        for (int64_t i = 0; i < t.D; ++i) h[size_t(r)][size_t(i)] += weight * y[size_t(i)];
      }
  }
  const Vec final_norm = values(w, "model.norm.weight"), head = values(w, "lm_head.weight");
  for (int64_t r = 0; r < kT; ++r) {
    const Vec logits = linear(head, rms_norm(h[size_t(r)], final_norm, t.eps), t.V);
    out.logits.insert(out.logits.end(), logits.begin(), logits.end());
  }
  return out;
}

// max |a - b| over positions [from, to), in units of `scale`.
double worst(const std::vector<float>& a, const Vec& b, int64_t V, int64_t from, int64_t to,
             double scale) {
  double d = 0;
  for (int64_t i = from * V; i < to * V; ++i)
    d = std::max(d, std::fabs(double(a[size_t(i)]) - b[size_t(i)]));
  return d / scale;
}

}  // namespace

TEST_CASE("gpt_oss: kept MXFP4 experts, forward and cached decode each match their rounding",
          "[hf][gpt_oss][mxfp4][forward_decode]") {
  test::ScratchDir dir("gpt-oss-forward-decode");
  const TinyGptOss t;
  int64_t wide_segments = 0, forward_clear = 0, decode_clear = 0;
  for (uint64_t seed = 23; seed < 31; ++seed) {
    INFO("seed " << seed);
    const auto packed = gpt_oss_mxfp4(t, seed);
    const std::string hf = dir.file(std::to_string(seed));
    write_hf_dir(hf, gpt_oss_mxfp4_config(t), packed, 1);
    io::HfImportOptions options;
    options.keep_mxfp4 = true;
    const std::string path = hf + ".h5";
    io::save_checkpoint(path, test::import_hf_held(hf, options));
    infer::LoadedModel m = infer::load_model(path);
    const std::vector<int32_t> ids = random_token_ids(kT, int32_t(t.V), seed);
    const std::vector<float> full = m.model->logits(Tensor::from_vector({1, kT}, ids)).to_vector();
    KVCache cache = m.model->make_cache(1);
    std::vector<float> decoded;
    for (int64_t i = 0; i < kT; ++i) {
      const Tensor id = Tensor::from_vector({1, 1}, std::vector<int32_t>{ids[size_t(i)]});
      const std::vector<float> l = m.model->forward_cached(id, cache).to_vector();
      decoded.insert(decoded.end(), l.begin(), l.end());
    }

    const auto dense = gpt_oss_dequantized(packed);
    const Reference dec = reference(t, dense, ids, false), fwd = reference(t, dense, ids, true);
    wide_segments += fwd.wide;
    forward_clear += fwd.clear;
    decode_clear += dec.clear;
    double scale = 0;
    for (double v : dec.logits) scale = std::max(scale, std::fabs(v));
    REQUIRE(scale > 0.1);
    INFO("forward: " << fwd.wide << " unrounded segments, " << fwd.clear << " clear positions, "
                     << worst(full, fwd.logits, t.V, 0, kT, scale)
                     << " from its reference; decode: " << dec.clear << " clear, "
                     << worst(decoded, dec.logits, t.V, 0, kT, scale) << "; references "
                     << relative_gap(fwd.logits, dec.logits) << " apart");
    // Before any rounding near a boundary: each path within 1e-4 of the scale of the reference
    // that rounds as it does (f32's rounding, test_hf_gpt_oss.cpp).
    CHECK(worst(full, fwd.logits, t.V, 0, fwd.clear, scale) < 1e-4);
    CHECK(worst(decoded, dec.logits, t.V, 0, dec.clear, scale) < 1e-4);
    // After one: a rounding the other way moves a logit by about 1% of the scale; 2e-2 (the
    // documented bound of the mxfp4 kernels' rounding, test_hf_gpt_oss.cpp) still fails on any
    // mistaken feature, segment or bias (each moves the logits by O(1)).
    CHECK(worst(full, fwd.logits, t.V, fwd.clear, kT, scale) < 2e-2);
    CHECK(worst(decoded, dec.logits, t.V, dec.clear, kT, scale) < 2e-2);
    // The gap between the paths, element by element: what the rounding moves the references
    // apart (exactly, in double), plus both paths' tolerances.
    const int64_t clear = std::min(fwd.clear, dec.clear);
    for (int64_t i = 0; i < kT * t.V; ++i) {
      const double tolerance = i < clear * t.V ? 2e-4 : 4e-2;
      CHECK(std::fabs(double(full[size_t(i)]) - double(decoded[size_t(i)])) <=
            std::fabs(fwd.logits[size_t(i)] - dec.logits[size_t(i)]) + tolerance * scale);
    }
    if (fwd.wide > 0) CHECK(relative_gap(fwd.logits, dec.logits) > 1e-3);  // told apart
  }
  CHECK(wide_segments > 0);    // the full forward did take the unrounded path
  CHECK(forward_clear >= 16);  // and the tight comparisons covered enough positions
  CHECK(decode_clear >= 16);
}
