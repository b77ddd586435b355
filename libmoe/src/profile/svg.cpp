// The SVG writer and line chart of moe-profile's pictures (see moe/profile/svg.h).
#include "moe/profile/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

namespace moe::profile::svg {

namespace {

// Advance width of one ASCII character in em, rounded up from DejaVu Sans (for example 'a' 0.613,
// digits and '{' 0.636, 'm' 0.974, 'W' 0.989, '%' 0.950, 'i' 0.278, '`' 0.5). The CLI tests render
// every printable character, regular and bold, and check that the estimate covers it.
double char_width(unsigned char c) {
  const auto in = [c](const char* set) { return c != 0 && std::strchr(set, c) != nullptr; };
  if (in("ijlIJ.,:;'!| ")) return 0.42;
  if (in("ftr()[]/\\-\"`")) return 0.50;
  if (in("mwMW%@&")) return 1.0;
  if (in("+<>=^~#*")) return 0.84;
  return c >= 'A' && c <= 'Z' ? 0.80 : 0.66;
}

// Numbers in attributes: two decimals at most, no trailing zeros.
std::string num(double v) {
  std::string s = format("%.2f", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

std::string dash_attr(const std::string& dash) {
  return dash.empty() ? "" : " stroke-dasharray=\"" + dash + "\"";
}

}  // namespace

double text_width(const std::string& text, double size, bool bold) {
  double em = 0;
  for (unsigned char c : text) {
    if (c < 0x80)
      em += char_width(c);
    else if ((c & 0xC0) != 0x80)  // the first byte of a multi-byte character: a wide glyph
      em += 1.0;
  }
  return em * size * 1.05 * (bold ? 1.1 : 1.0);
}

std::string escape(const std::string& text) {
  std::string o;
  for (char c : text) {
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

std::string format(const char* pattern, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, pattern, value);
  return buf;
}

Stroke series_stroke(size_t i) {
  static const char* colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                 "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  static const char* dashes[] = {"", "6 3", "2 2", "8 3 2 3"};
  return {colors[i % 10], dashes[(i / 10) % 4]};
}

void Document::extend(double left, double top, double right, double bottom) {
  auto grow = [&](Box& b, bool& empty) {
    if (empty) {
      b = {left, top, right, bottom};
      empty = false;
      return;
    }
    b.left = std::min(b.left, left);
    b.top = std::min(b.top, top);
    b.right = std::max(b.right, right);
    b.bottom = std::max(b.bottom, bottom);
  };
  grow(bounds_, empty_);
  for (auto& [box, empty] : groups_) grow(box, empty);
}

void Document::begin_group() { groups_.push_back({Box{}, true}); }

Box Document::end_group() {
  const Box b = groups_.back().first;
  groups_.pop_back();
  return b;
}

void Document::text(double x, double y, const std::string& text, const TextStyle& style) {
  const double w = text_width(text, style.size, style.bold);
  const double left = style.anchor == Anchor::start    ? x
                      : style.anchor == Anchor::middle ? x - w / 2
                                                       : x - w;
  // Ascent of accented capitals and descent of g, p, y, with room to spare.
  extend(left, y - 1.0 * style.size, left + w, y + 0.3 * style.size);
  body_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"";
  if (style.size != 12) body_ += " font-size=\"" + num(style.size) + "\"";
  if (style.anchor == Anchor::middle) body_ += " text-anchor=\"middle\"";
  if (style.anchor == Anchor::end) body_ += " text-anchor=\"end\"";
  if (!style.fill.empty()) body_ += " fill=\"" + style.fill + "\"";
  if (style.bold) body_ += " font-weight=\"bold\"";
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "..." + string here.
  body_.append(">").append(escape(text)).append("</text>\n");
}

void Document::rect(double x, double y, double width, double height, const std::string& fill,
                    const std::string& stroke, const std::string& title) {
  extend(x - 1, y - 1, x + width + 1, y + height + 1);
  body_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(width) +
           "\" height=\"" + num(height) + "\" fill=\"" + (fill.empty() ? "none" : fill) + "\"";
  if (!stroke.empty()) body_ += " stroke=\"" + stroke + "\"";
  if (title.empty())
    body_ += "/>\n";
  else
    body_ += "><title>" + escape(title) + "</title></rect>\n";
}

void Document::line(double x1, double y1, double x2, double y2, const std::string& stroke,
                    double width, const std::string& dash) {
  extend(std::min(x1, x2) - width, std::min(y1, y2) - width, std::max(x1, x2) + width,
         std::max(y1, y2) + width);
  body_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" +
           num(y2) + "\" stroke=\"" + stroke + "\" stroke-width=\"" + num(width) + "\"" +
           dash_attr(dash) + "/>\n";
}

void Document::polyline(const std::vector<double>& xs, const std::vector<double>& ys,
                        const std::string& stroke, double width, const std::string& dash) {
  body_ += "<polyline fill=\"none\" stroke=\"" + stroke + "\" stroke-width=\"" + num(width) +
           "\" stroke-linejoin=\"round\"" + dash_attr(dash) + " points=\"";
  for (size_t i = 0; i < xs.size(); ++i) {
    extend(xs[i] - width, ys[i] - width, xs[i] + width, ys[i] + width);
    body_ += num(xs[i]) + "," + num(ys[i]) + (i + 1 < xs.size() ? " " : "");
  }
  body_ += "\"/>\n";
}

void Document::circle(double x, double y, double radius, const std::string& fill) {
  extend(x - radius, y - radius, x + radius, y + radius);
  body_ += "<circle cx=\"" + num(x) + "\" cy=\"" + num(y) + "\" r=\"" + num(radius) + "\" fill=\"" +
           fill + "\"/>\n";
}

void Document::gradient_rect(double x, double y, double width, double height,
                             const std::string& top_color, const std::string& bottom_color) {
  const std::string id = "gradient" + std::to_string(gradients_++);
  defs_ += "<linearGradient id=\"" + id +
           "\" x1=\"0\" y1=\"0\" x2=\"0\" y2=\"1\"><stop offset=\"0\" stop-color=\"" + top_color +
           "\"/><stop offset=\"1\" stop-color=\"" + bottom_color + "\"/></linearGradient>\n";
  rect(x, y, width, height, "url(#" + id + ")", "#888888");
}

std::string Document::finish(double padding) const {
  const double left = std::floor(bounds_.left - padding), top = std::floor(bounds_.top - padding);
  const double width = std::ceil(bounds_.right + padding) - left,
               height = std::ceil(bounds_.bottom + padding) - top;
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) +
                  "\" height=\"" + num(height) + "\" viewBox=\"" + num(left) + " " + num(top) +
                  " " + num(width) + " " + num(height) +
                  "\" font-family=\"DejaVu Sans, Verdana, sans-serif\" font-size=\"12\">\n";
  if (!defs_.empty()) o += "<defs>\n" + defs_ + "</defs>\n";
  o += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(width) +
       "\" height=\"" + num(height) + "\" fill=\"white\"/>\n";
  return o + body_ + "</svg>\n";
}

std::vector<double> nice_ticks(double lo, double hi, int count, bool integer) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  const double raw = (hi - lo) / std::max(1, count);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * magnitude;
  for (double m : {1.0, 2.0, 5.0})
    if (m * magnitude >= raw * (1 - 1e-9)) {
      step = m * magnitude;
      break;
    }
  if (integer) step = std::max(1.0, std::round(step));
  std::vector<double> ticks;
  // Multiples of the step, computed from their index (no accumulated rounding). At most 100:
  // where lo is huge next to the range (steps near 2^63), k + i may round back to k.
  const double first = std::ceil(lo / step - 1e-9);
  for (int i = 0; i < 100 && (first + i) * step <= hi + step * 1e-9; ++i) {
    const double v = (first + i) * step == 0 ? 0.0 : (first + i) * step;
    if (ticks.empty() || v > ticks.back()) ticks.push_back(v);
  }
  return ticks;
}

std::string tick_label(double value, double spacing) {
  if (value == 0) return "0";
  if (!std::isfinite(value)) return format("%g", value);
  const double a = std::fabs(value);
  if (!(spacing > 0) || !std::isfinite(spacing)) spacing = a;  // one tick: its own magnitude
  // Digits are clamped as doubles, before the cast (log10 of a denormal spacing is about -320).
  if (a >= 1e6 || spacing < 1e-4) {  // 0.0035 still reads well; 0.00035 less so
    const double digits =
        std::clamp(std::floor(std::log10(a)) - std::floor(std::log10(spacing) + 1e-9), 0.0, 3.0);
    const std::string s =
        format(("%." + std::to_string(static_cast<int>(digits)) + "e").c_str(), value);
    // 3.0e-04 -> 3.0e-4: the exponent without its padding.
    const size_t e = s.find('e');
    return s.substr(0, e) + "e" + std::to_string(std::stoi(s.substr(e + 1)));
  }
  const double decimals = std::clamp(-std::floor(std::log10(spacing) + 1e-9), 0.0, 4.0);
  return format(("%." + std::to_string(static_cast<int>(decimals)) + "f").c_str(), value);
}

Box line_chart(Document& doc, double x, double y, const LineChart& chart) {
  doc.begin_group();
  constexpr double inf = std::numeric_limits<double>::infinity();
  double xlo = inf, xhi = -inf, ylo = inf, yhi = -inf;
  for (const Series& s : chart.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        xlo = std::min(xlo, s.x[i]);
        xhi = std::max(xhi, s.x[i]);
        ylo = std::min(ylo, s.y[i]);
        yhi = std::max(yhi, s.y[i]);
      }
  const bool any = ylo <= yhi;
  if (!any) xlo = ylo = 0, xhi = yhi = 1;
  if (chart.has_x_range) xlo = chart.x_min, xhi = chart.x_max;
  if (chart.has_y_floor) ylo = std::min(ylo, chart.y_floor);
  if (!(xhi > xlo)) xlo -= 1, xhi += 1;
  if (!(yhi > ylo)) {
    const double d = ylo == 0 ? 1 : std::fabs(ylo) * 0.1;
    ylo -= chart.has_y_floor && ylo == chart.y_floor ? 0 : d;
    yhi += d;
  }
  // The y axis runs from tick to tick; the x axis covers the data exactly.
  std::vector<double> yticks = nice_ticks(ylo, yhi, 5);
  const double ystep = yticks.size() > 1 ? yticks[1] - yticks[0] : yhi - ylo;
  ylo = std::min(ylo, std::floor(ylo / ystep + 1e-9) * ystep);
  yhi = std::max(yhi, std::ceil(yhi / ystep - 1e-9) * ystep);
  yticks = nice_ticks(ylo, yhi, 5);

  double label_w = 0;
  for (double t : yticks) label_w = std::max(label_w, text_width(tick_label(t, ystep), 12));
  const double left = x + label_w + 10, top = y + 26, right = left + chart.width,
               bottom = top + chart.height;
  auto px = [&](double v) { return left + chart.width * (v - xlo) / (xhi - xlo); };
  auto py = [&](double v) { return bottom - chart.height * (v - ylo) / (yhi - ylo); };

  doc.text(x, y + 14, chart.title, {13, Anchor::start, "", true});
  for (double t : yticks) {
    doc.line(left, py(t), right, py(t), "#e4e4e4");
    doc.text(left - 6, py(t) + 4, tick_label(t, ystep), {12, Anchor::end});
  }
  // Fewer x ticks until their labels no longer touch.
  std::vector<double> xticks;
  for (int count = 6; count >= 1; count /= 2) {
    xticks = nice_ticks(xlo, xhi, count, chart.integer_x);
    const double spacing = xticks.size() > 1 ? px(xticks[1]) - px(xticks[0]) : chart.width;
    double widest = 0;
    for (double t : xticks)
      widest = std::max(
          widest, text_width(tick_label(t, xticks.size() > 1 ? xticks[1] - xticks[0] : 1), 12));
    if (widest + 8 <= spacing || count == 1) break;
  }
  const double xstep = xticks.size() > 1 ? xticks[1] - xticks[0] : 1;
  for (double t : xticks) {
    doc.line(px(t), bottom, px(t), bottom + 4, "#888888");
    doc.text(px(t), bottom + 17, tick_label(t, xstep), {12, Anchor::middle});
  }
  doc.rect(left, top, chart.width, chart.height, "", "#888888");
  if (!chart.x_label.empty())
    doc.text((left + right) / 2, bottom + 35, chart.x_label, {12, Anchor::middle});
  if (!any)
    doc.text((left + right) / 2, (top + bottom) / 2, "no values", {12, Anchor::middle, "#888888"});

  for (const Series& s : chart.series) {
    std::vector<double> xs, ys;
    auto flush = [&] {
      if (xs.size() == 1) doc.circle(xs[0], ys[0], 2.5, s.stroke.color);
      if (xs.size() > 1) doc.polyline(xs, ys, s.stroke.color, 1.5, s.stroke.dash);
      xs.clear();
      ys.clear();
    };
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        flush();
        continue;
      }
      xs.push_back(px(s.x[i]));
      ys.push_back(py(s.y[i]));
      if (s.markers) doc.circle(xs.back(), ys.back(), 2.5, s.stroke.color);
    }
    flush();
  }
  if (chart.legend) {
    double row = top + 10;
    for (const Series& s : chart.series) {
      if (s.label.empty()) continue;
      doc.line(right + 12, row - 4, right + 34, row - 4, s.stroke.color, 2, s.stroke.dash);
      doc.text(right + 40, row, s.label);
      row += 17;
    }
  }
  return doc.end_group();
}

}  // namespace moe::profile::svg
