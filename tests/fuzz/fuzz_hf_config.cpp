// Fuzz target: Hugging Face config.json as moe-convert import-hf reads it (io::import_hf), in a
// directory whose model.safetensors holds the tiny Mixtral's tensors, so a config that parses
// goes on to the name mapping and the shape checks.
#include <filesystem>

#include "fixtures.h"
#include "fuzz.h"
#include "moe/io/hf_checkpoint.h"

namespace {

const std::string& hf_dir() {
  static const std::string dir = [] {
    std::string d = moe::fuzz::scratch_dir() + "/hf";
    moe::fuzz::write_tiny_hf(d, /*sharded=*/false);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = hf_dir();
  moe::fuzz::write_scratch("hf/config.json", moe::fuzz::bytes_of(data, size));
  moe::fuzz::expect_clean([&] {
    moe::io::HfImportReport report;
    // Every value read too (import_hf defers them to the write), as moe-convert writes them.
    moe::io::Checkpoint c = moe::io::import_hf(dir, moe::io::HfImportOptions{}, &report);
    moe::io::hold_all(c);
  });
  return 0;
}
