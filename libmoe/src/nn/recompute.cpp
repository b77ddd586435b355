// Activation recomputation: mode names and the scratch arena (see moe/nn/recompute.h).
#include "moe/nn/recompute.h"

#include <algorithm>

#include "moe/error.h"
#include "moe/settings.h"

namespace moe::nn {

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::none;
  if (name == "moe") return Recompute::moe;
  if (name == "block") return Recompute::block;
  throw UsageError(str(flag_for(Setting::recompute), " ", name,
                       ": expected none (keep every activation), moe (recompute the experts' "
                       "hidden activations) or block (keep only each block's input)"));
}

const char* recompute_name(Recompute mode) {
  switch (mode) {
    case Recompute::none:
      return "none";
    case Recompute::moe:
      return "moe";
    case Recompute::block:
      return "block";
  }
  return "?";
}

void Scratch::done(const Arena* outer) {
  peak_ = std::max(peak_, (outer ? outer->used_bytes() : 0) + arena_.used_bytes());
  arena_.reset();
}

}  // namespace moe::nn
