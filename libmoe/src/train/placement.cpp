// Expert placement while training (see moe/train/placement.h).
// Shapes: P ranks of the expert group, E experts of a layer, V vExpert slots per rank.
#include "moe/train/placement.h"

#include <algorithm>
#include <cmath>

#include "core/json_text.h"
#include "moe/balance/cost_profile.h"
#include "moe/error.h"
#include "moe/settings.h"

namespace moe::train {

const char* placement_rule_name(PlacementRule policy) {
  switch (policy) {
    case PlacementRule::fixed:
      return "static";
    case PlacementRule::lpt:
      return "lpt";
    case PlacementRule::flexmoe:
      return "flexmoe";
  }
  return "?";
}

PlacementRule parse_placement_rule(std::string_view name) {
  for (PlacementRule p : {PlacementRule::fixed, PlacementRule::lpt, PlacementRule::flexmoe})
    if (name == placement_rule_name(p)) return p;
  throw UsageError(
      str(flag_for(Setting::placement), " must be static, lpt or flexmoe (got '", name, "')"));
}

void check_placement_config(const PlacementConfig& c) {
  MOE_USAGE_CHECK(c.vexperts_per_rank >= 0, flag_for(Setting::vexperts_per_rank),
                  " must be >= 0 (0: ceil(E/P)+1; got ", c.vexperts_per_rank, ")");
  MOE_USAGE_CHECK(std::isfinite(c.balance_threshold) && c.balance_threshold >= 1,
                  flag_for(Setting::balance_threshold), " must be >= 1 (max/mean rank tokens; got ",
                  c.balance_threshold, ")");
  MOE_USAGE_CHECK(c.replan_every >= 1, flag_for(Setting::replan_every), " must be >= 1 (got ",
                  c.replan_every, ")");
}

std::unique_ptr<TrainingPlacement> TrainingPlacement::make(
    const PlacementConfig& config, comm::Communicator& group,
    const std::map<int64_t, int64_t>& experts) {
  check_placement_config(config);
  if (config.policy == PlacementRule::lpt) return std::make_unique<LptPlacement>(config, group);
  if (config.policy == PlacementRule::flexmoe)
    return std::make_unique<FlexMoEPlacement>(config, group, experts);
  return nullptr;
}

nn::ExpertAssignment TrainingPlacement::place(int64_t block, const Tensor&,
                                              const std::vector<int32_t>& tokens_per_expert) {
  const int P = group_.size();
  const auto E = static_cast<int64_t>(tokens_per_expert.size());
  Tensor mine = Tensor::empty({E}, DType::i64);
  std::copy(tokens_per_expert.begin(), tokens_per_expert.end(), mine.data<int64_t>());
  Tensor all = Tensor::empty({P * E}, DType::i64);
  group_.all_gather(mine, all);
  balance::TokenMatrix tokens(static_cast<size_t>(P));
  for (int s = 0; s < P; ++s)
    tokens[static_cast<size_t>(s)].assign(all.data<int64_t>() + s * E,
                                          all.data<int64_t>() + (s + 1) * E);
  if (seen_.insert(block).second) {
    balance::TokenMatrix& sum = step_tokens_[block];
    if (sum.empty()) sum.assign(static_cast<size_t>(P), std::vector<int64_t>(E, 0));
    for (int s = 0; s < P; ++s)
      for (int64_t e = 0; e < E; ++e)
        sum[static_cast<size_t>(s)][static_cast<size_t>(e)] +=
            tokens[static_cast<size_t>(s)][static_cast<size_t>(e)];
  }
  return assign(block, tokens);
}

std::vector<Replan> TrainingPlacement::end_step(int64_t) {
  step_tokens_.clear();
  return {};
}

// ---- lpt --------------------------------------------------------------------------------------

// Every rank holds every expert (nothing to upload), and the ranks are alike: an expert's
// processing time is its token count, and LPT gives it to the rank with the fewest tokens so far.
nn::ExpertAssignment LptPlacement::assign(int64_t, const balance::TokenMatrix& tokens) {
  const size_t E = tokens.empty() ? 0 : tokens[0].size();
  balance::BatchLptInput in;
  in.compute_s.assign(E, 0);
  in.upload_s.assign(E, 0);
  for (const std::vector<int64_t>& row : tokens)
    for (size_t e = 0; e < E; ++e) in.compute_s[e] += static_cast<double>(row[e]);
  const balance::BatchLptPlacement placed = balance::lpt_batch_placement(in, group_.size());
  nn::ExpertAssignment a;
  a.replicas.reserve(E);
  for (size_t e = 0; e < E; ++e) a.replicas.push_back({placed.rank_of_expert[e]});
  return a;
}

// ---- flexmoe ----------------------------------------------------------------------------------

FlexMoEPlacement::FlexMoEPlacement(const PlacementConfig& config, comm::Communicator& group,
                                   const std::map<int64_t, int64_t>& experts)
    : TrainingPlacement(config, group) {
  for (const auto& [block, count] : experts) maps_.emplace(block, initial_map(block, count));
}

balance::VExpertMap FlexMoEPlacement::initial_map(int64_t block, int64_t experts) const {
  const int P = group_.size();
  const int64_t least = (experts + P - 1) / P;
  const int64_t V = config_.vexperts_per_rank > 0 ? config_.vexperts_per_rank : least + 1;
  MOE_USAGE_CHECK(V >= least, flag_for(Setting::vexperts_per_rank), " ", V, ": ", P, " ranks x ", V,
                  " slots cannot hold the ", experts, " experts of block ", block,
                  " (needs at least ", least, ")");
  return balance::VExpertMap::contiguous(P, static_cast<int>(V), experts);
}

balance::VExpertMap& FlexMoEPlacement::map_of(int64_t block, int64_t experts) {
  auto it = maps_.find(block);
  MOE_CHECK(it != maps_.end(), "block ", block, " has no vExpert map (not a MoE block?)");
  MOE_CHECK(it->second.experts() == experts, "block ", block, ": the vExpert map holds ",
            it->second.experts(), " experts, the layer routes to ", experts);
  return it->second;
}

std::vector<int64_t> FlexMoEPlacement::held_rows(int64_t block, int64_t experts) const {
  auto it = maps_.find(block);
  MOE_CHECK(it != maps_.end() && it->second.experts() == experts, "block ", block,
            " has no vExpert map of ", experts, " experts");
  return slot_experts(it->second, group_.rank());
}

nn::ExpertAssignment FlexMoEPlacement::assign(int64_t block, const balance::TokenMatrix& tokens) {
  const auto E = static_cast<int64_t>(tokens.empty() ? 0 : tokens[0].size());
  const balance::VExpertMap& map = map_of(block, E);
  const balance::FlexRoute route = balance::flexible_route(map, tokens);
  const int s = group_.rank();
  nn::ExpertAssignment a;
  a.replicas.resize(static_cast<size_t>(E));
  a.rows.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    a.replicas[static_cast<size_t>(e)] = map.holders(e);
    for (int32_t d : a.replicas[static_cast<size_t>(e)])
      a.rows[static_cast<size_t>(e)].push_back(route.at(s, e, d));
  }
  a.held_index.assign(static_cast<size_t>(map.ranks()), std::vector<int32_t>(E, -1));
  for (int p = 0; p < map.ranks(); ++p)
    for (int v = 0; v < map.slots_per_rank(); ++v)
      if (const int32_t e = map.slot(p, v); e >= 0)
        a.held_index[static_cast<size_t>(p)][static_cast<size_t>(e)] = v;
  return a;
}

std::vector<Replan> FlexMoEPlacement::end_step(int64_t step) {
  std::vector<Replan> out;
  predicted_s_.clear();
  for (auto& [block, tokens] : step_tokens_) {
    const balance::VExpertMap& map = map_of(block, static_cast<int64_t>(tokens[0].size()));
    predicted_s_[block] =
        balance::estimate_step(map, balance::flexible_route(map, tokens), cost_).step_s;
  }
  if (step % config_.replan_every == 0) {
    balance::PolicyOptions options;
    options.threshold = config_.balance_threshold;
    for (auto& [block, tokens] : step_tokens_) {
      balance::VExpertMap& map = map_of(block, static_cast<int64_t>(tokens[0].size()));
      balance::Plan plan = balance::make_plan(map, tokens, cost_, options);
      if (plan.actions.empty()) continue;
      Replan r;
      r.block = block;
      r.actions = plan.actions;
      r.predicted_before_s = plan.step_s.front();
      r.predicted_after_s = plan.step_s.back();
      r.balance_before = plan.balance.front();
      r.balance_after = plan.balance.back();
      r.adjustment_s = plan.adjustment_s;
      r.slots_before = map.slots();
      map = plan.map;
      out.push_back(std::move(r));
    }
  }
  step_tokens_.clear();
  return out;
}

nlohmann::json FlexMoEPlacement::state() const {
  nlohmann::json layers = nlohmann::json::object();
  for (const auto& [block, map] : maps_)
    layers[std::to_string(block)] = {{"experts", map.experts()},
                                     {"slots_per_rank", map.slots_per_rank()},
                                     {"slots", map.slots()}};
  return {{"policy", "flexmoe"},
          {"ranks", group_.size()},
          {"layers", layers},
          {"cost", balance::to_json(cost_)}};
}

std::string FlexMoEPlacement::load_state(const nlohmann::json& state) {
  if (state.is_null()) return {};
  try {
    if (state.value("policy", "") != "flexmoe")
      return str("the checkpoint's placement is ", state.value("policy", "?"),
                 ": the vExpert maps start from plain expert parallelism");
    if (state.at("ranks").get<int>() != group_.size())
      return str("the checkpoint's vExpert maps are for ", state.at("ranks").get<int>(),
                 " expert-parallel ranks, this run has ", group_.size(),
                 ": they start again from plain expert parallelism");
    std::map<int64_t, balance::VExpertMap> maps;
    for (const auto& [key, layer] : state.at("layers").items()) {
      const int V = layer.at("slots_per_rank").get<int>();
      if (config_.vexperts_per_rank > 0 && V != config_.vexperts_per_rank)
        return str("the checkpoint's vExpert maps have ", V, " slots per rank, this run asks for ",
                   config_.vexperts_per_rank, ": they start again from plain expert parallelism");
      maps.emplace(std::stoll(key), balance::VExpertMap::from_slots(
                                        group_.size(), V, layer.at("experts").get<int64_t>(),
                                        layer.at("slots").get<std::vector<int32_t>>()));
    }
    balance::CostModel cost = balance::cost_model_from_json(state.at("cost"));
    cost.validate(group_.size());
    for (const auto& [block, map] : maps_)
      if (!maps.count(block) || maps.at(block).experts() != map.experts())
        return str("the checkpoint's vExpert maps do not cover block ", block, " with ",
                   map.experts(), " experts: they start again from plain expert parallelism");
    maps_ = std::move(maps);
    cost_ = std::move(cost);
  } catch (const nlohmann::json::exception& e) {  // a missing key (the session checked types)
    throw Error(str("\"placement_state\": ", json_error_words(e)));
  } catch (const std::exception& e) {  // a map that breaks VExpertMap's rules, a bad layer key
    throw Error(str("\"placement_state\": ", e.what()));
  }
  return {};
}

// ---- state movement ---------------------------------------------------------------------------

std::vector<Param*> expert_params(ParamSet& params, int64_t block) {
  const std::string prefix = str("blocks.", block, ".moe.experts.");
  std::vector<Param*> out;
  for (Param* p : params.all())
    if (p->name.starts_with(prefix)) out.push_back(p);
  MOE_CHECK(!out.empty(), "block ", block, " has no expert parameters");
  return out;
}

int32_t slot_of(const balance::VExpertMap& map, int rank, int64_t expert) {
  for (int v = 0; v < map.slots_per_rank(); ++v)
    if (map.slot(rank, v) == expert) return v;
  return -1;
}

std::vector<int64_t> slot_experts(const balance::VExpertMap& map, int rank) {
  std::vector<int64_t> out;
  for (int v = 0; v < map.slots_per_rank(); ++v) out.push_back(map.slot(rank, v));
  return out;
}

std::vector<ExpertMove> plan_moves(const balance::VExpertMap& before,
                                   const balance::VExpertMap& after,
                                   const std::vector<balance::PlanAction>& actions) {
  std::vector<ExpertMove> moves;
  for (int64_t e = 0; e < after.experts(); ++e)
    for (int to = 0; to < after.ranks(); ++to) {
      if (!after.holds(to, e) || before.holds(to, e)) continue;
      const std::vector<int32_t> sources = before.holders(e);
      int from = sources.front();
      for (const balance::PlanAction& a : actions)
        if (a.kind == balance::PlanAction::Kind::expand && a.expert == e && a.rank == to &&
            before.holds(a.from, e))
          from = a.from;
      moves.push_back({e, from, slot_of(before, from, e), to, slot_of(after, to, e)});
    }
  return moves;
}

// The tensors of `p` that hold per-slot state: the value, its fp32 master when that is another
// tensor, Adam's m and v.
static std::vector<Tensor> state_tensors(const Param& p, const optim::AdamW& optimizer) {
  const optim::AdamW::ParamState state = optimizer.state_of(p);
  std::vector<Tensor> out{p.value};
  if (state.master.raw() != p.value.raw()) out.push_back(state.master);
  out.push_back(state.m);
  out.push_back(state.v);
  return out;
}

void move_experts(comm::Communicator& group, const std::vector<Param*>& params,
                  const optim::AdamW& optimizer, const std::vector<ExpertMove>& moves) {
  const int me = group.rank();
  constexpr int kTag = 0x4d4f;  // one tag: MPI keeps a pair's messages in posting order
  std::vector<std::vector<Tensor>> tensors;
  for (const Param* p : params) {
    MOE_CHECK(p->value.device().kind == Device::cpu || group.name() == "nccl",
              "moving expert state on ", p->value.device().str(), " needs NCCL");
    tensors.push_back(state_tensors(*p, optimizer));
  }
  std::vector<comm::Request> requests;
  std::vector<std::pair<Tensor, Tensor>> arrivals;  // (received row, its slot)
  for (const ExpertMove& m : moves) {               // the same order on every rank
    MOE_CHECK(m.from != m.to && m.from_row >= 0 && m.to_row >= 0, "expert ", m.expert,
              ": a move from rank ", m.from, " row ", m.from_row, " to rank ", m.to, " row ",
              m.to_row);
    if (me != m.from && me != m.to) continue;
    for (std::vector<Tensor>& list : tensors)
      for (Tensor& t : list) {
        if (me == m.from) {
          requests.push_back(group.isend(t.rows(m.from_row, m.from_row + 1), m.to, kTag));
        } else {
          Tensor row = Tensor::empty(t.rows(m.to_row, m.to_row + 1).shape(), t.dtype(), t.device());
          requests.push_back(group.irecv(row, m.from, kTag));
          arrivals.emplace_back(row, t.rows(m.to_row, m.to_row + 1));
        }
      }
  }
  comm::wait_all(requests);  // every source read before any slot below is written
  for (auto& [row, slot] : arrivals) slot.copy_from(row);
  if (!arrivals.empty())
    for (Param* p : params) p->refresh_compute();
}

Tensor gather_experts(comm::Communicator& group, const Tensor& slots,
                      const balance::VExpertMap& map, int root) {
  const int me = group.rank();
  constexpr int kTag = 0x4d50;
  Shape shape = slots.shape();
  shape[0] = map.experts();
  Tensor logical = me == root ? Tensor::empty(shape, slots.dtype(), slots.device()) : Tensor();
  std::vector<comm::Request> requests;
  for (int64_t e = 0; e < map.experts(); ++e) {
    const int from = map.holders(e).front();
    const int32_t row = slot_of(map, from, e);
    if (me == root && from == root)
      logical.rows(e, e + 1).copy_from(slots.rows(row, row + 1));
    else if (me == root) {
      Tensor into = logical.rows(e, e + 1);  // a view: the request keeps the storage alive
      requests.push_back(group.irecv(into, from, kTag));
    } else if (me == from)
      requests.push_back(group.isend(slots.rows(row, row + 1), root, kTag));
  }
  comm::wait_all(requests);
  return logical;
}

Tensor take_slots(const Tensor& logical, const std::vector<int64_t>& slot_experts) {
  Shape shape = logical.shape();
  shape[0] = static_cast<int64_t>(slot_experts.size());
  Tensor out = Tensor::zeros(shape, logical.dtype());
  for (size_t v = 0; v < slot_experts.size(); ++v) {
    const int64_t e = slot_experts[v];
    if (e < 0) continue;
    MOE_CHECK(e < logical.dim(0), "slot of expert ", e, " of ", logical.dim(0));
    const auto row = static_cast<int64_t>(v);
    out.rows(row, row + 1).copy_from(logical.rows(e, e + 1));
  }
  return out;
}

// ---- reports ----------------------------------------------------------------------------------

static const char* kind_name(balance::PlanAction::Kind k) {
  switch (k) {
    case balance::PlanAction::Kind::expand:
      return "expand";
    case balance::PlanAction::Kind::shrink:
      return "shrink";
    case balance::PlanAction::Kind::migrate:
      return "migrate";
  }
  return "?";
}

static std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string describe(const Replan& r) {
  std::string text = str("replan block ", r.block, ":");
  for (const balance::PlanAction& a : r.actions) {
    text += str(" ", kind_name(a.kind), " e", a.expert,
                a.kind == balance::PlanAction::Kind::expand
                    ? str(" -> rank ", a.rank, " (from ", a.from, ")")
                    : str(" on rank ", a.rank),
                ";");
  }
  text += str(" balance ", fixed(r.balance_before, 2), " -> ", fixed(r.balance_after, 2),
              ", predicted layer step ", fixed(r.predicted_before_s * 1e3, 3), " -> ",
              fixed(r.predicted_after_s * 1e3, 3), " ms; ", r.copies,
              r.copies == 1 ? " copy" : " copies", " in ", fixed(r.measured_adjustment_s * 1e3, 3),
              " ms (predicted ", fixed(r.adjustment_s * 1e3, 3), ")");
  return text;
}

nlohmann::json to_json(const Replan& r) {
  nlohmann::json actions = nlohmann::json::array();
  for (const balance::PlanAction& a : r.actions)
    actions.push_back({{"kind", kind_name(a.kind)},
                       {"expert", a.expert},
                       {"rank", a.rank},
                       {"from", a.from},
                       {"cost_s", a.cost_s}});
  return {{"block", r.block},
          {"actions", actions},
          {"predicted_before_s", r.predicted_before_s},
          {"predicted_after_s", r.predicted_after_s},
          {"balance_before", r.balance_before},
          {"balance_after", r.balance_after},
          {"adjustment_s", r.adjustment_s},
          {"copies", r.copies},
          {"measured_adjustment_s", r.measured_adjustment_s}};
}

}  // namespace moe::train
