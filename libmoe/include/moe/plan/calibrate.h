// Calibration: measure this machine through the library's own code paths (ops::gemm, Tensor
// copies, optim::AdamW, the Communicator) and describe it as a ClusterSpec that moe-plan predict
// reads, every measured value with a note saying how it was measured. `moe-plan calibrate`
// drives it; tools/moe-plan/README.md ("Calibrating this machine") says what each number is.
//
// One process cannot measure the links between ranks: those values are then documented defaults
// (named in Calibration::unmeasured and in the file's comments). Under mpiexec every rank must
// call calibrate() with the same options (the interconnect measurements are collectives); rank 0's
// measurements are the result.
#pragma once
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "moe/comm/communicator.h"
#include "moe/device.h"
#include "moe/plan/cluster.h"

namespace moe::plan {

// Comments the TOML writer puts beside values, keyed "table.key" ("bandwidth.ssd", "compute.f32",
// top-level keys by their name: "nodes"), plus lines for the file's head and for each table's
// head (keyed by the table's name alone: "latency").
struct SpecNotes {
  std::vector<std::string> header;
  std::map<std::string, std::vector<std::string>> notes;
};

// Writes `spec` as a cluster spec (docs/FORMATS.md "Cluster spec") that parse_cluster reads back
// to the same values: every quantity with its unit, the optional GEMM rates (bf16, f16) only
// when given (non-zero). `notes` become comments.
void write_cluster_toml(const ClusterSpec& spec, std::ostream& out, const SpecNotes& notes = {});
// The same into `path`, atomically (a temporary beside it, fsync, rename): moe::Error naming the
// path and the cause; an existing file is replaced (the caller decides whether it may be).
void write_cluster_file(const std::string& path, const ClusterSpec& spec,
                        const SpecNotes& notes = {});

struct CalibrateOptions {
  bool quick = false;       // small sizes and few repetitions (tests): seconds, not minutes
  std::string scratch_dir;  // where the SSD test file goes (required)
  Device device;            // cpu, or cuda (a CUDA build with a usable GPU)
  comm::Communicator* world = nullptr;  // null: one process
  // Progress lines for people ("GEMM f32 1024x1024x1024: 95.2 GFLOP/s"); may be null.
  std::function<void(const std::string&)> progress;
};

struct Calibration {
  ClusterSpec spec;
  SpecNotes notes;
  std::vector<std::string> unmeasured;  // "[bandwidth] intra_node: ..." one line each, for stderr
};

// Checks the scratch directory (exists, is a directory, a file can be created there) before any
// measuring, so a bad --scratch fails in a moment; moe::Error naming the directory and the cause.
void check_scratch_dir(const std::string& dir);

// Measures and returns the spec. moe::Error: an unusable scratch directory or device (naming it
// and why), an I/O error while measuring the SSD (the temporary file is removed in every case).
Calibration calibrate(const CalibrateOptions& options);

}  // namespace moe::plan
