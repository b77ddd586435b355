// moe-convert import-gguf of 4-bit files as a user runs it: a model moe-train just trained,
// exported by export-gguf --type q4_k_m, comes back with every quantised tensor byte for byte as
// moe-convert quantize --type q4_k_m wrote it, and moe-infer scores it exactly (every sequence's
// nll bit for bit) as quantize's checkpoint holding the file's token embedding (llama.cpp
// quantises the embedding; we keep it in floats, dequantised). A tensor type we do not read is an
// error (exit 1) naming the tensor and the type.
#include <catch2/catch.hpp>
#include <cstring>
#include <nlohmann/json.hpp>

#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "support/run.h"

using namespace moe;
using test::lines_of;
using test::run_command;
using test::tool;

namespace {

std::vector<std::string> scores(const std::string& model) {
  const auto r =
      run_command(tool("moe-infer", "score -q --threads 1 --model " + model + " --data " +
                                        test::fortunes_path("computers") + " --max-sequences 6"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> out;
  for (const std::string& line : lines_of(r.out)) {  // without the timings
    nlohmann::json j = nlohmann::json::parse(line);
    for (auto it = j.begin(); it != j.end();)
      it = it.key().find("_per_s") != std::string::npos ? j.erase(it) : std::next(it);
    out.push_back(j.dump());
  }
  REQUIRE(out.size() == 6);
  return out;
}

const io::NamedTensor& param(const io::Checkpoint& c, const std::string& name) {
  for (const io::NamedTensor& p : c.params)
    if (p.name == name) return p;
  FAIL("no parameter " << name);
  throw 0;
}

}  // namespace

TEST_CASE("cli: import-gguf of a q4_k_m export gives quantize's tensors and scores",
          "[cli][gguf][quantize]") {
  test::ScratchDir dir("cli-gguf-import-blocks");
  const std::string ckpt = test::train_on_fortunes(
      dir / "run",
      " --arch mixtral --layers 2 --d-model 256 --heads 4 --kv-heads 2 --d-ff 256"
      " --seq 16 --experts 4 --moe-every 1 --batch 2 --eval-batches 1 --threads 1 -q"
      " --steps 3");
  const std::string q4 = dir / "q4.h5", gguf = dir / "q4.gguf", back = dir / "back.h5";
  for (const std::string& cmd : {"quantize " + ckpt + " --type q4_k_m -q -o " + q4,
                                 "export-gguf " + ckpt + " --type q4_k_m -q -o " + gguf,
                                 "import-gguf " + gguf + " -o " + back}) {
    auto r = run_command(tool("moe-convert", cmd));
    INFO(cmd << "\n" << r.err);
    REQUIRE(r.exit_code == 0);
    if (cmd.rfind("import", 0) == 0)
      REQUIRE_THAT(r.err, Catch::Contains("as mixtral (q4_k_m weights)"));
  }
  const io::Checkpoint a = io::load_checkpoint(q4, false), b = io::load_checkpoint(back, false);
  REQUIRE(b.model_config.at("quantization") == "q4_k_m");
  REQUIRE(b.model_config.at("tensor_formats") == a.model_config.at("tensor_formats"));
  int64_t blocks = 0;
  for (const io::NamedTensor& p : b.params) {
    // The routers: the export folds the trained router's centre (router.center, which the file
    // cannot hold) into its weight, as moe-infer does on load: compared through the scores.
    if (p.name == "embed.tokens" || p.name.find(".router.") != std::string::npos) continue;
    INFO(p.name);
    const Tensor& x = param(a, p.name).tensor;
    const Tensor& y = p.tensor;
    REQUIRE(x.dtype() == y.dtype());
    REQUIRE(x.shape() == y.shape());
    REQUIRE(std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0);
    blocks += !io::block_format_of(a.model_config, p.name).empty();
  }
  REQUIRE(blocks == 15);  // every weight matrix but the embedding and the routers

  // quantize's checkpoint with the file's (dequantised) embedding scores as the import does.
  io::Checkpoint reference = a;
  for (io::NamedTensor& p : reference.params)
    if (p.name == "embed.tokens") p.tensor = param(b, p.name).tensor;
  io::save_checkpoint(dir / "reference.h5", reference);
  REQUIRE(scores(back) == scores(dir / "reference.h5"));

  // A tensor type import-gguf does not read (q5_K, ggml type 13): refused naming both.
  std::string bytes = test::read_file(gguf);
  const std::string name = "blk.0.ffn_gate_exps.weight";
  const size_t at = bytes.find(name);
  REQUIRE(at != std::string::npos);
  uint32_t dims = 0;
  std::memcpy(&dims, bytes.data() + at + name.size(), 4);
  REQUIRE(dims == 3);
  const size_t type_at = at + name.size() + 4 + 8 * dims;
  const uint32_t q5_k = 13;
  std::memcpy(bytes.data() + type_at, &q5_k, 4);
  test::write_file(dir / "q5.gguf", bytes);
  auto r = run_command(
      tool("moe-convert", "import-gguf " + (dir / "q5.gguf") + " -o " + (dir / "q5.h5")));
  REQUIRE(r.exit_code == 1);
  REQUIRE_THAT(r.err, Catch::Contains("moe-convert: error:") && Catch::Contains("q5_K") &&
                          Catch::Contains(name));
}
