// Conversions stream (issue 43, "bounded-memory conversion"): moe-convert dtype, quantize, freeze,
// import-hf, export-gguf, import-gguf, partition, merge and export-hf run under an address-space
// limit (RLIMIT_AS, set by `ulimit -v`) of what the same conversion of a tiny model needs plus
// 128 MB, less than a third of the model they convert, and give the bytes the in-memory
// conversions give (partition, merge and export-hf of lazily opened files: byte for byte). The
// model is made just big enough to tell: Mixtral-shaped, 8 layers of 16 experts, d_model 256, F
// 1024, f32 (about 410 MB; its largest tensor 16.8 MB, one expert 1 MB), written expert by expert
// so that the test itself never holds it either.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/cpu/gemv.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "moe/io/hf_checkpoint.h"
#include "moe/models/transformer.h"
#include "support/run.h"
#include "support/streamed_model.h"

using namespace moe;
using test::kAddressSanitizer;
using test::run_command;
using test::tool;
using test::under_limit;
namespace fs = std::filesystem;

namespace {

// What a conversion may map beyond what the same conversion of a tiny model maps (libraries,
// the CUDA libraries where built, thread stacks and malloc arenas of its OpenMP and BLAS
// threads): less than a third of the big model, so a conversion that held it could not fit.
constexpr int64_t kHeadroomBytes = int64_t(128) << 20;

ModelConfig model_config(int64_t layers, int64_t d_model, int64_t d_ff, int64_t experts) {
  return test::streamed_config(layers, d_model, d_ff, experts);
}

ModelConfig big_config() { return model_config(8, 256, 1024, 16); }

// Values of tensor `name` (expert e, or -1 for a whole non-expert tensor): normal(0, 0.05).
const test::StreamedValues values{7, false};

// Writes the model (test::write_streamed_model): expert tensors one expert at a time; with
// `optim`, an Adam moment "adam.m.<name>" of every parameter too.
int64_t write_model(const std::string& path, const ModelConfig& config, bool optim = false) {
  return test::write_streamed_model(path, config, values, optim);
}

// The smallest address-space limit under which moe-convert converts a tiny model to bf16.
int64_t tiny_conversion_bytes(const test::ScratchDir& dir) {
  const std::string tiny = dir / "tiny.h5";
  write_model(tiny, model_config(2, 32, 64, 4));
  return test::smallest_address_space(
      tool("moe-convert", "dtype " + tiny + " --to bf16 --force -o " + (dir / "tiny-bf16.h5")));
}

void require_ok(const test::RunResult& r) {
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
}

// Whether two checkpoint files hold the same: every byte but the modification times HDF5 keeps in
// its object headers (to the second). Same size; the same tensors in the same order with the same
// bytes, flags and slices, stored at the same offsets in the same chunks; the same configs, state,
// sharding, provenance and tokenizer.
void require_same_checkpoint(const std::string& a, const std::string& b) {
  INFO(a << " vs " << b);
  REQUIRE(fs::file_size(a) == fs::file_size(b));
  const io::Checkpoint x = io::load_checkpoint(a), y = io::load_checkpoint(b);
  REQUIRE(x.model_config == y.model_config);
  REQUIRE(x.train_config == y.train_config);
  REQUIRE(io::to_json(x.provenance) == io::to_json(y.provenance));
  REQUIRE((x.state.step == y.state.step && x.state.seed == y.state.seed));
  REQUIRE((x.sharding.rank == y.sharding.rank && x.sharding.expert_rank == y.sharding.expert_rank &&
           x.sharding.shard_embedding == y.sharding.shard_embedding));
  REQUIRE((x.tokenizer.file == y.tokenizer.file && x.tokenizer.bytes == y.tokenizer.bytes));
  for (const auto& [p, q] : {std::pair{&x.params, &y.params}, std::pair{&x.optim, &y.optim}}) {
    REQUIRE(p->size() == q->size());
    for (size_t i = 0; i < p->size(); ++i) {
      const io::NamedTensor &s = (*p)[i], &t = (*q)[i];
      INFO(s.name);
      REQUIRE((s.name == t.name && s.expert == t.expert && s.shard.global == t.shard.global &&
               s.shard.dim == t.shard.dim && s.shard.start == t.shard.start &&
               s.shard.count == t.shard.count));
      REQUIRE((s.tensor.dtype() == t.tensor.dtype() && s.tensor.shape() == t.tensor.shape()));
      REQUIRE(std::memcmp(s.tensor.raw(), t.tensor.raw(), s.tensor.nbytes()) == 0);
    }
  }
  const io::CheckpointInfo i = io::inspect({a}), j = io::inspect({b});
  REQUIRE(i.tensors.size() == j.tensors.size());
  for (size_t k = 0; k < i.tensors.size(); ++k) {
    const io::TensorInfo &s = i.tensors[k], &t = j.tensors[k];
    INFO(s.name);
    REQUIRE((s.chunk == t.chunk && s.filtered == t.filtered && s.file_offset == t.file_offset &&
             s.file_extent == t.file_extent && s.stored_bytes == t.stored_bytes));
  }
}

// Whether every file of directory `a` is in `b` with the same bytes, and `b` has no other
// (checkpoint files: the same but for HDF5's modification times, require_same_checkpoint).
bool same_files(const std::string& a, const std::string& b) {
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(a)) {
    const fs::path other = fs::path(b) / entry.path().filename();
    if (!fs::exists(other)) return false;
    if (entry.path().extension() == ".h5")
      require_same_checkpoint(entry.path(), other);
    else if (test::read_file(entry.path()) != test::read_file(other))
      return false;
    ++files;
  }
  return files == static_cast<size_t>(std::distance(fs::directory_iterator(b), {}));
}

// Whether any tensor of `tensors` is held in memory rather than left in its file.
bool holds_any(const std::vector<io::NamedTensor>& tensors) {
  for (const io::NamedTensor& nt : tensors)
    if (nt.held()) return true;
  return false;
}

const char* const kExpertTensor = "blocks.5.moe.experts.w2";  // [16, 256, 1024]

}  // namespace

TEST_CASE("cli: conversions stream a model larger than their address-space limit",
          "[cli][convert][streaming]") {
  if (kAddressSanitizer) {
    WARN("AddressSanitizer build: no address-space limit can be set; the Release pass runs this");
    return;
  }
  test::ScratchDir dir("cli-streaming-convert");
  const std::string big = dir / "big.h5";
  const int64_t model_bytes = write_model(big, big_config());
  // The limit tells: the tool gets the headroom over what it needs for a tiny model, and the
  // model is more than three times that headroom (410 MB over 128 MB).
  const int64_t limit = tiny_conversion_bytes(dir) + kHeadroomBytes;
  REQUIRE(model_bytes > 3 * kHeadroomBytes);
  REQUIRE(static_cast<int64_t>(fs::file_size(big)) > 3 * kHeadroomBytes);
  auto limited = [&](const std::string& command) { return under_limit(limit, command); };
  const Tensor expert = values(kExpertTensor, 11, {256, 1024});

  {  // dtype --to bf16: every converted expert is the f32 value rounded
    require_ok(run_command(
        limited(tool("moe-convert", "dtype " + big + " --to bf16 -o " + (dir / "bf16.h5")))));
    const Tensor got = io::read_expert(dir / "bf16.h5", kExpertTensor, 11);
    REQUIRE(got.dtype() == DType::bf16);
    REQUIRE(got.to_vector() == expert.to(DType::bf16).to_vector());
    REQUIRE(io::read_param(dir / "bf16.h5", "embed.tokens").to_vector() ==
            values("embed.tokens", -1, {256, 256}).to(DType::bf16).to_vector());
  }
  {  // quantize q8_0: the rows moe-convert's quantiser gives
    require_ok(
        run_command(limited(tool("moe-convert", "quantize " + big + " -o " + (dir / "q.h5")))));
    const Tensor got = io::read_expert(dir / "q.h5", kExpertTensor, 11);
    const int64_t row_bytes = cpu::q8_row_bytes(1024);
    REQUIRE(got.numel() == 256 * row_bytes);
    std::vector<uint8_t> want(static_cast<size_t>(row_bytes));
    for (int64_t row : {0, 97, 255}) {
      cpu::quantize_q8_0_row(expert.data<float>() + row * 1024, 1024, want.data());
      REQUIRE(std::memcmp(got.data<uint8_t>() + row * row_bytes, want.data(), want.size()) == 0);
    }
  }
  {  // freeze and inspect --verify: bytes unchanged, every chunk checked
    require_ok(
        run_command(limited(tool("moe-convert", "freeze " + big + " -o " + (dir / "f.h5")))));
    REQUIRE(io::read_expert(dir / "f.h5", kExpertTensor, 11).to_vector() == expert.to_vector());
    // --verify builds the model's parameter set to compare shapes: address space of the model's
    // size that is never touched (RSS stays low), so it runs without the limit here.
    const auto r = run_command(tool("moe-convert", "inspect --verify " + (dir / "f.h5")));
    require_ok(r);
    REQUIRE(r.out.find("# verified\tevery tensor read and checksummed") != std::string::npos);
  }
  {  // export-gguf f32 and import-gguf of it, then import-hf of the model exported by the library
    require_ok(run_command(limited(
        tool("moe-convert", "export-gguf " + big + " --type f32 -o " + (dir / "big.gguf")))));
    REQUIRE(fs::file_size(dir / "big.gguf") > static_cast<uint64_t>(model_bytes));
    require_ok(run_command(limited(
        tool("moe-convert", "import-gguf " + (dir / "big.gguf") + " -o " + (dir / "g.h5")))));
    REQUIRE(io::read_expert(dir / "g.h5", kExpertTensor, 11).to_vector() == expert.to_vector());
    fs::remove(dir / "g.h5");
    // The HF directories are written here by the in-memory path, in this process, without a
    // limit (one file, and shards of 100 MB); export-hf under the limit writes the same bytes.
    {
      io::Checkpoint whole = io::load_checkpoint(big, false);
      io::export_hf(whole, dir / "hf", {});
      io::export_hf(whole, dir / "hf-sharded", {100'000'000});
    }
    require_ok(
        run_command(limited(tool("moe-convert", "export-hf " + big + " -o " + (dir / "hf-tool")))));
    REQUIRE(same_files(dir / "hf", dir / "hf-tool"));
    fs::remove_all(dir / "hf-tool");
    require_ok(run_command(limited(tool(
        "moe-convert", "export-hf " + big + " --max-shard-size 100 -o " + (dir / "hf-tool")))));
    REQUIRE(same_files(dir / "hf-sharded", dir / "hf-tool"));
    fs::remove_all(dir / "hf-tool");
    fs::remove_all(dir / "hf-sharded");
    require_ok(run_command(
        limited(tool("moe-convert", "import-hf " + (dir / "hf") + " -o " + (dir / "back.h5")))));
    REQUIRE(io::read_expert(dir / "back.h5", kExpertTensor, 11).to_vector() == expert.to_vector());
    REQUIRE(io::read_param(dir / "back.h5", "lm_head.weight").to_vector() ==
            values("lm_head.weight", -1, {256, 256}).to_vector());
    fs::remove_all(dir / "hf");
    fs::remove(dir / "back.h5");
  }
  {  // partition over 2 ranks (expert 11 is rank 1's 4th), then merge: the model back
    require_ok(run_command(
        limited(tool("moe-convert", "partition " + big + " --ranks 2 -o " + (dir / "parts")))));
    REQUIRE(io::read_expert(dir / "parts/rank-00001.h5", kExpertTensor, 3).to_vector() ==
            expert.to_vector());
    require_ok(run_command(
        limited(tool("moe-convert", "merge " + (dir / "parts") + " -o " + (dir / "merged.h5")))));
    REQUIRE(io::read_expert(dir / "merged.h5", kExpertTensor, 11).to_vector() ==
            expert.to_vector());
    REQUIRE(io::read_param(dir / "merged.h5", "embed.tokens").to_vector() ==
            values("embed.tokens", -1, {256, 256}).to_vector());
  }
}

TEST_CASE("cli: a streamed conversion that meets a NaN fails naming it and writes nothing",
          "[cli][convert][streaming]") {
  test::ScratchDir dir("cli-streaming-nan");
  const ModelConfig config = model_config(2, 32, 64, 4);
  ParamSet params(1, DType::f32);
  Transformer model(config, params);
  io::Checkpoint ckpt;
  ckpt.model_config = to_json(config);
  ckpt.train_config = nullptr;
  for (const Param* p : std::as_const(params).all())
    ckpt.params.push_back({p->name, p->value.clone(), p->expert, {}});
  for (io::NamedTensor& nt : ckpt.params)
    if (nt.name == "blocks.1.moe.experts.w3") nt.tensor.data<float>()[2 * 64 * 32 + 5] = NAN;
  io::save_checkpoint(dir / "nan.h5", ckpt);
  for (const std::string& args :
       {"dtype " + (dir / "nan.h5") + " --to bf16 -o " + (dir / "o.h5"),
        "quantize " + (dir / "nan.h5") + " -o " + (dir / "o.h5"),
        "freeze " + (dir / "nan.h5") + " -o " + (dir / "o.h5"),
        "partition " + (dir / "nan.h5") + " --ranks 2 -o " + (dir / "o.h5"),
        "export-hf " + (dir / "nan.h5") + " -o " + (dir / "o.h5")}) {
    INFO(args);
    const auto r = run_command(tool("moe-convert", args));
    REQUIRE(r.exit_code == 1);
    REQUIRE(r.err.find("tensor 'blocks.1.moe.experts.w3' holds a non-finite value (NaN") !=
            std::string::npos);
    REQUIRE(r.err.find("expert 2") != std::string::npos);
    REQUIRE_FALSE(fs::exists(dir / "o.h5"));
    REQUIRE(fs::directory_iterator(dir.path()) != fs::directory_iterator());
    for (const auto& entry : fs::directory_iterator(dir.path()))
      REQUIRE(entry.path().filename() == "nan.h5");  // no temporary file left behind
  }
}

TEST_CASE("cli: partition, merge and export-hf of lazily opened files write the held path's bytes",
          "[cli][convert][streaming]") {
  // moe-convert partition, merge and export-hf open their inputs lazily: every tensor they cut,
  // join or rename stays in its file until its output file is written. What they write must be
  // what the in-memory path writes from the loaded checkpoint, byte for byte (checkpoints: but for
  // HDF5's modification times, which tell the second each was written).
  test::ScratchDir dir("cli-streaming-reshard");
  const std::string whole = dir / "whole.h5";
  write_model(whole, model_config(2, 32, 64, 4), true);
  for (int variant = 0; variant < 3; ++variant) {  // contiguous, sharded table, placed experts
    INFO("variant " << variant);
    io::PartitionOptions options;
    options.shard_embedding = variant == 1;
    if (variant == 2) options.placement = {{1, 0, 0, 1}, {0, 1, 0, 1}};
    const std::string held = dir / str("held-", variant), lazy = dir / str("lazy-", variant);
    io::save_sharded(held, io::partition(io::load_checkpoint(whole), options), false);
    const std::vector<io::Checkpoint> files =
        io::partition(io::open_checkpoint_lazy(whole), options);
    for (const io::Checkpoint& c : files) {
      REQUIRE_FALSE(holds_any(c.params));
      REQUIRE_FALSE(holds_any(c.optim));
    }
    io::save_sharded(lazy, files, false);
    REQUIRE(same_files(held, lazy));

    const io::Checkpoint merged = io::merge_shards(io::checkpoint_files({held}));
    const io::Checkpoint opened = io::open_merged(io::checkpoint_files({lazy}));
    REQUIRE_FALSE(holds_any(opened.params));
    REQUIRE_FALSE(holds_any(opened.optim));
    io::save_converted(dir / str("merged-held-", variant, ".h5"), merged, nullptr);
    io::save_converted(dir / str("merged-lazy-", variant, ".h5"), opened, nullptr);
    require_same_checkpoint(dir / str("merged-held-", variant, ".h5"),
                            dir / str("merged-lazy-", variant, ".h5"));
    REQUIRE(io::read_expert(dir / str("merged-lazy-", variant, ".h5"), "blocks.1.moe.experts.w2", 2)
                .to_vector() == values("blocks.1.moe.experts.w2", 2, {32, 64}).to_vector());
  }
  for (int64_t shard_bytes : {int64_t(0), int64_t(20000)}) {  // one file, and shards + index
    INFO("max_shard_bytes " << shard_bytes);
    io::HfExportOptions options;
    options.max_shard_bytes = shard_bytes;
    io::export_hf(io::load_checkpoint(whole, false), dir / str("hf-held-", shard_bytes), options);
    io::export_hf(io::open_checkpoint_lazy(whole, false), dir / str("hf-lazy-", shard_bytes),
                  options);
    REQUIRE(same_files(dir / str("hf-held-", shard_bytes), dir / str("hf-lazy-", shard_bytes)));
  }
  REQUIRE(fs::exists(dir / "hf-lazy-20000/model.safetensors.index.json"));
}
