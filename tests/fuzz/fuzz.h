// What every fuzz target shares (docs/RELIABILITY.md, "Fuzzing").
//
// A target hands libFuzzer's bytes to one of libmoe's readers of outside input. Refusing the
// input with moe::Error (UsageError included) is the reader doing its job; anything else that
// escapes (another exception type, a crash, a sanitizer report, a hang, a leak) is a finding.
// Readers that take only a path get the bytes through a file in a private scratch directory
// (removed at exit); the HDF5 readers take the bytes as a file image and touch no disk.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "moe/error.h"

namespace moe::fuzz {

// The bytes as a string.
inline std::string bytes_of(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// This process's scratch directory (created on first use, removed with its files at exit).
const std::string& scratch_dir();
// Writes `bytes` to scratch_dir()/name (truncating) and returns its path.
std::string write_scratch(const std::string& name, const std::string& bytes);

// Runs `read`; moe::Error (the documented refusal) is swallowed, everything else propagates.
template <class F>
void expect_clean(F&& read) {
  try {
    read();
  } catch (const moe::Error&) {
  }
}

}  // namespace moe::fuzz
