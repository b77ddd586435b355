#include "common/ranks.h"

#include "moe/error.h"

namespace moe::tools {

void check_ranks_agree(comm::Communicator& world, const std::string& tool,
                       const nlohmann::json& settings) {
  if (world.size() == 1) return;
  std::string keys;
  for (const auto& [key, value] : settings.items()) keys += key + " ";
  world.check_same_everywhere(str(tool, "'s list of settings"), keys);
  for (const auto& [key, value] : settings.items())
    world.check_same_everywhere(str(tool, " setting '", key, "'"), value.dump());
}

}  // namespace moe::tools
