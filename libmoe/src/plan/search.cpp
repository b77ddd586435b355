// moe-plan search (moe/plan/search.h): enumerate, predict, drop what does not fit, rank, explain.
#include "moe/plan/search.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "moe/io/trace.h"
#include "moe/plan/offload_cache.h"
#include "moe/settings.h"
#include "plan/check.h"
#include "plan/report_text.h"

namespace moe::plan {

namespace {

std::vector<int64_t> moe_experts_of(const ModelConfig& config) {
  std::vector<int64_t> out;
  for (int64_t e : config.experts_per_layer)
    if (e > 0) out.push_back(e);
  return out;
}

// The first tier a plan does not fit (0 device, 1 host, 2 ssd), or -1.
int first_short_tier(const MemoryPlan& m) {
  for (int t = 0; t < 3; ++t)
    if (m.shortfall(t) > 0) return t;
  return -1;
}

// How far a plan is from fitting: its largest shortfall relative to the tier's capacity.
double misfit(const MemoryPlan& m) {
  double worst = 0;
  for (int t = 0; t < 3; ++t)
    if (m.shortfall(t) > 0)
      worst = std::max(worst, m.capacity[t] > 0 ? m.shortfall(t) / m.capacity[t] : 1e300);
  return worst;
}

// The critical path's terms (predict_step's step_s is their sum), as people name them.
std::vector<std::pair<const char*, double>> path_terms(const StepTime& t) {
  return {{"dense compute", t.dense_s},      {"expert compute", t.expert_s},
          {"all-to-all", t.a2a_s},           {"exposed all-reduce", t.allreduce_exposed_s},
          {"ZeRO gathers", t.zero_gather_s}, {"exposed optimizer", t.optimizer_exposed_s},
          {"non-GEMM work", t.non_gemm_s}};
}

// The key=value pairs of `a`'s layout that differ from `b`'s, comma-separated.
std::string differing_keys(const Layout& a, const Layout& b) {
  auto pairs = [](const Layout& l) {
    std::vector<std::string> out;
    const std::string text = layout_text(l);
    for (size_t begin = 0, end; begin <= text.size(); begin = end + 1) {
      end = std::min(text.find(',', begin), text.size());
      out.push_back(text.substr(begin, end - begin));
    }
    return out;
  };
  const std::vector<std::string> pa = pairs(a), pb = pairs(b);
  std::string out;
  for (size_t i = 0; i < pa.size(); ++i)
    if (pa[i] != pb[i]) out += (out.empty() ? "" : ",") + pa[i];
  return out;
}

std::string nothing_fits(const SearchResult& r, const Prediction& closest) {
  const int t = first_short_tier(closest.memory);
  return str("no layout of ", r.inputs.model_name, " fits cluster '", r.inputs.cluster.name, "' (",
             r.inputs.cluster.ranks(), " ranks, ", r.inputs.tokens_per_rank,
             " tokens per rank and step): ", r.summary(), "; the closest, ",
             layout_text(closest.layout), ", needs ", human_bytes(closest.memory.need[t]), " of ",
             kTierNames[t], " memory per device against ", human_bytes(closest.memory.capacity[t]),
             " (short by ", human_bytes(closest.memory.shortfall(t)),
             "): a cluster with more memory, more ranks, or a smaller ", flag_for(Setting::batch));
}

}  // namespace

ClusterSpec ranks_of(const ClusterSpec& cluster, int64_t ranks) {
  if (ranks == 0) return cluster;
  const int64_t G = cluster.devices_per_node;
  MOE_USAGE_CHECK(ranks >= 1 && ranks <= cluster.ranks(), "ranks: ", ranks, " asked, but cluster '",
                  cluster.name, "' has ", cluster.ranks(), " devices");
  MOE_USAGE_CHECK(ranks <= G || ranks % G == 0, "ranks: ", ranks,
                  " is neither part of one node nor whole nodes (", G, " devices per node)");
  ClusterSpec part = cluster;
  if (ranks <= G) {
    // Part of one node: each device keeps its share of the node's host memory and SSD (the other
    // devices may run other work).
    part.nodes = 1;
    part.devices_per_node = ranks;
    part.host_bytes = cluster.host_bytes * double(ranks) / double(G);
    part.ssd_bytes = cluster.ssd_bytes * double(ranks) / double(G);
  } else {
    part.nodes = ranks / G;
  }
  return part;
}

std::vector<Layout> enumerate_layouts(const ModelConfig& config, const ClusterSpec& cluster) {
  const std::vector<int64_t> experts = moe_experts_of(config);
  const int64_t R = cluster.ranks();
  std::vector<OffloadTier> tiers = {OffloadTier::none};
  if (cluster.host_bytes > 0) tiers.push_back(OffloadTier::host);
  if (cluster.ssd_bytes > 0) tiers.push_back(OffloadTier::ssd);
  std::vector<Layout> out;
  for (int64_t ep = 1; ep <= (experts.empty() ? 1 : R); ++ep) {
    if (R % ep != 0 ||
        std::any_of(experts.begin(), experts.end(), [&](int64_t e) { return e % ep != 0; }))
      continue;
    std::vector<Placement> placements = {Placement::fixed};
    if (ep > 1) placements.insert(placements.end(), {Placement::lpt, Placement::flexmoe});
    std::vector<comm::A2AAlgorithm> a2as = {comm::A2AAlgorithm::flat};
    if (ep > cluster.devices_per_node && cluster.devices_per_node > 1)
      a2as.push_back(comm::A2AAlgorithm::hierarchical);
    for (int zero = 0; zero <= (R > 1 ? 3 : 0); ++zero)
      for (OffloadTier tier : tiers)
        for (Placement placement : placements)
          for (comm::A2AAlgorithm a2a : a2as)
            for (int s = 0; s <= (R > 1 ? 1 : 0); ++s)
              out.push_back({ep, R / ep, zero, tier, placement, a2a,
                             s ? comm::SchedulerMode::priority : comm::SchedulerMode::off});
  }
  return out;
}

std::string SearchResult::summary() const {
  std::string why;
  for (int t = 0; t < 3; ++t)
    if (short_of[t] > 0)
      why += str(why.empty() ? " (" : ", ", short_of[t], " short of ", kTierNames[t], " memory");
  return str(considered, " layouts of ", inputs.cluster.ranks(),
             " ranks considered: ", ranked.size(), " fit, ", dropped(), " dropped", why,
             why.empty() ? "" : ")");
}

SearchResult search(const SearchInputs& in, int64_t explain_top) {
  SearchResult r;
  r.inputs = in;
  std::vector<std::pair<Prediction, size_t>> fit;  // with the enumeration index (ties)
  Prediction closest;
  double closest_misfit = -1;
  for (const Layout& layout : enumerate_layouts(in.config, in.cluster)) {
    Prediction p = predict_layout(in, layout);
    ++r.considered;
    const int tier = first_short_tier(p.memory);
    if (tier < 0) {
      fit.emplace_back(std::move(p), fit.size());
      continue;
    }
    ++r.short_of[tier];
    if (closest_misfit < 0 || misfit(p.memory) < closest_misfit) {
      closest_misfit = misfit(p.memory);
      closest = std::move(p);
    }
  }
  if (fit.empty()) throw Error(nothing_fits(r, closest));
  std::sort(fit.begin(), fit.end(), [](const auto& a, const auto& b) {
    if (a.first.time.tokens_per_s != b.first.time.tokens_per_s)
      return a.first.time.tokens_per_s > b.first.time.tokens_per_s;
    if (a.first.memory.need[0] != b.first.memory.need[0])
      return a.first.memory.need[0] < b.first.memory.need[0];
    return a.second < b.second;
  });
  for (auto& [p, index] : fit) r.ranked.push_back({std::move(p), ""});
  const size_t n = r.ranked.size();
  if (n == 1) r.ranked[0].why = "the only layout that fits";
  for (size_t i = 0; i + 1 < n && int64_t(i) < explain_top; ++i)
    r.ranked[i].why = explain(r.ranked[i].prediction, r.ranked[i + 1].prediction, int64_t(i) + 2);
  return r;
}

SearchInputs read_search_inputs(const SearchRequest& r) {
  SearchInputs in = read_plan_inputs(r.model, r.trace, r.cluster, r.batch, r.seq,
                                     TraceAccesses::if_cluster_has_ssd);
  in.cluster = ranks_of(in.cluster, r.ranks);
  return in;
}

std::string explain(const Prediction& a, const Prediction& b, int64_t b_rank) {
  const auto ta = path_terms(a.time), tb = path_terms(b.time);
  size_t best = 0;
  for (size_t i = 1; i < ta.size(); ++i)
    if (tb[i].second - ta[i].second > tb[best].second - ta[best].second) best = i;
  const std::string keys = differing_keys(a.layout, b.layout),
                    other = differing_keys(b.layout, a.layout);
  const double saved = tb[best].second - ta[best].second;
  if (!(a.time.step_s < b.time.step_s) || saved <= 0) {
    if (a.memory.need[0] < b.memory.need[0])
      return str("same predicted step as #", b_rank, " in less device memory (",
                 human_bytes(a.memory.need[0]), " against ", human_bytes(b.memory.need[0]),
                 ") with ", keys, " instead of ", other);
    return str("same predicted step and device memory as #", b_rank, "; listed first as the ",
               "simpler layout (", keys, " instead of ", other, ")");
  }
  return str(tb[best].first, " ", percent_text(saved / tb[best].second), " lower than #", b_rank,
             " (", human_seconds(ta[best].second), " against ", human_seconds(tb[best].second),
             ") with ", keys, " instead of ", other, "; step ",
             percent_text(1 - a.time.step_s / b.time.step_s), " shorter");
}

namespace {

const char* kColumns =
    "rank\tlayout\ttokens_per_s\tstep_s\tdense_compute_s\texpert_compute_s\tall_to_all_s\t"
    "allreduce_exposed_s\tzero_gathers_s\toptimizer_exposed_s\tnon_gemm_s\tdevice_need_bytes\t"
    "host_need_bytes\tssd_need_bytes\twhy";

size_t rows_shown(const SearchResult& r, int64_t top) {
  return top <= 0 ? r.ranked.size() : std::min(r.ranked.size(), size_t(top));
}

}  // namespace

std::vector<std::string> search_tsv(const SearchResult& r, int64_t top) {
  const ClusterSpec& c = r.inputs.cluster;
  std::vector<std::string> lines = {
      str("# moe-plan search: ", r.inputs.model_name, " on cluster '", c.name, "' (", c.ranks(),
          " ranks: ", c.nodes, c.nodes == 1 ? " node x " : " nodes x ", c.devices_per_node, "), ",
          r.inputs.tokens_per_rank, " tokens per rank and step"),
      "# " + r.summary(), kColumns};
  for (size_t i = 0; i < rows_shown(r, top); ++i) {
    const Prediction& p = r.ranked[i].prediction;
    std::string line = str(i + 1, "\t", layout_text(p.layout), "\t",
                           tsv_number(p.time.tokens_per_s), "\t", tsv_number(p.time.step_s));
    // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "..." + string.
    for (const auto& [name, s] : path_terms(p.time)) line.append("\t").append(tsv_number(s));
    for (int t = 0; t < 3; ++t) line.append("\t").append(tsv_whole(p.memory.need[t]));
    line.append("\t").append(r.ranked[i].why.empty() ? "-" : r.ranked[i].why);
    lines.push_back(line);
  }
  return lines;
}

nlohmann::json search_json(const SearchResult& r, int64_t top) {
  nlohmann::json layouts = nlohmann::json::array();
  for (size_t i = 0; i < rows_shown(r, top); ++i) {
    nlohmann::json j = prediction_json(r.ranked[i].prediction);
    j["rank"] = i + 1;
    j["why"] = r.ranked[i].why;
    layouts.push_back(std::move(j));
  }
  return {{"model", r.inputs.model_name},
          {"cluster", r.inputs.cluster.name},
          {"ranks", r.inputs.cluster.ranks()},
          {"tokens_per_rank", r.inputs.tokens_per_rank},
          {"considered", r.considered},
          {"fit", r.ranked.size()},
          {"dropped", {{"device", r.short_of[0]}, {"host", r.short_of[1]}, {"ssd", r.short_of[2]}}},
          {"summary", r.summary()},
          {"layouts", layouts}};
}

}  // namespace moe::plan
