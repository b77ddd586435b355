// Garbage in is refused, loudly, by every tool (issue 14): numeric flags that are not finite or
// out of range, non-finite weights in checkpoints and safetensors, prompt fields that are not
// integers, damaged traces and path tables, and a training run that diverges. Each case: a clean
// "moe-<tool>: error: ..." naming the flag, file, line or tensor; exit 1 (2 for usage errors);
// nothing written.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "moe/io/checkpoint.h"
#include "moe/io/hdf5.h"
#include "moe/io/safetensors.h"
#include "support/run.h"

using namespace moe;
using test::run_command;
using test::tool;
namespace fs = std::filesystem;

namespace {

// A tiny mixtral model, trained once for the cases below.
struct Trained {
  test::ScratchDir dir{"cli-validation"};
  std::string ckpt;
  Trained() { ckpt = test::train_on_fortunes(dir / "run", test::kTinyMixtral + " --steps 2"); }
};

Trained& trained() {
  static Trained t;
  return t;
}

void expect_error(const test::RunResult& r, const std::string& tool_name, int code,
                  const std::vector<std::string>& needles) {
  INFO(r.err);
  REQUIRE(r.exit_code == code);
  REQUIRE(r.err.find(tool_name + ": error: ") != std::string::npos);
  for (const std::string& n : needles) REQUIRE(r.err.find(n) != std::string::npos);
  REQUIRE(r.err.find("terminate") == std::string::npos);
  REQUIRE(r.err.find("bad_alloc") == std::string::npos);
}

}  // namespace

TEST_CASE("cli: numeric flags must be finite and in range, in every tool", "[cli][validation]") {
  Trained& t = trained();
  test::ScratchDir dir("cli-validation-flags");
  const std::string train = "--data " + test::fortunes_path("linux") + " --out " + (dir / "run") +
                            test::kTinyModel + " --steps 1 ";
  struct Case {
    std::string tool, args, message;
  };
  const std::vector<Case> cases = {
      {"moe-train", train + "--lr inf", "--lr: must be a finite number, got inf"},
      {"moe-train", train + "--lr nan", "--lr: must be a finite number, got nan"},
      {"moe-train", train + "--lr 1e999", "--lr: must be a finite number"},
      {"moe-train", train + "--lr -0.1", "--lr: must be > 0, got -0.1"},
      {"moe-train", train + "--lr 0", "--lr: must be > 0, got 0"},
      {"moe-train", train + "--clip -1", "--clip must be a finite number >= 0"},
      {"moe-train", train + "--weight-decay -0.5", "--weight-decay must be a finite number >= 0"},
      {"moe-train", train + "--min-lr-ratio 1.5", "--min-lr-ratio must be in [0, 1]"},
      {"moe-train", train + "--capacity-factor inf", "--capacity-factor: must be a finite number"},
      {"moe-train", train + "--aux-loss-coef -inf", "--aux-loss-coef: must be a finite number"},
      {"moe-train", train + "--rope-theta 0 --arch mixtral", "--rope-theta must be a finite"},
      {"moe-train", train + "--threads 1000000", "--threads: at most"},
      {"moe-train", train + "--threads -1", "--threads: must be >= 0"},
      {"moe-infer", "generate --model " + t.ckpt + " --prompts - --temperature inf",
       "--temperature: must be a finite number"},
      {"moe-infer", "generate --model " + t.ckpt + " --prompts - --top-p nan",
       "--top-p: must be a finite number"},
      {"moe-profile", "record --model " + t.ckpt + " --data x -o y --threads 99999",
       "--threads: at most"},
  };
  for (const Case& c : cases) {
    INFO(c.tool << " " << c.args);
    expect_error(run_command(tool(c.tool, c.args) + " </dev/null"), c.tool, 2, {c.message});
    REQUIRE_FALSE(fs::exists(dir / "run"));
  }
  // A --config file goes through the same checks.
  test::write_file(dir / "bad.toml", "lr = inf\n");
  expect_error(run_command(tool("moe-train", train + "--config " + (dir / "bad.toml"))),
               "moe-train", 2, {"--lr: must be a finite number"});
  REQUIRE_FALSE(fs::exists(dir / "run"));
}

TEST_CASE("cli: integers beyond their flag's range are refused, never clamped",
          "[cli][validation]") {
  // Issue 45: 99999999999999999999 became 2^63 - 1 (31 flags), --seed -1 became 2^64 - 1.
  Trained& t = trained();
  test::ScratchDir dir("cli-validation-integers");
  const std::string train = "--data " + test::fortunes_path("linux") + " --out " + (dir / "run") +
                            test::kTinyModel + " --steps 1 ";
  const std::string huge = "99999999999999999999";
  const std::string int64_range = "-9223372036854775808..9223372036854775807";
  const std::string uint64_range = "0..18446744073709551615";
  struct Case {
    std::string tool, args, flag, range;
  };
  const std::vector<Case> cases = {
      {"moe-train", train + "--steps " + huge, "--steps", int64_range},
      {"moe-train", train + "--layers " + huge, "--layers", int64_range},
      {"moe-train", train + "--batch -" + huge, "--batch", int64_range},
      {"moe-train", train + "--experts-per-layer 0," + huge, "--experts-per-layer", int64_range},
      {"moe-train", train + "--seed -1", "--seed", uint64_range},
      {"moe-train", train + "--seed 18446744073709551616", "--seed", uint64_range},
      {"moe-infer", "score --model " + t.ckpt + " --data x --max-sequences " + huge,
       "--max-sequences", int64_range},
      {"moe-infer", "generate --model " + t.ckpt + " --prompts - --seed -7", "--seed",
       uint64_range},
      {"moe-profile", "record --model " + t.ckpt + " --data x -o y --max-tokens " + huge,
       "--max-tokens", int64_range},
      {"moe-distill", "--teacher " + t.ckpt + " --data x -o y --steps " + huge, "--steps",
       int64_range},
  };
  for (const Case& c : cases) {
    INFO(c.tool << " " << c.args);
    expect_error(run_command(tool(c.tool, c.args) + " </dev/null"), c.tool, 2,
                 {c.flag + ": must be an integer in " + c.range + ", got "});
    REQUIRE_FALSE(fs::exists(dir / "run"));
  }
  // A --config file goes through the same check; the largest values still parse.
  test::write_file(dir / "bad.toml", "warmup = " + huge + "\n");
  expect_error(run_command(tool("moe-train", train + "--config " + (dir / "bad.toml"))),
               "moe-train", 2, {"--warmup: must be an integer in " + int64_range});
  auto largest = run_command(
      tool("moe-train", train + "--seed 18446744073709551615 --eval-every 9223372036854775807"));
  INFO(largest.err);
  REQUIRE(largest.exit_code == 0);
}

TEST_CASE("cli: a run whose update makes a parameter non-finite stops and saves nothing",
          "[cli][validation]") {
  test::ScratchDir dir("cli-validation-diverge");
  // The largest finite float as --lr with no warmup: the first update overflows.
  auto r = run_command(tool("moe-train", "--data " + test::fortunes_path("linux") + " --out " +
                                             dir.path() + test::kTinyModel +
                                             " --steps 1 --warmup 0 --lr 3.4e38"));
  expect_error(r, "moe-train", 1,
               {"step 1, after the update (the run diverged", "tensor '", "has exploded"});
  REQUIRE_FALSE(fs::exists(dir / "step-00000001.h5"));
  REQUIRE_FALSE(fs::exists(dir / "last.h5"));
}

TEST_CASE("cli: non-finite weights are refused at load, naming the tensor", "[cli][validation]") {
  Trained& t = trained();
  test::ScratchDir dir("cli-validation-nan");
  io::Checkpoint c = io::load_checkpoint(t.ckpt);
  io::NamedTensor* victim = nullptr;
  for (io::NamedTensor& nt : c.params)
    if (nt.tensor.dtype() == DType::f32 && nt.tensor.numel() > 5) victim = &nt;
  REQUIRE(victim);
  victim->tensor.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  const std::string bad = dir / "nan.h5";
  io::save_checkpoint(bad, c);  // the file layer stores any bits; the loaders judge them
  const std::string named = "tensor '" + victim->name + "' holds a non-finite value (NaN";
  const std::string data = " --data " + test::fortunes_path("computers") + " --max-sequences 2";
  expect_error(run_command(tool("moe-infer", "score --model " + bad + data)), "moe-infer", 1,
               {bad, named});
  expect_error(run_command(tool("moe-infer", "score --model " + bad + data + " --expert-budget 4")),
               "moe-infer", 1, {bad, named});
  expect_error(run_command(tool("moe-train",
                                "--resume " + bad + " --out " + (dir / "resumed") + " --steps 3")),
               "moe-train", 1, {"checkpoint to resume", named});
  REQUIRE_FALSE(fs::exists(dir / "resumed/step-00000003.h5"));
  // inspect --verify makes the loaders' checks, this one too.
  expect_error(run_command(tool("moe-convert", "inspect --verify " + bad)), "moe-convert", 1,
               {named});

  // moe-convert writes no checkpoint from it, whatever the conversion.
  for (const std::string& command : {"freeze " + bad + " -o " + (dir / "out.h5"),
                                     "dtype " + bad + " --to bf16 -o " + (dir / "out.h5"),
                                     "partition " + bad + " --ranks 2 -o " + (dir / "parts"),
                                     "export-hf " + bad + " -o " + (dir / "hf-out")}) {
    INFO(command);
    expect_error(run_command(tool("moe-convert", command)), "moe-convert", 1, {named});
    REQUIRE_FALSE(fs::exists(dir / "out.h5"));
    REQUIRE_FALSE(fs::exists(dir / "parts"));
    REQUIRE_FALSE(fs::exists(dir / "hf-out"));
  }
  // An expert tensor: the ring (--expert-budget) reads experts one by one while scoring.
  c = io::load_checkpoint(t.ckpt);
  victim = nullptr;
  for (io::NamedTensor& nt : c.params)
    if (nt.expert && nt.tensor.dtype() == DType::f32) victim = &nt;
  REQUIRE(victim);
  victim->tensor.data<float>()[victim->tensor.numel() - 1] = std::numeric_limits<float>::infinity();
  const std::string bad_expert = dir / "inf-expert.h5";
  io::save_checkpoint(bad_expert, c);
  const std::string expert_named = "tensor '" + victim->name + " (expert ";
  for (const std::string& ring : {std::string(""), std::string(" --expert-budget 50%")})
    expect_error(run_command(tool("moe-infer", "score --model " + bad_expert + data + ring)),
                 "moe-infer", 1, {bad_expert, "holds a non-finite value (inf"});
  expect_error(
      run_command(tool("moe-infer", "score --model " + bad_expert + data + " --expert-budget 50%")),
      "moe-infer", 1, {expert_named});

  // An Hugging Face directory whose safetensors hold an infinity.
  const std::string hf = dir / "hf";
  REQUIRE(run_command(tool("moe-convert", "export-hf " + t.ckpt + " -o " + hf)).exit_code == 0);
  const std::string file = hf + "/model.safetensors";
  std::vector<io::NamedTensor> tensors;
  std::string poisoned;
  {
    io::SafetensorsReader reader(file);
    for (const io::SafetensorsEntry& e : reader.tensors()) {
      Tensor x = reader.read(e.name);
      if (poisoned.empty() && x.dtype() == DType::f32 && x.numel() > 3 &&
          e.name.find("experts") != std::string::npos) {
        x.data<float>()[3] = -std::numeric_limits<float>::infinity();
        poisoned = e.name;
      }
      tensors.push_back({e.name, x, false});
    }
  }
  REQUIRE_FALSE(poisoned.empty());
  io::write_safetensors(file, tensors);
  expect_error(run_command(tool("moe-convert", "import-hf " + hf + " -o " + (dir / "imported.h5"))),
               "moe-convert", 1,
               {file, "tensor '" + poisoned + "' holds a non-finite value (-inf"});
  REQUIRE_FALSE(fs::exists(dir / "imported.h5"));
}

TEST_CASE("cli: prompt fields that are not integers or are out of range name their line",
          "[cli][validation]") {
  Trained& t = trained();
  test::ScratchDir dir("cli-validation-prompts");
  struct Case {
    std::string line, message;
  };
  const std::vector<Case> cases = {
      {R"({"prompt": "ab", "max_new": -0.5})", "\"max_new\" must be an integer, got -0.5"},
      {R"({"prompt": "ab", "max_new": 2.5})", "\"max_new\" must be an integer, got 2.5"},
      {R"({"prompt": "ab", "max_new": -3})", "\"max_new\" -3 is out of range"},
      {R"({"prompt": "ab", "max_new": "4"})", "\"max_new\" must be an integer"},
      {R"({"tokens": [1, 2.5]})", "\"tokens\" must be an integer, got 2.5"},
      {R"({"tokens": [1, -2]})", "\"tokens\" -2 is out of range [0, 255]"},
      {R"({"tokens": [1, 4294967295]})", "\"tokens\" 4294967295 is out of range"},
      {R"({"prompt": "ab", "top_k": 1.5})", "\"top_k\" must be an integer"},
      {R"({"prompt": "ab", "top_p": 0})", "\"top_p\" 0 is out of range (0, 1]"},
      {R"({"prompt": "ab", "temperature": -1})", "\"temperature\" -1 is out of range"},
  };
  for (const Case& c : cases) {
    INFO(c.line);
    const std::string prompts = dir / "prompts.jsonl";
    test::write_file(prompts, "hello\n" + c.line + "\n");
    auto r =
        run_command(tool("moe-infer", "generate -q --model " + t.ckpt + " --prompts " + prompts));
    expect_error(r, "moe-infer", 1, {prompts + ":2: " + c.message});
    REQUIRE(r.out.empty());
  }
}

TEST_CASE("cli: moe-profile refuses a trace with negative loads and a damaged path table",
          "[cli][validation]") {
  Trained& t = trained();
  test::ScratchDir dir("cli-validation-profile");
  const std::string trace = dir / "trace.h5", table = dir / "paths.json";
  REQUIRE(run_command(tool("moe-profile", "record -q --model " + t.ckpt + " --data " +
                                              test::fortunes_path("computers") +
                                              " --max-tokens 512 -o " + trace))
              .exit_code == 0);
  REQUIRE(run_command(tool("moe-profile", "paths -q " + trace + " --path-length 1 -o " + table))
              .exit_code == 0);
  // A negative load (summary printed max_over_min inf for it).
  const std::string negative = dir / "negative.h5";
  fs::copy_file(trace, negative);
  {
    io::h5::Session session;
    hid_t file = H5Fopen(negative.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(file >= 0);
    hid_t ds = H5Dopen2(file, "/batches/loads", H5P_DEFAULT);
    REQUIRE(ds >= 0);
    hid_t space = H5Dget_space(ds);
    std::vector<int64_t> loads(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
    H5Sclose(space);
    REQUIRE(H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, loads.data()) >= 0);
    loads[1] = -loads[1] - 1;
    REQUIRE(H5Dwrite(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, loads.data()) >= 0);
    H5Dclose(ds);
    REQUIRE(H5Fclose(file) >= 0);
  }
  expect_error(run_command(tool("moe-profile", "summary " + negative)), "moe-profile", 1,
               {negative, "/batches/loads", "batch 0, layer 0, expert 1", "is negative"});

  nlohmann::json j = nlohmann::json::parse(test::read_file(table));
  j["layers"][0]["paths"][0]["path"] = {-1};
  test::write_file(dir / "negative.json", j.dump());
  expect_error(
      run_command(tool("moe-profile", "accuracy " + (dir / "negative.json") + " " + trace)),
      "moe-profile", 1, {"negative.json", "names expert -1 at layer 0"});
  j = nlohmann::json::parse(test::read_file(table));
  j["layers"][0].erase("predicts");
  test::write_file(dir / "nopredicts.json", j.dump());
  expect_error(
      run_command(tool("moe-profile", "accuracy " + (dir / "nopredicts.json") + " " + trace)),
      "moe-profile", 1, {"nopredicts.json", "has no 'predicts'"});
}

// A 16 GB address-space limit (none under AddressSanitizer, test::under_limit): the figures here
// exceed any machine's physical memory, so the outcome does not depend on the host's RAM.
std::string under_16gb(const std::string& command) {
  return test::under_limit(int64_t(16000000) << 10, command);
}

TEST_CASE("cli: absurd model sizes are refused with the figure and the machine's memory",
          "[cli][validation]") {
  test::ScratchDir dir("cli-validation-sizes");
  const std::string base = "--data " + test::fortunes_path("linux") + " --out " + (dir / "run") +
                           " --layers 2 --heads 2 --seq 16 --moe-every 1 --batch 4"
                           " --eval-batches 1 --steps 1 --threads 1 -q";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {" --d-model 1000000 --d-ff 32 --experts 4", "d_model 1000000"},
      {" --d-model 128 --d-ff 512 --experts 100000", "100000 experts"},
      {" --d-model 16 --d-ff 32 --experts 4 --vocab 2147483647", "vocabulary 2147483647"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    // Under a 16 GB address-space limit, so that the outcome does not depend on the host's RAM.
    expect_error(run_command(under_16gb(tool("moe-train", base + c.args))), "moe-train", 1,
                 {"moe-train: error: training this model (", c.message, ") needs at least ",
                  "more than this machine has: ", "of physical memory"});
    REQUIRE_FALSE(fs::exists(dir / "run/last.h5"));
  }
  // Sizes that would be allocated before any estimate (a vector a layer; 32-bit positions) are
  // bounded first: under the limit, --layers 1e9 once grew to a raw std::bad_alloc and --seq 2^63
  // to vector::_M_default_append. A batch that no memory holds is refused by the estimate.
  const std::string sized = "--data " + test::fortunes_path("linux") + " --out " + (dir / "run") +
                            " --heads 2 --d-model 16 --d-ff 32 --experts 4 --moe-every 1"
                            " --eval-batches 1 --steps 1 --threads 1 -q";
  const std::vector<Case> bounded = {
      {" --layers 1000000000", "--layers must be between 1 and 65536 (got 1000000000)"},
      {" --seq 9223372036854775807", "--seq must be between 1 and 2147483647"},
  };
  for (const Case& c : bounded) {
    INFO(c.args);
    expect_error(run_command(under_16gb(tool("moe-train", sized + c.args))), "moe-train", 2,
                 {c.message});
  }
  expect_error(run_command(under_16gb(tool("moe-train", sized + " --batch 4611686018427387904"))),
               "moe-train", 1, {"for a micro-batch's logits", "more than this machine has"});
  // A u32 token id of 2^31 - 2 makes the vocabulary 2^31 - 1.
  std::string ids;
  for (uint32_t id : {1u, 2u, 2147483646u, 3u})
    for (int b = 0; b < 4; ++b) ids.push_back(static_cast<char>((id >> (8 * b)) & 0xff));
  std::string data;
  for (int i = 0; i < 16; ++i) data += ids;
  test::write_file(dir / "ids.u32", data);
  expect_error(
      run_command(under_16gb(tool("moe-train", "--data " + (dir / "ids.u32") + " --val " +
                                                   (dir / "ids.u32") + " --out " + (dir / "run") +
                                                   " --layers 2 --heads 2 --seq 4 --d-model 16"
                                                   " --d-ff 32 --experts 4 --batch 1 -q"))),
      "moe-train", 1, {"vocabulary 2147483647", "needs at least"});
  // Under an address-space limit the limit is the figure (4 GB here; the model needs more).
  if (test::kAddressSanitizer) return;
  auto limited = run_command(test::under_limit(
      int64_t(4000000) << 10, tool("moe-train", base + " --d-model 256 --d-ff 4096 --experts 64")));
  expect_error(limited, "moe-train", 1, {"needs at least", "by RLIMIT_AS"});
}

TEST_CASE("cli: a device, FIFO or empty file as a model is refused at once", "[cli][validation]") {
  test::ScratchDir dir("cli-validation-nodes");
  const std::string fifo = dir / "fifo.h5", empty = dir / "empty.h5";
  REQUIRE(run_command("mkfifo " + fifo).exit_code == 0);
  test::write_file(empty, "");
  const std::string data = " --data " + test::fortunes_path("computers");
  for (const std::string& model : {std::string("/dev/null"), fifo}) {
    INFO(model);
    for (const auto& [name, args] : std::vector<std::pair<std::string, std::string>>{
             {"moe-infer", "score --model " + model + data},
             {"moe-convert", "inspect " + model},
             {"moe-profile", "record --model " + model + data + " -o " + (dir / "t.h5")},
             {"moe-train", "--resume " + model + " --out " + (dir / "run")}}) {
      INFO(args);
      // `timeout`: reading a FIFO would block for ever.
      auto r = run_command("timeout 20 " + tool(name, args));
      expect_error(r, name, 1, {model, "not a regular file"});
      REQUIRE(r.err.find("18446744073709551615") == std::string::npos);
    }
  }
  expect_error(run_command(tool("moe-infer", "score --model " + empty + data)), "moe-infer", 1,
               {empty, "empty file (0 bytes)"});
}

TEST_CASE("cli: a device or FIFO as data is refused at once", "[cli][validation]") {
  // Issue 45: `--data /dev/zero` read for ever (no message) in moe-train, moe-infer score and
  // moe-profile record; a FIFO with no writer blocked in open.
  Trained& t = trained();
  test::ScratchDir dir("cli-validation-data-nodes");
  const std::string fifo = dir / "data.fifo";
  REQUIRE(run_command("mkfifo " + fifo).exit_code == 0);
  const std::string text = test::fortunes_path("linux");
  for (const std::string& data : {std::string("/dev/zero"), fifo}) {
    INFO(data);
    for (const auto& [name, args] : std::vector<std::pair<std::string, std::string>>{
             {"moe-train",
              "--data " + data + " --out " + (dir / "run") + test::kTinyModel + " --steps 1"},
             {"moe-train", "--data " + text + " --val " + data + " --out " + (dir / "run") +
                               test::kTinyModel + " --steps 1"},
             {"moe-infer", "score --model " + t.ckpt + " --data " + data},
             {"moe-profile",
              "record --model " + t.ckpt + " --data " + data + " -o " + (dir / "t.h5")}}) {
      INFO(args);
      // `timeout`: before the fix these read /dev/zero until memory ran out.
      auto r = run_command("timeout 20 " + tool(name, args));
      expect_error(r, name, 1, {"'" + data + "'", "not a regular file"});
    }
  }
  REQUIRE_FALSE(fs::exists(dir / "t.h5"));
  REQUIRE_FALSE(fs::exists(dir / "run/last.h5"));
}
