// moe-plan calibrate (moe/plan/calibrate.h): the measurements of plan/calibrate_measure.h put
// together as a cluster spec, each value with a note of how it was measured. Values one process
// cannot measure (the links between ranks) get documented defaults, listed in `unmeasured` and
// marked in the file, so that the spec still reads and the reader knows what to replace.
#include "moe/plan/calibrate.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "moe/cuda.h"
#include "moe/error.h"
#include "moe/settings.h"
#include "moe/threads.h"
#include "moe/version.h"
#include "plan/calibrate_measure.h"
#include "plan/check.h"

namespace moe::plan {

void check_scratch_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  PLAN_CHECK(!dir.empty(), "no scratch directory given");
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  PLAN_CHECK(fs::exists(st), "scratch directory '", dir, "' does not exist");
  PLAN_CHECK(fs::is_directory(st), "scratch directory '", dir, "' is not a directory");
  const std::string probe =
      (fs::path(dir) / str(".moe-plan-calibrate-", ::getpid(), ".probe")).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  PLAN_CHECK(fd >= 0, "scratch directory '", dir,
             "': cannot create a file there to measure the SSD: ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

namespace {

struct Run {
  const CalibrateOptions& options;
  measure::Sizes sizes;
  Calibration out;
  std::unique_ptr<comm::Communicator> node, across;  // ranks of this node; same local rank

  void say(const std::string& line) const {
    if (options.progress) options.progress(line);
  }
  // Stores `r` (rounded to what a timing can claim) into `field` with its notes under `key`.
  void measured(const std::string& key, double& field, const measure::Result& r, const char* unit) {
    field = measure::round4(r.value);
    auto& notes = out.notes.notes[key];
    notes.push_back("measured: " + (r.notes.empty() ? std::string() : r.notes.front()));
    notes.insert(notes.end(), r.notes.begin() + (r.notes.empty() ? 0 : 1), r.notes.end());
    say(str(key, ": ", measure::rate_text(r.value, unit)));
  }
};

void topology(Run& run) {
  ClusterSpec& s = run.out.spec;
  comm::Communicator* world = run.options.world;
  const bool cuda = run.options.device.kind == Device::cuda;
  s.device_is_host = !cuda;
  if (!world || world->size() == 1) {
    s.nodes = 1;
    s.devices_per_node = cuda ? cuda::device_count() : 1;
    run.out.notes.notes["devices_per_node"] = {cuda ? "the CUDA devices this process sees"
                                                    : "one process using every core"};
    return;
  }
  run.node = world->split_node();
  run.across = world->split(run.node->rank(), world->rank());
  s.devices_per_node = run.node->size();
  s.nodes = (world->size() + s.devices_per_node - 1) / s.devices_per_node;
  run.out.notes.notes["devices_per_node"] = {
      str("ranks per node under the launcher (", world->size(), " ranks in all)")};
}

void memory(Run& run) {
  ClusterSpec& s = run.out.spec;
  auto& notes = run.out.notes.notes;
  s.host_bytes = measure::host_memory_bytes();
  notes["memory.host"] = {"/proc/meminfo MemTotal: " + measure::bytes_text(s.host_bytes)};
  if (s.device_is_host) {
    s.device_bytes = s.host_bytes / static_cast<double>(s.devices_per_node);
    notes["memory.device"] = {str("MemTotal / devices_per_node (device_kind cpu: one pool): ",
                                  measure::bytes_text(s.device_bytes))};
  } else {
    s.device_bytes = measure::cuda_device_bytes(run.options.device.index);
    notes["memory.device"] = {"CUDA device " + cuda::device_name(run.options.device.index)};
  }
  s.ssd_bytes = measure::free_disk_bytes(run.options.scratch_dir);
  notes["memory.ssd"] = {str("statvfs: free space in ", run.options.scratch_dir, ": ",
                             measure::bytes_text(s.ssd_bytes))};
}

void compute(Run& run, double& adamw_node_rate) {
  ClusterSpec& s = run.out.spec;
  const Device device = run.options.device;
  run.say(str("GEMM f32 on ", device.str(), " ..."));
  measure::Result gemm = measure::gemm_rate(device, run.sizes);
  gemm.notes.insert(
      gemm.notes.begin(),
      str("ops::gemm, ", num_threads(), " threads; the best of each shape's median, M x K x N:"));
  run.measured("compute.f32", s.gemm_f32, gemm, "FLOP/s");
  const measure::Result grouped = measure::grouped_gemm_rates(device, run.sizes, gemm.value);
  auto& f32_notes = run.out.notes.notes["compute.f32"];
  f32_notes.insert(f32_notes.end(), grouped.notes.begin(), grouped.notes.end());
  // ops::gemm is fp32: a bf16/f16 model computes through its fp32 copies (Param::compute).
  s.gemm_bf16 = s.gemm_f16 = s.gemm_f32;
  for (const char* key : {"compute.bf16", "compute.f16"})
    run.out.notes.notes[key] = {"the f32 rate: bf16/f16 parameters compute in fp32 here"};
  run.say("AdamW ...");
  const measure::Result adamw = measure::adamw_rate(run.sizes);
  adamw_node_rate = adamw.value;
  const double share = s.device_is_host ? 1 : static_cast<double>(s.devices_per_node);
  measure::Result per_device = adamw;
  per_device.value /= share;
  if (share > 1) per_device.notes.push_back(str("the node's rate / ", share, " devices"));
  run.measured("compute.cpu_adamw", s.cpu_adamw, per_device, "param/s");
}

void bandwidths(Run& run, double adamw_node_rate) {
  ClusterSpec& s = run.out.spec;
  const Device device = run.options.device;
  auto& notes = run.out.notes.notes;
  run.say("memcpy ...");
  run.measured("bandwidth.memcpy", s.memcpy_bw, measure::memcpy_rate(run.sizes), "B/s");
  if (s.device_is_host) {
    s.host_device_bw = s.memcpy_bw;
    notes["bandwidth.host_device"] = {"the memcpy rate (device_kind cpu: one memory)"};
    // The planner costs a device AdamW step as 2 x 16 B of fp32 state per parameter over this
    // bandwidth; derived so that it gives back the AdamW rate measured here.
    s.device_memory_bw = measure::round4(adamw_node_rate * 32);
    notes["bandwidth.device_memory"] = {
        "derived: the measured AdamW rate x 32 B per parameter (2 x 16 B of fp32 state, as the "
        "planner counts a step)"};
  } else {
    run.say("host <-> device copies ...");
    run.measured("bandwidth.host_device", s.host_device_bw,
                 measure::host_device_rate(device, run.sizes), "B/s");
    run.measured("bandwidth.device_memory", s.device_memory_bw,
                 measure::device_memory_rate(device, run.sizes), "B/s");
  }
  run.say(str("SSD in ", run.options.scratch_dir, " ..."));
  run.measured("bandwidth.ssd", s.ssd_bw, measure::ssd_rate(run.options.scratch_dir, run.sizes),
               "B/s");
}

// Why a link was not measured, what was written instead, and how to measure it.
struct Unmeasured {
  std::string why, written, how;
};

// One link (intra or inter node): measured over `comm` when it has several ranks, else
// `fallback_bw` and a latency of 0, marked as not measured in the file and for stderr.
void link(Run& run, comm::Communicator* comm, const std::string& which, double& bw, double& latency,
          double fallback_bw, const Unmeasured& u) {
  if (comm && comm->size() > 1) {
    run.say(str(which, " all-to-all-v and all-reduce over ", comm->size(), " ranks ..."));
    const measure::Link l = measure::link_rates(*comm, run.sizes);
    run.measured("bandwidth." + which, bw, l.bandwidth, "B/s");
    run.measured("latency." + which, latency, l.latency, "s");
    return;
  }
  bw = fallback_bw;
  latency = 0;
  run.out.notes.notes["bandwidth." + which] = {str("NOT MEASURED (", u.why, "): ", u.written),
                                               u.how};
  run.out.notes.notes["latency." + which] = {
      str("NOT MEASURED (", u.why, "): 0, so the planner counts no latency")};
  run.out.unmeasured.push_back(str("[bandwidth] ", which, ", [latency] ", which, ": not measured (",
                                   u.why, "): the bandwidth is ", u.written, ", the latency 0; ",
                                   u.how));
}

// [overhead]: measured by training steps on the CPU; a CUDA device's is not measured yet.
void overhead(Run& run) {
  ClusterSpec& s = run.out.spec;
  if (!s.device_is_host) {
    run.out.unmeasured.push_back(
        "[overhead]: not measured on a CUDA device yet (the training steps are timed on the CPU): "
        "the spec has no [overhead] table, so predict counts no non-GEMM work; write it by hand");
    return;
  }
  run.say("training steps of small models (non-GEMM overhead) ...");
  const measure::Overhead o = measure::step_overhead(run.sizes, s);
  s.has_overhead = true;
  run.measured("overhead.per_step", s.overhead_per_step, o.per_step, "s");
  run.measured("overhead.per_layer", s.overhead_per_layer, o.per_layer, "s");
  run.measured("overhead.elementwise", s.elementwise_bw, o.elementwise, "B/s");
}

void links(Run& run) {
  ClusterSpec& s = run.out.spec;
  const std::string rate = s.device_is_host ? "memcpy" : "host_device";
  const Unmeasured intra{run.node ? "one rank per node" : "one process", "the " + rate + " rate",
                         "run under mpiexec -n 2 or more to measure it"};
  link(run, run.node.get(), "intra_node", s.intra_node_bw, s.intra_node_latency,
       s.device_is_host ? s.memcpy_bw : s.host_device_bw, intra);
  const Unmeasured inter{"one node", "the intra_node rate, unused while nodes = 1",
                         "run under mpiexec on several nodes to measure it"};
  link(run, run.across.get(), "inter_node", s.inter_node_bw, s.inter_node_latency, s.intra_node_bw,
       inter);
}

}  // namespace

Calibration calibrate(const CalibrateOptions& options) {
  check_scratch_dir(options.scratch_dir);
  if (options.device.kind == Device::cuda) {
    PLAN_CHECK(cuda::available(), "cannot calibrate device cuda: no usable CUDA device (",
               cuda::unavailable_reason(), ")");
    cuda::set_device(options.device.index);
  }
  Run run{options, measure::Sizes{options.quick}, {}, nullptr, nullptr};
  const std::string cpu = measure::cpu_model(), when = measure::utc_now();
  topology(run);
  ClusterSpec& s = run.out.spec;
  s.name = s.device_is_host ? cpu : cuda::device_name(options.device.index);
  memory(run);
  double adamw_node_rate = 0;
  compute(run, adamw_node_rate);
  bandwidths(run, adamw_node_rate);
  overhead(run);
  links(run);
  run.out.notes.header = {
      str("measured by moe-plan calibrate on ", cpu, " at ", when),
      str("moe ", version(), " (", git_revision(), "), device ", options.device.str(), ", ",
          num_threads(), " threads",
          options.quick ? str(", ", flag_for(Setting::calibrate_quick), " (small sizes)")
                        : std::string()),
      "Rates are medians over repetitions, rounded to 4 digits; on a shared machine they are",
      "noisy: run it again to see how much. Values marked NOT MEASURED are defaults to replace."};
  return std::move(run.out);
}

}  // namespace moe::plan
