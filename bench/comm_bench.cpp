// moe-comm-bench: all-to-all-v (uniform counts; flat and hierarchical) and all_reduce (f32 sum),
// nccl-tests style: per message size the time per call, algbw = bytes / time and busbw with the
// nccl-tests factors, a correctness column (#wrong elements over all ranks), and a ceiling measured
// in the same run with the ratio to it. --device cpu (default): host buffers on the MPI
// communicator, against a one-core memcpy of the same bytes. --device cuda: buffers on each rank's
// GPU on an NCCL communicator (bootstrapped over MPI), against a device-to-device copy of the same
// bytes on one GPU. Run it under mpiexec (mpiexec -n 4 build/bin/moe-comm-bench); not a test,
// nothing is asserted. R = world size, L = ranks per (virtual) node of the hierarchical all-to-all.
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
#include "moe/comm/all_to_all.h"
#include "moe/comm/communicator.h"
#include "moe/comm/hierarchical_a2a.h"
#include "moe/cuda.h"
#include "moe/timer.h"
#ifdef MOE_HAVE_CUDA
#include "moe/comm/nccl.h"
#endif

using namespace moe;
using comm::Communicator;

namespace {

struct Options {
  bool quick = false, json = false;
  int ranks_per_node = 2;
  double min_seconds = 0.1;
  int64_t max_bytes = int64_t{64} << 20;
  std::string device = "cpu";
};

// Where the measured collectives run. The MPI world carries the bench's own bookkeeping (barriers,
// the slowest rank's time, the #wrong sums, the ceiling's hand-over) on every device, so none of it
// is queued on the device streams being timed.
struct Setup {
  Communicator& control;  // the MPI world
  Communicator& data;     // the communicator measured: the MPI world (cpu) or NCCL (cuda)
  Device device;          // of the buffers: cpu, or this rank's GPU
  // Waits for the work queued on the device (nothing to wait for on the CPU), so that a clock
  // stopped after it has measured completed work.
  void synchronize() const {
    if (device.kind == Device::cuda) cuda::synchronize(device.index);
  }
};

struct Measure {
  double seconds = 0;  // per call: mean over the timed calls, slowest rank
  int64_t calls = 0;
  int64_t wrong = 0;  // elements that differ from the expected result, summed over ranks
};

struct Row {
  int64_t bytes = 0, count = 0;
  double ceiling_seconds = 0;  // memcpy (cpu) or device-to-device copy (cuda) of the same bytes
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
// is the best run, the one least disturbed by other processes on a shared machine. On a GPU each
// call returns once its NCCL work completed (Request::wait), and the device is synchronised
// before every clock stops, so no queued work escapes the measurement.
Measure time_collective(const Setup& setup, const std::function<void()>& call, double min_seconds,
                        int trials = 3) {
  Communicator& control = setup.control;
  call();
  setup.synchronize();
  control.barrier();
  Timer one;
  call();
  setup.synchronize();
  int64_t ns = reduce_i64(control, static_cast<int64_t>(one.seconds() * 1e9), comm::ReduceOp::max);
  Measure m;
  m.calls = std::clamp<int64_t>(
      static_cast<int64_t>(min_seconds / trials * 1e9 / std::max<int64_t>(ns, 1)), 3, 1000);
  for (int t = 0; t < trials; ++t) {
    control.barrier();
    Timer total;
    for (int64_t i = 0; i < m.calls; ++i) call();
    setup.synchronize();
    int64_t mine = static_cast<int64_t>(total.seconds() * 1e9);
    double seconds = static_cast<double>(reduce_i64(control, mine, comm::ReduceOp::max)) * 1e-9 /
                     static_cast<double>(m.calls);
    m.seconds = t == 0 ? seconds : std::min(m.seconds, seconds);
  }
  return m;
}

// The best of at least 3 runs of `one_copy` (which returns the seconds of one copy), and of as many
// as fit in min_seconds.
double best_copy_seconds(const std::function<double()>& one_copy, double min_seconds) {
  Timer total;
  int reps = 0;
  double best = 0;
  do {
    const double s = one_copy();
    best = reps == 0 ? s : std::min(best, s);
    ++reps;
  } while (reps < 3 || total.seconds() < min_seconds);
  return best;
}

// One core copying `bytes` with memcpy.
double host_copy_seconds(int64_t bytes, double min_seconds) {
  std::vector<std::byte> src(static_cast<size_t>(bytes), std::byte{1}),
      dst(static_cast<size_t>(bytes), std::byte{0});
  std::memcpy(dst.data(), src.data(), src.size());
  size_t reps = 0;
  return best_copy_seconds(
      [&] {
        Timer t;
        std::memcpy(dst.data(), src.data(), src.size());
        const double s = t.seconds();
        src[++reps % src.size()] = dst[0];  // keep the copies observable
        return s;
      },
      min_seconds);
}

// One device-to-device copy of `bytes` on `device` (cudaMemcpyAsync on its compute stream), timed
// to the end of a device synchronisation as the collectives are.
double device_copy_seconds(Device device, int64_t bytes, double min_seconds) {
  Tensor src = Tensor::zeros({bytes}, DType::u8, device);
  Tensor dst = Tensor::empty({bytes}, DType::u8, device);
  dst.copy_from(src);
  cuda::synchronize(device.index);
  return best_copy_seconds(
      [&] {
        Timer t;
        dst.copy_from(src);
        cuda::synchronize(device.index);
        return t.seconds();
      },
      min_seconds);
}

// The ceiling: one copy of `bytes` on rank 0 (a one-core memcpy, or a device-to-device copy on its
// GPU) while the other ranks sleep (they poll a non-blocking reduction every 0.2 ms rather than
// spin in a blocking one, so rank 0 has a core to itself).
double measure_ceiling(const Setup& setup, int64_t bytes, double min_seconds) {
  Communicator& control = setup.control;
  Tensor done = Tensor::zeros({1}, DType::i64);
  double best = 0;
  if (control.rank() == 0) {
    best = setup.device.kind == Device::cuda ? device_copy_seconds(setup.device, bytes, min_seconds)
                                             : host_copy_seconds(bytes, min_seconds);
    control.iall_reduce(done, comm::ReduceOp::sum).wait();
  } else {
    comm::Request request = control.iall_reduce(done, comm::ReduceOp::sum);
    while (!request.test()) usleep(200);
  }
  Tensor shared = Tensor::empty({1});
  shared.data<float>()[0] = static_cast<float>(best);
  control.broadcast(shared, 0);
  return shared.data<float>()[0];
}

// Element i of the block rank `src` sends to rank `dst`: exact in f32, distinct per (src, dst).
float a2a_value(int src, int dst, int64_t i) {
  return static_cast<float>((src * 64 + dst) * 4096 + i % 4096);
}

// Buffers are filled on the host and copied to the device (Tensor::to returns the host tensor
// itself on the CPU); results are copied back to the host after the timed calls.
Measure bench_all_to_all(const Setup& setup, comm::AllToAllV& a2a, int64_t count,
                         double min_seconds) {
  const int R = setup.data.size(), me = setup.data.rank();
  const int64_t per_peer = count / R;
  Tensor host_send = Tensor::empty({per_peer * R}), host_recv = Tensor::empty({per_peer * R});
  for (int d = 0; d < R; ++d)
    for (int64_t i = 0; i < per_peer; ++i)
      host_send.data<float>()[d * per_peer + i] = a2a_value(me, d, i);
  host_recv.fill(std::nanf(""));
  const Tensor send = host_send.to(setup.device);
  Tensor recv = host_recv.to(setup.device);
  std::vector<int64_t> counts(static_cast<size_t>(R), per_peer);
  Measure m = time_collective(
      setup, [&] { a2a.run(send, counts, recv, counts); }, min_seconds);
  const Tensor got = recv.to(Device{});
  int64_t wrong = 0;
  for (int s = 0; s < R; ++s)
    for (int64_t i = 0; i < per_peer; ++i)
      wrong += got.data<float>()[s * per_peer + i] != a2a_value(s, me, i);
  m.wrong = reduce_i64(setup.control, wrong, comm::ReduceOp::sum);
  return m;
}

Measure bench_all_reduce(const Setup& setup, int64_t count, double min_seconds) {
  Communicator& data = setup.data;
  const int R = data.size(), me = data.rank();
  Tensor host = Tensor::empty({count});
  host.fill(1.0f);
  Tensor buf = host.to(setup.device);
  // In place, so the values grow; the timing is what matters here, correctness is checked below.
  Measure m = time_collective(
      setup, [&] { data.all_reduce(buf, comm::ReduceOp::sum); }, min_seconds);
  for (int64_t i = 0; i < count; ++i)
    host.data<float>()[i] = static_cast<float>((me + 1) * (i % 13));
  buf = host.to(setup.device);
  data.all_reduce(buf, comm::ReduceOp::sum);
  const Tensor got = buf.to(Device{});
  int64_t wrong = 0;
  const float ranks_sum = static_cast<float>(R * (R + 1) / 2);
  for (int64_t i = 0; i < count; ++i)
    wrong += got.data<float>()[i] != ranks_sum * static_cast<float>(i % 13);
  m.wrong = reduce_i64(setup.control, wrong, comm::ReduceOp::sum);
  return m;
}

std::string size_label(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// What the output calls the collectives and the ceiling on each device.
struct Labels {
  const char* backend;     // first header line
  const char* flat;        // table titles
  const char* all_reduce;  //
  const char* ceiling;     // ceiling column
  const char* ratio;       // busbw / ceiling column
  const char* json_ceiling;
};
constexpr Labels kCpuLabels{"MPI",
                            "all-to-all-v, flat (MPI_Ialltoallv_c)",
                            "all_reduce, f32 sum, in place (MPI_Iallreduce_c)",
                            "memcpy",
                            "bus/mem",
                            "memcpy_gbs"};
constexpr Labels kCudaLabels{"NCCL, buffers on the GPUs",
                             "all-to-all-v, flat (ncclSend/ncclRecv in one group)",
                             "all_reduce, f32 sum, in place (ncclAllReduce)",
                             "d2d",
                             "bus/d2d",
                             "d2d_copy_gbs"};

void print_table(const char* title, const std::vector<Row>& rows, const Measure Row::*which,
                 double bus_factor, bool vs_flat, const Labels& labels) {
  std::printf("#\n# %s\n", title);
  std::printf("# %10s %10s %5s %10s %9s %9s %9s %8s %7s%s\n", "size", "count", "type", "time",
              "algbw", "busbw", labels.ceiling, labels.ratio, "#wrong",
              vs_flat ? "   vs flat" : "");
  std::printf("# %10s %10s %5s %10s %9s %9s %9s %8s %7s%s\n", "(B)", "(elements)", "", "(us)",
              "(GB/s)", "(GB/s)", "(GB/s)", "(%)", "", vs_flat ? "  (time x)" : "");
  for (const Row& r : rows) {
    const Measure& m = r.*which;
    const double algbw = static_cast<double>(r.bytes) / m.seconds * 1e-9;
    const double busbw = algbw * bus_factor;
    const double ceiling = static_cast<double>(r.bytes) / r.ceiling_seconds * 1e-9;
    std::printf("  %10ld %10ld %5s %10.1f %9.3f %9.3f %9.2f %8.1f %7ld", static_cast<long>(r.bytes),
                static_cast<long>(r.count), "f32", m.seconds * 1e6, algbw, busbw, ceiling,
                100.0 * busbw / ceiling, static_cast<long>(m.wrong));
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
  int machine_nodes = 0;
  {
    std::unique_ptr<Communicator> node = world.split_node();
    machine_nodes =
        static_cast<int>(reduce_i64(world, node->rank() == 0 ? 1 : 0, comm::ReduceOp::sum));
  }

  // On a GPU: the node-local rank's device, and an NCCL communicator over it (destroyed before
  // the MPI world it bootstraps from, and after the all-to-all objects below that use it).
  const Device device = tools::resolve_device(opt.device, &world);
  std::unique_ptr<Communicator> nccl;
  std::vector<int64_t> rank_devices;
  if (device.kind == Device::cuda) {
#ifdef MOE_HAVE_CUDA
    nccl = comm::make_nccl(world, {device.index, 0});  // refuses two ranks on one GPU
#endif
    Tensor mine = Tensor::empty({1}, DType::i64), all = Tensor::empty({R}, DType::i64);
    mine.data<int64_t>()[0] = device.index;
    world.all_gather(mine, all);
    rank_devices.assign(all.data<int64_t>(), all.data<int64_t>() + R);
  }
  const Setup setup{world, nccl ? *nccl : world, device};
  const bool on_gpu = device.kind == Device::cuda;
  const Labels& labels = on_gpu ? kCudaLabels : kCpuLabels;

  comm::AllToAllV flat(setup.data, comm::A2AAlgorithm::flat);
  std::unique_ptr<comm::AllToAllV> hierarchical;
  if (opt.ranks_per_node > 0 && R % opt.ranks_per_node == 0)
    hierarchical = std::make_unique<comm::AllToAllV>(setup.data, comm::A2AAlgorithm::hierarchical,
                                                     opt.ranks_per_node);
  // The first calls of a collective on a fresh communicator set up shared-memory channels (about
  // 3 ms here; NCCL connects its peers lazily too): keep that out of the first row.
  for (int i = 0; i < 20; ++i) {
    bench_all_to_all(setup, flat, 64 * R, 0);
    if (hierarchical) bench_all_to_all(setup, *hierarchical, 64 * R, 0);
    bench_all_reduce(setup, 64, 0);
  }
  const int64_t max_bytes = opt.quick ? std::min<int64_t>(opt.max_bytes, 1 << 20) : opt.max_bytes;
  std::vector<Row> rows;
  for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
    Row r;
    r.count = bytes / 4 / R * R;  // uniform all-to-all blocks: a multiple of R elements
    r.bytes = r.count * 4;
    r.ceiling_seconds = measure_ceiling(setup, bytes, opt.min_seconds);
    r.flat = bench_all_to_all(setup, flat, r.count, opt.min_seconds);
    if (hierarchical) {
      r.hierarchical = bench_all_to_all(setup, *hierarchical, r.count, opt.min_seconds);
      r.has_hierarchical = true;
    }
    r.all_reduce = bench_all_reduce(setup, r.count, opt.min_seconds);
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
  const std::string gpu = on_gpu ? cuda::device_name(device.index) : "";
  if (!opt.json) {
    std::printf("# moe-comm-bench: all-to-all-v (uniform counts) and all_reduce (f32 sum), %s\n",
                labels.backend);
    if (!on_gpu) {
      std::printf(
          "# %s, host %s (%s), %d ranks on %d machine node(s), %ld online cores, %s waits\n",
          bench::now_utc().c_str(), host, bench::cpu_model().c_str(), R, machine_nodes,
          sysconf(_SC_NPROCESSORS_ONLN), comm::wait_mode_name(comm::wait_mode()));
    } else {
      std::printf("# %s, host %s (%s), %d ranks on %d machine node(s), %ld online cores\n",
                  bench::now_utc().c_str(), host, bench::cpu_model().c_str(), R, machine_nodes,
                  sysconf(_SC_NPROCESSORS_ONLN));
      std::string devices;
      for (int64_t d : rank_devices) devices += " cuda:" + std::to_string(d);
      std::printf("# GPU of rank 0: %s; devices by rank:%s\n", gpu.c_str(), devices.c_str());
    }
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
    if (on_gpu)
      std::printf(
          "# each call returns when its NCCL work completed; the device is synchronised before "
          "each clock stops\n");
    std::printf(
        "# algbw = size / time; busbw = algbw * (R-1)/R (all-to-all), algbw * 2(R-1)/R "
        "(all_reduce)\n");
    if (!on_gpu)
      std::printf(
          "# memcpy = one core copying size bytes (rank 0, the others asleep), best run; "
          "bus/mem = busbw / memcpy\n");
    else
      std::printf(
          "# d2d = one device-to-device copy of size bytes on rank 0's GPU (the others asleep), "
          "synchronised, best run; bus/d2d = busbw / d2d\n");
    std::printf("# #wrong = elements differing from the expected result, summed over ranks\n");
    print_table(labels.flat, rows, &Row::flat, a2a_factor, false, labels);
    if (h) {
      std::string title = "all-to-all-v, hierarchical (" + std::to_string(h->nodes()) + " x " +
                          std::to_string(h->ranks_per_node()) + "); vs flat = time / flat time";
      print_table(title.c_str(), rows, &Row::hierarchical, a2a_factor, true, labels);
    }
    print_table(labels.all_reduce, rows, &Row::all_reduce, reduce_factor, false, labels);
  } else {
    nlohmann::json out;
    out["benchmark"] = "comm";
    out["device"] = on_gpu ? "cuda" : "cpu";
    out["date"] = bench::now_utc();
    out["host"] = host;
    out["cpu"] = bench::cpu_model();
    if (on_gpu) {
      out["gpu"] = gpu;
      out["rank_devices"] = rank_devices;
    }
    out["ranks"] = R;
    out["machine_nodes"] = machine_nodes;
    if (h) out["hierarchical"] = {{"nodes", h->nodes()}, {"ranks_per_node", h->ranks_per_node()}};
    for (const Row& r : rows) {
      nlohmann::json row = {
          {"bytes", r.bytes},
          {"count", r.count},
          {"dtype", "f32"},
          {labels.json_ceiling, static_cast<double>(r.bytes) / r.ceiling_seconds * 1e-9},
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
      "1 KiB to 64 MiB per rank (powers of 4), nccl-tests style, against a copy of the same bytes "
      "(a one-core memcpy; with --device cuda a device-to-device copy on one GPU).",
      "moe-comm-bench"};
  app.add_flag("--quick", opt.quick, "Sizes up to 1 MiB, shorter measurements (smoke run)");
  app.add_flag("--json", opt.json, "One JSON object on stdout (rank 0) instead of the tables");
  app.add_option("--device", opt.device,
                 "Where the buffers live: cpu (MPI) or cuda (NCCL; each rank takes the GPU of "
                 "its node-local rank)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
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
    // Refused before MPI starts or any buffer exists, on every rank alike.
    if (opt.device == "cuda" && !cuda::available())
      throw Error(str("--device cuda: ", cuda::unavailable_reason()));
    try {
      return run(opt);
    } catch (const std::exception& e) {
      // A failure on one rank would leave the others waiting in a collective: end the whole job.
      comm::abort_job(std::string("moe-comm-bench: error: ") + e.what(), 1);
    }
  });
}
