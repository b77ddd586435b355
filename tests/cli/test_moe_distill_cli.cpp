// moe-distill as a user runs it: a teacher from moe-train, a smaller student, the metrics, the
// record of what was kept, the output read by moe-infer, and the refusals with their exit codes.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moe/io/checkpoint.h"
#include "moe/io/dataset.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

// A 4-layer teacher (all MoE, 4 experts) trained briefly by moe-train on the real corpus.
struct Teacher {
  test::ScratchDir dir{"cli-distill"};
  std::string data = test::fortunes_path("linux");
  std::string ckpt = dir / "teacher/last.h5";
  Teacher() {
    auto r = run_command(tool("moe-train", "--data " + data + " --out " + dir / "teacher" +
                                               " --layers 4 --d-model 16 --heads 2 --d-ff 32"
                                               " --seq 16 --experts 4 --moe-every 1 --batch 8"
                                               " --steps 30 --eval-every 0 --threads 2 -q"));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  std::string distill(const std::string& args, const std::string& on = "") const {
    return tool("moe-distill", "--teacher " + ckpt + " --data " + (on.empty() ? data : on) +
                                   " --batch 4 --eval-batches 2 --threads 2 " + args);
  }
};

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) lines.push_back(nlohmann::json::parse(text.substr(start, end - start)));
    start = end + 1;
  }
  return lines;
}

}  // namespace

TEST_CASE("cli: moe-distill --help documents its flags, --version answers", "[cli][distill]") {
  auto r = run_command(tool("moe-distill", "--help"));
  REQUIRE(r.exit_code == 0);
  for (const char* flag : {"--teacher",
                           "--data",
                           "--out",
                           "--student-layers",
                           "--student-experts",
                           "--keep-layers",
                           "--expert-selection",
                           "--kd-alpha",
                           "--kd-temperature",
                           "--kd-stop-step",
                           "--kd-schedule",
                           "--steps",
                           "--batch",
                           "--lr",
                           "--metrics",
                           "--baseline",
                           "--summary",
                           "--threads",
                           "--seed",
                           "--config",
                           "--verbose",
                           "--quiet",
                           "--version"}) {
    INFO(flag);
    REQUIRE(r.out.find(flag) != std::string::npos);
  }
  auto v = run_command(tool("moe-distill", "--version"));
  REQUIRE(v.exit_code == 0);
  REQUIRE(v.out.find("moe-distill 0.") != std::string::npos);
}

TEST_CASE("cli: moe-distill makes a smaller student that moe-infer scores", "[cli][distill]") {
  Teacher t;
  const std::string out = t.dir / "student";
  auto r = run_command(t.distill("-o " + out +
                                 " --student-layers 2 --student-experts 3,2 --steps 6"
                                 " --kd-stop-step 4 --log-every 2 --eval-every 6 --metrics - "
                                 "--baseline --summary " +
                                 t.dir / "summary.json"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // What was kept is said on stderr ...
  REQUIRE(r.err.find("student layers: teacher layers 1,3 of 0..3") != std::string::npos);
  REQUIRE(r.err.find("student layer 0 <- teacher layer 1: experts ") != std::string::npos);
  REQUIRE(r.err.find("of 4 (most routed") != std::string::npos);
  REQUIRE(r.err.find("the same student from scratch") != std::string::npos);
  // ... and recorded in the checkpoint, a normal one.
  REQUIRE(std::filesystem::read_symlink(out + "/last.h5") == "step-00000006.h5");
  io::Checkpoint c = io::load_checkpoint(out + "/last.h5");
  REQUIRE(c.provenance.tool == "moe-distill");
  REQUIRE(c.provenance.argv.find("--student-layers 2") != std::string::npos);
  REQUIRE(c.model_config["layers"] == 2);
  REQUIRE(c.model_config["experts_per_layer"] == nlohmann::json({3, 2}));
  const nlohmann::json& plan = c.train_config.at("distill");
  REQUIRE(plan["kept_layers"] == nlohmann::json({1, 3}));
  REQUIRE(plan["kept_experts"][0].size() == 3);
  REQUIRE(plan["kept_experts"][1].size() == 2);
  REQUIRE(plan["expert_rule"] == "popular");
  REQUIRE(plan["kd_stop_step"] == 4);
  // Metrics: KD while its weight is positive, plain CE after --kd-stop-step.
  std::vector<nlohmann::json> lines = json_lines(r.out);
  REQUIRE(lines.size() == 3);  // steps 2, 4, 6
  for (const char* key : {"step", "loss", "ce", "kd", "kd_weight", "lr", "aux_loss", "z_loss"})
    REQUIRE(lines[0].contains(key));
  REQUIRE(lines[0]["kd_weight"].get<double>() == Approx(0.5 * (1 - 1.0 / 4)));  // step 2 = after 1
  REQUIRE(lines[0]["kd"].is_number());
  REQUIRE(lines[2]["kd_weight"] == 0.0);
  REQUIRE(lines[2]["kd"].is_null());
  REQUIRE(lines[2]["loss"] == lines[2]["ce"]);
  REQUIRE(lines[2].contains("val_loss"));
  REQUIRE(!lines[0].contains("val_loss"));
  nlohmann::json summary = nlohmann::json::parse(test::read_file(t.dir / "summary.json"));
  REQUIRE(summary["student_params"].get<int64_t>() < summary["teacher_params"].get<int64_t>());
  REQUIRE(summary["student_active_params"].get<int64_t>() <
          summary["teacher_active_params"].get<int64_t>());
  REQUIRE(summary["baseline_val_loss"].is_number());
  REQUIRE(summary["student_val_loss"] == lines[2]["val_loss"]);

  // moe-infer reads the student like any checkpoint.
  auto s = run_command(tool("moe-infer", "score --model " + out + "/last.h5 --data " + t.data +
                                             " --batch 4 --threads 2"));
  INFO(s.err);
  REQUIRE(s.exit_code == 0);
  REQUIRE(s.out.find("nll_mean") != std::string::npos);
}

TEST_CASE("cli: moe-distill refuses a missing teacher, a bigger student, bad KD settings",
          "[cli][distill]") {
  Teacher t;
  const std::string out = " -o " + t.dir / "out";
  struct Case {
    std::string args;
    int code;
    std::string message;
    std::string data = "";
  };
  // Tokens beyond the teacher's byte vocabulary.
  std::vector<int32_t> ids(400);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 300);
  io::save_tokens(t.dir / "wide.u16", ids);
  for (const Case& c : std::vector<Case>{
           {"--student-layers 5", 2, "--student-layers 5 is more than the teacher's 4 layers"},
           {"--student-experts 6", 2, "is more than the 4 experts of teacher layer"},
           {"--student-experts 2,2,2", 2, "--student-experts has 3 values"},
           {"--kd-alpha 1.5", 2, "--kd-alpha must be in [0, 1]"},
           {"--kd-temperature 0", 2, "--kd-temperature must be > 0"},
           {"--kd-schedule cosine", 2, "--kd-schedule"},
           {"--keep-layers 3,1", 2, "strictly increasing"},
           {"--steps 2", 1, "vocabulary of 256", t.dir / "wide.u16"}}) {
    INFO(c.args);
    auto r = run_command(t.distill(c.args + out, c.data));
    INFO(r.err);
    REQUIRE(r.exit_code == c.code);
    REQUIRE(r.err.find("moe-distill: error: ") != std::string::npos);
    REQUIRE(r.err.find(c.message) != std::string::npos);
  }
  auto missing = run_command(
      tool("moe-distill", "--teacher " + t.dir / "nope.h5" + " --data " + t.data + out));
  REQUIRE(missing.exit_code == 1);
  REQUIRE(missing.err.find("moe-distill: error: teacher checkpoint '" + t.dir / "nope.h5" +
                           "' does not exist") != std::string::npos);
  auto no_teacher = run_command(tool("moe-distill", "--data " + t.data + out));
  REQUIRE(no_teacher.exit_code == 2);
  REQUIRE(no_teacher.err.find("--teacher") != std::string::npos);
}

TEST_CASE("cli: moe-distill into a directory holding another run's checkpoints needs --force",
          "[cli][distill][out]") {
  Teacher t;
  // The teacher's own run directory: distilling into it would move its last.h5.
  const std::string teacher_dir = t.dir / "teacher";
  auto r = run_command(t.distill("-q --student-layers 2 --steps 2 -o " + teacher_dir));
  INFO(r.err);
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("moe-distill: error: output directory '" + teacher_dir +
                     "' holds the checkpoints of another run") != std::string::npos);
  REQUIRE(r.err.find("--force") != std::string::npos);
  REQUIRE(r.err.find("--resume") == std::string::npos);  // moe-distill has none
  REQUIRE(std::filesystem::read_symlink(teacher_dir + "/last.h5") == "step-00000030.h5");
  auto forced = run_command(t.distill("-q --student-layers 2 --steps 2 --force -o " + teacher_dir));
  INFO(forced.err);
  REQUIRE(forced.exit_code == 0);
  REQUIRE(std::filesystem::read_symlink(teacher_dir + "/last.h5") == "step-00000002.h5");
}
