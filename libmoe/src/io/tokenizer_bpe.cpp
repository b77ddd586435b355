// Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, Qwen, OLMoE), written from the
// format's documented semantics:
//   1. added tokens are cut out of the text first (leftmost, longest at a position) and map to
//      their ids directly;
//   2. each remaining segment is normalised (NFC, by ICU, when the file asks for it);
//   3. the pre-tokenizer splits it: Split steps by their regular expression (PCRE2, UTF + Unicode
//      properties; matches and the gaps between them become pieces, "Isolated"), then ByteLevel
//      (an optional leading space per piece, GPT-2's expression when use_regex, and every byte
//      spelled in GPT-2's byte alphabet);
//   4. each piece is merged by BPE: the adjacent pair of lowest merge rank, leftmost first, until
//      no pair has a rank (with ignore_merges, a piece that is itself a token is taken whole);
//   5. decoding spells each token (once, at load): a token made only of byte-alphabet characters
//      is those bytes, any other (an added token such as "<|im_end|>") its own UTF-8.
// Anything else the file asks for is refused by name when it is loaded.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/json_text.h"
#include "io/tokenizer_impl.h"
#include "io/utf8.h"
#include "moe/error.h"

namespace moe::io::detail {

namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer expression (ByteLevel with use_regex: contractions, letters, numbers,
// other symbols, each with an optional leading space, then runs of white space) and Qwen2's are
// kGpt2Pattern, kQwen2Pattern and kO200kPattern (io/tokenizer_impl.h).

class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                          &error, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      throw Error(str("tokenizer '", where, "': its pre-tokenizer expression does not compile (",
                      reinterpret_cast<const char*>(message), " at offset ", offset, ")"));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // faster where available; optional
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Regex() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // `s` cut into matches and the gaps between them, in order, empty pieces left out.
  void split_isolated(const std::string& s, std::vector<std::string>& out) const {
    size_t at = 0, gap = 0;
    while (at <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at,
                                 PCRE2_NO_UTF_CHECK, data_, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      MOE_CHECK(rc > 0, "tokenizer: pre-tokenizer expression failed (PCRE2 error ", rc, ")");
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_);
      const size_t begin = ov[0], end = ov[1];
      if (end == begin) {  // an empty match: no piece; move on by one character
        if (begin >= s.size()) break;
        at = begin + utf8_length(static_cast<unsigned char>(s[begin]));
        continue;
      }
      if (begin > gap) out.push_back(s.substr(gap, begin - gap));
      out.push_back(s.substr(begin, end - begin));
      gap = at = end;
    }
    if (gap < s.size()) out.push_back(s.substr(gap));
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;  // one tokenizer is used by one thread at a time
};

struct PreStep {
  std::shared_ptr<Regex> split;  // a Split step, or the ByteLevel step's own expression
  bool byte_level = false, add_prefix_space = false;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(std::string bytes, const std::string& where)
      : Tokenizer(kTokenizerJson, std::move(bytes), "byte-level BPE"), where_(where) {
    json j;
    try {
      j = json::parse(file_bytes());
    } catch (const json::exception& e) {
      throw Error(str("tokenizer '", where, "': ", json_error_words(e)));
    }
    try {
      load(j);
    } catch (const json::exception& e) {
      throw Error(
          str("tokenizer '", where, "': a field has the wrong type: ", json_error_words(e)));
    }
    std::unordered_map<std::string, char> byte_of_char;
    for (int b = 0; b < 256; ++b)
      byte_of_char[byte_level_char(static_cast<uint8_t>(b))] = static_cast<char>(b);
    for (Token& token : tokens_) token.bytes = spelled_bytes(token.text, byte_of_char);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const override {
    const size_t bad = invalid_utf8(text);
    MOE_CHECK(bad == std::string_view::npos, "tokenizer '", where_,
              "': the text is not valid UTF-8 (byte ", bad, ")");
    std::vector<int32_t> ids;
    if (add_special) ids = prefix_;
    size_t segment = 0, at = 0;
    while (at < text.size()) {
      const AddedToken* hit = nullptr;
      if (starts_added_[static_cast<unsigned char>(text[at])])
        for (const AddedToken& t : added_)  // longest first
          if (text.compare(at, t.content.size(), t.content) == 0) {
            hit = &t;
            break;
          }
      if (!hit) {
        ++at;
        continue;
      }
      encode_segment(text.substr(segment, at - segment), ids);
      ids.push_back(hit->id);
      at += hit->content.size();
      segment = at;
    }
    encode_segment(text.substr(segment), ids);
    if (add_special) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    return ids;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      const int32_t id = ids[i];
      MOE_CHECK(id >= 0 && static_cast<size_t>(id) < tokens_.size() && tokens_[size_t(id)].set,
                "tokenizer '", where_, "': token id ", id, " at position ", i,
                " is outside the vocabulary (", vocab_size(), " tokens)");
      out += tokens_[static_cast<size_t>(id)].bytes;
    }
    return out;
  }

  std::vector<VocabEntry> vocabulary() const override {
    std::vector<VocabEntry> out(tokens_.size());
    for (size_t id = 0; id < tokens_.size(); ++id) out[id].text = tokens_[id].text;
    for (const AddedToken& t : added_)
      out[static_cast<size_t>(t.id)].kind =
          t.special ? TokenKind::control : TokenKind::user_defined;
    if (unk_ >= 0) out[static_cast<size_t>(unk_)].kind = TokenKind::unknown;
    return out;
  }
  std::vector<std::string> merges() const override { return merge_list_; }
  bool sentencepiece() const override { return false; }
  std::string llama_pre_tokenizer() const override { return llama_pre_; }
  int32_t unk_id() const override { return unk_; }

  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }

 private:
  struct AddedToken {
    int32_t id;
    std::string content;
    bool special = false;
  };
  struct Token {
    std::string text;
    bool set = false;
    std::string bytes;  // what decoding it gives (spelled once at load)
  };

  [[noreturn]] void refuse(const std::string& what) const {
    throw Error(str("tokenizer '", where_, "': ", what,
                    " is not supported (byte-level BPE tokenizer.json files, as GPT-2, Qwen and "
                    "OLMoE ship, are; a SentencePiece model reads from its tokenizer.model)"));
  }

  // A token made only of byte-alphabet characters decodes to those bytes; any other (an added
  // token such as "<|im_end|>") to its own UTF-8.
  static std::string spelled_bytes(const std::string& t,
                                   const std::unordered_map<std::string, char>& byte_of_char) {
    std::string bytes;
    for (size_t k = 0; k < t.size();) {
      const size_t n = utf8_length(static_cast<unsigned char>(t[k]));
      auto it = byte_of_char.find(t.substr(k, n));
      if (it == byte_of_char.end()) return t;
      bytes += it->second;
      k += n;
    }
    return bytes;
  }

  void set_token(int32_t id, const std::string& text) {
    if (id < 0 || id > (1 << 30)) refuse(str("token id ", id));
    if (tokens_.size() <= static_cast<size_t>(id)) tokens_.resize(static_cast<size_t>(id) + 1);
    tokens_[static_cast<size_t>(id)] = {text, true, {}};
  }

  void load(const json& j) {
    const json& model = j.at("model");
    const std::string type = model.value("type", "BPE");
    if (type != "BPE") refuse(str("model type '", type, "'"));
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
      if (model.contains(key) && !model[key].is_null()) refuse(str("model.", key));
    ignore_merges_ = model.value("ignore_merges", false);
    for (const auto& [text, id] : model.at("vocab").items()) {
      vocab_[text] =
          json_get<int32_t>(id, str("tokenizer '", where_, "': model.vocab[\"", text, "\"]"));
      set_token(vocab_[text], text);
    }
    if (model.contains("unk_token") && !model["unk_token"].is_null()) {
      auto it = vocab_.find(model["unk_token"].get<std::string>());
      if (it != vocab_.end()) unk_ = it->second;
    }
    if (j.contains("added_tokens"))
      for (const json& t : j["added_tokens"]) {
        for (const char* key : {"lstrip", "rstrip", "single_word"})
          if (t.value(key, false)) refuse(str("an added token with ", key));
        const std::string place =
            str("tokenizer '", where_, "': added_tokens[", added_.size(), "]");
        added_.push_back({json_get<int32_t>(t.at("id"), place + ".id"),
                          json_get<std::string>(t.at("content"), place + ".content"),
                          t.value("special", false)});
        if (added_.back().content.empty()) refuse("an empty added token");
        starts_added_[static_cast<unsigned char>(added_.back().content[0])] = true;
        set_token(added_.back().id, added_.back().content);
      }
    std::stable_sort(added_.begin(), added_.end(), [](const AddedToken& x, const AddedToken& y) {
      return x.content.size() > y.content.size();
    });
    for (size_t i = 0; i < tokens_.size(); ++i)
      if (!tokens_[i].set) refuse(str("a vocabulary with no token of id ", i));
    load_merges(model);  // after the vocabulary's own checks: merges name its tokens
    load_normalizer(j.contains("normalizer") ? j["normalizer"] : json());
    load_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json());
    if (std::none_of(steps_.begin(), steps_.end(), [](const PreStep& s) { return s.byte_level; }))
      refuse("a pre-tokenizer without a ByteLevel step (the pieces would not be byte-level)");
    load_post_processor(j.contains("post_processor") ? j["post_processor"] : json());
    const json decoder = j.contains("decoder") ? j["decoder"] : json();
    if (!decoder.is_object() || decoder.value("type", "") != "ByteLevel")
      refuse(str("decoder ", decoder.is_object() ? decoder.value("type", "?") : "null"));
    // End of text: the conventional names of the families we read.
    for (const char* name : {"<|endoftext|>", "<|im_end|>", "</s>", "<|end_of_text|>"})
      for (const AddedToken& t : added_)
        if (eos_ < 0 && t.content == name) eos_ = t.id;
  }

  // model.merges: a list of "a b" strings (files of tokenizers before 0.20) or ["a", "b"] pairs,
  // whose two tokens and their concatenation are all in the vocabulary (what Hugging Face's
  // builder requires). Anything else is a damaged file, refused naming the entry: a merge list
  // read as empty (null) would tokenize every text into single bytes without a word.
  void load_merges(const json& model) {
    const auto bad = [&](const std::string& what) {
      throw Error(str("tokenizer '", where_, "': model.merges", what));
    };
    if (!model.contains("merges")) bad(" is missing (a BPE tokenizer needs its merge list)");
    const json& merges = model["merges"];
    if (!merges.is_array())
      bad(str(" is ", merges.type_name(), ", not a list of merges (\"a b\" or [\"a\", \"b\"])"));
    int rank = 0;
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
          bad(str(" entry ", i, " '", s, "' is not two tokens separated by one space"));
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        bad(str(" entry ", i, " is ", m.is_array() ? str("a list of ", m.size()) : m.type_name(),
                ", not a pair of tokens (\"a b\" or [\"a\", \"b\"])"));
      }
      const std::string merged = a + b;
      const std::string* const tokens[] = {&a, &b, &merged};
      for (const std::string* t : tokens)
        if (!vocab_.count(*t))
          bad(str(" entry ", i, " ('", a, "' + '", b, "'): ",
                  t == &merged ? "the merged token " : "", "'", *t, "' is not in model.vocab"));
      if (rank_.emplace(a + '\0' + b, rank).second)
        ++rank;  // a repeated merge keeps its first rank
      else
        continue;
      merge_list_.push_back(a + ' ' + b);
    }
  }

  void load_normalizer(const json& n) {
    if (n.is_null()) return;
    const std::string type = n.value("type", "?");
    if (type == "NFC") {
      nfc_ = true;
    } else if (type == "Sequence") {
      for (const json& step : n.at("normalizers")) load_normalizer(step);
    } else {
      refuse(str("normalizer '", type, "'"));
    }
  }

  void load_pre_tokenizer(const json& p) {
    const std::string type = p.is_null() ? "null" : p.value("type", "?");
    if (type == "Sequence") {
      for (const json& step : p.at("pretokenizers")) load_pre_tokenizer(step);
    } else if (type == "Split") {
      if (p.value("behavior", "") != "Isolated")
        refuse(str("Split behavior '", p.value("behavior", ""), "'"));
      if (p.value("invert", false)) refuse("an inverted Split");
      const json& pattern = p.at("pattern");
      const bool literal = pattern.contains("String");
      const std::string text = pattern.at(literal ? "String" : "Regex").get<std::string>();
      // llama.cpp names the pre-tokenizers it implements; ours runs any expression. A name holds
      // for a single expression only.
      llama_pre_ = literal || split_seen_  ? ""
                   : text == kQwen2Pattern ? "qwen2"
                   : text == kO200kPattern ? "gpt-4o"  // gpt-oss's, GPT-4o's
                                           : "";
      split_seen_ = true;
      steps_.push_back({std::make_shared<Regex>(text, literal, where_), false, false});
    } else if (type == "ByteLevel") {
      PreStep step{nullptr, true, p.value("add_prefix_space", false)};
      if (p.value("use_regex", true)) {
        step.split = std::make_shared<Regex>(kGpt2Pattern, false, where_);
        llama_pre_ = split_seen_ ? "" : "gpt-2";  // GPT-2's own expression: llama.cpp's gpt-2
        split_seen_ = true;
      }
      if (step.add_prefix_space) llama_pre_ = "";  // llama.cpp adds no space before the text
      steps_.push_back(step);
    } else {
      refuse(str("pre-tokenizer '", type, "'"));
    }
  }

  void load_post_processor(const json& p) {
    if (p.is_null()) return;
    const std::string type = p.value("type", "?");
    if (type == "ByteLevel") return;  // offsets only
    if (type == "Sequence") {
      for (const json& step : p.at("processors")) load_post_processor(step);
      return;
    }
    if (type != "TemplateProcessing") refuse(str("post-processor '", type, "'"));
    bool before = true;
    for (const json& item : p.at("single")) {
      if (item.contains("Sequence")) {
        before = false;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      for (int32_t id : p.at("special_tokens").at(name).at("ids"))
        (before ? prefix_ : suffix_).push_back(id);
      if (before && bos_ < 0) bos_ = prefix_.front();
    }
  }

  // NFC by ICU (the segment is valid UTF-8: checked by encode).
  std::string normalise(std::string_view s) const {
    if (!nfc_) return std::string(s);
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
    MOE_CHECK(U_SUCCESS(status), "tokenizer: ICU has no NFC normaliser (", u_errorName(status),
              ")");
    const icu::UnicodeString in =
        icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
    const icu::UnicodeString out = nfc->normalize(in, status);
    MOE_CHECK(U_SUCCESS(status), "tokenizer: NFC failed (", u_errorName(status), ")");
    std::string text;
    out.toUTF8String(text);
    return text;
  }

  void encode_segment(std::string_view segment, std::vector<int32_t>& ids) const {
    if (segment.empty()) return;
    std::vector<std::string> pieces{normalise(segment)}, next;
    for (const PreStep& step : steps_) {
      next.clear();
      for (std::string& piece : pieces) {
        if (step.add_prefix_space && piece.front() != ' ') piece.insert(piece.begin(), ' ');
        if (step.split)
          step.split->split_isolated(piece, next);
        else
          next.push_back(std::move(piece));
      }
      if (step.byte_level)
        for (std::string& piece : next) {
          std::string spelled;
          for (unsigned char c : piece) spelled += byte_level_char(c);
          piece = std::move(spelled);
        }
      pieces.swap(next);
    }
    for (const std::string& piece : pieces) merge(piece, ids);
  }

  // BPE on one piece (byte-alphabet characters). Text repeats its words, so each piece's ids are
  // remembered (HF tokenizers caches words too); the cache is emptied when it grows past a bound.
  void merge(const std::string& piece, std::vector<int32_t>& ids) const {
    if (auto hit = cache_.find(piece); hit != cache_.end()) {
      ids.insert(ids.end(), hit->second.begin(), hit->second.end());
      return;
    }
    const size_t first = ids.size();
    merge_uncached(piece, ids);
    if (cache_.size() >= kCacheEntries) cache_.clear();
    cache_.emplace(
        piece, std::vector<int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end()));
  }

  void merge_uncached(const std::string& piece, std::vector<int32_t>& ids) const {
    if (ignore_merges_) {
      auto whole = vocab_.find(piece);
      if (whole != vocab_.end()) {
        ids.push_back(whole->second);
        return;
      }
    }
    std::vector<std::string> symbols;
    for (size_t k = 0; k < piece.size();) {
      const size_t n = utf8_length(static_cast<unsigned char>(piece[k]));
      symbols.push_back(piece.substr(k, n));
      k += n;
    }
    while (symbols.size() > 1) {
      int best = -1;
      size_t at = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = rank_.find(symbols[i] + '\0' + symbols[i + 1]);
        if (it != rank_.end() && (best < 0 || it->second < best)) {
          best = it->second;
          at = i;
        }
      }
      if (best < 0) break;
      symbols[at] += symbols[at + 1];
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    for (const std::string& s : symbols) {
      auto it = vocab_.find(s);
      if (it != vocab_.end()) {
        ids.push_back(it->second);
      } else {
        MOE_CHECK(unk_ >= 0, "tokenizer '", where_, "': the piece '", s,
                  "' is not in the vocabulary and the tokenizer has no unknown token");
        ids.push_back(unk_);
      }
    }
  }

  static constexpr size_t kCacheEntries = 1 << 16;

  std::string where_;
  // Piece -> its ids (merge()); one tokenizer is used by one thread at a time, as its Regex is.
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<std::string, int> rank_;  // "a\0b" -> merge rank
  std::vector<Token> tokens_;                  // by id: vocabulary and added tokens
  std::vector<AddedToken> added_;              // longest content first
  std::array<bool, 256> starts_added_{};       // first bytes of the added tokens
  std::vector<PreStep> steps_;
  std::vector<int32_t> prefix_, suffix_;  // TemplateProcessing's tokens around a single text
  std::vector<std::string> merge_list_;   // "a b", by rank
  std::string llama_pre_;                 // llama_pre_tokenizer()
  bool split_seen_ = false;               // a pre-tokenizer step with an expression was loaded
  bool nfc_ = false, ignore_merges_ = false;
  int32_t unk_ = -1, bos_ = -1, eos_ = -1;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(std::string bytes, const std::string& where) {
  return std::make_unique<BpeTokenizer>(std::move(bytes), where);
}

}  // namespace moe::io::detail
