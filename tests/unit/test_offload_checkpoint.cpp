// Checkpoints of offloaded runs (issue 16): expert tensors streamed one expert at a time into the
// usual HDF5 checkpoint (io::ExpertSource, h5::write_expert_rows) and read back one chunk at a
// time into the store. The streamed file has bitwise the datasets of a resident run's file, a
// resume from it is bitwise the uninterrupted run, a failure while streaming leaves the previous
// checkpoint in place, and saving or restoring never holds a whole expert tensor (peak RSS).
// Shape letters: E experts, F d_ff, D d_model.
#include <hdf5.h>
#include <malloc.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include "moe/io/checkpoint.h"
#include "moe/io/finite.h"
#include "moe/io/hdf5.h"
#include "moe/train/trainer.h"
#include "support/gradcheck.h"
#include "support/models.h"
#include "support/run.h"
#include "support/state.h"
#include "support/training.h"

using namespace moe;

namespace {

ModelConfig model(Arch arch, DType dtype = DType::f32) { return test::routed_model(arch, dtype); }

train::TrainConfig training(int64_t steps, const std::string& offload) {
  train::TrainConfig t = test::short_run(steps);
  t.offload.tier = offload::parse_tier(offload);
  return t;
}

void run(train::Trainer& t, int steps) {
  for (int i = 0; i < steps; ++i) t.step();
}

// Every tensor of two tensor lists, by position: name, expert flag, shard, shape, dtype, bytes.
void require_same(const std::vector<io::NamedTensor>& x, const std::vector<io::NamedTensor>& y) {
  const std::string where = test::first_difference(x, y);
  INFO("first difference: " << where);
  REQUIRE(where.empty());
}

void require_same(const train::Trainer& a, const train::Trainer& b) {
  const io::Checkpoint ca = a.snapshot(), cb = b.snapshot();
  require_same(ca.params, cb.params);
  require_same(ca.optim, cb.optim);
}

// A streamed copy of an expert tensor: read(e) hands out its rows, alternately shaped
// [1, ...rest] and [...rest] (both are accepted), counting the calls.
io::NamedTensor streamed(const std::string& name, const Tensor& whole, int* reads = nullptr,
                         int64_t throw_at = -1) {
  auto source = std::make_shared<io::ExpertSource>();
  source->shape = whole.shape();
  source->dtype = whole.dtype();
  source->read = [whole, reads, throw_at](int64_t e) {
    if (reads) ++*reads;
    if (e == throw_at) throw Error(str("injected failure at expert ", e));
    Tensor row = whole.rows(e, e + 1).clone();
    if (e % 2) row = row.reshape(Shape(whole.shape().begin() + 1, whole.shape().end()));
    return row;
  };
  io::NamedTensor nt;
  nt.name = name;
  nt.expert = true;
  nt.source = std::move(source);
  return nt;
}

io::Checkpoint small_checkpoint(bool stream, int* reads = nullptr, int64_t throw_at = -1) {
  io::Checkpoint c;
  c.model_config = {{"arch", "test"}};
  c.train_config = nlohmann::json::object();
  c.provenance.time = "2026-01-01T00:00:00Z";
  const Tensor w = test::random_tensor({5, 3, 4}, 11);
  const Tensor b = test::random_tensor({5, 3}, 12).to(DType::bf16);
  c.params.push_back({"dense", test::random_tensor({3, 4}, 13), false});
  if (stream) {
    c.params.push_back(streamed("w", w, reads, throw_at));
    c.optim.push_back(streamed("adam.m.b", b, reads, throw_at));
  } else {
    c.params.push_back({"w", w, true});
    c.optim.push_back({"adam.m.b", b, true});
  }
  return c;
}

// Chunk dimensions and filters of dataset `object` of a file, as HDF5 stored them.
std::string layout_of(const std::string& file, const std::string& object) {
  io::h5::Session session;
  io::h5::File f = io::h5::open_file_readonly(file);
  io::h5::Dataset d(H5Dopen2(f, object.c_str(), H5P_DEFAULT));
  REQUIRE(d.valid());
  io::h5::Plist dcpl(H5Dget_create_plist(d));
  hsize_t dims[8] = {};
  const int rank = H5Pget_chunk(dcpl, 8, dims);
  std::string text = str("rank ", rank, " filters ", H5Pget_nfilters(dcpl), " chunk");
  for (int i = 0; i < rank; ++i) text += str(" ", dims[i]);
  for (int i = 0; i < H5Pget_nfilters(dcpl); ++i) {
    unsigned flags = 0;
    size_t n = 0;
    char name[64] = {};
    text += str(" ", H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &n, nullptr,
                                    sizeof name, name, nullptr));
  }
  return text;
}

#if !defined(__SANITIZE_ADDRESS__)  // used by the peak-RSS test only (see there)
int64_t vm_hwm_kib() {  // the process's peak resident set since the last reset_peak_rss()
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  FAIL("no VmHWM in /proc/self/status");
  return 0;
}

// Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current resident set. Free heap
// pages go back to the system first (glibc keeps them resident otherwise, and an allocation that
// reuses them would not raise the peak: a gather could go unseen).
void reset_peak_rss() {
  malloc_trim(0);
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.close();
  REQUIRE(clear.good());
}
#endif

}  // namespace

TEST_CASE("checkpoint: a streamed expert tensor is the dataset of the whole tensor", "[offload]") {
  test::ScratchDir dir("stream-ckpt");
  int reads = 0;
  io::save_checkpoint(dir / "whole.h5", small_checkpoint(false));
  io::save_checkpoint(dir / "streamed.h5", small_checkpoint(true, &reads));
  REQUIRE(reads == 5 + 5);  // one read per expert of each streamed tensor
  const io::Checkpoint a = io::load_checkpoint(dir / "whole.h5");
  const io::Checkpoint b = io::load_checkpoint(dir / "streamed.h5");
  require_same(a.params, b.params);
  require_same(a.optim, b.optim);
  for (const char* object : {"/params/w", "/optim/adam.m.b", "/params/dense"})
    REQUIRE(layout_of(dir / "whole.h5", object) == layout_of(dir / "streamed.h5", object));
  REQUIRE(layout_of(dir / "streamed.h5", "/params/w") == "rank 3 filters 1 chunk 1 3 4 3");

  // Loading with streaming: the chosen expert datasets come back as sources, one chunk a read.
  const io::Checkpoint s =
      io::load_checkpoint(dir / "streamed.h5", true, [](bool optim, const std::string& name) {
        return optim ? name == "adam.m.b" : name == "w" || name == "dense";
      });
  REQUIRE(s.params[0].name == "dense");
  REQUIRE_FALSE(s.params[0].streamed());  // not an expert tensor: read whole
  REQUIRE(s.params[1].streamed());
  REQUIRE(s.optim[0].streamed());
  REQUIRE(s.params[1].shape() == Shape{5, 3, 4});
  REQUIRE(s.optim[0].dtype() == DType::bf16);
  for (int64_t e = 0; e < 5; ++e)
    REQUIRE(test::bitwise_equal(s.params[1].expert_slice(e),
                                a.params[1].tensor.rows(e, e + 1).reshape({3, 4})));
  require_same(a.params, s.params);
  require_same(a.optim, s.optim);
  // Slices above the chunk limit are cut below their leading 1, streamed or whole alike.
  io::SaveOptions small;
  small.max_chunk_bytes = 16;  // 4 f32: a [1,3,4] slice becomes chunks [1,1,4]
  io::save_checkpoint(dir / "whole-cut.h5", small_checkpoint(false), small);
  io::save_checkpoint(dir / "streamed-cut.h5", small_checkpoint(true), small);
  REQUIRE(layout_of(dir / "streamed-cut.h5", "/params/w") == "rank 3 filters 1 chunk 1 1 4 3");
  REQUIRE(layout_of(dir / "whole-cut.h5", "/params/w") ==
          layout_of(dir / "streamed-cut.h5", "/params/w"));
  require_same(io::load_checkpoint(dir / "whole-cut.h5").params,
               io::load_checkpoint(dir / "streamed-cut.h5").params);
  // A streamed checkpoint saves again as the same file contents.
  io::save_checkpoint(dir / "again.h5", s);
  require_same(a.params, io::load_checkpoint(dir / "again.h5").params);
}

TEST_CASE("checkpoint: a failure while streaming leaves the previous checkpoint", "[offload]") {
  test::ScratchDir dir("stream-fail");
  const std::string path = dir / "last.h5";
  io::save_checkpoint(path, small_checkpoint(false));
  int reads = 0;
  REQUIRE_THROWS_WITH(
      io::save_checkpoint(path, small_checkpoint(true, &reads, 3)),
      Catch::Contains("saving checkpoint") && Catch::Contains("injected failure at expert 3"));
  REQUIRE(reads == 4);  // experts 0..3 of the first streamed tensor, then nothing more
  const io::Checkpoint kept = io::load_checkpoint(path);
  require_same(kept.params, small_checkpoint(false).params);
  // Nothing but the previous file is left in the directory (the temporary file is removed).
  REQUIRE(std::distance(std::filesystem::directory_iterator(dir.path()),
                        std::filesystem::directory_iterator()) == 1);

  // A slice of the wrong shape or dtype fails the save naming the tensor and the expert.
  io::Checkpoint bad = small_checkpoint(false);
  auto source = std::make_shared<io::ExpertSource>();
  source->shape = {4, 2};
  source->dtype = DType::f32;
  source->read = [](int64_t e) { return Tensor::zeros({e == 2 ? 3 : 2}); };
  bad.params.push_back({"odd", Tensor(), true, {}, source});
  REQUIRE_THROWS_WITH(io::save_checkpoint(path, bad),
                      Catch::Contains("/params/odd") && Catch::Contains("expert 2's slice"));
  source->read = [](int64_t) { return Tensor::zeros({2}, DType::bf16); };
  REQUIRE_THROWS_WITH(io::save_checkpoint(path, bad), Catch::Contains("expected [2] f32"));
  require_same(io::load_checkpoint(path).params, kept.params);
}

TEST_CASE("checkpoint: non-finite values in a streamed tensor are named per expert", "[offload]") {
  Tensor w = test::random_tensor({4, 2, 3}, 5);
  w.data<float>()[2 * 6 + 4] = std::numeric_limits<float>::quiet_NaN();  // expert 2, element 4
  std::string whole_message, streamed_message;
  try {
    io::check_finite("here", {io::NamedTensor{"w", w, true}});
  } catch (const Error& e) {
    whole_message = e.what();
  }
  try {
    io::check_finite("here", {streamed("w", w)});
  } catch (const Error& e) {
    streamed_message = e.what();
  }
  REQUIRE(whole_message ==
          "here: tensor 'w' holds a non-finite value (NaN at element 16 of [4,2,3])");
  REQUIRE(streamed_message == whole_message.substr(0, whole_message.size() - 1) + ", expert 2)");
}

TEST_CASE("offload: the checkpoint of an offloaded run is the resident run's, bitwise",
          "[offload]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      DYNAMIC_SECTION(arch_name(arch) << " " << dtype_name(dtype)) {
        test::ScratchDir dir("offload-ckpt-same");
        train::Trainer resident(model(arch, dtype), training(6, "none"), {});
        train::Trainer offloaded(model(arch, dtype), training(6, "host"), {});
        run(resident, 3);
        run(offloaded, 3);
        const io::Checkpoint a = io::load_checkpoint(resident.save(dir / "resident"));
        const io::Checkpoint b = io::load_checkpoint(offloaded.save(dir / "offloaded"));
        REQUIRE(a.params.size() == b.params.size());
        REQUIRE(b.optim.size() == a.optim.size());
        // bf16 runs hold fp32 masters: the optimizer state has them under the same names.
        if (dtype == DType::bf16)
          REQUIRE(std::any_of(b.optim.begin(), b.optim.end(), [](const io::NamedTensor& t) {
            return t.name.rfind("master.", 0) == 0 && t.expert;
          }));
        require_same(a.params, b.params);
        require_same(a.optim, b.optim);
        REQUIRE(a.state.step == b.state.step);
        REQUIRE(a.state.data_cursor == b.state.data_cursor);
        const std::string w1 = "/params/blocks.0.moe.experts.w1";
        REQUIRE(layout_of(dir / "resident/last.h5", w1) ==
                layout_of(dir / "offloaded/last.h5", w1));
      }
    }
  }
}

TEST_CASE("offload: resume from a streamed checkpoint equals the uninterrupted run (bitwise)",
          "[offload]") {
  for (Arch arch : {Arch::gpt, Arch::mixtral}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      DYNAMIC_SECTION(arch_name(arch) << " " << dtype_name(dtype)) {
        test::ScratchDir dir("offload-ckpt-resume");
        const train::TrainConfig t = training(6, "host");
        train::Trainer straight(model(arch, dtype), t, {});
        run(straight, 6);
        train::Trainer first(model(arch, dtype), t, {});
        run(first, 3);
        const std::string path = first.save(dir.path());
        train::Trainer second(model(arch, dtype), t, {});
        second.restore(dir / "last.h5");
        REQUIRE(second.steps_done() == 3);
        run(second, 3);
        require_same(straight, second);
        // The usual checkpoint: a resident run resumes from it, and to the same parameters.
        train::Trainer resident(model(arch, dtype), training(6, "none"), {});
        resident.restore(path);
        run(resident, 3);
        require_same(straight, resident);
      }
    }
  }
}

TEST_CASE("offload: a damaged or non-finite expert in the checkpoint is refused at resume",
          "[offload]") {
  test::ScratchDir dir("offload-ckpt-bad");
  const train::TrainConfig t = training(4, "host");
  train::Trainer first(model(Arch::mixtral), t, {});
  run(first, 2);
  const std::string path = first.save(dir / "run");
  const std::string name = "blocks.1.moe.experts.w2";

  // NaN in expert 2 of an offloaded tensor: refused naming the tensor and the expert.
  io::Checkpoint c = io::load_checkpoint(path);
  for (io::NamedTensor& nt : c.optim)
    if (nt.name == "adam.v." + name) {
      nt.tensor = nt.tensor.clone();
      nt.tensor.rows(2, 3).data<float>()[1] = std::numeric_limits<float>::infinity();
    }
  io::save_checkpoint(dir / "nan.h5", c);
  train::Trainer second(model(Arch::mixtral), t, {});
  REQUIRE_THROWS_WITH(second.restore(dir / "nan.h5"),
                      Catch::Contains("tensor 'adam.v." + name + "' holds a non-finite value") &&
                          Catch::Contains("expert 2)"));

  // One flipped byte inside expert 1's chunk: its checksum fails when that chunk is read.
  const Tensor expert1 = io::read_expert(path, name, 1);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = bytes.find(std::string(static_cast<const char*>(expert1.raw()), 64));
  REQUIRE(at != std::string::npos);
  bytes[at + 10] = static_cast<char>(bytes[at + 10] ^ 0x40);
  std::ofstream(dir / "damaged.h5", std::ios::binary) << bytes;
  train::Trainer third(model(Arch::mixtral), t, {});
  REQUIRE_THROWS_WITH(third.restore(dir / "damaged.h5"), Catch::Contains(name));

  // A missing optimizer tensor of an offloaded parameter is named before anything is read.
  io::Checkpoint missing = io::load_checkpoint(path);
  std::erase_if(missing.optim,
                [&](const io::NamedTensor& nt) { return nt.name == "adam.m." + name; });
  io::save_checkpoint(dir / "missing.h5", missing);
  train::Trainer fourth(model(Arch::mixtral), t, {});
  REQUIRE_THROWS_WITH(fourth.restore(dir / "missing.h5"),
                      Catch::Contains("missing tensor 'adam.m." + name + "'"));
}

// Not in the AddressSanitizer build: its allocator quarantines freed memory and pads every
// allocation, so the resident set measures ASan, not the save (the Release pass runs it).
#if !defined(__SANITIZE_ADDRESS__)
// Peak memory: a model whose expert state (values, AdamW m and v: 3 x 4 bytes a weight) is large
// beside everything else. Gathering it (snapshot()) must raise the peak resident set by about that
// much; save() and restore() stream one expert slice at a time, so their peak growth is bounded
// by a few slices plus HDF5's chunk cache (1 MiB) and metadata: well under an eighth of it.
TEST_CASE("offload: saving and restoring never hold a whole expert tensor (peak RSS)",
          "[offload]") {
  ModelConfig big = test::small_model_config(Arch::mixtral);
  big.experts = 16;
  big.d_model = 64;
  big.d_ff = 512;
  big.resolve();
  const int64_t weights = big.layers * big.experts * 3 * big.d_ff * big.d_model;
  const int64_t expert_state_kib = weights * 3 * 4 / 1024;  // value, m, v: f32
  REQUIRE(expert_state_kib == 36 * 1024);
  test::ScratchDir dir("offload-ckpt-rss");
  train::TrainConfig t = training(2, "host");
  t.offload.host_budget = "";  // every expert in host memory
  train::Trainer saver(big, t, {});
  train::Trainer restorer(big, t, {});
  int64_t offloaded = 0;
  for (const Param* p : std::as_const(saver.params()).all())
    if (p->offloaded) offloaded += shape_numel(p->shape);
  REQUIRE(offloaded == weights);

  saver.save(dir / "warm-up");  // HDF5's one-time setup (free lists, caches) is not the save's

  reset_peak_rss();
  const int64_t before_save = vm_hwm_kib();
  const std::string path = saver.save(dir.path());
  const int64_t save_growth = vm_hwm_kib() - before_save;

  reset_peak_rss();
  const int64_t before_restore = vm_hwm_kib();
  restorer.restore(path);
  const int64_t restore_growth = vm_hwm_kib() - before_restore;

  reset_peak_rss();
  const int64_t before_gather = vm_hwm_kib();
  int64_t gather_growth = 0;
  {
    const io::Checkpoint gathered = saver.snapshot();
    gather_growth = vm_hwm_kib() - before_gather;
  }
  INFO("expert state " << expert_state_kib << " KiB; peak growth: save " << save_growth
                       << " KiB, restore " << restore_growth << " KiB, snapshot() " << gather_growth
                       << " KiB");
  REQUIRE(gather_growth > expert_state_kib * 9 / 10);  // the measurement sees a gather
  REQUIRE(save_growth < expert_state_kib / 8);
  REQUIRE(restore_growth < expert_state_kib / 8);
  require_same(saver, restorer);
}
#endif  // !__SANITIZE_ADDRESS__
