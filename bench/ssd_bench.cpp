// moe-ssd-bench: the SSD expert tier's files (offload::ExpertFiles) and their checksum, each row
// beside its ceiling measured in the same run on the same bytes:
//   - CRC32C (SSE4.2 instruction, slicing-by-8 table) against a read pass over the buffer (the sum
//     of its 64-bit words: the memory bandwidth a checksum cannot beat);
//   - ExpertFiles::write / read (header + payload in one pwritev / preadv, CRC32C computed and
//     verified) against raw pwrite / pread of the same bytes into plain files of the same size,
//     with the page cache warm, and cold (each file's pages dropped first with fdatasync +
//     posix_fadvise(DONTNEED)), cold with will_need() asked one expert ahead, and with direct
//     reads (ExpertFileOptions::direct_reads: O_DIRECT into a 4096-aligned buffer) cold and warm.
// Rates count payload bytes only (the tier also moves a 4096-byte header per expert).
// Not a test: nothing is asserted; the `bitwise` column says whether every byte read back equals
// what was written. Shapes: E experts, P payload bytes per expert.
#include <fcntl.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/cli.h"
#include "machine.h"
#include "moe/checksum.h"
#include "moe/error.h"
#include "moe/offload/expert_file.h"
#include "moe/timer.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

struct Options {
  std::string dir;
  std::vector<double> expert_mib{1, 4, 16};
  double total_mib = 256, checksum_mib = 64;
  int passes = 3;
  bool quick = false;
};

template <class F>
double best_seconds(int passes, F&& run) {
  double best = 1e30;
  for (int p = 0; p < passes; ++p) {
    Timer t;
    run();
    best = std::min(best, t.seconds());
  }
  return best;
}

uint64_t read_pass(const std::vector<uint64_t>& words) {
  uint64_t sum = 0;
  for (uint64_t w : words) sum += w;
  return sum;
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(str("cannot open '", path, "'"));
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void raw_io(const std::string& path, void* data, size_t bytes, bool writing) {
  const int fd = writing ? ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600)
                         : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(str("cannot open '", path, "'"));
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n =
        writing
            ? ::pwrite(fd, static_cast<char*>(data) + done, bytes - done, static_cast<off_t>(done))
            : ::pread(fd, static_cast<char*>(data) + done, bytes - done, static_cast<off_t>(done));
    if (n <= 0) {
      ::close(fd);
      throw Error(str("raw I/O on '", path, "' failed"));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

void print_row(const char* what, double mib, int experts, const char* op, double seconds,
               double bytes, double ceiling_gbs, const char* check) {
  const double rate = bytes / seconds / 1e9;
  std::printf("%-12s %8.2f %7d  %-20s %9.2f %9.2f %9.2f %7.1f  %s\n", what, mib, experts, op,
              seconds * 1e3, rate, ceiling_gbs, 100.0 * rate / ceiling_gbs, check);
}

void checksum_table(const Options& o) {
  const size_t bytes = static_cast<size_t>(o.checksum_mib * 1048576.0) / 8 * 8;
  std::vector<uint64_t> words(bytes / 8);
  std::mt19937_64 gen(1);
  for (uint64_t& w : words) w = gen();
  volatile uint64_t sink = 0;
  const double ceiling = best_seconds(o.passes + 2, [&] { sink = sink + read_pass(words); });
  const uint32_t reference = detail::crc32c_portable(words.data(), bytes);
  std::printf(
      "#\n# CRC32C over %.0f MiB of random bytes; ceiling: a read pass (sum of 64-bit words)\n",
      o.checksum_mib);
  std::printf("# %-18s %10s %10s %10s %8s  %s\n", "implementation", "time", "rate", "ceiling",
              "ratio", "agrees");
  std::printf("# %-18s %10s %10s %10s %8s\n", "", "(ms)", "(GB/s)", "(GB/s)", "(%)");
  const auto row = [&](const char* name, uint32_t (*fn)(const void*, size_t, uint32_t)) {
    uint32_t value = 0;
    const double s = best_seconds(o.passes + 2, [&] { value = fn(words.data(), bytes, 0); });
    std::printf("  %-18s %10.2f %10.2f %10.2f %8.1f  %s\n", name, s * 1e3, bytes / s / 1e9,
                bytes / ceiling / 1e9, 100.0 * ceiling / s, value == reference ? "yes" : "NO");
  };
  std::printf("  %-18s %10.2f %10.2f\n", "read pass", ceiling * 1e3, bytes / ceiling / 1e9);
  if (detail::crc32c_hardware()) row("sse4.2 crc32", detail::crc32c_sse42);
  row("slicing-by-8 table", detail::crc32c_portable);
}

void files_table(const Options& o, const std::string& dir) {
  std::printf(
      "#\n# ExpertFiles (header + payload, CRC32C) vs raw pwrite/pread of the same bytes into "
      "plain files\n# cold: each file's pages dropped before it is read (fdatasync + "
      "DONTNEED); willneed: will_need() one expert ahead;\n# direct: O_DIRECT reads "
      "(ExpertFileOptions::direct_reads), the ceiling stays buffered raw pread\n");
  std::printf("# %-10s %8s %7s  %-20s %9s %9s %9s %7s  %s\n", "", "expert", "experts", "op", "time",
              "rate", "ceiling", "ratio", "bitwise");
  std::printf("# %-10s %8s %7s  %-20s %9s %9s %9s %7s\n", "", "(MiB)", "", "", "(ms)", "(GB/s)",
              "(GB/s)", "(%)");
  for (double mib : o.expert_mib) {
    const auto payload = static_cast<int64_t>(mib * 1048576.0) / 64 * 64;
    const int experts = std::max(1, static_cast<int>(o.total_mib / mib));
    const offload::LayerRecords layer{
        offload::RecordLayout::packed({{"state", DType::f32, {payload / 4}}}), experts};
    offload::ExpertFiles files(dir, {layer}, {/*direct_reads=*/true});
    const std::string raw_dir = files.run_directory() + "/raw";
    fs::create_directories(raw_dir);
    const auto raw_path = [&](int e) { return str(raw_dir, "/", e, ".bin"); };

    std::vector<std::vector<unsigned char>> data(static_cast<size_t>(experts));
    std::mt19937 gen(static_cast<uint32_t>(mib * 100));
    for (auto& d : data) {
      d.resize(static_cast<size_t>(payload));
      for (size_t i = 0; i < d.size(); i += 4) {
        const uint32_t v = gen();
        std::memcpy(d.data() + i, &v, 4);
      }
    }
    // Reads into `aligned` go around the page cache (O_DIRECT); into `aligned + 64`, through it.
    std::unique_ptr<unsigned char, decltype(&std::free)> buffer(
        static_cast<unsigned char*>(std::aligned_alloc(4096, static_cast<size_t>(payload) + 4096)),
        &std::free);
    const double bytes = static_cast<double>(payload) * experts;

    const double raw_write = best_seconds(o.passes, [&] {
      for (int e = 0; e < experts; ++e) raw_io(raw_path(e), data[e].data(), data[e].size(), true);
    });
    const double tier_write = best_seconds(o.passes, [&] {
      for (int e = 0; e < experts; ++e) files.write(0, e, data[e].data());
    });
    print_row("", mib, experts, "write", tier_write, bytes, bytes / raw_write / 1e9, "-");

    for (const char* mode :
         {"read warm", "read cold", "read cold willneed", "read cold direct", "read warm direct"}) {
      const bool cold = std::strstr(mode, "cold") != nullptr;
      const bool ahead = std::strstr(mode, "willneed") != nullptr;
      const bool direct = std::strstr(mode, "direct") != nullptr;
      unsigned char* back = buffer.get() + (direct ? 0 : 64);
      std::vector<unsigned char> raw_back(static_cast<size_t>(payload));
      double raw = 1e30, tier = 1e30;
      bool equal = true;
      for (int p = 0; p < o.passes; ++p) {
        if (cold)
          for (int e = 0; e < experts; ++e) drop_cache(raw_path(e));
        Timer t;
        for (int e = 0; e < experts; ++e) {
          if (ahead && e + 1 < experts) {
            const int fd = ::open(raw_path(e + 1).c_str(), O_RDONLY | O_CLOEXEC);
            ::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
            ::close(fd);
          }
          raw_io(raw_path(e), raw_back.data(), raw_back.size(), false);
        }
        raw = std::min(raw, t.seconds());
        if (cold)
          for (int e = 0; e < experts; ++e) drop_cache(files.path(0, e));
        t.reset();
        for (int e = 0; e < experts; ++e) {
          if (ahead && e + 1 < experts) files.will_need(0, e + 1);
          files.read(0, e, back);
          if (p == 0) equal = equal && std::memcmp(back, data[e].data(), data[e].size()) == 0;
        }
        tier = std::min(tier, t.seconds());
      }
      print_row("", mib, experts, mode, tier, bytes, bytes / raw / 1e9, equal ? "yes" : "NO");
    }
    if (files.direct_reads() == 0)
      std::printf(
          "# (the file system refused O_DIRECT: the direct rows read through the page cache)\n");
  }
}

int run(const Options& o) {
  std::string dir = o.dir;
  const bool temporary = dir.empty();
  if (temporary) dir = (fs::temp_directory_path() / str("moe-ssd-bench-", ::getpid())).string();
  struct statfs info {};
  fs::create_directories(dir);
  ::statfs(dir.c_str(), &info);
  std::printf("# moe-ssd-bench: SSD expert tier files (offload::ExpertFiles) and CRC32C\n");
  std::printf("# %s, %s, 1 thread\n", bench::now_utc().c_str(), bench::cpu_model().c_str());
  std::printf("# dir %s (file system magic 0x%lx), best of %d passes\n", dir.c_str(),
              static_cast<unsigned long>(info.f_type), o.passes);
  checksum_table(o);
  files_table(o, dir);
  if (temporary) fs::remove_all(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "moe-ssd-bench: CRC32C and the SSD expert tier's files (ExpertFiles write/read, warm and "
      "cold page cache) against a read pass and raw pwrite/pread in the same run"};
  app.add_option("--dir", opt.dir,
                 "Where to write (an --ssd-dir; default: a temporary directory, removed)");
  app.add_option("--expert-mib", opt.expert_mib, "Payload MiB per expert, one table row each")
      ->capture_default_str();
  app.add_option("--total-mib", opt.total_mib, "MiB of experts per row")->capture_default_str();
  app.add_option("--checksum-mib", opt.checksum_mib, "Buffer MiB of the checksum table")
      ->capture_default_str();
  app.add_option("--passes", opt.passes, "Timed passes per row (best reported)")
      ->capture_default_str();
  app.add_flag("--quick", opt.quick, "Small sizes (smoke run)");
  return tools::run_tool("moe-ssd-bench", app, argc, argv, [&]() -> int {
    if (opt.quick) {
      opt.expert_mib = {0.25, 1};
      opt.total_mib = 8;
      opt.checksum_mib = 4;
      opt.passes = 2;
    }
    return run(opt);
  });
}
