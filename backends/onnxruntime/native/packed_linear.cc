// The kernel of packed_linear.h: tasks of one panel and up to kRowChunk rows; in a task, tiles
// of rows (8 with AVX-512; with AVX2, 1 or 2 rows over all 32 columns, or 6 over 16) each walk
// the whole panel, keeping their columns' sums in registers from the first input index to the
// last. The panel stays in L2 while the tiles go by; the first tile pulls it from memory, 16 KB
// ahead of its loads.
#include "packed_linear.h"

#include <algorithm>
#include <cmath>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DZ_X86 1
#define DZ_AVX2 __attribute__((target("avx2,fma")))
#define DZ_AVX512 __attribute__((target("avx512f,fma")))
#else
#define DZ_X86 0
#endif

namespace dayzero {
namespace {

constexpr int64_t kRowChunk = 48;          // rows per task: a multiple of both tile heights
constexpr int64_t kPrefetchFloats = 4096;  // 16 KB ahead in the panel's stream
constexpr int64_t kMaxDim = int64_t{1} << 40;

struct Shared {
  const LinearProblem* p;
  int64_t chunks;  // row chunks per panel
  LinearIsa isa;
};

// Rows [r0, r1) of one panel, any CPU: the same fused multiply-adds in the same order.
void PanelPortable(const LinearProblem& p, const float* panel, int64_t column, int64_t r0,
                   int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = p.x + r * p.k;
    float acc[kPanelColumns] = {};
    for (int64_t i = 0; i < p.k; ++i) {
      const float* w = panel + i * kPanelColumns;
      for (int64_t c = 0; c < kPanelColumns; ++c) acc[c] = std::fma(x[i], w[c], acc[c]);
    }
    float* y = p.y + r * p.n + column;
    for (int64_t c = 0; c < kPanelColumns; ++c)
      y[c] = p.bias ? acc[c] + p.bias[column + c] : acc[c];
  }
}

#if DZ_X86
// R rows times a whole panel (32 columns), in 2 x R zmm sums.
template <int R>
DZ_AVX512 inline void TileAvx512(const LinearProblem& p, const float* panel, int64_t column,
                                 int64_t r, bool prefetch) {
  const float* x = p.x + r * p.k;
  const int64_t k = p.k;
  __m512 low[R], high[R];
#pragma GCC unroll 8
  for (int j = 0; j < R; ++j) low[j] = high[j] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const float* w = panel + i * kPanelColumns;
    // one line in two: the L2 prefetcher brings each line's pair with it
    if (prefetch && (i & 1) == 0)
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchFloats), _MM_HINT_T1);
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
#pragma GCC unroll 8
    for (int j = 0; j < R; ++j) {
      const __m512 v = _mm512_set1_ps(x[j * k + i]);
      low[j] = _mm512_fmadd_ps(v, w0, low[j]);
      high[j] = _mm512_fmadd_ps(v, w1, high[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < R; ++j) {
    float* y = p.y + (r + j) * p.n + column;
    if (p.bias) {
      low[j] = _mm512_add_ps(low[j], _mm512_loadu_ps(p.bias + column));
      high[j] = _mm512_add_ps(high[j], _mm512_loadu_ps(p.bias + column + 16));
    }
    _mm512_storeu_ps(y, low[j]);
    _mm512_storeu_ps(y + 16, high[j]);
  }
}

// R rows times V x 8 columns of a panel from `half` (V = 2: half a panel; V = 4: all of it, for
// one or two rows, so that a decode streams each panel once), in R x V ymm sums.
template <int R, int V>
DZ_AVX2 inline void TileAvx2(const LinearProblem& p, const float* panel, int64_t column,
                             int64_t half, int64_t r, bool prefetch) {
  const float* x = p.x + r * p.k;
  const int64_t k = p.k;
  __m256 acc[R][V];
#pragma GCC unroll 8
  for (int j = 0; j < R; ++j) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[j][v] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < k; ++i) {
    const float* w = panel + i * kPanelColumns + half;
    if (prefetch && (i & 1) == 0)
      _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchFloats), _MM_HINT_T1);
    __m256 wv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) wv[v] = _mm256_loadu_ps(w + 8 * v);
#pragma GCC unroll 8
    for (int j = 0; j < R; ++j) {
      const __m256 xv = _mm256_broadcast_ss(x + j * k + i);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[j][v] = _mm256_fmadd_ps(xv, wv[v], acc[j][v]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < R; ++j) {
    float* y = p.y + (r + j) * p.n + column + half;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      __m256 out = acc[j][v];
      if (p.bias) out = _mm256_add_ps(out, _mm256_loadu_ps(p.bias + column + half + 8 * v));
      _mm256_storeu_ps(y + 8 * v, out);
    }
  }
}

// Rows [r0, r1) of a panel, 8 at a time; the first tile prefetches the panel.
DZ_AVX512 void PanelAvx512(const LinearProblem& p, const float* panel, int64_t column,
                           int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; r += 8) {
    const bool first = r == r0;
    switch (std::min<int64_t>(8, r1 - r)) {
      case 8: TileAvx512<8>(p, panel, column, r, first); break;
      case 7: TileAvx512<7>(p, panel, column, r, first); break;
      case 6: TileAvx512<6>(p, panel, column, r, first); break;
      case 5: TileAvx512<5>(p, panel, column, r, first); break;
      case 4: TileAvx512<4>(p, panel, column, r, first); break;
      case 3: TileAvx512<3>(p, panel, column, r, first); break;
      case 2: TileAvx512<2>(p, panel, column, r, first); break;
      default: TileAvx512<1>(p, panel, column, r, first); break;
    }
  }
}

// Rows [r0, r1) of a panel: one or two rows over the whole panel at once; more, 6 at a time,
// one half of the panel after the other (16 ymm registers hold 6 rows x 16 columns' sums).
DZ_AVX2 void PanelAvx2(const LinearProblem& p, const float* panel, int64_t column, int64_t r0,
                       int64_t r1) {
  if (r1 - r0 == 1) return TileAvx2<1, 4>(p, panel, column, 0, r0, true);
  if (r1 - r0 == 2) return TileAvx2<2, 4>(p, panel, column, 0, r0, true);
  for (int64_t half = 0; half < kPanelColumns; half += 16) {
    for (int64_t r = r0; r < r1; r += 6) {
      const bool first = half == 0 && r == r0;
      switch (std::min<int64_t>(6, r1 - r)) {
        case 6: TileAvx2<6, 2>(p, panel, column, half, r, first); break;
        case 5: TileAvx2<5, 2>(p, panel, column, half, r, first); break;
        case 4: TileAvx2<4, 2>(p, panel, column, half, r, first); break;
        case 3: TileAvx2<3, 2>(p, panel, column, half, r, first); break;
        case 2: TileAvx2<2, 2>(p, panel, column, half, r, first); break;
        default: TileAvx2<1, 2>(p, panel, column, half, r, first); break;
      }
    }
  }
}
#endif

void RunTask(void* data, size_t index) {
  const Shared& s = *static_cast<const Shared*>(data);
  const LinearProblem& p = *s.p;
  const int64_t panel_index = static_cast<int64_t>(index) / s.chunks;
  const int64_t r0 = (static_cast<int64_t>(index) % s.chunks) * kRowChunk;
  const int64_t r1 = std::min(p.rows, r0 + kRowChunk);
  const float* panel = p.panels + panel_index * p.k * kPanelColumns;
  const int64_t column = panel_index * kPanelColumns;
#if DZ_X86
  if (s.isa == LinearIsa::kAvx512) return PanelAvx512(p, panel, column, r0, r1);
  if (s.isa == LinearIsa::kAvx2) return PanelAvx2(p, panel, column, r0, r1);
#endif
  PanelPortable(p, panel, column, r0, r1);
}

}  // namespace

LinearIsa PackedLinearIsa() {
#if DZ_X86
  static const LinearIsa best = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")
                                    ? LinearIsa::kAvx512
                                : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                                    ? LinearIsa::kAvx2
                                    : LinearIsa::kPortable;
  return best;
#else
  return LinearIsa::kPortable;
#endif
}

const char* PackedLinearCheck(const LinearProblem& p) {
  if (p.rows < 0) return "x has a negative number of rows";
  if (p.k <= 0 || p.k >= kMaxDim) return "in_features must be positive";
  if (p.n <= 0 || p.n % kPanelColumns || p.n >= kMaxDim)
    return "out_features must be a positive multiple of 32";
  return nullptr;
}

const char* PackedLinear(const LinearProblem& p, ParallelFor parallel, void* runner,
                         LinearIsa limit) {
  if (const char* why = PackedLinearCheck(p)) return why;
  if (p.rows == 0) return nullptr;
  Shared shared{&p, (p.rows + kRowChunk - 1) / kRowChunk,
                std::min(limit, PackedLinearIsa())};
  const int64_t panels = p.n / kPanelColumns;
  const auto tasks = static_cast<size_t>(panels * shared.chunks);
  if (tasks == 1) {
    RunTask(&shared, 0);
  } else {
    parallel(runner, RunTask, &shared, tasks);
  }
  return nullptr;
}

}  // namespace dayzero
