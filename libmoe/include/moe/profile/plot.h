// A picture of a routing trace (moe/io/trace.h) for people (moe-profile plot).
#pragma once
#include <string>

#include "moe/io/trace.h"

namespace moe::profile {

// An SVG document: a layer x expert heatmap of each expert's share of its layer's assignments,
// and per-batch load imbalance (max/mean) of every layer over the trace.
std::string plot_svg(const io::TraceReader& trace, const std::string& title);

}  // namespace moe::profile
