// Prompt files (infer::read_prompts): text and JSON lines, per-prompt sampling settings over the
// defaults, and clear errors naming the file and line.
#include <catch2/catch.hpp>
#include <sstream>

#include "moe/infer/prompts.h"
#include "support/run.h"

using namespace moe;

namespace {

std::vector<infer::Prompt> read(const std::string& text, int64_t vocab = 256) {
  std::istringstream in(text);
  infer::SamplingConfig defaults;
  defaults.max_new = 9;
  defaults.temperature = 0.5;
  return infer::read_prompts(in, "p.jsonl", defaults, vocab);
}

}  // namespace

TEST_CASE("infer: prompt files hold text and JSON lines with their own sampling", "[infer]") {
  auto prompts = read(
      "Hi\r\n{\"prompt\": \"ab\", \"max_new\": 3, \"top_p\": 0.25}\n{\"tokens\": [5, 300], "
      "\"temperature\": 0, \"top_k\": 4}\n",
      512);
  REQUIRE(prompts.size() == 3);
  REQUIRE(prompts[0].text == "Hi");  // the '\r' of a CRLF line is dropped
  REQUIRE(prompts[0].tokens == std::vector<int32_t>{'H', 'i'});
  REQUIRE(prompts[0].sampling.max_new == 9);
  REQUIRE(prompts[1].text == "ab");
  REQUIRE(prompts[1].sampling.max_new == 3);
  REQUIRE(prompts[1].sampling.top_p == 0.25);
  REQUIRE(prompts[1].sampling.temperature == 0.5);
  REQUIRE(prompts[2].tokens == std::vector<int32_t>{5, 300});
  REQUIRE(prompts[2].sampling.temperature == 0);
  REQUIRE(prompts[2].sampling.top_k == 4);
  // Token prompts need no byte-level vocabulary.
  REQUIRE(read("{\"tokens\": [1]}\n", 10).size() == 1);
}

TEST_CASE("infer: blank lines in a prompt file are skipped, and line numbers still count them",
          "[infer]") {
  const std::vector<infer::Prompt> prompts = read("one\n\n  \ntwo\n\n", 256);
  REQUIRE(prompts.size() == 2);
  REQUIRE(prompts[0].text == "one");
  REQUIRE(prompts[1].text == "two");
  REQUIRE_THAT(test::error_of([] { read("ok\n\n{\"prompt\": 3}\n", 256); }),
               Catch::Contains("p.jsonl:3"));
  REQUIRE_THAT(test::error_of([] { read("\n \n", 256); }), Catch::Contains("holds no prompt"));
}

TEST_CASE("infer: bad prompt files name the file, the line and the cause", "[infer]") {
  auto error = [](const std::string& text, int64_t vocab = 256) {
    return test::error_of([&] { read(text, vocab); });
  };
  REQUIRE_THAT(error("ok\n{\"prompt\": 3}\n"),
               Catch::Contains("p.jsonl:2: \"prompt\" must be a string, got number"));
  REQUIRE_THAT(error("{not json\n"), Catch::Contains("p.jsonl:1: invalid JSON at column 3"));
  REQUIRE_THAT(error("text\n", 100), Catch::Contains("byte-level model"));
  REQUIRE_THAT(error("{\"prompt\": \"a\", \"max_tokens\": 5}\n"),
               Catch::Contains("p.jsonl:1: unknown key \"max_tokens\""));
  REQUIRE_THAT(error("{\"tokens\": []}\n"), Catch::Contains("empty prompt"));
  REQUIRE_THAT(error(""), Catch::Contains("holds no prompt"));
  // Every field has its flag's type and range (nlohmann alone truncates -0.5 to 0, and converts
  // 1e300 to an integer with undefined behaviour).
  REQUIRE_THAT(error("{\"tokens\": [5, 300]}\n"),
               Catch::Contains("p.jsonl:1") && Catch::Contains("300 is out of range [0, 255]"));
  REQUIRE_THAT(error("{\"tokens\": [1e300]}\n"), Catch::Contains("must be an integer"));
  REQUIRE_THAT(error("{\"prompt\": \"a\", \"max_new\": -0.5}\n"),
               Catch::Contains("\"max_new\" must be an integer"));
  REQUIRE_THAT(error("{\"prompt\": \"a\", \"max_new\": 1e300}\n"),
               Catch::Contains("\"max_new\" must be an integer"));
  REQUIRE_THAT(error("{\"prompt\": \"a\", \"top_k\": -1}\n"), Catch::Contains("out of range"));
  REQUIRE_THAT(error("{\"prompt\": \"a\", \"top_p\": 0}\n"),
               Catch::Contains("out of range (0, 1]"));
}
