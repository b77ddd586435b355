// CUDA grouped expert GEMM (one cublasSgemm per non-empty segment, spread over a few side streams
// that fork from and join back into the current stream: cuda::set_expert_streams, default 4; the
// offsets are host vectors) and the experts' bias / activation kernels (offsets uploaded once per
// call). cuBLAS is deterministic for a fixed shape, so no K split is needed.
//
// Why side streams: one expert's segment is a small GEMM (64 experts of about 256 rows each at
// D 1024) that leaves most of a large GPU idle, and on one stream the segments run one after the
// other: 0.67 of one dense sgemm of the same FLOPs on an H200 (2026-11-26). Each segment's call
// is unchanged by the stream it runs on (same shapes, pointers, beta, handle settings), so the
// bits are the same as on one stream.
//
// Each segment's result depends on that segment alone: its cublasSgemm sees only the segment's
// m, n, k, leading dimensions (functions of the weight's shape) and beta, and the bias and
// activation kernels work per element or per (expert, column) over the segment's rows. So one
// expert run as a group of one (offsets {0, rows}: the tiered store, nn/experts.cpp) gives the
// whole-layer call's bits, provided cuBLAS picks the same kernel for both weight pointers: the
// store's slot sections are 64-byte aligned, a resident expert's slice at least 16-byte aligned
// when its F x D (or D x F) elements are a multiple of 4 (tests/cuda/test_cuda_offload.cpp).
#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/activation.cuh"
#include "backend/cuda/grouped_gemm.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_ops.h"
#include "backend/cuda/runtime.h"

namespace moe::cuda {

namespace {

// Leading dimensions must be >= 1 even for an empty K.
int ld(int64_t n) { return static_cast<int>(n > 1 ? n : 1); }

Tensor upload_offsets(const std::vector<int32_t>& offsets, Device device) {
  return Tensor::from_vector({static_cast<int64_t>(offsets.size())}, offsets).to(device);
}

constexpr int kMaxSideStreams = 16;
std::atomic<int> side_stream_count{4};

// A device's side streams and the events that fork them from, and join them back into, the
// calling stream, created as first needed and kept for the process (like the cuBLAS handles); one
// fan-out at a time.
struct SideStreams {
  std::mutex mutex;
  std::unique_ptr<Event> fork;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Event>> joins;
};

SideStreams& side_streams(int device) {
  static std::mutex mutex;
  static auto* all = new std::map<int, std::unique_ptr<SideStreams>>;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<SideStreams>& side = (*all)[device];
  if (!side) {
    side = std::make_unique<SideStreams>();
    use_device(device);
    side->fork = std::make_unique<Event>();
  }
  return *side;
}

// call(e, stream) for each expert with rows: on `stream` itself when at most one expert has rows
// or one stream is set (cuda::set_expert_streams), else spread round-robin over the side streams,
// which start after the work queued on `stream` so far and which `stream` waits for before anything
// queued after this call.
template <class Call>
void per_segment(int device, cudaStream_t stream, const std::vector<int32_t>& offsets,
                 int64_t experts, const Call& call) {
  std::vector<int64_t> busy;
  for (int64_t e = 0; e < experts; ++e)
    if (offsets[e + 1] > offsets[e]) busy.push_back(e);
  const size_t lanes = std::min(static_cast<size_t>(side_stream_count.load()), busy.size());
  if (lanes < 2) {
    for (int64_t e : busy) call(e, stream);
    return;
  }
  SideStreams& side = side_streams(device);
  std::lock_guard<std::mutex> lock(side.mutex);
  use_device(device);
  while (side.streams.size() < lanes) {
    side.streams.push_back(std::make_unique<Stream>(device));
    side.joins.push_back(std::make_unique<Event>());
  }
  side.fork->record(stream);
  for (size_t i = 0; i < lanes; ++i) side.fork->block(side.streams[i]->get());
  for (size_t j = 0; j < busy.size(); ++j) call(busy[j], side.streams[j % lanes]->get());
  for (size_t i = 0; i < lanes; ++i) {
    side.joins[i]->record(side.streams[i]->get());
    side.joins[i]->block(stream);
  }
}

}  // namespace

void set_expert_streams(int streams) {
  MOE_CHECK(streams >= 1 && streams <= kMaxSideStreams, "expert streams: ", streams,
            " is not between 1 and ", kMaxSideStreams);
  side_stream_count = streams;
}
int expert_streams() { return side_stream_count; }

void grouped_gemm(const Tensor& a, const Tensor& w, bool transpose_w,
                  const std::vector<int32_t>& offsets, Tensor& c, float beta) {
  const int64_t experts = w.dim(0), r = w.dim(1), s = w.dim(2);
  const int64_t k = transpose_w ? s : r, n = transpose_w ? r : s;
  if (n == 0) return;
  const int device = c.device().index;
  const float alpha = 1.0f;
  const float* as = a.data<float>();
  const float* ws = w.data<float>();
  float* cs = c.data<float>();
  per_segment(device, stream_of(c), offsets, experts, [&](int64_t e, cudaStream_t stream) {
    const int64_t begin = offsets[e], m = offsets[e + 1] - begin;
    // Row-major C[m,n] = A[m,k] op(W) is column-major C^T = op(W)^T A^T: W first (ld S), then A.
    MOE_CUBLAS_CHECK(cublasSgemm(
        cublas_handle(device, stream), transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
        static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, ws + e * r * s,
        ld(s), as + begin * k, ld(k), &beta, cs + begin * n, ld(n)));
  });
}

void grouped_gemm_weight_grad(const Tensor& dy, const Tensor& x,
                              const std::vector<int32_t>& offsets, Tensor& dw) {
  const int64_t experts = dw.dim(0), r = dw.dim(1), s = dw.dim(2);
  if (r == 0 || s == 0) return;
  const int device = dw.device().index;
  const float alpha = 1.0f, beta = 1.0f;
  const float* dys = dy.data<float>();
  const float* xs = x.data<float>();
  float* dws = dw.data<float>();
  per_segment(device, stream_of(dw), offsets, experts, [&](int64_t e, cudaStream_t stream) {
    const int64_t begin = offsets[e], m = offsets[e + 1] - begin;
    // Row-major dW[r,s] += dY_seg^T X_seg is column-major dW^T = X_seg^T dY_seg (X^T read as-is).
    MOE_CUBLAS_CHECK(cublasSgemm(cublas_handle(device, stream), CUBLAS_OP_N, CUBLAS_OP_T,
                                 static_cast<int>(s), static_cast<int>(r), static_cast<int>(m),
                                 &alpha, xs + begin * s, static_cast<int>(s), dys + begin * r,
                                 static_cast<int>(r), &beta, dws + e * r * s, static_cast<int>(s)));
  });
}

void expert_activation(Tensor& h, const Tensor& h3, const Tensor& bias,
                       const std::vector<int32_t>& offsets, Activation activation,
                       SwigluClamp clamp, Tensor& a) {
  const int64_t n = h.numel();
  if (n == 0) return;
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  const Tensor offs = upload_offsets(offsets, h.device());
  if (activation == Activation::swiglu_clamped) {
    launch<body::ClampedSwiglu>(launch_shape(n), stream_of(h), h.data<float>(), h3.data<float>(),
                                bias.defined() ? bias.data<float>() : nullptr,
                                offs.data<int32_t>(), experts, h.dim(1), clamp.alpha, clamp.limit,
                                a.data<float>(), n);
    return;
  }
  const float* h3s = activation == Activation::swiglu ? h3.data<float>() : nullptr;
  launch<body::ExpertActivation>(launch_shape(n), stream_of(h), h.data<float>(), h3s,
                                 bias.defined() ? bias.data<float>() : nullptr,
                                 offs.data<int32_t>(), experts, h.dim(1), a.data<float>(), n);
}

void expert_activation_backward(const Tensor& da, const Tensor& h, const Tensor& h3,
                                Activation activation, SwigluClamp clamp, Tensor& dh,
                                Tensor& dh3) {
  const int64_t n = da.numel();
  if (n == 0) return;
  if (activation == Activation::swiglu_clamped) {
    launch<body::ClampedSwigluBackward>(launch_shape(n), stream_of(da), da.data<float>(),
                                        h.data<float>(), h3.data<float>(), clamp.alpha,
                                        clamp.limit, dh.data<float>(), dh3.data<float>(), n);
    return;
  }
  const bool swiglu = activation == Activation::swiglu;
  launch<body::ExpertActivationBackward>(launch_shape(n), stream_of(da), da.data<float>(),
                                         h.data<float>(), swiglu ? h3.data<float>() : nullptr,
                                         dh.data<float>(), swiglu ? dh3.data<float>() : nullptr, n);
}

void grouped_add_bias(Tensor& y, const Tensor& bias, const std::vector<int32_t>& offsets) {
  const int64_t n = y.numel();
  if (n == 0) return;
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1;
  const Tensor offs = upload_offsets(offsets, y.device());
  launch<body::GroupedAddBias>(launch_shape(n), stream_of(y), y.data<float>(), bias.data<float>(),
                               offs.data<int32_t>(), experts, y.dim(1), n);
}

void grouped_bias_grad(const Tensor& dy, const std::vector<int32_t>& offsets, Tensor& dbias) {
  const int64_t experts = static_cast<int64_t>(offsets.size()) - 1, width = dy.dim(1);
  if (experts * width == 0) return;
  const Tensor offs = upload_offsets(offsets, dy.device());
  launch<body::GroupedBiasGrad>(launch_shape(experts * width), stream_of(dy), dy.data<float>(),
                                offs.data<int32_t>(), experts, width, dbias.data<float>());
}

}  // namespace moe::cuda
