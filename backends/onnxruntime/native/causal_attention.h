// Causal grouped-query attention for a prompt (no past), on the CPU.
//
// ONNX Runtime's CPU attention kernels (GroupQueryAttention, MultiHeadAttention, Attention-23)
// multiply the whole S x S score matrix and mask the upper half afterwards. This kernel works in
// blocks of query rows and multiplies each block only with the keys it may see, so it does half
// the attention FLOPs; it also applies the rotary embedding and the softmax scale while it packs
// q and k, shares each KV head among its query heads without copying it, and writes the
// [batch, seq, heads * head_size] layout the output projection reads.
//
// It knows nothing of ONNX Runtime: the caller passes the tensors and a parallel-for.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dayzero {

// What the kernel accepts. convert_heads.py's fit check refuses the same (its CAUSAL_* constants
// must equal these; a test reads them from this file).
constexpr int64_t kMaxHeadSize = 1024;           // floats per head (a stack buffer per token)
constexpr int64_t kMaxHeads = 1024;               // num_heads (and so kv_num_heads)
constexpr int64_t kMaxSequence = int64_t{1} << 24;  // tokens (key indices are 32-bit lanes)
// A thread keeps its scratch between calls only up to this size; larger buffers are released
// when the call (or task) that needed them ends.
constexpr int64_t kKeepScratchBytes = int64_t{4} << 20;

// A [batch, seq, heads * head_size] projection, possibly a slice of a wider (packed) one.
struct Projection {
  const float* data;      // head 0 of token 0 of batch row 0
  int64_t token_stride;   // floats between consecutive tokens
  int64_t batch_stride;   // floats between consecutive batch rows
};

struct AttentionProblem {
  int64_t batch, seq, num_heads, kv_heads, head_size;
  Projection q, k, v;
  // rotary tables [cache_rows, rotary_half]: row i rotates token i (null: no rotary). The first
  // 2 * rotary_half channels of each head are rotated, as halves or as interleaved pairs.
  const float* cos;
  const float* sin;
  int64_t cache_rows, rotary_half;
  bool interleaved;
  float scale;
  float* out;  // [batch, seq, num_heads * head_size], contiguous
};

// Runs fn(data, i) for i in [0, total), possibly on several threads; returns when all are done.
using TaskFn = void (*)(void* data, size_t index);
using ParallelFor = void (*)(void* runner, TaskFn fn, void* data, size_t total);

// nullptr when the problem's sizes are within the limits above and consistent, else a message
// saying which argument is unusable. Needs no data pointers: run it before allocating the output.
const char* CausalAttentionCheck(const AttentionProblem& p);

// nullptr on success, else a message saying which argument is unusable or that memory ran out.
// Throws nothing. NaN and +-Inf propagate as in a dense float64 computation: a non-finite score
// makes its row's softmax NaN where the math does, and a non-finite value in v reaches every row
// that weighs it, including (as 0 * Inf and 0 * NaN do in torch) the rows that mask it.
const char* CausalAttention(const AttentionProblem& p, ParallelFor parallel_for, void* runner);

// Bytes of scratch that threads keep between calls (all threads together), for tests.
int64_t CausalAttentionRetainedBytes();

// Whether the vectorized (AVX2 + FMA) path runs on this CPU; the scalar path runs otherwise.
bool CausalAttentionVectorized();

}  // namespace dayzero
