// [cuda] moe-train --device cuda as a user runs it: trains, writes the same checkpoint format, and
// the checkpoint resumes on the CPU.
#include <catch2/catch.hpp>
#include <filesystem>

#include "moe/io/checkpoint.h"
#include "support/cuda.h"
#include "support/run.h"

using namespace moe;

TEST_CASE("cuda: moe-train --device cuda trains and its checkpoint resumes on the CPU", "[cuda]") {
  MOE_REQUIRE_CUDA_DEVICE();
  test::ScratchDir a("cuda-train-a"), b("cuda-train-b");
  const std::string train = test::tool_path("moe-train");
  const std::string tiny =
      " --layers 2 --d-model 32 --heads 2 --d-ff 64 --seq 32 --experts 4 --moe-every 1 --batch 8"
      " --eval-batches 2 --arch mixtral --kv-heads 1";
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
