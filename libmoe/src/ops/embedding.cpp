// Embedding lookup and its backward: operand checks (ids on a host copy), then Backend::dense.
// Shapes: table [rows, dim], ids [N] i32, out / dy [N, dim].
#include "core/backend.h"
#include "moe/ops/core.h"
#include "moe/ops/dense.h"
#include "moe/step_breakdown.h"

namespace moe::ops {

namespace {

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
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("embedding_forward", {&table, &ids, &out});
  MOE_CHECK(table.ndim() == 2, "embedding_forward: table ", table.describe(), " is not 2-D");
  table.expect_dtype(DType::f32, "embedding_forward table");
  const int64_t n = ids.numel(), dim = table.dim(1);
  out.expect_shape({n, dim}, "embedding_forward output");
  out.expect_dtype(DType::f32, "embedding_forward output");
  check_ids(ids.to(Device{}), ids, table, "embedding_forward");
  backend_for(device).dense.embedding_forward(table, ids, out);
}

void embedding_backward(const Tensor& dy, const Tensor& ids, Tensor& table_grad) {
  const PartScope part(StepPart::elementwise);
  const Device device = require_backend("embedding_backward", {&dy, &ids, &table_grad});
  MOE_CHECK(table_grad.ndim() == 2, "embedding_backward: gradient ", table_grad.describe(),
            " is not 2-D");
  table_grad.expect_dtype(DType::f32, "embedding_backward gradient");
  const int64_t n = ids.numel(), dim = table_grad.dim(1);
  dy.expect_shape({n, dim}, "embedding_backward dy");
  dy.expect_dtype(DType::f32, "embedding_backward dy");
  const Tensor host_ids = ids.to(Device{});
  check_ids(host_ids, ids, table_grad, "embedding_backward");
  backend_for(device).dense.embedding_backward(dy, ids, host_ids, table_grad);
}

}  // namespace moe::ops
