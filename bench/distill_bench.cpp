// moe-distill-bench: Mixture-of-Students distillation quality. Trains a teacher from scratch,
// cuts a student out of it (half the layers, half the experts, train::Distiller) and trains that
// student four ways for the same steps on the same batches: staged KD (the KD weight decaying to
// zero at 3/4 of the steps, moe-distill's default), KD at full weight to the end, cross-entropy
// only from the teacher's weights, and cross-entropy only from random weights (the baseline: the
// same student from scratch). Prints validation loss, parameters, active parameters, time. The
// ceiling is the teacher's validation loss, measured in the same run on the same batches; "gap" is
// each row's loss minus it. Not a test: nothing is asserted.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "common/cli.h"
#include "machine.h"
#include "moe/threads.h"
#include "moe/timer.h"
#include "moe/train/distill.h"

using namespace moe;

namespace {

struct Options {
  std::string data = "/usr/share/games/fortunes/computers";
  int64_t layers = 4, d_model = 64, experts = 8, seq = 64, batch = 16;
  int64_t teacher_steps = 600, steps = 300, student_layers = 2, student_experts = 4;
  double teacher_lr = 3e-3, lr = 3e-3, alpha = 0.5, temperature = 1.0;
  int64_t eval_batches = 8;
  int threads = 0;
  uint64_t seed = 1234;
};

struct Row {
  std::string label;
  int64_t layers = 0, experts = 0, params = 0, active = 0, steps = 0;
  double val = NAN, seconds = 0, tokens = 0;
};

void print_row(const Row& r, double ceiling) {
  std::printf("  %-28s %6lld %7lld %9lld %9lld %6lld %9.4f %+8.4f %8.1f %9.0f\n", r.label.c_str(),
              static_cast<long long>(r.layers), static_cast<long long>(r.experts),
              static_cast<long long>(r.params), static_cast<long long>(r.active),
              static_cast<long long>(r.steps), r.val, r.val - ceiling, r.seconds,
              r.seconds > 0 ? r.tokens / r.seconds : 0.0);
  std::fflush(stdout);
}

train::TrainConfig train_config(const Options& o, int64_t steps, double lr) {
  train::TrainConfig t;
  t.data = o.data;
  t.batch = o.batch;
  t.steps = steps;
  t.lr = lr;
  t.warmup = std::max<int64_t>(1, steps / 20);
  t.eval_batches = o.eval_batches;
  t.seed = o.seed;
  return t;
}

int run(const Options& o) {
  if (o.threads > 0) set_num_threads(o.threads);
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("moe-distill-bench-" + std::to_string(getpid()));
  fs::create_directories(dir);

  ModelConfig teacher_model;
  teacher_model.arch = Arch::gpt;
  teacher_model.layers = o.layers;
  teacher_model.d_model = o.d_model;
  teacher_model.heads = 4;
  teacher_model.d_ff = 2 * o.d_model;
  teacher_model.seq = o.seq;
  teacher_model.experts = o.experts;
  teacher_model.moe_every = 1;
  teacher_model.top_k = 2;
  teacher_model.resolve();

  std::printf(
      "# moe-distill-bench: Mixture-of-Students distillation, validation cross-entropy "
      "(nats/byte) after the same steps\n");
  std::printf("# %s, %s, %d threads\n", bench::now_utc().c_str(), bench::cpu_model().c_str(),
              num_threads());
  std::printf(
      "# data: %s (bytes; last 10%% held out), batch %lld x seq %lld, eval on %lld "
      "validation batches, seed %llu\n",
      o.data.c_str(), static_cast<long long>(o.batch), static_cast<long long>(o.seq),
      static_cast<long long>(o.eval_batches), static_cast<unsigned long long>(o.seed));
  std::printf(
      "# teacher: gpt, %lld layers (all MoE), d_model %lld, d_ff %lld, %lld experts "
      "top-2, %lld steps at lr %g\n",
      static_cast<long long>(o.layers), static_cast<long long>(o.d_model),
      static_cast<long long>(teacher_model.d_ff), static_cast<long long>(o.experts),
      static_cast<long long>(o.teacher_steps), o.teacher_lr);
  std::printf(
      "# students: %lld of its layers (evenly spaced, last kept), the %lld most routed "
      "experts per layer; %lld steps at lr %g; KD alpha %g, T %g\n",
      static_cast<long long>(o.student_layers), static_cast<long long>(o.student_experts),
      static_cast<long long>(o.steps), o.lr, o.alpha, o.temperature);
  std::printf(
      "# ceiling = the teacher's validation loss (same batches); gap = loss - ceiling; "
      "seconds and tokens/s of training (KD rows include the teacher's forward);\n# the "
      "\"from scratch\" rows are the baseline: the same student from random weights, plain CE, "
      "the same steps\n#\n");
  std::printf("# %-28s %6s %7s %9s %9s %6s %9s %8s %8s %9s\n", "model", "layers", "experts",
              "params", "active", "steps", "val_loss", "gap", "seconds", "tokens/s");

  Row teacher_row{"teacher", o.layers, o.experts};
  std::string teacher_path;
  {
    train::Trainer t(teacher_model, train_config(o, o.teacher_steps, o.teacher_lr), {});
    Timer timer;
    while (t.steps_done() < o.teacher_steps) teacher_row.tokens += t.step().tokens;
    teacher_row.seconds = timer.seconds();
    teacher_row.val = t.evaluate();
    teacher_row.params = t.model().num_params();
    teacher_row.active = t.model().active_params_per_token();
    teacher_row.steps = o.teacher_steps;
    teacher_path = t.save(dir.string());
  }
  const double ceiling = teacher_row.val;
  print_row(teacher_row, ceiling);

  train::DistillConfig base;
  base.teacher = teacher_path;
  base.student.layers = o.student_layers;
  base.student.experts = {o.student_experts};
  base.alpha = o.alpha;
  base.temperature = o.temperature;
  const train::TrainConfig student_train = train_config(o, o.steps, o.lr);

  auto distilled = [&](const std::string& label, int64_t stop, train::KdSchedule schedule,
                       bool init_row) {
    train::DistillConfig dc = base;
    dc.kd_stop_step = stop;
    dc.kd_schedule = schedule;
    train::Distiller d(dc, student_train, {});
    Row r{label, d.student_config().layers, o.student_experts};
    r.params = d.trainer().model().num_params();
    r.active = d.trainer().model().active_params_per_token();
    if (init_row) {
      Row init = r;
      init.label = "student cut, untrained";
      init.val = d.evaluate();
      print_row(init, ceiling);
    }
    Timer timer;
    while (d.trainer().steps_done() < o.steps) r.tokens += d.step().train.tokens;
    r.seconds = timer.seconds();
    r.steps = o.steps;
    r.val = d.evaluate();
    print_row(r, ceiling);
    return r.val;
  };
  distilled("MoS staged KD (linear, 3/4)", -1, train::KdSchedule::linear, true);
  distilled("KD to the end (step, full)", o.steps, train::KdSchedule::step, false);
  distilled("teacher init, CE only", 0, train::KdSchedule::linear, false);
  // The baseline: the same student shape from random weights (the "first" rule plans the shape;
  // which experts does not matter here), at the students' learning rate and, when it differs, at
  // the teacher's (a from-scratch run may want another one).
  std::vector<double> baseline_lrs{o.lr};
  if (o.teacher_lr != o.lr) baseline_lrs.push_back(o.teacher_lr);
  for (double lr : baseline_lrs) {
    train::StudentSpec spec = base.student;
    spec.expert_rule = train::ExpertRule::first;
    ModelConfig student =
        train::student_config(teacher_model, train::plan_student(teacher_model, spec));
    train::Trainer t(student, train_config(o, o.steps, lr), {});
    char label[64];
    std::snprintf(label, sizeof label, "from scratch, CE, lr %g", lr);
    Row r{label, student.layers, o.student_experts};
    r.params = t.model().num_params();
    r.active = t.model().active_params_per_token();
    Timer timer;
    while (t.steps_done() < o.steps) r.tokens += t.step().tokens;
    r.seconds = timer.seconds();
    r.steps = o.steps;
    r.val = t.evaluate();
    print_row(r, ceiling);
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moe-distill-bench: Mixture-of-Students distillation against the same student "
      "trained from scratch",
      "moe-distill-bench"};
  Options o;
  app.add_option("--data", o.data, "Training text")->capture_default_str();
  app.add_option("--layers", o.layers, "Teacher layers")->capture_default_str();
  app.add_option("--d-model", o.d_model, "Model width")->capture_default_str();
  app.add_option("--experts", o.experts, "Teacher experts per layer")->capture_default_str();
  app.add_option("--seq", o.seq, "Sequence length")->capture_default_str();
  app.add_option("--batch", o.batch, "Sequences per step")->capture_default_str();
  app.add_option("--teacher-steps", o.teacher_steps, "Teacher training steps")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Student training steps (every row)")->capture_default_str();
  app.add_option("--student-layers", o.student_layers, "Student layers")->capture_default_str();
  app.add_option("--student-experts", o.student_experts, "Student experts per layer")
      ->capture_default_str();
  app.add_option("--teacher-lr", o.teacher_lr, "Teacher peak learning rate")->capture_default_str();
  app.add_option("--lr", o.lr, "Student peak learning rate (every row)")->capture_default_str();
  app.add_option("--kd-alpha", o.alpha, "Cross-entropy weight while KD is on")
      ->capture_default_str();
  app.add_option("--kd-temperature", o.temperature, "KD temperature")->capture_default_str();
  app.add_option("--eval-batches", o.eval_batches, "Validation batches")->capture_default_str();
  app.add_option("--threads", o.threads, "Threads (0 = all cores)")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed")->capture_default_str();
  return tools::run_tool("moe-distill-bench", app, argc, argv, [&] { return run(o); });
}
