// Expert placement while training (moe-train --placement lpt | flexmoe): which rank computes a row
// never changes its value, so a placed run trains the model plain expert parallelism and one
// process train, to float summation order (an expert's rows arrive in another order, and its
// gradient sums over other ranks). FlexMoE's vExpert maps change during the test (a cost model
// where compute dominates, replans every step): expand, shrink and migrate all run. Runs on 2
// and 4 ranks.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <set>

#include "moe/comm/communicator.h"
#include "moe/train/trainer.h"
#include "support/ep_compare.h"

moe::comm::Communicator& dist_world();
std::string dist_scratch_dir(const std::string& name);

using namespace moe;
using namespace moe::test;

namespace {

// Compute dominates: moving tokens and syncing replicas cost next to nothing, so spreading a hot
// expert's tokens over replicas always pays and the policy maker acts every step.
balance::CostModel compute_bound(int ranks) {
  balance::CostModel c;
  c.gemm_tokens_per_s.assign(static_cast<size_t>(ranks), 1e4);
  c.bandwidth.assign(static_cast<size_t>(ranks * ranks), 1e12);
  c.allreduce_bytes_per_s.assign(static_cast<size_t>(ranks + 1), 1e12);
  c.bytes_per_token = 64;
  c.grad_bytes_per_expert = 1e4;
  c.state_bytes_per_expert = 3e4;
  return c;
}

train::TrainConfig placed(int64_t ep, const std::string& policy) {
  train::TrainConfig t = ep_train(ep);
  t.placement = train::parse_placement_rule(policy);
  t.balance_threshold = 1.0;  // replan whenever the ranks are not exactly even
  t.replan_every = 1;
  return t;
}

}  // namespace

TEST_CASE("placement: lpt and flexmoe train what static and one process train", "[dist]") {
  comm::Communicator& world = dist_world();
  const int64_t ep = world.size();
  for (const char* policy : {"lpt", "flexmoe"})
    for (Arch arch : {Arch::gpt, Arch::mixtral}) {
      DYNAMIC_SECTION(policy << ", " << arch_name(arch) << ", --ep " << ep) {
        train::Trainer parallel(ep_model(arch), placed(ep, policy), {}, &world);
        train::Trainer single(ep_model(arch), ep_train(1), {});
        REQUIRE(parallel.placement());
        parallel.placement()->set_cost(compute_bound(static_cast<int>(ep)));
        // lpt: every rank stores every expert; flexmoe: its V = ceil(E/P) + 1 slots. Gathered,
        // they are the single process's initial values.
        const bool flex = std::string(policy) == "flexmoe";
        REQUIRE(parallel.params().at("blocks.0.moe.experts.w1").value.dim(0) ==
                (flex ? (4 + ep - 1) / ep + 1 : 4));
        std::string where;
        REQUIRE(worst_difference(parallel.snapshot(), single.snapshot(), where) == 0);
        std::set<std::string> kinds;
        for (int i = 0; i < 4; ++i) {
          train::StepStats a = parallel.step();
          train::StepStats b = single.step();
          INFO("step " << i + 1);
          REQUIRE(a.forward.loss == Approx(b.forward.loss).epsilon(1e-5));
          REQUIRE(a.forward.aux_loss == Approx(b.forward.aux_loss).epsilon(1e-5));
          REQUIRE(a.grad_norm == Approx(b.grad_norm).epsilon(1e-4));
          REQUIRE(a.rank_load_max_over_mean.size() == a.forward.moe.size());
          for (double r : a.rank_load_max_over_mean) REQUIRE(r >= 1.0);
          for (const train::Replan& r : a.replans) {
            REQUIRE(r.predicted_after_s < r.predicted_before_s);  // every move must pay
            for (const balance::PlanAction& act : r.actions)
              kinds.insert(act.kind == balance::PlanAction::Kind::expand   ? "expand"
                           : act.kind == balance::PlanAction::Kind::shrink ? "shrink"
                                                                           : "migrate");
          }
        }
        if (std::string(policy) == "flexmoe") {
          INFO("kinds of action seen: " << kinds.size());
          REQUIRE(kinds.count("expand"));
          // The mixtral model's routing also makes the maps give replicas back (on 2 ranks the
          // gpt one does all three too; on 4 ranks it only expands in these 4 steps).
          if (arch == Arch::mixtral) REQUIRE((kinds.count("shrink") || kinds.count("migrate")));
        }
        const double worst = worst_difference(parallel.snapshot(), single.snapshot(), where);
        INFO("worst parameter difference relative to its scale: " << worst << " in " << where);
        REQUIRE(worst < 1e-3);
      }
    }
}

TEST_CASE("placement: flexmoe stores a rank's vExpert slots, and replicas stay equal", "[dist]") {
  comm::Communicator& world = dist_world();
  const int64_t ep = world.size();
  train::Trainer a(ep_model(Arch::mixtral), placed(ep, "flexmoe"), {}, &world);
  a.placement()->set_cost(compute_bound(static_cast<int>(ep)));
  const auto* flex = dynamic_cast<const train::FlexMoEPlacement*>(a.placement());
  REQUIRE(flex);
  // Every slot of every layer holds its expert's state (zeros when empty at the start), and every
  // replica of an expert equals the one the checkpoint takes (its first holder's), bit for bit:
  // copied by Expand, then updated by the same gradient sum, added in rank order on every holder
  // (an all-reduce of 3 or more ranks need not give every rank the same bits).
  auto check_slots = [&](bool initial) {
    const io::Checkpoint whole = a.snapshot();
    for (const auto& [block, map] : flex->maps())
      for (const Param* p : train::expert_params(a.params(), block)) {
        const io::NamedTensor* logical = nullptr;
        for (const io::NamedTensor& nt : whole.params)
          if (nt.name == p->name) logical = &nt;
        REQUIRE(logical);
        REQUIRE(p->value.dim(0) == map.slots_per_rank());
        REQUIRE(logical->tensor.dim(0) == map.experts());  // (the same on every rank)
        for (int v = 0; v < map.slots_per_rank(); ++v) {
          const int32_t e = map.slot(world.rank(), v);
          if (e < 0 && !initial) continue;  // a slot Shrink freed keeps stale values, unused
          const Tensor slot = p->value.rows(v, v + 1);
          const Tensor want = e >= 0 ? logical->tensor.rows(e, e + 1) : Tensor::zeros(slot.shape());
          INFO(p->name << " slot " << v << " (expert " << e << ")");
          // CHECK: a failure here must not skip this rank's next collective (the others wait).
          CHECK(std::memcmp(slot.raw(), want.raw(), slot.nbytes()) == 0);
        }
      }
  };
  check_slots(true);  // empty slots start as zeros
  int64_t expands = 0, copies = 0;
  for (int i = 0; i < 4; ++i) {
    for (const train::Replan& r : a.step().replans) {
      int64_t planned = 0;
      for (const balance::PlanAction& act : r.actions)
        planned += act.kind == balance::PlanAction::Kind::expand;
      REQUIRE(r.copies <= planned);  // at most one per Expand, none for a replica dropped again
      REQUIRE(r.measured_adjustment_s >= 0);
      expands += planned;
      copies += r.copies;
    }
    check_slots(false);
  }
  REQUIRE(expands > 0);
  REQUIRE(copies > 0);
}

TEST_CASE("placement: flexmoe's maps are saved and restored with the checkpoint", "[dist]") {
  comm::Communicator& world = dist_world();
  const int64_t ep = world.size();
  train::Trainer a(ep_model(Arch::mixtral), placed(ep, "flexmoe"), {}, &world);
  a.placement()->set_cost(compute_bound(static_cast<int>(ep)));
  for (int i = 0; i < 2; ++i) a.step();
  const nlohmann::json state = a.placement()->state();
  REQUIRE(state.at("layers").size() == 2);
  train::Trainer b(ep_model(Arch::mixtral), placed(ep, "flexmoe"), {}, &world);
  REQUIRE(b.placement()->load_state(state).empty());
  REQUIRE(b.placement()->state() == state);
  // Another rank count starts afresh, with a note saying so.
  nlohmann::json other = state;
  other["ranks"] = ep + 1;
  REQUIRE_THAT(b.placement()->load_state(other), Catch::Contains("start again"));
  nlohmann::json broken = state;
  broken["layers"]["0"]["slots"] = std::vector<int>{99};
  REQUIRE_THROWS_WITH(b.placement()->load_state(broken),
                      Catch::Contains("\"placement_state\": "));
}

TEST_CASE("placement: bad settings are refused with the flag to change", "[dist]") {
  comm::Communicator& world = dist_world();
  train::TrainConfig t = placed(1, "lpt");
  REQUIRE_THROWS_WITH(train::Trainer(ep_model(Arch::gpt), t, {}, &world),
                      Catch::Contains("needs --ep > 1"));
  t = placed(world.size(), "flexmoe");
  t.vexperts_per_rank = 1;  // 4 experts need 2 slots per rank on 2 ranks
  if (world.size() == 2)
    REQUIRE_THROWS_WITH(train::Trainer(ep_model(Arch::gpt), t, {}, &world),
                        Catch::Contains("--vexperts-per-rank 1: 2 ranks x 1 slots cannot hold"));
  if (world.size() == 4) {  // 2 expert groups of 2: replicas would span groups
    t = placed(2, "flexmoe");
    REQUIRE_THROWS_WITH(train::Trainer(ep_model(Arch::gpt), t, {}, &world),
                        Catch::Contains("needs --ep equal to the number of ranks (4), not 2"));
    t = placed(2, "lpt");  // lpt keeps every expert current everywhere: any --ep
    train::Trainer lpt(ep_model(Arch::gpt), t, {}, &world);
    train::Trainer single(ep_model(Arch::gpt), ep_train(1), {});
    step_both(lpt, single, 2);
    std::string where;
    REQUIRE(worst_difference(lpt, single, where) < 1e-3);
  }
  // An unknown policy is refused where its name is read (moe-train's flags, a checkpoint).
  REQUIRE_THROWS_WITH(placed(world.size(), "sideways"),
                      Catch::Contains("--placement must be static, lpt or flexmoe"));
  t = placed(world.size(), "lpt");
  t.offload.tier = offload::Tier::host;
  REQUIRE_THROWS_WITH(train::Trainer(ep_model(Arch::gpt), t, {}, &world),
                      Catch::Contains("does not combine with --offload"));
}

TEST_CASE("placement: a placed run's checkpoint is one whole file that every layout resumes",
          "[dist]") {
  comm::Communicator& world = dist_world();
  const int64_t ep = world.size();
  const std::string dir = dist_scratch_dir("placement-whole");
  train::Trainer a(ep_model(Arch::mixtral), placed(ep, "flexmoe"), {}, &world);
  a.placement()->set_cost(compute_bound(static_cast<int>(ep)));
  for (int i = 0; i < 3; ++i) a.step();
  const std::string file = a.save(dir);
  REQUIRE(std::filesystem::is_regular_file(file));  // every logical expert once, whole
  const io::Checkpoint reference = a.snapshot();    // the slots gathered
  std::string where;
  train::Trainer one(ep_model(Arch::mixtral), ep_train(1), {});  // one process resumes it
  one.restore(file);
  REQUIRE(one.steps_done() == 3);
  REQUIRE(worst_difference(one.snapshot(), reference, where) == 0);
  SECTION("flexmoe again, with its maps") {
    train::Trainer b(ep_model(Arch::mixtral), placed(ep, "flexmoe"), {}, &world);
    b.restore(file);
    REQUIRE(b.placement()->state() == a.placement()->state());
    REQUIRE(worst_difference(b.snapshot(), reference, where) == 0);
  }
  SECTION("static expert parallelism takes its slices") {
    train::Trainer b(ep_model(Arch::mixtral), ep_train(ep), {}, &world);
    b.restore(file);
    REQUIRE(b.params().at("blocks.0.moe.experts.w1").value.dim(0) == 4 / ep);
    REQUIRE(worst_difference(b, one, where) == 0);
    REQUIRE(b.steps_done() == 3);
  }
  SECTION("static with the sharded embedding") {
    train::TrainConfig t = ep_train(ep);
    t.shard_embedding = true;
    train::Trainer b(ep_model(Arch::mixtral), t, {}, &world);
    b.restore(file);
    REQUIRE(worst_difference(b, one, where) == 0);
  }
  SECTION("lpt") {
    train::Trainer b(ep_model(Arch::mixtral), placed(ep, "lpt"), {}, &world);
    b.restore(file);
    REQUIRE(worst_difference(b.snapshot(), reference, where) == 0);
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}
