// moe-convert quantize's block recipes (io::quantize with q4_k, q6_k, mxfp4, q4_k_m): which
// tensor gets which format (llama.cpp's Q4_K_M and MXFP4_MOE rules), the stored rows being exactly the block
// quantiser's bytes (backend/cpu/quant_blocks, golden-tested against llama.cpp), the tensors kept
// when their rows are not whole blocks, the config keys that describe it, and the same bytes when
// the input is read lazily (one expert at a time).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/quant_blocks.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "moe/io/gguf.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;

namespace {

// 8 MoE layers 256 wide (rows of whole 256-value blocks everywhere), 2 experts.
ModelConfig wide_config(int64_t width = 256) {
  ModelConfig c = test::small_model_config(Arch::mixtral);
  c.layers = 8;
  c.d_model = width;
  c.d_ff = width;
  c.experts = 2;
  c.top_k = 1;
  c.resolve();
  return c;
}

const io::NamedTensor& find(const io::Checkpoint& c, const std::string& name) {
  for (const io::NamedTensor& nt : c.params)
    if (nt.name == name) return nt;
  FAIL("no tensor " << name);
  throw;
}

// Row `row` of matrix `m` [.., out, in] (f32) quantised by the block quantiser.
std::vector<uint8_t> quantised_row(const Tensor& m, int64_t row, cpu::BlockFormat f) {
  const int64_t in = m.shape().back();
  std::vector<uint8_t> out(static_cast<size_t>(cpu::block_row_bytes(f, in)));
  cpu::quantize_row(f, m.data<float>() + row * in, in, out.data());
  return out;
}

void require_rows(const io::NamedTensor& q, const Tensor& source, cpu::BlockFormat f) {
  const Tensor got = q.whole();
  const int64_t in = source.shape().back(), rows = source.numel() / in;
  const int64_t row_bytes = cpu::block_row_bytes(f, in);
  REQUIRE(got.dtype() == DType::u8);
  REQUIRE(got.shape().back() == row_bytes);
  REQUIRE(got.numel() == rows * row_bytes);
  for (int64_t row : {int64_t(0), rows / 2, rows - 1}) {
    const std::vector<uint8_t> want = quantised_row(source, row, f);
    REQUIRE(std::memcmp(got.data<uint8_t>() + row * row_bytes, want.data(), want.size()) == 0);
  }
}

}  // namespace

TEST_CASE("quantize q4_k_m: llama.cpp's choice of q6_k, the block quantiser's bytes",
          "[convert][quantize_blocks]") {
  const io::Checkpoint f32 = test::initial_checkpoint(wide_config(), 5);
  io::QuantReport report;
  const io::Checkpoint q = io::quantize(f32, "q4_k_m", &report);
  REQUIRE(io::quantization_of(q.model_config) == "q4_k_m");
  // use_more_bits over 8 layers: 0 (first eighth), 7 (last eighth), 3 and 6 (every third).
  for (int64_t layer = 0; layer < 8; ++layer) {
    const bool more = layer == 0 || layer == 3 || layer == 6 || layer == 7;
    INFO("layer " << layer);
    const std::string b = str("blocks.", layer, ".");
    REQUIRE(io::block_format_of(q.model_config, b + "attn.v.weight") == (more ? "q6_k" : "q4_k"));
    REQUIRE(io::block_format_of(q.model_config, b + "moe.experts.w2") == (more ? "q6_k" : "q4_k"));
    REQUIRE(io::block_format_of(q.model_config, b + "attn.q.weight") == "q4_k");
    REQUIRE(io::block_format_of(q.model_config, b + "moe.experts.w1") == "q4_k");
    REQUIRE(io::block_format_of(q.model_config, b + "moe.router.weight").empty());
    REQUIRE(io::block_format_of(q.model_config, b + "norm1.weight").empty());
  }
  REQUIRE(io::block_format_of(q.model_config, "lm_head.weight") == "q6_k");
  REQUIRE(io::block_format_of(q.model_config, "embed.tokens").empty());
  REQUIRE(report.tensors_per_format.at("q6_k") == 4 + 4 + 1);
  REQUIRE(report.tensors_kept == 0);
  require_rows(find(q, "blocks.3.moe.experts.w2"), find(f32, "blocks.3.moe.experts.w2").tensor,
               cpu::BlockFormat::q6_k);
  require_rows(find(q, "blocks.1.attn.o.weight"), find(f32, "blocks.1.attn.o.weight").tensor,
               cpu::BlockFormat::q4_k);
  // Kept tensors keep their bytes.
  REQUIRE(find(q, "embed.tokens").whole().to_vector() ==
          find(f32, "embed.tokens").tensor.to_vector());
  // Q4_K on normal weights: the error a 4-bit grid with a per-32 scale and min gives (measured
  // 0.07 of the RMS value on N(0,1) rows in test_quant_blocks; q6_k's share pulls it down).
  REQUIRE(report.rms_relative_error() > 0.01);
  REQUIRE(report.rms_relative_error() < 0.12);
  REQUIRE(report.bytes_after < report.bytes_before / 5);
}

TEST_CASE("quantize q4_k / q6_k: one format, rows not whole blocks kept",
          "[convert][quantize_blocks]") {
  const io::Checkpoint f32 = test::initial_checkpoint(wide_config(), 6);
  for (const char* type : {"q4_k", "q6_k"}) {
    INFO(type);
    const io::Checkpoint q = io::quantize(f32, type);
    REQUIRE(io::block_format_of(q.model_config, "lm_head.weight") == type);
    require_rows(find(q, "blocks.2.moe.experts.w3"), find(f32, "blocks.2.moe.experts.w3").tensor,
                 cpu::parse_block_format(type));
  }
  // 96 wide: whole mxfp4 blocks (32), not whole q4_k blocks (256).
  const io::Checkpoint narrow = test::initial_checkpoint(wide_config(96), 6);
  io::QuantReport report;
  const io::Checkpoint q4 = io::quantize(narrow, "q4_k", &report);
  REQUIRE(report.tensors_quantized == 0);
  REQUIRE(report.tensors_kept > 0);
  REQUIRE(q4.model_config.at(io::kTensorFormatsKey).empty());
  REQUIRE(find(q4, "blocks.0.attn.q.weight").dtype() == DType::f32);
  const io::Checkpoint mx = io::quantize(narrow, "mxfp4", &report);
  REQUIRE(report.tensors_kept == 0);
  REQUIRE(io::block_format_of(mx.model_config, "blocks.0.attn.q.weight") == "q8_0");
  REQUIRE(io::block_format_of(mx.model_config, "blocks.0.moe.experts.w1") == "mxfp4");
}

TEST_CASE("quantize mxfp4: llama.cpp's MXFP4_MOE, experts mxfp4 and other matrices q8_0 blocks",
          "[convert][quantize_blocks]") {
  const io::Checkpoint f32 = test::initial_checkpoint(wide_config(), 9);
  io::QuantReport report;
  const io::Checkpoint q = io::quantize(f32, "mxfp4", &report);
  REQUIRE(io::quantization_of(q.model_config) == "mxfp4");
  for (int64_t layer = 0; layer < 8; ++layer) {
    INFO("layer " << layer);
    const std::string b = str("blocks.", layer, ".");
    for (const char* w : {"w1", "w2", "w3"})
      REQUIRE(io::block_format_of(q.model_config, b + "moe.experts." + w) == "mxfp4");
    for (const char* m : {"q", "k", "v", "o"})
      REQUIRE(io::block_format_of(q.model_config, b + "attn." + m + ".weight") == "q8_0");
    REQUIRE(io::block_format_of(q.model_config, b + "moe.router.weight").empty());
    REQUIRE(io::block_format_of(q.model_config, b + "norm1.weight").empty());
  }
  REQUIRE(io::block_format_of(q.model_config, "lm_head.weight") == "q8_0");
  REQUIRE(io::block_format_of(q.model_config, "embed.tokens").empty());
  REQUIRE(report.tensors_per_format.at("mxfp4") == 8 * 3);
  REQUIRE(report.tensors_per_format.at("q8_0") == 8 * 4 + 1);
  REQUIRE(report.tensors_kept == 0);
  // The rows are the block quantisers' bytes: q8_0 in GGUF's blocks (34 bytes a 32), not our
  // whole-checkpoint q8_0 recipe's rows.
  require_rows(find(q, "blocks.4.moe.experts.w2"), find(f32, "blocks.4.moe.experts.w2").tensor,
               cpu::BlockFormat::mxfp4);
  require_rows(find(q, "blocks.4.attn.o.weight"), find(f32, "blocks.4.attn.o.weight").tensor,
               cpu::BlockFormat::q8_0);
  require_rows(find(q, "lm_head.weight"), find(f32, "lm_head.weight").tensor,
               cpu::BlockFormat::q8_0);
  REQUIRE(find(q, "blocks.4.attn.o.weight").whole().shape() == Shape{256, 8 * 34});
}

TEST_CASE("quantize mxfp4 -> export-gguf: MXFP4 experts, Q8_0 other matrices, file type 38",
          "[convert][quantize_blocks][gguf]") {
  test::ScratchDir dir("quantize-recipes-mxfp4-gguf");
  ModelConfig c = wide_config();
  c.normalize_topk = true;  // llama.cpp's llama architecture renormalises the top-k
  const io::Checkpoint q = io::quantize(test::initial_checkpoint(c, 10), "mxfp4");
  const std::string path = dir / "m.gguf";
  io::export_gguf(q, path, {});
  const io::GgufFile g = io::read_gguf(path);
  REQUIRE(g.metadata.at("general.file_type").at("value") == 38);  // MOSTLY_MXFP4_MOE
  for (const char* name : {"ffn_gate_exps", "ffn_down_exps", "ffn_up_exps"})
    REQUIRE(g.tensor(str("blk.3.", name, ".weight")).type == io::GgufType::mxfp4);
  for (const char* name : {"attn_q", "attn_k", "attn_v", "attn_output"})
    REQUIRE(g.tensor(str("blk.3.", name, ".weight")).type == io::GgufType::q8_0);
  REQUIRE(g.tensor("output.weight").type == io::GgufType::q8_0);
  REQUIRE(g.tensor("blk.3.ffn_gate_inp.weight").type == io::GgufType::f32);  // the router
  REQUIRE(g.tensor("token_embd.weight").type == io::GgufType::f32);
  // Kept blocks go out as they are (attn_output and the experts are not row-permuted).
  for (const auto& [gguf, ours] : {std::pair<std::string, std::string>{"blk.3.attn_output.weight",
                                                                       "blocks.3.attn.o.weight"},
                                   {"blk.3.ffn_down_exps.weight", "blocks.3.moe.experts.w2"}}) {
    INFO(gguf);
    const Tensor t = find(q, ours).whole();
    const std::vector<uint8_t> bytes = io::read_gguf_tensor_bytes(g, gguf);
    REQUIRE(bytes.size() == t.nbytes());
    REQUIRE(std::memcmp(bytes.data(), t.raw(), bytes.size()) == 0);
  }
}

TEST_CASE("quantize streams: a lazily opened checkpoint gives the same bytes",
          "[convert][quantize_blocks]") {
  test::ScratchDir dir("quantize-recipes-lazy");
  const io::Checkpoint f32 = test::initial_checkpoint(wide_config(), 7);
  io::save_checkpoint(dir / "f32.h5", f32);
  const io::Checkpoint held = io::quantize(f32, "q4_k_m");
  const io::Checkpoint lazy_in = io::open_checkpoint_lazy(dir / "f32.h5");
  REQUIRE(std::any_of(lazy_in.params.begin(), lazy_in.params.end(),
                      [](const io::NamedTensor& nt) { return !nt.held(); }));
  const io::Checkpoint lazy = io::quantize(lazy_in, "q4_k_m");
  REQUIRE(lazy.model_config == held.model_config);
  io::save_streaming(dir / "q.h5", lazy);
  const io::Checkpoint back = io::load_checkpoint(dir / "q.h5");
  REQUIRE(back.params.size() == held.params.size());
  for (size_t i = 0; i < back.params.size(); ++i) {
    INFO(back.params[i].name);
    REQUIRE(back.params[i].tensor.shape() == held.params[i].tensor.shape());
    REQUIRE(std::memcmp(back.params[i].tensor.raw(), held.params[i].tensor.raw(),
                        held.params[i].tensor.nbytes()) == 0);
  }
}

TEST_CASE("quantization recipes: unknown ones and malformed configs are refused by name",
          "[convert][quantize_blocks]") {
  const io::Checkpoint f32 = test::initial_checkpoint(wide_config(), 8);
  REQUIRE_THROWS_WITH(io::quantize(f32, "q4_0"), Catch::Contains("--type must be q8_0, q4_k"));
  nlohmann::json mc = f32.model_config;
  mc[io::kQuantizationKey] = "q5_k";
  REQUIRE_THROWS_WITH(io::quantization_of(mc), Catch::Contains("reads q8_0, q4_k, q6_k"));
  mc[io::kQuantizationKey] = "q4_k";
  REQUIRE_THROWS_WITH(io::quantization_of(mc), Catch::Contains("needs a 'tensor_formats' object"));
  mc[io::kTensorFormatsKey] = {{"lm_head.weight", "q5_k"}};
  REQUIRE_THROWS_WITH(io::quantization_of(mc),
                      Catch::Contains("gives tensor 'lm_head.weight' the format \"q5_k\""));
  const io::Checkpoint q = io::quantize(f32, "q6_k");
  REQUIRE_THROWS_WITH(io::quantize(q, "q4_k"), Catch::Contains("already quantised (q6_k)"));
  REQUIRE_THROWS_WITH(io::refuse_quantized(q.model_config, "m.h5", "moe-train --resume"),
                      Catch::Contains("'m.h5' is a q6_k-quantised checkpoint"));
}
