// Probe for the "one rank fails, the whole job ends" contract (ctest dist_abort_job_np2): rank 1
// throws and calls abort_job while every other rank waits in a barrier that never completes.
#include <chrono>
#include <thread>

#include "moe/comm/communicator.h"

int main() {
  auto world = moe::comm::make_mpi_world();
  if (world->rank() == 1) {
    try {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let rank 0 reach the barrier
      throw moe::Error("abort probe: simulated failure");
    } catch (const std::exception& e) {
      moe::comm::abort_job(e.what(), 3);
    }
  }
  world->barrier();
  return 0;  // not reached when abort_job works: the barrier never completes without rank 1
}
