// Training curves from metrics.jsonl (see moe/profile/curves.h), drawn with the shared SVG writer
// (moe/profile/svg.h).
// Shape letters: S steps of a run, L MoE layers.
#include "moe/profile/curves.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/json_text.h"
#include "moe/error.h"
#include "moe/io/input.h"
#include "moe/profile/svg.h"
#include "moe/settings.h"

namespace moe::profile {

namespace {

constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

// One line's values, NaN where the line has none.
struct Row {
  double loss = kMissing, val_loss = kMissing, lr = kMissing, tokens_per_s = kMissing,
         dropped_fraction = kMissing, grad_norm = kMissing;
  std::vector<double> load;
};

const char* type_of(const nlohmann::json& v) {
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  return "null";
}

Row parse_row(const nlohmann::json& j, const std::string& where) {
  Row row;
  auto number = [&](const char* key, double& out) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    if (!it->is_number())
      throw Error(str(where, ": \"", key, "\" is ", type_of(*it), ", expected a number"));
    out = it->get<double>();
  };
  number("loss", row.loss);
  number("val_loss", row.val_loss);
  number("lr", row.lr);
  number("tokens_per_s", row.tokens_per_s);
  number("dropped_fraction", row.dropped_fraction);
  number("grad_norm", row.grad_norm);
  const auto load = j.find("expert_load_max_over_mean");
  if (load != j.end() && !load->is_null()) {
    if (!load->is_array())
      throw Error(str(where, ": \"expert_load_max_over_mean\" is ", type_of(*load),
                      ", expected a list of numbers (one per MoE layer)"));
    for (const nlohmann::json& v : *load) {
      if (!v.is_number() && !v.is_null())
        throw Error(str(where, ": \"expert_load_max_over_mean\" holds ", type_of(v),
                        ", expected numbers (one per MoE layer)"));
      row.load.push_back(v.is_null() ? kMissing : v.get<double>());
    }
  }
  return row;
}

// The dash pattern of MoE layer l when several runs share the colours.
constexpr size_t kLayerDashes = 5;
const char* layer_dash(size_t l) {
  static const char* dashes[kLayerDashes] = {"", "6 3", "2 2", "8 3 2 3", "1 3"};
  return dashes[l % kLayerDashes];
}

// The y values of one series of a run, with the run's steps as x.
svg::Series series(const MetricsRun& run, const std::vector<double>& y, const std::string& label,
                   svg::Stroke stroke) {
  svg::Series s{label, std::move(stroke), {}, y, false};
  for (int64_t step : run.steps) s.x.push_back(static_cast<double>(step));
  return s;
}

}  // namespace

MetricsRun parse_metrics(const std::string& text, const std::string& name) {
  if (text.empty())
    throw Error(str(name, ": the file is empty (no metrics line; moe-train ",
                    flag_for(Setting::metrics), " writes one every ", flag_for(Setting::log_every),
                    " steps)"));
  std::map<int64_t, Row> rows;  // by step: a step written twice keeps its last line
  size_t layers = 0;
  int64_t first_load_line = 0;
  std::istringstream in(text);
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = str(name, ":", number);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // also a number too large for a double
      throw Error(str(where, ": ", json_error_words(e, true),
                      " (a metrics file holds one JSON object per line)"));
    }
    if (!j.is_object()) throw Error(str(where, ": not a JSON object; expected a metrics line"));
    const auto step = j.find("step");
    if (step == j.end() || !step->is_number_integer() || step->get<int64_t>() < 0)
      throw Error(str(where, ": no integer \"step\" >= 0: not a moe-train or moe-distill ",
                      "metrics line"));
    Row row = parse_row(j, where);
    if (!row.load.empty()) {
      if (first_load_line == 0) {
        layers = row.load.size();
        first_load_line = number;
      } else if (row.load.size() != layers) {
        throw Error(str(where, ": \"expert_load_max_over_mean\" has ", row.load.size(),
                        " MoE layers, line ", first_load_line, " has ", layers,
                        " (two runs in one file?)"));
      }
    }
    rows[step->get<int64_t>()] = std::move(row);
  }
  if (rows.empty()) throw Error(str(name, ": no metrics line, only blank lines"));

  MetricsRun run;
  run.name = name;
  run.load_max_over_mean.resize(layers);
  for (const auto& [step, row] : rows) {
    run.steps.push_back(step);
    run.loss.push_back(row.loss);
    run.val_loss.push_back(row.val_loss);
    run.lr.push_back(row.lr);
    run.tokens_per_s.push_back(row.tokens_per_s);
    run.dropped_fraction.push_back(row.dropped_fraction);
    run.grad_norm.push_back(row.grad_norm);
    for (size_t l = 0; l < layers; ++l)
      run.load_max_over_mean[l].push_back(l < row.load.size() ? row.load[l] : kMissing);
  }
  return run;
}

MetricsRun read_metrics(const std::string& path) {
  if (path == "-") {
    std::string text{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
    if (std::cin.bad()) throw Error("metrics from stdin: read failed");
    return parse_metrics(text, "-");
  }
  io::check_input_file(path, "metrics");  // a directory, device or FIFO: refused by name
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error(str(path, ": cannot open: ", std::strerror(errno)));
  std::string text{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  if (file.bad()) throw Error(str(path, ": read failed: ", std::strerror(errno)));
  return parse_metrics(text, path);
}

std::string plot_metrics_svg(const std::vector<MetricsRun>& runs, const std::string& title) {
  MOE_USAGE_CHECK(!runs.empty(), "plot_metrics_svg: no run to plot");
  svg::Document doc;
  doc.text(0, 16, title, {16});
  // The runs' legend: one colour per run, by the name it was given.
  double x = 0, y = 38;
  for (size_t r = 0; r < runs.size(); ++r) {
    const double w = 28 + svg::text_width(runs[r].name, 12) + 24;
    if (x > 0 && x + w > 900) x = 0, y += 18;  // a new line rather than a very wide picture
    const svg::Stroke stroke = svg::series_stroke(r);
    doc.line(x, y - 4, x + 22, y - 4, stroke.color, 3, stroke.dash);
    doc.text(x + 28, y, runs[r].name);
    x += w;
  }
  // Every panel spans the same steps, so the panels line up.
  int64_t first = std::numeric_limits<int64_t>::max(), last = std::numeric_limits<int64_t>::min();
  for (const MetricsRun& run : runs) {
    first = std::min(first, run.steps.front());
    last = std::max(last, run.steps.back());
  }
  auto panel = [&](const std::string& panel_title) {
    svg::LineChart c;
    c.title = panel_title;
    c.x_label = "step";
    c.width = 380;
    c.height = 170;
    c.integer_x = true;
    c.has_x_range = true;
    c.x_min = static_cast<double>(first);
    c.x_max = static_cast<double>(last);
    c.legend = false;
    return c;
  };
  auto one_per_run = [&](const std::string& panel_title, std::vector<double> MetricsRun::*values) {
    svg::LineChart c = panel(panel_title);
    for (size_t r = 0; r < runs.size(); ++r)
      c.series.push_back(series(runs[r], runs[r].*values, "", svg::series_stroke(r)));
    return c;
  };

  // Loss: training solid, validation (sparser: only the evaluated steps, so the dashes join one
  // evaluation to the next) dashed with a dot per evaluation. The legend shows the two styles,
  // in the run's colour for one run, in grey for several.
  svg::LineChart loss = one_per_run("loss (nats per token)", &MetricsRun::loss);
  loss.legend = true;
  for (size_t r = 0; r < runs.size(); ++r) {
    svg::Series val{"", {svg::series_stroke(r).color, "5 3"}, {}, {}, true};
    for (size_t i = 0; i < runs[r].steps.size(); ++i)
      if (std::isfinite(runs[r].val_loss[i])) {
        val.x.push_back(static_cast<double>(runs[r].steps[i]));
        val.y.push_back(runs[r].val_loss[i]);
      }
    loss.series.push_back(std::move(val));
  }
  const std::string key_color = runs.size() == 1 ? svg::series_stroke(0).color : "#444444";
  loss.series.push_back({"training", {key_color, ""}, {}, {}, false});
  if (std::any_of(loss.series.begin(), loss.series.end(),
                  [](const svg::Series& s) { return s.markers && !s.y.empty(); }))
    loss.series.push_back({"validation", {key_color, "5 3"}, {}, {}, false});

  // Each MoE layer's max/mean load: one colour per layer for one run; for several, the run's
  // colour and one dash pattern per layer (the legend shows the patterns in grey).
  svg::LineChart load = panel("expert load max/mean, per MoE layer");
  load.legend = true;
  load.has_y_floor = true;
  load.y_floor = 1;
  size_t max_layers = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    const size_t L = runs[r].load_max_over_mean.size();
    max_layers = std::max(max_layers, L);
    for (size_t l = 0; l < L; ++l) {
      const bool one = runs.size() == 1;
      load.series.push_back(series(
          runs[r], runs[r].load_max_over_mean[l], one ? str("layer ", l) : "",
          one ? svg::series_stroke(l) : svg::Stroke{svg::series_stroke(r).color, layer_dash(l)}));
    }
  }
  if (runs.size() > 1)
    for (size_t l = 0; l < std::min(max_layers, kLayerDashes); ++l)
      load.series.push_back({l + 1 == kLayerDashes && max_layers > kLayerDashes
                                 ? str("layer ", l, ", ", l + kLayerDashes, ", ...")
                                 : str("layer ", l),
                             {"#444444", layer_dash(l)},
                             {},
                             {},
                             false});

  svg::LineChart dropped =
      one_per_run("dropped fraction (beyond capacity)", &MetricsRun::dropped_fraction);
  dropped.has_y_floor = true;  // 0 to 1 when nothing is dropped (dropless runs)
  dropped.y_floor = 0;
  const std::vector<svg::LineChart> left = {loss, one_per_run("learning rate", &MetricsRun::lr),
                                            dropped};
  const std::vector<svg::LineChart> right = {
      one_per_run("tokens per second", &MetricsRun::tokens_per_s), load,
      one_per_run("gradient norm (before clipping)", &MetricsRun::grad_norm)};
  // Two columns; the second starts after the widest chart of the first (legends included).
  double column_right = 0;
  y += 26;
  std::vector<double> row_y;
  for (const svg::LineChart& c : left) {
    row_y.push_back(y);
    const svg::Box b = svg::line_chart(doc, 0, y, c);
    column_right = std::max(column_right, b.right);
    y = b.bottom + 28;
  }
  for (size_t i = 0; i < right.size(); ++i) {
    const svg::Box b = svg::line_chart(doc, column_right + 40, row_y[i], right[i]);
    if (i + 1 < right.size()) row_y[i + 1] = std::max(row_y[i + 1], b.bottom + 28);
  }
  return doc.finish();
}

}  // namespace moe::profile
