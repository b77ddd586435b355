// Rotary position embedding over [B*T, heads*hd] activations (HF "rotate half" convention).
// A cos/sin table [T, rd/2] (rd: the rotated features of a head; YaRN's frequencies and attention
// factor in it) is built when the positions change (kept per thread); rows are rotated in parallel.
#include "kernels/rope.h"

#include <vector>

#include "backend/cpu/backend.h"
#include "core/parallel.h"

namespace moe::cpu {

namespace {

// The cos/sin table [T, hd/2] of the last call on this thread, kept with what it was built for: a
// decode step rotates q and k of every layer at the same positions, and each of those 2 x layers
// calls used to build the same table again (hd/2 powf, hd cosf/sinf, two heap vectors). A rebuilt
// table holds the same values: the same calls in the same order.
struct RopeTable {
  int64_t seq = -1, head_dim = 0, position_offset = 0;
  float theta = 0.0f;
  ops::RopeScaling scaling;
  // [seq, head_dim / 2] each, kept between calls: a warm step allocates nothing here
  std::vector<float> cos, sin;

  bool holds(int64_t s, int64_t hd, int64_t offset, float t, const ops::RopeScaling& sc) const {
    return seq == s && head_dim == hd && position_offset == offset && theta == t && scaling == sc;
  }
  void build(int64_t s, int64_t hd, int64_t offset, float t, const ops::RopeScaling& sc) {
    const int64_t h = hd / 2;
    seq = -1;  // not valid until filled
    cos.resize(static_cast<size_t>(s * h));
    sin.resize(static_cast<size_t>(s * h));
    float* cs = cos.data();
    float* ss = sin.data();
#pragma omp parallel for schedule(static) if (s * h >= kParallelWork)
    for (int64_t p = 0; p < s; ++p)
      for (int64_t i = 0; i < h; ++i)
        kernels::rope_table_entry(offset + p, i, hd, t, sc.factor, sc.ramp_low, sc.ramp_width,
                                  sc.attention_factor, &cs[p * h + i], &ss[p * h + i]);
    seq = s, head_dim = hd, position_offset = offset, theta = t, scaling = sc;
  }
};

}  // namespace

void rope_apply(const Tensor& x, int64_t batch, int64_t seq, int64_t heads, int64_t rotary_dim,
                float theta, const ops::RopeScaling& scaling, Tensor& y, int64_t position_offset,
                bool inverse) {
  const int64_t width = x.dim(1), head_dim = width / heads, half = rotary_dim / 2;
  thread_local RopeTable table;
  if (!table.holds(seq, rotary_dim, position_offset, theta, scaling))
    table.build(seq, rotary_dim, position_offset, theta, scaling);
  // Pointers into this thread's table: inside the parallel loop below, `table` would name each
  // worker thread's own (empty or stale) table.
  const float* cos_table = table.cos.data();
  const float* sin_table = table.sin.data();
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  const int64_t rows = batch * seq;
#pragma omp parallel for schedule(static) if (rows * width >= kParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % seq;
    for (int64_t h = 0; h < heads; ++h)
      kernels::rope_rotate_head(xs + r * width + h * head_dim, ys + r * width + h * head_dim,
                                cos_table + t * half, sin_table + t * half, rotary_dim, head_dim,
                                inverse);
  }
}

}  // namespace moe::cpu
