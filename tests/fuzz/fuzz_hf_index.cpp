// Fuzz target: model.safetensors.index.json (the weight map of a sharded Hugging Face checkpoint)
// as io::import_hf reads it, beside a valid config.json and the two shards it should name.
#include "fixtures.h"
#include "fuzz.h"
#include "moe/io/hf_checkpoint.h"

namespace {

const std::string& hf_dir() {
  static const std::string dir = [] {
    std::string d = moe::fuzz::scratch_dir() + "/hf-sharded";
    moe::fuzz::write_tiny_hf(d, /*sharded=*/true);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = hf_dir();
  moe::fuzz::write_scratch("hf-sharded/model.safetensors.index.json",
                           moe::fuzz::bytes_of(data, size));
  moe::fuzz::expect_clean([&] {
    moe::io::HfImportOptions options;
    options.allow_unmapped = size % 2 == 1;  // both the strict and the lenient mapping
    moe::io::Checkpoint c = moe::io::import_hf(dir, options);  // values deferred: read them too
    moe::io::hold_all(c);
  });
  return 0;
}
