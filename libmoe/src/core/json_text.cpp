// nlohmann's exception texts in our words (see core/json_text.h).
#include "core/json_text.h"

#include <regex>

#include "moe/error.h"

namespace moe {

namespace {

std::string with_article(const std::string& type) {
  if (type == "null") return "null";
  const bool vowel = !type.empty() && std::string("aeiou").find(type[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + type;
}

// "parse error at line 1, column 17: syntax error while parsing object key - unexpected '}';
// expected string literal" -> "invalid JSON at column 17: unexpected '}'; expected string literal"
std::string syntax_words(const std::string& text, bool one_line) {
  static const std::regex at(R"(^parse error at line ([0-9]+), column ([0-9]+): (.*)$)");
  static const std::regex parsing(R"(^syntax error while parsing [^-]+ - (.*)$)");
  std::smatch m;
  if (!std::regex_match(text, m, at)) return "invalid JSON: " + text;
  std::string what = m[3];
  std::smatch p;
  if (std::regex_match(what, p, parsing)) what = p[1];
  const std::string place =
      one_line ? str("column ", m[2].str()) : str("line ", m[1].str(), ", column ", m[2].str());
  return str("invalid JSON at ", place, ": ", what);
}

// The type a reference value asks for, as a reader would name it.
std::string expected_words(const nlohmann::json& reference) {
  if (reference.is_number_integer()) return "an integer";
  if (reference.is_number()) return "a number";
  return with_article(reference.type_name());
}

bool type_agrees(const nlohmann::json& value, const nlohmann::json& reference) {
  if (reference.is_null()) return true;
  if (reference.is_number_integer()) return value.is_number_integer();
  if (reference.is_number()) return value.is_number();
  return value.type() == reference.type();
}

// The first disagreement under `path` ("layers", "cost.bandwidth_bytes_per_s[0]"), or "".
std::string mismatch_at(const nlohmann::json& value, const nlohmann::json& reference,
                        const std::string& path) {
  if (!type_agrees(value, reference)) {
    const std::string got =
        value.is_number() ? value.dump() : with_article(std::string(value.type_name()));
    return str("\"", path, "\" must be ", expected_words(reference), ", got ", got);
  }
  if (reference.is_object()) {
    for (const auto& [key, expected] : reference.items()) {
      const auto found = value.find(key);
      if (found == value.end()) continue;
      const std::string wrong =
          mismatch_at(*found, expected, path.empty() ? key : str(path, ".", key));
      if (!wrong.empty()) return wrong;
    }
  } else if (reference.is_array() && !reference.empty()) {
    for (size_t i = 0; i < value.size(); ++i) {
      const std::string wrong = mismatch_at(value[i], reference[0], str(path, "[", i, "]"));
      if (!wrong.empty()) return wrong;
    }
  }
  return "";
}

}  // namespace

std::string json_type_mismatch(const nlohmann::json& value, const nlohmann::json& reference) {
  if (!type_agrees(value, reference))  // the document itself: no key to name
    return str("must be ", expected_words(reference), ", got ",
               with_article(std::string(value.type_name())));
  return mismatch_at(value, reference, "");
}

std::string json_error_words(const nlohmann::json::exception& e, bool one_line) {
  static const std::regex tag(R"(^\[json\.exception\.[a-z_]+\.[0-9]+\] )");
  const std::string text = std::regex_replace(std::string(e.what()), tag, "");
  std::smatch m;
  if (dynamic_cast<const nlohmann::json::parse_error*>(&e) != nullptr)
    return syntax_words(text, one_line);
  static const std::regex type(R"(^type must be ([a-z ]+), but is ([a-z]+)$)");
  if (std::regex_match(text, m, type))
    return str("must be ", with_article(m[1]), ", got ", with_article(m[2]));
  static const std::regex missing(R"(^key '(.*)' not found$)");
  if (std::regex_match(text, m, missing)) return str("\"", m[1].str(), "\" is missing");
  // "cannot use operator[] with a string argument with array", "cannot use at() with number":
  // a key or an index was looked up in a value of another type.
  static const std::regex use(R"(^cannot use .* with ([a-z]+)$)");
  if (std::regex_match(text, m, use))
    return str("expected an object or an array, got ", with_article(m[1]));
  if (text.rfind("number overflow", 0) == 0) return "invalid JSON: " + text;
  return text;
}

nlohmann::json parse_json(const std::string& text, const std::string& where, bool one_line) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(where, ": ", json_error_words(e, one_line)));
  }
}

}  // namespace moe
