// moe-convert inspect (see moe/io/convert.h): a checkpoint's config, tensors, storage and
// provenance from its metadata, and with --verify every chunk read and the loaders' checks.

#include <algorithm>
#include <map>
#include <set>

#include "io/convert_internal.h"
#include "io/json_attrs.h"
#include "moe/io/convert.h"
#include "moe/io/hdf5.h"
#include "moe/io/tokenizer.h"

namespace moe::io {

// ---- inspect ----------------------------------------------------------------------------------

namespace {

std::string optional_string(hid_t object, const char* name, const h5::Where& where) {
  return h5::has_attr(object, name, where) ? h5::read_string_attr(object, name, where)
                                           : std::string();
}

struct ChunkPlace {
  haddr_t address = 0;
  hsize_t size = 0;
  int64_t expert = 0;  // the chunk's first index along the leading dimension
};

// Whether `chunks`, in order of address, follow one another with nothing between them but the
// alignment padding of files we write (less than h5::kDataAlignment bytes after each).
bool adjacent(std::vector<ChunkPlace> chunks) {
  std::sort(chunks.begin(), chunks.end(),
            [](const ChunkPlace& a, const ChunkPlace& b) { return a.address < b.address; });
  for (size_t i = 1; i < chunks.size(); ++i) {
    const haddr_t end = chunks[i - 1].address + chunks[i - 1].size;
    if (chunks[i].address < end || chunks[i].address - end >= h5::kDataAlignment) return false;
  }
  return !chunks.empty();
}

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

// What inspect says of the stored tokenizer (CheckpointInfo::tokenizer).
std::string describe_tokenizer(const std::string& path, bool verify) {
  StoredTokenizer stored = read_tokenizer(path);
  if (stored.empty()) return "";
  const std::string file = stored.file;
  const size_t bytes = stored.bytes.size();
  try {
    return tokenizer_from_bytes(file, std::move(stored.bytes), path)->describe();
  } catch (const Error& e) {
    if (verify) throw;
    return str(file, " (", bytes, " bytes): ", e.what());
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
    nlohmann::json train_config = read_json_attr(
        file, "train_config", attribute_place("checkpoint", path, "train_config"), root);
    if (fi == 0) {
      info.model_config = model_config;
      info.train_config = train_config;
      info.tokenizer = describe_tokenizer(path, verify);
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
      // The layer's chunks, and each expert's (of all the block's expert tensors), adjacent?
      entry.first.one_extent = adjacent(expert_chunks[block]);
      std::map<int64_t, std::vector<ChunkPlace>> by_expert;
      for (const ChunkPlace& c : expert_chunks[block]) by_expert[c.expert].push_back(c);
      bool runs = !by_expert.empty();
      for (auto& [e, list] : by_expert) runs = runs && adjacent(list);
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
          {"tokenizer", info.tokenizer.empty() ? json(nullptr) : json(info.tokenizer)},
          {"moe_layers", layers},
          {"tensors", tensors}};
}

}  // namespace moe::io
