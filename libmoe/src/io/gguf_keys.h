// Typed reading of a GGUF file's keys (GgufFile::metadata, as read_gguf keeps them) for the GGUF
// import (io/gguf_import.cpp, io/gguf_tokenizer.cpp). Every refusal names the file and the key:
// "'m.gguf': GGUF key 'llama.block_count' is missing". Private to libmoe.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "moe/error.h"
#include "moe/io/gguf.h"

namespace moe::io::gguf {

// GGUF value types (the numbers in a key's "type" / an array's "element_type").
enum : uint32_t { kBool = 7, kString = 8, kArray = 9, kF32 = 6, kF64 = 12 };
inline bool integer_type(uint32_t t) { return t <= 5 || t == 10 || t == 11; }
inline bool real_type(uint32_t t) { return t == kF32 || t == kF64; }

class Keys {
 public:
  explicit Keys(const GgufFile& file) : f_(file) {}

  const std::string& path() const { return f_.path; }
  bool has(const std::string& key) const { return f_.metadata.contains(key); }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(str("'", f_.path, "': GGUF key '", key, "' ", what));
  }

  int64_t integer(const std::string& key) const {
    const auto& e = entry(key);
    if (!integer_type(e["type"].get<uint32_t>()))
      fail(key, str("is ", kind(e), ", not an integer"));
    return to_int64(key, e["value"]);
  }
  int64_t integer_or(const std::string& key, int64_t fallback) const {
    return has(key) ? integer(key) : fallback;
  }
  // An integer in [lo, hi], checked before anything is sized by it.
  int64_t bounded(const std::string& key, int64_t lo, int64_t hi) const {
    const int64_t v = integer(key);
    if (v < lo || v > hi) fail(key, str("is ", v, ": it must be between ", lo, " and ", hi));
    return v;
  }
  double real(const std::string& key) const {
    const auto& e = entry(key);
    if (!real_type(e["type"].get<uint32_t>())) fail(key, str("is ", kind(e), ", not a number"));
    const double v = e["value"].get<double>();
    if (!std::isfinite(v)) fail(key, str("is ", v));
    return v;
  }
  double real_or(const std::string& key, double fallback) const {
    return has(key) ? real(key) : fallback;
  }
  bool flag_or(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    const auto& e = entry(key);
    if (e["type"].get<uint32_t>() != kBool) fail(key, str("is ", kind(e), ", not a bool"));
    return e["value"].get<bool>();
  }
  std::string text(const std::string& key) const {
    const auto& e = entry(key);
    if (e["type"].get<uint32_t>() != kString) fail(key, str("is ", kind(e), ", not a string"));
    return e["value"].get<std::string>();
  }
  std::string text_or(const std::string& key, const std::string& fallback) const {
    return has(key) ? text(key) : fallback;
  }
  std::vector<std::string> strings(const std::string& key) const {
    std::vector<std::string> out;
    for (const auto& v : array(key, "strings", [](uint32_t t) { return t == kString; }))
      out.push_back(v.get<std::string>());
    return out;
  }
  std::vector<int64_t> integers(const std::string& key) const {
    std::vector<int64_t> out;
    for (const auto& v : array(key, "integers", integer_type)) out.push_back(to_int64(key, v));
    return out;
  }
  std::vector<float> reals(const std::string& key) const {
    std::vector<float> out;
    for (const auto& v : array(key, "numbers", real_type)) out.push_back(v.get<float>());
    return out;
  }

 private:
  const nlohmann::ordered_json& entry(const std::string& key) const {
    if (!has(key)) fail(key, "is missing");
    return f_.metadata[key];
  }
  static std::string kind(const nlohmann::ordered_json& e) {
    const uint32_t t = e["type"].get<uint32_t>();
    if (t == kArray) return "an array";
    if (t == kString) return "a string";
    if (t == kBool) return "a bool";
    return real_type(t) ? "a float" : "an integer";
  }
  int64_t to_int64(const std::string& key, const nlohmann::ordered_json& v) const {
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(key, str("is ", v.get<uint64_t>(), ", beyond any count"));
    return v.get<int64_t>();
  }
  template <typename Accept>
  const nlohmann::ordered_json& array(const std::string& key, const char* what,
                                      Accept accept) const {
    const auto& e = entry(key);
    if (e["type"].get<uint32_t>() != kArray || !accept(e["element_type"].get<uint32_t>()))
      fail(key, str("is not an array of ", what));
    return e["value"];
  }

  const GgufFile& f_;
};

}  // namespace moe::io::gguf
