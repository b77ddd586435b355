// GGUF import of block-quantised files (moe/io/gguf_import.h): a model of random values exported
// by export_gguf in q4_k_m, q6_k and mxfp4 (llama.cpp's MXFP4_MOE: experts mxfp4, other matrices
// q8_0) comes back as moe-convert quantize's checkpoint of the
// same model, every block tensor bitwise (q/k rows of the llama architecture un-permuted as
// whole rows of blocks), and gives the same logits bit for bit once the embedding (which
// llama.cpp quantises and we keep in floats) is the file's. A file mixing q4_k, q6_k and q8_0
// blocks (llama.cpp's Q4_K_M of 8-expert models) keeps its q8_0 blocks too (tensor_formats
// "q8_0"), which the loader runs as Q8_0 weights holding exactly the blocks' values.
// Shape letters: D hidden, F expert hidden, E experts, V vocabulary, hd head dim.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/gemv.h"
#include "backend/cpu/quant_blocks.h"
#include "moe/infer/model.h"
#include "moe/io/convert.h"
#include "moe/io/gguf.h"
#include "moe/io/gguf_import.h"
#include "support/gradcheck.h"
#include "support/hf_families.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
using test::hf::our_logits;
using test::hf::param;
using test::hf::same_bytes;

namespace {

// A mixtral (llama.cpp's llama: q/k rows permuted in the file) of random values whose every
// weight row is whole q4_k blocks: D = F = V = 256, 4 heads of 64, 2 kv heads, 2 layers (layer 1
// is the one Q4_K_M gives q6_k), E experts.
io::Checkpoint block_model(int64_t experts, uint64_t seed) {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.d_model = 256;
  c.heads = 4;
  c.kv_heads = 2;
  c.d_ff = 256;
  c.vocab_size = 256;
  c.layers = 2;
  c.experts = experts;
  c.top_k = 2;
  c.seq = 32;
  c.normalize_topk = true;  // llama.cpp's llama renormalises
  c.resolve();
  io::Checkpoint ckpt = test::initial_checkpoint(c, seed, DType::f32);
  for (io::NamedTensor& p : ckpt.params) {  // activations O(1), routers' choices apart
    const bool norm = p.name.find("norm") != std::string::npos;
    const Shape& shape = p.tensor.shape();
    const float fan_in = static_cast<float>(shape.back());
    const float scale = norm                                         ? 0.2f
                        : shape.size() < 2                           ? 0.1f
                        : p.name.find("router") != std::string::npos ? 3.0f / std::sqrt(fan_in)
                                                                     : 1.0f / std::sqrt(fan_in);
    Tensor t = test::random_tensor(shape, ++seed, p.name == "embed.tokens" ? 1.0f : scale);
    if (norm)
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] += 1.0f;
    p.tensor = t;
    p.tensor.set_name(p.name);
  }
  return ckpt;
}

io::Checkpoint imported(const std::string& path, io::GgufImportReport* report = nullptr) {
  io::Checkpoint c = io::import_gguf(path, {}, report);
  io::hold_all(c);
  return c;
}

io::Checkpoint held(io::Checkpoint c) {
  io::hold_all(c);
  return c;
}

// `c` with parameter `name` replaced by `value`.
io::Checkpoint with_param(io::Checkpoint c, const std::string& name, const Tensor& value) {
  for (io::NamedTensor& p : c.params)
    if (p.name == name) p.tensor = value;
  return c;
}

}  // namespace

TEST_CASE("gguf import: q4_k_m, q6_k and mxfp4 files give quantize's checkpoint, bitwise",
          "[gguf][gguf-import][quant-blocks]") {
  test::ScratchDir dir("gguf-import-blocks");
  const std::vector<int32_t> ids = test::hf::random_token_ids(2 * 24, 256, 11);
  const io::Checkpoint original = block_model(4, 40);
  struct Case {
    const char* recipe;
    io::GgufType type;
    bool q4_k_m;
  };
  for (const Case& c :
       {Case{"q4_k_m", io::GgufType::q4_k, true}, Case{"q6_k", io::GgufType::q6_k, false},
        Case{"mxfp4", io::GgufType::mxfp4, false}}) {
    INFO(c.recipe);
    const io::Checkpoint quantized = held(io::quantize(original, c.recipe));
    const std::string path = dir.file(std::string(c.recipe) + ".gguf");
    io::GgufExportOptions options{c.type, "", c.q4_k_m};
    if (c.type == io::GgufType::mxfp4) {  // llama.cpp's MXFP4_MOE: matrices but experts q8_0
      options.tensor_types["output.weight"] = io::GgufType::q8_0;
      for (int layer = 0; layer < 2; ++layer)
        for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output"})
          options.tensor_types[str("blk.", layer, ".", m, ".weight")] = io::GgufType::q8_0;
    }
    io::export_gguf(original, path, options);
    io::GgufImportReport report;
    const io::Checkpoint back = imported(path, &report);
    REQUIRE(report.recipe == c.recipe);
    REQUIRE(back.model_config == quantized.model_config);  // recipe, tensor_formats, the record
    REQUIRE(back.params.size() == quantized.params.size());
    const io::GgufFile g = io::read_gguf(path);
    for (const io::NamedTensor& q : quantized.params) {
      INFO(q.name);
      const io::NamedTensor& b = param(back, q.name);
      REQUIRE(b.expert == q.expert);
      if (q.name == "embed.tokens") {  // llama.cpp quantises it, we keep floats: dequantised
        REQUIRE(b.tensor.dtype() == DType::f32);
        REQUIRE(b.tensor.to_vector() == io::read_gguf_tensor(g, "token_embd.weight"));
        continue;
      }
      REQUIRE(same_bytes(b.tensor, q.tensor));
    }
    // The attention's q rows are in blocks and were permuted in the file: a row permutation of
    // whole rows of blocks brought them back (else the bytes above would differ).
    REQUIRE_FALSE(io::block_format_of(back.model_config, "blocks.0.attn.q.weight").empty());
    // Scores: quantize's checkpoint with the file's embedding gives the same logits, bit for bit.
    const io::Checkpoint reference =
        with_param(quantized, "embed.tokens", param(back, "embed.tokens").tensor);
    const std::vector<float> want = our_logits(reference, dir.file("ref.h5"), ids, 2, 24);
    REQUIRE(our_logits(back, dir.file("back.h5"), ids, 2, 24) == want);
  }
}

TEST_CASE("gguf import: q8_0 blocks among 4-bit ones are kept and run as Q8_0 weights",
          "[gguf][gguf-import][quant-blocks]") {
  test::ScratchDir dir("gguf-import-q8-blocks");
  // llama.cpp's Q4_K_M of an 8-expert model moves attn_k and attn_v to q8_0 (and attn_output to
  // q5_k, a type we do not have: it stays q4_k here).
  const io::Checkpoint original = block_model(8, 70);
  io::GgufExportOptions options{io::GgufType::q4_k, "", true};
  for (int64_t i = 0; i < 2; ++i)
    for (const char* t : {"attn_k", "attn_v"})
      options.tensor_types[str("blk.", i, ".", t, ".weight")] = io::GgufType::q8_0;
  const std::string path = dir.file("mix.gguf");
  io::export_gguf(original, path, options);
  io::GgufImportReport report;
  const io::Checkpoint back = imported(path, &report);
  REQUIRE(report.recipe == "mixed");
  REQUIRE(back.model_config.at("quantization") == "mixed");
  const io::Checkpoint q4 = held(io::quantize(original, "q4_k_m"));
  const int64_t D = 256, kv_rows = 2 * 64;
  for (const io::NamedTensor& q : q4.params) {
    INFO(q.name);
    const io::NamedTensor& b = param(back, q.name);
    const bool k_or_v = q.name.find(".attn.k.") != std::string::npos ||
                        q.name.find(".attn.v.") != std::string::npos;
    if (q.name == "embed.tokens") continue;
    if (!k_or_v) {  // the q4_k and q6_k tensors: quantize's bytes
      REQUIRE(same_bytes(b.tensor, q.tensor));
      continue;
    }
    // q8_0: llama.cpp's blocks of our rows, in our order (k's rows un-permuted; rows are
    // quantised independently, so quantising ours in our order gives the same rows).
    REQUIRE(io::block_format_of(back.model_config, q.name) == "q8_0");
    const std::vector<float> x = param(original, q.name).tensor.to_vector();
    const int64_t row = cpu::block_row_bytes(cpu::BlockFormat::q8_0, D);
    std::vector<uint8_t> want(static_cast<size_t>(kv_rows * row));
    for (int64_t r = 0; r < kv_rows; ++r)
      cpu::quantize_row(cpu::BlockFormat::q8_0, x.data() + r * D, D, want.data() + r * row);
    REQUIRE(b.tensor.dtype() == DType::u8);
    REQUIRE(b.tensor.shape() == Shape{kv_rows, row});
    REQUIRE(std::vector<uint8_t>(b.tensor.data<uint8_t>(),
                                 b.tensor.data<uint8_t>() + want.size()) == want);
  }

  // Loaded, a q8_0 block tensor is a Q8_0 weight whose values are the blocks' exactly.
  io::save_checkpoint(dir.file("mix.h5"), back);
  infer::LoadedModel m = infer::load_model(dir.file("mix.h5"));
  const Param* k = m.params->find("blocks.1.attn.k.weight");
  REQUIRE(k);
  REQUIRE(k->value.dtype() == DType::q8_0);
  std::vector<float> widened(static_cast<size_t>(kv_rows * D)), blocks(widened.size());
  cpu::widen_rows(cpu::weight_matrix(k->value, 0, D), 0, kv_rows, widened.data());
  const Tensor& kb = param(back, "blocks.1.attn.k.weight").tensor;
  cpu::dequantize_row(cpu::BlockFormat::q8_0, kb.data<uint8_t>(), kv_rows * D, blocks.data());
  REQUIRE(widened == blocks);

  // And the model scores as one holding those values in f32 (prefill widens Q8_0 to f32: bit
  // for bit), and near it on the decode GEMV, which multiplies Q8_0 inputs (a few rows).
  io::Checkpoint wide = back;
  for (io::NamedTensor& p : wide.params) {
    const std::string format = io::block_format_of(back.model_config, p.name);
    if (format != "q8_0") continue;
    std::vector<float> v(static_cast<size_t>(kv_rows * D));
    cpu::dequantize_row(cpu::BlockFormat::q8_0, p.tensor.data<uint8_t>(), kv_rows * D, v.data());
    p.tensor = Tensor::from_vector({kv_rows, D}, v);
    wide.model_config[io::kTensorFormatsKey].erase(p.name);
  }
  const std::vector<int32_t> ids = test::hf::random_token_ids(2 * 24, 256, 12);
  REQUIRE(our_logits(back, dir.file("a.h5"), ids, 2, 24) ==
          our_logits(wide, dir.file("b.h5"), ids, 2, 24));
  const std::vector<int32_t> few(ids.begin(), ids.begin() + 4);
  const std::vector<float> near = our_logits(wide, dir.file("d.h5"), few, 1, 4);
  const double gap = test::hf::relative_error(our_logits(back, dir.file("c.h5"), few, 1, 4),
                                              test::hf::Vec(near.begin(), near.end()));
  // Measured 1.6e-2: the Q8_0 rounding of k's and v's inputs (as the q8_0 import's 1.1-1.5e-2).
  INFO("decode GEMV vs f32: " << gap);
  REQUIRE(gap < 5e-2);
}

TEST_CASE("gguf import: a block with a scale that is not finite is refused naming it",
          "[gguf][gguf-import][quant-blocks]") {
  test::ScratchDir dir("gguf-import-blocks-bad");
  const std::string good = dir.file("good.gguf");
  io::export_gguf(block_model(4, 90), good, {io::GgufType::mxfp4, ""});
  const io::GgufFile g = io::read_gguf(good);
  const io::GgufTensorInfo& v = g.tensor("blk.0.attn_v.weight");
  std::string bytes = test::read_file(good);
  // Row 2, block 3: E8M0 0xFF is NaN. D = 256 is 8 blocks of 17 bytes a row.
  bytes[g.data_offset + v.offset + (2 * 8 + 3) * 17] = char(0xFF);
  test::write_file(dir.file("bad.gguf"), bytes);
  REQUIRE_THAT(test::error_of([&] { imported(dir.file("bad.gguf")); }),
               Catch::Contains("blk.0.attn_v.weight") && Catch::Contains("row 2, block 3") &&
                   Catch::Contains("not finite"));
}
