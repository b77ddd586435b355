#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/gemm_kernel.h"
#include "backend/cpu/task_pool.h"
#include "moe/error.h"
#include "moe/threads.h"

namespace moe::cpu {

namespace {

// A product of fewer multiply-adds than this runs as one call on the calling thread: a fork/join
// costs more. Above it, tiles are split (halving the longer side, never below kTileMin) until
// there are kTargetTiles of them or a tile would drop under kTileWork multiply-adds. All three
// are constants: the grid is a function of the shape alone. 8 tiles keep 2-4 threads busy with
// dynamic scheduling (the last wave is at most 1/8 of the work); 256 x 256 tiles amortise the
// BLAS's packing of A and B (K/256 of a tile's work each).
constexpr double kSerialWork = double(1 << 20);
constexpr double kTileWork = double(1 << 22);
constexpr int64_t kTileMax = 256, kTileMin = 32, kTileAlign = 16, kTargetTiles = 8;

GemmPath g_path = GemmPath::tiled;

// The host's kernel: CPU features, then MOE_GEMM (read once; a bad value is a usage error that
// names the variable).
GemmKernel default_kernel() {
  const char* env = std::getenv("MOE_GEMM");
  const std::string want = env ? env : "";
  if (want.empty() || want == "auto")
    return gemm_avx512_supported() ? GemmKernel::avx512 : GemmKernel::blas;
  if (want == "blas") return GemmKernel::blas;
  if (want == "avx512") {
    if (!gemm_avx512_supported())
      throw UsageError(
          "MOE_GEMM=avx512: this CPU lacks AVX-512 (F, VL, DQ, BW) or FMA; unset MOE_GEMM or set "
          "it to blas");
    return GemmKernel::avx512;
  }
  throw UsageError(str("MOE_GEMM=", want, ": unknown GEMM kernel; use auto, blas or avx512"));
}

GemmKernel& kernel_in_use() {
  static GemmKernel kernel = default_kernel();
  return kernel;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

double work(int64_t m, int64_t n, int64_t k) {
  return static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

void cblas_call(const GemmProblem& p, int64_t m, int64_t n, const float* a, const float* b,
                float* c) {
  cblas_sgemm(CblasRowMajor, p.transpose_a ? CblasTrans : CblasNoTrans,
              p.transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(p.k), p.alpha, a, static_cast<int>(p.lda), b,
              static_cast<int>(p.ldb), p.beta, c, static_cast<int>(p.ldc));
}

// BLAS may leave C untouched when K is 0; define it.
void empty_k(const GemmProblem& p) {
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      float& c = p.c[i * p.ldc + j];
      c = p.beta == 0.0f ? 0.0f : p.beta * c;
    }
}

// Tile (ti, tj) of a problem: rows ti*tile_m.., columns tj*tile_n.. of C. Which kernel runs it is
// a function of the host and the tile's shape only.
void run_tile(const GemmProblem& p, const GemmTiling& t, int64_t ti, int64_t tj, GemmKernel kernel,
              uint64_t call) {
  const int64_t i0 = ti * t.tile_m, j0 = tj * t.tile_n;
  const int64_t m = std::min(t.tile_m, p.m - i0), n = std::min(t.tile_n, p.n - j0);
  const float* a = p.transpose_a ? p.a + i0 : p.a + i0 * p.lda;  // rows i0.. of op(A)
  const float* b = p.transpose_b ? p.b + j0 * p.ldb : p.b + j0;  // columns j0.. of op(B)
  if (kernel == GemmKernel::avx512 && m >= kGemmAvx512MinRows && n >= kGemmAvx512MinCols) {
    sgemm_tile_avx512(p, m, n, a, b, p.c + i0 * p.ldc + j0, call);
    return;
  }
  if (omp_in_parallel()) {
    cblas_call(p, m, n, a, b, p.c + i0 * p.ldc + j0);
    return;
  }
  // OpenBLAS's OpenMP build takes its thread count from omp_get_max_threads() on every call made
  // outside an active parallel region, whatever openblas_set_num_threads said: make it 1 for
  // this call (the setting is this thread's own and is restored at once).
  const int ours = omp_get_max_threads();
  omp_set_num_threads(1);
  cblas_call(p, m, n, a, b, p.c + i0 * p.ldc + j0);
  omp_set_num_threads(ours);
}

// Sets the BLAS's own thread count, keeping ours: OpenBLAS's OpenMP build also calls
// omp_set_num_threads from openblas_set_num_threads, which would change every loop of ours.
void set_blas_threads(int threads) {
  const int ours = omp_get_max_threads();
  openblas_set_num_threads(threads);
  omp_set_num_threads(ours);
}

void run_whole_threaded(const GemmProblem& p) {
  // The vendor's own threads for this one call (benchmark comparison only).
  set_blas_threads(omp_get_max_threads());
  cblas_call(p, p.m, p.n, p.a, p.b, p.c);
  set_blas_threads(1);
}

// The BLAS runs single-threaded from the library's first use on; set_num_threads keeps it so.
const bool g_blas_single_threaded = [] {
  set_blas_threads(1);
  return true;
}();

}  // namespace

GemmTiling gemm_tiling(int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || work(m, n, k) <= kSerialWork)
    return {std::max<int64_t>(m, 1), std::max<int64_t>(n, 1), 1, 1};
  int64_t tm = std::min(m, kTileMax), tn = std::min(n, kTileMax);
  auto halve = [](int64_t t) {
    return std::max(kTileMin, ceil_div(ceil_div(t, 2), kTileAlign) * kTileAlign);
  };
  while (ceil_div(m, tm) * ceil_div(n, tn) < kTargetTiles && work(tm, tn, k) >= 2 * kTileWork) {
    int64_t& longer = tm >= tn ? tm : tn;
    const int64_t next = halve(longer);
    if (next >= longer) {  // the longer side is at kTileMin: try the other one
      int64_t& shorter = tm >= tn ? tn : tm;
      const int64_t other = halve(shorter);
      if (other >= shorter) break;
      shorter = other;
    } else {
      longer = next;
    }
  }
  return {tm, tn, ceil_div(m, tm), ceil_div(n, tn)};
}

void sgemm_batch(const GemmProblem* problems, size_t count) {
  // Read here, outside the parallel loop: the first call may throw (a bad MOE_GEMM), and an
  // exception must not leave an OpenMP region.
  const GemmKernel kernel = kernel_in_use();
  // Tiles of all problems, numbered problem by problem. The lists are the calling thread's,
  // reused between calls (decode's attention makes 2 small products per head and token): no
  // allocation once warm. The loop below reads them through pointers, since inside the parallel
  // region a thread_local name is each thread's own.
  thread_local std::vector<GemmTiling> tiling_list;
  thread_local std::vector<int64_t> first_tile_list;
  tiling_list.assign(count, GemmTiling{});
  first_tile_list.assign(count + 1, 0);
  GemmTiling* const tilings = tiling_list.data();
  int64_t* const first_tile = first_tile_list.data();
  double total_work = 0;
  for (size_t i = 0; i < count; ++i) {
    const GemmProblem& p = problems[i];
    int64_t tiles = 0;
    if (p.m > 0 && p.n > 0) {
      if (p.k == 0) {
        empty_k(p);
      } else if (g_path == GemmPath::vendor_threaded) {
        run_whole_threaded(p);
      } else {
        tilings[i] = gemm_tiling(p.m, p.n, p.k);
        tiles = tilings[i].tiles_m * tilings[i].tiles_n;
        total_work += work(p.m, p.n, p.k);
      }
    }
    first_tile[i + 1] = first_tile[i] + tiles;
  }
  const int64_t total = first_tile[count];
  // The tile kernel's packed panels are kept within a call of several tiles; a single tile
  // (decode's per-head products) has no next tile to share them, and takes no call number.
  const uint64_t call = total > 1 ? gemm_next_call() : 0;
  auto tile = [&](int64_t t) {
    const size_t i = static_cast<size_t>(std::upper_bound(first_tile, first_tile + count + 1, t) -
                                         first_tile - 1);
    const int64_t within = t - first_tile[i];
    const GemmTiling& tiling = tilings[i];
    run_tile(problems[i], tiling, within / tiling.tiles_n, within % tiling.tiles_n, kernel, call);
  };
  const bool parallel = total > 1 && total_work > kSerialWork;
  // Which thread runs a tile never changes its bits: the schedule only balances load (uneven
  // edge tiles, a descheduled thread on a shared machine). Where OpenMP's idle threads sleep
  // between regions (task_pool.h), the tiles go to the task pool, whose caller waits only for
  // tiles another thread has started: a worker still waking up, or descheduled, holds no one up,
  // where an OpenMP region's end waits for every thread of its team.
  if (parallel && task_pool_enabled() && !omp_in_parallel()) {
    run_tasks(total, num_threads(), tile);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t t = 0; t < total; ++t) tile(t);
}

void sgemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  const GemmProblem p{transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc};
  sgemm_batch(&p, 1);
}

const char* gemm_kernel_name(GemmKernel kernel) {
  return kernel == GemmKernel::avx512 ? "avx512" : "blas";
}

GemmKernel gemm_kernel() { return kernel_in_use(); }

bool gemm_kernel_supported(GemmKernel kernel) {
  return kernel == GemmKernel::blas || gemm_avx512_supported();
}

void set_gemm_kernel(GemmKernel kernel) {
  if (!gemm_kernel_supported(kernel))
    throw UsageError(str("cpu sgemm: the ", gemm_kernel_name(kernel),
                         " kernel needs AVX-512 (F, VL, DQ, BW) and FMA, which this CPU lacks"));
  kernel_in_use() = kernel;
}

void set_gemm_path(GemmPath path) { g_path = path; }
GemmPath gemm_path() { return g_path; }

void set_num_threads(int threads) {
  (void)g_blas_single_threaded;
  if (threads <= 0) return;
  set_blas_threads(1);
  omp_set_num_threads(threads);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace moe::cpu

namespace moe {
void set_num_threads(int threads) { cpu::set_num_threads(threads); }
int num_threads() { return cpu::num_threads(); }
}  // namespace moe
