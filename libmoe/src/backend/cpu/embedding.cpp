// CPU embedding lookup and its deterministic scatter-add backward.
// Shapes: table [rows, dim], ids [N] i32, out / dy [N, dim].
#include <cstring>
#include <vector>

#include "backend/cpu/backend.h"
#include "backend/embedding_order.h"
#include "core/parallel.h"

namespace moe::cpu {

void embedding_forward(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t n = ids.numel(), dim = table.dim(1);
  const int32_t* id = ids.data<int32_t>();
  const float* t = table.data<float>();
  float* o = out.data<float>();
#pragma omp parallel for schedule(static) if (n * dim >= kParallelWork)
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(o + i * dim, t + static_cast<int64_t>(id[i]) * dim, sizeof(float) * dim);
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& host_ids,
                        Tensor& table_grad) {
  const int64_t n = ids.numel(), rows = table_grad.dim(0), dim = table_grad.dim(1);
  // Each touched row sums its tokens in token order on one thread, exactly as a serial loop would.
  const backend::EmbeddingOrder order = backend::embedding_order(host_ids.data<int32_t>(), n, rows);
  const float* g = dy.data<float>();
  float* tg = table_grad.data<float>();
  const int64_t count = static_cast<int64_t>(order.touched.size());
#pragma omp parallel for schedule(static) if (n * dim >= kParallelWork)
  for (int64_t u = 0; u < count; ++u) {
    float* dst = tg + order.touched[u] * dim;
    for (int64_t s = order.offsets[u]; s < order.offsets[u + 1]; ++s) {
      const float* src = g + order.order[s] * dim;
      for (int64_t j = 0; j < dim; ++j) dst[j] += src[j];
    }
  }
}

}  // namespace moe::cpu
