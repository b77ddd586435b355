// --zero 3 with the dense all-gathers prefetched N blocks ahead (--zero-prefetch N,
// parallel::ZeroPrefetch) against the synchronous gathers (N = 0) on the same ranks: the same
// losses, norms, parameters and optimizer state bit for bit at any rank count (the same
// all-gathers, only earlier and on another communicator), gpt and mixtral, with --ep 2, --offload
// host and ssd, --recompute block with --grad-accum; the overlap statistics; ZeroPrefetch alone
// (order, fall-back, at most N blocks ahead). Registered at 2 and 4 ranks (dist_zero_prefetch_np*).
#include <catch2/catch.hpp>
#include <cstring>

#include "moe/comm/communicator.h"
#include "moe/models/transformer.h"
#include "moe/parallel/zero_prefetch.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"
#include "support/state.h"
#include "support/training.h"

moe::comm::Communicator& dist_world();

using namespace moe;

namespace {

// A short run (tests/support/training.h) under --zero 3, clipped: the norm must agree too.
train::TrainConfig prefetch_train(int64_t depth) {
  train::TrainConfig t = test::short_run(6);
  t.clip = 0.5;
  t.zero = 3;
  t.zero_prefetch = depth;
  return t;
}

}  // namespace

TEST_CASE("zero prefetch: N blocks ahead trains bitwise as the synchronous gathers",
          "[dist][zero_prefetch]") {
  comm::Communicator& world = dist_world();
  const int R = world.size();
  struct Case {
    const char* name;
    Arch arch;
    int64_t depth;
    void (*set)(train::TrainConfig&);
  };
  std::vector<Case> cases{
      {"gpt", Arch::gpt, 1, [](train::TrainConfig&) {}},
      {"mixtral", Arch::mixtral, 2, [](train::TrainConfig&) {}},
      {"mixtral, recompute block, grad-accum 2", Arch::mixtral, 1,
       [](train::TrainConfig& t) {
         t.recompute = nn::Recompute::block;
         t.grad_accum = 2;
       }},
      {"mixtral, a prefetch past the last block", Arch::mixtral, 9, [](train::TrainConfig&) {}},
      {"mixtral, offload host", Arch::mixtral, 1,
       [](train::TrainConfig& t) { t.offload.tier = offload::Tier::host; }},
      {"mixtral, offload ssd", Arch::mixtral, 1, [](train::TrainConfig& t) {
         t.offload.tier = offload::Tier::ssd;
         t.offload.prefetch_depth = 2;
       }}};
  if (R % 2 == 0) {
    cases.push_back({"mixtral --ep 2", Arch::mixtral, 1, [](train::TrainConfig& t) { t.ep = 2; }});
    cases.push_back({"mixtral --ep 2, offload ssd", Arch::mixtral, 2, [](train::TrainConfig& t) {
                       t.ep = 2;
                       t.offload.tier = offload::Tier::ssd;
                     }});
  }
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name << " --zero-prefetch " << c.depth << " on " << R << " ranks") {
      ModelConfig model = test::small_model_config(c.arch);
      model.resolve();
      train::TrainConfig ahead = prefetch_train(c.depth), sync = prefetch_train(0);
      c.set(ahead);
      c.set(sync);
      test::ScratchDir ssd_ahead(str("zero-prefetch-a-rank", world.rank()));
      test::ScratchDir ssd_sync(str("zero-prefetch-s-rank", world.rank()));
      ahead.offload.ssd_dir = ssd_ahead.path();
      sync.offload.ssd_dir = ssd_sync.path();
      train::Trainer prefetched(model, ahead, {}, &world);
      train::Trainer plain(model, sync, {}, &world);
      for (int i = 0; i < 3; ++i) {
        const train::StepStats a = prefetched.step(), b = plain.step();
        INFO("step " << i + 1);
        CHECK(a.forward.loss == b.forward.loss);
        CHECK(a.grad_norm == b.grad_norm);
        // Both measured their all-gathers; the synchronous path waited for each one whole.
        CHECK(a.dense_gather_seconds > 0);
        CHECK(b.dense_gather_seconds > 0);
        CHECK(b.dense_wait_seconds >= b.dense_gather_seconds);
        CHECK(a.dense_wait_seconds >= 0);
        if (ahead.offload.tier != offload::Tier::none) {
          CHECK(a.expert_load_seconds > 0);
          CHECK(a.expert_wait_seconds >= 0);
        } else {
          CHECK(a.expert_load_seconds == 0);
        }
      }
      CHECK(test::first_difference(prefetched.snapshot(), plain.snapshot()) == "");
      for (const Param* p : std::as_const(prefetched.params()).all())  // slices only again
        if (!p->offloaded) CHECK(p->value.defined() != prefetched.dense_shards()->covers(*p));
      CHECK(prefetched.evaluate() == plain.evaluate());
    }
  }
}

TEST_CASE("zero prefetch: a negative depth is refused naming the flag", "[dist][zero_prefetch]") {
  comm::Communicator& world = dist_world();
  ModelConfig model = test::small_model_config(Arch::gpt);
  model.resolve();
  CHECK_THROWS_WITH(train::Trainer(model, prefetch_train(-1), {}, &world),
                    Catch::Contains("--zero-prefetch"));
}

TEST_CASE("zero prefetch: ZeroPrefetch installs each group's values in order, at most N ahead",
          "[dist][zero_prefetch]") {
  comm::Communicator& world = dist_world();
  auto build = [](ParamSet& ps) {
    ps.add("embed", {5, 3}, Init::normal(0.5f));
    for (int b = 0; b < 3; ++b) {
      ps.add(str("blocks.", b, ".w"), {4 + b, 3}, Init::normal(0.5f));
      ps.add(str("blocks.", b, ".bias"), {3}, Init::normal(0.5f), false);
    }
  };
  ParamSet ps(7), ref(7);
  build(ps);
  build(ref);
  parallel::DenseShards shards(world, ps, 3, optim::AdamWConfig{}, /*bucket_bytes=*/16,
                               [](const Param& p) { return block_of_name(p.name); });
  auto same_as_ref = [&](int64_t g) {
    for (const Param* p : std::as_const(ref).all())
      if (block_of_name(p->name) == g) {
        const Param& q = ps.at(p->name);
        REQUIRE(q.value.defined());
        CHECK(std::memcmp(q.value.raw(), p->value.raw(), p->value.nbytes()) == 0);
      }
  };
  const std::vector<int64_t> order{-1, 0, 1, 2, 2, 1, 0};
  for (int64_t depth : {0, 1, 2, 8}) {
    DYNAMIC_SECTION("--zero-prefetch " << depth) {
      parallel::ZeroPrefetch prefetch(shards, world, depth);
      for (int pass = 0; pass < 2; ++pass) {
        prefetch.begin_pass(3);
        for (size_t k = 0; k < order.size(); ++k) {
          const int64_t g = order[k];
          prefetch.gather(g, k > 3);
          CHECK(prefetch.ahead() <= depth);
          CHECK(prefetch.ahead() == std::min<int64_t>(depth, int64_t(order.size() - k - 1)));
          same_as_ref(g);
          if (g >= 0) prefetch.release(g, false);
        }
        prefetch.release(-1, false);
        for (const Param* p : std::as_const(ps).all()) CHECK_FALSE(p->value.defined());
      }
      const parallel::PrefetchStats stats = prefetch.take_stats();
      CHECK(stats.gathers == 2 * int64_t(order.size()));
      CHECK(stats.gather_seconds > 0);
      CHECK(stats.out_of_order == 0);
      CHECK(prefetch.take_stats().gathers == 0);
    }
  }
  SECTION("a gather out of the expected order falls back to the synchronous path") {
    parallel::ZeroPrefetch prefetch(shards, world, 2);
    prefetch.begin_pass(3);
    prefetch.gather(-1, false);
    prefetch.gather(2, false);  // 0 was expected: what was prefetched is dropped
    CHECK(prefetch.ahead() == 0);
    same_as_ref(2);
    prefetch.release(2, false);
    prefetch.gather(0, false);
    same_as_ref(0);
    prefetch.release(0, false);
    prefetch.release(-1, false);
    CHECK(prefetch.take_stats().out_of_order == 1);
    prefetch.begin_pass(3);  // and the next pass prefetches again
    CHECK(prefetch.ahead() == 3);
    for (size_t k = 0; k < order.size(); ++k) {
      prefetch.gather(order[k], false);
      same_as_ref(order[k]);
      if (order[k] >= 0) prefetch.release(order[k], false);
    }
    prefetch.release(-1, false);
  }
  SECTION("a pass cut short leaves nothing behind for the next") {
    parallel::ZeroPrefetch prefetch(shards, world, 2);
    prefetch.begin_pass(3);
    prefetch.gather(-1, false);
    prefetch.release(-1, false);  // two blocks' all-gathers still in flight
    prefetch.begin_pass(3);
    for (size_t k = 0; k < order.size(); ++k) {
      prefetch.gather(order[k], false);
      same_as_ref(order[k]);
      if (order[k] >= 0) prefetch.release(order[k], false);
    }
    prefetch.release(-1, false);
  }
}

TEST_CASE("zero prefetch: the order it prefetches is the model's order of gathers",
          "[dist][zero_prefetch]") {
  if (dist_world().rank() != 0) return;  // one process: no collectives
  for (Arch arch : {Arch::gpt, Arch::mixtral})
    for (nn::Recompute recompute :
         {nn::Recompute::none, nn::Recompute::moe, nn::Recompute::block}) {
      DYNAMIC_SECTION(arch_name(arch) << " recompute " << int(recompute)) {
        ModelConfig config = test::small_model_config(arch);
        config.resolve();
        ParamSet ps(3);
        Transformer model(config, ps);
        std::vector<int64_t> gathers;
        TrainPass pass;
        pass.recompute = recompute;
        pass.params = {[&](int64_t g, bool) { gathers.push_back(g); }, [](int64_t, bool) {}};
        Tensor ids = Tensor::zeros({2, config.seq}, DType::i32);
        for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int32_t>()[i] = int32_t(i % 7 + 1);
        model.forward_backward(ids, ids, nn::RouterStep{}, pass);
        CHECK(gathers == parallel::ZeroPrefetch::pass_order(config.layers));
        // An evaluation's block hooks (Trainer::evaluate gathers group -1 around it).
        gathers.clear();
        const BlockHooks hooks{[&](int64_t g) { gathers.push_back(g); }, [](int64_t) {}};
        EvalOptions options;
        options.hooks = &hooks;
        model.evaluate(ids, ids, options);
        CHECK(gathers == parallel::ZeroPrefetch::pass_order(config.layers, false));
      }
    }
}
