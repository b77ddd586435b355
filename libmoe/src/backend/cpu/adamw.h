// CPU AdamW internals, for the backend table (adamw.cpp), the tests and moe-optim-bench: the update
// loop on raw arrays with a chosen instruction-set path, so that every path this CPU can run is
// checked bitwise against the per-element kernel (kernels/adamw.h).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/cpu/vector_isa.h"
#include "kernels/adamw.h"
#include "moe/dtype.h"

namespace moe::cpu {

// The loop is compiled once per cpu::VectorIsa (vector_isa.h); adamw_update and the table entries
// use vector_isa_best(). All give the same bits: the file compiles with -ffp-contract=off (no
// fused multiply-add) and the operations left (+, -, *, /, sqrt) are correctly rounded in every
// vector width.

// n elements of one parameter. `value` (null: none) receives the updated master rounded to
// value_dtype (bf16 or f16 bits, as Tensor::copy_from rounds), and `compute` (null: none; needs
// value) its fp32 upcast, as Param::refresh_compute makes it: one pass over memory instead of
// three.
struct AdamWArrays {
  float* master;
  float* m;
  float* v;
  const float* grad;
  uint16_t* value = nullptr;
  DType value_dtype = DType::bf16;
  float* compute = nullptr;
};

// OpenMP over the elements when n >= kParallelWork (a new team from any thread, including a
// worker std::thread: concurrent calls on different arrays are independent).
void adamw_update_arrays(const AdamWArrays& a, int64_t n, const kernels::AdamWScalars& scalars,
                         VectorIsa isa);

}  // namespace moe::cpu
