// UTF-8 byte rules shared by the tokenizers (io/) and incremental detokenisation (infer/).
#pragma once
#include <cstddef>
#include <string_view>

namespace moe::io {

// Length in bytes of the UTF-8 character whose lead byte is `lead` (1 for ASCII; a continuation
// byte or an invalid lead counts as 4, the longest, so that callers never read past a valid end).
inline size_t utf8_length(unsigned char lead) {
  return lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xe ? 3 : 4;
}

inline bool utf8_continuation(unsigned char c) { return (c & 0xc0) == 0x80; }

// Whether `s` ends inside a character: its last lead byte announces more bytes than follow it.
inline bool utf8_ends_unfinished(std::string_view s) {
  for (size_t back = 1; back <= 4 && back <= s.size(); ++back) {
    const auto c = static_cast<unsigned char>(s[s.size() - back]);
    if (utf8_continuation(c)) continue;  // look further back for the lead byte
    return utf8_length(c) > back;
  }
  return false;
}

// Byte offset of the first invalid UTF-8 sequence of `s` (a bad lead or continuation byte, a
// truncated, overlong or surrogate sequence, a code point past U+10FFFF), or npos.
size_t invalid_utf8(std::string_view s);

}  // namespace moe::io
