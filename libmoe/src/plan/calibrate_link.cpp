// The interconnect measurement of moe-plan calibrate: all-to-all-v and all-reduce through the
// Communicator the training runs use, by message size. Every rank calls it (collectives); each
// time is the slowest rank's, since a collective ends when its last rank does. The planner's link
// model is latency x messages + bytes / bandwidth (plan/step_time.cpp), so the smallest message
// gives the latency and the largest the bandwidth.
#include <algorithm>

#include "moe/timer.h"
#include "plan/calibrate_measure.h"

namespace moe::plan::measure {

namespace {

constexpr int64_t kRowFloats = 16;  // 64-byte rows: the smallest message is one row

// Median over repetitions of the slowest rank's seconds for `work`, after a warm-up.
template <class F>
double collective_seconds(comm::Communicator& comm, int reps, F&& work) {
  work();
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    comm.barrier();
    Timer t;
    work();
    Tensor slowest = Tensor::from_vector({1}, std::vector<float>{static_cast<float>(t.seconds())});
    comm.all_reduce(slowest, comm::ReduceOp::max);
    times.push_back(slowest.data<float>()[0]);
  }
  return median(times);
}

}  // namespace

Link link_rates(comm::Communicator& comm, const Sizes& sizes) {
  const int64_t peers = comm.size();
  const std::vector<int64_t> per_peer_bytes =
      sizes.quick ? std::vector<int64_t>{64, 1 << 20}
                  : std::vector<int64_t>{64, 64 << 10, 1 << 20, 16 << 20};
  const int reps = sizes.quick ? 3 : 10;
  Link link;
  for (const int64_t bytes : per_peer_bytes) {
    const int64_t rows = bytes / 4 / kRowFloats;
    Tensor send = Tensor::zeros({rows * peers, kRowFloats}), recv = Tensor::zeros(send.shape());
    const std::vector<int64_t> counts(static_cast<size_t>(peers), rows);
    const double a2a =
        collective_seconds(comm, reps, [&] { comm.all_to_all_v(send, counts, recv, counts); });
    Tensor sum = Tensor::zeros({rows * peers, kRowFloats});
    const double reduce =
        collective_seconds(comm, reps, [&] { comm.all_reduce(sum, comm::ReduceOp::sum); });
    const double moved = static_cast<double>(bytes * (peers - 1));  // leaves each rank
    if (bytes == per_peer_bytes.front()) link.latency.value = a2a / static_cast<double>(peers - 1);
    if (bytes == per_peer_bytes.back()) link.bandwidth.value = moved / a2a;
    link.bandwidth.notes.push_back(str(
        "all-to-all-v ", bytes_text(static_cast<double>(bytes)), " per peer: ", round4(a2a * 1e6),
        " us (", rate_text(moved / a2a, "B/s"), "); all-reduce ",
        bytes_text(static_cast<double>(bytes * peers)), ": ", round4(reduce * 1e6), " us"));
  }
  link.bandwidth.notes.insert(
      link.bandwidth.notes.begin(),
      str(peers, " ranks through the ", comm.name(), " communicator, median of ", reps,
          " (the slowest rank each time); bandwidth from the largest all-to-all-v:"));
  link.latency.notes.push_back(str("the smallest all-to-all-v (", per_peer_bytes.front(),
                                   " B per peer) / ", peers - 1, " messages"));
  return link;
}

}  // namespace moe::plan::measure
