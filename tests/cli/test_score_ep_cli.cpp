// Per-token log-probabilities under expert parallelism (issue 44): moe-infer score --per-token
// under mpiexec -n 2 --ep 2 writes one process's lines (each rank's windows' tokens gathered to
// rank 0), for a trained deepseek_v3 (latent attention, grouped sigmoid routing, a shared expert)
// whose 4 experts the two ranks split. generate, which has no --ep, is refused under mpiexec by
// name instead of being told to give one (loglikelihood's --ep: test_loglikelihood_ep_cli.cpp).
//
// Tolerance: under --ep an expert's GEMM holds other rows than in one process, so its outputs may
// round differently (a few f32 ulps, ~1e-7 of the logits' scale, a few units here); a
// log-probability, a logit less the log-sum-exp, moves by at most twice the largest logit change.
// 1e-5 nats bounds that with room (measured: 4e-7); a wrong window, token or rank order is off by
// whole nats or fails the exact id comparisons.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "support/json_lines.h"
#include "support/run.h"

using namespace moe;
using nlohmann::json;
using test::json_lines;
using test::run_command;
using test::tool;

namespace {

std::string mpiexec(int ranks, const std::string& command) {
  return "OMP_NUM_THREADS=1 timeout 120 mpiexec -n " + std::to_string(ranks) + " " + command;
}

}  // namespace

TEST_CASE("cli: score --per-token under --ep gives one process's tokens", "[cli][logprob][ep]") {
  REQUIRE(run_command("command -v mpiexec").exit_code == 0);  // scripts/setup installs it
  test::ScratchDir dir("cli-score-ep");
  const std::string ckpt = test::train_on_fortunes(
      dir / "run",
      " --arch deepseek_v3 --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --batch 4"
      " --experts-per-layer 0,4 --shared-expert-ff 16 --router-groups 2 --router-group-topk 1"
      " --steps 60 --lr 1e-2 --warmup 1 --eval-batches 1 --threads 1 -q");
  // 13 windows in rounds of batch 2 x 2 ranks: the last round leaves rank 1 without a window.
  const std::string args = "score --model " + ckpt + " --data " + test::fortunes_path("linux") +
                           " --batch 2 --max-sequences 13 --per-token --top 3 -q --threads 1";
  const auto one = run_command(tool("moe-infer", args));
  INFO(one.err);
  REQUIRE(one.exit_code == 0);
  const auto ep = run_command(mpiexec(2, tool("moe-infer", args + " --ep 2")));
  INFO(ep.err);
  REQUIRE(ep.exit_code == 0);
  const std::vector<json> a = json_lines(one.out), b = json_lines(ep.out);
  REQUIRE(a.size() == 13);
  REQUIRE(b.size() == 13);
  double worst = 0;
  for (size_t w = 0; w < a.size(); ++w) {
    INFO("window " << w);
    REQUIRE(b[w]["index"] == a[w]["index"]);
    REQUIRE(b[w]["token_ids"] == a[w]["token_ids"]);
    REQUIRE(b[w]["token_ids"].size() == 16);
    CHECK(b[w]["token_ranks"] == a[w]["token_ranks"]);
    CHECK(b[w]["top_ids"] == a[w]["top_ids"]);
    for (size_t t = 0; t < 16; ++t) {
      worst = std::max(worst, std::fabs(b[w]["token_logprobs"][t].get<double>() -
                                        a[w]["token_logprobs"][t].get<double>()));
      for (size_t k = 0; k < 3; ++k)
        worst = std::max(worst, std::fabs(b[w]["top_logprobs"][t][k].get<double>() -
                                          a[w]["top_logprobs"][t][k].get<double>()));
    }
    CHECK(b[w]["logprob_sum"].get<double>() ==
          Approx(a[w]["logprob_sum"].get<double>()).epsilon(1e-6));
  }
  INFO("worst log-prob difference " << worst);
  CHECK(worst < 1e-5);

  // generate runs in one process: under mpiexec it says so (exit 2), rather than asking for the
  // --ep only score and loglikelihood have.
  const std::string prompts = dir / "prompts.txt";
  test::write_file(prompts, "Linux is\n");
  const auto r =
      run_command(mpiexec(2, tool("moe-infer", "generate --max-new 2 --prompts " + prompts +
                                                   " --model " + ckpt + " -q")));
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("generate runs in one process (this job has 2 ranks)") != std::string::npos);
  CHECK(r.err.find("--ep (experts over ranks) is score's and loglikelihood's") !=
        std::string::npos);
}
