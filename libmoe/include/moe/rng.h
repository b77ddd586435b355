// Counter-based random numbers (Philox4x32-10): a value is a pure function of (key, counter), so
// results never depend on how work is split across threads. Keys are derived from the run seed and
// what the numbers are for (a parameter's name, the step, the layer, the rank).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace moe {

uint64_t hash_name(std::string_view name);  // FNV-1a 64
uint64_t rng_key(uint64_t seed, std::initializer_list<uint64_t> parts);

// Uniform in (0, 1), never 0 or 1.
float rng_uniform(uint64_t key, uint64_t index);
// Standard normal (Box-Muller on one Philox block).
float rng_normal(uint64_t key, uint64_t index);
// Uniform integer in [0, n).
uint64_t rng_below(uint64_t key, uint64_t index, uint64_t n);

}  // namespace moe
