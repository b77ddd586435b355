#pragma once

namespace moe {
// Threads for BLAS and the OpenMP loops of the CPU backend; 0 keeps the library default.
void set_num_threads(int threads);
int num_threads();
}  // namespace moe
