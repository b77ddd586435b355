// Pictures checked the way a person sees them: an SVG rendered to PNG by librsvg (rsvg-convert,
// Debian librsvg2-bin) and its pixels read back (libpng).
#pragma once
#include <string>

namespace moe::test {

// Renders `svg` inside a transparent margin and returns "" when nothing is painted outside the
// picture's canvas (its root width x height), else a description of what is (how many pixels, the
// first one's place). The document is wrapped in an outer SVG `margin` pixels larger on every
// side, with the picture placed at (margin, margin) and overflow visible, so text that runs past
// the canvas is painted into the margin instead of being clipped. Also checks that the canvas
// itself is painted (an opaque background), so an empty render cannot pass. Throws moe::Error when
// the picture cannot be checked: rsvg-convert missing (install librsvg2-bin: scripts/setup),
// tests built without libpng, no width/height on the root, or a render that fails. Files go to
// `scratch_dir`.
std::string drawn_outside_canvas(const std::string& svg, const std::string& scratch_dir,
                                 int margin = 400);

}  // namespace moe::test
