// The part of ONNX Runtime's C ABI that a custom-op library needs, declared here.
//
// The onnxruntime wheel ships no C headers, so this file declares what the library uses: the
// API base, the slots of the API table it calls, and the custom-op descriptor. ONNX Runtime
// keeps this ABI stable: the API table only grows at its end (the runtime asserts every
// version's last slot at compile time), and a table obtained for version N has N's layout in
// every later release. Slots below are 0-based indices into that table of function pointers;
// everything here exists from API version 17 (ONNX Runtime 1.17), which KernelContext_ParallelFor
// needs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ort {

constexpr uint32_t kApiVersion = 17;

// Opaque handles.
struct Status;
struct SessionOptions;
struct CustomOpDomain;
struct KernelInfo;
struct KernelContext;
struct Value;
struct TensorTypeAndShapeInfo;
struct ShapeInferContext;

enum ElementType : int { kUndefined = 0, kFloat = 1, kUint8 = 2, kInt64 = 7, kFloat16 = 10 };
enum ErrorCode : int { kOk = 0, kFail = 1, kInvalidArgument = 2 };
enum Characteristic : int { kRequired = 0, kOptional = 1, kVariadic = 2 };
enum MemType : int { kMemTypeDefault = 0 };

using AnyFunction = void (*)();

// The table GetApi returns: an array of function pointers, read by slot.
struct Api {
  template <typename Fn>
  Fn At(size_t slot) const {
    return reinterpret_cast<Fn>(reinterpret_cast<const AnyFunction*>(this)[slot]);
  }

  Status* CreateStatus(ErrorCode code, const char* message) const {
    return At<Status* (*)(ErrorCode, const char*)>(0)(code, message);
  }
  const char* GetErrorMessage(const Status* status) const {
    return At<const char* (*)(const Status*)>(2)(status);
  }
  Status* CreateCustomOpDomain(const char* name, CustomOpDomain** out) const {
    return At<Status* (*)(const char*, CustomOpDomain**)>(26)(name, out);
  }
  Status* CustomOpDomainAdd(CustomOpDomain* domain, const void* op) const {
    return At<Status* (*)(CustomOpDomain*, const void*)>(27)(domain, op);
  }
  Status* AddCustomOpDomain(SessionOptions* options, CustomOpDomain* domain) const {
    return At<Status* (*)(SessionOptions*, CustomOpDomain*)>(28)(options, domain);
  }
  Status* GetTensorMutableData(Value* value, void** out) const {
    return At<Status* (*)(Value*, void**)>(51)(value, out);
  }
  Status* GetTensorElementType(const TensorTypeAndShapeInfo* info, ElementType* out) const {
    return At<Status* (*)(const TensorTypeAndShapeInfo*, ElementType*)>(60)(info, out);
  }
  Status* GetDimensionsCount(const TensorTypeAndShapeInfo* info, size_t* out) const {
    return At<Status* (*)(const TensorTypeAndShapeInfo*, size_t*)>(61)(info, out);
  }
  Status* GetDimensions(const TensorTypeAndShapeInfo* info, int64_t* dims, size_t count) const {
    return At<Status* (*)(const TensorTypeAndShapeInfo*, int64_t*, size_t)>(62)(info, dims, count);
  }
  Status* GetTensorTypeAndShape(const Value* value, TensorTypeAndShapeInfo** out) const {
    return At<Status* (*)(const Value*, TensorTypeAndShapeInfo**)>(65)(value, out);
  }
  Status* KernelInfoGetAttributeFloat(const KernelInfo* info, const char* name, float* out) const {
    return At<Status* (*)(const KernelInfo*, const char*, float*)>(85)(info, name, out);
  }
  Status* KernelInfoGetAttributeInt64(const KernelInfo* info, const char* name,
                                      int64_t* out) const {
    return At<Status* (*)(const KernelInfo*, const char*, int64_t*)>(86)(info, name, out);
  }
  Status* KernelContextGetInput(const KernelContext* context, size_t index,
                                const Value** out) const {
    return At<Status* (*)(const KernelContext*, size_t, const Value**)>(90)(context, index, out);
  }
  Status* KernelContextGetOutput(KernelContext* context, size_t index, const int64_t* dims,
                                 size_t count, Value** out) const {
    return At<Status* (*)(KernelContext*, size_t, const int64_t*, size_t, Value**)>(91)(
        context, index, dims, count, out);
  }
  void ReleaseStatus(Status* status) const { At<void (*)(Status*)>(93)(status); }
  void ReleaseTensorTypeAndShapeInfo(TensorTypeAndShapeInfo* info) const {
    At<void (*)(TensorTypeAndShapeInfo*)>(99)(info);
  }
  Status* KernelContextParallelFor(const KernelContext* context, void (*fn)(void*, size_t),
                                   size_t total, size_t batches, void* data) const {
    return At<Status* (*)(const KernelContext*, void (*)(void*, size_t), size_t, size_t,
                          void*)>(274)(context, fn, total, batches, data);
  }
};

struct ApiBase {
  const Api* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
};

// A custom op's descriptor: ONNX Runtime reads the members that its `version` says exist.
struct CustomOp {
  uint32_t version;
  void* (*CreateKernel)(const CustomOp* op, const Api* api, const KernelInfo* info);
  const char* (*GetName)(const CustomOp* op);
  const char* (*GetExecutionProviderType)(const CustomOp* op);  // null: the CPU provider
  ElementType (*GetInputType)(const CustomOp* op, size_t index);
  size_t (*GetInputTypeCount)(const CustomOp* op);
  ElementType (*GetOutputType)(const CustomOp* op, size_t index);
  size_t (*GetOutputTypeCount)(const CustomOp* op);
  void (*KernelCompute)(void* kernel, KernelContext* context);
  void (*KernelDestroy)(void* kernel);
  Characteristic (*GetInputCharacteristic)(const CustomOp* op, size_t index);
  Characteristic (*GetOutputCharacteristic)(const CustomOp* op, size_t index);
  MemType (*GetInputMemoryType)(const CustomOp* op, size_t index);
  int (*GetVariadicInputMinArity)(const CustomOp* op);
  int (*GetVariadicInputHomogeneity)(const CustomOp* op);
  int (*GetVariadicOutputMinArity)(const CustomOp* op);
  int (*GetVariadicOutputHomogeneity)(const CustomOp* op);
  Status* (*CreateKernelV2)(const CustomOp* op, const Api* api, const KernelInfo* info,
                            void** kernel);
  Status* (*KernelComputeV2)(void* kernel, KernelContext* context);
  Status* (*InferOutputShapeFn)(const CustomOp* op, ShapeInferContext* context);
  int (*GetStartVersion)(const CustomOp* op);
  int (*GetEndVersion)(const CustomOp* op);
  size_t (*GetMayInplace)(int** inputs, int** outputs);
  void (*ReleaseMayInplace)(int* inputs, int* outputs);
  size_t (*GetAliasMap)(int** inputs, int** outputs);
  void (*ReleaseAliasMap)(int* inputs, int* outputs);
};

}  // namespace ort
