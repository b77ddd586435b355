// gpt-oss's experts in Hugging Face form (see io/hf_gpt_oss.h).
#include "io/hf_gpt_oss.h"

#include <cstring>

#include "moe/error.h"
#include "moe/io/finite.h"

namespace moe::io::hf {

namespace {

std::string named(const std::map<Slot, std::string>& single, Slot slot) {
  auto it = single.find(slot);
  return it == single.end() ? std::string() : it->second;
}

void check_shape(const Sources& s, const std::string& name, const Shape& expected,
                 const std::string& why) {
  const SafetensorsEntry& e = s.entry(name);
  if (e.shape != expected)
    throw Error(str("'", s.file_of(name), "': tensor '", name, "' is ", shape_str(e.shape),
                    ", but config.json implies ", shape_str(expected), " (", why, ")"));
}

// Expert e's slice of `name` (whole shape `whole`) in `target`, refused when not finite.
Tensor expert_slice(const Sources& s, const std::string& name, int64_t e, const Shape& whole,
                    DType target) {
  Tensor t = s.read_rows(name, e, e + 1);
  if (t.dtype() != target) t = t.to(target);
  check_finite_expert(str("'", s.file_of(name), "'"), name, t, e, whole);
  return t;
}

// out[j, r] = m[r, first + j * step] for m [R, C] of any dtype (the bytes moved as they are).
Tensor columns_as_rows(const Tensor& m, int64_t R, int64_t C, int64_t first, int64_t step) {
  const int64_t n = (C - first + step - 1) / step;
  Tensor out = Tensor::empty({n, R}, m.dtype());
  const size_t es = dtype_size(m.dtype());
  const auto* src = static_cast<const std::byte*>(m.raw());
  auto* dst = static_cast<std::byte*>(out.raw());
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r = 0; r < R; ++r)
      std::memcpy(dst + size_t(j * R + r) * es, src + size_t(r * C + first + j * step) * es, es);
  return out;
}

// E2M1: sign in bit 3; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The source names of one matrix: dense, or MXFP4 blocks + scales (exactly one form).
struct Matrix {
  std::string dense, blocks, scales;
};

Matrix matrix_of(const std::map<Slot, std::string>& single, Slot dense, Slot blocks, Slot scales,
                 const std::string& prefix, const std::string& what) {
  Matrix m{named(single, dense), named(single, blocks), named(single, scales)};
  const bool packed = !m.blocks.empty() || !m.scales.empty();
  if (!m.dense.empty() && packed)
    throw Error(str("tensors '", m.dense, "' and '", m.blocks.empty() ? m.scales : m.blocks,
                    "' both give ", prefix, what, " (dense and MXFP4)"));
  if (m.dense.empty() && (m.blocks.empty() || m.scales.empty()))
    throw Error(str("no tensor for ", prefix, what,
                    packed ? " (MXFP4 needs both _blocks and _scales)" : "",
                    " (the checkpoint is incomplete)"));
  return m;
}

// w1 (which 0) or w3 (which 1), or w2 (down), from a dense or MXFP4 matrix. Dense: the expert's
// [in, out] slice, columns which::2 (gate_up) or all (down), transposed to [out, in]. MXFP4: rows
// which::2 or all of the expert's [out, in] blocks, decoded.
std::function<Tensor(const Sources&, int64_t)> matrix_reader(const Matrix& m, int64_t E, int64_t in,
                                                             int64_t out, int64_t which,
                                                             int64_t step, DType target,
                                                             bool keep) {
  const int64_t rows = out / step;  // our [rows, in]
  if (m.dense.empty() && keep)
    return [=](const Sources& s, int64_t e) {
      const std::string what =
          str("'", s.file_of(m.blocks), "': tensor '", m.blocks, "' expert ", e);
      return mxfp4_blocks(s.read_rows(m.blocks, e, e + 1), s.read_rows(m.scales, e, e + 1), which,
                          step, what)
          .reshape({1, rows, in / 32 * 17});
    };
  if (!m.dense.empty())
    return [=](const Sources& s, int64_t e) {
      const Tensor t = expert_slice(s, m.dense, e, {E, in, out}, target);
      return columns_as_rows(t, in, out, which, step).reshape({1, rows, in});
    };
  return [=](const Sources& s, int64_t e) {
    const std::string what = str("'", s.file_of(m.blocks), "': tensor '", m.blocks, "' expert ", e);
    Tensor t = mxfp4_rows(s.read_rows(m.blocks, e, e + 1), s.read_rows(m.scales, e, e + 1), which,
                          step, what);
    if (target != DType::f32) t = t.to(target);  // exact: bf16 has f32's exponent range
    check_finite(str("'", s.file_of(m.blocks), "'"), str(m.blocks, " expert ", e), t);
    return t.reshape({1, rows, in});
  };
}

// The shape checks of one matrix (dense [E, in, out], or MXFP4 [E, out, in/32, 16] + [E, out,
// in/32]) and its mapping line.
void check_matrix(const Sources& s, const Matrix& m, int64_t E, int64_t in, int64_t out,
                  const std::string& dense_why, const std::string& ours, bool keep,
                  std::vector<std::string>& mapped) {
  if (!m.dense.empty()) {
    check_shape(s, m.dense, {E, in, out}, dense_why);
    mapped.push_back(str(m.dense, " -> ", ours, " (transposed)"));
    return;
  }
  if (in % 32 != 0)
    throw Error(str("'", s.file_of(m.blocks), "': tensor '", m.blocks, "' packs ", in,
                    " inputs a row in MXFP4 blocks of 32: it must be a multiple of 32"));
  for (const std::string& name : {m.blocks, m.scales})
    if (s.entry(name).dtype != "U8")
      throw Error(str("'", s.file_of(name), "': tensor '", name, "' has dtype ",
                      s.entry(name).dtype, "; MXFP4 blocks and scales are U8"));
  check_shape(s, m.blocks, {E, out, in / 32, 16}, "[experts, outputs, inputs / 32, 16] MXFP4");
  check_shape(s, m.scales, {E, out, in / 32}, "[experts, outputs, inputs / 32] E8M0 scales");
  mapped.push_back(
      str(m.blocks, " + ", m.scales, " -> ", ours,
          keep ? " (MXFP4, kept as our mxfp4 blocks)" : " (MXFP4, dequantised exactly)"));
}

// Calls fn(j, blk, e, q) for block `blk` of rows first, first + step, ... of one expert's MXFP4
// weight (blocks [1, R, nb, 16], scales [1, R, nb]): j the output row, e its E8M0 scale byte, q its
// 16 bytes. An 0xFF scale (E8M0's NaN) is refused naming `what`.
template <class Fn>
void for_each_mxfp4_block(const Tensor& blocks, const Tensor& scales, int64_t first,
                          int64_t step, const std::string& what, Fn fn) {
  const int64_t R = blocks.dim(1), nb = blocks.dim(2);
  const int64_t n = (R - first + step - 1) / step;
  const uint8_t* b = blocks.data<uint8_t>();
  const uint8_t* sc = scales.data<uint8_t>();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t r = first + j * step;
    for (int64_t blk = 0; blk < nb; ++blk) {
      const uint8_t e = sc[r * nb + blk];
      if (e == 0xFF)
        throw Error(str(what, ": an MXFP4 scale of row ", r,
                        " is 0xFF (E8M0's NaN): not a number we can import"));
      fn(j, blk, e, b + (r * nb + blk) * 16);
    }
  }
}

}  // namespace

Tensor mxfp4_rows(const Tensor& blocks, const Tensor& scales, int64_t first, int64_t step,
                  const std::string& what) {
  const int64_t nb = blocks.dim(2), in = nb * 32;
  const int64_t n = (blocks.dim(1) - first + step - 1) / step;
  Tensor out = Tensor::empty({n, in}, DType::f32);
  float* o = out.data<float>();
  for_each_mxfp4_block(blocks, scales, first, step, what,
                       [&](int64_t j, int64_t blk, uint8_t e, const uint8_t* q) {
                         const float scale = std::ldexp(1.0f, int(e) - 127);  // exact, to 2^-127
                         float* row = o + j * in + blk * 32;
                         for (int64_t i = 0; i < 16; ++i) {
                           row[2 * i] = kE2M1[q[i] & 15] * scale;
                           row[2 * i + 1] = kE2M1[q[i] >> 4] * scale;
                         }
                       });
  return out;
}

std::vector<ExpertPart> gpt_oss_experts(const Sources& s, const std::map<Slot, std::string>& single,
                                        const std::string& prefix, int64_t E, int64_t D, int64_t F,
                                        DType target, bool keep_mxfp4,
                                        std::vector<std::string>& mapped) {
  const Matrix gu = matrix_of(single, Slot::gate_up, Slot::gate_up_blocks, Slot::gate_up_scales,
                              prefix, "moe.experts.w1/w3 (gate_up_proj)");
  const Matrix dn = matrix_of(single, Slot::down, Slot::down_blocks, Slot::down_scales, prefix,
                              "moe.experts.w2 (down_proj)");
  if (target == DType::f16 && !keep_mxfp4 && (gu.dense.empty() || dn.dense.empty()))
    throw Error(str("'", s.file_of(gu.dense.empty() ? gu.blocks : dn.blocks),
                    "': MXFP4 experts dequantise exactly into bf16 or f32, but the checkpoint's "
                    "other tensors are F16"));
  const std::string x = prefix + "moe.experts.";
  check_matrix(s, gu, E, D, 2 * F, "[experts, hidden_size, 2 * intermediate_size]",
               x + "w1 (columns or rows ::2), " + x + "w3 (1::2)", keep_mxfp4, mapped);
  check_matrix(s, dn, E, F, D, "[experts, intermediate_size, hidden_size]", x + "w2", keep_mxfp4,
               mapped);
  const std::string gub = named(single, Slot::gate_up_bias), dnb = named(single, Slot::down_bias);
  if (gub.empty() || dnb.empty())
    throw Error(str("no tensor for ", x,
                    gub.empty() ? "b1/b3 (gate_up_proj_bias)" : "b2 (down_proj_bias)",
                    " (the checkpoint is incomplete)"));
  check_shape(s, gub, {E, 2 * F}, "[experts, 2 * intermediate_size]: gate, up interleaved");
  check_shape(s, dnb, {E, D}, "[experts, hidden_size]");
  mapped.push_back(str(gub, " -> ", x, "b1 (elements ::2), ", x, "b3 (elements 1::2)"));
  mapped.push_back(str(dnb, " -> ", x, "b2"));
  auto bias_half = [=](int64_t which) {
    return [=](const Sources& src, int64_t e) {
      const Tensor t = expert_slice(src, gub, e, {E, 2 * F}, target);
      return columns_as_rows(t, 1, 2 * F, which, 2).reshape({1, F});
    };
  };
  // A matrix's part: our mxfp4 blocks when kept, else floats in the storage dtype.
  auto matrix = [&](const std::string& our, const Matrix& m, int64_t in, int64_t out, int64_t which,
                    int64_t step) {
    const bool kept = keep_mxfp4 && m.dense.empty();
    const Shape shape{E, out / step, kept ? in / 32 * 17 : in};
    return ExpertPart{our, shape, matrix_reader(m, E, in, out, which, step, target, keep_mxfp4),
                      kept ? DType::u8 : target, kept};
  };
  auto b2 = [=](const Sources& src, int64_t e) {
    return expert_slice(src, dnb, e, {E, D}, target);
  };
  return {matrix(x + "w1", gu, D, 2 * F, 0, 2), matrix(x + "w2", dn, F, D, 0, 1),
          matrix(x + "w3", gu, D, 2 * F, 1, 2), {x + "b1", {E, F}, bias_half(0), target},
          {x + "b2", {E, D}, b2, target},       {x + "b3", {E, F}, bias_half(1), target}};
}

Tensor mxfp4_blocks(const Tensor& blocks, const Tensor& scales, int64_t first, int64_t step,
                    const std::string& what) {
  const int64_t nb = blocks.dim(2);
  const int64_t n = (blocks.dim(1) - first + step - 1) / step;
  Tensor out = Tensor::empty({n, nb * 17}, DType::u8);
  uint8_t* o = out.data<uint8_t>();
  for_each_mxfp4_block(blocks, scales, first, step, what,
                       [&](int64_t j, int64_t blk, uint8_t e, const uint8_t* q) {
                         auto nibble = [q](int64_t k) { return (q[k >> 1] >> (4 * (k & 1))) & 15; };
                         uint8_t* block = o + (j * nb + blk) * 17;
                         block[0] = e;
                         for (int64_t i = 0; i < 16; ++i)
                           block[1 + i] = uint8_t(nibble(i) | nibble(i + 16) << 4);
                       });
  return out;
}

bool exact_in(const Sources& s, const std::vector<std::string>& names, DType dtype) {
  for (const std::string& name : names) {
    const Tensor t = s.read(name);
    const Tensor back = t.to(dtype).to(t.dtype());
    if (std::memcmp(t.raw(), back.raw(), t.nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace moe::io::hf
