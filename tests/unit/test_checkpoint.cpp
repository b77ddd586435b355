// Checkpoint I/O: bitwise round trips (f32, bf16, f16, fp32 optimizer state, configs, state,
// sharding, provenance), per-expert chunks and reads, row chunking, atomic saves, and clear
// errors for missing, empty, foreign, truncated, corrupted and wrong-version files.
// Shape letters: E experts, F expert hidden width, D model width.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "moe/arena.h"
#include "moe/io/checkpoint.h"
#include "moe/io/hdf5.h"
#include "support/gradcheck.h"
#include "support/run.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor half_tensor(Shape shape, uint64_t seed, DType dtype) {
  Tensor t = test::random_tensor(std::move(shape), seed).to(dtype);
  // Bit patterns a value conversion would not preserve: NaN payloads, -0, subnormals, infinity.
  uint16_t* bits = t.half_bits();
  if (dtype == DType::bf16) {
    bits[0] = 0x7fc1;
    bits[1] = 0x8000;
    bits[2] = 0x0001;
    bits[3] = 0xff80;
  } else {
    bits[0] = 0x7e01;
    bits[1] = 0x8000;
    bits[2] = 0x0001;
    bits[3] = 0xfc00;
  }
  return t;
}

// A distinctive, non-repeating byte pattern, to find a tensor's bytes inside the file.
Tensor pattern_tensor(Shape shape, uint32_t salt) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  auto* words = static_cast<uint32_t*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i)
    words[i] = (static_cast<uint32_t>(i) * 2654435761u) ^ (0x5a17c3e9u + salt);
  return t;
}

io::Checkpoint make_checkpoint() {
  io::Checkpoint c;
  c.model_config = {{"arch", "mixtral"}, {"layers", 2},
                    {"d_model", 5},      {"experts_per_layer", {4, 4}},
                    {"rope_theta", 1e6}, {"name", "m\xc3\xbcnchen"},
                    {"tie", false},      {"eps", 1.2345678e-6}};
  c.train_config = {{"lr", 3e-4}, {"batch", 8}, {"data", "a b.txt"}};
  c.provenance = {"moe-train", "0.1.0", "abc123def456", "moe-train --data 'a b.txt' --out run/",
                  "2024-05-01T12:34:56Z"};
  const int64_t E = 4, F = 3, D = 5;
  c.params.push_back({"embed.weight", test::random_tensor({7, D}, 11), false});
  c.params.push_back({"blocks.0.moe.experts.w1", half_tensor({E, F, D}, 12, DType::bf16), true});
  c.params.push_back({"blocks.0.moe.experts.w2", half_tensor({E, D, F}, 13, DType::f16), true});
  c.params.push_back({"blocks.0.moe.experts.b1", test::random_tensor({E, F}, 14), true});
  c.params.push_back({"blocks.0.norm.weight", half_tensor({D}, 15, DType::bf16), false});
  c.params.push_back({"blocks.0.attn.scale", test::random_tensor({}, 16), false});  // rank 0
  c.params.push_back({"blocks.0.empty", Tensor::empty({0, 3}), false});             // no elements
  c.params.push_back({"router.counts", test::random_ids({E}, 17, 1000), false});    // i32
  c.optim.push_back({"adam.m.blocks.0.moe.experts.w1", test::random_tensor({E, F, D}, 21), true});
  c.optim.push_back({"adam.v.blocks.0.moe.experts.w1", test::random_tensor({E, F, D}, 22), true});
  c.optim.push_back({"master.embed.weight", test::random_tensor({7, D}, 23), false});
  c.state = {1234, 5678901234, 77, 0xFEDCBA9876543210ull};
  c.sharding = {4, 2, {0, 0, 1, 3}};
  return c;
}

void require_same_tensors(const std::vector<io::NamedTensor>& a,
                          const std::vector<io::NamedTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << a[i].name);
    REQUIRE(a[i].name == b[i].name);
    REQUIRE(a[i].expert == b[i].expert);
    REQUIRE(a[i].tensor.dtype() == b[i].tensor.dtype());
    REQUIRE(a[i].tensor.shape() == b[i].tensor.shape());
    REQUIRE(same_bytes(a[i].tensor, b[i].tensor));
  }
}

size_t count_temp_files(const fs::path& dir) {
  size_t n = 0;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) ++n;
  return n;
}

// Rewrites an attribute of the root group in place with the HDF5 API.
void rewrite_root_attr_int(const std::string& path, const char* name, int value) {
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(file >= 0);
  hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
  REQUIRE(attr >= 0);
  REQUIRE(H5Awrite(attr, H5T_NATIVE_INT, &value) >= 0);
  H5Aclose(attr);
  REQUIRE(H5Fclose(file) >= 0);
}

}  // namespace

TEST_CASE("io: checkpoint save/load round trip is bitwise", "[io]") {
  test::ScratchDir dir("io-ckpt-roundtrip");
  std::string path = dir.file("ckpt.h5");
  io::Checkpoint saved = make_checkpoint();
  io::save_checkpoint(path, saved);
  REQUIRE(fs::exists(path));
  REQUIRE(count_temp_files(dir.path()) == 0);

  io::Checkpoint loaded = io::load_checkpoint(path);
  require_same_tensors(saved.params, loaded.params);
  require_same_tensors(saved.optim, loaded.optim);
  REQUIRE(loaded.model_config == saved.model_config);
  REQUIRE(loaded.train_config == saved.train_config);
  REQUIRE(loaded.model_config["eps"].get<double>() == 1.2345678e-6);
  REQUIRE(loaded.provenance.tool == saved.provenance.tool);
  REQUIRE(loaded.provenance.version == saved.provenance.version);
  REQUIRE(loaded.provenance.git == saved.provenance.git);
  REQUIRE(loaded.provenance.argv == saved.provenance.argv);
  REQUIRE(loaded.provenance.time == saved.provenance.time);
  REQUIRE(loaded.state.step == 1234);
  REQUIRE(loaded.state.tokens_seen == 5678901234);
  REQUIRE(loaded.state.data_cursor == 77);
  REQUIRE(loaded.state.seed == 0xFEDCBA9876543210ull);
  REQUIRE(loaded.sharding.world_size == 4);
  REQUIRE(loaded.sharding.ep_size == 2);
  REQUIRE(loaded.sharding.expert_rank == std::vector<int>{0, 0, 1, 3});

  // Without the optimizer state; single tensors; the config alone; names in saved order.
  io::Checkpoint params_only = io::load_checkpoint(path, false);
  REQUIRE(params_only.optim.empty());
  require_same_tensors(saved.params, params_only.params);
  std::vector<std::string> names;
  for (const auto& p : saved.params) names.push_back(p.name);
  REQUIRE(io::list_params(path) == names);
  REQUIRE(io::list_optim(path).size() == saved.optim.size());
  REQUIRE(io::read_model_config(path) == saved.model_config);
  for (const auto& p : saved.params) REQUIRE(same_bytes(io::read_param(path, p.name), p.tensor));
  REQUIRE(same_bytes(io::read_optim(path, "master.embed.weight"), saved.optim[2].tensor));

  // Empty sharding map, default state, a config over 64 KiB (dense attribute storage).
  io::Checkpoint other;
  other.model_config = {{"blob", std::string(100000, 'x')}};
  other.params.push_back({"w", test::random_tensor({3, 2}, 5), false});
  std::string path2 = dir.file("small.h5");
  io::save_checkpoint(path2, other);
  io::Checkpoint other_loaded = io::load_checkpoint(path2);
  REQUIRE(other_loaded.model_config == other.model_config);
  REQUIRE(other_loaded.sharding.expert_rank.empty());
  REQUIRE(other_loaded.sharding.world_size == 1);
  REQUIRE(other_loaded.optim.empty());
  // An empty time is filled with the save time.
  REQUIRE(std::regex_match(other_loaded.provenance.time,
                           std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
}

TEST_CASE("io: a checkpoint loads from its bytes in memory like from its file", "[io]") {
  test::ScratchDir dir("io-ckpt-image");
  std::string path = dir.file("ckpt.h5");
  io::Checkpoint saved = make_checkpoint();
  io::save_checkpoint(path, saved);
  const std::string bytes = test::read_file(path);

  io::Checkpoint loaded = io::load_checkpoint_image(bytes, "mem");
  require_same_tensors(saved.params, loaded.params);
  require_same_tensors(saved.optim, loaded.optim);
  REQUIRE(loaded.model_config == saved.model_config);
  REQUIRE(loaded.state.tokens_seen == 5678901234);
  REQUIRE(loaded.sharding.expert_rank == std::vector<int>{0, 0, 1, 3});
  REQUIRE(io::load_checkpoint_image(bytes, "mem", false).optim.empty());

  // Bad images fail like bad files, naming the given name and the cause.
  auto error_of = [](const std::string& image) {
    return test::error_of([&] { io::load_checkpoint_image(image, "mem-name"); });
  };
  REQUIRE_THAT(error_of(""), Catch::Contains("mem-name") && Catch::Contains("empty file"));
  REQUIRE_THAT(error_of("not HDF5 at all"), Catch::Contains("not an HDF5 file"));
  REQUIRE_THAT(error_of(bytes.substr(0, bytes.size() / 2)), Catch::Contains("truncated"));
}

TEST_CASE("io: read_expert returns exactly one expert's chunk", "[io]") {
  test::ScratchDir dir("io-ckpt-expert");
  std::string path = dir.file("ckpt.h5");
  io::Checkpoint saved = make_checkpoint();
  io::save_checkpoint(path, saved);

  for (const auto& p : saved.params) {
    if (!p.expert) continue;
    const Tensor& full = p.tensor;
    int64_t E = full.dim(0);
    size_t slice_bytes = full.nbytes() / static_cast<size_t>(E);
    for (int64_t e = 0; e < E; ++e) {
      Tensor slice = io::read_expert(path, p.name, e);
      Shape rest(full.shape().begin() + 1, full.shape().end());
      REQUIRE(slice.shape() == rest);
      REQUIRE(slice.dtype() == full.dtype());
      REQUIRE(std::memcmp(slice.raw(), static_cast<const char*>(full.raw()) + e * slice_bytes,
                          slice_bytes) == 0);
    }
  }
  Tensor m = io::read_optim_expert(path, "adam.m.blocks.0.moe.experts.w1", 2);
  REQUIRE(std::memcmp(m.raw(), static_cast<const float*>(saved.optim[0].tensor.raw()) + 2 * 15,
                      15 * sizeof(float)) == 0);

  std::string msg = test::error_of([&] { io::read_expert(path, "blocks.0.moe.experts.w1", 4); });
  REQUIRE_THAT(msg, Catch::Contains("out of range") && Catch::Contains("4 experts") &&
                        Catch::Contains(path));
  msg = test::error_of([&] { io::read_expert(path, "blocks.0.moe.experts.w1", -1); });
  REQUIRE_THAT(msg, Catch::Contains("out of range"));
  msg = test::error_of([&] { io::read_expert(path, "embed.weight", 0); });
  REQUIRE_THAT(msg, Catch::Contains("not an expert tensor"));
  msg = test::error_of([&] { io::read_param(path, "no.such.weight"); });
  REQUIRE_THAT(msg, Catch::Contains("no.such.weight") && Catch::Contains(path));

  // The storage itself: one Fletcher32-checksummed chunk per expert, one chunk for the rest.
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(file >= 0);
  auto chunk_of = [&](const char* name, bool* fletcher) {
    hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
    REQUIRE(ds >= 0);
    hid_t dcpl = H5Dget_create_plist(ds);
    hsize_t dims[8] = {};
    int rank = H5Pget_chunk(dcpl, 8, dims);
    *fletcher = false;
    for (int i = 0; i < H5Pget_nfilters(dcpl); ++i) {
      unsigned flags = 0, config = 0;
      size_t nelem = 0;
      if (H5Pget_filter2(dcpl, i, &flags, &nelem, nullptr, 0, nullptr, &config) ==
          H5Z_FILTER_FLETCHER32)
        *fletcher = true;
    }
    H5Pclose(dcpl);
    H5Dclose(ds);
    return std::vector<hsize_t>(dims, dims + std::max(rank, 0));
  };
  bool fletcher = false;
  REQUIRE(chunk_of("/params/blocks.0.moe.experts.w1", &fletcher) == std::vector<hsize_t>{1, 3, 5});
  REQUIRE(fletcher);
  REQUIRE(chunk_of("/params/embed.weight", &fletcher) == std::vector<hsize_t>{7, 5});
  REQUIRE(fletcher);
  REQUIRE(chunk_of("/optim/adam.v.blocks.0.moe.experts.w1", &fletcher) ==
          std::vector<hsize_t>{1, 3, 5});
  REQUIRE(fletcher);
  H5Fclose(file);
}

TEST_CASE("io: checkpoint root attributes are documented and h5dump reads the file", "[io]") {
  test::ScratchDir dir("io-ckpt-attrs");
  std::string path = dir.file("ckpt.h5");
  io::Checkpoint saved = make_checkpoint();
  io::save_checkpoint(path, saved);
  {
    io::h5::Session session;
    io::h5::File file = io::h5::open_file_readonly(path);
    io::h5::Where root{path, "/"};
    REQUIRE(io::h5::read_string_attr(file, "format", root) == "moe.checkpoint");
    REQUIRE(io::h5::read_int_attr(file, "format_version", root) == io::kCheckpointVersion);
    REQUIRE(io::h5::read_string_attr(file, "producer", root) ==
            "moe-train 0.1.0 (git abc123def456)");
    REQUIRE(io::h5::read_string_attr(file, "argv", root) == saved.provenance.argv);
    REQUIRE(io::h5::read_string_attr(file, "created", root) == saved.provenance.time);
    REQUIRE(nlohmann::json::parse(io::h5::read_string_attr(file, "model_config", root)) ==
            saved.model_config);
    io::h5::Dataset ds(H5Dopen2(file, "/params/blocks.0.moe.experts.w1", H5P_DEFAULT));
    REQUIRE(ds.valid());
    REQUIRE(io::h5::read_string_attr(ds, "dtype", root) == "bf16");
    REQUIRE(io::h5::read_int_attr(ds, "expert", root) == 1);
    // The f16 type is IEEE binary16 (what numpy's float16 maps to).
    io::h5::Dataset half(H5Dopen2(file, "/params/blocks.0.moe.experts.w2", H5P_DEFAULT));
    io::h5::Type half_type(H5Dget_type(half));
    size_t spos, epos, esize, mpos, msize;
    REQUIRE(H5Tget_fields(half_type, &spos, &epos, &esize, &mpos, &msize) >= 0);
    REQUIRE((spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10));
    REQUIRE(H5Tget_ebias(half_type) == 15);
    REQUIRE(H5Tget_size(half_type) == 2);
  }
  const char* h5dump = "/usr/bin/h5dump";
  if (!fs::exists(h5dump)) {
    FAIL("h5dump is not installed: run scripts/setup (hdf5-tools; the h5dump check cannot run)");
  }
  std::string out = dir.file("dump.txt");
  std::string cmd = std::string(h5dump) + " -H '" + path + "' > '" + out + "' 2>&1";
  int rc = std::system(cmd.c_str());
  std::string dump = test::read_file(out);
  INFO(dump);
  REQUIRE(rc == 0);
  for (const char* needle :
       {"ATTRIBUTE \"format\"", "ATTRIBUTE \"format_version\"", "ATTRIBUTE \"producer\"",
        "ATTRIBUTE \"argv\"", "ATTRIBUTE \"created\"", "ATTRIBUTE \"model_config\"",
        "ATTRIBUTE \"train_config\"", "GROUP \"params\"", "DATASET \"blocks.0.moe.experts.w1\"",
        "GROUP \"optim\"", "GROUP \"state\"", "ATTRIBUTE \"data_cursor\"", "GROUP \"sharding\"",
        "ATTRIBUTE \"expert_rank\""})
    REQUIRE_THAT(dump, Catch::Contains(needle));
  // Attribute values, and a full dump of data (h5dump verifies the checksums as it reads).
  cmd = std::string(h5dump) +
        " -a /format -a /format_version -d /params/embed.weight -d "
        "/params/blocks.0.moe.experts.w1 '" +
        path + "' > '" + out + "' 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  dump = test::read_file(out);
  REQUIRE_THAT(dump, Catch::Contains("\"moe.checkpoint\"") && Catch::Contains("(0): 1"));
}

TEST_CASE("io: tensors above the chunk limit are stored in row chunks", "[io]") {
  using io::h5::chunk_shape;
  REQUIRE(chunk_shape({10, 6}, 4, false) == std::vector<hsize_t>{10, 6});
  REQUIRE(chunk_shape({8, 64, 32}, 2, true) == std::vector<hsize_t>{1, 64, 32});
  REQUIRE(chunk_shape({10, 6}, 4, false, 64) == std::vector<hsize_t>{2, 6});
  REQUIRE(chunk_shape({3, 5, 1000}, 4, false, 4000) == std::vector<hsize_t>{1, 1, 1000});
  REQUIRE(chunk_shape({4, 10, 6}, 4, true, 64) == std::vector<hsize_t>{1, 2, 6});
  REQUIRE(chunk_shape({}, 4, false).empty());
  REQUIRE(chunk_shape({0, 4}, 4, false).empty());
  // A 6 GiB embedding: row chunks of at most kMaxChunkBytes, far below HDF5's 4 GiB limit.
  std::vector<hsize_t> big = chunk_shape({int64_t(3) << 20, 512}, 4, false);
  REQUIRE(big == std::vector<hsize_t>{io::h5::kMaxChunkBytes / 2048, 512});

  test::ScratchDir dir("io-ckpt-rowchunks");
  std::string path = dir.file("ckpt.h5");
  io::Checkpoint c;
  c.params.push_back({"tall", test::random_tensor({10, 6}, 31), false});
  c.params.push_back({"experts", test::random_tensor({4, 10, 6}, 32), true});
  io::save_checkpoint(path, c, io::SaveOptions{64});
  io::Checkpoint loaded = io::load_checkpoint(path);
  require_same_tensors(c.params, loaded.params);
  Tensor e3 = io::read_expert(path, "experts", 3);
  REQUIRE(std::memcmp(e3.raw(), c.params[1].tensor.data<float>() + 3 * 60, 60 * 4) == 0);
}

TEST_CASE("io: a failed save leaves the previous checkpoint byte-identical", "[io]") {
  test::ScratchDir dir("io-ckpt-atomic");
  std::string path = dir.file("ckpt.h5");
  io::Checkpoint good = make_checkpoint();
  io::save_checkpoint(path, good);
  const std::string before = test::read_file(path);
  REQUIRE(before.size() > 1000);

  auto require_failed_save = [&](io::Checkpoint bad, const char* cause) {
    std::string msg = test::error_of([&] { io::save_checkpoint(path, bad); });
    INFO(msg);
    REQUIRE_THAT(msg, Catch::Contains(path) && Catch::Contains(cause));
    REQUIRE(test::read_file(path) == before);
    REQUIRE(count_temp_files(dir.path()) == 0);
  };
  // Each fails while the temporary file is being written, after earlier tensors went in.
  io::Checkpoint dup = make_checkpoint();
  dup.params.push_back({"embed.weight", test::random_tensor({2}, 3), false});
  require_failed_save(dup, "appears twice");
  io::Checkpoint slash = make_checkpoint();
  slash.optim.push_back({"adam/m", test::random_tensor({2}, 3), false});
  require_failed_save(slash, "not a valid dataset name");
  io::Checkpoint undefined = make_checkpoint();
  undefined.params.push_back({"later", Tensor(), false});
  require_failed_save(undefined, "undefined");
  io::Checkpoint not_expert = make_checkpoint();
  not_expert.params.push_back({"scalar.expert", test::random_tensor({}, 3), true});
  require_failed_save(not_expert, "leading expert dimension");

  // The target is a non-empty directory: refused before anything is written. It stays as it was.
  std::string dir_target = dir.file("occupied");
  fs::create_directories(dir_target);
  write_file(dir_target + "/keep.txt", "keep");
  std::string msg = test::error_of([&] { io::save_checkpoint(dir_target, good); });
  REQUIRE_THAT(msg, Catch::Contains("is a directory, not a regular file"));
  REQUIRE(test::read_file(dir_target + "/keep.txt") == "keep");
  REQUIRE(count_temp_files(dir.path()) == 0);

  // A directory that cannot be written: nothing is created, nothing is left behind.
  msg = test::error_of([&] { io::save_checkpoint(dir.file("missing/ckpt.h5"), good); });
  REQUIRE_THAT(msg, Catch::Contains("missing/ckpt.h5"));
  if (::geteuid() != 0) {
    std::string ro = dir.file("readonly");
    fs::create_directories(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    msg = test::error_of([&] { io::save_checkpoint(ro + "/ckpt.h5", good); });
    fs::permissions(ro, fs::perms::owner_all);
    REQUIRE_THAT(msg, Catch::Contains("readonly/ckpt.h5"));
    REQUIRE(fs::is_empty(ro));
  }

  // A successful save over it replaces it whole.
  io::Checkpoint next = make_checkpoint();
  next.state.step = 999;
  io::save_checkpoint(path, next);
  REQUIRE(io::load_checkpoint(path).state.step == 999);
  REQUIRE(count_temp_files(dir.path()) == 0);
}

TEST_CASE("io: bad checkpoint files give errors naming the file and the cause", "[io]") {
  test::ScratchDir dir("io-ckpt-bad");
  auto require_error = [](const std::string& path, const char* cause) {
    std::string msg = test::error_of([&] { io::load_checkpoint(path); });
    INFO(msg);
    REQUIRE_THAT(msg, Catch::Contains(path) && Catch::Contains(cause));
  };
  require_error(dir.file("nope.h5"), "no such file");
  write_file(dir.file("empty.h5"), "");
  require_error(dir.file("empty.h5"), "empty file");
  write_file(dir.file("text.h5"), "this is not an HDF5 file at all, just some text\n");
  require_error(dir.file("text.h5"), "not an HDF5 file");

  // A real checkpoint with a tensor of a known byte pattern, and an expert tensor whose experts
  // each have their own pattern.
  std::string path = dir.file("ckpt.h5");
  io::Checkpoint c = make_checkpoint();
  c.params.push_back({"probe", pattern_tensor({1024}, 0), false});
  c.params.push_back({"probe.experts", pattern_tensor({4, 256}, 1), true});
  io::save_checkpoint(path, c);
  const std::string good = test::read_file(path);
  REQUIRE_NOTHROW(io::load_checkpoint(path));

  std::string truncated = dir.file("truncated.h5");
  write_file(truncated, good.substr(0, good.size() / 2));
  require_error(truncated, "truncated");

  auto find_bytes = [&](const Tensor& t, size_t offset) {
    std::string needle(static_cast<const char*>(t.raw()) + offset, 64);
    size_t at = good.find(needle);
    REQUIRE(at != std::string::npos);
    REQUIRE(good.find(needle, at + 1) == std::string::npos);
    return at;
  };
  {
    std::string corrupted = good;
    corrupted[find_bytes(c.params[8].tensor, 0) + 2000] ^= 0x10;  // inside probe's 4096 bytes
    std::string flipped = dir.file("flipped.h5");
    write_file(flipped, corrupted);
    require_error(flipped, "checksum");
    require_error(flipped, "/params/probe");
    // Other tensors stay readable.
    REQUIRE(same_bytes(io::read_param(flipped, "embed.weight"), c.params[0].tensor));
  }
  {
    // Corrupt expert 2 only: experts 0, 1, 3 still read (only their own chunk is touched).
    std::string corrupted = good;
    const Tensor& experts = c.params[9].tensor;
    corrupted[find_bytes(experts, 2 * 1024) + 100] ^= 0x01;
    std::string flipped = dir.file("flipped_expert.h5");
    write_file(flipped, corrupted);
    for (int64_t e : {0, 1, 3}) {
      Tensor slice = io::read_expert(flipped, "probe.experts", e);
      REQUIRE(std::memcmp(slice.raw(), experts.data<float>() + e * 256, 1024) == 0);
    }
    std::string msg = test::error_of([&] { io::read_expert(flipped, "probe.experts", 2); });
    REQUIRE_THAT(msg, Catch::Contains("checksum") && Catch::Contains(flipped));
  }

  std::string v2 = dir.file("v2.h5");
  write_file(v2, good);
  rewrite_root_attr_int(v2, "format_version", 2);
  require_error(v2, "checkpoint format version 2, this build reads version 1");
  REQUIRE_THROWS_AS(io::read_param(v2, "embed.weight"), Error);
  REQUIRE_THROWS_AS(io::list_params(v2), Error);

  // A valid HDF5 file that is not a checkpoint; a checkpoint with the wrong format string.
  std::string plain = dir.file("plain.h5");
  {
    io::h5::Session session;
    io::h5::WriteFile f = io::h5::create_file(plain);
    f.close({plain, "/"});
  }
  require_error(plain, "not a moe checkpoint");
  std::string trace = dir.file("trace.h5");
  write_file(trace, good);
  {
    io::h5::Session session;
    hid_t f = H5Fopen(trace.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
    io::h5::write_string_attr(f, "format", "moe.trace", {trace, "/"});
    REQUIRE(H5Fclose(f) >= 0);
  }
  require_error(trace, "format is 'moe.trace'");

  // A dataset whose dtype attribute disagrees with its stored type.
  std::string lying = dir.file("lying.h5");
  write_file(lying, good);
  {
    io::h5::Session session;
    hid_t f = H5Fopen(lying.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
    hid_t ds = H5Dopen2(f, "/params/blocks.0.moe.experts.w1", H5P_DEFAULT);
    REQUIRE(ds >= 0);
    io::h5::write_string_attr(ds, "dtype", "f16", {lying, "w1"});
    H5Dclose(ds);
    REQUIRE(H5Fclose(f) >= 0);
  }
  require_error(lying, "dtype attribute says f16");
}

TEST_CASE("io: sharded tensors keep their slice, and slices that do not fit are refused", "[io]") {
  test::ScratchDir dir("io-ckpt-shard");
  std::string path = dir.file("rank-00001.h5");
  io::Checkpoint c;
  c.model_config = {{"x", 1}};
  c.sharding.world_size = 4;
  c.sharding.ep_size = 2;
  c.sharding.rank = 1;
  c.sharding.shard_embedding = true;
  // Experts 2..3 of 4 (dimension 0), columns 4..7 of 16 (dimension 1), and a whole tensor.
  c.params.push_back(
      {"experts.w1", test::random_tensor({2, 3, 5}, 1), true, ParamShard{{4, 3, 5}, 0, 2, 2}});
  c.params.push_back(
      {"embed.tokens", test::random_tensor({6, 4}, 2), false, ParamShard{{6, 16}, 1, 4, 4}});
  c.params.push_back({"norm.weight", test::random_tensor({5}, 3), false});
  c.optim.push_back(
      {"adam.m.embed.tokens", test::random_tensor({6, 4}, 4), false, ParamShard{{6, 16}, 1, 4, 4}});
  io::save_checkpoint(path, c);
  io::Checkpoint loaded = io::load_checkpoint(path);
  REQUIRE(loaded.sharding.rank == 1);
  REQUIRE(loaded.sharding.shard_embedding);
  require_same_tensors(c.params, loaded.params);
  for (size_t i = 0; i < c.params.size(); ++i) {
    const ParamShard &a = c.params[i].shard, &b = loaded.params[i].shard;
    REQUIRE(a.global == b.global);
    REQUIRE(a.dim == b.dim);
    REQUIRE(a.start == b.start);
    REQUIRE(a.count == b.count);
  }
  REQUIRE_FALSE(loaded.params[2].shard.defined());
  REQUIRE(loaded.optim[0].shard.start == 4);
  // An unsharded file has no rank.
  io::Checkpoint whole;
  whole.params.push_back({"w", test::random_tensor({2}, 5), false});
  io::save_checkpoint(dir.file("whole.h5"), whole);
  REQUIRE(io::load_checkpoint(dir.file("whole.h5")).sharding.rank == -1);

  // A tensor that is not the slice it claims is refused on write, leaving no file.
  io::Checkpoint wrong = c;
  wrong.params[0].shard.count = 3;
  REQUIRE_THROWS_WITH(io::save_checkpoint(dir.file("wrong.h5"), wrong),
                      Catch::Contains("is not the shard"));
  REQUIRE_FALSE(fs::exists(dir.file("wrong.h5")));
  // A file whose slice runs past the whole tensor is refused on read, naming the dataset.
  std::string past = dir.file("past.h5");
  fs::copy_file(path, past);
  {
    io::h5::Session session;
    hid_t f = H5Fopen(past.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
    hid_t ds = H5Dopen2(f, "/params/experts.w1", H5P_DEFAULT);
    REQUIRE(ds >= 0);
    REQUIRE(H5Adelete(ds, "shard_start") >= 0);
    io::h5::write_int_attr(ds, "shard_start", 3, {past, "w1"}, H5T_STD_I64LE);
    H5Dclose(ds);
    REQUIRE(H5Fclose(f) >= 0);
  }
  std::string msg = test::error_of([&] { io::load_checkpoint(past); });
  REQUIRE_THAT(msg, Catch::Contains(past) && Catch::Contains("experts.w1") &&
                        Catch::Contains("is not the shard at 3"));
}

TEST_CASE("io: checkpoint reads refuse to allocate from the activation arena", "[io]") {
  test::ScratchDir dir("io-ckpt-arena");
  std::string path = dir.file("ckpt.h5");
  io::Checkpoint c;
  c.params.push_back({"w", test::random_tensor({3, 2}, 5), false});
  io::save_checkpoint(path, c);
  Arena arena(1 << 20);
  ArenaScope scope(arena);
  REQUIRE_THROWS_WITH(io::read_param(path, "w"), Catch::Contains("ArenaScope"));
}

TEST_CASE("io: provenance helpers quote argv and stamp UTC time", "[io]") {
  REQUIRE(io::shell_quote("--lr=3e-4") == "--lr=3e-4");
  REQUIRE(io::shell_quote("a b.txt") == "'a b.txt'");
  REQUIRE(io::shell_quote("it's") == "'it'\\''s'");
  REQUIRE(io::shell_quote("") == "''");
  REQUIRE(io::shell_quote("$HOME") == "'$HOME'");
  const char* argv[] = {"moe-train", "--data", "my data.txt", "--out", "run/"};
  REQUIRE(io::join_argv(5, argv) == "moe-train --data 'my data.txt' --out run/");
  io::Provenance p = io::make_provenance("moe-train", 5, argv);
  REQUIRE(p.tool == "moe-train");
  REQUIRE(p.version == MOE_VERSION);
  REQUIRE(!p.git.empty());
  REQUIRE(p.argv == "moe-train --data 'my data.txt' --out run/");
  REQUIRE(std::regex_match(p.time, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
}
