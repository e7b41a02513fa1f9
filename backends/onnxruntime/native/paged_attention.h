// Causal attention of one generation step over a paged KV cache, on the CPU: the IR op
// `paged_attention` (compiler/ir/ops/paged.py, whose decomposition is the reference semantics).
//
// The decomposition gathers every token's [L, kv_heads, head_size] keys and values and scores a
// [T, kv_heads, group, L] tensor: for a decode step against a long cache that is mostly copies.
// This kernel reads each visible key and value where it lives (a pool slot or this step's new
// token) and keeps an online softmax per (token, query head), so nothing of size T x L exists;
// a step of few tokens splits each one's keys into parts (a decode step would leave threads
// idle), whose softmax states are then combined.
//
// It knows nothing of ONNX Runtime: the caller passes the tensors and a parallel-for.
#pragma once

#include <cstddef>
#include <cstdint>

#include "causal_attention.h"  // TaskFn, ParallelFor

namespace dayzero {

// What the kernel accepts. convert_paged.py's fit check refuses the same (its PAGED_* constants
// must equal these; a test reads them from this file).
constexpr int64_t kPagedMaxHeadSize = 1024;  // floats per q/k head and per v head (stack buffers)
constexpr int64_t kPagedMaxHeads = 1024;     // num_heads (and so kv_num_heads)

struct PagedProblem {
  int64_t tokens, num_heads, kv_heads, head_size, v_size;
  int64_t pool_slots, sequences, length;  // P, N and L
  const float* q;        // [tokens, num_heads * head_size], rows q_stride floats apart
  const float* k;        // [tokens, kv_heads * head_size], rows k_stride apart
  const float* v;        // [tokens, kv_heads * v_size], rows v_stride apart
  // Floats from one token's row to the next: the row widths above for separate tensors, the
  // packed width when q, k and v are the [q | k | v] columns of one projection's output (no
  // Split runs before the kernel). 0 stands for the row width.
  int64_t q_stride, k_stride, v_stride;
  // Rotary tables [cos_rows, head_size] (null: no rotary): row t rotates token t's q and new k,
  // full width, rotate_half convention: x * cos + concat(-x2, x1) * sin.
  const float* cos;
  const float* sin;
  int64_t cos_rows;
  const float* k_cache;  // [pool_slots, kv_heads, head_size]
  const float* v_cache;  // [pool_slots, kv_heads, v_size]
  const int64_t* seq_slots;  // [sequences, length]: s >= 0 pool slot, s <= -2 new token -2 - s,
                             // -1 padding
  const int64_t* token_seq;  // [tokens]: the token's row of seq_slots
  const int64_t* token_len;  // [tokens]: it sees keys [0, token_len) of its row ...
  int64_t window;            // ... or only the last `window` of them (0: all)
  float scale;               // scores are (q . k) * scale
  float softcap;             // then softcap * tanh(score / softcap) (0: none)
  float* out;    // [tokens, num_heads * v_size]
  float* new_k;  // [tokens, kv_heads, head_size]: the rotated new keys, for the pool
  float* new_v;  // [tokens, kv_heads, v_size]
};

// nullptr when the problem's sizes are within the limits above and consistent, else a message
// saying which argument is unusable. Reads no data: run it before allocating the outputs.
const char* PagedAttentionCheck(const PagedProblem& p);

// nullptr on success, else a message (an index out of range: a token's sequence, or a visible
// slot outside the pool or this step's tokens; out of memory for its row buffers). Throws
// nothing.
//
// Non-finite numbers follow the decomposition: a hidden key (past token_len, before the window,
// or slot -1) never reaches a row, whatever lies in its slot (slot -1 and keys no token of the
// step sees are never read; a key one token sees may be scored with the rows of a neighbouring
// token that does not, and that score is never used); a NaN or +Inf score makes its row NaN; a
// -Inf score weighs 0; a NaN or Inf in a visible value reaches the rows that see it, in its
// channel (0 * Inf is NaN when its weight underflows). A row with no visible key is NaN, as the
// softmax of a row of -inf is.
const char* PagedAttention(const PagedProblem& p, ParallelFor parallel_for, void* runner);

}  // namespace dayzero
