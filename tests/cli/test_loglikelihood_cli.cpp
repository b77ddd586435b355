// What evaluation harnesses ask of a model (issue 44), as a user runs it: moe-infer score
// --per-token (each predicted token's log-prob, rank and top-n), and moe-infer loglikelihood
// (lm-evaluation-harness's loglikelihood and loglikelihood_rolling requests), checked against
// each other on a byte-level model (seq 16), and the request files they refuse.
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

struct Model {
  test::ScratchDir dir{"cli-loglikelihood"};
  std::string ckpt;
  Model() { ckpt = test::train_on_fortunes(dir.path(), test::kTinyMixtral + " --steps 3"); }
};

Model& model() {
  static Model m;
  return m;
}

test::RunResult infer(const std::string& args) {
  return run_command(tool("moe-infer", args + " --model " + model().ckpt + " --threads 1 -q"));
}

// score --per-token of `text` (a file of windows of 16 + 1 bytes): one record per window.
std::vector<json> per_token(const std::string& text, const std::string& flags = "") {
  const std::string data = model().dir / "per-token.txt";
  test::write_file(data, text);
  const test::RunResult r = infer("score --per-token --batch 2 --data " + data + " " + flags);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return json_lines(r.out);
}

test::RunResult loglikelihood(const std::string& requests, const std::string& flags = "") {
  const std::string file = model().dir / "requests.jsonl";
  test::write_file(file, requests);
  return infer("loglikelihood --requests " + file + " " + flags);
}

const std::string kText = "Linux is a kernel; GNU is the rest of the system, they say.";

}  // namespace

TEST_CASE("cli: score --per-token lists every predicted token, summing to logprob_sum",
          "[cli][logprob]") {
  const std::vector<json> windows = per_token(kText.substr(0, 3 * 16 + 1), "--top 3");
  REQUIRE(windows.size() == 3);
  for (const json& w : windows) {
    const int64_t index = w["index"];
    INFO("window " << index);
    REQUIRE(w["token_ids"].size() == 16);
    double sum = 0;
    for (size_t t = 0; t < 16; ++t) {
      // Byte-level: the token predicted at position t of window w is byte w*16 + t + 1.
      REQUIRE(w["token_ids"][t] == static_cast<unsigned char>(kText[index * 16 + t + 1]));
      REQUIRE(w["token_ranks"][t] >= 1);
      REQUIRE(w["top_ids"][t].size() == 3);
      REQUIRE(w["top_logprobs"][t][0] >= w["token_logprobs"][t]);
      REQUIRE((w["token_ranks"][t] == 1) == (w["top_logprobs"][t][0] == w["token_logprobs"][t]));
      sum += w["token_logprobs"][t].get<double>();
    }
    // logprob_sum is the loss kernel's float NLLs summed; each token's log-prob is the double
    // log-softmax of the same logits: within 1e-5 each (tests/unit/test_token_logprobs.cpp), so
    // 16e-5 for the window.
    REQUIRE(std::fabs(sum - w["logprob_sum"].get<double>()) <= 16e-5);
  }
  // --incremental gives the same tokens and, to the logits' rounding, the same log-probs.
  const std::vector<json> incremental = per_token(kText.substr(0, 3 * 16 + 1), "--incremental");
  REQUIRE(incremental.size() == 3);
  REQUIRE(incremental[1]["token_ids"] == windows[1]["token_ids"]);
  REQUIRE(std::fabs(incremental[1]["token_logprobs"][5].get<double>() -
                    windows[1]["token_logprobs"][5].get<double>()) <= 1e-5);
  REQUIRE_FALSE(incremental[1].contains("top_ids"));
  // --top needs --per-token (usage error).
  const test::RunResult r = infer("score --top 3 --data " + (model().dir / "per-token.txt"));
  REQUIRE(r.exit_code == 2);
  REQUIRE_THAT(r.err, Catch::Contains("--top requires --per-token"));
}

TEST_CASE("cli: loglikelihood scores continuations as score --per-token does", "[cli][logprob]") {
  // Context + continuation of exactly 17 bytes: the one window score reads from the same text.
  const std::string context = kText.substr(0, 12), continuation = kText.substr(12, 5);
  const std::vector<json> windows = per_token(kText.substr(0, 17));
  const test::RunResult r = loglikelihood(
      json{{"context", context}, {"continuation", continuation}}.dump() + "\n\n" +
          json{{"context", kText.substr(0, 30)}, {"continuation", kText.substr(30, 5)}}.dump() +
          "\n" +
          json{{"context", kText.substr(18, 12)}, {"continuation", kText.substr(30, 5)}}.dump() +
          "\n",
      "--batch 1");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<json> out = json_lines(r.out);
  REQUIRE(out.size() == 3);
  REQUIRE(out[0]["index"] == 0);
  REQUIRE(out[1]["line"] == 3);  // the blank line counts
  REQUIRE(out[0]["tokens"] == 5);
  double want = 0;
  bool greedy = true;
  for (size_t t = 11; t < 16; ++t) {  // positions 11..15 predict bytes 12..16
    want += windows[0]["token_logprobs"][t].get<double>();
    greedy = greedy && windows[0]["token_ranks"][t] == 1;
  }
  // The same tokens through a forward pass of the same shape [1, 16] (--batch 1) and the same
  // double log-softmax: equal but for the order of five additions (1e-12).
  REQUIRE(std::fabs(out[0]["logprob"].get<double>() - want) <= 1e-12);
  REQUIRE(out[0]["greedy"] == greedy);
  REQUIRE(out[0]["context_tokens_dropped"] == 0);
  // 35 bytes: cut from the left to the last 17, the continuation whole; the same row as a request
  // whose context is the 12 bytes that remain.
  REQUIRE(out[1]["context_tokens_dropped"] == 18);
  REQUIRE(out[2]["context_tokens_dropped"] == 0);
  REQUIRE(out[1]["logprob"].get<double>() == out[2]["logprob"].get<double>());
  REQUIRE(out[1]["greedy"] == out[2]["greedy"]);
}

TEST_CASE("cli: loglikelihood --rolling scores a whole text in windows of the context",
          "[cli][logprob]") {
  // 33 bytes: two full windows (the first byte has no BOS or end-of-text token before it on a
  // byte-level model, so it is not scored): the rows score reads from the same file.
  const std::vector<json> windows = per_token(kText.substr(0, 33));
  double want = 0;
  for (const json& w : windows)
    for (const json& lp : w["token_logprobs"]) want += lp.get<double>();
  const test::RunResult r = loglikelihood(json{{"text", kText.substr(0, 33)}}.dump() + "\n" +
                                              json{{"text", kText.substr(0, 40)}}.dump() + "\n",
                                          "--rolling --batch 2");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::vector<json> out = json_lines(r.out);
  REQUIRE(out.size() == 2);
  REQUIRE(out[0]["tokens"] == 32);
  REQUIRE(out[0]["windows"] == 2);
  REQUIRE_FALSE(out[0].contains("greedy"));
  // The same rows (a pass of [2, 16] in both, --batch 2), summed in another order: 1e-12.
  REQUIRE(std::fabs(out[0]["logprob"].get<double>() - want) <= 1e-12);
  // 40 bytes: the same two windows, then a third predicting the last 7 bytes (33..39) from the 16
  // before them: the last 7 positions of score's one window of bytes 23..39 (a pass of [1, 16] in
  // both: the fifth row of length 16 passes alone).
  REQUIRE(out[1]["tokens"] == 39);
  REQUIRE(out[1]["windows"] == 3);
  const std::vector<json> last = per_token(kText.substr(23, 17));
  REQUIRE(last.size() == 1);
  for (size_t t = 9; t < 16; ++t) want += last[0]["token_logprobs"][t].get<double>();
  REQUIRE(std::fabs(out[1]["logprob"].get<double>() - want) <= 1e-12);
}

TEST_CASE("cli: loglikelihood refuses bad request files, naming file:line", "[cli][logprob]") {
  const std::string ok = json{{"context", "Linux"}, {"continuation", " is"}}.dump() + "\n";
  struct Case {
    std::string line, error;
    int exit_code;
  };
  const std::vector<Case> cases = {
      {"{\"context\": \"Linux\", \"continuation\": ", ":2: invalid JSON at column 38", 1},
      {"[1, 2]", ":2: not a JSON object", 1},
      {"{\"context\": \"Linux\"}", ":2: no \"continuation\" field", 1},
      {"{\"context\": \"Linux\", \"continuation\": 3}", ":2: \"continuation\" must be a string", 1},
      {"{\"context\": \"Linux\", \"continuation\": \"\"}", ":2: the continuation is empty", 1},
      {"{\"context\": \"\", \"continuation\": \" is\"}", ":2: the context is empty", 1},
      {json{{"context", "Linux"}, {"continuation", std::string(17, 'x')}}.dump(),
       ":2: the continuation has 17 tokens, more than the model's context of 16", 2},
  };
  for (const Case& c : cases) {
    INFO(c.line);
    const test::RunResult r = loglikelihood(ok + c.line + "\n");
    REQUIRE(r.exit_code == c.exit_code);
    REQUIRE_THAT(r.err, Catch::Contains("moe-infer: error: ") &&
                            Catch::Contains("requests.jsonl" + c.error));
  }
  const test::RunResult rolling = loglikelihood(ok, "--rolling");
  REQUIRE(rolling.exit_code == 1);
  REQUIRE_THAT(rolling.err, Catch::Contains("requests.jsonl:1: no \"text\" field"));
  const test::RunResult empty = loglikelihood("\n\n");
  REQUIRE(empty.exit_code == 1);
  REQUIRE_THAT(empty.err, Catch::Contains("holds no request"));
}
