// The MPI communicator (CPU buffers). Every MPI call goes through MOE_MPI_CHECK, and every
// communicator carries MPI_ERRORS_RETURN, so failures surface as moe::Error naming the call, the
// file and line, MPI's own error string and the rank. Counts use the MPI-4 large-count calls
// (MPI_Count / MPI_Aint displacements), so buffers past 2^31 elements need no special case.
// R = size() peers; counts in rows of the leading dimension, converted here to elements.
#include "moe/comm/mpi.h"

#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "moe/log.h"

#if MPI_VERSION < 4
#error "moe's MPI communicator needs the MPI-4 large-count calls (MPICH >= 4.0, Open MPI >= 5.0)"
#endif

namespace moe::comm {

namespace {

int world_rank_or_minus_one() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

[[noreturn]] void throw_mpi_error(int code, const char* statement, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING + 1] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) std::snprintf(text, sizeof text, "?");
  throw Error(str("MPI call failed on world rank ", world_rank_or_minus_one(), ": ", statement,
                  ": ", text, " (error ", code, ") [", file, ":", line, "]"));
}

}  // namespace

}  // namespace moe::comm

#define MOE_MPI_CHECK(statement)                                                 \
  do {                                                                           \
    int moe_mpi_rc_ = (statement);                                               \
    if (moe_mpi_rc_ != MPI_SUCCESS)                                              \
      ::moe::comm::throw_mpi_error(moe_mpi_rc_, #statement, __FILE__, __LINE__); \
  } while (0)

namespace moe::comm {

namespace {

// ---- process-wide initialisation -------------------------------------------------------------

std::once_flag g_init_once;
int g_thread_level = -1;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_initialized() {
  std::call_once(g_init_once, [] {
    int initialized = 0;
    MOE_MPI_CHECK(MPI_Initialized(&initialized));
    if (initialized) {  // the program owns MPI's lifetime
      MOE_MPI_CHECK(MPI_Query_thread(&g_thread_level));
    } else {
      // MULTIPLE lets the communication scheduler's thread and the compute thread both call MPI;
      // SERIALIZED (the caller orders the calls) is the least we can work with.
      MOE_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &g_thread_level));
      std::atexit(finalize_at_exit);
      // MPICH reports some failures of MPI_Wait on the world's handler rather than on the request's
      // communicator: make those return too (abort_job still ends the job on purpose).
      MOE_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
      MOE_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
    }
    MOE_CHECK(g_thread_level >= MPI_THREAD_SERIALIZED, "MPI provides thread level ", g_thread_level,
              " but moe needs at least MPI_THREAD_SERIALIZED");
    if (g_thread_level < MPI_THREAD_MULTIPLE)
      MOE_LOG_INFO("MPI: MPI_THREAD_MULTIPLE not available, using MPI_THREAD_SERIALIZED");
  });
}

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// ---- datatypes -------------------------------------------------------------------------------

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::bf16:
    case DType::f16:
      return MPI_UINT16_T;  // moved as raw words, never reduced
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
    case DType::q8_0:  // bytes
    case DType::q4_k:
    case DType::q6_k:
    case DType::mxfp4:
      return MPI_UINT8_T;
  }
  throw Error("MPI communicator: unknown dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  throw Error("MPI communicator: unknown reduce op");
}

void check_host(const char* op, const Tensor& t) {
  MOE_CHECK(t.device().kind == Device::cpu, op, " on the MPI communicator: ", t.describe(),
            " is not a CPU tensor (device buffers go through the NCCL communicator)");
}

// Rows per peer -> element counts and displacements, in the types of the large-count calls.
struct CountsAndDispls {
  std::vector<MPI_Count> counts;
  std::vector<MPI_Aint> displs;
};

CountsAndDispls to_elements(std::span<const int64_t> rows, int64_t row_elems) {
  CountsAndDispls out;
  out.counts.resize(rows.size());
  out.displs.resize(rows.size());
  int64_t offset = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    out.counts[r] = static_cast<MPI_Count>(rows[r] * row_elems);
    out.displs[r] = static_cast<MPI_Aint>(offset);
    offset += rows[r] * row_elems;
  }
  return out;
}

// ---- requests --------------------------------------------------------------------------------

// One MPI request plus everything MPI reads or writes until it completes.
class MpiPendingOp final : public PendingOp {
 public:
  MpiPendingOp(std::string what, std::vector<Tensor> buffers, CountsAndDispls send = {},
               CountsAndDispls recv = {})
      : what_(std::move(what)),
        buffers_(std::move(buffers)),
        send_(std::move(send)),
        recv_(std::move(recv)) {}
  MpiPendingOp(const MpiPendingOp&) = delete;
  MpiPendingOp& operator=(const MpiPendingOp&) = delete;

  ~MpiPendingOp() override {
    if (request_ != MPI_REQUEST_NULL && mpi_usable()) {
      if (MPI_Wait(&request_, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        MOE_LOG_ERROR("MPI: ", what_, " failed while its request was being dropped");
    }
  }

  MPI_Request* handle() { return &request_; }
  // The count arrays live here, at stable addresses until the operation completes.
  CountsAndDispls& send_counts() { return send_; }
  CountsAndDispls& recv_counts() { return recv_; }
  // For receives: the message must fill the buffer exactly.
  void expect_elements(MPI_Count n, MPI_Datatype type) {
    expected_ = n;
    type_ = type;
  }

  // WaitMode (communicator.h): spin is MPI_Wait. sleep polls for 50 us, then with sleeps growing
  // to 100 us: with 4 ranks on this 2-core machine MPI_Wait's busy loop took the core from the
  // rank being waited for (moe-train-bench: expert-parallel steps about 3x slower).
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    if (wait_mode() == WaitMode::spin) {
      MPI_Status status;
      int rc = MPI_Wait(&request_, &status);
      if (rc != MPI_SUCCESS) throw_in_flight(rc);
      check_received(status);
      return;
    }
    using Clock = std::chrono::steady_clock;
    const Clock::time_point spin_until = Clock::now() + std::chrono::microseconds(50);
    auto pause = std::chrono::microseconds(5);
    while (!test()) {
      if (Clock::now() < spin_until) continue;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(100));
    }
  }

  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    MPI_Status status;
    int flag = 0;
    int rc = MPI_Test(&request_, &flag, &status);
    if (rc != MPI_SUCCESS) throw_in_flight(rc);
    if (flag) check_received(status);
    return flag != 0;
  }

 private:
  [[noreturn]] void throw_in_flight(int rc) {
    request_ = MPI_REQUEST_NULL;
    throw_mpi_error(rc, ("MPI_Wait/MPI_Test on " + what_).c_str(), __FILE__, __LINE__);
  }
  void check_received(const MPI_Status& status) {
    if (expected_ < 0) return;
    MPI_Count got = 0;
    MOE_MPI_CHECK(MPI_Get_count_c(&status, type_, &got));
    MOE_CHECK(got == expected_, what_, ": received ", got, " elements, the buffer holds ",
              expected_);
  }

  std::string what_;
  std::vector<Tensor> buffers_;  // keep the storage alive while MPI uses it
  CountsAndDispls send_, recv_;  // MPI reads the count arrays until completion
  MPI_Request request_ = MPI_REQUEST_NULL;
  MPI_Count expected_ = -1;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// ---- the communicator ------------------------------------------------------------------------

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor) and makes its errors return.
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MOE_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MOE_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    MOE_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() override {
    if (comm_ != MPI_COMM_NULL && mpi_usable()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    MOE_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(sub);
  }

  std::unique_ptr<Communicator> split_node() override {
    MPI_Comm node = MPI_COMM_NULL;
    MOE_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    return std::make_unique<MpiCommunicator>(node);
  }

  Request iall_reduce(Tensor& buf, ReduceOp op) override {
    check_reducible("all_reduce", buf, op);
    check_host("all_reduce", buf);
    auto pending = std::make_unique<MpiPendingOp>(what("all_reduce"), std::vector<Tensor>{buf});
    MOE_MPI_CHECK(MPI_Iallreduce_c(MPI_IN_PLACE, buf.raw(), buf.numel(), mpi_type(buf.dtype()),
                                   mpi_op(op), comm_, pending->handle()));
    return Request(std::move(pending));
  }

  Request iall_gather(const Tensor& send, Tensor& recv) override {
    check_all_gather(send, recv);
    check_host("all_gather", send);
    check_host("all_gather", recv);
    MPI_Datatype type = mpi_type(send.dtype());
    auto pending =
        std::make_unique<MpiPendingOp>(what("all_gather"), std::vector<Tensor>{send, recv});
    MOE_MPI_CHECK(MPI_Iallgather_c(send.raw(), send.numel(), type, recv.raw(), send.numel(), type,
                                   comm_, pending->handle()));
    return Request(std::move(pending));
  }

  Request iall_gatherv(const Tensor& send, Tensor& recv,
                       std::span<const int64_t> recv_counts) override {
    check_all_gatherv(send, recv, recv_counts);
    check_host("all_gatherv", send);
    check_host("all_gatherv", recv);
    MPI_Datatype type = mpi_type(send.dtype());
    auto pending = std::make_unique<MpiPendingOp>(
        what("all_gatherv"), std::vector<Tensor>{send, recv}, CountsAndDispls{},
        to_elements(recv_counts, row_elements(recv)));
    CountsAndDispls& r = pending->recv_counts();
    MOE_MPI_CHECK(MPI_Iallgatherv_c(send.raw(), send.numel(), type, recv.raw(), r.counts.data(),
                                    r.displs.data(), type, comm_, pending->handle()));
    return Request(std::move(pending));
  }

  Request iall_to_all_v(const Tensor& send, std::span<const int64_t> send_counts, Tensor& recv,
                        std::span<const int64_t> recv_counts) override {
    check_all_to_all_v(send, send_counts, recv, recv_counts);
    check_host("all_to_all_v", send);
    check_host("all_to_all_v", recv);
    MPI_Datatype type = mpi_type(send.dtype());
    int64_t width = row_elements(send);
    auto pending = std::make_unique<MpiPendingOp>(
        what("all_to_all_v"), std::vector<Tensor>{send, recv}, to_elements(send_counts, width),
        to_elements(recv_counts, width));
    CountsAndDispls& s = pending->send_counts();
    CountsAndDispls& r = pending->recv_counts();
    MOE_MPI_CHECK(MPI_Ialltoallv_c(send.raw(), s.counts.data(), s.displs.data(), type, recv.raw(),
                                   r.counts.data(), r.displs.data(), type, comm_,
                                   pending->handle()));
    return Request(std::move(pending));
  }

  Request ibroadcast(Tensor& buf, int root) override {
    check_buffer("broadcast", buf);
    check_host("broadcast", buf);
    check_peer("broadcast", root);
    auto pending = std::make_unique<MpiPendingOp>(what("broadcast"), std::vector<Tensor>{buf});
    MOE_MPI_CHECK(MPI_Ibcast_c(buf.raw(), buf.numel(), mpi_type(buf.dtype()), root, comm_,
                               pending->handle()));
    return Request(std::move(pending));
  }

  // MPICH's reduce-scatter adds in an order of its own (not promised to be the all-reduce's):
  // bitwise equal to an all-reduce's slice only where one addition decides it (2 ranks).
  Request ireduce_scatterv(const Tensor& send, Tensor& recv, std::span<const int64_t> recv_counts,
                           ReduceOp op) override {
    check_reduce_scatterv(send, recv, recv_counts, op);
    check_host("reduce_scatterv", send);
    check_host("reduce_scatterv", recv);
    auto pending = std::make_unique<MpiPendingOp>(
        what("reduce_scatterv"), std::vector<Tensor>{send, recv}, CountsAndDispls{},
        to_elements(recv_counts, row_elements(send)));
    CountsAndDispls& r = pending->recv_counts();
    MOE_MPI_CHECK(MPI_Ireduce_scatter_c(send.raw(), recv.raw(), r.counts.data(),
                                        mpi_type(send.dtype()), mpi_op(op), comm_,
                                        pending->handle()));
    return Request(std::move(pending));
  }

  Request isend(const Tensor& buf, int peer, int tag) override {
    check_buffer("send", buf);
    check_host("send", buf);
    check_peer("send", peer);
    auto pending = std::make_unique<MpiPendingOp>(
        str(what("send"), " to rank ", peer, " tag ", tag), std::vector<Tensor>{buf});
    MOE_MPI_CHECK(MPI_Isend_c(buf.raw(), buf.numel(), mpi_type(buf.dtype()), peer, tag, comm_,
                              pending->handle()));
    return Request(std::move(pending));
  }

  Request irecv(Tensor& buf, int peer, int tag) override {
    check_buffer("recv", buf);
    check_host("recv", buf);
    check_peer("recv", peer);
    auto pending = std::make_unique<MpiPendingOp>(
        str(what("recv"), " of ", buf.describe(), " from rank ", peer, " tag ", tag),
        std::vector<Tensor>{buf});
    MPI_Datatype type = mpi_type(buf.dtype());
    pending->expect_elements(buf.numel(), type);
    MOE_MPI_CHECK(MPI_Irecv_c(buf.raw(), buf.numel(), type, peer, tag, comm_, pending->handle()));
    return Request(std::move(pending));
  }

  void barrier() override { MOE_MPI_CHECK(MPI_Barrier(comm_)); }

 private:
  std::string what(const char* op) const { return str(op, " on ", describe()); }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

// ---- public functions ------------------------------------------------------------------------

std::unique_ptr<Communicator> make_mpi_world() {
  ensure_initialized();
  MPI_Comm world = MPI_COMM_NULL;
  // A duplicate keeps our traffic apart from anything else the program does on MPI_COMM_WORLD.
  MOE_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
  // Wait mode: sleep when this node holds more ranks than we may use cores (oversubscribed).
  auto communicator = std::make_unique<MpiCommunicator>(world);
  const int node_ranks = communicator->split_node()->size();
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  WaitMode mode = node_ranks > cores ? WaitMode::sleep : WaitMode::spin;
  if (const char* env = std::getenv("MOE_MPI_WAIT")) {
    const std::string v = env;
    if (v == "spin" || v == "sleep")
      mode = v == "spin" ? WaitMode::spin : WaitMode::sleep;
    else
      MOE_LOG_WARN("MOE_MPI_WAIT='", v, "' is neither spin nor sleep: ignored");
  }
  set_wait_mode(mode);
  MOE_LOG_DEBUG("MPI waits: ", wait_mode_name(mode), " (", node_ranks, " ranks on this node, ",
                cores, " usable cores)");
  return communicator;
}

int mpi_thread_level() { return g_thread_level; }

bool mpi_thread_multiple() { return g_thread_level >= MPI_THREAD_MULTIPLE; }

bool launched_under_mpi() {
  // Hydra (MPICH) and Slurm's PMI/PMI2 set PMI_RANK/PMI_SIZE; PMIx launchers set PMIX_RANK;
  // Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; Hydra also sets MPI_LOCALNRANKS.
  for (const char* var : {"PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE",
                          "MPI_LOCALNRANKS", "HYDRA_CONTROL_FD"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

void abort_job(const std::string& message, int code) {
  if (code == 0) code = 1;
  std::fprintf(stderr, "moe: rank %d: %s\n", world_rank_or_minus_one(), message.c_str());
  std::fflush(stderr);
  // The launcher forwards our stderr through a pipe; MPI_Abort makes it kill every process, and
  // output still in the pipe can be lost then (seen with hydra about one run in six). A short
  // pause lets the message reach the user first.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  if (mpi_usable()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace moe::comm
