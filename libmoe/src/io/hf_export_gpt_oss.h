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
// config.json with GptOssConfig's keys: rope_parameters (rope_theta inside), layer_types from the
// model's windowed layers, sliding_window (null when no layer slides), swiglu_alpha/limit.
nlohmann::ordered_json gpt_oss_config(const ModelConfig& mc, int64_t E);

// `nt` (a norm weight) as the F32 tensor `hf_name` whatever the model's dtype: transformers keeps
// gpt-oss's norms in fp32 (_keep_in_fp32_modules) and saves them so; exact from bf16 or f16.
NamedTensor f32_norm(const std::string& hf_name, const NamedTensor& nt);

// `param(name, shape)`: one of our params, marked used, in the model's dtype (checked).
using ParamFn = std::function<const NamedTensor&(const std::string&, const Shape&)>;
// Layer `i`'s HF tensors (input_layernorm to post_attention_layernorm) in transformers' order:
// norms in F32 (as _keep_in_fp32_modules saves them), the sinks in the model's dtype, and the
// experts as transformers holds them ([E, D, 2F] gate_up_proj, gate and up columns interleaved;
// [E, F, D] down_proj), built one expert at a time when written.
std::vector<NamedTensor> gpt_oss_layer_tensors(ExportModel& m, int64_t i, const ParamFn& param);

}  // namespace moe::io::hf
