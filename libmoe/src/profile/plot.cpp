// The SVG picture of a trace (see moe/profile/plot.h).
// Shape letters: L MoE layers, E experts of a layer, B batches.
#include "moe/profile/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moe/error.h"
#include "moe/profile/summary.h"

namespace moe::profile {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else
      o += c;
  }
  return o;
}

// White -> dark blue for v in [0, 1].
std::string blue(double v) {
  v = std::clamp(v, 0.0, 1.0);
  auto ch = [&](double lo) { return static_cast<int>(std::lround(255.0 - (255.0 - lo) * v)); };
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", ch(8), ch(48), ch(107));
  return buf;
}

}  // namespace

std::string plot_svg(const io::TraceReader& trace, const std::string& title) {
  const std::vector<LayerSummary> layers = summarize(trace);
  const int64_t L = trace.layers(), B = trace.batches(), Emax = trace.max_experts();
  const double cell = std::clamp(720.0 / double(std::max<int64_t>(1, Emax)), 8.0, 40.0);
  const double left = 90, top = 60, heat_w = cell * double(Emax), heat_h = 24.0 * double(L);
  const double chart_top = top + heat_h + 90, chart_h = 220, chart_w = std::max(heat_w, 480.0);
  const double width = left + std::max(heat_w + 150, chart_w + 40),
               height = chart_top + chart_h + 70;
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << left << "\" y=\"24\" font-size=\"16\">" << escape(title) << "</text>\n";
  o << "<text x=\"" << left << "\" y=\"44\">Share of each MoE layer's assignments per expert ("
    << trace.tokens() << " tokens, top-" << trace.info().top_k << "; darker = more)</text>\n";
  double max_share = 0;
  for (const LayerSummary& s : layers)
    for (int64_t c : s.counts)
      if (s.assignments) max_share = std::max(max_share, double(c) / double(s.assignments));
  for (const LayerSummary& s : layers) {
    const double y = top + 24.0 * double(s.layer);
    o << "<text x=\"" << left - 8 << "\" y=\"" << y + 16 << "\" text-anchor=\"end\">block "
      << s.block << "</text>\n";
    for (int64_t e = 0; e < s.experts; ++e) {
      const double share =
          s.assignments ? double(s.counts[static_cast<size_t>(e)]) / double(s.assignments) : 0;
      o << "<rect x=\"" << left + cell * double(e) << "\" y=\"" << y << "\" width=\"" << cell
        << "\" height=\"24\" fill=\"" << blue(max_share > 0 ? share / max_share : 0)
        << "\" stroke=\"#dddddd\"><title>block " << s.block << ", expert " << e << ": "
        << s.counts[static_cast<size_t>(e)] << " (" << fmt("%.1f", 100 * share)
        << "%)</title></rect>\n";
    }
    o << "<text x=\"" << left + heat_w + 8 << "\" y=\"" << y + 16 << "\">max/mean "
      << fmt("%.2f", s.max_over_mean) << "</text>\n";
  }
  for (int64_t e = 0; e < Emax; e += std::max<int64_t>(1, Emax / 16))
    o << "<text x=\"" << left + cell * (double(e) + 0.5) << "\" y=\"" << top + heat_h + 16
      << "\" text-anchor=\"middle\">" << e << "</text>\n";
  o << "<text x=\"" << left + heat_w / 2 << "\" y=\"" << top + heat_h + 34
    << "\" text-anchor=\"middle\">expert</text>\n";

  // Load imbalance over time: max/mean of each layer's loads per batch.
  o << "<text x=\"" << left << "\" y=\"" << chart_top - 16
    << "\">Load imbalance over the trace: max/mean of each layer's expert loads per batch</text>\n";
  const std::vector<int64_t> loads = trace.loads();
  std::vector<std::vector<double>> ratio(static_cast<size_t>(L));
  double ymax = 1;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t E = layers[static_cast<size_t>(l)].experts;
    for (int64_t b = 0; b < B; ++b) {
      double sum = 0, mx = 0;
      for (int64_t e = 0; e < E; ++e) {
        const double v = double(loads[static_cast<size_t>((b * L + l) * Emax + e)]);
        sum += v;
        mx = std::max(mx, v);
      }
      ratio[static_cast<size_t>(l)].push_back(sum > 0 ? mx / (sum / double(E)) : 1);
      ymax = std::max(ymax, ratio[static_cast<size_t>(l)].back());
    }
  }
  ymax = std::ceil(ymax * 2) / 2;
  auto px = [&](int64_t b) { return left + (B > 1 ? chart_w * double(b) / double(B - 1) : 0.0); };
  auto py = [&](double v) {
    return chart_top + chart_h - chart_h * (v - 1) / std::max(ymax - 1, 1e-9);
  };
  o << "<rect x=\"" << left << "\" y=\"" << chart_top << "\" width=\"" << chart_w << "\" height=\""
    << chart_h << "\" fill=\"none\" stroke=\"#888888\"/>\n";
  for (double v : {1.0, (1 + ymax) / 2, ymax})
    o << "<text x=\"" << left - 6 << "\" y=\"" << py(v) + 4 << "\" text-anchor=\"end\">"
      << fmt("%.2f", v) << "</text>\n";
  o << "<text x=\"" << left + chart_w / 2 << "\" y=\"" << chart_top + chart_h + 20
    << "\" text-anchor=\"middle\">batch (1.." << B << ")</text>\n";
  static const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  for (int64_t l = 0; l < L; ++l) {
    const char* color = colors[l % 10];
    o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
    for (int64_t b = 0; b < B; ++b)
      o << fmt("%.1f", px(b)) << ','
        << fmt("%.1f", py(ratio[static_cast<size_t>(l)][static_cast<size_t>(b)])) << ' ';
    o << "\"/>\n";
    o << "<text x=\"" << left + chart_w + 8 << "\" y=\"" << chart_top + 14 + 16 * double(l)
      << "\" fill=\"" << color << "\">block " << layers[static_cast<size_t>(l)].block
      << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace moe::profile
