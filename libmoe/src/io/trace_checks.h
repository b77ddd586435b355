// What the trace reader checks in the per-batch datasets, the rules TraceWriter::append enforces
// on what it writes (so a damaged or edited trace is refused, not summarised as "inf").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moe::io {

// loads [rows, L, Emax] of batches first.. first+rows-1: every value >= 0, and 0 for experts beyond
// a layer's E (`experts` [L]). Throws moe::Error "<dataset>: batch b, layer l, expert e: ...".
void check_trace_loads(const std::vector<int64_t>& loads, const std::vector<int64_t>& experts,
                       int64_t Emax, int64_t first, const std::string& dataset);
// dropped [rows, L]: every value >= 0.
void check_trace_dropped(const std::vector<int64_t>& dropped, int64_t L, int64_t first,
                         const std::string& dataset);
// step [rows]: every value >= -1 (-1: not a training step).
void check_trace_steps(const std::vector<int64_t>& steps, int64_t first,
                       const std::string& dataset);

}  // namespace moe::io
