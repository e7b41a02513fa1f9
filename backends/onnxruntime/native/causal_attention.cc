// Causal grouped-query attention: see causal_attention.h for what and why.
//
// Two parallel phases. The first (one task per batch row and block of 16 tokens) rotates k into
// chunks of 16 keys, each [head_size, 16] and contiguous, so that the score loop reads 16 keys
// of one channel as two vectors from one 2 kB block, and copies v into contiguous rows (the
// input's rows are a packed projection's width apart: a power of two that would map every row
// to the same few L1 sets). The second has one task per batch row, query head and pair of query
// blocks (blocks i and n - 1 - i, so that every task sees the same number of keys): it rotates
// and scales its query rows, scores them against keys [0, end of block) with the future masked,
// takes each row's softmax and multiplies by v. The scratch is the packed k and v (shared) and,
// per thread, one block's q, scores and output.
//
// Non-finite numbers: every max keeps NaN (a NaN score makes its row NaN, as softmax does), the
// exp keeps NaN, and the rows before a non-finite v value, which mask it and never read it here,
// are set to NaN afterwards in the channels it is in, as the dense product's 0 * Inf does.
#include "causal_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define DZ_X86 1
#define DZ_AVX2 __attribute__((target("avx2,fma")))
#else
#define DZ_X86 0
#endif

namespace dayzero {
namespace {

constexpr int64_t kBlock = 16;     // query rows per block, and the key padding
constexpr int64_t kKeyRun = 128;   // v rows (kKeyRun x head_size floats) reused from L1
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

std::atomic<int64_t> retained_bytes{0};

// A buffer a thread keeps between calls, so that steady-state calls allocate nothing; Trim
// releases it when it grew past kKeepScratchBytes, so that one long prompt does not pin its
// memory for the life of the thread.
class KeptBuffer {
 public:
  ~KeptBuffer() { Release(); }
  float* Get(size_t floats) {  // may throw std::bad_alloc
    const size_t before = data_.capacity();
    data_.resize(floats);
    retained_bytes += static_cast<int64_t>((data_.capacity() - before) * sizeof(float));
    return data_.data();
  }
  void Trim() {
    if (static_cast<int64_t>(data_.capacity() * sizeof(float)) > kKeepScratchBytes) Release();
  }

 private:
  void Release() {
    retained_bytes -= static_cast<int64_t>(data_.capacity() * sizeof(float));
    std::vector<float>().swap(data_);
  }
  std::vector<float> data_;
};

// Per-thread buffers of one query block: rotated q (kBlock x head_size), scores then
// probabilities (kBlock x padded), output before the softmax's 1 / sum (kBlock x head_size).
struct Scratch {
  KeptBuffer q, scores, acc;
};

// Pointers into a thread's Scratch, sized for one block of this problem.
struct BlockScratch {
  float *q, *scores, *acc;
};

struct Shared {
  const AttentionProblem* p;
  int64_t padded;  // seq rounded up to kBlock
  float* kt;       // rotated k: [batch, kv_heads, padded / 16, head_size, 16]
  float* v;        // v: [batch, kv_heads, padded, head_size]
  // [batch, kv_heads, padded / kBlock]: whether that block of v rows holds a NaN or Inf
  uint8_t* v_nonfinite;
  bool vectorized;
  std::atomic<bool> failed{false};  // a task ran out of memory; the others skip their work
};

// One head of one token, rotated (when there are tables) and scaled, into contiguous `dst`.
void RotateHead(const AttentionProblem& p, const float* src, int64_t position, float scale,
                float* dst) {
  const int64_t size = p.head_size;
  const int64_t half = p.cos ? p.rotary_half : 0;
  const float* c = p.cos ? p.cos + position * half : nullptr;
  const float* s = p.sin ? p.sin + position * half : nullptr;
  if (p.interleaved) {
    for (int64_t i = 0; i < half; ++i) {
      dst[2 * i] = (src[2 * i] * c[i] - src[2 * i + 1] * s[i]) * scale;
      dst[2 * i + 1] = (src[2 * i + 1] * c[i] + src[2 * i] * s[i]) * scale;
    }
  } else {  // two separate loops over contiguous halves, so that they vectorize
    for (int64_t i = 0; i < half; ++i) dst[i] = (src[i] * c[i] - src[i + half] * s[i]) * scale;
    for (int64_t i = 0; i < half; ++i)
      dst[i + half] = (src[i + half] * c[i] + src[i] * s[i]) * scale;
  }
  for (int64_t d = 2 * half; d < size; ++d) dst[d] = src[d] * scale;
}

// Where key t's channel d lives among its kv head's chunks of 16 keys.
inline int64_t KeyIndex(int64_t t, int64_t d, int64_t size) {
  return (t / 16) * size * 16 + d * 16 + t % 16;
}

void PackKeysAndValues(void* data, size_t index) {
  const Shared& k = *static_cast<const Shared*>(data);
  const AttentionProblem& p = *k.p;
  const int64_t blocks = k.padded / kBlock;
  const int64_t b = static_cast<int64_t>(index) / blocks;
  const int64_t first = static_cast<int64_t>(index) % blocks * kBlock;
  const int64_t size = p.head_size;
  float rotated[kMaxHeadSize];
  for (int64_t g = 0; g < p.kv_heads; ++g) {
    float* kt = k.kt + (b * p.kv_heads + g) * size * k.padded;
    float* v = k.v + (b * p.kv_heads + g) * k.padded * size;
    bool nonfinite = false;
    for (int64_t t = first; t < first + kBlock; ++t) {
      if (t < p.seq) {
        RotateHead(p, p.k.data + b * p.k.batch_stride + t * p.k.token_stride + g * size, t,
                   1.0f, rotated);
        const float* src = p.v.data + b * p.v.batch_stride + t * p.v.token_stride + g * size;
        std::copy(src, src + size, v + t * size);
        // x - x is 0 for finite x and NaN for NaN and Inf: one test per row, no branch per value
        float probe = 0.0f;
        for (int64_t d = 0; d < size; ++d) probe += src[d] - src[d];
        nonfinite |= probe != 0.0f;
      } else {  // padding: keys that every row masks (their values are never read)
        std::fill(rotated, rotated + size, 0.0f);
      }
      for (int64_t d = 0; d < size; ++d) kt[KeyIndex(t, d, size)] = rotated[d];
    }
    k.v_nonfinite[(b * p.kv_heads + g) * blocks + first / kBlock] = nonfinite;
  }
}

// The dense product weighs every v row, the masked ones by exactly 0, and 0 * Inf and 0 * NaN
// are NaN: so output row i is NaN in channel d when v holds a non-finite value in channel d at a
// token after i. The blocks skip those tokens; this puts the NaN where the math has it.
void PoisonMaskedNonFinite(const Shared& k, int64_t b, int64_t h, int64_t first, int64_t last) {
  const AttentionProblem& p = *k.p;
  const int64_t size = p.head_size, blocks = k.padded / kBlock;
  const int64_t g = h / (p.num_heads / p.kv_heads);
  const uint8_t* flags = k.v_nonfinite + (b * p.kv_heads + g) * blocks;
  if (std::none_of(flags + first / kBlock, flags + blocks, [](uint8_t f) { return f; })) return;
  const float* v = k.v + (b * p.kv_heads + g) * k.padded * size;
  for (int64_t d = 0; d < size; ++d) {
    int64_t t = p.seq - 1;  // the last token with a non-finite v in channel d, if after first
    while (t > first && std::isfinite(v[t * size + d])) --t;
    for (int64_t i = first; i < std::min(t, last); ++i)
      p.out[(b * p.seq + i) * p.num_heads * size + h * size + d] = kNaN;
  }
}

// Rows [first, last) of query head h, rotated and scaled, into `q` ([rows, head_size]).
void PrepareQueries(const AttentionProblem& p, int64_t b, int64_t h, int64_t first,
                    int64_t last, float* q) {
  for (int64_t t = first; t < last; ++t) {
    const float* src = p.q.data + b * p.q.batch_stride + t * p.q.token_stride + h * p.head_size;
    RotateHead(p, src, t, p.scale, q + (t - first) * p.head_size);
  }
}

// Softmax of one row's first `valid` scores, in place; the rest of [0, width) become 0.
// Returns 1 / sum so that the caller can scale the row's output once.
float SoftmaxRowScalar(float* row, int64_t valid, int64_t width) {
  float peak = row[0];  // NaN when any score is NaN (std::max would drop a NaN in row[j])
  for (int64_t j = 1; j < valid; ++j)
    if (row[j] > peak || std::isnan(row[j])) peak = std::isnan(peak) ? peak : row[j];
  float sum = 0.0f;
  for (int64_t j = 0; j < valid; ++j) {
    row[j] = std::exp(row[j] - peak);
    sum += row[j];
  }
  for (int64_t j = valid; j < width; ++j) row[j] = 0.0f;
  return 1.0f / sum;
}

// One query block [first, last) of head h in batch row b, without SIMD.
void BlockScalar(const Shared& k, int64_t b, int64_t h, int64_t first, int64_t last,
                 const BlockScratch& scratch) {
  const AttentionProblem& p = *k.p;
  const int64_t size = p.head_size;
  const int64_t g = h / (p.num_heads / p.kv_heads);
  const float* kt = k.kt + (b * p.kv_heads + g) * size * k.padded;
  const float* v = k.v + (b * p.kv_heads + g) * k.padded * size;
  float* row = scratch.scores;
  for (int64_t i = first; i < last; ++i) {
    const float* q = scratch.q + (i - first) * size;
    for (int64_t j = 0; j <= i; ++j) {
      float acc = 0.0f;
      for (int64_t d = 0; d < size; ++d) acc += q[d] * kt[KeyIndex(j, d, size)];
      row[j] = acc;
    }
    const float inv = SoftmaxRowScalar(row, i + 1, i + 1);
    float* out = p.out + (b * p.seq + i) * p.num_heads * size + h * size;
    for (int64_t d = 0; d < size; ++d) {
      float acc = 0.0f;
      for (int64_t j = 0; j <= i; ++j) acc += row[j] * v[j * size + d];
      out[d] = acc * inv;
    }
  }
}

#if DZ_X86
// max(a, b) that is NaN when either is: _mm256_max_ps returns its second operand when either is
// NaN, so a NaN in `a` would be lost; OR-ing in the unordered mask makes those lanes NaN.
DZ_AVX2 inline __m256 MaxKeepNaN(__m256 a, __m256 b) {
  return _mm256_or_ps(_mm256_max_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}

DZ_AVX2 inline __m128 MaxKeepNaN(__m128 a, __m128 b) {
  return _mm_or_ps(_mm_max_ps(a, b), _mm_cmp_ps(a, b, _CMP_UNORD_Q));
}

// exp(x) for x <= 0 (softmax arguments): 2^n * e^r with |r| <= ln2 / 2 and a degree-6 Taylor
// polynomial for e^r (relative error below 2e-7); arguments under -87.3 flush to 0, and NaN stays
// NaN (the clamp takes x as max's second operand, which max returns when either is NaN).
DZ_AVX2 inline __m256 ExpNonPositive(__m256 x) {
  const __m256 low = _mm256_set1_ps(-87.3f);
  const __m256 flush = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  x = _mm256_max_ps(low, x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 poly = _mm256_set1_ps(1.0f / 720);
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.0f / 120));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.0f / 24));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.0f / 6));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(0.5f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.0f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(flush, _mm256_mul_ps(poly, _mm256_castsi256_ps(bits)));
}

DZ_AVX2 inline float HorizontalMax(__m256 x) {  // NaN when any lane is
  __m128 m = MaxKeepNaN(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  m = MaxKeepNaN(m, _mm_movehl_ps(m, m));
  m = MaxKeepNaN(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

DZ_AVX2 inline float HorizontalSum(__m256 x) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Scores of ROWS query rows against the 16 keys [j, j + 16). Row r is query `row + r` and sees
// keys [0, row + r]; the others score -inf. Running row maxima (8 lanes each) go to `peaks`, so
// that the softmax needs one pass.
template <int ROWS>
DZ_AVX2 void ScoreChunk(const float* q, int64_t size, const float* chunk, int64_t j,
                        int64_t row, float* scores, int64_t width, __m256* peaks) {
  __m256 acc[ROWS][2];
  for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < size; ++d) {
    const __m256 k0 = _mm256_loadu_ps(chunk + d * 16);
    const __m256 k1 = _mm256_loadu_ps(chunk + d * 16 + 8);
    for (int r = 0; r < ROWS; ++r) {
      const __m256 a = _mm256_broadcast_ss(q + r * size + d);
      acc[r][0] = _mm256_fmadd_ps(a, k0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, k1, acc[r][1]);
    }
  }
  const __m256 masked = _mm256_set1_ps(-INFINITY);
  if (j + 16 > row + 1) {  // the diagonal: some of these keys are in some row's future
    const __m256i key0 = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32(static_cast<int>(j)));
    const __m256i key1 = _mm256_add_epi32(key0, _mm256_set1_epi32(8));
    for (int r = 0; r < ROWS; ++r) {
      const __m256i last = _mm256_set1_epi32(static_cast<int>(row + r));
      acc[r][0] = _mm256_blendv_ps(acc[r][0], masked,
                                   _mm256_castsi256_ps(_mm256_cmpgt_epi32(key0, last)));
      acc[r][1] = _mm256_blendv_ps(acc[r][1], masked,
                                   _mm256_castsi256_ps(_mm256_cmpgt_epi32(key1, last)));
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    _mm256_storeu_ps(scores + r * width + j, acc[r][0]);
    _mm256_storeu_ps(scores + r * width + j + 8, acc[r][1]);
    peaks[r] = MaxKeepNaN(peaks[r], MaxKeepNaN(acc[r][0], acc[r][1]));
  }
}

// acc[ROWS][size] += probabilities of keys [j0, j1) times their v rows, 16 channels at a time.
template <int ROWS>
DZ_AVX2 void WeighChunk(const float* probs, int64_t width, const float* v, int64_t size,
                        int64_t j0, int64_t j1, float* acc_rows) {
  for (int64_t d = 0; d < size; d += 16) {
    __m256 acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) {
      acc[r][0] = _mm256_loadu_ps(acc_rows + r * size + d);
      acc[r][1] = _mm256_loadu_ps(acc_rows + r * size + d + 8);
    }
    for (int64_t j = j0; j < j1; ++j) {
      const __m256 v0 = _mm256_loadu_ps(v + j * size + d);
      const __m256 v1 = _mm256_loadu_ps(v + j * size + d + 8);
      for (int r = 0; r < ROWS; ++r) {
        const __m256 w = _mm256_broadcast_ss(probs + r * width + j);
        acc[r][0] = _mm256_fmadd_ps(w, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(w, v1, acc[r][1]);
      }
    }
    for (int r = 0; r < ROWS; ++r) {
      _mm256_storeu_ps(acc_rows + r * size + d, acc[r][0]);
      _mm256_storeu_ps(acc_rows + r * size + d + 8, acc[r][1]);
    }
  }
}

// exp(row - peak) in place over [0, width) (a multiple of 8); returns 1 / their sum.
DZ_AVX2 float ExponentiateRow(float* row, float peak, int64_t width) {
  const __m256 shift = _mm256_set1_ps(peak);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < width; j += 8) {
    const __m256 e = ExpNonPositive(_mm256_sub_ps(_mm256_loadu_ps(row + j), shift));
    _mm256_storeu_ps(row + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  return 1.0f / HorizontalSum(sum);
}

// One query block [first, last) of head h. Both products walk the keys in the outer loop and
// the block's rows (in groups of 6, 6 and 4: 12 accumulators hide the FMA latency) in the inner
// one, so each chunk of k, and each run of kKeyRun v rows, is read from memory once per block
// and then from L1.
DZ_AVX2 void BlockVectorized(const Shared& k, int64_t b, int64_t h, int64_t first,
                             int64_t last, const BlockScratch& scratch) {
  const AttentionProblem& p = *k.p;
  const int64_t size = p.head_size, rows = last - first, width = RoundUp(last, 16);
  const int64_t g = h / (p.num_heads / p.kv_heads);
  const float* q = scratch.q;
  const float* kt = k.kt + (b * p.kv_heads + g) * size * k.padded;
  const float* v = k.v + (b * p.kv_heads + g) * k.padded * size;
  float* scores = scratch.scores;
  float* acc = scratch.acc;
  __m256 peaks[kBlock];
  for (int64_t r = 0; r < rows; ++r) peaks[r] = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < width; j += 16) {
    const float* chunk = kt + j * size;  // keys [j, j + 16), [head_size, 16]
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6)
      ScoreChunk<6>(q + r * size, size, chunk, j, first + r, scores + r * width, width,
                    peaks + r);
    for (; r + 4 <= rows; r += 4)
      ScoreChunk<4>(q + r * size, size, chunk, j, first + r, scores + r * width, width,
                    peaks + r);
    for (; r < rows; ++r)
      ScoreChunk<1>(q + r * size, size, chunk, j, first + r, scores + r * width, width,
                    peaks + r);
  }
  float inv[kBlock];
  for (int64_t r = 0; r < rows; ++r)
    inv[r] = ExponentiateRow(scores + r * width, HorizontalMax(peaks[r]), width);
  std::fill(acc, acc + rows * size, 0.0f);
  for (int64_t j0 = 0; j0 < last; j0 += kKeyRun) {
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6)
      WeighChunk<6>(scores + r * width, width, v, size, j0,
                    std::min(j0 + kKeyRun, first + r + 6), acc + r * size);
    for (; r + 4 <= rows; r += 4)  // rows r..r+3 see no key past first + r + 3
      WeighChunk<4>(scores + r * width, width, v, size, j0,
                    std::min(j0 + kKeyRun, first + r + 4), acc + r * size);
    for (; r < rows; ++r)
      WeighChunk<1>(scores + r * width, width, v, size, j0,
                    std::min(j0 + kKeyRun, first + r + 1), acc + r * size);
  }
  const int64_t out_stride = p.num_heads * size;
  for (int64_t r = 0; r < rows; ++r) {
    float* out = p.out + (b * p.seq + first + r) * out_stride + h * size;
    for (int64_t d = 0; d < size; ++d) out[d] = acc[r * size + d] * inv[r];
  }
}
#endif  // DZ_X86

void AttendBlock(const Shared& k, int64_t b, int64_t h, int64_t block, Scratch& kept) {
  const AttentionProblem& p = *k.p;
  const int64_t first = block * kBlock, last = std::min(first + kBlock, p.seq);
  BlockScratch scratch{kept.q.Get(static_cast<size_t>(kBlock * p.head_size)),
                       kept.scores.Get(static_cast<size_t>(kBlock * k.padded)),
                       kept.acc.Get(static_cast<size_t>(kBlock * p.head_size))};
  PrepareQueries(p, b, h, first, last, scratch.q);
#if DZ_X86
  if (k.vectorized) {
    BlockVectorized(k, b, h, first, last, scratch);
  } else {
    BlockScalar(k, b, h, first, last, scratch);
  }
#else
  BlockScalar(k, b, h, first, last, scratch);
#endif
  PoisonMaskedNonFinite(k, b, h, first, last);
}

// Thread-pool tasks must not throw: ONNX Runtime's pool would terminate the process.
void AttendPair(void* data, size_t index) noexcept {
  Shared& k = *static_cast<Shared*>(data);
  if (k.failed) return;
  const AttentionProblem& p = *k.p;
  const int64_t blocks = k.padded / kBlock, pairs = (blocks + 1) / 2;
  const int64_t pair = static_cast<int64_t>(index) % pairs;
  const int64_t head = static_cast<int64_t>(index) / pairs % p.num_heads;
  const int64_t b = static_cast<int64_t>(index) / pairs / p.num_heads;
  thread_local Scratch scratch;
  try {
    AttendBlock(k, b, head, pair, scratch);
    if (blocks - 1 - pair != pair) AttendBlock(k, b, head, blocks - 1 - pair, scratch);
  } catch (...) {  // std::bad_alloc from the scratch; nothing else throws
    k.failed = true;
  }
  scratch.q.Trim();
  scratch.scores.Trim();
  scratch.acc.Trim();
}

void PackTask(void* data, size_t index) noexcept {
  Shared& k = *static_cast<Shared*>(data);
  if (k.failed) return;
  PackKeysAndValues(data, index);  // allocates nothing
}

}  // namespace

const char* CausalAttentionCheck(const AttentionProblem& p) {
  if (p.batch < 0 || p.seq < 0) return "negative batch or sequence length";
  if (p.seq > kMaxSequence) return "the sequence is longer than 16777216 tokens";
  if (p.num_heads <= 0 || p.kv_heads <= 0 || p.num_heads > kMaxHeads ||
      p.num_heads % p.kv_heads)
    return "num_heads must be 1 to 1024 and a multiple of kv_num_heads (which must be positive)";
  if (p.head_size <= 0 || p.head_size > kMaxHeadSize) return "the head size must be 1 to 1024";
  if ((p.cos == nullptr) != (p.sin == nullptr)) return "cos_cache and sin_cache come together";
  if (p.cos && (p.rotary_half <= 0 || 2 * p.rotary_half > p.head_size))
    return "the rotary tables are wider than half a head";
  if (p.cos && p.cache_rows < p.seq) return "the rotary tables have fewer rows than tokens";
  return nullptr;
}

int64_t CausalAttentionRetainedBytes() { return retained_bytes; }

bool CausalAttentionVectorized() {
#if DZ_X86
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
#else
  return false;
#endif
}

const char* CausalAttention(const AttentionProblem& p, ParallelFor parallel_for, void* runner) {
  if (const char* why = CausalAttentionCheck(p)) return why;
  if (p.batch == 0 || p.seq == 0) return nullptr;
  Shared k;
  k.p = &p;
  k.padded = RoundUp(p.seq, kBlock);
  k.vectorized = CausalAttentionVectorized() && p.head_size % 16 == 0;
  const int64_t blocks = k.padded / kBlock;
  // Packed k and v (and v's non-finite flags) live as long as this call; the buffer is kept by
  // the calling thread, so that steady-state calls allocate nothing (and concurrent calls never
  // share it), unless it is large.
  thread_local KeptBuffer packed;
  const int64_t per_tensor = p.batch * p.kv_heads * p.head_size * k.padded;
  const int64_t flag_floats = (p.batch * p.kv_heads * blocks + 3) / 4;
  try {
    float* base = packed.Get(static_cast<size_t>(2 * per_tensor + flag_floats));
    k.kt = base;
    k.v = base + per_tensor;
    k.v_nonfinite = reinterpret_cast<uint8_t*>(base + 2 * per_tensor);
  } catch (const std::bad_alloc&) {
    return "out of memory for the packed keys and values";
  }
  parallel_for(runner, PackTask, &k, static_cast<size_t>(p.batch * blocks));
  parallel_for(runner, AttendPair, &k,
               static_cast<size_t>(p.batch * p.num_heads * ((blocks + 1) / 2)));
  packed.Trim();
  return k.failed ? "out of memory for a thread's scratch" : nullptr;
}

}  // namespace dayzero
