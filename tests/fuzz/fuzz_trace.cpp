// Fuzz target: the routing-trace reader (io::TraceReader::from_image, an HDF5 file image), then
// what moe-profile summary, paths and plot do with an opened trace.
#include "fuzz.h"
#include "moe/io/trace.h"
#include "moe/profile/paths.h"
#include "moe/profile/plot.h"
#include "moe/profile/summary.h"

namespace {

// A trace that passed validation may still claim many tokens; the readers stream them (the
// library's contract), which is slow but correct, so the whole-trace passes run on small ones.
constexpr int64_t kMaxStreamedTokens = 1 << 16;

void exercise(const moe::io::TraceReader& trace) {
  std::vector<int32_t> experts, ids;
  std::vector<float> gates;
  const int64_t n = std::min<int64_t>(trace.tokens(), 64);
  trace.read_tokens(0, n, experts, &gates, &ids);
  trace.batch_offsets();
  trace.loads();
  trace.dropped();
  for (int64_t b = 0; b < std::min<int64_t>(trace.batches(), 4); ++b) trace.read_batch(b);
  if (trace.tokens() > kMaxStreamedTokens) return;
  moe::profile::summarize(trace);
  moe::profile::build_paths(trace, 2);
  moe::profile::plot_svg(trace, "fuzz");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moe::fuzz::expect_clean([&] {
    exercise(moe::io::TraceReader::from_image(moe::fuzz::bytes_of(data, size), "fuzz.trace.h5"));
  });
  return 0;
}
