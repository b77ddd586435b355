#include <vector>

#include "backend/cuda/core_ops.cuh"
#include "backend/cuda/core_ops.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/runtime.h"
#include "moe/error.h"

namespace moe::cuda {

namespace {

body::Format format_of(const Tensor& t) {
  switch (t.dtype()) {
    case DType::f32:
      return body::Format::f32;
    case DType::bf16:
      return body::Format::bf16;
    case DType::f16:
      return body::Format::f16;
    default:
      throw Error(str("cuda: ", t.describe(), " is not a floating tensor"));
  }
}

}  // namespace

void convert(const Tensor& src, Tensor& dst) {
  MOE_CHECK(src.numel() == dst.numel() && src.device() == dst.device(),
            "cuda convert: ", src.describe(), " -> ", dst.describe());
  const int64_t n = src.numel();
  if (n == 0) return;
  launch<body::Convert>(launch_shape(n), stream_of(dst), src.raw(),
                        static_cast<int>(format_of(src)), dst.raw(),
                        static_cast<int>(format_of(dst)), n);
}

void fill(Tensor& t, float value) {
  const int64_t n = t.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_of(t);
  switch (t.dtype()) {
    case DType::f32: {
      uint32_t word = kernels::f32_bits(value);
      launch<body::Fill32>(launch_shape(n), stream, static_cast<uint32_t*>(t.raw()), word, n);
      break;
    }
    case DType::i32: {
      uint32_t word = static_cast<uint32_t>(static_cast<int32_t>(value));
      launch<body::Fill32>(launch_shape(n), stream, static_cast<uint32_t*>(t.raw()), word, n);
      break;
    }
    case DType::bf16:
    case DType::f16: {
      uint16_t word =
          t.dtype() == DType::bf16 ? kernels::f32_to_bf16(value) : kernels::f32_to_f16(value);
      launch<body::Fill16>(launch_shape(n), stream, static_cast<uint16_t*>(t.raw()), word, n);
      break;
    }
    default:
      throw Error(str("fill: unsupported dtype for ", t.describe()));
  }
}

void gemm(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
          float alpha, float beta) {
  const int64_t m = c.dim(0), n = c.dim(1);
  const int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  if (m == 0 || n == 0) return;
  const int device = c.device().index;
  cudaStream_t stream = stream_of(c);
  // Row-major C[m,n] = op(A) op(B) is column-major C^T[n,m] = op(B)^T op(A)^T, and a row-major
  // matrix read column-major is its transpose: so B goes first, each with its own flag.
  MOE_CUBLAS_CHECK(cublasSgemm(
      cublas_handle(device, stream), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
      static_cast<int>(k), &alpha, b.data<float>(), static_cast<int>(b.dim(1)), a.data<float>(),
      static_cast<int>(a.dim(1)), &beta, c.data<float>(), static_cast<int>(n)));
}

void axpy(float alpha, const Tensor& x, Tensor& y) {
  const int64_t n = x.numel();
  if (n == 0) return;
  launch<body::Axpy>(launch_shape(n), stream_of(y), alpha, x.data<float>(), y.data<float>(), n);
}

void round_to_dtype(Tensor& x, DType dtype) {
  const int64_t n = x.numel();
  if (n == 0 || dtype == DType::f32) return;
  MOE_CHECK(dtype == DType::bf16 || dtype == DType::f16, "round_to_dtype: ", dtype_name(dtype),
            " is not a floating type");
  launch<body::RoundTo>(launch_shape(n), stream_of(x), x.data<float>(),
                        dtype == DType::bf16 ? 1 : 2, n);
}

double sum_squares(const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  // A fixed grid, so the partials (and their order) do not depend on n.
  const LaunchShape shape{64, 256};
  const int64_t threads = shape.blocks * shape.threads;
  const std::shared_ptr<std::byte> partial = allocate(sizeof(double) * threads, x.device().index);
  launch<body::SumSquaresPartial>(shape, stream_of(x), x.data<float>(), n,
                                  reinterpret_cast<double*>(partial.get()));
  std::vector<double> host(static_cast<size_t>(threads));
  copy_bytes(host.data(), -1, partial.get(), x.device().index, host.size() * sizeof(double));
  double s = 0;
  for (double v : host) s += v;
  return s;
}

}  // namespace moe::cuda
