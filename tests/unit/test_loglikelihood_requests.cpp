// lm-evaluation-harness requests tokenized as the harness does (issue 44): the context's trailing
// whitespace joins the continuation, whose tokens are those of the whole text past the context's.
#include <catch2/catch.hpp>
#include <sstream>

#include "moe/infer/loglikelihood.h"
#include "moe/io/dataset.h"
#include "moe/io/tokenizer.h"
#include "support/run.h"

using namespace moe;

namespace {

std::vector<int32_t> joined(const infer::LoglikelihoodRequest& r) {
  std::vector<int32_t> all = r.context;
  all.insert(all.end(), r.continuation.begin(), r.continuation.end());
  return all;
}

}  // namespace

TEST_CASE("encode_request: the boundary as lm-evaluation-harness draws it", "[infer][logprob]") {
  SECTION("bytes: trailing whitespace moves to the continuation") {
    const infer::LoglikelihoodRequest r = infer::encode_request("Q: 2+2= \n", "4", nullptr, "f:1");
    REQUIRE(r.context == io::tokenize_bytes("Q: 2+2="));
    REQUIRE(r.continuation == io::tokenize_bytes(" \n4"));
    REQUIRE_THAT(test::error_of([] { infer::encode_request("  ", "x", nullptr, "f:3"); }),
                 Catch::Contains("f:3: the context is empty"));
  }
  for (const char* name : {"bpe-gpt2", "spm"}) {
    DYNAMIC_SECTION("tokenizer " << name) {
      const auto tok = io::load_tokenizer(std::string(MOE_TEST_DATA_DIR) + "/tokenizers/" + name);
      const infer::LoglikelihoodRequest r =
          infer::encode_request("The capital of France is ", "Paris.", tok.get(), "f:1");
      REQUIRE(r.context == tok->encode("The capital of France is"));
      // The whole text's tokens, cut where the context's end (no BOS: add_special false).
      REQUIRE(joined(r) == tok->encode("The capital of France is Paris."));
      REQUIRE_FALSE(r.continuation.empty());
      REQUIRE(tok->decode(r.continuation).find("Paris.") != std::string::npos);
      // An empty context is the harness's prefix token: BOS, else end-of-text.
      const int32_t prefix = tok->bos_id() >= 0 ? tok->bos_id() : tok->eos_id();
      if (prefix >= 0) {
        const infer::LoglikelihoodRequest e = infer::encode_request("", "Paris", tok.get(), "f:2");
        REQUIRE(e.context == std::vector<int32_t>{prefix});
        REQUIRE(e.continuation == tok->encode("Paris"));
      }
    }
  }
}

TEST_CASE("read_loglikelihood_requests: other keys ride along, lines are counted",
          "[infer][logprob]") {
  std::istringstream in(
      "{\"context\": \"ab\", \"continuation\": \"c\", \"label\": 1}\n\n"
      "{\"continuation\": \"d\", \"context\": \"ab\"}\n");
  const auto requests = infer::read_loglikelihood_requests(in, "q.jsonl", false, nullptr, 256, 16);
  REQUIRE(requests.size() == 2);
  REQUIRE(requests[1].line == 3);
  REQUIRE(requests[1].continuation == io::tokenize_bytes("d"));
  std::istringstream rolling("{\"text\": \"abc\"}\n");
  const auto texts = infer::read_loglikelihood_requests(rolling, "t.jsonl", true, nullptr, 256, 16);
  REQUIRE(texts[0].context.empty());  // no tokenizer, no end-of-text token: "a" is not scored
  REQUIRE(texts[0].continuation == io::tokenize_bytes("abc"));
  std::istringstream one("{\"text\": \"a\"}\n");
  REQUIRE_THAT(test::error_of([&] {
                 infer::read_loglikelihood_requests(one, "t.jsonl", true, nullptr, 256, 16);
               }),
               Catch::Contains("t.jsonl:1: the text is one token"));
}
