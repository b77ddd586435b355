// [cuda] the tools with --device cuda as a user runs them: moe-train trains, writes the same
// checkpoint format, and the checkpoint resumes on the CPU; moe-infer, moe-profile and moe-distill
// give what they give on the CPU (within fp32 tolerances); mpiexec moe-train trains over NCCL.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moe/cuda.h"
#include "moe/io/checkpoint.h"
#include "moe/io/trace.h"
#include "support/cuda.h"
#include "support/run.h"

using namespace moe;

namespace {

const char* const kTiny =
    " --layers 2 --d-model 32 --heads 2 --d-ff 64 --seq 32 --experts 4 --moe-every 1 --batch 8"
    " --eval-batches 2 --arch mixtral --kv-heads 1";

// A small model trained on the CPU, shared by the tests below (trained once per process).
const std::string& cpu_model() {
  static test::ScratchDir dir("cuda-cli-model");
  static const std::string path = [] {
    auto r =
        test::run_command(test::tool_path("moe-train") + " --data " + test::fortunes_path("linux") +
                          " --out " + dir.path() + kTiny + " --steps 10 --device cpu");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    return dir / "last.h5";
  }();
  return path;
}

std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("cuda: moe-train --device cuda trains and its checkpoint resumes on the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  test::ScratchDir a("cuda-train-a"), b("cuda-train-b");
  const std::string train = test::tool_path("moe-train");
  const std::string tiny = kTiny;
  auto r = test::run_command(train + " --data " + test::fortunes_path("linux") + " --out " +
                             a.path() + tiny + " --steps 20 --device cuda");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  io::Checkpoint c = io::load_checkpoint(a / "last.h5");
  REQUIRE(!c.params.empty());
  auto r2 = test::run_command(train + " --resume " + a / "last.h5" + " --out " + b.path() +
                              " --steps 22 --device cpu");
  INFO(r2.err);
  REQUIRE(r2.exit_code == 0);
  REQUIRE(std::filesystem::exists(b / "step-00000022.h5"));
}

TEST_CASE("cuda: moe-infer score and generate on the GPU match the CPU, with and without the ring",
          "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  const std::string infer = test::tool_path("moe-infer"), model = cpu_model();
  const std::string data = test::fortunes_path("linux");
  const std::string score =
      infer + " score --model " + model + " --data " + data + " --max-sequences 16 --batch 4";
  auto cpu = test::run_command(score + " --device cpu");
  REQUIRE(cpu.exit_code == 0);
  const std::vector<nlohmann::json> want = json_lines(cpu.out);
  REQUIRE(want.size() == 16);
  for (const std::string extra : {"", " --expert-budget 50%"}) {
    INFO("extra flags:" << extra);
    auto gpu = test::run_command(score + " --device cuda" + extra);
    INFO(gpu.err);
    REQUIRE(gpu.exit_code == 0);
    const std::vector<nlohmann::json> got = json_lines(gpu.out);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i]["nll_mean"].get<double>() ==
            Approx(want[i]["nll_mean"].get<double>()).epsilon(1e-4));
  }
  test::ScratchDir dir("cuda-cli-generate");
  test::write_file(dir / "prompts.txt", "The kernel\nA penguin\n");
  const std::string generate =
      infer + " generate --model " + model + " --prompts " + (dir / "prompts.txt") + " --max-new 8";
  auto a = test::run_command(generate + " --device cpu"),
       b = test::run_command(generate + " --device cuda");
  INFO(b.err);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  const std::vector<nlohmann::json> ga = json_lines(a.out), gb = json_lines(b.out);
  REQUIRE(ga.size() == 2);
  REQUIRE(gb.size() == 2);
  // Greedy: the same tokens unless two logits are within fp32 noise of each other, which the
  // first new token of these prompts is not.
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(gb[i]["tokens"] == ga[i]["tokens"]);
    CHECK(gb[i]["completion_ids"][0] == ga[i]["completion_ids"][0]);
  }
}

TEST_CASE("cuda: moe-profile record on the GPU traces what the CPU traces", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  test::ScratchDir dir("cuda-cli-profile");
  const std::string record = test::tool_path("moe-profile") + " record --model " + cpu_model() +
                             " --data " + test::fortunes_path("linux") + " --max-tokens 512";
  auto a = test::run_command(record + " -o " + (dir / "cpu.h5") + " --device cpu");
  auto b = test::run_command(record + " -o " + (dir / "gpu.h5") + " --device cuda");
  INFO(b.err);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  io::TraceReader ta(dir / "cpu.h5"), tb(dir / "gpu.h5");
  REQUIRE(tb.tokens() == ta.tokens());
  REQUIRE(tb.batch_tokens() == ta.batch_tokens());
}

TEST_CASE("cuda: moe-distill --device cuda distils a student the CPU can score", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  test::ScratchDir dir("cuda-cli-distill");
  auto r = test::run_command(test::tool_path("moe-distill") + " --teacher " + cpu_model() +
                             " --data " + test::fortunes_path("linux") + " --out " + dir.path() +
                             " --student-layers 1 --steps 6 --batch 8 --baseline --device cuda");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.err.find("the same student from scratch") != std::string::npos);  // --baseline ran
  auto s = test::run_command(test::tool_path("moe-infer") + " score --model " + (dir / "last.h5") +
                             " --data " + test::fortunes_path("linux") + " --max-sequences 4");
  INFO(s.err);
  REQUIRE(s.exit_code == 0);
  for (const nlohmann::json& j : json_lines(s.out))
    REQUIRE(std::isfinite(j["nll_mean"].get<double>()));
}

// A run through the flag on a GPU. It does not observe the waits themselves: the order of wait
// and clock read is the unit test's, and what the waits change is a timing (PERFORMANCE.md).
TEST_CASE("cuda: moe-train -v --breakdown-sync trains and reports its step breakdown", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  test::ScratchDir dir("cuda-cli-breakdown-sync");
  auto r = test::run_command(test::tool_path("moe-train") + " --data " +
                             test::fortunes_path("linux") + " --out " + dir.path() + kTiny +
                             " --steps 4 --log-every 2 --eval-every 0 --metrics - --device cuda" +
                             " -v --breakdown-sync");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("time per step (2 steps): ") != std::string::npos);
  nlohmann::json last =
      nlohmann::json::parse(r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1));
  REQUIRE(last.contains("step_breakdown"));
  // The parts, waits included, are still the step's own seconds.
  double sum = 0;
  for (const auto& [part, seconds] : last["step_breakdown"].items()) sum += seconds.get<double>();
  CHECK(last["step_breakdown"]["gemm"].get<double>() > 0);
  CHECK(sum <= 1.0 / last["tokens_per_s"].get<double>() * last["tokens_seen"].get<double>() /
                   last["step"].get<double>() * 1.01);
}

TEST_CASE("cuda: mpiexec -n 2 moe-train --device cuda trains over NCCL, one GPU per rank",
          "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  if (cuda::device_count() < 2) {
    std::cout << "[cuda] skipped: 2 ranks need 2 GPUs, this machine has " << cuda::device_count()
              << "\n";
    return;
  }
  if (std::string(MOE_MPIEXEC).empty()) {
    std::cout << "[cuda] skipped: this build found no MPI launcher\n";
    return;
  }
  test::ScratchDir dir("cuda-cli-nccl");
  auto r = test::run_command(std::string(MOE_MPIEXEC) + " -n 2 " + test::tool_path("moe-train") +
                             " --data " + test::fortunes_path("linux") + " --out " + dir.path() +
                             kTiny + " --steps 4 --ep 2 --device cuda");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(r.err.find("ranks (nccl)") != std::string::npos);
  REQUIRE(std::filesystem::exists(dir / "step-00000004"));  // sharded: one file per rank
}
