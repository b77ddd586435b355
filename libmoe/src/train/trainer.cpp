#include "moe/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <type_traits>

#include "core/json_text.h"
#include "moe/cuda.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/io/dataset.h"
#include "moe/io/finite.h"
#include "moe/io/model_text.h"
#include "moe/io/tokenizer.h"
#include "moe/log.h"
#include "moe/models/flavour.h"
#include "moe/models/memory.h"
#include "moe/nn/router.h"
#include "moe/offload/budget.h"
#include "moe/ops/core.h"
#include "moe/settings.h"
#include "moe/timer.h"
#include "moe/train/offload_report.h"

namespace moe::train {

// Every TrainConfig field with its JSON key, once: to_json and train_config_from_json both walk
// this list (a new field is one line here).
template <class Config, class Visit>
static void for_each_field(Config& c, Visit&& f) {
  f("data", c.data);
  f("val", c.val);
  f("data_format", c.data_format);
  f("data_bytes", c.data_bytes);
  f("data_crc32c", c.data_crc32c);
  f("batch", c.batch);
  f("steps", c.steps);
  f("lr", c.lr);
  f("min_lr_ratio", c.min_lr_ratio);
  f("warmup", c.warmup);
  f("weight_decay", c.weight_decay);
  f("clip", c.clip);
  f("val_fraction", c.val_fraction);
  f("eval_batches", c.eval_batches);
  f("seed", c.seed);
  f("ep", c.ep);
  f("shard_embedding", c.shard_embedding);
  f("a2a", c.a2a);
  f("ranks_per_node", c.ranks_per_node);
  f("comm_scheduler", c.comm_scheduler);
  f("partition_mb", c.partition_mb);
  f("placement", c.placement);
  f("vexperts_per_rank", c.vexperts_per_rank);
  f("balance_threshold", c.balance_threshold);
  f("replan_every", c.replan_every);
  f("offload", c.offload.tier);
  f("device_budget", c.offload.device_budget);
  f("host_budget", c.offload.host_budget);
  f("ssd_dir", c.offload.ssd_dir);
  f("pin_fraction", c.offload.pin_fraction);
  f("prefetch_depth", c.offload.prefetch_depth);
  f("optimizer_overlap", c.offload.optimizer_overlap);
  f("expert_cache", c.offload.expert_cache);
  f("lfu_threshold", c.offload.lfu.threshold);
  f("lfu_beta", c.offload.lfu.beta);
  f("lfu_period", c.offload.lfu.period);
  f("grad_accum", c.grad_accum);
  f("recompute", c.recompute);
  f("tasks", c.tasks);
  f("task_replan_every", c.task_replan_every);
  f("task_allocation", c.task_allocation);
  f("zero", c.zero);
  f("zero_prefetch", c.zero_prefetch);
}

// The enum settings are saved by name, the text every build has written ("offload": "host").
static std::string name_of(io::TokenFormat v) { return io::token_format_name(v); }
static std::string name_of(comm::A2AAlgorithm v) { return comm::a2a_algorithm_name(v); }
static std::string name_of(comm::SchedulerMode v) { return comm::scheduler_mode_name(v); }
static std::string name_of(PlacementRule v) { return placement_rule_name(v); }
static std::string name_of(offload::Tier v) { return offload::tier_name(v); }
static std::string name_of(offload::CachePolicy v) { return offload::to_string(v); }
static std::string name_of(nn::Recompute v) { return nn::recompute_name(v); }
static std::string name_of(AllocationRule v) { return allocation_rule_name(v); }
static void parse(const std::string& s, io::TokenFormat& v) { v = io::parse_token_format(s); }
static void parse(const std::string& s, comm::A2AAlgorithm& v) { v = comm::parse_a2a_algorithm(s); }
static void parse(const std::string& s, comm::SchedulerMode& v) {
  v = comm::parse_scheduler_mode(s);
}
static void parse(const std::string& s, PlacementRule& v) { v = parse_placement_rule(s); }
static void parse(const std::string& s, offload::Tier& v) { v = offload::parse_tier(s); }
static void parse(const std::string& s, offload::CachePolicy& v) {
  v = offload::parse_cache_policy(s);
}
static void parse(const std::string& s, nn::Recompute& v) { v = nn::parse_recompute(s); }
static void parse(const std::string& s, AllocationRule& v) { v = parse_allocation_rule(s); }

nlohmann::json to_json(const TrainConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for_each_field(c, [&](const char* key, const auto& field) {
    if constexpr (std::is_enum_v<std::decay_t<decltype(field)>>)
      j[key] = name_of(field);
    else
      j[key] = field;
  });
  return j;
}

TrainConfig train_config_from_json(const nlohmann::json& j, TrainConfig c) {
  const char* at = "";
  try {
    for_each_field(c, [&](const char* key, auto& field) {
      if (!j.contains(key)) return;
      at = key;
      using Field = std::decay_t<decltype(field)>;
      if constexpr (std::is_enum_v<Field>)
        parse(j.at(key).get<std::string>(), field);
      else
        field = j.at(key).get<Field>();
    });
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("training config: \"", at, "\" ", json_error_words(e)));
  } catch (const UsageError& e) {  // an enum setting's unknown name
    throw Error(str("training config: \"", at, "\": ", e.what()));
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
                         " does not fit the model's vocabulary of ", vocab, " (use ",
                         flag_for(Setting::vocab), " ", needed, " or more)"));
}

// --zero: the stages built, and the flags they cannot work with yet (see README "Scaling the dense
// model").
static void check_zero(const TrainConfig& train) {
  MOE_USAGE_CHECK(train.zero >= 0 && train.zero <= 3, flag_for(Setting::zero),
                  " must be 0, 1, 2 or 3 (got ", train.zero, ")");
  MOE_USAGE_CHECK(train.zero_prefetch >= 0, flag_for(Setting::zero_prefetch),
                  " must be 0 (off) or more (got ", train.zero_prefetch, ")");
}

// This rank's share of the model and of one step, at least: every parameter's value and
// gradient in the storage dtype and AdamW's two fp32 moments, and the step's fp32 logits.
static void check_training_memory(const ModelConfig& config, const TrainConfig& train,
                                  int world_size) {
  const double ranks = double(world_size), ep = double(std::max<int64_t>(train.ep, 1));
  // Offloaded experts are the store's to budget (TieredStore::start checks its tiers).
  // lpt: every rank holds every expert; flexmoe: V slots of each layer's E.
  const double E = double(std::max<int64_t>(config.experts, 1));
  const double slots =
      train.vexperts_per_rank > 0 ? double(train.vexperts_per_rank) : std::ceil(E / ep) + 1;
  const double experts = train.offload.tier != offload::Tier::none   ? 0
                         : train.placement == PlacementRule::fixed   ? 1 / ep
                         : train.placement == PlacementRule::flexmoe ? std::min(1.0, slots / E)
                                                                     : 1;
  const double params =
      parameter_lower_bound(config, experts, train.shard_embedding ? 1 / ranks : 1);
  const double state = params * double(2 * dtype_size(config.dtype) + 8);
  const double logits = double(train.batch) / ranks /
                        double(std::max<int64_t>(train.grad_accum, 1)) * double(config.seq) *
                        double(config.vocab_size) * 4;
  check_fits_in_memory(
      state + logits,
      str("training this model (vocabulary ", config.vocab_size, ", d_model ", config.d_model, ", ",
          config.layers, " layers, ", config.experts, " experts)"),
      str(format_bytes(state), " for ", params, " parameters' values, gradients and AdamW ",
          "state, ", format_bytes(logits), " for a micro-batch's logits",
          ranks > 1 ? " on each rank" : ""));
}

void check_data_not_stdin(const TrainConfig& train) {
  MOE_USAGE_CHECK(train.data != "-" && train.val != "-", flag_for(Setting::data),
                  " -: training reads its data on every rank and again when it resumes, so it "
                  "needs a file (save stdin first, e.g. cat > corpus.txt)");
}

double default_lr(const ModelConfig& model) { return 3e-3 * nn::width_ratio(model.d_model); }

namespace {

TrainConfig with_default_lr(TrainConfig train, const ModelConfig& model) {
  if (train.lr == 0) train.lr = default_lr(model);
  return train;
}

}  // namespace

Trainer::Trainer(const ModelConfig& model, const TrainConfig& train, io::Provenance provenance,
                 comm::Communicator* world, Device device, const io::StoredTokenizer* tokenizer)
    : train_(with_default_lr(train, model)), provenance_(std::move(provenance)), world_(world) {
  check_data_not_stdin(train);
  std::unique_ptr<io::Tokenizer> text_tokenizer;
  if (tokenizer && !tokenizer->empty()) {
    tokenizer_ = *tokenizer;
    text_tokenizer = io::stored_model_tokenizer(*tokenizer, model.vocab_size, "the checkpoint");
    MOE_USAGE_CHECK(train.tasks.empty(), flag_for(Setting::tasks),
                    " reads each task's text as bytes, but the model "
                    "reads text through its tokenizer (",
                    text_tokenizer->describe(), "): give the tasks token files");
  }
  if (!train.tasks.empty()) setup_tasks(model, train.data_format);  // sets train_.batch
  MOE_USAGE_CHECK(train.batch >= 1, flag_for(Setting::batch), " must be >= 1 (got ", train.batch,
                  ")");
  MOE_USAGE_CHECK(tasks_ || train.batch % world_size() == 0, flag_for(Setting::batch), " ",
                  train.batch, " does not divide over ", world_size(), " data-parallel ranks");
  MOE_USAGE_CHECK(train.grad_accum >= 1, flag_for(Setting::grad_accum), " must be >= 1 (got ",
                  train.grad_accum, ")");
  MOE_USAGE_CHECK(tasks_ || train.batch % (train.grad_accum * world_size()) == 0,
                  flag_for(Setting::batch), " ", train.batch, " does not split into ",
                  flag_for(Setting::grad_accum), " ", train.grad_accum, " equal micro-batches",
                  world_size() > 1 ? str(" on each of ", world_size(), " data-parallel ranks") : "",
                  ": use a ", flag_for(Setting::batch), " that is a multiple of ",
                  train.grad_accum * world_size());
  check_zero(train);
  MOE_USAGE_CHECK(train.steps >= 1, flag_for(Setting::steps), " must be >= 1 (got ", train.steps,
                  ")");
  // Every number is finite and in range (an infinite --lr trains every parameter to NaN).
  MOE_USAGE_CHECK(train_.lr > 0 && std::isfinite(train_.lr), flag_for(Setting::lr),
                  " must be a finite number > 0 (got ", train_.lr, ")");
  MOE_USAGE_CHECK(train.clip >= 0 && std::isfinite(train.clip), flag_for(Setting::clip),
                  " must be a finite number >= 0 (0 = off; got ", train.clip, ")");
  MOE_USAGE_CHECK(train.weight_decay >= 0 && std::isfinite(train.weight_decay),
                  flag_for(Setting::weight_decay), " must be a finite number >= 0 (got ",
                  train.weight_decay, ")");
  MOE_USAGE_CHECK(train.min_lr_ratio >= 0 && train.min_lr_ratio <= 1,
                  flag_for(Setting::min_lr_ratio), " must be in [0, 1] (got ", train.min_lr_ratio,
                  ")");
  MOE_USAGE_CHECK(train.warmup >= 0, flag_for(Setting::warmup), " must be >= 0");
  MOE_USAGE_CHECK(train.val_fraction > 0 && train.val_fraction < 1, flag_for(Setting::val_fraction),
                  " must be in (0, 1)");
  const io::TokenFormat format = train.data_format;
  // Text through the model's tokenizer when it has one, else every byte a token.
  auto load_tokens = [&](const std::string& path) {
    return io::load_model_tokens(path, format, text_tokenizer.get());
  };
  if (tasks_) {  // each task's held-out tail, or --val
    val_tokens_ = train.val.empty() ? tasks_->validation_tokens() : load_tokens(train.val);
  } else if (std::vector<int32_t> tokens = load_tokens(train.data); train.val.empty()) {
    auto split = io::split_tail(std::move(tokens), train.val_fraction, model.seq, train.data);
    train_tokens_ = std::move(split.first);
    val_tokens_ = std::move(split.second);
  } else {
    train_tokens_ = std::move(tokens);
    val_tokens_ = load_tokens(train.val);
  }
  ModelConfig config = model;
  if (config.vocab_size == 0)  // pre-tokenized data: the vocabulary covers every id it holds
    config.vocab_size = std::max({vocab_needed(train_tokens_), vocab_needed(val_tokens_),
                                  tasks_ ? tasks_->vocab_needed() : 0});
  MOE_USAGE_CHECK(!tasks_ || tasks_->vocab_needed() <= config.vocab_size, flag_for(Setting::tasks),
                  " ", train.tasks, ": a task's data holds token id ",
                  tasks_ ? tasks_->vocab_needed() - 1 : 0, ", outside the model's vocabulary of ",
                  config.vocab_size, " (use ", flag_for(Setting::vocab), " ",
                  tasks_ ? tasks_->vocab_needed() : 0, " or more)");
  check_vocab(train_tokens_, config.vocab_size, train.data);
  check_vocab(val_tokens_, config.vocab_size, train.val.empty() ? train.data : train.val);
  if (!tasks_)
    sampler_ = std::make_unique<io::BatchSampler>(&train_tokens_, model.seq, train.seed, true,
                                                   train.data);
  // Validation must hold at least one window (the sampler says so clearly otherwise).
  const std::string val_source = !train.val.empty() ? train.val : tasks_ ? "" : train.data;
  io::BatchSampler probe(&val_tokens_, model.seq, train.seed, false, val_source);

  MOE_USAGE_CHECK(!train.shard_embedding || !flavour_of(config).tied_head,
                  flag_for(Setting::shard_embedding), " needs an untied LM head, but the ",
                  arch_name(config.arch), " flavour ties it to the token table (use ",
                  flag_for(Setting::arch), " mixtral)");
  check_training_memory(config, train_, world_size());  // before any parameter is allocated
  setup_parallel(config, device);
  params_ = std::make_unique<ParamSet>(train.seed, config.dtype);
  offload_tier_ = train_.offload.tier;
  if (offload_tier_ == offload::Tier::automatic) plan_offload(config, device);  // none, host, ssd
  if (offload_tier_ != offload::Tier::none) {
    check_offload_device(train_, device, world_size());
    store_ = std::make_unique<offload::TieredStore>(*params_, store_config(device));
    parallel_.expert_store = store_.get();
  }
  model_ = std::make_unique<Transformer>(config, *params_,
                                         world_size() > 1 || store_ ? &parallel_ : nullptr);
  if (store_) store_->start();
  if (world_size() > 1 && train_.zero > 0)
    zero_ = std::make_unique<parallel::DenseShards>(
        *world_, *params_, static_cast<int>(train_.zero), adamw_config(), 2 << 20,
        [](const Param& p) { return block_of_name(p.name); });  // stage 3: gathered per block
  if (zero_ && zero_->stage() >= 3)
    zero_prefetch_ =
        std::make_unique<parallel::ZeroPrefetch>(*zero_, *world_, train_.zero_prefetch);
  optimizer_ = std::make_unique<optim::AdamW>(*params_, adamw_config(), optimizer_holds());
  if (world_size() > 1) grad_sync_ = std::make_unique<parallel::GradSync>(*layout_, *params_);
  if (zero_) grad_sync_->set_dense_shards(zero_.get());
  if (placement_ && train_.placement == PlacementRule::flexmoe) {  // its cost model, measured here
    balance::CostProfileSpec spec;
    spec.d_model = config.d_model;
    spec.d_ff = config.d_ff;
    spec.gated = moe::gated(flavour_of(config).activation);
    spec.dtype_bytes = static_cast<int64_t>(dtype_size(config.dtype));
    spec.device = device;
    spec.comm_device = layout_->experts()->name() == "nccl" ? device : Device{};
    placement_profile_ = balance::profile_costs(layout_->experts(), spec);
    placement_->set_cost(placement_profile_.model);
    sync_holders();
  }
}

Trainer::~Trainer() = default;

static parallel::LayoutConfig layout_config(const TrainConfig& train) {
  parallel::LayoutConfig c;
  c.ep = train.ep;
  c.shard_embedding = train.shard_embedding;
  c.a2a = train.a2a;
  c.ranks_per_node = train.ranks_per_node;
  c.comm_scheduler = train.comm_scheduler;
  c.partition_mb = train.partition_mb;
  return c;
}

void Trainer::setup_parallel(const ModelConfig& config, Device device) {
  PlacementConfig placement{train_.placement, train_.vexperts_per_rank, train_.balance_threshold,
                            train_.replan_every};
  check_placement_config(placement);
  if (placement.policy != PlacementRule::fixed) {
    const char* policy = placement_rule_name(placement.policy);
    MOE_USAGE_CHECK(train_.ep > 1, flag_for(Setting::placement), " ", policy,
                    " places experts over the expert-parallel ranks: it needs ",
                    flag_for(Setting::ep), " > 1");
    MOE_USAGE_CHECK(train_.offload.tier == offload::Tier::none, flag_for(Setting::placement), " ",
                    policy, " holds every expert on every rank; it does not combine with ",
                    flag_for(Setting::offload), " ", offload::tier_name(train_.offload.tier),
                    " yet");
    // Replicas of one group keep their experts current among themselves; a second group's
    // replicas of the same expert would need the sum over both groups' holders.
    MOE_USAGE_CHECK(placement.policy != PlacementRule::flexmoe || train_.ep == world_size(),
                    flag_for(Setting::placement),
                    " flexmoe plans replicas in one expert group: it needs ", flag_for(Setting::ep),
                    " equal "
                    "to the number of ranks (",
                    world_size(), "), not ", train_.ep);
  }
  layout_ = std::make_unique<parallel::Layout>(world_, layout_config(train_), device);
  world_ = layout_->world();
  if (world_size() > 1) parallel_ = nn::Parallel::of(*layout_);
  if (layout_->experts()) {
    std::map<int64_t, int64_t> experts_of_block;  // block -> its experts
    for (int64_t block : config.moe_blocks())
      experts_of_block[block] = config.experts_per_layer[static_cast<size_t>(block)];
    placement_ = TrainingPlacement::make(placement, *layout_->experts(), experts_of_block);
    parallel_.placement = placement_.get();
  }
}

// --tasks (moe/train/tasks.h): the tasks' data and allocation, and the global batch becomes their
// total. What has not been made to work with it is refused by name.
void Trainer::setup_tasks(const ModelConfig& model, io::TokenFormat format) {
  const TrainConfig& t = train_;
  MOE_USAGE_CHECK(t.data.empty(), flag_for(Setting::tasks), " ", t.tasks, " replaces ",
                  flag_for(Setting::data), " (each task names its data file): drop ",
                  flag_for(Setting::data), " ", t.data);
  auto refuse = [&](bool bad, const std::string& what, const std::string& why) {
    MOE_USAGE_CHECK(!bad, flag_for(Setting::tasks), " does not combine with ", what, ": ", why);
  };
  refuse(t.grad_accum > 1, str(flag_for(Setting::grad_accum), " ", t.grad_accum),
         "a rank's rows are one pass (lower the tasks' batches instead)");
  refuse(t.placement != PlacementRule::fixed,
         str(flag_for(Setting::placement), " ", placement_rule_name(t.placement)),
         "its replans and cost model assume every rank computes the same number of rows");
  refuse(t.offload.tier != offload::Tier::none,
         str(flag_for(Setting::offload), " ", offload::tier_name(t.offload.tier)),
         "the expert store's gradient scaling has not been made to follow the tasks' weights");
  refuse(t.shard_embedding, flag_for(Setting::shard_embedding),
         "not tested with ranks of different batches");
  refuse(t.comm_scheduler != comm::SchedulerMode::off,
         str(flag_for(Setting::comm_scheduler), " ", comm::scheduler_mode_name(t.comm_scheduler)),
         "not tested with ranks of different batches");
  MOE_USAGE_CHECK(t.task_replan_every >= 0, flag_for(Setting::task_replan_every),
                  " must be >= 0 (got ", t.task_replan_every, ")");
  MOE_USAGE_CHECK(t.task_replan_every == 0 || t.task_allocation == AllocationRule::workload,
                  flag_for(Setting::task_replan_every), " reallocates by workload: it needs ",
                  flag_for(Setting::task_allocation),
                  " "
                  "workload, not ",
                  allocation_rule_name(t.task_allocation));
  tasks_ = std::make_unique<TaskSet>(read_tasks_file(t.tasks), format, model.seq, t.seed,
                                     t.val_fraction, world_size(), rank(), t.task_allocation);
  train_.batch = tasks_->total_batch();
}

// Losses become means over the ranks; expert loads and drops become sums: the numbers describe the
// global batch. The aux loss already uses the global loads (MoELayer), so its mean over the ranks
// is the global batch's; capacity is per rank (computed on and applied to each rank's tokens).
void Trainer::reduce_stats(StepStats& s) {
  ForwardStats& f = s.forward;
  Tensor losses = Tensor::from_vector(
      {3}, std::vector<float>{static_cast<float>(f.loss), static_cast<float>(f.aux_loss),
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
    if (!m.load_global) counts.insert(counts.end(), m.load.begin(), m.load.end());
    counts.push_back(m.dropped);
    counts.push_back(m.assignments);
    counts.push_back(m.input_tokens);
  }
  if (counts.empty()) return;
  if (comm::Communicator* group = layout_->experts()) {
    // Per MoE layer, from every expert rank: the rows it computed, and its seconds in the layer's
    // expert part (as bits).
    const std::vector<int64_t> blocks = model_->config().moe_blocks();
    const auto L = static_cast<int64_t>(f.moe.size());
    const int P = group->size();
    const std::vector<double>& seconds = layout_->exchange_stats()->moe_seconds;
    Tensor mine = Tensor::empty({2 * L}, DType::i64), all = Tensor::empty({P * 2 * L}, DType::i64);
    for (int64_t l = 0; l < L; ++l) {
      mine.data<int64_t>()[l] = f.moe[static_cast<size_t>(l)].rows_computed;
      const auto b = static_cast<size_t>(blocks.at(static_cast<size_t>(l)));
      const double t = b < seconds.size() ? seconds[b] : 0.0;
      std::memcpy(mine.data<int64_t>() + L + l, &t, sizeof t);
    }
    group->all_gather(mine, all);
    for (int64_t l = 0; l < L; ++l) {
      std::vector<int64_t> rows(static_cast<size_t>(P));
      double slowest = 0;
      for (int r = 0; r < P; ++r) {
        rows[static_cast<size_t>(r)] = all.data<int64_t>()[r * 2 * L + l];
        double t;
        std::memcpy(&t, all.data<int64_t>() + r * 2 * L + L + l, sizeof t);
        slowest = std::max(slowest, t);
      }
      s.rank_load_max_over_mean.push_back(balance::max_over_mean(rows));
      s.moe_seconds.push_back(slowest);
    }
  }
  Tensor summed = Tensor::empty({static_cast<int64_t>(counts.size())}, DType::i64);
  std::copy(counts.begin(), counts.end(), summed.data<int64_t>());
  world_->all_reduce(summed, comm::ReduceOp::sum);
  const int64_t* c = summed.data<int64_t>();
  for (nn::MoEStats& m : f.moe) {
    if (!m.load_global)
      for (int64_t& l : m.load) l = *c++;
    m.dropped = *c++;
    m.assignments = *c++;
    m.input_tokens = *c++;
  }
  // Centred routers' input sums.
  std::vector<double> sums;
  for (const nn::MoEStats& m : f.moe)
    sums.insert(sums.end(), m.input_sum.begin(), m.input_sum.end());
  if (sums.empty()) return;
  all_reduce_sums(sums);
  auto v = sums.begin();
  for (nn::MoEStats& m : f.moe)
    for (double& x : m.input_sum) x = *v++;
}

void Trainer::all_reduce_sums(std::vector<double>& sums) const {
  if (world_size() == 1 || sums.empty()) return;
  Tensor all = Tensor::from_vector({static_cast<int64_t>(sums.size())},
                                   std::vector<float>(sums.begin(), sums.end()));
  world_->all_reduce(all, comm::ReduceOp::sum);
  const float* v = all.data<float>();
  for (double& x : sums) x = *v++;
}

double Trainer::learning_rate() const {
  return optim::lr_at(step_, train_.steps, train_.warmup, static_cast<float>(train_.lr),
                      static_cast<float>(train_.lr * train_.min_lr_ratio));
}

optim::AdamW::Filter Trainer::optimizer_holds() const {
  if (!zero_) return nullptr;
  return [zero = zero_.get()](const Param& p) { return !zero->covers(p); };
}

optim::AdamWConfig Trainer::adamw_config() const {
  optim::AdamWConfig oc;
  oc.weight_decay = static_cast<float>(train_.weight_decay);
  return oc;
}

void Trainer::to_device(Device device) {
  if (device == params_->device()) return;
  // The store's slots were allocated on the device the Trainer was built for.
  MOE_USAGE_CHECK(!store_ || store_->config().device == device, flag_for(Setting::offload),
                  " with ", flag_for(Setting::device), " ", device.str(),
                  ": the expert store was built for ",
                  store_ ? store_->config().device.str() : std::string(),
                  " (pass the device to the Trainer's constructor)");
  MOE_CHECK(backend_available(device.kind), flag_for(Setting::device), " ", device.str(), ": ",
            cuda::unavailable_reason());
  MOE_CHECK(device.kind == Device::cpu || world_size() == 1 || world_->name() == "nccl",
            flag_for(Setting::device), " ", device.str(), " with ", world_size(),
            " ranks needs an NCCL communicator (", world_->name(),
            " collectives read host memory)");
  MOE_USAGE_CHECK(device.kind == Device::cpu || !zero_ || zero_->stage() < 3,
                  flag_for(Setting::zero), " 3 with ", flag_for(Setting::device), " ", device.str(),
                  ": sharded dense values have run on the CPU only (use ", flag_for(Setting::zero),
                  " 2)");
  MOE_USAGE_CHECK(device.kind == Device::cpu || !parallel_.embedding, flag_for(Setting::device),
                  " ", device.str(), ": ", flag_for(Setting::shard_embedding),
                  " runs on the CPU only (its table exchange is host code)");
  // The optimizer's tensors follow the parameters: the new optimizer copies the old one's state
  // (kept alive by `state`) onto the device.
  const std::vector<optim::OptimizerTensor> state = optimizer_->state();
  const int64_t steps = optimizer_->steps_taken();
  params_->to(device);
  optimizer_ = std::make_unique<optim::AdamW>(*params_, adamw_config(), optimizer_holds());
  optimizer_->load_state(state, steps);
  if (zero_) zero_->to(device);
  // The fused gradient buffers the collectives reduce live with the gradients.
  if (grad_sync_) grad_sync_->to(device);
}

double Trainer::evaluate() { return evaluate(*model_); }

ForwardStats Trainer::forward_only(const Transformer& model, const Tensor& ids,
                                   const Tensor& targets, EvalOptions options) {
  const Device device = model.device();
  if (&model == model_.get() && zero_ && zero_->stage() >= 3) {  // gathered around each block
    const BlockHooks hooks{[this](int64_t g) { zero_prefetch_->gather(g, false); },
                           [this](int64_t g) { zero_prefetch_->release(g, false); }};
    options.hooks = &hooks;
    zero_->gather(-1);
    const int64_t layers = model.config().layers;
    zero_prefetch_->begin_pass(options.blocks > 0 ? std::min(options.blocks, layers) : layers,
                               false);
    ForwardStats f = model.evaluate(ids.to(device), targets.to(device), options);
    zero_->release(-1);
    return f;
  }
  return model.evaluate(ids.to(device), targets.to(device), options);
}

double Trainer::evaluate(const Transformer& model) {
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
      sum += forward_only(model, ids, targets, {}).loss;
    }
    arena_.reset();
  }
  return sum / static_cast<double>(batches);
}

void Trainer::set_train_config_notes(nlohmann::json notes) {
  MOE_CHECK(notes.is_object(), "training config notes must be a JSON object, got ", notes.dump());
  const nlohmann::json own = to_json(train_);
  for (const auto& [key, value] : notes.items())
    MOE_CHECK(!own.contains(key), "training config note '", key,
              "' would overwrite the training setting of that name");
  train_config_notes_ = std::move(notes);
}

}  // namespace moe::train
