// safetensors reader/writer: bitwise round trips (f32, bf16, f16, i32, a scalar, an empty tensor,
// metadata), a file built byte by byte in the test (offsets relative to the data section, header
// order differing from data order, trailing header spaces), atomic writes, and a clear error
// naming the file and the cause for each kind of malformed file.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "moe/io/safetensors.h"
#include "support/gradcheck.h"
#include "support/run.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

// The 8-byte little-endian length, then the header text, then the data bytes.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string with_length(std::string file, uint64_t length) {
  for (int i = 0; i < 8; ++i)
    file[static_cast<size_t>(i)] = static_cast<char>((length >> (8 * i)) & 0xff);
  return file;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

Tensor half_tensor(Shape shape, uint64_t seed, DType dtype) {
  Tensor t = test::random_tensor(std::move(shape), seed).to(dtype);
  uint16_t* bits = t.half_bits();  // NaN payload, -0, a subnormal, -infinity: kept bit for bit
  bits[0] = dtype == DType::bf16 ? 0x7fc1 : 0x7e01;
  bits[1] = 0x8000;
  bits[2] = 0x0001;
  bits[3] = dtype == DType::bf16 ? 0xff80 : 0xfc00;
  return t;
}

size_t count_temp_files(const std::string& dir) {
  size_t n = 0;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp-") != std::string::npos) ++n;
  return n;
}

std::string error_reading(const std::string& path) {
  return test::error_of([&] { io::SafetensorsReader reader(path); });
}

}  // namespace

TEST_CASE("safetensors: writer output re-read by the reader, bitwise", "[safetensors]") {
  test::ScratchDir dir("safetensors-roundtrip");
  const std::string path = dir.file("model.safetensors");
  std::vector<io::NamedTensor> tensors = {
      {"a.f32", test::random_tensor({3, 5}, 1), false, {}},
      {"b.bf16", half_tensor({2, 3, 4}, 2, DType::bf16), false, {}},
      {"c.f16", half_tensor({7}, 3, DType::f16), false, {}},
      {"d.i32", test::random_ids({4}, 4, 1000), false, {}},
      {"scalar", test::random_tensor({}, 5), false, {}},
      {"empty", Tensor::empty({0, 3}), false, {}},
      {"z.last", test::random_tensor({1, 3}, 6), false, {}},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"city", "m\xc3\xbcnchen"}};
  io::write_safetensors(path, tensors, metadata);
  REQUIRE(count_temp_files(dir.path()) == 0);

  io::SafetensorsReader reader(path);
  REQUIRE(reader.metadata() == metadata);
  REQUIRE(reader.tensors().size() == tensors.size());
  const char* names[] = {"F32", "BF16", "F16", "I32", "F32", "F32", "F32"};
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const io::SafetensorsEntry& e = reader.tensors()[i];
    INFO("tensor " << tensors[i].name);
    REQUIRE(e.name == tensors[i].name);  // data order is the order given
    REQUIRE(e.dtype == names[i]);
    REQUIRE(e.shape == tensors[i].tensor.shape());
    REQUIRE(e.begin == offset);
    offset += tensors[i].tensor.nbytes();
    REQUIRE(e.end == offset);
    REQUIRE(same_bytes(reader.read(e.name), tensors[i].tensor));
  }
  REQUIRE(reader.find("nope") == nullptr);
  REQUIRE_THAT(test::error_of([&] { reader.read("nope"); }), Catch::Contains("no tensor 'nope'"));

  // The layout on disk: 8-byte length, a JSON object padded so the data starts 8-byte aligned,
  // then exactly the tensors' bytes.
  const std::string bytes = test::read_file(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  REQUIRE((8 + n) % 8 == 0);
  REQUIRE(bytes[8] == '{');
  REQUIRE(bytes.size() == 8 + n + offset);
  REQUIRE(std::memcmp(bytes.data() + 8 + n, tensors[0].tensor.raw(), tensors[0].tensor.nbytes()) ==
          0);

  // Overwriting replaces the file whole; no metadata means no __metadata__ entry.
  io::write_safetensors(path, {{"only", test::random_tensor({2}, 9), false, {}}});
  io::SafetensorsReader again(path);
  REQUIRE(again.tensors().size() == 1);
  REQUIRE(again.metadata().empty());
  REQUIRE(test::read_file(path).find("__metadata__") == std::string::npos);
  REQUIRE(count_temp_files(dir.path()) == 0);
}

TEST_CASE("safetensors: reads a file built byte by byte", "[safetensors]") {
  test::ScratchDir dir("safetensors-handmade");
  // Header order differs from data order; offsets count from the end of the header; the header
  // carries trailing spaces; data is one BF16 [2,2] then one F32 [2].
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                             R"("__metadata__":{"k":"v"},)"
                             R"("v":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}}   )";
  const uint16_t v_bits[4] = {0x3f80, 0xc000, 0x0000, 0x7f80};  // 1, -2, 0, +inf
  const float w_values[2] = {0.25f, -3.5f};
  std::string data(16, '\0');
  std::memcpy(data.data(), v_bits, 8);
  std::memcpy(data.data() + 8, w_values, 8);
  const std::string path = dir.file("hand.safetensors");
  test::write_file(path, raw_file(header, data));

  io::SafetensorsReader reader(path);
  REQUIRE(reader.tensors().size() == 2);
  REQUIRE(reader.tensors()[0].name == "v");
  REQUIRE(reader.tensors()[1].name == "w");
  REQUIRE(reader.metadata().at("k") == "v");
  Tensor v = reader.read("v");
  REQUIRE(v.dtype() == DType::bf16);
  REQUIRE(v.shape() == Shape{2, 2});
  REQUIRE(std::memcmp(v.half_bits(), v_bits, 8) == 0);
  REQUIRE(v.to_vector()[1] == -2.0f);
  Tensor w = reader.read("w");
  REQUIRE(w.to_vector() == std::vector<float>{0.25f, -3.5f});

  // A dtype we list but cannot hold is refused when read, naming it.
  const std::string f64_path = dir.file("f64.safetensors");
  test::write_file(f64_path, raw_file(R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})",
                                      std::string(8, '\0')));
  io::SafetensorsReader f64(f64_path);
  REQUIRE(f64.tensors()[0].dtype == "F64");
  REQUIRE_THAT(test::error_of([&] { f64.read("d"); }), Catch::Contains("dtype F64"));
}

TEST_CASE("safetensors: malformed files are rejected with a clear error", "[safetensors]") {
  test::ScratchDir dir("safetensors-malformed");
  auto entry = [](const std::string& name, const std::string& dtype, const std::string& shape,
                  uint64_t begin, uint64_t end) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
           ",\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
  };
  struct Case {
    const char* label;
    std::string bytes;
    std::string expected;
  };
  const std::string good_header = "{" + entry("a", "F32", "[2]", 0, 8) + "}";
  std::vector<Case> cases = {
      {"truncated header length", std::string(5, '\x10'), "truncated file: 5 bytes"},
      {"header length beyond the file",
       with_length(raw_file(good_header, std::string(8, 'x')), 1000),
       "header length 1000 runs beyond the end of the file"},
      {"header over 100 MB claimed",
       with_length(raw_file(good_header, std::string(8, 'x')), 100'000'001),
       "exceeds the format's limit of 100 MB"},
      {"non-JSON header", raw_file("{not json}", ""), "header is not valid JSON"},
      {"header not an object", raw_file("[1, 2]", ""), "not an object"},
      {"overlapping offsets",
       raw_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 4, 12) + "}",
                std::string(12, 'x')),
       "tensors 'a' and 'b' overlap"},
      {"hole between tensors",
       raw_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 12, 20) + "}",
                std::string(20, 'x')),
       "hole in the data section: bytes [8, 12)"},
      {"bytes after the last tensor", raw_file(good_header, std::string(12, 'x')),
       "hole in the data section: bytes [8, 12) after the last tensor"},
      {"data not starting at 0",
       raw_file("{" + entry("a", "F32", "[2]", 4, 12) + "}", std::string(12, 'x')),
       "hole in the data section: bytes [0, 4)"},
      {"offsets beyond the file",
       raw_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("b", "F32", "[2]", 8, 16) + "}",
                std::string(12, 'x')),
       "tensor 'b': data_offsets [8, 16] run beyond the end of the file"},
      {"size/shape mismatch",
       raw_file("{" + entry("a", "F32", "[3]", 0, 8) + "}", std::string(8, 'x')),
       "size does not match shape"},
      {"unknown dtype", raw_file("{" + entry("a", "F7", "[2]", 0, 8) + "}", std::string(8, 'x')),
       "tensor 'a': unknown dtype 'F7'"},
      {"non-string metadata",
       raw_file(R"({"__metadata__":{"k":1},)" + entry("a", "F32", "[2]", 0, 8) + "}",
                std::string(8, 'x')),
       "__metadata__ value of 'k' is not a string"},
      {"duplicate names",
       raw_file("{" + entry("a", "F32", "[2]", 0, 8) + "," + entry("a", "F32", "[2]", 8, 16) + "}",
                std::string(16, 'x')),
       "duplicate tensor name 'a'"},
      {"negative dimension",
       raw_file("{" + entry("a", "F32", "[-2]", 0, 8) + "}", std::string(8, 'x')),
       "must be a non-negative integer"},
      {"offsets reversed",
       raw_file("{" + entry("a", "F32", "[0]", 8, 0) + "}", std::string(8, 'x')),
       "end before they begin"},
      {"missing data_offsets",
       raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", std::string(8, 'x')),
       "\"data_offsets\" must be an array of two offsets"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir.file("bad" + std::to_string(i) + ".safetensors");
    test::write_file(path, cases[i].bytes);
    const std::string message = error_reading(path);
    INFO(cases[i].label << ": " << message);
    REQUIRE_THAT(message, Catch::Contains(cases[i].expected));
    // Names the file in words (before: "'<file>': safetensors: <cause>").
    REQUIRE_THAT(message, Catch::StartsWith("safetensors file '" + path + "': "));
  }
  // The good header itself reads (the cases above differ from it only by the defect).
  const std::string good = dir.file("good.safetensors");
  test::write_file(good, raw_file(good_header, std::string(8, 'x')));
  REQUIRE(error_reading(good) == "(no error)");

  // A real file cut short: the last tensor runs beyond the end.
  const std::string cut = dir.file("cut.safetensors");
  io::write_safetensors(cut, {{"x", test::random_tensor({4}, 1), false, {}},
                              {"y", test::random_tensor({4}, 2), false, {}}});
  std::string bytes = test::read_file(cut);
  test::write_file(cut, bytes.substr(0, bytes.size() - 4));
  REQUIRE_THAT(error_reading(cut), Catch::Contains("tensor 'y': data_offsets [16, 32] run beyond"));
  REQUIRE_THAT(error_reading(dir.file("absent.safetensors")), Catch::Contains("cannot open"));
}

TEST_CASE("safetensors: the writer refuses bad input and leaves nothing behind", "[safetensors]") {
  test::ScratchDir dir("safetensors-writer");
  const std::string path = dir.file("out.safetensors");
  io::write_safetensors(path, {{"keep", test::random_tensor({3}, 1), false, {}}});
  const std::string before = test::read_file(path);
  REQUIRE_THAT(test::error_of([&] {
                 io::write_safetensors(path, {{"a", test::random_tensor({2}, 1), false, {}},
                                              {"a", test::random_tensor({2}, 2), false, {}}});
               }),
               Catch::StartsWith("cannot write safetensors file '" + path + "': ") &&
                   Catch::Contains("tensor 'a' given twice"));
  REQUIRE_THAT(
      test::error_of([&] {
        io::write_safetensors(path, {{"__metadata__", test::random_tensor({2}, 1), false, {}}});
      }),
      Catch::Contains("cannot write a tensor named '__metadata__'"));
  REQUIRE(test::read_file(path) == before);  // the old file is untouched
  const std::string nowhere = dir.file("no/such/dir/out.safetensors");
  REQUIRE_THAT(test::error_of([&] {
                 io::write_safetensors(nowhere, {{"a", test::random_tensor({2}, 1), false, {}}});
               }),
               Catch::Contains("cannot write"));
  REQUIRE(count_temp_files(dir.path()) == 0);
}
