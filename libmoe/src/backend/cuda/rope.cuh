// Kernel bodies of rotary position embedding (grid.h, kernels/rope.h): the cos/sin table [T, hd/2]
// one thread per entry (YaRN's frequencies and attention factor in it), then one thread per
// (token row, head).
// Shapes: x, y [B*T, heads*hd]; cos_table, sin_table [T, rd/2] (rd rotated features a head).
#pragma once
#include "backend/cuda/grid.h"
#include "kernels/rope.h"
#include "moe/rope_scaling.h"

namespace moe::cuda::body {

struct RopeTable {
  MOE_HD static void run(Thread th, float* cos_table, float* sin_table, int64_t seq, int64_t half,
                         int64_t head_dim, float theta, int64_t position_offset,
                         ops::RopeScaling sc = {}) {
    MOE_GRID_LOOP(e, seq * half, th) {
      const int64_t t = e / half, i = e - t * half;
      kernels::rope_table_entry(position_offset + t, i, head_dim, theta, sc.factor, sc.ramp_low,
                                sc.ramp_width, sc.attention_factor, &cos_table[e], &sin_table[e]);
    }
  }
};

// y may alias x (each thread reads and writes only its own head).
struct RopeRotate {
  MOE_HD static void run(Thread th, const float* x, float* y, const float* cos_table,
                         const float* sin_table, int64_t rows, int64_t seq, int64_t heads,
                         int64_t rotary_dim, int64_t head_dim, bool inverse) {
    const int64_t half = rotary_dim / 2, width = heads * head_dim;
    MOE_GRID_LOOP(e, rows * heads, th) {
      const int64_t r = e / heads, h = e - r * heads, t = r % seq;
      kernels::rope_rotate_head(x + r * width + h * head_dim, y + r * width + h * head_dim,
                                cos_table + t * half, sin_table + t * half, rotary_dim, head_dim,
                                inverse);
    }
  }
};

}  // namespace moe::cuda::body
