// moe-train as a user runs it: flags, outputs, exit codes, bad input, exact resume.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moe/cuda.h"
#include "moe/io/checkpoint.h"
#include "support/run.h"

using namespace moe;
using test::run_command;

namespace {

const std::string kTiny =
    " --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --experts 4 --moe-every 1 --batch 4"
    " --eval-batches 2 --threads 2";

std::string train(const std::string& args) { return test::tool_path("moe-train") + " " + args; }

}  // namespace

TEST_CASE("cli: moe-train --help documents every flag, --version answers", "[cli]") {
  auto r = run_command(train("--help"));
  REQUIRE(r.exit_code == 0);
  for (const char* flag : {"--data",
                           "--val",
                           "--out",
                           "--resume",
                           "--arch",
                           "--layers",
                           "--d-model",
                           "--heads",
                           "--kv-heads",
                           "--d-ff",
                           "--seq",
                           "--experts",
                           "--experts-per-layer",
                           "--moe-every",
                           "--top-k",
                           "--capacity-factor",
                           "--aux-loss-coef",
                           "--z-loss-coef",
                           "--residual-moe",
                           "--batch",
                           "--steps",
                           "--lr",
                           "--warmup",
                           "--weight-decay",
                           "--clip",
                           "--grad-accum",
                           "--recompute",
                           "--dtype",
                           "--checkpoint-every",
                           "--eval-every",
                           "--metrics",
                           "--breakdown-sync",
                           "--threads",
                           "--seed",
                           "--config",
                           "--ep",
                           "--shard-embedding",
                           "--a2a",
                           "--ranks-per-node",
                           "--comm-scheduler",
                           "--partition-mb",
                           "--verbose",
                           "--quiet",
                           "--version"}) {
    INFO(flag);
    REQUIRE(r.out.find(flag) != std::string::npos);
  }
  auto v = run_command(train("--version"));
  REQUIRE(v.exit_code == 0);
  REQUIRE(v.out.find("moe-train 0.") != std::string::npos);
}

TEST_CASE("cli: moe-train with only --data and --out trains the default model", "[cli]") {
  test::ScratchDir dir("cli-default");
  // The embedded default with a short run: nothing but the two required flags and a step count.
  auto r = run_command(
      train("--data " + test::fortunes_path("linux") + " --out " + dir.path() + " --steps 2"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(std::filesystem::exists(dir / "step-00000002.h5"));
  REQUIRE(std::filesystem::read_symlink(dir / "last.h5") == "step-00000002.h5");
  REQUIRE(r.err.find("step 2/2") != std::string::npos);
  REQUIRE(r.err.find("load max/mean") != std::string::npos);
  REQUIRE(r.err.find("tok/s") != std::string::npos);
  REQUIRE(r.err.find("val ") != std::string::npos);
  io::Checkpoint c = io::load_checkpoint(dir / "last.h5");
  REQUIRE(c.model_config["arch"] == "gpt");
  REQUIRE(c.provenance.tool == "moe-train");
  REQUIRE(c.provenance.argv.find("--steps 2") != std::string::npos);
}

TEST_CASE("cli: --metrics writes JSON lines with the contract's keys", "[cli]") {
  test::ScratchDir dir("cli-metrics");
  auto r =
      run_command(train("--data " + test::fortunes_path("linux") + " --out " + dir.path() + kTiny +
                        " --steps 4 --log-every 2 --eval-every 4 --capacity-factor 1 --metrics -"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::vector<nlohmann::json> lines;
  size_t start = 0;
  while (start < r.out.size()) {
    size_t end = r.out.find('\n', start);
    lines.push_back(nlohmann::json::parse(r.out.substr(start, end - start)));
    start = end + 1;
  }
  REQUIRE(lines.size() == 2);  // steps 2 and 4
  for (const char* key : {"step", "loss", "lr", "tokens_per_s", "aux_loss", "z_loss",
                          "expert_load_max_over_mean", "dropped_fraction"})
    REQUIRE(lines[0].contains(key));
  REQUIRE(lines[0]["expert_load_max_over_mean"].size() == 2);
  REQUIRE(!lines[0].contains("val_loss"));
  REQUIRE(lines[1].contains("val_loss"));
  REQUIRE(lines[1]["step"] == 4);
}

TEST_CASE("cli: -v prints where the steps' time goes, and --metrics gets it per step", "[cli]") {
  test::ScratchDir dir("cli-breakdown");
  const std::string base = "--data " + test::fortunes_path("linux") + kTiny + " --steps 4" +
                           " --log-every 2 --eval-every 0 --metrics - --out ";
  auto plain = run_command(train(base + (dir / "plain")));
  INFO(plain.err);
  REQUIRE(plain.exit_code == 0);
  CHECK(plain.err.find("time per step") == std::string::npos);
  CHECK(plain.out.find("step_breakdown") == std::string::npos);
  auto r = run_command(train(base + (dir / "loud") + " -v"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // Lines at steps 1, 2 and 4: the step since the first line, then 2 steps each.
  CHECK(r.err.find("time per step (1 step): ") != std::string::npos);
  CHECK(r.err.find("time per step (2 steps): ") != std::string::npos);
  CHECK(r.err.find("gemm ") != std::string::npos);
  nlohmann::json last =
      nlohmann::json::parse(r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1));
  REQUIRE(last.contains("step_breakdown"));
  double sum = 0;
  for (const char* part : {"gemm", "attention", "elementwise", "router", "dispatch", "loss",
                           "optimizer", "memory", "comm", "other"}) {
    INFO(part);
    REQUIRE(last["step_breakdown"].contains(part));
    sum += last["step_breakdown"][part].get<double>();
  }
  CHECK(last["step_breakdown"]["gemm"].get<double>() > 0);
  CHECK(sum > 0);
  CHECK(sum <= 1.0 / last["tokens_per_s"].get<double>() * 4 * 16 * 1.01);  // the step's seconds
}

TEST_CASE("cli: --breakdown-sync needs -v and a GPU", "[cli]") {
  test::ScratchDir dir("cli-breakdown-sync");
  const std::string base =
      "--data " + test::fortunes_path("linux") + kTiny + " --steps 1 --out " + dir.path();
  auto quiet = run_command(train(base + " --breakdown-sync --device cuda"));
  CHECK(quiet.exit_code == 2);
  CHECK(quiet.err.find("--breakdown-sync times the step breakdown that -v prints") !=
        std::string::npos);
  auto cpu = run_command(train(base + " -v --breakdown-sync"));
  CHECK(cpu.exit_code == 2);
  CHECK(cpu.err.find("--breakdown-sync applies to --device cuda") != std::string::npos);
  CHECK(!std::filesystem::exists(dir / "last.h5"));  // refused before any work
}

TEST_CASE("cli: resuming from a checkpoint continues exactly", "[cli]") {
  test::ScratchDir a("cli-resume-a"), b("cli-resume-b");
  std::string data = " --data " + test::fortunes_path("linux");
  auto r1 = run_command(train(data + " --out " + a.path() + kTiny +
                              " --steps 6 --checkpoint-every 3 --arch mixtral --kv-heads 1"));
  REQUIRE(r1.exit_code == 0);
  // Model flags come from the checkpoint; the data path too.
  auto r2 = run_command(train("--resume " + a / "step-00000003.h5" + " --out " + b.path() +
                              " --steps 6 --threads 2"));
  INFO(r2.err);
  REQUIRE(r2.exit_code == 0);
  io::Checkpoint x = io::load_checkpoint(a / "step-00000006.h5");
  io::Checkpoint y = io::load_checkpoint(b / "step-00000006.h5");
  REQUIRE(x.params.size() == y.params.size());
  for (size_t i = 0; i < x.params.size(); ++i)
    REQUIRE(std::memcmp(x.params[i].tensor.raw(), y.params[i].tensor.raw(),
                        x.params[i].tensor.nbytes()) == 0);
  for (size_t i = 0; i < x.optim.size(); ++i)
    REQUIRE(std::memcmp(x.optim[i].tensor.raw(), y.optim[i].tensor.raw(),
                        x.optim[i].tensor.nbytes()) == 0);
  // A model flag contradicting the checkpoint is a usage error.
  auto r3 = run_command(
      train("--resume " + a / "step-00000003.h5" + " --out " + b.path() + " --d-model 32"));
  REQUIRE(r3.exit_code == 2);
  REQUIRE(r3.err.find("moe-train: error: --d-model 32 contradicts the checkpoint") !=
          std::string::npos);
  // Flags whose config key is spelled otherwise (--router: router_scoring) or written only when
  // set (--sliding-window, --tie-embeddings) are checked too, not silently dropped.
  struct Contradiction {
    std::string flags, message;
  };
  for (const Contradiction& c :
       {Contradiction{" --router sigmoid",
                      "--router \"sigmoid\" contradicts the checkpoint's \"softmax\""},
        Contradiction{" --sliding-window 4", "--sliding-window 4 contradicts the checkpoint's off"},
        Contradiction{" --tie-embeddings",
                      "--tie-embeddings true contradicts the checkpoint's off"}}) {
    auto r =
        run_command(train("--resume " + a / "step-00000003.h5" + " --out " + b.path() + c.flags));
    INFO(c.flags << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(c.message) != std::string::npos);
  }
}

TEST_CASE("cli: bad input gives a clear error and exit code 1 or 2", "[cli]") {
  test::ScratchDir dir("cli-bad");
  std::string out = " --out " + dir / "run";
  std::string data = " --data " + test::fortunes_path("linux");
  test::write_file(dir / "empty.txt", "");

  struct Case {
    std::string args;
    int code;
    std::string message;
  };
  std::vector<Case> cases = {
      {"--data " + dir / "missing.txt" + out, 1, "missing.txt"},
      {"--data " + dir / "empty.txt" + out, 1, "empty.txt"},
      {data + out + " --top-k 5 --experts 4", 2, "--top-k 5 is larger than the 4 experts"},
      {data + out + " --heads 3 --d-model 16", 2, "--heads 3 does not divide --d-model 16"},
      {data + out + " --kv-heads 3 --heads 4 --arch mixtral", 2,
       "--kv-heads 3 does not divide --heads 4"},
      {data + out + " --experts-per-layer 4,4,4", 2, "--experts-per-layer has 3 entries"},
      {data + out + " --dtype f64", 2, "--dtype"},
      {data, 2, "--out"},
      {out, 2, "--data is required"},
      {data + out + " --no-such-flag", 2, "no-such-flag"},
      {data + out + " --resume " + dir / "missing.h5", 1, "missing.h5"},
      {data + " --out " + dir / "empty.txt", 1, "output directory"},
      // Distributed flags in one process: the layout cannot be made, and the tied head cannot be
      // sharded whatever the world size.
      {data + out + " --ep 2", 2, "--ep 2 does not divide the 1 ranks"},
      {data + out + " --shard-embedding", 2, "--shard-embedding needs an untied LM head"},
      {data + out + " --comm-scheduler fifo", 2, "--comm-scheduler"},
      {data + out + " --a2a ring", 2, "--a2a"},
      {data + out + " --partition-mb 0", 2, "--partition-mb must be > 0"},
      {data + out + " --grad-accum 3", 2, "--batch 16 does not split into --grad-accum 3"},
      {data + out + " --grad-accum 0", 2, "--grad-accum"},
      {data + out + " --recompute layers", 2, "--recompute"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    auto r = run_command(train(c.args));
    INFO(r.err);
    REQUIRE(r.exit_code == c.code);
    REQUIRE(r.err.find("moe-train: error: ") != std::string::npos);
    REQUIRE(r.err.find(c.message) != std::string::npos);
    REQUIRE(r.err.find("terminate") == std::string::npos);
  }
}

TEST_CASE("cli: a damaged or foreign checkpoint is refused and the previous one stays intact",
          "[cli]") {
  test::ScratchDir dir("cli-damaged");
  std::string data = " --data " + test::fortunes_path("linux");
  auto r = run_command(train(data + " --out " + dir.path() + kTiny + " --steps 2"));
  REQUIRE(r.exit_code == 0);
  std::string good = test::read_file(dir / "step-00000002.h5");

  test::write_file(dir / "truncated.h5", good.substr(0, good.size() / 2));
  test::write_file(dir / "notes.h5", "this is not a checkpoint\n");
  for (const char* bad : {"truncated.h5", "notes.h5"}) {
    INFO(bad);
    auto e = run_command(train("--resume " + dir / bad + " --out " + dir.path() + " --steps 4"));
    REQUIRE(e.exit_code == 1);
    REQUIRE(e.err.find("moe-train: error: ") != std::string::npos);
    REQUIRE(e.err.find(bad) != std::string::npos);
  }
  // A run that fails (here: a flag contradicting the checkpoint) leaves the output untouched.
  auto e = run_command(
      train("--resume " + dir / "last.h5" + " --out " + dir.path() + " --steps 4 --layers 3"));
  REQUIRE(e.exit_code == 2);
  REQUIRE(test::read_file(dir / "step-00000002.h5") == good);
  REQUIRE(std::filesystem::read_symlink(dir / "last.h5") == "step-00000002.h5");
}

TEST_CASE("cli: --config reads flags from a file, and flags on the command line win", "[cli]") {
  test::ScratchDir dir("cli-config");
  test::write_file(dir / "train.toml",
                   "data = \"" + test::fortunes_path("linux") +
                       "\"\n"
                       "layers = 2\nd-model = 16\nheads = 2\nd-ff = 32\nseq = 16\nexperts = 4\n"
                       "top-k = 1\nbatch = 4\nsteps = 3\neval-batches = 1\narch = \"mixtral\"\n");
  auto r =
      run_command(train("--config " + dir / "train.toml" + " --out " + dir / "run" + " --steps 2"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  io::Checkpoint c = io::load_checkpoint(dir / "run/last.h5");
  REQUIRE(c.state.step == 2);
  REQUIRE(c.model_config["arch"] == "mixtral");
  REQUIRE(c.model_config["d_model"] == 16);
  REQUIRE(c.model_config["top_k"] == 1);
  test::write_file(dir / "bad.toml", "no-such-option = 3\n");
  auto e = run_command(train("--config " + dir / "bad.toml" + " --out " + dir / "run"));
  REQUIRE(e.exit_code == 2);
  REQUIRE(e.err.find("moe-train: error: ") != std::string::npos);
}

TEST_CASE("cli: SIGTERM stops at a step boundary, saves, and the run resumes from there", "[cli]") {
  test::ScratchDir dir("cli-signal");
  std::string data = " --data " + test::fortunes_path("linux");
  // Start a long run in the background, wait for its first metrics line, then signal it.
  std::string cmd = train(data + " --out " + dir.path() + kTiny + " --steps 100000 --log-every 1" +
                          " --eval-every 0 --metrics " + dir / "m.jsonl") +
                    " 2>" + dir / "err.txt" + " & pid=$!; for i in $(seq 200); do" + " [ -s " +
                    dir / "m.jsonl" + " ] && break; sleep 0.05; done;" +
                    " kill -TERM $pid; wait $pid; echo $?";
  auto r = run_command(cmd);
  INFO(test::read_file(dir / "err.txt"));
  REQUIRE(r.out == "143\n");  // 128 + SIGTERM
  REQUIRE(test::read_file(dir / "err.txt").find("stopped by signal 15") != std::string::npos);
  io::Checkpoint c = io::load_checkpoint(dir / "last.h5");
  REQUIRE(c.state.step >= 1);
  REQUIRE(c.state.step < 100000);
  auto resumed = run_command(train("--resume " + dir / "last.h5" + " --out " + dir.path() +
                                   " --steps " + std::to_string(c.state.step + 1)));
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE(io::load_checkpoint(dir / "last.h5").state.step == c.state.step + 1);
}

TEST_CASE("cli: --device cuda without a usable GPU stops at once with the reason", "[cli]") {
  if (cuda::available()) {
    std::cout << "[cuda] skipped: a GPU is usable here; tests/cuda covers --device cuda\n";
    return;
  }
  test::ScratchDir out("cli-device");
  const std::string data = test::fortunes_path("linux");
  auto r = run_command(
      train("--data " + data + " --out " + out.path() + kTiny + " --steps 2 --device cuda"));
  REQUIRE(r.exit_code == 1);
  REQUIRE(r.err.find("moe-train: error: --device cuda: ") != std::string::npos);
  REQUIRE(r.err.find(cuda::unavailable_reason()) != std::string::npos);
  REQUIRE(!std::filesystem::exists(out / "last.h5"));
  auto bad = run_command(train("--data " + data + " --out " + out.path() + " --device tpu"));
  REQUIRE(bad.exit_code == 2);
  REQUIRE(bad.err.find("unknown device 'tpu'") != std::string::npos);

  // The other tools check the device before they read anything: the model and teacher named here
  // do not exist, and the error is still the device's.
  const std::string missing = out / "no-such-model.h5";
  const std::pair<std::string, std::string> tools[] = {
      {"moe-infer", "score --model " + missing + " --data " + data},
      {"moe-infer", "generate --model " + missing + " --prompts " + data},
      {"moe-profile",
       "record --model " + missing + " --data " + data + " -o " + (out / "trace.h5")},
      {"moe-distill", "--teacher " + missing + " --data " + data + " --out " + out.path()},
  };
  for (const auto& [name, args] : tools) {
    for (const std::string device : {"cuda", "cuda:1"}) {
      INFO(name << " " << args << " --device " << device);
      auto t = run_command(test::tool_path(name) + " " + args + " --device " + device);
      INFO(t.err);
      REQUIRE(t.exit_code == 1);
      REQUIRE(t.err.find(name + ": error: --device " + device + ": ") != std::string::npos);
      REQUIRE(t.err.find(cuda::unavailable_reason()) != std::string::npos);
    }
    auto unknown = run_command(test::tool_path(name) + " " + args + " --device gpu");
    INFO(unknown.err);
    REQUIRE(unknown.exit_code == 2);
    REQUIRE(unknown.err.find("unknown device 'gpu'") != std::string::npos);
  }
  REQUIRE(!std::filesystem::exists(out / "trace.h5"));
}

TEST_CASE("cli: --out holding another run's checkpoints is refused, resuming it or --force is not",
          "[cli][out]") {
  namespace fs = std::filesystem;
  test::ScratchDir dir("cli-two-runs");
  const std::string data = " --data " + test::fortunes_path("linux");
  auto first = run_command(train(data + " --out " + dir / "run" + kTiny + " --steps 2 -q"));
  REQUIRE(first.exit_code == 0);
  const std::string good = test::read_file(dir / "run/step-00000002.h5");
  auto unchanged = [&] {
    REQUIRE(test::read_file(dir / "run/step-00000002.h5") == good);
    REQUIRE(fs::read_symlink(dir / "run/last.h5") == "step-00000002.h5");
    REQUIRE_FALSE(fs::exists(dir / "run/step-00000003.h5"));
  };
  // A second, different run started in the same directory.
  auto other = run_command(
      train(data + " --out " + dir / "run" + kTiny + " --steps 3 --arch mixtral --kv-heads 1"));
  INFO(other.err);
  REQUIRE(other.exit_code == 1);
  REQUIRE(other.err.rfind("moe-train: error: output directory", 0) == 0);
  REQUIRE(other.err.find("holds the checkpoints of another run") != std::string::npos);
  REQUIRE(other.err.find("--resume " + dir / "run/last.h5") != std::string::npos);
  REQUIRE(other.err.find("--force") != std::string::npos);
  unchanged();
  // A run resumed from a checkpoint elsewhere is another run too.
  auto elsewhere = run_command(train(data + " --out " + dir / "b" + kTiny + " --steps 1 -q"));
  REQUIRE(elsewhere.exit_code == 0);
  auto mixed = run_command(
      train("--resume " + dir / "b/last.h5" + " --out " + dir / "run" + " --steps 3 -q"));
  REQUIRE(mixed.exit_code == 1);
  REQUIRE(mixed.err.find("holds the checkpoints of another run") != std::string::npos);
  unchanged();
  // Resuming the run in its own directory continues it; --force writes beside another run.
  auto resumed = run_command(
      train("--resume " + dir / "run/last.h5" + " --out " + dir / "run" + " --steps 3 -q"));
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE(fs::read_symlink(dir / "run/last.h5") == "step-00000003.h5");
  auto forced = run_command(train(data + " --out " + dir / "b" + kTiny + " --steps 2 --force -q"));
  REQUIRE(forced.exit_code == 0);
  REQUIRE(fs::read_symlink(dir / "b/last.h5") == "step-00000002.h5");
}

TEST_CASE("cli: temporary files of interrupted saves are removed on the next run, and said so",
          "[cli][out]") {
  namespace fs = std::filesystem;
  test::ScratchDir dir("cli-stale-temp");
  const std::string data = " --data " + test::fortunes_path("linux");
  auto first = run_command(train(data + " --out " + dir.path() + kTiny + " --steps 1 -q"));
  REQUIRE(first.exit_code == 0);
  // A PID that is not running (beyond the kernel's pid_max) and one that is (this test's own).
  const std::string stale = dir / "step-00000002.h5.tmp-999999999";
  const std::string stale_link = dir / ".last.h5.tmp-999999998";
  const std::string live = dir / ("step-00000002.h5.tmp-" + std::to_string(::getpid()));
  for (const std::string& p : {stale, stale_link, live}) test::write_file(p, "partial");
  auto resumed =
      run_command(train("--resume " + dir / "last.h5" + " --out " + dir.path() + " --steps 2"));
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE_FALSE(fs::exists(stale));
  REQUIRE_FALSE(fs::exists(stale_link));
  REQUIRE(fs::exists(live));
  REQUIRE(resumed.err.find("removed " + stale + ", left by an interrupted save") !=
          std::string::npos);
  REQUIRE(resumed.err.find(live) == std::string::npos);
}
