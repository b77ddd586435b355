// Mixture-of-Students distillation (DeepSpeed-MoE): a smaller MoE student (fewer layers, fewer
// experts per layer, a PR-MoE pyramid allowed) is cut out of a trained teacher checkpoint and
// trained on
//
//   loss = ce_weight * CE(student, labels) + kd_weight * T^2 * KL(softmax(teacher/T) ||
//          softmax(student/T))   (+ the student's aux and z losses)
//
// with kd_weight = (1 - alpha) * decay(step) and ce_weight = 1 - kd_weight: alpha CE + (1 - alpha)
// KD at the start, plain CE once the KD term has decayed to zero at kd_stop_step ("staged KD":
// DeepSpeed found that distilling to the end hurts the student). The teacher runs forward only,
// on the student's batches. moe-distill drives it; the output is an ordinary checkpoint.
//
// Shape letters: L teacher layers, N student layers, E experts of a layer.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/models/transformer.h"
#include "moe/train/trainer.h"

namespace moe::train {

// Which experts a student layer keeps (the expert_selection setting): popular, the most routed on
// the selection batches; first, experts 0..E-1.
enum class ExpertRule { popular, first };
const char* expert_rule_name(ExpertRule rule);  // "popular" | "first", as checkpoints record it
// UsageError naming the setting's flag for any other name.
ExpertRule parse_expert_rule(std::string_view name);

// How the KD weight goes to zero (the kd_schedule setting): linear, decaying from 1 - alpha at
// step 0 to 0 at kd_stop_step; step, full weight until kd_stop_step, then 0.
enum class KdSchedule { linear, step };
const char* kd_schedule_name(KdSchedule schedule);    // "linear" | "step"
KdSchedule parse_kd_schedule(std::string_view name);  // UsageError naming the flag otherwise

// What the user asks the student to be. Every count is checked against the teacher (UsageError
// naming the flag and the teacher's value).
struct StudentSpec {
  int64_t layers = 0;                // 0: as many as the teacher
  std::vector<int64_t> keep_layers;  // explicit teacher layers, strictly increasing (overrides)
  // Empty: the teacher's expert counts. One value: every MoE layer. Otherwise one value per
  // student MoE layer, or one per student layer (0 at the dense ones). A layer keeps its kind: a
  // count must be >= 1 (>= top_k, or 1 with residual MoE) and at most the teacher layer's.
  std::vector<int64_t> experts;
  ExpertRule expert_rule = ExpertRule::popular;
};

// Which teacher parts the student is made of.
struct StudentPlan {
  std::vector<int64_t> layers;                // per student layer: its teacher layer, increasing
  std::vector<std::vector<int64_t>> experts;  // per student layer: teacher experts, increasing
  std::string layer_rule;                     // how the layers were chosen, in words
  ExpertRule expert_rule = ExpertRule::popular;
  // Per student layer: the share of the teacher's routing (tokens x top-k) on the selection
  // batches that went to the kept experts (empty when no loads were measured; 0 for dense).
  std::vector<double> routing_kept;
};

// Student layer i <- teacher layer floor((i + 1) L / N) - 1: evenly spaced, the last always kept
// (it feeds the final norm and head). UsageError unless 1 <= N <= L.
std::vector<int64_t> evenly_spaced_layers(int64_t teacher_layers, int64_t student_layers);

// Tokens routed to each expert of every teacher layer ([L][E]; empty for dense layers), over
// `batches` batches of `batch` windows drawn from `tokens` in a fixed order keyed by seed
// (io::BatchSampler), evaluation mode. The evidence for the "popular" expert rule. `source`, the
// data file the tokens came from, is named when they hold less than one window.
std::vector<std::vector<int64_t>> expert_loads(const Transformer& teacher,
                                               const std::vector<int32_t>& tokens, int64_t batches,
                                               int64_t batch, uint64_t seed,
                                               const std::string& source = "");

// The plan for `spec`. popular: the E most routed experts of each kept layer by `loads` (ties to
// the lower index), listed in index order; first: experts 0..E-1. `loads` is needed only for
// popular (then one entry per teacher layer).
StudentPlan plan_student(const ModelConfig& teacher, const StudentSpec& spec,
                         const std::vector<std::vector<int64_t>>& loads = {});

// The teacher's config with the plan's layers and expert counts (experts_per_layer per layer).
ModelConfig student_config(const ModelConfig& teacher, const StudentPlan& plan);

// Student parameters cut from the teacher's: "blocks.i.*" from "blocks.<plan.layers[i]>.*" (the
// expert tensors' and the router's rows of the kept experts only), everything else as is. The
// result matches a Transformer of student_config() name by name, shape and dtype.
std::vector<io::NamedTensor> student_params(const ParamSet& teacher,
                                            const ModelConfig& teacher_config,
                                            const StudentPlan& plan);

// The plan and KD settings as JSON (recorded in the student's checkpoints under "distill").
nlohmann::json to_json(const StudentPlan& plan);
// One line per student layer for people: "layer 0 <- teacher 1: experts 0,2 of 4 (71% of ...)".
std::vector<std::string> describe(const StudentPlan& plan, const ModelConfig& teacher);

struct DistillConfig {
  std::string teacher;  // checkpoint file
  StudentSpec student;
  double alpha = 0.5;         // CE weight while the KD term is at full weight, in [0, 1]
  double temperature = 1.0;   // T > 0
  int64_t kd_stop_step = -1;  // the KD weight is zero from this step on; -1: 3/4 of the steps
  KdSchedule kd_schedule = KdSchedule::linear;
  int64_t selection_batches = 8;  // teacher batches measuring expert popularity
};

// KD weight of the step that starts after `step` completed steps (see the top of this file):
// linear (1 - alpha) * max(0, 1 - step / stop), step (1 - alpha) while step < stop; 0 when
// stop == 0.
double kd_weight_at(int64_t step, double alpha, int64_t stop, KdSchedule schedule);

struct DistillStep {
  StepStats train;        // train.forward.loss = ce_weight * ce + kd_weight * kd
  double ce = 0, kd = 0;  // kd is NaN once the KD weight is zero (the teacher is not run)
  double kd_weight = 0, ce_weight = 1;
};

class Distiller {
 public:
  // Loads the teacher (Error naming a missing or damaged file), checks that the data fits its
  // vocabulary, plans the student (measuring expert popularity on the training part of the data
  // when the rule is popular), and sets up a single-process Trainer (train.data, .val, .batch,
  // .steps, .lr, ... as for moe-train; the model is the student) initialised from the teacher.
  Distiller(const DistillConfig& distill, const TrainConfig& train, io::Provenance provenance);
  ~Distiller();

  // Moves the teacher and the student (with its optimizer) to `device`; call before step().
  void to_device(Device device);

  DistillStep step();
  double evaluate() { return trainer_->evaluate(); }  // student validation cross-entropy
  double evaluate_teacher();                          // the teacher's, same batches
  std::string save(const std::string& dir) const { return trainer_->save(dir); }

  const DistillConfig& config() const { return config_; }  // kd_stop_step resolved
  const StudentPlan& plan() const { return plan_; }
  const ModelConfig& teacher_config() const { return teacher_.config; }
  const Transformer& teacher() const { return *teacher_.model; }
  const ModelConfig& student_config() const { return trainer_->model_config(); }
  Trainer& trainer() { return *trainer_; }
  const Trainer& trainer() const { return *trainer_; }

 private:
  DistillConfig config_;
  infer::LoadedModel teacher_;
  StudentPlan plan_;
  std::unique_ptr<Trainer> trainer_;
  // The loss of the current step (set by the logits-loss callback).
  double step_ce_ = 0, step_kd_ = 0;
};

}  // namespace moe::train
