// io/utf8.h: the UTF-8 byte rules the tokenizers and generate's incremental detokeniser share.
#include <catch2/catch.hpp>
#include <string>

#include "io/utf8.h"

using namespace moe;

TEST_CASE("utf8: character lengths from the lead byte", "[utf8]") {
  CHECK(io::utf8_length('a') == 1);
  CHECK(io::utf8_length(0xC3) == 2);  // é = C3 A9
  CHECK(io::utf8_length(0xE2) == 3);  // € = E2 82 AC
  CHECK(io::utf8_length(0xF0) == 4);  // 😀 = F0 9F 98 80
}

TEST_CASE("utf8: a text ends unfinished only inside a character", "[utf8]") {
  const std::string a = "a", euro = "\xE2\x82\xAC", smile = "\xF0\x9F\x98\x80";
  CHECK_FALSE(io::utf8_ends_unfinished(""));
  CHECK_FALSE(io::utf8_ends_unfinished("abc"));
  CHECK_FALSE(io::utf8_ends_unfinished(a + euro));
  CHECK_FALSE(io::utf8_ends_unfinished(a + smile));
  for (size_t cut = 1; cut < euro.size(); ++cut)
    CHECK(io::utf8_ends_unfinished(a + euro.substr(0, cut)));
  for (size_t cut = 1; cut < smile.size(); ++cut)
    CHECK(io::utf8_ends_unfinished(smile + smile.substr(0, cut)));
}

TEST_CASE("utf8: the first invalid sequence is found by offset", "[utf8]") {
  CHECK(io::invalid_utf8(std::string("plain \xE2\x82\xAC")) == std::string_view::npos);
  CHECK(io::invalid_utf8("ab\x80") == 2);             // a continuation byte without a lead
  CHECK(io::invalid_utf8("ab\xC0\xAF") == 2);         // overlong '/'
  CHECK(io::invalid_utf8("a\xED\xA0\x80") == 1);      // a surrogate
  CHECK(io::invalid_utf8("a\xE2\x82") == 1);          // truncated at the end
  CHECK(io::invalid_utf8("a\xF4\x90\x80\x80") == 1);  // past U+10FFFF
}
