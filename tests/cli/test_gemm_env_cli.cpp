// MOE_GEMM, the environment variable that picks the CPU GEMM tile kernel (backend/cpu/gemm.h),
// as a user meets it: read once per process, so each case is a fresh moe-train run. An unknown
// value, or avx512 on a CPU without AVX-512, is a usage error (exit 2) naming the variable;
// `blas` runs on every host.
#include <catch2/catch.hpp>
#include <string>

#include "backend/cpu/gemm_kernel.h"
#include "support/run.h"

using namespace moe;

TEST_CASE("cli: MOE_GEMM picks the GEMM kernel, and a bad value is refused", "[cli]") {
  test::ScratchDir dir("cli-gemm-env");
  auto train = [&](const std::string& value, const std::string& out) {
    return test::run_command("MOE_GEMM=" + value + " " +
                             test::tool("moe-train", "--data " + test::fortunes_path("linux") +
                                                         " --out " + (dir / out) +
                                                         test::kTinyMixtral + " --steps 1"));
  };
  const test::RunResult bad = train("fast", "bad");
  INFO(bad.err);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("MOE_GEMM=fast") != std::string::npos);
  const test::RunResult blas = train("blas", "blas");
  INFO(blas.err);
  CHECK(blas.exit_code == 0);
  const test::RunResult ours = train("avx512", "avx512");
  INFO(ours.err);
  if (cpu::gemm_avx512_supported()) {
    CHECK(ours.exit_code == 0);
  } else {
    CHECK(ours.exit_code == 2);
    CHECK(ours.err.find("AVX-512") != std::string::npos);
  }
}
