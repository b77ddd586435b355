// Expert ring memory (see moe/offload/expert_ring.h).
// Shapes: L MoE layers, K slots, E experts of a layer.
//
// State, all under one mutex: each slot holds a layer (or none) in one of the states empty,
// queued, loading, ready, and is in use from acquire_layer to release_layer. The loader thread
// takes the queued slot with the smallest sequence number (requests the compute thread waits on
// get negative numbers, so they go first), reads and converts without the lock, then marks it
// ready. The compute thread only reads a slot between acquire and release; the loader only writes
// one no layer is using: the mutex orders the two.
//
// Device (CUDA) slots: the mutex orders the host side only. The loader converts into a pinned
// staging buffer (two, alternating, so that converting layer m + 1 overlaps the copy of layer m)
// and queues the copy on its own stream; "ready" then means "copy queued". The GPU side is ordered
// by events: a slot's `released` event is recorded on the compute stream when its layer's expert
// work has been queued (release_layer), and the copy stream waits on it before overwriting the
// slot; its `loaded` event is recorded after the copy, and acquire_layer makes the compute stream
// wait on it. A staging buffer is reused once the copy that last read it has finished (host wait,
// loader only).
#include "moe/offload/expert_ring.h"

#include <omp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "core/backend.h"
#include "moe/arena.h"
#include "moe/cuda.h"
#include "moe/io/checkpoint.h"
#include "moe/io/finite.h"
#include "moe/log.h"
#include "moe/models/memory.h"
#include "moe/models/transformer.h"
#include "moe/settings.h"
#include "moe/timer.h"
#include "offload/checkpoint_experts.h"

namespace moe::offload {

namespace {

enum class SlotState { empty, queued, loading, ready };

// The formats of the layers' expert tensors (names, global shapes), from `path`'s model_config.
template <class Layers>
std::vector<std::vector<ExpertFormat>> read_formats(const std::string& path, const Layers& layers) {
  const nlohmann::json model_config = io::read_model_config(path);
  std::vector<std::vector<ExpertFormat>> out;
  for (const auto& layer : layers) {
    out.emplace_back();
    for (size_t j = 0; j < layer.names.size(); ++j)
      out.back().push_back(expert_format(model_config, path, layer.names[j], layer.global[j]));
  }
  return out;
}

}  // namespace

struct ExpertRing::Impl {
  struct Layer {
    int64_t block = 0;
    // The layer's tensors, in nn::ExpertTensors order (w1, w2, w3, b1, b2, b3 as it has them).
    std::vector<std::string> names;
    std::vector<int> field;        // which ExpertTensors member each one is (0 w1 .. 5 b3)
    std::vector<Shape> shapes;     // local shape [E, ...]
    std::vector<Shape> global;     // the checkpoint tensor's shape (the whole tensor's)
    std::vector<int64_t> offsets;  // element offset of each tensor in a slot (or byte offset)
    std::vector<int64_t> first;    // index in the checkpoint tensor of the tensor's expert 0
    int64_t elems = 0;             // fp32 elements of the layer's experts
    // A quantised checkpoint's expert matrices (set by start): held in their format, in a slot's
    // `bytes` at offsets[j]; `bytes` of them in all.
    std::vector<ExpertFormat> format;
    int64_t bytes = 0;
  };
  struct Slot {
    Tensor memory;  // [slot_elems] f32
    Tensor bytes;   // [slot_bytes] u8: quantised experts, as the kernels read them
    int64_t layer = -1;
    SlotState state = SlotState::empty;
    bool in_use = false;
    int64_t seq = 0;
  };
  struct CacheEntry {
    std::vector<Tensor> chunks;  // per param, per expert, as read
    int64_t bytes = 0;
  };

  std::string path;
  RingConfig config;
  bool started = false;
  std::vector<Layer> layers;
  int64_t slot_elems = 0, slot_bytes = 0, K = 0, L = 0;
  std::vector<Slot> slots;
  std::vector<std::vector<nn::ExpertTensors>> views;  // [slot][layer]

  mutable std::mutex mu;
  std::condition_variable loader_cv, ready_cv;
  bool stop = false;
  int64_t next_seq = 0, priority_seq = 0;
  std::string error;
  int64_t error_layer = -1;
  RingStats stats;
  Timer compute_timer;
  int64_t computing_layer = -1;
  std::thread loader;

  // Loader-only state.
  std::list<int64_t> lru;  // most recent first
  std::map<int64_t, CacheEntry> cache;
  int64_t cache_bytes = 0;

  // Device slots only (config.device is not the host); see the top of this file. Streams and
  // events are the handles of the device's copy engine (core/backend.h).
  struct Staging {
    Tensor memory;                 // pinned host f32 [slot_elems]
    std::shared_ptr<void> copied;  // event recorded after the copy that last read `memory`
    bool pending = false;          // `copied` was recorded
  };
  const Backend::CopyEngine* engine = nullptr;  // the device's, when on_device()
  std::shared_ptr<void> copy_stream;
  std::vector<std::shared_ptr<void>> released, loaded;  // events, per slot
  Staging staging[2];                                   // loader only
  int next_staging = 0;                                 // loader only

  bool on_device() const { return config.device.kind != Device::cpu; }

  int64_t find(int64_t layer) const {
    for (size_t s = 0; s < slots.size(); ++s)
      if (slots[s].layer == layer && slots[s].state != SlotState::empty)
        return static_cast<int64_t>(s);
    return -1;
  }

  // The slot to give layer m: not in use, not loading; empty first, else the one whose layer is
  // needed furthest ahead of m (layers run in order, wrapping round). -1 when none can be taken.
  int64_t victim(int64_t m) const {
    int64_t best = -1, best_score = -1;
    for (size_t s = 0; s < slots.size(); ++s) {
      const Slot& slot = slots[s];
      if (slot.in_use || slot.state == SlotState::loading) continue;
      int64_t score = slot.state == SlotState::empty ? L + 1 : (slot.layer - m + L) % L;
      if (score > best_score) best = static_cast<int64_t>(s), best_score = score;
    }
    return best;
  }

  void queue(int64_t s, int64_t layer, bool urgent) {
    Slot& slot = slots[static_cast<size_t>(s)];
    slot.layer = layer;
    slot.state = SlotState::queued;
    slot.seq = urgent ? --priority_seq : ++next_seq;
    loader_cv.notify_one();
  }

  // Slot s is no longer used by the compute thread. On CUDA the GPU may still be running the work
  // queued on it: the release is recorded on the compute stream, and the copy that next fills the
  // slot waits for it. Called with the lock held.
  void release(size_t s) {
    slots[s].in_use = false;
    if (on_device()) engine->record(released[s].get(), nullptr, config.device.index);
  }

  nn::ExpertTensors acquire_layer(int64_t m) {
    MOE_CHECK(started, "expert ring: start() it before the first forward pass");
    MOE_CHECK(m >= 0 && m < L, "expert ring: no MoE layer ", m, " (", L, " layers)");
    std::unique_lock lk(mu);
    for (size_t i = 0; i < slots.size(); ++i)  // a pass that threw left one in use
      if (slots[i].in_use) release(i);
    Timer waiting;
    bool waited = false;
    int64_t s = -1;
    for (;;) {
      if (error_layer == m) {
        std::string message = std::move(error);
        error.clear();
        error_layer = -1;
        throw Error(message);
      }
      s = find(m);
      if (s < 0) {
        s = victim(m);
        if (s >= 0) queue(s, m, true);
      }
      if (s >= 0 && slots[static_cast<size_t>(s)].state == SlotState::ready) break;
      waited = true;
      ready_cv.wait(lk);
    }
    if (waited) stats.wait_seconds += waiting.seconds();
    if (on_device())  // the device, not the host, waits for the copy into the slot
      engine->wait(loaded[static_cast<size_t>(s)].get(), nullptr, config.device.index);
    slots[static_cast<size_t>(s)].in_use = true;
    ++stats.layers_served;
    computing_layer = m;
    compute_timer.reset();
    return views[static_cast<size_t>(s)][static_cast<size_t>(m)];
  }

  void release_layer(int64_t m) {
    std::lock_guard lk(mu);
    if (computing_layer == m) stats.compute_seconds += compute_timer.seconds();
    computing_layer = -1;
    int64_t s = -1;
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].in_use && slots[i].layer == m) s = static_cast<int64_t>(i);
    if (s < 0) return;
    release(static_cast<size_t>(s));
    if (!config.overlap) return;
    // Calculation-released-load: the slot goes to the layer K further on (the next pass's first
    // layers after the last ones).
    const int64_t next = (m + K) % L;
    if (find(next) < 0) queue(s, next, false);
  }

  // Reads layer m's experts (file or host cache) and converts them into `memory`, host f32 of a
  // slot's size: the slot itself, or a pinned staging buffer on CUDA. Loader thread, without the
  // lock. Returns bytes read from the file; sets hit when the cache served it.
  int64_t read_into(Tensor& memory, Tensor& bytes, int64_t m, bool& hit) {
    const Layer& layer = layers[static_cast<size_t>(m)];
    float* base = memory.data<float>();
    auto it = cache.find(m);
    hit = it != cache.end();
    const bool keep = !hit && config.host_cache_bytes > 0;
    CacheEntry entry;
    int64_t read = 0;
    size_t c = 0;
    for (size_t j = 0; j < layer.names.size(); ++j) {
      const std::string& name = layer.names[j];
      const int64_t experts = layer.shapes[j].at(0);
      const int64_t per = experts ? shape_numel(layer.shapes[j]) / experts : 0;
      for (int64_t e = 0; e < experts; ++e) {
        Tensor chunk;
        const ExpertFormat& format = layer.format[j];
        if (format.quantised()) {  // checked and packed as the resident loader does
          const int64_t held = shape_numel(format.held_shape(layer.shapes[j])) / experts;
          chunk = hit ? it->second.chunks.at(c++) : io::read_expert(path, name, layer.first[j] + e);
          if (!hit) read += static_cast<int64_t>(chunk.nbytes());
          Tensor into = bytes.rows(layer.offsets[j] + e * held, layer.offsets[j] + (e + 1) * held);
          put_expert(format, chunk, into, path, name, layer.first[j] + e);
        } else if (hit) {
          chunk = it->second.chunks.at(c++);
        } else {
          chunk = io::read_expert(path, name, layer.first[j] + e);
          read += static_cast<int64_t>(chunk.nbytes());
          MOE_CHECK(chunk.numel() == per && is_floating(chunk.dtype()), "checkpoint '", path,
                    "': expert ", layer.first[j] + e, " of '", name, "' is ", chunk.describe(),
                    ", the model expects ", per, " floating-point elements");
          // As a resident model's load: garbage is refused, not scored.
          io::check_finite(str("checkpoint '", path, "'"),
                           str(name, " (expert ", layer.first[j] + e, ")"), chunk);
        }
        const int64_t offset = layer.offsets[j] + e * per;
        if (!format.quantised() && chunk.dtype() == DType::f32) {
          std::memcpy(base + offset, chunk.raw(), static_cast<size_t>(per) * sizeof(float));
        } else if (!format.quantised()) {
          // Tensor::copy_from: the conversion refresh_compute makes for a resident model.
          Tensor view = memory.rows(offset, offset + per);
          view.copy_from(chunk.reshape({per}));
        }
        if (keep) {
          entry.bytes += static_cast<int64_t>(chunk.nbytes());
          entry.chunks.push_back(std::move(chunk));
        }
      }
    }
    remember(m, hit, keep, std::move(entry));
    return read;
  }

  // The host cache after layer m was read: a hit becomes the most recent; a layer read from the
  // file is kept (`keep`) when it fits, evicting the least recent.
  void remember(int64_t m, bool hit, bool keep, CacheEntry entry) {
    if (hit) {
      lru.remove(m);
      lru.push_front(m);
    } else if (keep && entry.bytes <= config.host_cache_bytes) {
      while (cache_bytes + entry.bytes > config.host_cache_bytes && !lru.empty()) {
        auto victim_it = cache.find(lru.back());
        cache_bytes -= victim_it->second.bytes;
        cache.erase(victim_it);
        lru.pop_back();
      }
      cache_bytes += entry.bytes;
      cache.emplace(m, std::move(entry));
      lru.push_front(m);
    }
  }

  // Reads layer m's experts and converts them into slot s (loader thread, without the lock).
  int64_t load(int64_t s, int64_t m, bool& hit) {
    if (on_device()) return load_to_device(s, m, hit);
    Slot& slot = slots[static_cast<size_t>(s)];
    return read_into(slot.memory, slot.bytes, m, hit);
  }

  // The same conversion into a pinned staging buffer, then the copy into slot s queued on the copy
  // stream, after the compute stream's release of the slot.
  int64_t load_to_device(int64_t s, int64_t m, bool& hit) {
    const int index = config.device.index;
    Staging& buffer = staging[next_staging];
    next_staging = 1 - next_staging;
    if (buffer.pending) engine->synchronize_event(buffer.copied.get());  // the copy two layers back
    buffer.pending = false;                                              // read it
    Tensor no_bytes;  // quantised experts stay on the host (start refuses them on a device)
    const int64_t read = read_into(buffer.memory, no_bytes, m, hit);
    const size_t bytes = static_cast<size_t>(layers[static_cast<size_t>(m)].elems) * sizeof(float);
    void* stream = copy_stream.get();
    engine->wait(released[static_cast<size_t>(s)].get(), stream, index);
    engine->copy_to_device_async(slots[static_cast<size_t>(s)].memory.raw(), buffer.memory.raw(),
                                 bytes, stream, index);
    engine->record(buffer.copied.get(), stream, index);
    buffer.pending = true;
    engine->record(loaded[static_cast<size_t>(s)].get(), stream, index);
    return read;
  }

  // Reads the formats of the checkpoint's expert tensors, lays the slots out by them, and checks
  // the checkpoint holds every expert tensor in its format with the model's shape.
  void check_checkpoint() {
    (void)io::list_params(path);  // a file that is no checkpoint is named as such first
    set_formats(read_formats(path, layers));
    std::vector<std::pair<std::string, Shape>> tensors;
    std::vector<ExpertFormat> formats;
    for (const Layer& layer : layers)
      for (size_t j = 0; j < layer.names.size(); ++j) {
        tensors.emplace_back(layer.names[j], layer.global[j]);
        formats.push_back(layer.format[j]);
      }
    check_expert_tensors(path, tensors, formats, "expert ring");
  }

  // Lays each layer's tensors out in a slot by their formats (one a tensor, in layer order):
  // floating ones in `memory` (f32 elements), quantised ones in `bytes`.
  void set_formats(std::vector<std::vector<ExpertFormat>> formats) {
    slot_elems = slot_bytes = 0;
    for (size_t m = 0; m < layers.size(); ++m) {
      Layer& layer = layers[m];
      layer.format = std::move(formats[m]);
      layer.elems = layer.bytes = 0;
      for (size_t j = 0; j < layer.names.size(); ++j) {
        const ExpertFormat& format = layer.format[j];
        const int64_t n = shape_numel(format.held_shape(layer.shapes[j]));
        int64_t& used = format.quantised() ? layer.bytes : layer.elems;
        layer.offsets[j] = used;
        used += n;
      }
      slot_elems = std::max(slot_elems, layer.elems);
      slot_bytes = std::max(slot_bytes, layer.bytes);
    }
  }

  // Each layer's experts as a slot holds them, in bytes (before start: from the checkpoint's
  // formats).
  std::vector<int64_t> held_layer_bytes() const {
    std::vector<std::vector<ExpertFormat>> formats;
    if (!started && L > 0) formats = read_formats(path, layers);
    std::vector<int64_t> out;
    for (size_t m = 0; m < layers.size(); ++m) {
      const Layer& layer = layers[m];
      if (started) {
        out.push_back(layer.elems * static_cast<int64_t>(sizeof(float)) + layer.bytes);
        continue;
      }
      int64_t bytes = 0;
      for (size_t j = 0; j < layer.names.size(); ++j) {
        const ExpertFormat& format = formats[m][j];
        bytes += format.quantised()
                     ? shape_numel(format.held_shape(layer.shapes[j]))
                     : shape_numel(layer.shapes[j]) * static_cast<int64_t>(sizeof(float));
      }
      out.push_back(bytes);
    }
    return out;
  }

  void loop() {
    omp_set_num_threads(1);       // conversions here must not take the compute threads' cores
    if (config.loader_nice != 0)  // per thread on Linux; failure (not permitted) is harmless
      (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)),
                          config.loader_nice);
    std::unique_lock lk(mu);
    for (;;) {
      int64_t s = -1;
      loader_cv.wait(lk, [&] {
        if (stop) return true;
        s = -1;
        for (size_t i = 0; i < slots.size(); ++i)
          if (slots[i].state == SlotState::queued &&
              (s < 0 || slots[i].seq < slots[static_cast<size_t>(s)].seq))
            s = static_cast<int64_t>(i);
        return s >= 0;
      });
      if (stop) return;
      Slot& slot = slots[static_cast<size_t>(s)];
      slot.state = SlotState::loading;
      const int64_t m = slot.layer;
      lk.unlock();
      Timer busy;
      std::string failure;
      int64_t read = 0;
      bool hit = false;
      try {
        read = load(s, m, hit);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      const double seconds = busy.seconds();
      lk.lock();
      stats.load_seconds += seconds;
      stats.bytes_read += read;
      if (failure.empty()) {
        slot.state = SlotState::ready;
        ++stats.layers_loaded;
        if (hit) ++stats.cache_hits;
      } else {
        slot.state = SlotState::empty;
        slot.layer = -1;
        error = str("expert ring: loading MoE layer ", m, " (block ",
                    layers[static_cast<size_t>(m)].block, "): ", failure);
        error_layer = m;
      }
      ready_cv.notify_all();
    }
  }
};

ExpertRing::ExpertRing(std::string checkpoint) : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(checkpoint);
}

int ExpertRing::add_layer(const nn::ExpertParams& params) {
  Impl& r = *impl_;
  MOE_CHECK(!r.started, "expert ring: a MoE layer was added after start()");
  Impl::Layer layer;
  const auto tensors = params.fields();
  for (int field = 0; field < nn::kExpertFields; ++field) {
    const Param* p = tensors[field];
    if (!p) continue;
    MOE_CHECK(p->offloaded && !p->shape.empty(), "expert ring: expert parameter '", p->name,
              "' is not offloaded to the ring (build the model with it as its expert store)");
    MOE_CHECK(!p->shard.defined() || p->shard.dim == 0, "expert ring: '", p->name,
              "' is sliced along dimension ", p->shard.dim, ", not its experts");
    if (layer.names.empty()) layer.block = block_of_name(p->name);
    layer.names.push_back(p->name);
    layer.field.push_back(field);
    layer.shapes.push_back(p->shape);
    layer.global.push_back(p->shard.defined() ? p->shard.global : p->shape);
    layer.first.push_back(p->shard.defined() ? p->shard.start : 0);
    layer.offsets.push_back(layer.elems);
    layer.elems += shape_numel(p->shape);
  }
  r.slot_elems = std::max(r.slot_elems, layer.elems);
  r.layers.push_back(std::move(layer));
  r.L = static_cast<int64_t>(r.layers.size());
  return static_cast<int>(r.L - 1);
}

void ExpertRing::request(int layer, std::span<const int32_t>, std::span<const int32_t>,
                         nn::Pass pass) {
  // The ring loads whole layers ahead of the one computing, whatever the routing.
  MOE_CHECK(pass == nn::Pass::forward, "expert ring: MoE layer ", layer,
            ": the ring serves inference (forward passes) only; train with ",
            flag_for(Setting::offload));
}

nn::ExpertTensors ExpertRing::acquire_layer(int layer) { return impl_->acquire_layer(layer); }

void ExpertRing::release_layer(int layer) { impl_->release_layer(layer); }

nn::ExpertTensors ExpertRing::acquire(int layer, int expert) {
  throw Error(str("expert ring: serves whole layers (acquire_layer), not expert ", expert,
                  " of MoE layer ", layer));
}

nn::ExpertTensors ExpertRing::gradients(int layer, int) {
  throw Error(str("expert ring: MoE layer ", layer, ": the ring holds no gradients"));
}

void ExpertRing::release(int layer, int expert) {
  throw Error(str("expert ring: serves whole layers (release_layer), not expert ", expert,
                  " of MoE layer ", layer));
}

void ExpertRing::gradient_done(int layer, int) {
  throw Error(str("expert ring: MoE layer ", layer, ": the ring holds no gradients"));
}

void ExpertRing::start(const RingConfig& config) {
  Impl& r = *impl_;
  MOE_CHECK(!r.started, "expert ring: started twice");
  MOE_CHECK(!ArenaScope::current(),
            "expert ring: start it outside an ArenaScope (its slots must outlive every step)");
  const std::string& checkpoint = r.path;
  if (config.device.kind == Device::cuda) {
    // Without the backend cuda::available() is false too, and unavailable_reason() says why.
    MOE_CHECK(cuda::available(), "expert ring: device ", config.device.str(), ": ",
              cuda::unavailable_reason());
    MOE_CHECK(config.device.index >= 0 && config.device.index < cuda::device_count(),
              "expert ring: device ", config.device.str(), " does not exist (",
              cuda::device_count(), " CUDA devices visible)");
  }

  // The checkpoint must hold every expert tensor with the model's (whole) shape; a quantised
  // one's matrices are held in their format, on the host.
  if (r.L > 0) {
    r.check_checkpoint();
    MOE_USAGE_CHECK(r.slot_bytes == 0 || config.device.kind == Device::cpu, "expert ring: '",
                    checkpoint,
                    "' holds quantised experts, which the CPU kernels read: the ring "
                    "serves them with ",
                    flag_for(Setting::device), " cpu only");
  }

  // Budget -> K slots of the largest layer's expert bytes (fp32, or quantised as stored).
  const int64_t slot_bytes = r.slot_elems * static_cast<int64_t>(sizeof(float)) + r.slot_bytes;
  int64_t K = 0;
  if (r.L > 0) {
    MOE_USAGE_CHECK(config.budget_bytes >= slot_bytes, flag_for(Setting::expert_budget), " ",
                    config.budget_bytes, " bytes is smaller than one MoE layer's experts (",
                    slot_bytes, " bytes)");
    K = std::min(config.budget_bytes / slot_bytes, r.L);
    // Host slots are allocated below: a budget this process cannot get is refused with the
    // figures rather than by a failed allocation part-way (device slots: the device's allocator).
    const double bytes = double(K) * double(slot_bytes);
    if (config.device.kind == Device::cpu)
      check_free_memory(bytes,
                        str(flag_for(Setting::expert_budget), ": ", K, " expert slots of ",
                            format_bytes(double(slot_bytes)), " (", format_bytes(bytes), ")"));
  }
  r.config = config;
  r.K = K;
  if (r.on_device() && r.L > 0) {
    const int index = config.device.index;
    r.engine = &backend_for(config.device).copy_engine;
    r.copy_stream = r.engine->create_stream(index);
    for (int64_t s = 0; s < r.K; ++s) {
      r.released.push_back(r.engine->create_event(index));
      r.loaded.push_back(r.engine->create_event(index));
    }
    for (Impl::Staging& buffer : r.staging) {
      buffer.memory = Tensor::from_storage(
          r.engine->allocate_pinned(static_cast<size_t>(r.slot_elems) * sizeof(float)),
          {r.slot_elems}, DType::f32);
      buffer.memory.set_name("expert_ring.staging");
      buffer.copied = r.engine->create_event(index);
    }
  }
  r.slots.resize(static_cast<size_t>(r.K));
  for (Impl::Slot& slot : r.slots) {
    slot.memory =
        Tensor::zeros({r.slot_elems}, DType::f32, config.device).set_name("expert_ring.slot");
    if (r.slot_bytes > 0)
      slot.bytes = Tensor::zeros({r.slot_bytes}, DType::u8).set_name("expert_ring.slot");
  }
  // The zeroing (and any earlier user of a recycled block) is queued on the compute stream: the
  // first copy into each slot waits for it.
  for (size_t s = 0; s < r.slots.size(); ++s)
    if (r.on_device()) r.engine->record(r.released[s].get(), nullptr, config.device.index);
  // Each slot's views of every layer's tensors, shaped as the layer's Params.
  r.views.assign(static_cast<size_t>(r.K), std::vector<nn::ExpertTensors>(r.layers.size()));
  for (int64_t s = 0; s < r.K; ++s) {
    for (int64_t m = 0; m < r.L; ++m) {
      const Impl::Layer& layer = r.layers[static_cast<size_t>(m)];
      nn::ExpertTensors& v = r.views[static_cast<size_t>(s)][static_cast<size_t>(m)];
      const auto fields = v.fields();
      for (size_t j = 0; j < layer.names.size(); ++j) {
        const Impl::Slot& slot = r.slots[static_cast<size_t>(s)];
        const ExpertFormat& format = layer.format[j];
        const Shape shape = format.held_shape(layer.shapes[j]);
        const int64_t begin = layer.offsets[j], end = begin + shape_numel(shape);
        *fields[layer.field[j]] =
            format.quantised()
                ? slot.bytes.rows(begin, end).reshape(shape).view_as(format.held)
                : slot.memory.rows(begin, end).reshape(shape).set_name(layer.names[j]);
      }
    }
  }
  r.stats.slots = r.K;
  r.stats.peak_resident_bytes = r.K * slot_bytes;
  r.started = true;
  if (r.L > 0) {
    if (config.overlap)
      for (int64_t m = 0; m < r.K; ++m) r.queue(m, m, false);
    r.loader = std::thread([impl = impl_.get()] { impl->loop(); });
  }
}

ExpertRing::~ExpertRing() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->loader_cv.notify_all();
  if (impl_->loader.joinable()) impl_->loader.join();
  // Queued copies read the staging buffers and write the slots: both are freed below.
  if (impl_->copy_stream) {
    try {
      impl_->engine->synchronize_stream(impl_->copy_stream.get());
    } catch (const std::exception& e) {
      MOE_LOG_WARN("expert ring: ", e.what());
    }
  }
}

RingStats ExpertRing::stats() const {
  std::lock_guard lk(impl_->mu);
  RingStats s = impl_->stats;
  s.overlap_percent = s.load_seconds > 0
                          ? std::clamp(100.0 * (1.0 - s.wait_seconds / s.load_seconds), 0.0, 100.0)
                          : 100.0;
  return s;
}

void ExpertRing::reset_stats() {
  std::lock_guard lk(impl_->mu);
  RingStats& s = impl_->stats;
  RingStats fresh;
  fresh.slots = s.slots;
  fresh.peak_resident_bytes = s.peak_resident_bytes;
  s = fresh;
}

void ExpertRing::drain() {
  std::unique_lock lk(impl_->mu);
  impl_->ready_cv.wait(lk, [&] {
    for (const Impl::Slot& slot : impl_->slots)
      if (slot.state == SlotState::queued || slot.state == SlotState::loading) return false;
    return true;
  });
  lk.unlock();
  if (impl_->copy_stream)  // the queued copies landed
    impl_->engine->synchronize_stream(impl_->copy_stream.get());
}

int64_t ExpertRing::slots() const { return impl_->K; }

int64_t ExpertRing::expert_bytes() const {
  int64_t total = 0;
  for (int64_t bytes : impl_->held_layer_bytes()) total += bytes;
  return total;
}

int64_t ExpertRing::layer_bytes() const {
  int64_t largest = 0;
  for (int64_t bytes : impl_->held_layer_bytes()) largest = std::max(largest, bytes);
  return largest;
}

int64_t ExpertRing::moe_layers() const { return impl_->L; }

}  // namespace moe::offload
