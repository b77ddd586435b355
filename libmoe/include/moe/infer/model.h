// A model for inference: a Transformer with the parameters of a checkpoint file.
#pragma once
#include <memory>
#include <string>

#include "moe/io/checkpoint.h"
#include "moe/models/transformer.h"
#include "moe/offload/expert_ring.h"

namespace moe::infer {

// A forward pass gave a non-finite result (a score, a log-probability, a logit a token is sampled
// from): the model's weights compute it. Thrown by score, loglikelihood and generate, so that the
// caller can look for the weight to blame (Engine::check_weights_finite) before saying so.
class NonFiniteOutput : public Error {
 public:
  using Error::Error;
};

struct LoadedModel {
  // With an expert ring (load_ring_model): the store serving the experts, and the layers' view
  // that names it (the model keeps a pointer to it). Null otherwise.
  std::unique_ptr<offload::ExpertRing> ring;
  std::unique_ptr<nn::Parallel> view;
  ModelConfig config;
  std::unique_ptr<ParamSet> params;
  std::unique_ptr<Transformer> model;
  io::Provenance provenance;  // of the checkpoint
  int64_t step = 0;           // training steps it had taken
  std::string quantization;   // "q8_0" for a moe-convert quantize checkpoint (CPU only), else ""
};

// Reads `path` (a checkpoint file, a run directory's newest checkpoint, or a sharded checkpoint
// directory written by moe-train --ep or moe-convert partition) and builds its model. With
// `experts` false the expert tensors are not read; they keep their initial values until something
// replaces them (or, with nn::Parallel::expert_store, a store holds them: see load_ring_model).
// Throws moe::Error naming the file for a missing/damaged file or a tensor that does not fit.
// With `parallel` (expert parallelism: nn::Parallel::experts set), this rank's experts are read
// one chunk each (io::read_expert) into its slices of the expert tensors; with a placement policy
// (nn::Parallel::placement) every rank holds and reads every expert.
// A sharded directory holds each layer's experts in the rank-major order of its placement
// (/sharding expert_rank: moe-convert partition --trace places them by load). One process, or
// a placement policy, reads every expert back to its id. Under expert parallelism rank r holds
// the contiguous positions [r E/R, (r+1) E/R) of that order, so it serves the experts the files
// put on it, and the router's rows are reordered to match: the same model with its experts
// relabelled (scores equal one process's to float rounding; ties between router logits, which
// pick the lower index, could pick another expert). A split token embedding (--shard-embedding),
// and --popularity with a sharded directory, are refused, saying how to merge.
// Makes a loaded model lean for inference on the CPU: drops every gradient (nothing is trained)
// and, for a bf16/f16 model, keeps the weight matrices (attention, dense MLP, experts, untied LM
// head) in 16 bits with no f32 copy: the CPU GEMV and GEMM widen them on the fly (bf16 is
// exact; f16 too), so the model takes about half the memory of f32 and decode reads half the
// bytes. Embeddings, norms, biases and routers keep their f32 copy (small; router math is f32).
// Call after ParamSet::to (which would widen them again). Returns the bytes released.
size_t lean_for_inference(ParamSet& params);

// Centred routers (moe.router.center) serve as the plain routers their logits use: each router's
// f32 compute copy becomes W' = nn::center_router_weight(W, c) and its center zero, so a forward
// pays no projection (on a GPU: no host round trip per layer and token). The logits are bit for
// bit the centred model's. A 16-bit router's stored value is left as loaded (only `compute` is
// W'): for serving only, not for saving or training. Call last (after ParamSet::to, which would
// widen a 16-bit value again, and lean_for_inference).
void fold_router_centers(ParamSet& params);

// How load_model reads a checkpoint file whose experts are all resident (no `parallel` slicing
// them): with `map`, its weight matrices and expert tensors are read-only mappings of the file
// where its layout allows (io::map_checkpoint; docs/FORMATS.md "Mapped weights"), never copied;
// what is rearranged or converted at load (Q8_0 rows packed, GGUF q8_0 blocks, a dtype widened,
// norms, biases, routers) is copied as before. Mapped values are not scanned when opening (no
// finiteness or block-scale checks, no checksums) unless `verify`: then every mapped chunk's
// Fletcher32 and every value are checked before the model is returned.
struct LoadOptions {
  bool map = false;
  bool verify = false;
};

LoadedModel load_model(const std::string& path, bool experts = true,
                       const nn::Parallel* parallel = nullptr, const LoadOptions& options = {});

// The model of `path` with its experts served by an offload::ExpertRing (MoESys) that reads them
// from the same file: the experts are Param::offloaded, nothing of them is read or allocated
// here. The ring is not started: call m.ring->start(config) (the budget may be a share of
// m.ring->expert_bytes()) before the first forward pass. On a CUDA device, start the ring on it,
// then move the non-expert parameters (m.params->to(device)).
LoadedModel load_ring_model(const std::string& path);

}  // namespace moe::infer
