// The JSON lines a tool wrote (score --per-token, loglikelihood, --metrics), one object each.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/run.h"

namespace moe::test {

inline std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  for (const std::string& line : lines_of(text)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace moe::test
