// moe-profile's pictures as a person sees them: `plot` of a training trace and of a recorded one,
// `plot-metrics` of one run and of runs overlaid, and scripts/demo's pictures, each rendered to
// PNG by librsvg (support/render.h) with nothing painted past the canvas; the colour bar and the
// trace's step numbers; plot-metrics' refusals (file and line named, exit 1; usage, exit 2). The
// render check itself is tested first: it sees text past the edge, and the text width estimate
// covers every printable character as librsvg draws it.
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "moe/io/trace.h"
#include "moe/profile/svg.h"
#include "support/render.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

// Two tiny training runs (0.3 s each): the first traced every 50 steps (steps 1, 51, ..., 551),
// both with metrics; the second has 3 MoE layers, capacity drops and evaluations every 50 steps.
struct Runs {
  test::ScratchDir dir{"cli-plot"};
  std::string trace, metrics, metrics2;
  Runs() {
    trace = dir / "a/trace.h5";
    metrics = dir / "a/metrics.jsonl";
    metrics2 = dir / "b/metrics.jsonl";
    test::train_on_fortunes(dir / "a", test::kTinyMixtral + " --steps 560 --eval-every 100" +
                                           " --trace " + trace + " --trace-every 50" +
                                           " --metrics " + metrics);
    test::train_on_fortunes(dir / "b",
                            " --arch mixtral --layers 3 --d-model 16 --heads 2 --kv-heads 1"
                            " --d-ff 32 --seq 16 --experts 4 --moe-every 1 --batch 4"
                            " --eval-batches 1 --threads 1 -q --steps 300 --eval-every 50"
                            " --capacity-factor 1.0 --lr 1e-3 --metrics " +
                                metrics2);
  }
};

Runs& runs() {
  static Runs r;
  return r;
}

// The text of every <text> element, entities decoded.
std::vector<std::string> texts_of(const std::string& svg) {
  std::vector<std::string> out;
  const std::regex text("<text[^>]*>([^<]*)</text>");
  for (std::sregex_iterator it(svg.begin(), svg.end(), text), end; it != end; ++it) {
    std::string s = (*it)[1].str();
    for (auto [entity, c] :
         {std::pair{"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&amp;", "&"}})
      for (size_t at; (at = s.find(entity)) != std::string::npos;)
        s.replace(at, std::string(entity).size(), c);
    out.push_back(s);
  }
  return out;
}

bool has_text(const std::vector<std::string>& texts, const std::string& s) {
  return std::find(texts.begin(), texts.end(), s) != texts.end();
}

// The number of points of every <polyline>.
std::vector<size_t> polyline_sizes(const std::string& svg) {
  std::vector<size_t> out;
  const std::regex points("<polyline[^>]* points=\"([^\"]*)\"");
  for (std::sregex_iterator it(svg.begin(), svg.end(), points), end; it != end; ++it) {
    const std::string p = (*it)[1].str();
    out.push_back(static_cast<size_t>(std::count(p.begin(), p.end(), ',')));
  }
  return out;
}

size_t lines_in(const std::string& path) { return test::lines_of(test::read_file(path)).size(); }

}  // namespace

TEST_CASE("render check: text past the canvas is seen, a picture that fits passes", "[cli]") {
  test::ScratchDir dir("cli-render-check");
  const std::string fits =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"200\" height=\"40\" font-size=\"12\">"
      "<rect width=\"200\" height=\"40\" fill=\"white\"/><text x=\"10\" y=\"20\">block 0</text>"
      "</svg>\n";
  CHECK(test::drawn_outside_canvas(fits, dir.path()) == "");
  // The shape of today's legend: a label starting 30 pixels before the right edge.
  std::string cut = fits;
  cut.replace(cut.find("x=\"10\""), 6, "x=\"170\"");
  const std::string problem = test::drawn_outside_canvas(cut, dir.path());
  INFO(problem);
  CHECK(problem.find("painted outside the 200x40 canvas") != std::string::npos);
  // No background: an empty render cannot pass.
  std::string bare = fits;
  bare.replace(bare.find("<rect"), bare.find("/>", bare.find("<rect")) + 2 - bare.find("<rect"),
               "");
  CHECK(test::drawn_outside_canvas(bare, dir.path()).find("unpainted") != std::string::npos);
}

TEST_CASE("render check: the text width estimate covers every printable character as rendered",
          "[cli]") {
  // One row of 40 copies per character (so a shortfall of 1% is 3 pixels), at the sizes and
  // weights the pictures use. Each row starts where its estimated width makes it end at x = 0, so
  // a row wider than its estimate runs past the right edge of the canvas (1 pixel of padding).
  test::ScratchDir dir("cli-text-width");
  profile::svg::Document doc;
  double y = 0;
  auto row = [&](const std::string& text, double size, bool bold) {
    y += size * 1.5;
    doc.text(-profile::svg::text_width(text, size, bold), y, text,
             {size, profile::svg::Anchor::start, "", bold});
  };
  for (auto [size, bold] : {std::pair{12.0, false}, {13.0, true}, {16.0, false}})
    for (char c = '!'; c <= '~'; ++c) row(std::string(40, c), size, bold);
  row("moe-profile: runs/2024-05-01_lr=3e-4 (top-2) 100% {WWW} `mmm` ~~~", 16, true);
  CHECK(test::drawn_outside_canvas(doc.finish(1), dir.path(), 100) == "");
}

TEST_CASE(
    "cli: moe-profile plot of a training trace: every label inside the picture, a colour bar,"
    " the trace's step numbers",
    "[cli]") {
  Runs& r = runs();
  REQUIRE(io::TraceReader(r.trace).batch_steps() ==
          std::vector<int64_t>{1, 51, 101, 151, 201, 251, 301, 351, 401, 451, 501, 551});
  const std::string svg_path = r.dir / "popularity.svg";
  auto p = run_command(tool("moe-profile", "plot " + r.trace + " -o " + svg_path));
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  const std::string svg = test::read_file(svg_path);
  CHECK(test::drawn_outside_canvas(svg, r.dir.path()) == "");
  const std::vector<std::string> texts = texts_of(svg);
  // The x axis: training steps, ticks at round step numbers up to 500 (not "batch (1..12)").
  CHECK(has_text(texts, "training step"));
  for (const char* tick : {"100", "200", "300", "400", "500"}) CHECK(has_text(texts, tick));
  for (const std::string& t : texts) CHECK(t.find("batch (") == std::string::npos);
  // A legend entry per MoE layer, and a line of 12 points per layer.
  CHECK(has_text(texts, "block 0"));
  CHECK(has_text(texts, "block 1"));
  CHECK(polyline_sizes(svg) == std::vector<size_t>{12, 12});
  // The colour bar: a gradient from 0% to the largest share of any expert, which summary prints.
  CHECK(svg.find("<linearGradient") != std::string::npos);
  CHECK(has_text(texts, "0.0%"));
  auto s = run_command(tool("moe-profile", "summary --per-expert " + r.trace));
  REQUIRE(s.exit_code == 0);
  double max_share = 0;
  for (const std::string& line : test::lines_of(s.out))
    if (line.rfind("layer", 0) != 0)
      max_share = std::max(max_share, std::stod(test::fields(line)[4]));
  char top[32];
  std::snprintf(top, sizeof top, "%.1f%%", 100 * max_share);
  CHECK(has_text(texts, top));
  // -o - writes the same picture to stdout.
  auto out = run_command(tool("moe-profile", "plot " + r.trace + " -o - -q"));
  REQUIRE(out.exit_code == 0);
  CHECK(out.out == svg);
}

TEST_CASE("cli: moe-profile plot of a recorded trace, of many experts and of a long name fits",
          "[cli]") {
  Runs& r = runs();
  // A trace from moe-profile record: its batches are numbered, it has no steps.
  const std::string recorded = r.dir / "recorded.h5";
  auto rec = run_command(tool("moe-profile", "record -q --model " + (r.dir / "a") + " --data " +
                                                 test::fortunes_path("computers") +
                                                 " --max-tokens 1024 -o " + recorded));
  INFO(rec.err);
  REQUIRE(rec.exit_code == 0);
  auto p = run_command(tool("moe-profile", "plot " + recorded + " -o -"));
  REQUIRE(p.exit_code == 0);
  CHECK(test::drawn_outside_canvas(p.out, r.dir.path()) == "");
  CHECK(has_text(texts_of(p.out), "batch"));

  // 6 layers of 64 experts (the widest heatmap cells get), steps in the hundred thousands, and a
  // long file name in the title.
  const std::string wide =
      r.dir /
      "a-routing-trace-with-a-name-as-long-as-the-ones-people-give-their-runs-on-shared-"
      "clusters-step-100000.h5";
  {
    io::TraceInfo info;
    info.model_config = nlohmann::json::object();
    info.top_k = 2;
    info.moe_blocks = {0, 1, 2, 3, 4, 5};
    info.experts = std::vector<int64_t>(6, 64);
    info.source = "train";
    io::TraceWriter writer(wide, info);
    for (int64_t b = 0; b < 5; ++b) {
      io::TraceBatch batch;
      batch.step = 100000 + 25000 * b;
      for (int64_t t = 0; t < 64; ++t) {
        batch.token_ids.push_back(static_cast<int32_t>(t));
        for (int64_t l = 0; l < 6; ++l) {
          // Skewed towards low expert ids, more so in later layers and batches; two distinct
          // choices.
          const int64_t first = (t + l * b) % (64 - 8 * l - b);
          for (int64_t e : {first, (first + 1 + t % 5) % 64}) {
            batch.experts.push_back(static_cast<int32_t>(e));
            batch.gates.push_back(0.5f);
          }
        }
      }
      batch.loads.assign(6 * 64, 0);
      for (size_t i = 0; i < batch.experts.size(); ++i)
        ++batch.loads[static_cast<size_t>(static_cast<int64_t>(i / 2 % 6) * 64 + batch.experts[i])];
      batch.dropped.assign(6, 0);
      writer.append(batch);
    }
    writer.close();
  }
  auto w = run_command(tool("moe-profile", "plot " + wide + " -o -"));
  INFO(w.err);
  REQUIRE(w.exit_code == 0);
  CHECK(test::drawn_outside_canvas(w.out, r.dir.path()) == "");
  const std::vector<std::string> texts = texts_of(w.out);
  CHECK(has_text(texts, "moe-profile: " + wide));
  CHECK(has_text(texts, "block 5"));
}

TEST_CASE("cli: moe-profile plot-metrics draws a run's curves, and runs overlaid", "[cli]") {
  Runs& r = runs();
  const std::string one = r.dir / "curves.svg";
  auto p = run_command(tool("moe-profile", "plot-metrics " + r.metrics + " -o " + one));
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  const std::string svg = test::read_file(one);
  CHECK(test::drawn_outside_canvas(svg, r.dir.path()) == "");
  std::vector<std::string> texts = texts_of(svg);
  CHECK(has_text(texts, r.metrics));  // the run's legend: its path
  for (const char* panel :
       {"loss (nats per token)", "learning rate", "tokens per second",
        "expert load max/mean, per MoE layer", "dropped fraction (beyond capacity)",
        "gradient norm (before clipping)", "training", "validation", "layer 0", "layer 1"})
    CHECK(has_text(texts, panel));
  // Steps 10, 20, ..., 560: the training loss, lr, tokens/s, two load lines, dropped fraction and
  // gradient norm have a point per line; validation (steps 100, ..., 500 and the last) one per
  // evaluation.
  const size_t S = lines_in(r.metrics);
  REQUIRE(S == 56);
  CHECK(polyline_sizes(svg) == std::vector<size_t>{S, 6, S, S, S, S, S, S});

  // Two runs overlaid (2 and 3 MoE layers): both in the legend, the picture still fits; the same
  // bytes through stdout, and with the first file from stdin.
  auto two =
      run_command(tool("moe-profile", "plot-metrics " + r.metrics + " " + r.metrics2 + " -o -"));
  INFO(two.err);
  REQUIRE(two.exit_code == 0);
  CHECK(test::drawn_outside_canvas(two.out, r.dir.path()) == "");
  texts = texts_of(two.out);
  CHECK(has_text(texts, r.metrics));
  CHECK(has_text(texts, r.metrics2));
  CHECK(has_text(texts, "layer 2"));
  const size_t S2 = lines_in(r.metrics2);
  const std::vector<size_t> sizes = polyline_sizes(two.out);
  REQUIRE(S2 == 30);
  CHECK(std::count(sizes.begin(), sizes.end(), S2) == 5 + 3);  // 5 curves, 3 load lines
  auto piped = run_command("cat " + r.metrics2 + " | " +
                           tool("moe-profile", "plot-metrics " + r.metrics + " - -o -"));
  INFO(piped.err);
  REQUIRE(piped.exit_code == 0);
  CHECK(has_text(texts_of(piped.out), "-"));  // stdin's run, by its name
  CHECK(polyline_sizes(piped.out) == sizes);
}

TEST_CASE("cli: moe-profile plot-metrics refuses what is not a metrics file", "[cli]") {
  Runs& r = runs();
  const std::string good = test::read_file(r.metrics), out = r.dir / "bad.svg";
  auto refused = [&](const std::string& name, const std::string& text, const std::string& says) {
    const std::string path = r.dir / name;
    test::write_file(path, text);
    auto p =
        run_command(tool("moe-profile", "plot-metrics " + r.metrics + " " + path + " -o " + out));
    INFO(name << ": " << p.err);
    CHECK(p.exit_code == 1);
    CHECK(p.err.find("moe-profile: error: " + path + says) != std::string::npos);
    CHECK(p.out.empty());
    CHECK_FALSE(std::filesystem::exists(out));
  };
  const std::vector<std::string> lines = test::lines_of(good);
  refused("empty.jsonl", "", ": the file is empty");
  refused("blank.jsonl", "\n  \n\n", ": no metrics line");
  refused("cut.jsonl", lines[0] + "\n" + lines[1] + "\n" + lines[2].substr(0, 40) + "\n",
          ":3: invalid JSON at column 41");
  refused("array.jsonl", lines[0] + "\n[1, 2]\n", ":2: not a JSON object");
  refused("scores.jsonl", "{\"tokens\": 16, \"loss\": 2.5}\n", ":1: no integer \"step\"");
  refused("text-loss.jsonl", "{\"step\": 1, \"loss\": \"2.5\"}\n",
          ":1: \"loss\" is a string, expected a number");
  refused("two-models.jsonl",
          lines[0] + "\n" + test::lines_of(test::read_file(r.metrics2))[0] + "\n",
          ":2: \"expert_load_max_over_mean\" has 3 MoE layers, line 1 has 2");
  auto missing =
      run_command(tool("moe-profile", "plot-metrics " + (r.dir / "nope.jsonl") + " -o " + out));
  CHECK(missing.exit_code == 1);
  CHECK(missing.err.find("nope.jsonl: cannot open") != std::string::npos);

  // Usage (exit 2): not an .svg, no -o, no file, stdin twice.
  for (const std::string& args : {r.metrics + " -o " + (r.dir / "curves.png"), r.metrics,
                                  std::string("-o ") + out, std::string("- - -o -")}) {
    auto p = run_command(tool("moe-profile", "plot-metrics " + args));
    INFO(args << ": " << p.err);
    CHECK(p.exit_code == 2);
    CHECK(p.out.empty());
  }
  // A resumed run's metrics (steps re-done after the last checkpoint appended again) plot the
  // last value written for each step, in step order.
  const std::string resumed = r.dir / "resumed.jsonl";
  test::write_file(resumed, lines[0] + "\n" + lines[1] + "\n" + lines[2] + "\n" + lines[1] + "\n" +
                                lines[2] + "\n" + lines[3] + "\n");
  auto p = run_command(tool("moe-profile", "plot-metrics " + resumed + " -o -"));
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  CHECK(polyline_sizes(p.out).front() == 4);
}

TEST_CASE("cli: scripts/demo draws the training curves next to its other outputs", "[cli]") {
  test::ScratchDir dir("cli-demo");
  // The demo with the tools built here (no setup, no build), a tiny model and 30 steps.
  const std::string command =
      "cd " MOE_TEST_SOURCE_DIR " && MOE_BIN_DIR=" + test::tool_path("") +
      " DEMO_DIR=" + dir.path() +
      " DEMO_STEPS=30 bash scripts/demo --layers 4 --d-model 16 --heads 2 --d-ff 32 --seq 128"
      " --experts 4 --batch 4 --eval-batches 1 --threads 1 -q";
  auto d = run_command(command);
  INFO(d.err);
  REQUIRE(d.exit_code == 0);
  CHECK(d.out.find("demo: training curves (loss, lr, tokens/s, expert load) in " +
                   (dir / "curves.svg")) != std::string::npos);
  for (const char* picture : {"curves.svg", "popularity.svg"}) {
    INFO(picture);
    CHECK(test::drawn_outside_canvas(test::read_file(dir / picture), dir.path()) == "");
  }
  CHECK(polyline_sizes(test::read_file(dir / "curves.svg")).front() ==
        lines_in(dir / "metrics.jsonl"));
}
