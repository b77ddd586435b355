// Prompt files (moe-infer generate): plain-text or JSON lines, see moe/infer/prompts.h.
#include "moe/infer/prompts.h"

#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "moe/io/dataset.h"

namespace moe::infer {

std::vector<Prompt> read_prompts(std::istream& in, const std::string& name,
                                 const SamplingConfig& defaults, int64_t vocab_size) {
  using nlohmann::json;
  std::vector<Prompt> prompts;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    Prompt p;
    p.sampling = defaults;
    if (!line.empty() && line.front() == '{') {
      try {
        json j = json::parse(line);
        if (j.contains("tokens")) {
          p.tokens = j.at("tokens").get<std::vector<int32_t>>();
        } else {
          p.text = j.at("prompt").get<std::string>();
          p.tokens = io::tokenize_bytes(p.text);
        }
        p.sampling.max_new = j.value("max_new", p.sampling.max_new);
        p.sampling.temperature = j.value("temperature", p.sampling.temperature);
        p.sampling.top_k = j.value("top_k", p.sampling.top_k);
        p.sampling.top_p = j.value("top_p", p.sampling.top_p);
      } catch (const json::exception& e) {
        throw Error(str(name, ":", number, ": not a valid prompt object: ", e.what()));
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
