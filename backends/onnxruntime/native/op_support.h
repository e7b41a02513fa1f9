// What every dayzero custom op's entry points share: errors as ONNX Runtime statuses (named by
// the op), attributes with defaults, inputs read and checked, outputs allocated, and the
// kernels' ParallelFor run on ONNX Runtime's intra-op thread pool.
//
// Header-only (inline), so each op's translation unit keeps its own anonymous-namespace entry
// points and only these helpers are shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#include "causal_attention.h"  // TaskFn
#include "ort_abi.h"

namespace dayzero {

inline ort::Status* OpError(const ort::Api* api, const char* op, const std::string& message) {
  return api->CreateStatus(ort::kInvalidArgument, (std::string(op) + ": " + message).c_str());
}

// Out of memory, or (never expected) any other exception, as an ORT status. Called from a
// catch block: it rethrows what was caught to tell the two apart.
inline ort::Status* OpFailure(const ort::Api* api, const char* op, const char* where) noexcept {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return api->CreateStatus(ort::kFail,
                             (std::string(op) + ": out of memory in " + where).c_str());
  } catch (...) {
    return api->CreateStatus(ort::kFail, (std::string(op) + ": unexpected C++ exception").c_str());
  }
}

// The attribute's value, or `fallback` when the node does not set it.
template <typename T, typename Get>
T Attribute(const ort::Api* api, Get get, const ort::KernelInfo* info, const char* name,
            T fallback) {
  T value{};
  if (ort::Status* status = (api->*get)(info, name, &value)) {
    api->ReleaseStatus(status);
    return fallback;
  }
  return value;
}

// An input's data and dimensions (up to 4); data stays null for an absent optional input.
struct InputTensor {
  const void* data = nullptr;
  int64_t dims[4] = {0, 0, 0, 0};
  size_t rank = 0;
  const float* f() const { return static_cast<const float*>(data); }
  const int64_t* i() const { return static_cast<const int64_t*>(data); }
};

// Reads input `index`, which must have rank min_rank .. max_rank (at most 4) and element type
// `want`; an error names the op and the input.
inline ort::Status* ReadInput(const ort::Api* api, const char* op, ort::KernelContext* context,
                              size_t index, size_t min_rank, size_t max_rank,
                              ort::ElementType want, InputTensor* out) {
  const ort::Value* value = nullptr;
  if (ort::Status* status = api->KernelContextGetInput(context, index, &value)) return status;
  if (value == nullptr) return nullptr;
  ort::TensorTypeAndShapeInfo* info = nullptr;
  if (ort::Status* status = api->GetTensorTypeAndShape(value, &info)) return status;
  ort::ElementType type = ort::kUndefined;
  ort::Status* status = api->GetTensorElementType(info, &type);
  if (!status) status = api->GetDimensionsCount(info, &out->rank);
  if (!status && (out->rank < min_rank || out->rank > max_rank)) {
    const std::string expected = min_rank == max_rank
        ? std::to_string(min_rank)
        : std::to_string(min_rank) + (max_rank == min_rank + 1 ? " or " : " to ") +
              std::to_string(max_rank);
    status = OpError(api, op, "input " + std::to_string(index) + " has rank " +
                                  std::to_string(out->rank) + "; expected " + expected);
  }
  if (!status) status = api->GetDimensions(info, out->dims, out->rank);
  api->ReleaseTensorTypeAndShapeInfo(info);
  if (!status && type != want) {
    const char* name = want == ort::kFloat     ? "float32"
                       : want == ort::kFloat16 ? "float16"
                       : want == ort::kUint8   ? "uint8"
                                               : "int64";
    status = OpError(api, op, "input " + std::to_string(index) + " is not " + name);
  }
  if (!status) {
    void* data = nullptr;
    status = api->GetTensorMutableData(const_cast<ort::Value*>(value), &data);
    out->data = data;
  }
  return status;
}

// Allocates output `index` of shape dims[0 .. rank) and points `out` at its float32 data.
inline ort::Status* FloatOutput(const ort::Api* api, ort::KernelContext* context, size_t index,
                                const int64_t* dims, size_t rank, float** out) {
  ort::Value* value = nullptr;
  if (ort::Status* status = api->KernelContextGetOutput(context, index, dims, rank, &value))
    return status;
  void* data = nullptr;
  if (ort::Status* status = api->GetTensorMutableData(value, &data)) return status;
  *out = static_cast<float*>(data);
  return nullptr;
}

template <size_t Rank>
ort::Status* FloatOutput(const ort::Api* api, ort::KernelContext* context, size_t index,
                         const int64_t (&dims)[Rank], float** out) {
  return FloatOutput(api, context, index, dims, Rank, out);
}

// Allocates output 0 shaped like `x` with its last dimension `n`: a product's output.
inline ort::Status* ProductOutput(const ort::Api* api, ort::KernelContext* context,
                                  const InputTensor& x, int64_t n, float** out) {
  int64_t dims[4];
  for (size_t i = 0; i < x.rank; ++i) dims[i] = x.dims[i];
  dims[x.rank - 1] = n;
  return FloatOutput(api, context, 0, dims, x.rank, out);
}

// A ParallelFor that runs every task on the calling thread (the test entry points use it).
inline void RunSerially(void*, TaskFn fn, void* data, size_t total) {
  for (size_t i = 0; i < total; ++i) fn(data, i);
}

// A kernel's ParallelFor over ONNX Runtime's intra-op threads; the first failing call's status
// is kept and later calls do nothing.
struct ThreadPool {
  const ort::Api* api;
  ort::KernelContext* context;
  ort::Status* status;
};

inline void RunParallel(void* runner, TaskFn fn, void* data, size_t total) {
  auto* pool = static_cast<ThreadPool*>(runner);
  if (pool->status) return;
  pool->status = pool->api->KernelContextParallelFor(pool->context, fn, total, 0, data);
}

// Runs `kernel(problem, RunParallel, &pool)` on ONNX Runtime's intra-op threads: the kernel's
// message as an error status naming `op`, or a failed ParallelFor's status.
template <typename Problem, typename Kernel>
ort::Status* RunOnThreads(const ort::Api* api, const char* op, ort::KernelContext* context,
                          const Problem& problem, Kernel kernel) {
  ThreadPool pool{api, context, nullptr};
  if (const char* why = kernel(problem, RunParallel, &pool)) {
    if (pool.status) api->ReleaseStatus(pool.status);
    return OpError(api, op, why);
  }
  return pool.status;
}

// The descriptor ONNX Runtime reads for a custom op on the CPU provider. `Op` supplies
// kName, kInputs and kOutputs, InputType(index) and Optional(index) (float32 outputs, all
// required), its Kernel type (which holds `api`), CreateKernel, and ComputeOrThrow, which may
// throw: the descriptor's compute turns any exception into an error status.
template <typename Op>
ort::CustomOp MakeCustomOp() {
  ort::CustomOp op;
  std::memset(&op, 0, sizeof(op));
  op.version = ort::kApiVersion;
  op.GetName = [](const ort::CustomOp*) { return Op::kName; };
  op.GetExecutionProviderType = [](const ort::CustomOp*) -> const char* { return nullptr; };
  op.GetInputType = [](const ort::CustomOp*, size_t index) { return Op::InputType(index); };
  op.GetInputTypeCount = [](const ort::CustomOp*) { return Op::kInputs; };
  op.GetOutputType = [](const ort::CustomOp*, size_t) { return ort::kFloat; };
  op.GetOutputTypeCount = [](const ort::CustomOp*) { return Op::kOutputs; };
  op.KernelDestroy = [](void* kernel) { delete static_cast<typename Op::Kernel*>(kernel); };
  op.GetInputCharacteristic = [](const ort::CustomOp*, size_t index) {
    return Op::Optional(index) ? ort::kOptional : ort::kRequired;
  };
  op.GetOutputCharacteristic = [](const ort::CustomOp*, size_t) { return ort::kRequired; };
  op.GetInputMemoryType = [](const ort::CustomOp*, size_t) { return ort::kMemTypeDefault; };
  op.CreateKernelV2 = Op::CreateKernel;
  op.KernelComputeV2 = [](void* kernel, ort::KernelContext* context) noexcept {
    try {
      return Op::ComputeOrThrow(kernel, context);
    } catch (...) {
      return OpFailure(static_cast<typename Op::Kernel*>(kernel)->api, Op::kName, "Compute");
    }
  };
  return op;
}

}  // namespace dayzero
