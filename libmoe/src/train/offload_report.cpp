// The log lines of an offloaded run (see moe/train/offload_report.h).
#include "moe/train/offload_report.h"

#include <cstdio>

#include "moe/error.h"
#include "moe/models/memory.h"
#include "moe/settings.h"

namespace moe::train {

void check_offload_device(const TrainConfig& config, Device device, int world_size) {
  MOE_USAGE_CHECK(
      config.offload.tier == offload::Tier::none || device.kind == Device::cpu || world_size == 1,
      flag_for(Setting::offload), " ", offload::tier_name(config.offload.tier), " with ",
      flag_for(Setting::device), " ", device.str(), " on ", world_size,
      " ranks: the GPU expert store trains in one process only (no data or expert "
      "parallelism yet); offload on the CPU under mpiexec (",
      flag_for(Setting::device),
      " cpu), or train "
      "resident on the GPUs (",
      flag_for(Setting::offload), " none)");
}

std::string offload_layout(const TrainConfig& config, const offload::TieredStore& store) {
  const offload::StoreStats s = store.stats();
  const offload::StoreConfig& c = store.config();
  std::string line = str("offload: ", offload::tier_name(c.tier), " tier, experts' state ",
                         format_bytes(double(s.record_bytes)));
  if (c.tier == offload::Tier::ssd)
    line += str(" in ", c.settings.ssd_dir, " behind a host cache of ",
                c.host_budget > 0 ? format_bytes(double(c.host_budget)) : std::string("no limit"));
  else
    line += c.host_budget > 0 ? str(" in RAM (", flag_for(Setting::host_budget), " ",
                                    format_bytes(double(c.host_budget)), ")")
                              : std::string(" in RAM");
  line += str(", ", s.device_slots, " device slot", s.device_slots == 1 ? "" : "s", " of ",
              format_bytes(double(s.slot_bytes)));
  if (c.device.kind == Device::cuda)  // and the two gradient buffers beside them
    line += str(" on ", c.device.str(), " (+2 gradient buffers)");
  line += c.device_budget > 0 ? str(" (", flag_for(Setting::device_budget), " ",
                                    format_bytes(double(c.device_budget)), ")")
                              : str(" (default ", flag_for(Setting::device_budget), ")");
  char pin[32];
  std::snprintf(pin, sizeof pin, "%.0f%%", c.settings.pin_fraction * 100);
  line += str(", prefetch depth ", c.settings.prefetch_depth, ", pin ", pin);
  // When each expert's AdamW runs: only an unclipped step can update an expert before every
  // gradient is known.
  if (!c.settings.optimizer_overlap)
    line += str(", expert AdamW after backward (", flag_for(Setting::no_optimizer_overlap), ")");
  else if (config.clip > 0)
    line += str(", expert AdamW after backward (", flag_for(Setting::clip), " ", config.clip,
                ": a global-norm clip needs every gradient first; ", flag_for(Setting::clip),
                " 0 overlaps it)");
  else
    line += str(", expert AdamW during backward (", flag_for(Setting::clip), " 0)");
  return line;
}

std::string offload_stats(const offload::StoreStats& s) {
  const int64_t acquires = s.uploads + s.upload_hits;
  char rate[32] = "";
  if (acquires > 0)
    std::snprintf(rate, sizeof rate, " (%.1f%%)", 100.0 * double(s.upload_hits) / double(acquires));
  char times[96];
  std::snprintf(times, sizeof times, "%.3f s waiting for uploads, %.3f s finishing steps",
                s.wait_seconds, s.finish_seconds);
  std::string ssd;
  if (s.ssd_bytes_read > 0 || s.ssd_bytes_written > 0) {
    char hits[32] = "";
    if (s.cache.accesses > 0)
      std::snprintf(hits, sizeof hits, " (%.1f%% hits)", 100.0 * s.cache.hit_rate());
    char io[96];
    std::snprintf(io, sizeof io, " (%.3f s reading, %.3f s writing, all threads)",
                  s.ssd_read_seconds, s.ssd_write_seconds);
    ssd = str("; SSD ", format_bytes(double(s.ssd_bytes_read)), " read, ",
              format_bytes(double(s.ssd_bytes_written)), " written", io, ", host cache ",
              s.cache.hits, " hits of ", s.cache.accesses, hits);
  }
  return str("offload: ", s.uploads, " uploads, ", s.upload_hits, " slot hits", rate, ", ",
             s.optimizer_overlapped, " expert updates during backward, ", s.optimizer_after,
             " after, ", times, ssd);
}

}  // namespace moe::train
