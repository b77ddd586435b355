// moe-plan calibrate as a user runs it: --quick writes a spec that moe-plan predict takes as
// its --cluster, with every quantity positive and finite (never a timing bound), marks what one
// process cannot measure, refuses to replace an existing -o without --force, and refuses a scratch
// directory it cannot use, naming it.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moe/cuda.h"
#include "moe/plan/cluster.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("cli: moe-plan calibrate --quick writes a spec predict accepts", "[cli][plan]") {
  test::ScratchDir dir("cli-plan-calibrate");
  const std::string spec = dir / "machine.toml";
  auto r = run_command(tool("moe-plan", "calibrate --quick -o " + spec));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.empty());  // the spec goes to the file; stderr is people
  CHECK_THAT(r.err, Catch::Contains("[bandwidth] intra_node, [latency] intra_node: not measured"));

  const plan::ClusterSpec s = plan::read_cluster_file(spec);
  for (double v : {s.device_bytes, s.host_bytes, s.intra_node_bw, s.inter_node_bw, s.host_device_bw,
                   s.ssd_bw, s.memcpy_bw, s.device_memory_bw, s.gemm_f32, s.cpu_adamw}) {
    CHECK(std::isfinite(v));
    CHECK(v > 0);
  }
  const std::string text = read_text(spec);
  CHECK_THAT(text, Catch::Contains("# measured by moe-plan calibrate on "));
  CHECK_THAT(text, Catch::Contains("NOT MEASURED (one process)"));
  // Only the spec is left: no SSD test file, no temporary.
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++files;
  CHECK(files == 1);

  const std::string ckpt = test::train_on_fortunes(dir / "run", test::kTinyModel + " --steps 2");
  const std::string trace = dir / "trace.h5";
  r = run_command(tool("moe-profile", "record -q --model " + ckpt + " --data " +
                                          test::fortunes_path("computers") +
                                          " --batch 4 --max-tokens 256 -o " + trace));
  REQUIRE(r.exit_code == 0);
  r = run_command(tool("moe-plan", "predict --model " + ckpt + " --trace " + trace + " --cluster " +
                                       spec + " --batch 2"));
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("tokens_per_s"));
}

TEST_CASE("cli: moe-plan calibrate keeps an existing spec without --force", "[cli][plan]") {
  test::ScratchDir dir("cli-plan-calibrate-force");
  const std::string spec = dir / "machine.toml";
  test::write_file(spec, "mine\n");
  auto r = run_command(tool("moe-plan", "calibrate --quick -o " + spec));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("moe-plan: error: '" + spec + "' already exists"));
  CHECK_THAT(r.err, Catch::Contains("--force"));
  CHECK(read_text(spec) == "mine\n");

  r = run_command(tool("moe-plan", "calibrate --quick --force -o " + spec));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_NOTHROW(plan::read_cluster_file(spec));
}

TEST_CASE("cli: moe-plan calibrate names a scratch directory it cannot use", "[cli][plan]") {
  test::ScratchDir dir("cli-plan-calibrate-scratch");
  const std::string spec = dir / "machine.toml";
  auto r =
      run_command(tool("moe-plan", "calibrate --quick --scratch " + dir / "gone" + " -o " + spec));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("moe-plan: error: scratch directory '" + dir / "gone" +
                                    "' does not exist"));
  CHECK_FALSE(std::filesystem::exists(spec));

  // No --scratch: the output's directory, which must exist; named as the output's.
  r = run_command(tool("moe-plan", "calibrate --quick -o " + dir / "nodir/machine.toml"));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("moe-plan: error: cannot write '" + dir / "nodir/machine.toml" +
                                    "': directory '" + dir / "nodir" + "' does not exist"));

  test::write_file(dir / "file", "x");
  r = run_command(tool("moe-plan", "calibrate --quick --scratch " + dir / "file" + " -o " + spec));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("scratch directory '" + dir / "file" + "' is not a directory"));
  CHECK_FALSE(std::filesystem::exists(spec));
}

TEST_CASE("cli: moe-plan calibrate --device cuda refuses without a GPU", "[cli][plan]") {
  if (cuda::available()) return;  // a GPU machine calibrates it instead (not tested here)
  test::ScratchDir dir("cli-plan-calibrate-cuda");
  const std::string spec = dir / "gpu.toml";
  auto r = run_command(tool("moe-plan", "calibrate --quick --device cuda -o " + spec));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("moe-plan: error: cannot calibrate device cuda: no usable "
                                    "CUDA device ("));
  CHECK_FALSE(std::filesystem::exists(spec));
}

TEST_CASE("cli: moe-plan calibrate under mpiexec measures the link between ranks", "[cli][plan]") {
  if (run_command("command -v mpiexec").exit_code != 0) {
    WARN("mpiexec not found: no link between ranks to measure here");
    return;
  }
  test::ScratchDir dir("cli-plan-calibrate-mpi");
  const std::string spec = dir / "two.toml";
  auto r = run_command("OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 " +
                       tool("moe-plan", "calibrate --quick -o " + spec));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const plan::ClusterSpec s = plan::read_cluster_file(spec);
  CHECK(s.nodes == 1);
  CHECK(s.devices_per_node == 2);
  CHECK(s.intra_node_bw > 0);
  CHECK(std::isfinite(s.intra_node_bw));
  CHECK(s.intra_node_latency > 0);  // measured, not the one-process 0
  CHECK(std::isfinite(s.intra_node_latency));
  const std::string text = read_text(spec);
  CHECK_THAT(text, Catch::Contains("2 ranks through the mpi communicator"));
  // One node: only the link across nodes is left unmeasured.
  CHECK_THAT(r.err, Catch::Contains("[bandwidth] inter_node, [latency] inter_node: not measured"));
  CHECK(r.err.find("[bandwidth] intra_node, [latency] intra_node: not measured") ==
        std::string::npos);
}
