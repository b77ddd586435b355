// The CPU's op table. Host memory needs no staging, so the copy engine is empty.
#include "backend/cpu/backend.h"

#include "backend/cpu/gemm.h"

namespace moe::cpu {

const Backend& table() {
  // The GEMM tile kernel of this host (AVX-512 or CBLAS: backend/cpu/gemm.h) is settled with the
  // table, on the thread of the first op: a bad MOE_GEMM fails there, as a usage error, rather
  // than inside a parallel loop.
  static const GemmKernel gemm_tile_kernel = gemm_kernel();
  (void)gemm_tile_kernel;
  static const Backend cpu{
      "cpu",
      {allocate, copy, convert, fill, zero},
      {gemm, axpy, scale, round_to_dtype, sum_squares},
      {embedding_forward, embedding_backward, layernorm_forward, layernorm_backward,
       rmsnorm_forward, rmsnorm_backward, bias_add, bias_grad, gelu_forward, gelu_backward,
       swiglu_forward, swiglu_backward, rope_apply, attention_forward, attention_backward,
       attention_forward_cached, cross_entropy_rows},
      {router_jitter,
       router_jitter_backward,
       router_softmax,
       router_topk,
       router_backward,
       router_sigmoid,
       router_backward_sigmoid,
       router_center_weight,
       sigmoid,
       sigmoid_backward,
       gather_rows,
       combine_rows,
       combine_rows_backward,
       slot_to_choice,
       grouped_gemm,
       grouped_gemm_weight_grad,
       expert_activation,
       expert_activation_backward,
       grouped_add_bias,
       grouped_bias_grad},
      {distill_loss_rows},
      {adamw_update, adamw_update_rounded},
      {}};
  return cpu;
}

}  // namespace moe::cpu
