// NCCL communicator (moe/comm/nccl.h). Host code; NCCL and the CUDA runtime do the device work.
#include "moe/comm/nccl.h"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/cuda/runtime.h"
#include "moe/error.h"
#include "moe/log.h"

#define MOE_NCCL_CHECK(statement)                                                              \
  do {                                                                                         \
    ncclResult_t moe_nccl_rc_ = (statement);                                                   \
    if (moe_nccl_rc_ != ncclSuccess)                                                           \
      ::moe::cuda::throw_call_error(                                                           \
          "NCCL", #statement, ::moe::comm::nccl_error_text(moe_nccl_rc_), __FILE__, __LINE__); \
  } while (0)

namespace moe::comm {

namespace {

const char* nccl_error_text(ncclResult_t rc) {
  thread_local std::string text;
  text = ncclGetErrorString(rc);
  if (const char* last = ncclGetLastError(nullptr); last && *last) text += str(" (", last, ")");
  return text.c_str();
}

ncclDataType_t nccl_type(const Tensor& t, const char* op) {
  switch (t.dtype()) {
    case DType::f32:
      return ncclFloat32;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
    case DType::q8_0:  // bytes
    case DType::q4_k:
    case DType::q6_k:
    case DType::mxfp4:
      return ncclUint8;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f16:
      return ncclFloat16;
  }
  throw Error(str(op, ": unsupported dtype of ", t.describe()));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

// The elements of one row (the unit of the v-collectives' counts).
size_t row_bytes(const Tensor& t) {
  return static_cast<size_t>(row_elements(t)) * dtype_size(t.dtype());
}

// One NCCL operation in flight: an event recorded after it on the communicator's stream, the
// buffers it uses (kept alive), and host tensors to fill from device staging when it completes.
class NcclPendingOp final : public PendingOp {
 public:
  NcclPendingOp(std::string what, ncclComm_t comm, int device, cudaStream_t stream,
                std::vector<Tensor> keep, std::vector<std::pair<Tensor, Tensor>> copy_back)
      : what_(std::move(what)),
        comm_(comm),
        device_(device),
        keep_(std::move(keep)),
        copy_back_(std::move(copy_back)) {
    done_.record(stream);
  }
  ~NcclPendingOp() override {
    if (!finished_) {
      try {
        wait();
      } catch (const std::exception& e) {
        MOE_LOG_ERROR("NCCL: ", what_, " failed while its request was being dropped: ", e.what());
      }
    }
  }

  void wait() override {
    auto pause = std::chrono::microseconds(5);
    while (!test()) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(100));
    }
  }

  bool test() override {
    if (finished_) return true;
    if (!done_.query()) {
      ncclResult_t async = ncclSuccess;
      MOE_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess) {
        finished_ = true;
        ncclCommAbort(comm_);
        throw Error(str("NCCL: ", what_, " failed: ", nccl_error_text(async),
                        "; the communicator was aborted"));
      }
      return false;
    }
    finished_ = true;
    // Later compute-stream work sees the results.
    done_.block(cuda::current_stream(device_));
    for (auto& [host, staged] : copy_back_) host.copy_from(staged);
    return true;
  }

 private:
  std::string what_;
  ncclComm_t comm_;
  int device_;
  cuda::Event done_;
  std::vector<Tensor> keep_;
  std::vector<std::pair<Tensor, Tensor>> copy_back_;  // (host destination, device staging)
  bool finished_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, std::unique_ptr<Communicator> owned_bootstrap,
                   ncclComm_t comm, const NcclOptions& options)
      : bootstrap_(bootstrap),
        owned_bootstrap_(std::move(owned_bootstrap)),
        comm_(comm),
        options_(options),
        stream_(options.device, options.priority) {
    MOE_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    MOE_NCCL_CHECK(ncclCommCount(comm_, &size_));
  }
  ~NcclCommunicator() override {
    if (comm_) {
      cudaStreamSynchronize(stream_.get());
      ncclCommDestroy(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  std::unique_ptr<Communicator> split(int color, int key) override {
    return split_with_priority(color, key, options_.priority);
  }
  std::unique_ptr<Communicator> split_with_priority(int color, int key, int priority) override {
    std::unique_ptr<Communicator> sub_bootstrap = bootstrap_.split(color, key);
    ncclComm_t sub = nullptr;
    MOE_NCCL_CHECK(
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr));
    if (color < 0) return nullptr;
    Communicator& b = *sub_bootstrap;
    NcclOptions options = options_;
    options.priority = priority;
    return std::make_unique<NcclCommunicator>(b, std::move(sub_bootstrap), sub, options);
  }

  std::unique_ptr<Communicator> split_node() override {
    // The node's ranks pick the lowest bootstrap rank among them as their color.
    std::unique_ptr<Communicator> node = bootstrap_.split_node();
    Tensor leader = Tensor::empty({1}, DType::i32);
    leader.data<int32_t>()[0] = bootstrap_.rank();
    node->all_reduce(leader, ReduceOp::min);
    const int color = leader.data<int32_t>()[0];
    ncclComm_t sub = nullptr;
    MOE_NCCL_CHECK(ncclCommSplit(comm_, color, rank_, &sub, nullptr));
    Communicator& b = *node;
    return std::make_unique<NcclCommunicator>(b, std::move(node), sub, options_);
  }

  Request iall_reduce(Tensor& buf, ReduceOp op) override {
    check_reducible("all_reduce", buf, op);
    Op o = begin("all_reduce");
    void* p = o.device_buffer(buf, true, true);
    MOE_NCCL_CHECK(ncclAllReduce(p, p, static_cast<size_t>(buf.numel()),
                                 nccl_type(buf, "all_reduce"), nccl_op(op), comm_, stream_.get()));
    return o.finish();
  }

  Request iall_gather(const Tensor& send, Tensor& recv) override {
    check_all_gather(send, recv);
    Op o = begin("all_gather");
    const void* s = o.device_buffer(send, true, false);
    void* r = o.device_buffer(recv, false, true);
    MOE_NCCL_CHECK(ncclAllGather(s, r, static_cast<size_t>(send.numel()),
                                 nccl_type(send, "all_gather"), comm_, stream_.get()));
    return o.finish();
  }

  Request iall_gatherv(const Tensor& send, Tensor& recv,
                       std::span<const int64_t> recv_counts) override {
    check_all_gatherv(send, recv, recv_counts);
    Op o = begin("all_gatherv");
    const auto* s = static_cast<const std::byte*>(o.device_buffer(send, true, false));
    auto* r = static_cast<std::byte*>(o.device_buffer(recv, false, true));
    const size_t row = row_bytes(recv);
    MOE_NCCL_CHECK(ncclGroupStart());
    size_t offset = 0;
    for (int peer = 0; peer < size_; ++peer) {
      const size_t bytes = static_cast<size_t>(recv_counts[peer]) * row;
      if (send.nbytes() > 0)
        MOE_NCCL_CHECK(ncclSend(s, send.nbytes(), ncclUint8, peer, comm_, stream_.get()));
      if (bytes > 0)
        MOE_NCCL_CHECK(ncclRecv(r + offset, bytes, ncclUint8, peer, comm_, stream_.get()));
      offset += bytes;
    }
    MOE_NCCL_CHECK(ncclGroupEnd());
    return o.finish();
  }

  // One ncclReduce per destination rank (its rows of send, rooted there) in one group: NCCL's
  // reduce-scatter takes equal counts only.
  Request ireduce_scatterv(const Tensor& send, Tensor& recv, std::span<const int64_t> recv_counts,
                           ReduceOp op) override {
    check_reduce_scatterv(send, recv, recv_counts, op);
    Op o = begin("reduce_scatterv");
    const auto* s = static_cast<const std::byte*>(o.device_buffer(send, true, false));
    void* r = o.device_buffer(recv, false, true);
    const size_t row = row_bytes(send);
    const int64_t width = row_elements(send);
    MOE_NCCL_CHECK(ncclGroupStart());
    size_t offset = 0;
    for (int peer = 0; peer < size_; ++peer) {
      const auto elements = static_cast<size_t>(recv_counts[peer] * width);
      if (elements > 0)
        MOE_NCCL_CHECK(ncclReduce(s + offset, r, elements, nccl_type(send, "reduce_scatterv"),
                                  nccl_op(op), peer, comm_, stream_.get()));
      offset += static_cast<size_t>(recv_counts[peer]) * row;
    }
    MOE_NCCL_CHECK(ncclGroupEnd());
    return o.finish();
  }

  // All-to-all-v as one group of sends and receives (zero counts skipped).
  Request iall_to_all_v(const Tensor& send, std::span<const int64_t> send_counts, Tensor& recv,
                        std::span<const int64_t> recv_counts) override {
    check_all_to_all_v(send, send_counts, recv, recv_counts);
    Op o = begin("all_to_all_v");
    const auto* s = static_cast<const std::byte*>(o.device_buffer(send, true, false));
    auto* r = static_cast<std::byte*>(o.device_buffer(recv, false, true));
    const size_t row = row_bytes(send);
    MOE_NCCL_CHECK(ncclGroupStart());
    size_t send_off = 0, recv_off = 0;
    for (int peer = 0; peer < size_; ++peer) {
      const size_t sb = static_cast<size_t>(send_counts[peer]) * row;
      const size_t rb = static_cast<size_t>(recv_counts[peer]) * row;
      if (sb > 0) MOE_NCCL_CHECK(ncclSend(s + send_off, sb, ncclUint8, peer, comm_, stream_.get()));
      if (rb > 0) MOE_NCCL_CHECK(ncclRecv(r + recv_off, rb, ncclUint8, peer, comm_, stream_.get()));
      send_off += sb;
      recv_off += rb;
    }
    MOE_NCCL_CHECK(ncclGroupEnd());
    return o.finish();
  }

  Request ibroadcast(Tensor& buf, int root) override {
    check_buffer("broadcast", buf);
    check_peer("broadcast", root);
    Op o = begin("broadcast");
    void* p = o.device_buffer(buf, true, true);
    MOE_NCCL_CHECK(ncclBroadcast(p, p, buf.nbytes(), ncclUint8, root, comm_, stream_.get()));
    return o.finish();
  }

  Request isend(const Tensor& buf, int peer, int /*tag: NCCL matches in call order*/) override {
    check_buffer("send", buf);
    check_peer("send", peer);
    Op o = begin("send");
    const void* p = o.device_buffer(buf, true, false);
    MOE_NCCL_CHECK(ncclSend(p, buf.nbytes(), ncclUint8, peer, comm_, stream_.get()));
    return o.finish();
  }

  Request irecv(Tensor& buf, int peer, int /*tag*/) override {
    check_buffer("recv", buf);
    check_peer("recv", peer);
    Op o = begin("recv");
    void* p = o.device_buffer(buf, false, true);
    MOE_NCCL_CHECK(ncclRecv(p, buf.nbytes(), ncclUint8, peer, comm_, stream_.get()));
    return o.finish();
  }

  void barrier() override {
    Tensor one = Tensor::zeros({1}, DType::i32, Device{Device::cuda, options_.device});
    all_reduce(one, ReduceOp::sum);
  }

 private:
  // Collects what one operation needs: its stream ordered after the compute stream, device
  // buffers for host tensors (uploaded when the operation reads them), and what to keep alive.
  class Op {
   public:
    Op(NcclCommunicator& c, const char* what) : c_(c), what_(what) {
      cuda::use_device(c.options_.device);
      ready_.record(cuda::current_stream(c.options_.device));
      ready_.block(c.stream_.get());
    }
    void* device_buffer(const Tensor& t, bool read, bool write) {
      MOE_CHECK(t.device().kind == Device::cpu || t.device().index == c_.options_.device, what_,
                " on ", c_.describe(), ": ", t.describe(),
                " is not on this rank's device cuda:", c_.options_.device);
      if (t.device().kind == Device::cuda) {
        keep_.push_back(t);
        return const_cast<void*>(t.raw());
      }
      Tensor staged = Tensor::empty(t.shape(), t.dtype(), Device{Device::cuda, c_.options_.device});
      if (read) staged.copy_from(t);
      // The upload ran on the compute stream: order the NCCL stream after it again.
      ready_.record(cuda::current_stream(c_.options_.device));
      ready_.block(c_.stream_.get());
      keep_.push_back(staged);
      if (write) copy_back_.emplace_back(const_cast<Tensor&>(t), staged);
      return staged.raw();
    }
    Request finish() {
      return Request(std::make_unique<NcclPendingOp>(str(what_, " on ", c_.describe()), c_.comm_,
                                                     c_.options_.device, c_.stream_.get(),
                                                     std::move(keep_), std::move(copy_back_)));
    }

   private:
    NcclCommunicator& c_;
    const char* what_;
    cuda::Event ready_;
    std::vector<Tensor> keep_;
    std::vector<std::pair<Tensor, Tensor>> copy_back_;
  };
  Op begin(const char* what) { return Op(*this, what); }

  Communicator& bootstrap_;
  std::unique_ptr<Communicator> owned_bootstrap_;
  ncclComm_t comm_ = nullptr;
  NcclOptions options_;
  cuda::Stream stream_;
  int rank_ = 0, size_ = 1;
};

// NCCL refuses two ranks of one communicator on one GPU with a terse "invalid usage"; this says it
// in our words, on every rank alike (a flag reduced over the bootstrap), before ncclCommInitRank.
void check_one_gpu_per_rank(Communicator& bootstrap, int device) {
  std::unique_ptr<Communicator> node = bootstrap.split_node();
  Tensor mine = Tensor::empty({1}, DType::i32), all = Tensor::empty({node->size()}, DType::i32);
  mine.data<int32_t>()[0] = device;
  node->all_gather(mine, all);
  const int32_t* devices = all.data<int32_t>();
  int first = -1, second = -1;  // two local ranks of this node on one device
  for (int a = 0; a < node->size() && first < 0; ++a)
    for (int b = a + 1; b < node->size() && first < 0; ++b)
      if (devices[a] == devices[b]) first = a, second = b;
  Tensor shared = Tensor::empty({1}, DType::i32);
  shared.data<int32_t>()[0] = first >= 0 ? 1 : 0;
  bootstrap.all_reduce(shared, ReduceOp::max);
  if (shared.data<int32_t>()[0] == 0) return;
  const int gpus = cuda::device_count();
  const std::string where = first >= 0
                                ? str("on this node, local ranks ", first, " and ", second,
                                      " both use cuda:", devices[first], " (", node->size(),
                                      " ranks, ", gpus, " usable GPU", gpus == 1 ? "" : "s", ")")
                                : std::string("another node starts more ranks than it has GPUs");
  throw Error(str("NCCL needs a GPU of its own for every rank: ", where,
                  "; start at most one rank per GPU on each node"));
}

}  // namespace

std::unique_ptr<Communicator> make_nccl(Communicator& bootstrap, const NcclOptions& options) {
  MOE_CHECK(cuda::available(), "NCCL communicator: ", cuda::unavailable_reason());
  check_one_gpu_per_rank(bootstrap, options.device);
  cuda::use_device(options.device);
  Tensor id = Tensor::zeros({static_cast<int64_t>(sizeof(ncclUniqueId))}, DType::u8);
  if (bootstrap.rank() == 0) {
    ncclUniqueId unique{};
    MOE_NCCL_CHECK(ncclGetUniqueId(&unique));
    std::memcpy(id.raw(), &unique, sizeof unique);
  }
  bootstrap.broadcast(id, 0);
  ncclUniqueId unique{};
  std::memcpy(&unique, id.raw(), sizeof unique);
  ncclComm_t comm = nullptr;
  MOE_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), unique, bootstrap.rank()));
  return std::make_unique<NcclCommunicator>(bootstrap, nullptr, comm, options);
}

}  // namespace moe::comm
