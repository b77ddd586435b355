// moe-comm-bench: all-to-all-v (uniform counts; flat and hierarchical) and all_reduce (f32 sum) on
// the MPI communicator, nccl-tests style: per message size the time per call, algbw = bytes / time
// and busbw with the nccl-tests factors, a correctness column (#wrong elements over all ranks),
// and as the ceiling a one-core memcpy of the same bytes measured in the same run. Run it under
// mpiexec (mpiexec -n 4 build/bin/moe-comm-bench); not a test, nothing is asserted.
// R = world size, L = ranks per (virtual) node of the hierarchical all-to-all.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/cli.h"
#include "machine.h"
#include "moe/comm/communicator.h"
#include "moe/comm/hierarchical_a2a.h"
#include "moe/timer.h"

using namespace moe;
using comm::Communicator;

namespace {

struct Options {
  bool quick = false, json = false;
  int ranks_per_node = 2;
  double min_seconds = 0.1;
  int64_t max_bytes = int64_t{64} << 20;
};

struct Measure {
  double seconds = 0;  // per call: mean over the timed calls, slowest rank
  int64_t calls = 0;
  int64_t wrong = 0;  // elements that differ from the expected result, summed over ranks
};

struct Row {
  int64_t bytes = 0, count = 0;
  double memcpy_seconds = 0;
  Measure flat, hierarchical, all_reduce;
  bool has_hierarchical = false;
};

int64_t reduce_i64(Communicator& world, int64_t value, comm::ReduceOp op) {
  Tensor t = Tensor::empty({1}, DType::i64);
  t.data<int64_t>()[0] = value;
  world.all_reduce(t, op);
  return t.data<int64_t>()[0];
}

// Times `call`: two warm-up calls (the first sizes workspaces), then `trials` timed runs of as
// many calls as min_seconds / trials needs (judged from the slowest rank's second call; at least
// 3, the same number on every rank). A run's time is the slowest rank's mean per call; the result
// is the best run, the one least disturbed by other processes on a shared machine.
Measure time_collective(Communicator& world, const std::function<void()>& call, double min_seconds,
                        int trials = 3) {
  call();
  world.barrier();
  Timer one;
  call();
  int64_t ns = reduce_i64(world, static_cast<int64_t>(one.seconds() * 1e9), comm::ReduceOp::max);
  Measure m;
  m.calls = std::clamp<int64_t>(
      static_cast<int64_t>(min_seconds / trials * 1e9 / std::max<int64_t>(ns, 1)), 3, 1000);
  for (int t = 0; t < trials; ++t) {
    world.barrier();
    Timer total;
    for (int64_t i = 0; i < m.calls; ++i) call();
    int64_t mine = static_cast<int64_t>(total.seconds() * 1e9);
    double seconds = static_cast<double>(reduce_i64(world, mine, comm::ReduceOp::max)) * 1e-9 /
                     static_cast<double>(m.calls);
    m.seconds = t == 0 ? seconds : std::min(m.seconds, seconds);
  }
  return m;
}

// One core copying `bytes` on rank 0 while the other ranks sleep (they poll a non-blocking
// reduction every 0.2 ms rather than spin in a blocking one, so rank 0 has a core to itself).
double measure_memcpy(Communicator& world, int64_t bytes, double min_seconds) {
  Tensor done = Tensor::zeros({1}, DType::i64);
  double best = 0;
  if (world.rank() == 0) {
    std::vector<std::byte> src(static_cast<size_t>(bytes), std::byte{1}),
        dst(static_cast<size_t>(bytes), std::byte{0});
    std::memcpy(dst.data(), src.data(), src.size());
    Timer total;
    int reps = 0;
    do {
      Timer t;
      std::memcpy(dst.data(), src.data(), src.size());
      double s = t.seconds();
      best = reps == 0 ? s : std::min(best, s);
      ++reps;
      src[static_cast<size_t>(reps) % src.size()] = dst[0];  // keep the copies observable
    } while (reps < 3 || total.seconds() < min_seconds);
    world.iall_reduce(done, comm::ReduceOp::sum).wait();
  } else {
    comm::Request request = world.iall_reduce(done, comm::ReduceOp::sum);
    while (!request.test()) usleep(200);
  }
  Tensor shared = Tensor::empty({1});
  shared.data<float>()[0] = static_cast<float>(best);
  world.broadcast(shared, 0);
  return shared.data<float>()[0];
}

// Element i of the block rank `src` sends to rank `dst`: exact in f32, distinct per (src, dst).
float a2a_value(int src, int dst, int64_t i) {
  return static_cast<float>((src * 64 + dst) * 4096 + i % 4096);
}

Measure bench_all_to_all(Communicator& world, comm::AllToAllV& a2a, int64_t count,
                         double min_seconds) {
  const int R = world.size(), me = world.rank();
  const int64_t per_peer = count / R;
  Tensor send = Tensor::empty({per_peer * R}), recv = Tensor::empty({per_peer * R});
  for (int d = 0; d < R; ++d)
    for (int64_t i = 0; i < per_peer; ++i)
      send.data<float>()[d * per_peer + i] = a2a_value(me, d, i);
  recv.fill(std::nanf(""));
  std::vector<int64_t> counts(static_cast<size_t>(R), per_peer);
  Measure m = time_collective(
      world, [&] { a2a.run(send, counts, recv, counts); }, min_seconds);
  int64_t wrong = 0;
  for (int s = 0; s < R; ++s)
    for (int64_t i = 0; i < per_peer; ++i)
      wrong += recv.data<float>()[s * per_peer + i] != a2a_value(s, me, i);
  m.wrong = reduce_i64(world, wrong, comm::ReduceOp::sum);
  return m;
}

Measure bench_all_reduce(Communicator& world, int64_t count, double min_seconds) {
  const int R = world.size(), me = world.rank();
  Tensor buf = Tensor::empty({count});
  buf.fill(1.0f);
  // In place, so the values grow; the timing is what matters here, correctness is checked below.
  Measure m = time_collective(
      world, [&] { world.all_reduce(buf, comm::ReduceOp::sum); }, min_seconds);
  for (int64_t i = 0; i < count; ++i)
    buf.data<float>()[i] = static_cast<float>((me + 1) * (i % 13));
  world.all_reduce(buf, comm::ReduceOp::sum);
  int64_t wrong = 0;
  const float ranks_sum = static_cast<float>(R * (R + 1) / 2);
  for (int64_t i = 0; i < count; ++i)
    wrong += buf.data<float>()[i] != ranks_sum * static_cast<float>(i % 13);
  m.wrong = reduce_i64(world, wrong, comm::ReduceOp::sum);
  return m;
}

std::string size_label(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

void print_table(const char* title, const std::vector<Row>& rows, const Measure Row::*which,
                 double bus_factor, bool vs_flat) {
  std::printf("#\n# %s\n", title);
  std::printf("# %10s %10s %5s %10s %9s %9s %9s %8s %7s%s\n", "size", "count", "type", "time",
              "algbw", "busbw", "memcpy", "bus/mem", "#wrong", vs_flat ? "   vs flat" : "");
  std::printf("# %10s %10s %5s %10s %9s %9s %9s %8s %7s%s\n", "(B)", "(elements)", "", "(us)",
              "(GB/s)", "(GB/s)", "(GB/s)", "(%)", "", vs_flat ? "  (time x)" : "");
  for (const Row& r : rows) {
    const Measure& m = r.*which;
    const double algbw = static_cast<double>(r.bytes) / m.seconds * 1e-9;
    const double busbw = algbw * bus_factor;
    const double mem = static_cast<double>(r.bytes) / r.memcpy_seconds * 1e-9;
    std::printf("  %10ld %10ld %5s %10.1f %9.3f %9.3f %9.2f %8.1f %7ld", static_cast<long>(r.bytes),
                static_cast<long>(r.count), "f32", m.seconds * 1e6, algbw, busbw, mem,
                100.0 * busbw / mem, static_cast<long>(m.wrong));
    if (vs_flat) std::printf(" %9.2f", m.seconds / r.flat.seconds);
    std::printf("\n");
  }
}

nlohmann::json measure_json(const Row& r, const Measure& m, double bus_factor) {
  const double algbw = static_cast<double>(r.bytes) / m.seconds * 1e-9;
  return {{"seconds", m.seconds},
          {"calls", m.calls},
          {"algbw_gbs", algbw},
          {"busbw_gbs", algbw * bus_factor},
          {"wrong", m.wrong}};
}

int run(const Options& opt) {
  std::unique_ptr<Communicator> world_ptr = comm::make_mpi_world();
  Communicator& world = *world_ptr;
  const int R = world.size(), me = world.rank();
  const bool hierarchical_possible = opt.ranks_per_node > 0 && R % opt.ranks_per_node == 0;
  comm::AllToAllV flat(world, comm::A2AAlgorithm::flat);
  std::unique_ptr<comm::AllToAllV> hierarchical;
  if (hierarchical_possible)
    hierarchical = std::make_unique<comm::AllToAllV>(world, comm::A2AAlgorithm::hierarchical,
                                                     opt.ranks_per_node);
  int machine_nodes = 0;
  {
    std::unique_ptr<Communicator> node = world.split_node();
    machine_nodes =
        static_cast<int>(reduce_i64(world, node->rank() == 0 ? 1 : 0, comm::ReduceOp::sum));
  }
  // The first calls of a collective on a fresh communicator set up shared-memory channels (about
  // 3 ms here): keep that out of the first row.
  for (int i = 0; i < 20; ++i) {
    bench_all_to_all(world, flat, 64 * R, 0);
    if (hierarchical) bench_all_to_all(world, *hierarchical, 64 * R, 0);
    bench_all_reduce(world, 64, 0);
  }
  const int64_t max_bytes = opt.quick ? std::min<int64_t>(opt.max_bytes, 1 << 20) : opt.max_bytes;
  std::vector<Row> rows;
  for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    Row r;
    r.count = bytes / 4 / R * R;  // uniform all-to-all blocks: a multiple of R elements
    r.bytes = r.count * 4;
    r.memcpy_seconds = measure_memcpy(world, bytes, opt.min_seconds);
    r.flat = bench_all_to_all(world, flat, r.count, opt.min_seconds);
    if (hierarchical) {
      r.hierarchical = bench_all_to_all(world, *hierarchical, r.count, opt.min_seconds);
      r.has_hierarchical = true;
    }
    r.all_reduce = bench_all_reduce(world, r.count, opt.min_seconds);
    rows.push_back(r);
    if (me == 0 && !opt.json) {
      std::fprintf(stderr, "moe-comm-bench: %s done\n", size_label(bytes).c_str());
    }
  }
  if (me != 0) return 0;

  const double a2a_factor = static_cast<double>(R - 1) / R;
  const double reduce_factor = 2.0 * (R - 1) / R;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const comm::HierarchicalAllToAll* h = hierarchical ? hierarchical->hierarchical() : nullptr;
  if (!opt.json) {
    std::printf("# moe-comm-bench: all-to-all-v (uniform counts) and all_reduce (f32 sum), MPI\n");
    std::printf("# %s, host %s (%s), %d ranks on %d machine node(s), %ld online cores, %s waits\n",
                bench::now_utc().c_str(), host, bench::cpu_model().c_str(), R, machine_nodes,
                sysconf(_SC_NPROCESSORS_ONLN), comm::wait_mode_name(comm::wait_mode()));
    if (h)
      std::printf("# hierarchical: %d virtual node(s) of %d consecutive ranks%s\n", h->nodes(),
                  h->ranks_per_node(),
                  h->degenerate() ? " (one node or one rank per node: runs the flat call)" : "");
    else
      std::printf("# hierarchical: skipped (%d ranks are not divisible by --ranks-per-node %d)\n",
                  R, opt.ranks_per_node);
    std::printf("# size = bytes each rank sends (all-to-all) or reduces (all_reduce)\n");
    std::printf(
        "# time = best of 3 runs of >= 3 calls (>= %.2f s in all) after 2 warm-up calls; a run's "
        "time is the slowest rank's mean per call\n",
        opt.min_seconds);
    std::printf(
        "# algbw = size / time; busbw = algbw * (R-1)/R (all-to-all), algbw * 2(R-1)/R "
        "(all_reduce)\n");
    std::printf(
        "# memcpy = one core copying size bytes (rank 0, the others asleep), best run; "
        "bus/mem = busbw / memcpy\n");
    std::printf("# #wrong = elements differing from the expected result, summed over ranks\n");
    print_table("all-to-all-v, flat (MPI_Ialltoallv_c)", rows, &Row::flat, a2a_factor, false);
    if (h) {
      std::string title = "all-to-all-v, hierarchical (" + std::to_string(h->nodes()) + " x " +
                          std::to_string(h->ranks_per_node()) + "); vs flat = time / flat time";
      print_table(title.c_str(), rows, &Row::hierarchical, a2a_factor, true);
    }
    print_table("all_reduce, f32 sum, in place (MPI_Iallreduce_c)", rows, &Row::all_reduce,
                reduce_factor, false);
  } else {
    nlohmann::json out;
    out["benchmark"] = "comm";
    out["date"] = bench::now_utc();
    out["host"] = host;
    out["cpu"] = bench::cpu_model();
    out["ranks"] = R;
    out["machine_nodes"] = machine_nodes;
    if (h) out["hierarchical"] = {{"nodes", h->nodes()}, {"ranks_per_node", h->ranks_per_node()}};
    for (const Row& r : rows) {
      nlohmann::json row = {{"bytes", r.bytes},
                            {"count", r.count},
                            {"dtype", "f32"},
                            {"memcpy_gbs", static_cast<double>(r.bytes) / r.memcpy_seconds * 1e-9},
                            {"all_to_all_flat", measure_json(r, r.flat, a2a_factor)},
                            {"all_reduce", measure_json(r, r.all_reduce, reduce_factor)}};
      if (r.has_hierarchical)
        row["all_to_all_hierarchical"] = measure_json(r, r.hierarchical, a2a_factor);
      out["rows"].push_back(row);
    }
    std::cout << out.dump(2) << "\n";
  }
  return tools::finish_stdout("moe-comm-bench");
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "Run under mpiexec -n R. All-to-all-v (flat and hierarchical) and all_reduce (f32 sum) from "
      "1 KiB to 64 MiB per rank (powers of 4), nccl-tests style, against a one-core memcpy of the "
      "same bytes.",
      "moe-comm-bench"};
  app.add_flag("--quick", opt.quick, "Sizes up to 1 MiB, shorter measurements (smoke run)");
  app.add_flag("--json", opt.json, "One JSON object on stdout (rank 0) instead of the tables");
  app.add_option("--ranks-per-node", opt.ranks_per_node,
                 "Virtual node size of the hierarchical all-to-all")
      ->capture_default_str()
      ->check(tools::positive());
  CLI::Option* min_time =
      app.add_option("--min-time", opt.min_seconds,
                     "Seconds each measurement runs at least (default 0.1; 0.02 with --quick)")
          ->check(tools::positive());
  app.add_option("--max-size", opt.max_bytes, "Largest size per rank in bytes")
      ->capture_default_str()
      ->check(tools::positive());
  return tools::run_tool("moe-comm-bench", app, argc, argv, [&]() -> int {
    if (opt.quick && !min_time->count()) opt.min_seconds = 0.02;
    try {
      return run(opt);
    } catch (const std::exception& e) {
      // A failure on one rank would leave the others waiting in a collective: end the whole job.
      comm::abort_job(std::string("moe-comm-bench: error: ") + e.what(), 1);
    }
  });
}
