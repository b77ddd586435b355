// Models, checkpoints and batches shared by the expert ring tests (tests/unit/test_expert_ring.cpp
// on the host, tests/cuda/test_cuda_ring.cpp on a GPU).
// Shapes: L MoE layers, B batch, T sequence.
#pragma once
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "moe/io/checkpoint.h"
#include "moe/models/transformer.h"
#include "moe/param.h"
#include "moe/rng.h"
#include "support/models.h"

namespace moe::test {

// gpt: 5 blocks, block 1 dense, MoE layers of 4, 2, 4, 3 experts (slots sized by the largest).
// mixtral: 4 MoE blocks of 4 experts. L = 4 either way.
inline ModelConfig ring_config(Arch arch, DType dtype) {
  ModelConfig c = small_model_config(arch);
  c.dtype = dtype;
  c.seq = 16;
  if (arch == Arch::gpt) {
    c.layers = 5;
    c.experts_per_layer = {4, 0, 2, 4, 3};
  } else {
    c.layers = 4;
  }
  c.resolve();
  return c;
}

// A checkpoint of an untrained model, stored in config.dtype: parameters as the ParamSet seed
// draws them, every tensor (biases and norm weights too) perturbed so that each one matters.
inline void save_ring_model(const std::string& path, const ModelConfig& config, uint64_t seed) {
  ParamSet ps(seed, config.dtype);
  Transformer model(config, ps);
  io::Checkpoint ckpt;
  ckpt.model_config = to_json(config);
  const uint64_t key = rng_key(seed, {0x7e57});
  uint64_t index = 0;
  for (Param* p : ps.all()) {
    Tensor v = p->value.to(DType::f32);
    float* d = v.data<float>();
    for (int64_t i = 0; i < v.numel(); ++i) d[i] += 0.05f * rng_normal(key, index++);
    p->value.copy_from(v);
    ckpt.params.push_back({p->name, p->value, p->expert, p->shard});
  }
  io::save_checkpoint(path, ckpt);
}

struct RingBatch {
  Tensor ids, targets;  // [B, T] on `device`
};

inline RingBatch ring_batch(const ModelConfig& c, int64_t B, uint64_t seed, Device device = {}) {
  std::vector<int32_t> ids(static_cast<size_t>(B * c.seq)), targets(ids.size());
  const uint64_t key = rng_key(seed, {0xba7c});
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>(rng_below(key, 2 * i, static_cast<uint64_t>(c.vocab_size)));
    targets[i] =
        static_cast<int32_t>(rng_below(key, 2 * i + 1, static_cast<uint64_t>(c.vocab_size)));
  }
  return {Tensor::from_vector({B, c.seq}, ids).to(device),
          Tensor::from_vector({B, c.seq}, targets).to(device)};
}

// The bytes of two tensors on any devices, compared on the host.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device{}), hb = b.to(Device{});
  return ha.dtype() == hb.dtype() && ha.shape() == hb.shape() &&
         std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// fp32 bytes of one block's experts (0 for a dense block), and of the largest MoE layer.
inline int64_t moe_layer_bytes(const ParamSet& ps, int64_t block) {
  int64_t bytes = 0;
  const std::string prefix = "blocks." + std::to_string(block) + ".";
  for (const Param* p : ps.all())
    if (p->expert && p->name.rfind(prefix, 0) == 0) bytes += p->value.numel() * 4;
  return bytes;
}
inline int64_t largest_moe_layer_bytes(const ParamSet& ps, int64_t blocks) {
  int64_t largest = 0;
  for (int64_t b = 0; b < blocks; ++b) largest = std::max(largest, moe_layer_bytes(ps, b));
  return largest;
}

}  // namespace moe::test
