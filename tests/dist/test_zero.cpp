// ZeRO for the dense parameters (--zero 1|2|3, parallel::DenseShards) against --zero 0 on the
// same ranks: the same losses, gradient norms, parameters and optimizer state bit for bit (stage
// 1 always: the gradients are all-reduced as before and AdamW is elementwise; stages 2 and 3
// where the reduce-scatter adds in the all-reduce's order, which 2 ranks guarantee), with --ep,
// --shard-embedding, --comm-scheduler priority, --offload host, --recompute block and
// --grad-accum; a stage-3 checkpoint is --zero 0's file, resumed bitwise at the same layout and
// by --zero 2/1/0 and one process. Registered at 2 and 4 ranks (dist_zero_np2/np4).
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <map>

#include "moe/comm/communicator.h"
#include "moe/io/checkpoint.h"
#include "moe/optim/adamw.h"
#include "moe/parallel/zero.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"

moe::comm::Communicator& dist_world();
std::string dist_scratch_dir(const std::string& name);

using namespace moe;

namespace {

ModelConfig zero_model(Arch arch, DType dtype = DType::f32) {
  ModelConfig c = test::small_model_config(arch);
  c.dtype = dtype;
  // Centred routers, as moe-train trains them: a frozen whole parameter beside the slices, and a
  // router weight gathered again for the backward.
  c.router_center_rate = 1.0;
  c.resolve();
  return c;
}

train::TrainConfig zero_train(int64_t zero) {
  train::TrainConfig t;
  t.data = test::fortunes_path("linux");
  t.batch = 8;
  t.steps = 6;
  t.warmup = 1;
  t.eval_batches = 1;
  t.seed = 11;
  t.clip = 0.5;  // active: the norm and the clip factor must agree too
  t.zero = zero;
  return t;
}

// The first tensor (parameter or optimizer state) of two checkpoints that differs in any bit or
// is missing from one of them.
std::string first_difference(const io::Checkpoint& a, const io::Checkpoint& b) {
  for (auto [x, y] : {std::pair{&a.params, &b.params}, std::pair{&a.optim, &b.optim}}) {
    std::map<std::string, Tensor> theirs;
    for (const io::NamedTensor& nt : *y) theirs[nt.name] = nt.whole();
    if (x->size() != y->size()) return str(x->size(), " tensors against ", y->size());
    for (const io::NamedTensor& nt : *x) {
      auto it = theirs.find(nt.name);
      if (it == theirs.end()) return nt.name + " (missing)";
      const Tensor s = nt.whole();
      if (s.nbytes() != it->second.nbytes() ||
          std::memcmp(s.raw(), it->second.raw(), s.nbytes()) != 0)
        return nt.name;
    }
  }
  return "";
}

// Steps both runs `steps` times, requiring the same statistics and parameters bit for bit.
void require_same_run(train::Trainer& zero, train::Trainer& plain, int steps) {
  for (int i = 0; i < steps; ++i) {
    const train::StepStats a = zero.step(), b = plain.step();
    INFO("step " << i + 1);
    CHECK(a.forward.loss == b.forward.loss);
    CHECK(a.grad_norm == b.grad_norm);
  }
  // Parameters and optimizer state, gathered (--zero 3's values exist only around their use).
  CHECK(first_difference(zero.snapshot(), plain.snapshot()) == "");
}

}  // namespace

TEST_CASE("zero: stages 1 and 2 train bitwise as --zero 0 on the same ranks", "[dist][zero]") {
  comm::Communicator& world = dist_world();
  struct Case {
    Arch arch;
    DType dtype;
    int64_t ep;
  };
  std::vector<Case> cases{{Arch::gpt, DType::f32, 1}, {Arch::mixtral, DType::bf16, 1}};
  if (world.size() % 2 == 0) cases.push_back({Arch::mixtral, DType::f32, 2});
  for (const Case& c : cases)
    for (int64_t stage : {1, 2, 3}) {
      DYNAMIC_SECTION(arch_name(c.arch)
                      << " " << dtype_name(c.dtype) << " --ep " << c.ep << " --zero " << stage) {
        train::TrainConfig tz = zero_train(stage), t0 = zero_train(0);
        tz.ep = t0.ep = c.ep;
        train::Trainer zero(zero_model(c.arch, c.dtype), tz, {}, &world);
        train::Trainer plain(zero_model(c.arch, c.dtype), t0, {}, &world);
        REQUIRE(zero.dense_shards() != nullptr);
        // Every rank holds about 1/W of the dense moments (to one element).
        const parallel::DenseShards& shards = *zero.dense_shards();
        const int64_t slice = shards.end(world.rank()) - shards.begin(world.rank());
        CHECK(slice >= shards.total() / world.size());
        CHECK(slice <= shards.total() / world.size() + 1);
        if (stage == 3)  // values and gradients live in the slices: no whole one now
          for (const Param* p : std::as_const(zero.params()).all()) {
            CHECK(p->value.defined() != shards.covers(*p));
            CHECK(p->grad.defined() != shards.covers(*p));
          }
        if (stage >= 2 && world.size() > 2) {
          // MPICH's reduce-scatter may add 4 partial sums in another order than its all-reduce:
          // equal to float rounding of the sums (1e-7 relative), which Adam can amplify to
          // ~1e-4 of a parameter's scale within a few steps (as in test_data_parallel).
          for (int i = 0; i < 4; ++i) {
            const train::StepStats a = zero.step(), b = plain.step();
            CHECK(a.forward.loss == Approx(b.forward.loss).epsilon(1e-5));
            CHECK(a.grad_norm == Approx(b.grad_norm).epsilon(1e-4));
          }
          continue;
        }
        require_same_run(zero, plain, 4);
      }
    }
}

TEST_CASE("zero: with a sharded table, the priority scheduler and offloaded experts",
          "[dist][zero]") {
  comm::Communicator& world = dist_world();
  if (world.size() != 2) return;  // bitwise needs the 2-rank sum (see above)
  for (const char* with : {"shard-embedding", "comm-scheduler", "offload", "recompute"}) {
    DYNAMIC_SECTION(with) {
      train::TrainConfig tz = zero_train(3), t0 = zero_train(0);
      for (train::TrainConfig* t : {&tz, &t0}) {
        if (std::string(with) == "shard-embedding") t->shard_embedding = true;
        if (std::string(with) == "comm-scheduler") {
          t->comm_scheduler = comm::SchedulerMode::priority;
          t->partition_mb = 0.01;  // several micro-ops
        }
        if (std::string(with) == "recompute") {  // blocks gathered for the forward again
          t->recompute = nn::Recompute::block;
          t->grad_accum = 2;  // gradients kept over the micro-batches, reduced after the last
        }
        if (std::string(with) == "offload") {
          t->offload.tier = offload::Tier::host;
          t->ep = 2;
        }
      }
      train::Trainer zero(zero_model(Arch::mixtral), tz, {}, &world);
      train::Trainer plain(zero_model(Arch::mixtral), t0, {}, &world);
      // The sharded table stays out of ZeRO: its columns are already this rank's alone.
      for (const Param* p : std::as_const(zero.params()).all())
        CHECK(zero.dense_shards()->covers(*p) == parallel::DenseShards::shardable(*p));
      require_same_run(zero, plain, 3);
      for (const Param* p : std::as_const(zero.params()).all()) {  // between steps: slices only
        if (p->offloaded) continue;                                // the store's
        CHECK(p->value.defined() != zero.dense_shards()->covers(*p));
        CHECK(p->grad.defined() != zero.dense_shards()->covers(*p));
      }
      CHECK(zero.evaluate() == plain.evaluate());  // evaluation gathers block by block too
    }
  }
}

TEST_CASE("zero: one process accepts --zero and changes nothing", "[dist][zero]") {
  comm::Communicator& world = dist_world();
  if (world.rank() != 0) return;  // no collectives here
  train::Trainer zero(zero_model(Arch::gpt), zero_train(3), {});
  train::Trainer plain(zero_model(Arch::gpt), zero_train(0), {});
  CHECK(zero.dense_shards() == nullptr);
  require_same_run(zero, plain, 2);
}

TEST_CASE("zero: checkpoints are --zero 0's and resume under any stage and one process",
          "[dist][zero]") {
  comm::Communicator& world = dist_world();
  const std::string dir = dist_scratch_dir("moe-dist-zero-ckpt");
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  world.barrier();
  const ModelConfig model = zero_model(Arch::mixtral, DType::bf16);  // masters are saved too
  train::Trainer straight(model, zero_train(3), {}, &world);
  train::Trainer plain(model, zero_train(0), {}, &world);
  for (int i = 0; i < 2; ++i) {
    straight.step();
    plain.step();
  }
  // The logical state, gathered: the file --zero 0 writes (bitwise where the runs are).
  const io::Checkpoint gathered = straight.snapshot();
  if (world.size() == 2) CHECK(first_difference(gathered, plain.snapshot()) == "");
  const std::string path = straight.save(dir + "/z3");
  const io::Checkpoint file = io::load_checkpoint(path);
  CHECK(first_difference(file, gathered) == "");
  for (int i = 0; i < 2; ++i) straight.step();
  SECTION("the same layout resumes bitwise") {
    train::Trainer resumed(model, zero_train(3), {}, &world);
    resumed.restore(path);
    for (int i = 0; i < 2; ++i) resumed.step();
    CHECK(first_difference(resumed.snapshot(), straight.snapshot()) == "");
  }
  SECTION("--zero 2, 1 and 0 resume it; their state at the handover is the file's") {
    const io::Checkpoint after = straight.snapshot();
    for (int64_t stage : {2, 1, 0}) {
      train::Trainer resumed(model, zero_train(stage), {}, &world);
      resumed.restore(path);
      CHECK(first_difference(resumed.snapshot(), file) == "");
      for (int i = 0; i < 2; ++i) resumed.step();
      if (world.size() == 2) CHECK(first_difference(resumed.snapshot(), after) == "");
    }
  }
  SECTION("one process resumes it") {
    if (world.rank() == 0) {
      train::Trainer single(model, zero_train(0), {});
      single.restore(path);
      CHECK(first_difference(single.snapshot(), file) == "");
      const train::StepStats s = single.step();
      CHECK(std::isfinite(s.forward.loss));
    }
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("zero: bad settings are refused naming the flag", "[dist][zero]") {
  comm::Communicator& world = dist_world();
  for (int64_t bad : {-1, 4}) {
    INFO("--zero " << bad);
    try {
      train::Trainer t(zero_model(Arch::gpt), zero_train(bad), {}, &world);
      FAIL("accepted");
    } catch (const UsageError& e) {
      CHECK(std::string(e.what()).find("--zero") != std::string::npos);
    }
  }
}

TEST_CASE("zero: reduce_scatterv sums every rank's rows for each rank, counts varying",
          "[dist][zero]") {
  comm::Communicator& world = dist_world();
  const int R = world.size(), me = world.rank();
  // Rank r receives r + 1 rows of width 2, except the last rank: none.
  std::vector<int64_t> counts(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) counts[static_cast<size_t>(r)] = r + 1 < R ? r + 1 : 0;
  int64_t rows = 0;
  for (int64_t c : counts) rows += c;
  Tensor send = Tensor::empty({rows, 2});
  for (int64_t i = 0; i < rows * 2; ++i) send.data<float>()[i] = float(i) + 0.25f * float(me + 1);
  Tensor recv = Tensor::empty({counts[static_cast<size_t>(me)], 2});
  world.reduce_scatterv(send, recv, counts, comm::ReduceOp::sum);
  int64_t first = 0;
  for (int r = 0; r < me; ++r) first += counts[static_cast<size_t>(r)];
  float ranks = 0;
  for (int r = 0; r < R; ++r) ranks += 0.25f * float(r + 1);
  for (int64_t i = 0; i < recv.numel(); ++i)
    CHECK(recv.data<float>()[i] == float(R) * float(first * 2 + i) + ranks);
  // Counts that do not add up to send's rows are refused before any message.
  std::vector<int64_t> wrong = counts;
  wrong[0] += 1;
  Tensor bigger = Tensor::empty({wrong[static_cast<size_t>(me)], 2});
  CHECK_THROWS_WITH(world.reduce_scatterv(send, bigger, wrong, comm::ReduceOp::sum),
                    Catch::Contains("recv counts sum to"));
}

TEST_CASE("zero: DenseShards in buckets smaller than a parameter equal a whole-model AdamW",
          "[dist][zero]") {
  comm::Communicator& world = dist_world();
  const int R = world.size();
  auto build = [](ParamSet& ps) {
    ps.add("a", {7, 5}, Init::normal(0.5f));
    ps.add("b.bias", {3}, Init::normal(0.5f), /*decay=*/false);
    ps.add("e", {2, 3}, Init::normal(0.5f), true, /*expert=*/true);  // not ZeRO's
    ps.add("c", {11, 3}, Init::normal(0.5f));
  };
  // Gradients whose sums over the ranks and whose 1/R are exact (multiples of 1/16, R a power
  // of 2): every reduction order gives the same bits, so the reference is exact.
  auto grad_of = [](int64_t i, int rank, int step) {
    return static_cast<float>((i * 7 + rank * 3 + step * 5) % 17 - 8) / 16.0f;
  };
  // Stage 3's gather groups: "c" alone, the others together.
  auto group_of = [](const Param& p) -> int64_t { return p.name == "c" ? 1 : -1; };
  for (int stage : {1, 2, 3}) {
    DYNAMIC_SECTION("--zero " << stage) {
      ParamSet ps(3), ref(3);
      build(ps);
      build(ref);
      optim::AdamWConfig config;
      parallel::DenseShards shards(world, ps, stage, config, /*bucket_bytes=*/20,  // 5 elements
                                   group_of);
      CHECK(shards.total() == 35 + 3 + 33);
      CHECK_FALSE(shards.covers(ps.at("e")));
      optim::AdamW opt(ps, config, [&](const Param& p) { return !shards.covers(p); });
      optim::AdamW whole(ref, config);
      for (int step = 1; step <= 3; ++step) {
        for (Param* p : ref.all()) {
          Param& q = ps.at(p->name);
          if (!q.grad.defined()) q.grad = Tensor::zeros(q.shape);  // stage 3 drops them
          for (int64_t i = 0; i < p->numel(); ++i) {
            float sum = 0;
            for (int r = 0; r < R; ++r) sum += grad_of(i, r, step);
            p->grad.data<float>()[i] = sum / static_cast<float>(R);
            // Stage 2 reduces them itself; stage 1 (and the expert tensor) get GradSync's result.
            q.grad.data<float>()[i] = stage == 2 && shards.covers(q)
                                          ? grad_of(i, world.rank(), step)
                                          : p->grad.data<float>()[i];
          }
        }
        shards.reduce_gradients();
        if (stage == 2)
          for (const Param* p : std::as_const(ref).all())
            if (shards.covers(ps.at(p->name)))
              CHECK(shards.square_sum(ps.at(p->name)) == optim::grad_square_sum(*p));
        opt.step(1e-2f);
        shards.step(1e-2f, opt.steps_taken(), 1.0f);
        whole.step(1e-2f);
        if (stage == 3) {
          CHECK_FALSE(ps.at("c").value.defined());
          shards.gather(1);  // "c" only
          CHECK(ps.at("c").value.defined());
          CHECK_FALSE(ps.at("a").value.defined());
          shards.gather_all();
        }
        for (const Param* p : std::as_const(ref).all())
          CHECK(std::memcmp(p->value.raw(), ps.at(p->name).value.raw(), p->value.nbytes()) == 0);
        shards.release_all();
      }
      // The gathered state is the whole-model optimizer's, and a fresh shard set loads it.
      const std::vector<optim::OptimizerTensor> gathered = shards.gather_state();
      std::map<std::string, Tensor> want;
      for (const optim::OptimizerTensor& t : whole.state()) want[t.name] = t.tensor;
      CHECK(gathered.size() == 2 * 3);
      for (const optim::OptimizerTensor& t : gathered)
        CHECK(std::memcmp(t.tensor.raw(), want.at(t.name).raw(), t.tensor.nbytes()) == 0);
      if (stage == 3)  // the values, gathered whole, are ref's
        for (const auto& [name, value] : shards.gather_values())
          CHECK(std::memcmp(value.raw(), ref.at(name).value.raw(), value.nbytes()) == 0);
      if (stage == 3) shards.gather_all();  // a fresh set takes its slices from the parameters
      parallel::DenseShards again(world, ps, stage, config, 20, group_of);
      again.load_state(whole.state());
      const std::vector<optim::OptimizerTensor> reloaded = again.gather_state();
      for (const optim::OptimizerTensor& t : reloaded)
        CHECK(std::memcmp(t.tensor.raw(), want.at(t.name).raw(), t.tensor.nbytes()) == 0);
      // A tensor of a parameter this rank's slice holds part of, missing: refused, named.
      const int64_t at = again.begin(world.rank());
      const std::string name = at < 35 ? "adam.v.a" : at < 38 ? "adam.v.b.bias" : "adam.v.c";
      std::vector<optim::OptimizerTensor> missing = whole.state();
      std::erase_if(missing, [&](const optim::OptimizerTensor& t) { return t.name == name; });
      CHECK_THROWS_WITH(again.load_state(missing), Catch::Contains("missing tensor '" + name));
    }
  }
}
