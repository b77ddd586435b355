// offload::check_block_scales, the one check of a quantised weight's block scales that the resident
// loader (infer::load_model) and the expert stores (offload::put_expert) share: a damaged scale is
// named by row and block with its value, and the expert stores name a negative Q8_0 scale by its
// value as the loader does. Shapes: out rows of `in` elements, blocks of 32 (Q8_0) or 256 (q4_k).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/quant_blocks.h"
#include "moe/error.h"
#include "offload/checkpoint_experts.h"

using namespace moe;

namespace {

// `out` Q8_0 rows of `in` elements of a fixed, nonzero pattern (every scale finite, > 0).
std::vector<uint8_t> q8_rows(int64_t out, int64_t in) {
  std::vector<uint8_t> rows(static_cast<size_t>(out * cpu::q8_row_bytes(in)));
  std::vector<float> x(static_cast<size_t>(in));
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t i = 0; i < in; ++i) x[static_cast<size_t>(i)] = float((r * 7 + i * 3) % 11) - 5.0f;
    cpu::quantize_q8_0_row(x.data(), in, rows.data() + r * cpu::q8_row_bytes(in));
  }
  return rows;
}

// Sets the f16 scale of block b of row r to `bits`, found where q8_scale reads it.
void set_q8_scale(std::vector<uint8_t>& rows, int64_t in, int64_t r, int64_t b, uint16_t bits) {
  uint8_t* row = rows.data() + r * cpu::q8_row_bytes(in);
  // Values first, then the scales (backend/cpu/gemv.h): block b's f16 at in + 2 b.
  std::memcpy(row + in + 2 * b, &bits, 2);
  REQUIRE(cpu::q8_scale(row, in, b) != cpu::q8_scale(rows.data(), in, 0));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("block scales: a damaged Q8_0 scale is named by row, block and value", "[block_scales]") {
  const int64_t out = 8, in = 64, bytes = cpu::q8_row_bytes(in);
  std::vector<uint8_t> rows = q8_rows(out, in);
  REQUIRE_NOTHROW(offload::check_block_scales(cpu::BlockFormat::q8_0, rows.data(), out, bytes, in,
                                              "'m.h5': tensor 'w'", "rule"));
  set_q8_scale(rows, in, 3, 1, 0x7c00);  // f16 +inf
  CHECK_THAT(
      error_of([&] {
        offload::check_block_scales(cpu::BlockFormat::q8_0, rows.data(), out, bytes, in,
                                    "'m.h5': tensor 'w'", "a Q8_0 scale is finite and >= 0");
      }),
      Catch::StartsWith(
          "'m.h5': tensor 'w' row 3 block 1 has scale inf (a Q8_0 scale is finite and >= 0): "
          "the file is damaged"));
  // Rows past `rows` are not read: the damaged row 3 is outside the first 3.
  REQUIRE_NOTHROW(
      offload::check_block_scales(cpu::BlockFormat::q8_0, rows.data(), 3, bytes, in, "w", "rule"));
}

TEST_CASE("block scales: the expert stores name a negative Q8_0 scale by its value",
          "[block_scales]") {
  // Before the one checker, put_expert printed the second scale (0 for Q8_0) when the first was
  // finite but negative: "has scale 0".
  const int64_t out = 8, in = 64;
  std::vector<uint8_t> rows = q8_rows(out, in);
  set_q8_scale(rows, in, 5, 0, 0xc000);  // f16 -2
  offload::ExpertFormat format;
  format.kind = offload::ExpertFormat::Kind::q8_rows;
  format.name = "q8_0";
  format.held = DType::q8_0;
  format.in = in;
  format.stored_row_bytes = cpu::q8_row_bytes(in);
  format.held_row_bytes = cpu::q8_group_row_bytes(in);
  Tensor chunk = Tensor::empty({out, format.stored_row_bytes}, DType::u8);
  std::memcpy(chunk.raw(), rows.data(), rows.size());
  Tensor into = Tensor::zeros({out * format.held_row_bytes}, DType::u8);
  CHECK_THAT(
      error_of([&] { offload::put_expert(format, chunk, into, "m.h5", "w1", 2); }),
      Catch::StartsWith(
          "checkpoint 'm.h5': expert 2 of 'w1' row 5 block 0 has scale -2 (a q8_0 block's scales "
          "are finite and >= 0): the file is damaged"));
}

TEST_CASE("block scales: a q4_k block's second scale is checked too", "[block_scales]") {
  const int64_t in = 256, bytes = cpu::block_row_bytes(cpu::BlockFormat::q4_k, in);
  std::vector<uint8_t> row(static_cast<size_t>(bytes), 0);  // d = dmin = 0: finite
  REQUIRE_NOTHROW(
      offload::check_block_scales(cpu::BlockFormat::q4_k, row.data(), 1, bytes, in, "w", "r"));
  const uint16_t inf = 0x7c00;
  std::memcpy(row.data() + 2, &inf, 2);  // q4_k's block opens with d, then dmin (f16 each)
  float second = 0;
  REQUIRE(std::isinf(cpu::block_scale(cpu::BlockFormat::q4_k, row.data(), &second) + second));
  CHECK_THAT(
      error_of([&] {
        offload::check_block_scales(cpu::BlockFormat::q4_k, row.data(), 1, bytes, in, "'f': 'w'",
                                    "a q4_k block's scales are finite");
      }),
      Catch::StartsWith(
          "'f': 'w' row 0 block 0 has scale inf (a q4_k block's scales are finite): the file "
          "is damaged"));
}
