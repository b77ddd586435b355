// A small model for tests that train: 2 blocks, both MoE (4 experts, top-2), d_model 32, seq 32,
// the flavour's own router renormalisation. Callers adjust fields, then call resolve().
#pragma once
#include <utility>

#include "moe/io/checkpoint.h"
#include "moe/models/config.h"
#include "moe/models/transformer.h"

namespace moe::test {

inline ModelConfig small_model_config(Arch arch) {
  ModelConfig c;
  c.arch = arch;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  c.kv_heads = arch == Arch::mixtral ? 2 : 0;
  c.d_ff = 64;
  c.seq = 32;
  c.experts = 4;
  c.moe_every = 1;
  c.top_k = 2;
  c.normalize_topk = arch == Arch::mixtral;
  return c;
}

// The model moe-plan's tests work their bytes and seconds out by hand on: gpt, 2 MoE layers of 4
// experts, D 16, F 32, 2 heads, seq 16, vocabulary 256, top-2; resolved.
inline ModelConfig plan_model_config() {
  ModelConfig c;
  c.layers = 2;
  c.d_model = 16;
  c.heads = 2;
  c.d_ff = 32;
  c.seq = 16;
  c.experts = 4;
  c.moe_every = 1;
  c.top_k = 2;
  c.resolve();
  return c;
}

// The checkpoint of a freshly initialised model of config `c` (seed, storage dtype): parameters
// only, as an inference checkpoint; for tests of converters and exporters.
inline io::Checkpoint initial_checkpoint(const ModelConfig& c, uint64_t seed,
                                         DType dtype = DType::f32) {
  ParamSet params(seed, dtype);
  Transformer model(c, params);
  io::Checkpoint ckpt;
  ckpt.model_config = to_json(c);
  ckpt.train_config = nullptr;
  for (const Param* p : std::as_const(params).all())
    ckpt.params.push_back({p->name, p->value, p->expert, {}});
  return ckpt;
}

}  // namespace moe::test
