// Memory a model needs, estimated from its config before anything is allocated, so that absurd
// sizes (d_model 1e6, 1e5 experts, a vocabulary of 2^31) are refused with the figure and what the
// machine has, instead of std::bad_alloc (or the OOM killer) part-way through building the model.
// The estimates are lower bounds: they count only the large matrices (embedding, head, attention
// and MLP/expert weights) and the step's logits, so a model they refuse can never fit.
#pragma once
#include <cstdint>
#include <string>

#include "moe/models/config.h"

namespace moe {

// Parameters in the large matrices of `config` (resolved: experts_per_layer filled in), as a
// double so that absurd configs do not overflow. `experts_share` counts that fraction of the
// expert weights (1/ep for an expert-parallel rank, 0 when the experts are not resident),
// `embedding_share` that of the token table and untied head (1/ranks when sharded).
double parameter_lower_bound(const ModelConfig& config, double experts_share = 1,
                             double embedding_share = 1);

// What this process may use: physical memory (sysconf pages x page size) and RLIMIT_AS when set.
struct MachineMemory {
  double physical_bytes = 0;       // 0: unknown
  double address_space_limit = 0;  // 0: no limit
  double usable() const;           // the smaller of the known figures (0: unknown)
  std::string describe() const;    // "7.8 GiB of physical memory (RLIMIT_AS 2.0 GiB)"
};
MachineMemory machine_memory();

// Throws moe::Error "<what> needs at least <bytes> (<detail>), more than this machine has: ..."
// when `bytes` exceeds `machine.usable()`. Unknown machine figures never refuse.
void check_fits_in_memory(double bytes, const std::string& what, const std::string& detail,
                          const MachineMemory& machine = machine_memory());

// Activation bytes at the peak of an inference pass (Transformer::evaluate) over `windows`
// windows of config.seq tokens, a lower bound: the residual stream, and the larger of one block's
// activations (its output rows, q, k and v; the experts' rows of one block of tokens) and the
// logits of one block of rows, as EvalOptions' defaults cut the blocks.
double inference_activation_lower_bound(const ModelConfig& config, int64_t windows);

// Bytes the KV cache (Transformer::make_cache, f32) takes per cached position of one sequence,
// every layer together: each layer's keys and values, 2 x KV x hd floats, or with latent
// attention (MLA) its latent, kv_lora_rank + qk_rope_dim floats (DeepSeek-V3: 2,304 bytes a layer
// against 196,608 for its keys and padded values). Exact: what the cache's tensors hold.
double kv_cache_bytes_per_token(const ModelConfig& config);

// Memory this process can still get: physical memory not in use (MemAvailable and free swap of
// /proc/meminfo) and, under RLIMIT_AS, the limit less the address space already mapped; the
// smaller of the known figures (0: unknown).
struct FreeMemory {
  double available_bytes = 0;     // 0: unknown
  double address_space_left = 0;  // 0: no limit
  double usable() const;
  std::string describe() const;  // "3.1 GiB free (RLIMIT_AS leaves 1.0 GiB)"
};
FreeMemory free_memory();

// Throws moe::Error "<what> needs at least <bytes> of activations (<detail>), more than this
// process can still get: ..." when inference_activation_lower_bound(config, windows) exceeds
// what free_memory() gives. Unknown figures never refuse.
void check_inference_activations(const ModelConfig& config, int64_t windows,
                                 const std::string& what, const std::string& detail,
                                 const FreeMemory& free = free_memory());

// Throws moe::Error "<what>, more than this process can still get: <free.describe()>" when
// `bytes` exceed free.usable(): asked before a large allocation whose size is known. Unknown
// figures never refuse.
void check_free_memory(double bytes, const std::string& what,
                       const FreeMemory& free = free_memory());

// Throws moe::Error "<what>: its weights need at least <bytes> (<detail>), more than this process
// can still get: ..." when parameter_lower_bound(config, experts_share) weights of
// `bytes_per_weight` bytes exceed what free_memory() gives: before a loader sizes them, so that
// a model too large is refused with the figures rather than by a failed allocation part-way.
// Unknown figures never refuse.
void check_inference_weights(const ModelConfig& config, double experts_share,
                             double bytes_per_weight, const std::string& what,
                             const std::string& detail, const FreeMemory& free = free_memory());

// "1.5 GiB", "512 MiB", "3.0 TiB".
std::string format_bytes(double bytes);

}  // namespace moe
