// What the GGUF export's parts share (io/gguf_write.cpp: the file and the architectures built on
// grouped-query attention; io/gguf_deepseek2.cpp: llama.cpp's deepseek2; io/gguf_gpt_oss.cpp:
// its gpt-oss): the key/value section built in memory, and the plan of one output tensor.
// Private to libmoe.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/export_model.h"
#include "moe/io/gguf.h"
#include "moe/models/config.h"

namespace moe::io {

namespace gguf_out {

// Value types of the GGUF key/value section.
enum ValueType : uint32_t { u32 = 4, i32 = 5, f32v = 6, boolean = 7, string = 8, array = 9 };

class Header {
 public:
  void put_u32(uint32_t v) { put(&v, 4); }
  void put_u64(uint64_t v) { put(&v, 8); }
  void put_string(const std::string& s) {
    put_u64(s.size());
    put(s.data(), s.size());
  }
  void key(const std::string& k, ValueType type) {
    put_string(k);
    put_u32(type);
    ++keys_;
  }
  void kv_u32(const std::string& k, uint32_t v) {
    key(k, u32);
    put_u32(v);
  }
  void kv_i32(const std::string& k, int32_t v) {
    key(k, i32);
    put(&v, 4);
  }
  void kv_f32(const std::string& k, float v) {
    key(k, f32v);
    put(&v, 4);
  }
  void kv_bool(const std::string& k, bool v) {
    key(k, boolean);
    const uint8_t b = v ? 1 : 0;
    put(&b, 1);
  }
  void kv_string(const std::string& k, const std::string& v) {
    key(k, string);
    put_string(v);
  }
  void kv_strings(const std::string& k, const std::vector<std::string>& v) {
    key(k, array);
    put_u32(string);
    put_u64(v.size());
    for (const std::string& s : v) put_string(s);
  }
  void kv_f32s(const std::string& k, const std::vector<float>& v) {
    key(k, array);
    put_u32(f32v);
    put_u64(v.size());
    put(v.data(), v.size() * 4);
  }
  void kv_i32s(const std::string& k, const std::vector<int32_t>& v) {
    key(k, array);
    put_u32(i32);
    put_u64(v.size());
    put(v.data(), v.size() * 4);
  }
  uint64_t keys() const { return keys_; }
  std::string& bytes() { return bytes_; }

 private:
  void put(const void* p, size_t n) { bytes_.append(static_cast<const char*>(p), n); }
  std::string bytes_;
  uint64_t keys_ = 0;
};

// One tensor of the output: its info, and how to produce its values as rows of f32 (or, for a
// tensor a checkpoint keeps in GGUF's blocks, its bytes as they are).
struct Planned {
  std::string name;
  std::vector<int64_t> dims;  // fastest-varying first
  GgufType type;
  int64_t parts = 1;                                  // produce(p) for p < parts, in order
  std::function<std::vector<float>(int64_t)> values;  // part p's values, row-major
  std::function<std::vector<uint8_t>(int64_t)> bytes = nullptr;  // set: part p's bytes instead
  int64_t nbytes() const {
    GgufTensorInfo info{name, dims, type, 0};
    return info.nbytes();
  }
};

// The type of a weight matrix of the output named `gguf` whose rows hold `row` values (the asked
// type, or llama.cpp's choice for it, or f16 where rows are not whole blocks).
using MatrixType = std::function<GgufType(const std::string& gguf, int64_t row)>;

// llama.cpp's deepseek2 (io/gguf_deepseek2.cpp). check_deepseek2 refuses by name what it cannot
// represent; deepseek2_attention plans block `i`'s latent-attention tensors (llama.cpp's names,
// shapes and RoPE row order) from ExportModel's params; write_deepseek2_keys writes the keys only
// deepseek2 reads (latent ranks, head widths, routing, YaRN's log multiplier).
void check_deepseek2(const ModelConfig& mc);
void deepseek2_attention(ExportModel& m, int64_t i, const MatrixType& matrix_type,
                         std::vector<Planned>& plan);
void write_deepseek2_keys(Header& h, const ModelConfig& mc);

// llama.cpp's gpt-oss (io/gguf_gpt_oss.cpp). check_gpt_oss refuses by name what its graph
// hard-codes and the model varies (the SwiGLU's alpha and limit, the window's layers, YaRN's
// mscale); gpt_oss_yarn_note says what truncate false becomes ("" when nothing);
// gpt_oss_layer_extras plans block `i`'s o bias, sinks, router bias and expert biases;
// write_gpt_oss_keys writes the keys only gpt-oss reads (the window, YaRN's betas).
void check_gpt_oss(const ModelConfig& mc);
std::string gpt_oss_yarn_note(const ModelConfig& mc);
void gpt_oss_layer_extras(ExportModel& m, int64_t i, std::vector<Planned>& plan);
void write_gpt_oss_keys(Header& h, const ModelConfig& mc);

}  // namespace gguf_out

}  // namespace moe::io
