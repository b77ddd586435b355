// Expert-parallel dispatch and combine (see moe/parallel/expert_dispatcher.h).
// Shapes: P ranks of the expert group, s this rank, E experts, H held per rank, M slots, R
// arrivals, D model width.
#include "moe/parallel/expert_dispatcher.h"

#include <algorithm>
#include <utility>

#include "moe/ops/moe.h"
#include "moe/timer.h"

namespace moe::parallel {

ExpertDispatcher::ExpertDispatcher(ExpertGroup group, std::string layer, int64_t held_experts,
                                   bool placed)
    : group_(group), layer_(std::move(layer)), held_(held_experts), placed_(placed) {}

void ExpertDispatcher::exchange(const Tensor& send, const std::vector<int64_t>& send_counts,
                                Tensor& recv, const std::vector<int64_t>& recv_counts) const {
  Timer timer;
  if (group_.scheduler) {  // ahead of any queued gradient micro-op
    group_.scheduler->wait(
        group_.scheduler->all_to_all_v(send, send_counts, recv, recv_counts, group_.exchange));
  } else {
    group_.exchange->run(send, send_counts, recv, recv_counts);
  }
  if (ExchangeStats* st = group_.stats) {
    st->calls += 1;
    st->bytes += static_cast<int64_t>(send.nbytes());
    st->seconds += timer.seconds();
  }
}

// Source rank s (this rank) splits its rows of expert e (one run of x_perm: slots are in expert
// order) into chunks for e's replicas, groups them by destination rank (experts ascending inside
// each), and exchanges the [P, H] counts; the arrivals, source-major, are regrouped to
// held-expert-major for one grouped GEMM. Static layout: rank p holds experts [p H, (p+1) H),
// every expert one replica, and the send order is x_perm's.
ExpertExchange ExpertDispatcher::plan(std::span<const int32_t> expert_offsets,
                                      std::span<const int32_t> tokens_per_expert,
                                      const balance::ExpertAssignment& assignment) const {
  Timer timer;
  const int P = group_.experts->size(), s = group_.experts->rank();
  const auto E = static_cast<int64_t>(tokens_per_expert.size());
  const int64_t H = held_;
  MOE_CHECK(static_cast<int64_t>(assignment.replicas.size()) == E, "moe layer ", layer_,
            ": placement for ", assignment.replicas.size(), " experts, the layer has ", E);
  // Chunks per destination: (expert, its held index there, first x_perm row, rows).
  struct Chunk {
    int64_t expert, held, begin, rows;
  };
  std::vector<std::vector<Chunk>> to(static_cast<size_t>(P));
  auto send = [&](int32_t p, int64_t e, int64_t begin, int64_t rows) {
    MOE_CHECK(p >= 0 && p < P && rows >= 0, "moe layer ", layer_, ": expert ", e, " sends ", rows,
              " rows to rank ", p, " of ", P);
    if (rows == 0) return;
    const int64_t h =  // held index on rank p: its vExpert slot, e (placed), or its local expert
        !assignment.held_index.empty()
            ? assignment.held_index.at(static_cast<size_t>(p)).at(static_cast<size_t>(e))
        : placed_ ? e
                  : e - p * H;
    MOE_CHECK(h >= 0 && h < H, "moe layer ", layer_, ": expert ", e, " is not held by rank ", p);
    to[static_cast<size_t>(p)].push_back({e, h, begin, rows});
  };
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int32_t>& reps = assignment.replicas[static_cast<size_t>(e)];
    const auto n = static_cast<int64_t>(reps.size());
    MOE_CHECK(n >= 1, "moe layer ", layer_, ": expert ", e, " has no rank");
    const int64_t first = expert_offsets[static_cast<size_t>(e)];
    const int64_t count = tokens_per_expert[static_cast<size_t>(e)];
    if (!assignment.rows.empty()) {  // an explicit split, chunks in replica order
      const std::vector<int64_t>& split = assignment.rows.at(static_cast<size_t>(e));
      MOE_CHECK(static_cast<int64_t>(split.size()) == n, "moe layer ", layer_, ": expert ", e,
                " has ", n, " replicas but a split of ", split.size());
      int64_t b = 0;
      for (int64_t j = 0; j < n; ++j) {
        send(reps[static_cast<size_t>(j)], e, first + b, split[static_cast<size_t>(j)]);
        b += split[static_cast<size_t>(j)];
      }
      MOE_CHECK(b == count, "moe layer ", layer_, ": expert ", e, " split ", b,
                " rows of this rank's ", count);
      continue;
    }
    for (int64_t j = 0; j < n; ++j) {
      const int64_t b = balance::split_begin(count, n, j);
      send(reps[static_cast<size_t>((j + s) % n)], e, first + b,
           balance::split_begin(count, n, j + 1) - b);
    }
  }
  // The receiver lays out each source's rows held index by held index. Chunks were made in
  // expert order, which is held order except with vExpert slots (a slot holds any expert).
  auto by_held = [](const Chunk& a, const Chunk& b) { return a.held < b.held; };
  for (std::vector<Chunk>& chunks : to)
    if (!std::is_sorted(chunks.begin(), chunks.end(), by_held))
      std::stable_sort(chunks.begin(), chunks.end(), by_held);
  Tensor mine = Tensor::empty({P, H}, DType::i64);
  int64_t* m = mine.data<int64_t>();
  std::fill_n(m, P * H, 0);
  ExpertExchange ex;
  ex.slots = expert_offsets.empty() ? 0 : expert_offsets.back();
  ex.send_counts.assign(static_cast<size_t>(P), 0);
  bool identity = true;
  int64_t next = 0;
  for (int p = 0; p < P; ++p)
    for (const Chunk& c : to[static_cast<size_t>(p)]) {
      m[p * H + c.held] += c.rows;
      ex.send_counts[static_cast<size_t>(p)] += c.rows;
      identity = identity && c.begin == next;
      next = c.begin + c.rows;
    }
  if (!identity) {
    ex.send_of.reserve(static_cast<size_t>(ex.slots));
    for (int p = 0; p < P; ++p)
      for (const Chunk& c : to[static_cast<size_t>(p)])
        for (int64_t i = 0; i < c.rows; ++i)
          ex.send_of.push_back(static_cast<int32_t>(c.begin + i));
  }
  Tensor theirs = Tensor::empty({P, H}, DType::i64);
  const std::vector<int64_t> ones(static_cast<size_t>(P), 1);  // one row of H per rank
  group_.experts->all_to_all_v(mine, ones, theirs, ones);
  const int64_t* t = theirs.data<int64_t>();
  ex.recv_per_expert.assign(t, t + P * H);
  ex.recv_counts.assign(static_cast<size_t>(P), 0);
  std::vector<int64_t> source_start(static_cast<size_t>(P * H));  // arrival row of (source, h)
  int64_t row = 0;
  for (int q = 0; q < P; ++q)
    for (int64_t h = 0; h < H; ++h) {
      source_start[static_cast<size_t>(q * H + h)] = row;
      row += t[q * H + h];
      ex.recv_counts[static_cast<size_t>(q)] += t[q * H + h];
    }
  ex.local_offsets.assign(static_cast<size_t>(H) + 1, 0);
  ex.arrival_of.reserve(static_cast<size_t>(row));
  for (int64_t h = 0; h < H; ++h) {
    for (int q = 0; q < P; ++q) {
      const int64_t first = source_start[static_cast<size_t>(q * H + h)];
      for (int64_t i = 0; i < t[q * H + h]; ++i)
        ex.arrival_of.push_back(static_cast<int32_t>(first + i));
    }
    ex.local_offsets[static_cast<size_t>(h) + 1] = static_cast<int32_t>(ex.arrival_of.size());
  }
  if (ExchangeStats* st = group_.stats) st->seconds += timer.seconds();
  return ex;
}

// dst[i] = src[index[i]] (gather) or dst[index[i]] = src[i] (scatter), whole rows; `index` is a
// permutation of 0..n-1 when scattering. Both are one ops::gather_rows on the rows' device (a
// scatter gathers by the inverse permutation).
static Tensor move_rows(const Tensor& src, const std::vector<int32_t>& index, bool gather) {
  const int64_t n = static_cast<int64_t>(index.size());
  std::vector<int32_t> order = index;
  if (!gather)
    for (int64_t i = 0; i < n; ++i)
      order[static_cast<size_t>(index[static_cast<size_t>(i)])] = static_cast<int32_t>(i);
  Tensor dst = Tensor::empty({n, src.dim(1)}, DType::f32, src.device());
  ops::gather_rows(src, Tensor::from_vector({n}, order).to(src.device()), dst);
  return dst;
}

Tensor ExpertDispatcher::dispatch(const Tensor& rows, const ExpertExchange& ex) const {
  const auto arrivals = static_cast<int64_t>(ex.arrival_of.size());
  Tensor recv = Tensor::empty({arrivals, rows.dim(1)}, DType::f32, rows.device());
  exchange(ex.send_of.empty() ? rows : move_rows(rows, ex.send_of, true), ex.send_counts, recv,
           ex.recv_counts);
  return move_rows(recv, ex.arrival_of, true);
}

Tensor ExpertDispatcher::combine(const Tensor& local, const ExpertExchange& ex) const {
  Tensor send = move_rows(local, ex.arrival_of, false);
  Tensor back = Tensor::empty({ex.slots, local.dim(1)}, DType::f32, local.device());
  exchange(send, ex.recv_counts, back, ex.send_counts);
  if (!ex.send_of.empty()) back = move_rows(back, ex.send_of, false);
  return back;
}

}  // namespace moe::parallel
