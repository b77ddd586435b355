// DeepSeek-V3's latent attention in Hugging Face form against ours (nn/mla.h): which rows of
// which HF tensor each of our params is. Ours hold each head's q RoPE features first and in
// rotate-half order, split kv_a_proj_with_mqa into kv_a and k_rope, and kv_b_proj into k_b and
// v_b; import picks the rows, export puts them back. Private to libmoe (hf_checkpoint.cpp,
// hf_export.cpp).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "io/hf_names.h"
#include "moe/io/checkpoint.h"
#include "moe/models/config.h"
#include "moe/tensor.h"

namespace moe::io::hf {

// Our param `our` (its name after "blocks.<i>.") is rows `rows` of the HF tensor of `slot`, in
// that order; every row of each HF tensor belongs to exactly one part.
struct MlaPart {
  std::string our;
  Slot slot;
  std::vector<int64_t> rows;
};

// In our parameter order. interleaved: the HF RoPE rows hold pairs (2i, 2i+1) (rope_interleave,
// DeepSeek's own layout); else halves, as ours.
std::vector<MlaPart> mla_parts(const ModelConfig& mc, bool interleaved);
// The HF shape of a latent-attention slot (and of q / o), with the words for a mismatch.
Shape mla_hf_shape(const ModelConfig& mc, Slot slot, std::string& why);
// Rows `rows` of t ([R, ...], on the host), in order, as a new tensor of t's dtype.
Tensor pick_rows(const Tensor& t, const std::vector<int64_t>& rows);

// The HF tensors of block `ours` ("blocks.3.")'s latent attention, named under `hf`
// ("model.layers.3.self_attn."), in transformers' order, each assembled when written from our
// params' rows (rope_interleave true: DeepSeek's layout). `param(name, shape)` gives (and marks
// used) one of our params.
std::vector<NamedTensor> mla_hf_tensors(
    const ModelConfig& mc, const std::string& ours, const std::string& hf,
    const std::function<const NamedTensor&(const std::string&, const Shape&)>& param);

}  // namespace moe::io::hf
