// Latent attention's decode cache (issue 44, DeepSeek-V2/V3): the cache holds kv_lora_rank +
// qk_rope floats a position a layer (the compressed latent and the rotated k_pe, not full keys and
// values), decode multiplies through the absorbed projections (nn/attention_latent.cpp), and
// generation through it gives the uncached forward's greedy tokens, with logits equal up to f32
// reassociation, for DeepSeek-V3 (a q latent) and DeepSeek-V2-Lite (a plain q projection), f32
// and lean 16-bit weights.
//
// Tolerances: the cached logits are the uncached ones with two sums regrouped per head,
// q . (W_UK c) -> (q W_UK) . c over c kv_lora_rank + qk_nope terms, and sum_j p_j (W_UV c_j) ->
// W_UV (sum_j p_j c_j), then the usual chains of f32 dot products (length <= 4 D) through the
// blocks. Each regrouping moves a result by a few ulps of its terms' magnitude (~1e-7 relative);
// carried through a few blocks that is ~1e-6 of the logits' scale. We allow 2e-5 of the largest
// |logit|, far below what a wrong head, scale, RoPE position or cache slot does (O(1), checked by
// the size of the logits' gaps).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "backend/cpu/gemv.h"
#include "moe/infer/generate.h"
#include "moe/infer/model.h"
#include "moe/io/checkpoint.h"
#include "moe/io/convert.h"
#include "moe/models/memory.h"
#include "moe/models/transformer.h"
#include "moe/nn/attention.h"
#include "moe/rng.h"
#include "support/bits.h"
#include "support/hf_deepseek_v3.h"
#include "support/models.h"
#include "support/run.h"

using namespace moe;
using namespace moe::nn;

namespace {

// DeepSeek-V3's shape in small: a q latent, values narrower than keys, sigmoid routing with
// groups; `v2` gives DeepSeek-V2-Lite's: a plain q projection, softmax routing.
ModelConfig tiny_deepseek(bool v2, DType dtype = DType::f32) {
  ModelConfig c;
  c.arch = Arch::deepseek_v3;
  c.vocab_size = 48, c.layers = 3, c.d_model = 24, c.heads = 3, c.seq = 16;
  c.q_lora_rank = v2 ? 0 : 12, c.kv_lora_rank = 10, c.qk_nope_dim = 6, c.qk_rope_dim = 4;
  c.v_head_dim = 5;
  c.d_ff = 8, c.dense_ff = 16, c.shared_expert_ff = 8;
  c.experts = 4, c.moe_every = 2, c.top_k = 2;
  c.normalize_topk = !v2;
  c.router_scoring = v2 ? nn::RouterScoring::softmax : nn::RouterScoring::sigmoid;
  if (!v2) c.router_groups = 2, c.router_group_topk = 1, c.routed_scale = 2.5;
  c.dtype = dtype;
  c.resolve();
  return c;
}

// Parameters spread out (the initial 0.02 would leave near-ties for greedy decoding).
struct Model {
  Model(bool v2, DType dtype = DType::f32)
      : config(tiny_deepseek(v2, dtype)), params(5, dtype), model(config, params) {
    for (Param* p : params.all()) {
      if (p->frozen) continue;
      const float scale = p->value.ndim() == 1 ? 0.1f : 0.3f;
      Tensor noise = test::random_tensor(p->value.shape(), hash_name(p->name), scale);
      if (p->value.ndim() == 1) add_ones(noise);
      p->value.copy_from(noise);
      p->refresh_compute();
    }
  }
  static void add_ones(Tensor& t) {  // norm weights near 1
    float* d = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) d[i] += 1.0f;
  }
  ModelConfig config;
  ParamSet params;
  Transformer model;
};

std::vector<float> full_last_logits(const Transformer& model, const std::vector<int32_t>& tokens) {
  const int64_t t = static_cast<int64_t>(tokens.size()), v = model.config().vocab_size;
  const std::vector<float> all = model.logits(Tensor::from_vector({1, t}, tokens)).to_vector();
  return std::vector<float>(all.end() - v, all.end());
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// max |a - b| / max |b|
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

std::vector<int32_t> prompt(int64_t length, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < length; ++i)
    p.push_back(static_cast<int32_t>(
        rng_below(rng_key(seed, {0x3c}), static_cast<uint64_t>(i), static_cast<uint64_t>(vocab))));
  return p;
}

// Prefill of `tokens`, then greedy steps to the context's end through the cache, each step's
// logits against the full forward's; returns the worst relative error.
double cached_against_full(const Transformer& model, std::vector<int32_t> tokens) {
  const int64_t v = model.config().vocab_size;
  KVCache cache = model.make_cache(2);
  double worst = 0;
  Tensor logits =
      model.forward_cached(Tensor::from_vector({static_cast<int64_t>(tokens.size())}, tokens),
                           {static_cast<int64_t>(tokens.size())}, {1}, cache);  // slot 1 of 2
  while (true) {
    const std::vector<float> got = logits.to_vector(), want = full_last_logits(model, tokens);
    REQUIRE(got.size() == static_cast<size_t>(v));
    worst = std::max(worst, relative_error(got, want));
    const int32_t next = argmax(want);
    CHECK(argmax(got) == next);
    if (static_cast<int64_t>(tokens.size()) == model.config().seq) break;
    tokens.push_back(next);
    logits =
        model.forward_cached(Tensor::from_vector({1}, std::vector<int32_t>{next}), {1}, {1}, cache);
  }
  CHECK(cache.length[1] == model.config().seq);
  CHECK(cache.length[0] == 0);
  return worst;
}

}  // namespace

TEST_CASE("mla cache: a position costs the latent, not full keys and values", "[mla][decode]") {
  for (bool v2 : {false, true}) {
    INFO((v2 ? "deepseek_v2" : "deepseek_v3"));
    Model m(v2);
    const ModelConfig& c = m.config;
    const int64_t latent = c.kv_lora_rank + c.qk_rope_dim;
    const KVCache cache = m.model.make_cache(2, 7);
    REQUIRE(cache.blocks.size() == size_t(c.layers));
    for (const AttentionCache& block : cache.blocks) {
      CHECK(block.bytes_per_token() == latent * int64_t(sizeof(float)));
      CHECK(block.latent.shape() == Shape{2, 7, latent});
      CHECK_FALSE(block.k.defined());
      CHECK_FALSE(block.v.defined());
      CHECK_FALSE(block.key_weight.defined());  // f32 weights are read in place
    }
    CHECK(cache.capacity() == 7);
    CHECK(cache.slots() == 2);
    CHECK(cache.bytes_per_token() == c.layers * latent * int64_t(sizeof(float)));
    CHECK(kv_cache_bytes_per_token(c) == double(cache.bytes_per_token()));
  }
  // A plain attention's cache: keys and values, as the estimate says.
  ModelConfig mixtral = test::small_model_config(Arch::mixtral);
  mixtral.resolve();
  ParamSet ps(3);
  Transformer plain(mixtral, ps);
  const KVCache cache = plain.make_cache(1, 4);
  CHECK_FALSE(cache.blocks[0].latent.defined());
  CHECK(cache.bytes_per_token() ==
        mixtral.layers * 2 * mixtral.kv_heads_resolved() * mixtral.head_dim_resolved() * 4);
  CHECK(kv_cache_bytes_per_token(mixtral) == double(cache.bytes_per_token()));
}

// The docs' figures (docs/GUIDE.md, DeepSeek): computed from the released configs' shapes.
TEST_CASE("mla cache: DeepSeek-V3's and V2-Lite's bytes a token", "[mla][decode]") {
  ModelConfig v3;
  v3.arch = Arch::deepseek_v3;
  v3.layers = 61, v3.heads = 128, v3.kv_lora_rank = 512, v3.qk_rope_dim = 64;
  v3.qk_nope_dim = 128, v3.v_head_dim = 128, v3.q_lora_rank = 1536;
  CHECK(kv_cache_bytes_per_token(v3) == 61.0 * 2304);
  ModelConfig lite = v3;
  lite.layers = 27, lite.heads = 16, lite.q_lora_rank = 0;
  CHECK(kv_cache_bytes_per_token(lite) == 27.0 * 2304);
}

TEST_CASE("mla cache: the layer's ragged rows equal each sequence's full forward",
          "[mla][decode]") {
  test::dsv3::MlaShape s;
  AttentionConfig c;
  c.d_model = s.D, c.heads = s.H, c.rope = true, c.rope_theta = float(s.theta);
  c.norm_eps = float(s.eps);
  c.mla = test::dsv3::mla_config(s);
  ParamSet ps(4);
  Attention attention(ps, "attn", c);
  test::dsv3::load_mla(ps, "attn", s, test::dsv3::mla_weights(s, 9));
  const int64_t T = 7;
  const Tensor a = test::random_tensor({T, s.D}, 21), b = test::random_tensor({T, s.D}, 22);
  const std::vector<float> full_a = attention.forward(a, 1, T, nullptr).to_vector();
  const std::vector<float> full_b = attention.forward(b, 1, T, nullptr).to_vector();
  AttentionCache cache = attention.make_cache(3, T);
  // Step 1: a's first 2 tokens in slot 2, b's first 4 in slot 0 (one ragged batch).
  std::vector<float> x1 = a.rows(0, 2).to_vector(), xb = b.rows(0, 4).to_vector();
  x1.insert(x1.end(), xb.begin(), xb.end());
  const std::vector<float> y1 =
      attention.forward_cached(Tensor::from_vector({6, s.D}, x1), {{2, 0}, {0, 0}, {2, 4}}, cache)
          .to_vector();
  // Step 2: a continues with 3 tokens at position 2 (a prefill after cached ones), b with 1.
  std::vector<float> x2 = a.rows(2, 5).to_vector(), xb2 = b.rows(4, 5).to_vector();
  x2.insert(x2.end(), xb2.begin(), xb2.end());
  const std::vector<float> y2 =
      attention.forward_cached(Tensor::from_vector({4, s.D}, x2), {{2, 0}, {2, 4}, {3, 1}}, cache)
          .to_vector();
  const int64_t D = s.D;
  auto part = [D](const std::vector<float>& v, int64_t from, int64_t to) {
    return std::vector<float>(v.begin() + from * D, v.begin() + to * D);
  };
  std::vector<float> got_a = part(y1, 0, 2), got_b = part(y1, 2, 6);
  const std::vector<float> a2 = part(y2, 0, 3), b2 = part(y2, 3, 4);
  got_a.insert(got_a.end(), a2.begin(), a2.end());
  got_b.insert(got_b.end(), b2.begin(), b2.end());
  CHECK(relative_error(got_a, part(full_a, 0, 5)) < 1e-5);
  CHECK(relative_error(got_b, part(full_b, 0, 5)) < 1e-5);
  // The cache holds each position's [c | k_pe]: slot 1 was never written.
  for (float value : cache.latent.rows(1, 2).to_vector()) REQUIRE(value == 0.0f);

  // A cache of full keys and values (a plain layer's) is refused by name, not read as a latent.
  AttentionConfig plain_config;
  plain_config.d_model = s.D, plain_config.heads = s.H, plain_config.rope = true;
  ParamSet plain_ps(5);
  Attention plain(plain_ps, "plain", plain_config);
  AttentionCache wrong = plain.make_cache(3, T);
  CHECK_THAT(test::error_of([&] {
               attention.forward_cached(a.rows(0, 1).clone(), {{0}, {0}, {1}}, wrong);
             }),
             Catch::Contains("attention attn: its cache must hold the latent (" +
                             std::to_string(s.c + s.dr) + " features a position)"));
}

TEST_CASE("mla cache: greedy decoding equals the uncached forward", "[mla][decode][generate]") {
  for (bool v2 : {false, true}) {
    INFO((v2 ? "deepseek_v2 (plain q projection)" : "deepseek_v3 (q latent)"));
    Model m(v2);
    const double worst = cached_against_full(m.model, prompt(5, m.config.vocab_size, 1));
    INFO("worst relative logit error " << worst);
    CHECK(worst < 2e-5);

    // infer::generate, several prompts in one batch, against a loop over the full forward.
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t length : {3, 8, 1, 6}) prompts.push_back(prompt(length, m.config.vocab_size, 7));
    infer::SamplingConfig greedy;
    greedy.max_new = 6;
    const std::vector<infer::Generation> out = infer::generate(m.model, prompts, greedy, 3);
    REQUIRE(out.size() == prompts.size());
    for (size_t p = 0; p < prompts.size(); ++p) {
      INFO("prompt " << p);
      std::vector<int32_t> seq = prompts[p], expected;
      while (static_cast<int64_t>(expected.size()) < greedy.max_new) {
        expected.push_back(argmax(full_last_logits(m.model, seq)));
        seq.push_back(expected.back());
      }
      CHECK(out[p].tokens == expected);
    }
  }
}

// A bf16 model made lean for inference keeps k_b and v_b in 16 bits: the cache then holds their
// f32 copies (exact widening), and decoding matches the same values read as f32.
TEST_CASE("mla cache: lean 16-bit weights decode as their f32 values", "[mla][decode]") {
  Model m(false, DType::bf16);
  const std::vector<int32_t> p = prompt(4, m.config.vocab_size, 3);
  KVCache before = m.model.make_cache(1);
  CHECK_FALSE(before.blocks[0].key_weight.defined());
  const std::vector<float> want =
      m.model.forward_cached(Tensor::from_vector({1, 4}, p), before).to_vector();
  infer::lean_for_inference(m.params);
  REQUIRE(m.params.at("blocks.0.attn.k_b.weight").w().dtype() == DType::bf16);
  KVCache cache = m.model.make_cache(1);
  REQUIRE(cache.blocks[0].key_weight.dtype() == DType::f32);
  CHECK(cache.blocks[0].key_weight.to_vector() ==
        m.params.at("blocks.0.attn.k_b.weight").value.to_vector());
  CHECK(cache.blocks[0].value_weight.to_vector() ==
        m.params.at("blocks.0.attn.v_b.weight").value.to_vector());
  const std::vector<float> got =
      m.model.forward_cached(Tensor::from_vector({1, 4}, p), cache).to_vector();
  CHECK(relative_error(got, want) < 2e-5);
  CHECK(argmax(got) == argmax(want));
}

// A Q8_0 model (moe-convert quantize) reads k_b and v_b as Q8_0 rows, which the kernels multiply
// only as x W^T: the cache holds their dequantised values in f32 (the kernel's products with the
// identity; exact where it widens the weights, as it does for products of that many rows). Its
// decode then differs from the dequantised f32 model by Q8_0 rounding of the other weights'
// 8-bit inputs, as the uncached Q8_0 forward does (both 6% of the largest logit after the
// prefill here, 1.4% after a step: the weights are spread wide); a decode that is wrong (a head,
// a scale, a position) lands O(1) away. Bound: no more than twice the uncached path's distance.
TEST_CASE("mla cache: a Q8_0 model's k_b and v_b are copied as their dequantised values",
          "[mla][decode]") {
  test::ScratchDir dir("mla-cache-q8");
  Model m(false);
  io::Checkpoint c;
  c.model_config = to_json(m.config);
  for (const Param* p : m.params.all()) c.params.push_back({p->name, p->value, p->expert, {}});
  const io::Checkpoint q = io::quantize(c, "q8_0");
  io::save_checkpoint(dir / "q.h5", q);
  infer::LoadedModel loaded = infer::load_model(dir / "q.h5");
  infer::lean_for_inference(*loaded.params);
  REQUIRE(loaded.params->at("blocks.1.attn.k_b.weight").compute.dtype() == DType::q8_0);
  KVCache cache = loaded.model->make_cache(1);
  for (const io::NamedTensor& nt : q.params) {
    const bool key = nt.name == "blocks.1.attn.k_b.weight";
    if (!key && nt.name != "blocks.1.attn.v_b.weight") continue;
    CAPTURE(nt.name);
    REQUIRE(nt.tensor.dtype() == DType::u8);
    const int64_t in = m.config.kv_lora_rank, rows = nt.tensor.dim(0);
    std::vector<float> want(static_cast<size_t>(rows * in));
    for (int64_t r = 0; r < rows; ++r)
      cpu::dequantize_q8_0_row(nt.tensor.data<uint8_t>() + r * cpu::q8_row_bytes(in), in,
                               want.data() + r * in);
    const Tensor& got = key ? cache.blocks[1].key_weight : cache.blocks[1].value_weight;
    REQUIRE(got.shape() == Shape{rows, in});
    CHECK(relative_error(got.to_vector(), want) <= 1e-6);
  }
  // The same model with each quantised weight replaced by its dequantised values, in f32.
  Model deq(false);
  for (const io::NamedTensor& nt : q.params) {
    if (nt.tensor.dtype() != DType::u8) continue;
    Param& param = deq.params.at(nt.name);
    const int64_t in = param.value.shape().back(), rows = param.value.numel() / in;
    for (int64_t r = 0; r < rows; ++r)
      cpu::dequantize_q8_0_row(nt.tensor.data<uint8_t>() + r * cpu::q8_row_bytes(in), in,
                               param.value.data<float>() + r * in);
    param.refresh_compute();
  }
  const std::vector<int32_t> p = prompt(6, m.config.vocab_size, 4);
  const std::vector<int32_t> head(p.begin(), p.end() - 1);
  const std::vector<float> prefill =
      loaded.model->forward_cached(Tensor::from_vector({1, 5}, head), cache).to_vector();
  const std::vector<float> step =
      loaded.model
          ->forward_cached(Tensor::from_vector({1, 1}, std::vector<int32_t>{p.back()}), cache)
          .to_vector();
  const double a1 = relative_error(prefill, full_last_logits(deq.model, head));
  const double b1 =
      relative_error(full_last_logits(*loaded.model, head), full_last_logits(deq.model, head));
  const double a2 = relative_error(step, full_last_logits(deq.model, p));
  const double b2 =
      relative_error(full_last_logits(*loaded.model, p), full_last_logits(deq.model, p));
  INFO("against the dequantised f32 model: cached "
       << a1 << " (prefill), " << a2 << " (a step); uncached Q8_0 " << b1 << ", " << b2);
  CHECK(a1 <= 2 * b1);
  CHECK(a2 <= 2 * b2);
}
