// import-gguf of a deepseek2 file mixing block types (issue 44), as llama-quantize's
// --tensor-type mixes make them: q4_k matrices, and q8_0 for attn_q_b, attn_kv_a_mqa and attn_k_b
// (export_gguf's tensor_types). The import is a "mixed" block checkpoint: q_b, kv_a and k_rope keep
// the file's q8_0 blocks (GGUF's layout, tensor_formats "q8_0") with their rows moved into ours,
// the rest of the matrices their q4_k blocks; attn.k_b, transposed per head, is the file's q8_0
// values dequantised. Checked without the row mapping: each row is quantised on its own, so our
// row r must be the block format's bytes of the exported model's row r (quantize_row, whose bytes
// are ggml's), and attn.k_b the quantise-dequantise of the file's rows (each head's columns of
// ours). moe-infer's loader then serves the q8_0 blocks as Q8_0 weights and computes finite logits.
// Shape letters: H heads, c kv_lora_rank, dn qk_nope.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/quant_blocks.h"
#include "moe/infer/model.h"
#include "moe/io/gguf.h"
#include "moe/io/gguf_import.h"
#include "support/hf_deepseek_v3_model.h"
#include "support/run.h"

using namespace moe;
using namespace moe::test::hf;

namespace {

// Every q4_k row a whole number of its 256-value blocks; attn_k_b's rows (dn) of q8_0's 32.
TinyDeepseek blocky() {
  TinyDeepseek t;
  t.nextn = 0;
  t.moe.V = 256;
  t.moe.D = t.attn.D = 256, t.moe.H = t.attn.H = 4;  // the output projection reads 4 x 64
  t.attn.r = 256, t.attn.c = 256, t.attn.dn = 64, t.attn.dr = 16, t.attn.dv = 64;
  t.moe.F = 256, t.moe.Fd = 256;
  return t;
}

// Rows of x [rows, n] in `format`, row after row.
std::vector<uint8_t> quantized(const std::vector<float>& x, int64_t n, cpu::BlockFormat format) {
  const int64_t rows = static_cast<int64_t>(x.size()) / n,
                row_bytes = cpu::block_row_bytes(format, n);
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_bytes));
  for (int64_t r = 0; r < rows; ++r)
    cpu::quantize_row(format, x.data() + r * n, n, out.data() + r * row_bytes);
  return out;
}

const io::NamedTensor& named(const io::Checkpoint& c, const std::string& name) {
  for (const io::NamedTensor& p : c.params)
    if (p.name == name) return p;
  FAIL("no parameter " << name);
  throw 0;
}

}  // namespace

TEST_CASE("gguf deepseek2 import: q8_0 latent matrices among q4_k keep their blocks",
          "[gguf][deepseek_v3][quantize]") {
  test::ScratchDir dir("gguf-deepseek2-mixed");
  const TinyDeepseek t = blocky();
  write_hf_dir(dir.file("src"), deepseek_config(t), deepseek_weights(t, 71), 1);
  const io::Checkpoint model = test::import_hf_held(dir.file("src"));
  io::GgufExportOptions options{io::GgufType::q4_k, "ds"};
  for (int64_t i = 0; i < t.moe.L; ++i)
    for (const char* name : {"attn_q_b", "attn_kv_a_mqa", "attn_k_b"})
      options.tensor_types[str("blk.", i, ".", name, ".weight")] = io::GgufType::q8_0;
  io::export_gguf(model, dir.file("mixed.gguf"), options);
  io::GgufImportReport report;
  io::Checkpoint back = io::import_gguf(dir.file("mixed.gguf"), {}, &report);
  io::hold_all(back.params);
  REQUIRE(report.recipe == "mixed");
  const nlohmann::json& formats = back.model_config.at("tensor_formats");
  const int64_t H = t.attn.H, c = t.attn.c, dn = t.attn.dn;
  int64_t q8 = 0, q4 = 0;
  for (const io::NamedTensor& p : model.params) {
    INFO(p.name);
    const io::NamedTensor& got = named(back, p.name);
    const std::vector<float> x = p.tensor.to(DType::f32).to_vector();
    if (p.name.ends_with(".attn.k_b.weight")) {  // [H*dn, c]: the file's rows are its columns
      REQUIRE_FALSE(formats.contains(p.name));
      std::vector<float> want(x.size()), column(static_cast<size_t>(dn)), back_col(column.size());
      std::vector<uint8_t> row(
          static_cast<size_t>(cpu::block_row_bytes(cpu::BlockFormat::q8_0, dn)));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t k = 0; k < c; ++k) {
          for (int64_t j = 0; j < dn; ++j) column[size_t(j)] = x[size_t((h * dn + j) * c + k)];
          cpu::quantize_row(cpu::BlockFormat::q8_0, column.data(), dn, row.data());
          cpu::dequantize_row(cpu::BlockFormat::q8_0, row.data(), dn, back_col.data());
          for (int64_t j = 0; j < dn; ++j) want[size_t((h * dn + j) * c + k)] = back_col[size_t(j)];
        }
      REQUIRE(got.tensor.dtype() == DType::f32);
      REQUIRE(got.tensor.to_vector() == want);
      continue;
    }
    if (!formats.contains(p.name)) continue;  // norms, routers, the embedding
    const bool latent = p.name.ends_with(".attn.q_b.weight") ||
                        p.name.ends_with(".attn.kv_a.weight") ||
                        p.name.ends_with(".attn.k_rope.weight");
    REQUIRE(formats[p.name] == (latent ? "q8_0" : "q4_k"));
    const cpu::BlockFormat format = latent ? cpu::BlockFormat::q8_0 : cpu::BlockFormat::q4_k;
    const std::vector<uint8_t> want = quantized(x, p.tensor.shape().back(), format);
    REQUIRE(got.tensor.dtype() == DType::u8);
    REQUIRE(got.tensor.nbytes() == want.size());
    REQUIRE(std::memcmp(got.tensor.raw(), want.data(), want.size()) == 0);
    (latent ? q8 : q4) += 1;
  }
  REQUIRE(q8 == 3 * t.moe.L);
  REQUIRE(q4 == 3 * t.moe.L + 3 * t.moe.dense + 6 * (t.moe.L - t.moe.dense) + 1);  // + lm_head

  // The loader serves GGUF's q8_0 blocks as Q8_0 weights; the model computes.
  io::save_checkpoint(dir.file("mixed.h5"), back);
  infer::LoadedModel loaded = infer::load_model(dir.file("mixed.h5"));
  CHECK(loaded.params->at("blocks.1.attn.q_b.weight").value.dtype() == DType::q8_0);
  const std::vector<float> logits =
      loaded.model->logits(Tensor::from_vector({1, 6}, random_token_ids(6, 256, 72))).to_vector();
  for (float v : logits) REQUIRE(std::isfinite(v));
}
