// CUDA embedding lookup and its deterministic scatter-add backward (bodies in embedding.cuh).
#include <algorithm>
#include <vector>

#include "backend/cuda/dense_ops.h"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/runtime.h"
#include "moe/error.h"

namespace moe::cuda {

namespace {

// The ids on the host, checked with the CPU op's message (backend/cpu/embedding.cpp).
std::vector<int32_t> checked_host_ids(const Tensor& ids, const Tensor& table, const char* op) {
  ids.expect_dtype(DType::i32, op);
  const int64_t n = ids.numel(), rows = table.dim(0);
  std::vector<int32_t> id(static_cast<size_t>(n));
  if (n > 0) copy_bytes(id.data(), -1, ids.raw(), ids.device().index, sizeof(int32_t) * n);
  for (int64_t i = 0; i < n; ++i)
    MOE_CHECK(id[i] >= 0 && id[i] < rows, op, ": id ", id[i], " at position ", i, " of ",
              ids.describe(), " is out of range for table ", table.describe());
  return id;
}

}  // namespace

void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out) {
  checked_host_ids(ids, table, "embedding_forward");
  const int64_t n = ids.numel(), dim = table.dim(1);
  if (n * dim == 0) return;
  const int device = out.device().index;
  use_device(device);
  launch<body::EmbeddingGather>(launch_shape(n * dim), current_stream(device), table.data<float>(),
                                ids.data<int32_t>(), out.data<float>(), n, dim);
}

void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& table_grad) {
  const std::vector<int32_t> id = checked_host_ids(ids, table_grad, "embedding_backward");
  const int64_t n = ids.numel(), rows = table_grad.dim(0), dim = table_grad.dim(1);
  if (n == 0 || dim == 0) return;
  // The grouping by id is built on the host (as the CPU op builds it) and uploaded as one i64
  // buffer: order [n], touched [count], offsets [count + 1].
  const int64_t slots = n < rows ? n : rows;
  std::vector<int64_t> start(static_cast<size_t>(rows) + 1);
  std::vector<int64_t> table(static_cast<size_t>(n + 2 * slots + 1));
  int64_t* order = table.data();
  int64_t* touched = order + n;
  std::vector<int64_t> offsets(static_cast<size_t>(slots) + 1);
  const int64_t count =
      embedding_grad_table(id.data(), n, rows, start.data(), order, touched, offsets.data());
  std::copy(offsets.begin(), offsets.begin() + count + 1, touched + count);
  const int64_t used = n + 2 * count + 1;
  const int device = table_grad.device().index;
  Tensor staged = Tensor::empty({used}, DType::i64, table_grad.device());
  copy_bytes(staged.raw(), device, table.data(), -1, sizeof(int64_t) * used);
  const int64_t* d_order = static_cast<const int64_t*>(staged.raw());
  use_device(device);
  launch<body::EmbeddingScatterAdd>(launch_shape(count * dim), current_stream(device),
                                    dy.data<float>(), d_order, d_order + n, d_order + n + count,
                                    table_grad.data<float>(), count, dim);
}

}  // namespace moe::cuda
