// Prompt files (moe-infer generate): plain-text or JSON lines, see moe/infer/prompts.h.
#include "moe/infer/prompts.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "moe/error.h"
#include "moe/io/dataset.h"

namespace moe::infer {

namespace {

using nlohmann::json;

// A prompt object's field: a JSON integer in [lo, hi] (JSON gives no way to ask for one, and
// nlohmann would truncate -0.5 to 0, wrap 2^40 and convert 1e300 with undefined behaviour).
// Throws moe::Error naming `key`.
int64_t integer_field(const json& value, const std::string& key, int64_t lo, int64_t hi) {
  if (!value.is_number_integer())
    throw Error(str("\"", key, "\" must be an integer, got ", value.dump()));
  if (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX))
    throw Error(str("\"", key, "\" ", value.dump(), " is out of range [", lo, ", ", hi, "]"));
  const int64_t v = value.get<int64_t>();
  if (v < lo || v > hi)
    throw Error(str("\"", key, "\" ", v, " is out of range [", lo, ", ", hi, "]"));
  return v;
}

// A prompt object's number field, finite and in [lo, hi] (`open_low`: lo itself excluded).
double number_field(const json& value, const std::string& key, double lo, double hi,
                    bool open_low = false) {
  if (!value.is_number()) throw Error(str("\"", key, "\" must be a number, got ", value.dump()));
  const double v = value.get<double>();
  if (!std::isfinite(v) || v < lo || v > hi || (open_low && v == lo))
    throw Error(str("\"", key, "\" ", value.dump(), " is out of range ", open_low ? "(" : "[", lo,
                    ", ", hi, "]"));
  return v;
}

// "stop": a string or a list of non-empty strings; replaces the --stop defaults for this prompt
// (an empty list: no stop string).
std::vector<std::string> stop_field(const json& value) {
  std::vector<std::string> stops;
  if (value.is_string()) {
    stops.push_back(value.get<std::string>());
  } else if (value.is_array()) {
    for (const json& s : value) {
      if (!s.is_string())
        throw Error(str("\"stop\" must be a string or a list of strings, got ", value.dump()));
      stops.push_back(s.get<std::string>());
    }
  } else {
    throw Error(str("\"stop\" must be a string or a list of strings, got ", value.dump()));
  }
  for (const std::string& s : stops)
    if (s.empty()) throw Error("\"stop\" holds an empty string (it would end every generation)");
  return stops;
}

}  // namespace

std::vector<Prompt> read_prompts(std::istream& in, const std::string& name,
                                 const SamplingConfig& defaults, int64_t vocab_size,
                                 const io::Tokenizer* tokenizer) {
  // Text by the tokenizer (with its special tokens: a generation continues a whole text), else
  // byte by byte.
  auto encode = [tokenizer](const std::string& text) {
    return tokenizer ? tokenizer->encode(text, true) : io::tokenize_bytes(text);
  };
  // Ids the tokenizer cannot decode (a model vocabulary padded beyond it) are no prompt.
  const int64_t ids_end =
      tokenizer ? std::min<int64_t>(vocab_size, tokenizer->vocab_size()) : vocab_size;
  std::vector<Prompt> prompts;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // A blank line separates nothing and asks for nothing: skipped (line numbers still count it).
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    Prompt p;
    p.line = number;
    p.sampling = defaults;
    if (!line.empty() && line.front() == '{') {
      try {
        json j = parse_json(line, str(name, ":", number), true);
        if (!j.is_object()) throw Error("not a JSON object");
        // A misspelt key ("max_tokens") would otherwise be ignored and its setting silently lost.
        for (const auto& [key, value] : j.items())
          if (key != "prompt" && key != "tokens" && key != "max_new" && key != "temperature" &&
              key != "top_k" && key != "top_p" && key != "stop" && key != "repeat_penalty" &&
              key != "repeat_last_n")
            throw Error(str("unknown key \"", key,
                            "\" (a prompt object takes \"prompt\" or \"tokens\", and \"max_new\", "
                            "\"temperature\", \"top_k\", \"top_p\", \"stop\", "
                            "\"repeat_penalty\", \"repeat_last_n\")"));
        // Every field has the type and range of its flag (ids: integers in [0, vocabulary)).
        if (j.contains("tokens")) {
          const json& ids = j.at("tokens");
          if (!ids.is_array()) throw Error(str("\"tokens\" must be an array of token ids"));
          for (const json& id : ids)
            p.tokens.push_back(static_cast<int32_t>(integer_field(id, "tokens", 0, ids_end - 1)));
        } else {
          if (!j.contains("prompt") || !j.at("prompt").is_string())
            throw Error(str("\"prompt\" must be a string, got ",
                            j.contains("prompt") ? j.at("prompt").type_name() : "nothing"));
          p.text = j.at("prompt").get<std::string>();
          p.tokens = encode(p.text);
        }
        if (j.contains("max_new"))
          p.sampling.max_new = integer_field(j["max_new"], "max_new", 0, INT32_MAX);
        if (j.contains("temperature"))
          p.sampling.temperature = number_field(j["temperature"], "temperature", 0, 1e6);
        if (j.contains("top_k"))
          p.sampling.top_k = integer_field(j["top_k"], "top_k", 0, vocab_size);
        if (j.contains("top_p")) p.sampling.top_p = number_field(j["top_p"], "top_p", 0, 1, true);
        if (j.contains("repeat_penalty"))
          p.sampling.repeat_penalty =
              number_field(j["repeat_penalty"], "repeat_penalty", 0, 1e6, true);
        if (j.contains("repeat_last_n"))
          p.sampling.repeat_last_n =
              integer_field(j["repeat_last_n"], "repeat_last_n", -1, INT32_MAX);
        if (j.contains("stop")) p.sampling.stop = stop_field(j["stop"]);
      } catch (const json::exception& e) {
        throw Error(
            str(name, ":", number, ": not a valid prompt object: ", json_error_words(e, true)));
      } catch (const Error& e) {
        const std::string what = e.what();
        const std::string where = str(name, ":", number, ": ");
        throw Error(what.rfind(where, 0) == 0 ? what : where + what);
      }
    } else {
      if (!tokenizer && vocab_size < io::kByteVocab)
        throw Error(str(name, ":", number,
                        ": a text prompt needs a byte-level model "
                        "(vocabulary >= 256) or a tokenizer; give {\"tokens\": [...]}"));
      p.text = line;
      p.tokens = encode(line);
    }
    if (p.tokens.empty()) throw Error(str(name, ":", number, ": empty prompt"));
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) throw Error(str("prompt file '", name, "' holds no prompt (one per line)"));
  return prompts;
}

}  // namespace moe::infer
