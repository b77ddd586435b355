// The training config's named settings: each enum's names, parsed once where a name is read
// (moe-train's flags, a checkpoint's train_config), and the saved text that old checkpoints hold.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "moe/error.h"
#include "moe/offload/store_settings.h"
#include "moe/offload/tier.h"
#include "moe/settings.h"
#include "moe/train/placement.h"
#include "moe/train/tasks.h"
#include "moe/train/trainer.h"

using namespace moe;

TEST_CASE("settings: every name parses back to its value", "[train][settings]") {
  using offload::Tier;
  for (Tier t : {Tier::none, Tier::host, Tier::ssd, Tier::automatic})
    REQUIRE(offload::parse_tier(offload::tier_name(t)) == t);
  REQUIRE(std::string(offload::tier_name(Tier::automatic)) == "auto");
  using train::PlacementRule;
  for (PlacementRule p : {PlacementRule::fixed, PlacementRule::lpt, PlacementRule::flexmoe})
    REQUIRE(train::parse_placement_rule(train::placement_rule_name(p)) == p);
  REQUIRE(std::string(train::placement_rule_name(PlacementRule::fixed)) == "static");
  using train::AllocationRule;
  for (AllocationRule r : {AllocationRule::workload, AllocationRule::equal})
    REQUIRE(train::parse_allocation_rule(train::allocation_rule_name(r)) == r);
}

TEST_CASE("settings: an unknown name is refused with the flag and every valid name",
          "[train][settings]") {
  REQUIRE_THROWS_AS(offload::parse_tier("disk"), UsageError);
  REQUIRE_THROWS_WITH(offload::parse_tier("disk"),
                      "--offload must be none, host, ssd or auto (got 'disk')");
  REQUIRE_THROWS_WITH(offload::parse_tier("Host"),  // names are exact
                      Catch::Contains("(got 'Host')"));
  REQUIRE_THROWS_AS(train::parse_placement_rule("sideways"), UsageError);
  REQUIRE_THROWS_WITH(train::parse_placement_rule("sideways"),
                      "--placement must be static, lpt or flexmoe (got 'sideways')");
  REQUIRE_THROWS_AS(train::parse_allocation_rule("fair"), UsageError);
  REQUIRE_THROWS_WITH(train::parse_allocation_rule("fair"),
                      "--task-allocation must be workload or equal (got 'fair')");
}

TEST_CASE("settings: the flag table names moe-train's flags", "[train][settings]") {
  REQUIRE(std::string(flag_for(Setting::offload)) == "--offload");
  REQUIRE(std::string(flag_for(Setting::comm_scheduler)) == "--comm-scheduler");
  REQUIRE(std::string(flag_for(Setting::task_replan_every)) == "--task-replan-every");
  REQUIRE(std::string(flag_for(Setting::data_format)) == "--data-format");
}

TEST_CASE("settings: a train_config saves each named setting as the text it always had",
          "[train][settings]") {
  // The names every earlier build wrote: old checkpoints resume, and new ones are the same text.
  const nlohmann::json defaults = train::to_json(train::TrainConfig{});
  REQUIRE(defaults.at("data_format") == "auto");
  REQUIRE(defaults.at("a2a") == "flat");
  REQUIRE(defaults.at("comm_scheduler") == "off");
  REQUIRE(defaults.at("placement") == "static");
  REQUIRE(defaults.at("offload") == "none");
  REQUIRE(defaults.at("expert_cache") == "lru");
  REQUIRE(defaults.at("recompute") == "none");
  REQUIRE(defaults.at("task_allocation") == "workload");
  nlohmann::json saved = defaults;
  saved["data_format"] = "u32";
  saved["a2a"] = "hierarchical";
  saved["comm_scheduler"] = "priority";
  saved["placement"] = "flexmoe";
  saved["offload"] = "auto";
  saved["expert_cache"] = "lfu";
  saved["recompute"] = "block";
  saved["task_allocation"] = "equal";
  const train::TrainConfig c = train::train_config_from_json(saved);
  REQUIRE(c.data_format == io::TokenFormat::u32);
  REQUIRE(c.a2a == comm::A2AAlgorithm::hierarchical);
  REQUIRE(c.comm_scheduler == comm::SchedulerMode::priority);
  REQUIRE(c.placement == train::PlacementRule::flexmoe);
  REQUIRE(c.offload.tier == offload::Tier::automatic);
  REQUIRE(c.offload.expert_cache == offload::CachePolicy::lfu);
  REQUIRE(c.recompute == nn::Recompute::block);
  REQUIRE(c.task_allocation == train::AllocationRule::equal);
  REQUIRE(train::to_json(c) == saved);
}

TEST_CASE("settings: a checkpoint's unknown setting name is refused naming the key",
          "[train][settings]") {
  nlohmann::json saved = train::to_json(train::TrainConfig{});
  saved["offload"] = "tape";
  REQUIRE_THROWS_WITH(train::train_config_from_json(saved),
                      "training config: \"offload\": --offload must be none, host, ssd or auto "
                      "(got 'tape')");
  saved["offload"] = 3;  // not a name at all
  REQUIRE_THROWS_WITH(train::train_config_from_json(saved),
                      Catch::StartsWith("training config: ") && Catch::Contains("offload"));
}

TEST_CASE("settings: the offload settings save as the flat keys every build has written",
          "[train][settings]") {
  // TrainConfig::offload is one struct (offload::StoreSettings, the store's own); a checkpoint's
  // train_config keeps the flat keys of earlier builds, sizes as the text the user gave.
  train::TrainConfig c;
  offload::StoreSettings& o = c.offload;
  o.tier = offload::Tier::ssd;
  o.device_budget = "12KiB";
  o.host_budget = "1MiB";
  o.ssd_dir = "/scratch/experts";
  o.pin_fraction = 0.5;
  o.prefetch_depth = 3;
  o.optimizer_overlap = false;
  o.expert_cache = offload::CachePolicy::lfu;
  o.lfu = {2.0, 0.5, 4};
  o.stage_on_host = true;  // for tests: never saved
  const nlohmann::json j = train::to_json(c);
  const nlohmann::json expected = {{"offload", "ssd"},
                                   {"device_budget", "12KiB"},
                                   {"host_budget", "1MiB"},
                                   {"ssd_dir", "/scratch/experts"},
                                   {"pin_fraction", 0.5},
                                   {"prefetch_depth", 3},
                                   {"optimizer_overlap", false},
                                   {"expert_cache", "lfu"},
                                   {"lfu_threshold", 2.0},
                                   {"lfu_beta", 0.5},
                                   {"lfu_period", 4}};
  for (const auto& [key, value] : expected.items()) {
    INFO(key);
    REQUIRE(j.at(key) == value);
  }
  REQUIRE(j.size() == train::to_json(train::TrainConfig{}).size());  // no key added or nested
  REQUIRE(!j.contains("stage_on_host"));
  const train::TrainConfig back = train::train_config_from_json(j);
  REQUIRE(train::to_json(back) == j);
  REQUIRE(back.offload.lfu.period == 4);
  REQUIRE(!back.offload.stage_on_host);
  // The budgets are read from that text once, naming the flag of one that does not parse.
  const offload::StoreBudgets b = offload::parse_budgets(c.offload);
  REQUIRE(b.device == 12 * 1024);
  REQUIRE(b.host == 1024 * 1024);
  o.host_budget = "lots";
  REQUIRE_THROWS_WITH(offload::parse_budgets(c.offload), Catch::Contains("--host-budget 'lots'"));
}
