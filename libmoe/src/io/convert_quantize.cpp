// Quantisation of a checkpoint's weight matrices, to our Q8_0 rows or llama.cpp's block formats
// (see moe/io/convert.h, quantize).
// Shapes: rows = the product of a weight's leading dimensions (E x out for experts), in its last.
#include <algorithm>
#include <cmath>
#include <map>

#include "backend/cpu/gemv.h"
#include "backend/cpu/quant_blocks.h"
#include "io/convert_internal.h"
#include "moe/io/convert.h"
#include "moe/settings.h"

namespace moe::io {

bool quantizable(const std::string& name, const Shape& shape) {
  // Weights by name: Linear's ".weight", the experts' and dense MLP's ".w1/.w2/.w3"; never their
  // biases (".b1", ".bias": read by the bias ops in f32), even when 2-D ([E, F] per expert).
  const auto ends = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return shape.size() >= 2 && (ends(".weight") || ends(".w1") || ends(".w2") || ends(".w3")) &&
         name.rfind("embed.", 0) != 0 && name.find(".router.") == std::string::npos;
}

namespace {

const char* const kBlockRecipes[] = {"q4_k", "q6_k", "mxfp4", "q4_k_m"};

// The recipes moe-convert quantize makes.
bool is_block_recipe(const std::string& recipe) {
  for (const char* r : kBlockRecipes)
    if (recipe == r) return true;
  return false;
}

// The recipes a block checkpoint may carry: quantize's, and import-gguf's "mixed" (a GGUF file's
// own mix, e.g. llama.cpp's Q4_K_M of an 8-expert model, which adds q8_0 blocks).
bool holds_blocks(const std::string& recipe) {
  return is_block_recipe(recipe) || recipe == kMixedRecipe;
}

bool is_tensor_format(const nlohmann::json& format) {
  return format.is_string() &&
         (format == "q4_k" || format == "q6_k" || format == "mxfp4" || format == "q8_0");
}

}  // namespace

std::string quantization_of(const nlohmann::json& model_config) {
  if (!model_config.is_object() || !model_config.contains(kQuantizationKey)) return "";
  const nlohmann::json& q = model_config.at(kQuantizationKey);
  const std::string recipe = q.is_string() ? q.get<std::string>() : "";
  MOE_CHECK(recipe == "q8_0" || holds_blocks(recipe), "model config: '", kQuantizationKey, "' is ",
            q.dump(), "; this build reads q8_0, q4_k, q6_k, mxfp4, q4_k_m and mixed");
  if (recipe == "q8_0") return recipe;
  const auto formats = model_config.find(kTensorFormatsKey);
  MOE_CHECK(formats != model_config.end() && formats->is_object(), "model config: a ", recipe,
            " checkpoint needs a '", kTensorFormatsKey, "' object (tensor name -> block format)");
  for (const auto& [name, format] : formats->items())
    MOE_CHECK(is_tensor_format(format), "model config: '", kTensorFormatsKey, "' gives tensor '",
              name, "' the format ", format.dump(), " (q4_k, q6_k, mxfp4 or q8_0)");
  return recipe;
}

void refuse_quantized(const nlohmann::json& model_config, const std::string& source,
                      const std::string& who) {
  const std::string q = quantization_of(model_config);
  MOE_CHECK(q.empty(), "'", source, "' is a ", q,
            "-quantised checkpoint (moe-convert quantize): ", who,
            " cannot use it (only moe-infer and moe-profile record read one); give it the "
            "checkpoint that was quantised");
}

std::string block_format_of(const nlohmann::json& model_config, const std::string& name) {
  if (!holds_blocks(quantization_of(model_config))) return "";  // validates tensor_formats
  const nlohmann::json& formats = model_config.at(kTensorFormatsKey);
  const auto it = formats.find(name);
  return it == formats.end() ? "" : it->get<std::string>();
}

namespace {

// Q8_0 rows of the f32 values `exact` [.., in] (a whole tensor or one expert's slice); the
// largest |x - dequantised| / scale goes into *worst.
Tensor quantize_rows(const Tensor& exact, const std::string& name, double* worst) {
  const int64_t in_dim = exact.shape().back(), rows = exact.numel() / in_dim;
  const int64_t row_bytes = cpu::q8_row_bytes(in_dim);
  Shape shape = exact.shape();
  shape.back() = row_bytes;
  Tensor q = Tensor::empty(shape, DType::u8);
  const float* x = exact.data<float>();
  uint8_t* bytes = q.data<uint8_t>();
  double err = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const float* xr = x + row * in_dim;
    uint8_t* qr = bytes + row * row_bytes;
    try {
      cpu::quantize_q8_0_row(xr, in_dim, qr);
    } catch (const Error& e) {
      throw Error(str("tensor '", name, "', row ", row, ": ", e.what()));
    }
    for (int64_t j = 0; j < in_dim; ++j) {
      const float scale = cpu::q8_scale(qr, in_dim, j / cpu::kQ8Block);
      const float deq = scale * static_cast<float>(static_cast<int8_t>(qr[j]));
      if (scale > 0) err = std::max(err, std::fabs(double(xr[j]) - deq) / scale);
    }
  }
  if (worst) *worst = std::max(*worst, err);
  return q;
}

// llama.cpp's use_more_bits: the layers Q4_K_M gives more bits (first and last eighth, every
// third in between).
bool more_bits(int64_t layer, int64_t layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The block format recipe `recipe` gives tensor `name`. mxfp4 is llama.cpp's MOSTLY_MXFP4_MOE
// (llama_tensor_get_type): the routed experts' matrices in MXFP4, every other quantised matrix
// (attention, dense MLPs, shared experts, an untied LM head) in GGUF's Q8_0 blocks, as gpt-oss
// ships only its experts in MXFP4.
cpu::BlockFormat recipe_format(const std::string& recipe, const std::string& name, int64_t layers) {
  if (recipe == "mxfp4")
    return name.find(".moe.experts.") != std::string::npos ? cpu::BlockFormat::mxfp4
                                                           : cpu::BlockFormat::q8_0;
  if (recipe != "q4_k_m") return cpu::parse_block_format(recipe);
  if (name == "lm_head.weight") return cpu::BlockFormat::q6_k;
  const bool v_or_down = ends_with(name, ".attn.v.weight") || ends_with(name, ".w2");
  const int64_t layer = block_of_name(name);
  return v_or_down && layer >= 0 && more_bits(layer, layers) ? cpu::BlockFormat::q6_k
                                                             : cpu::BlockFormat::q4_k;
}

// Rows of `exact` [.., in] in `format`; the squared errors and values are added to the report.
// Rows are quantised in parallel (llama.cpp's reference search is a few hundred operations a
// value); each row's sums are kept apart and added in row order, so the report does not depend
// on the thread count, and the first failing row (in row order) is the one named.
Tensor quantize_block_rows(const Tensor& exact, cpu::BlockFormat format, const std::string& name,
                           QuantReport* report) {
  const int64_t in = exact.shape().back(), rows = exact.numel() / in;
  const int64_t row_bytes = cpu::block_row_bytes(format, in);
  Shape shape = exact.shape();
  shape.back() = row_bytes;
  Tensor q = Tensor::empty(shape, DType::u8);
  std::vector<double> row_err(static_cast<size_t>(rows)), row_val(static_cast<size_t>(rows));
  std::vector<std::string> failure(static_cast<size_t>(rows));
#pragma omp parallel
  {
    std::vector<float> back(static_cast<size_t>(in));
#pragma omp for schedule(dynamic, 16)
    for (int64_t row = 0; row < rows; ++row) {
      const float* x = exact.data<float>() + row * in;
      uint8_t* qr = q.data<uint8_t>() + row * row_bytes;
      try {
        cpu::quantize_row(format, x, in, qr);
      } catch (const Error& e) {
        failure[static_cast<size_t>(row)] = e.what();
        continue;
      }
      cpu::dequantize_row(format, qr, in, back.data());
      double err = 0, val = 0;
      for (int64_t j = 0; j < in; ++j) {
        const double d = double(x[j]) - back[static_cast<size_t>(j)];
        err += d * d;
        val += double(x[j]) * x[j];
      }
      row_err[static_cast<size_t>(row)] = err;
      row_val[static_cast<size_t>(row)] = val;
    }
  }
  double err = 0, val = 0;
  for (int64_t row = 0; row < rows; ++row) {
    if (!failure[static_cast<size_t>(row)].empty())
      throw Error(str("tensor '", name, "', row ", row, ": ", failure[static_cast<size_t>(row)]));
    err += row_err[static_cast<size_t>(row)];
    val += row_val[static_cast<size_t>(row)];
  }
  if (report) {
    report->error_sum_squares += err;
    report->value_sum_squares += val;
  }
  return q;
}

}  // namespace

Checkpoint quantize(const Checkpoint& in, const std::string& type, QuantReport* report) {
  MOE_USAGE_CHECK(type == "q8_0" || is_block_recipe(type), flag_for(Setting::quant_type),
                  " must be q8_0, q4_k, q6_k, mxfp4 or q4_k_m (got '", type, "')");
  MOE_USAGE_CHECK(quantization_of(in.model_config).empty(), "the checkpoint is already quantised (",
                  quantization_of(in.model_config), "): quantise the checkpoint it came from");
  MOE_USAGE_CHECK(in.sharding.rank < 0,
                  "quantize needs a whole checkpoint; this is one rank's shard: merge it first");
  std::map<std::string, const NamedTensor*> masters;  // the exact values of 16-bit parameters
  for (const NamedTensor& nt : in.optim)
    if (nt.name.rfind("master.", 0) == 0) masters[nt.name.substr(7)] = &nt;
  QuantReport local;
  QuantReport& r = report ? *report : local;
  r = QuantReport{};
  double* worst = report ? &report->max_error_over_scale : nullptr;
  const bool blocks = type != "q8_0";
  const int64_t layers = in.model_config.value("layers", int64_t(0));
  Checkpoint out = freeze(in);
  out.model_config[kQuantizationKey] = type;
  nlohmann::json formats = nlohmann::json::object();
  for (NamedTensor& nt : out.params) {
    const int64_t bytes = shape_numel(nt.shape()) * static_cast<int64_t>(dtype_size(nt.dtype()));
    r.bytes_before += bytes;
    const Shape& s = nt.shape();
    // A single row (Qwen2-MoE's shared-expert gate) is a vector in all but shape: kept.
    const bool wanted = quantizable(nt.name, s) && is_floating(nt.dtype()) &&
                        (!blocks || s[s.size() - 2] > 1);
    const cpu::BlockFormat format =
        blocks ? recipe_format(type, nt.name, layers) : cpu::BlockFormat::q8_0;
    if (!wanted || (blocks && s.back() % cpu::block_elems(format) != 0)) {
      r.tensors_kept += wanted;
      r.bytes_after += bytes;
      continue;
    }
    auto m = masters.find(nt.name);
    const bool use_master = m != masters.end() && m->second->shape() == nt.shape();
    const NamedTensor exact = exact_values(nt, use_master ? m->second : nullptr);
    Shape shape = nt.shape();
    shape.back() = blocks ? cpu::block_row_bytes(format, shape.back())
                          : cpu::q8_row_bytes(shape.back());
    const std::string name = nt.name;
    if (blocks) {
      nt = map_tensor(exact, shape, DType::u8, [name, format, report](const Tensor& x, int64_t) {
        return quantize_block_rows(x, format, name, report);
      });
      formats[name] = cpu::block_format_name(format);
    } else {
      nt = map_tensor(exact, shape, DType::u8, [name, worst](const Tensor& x, int64_t) {
        return quantize_rows(x, name, worst);
      });
    }
    nt.name = name;
    r.bytes_after += shape_numel(shape);
    ++r.tensors_quantized;
    ++r.tensors_per_format[blocks ? cpu::block_format_name(format) : "q8_0"];
  }
  if (blocks) out.model_config[kTensorFormatsKey] = formats;
  return out;
}

}  // namespace moe::io
