// The CUDA backend's op table (backend/cuda/backend.cpp), for the registry.
#pragma once
#include "core/backend.h"

namespace moe::cuda {

const Backend& table();

}  // namespace moe::cuda
