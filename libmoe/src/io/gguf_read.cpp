// GGUF reading (see moe/io/gguf.h), the tensor types and Q8_0 blocks. The reader checks every
// length and offset against the file's size before it allocates or seeks, so a truncated or
// corrupted file is refused with the byte offset where it goes wrong.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "io/gguf_blocks.h"
#include "kernels/convert.h"
#include "moe/error.h"
#include "moe/io/gguf.h"
#include "moe/io/input.h"

namespace moe::io {

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::f32:
      return "f32";
    case GgufType::f16:
      return "f16";
    case GgufType::q8_0:
      return "q8_0";
    case GgufType::bf16:
      return "bf16";
    case GgufType::q4_k:
      return "q4_k";
    case GgufType::q6_k:
      return "q6_k";
    case GgufType::mxfp4:
      return "mxfp4";
  }
  return "?";
}

GgufType parse_gguf_type(const std::string& name) {
  for (GgufType t : {GgufType::f32, GgufType::f16, GgufType::bf16, GgufType::q8_0, GgufType::q4_k,
                     GgufType::q6_k, GgufType::mxfp4})
    if (name == gguf_type_name(t)) return t;
  throw UsageError(str("GGUF tensor type '", name,
                       "' is not one of f32, f16, bf16, q8_0, q4_k, q6_k, mxfp4"));
}

bool is_block_type(GgufType t) {
  return t == GgufType::q4_k || t == GgufType::q6_k || t == GgufType::mxfp4;
}

void quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  MOE_CHECK(n % kQ8Block == 0, "quantize_q8_0: ", n, " values are not whole blocks of ", kQ8Block);
  cpu::quantize_row(cpu::BlockFormat::q8_0, x, n, out);  // llama.cpp's reference bytes
}

void dequantize_q8_0(const uint8_t* blocks, int64_t n, float* out) {
  MOE_CHECK(n % kQ8Block == 0, "dequantize_q8_0: ", n, " values are not whole blocks of ",
            kQ8Block);
  cpu::dequantize_row(cpu::BlockFormat::q8_0, blocks, n, out);
}

const char* ggml_type_name(uint32_t type) {
  // ggml's type numbers and names (ggml.h enum ggml_type; 4, 5 and 31..33 were removed).
  static const char* const names[] = {
      "f32",     "f16",    "q4_0",    "q4_1",  nullptr,  nullptr, "q5_0",  "q5_1",
      "q8_0",    "q8_1",   "q2_K",    "q3_K",  "q4_K",   "q5_K",  "q6_K",  "q8_K",
      "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s", "iq2_s", "iq4_xs",
      "i8",      "i16",    "i32",     "i64",   "f64",    "iq1_m", "bf16",  nullptr,
      nullptr,   nullptr,  "tq1_0",   "tq2_0", nullptr,  nullptr, nullptr, "mxfp4"};
  return type < sizeof names / sizeof names[0] ? names[type] : nullptr;
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

int64_t GgufTensorInfo::nbytes() const {
  switch (type) {
    case GgufType::f32:
      return numel() * 4;
    case GgufType::f16:
    case GgufType::bf16:
      return numel() * 2;
    case GgufType::q8_0:
    case GgufType::q4_k:
    case GgufType::q6_k:
    case GgufType::mxfp4: {
      const cpu::BlockFormat f = block_format_of(type);
      return numel() / cpu::block_elems(f) * cpu::block_bytes(f);
    }
  }
  return 0;
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  for (const GgufTensorInfo& t : tensors)
    if (t.name == name) return t;
  throw Error(str("'", path, "' holds no tensor '", name, "'"));
}

namespace {

constexpr uint32_t kTypeArray = 9, kTypeString = 8;
// Arrays and strings beyond these are refused as corrupt before anything is allocated.
constexpr uint64_t kMaxString = uint64_t(1) << 30, kMaxDims = 4;

struct Reader {
  std::FILE* f;
  std::string path;
  uint64_t size, at = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(
        str("'", path, "' is not a valid GGUF file: ", what, " (at byte ", at, " of ", size, ")"));
  }
  void bytes(void* out, uint64_t n) {
    if (n > size - at) fail(str("it ends inside a field of ", n, " bytes"));
    if (n && std::fread(out, 1, n, f) != n) fail("read error");
    at += n;
  }
  template <typename T>
  T get() {
    T v;
    bytes(&v, sizeof v);
    return v;
  }
  std::string string() {
    const uint64_t n = get<uint64_t>();
    if (n > kMaxString || n > size - at) fail(str("a string of ", n, " bytes"));
    std::string s(n, '\0');
    bytes(s.data(), n);
    return s;
  }
  nlohmann::ordered_json scalar(uint32_t type) {
    switch (type) {
      case 0:
        return get<uint8_t>();
      case 1:
        return get<int8_t>();
      case 2:
        return get<uint16_t>();
      case 3:
        return get<int16_t>();
      case 4:
        return get<uint32_t>();
      case 5:
        return get<int32_t>();
      case 6:
        return get<float>();
      case 7: {
        const uint8_t b = get<uint8_t>();
        if (b > 1) fail(str("a bool of value ", int(b)));
        return b == 1;
      }
      case kTypeString:   // bytes as they are (a byte token need not be UTF-8): dump() with
        return string();  // error_handler_t::replace to print them
      case 10:
        return get<uint64_t>();
      case 11:
        return get<int64_t>();
      case 12:
        return get<double>();
    }
    fail(str("value type ", type, " is unknown"));
  }
};

}  // namespace

GgufFile read_gguf(const std::string& path) {
  check_input_file(path, "GGUF file");  // a directory, device or FIFO: refused by name
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!file) throw Error(str("cannot open '", path, "': ", std::strerror(errno)));
  if (std::fseek(file.get(), 0, SEEK_END) != 0)
    throw Error(str("cannot read '", path, "': not a seekable file"));
  const long end = std::ftell(file.get());
  std::rewind(file.get());
  Reader r{file.get(), path, static_cast<uint64_t>(end < 0 ? 0 : end)};
  GgufFile g;
  g.path = path;
  g.file_size = r.size;
  char magic[4];
  r.bytes(magic, 4);
  if (std::memcmp(magic, "GGUF", 4) != 0) r.fail("the magic is not 'GGUF'");
  g.version = r.get<uint32_t>();
  if (g.version != 3) r.fail(str("version ", g.version, " (this reader knows version 3)"));
  const uint64_t tensors = r.get<uint64_t>(), keys = r.get<uint64_t>();
  // Each key takes at least 12 bytes and each tensor info at least 28: counts beyond the file
  // are corruption, refused before anything is reserved.
  if (keys > r.size / 12 || tensors > r.size / 28)
    r.fail(str(keys, " keys and ", tensors, " tensors cannot fit"));
  for (uint64_t i = 0; i < keys; ++i) {
    const std::string key = r.string();
    if (g.metadata.contains(key)) r.fail(str("key '", key, "' given twice"));
    const uint32_t type = r.get<uint32_t>();
    nlohmann::ordered_json entry;
    entry["type"] = type;
    if (type == kTypeArray) {
      const uint32_t element = r.get<uint32_t>();
      const uint64_t count = r.get<uint64_t>();
      if (element == kTypeArray) r.fail(str("key '", key, "' is an array of arrays"));
      if (count > r.size - r.at) r.fail(str("key '", key, "': an array of ", count, " values"));
      nlohmann::ordered_json values = nlohmann::ordered_json::array();
      for (uint64_t j = 0; j < count; ++j) values.push_back(r.scalar(element));
      entry["element_type"] = element;
      entry["value"] = std::move(values);
    } else {
      entry["value"] = r.scalar(type);
    }
    g.metadata[key] = std::move(entry);
  }
  if (g.metadata.contains("general.alignment")) {
    const auto& a = g.metadata["general.alignment"];
    if (a["type"] != 4 || a["value"].get<uint64_t>() == 0 ||
        (a["value"].get<uint64_t>() & (a["value"].get<uint64_t>() - 1)) != 0)
      r.fail("general.alignment is not a power of two of type u32");
    g.alignment = a["value"].get<uint64_t>();
  }
  for (uint64_t i = 0; i < tensors; ++i) {
    GgufTensorInfo t;
    t.name = r.string();
    const uint32_t dims = r.get<uint32_t>();
    if (dims == 0 || dims > kMaxDims)
      r.fail(str("tensor '", t.name, "' has ", dims, " dimensions"));
    int64_t numel = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const uint64_t n = r.get<uint64_t>();
      if (n == 0 || n > (uint64_t(1) << 40) || numel > (int64_t(1) << 40) / int64_t(n))
        r.fail(str("tensor '", t.name, "': dimension ", d, " of ", n, " elements"));
      numel *= static_cast<int64_t>(n);
      t.dims.push_back(static_cast<int64_t>(n));
    }
    const uint32_t type = r.get<uint32_t>();
    if (type != 0 && type != 1 && type != 8 && type != 12 && type != 14 && type != 30 &&
        type != 39) {
      // A type ggml defines is a valid file this build cannot read; any other is corruption.
      const char* known = ggml_type_name(type);
      if (!known)
        r.fail(str("tensor '", t.name, "' has type ", type, ", which ggml does not define"));
      throw Error(str("'", path, "': GGUF tensor type ", known, " (", t.name,
                      ") is not supported by this build (it reads f32, f16, bf16, q8_0, q4_K, "
                      "q6_K and mxfp4)"));
    }
    t.type = static_cast<GgufType>(type);
    if (is_blocked(t.type) && t.dims[0] % cpu::block_elems(block_format_of(t.type)) != 0)
      r.fail(str("tensor '", t.name, "' is ", gguf_type_name(t.type), " with rows of ", t.dims[0],
                 " values"));
    t.offset = r.get<uint64_t>();
    if (t.offset % g.alignment != 0) r.fail(str("tensor '", t.name, "' is not aligned"));
    g.tensors.push_back(std::move(t));
  }
  g.data_offset = (r.at + g.alignment - 1) / g.alignment * g.alignment;
  for (const GgufTensorInfo& t : g.tensors)
    if (g.data_offset > r.size || t.offset > r.size - g.data_offset ||
        static_cast<uint64_t>(t.nbytes()) > r.size - g.data_offset - t.offset)
      r.fail(str("tensor '", t.name, "' (", t.nbytes(), " bytes at data offset ", t.offset,
                 ") runs past the end: the file is truncated"));
  return g;
}

std::vector<uint8_t> read_gguf_tensor_bytes(const GgufFile& g, const std::string& name) {
  const GgufTensorInfo& t = g.tensor(name);
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(g.path.c_str(), "rb"),
                                                       std::fclose);
  if (!file) throw Error(str("cannot open '", g.path, "': ", std::strerror(errno)));
  std::vector<uint8_t> raw(static_cast<size_t>(t.nbytes()));
  if (std::fseek(file.get(), static_cast<long>(g.data_offset + t.offset), SEEK_SET) != 0 ||
      std::fread(raw.data(), 1, raw.size(), file.get()) != raw.size())
    throw Error(str("'", g.path, "': cannot read tensor '", name, "' (truncated?)"));
  return raw;
}

std::vector<float> read_gguf_tensor(const GgufFile& g, const std::string& name) {
  const GgufTensorInfo& t = g.tensor(name);
  const std::vector<uint8_t> raw = read_gguf_tensor_bytes(g, name);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  const size_t n = out.size();
  if (t.type == GgufType::f32) {
    std::memcpy(out.data(), raw.data(), n * 4);
  } else if (is_blocked(t.type)) {  // the rows are whole blocks: one call for the tensor
    cpu::dequantize_row(block_format_of(t.type), raw.data(), t.numel(), out.data());
  } else {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = t.type == GgufType::f16 ? kernels::f16_to_f32(h) : kernels::bf16_to_f32(h);
    }
  }
  return out;
}

}  // namespace moe::io
