// gpt-oss's Hugging Face form for export-hf (see io/hf_export_gpt_oss.h). transformers'
// GptOssExperts holds each layer's experts whole and transposed (x @ W): gate_up_proj [E, D, 2F]
// with gate feature f in column 2f and up feature f in column 2f+1 (_apply_gate's ::2 / 1::2),
// gate_up_proj_bias [E, 2F] interleaved the same way, down_proj [E, F, D], down_proj_bias [E, D].
// Ours are nn.Linear-shaped per expert (w1, w3 [E, F, D], w2 [E, D, F], b1, b3 [E, F], b2 [E, D]),
// so these tensors are built, one expert at a time as the file is written (a streamed tensor):
// an export never holds more than one expert of them beyond what the checkpoint holds.
// Shape letters: D hidden size, F expert hidden width, E experts of a layer, H query heads, KV
// key/value heads, hd head dim.
#include "io/hf_export_gpt_oss.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "moe/error.h"
#include "moe/io/convert.h"
#include "moe/log.h"

namespace moe::io::hf {

namespace {

// Expert e of `param` as a host tensor of `rest` (its shape less the expert dimension).
Tensor host_expert(const NamedTensor& param, int64_t e) {
  return param.expert_slice(e).to(Device{});
}

// A tensor of `shape` written expert by expert, each slice computed by `read(e)` when written.
NamedTensor by_expert(const std::string& hf_name, const Shape& shape, DType dtype,
                      std::function<Tensor(int64_t)> read) {
  auto source = std::make_shared<ExpertSource>();
  source->shape = shape;
  source->dtype = dtype;
  source->read = std::move(read);
  NamedTensor out{hf_name, Tensor(), true, {}};
  out.source = std::move(source);
  return out;
}

// out[c][2r] = a[r][c], out[c][2r+1] = b[r][c] for a, b [R, C] (or [R] as [R, 1]): the two
// transposed with their columns interleaved, element by element of size T.
template <class T>
void interleave_transposed(const Tensor& a, const Tensor& b, int64_t R, int64_t C, Tensor& out) {
  const T* pa = static_cast<const T*>(a.raw());
  const T* pb = static_cast<const T*>(b.raw());
  T* po = static_cast<T*>(out.raw());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      po[c * 2 * R + 2 * r] = pa[r * C + c];
      po[c * 2 * R + 2 * r + 1] = pb[r * C + c];
    }
}

// out[c][r] = a[r][c] for a [R, C].
template <class T>
void transposed(const Tensor& a, int64_t R, int64_t C, Tensor& out) {
  const T* pa = static_cast<const T*>(a.raw());
  T* po = static_cast<T*>(out.raw());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) po[c * R + r] = pa[r * C + c];
}

// gate (w1 or b1) and up (w3 or b3) of one expert, [F, C], as HF's [C, 2F] (C = 1 for biases).
Tensor gate_up(const Tensor& gate, const Tensor& up, int64_t F, int64_t C) {
  Tensor out = Tensor::empty(C == 1 ? Shape{2 * F} : Shape{C, 2 * F}, gate.dtype());
  if (dtype_size(gate.dtype()) == 4)
    interleave_transposed<uint32_t>(gate, up, F, C, out);
  else
    interleave_transposed<uint16_t>(gate, up, F, C, out);
  return out;
}

// One expert's w2 [D, F] as HF's down_proj slice [F, D].
Tensor down(const Tensor& w2, int64_t D, int64_t F) {
  Tensor out = Tensor::empty({F, D}, w2.dtype());
  if (dtype_size(w2.dtype()) == 4)
    transposed<uint32_t>(w2, D, F, out);
  else
    transposed<uint16_t>(w2, D, F, out);
  return out;
}

// The sinks (ours f32 whatever the model's dtype) in the model's dtype, as transformers saves
// the parameter: exact for a model imported from a file of that dtype; after training in f32 it
// rounds, and a warning says by how much.
NamedTensor sinks_in(const std::string& hf_name, const NamedTensor& sinks, DType dtype) {
  NamedTensor out =
      map_tensor(sinks, sinks.shape(), dtype, [hf_name, dtype](const Tensor& x, int64_t) {
        const Tensor host = x.to(Device{});
        const Tensor rounded = host.to(dtype), back = rounded.to(DType::f32);
        const float* a = host.data<float>();
        const float* b = back.data<float>();
        double worst = 0;
        for (int64_t h = 0; h < host.numel(); ++h)
          worst = std::max(worst, std::fabs(double(a[h]) - double(b[h])));
        if (worst > 0)
          MOE_LOG_WARN("Hugging Face export: '", hf_name, "' rounds to ", dtype_name(dtype),
                       " (the model's dtype) by up to ", worst);
        return rounded;
      });
  out.name = hf_name;
  out.expert = false;
  return out;
}

// `nt` under its HF name (a streamed expert tensor stays one: written expert by expert).
NamedTensor renamed(const std::string& hf_name, const NamedTensor& nt) {
  NamedTensor out = nt;
  out.name = hf_name;
  return out;
}

// Row r of one expert's mxfp4 matrix ([rows, nb * 17] u8: per block of 32 inputs the E8M0 scale
// byte, then ggml's 16 bytes, byte j holding input j low and input j + 16 high) as HF's row:
// nb blocks of 16 bytes (byte j holding input 2j low and 2j + 1 high) at `blocks`, nb scale bytes
// at `scales` (either may be null). The inverse of import-hf's nibble permutation: bit-exact.
void hf_mxfp4_row(const uint8_t* ours, int64_t nb, uint8_t* blocks, uint8_t* scales) {
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = ours + b * 17;
    if (scales) scales[b] = block[0];
    if (!blocks) continue;
    const uint8_t* qs = block + 1;
    auto input = [qs](int k) { return k < 16 ? qs[k] & 15 : qs[k - 16] >> 4; };
    for (int j = 0; j < 16; ++j) blocks[b * 16 + j] = uint8_t(input(2 * j) | input(2 * j + 1) << 4);
  }
}

// One expert's HF _blocks ([rows, nb, 16]) or _scales ([rows, nb]) from our mxfp4 rows: `rows_of`
// gives the [rows', nb * 17] matrices whose rows interleave (gate_up: w1 row f is HF row 2f, w3's
// 2f + 1; down: w2 alone).
Tensor hf_mxfp4(const std::vector<Tensor>& parts, int64_t nb, bool blocks) {
  const int64_t n = static_cast<int64_t>(parts.size()), rows = parts[0].dim(0);
  Tensor out = Tensor::empty(blocks ? Shape{n * rows, nb, 16} : Shape{n * rows, nb}, DType::u8);
  auto* o = static_cast<uint8_t*>(out.raw());
  const int64_t width = blocks ? nb * 16 : nb;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < n; ++p) {
      uint8_t* at = o + (r * n + p) * width;
      hf_mxfp4_row(static_cast<const uint8_t*>(parts[size_t(p)].raw()) + r * nb * 17, nb,
                   blocks ? at : nullptr, blocks ? nullptr : at);
    }
  return out;
}

// Our kept mxfp4 expert matrix `name` [E, rows, in / 32 * 17] u8, marked used.
NamedTensor mxfp4_param(ExportModel& m, const std::string& name, int64_t rows, int64_t in) {
  const NamedTensor& nt = m.param(name, {m.experts(), rows, in / 32 * 17});
  if (nt.dtype() != DType::u8)
    throw Error(str("Hugging Face export: parameter '", name, "' is ", dtype_name(nt.dtype()),
                    ", but tensor_formats names it mxfp4 (u8 blocks)"));
  return nt;
}

// The MXFP4 experts of layer `ours` as HF's _blocks and _scales under `hf`, bit-exact.
void mxfp4_expert_tensors(ExportModel& m, const std::string& ours, const std::string& hf,
                          std::vector<NamedTensor>& out) {
  const ModelConfig& mc = m.config();
  const int64_t D = mc.d_model, F = mc.d_ff, E = m.experts();
  const std::string ex = ours + "moe.experts.";
  const NamedTensor w1 = mxfp4_param(m, ex + "w1", F, D), w3 = mxfp4_param(m, ex + "w3", F, D);
  const NamedTensor w2 = mxfp4_param(m, ex + "w2", D, F);
  for (bool blocks : {true, false}) {
    const char* kind = blocks ? "_blocks" : "_scales";
    Shape gu{E, 2 * F, D / 32}, dn{E, D, F / 32};
    if (blocks) gu.push_back(16), dn.push_back(16);
    out.push_back(by_expert(str(hf, "gate_up_proj", kind), gu, DType::u8,
                            [w1, w3, D, blocks](int64_t e) {
                              return hf_mxfp4({host_expert(w1, e), host_expert(w3, e)}, D / 32,
                                              blocks);
                            }));
    out.push_back(by_expert(str(hf, "down_proj", kind), dn, DType::u8, [w2, F, blocks](int64_t e) {
      return hf_mxfp4({host_expert(w2, e)}, F / 32, blocks);
    }));
  }
}

// The experts of layer `ours` ("blocks.3.") as HF's four tensors under `hf`
// ("model.layers.3.mlp.experts."); with `mxfp4`, gate_up_proj and down_proj as their _blocks
// and _scales.
void expert_tensors(ExportModel& m, const std::string& ours, const std::string& hf,
                    const ParamFn& param, bool mxfp4, std::vector<NamedTensor>& out) {
  const ModelConfig& mc = m.config();
  const int64_t D = mc.d_model, F = mc.d_ff, E = m.experts();
  const std::string ex = ours + "moe.experts.";
  if (mxfp4) {
    mxfp4_expert_tensors(m, ours, hf, out);
  } else {
    const NamedTensor w1 = param(ex + "w1", {E, F, D}), w3 = param(ex + "w3", {E, F, D});
    const NamedTensor w2 = param(ex + "w2", {E, D, F});
    out.push_back(by_expert(hf + "gate_up_proj", {E, D, 2 * F}, mc.dtype,
                            [w1, w3, D, F](int64_t e) {
                              return gate_up(host_expert(w1, e), host_expert(w3, e), F, D);
                            }));
    out.push_back(by_expert(hf + "down_proj", {E, F, D}, mc.dtype,
                            [w2, D, F](int64_t e) { return down(host_expert(w2, e), D, F); }));
  }
  const NamedTensor b1 = param(ex + "b1", {E, F}), b3 = param(ex + "b3", {E, F});
  out.push_back(by_expert(hf + "gate_up_proj_bias", {E, 2 * F}, mc.dtype, [b1, b3, F](int64_t e) {
    return gate_up(host_expert(b1, e), host_expert(b3, e), F, 1);
  }));
  out.push_back(renamed(hf + "down_proj_bias", param(ex + "b2", {E, D})));
}

}  // namespace

NamedTensor f32_norm(const std::string& hf_name, const NamedTensor& nt) {
  NamedTensor out = map_tensor(nt, nt.shape(), DType::f32,
                               [](const Tensor& x, int64_t) { return x.to(DType::f32); });
  out.name = hf_name;
  out.expert = false;
  return out;
}

void check_gpt_oss(const ModelConfig& mc) {
  if (!mc.normalize_topk)
    throw Error(
        "Hugging Face export: HF GptOss weighs the chosen experts by a softmax over their "
        "logits (the top-k renormalised); this model does not renormalise (normalize_topk "
        "false)");
}

bool kept_mxfp4_experts(const nlohmann::json& model_config, const ModelConfig& mc) {
  const std::string q = quantization_of(model_config);
  if (q.empty()) return false;
  const char* why = q != "mxfp4" ? "only gpt-oss's MXFP4 experts have a Hugging Face form"
                                 : nullptr;
  size_t named = 0;
  for (int64_t i = 0; i < mc.layers && !why; ++i)
    for (const char* w : {"w1", "w2", "w3"}) {
      ++named;
      if (block_format_of(model_config, str("blocks.", i, ".moe.experts.", w)) != "mxfp4")
        why = "HF GptOss holds every expert matrix in MXFP4 or none";
    }
  if (!why && model_config.at(kTensorFormatsKey).size() != named)
    why = "HF GptOss holds only the expert matrices in MXFP4";
  if (why)
    throw Error(str("Hugging Face export: this checkpoint holds ", q, "-quantised weights (",
                    "tensor_formats); ", why,
                    ": export the checkpoint imported or trained before quantising"));
  return true;
}

nlohmann::ordered_json gpt_oss_config(const ModelConfig& mc, int64_t E, bool mxfp4) {
  nlohmann::ordered_json c;
  c["architectures"] = {"GptOssForCausalLM"};
  c["model_type"] = "gpt_oss";
  c["vocab_size"] = mc.vocab_size;
  c["hidden_size"] = mc.d_model;
  c["intermediate_size"] = mc.d_ff;  // each expert's width
  c["num_hidden_layers"] = mc.layers;
  c["num_attention_heads"] = mc.heads;
  c["num_key_value_heads"] = mc.kv_heads_resolved();
  c["head_dim"] = mc.head_dim_resolved();
  c["num_local_experts"] = E;
  c["num_experts_per_tok"] = mc.top_k;
  bool slides = false;
  auto types = nlohmann::ordered_json::array();
  for (int64_t i = 0; i < mc.layers; ++i) {
    slides = slides || mc.window_of(i) > 0;
    types.push_back(mc.window_of(i) > 0 ? "sliding_attention" : "full_attention");
  }
  c["layer_types"] = types;
  c["sliding_window"] = slides ? nlohmann::ordered_json(mc.sliding_window) : nullptr;
  c["hidden_act"] = "silu";  // unused by the experts (swiglu_alpha / swiglu_limit are theirs)
  c["max_position_embeddings"] = mc.seq;
  c["initializer_range"] = 0.02;
  c["rms_norm_eps"] = mc.norm_eps;
  c["use_cache"] = true;
  c["tie_word_embeddings"] = mc.tie_embeddings;
  // GptOssConfig's default is YaRN; a model without it says "default" rather than leave the key
  // out (which would turn YaRN on).
  c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", mc.rope_theta}};
  if (mc.rope_type == RopeType::yarn) {
    c["rope_parameters"] = yarn_json(mc);
    c["rope_parameters"]["truncate"] = mc.yarn.truncate;
    c["rope_parameters"]["rope_theta"] = mc.rope_theta;
  }
  c["attention_bias"] = true;
  c["attention_dropout"] = 0.0;
  c["swiglu_alpha"] = mc.swiglu_alpha;
  c["swiglu_limit"] = mc.swiglu_limit;
  c["output_router_logits"] = false;
  c["router_aux_loss_coef"] = mc.aux_loss_coef;
  c["torch_dtype"] = torch_dtype_name(mc.dtype);
  if (mxfp4)  // transformers' Mxfp4Config.to_dict, as the released checkpoints carry it
    c["quantization_config"] = {
        {"quant_method", "mxfp4"},
        {"modules_to_not_convert", {"model.layers.*.self_attn", "model.layers.*.mlp.router",
                                    "model.embed_tokens", "lm_head"}}};
  return c;
}

std::vector<NamedTensor> gpt_oss_layer_tensors(ExportModel& m, int64_t i, const ParamFn& param,
                                               bool mxfp4) {
  const ModelConfig& mc = m.config();
  const int64_t D = mc.d_model, H = mc.heads, E = m.experts();
  const int64_t KV = mc.kv_heads_resolved(), hd = mc.head_dim_resolved();
  const std::string ours = str("blocks.", i, "."), hf = str("model.layers.", i, ".");
  const std::string at = ours + "attn.", sa = hf + "self_attn.";
  std::vector<NamedTensor> out;
  out.push_back(f32_norm(hf + "input_layernorm.weight", param(ours + "norm1.weight", {D})));
  const std::pair<const char*, int64_t> projections[] = {
      {"q", H * hd}, {"k", KV * hd}, {"v", KV * hd}};
  for (const auto& [p, rows] : projections) {
    out.push_back(renamed(str(sa, p, "_proj.weight"), param(str(at, p, ".weight"), {rows, D})));
    out.push_back(renamed(str(sa, p, "_proj.bias"), param(str(at, p, ".bias"), {rows})));
  }
  out.push_back(renamed(sa + "o_proj.weight", param(at + "o.weight", {D, H * hd})));
  out.push_back(renamed(sa + "o_proj.bias", param(at + "o.bias", {D})));
  const NamedTensor& sinks = m.param(at + "sinks", {H});  // f32 whatever the model's dtype
  if (sinks.dtype() != DType::f32)
    throw Error(str("Hugging Face export: parameter '", sinks.name, "' is ",
                    dtype_name(sinks.dtype()), ", expected f32"));
  out.push_back(sinks_in(sa + "sinks", sinks, mc.dtype));
  const std::string mlp = hf + "mlp.";
  const NamedTensor& router = m.router_weight(ours, E, D);
  if (router.dtype() != mc.dtype)
    throw Error(str("Hugging Face export: parameter '", router.name, "' is ",
                    dtype_name(router.dtype()), ", but the model's dtype is ",
                    dtype_name(mc.dtype)));
  out.push_back(renamed(mlp + "router.weight", router));
  out.push_back(renamed(mlp + "router.bias", param(ours + "moe.router.logit_bias", {E})));
  expert_tensors(m, ours, mlp + "experts.", param, mxfp4, out);
  out.push_back(
      f32_norm(hf + "post_attention_layernorm.weight", param(ours + "norm2.weight", {D})));
  return out;
}

}  // namespace moe::io::hf
