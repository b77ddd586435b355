// Fuzz target: the checkpoint loader (io::load_checkpoint_image), the reader behind --resume,
// moe-infer --model, moe-profile record and moe-convert. The bytes are an HDF5 file image: the
// same code path as a file, nothing on disk.
#include "fuzz.h"
#include "moe/io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes = moe::fuzz::bytes_of(data, size);
  moe::fuzz::expect_clean([&] { moe::io::load_checkpoint_image(bytes, "fuzz.h5"); });
  return 0;
}
