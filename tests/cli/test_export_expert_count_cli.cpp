// The expert count export-gguf and export-hf write is the MoE layers' (ExportModel::experts()),
// not ModelConfig::experts: a model trained with --experts-per-layer keeps the default --experts
// (8) in its config, which no layer holds. The exporters' record of the model config
// (moe.model_config) says the same count as the keys, so that import-gguf and import-hf take the
// record (an earlier export recorded 8 beside expert_count 4, and import-gguf then refused its own
// file: "blk.1.ffn_gate_inp.weight is {16, 4}, but the keys imply {16, 8}"). MoE layers of
// different sizes are refused by name: GGUF's expert_count and HF's num_experts are one number.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "moe/io/checkpoint.h"
#include "moe/io/gguf.h"
#include "support/run.h"
#include "support/scores.h"

using namespace moe;
using test::run_command;
using test::tool;

namespace {

// moe-train flags of a tiny model of `arch` with MoE layers of 4 experts as `per_layer` says
// (--experts is left at its default, 8).
std::string tiny(const std::string& arch, const std::string& per_layer) {
  return " --arch " + arch + " --layers 2 --d-model 16 --heads 2 --d-ff 32 --seq 16 --batch 4" +
         " --experts-per-layer " + per_layer + " --steps 2 --lr 1e-2 --warmup 1" +
         " --eval-batches 1 --threads 1 -q";
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("cli: export-gguf and export-hf write the MoE layers' expert count",
          "[cli][gguf][export-hf]") {
  test::ScratchDir dir("cli-export-expert-count");
  struct Family {
    std::string arch, per_layer, gguf_arch, hf_key, extra;
  };
  // deepseek_v3 and glm4_moe with a leading dense layer; the others with experts in every layer.
  const Family families[] = {
      {"deepseek_v3", "0,4", "deepseek2", "n_routed_experts",
       " --shared-expert-ff 32 --router-groups 2 --router-group-topk 1"},
      {"glm4_moe", "0,4", "glm4moe", "n_routed_experts", " --shared-expert-ff 32 --dense-ff 24"},
      {"mixtral", "4,4", "llama", "num_local_experts", ""},
      {"qwen3_moe", "4,4", "qwen3moe", "num_experts", ""},
  };
  const std::string data = test::fortunes_path("linux");
  for (const Family& f : families) {
    SECTION(f.arch) {
      const std::string ckpt =
          test::train_on_fortunes(dir / f.arch, tiny(f.arch, f.per_layer) + f.extra);
      REQUIRE(io::load_checkpoint(ckpt, false).model_config["experts"] == 8);
      const std::string gguf = dir / (f.arch + ".gguf"), back = dir / (f.arch + ".back.h5");
      auto e = run_command(tool("moe-convert", "export-gguf " + ckpt + " -o " + gguf + " -q"));
      INFO(e.err);
      REQUIRE(e.exit_code == 0);
      const io::GgufFile file = io::read_gguf(gguf);
      REQUIRE(file.metadata[f.gguf_arch + ".expert_count"]["value"] == 4);
      const auto record =
          nlohmann::json::parse(file.metadata["moe.model_config"]["value"].get<std::string>());
      REQUIRE(record["experts"] == 4);
      REQUIRE(file.tensor("blk.1.ffn_gate_inp.weight").dims == std::vector<int64_t>{16, 4});

      // import-gguf takes the record (the keys agree with it) and scores as the original (f32).
      auto g = run_command(tool("moe-convert", "import-gguf " + gguf + " -o " + back));
      INFO(g.err);
      REQUIRE(g.exit_code == 0);
      REQUIRE_THAT(g.err, Catch::Contains("model config taken from the exporter's record"));
      REQUIRE(io::load_checkpoint(back, false).model_config["experts_per_layer"] ==
              io::load_checkpoint(ckpt, false).model_config["experts_per_layer"]);
      REQUIRE(test::score_lines(back, data) == test::score_lines(ckpt, data));

      const std::string hf = dir / (f.arch + ".hf"), hf_back = dir / (f.arch + ".hf.h5");
      auto h = run_command(tool("moe-convert", "export-hf " + ckpt + " -o " + hf + " -q"));
      INFO(h.err);
      REQUIRE(h.exit_code == 0);
      REQUIRE(read_json(hf + "/config.json")[f.hf_key] == 4);
      auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + hf_back));
      INFO(i.err);
      REQUIRE(i.exit_code == 0);
      REQUIRE_THAT(i.err, Catch::Contains("model config taken from the exporter's record"));
    }
  }
}

TEST_CASE("cli: export-gguf and export-hf refuse MoE layers of different expert counts",
          "[cli][gguf][export-hf]") {
  test::ScratchDir dir("cli-export-expert-count-mixed");
  const std::string ckpt = test::train_on_fortunes(dir / "run", tiny("mixtral", "4,2"));
  auto g = run_command(tool("moe-convert", "export-gguf " + ckpt + " -o " + (dir / "m.gguf")));
  REQUIRE(g.exit_code != 0);
  REQUIRE_THAT(g.err, Catch::Contains("same number of experts in every MoE layer; layer 1 has 2, "
                                      "an earlier one 4"));
  auto h = run_command(tool("moe-convert", "export-hf " + ckpt + " -o " + (dir / "hf")));
  REQUIRE(h.exit_code != 0);
  REQUIRE_THAT(h.err, Catch::Contains("same number of experts in every MoE layer; layer 1 has 2, "
                                      "an earlier one 4"));
}
