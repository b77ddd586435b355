// Lina's popularity-aware placement (see moe/infer/placement.h).
// Shape letters: E experts of a layer, R ranks, N tokens of one rank, k experts per token.
#include "moe/infer/placement.h"

#include <algorithm>
#include <cmath>

#include "moe/error.h"

namespace moe::infer {

namespace {

// Fixed-point scale of one token's estimated distribution (it sums to this): integers make the
// all-gathered estimate, and so the plan, the same on every rank.
constexpr int64_t kTokenScale = int64_t(1) << 20;

// The 2k experts with the largest weights (ties: lower id), as a sorted list.
template <typename T>
std::vector<int64_t> top_set(const std::vector<T>& weights, int64_t count) {
  std::vector<int64_t> order(weights.size());
  for (size_t e = 0; e < order.size(); ++e) order[e] = static_cast<int64_t>(e);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return weights[static_cast<size_t>(a)] > weights[static_cast<size_t>(b)];
  });
  order.resize(std::min<size_t>(order.size(), static_cast<size_t>(count)));
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace

double max_over_mean(const std::vector<int64_t>& rank_rows) {
  int64_t total = 0, most = 0;
  for (int64_t r : rank_rows) {
    total += r;
    most = std::max(most, r);
  }
  return total > 0 ? double(most) * double(rank_rows.size()) / double(total) : 1.0;
}

LinaPlacement::LinaPlacement(profile::PathTable table, const ModelConfig& config,
                             comm::Communicator& group)
    : table_(std::move(table)), group_(group) {
  std::vector<int64_t> experts;
  for (int64_t b = 0; b < config.layers; ++b) {
    moe_of_block_.push_back(config.is_moe_layer(b) ? static_cast<int64_t>(experts.size()) : -1);
    if (config.is_moe_layer(b)) {
      experts.push_back(config.experts_per_layer.at(static_cast<size_t>(b)));
      PlacementLayerStats s;
      s.block = b;
      stats_.push_back(s);
    }
  }
  top_k_ = config.residual_moe ? 1 : config.top_k;
  if (table_.experts != experts || table_.top_k != top_k_) {
    std::string want, have;
    for (int64_t e : table_.experts) want += str(want.empty() ? "" : ",", e);
    for (int64_t e : experts) have += str(have.empty() ? "" : ",", e);
    throw Error(str("the path table was built for ", table_.experts.size(), " MoE layers of [",
                    want, "] experts, top-", table_.top_k, "; the model has ", experts.size(),
                    " MoE layers of [", have, "] experts, top-", top_k_,
                    " (build the table from a trace of this model)"));
  }
  first_choice_.resize(experts.size());
}

nn::ExpertAssignment LinaPlacement::place(int64_t block, const Tensor& topk_idx,
                                          const std::vector<int32_t>& tokens_per_expert) {
  MOE_CHECK(block >= 0 && block < static_cast<int64_t>(moe_of_block_.size()) &&
                moe_of_block_[static_cast<size_t>(block)] >= 0,
            "placement: block ", block, " is not an MoE layer of the model");
  const int64_t layer = moe_of_block_[static_cast<size_t>(block)];
  const int64_t E = table_.experts[static_cast<size_t>(layer)], k = top_k_;
  const int R = group_.size();
  MOE_CHECK(static_cast<int64_t>(tokens_per_expert.size()) == E && topk_idx.ndim() == 2 &&
                topk_idx.dim(1) == k,
            "placement: layer ", layer, " routed ", topk_idx.describe(), " over ",
            tokens_per_expert.size(), " experts; the table has ", E, " experts, top-", k);
  const int64_t N = topk_idx.dim(0);
  const int32_t* idx = topk_idx.data<int32_t>();
  if (layer == 0)
    for (auto& f : first_choice_) f.clear();
  MOE_CHECK(
      layer == 0 || static_cast<int64_t>(first_choice_[static_cast<size_t>(layer - 1)].size()) == N,
      "placement: MoE layer ", layer, " sees ", N, " tokens, the previous one saw ",
      first_choice_[static_cast<size_t>(layer - 1)].size());

  // Phase 1: the batch's estimated popularity from each token's path (fixed point).
  std::vector<int64_t> mine(static_cast<size_t>(2 * E), 0);  // [actual E | estimated E]
  for (int64_t e = 0; e < E; ++e) mine[static_cast<size_t>(e)] = tokens_per_expert[e];
  auto add_estimate = [&](const std::vector<int64_t>& counts, int64_t tokens) {
    int64_t sum = 0;
    for (int64_t c : counts) sum += c;
    if (sum == 0) return;
    for (int64_t e = 0; e < E; ++e)
      mine[static_cast<size_t>(E + e)] += tokens * (counts[e] * kTokenScale / sum);
  };
  if (layer == 0) {
    add_estimate(table_.marginal[0], N);
  } else {
    const auto& next = table_.next[static_cast<size_t>(layer - 1)];
    const auto& marginal = table_.marginal[static_cast<size_t>(layer)];
    const int64_t first = std::max<int64_t>(0, layer - table_.path_length);
    std::vector<int32_t> path;
    for (int64_t t = 0; t < N; ++t) {
      path.clear();
      for (int64_t l = first; l < layer; ++l)
        path.push_back(first_choice_[static_cast<size_t>(l)][static_cast<size_t>(t)]);
      auto found = next.find(path);
      add_estimate(found != next.end() ? found->second : marginal, 1);
    }
  }
  std::vector<int32_t>& firsts = first_choice_[static_cast<size_t>(layer)];
  firsts.resize(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) firsts[static_cast<size_t>(t)] = idx[t * k];

  Tensor send = Tensor::empty({2 * E}, DType::i64), all = Tensor::empty({R, 2 * E}, DType::i64);
  std::copy(mine.begin(), mine.end(), send.data<int64_t>());
  group_.all_gather(send, all);
  const int64_t* g = all.data<int64_t>();
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(R));  // [R][E] actual rows
  std::vector<double> actual(static_cast<size_t>(E), 0), estimated(static_cast<size_t>(E), 0);
  for (int r = 0; r < R; ++r) {
    counts[static_cast<size_t>(r)].assign(g + r * 2 * E, g + r * 2 * E + E);
    for (int64_t e = 0; e < E; ++e) {
      actual[static_cast<size_t>(e)] += double(g[r * 2 * E + e]);
      estimated[static_cast<size_t>(e)] += double(g[r * 2 * E + E + e]);
    }
  }
  nn::ExpertAssignment plan = balance::pack_experts(estimated, R);
  PlacementLayerStats& st = stats_[static_cast<size_t>(layer)];
  const double estimated_ratio = max_over_mean(plan.rank_rows(counts));
  // Phase 2: keep the plan unless an expert of the actual top-2k (with any rows) is outside the
  // estimated top-2k. (Experts without rows are left out: their order among themselves is a tie.)
  const std::vector<int64_t> guessed = top_set(estimated, 2 * k);
  bool differs = false;
  for (int64_t e : top_set(actual, 2 * k))
    differs = differs || (actual[static_cast<size_t>(e)] > 0 &&
                          !std::binary_search(guessed.begin(), guessed.end(), e));
  if (differs) {
    plan = balance::pack_experts(actual, R);
    ++st.replans;
  }
  size_t widest = 0;
  for (const auto& reps : plan.replicas) widest = std::max(widest, reps.size());
  const double b = double(st.batches);
  auto running = [&](double mean, double x) { return (mean * b + x) / (b + 1); };
  st.static_max_over_mean =  // no static layout when R does not divide E
      E % R == 0 ? running(st.static_max_over_mean,
                           max_over_mean(nn::ExpertAssignment::contiguous(E, R).rank_rows(counts)))
                 : std::nan("");
  st.estimated_max_over_mean = running(st.estimated_max_over_mean, estimated_ratio);
  st.placed_max_over_mean = running(st.placed_max_over_mean, max_over_mean(plan.rank_rows(counts)));
  st.mean_max_replicas = running(st.mean_max_replicas, double(widest));
  ++st.batches;
  return plan;
}

std::vector<PlacementLayerStats> LinaPlacement::stats() const { return stats_; }

}  // namespace moe::infer
