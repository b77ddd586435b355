// A CPU shared with other work (issue 47, tools/common/omp_wait.h): every tool sets GNU
// OpenMP's idle spin to 1,000 polls before the runtime reads it, unless the user set
// OMP_WAIT_POLICY or GOMP_SPINCOUNT (kept as given), and says which under -v. How the threads
// wait never changes a computed bit: a run beside a CPU-bound neighbour writes the checkpoint the
// quiet run writes. (The speed it buys is measured by bench/contention.sh, not here.)
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "support/run.h"
#include "support/state.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

// Two threads, so that the threads have something to wait for; -v after the model flags.
const std::string kTwoThreads =
    " --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --experts 4 --moe-every 1 --batch 4"
    " --eval-batches 1 --threads 2";

}  // namespace

TEST_CASE("cli: idle OpenMP threads spin briefly unless the user chose how they wait",
          "[cli][threads]") {
  // Before: libgomp's own 300,000 polls (no -v line said so either).
  test::ScratchDir dir("cli-shared-cpu-env");
  const std::string data = " --data " + test::fortunes_path("linux");
  REQUIRE(run_command(tool("moe-train", data + " --out " + (dir / "m") + kTwoThreads +
                                            " --steps 1 -q"))
              .exit_code == 0);
  struct Case {
    std::string env, words;
  };
  const std::vector<Case> cases = {
      {"env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT", "idle threads wait by GOMP_SPINCOUNT=1000"},
      {"env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=7", "idle threads wait by GOMP_SPINCOUNT=7"},
      {"env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive",
       "idle threads wait by OMP_WAIT_POLICY=passive"},
  };
  for (const Case& c : cases) {
    const std::vector<std::string> commands = {
        tool("moe-train", data + " --out " + (dir / "t") + kTwoThreads + " --steps 1 --force -v"),
        tool("moe-infer", "score --model " + (dir / "m") + "/last.h5" + data + " -v"),
    };
    for (const std::string& command : commands) {
      const test::RunResult r = run_command(c.env + " " + command);
      INFO(c.env << " " << command << "\n" << r.err);
      CHECK(r.exit_code == 0);
      CHECK(r.err.find(c.words) != std::string::npos);
    }
  }
}

TEST_CASE("cli: a CPU-bound neighbour changes no bit of training", "[cli][threads]") {
  // A guard, not a regression test: the tiles fix every sum's order, so how threads wait or
  // when they run cannot change a value.
  test::ScratchDir dir("cli-shared-cpu-bits");
  const std::string train = tool("moe-train", "--data " + test::fortunes_path("linux") +
                                                  kTwoThreads + " --steps 4 -q --out ");
  REQUIRE(run_command(train + (dir / "quiet")).exit_code == 0);
  // The neighbour spins in a shell of its own for as long as the run lasts.
  const test::RunResult busy =
      run_command("sh -c 'while :; do :; done' & spin=$!; " + train + (dir / "busy") +
                  "; rc=$?; kill $spin; exit $rc");
  INFO(busy.err);
  REQUIRE(busy.exit_code == 0);
  const io::Checkpoint quiet = io::load_checkpoint(dir / "quiet" + "/last.h5");
  const io::Checkpoint shared = io::load_checkpoint(dir / "busy" + "/last.h5");
  CHECK(test::first_difference(quiet, shared) == "");
}
