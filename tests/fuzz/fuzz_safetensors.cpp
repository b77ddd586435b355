// Fuzz target: the safetensors reader (header validation, then every tensor read), as
// moe-convert import-hf uses it. The reader takes a path, so the bytes go through a scratch file.
#include "fuzz.h"
#include "moe/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      moe::fuzz::write_scratch("model.safetensors", moe::fuzz::bytes_of(data, size));
  moe::fuzz::expect_clean([&] {
    moe::io::SafetensorsReader reader(path);
    for (const moe::io::SafetensorsEntry& entry : reader.tensors())
      moe::fuzz::expect_clean([&] { reader.read(entry.name); });  // F64 etc. are refused
  });
  return 0;
}
