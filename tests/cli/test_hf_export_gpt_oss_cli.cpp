// export-hf of gpt-oss through the tool, as a user meets it: a tiny transformers-format
// GptOssForCausalLM directory in the released form (support/hf_gpt_oss.h: bf16 with F32 norms,
// experts as MXFP4 _blocks/_scales, quantization_config) imported by moe-convert import-hf with
// --keep-mxfp4 exports back with every tensor byte-identical and config.json's keys as they were;
// imported dequantised, it exports gate_up_proj / down_proj in bf16 holding exactly the values of
// the blocks (transformers' dequantisation, written in the test).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "moe/io/safetensors.h"
#include "support/hf_gpt_oss.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;
using test::run_command;
using test::tool;

namespace {

json config_of(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  return json::parse(in);
}

}  // namespace

TEST_CASE("cli: a released-form gpt-oss goes import-hf -> export-hf unchanged",
          "[cli][hf][gpt_oss][mxfp4]") {
  test::ScratchDir dir("cli-hf-export-gpt-oss");
  TinyGptOss t;
  t.layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
  const std::map<std::string, Tensor> packed = gpt_oss_mxfp4(t, 61);
  const json source_config = gpt_oss_mxfp4_config(t);
  const std::string hf = dir / "gpt-oss";
  write_hf_dir(hf, source_config, packed, 2);

  // Kept: the blocks go back out as they came in, and so does every other tensor.
  const std::string kept = dir / "kept.h5", kept_out = dir / "kept-out";
  auto i = run_command(tool("moe-convert", "import-hf --keep-mxfp4 " + hf + " -o " + kept));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  auto e = run_command(tool("moe-convert", "export-hf " + kept + " -o " + kept_out));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  {
    io::SafetensorsReader st(kept_out + "/model.safetensors");
    REQUIRE(st.tensors().size() == packed.size());
    for (const auto& [name, tensor] : packed) {
      INFO("tensor " << name);
      REQUIRE(same_bytes(st.read(name), tensor));
    }
    const json c = config_of(kept_out);
    for (const auto& [key, value] : source_config.items()) {
      INFO("config key " << key);
      REQUIRE(c.contains(key));
      CHECK(c[key] == value);
    }
  }

  // Dequantised: bf16 gate_up_proj / down_proj with the blocks' values, exactly.
  const std::string dense = dir / "dense.h5", dense_out = dir / "dense-out";
  i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + dense));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  e = run_command(tool("moe-convert", "export-hf " + dense + " -o " + dense_out));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  io::SafetensorsReader st(dense_out + "/model.safetensors");
  const std::map<std::string, Tensor> want = gpt_oss_dequantized(packed, DType::bf16);
  REQUIRE(st.tensors().size() == want.size());
  for (const auto& [name, tensor] : want) {
    INFO("tensor " << name);
    REQUIRE(same_bytes(st.read(name), tensor));
  }
  CHECK_FALSE(config_of(dense_out).contains("quantization_config"));
}

TEST_CASE("cli: a gpt_oss moe-train trained exports to HF and scores the same imported back",
          "[cli][hf][gpt_oss]") {
  test::ScratchDir dir("cli-hf-export-gpt-oss-trained");
  const std::string text = test::read_file(test::fortunes_path("linux"));
  const std::string val = dir / "val.txt";
  test::write_file(val, text.substr(3000, 4 * 16 + 1));  // 4 windows of 16 tokens (+1)
  const std::string run = dir / "run";
  // Windows of 4 on the even layers (gpt_oss's default), sinks, every bias, YaRN, GQA with heads
  // narrower than D / H, the clamp reached (limit 3), trained 30 steps so that no parameter is at
  // its initial value (sinks and biases start at zero).
  auto r = run_command(tool(
      "moe-train",
      "--data " + test::fortunes_path("linux") + " --out " + run +
          " --arch gpt_oss --layers 3 --d-model 16 --heads 4 --kv-heads 2 --head-dim 6 --d-ff 16"
          " --seq 16 --experts 4 --top-k 2 --sliding-window 4 --swiglu-limit 3"
          " --rope-scaling yarn --rope-factor 2 --original-max-position-embeddings 8"
          " --batch 4 --threads 1 -q --steps 30 --lr 1e-2 --warmup 1 --eval-every 0"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string hf = dir / "hf", back = dir / "back.h5";
  auto e = run_command(tool("moe-convert", "export-hf " + run + "/step-00000030.h5 -o " + hf));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  const json c = config_of(hf);
  CHECK(c["model_type"] == "gpt_oss");
  CHECK(c["layer_types"] == json({"sliding_attention", "full_attention", "sliding_attention"}));
  CHECK(c["sliding_window"] == 4);
  CHECK(c["swiglu_limit"] == 3.0);
  auto i = run_command(tool("moe-convert", "import-hf " + hf + " -o " + back));
  INFO(i.err);
  REQUIRE(i.exit_code == 0);
  // The same model: every window's score equal to the trained checkpoint's (the centred routers
  // go out folded, which gives the same logits, bit for bit).
  auto score = [&](const std::string& model) {
    auto s = run_command(
        tool("moe-infer", "score --model " + model + " --data " + val + " --batch 4 --threads 1"));
    INFO(s.err);
    REQUIRE(s.exit_code == 0);
    return test::lines_of(s.out);
  };
  const std::vector<std::string> trained = score(run), imported = score(back);
  REQUIRE(trained.size() == 4);
  CHECK(trained == imported);
}

TEST_CASE("cli: export-hf says by how much a bf16 gpt_oss's trained sinks round",
          "[cli][hf][gpt_oss]") {
  test::ScratchDir dir("cli-hf-export-gpt-oss-sinks");
  const std::string run = dir / "run";
  // The sinks train in f32 whatever the model's dtype; transformers saves them in it (bf16).
  auto r = run_command(tool(
      "moe-train", "--data " + test::fortunes_path("linux") + " --out " + run +
                       " --arch gpt_oss --layers 2 --d-model 16 --heads 4 --kv-heads 2 --d-ff 16"
                       " --seq 16 --experts 4 --top-k 2 --dtype bf16 --batch 4 --threads 1 -q"
                       " --steps 10 --lr 1e-2 --warmup 1 --eval-every 0"));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto e = run_command(
      tool("moe-convert", "export-hf " + run + "/step-00000010.h5 -o " + (dir / "hf")));
  INFO(e.err);
  REQUIRE(e.exit_code == 0);
  CHECK(e.err.find("'model.layers.0.self_attn.sinks' rounds to bf16 (the model's dtype) by up to") !=
        std::string::npos);
  CHECK(config_of(dir / "hf")["torch_dtype"] == "bfloat16");
}
