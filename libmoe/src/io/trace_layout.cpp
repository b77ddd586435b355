// The trace layout the writer and reader share (see io/trace_layout.h).
#include "io/trace_layout.h"

#include <cstdint>

#include "moe/models/config.h"

namespace moe::io::trace_layout {

namespace {

// The block count the trace's model declares (model_config "layers", when it holds a count a
// model can have), else kMaxLayers: no model has more blocks than that.
int64_t block_bound(const TraceInfo& info, bool& declared) {
  const nlohmann::json& mc = info.model_config;
  declared = mc.is_object() && mc.contains("layers") && mc["layers"].is_number_integer() &&
             mc["layers"].get<int64_t>() >= 1 && mc["layers"].get<int64_t>() <= kMaxLayers;
  return declared ? mc["layers"].get<int64_t>() : kMaxLayers;
}

}  // namespace

void check_info(const TraceInfo& info, const std::string& who) {
  const int64_t L = info.layers();
  if (L < 1) throw Error(str(who, ": a trace needs at least one MoE layer (experts is empty)"));
  bool declared = false;
  const int64_t blocks = block_bound(info, declared);
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
    // Increasing indices below the block count also bound L by it.
    if (block >= blocks)
      throw Error(str(who, ": moe_blocks entry ", l, " is block ", block, ", beyond the ",
                      declared ? "model's " : "", blocks,
                      declared ? " layers (model_config 'layers')"
                               : " layers a model can have (model_config gives no layer count)"));
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
