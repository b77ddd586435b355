// The checkpoint checks of the inference expert stores, and their quantised experts
// (offload/checkpoint_experts.h).
#include "offload/checkpoint_experts.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/gemv.h"
#include "backend/cpu/quant_blocks.h"
#include "io/gguf_blocks.h"
#include "moe/error.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "moe/io/finite.h"
#include "moe/io/hdf5.h"

namespace moe::offload {

Shape ExpertFormat::held_shape(const Shape& one) const {
  if (!quantised()) return one;
  Shape held = one;
  held.back() = held_row_bytes;
  return held;
}

ExpertFormat expert_format(const nlohmann::json& model_config, const std::string& path,
                           const std::string& name, const Shape& shape) {
  ExpertFormat f;
  const std::string block = io::block_format_of(model_config, name);
  const bool q8_recipe =
      block.empty() && io::quantization_of(model_config) == "q8_0" && io::quantizable(name, shape);
  if (block.empty() && !q8_recipe) return f;
  f.in = shape.back();
  f.name = q8_recipe ? "q8_0" : block;
  if (f.name == "q8_0") {
    f.kind = q8_recipe ? ExpertFormat::Kind::q8_rows : ExpertFormat::Kind::q8_blocks;
    MOE_CHECK(q8_recipe || f.in % io::kQ8Block == 0, "checkpoint '", path, "': '", name, "' ",
              shape_str(shape), " is listed as q8_0, but its rows of ", f.in,
              " elements are not whole blocks of ", io::kQ8Block);
    f.held = DType::q8_0;
    f.stored_row_bytes = cpu::q8_row_bytes(f.in);
    f.held_row_bytes = cpu::q8_group_row_bytes(f.in);
    return f;
  }
  f.kind = ExpertFormat::Kind::blocks;
  const cpu::BlockFormat format = cpu::parse_block_format(block);
  MOE_CHECK(f.in % cpu::block_elems(format) == 0, "checkpoint '", path, "': '", name, "' ",
            shape_str(shape), " is listed as ", block, ", but its rows of ", f.in,
            " elements are not whole blocks of ", cpu::block_elems(format));
  f.held = cpu::dtype_of_block_format(format);
  f.stored_row_bytes = f.held_row_bytes = cpu::block_row_bytes(format, f.in);
  return f;
}

void check_expert_tensors(const std::string& path,
                          const std::vector<std::pair<std::string, Shape>>& tensors,
                          const std::vector<ExpertFormat>& formats, const std::string& feature) {
  (void)io::list_params(path);  // checks the format and version
  io::h5::Session session;
  io::h5::Where root{path, "/"};
  io::h5::File file = io::h5::open_file_readonly(path, "checkpoint");
  io::h5::Group group = io::h5::open_group(file, "params", root);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, shape] = tensors[i];
    const ExpertFormat& format = formats.at(i);
    MOE_CHECK(io::h5::has_link(group, name, root.at("/params")), "checkpoint '", path,
              "' does not match the model: no tensor '", name, "'");
    io::h5::Where w = root.at("/params/" + name);
    io::h5::Dataset dataset(MOE_H5(w, H5Dopen2(group, name.c_str(), H5P_DEFAULT)));
    const io::h5::DatasetInfo info = io::h5::dataset_info(dataset, w);
    Shape stored = shape;
    if (format.quantised()) stored.back() = format.stored_row_bytes;
    MOE_CHECK(info.shape == stored, "checkpoint '", path, "' does not match the model: '", name,
              "' is ", shape_str(info.shape), ", the model's is ", shape_str(stored),
              format.quantised() ? str(" (", format.name, " rows)") : std::string());
    MOE_CHECK(info.expert, "checkpoint '", path, "': '", name,
              "' is not stored as an expert tensor (one chunk per expert)");
    const bool served = format.quantised() ? info.dtype == DType::u8 : is_floating(info.dtype);
    MOE_CHECK(served, "checkpoint '", path, "': '", name, "' is ", dtype_name(info.dtype),
              format.quantised() ? str(", not ", format.name, " rows (u8)")
                                 : str("; the ", feature,
                                       " serves floating-point and quantised "
                                       "(moe-convert quantize) experts"));
  }
}

void check_block_scales(cpu::BlockFormat format, const uint8_t* data, int64_t rows,
                        int64_t row_bytes, int64_t in, const std::string& what,
                        const std::string& rule) {
  const bool q8 = format == cpu::BlockFormat::q8_0;
  const int64_t blocks = q8 ? cpu::q8_blocks(in) : in / cpu::block_elems(format);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* r = data + row * row_bytes;
      float second = 0;
      const float scale = q8 ? cpu::q8_scale(r, in, b)
                             : cpu::block_scale(format, r + b * cpu::block_bytes(format), &second);
      const bool bad_first = !std::isfinite(scale) || (q8 && scale < 0);
      MOE_CHECK(!bad_first && std::isfinite(second), what, " row ", row, " block ", b,
                " has scale ", bad_first ? scale : second, " (", rule, "): the file is damaged");
    }
}

void put_expert(const ExpertFormat& format, const Tensor& chunk, Tensor& into,
                const std::string& path, const std::string& name, int64_t index) {
  const std::string what = str("checkpoint '", path, "': expert ", index, " of '", name, "'");
  if (!format.quantised()) {
    MOE_CHECK(chunk.numel() == into.numel() && is_floating(chunk.dtype()), what, " is ",
              chunk.describe(), ", the model expects ", into.numel(), " floating-point elements");
    io::check_finite(str("checkpoint '", path, "'"), str(name, " (expert ", index, ")"), chunk);
    into.copy_from(chunk.reshape(into.shape()));
    return;
  }
  const int64_t out = into.numel() / format.held_row_bytes;
  MOE_CHECK(chunk.dtype() == DType::u8 && chunk.numel() == out * format.stored_row_bytes, what,
            " is ", chunk.describe(), ", the model expects ", out, " ", format.name, " rows of ",
            format.stored_row_bytes, " bytes");
  const uint8_t* bytes = chunk.data<uint8_t>();
  std::vector<uint8_t> rows;
  if (format.kind == ExpertFormat::Kind::q8_blocks) {  // GGUF's blocks: our rows first
    rows = io::q8_blocks_to_rows(what, bytes, out, format.in);
    bytes = rows.data();
  }
  const bool q8 = format.held == DType::q8_0;
  check_block_scales(q8 ? cpu::BlockFormat::q8_0 : cpu::parse_block_format(format.name), bytes, out,
                     format.stored_row_bytes, format.in, what,
                     str("a ", format.name, " block's scales are finite", q8 ? " and >= 0" : ""));
  auto* held = static_cast<uint8_t*>(into.raw());
  if (format.held == DType::q8_0)
    cpu::pack_q8_0(bytes, out, format.in, held);
  else
    std::memcpy(held, bytes, static_cast<size_t>(out * format.stored_row_bytes));
}

}  // namespace moe::offload
