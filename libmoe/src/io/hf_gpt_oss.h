// gpt-oss's experts in Hugging Face form against ours. transformers' GptOssExperts holds a layer's
// experts as gate_up_proj [E, D, 2F] (x @ W: gate = columns ::2, up = columns 1::2),
// gate_up_proj_bias [E, 2F] (interleaved the same way), down_proj [E, F, D] (a @ W) and
// down_proj_bias [E, D]. The released checkpoints hold gate_up_proj / down_proj as MXFP4 instead
// (transformers' integrations/mxfp4.py): _blocks U8 [E, rows, in/32, 16] and _scales U8
// [E, rows, in/32], rows the output features as in nn.Linear (gate_up's interleaved: row 2i is
// gate i, 2i+1 up i), 32 inputs a block, byte j of a block holding input 2j in its low nibble and
// 2j+1 in its high one, each value E2M1 (0, .5, 1, 1.5, 2, 3, 4, 6, sign in bit 3) times
// 2^(scale - 127). Ours: w1, w3 [E, F, D], w2 [E, D, F], b1, b3 [E, F], b2 [E, D].
// Private to libmoe (hf_checkpoint.cpp).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "io/hf_names.h"
#include "io/hf_sources.h"
#include "moe/tensor.h"

namespace moe::io::hf {

// One expert param of a layer, read one expert at a time: read(s, e) gives expert e's slice
// [1, ...] in `dtype` (the storage dtype, checked finite; or u8 rows of our mxfp4 blocks).
struct ExpertPart {
  std::string our;  // "blocks.3.moe.experts.w1"
  Shape shape;      // [E, ...]
  std::function<Tensor(const Sources&, int64_t)> read;
  DType dtype = DType::f32;
  bool mxfp4 = false;  // u8 [E, rows, in / 32 * 17]: our (ggml's) mxfp4 blocks
};

// The expert params (w1, w2, w3, b1, b2, b3) of the gpt-oss layer under `prefix` ("blocks.3.")
// from the tensors `single` names (dense, or MXFP4 dequantised exactly), their shapes checked
// against config.json's E, D, F; one line per source tensor goes to `mapped`. `target`: the
// storage dtype (MXFP4 values are exact in f32 and bf16 only: f16 is refused). keep_mxfp4: MXFP4
// matrices kept as our mxfp4 blocks (mxfp4_blocks) instead.
std::vector<ExpertPart> gpt_oss_experts(const Sources& s, const std::map<Slot, std::string>& single,
                                        const std::string& prefix, int64_t E, int64_t D, int64_t F,
                                        DType target, bool keep_mxfp4,
                                        std::vector<std::string>& mapped);

// Rows first, first + step, ... of one expert's MXFP4 weight (blocks [1, R, in/32, 16], scales
// [1, R, in/32]) as f32 [R', in], exactly. `what` names the tensor and expert in the error a scale
// of 0xFF (E8M0's NaN) gets.
Tensor mxfp4_rows(const Tensor& blocks, const Tensor& scales, int64_t first, int64_t step,
                  const std::string& what);

// The same rows as our mxfp4 blocks (llama.cpp's block_mxfp4), u8 [R', in / 32 * 17], bit-exact:
// each block the scale byte, then 16 bytes whose byte j holds element j in its low nibble and
// element j + 16 in its high one (HF's: elements 2j and 2j + 1).
Tensor mxfp4_blocks(const Tensor& blocks, const Tensor& scales, int64_t first, int64_t step,
                    const std::string& what);

// Whether every value of the F32 tensors `names` is exact in `dtype` (F32 norms in a bf16
// checkpoint, as transformers' save_pretrained keeps gpt-oss's _keep_in_fp32_modules).
bool exact_in(const Sources& s, const std::vector<std::string>& names, DType dtype);

}  // namespace moe::io::hf
