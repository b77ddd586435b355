// Entry point of moe_dist_tests, run on every rank by mpiexec: initialises MPI through
// make_mpi_world(), runs the Catch2 session on every rank (rank 0 prints; other ranks print only
// when they fail, each line prefixed with their rank), then sums the failure counts so that every
// rank, and hence mpiexec, exits non-zero when any rank failed.
#define CATCH_CONFIG_RUNNER
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "moe/comm/communicator.h"

namespace {
moe::comm::Communicator* g_world = nullptr;
}

moe::comm::Communicator& dist_world() {
  if (g_world == nullptr) throw moe::Error("dist tests: the MPI world is not set up");
  return *g_world;
}

// A scratch directory path for one test of this job, the same on every rank: named after rank 0's
// pid, so the np2 and np4 jobs that ctest runs at once (and other checkouts' jobs) never share it.
std::string dist_scratch_dir(const std::string& name) {
  moe::comm::Communicator& world = dist_world();
  moe::Tensor job =
      moe::Tensor::from_vector({1}, std::vector<int32_t>{world.rank() == 0 ? getpid() : 0});
  world.all_reduce(job, moe::comm::ReduceOp::max);
  return (std::filesystem::temp_directory_path() /
          (name + "-" + std::to_string(job.data<int32_t>()[0])))
      .string();
}

int main(int argc, char** argv) {
  std::unique_ptr<moe::comm::Communicator> world;
  try {
    world = moe::comm::make_mpi_world();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_dist_tests: %s\n", e.what());
    return 2;
  }
  g_world = world.get();
  const int rank = world->rank();

  Catch::Session session;
  if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  std::filesystem::path capture;
  if (rank != 0) {
    capture = std::filesystem::temp_directory_path() /
              ("moe_dist_tests.rank" + std::to_string(rank) + "." + std::to_string(getpid()));
    session.configData().outputFilename = capture.string();
  }
  int failed = session.run();

  if (rank != 0) {
    if (failed != 0) {
      std::ifstream in(capture);
      for (std::string line; std::getline(in, line);)
        std::fprintf(stderr, "[rank %d] %s\n", rank, line.c_str());
    }
    std::error_code ignored;
    std::filesystem::remove(capture, ignored);
  }

  int total = 0;
  try {
    moe::Tensor count = moe::Tensor::empty({1}, moe::DType::i32);
    count.data<int32_t>()[0] = failed;
    world->all_reduce(count, moe::comm::ReduceOp::sum);
    total = count.data<int32_t>()[0];
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] moe_dist_tests: summing failures: %s\n", rank, e.what());
    total = 1;
  }
  if (rank == 0 && total != 0)
    std::fprintf(stderr, "moe_dist_tests: %d failed assertion(s)/case(s) over %d ranks\n", total,
                 world->size());
  g_world = nullptr;
  world.reset();
  return total != 0 ? 1 : 0;
}
