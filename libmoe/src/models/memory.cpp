// Memory estimates before allocation (see moe/models/memory.h).
#include "moe/models/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "moe/error.h"
#include "moe/models/flavour.h"
#include "moe/models/transformer.h"
#include "moe/nn/moe_layer.h"

namespace moe {

namespace {
// The weight matrices of one block's attention: q, k, v, o, or latent attention's (nn/mla.h).
double attention_matrices(const ModelConfig& c) {
  const double D = double(c.d_model);
  if (c.mla()) {
    const double H = double(c.heads), hd = double(c.qk_nope_dim + c.qk_rope_dim);
    const double r = double(c.q_lora_rank), kv = double(c.kv_lora_rank);
    const double q = r > 0 ? D * r + r * H * hd : D * H * hd;
    return q + D * (kv + double(c.qk_rope_dim)) + kv * H * double(c.qk_nope_dim + c.v_head_dim) +
           H * double(c.v_head_dim) * D;
  }
  const double hd = c.heads > 0 ? double(c.head_dim_resolved()) : D;
  const double q_width = double(std::max<int64_t>(c.heads, 1)) * hd;
  const double kv_width = double(c.kv_heads_resolved()) * hd;
  return 2 * D * q_width + 2 * D * kv_width;  // q, o; k, v
}
}  // namespace

double parameter_lower_bound(const ModelConfig& c, double experts_share, double embedding_share) {
  const double V = double(c.vocab_size), D = double(c.d_model), F = double(c.d_ff);
  // gpt: W1, W2; gated activations (SwiGLU, the clamped SwiGLU): W1, W2, W3.
  const double mlp = (moe::gated(flavour_of(c).activation) ? 3 : 2) * D * F;
  double n = embedding_share * V * D;                      // token embedding
  if (!c.tied_embeddings()) n += embedding_share * V * D;  // untied LM head
  for (int64_t l = 0; l < c.layers; ++l) {
    n += attention_matrices(c);
    const double E = l < int64_t(c.experts_per_layer.size())
                         ? double(c.experts_per_layer[size_t(l)])
                         : double(c.experts);
    if (E > 0)  // experts, the router, the shared expert (the experts' activation)
      n += experts_share * E * mlp + E * D + mlp / F * double(c.shared_expert_ff);
    else
      n += mlp / F * double(c.dense_ff_resolved());
  }
  return n;
}

namespace {
// The smaller of two figures where both are known (> 0), else the one known (0: neither).
double smaller_known(double a, double b) {
  return a > 0 && b > 0 ? std::min(a, b) : std::max(a, b);
}
}  // namespace

double MachineMemory::usable() const { return smaller_known(physical_bytes, address_space_limit); }

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

double inference_activation_lower_bound(const ModelConfig& c, int64_t windows) {
  const double T = double(c.seq), N = double(std::max<int64_t>(windows, 0)) * T;
  const double D = double(c.d_model), V = double(c.vocab_size), F = double(c.d_ff);
  const double hd = c.heads > 0 ? double(c.head_dim_resolved()) : D;
  const double q_width = double(std::max<int64_t>(c.heads, 1)) * hd;
  const double kv_width = double(c.kv_heads_resolved()) * hd;
  // One block at a time: its output rows, q, k and v of all N tokens, and the experts' rows
  // (dispatched input, hidden (and gate), activation, output) of one block of tokens (MoELayer).
  double block = N * (D + q_width + 2 * kv_width);
  if (c.experts > 0 && c.top_k > 0) {
    const double hidden = moe::gated(flavour_of(c).activation) ? 3 : 2;
    const double per_token = double(c.top_k) * (2 * D + hidden * F);
    const double tokens = double(nn::default_expert_block_tokens(c.top_k, c.d_model, c.d_ff));
    block += std::min(N, tokens) * per_token;
  }
  // After the blocks, the logits of one block of rows (Transformer::loss_by_rows).
  const double logits = std::min(N, double(default_logit_block_rows(c.vocab_size))) * V;
  return 4 * (N * D + std::max(block, logits));  // the residual stream throughout
}

double kv_cache_bytes_per_token(const ModelConfig& c) {
  const double per_layer =
      c.mla() ? double(c.kv_lora_rank + c.qk_rope_dim)
              : 2 * double(c.kv_heads_resolved()) * double(c.heads > 0 ? c.head_dim_resolved() : 0);
  return double(c.layers) * per_layer * double(sizeof(float));
}

double FreeMemory::usable() const { return smaller_known(available_bytes, address_space_left); }

std::string FreeMemory::describe() const {
  std::string text = available_bytes > 0 ? format_bytes(available_bytes) + " of memory free"
                                         : std::string("an unknown amount of memory free");
  if (address_space_left > 0)
    text += " (RLIMIT_AS leaves " + format_bytes(address_space_left) + " of address space)";
  return text;
}

FreeMemory free_memory() {
  FreeMemory f;
  if (std::FILE* in = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    double kib = 0;
    while (std::fscanf(in, "%63s %lf kB", key, &kib) == 2)
      if (std::strcmp(key, "MemAvailable:") == 0 || std::strcmp(key, "SwapFree:") == 0)
        f.available_bytes += kib * 1024;
    std::fclose(in);
  }
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    double mapped = 0;
    if (std::FILE* in = std::fopen("/proc/self/statm", "r")) {
      double pages = 0;
      if (std::fscanf(in, "%lf", &pages) == 1) mapped = pages * double(::sysconf(_SC_PAGESIZE));
      std::fclose(in);
    }
    f.address_space_left = std::max(1.0, double(limit.rlim_cur) - mapped);
  }
  return f;
}

void check_inference_activations(const ModelConfig& config, int64_t windows,
                                 const std::string& what, const std::string& detail,
                                 const FreeMemory& free) {
  const double bytes = inference_activation_lower_bound(config, windows);
  const double usable = free.usable();
  if (usable <= 0 || bytes <= usable) return;
  throw Error(str(what, " needs at least ", format_bytes(bytes), " of activations (", detail,
                  "), more than this process can still get: ", free.describe()));
}

void check_inference_weights(const ModelConfig& config, double experts_share,
                             double bytes_per_weight, const std::string& what,
                             const std::string& detail, const FreeMemory& free) {
  const double bytes = parameter_lower_bound(config, experts_share) * bytes_per_weight;
  check_free_memory(
      bytes, str(what, ": its weights need at least ", format_bytes(bytes), " (", detail, ")"),
      free);
}

void check_free_memory(double bytes, const std::string& what, const FreeMemory& free) {
  const double usable = free.usable();
  if (usable <= 0 || bytes <= usable) return;
  throw Error(str(what, ", more than this process can still get: ", free.describe()));
}

}  // namespace moe
