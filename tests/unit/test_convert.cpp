// Checkpoint conversions (moe/io/convert.h): LPT placement on hand-worked loads, partition -> merge
// identity (contiguous, placed, sharded embedding), merge refusing missing / overlapping /
// mismatched shards, dtype round trips within the dtype's rounding with fp32 optimizer state kept
// (and a bf16 trainer resuming from it), freeze keeping the model's outputs bitwise, inspect's
// parameter counts against the Transformer's, finding checkpoint files, trace/model mismatches.
// Shape letters: E experts of a layer, N ranks.
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "moe/infer/model.h"
#include "moe/io/convert.h"
#include "moe/io/dataset.h"
#include "moe/profile/record.h"
#include "moe/train/trainer.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

ModelConfig convert_model(Arch arch, DType dtype = DType::f32) {
  ModelConfig c = test::small_model_config(arch);
  c.dtype = dtype;
  c.resolve();
  return c;
}

train::TrainConfig convert_train(int64_t steps) {
  train::TrainConfig t;
  t.data = test::fortunes_path("linux");
  t.batch = 4;
  t.steps = steps;
  t.warmup = 1;
  t.eval_batches = 2;
  t.seed = 5;
  return t;
}

// A checkpoint after a few real optimizer steps: parameters and non-zero Adam moments.
io::Checkpoint trained_checkpoint(Arch arch, DType dtype = DType::f32) {
  train::Trainer t(convert_model(arch, dtype), convert_train(2),
                   io::Provenance{"test", "0", "", "", ""});
  t.step();
  t.step();
  return t.snapshot();
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void require_same_tensors(const std::vector<io::NamedTensor>& a,
                          const std::vector<io::NamedTensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i].name);
    REQUIRE(a[i].name == b[i].name);
    REQUIRE(a[i].expert == b[i].expert);
    REQUIRE_FALSE(b[i].shard.defined());
    REQUIRE(same_bytes(a[i].tensor, b[i].tensor));
  }
}

const io::NamedTensor& find(const std::vector<io::NamedTensor>& list, const std::string& name) {
  for (const io::NamedTensor& nt : list)
    if (nt.name == name) return nt;
  FAIL("no tensor " << name);
  throw 0;
}

std::vector<std::string> names_of(size_t n) {
  std::vector<std::string> names;
  for (size_t r = 0; r < n; ++r) names.push_back("rank-" + std::to_string(r) + ".h5");
  return names;
}

// Row e (an expert) of a tensor as bytes.
std::string row_bytes(const Tensor& t, int64_t e) {
  const size_t row = t.nbytes() / static_cast<size_t>(t.dim(0));
  return std::string(static_cast<const char*>(t.raw()) + static_cast<size_t>(e) * row, row);
}

}  // namespace

TEST_CASE("convert: LPT placement on hand-worked loads, capacities, contiguous and round robin",
          "[convert]") {
  // Loads 8..1 over 2 ranks of 4: 8->r0, 7->r1, 6->r1 (7<8), 5->r0 (8<13), 4->r0 (tie 13: lower
  // rank), 3->r1 (13<17), 2->r1 (16<17; now full), 1->r0. Both ranks end at 18.
  std::vector<int64_t> loads{8, 7, 6, 5, 4, 3, 2, 1};
  std::vector<int> map = balance::lpt_placement(loads, 2);
  REQUIRE(map == std::vector<int>{0, 1, 1, 0, 0, 1, 1, 0});
  REQUIRE(balance::rank_loads(loads, map, 2) == std::vector<int64_t>{18, 18});
  REQUIRE(balance::max_over_mean(balance::rank_loads(loads, map, 2)) == 1.0);
  // Contiguous: {8,7,6,5} = 26 vs 10; round robin: {8,6,4,2} = 20 vs 16.
  REQUIRE(balance::contiguous_placement(8, 2) == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1});
  REQUIRE(balance::round_robin_placement(8, 2) == std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1});
  REQUIRE(balance::rank_loads(loads, balance::contiguous_placement(8, 2), 2) ==
          std::vector<int64_t>{26, 10});
  REQUIRE(balance::max_over_mean({26, 10}) == Approx(26.0 / 18.0));
  // Capacity: a hot expert does not pull the others onto its rank; rank 1 fills up first.
  REQUIRE(balance::lpt_placement({100, 1, 1, 1}, 2) == std::vector<int>{0, 1, 1, 0});
  REQUIRE(balance::is_contiguous_placement({0, 0, 1, 1}, 2));
  REQUIRE_FALSE(balance::is_contiguous_placement({0, 1, 1, 0}, 2));
  REQUIRE_THROWS_AS(balance::lpt_placement({1, 2, 3}, 2), UsageError);
  REQUIRE(balance::max_over_mean({0, 0}) == 0.0);
}

TEST_CASE("convert: partition then merge is the identity, contiguous, placed and sharded embedding",
          "[convert]") {
  const io::Checkpoint whole = trained_checkpoint(Arch::mixtral);
  REQUIRE_FALSE(whole.optim.empty());
  const std::string w1 = "blocks.1.moe.experts.w1";
  for (int variant = 0; variant < 4; ++variant) {
    io::PartitionOptions options;
    options.ranks = variant == 2 ? 4 : 2;
    options.shard_embedding = variant == 1;
    if (variant == 3) options.placement = {{1, 0, 0, 1}, {0, 1, 0, 1}};
    INFO("variant " << variant);
    std::vector<io::Checkpoint> files = io::partition(whole, options);
    REQUIRE(files.size() == static_cast<size_t>(options.ranks));
    for (size_t r = 0; r < files.size(); ++r) {
      REQUIRE(files[r].sharding.rank == static_cast<int>(r));
      REQUIRE(files[r].sharding.ep_size == options.ranks);
      REQUIRE(files[r].train_config["ep"] == options.ranks);
    }
    // Rank 1's slice of an expert tensor and of its Adam moment hold exactly its experts.
    const std::vector<int> map = variant == 3   ? std::vector<int>{0, 1, 0, 1}
                                 : variant == 2 ? balance::contiguous_placement(4, 4)
                                                : balance::contiguous_placement(4, 2);
    for (const std::string& name : {w1, "adam.m." + w1}) {
      const bool optim = name != w1;
      const io::NamedTensor& slice = find(optim ? files[1].optim : files[1].params, name);
      const io::NamedTensor& source = find(optim ? whole.optim : whole.params, name);
      REQUIRE(slice.shard.defined());
      REQUIRE(slice.shard.global == source.tensor.shape());
      REQUIRE(slice.shard.start == 4 / options.ranks);
      int64_t row = 0;
      for (int64_t e = 0; e < 4; ++e)
        if (map[static_cast<size_t>(e)] == 1)
          REQUIRE(row_bytes(slice.tensor, row++) == row_bytes(source.tensor, e));
      REQUIRE(row == 4 / options.ranks);
    }
    // Replicated tensors live in rank 0's file only; the sharded table is in every file.
    REQUIRE_NOTHROW(find(files[0].params, "blocks.0.attn.q.weight"));
    for (const io::NamedTensor& nt : files[1].params)
      REQUIRE((nt.expert || (options.shard_embedding && nt.name == "embed.tokens")));
    if (options.shard_embedding) {
      const io::NamedTensor& table = find(files[1].params, "embed.tokens");
      REQUIRE(table.shard.dim == 1);
      REQUIRE(table.tensor.dim(1) == find(whole.params, "embed.tokens").tensor.dim(1) / 2);
    }
    if (variant == 3)
      REQUIRE(files[0].sharding.expert_rank == std::vector<int>{1, 0, 0, 1, 0, 1, 0, 1});

    // Through files: written atomically as a directory, found, merged back bitwise.
    test::ScratchDir dir("convert-identity");
    const std::string out = dir / "shards";
    io::save_sharded(out, files, false);
    REQUIRE_FALSE(fs::exists(out + ".tmp-" + std::to_string(::getpid())));
    const std::vector<std::string> found = io::checkpoint_files({out});
    REQUIRE(found.size() == files.size());
    io::Checkpoint merged = io::merge_shards(found);
    require_same_tensors(whole.params, merged.params);
    require_same_tensors(whole.optim, merged.optim);
    REQUIRE(merged.model_config == whole.model_config);
    REQUIRE(merged.train_config == whole.train_config);  // ep back to 1
    REQUIRE(merged.state.step == whole.state.step);
    REQUIRE(merged.state.data_cursor == whole.state.data_cursor);
    REQUIRE(merged.sharding.rank == -1);
    REQUIRE(merged.sharding.expert_rank.empty());
    // An existing output directory is refused unless replaced.
    REQUIRE_THROWS_WITH(io::save_sharded(out, files, false), Catch::Contains("already exists"));
    REQUIRE_NOTHROW(io::save_sharded(out, files, true));
  }
  // Refusals: too few ranks, ranks not dividing E, a gpt table (tied head), a bad placement.
  io::PartitionOptions bad;
  bad.ranks = 1;
  REQUIRE_THROWS_AS(io::partition(whole, bad), UsageError);
  bad.ranks = 3;
  REQUIRE_THROWS_WITH(io::partition(whole, bad), Catch::Contains("do not divide"));
  bad.ranks = 2;
  bad.placement = {{0, 0, 0, 1}, {0, 0, 1, 1}};
  REQUIRE_THROWS_WITH(io::partition(whole, bad), Catch::Contains("rank 0 holds 3 experts"));
  io::PartitionOptions table;
  table.shard_embedding = true;
  REQUIRE_THROWS_WITH(io::partition(trained_checkpoint(Arch::gpt), table),
                      Catch::Contains("untied"));
}

TEST_CASE("convert: merge refuses missing, duplicated, overlapping and mismatched shards",
          "[convert]") {
  const io::Checkpoint whole = trained_checkpoint(Arch::mixtral);
  io::PartitionOptions options;
  options.ranks = 4;
  const std::vector<io::Checkpoint> files = io::partition(whole, options);
  auto merge_error = [&](const std::function<void(std::vector<io::Checkpoint>&)>& damage) {
    std::vector<io::Checkpoint> copy = files;
    damage(copy);
    return test::error_of([&] { io::merge_shards(copy, names_of(copy.size())); });
  };
  REQUIRE(merge_error([](auto&) {}) == "(no error)");
  REQUIRE_THAT(merge_error([](auto& c) { c.erase(c.begin() + 2); }),
               Catch::Contains("missing shard: rank 2's file (rank-00002.h5)"));
  REQUIRE_THAT(merge_error([](auto& c) { c.erase(c.begin()); }),
               Catch::Contains("missing shard: no file of rank 0"));
  REQUIRE_THAT(merge_error([](auto& c) { c[3].sharding.rank = 2; }),
               Catch::Contains("are both rank 2's shard"));
  // One slice moved onto its neighbour's rows, one slice gone, a replicated tensor twice.
  REQUIRE_THAT(merge_error([](auto& c) { c[2].params[0].shard.start = 0; }),
               Catch::Contains("slices overlap") && Catch::Contains("rank-0.h5"));
  REQUIRE_THAT(
      merge_error([](auto& c) { c[3].params.erase(c[3].params.begin()); }),
      Catch::Contains("positions 3..3 of dimension 0") && Catch::Contains("in no shard file"));
  REQUIRE_THAT(merge_error([](auto& c) { c[1].params.push_back(c[0].params[0]); }),
               Catch::Contains("is whole in both"));
  REQUIRE_THAT(
      merge_error([](auto& c) { c[1].params[0].tensor = c[1].params[0].tensor.to(DType::bf16); }),
      Catch::Contains("mismatched shards"));
  // Files of another run or step.
  REQUIRE_THAT(merge_error([](auto& c) { c[1].model_config["d_ff"] = 128; }),
               Catch::Contains("'rank-1.h5' does not belong with 'rank-0.h5': model_config "
                               "differs (key 'd_ff': 128 vs 64)"));
  REQUIRE_THAT(merge_error([](auto& c) { c[3].state.step += 1; }), Catch::Contains("step differs"));
  REQUIRE_THAT(merge_error([](auto& c) { c[1].sharding.world_size = 8; }),
               Catch::Contains("world_size differs"));
  REQUIRE_THAT(merge_error([&](auto& c) { c[1] = whole; }),
               Catch::Contains("is a whole checkpoint"));

  // On disk: a damaged rank file is named; a rank file alone is a missing shard.
  test::ScratchDir dir("convert-merge-errors");
  io::save_sharded(dir / "s", files, false);
  const std::string victim = dir / "s/rank-00001.h5";
  std::string bytes = test::read_file(victim);
  test::write_file(victim, bytes.substr(0, bytes.size() / 2));
  REQUIRE_THAT(test::error_of([&] { io::merge_shards(io::checkpoint_files({dir / "s"})); }),
               Catch::Contains("rank-00001.h5") && Catch::Contains("truncated"));
  REQUIRE_THAT(test::error_of([&] { io::merge_shards({dir / "s/rank-00000.h5"}); }),
               Catch::Contains("missing shard: rank 1"));
}

TEST_CASE("convert: dtype round trips within the dtype's rounding, optimizer state stays fp32",
          "[convert]") {
  const io::Checkpoint f32 = trained_checkpoint(Arch::mixtral);
  io::DTypeReport report;
  const io::Checkpoint bf16 = io::change_dtype(f32, DType::bf16, &report);
  REQUIRE(bf16.model_config["dtype"] == "bf16");
  REQUIRE(report.tensors_converted == static_cast<int64_t>(f32.params.size()));
  REQUIRE(report.masters_added == static_cast<int64_t>(f32.params.size()));
  REQUIRE(report.max_relative_error > 0);
  REQUIRE(report.max_relative_error <= std::ldexp(1.0, -8));
  for (size_t i = 0; i < f32.params.size(); ++i) {
    INFO(f32.params[i].name);
    const Tensor& x = f32.params[i].tensor;
    const Tensor& y = bf16.params[i].tensor;
    REQUIRE(y.dtype() == DType::bf16);
    REQUIRE(y.shape() == x.shape());
    std::vector<float> a = x.to_vector(), b = y.to_vector();
    for (size_t j = 0; j < a.size(); ++j)  // round to nearest: half a unit in the last place
      REQUIRE(std::fabs(b[j] - a[j]) <= std::ldexp(std::fabs(a[j]), -8));
    // The exact f32 values are kept as the master copy.
    REQUIRE(same_bytes(find(bf16.optim, "master." + f32.params[i].name).tensor, x));
  }
  for (const io::NamedTensor& m : f32.optim)  // moments untouched
    REQUIRE(same_bytes(find(bf16.optim, m.name).tensor, m.tensor));

  // A bf16 trainer resumes from it (it needs the masters), and trains on.
  {
    train::Trainer t(convert_model(Arch::mixtral, DType::bf16), convert_train(4), {});
    REQUIRE_NOTHROW(t.restore(bf16));
    REQUIRE(std::isfinite(t.step().forward.loss));
  }

  // Back to f32: the masters become the parameters again, bitwise; no master is left.
  io::DTypeReport back_report;
  const io::Checkpoint back = io::change_dtype(bf16, DType::f32, &back_report);
  REQUIRE(back_report.masters_dropped == static_cast<int64_t>(f32.params.size()));
  require_same_tensors(f32.params, back.params);
  require_same_tensors(f32.optim, back.optim);
  // bf16 -> f16 rounds from the exact master, not from the bf16 values.
  const io::Checkpoint f16 = io::change_dtype(bf16, DType::f16, &report);
  REQUIRE(report.masters_used == static_cast<int64_t>(f32.params.size()));
  for (size_t i = 0; i < f32.params.size(); ++i)
    REQUIRE(same_bytes(f16.params[i].tensor, f32.params[i].tensor.to(DType::f16)));

  // Without optimizer state (frozen): f16 within 2^-11 relative (normal range), no masters.
  io::Checkpoint frozen = io::freeze(f32);
  const io::Checkpoint half = io::change_dtype(frozen, DType::f16, &report);
  REQUIRE(half.optim.empty());
  REQUIRE(report.max_relative_error <= std::ldexp(1.0, -11));
  // A value beyond f16's range is an error naming the tensor, never a silent infinity.
  frozen.params[1].tensor = frozen.params[1].tensor.clone();
  frozen.params[1].tensor.data<float>()[0] = 1e6f;
  REQUIRE_THROWS_WITH(io::change_dtype(frozen, DType::f16),
                      Catch::Contains(frozen.params[1].name) && Catch::Contains("range of f16"));
}

TEST_CASE("convert: freeze drops training state and keeps the model's outputs bitwise",
          "[convert]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    INFO(arch_name(arch));
    test::ScratchDir dir("convert-freeze");
    const io::Checkpoint whole = trained_checkpoint(arch);
    io::save_checkpoint(dir / "train.h5", whole);
    io::Checkpoint frozen = io::freeze(whole);
    frozen.provenance = io::Provenance{"moe-convert", "1", "g", "moe-convert freeze", ""};
    const nlohmann::json history =
        io::extend_history(io::read_history(dir / "train.h5"), whole.provenance);
    io::save_streaming(dir / "frozen.h5", frozen, history);

    io::Checkpoint loaded = io::load_checkpoint(dir / "frozen.h5");
    REQUIRE(loaded.optim.empty());
    REQUIRE(loaded.train_config.is_null());
    REQUIRE(loaded.state.data_cursor == 0);
    REQUIRE(loaded.state.step == whole.state.step);
    REQUIRE(loaded.provenance.tool == "moe-convert");
    nlohmann::json h = io::read_history(dir / "frozen.h5");
    REQUIRE(h.size() == 1);
    REQUIRE(h[0]["tool"] == "test");
    // Every parameter kept, bytes unchanged; each block's expert tensors next to each other.
    REQUIRE(loaded.params.size() == whole.params.size());
    for (const io::NamedTensor& nt : whole.params)
      REQUIRE(same_bytes(find(loaded.params, nt.name).tensor, nt.tensor));
    std::map<std::string, size_t> last_expert;  // block prefix -> index of its last expert tensor
    for (size_t i = 0; i < loaded.params.size(); ++i) {
      const std::string& name = loaded.params[i].name;
      if (!loaded.params[i].expert) continue;
      const std::string block = name.substr(0, name.find(".moe."));
      if (last_expert.count(block)) REQUIRE(last_expert[block] == i - 1);
      last_expert[block] = i;
    }
    REQUIRE(last_expert.size() == 2);

    // The streaming layout: each layer's experts one extent, each expert one run of bytes; the
    // trainer's file keeps experts split by tensor. (Whether its layer is one extent depends on
    // where HDF5 puts metadata: with the 1.10 formats it often is, so that is not asserted.)
    io::CheckpointInfo layout = io::inspect({dir / "frozen.h5"});
    REQUIRE(layout.layers.size() == 2);
    for (const io::MoELayerInfo& l : layout.layers) {
      REQUIRE(l.contiguous());
      REQUIRE(l.experts_contiguous);
    }
    for (const io::MoELayerInfo& l : io::inspect({dir / "train.h5"}).layers)
      REQUIRE_FALSE(l.experts_contiguous);
    REQUIRE(io::inspect({dir / "frozen.h5"}, true).verified);  // every checksum holds

    // The inference model of both files computes the same loss, bitwise.
    infer::LoadedModel a = infer::load_model(dir / "train.h5");
    infer::LoadedModel b = infer::load_model(dir / "frozen.h5");
    std::vector<int32_t> tokens = io::load_tokens(test::fortunes_path("computers"));
    io::BatchSampler windows(&tokens, a.config.seq, 0, false);
    Tensor ids, targets;
    windows.next(4, ids, targets);
    const double la = a.model->evaluate(ids, targets).loss,
                 lb = b.model->evaluate(ids, targets).loss;
    REQUIRE(std::isfinite(la));
    REQUIRE(la == lb);
    // A frozen checkpoint cannot resume training (no optimizer state): a clear error.
    train::Trainer t(convert_model(arch), convert_train(4), {});
    REQUIRE_THROWS_WITH(t.restore(loaded), Catch::Contains("optimizer state: missing tensor"));
  }
}

TEST_CASE("convert: inspect counts parameters like the Transformer, for files and shards",
          "[convert]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    INFO(arch_name(arch));
    test::ScratchDir dir("convert-inspect");
    train::Trainer t(convert_model(arch), convert_train(2), {});
    t.step();
    io::save_checkpoint(dir / "ckpt.h5", t.snapshot());
    io::CheckpointInfo info = io::inspect({dir / "ckpt.h5"});
    REQUIRE(info.params_total == t.model().num_params());
    REQUIRE(info.params_active_per_token == t.model().active_params_per_token());
    REQUIRE(info.params_active_per_token < info.params_total);
    REQUIRE(info.files.size() == 1);
    REQUIRE(info.files[0].state.step == 1);
    int64_t params = 0, bytes = 0;
    for (const io::TensorInfo& ti : info.tensors) {
      if (ti.group == "params") {
        ++params;
        bytes += ti.bytes;
      }
      REQUIRE(ti.bytes == shape_numel(ti.shape) * 4);
      REQUIRE(ti.filtered);
      if (ti.expert) REQUIRE(ti.chunk.at(0) == 1);  // one chunk per expert
      REQUIRE(ti.stored_bytes >= ti.bytes);
    }
    REQUIRE(params == static_cast<int64_t>(t.params().size()));
    REQUIRE(bytes == info.param_bytes);
    REQUIRE(info.layers.size() == 2);
    REQUIRE(info.layers[0].experts == 4);
    REQUIRE(info.layers[0].extent >= info.layers[0].stored_bytes);
    nlohmann::json j = io::to_json(info);
    REQUIRE(j["params_total"] == info.params_total);
    REQUIRE(j["tensors"].size() == info.tensors.size());

    // A sharded copy counts the same whole model, once per tensor name.
    io::PartitionOptions options;
    options.ranks = 2;
    io::save_sharded(dir / "shards", io::partition(t.snapshot(), options), false);
    io::CheckpointInfo sharded = io::inspect({dir / "shards"}, true);
    REQUIRE(sharded.verified);
    REQUIRE(sharded.files.size() == 2);
    REQUIRE(sharded.params_total == info.params_total);
    REQUIRE(sharded.params_active_per_token == info.params_active_per_token);
    REQUIRE(sharded.param_bytes == info.param_bytes);

    // --verify reads the data: a flipped byte inside a tensor is found, metadata alone is not.
    std::string bytes_of = test::read_file(dir / "ckpt.h5");
    const io::TensorInfo& victim = info.tensors[0];
    bytes_of[static_cast<size_t>(victim.file_offset) + 5] ^= 0x40;
    test::write_file(dir / "ckpt.h5", bytes_of);
    REQUIRE_NOTHROW(io::inspect({dir / "ckpt.h5"}));
    REQUIRE_THAT(test::error_of([&] { io::inspect({dir / "ckpt.h5"}, true); }),
                 Catch::Contains("ckpt.h5"));
  }
}

TEST_CASE("convert: checkpoint_files finds files, shard directories and run directories",
          "[convert]") {
  test::ScratchDir dir("convert-files");
  const io::Checkpoint whole = trained_checkpoint(Arch::gpt);
  io::PartitionOptions options;
  options.ranks = 2;
  io::save_sharded(dir / "run/step-00000002", io::partition(whole, options), false);
  fs::create_directory_symlink("step-00000002", dir / "run/last");
  test::write_file(dir / "run/step-00000002/rank-00001.h5.tmp-99", "leftover");
  const std::vector<std::string> files = io::checkpoint_files({dir / "run"});
  REQUIRE(files.size() == 2);
  REQUIRE(files[0].ends_with("rank-00000.h5"));
  REQUIRE(files[1].ends_with("rank-00001.h5"));
  fs::create_directories(dir / "one");
  io::save_checkpoint(dir / "one/step-00000002.h5", whole);
  fs::create_symlink("step-00000002.h5", dir / "one/last.h5");
  REQUIRE(io::checkpoint_files({dir / "one"}) == std::vector<std::string>{dir / "one/last.h5"});
  bool merged = true;
  REQUIRE(io::load_whole({dir / "one"}, true, &merged).params.size() == whole.params.size());
  REQUIRE_FALSE(merged);
  REQUIRE(io::load_whole({dir / "run"}, true, &merged).params.size() == whole.params.size());
  REQUIRE(merged);
  REQUIRE_THAT(test::error_of([&] { io::checkpoint_files({dir / "nothing.h5"}); }),
               Catch::Contains("no such file or directory"));
  fs::create_directories(dir / "empty");
  REQUIRE_THAT(test::error_of([&] { io::checkpoint_files({dir / "empty"}); }),
               Catch::Contains("holds no checkpoint"));
  REQUIRE_THROWS_AS(io::checkpoint_files({dir / "run", dir / "one"}), UsageError);
}

TEST_CASE("convert: placement from a trace, and traces of another model refused", "[convert]") {
  const ModelConfig model = convert_model(Arch::mixtral);
  test::ScratchDir dir("convert-trace");
  // Tokens routed so that layer 0's loads are {6, 2, 4, 0} and layer 1's {3, 3, 3, 3} (top-2).
  io::TraceInfo info = profile::trace_info(model, io::Provenance{}, "record");
  io::TraceBatch batch;
  const std::vector<std::array<int, 4>> routes{{0, 1, 0, 1}, {0, 2, 2, 3}, {0, 2, 0, 1},
                                               {0, 1, 2, 3}, {0, 2, 0, 2}, {0, 2, 1, 3}};
  for (const auto& r : routes) {
    batch.token_ids.push_back(7);
    for (int v : r) {
      batch.experts.push_back(v);
      batch.gates.push_back(0.5f);
    }
  }
  batch.loads = {6, 2, 4, 0, 3, 3, 3, 3};
  batch.dropped = {0, 0};
  {
    io::TraceWriter writer(dir / "trace.h5", info);
    writer.append(batch);
    writer.close();
  }
  io::TraceReader trace(dir / "trace.h5");
  std::vector<io::LayerPlacement> plan = io::plan_placement(model, trace, 2);
  REQUIRE(plan.size() == 2);
  REQUIRE(plan[0].loads == std::vector<int64_t>{6, 2, 4, 0});
  // 6->r0, 4->r1, 2->r1, 0->r0: 6 vs 6; contiguous 8 vs 4; round robin 10 vs 2.
  REQUIRE(plan[0].lpt == std::vector<int>{0, 1, 1, 0});
  REQUIRE(plan[0].lpt_max_over_mean == 1.0);
  REQUIRE(plan[0].contiguous_max_over_mean == Approx(8.0 / 6.0));
  REQUIRE(plan[0].round_robin_max_over_mean == Approx(10.0 / 6.0));
  REQUIRE(plan[1].lpt_max_over_mean == 1.0);

  ModelConfig other = test::small_model_config(Arch::mixtral);
  other.experts = 8;
  other.resolve();
  REQUIRE_THAT(test::error_of([&] { io::plan_placement(other, trace, 2); }),
               Catch::Contains("does not come from this model") &&
                   Catch::Contains("experts [4,4]") && Catch::Contains("experts [8,8]"));
  other = test::small_model_config(Arch::mixtral);
  other.top_k = 1;
  other.resolve();
  REQUIRE_THAT(test::error_of([&] { io::plan_placement(other, trace, 2); }),
               Catch::Contains("top-1"));
}
