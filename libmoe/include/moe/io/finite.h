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

// "NaN", "inf" or "-inf": what element `index` of `tensor` is.
std::string non_finite_name(const Tensor& tensor, int64_t index);

// Throws moe::Error "<where>: tensor '<name>' holds a non-finite value (NaN at element 12 of
// 4x8)" for the first such tensor. `where` names the file (or step) the tensor comes from.
void check_finite(const std::string& where, const std::string& name, const Tensor& tensor);
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
