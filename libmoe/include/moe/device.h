// Where a tensor lives. Layer code never branches on it; ops dispatch on it.
#pragma once
#include <string>

namespace moe {

struct Device {
  enum Kind { cpu, cuda } kind = cpu;
  int index = 0;

  bool operator==(const Device&) const = default;
  std::string str() const;
  static Device parse(const std::string& text);  // "cpu", "cuda", "cuda:1"
};

// True when this build has a backend for the device kind and, for CUDA, a usable device (the op
// tables themselves are looked up in backend/registry.cpp).
bool backend_available(Device::Kind kind);

}  // namespace moe
