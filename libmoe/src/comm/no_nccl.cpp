// make_nccl in a build without the CUDA backend (CMake compiles this file instead of nccl.cpp):
// there is no GPU to run NCCL on, so code that picks NCCL for CUDA devices (parallel::Layout)
// links in every build without a preprocessor branch, and the call can only be a mistake.
#include "moe/comm/nccl.h"
#include "moe/error.h"

namespace moe::comm {

std::unique_ptr<Communicator> make_nccl(Communicator&, const NcclOptions&) {
  throw Error("NCCL: this build has no CUDA backend (configure with -DMOE_CUDA=ON)");
}

}  // namespace moe::comm
