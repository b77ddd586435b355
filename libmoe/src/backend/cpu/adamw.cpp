// CPU AdamW update: the per-element kernel (kernels/adamw.h) in one OpenMP loop.
#include "kernels/adamw.h"

#include "backend/cpu/backend.h"
#include "core/parallel.h"

namespace moe::cpu {

void adamw_update(Tensor& master_t, Tensor& m_t, Tensor& v_t, const Tensor& grad,
                  const kernels::AdamWScalars& sc) {
  float* master = master_t.data<float>();
  float* m = m_t.data<float>();
  float* v = v_t.data<float>();
  const float* g = grad.data<float>();
  int64_t n = master_t.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelWork)
  for (int64_t i = 0; i < n; ++i) kernels::adamw_update(master[i], m[i], v[i], g[i], sc);
}

}  // namespace moe::cpu
