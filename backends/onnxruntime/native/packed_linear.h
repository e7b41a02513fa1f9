// float32 x @ weight^T (+ bias): the IR op linear, with the weight packed in panels of 32
// output columns, each panel stored k-major.
//
// Why our own kernel: a decode step reads every weight once for a handful of rows, so it is
// bound by memory, and MLAS's product at 7 or 8 rows cost 1.35x its one-row time on 2 cores:
// its loads and its arithmetic took turns instead of overlapping. Here each task streams one
// panel front to back with a software prefetch 16 KB ahead into L2, so a step of 8 decode rows
// costs about 1.15x one row, and the same outer-product loop at 8 rows a tile keeps prompt
// chunks at the machine's FMA peak (docs/performance.md, "Text generation").
//
// Layout (the onnxruntime lowering derives it from the [n, k] weight with a Reshape and a
// Transpose, which ONNX Runtime folds at load time; see convert_packed_linear.py):
//   panels [n / 32, k, 32]: panel p holds columns 32p .. 32p + 31, and for each input index i
//   their 32 weights side by side, so a panel is one forward stream.
//
// Meaning: y[r, c] = sum over i in 0 .. k-1 of x[r, i] * w[c, i], accumulated in float32 by
// fused multiply-adds in index order starting from 0, then + bias[c]. Every path (AVX-512,
// AVX2, portable) does exactly these roundings, so a row's result does not depend on the CPU,
// on how many rows share the call or on where the row sits among them: batching sequences
// never changes an answer. NaN and Inf propagate as IEEE arithmetic says (Inf * 0 is NaN).
#pragma once

#include <cstddef>
#include <cstdint>

#include "causal_attention.h"  // ParallelFor

namespace dayzero {

constexpr int64_t kPanelColumns = 32;  // output columns per panel

struct LinearProblem {
  int64_t rows = 0, k = 0, n = 0;
  const float* x = nullptr;       // [rows, k]
  const float* panels = nullptr;  // [n / 32, k, 32]
  const float* bias = nullptr;    // [n], or null
  float* y = nullptr;             // [rows, n]
};

// Instruction sets the kernel has a path for, best first.
enum class LinearIsa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// Null when the problem's shapes are ones the kernel runs, else why not.
const char* PackedLinearCheck(const LinearProblem& p);

// Computes p.y; null on success, else the check's message. `limit` caps the instruction set
// (for tests: every path gives the same bits); the best one this CPU has runs by default.
const char* PackedLinear(const LinearProblem& p, ParallelFor parallel, void* runner,
                         LinearIsa limit = LinearIsa::kAvx512);

// The best path this CPU runs.
LinearIsa PackedLinearIsa();

}  // namespace dayzero
