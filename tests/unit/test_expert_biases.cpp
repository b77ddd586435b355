// gpt-oss's MoE layer at the nn level: gated experts with biases on gate, up and down (b1, b3, b2),
// the clamped SwiGLU, and a router with a learned logit bias (softmax over the k chosen logits).
// The fast layer against the double reference (nn/moe_reference.cpp, written from the formulas),
// the gate weights against a softmax over the top-k logits computed here, every parameter's
// gradient by central differences, the inference paths (a token at a time through the GEMV, by
// blocks) against the training forward, an expert store serving one expert at a time (training
// offload), and whole layers of bf16 or Q8_0 expert matrices (the inference ring's path).
// Shapes: N tokens, D model width, F expert hidden width, E experts, k top-k, M kept rows.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>

#include "backend/cpu/gemv.h"
#include "moe/nn/moe_reference.h"
#include "moe/ops/core.h"
#include "support/cuda.h"
#include "support/gradcheck.h"

using namespace moe;
using namespace moe::nn;

namespace {

// max |a - b| / max |b|
double rel_error(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<float> av = a.to_vector(), bv = b.to_vector();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(av[i]) - bv[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(bv[i])));
  }
  REQUIRE(scale > 0);
  return diff / scale;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

MoEConfig gpt_oss_config(int64_t D, int64_t F, int64_t E, int64_t k, float limit,
                         float capacity_factor = 0.0f) {
  MoEConfig c;
  c.router.d_model = D;
  c.router.num_experts = E;
  c.router.top_k = k;
  c.router.normalize_topk = true;  // softmax over all E, renormalised over the k: gpt-oss's
  c.router.logit_bias = true;      // softmax over the k chosen logits
  c.router.capacity_factor = capacity_factor;
  c.experts = ExpertsConfig{E, D, F, Activation::swiglu_clamped, true};
  c.experts.clamp = SwigluClamp{1.702f, limit};
  return c;
}

// How many pre-activations a clamp bites on: gate h > limit, up |h3| > limit.
std::pair<int64_t, int64_t> clamped(const Experts::Saved& s, float limit) {
  int64_t gate = 0, up = 0;
  for (float v : s.h.to_vector()) gate += v > limit;
  for (float v : s.h3.to_vector()) up += std::fabs(v) > limit;
  return {gate, up};
}

}  // namespace

TEST_CASE("gpt-oss experts and router: the fast layer equals the double reference",
          "[expert-biases]") {
  struct Case {
    const char* name;
    int64_t experts, top_k;
    float capacity_factor;
  };
  const int64_t N = 40, D = 16, F = 24;
  const float limit = 0.7f;  // small, so that both clamps bite on random data (checked)
  const float aux_scale = 0.5f, z_scale = 0.05f;
  for (const Case& c : {Case{"k2 dropless", 6, 2, 0.0f}, Case{"k2 capacity", 6, 2, 0.9f},
                        Case{"k1 E4 dropless", 4, 1, 0.0f}, Case{"k4 E8 dropless", 8, 4, 0.0f}}) {
    INFO(c.name);
    const MoEConfig config = gpt_oss_config(D, F, c.experts, c.top_k, limit, c.capacity_factor);
    ParamSet ps(41);
    MoELayer layer(ps, "blocks.0.moe", config);
    REQUIRE(ps.find("blocks.0.moe.experts.b3") != nullptr);
    REQUIRE(ps.find("blocks.0.moe.router.logit_bias") != nullptr);
    test::randomize_moe_params(ps, D, F, 0.3f, 5);
    Tensor x = test::random_tensor({N, D}, 42), dy = test::random_tensor({N, D}, 43);
    const RouterStep step{7, 1, 0, true};
    MoELayer::Saved saved;
    MoEStats stats;
    Tensor y = layer.forward(x, step, &saved, &stats);
    ps.zero_grad();
    Tensor dx = layer.backward(dy, saved, aux_scale, z_scale);
    const MoEReferenceResult ref =
        moe_reference(ps, "blocks.0.moe", config, x, step, dy, aux_scale, z_scale);
    const auto [gate_clamped, up_clamped] = clamped(saved.experts, limit);
    CHECK(gate_clamped > 0);
    CHECK(up_clamped > 0);
    if (c.capacity_factor > 0) REQUIRE(stats.dropped > 0);
    REQUIRE(stats.load == ref.stats.load);
    REQUIRE(stats.tokens_per_expert == ref.stats.tokens_per_expert);
    REQUIRE(stats.aux_loss == Approx(ref.aux_loss).epsilon(1e-5));
    REQUIRE(stats.z_loss == Approx(ref.z_loss).epsilon(1e-5));
    // f32 sums of D and F terms against double: 1e-5 of the largest value.
    CHECK(rel_error(y, ref.y) < 1e-5);
    CHECK(rel_error(dx, ref.dx) < 1e-5);
    REQUIRE(ref.grads.size() == ps.size());
    for (Param* p : ps.all()) {
      INFO(p->name);
      REQUIRE(ref.grads.count(p->name) == 1);
      CHECK(rel_error(p->grad, ref.grads.at(p->name)) < 1e-5);
    }

    // gpt-oss's gates: softmax over the k largest of x W^T + b, in double, here. The layer's f32
    // logits (sums of D products, |logit| up to ~5) are off by ~1e-6, which moves each gate by that
    // much relative: 1e-5.
    const std::vector<float> xs = x.to_vector(),
                             w = ps.find("blocks.0.moe.router.weight")->w().to_vector(),
                             b = ps.find("blocks.0.moe.router.logit_bias")->w().to_vector();
    const std::vector<int32_t> idx = test::int_values(saved.router.topk_idx);
    const std::vector<float> gates = saved.router.topk_weight.to_vector();
    const int64_t E = c.experts, k = c.top_k;
    for (int64_t t = 0; t < N; ++t) {
      std::vector<std::pair<double, int64_t>> logits;
      for (int64_t e = 0; e < E; ++e) {
        double s = b[e];
        for (int64_t d = 0; d < D; ++d) s += static_cast<double>(xs[t * D + d]) * w[e * D + d];
        logits.push_back({-s, e});  // ascending order = descending logit
      }
      std::sort(logits.begin(), logits.end());
      double z = 0;
      for (int64_t j = 0; j < k; ++j) z += std::exp(-logits[j].first + logits[0].first);
      for (int64_t j = 0; j < k; ++j) {
        INFO("token " << t << " choice " << j);
        REQUIRE(idx[t * k + j] == logits[j].second);
        CHECK(gates[t * k + j] ==
              Approx(std::exp(-logits[j].first + logits[0].first) / z).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("gpt-oss experts and router: every parameter's gradient by central differences",
          "[expert-biases]") {
  const int64_t N = 12, D = 8, F = 10, E = 4, k = 2;
  const float aux_scale = 0.5f, z_scale = 0.05f;
  const double eps = 1e-3;
  // Central differences across a kink of the clamps measure the mean of the one-sided slopes, so
  // the limit is placed in the widest gap between the pre-activations (gate h, and up h3 on both
  // sides) within [0.5, 1.5], and that gap must exceed what a perturbation moves them: eps times
  // the largest |x| or |W1|, |W3| entry (one element of x or W moves h by eps times its partner),
  // three times over for room.
  auto build = [&](ParamSet& ps, float limit) {
    auto layer = std::make_unique<MoELayer>(ps, "blocks.1.moe", gpt_oss_config(D, F, E, k, limit));
    test::randomize_moe_params(ps, D, F, 0.3f, 0x6f55);
    return layer;
  };
  Tensor x = test::random_tensor({N, D}, 61), r = test::random_tensor({N, D}, 62);
  const RouterStep step{3, 2, 1, true};
  float limit = 0;
  {
    ParamSet probe_ps(60);
    auto probe = build(probe_ps, 1.0f);
    MoELayer::Saved s;
    probe->forward(x, step, &s, nullptr);
    std::vector<double> kinks;
    for (float v : s.experts.h.to_vector()) kinks.push_back(v);
    for (float v : s.experts.h3.to_vector()) kinks.push_back(std::fabs(v));
    kinks.push_back(0.5);
    kinks.push_back(1.5);
    std::sort(kinks.begin(), kinks.end());
    double gap = 0;
    for (size_t i = 0; i + 1 < kinks.size(); ++i)
      if (kinks[i] >= 0.5 && kinks[i + 1] <= 1.5 && kinks[i + 1] - kinks[i] > gap) {
        gap = kinks[i + 1] - kinks[i];
        limit = static_cast<float>((kinks[i] + kinks[i + 1]) / 2);
      }
    double reach = 1;
    for (const char* name : {"blocks.1.moe.experts.w1", "blocks.1.moe.experts.w3"})
      for (float v : probe_ps.find(name)->w().to_vector())
        reach = std::max<double>(reach, std::fabs(v));
    for (float v : x.to_vector()) reach = std::max<double>(reach, std::fabs(v));
    INFO("gap " << gap << " reach " << reach);
    REQUIRE(gap / 2 > 3 * eps * reach);
  }
  ParamSet ps(60);
  auto layer = build(ps, limit);
  MoELayer::Saved saved;
  layer->forward(x, step, &saved, nullptr);
  const auto [gate_clamped, up_clamped] = clamped(saved.experts, limit);
  REQUIRE(gate_clamped > 0);
  REQUIRE(up_clamped > 0);
  const Tensor base_idx = saved.router.topk_idx.clone();
  bool routing_changed = false;
  auto loss = [&] {
    MoELayer::Saved s;
    MoEStats st;
    Tensor y = layer->forward(x, step, &s, &st);
    routing_changed = routing_changed || !same_bits(s.router.topk_idx, base_idx);
    return test::dot(y, r) + aux_scale * st.aux_loss + z_scale * st.z_loss;
  };
  ps.zero_grad();
  Tensor dx = layer->backward(r, saved, aux_scale, z_scale);
  // f32 forward over 2 eps (~1e-7 x |loss terms| / 2e-3) and O(eps^2) truncation: 1e-2 as the
  // other layer gradient checks (tests/gradcheck/test_moe_layer.cpp).
  MOE_REQUIRE_GRAD(test::check_gradient(x, dx, loss, eps), 1e-2);
  REQUIRE(ps.size() == 8u);  // router weight, logit bias; w1, w2, w3, b1, b2, b3
  for (Param* p : ps.all()) {
    INFO(p->name);
    MOE_REQUIRE_GRAD(test::check_gradient(p->value, p->grad, loss, eps), 1e-2);
  }
  REQUIRE_FALSE(routing_changed);
}

TEST_CASE("gpt-oss experts: decoding a token at a time and by blocks equals the training forward",
          "[expert-biases]") {
  const int64_t N = 24, D = 32, F = 48, E = 8, k = 4;
  const float limit = 0.8f;
  const MoEConfig config = gpt_oss_config(D, F, E, k, limit);
  ParamSet ps(70);
  MoELayer layer(ps, "blocks.0.moe", config);
  test::randomize_moe_params(ps, D, F, 0.3f, 71);
  Tensor x = test::random_tensor({N, D}, 72);
  MoELayer::Saved saved;
  const Tensor y_train = layer.forward(x, RouterStep{1, 0, 0, true}, &saved, nullptr);
  const auto [gate_clamped, up_clamped] = clamped(saved.experts, limit);
  REQUIRE(gate_clamped > 0);
  REQUIRE(up_clamped > 0);
  const Tensor ref = moe_reference(ps, "blocks.0.moe", config, x, RouterStep{1, 0, 0, true}).y;
  // A token at a time: every expert segment is one row, which the CPU grouped GEMM hands to the
  // decode GEMV (another summation order than the tiled GEMM: equal to f32 rounding, 1e-5).
  Tensor y_decode = Tensor::empty({N, D});
  for (int64_t t = 0; t < N; ++t) {
    Tensor yt = layer.forward(x.rows(t, t + 1), RouterStep{1, 0, 0, false}, nullptr, nullptr);
    y_decode.rows(t, t + 1).copy_from(yt);
  }
  CHECK(rel_error(y_decode, y_train) < 1e-5);
  CHECK(rel_error(y_decode, ref) < 1e-5);
  // By blocks of 5 tokens (inference on long prompts): each block's rows are its own tokens'.
  RouterStep blocks{1, 0, 0, false};
  blocks.expert_block_tokens = 5;
  const Tensor y_blocks = layer.forward(x, blocks, nullptr, nullptr);
  CHECK(rel_error(y_blocks, y_train) < 1e-5);
  // The batch in inference mode is the training forward, bit for bit (no jitter, same calls).
  CHECK(same_bits(layer.forward(x, RouterStep{1, 0, 0, false}, nullptr, nullptr), y_train));
}

namespace {

// An expert store that serves one expert at a time from tensors it copies from a resident model's
// parameters of the same names (each expert's rows as a group of one): the protocol nn::Experts
// runs for offloaded training, with the b3 bias travelling beside the others.
class CopyStore : public ExpertStore {
 public:
  explicit CopyStore(const ParamSet& resident) : resident_(resident) {}
  int add_layer(const ExpertParams& params) override {
    for (Param* p : params.fields()) {
      if (!p) {
        values_.emplace_back();
        grads_.emplace_back();
        continue;
      }
      values_.push_back(resident_.find(p->name)->w().clone());
      grads_.push_back(Tensor::zeros(p->shape));
      names_.push_back(p->name);
    }
    return 0;
  }
  void request(int, std::span<const int32_t>, std::span<const int32_t>, Pass) override {}
  ExpertTensors acquire(int, int expert) override { return rows(values_, expert); }
  ExpertTensors gradients(int, int expert) override { return rows(grads_, expert); }
  void release(int, int) override {}
  void gradient_done(int, int) override {}
  const Tensor& grad(const std::string& name) const {
    for (size_t f = 0, n = 0; f < values_.size(); ++f)
      if (values_[f].defined() && names_[n++] == name) return grads_[f];
    throw Error("no " + name);
  }
  std::vector<std::string> names_;

 private:
  static ExpertTensors rows(std::vector<Tensor>& t, int expert) {
    ExpertTensors out;
    const auto fields = out.fields();
    for (size_t f = 0; f < t.size(); ++f)
      if (t[f].defined()) *fields[f] = t[f].rows(expert, expert + 1);
    return out;
  }
  const ParamSet& resident_;
  std::vector<Tensor> values_, grads_;
};

}  // namespace

TEST_CASE("gpt-oss experts: an expert store moves b3 with the others, bitwise the resident path",
          "[expert-biases]") {
  const int64_t D = 12, F = 16, E = 4;
  const std::vector<int32_t> offsets{0, 5, 5, 11, 19};
  ExpertsConfig config{E, D, F, Activation::swiglu_clamped, true};
  config.clamp = SwigluClamp{1.702f, 0.8f};
  ParamSet resident_ps(80);
  Experts resident(resident_ps, "blocks.0.moe.experts", config);
  test::randomize_moe_params(resident_ps, D, F, 0.3f, 81);
  CopyStore store(resident_ps);
  ParamSet store_ps(80);
  Experts offloaded(store_ps, "blocks.0.moe.experts", config, &store);
  REQUIRE(store.names_.size() == 6u);  // w1 w2 w3 b1 b2 b3
  Tensor x = test::random_tensor({19, D}, 82), dy = test::random_tensor({19, D}, 83);
  Experts::Saved s1, s2;
  const Tensor y1 = resident.forward(x, offsets, &s1);
  const Tensor y2 = offloaded.forward(x, offsets, &s2);
  REQUIRE(same_bits(y1, y2));
  resident_ps.zero_grad();
  const Tensor dx1 = resident.backward(dy, s1);
  const Tensor dx2 = offloaded.backward(dy, s2);
  REQUIRE(same_bits(dx1, dx2));
  for (Param* p : resident_ps.all()) {
    INFO(p->name);
    REQUIRE(ops::sum_squares(p->grad) > 0);
    CHECK(same_bits(p->grad, store.grad(p->name)));
  }
}

TEST_CASE("gpt-oss experts: shared experts and dense MLPs refuse the clamped SwiGLU by name",
          "[expert-biases]") {
  MoEConfig config = gpt_oss_config(8, 8, 4, 2, 7.0f);
  config.shared_ff = 8;
  ParamSet ps(1);
  REQUIRE_THROWS_WITH(MoELayer(ps, "blocks.0.moe", config),
                      Catch::Contains("shared expert") && Catch::Contains("clamped SwiGLU"));
  ExpertsConfig bad{4, 8, 8, Activation::swiglu_clamped, true};
  bad.clamp.limit = -1.0f;
  ParamSet ps2(2);
  REQUIRE_THROWS_WITH(Experts(ps2, "blocks.0.moe.experts", bad),
                      Catch::Contains("positive finite limit"));
}

namespace {

// A store that serves whole layers (as the inference ring does) from the tensors it is given:
// 16-bit expert matrices and f32 biases.
class LayerStore : public ExpertStore {
 public:
  explicit LayerStore(ExpertTensors tensors) : tensors_(std::move(tensors)) {}
  int add_layer(const ExpertParams&) override { return 0; }
  void request(int, std::span<const int32_t>, std::span<const int32_t>, Pass) override {}
  ExpertTensors acquire(int, int) override { throw Error("whole layers only"); }
  ExpertTensors gradients(int, int) override { throw Error("inference only"); }
  void release(int, int) override {}
  void gradient_done(int, int) override {}
  bool whole_layers() const override { return true; }
  ExpertTensors acquire_layer(int) override { return tensors_; }
  void release_layer(int) override {}

 private:
  ExpertTensors tensors_;
};

}  // namespace

TEST_CASE("gpt-oss experts: bf16 expert matrices served whole give the f32 model's bits",
          "[expert-biases]") {
  const int64_t D = 16, F = 24, E = 4;
  ExpertsConfig config{E, D, F, Activation::swiglu_clamped, true};
  config.clamp = SwigluClamp{1.702f, 0.8f};
  ParamSet ps(90);
  Experts resident(ps, "blocks.0.moe.experts", config);
  test::randomize_moe_params(ps, D, F, 0.3f, 91);
  ExpertTensors held;
  for (Param* p : {&resident.w1(), &resident.w2(), resident.w3()}) {  // bf16-valued f32 weights
    p->value.copy_from(p->value.to(DType::bf16).to(DType::f32));
    p->refresh_compute();
  }
  held.w1 = resident.w1().w().to(DType::bf16);
  held.w2 = resident.w2().w().to(DType::bf16);
  held.w3 = resident.w3()->w().to(DType::bf16);
  held.b1 = resident.b1()->w();
  held.b2 = resident.b2()->w();
  held.b3 = resident.b3()->w();
  LayerStore store(held);
  ParamSet served_ps(90);
  Experts served(served_ps, "blocks.0.moe.experts", config, &store);
  // Decode (a row or two an expert: the GEMV, which widens bf16 exactly) and a prompt (the tiled
  // GEMM on widened copies): the same operations on the same values as the f32 model.
  for (const std::vector<int32_t>& offsets :
       {std::vector<int32_t>{0, 1, 1, 3, 4}, std::vector<int32_t>{0, 9, 30, 30, 41}}) {
    const int32_t M = offsets.back();
    INFO("rows " << M);
    Tensor x = test::random_tensor({M, D}, 92 + M);
    Experts::Saved saved;
    const Tensor want = resident.forward(x, offsets, &saved);
    REQUIRE(same_bits(served.forward(x, offsets, nullptr), want));
    const auto [gate_clamped, up_clamped] = clamped(saved, config.clamp.limit);
    CHECK(gate_clamped + up_clamped > 0);
  }
}

namespace {

// An f32 expert matrix [E,R,C] as Q8_0 (the kernels' DType::q8_0 row groups), and the parameter
// set to the dequantised values (exact in f32) so that the f32 model multiplies the same weights.
Tensor to_q8_0(Param& p) {
  const Shape s = p.value.shape();
  const int64_t rows = s[0] * s[1], C = s[2], bytes = cpu::q8_row_bytes(C);
  Tensor q = Tensor::empty({s[0], s[1], bytes}, DType::u8);
  std::vector<float> dequantised(static_cast<size_t>(rows * C));
  const float* w = p.value.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    cpu::quantize_q8_0_row(w + r * C, C, q.data<uint8_t>() + r * bytes);
    cpu::dequantize_q8_0_row(q.data<uint8_t>() + r * bytes, C, dequantised.data() + r * C);
  }
  p.value.copy_from(Tensor::from_vector(s, dequantised));
  p.refresh_compute();
  return cpu::pack_q8_0(q, C);
}

}  // namespace

TEST_CASE("gpt-oss experts: Q8_0 expert matrices apply the clamped SwiGLU and the biases",
          "[expert-biases]") {
  const int64_t D = 64, F = 96, E = 4;  // whole Q8_0 blocks of 32
  ExpertsConfig config{E, D, F, Activation::swiglu_clamped, true};
  config.clamp = SwigluClamp{1.702f, 0.8f};
  ParamSet ps(95);
  Experts resident(ps, "blocks.0.moe.experts", config);
  test::randomize_moe_params(ps, D, F, 0.3f, 96);
  ExpertTensors held;
  held.w1 = to_q8_0(resident.w1());
  held.w2 = to_q8_0(resident.w2());
  held.w3 = to_q8_0(*resident.w3());
  held.b1 = resident.b1()->w();
  held.b2 = resident.b2()->w();
  held.b3 = resident.b3()->w();
  LayerStore store(held);
  ParamSet served_ps(95);
  Experts served(served_ps, "blocks.0.moe.experts", config, &store);
  // A prompt: the tiled GEMM on the dequantised (widened) experts, the f32 model's bits.
  const std::vector<int32_t> prompt{0, 12, 30, 30, 41};
  Tensor xp = test::random_tensor({41, D}, 97);
  Experts::Saved saved;
  const Tensor want_prompt = resident.forward(xp, prompt, &saved);
  REQUIRE(same_bits(served.forward(xp, prompt, nullptr), want_prompt));
  const auto [gate_clamped, up_clamped] = clamped(saved, config.clamp.limit);
  CHECK(gate_clamped > 0);
  CHECK(up_clamped > 0);
  // Decode: the GEMV multiplies 8-bit input rows (gemv.h), each element off by at most half its
  // block's step, max|x| / 254: ~0.4% of a row's size through W1/W3, then again through W2. The
  // clamps and the activation are Lipschitz (slopes below ~1.2 at these sizes), so the outputs
  // stay within ~1% of their scale; 3e-2 leaves room, and a missing bias or a wrong activation
  // (changes of order one) still fails.
  const std::vector<int32_t> decode{0, 1, 1, 3, 4};
  Tensor xd = test::random_tensor({4, D}, 98);
  const Tensor want = resident.forward(xd, decode, nullptr);
  const Tensor got = served.forward(xd, decode, nullptr);
  CHECK(rel_error(got, want) < 3e-2);
  CHECK_FALSE(same_bits(got, want));  // the 8-bit input path did run
}
