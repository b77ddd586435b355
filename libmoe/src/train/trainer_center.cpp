// Router centring in training (RouterConfig::center): the first step's calibration of the
// centers, and their update after every step.
#include <utility>
#include <vector>

#include "moe/nn/router.h"
#include "moe/train/trainer.h"

namespace moe::train {

// Router centring, the first step of a fresh run (no checkpoint gave the centers): each centred
// router's center starts as the mean of its input over this step's global batch, so routing is
// centred from the first step. A layer's input depends on the centers before it, so they are set
// layer by layer: per MoE layer one evaluation pass (no jitter) over this rank's micro-batches,
// stopped after that layer's block, the sums all-reduced like the step's statistics (the same
// centers on every rank, whatever --grad-accum).
void Trainer::calibrate_router_centers(const std::vector<std::pair<Tensor, Tensor>>& parts) {
  const std::vector<int64_t> blocks = model_->config().moe_blocks();
  std::vector<Param*> centers;
  for (int64_t b : blocks) centers.push_back(&params_->at(str("blocks.", b, ".moe.router.center")));
  for (size_t l = 0; l < blocks.size(); ++l) {
    std::vector<double> sum(static_cast<size_t>(centers[l]->numel()), 0.0);
    int64_t tokens = 0;
    for (const auto& [ids, targets] : parts) {
      {
        ArenaScope scope(arena_);
        EvalOptions options;
        options.router_input_sums = true;
        options.blocks = blocks[l] + 1;
        const ForwardStats f = forward_only(*model_, ids, targets, options);
        const nn::MoEStats& m = f.moe.at(l);
        for (size_t i = 0; i < sum.size() && i < m.input_sum.size(); ++i) sum[i] += m.input_sum[i];
        tokens += m.input_tokens;
      }
      arena_.reset();
    }
    all_reduce_sums(sum);
    if (world_size() > 1) {
      Tensor n = Tensor::empty({1}, DType::i64);
      n.data<int64_t>()[0] = tokens;
      world_->all_reduce(n, comm::ReduceOp::sum);
      tokens = n.data<int64_t>()[0];
    }
    nn::update_router_center(*centers[l], sum, tokens, 1.0);
  }
}

// After each optimizer step every centred router's running mean moves toward the step's mean
// input (the global batch's: summed over micro-batches and, by reduce_stats, over the ranks).
void Trainer::update_router_centers(const ForwardStats& f) {
  const std::vector<int64_t> blocks = model_->config().moe_blocks();
  const double rate = model_->config().router_center_rate;
  for (size_t l = 0; l < f.moe.size(); ++l)
    if (f.moe[l].input_tokens > 0)
      nn::update_router_center(params_->at(str("blocks.", blocks.at(l), ".moe.router.center")),
                               f.moe[l].input_sum, f.moe[l].input_tokens, rate);
}

}  // namespace moe::train
