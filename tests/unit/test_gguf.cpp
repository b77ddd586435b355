// GGUF export (moe/io/gguf.h): a tiny mixtral model of our own exported in each type and read
// back with our reader; every tensor's values against the checkpoint's (exact for f32, the
// type's rounding for f16/bf16, Q8_0's own error bound); the q/k row permutation against the
// rotary embedding it stands for; Q8_0 blocks on hand-worked values; refusals and corrupted
// files. The independent read-back by the `gguf` Python package is tests/cli/gguf_readback.sh.
// Shape letters: D hidden, H heads, KV kv heads, hd head dim, F expert hidden, E experts.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "kernels/convert.h"
#include "moe/io/checkpoint.h"
#include "moe/io/gguf.h"
#include "moe/io/tokenizer.h"
#include "moe/models/transformer.h"
#include "moe/ops/dense.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

// Our own tiny mixtral model as a checkpoint (random initial values, `dtype` storage).
io::Checkpoint tiny_checkpoint(DType dtype, ModelConfig* config = nullptr) {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.dtype = dtype;
  c.d_model = 64;  // rows of 64 values: whole Q8_0 blocks
  c.heads = 4;
  c.kv_heads = 2;
  c.d_ff = 96;
  c.resolve();
  if (config) *config = c;
  return test::initial_checkpoint(c, 7, dtype);
}

const io::NamedTensor& param(const io::Checkpoint& c, const std::string& name) {
  for (const io::NamedTensor& p : c.params)
    if (p.name == name) return p;
  FAIL("no parameter " << name);
  throw;
}

// The rows of [rows, cols] in the order export_gguf writes q and k: row 2i + j of a head is row
// j * hd/2 + i (written here from the definition, not shared with the exporter).
std::vector<float> permuted(const std::vector<float>& w, int64_t heads, int64_t hd, int64_t cols) {
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t r = 0; r < hd; ++r) {
      const int64_t from = h * hd + (r % 2) * (hd / 2) + r / 2;
      for (int64_t c = 0; c < cols; ++c) out[(h * hd + r) * cols + c] = w[from * cols + c];
    }
  return out;
}

// The value `type` stores for x.
float rounded(float x, io::GgufType type) {
  if (type == io::GgufType::f16) return kernels::f16_to_f32(kernels::f32_to_f16(x));
  if (type == io::GgufType::bf16) return kernels::bf16_to_f32(kernels::f32_to_bf16(x));
  return x;
}

}  // namespace

TEST_CASE("gguf: Q8_0 blocks on hand-worked values", "[gguf]") {
  std::vector<float> x(64, 0.0f);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) / 16.0f;  // max |x| = 1
  x[5] = 0.5f * (1.0f / 127.0f) * 3;  // 1.5 steps: rounds half away from zero to 2
  // x[32..63] stay zero: scale 0, every q 0.
  std::vector<uint8_t> q(2 * io::kQ8BlockBytes);
  io::quantize_q8_0(x.data(), 64, q.data());
  uint16_t d16;
  std::memcpy(&d16, q.data(), 2);
  REQUIRE(d16 == kernels::f32_to_f16(1.0f / 127.0f));
  REQUIRE(static_cast<int8_t>(q[2 + 0]) == -127);  // -16/16 = -1
  REQUIRE(static_cast<int8_t>(q[2 + 5]) == 2);
  REQUIRE(static_cast<int8_t>(q[2 + 16]) == 0);
  REQUIRE(static_cast<int8_t>(q[2 + 24]) == 64);  // 0.5 * 127 = 63.5 rounds away from zero
  std::memcpy(&d16, q.data() + io::kQ8BlockBytes, 2);
  REQUIRE(d16 == 0);
  for (int j = 0; j < 32; ++j) REQUIRE(q[io::kQ8BlockBytes + 2 + j] == 0);
  std::vector<float> back(64);
  io::dequantize_q8_0(q.data(), 64, back.data());
  const float d = kernels::f16_to_f32(kernels::f32_to_f16(1.0f / 127.0f));
  for (int j = 0; j < 64; ++j) {
    INFO("value " << j);
    // Half a step of the f32 scale, plus the f16 scale's own rounding times |q| <= 127.
    REQUIRE(std::fabs(back[j] - x[j]) <= 0.5f / 127.0f + 127.0f * std::fabs(d - 1.0f / 127.0f));
  }
  REQUIRE_THROWS_WITH(io::quantize_q8_0(x.data(), 33, q.data()),
                      Catch::Contains("not whole blocks"));
}

TEST_CASE("gguf: export -> read back, every key and tensor, in each type", "[gguf]") {
  test::ScratchDir dir("gguf-export");
  ModelConfig c;
  const io::Checkpoint ckpt = tiny_checkpoint(DType::f32, &c);
  const int64_t D = c.d_model, H = c.heads, KV = c.kv_heads_resolved(), hd = D / H, F = c.d_ff;
  const int64_t E = c.experts_per_layer.front();
  for (io::GgufType type :
       {io::GgufType::f32, io::GgufType::f16, io::GgufType::bf16, io::GgufType::q8_0}) {
    INFO("type " << io::gguf_type_name(type));
    const std::string path = dir.file(std::string("tiny-") + io::gguf_type_name(type) + ".gguf");
    const io::GgufExportSummary s = io::export_gguf(ckpt, path, {type, "tiny"});
    REQUIRE(s.fallbacks.empty());
    REQUIRE(static_cast<uint64_t>(s.bytes) == fs::file_size(path));
    const io::GgufFile g = io::read_gguf(path);
    REQUIRE(g.version == 3);
    REQUIRE(static_cast<int64_t>(g.tensors.size()) == s.tensors);
    REQUIRE(s.tensors == 3 + 10 * c.layers);
    const auto& m = g.metadata;
    REQUIRE(m["general.architecture"]["value"] == "llama");
    REQUIRE(m["general.name"]["value"] == "tiny");
    REQUIRE(m["llama.embedding_length"]["value"] == D);
    REQUIRE(m["llama.block_count"]["value"] == c.layers);
    REQUIRE(m["llama.feed_forward_length"]["value"] == F);
    REQUIRE(m["llama.attention.head_count"]["value"] == H);
    REQUIRE(m["llama.attention.head_count_kv"]["value"] == KV);
    REQUIRE(m["llama.rope.dimension_count"]["value"] == hd);
    REQUIRE(m["llama.expert_count"]["value"] == E);
    REQUIRE(m["llama.expert_used_count"]["value"] == c.top_k);
    REQUIRE(m["llama.context_length"]["value"] == c.seq);
    REQUIRE(m["llama.rope.freq_base"]["value"].get<float>() == static_cast<float>(c.rope_theta));
    REQUIRE(m["llama.attention.layer_norm_rms_epsilon"]["value"].get<float>() ==
            static_cast<float>(c.norm_eps));
    REQUIRE(m["tokenizer.ggml.tokens"]["value"].size() == 256);
    REQUIRE(m["tokenizer.ggml.tokens"]["value"][static_cast<size_t>('a')] == "a");
    REQUIRE(m["tokenizer.ggml.tokens"]["value"][static_cast<size_t>(' ')] == "\xc4\xa0");  // U+0120
    REQUIRE(nlohmann::json::parse(m["moe.model_config"]["value"].get<std::string>()) == to_json(c));

    // Every tensor: its dims (fastest first) and values.
    auto check = [&](const std::string& gguf, const std::string& ours,
                     const std::vector<int64_t>& dims, bool matrix, std::vector<float> want) {
      INFO("tensor " << gguf);
      const io::GgufTensorInfo& t = g.tensor(gguf);
      REQUIRE(t.dims == dims);
      const io::GgufType stored = matrix ? type : io::GgufType::f32;
      REQUIRE(t.type == stored);
      if (want.empty()) want = param(ckpt, ours).tensor.to_vector();
      const std::vector<float> got = io::read_gguf_tensor(g, gguf);
      REQUIRE(got.size() == want.size());
      if (stored == io::GgufType::q8_0) {
        for (size_t b = 0; b < want.size() / 32; ++b) {
          float amax = 0;
          for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(want[b * 32 + j]));
          // Half a step, plus the scale's f16 rounding (relative 2^-11) over 127 steps.
          const float bound = amax / 127.0f * (0.5f + 127.0f * 0x1p-11f) + 1e-12f;
          for (size_t j = 0; j < 32; ++j)
            REQUIRE(std::fabs(got[b * 32 + j] - want[b * 32 + j]) <= bound);
        }
      } else {
        for (size_t i = 0; i < want.size(); ++i) REQUIRE(got[i] == rounded(want[i], stored));
      }
    };
    check("token_embd.weight", "embed.tokens", {D, c.vocab_size}, true, {});
    check("output.weight", "lm_head.weight", {D, c.vocab_size}, true, {});
    check("output_norm.weight", "final_norm.weight", {D}, false, {});
    for (int64_t i = 0; i < c.layers; ++i) {
      const std::string blk = "blk." + std::to_string(i) + ".",
                        b = "blocks." + std::to_string(i) + ".";
      check(blk + "attn_norm.weight", b + "norm1.weight", {D}, false, {});
      check(blk + "ffn_norm.weight", b + "norm2.weight", {D}, false, {});
      check(blk + "attn_q.weight", "", {D, H * hd}, true,
            permuted(param(ckpt, b + "attn.q.weight").tensor.to_vector(), H, hd, D));
      check(blk + "attn_k.weight", "", {D, KV * hd}, true,
            permuted(param(ckpt, b + "attn.k.weight").tensor.to_vector(), KV, hd, D));
      check(blk + "attn_v.weight", b + "attn.v.weight", {D, KV * hd}, true, {});
      check(blk + "attn_output.weight", b + "attn.o.weight", {H * hd, D}, true, {});
      check(blk + "ffn_gate_inp.weight", b + "moe.router.weight", {D, E}, false, {});
      check(blk + "ffn_gate_exps.weight", b + "moe.experts.w1", {D, F, E}, true, {});
      check(blk + "ffn_down_exps.weight", b + "moe.experts.w2", {F, D, E}, true, {});
      check(blk + "ffn_up_exps.weight", b + "moe.experts.w3", {D, F, E}, true, {});
    }
  }
}

TEST_CASE("gguf: the q/k permutation turns our rotary pairs into llama.cpp's adjacent ones",
          "[gguf]") {
  // A query row y (H heads of hd) rotated our way at position p, then permuted, equals the
  // permuted row rotated llama.cpp's way: pairs (2i, 2i + 1) by angle p * theta^(-2i / hd).
  const int64_t H = 2, hd = 8, T = 5;
  const float theta = 10000;
  std::vector<float> y(static_cast<size_t>(T * H * hd));
  for (size_t i = 0; i < y.size(); ++i) y[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f);
  Tensor x = Tensor::from_vector({T, H * hd}, y), ours = Tensor::empty({T, H * hd});
  ops::rope_forward(x, 1, T, H, theta, ours);
  const std::vector<float> rotated = ours.to_vector();
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> row(y.begin() + t * H * hd, y.begin() + (t + 1) * H * hd);
    std::vector<float> adj = permuted(row, H, hd, 1);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double angle = static_cast<double>(t) * std::pow(double(theta), -2.0 * i / hd);
        float& a = adj[static_cast<size_t>(h * hd + 2 * i)];
        float& b = adj[static_cast<size_t>(h * hd + 2 * i + 1)];
        const double ra = a * std::cos(angle) - b * std::sin(angle);
        const double rb = a * std::sin(angle) + b * std::cos(angle);
        a = static_cast<float>(ra);
        b = static_cast<float>(rb);
      }
    const std::vector<float> want =
        permuted({rotated.begin() + t * H * hd, rotated.begin() + (t + 1) * H * hd}, H, hd, 1);
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("position " << t << " element " << i);
      REQUIRE(adj[i] == Approx(want[i]).margin(1e-6));  // both in f32 of values below 2
    }
  }
}

TEST_CASE("gguf: a bf16 model exports as bf16 bitwise, and f16 refuses values beyond its range",
          "[gguf]") {
  test::ScratchDir dir("gguf-bf16");
  io::Checkpoint ckpt = tiny_checkpoint(DType::bf16);
  const std::string path = dir.file("bf16.gguf");
  io::export_gguf(ckpt, path, {io::GgufType::bf16, ""});
  const io::GgufFile g = io::read_gguf(path);
  REQUIRE(io::read_gguf_tensor(g, "blk.0.ffn_up_exps.weight") ==
          param(ckpt, "blocks.0.moe.experts.w3").tensor.to_vector());
  // 1e5 is beyond f16: refused naming the tensor, nothing written.
  for (io::NamedTensor& p : ckpt.params)
    if (p.name == "blocks.0.attn.v.weight") {
      Tensor big = p.tensor.to(DType::f32);
      big.data<float>()[3] = 1e5f;
      p.tensor = big.to(DType::bf16);
    }
  const std::string f16 = dir.file("f16.gguf");
  REQUIRE_THAT(test::error_of([&] {
                 io::export_gguf(ckpt, f16, {io::GgufType::f16, ""});
               }),
               Catch::Contains("blk.0.attn_v.weight") && Catch::Contains("beyond f16"));
  REQUIRE_FALSE(fs::exists(f16));
}

TEST_CASE("gguf: Q8_0 writes rows that are not whole blocks as f16, and says so", "[gguf]") {
  test::ScratchDir dir("gguf-fallback");
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.d_ff = 40;  // the down projection's rows (F values) are not whole blocks of 32
  c.resolve();
  const io::Checkpoint ckpt = test::initial_checkpoint(c, 3);
  REQUIRE(c.d_model % 32 == 0);  // every other matrix's rows are whole blocks
  const io::GgufExportSummary s =
      io::export_gguf(ckpt, dir.file("q8.gguf"), {io::GgufType::q8_0, ""});
  REQUIRE(s.fallbacks.size() == static_cast<size_t>(c.layers));
  REQUIRE_THAT(s.fallbacks[0], Catch::Contains("ffn_down_exps") && Catch::Contains("f16"));
  const io::GgufFile g = io::read_gguf(dir.file("q8.gguf"));
  REQUIRE(g.tensor("blk.0.ffn_down_exps.weight").type == io::GgufType::f16);
  REQUIRE(g.tensor("blk.0.ffn_up_exps.weight").type == io::GgufType::q8_0);
}

TEST_CASE("gguf: what llama.cpp's llama architecture cannot hold is refused by name", "[gguf]") {
  test::ScratchDir dir("gguf-refuse");
  const std::string out = dir.file("x.gguf");
  io::Checkpoint g;
  ModelConfig gpt = test::small_model_config(Arch::gpt);
  gpt.resolve();
  g.model_config = to_json(gpt);
  REQUIRE_THAT(test::error_of([&] { io::export_gguf(g, out, {}); }),
               Catch::Contains("only the mixtral flavour"));
  ModelConfig dense = test::small_model_config(Arch::mixtral);
  dense.moe_every = 2;
  dense.resolve();
  g.model_config = to_json(dense);
  REQUIRE_THAT(test::error_of([&] { io::export_gguf(g, out, {}); }),
               Catch::Contains("layer 0 is dense"));
  ModelConfig big = test::small_model_config(Arch::mixtral);
  big.vocab_size = 1000;
  big.resolve();
  g.model_config = to_json(big);
  REQUIRE_THAT(test::error_of([&] { io::export_gguf(g, out, {}); }),
               Catch::Contains("vocabulary of 1000") && Catch::Contains("no tokenizer"));
  io::Checkpoint shard = tiny_checkpoint(DType::f32);
  shard.sharding.rank = 1;
  REQUIRE_THAT(test::error_of([&] { io::export_gguf(shard, out, {}); }),
               Catch::Contains("merge it first"));
  io::Checkpoint extra = tiny_checkpoint(DType::f32);
  extra.params.push_back({"blocks.0.moe.shared.w1", Tensor::zeros({2, 2}), false, {}});
  REQUIRE_THAT(test::error_of([&] { io::export_gguf(extra, out, {}); }),
               Catch::Contains("blocks.0.moe.shared.w1") && Catch::Contains("no place"));
  REQUIRE_FALSE(fs::exists(out));
  REQUIRE_THROWS_WITH(io::parse_gguf_type("q4_0"), Catch::Contains("f32, f16, bf16, q8_0"));
}

TEST_CASE("gguf: truncated and corrupted files are refused with where they go wrong", "[gguf]") {
  test::ScratchDir dir("gguf-corrupt");
  const std::string path = dir.file("ok.gguf");
  io::export_gguf(tiny_checkpoint(DType::f32), path, {io::GgufType::f16, ""});
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto with = [&](const std::string& name, const std::string& content) {
    const std::string p = dir.file(name);
    std::ofstream(p, std::ios::binary) << content;
    return test::error_of([&] { io::read_gguf(p); });
  };
  REQUIRE_THAT(with("short.gguf", bytes.substr(0, bytes.size() - 100)),
               Catch::Contains("truncated"));
  REQUIRE_THAT(with("header.gguf", bytes.substr(0, 300)), Catch::Contains("not a valid GGUF"));
  std::string magic = bytes;
  magic[0] = 'X';
  REQUIRE_THAT(with("magic.gguf", magic), Catch::Contains("magic"));
  std::string version = bytes;
  version[4] = 2;
  REQUIRE_THAT(with("version.gguf", version), Catch::Contains("version 2"));
  std::string counts = bytes;
  for (int i = 8; i < 16; ++i) counts[static_cast<size_t>(i)] = '\xff';  // 2^64 - 1 tensors
  REQUIRE_THAT(with("counts.gguf", counts), Catch::Contains("cannot fit"));
  REQUIRE_THAT(with("empty.gguf", ""), Catch::Contains("ends inside"));
}

TEST_CASE("gguf: a stored SentencePiece tokenizer becomes llama.cpp's llama vocabulary",
          "[gguf][tokenizer]") {
  test::ScratchDir dir("gguf-spm");
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.vocab_size = 608;  // the tokenizer's 600 pieces and 8 padding ids
  c.resolve();
  io::Checkpoint ckpt = test::initial_checkpoint(c, 5);
  const std::string spm = std::string(MOE_TEST_DATA_DIR) + "/tokenizers/spm/tokenizer.model";
  const auto tok = io::load_tokenizer(spm);
  ckpt.tokenizer = {tok->file_name(), tok->file_bytes()};
  const std::string path = dir.file("spm.gguf");
  io::export_gguf(ckpt, path, {io::GgufType::f32, ""});
  const io::GgufFile g = io::read_gguf(path);
  const auto& m = g.metadata;
  REQUIRE(m["tokenizer.ggml.model"]["value"] == "llama");
  const auto& tokens = m["tokenizer.ggml.tokens"]["value"];
  const auto& kinds = m["tokenizer.ggml.token_type"]["value"];
  const auto& scores = m["tokenizer.ggml.scores"]["value"];
  REQUIRE(tokens.size() == 608);
  REQUIRE(kinds.size() == 608);
  REQUIRE(scores.size() == 608);
  REQUIRE(tokens[0] == "<unk>");  // spm_train's defaults: unk 0, bos 1, eos 2
  REQUIRE(kinds[0] == 2);
  REQUIRE(kinds[1] == 3);
  REQUIRE(m["tokenizer.ggml.bos_token_id"]["value"] == 1);
  REQUIRE(m["tokenizer.ggml.eos_token_id"]["value"] == 2);
  REQUIRE(m["tokenizer.ggml.unknown_token_id"]["value"] == 0);
  REQUIRE(m["tokenizer.ggml.add_bos_token"]["value"] == true);
  // Issue 44, defect 6: the keys llama.cpp's converter also writes for a SentencePiece model
  // (they were missing): no EOS appended, and the dummy prefix spm_train adds by default.
  REQUIRE(m["tokenizer.ggml.add_eos_token"]["value"] == false);
  REQUIRE(m["tokenizer.ggml.add_space_prefix"]["value"] == true);
  // Byte fallback pieces are BYTE tokens; the padding is unused.
  int bytes = 0;
  for (size_t i = 0; i < 600; ++i)
    if (tokens[i].get<std::string>().rfind("<0x", 0) == 0 && kinds[i] == 6) ++bytes;
  REQUIRE(bytes == 256);
  REQUIRE(tokens[600] == "[PAD600]");
  REQUIRE(kinds[607] == 5);
  // The pieces are the tokenizer's own, with its scores: "▁the" encodes as one piece.
  const std::vector<int32_t> the = tok->encode("the");
  REQUIRE(the.size() == 1);
  REQUIRE(tokens[static_cast<size_t>(the[0])] == "\xe2\x96\x81the");
  REQUIRE(scores[static_cast<size_t>(the[0])].get<float>() < 0);
}
