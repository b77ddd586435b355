// DeepSeek-V3's latent attention: HF rows <-> our params (see io/hf_mla.h).
#include "io/hf_mla.h"

#include <cstring>

#include "moe/error.h"

namespace moe::io::hf {

namespace {

std::vector<int64_t> range(int64_t first, int64_t count) {
  std::vector<int64_t> r;
  for (int64_t i = 0; i < count; ++i) r.push_back(first + i);
  return r;
}

// The dr RoPE rows starting at `first`, in rotate-half order.
void push_rope(std::vector<int64_t>& rows, int64_t first, int64_t dr, bool interleaved) {
  if (!interleaved) {
    for (int64_t i = 0; i < dr; ++i) rows.push_back(first + i);
    return;
  }
  for (int64_t i = 0; i < dr / 2; ++i) rows.push_back(first + 2 * i);
  for (int64_t i = 0; i < dr / 2; ++i) rows.push_back(first + 2 * i + 1);
}

}  // namespace

std::vector<MlaPart> mla_parts(const ModelConfig& mc, bool interleaved) {
  const int64_t H = mc.heads, dn = mc.qk_nope_dim, dr = mc.qk_rope_dim, dv = mc.v_head_dim;
  const int64_t c = mc.kv_lora_rank, hd = dn + dr;
  std::vector<int64_t> q, k_rope, k_b, v_b;
  for (int64_t h = 0; h < H; ++h) {
    push_rope(q, h * hd + dn, dr, interleaved);  // HF: each head [nope | rope]
    for (int64_t j = 0; j < dn; ++j) q.push_back(h * hd + j);
    for (int64_t j = 0; j < dn; ++j) k_b.push_back(h * (dn + dv) + j);
    for (int64_t j = 0; j < dv; ++j) v_b.push_back(h * (dn + dv) + dn + j);
  }
  push_rope(k_rope, c, dr, interleaved);
  // nn::Mla's parameter order, then o.
  std::vector<MlaPart> parts = {{"attn.kv_a.weight", Slot::mla_kv_a, range(0, c)},
                                {"attn.k_rope.weight", Slot::mla_kv_a, k_rope},
                                {"attn.k_b.weight", Slot::mla_kv_b, k_b},
                                {"attn.v_b.weight", Slot::mla_kv_b, v_b},
                                {"attn.kv_a_norm.weight", Slot::mla_kv_a_norm, range(0, c)}};
  if (mc.q_lora_rank > 0) {
    parts.push_back({"attn.q_a.weight", Slot::mla_q_a, range(0, mc.q_lora_rank)});
    parts.push_back({"attn.q_a_norm.weight", Slot::mla_q_a_norm, range(0, mc.q_lora_rank)});
    parts.push_back({"attn.q_b.weight", Slot::mla_q_b, q});
  } else {
    parts.push_back({"attn.q.weight", Slot::q, q});
  }
  parts.push_back({"attn.o.weight", Slot::o, range(0, mc.d_model)});
  return parts;
}

Shape mla_hf_shape(const ModelConfig& mc, Slot slot, std::string& why) {
  const int64_t D = mc.d_model, H = mc.heads, r = mc.q_lora_rank, c = mc.kv_lora_rank;
  const int64_t hd = mc.qk_nope_dim + mc.qk_rope_dim, dv = mc.v_head_dim;
  switch (slot) {
    case Slot::mla_q_a:
      why = "[q_lora_rank, hidden_size]";
      return {r, D};
    case Slot::mla_q_a_norm:
      why = "[q_lora_rank]";
      return {r};
    case Slot::mla_q_b:
      why = "[num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim), q_lora_rank]";
      return {H * hd, r};
    case Slot::q:
      why = "[num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim), hidden_size]";
      return {H * hd, D};
    case Slot::mla_kv_a:
      why = "[kv_lora_rank + qk_rope_head_dim, hidden_size]";
      return {c + mc.qk_rope_dim, D};
    case Slot::mla_kv_a_norm:
      why = "[kv_lora_rank]";
      return {c};
    case Slot::mla_kv_b:
      why = "[num_attention_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]";
      return {H * (mc.qk_nope_dim + dv), c};
    default:
      why = "[hidden_size, num_attention_heads * v_head_dim]";
      return {D, H * dv};
  }
}

Tensor pick_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  MOE_CHECK(t.ndim() >= 1 && t.device().kind == Device::cpu, "pick_rows: ", t.describe());
  const int64_t R = t.dim(0);
  const size_t row_bytes = R > 0 ? t.nbytes() / static_cast<size_t>(R) : 0;
  Shape shape = t.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(shape, t.dtype());
  const auto* from = static_cast<const std::byte*>(t.raw());
  auto* to = static_cast<std::byte*>(out.raw());
  for (size_t i = 0; i < rows.size(); ++i) {
    MOE_CHECK(rows[i] >= 0 && rows[i] < R, "pick_rows: row ", rows[i], " of ", t.describe());
    std::memcpy(to + i * row_bytes, from + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
  }
  return out;
}

std::vector<NamedTensor> mla_hf_tensors(
    const ModelConfig& mc, const std::string& ours, const std::string& hf,
    const std::function<const NamedTensor&(const std::string&, const Shape&)>& param) {
  const std::vector<MlaPart> parts = mla_parts(mc, true);
  const std::pair<Slot, const char*> order[] = {{Slot::mla_q_a, "q_a_proj.weight"},
                                                {Slot::mla_q_a_norm, "q_a_layernorm.weight"},
                                                {Slot::mla_q_b, "q_b_proj.weight"},
                                                {Slot::q, "q_proj.weight"},
                                                {Slot::mla_kv_a, "kv_a_proj_with_mqa.weight"},
                                                {Slot::mla_kv_a_norm, "kv_a_layernorm.weight"},
                                                {Slot::mla_kv_b, "kv_b_proj.weight"},
                                                {Slot::o, "o_proj.weight"}};
  std::vector<NamedTensor> out;
  for (const auto& [slot, name] : order) {
    std::string why;
    const Shape whole = mla_hf_shape(mc, slot, why);
    std::vector<std::pair<NamedTensor, std::vector<int64_t>>> from;  // our param, its HF rows
    for (const MlaPart& part : parts) {
      if (part.slot != slot) continue;
      Shape shape = whole;
      shape[0] = static_cast<int64_t>(part.rows.size());
      from.push_back({param(ours + part.our, shape), part.rows});
    }
    if (from.empty()) continue;  // q_proj with a q latent, or the q latent without one
    const DType dtype = from[0].first.dtype();
    auto source = std::make_shared<TensorSource>();
    source->shape = whole;
    source->dtype = dtype;
    source->read = [whole, dtype, from] {
      Tensor t = Tensor::empty(whole, dtype);
      const size_t row_bytes = t.nbytes() / static_cast<size_t>(whole[0]);
      auto* to = static_cast<std::byte*>(t.raw());
      for (const auto& [nt, rows] : from) {
        const Tensor value = nt.whole().to(Device{});
        const auto* src = static_cast<const std::byte*>(value.raw());
        for (size_t i = 0; i < rows.size(); ++i)
          std::memcpy(to + static_cast<size_t>(rows[i]) * row_bytes, src + i * row_bytes,
                      row_bytes);
      }
      return t;
    };
    NamedTensor nt{hf + name, Tensor(), false, {}};
    nt.deferred = std::move(source);
    out.push_back(std::move(nt));
  }
  return out;
}

}  // namespace moe::io::hf
