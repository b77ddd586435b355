// Step time of a layout (moe/plan/step_time.h): the terms, then the critical path.
#include "moe/plan/step_time.h"

#include <algorithm>
#include <numeric>

#include "moe/balance/placement.h"
#include "moe/error.h"
#include "moe/models/memory.h"
#include "plan/check.h"

namespace moe::plan {

double keys_per_query(double T, int64_t window) {
  const double w = double(window);
  return window > 0 && w < T ? w - w * w / (2 * T) : T / 2;
}

double dense_flops_per_token(const ModelConfig& c) {
  const double hd = c.heads > 0 ? double(c.head_dim_resolved()) : double(c.d_model);
  const double H = double(std::max<int64_t>(c.heads, 1));
  // scores over the q/k width, weighted values over the v width (latent attention's v_head_dim)
  const double qk_width = H * hd, v_width = c.mla() ? H * double(c.v_head_dim) : qk_width;
  const double matrices = parameter_lower_bound(c, 0, 0) + double(c.vocab_size * c.d_model);
  double attention = 0;
  for (int64_t l = 0; l < c.layers; ++l)
    attention += 6 * keys_per_query(double(c.seq), c.window_of(l)) * (qk_width + v_width);
  return train_flops(1, matrices) + attention;
}

Link link_for(const ClusterSpec& c, int64_t group) {
  if (group <= c.devices_per_node) return {c.intra_node_bw, c.intra_node_latency};
  return {c.inter_node_bw, c.inter_node_latency};
}

double a2a_flat_seconds(double bytes, int64_t p, const ClusterSpec& c) {
  if (p <= 1) return 0;
  const double P = double(p), G = double(std::min(c.devices_per_node, p));
  return (G - 1) * c.intra_node_latency + (P - G) * c.inter_node_latency +
         bytes * (G - 1) / P / c.intra_node_bw + bytes * (P - G) / P / c.inter_node_bw;
}

double a2a_hierarchical_seconds(double bytes, int64_t p, const ClusterSpec& c) {
  if (p <= c.devices_per_node) return a2a_flat_seconds(bytes, p, c);
  const double P = double(p), G = double(c.devices_per_node), nodes = P / G;
  return (G - 1) * c.intra_node_latency + bytes * (G - 1) / G / c.intra_node_bw +
         (nodes - 1) * c.inter_node_latency + bytes * (P - G) / P / c.inter_node_bw;
}

double ring_allreduce_seconds(double bytes, int64_t p, const Link& link) {
  return 2 * ring_allgather_seconds(bytes, p, link);
}

double ring_allgather_seconds(double bytes, int64_t p, const Link& link) {
  if (p <= 1 || bytes <= 0) return 0;
  const double P = double(p);
  return (P - 1) / P * bytes / link.bandwidth + (P - 1) * link.latency;
}

std::vector<std::vector<double>> expert_rows_by_rank(const std::vector<double>& loads, int64_t p,
                                                     Placement placement) {
  std::vector<std::vector<double>> by_rank(static_cast<size_t>(p));
  const int64_t E = int64_t(loads.size());
  if (placement == Placement::fixed) {
    const int64_t share = balance::per_rank(E, int(p));
    for (int64_t e = 0; e < E; ++e) by_rank[size_t(e / share)].push_back(loads[size_t(e)]);
  } else if (placement == Placement::lpt) {
    balance::BatchLptInput in;
    in.compute_s = loads;
    in.upload_s.assign(loads.size(), 0.0);
    const auto placed = balance::lpt_batch_placement(in, int(p));
    for (int64_t e = 0; e < E; ++e)
      by_rank[size_t(placed.rank_of_expert[size_t(e)])].push_back(loads[size_t(e)]);
  } else {
    for (auto& rows : by_rank)
      for (double load : loads) rows.push_back(load / double(p));
  }
  return by_rank;
}

double rank_expert_seconds(const std::vector<double>& rows_of_experts, double per_expert_params,
                           double flops_rate, double upload_s) {
  double s = 0;
  for (double rows : rows_of_experts) {
    if (rows <= 0) continue;
    const double forward = 2 * rows * per_expert_params / flops_rate;
    s += std::max(upload_s, forward) + std::max(upload_s, 2 * forward);
  }
  return s;
}

double upload_seconds(OffloadTier tier, double per_expert_params, double record_bytes,
                      double hit_rate, const ClusterSpec& c) {
  if (tier == OffloadTier::none) return 0;
  const double link = 4 * per_expert_params / c.host_device_bw;
  if (tier == OffloadTier::host) return link;
  return link + (1 - hit_rate) * record_bytes / c.ssd_bw;
}

double non_gemm_seconds(const ModelConfig& c, double tokens, const ClusterSpec& cl) {
  if (!cl.has_overhead) return 0;
  const double per_token =
      cl.elementwise_bw > 0 ? activation_bytes_per_token(c) / cl.elementwise_bw : 0;
  return cl.overhead_per_step + double(c.layers) * cl.overhead_per_layer + tokens * per_token;
}

double TraceLoads::active_fraction() const {
  double sum = 0;
  for (const auto& batch : loads) {
    double active = 0, all = 0;
    for (const auto& layer : batch)
      for (double load : layer) {
        active += load > 0;
        all += 1;
      }
    sum += all > 0 ? active / all : 0;
  }
  return loads.empty() ? 1 : sum / double(loads.size());
}

namespace {

// The slowest rank's and the mean rank's expert seconds per step, averaged over the trace.
std::pair<double, double> expert_seconds(const StepInput& in, double per_expert, double rate,
                                         double upload_s) {
  const int64_t ep = in.layout.ep;
  double slowest = 0, mean = 0;
  for (size_t b = 0; b < in.trace.loads.size(); ++b) {
    // The EP group computes the experts of all its ranks' tokens: scale the batch to them.
    const double scale = double(ep * in.tokens_per_rank) / double(in.trace.tokens[b]);
    for (const auto& layer : in.trace.loads[b]) {
      std::vector<double> loads(layer);
      for (double& x : loads) x *= scale;
      double top = 0, sum = 0;
      for (const auto& rows : expert_rows_by_rank(loads, ep, in.layout.placement)) {
        const double s = rank_expert_seconds(rows, per_expert, rate, upload_s);
        top = std::max(top, s);
        sum += s;
      }
      slowest += top;
      mean += sum / double(ep);
    }
  }
  const double batches = double(std::max<size_t>(in.trace.loads.size(), 1));
  return {slowest / batches, mean / batches};
}

}  // namespace

StepTime predict_step(const StepInput& in) {
  const ModelConfig& c = in.config;
  const Layout& l = in.layout;
  const ClusterSpec& cl = in.cluster;
  const ParamCounts pc = param_counts(c);
  const StateBytes b = state_bytes(c.dtype);
  const int64_t ranks = l.ep * l.dp;
  const double N = double(in.tokens_per_rank), rate = cl.gemm_rate(c.dtype);
  PLAN_CHECK(!in.trace.loads.empty(), "the trace has no batch: nothing to predict from");
  StepTime t;
  t.dense_s = N * dense_flops_per_token(c) / rate;
  // ES-MoE: an offloaded expert's fp32 weights come up before each of its passes.
  const double upload_s =
      upload_seconds(l.offload, pc.per_expert, pc.per_expert * b.total(), in.ssd_hit_rate, cl);
  std::tie(t.expert_s, t.expert_balanced_s) = expert_seconds(in, pc.per_expert, rate, upload_s);
  const double a2a_bytes = N * double(c.top_k * c.d_model) * double(dtype_size(c.dtype));
  const double one_a2a = l.a2a == comm::A2AAlgorithm::hierarchical
                             ? a2a_hierarchical_seconds(a2a_bytes, l.ep, cl)
                             : a2a_flat_seconds(a2a_bytes, l.ep, cl);
  t.a2a_s = 4 * double(pc.moe_layers) * one_a2a;
  // Gradients in fp32: the dense ones over every rank (reduce-scattered from ZeRO 2 on), the
  // experts' over the ranks holding each (dp replicas; every rank under lpt and flexmoe, whose
  // replicas move).
  const Link world = link_for(cl, ranks);
  const double dense_grad = 4 * (pc.dense - pc.frozen);  // frozen biases are not synced
  t.allreduce_s = l.zero >= 2 ? ring_allgather_seconds(dense_grad, ranks, world)
                              : ring_allreduce_seconds(dense_grad, ranks, world);
  const bool fixed = l.placement == Placement::fixed;
  const double held = experts_held_per_rank(c, l);
  t.allreduce_s += ring_allreduce_seconds(4 * pc.per_expert * held, fixed ? l.dp : ranks, world);
  const double backward_s = 2.0 / 3.0 * (t.dense_s + t.expert_s);
  t.allreduce_exposed_s = l.scheduler == comm::SchedulerMode::priority
                              ? exposed_after_overlap(t.allreduce_s, backward_s)
                              : t.allreduce_s;
  // ZeRO 1-2 gather the updated values once; ZeRO 3 before each block's forward and backward.
  const double gathers = l.zero == 0 ? 0 : l.zero == 3 ? 2 : 1;
  t.zero_gather_s = gathers * ring_allgather_seconds(b.value * pc.dense, ranks, world);
  // AdamW on the device reads and writes each parameter's state once: memory bound.
  const double dense_shard = l.zero >= 1 ? pc.dense / double(ranks) : pc.dense;
  const double device_params =
      dense_shard + (l.offload == OffloadTier::none ? held : 0) * pc.per_expert;
  const double device_opt = 2 * device_params * b.total() / cl.device_memory_bw;
  const double cpu_opt = l.offload == OffloadTier::none ? 0 : held * pc.per_expert / cl.cpu_adamw;
  t.optimizer_s = device_opt + cpu_opt;
  t.optimizer_exposed_s = device_opt + exposed_after_overlap(cpu_opt, 2.0 / 3.0 * t.expert_s);
  t.non_gemm_s = non_gemm_seconds(c, N, cl);
  t.step_s = t.dense_s + t.expert_s + t.a2a_s + t.allreduce_exposed_s + t.zero_gather_s +
             t.optimizer_exposed_s + t.non_gemm_s;
  t.tokens_per_s = N * double(ranks) / t.step_s;
  return t;
}

}  // namespace moe::plan
