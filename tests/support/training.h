// The short training runs the offload, gradient-accumulation and checkpoint tests compare against
// each other: a small model routed as a real run routes (capacity drops, router jitter), and a
// few steps of a real corpus.
#pragma once
#include <cstdint>

#include "moe/models/config.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"

namespace moe::test {

inline ModelConfig routed_model(Arch arch, DType dtype = DType::f32) {
  ModelConfig c = small_model_config(arch);
  c.capacity_factor = 1.0;  // drops too
  c.router_jitter = 0.01;
  c.dtype = dtype;
  c.resolve();
  return c;
}

inline train::TrainConfig short_run(int64_t steps) {
  train::TrainConfig t;
  t.data = fortunes_path("computers");
  t.batch = 8;
  t.steps = steps;
  t.lr = 3e-3;
  t.warmup = 2;
  t.eval_batches = 2;
  t.seed = 7;
  return t;
}

}  // namespace moe::test
