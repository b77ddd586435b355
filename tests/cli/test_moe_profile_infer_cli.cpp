// moe-profile and moe-infer as a user runs them, on a model moe-train just trained: traces through
// files and pipes, summaries that add up, the plot, scoring equal to training-time evaluation,
// generation, the expert ring giving the same bytes, and the errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moe/io/trace.h"
#include "support/run.h"

using namespace moe;
using test::fields;
using test::lines_of;
using test::run_command;
using test::tool;

namespace {

// A small model trained for a few steps, shared by the tests below (trained once).
struct Trained {
  test::ScratchDir dir{"cli-profile-infer"};
  std::string ckpt, val, trace_train;
  Trained() {
    // Validation file of exactly 12 windows of 16 tokens (+1), so the trainer's evaluation
    // (batch 4, 3 batches) covers every window moe-infer score reads.
    std::string text = test::read_file(test::fortunes_path("linux"));
    val = dir / "val.txt";
    test::write_file(val, text.substr(1000, 12 * 16 + 1));
    trace_train = dir / "train-trace.h5";
    auto r = run_command(tool(
        "moe-train", "--data " + test::fortunes_path("linux") + " --val " + val + " --out " +
                         dir.path() +
                         " --layers 3 --d-model 32 --heads 2 --d-ff 64 --seq 16 --experts 4"
                         " --moe-every 1 --batch 4 --steps 12 --eval-every 0 --eval-batches 3"
                         " --threads 2 -q --metrics " +
                         (dir / "metrics.jsonl") + " --trace " + trace_train + " --trace-every 4"));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    ckpt = dir / "last.h5";
  }
};

Trained& trained() {
  static Trained t;
  return t;
}

}  // namespace

TEST_CASE("cli: moe-train --trace records every --trace-every-th step", "[cli]") {
  Trained& t = trained();
  io::TraceReader trace(t.trace_train);
  REQUIRE(trace.info().source == "train");
  REQUIRE(trace.batches() == 3);  // steps 1, 5, 9 of 12
  REQUIRE(trace.batch_steps() == std::vector<int64_t>{1, 5, 9});
  REQUIRE(trace.tokens() == 3 * 4 * 16);
  REQUIRE(trace.layers() == 3);
  REQUIRE(trace.info().top_k == 2);
}

TEST_CASE("cli: moe-profile record | summary adds up, through files and through a pipe", "[cli]") {
  Trained& t = trained();
  const std::string trace = t.dir / "trace.h5";
  const std::string data = test::fortunes_path("computers");
  auto r = run_command(tool("moe-profile", "record --model " + t.ckpt + " --data " + data +
                                               " --batch 8 --max-tokens 2048 -o " + trace));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  io::TraceReader reader(trace);
  REQUIRE(reader.tokens() == 2048);  // 128 windows of 16 tokens
  REQUIRE(reader.info().source == "record");

  auto s = run_command(tool("moe-profile", "summary " + trace));
  INFO(s.err);
  REQUIRE(s.exit_code == 0);
  std::vector<std::string> rows = lines_of(s.out);
  REQUIRE(rows.size() == 4);  // header + 3 MoE layers
  REQUIRE(fields(rows[0])[0] == "layer");
  for (size_t l = 1; l < rows.size(); ++l) {
    std::vector<std::string> f = fields(rows[l]);
    REQUIRE(f.size() == 12);
    REQUIRE(f[3] == "2048");          // tokens
    REQUIRE(f[4] == "4096");          // assignments, top-2
    REQUIRE(std::stod(f[5]) >= 1.0);  // max/mean
    REQUIRE(std::stod(f[9]) > 0.0);   // entropy_norm
    REQUIRE(std::stod(f[9]) <= 1.0);
  }
  // Per-expert counts add up to the assignments of each layer.
  auto pe = run_command(tool("moe-profile", "summary --per-expert " + trace));
  REQUIRE(pe.exit_code == 0);
  std::vector<int64_t> sums(3, 0);
  for (const std::string& line : lines_of(pe.out)) {
    if (line.rfind("layer", 0) == 0) continue;
    std::vector<std::string> f = fields(line);
    sums[std::stoul(f[0])] += std::stoll(f[3]);
  }
  REQUIRE(sums == std::vector<int64_t>{4096, 4096, 4096});
  // The same through a pipe: record to stdout as an HDF5 image, summary from stdin.
  auto piped = run_command(tool("moe-profile", "record -q --model " + t.ckpt + " --data " + data +
                                                   " --batch 8 --max-tokens 2048 -o -") +
                           " | " + tool("moe-profile", "summary -"));
  INFO(piped.err);
  REQUIRE(piped.exit_code == 0);
  REQUIRE(piped.out == s.out);
  auto js = run_command(tool("moe-profile", "summary --json " + trace));
  REQUIRE(js.exit_code == 0);
  nlohmann::json j = nlohmann::json::parse(js.out);
  REQUIRE(j.size() == 3);
  REQUIRE(j[0]["counts"].size() == 4);
}

TEST_CASE("cli: moe-profile paths, accuracy and plot", "[cli]") {
  Trained& t = trained();
  const std::string fit = t.dir / "fit.h5", held = t.dir / "held.h5";
  for (auto [out, file] :
       {std::pair{fit, std::string("computers")}, std::pair{held, std::string("science")}}) {
    auto r = run_command(tool("moe-profile", "record -q --model " + t.ckpt + " --data " +
                                                 test::fortunes_path(file) +
                                                 " --max-tokens 4096 -o " + out));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  const std::string table = t.dir / "paths.json";
  auto p = run_command(tool("moe-profile", "paths " + fit + " --path-length 2 -o " + table));
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  auto a = run_command(tool("moe-profile", "accuracy " + table + " " + held));
  INFO(a.err);
  REQUIRE(a.exit_code == 0);
  std::vector<std::string> rows = lines_of(a.out);
  REQUIRE(rows.size() == 3);  // header + layers 1 and 2 (layer 0 has no path before it)
  for (size_t i = 1; i < rows.size(); ++i) {
    std::vector<std::string> f = fields(rows[i]);
    REQUIRE(f[0] == std::to_string(i));
    REQUIRE(f[2] == "4096");
    const double acc = std::stod(f[3]), marginal = std::stod(f[4]);
    REQUIRE(acc >= 0.0);
    REQUIRE(acc <= 1.0);
    REQUIRE(marginal >= 0.0);
    REQUIRE(marginal <= 1.0);
  }
  const std::string svg = t.dir / "popularity.svg";
  auto pl = run_command(tool("moe-profile", "plot " + fit + " -o " + svg));
  INFO(pl.err);
  REQUIRE(pl.exit_code == 0);
  std::string doc = test::read_file(svg);
  REQUIRE(doc.rfind("<svg", 0) == 0);
  REQUIRE(doc.find("</svg>") != std::string::npos);
  size_t rects = 0;
  for (size_t at = doc.find("<rect"); at != std::string::npos; at = doc.find("<rect", at + 1))
    ++rects;
  REQUIRE(rects >= 3 * 4 + 1);  // one cell per layer and expert, plus the background

  // Errors: a checkpoint given as a trace; PNG; a table from another model shape.
  auto e1 = run_command(tool("moe-profile", "summary " + t.ckpt));
  REQUIRE(e1.exit_code == 1);
  REQUIRE(e1.err.find("moe-profile: error: ") != std::string::npos);
  REQUIRE(e1.err.find("checkpoint") != std::string::npos);
  auto e2 = run_command(tool("moe-profile", "plot " + fit + " -o " + (t.dir / "x.png")));
  REQUIRE(e2.exit_code == 2);
  auto e3 = run_command(tool("moe-profile", "accuracy " + t.ckpt + " " + held));
  REQUIRE(e3.exit_code == 1);
  REQUIRE(e3.err.find("moe.paths") != std::string::npos);
}

TEST_CASE("cli: moe-infer score equals the training-time evaluation, with or without the ring",
          "[cli]") {
  Trained& t = trained();
  auto r =
      run_command(tool("moe-infer", "score --model " + t.ckpt + " --data " + t.val + " --batch 4"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> rows = lines_of(r.out);
  REQUIRE(rows.size() == 12);
  double sum = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    nlohmann::json j = nlohmann::json::parse(rows[i]);
    REQUIRE(j["index"] == i);
    REQUIRE(j["tokens"] == 16);
    REQUIRE(j["ppl"].get<double>() == Approx(std::exp(j["nll_mean"].get<double>())));
    REQUIRE(j["logprob_sum"].get<double>() == Approx(-16 * j["nll_mean"].get<double>()));
    sum += j["nll_mean"].get<double>();
  }
  // The last metrics line is the final evaluation on the same 12 windows.
  std::vector<std::string> metrics = lines_of(test::read_file(t.dir / "metrics.jsonl"));
  const double val_loss = nlohmann::json::parse(metrics.back())["val_loss"].get<double>();
  REQUIRE(sum / 12 == Approx(val_loss).epsilon(1e-6));
  REQUIRE(r.err.find("nll_mean") != std::string::npos);
  // Streaming the experts through a ring of one layer, or half of them, changes no byte.
  for (const char* budget : {"34%", "50%"}) {
    auto ring = run_command(tool("moe-infer", "score --model " + t.ckpt + " --data " + t.val +
                                                  " --batch 4 --expert-budget " + budget));
    INFO(ring.err);
    REQUIRE(ring.exit_code == 0);
    REQUIRE(ring.out == r.out);
    REQUIRE(ring.err.find("expert ring: compute") != std::string::npos);
  }
}

TEST_CASE("cli: moe-infer generate keeps input order and does not depend on batch or ring",
          "[cli]") {
  Trained& t = trained();
  const std::string prompts = t.dir / "prompts.txt";
  test::write_file(prompts, "The\n{\"prompt\": \"Linux\", \"max_new\": 3}\nA program\n");
  auto base = run_command(tool("moe-infer", "generate --model " + t.ckpt + " --prompts " + prompts +
                                                " --max-new 6 --batch 3"));
  INFO(base.err);
  REQUIRE(base.exit_code == 0);
  std::vector<std::string> rows = lines_of(base.out);
  REQUIRE(rows.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    nlohmann::json j = nlohmann::json::parse(rows[i]);
    REQUIRE(j["index"] == i);
    REQUIRE(j.contains("prompt"));
    REQUIRE(j.contains("completion"));
    REQUIRE(j["tokens"] == (i == 1 ? 3 : 6));  // the context (16) is not reached
    REQUIRE(j["stop"] == "max_new");
  }
  REQUIRE(nlohmann::json::parse(rows[1])["prompt"] == "Linux");
  for (const std::string& extra :
       {std::string(" --batch 1"), std::string(" --batch 3 --expert-budget 34%")}) {
    auto other = run_command(tool("moe-infer", "generate --model " + t.ckpt + " --prompts " +
                                                   prompts + " --max-new 6" + extra));
    INFO(extra << "\n" << other.err);
    REQUIRE(other.exit_code == 0);
    REQUIRE(other.out == base.out);
  }
  // Sampling: the same seed gives the same text, from stdin too.
  const std::string sampled = " --max-new 6 --temperature 0.9 --top-k 20 --top-p 0.95 --seed 5";
  auto s1 = run_command(
      tool("moe-infer", "generate --model " + t.ckpt + " --prompts " + prompts + sampled));
  auto s2 = run_command("cat " + prompts + " | " +
                        tool("moe-infer", "generate --model " + t.ckpt + " --prompts -" + sampled));
  REQUIRE(s1.exit_code == 0);
  REQUIRE(s2.exit_code == 0);
  REQUIRE(s1.out == s2.out);
}

TEST_CASE("cli: moe-infer refuses bad input with a clear message", "[cli]") {
  Trained& t = trained();
  test::write_file(t.dir / "empty.txt", "");
  test::write_file(t.dir / "long.txt", std::string(40, 'x') + "\n");
  struct Case {
    std::string args;
    int code;
    std::string message;
  };
  std::vector<Case> cases = {
      {"generate --model " + t.ckpt + " --prompts " + (t.dir / "empty.txt"), 1, "holds no prompt"},
      {"generate --model " + t.ckpt + " --prompts " + (t.dir / "long.txt"), 2, "context"},
      {"generate --model " + t.ckpt + " --prompts " + (t.dir / "missing.txt"), 1, "missing.txt"},
      {"score --model " + t.ckpt + " --data " + t.val + " --expert-budget 100", 2,
       "smaller than one MoE layer's experts"},
      {"score --model " + t.ckpt + " --data " + t.val + " --expert-budget lots", 2, "lots"},
      {"score --model " + (t.dir / "nope.h5") + " --data " + t.val, 1, "nope.h5"},
      {"score --model " + t.trace_train + " --data " + t.val, 1, "moe.trace"},
      {"score --model " + t.ckpt + " --data " + (t.dir / "empty.txt"), 1, "empty.txt"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    auto r = run_command(tool("moe-infer", c.args));
    INFO(r.err);
    REQUIRE(r.exit_code == c.code);
    REQUIRE(r.err.find("moe-infer: error: ") != std::string::npos);
    REQUIRE(r.err.find(c.message) != std::string::npos);
  }
}
