// Embedding lookup and its deterministic scatter-add backward.
// Shapes: table [rows, dim], ids [N] i32, out / dy [N, dim].
#include <cstring>
#include <vector>

#include "backend/cpu/parallel.h"
#include "backend/embedding_order.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#ifdef MOE_HAVE_CUDA
#include "backend/cuda/dense_ops.h"
#endif

namespace moe::ops {

namespace {
// Loops over fewer elements than this run on the calling thread: a fork/join costs more.

// host_ids: `ids` on the host (device ids are checked on a copy; the message names `ids`).
void check_ids(const Tensor& host_ids, const Tensor& ids, const Tensor& table, const char* op) {
  ids.expect_dtype(DType::i32, op);
  const int32_t* id = host_ids.data<int32_t>();
  const int64_t rows = table.dim(0);
  for (int64_t n = 0, count = ids.numel(); n < count; ++n)
    MOE_CHECK(id[n] >= 0 && id[n] < rows, op, ": id ", id[n], " at position ", n, " of ",
              ids.describe(), " is out of range for table ", table.describe());
}

}  // namespace

void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out) {
  [[maybe_unused]] const Device device = require_backend("embedding_forward", {&table, &ids, &out});
  MOE_CHECK(table.ndim() == 2, "embedding_forward: table ", table.describe(), " is not 2-D");
  table.expect_dtype(DType::f32, "embedding_forward table");
  const int64_t n = ids.numel(), dim = table.dim(1);
  out.expect_shape({n, dim}, "embedding_forward output");
  out.expect_dtype(DType::f32, "embedding_forward output");
  check_ids(ids.to(Device{}), ids, table, "embedding_forward");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::embedding_forward(table, ids, out);
#endif
  const int32_t* id = ids.data<int32_t>();
  const float* t = table.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static) if (n * dim >= cpu::kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(o + i * dim, t + static_cast<int64_t>(id[i]) * dim, sizeof(float) * dim);
}

void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& table_grad) {
  [[maybe_unused]] const Device device =
      require_backend("embedding_backward", {&dy, &ids, &table_grad});
  MOE_CHECK(table_grad.ndim() == 2, "embedding_backward: gradient ", table_grad.describe(),
            " is not 2-D");
  table_grad.expect_dtype(DType::f32, "embedding_backward gradient");
  const int64_t n = ids.numel(), rows = table_grad.dim(0), dim = table_grad.dim(1);
  dy.expect_shape({n, dim}, "embedding_backward dy");
  dy.expect_dtype(DType::f32, "embedding_backward dy");
  const Tensor host_ids = ids.to(Device{});
  check_ids(host_ids, ids, table_grad, "embedding_backward");
#ifdef MOE_HAVE_CUDA
  if (device.kind == Device::cuda) return cuda::embedding_backward(dy, ids, host_ids, table_grad);
#endif
  // Each touched row sums its tokens in token order on one thread, exactly as a serial loop would.
  const backend::EmbeddingOrder order = backend::embedding_order(host_ids.data<int32_t>(), n, rows);
  const float* g = dy.data<float>();
  float* tg = table_grad.data<float>();
  const int64_t count = static_cast<int64_t>(order.touched.size());
#pragma omp parallel for schedule(static) if (n * dim >= cpu::kParallelWork)
  for (int64_t u = 0; u < count; ++u) {
    float* dst = tg + order.touched[u] * dim;
    for (int64_t s = order.offsets[u]; s < order.offsets[u + 1]; ++s) {
      const float* src = g + order.order[s] * dim;
      for (int64_t j = 0; j < dim; ++j) dst[j] += src[j];
    }
  }
}

}  // namespace moe::ops
