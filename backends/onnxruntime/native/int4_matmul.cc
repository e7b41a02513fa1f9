// The int4 x int8 kernel of int4_matmul.h: rows rounded once per call, then tiles of 8 columns
// split across the threads. Per pair of blocks, one 32-byte load holds a column's codes for both
// blocks; their low and high nibbles meet the activations' even and odd inputs (the rounding
// stores them in that order), so no shuffles are needed, and the zero point 8 is subtracted as
// 8 * (sum of the block's int8 activations), once per block instead of once per code.
#include "int4_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DZ_X86 1
#define DZ_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define DZ_X86 0
#endif

namespace dayzero {
namespace {

constexpr int64_t kPair = 2 * kInt4Block;      // inputs per pair of blocks
constexpr int64_t kTileBytes = 32;             // one column's codes for a pair of blocks
constexpr int64_t kRowTile = 32;               // rows whose int8 copies stay in L2 together
constexpr int64_t kTilesPerTask = 16;          // column tiles per thread-pool task
constexpr int64_t kPrefetchBytes = 32 * 256;   // 32 pairs of blocks ahead in a tile's stream
constexpr int64_t kMaxDim = int64_t{1} << 31;  // k and n; rows * n fits in int64 by far

// x rounded per block: for pair p of row r, `low` holds the pair's even inputs (block 2p's,
// then block 2p + 1's) and `high` the odd ones; `scale` and `offset` (8 * the block's sum of
// codes) are per block; `bad` marks rows holding NaN or Inf.
struct RoundedRows {
  std::vector<int8_t> low, high;
  std::vector<float> scale;
  std::vector<int32_t> offset;
  std::vector<uint8_t> bad;
};

void RoundRow(const Int4Problem& p, int64_t r, RoundedRows* out) {
  const float* x = p.x + r * p.k;
  const int64_t blocks = p.k / kInt4Block;
  for (int64_t i = 0; i < p.k; ++i) {
    if (!std::isfinite(x[i])) {
      out->bad[r] = 1;
      return;
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const float* v = x + b * kInt4Block;
    float top = 0.0f;
    for (int64_t i = 0; i < kInt4Block; ++i) top = std::max(top, std::fabs(v[i]));
    // the decomposition's arithmetic, step by step: s = top / 127, 1 / s, round(v * (1 / s))
    const float s = top / 127.0f;
    const float inverse = s > 0.0f ? 1.0f / s : 0.0f;
    const int64_t base = r * p.k / 2 + (b / 2) * kInt4Block + (b % 2) * (kInt4Block / 2);
    int32_t sum = 0;
    for (int64_t i = 0; i < kInt4Block / 2; ++i) {
      const auto even = static_cast<int8_t>(std::nearbyint(v[2 * i] * inverse));
      const auto odd = static_cast<int8_t>(std::nearbyint(v[2 * i + 1] * inverse));
      out->low[base + i] = even;
      out->high[base + i] = odd;
      sum += even + odd;
    }
    out->scale[r * blocks + b] = s;
    out->offset[r * blocks + b] = 8 * sum;
  }
}

struct Shared {
  const Int4Problem* p;
  const RoundedRows* rows;
  bool vectorized;
};

// A block scale as the products use it: an infinite one becomes NaN, because the
// decomposition's weights (code - 8) * Inf are NaN where the code is the zero point 8 (0 * Inf),
// and every block the quantizer makes from an infinite weight has such codes (its finite
// weights round to 8); w - w is 0 for a finite w and NaN otherwise.
inline float NaNIfInf(float w) { return w + (w - w); }

// An IEEE float16 (its bits) as a float: exact, subnormals, infinities and NaN included.
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const int exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  float magnitude;
  if (exponent == 0x1F) {
    magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN()
                         : std::numeric_limits<float>::infinity();
  } else {
    // normal: (1024 + m) * 2^(e - 25); subnormal (e == 0): m * 2^-24
    magnitude = exponent ? std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25)
                         : std::ldexp(static_cast<float>(mantissa), -24);
  }
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof(bits));
  bits |= sign;
  std::memcpy(&magnitude, &bits, sizeof(bits));
  return magnitude;
}

// One tile (8 columns) of row r, any CPU: the same sums in the same order per block.
void TileScalar(const Shared& s, int64_t r, int64_t tile, float out[kInt4Columns]) {
  const Int4Problem& p = *s.p;
  const RoundedRows& q = *s.rows;
  const int64_t blocks = p.k / kInt4Block, pairs = p.k / kPair;
  for (int64_t c = 0; c < kInt4Columns; ++c) out[c] = 0.0f;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t pair = b / 2, half = b % 2;
    const int8_t* low = q.low.data() + r * p.k / 2 + pair * kInt4Block + half * 16;
    const int8_t* high = q.high.data() + r * p.k / 2 + pair * kInt4Block + half * 16;
    const float row_scale = q.scale[r * blocks + b];
    for (int64_t c = 0; c < kInt4Columns; ++c) {
      const uint8_t* code = p.codes + ((tile * pairs + pair) * kInt4Columns + c) * kTileBytes +
                            half * 16;
      int32_t dot = 0;
      for (int64_t i = 0; i < 16; ++i) dot += (code[i] & 15) * low[i] + (code[i] >> 4) * high[i];
      const float w = HalfToFloat(p.scales[(tile * blocks + b) * kInt4Columns + c]);
      out[c] += static_cast<float>(dot - q.offset[r * blocks + b]) * (row_scale * NaNIfInf(w));
    }
  }
}

#if DZ_X86
// A column's int32 partial sums for a pair of blocks: lanes 0-3 block 2p, lanes 4-7 block 2p+1.
DZ_AVX2 inline __m256i PairDot(const uint8_t* codes, __m256i low, __m256i high) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes));
  const __m256i lo = _mm256_and_si256(v, mask);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
  // codes 0..15 times int8 in [-127, 127]: each int16 sum stays within +-7620
  const __m256i sum = _mm256_add_epi16(_mm256_maddubs_epi16(lo, low),
                                       _mm256_maddubs_epi16(hi, high));
  return _mm256_madd_epi16(sum, _mm256_set1_epi16(1));
}

// Per 128-bit half, the sums of the 4 lanes of a, b, c and d, in that order.
DZ_AVX2 inline __m256i SumLanes(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
  const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
}

DZ_AVX2 void TileVectorized(const Shared& s, int64_t r, int64_t tile, float out[kInt4Columns]) {
  const Int4Problem& p = *s.p;
  const RoundedRows& q = *s.rows;
  const int64_t blocks = p.k / kInt4Block, pairs = p.k / kPair;
  const int8_t* low = q.low.data() + r * p.k / 2;
  const int8_t* high = q.high.data() + r * p.k / 2;
  const float* row_scale = q.scale.data() + r * blocks;
  const int32_t* offset = q.offset.data() + r * blocks;
  const uint8_t* codes = p.codes + tile * pairs * kInt4Columns * kTileBytes;
  const uint16_t* scales = p.scales + tile * blocks * kInt4Columns;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const __m256i a_low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(low + pair * 32));
    const __m256i a_high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high + pair * 32));
    const uint8_t* c = codes + pair * kInt4Columns * kTileBytes;
    // the stream's next lines, well ahead: measured 15% faster than the hardware prefetcher
    // alone at one row (prefetching past the end of the codes is harmless: no fault)
    const char* ahead = reinterpret_cast<const char*>(c) + kPrefetchBytes;
    for (int line = 0; line < kInt4Columns * kTileBytes; line += 64)
      _mm_prefetch(ahead + line, _MM_HINT_T0);
    __m256i dots[kInt4Columns];
    for (int64_t col = 0; col < kInt4Columns; ++col)
      dots[col] = PairDot(c + col * kTileBytes, a_low, a_high);
    // each column's 4 lanes per block summed: [columns 0-3 of block 2p | of block 2p+1], then
    // the same for columns 4-7 (unpack and add: cheaper than horizontal adds)
    const __m256i first = SumLanes(dots[0], dots[1], dots[2], dots[3]);
    const __m256i second = SumLanes(dots[4], dots[5], dots[6], dots[7]);
    const int64_t b = 2 * pair;
    const __m256i even = _mm256_sub_epi32(_mm256_permute2x128_si256(first, second, 0x20),
                                          _mm256_set1_epi32(offset[b]));
    const __m256i odd = _mm256_sub_epi32(_mm256_permute2x128_si256(first, second, 0x31),
                                         _mm256_set1_epi32(offset[b + 1]));
    const __m256 s_even = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + b * kInt4Columns)));
    const __m256 s_odd = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + (b + 1) * kInt4Columns)));
    const __m256 w_even = _mm256_mul_ps(_mm256_add_ps(s_even, _mm256_sub_ps(s_even, s_even)),
                                        _mm256_set1_ps(row_scale[b]));  // NaNIfInf
    const __m256 w_odd = _mm256_mul_ps(_mm256_add_ps(s_odd, _mm256_sub_ps(s_odd, s_odd)),
                                       _mm256_set1_ps(row_scale[b + 1]));
    acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(even), w_even, acc0);
    acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(odd), w_odd, acc1);
  }
  _mm256_storeu_ps(out, _mm256_add_ps(acc0, acc1));
}
#endif

// Task `index`: kTilesPerTask column tiles, for every row, a row tile at a time (the tiles'
// codes stay in cache while the rows go by).
void RunTask(void* data, size_t index) {
  const Shared& s = *static_cast<const Shared*>(data);
  const Int4Problem& p = *s.p;
  const int64_t tiles = p.n / kInt4Columns;
  const int64_t first = static_cast<int64_t>(index) * kTilesPerTask;
  const int64_t last = std::min(tiles, first + kTilesPerTask);
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  float out[kInt4Columns];
  for (int64_t r0 = 0; r0 < p.rows; r0 += kRowTile) {
    const int64_t r1 = std::min(p.rows, r0 + kRowTile);
    for (int64_t tile = first; tile < last; ++tile) {
      for (int64_t r = r0; r < r1; ++r) {
        float* y = p.y + r * p.n + tile * kInt4Columns;
        if (s.rows->bad[r]) {
          for (int64_t c = 0; c < kInt4Columns; ++c) y[c] = kNaN;
          continue;
        }
#if DZ_X86
        if (s.vectorized) {
          TileVectorized(s, r, tile, out);
        } else {
          TileScalar(s, r, tile, out);
        }
#else
        TileScalar(s, r, tile, out);
#endif
        for (int64_t c = 0; c < kInt4Columns; ++c) {
          y[c] = p.bias ? out[c] + p.bias[tile * kInt4Columns + c] : out[c];
        }
      }
    }
  }
}

void RoundTask(void* data, size_t index) {
  auto* s = static_cast<std::pair<const Int4Problem*, RoundedRows*>*>(data);
  RoundRow(*s->first, static_cast<int64_t>(index), s->second);
}

}  // namespace

bool Int4MatMulVectorized() {
#if DZ_X86
  static const bool supported = __builtin_cpu_supports("avx2") &&
                                 __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return supported;
#else
  return false;
#endif
}

const char* Int4MatMulCheck(const Int4Problem& p) {
  if (p.rows < 0) return "x has a negative number of rows";
  if (p.k <= 0 || p.k % kPair || p.k >= kMaxDim)
    return "in_features must be a positive multiple of 64";
  if (p.n <= 0 || p.n % kInt4Columns || p.n >= kMaxDim)
    return "out_features must be a positive multiple of 8";
  return nullptr;
}

const char* Int4MatMul(const Int4Problem& p, ParallelFor parallel, void* runner,
                       bool vectorized) {
  if (const char* why = Int4MatMulCheck(p)) return why;
  if (p.rows == 0) return nullptr;
  try {
    RoundedRows rows;
    rows.low.resize(static_cast<size_t>(p.rows * p.k / 2));
    rows.high.resize(rows.low.size());
    rows.scale.resize(static_cast<size_t>(p.rows * p.k / kInt4Block));
    rows.offset.resize(rows.scale.size());
    rows.bad.assign(static_cast<size_t>(p.rows), 0);
    std::pair<const Int4Problem*, RoundedRows*> round{&p, &rows};
    if (p.rows == 1) {
      RoundTask(&round, 0);
    } else {
      parallel(runner, RoundTask, &round, static_cast<size_t>(p.rows));
    }
    Shared shared{&p, &rows, vectorized && Int4MatMulVectorized()};
    const int64_t tiles = p.n / kInt4Columns;
    parallel(runner, RunTask, &shared,
             static_cast<size_t>((tiles + kTilesPerTask - 1) / kTilesPerTask));
  } catch (const std::bad_alloc&) {
    return "out of memory for the rounded rows";
  }
  return nullptr;
}

}  // namespace dayzero
