// CUDA embedding lookup and its deterministic scatter-add backward (bodies in embedding.cuh).
#include <vector>

#include "backend/cuda/dense_ops.h"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/runtime.h"
#include "backend/embedding_order.h"

namespace moe::cuda {

void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t n = ids.numel(), dim = table.dim(1);
  if (n * dim == 0) return;
  launch<body::EmbeddingGather>(launch_shape(n * dim), stream_of(out), table.data<float>(),
                                ids.data<int32_t>(), out.data<float>(), n, dim);
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& host_ids,
                        Tensor& table_grad) {
  const int64_t n = ids.numel(), rows = table_grad.dim(0), dim = table_grad.dim(1);
  if (n == 0 || dim == 0) return;
  // The grouping by id is built on the host and uploaded as one i64 buffer:
  // order [n], touched [count], offsets [count + 1].
  const backend::EmbeddingOrder g = backend::embedding_order(host_ids.data<int32_t>(), n, rows);
  const int64_t count = static_cast<int64_t>(g.touched.size());
  std::vector<int64_t> packed(g.order);
  packed.insert(packed.end(), g.touched.begin(), g.touched.end());
  packed.insert(packed.end(), g.offsets.begin(), g.offsets.end());
  Tensor staged =
      Tensor::empty({static_cast<int64_t>(packed.size())}, DType::i64, table_grad.device());
  copy_bytes(staged.raw(), table_grad.device().index, packed.data(), -1,
             sizeof(int64_t) * packed.size());
  const int64_t* d = static_cast<const int64_t*>(staged.raw());
  launch<body::EmbeddingScatterAdd>(launch_shape(count * dim), stream_of(table_grad),
                                    dy.data<float>(), d, d + n, d + n + count,
                                    table_grad.data<float>(), count, dim);
}

}  // namespace moe::cuda
