// SVG -> PNG through rsvg-convert, pixels through libpng's simplified API (see support/render.h).
#include "support/render.h"

#include <cmath>
#include <cstdint>
#include <regex>
#include <vector>

#include "moe/error.h"
#include "support/run.h"

#ifdef MOE_TEST_HAVE_PNG
#include <png.h>
#endif

namespace moe::test {

namespace {

// The canvas size (width or height attribute) of the root element, in pixels.
double root_size(const std::string& root, const char* name) {
  std::smatch m;
  const std::regex attribute(std::string("\\s") + name + "=\"([0-9.]+)(px)?\"");
  if (!std::regex_search(root, m, attribute))
    throw Error(str("the SVG's root element has no numeric ", name, ": ", root));
  return std::stod(m[1].str());
}

struct Pixels {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgba;  // [height, width, 4]
};

Pixels read_png(const std::string& path) {
#ifdef MOE_TEST_HAVE_PNG
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str()))
    throw Error(str(path, ": cannot read the PNG: ", image.message));
  image.format = PNG_FORMAT_RGBA;
  Pixels p;
  p.width = image.width;
  p.height = image.height;
  p.rgba.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, p.rgba.data(), 0, nullptr))
    throw Error(str(path, ": cannot decode the PNG: ", image.message));
  return p;
#else
  throw Error(str("cannot read ", path,
                  ": the tests were configured without libpng (install "
                  "libpng-dev: scripts/setup, then reconfigure)"));
#endif
}

}  // namespace

std::string drawn_outside_canvas(const std::string& svg, const std::string& scratch_dir,
                                 int margin) {
  const size_t open = svg.find("<svg");
  const size_t close = open == std::string::npos ? open : svg.find('>', open);
  if (close == std::string::npos) throw Error("not an SVG document: no <svg> element");
  const std::string root = svg.substr(open, close - open);
  const double width = root_size(root, "width"), height = root_size(root, "height");
  const int64_t outer_w = static_cast<int64_t>(std::ceil(width)) + 2 * margin,
                outer_h = static_cast<int64_t>(std::ceil(height)) + 2 * margin;
  // The picture as a nested <svg> at (margin, margin), its own canvas and viewBox unchanged;
  // overflow="visible" paints what lies past its edges instead of clipping it.
  const std::string wrapped = str("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", outer_w,
                                  "\" height=\"", outer_h, "\">\n<svg x=\"", margin, "\" y=\"",
                                  margin, "\" overflow=\"visible\"", svg.substr(open + 4));
  const std::string svg_path = scratch_dir + "/wrapped.svg",
                    png_path = scratch_dir + "/wrapped.png";
  write_file(svg_path, wrapped.substr(0, wrapped.rfind("</svg>")) + "</svg>\n</svg>\n");
  const RunResult which = run_command("command -v rsvg-convert");
  if (which.exit_code != 0)
    throw Error("rsvg-convert not found: install librsvg2-bin (scripts/setup) to check pictures");
  const RunResult render = run_command("rsvg-convert -o " + png_path + " " + svg_path);
  if (render.exit_code != 0)
    throw Error(str("rsvg-convert failed (exit ", render.exit_code, "): ", render.err));
  const Pixels p = read_png(png_path);
  if (p.width != outer_w || p.height != outer_h)
    throw Error(
        str("rsvg-convert drew ", p.width, "x", p.height, ", expected ", outer_w, "x", outer_h));

  const int64_t left = margin, top = margin;
  const int64_t right = margin + static_cast<int64_t>(std::ceil(width)),
                bottom = margin + static_cast<int64_t>(std::ceil(height));
  int64_t outside = 0, bare = 0;
  std::string first;
  for (int64_t y = 0; y < p.height; ++y)
    for (int64_t x = 0; x < p.width; ++x) {
      const uint8_t alpha = p.rgba[static_cast<size_t>((y * p.width + x) * 4 + 3)];
      const bool in_canvas = x >= left && x < right && y >= top && y < bottom;
      // Whole pixels of the canvas only: a fractional edge is partly covered.
      const bool inner = x >= left && x < margin + static_cast<int64_t>(width) && y >= top &&
                         y < margin + static_cast<int64_t>(height);
      if (!in_canvas && alpha != 0) {
        if (outside++ == 0) first = str("(", x - left, ", ", y - top, ") in canvas coordinates");
      }
      if (inner && alpha != 255) ++bare;
    }
  std::string problem;
  if (outside)
    problem = str(outside, " pixels painted outside the ", width, "x", height,
                  " canvas, the first at ", first);
  if (bare)
    problem += str(problem.empty() ? "" : "; ", bare, " pixels of the ", width, "x", height,
                   " canvas left unpainted (no opaque background)");
  return problem;
}

}  // namespace moe::test
