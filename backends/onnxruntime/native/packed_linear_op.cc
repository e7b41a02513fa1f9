// ai.dayzero.PackedLinear: the ONNX Runtime custom op around packed_linear.h.
//
// PackedLinear(x, panels, bias?) -> y
//   x [..., k] float32 (rank 1 to 4), panels [n / 32, k, 32] float32, bias [n] float32;
//   y [..., n] float32. No attributes: k and n are the inputs' dims. The IR op linear on a
//   float32 weight [n, k]; the onnxruntime lowering makes the panels from it
//   (backends/onnxruntime/convert_packed_linear.py).
//
// Like custom_ops.cc, no C++ exception crosses the C ABI.
#include <string>

#include "op_support.h"
#include "ort_abi.h"
#include "packed_linear.h"

namespace dayzero {
namespace {

constexpr size_t kInputs = 3;
constexpr const char* kOp = "PackedLinear";

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

ort::ElementType InputType(size_t) { return ort::kFloat; }

// Fills in the problem from the inputs; an error names what does not fit.
ort::Status* Describe(const ort::Api* api, const InputTensor in[kInputs], LinearProblem* p) {
  const InputTensor &x = in[0], &panels = in[1], &bias = in[2];
  if (x.data == nullptr || panels.data == nullptr) return Error(api, "x and panels are required");
  const int64_t k = x.dims[x.rank - 1];
  if (panels.dims[2] != kPanelColumns)
    return Error(api, "panels must be [out_features / 32, in_features, 32]");
  if (panels.dims[1] != k)
    return Error(api, "panels hold " + std::to_string(panels.dims[1]) + " in_features; x has " +
                          std::to_string(k));
  const int64_t n = panels.dims[0] * kPanelColumns;
  if (bias.data && (bias.rank != 1 || bias.dims[0] != n))
    return Error(api, "bias must be [out_features] = [" + std::to_string(n) + "]");
  *p = LinearProblem{};
  p->rows = 1;
  for (size_t i = 0; i + 1 < x.rank; ++i) p->rows *= x.dims[i];
  p->k = k;
  p->n = n;
  p->x = x.f();
  p->panels = panels.f();
  p->bias = bias.f();
  if (const char* why = PackedLinearCheck(*p)) return Error(api, why);
  return nullptr;
}

ort::Status* ComputeOrThrow(void* kernel, ort::KernelContext* context) {
  const ort::Api* api = static_cast<Kernel*>(kernel)->api;
  InputTensor in[kInputs];
  for (size_t i = 0; i < kInputs; ++i) {
    const size_t min_rank = i == 1 ? 3 : 1;
    const size_t max_rank = i == 0 ? 4 : min_rank;
    if (ort::Status* status = ReadInput(api, kOp, context, i, min_rank, max_rank, InputType(i),
                                        &in[i]))
      return status;
  }
  LinearProblem p;
  if (ort::Status* status = Describe(api, in, &p)) return status;
  if (ort::Status* status = ProductOutput(api, context, in[0], p.n, &p.y)) return status;
  return RunOnThreads(api, kOp, context, p, [](const LinearProblem& problem,
                                                ParallelFor parallel, void* runner) {
    return PackedLinear(problem, parallel, runner);
  });
}

struct PackedLinearOp {
  static constexpr const char* kName = kOp;
  static constexpr size_t kInputs = dayzero::kInputs, kOutputs = 1;
  static ort::ElementType InputType(size_t index) { return dayzero::InputType(index); }
  static bool Optional(size_t index) { return index == 2; }
  using Kernel = dayzero::Kernel;
  static constexpr auto CreateKernel = dayzero::CreateKernel;
  static constexpr auto ComputeOrThrow = dayzero::ComputeOrThrow;
};

const ort::CustomOp kPackedLinear = MakeCustomOp<PackedLinearOp>();

}  // namespace

const ort::CustomOp* PackedLinearOp() { return &kPackedLinear; }

}  // namespace dayzero

// The kernel on the calling thread, for tests: `isa` caps the instruction set (0 portable,
// 1 AVX2, 2 AVX-512; every path gives the same bits). Returns 0, or 1 with the shapes refused.
extern "C" __attribute__((visibility("default"))) int DayzeroPackedLinear(
    int64_t rows, int64_t k, int64_t n, const float* x, const float* panels, const float* bias,
    float* y, int isa) noexcept {
  dayzero::LinearProblem p;
  p.rows = rows;
  p.k = k;
  p.n = n;
  p.x = x;
  p.panels = panels;
  p.bias = bias;
  p.y = y;
  const auto limit = static_cast<dayzero::LinearIsa>(isa < 0 ? 0 : isa > 2 ? 2 : isa);
  return dayzero::PackedLinear(p, dayzero::RunSerially, nullptr, limit) == nullptr ? 0 : 1;
}

// The best instruction set the kernel runs on this CPU (0 portable, 1 AVX2, 2 AVX-512).
extern "C" __attribute__((visibility("default"))) int DayzeroPackedLinearIsa() noexcept {
  return static_cast<int>(dayzero::PackedLinearIsa());
}
