// How idle OpenMP threads wait, set for every tool before the OpenMP runtime reads it.
//
// GNU OpenMP's threads spin at every join and between parallel regions (300,000 polls, about a
// millisecond, unless OMP_WAIT_POLICY or GOMP_SPINCOUNT says otherwise) before they sleep. On a
// CPU shared with other work that is ruinous: a thread that spins waiting for a descheduled team
// mate takes the very core that team mate needs, so each of a step's hundreds of joins costs a
// scheduler time slice. Beside one CPU-bound process the demo trained at 0.06 of its quiet speed.
// Spinning 1,000 polls (microseconds) keeps a quiet machine's joins as fast and gives the core
// away at once on a shared one (docs/PERFORMANCE.md, "A CPU shared with other work"). The user's
// OMP_WAIT_POLICY or GOMP_SPINCOUNT, when set, is kept; the numbers a run computes never depend
// on either.
#pragma once
#include <string>

namespace moe::tools {

// Before anything else runs (the executable's .preinit_array, omp_wait.cpp), a tool started
// with neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT set executes itself again with
// GOMP_SPINCOUNT=1000 added (the OpenMP runtime reads its variables once, in its
// library constructor, before main): about 20 ms more at start on a 2-core Xeon.

// How this process's idle OpenMP threads wait, for -v: "GOMP_SPINCOUNT=1000", the user's
// OMP_WAIT_POLICY, or "the OpenMP runtime's default".
std::string omp_wait_text();

}  // namespace moe::tools
