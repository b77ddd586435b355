// inspect --verify through the loaders' own checks (see verify.h).
#include "moe/train/verify.h"

#include "moe/io/convert.h"
#include "moe/io/finite.h"
#include "moe/models/transformer.h"
#include "moe/optim/adamw.h"

namespace moe::train {

void verify_loadable(const io::Checkpoint& ckpt, const std::string& source) {
  const ModelConfig config = model_config_from_json(ckpt.model_config);
  // Values first: every loader refuses NaN/Inf parameters and optimizer state.
  io::check_finite(source, ckpt.params);
  io::check_finite(source, ckpt.optim);
  // The model the checkpoint's own configuration builds, unsharded (a sharded checkpoint has
  // been merged), exactly as a resumed single-process run builds it.
  ParamSet params(0, config.dtype);
  // Without optimizer state only shapes and dtypes are compared: the parameters' pages are never
  // written, so a model of any size is checked in the memory of its largest tensor (read above,
  // one at a time when the checkpoint was opened lazily).
  const bool shapes_only = ckpt.optim.empty();
  params.skip_initial_values(shapes_only);
  params.skip_gradients(shapes_only);
  Transformer model(config, params);
  io::check_params_match(params, ckpt.params, source);
  if (ckpt.optim.empty()) return;
  optim::AdamW optimizer(params, optim::AdamWConfig{});
  std::vector<optim::OptimizerTensor> state;
  for (const io::NamedTensor& nt : ckpt.optim) state.push_back({nt.name, nt.whole(), nt.expert});
  try {
    optimizer.load_state(state, ckpt.state.step);
  } catch (const Error& e) {
    throw Error(str(source, ": ", e.what()));
  }
}

void verify_checkpoint(const std::vector<std::string>& paths) {
  const io::Checkpoint ckpt = io::open_whole(paths, true);
  std::string source;
  for (const std::string& f : io::checkpoint_files(paths))
    source += (source.empty() ? "" : ", ") + f;
  verify_loadable(ckpt, source);
}

}  // namespace moe::train
