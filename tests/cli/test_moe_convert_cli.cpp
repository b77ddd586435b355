// moe-convert as a user runs it, on models moe-train just trained: inspect (TSV and JSON), freeze
// giving moe-infer the same scores, dtype, partition -> merge identity with and without a trace
// from moe-profile, a real sharded checkpoint from `mpiexec -n 2 moe-train --ep 2` merged and
// re-partitioned into the trainer's own files (and resumed), and the errors with their exit codes.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moe/io/checkpoint.h"
#include "support/run.h"

using namespace moe;
using test::fields;
using test::lines_of;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

const std::string kTiny = test::kTinyMixtral + " --steps 3";

// A tiny mixtral model trained for 3 steps (trained once for the tests below).
struct Trained {
  test::ScratchDir dir{"cli-convert"};
  std::string ckpt;
  Trained() { ckpt = test::train_on_fortunes(dir / "run", kTiny); }
};

Trained& trained() {
  static Trained t;
  return t;
}

// Parameters and optimizer state of two checkpoint files are the same bytes, names and shards.
void require_same_checkpoint_tensors(const std::string& a, const std::string& b) {
  INFO(a << " vs " << b);
  io::Checkpoint x = io::load_checkpoint(a), y = io::load_checkpoint(b);
  for (auto group : {&io::Checkpoint::params, &io::Checkpoint::optim}) {
    const auto& p = x.*group;
    const auto& q = y.*group;
    REQUIRE(p.size() == q.size());
    for (size_t i = 0; i < p.size(); ++i) {
      INFO(p[i].name);
      REQUIRE(p[i].name == q[i].name);
      REQUIRE(p[i].expert == q[i].expert);
      REQUIRE(p[i].shard.global == q[i].shard.global);
      REQUIRE(p[i].shard.start == q[i].shard.start);
      REQUIRE(p[i].tensor.dtype() == q[i].tensor.dtype());
      REQUIRE(p[i].tensor.shape() == q[i].tensor.shape());
      REQUIRE(std::memcmp(p[i].tensor.raw(), q[i].tensor.raw(), p[i].tensor.nbytes()) == 0);
    }
  }
}

}  // namespace

TEST_CASE("cli: moe-convert inspect prints config, tensors, counts and provenance",
          "[cli][convert]") {
  Trained& t = trained();
  auto r = run_command(tool("moe-convert", "inspect " + t.ckpt));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> rows = lines_of(r.out);
  size_t header = 0;
  while (header < rows.size() && rows[header].rfind("#", 0) == 0) ++header;
  REQUIRE(header < rows.size());
  REQUIRE(fields(rows[header]) == std::vector<std::string>{"group", "name", "dtype", "shape",
                                                           "bytes", "expert", "rank", "shard",
                                                           "chunk", "checksum"});
  io::Checkpoint c = io::load_checkpoint(t.ckpt);
  REQUIRE(rows.size() - header - 1 == c.params.size() + c.optim.size());
  REQUIRE(r.out.find("# producer\tmoe-train") != std::string::npos);
  REQUIRE(r.out.find("\"arch\":\"mixtral\"") != std::string::npos);
  for (size_t i = header + 1; i < rows.size(); ++i) {
    std::vector<std::string> f = fields(rows[i]);
    REQUIRE(f.size() == 10);
    if (f[1] == "blocks.0.moe.experts.w1") {
      REQUIRE(f[3] == "4x32x16");
      REQUIRE(f[4] == "8192");
      REQUIRE(f[5] == "1");
      REQUIRE(f[8] == "1x32x16");  // one chunk per expert
    }
  }
  auto js = run_command(tool("moe-convert", "inspect --json --verify " + t.ckpt));
  INFO(js.err);
  REQUIRE(js.exit_code == 0);
  nlohmann::json j = nlohmann::json::parse(js.out);
  REQUIRE(j["verified"] == true);
  REQUIRE(j["tensors"].size() == c.params.size() + c.optim.size());
  REQUIRE(j["params_active_per_token"].get<int64_t>() < j["params_total"].get<int64_t>());
  REQUIRE(j["files"][0]["state"]["step"] == 3);
  REQUIRE(r.out.find("# params_total\t" + std::to_string(j["params_total"].get<int64_t>())) !=
          std::string::npos);
}

TEST_CASE("cli: moe-convert freeze gives moe-infer the same scores, dtype bf16 stays close",
          "[cli][convert]") {
  Trained& t = trained();
  const std::string frozen = t.dir / "frozen.h5", bf16 = t.dir / "bf16.h5";
  auto r = run_command(tool("moe-convert", "freeze " + t.ckpt + " -o " + frozen));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  io::Checkpoint f = io::load_checkpoint(frozen);
  REQUIRE(f.optim.empty());
  REQUIRE(f.provenance.tool == "moe-convert");
  REQUIRE(f.provenance.argv.find("freeze") != std::string::npos);
  auto info = run_command(tool("moe-convert", "inspect " + frozen));
  REQUIRE(info.out.find("# converted from\tmoe-train") != std::string::npos);

  const std::string data = " --data " + test::fortunes_path("computers") + " --max-sequences 24";
  auto a = run_command(tool("moe-infer", "score -q --model " + t.ckpt + data));
  auto b = run_command(tool("moe-infer", "score -q --model " + frozen + data));
  INFO(a.err << b.err);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  REQUIRE(lines_of(a.out).size() == 24);
  REQUIRE(a.out == b.out);
  // The ring loader streams the frozen file's experts (expert-major, a layer one extent) to the
  // same scores; inspect says so.
  auto ring = run_command(
      tool("moe-infer", "score -q --model " + frozen + data + " --expert-budget 50% --threads 1"));
  INFO(ring.err);
  REQUIRE(ring.exit_code == 0);
  REQUIRE(ring.out == a.out);
  REQUIRE(info.out.find("one extent\teach expert one run") != std::string::npos);

  auto d = run_command(tool("moe-convert", "dtype " + t.ckpt + " --to bf16 -o " + bf16));
  INFO(d.err);
  REQUIRE(d.exit_code == 0);
  io::Checkpoint h = io::load_checkpoint(bf16);
  REQUIRE(h.model_config["dtype"] == "bf16");
  for (const io::NamedTensor& nt : h.params) REQUIRE(nt.tensor.dtype() == DType::bf16);
  auto s = run_command(tool("moe-infer", "score -q --model " + bf16 + data));
  REQUIRE(s.exit_code == 0);
  std::vector<std::string> la = lines_of(a.out), ls = lines_of(s.out);
  REQUIRE(la.size() == ls.size());
  for (size_t i = 0; i < la.size(); ++i) {
    const double x = nlohmann::json::parse(la[i])["nll_mean"],
                 y = nlohmann::json::parse(ls[i])["nll_mean"];
    REQUIRE(y == Approx(x).epsilon(2e-2));  // bf16 parameters and activations
  }
}

TEST_CASE("cli: moe-convert partition then merge is the identity, with and without a trace",
          "[cli][convert]") {
  Trained& t = trained();
  const std::string trace = t.dir / "trace.h5";
  auto rec = run_command(tool("moe-profile", "record -q --model " + t.ckpt + " --data " +
                                                 test::fortunes_path("computers") +
                                                 " --max-tokens 2048 -o " + trace));
  INFO(rec.err);
  REQUIRE(rec.exit_code == 0);
  for (bool with_trace : {false, true}) {
    INFO("trace " << with_trace);
    const std::string parts = t.dir / (with_trace ? "lpt" : "contiguous");
    const std::string merged = parts + ".h5";
    auto p = run_command(tool("moe-convert", "partition " + t.ckpt + " --ranks 2 -o " + parts +
                                                 (with_trace ? " --trace " + trace : "")));
    INFO(p.err);
    REQUIRE(p.exit_code == 0);
    REQUIRE(fs::exists(parts + "/rank-00000.h5"));
    REQUIRE(fs::exists(parts + "/rank-00001.h5"));
    if (with_trace) {
      std::vector<std::string> rows = lines_of(p.out);
      REQUIRE(rows.size() == 3);  // header + 2 MoE layers
      REQUIRE(fields(rows[0])[5] == "lpt_max_over_mean");
      io::Checkpoint r0 = io::load_checkpoint(parts + "/rank-00000.h5", false);
      REQUIRE(r0.sharding.expert_rank.size() == 8);
      for (size_t l = 1; l < rows.size(); ++l) {
        std::vector<std::string> f = fields(rows[l]);
        REQUIRE(f.size() == 9);
        REQUIRE(f[4] == "4096");                             // every choice of 2048 tokens, top-2
        REQUIRE(std::stod(f[5]) >= 1.0);                     // LPT
        REQUIRE(std::stod(f[5]) <= std::stod(f[6]) + 1e-9);  // never worse than contiguous here
        std::string map;
        for (size_t e = 0; e < 4; ++e) {
          if (e) map += ',';
          map += std::to_string(r0.sharding.expert_rank[(l - 1) * 4 + e]);
        }
        REQUIRE(f[8] == map);  // the map printed is the map recorded
      }
    } else {
      REQUIRE(p.out.empty());
    }
    auto m = run_command(tool("moe-convert", "merge " + parts + " -o " + merged));
    INFO(m.err);
    REQUIRE(m.exit_code == 0);
    require_same_checkpoint_tensors(t.ckpt, merged);
    // The rank files listed one by one work too.
    auto m2 = run_command(tool("moe-convert", "merge " + parts + "/rank-00001.h5 " + parts +
                                                  "/rank-00000.h5 --force -o " + merged));
    REQUIRE(m2.exit_code == 0);
    require_same_checkpoint_tensors(t.ckpt, merged);
  }
  // An existing output directory is kept unless --force.
  auto again = run_command(
      tool("moe-convert", "partition " + t.ckpt + " --ranks 2 -o " + (t.dir / "contiguous")));
  REQUIRE(again.exit_code == 1);
  REQUIRE(again.err.find("already exists") != std::string::npos);
  auto forced = run_command(tool(
      "moe-convert", "partition " + t.ckpt + " --ranks 2 --force -o " + (t.dir / "contiguous")));
  REQUIRE(forced.exit_code == 0);
}

TEST_CASE(
    "cli: moe-convert merges a real --ep 2 checkpoint, partition rebuilds the trainer's files",
    "[cli][convert]") {
  if (run_command("command -v mpiexec").exit_code != 0) {
    WARN("mpiexec not found: the real sharded checkpoint part is skipped");
    return;
  }
  test::ScratchDir dir("cli-convert-ep");
  auto r = run_command("OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 " +
                       tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " +
                                             (dir / "ep") + kTiny + " --ep 2 --shard-embedding"));
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const std::string step = dir / "ep/step-00000003";
  auto m = run_command(tool("moe-convert", "merge " + (dir / "ep") + " -o " + (dir / "whole.h5")));
  INFO(m.err);
  REQUIRE(m.exit_code == 0);
  auto p = run_command(tool("moe-convert", "partition " + (dir / "whole.h5") +
                                               " --ranks 2 --shard-embedding -o " + (dir / "re")));
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  for (const char* file : {"/rank-00000.h5", "/rank-00001.h5"})
    require_same_checkpoint_tensors(step + file, (dir / "re") + file);
  // The trainer resumes the partitioned directory on 2 ranks (its ep and shard_embedding come
  // from the files) and one process resumes the merged file.
  auto resumed = run_command("OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 " +
                             tool("moe-train", "--resume " + (dir / "re") + " --out " +
                                                   (dir / "ep2") + " --steps 4 --threads 1 -q"));
  INFO(resumed.out << resumed.err);
  REQUIRE(resumed.exit_code == 0);
  REQUIRE(fs::exists(dir / "ep2/step-00000004/rank-00001.h5"));
  auto single = run_command(tool("moe-train", "--resume " + (dir / "whole.h5") + " --out " +
                                                  (dir / "one") + " --steps 4 --threads 1 -q"));
  INFO(single.err);
  REQUIRE(single.exit_code == 0);
  REQUIRE(fs::exists(dir / "one/step-00000004.h5"));
  // Freeze reads the sharded directory directly (merged on the way).
  auto fr = run_command(tool("moe-convert", "freeze " + step + " -o " + (dir / "frozen.h5")));
  REQUIRE(fr.exit_code == 0);
}

TEST_CASE("cli: moe-train resumes experts placed by load (moe-convert partition --trace)",
          "[cli][convert]") {
  if (run_command("command -v mpiexec").exit_code != 0) {
    WARN("mpiexec not found: skipped");
    return;
  }
  Trained& t = trained();
  test::ScratchDir dir("cli-convert-placed");
  auto rec = run_command(tool("moe-profile", "record -q --model " + t.ckpt + " --data " +
                                                 test::fortunes_path("computers") +
                                                 " --max-tokens 2048 -o " + (dir / "trace.h5")));
  REQUIRE(rec.exit_code == 0);
  auto p = run_command(tool("moe-convert", "partition -q " + t.ckpt + " --ranks 2 --trace " +
                                               (dir / "trace.h5") + " -o " + (dir / "placed")));
  INFO(p.err);
  REQUIRE(p.exit_code == 0);
  // The trainer holds experts contiguously, so a placement by load is re-sharded on load (merged
  // in memory): the run goes on exactly as from the whole file it was cut from.
  auto resume = [&](const std::string& from, const std::string& out) {
    return run_command("OMP_NUM_THREADS=1 timeout 120 mpiexec -n 2 " +
                       tool("moe-train", "--resume " + from + " --out " + out +
                                             " --ep 2 --steps 4 --threads 1 -q"));
  };
  auto placed = resume(dir / "placed", dir / "from-placed");
  INFO(placed.out << placed.err);
  REQUIRE(placed.exit_code == 0);
  auto whole = resume(t.ckpt, dir / "from-whole");
  INFO(whole.out << whole.err);
  REQUIRE(whole.exit_code == 0);
  for (const char* file : {"rank-00000.h5", "rank-00001.h5"})
    for (const char* group : {"/params", "/optim"}) {
      auto diff = run_command("h5diff " + (dir / "from-placed/step-00000004/") + file + " " +
                              (dir / "from-whole/step-00000004/") + file + " " + group + " " +
                              group);
      INFO(file << " " << group << ": " << diff.out << diff.err);
      REQUIRE(diff.exit_code == 0);
    }
}

TEST_CASE("cli: moe-convert errors: missing, foreign, damaged, mismatched inputs and bad usage",
          "[cli][convert]") {
  Trained& t = trained();
  test::ScratchDir dir("cli-convert-errors");
  auto expect = [](const test::RunResult& r, int code, const std::string& text) {
    INFO(r.err);
    REQUIRE(r.exit_code == code);
    REQUIRE(r.err.rfind("moe-convert: error: ", 0) == 0);
    REQUIRE(r.err.find(text) != std::string::npos);
    REQUIRE(r.out.empty());
  };
  expect(run_command(tool("moe-convert", "inspect " + (dir / "none.h5"))), 1,
         "no such file or directory");
  test::write_file(dir / "text.h5", "just some text, not HDF5\n");
  expect(run_command(tool("moe-convert", "inspect " + (dir / "text.h5"))), 1, "not an HDF5 file");
  expect(
      run_command(tool("moe-convert", "freeze " + (dir / "text.h5") + " -o " + (dir / "out.h5"))),
      1, "text.h5");
  REQUIRE_FALSE(fs::exists(dir / "out.h5"));

  // A sharded directory with a shard missing, then with a damaged shard.
  auto p = run_command(
      tool("moe-convert", "partition -q " + t.ckpt + " --ranks 4 -o " + (dir / "shards")));
  REQUIRE(p.exit_code == 0);
  fs::rename(dir / "shards/rank-00002.h5", dir / "rank-00002.h5");
  expect(run_command(tool("moe-convert", "merge " + (dir / "shards") + " -o " + (dir / "m.h5"))), 1,
         "missing shard: rank 2's file (rank-00002.h5)");
  std::string bytes = test::read_file(dir / "rank-00002.h5");
  test::write_file(dir / "shards/rank-00002.h5", bytes.substr(0, bytes.size() - 4096));
  expect(run_command(tool("moe-convert", "merge " + (dir / "shards") + " -o " + (dir / "m.h5"))), 1,
         "rank-00002.h5");
  // A shard of another run: same layout, other model.
  auto other = run_command(
      tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " + (dir / "other") +
                            " --arch mixtral --layers 2 --d-model 16 --heads 2 --kv-heads 1"
                            " --d-ff 64 --seq 16 --experts 4 --moe-every 1 --batch 4"
                            " --eval-batches 1 --steps 3 --threads 1 -q"));
  REQUIRE(other.exit_code == 0);
  REQUIRE(run_command(tool("moe-convert", "partition -q " + (dir / "other/last.h5") +
                                              " --ranks 4 -o " + (dir / "other-shards")))
              .exit_code == 0);
  fs::copy_file(dir / "other-shards/rank-00002.h5", dir / "shards/rank-00002.h5",
                fs::copy_options::overwrite_existing);
  expect(run_command(tool("moe-convert", "merge " + (dir / "shards") + " -o " + (dir / "m.h5"))), 1,
         "model_config differs");
  REQUIRE_FALSE(fs::exists(dir / "m.h5"));

  // A trace of another model.
  auto rec = run_command(tool("moe-profile", "record -q --model " + (dir / "other/last.h5") +
                                                 " --data " + test::fortunes_path("computers") +
                                                 " --max-tokens 256 -o " + (dir / "t.h5")));
  REQUIRE(rec.exit_code == 0);
  auto gpt = run_command(tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " +
                                               (dir / "gpt") +
                                               " --layers 2 --d-model 16 --heads 2 --d-ff 32"
                                               " --seq 16 --experts 2 --moe-every 1 --batch 4"
                                               " --eval-batches 1 --steps 1 --threads 1 -q"));
  REQUIRE(gpt.exit_code == 0);
  expect(
      run_command(tool("moe-convert", "partition " + (dir / "gpt/last.h5") + " --ranks 2 --trace " +
                                          (dir / "t.h5") + " -o " + (dir / "p"))),
      1, "does not come from this model");
  REQUIRE_FALSE(fs::exists(dir / "p"));

  // Usage errors: exit 2.
  expect(run_command(tool("moe-convert", "freeze " + t.ckpt)), 2, "--out");
  expect(run_command(tool("moe-convert", "dtype " + t.ckpt + " --to f64 -o x.h5")), 2, "--to");
  expect(run_command(tool("moe-convert", "partition " + t.ckpt + " --ranks 3 -o " + (dir / "p3"))),
         2, "3 ranks do not divide a layer of 4 experts");
  expect(run_command(tool("moe-convert", "freeze " + t.ckpt + " -o -")), 2, "stdout");
  expect(run_command(tool("moe-convert", "")), 2, "subcommand");
  auto help = run_command(tool("moe-convert", "--help"));
  REQUIRE(help.exit_code == 0);
  REQUIRE(help.out.find("partition") != std::string::npos);
  auto version = run_command(tool("moe-convert", "--version"));
  REQUIRE(version.exit_code == 0);
  REQUIRE(version.out.rfind("moe-convert ", 0) == 0);
}

TEST_CASE(
    "cli: moe-convert export-hf then import-hf scores the same, and refuses what it cannot map",
    "[cli][convert][hf]") {
  Trained& t = trained();
  const std::string hf = t.dir / "hf", back = t.dir / "from-hf.h5";
  fs::remove_all(hf);
  auto e = run_command(tool("moe-convert", "export-hf " + t.ckpt + " -o " + hf));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  REQUIRE(fs::exists(fs::path(hf) / "config.json"));
  REQUIRE(fs::exists(fs::path(hf) / "model.safetensors"));
  auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + back));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  REQUIRE(i.err.find("imported a mixtral checkpoint") != std::string::npos);
  const std::string data = " --data " + test::fortunes_path("computers") + " --max-sequences 16";
  auto a = run_command(tool("moe-infer", "score -q --model " + t.ckpt + data));
  auto b = run_command(tool("moe-infer", "score -q --model " + back + data));
  INFO(a.err << b.err);
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  REQUIRE(lines_of(a.out).size() == 16);
  REQUIRE(a.out == b.out);  // every parameter came back bitwise
  // A directory without config.json, and an export into a file that is not a directory.
  auto missing =
      run_command(tool("moe-convert", "import-hf " + (t.dir / "nowhere") + " --force -o " + back));
  REQUIRE(missing.exit_code == 1);
  REQUIRE(missing.err.find("moe-convert: error:") != std::string::npos);
}

TEST_CASE(
    "cli: moe-convert never replaces what is not a regular file, nor an existing file "
    "without --force",
    "[cli][convert][out]") {
  Trained& t = trained();
  test::ScratchDir dir("cli-convert-outputs");
  const std::string fifo = dir / "fifo", link = dir / "link.h5", sub = dir / "sub";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  test::write_file(dir / "target.h5", "the link's target");
  fs::create_symlink("target.h5", link);
  fs::create_directory(sub);
  // A FIFO, a symbolic link and a directory stand in for device nodes such as /dev/full: a
  // rename over them would replace the node itself.
  for (const std::string& command :
       {"freeze " + t.ckpt + " -o " + fifo, "dtype " + t.ckpt + " --to bf16 --force -o " + fifo,
        "freeze " + t.ckpt + " --force -o " + link, "merge " + t.ckpt + " --force -o " + sub}) {
    INFO(command);
    auto r = run_command(tool("moe-convert", command));
    INFO(r.err);
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.err.rfind("moe-convert: error: '", 0) == 0);
    REQUIRE(r.err.find("not a regular file: refusing to replace it") != std::string::npos);
  }
  REQUIRE(fs::is_fifo(fs::symlink_status(fifo)));
  REQUIRE(fs::is_symlink(fs::symlink_status(link)));
  REQUIRE(test::read_file(dir / "target.h5") == "the link's target");
  REQUIRE(fs::is_directory(sub));
  REQUIRE(fs::is_empty(sub));
  // An existing regular file is replaced only with --force, as partition's output directory.
  const std::string existing = dir / "existing.h5";
  test::write_file(existing, "keep me");
  for (const std::string& command :
       {"freeze " + t.ckpt + " -o " + existing, "dtype " + t.ckpt + " --to bf16 -o " + existing,
        "merge " + t.ckpt + " -o " + existing}) {
    INFO(command);
    auto r = run_command(tool("moe-convert", command));
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.err.find("'" + existing + "' already exists; remove it or pass --force") !=
            std::string::npos);
    REQUIRE(test::read_file(existing) == "keep me");
  }
  auto forced = run_command(tool("moe-convert", "freeze -q " + t.ckpt + " --force -o " + existing));
  INFO(forced.err);
  REQUIRE(forced.exit_code == 0);
  REQUIRE(io::load_checkpoint(existing, false).params.size() > 0);
}
