// Memory estimates before allocation (see moe/models/memory.h).
#include "moe/models/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "moe/error.h"
#include "moe/models/flavour.h"

namespace moe {

double parameter_lower_bound(const ModelConfig& c, double experts_share, double embedding_share) {
  const double V = double(c.vocab_size), D = double(c.d_model), F = double(c.d_ff);
  const double hd = c.heads > 0 ? double(c.head_dim_resolved()) : D;
  const double q_width = double(std::max<int64_t>(c.heads, 1)) * hd;
  const double kv_width = double(c.kv_heads_resolved()) * hd;
  // gpt: W1, W2; mixtral (SwiGLU): W1, W2, W3.
  const double mlp = (flavour_of(c).activation == nn::Activation::swiglu ? 3 : 2) * D * F;
  double n = embedding_share * V * D;                      // token embedding
  if (!c.tied_embeddings()) n += embedding_share * V * D;  // untied LM head
  for (int64_t l = 0; l < c.layers; ++l) {
    n += 2 * D * q_width + 2 * D * kv_width;  // q, o; k, v
    const double E = l < int64_t(c.experts_per_layer.size())
                         ? double(c.experts_per_layer[size_t(l)])
                         : double(c.experts);
    if (E > 0)  // experts, the router, the shared expert (the experts' activation)
      n += experts_share * E * mlp + E * D + mlp / F * double(c.shared_expert_ff);
    else
      n += mlp;
  }
  return n;
}

double MachineMemory::usable() const {
  if (physical_bytes > 0 && address_space_limit > 0)
    return std::min(physical_bytes, address_space_limit);
  return std::max(physical_bytes, address_space_limit);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buf;
}

std::string MachineMemory::describe() const {
  std::string text = physical_bytes > 0 ? format_bytes(physical_bytes) + " of physical memory"
                                        : std::string("an unknown amount of physical memory");
  if (address_space_limit > 0)
    text += " (address space limited to " + format_bytes(address_space_limit) + " by RLIMIT_AS)";
  return text;
}

MachineMemory machine_memory() {
  MachineMemory m;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) m.physical_bytes = double(pages) * double(page);
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    m.address_space_limit = double(limit.rlim_cur);
  return m;
}

void check_fits_in_memory(double bytes, const std::string& what, const std::string& detail,
                          const MachineMemory& machine) {
  const double usable = machine.usable();
  if (usable <= 0 || bytes <= usable) return;
  throw Error(str(what, " needs at least ", format_bytes(bytes), " (", detail,
                  "), more than this machine has: ", machine.describe()));
}

}  // namespace moe
