#include "moe/infer/model.h"

#include <cstring>
#include <filesystem>

#include "moe/io/checkpoint_dir.h"
#include "moe/io/finite.h"
#include "moe/models/memory.h"

namespace moe::infer {

LoadedModel load_model(const std::string& given, bool experts, const nn::Parallel* parallel) {
  const io::CheckpointRef ref = io::resolve_checkpoint(given);  // a run directory: its last.h5
  if (ref.sharded)
    throw Error(str("'", given,
                    "' is a sharded checkpoint directory; inference reads one checkpoint file "
                    "(a run without --ep/--shard-embedding writes one)"));
  const std::string& path = ref.path;
  LoadedModel m;
  m.config = model_config_from_json(io::read_model_config(path));
  // Before allocating: the resident parameters at least (experts not read, or only this rank's
  // slice of them, are left out of the bound).
  const bool sliced_experts = parallel && parallel->shards_experts();
  const double params = parameter_lower_bound(m.config, experts && !sliced_experts ? 1 : 0);
  check_fits_in_memory(params * double(dtype_size(m.config.dtype)),
                       str("the model in '", path, "'"),
                       str(params, " parameters of ", dtype_name(m.config.dtype)));
  m.params = std::make_unique<ParamSet>(0, m.config.dtype);
  m.model = std::make_unique<Transformer>(m.config, *m.params, parallel);
  size_t matched = 0;
  auto take = [&](const std::string& name, const Tensor& tensor) {
    Param* p = m.params->find(name);
    MOE_CHECK(p, "'", path, "': tensor '", name, "' is not a parameter of its own model");
    MOE_CHECK(tensor.shape() == p->value.shape() && tensor.dtype() == p->value.dtype(), "'", path,
              "': tensor ", tensor.describe(), " does not match parameter ", p->value.describe());
    io::check_finite(str("'", path, "'"), name, tensor);  // never score or serve garbage
    p->value.copy_from(tensor);
    p->refresh_compute();
    ++matched;
  };
  const bool sliced = parallel && parallel->shards_experts();
  if (experts && !sliced) {
    io::Checkpoint ckpt = io::load_checkpoint(path, false);  // parameters, no optimizer state
    MOE_CHECK(ckpt.sharding.rank < 0, "'", path, "' is rank ", ckpt.sharding.rank,
              "'s shard of a sharded checkpoint; inference needs a whole checkpoint");
    m.provenance = ckpt.provenance;
    m.step = ckpt.state.step;
    for (const io::NamedTensor& nt : ckpt.params) take(nt.name, nt.tensor);
  } else {  // one tensor at a time; experts not read, or only this rank's slice
    for (const std::string& name : io::list_params(path)) {
      Param* p = m.params->find(name);
      if (p && p->expert) {
        ++matched;
        if (!experts || !p->shard.defined()) continue;
        const int64_t per_expert = p->value.numel() / p->value.dim(0);
        for (int64_t e = 0; e < p->shard.count; ++e) {
          Tensor one = io::read_expert(path, name, p->shard.start + e);
          MOE_CHECK(one.numel() == per_expert && one.dtype() == p->value.dtype(), "'", path,
                    "': expert ", p->shard.start + e, " of '", name, "' is ", one.describe(),
                    ", the model expects ", per_expert, " ", dtype_name(p->value.dtype()),
                    " elements");
          io::check_finite(str("'", path, "'"), str(name, " (expert ", p->shard.start + e, ")"),
                           one);
          std::memcpy(static_cast<std::byte*>(p->value.raw()) + e * one.nbytes(), one.raw(),
                      one.nbytes());
        }
        p->refresh_compute();
        continue;
      }
      take(name, io::read_param(path, name));
    }
  }
  MOE_CHECK(matched == m.params->size(), "'", path, "' holds ", matched, " of the model's ",
            m.params->size(), " parameters");
  return m;
}

LoadedModel load_ring_model(const std::string& path) {
  const io::CheckpointRef ref = io::resolve_checkpoint(path);
  auto ring = std::make_unique<offload::ExpertRing>(ref.path);
  auto view = std::make_unique<nn::Parallel>();
  view->expert_store = ring.get();
  LoadedModel m = load_model(path, false, view.get());
  m.ring = std::move(ring);
  m.view = std::move(view);
  return m;
}

}  // namespace moe::infer
