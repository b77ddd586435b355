// The expert cache reading ahead by the next layer's router (ServingCacheConfig::router,
// nn::ExpertStore::lookahead): Router::choose picks what forward picks (selection bias and groups
// included); a hand-worked model whose layers route alike (identical routers and norms, blocks
// that add nothing to the stream) is predicted exactly, so every prefetch is used; when slots run
// short the most likely experts are read first (hand-worked on the protocol); and prefetching
// from either source, with or without a margin, keeps forward passes and cached decoding bitwise
// those of the resident model.
// Shapes: L = 4 MoE layers of E = 4 experts, top-2, B batch, T sequence, D model width.
#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "moe/infer/model.h"
#include "moe/nn/router.h"
#include "moe/offload/serving_cache.h"
#include "support/ring.h"
#include "support/run.h"
#include "support/served.h"

using namespace moe;
using offload::ServingCache;
using offload::ServingCacheConfig;
using offload::ServingCacheStats;

namespace {

using test::Served;

// save_ring_model's checkpoint with every block routing as block 0 does: each block's norm2 and
// router are block 0's, and its attention output and experts' output projections are zero, so
// the stream (the embedding) reaches every MoE layer unchanged and each layer's router sees what
// the layer before it saw.
void save_alike_model(const std::string& path, const ModelConfig& config, uint64_t seed) {
  test::save_ring_model(path, config, seed);
  io::Checkpoint ckpt = io::load_checkpoint(path);
  std::map<std::string, Tensor> first;  // block 0's, by the name after "blocks.0."
  for (const io::NamedTensor& t : ckpt.params)
    if (t.name.rfind("blocks.0.", 0) == 0) first[t.name.substr(9)] = t.tensor;
  for (io::NamedTensor& t : ckpt.params) {
    if (block_of_name(t.name) < 0) continue;
    const std::string rest = t.name.substr(t.name.find('.', 7) + 1);
    if (rest.rfind("norm2.", 0) == 0 || rest.rfind("moe.router.", 0) == 0) {
      t.tensor = first.at(rest).clone();
    } else if (rest.rfind("attn.o.", 0) == 0 || rest == "moe.experts.w2" ||
               rest == "moe.experts.b2") {
      t.tensor = Tensor::zeros(t.tensor.shape(), t.tensor.dtype());
    }
  }
  std::filesystem::remove(path);
  io::save_checkpoint(path, ckpt);
}

// Passes of one token each (ids [1,1]): a token routes to 2 of a layer's 4 experts, so a
// prediction has something to miss.
void one_token_passes(const Transformer& model, const ModelConfig& config, int passes) {
  for (int p = 0; p < passes; ++p) {
    const test::RingBatch batch = test::ring_batch(config, 1, 500 + uint64_t(p));
    (void)model.evaluate(batch.ids.reshape({config.seq}).rows(0, 1).reshape({1, 1}),
                         batch.targets.reshape({config.seq}).rows(0, 1).reshape({1, 1}));
  }
}

}  // namespace

TEST_CASE("serving prefetch: Router::choose picks what forward picks, biased and grouped",
          "[serving_prefetch]") {
  nn::RouterConfig rc;
  rc.d_model = 16;
  rc.num_experts = 8;
  rc.top_k = 2;
  rc.scoring = nn::RouterScoring::sigmoid;
  rc.selection_bias = true;
  rc.groups = 4;
  rc.group_topk = 2;
  ParamSet ps(7);
  nn::Router router(ps, "r", rc);
  float* bias = router.selection_bias()->value.data<float>();
  for (int e = 0; e < 8; ++e) bias[e] = 0.05f * float((e * 5) % 8) - 0.2f;
  Tensor x = Tensor::empty({24, 16}, DType::f32);
  const uint64_t key = rng_key(11, {1});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = rng_normal(key, uint64_t(i));
  nn::RouterStep step;
  step.training = false;
  const nn::RouterOutput routed = router.forward(x, step);
  const Tensor two = router.choose(x, 2), three = router.choose(x, 3), all = router.choose(x, 99);
  REQUIRE(test::same_bytes(two, routed.topk_idx));
  REQUIRE(three.shape() == Shape{24, 3});
  REQUIRE(all.shape() == Shape{24, 4});  // 2 groups of 2 experts hold at most 4
  for (int64_t t = 0; t < 24; ++t) {
    for (int64_t j = 0; j < 2; ++j)
      REQUIRE(three.data<int32_t>()[t * 3 + j] == routed.topk_idx.data<int32_t>()[t * 2 + j]);
  }
}

TEST_CASE("serving prefetch: layers that route alike are predicted exactly, every read used",
          "[serving_prefetch]") {
  const ModelConfig config = test::ring_config(Arch::mixtral, DType::f32);
  test::ScratchDir dir("serving-prefetch-alike");
  const std::string path = dir / "model.h5";
  save_alike_model(path, config, 31);
  for (auto source : {nn::LookaheadSource::input, nn::LookaheadSource::output}) {
    DYNAMIC_SECTION((source == nn::LookaheadSource::input ? "input" : "output")) {
      Served s(path);
      ServingCacheConfig cc;
      cc.budget_bytes = 4 * (s.cache.expert_bytes(DType::f32) / 16);  // 4 slots
      cc.router = {source, 0};
      s.cache.start(cc);
      const int passes = 5;
      one_token_passes(*s.m.model, config, passes);
      const ServingCacheStats st = s.cache.stats();
      // A pass, worked by hand: layer 0's 2 experts are read when acquired (nothing predicts
      // layer 0); layers 1-3's 2 each were predicted by the layer before and prefetched into the
      // slots layer l-1 left (2 held by layer l computing, 2 for layer l+1).
      REQUIRE(st.accesses == passes * 8);
      REQUIRE(st.estimate_routed == passes * 6);
      REQUIRE(st.estimate_hits == passes * 6);
      REQUIRE(st.prefetches == passes * 6);
      REQUIRE(st.prefetch_hits == passes * 6);
      REQUIRE(st.prefetch_wasted == 0);
      REQUIRE(st.cache.hits == passes * 6);
      REQUIRE(st.experts_read == passes * 8);
    }
  }
  // The same passes on save_ring_model's own checkpoint (its routers differ): the prediction then
  // misses some, so the counts above are the routers', not the counting's.
  const std::string other = dir / "other.h5";
  test::save_ring_model(other, config, 31);
  Served s(other);
  ServingCacheConfig cc;
  cc.budget_bytes = 4 * (s.cache.expert_bytes(DType::f32) / 16);
  cc.router = {nn::LookaheadSource::input, 0};
  s.cache.start(cc);
  one_token_passes(*s.m.model, config, 5);
  const ServingCacheStats st = s.cache.stats();
  REQUIRE(st.estimate_routed == 30);
  REQUIRE(st.estimate_hits < 30);
  REQUIRE(st.prefetch_hits < st.prefetches);
}

TEST_CASE("serving prefetch: the most likely experts are read first when slots run short",
          "[serving_prefetch]") {
  // Worked by hand on the store's protocol, 2 slots, the output source: layer 0 computes experts
  // 0 and 1; then layer 1 is predicted as 3, 0, 2 (most likely first). Layer 0 is done, so both
  // slots may go: 3 and 0 are read, 2 finds no slot. Layer 1 then routes to 0 and 3: both were
  // read ahead. (Read in expert order, 0 and 2 would have taken the slots and 3 missed.)
  const ModelConfig config = test::ring_config(Arch::mixtral, DType::f32);
  test::ScratchDir dir("serving-prefetch-order");
  const std::string path = dir / "model.h5";
  test::save_ring_model(path, config, 28);
  Served s(path);
  ServingCacheConfig cc;
  cc.budget_bytes = 2 * (s.cache.expert_bytes(DType::f32) / 16);
  cc.router = {nn::LookaheadSource::output, 0};
  s.cache.start(cc);
  REQUIRE(s.cache.lookahead().source == nn::LookaheadSource::output);
  const int32_t used0[] = {0, 1}, rows0[] = {1, 1};
  s.cache.request(0, used0, rows0, nn::Pass::forward);
  for (int32_t e : used0) {
    (void)s.cache.acquire(0, e);
    s.cache.release(0, e);
  }
  const int32_t predicted[] = {3, 0, 2};
  s.cache.predict(1, predicted);
  const int32_t used1[] = {0, 3}, rows1[] = {1, 1};
  s.cache.request(1, used1, rows1, nn::Pass::forward);
  for (int32_t e : used1) {
    (void)s.cache.acquire(1, e);
    s.cache.release(1, e);
  }
  const ServingCacheStats st = s.cache.stats();
  INFO(st.prefetches << " prefetched, " << st.prefetch_hits << " used, " << st.prefetch_wasted
                     << " wasted, " << st.cache.hits << " hits, " << st.experts_read << " reads");
  REQUIRE(st.slots == 2);
  REQUIRE(st.prefetches == 2);  // 3 and 0; 2 found both slots held
  REQUIRE(st.prefetch_hits == 2);
  REQUIRE(st.prefetch_wasted == 0);
  REQUIRE(st.estimate_routed == 2);
  REQUIRE(st.estimate_hits == 2);
  REQUIRE(st.experts_read == 4);  // layer 0's two when acquired, layer 1's two ahead
  REQUIRE(st.cache.hits == 2);
}

TEST_CASE("serving prefetch: reading ahead by the router keeps outputs bitwise",
          "[serving_prefetch]") {
  const ModelConfig config = test::ring_config(Arch::mixtral, DType::bf16);
  test::ScratchDir dir("serving-prefetch-router");
  const std::string path = dir / "model.h5";
  test::save_ring_model(path, config, 26);
  infer::LoadedModel resident = infer::load_model(path);
  struct Case {
    nn::LookaheadSource source;
    int64_t margin, experts;
  };
  for (const Case& c :
       {Case{nn::LookaheadSource::input, 0, 2}, Case{nn::LookaheadSource::input, 1, 6},
        Case{nn::LookaheadSource::output, 0, 6}, Case{nn::LookaheadSource::output, 2, 16}}) {
    DYNAMIC_SECTION((c.source == nn::LookaheadSource::input ? "input" : "output")
                    << " margin " << c.margin << ", " << c.experts << " experts") {
      Served s(path);
      ServingCacheConfig cc;
      cc.dtype = DType::bf16;
      cc.budget_bytes = c.experts * (s.cache.expert_bytes(DType::bf16) / 16);
      cc.router = {c.source, c.margin};
      s.cache.start(cc);
      for (uint64_t b = 0; b < 3; ++b) {
        const test::RingBatch batch = test::ring_batch(config, 1, 300 + b);
        Tensor want, got;
        resident.model->evaluate(batch.ids, batch.targets, &want);
        s.m.model->evaluate(batch.ids, batch.targets, &got);
        INFO("batch " << b);
        REQUIRE(test::same_bytes(got, want));
      }
      // Cached decoding (Block::forward_cached): a prefill of 4 tokens, then 3 single tokens.
      KVCache kv_want = resident.model->make_cache(1), kv_got = s.m.model->make_cache(1);
      const test::RingBatch batch = test::ring_batch(config, 1, 400);
      for (int64_t at = 0, n = 4; at + n <= 7; at += n, n = 1) {
        const Tensor ids = batch.ids.reshape({config.seq}).rows(at, at + n).reshape({1, n});
        const Tensor want = resident.model->forward_cached(ids, kv_want);
        const Tensor got = s.m.model->forward_cached(ids, kv_got);
        INFO("tokens " << at << ".." << at + n);
        REQUIRE(test::same_bytes(got, want));
      }
      const ServingCacheStats st = s.cache.stats();
      INFO(st.prefetches << " prefetches, " << st.prefetch_hits << " used, " << st.prefetch_wasted
                         << " wasted, " << st.experts_read << " reads");
      REQUIRE(st.estimate_routed > 0);
      if (c.experts > 2) REQUIRE(st.prefetches > 0);  // 2 slots: both held by the layer computing
      REQUIRE(st.prefetch_hits + st.prefetch_wasted <= st.prefetches);
      REQUIRE(st.prefetch_hits <= st.cache.hits);
      if (c.experts == 16) REQUIRE(st.experts_read <= 16);  // all fit: each read once
    }
  }
}

TEST_CASE("serving prefetch: a negative margin is refused in words", "[serving_prefetch]") {
  const ModelConfig config = test::ring_config(Arch::mixtral, DType::f32);
  test::ScratchDir dir("serving-prefetch-margin");
  const std::string path = dir / "model.h5";
  test::save_ring_model(path, config, 27);
  Served s(path);
  ServingCacheConfig cc;
  cc.budget_bytes = s.cache.expert_bytes(DType::f32);
  cc.router = {nn::LookaheadSource::input, -1};
  REQUIRE_THROWS_WITH(s.cache.start(cc), Catch::Contains("a prediction margin of -1 experts"));
}
