// ai.dayzero.MatMulInt4: the ONNX Runtime custom op around int4_matmul.h.
//
// MatMulInt4(x, codes, scales, bias?) -> y
//   x [..., k] float32 (rank 1 to 4), codes [n / 8, k / 64, 8, 32] uint8,
//   scales [n / 8, k / 32, 8] float16, bias [n] float32; y [..., n] float32.
// No attributes: k and n are the inputs' dims. The IR op quantized_linear with bits 4,
// group_size 32 and activations "int8"; the artifact stores codes and scales in this layout
// (backends/onnxruntime/convert_int4.py, weight layouts int4_tiles8 and scale_tiles8).
//
// Like custom_ops.cc, no C++ exception crosses the C ABI.
#include <cstring>
#include <new>
#include <string>

#include "int4_matmul.h"
#include "op_support.h"
#include "ort_abi.h"

namespace dayzero {
namespace {

constexpr size_t kInputs = 4;
constexpr const char* kOp = "MatMulInt4";

struct Kernel {
  const ort::Api* api;
};

ort::Status* Error(const ort::Api* api, const std::string& message) {
  return OpError(api, kOp, message);
}

ort::Status* CreateKernel(const ort::CustomOp*, const ort::Api* api, const ort::KernelInfo*,
                          void** out) noexcept {
  try {
    *out = new Kernel{api};
  } catch (...) {
    return OpFailure(api, kOp, "CreateKernel");
  }
  return nullptr;
}

ort::ElementType InputType(size_t index) {
  return index == 1 ? ort::kUint8 : index == 2 ? ort::kFloat16 : ort::kFloat;
}

// Fills in the problem from the inputs; an error names what does not fit.
ort::Status* Describe(const ort::Api* api, const InputTensor in[kInputs], Int4Problem* p) {
  const InputTensor &x = in[0], &codes = in[1], &scales = in[2], &bias = in[3];
  if (x.data == nullptr || codes.data == nullptr || scales.data == nullptr)
    return Error(api, "x, codes and scales are required");
  const int64_t k = x.dims[x.rank - 1];
  if (codes.rank != 4 || codes.dims[2] != kInt4Columns || codes.dims[3] != 32)
    return Error(api, "codes must be [out_features / 8, in_features / 64, 8, 32]");
  const int64_t n = codes.dims[0] * kInt4Columns;
  if (codes.dims[1] * 64 != k)
    return Error(api, "codes hold " + std::to_string(codes.dims[1] * 64) + " in_features; x has " +
                          std::to_string(k));
  if (scales.rank != 3 || scales.dims[0] != codes.dims[0] || scales.dims[1] != k / 32 ||
      scales.dims[2] != kInt4Columns)
    return Error(api, "scales must be [out_features / 8, in_features / 32, 8] like codes");
  if (bias.data && (bias.rank != 1 || bias.dims[0] != n))
    return Error(api, "bias must be [out_features] = [" + std::to_string(n) + "]");
  *p = Int4Problem{};
  p->rows = 1;
  for (size_t i = 0; i + 1 < x.rank; ++i) p->rows *= x.dims[i];
  p->k = k;
  p->n = n;
  p->x = x.f();
  p->codes = static_cast<const uint8_t*>(codes.data);
  p->scales = static_cast<const uint16_t*>(scales.data);
  p->bias = bias.f();
  if (const char* why = Int4MatMulCheck(*p)) return Error(api, why);
  return nullptr;
}

ort::Status* ComputeOrThrow(void* kernel, ort::KernelContext* context) {
  const ort::Api* api = static_cast<Kernel*>(kernel)->api;
  InputTensor in[kInputs];
  for (size_t i = 0; i < kInputs; ++i) {
    const size_t min_rank = i == 0 ? 1 : i == 3 ? 1 : i == 1 ? 4 : 3;
    const size_t max_rank = i == 0 ? 4 : min_rank;
    if (ort::Status* status = ReadInput(api, kOp, context, i, min_rank, max_rank, InputType(i),
                                        &in[i]))
      return status;
  }
  Int4Problem p;
  if (ort::Status* status = Describe(api, in, &p)) return status;
  if (ort::Status* status = ProductOutput(api, context, in[0], p.n, &p.y)) return status;
  return RunOnThreads(api, kOp, context, p, [](const Int4Problem& problem, ParallelFor parallel,
                                                void* runner) {
    return Int4MatMul(problem, parallel, runner);
  });
}

struct MatMulInt4Op {
  static constexpr const char* kName = kOp;
  static constexpr size_t kInputs = dayzero::kInputs, kOutputs = 1;
  static ort::ElementType InputType(size_t index) { return dayzero::InputType(index); }
  static bool Optional(size_t index) { return index == 3; }
  using Kernel = dayzero::Kernel;
  static constexpr auto CreateKernel = dayzero::CreateKernel;
  static constexpr auto ComputeOrThrow = dayzero::ComputeOrThrow;
};

const ort::CustomOp kMatMulInt4 = MakeCustomOp<MatMulInt4Op>();

}  // namespace

const ort::CustomOp* MatMulInt4Op() { return &kMatMulInt4; }

}  // namespace dayzero

// The kernel on the calling thread, for tests: `vectorized` 0 runs the portable path, which
// ONNX Runtime only reaches on CPUs without AVX2. Returns 0, or 1 with the shapes refused.
extern "C" __attribute__((visibility("default"))) int DayzeroInt4MatMul(
    int64_t rows, int64_t k, int64_t n, const float* x, const uint8_t* codes,
    const uint16_t* scales, const float* bias, float* y, int vectorized) noexcept {
  dayzero::Int4Problem p;
  p.rows = rows;
  p.k = k;
  p.n = n;
  p.x = x;
  p.codes = codes;
  p.scales = scales;
  p.bias = bias;
  p.y = y;
  return dayzero::Int4MatMul(p, dayzero::RunSerially, nullptr, vectorized != 0) == nullptr ? 0
                                                                                        : 1;
}
