// The SVG picture of a trace (see moe/profile/plot.h), drawn with the shared writer
// (moe/profile/svg.h), which sizes the canvas from what is drawn.
// Shape letters: L MoE layers, E experts of a layer, B batches.
#include "moe/profile/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "moe/error.h"
#include "moe/profile/summary.h"
#include "moe/profile/svg.h"

namespace moe::profile {

namespace {

// White -> dark blue for v in [0, 1]; linear in each channel, so a two-stop SVG gradient between
// blue(0) and blue(1) shows exactly the cells' colours.
std::string blue(double v) {
  v = std::clamp(v, 0.0, 1.0);
  auto ch = [&](double lo) { return static_cast<int>(std::lround(255.0 - (255.0 - lo) * v)); };
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", ch(8), ch(48), ch(107));
  return buf;
}

std::string percent(double share) { return svg::format("%.1f%%", 100 * share); }

}  // namespace

std::string plot_svg(const io::TraceReader& trace, const std::string& title) {
  using svg::Anchor;
  const std::vector<LayerSummary> layers = summarize(trace);
  const int64_t L = trace.layers(), B = trace.batches(), Emax = trace.max_experts();
  svg::Document doc;
  doc.text(0, 16, title, {16});
  doc.text(0, 38,
           str("Share of each MoE layer's assignments per expert (", trace.tokens(),
               " tokens, top-", trace.info().top_k, ")"));

  // The heatmap: one row per MoE layer, labelled by its block; its max/mean to the right.
  double label_w = 0, ratio_w = 0;
  for (const LayerSummary& s : layers) {
    label_w = std::max(label_w, svg::text_width(str("block ", s.block), 12));
    ratio_w =
        std::max(ratio_w, svg::text_width("max/mean " + svg::format("%.2f", s.max_over_mean), 12));
  }
  const double cell = std::clamp(720.0 / double(std::max<int64_t>(1, Emax)), 8.0, 40.0);
  const double heat_x = label_w + 8, heat_y = 56, heat_w = cell * double(Emax),
               heat_h = 24.0 * double(L);
  double max_share = 0;
  for (const LayerSummary& s : layers)
    for (int64_t c : s.counts)
      if (s.assignments) max_share = std::max(max_share, double(c) / double(s.assignments));
  for (const LayerSummary& s : layers) {
    const double y = heat_y + 24.0 * double(s.layer);
    doc.text(heat_x - 8, y + 16, str("block ", s.block), {12, Anchor::end});
    for (int64_t e = 0; e < s.experts; ++e) {
      const int64_t count = s.counts[static_cast<size_t>(e)];
      const double share = s.assignments ? double(count) / double(s.assignments) : 0;
      doc.rect(heat_x + cell * double(e), y, cell, 24, blue(max_share > 0 ? share / max_share : 0),
               "#dddddd",
               str("block ", s.block, ", expert ", e, ": ", count, " (", percent(share), ")"));
    }
    doc.text(heat_x + heat_w + 8, y + 16, "max/mean " + svg::format("%.2f", s.max_over_mean));
  }
  for (int64_t e = 0; e < Emax; e += std::max<int64_t>(1, Emax / 16))
    doc.text(heat_x + cell * (double(e) + 0.5), heat_y + heat_h + 16, std::to_string(e),
             {12, Anchor::middle});
  doc.text(heat_x + heat_w / 2, heat_y + heat_h + 34, "expert", {12, Anchor::middle});

  // The colour scale: white = no assignment, darkest = the largest share in the picture.
  const double bar_x = heat_x + heat_w + 8 + ratio_w + 24, bar_h = std::max(heat_h, 100.0);
  doc.gradient_rect(bar_x, heat_y, 14, bar_h, blue(1), blue(0));
  for (double f : {0.0, 0.5, 1.0}) {
    const double y = heat_y + bar_h * (1 - f);
    doc.line(bar_x + 14, y, bar_x + 18, y, "#888888");
    doc.text(bar_x + 21, y + 4, percent(f * max_share));
  }
  doc.text(bar_x, heat_y + bar_h + 18, "share of the layer");

  // Load imbalance over the trace, against the trace's own step numbers (training traces store
  // the optimizer step of each batch; moe-profile record traces number their batches 1..B).
  const std::vector<int64_t> steps = trace.batch_steps();
  const bool by_step =
      !steps.empty() && std::all_of(steps.begin(), steps.end(), [](int64_t s) { return s >= 0; });
  std::vector<double> x(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    x[static_cast<size_t>(b)] = by_step ? double(steps[static_cast<size_t>(b)]) : double(b + 1);
  const std::vector<int64_t> loads = trace.loads();
  svg::LineChart chart;
  chart.title = "Load imbalance over the trace: max/mean of each layer's expert loads per batch";
  chart.x_label = by_step ? "training step" : "batch";
  chart.integer_x = true;
  chart.has_y_floor = true;
  chart.y_floor = 1;
  chart.width = std::max(heat_w + 120, 480.0);
  for (int64_t l = 0; l < L; ++l) {
    const int64_t E = layers[static_cast<size_t>(l)].experts;
    svg::Series s{str("block ", layers[static_cast<size_t>(l)].block),
                  svg::series_stroke(static_cast<size_t>(l)),
                  x,
                  {},
                  false};
    for (int64_t b = 0; b < B; ++b) {
      double sum = 0, mx = 0;
      for (int64_t e = 0; e < E; ++e) {
        const double v = double(loads[static_cast<size_t>((b * L + l) * Emax + e)]);
        sum += v;
        mx = std::max(mx, v);
      }
      s.y.push_back(sum > 0 ? mx / (sum / double(E)) : 1);
    }
    s.markers = B <= 1;
    chart.series.push_back(std::move(s));
  }
  const double chart_y = std::max(heat_y + heat_h + 34, heat_y + bar_h + 18) + 30;
  svg::line_chart(doc, 0, chart_y, chart);
  return doc.finish();
}

}  // namespace moe::profile
