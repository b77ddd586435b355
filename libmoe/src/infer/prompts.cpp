// Prompt files (moe-infer generate): plain-text or JSON lines, see moe/infer/prompts.h.
#include "moe/infer/prompts.h"

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

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

}  // namespace

std::vector<Prompt> read_prompts(std::istream& in, const std::string& name,
                                 const SamplingConfig& defaults, int64_t vocab_size) {
  std::vector<Prompt> prompts;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // A blank line separates nothing and asks for nothing: skipped (line numbers still count it).
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    Prompt p;
    p.sampling = defaults;
    if (!line.empty() && line.front() == '{') {
      try {
        json j = json::parse(line);
        if (!j.is_object()) throw Error("not a JSON object");
        // A misspelt key ("max_tokens") would otherwise be ignored and its setting silently lost.
        for (const auto& [key, value] : j.items())
          if (key != "prompt" && key != "tokens" && key != "max_new" && key != "temperature" &&
              key != "top_k" && key != "top_p")
            throw Error(str("unknown key \"", key,
                            "\" (a prompt object takes \"prompt\" or \"tokens\", and \"max_new\", "
                            "\"temperature\", \"top_k\", \"top_p\")"));
        // Every field has the type and range of its flag (ids: integers in [0, vocabulary)).
        if (j.contains("tokens")) {
          const json& ids = j.at("tokens");
          if (!ids.is_array()) throw Error(str("\"tokens\" must be an array of token ids"));
          for (const json& id : ids)
            p.tokens.push_back(
                static_cast<int32_t>(integer_field(id, "tokens", 0, vocab_size - 1)));
        } else {
          p.text = j.at("prompt").get<std::string>();
          p.tokens = io::tokenize_bytes(p.text);
        }
        if (j.contains("max_new"))
          p.sampling.max_new = integer_field(j["max_new"], "max_new", 0, INT32_MAX);
        if (j.contains("temperature"))
          p.sampling.temperature = number_field(j["temperature"], "temperature", 0, 1e6);
        if (j.contains("top_k"))
          p.sampling.top_k = integer_field(j["top_k"], "top_k", 0, vocab_size);
        if (j.contains("top_p")) p.sampling.top_p = number_field(j["top_p"], "top_p", 0, 1, true);
      } catch (const json::exception& e) {
        throw Error(str(name, ":", number, ": not a valid prompt object: ", e.what()));
      } catch (const Error& e) {
        throw Error(str(name, ":", number, ": ", e.what()));
      }
    } else {
      if (vocab_size < io::kByteVocab)
        throw Error(str(name, ":", number,
                        ": a text prompt needs a byte-level model "
                        "(vocabulary >= 256); give {\"tokens\": [...]}"));
      p.text = line;
      p.tokens = io::tokenize_bytes(line);
    }
    if (p.tokens.empty()) throw Error(str(name, ":", number, ": empty prompt"));
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) throw Error(str("prompt file '", name, "' holds no prompt (one per line)"));
  return prompts;
}

}  // namespace moe::infer
