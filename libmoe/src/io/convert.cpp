// Checkpoint conversions (see moe/io/convert.h): finding checkpoint files, merge of shards,
// partition into the trainer's sharded layout, LPT expert placement, dtype change, freeze,
// conversion history, inspect. Shape letters: E experts of a layer, L MoE layers, N ranks, D model
// width.
#include "moe/io/convert.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "io/files.h"
#include "moe/io/hdf5.h"
#include "moe/profile/popularity.h"

namespace moe::io {

namespace fs = std::filesystem;

namespace {

std::string rank_file_name(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.h5", rank);
  return name;
}

// "rank-<digits>.h5" -> the rank, else -1.
int rank_of_file_name(const std::string& name) {
  if (name.size() != 13 || name.rfind("rank-", 0) != 0 || name.substr(10) != ".h5") return -1;
  int rank = 0;
  for (size_t i = 5; i < 10; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    rank = rank * 10 + (name[i] - '0');
  }
  return rank;
}

// The block index of the first "blocks.<n>." in a (parameter or optimizer tensor) name, else -1.
int64_t block_of_name(const std::string& name) {
  for (size_t at = name.find("blocks."); at != std::string::npos;
       at = name.find("blocks.", at + 1)) {
    if (at > 0 && name[at - 1] != '.') continue;
    size_t i = at + 7, j = i;
    while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
    if (j > i && j < name.size() && name[j] == '.') return std::stoll(name.substr(i, j - i));
  }
  return -1;
}

// block -> MoE layer index (-1 for dense blocks).
std::vector<int64_t> moe_layer_of_block(const ModelConfig& config) {
  std::vector<int64_t> of(config.experts_per_layer.size(), -1);
  int64_t l = 0;
  for (size_t b = 0; b < of.size(); ++b)
    if (config.experts_per_layer[b] > 0) of[b] = l++;
  return of;
}

ModelConfig config_of(const Checkpoint& ckpt, const std::string& what) {
  try {
    return model_config_from_json(ckpt.model_config);
  } catch (const Error& e) {
    throw Error(str(what, ": model_config: ", e.what()));
  }
}

// The MoE layer an expert tensor belongs to (by its name), checked against the model.
int64_t moe_layer_of_tensor(const std::string& name, const std::vector<int64_t>& layer_of_block,
                            const std::string& what) {
  const int64_t block = block_of_name(name);
  if (block < 0 || block >= static_cast<int64_t>(layer_of_block.size()) ||
      layer_of_block[static_cast<size_t>(block)] < 0)
    throw Error(str(what, ": expert tensor '", name, "' does not name a MoE block of the model"));
  return layer_of_block[static_cast<size_t>(block)];
}

// Bytes of one step along `dim` (product of the later dimensions times the element size), and the
// number of such blocks before it.
struct Strides {
  int64_t outer = 1, inner_bytes = 0;
};
Strides strides_of(const Shape& shape, int dim, size_t element) {
  Strides s;
  for (int d = 0; d < dim; ++d) s.outer *= shape[static_cast<size_t>(d)];
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  s.inner_bytes = inner * static_cast<int64_t>(element);
  return s;
}

// Elements [start, start + count) of dimension `dim` of t.
Tensor slice_dim(const Tensor& t, int dim, int64_t start, int64_t count) {
  Shape shape = t.shape();
  const int64_t extent = shape.at(static_cast<size_t>(dim));
  shape[static_cast<size_t>(dim)] = count;
  Tensor out = Tensor::empty(shape, t.dtype());
  const Strides s = strides_of(t.shape(), dim, dtype_size(t.dtype()));
  const auto* src = static_cast<const std::byte*>(t.raw());
  auto* dst = static_cast<std::byte*>(out.raw());
  for (int64_t o = 0; o < s.outer; ++o)
    std::memcpy(dst + o * count * s.inner_bytes, src + (o * extent + start) * s.inner_bytes,
                static_cast<size_t>(count * s.inner_bytes));
  return out;
}

// Concatenation of `parts` along `dim` into a tensor of `shape`.
Tensor concat_dim(const std::vector<const Tensor*>& parts, int dim, const Shape& shape) {
  Tensor out = Tensor::empty(shape, parts.at(0)->dtype());
  const int64_t extent = shape.at(static_cast<size_t>(dim));
  const Strides s = strides_of(shape, dim, dtype_size(out.dtype()));
  auto* dst = static_cast<std::byte*>(out.raw());
  int64_t at = 0;
  for (const Tensor* part : parts) {
    const int64_t count = part->dim(dim);
    const auto* src = static_cast<const std::byte*>(part->raw());
    for (int64_t o = 0; o < s.outer; ++o)
      std::memcpy(dst + (o * extent + at) * s.inner_bytes, src + o * count * s.inner_bytes,
                  static_cast<size_t>(count * s.inner_bytes));
    at += count;
  }
  return out;
}

// Rows of t (dim 0) in the order `rows` lists them.
Tensor gather_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  Shape shape = t.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(shape, t.dtype());
  const size_t row_bytes = t.dim(0) ? t.nbytes() / static_cast<size_t>(t.dim(0)) : 0;
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<std::byte*>(out.raw()) + i * row_bytes,
                static_cast<const std::byte*>(t.raw()) + static_cast<size_t>(rows[i]) * row_bytes,
                row_bytes);
  return out;
}

// Expert ids in rank-major order: rank 0's experts ascending, then rank 1's, ...
std::vector<int64_t> rank_major_order(const std::vector<int>& map, int ranks) {
  std::vector<int64_t> order;
  for (int p = 0; p < ranks; ++p)
    for (size_t e = 0; e < map.size(); ++e)
      if (map[e] == p) order.push_back(static_cast<int64_t>(e));
  return order;
}

// Splits a flat expert_rank (the concatenated per-layer maps) by the model's MoE layers.
std::vector<std::vector<int>> split_placement(const std::vector<int>& flat,
                                              const ModelConfig& config, const std::string& what) {
  std::vector<std::vector<int>> maps;
  if (flat.empty()) return maps;
  size_t at = 0;
  for (int64_t e : config.experts_per_layer) {
    if (e <= 0) continue;
    if (at + static_cast<size_t>(e) > flat.size()) break;
    maps.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(at),
                      flat.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(e)));
    at += static_cast<size_t>(e);
  }
  int64_t total = 0;
  for (int64_t e : config.experts_per_layer) total += std::max<int64_t>(e, 0);
  if (static_cast<int64_t>(flat.size()) != total)
    throw Error(str(what, ": /sharding expert_rank has ", flat.size(),
                    " entries, the model's MoE layers have ", total, " experts"));
  return maps;
}

void set_train_layout(nlohmann::json& train_config, int64_t ep, bool shard_embedding) {
  if (!train_config.is_object()) return;
  train_config["ep"] = ep;
  train_config["shard_embedding"] = shard_embedding;
}

bool same_shape_shard(const ParamShard& a, const ParamShard& b) {
  return a.global == b.global && a.dim == b.dim;
}

// "key 'd_ff': 64 vs 32" for the first key where two JSON objects differ (b's value first), else
// both values whole.
std::string json_difference(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_object() && b.is_object()) {
    for (const auto& [key, value] : a.items())
      if (!b.contains(key) || b.at(key) != value)
        return str("key '", key, "': ", b.contains(key) ? b.at(key).dump() : "absent", " vs ",
                   value.dump());
    for (const auto& [key, value] : b.items())
      if (!a.contains(key)) return str("key '", key, "': ", value.dump(), " vs absent");
  }
  return str(b.dump(), " vs ", a.dump());
}

std::string range_text(const ParamShard& s) { return str(s.start, "..", s.start + s.count - 1); }

}  // namespace

// ---- finding a checkpoint ---------------------------------------------------------------------

std::vector<std::string> checkpoint_files(const std::vector<std::string>& paths) {
  MOE_USAGE_CHECK(!paths.empty(), "no checkpoint given");
  std::vector<std::string> files;
  if (paths.size() > 1) {
    for (const std::string& p : paths) {
      std::error_code ec;
      if (!fs::exists(p, ec)) throw Error(str("'", p, "': no such file or directory"));
      MOE_USAGE_CHECK(!fs::is_directory(p, ec), "'", p,
                      "' is a directory: give one sharded checkpoint directory, or rank files");
      files.push_back(p);
    }
    return files;
  }
  const std::string& path = paths[0];
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(str("'", path, "': no such file or directory"));
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<std::pair<int, std::string>> ranks;
  for (const fs::directory_entry& entry : fs::directory_iterator(path, ec)) {
    const int r = rank_of_file_name(entry.path().filename().string());
    if (r >= 0) ranks.emplace_back(r, entry.path().string());
  }
  if (ec) throw Error(str("cannot list '", path, "': ", ec.message()));
  if (!ranks.empty()) {
    std::sort(ranks.begin(), ranks.end());
    for (auto& [r, f] : ranks) files.push_back(f);
    return files;
  }
  const fs::path dir(path);
  if (fs::is_directory(dir / "last", ec)) return checkpoint_files({(dir / "last").string()});
  if (fs::is_regular_file(dir / "last.h5", ec)) return {(dir / "last.h5").string()};
  throw Error(str("'", path,
                  "' holds no checkpoint: no rank-<5 digits>.h5 files (a sharded checkpoint), "
                  "no 'last' directory or 'last.h5' (a moe-train output directory)"));
}

// ---- merge ------------------------------------------------------------------------------------

Checkpoint merge_shards(const std::vector<std::string>& files) {
  std::vector<Checkpoint> shards;
  shards.reserve(files.size());
  for (const std::string& f : files) shards.push_back(load_checkpoint(f, true));
  return merge_shards(std::move(shards), files);
}

Checkpoint merge_shards(std::vector<Checkpoint> shards, const std::vector<std::string>& names) {
  MOE_USAGE_CHECK(!shards.empty() && shards.size() == names.size(), "merge: no shard files given");
  // Files by rank; every one a shard.
  std::map<int, size_t> by_rank;
  for (size_t i = 0; i < shards.size(); ++i) {
    const Sharding& s = shards[i].sharding;
    if (s.rank < 0)
      throw Error(str("'", names[i],
                      "' is a whole checkpoint (no /sharding rank), not a shard of a sharded one"));
    auto [it, fresh] = by_rank.emplace(s.rank, i);
    if (!fresh)
      throw Error(
          str("'", names[it->second], "' and '", names[i], "' are both rank ", s.rank, "'s shard"));
  }
  const size_t head_index = by_rank.count(0) ? by_rank.at(0) : shards.size();
  if (head_index == shards.size())
    throw Error(str("missing shard: no file of rank 0 (", rank_file_name(0),
                    ", which holds the replicated tensors) among ", names.size(), " file(s)"));
  const Checkpoint& head = shards[head_index];
  const std::string& head_name = names[head_index];
  const Sharding& layout = head.sharding;

  // Agreement of every file with rank 0's.
  for (size_t i = 0; i < shards.size(); ++i) {
    const Checkpoint& c = shards[i];
    auto differ = [&](const std::string& what, const std::string& a, const std::string& b) {
      throw Error(str("'", names[i], "' does not belong with '", head_name, "': ", what,
                      " differs (", b, " vs ", a, ")"));
    };
    auto differ_json = [&](const std::string& what, const nlohmann::json& a,
                           const nlohmann::json& b) {
      throw Error(str("'", names[i], "' does not belong with '", head_name, "': ", what,
                      " differs (", json_difference(a, b), ")"));
    };
    if (c.state.step != head.state.step) differ("step", str(head.state.step), str(c.state.step));
    if (c.state.tokens_seen != head.state.tokens_seen)
      differ("tokens_seen", str(head.state.tokens_seen), str(c.state.tokens_seen));
    if (c.state.data_cursor != head.state.data_cursor)
      differ("data_cursor", str(head.state.data_cursor), str(c.state.data_cursor));
    if (c.state.seed != head.state.seed) differ("seed", str(head.state.seed), str(c.state.seed));
    if (c.model_config != head.model_config)
      differ_json("model_config", head.model_config, c.model_config);
    if (c.train_config != head.train_config)
      differ_json("train_config", head.train_config, c.train_config);
    if (c.sharding.world_size != layout.world_size)
      differ("world_size", str(layout.world_size), str(c.sharding.world_size));
    if (c.sharding.ep_size != layout.ep_size)
      differ("ep_size", str(layout.ep_size), str(c.sharding.ep_size));
    if (c.sharding.shard_embedding != layout.shard_embedding)
      differ("shard_embedding", str(layout.shard_embedding), str(c.sharding.shard_embedding));
    if (c.sharding.expert_rank != layout.expert_rank)
      differ("expert_rank", "rank 0's", "another map");
  }
  // The ranks that must have written a file.
  std::set<int> needed{0};
  if (layout.ep_size > 1)
    for (int r = 0; r < layout.ep_size; ++r) needed.insert(r);
  if (layout.shard_embedding)
    for (int r = 0; r < layout.world_size; ++r) needed.insert(r);
  for (int r : needed)
    if (!by_rank.count(r))
      throw Error(str("missing shard: rank ", r, "'s file (", rank_file_name(r),
                      ") is not among the inputs; a checkpoint of world size ", layout.world_size,
                      ", ep_size ", layout.ep_size,
                      layout.shard_embedding ? " with a sharded embedding" : "",
                      " has files for ranks ", *needed.begin(), "..", *needed.rbegin()));

  const ModelConfig config = config_of(head, str("'", head_name, "'"));
  const std::vector<int64_t> layer_of_block = moe_layer_of_block(config);
  const std::vector<std::vector<int>> placement =
      split_placement(layout.expert_rank, config, str("'", head_name, "'"));
  bool placed = false;  // a non-contiguous expert placement
  for (const auto& map : placement) placed |= !is_contiguous_placement(map, layout.ep_size);

  auto merge_group = [&](bool optim) {
    struct Piece {
      size_t file;
      NamedTensor* tensor;
    };
    std::map<std::string, std::vector<Piece>> pieces;
    std::vector<std::string> order;  // rank 0's order, other names after their predecessor
    std::vector<size_t> files_in_rank_order;
    for (auto& [r, i] : by_rank) files_in_rank_order.push_back(i);
    for (size_t i : files_in_rank_order) {
      std::vector<NamedTensor>& group = optim ? shards[i].optim : shards[i].params;
      std::string previous;
      for (NamedTensor& nt : group) {
        if (!pieces.count(nt.name)) {
          auto at = previous.empty() ? order.begin()
                                     : std::find(order.begin(), order.end(), previous) + 1;
          if (previous.empty() && !order.empty() && i != head_index) at = order.end();
          order.insert(at, nt.name);
        }
        pieces[nt.name].push_back({i, &nt});
        previous = nt.name;
      }
    }
    const char* group_name = optim ? "/optim" : "/params";
    std::vector<NamedTensor> merged;
    for (const std::string& name : order) {
      std::vector<Piece>& list = pieces[name];
      const NamedTensor& first = *list[0].tensor;
      if (!first.shard.defined()) {
        if (list.size() > 1)
          throw Error(str("tensor '", name, "' of ", group_name, " is whole in both '",
                          names[list[0].file], "' and '", names[list[1].file],
                          "' (overlapping shards)"));
        merged.push_back({name, first.tensor, first.expert, {}});
        continue;
      }
      for (const Piece& p : list) {
        const NamedTensor& t = *p.tensor;
        if (!t.shard.defined() || !same_shape_shard(t.shard, first.shard) ||
            t.tensor.dtype() != first.tensor.dtype() || t.expert != first.expert)
          throw Error(str("tensor '", name, "' of ", group_name, ": '", names[p.file], "' holds ",
                          t.tensor.describe(),
                          t.shard.defined() ? str(" as a slice of ", shape_str(t.shard.global),
                                                  " along dimension ", t.shard.dim)
                                            : std::string(" whole"),
                          ", '", names[list[0].file], "' ", first.tensor.describe(),
                          " as a slice of ", shape_str(first.shard.global), " along dimension ",
                          first.shard.dim, " (mismatched shards)"));
      }
      std::sort(list.begin(), list.end(), [](const Piece& a, const Piece& b) {
        return a.tensor->shard.start < b.tensor->shard.start;
      });
      const int dim = first.shard.dim;
      const int64_t extent = first.shard.global[static_cast<size_t>(dim)];
      int64_t cursor = 0;
      for (size_t k = 0; k < list.size(); ++k) {
        const ParamShard& s = list[k].tensor->shard;
        if (s.start < cursor)
          throw Error(str("tensor '", name, "' of ", group_name,
                          ": slices overlap along dimension ", dim, ": '", names[list[k - 1].file],
                          "' holds ", range_text(list[k - 1].tensor->shard), ", '",
                          names[list[k].file], "' holds ", range_text(s)));
        if (s.start > cursor)
          throw Error(str("tensor '", name, "' of ", group_name, ": positions ", cursor, "..",
                          s.start - 1, " of dimension ", dim, " (of ", extent,
                          ") are in no shard file (a missing or foreign shard)"));
        cursor = s.start + s.count;
      }
      if (cursor != extent)
        throw Error(str("tensor '", name, "' of ", group_name, ": positions ", cursor, "..",
                        extent - 1, " of dimension ", dim, " (of ", extent,
                        ") are in no shard file (a missing shard)"));
      std::vector<const Tensor*> parts;
      for (const Piece& p : list) parts.push_back(&p.tensor->tensor);
      Tensor whole = concat_dim(parts, dim, first.shard.global);
      if (placed && first.expert && dim == 0) {
        const int64_t l = moe_layer_of_tensor(name, layer_of_block, str("'", head_name, "'"));
        const std::vector<int>& map = placement.at(static_cast<size_t>(l));
        if (static_cast<int64_t>(map.size()) != extent)
          throw Error(str("tensor '", name, "' has ", extent, " experts, expert_rank maps ",
                          map.size(), " for its layer"));
        // Each rank's slice must sit where the rank-major order puts its experts.
        std::vector<int64_t> count(static_cast<size_t>(layout.ep_size), 0);
        for (int r : map) ++count[static_cast<size_t>(r)];
        for (const Piece& p : list) {
          const int r = shards[p.file].sharding.rank;
          int64_t start = 0;
          for (int q = 0; q < r && q < layout.ep_size; ++q) start += count[static_cast<size_t>(q)];
          if (r >= layout.ep_size || p.tensor->shard.start != start ||
              p.tensor->shard.count != count[static_cast<size_t>(r)])
            throw Error(str("'", names[p.file], "': the slice ", range_text(p.tensor->shard),
                            " of '", name, "' is not where expert_rank puts rank ", r,
                            "'s experts"));
        }
        const std::vector<int64_t> order_of = rank_major_order(map, layout.ep_size);
        std::vector<int64_t> position(order_of.size());  // expert -> row in `whole`
        for (size_t i = 0; i < order_of.size(); ++i)
          position[static_cast<size_t>(order_of[i])] = static_cast<int64_t>(i);
        whole = gather_rows(whole, position);
      }
      merged.push_back({name, std::move(whole), first.expert, {}});
    }
    return merged;
  };

  Checkpoint out;
  out.model_config = head.model_config;
  out.train_config = head.train_config;
  set_train_layout(out.train_config, 1, false);
  out.provenance = head.provenance;
  out.state = head.state;
  out.params = merge_group(false);
  out.optim = merge_group(true);
  out.sharding = Sharding{};
  return out;
}

Checkpoint load_whole(const std::vector<std::string>& paths, bool with_optim, bool* merged) {
  std::vector<std::string> files = checkpoint_files(paths);
  if (files.size() == 1) {
    Checkpoint c = load_checkpoint(files[0], with_optim);
    if (c.sharding.rank < 0) {
      if (merged) *merged = false;
      return c;
    }
  }
  if (merged) *merged = true;
  Checkpoint c = merge_shards(files);
  if (!with_optim) c.optim.clear();
  return c;
}

// ---- placement --------------------------------------------------------------------------------

namespace {
int64_t per_rank(int64_t experts, int ranks) {
  MOE_USAGE_CHECK(ranks >= 1, "--ranks must be >= 1 (got ", ranks, ")");
  MOE_USAGE_CHECK(experts % ranks == 0, ranks, " ranks do not divide a layer of ", experts,
                  " experts (each rank holds E/N experts of every MoE layer)");
  return experts / ranks;
}
}  // namespace

std::vector<int> contiguous_placement(int64_t experts, int ranks) {
  const int64_t n = per_rank(experts, ranks);
  std::vector<int> map(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) map[static_cast<size_t>(e)] = static_cast<int>(e / n);
  return map;
}

std::vector<int> round_robin_placement(int64_t experts, int ranks) {
  per_rank(experts, ranks);
  std::vector<int> map(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) map[static_cast<size_t>(e)] = static_cast<int>(e % ranks);
  return map;
}

std::vector<int> lpt_placement(const std::vector<int64_t>& loads, int ranks) {
  const int64_t experts = static_cast<int64_t>(loads.size());
  const int64_t room = per_rank(experts, ranks);
  std::vector<int64_t> order(loads.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return loads[static_cast<size_t>(a)] > loads[static_cast<size_t>(b)];
  });
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0), held(static_cast<size_t>(ranks), 0);
  std::vector<int> map(loads.size(), -1);
  for (int64_t e : order) {
    int best = -1;
    for (int r = 0; r < ranks; ++r) {
      if (held[static_cast<size_t>(r)] >= room) continue;
      if (best < 0 || load[static_cast<size_t>(r)] < load[static_cast<size_t>(best)]) best = r;
    }
    map[static_cast<size_t>(e)] = best;
    load[static_cast<size_t>(best)] += loads[static_cast<size_t>(e)];
    ++held[static_cast<size_t>(best)];
  }
  return map;
}

std::vector<int64_t> rank_loads(const std::vector<int64_t>& loads, const std::vector<int>& map,
                                int ranks) {
  MOE_CHECK(loads.size() == map.size(), "rank_loads: ", loads.size(), " loads, ", map.size(),
            " experts placed");
  std::vector<int64_t> out(static_cast<size_t>(ranks), 0);
  for (size_t e = 0; e < map.size(); ++e) out.at(static_cast<size_t>(map[e])) += loads[e];
  return out;
}

double max_over_mean(const std::vector<int64_t>& loads) {
  if (loads.empty()) return 0;
  const int64_t total = std::accumulate(loads.begin(), loads.end(), int64_t{0});
  if (total == 0) return 0;
  const double mean = static_cast<double>(total) / static_cast<double>(loads.size());
  return static_cast<double>(*std::max_element(loads.begin(), loads.end())) / mean;
}

bool is_contiguous_placement(const std::vector<int>& map, int ranks) {
  if (ranks < 1 || map.size() % static_cast<size_t>(ranks) != 0) return false;
  return map == contiguous_placement(static_cast<int64_t>(map.size()), ranks);
}

std::vector<LayerPlacement> plan_placement(const ModelConfig& model, const TraceReader& trace,
                                           int ranks) {
  const TraceInfo& info = trace.info();
  std::vector<int64_t> blocks, experts;
  for (size_t b = 0; b < model.experts_per_layer.size(); ++b)
    if (model.experts_per_layer[b] > 0) {
      blocks.push_back(static_cast<int64_t>(b));
      experts.push_back(model.experts_per_layer[b]);
    }
  const int64_t top_k = model.residual_moe ? 1 : model.top_k;
  auto list = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(v[i]);
    }
    return "[" + s + "]";
  };
  if (info.moe_blocks != blocks || info.experts != experts || info.top_k != top_k)
    throw Error(str("trace '", trace.name(), "' does not come from this model: its MoE blocks ",
                    list(info.moe_blocks), " with experts ", list(info.experts), ", top-",
                    info.top_k, "; the checkpoint's MoE blocks ", list(blocks), " with experts ",
                    list(experts), ", top-", top_k));
  std::vector<profile::LayerSummary> summary = profile::summarize(trace);
  std::vector<LayerPlacement> out;
  for (size_t l = 0; l < summary.size(); ++l) {
    LayerPlacement p;
    p.layer = static_cast<int64_t>(l);
    p.block = blocks[l];
    p.experts = experts[l];
    p.loads = summary[l].counts;
    p.loads.resize(static_cast<size_t>(p.experts), 0);
    p.lpt = lpt_placement(p.loads, ranks);
    p.contiguous = contiguous_placement(p.experts, ranks);
    p.round_robin = round_robin_placement(p.experts, ranks);
    p.lpt_max_over_mean = max_over_mean(rank_loads(p.loads, p.lpt, ranks));
    p.contiguous_max_over_mean = max_over_mean(rank_loads(p.loads, p.contiguous, ranks));
    p.round_robin_max_over_mean = max_over_mean(rank_loads(p.loads, p.round_robin, ranks));
    out.push_back(std::move(p));
  }
  return out;
}

// ---- partition --------------------------------------------------------------------------------

std::vector<Checkpoint> partition(const Checkpoint& whole, const PartitionOptions& options) {
  const int N = options.ranks;
  MOE_USAGE_CHECK(N >= 2, "--ranks must be >= 2 (got ", N,
                  "): one rank holds everything, which is the unsharded checkpoint itself");
  if (whole.sharding.rank >= 0)
    throw Error("partition needs a whole checkpoint, this is one rank's shard: merge it first");
  for (const auto* group : {&whole.params, &whole.optim})
    for (const NamedTensor& nt : *group)
      if (nt.shard.defined())
        throw Error(str("partition needs a whole checkpoint, but tensor '", nt.name,
                        "' is a slice of ", shape_str(nt.shard.global)));
  const ModelConfig config = config_of(whole, "partition");
  const std::vector<int64_t> layer_of_block = moe_layer_of_block(config);
  MOE_USAGE_CHECK(!options.shard_embedding || !config.tied_embeddings(),
                  "--shard-embedding needs an untied LM head, but the ", arch_name(config.arch),
                  " flavour ties it to the token table (as moe-train refuses it)");
  MOE_USAGE_CHECK(!options.shard_embedding || config.d_model % N == 0, "--shard-embedding: ", N,
                  " ranks do not divide d_model ", config.d_model);
  const int64_t moe_layers = config.num_moe_layers();
  MOE_USAGE_CHECK(moe_layers > 0 || options.shard_embedding,
                  "the model has no MoE layer: nothing to partition over ranks");
  std::vector<std::vector<int>> maps;
  bool placed = false;
  if (options.placement.empty()) {
    for (int64_t e : config.experts_per_layer)
      if (e > 0) maps.push_back(contiguous_placement(e, N));
  } else {
    MOE_USAGE_CHECK(static_cast<int64_t>(options.placement.size()) == moe_layers, "placement of ",
                    options.placement.size(), " MoE layers for a model of ", moe_layers);
    size_t l = 0;
    for (int64_t e : config.experts_per_layer) {
      if (e <= 0) continue;
      const std::vector<int>& map = options.placement[l];
      per_rank(e, N);
      MOE_USAGE_CHECK(static_cast<int64_t>(map.size()) == e, "placement of MoE layer ", l, ": ",
                      map.size(), " experts, the layer has ", e);
      std::vector<int64_t> held(static_cast<size_t>(N), 0);
      for (int r : map) {
        MOE_USAGE_CHECK(r >= 0 && r < N, "placement of MoE layer ", l, ": rank ", r,
                        " is not one of ", N);
        ++held[static_cast<size_t>(r)];
      }
      for (int r = 0; r < N; ++r)
        MOE_USAGE_CHECK(held[static_cast<size_t>(r)] == e / N, "placement of MoE layer ", l,
                        ": rank ", r, " holds ", held[static_cast<size_t>(r)], " experts, not ",
                        e / N);
      placed |= !is_contiguous_placement(map, N);
      maps.push_back(map);
      ++l;
    }
  }

  std::vector<Checkpoint> files(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r) {
    Checkpoint& c = files[static_cast<size_t>(r)];
    c.model_config = whole.model_config;
    c.train_config = whole.train_config;
    set_train_layout(c.train_config, N, options.shard_embedding);
    c.provenance = whole.provenance;
    c.state = whole.state;
    c.sharding.world_size = N;
    c.sharding.ep_size = N;
    c.sharding.rank = r;
    c.sharding.shard_embedding = options.shard_embedding;
    if (!options.placement.empty())
      for (const auto& map : maps)
        c.sharding.expert_rank.insert(c.sharding.expert_rank.end(), map.begin(), map.end());
  }

  std::map<std::string, const NamedTensor*> param_by_name;
  for (const NamedTensor& nt : whole.params) param_by_name[nt.name] = &nt;
  // How a tensor is cut: as parameter `param` (null: whole on rank 0).
  auto distribute = [&](const NamedTensor& nt, const NamedTensor* param, bool optim) {
    const bool table = options.shard_embedding && param && param->name == "embed.tokens";
    const bool experts = param && param->expert;
    if (!table && !experts) {
      (optim ? files[0].optim : files[0].params).push_back({nt.name, nt.tensor, nt.expert, {}});
      return;
    }
    if (nt.tensor.shape() != param->tensor.shape())
      throw Error(str("optimizer tensor '", nt.name, "' is ", nt.tensor.describe(),
                      ", its parameter '", param->name, "' ", param->tensor.describe(),
                      ": cannot cut it like the parameter"));
    const int dim = table ? 1 : 0;
    MOE_CHECK(nt.tensor.ndim() > dim, "tensor '", nt.name, "' has no dimension ", dim, " to cut");
    const int64_t extent = nt.tensor.dim(dim), count = extent / N;
    Tensor source = nt.tensor;
    if (experts && placed) {
      const int64_t l = moe_layer_of_tensor(param->name, layer_of_block, "partition");
      const std::vector<int>& map = maps.at(static_cast<size_t>(l));
      MOE_CHECK(static_cast<int64_t>(map.size()) == extent, "tensor '", nt.name, "' has ", extent,
                " experts, its layer ", map.size());
      source = gather_rows(nt.tensor, rank_major_order(map, N));
    } else if (experts) {
      per_rank(extent, N);
    }
    for (int r = 0; r < N; ++r) {
      ParamShard shard{nt.tensor.shape(), dim, r * count, count};
      (optim ? files[static_cast<size_t>(r)].optim : files[static_cast<size_t>(r)].params)
          .push_back({nt.name, slice_dim(source, dim, r * count, count), nt.expert, shard});
    }
  };
  for (const NamedTensor& nt : whole.params) distribute(nt, &nt, false);
  for (const NamedTensor& nt : whole.optim) {
    const NamedTensor* param = nullptr;
    for (size_t dot = nt.name.find('.'); dot != std::string::npos && !param;
         dot = nt.name.find('.', dot + 1)) {
      auto it = param_by_name.find(nt.name.substr(dot + 1));
      if (it != param_by_name.end()) param = it->second;
    }
    distribute(nt, param, true);
  }
  return files;
}

void save_sharded(const std::string& dir, const std::vector<Checkpoint>& files, bool replace,
                  const nlohmann::json& history) {
  std::error_code ec;
  fs::path target = fs::path(dir);
  if (target.filename().empty()) target = target.parent_path();  // "out/" -> "out"
  const bool exists = fs::exists(fs::symlink_status(target, ec));
  if (exists && !replace)
    throw Error(str("'", dir, "' already exists; remove it or pass --force to replace it"));
  if (exists && !fs::is_directory(target, ec))
    throw Error(str("'", dir, "' exists and is not a directory"));
  const fs::path temp = target.string() + ".tmp-" + std::to_string(::getpid());
  const fs::path old = target.string() + ".old-" + std::to_string(::getpid());
  fs::remove_all(temp, ec);
  fs::create_directories(temp, ec);
  if (ec) throw Error(str("cannot create '", temp.string(), "': ", ec.message()));
  try {
    for (const Checkpoint& c : files)
      save_converted((temp / rank_file_name(c.sharding.rank)).string(), c, history);
    fsync_path(temp.string(), true);
    if (exists) {
      fs::rename(target, old, ec);
      if (ec) throw Error(str("cannot move '", dir, "' aside: ", ec.message()));
    }
    fs::rename(temp, target, ec);
    if (ec) {
      std::error_code ignored;
      if (exists) fs::rename(old, target, ignored);
      throw Error(str("cannot rename '", temp.string(), "' to '", dir, "': ", ec.message()));
    }
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(temp, ignored);
    throw;
  }
  fsync_path(parent_directory(target.string()), true);
  if (exists) fs::remove_all(old, ec);
}

// ---- dtype and freeze -------------------------------------------------------------------------

Checkpoint change_dtype(const Checkpoint& in, DType to, DTypeReport* report) {
  MOE_USAGE_CHECK(to == DType::f32 || to == DType::bf16 || to == DType::f16,
                  "--to must be f32, bf16 or f16 (got ", dtype_name(to), ")");
  MOE_USAGE_CHECK(in.sharding.rank < 0,
                  "dtype converts a whole checkpoint; this is one rank's shard: merge it first");
  DTypeReport r;
  Checkpoint out = in;
  out.model_config["dtype"] = dtype_name(to);
  const bool has_optim = !in.optim.empty();
  std::map<std::string, size_t> optim_index;
  for (size_t i = 0; i < in.optim.size(); ++i) optim_index[in.optim[i].name] = i;
  std::set<std::string> drop;  // optimizer tensors that no longer belong
  for (NamedTensor& nt : out.params) {
    const DType from = nt.tensor.dtype();
    if (!is_floating(from) || from == to) continue;
    const std::string master_name = "master." + nt.name;
    auto master = optim_index.find(master_name);
    const bool has_master = master != optim_index.end();
    if (has_master) {
      const Tensor& m = in.optim[master->second].tensor;
      MOE_CHECK(m.shape() == nt.tensor.shape() && m.dtype() == DType::f32, "optimizer tensor '",
                master_name, "' is ", m.describe(), ", its parameter ", nt.tensor.describe());
    }
    // The most precise values there are: the fp32 master when there is one.
    const Tensor exact = has_master ? in.optim[master->second].tensor : nt.tensor.to(DType::f32);
    Tensor converted = to == DType::f32 ? exact.clone() : exact.to(to);
    const float* x = exact.data<float>();
    std::vector<float> y = converted.to_vector();
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < exact.numel(); ++i) {
      if (std::isfinite(x[i]) && !std::isfinite(y[static_cast<size_t>(i)]))
        throw Error(str("tensor '", nt.name, "': value ", x[i], " is beyond the range of ",
                        dtype_name(to), " (it would become infinite)"));
      if (std::isfinite(x[i])) {
        scale = std::max(scale, std::fabs(static_cast<double>(x[i])));
        worst = std::max(worst, std::fabs(static_cast<double>(y[static_cast<size_t>(i)]) - x[i]));
      }
    }
    if (scale > 0) r.max_relative_error = std::max(r.max_relative_error, worst / scale);
    converted.set_name(nt.name);
    nt.tensor = std::move(converted);
    ++r.tensors_converted;
    if (!has_optim) continue;
    if (to == DType::f32) {
      if (has_master) {
        drop.insert(master_name);
        ++r.masters_dropped;
      }
    } else if (has_master) {
      ++r.masters_used;
    } else {
      out.optim.push_back({master_name, exact.clone(), nt.expert, nt.shard});
      ++r.masters_added;
    }
  }
  std::erase_if(out.optim, [&](const NamedTensor& t) { return drop.count(t.name) > 0; });
  if (report) *report = r;
  return out;
}

Checkpoint freeze(const Checkpoint& in) {
  MOE_USAGE_CHECK(in.sharding.rank < 0,
                  "freeze needs a whole checkpoint; this is one rank's shard: merge it first");
  Checkpoint out;
  out.model_config = in.model_config;
  out.train_config = nullptr;
  out.provenance = in.provenance;
  out.state = in.state;
  out.state.data_cursor = 0;
  out.sharding = Sharding{};
  // Each block's expert tensors right after the first of them: a layer's experts are one extent.
  std::vector<const NamedTensor*> order;
  std::set<const NamedTensor*> placed;
  for (size_t i = 0; i < in.params.size(); ++i) {
    const NamedTensor& nt = in.params[i];
    if (placed.count(&nt)) continue;
    order.push_back(&nt);
    placed.insert(&nt);
    if (!nt.expert) continue;
    const int64_t block = block_of_name(nt.name);
    for (size_t j = i + 1; j < in.params.size(); ++j) {
      const NamedTensor& other = in.params[j];
      if (other.expert && block_of_name(other.name) == block && !placed.count(&other)) {
        order.push_back(&other);
        placed.insert(&other);
      }
    }
  }
  for (const NamedTensor* nt : order) {
    if (nt->shard.defined())
      throw Error(str("freeze needs a whole checkpoint, but tensor '", nt->name, "' is a slice of ",
                      shape_str(nt->shard.global)));
    out.params.push_back({nt->name, nt->tensor, nt->expert, {}});
  }
  return out;
}

// ---- provenance of conversions ----------------------------------------------------------------

nlohmann::json to_json(const Provenance& p) {
  return {{"tool", p.tool},
          {"version", p.version},
          {"git", p.git},
          {"argv", p.argv},
          {"created", p.time}};
}

nlohmann::json read_history(const std::string& path) {
  read_model_config(path);  // checks the file is a moe checkpoint of a version we read
  h5::Session session;
  h5::Where root{path, "/"};
  h5::File file = h5::open_file_readonly(path, "checkpoint");
  if (!h5::has_attr(file, "history", root)) return nlohmann::json::array();
  std::string text = h5::read_string_attr(file, "history", root);
  try {
    nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_array()) throw Error("not a JSON array");
    return j;
  } catch (const std::exception& e) {
    throw Error(str(root.describe(), ": attribute 'history' is not a JSON array: ", e.what()));
  }
}

nlohmann::json extend_history(const nlohmann::json& source_history, const Provenance& source) {
  nlohmann::json h = source_history.is_array() ? source_history : nlohmann::json::array();
  h.push_back(to_json(source));
  return h;
}

void save_converted(const std::string& path, const Checkpoint& ckpt,
                    const nlohmann::json& history) {
  if (!history.is_array() || history.empty()) {
    save_checkpoint(path, ckpt);
    return;
  }
  // save_checkpoint writes the temporary file atomically; the attribute is added to it, then it
  // is renamed over `path`, so `path` is never seen without its history.
  check_replaceable(path);
  const std::string temp = str(path, ".convert-", ::getpid());
  try {
    save_checkpoint(temp, ckpt);
    {
      h5::Session session;
      h5::Where root{temp, "/"};
      h5::WriteFile file = h5::open_file_readwrite(temp);
      h5::write_string_attr(file, "history", history.dump(), root);
      file.close(root);
    }
    fsync_path(temp, false);
    rename_into_place(temp, path);
  } catch (...) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    throw;
  }
  fsync_path(parent_directory(path), true);
}

// ---- the streaming layout of frozen checkpoints -----------------------------------------------

namespace {

// An empty expert-tensor dataset laid out as h5::write_tensor lays it out (one Fletcher32 chunk
// per expert, attributes dtype and expert = 1); the data is written later, expert by expert.
h5::Dataset create_expert_dataset(hid_t group, const NamedTensor& nt, const h5::Where& where) {
  const Tensor& t = nt.tensor;
  h5::Where w = where.at(str(where.object, "/", nt.name));
  MOE_CHECK(t.ndim() >= 1 && t.numel() > 0, w.describe(), ": expert tensor ", t.describe(),
            " needs a leading expert dimension and elements");
  std::vector<hsize_t> dims(t.shape().begin(), t.shape().end());
  h5::Space space(MOE_H5(w, H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
  h5::Plist dcpl(MOE_H5(w, H5Pcreate(H5P_DATASET_CREATE)));
  MOE_H5(w, H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  std::vector<hsize_t> chunk = h5::chunk_shape(t.shape(), dtype_size(t.dtype()), true);
  MOE_H5(w, H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
  MOE_H5(w, H5Pset_fletcher32(dcpl));
  // No chunk cache: each chunk is allocated and written when its expert is written (a cache would
  // hold the chunks back and allocate them, tensor by tensor, when the dataset closes).
  h5::Plist dapl(MOE_H5(w, H5Pcreate(H5P_DATASET_ACCESS)));
  MOE_H5(w, H5Pset_chunk_cache(dapl, 0, 0, H5D_CHUNK_CACHE_W0_DEFAULT));
  h5::Type type = h5::dtype_type(t.dtype());
  h5::Dataset dataset(
      MOE_H5(w, H5Dcreate2(group, nt.name.c_str(), type, space, H5P_DEFAULT, dcpl, dapl)));
  h5::write_string_attr(dataset, "dtype", dtype_name(t.dtype()), w);
  h5::write_int_attr(dataset, "expert", 1, w, H5T_STD_U8LE);
  return dataset;
}

// Expert `e` of nt (its row of the leading dimension) into `dataset`.
void write_expert_row(hid_t dataset, const NamedTensor& nt, int64_t e, const h5::Where& w) {
  const Tensor& t = nt.tensor;
  const int rank = t.ndim();
  std::vector<hsize_t> start(static_cast<size_t>(rank), 0),
      count(t.shape().begin(), t.shape().end());
  start[0] = static_cast<hsize_t>(e);
  count[0] = 1;
  h5::Space file_space(MOE_H5(w, H5Dget_space(dataset)));
  MOE_H5(w, H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                nullptr));
  h5::Space memory(MOE_H5(w, H5Screate_simple(rank, count.data(), nullptr)));
  h5::Type type = h5::dtype_type(t.dtype());
  const size_t row = t.nbytes() / static_cast<size_t>(t.dim(0));
  MOE_H5(w, H5Dwrite(dataset, type, memory, file_space, H5P_DEFAULT,
                     static_cast<const std::byte*>(t.raw()) + static_cast<size_t>(e) * row));
}

void write_streaming_file(const std::string& file_path, const Checkpoint& ckpt,
                          const nlohmann::json& history) {
  h5::Where root{file_path, "/"};
  h5::Plist fapl = h5::file_access_plist(root);
  // Metadata (object headers, chunk indexes, link tables) is gathered in blocks of this size
  // instead of landing between the chunks it describes (a dataset takes at most 3-4 KiB: its object
  // header and its chunk index). What a block leaves unused stays a hole in the file.
  const hsize_t datasets = ckpt.params.size() + ckpt.optim.size();
  MOE_H5(root, H5Pset_meta_block_size(fapl, (16 << 10) + datasets * (4 << 10)));
  h5::WriteFile file = h5::create_file(file_path, fapl);
  Provenance stamped = ckpt.provenance;
  if (stamped.time.empty()) stamped.time = utc_timestamp();
  write_producer_attrs(file, kCheckpointFormat, kCheckpointVersion, stamped, root);
  {
    h5::Group r(MOE_H5(root, H5Gopen2(file, "/", H5P_DEFAULT)));
    h5::write_string_attr(r, "model_config", ckpt.model_config.dump(), root);
    h5::write_string_attr(r, "train_config", ckpt.train_config.dump(), root);
    if (history.is_array() && !history.empty())
      h5::write_string_attr(r, "history", history.dump(), root);
  }
  std::set<std::string> seen;
  auto check_name = [&](const std::string& name, const char* group) {
    MOE_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
                  seen.insert(str(group, "/", name)).second,
              root.describe(), ": tensor name '", name, "' in /", group,
              " is empty, invalid or repeated");
  };
  {
    h5::Group params = h5::create_group(file, "params", root);
    h5::Where pw = root.at("/params");
    // Every dataset is created first, in the checkpoint's order (the link order readers list);
    // non-expert tensors are written whole right away, expert tensors afterwards.
    std::vector<std::pair<const NamedTensor*, h5::Dataset>> experts;
    for (const NamedTensor& nt : ckpt.params) {
      check_name(nt.name, "params");
      MOE_CHECK(!nt.shard.defined(), root.describe(), ": '", nt.name, "' is a slice");
      if (nt.expert)
        experts.emplace_back(&nt, create_expert_dataset(params, nt, pw));
      else
        h5::write_tensor(params, nt.name, nt.tensor, false, pw);
    }
    // Then each block's experts, expert-major: expert 0 of every tensor of the block, expert 1,
    // ... so an expert is one run of bytes and a layer one extent.
    std::vector<bool> done(experts.size(), false);
    for (size_t i = 0; i < experts.size(); ++i) {
      if (done[i]) continue;
      const int64_t block = block_of_name(experts[i].first->name);
      std::vector<size_t> members;
      for (size_t j = i; j < experts.size(); ++j)
        if (!done[j] && block_of_name(experts[j].first->name) == block) members.push_back(j);
      int64_t count = 0;
      for (size_t j : members) count = std::max(count, experts[j].first->tensor.dim(0));
      for (int64_t e = 0; e < count; ++e)
        for (size_t j : members)
          if (e < experts[j].first->tensor.dim(0))
            write_expert_row(experts[j].second, *experts[j].first, e,
                             pw.at(str("/params/", experts[j].first->name)));
      for (size_t j : members) done[j] = true;
    }
    for (auto& [nt, dataset] : experts) dataset.close(pw.at(str("/params/", nt->name)));
    params.close(pw);
  }
  {
    h5::Group optim = h5::create_group(file, "optim", root);
    h5::Where ow = root.at("/optim");
    for (const NamedTensor& nt : ckpt.optim) {
      check_name(nt.name, "optim");
      h5::write_tensor(optim, nt.name, nt.tensor, nt.expert, ow);
    }
    optim.close(ow);
  }
  {
    h5::Group state = h5::create_group(file, "state", root);
    h5::Where w = root.at("/state");
    h5::write_int_attr(state, "step", ckpt.state.step, w);
    h5::write_int_attr(state, "tokens_seen", ckpt.state.tokens_seen, w);
    h5::write_int_attr(state, "data_cursor", ckpt.state.data_cursor, w);
    h5::write_uint_attr(state, "seed", ckpt.state.seed, w);
  }
  {
    MOE_CHECK(ckpt.sharding.rank < 0, root.describe(), ": a frozen checkpoint is not a shard");
    h5::Group sharding = h5::create_group(file, "sharding", root);
    h5::Where w = root.at("/sharding");
    h5::write_int_attr(sharding, "world_size", ckpt.sharding.world_size, w, H5T_STD_I32LE);
    h5::write_int_attr(sharding, "ep_size", ckpt.sharding.ep_size, w, H5T_STD_I32LE);
    h5::write_int32_array_attr(sharding, "expert_rank", ckpt.sharding.expert_rank, w);
  }
  MOE_H5(root, H5Fflush(file, H5F_SCOPE_GLOBAL));
  file.close(root);
}

}  // namespace

void save_streaming(const std::string& path, const Checkpoint& ckpt,
                    const nlohmann::json& history) {
  check_replaceable(path);
  const std::string temp = str(path, ".tmp-", ::getpid());
  try {
    {
      h5::Session session;
      write_streaming_file(temp, ckpt, history);
    }
    fsync_path(temp, false);
    rename_into_place(temp, path);
  } catch (const Error& e) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    throw Error(str("saving checkpoint '", path, "': ", e.what()));
  } catch (...) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    throw;
  }
  fsync_path(parent_directory(path), true);
}

// ---- inspect ----------------------------------------------------------------------------------

namespace {

std::string optional_string(hid_t object, const char* name, const h5::Where& where) {
  return h5::has_attr(object, name, where) ? h5::read_string_attr(object, name, where)
                                           : std::string();
}

nlohmann::json parse_json_attr(hid_t object, const char* name, const h5::Where& where) {
  std::string text = h5::read_string_attr(object, name, where);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(where.describe(), ": attribute '", name, "' is not valid JSON: ", e.what()));
  }
}

struct ChunkPlace {
  haddr_t address = 0;
  hsize_t size = 0;
  int64_t expert = 0;  // the chunk's first index along the leading dimension
};

// Storage of one dataset: chunk shape, filters, where its chunks lie in the file (each chunk's
// place into `chunks_out` when given).
void storage_of(hid_t dataset, const h5::Where& w, TensorInfo& t,
                std::vector<ChunkPlace>* chunks_out) {
  h5::Plist dcpl(MOE_H5(w, H5Dget_create_plist(dataset)));
  if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
    const int rank = MOE_H5(w, H5Pget_chunk(dcpl, 0, nullptr));
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    MOE_H5(w, H5Pget_chunk(dcpl, rank, dims.data()));
    t.chunk.assign(dims.begin(), dims.end());
    t.filtered = MOE_H5(w, H5Pget_nfilters(dcpl)) > 0;
    hsize_t chunks = 0;
    h5::Space space(MOE_H5(w, H5Dget_space(dataset)));
    MOE_H5(w, H5Dget_num_chunks(dataset, space, &chunks));
    haddr_t first = HADDR_UNDEF, end = 0;
    std::vector<hsize_t> offset(static_cast<size_t>(rank), 0);
    for (hsize_t i = 0; i < chunks; ++i) {
      haddr_t addr = 0;
      hsize_t size = 0;
      unsigned mask = 0;
      MOE_H5(w, H5Dget_chunk_info(dataset, space, i, offset.data(), &mask, &addr, &size));
      if (addr == HADDR_UNDEF) continue;
      if (chunks_out) chunks_out->push_back({addr, size, static_cast<int64_t>(offset.at(0))});
      first = std::min(first, addr);
      end = std::max<haddr_t>(end, addr + size);
      t.stored_bytes += static_cast<int64_t>(size);
    }
    if (first != HADDR_UNDEF) {
      t.file_offset = static_cast<int64_t>(first);
      t.file_extent = static_cast<int64_t>(end - first);
    }
  } else {
    const haddr_t addr = H5Dget_offset(dataset);
    const hsize_t size = H5Dget_storage_size(dataset);
    if (addr != HADDR_UNDEF) {
      t.file_offset = static_cast<int64_t>(addr);
      t.file_extent = static_cast<int64_t>(size);
      t.stored_bytes = static_cast<int64_t>(size);
    }
  }
}

}  // namespace

CheckpointInfo inspect(const std::vector<std::string>& paths, bool verify) {
  CheckpointInfo info;
  const std::vector<std::string> files = checkpoint_files(paths);
  std::set<std::string> counted;  // parameter names counted once
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const std::string& path = files[fi];
    nlohmann::json model_config = read_model_config(path);  // format, version, JSON
    h5::Session session;
    h5::Where root{path, "/"};
    h5::File file = h5::open_file_readonly(path, "checkpoint");
    FileInfo f;
    f.path = path;
    f.provenance.tool = optional_string(file, "producer_tool", root);
    f.provenance.version = optional_string(file, "producer_version", root);
    f.provenance.git = optional_string(file, "producer_git", root);
    f.provenance.argv = optional_string(file, "argv", root);
    f.provenance.time = optional_string(file, "created", root);
    f.history = read_history(path);
    nlohmann::json train_config = parse_json_attr(file, "train_config", root);
    if (fi == 0) {
      info.model_config = model_config;
      info.train_config = train_config;
    } else if (model_config != info.model_config) {
      throw Error(str("'", path, "' does not belong with '", files[0], "': model_config differs"));
    }
    {
      h5::Group state = h5::open_group(file, "state", root);
      h5::Where w = root.at("/state");
      f.state.step = h5::read_int_attr(state, "step", w);
      f.state.tokens_seen = h5::read_int_attr(state, "tokens_seen", w);
      f.state.data_cursor = h5::read_int_attr(state, "data_cursor", w);
      f.state.seed = h5::read_uint_attr(state, "seed", w);
    }
    {
      h5::Group sharding = h5::open_group(file, "sharding", root);
      h5::Where w = root.at("/sharding");
      f.sharding.world_size = static_cast<int>(h5::read_int_attr(sharding, "world_size", w));
      f.sharding.ep_size = static_cast<int>(h5::read_int_attr(sharding, "ep_size", w));
      f.sharding.expert_rank = h5::read_int32_array_attr(sharding, "expert_rank", w);
      if (h5::has_attr(sharding, "rank", w)) {
        f.sharding.rank = static_cast<int>(h5::read_int_attr(sharding, "rank", w));
        f.sharding.shard_embedding = h5::has_attr(sharding, "shard_embedding", w) &&
                                     h5::read_int_attr(sharding, "shard_embedding", w) != 0;
      }
    }
    const size_t first_tensor = info.tensors.size();
    std::map<int64_t, std::vector<ChunkPlace>> expert_chunks;  // block -> its expert chunks
    for (const char* group_name : {"params", "optim"}) {
      if (!h5::has_link(file, group_name, root)) {
        if (std::string(group_name) == "params")
          throw Error(str(root.describe(), ": missing group /params"));
        continue;
      }
      h5::Group group = h5::open_group(file, group_name, root);
      h5::Where gw = root.at(str("/", group_name));
      for (const std::string& name : h5::list_links(group, gw)) {
        h5::Where w = root.at(str("/", group_name, "/", name));
        h5::Dataset dataset(MOE_H5(w, H5Dopen2(group, name.c_str(), H5P_DEFAULT)));
        h5::DatasetInfo d = h5::dataset_info(dataset, w);
        TensorInfo t;
        t.group = group_name;
        t.name = name;
        t.dtype = d.dtype;
        t.shape = d.shape;
        t.bytes = shape_numel(d.shape) * static_cast<int64_t>(dtype_size(d.dtype));
        t.expert = d.expert;
        t.shard = d.shard;
        t.rank = f.sharding.rank;
        t.file = path;
        std::vector<ChunkPlace>* places = nullptr;
        if (t.group == "params" && t.expert) places = &expert_chunks[block_of_name(name)];
        storage_of(dataset, w, t, places);
        (t.group == "params" ? info.param_bytes : info.optim_bytes) += t.bytes;
        info.tensors.push_back(std::move(t));
      }
    }
    // Storage of each MoE layer's expert tensors in this file: their chunks' bytes and the span
    // from the first to the end of the last (equal when the layer is one extent).
    std::map<int64_t, std::pair<MoELayerInfo, std::pair<int64_t, int64_t>>> layers;
    for (size_t i = first_tensor; i < info.tensors.size(); ++i) {
      const TensorInfo& t = info.tensors[i];
      if (t.group != "params" || !t.expert || t.file_offset < 0) continue;
      const int64_t block = block_of_name(t.name);
      auto [it, fresh] = layers.try_emplace(block);
      MoELayerInfo& l = it->second.first;
      auto& span = it->second.second;
      if (fresh) {
        l.block = block;
        l.experts = t.shard.defined() ? t.shard.global.at(0) : t.shape.at(0);
        l.rank = f.sharding.rank;
        l.file = path;
        span = {t.file_offset, t.file_offset + t.file_extent};
      }
      span.first = std::min(span.first, t.file_offset);
      span.second = std::max(span.second, t.file_offset + t.file_extent);
      l.stored_bytes += t.stored_bytes;
    }
    int64_t moe_index = 0;
    for (auto& [block, entry] : layers) {
      entry.first.layer = moe_index++;
      entry.first.extent = entry.second.second - entry.second.first;
      // Each expert's chunks (of all the block's expert tensors) adjacent in the file?
      std::map<int64_t, std::vector<ChunkPlace>> by_expert;
      for (const ChunkPlace& c : expert_chunks[block]) by_expert[c.expert].push_back(c);
      bool runs = !by_expert.empty();
      for (auto& [e, list] : by_expert) {
        std::sort(list.begin(), list.end(),
                  [](const ChunkPlace& a, const ChunkPlace& b) { return a.address < b.address; });
        for (size_t i = 1; i < list.size(); ++i)
          runs = runs && list[i].address == list[i - 1].address + list[i - 1].size;
      }
      entry.first.experts_contiguous = runs;
      info.layers.push_back(entry.first);
    }
    info.files.push_back(std::move(f));
  }
  // Parameter counts from the datasets: a slice counts as its whole tensor, once per name.
  const ModelConfig config = model_config_from_json(info.model_config);
  const int64_t k = config.residual_moe ? 1 : config.top_k;
  for (const TensorInfo& t : info.tensors) {
    if (t.group != "params" || !counted.insert(t.name).second) continue;
    const Shape& whole = t.shard.defined() ? t.shard.global : t.shape;
    const int64_t n = shape_numel(whole);
    info.params_total += n;
    info.params_active_per_token += t.expert && whole.at(0) > 0 ? n / whole[0] * k : n;
  }
  if (verify) {
    if (files.size() == 1 && info.files[0].sharding.rank < 0)
      load_checkpoint(files[0], true);  // every chunk read and checksummed
    else
      merge_shards(files);  // also checks the shards fit together
    info.verified = true;
  }
  return info;
}

nlohmann::json to_json(const CheckpointInfo& info) {
  using nlohmann::json;
  json files = json::array();
  for (const FileInfo& f : info.files) {
    json sharding = {{"world_size", f.sharding.world_size},
                     {"ep_size", f.sharding.ep_size},
                     {"expert_rank", f.sharding.expert_rank}};
    if (f.sharding.rank >= 0) {
      sharding["rank"] = f.sharding.rank;
      sharding["shard_embedding"] = f.sharding.shard_embedding;
    }
    files.push_back({{"path", f.path},
                     {"provenance", to_json(f.provenance)},
                     {"history", f.history},
                     {"state",
                      {{"step", f.state.step},
                       {"tokens_seen", f.state.tokens_seen},
                       {"data_cursor", f.state.data_cursor},
                       {"seed", f.state.seed}}},
                     {"sharding", sharding}});
  }
  json tensors = json::array();
  for (const TensorInfo& t : info.tensors) {
    json j = {{"group", t.group},
              {"name", t.name},
              {"dtype", dtype_name(t.dtype)},
              {"shape", t.shape},
              {"bytes", t.bytes},
              {"expert", t.expert},
              {"file", t.file},
              {"chunk", t.chunk},
              {"checksummed", t.filtered},
              {"offset", t.file_offset},
              {"stored_bytes", t.stored_bytes}};
    if (t.rank >= 0) j["rank"] = t.rank;
    if (t.shard.defined())
      j["shard"] = {{"shape", t.shard.global}, {"dim", t.shard.dim}, {"start", t.shard.start}};
    tensors.push_back(std::move(j));
  }
  json layers = json::array();
  for (const MoELayerInfo& l : info.layers) {
    json j = {{"layer", l.layer},
              {"block", l.block},
              {"experts", l.experts},
              {"file", l.file},
              {"stored_bytes", l.stored_bytes},
              {"extent", l.extent},
              {"contiguous", l.contiguous()},
              {"experts_contiguous", l.experts_contiguous}};
    if (l.rank >= 0) j["rank"] = l.rank;
    layers.push_back(std::move(j));
  }
  return {{"format", kCheckpointFormat},
          {"format_version", kCheckpointVersion},
          {"files", files},
          {"model_config", info.model_config},
          {"train_config", info.train_config},
          {"params_total", info.params_total},
          {"params_active_per_token", info.params_active_per_token},
          {"param_bytes", info.param_bytes},
          {"optim_bytes", info.optim_bytes},
          {"verified", info.verified},
          {"moe_layers", layers},
          {"tensors", tensors}};
}

}  // namespace moe::io
