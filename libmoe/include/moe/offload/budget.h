// Byte sizes on the command line: the budgets of the expert stores (--device-budget,
// --host-budget, moe-infer --expert-budget).
#pragma once
#include <cstdint>
#include <string>

namespace moe::offload {

// "123456" (bytes), "512MiB", "256M", "1.5GB" (B, KB/MB/GB/TB powers of 1000, KiB/MiB/GiB/TiB and
// K/M/G/T, as coreutils and dd read them, powers of 1024, case-insensitive), or "25%" of `total`;
// rounded down to whole bytes. UsageError naming `flag` otherwise (empty, negative, not a number,
// unknown unit, too large).
int64_t parse_bytes(const std::string& flag, const std::string& text, int64_t total);

// Bytes an unprivileged writer may still use on the file system holding `dir` (or its nearest
// existing ancestor: the --ssd-dir a run will create), at most INT64_MAX; -1 when it cannot be
// queried.
int64_t free_bytes(const std::string& dir);

}  // namespace moe::offload
