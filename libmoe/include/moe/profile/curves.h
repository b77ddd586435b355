// Training curves (moe-profile plot-metrics): the metrics.jsonl that moe-train --metrics and
// moe-distill --metrics write, read back as series over steps, and drawn as one SVG in which
// several runs are overlaid.
//
// Shape letters: S metrics lines (steps) of a run, L MoE layers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moe::profile {

// One run's metrics, one entry per step that has a line, by increasing step. A step written twice
// (a resumed run appends the steps it re-does after its last checkpoint) keeps its last line.
// Values a line does not have, or has as null, are NaN.
struct MetricsRun {
  std::string name;            // the legend's label: the path as given
  std::vector<int64_t> steps;  // [S]
  std::vector<double> loss, val_loss, lr, tokens_per_s, dropped_fraction, grad_norm;  // [S]
  std::vector<std::vector<double>> load_max_over_mean;  // [L][S]; L = 0 for a model without MoE
};

// Parses the text of a metrics file. Every non-blank line must be a JSON object with an integer
// "step" >= 0; the keys above, where present, must be numbers or null (the load a list of them,
// as long on every line); other keys are ignored (moe-distill's ce and kd, a2a_seconds, ...).
// Throws moe::Error naming `name` and the line number for a malformed line, and for text with no
// line at all.
MetricsRun parse_metrics(const std::string& text, const std::string& name);
// Reads and parses the file at `path` ("-": stdin); the run's name is the path.
MetricsRun read_metrics(const std::string& path);

// An SVG document: loss (training and validation), learning rate, tokens/s, each MoE layer's
// max/mean expert load, the dropped fraction and the gradient norm, over steps; one colour per run.
std::string plot_metrics_svg(const std::vector<MetricsRun>& runs, const std::string& title);

}  // namespace moe::profile
