// moe-plan's model of a model (plan/memory_model.h param_counts, plan/predict.h read_model):
// - a Hugging Face directory or config.json is read as import-hf would read it (the same model
//   config as io::import_hf gives, for every family the tests write), without opening a tensor;
// - its parameters are exactly those the Transformer creates: dense, expert, frozen and total
//   counts, the largest block, and the bytes of the stored values (16-bit models keep their
//   routers' selection bias in f32) equal the ParamSet's, for every family: GPT, Mixtral (tied
//   too), Qwen2-MoE's gated shared expert, Qwen3-MoE's head_dim != D / H, OLMoE's full-width
//   qk-norm, GLM-4-MoE's dense first layer, DeepSeek-V3's latent attention with and without q_lora;
// - the published DeepSeek-V3 config counts 671,026,419,200 parameters, worked by hand below;
// - bad model_types are refused naming the file and the type.
#include <catch2/catch.hpp>
#include <map>

#include "moe/models/memory.h"
#include "moe/models/transformer.h"
#include "moe/plan/memory_model.h"
#include "moe/plan/predict.h"
#include "moe/plan/step_time.h"
#include "support/hf_deepseek_v3_model.h"
#include "support/hf_gpt_oss.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;

namespace {

// The ParamSet's own figures for `c`: the parameters the Transformer creates.
struct Built {
  double total = 0, dense = 0, expert = 0, frozen = 0, value_bytes = 0, largest_block = 0;
};

Built build(const ModelConfig& c) {
  ParamSet ps(1, c.dtype);
  ps.skip_initial_values(true);  // shapes and storage only
  const Transformer model(c, ps);
  Built b;
  b.total = double(model.num_params());
  std::map<int64_t, double> blocks;
  for (const Param* p : std::as_const(ps).all()) {
    const double n = double(p->logical_numel());
    (p->expert ? b.expert : b.dense) += n;
    if (p->frozen) b.frozen += n;
    b.value_bytes += double(p->value.nbytes());
    if (!p->expert && block_of_name(p->name) >= 0) blocks[block_of_name(p->name)] += n;
  }
  for (const auto& [index, n] : blocks) b.largest_block = std::max(b.largest_block, n);
  return b;
}

// Exact equality: every count is an integer far below 2^53.
void require_counts_match(const ModelConfig& c, const std::string& what) {
  INFO(what);
  const Built b = build(c);
  const plan::ParamCounts p = plan::param_counts(c);
  CHECK(p.total() == b.total);
  CHECK(p.dense == b.dense);
  CHECK(p.per_expert * double(p.experts) == b.expert);
  CHECK(p.frozen == b.frozen);
  CHECK(p.block_dense == b.largest_block);
  CHECK(p.value_bytes(c.dtype) == b.value_bytes);
}

// The model config import_hf gives `dir` (weights written too), as JSON.
nlohmann::json imported_config(const std::string& dir) {
  return moe::test::import_hf_held(dir).model_config;
}

}  // namespace

TEST_CASE("plan: a Hugging Face directory reads as import-hf reads it, every family", "[plan]") {
  test::ScratchDir dir("plan-hf");
  for (const char* family : {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"}) {
    const Tiny t = tiny_of(family);
    write_hf_dir(dir.file(family), family_config(t), family_weights(t, 3), 1);
  }
  Tiny tied = tiny_of("mixtral");
  tied.tied = true;
  json tied_config = family_config(tied);
  tied_config["tie_word_embeddings"] = true;
  auto tied_weights = family_weights(tied, 4);
  tied_weights.erase("lm_head.weight");
  write_hf_dir(dir.file("tied"), tied_config, tied_weights, 1);
  const TinyGlm glm;
  write_hf_dir(dir.file("glm"), glm_config(glm), glm_weights(glm, 5), 1);
  TinyDeepseek ds;
  write_hf_dir(dir.file("ds"), deepseek_config(ds), deepseek_weights(ds, 6), 1);
  TinyDeepseek v2;  // q without a low-rank stage (q_lora_rank null: one q projection)
  v2.v2 = true;
  v2.nextn = 0;  // DeepSeek-V2 has no multi-token-prediction layer
  v2.attn.r = 0;
  write_hf_dir(dir.file("ds2"), deepseek_v2_config(v2), deepseek_weights(v2, 7), 1);
  const TinyGptOss oss;  // sinks, biases everywhere, head_dim != D / H, windows, YaRN
  write_hf_dir(dir.file("oss"), gpt_oss_config(oss), gpt_oss_weights(oss, 8), 1);
  json oss16 = gpt_oss_config(oss);  // transformers writes the dtype of a bf16 save
  oss16["dtype"] = "bfloat16";           // (its F32 norms import as bf16: exact)
  write_hf_dir(dir.file("oss16"), oss16, gpt_oss_weights(oss, 8, DType::bf16), 1);
  for (const char* name : {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "tied", "glm", "ds",
                           "ds2", "oss", "oss16"}) {
    INFO(name);
    const ModelConfig from_dir = plan::read_model(dir.file(name));
    CHECK(to_json(from_dir) == imported_config(dir.file(name)));
    CHECK(to_json(plan::read_model(dir.file(name) + "/config.json")) == to_json(from_dir));
    require_counts_match(from_dir, name);
  }
}

TEST_CASE("plan: parameters counted as the Transformer creates them, every family", "[plan]") {
  ModelConfig gpt = test::plan_model_config();
  require_counts_match(gpt, "gpt");
  gpt.balance_bias_rate = 1e-3;  // a softmax router with a selection bias (frozen, f32)
  gpt.dtype = DType::bf16;
  gpt.resolve();
  require_counts_match(gpt, "gpt, bf16, selection bias");
  ModelConfig residual = test::plan_model_config();
  residual.residual_moe = true;  // PR-MoE: an MLP beside the experts
  residual.resolve();
  require_counts_match(residual, "gpt, residual MoE");

  // DeepSeek-V3's shape in bf16: the sigmoid routers' selection bias stays f32.
  test::ScratchDir dir("plan-params");
  const TinyDeepseek ds;
  test::write_file(dir.file("ds.json"), deepseek_config(ds).dump());
  ModelConfig c = plan::read_model(dir.file("ds.json"));
  c.dtype = DType::bf16;
  REQUIRE(c.mla());
  REQUIRE(c.router_selection_bias());
  require_counts_match(c, "deepseek_v3, bf16");
  const plan::ParamCounts p = plan::param_counts(c);
  CHECK(p.frozen == 2 * 8);  // two MoE layers' 8 experts
  CHECK(p.value_bytes(DType::bf16) == 2 * (p.total() - 16) + 4 * 16);
}

TEST_CASE("plan: DeepSeek-V3's published config counts its 671B parameters", "[plan]") {
  // config.json of deepseek-ai/DeepSeek-V3 (its keys as DeepseekV3Config writes them).
  const json config{{"model_type", "deepseek_v3"},
                    {"vocab_size", 129280},
                    {"hidden_size", 7168},
                    {"intermediate_size", 18432},
                    {"moe_intermediate_size", 2048},
                    {"num_hidden_layers", 61},
                    {"num_attention_heads", 128},
                    {"num_key_value_heads", 128},
                    {"q_lora_rank", 1536},
                    {"kv_lora_rank", 512},
                    {"qk_nope_head_dim", 128},
                    {"qk_rope_head_dim", 64},
                    {"v_head_dim", 128},
                    {"hidden_act", "silu"},
                    {"max_position_embeddings", 163840},
                    {"rms_norm_eps", 1e-6},
                    {"rope_theta", 10000},
                    {"rope_scaling",
                     {{"type", "yarn"},
                      {"factor", 40},
                      {"original_max_position_embeddings", 4096},
                      {"beta_fast", 32},
                      {"beta_slow", 1},
                      {"mscale", 1.0},
                      {"mscale_all_dim", 1.0}}},
                    {"n_shared_experts", 1},
                    {"n_routed_experts", 256},
                    {"num_experts_per_tok", 8},
                    {"routed_scaling_factor", 2.5},
                    {"n_group", 8},
                    {"topk_group", 4},
                    {"topk_method", "noaux_tc"},
                    {"first_k_dense_replace", 3},
                    {"norm_topk_prob", true},
                    {"num_nextn_predict_layers", 1},
                    {"tie_word_embeddings", false},
                    {"torch_dtype", "bfloat16"}};
  test::ScratchDir dir("plan-dsv3");
  test::write_file(dir.file("config.json"), config.dump());
  const ModelConfig c = plan::read_model(dir.path());
  CHECK(c.dtype == DType::bf16);
  const plan::ParamCounts p = plan::param_counts(c);
  // Per layer, latent attention: q_a 7168 x 1536 + its norm 1536 + q_b 1536 x 128 x 192,
  // kv_a 7168 x 512 + its norm 512, k_rope 7168 x 64, k_b and v_b 512 x 128 x 128 each,
  // o 128 x 128 x 7168: 187,107,328; with the block's two norms 187,121,664.
  // Layers 0-2 dense MLPs of 3 x 7168 x 18432 = 396,361,728 each; layers 3-60 a router
  // 256 x 7168, its bias 256, a shared expert 3 x 7168 x 2048 = 44,040,192, and 256 experts of
  // 44,040,192 each. Token table and head 2 x 129280 x 7168, the final norm 7168.
  const double mla = 187121664, dense_mlp = 396361728, expert = 44040192;
  const double moe_dense = 256 * 7168 + 256 + expert;
  CHECK(p.per_expert == expert);
  CHECK(p.experts == 58 * 256);
  CHECK(p.frozen == 58 * 256);
  CHECK(p.block_dense == mla + dense_mlp);
  CHECK(p.dense == 2.0 * 129280 * 7168 + 7168 + 61 * mla + 3 * dense_mlp + 58 * moe_dense);
  // The technical report's "671B total parameters" (the multi-token-prediction module's 14B
  // aside, which moe-plan does not train).
  CHECK(p.total() == 671026419200.0);
}

TEST_CASE("plan: latent attention's and windows' FLOPs and saved activations", "[plan]") {
  // The causal mask halves the keys; a window of w < T keeps w for most queries.
  CHECK(plan::keys_per_query(16, 0) == 8);
  CHECK(plan::keys_per_query(16, 16) == 8);
  CHECK(plan::keys_per_query(16, 4) == 4 - 16.0 / 32);
  test::ScratchDir dir("plan-mla");
  const TinyDeepseek ds;  // D 12, H 3, r 8, c 6, qk_nope 4, qk_rope 4, v 2, V 64, 3 layers
  test::write_file(dir.file("ds.json"), deepseek_config(ds).dump());
  ModelConfig c = plan::read_model(dir.file("ds.json"));
  c.seq = 16;
  // Scores over H x (4 + 4) = 24 features, values over H x 2 = 6: 6 x 8 keys x 30 per layer.
  const double matrices = parameter_lower_bound(c, 0, 0) + 64 * 12;
  CHECK(plan::dense_flops_per_token(c) == 6 * matrices + 3 * 6 * 8 * 30);
  // Per layer (f32): norm inputs 2 x 12, q and k 2 x 24, v and output 2 x 6, latents 6 + 8;
  // probabilities 3 x 16 fp32. Layer 0 a dense MLP of 20 (SwiGLU: 3 hidden rows) on its input
  // row; layers 1-2 three experts' input and hidden rows 3 x (12 + 3 x 10) and the shared
  // expert's 3 x 10. The logits 64 fp32.
  const double attention = 4 * (24 + 48 + 12 + 14) + 4 * 3 * 16;
  const double dense_layer = 4 * (12 + 3 * 20);
  const double moe_layer = 4 * (3 * (12 + 3 * 10) + 3 * 10);
  CHECK(plan::activation_bytes_per_token(c) ==
        3 * attention + dense_layer + 2 * moe_layer + 4 * 64);
}

TEST_CASE("plan: a model_type that is not a MoE family we know is refused by name", "[plan]") {
  test::ScratchDir dir("plan-hf-bad");
  json llama = family_config(tiny_of("mixtral"));
  llama["model_type"] = "llama";  // a dense model
  test::write_file(dir.file("llama.json"), llama.dump());
  CHECK_THROWS_WITH(plan::read_model(dir.file("llama.json")),
                    Catch::Contains("llama.json': model_type 'llama' is not supported") &&
                        Catch::Contains("supported: deepseek_v2"));
  std::filesystem::create_directories(dir.file("empty"));
  CHECK_THROWS_WITH(plan::read_model(dir.file("empty")), Catch::Contains("no config.json"));
  json shared = family_config(tiny_of("mixtral"));
  shared["n_shared_experts"] = 2;  // Mixtral has no shared expert
  test::write_file(dir.file("shared.json"), shared.dump());
  CHECK_THROWS_WITH(plan::read_model(dir.file("shared.json")),
                    Catch::Contains("features our mixtral flavour does not have: shared expert"));
}
