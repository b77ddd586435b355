#include "moe/rng.h"

#include <cmath>

#include "kernels/philox.h"

namespace moe {

uint64_t hash_name(std::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t rng_key(uint64_t seed, std::initializer_list<uint64_t> parts) {
  uint64_t key = splitmix64(seed);
  for (uint64_t p : parts) key = splitmix64(key ^ splitmix64(p));
  return key;
}

float rng_uniform(uint64_t key, uint64_t index) {
  return kernels::uniform_from_bits(kernels::philox4x32(key, index).v[0]);
}

float rng_normal(uint64_t key, uint64_t index) {
  kernels::Philox4 r = kernels::philox4x32(key, index);
  float u1 = kernels::uniform_from_bits(r.v[0]);
  float u2 = kernels::uniform_from_bits(r.v[1]);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
}

uint64_t rng_below(uint64_t key, uint64_t index, uint64_t n) {
  kernels::Philox4 r = kernels::philox4x32(key, index);
  uint64_t bits = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * n) >> 64);
}

}  // namespace moe
