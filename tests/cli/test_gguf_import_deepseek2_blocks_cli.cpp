// moe-convert import-gguf of quantised deepseek2 files (issue 44) as a user runs it: a tiny
// DeepSeek-V3 (support/hf_deepseek_v3_model.h; every width a whole number of q4_k's 256-value
// blocks, so every matrix of the file is quantised) imported by import-hf, exported by
// export-gguf --type q8_0, q4_k and q4_k_m (q4_k with some q6_k), and imported back. The model the
// file holds is built here from its bytes: every weight matrix but attn_k_b in the file's blocks,
// its rows moved into ours as DeepSeek's layout says (q_b's RoPE rows from interleaved pairs to
// rotate-half order, kv_a_mqa split into kv_a and k_rope); attn_k_b (each head's [c, dn]
// transposed, so its blocks run across our rows) and the token embedding as the file's values
// dequantised (q8_0 as d * q, written out here; q4_k and q6_k by dequantize_row, whose values
// are ggml's golden ones). The import must hold exactly that, byte for byte, and score exactly as
// it (every window bit for bit: the same weights, tolerance 0). q4_k's blocks are also quantize
// --type q4_k's bytes (the same quantiser on the same rows).
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/cpu/quant_blocks.h"
#include "kernels/convert.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "moe/io/gguf.h"
#include "support/hf_deepseek_v3_model.h"
#include "support/run.h"
#include "support/scores.h"

using namespace moe;
using namespace moe::test::hf;
using nlohmann::json;
using test::run_command;
using test::tool;

namespace {

// D 256, heads 2, q_lora_rank 256, kv_lora_rank 256, qk_nope 256, qk_rope 16, v_head 128 (the
// output projection reads 2 x 128), experts and dense MLP 256 wide: every row a whole q4_k block.
TinyDeepseek blocky() {
  TinyDeepseek t;
  t.nextn = 0;
  t.moe.V = 256;  // the byte vocabulary: no tokenizer to carry
  t.moe.D = t.attn.D = 256, t.moe.H = t.attn.H = 2;
  t.attn.r = 256, t.attn.c = 256, t.attn.dn = 256, t.attn.dr = 16, t.attn.dv = 128;
  t.moe.F = 256, t.moe.Fd = 256;
  return t;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string type_of(const io::GgufFile& g, const std::string& name) {
  return io::gguf_type_name(g.tensor(name).type);
}

// One row of n values of a GGUF q8_0, q4_K or q6_K tensor, dequantised as ggml does.
std::vector<float> dequantised_row(const std::string& type, const uint8_t* row, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  if (type != "q8_0") {
    cpu::dequantize_row(cpu::parse_block_format(type), row, n, out.data());
    return out;
  }
  for (int64_t b = 0; b < n / 32; ++b) {  // ggml's block_q8_0: f16 d, then 32 int8 q; x = q d
    const uint8_t* block = row + b * 34;
    uint16_t d;
    std::memcpy(&d, block, 2);
    for (int64_t j = 0; j < 32; ++j)
      out[size_t(b * 32 + j)] = float(int8_t(block[2 + j])) * kernels::f16_to_f32(d);
  }
  return out;
}

// Rows of a file tensor, each dequantised: [rows, n] row-major.
std::vector<float> dequantised(const io::GgufFile& g, const std::string& name, int64_t rows,
                               int64_t n) {
  const std::string type = type_of(g, name);
  const std::vector<uint8_t> bytes = io::read_gguf_tensor_bytes(g, name);
  const size_t row_bytes = bytes.size() / size_t(rows);
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> row = dequantised_row(type, bytes.data() + size_t(r) * row_bytes, n);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// Our attn.k_b [H*dn, c] from the file's attn_k_b [H, c, dn]: its rows of dn dequantised, each
// head transposed.
std::vector<float> k_b_from_file(const io::GgufFile& g, const std::string& name, int64_t H,
                                 int64_t c, int64_t dn) {
  const std::vector<float> file = dequantised(g, name, H * c, dn);
  std::vector<float> out(file.size());
  for (int64_t h = 0; h < H; ++h)
    for (int64_t x = 0; x < c; ++x)
      for (int64_t j = 0; j < dn; ++j)
        out[size_t((h * dn + j) * c + x)] = file[size_t((h * c + x) * dn + j)];
  return out;
}

// Where a weight matrix of ours is in the file: the tensor, and the file row of each of our rows.
// DeepSeek's layout (the file's): each q head [dn nope rows | dr rope rows in interleaved pairs
// (2i, 2i+1)], kv_a_mqa [c latent rows | dr rope rows, interleaved]. Ours: each q head [dr rope
// rows in rotate-half order (i, dr/2 + i) | dn nope rows], k_rope its own [dr] (FORMATS.md).
struct FileRows {
  std::string gguf;
  std::function<int64_t(int64_t)> row;
};

FileRows file_rows(const TinyDeepseek& t, const std::string& ours) {
  const int64_t dn = t.attn.dn, dr = t.attn.dr, c = t.attn.c, hd = dn + dr;
  auto rope = [dr](int64_t i) { return i < dr / 2 ? 2 * i : 2 * (i - dr / 2) + 1; };
  const auto same = [](int64_t r) { return r; };
  if (ours == "lm_head.weight") return {"output.weight", same};
  const size_t dot = ours.find('.', 7);
  const std::string blk = "blk." + ours.substr(7, dot - 7) + ".", what = ours.substr(dot + 1);
  if (what == "attn.q_b.weight")
    return {blk + "attn_q_b.weight", [=](int64_t r) {
              const int64_t h = r / hd, i = r % hd;
              return h * hd + (i < dr ? dn + rope(i) : i - dr);
            }};
  if (what == "attn.k_rope.weight")
    return {blk + "attn_kv_a_mqa.weight", [=](int64_t r) { return c + rope(r); }};
  const std::map<std::string, std::string> names = {{"attn.q_a.weight", "attn_q_a"},
                                                    {"attn.kv_a.weight", "attn_kv_a_mqa"},
                                                    {"attn.v_b.weight", "attn_v_b"},
                                                    {"attn.o.weight", "attn_output"},
                                                    {"mlp.w1", "ffn_gate"},
                                                    {"mlp.w2", "ffn_down"},
                                                    {"mlp.w3", "ffn_up"},
                                                    {"moe.experts.w1", "ffn_gate_exps"},
                                                    {"moe.experts.w2", "ffn_down_exps"},
                                                    {"moe.experts.w3", "ffn_up_exps"},
                                                    {"moe.shared.w1", "ffn_gate_shexp"},
                                                    {"moe.shared.w2", "ffn_down_shexp"},
                                                    {"moe.shared.w3", "ffn_up_shexp"}};
  const auto it = names.find(what);
  return it == names.end() ? FileRows{} : FileRows{blk + it->second + ".weight", same};
}

// Our stored weight `ours` [.., in] from the file's blocks: each of our rows the bytes of its file
// row, as they are (tensor_formats), or with q8_rows (a q8_0 checkpoint) as our Q8_0 row (the
// row's int8 values, then its f16 scales: FORMATS.md) from ggml's blocks (f16 d, 32 int8).
Tensor blocks_from_file(const io::GgufFile& g, const FileRows& from, const Shape& shape,
                        bool q8_rows) {
  const int64_t in = shape.back(), rows = shape_numel(shape) / in;
  const std::vector<uint8_t> file = io::read_gguf_tensor_bytes(g, from.gguf);
  const std::string type = type_of(g, from.gguf);
  const int64_t file_row =
      type == "q8_0" ? in / 32 * 34 : cpu::block_row_bytes(cpu::parse_block_format(type), in);
  const int64_t row_bytes = q8_rows ? in + in / 32 * 2 : file_row;
  Shape stored = shape;
  stored.back() = row_bytes;
  Tensor out = Tensor::empty(stored, DType::u8);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = file.data() + from.row(r) * file_row;
    uint8_t* dst = out.data<uint8_t>() + r * row_bytes;
    if (!q8_rows) {
      std::memcpy(dst, src, size_t(row_bytes));
      continue;
    }
    for (int64_t b = 0; b < in / 32; ++b) {
      std::memcpy(dst + b * 32, src + b * 34 + 2, 32);
      std::memcpy(dst + in + 2 * b, src + b * 34, 2);
    }
  }
  return out;
}

void run_ok(const std::string& tool_name, const std::string& args, std::string* err = nullptr) {
  const auto r = run_command(tool(tool_name, args));
  INFO(tool_name << " " << args << "\n" << r.err);
  REQUIRE(r.exit_code == 0);
  if (err) *err = r.err;
}

// The model the file holds, built here: quantize's checkpoint `a` (its config, norms, routers and
// selection biases: f32 in the file too) with every weight matrix the file's blocks in our rows
// (`original`: their unquantised shapes), attn.k_b and the embedding the file's values
// dequantised. With a block recipe, tensor_formats names each matrix's file type. q4_k: the
// blocks are also checked against quantize's (the same quantiser on the same rows; q8_0's differ:
// quantize rounds against the f16 scale, ggml against the f32 one).
io::Checkpoint file_model(const TinyDeepseek& t, const io::GgufFile& g, const io::Checkpoint& a,
                          const io::Checkpoint& original, const std::string& recipe) {
  const int64_t H = t.attn.H, c = t.attn.c, dn = t.attn.dn;
  io::Checkpoint m = a;
  json formats = json::object();
  int64_t blocks = 0, k_b = 0;
  for (io::NamedTensor& p : m.params) {
    INFO(p.name);
    const FileRows from = file_rows(t, p.name);
    if (ends_with(p.name, ".attn.k_b.weight")) {
      const std::string blk = "blk." + p.name.substr(7, p.name.find('.', 7) - 7) + ".";
      p.tensor =
          Tensor::from_vector({H * dn, c}, k_b_from_file(g, blk + "attn_k_b.weight", H, c, dn));
      ++k_b;
    } else if (p.name == "embed.tokens") {
      p.tensor = Tensor::from_vector({t.moe.V, t.moe.D},
                                     dequantised(g, "token_embd.weight", t.moe.V, t.moe.D));
    } else if (!from.gguf.empty()) {
      const Tensor file =
          blocks_from_file(g, from, param(original, p.name).tensor.shape(), recipe == "q8_0");
      if (recipe == "q4_k") REQUIRE(same_bytes(file, p.tensor));
      p.tensor = file;
      formats[p.name] = type_of(g, from.gguf);
      ++blocks;
    }
  }
  // Per layer q_a, q_b, kv_a, k_rope, v_b, o; the dense layer's 3, each MoE layer's 3 expert and 3
  // shared-expert matrices; lm_head.
  REQUIRE(k_b == t.moe.L);
  REQUIRE(blocks == 6 * t.moe.L + 3 * t.moe.dense + 6 * (t.moe.L - t.moe.dense) + 1);
  m.model_config["quantization"] = recipe;
  if (recipe != "q8_0") m.model_config["tensor_formats"] = formats;
  return m;
}

}  // namespace

TEST_CASE("cli: import-gguf of quantised deepseek2 files keeps the blocks",
          "[cli][gguf][quantize][deepseek_v3]") {
  test::ScratchDir dir("cli-gguf-import-deepseek2-blocks");
  const TinyDeepseek t = blocky();
  const std::string hf = dir / "ds", ckpt = dir / "ds.h5";
  write_hf_dir(hf, deepseek_config(t), deepseek_weights(t, 61), 1);
  run_ok("moe-convert", "import-hf " + hf + " -o " + ckpt + " -q");
  const std::string data = test::fortunes_path("computers");
  const io::Checkpoint original = io::load_checkpoint(ckpt, false);  // the unquantised shapes
  for (const std::string type : {"q8_0", "q4_k", "q4_k_m"}) {
    INFO("--type " << type);
    const std::string gguf = dir / (type + ".gguf"), quant = dir / (type + "-quantize.h5");
    const std::string back = dir / (type + "-import.h5");
    std::string err;
    run_ok("moe-convert", "export-gguf " + ckpt + " --type " + type + " -q -o " + gguf, &err);
    REQUIRE(err.find("f16 (rows") == std::string::npos);  // no matrix fell back to f16
    run_ok("moe-convert", "quantize " + ckpt + " --type " + type + " -q -o " + quant);
    run_ok("moe-convert", "import-gguf " + gguf + " -o " + back, &err);
    const io::GgufFile g = io::read_gguf(gguf);
    REQUIRE_THAT(err, Catch::Contains(str(t.moe.L, " attn_k_b tensors (",
                                          type_of(g, "blk.0.attn_k_b.weight"), ") dequantised")));
    const io::Checkpoint b = io::load_checkpoint(back, false);
    const io::Checkpoint reference =
        file_model(t, g, io::load_checkpoint(quant, false), original, type);
    if (type == "q4_k_m")  // llama.cpp's mix: q6_k for output.weight and some ffn_down_exps
      REQUIRE(reference.model_config["tensor_formats"]["lm_head.weight"] == "q6_k");
    // The import holds exactly that: every parameter byte for byte, the same recipe and formats.
    REQUIRE(b.model_config.at("quantization") == type);
    REQUIRE(b.model_config.value("tensor_formats", json()) ==
            reference.model_config.value("tensor_formats", json()));
    REQUIRE(b.params.size() == reference.params.size());
    for (const io::NamedTensor& p : b.params) {
      INFO(p.name);
      REQUIRE(same_bytes(p.tensor, param(reference, p.name).tensor));
    }
    // And scores as it, through moe-infer (config and tensors as the loader serves them).
    const std::string ref = dir / (type + "-reference.h5");
    io::save_checkpoint(ref, reference);
    REQUIRE(test::score_lines(back, data) == test::score_lines(ref, data));
  }
}
