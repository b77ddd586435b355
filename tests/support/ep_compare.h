// Comparing distributed training runs with one process (the expert-parallel and placement
// tests): the models and settings they train, and how far apart two runs' parameters are.
#pragma once
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>

#include "moe/io/checkpoint.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"

namespace moe::test {

// The router's defaults: the aux loss is on (its statistics are summed over the ranks), dropless.
// The gpt model adds router jitter (each token's noise is indexed by its place in the global
// batch).
inline ModelConfig ep_model(Arch arch) {
  ModelConfig c = small_model_config(arch);
  if (arch == Arch::gpt) c.router_jitter = 0.05;
  c.resolve();
  return c;
}

inline train::TrainConfig ep_train(int64_t ep) {
  train::TrainConfig t;
  t.data = fortunes_path("linux");
  t.batch = 8;
  t.steps = 4;
  t.warmup = 2;
  t.eval_batches = 1;
  t.seed = 11;
  t.ep = ep;
  return t;
}

// Index in the whole tensor of element i of a slice (the rule ParamSet uses to initialise it).
inline int64_t whole_index(const ParamShard& s, int64_t i) {
  if (!s.defined()) return i;
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(s.dim) + 1; d < s.global.size(); ++d) inner *= s.global[d];
  const int64_t local_span = s.count * inner,
                global_span = s.global[static_cast<size_t>(s.dim)] * inner;
  return i / local_span * global_span + s.start * inner + i % local_span;
}

// Largest difference between a rank's (maybe sliced) parameters and one process's, relative to
// the tensor's scale, over every parameter but the key bias (its true gradient is zero: see
// test_data_parallel.cpp).
inline double worst_difference(train::Trainer& parallel, train::Trainer& single,
                               std::string& where) {
  double worst = 0;
  for (Param* p : parallel.params().all()) {
    if (p->name.ends_with("attn.k.bias")) continue;
    const Param& q = single.params().at(p->name);
    std::vector<float> x = p->value.to_vector(), y = q.value.to_vector();
    double scale = 1e-12, diff = 0;
    for (float v : y) scale = std::max(scale, std::fabs(double(v)));
    // A reference that is sliced too (another distributed run) holds the same slice.
    REQUIRE((!q.shard.defined() || q.value.shape() == p->value.shape()));
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t j = q.shard.defined() ? int64_t(i) : whole_index(p->shard, int64_t(i));
      diff = std::max(diff, std::fabs(double(x[i]) - y[static_cast<size_t>(j)]));
    }
    if (diff / scale > worst) {
      worst = diff / scale;
      where = p->name;
    }
  }
  return worst;
}

// The same for a run's whole tensors (a snapshot: a placed run's experts gathered from its
// ranks' slots) against a reference's (maybe sliced) parameters or another snapshot's tensors.
inline double worst_difference(const io::Checkpoint& run, const io::Checkpoint& reference,
                               std::string& where) {
  double worst = 0;
  for (const io::NamedTensor& a : run.params) {
    if (a.name.ends_with("attn.k.bias")) continue;
    const io::NamedTensor* b = nullptr;
    for (const io::NamedTensor& t : reference.params)
      if (t.name == a.name) b = &t;
    REQUIRE(b);
    REQUIRE(a.tensor.shape() == b->tensor.shape());
    std::vector<float> x = a.tensor.to_vector(), y = b->tensor.to_vector();
    double scale = 1e-12, diff = 0;
    for (float v : y) scale = std::max(scale, std::fabs(double(v)));
    for (size_t i = 0; i < x.size(); ++i) diff = std::max(diff, std::fabs(double(x[i]) - y[i]));
    if (diff / scale > worst) {
      worst = diff / scale;
      where = a.name;
    }
  }
  return worst;
}

inline bool bitwise_equal(train::Trainer& a, train::Trainer& b, std::string& where) {
  for (Param* p : a.params().all()) {
    const Param& q = b.params().at(p->name);
    if (p->value.nbytes() != q.value.nbytes() ||
        std::memcmp(p->value.raw(), q.value.raw(), p->value.nbytes()) != 0) {
      where = p->name;
      return false;
    }
  }
  return true;
}

inline void step_both(train::Trainer& parallel, train::Trainer& single, int steps) {
  for (int i = 0; i < steps; ++i) {
    train::StepStats a = parallel.step();
    train::StepStats b = single.step();
    INFO("step " << i + 1);
    // Float reduction order differs (rows of an expert arrive by source rank; gradients are
    // summed per rank, then across ranks): tolerances as in test_data_parallel.cpp.
    REQUIRE(a.forward.loss == Approx(b.forward.loss).epsilon(1e-5));
    REQUIRE(a.forward.aux_loss == Approx(b.forward.aux_loss).epsilon(1e-5));
    REQUIRE(a.forward.z_loss == Approx(b.forward.z_loss).epsilon(1e-4));
    REQUIRE(a.grad_norm == Approx(b.grad_norm).epsilon(1e-4));
    for (size_t l = 0; l < a.forward.moe.size(); ++l)
      REQUIRE(a.forward.moe[l].load == b.forward.moe[l].load);
  }
}

}  // namespace moe::test
