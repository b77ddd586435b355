// Helpers shared by the checkpoint conversion files (convert.cpp, expert_placement.cpp,
// freeze.cpp, inspect.cpp). Private to libmoe.
#pragma once
#include <cstdint>
#include <string>

namespace moe::io {

// The block index of the first "blocks.<n>." in a (parameter or optimizer tensor) name, else -1.
int64_t block_of_name(const std::string& name);

// Experts per rank when `ranks` hold a layer of `experts` in equal shares (usage error otherwise).
int64_t per_rank(int64_t experts, int ranks);

}  // namespace moe::io
