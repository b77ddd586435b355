// Hugging Face checkpoint import/export. The tests write tiny HF-format directories themselves
// (config.json + safetensors, sharded with an index or not) and check:
//   - an imported tiny Mixtral, loaded as our Transformer, gives the logits of an independent
//     reference written here straight from HF's math and HF-named tensors (rotate_half RoPE,
//     GQA, softmax -> top-k -> renormalise router, SwiGLU experts); q/k rows in the other RoPE
//     convention do not (the check can fail);
//   - the fused gate_up_proj/down_proj layout imports to the same parameters;
//   - export -> import is the identity (bitwise parameters, same model config) and the model
//     scores text identically before and after; f32 and bf16;
//   - storage dtypes, unmapped tensors, missing shards, shape mismatches, missing tensors and
//     unsupported features (shared experts, qk-norm, biases)
//     each give a clear error, never a silent drop.
// Shape letters: V vocabulary, D hidden, H heads, KV kv heads, hd head dim, F expert hidden,
// E experts, k top-k, L layers, B batch, T sequence.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/io/hf_checkpoint.h"
#include "moe/io/safetensors.h"
#include "support/gradcheck.h"
#include "support/hf_families.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using namespace moe::test::hf;

// The same weights in the fused layout newer transformers write: per layer
// mlp.experts.gate_up_proj [E, 2F, D] (w1 rows then w3 rows), mlp.experts.down_proj [E, D, F],
// router mlp.gate.weight.
std::map<std::string, Tensor> fused_form(const Tiny& t, const std::map<std::string, Tensor>& w) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : w)
    if (name.find("block_sparse_moe") == std::string::npos) out[name] = tensor;
  for (int64_t i = 0; i < t.L; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    out[p + "mlp.gate.weight"] = w.at(p + "block_sparse_moe.gate.weight");
    Tensor gate_up = Tensor::empty({t.E, 2 * t.F, t.D}), down = Tensor::empty({t.E, t.D, t.F});
    const size_t block = size_t(t.F * t.D) * sizeof(float);
    for (int64_t e = 0; e < t.E; ++e) {
      const std::string x = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      auto* gu = reinterpret_cast<char*>(gate_up.raw()) + 2 * e * block;
      std::memcpy(gu, w.at(x + "w1.weight").raw(), block);
      std::memcpy(gu + block, w.at(x + "w3.weight").raw(), block);
      std::memcpy(reinterpret_cast<char*>(down.raw()) + e * block, w.at(x + "w2.weight").raw(),
                  block);
    }
    out[p + "mlp.experts.gate_up_proj"] = gate_up;
    out[p + "mlp.experts.down_proj"] = down;
  }
  return out;
}

std::string import_error(const std::string& dir, io::HfImportReport* report = nullptr,
                         io::HfImportOptions options = {}) {
  return test::error_of([&] { test::import_hf_held(dir, options, report); });
}

}  // namespace

TEST_CASE("hf: a sharded tiny Mixtral imports and matches an independent HF reference", "[hf]") {
  test::ScratchDir dir("hf-import");
  const Tiny t;
  const auto weights = mixtral_weights(t, 1);
  write_hf_dir(dir.file("hf"), mixtral_config(t), weights, 2);

  io::HfImportReport report;
  io::Checkpoint ckpt = test::import_hf_held(dir.file("hf"), false, &report);
  REQUIRE(report.family == "mixtral");
  REQUIRE(report.mapped.size() == weights.size());  // every source tensor accounted for
  REQUIRE(report.unmapped.empty());
  REQUIRE(report.unsupported.empty());

  // A normal checkpoint: our config keys, our names, expert flags, provenance.
  const ModelConfig mc = model_config_from_json(ckpt.model_config);
  REQUIRE(mc.arch == Arch::mixtral);
  REQUIRE(mc.vocab_size == t.V);
  REQUIRE(mc.d_model == t.D);
  REQUIRE(mc.heads == t.H);
  REQUIRE(mc.kv_heads == t.KV);
  REQUIRE(mc.d_ff == t.F);
  REQUIRE(mc.layers == t.L);
  REQUIRE(mc.experts_per_layer == std::vector<int64_t>(size_t(t.L), t.E));
  REQUIRE(mc.top_k == t.k);
  REQUIRE(mc.normalize_topk);
  REQUIRE(mc.capacity_factor == 0);
  REQUIRE(mc.rope_theta == t.theta);
  REQUIRE(mc.norm_eps == t.eps);
  REQUIRE(mc.seq == t.max_pos);
  REQUIRE(mc.aux_loss_coef == 0.02);
  REQUIRE(mc.dtype == DType::f32);
  REQUIRE_FALSE(ckpt.provenance.tool.empty());
  REQUIRE_FALSE(ckpt.provenance.time.empty());
  REQUIRE(param(ckpt, "blocks.1.moe.experts.w2").expert);
  REQUIRE_FALSE(param(ckpt, "blocks.1.moe.router.weight").expert);
  REQUIRE(param(ckpt, "blocks.1.moe.experts.w3").tensor.shape() == Shape{t.E, t.F, t.D});
  // Expert 2's w3 is the HF tensor, bit for bit; q rows are copied unpermuted.
  const Tensor& w3 = param(ckpt, "blocks.1.moe.experts.w3").tensor;
  REQUIRE(same_bytes(w3.rows(2, 3).reshape({t.F, t.D}),
                     weights.at("model.layers.1.block_sparse_moe.experts.2.w3.weight")));
  REQUIRE(same_bytes(param(ckpt, "blocks.0.attn.q.weight").tensor,
                     weights.at("model.layers.0.self_attn.q_proj.weight")));

  // Our Transformer on the imported checkpoint gives HF Mixtral's logits.
  const int64_t B = 2, T = 12;
  const auto ids = random_token_ids(B * T, int32_t(t.V), 7);
  const std::vector<float> ours = our_logits(ckpt, dir.file("ours.h5"), ids, B, T);
  const Vec reference = hf_reference_logits(t, weights, ids, B, T, true);
  const double error = relative_error(ours, reference);
  INFO("relative error " << error);
  REQUIRE(error < 1e-5);

  // Negative control: q/k rows in the interleaved RoPE convention (pairs (2i, 2i+1), as in the
  // original Mistral/Meta checkpoints) are a different model; the comparison above notices.
  auto interleaved = weights;
  for (int64_t l = 0; l < t.L; ++l)
    for (const char* proj : {"q_proj", "k_proj"}) {
      const std::string name =
          "model.layers." + std::to_string(l) + ".self_attn." + proj + ".weight";
      Tensor src = weights.at(name), dst = Tensor::empty(src.shape());
      const int64_t rows = src.dim(0), hd = t.hd();
      for (int64_t r = 0; r < rows; ++r) {  // HF row (head, half, i) <- row (head, 2i + half)
        const int64_t head = r / hd, j = r % hd, i = j % (hd / 2), half = j / (hd / 2);
        std::memcpy(dst.data<float>() + r * t.D,
                    src.data<float>() + (head * hd + 2 * i + half) * t.D,
                    size_t(t.D) * sizeof(float));
      }
      interleaved[name] = dst;
    }
  write_hf_dir(dir.file("hf-interleaved"), mixtral_config(t), interleaved, 1);
  const std::vector<float> wrong =
      our_logits(test::import_hf_held(dir.file("hf-interleaved")), dir.file("wrong.h5"), ids, B, T);
  REQUIRE(relative_error(wrong, reference) > 1e-3);
}

TEST_CASE("hf: the fused gate_up_proj/down_proj layout imports to the same parameters", "[hf]") {
  test::ScratchDir dir("hf-fused");
  const Tiny t;
  const auto weights = mixtral_weights(t, 2);
  write_hf_dir(dir.file("per-expert"), mixtral_config(t), weights, 1);
  write_hf_dir(dir.file("fused"), mixtral_config(t), fused_form(t, weights), 2);
  io::HfImportReport report;
  io::Checkpoint fused = test::import_hf_held(dir.file("fused"), {}, &report);
  require_same_params(test::import_hf_held(dir.file("per-expert")), fused);
  REQUIRE(report.mapped.size() == fused_form(t, weights).size());

  // A fused tensor in the transposed layout [E, D, 2F] is a shape error, not a silent transpose.
  auto transposed = fused_form(t, weights);
  transposed["model.layers.0.mlp.experts.gate_up_proj"] =
      test::random_tensor({t.E, t.D, 2 * t.F}, 3);
  write_hf_dir(dir.file("transposed"), mixtral_config(t), transposed, 1);
  const std::string message = import_error(dir.file("transposed"));
  REQUIRE_THAT(message, Catch::Contains("model.layers.0.mlp.experts.gate_up_proj"));
  REQUIRE_THAT(message, Catch::Contains("config.json implies [4,96,32]"));

  // Per-expert and fused tensors in one layer are contradictory.
  auto both = fused_form(t, weights);
  both["model.layers.0.block_sparse_moe.experts.0.w1.weight"] =
      weights.at("model.layers.0.block_sparse_moe.experts.0.w1.weight");
  write_hf_dir(dir.file("both"), mixtral_config(t), both, 1);
  REQUIRE_THAT(import_error(dir.file("both")), Catch::Contains("both per-expert and fused"));
}

TEST_CASE("hf: export -> import is the identity and scores text identically", "[hf]") {
  test::ScratchDir dir("hf-export");
  const Tiny t;
  const auto weights = mixtral_weights(t, 3);
  write_hf_dir(dir.file("hf"), mixtral_config(t), weights, 2);
  const io::Checkpoint imported = test::import_hf_held(dir.file("hf"));

  io::export_hf(imported, dir.file("exported"));
  // The export is HF Mixtral: its config keys and per-expert names, the source tensors' bytes.
  const json config = json::parse(test::read_file(dir.file("exported/config.json")));
  REQUIRE(config["model_type"] == "mixtral");
  REQUIRE(config["num_local_experts"] == t.E);
  REQUIRE(config["num_key_value_heads"] == t.KV);
  REQUIRE(config["intermediate_size"] == t.F);
  REQUIRE(config["max_position_embeddings"] == t.max_pos);
  REQUIRE(config["tie_word_embeddings"] == false);
  REQUIRE(config["rope_theta"] == t.theta);
  io::SafetensorsReader exported(dir.file("exported/model.safetensors"));
  REQUIRE(exported.tensors().size() == weights.size());
  REQUIRE(exported.metadata().at("format") == "pt");
  for (const auto& [name, tensor] : weights) {
    INFO("tensor " << name);
    REQUIRE(exported.find(name) != nullptr);
    REQUIRE(same_bytes(exported.read(name), tensor));
  }

  const io::Checkpoint again = test::import_hf_held(dir.file("exported"));
  require_same_params(imported, again);
  REQUIRE(again.model_config == imported.model_config);

  // The key check: the model scores text identically before export and after export -> import.
  const std::string text = "Mixture-of-experts models route every token to a few experts.";
  const int64_t T = 48;
  std::vector<int32_t> ids, targets;
  for (int64_t i = 0; i < T; ++i) {
    ids.push_back(static_cast<unsigned char>(text[size_t(i)]));
    targets.push_back(static_cast<unsigned char>(text[size_t(i + 1)]));
  }
  auto score = [&](const io::Checkpoint& c, const std::string& file) {
    io::save_checkpoint(dir.file(file), c);
    infer::LoadedModel m = infer::load_model(dir.file(file));
    return m.model->evaluate(Tensor::from_vector({1, T}, ids), Tensor::from_vector({1, T}, targets))
        .loss;
  };
  const double before = score(imported, "before.h5"), after = score(again, "after.h5");
  INFO("loss before " << before << ", after " << after);
  REQUIRE(before > 1.0);  // a random model: a real, non-trivial score
  REQUIRE(std::abs(before - after) <= 1e-6 * before);
  // ... and it is HF Mixtral's score: the reference logits give the same mean NLL.
  const Vec logits = hf_reference_logits(t, weights, ids, 1, T, true);
  double nll = 0;
  for (int64_t r = 0; r < T; ++r) {
    const double* row = logits.data() + r * t.V;
    double top = *std::max_element(row, row + t.V), sum = 0;
    for (int64_t v = 0; v < t.V; ++v) sum += std::exp(row[v] - top);
    nll += top + std::log(sum) - row[targets[size_t(r)]];
  }
  REQUIRE(std::abs(nll / double(T) - before) <= 1e-5 * before);
}

TEST_CASE("hf: a model of our own (f32 and bf16) survives export -> import bitwise", "[hf]") {
  test::ScratchDir dir("hf-own");
  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO("dtype " << dtype_name(dtype));
    ModelConfig c = test::small_model_config(Arch::mixtral);
    c.dtype = dtype;
    c.z_loss_coef = 0.005;  // not in HF's config: kept through the exporter's metadata record
    c.seq = 24;
    c.resolve();
    const io::Checkpoint ckpt = test::initial_checkpoint(c, 11, dtype);

    const std::string out = dir.file(std::string("own-") + dtype_name(dtype));
    io::export_hf(ckpt, out);
    io::HfImportReport report;
    const io::Checkpoint back = test::import_hf_held(out, {}, &report);
    REQUIRE(back.model_config == ckpt.model_config);
    REQUIRE(back.params.size() == ckpt.params.size());
    for (const io::NamedTensor& p : ckpt.params) {
      INFO("parameter " << p.name);
      const io::NamedTensor& q = param(back, p.name);
      REQUIRE(q.expert == p.expert);
      REQUIRE(same_bytes(q.tensor, p.tensor));
    }
    // Issue 44, defect 5: max_seq caps the recorded config's seq as it caps config.json's (the
    // record was taken whole, seq included), and the report says so. The rest is the record.
    io::HfImportOptions short_context;
    short_context.max_seq = 16;
    io::HfImportReport capped_report;
    const ModelConfig capped = model_config_from_json(
        test::import_hf_held(out, short_context, &capped_report).model_config);
    REQUIRE(capped.seq == 16);
    REQUIRE(capped.z_loss_coef == c.z_loss_coef);
    REQUIRE(std::find(capped_report.notes.begin(), capped_report.notes.end(),
                      "context (seq) capped at 16 of the recorded 24 (max_seq)") !=
            capped_report.notes.end());
    // Without the metadata record, config.json alone still gives the same model math.
    io::SafetensorsReader st(out + "/model.safetensors");
    std::vector<io::NamedTensor> tensors;
    for (const auto& e : st.tensors()) tensors.push_back({e.name, st.read(e.name), false, {}});
    io::write_safetensors(out + "/model.safetensors", tensors, {{"format", "pt"}});
    const ModelConfig plain = model_config_from_json(test::import_hf_held(out).model_config);
    REQUIRE(plain.dtype == dtype);
    REQUIRE(plain.seq == c.seq);
    REQUIRE(plain.d_ff == c.d_ff);
    REQUIRE(plain.kv_heads == c.kv_heads);
    REQUIRE(plain.normalize_topk);
    REQUIRE(plain.z_loss_coef == 0);  // HF has no z-loss
  }

  // What HF Mixtral cannot hold is refused.
  ModelConfig gpt = test::small_model_config(Arch::gpt);
  gpt.resolve();
  io::Checkpoint g;
  g.model_config = to_json(gpt);
  REQUIRE_THAT(test::error_of([&] { io::export_hf(g, dir.file("gpt")); }),
               Catch::Contains("only the mixtral flavour"));
  ModelConfig dense = test::small_model_config(Arch::mixtral);
  dense.moe_every = 2;
  dense.resolve();
  g.model_config = to_json(dense);
  REQUIRE_THAT(test::error_of([&] { io::export_hf(g, dir.file("dense")); }),
               Catch::Contains("layer 0 is dense"));
}

TEST_CASE("hf: an export over one of more shards (--force) removes the shards it replaced",
          "[hf]") {
  // Before: the old model-0000N-of-0000M.safetensors files stayed beside the new index, which no
  // longer named them (a directory holding two models' weights).
  test::ScratchDir dir("hf-reshard");
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.resolve();
  const io::Checkpoint ckpt = test::initial_checkpoint(c, 7, DType::f32);
  int64_t largest = 0, total = 0;
  for (const io::NamedTensor& p : ckpt.params) {
    largest = std::max<int64_t>(largest, p.tensor.nbytes());
    total += static_cast<int64_t>(p.tensor.nbytes());
  }
  const std::string out = dir.file("hf");
  const auto shards = [&] {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(out))
      if (entry.path().extension() == ".safetensors") names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  };
  io::HfExportOptions many;
  many.max_shard_bytes = largest;  // about one tensor a shard
  io::export_hf(ckpt, out, many);
  const size_t before = shards().size();
  REQUIRE(before > 3);
  // Files the old index does not name stay, even in our naming.
  test::write_file(out + "/notes.txt", "mine\n");
  test::write_file(out + "/model-00001-of-00099.safetensors", "not ours to remove");

  io::HfExportOptions few;
  few.max_shard_bytes = total / 2 + largest;
  few.replace = true;
  io::export_hf(ckpt, out, few);
  const std::vector<std::string> after = shards();
  const json index = json::parse(test::read_file(out + "/model.safetensors.index.json"));
  std::vector<std::string> named;
  for (const auto& entry : index["weight_map"].items()) named.push_back(entry.value());
  std::sort(named.begin(), named.end());
  named.erase(std::unique(named.begin(), named.end()), named.end());
  REQUIRE(named.size() < before);
  named.push_back("model-00001-of-00099.safetensors");
  std::sort(named.begin(), named.end());
  REQUIRE(after == named);
  REQUIRE(test::read_file(out + "/notes.txt") == "mine\n");
  // What is left is one whole model.
  const io::Checkpoint back = test::import_hf_held(out);
  REQUIRE(back.params.size() == ckpt.params.size());
}

TEST_CASE("hf: storage dtypes are kept, or converted to f32 when mixed", "[hf]") {
  test::ScratchDir dir("hf-dtype");
  const Tiny t;
  const auto weights = mixtral_weights(t, 4);
  std::map<std::string, Tensor> bf16, mixed;
  for (const auto& [name, tensor] : weights) {
    bf16[name] = tensor.to(DType::bf16);
    mixed[name] = name.find("norm") != std::string::npos ? tensor : tensor.to(DType::bf16);
  }
  write_hf_dir(dir.file("bf16"), mixtral_config(t), bf16, 2);
  const io::Checkpoint b = test::import_hf_held(dir.file("bf16"));
  REQUIRE(model_config_from_json(b.model_config).dtype == DType::bf16);
  REQUIRE(same_bytes(param(b, "embed.tokens").tensor, bf16.at("model.embed_tokens.weight")));
  REQUIRE(param(b, "blocks.0.moe.experts.w1").tensor.dtype() == DType::bf16);
  // bf16 means bf16 storage: every activation stays f32 (the residual stream is never rounded),
  // so the bf16 model is HF's f32 evaluation of those weights (the fp64 reference on the upcast
  // weights) to f32 rounding, and gives the very bits of an f32 model holding the upcast values.
  // Rounding the residual stream to bf16 after each block made it differ by 2.6e-3 of the logits.
  std::map<std::string, Tensor> upcast;
  for (const auto& [name, tensor] : bf16) upcast[name] = tensor.to(DType::f32);
  const int64_t B = 2, T = 12;
  const auto ids = random_token_ids(B * T, int32_t(t.V), 8);
  const std::vector<float> ours = our_logits(b, dir.file("bf16.h5"), ids, B, T);
  const double error = relative_error(ours, hf_reference_logits(t, upcast, ids, B, T, true));
  INFO("bf16 model against the fp64 evaluation of its weights: relative error " << error);
  REQUIRE(error < 1e-5);
  write_hf_dir(dir.file("upcast"), mixtral_config(t), upcast, 1);
  REQUIRE(ours == our_logits(test::import_hf_held(dir.file("upcast")), dir.file("upcast.h5"), ids, B, T));

  write_hf_dir(dir.file("mixed"), mixtral_config(t), mixed, 1);
  io::HfImportReport report;
  const io::Checkpoint m = test::import_hf_held(dir.file("mixed"), {}, &report);
  REQUIRE(model_config_from_json(m.model_config).dtype == DType::f32);
  REQUIRE(report.notes.size() == 1);
  REQUIRE_THAT(report.notes[0], Catch::Contains("converted to f32"));
  REQUIRE(same_bytes(param(m, "blocks.1.norm2.weight").tensor,
                     weights.at("model.layers.1.post_attention_layernorm.weight")));
  REQUIRE(same_bytes(param(m, "lm_head.weight").tensor,
                     bf16.at("lm_head.weight").to(DType::f32)));  // exact upcast
}

TEST_CASE("hf: unmapped tensors are an error unless allowed, and then listed", "[hf]") {
  test::ScratchDir dir("hf-unmapped");
  const Tiny t;
  auto weights = mixtral_weights(t, 5);
  weights["model.layers.0.block_sparse_moe.mystery"] = test::random_tensor({3}, 1);
  weights["extra.scale"] = test::random_tensor({1}, 2);
  write_hf_dir(dir.file("hf"), mixtral_config(t), weights, 2);
  const std::string message = import_error(dir.file("hf"));
  REQUIRE_THAT(message, Catch::Contains("2 tensors have no counterpart"));
  REQUIRE_THAT(message, Catch::Contains("model.layers.0.block_sparse_moe.mystery"));
  REQUIRE_THAT(message, Catch::Contains("extra.scale"));

  io::HfImportReport report;
  io::Checkpoint ckpt = test::import_hf_held(dir.file("hf"), true, &report);
  REQUIRE(report.unmapped ==
          std::vector<std::string>{"extra.scale", "model.layers.0.block_sparse_moe.mystery"});
  REQUIRE(report.mapped.size() + report.unmapped.size() == weights.size());
  REQUIRE(ckpt.params.size() == size_t(2 + t.L * 10 + 1));  // embed, 10 per block, norm, head
}

TEST_CASE("hf: missing shards, missing tensors and shape mismatches are clear errors", "[hf]") {
  test::ScratchDir dir("hf-broken");
  const Tiny t;
  const auto weights = mixtral_weights(t, 6);

  write_hf_dir(dir.file("shard"), mixtral_config(t), weights, 2);
  fs::remove(dir.file("shard/model-00002-of-00002.safetensors"));
  REQUIRE_THAT(
      import_error(dir.file("shard")),
      Catch::Contains("names the shard 'model-00002-of-00002.safetensors', which is missing"));

  // Absurd counts are refused before anything is sized by them (the fuzzer's input).
  for (const char* key : {"num_local_experts", "num_hidden_layers", "num_key_value_heads"}) {
    json absurd = mixtral_config(t);
    absurd[key] = int64_t(8000000000143474);
    write_hf_dir(dir.file(std::string("absurd-") + key), absurd, weights, 1);
    REQUIRE_THAT(import_error(dir.file(std::string("absurd-") + key)),
                 Catch::Contains(std::string("\"") + key + "\" is 8000000000143474: it must be " +
                                 "between 1 and 65536"));
  }
  json no_experts = mixtral_config(t);
  no_experts["num_local_experts"] = -3;
  write_hf_dir(dir.file("no-experts"), no_experts, weights, 1);
  REQUIRE_THAT(import_error(dir.file("no-experts")),
               Catch::Contains("\"num_local_experts\" is -3: it must be between 1 and 65536"));
  for (const char* key : {"num_hidden_layers", "num_attention_heads", "num_experts_per_tok"}) {
    json zero = mixtral_config(t);
    zero[key] = 0;
    write_hf_dir(dir.file(std::string("zero-") + key), zero, weights, 1);
    REQUIRE_THAT(import_error(dir.file(std::string("zero-") + key)),
                 Catch::Contains(std::string("\"") + key +
                                 "\" is 0: it must be between 1 and 65536"));
  }

  json kv = mixtral_config(t);
  kv["num_key_value_heads"] = 4;  // k_proj holds 2 kv heads
  write_hf_dir(dir.file("kv"), kv, weights, 1);
  std::string message = import_error(dir.file("kv"));
  REQUIRE_THAT(message,
               Catch::Contains("tensor 'model.layers.0.self_attn.k_proj.weight' is [16,32]"));
  REQUIRE_THAT(message, Catch::Contains("config.json implies [32,32]"));

  json ffn = mixtral_config(t);
  ffn["intermediate_size"] = 40;
  write_hf_dir(dir.file("ffn"), ffn, weights, 1);
  REQUIRE_THAT(import_error(dir.file("ffn")),
               Catch::Contains("is [48,32], but config.json implies [40,32]"));

  json layers = mixtral_config(t);
  layers["num_hidden_layers"] = 1;
  write_hf_dir(dir.file("layers"), layers, weights, 1);
  REQUIRE_THAT(import_error(dir.file("layers")),
               Catch::Contains("belongs to layer 1, but config.json has num_hidden_layers 1"));

  auto incomplete = weights;
  incomplete.erase("model.layers.1.block_sparse_moe.experts.2.w3.weight");
  write_hf_dir(dir.file("incomplete"), mixtral_config(t), incomplete, 1);
  REQUIRE_THAT(import_error(dir.file("incomplete")),
               Catch::Contains("no tensor for blocks.1.moe.experts.w3 expert 2"));

  auto headless = weights;
  headless.erase("lm_head.weight");
  write_hf_dir(dir.file("headless"), mixtral_config(t), headless, 1);
  REQUIRE_THAT(import_error(dir.file("headless")), Catch::Contains("no tensor for the LM head"));

  auto twice = weights;  // the router under both prefixes
  twice["model.layers.0.mlp.gate.weight"] =
      weights.at("model.layers.0.block_sparse_moe.gate.weight");
  write_hf_dir(dir.file("twice"), mixtral_config(t), twice, 1);
  REQUIRE_THAT(import_error(dir.file("twice")),
               Catch::Contains("both give blocks.0.moe.router.weight"));

  // An index that does not describe its shards.
  write_hf_dir(dir.file("index"), mixtral_config(t), weights, 2);
  json index = json::parse(test::read_file(dir.file("index/model.safetensors.index.json")));
  index["weight_map"].erase("lm_head.weight");
  test::write_file(dir.file("index/model.safetensors.index.json"), index.dump());
  REQUIRE_THAT(import_error(dir.file("index")),
               Catch::Contains("holds tensor 'lm_head.weight', which"));

  write_hf_dir(dir.file("noconfig"), mixtral_config(t), weights, 1);
  fs::remove(dir.file("noconfig/config.json"));
  REQUIRE_THAT(import_error(dir.file("noconfig")), Catch::Contains("no config.json"));
}

TEST_CASE("hf: unsupported features are refused naming the feature", "[hf]") {
  test::ScratchDir dir("hf-unsupported");
  const Tiny t;
  const auto olmoe_weights = olmoe_form(mixtral_weights(t, 7));
  auto base = [&](const std::string& model_type) {
    json c = mixtral_config(t);
    c.erase("num_local_experts");
    c["model_type"] = model_type;
    c["num_experts"] = t.E;
    return c;
  };

  // A Mixtral checkpoint with the tensors of other families' features (a shared expert,
  // q/k/v biases, qk-norm): our mixtral flavour has none of them.
  auto extra = mixtral_weights(t, 7);
  for (int64_t l = 0; l < t.L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    extra[p + "mlp.shared_expert.gate_proj.weight"] = test::random_tensor({2 * t.F, t.D}, 1);
    extra[p + "mlp.shared_expert.up_proj.weight"] = test::random_tensor({2 * t.F, t.D}, 2);
    extra[p + "mlp.shared_expert.down_proj.weight"] = test::random_tensor({t.D, 2 * t.F}, 3);
    extra[p + "mlp.shared_expert_gate.weight"] = test::random_tensor({1, t.D}, 4);
    extra[p + "self_attn.q_proj.bias"] = test::random_tensor({t.D}, 5);
  }
  extra["model.layers.0.self_attn.q_norm.weight"] = test::random_tensor({t.hd()}, 6);
  write_hf_dir(dir.file("extra"), mixtral_config(t), extra, 2);
  io::HfImportReport report;
  std::string message = import_error(dir.file("extra"), &report);
  REQUIRE_THAT(message, Catch::Contains("our mixtral flavour does not have"));
  REQUIRE(report.family == "mixtral");
  // One line per feature (named by its first tensor, with how many more).
  REQUIRE(report.unsupported ==
          std::vector<std::string>{
              "shared expert (tensor model.layers.0.mlp.shared_expert.down_proj.weight and 7 more)",
              "qk-norm (self_attn.q_norm/k_norm) (tensor model.layers.0.self_attn.q_norm.weight)",
              "attention biases (tensor model.layers.0.self_attn.q_proj.bias and 1 more)"});
  // Refused even with allow_unmapped: unsupported features are never dropped.
  io::HfImportOptions lenient;
  lenient.allow_unmapped = true;
  REQUIRE_THAT(import_error(dir.file("extra"), nullptr, lenient), Catch::Contains("shared expert"));

  // A shared expert in a family that has none (config), and an o_proj bias (tensor).
  json shared = base("olmoe");
  shared["shared_expert_intermediate_size"] = 2 * t.F;
  auto o_bias = olmoe_weights;
  o_bias["model.layers.1.self_attn.o_proj.bias"] = test::random_tensor({t.D}, 8);
  write_hf_dir(dir.file("shared"), shared, o_bias, 1);
  REQUIRE(import_error(dir.file("shared"), &report) != "");
  REQUIRE(report.unsupported ==
          std::vector<std::string>{"shared expert (shared_expert_intermediate_size 96)",
                                   "attention output bias (self_attn.o_proj.bias) (tensor "
                                   "model.layers.1.self_attn.o_proj.bias)"});

  // An unknown family, RoPE scaling. (Tied embeddings and sliding windows import since issue 44:
  // test_hf_window_tied.cpp.)
  json other = mixtral_config(t);
  other["model_type"] = "dbrx";  // deepseek_v2/v3 import (test_hf_deepseek_v3.cpp)
  write_hf_dir(dir.file("other"), other, mixtral_weights(t, 8), 1);
  REQUIRE_THAT(import_error(dir.file("other")),
               Catch::Contains("model_type 'dbrx' is not supported"));
  json scaled = mixtral_config(t);
  scaled["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  write_hf_dir(dir.file("scaled"), scaled, mixtral_weights(t, 8), 1);
  REQUIRE_THAT(import_error(dir.file("scaled")), Catch::Contains("RoPE scaling"));
}
