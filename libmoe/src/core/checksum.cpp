// CRC32C: the crc32 instruction of SSE4.2 when the CPU has it (three interleaved chains), a
// slicing-by-8 table otherwise
// (see moe/checksum.h). The polynomial is 0x1EDC6F41, bit-reflected 0x82F63B78; the value is
// pre- and post-inverted so that chaining over pieces equals one pass over the whole.
#include "moe/checksum.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#include <xmmintrin.h>
#endif

namespace moe {

namespace {

constexpr uint32_t kReflectedPolynomial = 0x82F63B78u;

// table[0] is the byte-at-a-time table; table[k][b] is the CRC of byte b followed by k zero bytes,
// which lets the loop fold 8 bytes per step with 8 independent lookups.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kReflectedPolynomial : 0u);
    t[0][b] = crc;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
  return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

namespace detail {

uint32_t crc32c_portable(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // little-endian hosts only (as every moe file format)
    word ^= crc;
    crc = kTables[7][word & 0xFF] ^ kTables[6][(word >> 8) & 0xFF] ^
          kTables[5][(word >> 16) & 0xFF] ^ kTables[4][(word >> 24) & 0xFF] ^
          kTables[3][(word >> 32) & 0xFF] ^ kTables[2][(word >> 40) & 0xFF] ^
          kTables[1][(word >> 48) & 0xFF] ^ kTables[0][word >> 56];
  }
  for (; bytes > 0; --bytes, ++p) crc = (crc >> 8) ^ kTables[0][(crc ^ *p) & 0xFF];
  return ~crc;
}

#if defined(__x86_64__)
// The instruction has a latency of 3 cycles and a throughput of 1 per cycle: one dependent chain
// runs at a third of its speed. So blocks of 3 * kStream bytes are summed as three independent
// chains and joined: with f(c, s) the register after feeding s to register c, and Z_n the linear
// map "feed n zero bytes", f(c, ABC) = Z_2n(f(c, A)) ^ Z_n(f(0, B)) ^ f(0, C) for |A|=|B|=|C|=n.
constexpr size_t kStream = 4096;

// Z_n on the 32-bit register as four byte-indexed tables (it is linear over GF(2)).
struct ZeroFeed {
  std::array<std::array<uint32_t, 256>, 4> table{};

  explicit ZeroFeed(size_t zeros) {
    uint32_t image[32];
    for (int bit = 0; bit < 32; ++bit) {
      uint32_t c = 1u << bit;
      for (size_t i = 0; i < zeros; ++i) c = (c >> 8) ^ kTables[0][c & 0xFFu];
      image[bit] = c;
    }
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t c = 0;
        for (int bit = 0; bit < 8; ++bit)
          if (b & (1u << bit)) c ^= image[8 * k + bit];
        table[k][b] = c;
      }
  }
  uint32_t operator()(uint32_t c) const {
    return table[0][c & 0xFF] ^ table[1][(c >> 8) & 0xFF] ^ table[2][(c >> 16) & 0xFF] ^
           table[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const void* data, size_t bytes,
                                                        uint32_t crc) {
  static const ZeroFeed feed_one(kStream), feed_two(2 * kStream);
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  for (; bytes >= 3 * kStream; bytes -= 3 * kStream, p += 3 * kStream) {
    uint64_t a = c, b = 0, d = 0;
    // Out of cache the chains wait on memory (13 instead of 29 GB/s over 64 MiB on an AMD EPYC):
    // ask for the next block's lines while this one is summed.
    const bool more = bytes >= 6 * kStream;
    for (size_t i = 0; i < kStream; i += 8) {
      if (more && i % 64 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(p + 3 * kStream + i), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p + 4 * kStream + i), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(p + 5 * kStream + i), _MM_HINT_T0);
      }
      uint64_t wa, wb, wd;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, p + kStream + i, 8);
      std::memcpy(&wd, p + 2 * kStream + i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      d = _mm_crc32_u64(d, wd);
    }
    c = feed_two(static_cast<uint32_t>(a)) ^ feed_one(static_cast<uint32_t>(b)) ^
        static_cast<uint32_t>(d);
  }
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; bytes > 0; --bytes, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

bool crc32c_hardware() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#else
uint32_t crc32c_sse42(const void* data, size_t bytes, uint32_t crc) {
  return crc32c_portable(data, bytes, crc);
}
bool crc32c_hardware() { return false; }
#endif

}  // namespace detail

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
  return detail::crc32c_hardware() ? detail::crc32c_sse42(data, bytes, crc)
                                   : detail::crc32c_portable(data, bytes, crc);
}

}  // namespace moe
