// dayzero's ONNX Runtime custom-op library: domain "ai.dayzero", ops CausalAttention,
// PagedAttention (paged_op.cc) and MatMulInt4 (int4_op.cc).
//
// CausalAttention(query, key?, value?, cos_cache?, sin_cache?) -> output
//   query  [batch, seq, num_heads * head_size], or [batch, seq, (num_heads + 2 * kv_num_heads)
//          * head_size] holding q, k and v side by side when key and value are absent;
//   key, value  [batch, seq, kv_num_heads * head_size];
//   cos_cache, sin_cache  [positions, rotary_dim / 2]: row i rotates token i (rotary_interleaved
//          picks pairs (2i, 2i + 1) instead of halves);
//   output [batch, seq, num_heads * head_size].
// Attributes num_heads, kv_num_heads (required), scale (default 1 / sqrt(head_size)),
// rotary_interleaved (default 0). Causal, float32, no past: a prompt's self-attention, with the
// inputs and attributes of com.microsoft.GroupQueryAttention minus its length inputs.
//
// ONNX Runtime loads the library with SessionOptions.register_custom_ops_library; it calls
// RegisterCustomOps below with the runtime's API base.
//
// No C++ exception crosses the C ABI: every entry point ONNX Runtime calls catches everything
// (std::bad_alloc included) and returns an error status instead.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "causal_attention.h"
#include "op_support.h"
#include "ort_abi.h"

namespace dayzero {
const ort::CustomOp* PagedAttentionOp();  // paged_op.cc
const ort::CustomOp* MatMulInt4Op();      // int4_op.cc
const ort::CustomOp* PackedLinearOp();    // packed_linear_op.cc
}  // namespace dayzero

namespace {

constexpr const char* kDomain = "ai.dayzero";
constexpr size_t kInputs = 5;

struct Kernel {
  const ort::Api* api;
  int64_t num_heads = 0, kv_heads = 0, interleaved = 0;
  float scale = 0.0f;  // 0: 1 / sqrt(head_size)
};

constexpr const char* kOp = "CausalAttention";

ort::Status* Error(const ort::Api* api, const std::string& message) {
  return dayzero::OpError(api, kOp, message);
}

ort::Status* Failure(const ort::Api* api, const char* where) noexcept {
  return dayzero::OpFailure(api, kOp, where);
}

ort::Status* CreateKernel(const ort::CustomOp*, const ort::Api* api, const ort::KernelInfo* info,
                          void** out) noexcept {
  Kernel attrs{api};
  const auto i64 = &ort::Api::KernelInfoGetAttributeInt64;
  attrs.num_heads = dayzero::Attribute<int64_t>(api, i64, info, "num_heads", 0);
  attrs.kv_heads = dayzero::Attribute<int64_t>(api, i64, info, "kv_num_heads", 0);
  attrs.interleaved = dayzero::Attribute<int64_t>(api, i64, info, "rotary_interleaved", 0);
  attrs.scale = dayzero::Attribute<float>(api, &ort::Api::KernelInfoGetAttributeFloat, info,
                                          "scale", 0.0f);
  // Bounded here, so that no product of them (num_heads + 2 * kv_num_heads columns, a head's
  // offset) can overflow when the shapes are read.
  if (attrs.num_heads <= 0 || attrs.num_heads > dayzero::kMaxHeads || attrs.kv_heads <= 0 ||
      attrs.num_heads % attrs.kv_heads != 0) {
    return Error(api, "num_heads and kv_num_heads must be positive, num_heads a multiple of "
                      "kv_num_heads and at most " + std::to_string(dayzero::kMaxHeads));
  }
  if (attrs.interleaved != 0 && attrs.interleaved != 1)
    return Error(api, "rotary_interleaved must be 0 or 1");
  if (!std::isfinite(attrs.scale)) return Error(api, "scale must be finite");
  try {
    *out = new Kernel(attrs);
  } catch (...) {
    return Failure(api, "CreateKernel");
  }
  return nullptr;
}

using Tensor = dayzero::InputTensor;

ort::Status* ReadInput(const ort::Api* api, ort::KernelContext* context, size_t index,
                       Tensor* out) {
  return dayzero::ReadInput(api, kOp, context, index, 2, 3, ort::kFloat, out);
}

// Fills in the problem's shapes from the inputs; an error names what does not fit.
ort::Status* Describe(const Kernel& k, const Tensor in[kInputs], dayzero::AttentionProblem* p) {
  const ort::Api* api = k.api;
  const Tensor &q = in[0], &key = in[1], &value = in[2], &cos = in[3], &sin = in[4];
  if (q.rank != 3) return Error(api, "query must be [batch, seq, hidden]");
  if ((key.data == nullptr) != (value.data == nullptr))
    return Error(api, "key and value come together (or both absent, for packed q, k, v)");
  const bool packed = key.data == nullptr;
  const int64_t batch = q.dims[0], seq = q.dims[1], hidden = q.dims[2];
  const int64_t columns = packed ? k.num_heads + 2 * k.kv_heads : k.num_heads;  // attrs bounded
  if (hidden <= 0 || hidden % columns != 0)
    return Error(api, "query's last dim " + std::to_string(hidden) + " is not a multiple of " +
                          std::to_string(columns) + " heads");
  const int64_t size = hidden / columns, kv_width = k.kv_heads * size;
  for (const Tensor* t : {&key, &value}) {
    if (t->data && (t->rank != 3 || t->dims[0] != batch || t->dims[1] != seq ||
                    t->dims[2] != kv_width))
      return Error(api, "key and value must be [batch, seq, kv_num_heads * head_size] = [" +
                            std::to_string(batch) + ", " + std::to_string(seq) + ", " +
                            std::to_string(kv_width) + "]");
  }
  if ((cos.data == nullptr) != (sin.data == nullptr))
    return Error(api, "cos_cache and sin_cache come together");
  if (cos.data && (cos.rank != 2 || sin.rank != 2 || cos.dims[0] != sin.dims[0] ||
                   cos.dims[1] != sin.dims[1]))
    return Error(api, "cos_cache and sin_cache must both be [positions, rotary_dim / 2]");
  *p = dayzero::AttentionProblem{};
  p->batch = batch;
  p->seq = seq;
  p->num_heads = k.num_heads;
  p->kv_heads = k.kv_heads;
  p->head_size = size;
  p->q = {q.f(), hidden, seq * hidden};
  if (packed) {
    p->k = {q.f() + k.num_heads * size, hidden, seq * hidden};
    p->v = {q.f() + (k.num_heads + k.kv_heads) * size, hidden, seq * hidden};
  } else {
    p->k = {key.f(), kv_width, seq * kv_width};
    p->v = {value.f(), kv_width, seq * kv_width};
  }
  p->cos = cos.f();
  p->sin = sin.f();
  p->cache_rows = cos.data ? cos.dims[0] : 0;
  p->rotary_half = cos.data ? cos.dims[1] : 0;
  p->interleaved = k.interleaved != 0;
  p->scale = k.scale != 0.0f ? k.scale : 1.0f / std::sqrt(static_cast<float>(size));
  if (const char* why = dayzero::CausalAttentionCheck(*p)) return Error(api, why);
  return nullptr;
}

ort::Status* ComputeOrThrow(void* kernel, ort::KernelContext* context) {
  const Kernel& k = *static_cast<Kernel*>(kernel);
  const ort::Api* api = k.api;
  Tensor in[kInputs];
  for (size_t i = 0; i < kInputs; ++i) {
    if (ort::Status* status = ReadInput(api, context, i, &in[i])) return status;
  }
  dayzero::AttentionProblem problem;
  if (ort::Status* status = Describe(k, in, &problem)) return status;
  const int64_t dims[3] = {problem.batch, problem.seq, problem.num_heads * problem.head_size};
  if (ort::Status* status = dayzero::FloatOutput(api, context, 0, dims, &problem.out))
    return status;
  return dayzero::RunOnThreads(api, kOp, context, problem, dayzero::CausalAttention);
}

struct CausalAttentionOp {
  static constexpr const char* kName = "CausalAttention";
  static constexpr size_t kInputs = ::kInputs, kOutputs = 1;
  static ort::ElementType InputType(size_t) { return ort::kFloat; }
  static bool Optional(size_t index) { return index != 0; }
  using Kernel = ::Kernel;
  static constexpr auto CreateKernel = ::CreateKernel;
  static constexpr auto ComputeOrThrow = ::ComputeOrThrow;
};

const ort::CustomOp kCausalAttention = dayzero::MakeCustomOp<CausalAttentionOp>();

// Tells an older runtime why the library refuses it. ort_abi.h's slots were counted for API
// version kApiVersion; an older runtime's table is shorter, and calling a slot past its end
// would jump to garbage, so nothing but the version-1 table's CreateStatus is used here.
ort::Status* TooOld(const ort::ApiBase* base) noexcept {
  const ort::Api* oldest = base->GetApi(1);
  if (oldest == nullptr) return nullptr;  // cannot happen: every runtime serves version 1
  const char* found = base->GetVersionString ? base->GetVersionString() : "unknown";
  char message[256];
  std::snprintf(message, sizeof(message),
                "dayzero's custom ops need ONNX Runtime API version %u (ONNX Runtime 1.%u) or "
                "newer; found ONNX Runtime %s, which does not serve API version %u",
                ort::kApiVersion, ort::kApiVersion, found, ort::kApiVersion);
  return oldest->CreateStatus(ort::kFail, message);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) ort::Status* RegisterCustomOps(
    ort::SessionOptions* options, const ort::ApiBase* base) noexcept {
  const ort::Api* api = base->GetApi(ort::kApiVersion);
  if (api == nullptr) return TooOld(base);
  try {
    // The domain must outlive every session made from these options; ONNX Runtime does not
    // take ownership, so it is kept for the life of the process (a few bytes per registration).
    ort::CustomOpDomain* domain = nullptr;
    if (ort::Status* status = api->CreateCustomOpDomain(kDomain, &domain)) return status;
    if (ort::Status* status = api->CustomOpDomainAdd(domain, &kCausalAttention)) return status;
    if (ort::Status* status = api->CustomOpDomainAdd(domain, dayzero::PagedAttentionOp()))
      return status;
    if (ort::Status* status = api->CustomOpDomainAdd(domain, dayzero::MatMulInt4Op()))
      return status;
    if (ort::Status* status = api->CustomOpDomainAdd(domain, dayzero::PackedLinearOp()))
      return status;
    return api->AddCustomOpDomain(options, domain);
  } catch (...) {
    return Failure(api, "RegisterCustomOps");
  }
}

// Bytes of scratch the kernel's threads keep between calls, for tests (see causal_attention.h).
extern "C" __attribute__((visibility("default"))) int64_t DayzeroRetainedScratchBytes() noexcept {
  return dayzero::CausalAttentionRetainedBytes();
}
