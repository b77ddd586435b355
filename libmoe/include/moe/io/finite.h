// Non-finite values (NaN, +-Inf) in parameters are garbage that no reader accepts and no writer
// saves: a model holding one scores "ppl": null and trains to all-NaN. Checked by the checkpoint
// and model loaders, by import-hf, and by the trainer after every step and before every save.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/tensor.h"

namespace moe::io {

// The first element of a CPU tensor that is NaN or infinite (f32, bf16, f16), or -1 (also for
// integer dtypes, which cannot hold one, and for empty tensors).
int64_t first_non_finite(const Tensor& tensor);

// Parameters that have exploded: a magnitude of 2^32 or more. Its fourth power overflows float32
// (about 2^128): a weight that size applied to activations that such weights already made, then
// squared by the next norm, is infinite, and the activations turn NaN (seen: --lr 1e12 for one
// step leaves weights of 3e10 and every score NaN, though every value is finite). No trained
// model comes within orders of magnitude of it (f16 cannot even hold it).
// The first element of a CPU tensor that is NaN, infinite or of magnitude >= 2^32, or -1 (f16:
// only NaN and Inf).
int64_t first_exploded(const Tensor& tensor);

// "NaN", "inf" or "-inf": what element `index` of `tensor` is.
std::string non_finite_name(const Tensor& tensor, int64_t index);

// Throws moe::Error "<where>: tensor '<name>' holds a non-finite value (NaN at element 12 of
// 4x8)" for the first such tensor. `where` names the file (or step) the tensor comes from.
void check_finite(const std::string& where, const std::string& name, const Tensor& tensor);
// check_finite, and then "<where>: tensor '<name>' holds 3.2e+28 at element 5 of [4,8]: a weight
// of 2^32 or more has exploded ..." for an exploded value (first_exploded).
void check_not_exploded(const std::string& where, const std::string& name, const Tensor& tensor);
// Streamed tensors (NamedTensor::source) are read and checked one expert at a time.
void check_finite(const std::string& where, const std::vector<NamedTensor>& tensors);
// The same check made when each tensor is read: a held tensor is checked now, a streamed or
// deferred one is returned behind a source that checks what it reads (so a conversion of a lazily
// opened checkpoint fails, naming the tensor, when it reaches the value).
void check_finite_when_read(const std::string& where, std::vector<NamedTensor>& tensors);
// The same check of expert e's slice of a tensor of `whole` shape [E, ...rest], with the
// message the whole tensor would give (the element's index in the whole tensor). `slice` may be a
// part of the expert's slice, starting at its element `offset` (the gate half of a fused expert).
void check_finite_expert(const std::string& where, const std::string& name, const Tensor& slice,
                         int64_t expert, const Shape& whole, int64_t offset = 0);

}  // namespace moe::io
