// The small SVG writer behind moe-profile's pictures (plot, plot-metrics): a document that records
// where everything it draws lies, text included, and sizes its canvas from that, so no label can
// end up outside the picture; and a line chart (axes with round-number ticks, series, legend)
// shared by the pictures.
//
// Text widths are estimated, not measured (no font engine here): per character, from the advance
// widths of DejaVu Sans (the widest of the usual sans-serif fonts, and the first font the
// documents ask for) rounded up, plus 5%. Narrower fonts only leave more room.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace moe::profile::svg {

enum class Anchor { start, middle, end };

struct TextStyle {
  TextStyle(double size_ = 12, Anchor anchor_ = Anchor::start, std::string fill_ = "",
            bool bold_ = false)
      : size(size_), anchor(anchor_), fill(std::move(fill_)), bold(bold_) {}
  double size;
  Anchor anchor;
  std::string fill;  // empty: black
  bool bold;
};

// A generous estimate of the rendered width of `text` (UTF-8) at font size `size`, in pixels.
double text_width(const std::string& text, double size, bool bold = false);
// `text` with <, >, & and " escaped for SVG content and attributes.
std::string escape(const std::string& text);
// printf-style formatting of one number.
std::string format(const char* pattern, double value);
// The colour and dash pattern of series i: ten distinct colours, then the same colours dashed.
struct Stroke {
  std::string color, dash;  // dash empty: solid
};
Stroke series_stroke(size_t i);

struct Box {
  double left = 0, top = 0, right = 0, bottom = 0;
};

class Document {
 public:
  void text(double x, double y, const std::string& text, const TextStyle& style = {});
  // stroke empty: none; title: a tooltip (not drawn, so not counted in the bounds).
  void rect(double x, double y, double width, double height, const std::string& fill,
            const std::string& stroke = "", const std::string& title = "");
  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width = 1,
            const std::string& dash = "");
  void polyline(const std::vector<double>& xs, const std::vector<double>& ys,
                const std::string& stroke, double width = 1.5, const std::string& dash = "");
  void circle(double x, double y, double radius, const std::string& fill);
  // A vertical linear gradient from `top_color` to `bottom_color` filling the rectangle.
  void gradient_rect(double x, double y, double width, double height, const std::string& top_color,
                     const std::string& bottom_color);
  // The bounds of everything drawn so far (text by its estimated extent).
  const Box& bounds() const { return bounds_; }
  // The bounds of what is drawn between begin_group() and the matching end_group() (groups nest).
  void begin_group();
  Box end_group();
  // The whole document: a white canvas of whole pixels holding the bounds plus `padding` on
  // every side (the viewBox starts at the bounds' corner, so negative coordinates are fine).
  std::string finish(double padding = 12) const;

 private:
  void extend(double left, double top, double right, double bottom);
  std::string body_, defs_;
  Box bounds_;
  bool empty_ = true;
  std::vector<std::pair<Box, bool>> groups_;  // open groups: bounds, still empty
  int gradients_ = 0;
};

struct Series {
  std::string label;  // legend text; empty: not in the legend
  Stroke stroke;
  std::vector<double> x, y;  // NaN y: a gap in the line
  bool markers = false;      // a dot on every point (sparse series such as validation loss)
};

struct LineChart {
  std::string title;                 // above the plot area
  std::string x_label;               // below the x tick labels
  double width = 400, height = 200;  // the plot area
  std::vector<Series> series;
  bool legend = true;        // to the right of the plot area, one line per labelled series
  bool integer_x = false;    // x ticks at whole numbers only (steps, batches)
  bool has_y_floor = false;  // the y axis starts at y_floor or below (1 for max/mean)
  double y_floor = 0;
  bool has_x_range = false;  // this x range instead of the data's (aligned panels)
  double x_min = 0, x_max = 0;
};

// Draws `chart` with the top-left corner of its title at (x, y); returns the chart's bounds (title,
// tick labels, legend included), so callers can place the next picture beside or below it.
Box line_chart(Document& doc, double x, double y, const LineChart& chart);

// Round-number ticks (1, 2 or 5 times a power of ten) covering [lo, hi], about `count` of them;
// `integer`: a step of at least 1.
std::vector<double> nice_ticks(double lo, double hi, int count, bool integer = false);
// A tick label: as few digits as the tick spacing needs; exponent form for huge values and for
// spacings below 1e-4.
std::string tick_label(double value, double spacing);

}  // namespace moe::profile::svg
