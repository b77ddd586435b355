// Conversions stream (issue 43, "bounded-memory conversion"): moe-convert dtype, quantize, freeze,
// import-hf, export-gguf and import-gguf run under an address-space limit (RLIMIT_AS, set by
// `ulimit -v`) of what the same conversion of a tiny model needs plus 128 MB, less than a third
// of the model they convert, and give the bytes the in-memory conversions give. The model is
// made just big enough to tell: Mixtral-shaped, 8 layers of 16 experts, d_model 256, F 1024, f32
// (about 410 MB; its largest tensor 16.8 MB, one expert 1 MB), written expert by expert so that
// the test itself never holds it either.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "backend/cpu/gemv.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "moe/io/hf_checkpoint.h"
#include "moe/models/transformer.h"
#include "moe/rng.h"
#include "support/run.h"

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
  ModelConfig c;
  c.arch = Arch::mixtral;
  c.layers = layers;
  c.d_model = d_model;
  c.heads = 4;
  c.kv_heads = 2;
  c.d_ff = d_ff;
  c.seq = 64;
  c.experts = experts;
  c.moe_every = 1;
  c.top_k = 2;
  c.normalize_topk = true;
  c.resolve();
  return c;
}

ModelConfig big_config() { return model_config(8, 256, 1024, 16); }

// Values of tensor `name` (expert e, or -1 for a whole non-expert tensor): normal(0, 0.05).
Tensor values(const std::string& name, int64_t e, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::f32);
  const uint64_t key = rng_key(7, {hash_name(name), static_cast<uint64_t>(e + 1)});
  float* v = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = 0.05f * rng_normal(key, static_cast<uint64_t>(i));
  return t;
}

// Writes the model: its parameter names and shapes from the model the config builds (values
// never written there), the values from values(), expert tensors one expert at a time.
int64_t write_model(const std::string& path, const ModelConfig& config) {
  ParamSet params(0, DType::f32);
  params.skip_initial_values(true);
  params.skip_gradients(true);
  Transformer model(config, params);
  io::Checkpoint ckpt;
  ckpt.model_config = to_json(config);
  ckpt.train_config = nullptr;
  int64_t bytes = 0;
  for (const Param* p : std::as_const(params).all()) {
    bytes += p->numel() * 4;
    if (!p->expert) {
      ckpt.params.push_back({p->name, values(p->name, -1, p->shape), false, {}});
      continue;
    }
    auto source = std::make_shared<io::ExpertSource>();
    source->shape = p->shape;
    const Shape rest(p->shape.begin() + 1, p->shape.end());
    source->read = [name = p->name, rest](int64_t e) { return values(name, e, rest); };
    ckpt.params.push_back(io::NamedTensor{p->name, Tensor(), true, {}, source});
  }
  io::save_checkpoint(path, ckpt);
  return bytes;
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
    // The HF directory is written here, in this process, without a limit.
    {
      io::Checkpoint whole = io::open_checkpoint_lazy(big, false);
      io::hold_all(whole);
      io::export_hf(whole, dir / "hf", {});
    }
    require_ok(run_command(
        limited(tool("moe-convert", "import-hf " + (dir / "hf") + " -o " + (dir / "back.h5")))));
    REQUIRE(io::read_expert(dir / "back.h5", kExpertTensor, 11).to_vector() == expert.to_vector());
    REQUIRE(io::read_param(dir / "back.h5", "lm_head.weight").to_vector() ==
            values("lm_head.weight", -1, {256, 256}).to_vector());
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
  for (const std::string& args : {"dtype " + (dir / "nan.h5") + " --to bf16 -o " + (dir / "o.h5"),
                                  "quantize " + (dir / "nan.h5") + " -o " + (dir / "o.h5"),
                                  "freeze " + (dir / "nan.h5") + " -o " + (dir / "o.h5")}) {
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
