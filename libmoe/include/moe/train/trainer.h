// Training loop as a library: data, model, optimizer, evaluation, checkpoints. moe-train drives it.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/arena.h"
#include "moe/comm/communicator.h"
#include "moe/io/checkpoint.h"
#include "moe/io/dataset.h"
#include "moe/models/transformer.h"
#include "moe/optim/adamw.h"

namespace moe::train {

struct TrainConfig {
  std::string data, val, data_format = "auto";
  int64_t batch = 16;
  int64_t steps = 600;  // total optimizer steps of the run (the schedule's length)
  double lr = 3e-3, min_lr_ratio = 0.1;
  int64_t warmup = 30;
  double weight_decay = 0.1, clip = 1.0;
  double val_fraction = 0.1;  // held-out tail of --data when there is no --val
  int64_t eval_batches = 8;
  uint64_t seed = 1234;
};
nlohmann::json to_json(const TrainConfig& config);
// Fields present in j override those of `base`.
TrainConfig train_config_from_json(const nlohmann::json& j, TrainConfig base = {});

struct StepStats {
  int64_t step = 0;  // steps completed after this one
  ForwardStats forward;
  double lr = 0, grad_norm = 0, seconds = 0;
  int64_t tokens = 0;
  // Per MoE layer: max / mean of the tokens routed to each expert (before capacity).
  std::vector<double> load_max_over_mean;
  double dropped_fraction = 0;
};

class Trainer {
 public:
  // A fresh run. `model.vocab_size` must cover every token id of the data (0: sized from the data).
  // With a communicator of size W > 1 the run is data parallel: every rank draws the same global
  // batch, computes on its B/W sequences, and gradients are averaged over the ranks (one fused
  // all-reduce per step), so all ranks keep identical parameters. `world` must outlive the trainer.
  Trainer(const ModelConfig& model, const TrainConfig& train, io::Provenance provenance,
          comm::Communicator* world = nullptr);

  // Continue from a checkpoint: parameters, optimizer moments, step, data cursor.
  void restore(const io::Checkpoint& checkpoint);

  StepStats step();
  double evaluate();  // mean validation cross-entropy over up to eval_batches batches

  io::Checkpoint snapshot() const;
  // Writes dir/step-<8 digits>.h5 atomically and points dir/last.h5 at it; returns the path.
  // Collective under data parallelism: rank 0 writes (parameters are identical on every rank).
  std::string save(const std::string& dir) const;
  int world_size() const { return world_ ? world_->size() : 1; }
  int rank() const { return world_ ? world_->rank() : 0; }

  int64_t steps_done() const { return step_; }
  int64_t tokens_seen() const { return tokens_seen_; }
  const TrainConfig& config() const { return train_; }
  const ModelConfig& model_config() const { return model_->config(); }
  const Transformer& model() const { return *model_; }
  ParamSet& params() { return *params_; }
  const optim::AdamW& optimizer() const { return *optimizer_; }
  int64_t train_tokens() const { return static_cast<int64_t>(train_tokens_.size()); }
  int64_t val_tokens() const { return static_cast<int64_t>(val_tokens_.size()); }

 private:
  TrainConfig train_;
  io::Provenance provenance_;
  std::vector<int32_t> train_tokens_, val_tokens_;
  std::unique_ptr<ParamSet> params_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::unique_ptr<io::BatchSampler> sampler_;
  void average_gradients();
  void reduce_stats(StepStats& s);
  comm::Communicator* world_ = nullptr;
  Tensor grad_buffer_;  // all gradients, fused for one all-reduce per step (data parallel only)
  Arena arena_;
  int64_t step_ = 0, tokens_seen_ = 0;
};

// The largest token id + 1 of a token file's contents (to size the vocabulary of pre-tokenized
// data).
int64_t vocab_needed(const std::vector<int32_t>& tokens);

}  // namespace moe::train
