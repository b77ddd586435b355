// NCCL backend of the Communicator, built with the CUDA backend. Buffers live on this rank's CUDA
// device; host tensors are accepted too (staged through device memory, for the small start-up and
// count exchanges), so every caller of the Communicator interface works unchanged.
// Bootstrap: rank 0 of `bootstrap` (MPI under a launcher) creates the NCCL unique id and broadcasts
// it over `bootstrap`; every rank then joins with ncclCommInitRank. Collective over `bootstrap`.
// NCCL needs one GPU per rank: two ranks of one node on the same device are refused first, on
// every rank, with a message naming them (moe::Error).
// Operations are enqueued on the communicator's own stream, after the work already queued on the
// device's compute stream (an event orders them); a Request completes when the NCCL work did, and
// waiting also orders the compute stream after it. NCCL has no tags: point-to-point messages
// between two ranks match in call order. A rank that dies ends the job through the launcher (the
// MPI bootstrap); an NCCL asynchronous error aborts the communicator and throws.
#pragma once
#include <memory>

#include "moe/comm/communicator.h"

namespace moe::comm {

struct NcclOptions {
  int device = 0;    // CUDA device of this rank (cuda::device_for_local_rank under a launcher)
  int priority = 0;  // stream priority; negative = higher (the expert all-to-all's stream)
};

// Takes ownership of nothing: `bootstrap` must outlive the returned communicator (splits use it).
std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, const NcclOptions& options);

}  // namespace moe::comm
