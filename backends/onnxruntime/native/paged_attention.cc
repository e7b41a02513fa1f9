// Paged attention of a generation step: see paged_attention.h for what and why.
//
// Two parallel phases. The first (one task per token) rotates the step's new keys into `new_k`
// and copies its values into `new_v`: those are outputs anyway (the runtime writes them into the
// pool), and the second phase reads a new token's key from there, exactly as it reads a cached
// key from the pool. The second has one task per block of kTokenTile consecutive tokens, kv head
// and tile of up to kHeadTile of the query heads that share it (GQA: each scattered key and value
// row is fetched from memory once for its whole group, not once per query head; a decode step is
// bound by those fetches; and once for a block of a prompt chunk's tokens, which see the same
// keys, so a long prompt is not bound by them either). A task rotates its query rows, then walks
// its tokens' visible keys in chunks of kChunk, each token taking the part it sees:
// it prefetches the next chunk's rows into L2, locates this chunk's, scores them (each 8
// channels of a key loaded once for the whole tile), raises each head's running maximum
// once per chunk (one rescale of the accumulator, not one per key), and adds the chunk's
// weighted value rows (8 output channels of every head kept in registers over the chunk).
// The AVX2 + FMA functions run where the CPU has them, the scalar ones elsewhere. The tasks'
// query and accumulator rows are one allocation made before the parallel phase.
//
// Non-finite numbers: the maxima keep NaN, so a NaN score makes the row NaN as the softmax does;
// +Inf scores make Inf - Inf = NaN as there; a chunk whose scores are all -Inf while the running
// maximum is still -Inf weighs 0 (the decomposition's exp(-inf - max) once a finite score comes,
// and a NaN row through 0 / 0 if none does); rescaling by exp(old - new) = 0 turns an Inf that
// earlier values put in the accumulator into NaN, as the dense product's 0 * Inf does.
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

constexpr int64_t kChunk = 32;  // keys scored before the running maximum is updated
constexpr int64_t kHeadTile = 8;  // query heads of one kv head per task
constexpr int64_t kTokenTile = 8;  // consecutive tokens per task: they share each key chunk
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

enum Failure : int { kNone = 0, kBadSequence = 1, kBadSlot = 2 };

// The tasks' query and accumulator rows: one block of kTokenTile x kHeadTile rows per task, in
// one allocation made before the parallel phase (a task's rows are too large for its stack).
struct Shared {
  const PagedProblem* p;
  bool vectorized;
  std::atomic<int> failure{kNone};
  std::vector<float> rows;
  int64_t task_floats = 0;
  float* scratch(size_t task) { return rows.data() + task * task_floats; }
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

// A chunk's visible rows: up to kChunk key rows and their value rows.
struct Chunk {
  const float* keys[kChunk];
  const float* values[kChunk];
  int64_t n;
};

// scores[r][i] = q[r] . keys[i] for the tile's `heads` query rows, without SIMD.
void ScoreScalar(int64_t heads, float* const* q, const Chunk& c, int64_t size,
                 float (*scores)[kChunk]) {
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t r = 0; r < heads; ++r) {
      float acc = 0.0f;
      for (int64_t d = 0; d < size; ++d) acc += q[r][d] * c.keys[i][d];
      scores[r][i] = acc;
    }
  }
}

// acc[r] += sum over i of probs[r][i] * values[i], without SIMD.
void WeighScalar(int64_t heads, float* const* acc, const Chunk& c, int64_t v_size,
                 const float (*probs)[kChunk]) {
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t r = 0; r < heads; ++r) {
      for (int64_t d = 0; d < v_size; ++d) acc[r][d] += probs[r][i] * c.values[i][d];
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

// ScoreScalar for R query rows: each 8 channels of a key are loaded once for all R rows.
template <int R>
DZ_PAGED_AVX2 void ScoreAvx2(float* const* q, const Chunk& c, int64_t size,
                             float (*scores)[kChunk]) {
  for (int64_t i = 0; i < c.n; ++i) {
    const float* key = c.keys[i];
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 8 <= size; d += 8) {
      const __m256 k = _mm256_loadu_ps(key + d);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + d), k, acc[r]);
    }
    for (int r = 0; r < R; ++r) {
      float sum = HorizontalSum(acc[r]);
      for (int64_t e = d; e < size; ++e) sum += q[r][e] * key[e];
      scores[r][i] = sum;
    }
  }
}

// WeighScalar for R rows: 8 output channels of every row stay in registers over the chunk's
// values, so the output rows are read and written once per chunk, not once per key.
template <int R>
DZ_PAGED_AVX2 void WeighAvx2(float* const* acc, const Chunk& c, int64_t v_size,
                             const float (*probs)[kChunk]) {
  int64_t d = 0;
  for (; d + 8 <= v_size; d += 8) {
    __m256 sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_loadu_ps(acc[r] + d);
    for (int64_t i = 0; i < c.n; ++i) {
      const __m256 v = _mm256_loadu_ps(c.values[i] + d);
      for (int r = 0; r < R; ++r)
        sum[r] = _mm256_fmadd_ps(_mm256_set1_ps(probs[r][i]), v, sum[r]);
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(acc[r] + d, sum[r]);
  }
  for (; d < v_size; ++d) {
    for (int64_t i = 0; i < c.n; ++i) {
      for (int r = 0; r < R; ++r) acc[r][d] += probs[r][i] * c.values[i][d];
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

using ScoreFn = void (*)(float* const*, const Chunk&, int64_t, float (*)[kChunk]);
using WeighFn = void (*)(float* const*, const Chunk&, int64_t, const float (*)[kChunk]);
// Indexed by the tile's number of query heads, 1 to kHeadTile.
static_assert(kHeadTile == 8, "one ScoreAvx2 and WeighAvx2 per tile size");
constexpr ScoreFn kScoreAvx2[kHeadTile + 1] = {
    nullptr, ScoreAvx2<1>, ScoreAvx2<2>, ScoreAvx2<3>, ScoreAvx2<4>,
    ScoreAvx2<5>, ScoreAvx2<6>, ScoreAvx2<7>, ScoreAvx2<8>};
constexpr WeighFn kWeighAvx2[kHeadTile + 1] = {
    nullptr, WeighAvx2<1>, WeighAvx2<2>, WeighAvx2<3>, WeighAvx2<4>,
    WeighAvx2<5>, WeighAvx2<6>, WeighAvx2<7>, WeighAvx2<8>};
#endif

void Score(bool vectorized, int64_t heads, float* const* q, const Chunk& c, int64_t size,
           float (*scores)[kChunk]) {
#if DZ_PAGED_X86
  if (vectorized) return kScoreAvx2[heads](q, c, size, scores);
#endif
  (void)vectorized;
  ScoreScalar(heads, q, c, size, scores);
}

void Weigh(bool vectorized, int64_t heads, float* const* acc, const Chunk& c, int64_t v_size,
           const float (*probs)[kChunk]) {
#if DZ_PAGED_X86
  if (vectorized) return kWeighAvx2[heads](acc, c, v_size, probs);
#endif
  (void)vectorized;
  WeighScalar(heads, acc, c, v_size, probs);
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

// Phase 1: token t's rotated keys and its values, in the pool's [kv_heads, size] row layout.
void NewKeysAndValues(void* data, size_t index) noexcept {
  const PagedProblem& p = *static_cast<Shared*>(data)->p;
  const int64_t t = static_cast<int64_t>(index);
  const float* c = p.cos ? p.cos + t * p.head_size : nullptr;
  const float* s = p.sin ? p.sin + t * p.head_size : nullptr;
  for (int64_t g = 0; g < p.kv_heads; ++g) {
    RotateHead(p.k + (t * p.kv_heads + g) * p.head_size, c, s, p.head_size,
               p.new_k + (t * p.kv_heads + g) * p.head_size);
  }
  const float* v = p.v + t * p.kv_heads * p.v_size;
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

// Prefetches the key and value rows of slots [first, last) of kv head g (the next chunk, while
// this one is computed); slots that Locate refuses are skipped here and reported there.
void PrefetchChunk(const PagedProblem& p, const int64_t* slots, int64_t first, int64_t last,
                   int64_t g) {
  for (int64_t j = first; j < last; ++j) {
    const float *key, *value;
    if (slots[j] != -1 && Locate(p, slots[j], g, &key, &value)) {
      Prefetch(key, p.head_size);
      Prefetch(value, p.v_size);
    }
  }
}

inline int64_t Tiles(const PagedProblem& p) {
  return (p.num_heads / p.kv_heads + kHeadTile - 1) / kHeadTile;
}

inline int64_t TokenBlocks(const PagedProblem& p) {
  return (p.tokens + kTokenTile - 1) / kTokenTile;
}

// One token's rows of a task: its up to kHeadTile query heads' queries, accumulators and
// online-softmax state, and the key positions [begin, end) of its sequence it sees.
struct TokenRows {
  float* q[kHeadTile];
  float* acc[kHeadTile];
  float peak[kHeadTile], sum[kHeadTile];
  int64_t begin, end;
  float* out;
};

// The entries of `chunk` (visible slots in key-position order, positions in `pos`) that fall in
// [begin, end): a contiguous range, since both are ordered by position.
inline Chunk Visible(const Chunk& chunk, const int64_t* pos, int64_t begin, int64_t end) {
  int64_t lo = 0, hi = chunk.n;
  while (lo < chunk.n && pos[lo] < begin) ++lo;
  while (hi > lo && pos[hi - 1] >= end) --hi;
  Chunk part;
  part.n = hi - lo;
  for (int64_t i = 0; i < part.n; ++i) {
    part.keys[i] = chunk.keys[lo + i];
    part.values[i] = chunk.values[lo + i];
  }
  return part;
}

// Online softmax of one token's rows over the visible part of a chunk.
void AttendChunk(const Shared& k, const PagedProblem& p, int64_t heads, TokenRows& rows,
                 const Chunk& part) {
  float scores[kHeadTile][kChunk];
  const int64_t n = part.n, v_size = p.v_size;
  Score(k.vectorized, heads, rows.q, part, p.head_size, scores);
  for (int64_t r = 0; r < heads; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      scores[r][i] *= p.scale;
      if (p.softcap != 0.0f) scores[r][i] = std::tanh(scores[r][i] / p.softcap) * p.softcap;
    }
    float top = rows.peak[r];
    for (int64_t i = 0; i < n; ++i) top = MaxKeepNaN(top, scores[r][i]);
    if (!(top == rows.peak[r])) {  // a new maximum, or NaN: rescale what was accumulated
      const float alpha = std::exp(rows.peak[r] - top);
      for (int64_t d = 0; d < v_size; ++d) rows.acc[r][d] *= alpha;
      rows.sum[r] *= alpha;
      rows.peak[r] = top;
    }
    rows.sum[r] += ExpWeights(k.vectorized, scores[r], n, rows.peak[r]);
  }
  Weigh(k.vectorized, heads, rows.acc, part, v_size, scores);
}

// Tokens [t0, t1) of one sequence, their `heads` query heads from `first` (sharing kv head g):
// the keys of the union of their visible ranges are walked once, chunk by chunk, and each token
// attends to the part of a chunk it sees (so a prompt chunk's tokens read each key row from
// memory once, not once per token; a hidden key is never read for a row that does not see it).
// False when a slot is outside the pool and the step's tokens.
bool AttendRun(const Shared& k, const PagedProblem& p, int64_t t0, int64_t t1, int64_t g,
               int64_t first, int64_t heads, float* scratch) {
  const int64_t size = p.head_size, v_size = p.v_size;
  const int64_t* slots = p.seq_slots + p.token_seq[t0] * p.length;
  TokenRows rows[kTokenTile];
  int64_t begin = p.length, end = 0;
  for (int64_t t = t0; t < t1; ++t) {
    TokenRows& row = rows[t - t0];
    const int64_t seen = p.token_len[t];
    row.end = std::min(seen, p.length);
    row.begin = p.window > 0 ? std::max<int64_t>(0, seen - p.window) : 0;
    begin = std::min(begin, row.begin);
    end = std::max(end, row.end);
    row.out = p.out + (t * p.num_heads + first) * v_size;
    const float* c = p.cos ? p.cos + t * size : nullptr;
    const float* s = p.sin ? p.sin + t * size : nullptr;
    for (int64_t r = 0; r < heads; ++r) {
      // rows packed at their own width: a 4 kB stride would put them in the same L1 sets
      row.q[r] = scratch + ((t - t0) * kHeadTile + r) * (size + v_size);
      row.acc[r] = row.q[r] + size;
      RotateHead(p.q + (t * p.num_heads + first + r) * size, c, s, size, row.q[r]);
      std::fill(row.acc[r], row.acc[r] + v_size, 0.0f);
      row.peak[r] = kNegInf;
      row.sum[r] = 0.0f;
    }
  }
  Chunk chunk;
  int64_t pos[kChunk];
  PrefetchChunk(p, slots, begin, std::min(begin + kChunk, end), g);
  for (int64_t j0 = begin; j0 < end; j0 += kChunk) {
    PrefetchChunk(p, slots, j0 + kChunk, std::min(j0 + 2 * kChunk, end), g);
    chunk.n = 0;
    for (int64_t j = j0; j < std::min(j0 + kChunk, end); ++j) {
      if (slots[j] == -1) continue;  // padding: hidden
      if (!Locate(p, slots[j], g, &chunk.keys[chunk.n], &chunk.values[chunk.n])) return false;
      pos[chunk.n++] = j;
    }
    for (int64_t t = t0; t < t1; ++t) {
      const Chunk part = Visible(chunk, pos, rows[t - t0].begin, rows[t - t0].end);
      if (part.n > 0) AttendChunk(k, p, heads, rows[t - t0], part);
    }
  }
  for (int64_t t = t0; t < t1; ++t) {
    const TokenRows& row = rows[t - t0];
    for (int64_t r = 0; r < heads; ++r) {
      const float inv = 1.0f / row.sum[r];  // Inf when no key weighed anything: 0 * Inf is NaN
      for (int64_t d = 0; d < v_size; ++d) row.out[r * v_size + d] = row.acc[r][d] * inv;
    }
  }
  return true;
}

// Phase 2: a block of up to kTokenTile consecutive tokens, kv head g, a tile of up to kHeadTile
// of its query heads; the block's tokens are taken run by run of one sequence (AttendRun).
void Attend(void* data, size_t index) noexcept {
  Shared& k = *static_cast<Shared*>(data);
  const PagedProblem& p = *k.p;
  const int64_t tiles = Tiles(p), group = p.num_heads / p.kv_heads;
  const int64_t block = static_cast<int64_t>(index) / (p.kv_heads * tiles);
  const int64_t g = static_cast<int64_t>(index) / tiles % p.kv_heads;
  const int64_t first = g * group + static_cast<int64_t>(index) % tiles * kHeadTile;
  const int64_t heads = std::min(kHeadTile, (g + 1) * group - first);
  const int64_t t_end = std::min(p.tokens, (block + 1) * kTokenTile);
  float* scratch = k.scratch(index);
  for (int64_t t0 = block * kTokenTile; t0 < t_end;) {
    const int64_t seq = p.token_seq[t0];
    int64_t t1 = t0 + 1;
    while (t1 < t_end && p.token_seq[t1] == seq) ++t1;
    if (seq < 0 || seq >= p.sequences) {
      Fail(k, kBadSequence);
      for (int64_t t = t0; t < t1; ++t)
        std::fill_n(p.out + (t * p.num_heads + first) * p.v_size, heads * p.v_size, kNaN);
    } else if (!AttendRun(k, p, t0, t1, g, first, heads, scratch)) {
      return Fail(k, kBadSlot);
    }
    t0 = t1;
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
  const int64_t tasks = TokenBlocks(p) * p.kv_heads * Tiles(p);
  k.task_floats = kTokenTile * kHeadTile * (p.head_size + p.v_size);
  try {
    k.rows.resize(static_cast<size_t>(tasks * k.task_floats));
  } catch (const std::bad_alloc&) {
    return "out of memory for the attention's query and accumulator rows";
  }
  parallel_for(runner, NewKeysAndValues, &k, static_cast<size_t>(p.tokens));
  parallel_for(runner, Attend, &k, static_cast<size_t>(tasks));
  switch (k.failure.load()) {
    case kBadSequence:
      return "a token's sequence (token_seq) is not a row of seq_slots";
    case kBadSlot:
      return "a visible slot of seq_slots is outside the pool or this step's tokens";
    default:
      return nullptr;
  }
}

}  // namespace dayzero
