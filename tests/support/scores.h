// moe-infer score as the CLI tests run it: the JSON lines of `max_sequences` windows of `data`
// (batch 2, one thread), without the throughput fields, so two runs compare equal when their
// scores do.
#pragma once
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/run.h"

namespace moe::test {

inline std::vector<nlohmann::json> score_lines(const std::string& model, const std::string& data,
                                               int max_sequences = 4) {
  const auto r = run_command(tool("moe-infer", "score --model " + model + " --data " + data +
                                                   " --max-sequences " +
                                                   std::to_string(max_sequences) +
                                                   " --batch 2 --threads 1 -q"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::vector<nlohmann::json> out;
  for (const std::string& line : lines_of(r.out)) {
    nlohmann::json j = nlohmann::json::parse(line);
    for (auto it = j.begin(); it != j.end();)
      it = it.key().find("_per_s") != std::string::npos ? j.erase(it) : std::next(it);
    out.push_back(j);
  }
  REQUIRE(out.size() == static_cast<size_t>(max_sequences));
  return out;
}

}  // namespace moe::test
