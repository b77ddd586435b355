// The picture of a prediction (moe/plan/plan_svg.h): the step bar, then the memory tiers.
#include "moe/plan/plan_svg.h"

#include <algorithm>

#include "moe/error.h"
#include "moe/profile/svg.h"
#include "plan/report_text.h"

namespace moe::plan {

namespace svg = profile::svg;

namespace {

constexpr double kBarHeight = 28, kRow = 18;

// A legend row: a swatch and its text; returns the next row's y.
double legend_row(svg::Document& doc, double x, double y, const std::string& color,
                  const std::string& text) {
  doc.rect(x, y - 10, 10, 10, color, "#555555");
  doc.text(x + 16, y, text);
  return y + kRow;
}

// The critical path as one stacked bar from (0, y), its legend below; returns the next free y.
double draw_step(svg::Document& doc, double y, const StepTime& t) {
  const std::vector<std::pair<const char*, double>> terms = {
      {"dense compute", t.dense_s},      {"expert compute", t.expert_s},
      {"all-to-all", t.a2a_s},           {"exposed all-reduce", t.allreduce_exposed_s},
      {"ZeRO gathers", t.zero_gather_s}, {"exposed optimizer", t.optimizer_exposed_s},
      {"non-GEMM work", t.non_gemm_s}};
  doc.text(0, y, "Step time, the critical path: " + human_seconds(t.step_s), {13, {}, "", true});
  y += 10;
  double x = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    const double share = t.step_s > 0 ? terms[i].second / t.step_s : 0;
    if (share <= 0) continue;
    const double w = kPlanBarWidth * share;
    doc.rect(
        x, y, w, kBarHeight, svg::series_stroke(i).color, "",
        str(terms[i].first, ": ", human_seconds(terms[i].second), " (", percent_text(share), ")"));
    x += w;
  }
  doc.rect(0, y, kPlanBarWidth, kBarHeight, "", "#333333");  // the outline: the whole step
  y += kBarHeight + 22;
  for (size_t i = 0; i < terms.size(); ++i)
    y = legend_row(doc, 0, y, svg::series_stroke(i).color,
                   str(terms[i].first, ": ", human_seconds(terms[i].second), " (",
                       percent_text(t.step_s > 0 ? terms[i].second / t.step_s : 0), ")"));
  const double hidden_ar = t.allreduce_s - t.allreduce_exposed_s,
               hidden_opt = t.optimizer_s - t.optimizer_exposed_s;
  if (hidden_ar > 0 || hidden_opt > 0)
    doc.text(0, y,
             str("Overlapped with backward, off the path: all-reduce ", human_seconds(hidden_ar),
                 " of ", human_seconds(t.allreduce_s), ", optimizer ", human_seconds(hidden_opt),
                 " of ", human_seconds(t.optimizer_s)),
             {12, {}, "#555555"});
  return y + kRow + 8;
}

// One tier's bar at (x0, y): its items stacked, the capacity marked; the verdict to the right.
void draw_tier(svg::Document& doc, double x0, double y, const MemoryPlan& m, int tier,
               const std::vector<std::pair<const MemoryItem*, std::string>>& items) {
  const double need = m.need[tier], cap = m.capacity[tier], scale = std::max(need, cap);
  doc.text(0, y + 18, kTierNames[tier]);
  double x = x0;
  for (const auto& [item, color] : items) {
    if (item->tier != kTierNames[tier]) continue;
    const double w = kPlanBarWidth * item->bytes / scale;
    doc.rect(x, y, w, kBarHeight, color, "",
             str(item->tier, ": ", item->what, ": ", human_bytes(item->bytes)));
    x += w;
  }
  doc.rect(x0, y, kPlanBarWidth, kBarHeight, "", "#bbbbbb");
  const double cap_x = x0 + kPlanBarWidth * cap / scale;
  if (cap > 0) doc.line(cap_x, y - 5, cap_x, y + kBarHeight + 5, "#000000", 2);
  const bool fits = m.shortfall(tier) <= 0;
  const std::string verdict =
      cap <= 0 ? str("needs ", human_bytes(need), "; the cluster has no ", kTierNames[tier])
      : fits ? str(human_bytes(need), " of ", human_bytes(cap), " (", percent_text(need / cap), ")")
             : str("needs ", human_bytes(need), " of ", human_bytes(cap), ": short by ",
                   human_bytes(m.shortfall(tier)));
  doc.text(x0 + kPlanBarWidth + 10, y + 18, verdict, {12, {}, fits ? "" : "#d62728", !fits});
}

// Every tier a device needs or has, with the items' legend below; returns the next free y.
double draw_memory(svg::Document& doc, double y, const Prediction& p) {
  const MemoryPlan& m = p.memory;
  doc.text(0, y, "Memory per device, by tier, against its capacity (the black line)",
           {13, {}, "", true});
  y += 12;
  std::vector<std::pair<const MemoryItem*, std::string>> items;
  for (const MemoryItem& item : m.items)
    if (item.bytes > 0) items.push_back({&item, svg::series_stroke(items.size()).color});
  double label_w = 0;
  for (const char* name : kTierNames) label_w = std::max(label_w, svg::text_width(name, 12));
  for (int t = 0; t < 3; ++t) {
    if (m.need[t] <= 0 && m.capacity[t] <= 0) continue;
    draw_tier(doc, label_w + 10, y, m, t, items);
    y += kBarHeight + 14;
  }
  if (p.cluster.device_is_host)
    doc.text(0, (y += 4), "device_kind = \"cpu\": device and host are one memory",
             {12, {}, "#555555"});
  y += 22;
  for (const auto& [item, color] : items)
    y = legend_row(doc, 0, y, color,
                   str(item->tier, ": ", item->what, ": ", human_bytes(item->bytes)));
  return y;
}

}  // namespace

std::string prediction_svg(const Prediction& p, const std::string& title) {
  svg::Document doc;
  doc.text(0, 16, title, {16});
  doc.text(
      0, 38,
      str(layout_text(p.layout), " on ", p.cluster.ranks(), " ranks of '", p.cluster.name,
          "': ", p.tokens_per_rank, " tokens per rank, ", human_seconds(p.time.step_s), " a step, ",
          human_count(p.time.tokens_per_s), " tokens/s", p.memory.fits() ? "" : "; does not fit"));
  const double y = draw_step(doc, 72, p.time);
  draw_memory(doc, y + 12, p);
  return doc.finish();
}

}  // namespace moe::plan
