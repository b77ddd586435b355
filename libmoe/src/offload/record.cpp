// Record layouts and the host-memory record tier (see record.h).
#include "offload/record.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/adamw.h"
#include "moe/error.h"
#include "moe/io/finite.h"
#include "moe/models/memory.h"
#include "moe/ops/core.h"
#include "moe/ops/optim.h"
#include "moe/settings.h"

namespace moe::offload {

static int64_t aligned(int64_t bytes) {
  return (bytes + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
}

// The record is packed once, by the SSD tier's own rule (RecordLayout::packed: each section at
// the next 64-byte boundary, in the order given), and the store reads its offsets from it, so
// the host records and the files can never disagree.
StoreLayout record_layout(const nn::ExpertParams& params, DType storage) {
  StoreLayout layout;
  const auto fields = params.fields();
  for (int f = 0; f < nn::kExpertFields; ++f) {
    Param* p = fields[f];
    if (!p) continue;
    TensorLayout t;
    t.param = p;
    t.field = f;
    t.shape = p->shape;
    t.shape[0] = 1;
    t.elements = shape_numel(t.shape);
    t.slot_offset = layout.slot_bytes;
    layout.slot_bytes += aligned(t.elements * 4);
    layout.tensors.push_back(std::move(t));
  }
  auto name = [](const TensorLayout& t, const char* what) {
    return t.param->name.substr(t.param->name.rfind('.') + 1) + "." + what;
  };
  // The storage values first, together: an upload reads only them (one contiguous span).
  std::vector<RecordSection> sections;
  for (const TensorLayout& t : layout.tensors)
    sections.push_back({name(t, "value"), storage, t.shape, 0, 0});
  for (const TensorLayout& t : layout.tensors) {
    if (storage != DType::f32) sections.push_back({name(t, "master"), DType::f32, t.shape, 0, 0});
    for (const char* what : {"adam_m", "adam_v"})
      sections.push_back({name(t, what), DType::f32, t.shape, 0, 0});
  }
  // The gradients last: once an update has spent them, the rest of the record (its state) is
  // one prefix that the SSD tier reads and writes without them.
  const int state_sections = static_cast<int>(sections.size());
  for (const TensorLayout& t : layout.tensors)
    sections.push_back({name(t, "grad"), DType::f32, t.shape, 0, 0});
  layout.file = RecordLayout::packed(std::move(sections), kSectionAlign);
  auto at = [&](const TensorLayout& t, const char* what) -> Section {
    const std::string n = name(t, what);
    for (const RecordSection& s : layout.file.sections)
      if (s.name == n) return {s.offset, s.dtype};
    return {};
  };
  for (TensorLayout& t : layout.tensors) {
    t.value = at(t, "value");
    t.master = at(t, "master");
    t.adam_m = at(t, "adam_m");
    t.adam_v = at(t, "adam_v");
    t.grad = at(t, "grad");
  }
  layout.value_sections = static_cast<int>(layout.tensors.size());
  layout.values_bytes = layout.file.sections[static_cast<size_t>(layout.value_sections)].offset;
  layout.state_sections = state_sections;
  layout.state_bytes = layout.file.sections[static_cast<size_t>(state_sections)].offset;
  layout.record_bytes = layout.file.payload_bytes;
  return layout;
}

Tensor view(const std::shared_ptr<std::byte>& base, int64_t offset, const Shape& shape, DType dtype,
            Device device) {
  return Tensor::from_storage(std::shared_ptr<std::byte>(base, base.get() + offset), shape, dtype,
                              device);
}

std::unique_ptr<RecordTier> make_record_tier(const StoreConfig& config,
                                             const std::vector<const StoreLayout*>& layouts,
                                             const std::vector<int64_t>& experts) {
  int64_t total_record = 0, total_experts = 0, record = 0;
  std::vector<int64_t> record_bytes;
  std::vector<LayerRecords> files;
  std::vector<CachedRecords::Spans> spans;
  for (size_t l = 0; l < layouts.size(); ++l) {
    total_record += experts[l] * layouts[l]->record_bytes;
    total_experts += experts[l];
    record = std::max(record, layouts[l]->record_bytes);
    record_bytes.push_back(layouts[l]->record_bytes);
    files.push_back({layouts[l]->file, static_cast<int>(experts[l])});
    spans.push_back({layouts[l]->value_sections, layouts[l]->state_sections,
                     layouts[l]->state_bytes, layouts[l]->record_bytes});
  }
  if (config.tier == Tier::host) {
    MOE_USAGE_CHECK(
        config.host_budget == 0 || total_record <= config.host_budget, flag_for(Setting::offload),
        " host: the experts' state takes ", format_bytes(double(total_record)), " (", total_record,
        " bytes) but ", flag_for(Setting::host_budget), " is ",
        format_bytes(double(config.host_budget)), ": raise it, or keep the state on SSD with ",
        flag_for(Setting::offload), " ssd ", flag_for(Setting::ssd_dir), " DIR");
    return std::make_unique<HostRecords>(experts, record_bytes);
  }
  MOE_USAGE_CHECK(!config.settings.ssd_dir.empty(), flag_for(Setting::offload), " ssd needs ",
                  flag_for(Setting::ssd_dir),
                  " DIR: a directory on local storage for the "
                  "experts' state (",
                  format_bytes(double(total_record)), ")");
  // The host cache: --host-budget, or a quarter of the experts' state by default.
  const int64_t budget = config.host_budget > 0 ? config.host_budget : total_record / 4;
  CacheConfig cache;
  cache.policy = config.settings.expert_cache;
  cache.capacity = std::min(budget / record, total_experts);
  cache.lfu = config.settings.lfu;
  MOE_USAGE_CHECK(cache.capacity >= 1, flag_for(Setting::host_budget), " ", budget,
                  " bytes is smaller than one expert's state (", record, " bytes): the minimum is ",
                  record);
  if (config.world && config.world->size() > 1)
    check_shared_ssd_space(*config.world, config.settings.ssd_dir, ExpertFiles::total_bytes(files));
  return std::make_unique<CachedRecords>(
      std::make_unique<ExpertFiles>(config.settings.ssd_dir, std::move(files)), cache, record,
      std::move(spans));
}

std::shared_ptr<std::byte> allocate_host(int64_t bytes) {
  const size_t size = static_cast<size_t>(aligned(std::max<int64_t>(bytes, 1)));
  void* p = std::aligned_alloc(kSectionAlign, size);
  if (!p) throw Error(str("expert store: cannot allocate ", bytes, " bytes of host memory"));
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

HostRecords::HostRecords(const std::vector<int64_t>& experts_per_layer,
                         const std::vector<int64_t>& record_bytes)
    : record_bytes_(record_bytes) {
  for (size_t l = 0; l < experts_per_layer.size(); ++l) {
    const int64_t bytes = experts_per_layer[l] * record_bytes[l];
    layers_.push_back(allocate_host(bytes));
    bytes_ += bytes;
  }
}

std::shared_ptr<std::byte> HostRecords::pin(int layer, int64_t expert, bool) {
  const auto& base = layers_.at(static_cast<size_t>(layer));
  return std::shared_ptr<std::byte>(
      base, base.get() + expert * record_bytes_[static_cast<size_t>(layer)]);
}

void adamw_record(const StoreLayout& layout, const std::shared_ptr<std::byte>& record,
                  int64_t expert, const RecordUpdate& u) {
  for (const TensorLayout& t : layout.tensors) {
    Tensor grad = view(record, t.grad.offset, t.shape, DType::f32);
    if (u.stale_gradient) grad.zero();
    if (u.clip_scale != 1.0f) ops::scale(grad, u.clip_scale);
    Tensor value = view(record, t.value.offset, t.shape, t.value.dtype);
    Tensor master =
        t.master.offset >= 0 ? view(record, t.master.offset, t.shape, DType::f32) : value;
    Tensor m = view(record, t.adam_m.offset, t.shape, DType::f32);
    Tensor v = view(record, t.adam_v.offset, t.shape, DType::f32);
    ops::adamw_update(master, m, v, grad,
                      optim::adamw_scalars(*u.adamw, u.lr, u.adam_step, t.param->decay));
    if (t.master.offset >= 0) value.copy_from(master);
    if (io::first_exploded(value) >= 0)  // non-finite, or past 2^32 (moe/io/finite.h)
      io::check_not_exploded(str("step ", u.adam_step,
                                 ", after the update (the run diverged; nothing saved: "
                                 "try a lower ",
                                 flag_for(Setting::lr), " or ", flag_for(Setting::clip), ")"),
                             str(t.param->name, " (expert ", expert, ")"), value);
  }
}

void RecordTier::read_values(int layer, int64_t expert, int64_t bytes, std::byte* into) {
  const std::shared_ptr<std::byte> record = pin(layer, expert);
  std::memcpy(into, record.get(), static_cast<size_t>(bytes));
  unpin(layer, expert, Dirty::clean);
}

CachedRecords::CachedRecords(std::unique_ptr<ExpertFiles> files, const CacheConfig& cache,
                             int64_t slot_bytes, std::vector<Spans> spans)
    : files_(std::move(files)), cache_(cache), slot_bytes_(slot_bytes), spans_(std::move(spans)) {
  for (int64_t i = 0; i < cache.capacity; ++i) slots_.push_back(allocate_host(slot_bytes));
  for (int l = 0; l < files_->num_layers(); ++l)
    spent_.emplace_back(static_cast<size_t>(files_->layer(l).experts), uint8_t{1});
}

uint8_t& CachedRecords::spent(const ExpertKey& key) {
  return spent_[static_cast<size_t>(key.layer)][static_cast<size_t>(key.expert)];
}

int64_t CachedRecords::resident_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = static_cast<int64_t>(slots_.size()) * slot_bytes_;
  bytes += static_cast<int64_t>(bypassed_.size()) * slot_bytes_;
  return bytes;
}

CacheStats CachedRecords::cache_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_.stats();
}

// Runs `io` on the key's file with the lock released and the key busy (others wait for it), then
// rethrows what it threw, with the lock held again.
template <class Io>
void CachedRecords::unlocked(std::unique_lock<std::mutex>& lock, const ExpertKey& key, Io&& io) {
  busy_.insert(key);
  lock.unlock();
  std::exception_ptr failed;
  try {
    io();
  } catch (...) {
    failed = std::current_exception();
  }
  lock.lock();
  busy_.erase(key);
  changed_.notify_all();
  if (failed) std::rethrow_exception(failed);
}

// Without a live gradient only the state prefix goes to the file (its gradient sections keep
// the bytes of an earlier write, which nobody reads as a gradient again).
void CachedRecords::write_back(std::unique_lock<std::mutex>& lock, const ExpertKey& key,
                               const std::byte* data) {
  const int end = spent(key) ? spans_[static_cast<size_t>(key.layer)].state_sections : -1;
  unlocked(lock, key, [&] { files_->write_prefix(key.layer, key.expert, end, data); });
}

// The file's record into `data`; a spent gradient is not read but zeroed (so a cached record
// holds no stale bytes of whatever the slot held before).
void CachedRecords::read_in(std::unique_lock<std::mutex>& lock, const ExpertKey& key,
                            std::byte* data) {
  const Spans& sp = spans_[static_cast<size_t>(key.layer)];
  if (!spent(key)) {
    unlocked(lock, key, [&] { files_->read(key.layer, key.expert, data); });
    return;
  }
  unlocked(lock, key, [&] {
    files_->read_sections(key.layer, key.expert, 0, sp.state_sections, data);
    std::memset(data + sp.state_bytes, 0, static_cast<size_t>(sp.record_bytes - sp.state_bytes));
  });
}

std::shared_ptr<std::byte> CachedRecords::pin(int layer, int64_t expert, bool fresh) {
  const ExpertKey key{layer, static_cast<int32_t>(expert)};
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !busy_.count(key); });
  if (auto b = bypassed_.find(key); b != bypassed_.end()) {  // served uncached already
    ++b->second.pins;
    return b->second.data;
  }
  const Lookup looked = cache_.access(key);
  if (looked.hit) {
    cache_.pin(key);
    return slots_[static_cast<size_t>(looked.slot)];
  }
  std::shared_ptr<std::byte> data;
  if (looked.bypass()) {
    data = allocate_host(slot_bytes_);
    bypassed_[key] = {data, 1, false};
  } else {
    data = slots_[static_cast<size_t>(looked.slot)];
    cache_.pin(key);
  }
  // A failure leaves nothing behind: the slot it took is freed (its bytes are not the expert's).
  auto forget = [&] {
    if (looked.bypass()) {
      bypassed_.erase(key);
    } else {
      cache_.unpin(key);
      cache_.erase(key);
    }
  };
  try {
    if (looked.evicted && looked.evicted_dirty) {
      // The displaced record leaves before the slot is refilled; whoever wants `key` waits.
      busy_.insert(key);
      write_back(lock, *looked.evicted, data.get());
    }
    if (!fresh) read_in(lock, key, data.get());
  } catch (...) {
    busy_.erase(key);
    forget();
    changed_.notify_all();
    throw;
  }
  busy_.erase(key);
  changed_.notify_all();
  return data;
}

void CachedRecords::prefetch(int layer, int64_t expert) {
  pin(layer, expert);
  unpin(layer, expert, Dirty::clean);
}

// The values of a cached (or bypassed) record come from memory; otherwise only the value sections
// are read from the expert's file (a quarter or less of the record), and nothing is cached: the
// upload needs the weights, the update that needs the rest reads the whole record later.
void CachedRecords::read_values(int layer, int64_t expert, int64_t bytes, std::byte* into) {
  const ExpertKey key{layer, static_cast<int32_t>(expert)};
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !busy_.count(key); });
  if (auto b = bypassed_.find(key); b != bypassed_.end()) {
    std::memcpy(into, b->second.data.get(), static_cast<size_t>(bytes));
    return;
  }
  if (const int32_t slot = cache_.slot_of(key); slot >= 0) {
    std::memcpy(into, slots_[static_cast<size_t>(slot)].get(), static_cast<size_t>(bytes));
    return;
  }
  unlocked(lock, key, [&] {
    files_->read_sections(layer, static_cast<int>(expert), 0,
                          spans_[static_cast<size_t>(layer)].value_sections, into);
  });
}

void CachedRecords::unpin(int layer, int64_t expert, Dirty how) {
  const ExpertKey key{layer, static_cast<int32_t>(expert)};
  const bool dirty = how != Dirty::clean;
  std::unique_lock<std::mutex> lock(mu_);
  if (dirty) spent(key) = how == Dirty::spent;
  if (auto b = bypassed_.find(key); b != bypassed_.end()) {
    b->second.dirty |= dirty;
    if (--b->second.pins > 0) return;
    const Bypassed gone = b->second;
    bypassed_.erase(b);
    if (gone.dirty) write_back(lock, key, gone.data.get());
    return;
  }
  if (dirty) cache_.mark_dirty(key);
  cache_.unpin(key);
  changed_.notify_all();
}

void CachedRecords::end_step() {
  std::unique_lock<std::mutex> lock(mu_);
  for (const ExpertKey& key : cache_.end_step())
    write_back(lock, key, slots_[static_cast<size_t>(cache_.slot_of(key))].get());
}

}  // namespace moe::offload
