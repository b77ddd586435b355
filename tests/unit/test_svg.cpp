// The SVG writer of moe-profile's pictures (moe/profile/svg.h): round-number ticks and their
// labels, a canvas sized from what is drawn (text included, negative coordinates too), and the
// metrics parser's values (moe/profile/curves.h). The pictures themselves are checked rendered,
// in tests/cli/test_plot_cli.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <regex>

#include "moe/error.h"
#include "moe/profile/curves.h"
#include "moe/profile/svg.h"

using namespace moe::profile;

namespace {

// The viewBox of a finished document: left, top, width, height.
std::vector<double> view_box(const std::string& doc) {
  std::smatch m;
  const std::regex box("viewBox=\"(-?[0-9.]+) (-?[0-9.]+) ([0-9.]+) ([0-9.]+)\"");
  REQUIRE(std::regex_search(doc, m, box));
  return {std::stod(m[1]), std::stod(m[2]), std::stod(m[3]), std::stod(m[4])};
}

}  // namespace

TEST_CASE("svg: ticks at round numbers inside the range, labels with the digits they need",
          "[unit]") {
  CHECK(svg::nice_ticks(1, 551, 6, true) == std::vector<double>{100, 200, 300, 400, 500});
  CHECK(svg::nice_ticks(1, 3, 6, true) == std::vector<double>{1, 2, 3});  // never a half step
  const std::vector<double> fifths = svg::nice_ticks(1.0, 2.0, 5);        // k * 0.2: not exact
  REQUIRE(fifths.size() == 6);
  for (size_t i = 0; i < fifths.size(); ++i) CHECK(fifths[i] == Approx(1.0 + 0.2 * double(i)));
  const std::vector<double> lr = svg::nice_ticks(0, 0.003, 5);
  REQUIRE(lr.size() == 4);
  CHECK(lr[3] == Approx(0.003).epsilon(1e-12));
  // Steps near 2^63 with a range of ten: the loop ends (k + 1 rounds back to k there).
  const std::vector<double> huge = svg::nice_ticks(9.2e18, 9.2e18 + 10, 5, true);
  CHECK(huge.size() <= 100);
  for (size_t i = 1; i < huge.size(); ++i) CHECK(huge[i] > huge[i - 1]);  // no zero spacing
  CHECK(svg::nice_ticks(5, 5, 5) == std::vector<double>{5});

  CHECK(svg::tick_label(0, 1) == "0");
  CHECK(svg::tick_label(150000, 50000) == "150000");
  CHECK(svg::tick_label(2.5, 0.5) == "2.5");
  CHECK(svg::tick_label(0.002, 0.001) == "0.002");
  CHECK(svg::tick_label(0.0035, 5e-4) == "0.0035");
  CHECK(svg::tick_label(3e-5, 1e-5) == "3e-5");
  CHECK(svg::tick_label(1.5e-4, 5e-5) == "1.5e-4");
  CHECK(svg::tick_label(2.5e6, 5e5) == "2.5e6");
  CHECK(svg::tick_label(7, 0) == "7");                 // a single tick
  CHECK(svg::tick_label(0.25, 1e-320) == "2.500e-1");  // a denormal spacing: 3 digits at most
  CHECK(svg::tick_label(9.2e18, 1) == "9.200e18");
}

TEST_CASE("svg: the canvas holds everything drawn, text by its estimated width", "[unit]") {
  // Wider glyphs count for more; every character counts.
  CHECK(svg::text_width("WWWW", 12) > svg::text_width("iiii", 12));
  CHECK(svg::text_width("block 10", 12) > svg::text_width("block 1", 12));
  CHECK(svg::text_width("block 1", 16) > svg::text_width("block 1", 12));
  CHECK(svg::text_width("é", 12) == svg::text_width("W", 12));  // one character, not two bytes

  svg::Document doc;
  doc.rect(0, 0, 100, 50, "#ffffff");
  const std::string label = "a label to the left of everything";
  doc.text(-20, 30, label, {12, svg::Anchor::end});
  doc.text(100, 80, "below and to the right");
  const svg::Box b = doc.bounds();
  CHECK(b.left <= -20 - svg::text_width(label, 12));
  CHECK(b.right >= 100 + svg::text_width("below and to the right", 12));
  CHECK(b.top <= -1);
  CHECK(b.bottom >= 80);
  const std::vector<double> box = view_box(doc.finish(10));
  CHECK(box[0] <= b.left - 10);
  CHECK(box[1] <= b.top - 10);
  CHECK(box[0] + box[2] >= b.right + 10);
  CHECK(box[1] + box[3] >= b.bottom + 10);
  CHECK(box[2] == std::floor(box[2]));  // whole pixels: a partly covered edge would blur
  CHECK(box[3] == std::floor(box[3]));
  // Escaped text (a file name with & or <) stays well-formed.
  svg::Document names;
  names.text(0, 0, "runs/a&b<1>.jsonl");
  CHECK(names.finish().find("runs/a&amp;b&lt;1&gt;.jsonl") != std::string::npos);
}

TEST_CASE("metrics: lines by step, the last of a repeated step, NaN where absent", "[unit]") {
  const MetricsRun run = parse_metrics(
      "{\"step\": 20, \"loss\": 2.0, \"lr\": 0.1, \"expert_load_max_over_mean\": [1.5, 2.5]}\n"
      "\n"
      "{\"step\": 10, \"loss\": 3.0, \"val_loss\": 3.5, \"kd\": null, \"ce\": 1}\r\n"
      "{\"step\": 20, \"loss\": 1.0, \"lr\": null, \"expert_load_max_over_mean\": [1.25, 2.0]}\n",
      "m.jsonl");
  CHECK(run.name == "m.jsonl");
  CHECK(run.steps == std::vector<int64_t>{10, 20});
  CHECK(run.loss == std::vector<double>{3.0, 1.0});
  CHECK(run.val_loss[0] == 3.5);
  CHECK(std::isnan(run.val_loss[1]));
  CHECK(std::isnan(run.lr[0]));
  CHECK(std::isnan(run.lr[1]));  // null: absent
  REQUIRE(run.load_max_over_mean.size() == 2);
  CHECK(std::isnan(run.load_max_over_mean[0][0]));  // step 10 has no loads
  CHECK(run.load_max_over_mean[0][1] == 1.25);
  CHECK(run.load_max_over_mean[1][1] == 2.0);

  auto error = [](const std::string& text) {
    try {
      parse_metrics(text, "m.jsonl");
    } catch (const moe::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(error("").find("m.jsonl: the file is empty") == 0);
  CHECK(error("\n\n").find("m.jsonl: no metrics line") == 0);
  CHECK(error("{\"step\": 1}\n{\"step\": 1.5}\n").find("m.jsonl:2: no integer \"step\"") == 0);
  CHECK(error("{\"step\": -1}\n").find("m.jsonl:1: no integer \"step\"") == 0);
  // A number too large for a double (found by the fuzzer): an error naming the line, no crash.
  CHECK(error("{\"step\": 1, \"loss\": 21e3333333333333}\n").find("m.jsonl:1: invalid JSON") == 0);
  CHECK(error("{\"step\": 1, \"grad_norm\": [1]}\n").find("m.jsonl:1: \"grad_norm\" is a list") ==
        0);
  CHECK(error("{\"step\": 1, \"expert_load_max_over_mean\": 2}\n")
            .find("m.jsonl:1: \"expert_load_max_over_mean\" is a number, expected a list") == 0);
}
