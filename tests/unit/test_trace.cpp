// Routing traces: round trips across chunk boundaries with unequal experts per layer (PR-MoE),
// row-range reads, empty traces, in-memory images ("-"), atomic writes, refused batches, and
// reader errors for missing, foreign, checkpoint, truncated, wrong-version and inconsistent files.
// Shape letters: N tokens, L MoE layers, k top-k, E experts of a layer, Emax max E, B batches.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/io/hdf5.h"
#include "moe/io/trace.h"
#include "support/run.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

io::TraceInfo make_info() {
  io::TraceInfo info;
  info.model_config = {{"arch", "gpt"},
                       {"layers", 6},
                       {"experts_per_layer", {0, 8, 0, 4, 0, 6}},
                       {"top_k", 2},
                       {"name", "m\xc3\xbcnchen"}};
  info.provenance = {"moe-profile", "0.1.0", "abc123def456", "moe-profile record --out 'a b.h5'",
                     "2024-05-01T12:34:56Z"};
  info.top_k = 2;
  info.moe_blocks = {1, 3, 5};
  info.experts = {8, 4, 6};  // PR-MoE-like: layers differ, Emax = 8
  info.source = "record";
  return info;
}

// A batch of n tokens whose every value depends on (seed, position), with consistent loads.
io::TraceBatch make_batch(const io::TraceInfo& info, int64_t n, int64_t seed, int64_t step) {
  const int64_t L = info.layers(), k = info.top_k, Emax = info.max_experts();
  io::TraceBatch b;
  b.step = step;
  b.loads.assign(static_cast<size_t>(L * Emax), 0);
  for (int64_t t = 0; t < n; ++t) {
    b.token_ids.push_back(static_cast<int32_t>((seed * 1000 + t * 37) % 50257));
    for (int64_t l = 0; l < L; ++l) {
      const int64_t E = info.experts[static_cast<size_t>(l)];
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = (t * 5 + l * 3 + j * 7 + seed) % E;
        b.experts.push_back(static_cast<int32_t>(e));
        b.gates.push_back(1.0f / static_cast<float>(1 + t + 2 * l + 3 * j + seed));
        b.loads[static_cast<size_t>(l * Emax + e)] += 1;
      }
    }
  }
  for (int64_t l = 0; l < L; ++l) b.dropped.push_back((seed + l) % 3);
  return b;
}

struct Expected {
  std::vector<int32_t> experts, ids;
  std::vector<float> gates;
  std::vector<int64_t> steps, tokens, loads, dropped;
  void add(const io::TraceBatch& b) {
    experts.insert(experts.end(), b.experts.begin(), b.experts.end());
    gates.insert(gates.end(), b.gates.begin(), b.gates.end());
    ids.insert(ids.end(), b.token_ids.begin(), b.token_ids.end());
    steps.push_back(b.step);
    tokens.push_back(b.tokens());
    loads.insert(loads.end(), b.loads.begin(), b.loads.end());
    dropped.insert(dropped.end(), b.dropped.begin(), b.dropped.end());
  }
};

// Batches of 7, 3, 0, 11 and 4 tokens (25 in all) with chunk_tokens = 5: batches start and end
// inside chunks, and one batch spans three chunks.
std::vector<io::TraceBatch> make_batches(const io::TraceInfo& info) {
  std::vector<io::TraceBatch> batches;
  const int64_t sizes[] = {7, 3, 0, 11, 4};
  for (int64_t i = 0; i < 5; ++i) batches.push_back(make_batch(info, sizes[i], i + 1, 100 + i));
  return batches;
}

Expected write_trace(const std::string& path, const io::TraceInfo& info,
                     const std::vector<io::TraceBatch>& batches, std::FILE* image_out = stdout) {
  io::TraceWriter writer(path, info, 5, image_out);
  Expected expected;
  for (const io::TraceBatch& b : batches) {
    writer.append(b);
    expected.add(b);
  }
  REQUIRE(writer.tokens() == static_cast<int64_t>(expected.ids.size()));
  REQUIRE(writer.batches() == static_cast<int64_t>(batches.size()));
  writer.close();
  return expected;
}

void require_same_info(const io::TraceInfo& a, const io::TraceInfo& b) {
  REQUIRE(a.model_config == b.model_config);
  REQUIRE(a.provenance.tool == b.provenance.tool);
  REQUIRE(a.provenance.version == b.provenance.version);
  REQUIRE(a.provenance.git == b.provenance.git);
  REQUIRE(a.provenance.argv == b.provenance.argv);
  REQUIRE(a.provenance.time == b.provenance.time);
  REQUIRE(a.top_k == b.top_k);
  REQUIRE(a.moe_blocks == b.moe_blocks);
  REQUIRE(a.experts == b.experts);
  REQUIRE(a.source == b.source);
}

void require_contents(const io::TraceReader& r, const io::TraceInfo& info, const Expected& x,
                      const std::vector<io::TraceBatch>& batches) {
  require_same_info(r.info(), info);
  REQUIRE(r.tokens() == static_cast<int64_t>(x.ids.size()));
  REQUIRE(r.batches() == static_cast<int64_t>(x.steps.size()));
  REQUIRE(r.layers() == info.layers());
  REQUIRE(r.max_experts() == info.max_experts());
  std::vector<int32_t> experts, ids;
  std::vector<float> gates;
  r.read_tokens(0, r.tokens(), experts, &gates, &ids);
  REQUIRE(experts == x.experts);
  REQUIRE(gates == x.gates);  // bitwise: f32 stored as f32
  REQUIRE(ids == x.ids);
  REQUIRE(r.batch_steps() == x.steps);
  REQUIRE(r.batch_tokens() == x.tokens);
  REQUIRE(r.loads() == x.loads);
  REQUIRE(r.dropped() == x.dropped);
  for (size_t b = 0; b < batches.size(); ++b) {
    INFO("batch " << b);
    io::TraceBatch got = r.read_batch(static_cast<int64_t>(b));
    REQUIRE(got.step == batches[b].step);
    REQUIRE(got.token_ids == batches[b].token_ids);
    REQUIRE(got.experts == batches[b].experts);
    REQUIRE(got.gates == batches[b].gates);
    REQUIRE(got.loads == batches[b].loads);
    REQUIRE(got.dropped == batches[b].dropped);
  }
}

size_t count_temp_files(const fs::path& dir) {
  size_t n = 0;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) ++n;
  return n;
}

std::string bytes_of(std::FILE* f) {
  REQUIRE(std::fseek(f, 0, SEEK_SET) == 0);
  std::string bytes;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) bytes.append(buffer, n);
  return bytes;
}

std::vector<hsize_t> chunk_of(hid_t file, const char* dataset, bool* fletcher, bool* deflate) {
  io::h5::Dataset ds(H5Dopen2(file, dataset, H5P_DEFAULT));
  REQUIRE(ds.valid());
  io::h5::Plist dcpl(H5Dget_create_plist(ds));
  std::vector<hsize_t> chunk(8, 0);
  int rank = H5Pget_chunk(dcpl, 8, chunk.data());
  REQUIRE(rank > 0);
  chunk.resize(static_cast<size_t>(rank));
  *fletcher = *deflate = false;
  for (int i = 0; i < H5Pget_nfilters(dcpl); ++i) {
    unsigned flags = 0, config = 0, values[8];
    size_t nelmts = 8;  // in: room in `values`; out: the filter's count
    H5Z_filter_t f = H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nelmts, values, 0,
                                    nullptr, &config);
    REQUIRE(f >= 0);
    *fletcher = *fletcher || f == H5Z_FILTER_FLETCHER32;
    *deflate = *deflate || f == H5Z_FILTER_DEFLATE;
  }
  return chunk;
}

// Opens `path` read-write with the raw API and runs `edit` on it.
template <class F>
void edit_file(const std::string& path, F edit) {
  io::h5::Session session;
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  edit(file);
  REQUIRE(H5Fclose(file) >= 0);
}

void set_extent(hid_t file, const char* dataset, std::vector<hsize_t> dims) {
  hid_t ds = H5Dopen2(file, dataset, H5P_DEFAULT);
  REQUIRE(ds >= 0);
  REQUIRE(H5Dset_extent(ds, dims.data()) >= 0);
  H5Dclose(ds);
}

void require_error_contains(const std::function<void()>& f, std::vector<std::string> needles) {
  std::string msg = test::error_of(f);
  INFO(msg);
  for (const std::string& n : needles) REQUIRE_THAT(msg, Catch::Contains(n));
}

}  // namespace

TEST_CASE("trace: round trip of several batches across chunks, unequal experts per layer",
          "[trace]") {
  test::ScratchDir dir("trace-roundtrip");
  const std::string path = dir.file("trace.h5");
  const io::TraceInfo info = make_info();
  const std::vector<io::TraceBatch> batches = make_batches(info);
  const Expected x = write_trace(path, info, batches);
  REQUIRE(x.ids.size() == 25);
  REQUIRE(count_temp_files(dir.path()) == 0);

  io::TraceReader r(path);
  REQUIRE(r.name() == path);
  require_contents(r, info, x, batches);
  REQUIRE(r.batch_offsets() == std::vector<int64_t>{0, 7, 10, 10, 21, 25});
  // Layer 1 has 4 experts: its loads beyond expert 3 are the zero padding up to Emax = 8.
  std::vector<int64_t> loads = r.loads();
  for (int64_t b = 0; b < r.batches(); ++b)
    for (int64_t e = 4; e < 8; ++e) REQUIRE(loads[static_cast<size_t>((b * 3 + 1) * 8 + e)] == 0);

  // The stored layout: extendible, chunked [5, L, k], Fletcher32 (and deflate), documented types.
  {
    io::h5::Session session;
    io::h5::File file = io::h5::open_file_readonly(path);
    io::h5::Where root{path, "/"};
    REQUIRE(io::h5::read_string_attr(file, "format", root) == "moe.trace");
    REQUIRE(io::h5::read_int_attr(file, "format_version", root) == 1);
    REQUIRE(io::h5::read_string_attr(file, "producer", root) ==
            "moe-profile 0.1.0 (git abc123def456)");
    REQUIRE(io::h5::read_int_attr(file, "top_k", root) == 2);
    REQUIRE(io::h5::read_string_attr(file, "source", root) == "record");
    bool fletcher = false, deflate = false;
    REQUIRE(chunk_of(file, "/tokens/experts", &fletcher, &deflate) ==
            std::vector<hsize_t>{5, 3, 2});
    REQUIRE((fletcher && deflate));
    REQUIRE(chunk_of(file, "/tokens/gates", &fletcher, &deflate) == std::vector<hsize_t>{5, 3, 2});
    REQUIRE(fletcher);
    REQUIRE(chunk_of(file, "/tokens/ids", &fletcher, &deflate) == std::vector<hsize_t>{5});
    REQUIRE(fletcher);
    REQUIRE(chunk_of(file, "/batches/loads", &fletcher, &deflate)[1] == 3);
    REQUIRE(fletcher);
    io::h5::Dataset ds(H5Dopen2(file, "/tokens/experts", H5P_DEFAULT));
    io::h5::Space space(H5Dget_space(ds));
    hsize_t dims[3], maxdims[3];
    REQUIRE(H5Sget_simple_extent_dims(space, dims, maxdims) == 3);
    REQUIRE((dims[0] == 25 && dims[1] == 3 && dims[2] == 2));
    REQUIRE((maxdims[0] == H5S_UNLIMITED && maxdims[1] == 3 && maxdims[2] == 2));
    io::h5::Type type(H5Dget_type(ds));
    REQUIRE(H5Tequal(type, H5T_STD_I32LE) > 0);
  }

  const char* h5dump = "/usr/bin/h5dump";
  if (!fs::exists(h5dump)) {
    FAIL("h5dump is not installed: run scripts/setup (hdf5-tools; the h5dump check cannot run)");
  }
  test::RunResult dump = test::run_command(str(h5dump, " -H -p '", path, "'"));
  INFO(dump.out << dump.err);
  REQUIRE(dump.exit_code == 0);
  for (const char* needle :
       {"ATTRIBUTE \"format\"", "ATTRIBUTE \"model_config\"", "ATTRIBUTE \"top_k\"",
        "GROUP \"layers\"", "DATASET \"moe_blocks\"", "GROUP \"tokens\"", "DATASET \"gates\"",
        "GROUP \"batches\"", "DATASET \"loads\"", "H5S_UNLIMITED", "FLETCHER32", "DEFLATE"})
    REQUIRE_THAT(dump.out, Catch::Contains(needle));
  // A full data dump verifies every chunk's checksum.
  dump = test::run_command(str(h5dump, " -d /tokens/experts -d /batches/loads '", path, "'"));
  REQUIRE(dump.exit_code == 0);
}

TEST_CASE("trace: read_tokens of sub-ranges crossing chunk boundaries", "[trace]") {
  test::ScratchDir dir("trace-ranges");
  const std::string path = dir.file("trace.h5");
  const io::TraceInfo info = make_info();
  const Expected x = write_trace(path, info, make_batches(info));
  io::TraceReader r(path);
  const int64_t cell = info.layers() * info.top_k;
  const int64_t N = r.tokens();
  const std::pair<int64_t, int64_t> ranges[] = {{0, 5},  {3, 8},  {4, 5},   {4, 16}, {5, 10},
                                                {2, 23}, {9, 11}, {24, 25}, {0, 0},  {25, 25}};
  for (auto [begin, end] : ranges) {
    INFO("tokens [" << begin << ", " << end << ")");
    std::vector<int32_t> experts{99}, ids;
    std::vector<float> gates;
    r.read_tokens(begin, end, experts, &gates, &ids);
    REQUIRE(experts ==
            std::vector<int32_t>(x.experts.begin() + begin * cell, x.experts.begin() + end * cell));
    REQUIRE(gates ==
            std::vector<float>(x.gates.begin() + begin * cell, x.gates.begin() + end * cell));
    REQUIRE(ids == std::vector<int32_t>(x.ids.begin() + begin, x.ids.begin() + end));
  }
  // Blocks of 4 tokens streamed in order give back the whole trace.
  std::vector<int32_t> streamed, block;
  for (int64_t t = 0; t < N; t += 4) {
    r.read_tokens(t, std::min(N, t + 4), block);
    streamed.insert(streamed.end(), block.begin(), block.end());
  }
  REQUIRE(streamed == x.experts);

  std::vector<int32_t> out;
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{-1, 2}, {3, 2}, {0, N + 1}, {N + 1, N + 2}})
    require_error_contains([&] { r.read_tokens(begin, end, out); },
                           {path, "not a range of the trace's 25 tokens"});
  require_error_contains([&] { r.read_batch(5); }, {path, "batch 5 out of range"});
}

TEST_CASE("trace: a trace with zero batches is valid", "[trace]") {
  test::ScratchDir dir("trace-empty");
  const std::string path = dir.file("empty.h5");
  const io::TraceInfo info = make_info();
  {
    io::TraceWriter writer(path, info);
    REQUIRE(writer.tokens() == 0);
    writer.close();
    writer.close();  // a second close does nothing
  }
  io::TraceReader r(path);
  require_same_info(r.info(), info);
  REQUIRE(r.tokens() == 0);
  REQUIRE(r.batches() == 0);
  REQUIRE(r.layers() == 3);
  REQUIRE(r.max_experts() == 8);
  std::vector<int32_t> experts{1, 2, 3};
  std::vector<float> gates{1.0f};
  r.read_tokens(0, 0, experts, &gates);
  REQUIRE(experts.empty());
  REQUIRE(gates.empty());
  REQUIRE(r.batch_steps().empty());
  REQUIRE(r.batch_tokens().empty());
  REQUIRE(r.loads().empty());
  REQUIRE(r.dropped().empty());
  REQUIRE(r.batch_offsets() == std::vector<int64_t>{0});
}

TEST_CASE("trace: '-' writes an in-memory file image that from_image reads back", "[trace]") {
  test::ScratchDir dir("trace-image");
  const io::TraceInfo info = make_info();
  const std::vector<io::TraceBatch> batches = make_batches(info);
  const std::string path = dir.file("disk.h5");
  const Expected on_disk = write_trace(path, info, batches);

  std::FILE* image = std::tmpfile();
  REQUIRE(image != nullptr);
  const fs::path cwd = fs::current_path();
  const bool dash_existed = fs::exists(cwd / "-");
  const Expected in_memory = write_trace("-", info, batches, image);
  const std::string bytes = bytes_of(image);
  std::fclose(image);
  REQUIRE(fs::exists(cwd / "-") == dash_existed);  // nothing written to a file named "-"
  REQUIRE(bytes.size() > 8);
  REQUIRE(bytes.compare(0, 8, "\x89HDF\r\n\x1a\n") == 0);

  io::TraceReader from_image = io::TraceReader::from_image(bytes, "image.h5");
  REQUIRE(from_image.name() == "image.h5");
  require_contents(from_image, info, in_memory, batches);
  io::TraceReader from_disk(path);
  require_contents(from_disk, info, on_disk, batches);

  // The image is an ordinary HDF5 file: saved to disk it opens like any trace; two readers of
  // images with the same name stay independent.
  test::write_file(dir.file("image.h5"), bytes);
  io::TraceReader reopened(dir.file("image.h5"));
  require_contents(reopened, info, in_memory, batches);
  io::TraceWriter empty_writer("-", info, 5, image = std::tmpfile());
  empty_writer.close();
  io::TraceReader empty = io::TraceReader::from_image(bytes_of(image), "image.h5");
  std::fclose(image);
  REQUIRE(empty.tokens() == 0);
  REQUIRE(from_image.tokens() == 25);

  // "-" reads standard input to its end (stdin pointed at the image for the while).
  {
    std::fflush(stdin);
    const int saved = ::dup(0);
    REQUIRE(saved >= 0);
    REQUIRE(std::freopen(dir.file("image.h5").c_str(), "rb", stdin) != nullptr);
    std::string msg;
    int64_t tokens = -1;
    try {
      io::TraceReader from_stdin("-");
      tokens = from_stdin.tokens();
      REQUIRE(from_stdin.name() == "-");
      require_contents(from_stdin, info, in_memory, batches);
    } catch (const Error& e) {
      msg = e.what();
    }
    REQUIRE(::dup2(saved, 0) == 0);
    ::close(saved);
    std::clearerr(stdin);
    INFO(msg);
    REQUIRE(tokens == 25);
  }

  // A moved reader keeps working.
  io::TraceReader moved = std::move(from_image);
  REQUIRE(moved.batch_steps() == in_memory.steps);
}

TEST_CASE("trace: writes are atomic and an unclosed writer leaves nothing", "[trace]") {
  test::ScratchDir dir("trace-atomic");
  const std::string path = dir.file("trace.h5");
  const std::string temp = str(path, ".tmp-", ::getpid());
  const io::TraceInfo info = make_info();
  {
    io::TraceWriter writer(path, info, 5);
    writer.append(make_batch(info, 12, 1, 0));
    REQUIRE_FALSE(fs::exists(path));
    REQUIRE(fs::exists(temp));
    writer.close();
    REQUIRE(fs::exists(path));
    REQUIRE_FALSE(fs::exists(temp));
  }
  REQUIRE(count_temp_files(dir.path()) == 0);
  const std::string good = test::read_file(path);

  // Destroyed without close(): the temporary file goes, the existing trace stays byte-identical.
  {
    io::TraceWriter writer(path, info, 5);
    writer.append(make_batch(info, 30, 2, 1));
    REQUIRE(fs::exists(temp));
  }
  REQUIRE(count_temp_files(dir.path()) == 0);
  REQUIRE(test::read_file(path) == good);
  REQUIRE(io::TraceReader(path).tokens() == 12);

  // With no previous file, nothing at all is left behind.
  const std::string fresh = dir.file("fresh.h5");
  { io::TraceWriter writer(fresh, info); }
  REQUIRE_FALSE(fs::exists(fresh));
  REQUIRE(count_temp_files(dir.path()) == 0);

  // A directory that does not exist: a clear error naming the path.
  require_error_contains([&] { io::TraceWriter w(dir.file("no/such/dir/t.h5"), info); },
                         {"no/such/dir/t.h5", "cannot create"});
}

TEST_CASE("trace: bad batches and infos are refused and nothing is appended", "[trace]") {
  test::ScratchDir dir("trace-bad-append");
  const std::string path = dir.file("trace.h5");
  const io::TraceInfo info = make_info();
  io::TraceWriter writer(path, info, 5);
  const io::TraceBatch good = make_batch(info, 6, 3, 7);
  writer.append(good);

  auto refused = [&](const io::TraceBatch& bad, std::vector<std::string> needles) {
    needles.push_back(path);
    require_error_contains([&] { writer.append(bad); }, needles);
    REQUIRE(writer.tokens() == 6);
    REQUIRE(writer.batches() == 1);
  };
  io::TraceBatch b = good;
  b.experts.pop_back();
  refused(b, {"experts has 35 values, expected 36", "[N, L, k]"});
  b = good;
  b.gates.push_back(0.5f);
  refused(b, {"gates has 37 values, expected 36"});
  b = good;
  b.token_ids.push_back(1);  // N = 7 now: experts and gates are too short
  refused(b, {"experts has 36 values, expected 42"});
  b = good;
  b.loads.resize(3 * 6);  // [L, E of some layer] instead of [L, Emax]
  refused(b, {"loads has 18 values, expected 24", "[L, Emax]"});
  b = good;
  b.dropped = {0, 0};
  refused(b, {"dropped has 2 values, expected 3"});
  b = good;
  b.experts[(2 * 3 + 1) * 2 + 1] = 4;  // layer 1 has 4 experts (4 is fine for layers 0 and 2)
  refused(b, {"experts[token 2, layer 1 (block 3), choice 1] = 4 is outside [0, 4)"});
  b = good;
  b.experts[0] = -1;
  refused(b, {"experts[token 0, layer 0 (block 1), choice 0] = -1 is outside [0, 8)"});
  b = good;
  b.loads[1 * 8 + 5] = 2;  // beyond layer 1's 4 experts
  refused(b, {"loads[layer 1, expert 5] = 2", "only 4 experts"});
  b = good;
  b.loads[0] = -3;
  refused(b, {"loads[layer 0, expert 0] = -3 is negative"});
  b = good;
  b.dropped[2] = -1;
  refused(b, {"dropped[layer 2] = -1 is negative"});
  b = good;
  b.token_ids[4] = -5;
  refused(b, {"token_ids[4] = -5 is negative"});
  b = good;
  b.step = -2;
  refused(b, {"step -2 is negative"});

  writer.append(make_batch(info, 2, 4, 8));
  writer.close();
  require_error_contains([&] { writer.append(good); }, {path, "append after close()"});
  io::TraceReader r(path);
  REQUIRE(r.tokens() == 8);
  REQUIRE(r.batch_steps() == std::vector<int64_t>{7, 8});

  // Infos and options the writer refuses, leaving no file.
  auto bad_info = [&](const io::TraceInfo& i, const std::string& cause, int64_t chunk = 4096) {
    const std::string p = dir.file("bad.h5");
    require_error_contains([&] { io::TraceWriter w(p, i, chunk); }, {p, cause});
    REQUIRE_FALSE(fs::exists(p));
    REQUIRE(count_temp_files(dir.path()) == 0);
  };
  io::TraceInfo i = info;
  i.top_k = 5;
  bad_info(i, "top_k 5 exceeds the 4 experts of MoE layer 1 (block 3)");
  i = info;
  i.top_k = 0;
  bad_info(i, "top_k is 0");
  i = info;
  i.moe_blocks = {1, 3};
  bad_info(i, "moe_blocks has 2 entries but experts has 3");
  i = info;
  i.experts.clear();
  i.moe_blocks.clear();
  bad_info(i, "at least one MoE layer");
  i = info;
  i.moe_blocks = {1, 5, 3};
  bad_info(i, "moe_blocks must be increasing");
  i = info;
  i.moe_blocks = {1, 3, 6};  // the model has 6 blocks, 0..5
  bad_info(i, "moe_blocks entry 2 is block 6, beyond the model's 6 layers");
  i = info;
  i.model_config.erase("layers");  // no count given: no model has 2^16 blocks or more
  i.moe_blocks = {1, 3, int64_t(1) << 40};
  bad_info(i, "moe_blocks entry 2 is block 1099511627776, beyond the 65536 layers a model can");
  i = info;
  i.source = "replay";
  bad_info(i, "source is 'replay', expected 'record' or 'train'");
  bad_info(info, "chunk_tokens is 0", 0);
}

TEST_CASE("trace: the reader names the file and the cause of every refusal", "[trace]") {
  test::ScratchDir dir("trace-bad-read");
  const io::TraceInfo info = make_info();
  const std::string good_path = dir.file("good.h5");
  write_trace(good_path, info, make_batches(info));
  const std::string good = test::read_file(good_path);

  auto require_error = [](const std::string& path, std::vector<std::string> needles) {
    needles.push_back(path);
    require_error_contains([&] { io::TraceReader r(path); }, needles);
  };
  require_error(dir.file("nope.h5"), {"no such file"});
  test::write_file(dir.file("empty.h5"), "");
  require_error(dir.file("empty.h5"), {"empty file"});
  test::write_file(dir.file("text.h5"), "routing, but as text\n");
  require_error(dir.file("text.h5"), {"not an HDF5 file"});
  const std::string truncated = dir.file("truncated.h5");
  test::write_file(truncated, good.substr(0, good.size() / 2));
  require_error(truncated, {"truncated"});

  // The same checks for images.
  auto require_image_error = [](const std::string& bytes, const std::string& cause) {
    require_error_contains([&] { io::TraceReader::from_image(bytes, "img"); },
                           {"trace 'img'", cause});
  };
  require_image_error("", "empty file");
  require_image_error("no HDF5 here", "not an HDF5 file");
  require_image_error(good.substr(0, good.size() / 2), "truncated");

  // A checkpoint passed as a trace; a plain HDF5 file; another format string.
  const std::string ckpt = dir.file("ckpt.h5");
  {
    io::Checkpoint c;
    c.model_config = info.model_config;
    Tensor w = Tensor::empty({2, 3}, DType::f32);
    std::memset(w.raw(), 0, w.nbytes());
    c.params.push_back({"embed.tokens", w, false});
    io::save_checkpoint(ckpt, c);
  }
  require_error(ckpt, {"not a moe trace", "moe checkpoint"});
  const std::string plain = dir.file("plain.h5");
  {
    io::h5::Session session;
    io::h5::WriteFile f = io::h5::create_file(plain);
    f.close({plain, "/"});
  }
  require_error(plain, {"not a moe trace (no 'format' attribute)"});
  const std::string other = dir.file("other.h5");
  test::write_file(other, good);
  edit_file(other, [&](hid_t f) { io::h5::write_string_attr(f, "format", "moe.other", {other}); });
  require_error(other, {"not a moe trace (format is 'moe.other', expected 'moe.trace')"});

  // Version 2, rewritten in place with the raw API.
  const std::string v2 = dir.file("v2.h5");
  test::write_file(v2, good);
  edit_file(v2, [](hid_t f) {
    hid_t attr = H5Aopen(f, "format_version", H5P_DEFAULT);
    REQUIRE(attr >= 0);
    int two = 2;
    REQUIRE(H5Awrite(attr, H5T_NATIVE_INT, &two) >= 0);
    H5Aclose(attr);
  });
  require_error(v2, {"trace format version 2, this build reads version 1"});

  // Inconsistent shapes (the token and batch datasets are extendible, so they can be cut).
  auto broken = [&](const char* name, auto edit, std::vector<std::string> needles) {
    const std::string p = dir.file(name);
    test::write_file(p, good);
    edit_file(p, edit);
    require_error(p, needles);
  };
  broken("gates.h5",
         [](hid_t f) {
           set_extent(f, "/tokens/gates", {24, 3, 2});
         },
         {"/tokens/gates", "shape [24, 3, 2], expected [25, 3, 2]"});
  broken("ids.h5", [](hid_t f) { set_extent(f, "/tokens/ids", {30}); },
         {"/tokens/ids", "shape [30], expected [25]"});
  broken("loads.h5",
         [](hid_t f) {
           set_extent(f, "/batches/loads", {4, 3, 8});
         },
         {"/batches/loads", "shape [4, 3, 8], expected [5, 3, 8]"});
  broken("dropped.h5",
         [](hid_t f) {
           set_extent(f, "/batches/dropped", {6, 3});
         },
         {"/batches/dropped", "expected [5, 3]"});
  broken("total.h5",
         [](hid_t f) {
           set_extent(f, "/tokens/experts", {20, 3, 2});
         },
         {"/tokens/gates", "expected [20, 3, 2]"});
  broken("sum.h5",
         [](hid_t f) {
           for (const char* ds : {"/tokens/experts", "/tokens/gates"})
             set_extent(f, ds, {20, 3, 2});
           set_extent(f, "/tokens/ids", {20});
         },
         {"/batches/tokens sums to 25 tokens but /tokens has 20 rows"});
  broken("topk.h5", [](hid_t f) { io::h5::write_int_attr(f, "top_k", 1, {"x"}); },
         {"/tokens/experts", "shape [25, 3, 2], expected [25, 3, 1]"});
  broken("layers.h5",
         [](hid_t f) {
           H5Ldelete(f, "/layers/experts", H5P_DEFAULT);
           hid_t g = H5Gopen2(f, "/layers", H5P_DEFAULT);
           hsize_t n = 2;
           hid_t space = H5Screate_simple(1, &n, nullptr);
           hid_t ds = H5Dcreate2(g, "experts", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                 H5P_DEFAULT);
           int64_t experts[2] = {8, 4};
           REQUIRE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, experts) >= 0);
           H5Dclose(ds);
           H5Sclose(space);
           H5Gclose(g);
         },
         {"moe_blocks has 3 entries but experts has 2"});
  broken("emax.h5",
         [](hid_t f) {
           hid_t ds = H5Dopen2(f, "/layers/experts", H5P_DEFAULT);
           int64_t experts[3] = {8, 4, 12};  // Emax 12, but loads were written with 8
           REQUIRE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, experts) >= 0);
           H5Dclose(ds);
         },
         {"/batches/loads", "expected [5, 3, 12]"});
  // A block index far beyond the model's 6 layers (issue 45: 2^40 was summarised and plotted).
  broken("blocks.h5",
         [](hid_t f) {
           hid_t ds = H5Dopen2(f, "/layers/moe_blocks", H5P_DEFAULT);
           int64_t blocks[3] = {1, 3, int64_t(1) << 40};
           REQUIRE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, blocks) >= 0);
           H5Dclose(ds);
         },
         {"moe_blocks entry 2 is block 1099511627776, beyond the model's 6 layers"});
  {
    // Layer 1 said to have 2 experts: the file opens, and the stored ids (up to 3) are refused
    // as they are read.
    const std::string p = dir.file("range.h5");
    test::write_file(p, good);
    edit_file(p, [](hid_t f) {
      hid_t ds = H5Dopen2(f, "/layers/experts", H5P_DEFAULT);
      int64_t experts[3] = {8, 2, 6};
      REQUIRE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, experts) >= 0);
      H5Dclose(ds);
    });
    io::TraceReader r(p);
    std::vector<int32_t> experts;
    require_error_contains(
        [&] { r.read_tokens(0, 25, experts); },
        {dir.file("range.h5"), "/tokens/experts", "layer 1", "is outside [0, 2)"});
  }
}

TEST_CASE("trace: the reader applies the writer's rules to loads, dropped and steps",
          "[trace][validation]") {
  test::ScratchDir dir("trace-values");
  const std::string good_path = dir.file("good.h5");
  const io::TraceInfo info = make_info();
  write_trace(good_path, info, make_batches(info));
  const std::string good = test::read_file(good_path);
  {
    io::TraceReader r(good_path);  // the unedited file passes
    REQUIRE(r.loads().size() == 5 * 3 * 8);
    REQUIRE(r.dropped().size() == 5 * 3);
    REQUIRE(r.batch_steps().size() == 5);
  }
  // Sets element `index` of an int64 dataset to `value`.
  auto poke = [&](const char* name, const char* dataset, size_t index, int64_t value) {
    const std::string p = dir.file(name);
    test::write_file(p, good);
    edit_file(p, [&](hid_t f) {
      hid_t ds = H5Dopen2(f, dataset, H5P_DEFAULT);
      REQUIRE(ds >= 0);
      hid_t space = H5Dget_space(ds);
      std::vector<int64_t> values(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
      H5Sclose(space);
      REQUIRE(H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
      values.at(index) = value;
      REQUIRE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0);
      H5Dclose(ds);
    });
    return p;
  };
  // loads [B=5, L=3, Emax=8]: batch 2, layer 1, expert 3.
  const std::string negative = poke("negative.h5", "/batches/loads", (2 * 3 + 1) * 8 + 3, -5);
  require_error_contains(
      [&] { io::TraceReader(negative).loads(); },
      {negative, "/batches/loads", "batch 2, layer 1, expert 3", "load -5", "negative"});
  require_error_contains([&] { io::TraceReader(negative).read_batch(2); },
                         {"/batches/loads", "load -5"});
  // /layers/experts shrunk: layer 1 said to have 2 experts while its loads name 4.
  const std::string shrunk = poke("shrunk.h5", "/layers/experts", 1, 2);
  require_error_contains([&] { io::TraceReader(shrunk).loads(); },
                         {shrunk, "/batches/loads", "layer 1, expert ",
                          "an expert the layer does not have", "/layers/experts gives it 2"});
  const std::string dropped = poke("dropped.h5", "/batches/dropped", 4 * 3 + 2, -1);
  require_error_contains([&] { io::TraceReader(dropped).dropped(); },
                         {dropped, "/batches/dropped", "batch 4, layer 2", "negative"});
  const std::string step = poke("step.h5", "/batches/step", 1, -7);
  require_error_contains([&] { io::TraceReader(step).batch_steps(); },
                         {step, "/batches/step", "batch 1: step -7 is negative"});
}
