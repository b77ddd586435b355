// moe-train's expert offload flags (--offload and the store's budgets and switches) as a user runs
// them: an offloaded run writes the checkpoint a resident run writes, bit for bit; a resumed
// offloaded run may change the store's settings and still ends where the straight run does; bad
// values are refused before any work with the flag to change.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "moe/cuda.h"
#include "moe/io/checkpoint.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
namespace fs = std::filesystem;

namespace {

// 2 MoE layers of 4 experts: one expert's fp32 weights are 6 KiB (the minimum --device-budget).
const std::string kTiny =
    " --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --experts 4 --moe-every 1 --batch 4"
    " --eval-batches 1 --threads 1";

std::string train(const std::string& args) {
  return test::tool_path("moe-train") + " --data " + test::fortunes_path("linux") + kTiny + " " +
         args;
}

// Every dataset of `what` (the /params or the /optim of two checkpoints): the same names in the
// same order with the same bytes. Returns the first that differs ("" when none).
std::string first_difference(const std::vector<io::NamedTensor>& x,
                             const std::vector<io::NamedTensor>& y) {
  if (x.size() != y.size()) return str(x.size(), " tensors vs ", y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const Tensor &a = x[i].tensor, &b = y[i].tensor;
    if (x[i].name != y[i].name || a.shape() != b.shape() || a.dtype() != b.dtype() ||
        std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0)
      return x[i].name;
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("cli: moe-train --offload host writes bitwise the checkpoint of the resident run",
          "[cli][offload]") {
  test::ScratchDir dir("cli-offload-bitwise");
  // A clipped f32 mixtral (each expert's AdamW after backward) and an unclipped bf16 gpt (AdamW
  // during backward, fp32 masters in the store), each against the same flags without --offload.
  for (const std::string& model : {std::string(" --arch mixtral --kv-heads 1"),
                                   std::string(" --arch gpt --dtype bf16 --clip 0")}) {
    INFO(model);
    const std::string flags = model + " --steps 3";
    const test::RunResult resident = run_command(train(flags + " --out " + dir / "resident"));
    INFO(resident.err);
    REQUIRE(resident.exit_code == 0);
    REQUIRE(!contains(resident.err, "offload:"));
    // Two device slots: experts are uploaded again and again, and updates make slots stale.
    const test::RunResult host =
        run_command(train(flags + " --offload host --device-budget 12KiB --out " + dir / "host"));
    INFO(host.err);
    REQUIRE(host.exit_code == 0);
    REQUIRE(contains(host.err, "[info] offload: host tier, experts' state "));
    // Two slots of one expert's fp32 weights (6 KiB mixtral, 4.2 KiB gpt).
    REQUIRE(contains(host.err, "KiB (--device-budget 12.0 KiB)"));
    REQUIRE(contains(host.err, ", 2 device slots of "));
    const bool clipped = !contains(model, "--clip 0");
    REQUIRE(contains(host.err, clipped ? "expert AdamW after backward (--clip 1"
                                       : "expert AdamW during backward (--clip 0)"));
    // The final counters: 3 steps x 8 experts updated, during backward only without a clip.
    REQUIRE(contains(host.err, clipped ? "0 expert updates during backward, 24 after"
                                       : "24 expert updates during backward, 0 after"));
    const io::Checkpoint a = io::load_checkpoint(dir / "resident/last.h5");
    const io::Checkpoint b = io::load_checkpoint(dir / "host/last.h5");
    REQUIRE(b.train_config["offload"] == "host");
    REQUIRE(b.train_config["device_budget"] == "12KiB");
    REQUIRE(a.params.size() > 10);
    REQUIRE(first_difference(a.params, b.params) == "");
    REQUIRE(first_difference(a.optim, b.optim) == "");
    fs::remove_all(dir / "resident");
    fs::remove_all(dir / "host");
  }
}

TEST_CASE(
    "cli: a resumed offloaded run may change the store's settings and ends bitwise where "
    "the straight run does",
    "[cli][offload]") {
  test::ScratchDir dir("cli-offload-resume");
  const std::string flags = " --arch mixtral --kv-heads 1 --steps 4 --offload host";
  const test::RunResult straight =
      run_command(train(flags + " --checkpoint-every 2 --out " + dir / "a"));
  INFO(straight.err);
  REQUIRE(straight.exit_code == 0);
  // Resumed at step 2 with no prefetch, every expert pinned and the optimizer not overlapped:
  // none of them changes a number.
  const test::RunResult resumed = run_command(
      test::tool_path("moe-train") + " --resume " + dir / "a/step-00000002.h5" + " --out " +
      dir / "b" + " --threads 1 --prefetch-depth 0 --pin-fraction 1 --no-optimizer-overlap");
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE(contains(resumed.err, "resume: --prefetch-depth 2 -> 0"));
  REQUIRE(contains(resumed.err, "resume: --optimizer-overlap true -> false"));
  REQUIRE(contains(resumed.err, "offload: host tier"));  // kept from the checkpoint
  REQUIRE(contains(resumed.err, "prefetch depth 0, pin 100%"));
  const io::Checkpoint a = io::load_checkpoint(dir / "a/step-00000004.h5");
  const io::Checkpoint b = io::load_checkpoint(dir / "b/step-00000004.h5");
  REQUIRE(b.train_config["offload"] == "host");
  REQUIRE(b.train_config["prefetch_depth"] == 0);
  REQUIRE(b.train_config["optimizer_overlap"] == false);
  REQUIRE(first_difference(a.params, b.params) == "");
  REQUIRE(first_difference(a.optim, b.optim) == "");
  // The checkpoint of an offloaded run resumes resident (--offload none), to the same bits.
  const test::RunResult resident =
      run_command(test::tool_path("moe-train") + " --resume " + dir / "a/step-00000002.h5" +
                  " --out " + dir / "c" + " --threads 1 --offload none");
  INFO(resident.err);
  REQUIRE(resident.exit_code == 0);
  REQUIRE(!contains(resident.err, "offload: host tier"));
  const io::Checkpoint c = io::load_checkpoint(dir / "c/step-00000004.h5");
  REQUIRE(c.train_config["offload"] == "none");
  REQUIRE(first_difference(a.params, c.params) == "");
  REQUIRE(first_difference(a.optim, c.optim) == "");
}

TEST_CASE("cli: moe-train --config takes the offload keys", "[cli][offload][config]") {
  test::ScratchDir dir("cli-offload-config");
  test::write_file(dir / "offload.toml",
                   "offload = \"host\"\ndevice_budget = \"18KiB\"\nhost-budget = \"1MiB\"\n"
                   "pin_fraction = 0.5\nprefetch_depth = 1\noptimizer_overlap = false\n"
                   "expert_cache = \"lfu\"\nlfu_threshold = 2\nlfu_beta = 0.5\nlfu_period = 4\n");
  const test::RunResult r = run_command(train(" --arch mixtral --kv-heads 1 --steps 2 --config " +
                                              dir / "offload.toml" + " --out " + dir / "a"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE(contains(r.err,
                   "offload: host tier, experts' state 192.0 KiB in RAM (--host-budget 1.0 "
                   "MiB), 3 device slots of 6.0 KiB (--device-budget 18.0 KiB), prefetch "
                   "depth 1, pin 50%, expert AdamW after backward (--no-optimizer-overlap)"));
  const io::Checkpoint c = io::load_checkpoint(dir / "a/last.h5", false);
  REQUIRE(c.train_config["host_budget"] == "1MiB");
  REQUIRE(c.train_config["pin_fraction"] == 0.5);
  REQUIRE(c.train_config["optimizer_overlap"] == false);
  REQUIRE(c.train_config["expert_cache"] == "lfu");
  REQUIRE(c.train_config["lfu_threshold"] == 2.0);
  REQUIRE(c.train_config["lfu_beta"] == 0.5);
  REQUIRE(c.train_config["lfu_period"] == 4);
  // A misspelt key is refused as any other.
  test::write_file(dir / "typo.toml", "offlaod = \"host\"\n");
  const test::RunResult typo =
      run_command(train("--config " + dir / "typo.toml" + " --out " + dir / "b"));
  REQUIRE(typo.exit_code == 2);
  REQUIRE(contains(typo.err, "unknown key 'offlaod' (did you mean 'offload'?)"));
}

TEST_CASE("cli: bad offload flags are refused before any work, naming the flag", "[cli][offload]") {
  test::ScratchDir dir("cli-offload-errors");
  struct Case {
    std::string flags;
    int exit_code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"--offload bogus", 2, "--offload: bogus not in {none,host,ssd,auto}"},
      {"--pin-fraction 2", 2, "--pin-fraction: Value 2 not in range"},
      {"--prefetch-depth 65", 2, "--prefetch-depth: Value 65 not in range"},
      {"--expert-cache fifo", 2, "--expert-cache: fifo not in {lru,lfu}"},
      {"--lfu-beta 1.5", 2, "--lfu-beta: Value 1.5 not in range"},
      {"--lfu-period 0", 2, "--lfu-period"},
      {"--offload host --device-budget 12XB", 2, "unknown unit 'XB'"},
      {"--offload host --device-budget 25%", 2, "a share (%) has no total here"},
      // Below one expert's fp32 weights (6 KiB): the store names the minimum.
      {"--offload host --device-budget 10", 2,
       "--device-budget 10 bytes is smaller than one expert's fp32 weights (6144 bytes): the "
       "minimum is 6144"},
      {"--offload host --host-budget 1KB", 2,
       "--offload host: the experts' state takes 192.0 KiB (196608 bytes) but --host-budget is "
       "1000 bytes: raise it, or keep the state on SSD with --offload ssd --ssd-dir DIR"},
  };
  for (const Case& c : cases) {
    INFO(c.flags);
    const test::RunResult r = run_command(
        train(" --arch mixtral --kv-heads 1 --steps 1 " + c.flags + " --out " + dir / "run"));
    INFO(r.err);
    REQUIRE(r.exit_code == c.exit_code);
    REQUIRE(contains(r.err, c.message));
    REQUIRE(!fs::exists(dir / "run/last.h5"));
  }
}

// --offload with --device cuda is the GPU store; without a usable GPU it is refused as every
// --device cuda run is (exit 1, the driver's or the build's reason), before any file is written.
TEST_CASE("cli: moe-train --offload host --device cuda without a GPU names the device and why",
          "[cli][offload]") {
  if (cuda::available()) {  // the [cuda] tests train it (tests/cuda/test_cuda_offload.cpp)
    WARN("a CUDA device is usable here: the refusal cannot happen");
    return;
  }
  test::ScratchDir dir("cli-offload-cuda");
  for (const std::string& offload : {std::string("host"), "ssd --ssd-dir " + dir / "ssd"}) {
    const std::string flags = "--offload " + offload + " --device cuda";
    INFO(flags);
    const test::RunResult r = run_command(
        train(" --arch mixtral --kv-heads 1 --steps 1 " + flags + " --out " + dir / "run"));
    INFO(r.err);
    REQUIRE(r.exit_code == 1);
    REQUIRE(contains(r.err, "moe-train: error: --device cuda: " + cuda::unavailable_reason()));
    REQUIRE(!fs::exists(dir / "run/last.h5"));
  }
}
