// Step time of a training layout on a cluster, term by term: FlexMoE's per-rank expert compute
// (the maximum over ranks: stragglers, from the trace's per-step expert loads), dense compute,
// the expert all-to-all (flat: p - 1 messages; hierarchical: G - 1 inside the node and p/G - 1
// across, MoESys), the gradient all-reduce (ring: 2 (p-1)/p of the bytes per rank) and how
// much of it Lina's priority scheduler hides behind backward, ZeRO's all-gathers, ES-MoE's
// offload (per expert max(upload, compute); CPU AdamW beside backward). Every term is a small
// function with a hand-worked test (tests/unit/test_plan_step.cpp).
//
// Shape letters: N tokens per rank and step, D model width, k top-k, E experts of a layer,
// Pe one expert's parameters, p ranks of a collective, G devices per node.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moe/models/config.h"
#include "moe/plan/cluster.h"
#include "moe/plan/layout.h"
#include "moe/plan/memory_model.h"

namespace moe::plan {

// ---- terms ------------------------------------------------------------------------------------

// FLOPs of a training step per row through a matrix of `params` parameters: 2 forward, 4 backward.
inline double train_flops(double rows, double params) { return 6 * rows * params; }
// Keys a query attends to on average over a sequence of T: T / 2 under the causal mask; with a
// sliding window w < T, w - w^2 / (2 T) (w for most queries, fewer for the first w).
double keys_per_query(double T, int64_t window);
// Dense FLOPs per token of a training step: the dense matrices (the head's too, untied or tied;
// latent attention's projections, shared experts, dense MLP layers at their width), and each
// layer's attention: scores over the q/k width and weighted values over the v width (latent
// attention: H x (qk_nope + qk_rope) and H x v_head_dim), 2 FLOPs per key and feature forward
// over keys_per_query keys, times 3 for backward.
double dense_flops_per_token(const ModelConfig& config);

// One link: bytes/s and seconds per message.
struct Link {
  double bandwidth = 0, latency = 0;
};
// The link a collective over `group` consecutive ranks uses: inside a node when it fits one.
Link link_for(const ClusterSpec& cluster, int64_t group);

// One all-to-all of `bytes` per rank (every row a rank sends, its own share included) over
// `p` ranks, G per node. Flat: a message to each other rank, (G - 1) on the node's links and
// (p - G) across nodes, each share at its link's rate. Hierarchical: the node's ranks first
// exchange everything (G - 1 messages, (G-1)/G of the bytes), then each sends one message to its
// peer on every other node (p/G - 1 messages, the (p - G)/p of the bytes that leave the node).
double a2a_flat_seconds(double bytes, int64_t p, const ClusterSpec& cluster);
double a2a_hierarchical_seconds(double bytes, int64_t p, const ClusterSpec& cluster);
// Ring collectives over p ranks: all-reduce 2 (p-1)/p x bytes / bw + 2 (p-1) latencies;
// all-gather and reduce-scatter half that. p = 1 costs nothing.
double ring_allreduce_seconds(double bytes, int64_t p, const Link& link);
double ring_allgather_seconds(double bytes, int64_t p, const Link& link);

// The rows of each expert a rank computes, per rank ([p][its experts]), for one layer's expert
// loads under a placement: static gives rank r the experts [r E/p, (r+1) E/p); lpt places them
// by balance::lpt_batch_placement over the loads; flexmoe gives every rank 1/p of every expert's
// rows (the even share its replicas approach; replica sync is not counted yet).
std::vector<std::vector<double>> expert_rows_by_rank(const std::vector<double>& loads, int64_t p,
                                                     Placement placement);

// A rank's expert seconds for one layer: per expert with rows > 0, forward then backward, each
// max(upload_s, compute) (ES-MoE's pipeline; upload_s 0 when resident).
double rank_expert_seconds(const std::vector<double>& rows_of_experts, double per_expert_params,
                           double flops_rate, double upload_s);

// Seconds to bring one offloaded expert to the device: its fp32 weights over the host link, and
// for the SSD tier, on a host cache miss (1 - hit_rate), its whole record read from the SSD first.
double upload_seconds(OffloadTier tier, double per_expert_params, double record_bytes,
                      double hit_rate, const ClusterSpec& cluster);

// What priority scheduling leaves of an all-reduce that overlaps `backward_s` of compute.
inline double exposed_after_overlap(double comm_s, double backward_s) {
  return comm_s > backward_s ? comm_s - backward_s : 0;
}

// What a step costs besides its GEMMs, optimizer and communication, from the spec's [overhead]:
// per_step + layers x per_layer + tokens x activation_bytes_per_token / elementwise (the last 0
// when elementwise is 0); 0 for a spec without [overhead].
double non_gemm_seconds(const ModelConfig& config, double tokens, const ClusterSpec& cluster);

// ---- the step ---------------------------------------------------------------------------------

// The trace's per-step expert loads: loads[b][l][e] assignments of batch b (tokens[b] tokens).
struct TraceLoads {
  std::vector<int64_t> tokens;
  std::vector<std::vector<std::vector<double>>> loads;
  double active_fraction() const;  // mean over batches of experts with load > 0 / all experts
};

struct StepInput {
  ModelConfig config;  // resolved
  Layout layout;       // checked
  ClusterSpec cluster;
  int64_t tokens_per_rank = 0;
  TraceLoads trace;
  double ssd_hit_rate = 0;  // offload=ssd: the host cache's hit rate (plan/offload_cache.h)
};

struct StepTime {
  double dense_s = 0;              // dense compute
  double expert_s = 0;             // expert compute of the slowest rank (offload: with uploads)
  double expert_balanced_s = 0;    // the same if every rank had the mean load (no stragglers)
  double a2a_s = 0;                // 4 all-to-alls per MoE layer (dispatch, combine; x2 backward)
  double allreduce_s = 0;          // gradient sync of dense and expert gradients
  double allreduce_exposed_s = 0;  // what is left on the critical path
  double zero_gather_s = 0;        // ZeRO's all-gathers of dense values
  double optimizer_s = 0;          // AdamW: on the device, or for offloaded experts on the CPU
  double optimizer_exposed_s = 0;
  double non_gemm_s = 0;    // norms, softmax, routing, dispatch, loss, per-op costs ([overhead])
  double step_s = 0;        // the critical path
  double tokens_per_s = 0;  // every rank's tokens / step_s
};
StepTime predict_step(const StepInput& input);

}  // namespace moe::plan
