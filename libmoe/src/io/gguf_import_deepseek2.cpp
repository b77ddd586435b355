// GGUF import of llama.cpp's deepseek2 (see io/gguf_import_deepseek2.h).
// Shape letters: D hidden, H heads, r q_lora_rank, c kv_lora_rank, dn qk_nope, dr qk_rope,
// dv v_head_dim.
// The file's q / kv_a rows hold each rope part in DeepSeek's interleaved pairs (llama.cpp's NORM
// rope; io/gguf_deepseek2.cpp): hf::mla_parts(mc, true) names, for each of our params, the rows
// of such a tensor in our order (rope first, in halves), as for an HF directory in DeepSeek's
// layout.
#include "io/gguf_import_deepseek2.h"

#include <algorithm>
#include <map>
#include <utility>

#include "io/gguf_blocks.h"
#include "io/hf_mla.h"
#include "moe/error.h"
#include "moe/ops/moe.h"

namespace moe::io::gguf {

namespace {

constexpr int64_t kMaxWidth = int64_t(1) << 24;
const std::string kArch = "deepseek2.";

}  // namespace

void deepseek2_attention_config(const Keys& k, ModelConfig& mc) {
  const std::string a = kArch + "attention.";
  if (!k.has(a + "key_length_mla"))
    k.fail(a + "key_length_mla",
           "is missing: a deepseek2 file from before llama.cpp split kv_b (attn_kv_b) is not "
           "read; convert the model again");
  mc.q_lora_rank = k.has(a + "q_lora_rank") ? k.bounded(a + "q_lora_rank", 0, kMaxWidth) : 0;
  mc.kv_lora_rank = k.bounded(a + "kv_lora_rank", 1, kMaxWidth);
  mc.qk_rope_dim = k.bounded(kArch + "rope.dimension_count", 2, kMaxWidth);
  if (mc.qk_rope_dim % 2 != 0)
    k.fail(kArch + "rope.dimension_count", str("is ", mc.qk_rope_dim, ": RoPE rotates pairs"));
  mc.qk_nope_dim = k.bounded(a + "key_length_mla", mc.qk_rope_dim + 1, kMaxWidth) - mc.qk_rope_dim;
  mc.v_head_dim = k.bounded(a + "value_length_mla", 1, kMaxWidth);
  // The absorbed attention llama.cpp runs: one key/value head of c + dr, values c.
  const int64_t c = mc.kv_lora_rank;
  if (k.integer_or(a + "head_count_kv", 1) != 1)
    k.fail(a + "head_count_kv", "is not 1 (deepseek2's latent attention is one key/value head)");
  if (k.integer_or(a + "key_length", c + mc.qk_rope_dim) != c + mc.qk_rope_dim)
    k.fail(a + "key_length",
           str("is not kv_lora_rank + rope.dimension_count (", c, " + ", mc.qk_rope_dim, ")"));
  if (k.integer_or(a + "value_length", c) != c)
    k.fail(a + "value_length", str("is not kv_lora_rank (", c, ")"));
  mc.kv_heads = 0;
  mc.head_dim = 0;
  mc.rope_dim = 0;
}

void deepseek2_config(const Keys& k, ModelConfig& mc) {
  const std::string& a = kArch;
  // llama.cpp reads files without the key as softmax (DeepSeek-V2's first conversions).
  const int64_t gating = k.integer_or(a + "expert_gating_func", 1);
  if (gating != 1 && gating != 2)
    k.fail(a + "expert_gating_func",
           str("is ", gating, ": expert gating other than softmax (1) or sigmoid (2)"));
  mc.router_scoring = gating == 2 ? nn::RouterScoring::sigmoid : nn::RouterScoring::softmax;
  mc.routed_scale = k.real_or(a + "expert_weights_scale", 1.0);
  if (!(mc.routed_scale > 0)) k.fail(a + "expert_weights_scale", str("is ", mc.routed_scale));
  mc.router_groups = k.has(a + "expert_group_count")
                         ? k.bounded(a + "expert_group_count", 1, ops::kMaxRouterGroups)
                         : 1;
  mc.router_group_topk = k.has(a + "expert_group_used_count")
                             ? k.bounded(a + "expert_group_used_count", 1, mc.router_groups)
                             : mc.router_groups;
  const int64_t dense = k.has(a + "leading_dense_block_count")
                            ? k.bounded(a + "leading_dense_block_count", 0, mc.layers - 1)
                            : 0;
  const int64_t Fd = k.bounded(a + "feed_forward_length", 1, kMaxWidth);
  mc.dense_ff = dense > 0 && Fd != mc.d_ff ? Fd : 0;
  mc.experts_per_layer.assign(static_cast<size_t>(mc.layers), mc.experts);
  std::fill_n(mc.experts_per_layer.begin(), dense, 0);
  mc.shared_expert_ff = k.bounded(a + "expert_shared_count", 0, int64_t(1) << 16) * mc.d_ff;
  if (mc.shared_expert_ff > kMaxWidth)
    k.fail(a + "expert_shared_count", str("makes a shared expert ", mc.shared_expert_ff, " wide"));
  if (mc.rope_type != RopeType::yarn) return;
  // YaRN: llama.cpp's deepseek2 takes mscale = mscale_all_dim = yarn_log_multiplier / 0.1 (its
  // converter writes 0.1 mscale_all_dim); without the key it would scale both the rotation and
  // the scores by YaRN's default, which DeepSeek's attention never does.
  const std::string key = a + "rope.scaling.yarn_log_multiplier";
  const double log_mul = k.real_or(key, 0.0);
  if (!(log_mul > 0))
    k.fail(key,
           "is missing or not > 0: deepseek2's YaRN without DeepSeek's mscale_all_dim is not "
           "supported");
  mc.yarn.mscale = mc.yarn.mscale_all_dim = log_mul / 0.1;
  // Betas other than YaRN's defaults (ours and llama.cpp's 32 / 1) are not read by our YaRN.
  for (auto [beta, standard] :
       {std::pair<const char*, double>{"yarn_beta_fast", 32.0}, {"yarn_beta_slow", 1.0}}) {
    const std::string name = a + "rope.scaling." + beta;
    if (k.real_or(name, standard) != standard)
      k.fail(name,
             str("is ", k.real(name), ": YaRN with other betas than 32 / 1 is not supported"));
  }
}

void deepseek2_attention_tensors(const ModelConfig& mc, int64_t i,
                                 std::vector<GgufTensorPlan>& out) {
  const int64_t H = mc.heads, c = mc.kv_lora_rank, dn = mc.qk_nope_dim, dv = mc.v_head_dim;
  const std::string blk = str("blk.", i, "."), b = str("blocks.", i, ".");
  for (const hf::MlaPart& part : hf::mla_parts(mc, true)) {
    std::string why;
    const Shape hf_shape = hf::mla_hf_shape(mc, part.slot, why);
    GgufTensorPlan t;
    t.ours = b + part.our;
    t.shape = hf_shape;
    t.shape[0] = static_cast<int64_t>(part.rows.size());
    switch (part.slot) {
      case hf::Slot::mla_q_a:
        t.gguf = "attn_q_a.weight";
        break;
      case hf::Slot::mla_q_a_norm:
        t.gguf = "attn_q_a_norm.weight";
        break;
      case hf::Slot::mla_kv_a_norm:
        t.gguf = "attn_kv_a_norm.weight";
        break;
      case hf::Slot::o:
        t.gguf = "attn_output.weight";
        break;
      case hf::Slot::mla_q_b:
      case hf::Slot::q:
      case hf::Slot::mla_kv_a:  // kv_a and k_rope: rows of one tensor
        t.gguf = part.slot == hf::Slot::mla_q_b ? "attn_q_b.weight"
                 : part.slot == hf::Slot::q     ? "attn_q.weight"
                                                : "attn_kv_a_mqa.weight";
        t.file_shape = hf_shape;
        t.rows = part.rows;
        break;
      default:  // kv_b: llama.cpp's converter split it, k_b transposed per head
        const bool k_b = part.our == "attn.k_b.weight";
        t.gguf = k_b ? "attn_k_b.weight" : "attn_v_b.weight";
        t.file_shape = k_b ? Shape{H, c, dn} : Shape{H, dv, c};
        t.head_transpose = k_b;
        break;
    }
    t.gguf = blk + t.gguf;
    out.push_back(std::move(t));
  }
}

std::vector<float> deepseek2_values(const GgufTensorPlan& t, const std::vector<float>& file) {
  const int64_t cols = t.shape.back();
  if (!t.rows.empty()) {
    std::vector<float> out;
    out.reserve(t.rows.size() * size_t(cols));
    for (int64_t r : t.rows)
      out.insert(out.end(), file.begin() + r * cols, file.begin() + (r + 1) * cols);
    return out;
  }
  if (!t.head_transpose) return file;
  const int64_t H = t.file_shape[0], c = t.file_shape[1], dn = t.file_shape[2];
  std::vector<float> out(file.size());
  for (int64_t h = 0; h < H; ++h)
    for (int64_t x = 0; x < c; ++x)
      for (int64_t j = 0; j < dn; ++j)
        out[size_t((h * dn + j) * c + x)] = file[size_t((h * c + x) * dn + j)];
  return out;
}

std::vector<uint8_t> pick_row_bytes(const std::vector<uint8_t>& bytes,
                                    const std::vector<int64_t>& rows, size_t row_bytes) {
  std::vector<uint8_t> out(rows.size() * row_bytes);
  for (size_t i = 0; i < rows.size(); ++i) {
    MOE_CHECK((size_t(rows[i]) + 1) * row_bytes <= bytes.size(), "GGUF import: row ", rows[i],
              " past the tensor's ", bytes.size() / row_bytes, " rows");
    std::copy_n(bytes.begin() + std::ptrdiff_t(size_t(rows[i]) * row_bytes), row_bytes,
                out.begin() + std::ptrdiff_t(i * row_bytes));
  }
  return out;
}

void note_dequantised(const GgufFile& f, const std::vector<GgufTensorPlan>& plan,
                      GgufImportReport& rep) {
  std::map<std::string, int64_t> by_type;  // the file's block type -> tensors dequantised
  for (const GgufTensorPlan& t : plan)
    if (t.head_transpose && is_blocked(f.tensor(t.gguf).type))
      ++by_type[gguf_type_name(f.tensor(t.gguf).type)];
  for (const auto& [type, n] : by_type)
    rep.notes.push_back(str(n, " attn_k_b tensor", n > 1 ? "s" : "", " (", type,
                            ") dequantised to floats: their blocks run along qk_nope, the rows "
                            "of our attn.k_b along kv_lora_rank (the other weight matrices keep "
                            "the file's blocks)"));
}

}  // namespace moe::io::gguf
