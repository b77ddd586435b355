// CRC32C (Castagnoli, the iSCSI/ext4/RocksDB checksum): the checksum of the SSD expert tier's
// files (moe/offload/expert_file.h). It lives in core so any file format can use the one
// implementation. On x86-64 CPUs with SSE4.2 the crc32 instruction computes it (chosen at run
// time); elsewhere a slicing-by-8 table. Both give the same value for the same bytes.
#pragma once
#include <cstddef>
#include <cstdint>

namespace moe {

// CRC32C of `bytes` bytes at `data`, continuing from `crc` (the value of the bytes before):
// crc32c(ab) == crc32c(b, crc32c(a)). crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

namespace detail {
// The two implementations behind crc32c(), for tests and benchmarks that compare them.
uint32_t crc32c_portable(const void* data, size_t bytes, uint32_t crc = 0);
// Uses the SSE4.2 instruction; call only when crc32c_hardware() is true.
uint32_t crc32c_sse42(const void* data, size_t bytes, uint32_t crc = 0);
// True when crc32c() uses the instruction (x86-64 with SSE4.2).
bool crc32c_hardware();
}  // namespace detail

}  // namespace moe
