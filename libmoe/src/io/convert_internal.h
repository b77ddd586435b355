// Helpers shared by the checkpoint conversion files (reshard.cpp, expert_placement.cpp,
// convert_dtype.cpp, convert_save.cpp, inspect.cpp). Private to libmoe.
#pragma once
#include <cstdint>
#include <string>

#include "moe/models/transformer.h"

namespace moe::io {

// The block index of a tensor name: moe::block_of_name (moe/models/transformer.h).
using moe::block_of_name;

}  // namespace moe::io
