// The CUDA op table: the functions of core_ops.h, dense_ops.h and moe_ops.h, and the runtime's
// memory, streams and events behind the device-neutral entries of core/backend.h. Host code.
#include "backend/cuda/backend.h"

#include "backend/cuda/core_ops.h"
#include "backend/cuda/dense_ops.h"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

namespace {

int index_of(const Tensor& t) { return t.device().kind == Device::cuda ? t.device().index : -1; }

void copy_tensor(Tensor& dst, const Tensor& src) {
  copy_bytes(dst.raw(), index_of(dst), src.raw(), index_of(src), dst.nbytes());
}

void zero(Tensor& t) { memset_zero(t.raw(), t.device().index, t.nbytes()); }

// ---- the copy engine: handles are a Stream* / Event* owned by the shared_ptr.
std::shared_ptr<void> create_stream(int device) { return std::make_shared<Stream>(device); }
std::shared_ptr<void> create_event(int device) {
  use_device(device);  // events belong to the current device
  return std::make_shared<Event>();
}
cudaStream_t stream_on(void* stream, int device) {
  return stream ? static_cast<Stream*>(stream)->get() : current_stream(device);
}
void record(void* event, void* stream, int device) {
  use_device(device);
  static_cast<Event*>(event)->record(stream_on(stream, device));
}
void wait(void* event, void* stream, int device) {
  use_device(device);
  static_cast<const Event*>(event)->block(stream_on(stream, device));
}
void synchronize_event(void* event) { static_cast<const Event*>(event)->synchronize(); }
void synchronize_stream(void* stream) { static_cast<const Stream*>(stream)->synchronize(); }
void copy_to_device_async(void* dst, const void* src, size_t bytes, void* stream, int device) {
  use_device(device);
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_on(stream, device)));
}
void copy_to_host_async(void* dst, const void* src, size_t bytes, void* stream, int device) {
  use_device(device);
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_on(stream, device)));
}

}  // namespace

const Backend& table() {
  static const Backend cuda{
      "cuda",
      {allocate, copy_tensor, convert, fill, zero},
      {gemm, axpy, scale_in_place, round_to_dtype, sum_squares},
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
      {adamw_update, nullptr},  // the rounded update runs as three passes (ops/optim.cpp)
      {allocate_pinned, create_stream, create_event, record, wait, synchronize_event,
       synchronize_stream, copy_to_device_async, copy_to_host_async}};
  return cuda;
}

}  // namespace moe::cuda
