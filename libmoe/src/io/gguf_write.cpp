// GGUF export (see moe/io/gguf.h and docs/FORMATS.md "GGUF export") of the mixtral flavour as
// llama.cpp's "llama" architecture with experts, and of qwen2_moe, qwen3_moe, olmoe and glm4_moe as
// its "qwen2moe", "qwen3moe", "olmoe" and "glm4moe" architectures; deepseek_v3 as its "deepseek2"
// (the latent attention and its keys: io/gguf_deepseek2.cpp). The header (keys and tensor
// infos) is built in memory first, so every refusal happens before a byte is written; the tensors
// are then converted and written one at a time (an expert tensor expert by expert) into an
// AtomicFile.
// Shape letters: V vocabulary, D hidden size, F expert hidden width, Fs shared expert hidden
// width, E experts of a layer, H query heads, KV key/value heads, hd head dim, Fd the width of
// glm4_moe's leading dense layers. gpt_oss goes out as llama.cpp's "gpt-oss" (its sinks, biases
// and keys: io/gguf_gpt_oss.cpp).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "io/export_model.h"
#include "io/gguf_blocks.h"
#include "io/gguf_writer.h"
#include "kernels/convert.h"
#include "moe/error.h"
#include "moe/io/atomic_file.h"
#include "moe/io/convert.h"
#include "moe/io/dataset.h"
#include "moe/io/gguf.h"
#include "moe/io/tokenizer.h"
#include "moe/models/config.h"
#include "moe/models/flavour.h"
#include "moe/version.h"

namespace moe::io {

namespace {

constexpr uint64_t kAlignment = 32;

using gguf_out::Header;
using gguf_out::Planned;

// tokenizer.ggml.* of a model without a stored tokenizer, the byte-level vocabulary: token b is
// byte b, no merges, no BOS, and token 0 (NUL, which text never holds) named the end of text so
// that llama.cpp has one.
void write_byte_vocabulary(Header& h) {
  std::vector<std::string> tokens;
  for (int b = 0; b < kByteVocab; ++b) tokens.push_back(byte_level_char(static_cast<uint8_t>(b)));
  h.kv_string("tokenizer.ggml.model", "gpt2");
  h.kv_string("tokenizer.ggml.pre", "default");
  h.kv_strings("tokenizer.ggml.tokens", tokens);
  h.kv_i32s("tokenizer.ggml.token_type", std::vector<int32_t>(kByteVocab, 1));
  h.kv_strings("tokenizer.ggml.merges", {});
  h.kv_u32("tokenizer.ggml.eos_token_id", 0);
  h.kv_bool("tokenizer.ggml.add_bos_token", false);
}

// tokenizer.ggml.*: the stored tokenizer's vocabulary (padded to the model's V with unused
// "[PAD<id>]" tokens, as llama.cpp's converter pads), or without one the byte-level vocabulary.
void write_vocabulary(Header& h, const Tokenizer* tok, int64_t V) {
  if (!tok) return write_byte_vocabulary(h);
  std::vector<Tokenizer::VocabEntry> vocab = tok->vocabulary();
  MOE_CHECK(static_cast<int64_t>(vocab.size()) <= V, "GGUF export: the tokenizer has ",
            vocab.size(), " tokens, more than the model's vocabulary (", V, ")");
  for (int64_t id = static_cast<int64_t>(vocab.size()); id < V; ++id)
    vocab.push_back({str("[PAD", id, "]"), 0, Tokenizer::TokenKind::unused});
  std::vector<std::string> tokens;
  std::vector<int32_t> kinds;
  std::vector<float> scores;
  for (const Tokenizer::VocabEntry& v : vocab) {
    tokens.push_back(v.text);
    kinds.push_back(static_cast<int32_t>(v.kind));
    scores.push_back(v.score);
  }
  if (tok->sentencepiece()) {
    h.kv_string("tokenizer.ggml.model", "llama");
    h.kv_string("tokenizer.ggml.pre", "default");  // as llama.cpp's converter names it
    h.kv_strings("tokenizer.ggml.tokens", tokens);
    h.kv_f32s("tokenizer.ggml.scores", scores);
    h.kv_i32s("tokenizer.ggml.token_type", kinds);
  } else {
    const std::string pre = tok->llama_pre_tokenizer();
    if (pre.empty())
      throw Error(
          "GGUF export: the tokenizer's pre-tokenizer is none llama.cpp names (GPT-2's "
          "byte-level expression, Qwen2's split or gpt-oss's o200k); llama.cpp would cut text "
          "otherwise");
    h.kv_string("tokenizer.ggml.model", "gpt2");
    h.kv_string("tokenizer.ggml.pre", pre);
    h.kv_strings("tokenizer.ggml.tokens", tokens);
    h.kv_i32s("tokenizer.ggml.token_type", kinds);
    h.kv_strings("tokenizer.ggml.merges", tok->merges());
  }
  if (tok->bos_id() >= 0)
    h.kv_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tok->bos_id()));
  if (tok->eos_id() >= 0)
    h.kv_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tok->eos_id()));
  if (tok->unk_id() >= 0)
    h.kv_u32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(tok->unk_id()));
  // A BOS (an EOS) is added when the tokenizer's own encoding of a text adds one.
  const std::vector<int32_t> probe = tok->encode("a", true);
  h.kv_bool("tokenizer.ggml.add_bos_token",
            tok->bos_id() >= 0 && !probe.empty() && probe.front() == tok->bos_id());
  h.kv_bool("tokenizer.ggml.add_eos_token",
            tok->eos_id() >= 0 && !probe.empty() && probe.back() == tok->eos_id());
  // SentencePiece's dummy prefix (a space before the text), as llama.cpp's converter writes it
  // from the model's normaliser: "a" then starts with a piece beginning with U+2581.
  if (tok->sentencepiece()) {
    const std::vector<int32_t> plain = tok->encode("a");
    h.kv_bool("tokenizer.ggml.add_space_prefix",
              !plain.empty() &&
                  vocab[static_cast<size_t>(plain.front())].text.rfind("\xe2\x96\x81", 0) == 0);
  }
}

// llama.cpp's file types (general.file_type) for the matrices' type.
uint32_t file_type(GgufType t) {
  switch (t) {
    case GgufType::f32:
      return 0;
    case GgufType::f16:
      return 1;
    case GgufType::q8_0:
      return 7;
    case GgufType::bf16:
      return 32;
    case GgufType::q4_k:  // MOSTLY_Q4_K_S (every matrix q4_k); Q4_K_M is 15
      return 14;
    case GgufType::q6_k:
      return 18;
    case GgufType::mxfp4:  // MOSTLY_MXFP4_MOE
      return 38;
  }
  return 0;
}

// Query/key rows of one projection [heads * hd, D], permuted within each head: output row
// 2i + j of a head is input row j * hd/2 + i (j = 0, 1). llama.cpp rotates adjacent pairs
// (2i, 2i + 1) by frequency i; we rotate (i, i + hd/2): after the permutation they are the same
// pairs, rotated by the same angles.
// Rows of `row` elements: f32 values, or the bytes of a row of blocks (which move whole).
template <typename T>
std::vector<T> permute_rope_rows(const std::vector<T>& w, int64_t heads, int64_t hd, int64_t row) {
  std::vector<T> out(w.size());
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const T* from = w.data() + (h * hd + j * half + i) * row;
        std::memcpy(out.data() + (h * hd + 2 * i + j) * row, from,
                    static_cast<size_t>(row) * sizeof(T));
      }
  return out;
}

// The bytes of a tensor a block checkpoint keeps in GGUF's blocks (moe/io/convert.h).
std::vector<uint8_t> bytes_of(const Tensor& t) {
  const uint8_t* p = static_cast<const uint8_t*>(t.raw());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

// A checkpoint that keeps weight matrices in GGUF's blocks (import-gguf of a 4-bit file,
// moe-convert quantize to a block recipe) writes them as they are; the whole-checkpoint q8_0
// recipe holds our own Q8_0 rows, which are not GGUF's.
void check_quantization(const Checkpoint& ckpt) {
  if (quantization_of(ckpt.model_config) == "q8_0")
    throw Error(
        "GGUF export: this is a q8_0-quantised checkpoint (moe-convert quantize), whose Q8_0 rows "
        "are not llama.cpp's blocks; export the checkpoint that was quantised with --type q8_0");
}

// Encodes f32 values in `type`, refusing values the type cannot hold (f16's range).
void encode(const std::string& name, GgufType type, const std::vector<float>& v,
            std::vector<uint8_t>& out) {
  const size_t n = v.size();
  switch (type) {
    case GgufType::f32:
      out.resize(n * 4);
      std::memcpy(out.data(), v.data(), n * 4);
      return;
    case GgufType::f16:
    case GgufType::bf16:
      out.resize(n * 2);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h =
            type == GgufType::f16 ? kernels::f32_to_f16(v[i]) : kernels::f32_to_bf16(v[i]);
        if (type == GgufType::f16 && (h & 0x7c00u) == 0x7c00u)
          throw Error(str("GGUF export: tensor '", name, "' holds ", v[i],
                          ", beyond f16's range (65504): export it as bf16 or f32"));
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      return;
    case GgufType::q8_0:
    case GgufType::q4_k:
    case GgufType::q6_k:
    case GgufType::mxfp4: {  // rows are whole blocks, so the tensor quantises as one run of them
      const cpu::BlockFormat f = block_format_of(type);
      out.resize(static_cast<size_t>(cpu::block_row_bytes(f, static_cast<int64_t>(n))));
      try {
        cpu::quantize_row(f, v.data(), static_cast<int64_t>(n), out.data());
      } catch (const Error& e) {
        throw Error(str("GGUF export: tensor '", name, "': ", e.what()));
      }
      return;
    }
  }
}

// llama.cpp's Q4_K_M rule for the tensors we write: output.weight, and attn_v / ffn_down_exps in
// the layers its use_more_bits picks (the first and last eighth, every third in between), get
// q6_k. (Its bump of 8-expert models' attn_k / attn_v to q8_0 is not made.)
bool q4_k_m_wants_q6_k(const std::string& gguf, int64_t layers) {
  if (gguf == "output.weight") return true;
  const bool v = gguf.find(".attn_v.weight") != std::string::npos;
  const bool down = gguf.find(".ffn_down_exps.weight") != std::string::npos;
  if (!v && !down) return false;
  const int64_t layer = std::stoll(gguf.substr(4));  // "blk.<i>."
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

// llama.cpp's architecture for our flavour, and what it hard-codes that our config may vary.
struct LlamaArch {
  const char* name;     // general.architecture, and the prefix of its keys
  bool normalize_topk;  // its MoE renormalises the top-k gate weights
  bool permute_qk;      // "llama" rotates adjacent pairs (NORM rope): q/k rows permuted; the
                    // others rotate (i, i + hd/2) like us and HF (NEOX rope): copied as they are
  bool glm = false;       // glm4moe: the renormalisation is a key (expert_weights_norm), not fixed
  bool deepseek = false;  // deepseek2: latent attention (io/gguf_deepseek2.cpp); keys as glm4moe's
  bool gpt_oss = false;   // gpt-oss: sinks, o / router / expert biases (io/gguf_gpt_oss.cpp)
};

LlamaArch llama_arch(Arch arch) {
  switch (arch) {
    case Arch::qwen2_moe:
      return {"qwen2moe", false, false};
    case Arch::qwen3_moe:
      return {"qwen3moe", true, false};
    case Arch::olmoe:
      return {"olmoe", false, false};
    case Arch::glm4_moe:
      return {"glm4moe", false, false, true};
    case Arch::deepseek_v3:  // rotates adjacent pairs, but of DeepSeek's rows (gguf_deepseek2.cpp)
      return {"deepseek2", false, false, false, true};
    case Arch::gpt_oss:  // softmax over the top-k logits: the renormalised top-k of a softmax
      return {"gpt-oss", true, false, false, false, true};
    default:
      return {"llama", true, true};
  }
}

// llama.cpp's olmoe sizes its q and k norms by n_embd (the whole model width): a model whose
// q or k projection is narrower (fewer key/value heads than heads, or another head width) writes
// a file llama.cpp refuses to load ("attn_k_norm.weight has wrong shape").
void check_olmoe_norm_widths(const ModelConfig& mc) {
  if (mc.arch != Arch::olmoe) return;
  const int64_t D = mc.d_model, hd = mc.head_dim_resolved();
  const int64_t q = mc.heads * hd, k = mc.kv_heads_resolved() * hd;
  if (q != D || k != D)
    throw Error(str("GGUF export: llama.cpp's olmoe normalises q and k over the model width (", D,
                    "); this model's ", q != D ? "q" : "k", " is ", q != D ? q : k, " wide (",
                    mc.kv_heads_resolved(), " key/value heads and ", mc.heads, " heads of ", hd,
                    "), which llama.cpp would refuse to load"));
}

// None of the llama.cpp architectures our families export to reads a sliding window (its llama,
// qwen2moe, qwen3moe, olmoe, glm4moe and deepseek2 attend to the whole context; gpt-oss's arch
// reads <arch>.attention.sliding_window): a window shorter than the context would be silently
// dropped, so it is refused. A window as long as the context changes nothing and goes out.
void check_window(const ModelConfig& mc, const std::string& arch) {
  if (mc.sliding_window > 0 && mc.sliding_window < mc.seq)
    throw Error(str("GGUF export: llama.cpp's ", arch, " has no sliding-window attention; this ",
                    "model's layers see the last ", mc.sliding_window, " of its ", mc.seq,
                    " positions"));
}

// YaRN as llama.cpp's rope.scaling.* keys (type, factor, original_context_length). llama.cpp
// ramps over the floored / ceiled correction range of betas 32 and 1 and derives the attention
// factor 0.1 ln(factor) + 1 itself (ggml's rope_yarn), which is transformers' default: a model
// whose settings differ (other betas, truncate false, mscale / attention_factor) is refused by
// name rather than written for a llama.cpp that would rotate it otherwise.
void check_yarn(const ModelConfig& mc, const std::string& arch) {
  if (mc.rope_type != RopeType::yarn) return;
  const ops::YarnSettings& y = mc.yarn;
  const char* differs = y.beta_fast != 32 || y.beta_slow != 1  ? "beta_fast / beta_slow"
                        : !y.truncate                          ? "truncate false"
                        : y.mscale > 0 || y.mscale_all_dim > 0 ? "mscale / mscale_all_dim"
                        : y.attention_factor > 0               ? "attention_factor"
                                                               : nullptr;
  if (differs)
    throw Error(str("GGUF export: this model's YaRN sets ", differs, ", which llama.cpp's ", arch,
                    " does not read (it takes YaRN's defaults)"));
}

void write_yarn_keys(Header& h, const ModelConfig& mc, const std::string& a) {
  if (mc.rope_type != RopeType::yarn) return;
  h.kv_string(a + ".rope.scaling.type", "yarn");
  h.kv_f32(a + ".rope.scaling.factor", static_cast<float>(mc.yarn.factor));
  h.kv_u32(a + ".rope.scaling.original_context_length",
           static_cast<uint32_t>(mc.yarn.original_ctx));
}

// The leading dense layers of a glm4_moe model (ExportModel has checked that no dense layer follows
// an MoE one): llama.cpp's glm4moe.leading_dense_block_count.
int64_t leading_dense_layers(const ModelConfig& mc) {
  int64_t k = 0;
  while (k < mc.layers && !mc.is_moe_layer(k)) ++k;
  return k;
}

// What llama.cpp's glm4moe hard-codes and a glm4_moe config may vary: a shared expert in every MoE
// layer (its graph always runs one) as wide as a whole number of experts (it sizes the shared
// tensors by expert_shared_count x expert_feed_forward_length).
void check_glm4moe(const ModelConfig& mc) {
  if (mc.shared_expert_ff == 0)
    throw Error(
        "GGUF export: llama.cpp's glm4moe always runs a shared expert; this model has none "
        "(shared_expert_ff 0)");
  if (mc.shared_expert_ff % mc.d_ff != 0)
    throw Error(str("GGUF export: llama.cpp's glm4moe sizes the shared expert in whole experts (",
                    mc.d_ff, " wide each); this model's is ", mc.shared_expert_ff, " wide"));
}

// The keys only glm4moe reads (llama.cpp's converter writes them from configuration_glm4_moe's
// n_shared_experts, first_k_dense_replace, n_group / topk_group, routed_scaling_factor and
// norm_topk_prob). Groups that all take part are no limit: they go out as one group, since
// llama.cpp refuses expert_group_used_count equal to expert_group_count.
void write_glm4moe_keys(Header& h, const ModelConfig& mc) {
  const bool grouped = mc.router_groups > 1 && mc.router_group_topk < mc.router_groups;
  h.kv_u32("glm4moe.expert_shared_count", static_cast<uint32_t>(mc.shared_expert_ff / mc.d_ff));
  h.kv_u32("glm4moe.leading_dense_block_count", static_cast<uint32_t>(leading_dense_layers(mc)));
  h.kv_u32("glm4moe.expert_group_count", static_cast<uint32_t>(grouped ? mc.router_groups : 1));
  h.kv_u32("glm4moe.expert_group_used_count",
           static_cast<uint32_t>(grouped ? mc.router_group_topk : 1));
  h.kv_u32("glm4moe.expert_gating_func", 2);  // llama.cpp's SIGMOID
  h.kv_f32("glm4moe.expert_weights_scale", static_cast<float>(mc.routed_scale));
  h.kv_bool("glm4moe.expert_weights_norm", mc.normalize_topk);
}

// The key/value section: general.*, the architecture's keys (`A.*`), the vocabulary and our
// record of the model.
Header model_keys(const LlamaArch& arch, const ExportModel& m, const Checkpoint& ckpt,
                  const GgufExportOptions& options, const Tokenizer* tokenizer) {
  const ModelConfig& mc = m.config();
  const int64_t V = mc.vocab_size, D = mc.d_model, F = mc.d_ff, H = mc.heads, E = m.experts();
  const int64_t KV = mc.kv_heads_resolved(), hd = mc.head_dim_resolved();
  const int64_t Fs = mc.shared_expert_ff, Fd = mc.dense_ff_resolved();
  Header h;
  const std::string a = arch.name;
  h.kv_string("general.architecture", a);
  h.kv_string("general.name", options.name.empty() ? "moe" : options.name);
  // A block checkpoint's recipe names the file's type (llama.cpp's MOSTLY_MXFP4_MOE for
  // gpt-oss's kept experts), its own mixes aside.
  const std::string recipe = quantization_of(ckpt.model_config);
  const bool recipe_type = !recipe.empty() && recipe != kMixedRecipe && recipe != "q4_k_m";
  h.kv_u32("general.file_type", options.q4_k_m || recipe == "q4_k_m" ? 15
                                : recipe_type ? file_type(parse_gguf_type(recipe))
                                              : file_type(options.type));
  if (is_blocked(options.type) || !recipe.empty()) h.kv_u32("general.quantization_version", 2);
  h.kv_u32("general.alignment", static_cast<uint32_t>(kAlignment));
  h.kv_u32(a + ".vocab_size", static_cast<uint32_t>(V));
  h.kv_u32(a + ".context_length", static_cast<uint32_t>(mc.seq));
  h.kv_u32(a + ".embedding_length", static_cast<uint32_t>(D));
  h.kv_u32(a + ".block_count", static_cast<uint32_t>(mc.layers));
  // HF intermediate_size, as llama.cpp's converter writes it: glm4moe's and the qwen
  // architectures' the dense layers' width (theirs whether or not the model has dense layers),
  // llama's and olmoe's the experts'
  const bool qwen = mc.arch == Arch::qwen2_moe || mc.arch == Arch::qwen3_moe;
  h.kv_u32(a + ".feed_forward_length",
           static_cast<uint32_t>(arch.glm || arch.deepseek || qwen ? Fd : F));
  // The qwen architectures size their experts by this key (else feed_forward_length / k).
  if (a != "llama") h.kv_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(F));
  if (Fs > 0 && !arch.glm && !arch.deepseek)
    h.kv_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(Fs));
  h.kv_u32(a + ".attention.head_count", static_cast<uint32_t>(H));
  // deepseek2's absorbed latent attention is one key/value head (MQA), as its converter writes
  h.kv_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(arch.deepseek ? 1 : KV));
  // Head width (llama.cpp's default is embedding_length / head_count; Qwen3-MoE's differs).
  // deepseek2's widths are write_deepseek2_keys'.
  if (!arch.deepseek) {
    h.kv_u32(a + ".attention.key_length", static_cast<uint32_t>(hd));
    h.kv_u32(a + ".attention.value_length", static_cast<uint32_t>(hd));
  }
  h.kv_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(mc.norm_eps));
  h.kv_f32(a + ".rope.freq_base", static_cast<float>(mc.rope_theta));
  // glm4_moe may rotate only the first rope_dim features of a head (partial RoPE)
  h.kv_u32(a + ".rope.dimension_count", static_cast<uint32_t>(mc.rope_dim_resolved()));
  write_yarn_keys(h, mc, a);
  h.kv_u32(a + ".expert_count", static_cast<uint32_t>(E));
  h.kv_u32(a + ".expert_used_count", static_cast<uint32_t>(mc.top_k));
  if (arch.glm) write_glm4moe_keys(h, mc);
  if (arch.deepseek) gguf_out::write_deepseek2_keys(h, mc);
  if (arch.gpt_oss) gguf_out::write_gpt_oss_keys(h, mc);
  write_vocabulary(h, tokenizer, V);
  h.kv_string("moe.model_config", to_json(m.recorded_config()).dump());
  h.kv_string("moe.producer", str("libmoe ", version(), " (git ", git_revision(), ")"));
  return h;
}

// The file's header: the counts, the keys `h`, each tensor's info (its data at the next multiple
// of the alignment), padded to the alignment; data_bytes the data section's size.
std::string header_bytes(Header& h, const std::vector<Planned>& plan, uint64_t& data_bytes) {
  Header infos;
  uint64_t offset = 0;
  for (const Planned& p : plan) {
    infos.put_string(p.name);
    infos.put_u32(static_cast<uint32_t>(p.dims.size()));
    for (int64_t d : p.dims) infos.put_u64(static_cast<uint64_t>(d));
    infos.put_u32(static_cast<uint32_t>(p.type));
    infos.put_u64(offset);
    offset += (static_cast<uint64_t>(p.nbytes()) + kAlignment - 1) / kAlignment * kAlignment;
  }
  Header top;
  top.bytes() = "GGUF";
  top.put_u32(3);
  top.put_u64(plan.size());
  top.put_u64(h.keys());
  std::string header = top.bytes() + h.bytes() + infos.bytes();
  header.append((kAlignment - header.size() % kAlignment) % kAlignment, '\0');
  data_bytes = offset;
  return header;
}

// Writes `header` then each planned tensor, converted part by part, into an AtomicFile at `path`.
void write_file(const std::string& path, const std::string& header,
                const std::vector<Planned>& plan) {
  AtomicFile out(path);
  std::FILE* f = std::fopen(out.temp().c_str(), "wb");
  if (!f) throw Error(str("GGUF export: cannot write '", out.temp(), "': ", std::strerror(errno)));
  auto write = [&](const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f) != n) {
      const int err = errno;
      std::fclose(f);
      f = nullptr;
      throw Error(str("GGUF export: writing '", path, "' failed: ", std::strerror(err)));
    }
  };
  try {
    write(header.data(), header.size());
    std::vector<uint8_t> bytes;
    const std::vector<uint8_t> zeros(kAlignment, 0);
    for (const Planned& p : plan) {
      uint64_t written = 0;
      for (int64_t part = 0; part < p.parts; ++part) {
        if (p.bytes)
          bytes = p.bytes(part);
        else
          encode(p.name, p.type, p.values(part), bytes);
        write(bytes.data(), bytes.size());
        written += bytes.size();
      }
      MOE_CHECK(written == static_cast<uint64_t>(p.nbytes()), "GGUF export: tensor '", p.name,
                "' came to ", written, " bytes, expected ", p.nbytes());
      write(zeros.data(), (kAlignment - written % kAlignment) % kAlignment);
    }
    std::FILE* closing = f;
    f = nullptr;
    if (std::fclose(closing) != 0)
      throw Error(str("GGUF export: closing '", path, "' failed: ", std::strerror(errno)));
    out.commit();
    out.sync_directory();
  } catch (...) {
    if (f) std::fclose(f);
    throw;  // the AtomicFile removes the temp; an existing `path` is untouched
  }
}

// What llama.cpp's architecture `arch` cannot hold beyond ExportModel's checks, refused by name
// before anything is planned: its top-k renormalisation, norms, window and YaRN, its shared
// expert, and a vocabulary the checkpoint does not describe.
void check_exportable(const LlamaArch& arch, const ModelConfig& mc, const Checkpoint& ckpt) {
  if (arch.glm) check_glm4moe(mc);
  if (arch.deepseek) gguf_out::check_deepseek2(mc);
  if (!arch.glm && !arch.deepseek && mc.normalize_topk != arch.normalize_topk)
    throw Error(str("GGUF export: llama.cpp's ", arch.name,
                    arch.normalize_topk ? " renormalises" : " does not renormalise",
                    " the top-k gate weights; this model ", mc.normalize_topk ? "does" : "does not",
                    " (normalize_topk ", mc.normalize_topk ? "true" : "false", ")"));
  check_olmoe_norm_widths(mc);
  if (arch.gpt_oss) gguf_out::check_gpt_oss(mc);  // its window and YaRN checks too
  if (!arch.deepseek && !arch.gpt_oss) check_yarn(mc, arch.name);
  if (!arch.gpt_oss) check_window(mc, arch.name);
  const Flavour flavour = flavour_of(mc);
  if (!flavour.shared_expert_gate && !flavour.ungated_shared_expert && mc.shared_expert_ff > 0)
    throw Error(str("GGUF export: llama.cpp's ", arch.name,
                    " has no shared expert; this model's is ", mc.shared_expert_ff,
                    " wide (qwen2moe has one, gated)"));
  if (flavour.shared_expert_gate && mc.shared_expert_ff == 0)
    throw Error(
        "GGUF export: llama.cpp's qwen2moe always runs a shared expert; this model has none "
        "(shared_expert_ff 0)");
  if (mc.vocab_size != kByteVocab && ckpt.tokenizer.empty())
    throw Error(str("GGUF export: the model has a vocabulary of ", mc.vocab_size,
                    " tokens and the checkpoint stores no tokenizer to describe them (only "
                    "byte-level models, 256 tokens, carry an implied one; import-hf keeps a "
                    "model directory's tokenizer)"));
}

// The plan of the file's tensors, in llama.cpp's order: each tensor's GGUF name, dims and type,
// and how to produce its data from ExportModel's params (which must outlive the plan).
class Planner {
 public:
  Planner(ExportModel& m, const Checkpoint& ckpt, const LlamaArch& arch,
          const GgufExportOptions& options, GgufExportSummary& summary)
      : m_(m), ckpt_(ckpt), mc_(m.config()), arch_(arch), options_(options), summary_(summary) {}

  // The whole file: the embedding, each block, the final norm and the head.
  std::vector<Planned> plan() {
    const int64_t V = mc_.vocab_size, D = mc_.d_model;
    matrix("token_embd.weight", "embed.tokens", V, D);
    for (int64_t i = 0; i < mc_.layers; ++i) block(i);
    vector("output_norm.weight", "final_norm.weight", D);
    // A tied head goes out as no output.weight: llama.cpp then reads token_embd as the head.
    if (!mc_.tie_embeddings) matrix("output.weight", "lm_head.weight", V, D);
    m_.refuse_unused();
    for (const auto& [name, type] : options_.tensor_types)
      MOE_CHECK(overridden_.count(name), "GGUF export: a type (", gguf_type_name(type),
                ") is asked for tensor '", name, "', which is not one of the file's matrices");
    return std::move(plan_);
  }

 private:
  void block(int64_t i);
  void attention(int64_t i);
  void moe_layer(int64_t i);
  GgufType matrix_type(const std::string& name, int64_t row);
  std::optional<std::pair<GgufType, Shape>> kept(const std::string& ours, Shape shape) const;
  void whole(const std::string& gguf, const NamedTensor& nt, std::vector<int64_t> dims,
             GgufType type);
  void matrix(const std::string& gguf, const std::string& ours, int64_t rows, int64_t cols);
  void vector(const std::string& gguf, const std::string& ours, int64_t n);
  void rope_matrix(const std::string& gguf, const std::string& ours, int64_t heads);
  void experts(const std::string& gguf, const std::string& ours, int64_t rows, int64_t cols);

  ExportModel& m_;
  const Checkpoint& ckpt_;
  const ModelConfig& mc_;
  const LlamaArch& arch_;
  const GgufExportOptions& options_;
  GgufExportSummary& summary_;
  const Flavour flavour_ = flavour_of(mc_);
  const int64_t hd_ = mc_.head_dim_resolved();
  std::vector<Planned> plan_;
  std::set<std::string> overridden_;  // the tensors options.tensor_types named
};

// A matrix of rows of `row` values in the asked type (quantised types need whole blocks per row);
// with Q4_K_M, llama.cpp's choice of q6_k for the head and some layers' v and down.
GgufType Planner::matrix_type(const std::string& name, int64_t row) {
  GgufType type = options_.type;
  if (options_.q4_k_m && q4_k_m_wants_q6_k(name, mc_.layers)) type = GgufType::q6_k;
  if (const auto it = options_.tensor_types.find(name); it != options_.tensor_types.end()) {
    type = it->second;
    overridden_.insert(name);
  }
  const int64_t block = is_blocked(type) ? cpu::block_elems(block_format_of(type)) : 1;
  if (row % block != 0) {
    summary_.fallbacks.push_back(str(name, ": f16 (rows of ", row, " values are not whole ",
                                     gguf_type_name(type), " blocks of ", block, ")"));
    return GgufType::f16;
  }
  return type;
}

// The GGUF type of a tensor the checkpoint keeps in blocks and its stored shape (u8 [.., out, row
// bytes]), written as it is whatever the asked type; nullopt for one held in floats.
std::optional<std::pair<GgufType, Shape>> Planner::kept(const std::string& ours,
                                                        Shape shape) const {
  const std::string format = block_format_of(ckpt_.model_config, ours);
  if (format.empty()) return std::nullopt;
  const GgufType type = parse_gguf_type(format);
  shape.back() = cpu::block_row_bytes(block_format_of(type), shape.back());
  return std::pair{type, shape};
}

void Planner::whole(const std::string& gguf, const NamedTensor& nt, std::vector<int64_t> dims,
                    GgufType type) {
  plan_.push_back(
      {gguf, std::move(dims), type, 1, [&nt](int64_t) { return nt.whole().to_vector(); }});
}

void Planner::matrix(const std::string& gguf, const std::string& ours, int64_t rows, int64_t cols) {
  if (const auto k = kept(ours, {rows, cols})) {
    const NamedTensor& nt = m_.param(ours, k->second);
    plan_.push_back({gguf, {cols, rows}, k->first, 1, nullptr, [&nt](int64_t) {
                       return bytes_of(nt.whole());
                     }});
    return;
  }
  whole(gguf, m_.param(ours, {rows, cols}), {cols, rows}, matrix_type(gguf, cols));
}

void Planner::vector(const std::string& gguf, const std::string& ours, int64_t n) {
  whole(gguf, m_.param(ours, {n}), {n}, GgufType::f32);
}

// A q or k projection of `heads` heads: llama's rows permuted within each head (NORM rope).
void Planner::rope_matrix(const std::string& gguf, const std::string& ours, int64_t heads) {
  const int64_t D = mc_.d_model, hd = hd_;
  if (!arch_.permute_qk) return matrix(gguf, ours, heads * hd, D);
  if (const auto k = kept(ours, {heads * hd, D})) {  // whole rows of blocks, permuted
    const NamedTensor& nt = m_.param(ours, k->second);
    const int64_t row = k->second.back();
    plan_.push_back({gguf, {D, heads * hd}, k->first, 1, nullptr, [&nt, heads, hd, row](int64_t) {
                       return permute_rope_rows(bytes_of(nt.whole()), heads, hd, row);
                     }});
    return;
  }
  const NamedTensor& nt = m_.param(ours, {heads * hd, D});
  plan_.push_back({gguf, {D, heads * hd}, matrix_type(gguf, D), 1, [&nt, heads, hd, D](int64_t) {
                     return permute_rope_rows(nt.whole().to_vector(), heads, hd, D);
                   }});
}

// An expert tensor [E, rows, cols], produced expert by expert.
void Planner::experts(const std::string& gguf, const std::string& ours, int64_t rows,
                      int64_t cols) {
  const int64_t E = m_.experts();
  if (const auto k = kept(ours, {E, rows, cols})) {
    const NamedTensor& nt = m_.param(ours, k->second);
    plan_.push_back({gguf, {cols, rows, E}, k->first, E, nullptr, [&nt](int64_t e) {
                       return bytes_of(nt.expert_slice(e));
                     }});
    return;
  }
  const NamedTensor& nt = m_.param(ours, {E, rows, cols});
  plan_.push_back({gguf, {cols, rows, E}, matrix_type(gguf, cols), E, [&nt](int64_t e) {
                     return nt.expert_slice(e).to_vector();
                   }});
}

// Block i's attention: deepseek2's latent attention, or q/k/v/o with their biases and qk-norms.
void Planner::attention(int64_t i) {
  const int64_t D = mc_.d_model, H = mc_.heads, KV = mc_.kv_heads_resolved(), hd = hd_;
  const std::string ours = str("blocks.", i, "."), blk = str("blk.", i, ".");
  if (arch_.deepseek) {
    gguf_out::deepseek2_attention(
        m_, i, [this](const std::string& name, int64_t row) { return matrix_type(name, row); },
        plan_);
  } else {
    rope_matrix(blk + "attn_q.weight", ours + "attn.q.weight", H);
    rope_matrix(blk + "attn_k.weight", ours + "attn.k.weight", KV);
    matrix(blk + "attn_v.weight", ours + "attn.v.weight", KV * hd, D);
    matrix(blk + "attn_output.weight", ours + "attn.o.weight", D, H * hd);
  }
  if (flavour_.qkv_bias || flavour_.bias) {  // f32, as llama.cpp's converter keeps 1-D tensors
    vector(blk + "attn_q.bias", ours + "attn.q.bias", H * hd);
    vector(blk + "attn_k.bias", ours + "attn.k.bias", KV * hd);
    vector(blk + "attn_v.bias", ours + "attn.v.bias", KV * hd);
  }
  if (flavour_.qk_norm != nn::QkNorm::none) {  // per head [hd] (qwen3moe) or full width (olmoe)
    const bool head = flavour_.qk_norm == nn::QkNorm::head;
    vector(blk + "attn_q_norm.weight", ours + "attn.q_norm.weight", head ? hd : H * hd);
    vector(blk + "attn_k_norm.weight", ours + "attn.k_norm.weight", head ? hd : KV * hd);
  }
}

// Block i's router, experts, gpt-oss's extras and the shared expert.
void Planner::moe_layer(int64_t i) {
  const int64_t D = mc_.d_model, F = mc_.d_ff, E = m_.experts(), Fs = mc_.shared_expert_ff;
  const std::string ours = str("blocks.", i, "."), blk = str("blk.", i, ".");
  whole(blk + "ffn_gate_inp.weight", m_.router_weight(ours, E, D), {D, E}, GgufType::f32);
  if (flavour_.router_bias)  // the selection bias, f32 as llama.cpp's converter keeps 1-D ones
    vector(blk + "exp_probs_b.bias", ours + "moe.router.bias", E);
  experts(blk + "ffn_gate_exps.weight", ours + "moe.experts.w1", F, D);
  experts(blk + "ffn_down_exps.weight", ours + "moe.experts.w2", D, F);
  experts(blk + "ffn_up_exps.weight", ours + "moe.experts.w3", F, D);
  if (arch_.gpt_oss) gguf_out::gpt_oss_layer_extras(m_, i, plan_);
  if (Fs > 0) {  // qwen2moe's shared expert, its gate [1, D] as llama.cpp's converter has it;
                 // glm4moe's, ungated
    if (flavour_.shared_expert_gate)
      whole(blk + "ffn_gate_inp_shexp.weight", m_.param(ours + "moe.shared_gate.weight", {1, D}),
            {D, 1}, GgufType::f32);
    matrix(blk + "ffn_gate_shexp.weight", ours + "moe.shared.w1", Fs, D);
    matrix(blk + "ffn_down_shexp.weight", ours + "moe.shared.w2", D, Fs);
    matrix(blk + "ffn_up_shexp.weight", ours + "moe.shared.w3", Fs, D);
  }
}

void Planner::block(int64_t i) {
  const int64_t D = mc_.d_model, Fd = mc_.dense_ff_resolved();
  const std::string ours = str("blocks.", i, "."), blk = str("blk.", i, ".");
  vector(blk + "attn_norm.weight", ours + "norm1.weight", D);
  attention(i);
  // glm4moe names the norm before the feed-forward part after the attention it follows
  vector(blk + (arch_.glm || arch_.gpt_oss ? "post_attention_norm.weight" : "ffn_norm.weight"),
         ours + "norm2.weight", D);
  if (!mc_.is_moe_layer(i)) {  // glm4_moe's and deepseek_v3's leading dense layers
    matrix(blk + "ffn_gate.weight", ours + "mlp.w1", Fd, D);
    matrix(blk + "ffn_down.weight", ours + "mlp.w2", D, Fd);
    matrix(blk + "ffn_up.weight", ours + "mlp.w3", Fd, D);
    return;
  }
  moe_layer(i);
}

}  // namespace

GgufExportSummary export_gguf(const Checkpoint& ckpt, const std::string& path,
                              const GgufExportOptions& options) {
  const LlamaArch arch = llama_arch(model_config_from_json(ckpt.model_config).arch);
  check_quantization(ckpt);
  ExportModel m(ckpt, "GGUF export", str("llama.cpp's ", arch.name, " architecture"));
  const ModelConfig& mc = m.config();
  check_exportable(arch, mc, ckpt);
  // Read before any tensor is planned: a tokenizer llama.cpp cannot take is refused up front.
  std::unique_ptr<Tokenizer> tokenizer;
  if (!ckpt.tokenizer.empty())
    tokenizer = tokenizer_from_bytes(ckpt.tokenizer.file, ckpt.tokenizer.bytes, "the checkpoint");
  MOE_CHECK(mc.mla() || mc.head_dim_resolved() % 2 == 0, "GGUF export: head dim ",
            mc.head_dim_resolved(), " is odd");
  MOE_CHECK(!options.q4_k_m || options.type == GgufType::q4_k,
            "GGUF export: the Q4_K_M mix is q4_k with some tensors in q6_k (type q4_k), not ",
            gguf_type_name(options.type));
  GgufExportSummary summary;
  const std::vector<Planned> plan = Planner(m, ckpt, arch, options, summary).plan();

  Header h = model_keys(arch, m, ckpt, options, tokenizer.get());
  uint64_t data_bytes = 0;
  const std::string header = header_bytes(h, plan, data_bytes);
  write_file(path, header, plan);
  if (arch.gpt_oss && !gguf_out::gpt_oss_yarn_note(mc).empty())
    summary.notes.push_back(gguf_out::gpt_oss_yarn_note(mc));
  summary.tensors = static_cast<int64_t>(plan.size());
  summary.keys = static_cast<int64_t>(h.keys());
  summary.bytes = static_cast<int64_t>(header.size() + data_bytes);
  return summary;
}

}  // namespace moe::io
