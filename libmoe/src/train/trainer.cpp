#include "moe/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "moe/log.h"
#include "moe/timer.h"

namespace moe::train {

nlohmann::json to_json(const TrainConfig& c) {
  return nlohmann::json{{"data", c.data},
                        {"val", c.val},
                        {"data_format", c.data_format},
                        {"batch", c.batch},
                        {"steps", c.steps},
                        {"lr", c.lr},
                        {"min_lr_ratio", c.min_lr_ratio},
                        {"warmup", c.warmup},
                        {"weight_decay", c.weight_decay},
                        {"clip", c.clip},
                        {"val_fraction", c.val_fraction},
                        {"eval_batches", c.eval_batches},
                        {"seed", c.seed}};
}

TrainConfig train_config_from_json(const nlohmann::json& j, TrainConfig c) {
  try {
    auto take = [&](const char* key, auto& field) {
      if (j.contains(key)) field = j.at(key).get<std::decay_t<decltype(field)>>();
    };
    take("data", c.data);
    take("val", c.val);
    take("data_format", c.data_format);
    take("batch", c.batch);
    take("steps", c.steps);
    take("lr", c.lr);
    take("min_lr_ratio", c.min_lr_ratio);
    take("warmup", c.warmup);
    take("weight_decay", c.weight_decay);
    take("clip", c.clip);
    take("val_fraction", c.val_fraction);
    take("eval_batches", c.eval_batches);
    take("seed", c.seed);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("training config: ", e.what()));
  }
  return c;
}

int64_t vocab_needed(const std::vector<int32_t>& tokens) {
  int32_t max_id = 0;
  for (int32_t t : tokens) max_id = std::max(max_id, t);
  return static_cast<int64_t>(max_id) + 1;
}

static void check_vocab(const std::vector<int32_t>& tokens, int64_t vocab,
                        const std::string& path) {
  int64_t needed = vocab_needed(tokens);
  if (needed > vocab)
    throw UsageError(str(path, ": token id ", needed - 1,
                         " does not fit the model's vocabulary of ", vocab, " (use --vocab ",
                         needed, " or more)"));
}

Trainer::Trainer(const ModelConfig& model, const TrainConfig& train, io::Provenance provenance,
                 comm::Communicator* world)
    : train_(train), provenance_(std::move(provenance)), world_(world) {
  MOE_USAGE_CHECK(train.batch >= 1, "--batch must be >= 1 (got ", train.batch, ")");
  MOE_USAGE_CHECK(train.batch % world_size() == 0, "--batch ", train.batch,
                  " does not divide over ", world_size(), " data-parallel ranks");
  MOE_USAGE_CHECK(train.steps >= 1, "--steps must be >= 1 (got ", train.steps, ")");
  MOE_USAGE_CHECK(train.lr > 0, "--lr must be > 0 (got ", train.lr, ")");
  MOE_USAGE_CHECK(train.warmup >= 0, "--warmup must be >= 0");
  MOE_USAGE_CHECK(train.val_fraction > 0 && train.val_fraction < 1,
                  "--val-fraction must be in (0, 1)");
  io::TokenFormat format = io::parse_token_format(train.data_format);
  std::vector<int32_t> tokens = io::load_tokens(train.data, format);
  if (train.val.empty()) {
    auto split = io::split_tail(std::move(tokens), train.val_fraction, model.seq);
    train_tokens_ = std::move(split.first);
    val_tokens_ = std::move(split.second);
  } else {
    train_tokens_ = std::move(tokens);
    val_tokens_ = io::load_tokens(train.val, format);
  }
  ModelConfig config = model;
  if (config.vocab_size == 0)  // pre-tokenized data: the vocabulary covers every id it holds
    config.vocab_size = std::max(vocab_needed(train_tokens_), vocab_needed(val_tokens_));
  check_vocab(train_tokens_, config.vocab_size, train.data);
  check_vocab(val_tokens_, config.vocab_size, train.val.empty() ? train.data : train.val);
  sampler_ = std::make_unique<io::BatchSampler>(&train_tokens_, model.seq, train.seed, true);
  // Validation must hold at least one window (the sampler says so clearly otherwise).
  io::BatchSampler probe(&val_tokens_, model.seq, train.seed, false);

  params_ = std::make_unique<ParamSet>(train.seed, config.dtype);
  model_ = std::make_unique<Transformer>(config, *params_);
  optim::AdamWConfig oc;
  oc.weight_decay = static_cast<float>(train.weight_decay);
  optimizer_ = std::make_unique<optim::AdamW>(*params_, oc);
}

void Trainer::restore(const io::Checkpoint& ckpt) {
  for (const io::NamedTensor& nt : ckpt.params) {
    Param* p = params_->find(nt.name);
    MOE_CHECK(p, "checkpoint tensor '", nt.name, "' is not a parameter of this model");
    MOE_CHECK(nt.tensor.shape() == p->value.shape() && nt.tensor.dtype() == p->value.dtype(),
              "checkpoint tensor ", nt.tensor.describe(), " does not match parameter ",
              p->value.describe());
    p->value.copy_from(nt.tensor);
    p->refresh_compute();
  }
  MOE_CHECK(ckpt.params.size() == params_->size(), "checkpoint has ", ckpt.params.size(),
            " parameter tensors, the model ", params_->size());
  std::vector<optim::OptimizerTensor> state;
  for (const io::NamedTensor& nt : ckpt.optim) state.push_back({nt.name, nt.tensor, nt.expert});
  optimizer_->load_state(state, ckpt.state.step);
  step_ = ckpt.state.step;
  tokens_seen_ = ckpt.state.tokens_seen;
  sampler_->set_cursor(ckpt.state.data_cursor);
}

StepStats Trainer::step() {
  Timer timer;
  StepStats s;
  const ModelConfig& mc = model_->config();
  Tensor ids, targets;
  {
    ArenaScope scope(arena_);
    sampler_->next(train_.batch, ids, targets);  // the global batch, the same on every rank
    if (world_size() > 1) {                      // this rank's contiguous share of it
      const int64_t local = train_.batch / world_size();
      ids = ids.rows(rank() * local, (rank() + 1) * local);
      targets = targets.rows(rank() * local, (rank() + 1) * local);
    }
    params_->zero_grad();
    nn::RouterStep rs;
    rs.seed = train_.seed;
    rs.step = step_;
    rs.training = true;
    s.forward = model_->forward_backward(ids, targets, rs);
  }
  arena_.reset();
  if (world_size() > 1) {
    average_gradients();
    reduce_stats(s);
  }
  MOE_CHECK(std::isfinite(s.forward.total), "step ", step_, ": loss is ", s.forward.total,
            " (diverged; try a lower --lr or --clip)");
  s.grad_norm = optim::clip_grad_norm(*params_, train_.clip);
  s.lr = optim::lr_at(step_, train_.steps, train_.warmup, static_cast<float>(train_.lr),
                      static_cast<float>(train_.lr * train_.min_lr_ratio));
  optimizer_->step(static_cast<float>(s.lr));
  ++step_;
  s.tokens = train_.batch * mc.seq;
  tokens_seen_ += s.tokens;
  s.step = step_;
  int64_t dropped = 0, assignments = 0;
  for (const nn::MoEStats& m : s.forward.moe) {
    double mx = 0, sum = 0;
    for (int64_t l : m.load) {
      mx = std::max(mx, static_cast<double>(l));
      sum += static_cast<double>(l);
    }
    double mean = m.load.empty() ? 0 : sum / static_cast<double>(m.load.size());
    s.load_max_over_mean.push_back(mean > 0 ? mx / mean : 0);
    dropped += m.dropped;
    assignments += m.assignments;
  }
  s.dropped_fraction =
      assignments ? static_cast<double>(dropped) / static_cast<double>(assignments) : 0;
  s.seconds = timer.seconds();
  return s;
}

void Trainer::average_gradients() {
  std::vector<Param*> params = params_->all();
  if (!grad_buffer_.defined()) grad_buffer_ = Tensor::empty({params_->numel()});
  float* buffer = grad_buffer_.data<float>();
  int64_t offset = 0;
  for (const Param* p : params) {
    std::copy_n(p->grad.data<float>(), p->grad.numel(), buffer + offset);
    offset += p->grad.numel();
  }
  world_->all_reduce(grad_buffer_, comm::ReduceOp::sum);
  const float inverse = 1.0f / static_cast<float>(world_size());
  offset = 0;
  for (Param* p : params) {
    float* g = p->grad.data<float>();
    for (int64_t i = 0, n = p->grad.numel(); i < n; ++i) g[i] = buffer[offset + i] * inverse;
    offset += p->grad.numel();
  }
}

// Losses become means over the ranks; expert loads and drops become sums: the numbers describe the
// global batch. Each rank's aux loss and capacity are computed on its own tokens (per-rank
// routing statistics, as in DeepSpeed and Megatron).
void Trainer::reduce_stats(StepStats& s) {
  ForwardStats& f = s.forward;
  Tensor losses = Tensor::from_vector({3}, std::vector<float>{static_cast<float>(f.loss),
                                                              static_cast<float>(f.aux_loss),
                                                              static_cast<float>(f.z_loss)});
  world_->all_reduce(losses, comm::ReduceOp::sum);
  const double w = static_cast<double>(world_size());
  f.loss = losses.data<float>()[0] / w;
  f.aux_loss = losses.data<float>()[1] / w;
  f.z_loss = losses.data<float>()[2] / w;
  const ModelConfig& mc = model_->config();
  f.total = f.loss + mc.aux_loss_coef * f.aux_loss + mc.z_loss_coef * f.z_loss;
  std::vector<int64_t> counts;
  for (const nn::MoEStats& m : f.moe) {
    counts.insert(counts.end(), m.load.begin(), m.load.end());
    counts.push_back(m.dropped);
    counts.push_back(m.assignments);
  }
  if (counts.empty()) return;
  Tensor summed = Tensor::empty({static_cast<int64_t>(counts.size())}, DType::i64);
  std::copy(counts.begin(), counts.end(), summed.data<int64_t>());
  world_->all_reduce(summed, comm::ReduceOp::sum);
  const int64_t* c = summed.data<int64_t>();
  for (nn::MoEStats& m : f.moe) {
    for (int64_t& l : m.load) l = *c++;
    m.dropped = *c++;
    m.assignments = *c++;
  }
}

double Trainer::evaluate() {
  const int64_t seq = model_->config().seq;
  io::BatchSampler sampler(&val_tokens_, seq, train_.seed, false);
  int64_t batch = std::min(train_.batch, sampler.num_windows());
  int64_t batches =
      std::max<int64_t>(1, std::min(train_.eval_batches, sampler.num_windows() / batch));
  double sum = 0;
  for (int64_t b = 0; b < batches; ++b) {
    {
      ArenaScope scope(arena_);
      Tensor ids, targets;
      sampler.next(batch, ids, targets);
      sum += model_->evaluate(ids, targets).loss;
    }
    arena_.reset();
  }
  return sum / static_cast<double>(batches);
}

io::Checkpoint Trainer::snapshot() const {
  io::Checkpoint c;
  c.model_config = to_json(model_->config());
  c.train_config = to_json(train_);
  c.provenance = provenance_;
  for (const Param* p : std::as_const(*params_).all())
    c.params.push_back({p->name, p->value, p->expert});
  for (const optim::OptimizerTensor& t : optimizer_->state())
    c.optim.push_back({t.name, t.tensor, t.expert});
  c.state.step = step_;
  c.state.tokens_seen = tokens_seen_;
  c.state.data_cursor = sampler_->cursor();
  c.state.seed = train_.seed;
  c.sharding.world_size = world_size();  // data parallel: every rank holds every parameter
  return c;
}

std::string Trainer::save(const std::string& dir) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(str("cannot create output directory '", dir, "': ", ec.message()));
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld.h5", static_cast<long long>(step_));
  fs::path path = fs::path(dir) / name;
  if (rank() != 0) {  // parameters are identical on every rank: rank 0 writes
    world_->barrier();
    return path.string();
  }
  io::save_checkpoint(path.string(), snapshot());
  // last.h5 -> newest checkpoint, swapped atomically (symlink to a temp name, then rename).
  fs::path link = fs::path(dir) / "last.h5";
  fs::path tmp = fs::path(dir) / (".last.h5.tmp-" + std::to_string(::getpid()));
  fs::remove(tmp, ec);
  fs::create_symlink(name, tmp, ec);
  if (ec) throw Error(str("cannot create link '", tmp.string(), "': ", ec.message()));
  fs::rename(tmp, link, ec);
  if (ec) throw Error(str("cannot update '", link.string(), "': ", ec.message()));
  if (world_size() > 1) world_->barrier();
  return path.string();
}

}  // namespace moe::train
