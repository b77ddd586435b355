// Where each expert's weights, gradient and optimizer state live: the seam between the experts'
// compute (nn::Experts) and the memory that holds them. Resident training keeps every expert in
// its layer's [E,...] Params (no store: nn::Experts runs its grouped GEMM over them); an
// offloaded store (offload::TieredStore, ES-MoE / MoESys) keeps them off the compute device and
// hands nn::Experts one expert at a time.
//
// The protocol of one MoE layer's pass, in the order nn::Experts calls it:
//   forward:  request(layer, used, rows, forward)      used: experts with rows, ascending; rows:
//                                                      how many rows each of them computes
//             for e in used: acquire(layer, e) ... release(layer, e)
//   backward: request(layer, used, rows, backward)
//             for e in used: acquire(layer, e), gradients(layer, e) ... release(layer, e),
//                            gradient_done(layer, e)
// Experts that receive no rows are never acquired (their gradient stays zero; the store still
// runs their optimizer step). A store serves one pass at a time, from one thread.
//
// A store that holds each layer's experts together (whole_layers(): the inference ring) serves a
// forward pass as one group instead:
//   forward:  request(layer, used, rows, forward); acquire_layer(layer) ... release_layer(layer)
// and nn::Experts runs the layer's grouped ops over all its experts at once, as over resident
// Params. Such a store serves forward passes only.
//
// A store that reads ahead (inference) may ask, through lookahead(), for the experts each MoE
// layer is predicted to route to, by that layer's own router (its norm, weights, selection bias
// and groups) applied early to an earlier hidden state (Pre-gated MoE): the MoE block before it
// calls predict(layer, experts) with the experts its tokens' top_k + margin choices name (those
// more tokens choose first, then those chosen at a better rank), at
//   input:  before its own MoE layer runs (before its request): the hidden state after its
//           attention, so the reads overlap that MoE layer's experts;
//   output: after its MoE layer (the block's output), so the reads overlap only the next block's
//           attention, from a state one MoE layer closer to the one predicted.
// The prediction changes nothing the model computes (the store only reads earlier).
//
// Shapes: D model width, F expert hidden width, E experts. One expert's tensors are views shaped as
// a group of one ([1,F,D], [1,D,F], [1,F], [1,D]) so the grouped expert ops run on them unchanged;
// a whole layer's are [E,F,D], [E,D,F], [E,F], [E,D].
#pragma once
#include <array>
#include <cstdint>
#include <span>

#include "moe/param.h"

namespace moe::nn {

// The fields of ExpertTensors and ExpertParams, numbered in this order (stores index them so):
// w1 0, w2 1, w3 2, b1 3, b2 4, b3 5.
inline constexpr int kExpertFields = 6;

// One expert's tensors (fp32): w1 [1,F,D], w2 [1,D,F], w3 [1,F,D] (gated), b1 [1,F], b2 [1,D]
// (bias), b3 [1,F] (bias and gated); undefined when the layer has none.
struct ExpertTensors {
  Tensor w1, w2, w3, b1, b2, b3;
  std::array<Tensor*, kExpertFields> fields() { return {&w1, &w2, &w3, &b1, &b2, &b3}; }
};

// The Params of one layer's experts, as nn::Experts creates them (w3, b1, b2, b3 may be null). A
// store's parameters are Param::offloaded: names, shapes, shards and initialisation only.
struct ExpertParams {
  Param* w1 = nullptr;
  Param* w2 = nullptr;
  Param* w3 = nullptr;
  Param* b1 = nullptr;
  Param* b2 = nullptr;
  Param* b3 = nullptr;
  int64_t experts() const { return w1 ? w1->shape.at(0) : 0; }
  std::array<Param*, kExpertFields> fields() const { return {w1, w2, w3, b1, b2, b3}; }
};

enum class Pass { forward, backward };

// Where the MoE layers predict the next one's experts for a store that reads ahead (see the top).
enum class LookaheadSource { none, input, output };
struct Lookahead {
  LookaheadSource source = LookaheadSource::none;
  int64_t margin = 0;  // experts a token beyond the predicted layer's top_k
};

class ExpertStore {
 public:
  virtual ~ExpertStore() = default;
  // Called once per MoE layer by nn::Experts while the model is built, in layer order; returns
  // the layer's id for the calls below. The store holds the layer's experts from then on.
  virtual int add_layer(const ExpertParams& params) = 0;
  // The experts `pass` will acquire, in that order, and the rows each computes: the store may
  // start bringing them in (and learns which experts are busy).
  virtual void request(int layer, std::span<const int32_t> experts, std::span<const int32_t> rows,
                       Pass pass) = 0;
  // The expert's weights, resident until release (blocks until they are).
  virtual ExpertTensors acquire(int layer, int expert) = 0;
  // Backward, between acquire and release: where the expert's gradient accumulates (+=).
  virtual ExpertTensors gradients(int layer, int expert) = 0;
  virtual void release(int layer, int expert) = 0;
  // The expert's gradient of this backward pass is complete (the sink: its optimizer step may
  // start once no later micro-batch adds to it).
  virtual void gradient_done(int layer, int expert) = 0;

  // Whole layers (see the top of this file): the layer's experts as [E,...] tensors, resident
  // until release_layer. Stores that serve one expert at a time keep these defaults.
  virtual bool whole_layers() const { return false; }
  virtual ExpertTensors acquire_layer(int layer);
  virtual void release_layer(int layer);

  // Reading ahead (see the top): what the store wants predicted (none: nothing, the default), and
  // the experts of MoE layer `layer` predicted for this forward pass, the most likely first.
  virtual Lookahead lookahead() const { return {}; }
  virtual void predict(int /*layer*/, std::span<const int32_t> /*experts*/) {}
};

}  // namespace moe::nn
