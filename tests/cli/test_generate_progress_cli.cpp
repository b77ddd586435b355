// moe-infer generate's --truncate, --stop and --repeat-penalty, and the progress and summaries of
// long runs (moe-infer score --summary, progress lines of score, moe-profile record and
// moe-distill in moe-train's format), as a user runs them on a model moe-train just trained.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "support/run.h"

using namespace moe;
using nlohmann::json;
using test::lines_of;
using test::run_command;
using test::tool;

namespace {

// A byte-level mixtral (context 16) trained for a few steps, shared by the tests below.
struct Model {
  test::ScratchDir dir{"cli-generate-progress"};
  std::string ckpt = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 20");
  std::string generate(const std::string& args) const {
    return tool("moe-infer", "generate --model " + ckpt + " " + args);
  }
};

Model& model() {
  static Model m;
  return m;
}

std::vector<json> records(const std::string& out) {
  std::vector<json> rows;
  for (const std::string& line : lines_of(out)) rows.push_back(json::parse(line));
  return rows;
}

// `text` as one shell word, with --stop's escapes doubled so the tool reads it back as is.
std::string stop_word(const std::string& text) {
  std::string word = "'";
  for (char c : text) {
    if (c == '\'')
      word += "'\\''";
    else if (c == '\\')
      word += "\\\\";
    else
      word += c;
  }
  return word + "'";
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A progress line as moe-train prints them: rate and ETA, the same number formats.
const std::regex kRateEta(R"(\| [0-9.]+[kM]? tok/s \| ETA [0-9]+:[0-9]{2})");

}  // namespace

TEST_CASE("cli: moe-infer generate --truncate left keeps the prompt's end, says so once",
          "[cli][generate]") {
  Model& m = model();
  const std::string long_prompt = "The quick brown fox jumps over the lazy dog again";  // 49 bytes
  const std::string prompts = m.dir / "long.txt";
  test::write_file(prompts, "Linux\n\n" + long_prompt + "\n" + long_prompt + "!\n");
  // Refused by default (exit 2), naming the line (blank lines counted) and the way out.
  auto refused = run_command(m.generate("--prompts " + prompts + " --max-new 5"));
  REQUIRE(refused.exit_code == 2);
  REQUIRE_THAT(refused.err, Catch::Contains(prompts + ":3: the prompt has 49 tokens") &&
                                Catch::Contains("context is 16") &&
                                Catch::Contains("--truncate left"));
  auto none = run_command(m.generate("--prompts " + prompts + " --max-new 5 --truncate none"));
  REQUIRE(none.exit_code == 2);

  auto cut = run_command(m.generate("--prompts " + prompts + " --max-new 5 --truncate left"));
  INFO(cut.err);
  REQUIRE(cut.exit_code == 0);
  REQUIRE(count(cut.err, "--truncate left") == 1);  // once, for both prompts
  REQUIRE_THAT(cut.err, Catch::Contains("2 prompts") && Catch::Contains(prompts + ":3, 49 -> 11"));
  std::vector<json> rows = records(cut.out);
  REQUIRE(rows.size() == 3);
  REQUIRE(rows[0]["prompt"] == "Linux");
  REQUIRE(rows[0]["prompt_tokens_dropped"] == 0);
  REQUIRE(rows[1]["prompt"] == long_prompt.substr(49 - 11));  // the last 16 - 5 bytes
  REQUIRE(rows[1]["prompt_tokens_dropped"] == 38);
  REQUIRE(rows[2]["prompt"] == (long_prompt + "!").substr(50 - 11));
  for (const json& row : rows) {
    REQUIRE(row["tokens"] == 5);  // room for every new token
    REQUIRE(row["finish_reason"] == "length");
  }
  // The first prompt's output is what it is alone, untruncated.
  test::write_file(m.dir / "short.txt", "Linux\n");
  auto alone = run_command(m.generate("--prompts " + (m.dir / "short.txt") + " --max-new 5"));
  REQUIRE(alone.exit_code == 0);
  REQUIRE(records(alone.out)[0]["completion"] == rows[0]["completion"]);
  // -q silences the notice, not the data.
  auto quiet = run_command(m.generate("--prompts " + prompts + " --max-new 5 --truncate left -q"));
  REQUIRE(quiet.exit_code == 0);
  REQUIRE(quiet.err.empty());
  REQUIRE(quiet.out == cut.out);
  auto bad = run_command(m.generate("--prompts " + prompts + " --truncate right"));
  REQUIRE(bad.exit_code == 2);
  REQUIRE_THAT(bad.err, Catch::Contains("--truncate"));
}

TEST_CASE("cli: moe-infer generate --stop ends at a stop string and leaves it out",
          "[cli][generate]") {
  Model& m = model();
  const std::string prompts = m.dir / "stop.txt";
  test::write_file(prompts, "Linux\nThe\n");
  auto base = run_command(m.generate("--prompts " + prompts + " --max-new 10"));
  INFO(base.err);
  REQUIRE(base.exit_code == 0);
  const std::vector<json> plain = records(base.out);
  REQUIRE(plain.size() == 2);
  // The defaults spelt out change no byte (penalty off, no stop string, no truncation).
  auto spelt = run_command(m.generate("--prompts " + prompts +
                                      " --max-new 10 --repeat-penalty 1 --repeat-last-n 64"
                                      " --truncate none"));
  REQUIRE(spelt.out == base.out);
  for (const json& row : plain) {
    REQUIRE(row["finish_reason"] == "length");
    REQUIRE(row["stop"] == "max_new");
    REQUIRE_FALSE(row.contains("stop_string"));
  }
  // Stop at 3 printable bytes of the first completion (a stop string across token boundaries;
  // from the ids: the JSON text replaces bytes that are not UTF-8).
  const std::vector<int32_t> ids = plain[0]["completion_ids"].get<std::vector<int32_t>>();
  REQUIRE(ids.size() == 10);
  std::string text, stop;
  for (int32_t id : ids) text += static_cast<char>(id);
  for (size_t i = 1; i + 3 <= ids.size() && stop.empty(); ++i)
    if (std::all_of(ids.begin() + long(i), ids.begin() + long(i) + 3,
                    [](int32_t id) { return id >= 32 && id < 127; }))
      stop = text.substr(i, 3);
  INFO("completion " << plain[0]["completion"]);
  REQUIRE(stop.size() == 3);
  const std::string before = text.substr(0, text.find(stop));
  auto stopped = run_command(m.generate("--prompts " + prompts + " --max-new 10 --stop " +
                                        stop_word(stop) + " --stop ZZZQ"));  // never generated
  INFO(stopped.err);
  REQUIRE(stopped.exit_code == 0);
  std::vector<json> rows = records(stopped.out);
  REQUIRE(rows[0]["completion_ids"].get<std::vector<int32_t>>() ==
          std::vector<int32_t>(ids.begin(), ids.begin() + long(before.size())));
  REQUIRE(rows[0]["tokens"] == before.size());
  REQUIRE(rows[0]["finish_reason"] == "stop");
  REQUIRE(rows[0]["stop"] == "stop");
  REQUIRE(rows[0]["stop_string"] == stop);
  const std::string second = plain[1]["completion"].get<std::string>();
  if (second.find(stop) == std::string::npos) REQUIRE(rows[1] == plain[1]);
  // The same from a JSON prompt's "stop" key; it replaces --stop for that prompt only.
  test::write_file(m.dir / "stop.jsonl",
                   json{{"prompt", "Linux"}, {"stop", json::array({stop})}}.dump() + "\nThe\n");
  auto keyed =
      run_command(m.generate("--prompts " + (m.dir / "stop.jsonl") + " --max-new 10 --stop ZZZQ"));
  REQUIRE(keyed.exit_code == 0);
  std::vector<json> from_key = records(keyed.out);
  REQUIRE(from_key[0] == rows[0]);
  REQUIRE(from_key[1] == plain[1]);
  // An empty stop string would end every generation at once.
  auto refused = run_command(m.generate("--prompts " + prompts + " --stop ''"));
  REQUIRE(refused.exit_code == 2);
  REQUIRE_THAT(refused.err, Catch::Contains("stop string is empty"));
}

TEST_CASE("cli: moe-infer generate --repeat-penalty changes greedy output, bad values refused",
          "[cli][generate]") {
  Model& m = model();
  const std::string prompts = m.dir / "repeat.txt";
  test::write_file(prompts, "Linux is\nThe kernel\nA program\n");
  auto base = run_command(m.generate("--prompts " + prompts + " --max-new 12"));
  auto penalised = run_command(
      m.generate("--prompts " + prompts + " --max-new 12 --repeat-penalty 5 --repeat-last-n -1"));
  INFO(penalised.err);
  REQUIRE(base.exit_code == 0);
  REQUIRE(penalised.exit_code == 0);
  REQUIRE(penalised.out != base.out);
  // A window of nothing is off again.
  auto off = run_command(
      m.generate("--prompts " + prompts + " --max-new 12 --repeat-penalty 5 --repeat-last-n 0"));
  REQUIRE(off.out == base.out);
  for (const std::string& flags :
       {std::string("--repeat-penalty 0"), std::string("--repeat-penalty -1"),
        std::string("--repeat-last-n -2"), std::string("--repeat-penalty nan")}) {
    INFO(flags);
    auto r = run_command(m.generate("--prompts " + prompts + " " + flags));
    REQUIRE(r.exit_code == 2);
    REQUIRE_THAT(r.err, Catch::Contains("moe-infer: error: "));
  }
}

TEST_CASE("cli: moe-infer score prints progress with rate and ETA, --summary writes JSON",
          "[cli][progress]") {
  Model& m = model();
  const std::string data = " --data " + test::fortunes_path("linux") + " --max-sequences 40";
  auto r = run_command(tool("moe-infer", "score --model " + m.ckpt + data + " --batch 8"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // Not a terminal: lines for the record, the first batch's and the last one's at least.
  REQUIRE_THAT(r.err,
               Catch::Contains("score 8/40 sequences") && Catch::Contains("score 40/40 sequences"));
  REQUIRE(std::regex_search(r.err, kRateEta));
  double nll = 0;
  for (const json& row : records(r.out)) nll -= row["logprob_sum"].get<double>();
  // --summary under -q: the only output on stderr-less runs, to a file or to stdout.
  const std::string summary = m.dir / "summary.json";
  auto q =
      run_command(tool("moe-infer", "score -q --model " + m.ckpt + data + " --summary " + summary));
  REQUIRE(q.exit_code == 0);
  REQUIRE(q.err.empty());
  REQUIRE(q.out == r.out);
  json s = json::parse(test::read_file(summary));
  REQUIRE(s["sequences"] == 40);
  REQUIRE(s["predicted_tokens"] == 40 * 16);
  REQUIRE(s["logprob_sum"].get<double>() == Approx(-nll).epsilon(1e-12));
  REQUIRE(s["nll_mean"].get<double>() == Approx(nll / (40 * 16)).epsilon(1e-12));
  REQUIRE(s["ppl"].get<double>() == Approx(std::exp(s["nll_mean"].get<double>())));
  REQUIRE(s["tokens_per_s"].get<double>() > 0);
  auto to_stdout = run_command(tool("moe-infer", "score -q --model " + m.ckpt + data +
                                                     " --summary - -o " + (m.dir / "rows.jsonl")));
  REQUIRE(to_stdout.exit_code == 0);
  REQUIRE(json::parse(to_stdout.out)["nll_mean"] == s["nll_mean"]);
  REQUIRE(test::read_file(m.dir / "rows.jsonl") == r.out);
  // Two outputs on stdout are refused before any work.
  auto both = run_command(tool("moe-infer", "score --model " + m.ckpt + data + " --summary -"));
  REQUIRE(both.exit_code == 2);
  REQUIRE(both.out.empty());
  REQUIRE_THAT(both.err, Catch::Contains("-o - and --summary -"));
}

TEST_CASE("cli: moe-profile record prints progress with rate and ETA, -q silences it",
          "[cli][progress]") {
  Model& m = model();
  const std::string args = "record --model " + m.ckpt + " --data " + test::fortunes_path("linux") +
                           " --max-tokens 1024 --batch 16 -o " + (m.dir / "trace.h5");
  auto r = run_command(tool("moe-profile", args));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE_THAT(r.err, Catch::Contains("record 16/64 sequences") &&
                          Catch::Contains("record 64/64 sequences"));
  REQUIRE(std::regex_search(r.err, kRateEta));
  auto q = run_command(tool("moe-profile", args + " -q --force"));  // the same trace again
  REQUIRE(q.exit_code == 0);
  REQUIRE(q.err.empty());
}

TEST_CASE("cli: moe-distill's progress lines read like moe-train's", "[cli][progress]") {
  Model& m = model();
  // step N/M | loss x.xxxx | ... | lr d.dde-ee | <rate> tok/s | ETA m:ss
  const std::regex line(
      R"(^(baseline )?step [0-9]+/[0-9]+ \| loss [0-9]+\.[0-9]{4} (\| [^|]+ )*\| lr [0-9]\.[0-9]{2}e[-+][0-9]{2} \| [0-9.]+[kM]? tok/s \| ETA [0-9]+:[0-9]{2})");
  auto d = run_command(tool("moe-distill", "--teacher " + m.ckpt + " --data " +
                                               test::fortunes_path("linux") + " -o " +
                                               (m.dir / "student") +
                                               " --student-layers 1 --steps 4 --log-every 2"
                                               " --batch 4 --eval-batches 1 --threads 1"
                                               " --baseline"));
  INFO(d.err);
  REQUIRE(d.exit_code == 0);
  size_t distill_lines = 0, baseline_lines = 0;
  for (const std::string& l : lines_of(d.err)) {
    if (l.rfind("step ", 0) == 0) {
      REQUIRE(std::regex_search(l, line));
      REQUIRE_THAT(l, Catch::Contains(" | ce ") && Catch::Contains(" | kd weight "));
      ++distill_lines;
    } else if (l.rfind("baseline step ", 0) == 0) {
      REQUIRE(std::regex_search(l, line));
      ++baseline_lines;
    }
  }
  REQUIRE(distill_lines >= 3);  // steps 1, 2 and 4
  REQUIRE(baseline_lines >= 2);
  REQUIRE_THAT(d.err, Catch::Contains("step 4/4") && Catch::Contains(" | val "));
  auto t = run_command(tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " +
                                             (m.dir / "train") + test::kTinyMixtral +
                                             " --steps 2 --log-every 1"));
  REQUIRE(t.exit_code == 0);
  REQUIRE(t.err.empty());  // kTinyMixtral is -q
  auto loud = run_command(tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " +
                                                (m.dir / "train2") +
                                                " --arch mixtral --layers 2 --d-model 16 --heads 2"
                                                " --kv-heads 1 --d-ff 32 --seq 16 --experts 4"
                                                " --batch 4 --eval-batches 1 --threads 1"
                                                " --steps 2 --log-every 1"));
  INFO(loud.err);
  REQUIRE(loud.exit_code == 0);
  size_t train_lines = 0;
  for (const std::string& l : lines_of(loud.err))
    if (l.rfind("step ", 0) == 0) {
      REQUIRE(std::regex_search(l, line));
      ++train_lines;
    }
  REQUIRE(train_lines == 2);
}
