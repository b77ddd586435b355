// The SSD tier's per-expert files (offload::ExpertFiles): round trips of several layouts, threads
// on different experts, partial (section) reads, O_DIRECT reads, space reserved up front, and
// every refusal on real files: --ssd-dir not a directory or not writable, a file system too small,
// ENOSPC mid-run (/dev/full), a short write and a failed reservation (RLIMIT_FSIZE), a flipped
// section, padding or header byte, a truncated, missing, stale, swapped or foreign file, another
// format version, two operations on one expert at once, and abandoned run directories of crashed
// runs.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include "moe/checksum.h"  // to forge a header of another version
#include "moe/error.h"
#include "moe/offload/expert_file.h"
#include "moe/rng.h"
#include "support/run.h"

using namespace moe;
using offload::ExpertFileHeader;
using offload::ExpertFiles;
using offload::LayerRecords;
using offload::RecordLayout;
using offload::RecordSection;
namespace fs = std::filesystem;

namespace {

// A layer of a gpt-like expert (w1 [F,D], b1 [F], w2 [D,F] with value, master, moments, grad),
// with the value stored as `value_dtype`: the shapes vary with (d, f) so layers differ.
LayerRecords expert_layer(int64_t d, int64_t f, int experts, DType value_dtype = DType::bf16) {
  std::vector<RecordSection> sections;
  for (const auto& [name, shape] :
       std::vector<std::pair<std::string, Shape>>{{"w1", {f, d}}, {"b1", {f}}, {"w2", {d, f}}}) {
    sections.push_back({name + ".value", value_dtype, shape});
    for (const char* state : {".master", ".adam_m", ".adam_v", ".grad"})
      sections.push_back({name + state, DType::f32, shape});
  }
  return {RecordLayout::packed(std::move(sections)), experts};
}

std::vector<unsigned char> random_bytes(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> bytes(static_cast<size_t>(n));
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(gen());
  return bytes;
}

// A record of random section bytes and zero padding (what a read gives back: padding is written
// as zeros whatever the caller's buffer holds there).
std::vector<unsigned char> random_record(const RecordLayout& layout, uint32_t seed) {
  const std::vector<unsigned char> noise = random_bytes(layout.payload_bytes, seed);
  std::vector<unsigned char> record(noise.size(), 0);
  for (const RecordSection& s : layout.sections)
    std::copy_n(noise.begin() + s.offset, s.bytes, record.begin() + s.offset);
  return record;
}

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void put_file_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void flip_byte(const std::string& path, int64_t offset) {
  std::vector<unsigned char> bytes = file_bytes(path);
  REQUIRE(offset < static_cast<int64_t>(bytes.size()));
  bytes[static_cast<size_t>(offset)] ^= 0x10;
  put_file_bytes(path, bytes);
}

// The run subdirectories in `dir`.
std::vector<std::string> runs_in(const std::string& dir) {
  std::vector<std::string> runs;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("moe-ssd-", 0) == 0) runs.push_back(e.path().string());
  return runs;
}

}  // namespace

TEST_CASE("RecordLayout: packed offsets, validation, hash, section lookup", "[offload][layout]") {
  const RecordLayout layout = RecordLayout::packed({{"w.value", DType::bf16, {3, 5}},
                                                    {"w.master", DType::f32, {3, 5}},
                                                    {"flag", DType::u8, {}}});
  REQUIRE(layout.sections.size() == 3);
  CHECK(layout.sections[0].offset == 0);
  CHECK(layout.sections[0].bytes == 30);
  CHECK(layout.sections[1].offset == 64);
  CHECK(layout.sections[1].bytes == 60);
  CHECK(layout.sections[2].offset == 128);
  CHECK(layout.sections[2].bytes == 1);  // a scalar: shape {} has one element
  CHECK(layout.payload_bytes == 192);
  CHECK(layout.section("w.master").offset == 64);
  CHECK_THAT(
      test::error_of([&] { layout.section("w.adam_m"); }),
      Catch::Contains("no section 'w.adam_m'") && Catch::Contains("w.value, w.master, flag"));
  CHECK(RecordLayout::packed({{"a", DType::f32, {7}}}, 4096).payload_bytes == 4096);

  // The hash changes with anything that changes how the bytes are read.
  const uint64_t h = layout.hash();
  CHECK(h == RecordLayout::packed({{"w.value", DType::bf16, {3, 5}},
                                   {"w.master", DType::f32, {3, 5}},
                                   {"flag", DType::u8, {}}})
                 .hash());
  CHECK(h != RecordLayout::packed({{"w.value", DType::f16, {3, 5}},
                                   {"w.master", DType::f32, {3, 5}},
                                   {"flag", DType::u8, {}}})
                 .hash());
  CHECK(h != RecordLayout::packed({{"w.value", DType::bf16, {5, 3}},
                                   {"w.master", DType::f32, {5, 3}},
                                   {"flag", DType::u8, {}}})
                 .hash());
  CHECK(h != RecordLayout::packed({{"w.master", DType::bf16, {3, 5}},
                                   {"w.value", DType::f32, {3, 5}},
                                   {"flag", DType::u8, {}}})
                 .hash());

  // The hash is the one docs/FORMATS.md spells out.
  const RecordLayout small =
      RecordLayout::packed({{"a", DType::f32, {2, 3}}, {"b", DType::bf16, {}}});
  std::string text = "moe.ssd.layout;payload=128;";
  for (const char* field : {"a", "f32", "[2,3]", "0", "24;b", "bf16", "[]", "64"})
    text += std::string(field) + '\0';
  text += "2;";
  CHECK(small.hash() == hash_name(text));

  // Refusals, each naming the section.
  CHECK_THROWS_AS(RecordLayout::packed({}), UsageError);
  CHECK_THAT(test::error_of([] {
               RecordLayout::packed({{"a", DType::f32, {2}}, {"a", DType::f32, {2}}});
             }),
             Catch::Contains("'a' appears twice"));
  CHECK_THAT(test::error_of([] {
               RecordLayout::packed({{"a", DType::f32, {2, -1}}});
             }),
             Catch::Contains("'a'") && Catch::Contains("negative"));
  CHECK_THAT(test::error_of([] {
               RecordLayout::packed({{"a", DType::f32, {2}}}, 48);
             }),
             Catch::Contains("power of two"));
  RecordLayout bad = layout;
  bad.sections[1].offset = 16;  // into w.value's bytes
  CHECK_THAT(test::error_of([&] { bad.validate("test"); }),
             Catch::Contains("'w.value' and 'w.master' overlap"));
  bad = layout;
  bad.sections[0].bytes = 32;
  CHECK_THAT(test::error_of([&] { bad.validate("test"); }),
             Catch::Contains("'w.value'") && Catch::Contains("has 32 bytes, expected 30"));
  bad = layout;
  bad.payload_bytes = 100;
  CHECK_THAT(test::error_of([&] { bad.validate("test"); }),
             Catch::Contains("'w.master'") && Catch::Contains("leaves the payload of 100 bytes"));
}

TEST_CASE("ExpertFiles: layers of different layouts round-trip bitwise, files go with the object",
          "[offload][ssd]") {
  test::ScratchDir scratch("ssd-roundtrip");
  const std::string dir = scratch / "ssd";  // created by ExpertFiles
  const std::vector<LayerRecords> layers{expert_layer(16, 64, 4),
                                         expert_layer(8, 24, 3, DType::f32),
                                         expert_layer(12, 40, 2, DType::f16)};
  std::string run_dir;
  {
    ExpertFiles files(dir, layers);
    run_dir = files.run_directory();
    CHECK(files.directory() == dir);
    CHECK(run_dir.rfind(dir + "/moe-ssd-", 0) == 0);
    CHECK(files.num_layers() == 3);
    CHECK(files.path(1, 2) == run_dir + "/layer-0001/expert-00002.bin");
    CHECK(ExpertFiles::file_bytes(layers[0].layout) == 4096 + layers[0].layout.payload_bytes);

    std::vector<std::vector<std::vector<unsigned char>>> written(layers.size());
    for (int round = 0; round < 2; ++round) {  // the second round overwrites every file
      for (int l = 0; l < 3; ++l) {
        written[l].resize(static_cast<size_t>(layers[l].experts));
        for (int e = 0; e < layers[l].experts; ++e) {
          CHECK(files.written(l, e) == (round > 0));
          written[l][e] = random_record(layers[l].layout, 100 * round + 10 * l + e);
          files.write(l, e, written[l][e].data());
          CHECK(files.written(l, e));
          CHECK(static_cast<int64_t>(fs::file_size(files.path(l, e))) ==
                ExpertFiles::file_bytes(layers[l].layout));
        }
      }
      for (int l = 2; l >= 0; --l) {
        for (int e = 0; e < layers[l].experts; ++e) {
          files.will_need(l, e);
          std::vector<unsigned char> back(written[l][e].size(), 0xAB);
          files.read(l, e, back.data());
          CHECK(back == written[l][e]);
        }
      }
    }
    int64_t payload_total = 0;
    for (const LayerRecords& l : layers) payload_total += l.experts * l.layout.payload_bytes;
    CHECK(files.bytes_written() == 2 * payload_total);
    CHECK(files.bytes_read() == 2 * payload_total);
    CHECK(files.writes() == 18);
    CHECK(files.reads() == 18);
    CHECK(fs::is_directory(run_dir));
  }
  CHECK_FALSE(fs::exists(run_dir));  // a cache: nothing stays behind
  CHECK(runs_in(dir).empty());
}

TEST_CASE("ExpertFiles: read_sections reads and verifies only the sections asked for",
          "[offload][ssd]") {
  test::ScratchDir scratch("ssd-sections");
  const std::vector<LayerRecords> layers{expert_layer(8, 16, 2)};
  const RecordLayout& layout = layers[0].layout;
  ExpertFiles files(scratch.path(), layers);
  // The caller's padding holds noise: it is written, and read back, as zeros.
  const std::vector<unsigned char> noisy = random_bytes(layout.payload_bytes, 11);
  const std::vector<unsigned char> expected = random_record(layout, 11);
  REQUIRE(noisy != expected);
  files.write(0, 0, noisy.data());
  std::vector<unsigned char> back(noisy.size(), 0xCD);
  files.read(0, 0, back.data());
  CHECK(back == expected);

  // Bytes in [begin, end) equal the record, all others still hold the 0xCD of before the read.
  const auto only = [&](int64_t begin, int64_t end) {
    int64_t wrong = 0;
    for (int64_t i = 0; i < layout.payload_bytes; ++i)
      wrong += (i >= begin && i < end) ? back[i] != expected[i] : back[i] != 0xCD;
    return wrong;
  };
  const RecordSection& w2 = layout.section("w2.value");
  std::fill(back.begin(), back.end(), 0xCD);
  files.read_sections(0, 0, layout.index("w2.value"), layout.index("w2.value") + 1, back.data());
  CHECK(only(w2.offset, w2.offset + w2.bytes) == 0);
  // b1's five sections, with the padding after the bf16 value inside their span.
  const int b1 = layout.index("b1.value");
  const RecordSection& b1_grad = layout.sections[b1 + 4];
  REQUIRE(b1_grad.name == "b1.grad");
  std::fill(back.begin(), back.end(), 0xCD);
  files.read_sections(0, 0, b1, b1 + 5, back.data());
  CHECK(only(layout.sections[b1].offset, b1_grad.offset + b1_grad.bytes) == 0);
  CHECK(files.bytes_read() == layout.payload_bytes + w2.bytes +
                                  (b1_grad.offset + b1_grad.bytes - layout.sections[b1].offset));
  CHECK(files.reads() == 3);

  // A damaged section fails the reads that include it, naming it; the others still read.
  const std::string path = files.path(0, 0);
  const int64_t damaged = ExpertFiles::kHeaderBytes + layout.section("w2.adam_m").offset + 1;
  flip_byte(path, damaged);
  files.read_sections(0, 0, layout.index("w2.value"), layout.index("w2.value") + 1, back.data());
  const int adam_m = layout.index("w2.adam_m");
  CHECK_THAT(test::error_of([&] { files.read_sections(0, 0, adam_m, adam_m + 1, back.data()); }),
             Catch::Contains("section 'w2.adam_m' checksum mismatch"));
  CHECK_THAT(test::error_of([&] { files.read(0, 0, back.data()); }),
             Catch::Contains("section 'w2.adam_m' checksum mismatch"));
  flip_byte(path, damaged);  // repaired
  files.read(0, 0, back.data());
  CHECK(back == expected);

  // Ranges that are empty or leave the layout.
  const int sections = static_cast<int>(layout.sections.size());
  CHECK_THROWS_AS(files.read_sections(0, 0, 2, 2, back.data()), UsageError);
  CHECK_THAT(test::error_of([&] { files.read_sections(0, 0, 5, sections + 1, back.data()); }),
             Catch::Contains(str("the layout has sections [0, ", sections, ")")));
}

TEST_CASE("ExpertFiles: write_prefix writes the first sections, the rest keep the last write's",
          "[offload][ssd]") {
  test::ScratchDir scratch("ssd-prefix");
  const std::vector<LayerRecords> layers{expert_layer(8, 16, 2)};
  const RecordLayout& layout = layers[0].layout;
  const int sections = static_cast<int>(layout.sections.size());
  const int end = layout.index("w2.value");          // w1's and b1's five sections each
  const int64_t span = layout.sections[end].offset;  // padding before w2.value included
  ExpertFiles files(scratch.path(), layers);

  // Before any whole write there is nothing to keep: the whole record is written.
  const std::vector<unsigned char> first = random_record(layout, 21);
  files.write_prefix(0, 0, end, first.data());
  CHECK(files.bytes_written() == layout.payload_bytes);
  std::vector<unsigned char> back(first.size(), 0);
  files.read(0, 0, back.data());
  CHECK(back == first);

  // Now only [0, span) moves; the file's other sections are the first write's, and still verify
  // (whole reads, and reads of the tail alone).
  const std::vector<unsigned char> second = random_record(layout, 22);
  files.write_prefix(0, 0, end, second.data());
  CHECK(files.bytes_written() == layout.payload_bytes + span);
  std::vector<unsigned char> expected = first;
  std::copy_n(second.begin(), span, expected.begin());
  REQUIRE(expected != first);
  REQUIRE(expected != second);
  files.read(0, 0, back.data());
  CHECK(back == expected);
  std::fill(back.begin(), back.end(), 0);
  files.read_sections(0, 0, end, sections, back.data());
  CHECK(std::equal(back.begin() + span, back.end(), first.begin() + span));
  CHECK(std::all_of(back.begin(), back.begin() + span, [](unsigned char b) { return b == 0; }));
  // A whole write after it replaces everything; -1 is the whole record too.
  files.write_prefix(0, 0, -1, second.data());
  files.read(0, 0, back.data());
  CHECK(back == second);

  // A damaged byte of the kept tail is still found.
  files.write_prefix(0, 0, end, first.data());
  const int64_t tail_byte = ExpertFiles::kHeaderBytes + layout.section("w2.grad").offset + 3;
  flip_byte(files.path(0, 0), tail_byte);
  CHECK_THAT(test::error_of([&] { files.read(0, 0, back.data()); }),
             Catch::Contains("section 'w2.grad' checksum mismatch"));
  // After a failed read the next prefix write still keeps (and checks) the old tail's checksum.
  flip_byte(files.path(0, 0), tail_byte);
  files.read(0, 0, back.data());

  // Ranges that leave the layout or are empty.
  CHECK_THAT(test::error_of([&] { files.write_prefix(0, 1, 0, first.data()); }),
             Catch::Contains(str("the layout has sections [0, ", sections, ")")));
  CHECK_THROWS_AS(files.write_prefix(0, 1, sections + 1, first.data()), UsageError);
}

TEST_CASE("ExpertFiles: read_sections refuses a span that holds another section",
          "[offload][ssd][errors]") {
  test::ScratchDir scratch("ssd-span");
  // Sections out of offset order: a at 128, b at 0, c at 64 (c lies between b and a).
  RecordLayout layout;
  layout.sections = {{"a", DType::f32, {16}, 128, 64},
                     {"b", DType::f32, {16}, 0, 64},
                     {"c", DType::f32, {16}, 64, 64}};
  layout.payload_bytes = 192;
  ExpertFiles files(scratch.path(), {{layout, 1}});
  const std::vector<unsigned char> payload = random_record(layout, 12);
  files.write(0, 0, payload.data());
  std::vector<unsigned char> back(payload.size(), 0);
  CHECK_THAT(test::error_of([&] { files.read_sections(0, 0, 0, 2, back.data()); }),
             Catch::Contains("section 'c' lies between them"));
  files.read_sections(0, 0, 1, 3, back.data());  // b and c: adjacent
  CHECK(std::equal(back.begin(), back.begin() + 128, payload.begin()));
  files.read(0, 0, back.data());
  CHECK(back == payload);
}

namespace {

// A buffer at a 4096-byte boundary (what O_DIRECT reads need), `bytes` long.
struct AlignedBuffer {
  explicit AlignedBuffer(int64_t n)
      : bytes(static_cast<size_t>(n)),
        data(static_cast<unsigned char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)),
             &std::free) {
    REQUIRE(data != nullptr);
  }
  std::vector<unsigned char> copy() const { return {data.get(), data.get() + bytes}; }
  size_t bytes;
  std::unique_ptr<unsigned char, decltype(&std::free)> data;
};

}  // namespace

TEST_CASE("ExpertFiles: direct reads give the same bytes and the same refusals", "[offload][ssd]") {
  test::ScratchDir scratch("ssd-direct");
  // A payload of whole 4096-byte blocks, and one with a partial last block.
  const std::vector<LayerRecords> layers{{RecordLayout::packed({{"w", DType::f32, {2048}}}), 2},
                                         expert_layer(8, 16, 2)};
  REQUIRE(layers[0].layout.payload_bytes % 4096 == 0);
  REQUIRE(layers[1].layout.payload_bytes % 4096 != 0);
  ExpertFiles files(scratch.path(), layers, {/*direct_reads=*/true});
  std::vector<std::vector<unsigned char>> records;
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 2; ++e) {
      records.push_back(random_record(layers[l].layout, static_cast<uint32_t>(20 + 2 * l + e)));
      files.write(l, e, records.back().data());
    }
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 2; ++e) {
      AlignedBuffer back(layers[l].layout.payload_bytes);
      std::memset(back.data.get(), 0xCD, back.bytes);
      files.read(l, e, back.data.get());
      CHECK(back.copy() == records[static_cast<size_t>(2 * l + e)]);
    }
  if (files.direct_reads() == 0) {
    WARN("the file system of " << scratch.path() << " refuses O_DIRECT: only the fallback ran");
  } else {
    CHECK(files.direct_reads() == 4);
  }
  const int64_t direct_before = files.direct_reads();
  // An unaligned buffer and a partial read go through the page cache.
  std::vector<unsigned char> unaligned(static_cast<size_t>(layers[1].layout.payload_bytes) + 1);
  files.read(1, 1, unaligned.data() + 1);
  CHECK(std::equal(records[3].begin(), records[3].end(), unaligned.begin() + 1));
  AlignedBuffer back(layers[1].layout.payload_bytes);
  files.read_sections(1, 1, 0, 1, back.data.get());
  CHECK(files.direct_reads() == direct_before);

  // Damage written through the page cache is what a direct read sees.
  const int64_t offset = ExpertFiles::kHeaderBytes + layers[1].layout.section("w2.grad").offset + 2;
  flip_byte(files.path(1, 0), offset);
  CHECK_THAT(test::error_of([&] { files.read(1, 0, back.data.get()); }),
             Catch::Contains("(layer 1, expert 0)") &&
                 Catch::Contains("section 'w2.grad' checksum mismatch"));
  const int64_t size = ExpertFiles::file_bytes(layers[1].layout);
  fs::resize_file(files.path(1, 0), static_cast<uintmax_t>(size - 1));
  // A short direct read is read again through the page cache, which names the end of the file.
  const int64_t direct_then = files.direct_reads();
  CHECK_THAT(test::error_of([&] { files.read(1, 0, back.data.get()); }),
             Catch::Contains(str("truncated (it ends at byte ", size - 1, " of ", size, ")")));
  fs::resize_file(files.path(0, 0), 4096 + 100);
  AlignedBuffer whole_blocks(layers[0].layout.payload_bytes);
  CHECK_THAT(test::error_of([&] { files.read(0, 0, whole_blocks.data.get()); }),
             Catch::Contains(str("truncated (it ends at byte ", 4096 + 100)));
  CHECK(files.direct_reads() == direct_then);
}

TEST_CASE("ExpertFiles: threads writing and reading different experts at once", "[offload][ssd]") {
  test::ScratchDir scratch("ssd-threads");
  const std::vector<LayerRecords> layers{expert_layer(32, 96, 8), expert_layer(16, 48, 8)};
  ExpertFiles files(scratch.path(), layers);
  constexpr int kThreads = 4, kRounds = 5;
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        // Thread t owns experts t and t + 4 of both layers.
        for (int round = 0; round < kRounds; ++round) {
          for (int l = 0; l < 2; ++l) {
            for (int e : {t, t + kThreads}) {
              const auto seed = static_cast<uint32_t>(1000 * round + 100 * l + e);
              const std::vector<unsigned char> payload = random_record(layers[l].layout, seed);
              files.write(l, e, payload.data());
              std::vector<unsigned char> back(payload.size());
              files.read(l, e, back.data());
              if (back != payload)
                failures[t] += str("layer ", l, " expert ", e, " round ", round, "; ");
            }
          }
        }
      } catch (const std::exception& e) {
        failures[t] += e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) CHECK(failures[t] == "");
  CHECK(files.writes() == kThreads * kRounds * 4);
  CHECK(files.reads() == kThreads * kRounds * 4);
}

TEST_CASE("ExpertFiles: --ssd-dir that is not a writable directory", "[offload][ssd][errors]") {
  test::ScratchDir scratch("ssd-bad-dir");
  const std::vector<LayerRecords> layers{expert_layer(4, 8, 2)};
  const std::string file = scratch / "a-file";
  test::write_file(file, "not a directory");

  SECTION("a regular file") {
    const std::string message = test::error_of([&] { ExpertFiles files(file, layers); });
    CHECK_THAT(message, Catch::Contains("--ssd-dir '" + file + "' is not a directory"));
  }
  SECTION("a path under a regular file (ENOTDIR)") {
    const std::string under = file + "/ssd";
    const std::string message = test::error_of([&] { ExpertFiles files(under, layers); });
    CHECK_THAT(message, Catch::Contains("--ssd-dir '" + under + "': cannot create it") &&
                            Catch::Contains("writable directory"));
  }
  SECTION("a directory where nobody can create files, not even root (/proc)") {
    const std::string message = test::error_of([&] { ExpertFiles files("/proc", layers); });
    CHECK_THAT(message, Catch::Contains("--ssd-dir '/proc' is not writable") &&
                            Catch::Contains("cannot create a run directory"));
  }
  SECTION("an empty name, no layers, a layer without experts") {
    CHECK_THROWS_AS(ExpertFiles("", layers), UsageError);
    CHECK_THROWS_AS(ExpertFiles(scratch.path(), {}), UsageError);
    CHECK_THAT(test::error_of([&] { ExpertFiles files(scratch.path(), {expert_layer(4, 8, 0)}); }),
               Catch::Contains("layer 0: 0 experts"));
    std::vector<RecordSection> many;
    for (int i = 0; i < ExpertFileHeader::kMaxSections + 1; ++i)
      many.push_back({str("s", i), DType::f32, {1}});
    CHECK_THAT(test::error_of([&] {
                 ExpertFiles files(scratch.path(), {{RecordLayout::packed(many), 1}});
               }),
               Catch::Contains("257 record sections, at most 256"));
    CHECK(runs_in(scratch.path()).empty());
  }
}

TEST_CASE("ExpertFiles: a file system too small is refused before any file is made",
          "[offload][ssd][errors]") {
  test::ScratchDir scratch("ssd-full");
  // 1024 experts of 1 TiB each: more than any test machine's disk.
  const LayerRecords huge{RecordLayout::packed({{"w", DType::u8, {int64_t{1} << 40}}}), 1024};
  const std::string message = test::error_of([&] { ExpertFiles files(scratch.path(), {huge}); });
  CHECK_THAT(message, Catch::Contains("--ssd-dir '" + scratch.path() + "'") &&
                          Catch::Contains("needs 1125899911036928 bytes") &&
                          Catch::Contains("free") && Catch::Contains("free space there"));
  CHECK(runs_in(scratch.path()).empty());
}

TEST_CASE("ExpertFiles: every file's space is reserved up front, or not when asked",
          "[offload][ssd]") {
  test::ScratchDir scratch("ssd-reserve");
  const std::vector<LayerRecords> layers{expert_layer(8, 16, 3), expert_layer(4, 8, 2)};
  {
    ExpertFiles files(scratch.path(), layers);
    for (int l = 0; l < 2; ++l)
      for (int e = 0; e < layers[l].experts; ++e) {
        const std::string path = files.path(l, e);
        struct stat info {};
        REQUIRE(::stat(path.c_str(), &info) == 0);
        CHECK(info.st_size == ExpertFiles::file_bytes(layers[l].layout));
        // Allocated, not a sparse file (where the file system can allocate ahead).
        CHECK(static_cast<int64_t>(info.st_blocks) * 512 >= info.st_size);
        CHECK_FALSE(files.written(l, e));  // reserved is not written
      }
    std::vector<unsigned char> back(static_cast<size_t>(layers[0].layout.payload_bytes));
    CHECK_THAT(test::error_of([&] { files.read(0, 0, back.data()); }),
               Catch::Contains("never written"));
  }
  ExpertFiles lazy(scratch.path(), layers, {.direct_reads = false, .reserve_space = false});
  CHECK_FALSE(fs::exists(lazy.path(0, 0)));
  CHECK(fs::is_directory(lazy.run_directory() + "/layer-0001"));

  // A reservation that fails is refused with the bytes, and leaves nothing behind. Past the
  // file-size limit fallocate fails (EFBIG) as it would on a full disk (ENOSPC).
  const LayerRecords big{RecordLayout::packed({{"w", DType::u8, {1 << 20}}}), 2};
  std::string message;
  {
    struct rlimit before {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &before) == 0);
    struct rlimit lowered = before;
    lowered.rlim_cur = 1 << 19;
    void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lowered) == 0);
    message = test::error_of([&] { ExpertFiles files(scratch / "big", {big}); });
    ::setrlimit(RLIMIT_FSIZE, &before);
    std::signal(SIGXFSZ, old_handler);
  }
  CHECK_THAT(message, Catch::Contains("--ssd-dir '" + (scratch / "big") + "'") &&
                          Catch::Contains("cannot reserve the SSD expert tier's") &&
                          Catch::Contains(std::strerror(EFBIG)) &&
                          Catch::Contains("layer-0000/expert-00000.bin"));
  CHECK(runs_in(scratch / "big").empty());
}

TEST_CASE("ExpertFiles: a write that fails with ENOSPC mid-run (/dev/full)",
          "[offload][ssd][errors]") {
  test::ScratchDir scratch("ssd-enospc");
  const std::vector<LayerRecords> layers{expert_layer(8, 16, 3)};
  ExpertFiles files(scratch.path(), layers);
  const std::vector<unsigned char> payload = random_record(layers[0].layout, 3);
  files.write(0, 1, payload.data());
  // The expert's file becomes a link to /dev/full, where every write fails with ENOSPC.
  fs::remove(files.path(0, 1));
  fs::create_symlink("/dev/full", files.path(0, 1));
  const std::string message = test::error_of([&] { files.write(0, 1, payload.data()); });
  CHECK_THAT(message, Catch::Contains("cannot write SSD expert file '" + files.path(0, 1) +
                                      "' (layer 0, expert 1)") &&
                          Catch::Contains(std::strerror(ENOSPC)) &&
                          Catch::Contains("--ssd-dir is full"));
  CHECK_FALSE(files.written(0, 1));
  std::vector<unsigned char> back(payload.size());
  CHECK_THAT(test::error_of([&] { files.read(0, 1, back.data()); }),
             Catch::Contains("(layer 0, expert 1)") && Catch::Contains("its last write failed"));
  // Room again: the next write makes a valid copy.
  fs::remove(files.path(0, 1));
  files.write(0, 1, payload.data());
  files.read(0, 1, back.data());
  CHECK(back == payload);
  CHECK_THAT(test::error_of([&] { files.read(0, 2, back.data()); }),
             Catch::Contains("(layer 0, expert 2)") && Catch::Contains("never written"));
}

TEST_CASE("ExpertFiles: a short write is resumed, and the error after it reported (RLIMIT_FSIZE)",
          "[offload][ssd][errors]") {
  test::ScratchDir scratch("ssd-short");
  const std::vector<LayerRecords> layers{expert_layer(8, 16, 1)};
  ExpertFiles files(scratch.path(), layers);
  const std::vector<unsigned char> payload = random_record(layers[0].layout, 4);
  const int64_t limit = ExpertFiles::kHeaderBytes + 1000;
  std::string message;
  {
    // Past the file-size limit the kernel writes what fits (a short write), then fails the next
    // write with EFBIG; SIGXFSZ, which would end the process, is ignored meanwhile.
    struct rlimit before {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &before) == 0);
    struct rlimit lowered = before;
    lowered.rlim_cur = static_cast<rlim_t>(limit);
    void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lowered) == 0);
    message = test::error_of([&] { files.write(0, 0, payload.data()); });
    ::setrlimit(RLIMIT_FSIZE, &before);
    std::signal(SIGXFSZ, old_handler);
  }
  // "after <limit>": the first, short write was resumed, and the second one's error reported.
  CHECK_THAT(message,
             Catch::Contains("cannot write SSD expert file") &&
                 Catch::Contains(std::strerror(EFBIG)) &&
                 Catch::Contains(str("after ", limit, " of ",
                                     ExpertFiles::file_bytes(layers[0].layout), " bytes")));
  CHECK_FALSE(files.written(0, 0));
  files.write(0, 0, payload.data());
  std::vector<unsigned char> back(payload.size());
  files.read(0, 0, back.data());
  CHECK(back == payload);
}

TEST_CASE("ExpertFiles: damaged, truncated, missing, stale and foreign files are refused",
          "[offload][ssd][errors]") {
  test::ScratchDir scratch("ssd-damage");
  const std::vector<LayerRecords> layers{expert_layer(8, 16, 3)};
  ExpertFiles files(scratch / "a", layers);
  const int64_t payload_bytes = layers[0].layout.payload_bytes;
  const std::vector<unsigned char> payload = random_record(layers[0].layout, 5);
  for (int e = 0; e < 3; ++e) files.write(0, e, payload.data());
  const std::string path = files.path(0, 1);
  const std::vector<unsigned char> good = file_bytes(path);
  std::vector<unsigned char> back(static_cast<size_t>(payload_bytes));
  const auto refusal = [&] { return test::error_of([&] { files.read(0, 1, back.data()); }); };
  const std::string where = "SSD expert file '" + path + "' (layer 0, expert 1)";

  SECTION("one payload byte flipped") {
    flip_byte(path, ExpertFiles::kHeaderBytes + layers[0].layout.section("w2.adam_m").offset + 5);
    CHECK_THAT(refusal(), Catch::Contains(where) &&
                              Catch::Contains("section 'w2.adam_m' checksum mismatch") &&
                              Catch::Contains("restart from the last checkpoint"));
  }
  SECTION("one padding byte flipped (written as zeros)") {
    const RecordSection& b1 = layers[0].layout.section("b1.value");
    REQUIRE(layers[0].layout.sections[6].offset > b1.offset + b1.bytes);  // padding after b1.value
    flip_byte(path, ExpertFiles::kHeaderBytes + b1.offset + b1.bytes + 3);
    CHECK_THAT(refusal(), Catch::Contains(where) &&
                              Catch::Contains(str("padding bytes [", b1.offset + b1.bytes)) &&
                              Catch::Contains("are not zero"));
  }
  SECTION("one byte of the section checksum table flipped") {
    flip_byte(path, sizeof(ExpertFileHeader) + 4 * 7 + 2);
    CHECK_THAT(refusal(), Catch::Contains(where) && Catch::Contains("header is damaged"));
  }
  SECTION("one header byte flipped") {
    flip_byte(path, offsetof(ExpertFileHeader, expert));
    CHECK_THAT(refusal(), Catch::Contains(where) && Catch::Contains("header is damaged"));
  }
  SECTION("one byte of the header block's zeros flipped") {
    // Issue 45: the header checksum covers the header and the section table; the zeros after them
    // up to the payload (most of the 4096-byte block) went unchecked, so a bit flip at a random
    // header offset was almost never detected.
    for (const int64_t offset :
         {int64_t(sizeof(ExpertFileHeader) + 4 * layers[0].layout.sections.size()), int64_t(2000),
          ExpertFiles::kHeaderBytes - 1}) {
      INFO(offset);
      flip_byte(path, offset);
      CHECK_THAT(refusal(), Catch::Contains(where) && Catch::Contains("header is damaged"));
      flip_byte(path, offset);  // back
      files.read(0, 1, back.data());
    }
  }
  SECTION("the magic damaged") {
    flip_byte(path, 0);
    CHECK_THAT(refusal(), Catch::Contains("not an SSD expert file"));
  }
  SECTION("truncated, in the payload and in the header") {
    fs::resize_file(path, static_cast<uintmax_t>(ExpertFiles::kHeaderBytes + payload_bytes - 1));
    CHECK_THAT(refusal(),
               Catch::Contains(where) && Catch::Contains("truncated") &&
                   Catch::Contains(str(ExpertFiles::file_bytes(layers[0].layout) - 1, " of ",
                                       ExpertFiles::file_bytes(layers[0].layout))));
    fs::resize_file(path, 20);
    CHECK_THAT(refusal(), Catch::Contains("not an SSD expert file (only 20 bytes)"));
  }
  SECTION("missing") {
    fs::remove(path);
    CHECK_THAT(refusal(), Catch::Contains(where) && Catch::Contains("the file is missing"));
  }
  SECTION("another format version") {
    std::vector<unsigned char> bytes = good;
    ExpertFileHeader header;
    std::memcpy(&header, bytes.data(), sizeof header);
    header.version = 2;
    header.header_crc = 0;
    header.header_crc = crc32c(bytes.data() + sizeof header, 4 * header.sections,
                               crc32c(&header, sizeof header));  // well-formed, of version 2
    std::memcpy(bytes.data(), &header, sizeof header);
    put_file_bytes(path, bytes);
    CHECK_THAT(refusal(), Catch::Contains(where) && Catch::Contains("format version 2") &&
                              Catch::Contains("reads version 1"));
  }
  SECTION("another expert's file") {
    fs::copy_file(files.path(0, 2), path, fs::copy_options::overwrite_existing);
    CHECK_THAT(refusal(), Catch::Contains(where) && Catch::Contains("holds layer 0 expert 2"));
  }
  SECTION("a stale copy (an earlier write of the same expert)") {
    const std::vector<unsigned char> newer = random_record(layers[0].layout, 6);
    files.write(0, 1, newer.data());
    put_file_bytes(path, good);
    CHECK_THAT(refusal(), Catch::Contains(where) && Catch::Contains("holds write 1") &&
                              Catch::Contains("last write was 2"));
  }
  SECTION("another run's file of the same layout") {
    ExpertFiles other(scratch / "b", layers);
    other.write(0, 1, payload.data());
    fs::copy_file(other.path(0, 1), path, fs::copy_options::overwrite_existing);
    CHECK_THAT(refusal(), Catch::Contains(where) && Catch::Contains("written by another run"));
  }
  SECTION("another model's file (another layout)") {
    const std::vector<LayerRecords> wider{expert_layer(8, 32, 3)};
    ExpertFiles other(scratch / "b", wider);
    const std::vector<unsigned char> other_payload = random_record(wider[0].layout, 7);
    other.write(0, 1, other_payload.data());
    fs::copy_file(other.path(0, 1), path, fs::copy_options::overwrite_existing);
    CHECK_THAT(refusal(), Catch::Contains(where) && Catch::Contains("another record layout"));
    // Same size, another dtype: only the hash tells them apart.
    const std::vector<LayerRecords> f16{expert_layer(8, 16, 3, DType::f16)};
    REQUIRE(f16[0].layout.payload_bytes == payload_bytes);
    ExpertFiles third(scratch / "c", f16);
    third.write(0, 1, payload.data());
    fs::copy_file(third.path(0, 1), path, fs::copy_options::overwrite_existing);
    CHECK_THAT(refusal(), Catch::Contains("another record layout"));
  }
  // The other experts were never touched and still read back.
  files.read(0, 0, back.data());
  CHECK(back == payload);
}

TEST_CASE("ExpertFiles: two operations on one expert at once are refused",
          "[offload][ssd][errors]") {
  test::ScratchDir scratch("ssd-busy");
  const std::vector<LayerRecords> layers{expert_layer(4, 8, 2)};
  ExpertFiles files(scratch.path(), layers);
  const std::vector<unsigned char> payload = random_record(layers[0].layout, 9);
  std::vector<unsigned char> back(payload.size());
  // The expert's file is a FIFO: a write blocks in open() until a reader comes, holding the
  // expert, so the second operation meets it deterministically.
  fs::remove(files.path(0, 0));  // the reserved file
  REQUIRE(::mkfifo(files.path(0, 0).c_str(), 0600) == 0);
  std::string blocked_write, second;
  std::thread writer;
  std::atomic<bool> writer_done{false};  // outlives the writer: joined below
  // A probing read holds the expert for a moment too: when it does so just as the writer starts,
  // the writer is the one refused and returns at once. Then start over (a slow machine, a
  // sanitizer build); otherwise probe until the writer holds the expert (<= 20 s).
  for (int round = 0; round < 20; ++round) {
    writer_done = false;
    blocked_write.clear();
    writer = std::thread([&] {
      blocked_write = test::error_of([&] { files.write(0, 0, payload.data()); });
      writer_done = true;
    });
    for (int attempt = 0; attempt < 2000 && !writer_done; ++attempt) {
      second = test::error_of([&] { files.read(0, 0, back.data()); });
      if (second.find("in progress") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (second.find("in progress") != std::string::npos) break;
    writer.join();  // refused by a probe: nothing blocks it
  }
  CHECK_THAT(second, Catch::Contains("(layer 0, expert 0)") &&
                         Catch::Contains("read while another read or write of the same expert"));
  // The other expert is free meanwhile.
  files.write(0, 1, payload.data());
  const int reader = ::open(files.path(0, 0).c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(reader >= 0);
  if (writer.joinable()) writer.join();
  ::close(reader);
  // A FIFO cannot be written at an offset: the blocked write fails with its cause.
  CHECK_THAT(blocked_write, Catch::Contains("cannot write SSD expert file") &&
                                Catch::Contains(std::strerror(ESPIPE)));
  CHECK_FALSE(files.written(0, 0));
  files.read(0, 1, back.data());
  CHECK(back == payload);
}

TEST_CASE("ExpertFiles: a run directory removed under the run is named in the errors",
          "[offload][ssd][errors]") {
  test::ScratchDir scratch("ssd-removed");
  const std::vector<LayerRecords> layers{expert_layer(4, 8, 2)};
  ExpertFiles files(scratch.path(), layers);
  const std::vector<unsigned char> payload = random_record(layers[0].layout, 8);
  files.write(0, 0, payload.data());
  fs::remove_all(files.run_directory() + "/layer-0000");  // a cleanup that went too far
  std::vector<unsigned char> back(payload.size());
  CHECK_THAT(test::error_of([&] { files.read(0, 0, back.data()); }),
             Catch::Contains("(layer 0, expert 0)") && Catch::Contains("the file is missing"));
  CHECK_THAT(test::error_of([&] { files.write(0, 1, payload.data()); }),
             Catch::Contains("cannot write SSD expert file '" + files.path(0, 1) + "'") &&
                 Catch::Contains("its directory was removed while the run used it"));
}

TEST_CASE("ExpertFiles: indices out of range are refused", "[offload][ssd][errors]") {
  test::ScratchDir scratch("ssd-range");
  ExpertFiles files(scratch.path(), {expert_layer(4, 8, 2)});
  std::vector<unsigned char> buffer(static_cast<size_t>(files.layer(0).layout.payload_bytes));
  CHECK_THAT(test::error_of([&] { files.write(1, 0, buffer.data()); }),
             Catch::Contains("layer 1 out of range [0, 1)"));
  CHECK_THAT(test::error_of([&] { files.read(0, 2, buffer.data()); }),
             Catch::Contains("expert 2 of layer 0 out of range [0, 2)"));
  CHECK_THAT(test::error_of([&] { files.write(0, -1, buffer.data()); }),
             Catch::Contains("expert -1 of layer 0 out of range"));
}

TEST_CASE("ExpertFiles: runs sharing an --ssd-dir stay apart, a crashed run's files are removed",
          "[offload][ssd]") {
  test::ScratchDir scratch("ssd-runs");
  const std::vector<LayerRecords> layers{expert_layer(4, 8, 2)};
  // A crashed run: its lock file exists but no process holds it.
  const std::string crashed = scratch / "moe-ssd-999999-abcdef";
  fs::create_directories(crashed + "/layer-0000");
  test::write_file(crashed + "/lock", "");
  test::write_file(crashed + "/layer-0000/expert-00000.bin", "old bytes");
  // A run still being set up (no `lock` yet), and a directory that is not ours.
  const std::string starting = scratch / "moe-ssd-999998-ghijkl";
  fs::create_directories(starting);
  const std::string foreign = scratch / "user-data";
  fs::create_directories(foreign);
  // A live run: another open file holds its lock.
  const std::string live = scratch / "moe-ssd-999997-mnopqr";
  fs::create_directories(live);
  test::write_file(live + "/lock", "");
  const int live_lock = ::open((live + "/lock").c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(live_lock >= 0);
  REQUIRE(::flock(live_lock, LOCK_EX) == 0);

  {
    ExpertFiles first(scratch.path(), layers);
    CHECK_FALSE(fs::exists(crashed));
    CHECK(fs::exists(starting));
    CHECK(fs::exists(foreign));
    CHECK(fs::exists(live));
    ExpertFiles second(scratch.path(), layers);  // the first is alive: its directory stays
    CHECK(fs::exists(first.run_directory()));
    CHECK(first.run_directory() != second.run_directory());
    const std::vector<unsigned char> a = random_record(layers[0].layout, 1);
    const std::vector<unsigned char> b = random_record(layers[0].layout, 2);
    first.write(0, 0, a.data());
    second.write(0, 0, b.data());
    std::vector<unsigned char> back(a.size());
    first.read(0, 0, back.data());
    CHECK(back == a);
    second.read(0, 0, back.data());
    CHECK(back == b);
  }
  ::close(live_lock);
  CHECK(runs_in(scratch.path()).size() == 2);  // `starting` and `live` (now unlocked)
}
