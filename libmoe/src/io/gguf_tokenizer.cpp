// GGUF tokenizer keys -> a tokenizer.json or tokenizer.model (see
// io/gguf_tokenizer.h). A tokenizer.model is a serialised sentencepiece
// ModelProto; Debian ships no header for it, so the few fields written here are
// encoded by hand (protobuf wire format: varint keys (field << 3 | wire type),
// varints, little-endian fixed32, length-delimited bytes), with the field
// numbers of sentencepiece_model.proto.
#include "io/gguf_tokenizer.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "io/tokenizer_impl.h"
#include "moe/io/tokenizer.h"

namespace moe::io::gguf {

namespace {

using nlohmann::json;
using TokenKind = Tokenizer::TokenKind;

// What the file says, read and checked once.
struct GgufVocab {
  std::vector<std::string> tokens;
  std::vector<int64_t> kinds;  // Tokenizer::TokenKind values
  std::vector<float> scores;   // empty: none
  int64_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false;
};

int64_t token_id(const Keys& k, const std::string& key, size_t tokens) {
  if (!k.has(key)) return -1;
  const int64_t id = k.integer(key);
  if (id < 0 || id >= static_cast<int64_t>(tokens))
    k.fail(key, str("is ", id, ", outside the vocabulary of ", tokens, " tokens"));
  return id;
}

GgufVocab read_vocab(const Keys& k, int64_t V) {
  GgufVocab v;
  v.tokens = k.strings("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  if (static_cast<int64_t>(n) > V)
    k.fail("tokenizer.ggml.tokens",
           str("holds ", n, " tokens, more than the model's vocabulary (", V, ")"));
  v.kinds = k.has("tokenizer.ggml.token_type") ? k.integers("tokenizer.ggml.token_type")
                                               : std::vector<int64_t>(n, 1);
  if (v.kinds.size() != n)
    k.fail("tokenizer.ggml.token_type", str("has ", v.kinds.size(), " entries for ", n, " tokens"));
  for (int64_t kind : v.kinds)
    if (kind < 1 || kind > 6) k.fail("tokenizer.ggml.token_type", str("holds the type ", kind));
  if (k.has("tokenizer.ggml.scores")) {
    v.scores = k.reals("tokenizer.ggml.scores");
    if (v.scores.size() != n)
      k.fail("tokenizer.ggml.scores", str("has ", v.scores.size(), " entries for ", n, " tokens"));
  }
  v.bos = token_id(k, "tokenizer.ggml.bos_token_id", n);
  v.eos = token_id(k, "tokenizer.ggml.eos_token_id", n);
  v.unk = token_id(k, "tokenizer.ggml.unknown_token_id", n);
  v.add_bos = k.flag_or("tokenizer.ggml.add_bos_token", false);
  // The export's padding to the model's vocabulary: unused "[PAD<id>]" tokens
  // at the end.
  size_t used = n;
  while (used > 0 && v.kinds[used - 1] == static_cast<int64_t>(TokenKind::unused) &&
         v.tokens[used - 1] == str("[PAD", used - 1, "]"))
    --used;
  v.tokens.resize(used);
  v.kinds.resize(used);
  if (!v.scores.empty()) v.scores.resize(used);
  return v;
}

bool byte_level_vocabulary(const GgufVocab& v, const Keys& k) {
  if (v.tokens.size() != 256 ||
      (k.has("tokenizer.ggml.merges") && !k.strings("tokenizer.ggml.merges").empty()))
    return false;
  for (int b = 0; b < 256; ++b)
    if (v.tokens[static_cast<size_t>(b)] != byte_level_char(static_cast<uint8_t>(b))) return false;
  return true;
}

// ---- gpt2: tokenizer.json
// ----------------------------------------------------------------------

// The pre-tokenizer (and normaliser) of llama.cpp's pre-tokenizer `pre`, as the
// model's own tokenizer.json has them; null for a name we do not run.
json bpe_pre_tokenizer(const std::string& pre, json& normalizer) {
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", pre != "qwen2" && pre != "gpt-4o"}};
  // Qwen2's tokenizer.json: NFC, its Split, byte-level without a regex; gpt-oss's (o200k) the
  // same without a normaliser.
  if (pre == "qwen2" || pre == "gpt-4o") {
    if (pre == "qwen2") normalizer = {{"type", "NFC"}};
    const json split = {
        {"type", "Split"},
        {"pattern", {{"Regex", pre == "qwen2" ? detail::kQwen2Pattern : detail::kO200kPattern}}},
        {"behavior", "Isolated"},
        {"invert", false}};
    return {{"type", "Sequence"}, {"pretokenizers", json::array({split, byte_level})}};
  }
  if (pre == "gpt-2" || pre == "olmo") return byte_level;  // GPT-2's expression (OLMoE's too)
  return nullptr;
}

std::string bpe_json(const Keys& k, const GgufVocab& v, const json& pre, const json& normalizer) {
  json vocab = json::object(), added = json::array();
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const auto kind = static_cast<TokenKind>(v.kinds[id]);
    if (kind == TokenKind::control || kind == TokenKind::user_defined) {
      added.push_back({{"id", id},
                       {"content", v.tokens[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", kind == TokenKind::control}});
      continue;
    }
    if (!vocab.emplace(v.tokens[id], id).second)
      throw Error(str("the token '", v.tokens[id], "' is in the vocabulary twice"));
  }
  json merges =
      k.has("tokenizer.ggml.merges") ? json(k.strings("tokenizer.ggml.merges")) : json::array();
  json model = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges}};
  if (v.unk >= 0) model["unk_token"] = v.tokens[static_cast<size_t>(v.unk)];
  json post = nullptr;
  if (v.add_bos && v.bos >= 0) {  // the BOS the model's template puts before a text
    const std::string bos = v.tokens[static_cast<size_t>(v.bos)];
    const json special = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
    post = {{"type", "TemplateProcessing"},
            {"single", {special, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair",
             {special,
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
              special,
              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
            {"special_tokens", {{bos, {{"id", bos}, {"ids", {v.bos}}, {"tokens", {bos}}}}}}};
  }
  const json j = {{"version", "1.0"},
                  {"truncation", nullptr},
                  {"padding", nullptr},
                  {"added_tokens", added},
                  {"normalizer", normalizer},
                  {"pre_tokenizer", pre},
                  {"post_processor", post},
                  {"decoder",
                   {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}}},
                  {"model", model}};
  return j.dump();  // throws on a token that is not UTF-8
}

// ---- llama: tokenizer.model
// --------------------------------------------------------------------

class Proto {
 public:
  void varint(uint32_t field, uint64_t v) {
    key(field, 0);
    put_varint(v);
  }
  void integer(uint32_t field, int64_t v) { varint(field, static_cast<uint64_t>(v)); }
  void fixed32(uint32_t field, float v) {
    key(field, 5);
    char b[4];
    std::memcpy(b, &v, 4);
    bytes_.append(b, 4);
  }
  void bytes(uint32_t field, const std::string& v) {
    key(field, 2);
    put_varint(v.size());
    bytes_ += v;
  }
  const std::string& str() const { return bytes_; }

 private:
  void key(uint32_t field, uint32_t wire) { put_varint(uint64_t(field) << 3 | wire); }
  void put_varint(uint64_t v) {
    for (; v >= 0x80; v >>= 7) bytes_ += static_cast<char>((v & 0x7f) | 0x80);
    bytes_ += static_cast<char>(v);
  }
  std::string bytes_;
};

// A SentencePiece BPE model (what llama.cpp's llama vocabulary runs: pieces
// merged by score) with the identity normaliser, a dummy prefix
// (tokenizer.ggml.add_space_prefix, default true), white space kept as it is,
// whitespace-only pieces allowed, and byte fallback when there are byte pieces:
// the settings of Llama's and Mistral's tokenizer.model.
std::string spm_model(const Keys& k, const GgufVocab& v) {
  Proto model;
  bool bytes = false;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    Proto piece;
    piece.bytes(1, v.tokens[id]);
    piece.fixed32(2, v.scores.empty() ? 0.0f : v.scores[id]);
    piece.integer(3, v.kinds[id]);
    bytes |= v.kinds[id] == static_cast<int64_t>(TokenKind::byte);
    model.bytes(1, piece.str());
  }
  auto piece_of = [&](int64_t id) { return id >= 0 ? v.tokens[static_cast<size_t>(id)] : ""; };
  Proto trainer;
  trainer.integer(3, 2);  // model_type BPE
  trainer.integer(4, static_cast<int64_t>(v.tokens.size()));
  trainer.integer(26, 1);              // allow_whitespace_only_pieces
  trainer.integer(35, bytes ? 1 : 0);  // byte_fallback
  trainer.integer(40, v.unk);
  trainer.integer(41, v.bos);
  trainer.integer(42, v.eos);
  trainer.integer(43, -1);  // pad_id
  trainer.bytes(45, piece_of(v.unk));
  trainer.bytes(46, piece_of(v.bos));
  trainer.bytes(47, piece_of(v.eos));
  model.bytes(2, trainer.str());
  Proto normalizer;
  normalizer.bytes(1, "identity");
  normalizer.integer(3, k.flag_or("tokenizer.ggml.add_space_prefix", true) ? 1 : 0);
  normalizer.integer(4, k.flag_or("tokenizer.ggml.remove_extra_whitespaces", false) ? 1 : 0);
  normalizer.integer(5, 1);  // escape_whitespaces: ' ' as U+2581
  model.bytes(3, normalizer.str());
  return model.str();
}

}  // namespace

StoredTokenizer tokenizer_from_gguf(const Keys& k, int64_t V, std::vector<std::string>& notes) {
  if (!k.has("tokenizer.ggml.model")) {
    notes.push_back("no tokenizer.ggml.model: no tokenizer stored");
    return {};
  }
  const std::string model = k.text("tokenizer.ggml.model");
  const GgufVocab v = read_vocab(k, V);
  StoredTokenizer out;
  if (model == "gpt2") {
    if (byte_level_vocabulary(v, k)) {
      notes.push_back("the byte-level vocabulary (256 byte tokens): no tokenizer stored");
      return {};
    }
    const std::string pre = k.text_or("tokenizer.ggml.pre", "default");
    json normalizer = nullptr;
    const json pre_tokenizer = bpe_pre_tokenizer(pre, normalizer);
    if (pre_tokenizer.is_null()) {
      notes.push_back(str("tokenizer left out: tokenizer.ggml.pre '", pre,
                          "' is not a pre-tokenizer this build runs (gpt-2, olmo, qwen2, gpt-4o)"));
      return {};
    }
    try {
      out = {kTokenizerJson, bpe_json(k, v, pre_tokenizer, normalizer)};
    } catch (const std::exception& e) {
      notes.push_back(str("tokenizer left out: ", e.what()));
      return {};
    }
  } else if (model == "llama") {
    out = {kTokenizerModel, spm_model(k, v)};
  } else {
    notes.push_back(str("tokenizer left out: tokenizer.ggml.model '", model,
                        "' is not one this build runs (gpt2: byte-level BPE, llama: "
                        "SentencePiece)"));
    return {};
  }
  // Loaded once here, as the checkpoint's readers will load it: one our code
  // refuses is left out.
  try {
    const auto tok = tokenizer_from_bytes(out.file, out.bytes, k.path());
    if (tok->bos_id() != v.bos && (v.add_bos || model == "llama"))
      notes.push_back(str("tokenizer: BOS ", tok->bos_id(), " where the file says ", v.bos));
    if (tok->eos_id() != v.eos)
      notes.push_back(str("tokenizer: end of text ", tok->eos_id(), " where the file says ", v.eos,
                          " (tokenizer.json names it by the conventional names)"));
    notes.push_back(str("tokenizer rebuilt: ", tok->describe()));
  } catch (const Error& e) {
    notes.push_back(str("tokenizer left out: ", e.what()));
    return {};
  }
  return out;
}

}  // namespace moe::io::gguf
