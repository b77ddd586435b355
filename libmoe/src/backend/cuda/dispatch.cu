// CUDA dispatch / combine ops. The routing table itself is built on the host (dispatch_ops.cpp).
#include "backend/cuda/dispatch.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

void gather_rows(const Tensor& x, const Tensor& token_of_slot, Tensor& x_perm) {
  const int64_t n = x_perm.numel();
  if (n == 0) return;
  launch<body::GatherRows>(launch_shape(n), stream_of(x), x.data<float>(),
                           token_of_slot.data<int32_t>(), x.dim(0), x.dim(1), x_perm.data<float>(),
                           n);
}

void combine_rows(const Tensor& rows, const Tensor& slot_of, const Tensor& weight_of_slot,
                  int64_t top_k, Tensor& y) {
  const int64_t tokens = y.dim(0);
  if (tokens == 0) return;
  launch<body::CombineRows>(launch_shape(tokens), stream_of(y), rows.data<float>(),
                            slot_of.data<int32_t>(),
                            weight_of_slot.defined() ? weight_of_slot.data<float>() : nullptr,
                            tokens, top_k, y.dim(1), y.data<float>());
}

void combine_rows_backward(const Tensor& dy, const Tensor& y_perm, const Tensor& token_of_slot,
                           const Tensor& weight_of_slot, Tensor& dy_perm, Tensor& dweight_of_slot) {
  const int64_t slots = token_of_slot.numel();
  if (slots == 0) return;
  launch<body::CombineRowsBackward>(launch_shape(slots), stream_of(dy), dy.data<float>(),
                                    y_perm.data<float>(), token_of_slot.data<int32_t>(),
                                    weight_of_slot.data<float>(), dy.dim(0), slots, dy.dim(1),
                                    dy_perm.data<float>(), dweight_of_slot.data<float>());
}

void slot_to_choice(const Tensor& dweight_of_slot, const Tensor& slot_of, Tensor& dtopk_weight) {
  const int64_t n = slot_of.numel();
  if (n == 0) return;
  launch<body::SlotToChoice>(launch_shape(n), stream_of(slot_of), dweight_of_slot.data<float>(),
                             slot_of.data<int32_t>(), dweight_of_slot.numel(),
                             dtopk_weight.data<float>(), n);
}

}  // namespace moe::cuda
