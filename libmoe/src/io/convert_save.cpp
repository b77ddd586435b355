// How converted checkpoints are written (see moe/io/convert.h): the conversion history every
// converted file carries, the streaming layout (one expert written at a time) of frozen
// checkpoints, and sharded directories, each through an AtomicFile. Shape letters: E experts of a
// layer.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/json_text.h"
#include "io/convert_internal.h"
#include "io/files.h"
#include "io/json_attrs.h"
#include "moe/io/atomic_file.h"
#include "moe/io/convert.h"
#include "moe/io/hdf5.h"
#include "moe/settings.h"

namespace moe::io {

namespace fs = std::filesystem;

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
  const std::string place = attribute_place("checkpoint", path, "history");
  nlohmann::json j = read_json_attr(file, "history", place, root);
  // A list of provenance records, each as to_json writes it.
  const std::string wrong = json_type_mismatch(j, nlohmann::json::array({to_json(Provenance{})}));
  if (!wrong.empty()) throw Error(str(place, ": ", wrong));
  return j;
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
  AtomicFile out(path, AtomicFile::Kind::file, ".convert-");
  const std::string& temp = out.temp();
  save_checkpoint(temp, ckpt);
  {
    h5::Session session;
    h5::Where root{temp, "/"};
    h5::WriteFile file = h5::open_file_readwrite(temp);
    h5::write_string_attr(file, "history", history.dump(), root);
    file.close(root);
  }
  out.commit();
  out.sync_directory();
}

// ---- the streaming layout of frozen checkpoints -----------------------------------------------

namespace {

// An empty expert-tensor dataset laid out as h5::write_tensor lays it out (one Fletcher32 chunk
// per expert, attributes dtype and expert = 1); the data is written later, expert by expert.
h5::Dataset create_expert_dataset(hid_t group, const NamedTensor& nt, const h5::Where& where) {
  const Shape& shape = nt.shape();
  const DType dtype = nt.dtype();
  h5::Where w = where.at(str(where.object, "/", nt.name));
  MOE_CHECK(!shape.empty() && shape_numel(shape) > 0, w.describe(), ": expert tensor ",
            shape_str(shape), " needs a leading expert dimension and elements");
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  h5::Space space(MOE_H5(w, H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)));
  h5::Plist dcpl(MOE_H5(w, H5Pcreate(H5P_DATASET_CREATE)));
  MOE_H5(w, H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
  std::vector<hsize_t> chunk = h5::chunk_shape(shape, dtype_size(dtype), true);
  MOE_H5(w, H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
  MOE_H5(w, H5Pset_fletcher32(dcpl));
  // No chunk cache: each chunk is allocated and written when its expert is written (a cache would
  // hold the chunks back and allocate them, tensor by tensor, when the dataset closes).
  h5::Plist dapl(MOE_H5(w, H5Pcreate(H5P_DATASET_ACCESS)));
  MOE_H5(w, H5Pset_chunk_cache(dapl, 0, 0, H5D_CHUNK_CACHE_W0_DEFAULT));
  h5::Type type = h5::dtype_type(dtype);
  h5::Dataset dataset(
      MOE_H5(w, H5Dcreate2(group, nt.name.c_str(), type, space, H5P_DEFAULT, dcpl, dapl)));
  h5::write_string_attr(dataset, "dtype", dtype_name(dtype), w);
  h5::write_int_attr(dataset, "expert", 1, w, H5T_STD_U8LE);
  return dataset;
}

// Expert `e` of nt (its row of the leading dimension) into `dataset`: a view of a held tensor, or
// the one slice a streamed tensor's source gives.
void write_expert_row(hid_t dataset, const NamedTensor& nt, int64_t e, const h5::Where& w) {
  const Shape& shape = nt.shape();
  const int rank = static_cast<int>(shape.size());
  std::vector<hsize_t> start(static_cast<size_t>(rank), 0), count(shape.begin(), shape.end());
  start[0] = static_cast<hsize_t>(e);
  count[0] = 1;
  const Tensor slice = nt.expert_slice(e);
  h5::Space file_space(MOE_H5(w, H5Dget_space(dataset)));
  MOE_H5(w, H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(),
                                nullptr));
  h5::Space memory(MOE_H5(w, H5Screate_simple(rank, count.data(), nullptr)));
  h5::Type type = h5::dtype_type(nt.dtype());
  MOE_H5(w, H5Dwrite(dataset, type, memory, file_space, H5P_DEFAULT, slice.raw()));
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
      if (nt.expert && !nt.is_deferred())
        experts.emplace_back(&nt, create_expert_dataset(params, nt, pw));
      else  // a deferred tensor is read here and released once written
        h5::write_tensor(params, nt.name, nt.whole(), nt.expert, pw);
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
      for (size_t j : members) count = std::max(count, experts[j].first->shape()[0]);
      for (int64_t e = 0; e < count; ++e)
        for (size_t j : members)
          if (e < experts[j].first->shape()[0])
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
      if (nt.streamed())
        h5::write_expert_rows(optim, nt.name, nt.shape(), nt.dtype(), nt.source->read, ow);
      else
        h5::write_tensor(optim, nt.name, nt.whole(), nt.expert, ow);
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
  write_stored_tokenizer(file, ckpt.tokenizer, root);
  MOE_H5(root, H5Fflush(file, H5F_SCOPE_GLOBAL));
  file.close(root);
}

}  // namespace

void save_streaming(const std::string& path, const Checkpoint& ckpt,
                    const nlohmann::json& history) {
  AtomicFile out(path);
  try {
    {
      h5::Session session;
      write_streaming_file(out.temp(), ckpt, history);
    }
    out.commit();
  } catch (const Error& e) {
    out.abandon();
    throw Error(str("saving checkpoint '", path, "': ", e.what()));
  }
  out.sync_directory();
}

// ---- sharded directories --------------------------------------------------------------------

void save_sharded(const std::string& dir, const std::vector<Checkpoint>& files, bool replace,
                  const nlohmann::json& history) {
  std::error_code ec;
  fs::path target = fs::path(dir);
  if (target.filename().empty()) target = target.parent_path();  // "out/" -> "out"
  const bool exists = fs::exists(fs::symlink_status(target, ec));
  if (exists && !replace)
    throw Error(str("'", dir, "' already exists; remove it or pass ", flag_for(Setting::force),
                    " to replace it"));
  if (exists && !fs::is_directory(target, ec))
    throw Error(str("'", dir, "' exists and is not a directory"));
  // Written whole beside the target, then swapped in: a failure keeps the old directory.
  AtomicFile out(dir, AtomicFile::Kind::directory);
  const fs::path temp(out.temp());
  for (const Checkpoint& c : files)
    save_converted((temp / CheckpointDir::rank_file_name(c.sharding.rank)).string(), c, history);
  out.commit();
  out.sync_directory();
}

}  // namespace moe::io
