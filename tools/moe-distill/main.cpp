// moe-distill: Mixture-of-Students distillation of a trained MoE checkpoint into a smaller student
// (fewer layers and/or experts). All the work is libmoe's train::Distiller.
#include <cmath>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "common/named_option.h"
#include "moe/cuda.h"
#include "moe/io/output.h"
#include "moe/log.h"
#include "moe/threads.h"
#include "moe/train/distill.h"
#include "moe/train/run_dir.h"
#include "moe/train/run_loop.h"

using namespace moe;
using nlohmann::json;

namespace {

struct DistillOptions {
  tools::CommonOptions common;
  train::DistillConfig distill;
  train::TrainConfig train;
  std::string out, metrics, summary, device = "cpu";
  int64_t checkpoint_every = 0, eval_every = 50, log_every = 10;
  bool baseline = false;
  bool force = false;  // write into a directory that holds another run's checkpoints
};

void add_options(CLI::App& app, DistillOptions& o) {
  tools::add_common_options(app, o.common, "moe-distill");
  auto& d = o.distill;
  auto& t = o.train;
  t.steps = 300;

  auto* io = app.add_option_group("Teacher, data and output");
  io->add_option(
        "--teacher", d.teacher,
        "Trained teacher: a checkpoint file, or a moe-train output directory (its last.h5)")
      ->required();
  tools::add_device_option(*io, o.device, "where teacher and student run");
  io->add_option("--data", t.data, "Training text (bytes are tokens) or .u16/.u32 token file")
      ->required();
  io->add_option("--val", t.val, "Validation data (default: the held-out tail of --data)");
  io->add_option_function<std::string>(
        "--data-format",
        [&t](const std::string& name) { t.data_format = io::parse_token_format(name); },
        "auto (by extension), text, u16 or u32")
      ->check(CLI::IsMember({"auto", "text", "u16", "u32"}))
      ->default_str(io::token_format_name(t.data_format));
  io->add_option("--val-fraction", t.val_fraction, "Held-out tail of --data when no --val")
      ->capture_default_str();
  io->add_option("-o,--out", o.out,
                 "Output directory, as moe-train's --out: step-<8 digits>.h5 checkpoints of the "
                 "student and last.h5 pointing at the newest")
      ->required();
  io->add_flag("--force", o.force,
               "Write into --out even when it holds the checkpoints of another run, and "
               "replace an existing --metrics or --summary file");
  io->add_option("--checkpoint-every", o.checkpoint_every,
                 "Checkpoint every N steps (0: only at the end)")
      ->check(tools::non_negative())
      ->capture_default_str();
  io->add_option("--eval-every", o.eval_every, "Validation loss every N steps (0: only at the end)")
      ->check(tools::non_negative())
      ->capture_default_str();
  io->add_option("--eval-batches", t.eval_batches, "Validation batches per evaluation")
      ->check(tools::positive())
      ->capture_default_str();
  io->add_option("--metrics", o.metrics,
                 "JSON lines of metrics to PATH ('-' = stdout): step, loss, ce, kd, kd_weight, lr, "
                 "...; val_loss on evaluation lines");
  io->add_option("--log-every", o.log_every, "Progress/metrics line every N steps")
      ->check(tools::positive())
      ->capture_default_str();
  io->add_option("--summary", o.summary,
                 "One JSON object to PATH ('-' = stdout) at the end: validation losses of teacher, "
                 "student (and baseline), parameters, the plan");
  io->add_flag("--baseline", o.baseline,
               "Also train the same student from scratch (random init, plain cross-entropy) for "
               "the same steps and report its validation loss (not saved)");

  auto* sg = app.add_option_group("Student (cut from the teacher)");
  sg->add_option("--student-layers", d.student.layers,
                 "Student layers N <= the teacher's: teacher layers floor((i+1)L/N)-1 are kept "
                 "(evenly spaced, the last always kept); 0 = all")
      ->check(tools::non_negative())
      ->capture_default_str();
  sg->add_option("--keep-layers", d.student.keep_layers,
                 "Explicit teacher layers to keep, strictly increasing (instead of the even rule)")
      ->delimiter(',');
  sg->add_option("--student-experts", d.student.experts,
                 "Experts per student MoE layer: E for all, or E1,E2,.. one per MoE layer (PR-MoE "
                 "pyramid) or one per layer (0 = dense); at most the teacher layer's")
      ->delimiter(',');
  tools::add_named(*sg, "--expert-selection", d.student.expert_rule,
                   "Which experts a layer keeps: popular (the most routed on --selection-batches "
                   "teacher batches of the training data) or first (0..E-1)",
                   {"popular", "first"}, train::parse_expert_rule, train::expert_rule_name);
  sg->add_option("--selection-batches", d.selection_batches,
                 "Teacher batches measuring expert popularity")
      ->check(tools::positive())
      ->capture_default_str();

  auto* kg = app.add_option_group("Knowledge distillation");
  kg->add_option("--kd-alpha", d.alpha,
                 "Cross-entropy weight a: loss = a CE + (1-a) T^2 KL(teacher_T || student_T)")
      ->capture_default_str();
  kg->add_option("--kd-temperature", d.temperature, "Softmax temperature T of the KD term")
      ->capture_default_str();
  kg->add_option("--kd-stop-step", d.kd_stop_step,
                 "Staged KD: the KD weight reaches zero at this step, plain CE after it "
                 "(default: 3/4 of --steps; 0: no KD)");
  tools::add_named(*kg, "--kd-schedule", d.kd_schedule,
                   "How the KD weight (1-a) goes to zero: linear (decays from step 0 to "
                   "--kd-stop-step) or step (full weight, then off at --kd-stop-step)",
                   {"linear", "step"}, train::parse_kd_schedule, train::kd_schedule_name);

  auto* og = app.add_option_group("Optimization");
  og->add_option("--batch", t.batch, "Sequences per step")->capture_default_str();
  og->add_option("--steps", t.steps, "Total optimizer steps (the schedule's length)")
      ->capture_default_str();
  og->add_option("--lr", t.lr,
                 "Peak learning rate (AdamW); default 3e-3 up to the student's d_model 128, then "
                 "3e-3 x 128 / d_model")
      ->check(tools::positive());
  og->add_option("--min-lr-ratio", t.min_lr_ratio, "Cosine decay floor as a fraction of --lr")
      ->capture_default_str();
  og->add_option("--warmup", t.warmup, "Linear warmup steps")->capture_default_str();
  og->add_option("--weight-decay", t.weight_decay, "AdamW decoupled weight decay")
      ->capture_default_str();
  og->add_option("--clip", t.clip, "Clip the global gradient norm to this (0 = off)")
      ->capture_default_str();
}

using tools::fixed;

json number_or_null(double value) { return std::isfinite(value) ? json(value) : json(nullptr); }

int run(DistillOptions& o, int argc, char** argv) {
  tools::apply_common_options(o.common);
  tools::check_one_stdout({{"--metrics", o.metrics}, {"--summary", o.summary}});
  // An existing file only with --force (a distillation never resumes, so never appends).
  io::check_output_stream(o.metrics, o.force);
  io::check_output_stream(o.summary, o.force);
  train::TrainConfig tc = o.train;
  tc.seed = o.common.seed;
  const Device device = tools::resolve_device(o.device);  // before any work
  // One run per directory, as moe-train's (a distillation never resumes: any checkpoint there
  // belongs to another run).
  train::check_run_directory(o.out, "", o.force, /*resumable=*/false);
  for (const std::string& path : io::remove_stale_temporaries(o.out))
    MOE_LOG_WARN("removed ", path, ", left by an interrupted save (its process is gone)");
  train::Distiller distiller(o.distill, tc, io::make_provenance("moe-distill", argc, argv));
  if (device.kind == Device::cuda) {
    distiller.to_device(device);
    MOE_LOG_INFO("device: ", device.str(), " (", cuda::device_name(device.index), ")");
  }
  tools::ensure_output_dir(o.out);  // before training: fail now, not at the first checkpoint
  const train::DistillConfig& dc = distiller.config();
  const ModelConfig& teacher = distiller.teacher_config();
  const ModelConfig& student = distiller.student_config();
  train::Trainer& trainer = distiller.trainer();
  MOE_LOG_INFO("teacher: ", dc.teacher, ": ", arch_name(teacher.arch), ", ", teacher.layers,
               " layers (", teacher.num_moe_layers(), " MoE), ", distiller.teacher().num_params(),
               " parameters (", distiller.teacher().active_params_per_token(),
               " active per token)");
  for (const std::string& line : train::describe(distiller.plan(), teacher)) MOE_LOG_INFO(line);
  MOE_LOG_INFO("student: ", student.layers, " layers (", student.num_moe_layers(), " MoE), ",
               trainer.model().num_params(), " parameters (",
               trainer.model().active_params_per_token(), " active per token)");
  MOE_LOG_INFO("KD: loss = ", dc.alpha, " CE + ", 1 - dc.alpha, " T^2 KL at T = ", dc.temperature,
               ", the KD weight going to 0 at step ", dc.kd_stop_step, " (",
               train::kd_schedule_name(dc.kd_schedule), "), plain CE after; ", tc.steps, " steps, ",
               trainer.train_tokens(), " training tokens, ", num_threads(), " threads");
  const double teacher_val = distiller.evaluate_teacher();
  const double student_init_val = distiller.evaluate();
  MOE_LOG_INFO("validation loss: teacher ", fixed(teacher_val), ", student at init ",
               fixed(student_init_val));

  std::unique_ptr<tools::OutputStream> metrics;
  if (!o.metrics.empty()) metrics = std::make_unique<tools::OutputStream>(o.metrics);
  tools::Progress progress(o.common.quiet);
  train::DistillStep current;  // the step the hooks report
  train::RunLoop::Hooks hooks;
  hooks.stop = [] { return tools::stop_requested(); };
  hooks.step = [&] {
    current = distiller.step();
    return current.train;
  };
  hooks.log = [&](const train::StepReport& r) {
    // moe-train's line (rate, ETA, number formats) with the distillation's own terms.
    std::vector<std::pair<std::string, std::string>> terms = {{"ce", fixed(current.ce)}};
    if (std::isfinite(current.kd)) terms.emplace_back("kd", fixed(current.kd));
    terms.emplace_back("kd weight", fixed(current.kd_weight, 3));
    const std::string text = tools::step_line(r, terms);
    if (r.line)
      progress.line(text);
    else
      progress.live(text);
  };
  if (metrics)
    hooks.metrics = [&](const train::StepReport&, json& j) {
      j["ce"] = current.ce;
      j["kd"] = number_or_null(current.kd);
      j["kd_weight"] = current.kd_weight;
      metrics->write_line(j.dump());
    };
  tools::install_stop_handler();
  // The distiller's checkpoints and validation are its trainer's.
  train::RunLoop loop(trainer, {o.out, o.eval_every, o.checkpoint_every, o.log_every},
                      std::move(hooks));
  const train::RunResult result = loop.run();
  std::string last_saved = result.last_saved;
  const double student_val = result.last_val_loss;
  if (result.stopped) {
    progress.finish();
    if (trainer.steps_done() > 0) {
      last_saved = distiller.save(o.out);
      MOE_LOG_WARN("stopped by signal ", tools::stop_signal(), " at step ", trainer.steps_done(),
                   "; saved ", last_saved);
    }
    if (metrics) metrics->close();
    return 128 + (tools::stop_signal() ? tools::stop_signal() : SIGTERM);
  }
  progress.finish();
  if (metrics) metrics->close();
  MOE_LOG_INFO("validation loss: teacher ", fixed(teacher_val), ", student ", fixed(student_val),
               " (", fixed(student_init_val), " at init)");

  double baseline_val = NAN;
  if (o.baseline) {  // the same student from random weights, plain CE, the same steps and data
    MOE_LOG_INFO("baseline: the same student from scratch for ", tc.steps, " steps");
    train::Trainer scratch(student, tc, io::make_provenance("moe-distill", argc, argv));
    scratch.to_device(device);  // on the distilled student's device, for a fair comparison
    tools::Meter meter(progress, /*line_seconds=*/0);  // lines every --log-every steps
    int64_t tokens = 0;
    while (scratch.steps_done() < tc.steps) {
      train::StepStats s = scratch.step();
      tokens += s.tokens;
      meter.update(str("baseline step ", s.step, "/", tc.steps, " | loss ", fixed(s.forward.loss),
                       " | lr ", tools::format_lr(s.lr)),
                   s.step, tc.steps, tokens, s.step % o.log_every == 0);
    }
    progress.finish();
    baseline_val = scratch.evaluate();
    MOE_LOG_INFO("validation loss: distilled student ", fixed(student_val),
                 ", the same student from scratch ", fixed(baseline_val), ", teacher ",
                 fixed(teacher_val));
  }
  if (!o.summary.empty()) {
    json j{{"teacher", dc.teacher},
           {"output", last_saved},
           {"steps", tc.steps},
           {"teacher_val_loss", teacher_val},
           {"student_init_val_loss", student_init_val},
           {"student_val_loss", student_val},
           {"baseline_val_loss", number_or_null(baseline_val)},
           {"teacher_params", distiller.teacher().num_params()},
           {"teacher_active_params", distiller.teacher().active_params_per_token()},
           {"student_params", trainer.model().num_params()},
           {"student_active_params", trainer.model().active_params_per_token()},
           {"plan", train::to_json(distiller.plan())}};
    tools::OutputStream out(o.summary);
    out.write_line(j.dump());
    out.close();
  }
  return tools::finish_stdout("moe-distill");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "moe-distill: Mixture-of-Students distillation. Cuts a student with fewer layers and/or "
      "experts out of a trained teacher checkpoint and trains it on alpha CE + (1-alpha) T^2 KL "
      "to the teacher, the KD term decaying to zero at --kd-stop-step (staged KD).\n"
      "Writes DIR/step-<8 digits>.h5 checkpoints of the student and keeps DIR/last.h5 pointing "
      "at the newest.",
      "moe-distill"};
  DistillOptions options;
  add_options(app, options);
  return tools::run_tool("moe-distill", app, argc, argv, [&] { return run(options, argc, argv); });
}
