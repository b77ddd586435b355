// export-hf of a model imported from a DeepSeek-V2 directory (issue 44): it goes back out as a
// DeepseekV2 directory (model_type deepseek_v2, DeepseekV2Config's keys: its "greedy" router, no
// renormalisation, no rope_interleave), config- and tensor-identical to the one
// support/hf_deepseek_v3_model.h wrote, for a q latent and a V2-Lite-shaped plain q_proj, in f32
// and bf16; what transformers' V2 router would run otherwise is refused by name.
#include <catch2/catch.hpp>

#include "moe/io/safetensors.h"
#include "support/hf_deepseek_v3_model.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;

TEST_CASE("deepseek_v2: import -> export-hf -> import is config- and tensor-identical",
          "[hf][deepseek_v3]") {
  test::ScratchDir dir("deepseek-v2-export");
  for (bool plain_q : {false, true}) {
    TinyDeepseek t;
    t.v2 = true, t.nextn = 0, t.moe.shared = 2, t.moe.scale = 1.7;
    if (plain_q) t.attn.r = 0;  // V2-Lite: q_proj
    for (DType dtype : {DType::f32, DType::bf16}) {
      INFO(dtype_name(dtype) << (plain_q ? ", plain q_proj" : ", q latent"));
      std::map<std::string, Tensor> w;
      for (const auto& [name, tensor] : deepseek_weights(t, 31)) w[name] = tensor.to(dtype);
      const std::string src = dir.file(str("v2-", dtype_name(dtype), plain_q ? "-plain" : ""));
      const json source_config = deepseek_v2_config(t);
      write_hf_dir(src, source_config, w, 2);
      const io::Checkpoint imported = test::import_hf_held(src);
      const std::string out = src + "-out";
      io::export_hf(imported, out);
      io::SafetensorsReader st(out + "/model.safetensors");
      for (const auto& [name, tensor] : w) {
        INFO("tensor " << name);
        REQUIRE(same_bytes(st.read(name), tensor));
      }
      REQUIRE(st.tensors().size() == w.size());  // no correction bias, nothing else
      const json c = json::parse(test::read_file(out + "/config.json"));
      for (const auto& [key, value] : source_config.items()) {
        INFO("config key " << key);
        // num_key_value_heads (128, the class default) does not shape latent attention: we write
        // the heads; the dtype goes out as torch_dtype.
        if (key == "num_key_value_heads" || key == "dtype") continue;
        REQUIRE(c.contains(key));
        REQUIRE(c[key] == value);
      }
      for (const char* v3_only :
           {"rope_interleave", "n_group", "topk_group", "num_nextn_predict_layers"})
        CHECK_FALSE(c.contains(v3_only));
      CHECK(c["torch_dtype"] == (dtype == DType::f32 ? "float32" : "bfloat16"));
      const io::Checkpoint again = test::import_hf_held(out);
      require_same_params(imported, again);
      REQUIRE(again.model_config == imported.model_config);
    }
  }
}

TEST_CASE("deepseek_v2: what transformers' V2 router would run otherwise is refused",
          "[hf][deepseek_v3]") {
  test::ScratchDir dir("deepseek-v2-export-refused");
  TinyDeepseek t;
  t.v2 = true, t.nextn = 0;
  write_hf_dir(dir.file("v2"), deepseek_v2_config(t), deepseek_weights(t, 32), 1);
  const io::Checkpoint imported = test::import_hf_held(dir.file("v2"));
  // A softmax router that renormalises its top-k (ours can; transformers' DeepSeek-V2 cannot).
  io::Checkpoint renorm = imported;
  ModelConfig mc = model_config_from_json(renorm.model_config);
  mc.normalize_topk = true;
  renorm.model_config = to_json(mc);
  CHECK_THAT(test::error_of([&] { io::export_hf(renorm, dir.file("out")); }),
             Catch::Contains("(HF DeepSeek-V2) renormalises the top-k"));
  CHECK_FALSE(std::filesystem::exists(dir.file("out")));
}
