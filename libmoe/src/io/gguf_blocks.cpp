// llama.cpp's Q8_0 blocks as our Q8_0 rows (see io/gguf_blocks.h): for the GGUF import
// (io/gguf_import.cpp, io/gguf_import_deepseek2.cpp).
#include "io/gguf_blocks.h"

#include <cstring>

#include "backend/cpu/gemv.h"
#include "kernels/convert.h"
#include "moe/error.h"

namespace moe::io {

std::vector<uint8_t> q8_blocks_to_rows(const std::string& where, const uint8_t* blocks,
                                       int64_t rows, int64_t in) {
  const int64_t blocks_per_row = in / kQ8Block, row_bytes = cpu::q8_row_bytes(in);
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks_per_row; ++b) {
      const uint8_t* block = blocks + (r * blocks_per_row + b) * kQ8BlockBytes;
      uint8_t* row = out.data() + r * row_bytes;
      uint16_t d;
      std::memcpy(&d, block, 2);
      if ((d & 0x8000u) != 0 || (d & 0x7c00u) == 0x7c00u)
        throw Error(str(where, ": row ", r, ", block ", b, ": the scale ", kernels::f16_to_f32(d),
                        " is not a finite value >= 0"));
      for (int64_t j = 0; j < kQ8Block; ++j)
        if (block[2 + j] == 0x80)
          throw Error(str(where, ": row ", r, ", block ", b, ": an int8 value of -128 ",
                          "(Q8_0 values are within [-127, 127])"));
      std::memcpy(row + b * kQ8Block, block + 2, kQ8Block);
      std::memcpy(row + in + 2 * b, block, 2);
    }
  return out;
}

}  // namespace moe::io
