// LocalCommunicator: a world of one rank, no MPI at run time. Collectives are copies (gathers,
// all-to-all) or no-ops (reduce, broadcast, barrier) after the same argument checks as the real
// backends, so single-process code exercises the same shape contract. Sends to self are buffered
// per tag and matched by receives in order; a receive with no matching send throws (it would hang).
#pragma once
#include <map>
#include <memory>
#include <vector>

#include "moe/comm/communicator.h"

namespace moe::comm {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator();

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> split_node() override;

  Request iall_reduce(Tensor& buf, ReduceOp op) override;
  Request iall_gather(const Tensor& send, Tensor& recv) override;
  Request iall_gatherv(const Tensor& send, Tensor& recv,
                       std::span<const int64_t> recv_counts) override;
  Request iall_to_all_v(const Tensor& send, std::span<const int64_t> send_counts, Tensor& recv,
                        std::span<const int64_t> recv_counts) override;
  Request ibroadcast(Tensor& buf, int root) override;
  Request ireduce_scatterv(const Tensor& send, Tensor& recv, std::span<const int64_t> recv_counts,
                           ReduceOp op) override;
  Request isend(const Tensor& buf, int peer, int tag) override;
  Request irecv(Tensor& buf, int peer, int tag) override;
  void barrier() override {}

  // Messages sent to self and not yet received, per tag, oldest first.
  using Mailbox = std::map<int, std::vector<Tensor>>;

 private:
  std::shared_ptr<Mailbox> mailbox_;
};

}  // namespace moe::comm
