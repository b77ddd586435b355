// The measurements of moe-plan calibrate (plan/calibrate.cpp assembles them into a spec). Each
// returns its number and notes saying how it was measured (shape, bytes, repetitions), the
// words the spec's comments carry. Timings are medians over repetitions after one warm-up.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/device.h"
#include "moe/plan/cluster.h"

namespace moe::plan::measure {

struct Result {
  double value = 0;                // in base units: FLOP/s, bytes/s, param/s, seconds
  std::vector<std::string> notes;  // how it was measured
};

// Sizes of one run: full, or small ones for tests.
struct Sizes {
  bool quick = false;
  int reps() const { return quick ? 3 : 7; }
};

// Dense fp32 GEMM (ops::gemm) on `device` at a few shapes: the best shape's median rate, every
// shape's rate in the notes.
Result gemm_rate(Device device, const Sizes& sizes);
// The grouped expert GEMM (ops::grouped_gemm, 8 experts) by rows per segment: notes only (the
// spec has no key for it), each rate also as a fraction of `dense_rate`; value: the largest's rate.
Result grouped_gemm_rates(Device device, const Sizes& sizes, double dense_rate);
// Host memory copies (Tensor::copy_from, CPU backend) of a large buffer: bytes copied per second.
Result memcpy_rate(const Sizes& sizes);
// Copies host -> device and device -> host (Tensor::to): the slower direction; both in the notes.
Result host_device_rate(Device device, const Sizes& sizes);
// The device's memory: copies within it (read + write bytes per second).
Result device_memory_rate(Device device, const Sizes& sizes);
// AdamW steps (optim::AdamW, CPU) over a few million fp32 parameters: parameters per second.
Result adamw_rate(const Sizes& sizes);
// A temporary file in `dir` written (then fsync'ed) and read back, with O_DIRECT where the file
// system takes it, else with the page cache dropped (posix_fadvise DONTNEED); removed afterwards.
// value: the read rate (the planner's SSD term is reads); the write rate in the notes.
Result ssd_rate(const std::string& dir, const Sizes& sizes);

// The non-GEMM cost of a training step ([overhead]): training steps (zeroed gradients, the
// Transformer's forward_backward, optim::AdamW: what train::Trainer runs a step, on the CPU) of a
// few small MoE models on fixed tokens, each median step less what predict_step counts for it
// from `spec` (its GEMM rate,
// device memory bandwidth; no [overhead]); the residuals fitted, least squares relative to each
// step and every coefficient >= 0, as per_step + layers x per_layer + saved activation bytes /
// elementwise. Each model's measured, predicted and residual seconds are in the notes.
struct Overhead {
  Result per_step, per_layer, elementwise;  // seconds, seconds, bytes/s (0: no per-byte term)
};
Overhead step_overhead(const Sizes& sizes, const ClusterSpec& spec);

// Non-negative least squares of r ~ X c over the columns of X (rows of equal length): every
// subset of the columns fitted, the feasible one (every coefficient >= 0) of least squared error;
// the other coefficients 0. Small problems only (2^columns subsets).
std::vector<double> nonnegative_fit(const std::vector<std::vector<double>>& X,
                                    const std::vector<double>& r);

// Between the ranks of `comm` (size > 1, collective): all-to-all-v by message size (bandwidth from
// the largest, latency per message from the smallest) and all-reduce by size in the notes.
struct Link {
  Result bandwidth, latency;
};
Link link_rates(comm::Communicator& comm, const Sizes& sizes);

// The machine: /proc/meminfo MemTotal, statvfs free space, /proc/cpuinfo's model name (or
// "an unknown CPU"), a CUDA device's memory from its description; the time as ISO 8601 UTC.
double host_memory_bytes();
double free_disk_bytes(const std::string& dir);
std::string cpu_model();
double cuda_device_bytes(int device);
std::string utc_now();

// The median of `values` (not empty).
double median(std::vector<double> values);
// `x` rounded to 4 significant digits: what a noisy timing can claim.
double round4(double x);
// "123 MiB", "4.2 GB/s" for notes.
std::string bytes_text(double bytes);
std::string rate_text(double value, const char* unit);

}  // namespace moe::plan::measure
