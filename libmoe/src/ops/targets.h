// The class targets of a loss over logits [N,V] (cross_entropy, distill_loss): checked and counted
// on the host, from a copy when they live on a device (N ids). Internal to ops/.
#pragma once
#include <cstdint>

#include "moe/tensor.h"

namespace moe::ops {

struct HostTargets {
  Tensor host;          // targets [N] i32 on the host
  int64_t counted = 0;  // rows with target >= 0
};

// Throws naming `op`, the row and both tensors when a target is >= V, or when V is 0 and a row
// counts.
inline HostTargets check_targets(const char* op, const Tensor& targets, const Tensor& logits) {
  const int64_t n = logits.dim(0), vocab = logits.dim(1);
  HostTargets out{targets.to(Device{}), 0};
  const int32_t* tg = out.host.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    MOE_CHECK(tg[i] < vocab, op, ": target ", tg[i], " at row ", i, " of ", targets.describe(),
              " is out of range for logits ", logits.describe());
    if (tg[i] >= 0) ++out.counted;
  }
  MOE_CHECK(vocab > 0 || out.counted == 0, op, ": logits ", logits.describe(), " have no classes");
  return out;
}

}  // namespace moe::ops
