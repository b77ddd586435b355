// Resharding checkpoints (see moe/io/convert.h): merge of shards and partition into the trainer's
// sharded layout, and the tensor slicing both need. The other conversions: checkpoint_dir.cpp
// finds the files, expert_placement.cpp plans placements (policies in balance/),
// convert_dtype.cpp changes dtypes and freezes, convert_save.cpp writes converted files,
// inspect.cpp describes them. Shape letters: E experts of a layer, L MoE layers, N ranks,
// D model width.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "io/convert_internal.h"
#include "moe/io/convert.h"
#include "moe/io/hdf5.h"
#include "moe/settings.h"

namespace moe::io {

namespace {

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

// `part` into `out` at position `at` of dimension `dim` (the other dimensions equal).
void copy_along(Tensor& out, const Tensor& part, int dim, int64_t at) {
  const int64_t extent = out.dim(dim), count = part.dim(dim);
  const Strides s = strides_of(out.shape(), dim, dtype_size(out.dtype()));
  auto* dst = static_cast<std::byte*>(out.raw());
  const auto* src = static_cast<const std::byte*>(part.raw());
  for (int64_t o = 0; o < s.outer; ++o)
    std::memcpy(dst + (o * extent + at) * s.inner_bytes, src + o * count * s.inner_bytes,
                static_cast<size_t>(count * s.inner_bytes));
}

// Concatenation of `parts` along `dim` into a tensor of `shape`.
Tensor concat_dim(const std::vector<const Tensor*>& parts, int dim, const Shape& shape) {
  Tensor out = Tensor::empty(shape, parts.at(0)->dtype());
  int64_t at = 0;
  for (const Tensor* part : parts) {
    copy_along(out, *part, dim, at);
    at += part->dim(dim);
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

// A tensor in a message, whether its values are held or still in its file.
std::string described(const NamedTensor& nt) {
  return nt.held() ? nt.tensor.describe()
                   : str(nt.name, shape_str(nt.shape()), " ", dtype_name(nt.dtype()));
}

// `nt` as a whole tensor of an unsharded checkpoint, held or still lazy.
NamedTensor unsharded(const NamedTensor& nt) {
  NamedTensor out = nt;
  out.shard = {};
  return out;
}

// The whole tensor `name` of `global` shape from its slices `parts` along `dim` (sorted by
// shard_start, tiling the dimension); row i of the result is row position[i] of the slices
// concatenated (empty `position`: row i). Held slices are joined now. Otherwise nothing is read
// until the result is written: an expert tensor (dim 0) one expert at a time from the slice that
// holds it, any other tensor whole, its slices read one after another into it.
NamedTensor joined(const std::string& name, const std::vector<NamedTensor>& parts, int dim,
                   const Shape& global, bool expert, const std::vector<int64_t>& position) {
  bool held = true;
  for (const NamedTensor& p : parts) held &= p.held();
  if (held) {
    std::vector<const Tensor*> tensors;
    for (const NamedTensor& p : parts) tensors.push_back(&p.tensor);
    Tensor whole = concat_dim(tensors, dim, global);
    if (!position.empty()) whole = gather_rows(whole, position);
    return {name, std::move(whole), expert, {}};
  }
  NamedTensor out{name, Tensor(), expert, {}};
  if (expert && dim == 0) {
    auto source = std::make_shared<ExpertSource>();
    source->shape = global;
    source->dtype = parts.at(0).dtype();
    source->read = [parts, position](int64_t e) {
      const int64_t row = position.empty() ? e : position.at(static_cast<size_t>(e));
      for (const NamedTensor& p : parts)
        if (row < p.shard.start + p.shard.count) return p.expert_slice(row - p.shard.start);
      throw Error(str("no slice holds row ", row));  // the slices were checked to tile it
    };
    out.source = std::move(source);
    return out;
  }
  auto source = std::make_shared<TensorSource>();
  source->shape = global;
  source->dtype = parts.at(0).dtype();
  source->read = [parts, dim, global, position] {
    Tensor whole = Tensor::empty(global, parts.at(0).dtype());
    for (const NamedTensor& p : parts) copy_along(whole, p.whole(), dim, p.shard.start);
    return position.empty() ? whole : gather_rows(whole, position);
  };
  out.deferred = std::move(source);
  return out;
}

// Rank r's slice of `nt`, a tensor not held: `count` positions of dimension `dim` from r * count
// (along dim 0: of its rows in `order`, empty for their own order). Read when it is written: a
// streamed expert tensor one expert at a time, any other tensor whole and then cut.
NamedTensor cut_lazily(const NamedTensor& nt, int dim, const std::vector<int64_t>& order, int r,
                       int64_t count) {
  std::vector<int64_t> rows;  // along dim 0: the input rows of the slice
  for (int64_t i = r * count; dim == 0 && i < (r + 1) * count; ++i)
    rows.push_back(order.empty() ? i : order.at(static_cast<size_t>(i)));
  Shape shape = nt.shape();
  shape[static_cast<size_t>(dim)] = count;
  NamedTensor out{nt.name, Tensor(), nt.expert, ParamShard{nt.shape(), dim, r * count, count}};
  if (nt.streamed() && dim == 0) {
    auto source = std::make_shared<ExpertSource>();
    source->shape = shape;
    source->dtype = nt.dtype();
    source->read = [nt, rows](int64_t i) {
      return nt.expert_slice(rows.at(static_cast<size_t>(i)));
    };
    out.source = std::move(source);
    return out;
  }
  auto source = std::make_shared<TensorSource>();
  source->shape = shape;
  source->dtype = nt.dtype();
  source->read = [nt, dim, rows, r, count] {
    const Tensor whole = nt.whole();
    return dim == 0 ? gather_rows(whole, rows) : slice_dim(whole, dim, r * count, count);
  };
  out.deferred = std::move(source);
  return out;
}

}  // namespace

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

// ---- merge ------------------------------------------------------------------------------------

Checkpoint merge_shards(const std::vector<std::string>& files) {
  std::vector<Checkpoint> shards;
  shards.reserve(files.size());
  for (const std::string& f : files) shards.push_back(load_checkpoint(f, true));
  return merge_shards(std::move(shards), files);
}

Checkpoint open_merged(const std::vector<std::string>& files) {
  std::vector<Checkpoint> shards;
  shards.reserve(files.size());
  for (const std::string& f : files) shards.push_back(open_checkpoint_lazy(f, true));
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
    throw Error(str("missing shard: no file of rank 0 (", CheckpointDir::rank_file_name(0),
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
      throw Error(str("missing shard: rank ", r, "'s file (", CheckpointDir::rank_file_name(r),
                      ") is not among the inputs; a checkpoint of world size ", layout.world_size,
                      ", ep_size ", layout.ep_size,
                      layout.shard_embedding ? " with a sharded embedding" : "",
                      " has files for ranks ", *needed.begin(), "..", *needed.rbegin()));

  const ModelConfig config = config_of(head, str("'", head_name, "'"));
  const std::vector<int64_t> layer_of_block = moe_layer_of_block(config);
  const std::vector<std::vector<int>> placement =
      split_placement(layout.expert_rank, config, str("'", head_name, "'"));
  bool placed = false;  // a non-contiguous expert placement
  for (const auto& map : placement)
    placed |= !balance::is_contiguous_placement(map, layout.ep_size);

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
        merged.push_back(unsharded(first));
        continue;
      }
      for (const Piece& p : list) {
        const NamedTensor& t = *p.tensor;
        if (!t.shard.defined() || !same_shape_shard(t.shard, first.shard) ||
            t.dtype() != first.dtype() || t.expert != first.expert)
          throw Error(str("tensor '", name, "' of ", group_name, ": '", names[p.file], "' holds ",
                          described(t),
                          t.shard.defined() ? str(" as a slice of ", shape_str(t.shard.global),
                                                  " along dimension ", t.shard.dim)
                                            : std::string(" whole"),
                          ", '", names[list[0].file], "' ", described(first), " as a slice of ",
                          shape_str(first.shard.global), " along dimension ", first.shard.dim,
                          " (mismatched shards)"));
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
      std::vector<NamedTensor> parts;
      for (const Piece& p : list) parts.push_back(*p.tensor);
      std::vector<int64_t> position;  // expert -> row of the slices in rank-major order
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
        position.resize(order_of.size());
        for (size_t i = 0; i < order_of.size(); ++i)
          position[static_cast<size_t>(order_of[i])] = static_cast<int64_t>(i);
      }
      merged.push_back(joined(name, parts, dim, first.shard.global, first.expert, position));
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
  out.tokenizer = head.tokenizer;
  return out;
}

namespace {

Checkpoint whole_of(const std::vector<std::string>& paths, bool with_optim, bool* merged,
                    bool lazy) {
  std::vector<std::string> files = checkpoint_files(paths);
  if (files.size() == 1) {
    Checkpoint c = lazy ? open_checkpoint_lazy(files[0], with_optim)
                        : load_checkpoint(files[0], with_optim);
    if (c.sharding.rank < 0) {
      if (merged) *merged = false;
      return c;
    }
  }
  if (merged) *merged = true;
  Checkpoint c = lazy ? open_merged(files) : merge_shards(files);
  if (!with_optim) c.optim.clear();
  return c;
}

}  // namespace

Checkpoint load_whole(const std::vector<std::string>& paths, bool with_optim, bool* merged) {
  return whole_of(paths, with_optim, merged, false);
}

Checkpoint open_whole(const std::vector<std::string>& paths, bool with_optim, bool* merged) {
  return whole_of(paths, with_optim, merged, true);
}

// ---- partition --------------------------------------------------------------------------------

std::vector<Checkpoint> partition(const Checkpoint& whole, const PartitionOptions& options) {
  const int N = options.ranks;
  MOE_USAGE_CHECK(N >= 2, flag_for(Setting::ranks), " must be >= 2 (got ", N,
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
                  flag_for(Setting::shard_embedding), " needs an untied LM head, but the ",
                  arch_name(config.arch),
                  " flavour ties it to the token table (as moe-train refuses it)");
  MOE_USAGE_CHECK(!options.shard_embedding || config.d_model % N == 0,
                  flag_for(Setting::shard_embedding), ": ", N, " ranks do not divide d_model ",
                  config.d_model);
  const int64_t moe_layers = config.num_moe_layers();
  MOE_USAGE_CHECK(moe_layers > 0 || options.shard_embedding,
                  "the model has no MoE layer: nothing to partition over ranks");
  std::vector<std::vector<int>> maps;
  bool placed = false;
  if (options.placement.empty()) {
    for (int64_t e : config.experts_per_layer)
      if (e > 0) maps.push_back(balance::contiguous_placement(e, N));
  } else {
    MOE_USAGE_CHECK(static_cast<int64_t>(options.placement.size()) == moe_layers, "placement of ",
                    options.placement.size(), " MoE layers for a model of ", moe_layers);
    size_t l = 0;
    for (int64_t e : config.experts_per_layer) {
      if (e <= 0) continue;
      const std::vector<int>& map = options.placement[l];
      balance::per_rank(e, N);
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
      placed |= !balance::is_contiguous_placement(map, N);
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
    c.tokenizer = whole.tokenizer;
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
      (optim ? files[0].optim : files[0].params).push_back(unsharded(nt));
      return;
    }
    if (nt.shape() != param->shape())
      throw Error(str("optimizer tensor '", nt.name, "' is ", described(nt), ", its parameter '",
                      param->name, "' ", described(*param), ": cannot cut it like the parameter"));
    const int dim = table ? 1 : 0;
    MOE_CHECK(static_cast<int>(nt.shape().size()) > dim, "tensor '", nt.name, "' has no dimension ",
              dim, " to cut");
    const int64_t extent = nt.shape()[static_cast<size_t>(dim)], count = extent / N;
    std::vector<int64_t> order;  // experts in rank-major order (empty: contiguous)
    if (experts && placed) {
      const int64_t l = moe_layer_of_tensor(param->name, layer_of_block, "partition");
      const std::vector<int>& map = maps.at(static_cast<size_t>(l));
      MOE_CHECK(static_cast<int64_t>(map.size()) == extent, "tensor '", nt.name, "' has ", extent,
                " experts, its layer ", map.size());
      order = rank_major_order(map, N);
    } else if (experts) {
      balance::per_rank(extent, N);
    }
    // A held tensor is cut now; a lazy one (open_whole) when each rank's file is written.
    const Tensor source = !nt.held() || order.empty() ? nt.tensor : gather_rows(nt.tensor, order);
    for (int r = 0; r < N; ++r) {
      ParamShard shard{nt.shape(), dim, r * count, count};
      (optim ? files[static_cast<size_t>(r)].optim : files[static_cast<size_t>(r)].params)
          .push_back(nt.held() ? NamedTensor{nt.name, slice_dim(source, dim, r * count, count),
                                             nt.expert, shard}
                               : cut_lazily(nt, dim, order, r, count));
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

}  // namespace moe::io
