// Fuzz target: path tables (profile::load_paths, what moe-profile accuracy and moe-infer
// --popularity read), then the estimator's accuracy against a small valid trace of the model the
// table claims to describe, as moe-profile accuracy runs it.
#include "fixtures.h"
#include "fuzz.h"
#include "moe/io/trace.h"
#include "moe/profile/paths.h"

namespace {

const moe::io::TraceReader& trace() {
  static const moe::io::TraceReader reader = [] {
    std::string path = moe::fuzz::scratch_dir() + "/paths-trace.h5";
    moe::fuzz::write_tiny_trace(path);
    return moe::io::TraceReader(path);
  }();
  return reader;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const moe::io::TraceReader& reader = trace();
  const std::string path = moe::fuzz::write_scratch("table.json", moe::fuzz::bytes_of(data, size));
  moe::fuzz::expect_clean([&] {
    moe::profile::PathTable table = moe::profile::load_paths(path);
    moe::profile::accuracy(table, reader);
  });
  return 0;
}
