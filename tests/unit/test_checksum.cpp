// CRC32C (moe/checksum.h), the checksum of the SSD expert tier's files: known values, the
// instruction's interleaved chains against the table at every alignment and block count, chaining.
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "moe/checksum.h"

using namespace moe;

namespace {

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> bytes(n);
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(gen());
  return bytes;
}

}  // namespace

TEST_CASE("crc32c: known values, the table and the instruction agree, pieces chain",
          "[core][checksum]") {
  const std::string digits = "123456789";
  CHECK(crc32c(digits.data(), digits.size()) == 0xE3069283u);
  CHECK(detail::crc32c_portable(digits.data(), digits.size()) == 0xE3069283u);
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);  // RFC 3720 B.4
  CHECK(crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  CHECK(crc32c(nullptr, 0) == 0u);

  const std::vector<unsigned char> data = random_bytes(60000, 7);
  // Every alignment and a spread of lengths: the tails shorter than 8 bytes, and one, two and
  // several blocks of the instruction's three interleaved 4096-byte chains, with and without rest.
  for (size_t start : {0, 1, 3, 7, 8}) {
    for (size_t length : {0, 1, 5, 8, 13, 64, 1000, 4991, 12287, 12288, 12289, 24576, 59000}) {
      const uint32_t portable = detail::crc32c_portable(data.data() + start, length);
      CHECK(crc32c(data.data() + start, length) == portable);
      if (detail::crc32c_hardware())
        CHECK(detail::crc32c_sse42(data.data() + start, length) == portable);
    }
  }
  const uint32_t whole = crc32c(data.data(), data.size());
  CHECK(crc32c(data.data() + 1234, data.size() - 1234, crc32c(data.data(), 1234)) == whole);
  std::vector<unsigned char> flipped = data;
  flipped[25000] ^= 1;
  CHECK(crc32c(flipped.data(), flipped.size()) != whole);
}
