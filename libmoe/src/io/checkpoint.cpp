// Checkpoint version 1: writer (atomic: temp file, fsync, rename, fsync dir), validating reader,
// single-tensor and single-expert readers, provenance helpers. Layout: docs/FORMATS.md.
// Shape letters: E experts (leading dimension of expert tensors, one chunk per expert).
#include "moe/io/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "core/json_text.h"
#include "io/files.h"
#include "io/json_attrs.h"
#include "io/mapped_weights.h"
#include "moe/io/atomic_file.h"
#include "moe/io/finite.h"
#include "moe/io/hdf5.h"
#include "moe/io/tokenizer.h"
#include "moe/log.h"
#include "moe/timer.h"
#include "moe/version.h"

namespace moe::io {

namespace {

using h5::Where;

const char* const kParamsGroup = "params";
const char* const kOptimGroup = "optim";

// ---- writing ----------------------------------------------------------------------------------

void check_tensor_name(const std::string& name, const Where& where, std::set<std::string>& seen) {
  MOE_CHECK(!name.empty(), where.describe(), ": a tensor has an empty name");
  MOE_CHECK(name.find('/') == std::string::npos && name != "." && name != "..", where.describe(),
            ": tensor name '", name, "' is not a valid dataset name (no '/', not '.' or '..')");
  MOE_CHECK(seen.insert(name).second, where.describe(), ": tensor name '", name, "' appears twice");
}

std::string dump_json(const nlohmann::json& value, const char* what) {
  try {
    return value.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(what, " cannot be written as JSON: ", e.what()));
  }
}

void write_tensors(hid_t file, const char* group_name, const std::vector<NamedTensor>& tensors,
                   const Where& root, const SaveOptions& options) {
  h5::Group group = h5::create_group(file, group_name, root);
  Where where = root.at(str("/", group_name));
  std::set<std::string> seen;
  // Names are checked as they are written, so a bad one fails a write in progress (and the
  // temporary file is removed) exactly like an I/O error would.
  for (const NamedTensor& t : tensors) {
    check_tensor_name(t.name, where, seen);
    if (t.streamed()) {
      MOE_CHECK(t.expert, where.describe(), ": streamed tensor '", t.name,
                "' is not marked as an expert tensor");
      h5::write_expert_rows(group, t.name, t.source->shape, t.source->dtype, t.source->read, where,
                            options.max_chunk_bytes, &t.shard);
    } else {
      // A deferred tensor is read here and released when written: one at a time.
      h5::write_tensor(group, t.name, t.whole(), t.expert, where, options.max_chunk_bytes,
                       &t.shard);
    }
  }
  group.close(where);
}

}  // namespace

void write_stored_tokenizer(hid_t file, const StoredTokenizer& tokenizer, const h5::Where& root) {
  if (tokenizer.empty()) return;
  MOE_CHECK(tokenizer.file == kTokenizerJson || tokenizer.file == kTokenizerModel, root.describe(),
            ": tokenizer file '", tokenizer.file, "' is not ", kTokenizerJson, " or ",
            kTokenizerModel);
  h5::Group group = h5::create_group(file, "tokenizer", root);
  Tensor bytes = Tensor::empty({static_cast<int64_t>(tokenizer.bytes.size())}, DType::u8);
  if (!tokenizer.bytes.empty())
    std::memcpy(bytes.raw(), tokenizer.bytes.data(), tokenizer.bytes.size());
  h5::write_tensor(group, tokenizer.file, bytes, false, root.at("/tokenizer"));
}

namespace {

void write_file(const std::string& file_path, const Checkpoint& ckpt, const SaveOptions& options) {
  Where root{file_path, "/"};
  MOE_CHECK(ckpt.sharding.world_size >= 1 && ckpt.sharding.ep_size >= 1, root.describe(),
            ": sharding world_size ", ckpt.sharding.world_size, " and ep_size ",
            ckpt.sharding.ep_size, " must be >= 1");
  const Provenance& p = ckpt.provenance;
  std::string created = p.time.empty() ? utc_timestamp() : p.time;
  std::string model_config = dump_json(ckpt.model_config, "model_config");
  std::string train_config = dump_json(ckpt.train_config, "train_config");

  h5::WriteFile file = h5::create_file(file_path);
  {
    Provenance stamped = p;
    stamped.time = created;
    write_producer_attrs(file, kCheckpointFormat, kCheckpointVersion, stamped, root);
    h5::Group r(MOE_H5(root, H5Gopen2(file, "/", H5P_DEFAULT)));
    h5::write_string_attr(r, "model_config", model_config, root);
    h5::write_string_attr(r, "train_config", train_config, root);
  }
  write_tensors(file, kParamsGroup, ckpt.params, root, options);
  write_tensors(file, kOptimGroup, ckpt.optim, root, options);
  {
    h5::Group state = h5::create_group(file, "state", root);
    Where w = root.at("/state");
    h5::write_int_attr(state, "step", ckpt.state.step, w);
    h5::write_int_attr(state, "tokens_seen", ckpt.state.tokens_seen, w);
    h5::write_int_attr(state, "data_cursor", ckpt.state.data_cursor, w);
    h5::write_uint_attr(state, "seed", ckpt.state.seed, w);
  }
  {
    h5::Group sharding = h5::create_group(file, "sharding", root);
    Where w = root.at("/sharding");
    h5::write_int_attr(sharding, "world_size", ckpt.sharding.world_size, w, H5T_STD_I32LE);
    h5::write_int_attr(sharding, "ep_size", ckpt.sharding.ep_size, w, H5T_STD_I32LE);
    h5::write_int32_array_attr(sharding, "expert_rank", ckpt.sharding.expert_rank, w);
    if (ckpt.sharding.rank >= 0) {
      h5::write_int_attr(sharding, "rank", ckpt.sharding.rank, w, H5T_STD_I32LE);
      h5::write_int_attr(sharding, "shard_embedding", ckpt.sharding.shard_embedding ? 1 : 0, w,
                         H5T_STD_U8LE);
    }
  }
  write_stored_tokenizer(file, ckpt.tokenizer, root);
  MOE_H5(root, H5Fflush(file, H5F_SCOPE_GLOBAL));
  file.close(root);  // a failure to close (the last metadata write) is a failed save
}

// ---- reading ----------------------------------------------------------------------------------

struct Opened {
  h5::File file;
  Where root;
};

// Checks the root attributes `format` and `format_version` of an open checkpoint.
Opened check_checkpoint(h5::File file, const std::string& path) {
  Opened c{std::move(file), Where{path, "/"}};
  const Where& root = c.root;
  if (!h5::has_attr(c.file, "format", root))
    throw Error(str("checkpoint '", path, "': not a moe checkpoint (no 'format' attribute)"));
  std::string format = h5::read_string_attr(c.file, "format", root);
  if (format != kCheckpointFormat)
    throw Error(str("checkpoint '", path, "': not a moe checkpoint (format is '", format,
                    "', expected '", kCheckpointFormat, "')"));
  if (!h5::has_attr(c.file, "format_version", root))
    throw Error(str("checkpoint '", path, "': no 'format_version' attribute"));
  int64_t version = h5::read_int_attr(c.file, "format_version", root);
  if (version != kCheckpointVersion)
    throw Error(str("checkpoint '", path, "': checkpoint format version ", version,
                    ", this build reads version ", kCheckpointVersion));
  return c;
}

Opened open_checkpoint(const std::string& path) {
  return check_checkpoint(h5::open_file_readonly(path, "checkpoint"), path);
}

// A JSON attribute of the checkpoint; model_config's values are type-checked (io/json_attrs.h), so
// a fault names the file, the attribute and the key.
nlohmann::json config_attr(const Opened& c, const char* name) {
  const std::string place = attribute_place("checkpoint", c.root.file, name);
  nlohmann::json j = read_json_attr(c.file, name, place, c.root);
  if (std::string_view(name) == "model_config") check_model_config(j, place);
  return j;
}

std::string optional_string_attr(hid_t object, const char* name, const Where& where) {
  return h5::has_attr(object, name, where) ? h5::read_string_attr(object, name, where)
                                           : std::string();
}

// An open checkpoint file shared by the sources of its streamed tensors: it closes when the last
// of them goes (under the HDF5 lock, like every HDF5 call).
struct SharedFile {
  explicit SharedFile(Opened c) : opened(std::move(c)) {}
  SharedFile(const SharedFile&) = delete;
  SharedFile& operator=(const SharedFile&) = delete;
  Opened opened;
  ~SharedFile() {
    h5::Session session;
    opened.file.reset();
  }
};

// Expert e of dataset /group/name of an open checkpoint, reading that chunk only.
std::shared_ptr<const ExpertSource> expert_source(std::shared_ptr<SharedFile> shared,
                                                  const char* group_name, const std::string& name,
                                                  const h5::DatasetInfo& info) {
  auto source = std::make_shared<ExpertSource>();
  source->shape = info.shape;
  source->dtype = info.dtype;
  source->read = [shared = std::move(shared), group_name, name](int64_t expert) {
    h5::Session session;
    const Opened& c = shared->opened;
    h5::Group group = h5::open_group(c.file, group_name, c.root);
    return h5::read_tensor_row(group, name, expert, c.root.at(str("/", group_name)));
  };
  return source;
}

// Dataset /group/name of an open checkpoint, read whole when asked.
std::shared_ptr<const TensorSource> deferred_source(std::shared_ptr<SharedFile> shared,
                                                    const char* group_name, const std::string& name,
                                                    const h5::DatasetInfo& info) {
  auto source = std::make_shared<TensorSource>();
  source->shape = info.shape;
  source->dtype = info.dtype;
  source->read = [shared = std::move(shared), group_name, name]() {
    h5::Session session;
    const Opened& c = shared->opened;
    h5::Group group = h5::open_group(c.file, group_name, c.root);
    Tensor t = h5::read_tensor(group, name, c.root.at(str("/", group_name)));
    t.set_name(name);
    return t;
  };
  return source;
}

// How read_tensors treats a dataset: read now, or leave it in the file behind a source (expert
// tensors chosen by a StreamFilter; every tensor when lazy).
struct ReadMode {
  const StreamFilter* stream = nullptr;
  bool lazy = false;
  std::shared_ptr<SharedFile> shared;  // set when anything may stay in the file
  // Set: /params tensors are mapped where they can be; with it, verify checks each mapped chunk's
  // checksum before mapping it.
  std::shared_ptr<const MappedFile> map = nullptr;
  bool verify = false;
};

// /params/name as a deferred tensor whose read maps it (NamedTensor::mapped), when mode says so
// and its storage allows (io::plan_mapping, which refuses a chunk past the end of the file now);
// nothing otherwise. Mapping one tensor at a time lets a loader release what the mapping replaces
// before the next is mapped. Should mmap refuse (a tight address-space limit), the read falls
// back to reading the dataset, its values checked as a read tensor's are.
std::optional<NamedTensor> mapped_tensor(hid_t group, const std::string& name, const ReadMode& mode,
                                         const Where& w) {
  h5::DatasetInfo info;
  std::optional<MappingPlan> plan;
  {
    h5::Dataset dataset(MOE_H5(w, H5Dopen2(group, name.c_str(), H5P_DEFAULT)));
    info = h5::dataset_info(dataset, w);
    if (info.shard.defined()) return std::nullopt;
    plan = plan_mapping(*mode.map, dataset, info, w);
  }
  if (!plan) return std::nullopt;
  auto source = std::make_shared<TensorSource>();
  source->shape = info.shape;
  source->dtype = info.dtype;
  const auto fallback = deferred_source(mode.shared, kParamsGroup, name, info);
  source->read = [file = mode.map, plan = std::move(*plan), verify = mode.verify, fallback,
                  name]() {
    Tensor t = map_planned(*file, plan, verify);
    if (!t.defined()) {
      t = fallback->read();
      check_finite(str("'", file->path(), "'"), name, t);
    }
    t.set_name(name);
    return t;
  };
  NamedTensor nt{name, Tensor(), info.expert, info.shard};
  nt.deferred = std::move(source);
  nt.mapped = true;
  return nt;
}

std::vector<NamedTensor> read_tensors(const Opened& c, const char* group_name,
                                      const ReadMode& mode = {}) {
  h5::Group group = h5::open_group(c.file, group_name, c.root);
  Where where = c.root.at(str("/", group_name));
  const bool optim = std::string_view(group_name) == kOptimGroup;
  std::vector<NamedTensor> tensors;
  for (const std::string& name : h5::list_links(group, where)) {
    if (mode.map && !optim) {
      std::optional<NamedTensor> nt =
          mapped_tensor(group, name, mode, c.root.at(str("/", group_name, "/", name)));
      if (nt) {
        tensors.push_back(std::move(*nt));
        continue;
      }
    }
    if (mode.lazy || (mode.stream && *mode.stream && (*mode.stream)(optim, name))) {
      Where w = c.root.at(str("/", group_name, "/", name));
      h5::DatasetInfo info;
      {
        h5::Dataset dataset(MOE_H5(w, H5Dopen2(group, name.c_str(), H5P_DEFAULT)));
        info = h5::dataset_info(dataset, w);
      }
      if (info.expert) {
        tensors.push_back(NamedTensor{name, Tensor(), true, info.shard,
                                      expert_source(mode.shared, group_name, name, info)});
        continue;
      }
      if (mode.lazy) {
        NamedTensor nt{name, Tensor(), false, info.shard};
        nt.deferred = deferred_source(mode.shared, group_name, name, info);
        tensors.push_back(std::move(nt));
        continue;
      }
    }
    h5::DatasetInfo info;
    Tensor t = h5::read_tensor(group, name, where, &info);
    tensors.push_back(NamedTensor{name, std::move(t), info.expert, info.shard});
  }
  return tensors;
}

Tensor read_one(const std::string& path, const char* group_name, const std::string& name) {
  h5::Session session;
  Opened c = open_checkpoint(path);
  h5::Group group = h5::open_group(c.file, group_name, c.root);
  Where where = c.root.at(str("/", group_name));
  if (!h5::has_link(group, name, where))
    throw Error(str("checkpoint '", path, "': no tensor '", name, "' in /", group_name));
  return h5::read_tensor(group, name, where);
}

Tensor read_one_expert(const std::string& path, const char* group_name, const std::string& name,
                       int64_t expert) {
  h5::Session session;
  Opened c = open_checkpoint(path);
  h5::Group group = h5::open_group(c.file, group_name, c.root);
  Where where = c.root.at(str("/", group_name));
  Where w = c.root.at(str("/", group_name, "/", name));
  if (!h5::has_link(group, name, where))
    throw Error(str("checkpoint '", path, "': no tensor '", name, "' in /", group_name));
  h5::DatasetInfo info;
  {
    h5::Dataset dataset(MOE_H5(w, H5Dopen2(group, name.c_str(), H5P_DEFAULT)));
    info = h5::dataset_info(dataset, w);
  }
  if (!info.expert)
    throw Error(str(w.describe(), ": not an expert tensor (shape ", shape_str(info.shape),
                    "); read it with read_param"));
  if (expert < 0 || expert >= info.shape[0])
    throw Error(str(w.describe(), ": expert ", expert, " out of range, the tensor has ",
                    info.shape[0], " experts"));
  return h5::read_tensor_row(group, name, expert, where);
}

std::vector<std::string> list_group(const std::string& path, const char* group_name) {
  h5::Session session;
  Opened c = open_checkpoint(path);
  h5::Group group = h5::open_group(c.file, group_name, c.root);
  return h5::list_links(group, c.root.at(str("/", group_name)));
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& ckpt, const SaveOptions& options) {
  h5::Session session;
  Timer timer;
  AtomicFile out(path);
  try {
    write_file(out.temp(), ckpt, options);
    out.commit();
  } catch (const Error& e) {
    out.abandon();
    throw Error(str("saving checkpoint '", path, "': ", e.what()));
  }
  try {
    out.sync_directory();
  } catch (const Error& e) {
    throw Error(
        str("saved checkpoint '", path, "' but could not make the rename durable: ", e.what()));
  }
  std::error_code ec;
  MOE_LOG_DEBUG("wrote checkpoint ", path, " (step ", ckpt.state.step, "): ", ckpt.params.size(),
                " parameter and ", ckpt.optim.size(), " optimizer tensors, ",
                std::filesystem::file_size(path, ec), " bytes in ", timer.seconds(), " s");
}

namespace {

// /tokenizer: one u8 dataset named for its file (tokenizer.json or tokenizer.model), or nothing.
StoredTokenizer read_stored_tokenizer(hid_t file, const Where& root) {
  StoredTokenizer t;
  if (!h5::has_link(file, "tokenizer", root)) return t;
  h5::Group group = h5::open_group(file, "tokenizer", root);
  const Where w = root.at("/tokenizer");
  const std::vector<std::string> names = h5::list_links(group, w);
  MOE_CHECK(names.size() == 1 && (names[0] == kTokenizerJson || names[0] == kTokenizerModel),
            w.describe(), ": expected one dataset, ", kTokenizerJson, " or ", kTokenizerModel,
            "; found ", names.size(), names.empty() ? "" : str(" ('", names[0], "'...)"));
  const Tensor bytes = h5::read_tensor(group, names[0], w);
  MOE_CHECK(bytes.dtype() == DType::u8 && bytes.ndim() == 1, w.describe(), "/", names[0], ": ",
            bytes.describe(), " is not a byte string (u8, one dimension)");
  t.file = names[0];
  t.bytes.assign(static_cast<const char*>(bytes.raw()), static_cast<size_t>(bytes.numel()));
  return t;
}

Checkpoint load_opened(const Opened& c, bool with_optim, const ReadMode& mode = {}) {
  const Where& root = c.root;
  Checkpoint ckpt;
  ckpt.model_config = config_attr(c, "model_config");
  ckpt.train_config = config_attr(c, "train_config");
  ckpt.provenance.tool = optional_string_attr(c.file, "producer_tool", root);
  ckpt.provenance.version = optional_string_attr(c.file, "producer_version", root);
  ckpt.provenance.git = optional_string_attr(c.file, "producer_git", root);
  ckpt.provenance.argv = optional_string_attr(c.file, "argv", root);
  ckpt.provenance.time = optional_string_attr(c.file, "created", root);

  ckpt.params = read_tensors(c, kParamsGroup, mode);
  if (with_optim && h5::has_link(c.file, kOptimGroup, root))
    ckpt.optim = read_tensors(c, kOptimGroup, mode);

  {
    h5::Group state = h5::open_group(c.file, "state", root);
    Where w = root.at("/state");
    ckpt.state.step = h5::read_int_attr(state, "step", w);
    ckpt.state.tokens_seen = h5::read_int_attr(state, "tokens_seen", w);
    ckpt.state.data_cursor = h5::read_int_attr(state, "data_cursor", w);
    ckpt.state.seed = h5::read_uint_attr(state, "seed", w);
  }
  {
    h5::Group sharding = h5::open_group(c.file, "sharding", root);
    Where w = root.at("/sharding");
    Sharding& s = ckpt.sharding;
    s.world_size = static_cast<int>(h5::read_int_attr(sharding, "world_size", w));
    s.ep_size = static_cast<int>(h5::read_int_attr(sharding, "ep_size", w));
    s.expert_rank = h5::read_int32_array_attr(sharding, "expert_rank", w);
    MOE_CHECK(s.world_size >= 1 && s.ep_size >= 1, w.describe(), ": world_size ", s.world_size,
              " and ep_size ", s.ep_size, " must be >= 1");
    for (size_t e = 0; e < s.expert_rank.size(); ++e)
      MOE_CHECK(s.expert_rank[e] >= 0 && s.expert_rank[e] < s.world_size, w.describe(),
                ": expert_rank[", e, "] = ", s.expert_rank[e], " is not a rank of world_size ",
                s.world_size);
    if (h5::has_attr(sharding, "rank", w)) {
      s.rank = static_cast<int>(h5::read_int_attr(sharding, "rank", w));
      MOE_CHECK(s.rank >= 0 && s.rank < s.world_size, w.describe(), ": rank ", s.rank,
                " is not a rank of world_size ", s.world_size);
      s.shard_embedding = h5::has_attr(sharding, "shard_embedding", w) &&
                          h5::read_int_attr(sharding, "shard_embedding", w) != 0;
    }
  }
  ckpt.tokenizer = read_stored_tokenizer(c.file, root);
  return ckpt;
}

}  // namespace

Checkpoint load_checkpoint(const std::string& path, bool with_optim) {
  h5::Session session;
  Timer timer;
  Checkpoint c = load_opened(open_checkpoint(path), with_optim);
  MOE_LOG_DEBUG("read checkpoint ", path, " (step ", c.state.step, "): ", c.params.size(),
                " parameter and ", c.optim.size(), " optimizer tensors in ", timer.seconds(), " s");
  return c;
}

Checkpoint load_checkpoint(const std::string& path, bool with_optim, const StreamFilter& stream) {
  h5::Session session;
  // The sources of streamed tensors read from this very handle, after this call returns.
  auto shared = std::make_shared<SharedFile>(open_checkpoint(path));
  Timer timer;
  Checkpoint c = load_opened(shared->opened, with_optim, ReadMode{&stream, false, shared});
  size_t streamed = 0;
  for (const NamedTensor& nt : c.params) streamed += nt.streamed();
  for (const NamedTensor& nt : c.optim) streamed += nt.streamed();
  MOE_LOG_DEBUG("read checkpoint ", path, " (step ", c.state.step, "): ", c.params.size(),
                " parameter and ", c.optim.size(), " optimizer tensors in ", timer.seconds(),
                " s, ", streamed, " of them streamed (read an expert at a time later)");
  return c;
}

Checkpoint map_checkpoint(const std::string& path, const StreamFilter& stream,
                          const MapOptions& options) {
  h5::Session session;
  auto shared = std::make_shared<SharedFile>(open_checkpoint(path));
  Timer timer;
  ReadMode mode{&stream, false, shared, std::make_shared<const MappedFile>(path), options.verify};
  Checkpoint c = load_opened(shared->opened, false, mode);
  size_t mapped = 0;
  for (const NamedTensor& nt : c.params) mapped += nt.mapped;
  MOE_LOG_DEBUG("opened checkpoint ", path, " (step ", c.state.step, "): ", c.params.size(),
                " parameter tensors in ", timer.seconds(), " s, ", mapped,
                " of them to be mapped when read");
  return c;
}

Checkpoint open_checkpoint_lazy(const std::string& path, bool with_optim) {
  h5::Session session;
  auto shared = std::make_shared<SharedFile>(open_checkpoint(path));
  return load_opened(shared->opened, with_optim, ReadMode{nullptr, true, shared});
}

Checkpoint load_checkpoint_image(const std::string& bytes, const std::string& name,
                                 bool with_optim) {
  h5::Session session;
  return load_opened(check_checkpoint(h5::open_image(bytes, name, "checkpoint"), name), with_optim);
}

Tensor NamedTensor::expert_slice(int64_t e) const {
  // A whole tensor need not be marked `expert` (files of other writers): its rows are its experts.
  MOE_CHECK((expert || !source) && shape().size() >= 1 && e >= 0 && e < shape()[0], "tensor '",
            name, "': no expert ", e, " (", expert ? "expert tensor " : "tensor ",
            shape_str(shape()), ")");
  const Shape rest(shape().begin() + 1, shape().end());
  if (deferred) return whole().rows(e, e + 1).reshape(rest);
  if (!source) return tensor.rows(e, e + 1).reshape(rest);
  Tensor slice = source->read(e);
  MOE_CHECK(slice.defined() && slice.dtype() == dtype() &&
                shape_numel(slice.shape()) == shape_numel(rest),
            "tensor '", name, "': expert ", e, "'s slice is ",
            slice.defined() ? slice.describe() : std::string("undefined"), ", expected ",
            shape_str(rest), " ", dtype_name(dtype()));
  return slice.reshape(rest);
}

Tensor NamedTensor::whole() const {
  if (deferred) {
    Tensor t = deferred->read();
    MOE_CHECK(t.defined() && t.dtype() == deferred->dtype && t.shape() == deferred->shape,
              "tensor '", name, "' was read as ", t.defined() ? t.describe() : "undefined",
              ", expected ", shape_str(deferred->shape), " ", dtype_name(deferred->dtype));
    return t;
  }
  if (!source) return tensor;
  Tensor all = Tensor::empty(shape(), dtype());
  all.set_name(name);
  for (int64_t e = 0; e < shape()[0]; ++e)
    all.rows(e, e + 1).copy_from(expert_slice(e).reshape(all.rows(e, e + 1).shape()));
  return all;
}

bool converts_on_load(const Param& p, DType stored) {
  return p.frozen && p.value.defined() && is_floating(stored) && is_floating(p.value.dtype());
}

void check_params_match(const ParamSet& params, const std::vector<NamedTensor>& tensors,
                        const std::string& source) {
  std::set<std::string> seen;
  for (const NamedTensor& nt : tensors) {
    const Param* p = params.find(nt.name);
    MOE_CHECK(p, source, ": checkpoint tensor '", nt.name, "' is not a parameter of this model");
    // An offloaded parameter (its store holds the values) or one whose value is released between
    // uses (--zero 3) has the ParamSet's dtype.
    const DType dtype = p->offloaded || !p->value.defined() ? params.dtype() : p->value.dtype();
    MOE_CHECK(nt.dtype() != DType::u8 || dtype == DType::u8, source, ": checkpoint tensor '",
              nt.name,
              "' holds quantised rows (moe-convert quantize): only moe-infer reads them; "
              "use the checkpoint that was quantised");
    MOE_CHECK(nt.shape() == p->shape && (nt.dtype() == dtype || converts_on_load(*p, nt.dtype())),
              source, ": checkpoint tensor ",
              nt.held() ? nt.tensor.describe()
                        : str(nt.name, shape_str(nt.shape()), " ", dtype_name(nt.dtype())),
              " does not match parameter ", p->name, shape_str(p->shape), " ", dtype_name(dtype));
    seen.insert(nt.name);
  }
  for (const Param* p : params.all())
    MOE_CHECK(seen.count(p->name), source, ": checkpoint has ", tensors.size(),
              " parameter tensors, the model ", params.size(), ": parameter '", p->name,
              "' is missing");
}

nlohmann::json read_model_config(const std::string& path) {
  h5::Session session;
  Opened c = open_checkpoint(path);
  return config_attr(c, "model_config");
}

StoredTokenizer read_tokenizer(const std::string& path) {
  h5::Session session;
  Opened c = open_checkpoint(path);
  return read_stored_tokenizer(c.file, c.root);
}

Tensor read_param(const std::string& path, const std::string& name) {
  return read_one(path, kParamsGroup, name);
}

Tensor read_expert(const std::string& path, const std::string& name, int64_t expert) {
  return read_one_expert(path, kParamsGroup, name, expert);
}

std::vector<std::string> list_params(const std::string& path) {
  return list_group(path, kParamsGroup);
}

std::vector<std::string> list_optim(const std::string& path) {
  return list_group(path, kOptimGroup);
}

Tensor read_optim(const std::string& path, const std::string& name) {
  return read_one(path, kOptimGroup, name);
}

Tensor read_optim_expert(const std::string& path, const std::string& name, int64_t expert) {
  return read_one_expert(path, kOptimGroup, name, expert);
}

// ---- provenance -------------------------------------------------------------------------------

std::string shell_quote(std::string_view arg) {
  auto safe = [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           std::strchr("_@%+=:,./-", ch) != nullptr;
  };
  bool plain = !arg.empty();
  for (char ch : arg) plain = plain && ch != '\0' && safe(ch);
  if (plain) return std::string(arg);
  std::string quoted = "'";
  for (char ch : arg) {
    if (ch == '\'')
      quoted += "'\\''";
    else
      quoted += ch;
  }
  return quoted + "'";
}

std::string join_argv(int argc, const char* const* argv) {
  std::string line;
  for (int i = 0; i < argc; ++i) {
    if (i) line += ' ';
    line += shell_quote(argv[i] ? argv[i] : "");
  }
  return line;
}

std::string utc_timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

Provenance make_provenance(std::string tool, int argc, const char* const* argv) {
  return Provenance{std::move(tool), moe::version(), moe::git_revision(), join_argv(argc, argv),
                    utc_timestamp()};
}

}  // namespace moe::io
