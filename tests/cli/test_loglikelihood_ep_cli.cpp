// moe-infer loglikelihood under expert parallelism (issue 44): mpiexec -n 2 ... --ep 2 answers
// every request (loglikelihood and --rolling) as one process does, for a trained deepseek_v3
// (latent attention, grouped sigmoid routing, a shared expert) whose 4 experts the two ranks
// split: each pass's rows are shared between the ranks and every row's log-probabilities gathered
// (rank 0 writes). The requests make passes of rows of equal length at --batch 2 (up to 4 rows a
// pass over two ranks): passes that split evenly, that leave rank 1 one row short, and that leave
// it without a row; contexts longer than the model's 16 tokens; rolling texts of 1 to 5 windows.
//
// Tolerance: under --ep an expert's GEMM holds other rows than in one process, so its outputs may
// round differently (a few f32 ulps, ~1e-7 of the logits' scale); a token's log-probability, a
// logit less the log-sum-exp, moves by at most twice the largest logit change: 1e-5 nats a token
// bounds that with room (tests/cli/test_score_ep_cli.cpp measured 4e-7 on the same model), so a
// request's sum is held to 1e-5 times its tokens. A row given to the wrong request, a dropped or
// doubled row, or a misaligned token is off by whole nats or changes the token counts.
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

// The results of `args` in one process and under mpiexec -n 2 --ep 2, which must agree.
void compare(const std::string& args, size_t requests, bool rolling) {
  const auto one = run_command(tool("moe-infer", args));
  INFO(one.err);
  REQUIRE(one.exit_code == 0);
  const auto ep = run_command(mpiexec(2, tool("moe-infer", args + " --ep 2")));
  INFO(ep.err);
  REQUIRE(ep.exit_code == 0);
  const std::vector<json> a = json_lines(one.out), b = json_lines(ep.out);
  REQUIRE(a.size() == requests);
  REQUIRE(b.size() == requests);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("request " << i << ": " << a[i].dump() << " / " << b[i].dump());
    REQUIRE(b[i]["index"] == a[i]["index"]);
    REQUIRE(b[i]["line"] == a[i]["line"]);
    REQUIRE(b[i]["tokens"] == a[i]["tokens"]);
    if (rolling) {
      REQUIRE(b[i]["windows"] == a[i]["windows"]);
    } else {
      REQUIRE(b[i]["context_tokens_dropped"] == a[i]["context_tokens_dropped"]);
      CHECK(b[i]["greedy"] == a[i]["greedy"]);
    }
    const double diff = std::fabs(b[i]["logprob"].get<double>() - a[i]["logprob"].get<double>());
    CHECK(diff <= 1e-5 * a[i]["tokens"].get<double>());
    worst = std::max(worst, diff / a[i]["tokens"].get<double>());
  }
  WARN("worst difference a token " << worst << " nats");
}

}  // namespace

TEST_CASE("cli: loglikelihood under --ep answers as one process", "[cli][logprob][ep]") {
  REQUIRE(run_command("command -v mpiexec").exit_code == 0);  // scripts/setup installs it
  test::ScratchDir dir("cli-loglikelihood-ep");
  const std::string ckpt = test::train_on_fortunes(
      dir / "run",
      " --arch deepseek_v3 --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --batch 4"
      " --experts-per-layer 0,4 --shared-expert-ff 16 --router-groups 2 --router-group-topk 1"
      " --steps 60 --lr 1e-2 --warmup 1 --eval-batches 1 --threads 1 -q");
  const std::string text = test::read_file(test::fortunes_path("linux")).substr(0, 4000);
  // (context bytes, continuation bytes) from successive places of the text (byte-level: a byte a
  // token). A row is context + continuation - 1 tokens long, at most 16: seven of length 10 (a
  // pass of 4 rows, then one of 3), three of 7, one of 13 and one of 4 (rank 1 without a row),
  // two of 16 (contexts cut from the left).
  const std::vector<std::pair<size_t, size_t>> shapes = {{8, 3},  {6, 5},  {10, 1}, {4, 4}, {9, 2},
                                                         {30, 4}, {7, 4},  {2, 6},  {5, 3}, {3, 8},
                                                         {12, 2}, {40, 1}, {1, 4},  {6, 5}};
  std::string requests;
  size_t at = 0;
  for (const auto& [context, continuation] : shapes) {
    requests += json{{"context", text.substr(at, context)},
                     {"continuation", text.substr(at + context, continuation)}}
                    .dump() +
                "\n";
    at += context + continuation + 7;
  }
  test::write_file(dir / "requests.jsonl", requests);
  const std::string common = " --model " + ckpt + " --batch 2 -q --threads 1";
  compare("loglikelihood --requests " + (dir / "requests.jsonl") + common, shapes.size(), false);

  // Rolling texts of 1 to 5 windows of 16 predicted tokens (the last one shorter).
  std::string texts;
  for (size_t n : {17, 40, 33, 75, 9, 50})
    texts += json{{"text", text.substr(at, n)}}.dump() + "\n", at += n;
  test::write_file(dir / "texts.jsonl", texts);
  compare("loglikelihood --rolling --requests " + (dir / "texts.jsonl") + common, 6, true);

  // Every rank reads its own copy of the requests: ranks given different ones stop (exit 1) before
  // the first pass, naming them (mpiexec's colon form starts each rank with its own flags).
  test::write_file(dir / "first.jsonl", requests.substr(0, requests.find('\n') + 1));
  const auto differ = run_command(
      "OMP_NUM_THREADS=1 timeout 120 mpiexec -n 1 " +
      tool("moe-infer", "loglikelihood --ep 2 --requests " + (dir / "requests.jsonl") + common) +
      " : -n 1 " +
      tool("moe-infer", "loglikelihood --ep 2 --requests " + (dir / "first.jsonl") + common));
  INFO(differ.err);
  CHECK(differ.exit_code == 1);
  CHECK(differ.err.find("the loglikelihood request file (its token ids) differs between ranks") !=
        std::string::npos);
  CHECK(differ.out.empty());

  // Every rank reads the requests: stdin, which mpiexec gives rank 0 only, is refused (exit 2).
  const auto r =
      run_command(mpiexec(2, tool("moe-infer", "loglikelihood --requests - --ep 2" + common)) +
                  " < " + (dir / "requests.jsonl"));
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("under mpiexec (2 ranks) every rank reads the requests: give a file") !=
        std::string::npos);
}
