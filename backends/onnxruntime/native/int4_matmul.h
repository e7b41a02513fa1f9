// int4 weights times int8-rounded activations: the IR op quantized_linear with bits 4,
// group_size 32, activations "int8" and float16 scales, in a layout made for streaming.
//
// Why our own kernel: a decode step is bound by the bytes it reads. ONNX Runtime's MatMulNBits
// repacks the codes and adds a precomputed per-block sum beside each float32 scale (24 bytes
// per 32 weights); this kernel folds the zero point into the activations' block sums instead
// and reads only the codes and a float16 scale (18 bytes per 32 weights).
//
// Layout (the onnxruntime lowering derives it from quantized_linear's MatMulNBits tensors with
// Reshape and Transpose on initializers, which ONNX Runtime folds at load time):
//   codes  [n / 8, k / 64, 8, 32] u8: for a tile of 8 columns and a pair of blocks, each column's
//          two blocks of 16 bytes, one after the other (MatMulNBits' nibble order: byte i holds
//          input 2i in its low nibble and 2i + 1 in its high one);
//   scales [n / 8, k / 32, 8] float16: the 8 columns' scales of each block side by side.
// So one tile's reads are a single forward stream.
//
// Meaning (exactly the decomposition's): each row of x is rounded per block of 32 to
// round(x / s) * s with s = max |x| / 127 (round half to even; an all-zero block stays zero),
// the weight is (code - 8) * scale, y = x_rounded @ weight^T + bias. A row holding NaN or Inf
// gives NaN in every column, as the decomposition does (its block scale is NaN or Inf). A NaN
// or infinite weight scale makes its columns NaN: the decomposition's (8 - 8) * Inf is NaN too
// (a block with no code 8 and an infinite scale, which no quantizer makes, would give it +-Inf).
#pragma once

#include <cstddef>
#include <cstdint>

#include "causal_attention.h"  // ParallelFor

namespace dayzero {

constexpr int64_t kInt4Block = 32;    // inputs per scale
constexpr int64_t kInt4Columns = 8;   // columns interleaved in one tile

struct Int4Problem {
  int64_t rows = 0, k = 0, n = 0;
  const float* x = nullptr;        // [rows, k]
  const uint8_t* codes = nullptr;  // [n / 8, k / 64, 8, 32]
  const uint16_t* scales = nullptr;  // [n / 8, k / 32, 8] float16 bits
  const float* bias = nullptr;     // [n], or null
  float* y = nullptr;              // [rows, n]
};

// Null when the problem's shapes are ones the kernel runs, else why not.
const char* Int4MatMulCheck(const Int4Problem& p);

// Computes p.y; null on success, else why not (the check's message, or out of memory).
// `vectorized` false runs the portable path even where AVX2 exists (for tests).
const char* Int4MatMul(const Int4Problem& p, ParallelFor parallel, void* runner,
                       bool vectorized = true);

// Whether the vectorized (AVX2 + FMA + F16C) path runs on this CPU; the scalar one otherwise.
bool Int4MatMulVectorized();

}  // namespace dayzero
