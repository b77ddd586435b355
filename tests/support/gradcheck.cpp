#include "support/gradcheck.h"

#include <cmath>

#include "moe/rng.h"

namespace moe::test {

Tensor random_tensor(Shape shape, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(std::move(shape), DType::f32);
  float* p = t.data<float>();
  uint64_t key = rng_key(seed, {0x7e57});
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * rng_normal(key, static_cast<uint64_t>(i));
  return t;
}

Tensor random_ids(Shape shape, uint64_t seed, int32_t limit) {
  Tensor t = Tensor::empty(std::move(shape), DType::i32);
  int32_t* p = t.data<int32_t>();
  uint64_t key = rng_key(seed, {0x1d5});
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<int32_t>(
        rng_below(key, static_cast<uint64_t>(i), static_cast<uint64_t>(limit)));
  return t;
}

void randomize_param(Param& p, uint64_t seed, float scale) {
  p.value.copy_from(random_tensor(p.value.shape(), seed, scale));
  p.refresh_compute();
}

void randomize_moe_params(ParamSet& ps, int64_t d_model, int64_t d_ff, float other_scale,
                          uint64_t salt) {
  for (Param* p : ps.all()) {
    float scale = other_scale;
    if (p->name.find("router") != std::string::npos)
      scale = 3.0f / std::sqrt(float(d_model));
    else if (p->name.find(".w2") != std::string::npos)
      scale = 1.0f / std::sqrt(float(d_ff));
    else if (p->name.find(".w") != std::string::npos)
      scale = 1.0f / std::sqrt(float(d_model));
    randomize_param(*p, hash_name(p->name) ^ salt, scale);
  }
}

double dot(const Tensor& y, const Tensor& r) {
  MOE_CHECK(y.numel() == r.numel(), "dot: ", y.describe(), " vs ", r.describe());
  const float* a = y.data<float>();
  const float* b = r.data<float>();
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

GradCheckResult check_gradient(Tensor& x, const Tensor& analytic,
                               const std::function<double()>& loss, double eps, int max_checks) {
  MOE_CHECK(x.numel() == analytic.numel(), "check_gradient: ", x.describe(), " vs ",
            analytic.describe());
  GradCheckResult r;
  float* xs = x.data<float>();
  const float* as = analytic.data<float>();
  int64_t n = x.numel();
  int64_t stride = std::max<int64_t>(1, n / max_checks);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; i += stride) idx.push_back(i);
  if (idx.back() != n - 1) idx.push_back(n - 1);
  std::vector<double> numeric(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) {
    float saved = xs[idx[j]];
    xs[idx[j]] = static_cast<float>(saved + eps);
    double plus = loss();
    xs[idx[j]] = static_cast<float>(saved - eps);
    double minus = loss();
    xs[idx[j]] = saved;
    numeric[j] = (plus - minus) / (2 * eps);
    r.grad_scale = std::max(r.grad_scale, std::fabs(numeric[j]));
  }
  for (size_t j = 0; j < idx.size(); ++j) {
    double err = std::fabs(as[idx[j]] - numeric[j]) / std::max(r.grad_scale, 1e-12);
    if (err >= r.max_error) {
      r.max_error = err;
      r.worst = str("element ", idx[j], ": analytic ", as[idx[j]], " numeric ", numeric[j]);
    }
    ++r.checked;
  }
  return r;
}

}  // namespace moe::test
