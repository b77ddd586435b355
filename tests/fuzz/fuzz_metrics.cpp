// Fuzz target: moe-profile plot-metrics' reader of metrics.jsonl (profile::parse_metrics), then the
// picture of the run, alone and overlaid with itself (profile::plot_metrics_svg).
#include "fuzz.h"
#include "moe/profile/curves.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moe::fuzz::expect_clean([&] {
    const moe::profile::MetricsRun run =
        moe::profile::parse_metrics(moe::fuzz::bytes_of(data, size), "fuzz.jsonl");
    moe::profile::plot_metrics_svg({run}, "fuzz");
    moe::profile::plot_metrics_svg({run, run}, "fuzz");
  });
  return 0;
}
