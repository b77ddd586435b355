// The trainer's checkpoints: snapshot, save (one file, or a sharded directory: one file per rank
// that owns parameters) and restore. An offloaded run's experts (--offload) live in its store:
// save streams each expert tensor from the store into its dataset one expert at a time, and
// restore reads each expert's chunk straight into the store, so neither ever holds a whole
// expert tensor (docs/FORMATS.md: the file is the one a resident run writes).
// Shape letters: E experts of a layer (the leading dimension of an expert tensor).
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "io/json_attrs.h"
#include "moe/io/checkpoint_dir.h"
#include "moe/io/convert.h"
#include "moe/io/finite.h"
#include "moe/log.h"
#include "moe/settings.h"
#include "moe/timer.h"
#include "moe/train/trainer.h"

namespace moe::train {

bool Trainer::sharded() const {
  // Under --placement lpt/flexmoe every rank holds whole expert tensors: only the table shards.
  return world_size() > 1 &&
         ((train_.ep > 1 && train_.placement == PlacementRule::fixed) || train_.shard_embedding);
}

static bool same_shard(const ParamShard& a, const ParamShard& b) {
  return a.global == b.global && a.dim == b.dim && a.start == b.start && a.count == b.count;
}

static std::string layout_text(int world, int64_t ep, bool shard_embedding) {
  return str(world, world == 1 ? " rank" : " ranks", " with ", flag_for(Setting::ep), " ", ep,
             shard_embedding ? str(" and ", flag_for(Setting::shard_embedding)) : "");
}

std::map<std::string, const Param*> Trainer::params_of_optimizer_tensors() const {
  std::map<std::string, const Param*> out;
  for (const StateTensor& t : optimizer_state()) out[t.tensor.name] = t.param;
  return out;
}

void Trainer::restore(const io::Checkpoint& ckpt, const std::string& source) {
  if (ckpt.sharding.rank >= 0)
    throw Error(str("this checkpoint file is rank ", ckpt.sharding.rank,
                    "'s shard of a sharded checkpoint: resume from its directory"));
  restore_placement(ckpt, source);  // flexmoe: the maps say which experts this rank's slots hold
  const auto* maps = vexpert_maps();
  if (!sharded() && !maps) {
    load_tensors(ckpt);
    return;
  }
  // A whole checkpoint (one process, data parallel, a placed run, or a sharded directory of
  // another layout merged in memory: every logical tensor once) resumes a sharded run too: each
  // rank takes its slice of every sliced parameter and of its optimizer tensors, and under
  // flexmoe the rows of its vExpert slots.
  std::map<const Param*, std::vector<int64_t>> slots;  // flexmoe: slot tensor -> its experts
  if (maps)
    for (const auto& [block, map] : *maps)
      for (const Param* p : expert_params(*params_, block))
        slots[p] = slot_experts(map, layout_->experts()->rank());
  const std::map<std::string, const Param*> param_of_state = params_of_optimizer_tensors();
  auto cut = [&](const io::NamedTensor& nt, const Param* p) {
    if (!p || (!p->shard.defined() && !slots.count(p))) return nt;
    const Shape whole = p->shard.defined() ? p->shard.global : nt.shape();
    MOE_CHECK(!nt.streamed() && nt.shape() == whole && (p->shard.defined() || !whole.empty()),
              "resume: '", nt.name, "' ", shape_str(nt.shape()), " is not the whole tensor ",
              shape_str(whole), " this rank takes a part of");
    io::NamedTensor part = nt;
    part.tensor = p->shard.defined()
                      ? io::slice_dim(nt.tensor, p->shard.dim, p->shard.start, p->shard.count)
                      : take_slots(nt.tensor, slots.at(p));
    part.shard = p->shard;
    return part;
  };
  io::Checkpoint mine;
  mine.state = ckpt.state;
  mine.train_config = ckpt.train_config;
  mine.tokenizer = ckpt.tokenizer;
  for (const io::NamedTensor& nt : ckpt.params)
    mine.params.push_back(cut(nt, params_->find(nt.name)));
  for (const io::NamedTensor& nt : ckpt.optim) {
    auto it = param_of_state.find(nt.name);
    mine.optim.push_back(cut(nt, it == param_of_state.end() ? nullptr : it->second));
  }
  load_tensors(mine);
}

// A tensor on the host, to look at its values (a copy only for device tensors).
static Tensor on_host(const Tensor& t) {
  return t.device().kind == Device::cpu ? t : t.to(Device{});
}

// Parameters or optimizer state holding NaN/Inf are never saved: the run diverged; nor are
// parameters exploded past 2^32 (moe/io/finite.h; device parameters meet that check here). Whole
// tensors are checked now; a streamed one's source is wrapped to check each expert's slice as the
// save reads it (a failure then abandons the file being written, so the previous checkpoint stays).
static void check_saveable(io::Checkpoint& c, int64_t step) {
  const std::string where = str("step ", step, ": not saving the checkpoint");
  for (std::vector<io::NamedTensor>* group : {&c.params, &c.optim})
    for (io::NamedTensor& nt : *group) {
      if (!nt.streamed()) {
        if (group == &c.params)
          io::check_not_exploded(where, nt.name, on_host(nt.tensor));
        else
          io::check_finite(where, nt.name, on_host(nt.tensor));
        continue;
      }
      auto checked = std::make_shared<io::ExpertSource>(*nt.source);
      checked->read = [where, name = nt.name, inner = nt.source](int64_t e) {
        Tensor slice = inner->read(e);
        io::check_finite_expert(where, name, slice, e, inner->shape);
        return slice;
      };
      nt.source = std::move(checked);
    }
}

void Trainer::load_tensors(const io::Checkpoint& ckpt) {
  tokenizer_ = ckpt.tokenizer;  // carried into every checkpoint this run writes
  centers_given_ = true;        // resumed, or --init: no first-step calibration of the centers
  // Garbage is refused at load, naming the tensor, rather than trained on; the same checks as
  // moe-convert inspect --verify (train::verify_loadable). Whole tensors are checked before
  // anything is loaded; streamed ones expert by expert as they go into the store (a failure then
  // leaves the store part-filled: the run is not to be used, as after any failed restore).
  const std::string where = str("checkpoint to resume (step ", ckpt.state.step, ")");
  for (const std::vector<io::NamedTensor>* group : {&ckpt.params, &ckpt.optim})
    for (const io::NamedTensor& nt : *group)
      if (!nt.streamed()) io::check_finite(where, nt.name, nt.tensor);
  io::check_params_match(*params_, ckpt.params, "resume");
  std::map<std::string, const io::NamedTensor*> optim_by_name;
  for (const io::NamedTensor& nt : ckpt.optim) optim_by_name[nt.name] = &nt;
  // An offloaded parameter's optimizer tensors, all present and of its shape before any is read.
  auto offloaded_state = [&](const Param& p) {
    std::vector<std::pair<std::string, const io::NamedTensor*>> state;
    for (const char* what : {"adam.m", "adam.v", "master"}) {
      if (std::string(what) == "master" && params_->dtype() == DType::f32) continue;
      auto it = optim_by_name.find(str(what, ".", p.name));
      MOE_CHECK(it != optim_by_name.end(), "optimizer state: missing tensor '", what, ".", p.name,
                "'");
      const io::NamedTensor& nt = *it->second;
      MOE_CHECK(nt.shape() == p.shape && nt.dtype() == DType::f32 && (nt.expert || !nt.streamed()),
                "optimizer state: ", nt.name, shape_str(nt.shape()), " ", dtype_name(nt.dtype()),
                " does not match '", p.name, "'");
      state.emplace_back(what, &nt);
    }
    return state;
  };
  for (const io::NamedTensor& nt : ckpt.params) {
    const Param* p = params_->find(nt.name);
    if (p->offloaded) offloaded_state(*p);
  }
  std::map<std::string, Tensor> sharded_values;  // --zero 3
  for (const io::NamedTensor& nt : ckpt.params) {
    Param* p = params_->find(nt.name);
    if (p->offloaded) {  // into the store, one expert at a time, one slice held at a time
      Shape one = p->shape;
      one[0] = 1;
      const auto state = offloaded_state(*p);
      for (int64_t e = 0; e < p->shape[0]; ++e) {
        auto put = [&](const std::string& what, const io::NamedTensor& from) {
          const Tensor slice = from.expert_slice(e);
          io::check_finite_expert(where, from.name, slice, e, from.shape());
          store_->write(*p, e, what, slice.reshape(one));
        };
        put("value", nt);
        for (const auto& [what, from] : state) put(what, *from);
      }
      continue;
    }
    MOE_CHECK(!nt.streamed(), "resume: tensor '", nt.name,
              "' was streamed but its parameter is resident");
    if (zero_ && zero_->stage() >= 3 && zero_->covers(*p)) {  // this rank's slice, below
      sharded_values[nt.name] = nt.tensor;
      continue;
    }
    p->value.copy_from(nt.tensor);
    p->refresh_compute();
  }
  // The optimizer holds the resident parameters' state only; streamed tensors are offloaded ones'.
  std::vector<optim::OptimizerTensor> state;
  for (const io::NamedTensor& nt : ckpt.optim)
    if (!nt.streamed()) state.push_back({nt.name, nt.tensor, nt.expert});
  optimizer_->load_state(state, ckpt.state.step);
  if (zero_) {  // this rank's slices of the dense state
    zero_->load_state(state);
    zero_->load_values(sharded_values);
  }
  step_ = ckpt.state.step;
  tokens_seen_ = ckpt.state.tokens_seen;
  if (sampler_) sampler_->set_cursor(ckpt.state.data_cursor);
  if (tasks_)
    tasks_->load_state(ckpt.train_config.is_object()
                           ? ckpt.train_config.value("tasks_state", nlohmann::json())
                           : nlohmann::json());
}

void Trainer::initialize(io::Checkpoint weights) {
  if (weights.sharding.rank >= 0)
    throw Error(str("this checkpoint file is rank ", weights.sharding.rank,
                    "'s shard of a sharded checkpoint: start from its directory"));
  io::Checkpoint init;
  init.params = std::move(weights.params);
  init.tokenizer = std::move(weights.tokenizer);
  init.state.seed = train_.seed;
  // The moments start at zero and the fp32 masters hold the loaded values, as a fresh run's do;
  // the names and whole shapes restore() expects (it slices them for a sharded run): the
  // optimizer's own tensors, and those of the offloaded experts (their state is in the store).
  std::set<std::string> wanted;
  for (const optim::OptimizerTensor& t : optimizer().state()) wanted.insert(t.name);
  for (const io::NamedTensor& nt : init.params) {
    const Param* p = params_->find(nt.name);
    if (!p) continue;  // restore names what does not belong to this model
    MOE_CHECK(!nt.streamed(), "initialize: '", nt.name, "' was not read");
    auto add = [&](const std::string& name, Tensor t) {
      if (wanted.count(name) || p->offloaded) init.optim.push_back({name, std::move(t), p->expert});
    };
    add("adam.m." + nt.name, Tensor::zeros(nt.shape()));
    add("adam.v." + nt.name, Tensor::zeros(nt.shape()));
    if (params_->dtype() != DType::f32) add("master." + nt.name, nt.tensor.to(DType::f32));
  }
  restore(init);
}

void Trainer::initialize(const std::string& path) {
  namespace fs = std::filesystem;
  initialize(fs::is_directory(path) ? io::merge_shards(io::checkpoint_files({path}))
                                    : io::load_checkpoint(path));
}

void Trainer::restore(const std::string& path) {
  namespace fs = std::filesystem;
  std::string head_path = path;
  if (fs::is_directory(path)) {
    head_path = io::CheckpointDir::rank_file(path, 0);
    if (!fs::exists(head_path))
      throw Error(str("'", path, "' is not a sharded checkpoint directory (no ", head_path, ")"));
  }
  restore(path, io::open_checkpoint_lazy(head_path));
}

// The tensors of a lazily opened checkpoint (`file`) that the restore needs in memory, read now:
// every one but the expert tensors `stream` names, which stay streamed (read an expert at a time
// into the store).
static io::Checkpoint held_except(io::Checkpoint ckpt, const io::StreamFilter& stream,
                                  const std::string& file) {
  Timer timer;
  size_t streamed = 0;
  for (bool optim : {false, true})
    for (io::NamedTensor& nt : optim ? ckpt.optim : ckpt.params) {
      if (nt.held()) continue;
      if (nt.streamed() && stream && stream(optim, nt.name)) {
        ++streamed;
        continue;
      }
      nt.tensor = nt.whole();
      nt.source = nullptr;
      nt.deferred = nullptr;
    }
  MOE_LOG_DEBUG("read checkpoint ", file, " (step ", ckpt.state.step, "): ", ckpt.params.size(),
                " parameter and ", ckpt.optim.size(), " optimizer tensors in ", timer.seconds(),
                " s, ", streamed, " of them streamed (read an expert at a time later)");
  return ckpt;
}

void Trainer::restore(const std::string& path, io::Checkpoint head) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) {  // a sharded run slices whole tensors: nothing streams then
    restore(held_except(std::move(head), sharded() ? io::StreamFilter() : offloaded_filter(), path),
            path);
    return;
  }
  const std::string head_path = io::CheckpointDir::rank_file(path, 0);
  const io::StreamFilter stream = offloaded_filter();
  const io::Sharding& layout = head.sharding;
  std::vector<int> contiguous;  // the expert -> rank map of this run's static layout
  if (train_.ep > 1)
    for (int64_t experts : model_->config().experts_per_layer)
      for (int64_t e = 0; e < experts; ++e)
        contiguous.push_back(static_cast<int>(e / (experts / train_.ep)));
  // Another layout (rank count, --ep, --shard-embedding, placement), or experts placed by load
  // (moe-convert partition --trace): every rank merges the directory's files in memory into the
  // whole checkpoint (as moe-convert merge does; each rank then holds the whole model once, for
  // the time of the restore) and resumes from that, which fits any layout.
  if (layout.rank != 0 || layout.world_size != world_size() || layout.ep_size != train_.ep ||
      layout.shard_embedding != train_.shard_embedding || !sharded() || vexpert_maps() ||
      (!layout.expert_rank.empty() && layout.expert_rank != contiguous)) {
    MOE_LOG_INFO("resume: '", path, "' was written by ",
                 layout_text(layout.world_size, layout.ep_size, layout.shard_embedding),
                 "; this run has ", layout_text(world_size(), train_.ep, train_.shard_embedding),
                 " and ", placement_rule_name(train_.placement),
                 " placement: re-sharding it on load");
    head = io::Checkpoint();  // its tensors are read again with the other files
    restore(io::merge_shards(io::checkpoint_files({path})), head_path);  // configs: part 0's
    return;
  }
  restore_sharded(held_except(std::move(head), stream, head_path), path, [&](int source) {
    return io::load_checkpoint(io::CheckpointDir::rank_file(path, source), true, stream);
  });
}

// This rank's tensors from the parts of a sharded checkpoint: replicated ones from part 0 (`head`),
// its experts from the part of the rank of the first expert-parallel group that holds them, its
// table columns from its own part. `load(r)` gives part r (r > 0).
void Trainer::restore_sharded(io::Checkpoint head, const std::string& where,
                              const std::function<io::Checkpoint(int)>& load) {
  std::vector<int> sources{0};
  if (train_.ep > 1 && train_.placement == PlacementRule::fixed)
    sources.push_back(rank() % static_cast<int>(train_.ep));
  if (train_.shard_embedding) sources.push_back(rank());
  io::Checkpoint mine;
  mine.state = head.state;
  mine.train_config = head.train_config;
  mine.tokenizer = head.tokenizer;
  const std::map<std::string, const Param*> param_of_state = params_of_optimizer_tensors();
  for (size_t i = 0; i < sources.size(); ++i) {
    if (std::find(sources.begin(), sources.begin() + static_cast<std::ptrdiff_t>(i), sources[i]) !=
        sources.begin() + static_cast<std::ptrdiff_t>(i))
      continue;
    io::Checkpoint part = sources[i] == 0 ? std::move(head) : load(sources[i]);
    if (part.state.step != mine.state.step || part.sharding.rank != sources[i])
      throw Error(str(where, ": part ", sources[i], " is not rank ", sources[i],
                      "'s shard of step ", mine.state.step,
                      " (a mixed or partly written checkpoint directory)"));
    auto take = [&](std::vector<io::NamedTensor>& from, std::vector<io::NamedTensor>& into,
                    bool optim) {
      for (io::NamedTensor& nt : from) {
        const Param* p = nullptr;
        if (optim) {
          auto it = param_of_state.find(nt.name);
          if (it != param_of_state.end()) p = it->second;
        } else {
          p = params_->find(nt.name);
        }
        if (p && same_shard(p->shard, nt.shard)) into.push_back(std::move(nt));
      }
    };
    take(part.params, mine.params, false);
    take(part.optim, mine.optim, true);
  }
  std::set<std::string> found_params;
  for (const io::NamedTensor& nt : mine.params) found_params.insert(nt.name);
  for (const Param* p : std::as_const(*params_).all()) {
    if (!found_params.count(p->name))
      throw Error(str("'", where, "' holds no tensor '", p->name, "'",
                      p->shard.defined() ? str(" for slice ", p->shard.start, "..",
                                               p->shard.start + p->shard.count - 1)
                                         : std::string(),
                      " for rank ", rank()));
  }
  load_tensors(mine);  // exactly this rank's parameters and their optimizer state now
}

bool Trainer::owns(const Param& p) const {
  if (p.expert && p.shard.defined()) return rank() < train_.ep;  // the first expert group
  if (p.shard.defined()) return true;                            // this rank's table columns
  return rank() == 0;                                            // replicated
}

io::Checkpoint Trainer::snapshot_owned() const {
  io::Checkpoint c = checkpoint(/*stream=*/true);
  std::erase_if(c.params, [&](const io::NamedTensor& t) { return !owns(*params_->find(t.name)); });
  c.optim.clear();
  for (StateTensor& t : optimizer_state())
    if (owns(*t.param)) {
      // --zero / flexmoe: the gathered logical tensor instead of this rank's part.
      if (auto it = logical_.find(t.tensor.name); it != logical_.end())
        t.tensor.tensor = it->second;
      t.tensor.shard = t.param->shard;
      // flexmoe under --shard-embedding: its slots' state gathered into logical experts, as
      // checkpoint() does for the values (rank 0 writes them).
      if (auto it = logical_.find(t.tensor.name); it != logical_.end())
        t.tensor.tensor = it->second;
      c.optim.push_back(std::move(t.tensor));
    }
  c.sharding.ep_size = static_cast<int>(train_.ep);
  c.sharding.rank = rank();
  c.sharding.shard_embedding = train_.shard_embedding;
  return c;
}

std::shared_ptr<const io::ExpertSource> Trainer::offloaded_source(const Param& p,
                                                                  const std::string& what) const {
  auto source = std::make_shared<io::ExpertSource>();
  source->shape = p.shape;
  source->dtype = what == "value" ? params_->dtype() : DType::f32;
  // The store outlives every checkpoint the trainer hands out for writing (save() is synchronous);
  // snapshot() gathers before returning, so its checkpoints hold no source.
  source->read = [store = store_.get(), param = &p, what](int64_t e) {
    return store->read(*param, e, what);
  };
  return source;
}

// The optimizer's tensors of every parameter in parameter order, the offloaded ones streamed
// from the store under the names optim::AdamW gives them.
std::vector<Trainer::StateTensor> Trainer::optimizer_state() const {
  std::vector<StateTensor> out;
  std::vector<optim::OptimizerTensor> resident = optimizer_->state();
  size_t next = 0;
  for (const Param* p : std::as_const(*params_).all()) {
    if (zero_ && zero_->covers(*p)) {  // sharded: save() and snapshot() gather them (logical_)
      for (const char* what : {"adam.m", "adam.v", "master"})
        if (std::string(what) != "master" || params_->dtype() != DType::f32)
          out.push_back({{str(what, ".", p->name), Tensor(), false}, p});
      continue;
    }
    if (!p->offloaded) {
      for (; next < resident.size() && resident[next].param == p; ++next)
        out.push_back({{resident[next].name, resident[next].tensor, resident[next].expert}, p});
      continue;
    }
    for (const char* what : {"adam.m", "adam.v", "master"}) {
      if (std::string(what) == "master" && params_->dtype() == DType::f32) continue;
      out.push_back({{str(what, ".", p->name), Tensor(), true, {}, offloaded_source(*p, what)}, p});
    }
  }
  return out;
}

io::StreamFilter Trainer::offloaded_filter() const {
  std::set<std::string> params, optim;
  for (const Param* p : std::as_const(*params_).all())
    if (p->offloaded) params.insert(p->name);
  for (const StateTensor& t : optimizer_state())
    if (t.tensor.streamed()) optim.insert(t.tensor.name);
  return [params = std::move(params), optim = std::move(optim)](bool is_optim,
                                                                const std::string& name) {
    return (is_optim ? optim : params).count(name) > 0;
  };
}

io::Checkpoint Trainer::checkpoint(bool stream) const {
  io::Checkpoint c;
  c.model_config = to_json(model_->config());
  c.train_config = to_json(train_);
  c.train_config.update(train_config_notes_);
  if (placement_) c.train_config["placement_state"] = placement_->state();
  if (tasks_) c.train_config["tasks_state"] = tasks_->state();
  c.provenance = provenance_;
  c.tokenizer = tokenizer_;
  for (const Param* p : std::as_const(*params_).all()) {
    if (p->offloaded)
      c.params.push_back({p->name, Tensor(), true, p->shard, offloaded_source(*p, "value")});
    else
      c.params.push_back({p->name, p->value, p->expert, p->shard});
  }
  for (StateTensor& t : optimizer_state()) c.optim.push_back(std::move(t.tensor));
  for (std::vector<io::NamedTensor>* group : {&c.params, &c.optim})
    for (io::NamedTensor& nt : *group)
      if (auto it = logical_.find(nt.name); it != logical_.end()) nt.tensor = it->second;
  if (!stream)
    for (std::vector<io::NamedTensor>* group : {&c.params, &c.optim})
      for (io::NamedTensor& nt : *group) {
        nt.tensor = nt.whole();
        nt.source.reset();
      }
  c.state.step = step_;
  c.state.tokens_seen = tokens_seen_;
  c.state.data_cursor = sampler_ ? sampler_->cursor() : 0;  // --tasks: in tasks_state
  c.state.seed = train_.seed;
  c.sharding.world_size = world_size();  // data parallel: every rank holds every parameter
  return c;
}

io::Checkpoint Trainer::snapshot() const {
  logical_ = logical_experts(-1);  // flexmoe: the slots gathered into logical experts
  gather_dense_state();
  io::Checkpoint c = checkpoint(/*stream=*/false);
  logical_.clear();
  return c;
}

// --zero: the dense optimizer tensors, whole, for the checkpoint (collective).
void Trainer::gather_dense_state() const {
  if (!zero_) return;
  for (const optim::OptimizerTensor& t : zero_->gather_state()) logical_[t.name] = t.tensor;
  for (const auto& [name, value] : zero_->gather_values()) logical_[name] = value;  // stage 3
}

void Trainer::restore_placement(const io::Checkpoint& ckpt, const std::string& source) {
  if (!placement_) return;
  std::string note;
  try {
    note = placement_->load_state(ckpt.train_config.is_object()
                                      ? ckpt.train_config.value("placement_state", nlohmann::json())
                                      : nlohmann::json());
  } catch (const Error& e) {  // a missing key, a map that breaks VExpertMap's rules
    if (source.empty()) throw;
    throw Error(str(io::attribute_place("checkpoint", source, "train_config"), ": ", e.what()));
  }
  if (!note.empty() && rank() == 0) MOE_LOG_WARN("resume: ", note);
  sync_holders();
}

std::string Trainer::save(const std::string& dir) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(str("cannot create output directory '", dir, "': ", ec.message()));
  // flexmoe: rank 0 writes every logical expert, gathered from the ranks' slots.
  logical_ = logical_experts(0);
  gather_dense_state();
  struct Clear {
    std::map<std::string, Tensor>& logical;
    ~Clear() { logical.clear(); }
  } clear{logical_};
  if (sharded()) return save_sharded(dir);
  const io::CheckpointDir run(dir);
  const fs::path path = run.step(step_);
  if (rank() != 0) {  // parameters are identical on every rank: rank 0 writes
    world_->barrier();
    return path.string();
  }
  io::Checkpoint c = checkpoint(/*stream=*/true);
  check_saveable(c, step_);
  io::save_checkpoint(path.string(), c);
  run.point_last(step_);  // last.h5 -> the newest checkpoint
  if (world_size() > 1) world_->barrier();
  return path.string();
}

// Every rank writes the file of what it owns (each file atomic), the ranks agree that all of them
// succeeded, and only then does `last` move to the new directory: a failure on any rank leaves
// the previous checkpoint the last one, and every rank throws.
std::string Trainer::save_sharded(const std::string& dir) const {
  namespace fs = std::filesystem;
  const io::CheckpointDir run(dir);
  const fs::path step_dir = run.step(step_, /*sharded=*/true);
  std::string error;
  if (rank() == 0) {
    std::error_code ec;
    fs::remove_all(step_dir, ec);  // files of an earlier run of another layout must not mix in
    fs::create_directories(step_dir, ec);
    if (ec) error = str("cannot create '", step_dir.string(), "': ", ec.message());
  }
  Tensor failed = Tensor::from_vector({1}, std::vector<int32_t>{error.empty() ? 0 : 1});
  world_->all_reduce(failed, comm::ReduceOp::max);
  if (failed.data<int32_t>()[0])
    throw Error(error.empty() ? str("rank 0 could not create ", step_dir.string()) : error);
  bool writes = false;
  for (const Param* p : std::as_const(*params_).all()) writes |= owns(*p);
  try {
    if (writes) {
      io::Checkpoint c = snapshot_owned();
      check_saveable(c, step_);
      io::save_checkpoint(io::CheckpointDir::rank_file(step_dir.string(), rank()), c);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  failed.data<int32_t>()[0] = error.empty() ? 0 : rank() + 1;
  world_->all_reduce(failed, comm::ReduceOp::max);
  if (const int bad = failed.data<int32_t>()[0]) {
    // Every rank is past its write: the directory of the failed save (empty, or holding the shards
    // that did fit) goes, so that no step directory passes for a checkpoint (issue 45); the
    // barrier keeps a rank that ends the job on this error from ending rank 0 before that.
    std::error_code ec;
    if (rank() == 0) fs::remove_all(step_dir, ec);
    world_->barrier();
    throw Error(error.empty() ? str("rank ", bad - 1, " could not write its shard of ",
                                    step_dir.string(), "; the previous checkpoint stays the last")
                              : error);
  }
  if (rank() == 0) run.point_last(step_, /*sharded=*/true);
  world_->barrier();
  return step_dir.string();
}

}  // namespace moe::train
