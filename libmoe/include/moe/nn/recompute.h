// Activation recomputation (activation checkpointing): what a training pass keeps for backward and
// what it computes again there. The recomputed activations live in a scratch arena that is reset
// after each use, so only one block's (or one MoE layer's experts') activations exist at a time.
#pragma once
#include <cstddef>
#include <string>
#include <utility>

#include "moe/arena.h"
#include "moe/tensor.h"

namespace moe::nn {

// none: keep every activation. moe: keep the MoE layers' permuted input (and the router's outputs)
// but not the experts' hidden activations ([M,F] h, h3, a), which backward recomputes from the
// kept rows. block: keep only each block's input; backward runs the block's forward again (router
// jitter is keyed by seed, step, layer and token, so it draws the same noise) before its backward.
enum class Recompute { none, moe, block };

// "none" | "moe" | "block"; anything else is a UsageError naming the setting's flag.
Recompute parse_recompute(const std::string& name);
const char* recompute_name(Recompute mode);

// The scratch memory of recomputation, and its share of the activation high-water mark.
class Scratch {
 public:
  explicit Scratch(size_t chunk_bytes = size_t(4) << 20) : arena_(chunk_bytes) {}

  // Runs f (returning a Tensor) with the scratch arena current, copies its result into `into`
  // (when given, of the result's shape) or into a new tensor of the caller's memory (the arena
  // that was current, else the heap), then resets the scratch arena: f's temporaries are gone.
  template <class F>
  Tensor run(F&& f, Tensor* into = nullptr) {
    Arena* outer = ArenaScope::current();
    Tensor result;
    {
      ArenaScope scope(arena_);
      result = std::forward<F>(f)();
    }
    Tensor kept = into ? *into : Tensor::empty(result.shape(), result.dtype(), result.device());
    kept.copy_from(result);
    done(outer);
    return kept;
  }

  // The most bytes the caller's arena and this scratch held together at once (the caller's arena
  // does not grow while the scratch is current, so this is exact) since the last reset_peak().
  size_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = 0; }

 private:
  void done(const Arena* outer);
  Arena arena_;
  size_t peak_ = 0;
};

}  // namespace moe::nn
