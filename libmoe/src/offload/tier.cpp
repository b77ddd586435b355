// The offload setting's names (see moe/offload/tier.h).
#include "moe/offload/tier.h"

#include "moe/error.h"
#include "moe/settings.h"

namespace moe::offload {

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::none:
      return "none";
    case Tier::host:
      return "host";
    case Tier::ssd:
      return "ssd";
    case Tier::automatic:
      return "auto";
  }
  return "?";
}

Tier parse_tier(std::string_view name) {
  for (Tier tier : {Tier::none, Tier::host, Tier::ssd, Tier::automatic})
    if (name == tier_name(tier)) return tier;
  throw UsageError(
      str(flag_for(Setting::offload), " must be none, host, ssd or auto (got '", name, "')"));
}

}  // namespace moe::offload
