// What the HDF5 files we write look like inside (docs/FORMATS.md, "HDF5 object formats"): every
// piece of metadata checksummed, no global heap, no fractal heap, strings fixed-length, and the
// readers still taking variable-length strings.
#include <hdf5.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/io/hdf5.h"
#include "moe/io/trace.h"
#include "support/gradcheck.h"
#include "support/run.h"

using namespace moe;

namespace {

io::Checkpoint many_tensors(size_t count, size_t config_bytes) {
  io::Checkpoint c;
  c.model_config = {{"arch", "gpt"}, {"note", std::string(config_bytes, 'x')}};
  c.train_config = nullptr;
  c.provenance = {"moe-train", "0.1.0", "abc", "moe-train --out run/", "2024-05-01T12:34:56Z"};
  for (size_t i = 0; i < count; ++i)
    c.params.push_back({"blocks." + std::to_string(i) + ".w",
                        test::random_tensor({3, 4}, 100 + static_cast<uint64_t>(i)), false});
  c.params.push_back({"scale", test::random_tensor({}, 7), false});  // rank 0: compact layout
  c.optim.push_back({"adam.m.scale", test::random_tensor({}, 8), false});
  return c;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

bool contains(const std::string& bytes, const char* signature) {
  return bytes.find(signature) != std::string::npos;
}

// Structures without checksums (global heap), or whose damage libhdf5 1.10 does not survive
// (fractal heaps), or the v1 B-trees of the 1.8 chunk index: none may appear in a file we write.
void require_checksummed_structures_only(const std::string& path) {
  const std::string bytes = test::read_file(path);
  REQUIRE(bytes.size() > 9);
  REQUIRE(bytes.compare(0, 8, "\x89HDF\r\n\x1a\n") == 0);
  REQUIRE(static_cast<int>(bytes[8]) == 3);  // superblock version 3 (checksummed)
  for (const char* signature : {"GCOL", "FRHP", "FHDB", "FHIB", "TREE", "HEAP", "SNOD"}) {
    INFO(path << " holds " << signature);
    REQUIRE_FALSE(contains(bytes, signature));
  }
  REQUIRE(contains(bytes, "OHDR"));  // version 2 object headers (checksummed)
}

}  // namespace

TEST_CASE("hdf5: checkpoints hold only checksummed metadata and fixed-length strings",
          "[io][hdf5]") {
  test::ScratchDir dir("hdf5-format");
  const std::string path = dir.file("ckpt.h5");
  // 40 tensors: groups past 8 links and a root with 10 attributes, which the HDF5 defaults would
  // have moved to fractal heaps.
  const io::Checkpoint saved = many_tensors(40, 100);
  io::save_checkpoint(path, saved);
  require_checksummed_structures_only(path);

  io::h5::Session session;
  io::h5::File file = io::h5::open_file_readonly(path);
  io::h5::Where root{path, "/"};
  for (const char* name : {"format", "model_config", "argv", "created"}) {
    io::h5::Attr attr(H5Aopen(file, name, H5P_DEFAULT));
    REQUIRE(attr.valid());
    io::h5::Type type(H5Aget_type(attr));
    REQUIRE(H5Tget_class(type) == H5T_STRING);
    REQUIRE(H5Tis_variable_str(type) == 0);
    REQUIRE(H5Tget_cset(type) == H5T_CSET_UTF8);
  }
  REQUIRE(io::h5::read_string_attr(file, "format", root) == "moe.checkpoint");
  io::h5::Group params(H5Gopen2(file, "params", H5P_DEFAULT));
  H5G_info_t info{};
  REQUIRE(H5Gget_info(params, &info) >= 0);
  REQUIRE(info.nlinks == 41);
  REQUIRE(info.storage_type == H5G_STORAGE_TYPE_COMPACT);
  REQUIRE(io::h5::list_links(params, root.at("/params")) == io::list_params(path));
  io::h5::Dataset scalar(H5Dopen2(params, "scale", H5P_DEFAULT));
  io::h5::Plist dcpl(H5Dget_create_plist(scalar));
  REQUIRE(H5Pget_layout(dcpl) == H5D_COMPACT);

  io::Checkpoint loaded = io::load_checkpoint(path);
  REQUIRE(loaded.model_config == saved.model_config);
  REQUIRE(loaded.params.size() == saved.params.size());
  for (size_t i = 0; i < saved.params.size(); ++i) {
    REQUIRE(loaded.params[i].name == saved.params[i].name);
    REQUIRE(same_bytes(loaded.params[i].tensor, saved.params[i].tensor));
  }
}

TEST_CASE("hdf5: a configuration longer than an object header message still round trips",
          "[io][hdf5]") {
  // Compact attributes are limited to 64 KiB each: a longer one goes to dense storage, where
  // HDF5 keeps it (checksummed) rather than failing the save.
  test::ScratchDir dir("hdf5-long");
  const std::string path = dir.file("ckpt.h5");
  const io::Checkpoint saved = many_tensors(2, 200 << 10);
  io::save_checkpoint(path, saved);
  const std::string bytes = test::read_file(path);
  REQUIRE_FALSE(contains(bytes, "GCOL"));
  REQUIRE(contains(bytes, "FRHP"));  // the root's attributes went dense (docs/FORMATS.md)
  REQUIRE(io::load_checkpoint(path).model_config == saved.model_config);
}

TEST_CASE("hdf5: traces hold only checksummed metadata", "[trace][hdf5]") {
  test::ScratchDir dir("hdf5-trace");
  const std::string path = dir.file("trace.h5");
  io::TraceInfo info;
  info.model_config = {{"arch", "gpt"}};
  info.moe_blocks = {1, 3};
  info.experts = {4, 4};
  info.top_k = 2;
  info.source = "record";
  info.provenance = {"moe-profile", "0.1.0", "abc", "moe-profile record", "2024-05-01T12:34:56Z"};
  io::TraceWriter writer(path, info, 4);
  io::TraceBatch batch;
  batch.step = -1;
  batch.token_ids = {1, 2, 3};
  batch.experts = {0, 1, 2, 3, 1, 2, 0, 3, 3, 2, 1, 0};
  batch.gates = std::vector<float>(12, 0.5f);
  batch.loads = {3, 3, 3, 3, 3, 3, 3, 3};
  batch.dropped = {0, 0};
  writer.append(batch);
  writer.close();
  require_checksummed_structures_only(path);
  io::TraceReader reader(path);
  REQUIRE(reader.tokens() == 3);
  REQUIRE(reader.info().source == "record");
}

TEST_CASE("hdf5: variable-length string attributes of earlier builds still read", "[io][hdf5]") {
  test::ScratchDir dir("hdf5-vlen");
  const std::string path = dir.file("old.h5");
  io::h5::Session session;
  io::h5::Where root{path, "/"};
  {
    // The writing code of earlier builds: 1.8 formats, a variable-length UTF-8 string.
    io::h5::Plist fapl(H5Pcreate(H5P_FILE_ACCESS));
    REQUIRE(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18) >= 0);
    io::h5::File file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
    io::h5::Type type(H5Tcopy(H5T_C_S1));
    REQUIRE(H5Tset_size(type, H5T_VARIABLE) >= 0);
    REQUIRE(H5Tset_cset(type, H5T_CSET_UTF8) >= 0);
    io::h5::Space space(H5Screate(H5S_SCALAR));
    io::h5::Attr attr(H5Acreate2(file, "text", type, space, H5P_DEFAULT, H5P_DEFAULT));
    const char* text = "m\xc3\xbcnchen";
    REQUIRE(H5Awrite(attr, type, &text) >= 0);
  }
  REQUIRE(contains(test::read_file(path), "GCOL"));  // it is in the global heap
  io::h5::File file = io::h5::open_file_readonly(path);
  REQUIRE(io::h5::read_string_attr(file, "text", root) == "m\xc3\xbcnchen");
}

TEST_CASE("hdf5: a write that fails is reported once, and the file still closes", "[io][hdf5]") {
  // /dev/full: every write() fails with ENOSPC, as on a full disk (nothing is created or renamed:
  // h5::create_file writes in place). Here the superblock's first write already fails.
  io::h5::Session session;
  const Tensor t = test::random_tensor({64, 64}, 5);
  std::string message;
  try {
    const std::string path = "/dev/full";
    io::h5::WriteFile file = io::h5::create_file(path);
    io::h5::Group group = io::h5::create_group(file, "params", {path, "/"});
    io::h5::write_tensor(group, "w", t, false, {path, "/params"});
    group.close({path, "/params"});
    file.close({path, "/"});
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  REQUIRE_THAT(message, Catch::Contains("/dev/full") && Catch::Contains("No space left on device"));

  // Abandoned (an error path) with an object of the file still open: the file closes when the
  // group does, after its WriteFile is gone.
  test::ScratchDir dir("hdf5-abandon");
  const std::string path = dir.file("abandoned.h5");
  io::h5::Group group;
  {
    io::h5::WriteFile file = io::h5::create_file(path);
    group = io::h5::create_group(file, "params", {path, "/"});
    io::h5::write_tensor(group, "w", t, false, {path, "/params"});
  }
  io::h5::write_tensor(group, "v", t, false, {path, "/params"});  // discarded, not an error
  group.reset();
  // No file identifier is left for H5_term_library to close again (the crash at exit).
  REQUIRE(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE) == 0);
}

TEST_CASE("hdf5: Debian's h5py reads checkpoints as docs/FORMATS.md shows", "[io][hdf5]") {
  const char* python = "/usr/bin/python3";
  if (std::system((std::string(python) + " -c 'import h5py' 2>/dev/null").c_str()) != 0) {
    // A check that did not run must not pass: scripts/setup installs python3-h5py.
    FAIL("python3-h5py is not installed: run scripts/setup (the h5py check cannot run)");
  }
  test::ScratchDir dir("hdf5-h5py");
  const std::string path = dir.file("ckpt.h5");
  io::save_checkpoint(path, many_tensors(12, 10));
  const std::string script = dir.file("read.py");
  test::write_file(script, R"(import h5py, json, sys
text = lambda v: v.decode() if isinstance(v, bytes) else v
f = h5py.File(sys.argv[1], "r")
assert text(f.attrs["format"]) == "moe.checkpoint" and f.attrs["format_version"] == 1
assert json.loads(text(f.attrs["model_config"]))["arch"] == "gpt"
names = list(f["params"])
assert names[:2] == ["blocks.0.w", "blocks.1.w"] and len(names) == 13, names
w = f["params/blocks.3.w"]
assert text(w.attrs["dtype"]) == "f32" and w.fletcher32 and w.shape == (3, 4)
print(float(w[1, 2]))
)");
  auto r = test::run_command(std::string(python) + " " + script + " " + path);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const Tensor w = io::read_param(path, "blocks.3.w");
  REQUIRE(std::stof(r.out) == static_cast<const float*>(w.raw())[1 * 4 + 2]);
}
