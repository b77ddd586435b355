// Language-model loss. Shape letters: N rows (tokens), V vocabulary.
#pragma once
#include "moe/tensor.h"

namespace moe::nn {

// Mean cross-entropy over rows whose target >= 0 (negative targets, e.g. -1, are ignored).
// logits [N,V] f32, targets [N] i32. When dlogits != nullptr it is (re)written with
// scale * d(mean loss)/d(logits) (allocated when undefined or of another shape). Computed in fp32
// per row with max-subtraction; the mean accumulated in double in row order; 0 when no row counts.
// A target >= V throws naming it. row_nll (when not null) receives the per-row negative
// log-likelihoods [N] f32 (0 for ignored rows).
double cross_entropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits,
                     float scale = 1.0f, Tensor* row_nll = nullptr);

}  // namespace moe::nn
