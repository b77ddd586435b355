// Mapped weights (io/mapped_weights.h). Shape letters: E experts.
#include "io/mapped_weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

namespace moe::io {

namespace {

static_assert(std::endian::native == std::endian::little,
              "mapped weights are the file's little-endian bytes");

// Kernels may assume what Tensor::empty gives: 64-byte aligned rows.
constexpr haddr_t kMapAlignment = 64;

int64_t page_bytes() { return static_cast<int64_t>(sysconf(_SC_PAGESIZE)); }

using Chunk = MappingPlan::Chunk;

// The chunks of `dataset` in order of their leading index when each holds a whole tensor (one) or
// one expert (E), filtered by Fletcher32 alone and stored whole (raw bytes + 4); empty otherwise.
std::vector<Chunk> raw_chunks(hid_t dataset, const h5::DatasetInfo& info, int64_t chunk_bytes,
                              const h5::Where& w) {
  h5::Plist dcpl(MOE_H5(w, H5Dget_create_plist(dataset)));
  if (H5Pget_layout(dcpl) != H5D_CHUNKED || MOE_H5(w, H5Pget_nfilters(dcpl)) != 1) return {};
  unsigned flags = 0, config = 0;
  size_t values = 0;
  if (H5Pget_filter2(dcpl, 0, &flags, &values, nullptr, 0, nullptr, &config) !=
      H5Z_FILTER_FLETCHER32)
    return {};
  const int rank = MOE_H5(w, H5Pget_chunk(dcpl, 0, nullptr));
  if (rank != static_cast<int>(info.shape.size())) return {};
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  MOE_H5(w, H5Pget_chunk(dcpl, rank, dims.data()));
  for (size_t d = 0; d < dims.size(); ++d)
    if (static_cast<int64_t>(dims[d]) != (d == 0 && info.expert ? 1 : info.shape[d])) return {};
  const int64_t count = info.expert ? info.shape[0] : 1;
  h5::Space space(MOE_H5(w, H5Dget_space(dataset)));
  hsize_t stored = 0;
  MOE_H5(w, H5Dget_num_chunks(dataset, space, &stored));
  if (static_cast<int64_t>(stored) != count) return {};
  std::vector<Chunk> chunks(static_cast<size_t>(count));
  std::vector<hsize_t> offset(dims.size(), 0);
  std::vector<bool> seen(chunks.size(), false);
  for (hsize_t i = 0; i < stored; ++i) {
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    unsigned mask = 0;
    MOE_H5(w, H5Dget_chunk_info(dataset, space, i, offset.data(), &mask, &addr, &size));
    const int64_t at = static_cast<int64_t>(offset[0]);
    if (mask != 0 || addr == HADDR_UNDEF || size != static_cast<hsize_t>(chunk_bytes) + 4 ||
        at < 0 || at >= count)
      return {};
    chunks[static_cast<size_t>(at)] = {addr, size};
    seen[static_cast<size_t>(at)] = true;
  }
  for (bool s : seen)
    if (!s) return {};
  return chunks;
}

// The checksum stored after chunk `c` against its bytes, read in pieces with pread (the page
// cache serves them; the process's mapping stays untouched).
void verify_chunk(const MappedFile& file, const Chunk& c, const std::string& what) {
  const size_t raw = static_cast<size_t>(c.size) - 4;
  std::vector<unsigned char> buffer(Fletcher32::kFletcherPiece * 1456);
  Fletcher32 sum;
  auto read_at = [&](unsigned char* to, size_t n, off_t at) {
    for (size_t done = 0; done < n;) {
      const ssize_t got = pread(file.fd(), to + done, n - done, at + static_cast<off_t>(done));
      if (got < 0 && errno == EINTR) continue;
      MOE_CHECK(got > 0, "'", file.path(), "': reading ", what, ": ",
                got < 0 ? std::strerror(errno) : "the file ends early");
      done += static_cast<size_t>(got);
    }
  };
  for (size_t done = 0; done < raw;) {
    const size_t n = std::min(buffer.size(), raw - done);
    read_at(buffer.data(), n, static_cast<off_t>(c.addr + done));
    sum.add(buffer.data(), n);
    done += n;
  }
  unsigned char stored[4];
  read_at(stored, 4, static_cast<off_t>(c.addr + raw));
  const uint32_t want = uint32_t(stored[0]) | uint32_t(stored[1]) << 8 | uint32_t(stored[2]) << 16 |
                        uint32_t(stored[3]) << 24;
  const uint32_t got = sum.value();
  // HDF5 before 1.6.3 stored the checksum with the bytes of each half swapped; it accepts both.
  const uint32_t swapped = ((got & 0x00ff00ffu) << 8) | ((got >> 8) & 0x00ff00ffu);
  MOE_CHECK(want == got || want == swapped, "'", file.path(), "': ", what,
            ": the file is damaged: checksum mismatch");
}

// A read-only private mapping of [addr, addr + bytes) of the file; null when mmap refuses.
std::shared_ptr<std::byte> map_range(const MappedFile& file, uint64_t addr, size_t bytes) {
  const uint64_t start = addr - addr % static_cast<uint64_t>(page_bytes());
  const size_t length = static_cast<size_t>(addr - start) + bytes;
  void* at = mmap(nullptr, length, PROT_READ, MAP_PRIVATE, file.fd(), static_cast<off_t>(start));
  if (at == MAP_FAILED) return nullptr;
  std::shared_ptr<std::byte> base(static_cast<std::byte*>(at),
                                  [length](std::byte* p) { munmap(p, length); });
  return std::shared_ptr<std::byte>(base, base.get() + (addr - start));
}

// The experts' chunks side by side in one reserved range of addresses, each mapped read-only at
// its place: one tensor [E, ...] over E places in the file. Null when mmap refuses.
std::shared_ptr<std::byte> map_experts(const MappedFile& file, const std::vector<Chunk>& chunks,
                                       size_t per_expert) {
  const size_t length = per_expert * chunks.size();
  void* at = mmap(nullptr, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (at == MAP_FAILED) return nullptr;
  std::shared_ptr<std::byte> base(static_cast<std::byte*>(at),
                                  [length](std::byte* p) { munmap(p, length); });
  for (size_t e = 0; e < chunks.size(); ++e) {
    void* place = base.get() + e * per_expert;
    if (mmap(place, per_expert, PROT_READ, MAP_PRIVATE | MAP_FIXED, file.fd(),
             static_cast<off_t>(chunks[e].addr)) == MAP_FAILED)
      return nullptr;
  }
  return base;
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MOE_CHECK(fd_ >= 0, "cannot open '", path, "' to map its weights: ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw Error(str("cannot look up '", path, "' to map its weights: ", std::strerror(err)));
  }
  size_ = static_cast<int64_t>(st.st_size);
}

MappedFile::~MappedFile() {
  if (fd_ >= 0) ::close(fd_);
}

void Fletcher32::add(const unsigned char* bytes, size_t n) {
  size_t words = n / 2;
  while (words > 0) {
    size_t run = std::min<size_t>(words, kFletcherPiece / 2);
    words -= run;
    for (; run > 0; --run, bytes += 2) {
      sum1_ += uint32_t(bytes[0]) << 8 | uint32_t(bytes[1]);
      sum2_ += sum1_;
    }
    sum1_ = (sum1_ & 0xffff) + (sum1_ >> 16);
    sum2_ = (sum2_ & 0xffff) + (sum2_ >> 16);
  }
  if (n % 2 != 0) {  // a last odd byte counts as the high byte of a word
    sum1_ += uint32_t(bytes[0]) << 8;
    sum2_ += sum1_;
    sum1_ = (sum1_ & 0xffff) + (sum1_ >> 16);
    sum2_ = (sum2_ & 0xffff) + (sum2_ >> 16);
  }
}

uint32_t Fletcher32::value() const {
  const uint32_t s1 = (sum1_ & 0xffff) + (sum1_ >> 16), s2 = (sum2_ & 0xffff) + (sum2_ >> 16);
  return s2 << 16 | s1;
}

std::optional<MappingPlan> plan_mapping(const MappedFile& file, hid_t dataset,
                                        const h5::DatasetInfo& info, const h5::Where& where) {
  const int64_t numel = shape_numel(info.shape);
  if (info.shape.empty() || numel == 0) return std::nullopt;
  const int64_t count = info.expert ? info.shape[0] : 1;
  const int64_t bytes = numel * static_cast<int64_t>(dtype_size(info.dtype));
  const int64_t per_chunk = bytes / count;
  std::vector<Chunk> chunks = raw_chunks(dataset, info, per_chunk, where);
  if (chunks.empty()) return std::nullopt;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    MOE_CHECK(c.addr + c.size <= static_cast<uint64_t>(file.size()), where.describe(), ": ",
              info.expert ? str("expert ", i, " ends") : std::string("the tensor ends"),
              " at byte ", c.addr + c.size, ", past the end of the file (", file.size(),
              " bytes): the file is truncated");
  }
  const uint64_t page = static_cast<uint64_t>(page_bytes());
  if (info.expert) {
    if (per_chunk % static_cast<int64_t>(page) != 0) return std::nullopt;
    for (const Chunk& c : chunks)
      if (c.addr % page != 0) return std::nullopt;
  } else if (chunks[0].addr % kMapAlignment != 0) {
    return std::nullopt;
  }
  return MappingPlan{std::move(chunks), info.shape, info.dtype, info.expert, where.object};
}

Tensor map_planned(const MappedFile& file, const MappingPlan& plan, bool verify) {
  if (verify)
    for (size_t i = 0; i < plan.chunks.size(); ++i)
      verify_chunk(file, plan.chunks[i],
                   plan.expert ? str(plan.object, " (expert ", i, ")") : plan.object);
  const size_t bytes = static_cast<size_t>(shape_numel(plan.shape)) * dtype_size(plan.dtype);
  std::shared_ptr<std::byte> storage =
      plan.expert ? map_experts(file, plan.chunks, bytes / plan.chunks.size())
                  : map_range(file, plan.chunks[0].addr, bytes);
  if (!storage) return Tensor();
  return Tensor::from_storage(std::move(storage), plan.shape, plan.dtype);
}

}  // namespace moe::io
