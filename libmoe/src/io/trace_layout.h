// What the trace writer and reader share about the file's layout (docs/FORMATS.md, "Routing
// trace, version 1"): group names, the rules on TraceInfo, and row hyperslabs of the per-token and
// per-batch datasets. Private to libmoe (trace_writer.cpp, trace.cpp).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "moe/io/hdf5.h"
#include "moe/io/trace.h"

namespace moe::io::trace_layout {

using h5::Where;

const char* const kLayersGroup = "layers";
const char* const kTokensGroup = "tokens";
const char* const kBatchesGroup = "batches";

inline std::string child(const std::string& group, const char* name) {
  return str("/", group, "/", name);
}

// The rules shared by writer and reader; `who` names the file ("trace 'x.h5'").
void check_info(const TraceInfo& info, const std::string& who);

// The row hyperslab [start, start + rows) x rest of `dataset`'s file space, and a matching memory
// space. rows > 0.
std::pair<h5::Space, h5::Space> row_spaces(hid_t dataset, hsize_t start, hsize_t rows,
                                           const std::vector<hsize_t>& rest, const Where& where);

}  // namespace moe::io::trace_layout
