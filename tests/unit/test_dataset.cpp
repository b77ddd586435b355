// Token datasets: text / u16 / u32 token files, their errors, the byte-level tokenizer, the
// window sampler (determinism, epoch coverage, exact resume) and the validation tail split.
// Shape letters: B batch, T sequence length.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "moe/io/dataset.h"
#include "support/run.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<int32_t> iota_tokens(int32_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), 0);
  return t;
}

// The windows (by start token / seq) that `batches` calls of next(batch) serve.
std::vector<int64_t> stream(io::BatchSampler& sampler, int batches, int64_t batch) {
  std::vector<int64_t> windows;
  Tensor x, y;
  for (int i = 0; i < batches; ++i) {
    sampler.next(batch, x, y);
    REQUIRE(x.shape() == Shape{batch, sampler.seq()});
    REQUIRE(y.shape() == Shape{batch, sampler.seq()});
    REQUIRE(x.dtype() == DType::i32);
    const int32_t* xs = x.data<int32_t>();
    const int32_t* ys = y.data<int32_t>();
    for (int64_t b = 0; b < batch; ++b) {
      REQUIRE(xs[b * sampler.seq()] % sampler.seq() == 0);
      for (int64_t t = 0; t < sampler.seq(); ++t) {
        // iota data: inputs are consecutive and targets are the inputs shifted by one.
        REQUIRE(xs[b * sampler.seq() + t] == xs[b * sampler.seq()] + t);
        REQUIRE(ys[b * sampler.seq() + t] == xs[b * sampler.seq() + t] + 1);
      }
      windows.push_back(xs[b * sampler.seq()] / sampler.seq());
    }
  }
  return windows;
}

}  // namespace

TEST_CASE("io: token files round trip as text, u16 and u32", "[io]") {
  test::ScratchDir dir("io-data-formats");
  REQUIRE(io::parse_token_format("auto") == io::TokenFormat::automatic);
  REQUIRE(io::parse_token_format("text") == io::TokenFormat::text);
  REQUIRE(io::parse_token_format("u16") == io::TokenFormat::u16);
  REQUIRE(io::parse_token_format("u32") == io::TokenFormat::u32);
  REQUIRE_THROWS_AS(io::parse_token_format("u8"), UsageError);

  // Text: every byte is a token, including 0, newline and bytes >= 128.
  std::string text = "hello, w\xc3\xb6rld\n";
  for (int b = 0; b < 256; ++b) text += static_cast<char>(b);
  std::vector<unsigned char> text_bytes(text.begin(), text.end());
  write_bytes(dir.file("corpus.txt"), text_bytes);
  std::vector<int32_t> tokens = io::load_tokens(dir.file("corpus.txt"));
  REQUIRE(tokens.size() == text.size());
  REQUIRE(tokens[0] == 'h');
  REQUIRE(tokens[9] == 0xb6);
  REQUIRE(tokens == io::tokenize_bytes(text));
  REQUIRE(io::detokenize_bytes(tokens) == text);
  REQUIRE_THROWS_WITH(io::detokenize_bytes({65, 300}), Catch::Contains("token 1 is 300"));

  // u16: little-endian, chosen by extension or by an explicit format.
  write_bytes(dir.file("ids.u16"), {0x01, 0x02, 0xff, 0xff, 0x00, 0x80, 0x07, 0x00});
  REQUIRE(io::load_tokens(dir.file("ids.u16")) == std::vector<int32_t>{0x0201, 65535, 0x8000, 7});
  write_bytes(dir.file("ids.bin"), {0x01, 0x02, 0xff, 0xff});
  REQUIRE(io::load_tokens(dir.file("ids.bin"), io::TokenFormat::u16) ==
          std::vector<int32_t>{0x0201, 65535});
  REQUIRE(io::load_tokens(dir.file("ids.bin")).size() == 4);  // auto: not .u16 -> text bytes

  // u32: little-endian; ids above INT32_MAX do not fit an int32 token.
  write_bytes(dir.file("ids.u32"), {0x78, 0x56, 0x34, 0x12, 0xff, 0xff, 0xff, 0x7f});
  REQUIRE(io::load_tokens(dir.file("ids.u32")) == std::vector<int32_t>{0x12345678, 2147483647});
  write_bytes(dir.file("big.u32"), {0x00, 0x00, 0x00, 0x80});
  REQUIRE_THROWS_WITH(io::load_tokens(dir.file("big.u32")), Catch::Contains("above the largest"));

  // save_tokens writes what load_tokens reads, in each format.
  std::vector<int32_t> ids = {0, 1, 255, 256, 65535, 70000, 123456789};
  io::save_tokens(dir.file("out.u32"), ids);
  REQUIRE(fs::file_size(dir.file("out.u32")) == ids.size() * 4);
  REQUIRE(io::load_tokens(dir.file("out.u32")) == ids);
  std::vector<int32_t> small(ids.begin(), ids.begin() + 5);
  io::save_tokens(dir.file("out.u16"), small);
  REQUIRE(fs::file_size(dir.file("out.u16")) == small.size() * 2);
  REQUIRE(io::load_tokens(dir.file("out.u16")) == small);
  io::save_tokens(dir.file("out.txt"), tokens);
  REQUIRE(io::load_tokens(dir.file("out.txt")) == tokens);
  REQUIRE_THROWS_WITH(io::save_tokens(dir.file("bad.u16"), ids), Catch::Contains("70000"));
}

TEST_CASE("io: bad token files give errors naming the path and the cause", "[io]") {
  test::ScratchDir dir("io-data-badtokens");
  write_bytes(dir.file("odd.u16"), {1, 2, 3});
  std::string msg = test::error_of([&] { io::load_tokens(dir.file("odd.u16")); });
  REQUIRE_THAT(msg, Catch::Contains(dir.file("odd.u16")) && Catch::Contains("odd length 3"));

  write_bytes(dir.file("short.u32"), {1, 2, 3, 4, 5, 6});
  msg = test::error_of([&] { io::load_tokens(dir.file("short.u32")); });
  REQUIRE_THAT(msg, Catch::Contains(dir.file("short.u32")) && Catch::Contains("multiple of 4"));

  for (const char* name : {"empty.txt", "empty.u16", "empty.u32"}) {
    write_bytes(dir.file(name), {});
    msg = test::error_of([&] { io::load_tokens(dir.file(name)); });
    REQUIRE_THAT(msg, Catch::Contains(dir.file(name)) && Catch::Contains("empty"));
  }
  msg = test::error_of([&] { io::load_tokens(dir.file("missing.txt")); });
  REQUIRE_THAT(msg, Catch::Contains(dir.file("missing.txt")) &&
                        Catch::Contains("No such file or directory"));
  msg = test::error_of([&] { io::load_tokens(dir.path()); });
  REQUIRE_THAT(msg, Catch::Contains("is a directory"));
}

TEST_CASE("io: sampler order is a deterministic function of the seed", "[io]") {
  std::vector<int32_t> tokens = iota_tokens(1000);
  const int64_t seq = 16;  // 62 windows
  io::BatchSampler a(&tokens, seq, 42), b(&tokens, seq, 42), c(&tokens, seq, 43);
  REQUIRE(a.num_windows() == 62);
  std::vector<int64_t> sa = stream(a, 20, 4), sb = stream(b, 20, 4), sc = stream(c, 20, 4);
  REQUIRE(sa == sb);
  REQUIRE(sa != sc);
  // Shuffled: not file order. Unshuffled: file order, epoch after epoch.
  std::vector<int64_t> in_order(62);
  std::iota(in_order.begin(), in_order.end(), 0);
  REQUIRE(std::vector<int64_t>(sa.begin(), sa.begin() + 62) != in_order);
  io::BatchSampler plain(&tokens, seq, 42, false);
  std::vector<int64_t> sp = stream(plain, 31, 4);
  REQUIRE(std::vector<int64_t>(sp.begin(), sp.begin() + 62) == in_order);
  REQUIRE(std::vector<int64_t>(sp.begin() + 62, sp.end()) == in_order);
}

TEST_CASE("io: sampler visits every window once per epoch", "[io]") {
  std::vector<int32_t> tokens = iota_tokens(1000);
  io::BatchSampler sampler(&tokens, 16, 7);
  const int64_t W = sampler.num_windows();
  REQUIRE(W == 62);
  // Batches of 5 do not divide 62: epochs are crossed inside a batch.
  std::vector<int64_t> s = stream(sampler, 25, 5);  // 125 windows: two epochs and one more
  REQUIRE(sampler.cursor() == 125);
  REQUIRE(sampler.epoch() == 2);
  std::vector<int64_t> e0(s.begin(), s.begin() + W), e1(s.begin() + W, s.begin() + 2 * W);
  REQUIRE(e0 != e1);  // each epoch has its own order
  for (auto* epoch : {&e0, &e1}) {
    std::vector<int64_t> sorted = *epoch;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t w = 0; w < W; ++w) REQUIRE(sorted[w] == w);
  }
  // The last window ends exactly on the last usable token.
  io::BatchSampler exact(&tokens, 999, 1);
  REQUIRE(exact.num_windows() == 1);
  REQUIRE_THROWS_WITH(io::BatchSampler(&tokens, 1000, 1),
                      Catch::Contains("1000 tokens") && Catch::Contains("needs 1001"));
  // Named by the data file when the caller gives it (issue 45, item 11).
  REQUIRE_THROWS_WITH(io::BatchSampler(&tokens, 1000, 1, true, "tiny.txt"),
                      Catch::StartsWith("the data 'tiny.txt' holds 1000 tokens, too few"));
}

TEST_CASE("io: sampler set_cursor resumes the exact stream", "[io]") {
  std::vector<int32_t> tokens = iota_tokens(161);
  const int64_t seq = 16;  // 10 windows
  io::BatchSampler first(&tokens, seq, 99);
  REQUIRE(first.num_windows() == 10);
  std::vector<int64_t> whole = stream(first, 9, 3);  // 27 windows, into the third epoch
  for (int64_t resume : {0, 6, 9, 10, 21}) {
    io::BatchSampler again(&tokens, seq, 99);
    again.set_cursor(resume);
    REQUIRE(again.cursor() == resume);
    REQUIRE(again.epoch() == resume / 10);
    std::vector<int64_t> rest = stream(again, 2, 3);
    REQUIRE(rest == std::vector<int64_t>(whole.begin() + resume, whole.begin() + resume + 6));
  }
  // Going back within the same sampler too.
  first.set_cursor(4);
  REQUIRE(stream(first, 1, 3) == std::vector<int64_t>(whole.begin() + 4, whole.begin() + 7));
  REQUIRE_THROWS_AS(first.set_cursor(-1), Error);
}

TEST_CASE("io: split_tail keeps both parts at least seq+1 tokens", "[io]") {
  auto check = [](int32_t n, double fraction, int64_t seq, size_t train, size_t val) {
    std::vector<int32_t> tokens = iota_tokens(n);
    auto [t, v] = io::split_tail(tokens, fraction, seq);
    INFO("n " << n << " fraction " << fraction << " seq " << seq);
    REQUIRE(t.size() == train);
    REQUIRE(v.size() == val);
    std::vector<int32_t> joined = t;
    joined.insert(joined.end(), v.begin(), v.end());
    REQUIRE(joined == tokens);  // validation is the tail, in order
  };
  check(1000, 0.1, 16, 900, 100);
  check(1000, 0.1234, 16, 877, 123);  // rounded to nearest
  check(1000, 0.0123, 16, 983, 17);   // raised to seq+1
  check(40, 0.9, 16, 17, 23);         // lowered so training keeps seq+1
  check(34, 0.5, 16, 17, 17);         // the smallest data that splits
  REQUIRE_THROWS_WITH(io::split_tail(iota_tokens(33), 0.5, 16),
                      Catch::Contains("33 tokens") && Catch::Contains("need 34"));
  REQUIRE_THROWS_WITH(io::split_tail(iota_tokens(33), 0.5, 16, "tiny.txt"),
                      Catch::StartsWith("the data 'tiny.txt' holds 33 tokens, too few"));
  REQUIRE_THROWS_AS(io::split_tail(iota_tokens(100), 0.0, 16), UsageError);
  REQUIRE_THROWS_AS(io::split_tail(iota_tokens(100), 1.0, 16), UsageError);
}
