// Q8_0 quantisation of a checkpoint's weight matrices (see moe/io/convert.h, quantize).
// Shapes: rows = the product of a weight's leading dimensions (E x out for experts), in its last.
#include <algorithm>
#include <cmath>
#include <map>

#include "io/convert_internal.h"

#include "backend/cpu/gemv.h"
#include "moe/io/convert.h"

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

std::string quantization_of(const nlohmann::json& model_config) {
  if (!model_config.is_object() || !model_config.contains(kQuantizationKey)) return "";
  const nlohmann::json& q = model_config.at(kQuantizationKey);
  MOE_CHECK(q.is_string() && q.get<std::string>() == "q8_0", "model config: '", kQuantizationKey,
            "' is ", q.dump(), "; this build reads \"q8_0\" only");
  return q.get<std::string>();
}

void refuse_quantized(const nlohmann::json& model_config, const std::string& source,
                      const std::string& who) {
  const std::string q = quantization_of(model_config);
  MOE_CHECK(q.empty(), "'", source, "' is a ", q,
            "-quantised checkpoint (moe-convert quantize): ", who,
            " cannot use it (only moe-infer and moe-profile record read one); give it the "
            "checkpoint that was quantised");
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

}  // namespace

Checkpoint quantize(const Checkpoint& in, const std::string& type, QuantReport* report) {
  MOE_USAGE_CHECK(type == "q8_0", "--type must be q8_0 (got '", type, "')");
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
  Checkpoint out = freeze(in);
  out.model_config[kQuantizationKey] = type;
  for (NamedTensor& nt : out.params) {
    const int64_t bytes = shape_numel(nt.shape()) * static_cast<int64_t>(dtype_size(nt.dtype()));
    r.bytes_before += bytes;
    if (!quantizable(nt.name, nt.shape()) || !is_floating(nt.dtype())) {
      r.bytes_after += bytes;
      continue;
    }
    auto m = masters.find(nt.name);
    const bool use_master = m != masters.end() && m->second->shape() == nt.shape();
    const NamedTensor exact = exact_values(nt, use_master ? m->second : nullptr);
    Shape shape = nt.shape();
    shape.back() = cpu::q8_row_bytes(shape.back());
    const std::string name = nt.name;
    nt = map_tensor(exact, shape, DType::u8, [name, worst](const Tensor& x, int64_t) {
      return quantize_rows(x, name, worst);
    });
    nt.name = name;
    r.bytes_after += shape_numel(shape);
    ++r.tensors_quantized;
  }
  return out;
}

}  // namespace moe::io
