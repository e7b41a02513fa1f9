// Paged attention of a generation step: see paged_attention.h for what and why.
//
// Two parallel phases, and a third when a step's keys are split. The first (one task per token)
// rotates the step's new keys into `new_k` and copies its values into `new_v`: those are outputs
// anyway (the runtime writes them into the pool), and the second phase reads a new token's key
// from there, exactly as it reads a cached key from the pool.
//
// The second has one task per block of up to kTokenTile consecutive tokens of one sequence,
// tile of up to kHeadTile query heads per kv head and group of up to kKvTile kv heads (GQA:
// each kv head's rows are its query heads' rows of every token, up to kRows; a task takes
// several kv heads so that a slot's rows of them, contiguous in the pool, are read together;
// Tasks says how many). The block's rows walk their
// visible keys together, kChunk keys at a time, so each scattered key and value row is fetched
// from memory once per block, not once per token and head. Per chunk a task prefetches the
// next chunk's rows into L2; packs the chunk's keys transposed ([channel][key], so that a query
// channel times a key panel is one broadcast and FMAs over 8 keys, no horizontal sums) and its
// values contiguous, for as many of its kv heads at once as fit in kPackFloats, reading each
// slot's rows of them front to back; then per kv head scores all rows against the chunk (6 rows x
// 16-key panels in registers), then per row: the running maximum over the part of the chunk
// the row's token sees, one rescale of its accumulator if that maximum rose, the weights
// through a vectorised exp; and finally the weighted values, 6 rows that see the same keys x 16
// output channels in registers. The AVX2 + FMA functions run where the CPU has them, the
// scalar ones elsewhere; a task's rows live in a buffer its thread keeps.
//
// A step with few tasks (a decode step: one token per sequence, a few kv heads) would leave
// threads idle and bind each one to a long walk; there every task's keys are split into parts
// of at least kSplitKeys positions, each part keeps its own maximum, weight sum and accumulator,
// and the third phase (one task per token) combines them: the same rescaling as between chunks.
//
// Non-finite numbers: the maxima keep NaN, so a NaN score makes the row NaN as the softmax does;
// +Inf scores make Inf - Inf = NaN as there; a chunk whose scores are all -Inf while the running
// maximum is still -Inf weighs 0 (the decomposition's exp(-inf - max) once a finite score comes,
// and a NaN row through 0 / 0 if none does); rescaling by exp(old - new) = 0 turns an Inf that
// earlier values put in the accumulator into NaN, as the dense product's 0 * Inf does. A key a
// row does not see may be scored with it (it shares the chunk with keys the row sees) but its
// score is never looked at, and its value never weighed for that row.
#include "paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <new>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DZ_PAGED_X86 1
#define DZ_PAGED_AVX2 __attribute__((target("avx2,fma")))
#else
#define DZ_PAGED_X86 0
#endif

namespace dayzero {
namespace {

constexpr int64_t kChunk = 64;     // keys scored before the running maxima are updated
constexpr int64_t kPanel = 16;     // keys per register-blocked score panel (two AVX vectors)
constexpr int64_t kHeadTile = 8;   // query heads of one kv head per task
constexpr int64_t kTokenTile = 32;  // consecutive tokens per task: they share each key chunk
constexpr int64_t kRows = kHeadTile * kTokenTile;  // rows of one kv head in a task
constexpr int64_t kTaskRows = 1024;  // rows of all its kv heads: a task takes up to kKvTile ...
constexpr int64_t kKvTile = 32;     // ... kv heads, so that it reads a slot's rows of them at once
constexpr int64_t kSplitKeys = 512;  // fewest key positions in a part of a split step
constexpr int64_t kMinTasks = 32;    // a step with fewer tasks than this splits its keys
constexpr int64_t kWideDecodeBlocks = 4;  // decode tokens from which each takes all kv heads
constexpr int64_t kPackFloats = 1 << 16;  // a task packs the keys and values of as many kv
                                          // heads as fit in 256 KB at once
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

enum Failure : int { kNone = 0, kBadSequence = 1, kBadSlot = 2, kNoMemory = 3 };

// Part of the work of phase 2: tokens [t0, t1) of one sequence, at kv heads [g0, g0 + kvs), at
// the tile-th tile of up to kHeadTile query heads of each.
struct Task {
  int64_t t0, t1, g0, kvs, tile;
};

struct Shared {
  const PagedProblem* p;
  bool vectorized;
  std::vector<Task> tasks;
  int64_t buffer_rows = 0;  // the most rows a task holds (TaskRows)
  int64_t pack_heads = 1;   // kv heads whose chunk of keys and values a task packs at once
  int64_t parts = 1;  // key parts per task (1: not split, rows go straight to `out`)
  std::atomic<int> failure{kNone};
  std::vector<float> partials;  // [parts, tokens, num_heads, v_size + 2] when split
  float* partial(int64_t part, int64_t t, int64_t h) {
    return partials.data() + ((part * p->tokens + t) * p->num_heads + h) * (p->v_size + 2);
  }
};

// x * cos + rotate_half(x) * sin over one head (rotate_half(x) = concat(-x2, x1)), or a copy.
void RotateHead(const float* x, const float* c, const float* s, int64_t size, float* dst) {
  if (c == nullptr) {
    std::copy(x, x + size, dst);
    return;
  }
  const int64_t half = size / 2;
  for (int64_t i = 0; i < half; ++i) dst[i] = x[i] * c[i] - x[i + half] * s[i];
  for (int64_t i = half; i < size; ++i) dst[i] = x[i] * c[i] + x[i - half] * s[i];
}

inline float MaxKeepNaN(float a, float b) {
  return (std::isnan(a) || std::isnan(b)) ? kNaN : std::max(a, b);
}

// A chunk's visible rows: up to kChunk key rows and their value rows, in position order.
struct Chunk {
  const float* keys[kChunk];
  const float* values[kChunk];
  int64_t pos[kChunk];
  int64_t n;
  int64_t key_offset = 0, value_offset = 0;  // floats from a slot's first kv head to this one's
  const float* key(int64_t i) const { return keys[i] + key_offset; }
  const float* value(int64_t i) const { return values[i] + value_offset; }
};

// A task's rows of one kv head: `count` rows (token-major, then query head), each a rotated
// query row followed by its accumulator, `stride` floats apart, with their softmax states; the
// chunk's keys transposed, [size][kChunk], values and the rows' scores [kRows][kChunk] (shared
// by the task's kv heads, which take the chunk in turns).
struct Rows {
  float* base;
  int64_t stride, count;
  float* kt;
  float* vt;  // the chunk's value rows, [kChunk][v_size]
  float* scores;
  float* peak;  // per row: the running maximum and weight sum
  float* sum;
  float* q(int64_t r) const { return base + r * stride; }
  float* score(int64_t r) const { return scores + r * kChunk; }
};

// kt[d][i] = keys[i][d] for i < n, 0 for n <= i < padded.
void PackScalar(const Chunk& c, int64_t size, int64_t padded, float* kt) {
  for (int64_t d = 0; d < size; ++d) {
    for (int64_t i = 0; i < c.n; ++i) kt[d * kChunk + i] = c.key(i)[d];
    for (int64_t i = c.n; i < padded; ++i) kt[d * kChunk + i] = 0.0f;
  }
}

// scores[r][i] = q[r] . keys[i] for every row and i < padded, from the packed keys.
void ScoreScalar(const Rows& rows, int64_t size, int64_t padded) {
  for (int64_t r = 0; r < rows.count; ++r) {
    const float* q = rows.q(r);
    float* s = rows.score(r);
    std::fill(s, s + padded, 0.0f);
    for (int64_t d = 0; d < size; ++d) {
      for (int64_t i = 0; i < padded; ++i) s[i] += q[d] * rows.kt[d * kChunk + i];
    }
  }
}

// acc[r] += sum over i in [lo, hi) of probs[r][i] * values[i], for `count` rows; value row i
// at vt + i * v_size.
void WeighScalar(int64_t count, float* const* acc, const float* const* probs, const float* vt,
                 int64_t lo, int64_t hi, int64_t v_size) {
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t i = lo; i < hi; ++i) {
      for (int64_t d = 0; d < v_size; ++d) acc[r][d] += probs[r][i] * vt[i * v_size + d];
    }
  }
}

#if DZ_PAGED_X86
DZ_PAGED_AVX2 inline float HorizontalSum(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

DZ_PAGED_AVX2 inline float HorizontalMax(__m256 x) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Scores of R rows (from r0) against the 16 packed keys from column i0: 2R accumulators.
template <int R>
DZ_PAGED_AVX2 void ScorePanel(const Rows& rows, int64_t r0, int64_t i0, int64_t size) {
  // named accumulators, not an array: GCC keeps an array of 12 in memory
  __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0,
         b3 = a0, a4 = a0, b4 = a0, a5 = a0, b5 = a0;
  const float* q = rows.q(r0);
  const int64_t stride = rows.stride;
  const float* kt = rows.kt + i0;
  for (int64_t d = 0; d < size; ++d, kt += kChunk) {
    const __m256 k0 = _mm256_loadu_ps(kt), k1 = _mm256_loadu_ps(kt + 8);
    const float* qd = q + d;
    __m256 w = _mm256_broadcast_ss(qd);
    a0 = _mm256_fmadd_ps(w, k0, a0);
    b0 = _mm256_fmadd_ps(w, k1, b0);
    if (R > 1) {
      w = _mm256_broadcast_ss(qd + stride);
      a1 = _mm256_fmadd_ps(w, k0, a1);
      b1 = _mm256_fmadd_ps(w, k1, b1);
    }
    if (R > 2) {
      w = _mm256_broadcast_ss(qd + 2 * stride);
      a2 = _mm256_fmadd_ps(w, k0, a2);
      b2 = _mm256_fmadd_ps(w, k1, b2);
    }
    if (R > 3) {
      w = _mm256_broadcast_ss(qd + 3 * stride);
      a3 = _mm256_fmadd_ps(w, k0, a3);
      b3 = _mm256_fmadd_ps(w, k1, b3);
    }
    if (R > 4) {
      w = _mm256_broadcast_ss(qd + 4 * stride);
      a4 = _mm256_fmadd_ps(w, k0, a4);
      b4 = _mm256_fmadd_ps(w, k1, b4);
    }
    if (R > 5) {
      w = _mm256_broadcast_ss(qd + 5 * stride);
      a5 = _mm256_fmadd_ps(w, k0, a5);
      b5 = _mm256_fmadd_ps(w, k1, b5);
    }
  }
  const __m256 out[2 * 6] = {a0, b0, a1, b1, a2, b2, a3, b3, a4, b4, a5, b5};
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(rows.score(r0 + r) + i0, out[2 * r]);
    _mm256_storeu_ps(rows.score(r0 + r) + i0 + 8, out[2 * r + 1]);
  }
}

DZ_PAGED_AVX2 void ScoreAvx2(const Rows& rows, int64_t size, int64_t padded) {
  for (int64_t r0 = 0; r0 < rows.count; r0 += 6) {
    const int64_t left = std::min<int64_t>(6, rows.count - r0);
    for (int64_t i0 = 0; i0 < padded; i0 += kPanel) {
      switch (left) {
        case 6: ScorePanel<6>(rows, r0, i0, size); break;
        case 5: ScorePanel<5>(rows, r0, i0, size); break;
        case 4: ScorePanel<4>(rows, r0, i0, size); break;
        case 3: ScorePanel<3>(rows, r0, i0, size); break;
        case 2: ScorePanel<2>(rows, r0, i0, size); break;
        default: ScorePanel<1>(rows, r0, i0, size); break;
      }
    }
  }
}

// WeighScalar for R rows: 16 (then 8) output channels of every row stay in registers over the
// keys, so each value row's channels are loaded once for all R rows.
template <int R>
DZ_PAGED_AVX2 void WeighRowsAvx2(float* const* acc, const float* const* probs, const float* vt,
                                 int64_t lo, int64_t hi, int64_t v_size) {
  int64_t d = 0;
  for (; d + 16 <= v_size; d += 16) {
    __m256 sum[R][2];
    for (int r = 0; r < R; ++r) {
      sum[r][0] = _mm256_loadu_ps(acc[r] + d);
      sum[r][1] = _mm256_loadu_ps(acc[r] + d + 8);
    }
    for (int64_t i = lo; i < hi; ++i) {
      const float* value = vt + i * v_size + d;
      const __m256 v0 = _mm256_loadu_ps(value), v1 = _mm256_loadu_ps(value + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 w = _mm256_broadcast_ss(probs[r] + i);
        sum[r][0] = _mm256_fmadd_ps(w, v0, sum[r][0]);
        sum[r][1] = _mm256_fmadd_ps(w, v1, sum[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(acc[r] + d, sum[r][0]);
      _mm256_storeu_ps(acc[r] + d + 8, sum[r][1]);
    }
  }
  for (; d + 8 <= v_size; d += 8) {
    __m256 sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_loadu_ps(acc[r] + d);
    for (int64_t i = lo; i < hi; ++i) {
      const __m256 v = _mm256_loadu_ps(vt + i * v_size + d);
      for (int r = 0; r < R; ++r)
        sum[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(probs[r] + i), v, sum[r]);
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc[r] + d, sum[r]);
  }
  for (; d < v_size; ++d) {
    for (int r = 0; r < R; ++r) {
      for (int64_t i = lo; i < hi; ++i) acc[r][d] += probs[r][i] * vt[i * v_size + d];
    }
  }
}

DZ_PAGED_AVX2 void WeighAvx2(int64_t count, float* const* acc, const float* const* probs,
                             const float* vt, int64_t lo, int64_t hi, int64_t v_size) {
  for (int64_t r0 = 0; r0 < count; r0 += 6) {
    switch (std::min<int64_t>(6, count - r0)) {
      case 6: WeighRowsAvx2<6>(acc + r0, probs + r0, vt, lo, hi, v_size); break;
      case 5: WeighRowsAvx2<5>(acc + r0, probs + r0, vt, lo, hi, v_size); break;
      case 4: WeighRowsAvx2<4>(acc + r0, probs + r0, vt, lo, hi, v_size); break;
      case 3: WeighRowsAvx2<3>(acc + r0, probs + r0, vt, lo, hi, v_size); break;
      case 2: WeighRowsAvx2<2>(acc + r0, probs + r0, vt, lo, hi, v_size); break;
      default: WeighRowsAvx2<1>(acc + r0, probs + r0, vt, lo, hi, v_size); break;
    }
  }
}

// exp(x) for 8 floats (Cephes' single-precision polynomial on x - n ln 2, then 2^n; within 2
// ulp of std::exp for x in [-87, 88]): below that 0 (so exp(-inf) is exactly 0), NaN stays NaN.
DZ_PAGED_AVX2 inline __m256 Exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.3365478515625f);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q), tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  __m256 v = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(v, _mm256_set1_ps(1.44269504088896341f),
                                             _mm256_set1_ps(0.5f)));
  v = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), v);
  v = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), v);
  __m256 y = _mm256_set1_ps(1.9875691500E-4f);
  for (float c : {1.3981999507E-3f, 8.3334519073E-3f, 4.1665795894E-2f, 1.6666665459E-1f,
                  5.0000001201E-1f})
    y = _mm256_fmadd_ps(y, v, _mm256_set1_ps(c));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(v, v), _mm256_add_ps(v, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
  y = _mm256_andnot_ps(tiny, y);
  return _mm256_blendv_ps(y, x, nan);
}

// w[i] = exp(s[i] - peak) for i < n, returning their sum (peak finite or +inf/NaN: the
// caller's rule for an all -inf chunk is applied before).
DZ_PAGED_AVX2 float ExpWeightsAvx2(float* s, int64_t n, float peak) {
  const __m256 top = _mm256_set1_ps(peak);
  __m256 total = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 w = Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), top));
    _mm256_storeu_ps(s + i, w);
    total = _mm256_add_ps(total, w);
  }
  float sum = HorizontalSum(total);
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - peak);
    sum += s[i];
  }
  return sum;
}

// s[i] *= scale for i < n, returning max(start, the s[i]) with NaN kept.
DZ_PAGED_AVX2 float ScaleMaxAvx2(float* s, int64_t n, float scale, float start) {
  const __m256 k = _mm256_set1_ps(scale);
  __m256 top = _mm256_set1_ps(kNegInf), nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + i), k);
    _mm256_storeu_ps(s + i, x);
    top = _mm256_max_ps(top, x);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  float result = MaxKeepNaN(start, HorizontalMax(top));
  if (_mm256_movemask_ps(nan)) result = kNaN;
  for (; i < n; ++i) result = MaxKeepNaN(result, s[i] *= scale);
  return result;
}
#endif

#if DZ_PAGED_X86
// PackScalar for a head size that is a multiple of 8 (8 x 8 blocks transposed in registers),
// for kv heads [first, first + kvs) of the chunk's slots at once, the g-th into
// kt + g * size * kChunk: each group of 8 key rows is read from start to end (every kv head of
// the pass), 8 streams, not one slice per kv head.
DZ_PAGED_AVX2 void PackWideAvx2(const Chunk& c, int64_t first, int64_t kvs, int64_t size,
                                int64_t padded, float* kt) {
  for (int64_t i0 = 0; i0 < padded; i0 += 8) {
    for (int64_t g = 0; g < kvs; ++g) {
      for (int64_t d0 = 0; d0 < size; d0 += 8) {
        __m256 r[8];
        for (int64_t j = 0; j < 8; ++j)
          r[j] = i0 + j < c.n ? _mm256_loadu_ps(c.keys[i0 + j] + (first + g) * size + d0)
                              : _mm256_setzero_ps();
        __m256 t[8], u[8];
        for (int j = 0; j < 8; j += 2) {
          t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
          t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
        }
        for (int j = 0; j < 8; j += 4) {
          u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
          u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
          u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
          u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
        }
        float* dst = kt + g * size * kChunk + d0 * kChunk + i0;
        for (int j = 0; j < 4; ++j) {
          _mm256_storeu_ps(dst + j * kChunk, _mm256_permute2f128_ps(u[j], u[j + 4], 0x20));
          _mm256_storeu_ps(dst + (j + 4) * kChunk, _mm256_permute2f128_ps(u[j], u[j + 4], 0x31));
        }
      }
    }
  }
}
#endif

// The chunk's keys packed and values copied for the task's kv heads [first, first + kvs) (the
// g-th's at kt + g * head_size * kChunk and vt + g * v_size * kChunk). Leaves c.key_offset
// set: the caller sets it per kv head.
void PackChunk(bool vectorized, const PagedProblem& p, Chunk& c, int64_t first, int64_t kvs,
               int64_t padded, float* kt, float* vt) {
#if DZ_PAGED_X86
  if (vectorized && p.head_size % 8 == 0) {
    PackWideAvx2(c, first, kvs, p.head_size, padded, kt);
  } else
#endif
  {
    for (int64_t g = 0; g < kvs; ++g) {
      c.key_offset = (first + g) * p.head_size;
      PackScalar(c, p.head_size, padded, kt + g * p.head_size * kChunk);
    }
  }
  for (int64_t i = 0; i < c.n; ++i) {  // contiguous: the rows, a slot's width apart, share L1 sets
    for (int64_t g = 0; g < kvs; ++g) {
      const float* value = c.values[i] + (first + g) * p.v_size;
      std::copy(value, value + p.v_size, vt + (g * kChunk + i) * p.v_size);
    }
  }
}

void Score(bool vectorized, const Rows& rows, int64_t size, int64_t padded) {
#if DZ_PAGED_X86
  if (vectorized) return ScoreAvx2(rows, size, padded);
#endif
  (void)vectorized;
  ScoreScalar(rows, size, padded);
}

void Weigh(bool vectorized, int64_t count, float* const* acc, const float* const* probs,
           const float* vt, int64_t lo, int64_t hi, int64_t v_size) {
#if DZ_PAGED_X86
  if (vectorized) return WeighAvx2(count, acc, probs, vt, lo, hi, v_size);
#endif
  (void)vectorized;
  WeighScalar(count, acc, probs, vt, lo, hi, v_size);
}

// s[i] = s[i] * scale, then softcapped; returns max(start, the s[i]) with NaN kept.
float ScaleMax(bool vectorized, float* s, int64_t n, float scale, float softcap, float start) {
  if (softcap == 0.0f) {
#if DZ_PAGED_X86
    if (vectorized) return ScaleMaxAvx2(s, n, scale, start);
#endif
  }
  (void)vectorized;
  float top = start;
  for (int64_t i = 0; i < n; ++i) {
    s[i] *= scale;
    if (softcap != 0.0f) s[i] = std::tanh(s[i] / softcap) * softcap;
    top = MaxKeepNaN(top, s[i]);
  }
  return top;
}

// w[i] = exp(s[i] - peak), or 0 when peak is -inf (exp(-inf - -inf) would be NaN: a chunk
// of all -inf scores weighs 0); returns their sum.
float ExpWeights(bool vectorized, float* s, int64_t n, float peak) {
  if (peak == kNegInf) {
    std::fill(s, s + n, 0.0f);
    return 0.0f;
  }
#if DZ_PAGED_X86
  if (vectorized) return ExpWeightsAvx2(s, n, peak);
#endif
  (void)vectorized;
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - peak);
    sum += s[i];
  }
  return sum;
}

// Row strides of q, k and v (0: the row width, tensors of their own).
int64_t QStride(const PagedProblem& p) {
  return p.q_stride ? p.q_stride : p.num_heads * p.head_size;
}
int64_t KStride(const PagedProblem& p) {
  return p.k_stride ? p.k_stride : p.kv_heads * p.head_size;
}
int64_t VStride(const PagedProblem& p) { return p.v_stride ? p.v_stride : p.kv_heads * p.v_size; }

// Phase 1: token t's rotated keys and its values, in the pool's [kv_heads, size] row layout.
void NewKeysAndValues(void* data, size_t index) noexcept {
  const PagedProblem& p = *static_cast<Shared*>(data)->p;
  const int64_t t = static_cast<int64_t>(index);
  const float* c = p.cos ? p.cos + t * p.head_size : nullptr;
  const float* s = p.sin ? p.sin + t * p.head_size : nullptr;
  for (int64_t g = 0; g < p.kv_heads; ++g) {
    RotateHead(p.k + t * KStride(p) + g * p.head_size, c, s, p.head_size,
               p.new_k + (t * p.kv_heads + g) * p.head_size);
  }
  const float* v = p.v + t * VStride(p);
  std::copy(v, v + p.kv_heads * p.v_size, p.new_v + t * p.kv_heads * p.v_size);
}

void Fail(Shared& k, Failure why) {
  int expected = kNone;
  k.failure.compare_exchange_strong(expected, why);
}

// Where key slot `slot` of kv head g lives: the pool, or this step's new keys. False when the
// slot is outside both.
inline bool Locate(const PagedProblem& p, int64_t slot, int64_t g, const float** key,
                   const float** value) {
  if (slot >= 0) {
    if (slot >= p.pool_slots) return false;
    *key = p.k_cache + (slot * p.kv_heads + g) * p.head_size;
    *value = p.v_cache + (slot * p.kv_heads + g) * p.v_size;
    return true;
  }
  const int64_t token = -2 - slot;
  if (token >= p.tokens) return false;
  *key = p.new_k + (token * p.kv_heads + g) * p.head_size;
  *value = p.new_v + (token * p.kv_heads + g) * p.v_size;
  return true;
}

// Asks for a row's cache lines in L2 (not L1: the rows of one kv head are a pool slot's width
// apart, a power of two that maps them to a few L1 sets, where a chunk of them would evict the
// query and output rows and each other).
inline void Prefetch(const float* row, int64_t floats) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < floats * 4; b += 64) __builtin_prefetch(bytes + b, 0, 1);
}

// Prefetches the key and value rows of slots [first, last) of kv heads [g, g + kvs) (the next
// chunk, while this one is computed); slots that Locate refuses are skipped here and reported
// there.
void PrefetchChunk(const PagedProblem& p, const int64_t* slots, int64_t first, int64_t last,
                   int64_t g, int64_t kvs) {
  for (int64_t j = first; j < last; ++j) {
    const float *key, *value;
    if (slots[j] != -1 && Locate(p, slots[j], g, &key, &value)) {
      Prefetch(key, kvs * p.head_size);
      Prefetch(value, kvs * p.v_size);
    }
  }
}

// Query heads of one kv head in a task's tile.
inline int64_t TileHeads(const PagedProblem& p) {
  return std::min(kHeadTile, p.num_heads / p.kv_heads);
}

// The step's blocks: runs of up to kTokenTile consecutive tokens of one sequence (a decode
// step's tokens are a block each). Tokens whose sequence is out of range form blocks like any
// others; Attend reports them.
std::vector<std::pair<int64_t, int64_t>> Blocks(const PagedProblem& p) {
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (int64_t t = 0; t < p.tokens; ++t) {
    if (blocks.empty() || p.token_seq[t] != p.token_seq[t - 1] ||
        t - blocks.back().first == kTokenTile)
      blocks.emplace_back(t, t);
    blocks.back().second = t + 1;
  }
  return blocks;
}

// Splits the step into tasks: each block at each tile of query heads, per group of kv heads.
//
// How many kv heads a task takes trades contiguous reads against parallel tasks. A slot's rows
// of all kv heads are one contiguous stretch of the pool, so a task that takes them all reads
// whole rows (a decode step of 8 sequences at 1500 keys ran 1.5x faster so), but it leaves
// fewer tasks. A block of one token (decode) takes every kv head (up to kTaskRows rows) when
// the step has at least kWideDecodeBlocks of them; a lone sequence's decode instead gives each
// kv head its own task, so that the threads share it. A longer block (a prompt chunk, whose
// rows already share each key it reads) takes as many kv heads as keep its rows within
// kTaskRows, or one when that would leave fewer than kMinTasks tasks.
std::vector<Task> Tasks(const PagedProblem& p) {
  const int64_t heads = TileHeads(p);
  const int64_t tiles = (p.num_heads / p.kv_heads + kHeadTile - 1) / kHeadTile;
  const auto blocks = Blocks(p);
  int64_t singles = 0;
  for (const auto& b : blocks) singles += b.second - b.first == 1;
  const int64_t widest =
      std::min({p.kv_heads, kKvTile, std::max<int64_t>(1, kTaskRows / (kTokenTile * heads))});
  const int64_t chunk_tasks = (static_cast<int64_t>(blocks.size()) - singles) * tiles *
                              ((p.kv_heads + widest - 1) / widest);
  const int64_t chunk_tile = chunk_tasks < kMinTasks ? 1 : widest;
  const int64_t decode_tile =
      singles * tiles >= kWideDecodeBlocks
          ? std::min({p.kv_heads, kKvTile, std::max<int64_t>(1, kTaskRows / heads)})
          : 1;
  std::vector<Task> tasks;
  for (const auto& b : blocks) {
    const int64_t kv_tile = b.second - b.first == 1 ? decode_tile : chunk_tile;
    for (int64_t g0 = 0; g0 < p.kv_heads; g0 += kv_tile) {
      for (int64_t tile = 0; tile < tiles; ++tile)
        tasks.push_back({b.first, b.second, g0, std::min(kv_tile, p.kv_heads - g0), tile});
    }
  }
  return tasks;
}

// Rows of a task's buffer: its kv heads' rows of every token of its block.
inline int64_t TaskRows(const PagedProblem& p, const Task& task) {
  return task.kvs * (task.t1 - task.t0) * TileHeads(p);
}

// The entries [lo, hi) of a chunk (ordered by position) whose positions fall in [begin, end).
inline void VisibleRange(const Chunk& c, int64_t begin, int64_t end, int64_t* lo, int64_t* hi) {
  int64_t a = 0, b = c.n;
  while (a < c.n && c.pos[a] < begin) ++a;
  while (b > a && c.pos[b - 1] >= end) --b;
  *lo = a;
  *hi = b;
}

// The online softmax step of row r over entries [lo, hi) of the chunk's scores: scale and
// softcap them, raise the running maximum (rescaling what was accumulated), weigh them.
void Softmax(const Shared& k, Rows& rows, int64_t r, int64_t lo, int64_t hi) {
  const PagedProblem& p = *k.p;
  float* s = rows.score(r) + lo;
  const float top = ScaleMax(k.vectorized, s, hi - lo, p.scale, p.softcap, rows.peak[r]);
  if (!(top == rows.peak[r])) {  // a new maximum, or NaN: rescale what was accumulated
    const float alpha = std::exp(rows.peak[r] - top);
    float* acc = rows.q(r) + p.head_size;
    for (int64_t d = 0; d < p.v_size; ++d) acc[d] *= alpha;
    rows.sum[r] *= alpha;
    rows.peak[r] = top;
  }
  rows.sum[r] += ExpWeights(k.vectorized, s, hi - lo, rows.peak[r]);
}

// One chunk (at one kv head) for a run's tokens, whose rows are `heads` apiece and each see
// entries [lo[t], hi[t]) of it: score every row, then each token's rows take their part;
// tokens seeing the same part are weighed together.
void AttendChunk(const Shared& k, Rows& rows, int64_t heads, const Chunk& c, const int64_t* lo,
                 const int64_t* hi) {
  const PagedProblem& p = *k.p;
  const int64_t tokens = rows.count / heads;
  const int64_t padded = (c.n + kPanel - 1) / kPanel * kPanel;
  Score(k.vectorized, rows, p.head_size, padded);
  for (int64_t t0 = 0; t0 < tokens;) {
    int64_t t1 = t0 + 1;
    while (t1 < tokens && lo[t1] == lo[t0] && hi[t1] == hi[t0]) ++t1;
    if (lo[t0] < hi[t0]) {
      float* acc[kRows];
      const float* probs[kRows];
      for (int64_t r = t0 * heads; r < t1 * heads; ++r) {
        Softmax(k, rows, r, lo[t0], hi[t0]);
        acc[r - t0 * heads] = rows.q(r) + p.head_size;
        probs[r - t0 * heads] = rows.score(r);
      }
      Weigh(k.vectorized, (t1 - t0) * heads, acc, probs, rows.vt, lo[t0], hi[t0], p.v_size);
    }
    t0 = t1;
  }
}

// A task's view of one kv head: its rows, and the query heads [first, first + heads) they are.
struct KvRows {
  Rows rows;
  int64_t first;
};

// Starts each row of tokens [t0, t1) at kv head view `view`: its rotated query, a zero
// accumulator, no maximum yet.
void StartRows(const PagedProblem& p, int64_t t0, int64_t t1, int64_t heads, KvRows& view) {
  const int64_t size = p.head_size;
  view.rows.count = (t1 - t0) * heads;
  for (int64_t t = t0; t < t1; ++t) {
    const float* c = p.cos ? p.cos + t * size : nullptr;
    const float* s = p.sin ? p.sin + t * size : nullptr;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t r = (t - t0) * heads + h;
      float* q = view.rows.q(r);
      RotateHead(p.q + t * QStride(p) + (view.first + h) * size, c, s, size, q);
      std::fill(q + size, q + size + p.v_size, 0.0f);
      view.rows.peak[r] = kNegInf;
      view.rows.sum[r] = 0.0f;
    }
  }
}

// Writes the rows of tokens [t0, t1) to `out`, or their running state to the partials when
// the step is split.
void FinishRows(Shared& k, int64_t t0, int64_t t1, int64_t heads, int64_t part,
                const KvRows& view) {
  const PagedProblem& p = *k.p;
  const int64_t v_size = p.v_size;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t r = (t - t0) * heads + h;
      const float* acc = view.rows.q(r) + p.head_size;
      if (k.parts > 1) {
        float* keep = k.partial(part, t, view.first + h);
        std::copy(acc, acc + v_size, keep);
        keep[v_size] = view.rows.peak[r];
        keep[v_size + 1] = view.rows.sum[r];
        continue;
      }
      float* out = p.out + (t * p.num_heads + view.first + h) * v_size;
      const float inv = 1.0f / view.rows.sum[r];  // Inf when nothing weighed: 0 * Inf is NaN
      for (int64_t d = 0; d < v_size; ++d) out[d] = acc[d] * inv;
    }
  }
}

// Tokens [t0, t1) of one sequence, at the task's `kvs` kv heads from g0 (`heads` query heads
// each), over part `part` of the union of their visible keys: the keys are walked once, chunk
// by chunk (so a prompt chunk's tokens read each key row from memory once, not once per token,
// and a slot's rows of the task's kv heads are read together). False when a slot is outside the
// pool and the step's tokens.
bool AttendRun(Shared& k, int64_t t0, int64_t t1, int64_t g0, int64_t kvs, int64_t heads,
               int64_t part, KvRows* views) {
  const PagedProblem& p = *k.p;
  const int64_t* slots = p.seq_slots + p.token_seq[t0] * p.length;
  int64_t begin[kTokenTile], end[kTokenTile], lo = p.length, hi = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t seen = p.token_len[t];
    end[t - t0] = std::min(seen, p.length);
    begin[t - t0] = p.window > 0 ? std::max<int64_t>(0, seen - p.window) : 0;
    lo = std::min(lo, begin[t - t0]);
    hi = std::max(hi, end[t - t0]);
  }
  for (int64_t i = 0; i < kvs; ++i) StartRows(p, t0, t1, heads, views[i]);
  if (k.parts > 1 && hi > lo) {  // this part of the union's positions
    const int64_t width = hi - lo;
    hi = lo + width * (part + 1) / k.parts;
    lo = lo + width * part / k.parts;
  }
  Chunk chunk;
  int64_t from[kTokenTile], to[kTokenTile];
  PrefetchChunk(p, slots, lo, std::min(lo + kChunk, hi), g0, kvs);
  for (int64_t j0 = lo; j0 < hi; j0 += kChunk) {
    PrefetchChunk(p, slots, j0 + kChunk, std::min(j0 + 2 * kChunk, hi), g0, kvs);
    chunk.n = 0;
    for (int64_t j = j0; j < std::min(j0 + kChunk, hi); ++j) {
      if (slots[j] == -1) continue;  // padding: hidden
      if (!Locate(p, slots[j], g0, &chunk.keys[chunk.n], &chunk.values[chunk.n])) return false;
      chunk.pos[chunk.n++] = j;
    }
    bool seen = false;
    for (int64_t t = 0; t < t1 - t0; ++t) {
      VisibleRange(chunk, begin[t], end[t], &from[t], &to[t]);
      seen = seen || from[t] < to[t];
    }
    if (!seen) continue;
    for (int64_t i = 0; i < kvs; ++i) {
      if (i % k.pack_heads == 0) {  // the next pack_heads kv heads' keys and values, in one pass
        PackChunk(k.vectorized, p, chunk, i, std::min(k.pack_heads, kvs - i),
                  (chunk.n + kPanel - 1) / kPanel * kPanel, views[i].rows.kt,
                  views[i].rows.vt);
      }
      chunk.key_offset = i * p.head_size;
      chunk.value_offset = i * p.v_size;
      AttendChunk(k, views[i].rows, heads, chunk, from, to);
    }
  }
  for (int64_t i = 0; i < kvs; ++i) FinishRows(k, t0, t1, heads, part, views[i]);
  return true;
}

// The thread's buffer for a task's rows, packed keys and values and scores (kept between
// calls: each call's tasks need about the same size, up to about 1 MB for head sizes up to
// 128).
float* TaskBuffer(const Shared& k) {
  const PagedProblem& p = *k.p;
  thread_local std::vector<float> buffer;
  // each row: query, accumulator, maximum and sum
  const size_t floats = static_cast<size_t>(k.buffer_rows * (p.head_size + p.v_size + 2) +
                                            (k.pack_heads * (p.head_size + p.v_size) + kRows) *
                                                kChunk);
  if (buffer.size() < floats) buffer.resize(floats);
  return buffer.data();
}

// Phase 2: part `part` of a task (Tasks); its block's tokens are taken run by run of one
// sequence.
void Attend(void* data, size_t index) noexcept {
  Shared& k = *static_cast<Shared*>(data);
  const PagedProblem& p = *k.p;
  const int64_t group = p.num_heads / p.kv_heads;
  const int64_t part = static_cast<int64_t>(index) % k.parts;
  const Task& task = k.tasks[static_cast<size_t>(index) / k.parts];
  const int64_t kvs = task.kvs, heads = std::min(kHeadTile, group - task.tile * kHeadTile);
  const int64_t t_end = task.t1;
  float* buffer;
  try {
    buffer = TaskBuffer(k);
  } catch (const std::bad_alloc&) {
    return Fail(k, kNoMemory);
  }
  KvRows views[kKvTile];
  const int64_t stride = p.head_size + p.v_size;
  const int64_t view_rows = (task.t1 - task.t0) * TileHeads(p);  // rows of one kv head
  float* kt = buffer + k.buffer_rows * stride;
  for (int64_t i = 0; i < kvs; ++i) {
    views[i].first = (task.g0 + i) * group + task.tile * kHeadTile;
    views[i].rows.base = buffer + i * view_rows * stride;
    views[i].rows.stride = stride;
    const int64_t packed = i % k.pack_heads;  // its place among the kv heads packed together
    views[i].rows.kt = kt + packed * p.head_size * kChunk;
    views[i].rows.vt = kt + (k.pack_heads * p.head_size + packed * p.v_size) * kChunk;
    // the kv heads take turns with the scores
    views[i].rows.scores = kt + k.pack_heads * (p.head_size + p.v_size) * kChunk;
    views[i].rows.peak = views[i].rows.scores + kRows * kChunk + 2 * i * view_rows;
    views[i].rows.sum = views[i].rows.peak + view_rows;
  }
  for (int64_t t0 = task.t0; t0 < t_end;) {
    const int64_t seq = p.token_seq[t0];
    int64_t t1 = t0 + 1;
    while (t1 < t_end && p.token_seq[t1] == seq) ++t1;
    if (seq < 0 || seq >= p.sequences) {
      Fail(k, kBadSequence);
      for (int64_t i = 0; i < kvs; ++i) {
        for (int64_t t = t0; t < t1; ++t) {
          for (int64_t h = views[i].first; h < views[i].first + heads; ++h) {
            float* row = k.parts > 1 ? k.partial(part, t, h)
                                     : p.out + (t * p.num_heads + h) * p.v_size;
            std::fill_n(row, p.v_size + (k.parts > 1 ? 2 : 0), kNaN);
          }
        }
      }
    } else if (!AttendRun(k, t0, t1, task.g0, kvs, heads, part, views)) {
      return Fail(k, kBadSlot);
    }
    t0 = t1;
  }
}

// Phase 3 of a split step: token t's rows from its parts' states, each part rescaled to the
// overall maximum as the chunks of one walk are (a NaN maximum makes the row NaN).
void Combine(void* data, size_t index) noexcept {
  Shared& k = *static_cast<Shared*>(data);
  const PagedProblem& p = *k.p;
  const int64_t t = static_cast<int64_t>(index), v_size = p.v_size;
  for (int64_t h = 0; h < p.num_heads; ++h) {
    float top = kNegInf;
    for (int64_t part = 0; part < k.parts; ++part)
      top = MaxKeepNaN(top, k.partial(part, t, h)[v_size]);
    float* out = p.out + (t * p.num_heads + h) * v_size;
    std::fill(out, out + v_size, 0.0f);
    float sum = 0.0f;
    for (int64_t part = 0; part < k.parts; ++part) {
      const float* state = k.partial(part, t, h);
      const float alpha = state[v_size] == top ? 1.0f : std::exp(state[v_size] - top);
      for (int64_t d = 0; d < v_size; ++d) out[d] += alpha * state[d];
      sum += alpha * state[v_size + 1];
    }
    const float inv = 1.0f / sum;  // Inf when no key weighed anything: 0 * Inf is NaN
    for (int64_t d = 0; d < v_size; ++d) out[d] *= inv;
  }
}

bool Vectorized() {
#if DZ_PAGED_X86
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
#else
  return false;
#endif
}

// Parts per task: 1, or enough to make kMinTasks tasks of at least kSplitKeys positions each.
int64_t Parts(const PagedProblem& p, int64_t tasks) {
  if (tasks >= kMinTasks) return 1;
  return std::max<int64_t>(1, std::min(p.length / kSplitKeys, (kMinTasks + tasks - 1) / tasks));
}

}  // namespace

const char* PagedAttentionCheck(const PagedProblem& p) {
  if (p.tokens < 0 || p.pool_slots < 0 || p.sequences < 0 || p.length < 0)
    return "negative tokens, pool slots, sequences or slot-list length";
  if (p.num_heads <= 0 || p.kv_heads <= 0 || p.num_heads > kPagedMaxHeads ||
      p.num_heads % p.kv_heads)
    return "num_heads must be 1 to 1024 and a multiple of kv_num_heads (which must be positive)";
  if (p.head_size <= 0 || p.head_size > kPagedMaxHeadSize || p.v_size <= 0 ||
      p.v_size > kPagedMaxHeadSize)
    return "the query/key and value head sizes must be 1 to 1024";
  if ((p.cos == nullptr) != (p.sin == nullptr)) return "cos and sin come together";
  if (p.cos && p.head_size % 2) return "rotary needs an even head size";
  if (p.cos && p.cos_rows < p.tokens) return "the rotary tables have fewer rows than tokens";
  if (p.window < 0) return "window must be positive (0: none)";
  if (p.q_stride < 0 || (p.q_stride && p.q_stride < p.num_heads * p.head_size) ||
      p.k_stride < 0 || (p.k_stride && p.k_stride < p.kv_heads * p.head_size) ||
      p.v_stride < 0 || (p.v_stride && p.v_stride < p.kv_heads * p.v_size))
    return "a row stride of q, k or v is shorter than its row";
  if (!std::isfinite(p.scale) || !std::isfinite(p.softcap))
    return "scale and softcap must be finite";
  return nullptr;
}

const char* PagedAttention(const PagedProblem& p, ParallelFor parallel_for, void* runner) {
  if (const char* why = PagedAttentionCheck(p)) return why;
  if (p.tokens == 0) return nullptr;
  Shared k;
  k.p = &p;
  k.vectorized = Vectorized();
  try {
    k.tasks = Tasks(p);
  } catch (const std::bad_alloc&) {
    return "out of memory for the attention's task list";
  }
  for (const Task& task : k.tasks) {
    k.buffer_rows = std::max(k.buffer_rows, TaskRows(p, task));
    k.pack_heads = std::max(k.pack_heads, task.kvs);
  }
  k.pack_heads = std::min(k.pack_heads, std::max<int64_t>(
                                            1, kPackFloats / ((p.head_size + p.v_size) * kChunk)));
  const int64_t tasks = static_cast<int64_t>(k.tasks.size());
  k.parts = Parts(p, tasks);
  if (k.parts > 1) {
    try {
      k.partials.resize(static_cast<size_t>(k.parts * p.tokens * p.num_heads * (p.v_size + 2)));
    } catch (const std::bad_alloc&) {
      return "out of memory for the attention's partial rows";
    }
  }
  parallel_for(runner, NewKeysAndValues, &k, static_cast<size_t>(p.tokens));
  parallel_for(runner, Attend, &k, static_cast<size_t>(tasks * k.parts));
  if (k.parts > 1 && k.failure.load() != kBadSlot && k.failure.load() != kNoMemory)
    parallel_for(runner, Combine, &k, static_cast<size_t>(p.tokens));
  switch (k.failure.load()) {
    case kBadSequence:
      return "a token's sequence (token_seq) is not a row of seq_slots";
    case kBadSlot:
      return "a visible slot of seq_slots is outside the pool or this step's tokens";
    case kNoMemory:
      return "out of memory for a thread's attention rows";
    default:
      return nullptr;
  }
}

}  // namespace dayzero
