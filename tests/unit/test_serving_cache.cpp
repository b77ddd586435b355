// offload::ServingCache (inference experts one at a time, cached across tokens and batches): LRU
// and LFU against hand-worked access sequences with Belady's optimum beside them; pinning by
// popularity; the next-layer estimate's count; forward passes bitwise those of the resident model
// for f32 and bf16 at budgets of one expert to all of them; a batch reads each expert at most once
// a layer; budgets and checkpoints refused in words.
// Shapes: L MoE layers, E experts of a layer, B batch, T sequence.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "moe/infer/model.h"
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

// One expert's bytes as held: w1, w2, w3 [F,D] in the weight dtype (mixtral: no biases).
int64_t one_expert(const ModelConfig& c) {
  return 3 * c.d_model * c.d_ff * int64_t(dtype_size(c.dtype));
}

// Requests, acquires and releases expert 0 of each MoE layer in `layers`, in order.
void access(ServingCache& cache, const std::vector<int>& layers) {
  for (int layer : layers) {
    const int32_t one[] = {0}, rows[] = {1};
    cache.request(layer, one, rows, nn::Pass::forward);
    const nn::ExpertTensors w = cache.acquire(layer, 0);
    REQUIRE(w.w1.shape() == Shape{1, w.w1.dim(1), w.w1.dim(2)});
    cache.release(layer, 0);
  }
}

}  // namespace

TEST_CASE("expert cache: LRU and LFU on hand-worked sequences, Belady beside them", "[serving]") {
  const ModelConfig config = test::ring_config(Arch::mixtral, DType::f32);
  test::ScratchDir dir("serving-policy");
  const std::string path = dir / "model.h5";
  test::save_ring_model(path, config, 21);
  // Two slots; expert 0 of MoE layers 0 0 1 2 1 2 (call them a a b c b c).
  //   lru: miss hit miss miss(evicts a) hit hit                   -> 3 hits, 3 reads
  //   lfu: counts a:2, b:1 when c arrives: evicts b; b (count 2) evicts c (count 1); c (count 2)
  //        ties with a (count 2), the less recent goes: a          -> 1 hit, 5 reads
  //   Belady: c evicts a (never used again); b and c hit          -> 3 hits
  struct Case {
    offload::CachePolicy policy;
    int64_t hits, reads;
  };
  for (const Case& c :
       {Case{offload::CachePolicy::lru, 3, 3}, Case{offload::CachePolicy::lfu, 1, 5}}) {
    DYNAMIC_SECTION(offload::to_string(c.policy)) {
      Served s(path);
      ServingCacheConfig cc;
      cc.policy = c.policy;
      cc.budget_bytes = 2 * one_expert(config) + one_expert(config) / 2;
      s.cache.start(cc);
      access(s.cache, {0, 0, 1, 2, 1, 2});
      const ServingCacheStats st = s.cache.stats();
      REQUIRE(st.slots == 2);
      REQUIRE(st.expert_bytes == one_expert(config));
      REQUIRE(st.accesses == 6);
      REQUIRE(st.cache.hits == c.hits);
      REQUIRE(st.experts_read == c.reads);
      REQUIRE(st.bytes_read == c.reads * one_expert(config));
      REQUIRE(st.belady_hits == 3);
      REQUIRE(st.hit_rate() == Approx(c.hits / 6.0));
      REQUIRE(st.belady_rate() == Approx(0.5));
    }
  }
}

TEST_CASE("expert cache: pinned experts come from the popularity, the estimate is counted",
          "[serving]") {
  const ModelConfig config = test::ring_config(Arch::mixtral, DType::f32);
  test::ScratchDir dir("serving-pin");
  const std::string path = dir / "model.h5";
  test::save_ring_model(path, config, 22);
  Served s(path);
  ServingCacheConfig cc;
  cc.budget_bytes = 3 * one_expert(config);  // 3 experts: 1 pinned (half, rounded down), 2 cached
  cc.popularity = {{1, 9, 0, 0}, {1, 1, 1, 1}, {4, 3, 2, 1}, {1, 1, 1, 1}};
  // Layer l's expert e leads to layer l+1's expert e (identity counts), layer 0's expert 3 to 1.
  cc.transitions.assign(3, std::vector<std::vector<double>>(4, std::vector<double>(4, 0.0)));
  for (auto& from : cc.transitions)
    for (size_t e = 0; e < 4; ++e) from[e][e] = 5;
  cc.transitions[0][3] = {0, 7, 0, 0};
  cc.prefetch = false;  // the estimate is counted either way
  s.cache.start(cc);
  ServingCacheStats st = s.cache.stats();
  REQUIRE(st.pinned == 1);
  REQUIRE(st.slots == 2);
  REQUIRE(st.experts_read == 1);  // the pinned expert, read at start
  REQUIRE(s.cache.pinned(0, 1));  // 0.9 of layer 0's tokens: the largest share
  REQUIRE(!s.cache.pinned(2, 0));
  // Layer 0 routes experts 1 (3 rows) and 3 (1 row): the estimate of layer 1 is {1} (3 x 5 + 1
  // x 7 for expert 1; none for the others) plus one more by order, expert 0 (score 0, first).
  const int32_t used0[] = {1, 3}, rows0[] = {3, 1};
  s.cache.request(0, used0, rows0, nn::Pass::forward);
  for (int32_t e : used0) {
    (void)s.cache.acquire(0, e);
    s.cache.release(0, e);
  }
  const int32_t used1[] = {1, 2}, rows1[] = {2, 2};
  s.cache.request(1, used1, rows1, nn::Pass::forward);
  st = s.cache.stats();
  REQUIRE(st.accesses == 2);
  REQUIRE(st.pinned_hits == 1);     // expert 1 of layer 0
  REQUIRE(st.cache.accesses == 1);  // expert 3: through the cache
  REQUIRE(st.estimate_routed == 2);
  REQUIRE(st.estimate_hits == 1);  // 1 was estimated, 2 was not
  REQUIRE(st.estimate_rate() == Approx(0.5));
}

TEST_CASE("expert cache: forward passes are bitwise those of the resident model", "[serving]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const ModelConfig config = test::ring_config(arch, dtype);
      test::ScratchDir dir("serving-bitwise");
      const std::string path = dir / "model.h5";
      test::save_ring_model(path, config, 13);
      infer::LoadedModel resident = infer::load_model(path);
      std::vector<test::RingBatch> batches;
      std::vector<Tensor> want_nll;
      std::vector<ForwardStats> want;
      for (uint64_t b = 0; b < 3; ++b) {
        batches.push_back(test::ring_batch(config, 2, 200 + b));
        Tensor nll;
        want.push_back(resident.model->evaluate(batches.back().ids, batches.back().targets, &nll));
        want_nll.push_back(nll);
      }
      for (int64_t experts : {1, 3, 100}) {
        for (auto policy : {offload::CachePolicy::lru, offload::CachePolicy::lfu}) {
          DYNAMIC_SECTION(arch_name(arch) << " " << dtype_name(dtype) << " " << experts
                                          << " experts " << offload::to_string(policy)) {
            Served s(path);
            ServingCacheConfig cc;
            cc.policy = policy;
            cc.dtype = dtype;
            const int64_t all = s.cache.expert_bytes(dtype);
            cc.budget_bytes = std::min(all, experts * (all / 13));  // gpt: 13 experts in 4 layers
            if (arch == Arch::mixtral) cc.budget_bytes = std::min(all, experts * (all / 16));
            s.cache.start(cc);
            for (int round = 0; round < 2; ++round) {
              for (size_t b = 0; b < batches.size(); ++b) {
                Tensor nll;
                ForwardStats got = s.m.model->evaluate(batches[b].ids, batches[b].targets, &nll);
                INFO("round " << round << " batch " << b);
                REQUIRE(test::same_bytes(nll, want_nll[b]));
                REQUIRE(got.loss == want[b].loss);
                REQUIRE(got.aux_loss == want[b].aux_loss);
              }
            }
            const ServingCacheStats st = s.cache.stats();
            REQUIRE(st.passes == 6);
            // Each routed expert once a layer and pass, whatever the tokens (B x T x k = 64 rows a
            // layer): at most every expert of every layer a pass.
            REQUIRE(st.accesses <= 6 * (arch == Arch::gpt ? 13 : 16));
            if (experts == 1) REQUIRE(st.experts_read == st.accesses);
            if (experts == 100) REQUIRE(st.experts_read <= (arch == Arch::gpt ? 13 : 16));
          }
        }
      }
    }
  }
}

TEST_CASE("expert cache: a batch by token blocks reads each expert once a layer", "[serving]") {
  // The MoE layers run a long batch by blocks of tokens (MoELayer::experts_by_blocks), each block
  // acquiring its routed experts again: with room for a layer's experts (4), the later blocks
  // hit, so a pass reads each of the 16 experts at most once.
  const ModelConfig config = test::ring_config(Arch::mixtral, DType::bf16);
  test::ScratchDir dir("serving-blocks");
  const std::string path = dir / "model.h5";
  test::save_ring_model(path, config, 24);
  const test::RingBatch batch = test::ring_batch(config, 4, 9);  // 64 tokens
  Tensor want_nll, nll;
  infer::LoadedModel resident = infer::load_model(path);
  resident.model->evaluate(batch.ids, batch.targets,
                           EvalOptions{.row_nll = &want_nll, .expert_block_tokens = 8});
  for (auto policy : {offload::CachePolicy::lru, offload::CachePolicy::lfu}) {
    Served s(path);
    ServingCacheConfig cc;
    cc.policy = policy;
    cc.dtype = DType::bf16;
    cc.budget_bytes = s.cache.expert_bytes(DType::bf16) / 4;  // one layer's 4 experts
    s.cache.start(cc);
    s.m.model->evaluate(batch.ids, batch.targets,
                        EvalOptions{.row_nll = &nll, .expert_block_tokens = 8});
    REQUIRE(test::same_bytes(nll, want_nll));
    const ServingCacheStats st = s.cache.stats();
    INFO(offload::to_string(policy) << ": " << st.accesses << " accesses");
    REQUIRE(st.passes == 1);
    REQUIRE(st.accesses > 16);  // 8 blocks a layer, each acquiring its experts
    REQUIRE(st.experts_read <= 16);
  }
}

TEST_CASE("expert cache: prefetching the next layer's estimate keeps the outputs bitwise",
          "[serving]") {
  const ModelConfig config = test::ring_config(Arch::mixtral, DType::bf16);
  test::ScratchDir dir("serving-prefetch");
  const std::string path = dir / "model.h5";
  test::save_ring_model(path, config, 25);
  infer::LoadedModel resident = infer::load_model(path);
  // Every expert leads to the next layer's expert e + 1 (mod 4) most, then to e.
  std::vector<std::vector<std::vector<double>>> transitions(
      3, std::vector<std::vector<double>>(4, std::vector<double>(4, 0.0)));
  for (auto& from : transitions)
    for (size_t e = 0; e < 4; ++e) from[e][(e + 1) % 4] = 3, from[e][e] = 1;
  for (int64_t experts : {2, 6, 16}) {
    DYNAMIC_SECTION(experts << " experts") {
      Served s(path);
      ServingCacheConfig cc;
      cc.dtype = DType::bf16;
      cc.budget_bytes = experts * (s.cache.expert_bytes(DType::bf16) / 16);
      cc.transitions = transitions;
      cc.prefetch = true;
      s.cache.start(cc);
      for (int round = 0; round < 2; ++round)
        for (uint64_t b = 0; b < 3; ++b) {
          const test::RingBatch batch = test::ring_batch(config, 1, 300 + b);
          Tensor want, got;
          resident.model->evaluate(batch.ids, batch.targets, &want);
          s.m.model->evaluate(batch.ids, batch.targets, &got);
          INFO("round " << round << " batch " << b);
          REQUIRE(test::same_bytes(got, want));
        }
      const ServingCacheStats st = s.cache.stats();
      INFO(st.prefetches << " prefetches, " << st.prefetch_hits << " used, " << st.experts_read
                         << " reads");
      if (experts > 2) REQUIRE(st.prefetches > 0);  // 2 slots: both held by the layer computing
      REQUIRE(st.prefetch_hits <= st.prefetches);
      REQUIRE(st.prefetch_hits <= st.cache.hits);
      REQUIRE(st.experts_read >= st.prefetches);
      if (experts == 16) REQUIRE(st.experts_read <= 16);  // all fit: each read once
    }
  }
}

TEST_CASE("expert cache: a budget below one expert, a quantised or mismatched one, refused",
          "[serving]") {
  const ModelConfig config = test::ring_config(Arch::mixtral, DType::bf16);
  test::ScratchDir dir("serving-refused");
  const std::string path = dir / "model.h5";
  test::save_ring_model(path, config, 23);
  Served s(path);
  ServingCacheConfig cc;
  cc.dtype = DType::bf16;
  cc.budget_bytes = one_expert(config) - 1;
  try {
    s.cache.start(cc);
    FAIL("started");
  } catch (const UsageError& e) {
    REQUIRE(std::string(e.what()) == str("--expert-budget ", one_expert(config) - 1,
                                         " bytes is smaller than one expert (", one_expert(config),
                                         " bytes as held)"));
  }
  cc.budget_bytes = one_expert(config);
  cc.popularity = {{1, 1, 1, 1}, {1, 1, 1, 1}};
  REQUIRE_THROWS_WITH(s.cache.start(cc),
                      Catch::Contains("the routing trace has 2 MoE layers, the model 4"));
  cc.popularity.clear();
  s.cache.start(cc);  // after a refusal it may be started
  const test::RingBatch batch = test::ring_batch(config, 1, 7);
  REQUIRE_THROWS_WITH(s.m.model->forward_backward(batch.ids, batch.targets, nn::RouterStep{}),
                      Catch::Contains("forward passes only"));
}
