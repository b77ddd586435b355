// A small model for tests that train: 2 blocks, both MoE (4 experts, top-2), d_model 32, seq 32,
// the flavour's own router renormalisation. Callers adjust fields, then call resolve().
#pragma once
#include "moe/models/config.h"

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

}  // namespace moe::test
