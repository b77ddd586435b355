// Recording routing traces (moe/io/trace.h): moe-profile record and moe-train --trace turn the
// routing a forward pass captured into trace batches.
//
// Shape letters: L MoE layers, k experts per token, E experts of a layer.
#pragma once
#include <cstdint>
#include <string>

#include "moe/io/trace.h"
#include "moe/models/transformer.h"

namespace moe::profile {

// Recording (moe-profile record, moe-train --trace): the trace header of a model, and one batch
// from a forward pass run with routing capture (EvalOptions::capture_routing or
// RouterStep::capture_routing). ids: the batch's token ids, [B,T] or [N].
io::TraceInfo trace_info(const ModelConfig& config, io::Provenance provenance,
                         const std::string& source);
io::TraceBatch trace_batch(const io::TraceInfo& info, const ForwardStats& stats, const Tensor& ids,
                           int64_t step);

}  // namespace moe::profile
