// JSON from users' files, refused in our words. nlohmann's messages name its own exception classes
// and C++ types ("[json.exception.parse_error.101] parse error at line 1, column 17: syntax error
// while parsing object key - ..."); every reader that catches one says it this way instead.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "moe/error.h"

namespace moe {

// The words of a nlohmann exception, without its tag:
//   a syntax error:  "invalid JSON at line L, column C: unexpected '}'; expected string literal"
//                    ("invalid JSON at column C: ..." when `one_line`: a line of a JSON-lines
//                    file, whose caller names the line)
//   a type error:    "must be a string, got null" (the caller puts the key before it)
//   a missing key:   "\"prompt\" is missing"
std::string json_error_words(const nlohmann::json::exception& e, bool one_line = false);

// json::parse of `text`, a syntax error thrown as moe::Error "<where>: <json_error_words>".
// `where` is "FILE:LINE" for a line of a JSON-lines file (`one_line`), "FILE" for a whole file.
nlohmann::json parse_json(const std::string& text, const std::string& where, bool one_line = false);

// Where `value` holds a type that `reference` does not, in words: "\"layers\" must be an integer,
// got null", "\"experts_per_layer[1]\" must be an integer, got 2.5"; empty when the types agree.
// `reference` is what our writer writes for a default value (with one entry in each list, so
// list elements are checked too): a reader that converts a document with get<T>() checks it
// against the reference first, so a value of the wrong type names its key path. Only keys both
// hold are compared (a missing key is the reader's to name); a null in the reference takes
// anything; an integer must be an integer (get<int64_t>() would truncate 2.5).
std::string json_type_mismatch(const nlohmann::json& value, const nlohmann::json& reference);

// value.get<T>(), a type error thrown as moe::Error "<place> must be a number, got null" (`place`
// names the value: "tokenizer 'tok.json': model.vocab[\"a\"]").
template <class T>
T json_get(const nlohmann::json& value, const std::string& place) {
  try {
    return value.get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(str(place, " ", json_error_words(e)));
  }
}

}  // namespace moe
