// CPU dispatch/combine loops: the row gather into expert order and the weighted combine back, with
// their backward (the routing table itself is built on the host in ops/dispatch.cpp). Slot and
// token indices live in host memory here, so they are checked here, as the loops read them.
// Shapes: N tokens, D model width, E experts, k experts per token, M kept assignments (slots).
// Loops run over output rows (slots or tokens), so every row is written by one thread and sums
// over a token's choices run in choice order: results do not depend on the thread count.
#include "backend/cpu/backend.h"
#include "core/parallel.h"
#include "kernels/dispatch.h"

namespace moe::cpu {

void gather_rows(const Tensor& x, const Tensor& token_of_slot, Tensor& x_perm) {
  const int64_t tokens = x.dim(0), width = x.dim(1), slots = token_of_slot.numel();
  const float* xs = x.data<float>();
  const int32_t* ts = token_of_slot.data<int32_t>();
  for (int64_t s = 0; s < slots; ++s)
    MOE_CHECK(ts[s] >= 0 && ts[s] < tokens, "dispatch: slot ", s, " names token ", ts[s],
              " outside ", x.describe());
  float* out = x_perm.data<float>();
#pragma omp parallel for schedule(static) if (slots * width >= kParallelWork)
  for (int64_t s = 0; s < slots; ++s)
    kernels::copy_row(xs + static_cast<int64_t>(ts[s]) * width, out + s * width, width);
}

void combine_rows(const Tensor& rows, const Tensor& slot_of, const Tensor& weight_of_slot,
                  int64_t top_k, Tensor& y) {
  const int64_t slots = rows.dim(0), width = rows.dim(1), tokens = slot_of.numel() / top_k;
  const float* ws = weight_of_slot.defined() ? weight_of_slot.data<float>() : nullptr;
  const int32_t* so = slot_of.data<int32_t>();
  for (int64_t a = 0; a < tokens * top_k; ++a)
    MOE_CHECK(so[a] >= -1 && so[a] < slots, "combine: assignment ", a, " names slot ", so[a],
              " outside ", rows.describe());
  const float* rs = rows.data<float>();
  float* out = y.data<float>();
#pragma omp parallel for schedule(static) if (tokens * top_k * width >= kParallelWork)
  for (int64_t t = 0; t < tokens; ++t)
    kernels::combine_row(rs, so + t * top_k, ws, top_k, width, out + t * width);
}

void combine_rows_backward(const Tensor& dy, const Tensor& y_perm, const Tensor& token_of_slot,
                           const Tensor& weight_of_slot, Tensor& dy_perm, Tensor& dweight_of_slot) {
  const int64_t tokens = dy.dim(0), width = dy.dim(1), slots = token_of_slot.numel();
  const int32_t* ts = token_of_slot.data<int32_t>();
  for (int64_t s = 0; s < slots; ++s)
    MOE_CHECK(ts[s] >= 0 && ts[s] < tokens, "combine_backward: slot ", s, " names token ", ts[s],
              " outside ", dy.describe());
  const float* dys = dy.data<float>();
  const float* ys = y_perm.data<float>();
  const float* ws = weight_of_slot.data<float>();
  float* dps = dy_perm.data<float>();
  float* dws = dweight_of_slot.data<float>();
#pragma omp parallel for schedule(static) if (slots * width >= kParallelWork)
  for (int64_t s = 0; s < slots; ++s)
    dws[s] = kernels::combine_backward_row(dys + static_cast<int64_t>(ts[s]) * width,
                                           ys + s * width, ws[s], width, dps + s * width);
}

void slot_to_choice(const Tensor& dweight_of_slot, const Tensor& slot_of, Tensor& dtopk_weight) {
  const int64_t slots = dweight_of_slot.numel(), n = slot_of.numel();
  const int32_t* so = slot_of.data<int32_t>();
  const float* src = dweight_of_slot.data<float>();
  float* dst = dtopk_weight.data<float>();
  for (int64_t a = 0; a < n; ++a) {
    MOE_CHECK(so[a] >= -1 && so[a] < slots, "slot_to_choice: assignment ", a, " names slot ", so[a],
              " outside ", dweight_of_slot.describe());
    dst[a] = so[a] >= 0 ? src[so[a]] : 0.0f;
  }
}

}  // namespace moe::cpu
