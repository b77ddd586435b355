#include "io/utf8.h"

#include <cstdint>

namespace moe::io {

size_t invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t n = 0;
    uint32_t least = 0;
    if ((c & 0xe0) == 0xc0) {
      n = 1;
      least = 0x80;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      least = 0x800;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      least = 0x10000;
    } else {
      return i;
    }
    if (i + n >= s.size()) return i;
    uint32_t code = c & (0x3fu >> n);
    for (size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xc0) != 0x80) return i;
      code = (code << 6) | (b & 0x3fu);
    }
    if (code < least || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return i;
    i += n + 1;
  }
  return std::string_view::npos;
}

}  // namespace moe::io
