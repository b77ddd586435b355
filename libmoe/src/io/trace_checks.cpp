#include "io/trace_checks.h"

#include "moe/error.h"

namespace moe::io {

void check_trace_loads(const std::vector<int64_t>& loads, const std::vector<int64_t>& experts,
                       int64_t Emax, int64_t first, const std::string& dataset) {
  const int64_t L = static_cast<int64_t>(experts.size());
  if (L == 0 || Emax == 0) return;
  const int64_t rows = static_cast<int64_t>(loads.size()) / (L * Emax);
  for (int64_t b = 0; b < rows; ++b)
    for (int64_t l = 0; l < L; ++l) {
      const int64_t E = experts[static_cast<size_t>(l)];
      for (int64_t e = 0; e < Emax; ++e) {
        const int64_t v = loads[static_cast<size_t>((b * L + l) * Emax + e)];
        if (v < 0)
          throw Error(str(dataset, ": batch ", first + b, ", layer ", l, ", expert ", e, ": load ",
                          v, " is negative"));
        if (e >= E && v != 0)
          throw Error(str(dataset, ": batch ", first + b, ", layer ", l, ", expert ", e, ": load ",
                          v, " for an expert the layer does not have (/layers/experts gives it ", E,
                          "; entries beyond a layer's E must be 0)"));
      }
    }
}

void check_trace_dropped(const std::vector<int64_t>& dropped, int64_t L, int64_t first,
                         const std::string& dataset) {
  for (size_t i = 0; i < dropped.size(); ++i)
    if (dropped[i] < 0)
      throw Error(str(dataset, ": batch ", first + static_cast<int64_t>(i) / L, ", layer ",
                      static_cast<int64_t>(i) % L, ": ", dropped[i], " dropped is negative"));
}

void check_trace_steps(const std::vector<int64_t>& steps, int64_t first,
                       const std::string& dataset) {
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i] < -1)
      throw Error(str(dataset, ": batch ", first + static_cast<int64_t>(i), ": step ", steps[i],
                      " is negative (-1 means no training step)"));
}

}  // namespace moe::io
