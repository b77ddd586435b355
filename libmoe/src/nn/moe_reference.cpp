// Slow reference MoE layer (see moe/nn/moe_reference.h): per token, per choice, per expert, in
// fp64, written for reading rather than speed.
// Shapes: N tokens, D model width, F expert hidden width, E experts, k experts per token.
#include "moe/nn/moe_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "moe/rng.h"

namespace moe::nn {
namespace {

using Vec = std::vector<double>;

double gelu(double v) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * v * (1.0 + std::tanh(c * (v + 0.044715 * v * v * v)));
}
double gelu_derivative(double v) {
  const double c = std::sqrt(2.0 / M_PI);
  double t = std::tanh(c * (v + 0.044715 * v * v * v));
  return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * v * v);
}
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
double silu(double v) { return v * sigmoid(v); }
double silu_derivative(double v) {
  double s = sigmoid(v);
  return s + v * s * (1.0 - s);
}

// The activation of a feed-forward network: gelu, swiglu or the clamped swiglu (gpt-oss).
struct Act {
  Activation kind = Activation::gelu;
  double alpha = 0, limit = 0;  // swiglu_clamped
  bool gated() const { return kind != Activation::gelu; }
};

// a(h, h3), and its partial derivatives da/dh, da/dh3 (the clamped one's are zero where a clamp
// bites, strictly beyond the limit, as torch's clamp).
struct ActValue {
  double a, dh, dh3;
};
ActValue activate(const Act& act, double h, double h3) {
  switch (act.kind) {
    case Activation::gelu:
      return {gelu(h), gelu_derivative(h), 0.0};
    case Activation::swiglu:
      return {silu(h) * h3, h3 * silu_derivative(h), silu(h)};
    case Activation::swiglu_clamped: {
      const double g = std::min(h, act.limit), u = std::clamp(h3, -act.limit, act.limit);
      const double s = sigmoid(act.alpha * g);
      const double dglu = s * (1.0 + act.alpha * g * (1.0 - s));
      return {(u + 1.0) * g * s, h > act.limit ? 0.0 : (u + 1.0) * dglu,
              h3 > act.limit || h3 < -act.limit ? 0.0 : g * s};
    }
  }
  return {0, 0, 0};
}

// A parameter's fp32 compute values (read in place), or null when the layer has no such parameter.
const float* values(const ParamSet& ps, const std::string& name, bool required, Shape shape) {
  const Param* p = ps.find(name);
  MOE_CHECK(p || !required, "moe_reference: no parameter named '", name, "'");
  if (!p) return nullptr;
  p->w().expect_shape(shape, "moe_reference parameter");
  return p->w().data<float>();
}

Tensor to_tensor(const Vec& v, Shape shape, const std::string& name) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::from_vector(std::move(shape), f).set_name(name);
}

// One expert applied to one token, with what its backward needs.
struct ExpertPass {
  Vec h, h3, a, out;  // [F], [F], [F], [D]
};

// The weights of one feed-forward network (one expert's slice of the layer's tensors, or the shared
// expert): w1 [F,D], w2 [D,F], w3 [F,D] (swiglu), b1 [F], b3 [F], b2 [D] (null when absent).
struct Ffn {
  const float *w1, *w2, *w3, *b1, *b3, *b2;
  int64_t F;
};
// Where its gradients go (same layout; null where the weight is absent).
struct FfnGrads {
  double *w1, *w2, *w3, *b1, *b3, *b2;
};

ExpertPass ffn_forward(const Ffn& w, const float* x, int64_t D, const Act& act) {
  const bool swiglu = act.gated();
  const int64_t F = w.F;
  ExpertPass p{Vec(F), Vec(F), Vec(F), Vec(D)};
  for (int64_t i = 0; i < F; ++i) {
    double s = w.b1 ? w.b1[i] : 0.0;
    double s3 = w.b3 ? w.b3[i] : 0.0;
    for (int64_t d = 0; d < D; ++d) {
      s += w.w1[i * D + d] * static_cast<double>(x[d]);
      if (swiglu) s3 += w.w3[i * D + d] * static_cast<double>(x[d]);
    }
    p.h[i] = s;
    p.h3[i] = s3;
    p.a[i] = activate(act, s, s3).a;
  }
  for (int64_t d = 0; d < D; ++d) {
    double s = w.b2 ? w.b2[d] : 0.0;
    for (int64_t i = 0; i < F; ++i) s += w.w2[d * F + i] * p.a[i];
    p.out[d] = s;
  }
  return p;
}

// The gradients of <dout, out> for the pass p of input x: into g, and d/dx into dx [D] (+=).
void ffn_backward(const Ffn& w, const ExpertPass& p, const Vec& dout, const float* x, int64_t D,
                  const Act& act, const FfnGrads& g, double* dx) {
  const int64_t F = w.F;
  const bool swiglu = act.gated();
  Vec da(F, 0.0);
  for (int64_t d = 0; d < D; ++d) {
    if (g.b2) g.b2[d] += dout[d];
    for (int64_t i = 0; i < F; ++i) {
      g.w2[d * F + i] += dout[d] * p.a[i];
      da[i] += w.w2[d * F + i] * dout[d];
    }
  }
  for (int64_t i = 0; i < F; ++i) {
    const ActValue v = activate(act, p.h[i], p.h3[i]);
    const double dh = da[i] * v.dh, dh3 = da[i] * v.dh3;
    if (g.b1) g.b1[i] += dh;
    if (g.b3) g.b3[i] += dh3;
    for (int64_t d = 0; d < D; ++d) {
      g.w1[i * D + d] += dh * x[d];
      dx[d] += w.w1[i * D + d] * dh;
      if (swiglu) {
        g.w3[i * D + d] += dh3 * x[d];
        dx[d] += w.w3[i * D + d] * dh3;
      }
    }
  }
}

double* or_null(Vec& v, int64_t offset) { return v.empty() ? nullptr : v.data() + offset; }

}  // namespace

MoEReferenceResult moe_reference(const ParamSet& ps, const std::string& prefix,
                                 const MoEConfig& config, const Tensor& x, const RouterStep& step,
                                 const Tensor& dy, float aux_scale, float z_scale) {
  const int64_t N = x.dim(0), D = config.router.d_model, E = config.router.num_experts;
  const int64_t k = config.router.top_k, F = config.experts.d_ff;
  const Act act{config.experts.activation, config.experts.clamp.alpha, config.experts.clamp.limit};
  const bool swiglu = act.gated();
  x.expect_shape({N, D}, "moe_reference x");
  const std::string rname = prefix + ".router.weight", ename = prefix + ".experts";
  const bool bias = config.experts.bias;
  const float* wg = values(ps, rname, true, {E, D});
  const float* w1 = values(ps, ename + ".w1", true, {E, F, D});
  const float* w2 = values(ps, ename + ".w2", true, {E, D, F});
  const float* w3 = swiglu ? values(ps, ename + ".w3", true, {E, F, D}) : nullptr;
  const float* b1 = bias ? values(ps, ename + ".b1", true, {E, F}) : nullptr;
  const float* b2 = bias ? values(ps, ename + ".b2", true, {E, D}) : nullptr;
  const float* b3 = bias && swiglu ? values(ps, ename + ".b3", true, {E, F}) : nullptr;
  const std::vector<float> xs = x.to_vector();

  // Router input: x, times the jitter noise in training.
  const bool jitter = step.training && config.router.jitter > 0.0f;
  std::vector<double> noise(N * D, 1.0);
  if (jitter) {
    const float j = config.router.jitter;
    const uint64_t key = router_jitter_key(step);
    for (int64_t i = 0; i < N * D; ++i)
      noise[i] = (1.0f - j) + 2.0f * j * rng_uniform(key, static_cast<uint64_t>(i));
  }

  // Router: logits, scores (softmax, or sigmoid with probs their normalisation), top-k on the
  // scores plus the selection bias, weights from the scores.
  const bool sigmoid_scoring = config.router.scoring == RouterScoring::sigmoid;
  const std::string bname = prefix + ".router.bias";
  const float* selection_bias =
      config.router.selection_bias ? values(ps, bname, true, {E}) : nullptr;
  const std::string lbname = prefix + ".router.logit_bias";
  const float* logit_bias = config.router.logit_bias ? values(ps, lbname, true, {E}) : nullptr;
  std::vector<Vec> probs(N, Vec(E)), scores(N, Vec(E)), logits_of(N, Vec(E));
  Vec lse(N);
  std::vector<std::vector<int64_t>> choice(N, std::vector<int64_t>(k));
  std::vector<Vec> gate(N, Vec(k));
  std::vector<int64_t> load(E, 0);
  for (int64_t t = 0; t < N; ++t) {
    Vec logits(E);
    for (int64_t e = 0; e < E; ++e) {
      double s = logit_bias ? logit_bias[e] : 0.0;
      for (int64_t d = 0; d < D; ++d) s += xs[t * D + d] * noise[t * D + d] * wg[e * D + d];
      logits[e] = s;
    }
    double m = logits[0];
    for (double l : logits) m = std::max(m, l);
    double z = 0;
    for (double l : logits) z += std::exp(l - m);
    lse[t] = m + std::log(z);
    logits_of[t] = logits;
    double score_sum = 0;
    for (int64_t e = 0; e < E; ++e) {
      scores[t][e] = sigmoid_scoring ? sigmoid(logits[e]) : std::exp(logits[e] - lse[t]);
      score_sum += scores[t][e];
    }
    for (int64_t e = 0; e < E; ++e)
      probs[t][e] = sigmoid_scoring ? scores[t][e] / score_sum : scores[t][e];
    auto key = [&](int64_t e) { return scores[t][e] + (selection_bias ? selection_bias[e] : 0.0); };
    std::vector<bool> taken(E, false);
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || key(e) > key(best))) best = e;
      taken[best] = true;
      choice[t][j] = best;
      gate[t][j] = scores[t][best];
      ++load[best];
    }
    if (config.router.normalize_topk) {
      double s = 0;
      for (int64_t j = 0; j < k; ++j) s += gate[t][j];
      for (int64_t j = 0; j < k; ++j) gate[t][j] /= s;
    }
  }
  MoEReferenceResult result;
  Vec f(E), mean_prob(E, 0.0);
  for (int64_t e = 0; e < E; ++e) {
    f[e] = N ? static_cast<double>(load[e]) / static_cast<double>(N * k) : 0.0;
    for (int64_t t = 0; t < N; ++t) mean_prob[e] += probs[t][e] / static_cast<double>(N);
    result.aux_loss += static_cast<double>(E) * f[e] * mean_prob[e];
  }
  for (int64_t t = 0; t < N; ++t) result.z_loss += lse[t] * lse[t] / static_cast<double>(N);

  // Capacity, in priority order: every token's first choice, then every second choice, ...
  const double cf = config.router.capacity_factor;
  const int64_t capacity =
      cf > 0 && N > 0 ? static_cast<int64_t>(std::ceil(cf * static_cast<double>(N * k) / E)) : 0;
  std::vector<std::vector<bool>> kept(N, std::vector<bool>(k, true));
  std::vector<int64_t> filled(E, 0);
  for (int64_t j = 0; j < k; ++j)
    for (int64_t t = 0; t < N; ++t) {
      int64_t e = choice[t][j];
      kept[t][j] = capacity == 0 || filled[e] < capacity;
      if (kept[t][j]) ++filled[e];
    }
  result.stats.aux_loss = result.aux_loss;
  result.stats.z_loss = result.z_loss;
  result.stats.load = load;
  result.stats.assignments = N * k;
  for (int64_t e = 0; e < E; ++e) {
    result.stats.tokens_per_expert.push_back(static_cast<int32_t>(filled[e]));
    result.stats.dropped += load[e] - filled[e];
  }

  // Experts, token by token.
  auto expert = [&](int64_t e) {
    return Ffn{w1 + e * F * D,
               w2 + e * D * F,
               swiglu ? w3 + e * F * D : nullptr,
               b1 ? b1 + e * F : nullptr,
               b3 ? b3 + e * F : nullptr,
               b2 ? b2 + e * D : nullptr,
               F};
  };
  Vec y(N * D, 0.0);
  std::vector<std::vector<ExpertPass>> passes(N, std::vector<ExpertPass>(k));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t j = 0; j < k; ++j) {
      if (!kept[t][j]) continue;
      passes[t][j] = ffn_forward(expert(choice[t][j]), &xs[t * D], D, act);
      for (int64_t d = 0; d < D; ++d) y[t * D + d] += gate[t][j] * passes[t][j].out[d];
    }

  // The shared expert (and its gate), on every token.
  const int64_t S = config.shared_ff;
  const std::string sname = prefix + ".shared", gname = prefix + ".shared_gate.weight";
  Ffn shared{};
  const float* wsg = nullptr;
  std::vector<ExpertPass> shared_pass(S > 0 ? N : 0);
  Vec shared_gate(N, 1.0);
  if (S > 0) {
    shared = Ffn{values(ps, sname + ".w1", true, {S, D}),
                 values(ps, sname + ".w2", true, {D, S}),
                 swiglu ? values(ps, sname + ".w3", true, {S, D}) : nullptr,
                 bias ? values(ps, sname + ".b1", true, {S}) : nullptr,
                 bias && swiglu ? values(ps, sname + ".b3", true, {S}) : nullptr,
                 bias ? values(ps, sname + ".b2", true, {D}) : nullptr,
                 S};
    if (config.shared_gate) wsg = values(ps, gname, true, {1, D});
    for (int64_t t = 0; t < N; ++t) {
      shared_pass[t] = ffn_forward(shared, &xs[t * D], D, act);
      if (wsg) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += wsg[d] * static_cast<double>(xs[t * D + d]);
        shared_gate[t] = sigmoid(s);
      }
      for (int64_t d = 0; d < D; ++d) y[t * D + d] += shared_gate[t] * shared_pass[t].out[d];
    }
  }
  result.y = to_tensor(y, {N, D}, "reference.y");
  if (!dy.defined()) return result;

  // Backward of loss = <dy, y> + aux_scale * aux + z_scale * z.
  dy.expect_shape({N, D}, "moe_reference dy");
  const std::vector<float> g = dy.to_vector();
  Vec dx(N * D, 0.0), dwg(E * D, 0.0), dw1(E * F * D, 0.0), dw2(E * D * F, 0.0),
      dw3(swiglu ? E * F * D : 0, 0.0), db1(bias ? E * F : 0, 0.0), db2(bias ? E * D : 0, 0.0),
      db3(b3 ? E * F : 0, 0.0), dlb(E, 0.0);
  Vec ds1(S * D, 0.0), ds2(D * S, 0.0), ds3(swiglu ? S * D : 0, 0.0), dsb1(bias ? S : 0, 0.0),
      dsb3(bias && swiglu ? S : 0, 0.0), dsb2(bias && S > 0 ? D : 0, 0.0), dwsg(wsg ? D : 0, 0.0);
  for (int64_t t = 0; t < N; ++t) {
    Vec dgate(k, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      if (!kept[t][j]) continue;
      const int64_t e = choice[t][j];
      Vec dout(D);
      for (int64_t d = 0; d < D; ++d) {
        dgate[j] += g[t * D + d] * passes[t][j].out[d];
        dout[d] = gate[t][j] * g[t * D + d];
      }
      ffn_backward(expert(e), passes[t][j], dout, &xs[t * D], D, act,
                   FfnGrads{&dw1[e * F * D], &dw2[e * D * F], or_null(dw3, e * F * D),
                            or_null(db1, e * F), or_null(db3, e * F), or_null(db2, e * D)},
                   &dx[t * D]);
    }
    if (S > 0) {
      Vec dout(D);
      double dg = 0;
      for (int64_t d = 0; d < D; ++d) {
        dg += g[t * D + d] * shared_pass[t].out[d];
        dout[d] = shared_gate[t] * g[t * D + d];
      }
      ffn_backward(shared, shared_pass[t], dout, &xs[t * D], D, act,
                   FfnGrads{ds1.data(), ds2.data(), or_null(ds3, 0), or_null(dsb1, 0),
                            or_null(dsb3, 0), or_null(dsb2, 0)},
                   &dx[t * D]);
      if (wsg) {
        const double dlogit = dg * shared_gate[t] * (1.0 - shared_gate[t]);
        for (int64_t d = 0; d < D; ++d) {
          dwsg[d] += dlogit * xs[t * D + d];
          dx[t * D + d] += dlogit * wsg[d];
        }
      }
    }
    // Router: d loss / d scores of this token (through the aux loss's probs and the gates), then
    // through the softmax or the sigmoids; the z loss through lse.
    Vec dprob(E), ds(E);
    for (int64_t e = 0; e < E; ++e) dprob[e] = aux_scale * E * f[e] / static_cast<double>(N);
    if (sigmoid_scoring) {  // probs = scores / S
      double S = 0, qdq = 0;
      for (int64_t e = 0; e < E; ++e) S += scores[t][e];
      for (int64_t e = 0; e < E; ++e) qdq += probs[t][e] * dprob[e];
      for (int64_t e = 0; e < E; ++e) ds[e] = (dprob[e] - qdq) / S;
    } else {
      ds = dprob;
    }
    if (config.router.normalize_topk) {
      double s = 0, mean = 0;
      for (int64_t j = 0; j < k; ++j) s += scores[t][choice[t][j]];
      for (int64_t j = 0; j < k; ++j) mean += dgate[j] * gate[t][j];
      for (int64_t j = 0; j < k; ++j) ds[choice[t][j]] += (dgate[j] - mean) / s;
    } else {
      for (int64_t j = 0; j < k; ++j) ds[choice[t][j]] += dgate[j];
    }
    double sds = 0;
    for (int64_t e = 0; e < E; ++e) sds += scores[t][e] * ds[e];
    for (int64_t e = 0; e < E; ++e) {
      const double s = scores[t][e];
      const double dscore = sigmoid_scoring ? ds[e] * s * (1.0 - s) : s * (ds[e] - sds);
      double dlogit = dscore + z_scale * 2.0 * lse[t] / static_cast<double>(N) *
                                   std::exp(logits_of[t][e] - lse[t]);
      dlb[e] += dlogit;
      for (int64_t d = 0; d < D; ++d) {
        dwg[e * D + d] += dlogit * xs[t * D + d] * noise[t * D + d];
        dx[t * D + d] += dlogit * wg[e * D + d] * noise[t * D + d];
      }
    }
  }
  result.dx = to_tensor(dx, {N, D}, "reference.dx");
  result.grads[rname] = to_tensor(dwg, {E, D}, rname);
  // The loss is piecewise constant in the selection bias (it only moves the choice).
  if (selection_bias) result.grads[bname] = to_tensor(Vec(E, 0.0), {E}, bname);
  if (logit_bias) result.grads[lbname] = to_tensor(dlb, {E}, lbname);
  result.grads[ename + ".w1"] = to_tensor(dw1, {E, F, D}, ename + ".w1");
  result.grads[ename + ".w2"] = to_tensor(dw2, {E, D, F}, ename + ".w2");
  if (swiglu) result.grads[ename + ".w3"] = to_tensor(dw3, {E, F, D}, ename + ".w3");
  if (bias) {
    result.grads[ename + ".b1"] = to_tensor(db1, {E, F}, ename + ".b1");
    result.grads[ename + ".b2"] = to_tensor(db2, {E, D}, ename + ".b2");
    if (b3) result.grads[ename + ".b3"] = to_tensor(db3, {E, F}, ename + ".b3");
  }
  if (S > 0) {
    result.grads[sname + ".w1"] = to_tensor(ds1, {S, D}, sname + ".w1");
    result.grads[sname + ".w2"] = to_tensor(ds2, {D, S}, sname + ".w2");
    if (swiglu) result.grads[sname + ".w3"] = to_tensor(ds3, {S, D}, sname + ".w3");
    if (bias) {
      result.grads[sname + ".b1"] = to_tensor(dsb1, {S}, sname + ".b1");
      result.grads[sname + ".b2"] = to_tensor(dsb2, {D}, sname + ".b2");
      if (swiglu) result.grads[sname + ".b3"] = to_tensor(dsb3, {S}, sname + ".b3");
    }
    if (wsg) result.grads[gname] = to_tensor(dwsg, {1, D}, gname);
  }
  return result;
}

}  // namespace moe::nn
