// The local (single-rank) communicator: argument checks identical to the real backends, then a
// copy or nothing. R = 1, so every count array has one entry.
#include "moe/comm/local.h"

#include <cstring>

namespace moe::comm {

namespace {

void check_host(const char* op, const Tensor& t) {
  MOE_CHECK(t.device().kind == Device::cpu, op, " on the local communicator: ", t.describe(),
            " is not a CPU tensor");
}

void copy_bytes(const Tensor& from, Tensor& to) {
  if (from.nbytes() > 0) std::memcpy(to.raw(), from.raw(), from.nbytes());
}

// Takes the oldest message sent to self with `tag` into `buf`; false when there is none yet.
bool take_message(LocalCommunicator::Mailbox& mailbox, int tag, Tensor& buf) {
  auto it = mailbox.find(tag);
  if (it == mailbox.end() || it->second.empty()) return false;
  Tensor message = std::move(it->second.front());
  it->second.erase(it->second.begin());
  if (it->second.empty()) mailbox.erase(it);
  MOE_CHECK(message.dtype() == buf.dtype() && message.numel() == buf.numel(),
            "recv on the local communicator (tag ", tag, "): message ", message.describe(),
            " does not fit buffer ", buf.describe());
  copy_bytes(message, buf);
  return true;
}

class PendingSelfRecv final : public PendingOp {
 public:
  PendingSelfRecv(std::shared_ptr<LocalCommunicator::Mailbox> mailbox, Tensor buf, int tag)
      : mailbox_(std::move(mailbox)), buf_(std::move(buf)), tag_(tag) {}
  void wait() override {
    if (done_) return;
    MOE_CHECK(take_message(*mailbox_, tag_, buf_), "recv on the local communicator: no send to ",
              "self with tag ", tag_, " was posted (with one rank this would wait forever)");
    done_ = true;
  }
  bool test() override {
    if (!done_) done_ = take_message(*mailbox_, tag_, buf_);
    return done_;
  }

 private:
  std::shared_ptr<LocalCommunicator::Mailbox> mailbox_;
  Tensor buf_;  // shares the caller's storage
  int tag_;
  bool done_ = false;
};

}  // namespace

LocalCommunicator::LocalCommunicator() : mailbox_(std::make_shared<Mailbox>()) {}

std::unique_ptr<Communicator> LocalCommunicator::split(int color, int /*key*/) {
  if (color < 0) return nullptr;
  return std::make_unique<LocalCommunicator>();
}

std::unique_ptr<Communicator> LocalCommunicator::split_node() {
  return std::make_unique<LocalCommunicator>();
}

Request LocalCommunicator::iall_reduce(Tensor& buf, ReduceOp op) {
  check_reducible("all_reduce", buf, op);
  check_host("all_reduce", buf);
  return {};
}

Request LocalCommunicator::iall_gather(const Tensor& send, Tensor& recv) {
  check_all_gather(send, recv);
  check_host("all_gather", send);
  check_host("all_gather", recv);
  copy_bytes(send, recv);
  return {};
}

Request LocalCommunicator::iall_gatherv(const Tensor& send, Tensor& recv,
                                        std::span<const int64_t> recv_counts) {
  check_all_gatherv(send, recv, recv_counts);
  check_host("all_gatherv", send);
  check_host("all_gatherv", recv);
  copy_bytes(send, recv);
  return {};
}

Request LocalCommunicator::iall_to_all_v(const Tensor& send, std::span<const int64_t> send_counts,
                                         Tensor& recv, std::span<const int64_t> recv_counts) {
  check_all_to_all_v(send, send_counts, recv, recv_counts);
  check_host("all_to_all_v", send);
  check_host("all_to_all_v", recv);
  MOE_CHECK(send_counts[0] == recv_counts[0], "all_to_all_v on ", describe(), ": sends ",
            send_counts[0], " rows to itself but expects ", recv_counts[0]);
  copy_bytes(send, recv);
  return {};
}

Request LocalCommunicator::ibroadcast(Tensor& buf, int root) {
  check_buffer("broadcast", buf);
  check_host("broadcast", buf);
  check_peer("broadcast", root);
  return {};
}

Request LocalCommunicator::ireduce_scatterv(const Tensor& send, Tensor& recv,
                                            std::span<const int64_t> recv_counts, ReduceOp op) {
  check_reduce_scatterv(send, recv, recv_counts, op);
  check_host("reduce_scatterv", send);
  check_host("reduce_scatterv", recv);
  copy_bytes(send, recv);
  return {};
}

Request LocalCommunicator::isend(const Tensor& buf, int peer, int tag) {
  check_buffer("send", buf);
  check_host("send", buf);
  check_peer("send", peer);
  (*mailbox_)[tag].push_back(buf.clone());  // buffered: the caller may reuse buf at once
  return {};
}

Request LocalCommunicator::irecv(Tensor& buf, int peer, int tag) {
  check_buffer("recv", buf);
  check_host("recv", buf);
  check_peer("recv", peer);
  if (take_message(*mailbox_, tag, buf)) return {};
  return Request(std::make_unique<PendingSelfRecv>(mailbox_, buf, tag));
}

std::unique_ptr<Communicator> make_local() { return std::make_unique<LocalCommunicator>(); }

}  // namespace moe::comm
