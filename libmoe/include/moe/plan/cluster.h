// A cluster spec: the machine a run is planned for, as moe-plan reads it from a TOML file that a
// person writes by hand or `moe-plan calibrate` measures. docs/FORMATS.md ("Cluster
// spec") is the contract; specs/clusters/ holds specs of public machines with each number's source.
//
// Every quantity carries its unit in the file ("80GiB", "900GB/s", "2us", "989TFLOP/s",
// "1.5Gparam/s"): a bare number is refused, so nobody has to guess whether 400 meant Gbit/s or
// GB/s. Here they are plain doubles in base units: bytes, bytes/s, seconds, FLOP/s, parameters/s.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "moe/dtype.h"

namespace moe::plan {

struct ClusterSpec {
  std::string name;             // for reports ("DGX H100"); the file name when not given
  bool device_is_host = false;  // device_kind = "cpu": device and host memory are one pool
  int64_t nodes = 0, devices_per_node = 0;
  // [memory] per device (device) and per node (host, ssd)
  double device_bytes = 0, host_bytes = 0, ssd_bytes = 0;
  // [bandwidth], bytes/s, each direction of one device's link
  double intra_node_bw = 0, inter_node_bw = 0, host_device_bw = 0, ssd_bw = 0, memcpy_bw = 0;
  double device_memory_bw = 0;  // the device's own memory (optimizer steps are bound by it)
  // [latency], seconds per message
  double intra_node_latency = 0, inter_node_latency = 0;
  // [compute]: dense GEMM FLOP/s of one device per dtype (0: not given); the host's AdamW
  // parameters/s available to one device (the node's rate / devices_per_node)
  double gemm_f32 = 0, gemm_bf16 = 0, gemm_f16 = 0;
  double cpu_adamw = 0;
  // [overhead] (optional table): what a training step costs besides its GEMMs and optimizer
  // (norms, softmax, routing and dispatch, the loss, per-op bookkeeping), per device:
  // per_step seconds once a step, per_layer seconds a transformer layer, and `elementwise`, the
  // bytes/s at which the step's non-GEMM work gets through the activation bytes it saves
  // (memory_model.h's activation_bytes_per_token x tokens; 0: no per-token term). A spec without
  // the table has has_overhead false and every one 0 (predict says so).
  bool has_overhead = false;
  double overhead_per_step = 0, overhead_per_layer = 0, elementwise_bw = 0;

  int64_t ranks() const { return nodes * devices_per_node; }
  // FLOP/s for `dtype`; moe::Error naming [compute] <dtype> when the spec does not give it.
  double gemm_rate(DType dtype) const;
};

// Reads a spec from TOML `text`; `source` (the file name) starts every message. Errors
// (moe::Error): not TOML, a missing or unknown key (named as "[table] key"), a value of the wrong
// type, a quantity without its unit or with a unit of another kind, a negative (or, where it
// divides, zero) quantity.
ClusterSpec parse_cluster(std::string_view text, const std::string& source);
ClusterSpec read_cluster_file(const std::string& path);

// The quantity parsers the reader uses, one per kind of unit; `key` names the value in errors.
// Bytes: B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB (powers of 1024).
double parse_bytes(std::string_view text, const std::string& key);
// Bandwidth: B/s .. TB/s, KiB/s .. TiB/s, and Gbit/s (network links are sold in bits).
double parse_bandwidth(std::string_view text, const std::string& key);
// Time: ns, us, ms, s.
double parse_seconds(std::string_view text, const std::string& key);
// Compute: FLOP/s, GFLOP/s, TFLOP/s, PFLOP/s.
double parse_flops(std::string_view text, const std::string& key);
// Optimizer rate: param/s, Kparam/s, Mparam/s, Gparam/s.
double parse_param_rate(std::string_view text, const std::string& key);

}  // namespace moe::plan
