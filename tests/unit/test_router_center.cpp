// Router centring (issue 20's routing fix, RouterConfig::center): the projection
// W' = W - C (W c) c^T / |c|^2 (exact properties on hand-made and random values), a centred
// router's logits moving alike for every expert when a token moves along c (so its routing
// ignores the shared part of the stream), the running-mean update from hand-made sums, a training
// step applying exactly the update its statistics call for, the first step's calibration (a
// near-uniform load where plain routers' is not; its passes stopped after a layer see the full
// pass's inputs), a checkpoint carrying the centers through a resume and --init, --grad-accum
// agreeing with one pass, and exports writing W' as a plain router.
// Shapes: E experts, D model width, N tokens.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/io/hf_checkpoint.h"
#include "moe/nn/router.h"
#include "moe/train/trainer.h"
#include "support/gradcheck.h"
#include "support/hf_families.h"
#include "support/models.h"
#include "support/run.h"
#include "support/state.h"
#include "support/training.h"

using namespace moe;
using namespace moe::nn;

namespace {

std::vector<float> host_values(const Tensor& t) {
  return t.to(Device{}).to(DType::f32).to_vector();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// (W c)_e in double.
std::vector<double> offsets(const std::vector<float>& w, const std::vector<float>& c) {
  const size_t d = c.size(), experts = w.size() / d;
  std::vector<double> out(experts, 0.0);
  for (size_t e = 0; e < experts; ++e)
    for (size_t i = 0; i < d; ++i) out[e] += static_cast<double>(w[e * d + i]) * c[i];
  return out;
}

ModelConfig centred_model(double rate) {
  ModelConfig m = test::small_model_config(Arch::mixtral);
  m.router_center_rate = rate;
  m.resolve();
  return m;
}

std::string center_name(int64_t block) { return str("blocks.", block, ".moe.router.center"); }

}  // namespace

TEST_CASE("router center: the projection equalises W c over the experts and moves rows along c",
          "[router_center]") {
  const int64_t E = 5, D = 7;
  const Tensor w = test::random_tensor({E, D}, 3);
  const Tensor c = test::random_tensor({D}, 4, 2.0f);
  const std::vector<float> wv = host_values(w), cv = host_values(c);
  const std::vector<float> pv = host_values(center_router_weight(w, c));
  double cc = 0, scale = 0;
  for (float x : cv) cc += static_cast<double>(x) * x;
  const std::vector<double> before = offsets(wv, cv), after = offsets(pv, cv);
  double mean = 0;
  for (double a : before) mean += a / static_cast<double>(E);
  for (size_t e = 0; e < static_cast<size_t>(E); ++e) {
    // Row e moved by -k_e c, k_e = ((W c)_e - mean) / |c|^2, each entry rounded once to f32.
    const double k = (before[e] - mean) / cc;
    for (size_t i = 0; i < static_cast<size_t>(D); ++i) {
      const double expected = wv[e * D + i] - static_cast<float>(k) * cv[i];
      scale = std::max(scale, std::abs(expected));
      REQUIRE(std::abs(pv[e * D + i] - expected) <= 1e-6 * std::abs(expected) + 1e-7);
    }
  }
  // (W' c)_e is the same for every expert (the old mean), up to the f32 rounding of W' (D
  // entries, each within 2^-24 of itself, times |c|).
  double spread = 0;
  for (double a : after) spread = std::max(spread, std::abs(a - mean));
  REQUIRE(spread <= 4.0 * static_cast<double>(D) * scale * std::sqrt(cc) * 0x1p-24);
  double before_spread = 0;
  for (double a : before) before_spread = std::max(before_spread, std::abs(a - mean));
  REQUIRE(before_spread > 0.1);  // the random W did have offsets to remove
  // Idempotent up to that rounding; c = 0 leaves W itself; the dtype is kept.
  const std::vector<float> twice = host_values(center_router_weight(center_router_weight(w, c), c));
  for (size_t i = 0; i < twice.size(); ++i) REQUIRE(std::abs(twice[i] - pv[i]) <= 1e-6);
  const Tensor zero = Tensor::zeros({D});
  REQUIRE(center_router_weight(w, zero).raw() == w.raw());
  REQUIRE(center_router_weight(w.to(DType::bf16), c).dtype() == DType::bf16);
  REQUIRE_THROWS_AS(center_router_weight(w, Tensor::zeros({D + 1})), Error);
}

TEST_CASE("router center: a token moved along c keeps its routing, an uncentred router's changes",
          "[router_center]") {
  const int64_t N = 64, D = 16, E = 8;
  RouterConfig rc;
  rc.d_model = D;
  rc.num_experts = E;
  rc.top_k = 2;
  rc.center = true;
  ParamSet ps(9);
  Router router(ps, "blocks.0.moe.router", rc);
  REQUIRE(router.center() != nullptr);
  REQUIRE(router.center()->frozen);
  REQUIRE(host_values(router.center()->value) == std::vector<float>(D, 0.0f));
  RouterConfig plain_config = rc;
  plain_config.center = false;
  ParamSet plain_ps(9);
  Router plain(plain_ps, "blocks.0.moe.router", plain_config);
  REQUIRE(plain.center() == nullptr);
  test::randomize_param(router.weight(), 10, 1.0f);
  plain.weight().value.copy_from(router.weight().value);
  // A center of zero: the same logits as the plain router, bit for bit.
  const Tensor x = test::random_tensor({N, D}, 11);
  const RouterStep step{1, 1, 0, false};
  REQUIRE(same_bits(router.forward(x, step).logits.to_vector(),
                    plain.forward(x, step).logits.to_vector()));
  // x + a_t c for a large shared component a_t in [4, 6) along a center c.
  test::randomize_param(*router.center(), 12, 1.0f);
  const std::vector<float> cv = host_values(router.center()->value);
  Tensor shifted = x.clone();
  float* s = shifted.data<float>();
  for (int64_t t = 0; t < N; ++t)
    for (int64_t i = 0; i < D; ++i)
      s[t * D + i] += (4.0f + 2.0f * static_cast<float>(t) / static_cast<float>(N)) * cv[i];
  auto worst_uneven_shift = [&](const Router& r) {
    const RouterOutput a = r.forward(x, step), b = r.forward(shifted, step);
    const std::vector<float> la = a.logits.to_vector(), lb = b.logits.to_vector();
    double worst = 0;
    for (int64_t t = 0; t < N; ++t) {
      const double first = lb[t * E] - la[t * E];
      for (int64_t e = 1; e < E; ++e)
        worst = std::max(worst, std::abs((lb[t * E + e] - la[t * E + e]) - first));
    }
    const bool same_routing =
        std::memcmp(a.topk_idx.raw(), b.topk_idx.raw(), a.topk_idx.nbytes()) == 0;
    return std::make_pair(worst, same_routing);
  };
  // Centred: every logit of a token moves by the same amount, up to the f32 rounding of logits
  // of size |x + a c| |w'| ~ 5 |c| |w| (a few units here): 1e-4 is ~100 ulp of them.
  const auto [centred_shift, centred_same] = worst_uneven_shift(router);
  INFO("centred: worst uneven shift " << centred_shift);
  REQUIRE(centred_shift < 1e-4);
  REQUIRE(centred_same);
  // The plain router's logits move by a_t (w_e . c), different per expert: routing changes.
  const auto [plain_shift, plain_same] = worst_uneven_shift(plain);
  INFO("plain: worst uneven shift " << plain_shift);
  REQUIRE(plain_shift > 1.0);
  REQUIRE_FALSE(plain_same);
}

TEST_CASE("router center: the running-mean update from hand-made sums is exact",
          "[router_center]") {
  ParamSet ps(1);
  RouterConfig rc;
  rc.d_model = 3;
  rc.num_experts = 2;
  rc.center = true;
  Router router(ps, "blocks.0.moe.router", rc);
  Param& c = *router.center();
  // All zero: the first step's mean, exactly (2, -4, 6) / 4.
  update_router_center(c, {2.0, -4.0, 6.0}, 4, 0.25);
  REQUIRE(same_bits(host_values(c.value), {0.5f, -1.0f, 1.5f}));
  // Then c += rate (mean - c): mean (1, 1, 1).
  update_router_center(c, {4.0, 4.0, 4.0}, 4, 0.25);
  REQUIRE(same_bits(host_values(c.value), {0.625f, -0.5f, 1.375f}));
  REQUIRE_THROWS_AS(update_router_center(c, {1.0, 2.0}, 4, 0.25), Error);
  REQUIRE_THROWS_AS(update_router_center(c, {1.0, 2.0, 3.0}, 0, 0.25), Error);
}

TEST_CASE("router center: each step moves the centers by its mean input, a checkpoint keeps them",
          "[router_center][train]") {
  test::ScratchDir dir("router_center_resume");
  const ModelConfig m = centred_model(0.5);
  const std::vector<int64_t> blocks = m.moe_blocks();
  REQUIRE(!blocks.empty());
  const train::TrainConfig t = test::short_run(6);
  train::Trainer run(m, t, {});
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> before;
    for (int64_t b : blocks) before.push_back(host_values(run.params().at(center_name(b)).value));
    const train::StepStats s = run.step();
    REQUIRE(s.forward.moe.size() == blocks.size());
    for (size_t l = 0; l < blocks.size(); ++l) {
      INFO("step " << step + 1 << ", block " << blocks[l]);
      const nn::MoEStats& stats = s.forward.moe[l];
      REQUIRE(stats.input_tokens == t.batch * m.seq);
      REQUIRE(stats.input_sum.size() == static_cast<size_t>(m.d_model));
      if (step == 0) {  // calibrated before the step's forward (the next test), then moved
        REQUIRE_FALSE(
            same_bits(host_values(run.params().at(center_name(blocks[l])).value), before[l]));
        continue;
      }
      const double rate = 0.5;
      std::vector<float> expected = before[l];
      for (size_t i = 0; i < expected.size(); ++i) {
        const double mean = stats.input_sum[i] / static_cast<double>(stats.input_tokens);
        expected[i] = static_cast<float>(expected[i] + rate * (mean - expected[i]));
      }
      const std::vector<float> now = host_values(run.params().at(center_name(blocks[l])).value);
      REQUIRE(same_bits(now, expected));
      REQUIRE_FALSE(same_bits(now, before[l]));
    }
  }
  // The AdamW state holds nothing of a center.
  run.save(dir.path());
  const io::Checkpoint loaded = io::load_checkpoint(dir / "last.h5");
  for (const io::NamedTensor& nt : loaded.params)
    if (nt.name.find("router.center") != std::string::npos) REQUIRE(nt.dtype() == DType::f32);
  train::Trainer resumed(model_config_from_json(loaded.model_config),
                         train::train_config_from_json(loaded.train_config), {});
  resumed.restore(loaded);
  for (int i = 0; i < 3; ++i) {
    run.step();
    resumed.step();
  }
  REQUIRE(test::first_difference(run.snapshot().params, resumed.snapshot().params).empty());
  REQUIRE(test::first_difference(run.snapshot().optim, resumed.snapshot().optim).empty());
}

TEST_CASE("router center: the first step calibrates the centers, its load is near uniform",
          "[router_center][train]") {
  // 256 tokens of 8 sequences, top-2 of 8 experts: a uniform router gives each expert 64 of the
  // 512 assignments, with a binomial spread of sqrt(512 (1/8)(7/8)) = 7.5; the largest of 8 is
  // then 64 + 4 x 7.5 = 94 at most (4 standard deviations), a max/mean of 1.47.
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    INFO(arch_name(arch));
    auto first_step_load = [&](double rate) {
      ModelConfig m = test::small_model_config(arch);
      m.d_model = 128;
      m.d_ff = 256;
      m.experts = 8;
      m.router_center_rate = rate;
      m.resolve();
      train::TrainConfig t = test::short_run(1);
      t.batch = 8;
      train::Trainer run(m, t, {});
      const train::StepStats s = run.step();
      double worst = 0;
      for (double v : s.load_max_over_mean) worst = std::max(worst, v);
      return worst;
    };
    const double plain = first_step_load(0), centred = first_step_load(1);
    INFO("worst layer's max/mean load at step 1: plain " << plain << ", centred " << centred);
    // The control: plain routers at initialisation crowd a few experts here, well past what
    // chance gives (the stream's shared component; 2.03 and 1.91 when written, centred 1.34 and
    // 1.30).
    REQUIRE(plain > 1.7);
    REQUIRE(centred <= 1.5);
  }
}

TEST_CASE("router center: a pass over the first blocks has the full pass's statistics",
          "[router_center][train]") {
  // The calibration stops each of its passes after the MoE layer it calibrates
  // (EvalOptions::blocks); the layers it ran see exactly the full pass's inputs.
  ModelConfig m = test::small_model_config(Arch::mixtral);
  m.layers = 4;
  m.router_center_rate = 1;
  m.resolve();
  const std::vector<int64_t> blocks = m.moe_blocks();
  REQUIRE(blocks.size() == 4);
  train::Trainer run(m, test::short_run(2), {});
  run.step();  // calibrated and moved: centers that are not zero
  const Tensor ids = test::random_ids({3, m.seq}, 7, int32_t(m.vocab_size)),
               targets = test::random_ids({3, m.seq}, 8, int32_t(m.vocab_size));
  EvalOptions full;
  full.router_input_sums = true;
  const ForwardStats all = run.model().evaluate(ids, targets, full);
  REQUIRE(all.moe.size() == 4);
  REQUIRE(all.loss > 0);
  for (int64_t k : {1, 2, 3}) {
    INFO(k << " blocks");
    EvalOptions part = full;
    part.blocks = k;
    const ForwardStats f = run.model().evaluate(ids, targets, part);
    REQUIRE(f.moe.size() == static_cast<size_t>(k));
    CHECK(f.loss == 0);
    for (int64_t l = 0; l < k; ++l) {
      CHECK(f.moe[size_t(l)].input_sum == all.moe[size_t(l)].input_sum);
      CHECK(f.moe[size_t(l)].load == all.moe[size_t(l)].load);
    }
  }
  Tensor row_nll;
  EvalOptions cut = full;
  cut.blocks = 2;
  cut.row_nll = &row_nll;
  CHECK_THROWS_WITH(run.model().evaluate(ids, targets, cut),
                    Catch::Contains("has no per-token loss"));
}

TEST_CASE("router center: a run started from a checkpoint's weights keeps its centers",
          "[router_center][train]") {
  // --init: the centers come with the weights, so the first step only moves them by its mean
  // input (no calibration from the first batch).
  test::ScratchDir dir("router_center_init");
  const ModelConfig m = centred_model(0.5);
  const train::TrainConfig t = test::short_run(3);
  train::Trainer first(m, t, {});
  first.step();
  first.save(dir.path());
  train::Trainer fine(m, t, {});
  fine.initialize(dir / "last.h5");
  const std::vector<int64_t> blocks = m.moe_blocks();
  std::vector<std::vector<float>> before;
  for (int64_t b : blocks) {
    before.push_back(host_values(fine.params().at(center_name(b)).value));
    REQUIRE(same_bits(before.back(), host_values(first.params().at(center_name(b)).value)));
  }
  const train::StepStats s = fine.step();
  for (size_t l = 0; l < blocks.size(); ++l) {
    const nn::MoEStats& stats = s.forward.moe[l];
    std::vector<float> expected = before[l];
    for (size_t i = 0; i < expected.size(); ++i) {
      const double mean = stats.input_sum[i] / static_cast<double>(stats.input_tokens);
      expected[i] = static_cast<float>(expected[i] + 0.5 * (mean - expected[i]));
    }
    CHECK(same_bits(host_values(fine.params().at(center_name(blocks[l])).value), expected));
  }
}

TEST_CASE("router center: --grad-accum gives the centers of one pass, to float order",
          "[router_center][train]") {
  const ModelConfig m = centred_model(0.5);
  train::TrainConfig one = test::short_run(3), two = one;
  two.grad_accum = 2;
  train::Trainer a(m, one, {}), b(m, two, {});
  a.step();
  b.step();
  const auto tokens = static_cast<double>(one.batch * m.seq);
  for (int64_t block : m.moe_blocks()) {
    const std::vector<float> ca = host_values(a.params().at(center_name(block)).value),
                             cb = host_values(b.params().at(center_name(block)).value);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < ca.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(ca[i] - cb[i])));
      scale = std::max(scale, static_cast<double>(std::abs(ca[i])));
    }
    INFO("block " << block << ": worst " << worst << " of " << scale);
    REQUIRE(scale > 0.01);
    // Both runs' first step reads the same initial weights; the column sums of the router's
    // input run in another order (one f32 sum over all rows, or one per micro-batch added in
    // double). A recursive f32 sum of n terms errs by at most (n - 1) 2^-24 sum |x|, so the mean
    // by n 2^-24 max |x|, and an RMS-normalised row with unit norm weights (the initial ones)
    // has |x| <= sqrt(D).
    REQUIRE(worst <= tokens * 0x1p-24 * std::sqrt(static_cast<double>(m.d_model)));
  }
}

TEST_CASE("router center: HF export writes W' as a plain router that scores the same",
          "[router_center][hf]") {
  test::ScratchDir dir("router_center_hf");
  train::Trainer run(centred_model(1.0), test::short_run(2), {});
  run.step();
  run.step();
  run.save(dir.path());
  const io::Checkpoint ckpt = io::load_checkpoint(dir / "last.h5");
  io::export_hf(ckpt, dir.file("hf"));
  const io::Checkpoint back = test::import_hf_held(dir.file("hf"));
  const ModelConfig imported = model_config_from_json(back.model_config);
  REQUIRE(imported.router_center_rate == 0);  // the files hold a plain router
  for (int64_t block : imported.moe_blocks()) {
    const std::string w = str("blocks.", block, ".moe.router.weight");
    const Tensor* ours = nullptr;
    const Tensor* center = nullptr;
    const Tensor* exported = nullptr;
    for (const io::NamedTensor& nt : ckpt.params) {
      if (nt.name == w) ours = &nt.tensor;
      if (nt.name == center_name(block)) center = &nt.tensor;
    }
    for (const io::NamedTensor& nt : back.params) {
      REQUIRE(nt.name != center_name(block));
      if (nt.name == w) exported = &nt.tensor;
    }
    REQUIRE((ours && center && exported));
    REQUIRE(same_bits(host_values(*exported), host_values(center_router_weight(*ours, *center))));
    REQUIRE_FALSE(same_bits(host_values(*exported), host_values(*ours)));
  }
  // The same logits: our centred model and the imported plain one, on the same tokens.
  std::vector<int32_t> ids(2 * 16);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % 256);
  const std::vector<float> a = test::hf::our_logits(ckpt, dir.file("ours.h5"), ids, 2, 16),
                           b = test::hf::our_logits(back, dir.file("back.h5"), ids, 2, 16);
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(a[i])));
  }
  INFO("worst " << worst << " of " << scale);
  // W' computed once (export) or per forward (ours) is the same f32 tensor: equal logits.
  REQUIRE(worst == 0);
}

TEST_CASE("router center: serving folds the centers into plain routers, the same logits",
          "[router_center][infer]") {
  test::ScratchDir dir("router_center_fold");
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    ModelConfig m = centred_model(1.0);
    m.dtype = dtype;
    train::Trainer run(m, test::short_run(1), {});
    run.step();
    run.save(dir.file(dtype_name(dtype)));
    infer::LoadedModel loaded = infer::load_model(dir.file(dtype_name(dtype)) + "/last.h5");
    std::vector<int32_t> ids(2 * 16);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 53 + 7) % 256);
    const Tensor batch = Tensor::from_vector({2, 16}, ids);
    const std::vector<float> centred = loaded.model->logits(batch).to_vector();
    infer::lean_for_inference(*loaded.params);
    infer::fold_router_centers(*loaded.params);
    for (int64_t b : m.moe_blocks()) {
      const std::vector<float> c = host_values(loaded.params->at(center_name(b)).value);
      REQUIRE(c == std::vector<float>(c.size(), 0.0f));
    }
    // The folded weight is the tensor each forward computed: the same logits, bit for bit.
    REQUIRE(same_bits(loaded.model->logits(batch).to_vector(), centred));
  }
}
