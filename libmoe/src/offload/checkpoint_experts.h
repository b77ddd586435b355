// What the inference expert stores (the ring, the serving cache) check of a checkpoint before they
// serve its experts: private to offload/.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "moe/tensor.h"

namespace moe::offload {

// Opens `path` once and checks that it holds every (name, shape) of `tensors` in /params as an
// expert tensor (one chunk per expert) of exactly that shape and of a floating-point dtype; throws
// moe::Error naming the checkpoint and the tensor otherwise ("... does not match the model: no
// tensor 'X'", "... 'X' is [4,8], the model's is [4,16]"), `not_float` ending the message for a
// dtype that is not floating-point. Returns the tensors' dtypes, in order.
std::vector<DType> check_expert_tensors(const std::string& path,
                                        const std::vector<std::pair<std::string, Shape>>& tensors,
                                        const std::string& not_float);

}  // namespace moe::offload
