// Fuzz target: `--config FILE` (CLI11's TOML/INI config) as moe-train parses it: every flag of
// moe-train, with its validators. A CLI11 ParseError is a usage error (exit 2), the correct
// refusal, like moe::Error.
#include "fuzz.h"
#include "moe-train/options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = moe::fuzz::write_scratch("config.toml", moe::fuzz::bytes_of(data, size));
  CLI::App app("moe-train (fuzz)", "moe-train");
  moe::tools::TrainOptions options;
  moe::tools::add_train_options(app, options);
  const char* argv[] = {"moe-train", "--config", path.c_str()};
  moe::fuzz::expect_clean([&] {
    try {
      app.parse(3, argv);
    } catch (const CLI::ParseError&) {
    }
  });
  return 0;
}
