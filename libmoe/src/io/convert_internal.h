// Helpers shared by the checkpoint conversion files (reshard.cpp, expert_placement.cpp,
// convert_dtype.cpp, convert_save.cpp, inspect.cpp). Private to libmoe.
#pragma once
#include <cstdint>
#include <string>

namespace moe::io {

// The block index of the first "blocks.<n>." in a (parameter or optimizer tensor) name, else -1.
int64_t block_of_name(const std::string& name);

}  // namespace moe::io
