// The tiered training store (see moe/offload/tiered_store.h): records in a RecordTier, fp32
// weights in device slots filled by a loader thread, expert-wise AdamW on an optimizer thread.
//
// Locking: one mutex guards the slot table, the pass plan and the per-expert flags; the copies
// into slots, the AdamW updates and the tier's I/O run outside it. Each expert is touched by one
// thread at a time by construction: the loader uploads an expert only before compute acquires it
// (compute waits for the upload), the optimizer updates it only after compute's gradient_done,
// and finish_step waits for the optimizer thread before the next step can upload anything.
//
// On a CUDA device (device_copies.h) compute's side of an expert is queued, not finished, when
// its call returns; events order the copies after it. A gradient buffer goes from gradients()
// to gradient_done() on the compute thread, then to the optimizer thread, which waits for its
// download, moves it into the record (a "drain") and frees it; an expert with a drain pending
// is not handed out again (gradients() waits) and complete_gradients waits for all of them.
#include "moe/offload/tiered_store.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "moe/cuda.h"
#include "moe/log.h"
#include "moe/models/memory.h"
#include "moe/ops/core.h"
#include "moe/settings.h"
#include "moe/timer.h"
#include "offload/device_copies.h"
#include "offload/record.h"

namespace moe::offload {
namespace {

struct ExpertState {
  int slot = -1;           // device slot holding its fp32 weights, or -1
  bool uploading = false;  // the slot is being filled
  int64_t grad_step = -1;  // the step whose gradient the record holds (else: stale, zero it)
  int64_t updated_step = -1;
  int64_t finalized_step = -1;  // the step whose gradient was scaled and squared-summed
  bool pinned = false;          // among the busiest of the last step: keeps its slot when it can
  int64_t tokens = 0, previous_tokens = 0;  // rows this step / last step (forward)
  std::shared_ptr<std::byte> grad_record;   // pinned from gradients() to gradient_done()
  int grad_buffer = -1;                     // CUDA: its device gradient buffer, likewise
  int drains = 0;                           // CUDA: downloads not yet moved into the record
};

struct Layer {
  int64_t experts = 0;
  StoreLayout layout;
  std::vector<ExpertState> state;
  std::vector<double> square_sums;  // [tensor * experts + expert], this step
};

struct Slot {
  std::shared_ptr<std::byte> data;
  int layer = -1;
  int64_t expert = -1;
  int users = 0;
  uint64_t last_use = 0;
};

struct Key {
  int layer;
  int64_t expert;
};

// Runs f on a worker thread's behalf: what it threw, as text ("" when nothing).
template <class F>
std::string attempt(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

struct TieredStore::Impl {
  const ParamSet& params;
  StoreConfig config;
  std::vector<Layer> layers;
  std::map<const Param*, std::pair<int, size_t>> where;  // parameter -> (layer, tensor index)
  std::unique_ptr<RecordTier> tier;
  std::unique_ptr<DeviceCopies> device;  // CUDA slots and gradient buffers; null on the CPU
  std::vector<Slot> slots;
  bool started = false;

  std::mutex mu;
  std::condition_variable changed;
  // The pass in progress: the experts it will acquire, in order; cursor: the next to acquire;
  // next_load: the next the loader looks at (it stays within prefetch_depth of the cursor).
  std::vector<Key> plan;
  bool plan_backward = false;  // the pass in progress is a backward pass
  uint64_t plan_number = 0;    // request() count: the loader notices a new plan
  size_t cursor = 0, next_load = 0;
  Key waiting{-1, -1};  // the expert compute waits for in acquire
  // An expert's AdamW step, and (CUDA) first the drain of its downloaded gradient buffer.
  struct Update {
    Key key;
    float clip_scale = 1.0f;
    bool stale_gradient = false;
    bool during_backward = true;
    int drain = -1;         // CUDA: the gradient buffer to move into the record first
    bool finalize = false;  // after the drain: the gradient is final (scale, squared sums)
    bool adamw = true;      // run the update (false: a drain only)
  };
  std::deque<Update> optimizer_queue;
  int optimizer_busy = 0;
  int draining = 0;  // CUDA: drains queued or running
  bool stopping = false;
  uint64_t clock = 0;
  StepInfo step_info;
  int64_t step = 0;     // begin_step count
  std::string failure;  // a worker's error, thrown by the next call on the compute thread
  StoreStats stats;
  std::thread loader, optimizer;

  Impl(const ParamSet& p, const StoreConfig& c) : params(p), config(c) {}

  ExpertState& state(Key k) {
    return layers[static_cast<size_t>(k.layer)].state[static_cast<size_t>(k.expert)];
  }
  void rethrow_locked() {
    if (!failure.empty()) throw Error(failure);
  }

  // The plan position at which `k` is wanted next (from `from` on), or SIZE_MAX.
  size_t wanted_at(Key k, size_t from) const {
    for (size_t i = from; i < plan.size(); ++i)
      if (plan[i].layer == k.layer && plan[i].expert == k.expert) return i;
    return SIZE_MAX;
  }

  // A slot to fill for an expert needed at plan position `need` (SIZE_MAX: now, unplanned), or
  // -1 when every slot is busy: first a free or unwanted unpinned slot (least recently used),
  // then an unwanted pinned one, then the one wanted farthest after `need`.
  int victim(size_t need) {
    int best = -1;
    uint64_t best_use = 0;
    int rank_best = 3;
    size_t best_far = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      Slot& s = slots[i];
      if (s.layer < 0) return static_cast<int>(i);
      if (s.users > 0 || state({s.layer, s.expert}).uploading) continue;
      if (s.layer == waiting.layer && s.expert == waiting.expert) continue;
      const size_t at = wanted_at({s.layer, s.expert}, cursor);
      int rank = at == SIZE_MAX ? (state({s.layer, s.expert}).pinned ? 1 : 0) : 2;
      if (rank == 2 && need != SIZE_MAX && at <= need) continue;
      if (rank < rank_best || (rank == rank_best && rank < 2 && s.last_use < best_use) ||
          (rank == 2 && rank_best == 2 && at > best_far)) {
        best = static_cast<int>(i);
        rank_best = rank;
        best_use = s.last_use;
        best_far = at;
      }
    }
    return best;
  }

  void free_slot(int i) {
    Slot& s = slots[static_cast<size_t>(i)];
    if (s.layer >= 0) state({s.layer, s.expert}).slot = -1;
    s.layer = -1;
    s.expert = -1;
    s.users = 0;
  }

  // Converts the expert's storage values into slot i's fp32 weights (outside the lock); on CUDA
  // into a pinned staging buffer, whose copy into the slot is queued.
  void fill_slot(Key k, int i) {
    const Layer& layer = layers[static_cast<size_t>(k.layer)];
    const std::shared_ptr<std::byte> values = allocate_host(layer.layout.values_bytes);
    tier->read_values(k.layer, k.expert, layer.layout.values_bytes, values.get());
    auto convert = [&](const std::shared_ptr<std::byte>& into) {
      for (const TensorLayout& t : layer.layout.tensors)
        view(into, t.slot_offset, t.shape, DType::f32)
            .copy_from(view(values, t.value.offset, t.shape, t.value.dtype));
    };
    if (!device) return convert(slots[static_cast<size_t>(i)].data);
    device->upload(i, [&](std::byte* staging) {
      convert(std::shared_ptr<std::byte>(values, staging));  // a non-owning alias
    });
  }

  // Claims a slot for k (the lock held; waits while every slot is busy) and uploads into it.
  void upload(std::unique_lock<std::mutex>& lock, Key k, size_t need) {
    int i;
    while ((i = victim(need)) < 0) {
      if (stopping) return;
      changed.wait(lock);
    }
    // The wait let go of the lock: another thread may have uploaded k meanwhile (compute's
    // acquire while the loader waited, or the reverse). A second slot for k would split its
    // users between two slots.
    if (state(k).slot >= 0 || state(k).uploading) return;
    free_slot(i);
    Slot& s = slots[static_cast<size_t>(i)];
    s.layer = k.layer;
    s.expert = k.expert;
    s.last_use = ++clock;
    ExpertState& st = state(k);
    st.slot = i;
    st.uploading = true;
    ++stats.uploads;
    lock.unlock();
    Timer filling;
    const std::string error = attempt([&] { fill_slot(k, i); });
    lock.lock();
    stats.load_seconds += filling.seconds();
    st.uploading = false;
    if (!error.empty()) {
      free_slot(i);
      if (failure.empty()) failure = error;
    }
    changed.notify_all();
  }

  void loader_loop() {
    omp_set_num_threads(1);  // compute keeps the cores; copies are memory-bound
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      changed.wait(lock, [&] {
        return stopping ||
               (next_load < plan.size() &&
                next_load < cursor + static_cast<size_t>(config.settings.prefetch_depth) + 1);
      });
      if (stopping) return;
      const size_t at = next_load++;
      const Key k = plan[at];
      const ExpertState& st = state(k);
      if (!failure.empty()) continue;
      // Backward pins the expert's whole record next (gradients(), then its update): on the SSD
      // tier, read it into the host cache here rather than on the compute thread (MoESys's
      // sparse prefetch); the upload below then copies the weights from it.
      if (plan_backward) {
        const uint64_t number = plan_number;
        lock.unlock();
        Timer reading;
        const std::string error = attempt([&] { tier->prefetch(k.layer, k.expert); });
        lock.lock();
        stats.load_seconds += reading.seconds();
        if (!error.empty()) {
          if (failure.empty()) failure = error;
          changed.notify_all();
          continue;
        }
        if (number != plan_number) continue;  // a new pass began meanwhile: k is not next
      }
      if (st.slot >= 0 || st.uploading) continue;
      upload(lock, k, at);
    }
  }

  // One expert's AdamW step (outside the lock; record.h: adamw_record).
  void update(Key k, float clip_scale, bool stale_gradient) {
    const std::shared_ptr<std::byte> record = tier->pin(k.layer, k.expert);
    adamw_record(layers[static_cast<size_t>(k.layer)].layout, record, k.expert,
                 {&config.adamw, step_info.lr, step_info.adam_step, clip_scale, stale_gradient});
    tier->unpin(k.layer, k.expert, Dirty::spent);
  }

  // After an update the slot's weights are old: drop them (the lock held).
  void updated(Key k) {
    ExpertState& st = state(k);
    st.updated_step = step;
    st.grad_step = step;
    if (st.slot >= 0) free_slot(st.slot);
  }

  // Runs queued updates until the queue is empty (finish_step: on the compute thread too) or,
  // for the optimizer thread, until the store stops.
  void run_updates(std::unique_lock<std::mutex>& lock, bool until_stopped) {
    while (true) {
      if (until_stopped) changed.wait(lock, [&] { return stopping || !optimizer_queue.empty(); });
      if (stopping || optimizer_queue.empty()) return;
      const Update u = optimizer_queue.front();
      optimizer_queue.pop_front();
      ++optimizer_busy;
      lock.unlock();
      std::string error = attempt([&] {
        if (u.drain >= 0) drain(u.key, u.drain, u.finalize);
      });
      if (error.empty())
        error = attempt([&] {
          if (u.adamw) update(u.key, u.clip_scale, u.stale_gradient);
        });
      lock.lock();
      --optimizer_busy;
      if (u.drain >= 0) {
        --state(u.key).drains;
        --draining;
        if (u.finalize && error.empty()) state(u.key).finalized_step = step;
      }
      if (!error.empty()) {
        if (failure.empty()) failure = error;
      } else if (u.adamw) {
        updated(u.key);
        ++(u.during_backward ? stats.optimizer_overlapped : stats.optimizer_after);
      }
      changed.notify_all();
    }
  }

  void optimizer_loop() {
    omp_set_num_threads(1);  // runs beside backward, which keeps the cores
    std::unique_lock<std::mutex> lock(mu);
    run_updates(lock, true);
  }

  // Applies the data-parallel scale to the expert's final gradient and records its squared sums
  // (each tensor's, for the global norm).
  void finalize_gradient(Key k, const std::shared_ptr<std::byte>& record) {
    Layer& l = layers[static_cast<size_t>(k.layer)];
    for (size_t t = 0; t < l.layout.tensors.size(); ++t) {
      const TensorLayout& tl = l.layout.tensors[t];
      Tensor grad = view(record, tl.grad.offset, tl.shape, DType::f32);
      if (step_info.gradient_scale != 1.0f) ops::scale(grad, step_info.gradient_scale);
      l.square_sums[t * static_cast<size_t>(l.experts) + static_cast<size_t>(k.expert)] =
          ops::sum_squares(grad);
    }
  }

  nn::ExpertTensors device_gradients(Key k);  // gradients() and gradient_done() on CUDA
  void device_gradient_done(Key k);

  // CUDA: moves gradient buffer g's download into the expert's record (outside the lock) and
  // frees the buffer; `final`: then scales and squared-sums it (finalize_gradient).
  void drain(Key k, int g, bool final) {
    const Layer& l = layers[static_cast<size_t>(k.layer)];
    std::shared_ptr<std::byte> record;
    device->drain(g, [&](const std::byte* host) {
      record = tier->pin(k.layer, k.expert);
      for (const TensorLayout& t : l.layout.tensors)
        std::memcpy(record.get() + t.grad.offset, host + t.slot_offset,
                    static_cast<size_t>(t.elements) * sizeof(float));
    });
    if (final) finalize_gradient(k, record);
    tier->unpin(k.layer, k.expert, Dirty::dirty);
  }

  // Where a parameter's section `what` ("value", "master", "adam.m", "adam.v") of one expert
  // lives; throws naming the parameter when the store does not hold it.
  struct Located {
    int layer = -1;
    const TensorLayout* tensor = nullptr;
    const Section* section = nullptr;
  };
  // The layer and tensor index of one of the store's parameters (throws naming it otherwise).
  std::pair<int, size_t> find(const Param& param) const {
    auto it = where.find(&param);
    if (it == where.end())
      throw Error(str("expert store: '", param.name, "' is not one of its parameters"));
    return it->second;
  }

  Located locate(const Param& param, int64_t expert, const std::string& what) const {
    const auto [li, ti] = find(param);
    const Layer& l = layers[static_cast<size_t>(li)];
    const TensorLayout& t = l.layout.tensors[ti];
    MOE_CHECK(expert >= 0 && expert < l.experts, "expert store: expert ", expert, " of '",
              param.name, "' out of range");
    const Section* section = what == "value"    ? &t.value
                             : what == "master" ? &t.master
                             : what == "adam.m" ? &t.adam_m
                             : what == "adam.v" ? &t.adam_v
                                                : nullptr;
    MOE_CHECK(section && section->offset >= 0, "expert store: no '", what, "' for '", param.name,
              "'");
    return {li, &t, section};
  }

  // The expert's tensors in a record's gradient sections (record = true) or in slot-shaped
  // memory on `on` (a slot, or a CUDA gradient buffer).
  nn::ExpertTensors tensors_of(const Layer& layer, const std::shared_ptr<std::byte>& base,
                               bool record, Device on = {}) const {
    nn::ExpertTensors out;
    const auto fields = out.fields();
    for (const TensorLayout& t : layer.layout.tensors)
      *fields[t.field] = record ? view(base, t.grad.offset, t.shape, DType::f32)
                                : view(base, t.slot_offset, t.shape, DType::f32, on);
    return out;
  }
};

TieredStore::TieredStore(const ParamSet& params, const StoreConfig& config)
    : impl_(std::make_unique<Impl>(params, config)) {
  const StoreSettings& set = config.settings;
  MOE_USAGE_CHECK(set.prefetch_depth >= 0 && set.prefetch_depth <= 64,
                  flag_for(Setting::prefetch_depth), " must be in [0, 64] (got ",
                  set.prefetch_depth, ")");
  MOE_USAGE_CHECK(config.tier == Tier::host || config.tier == Tier::ssd, flag_for(Setting::offload),
                  " ", tier_name(config.tier), ": the store's tier is host or ssd");
  MOE_USAGE_CHECK(set.pin_fraction >= 0 && set.pin_fraction <= 1, flag_for(Setting::pin_fraction),
                  " must be in [0, 1] (got ", set.pin_fraction, ")");
  MOE_USAGE_CHECK(config.device_budget >= 0 && config.host_budget >= 0,
                  flag_for(Setting::device_budget), " and ", flag_for(Setting::host_budget),
                  " must be >= 0");
  if (config.device.kind == Device::cuda)  // before any work: without a GPU, say so at once
    MOE_CHECK(cuda::available(), "expert store: device ", config.device.str(), ": ",
              cuda::unavailable_reason());
}

TieredStore::~TieredStore() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->changed.notify_all();
  if (impl_->loader.joinable()) impl_->loader.join();
  if (impl_->optimizer.joinable()) impl_->optimizer.join();
}

const StoreConfig& TieredStore::config() const { return impl_->config; }

int TieredStore::add_layer(const nn::ExpertParams& params) {
  MOE_CHECK(!impl_->started, "expert store: a layer was added after start()");
  Layer layer;
  layer.experts = params.experts();
  layer.layout = record_layout(params, impl_->params.dtype());
  layer.state.resize(static_cast<size_t>(layer.experts));
  layer.square_sums.assign(layer.layout.tensors.size() * static_cast<size_t>(layer.experts), 0.0);
  const int id = static_cast<int>(impl_->layers.size());
  for (size_t t = 0; t < layer.layout.tensors.size(); ++t)
    impl_->where[layer.layout.tensors[t].param] = {id, t};
  impl_->layers.push_back(std::move(layer));
  return id;
}

void TieredStore::start() {
  Impl& s = *impl_;
  MOE_CHECK(!s.started, "expert store: started twice");
  MOE_CHECK(!s.layers.empty(), "expert store: the model has no MoE layer to offload");
  std::vector<int64_t> experts;
  int64_t slot_bytes = 0, total_experts = 0, total_record = 0;
  for (const Layer& l : s.layers) {
    experts.push_back(l.experts);
    slot_bytes = std::max(slot_bytes, l.layout.slot_bytes);
    total_experts += l.experts;
    total_record += l.experts * l.layout.record_bytes;
  }
  // Device slots: the budget, or by default enough for the pinned experts, the prefetch window
  // and the expert computing.
  const int64_t depth = s.config.settings.prefetch_depth;
  const int64_t pinned =
      static_cast<int64_t>(s.config.settings.pin_fraction * double(total_experts));
  int64_t slots = s.config.device_budget > 0 ? s.config.device_budget / slot_bytes
                                             : std::min(total_experts, pinned + depth + 1);
  MOE_USAGE_CHECK(slots >= 1, flag_for(Setting::device_budget), " ", s.config.device_budget,
                  " bytes is smaller than one expert's fp32 weights (", slot_bytes,
                  " bytes): the minimum is ", slot_bytes);
  slots = std::max<int64_t>(1, std::min(slots, total_experts));
  std::vector<const StoreLayout*> layouts;
  for (const Layer& l : s.layers) layouts.push_back(&l.layout);
  s.tier = make_record_tier(s.config, layouts, experts);
  // The device slots; on CUDA also two gradient buffers of a slot's size (one expert's backward
  // accumulates into one while the other drains), so the GPU holds slots + 2 experts' weights.
  if (s.config.device.kind == Device::cuda || s.config.settings.stage_on_host)
    s.device = std::make_unique<DeviceCopies>(s.config.device, slot_bytes, slots, 2);
  for (int64_t i = 0; i < slots; ++i) {
    Slot slot;
    slot.data = s.device ? s.device->slot(static_cast<int>(i)) : allocate_host(slot_bytes);
    s.slots.push_back(std::move(slot));
  }
  s.stats.device_slots = slots;
  s.stats.slot_bytes = slot_bytes;
  s.stats.record_bytes = total_record;
  // Every expert starts with the values its resident Param would have (rounded to the storage
  // dtype; the master is the rounded value in fp32, as optim::AdamW starts), zero moments.
  std::vector<float> initial;
  for (int li = 0; li < static_cast<int>(s.layers.size()); ++li) {
    const Layer& layer = s.layers[static_cast<size_t>(li)];
    for (int64_t e = 0; e < layer.experts; ++e) {
      const std::shared_ptr<std::byte> record = s.tier->pin(li, e, /*fresh=*/true);
      std::memset(record.get(), 0, static_cast<size_t>(layer.layout.record_bytes));
      for (const TensorLayout& t : layer.layout.tensors) {
        initial.resize(static_cast<size_t>(t.elements));
        s.params.initial_rows(*t.param, e, 1, initial.data());
        Tensor value = view(record, t.value.offset, t.shape, t.value.dtype);
        value.copy_from(Tensor::from_vector(t.shape, initial));
        if (t.master.offset >= 0)
          view(record, t.master.offset, t.shape, DType::f32).copy_from(value);
      }
      s.tier->unpin(li, e, Dirty::spent);
    }
  }
  s.started = true;
  s.loader = std::thread([&s] { s.loader_loop(); });
  s.optimizer = std::thread([&s] { s.optimizer_loop(); });
}

void TieredStore::begin_step(const StepInfo& info) {
  Impl& s = *impl_;
  MOE_CHECK(s.started, "expert store: begin_step before start()");
  std::unique_lock<std::mutex> lock(s.mu);
  s.rethrow_locked();
  s.step_info = info;
  s.plan.clear();
  s.cursor = s.next_load = 0;
  if (!info.first_micro_batch) return;
  ++s.step;
  for (Layer& l : s.layers) {
    std::fill(l.square_sums.begin(), l.square_sums.end(), 0.0);
    for (ExpertState& st : l.state) {
      st.previous_tokens = st.tokens;
      st.tokens = 0;
      st.pinned = false;
    }
  }
  // Pinning (ES-MoE): the top pin_fraction of experts by the previous step's tokens keep their
  // slots between forward and backward, as far as the slots left beside the prefetch window and
  // the computing expert allow.
  std::vector<std::pair<int64_t, Key>> busiest;
  for (int li = 0; li < static_cast<int>(s.layers.size()); ++li)
    for (int64_t e = 0; e < s.layers[static_cast<size_t>(li)].experts; ++e)
      busiest.push_back({s.state({li, e}).previous_tokens, {li, e}});
  const int64_t room = static_cast<int64_t>(s.slots.size()) - s.config.settings.prefetch_depth - 1;
  const int64_t pins = std::max<int64_t>(
      0, std::min(room,
                  static_cast<int64_t>(s.config.settings.pin_fraction * double(busiest.size()))));
  std::stable_sort(busiest.begin(), busiest.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (int64_t i = 0; i < pins; ++i)
    if (busiest[static_cast<size_t>(i)].first > 0)
      s.state(busiest[static_cast<size_t>(i)].second).pinned = true;
}

void TieredStore::request(int layer, std::span<const int32_t> experts,
                          std::span<const int32_t> rows, nn::Pass pass) {
  Impl& s = *impl_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.rethrow_locked();
  s.plan.clear();
  s.plan_backward = pass == nn::Pass::backward;
  ++s.plan_number;
  for (size_t i = 0; i < experts.size(); ++i) {
    s.plan.push_back({layer, experts[i]});
    if (pass == nn::Pass::forward) s.state({layer, experts[i]}).tokens += rows[i];
  }
  s.cursor = s.next_load = 0;
  s.changed.notify_all();
}

nn::ExpertTensors TieredStore::acquire(int layer, int expert) {
  Impl& s = *impl_;
  const Key k{layer, expert};
  std::unique_lock<std::mutex> lock(s.mu);
  s.rethrow_locked();
  const bool planned = s.cursor < s.plan.size() && s.plan[s.cursor].layer == layer &&
                       s.plan[s.cursor].expert == expert;
  if (planned) {
    ++s.cursor;
    s.next_load = std::max(s.next_load, s.cursor);
    s.changed.notify_all();
  }
  ExpertState& st = s.state(k);
  if (st.slot >= 0 && !st.uploading) {
    ++s.stats.upload_hits;
  } else {
    // Wait for the loader's upload, or upload it here when nobody is (not prefetched, or
    // evicted meanwhile); while compute waits for it, the loader never picks it as a victim.
    Timer waited;
    s.waiting = k;
    while (s.failure.empty() && !(st.slot >= 0 && !st.uploading)) {
      if (st.slot < 0 && !st.uploading)
        s.upload(lock, k, SIZE_MAX);
      else
        s.changed.wait(lock);
    }
    s.waiting = {-1, -1};
    s.stats.wait_seconds += waited.seconds();
    s.rethrow_locked();
  }
  Slot& slot = s.slots[static_cast<size_t>(st.slot)];
  ++slot.users;
  slot.last_use = ++s.clock;
  if (s.device) s.device->acquired(st.slot);  // the GPU, not the host, waits for the upload
  return s.tensors_of(s.layers[static_cast<size_t>(layer)], slot.data, false, s.config.device);
}

nn::ExpertTensors TieredStore::gradients(int layer, int expert) {
  Impl& s = *impl_;
  const Key k{layer, expert};
  ExpertState& st = s.state(k);
  if (s.device) return s.device_gradients(k);
  if (!st.grad_record) st.grad_record = s.tier->pin(layer, expert);
  const Layer& l = s.layers[static_cast<size_t>(layer)];
  nn::ExpertTensors g = s.tensors_of(l, st.grad_record, true);
  if (st.grad_step != s.step) {  // the first gradient of this step: the record holds an older one
    for (const TensorLayout& t : l.layout.tensors)
      view(st.grad_record, t.grad.offset, t.shape, DType::f32).zero();
    st.grad_step = s.step;
  }
  return g;
}

void TieredStore::release(int layer, int expert) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  ExpertState& st = s.state({layer, expert});
  MOE_CHECK(st.slot >= 0, "expert store: release of layer ", layer, " expert ", expert,
            " that was not acquired");
  if (s.device) s.device->released(st.slot);  // the next upload into the slot waits for compute
  --s.slots[static_cast<size_t>(st.slot)].users;
  s.changed.notify_all();
}

void TieredStore::gradient_done(int layer, int expert) {
  Impl& s = *impl_;
  const Key k{layer, expert};
  ExpertState& st = s.state(k);
  if (s.device) return s.device_gradient_done(k);
  MOE_CHECK(st.grad_record, "expert store: gradient_done of layer ", layer, " expert ", expert,
            " without gradients()");
  // The gradient is final: scaled and squared-summed now, unless replicas must add theirs first
  // (complete_gradients does it then).
  const bool final = s.step_info.last_micro_batch && !s.step_info.replicas;
  if (final) {
    s.finalize_gradient(k, st.grad_record);
    st.finalized_step = s.step;
  }
  st.grad_record.reset();
  s.tier->unpin(layer, expert, Dirty::dirty);
  if (final && s.step_info.overlap && s.config.settings.optimizer_overlap) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.optimizer_queue.push_back({k, 1.0f, false, true});
    s.changed.notify_all();
  }
}

// CUDA: a gradient buffer for the expert, starting as its gradient so far this step (an earlier
// micro-batch's, uploaded once its drain is in the record) or zero, as resident backward finds
// the parameter's gradient: backward accumulates (+=) into it.
nn::ExpertTensors TieredStore::Impl::device_gradients(Key k) {
  Impl& s = *this;
  ExpertState& st = s.state(k);
  const Layer& l = s.layers[static_cast<size_t>(k.layer)];
  MOE_CHECK(st.grad_buffer < 0, "expert store: gradients of layer ", k.layer, " expert ", k.expert,
            " twice before gradient_done");
  bool earlier = false;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.changed.wait(lock, [&] { return st.drains == 0 || !s.failure.empty(); });
    s.rethrow_locked();
    earlier = st.grad_step == s.step;
    st.grad_step = s.step;
  }
  std::function<void(std::byte*)> initial;
  if (earlier)
    initial = [&](std::byte* pinned) {
      const std::shared_ptr<std::byte> record = s.tier->pin(k.layer, k.expert);
      for (const TensorLayout& t : l.layout.tensors)
        std::memcpy(pinned + t.slot_offset, record.get() + t.grad.offset,
                    static_cast<size_t>(t.elements) * sizeof(float));
      s.tier->unpin(k.layer, k.expert, Dirty::clean);
    };
  st.grad_buffer = s.device->take_gradient(initial);
  return s.tensors_of(l, s.device->gradient(st.grad_buffer), false, s.config.device);
}

// CUDA: queues the buffer's download after backward's work on it, and its drain (then, when the
// gradient is final and nothing forbids it, the expert's AdamW) on the optimizer thread.
void TieredStore::Impl::device_gradient_done(Key k) {
  Impl& s = *this;
  ExpertState& st = s.state(k);
  MOE_CHECK(st.grad_buffer >= 0, "expert store: gradient_done of layer ", k.layer, " expert ",
            k.expert, " without gradients()");
  const int g = st.grad_buffer;
  st.grad_buffer = -1;
  s.device->download_gradient(g);
  const bool final = s.step_info.last_micro_batch && !s.step_info.replicas;
  const bool adamw = final && s.step_info.overlap && s.config.settings.optimizer_overlap;
  std::lock_guard<std::mutex> lock(s.mu);
  ++st.drains;
  ++s.draining;
  s.optimizer_queue.push_back({k, 1.0f, false, true, g, final, adamw});
  s.changed.notify_all();
}

void TieredStore::complete_gradients() {
  Impl& s = *impl_;
  comm::Communicator* replicas = s.step_info.replicas;
  {  // CUDA: every download of this backward is in its record
    std::unique_lock<std::mutex> lock(s.mu);
    s.changed.wait(lock, [&] { return s.draining == 0 || !s.failure.empty(); });
    s.rethrow_locked();
  }
  for (int li = 0; li < static_cast<int>(s.layers.size()); ++li) {
    const Layer& layer = s.layers[static_cast<size_t>(li)];
    for (int64_t e = 0; e < layer.experts; ++e) {
      const Key k{li, e};
      ExpertState& st = s.state(k);
      // Without replicas only the experts whose last rows came in an earlier micro-batch are
      // left; with replicas every expert joins the sum, in order (the same calls on every rank).
      if (!replicas && (st.grad_step != s.step || st.finalized_step == s.step)) continue;
      const std::shared_ptr<std::byte> record = s.tier->pin(li, e);
      // An expert with no rows here holds an older gradient: this step's is zero.
      if (st.grad_step != s.step)
        for (const TensorLayout& t : layer.layout.tensors)
          view(record, t.grad.offset, t.shape, DType::f32).zero();
      st.grad_step = s.step;
      if (replicas)
        for (const TensorLayout& t : layer.layout.tensors) {
          Tensor grad = view(record, t.grad.offset, t.shape, DType::f32);
          replicas->all_reduce(grad, comm::ReduceOp::sum);
        }
      s.finalize_gradient(k, record);
      st.finalized_step = s.step;
      s.tier->unpin(li, e, Dirty::dirty);
    }
  }
}

double TieredStore::grad_square_sum(const Param& param) const {
  const auto [li, t] = impl_->find(param);
  const Layer& l = impl_->layers[static_cast<size_t>(li)];
  double sum = 0;  // expert by expert from zero, as optim::grad_square_sum sums a resident one
  for (int64_t e = 0; e < l.experts; ++e)
    sum += l.square_sums[t * static_cast<size_t>(l.experts) + static_cast<size_t>(e)];
  return sum;
}

void TieredStore::finish_step(float clip_scale) {
  Impl& s = *impl_;
  Timer timer;
  std::unique_lock<std::mutex> lock(s.mu);
  s.changed.wait(lock, [&] { return s.optimizer_queue.empty() && s.optimizer_busy == 0; });
  s.rethrow_locked();
  s.plan.clear();
  s.cursor = s.next_load = 0;
  MOE_CHECK(clip_scale == 1.0f || !s.step_info.overlap,
            "expert store: a clipped step cannot have overlapped the optimizer");
  // The experts not yet updated, shared by this thread and the optimizer thread: on the SSD tier
  // one's file I/O overlaps the other's update. Backward ended with the first layer's last
  // experts, so those go first, while the host cache still holds them.
  for (int li = 0; li < static_cast<int>(s.layers.size()); ++li)
    for (int64_t e = s.layers[static_cast<size_t>(li)].experts - 1; e >= 0; --e) {
      ExpertState& st = s.state({li, e});
      if (st.updated_step == s.step) continue;
      s.optimizer_queue.push_back({{li, e}, clip_scale, st.grad_step != s.step, false});
    }
  s.changed.notify_all();
  s.run_updates(lock, false);
  s.changed.wait(lock, [&] { return s.optimizer_queue.empty() && s.optimizer_busy == 0; });
  s.rethrow_locked();
  s.tier->end_step();
  s.stats.finish_seconds += timer.seconds();
}

Tensor TieredStore::read(const Param& param, int64_t expert, const std::string& what) const {
  Impl& s = *impl_;
  const Impl::Located at = s.locate(param, expert, what);
  const std::shared_ptr<std::byte> record = s.tier->pin(at.layer, expert);
  Tensor out = view(record, at.section->offset, at.tensor->shape, at.section->dtype).clone();
  s.tier->unpin(at.layer, expert, Dirty::clean);
  return out;
}

void TieredStore::write(const Param& param, int64_t expert, const std::string& what,
                        const Tensor& slice) {
  Impl& s = *impl_;
  const Impl::Located at = s.locate(param, expert, what);
  const std::shared_ptr<std::byte> record = s.tier->pin(at.layer, expert);
  Tensor into = view(record, at.section->offset, at.tensor->shape, at.section->dtype);
  into.copy_from(slice.reshape(at.tensor->shape));
  s.tier->unpin(at.layer, expert, Dirty::dirty);
  std::lock_guard<std::mutex> lock(s.mu);
  ExpertState& st = s.state({at.layer, expert});
  if (st.slot >= 0) s.free_slot(st.slot);  // its weights changed
}

StoreStats TieredStore::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  StoreStats out = impl_->stats;
  if (impl_->tier) out.host_bytes = impl_->tier->resident_bytes();
  if (const auto* cached = dynamic_cast<const CachedRecords*>(impl_->tier.get())) {
    out.cache = cached->cache_stats();
    out.ssd_bytes_read = cached->files().bytes_read();
    out.ssd_bytes_written = cached->files().bytes_written();
    out.ssd_read_seconds = cached->files().read_seconds();
    out.ssd_write_seconds = cached->files().write_seconds();
  }
  return out;
}

}  // namespace moe::offload
