// Models written without ever being held: Mixtral-shaped checkpoints whose values come from a
// seeded generator and whose expert tensors are written one expert at a time, for the tests that
// prove bounded memory (streaming conversion, mapped weights) on a model just big enough to tell.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "moe/io/checkpoint.h"
#include "moe/models/transformer.h"
#include "moe/rng.h"

namespace moe::test {

// A Mixtral shape: 4 heads over 2 KV heads, sequence 64, top-2 of `experts` in every layer.
inline ModelConfig streamed_config(int64_t layers, int64_t d_model, int64_t d_ff,
                                   int64_t experts) {
  ModelConfig c;
  c.arch = Arch::mixtral;
  c.layers = layers;
  c.d_model = d_model;
  c.heads = 4;
  c.kv_heads = 2;
  c.d_ff = d_ff;
  c.seq = 64;
  c.experts = experts;
  c.moe_every = 1;
  c.top_k = 2;
  c.normalize_topk = true;
  c.resolve();
  return c;
}

// The values of a model: tensor `name`'s (expert e, or -1 for a whole tensor) are
// normal(0, 0.05) drawn from `seed`; with `norms_near_one`, tensors named "*norm*" get 1 added
// (a model whose activations keep their scale through many layers).
struct StreamedValues {
  uint64_t seed = 7;
  bool norms_near_one = false;

  Tensor operator()(const std::string& name, int64_t e, const Shape& shape) const {
    Tensor t = Tensor::empty(shape, DType::f32);
    const uint64_t key = rng_key(seed, {hash_name(name), static_cast<uint64_t>(e + 1)});
    const float base = norms_near_one && name.find("norm") != std::string::npos ? 1.0f : 0.0f;
    float* v = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i)
      v[i] = base + 0.05f * rng_normal(key, static_cast<uint64_t>(i));
    return t;
  }
};

// An expert tensor of `shape` whose expert e is values(name, e, ...), produced one at a time.
inline io::NamedTensor streamed_tensor(const std::string& name, const Shape& shape,
                                       const StreamedValues& values) {
  auto source = std::make_shared<io::ExpertSource>();
  source->shape = shape;
  const Shape rest(shape.begin() + 1, shape.end());
  source->read = [name, rest, values](int64_t e) { return values(name, e, rest); };
  return io::NamedTensor{name, Tensor(), true, {}, source};
}

// Writes an f32 model of `config` to `path`: the parameter names and shapes of the model the
// config builds (its values never made), the values from `values`, expert tensors one expert at
// a time; with `optim`, an Adam moment "adam.m.<name>" of every parameter too (values of that
// name). Returns the parameters' bytes.
inline int64_t write_streamed_model(const std::string& path, const ModelConfig& config,
                                    const StreamedValues& values, bool optim = false) {
  ParamSet params(0, DType::f32);
  params.skip_initial_values(true);
  params.skip_gradients(true);
  Transformer model(config, params);
  io::Checkpoint ckpt;
  ckpt.model_config = to_json(config);
  ckpt.train_config = nullptr;
  int64_t bytes = 0;
  for (const Param* p : std::as_const(params).all()) {
    bytes += p->numel() * 4;
    for (bool moment : {false, true}) {
      if (moment && !optim) continue;
      const std::string name = moment ? "adam.m." + p->name : p->name;
      (moment ? ckpt.optim : ckpt.params)
          .push_back(p->expert ? streamed_tensor(name, p->shape, values)
                               : io::NamedTensor{name, values(name, -1, p->shape), false, {}});
    }
  }
  io::save_checkpoint(path, ckpt);
  return bytes;
}

}  // namespace moe::test
