// gpt-oss in Hugging Face form, as transformers 5.25 saves GptOssForCausalLM, for export-hf
// (io/hf_export.cpp): its config.json and each layer's tensors built from ours. Private to libmoe.
// Shape letters: D hidden size, F expert hidden width, E experts of a layer, H query heads.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/export_model.h"
#include "moe/io/checkpoint.h"
#include "moe/models/config.h"

namespace moe::io::hf {

// hf_export.cpp's helpers the gpt-oss part shares: YaRN's settings under transformers' keys (null
// without RoPE scaling), and config.json's torch_dtype of a storage dtype.
nlohmann::ordered_json yarn_json(const ModelConfig& mc);
const char* torch_dtype_name(DType dtype);

// Refuses a gpt_oss model GptOssForCausalLM would run otherwise (a top-k it does not renormalise).
void check_gpt_oss(const ModelConfig& mc);
// Whether a gpt_oss checkpoint (`model_config` its JSON) keeps its experts as MXFP4 blocks
// (quantization "mxfp4", import-hf --keep-mxfp4 or import-gguf): true when tensor_formats names
// every layer's w1, w2 and w3 "mxfp4" and nothing else; another quantisation or mix is refused
// by name.
bool kept_mxfp4_experts(const nlohmann::json& model_config, const ModelConfig& mc);
// config.json with GptOssConfig's keys: rope_parameters (rope_theta inside), layer_types from the
// model's windowed layers, sliding_window (null when no layer slides), swiglu_alpha/limit; with
// `mxfp4` the released checkpoints' quantization_config.
nlohmann::ordered_json gpt_oss_config(const ModelConfig& mc, int64_t E, bool mxfp4);

// `nt` (a norm weight) as the F32 tensor `hf_name` whatever the model's dtype: transformers keeps
// gpt-oss's norms in fp32 (_keep_in_fp32_modules) and saves them so; exact from bf16 or f16.
NamedTensor f32_norm(const std::string& hf_name, const NamedTensor& nt);

// `param(name, shape)`: one of our params, marked used, in the model's dtype (checked).
using ParamFn = std::function<const NamedTensor&(const std::string&, const Shape&)>;
// Layer `i`'s HF tensors (input_layernorm to post_attention_layernorm) in transformers' order:
// norms in F32 (as _keep_in_fp32_modules saves them), the sinks in the model's dtype, and the
// experts as transformers holds them ([E, D, 2F] gate_up_proj, gate and up columns interleaved;
// [E, F, D] down_proj), built one expert at a time when written; with `mxfp4` (kept blocks) those
// two as the released checkpoints' _blocks [E, rows, in/32, 16] and _scales [E, rows, in/32]
// (rows the output features, gate_up's interleaved), bit-exact.
std::vector<NamedTensor> gpt_oss_layer_tensors(ExportModel& m, int64_t i, const ParamFn& param,
                                               bool mxfp4);

}  // namespace moe::io::hf
