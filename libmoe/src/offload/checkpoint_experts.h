// What the inference expert stores (the ring, the serving cache) check of a checkpoint before they
// serve its experts, and how they hold a quantised model's experts: private to offload/.
//
// A quantised checkpoint (moe-convert quantize, import-gguf) stores an expert matrix [E, out, in]
// as u8 rows [E, out, row bytes]. The stores hold it as the resident model does once loaded
// (infer::load_model), so that the same block kernels read the same bytes: Q8_0 rows packed into
// the kernels' row groups (DType::q8_0), GGUF q8_0 blocks turned into those rows first, and
// q4_k / q6_k / mxfp4 blocks as they are. One expert's bytes held are then its bytes stored
// (up to Q8_0's padding of a row to pairs of blocks), which is what a budget counts.
//
// check_block_scales is also infer::load_model's check of a quantised weight's scales (one check
// of a damaged scale for the resident model and the stores).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/quant_blocks.h"
#include "moe/tensor.h"

namespace moe::offload {

// How one expert tensor of a checkpoint is stored and held.
struct ExpertFormat {
  enum class Kind { floating, q8_rows, q8_blocks, blocks };
  Kind kind = Kind::floating;
  std::string name;              // quantised: "q8_0", "q4_k", "q6_k" or "mxfp4"
  DType held = DType::f32;       // quantised: the dtype the kernels read (floating: the store's)
  int64_t in = 0;                // quantised: elements of a row
  int64_t stored_row_bytes = 0;  // quantised: a row's bytes in the file
  int64_t held_row_bytes = 0;    // quantised: a row's bytes as held
  bool quantised() const { return kind != Kind::floating; }
  // One expert as held: [1, out, held_row_bytes] from the model's [.., out, in].
  Shape held_shape(const Shape& one) const;
};

// The format of expert tensor `name` (the model's shape [E, out, in] or a bias [E, n]) in a
// checkpoint whose model_config is `model_config` (the rules of infer::load_model). Throws
// moe::Error naming `path` when a quantised tensor's rows are not whole blocks.
ExpertFormat expert_format(const nlohmann::json& model_config, const std::string& path,
                           const std::string& name, const Shape& shape);

// Opens `path` once and checks that it holds every (name, shape) of `tensors` in /params as an
// expert tensor (one chunk per expert): a floating-point one of exactly that shape, or, where
// formats[i] is quantised, u8 rows of that format; throws moe::Error naming the checkpoint and the
// tensor otherwise ("... does not match the model: no tensor 'X'", "... 'X' is [4,8], the model's
// is [4,16]"), naming `feature` ("expert ring", "expert cache") for a dtype it cannot serve.
void check_expert_tensors(const std::string& path,
                          const std::vector<std::pair<std::string, Shape>>& tensors,
                          const std::vector<ExpertFormat>& formats, const std::string& feature);

// Every block scale of `rows` quantised rows of `in` elements, row r at data + r * row_bytes,
// checked before a kernel reads them (a damaged scale would score garbage silently): Q8_0 rows
// (format q8_0: our row layout, cpu::q8_scale) finite and >= 0, blocks of another format
// (cpu::block_scale, its second scale too) finite. Throws moe::Error
//   "<what> row R block B has scale S (<rule>): the file is damaged".
void check_block_scales(cpu::BlockFormat format, const uint8_t* data, int64_t rows,
                        int64_t row_bytes, int64_t in, const std::string& what,
                        const std::string& rule);

// Expert `index` of tensor `name` as read (io::read_expert: a floating [..] or u8 [out, row bytes]
// chunk) into `into`, one expert as held: checked as the resident loader checks it (finite values,
// finite block scales), converted (floating) or packed (Q8_0). Throws moe::Error naming the
// checkpoint, the tensor and the expert.
void put_expert(const ExpertFormat& format, const Tensor& chunk, Tensor& into,
                const std::string& path, const std::string& name, int64_t index);

}  // namespace moe::offload
