// The picture of a prediction (moe-plan predict --svg, and search --svg for its top layout): the
// step's critical path as one stacked bar, term by term (each segment's width its share of the
// step), what overlap hides beside it, and per memory tier the items a device needs stacked
// against the tier's capacity (a marked line; a tier that does not fit runs past it, in red).
// Drawn with the shared SVG writer (moe/profile/svg.h), which sizes the canvas from what is
// drawn. Every segment carries a tooltip (<title>) naming it and its value.
#pragma once
#include <string>

#include "moe/plan/predict.h"

namespace moe::plan {

// The width in pixels of the step bar and of each tier's bar (its longer of need and capacity).
inline constexpr double kPlanBarWidth = 560;

std::string prediction_svg(const Prediction& p, const std::string& title);

}  // namespace moe::plan
