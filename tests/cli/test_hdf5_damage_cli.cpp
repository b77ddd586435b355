// Damaged HDF5 files and full disks, as a user meets them: every tool that reads a checkpoint
// gives `moe-<tool>: error: ...` and exit 1 on a damaged one (bits flipped, 4 KiB zeroed, in data
// and in metadata, in today's format and in the format of earlier builds), never a signal and
// never a hang; every HDF5 writer on a full file system exits 1 with the cause and leaves neither
// output nor temporary file. See docs/RELIABILITY.md.
#include <hdf5.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/io/hdf5.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
namespace fs = std::filesystem;

namespace {

std::string tool(const std::string& name, const std::string& args) {
  // A hang is a failure: `timeout` ends it with exit 124 (a signal gives 128 + its number).
  return "timeout 120 " + test::tool_path(name) + " " + args;
}

const std::string kTiny = test::kTinyMixtral + " --steps 2";

struct Trained {
  test::ScratchDir dir{"cli-hdf5-damage"};
  std::string ckpt, old_format, old_unindexed;
  Trained() {
    ckpt = test::train_on_fortunes(dir / "run", kTiny);
    old_format = dir / "old-format.h5";
    const io::Checkpoint c = io::load_checkpoint(ckpt);
    write_old_format(old_format, c);
    old_unindexed = dir / "old-format-unindexed.h5";
    write_old_format(old_unindexed, c, H5P_CRT_ORDER_TRACKED);
  }

  // The layout earlier builds wrote (FORMATS.md, "Files of earlier builds"), with the code path
  // they used: 1.8 object formats (superblock 2, v1 B-tree chunk indexes), variable-length string
  // attributes (global heap), groups whose links move to a fractal heap past 8 of them.
  // `link_order` is the groups' creation-order flags: earlier builds tracked and indexed it; a
  // group that tracks it without an index makes libhdf5 list names through its table of links,
  // the path of issue 45's crashes (free(): invalid pointer in H5G__link_release_table).
  static void write_old_format(const std::string& path, const io::Checkpoint& c,
                               unsigned link_order = H5P_CRT_ORDER_TRACKED |
                                                     H5P_CRT_ORDER_INDEXED) {
    io::h5::Session session;
    io::h5::Where root{path, "/"};
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    REQUIRE(H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18) >= 0);
    hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    REQUIRE(file >= 0);
    auto vlen_attr = [](hid_t object, const char* name, const std::string& value) {
      hid_t type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, H5T_VARIABLE);
      H5Tset_cset(type, H5T_CSET_UTF8);
      hid_t space = H5Screate(H5S_SCALAR);
      hid_t attr = H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
      const char* text = value.c_str();
      REQUIRE(H5Awrite(attr, type, &text) >= 0);
      H5Aclose(attr);
      H5Sclose(space);
      H5Tclose(type);
    };
    vlen_attr(file, "format", io::kCheckpointFormat);
    io::h5::write_int_attr(file, "format_version", 1, root, H5T_STD_I32LE);
    for (const char* name :
         {"producer", "producer_tool", "producer_version", "producer_git", "argv", "created"})
      vlen_attr(file, name, "moe-train 0.0.9");
    vlen_attr(file, "model_config", c.model_config.dump());
    vlen_attr(file, "train_config", c.train_config.dump());
    auto group = [&](const char* name) {
      hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE);
      H5Pset_link_creation_order(gcpl, link_order);
      hid_t g = H5Gcreate2(file, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
      H5Pclose(gcpl);
      REQUIRE(g >= 0);
      return g;
    };
    for (auto [name, tensors] : {std::pair{"params", &c.params}, std::pair{"optim", &c.optim}}) {
      hid_t g = group(name);
      for (const io::NamedTensor& nt : *tensors) {
        const Shape& shape = nt.tensor.shape();
        std::vector<hsize_t> dims(shape.begin(), shape.end()), chunk = dims;
        if (nt.expert) chunk[0] = 1;
        hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
        hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
        H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
        H5Pset_fletcher32(dcpl);
        hid_t ds =
            H5Dcreate2(g, nt.name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        REQUIRE(ds >= 0);
        REQUIRE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, nt.tensor.raw()) >=
                0);
        vlen_attr(ds, "dtype", "f32");
        io::h5::write_int_attr(ds, "expert", nt.expert ? 1 : 0, root, H5T_STD_U8LE);
        H5Dclose(ds);
        H5Pclose(dcpl);
        H5Sclose(space);
      }
      H5Gclose(g);
    }
    hid_t state = group("state");
    io::h5::write_int_attr(state, "step", c.state.step, root);
    io::h5::write_int_attr(state, "tokens_seen", c.state.tokens_seen, root);
    io::h5::write_int_attr(state, "data_cursor", c.state.data_cursor, root);
    io::h5::write_uint_attr(state, "seed", c.state.seed, root);
    H5Gclose(state);
    hid_t sharding = group("sharding");
    io::h5::write_int_attr(sharding, "world_size", 1, root, H5T_STD_I32LE);
    io::h5::write_int_attr(sharding, "ep_size", 1, root, H5T_STD_I32LE);
    io::h5::write_int32_array_attr(sharding, "expert_rank", {}, root);
    H5Gclose(sharding);
    REQUIRE(H5Fclose(file) >= 0);
    H5Pclose(fapl);
  }
};

Trained& trained() {
  static Trained t;
  return t;
}

// Offsets of HDF5 metadata in `bytes`, found by their signatures (HDF5 file format spec).
std::vector<size_t> signatures(const std::string& bytes, const std::vector<std::string>& names) {
  std::vector<size_t> at;
  for (const std::string& name : names)
    for (size_t p = bytes.find(name); p != std::string::npos; p = bytes.find(name, p + 1))
      at.push_back(p);
  return at;
}

struct Damage {
  size_t offset;
  bool zero_block;  // else one bit flipped
  bool metadata;    // damage to metadata must always be refused
};

// Damaged copies of `file`: bits flipped and 4 KiB zeroed at evenly spaced offsets, and at
// metadata (`signatures`, + 1 so that the damage lands inside the signature or just past it).
std::vector<Damage> damages(const std::string& bytes, const std::vector<size_t>& metadata) {
  std::vector<Damage> out;
  for (int i = 0; i < 12; ++i) {
    const size_t at = bytes.size() * static_cast<size_t>(i) / 12 + 61;
    out.push_back({at, false, false});
    out.push_back({at, true, false});
  }
  size_t step = std::max<size_t>(1, metadata.size() / 12);
  for (size_t i = 0; i < metadata.size(); i += step) {
    out.push_back({metadata[i] + 1, false, true});
    out.push_back({metadata[i] + 20, true, true});
  }
  return out;
}

std::string damaged(const std::string& bytes, const Damage& d) {
  std::string out = bytes;
  if (d.zero_block) {
    for (size_t i = d.offset; i < std::min(out.size(), d.offset + 4096); ++i) out[i] = '\0';
  } else {
    out[d.offset] = static_cast<char>(out[d.offset] ^ (1 << (d.offset % 8)));
  }
  return out;
}

struct Command {
  std::string tool, args;
  bool reads_everything;  // then damaged metadata must be refused (moe-infer skips /optim)
};

// Runs each command on every damaged copy; each must end with exit 1 and the tool's error line
// (exit 0 allowed only where the damage hit bytes the command does not use).
void require_clean_refusals(const std::string& file, const std::vector<Damage>& damage,
                            const std::vector<Command>& commands) {
  const std::string bytes = test::read_file(file);
  test::ScratchDir dir("cli-hdf5-damaged");
  const std::string copy = dir / "damaged.h5";
  int refused = 0;
  for (const Damage& d : damage) {
    test::write_file(copy, damaged(bytes, d));
    for (const auto& [name, args, reads_everything] : commands) {
      std::string line = args + " " + copy;
      if (name == "moe-train") line += " --out " + (dir / "resumed") + " --steps 3 --threads 1 -q";
      auto r = run_command(tool(name, line));
      INFO(name << " on " << file << " with " << (d.zero_block ? "4 KiB zeroed" : "a bit flipped")
                << " at offset " << d.offset << (d.metadata ? " (metadata)" : "") << ": exit "
                << r.exit_code << "\n"
                << r.err);
      REQUIRE(r.exit_code != 124);  // no hang
      REQUIRE(r.exit_code < 128);   // no signal
      if (d.metadata && reads_everything) REQUIRE(r.exit_code == 1);
      REQUIRE((r.exit_code == 0 || r.exit_code == 1));
      if (r.exit_code == 1) {
        REQUIRE(r.err.rfind(name + ": error: ", 0) == 0);
        ++refused;
      }
    }
  }
  REQUIRE(refused > 0);
}

void require_clean_refusals(const std::string& file, const std::vector<std::string>& metadata_sigs,
                            const std::vector<Command>& commands) {
  const std::string bytes = test::read_file(file);
  require_clean_refusals(file, damages(bytes, signatures(bytes, metadata_sigs)), commands);
}

// One bit flipped at several places inside every block of the groups' dense link storage
// (fractal heap blocks, v2 B-tree nodes), within the smallest such block of these files (a
// one-row indirect block: 53 bytes) or, for the others, within their first 80 bytes. A node's
// checksum covers its records only, not the unused rest of the node: a flip there changes nothing
// read, so exit 0 stays allowed; a signal or a hang never is.
std::vector<Damage> dense_link_damages(const std::string& bytes) {
  std::vector<Damage> out;
  for (size_t block : signatures(bytes, {"FHIB"}))
    for (size_t inside : {10, 23, 41}) out.push_back({block + inside, false, false});
  for (size_t block : signatures(bytes, {"FHDB", "BTLF", "BTIN"}))
    for (size_t inside : {10, 23, 41, 57, 75})
      if (block + inside < bytes.size()) out.push_back({block + inside, false, false});
  return out;
}

}  // namespace

TEST_CASE("cli: damaged checkpoints give a clean error, never a crash or a hang", "[cli][hdf5]") {
  Trained& t = trained();
  // Today's format: superblock, object headers (and their continuations), fixed array chunk
  // indexes; everything else is chunk data (Fletcher32).
  require_clean_refusals(
      t.ckpt, {"\x89HDF", "OHDR", "OCHK", "FAHD", "FADB"},
      {{"moe-convert", "inspect --verify", true},
       {"moe-train", "--data " + test::fortunes_path("linux") + " --resume", true},
       {"moe-infer", "score --data " + test::fortunes_path("linux") + " --max-sequences 4 --model",
        false}});
}

TEST_CASE("cli: damaged traces give a clean error, never a crash or a hang", "[cli][hdf5]") {
  Trained& t = trained();
  test::ScratchDir dir("cli-hdf5-trace");
  const std::string trace = dir / "trace.h5";
  auto r = run_command(tool("moe-profile", "record --model " + t.ckpt + " --data " +
                                               test::fortunes_path("linux") +
                                               " --max-tokens 8192 -o " + trace));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // Object headers and the extensible-array chunk indexes of the growing datasets. `summary` and
  // `paths` read the loads and the token rows, not every attribute: exit 0 stays allowed.
  require_clean_refusals(
      trace, {"\x89HDF", "OHDR", "OCHK", "EAHD", "EAIB", "EADB", "EASB"},
      {{"moe-profile", "summary", false},
       // --force: a damaged trace that still reads writes the table the next one replaces.
       {"moe-profile", "paths --path-length 1 --force -o " + (dir / "paths.json"), false}});
}

TEST_CASE("cli: damaged checkpoints of earlier builds give a clean error where libhdf5 crashed",
          "[cli][hdf5]") {
  Trained& t = trained();
  auto r = run_command(tool("moe-convert", "inspect --verify " + t.old_format));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);  // the old format still reads: inspected, resumed and scored
  test::ScratchDir dir("cli-hdf5-old");
  auto resumed = run_command(tool("moe-train", "--data " + test::fortunes_path("linux") +
                                                   " --resume " + t.old_format + " --out " +
                                                   dir.path() + " --steps 3 --threads 1 -q"));
  INFO(resumed.err);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE(io::load_checkpoint(dir / "last.h5").state.step == 3);
  auto scored = run_command(tool("moe-infer", "score -q --data " + test::fortunes_path("linux") +
                                                  " --max-sequences 4 --model " + t.old_format));
  INFO(scored.err);
  REQUIRE(scored.exit_code == 0);
  // Global heap (variable-length strings), dense link tables (fractal heap), B-trees.
  require_clean_refusals(
      t.old_format, {"GCOL", "FHDB", "FRHP", "BTHD", "BTLF", "OHDR"},
      {{"moe-convert", "inspect --verify", true},
       {"moe-train", "--data " + test::fortunes_path("linux") + " --resume", true},
       {"moe-infer", "score --data " + test::fortunes_path("linux") + " --max-sequences 4 --model",
        false}});
}

TEST_CASE("cli: damaged link tables of groups without a creation-order index give a clean error",
          "[cli][hdf5]") {
  // libhdf5 lists such a group through its table of links, whose builder crashed on a damaged
  // heap (issue 45: free(): invalid pointer, SIGSEGV in moe-train --resume and inspect).
  Trained& t = trained();
  auto r = run_command(tool("moe-convert", "inspect --verify " + t.old_unindexed));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // The same tensors, listed in the same (creation) order as the indexed file's; the first line
  // names the file.
  auto without_name = [](const std::string& out) { return out.substr(out.find('\n')); };
  REQUIRE(without_name(r.out) ==
          without_name(run_command(tool("moe-convert", "inspect --verify " + t.old_format)).out));
  const std::vector<Damage> damage = dense_link_damages(test::read_file(t.old_unindexed));
  REQUIRE(damage.size() >= 40);
  require_clean_refusals(
      t.old_unindexed, damage,
      {{"moe-convert", "inspect --verify", true},
       {"moe-train", "--data " + test::fortunes_path("linux") + " --resume", true}});
}

TEST_CASE("cli: every HDF5 writer on a full file system exits 1 and leaves nothing behind",
          "[cli][hdf5]") {
  Trained& t = trained();
  test::ScratchDir dir("cli-hdf5-full");
  // The file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored) makes write() fail with EFBIG at
  // that size, exactly where a full disk fails it with ENOSPC: the same failed write reaches
  // HDF5 at the same point. 64 KiB: past the first metadata, before the end of every file.
  const std::string limit = "ulimit -f 128; trap '' XFSZ; ";  // 512-byte blocks (POSIX sh)
  const std::string data = test::fortunes_path("linux");
  struct Writer {
    std::string name, args, output;
  };
  const std::vector<Writer> writers = {
      {"moe-train", "--data " + data + " --out " + (dir / "train") + kTiny, dir / "train"},
      {"moe-convert", "freeze " + t.ckpt + " -o " + (dir / "frozen.h5"), dir / "frozen.h5"},
      {"moe-convert", "dtype " + t.ckpt + " --to bf16 -o " + (dir / "bf16.h5"), dir / "bf16.h5"},
      {"moe-convert", "partition " + t.ckpt + " --ranks 2 -o " + (dir / "parts"), dir / "parts"},
      {"moe-profile",
       "record -q --model " + t.ckpt + " --data " + data + " --max-tokens 65536 -o " +
           (dir / "trace.h5"),
       dir / "trace.h5"},
  };
  for (const Writer& w : writers) {
    auto r = run_command(limit + tool(w.name, w.args));
    INFO(w.name << " " << w.args << ": exit " << r.exit_code << "\n" << r.err);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.err.rfind(w.name + ": error: ", 0) == 0);
    REQUIRE_THAT(r.err, Catch::Contains("File too large"));
    // No output, no temporary file (a training run's directory holds no checkpoint).
    if (w.name == "moe-train") {
      for (const auto& e : fs::directory_iterator(w.output)) REQUIRE(e.path().extension() != ".h5");
    } else {
      REQUIRE_FALSE(fs::exists(w.output));
    }
    for (const auto& e : fs::directory_iterator(dir.path()))
      REQUIRE(e.path().filename().string().find(".tmp-") == std::string::npos);
    // Without the limit the same command succeeds: the limit, not the command, failed it.
    auto ok = run_command(tool(w.name, w.args));
    INFO(ok.err);
    REQUIRE(ok.exit_code == 0);
    fs::remove_all(w.output);
  }
}

TEST_CASE("cli: moe-convert inspect --verify refuses what moe-train --resume refuses",
          "[cli][hdf5][convert]") {
  Trained& t = trained();
  test::ScratchDir dir("cli-hdf5-verify");
  const io::Checkpoint good = io::load_checkpoint(t.ckpt);
  struct Case {
    std::string name, expected;
    std::function<void(io::Checkpoint&)> edit;
  };
  const std::vector<Case> cases = {
      {"deleted", "parameter 'blocks.1.moe.router.weight' is missing",
       [](io::Checkpoint& c) {
         c.params.erase(std::find_if(c.params.begin(), c.params.end(), [](const auto& nt) {
           return nt.name == "blocks.1.moe.router.weight";
         }));
       }},
      {"extra", "checkpoint tensor 'blocks.9.extra' is not a parameter of this model",
       [](io::Checkpoint& c) {
         c.params.push_back({"blocks.9.extra", c.params.front().tensor, false});
       }},
      {"reshaped", "does not match parameter",
       [](io::Checkpoint& c) {
         io::NamedTensor& nt = c.params.front();
         nt.tensor = nt.tensor.reshape({nt.tensor.numel()});
       }},
      {"optim-reshaped", "optimizer state",
       [](io::Checkpoint& c) {
         io::NamedTensor& nt = c.optim.back();
         nt.tensor = nt.tensor.reshape({nt.tensor.numel()});
       }},
  };
  for (const Case& k : cases) {
    const std::string path = dir / (k.name + ".h5");
    io::Checkpoint c = good;
    k.edit(c);
    io::save_checkpoint(path, c);
    auto v = run_command(tool("moe-convert", "inspect --verify " + path));
    INFO(k.name << ": " << v.err);
    REQUIRE(v.exit_code == 1);
    REQUIRE(v.err.rfind("moe-convert: error: ", 0) == 0);
    REQUIRE_THAT(v.err, Catch::Contains(k.expected) && Catch::Contains(path));
    // Without --verify the file is only described (metadata is fine).
    REQUIRE(run_command(tool("moe-convert", "inspect " + path)).exit_code == 0);
    // And the trainer refuses it for the same reason.
    auto r = run_command(tool("moe-train", "--data " + test::fortunes_path("linux") + " --resume " +
                                               path + " --out " + (dir / k.name) +
                                               " --steps 3 --threads 1 -q"));
    INFO(r.err);
    REQUIRE(r.exit_code == 1);
    REQUIRE_THAT(r.err, Catch::Contains(k.expected));
  }
  // The untouched checkpoint, and a frozen one (no optimizer state: an inference checkpoint).
  REQUIRE(run_command(tool("moe-convert", "inspect --verify " + t.ckpt)).exit_code == 0);
  const std::string frozen = dir / "frozen.h5";
  REQUIRE(run_command(tool("moe-convert", "freeze " + t.ckpt + " -o " + frozen)).exit_code == 0);
  auto f = run_command(tool("moe-convert", "inspect --verify " + frozen));
  INFO(f.err);
  REQUIRE(f.exit_code == 0);
}
