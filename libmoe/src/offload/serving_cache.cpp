// The inference expert cache (see moe/offload/serving_cache.h).
// Shapes: L MoE layers, E experts of a layer, C cache slots, P pinned experts.
//
// Single-threaded by design: nn::Experts acquires one expert at a time from the compute thread,
// and a miss reads its chunk there. The policy (offload::ExpertCache) owns which key sits in which
// slot; this file owns the slots' bytes, the pinned experts and the statistics. A slot is pinned in
// the policy from its expert's first acquire until another layer is requested, so neither the
// expert being computed nor one the layer's next token block needs again is the victim (LFU would
// otherwise evict a layer's newly read experts, whose counts are the lowest, block after block).
// When every slot is held so, a miss is served uncached (the policy's bypass).
//
// Prefetch (a trace's transitions given): when layer l is requested, its routed experts already
// cached are held first (so nothing the layer is about to compute is displaced), then the policy
// admits the estimate of layer l+1 (ExpertCache::admit: not counted as accesses) and the loader
// thread reads the ones not cached into their slots while layer l computes. Those slots are held
// through layer l+1. The policy is only ever called from the compute thread; the loader writes
// only a slot marked loading, which is held, so no miss can take it. `mu` guards the job queue,
// the loading and failed marks and the read counters; acquire waits on a slot still loading. A
// failed prefetch leaves its slot marked: the expert is read again, on the compute thread, when
// it is acquired (and its error thrown then, if it fails again).
//
// The router's prediction (ServingCacheConfig::router) takes the trace estimate's place: predict()
// sets estimate[l+1] and the reads go as above, the most likely first (when the slots run out,
// the rest are not read). From the input source it comes before layer l's
// request, which then prefetches it; from the output source it comes after layer l computed, and
// is prefetched at once, into slots layer l no longer holds (the slots are held through layer l+1
// alike: request(l+1) takes them).
#include "moe/offload/serving_cache.h"

#include <omp.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <numeric>
#include <thread>

#include "moe/arena.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "moe/io/finite.h"
#include "moe/models/memory.h"
#include "moe/models/transformer.h"
#include "moe/offload/cache_sim.h"
#include "moe/settings.h"
#include "offload/checkpoint_experts.h"

namespace moe::offload {

struct ServingCache::Impl {
  struct Layer {
    int64_t block = 0, experts = 0;
    std::vector<std::string> names;
    std::vector<int> field;            // which ExpertTensors member (0 w1 .. 5 b3)
    std::vector<Shape> one;            // one expert's shape, [1, ...]
    std::vector<Shape> global;         // the checkpoint tensor's shape
    std::vector<int64_t> first;        // the checkpoint index of the layer's expert 0
    std::vector<ExpertFormat> format;  // how each is stored and held (set by start)
  };
  // One expert's tensors as held, sized for the largest layer's expert: a field's floating values
  // in `fields`, its quantised bytes (a quantised checkpoint's matrices) in `bytes`.
  struct Holder {
    Tensor fields[nn::kExpertFields];
    Tensor bytes[nn::kExpertFields];
  };

  std::string path;
  ServingCacheConfig config;
  bool started = false;
  std::vector<Layer> layers;
  std::vector<DType> held;           // per field: the dtype it is held in
  std::vector<int64_t> field_elems;  // per field: the largest layer's one-expert elements
  std::vector<int64_t> field_bytes;  // per field: the largest layer's one-expert quantised bytes
  std::unique_ptr<ExpertCache> cache;
  std::vector<Holder> slots;                         // [C]
  std::vector<std::vector<int32_t>> pinned_index;    // [L][E]: -1 or [P]
  std::vector<Holder> pinned;                        // [P]
  Holder bypass;                                     // a miss not admitted
  std::vector<ExpertKey> sequence;                   // unpinned accesses, for Belady
  std::vector<std::vector<char>> estimate;           // [L]: the next-layer estimate of each layer
  std::vector<std::vector<int32_t>> estimate_order;  // [L]: its experts, the first read first
  ServingCacheStats stats;
  int last_layer = -1;
  // The experts the current layer acquired, pinned in the policy until another layer (or pass)
  // begins: the token blocks of one batch acquire them again (MoELayer::experts_by_blocks).
  std::vector<ExpertKey> layer_held;
  std::vector<ExpertKey> next_held;  // prefetched for the next layer, held through it

  mutable std::mutex mu;
  std::condition_variable changed;
  std::deque<std::pair<ExpertKey, int32_t>> jobs;  // prefetches to read: key, slot
  // [C]: reads queued or running for the slot (a slot admitted again while an earlier prefetch's
  // read is still queued has two), and whether a prefetch filled it.
  std::vector<int> loading;
  std::vector<char> prefetched;
  std::vector<std::string> failed;  // [C]: a prefetch's error
  bool stop = false;
  std::thread loader;

  bool prefetching() const {
    return (config.prefetch && !config.transitions.empty()) ||
           config.router.source != nn::LookaheadSource::none;
  }

  void drop_layer_held() {
    for (const ExpertKey& key : layer_held) cache->unpin(key);
    layer_held.clear();
  }

  DType held_dtype(int field, const Layer& layer, size_t j) const {
    const bool matrix = field < 3 && (config.dtype == DType::bf16 || config.dtype == DType::f16) &&
                        io::quantizable(layer.names[j], layer.global[j]);
    return matrix ? config.dtype : DType::f32;
  }

  int64_t one_expert_bytes() const {
    int64_t bytes = 0;
    for (int f = 0; f < nn::kExpertFields; ++f)
      bytes += field_elems[f] * int64_t(dtype_size(held[f])) + field_bytes[f];
    return bytes;
  }

  Holder allocate(const char* name) const {
    Holder h;
    for (int f = 0; f < nn::kExpertFields; ++f) {
      if (field_elems[f] > 0) h.fields[f] = Tensor::zeros({field_elems[f]}, held[f]).set_name(name);
      if (field_bytes[f] > 0)
        h.bytes[f] = Tensor::zeros({field_bytes[f]}, DType::u8).set_name(name);
    }
    return h;
  }

  // The formats of every layer's tensors, from the checkpoint's model_config.
  std::vector<std::vector<ExpertFormat>> read_formats() const {
    std::vector<std::vector<ExpertFormat>> out;
    if (layers.empty()) return out;
    const nlohmann::json model_config = io::read_model_config(path);
    for (const Layer& layer : layers) {
      out.emplace_back();
      for (size_t j = 0; j < layer.names.size(); ++j)
        out.back().push_back(expert_format(model_config, path, layer.names[j], layer.global[j]));
    }
    return out;
  }

  // Views of holder h shaped as layer m's expert tensors.
  nn::ExpertTensors views(const Holder& h, int64_t m) const {
    const Layer& layer = layers[static_cast<size_t>(m)];
    nn::ExpertTensors v;
    const auto out = v.fields();
    for (size_t j = 0; j < layer.names.size(); ++j) {
      const int f = layer.field[j];
      const ExpertFormat& format = layer.format[j];
      const Shape shape = format.held_shape(layer.one[j]);
      *out[f] = format.quantised()
                    ? h.bytes[f].rows(0, shape_numel(shape)).reshape(shape).view_as(format.held)
                    : h.fields[f].rows(0, shape_numel(shape)).reshape(shape);
    }
    return v;
  }

  // Reads expert e of layer m from the checkpoint into h, checked as the resident loader checks it.
  int64_t read(Holder& h, int64_t m, int64_t e) const {
    HeapScope heap;  // the chunks read are temporaries of the file, not of the pass's arena
    const Layer& layer = layers[static_cast<size_t>(m)];
    int64_t bytes = 0;
    nn::ExpertTensors v = views(h, m);
    const auto dst = v.fields();
    for (size_t j = 0; j < layer.names.size(); ++j) {
      const std::string& name = layer.names[j];
      const int64_t index = layer.first[j] + e;
      const Tensor chunk = io::read_expert(path, name, index);
      put_expert(layer.format[j], chunk, *dst[layer.field[j]], path, name, index);
      bytes += static_cast<int64_t>(chunk.nbytes());
    }
    return bytes;
  }

  void count_read(int64_t bytes) {
    std::lock_guard lk(mu);
    stats.bytes_read += bytes;
    ++stats.experts_read;
  }

  void check_layer(int layer) const {
    MOE_CHECK(started, "expert cache: start() it before the first forward pass");
    MOE_CHECK(layer >= 0 && layer < static_cast<int>(layers.size()), "expert cache: no MoE layer ",
              layer, " (", layers.size(), " layers)");
  }

  void check_checkpoint();
  void size_fields();
  void check_tables() const;
  void pin_popular(int64_t count);
  void count_estimate(int layer, std::span<const int32_t> experts);
  void estimate_next(int layer, std::span<const int32_t> experts, std::span<const int32_t> rows);
  void hold_cached(int layer, std::span<const int32_t> experts);
  void prefetch(int layer);
  std::string wait_loaded(int32_t slot, bool hit);
  void loop();
};

ServingCache::ServingCache(std::string checkpoint) : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(checkpoint);
}

ServingCache::~ServingCache() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->changed.notify_all();
  if (impl_->loader.joinable()) impl_->loader.join();
}

int ServingCache::add_layer(const nn::ExpertParams& params) {
  Impl& c = *impl_;
  MOE_CHECK(!c.started, "expert cache: a MoE layer was added after start()");
  Impl::Layer layer;
  layer.experts = params.experts();
  const auto tensors = params.fields();
  for (int field = 0; field < nn::kExpertFields; ++field) {
    const Param* p = tensors[field];
    if (!p) continue;
    MOE_CHECK(p->offloaded && !p->shape.empty(), "expert cache: expert parameter '", p->name,
              "' is not offloaded to the cache (build the model with it as its expert store)");
    MOE_CHECK(!p->shard.defined() || p->shard.dim == 0, "expert cache: '", p->name,
              "' is sliced along dimension ", p->shard.dim, ", not its experts");
    if (layer.names.empty()) layer.block = block_of_name(p->name);
    layer.names.push_back(p->name);
    layer.field.push_back(field);
    Shape one = p->shape;
    one[0] = 1;
    layer.one.push_back(one);
    layer.global.push_back(p->shard.defined() ? p->shard.global : p->shape);
    layer.first.push_back(p->shard.defined() ? p->shard.start : 0);
  }
  c.layers.push_back(std::move(layer));
  return static_cast<int>(c.layers.size() - 1);
}

void ServingCache::request(int layer, std::span<const int32_t> experts,
                           std::span<const int32_t> rows, nn::Pass pass) {
  Impl& c = *impl_;
  MOE_CHECK(pass == nn::Pass::forward, "expert cache: MoE layer ", layer,
            ": the cache serves forward passes only (inference); train with ",
            flag_for(Setting::offload));
  c.check_layer(layer);
  // A new forward pass: the layers start again (token blocks of one layer repeat it).
  const bool new_pass =
      c.last_layer < 0 || layer < c.last_layer || (layer == c.last_layer && c.layers.size() == 1);
  if (new_pass && c.last_layer >= 0) c.cache->end_step();  // LFU's decay counts passes
  if (new_pass) ++c.stats.passes;
  if (new_pass || layer != c.last_layer) {
    c.drop_layer_held();
    c.layer_held.swap(c.next_held);  // this layer's prefetched experts
  }
  c.last_layer = layer;
  c.hold_cached(layer, experts);
  c.count_estimate(layer, experts);
  switch (c.config.router.source) {
    case nn::LookaheadSource::none:  // the trace's estimate, made now
      c.estimate_next(layer, experts, rows);
      c.prefetch(layer + 1);
      break;
    case nn::LookaheadSource::input:  // predicted before this request
      c.prefetch(layer + 1);
      break;
    case nn::LookaheadSource::output:  // predicted, and prefetched, once this layer is done
      break;
  }
}

nn::Lookahead ServingCache::lookahead() const {
  return impl_->started ? impl_->config.router : nn::Lookahead{};
}

void ServingCache::predict(int layer, std::span<const int32_t> experts) {
  Impl& c = *impl_;
  c.check_layer(layer);
  std::vector<char>& chosen = c.estimate[static_cast<size_t>(layer)];
  chosen.assign(static_cast<size_t>(c.layers[static_cast<size_t>(layer)].experts), 0);
  for (int32_t e : experts) chosen.at(static_cast<size_t>(e)) = 1;
  c.estimate_order[static_cast<size_t>(layer)].assign(experts.begin(), experts.end());
  if (c.config.router.source != nn::LookaheadSource::output) return;
  c.drop_layer_held();  // the layer before is done (all its token blocks): its slots may go
  c.prefetch(layer);
}

// Holds the layer's routed experts that are cached, so that prefetches do not displace them.
void ServingCache::Impl::hold_cached(int layer, std::span<const int32_t> experts) {
  if (!prefetching()) return;
  for (int32_t e : experts) {
    const ExpertKey key{layer, e};
    if (!cache->contains(key) || cache->pins(key) > 0) continue;
    cache->pin(key);
    layer_held.push_back(key);
  }
}

// Admits the estimate of `layer` and queues the reads of those not cached (see the top).
void ServingCache::Impl::prefetch(int layer) {
  if (!prefetching() || layer >= static_cast<int>(layers.size())) return;
  for (int32_t e : estimate_order[static_cast<size_t>(layer)]) {
    const ExpertKey key{layer, e};
    if (pinned_index[static_cast<size_t>(layer)][static_cast<size_t>(e)] >= 0 ||
        cache->pins(key) > 0)
      continue;
    const Lookup r = cache->admit(key);
    if (r.bypass()) return;  // every slot is held
    cache->pin(key);
    next_held.push_back(key);
    if (r.hit) continue;
    {
      std::lock_guard lk(mu);
      ++loading[static_cast<size_t>(r.slot)];
      stats.prefetch_wasted += prefetched[static_cast<size_t>(r.slot)];  // read over, unused
      prefetched[static_cast<size_t>(r.slot)] = 1;
      jobs.emplace_back(key, r.slot);
      ++stats.prefetches;
    }
    changed.notify_all();
  }
}

// Waits until `slot` is not being read by the loader; returns the error of its last read ("" none).
// A hit on a slot a prefetch filled is a prefetch hit; a miss read over one, a prefetch wasted.
std::string ServingCache::Impl::wait_loaded(int32_t slot, bool hit) {
  std::unique_lock lk(mu);
  changed.wait(lk, [&] { return loading[static_cast<size_t>(slot)] == 0; });
  if (hit && prefetched[static_cast<size_t>(slot)] && failed[static_cast<size_t>(slot)].empty())
    ++stats.prefetch_hits;
  if (!hit) stats.prefetch_wasted += prefetched[static_cast<size_t>(slot)];
  prefetched[static_cast<size_t>(slot)] = 0;
  return failed[static_cast<size_t>(slot)];
}

void ServingCache::Impl::loop() {
  omp_set_num_threads(1);  // a conversion here must not take the compute threads' cores
  std::unique_lock lk(mu);
  for (;;) {
    changed.wait(lk, [&] { return stop || !jobs.empty(); });
    if (stop) return;
    const auto [key, slot] = jobs.front();
    jobs.pop_front();
    lk.unlock();
    std::string failure;
    int64_t bytes = 0;
    try {
      bytes = read(slots[static_cast<size_t>(slot)], key.layer, key.expert);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    lk.lock();
    --loading[static_cast<size_t>(slot)];
    failed[static_cast<size_t>(slot)] = failure;
    if (failure.empty()) {
      stats.bytes_read += bytes;
      ++stats.experts_read;
    }
    changed.notify_all();
  }
}

// Counts how many of this layer's routed experts its estimate (the trace's or the router's) held.
void ServingCache::Impl::count_estimate(int layer, std::span<const int32_t> experts) {
  const std::vector<char>& estimated = estimate[static_cast<size_t>(layer)];
  if (layer == 0 || estimated.empty()) return;
  std::lock_guard lk(mu);
  stats.estimate_routed += static_cast<int64_t>(experts.size());
  for (int32_t e : experts) stats.estimate_hits += estimated[static_cast<size_t>(e)];
}

// Scores layer+1's experts by the transition counts of this layer's routed experts, weighted by
// their rows, and keeps as many of the best as this layer routed to.
void ServingCache::Impl::estimate_next(int layer, std::span<const int32_t> experts,
                                       std::span<const int32_t> rows) {
  if (config.transitions.empty()) return;
  const size_t l = static_cast<size_t>(layer);
  if (l + 1 >= layers.size()) return;
  const int64_t next_experts = layers[l + 1].experts;
  std::vector<double> score(static_cast<size_t>(next_experts), 0.0);
  for (size_t i = 0; i < experts.size(); ++i) {
    const std::vector<double>& to = config.transitions[l][static_cast<size_t>(experts[i])];
    for (int64_t f = 0; f < next_experts; ++f)
      score[static_cast<size_t>(f)] += double(rows[i]) * to[static_cast<size_t>(f)];
  }
  std::vector<int32_t> order(static_cast<size_t>(next_experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)];
  });
  std::vector<char>& chosen = estimate[l + 1];
  chosen.assign(static_cast<size_t>(next_experts), 0);
  const size_t keep = std::min(experts.size(), order.size());
  for (size_t i = 0; i < keep; ++i) chosen[static_cast<size_t>(order[i])] = 1;
  std::vector<int32_t>& read_order = estimate_order[l + 1];  // in expert order
  read_order.clear();
  for (size_t e = 0; e < chosen.size(); ++e)
    if (chosen[e]) read_order.push_back(static_cast<int32_t>(e));
}

nn::ExpertTensors ServingCache::acquire(int layer, int expert) {
  Impl& c = *impl_;
  c.check_layer(layer);
  const Impl::Layer& l = c.layers[static_cast<size_t>(layer)];
  MOE_CHECK(expert >= 0 && expert < l.experts, "expert cache: MoE layer ", layer, " has no expert ",
            expert);
  ++c.stats.accesses;
  if (int32_t p = c.pinned_index[static_cast<size_t>(layer)][static_cast<size_t>(expert)]; p >= 0) {
    ++c.stats.pinned_hits;
    return c.views(c.pinned[static_cast<size_t>(p)], layer);
  }
  const ExpertKey key{layer, expert};
  c.sequence.push_back(key);
  const Lookup r = c.cache->access(key);
  Impl::Holder& h = r.bypass() ? c.bypass : c.slots[static_cast<size_t>(r.slot)];
  // A prefetched slot may still be loading, or its read may have failed: then it is read here.
  const bool failed = !r.bypass() && !c.wait_loaded(r.slot, r.hit).empty();
  if (!r.hit || failed) {
    try {
      c.count_read(c.read(h, layer, expert));
      if (failed) {
        std::lock_guard lk(c.mu);
        c.failed[static_cast<size_t>(r.slot)].clear();
      }
    } catch (const std::exception& e) {
      if (!r.bypass() && c.cache->pins(key) == 0) c.cache->erase(key);  // not the expert's bytes
      throw Error(str("expert cache: reading expert ", expert, " of MoE layer ", layer, " (block ",
                      l.block, "): ", e.what()));
    }
  }
  if (!r.bypass() && c.cache->pins(key) == 0) {  // held until the layer is done
    c.cache->pin(key);
    c.layer_held.push_back(key);
  }
  return c.views(h, layer);
}

// The expert stays pinned with the rest of its layer's (see Impl::layer_held).
void ServingCache::release(int, int) {}

nn::ExpertTensors ServingCache::gradients(int layer, int) {
  throw Error(str("expert cache: MoE layer ", layer, ": the cache holds no gradients"));
}

void ServingCache::gradient_done(int layer, int) {
  throw Error(str("expert cache: MoE layer ", layer, ": the cache holds no gradients"));
}

// The checkpoint must hold every expert tensor with the model's whole shape, stored per expert, in
// a floating-point dtype or as the rows of the format its model_config names (read here).
void ServingCache::Impl::check_checkpoint() {
  (void)io::list_params(path);  // a file that is no checkpoint is named as such first
  std::vector<std::vector<ExpertFormat>> by_layer = read_formats();
  for (size_t m = 0; m < layers.size(); ++m) layers[m].format = std::move(by_layer[m]);
  std::vector<std::pair<std::string, Shape>> tensors;
  for (const Layer& layer : layers)
    for (size_t j = 0; j < layer.names.size(); ++j)
      tensors.emplace_back(layer.names[j], layer.global[j]);
  std::vector<ExpertFormat> formats;
  for (const Layer& layer : layers)
    formats.insert(formats.end(), layer.format.begin(), layer.format.end());
  check_expert_tensors(path, tensors, formats, "expert cache");
}

// What a holder's fields hold, sized for the largest layer's expert: floating values in `held`
// dtypes, quantised bytes.
void ServingCache::Impl::size_fields() {
  held.assign(nn::kExpertFields, DType::f32);
  field_elems.assign(nn::kExpertFields, 0);
  field_bytes.assign(nn::kExpertFields, 0);
  for (const Layer& layer : layers)
    for (size_t j = 0; j < layer.names.size(); ++j) {
      const size_t f = static_cast<size_t>(layer.field[j]);
      const ExpertFormat& format = layer.format[j];
      const int64_t n = shape_numel(format.held_shape(layer.one[j]));
      if (format.quantised()) {
        field_bytes[f] = std::max(field_bytes[f], n);
        continue;
      }
      held[f] = held_dtype(layer.field[j], layer, j);
      field_elems[f] = std::max(field_elems[f], n);
    }
}

// The popularity and transition tables must have the model's layers and experts.
void ServingCache::Impl::check_tables() const {
  const size_t L = layers.size();
  if (!config.popularity.empty()) {
    MOE_CHECK(config.popularity.size() == L, "the routing trace has ", config.popularity.size(),
              " MoE layers, the model ", L);
    for (size_t l = 0; l < L; ++l)
      MOE_CHECK(int64_t(config.popularity[l].size()) == layers[l].experts,
                "the routing trace's MoE layer ", l, " has ", config.popularity[l].size(),
                " experts, the model's ", layers[l].experts);
  }
  if (config.transitions.empty()) return;
  MOE_CHECK(config.transitions.size() + 1 == L, "the routing trace's transitions cover ",
            config.transitions.size() + 1, " MoE layers, the model has ", L);
  for (size_t l = 0; l + 1 < L; ++l) {
    MOE_CHECK(int64_t(config.transitions[l].size()) == layers[l].experts,
              "the routing trace's transitions from MoE layer ", l, " do not match its experts");
    for (const auto& to : config.transitions[l])
      MOE_CHECK(int64_t(to.size()) == layers[l + 1].experts,
                "the routing trace's transitions to MoE layer ", l + 1,
                " do not match its experts");
  }
}

// Pins the `count` experts with the largest share of their layer's routed tokens (ties: lower
// layer, then lower expert), reading each once.
void ServingCache::Impl::pin_popular(int64_t count) {
  struct Candidate {
    double share;
    int32_t layer, expert;
  };
  std::vector<Candidate> all;
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::vector<double>& counts = config.popularity[l];
    const double total = std::accumulate(counts.begin(), counts.end(), 0.0);
    for (size_t e = 0; e < counts.size(); ++e)
      if (counts[e] > 0)
        all.push_back({counts[e] / total, static_cast<int32_t>(l), static_cast<int32_t>(e)});
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const Candidate& a, const Candidate& b) { return a.share > b.share; });
  all.resize(std::min<size_t>(all.size(), static_cast<size_t>(count)));
  for (const Candidate& p : all) {
    pinned_index[static_cast<size_t>(p.layer)][static_cast<size_t>(p.expert)] =
        static_cast<int32_t>(pinned.size());
    pinned.push_back(allocate("expert_cache.pinned"));
    count_read(read(pinned.back(), p.layer, p.expert));
  }
  stats.pinned = static_cast<int64_t>(pinned.size());
}

void ServingCache::start(const ServingCacheConfig& config) {
  Impl& c = *impl_;
  MOE_CHECK(!c.started, "expert cache: started twice");
  MOE_CHECK(!ArenaScope::current(),
            "expert cache: start it outside an ArenaScope (its slots must outlive every step)");
  MOE_CHECK(config.dtype == DType::f32 || config.dtype == DType::bf16 || config.dtype == DType::f16,
            "expert cache: the model's weights are ", dtype_name(config.dtype),
            "; the cache holds f32, bf16 or f16 experts");
  MOE_USAGE_CHECK(config.pin_share >= 0 && config.pin_share <= 1, "expert cache: pinned share ",
                  config.pin_share, " of the budget: must be in [0, 1]");
  MOE_USAGE_CHECK(config.router.margin >= 0, "expert cache: a prediction margin of ",
                  config.router.margin, " experts a token: must be 0 or more");
  c.config = config;
  c.check_tables();
  if (!c.layers.empty()) c.check_checkpoint();
  c.size_fields();
  const int64_t one = c.one_expert_bytes(), total = expert_bytes(config.dtype);
  MOE_USAGE_CHECK(c.layers.empty() || config.budget_bytes >= one, flag_for(Setting::expert_budget),
                  " ", config.budget_bytes, " bytes is smaller than one expert (", one,
                  " bytes as held)");
  const int64_t all = total / std::max<int64_t>(1, one);
  int64_t capacity = std::min(all, config.budget_bytes / std::max<int64_t>(1, one));
  int64_t pin =
      config.popularity.empty() ? 0 : static_cast<int64_t>(double(capacity) * config.pin_share);
  pin = std::min(pin, capacity - 1);  // at least one slot stays a cache
  check_free_memory(double(capacity) * double(one),
                    str(flag_for(Setting::expert_budget), ": ", capacity, " experts of ",
                        format_bytes(double(one))));
  c.pinned_index.clear();  // a start() refused part-way may be made again
  c.pinned.clear();
  c.slots.clear();
  c.stats = ServingCacheStats{};
  c.stats.expert_bytes = one;
  for (const Impl::Layer& layer : c.layers)
    c.pinned_index.emplace_back(static_cast<size_t>(layer.experts), -1);
  c.estimate.assign(c.layers.size(), {});
  c.estimate_order.assign(c.layers.size(), {});
  if (pin > 0) c.pin_popular(pin);
  const int64_t slots = std::max<int64_t>(1, capacity - c.stats.pinned);
  CacheConfig cc;
  cc.policy = config.policy;
  cc.capacity = slots;
  cc.lfu = config.lfu;
  c.cache = std::make_unique<ExpertCache>(cc);
  for (int64_t s = 0; s < slots; ++s) c.slots.push_back(c.allocate("expert_cache.slot"));
  c.loading.assign(static_cast<size_t>(slots), 0);
  c.prefetched.assign(static_cast<size_t>(slots), 0);
  c.failed.assign(static_cast<size_t>(slots), "");
  c.bypass = c.allocate("expert_cache.bypass");
  c.stats.slots = slots;
  if (c.prefetching()) c.loader = std::thread([impl = impl_.get()] { impl->loop(); });
  c.started = true;
}

ServingCacheStats ServingCache::stats() const {
  const Impl& c = *impl_;
  ServingCacheStats s;
  {
    std::lock_guard lk(c.mu);
    s = c.stats;
  }
  if (!c.cache) return s;
  s.cache = c.cache->stats();
  s.belady_hits = c.sequence.empty() ? 0 : belady_hits(c.sequence, c.cache->capacity());
  return s;
}

int64_t ServingCache::moe_layers() const { return static_cast<int64_t>(impl_->layers.size()); }

int64_t ServingCache::expert_bytes(DType dtype) const {
  const Impl& c = *impl_;
  const std::vector<std::vector<ExpertFormat>> formats = c.read_formats();
  int64_t total = 0;
  for (size_t m = 0; m < c.layers.size(); ++m) {
    const Impl::Layer& layer = c.layers[m];
    for (size_t j = 0; j < layer.names.size(); ++j) {
      const ExpertFormat& format = formats[m][j];
      if (format.quantised()) {  // its bytes as held
        total += shape_numel(format.held_shape(layer.one[j])) * layer.experts;
        continue;
      }
      const bool matrix = layer.field[j] < 3 && (dtype == DType::bf16 || dtype == DType::f16) &&
                          io::quantizable(layer.names[j], layer.global[j]);
      total += shape_numel(layer.one[j]) * layer.experts *
               int64_t(dtype_size(matrix ? dtype : DType::f32));
    }
  }
  return total;
}

std::vector<int64_t> ServingCache::experts_per_layer() const {
  std::vector<int64_t> out;
  for (const Impl::Layer& layer : impl_->layers) out.push_back(layer.experts);
  return out;
}

bool ServingCache::pinned(int layer, int expert) const {
  const Impl& c = *impl_;
  return !c.pinned_index.empty() &&
         c.pinned_index.at(static_cast<size_t>(layer)).at(static_cast<size_t>(expert)) >= 0;
}

}  // namespace moe::offload
