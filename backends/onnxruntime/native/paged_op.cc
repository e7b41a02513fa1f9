// ai.dayzero.PagedAttention: the ONNX Runtime custom op around paged_attention.h.
//
// PagedAttention(q, k, v, cos?, sin?, k_cache, v_cache, seq_slots, token_seq, token_len)
//     -> output, new_k, new_v
//   q [1, T, num_heads * head_size], k [1, T, kv_num_heads * head_size],
//   v [1, T, kv_num_heads * v_size];
//   or packed: k and v absent, q [1, T, (num_heads + 2 * kv_num_heads) * head_size] holding
//   [q | k | v] per token (a merged QKV projection's output, read in place: no Split);
//   cos, sin [rows >= T, head_size]: row t rotates token t's q and k (full width, rotate_half);
//   k_cache [P, kv_num_heads, head_size], v_cache [P, kv_num_heads, v_size] (float32);
//   seq_slots [N, L], token_seq [T], token_len [T] (int64): see compiler/ir/ops/paged.py;
//   output [1, T, num_heads * v_size], new_k [T, kv_num_heads, head_size] (rotated),
//   new_v [T, kv_num_heads, v_size].
// Attributes num_heads, kv_num_heads, scale (all required), window (default 0: none), softcap
// (default 0: none). The IR op paged_attention with every attribute explicit.
//
// Like custom_ops.cc, no C++ exception crosses the C ABI.
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <new>
#include <string>

#include "op_support.h"
#include "ort_abi.h"
#include "paged_attention.h"

namespace dayzero {
namespace {

constexpr size_t kInputs = 10;
constexpr size_t kFirstIndexInput = 7;  // seq_slots, token_seq and token_len are int64

struct Kernel {
  const ort::Api* api;
  int64_t num_heads = 0, kv_heads = 0, window = 0;
  float scale = 0.0f, softcap = 0.0f;
};

constexpr const char* kOp = "PagedAttention";

ort::Status* Error(const ort::Api* api, const std::string& message) {
  return OpError(api, kOp, message);
}

ort::Status* Failure(const ort::Api* api, const char* where) noexcept {
  return OpFailure(api, kOp, where);
}

ort::Status* CreateKernel(const ort::CustomOp*, const ort::Api* api, const ort::KernelInfo* info,
                          void** out) noexcept {
  Kernel a{api};
  const auto i64 = &ort::Api::KernelInfoGetAttributeInt64;
  const auto f32 = &ort::Api::KernelInfoGetAttributeFloat;
  a.num_heads = Attribute<int64_t>(api, i64, info, "num_heads", 0);
  a.kv_heads = Attribute<int64_t>(api, i64, info, "kv_num_heads", 0);
  a.window = Attribute<int64_t>(api, i64, info, "window", 0);
  a.scale = Attribute<float>(api, f32, info, "scale", std::numeric_limits<float>::quiet_NaN());
  a.softcap = Attribute<float>(api, f32, info, "softcap", 0.0f);
  if (a.num_heads <= 0 || a.num_heads > kPagedMaxHeads || a.kv_heads <= 0 ||
      a.num_heads % a.kv_heads != 0) {
    return Error(api, "num_heads and kv_num_heads must be positive, num_heads a multiple of "
                      "kv_num_heads and at most " + std::to_string(kPagedMaxHeads));
  }
  if (!std::isfinite(a.scale)) return Error(api, "scale is required and must be finite");
  if (!std::isfinite(a.softcap)) return Error(api, "softcap must be finite (0: none)");
  if (a.window < 0) return Error(api, "window must be positive (0: none)");
  try {
    *out = new Kernel(a);
  } catch (...) {
    return Failure(api, "CreateKernel");
  }
  return nullptr;
}

using Tensor = InputTensor;

ort::Status* ReadInput(const ort::Api* api, ort::KernelContext* context, size_t index,
                       Tensor* out) {
  return dayzero::ReadInput(api, kOp, context, index, 1, 3,
                            index < kFirstIndexInput ? ort::kFloat : ort::kInt64, out);
}

bool Is(const Tensor& t, std::initializer_list<int64_t> dims) {
  if (t.rank != dims.size()) return false;
  size_t i = 0;
  for (int64_t d : dims) {
    if (t.dims[i++] != d) return false;
  }
  return true;
}

// Fills in the problem's shapes from the inputs; an error names what does not fit.
ort::Status* Describe(const Kernel& k, const Tensor in[kInputs], PagedProblem* p) {
  const ort::Api* api = k.api;
  const Tensor &q = in[0], &key = in[1], &value = in[2], &cos = in[3], &sin = in[4];
  const Tensor &k_cache = in[5], &v_cache = in[6], &slots = in[7], &seq = in[8], &len = in[9];
  for (size_t i : {0, 5, 6, 7, 8, 9}) {
    if (in[i].data == nullptr) return Error(api, "input " + std::to_string(i) + " is required");
  }
  const bool packed = key.data == nullptr;
  if (packed != (value.data == nullptr)) return Error(api, "k and v come together");
  const int64_t width = packed ? k.num_heads + 2 * k.kv_heads : k.num_heads;
  if (q.rank != 3 || q.dims[0] != 1 || q.dims[2] % width)
    return Error(api, packed ? "a packed q must be [1, tokens, (num_heads + 2 * kv_num_heads)"
                               " * head_size]"
                             : "q must be [1, tokens, num_heads * head_size]");
  const int64_t tokens = q.dims[1], size = q.dims[2] / width;
  if (!packed && !Is(key, {1, tokens, k.kv_heads * size}))
    return Error(api, "k must be [1, tokens, kv_num_heads * head_size] like q");
  if (!packed && (value.rank != 3 || value.dims[0] != 1 || value.dims[1] != tokens ||
                  value.dims[2] % k.kv_heads))
    return Error(api, "v must be [1, tokens, kv_num_heads * v_size]");
  const int64_t v_size = packed ? size : value.dims[2] / k.kv_heads;
  if ((cos.data == nullptr) != (sin.data == nullptr))
    return Error(api, "cos and sin come together");
  if (cos.data && (cos.rank != 2 || cos.dims[1] != size || !Is(sin, {cos.dims[0], size})))
    return Error(api, "cos and sin must both be [rows, head_size]");
  if (k_cache.rank != 3 || !Is(k_cache, {k_cache.dims[0], k.kv_heads, size}) ||
      !Is(v_cache, {k_cache.dims[0], k.kv_heads, v_size}))
    return Error(api, "k_cache and v_cache must be [slots, kv_num_heads, head_size] and "
                      "[slots, kv_num_heads, v_size]");
  if (slots.rank != 2 || !Is(seq, {tokens}) || !Is(len, {tokens}))
    return Error(api, "seq_slots must be [sequences, length], token_seq and token_len [tokens]");
  *p = PagedProblem{};
  p->tokens = tokens;
  p->num_heads = k.num_heads;
  p->kv_heads = k.kv_heads;
  p->head_size = size;
  p->v_size = v_size;
  p->pool_slots = k_cache.dims[0];
  p->sequences = slots.dims[0];
  p->length = slots.dims[1];
  p->q = q.f();
  p->k = packed ? q.f() + k.num_heads * size : key.f();
  p->v = packed ? q.f() + (k.num_heads + k.kv_heads) * size : value.f();
  if (packed) p->q_stride = p->k_stride = p->v_stride = q.dims[2];
  p->cos = cos.f();
  p->sin = sin.f();
  p->cos_rows = cos.data ? cos.dims[0] : 0;
  p->k_cache = k_cache.f();
  p->v_cache = v_cache.f();
  p->seq_slots = slots.i();
  p->token_seq = seq.i();
  p->token_len = len.i();
  p->window = k.window;
  p->scale = k.scale;
  p->softcap = k.softcap;
  if (const char* why = PagedAttentionCheck(*p)) return Error(api, why);
  return nullptr;
}

ort::Status* ComputeOrThrow(void* kernel, ort::KernelContext* context) {
  const Kernel& k = *static_cast<Kernel*>(kernel);
  const ort::Api* api = k.api;
  Tensor in[kInputs];
  for (size_t i = 0; i < kInputs; ++i) {
    if (ort::Status* status = ReadInput(api, context, i, &in[i])) return status;
  }
  PagedProblem p;
  if (ort::Status* status = Describe(k, in, &p)) return status;
  const int64_t out_dims[3] = {1, p.tokens, p.num_heads * p.v_size};
  const int64_t k_dims[3] = {p.tokens, p.kv_heads, p.head_size};
  const int64_t v_dims[3] = {p.tokens, p.kv_heads, p.v_size};
  if (ort::Status* status = FloatOutput(api, context, 0, out_dims, &p.out)) return status;
  if (ort::Status* status = FloatOutput(api, context, 1, k_dims, &p.new_k)) return status;
  if (ort::Status* status = FloatOutput(api, context, 2, v_dims, &p.new_v)) return status;
  return RunOnThreads(api, kOp, context, p, PagedAttention);
}

struct PagedAttentionOp {
  static constexpr const char* kName = kOp;
  static constexpr size_t kInputs = dayzero::kInputs, kOutputs = 3;
  static ort::ElementType InputType(size_t index) {
    return index < kFirstIndexInput ? ort::kFloat : ort::kInt64;
  }
  static bool Optional(size_t index) { return index >= 1 && index <= 4; }
  using Kernel = dayzero::Kernel;
  static constexpr auto CreateKernel = dayzero::CreateKernel;
  static constexpr auto ComputeOrThrow = dayzero::ComputeOrThrow;
};

const ort::CustomOp kPagedAttention = MakeCustomOp<PagedAttentionOp>();

}  // namespace

const ort::CustomOp* PagedAttentionOp() { return &kPagedAttention; }

}  // namespace dayzero
