// Mixture-of-Students distillation: student planning, weights cut from the teacher, the KD loop.
// Shape letters: L teacher layers, N student layers, E experts of a layer, k experts per token.
#include "moe/train/distill.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "moe/io/checkpoint_dir.h"
#include "moe/io/dataset.h"
#include "moe/io/model_text.h"
#include "moe/ops/distill.h"
#include "moe/settings.h"

namespace moe::train {

std::vector<int64_t> evenly_spaced_layers(int64_t teacher_layers, int64_t student_layers) {
  MOE_USAGE_CHECK(student_layers >= 1, flag_for(Setting::student_layers), " must be >= 1 (got ",
                  student_layers, ")");
  MOE_USAGE_CHECK(student_layers <= teacher_layers, flag_for(Setting::student_layers), " ",
                  student_layers, " is more than the teacher's ", teacher_layers,
                  " layers (a student keeps a subset of them)");
  std::vector<int64_t> layers;
  for (int64_t i = 0; i < student_layers; ++i)
    layers.push_back((i + 1) * teacher_layers / student_layers - 1);
  return layers;
}

std::vector<std::vector<int64_t>> expert_loads(const Transformer& teacher,
                                               const std::vector<int32_t>& tokens, int64_t batches,
                                               int64_t batch, uint64_t seed,
                                               const std::string& source) {
  const ModelConfig& config = teacher.config();
  std::vector<std::vector<int64_t>> loads(static_cast<size_t>(config.layers));
  for (int64_t l = 0; l < config.layers; ++l)
    loads[static_cast<size_t>(l)].assign(static_cast<size_t>(config.experts_per_layer[l]), 0);
  io::BatchSampler sampler(&tokens, config.seq, seed, true, source);
  batch = std::max<int64_t>(1, std::min(batch, sampler.num_windows()));
  for (int64_t b = 0; b < batches; ++b) {
    Tensor ids, targets;
    sampler.next(batch, ids, targets);
    ForwardStats stats = teacher.evaluate(ids, targets);
    size_t moe = 0;
    for (int64_t l = 0; l < config.layers; ++l) {
      if (!config.is_moe_layer(l)) continue;
      const std::vector<int64_t>& load = stats.moe.at(moe++).load;
      std::vector<int64_t>& sum = loads[static_cast<size_t>(l)];
      MOE_CHECK(load.size() == sum.size(), "expert loads of layer ", l, ": ", load.size(),
                " entries for ", sum.size(), " experts");
      for (size_t e = 0; e < load.size(); ++e) sum[e] += load[e];
    }
  }
  return loads;
}

// Expert counts per student layer from the spec (see StudentSpec::experts).
static std::vector<int64_t> student_expert_counts(const ModelConfig& teacher,
                                                  const std::vector<int64_t>& layers,
                                                  const std::vector<int64_t>& wanted) {
  const size_t n = layers.size();
  std::vector<size_t> moe_layers;  // student layers whose teacher layer is MoE
  for (size_t j = 0; j < n; ++j)
    if (teacher.is_moe_layer(layers[j])) moe_layers.push_back(j);
  std::vector<int64_t> counts(n, 0);
  for (size_t j = 0; j < n; ++j) counts[j] = teacher.experts_per_layer[layers[j]];
  if (wanted.empty()) return counts;
  MOE_USAGE_CHECK(!moe_layers.empty(), flag_for(Setting::student_experts),
                  ": the student has no MoE layer (teacher "
                  "layers kept are all dense)");
  if (wanted.size() == 1) {
    for (size_t j : moe_layers) counts[j] = wanted[0];
  } else if (wanted.size() == moe_layers.size()) {
    for (size_t i = 0; i < moe_layers.size(); ++i) counts[moe_layers[i]] = wanted[i];
  } else if (wanted.size() == n) {
    for (size_t j = 0; j < n; ++j) {
      MOE_USAGE_CHECK(teacher.is_moe_layer(layers[j]) || wanted[j] == 0,
                      flag_for(Setting::student_experts), ": ", wanted[j],
                      " experts for student layer ", j, ", but its teacher layer ", layers[j],
                      " is dense (give 0 there)");
      counts[j] = wanted[j];
    }
  } else {
    throw UsageError(str(flag_for(Setting::student_experts), " has ", wanted.size(),
                         " values; give one for every MoE layer, one per student MoE layer (",
                         moe_layers.size(), ") or one per student layer (", n, ", 0 = dense)"));
  }
  const int64_t k = teacher.residual_moe ? 1 : teacher.top_k;
  const int64_t least = teacher.residual_moe ? 1 : std::max<int64_t>(2, k);
  for (size_t j : moe_layers) {
    const int64_t have = teacher.experts_per_layer[layers[j]];
    MOE_USAGE_CHECK(counts[j] <= have, flag_for(Setting::student_experts), ": ", counts[j],
                    " experts for student layer ", j, " is more than the ", have,
                    " experts of teacher layer ", layers[j],
                    " (a student keeps a subset of the teacher's experts)");
    MOE_USAGE_CHECK(counts[j] >= least, flag_for(Setting::student_experts), ": ", counts[j],
                    " experts for student layer ", j, " (teacher layer ", layers[j],
                    "); an MoE layer of this teacher needs at least ", least,
                    teacher.residual_moe ? " (residual MoE)" : str(" (top-k ", k, ")"),
                    " and cannot become dense");
  }
  return counts;
}

StudentPlan plan_student(const ModelConfig& teacher, const StudentSpec& spec,
                         const std::vector<std::vector<int64_t>>& loads) {
  const int64_t L = teacher.layers;
  StudentPlan plan;
  if (!spec.keep_layers.empty()) {
    MOE_USAGE_CHECK(
        spec.layers == 0 || spec.layers == static_cast<int64_t>(spec.keep_layers.size()),
        flag_for(Setting::student_layers), " ", spec.layers, " disagrees with the ",
        spec.keep_layers.size(), " layers of ", flag_for(Setting::keep_layers));
    for (size_t i = 0; i < spec.keep_layers.size(); ++i) {
      const int64_t l = spec.keep_layers[i];
      MOE_USAGE_CHECK(l >= 0 && l < L, flag_for(Setting::keep_layers), ": layer ", l,
                      " is not one of the teacher's ", L, " layers (0..", L - 1, ")");
      MOE_USAGE_CHECK(i == 0 || l > spec.keep_layers[i - 1], flag_for(Setting::keep_layers),
                      " must be strictly increasing (got ", spec.keep_layers[i - 1], " then ", l,
                      ")");
    }
    plan.layers = spec.keep_layers;
    plan.layer_rule = str("as given by ", flag_for(Setting::keep_layers));
  } else {
    plan.layers = evenly_spaced_layers(L, spec.layers ? spec.layers : L);
    plan.layer_rule = static_cast<int64_t>(plan.layers.size()) == L
                          ? "all of them"
                          : "evenly spaced, the last always kept";
  }
  plan.expert_rule = spec.expert_rule;
  const bool popular = spec.expert_rule == ExpertRule::popular;
  MOE_CHECK(!popular || static_cast<int64_t>(loads.size()) == L,
            "plan_student: the popular rule needs expert loads of all ", L, " teacher layers (got ",
            loads.size(), ")");
  const std::vector<int64_t> counts = student_expert_counts(teacher, plan.layers, spec.experts);
  for (size_t j = 0; j < plan.layers.size(); ++j) {
    const int64_t l = plan.layers[j], have = teacher.experts_per_layer[l], keep = counts[j];
    std::vector<int64_t> order(static_cast<size_t>(have));
    std::iota(order.begin(), order.end(), 0);
    double share = 0;
    if (popular && have > 0) {
      const std::vector<int64_t>& load = loads[static_cast<size_t>(l)];
      MOE_CHECK(static_cast<int64_t>(load.size()) == have, "plan_student: ", load.size(),
                " loads for the ", have, " experts of teacher layer ", l);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return load[a] > load[b]; });
      int64_t total = 0, kept = 0;
      for (int64_t e = 0; e < have; ++e) {
        total += load[e];
        if (e < keep) kept += load[order[e]];
      }
      share = total ? static_cast<double>(kept) / static_cast<double>(total) : 0;
    }
    order.resize(static_cast<size_t>(keep));
    std::sort(order.begin(), order.end());
    plan.experts.push_back(order);
    if (popular) plan.routing_kept.push_back(share);
  }
  return plan;
}

ModelConfig student_config(const ModelConfig& teacher, const StudentPlan& plan) {
  ModelConfig c = teacher;
  c.layers = static_cast<int64_t>(plan.layers.size());
  c.experts_per_layer.clear();
  int64_t most = 0;
  for (const std::vector<int64_t>& experts : plan.experts) {
    c.experts_per_layer.push_back(static_cast<int64_t>(experts.size()));
    most = std::max(most, static_cast<int64_t>(experts.size()));
  }
  if (most > 0) c.experts = most;
  c.validate();
  return c;
}

// The first `rows` of dim 0 picked from `from` in the order of `which`.
static Tensor select_rows(const Tensor& from, const std::vector<int64_t>& which,
                          const std::string& name) {
  MOE_CHECK(from.ndim() >= 1, "'", name, "' ", from.describe(), " has no expert dimension");
  Shape shape = from.shape();
  shape[0] = static_cast<int64_t>(which.size());
  Tensor out = Tensor::empty(shape, from.dtype());
  const size_t row_bytes = from.nbytes() / static_cast<size_t>(from.dim(0));
  const auto* src = static_cast<const std::byte*>(from.raw());
  auto* dst = static_cast<std::byte*>(out.raw());
  for (size_t i = 0; i < which.size(); ++i) {
    MOE_CHECK(which[i] >= 0 && which[i] < from.dim(0), "'", name, "': row ", which[i], " of ",
              from.describe());
    std::copy_n(src + static_cast<size_t>(which[i]) * row_bytes, row_bytes, dst + i * row_bytes);
  }
  return out;
}

std::vector<io::NamedTensor> student_params(const ParamSet& teacher,
                                            const ModelConfig& teacher_config,
                                            const StudentPlan& plan) {
  std::map<int64_t, size_t> student_of;  // teacher layer -> student layer
  for (size_t j = 0; j < plan.layers.size(); ++j) student_of[plan.layers[j]] = j;
  std::vector<io::NamedTensor> out;
  const std::string blocks = "blocks.";
  for (const Param* p : teacher.all()) {
    MOE_CHECK(!p->shard.defined(), "teacher parameter '", p->name,
              "' is a slice of a sharded tensor; distill from a whole checkpoint");
    if (p->name.compare(0, blocks.size(), blocks) != 0) {
      out.push_back({p->name, p->value.clone(), p->expert});
      continue;
    }
    const size_t dot = p->name.find('.', blocks.size());
    MOE_CHECK(dot != std::string::npos, "teacher parameter '", p->name, "' has no block index");
    const int64_t layer = std::stoll(p->name.substr(blocks.size(), dot - blocks.size()));
    auto it = student_of.find(layer);
    if (it == student_of.end()) continue;  // a layer the student drops
    const std::string rest = p->name.substr(dot + 1);
    const std::string name = blocks + std::to_string(it->second) + "." + rest;
    const std::vector<int64_t>& experts = plan.experts[it->second];
    const bool per_expert = p->expert || rest == "moe.router.weight" || rest == "moe.router.bias" ||
                            rest == "moe.router.logit_bias";
    if (per_expert) {
      MOE_CHECK(p->value.dim(0) == teacher_config.experts_per_layer[layer], "teacher parameter ",
                p->value.describe(), " of '", p->name, "' does not hold the ",
                teacher_config.experts_per_layer[layer], " experts of layer ", layer);
      out.push_back({name, select_rows(p->value, experts, p->name), p->expert});
    } else {
      out.push_back({name, p->value.clone(), p->expert});
    }
  }
  return out;
}

nlohmann::json to_json(const StudentPlan& plan) {
  nlohmann::json j{{"kept_layers", plan.layers},
                   {"layer_rule", plan.layer_rule},
                   {"kept_experts", plan.experts},
                   {"expert_rule", expert_rule_name(plan.expert_rule)}};
  if (!plan.routing_kept.empty()) j["routing_kept"] = plan.routing_kept;
  return j;
}

static std::string join(const std::vector<int64_t>& values) {
  std::string s;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(values[i]);
  }
  return s;
}

std::vector<std::string> describe(const StudentPlan& plan, const ModelConfig& teacher) {
  std::vector<std::string> lines;
  lines.push_back(str("student layers: teacher layers ", join(plan.layers), " of 0..",
                      teacher.layers - 1, " (", plan.layer_rule, ")"));
  for (size_t j = 0; j < plan.layers.size(); ++j) {
    const int64_t l = plan.layers[j], have = teacher.experts_per_layer[l];
    std::string line = str("student layer ", j, " <- teacher layer ", l, ": ");
    if (have == 0) {
      line += "dense";
    } else {
      line += str("experts ", join(plan.experts[j]), " of ", have, " (",
                  plan.expert_rule == ExpertRule::popular ? "most routed" : "the first");
      if (j < plan.routing_kept.size()) {
        char share[32];
        std::snprintf(share, sizeof share, "%.1f%%", 100.0 * plan.routing_kept[j]);
        line += str(": ", share, " of the teacher's routing");
      }
      line += ")";
    }
    lines.push_back(line);
  }
  return lines;
}

const char* expert_rule_name(ExpertRule rule) {
  return rule == ExpertRule::popular ? "popular" : "first";
}

ExpertRule parse_expert_rule(std::string_view name) {
  if (name == "popular") return ExpertRule::popular;
  if (name == "first") return ExpertRule::first;
  throw UsageError(str("unknown ", flag_for(Setting::expert_selection), " '", name,
                       "' (expected popular or first)"));
}

const char* kd_schedule_name(KdSchedule schedule) {
  return schedule == KdSchedule::linear ? "linear" : "step";
}

KdSchedule parse_kd_schedule(std::string_view name) {
  if (name == "linear") return KdSchedule::linear;
  if (name == "step") return KdSchedule::step;
  throw UsageError(
      str("unknown ", flag_for(Setting::kd_schedule), " '", name, "' (expected linear or step)"));
}

double kd_weight_at(int64_t step, double alpha, int64_t stop, KdSchedule schedule) {
  if (stop <= 0 || step >= stop) return 0.0;
  if (schedule == KdSchedule::step) return 1.0 - alpha;
  return (1.0 - alpha) * (1.0 - static_cast<double>(step) / static_cast<double>(stop));
}

static void check_config(DistillConfig& c, const TrainConfig& train) {
  MOE_USAGE_CHECK(std::isfinite(c.alpha) && c.alpha >= 0 && c.alpha <= 1,
                  flag_for(Setting::kd_alpha),
                  " must be in [0, 1] (the cross-entropy's share), got ", c.alpha);
  MOE_USAGE_CHECK(std::isfinite(c.temperature) && c.temperature > 0,
                  flag_for(Setting::kd_temperature), " must be > 0, got ", c.temperature);
  MOE_USAGE_CHECK(c.kd_stop_step >= -1, flag_for(Setting::kd_stop_step), " must be >= 0, got ",
                  c.kd_stop_step);
  MOE_USAGE_CHECK(c.selection_batches >= 1, flag_for(Setting::selection_batches),
                  " must be >= 1, got ", c.selection_batches);
  MOE_USAGE_CHECK(train.steps >= 1, flag_for(Setting::steps), " must be >= 1 (got ", train.steps,
                  ")");
  MOE_USAGE_CHECK(train.batch >= 1, flag_for(Setting::batch), " must be >= 1 (got ", train.batch,
                  ")");
  if (c.kd_stop_step < 0) c.kd_stop_step = (3 * train.steps + 3) / 4;
}

Distiller::Distiller(const DistillConfig& distill, const TrainConfig& train,
                     io::Provenance provenance)
    : config_(distill) {
  check_data_not_stdin(train);
  check_config(config_, train);
  namespace fs = std::filesystem;
  MOE_CHECK(!config_.teacher.empty(), "no teacher checkpoint given");
  std::error_code ec;
  if (!fs::exists(config_.teacher, ec))
    throw Error(str("teacher checkpoint '", config_.teacher, "' does not exist"));
  teacher_ = infer::load_model(config_.teacher);
  MOE_CHECK(
      teacher_.quantization.empty(), flag_for(Setting::teacher), " '", config_.teacher, "' is a ",
      teacher_.quantization,
      "-quantised checkpoint (moe-convert quantize): moe-distill cannot use it (only "
      "moe-infer and moe-profile record read one); give it the checkpoint that was quantised");
  const ModelConfig& tc = teacher_.config;

  // The teacher scores every token of the data: its vocabulary must cover them.
  // Text through the teacher's tokenizer, which the student inherits (its trainer reads the
  // data through it again and its checkpoints keep it).
  const io::TokenFormat format = train.data_format;
  const io::StoredTokenizer stored =
      io::read_tokenizer(io::checkpoint_files({config_.teacher}).at(0));
  const std::unique_ptr<io::Tokenizer> tokenizer =
      io::stored_model_tokenizer(stored, tc.vocab_size, config_.teacher);
  std::vector<int32_t> tokens = io::load_model_tokens(train.data, format, tokenizer.get());
  io::check_tokens_fit(tokens, tc.vocab_size, train.data);
  if (!train.val.empty())
    io::check_tokens_fit(io::load_model_tokens(train.val, format, tokenizer.get()), tc.vocab_size,
                         train.val);
  // Expert popularity is measured on the training part only (what the trainer will hold).
  std::vector<std::vector<int64_t>> loads;
  if (config_.student.expert_rule == ExpertRule::popular) {
    std::vector<int32_t> train_part =
        train.val.empty()
            ? io::split_tail(std::move(tokens), train.val_fraction, tc.seq, train.data).first
            : std::move(tokens);
    loads = expert_loads(*teacher_.model, train_part, config_.selection_batches, train.batch,
                         train.seed, train.data);
  }
  plan_ = plan_student(tc, config_.student, loads);
  const ModelConfig sc = train::student_config(tc, plan_);

  trainer_ =
      std::make_unique<Trainer>(sc, train, std::move(provenance), nullptr, Device{}, &stored);
  // Start from the teacher's weights: parameters, fresh moments, fp32 masters of the same values.
  io::Checkpoint init;
  init.params = student_params(*teacher_.params, tc, plan_);
  init.tokenizer = stored;
  std::set<std::string> given;
  for (const io::NamedTensor& nt : init.params) given.insert(nt.name);
  for (const optim::OptimizerTensor& t : trainer_->optimizer().state())
    MOE_CHECK(given.count(t.param->name), "student parameter '", t.param->name,
              "' has no teacher weights");
  trainer_->initialize(std::move(init));

  nlohmann::json notes = to_json(plan_);
  notes["teacher"] = config_.teacher;
  notes["teacher_layers"] = tc.layers;
  notes["teacher_experts_per_layer"] = tc.experts_per_layer;
  notes["teacher_step"] = teacher_.step;
  notes["alpha"] = config_.alpha;
  notes["temperature"] = config_.temperature;
  notes["kd_stop_step"] = config_.kd_stop_step;
  notes["kd_schedule"] = kd_schedule_name(config_.kd_schedule);
  trainer_->set_train_config_notes(nlohmann::json{{"distill", notes}});
}

Distiller::~Distiller() = default;

void Distiller::to_device(Device device) {
  trainer_->to_device(device);  // checks the device first
  teacher_.params->to(device);
}

DistillStep Distiller::step() {
  DistillStep d;
  d.kd_weight = kd_weight_at(trainer_->steps_done(), config_.alpha, config_.kd_stop_step,
                             config_.kd_schedule);
  d.ce_weight = 1.0 - d.kd_weight;
  if (d.kd_weight > 0) {
    const float ce_weight = static_cast<float>(d.ce_weight);
    const float kd_weight = static_cast<float>(d.kd_weight);
    const float temperature = static_cast<float>(config_.temperature);
    trainer_->set_logits_loss(
        [this, ce_weight, kd_weight, temperature](const Tensor& ids, const Tensor& targets,
                                                  const Tensor& logits, Tensor& dlogits) {
          const Tensor teacher_logits = teacher_.model->logits(ids);  // forward only, no jitter
          const ops::DistillLossValue v = ops::distill_loss(
              logits, teacher_logits, targets, temperature, ce_weight, kd_weight, &dlogits);
          step_ce_ = v.ce;
          step_kd_ = v.kd;
          return v.total;
        });
  } else {
    trainer_->set_logits_loss({});  // plain cross-entropy; the teacher is not needed any more
  }
  d.train = trainer_->step();
  d.ce = d.kd_weight > 0 ? step_ce_ : d.train.forward.loss;
  d.kd = d.kd_weight > 0 ? step_kd_ : std::numeric_limits<double>::quiet_NaN();
  return d;
}

double Distiller::evaluate_teacher() { return trainer_->evaluate(*teacher_.model); }

}  // namespace moe::train
