// Reading lm-evaluation-harness requests: JSON lines of text, tokenized as the harness does.
#include <nlohmann/json.hpp>

#include "core/json_text.h"
#include "moe/error.h"
#include "moe/infer/loglikelihood.h"
#include "moe/io/dataset.h"

namespace moe::infer {

namespace {

using nlohmann::json;

std::vector<int32_t> encode(std::string_view text, const io::Tokenizer* tokenizer) {
  return tokenizer ? tokenizer->encode(text, false) : io::tokenize_bytes(text);
}

// The token a request with no context starts from: the harness's prefix_token_id (BOS when the
// tokenizer has one, else its end-of-text token); -1: none.
int32_t prefix_token(const io::Tokenizer* tokenizer) {
  if (!tokenizer) return -1;
  return tokenizer->bos_id() >= 0 ? tokenizer->bos_id() : tokenizer->eos_id();
}

const std::string& string_field(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end()) throw Error(str("no \"", key, "\" field"));
  if (!it->is_string()) throw Error(str("\"", key, "\" must be a string, got ", it->dump()));
  return it->get_ref<const std::string&>();
}

// A rolling request: the text, scored from the prefix token when the model has one.
LoglikelihoodRequest encode_text(const std::string& text, const io::Tokenizer* tokenizer) {
  LoglikelihoodRequest r;
  if (prefix_token(tokenizer) >= 0) r.context = {prefix_token(tokenizer)};
  r.continuation = encode(text, tokenizer);
  if (r.continuation.empty()) throw Error("the text is empty (nothing to score)");
  if (r.context.empty() && r.continuation.size() < 2)
    throw Error(
        "the text is one token and the model has no BOS or end-of-text token to predict "
        "it from");
  return r;
}

// The checks of one request against the model; `where` is FILE:LINE.
void check_request(const LoglikelihoodRequest& r, bool rolling, int64_t vocab, int64_t seq,
                   const std::string& where) {
  std::vector<int32_t> all = r.context;
  all.insert(all.end(), r.continuation.begin(), r.continuation.end());
  io::check_tokens_fit(all, vocab, where);
  const auto n = static_cast<int64_t>(r.continuation.size());
  if (!rolling && n > seq)
    throw UsageError(str(where, ": the continuation has ", n,
                         " tokens, more than the model's context of ", seq,
                         ": it cannot be scored whole (only the context is cut to fit)"));
}

}  // namespace

LoglikelihoodRequest encode_request(const std::string& context, const std::string& continuation,
                                    const io::Tokenizer* tokenizer, const std::string& where) {
  // Trailing whitespace of the context belongs to the continuation (" Paris" after "is").
  const size_t kept = context.find_last_not_of(" \t\n\r\f\v");
  const size_t cut = kept == std::string::npos ? 0 : kept + 1;
  const std::string head = context.substr(0, cut), tail = context.substr(cut) + continuation;
  LoglikelihoodRequest r;
  if (head.empty()) {
    if (prefix_token(tokenizer) < 0)
      throw Error(str(where, ": the context is empty and the model has no BOS or end-of-text ",
                      "token to start from (lm-evaluation-harness's context for an empty one)"));
    r.context = {prefix_token(tokenizer)};
    r.continuation = encode(tail, tokenizer);
  } else {
    r.context = encode(head, tokenizer);
    const std::vector<int32_t> whole = encode(head + tail, tokenizer);
    if (whole.size() > r.context.size())
      r.continuation.assign(whole.begin() + static_cast<std::ptrdiff_t>(r.context.size()),
                            whole.end());
  }
  if (r.continuation.empty())
    throw Error(str(where, ": the continuation is empty", continuation.empty() ? "" : " in tokens",
                    " (nothing to score)"));
  return r;
}

std::vector<LoglikelihoodRequest> read_loglikelihood_requests(std::istream& in,
                                                              const std::string& name, bool rolling,
                                                              const io::Tokenizer* tokenizer,
                                                              int64_t vocab, int64_t seq) {
  std::vector<LoglikelihoodRequest> requests;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = str(name, ":", number);
    LoglikelihoodRequest r;
    try {
      const json j = parse_json(line, where, true);
      if (!j.is_object()) throw Error("not a JSON object");
      r = rolling ? encode_text(string_field(j, "text"), tokenizer)
                  : encode_request(string_field(j, "context"), string_field(j, "continuation"),
                                   tokenizer, where);
    } catch (const json::exception& e) {
      throw Error(str(where, ": ", json_error_words(e, true)));
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      const std::string what = e.what();
      throw Error(what.rfind(where, 0) == 0 ? what : str(where, ": ", what));
    }
    r.line = number;
    check_request(r, rolling, vocab, seq, where);
    requests.push_back(std::move(r));
  }
  if (in.bad()) throw Error(str("request file '", name, "': read failed"));
  if (requests.empty())
    throw Error(str("request file '", name, "' holds no request (one JSON object per line)"));
  return requests;
}

}  // namespace moe::infer
