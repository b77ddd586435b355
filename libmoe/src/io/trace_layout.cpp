// The trace layout the writer and reader share (see io/trace_layout.h).
#include "io/trace_layout.h"

#include <cstdint>

namespace moe::io::trace_layout {

void check_info(const TraceInfo& info, const std::string& who) {
  const int64_t L = info.layers();
  if (L < 1) throw Error(str(who, ": a trace needs at least one MoE layer (experts is empty)"));
  if (static_cast<int64_t>(info.moe_blocks.size()) != L)
    throw Error(str(who, ": moe_blocks has ", info.moe_blocks.size(), " entries but experts has ",
                    L, " (one of each per MoE layer)"));
  if (info.top_k < 1) throw Error(str(who, ": top_k is ", info.top_k, ", must be >= 1"));
  for (int64_t l = 0; l < L; ++l) {
    const int64_t E = info.experts[static_cast<size_t>(l)];
    const int64_t block = info.moe_blocks[static_cast<size_t>(l)];
    if (E < 1 || E > INT32_MAX)
      throw Error(str(who, ": MoE layer ", l, " (block ", block, ") has ", E, " experts"));
    if (info.top_k > E)
      throw Error(str(who, ": top_k ", info.top_k, " exceeds the ", E, " experts of MoE layer ", l,
                      " (block ", block, ")"));
    if (block < 0 || (l > 0 && block <= info.moe_blocks[static_cast<size_t>(l - 1)]))
      throw Error(
          str(who, ": moe_blocks must be increasing block indices >= 0, entry ", l, " is ", block));
  }
}

// The row hyperslab [start, start + rows) x rest of `dataset`'s file space, and a matching memory
// space. rows > 0.
std::pair<h5::Space, h5::Space> row_spaces(hid_t dataset, hsize_t start, hsize_t rows,
                                           const std::vector<hsize_t>& rest, const Where& where) {
  std::vector<hsize_t> offset(rest.size() + 1, 0), count{rows};
  offset[0] = start;
  count.insert(count.end(), rest.begin(), rest.end());
  h5::Space file_space(MOE_H5(where, H5Dget_space(dataset)));
  MOE_H5(where, H5Sselect_hyperslab(file_space, H5S_SELECT_SET, offset.data(), nullptr,
                                    count.data(), nullptr));
  h5::Space mem_space(
      MOE_H5(where, H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr)));
  return {std::move(file_space), std::move(mem_space)};
}

}  // namespace moe::io::trace_layout
