// Helpers shared by the checkpoint conversion files (reshard.cpp, expert_placement.cpp,
// convert_dtype.cpp, convert_save.cpp, inspect.cpp). Private to libmoe.
#pragma once
#include <cstdint>
#include <string>

#include "moe/io/checkpoint.h"
#include "moe/models/transformer.h"

namespace moe::io {

// The block index of a tensor name: moe::block_of_name (moe/models/transformer.h).
using moe::block_of_name;

// The most precise values of a parameter there are: its fp32 `master` when it has one (checked to
// be of its shape and f32; may be null), else the parameter widened to f32. Lazy when the inputs
// are (map_tensor).
NamedTensor exact_values(const NamedTensor& param, const NamedTensor* master);

}  // namespace moe::io
