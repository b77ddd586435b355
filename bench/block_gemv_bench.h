// moe-bench --decode --dtypes q4_k,q6_k,mxfp4: the decode GEMV alone over block-format weights,
// per instruction-set copy, beside Q8_0's (bench/block_gemv_bench.cpp).
#pragma once
#include <string>
#include <vector>

namespace moe::bench {

// True for the block formats (q4_k, q6_k, mxfp4): the decode bench's model cannot hold them
// (its d_ff, 1408, is not a whole number of 256-blocks), so they get the GEMV table instead.
bool is_block_dtype_name(const std::string& name);

// The table: GB/s of weights read by one GEMV of one input row over a set of matrices, for Q8_0
// and each named format, each path this CPU runs (scalar, avx2, avx512, avx512_vnni), at 1 thread
// and at `threads` (0: the library default), the median of `rounds` rounds taken in turn; each
// copy's outputs compared bitwise with the scalar path's.
void run_block_gemv(const std::vector<std::string>& formats, bool quick, int threads, int rounds);

}  // namespace moe::bench
