// The layout string (moe/plan/layout.h): parsed once at the edge into typed values.
#include "moe/plan/layout.h"

#include <cstdlib>
#include <set>

#include "moe/error.h"

namespace moe::plan {

const char* placement_name(Placement placement) {
  switch (placement) {
    case Placement::fixed:
      return "static";
    case Placement::lpt:
      return "lpt";
    case Placement::flexmoe:
      return "flexmoe";
  }
  return "?";
}

namespace {

int64_t integer(const std::string& key, const std::string& value, int64_t low, int64_t high) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  MOE_USAGE_CHECK(!value.empty() && *end == '\0' && v >= low && v <= high, "layout: ", key, "=",
                  value, ": must be an integer from ", low, " to ", high);
  return v;
}

void set_key(Layout& l, const std::string& key, const std::string& value) {
  auto choice = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (value == n) return;
    std::string list;
    for (const char* n : names) list += (list.empty() ? "" : ", ") + std::string(n);
    throw UsageError(str("layout: ", key, "=", value, ": must be one of ", list));
  };
  if (key == "ep") {
    l.ep = integer(key, value, 1, int64_t(1) << 20);
  } else if (key == "dp") {
    l.dp = integer(key, value, 1, int64_t(1) << 20);
  } else if (key == "zero") {
    l.zero = int(integer(key, value, 0, 3));
  } else if (key == "offload") {
    choice({"none", "host", "ssd"});
    l.offload = offload::parse_tier(value);
  } else if (key == "placement") {
    choice({"static", "lpt", "flexmoe"});
    l.placement = value == "static" ? Placement::fixed
                  : value == "lpt"  ? Placement::lpt
                                    : Placement::flexmoe;
  } else if (key == "a2a") {
    choice({"flat", "hierarchical"});
    l.a2a = comm::parse_a2a_algorithm(value);
  } else if (key == "scheduler") {
    choice({"off", "priority"});
    l.scheduler = comm::parse_scheduler_mode(value);
  } else {
    throw UsageError(str("layout: unknown key '", key,
                         "' (keys: ep, dp, zero, offload, placement, a2a, scheduler)"));
  }
}

}  // namespace

Layout parse_layout(std::string_view text) {
  Layout layout;
  std::set<std::string> seen;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string pair(text.substr(begin, end - begin));
    begin = end + 1;
    if (pair.empty() && end == text.size() && seen.empty()) break;  // "" is every default
    const size_t eq = pair.find('=');
    MOE_USAGE_CHECK(eq != std::string::npos && eq > 0, "layout: '", pair,
                    "' is not key=value (e.g. ep=8,zero=1)");
    const std::string key = pair.substr(0, eq);
    MOE_USAGE_CHECK(seen.insert(key).second, "layout: key '", key, "' is given twice");
    set_key(layout, key, pair.substr(eq + 1));
  }
  return layout;
}

std::string layout_text(const Layout& l) {
  return str("ep=", l.ep, ",dp=", l.dp, ",zero=", l.zero,
             ",offload=", offload::tier_name(l.offload), ",placement=", placement_name(l.placement),
             ",a2a=", comm::a2a_algorithm_name(l.a2a),
             ",scheduler=", comm::scheduler_mode_name(l.scheduler));
}

Layout check_layout(Layout l, int64_t ranks, const std::vector<int64_t>& experts_per_layer) {
  MOE_USAGE_CHECK(ranks % l.ep == 0, "layout: ep=", l.ep, " does not divide the cluster's ", ranks,
                  " ranks");
  if (l.dp == 0) l.dp = ranks / l.ep;
  MOE_USAGE_CHECK(l.ep * l.dp == ranks, "layout: ep=", l.ep, " x dp=", l.dp, " is ", l.ep * l.dp,
                  " ranks, but the cluster has ", ranks);
  for (size_t i = 0; i < experts_per_layer.size(); ++i)
    MOE_USAGE_CHECK(experts_per_layer[i] % l.ep == 0, "layout: ep=", l.ep, " does not divide the ",
                    experts_per_layer[i], " experts of MoE layer ", i);
  MOE_USAGE_CHECK(l.placement == Placement::fixed || l.ep > 1,
                  "layout: placement=", placement_name(l.placement),
                  " needs ep > 1 (it moves experts between ranks)");
  return l;
}

}  // namespace moe::plan
