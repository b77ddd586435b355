// GLM-4-MoE (transformers' Glm4MoeForCausalLM) in Hugging Face form, and the pieces it shares with
// DeepSeek-V3: group-limited top-k, scaled gate weights, partial RoPE. The tiny writer and the
// double-precision reference live in support/hf_glm4_moe.h; here:
//   - the writer creates every tensor the transformers class creates;
//   - each GLM feature of the reference changes the logits (the comparisons below can fail);
//   - import-hf reads the family's config and maps every tensor; the imported model scores within
//     1e-4 of the reference per window, with n_group > 1 and with one group;
//   - export-hf writes it back: import -> export -> import is tensor-identical, f32 and bf16;
//   - what we cannot represent is refused by name; the ops' new options on their own; the whole
//     family's gradient against finite differences (training supports it).
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, rd rotated dims,
// E experts, G groups, k top-k, L layers, B batch, T sequence.
#include <catch2/catch.hpp>
#include <filesystem>
#include <set>

#include "moe/io/gguf.h"
#include "moe/models/transformer.h"
#include "moe/ops/dense.h"
#include "moe/ops/moe.h"
#include "moe/rng.h"
#include "support/hf_glm4_moe.h"

using namespace moe;
using namespace moe::test::hf;
namespace fs = std::filesystem;

namespace {

// Per window (sequence) our f32 logits within 1e-4 of the reference, relative to their scale.
void require_scores_like_reference(const TinyGlm& t, const std::string& src, uint64_t seed) {
  const int64_t B = 2, T = 11;
  const auto w = glm_weights(t, seed);
  write_hf_dir(src, glm_config(t), w, 2);
  const io::Checkpoint ckpt = test::import_hf_held(src);
  const auto ids = random_token_ids(B * T, int32_t(t.V), seed + 1);
  const std::vector<float> ours = our_logits(ckpt, src + ".h5", ids, B, T);
  const Vec reference = glm_reference_logits(t, w, ids, B, T);
  for (int64_t b = 0; b < B; ++b) {
    const size_t n = size_t(T * t.V), at = size_t(b) * n;
    const std::vector<float> mine(ours.begin() + long(at), ours.begin() + long(at + n));
    const Vec want(reference.begin() + long(at), reference.begin() + long(at + n));
    const double error = relative_error(mine, want);
    INFO("window " << b << ": relative error " << error);
    REQUIRE(error < 1e-4);
  }
}

}  // namespace

TEST_CASE("glm4_moe: the writer creates every tensor of Glm4MoeForCausalLM", "[hf][glm4_moe]") {
  const TinyGlm t;
  const auto w = glm_weights(t, 1);
  // embedding, final norm, head; per layer 2 norms, q/k/v/o, 3 biases, 2 qk-norms; dense layers
  // 3 MLP tensors; MoE layers router, correction bias, 3 per expert, 3 shared.
  const size_t per_layer = 2 + 4 + 3 + 2;
  REQUIRE(w.size() == 3 + size_t(t.L) * per_layer + size_t(t.dense) * 3 +
                          size_t(t.L - t.dense) * (2 + 3 * size_t(t.E) + 3));
  REQUIRE(w.at("model.layers.0.mlp.gate_proj.weight").shape() == Shape{t.Fd, t.D});
  REQUIRE(w.at("model.layers.1.mlp.shared_experts.down_proj.weight").shape() ==
          Shape{t.D, t.shared * t.F});
  REQUIRE(w.at("model.layers.1.mlp.gate.e_score_correction_bias").shape() == Shape{t.E});
  REQUIRE(w.at("model.layers.1.self_attn.q_norm.weight").shape() == Shape{t.hd});
  REQUIRE_FALSE(w.count("model.layers.1.self_attn.o_proj.bias"));
  REQUIRE(t.hd * t.H != t.D);  // head_dim is read, not derived
  REQUIRE(t.rd() == t.hd / 2);
}

TEST_CASE("glm4_moe: each feature of the reference changes the logits", "[hf][glm4_moe]") {
  const TinyGlm t;
  const auto w = glm_weights(t, 2);
  const int64_t T = 9;
  const auto ids = random_token_ids(T, int32_t(t.V), 3);
  const Vec base = glm_reference_logits(t, w, ids, 1, T);
  auto changed = [&](auto&& change, std::map<std::string, Tensor> weights) {
    TinyGlm other = t;
    change(other);
    return relative_gap(glm_reference_logits(other, weights, ids, 1, T), base);
  };
  // Group-limited choice: the same weights routed over all experts (one group) differ.
  REQUIRE(changed([](TinyGlm& o) { o.groups = 1, o.group_k = 1; }, w) > 1e-3);
  REQUIRE(changed([](TinyGlm& o) { o.scale = 1.0; }, w) > 1e-3);
  REQUIRE(changed([](TinyGlm& o) { o.partial = 1.0; }, w) > 1e-3);
  REQUIRE(changed([](TinyGlm& o) { o.norm_topk = false; }, w) > 1e-3);
  REQUIRE(changed([](TinyGlm& o) { o.shared = 0; }, w) > 1e-3);
  auto unbiased = w;
  for (int64_t l = t.dense; l < t.L; ++l)
    unbiased["model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias"] =
        Tensor::zeros({t.E});
  REQUIRE(changed([](TinyGlm&) {}, unbiased) > 1e-3);  // the bias changes the choice
}

TEST_CASE("glm4_moe: router_topk limits the choice to the best groups", "[hf][glm4_moe][router]") {
  // 8 experts in 4 groups of 2; the two best single scores (experts 0 and 6) sit in groups whose
  // pairs sum lower than groups 1 and 2, so only experts 2..5 may be chosen.
  const std::vector<float> scores{0.90f, 0.00f, 0.60f, 0.50f, 0.55f, 0.52f, 0.85f, 0.01f};
  const Tensor probs = Tensor::from_vector({1, 8}, scores);
  Tensor idx = Tensor::empty({1, 2}, DType::i32), weight = Tensor::empty({1, 2}, DType::f32);
  auto chosen = [&] { return std::vector<int32_t>(idx.data<int32_t>(), idx.data<int32_t>() + 2); };
  ops::router_topk(probs, 2, false, idx, weight, Tensor(), 4, 2);
  REQUIRE(chosen() == std::vector<int32_t>{2, 4});
  REQUIRE(weight.to_vector() == std::vector<float>{0.60f, 0.55f});
  // One group: the plain top-2.
  ops::router_topk(probs, 2, false, idx, weight, Tensor(), 1, 1);
  REQUIRE(chosen() == std::vector<int32_t>{0, 6});
  // The selection bias counts in the group sums: group 3 (experts 6, 7) wins with it.
  const Tensor bias = Tensor::from_vector({8}, std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0.5f});
  ops::router_topk(probs, 2, true, idx, weight, bias, 4, 2);
  REQUIRE(chosen() == std::vector<int32_t>{6, 2});
  REQUIRE(weight.to_vector()[0] == Approx(0.85 / 1.45));
  REQUIRE_THAT(
      test::error_of([&] { ops::router_topk(probs, 2, false, idx, weight, Tensor(), 3, 1); }),
      Catch::Contains("3 groups"));
}

TEST_CASE("glm4_moe: partial RoPE rotates the first features only", "[hf][glm4_moe][rope]") {
  const int64_t B = 1, T = 5, heads = 2, hd = 8, rd = 4;
  const Tensor x = test::random_tensor({B * T, heads * hd}, 4);
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  ops::rope_forward(x, B, T, heads, 10000.0f, y, 3, rd);
  // The rotated part is what a head of rd features gets; the rest passes through.
  Tensor part = Tensor::empty({B * T, heads * rd}, DType::f32), want = part.clone();
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < rd; ++j)
        part.data<float>()[r * heads * rd + h * rd + j] =
            x.data<float>()[r * heads * hd + h * hd + j];
  ops::rope_forward(part, B, T, heads, 10000.0f, want, 3);
  for (int64_t r = 0; r < B * T; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < hd; ++j) {
        const float got = y.data<float>()[r * heads * hd + h * hd + j];
        const float expected = j < rd ? want.data<float>()[r * heads * rd + h * rd + j]
                                      : x.data<float>()[r * heads * hd + h * hd + j];
        REQUIRE(got == expected);
      }
  // The backward (the inverse rotation) brings x back, in place.
  ops::rope_backward(y, B, T, heads, 10000.0f, y, 3, rd);
  for (int64_t i = 0; i < x.numel(); ++i)
    REQUIRE(y.data<float>()[i] == Approx(x.data<float>()[i]).margin(1e-6));
}

TEST_CASE("glm4_moe: import-hf reads the family's config", "[hf][glm4_moe]") {
  test::ScratchDir dir("glm4-moe-import");
  const TinyGlm t;
  write_hf_dir(dir.file("glm"), glm_config(t), glm_weights(t, 5), 1);
  io::HfImportReport report;
  const io::Checkpoint ckpt = test::import_hf_held(dir.file("glm"), {}, &report);
  const ModelConfig mc = model_config_from_json(ckpt.model_config);
  REQUIRE(mc.arch == Arch::glm4_moe);
  REQUIRE(mc.experts_per_layer == std::vector<int64_t>{0, t.E, t.E});
  REQUIRE(mc.d_ff == t.F);
  REQUIRE(mc.dense_ff_resolved() == t.Fd);
  REQUIRE(mc.shared_expert_ff == t.shared * t.F);
  REQUIRE(mc.head_dim_resolved() == t.hd);
  REQUIRE(mc.rope_dim_resolved() == t.rd());
  REQUIRE(mc.qkv_bias);
  REQUIRE(mc.qk_norm);
  REQUIRE(mc.router_scoring == nn::RouterScoring::sigmoid);
  REQUIRE(mc.router_groups == t.groups);
  REQUIRE(mc.router_group_topk == t.group_k);
  REQUIRE(mc.routed_scale == t.scale);
  REQUIRE(mc.normalize_topk);
  REQUIRE(report.unmapped.empty());
  REQUIRE(param(ckpt, "blocks.1.moe.router.bias").tensor.dtype() == DType::f32);
  REQUIRE(same_bytes(param(ckpt, "blocks.0.mlp.w2").tensor,
                     glm_weights(t, 5).at("model.layers.0.mlp.down_proj.weight")));
}

TEST_CASE("glm4_moe: an imported model scores like the reference", "[hf][glm4_moe]") {
  test::ScratchDir dir("glm4-moe-score");
  SECTION("GLM-4.5 shape: groups, biases, qk-norm") {
    require_scores_like_reference(TinyGlm{}, dir.file("a"), 11);
  }
  SECTION("GLM-4.5-Air shape: one group, no biases, no qk-norm, two shared experts") {
    TinyGlm t;
    t.groups = 1, t.group_k = 1, t.bias = false, t.qk_norm = false, t.shared = 2, t.scale = 1.0;
    require_scores_like_reference(t, dir.file("b"), 12);
  }
  SECTION("DeepSeek-V3's choice: 8 groups, 4 chosen, top-8 of 32, no renormalisation") {
    TinyGlm t;
    t.E = 32, t.k = 8, t.groups = 8, t.group_k = 4, t.norm_topk = false, t.dense = 2;
    require_scores_like_reference(t, dir.file("c"), 13);
  }
}

TEST_CASE("glm4_moe: import -> export -> import is tensor-identical, f32 and bf16",
          "[hf][glm4_moe]") {
  test::ScratchDir dir("glm4-moe-export");
  const TinyGlm t;
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO(dtype_name(dtype));
    std::map<std::string, Tensor> w;
    for (const auto& [name, tensor] : glm_weights(t, 7))  // transformers keeps the bias in f32
      w[name] = name.ends_with("e_score_correction_bias") ? tensor : tensor.to(dtype);
    const std::string src = dir.file(std::string("glm-") + dtype_name(dtype));
    write_hf_dir(src, glm_config(t), w, 2);
    const io::Checkpoint imported = test::import_hf_held(src);
    REQUIRE(model_config_from_json(imported.model_config).dtype == dtype);
    const std::string out = src + "-out";
    io::export_hf(imported, out);
    io::SafetensorsReader st(out + "/model.safetensors");
    std::set<std::string> names;
    for (const auto& [name, tensor] : w) {
      INFO("tensor " << name);
      REQUIRE(same_bytes(st.read(name), tensor));
      names.insert(name);
    }
    REQUIRE(st.tensors().size() == names.size());
    const json c = json::parse(test::read_file(out + "/config.json"));
    const json want = glm_config(t);
    for (const auto& [key, value] : want.items()) {
      INFO("config key " << key);
      if (key != "torch_dtype") REQUIRE(c[key] == value);
    }
    const io::Checkpoint again = test::import_hf_held(out);
    require_same_params(imported, again);
    REQUIRE(again.model_config == imported.model_config);
  }
}

TEST_CASE("glm4_moe: what we cannot represent is refused by name", "[hf][glm4_moe]") {
  test::ScratchDir dir("glm4-moe-refused");
  const TinyGlm t;
  const struct {
    json changes;
    std::string message;
  } configs[] = {
      {{{"hidden_act", "gelu"}}, "activation 'gelu'"},
      {{{"n_group", 128}, {"topk_group", 4}}, "n_group 128 with topk_group 4"},
      {{{"partial_rotary_factor", 0.3125}}, "partial_rotary_factor 0.3125 of head_dim 16"},
      {{{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 4.0}}}},
       "RoPE scaling (rope_scaling type 'dynamic')"},
      {{{"scoring_func", "softmax"}}, "scoring_func 'softmax'"},
      {{{"topk_method", "greedy"}}, "topk_method 'greedy'"},
      {{{"n_group", 3}}, "do not form 3 groups"},
  };
  int n = 0;
  for (const auto& k : configs) {
    INFO(k.changes.dump());
    json c = glm_config(t);
    c.update(k.changes);
    const std::string d = dir.file("config-" + std::to_string(++n));
    write_hf_dir(d, c, glm_weights(t, 6), 1);
    REQUIRE_THAT(test::error_of([&] { test::import_hf_held(d); }), Catch::Contains(k.message));
  }
  // Multi-token-prediction layers after the last are skipped, and the report says so.
  json c = glm_config(t);
  c["num_nextn_predict_layers"] = 1;
  auto w = glm_weights(t, 6);
  w["model.layers.3.eh_proj.weight"] = test::random_tensor({t.D, 2 * t.D}, 9);
  w["model.layers.3.mlp.experts.0.up_proj.weight"] = test::random_tensor({t.F, t.D}, 10);
  write_hf_dir(dir.file("mtp"), c, w, 1);
  io::HfImportReport report;
  test::import_hf_held(dir.file("mtp"), {}, &report);
  REQUIRE(report.unmapped.empty());
  bool noted = false;
  for (const std::string& note : report.notes)
    noted = noted || note.find("multi-token-prediction layers (3..3") != std::string::npos;
  REQUIRE(noted);
  // Exports: a dense layer after an MoE layer has no HF GLM form, nor a llama.cpp glm4moe one
  // (its leading_dense_block_count); a shared expert that is no whole number of experts has no
  // glm4moe form (llama.cpp sizes it expert_shared_count x expert_feed_forward_length).
  write_hf_dir(dir.file("ok"), glm_config(t), glm_weights(t, 6), 1);
  const io::Checkpoint ckpt = test::import_hf_held(dir.file("ok"));
  io::Checkpoint late = ckpt;
  ModelConfig mc = model_config_from_json(late.model_config);
  mc.experts_per_layer = {t.E, 0, t.E};
  late.model_config = to_json(mc);
  REQUIRE_THAT(test::error_of([&] { io::export_hf(late, dir.file("late")); }),
               Catch::Contains("dense layers only before the first MoE layer"));
  REQUIRE_THAT(test::error_of([&] { io::export_gguf(late, dir.file("late.gguf"), {}); }),
               Catch::Contains("dense layers only before the first MoE layer"));
  io::Checkpoint odd_shared = ckpt;
  mc = model_config_from_json(ckpt.model_config);
  mc.shared_expert_ff = t.F + 1;
  odd_shared.model_config = to_json(mc);
  REQUIRE_THAT(test::error_of([&] { io::export_gguf(odd_shared, dir.file("odd.gguf"), {}); }),
               Catch::Contains("sizes the shared expert in whole experts"));
  REQUIRE_FALSE(std::filesystem::exists(dir.file("odd.gguf")));
  // A mixtral model with a GLM feature has no HF Mixtral form, nor llama.cpp's llama one.
  io::Checkpoint mixtral = ckpt;
  mc = model_config_from_json(ckpt.model_config);
  mc.arch = Arch::mixtral;
  mc.experts_per_layer = {t.E, t.E, t.E};
  mc.router_scoring = nn::RouterScoring::softmax;
  mc.qkv_bias = mc.qk_norm = false;  // refused for any arch but glm4_moe by the config itself
  mixtral.model_config = to_json(mc);
  REQUIRE_THAT(test::error_of([&] { io::export_hf(mixtral, dir.file("mixtral")); }),
               Catch::Contains("HF Mixtral has no partial RoPE (rope_dim)"));
  REQUIRE_THAT(test::error_of([&] { io::export_gguf(mixtral, dir.file("mixtral.gguf"), {}); }),
               Catch::Contains("has no partial RoPE (rope_dim)"));
}

TEST_CASE("glm4_moe: the whole family's gradient matches finite differences",
          "[hf][glm4_moe][gradcheck]") {
  ModelConfig c;
  c.arch = Arch::glm4_moe;
  c.vocab_size = 11, c.layers = 2, c.d_model = 8, c.heads = 2, c.kv_heads = 1, c.head_dim = 6;
  c.rope_dim = 4, c.d_ff = 6, c.dense_ff = 10, c.shared_expert_ff = 6, c.seq = 5;
  c.experts = 4, c.moe_every = 2, c.top_k = 4;  // k = E: the choice is fixed under perturbation
  c.qkv_bias = true, c.qk_norm = true, c.normalize_topk = true;
  c.router_scoring = nn::RouterScoring::sigmoid;
  c.router_groups = 2, c.router_group_topk = 2, c.routed_scale = 2.5;
  c.aux_loss_coef = 0.5, c.z_loss_coef = 0.1;
  c.resolve();
  ParamSet ps(5);
  Transformer model(c, ps);
  Tensor ids = test::random_ids({2, c.seq}, 1, int32_t(c.vocab_size));
  Tensor targets = test::random_ids({2, c.seq}, 2, int32_t(c.vocab_size));
  for (Param* p : ps.all()) {
    if (p->name.find("norm") != std::string::npos || p->frozen) continue;
    p->value.copy_from(test::random_tensor(p->value.shape(), hash_name(p->name), 0.3f));
    p->refresh_compute();
  }
  nn::RouterStep step;
  step.training = false;
  ps.zero_grad();
  model.forward_backward(ids, targets, step);
  REQUIRE(ps.find("blocks.0.mlp.w1")->value.shape() == Shape{10, 8});
  for (Param* p : ps.all()) {
    if (p->frozen) continue;
    DYNAMIC_SECTION(p->name) {
      Tensor analytic = p->grad.clone();
      auto loss = [&] {
        p->refresh_compute();
        return model.evaluate(ids, targets).total;
      };
      MOE_REQUIRE_GRAD(test::check_gradient(p->value, analytic, loss, 1e-2, 12), 2e-2);
      p->refresh_compute();
    }
  }
}
