// generated from templates/sm80_fmha.cu.hbs; do not edit
// sm80_fmha_tf32_f32_q32_k128_d128: CUTLASS's fused multi-head attention forward (examples/41_fused_multi_head_attention,
// sm80 mma.sync code, built for sm90), 32 queries x 128 keys per CTA, head dim up to
// 128, tf32 math. Tensors (FactOpArgs, include/fact_kernels.h): q [B,Hq,Tq,D], k and v
// [B,Hkv,Tk,D] (Hkv dividing Hq: query head h reads k/v head h / (Hq/Hkv), in place) read through
// their strides (unit stride along D), out [B,Hq,Tq,D] stored as [B,Tq,Hq,D], a factor (one fp32
// value in device memory, e.g. a divisor the graph computes on the GPU, or [Hq] of them, one per
// query head, Swin V2's logit scale; NULL data when none) and
// each sequence's key count (int32 [B] in device memory: keys at or past lengths[b] masked for
// every query of batch b; NULL data when all Tk keys count); scalars: scale, causal, and the
// factor's power (1: scale·factor, -1: scale/factor). The kernel reads the factor and the lengths
// itself, so the host never waits for them; grouped heads and lengths are arguments of one
// compiled kernel. No bias (NULL data).
#include "fact_kernels.h"

#include <cuda_runtime.h>
#include <atomic>
#include <cstdint>

#include "gemm_kernel_utils.h"
#ifndef FACT_FMHA_1XTF32
#define FACT_FMHA_1XTF32
// The example multiplies fp32 tensors with 3xTF32 (OpMultiplyAddFastF32); under the tf32 policy
// one tf32 product is the contract, so fp32 operands go through CUTLASS's plain tf32 warp MMA.
// A library never holds both float maths (nvcc::build_library refuses to mix them), so this
// specialization is the only one of its type wherever it is linked.
template <>
struct gemm_kernel_utils::DefaultGemmType<cutlass::arch::Sm80, float, void> {
  static constexpr int ThreadK = 32;
  static constexpr int WarpK = 32;
  static constexpr int kMinimumAlignment = 4;
  using OpClass = cutlass::arch::OpClassTensorOp;
  using InstructionShape = cutlass::gemm::GemmShape<16, 8, 8>;
  using Operator = cutlass::arch::OpMultiplyAdd;
};
#endif
#include "kernel_forward.h"

// Internal linkage: a unit may hold a kernel that another object linked beside it holds too
// (a sweep's unit next to the same kernel built alone); only the weak entry points are shared.
namespace {
namespace fact_sm80_fmha_tf32_f32_q32_k128_d128 {

// `find(device)` for the current device, found on the device's first call and kept per `Tag`:
// setting a kernel's attribute or querying the device costs microseconds, which every launch of a
// short kernel would make the GPU wait for, and CUDA keeps a kernel's attributes per device. A
// negative value (it failed) is not kept, so the next call asks again; two threads may both find
// it, and keep the same value.
template <class Tag, class Find>
int per_device(Find find) {
  constexpr int kDevices = 64;
  // The value plus one; 0 until found (static storage starts zeroed).
  static std::atomic<int> kept[kDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  if (device < 0 || device >= kDevices) return find(device);
  const int k = kept[device].load(std::memory_order_acquire);
  if (k > 0) return k - 1;
  const int v = find(device);
  if (v >= 0) kept[device].store(v + 1, std::memory_order_release);
  return v;
}

template <class Kernel>
struct SmemOptIn {};

// Opts `kernel` (of type `Kernel`) into `smem` bytes of dynamic shared memory on the current
// device, where it needs more than the 48 KiB every kernel may use, once per device: CUTLASS's
// adapters set it in every initialize (3 us a call). False when CUDA refuses.
template <class Kernel>
bool smem_opt_in(const void* kernel, int smem) {
  if (smem <= (48 << 10)) return true;
  return per_device<SmemOptIn<Kernel>>([&](int) {
           if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess) return 1;
           // Cleared, so the launch check after the next kernel does not report it.
           (void)cudaGetLastError();
           return -1;
         }) > 0;
}

using AK = AttentionKernel<float, cutlass::arch::Sm80, /*isAligned=*/true, 32, 128, 128,
                           /*kSupportsDropout=*/false, /*kSupportsBias=*/false>;

__global__ void __launch_bounds__(AK::kNumThreads, AK::kMinBlocksPerSm)
    attention(typename AK::Params p, const float* factor, int factor_step, int power, const int32_t* lengths, int group) {
  // One factor, or one per query head (the grid's y; Swin V2's logit scale): factor_step 0 or 1.
  if (factor != nullptr) {
    const float f = factor[blockIdx.y * factor_step];
    p.scale = power > 0 ? p.scale * f : p.scale / f;
  }
  if (!p.advance_to_block()) return;
  // The grid's y is the query head; advance_to_block stepped k and v by it, and grouped heads read
  // k/v head h / group: step back the difference (make_call checks the kernel's 32-bit head
  // offsets cannot wrap, so the two offsets cancel exactly).
  if (group > 1) {
    const int64_t back = int64_t(blockIdx.y) - int64_t(blockIdx.y / group);
    p.key_ptr -= back * p.k_strideH;
    p.value_ptr -= back * p.v_strideH;
  }
  // The kernel masks keys at or past num_keys in its last key block and skips the blocks past it
  // (advance_to_block already cut num_keys to the causal bound); a length below 1 would leave a
  // row with no key, so it counts as 1 (the op passes 1 <= length <= Tk).
  if (lengths != nullptr) p.num_keys = cutlass::fast_min(p.num_keys, cutlass::fast_max(lengths[blockIdx.z], 1));
  AK::attention_kernel(p);
}

constexpr int64_t kAlign = 16 / sizeof(float);

bool fits_i32(int64_t v) { return v >= 0 && v <= INT32_MAX; }

// One call: the kernel's parameters and what the wrapper reads beside them.
struct Call {
  typename AK::Params p;
  const float* factor = nullptr;
  int factor_step = 0;
  const int32_t* lengths = nullptr;
  int group = 1;
};

// The call's parameters, or false when the call does not fit: every check the kernel's own
// check_supported makes (which would print), plus shapes, dtypes, the optional tensors and the
// output layout the kernel writes.
bool make_call(const FactOpArgs* a, Call& c) {
  if (a == nullptr || a->num_tensors != 7 || a->num_scalars != 3) return false;
  const FactTensor& f = a->tensors[4];
  int64_t factors = 1;
  if (f.data != nullptr) {
    for (int i = 0; i < f.rank; ++i) factors *= f.sizes[i];
    if (f.dtype != FACT_F32 || (a->scalars[2] != 1.0 && a->scalars[2] != -1.0)) return false;
    if (factors > 1 && (f.rank != 1 || f.strides[0] != 1)) return false;
    c.factor = static_cast<const float*>(f.data);
    c.factor_step = factors > 1 ? 1 : 0;
  }
  const FactTensor& q = a->tensors[0];
  const FactTensor& k = a->tensors[1];
  const FactTensor& v = a->tensors[2];
  const FactTensor& o = a->tensors[3];
  for (const FactTensor* t : {&q, &k, &v, &o}) {
    if (t->rank != 4 || t->dtype != 0 || t->strides[3] != 1) return false;
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return false;
  }
  const int64_t B = q.sizes[0], H = q.sizes[1], Tq = q.sizes[2], D = q.sizes[3], Tk = k.sizes[2], Hkv = k.sizes[1];
  if (B <= 0 || H <= 0 || Hkv <= 0 || Tq <= 0 || Tk <= 0 || D <= 0 || D > 128 || D % kAlign != 0) return false;
  if (H % Hkv != 0 || k.sizes[0] != B || k.sizes[3] != D) return false;
  // One factor, or one per query head.
  if (factors != 1 && factors != H) return false;
  for (int i = 0; i < 4; ++i) {
    if (v.sizes[i] != k.sizes[i] || o.sizes[i] != q.sizes[i]) return false;
  }
  const FactTensor& len = a->tensors[5];
  if (len.data != nullptr) {
    if (len.rank != 1 || len.dtype != FACT_I32 || len.sizes[0] != B || (B > 1 && len.strides[0] != 1)) return false;
    if (reinterpret_cast<uintptr_t>(len.data) % sizeof(int32_t) != 0) return false;
    c.lengths = static_cast<const int32_t*>(len.data);
  }
  // The kernel writes out[b][t][h][:] packed.
  if (o.strides[0] != Tq * H * D || o.strides[1] != D || o.strides[2] != H * D) return false;
  for (const FactTensor* t : {&q, &k, &v}) {
    for (int i = 0; i < 3; ++i) {
      if (t->strides[i] % kAlign != 0 || t->strides[i] < 0) return false;
    }
    if (!fits_i32(t->strides[1]) || !fits_i32(t->strides[2])) return false;
    // advance_to_block offsets a head by blockIdx.y (a query head, up to H - 1) times the head
    // stride in 32-bit unsigned arithmetic.
    if ((H - 1) * t->strides[1] > int64_t(UINT32_MAX)) return false;
  }
  if (!fits_i32(B) || !fits_i32(H) || !fits_i32(Tq) || !fits_i32(Tk) || !fits_i32(H * D)) return false;
  c.group = static_cast<int>(H / Hkv);
  const FactTensor& bias = a->tensors[6];
  if (bias.data != nullptr) return false;
  typename AK::Params& p = c.p;
  p.query_ptr = static_cast<float*>(q.data);
  p.key_ptr = static_cast<float*>(k.data);
  p.value_ptr = static_cast<float*>(v.data);
  p.output_ptr = static_cast<float*>(o.data);
  p.output_accum_ptr = nullptr;
  p.logsumexp_ptr = nullptr;
  p.scale = static_cast<float>(a->scalars[0]);
  p.custom_mask_type = a->scalars[1] != 0.0 ? AK::CausalFromTopLeft : AK::NoCustomMask;
  p.num_batches = static_cast<int32_t>(B);
  p.num_heads = static_cast<int32_t>(H);
  p.num_queries = static_cast<int32_t>(Tq);
  p.num_keys = static_cast<int32_t>(Tk);
  p.head_dim = static_cast<int32_t>(D);
  p.head_dim_value = static_cast<int32_t>(D);
  p.q_strideM = static_cast<int32_t>(q.strides[2]);
  p.k_strideM = static_cast<int32_t>(k.strides[2]);
  p.v_strideM = static_cast<int32_t>(v.strides[2]);
  p.q_strideH = static_cast<int32_t>(q.strides[1]);
  p.k_strideH = static_cast<int32_t>(k.strides[1]);
  p.v_strideH = static_cast<int32_t>(v.strides[1]);
  p.q_strideB = q.strides[0];
  p.k_strideB = k.strides[0];
  p.v_strideB = v.strides[0];
  p.o_strideM = static_cast<int32_t>(H * D);
  return true;
}

// fp32 running output between key blocks, when it cannot stay in registers: [B,Tq,H,D].
size_t accumulator_bytes(const FactOpArgs* a) {
  if (!AK::kNeedsOutputAccumulatorBuffer) return 0;
  const FactTensor& q = a->tensors[0];
  return static_cast<size_t>(q.sizes[0] * q.sizes[1] * q.sizes[2] * q.sizes[3]) * sizeof(float);
}

}  // namespace fact_sm80_fmha_tf32_f32_q32_k128_d128
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm80_fmha_tf32_f32_q32_k128_d128_can_implement(const FactOpArgs* a, const FactKnobs*) {
  fact_sm80_fmha_tf32_f32_q32_k128_d128::Call c;
  if (!fact_sm80_fmha_tf32_f32_q32_k128_d128::make_call(a, c)) return FACT_CANNOT_IMPLEMENT;
  return fact_sm80_fmha_tf32_f32_q32_k128_d128::AK::check_supported(c.p) ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm80_fmha_tf32_f32_q32_k128_d128_workspace_size(const FactOpArgs* a, const FactKnobs*) {
  fact_sm80_fmha_tf32_f32_q32_k128_d128::Call c;
  if (!fact_sm80_fmha_tf32_f32_q32_k128_d128::make_call(a, c)) return 0;
  return fact_sm80_fmha_tf32_f32_q32_k128_d128::accumulator_bytes(a);
}

extern "C" __attribute__((weak)) int32_t fact_k_sm80_fmha_tf32_f32_q32_k128_d128_run(const FactOpArgs* a, const FactKnobs*, void* workspace,
                                                             size_t workspace_size, void* stream) {
  using AK = fact_sm80_fmha_tf32_f32_q32_k128_d128::AK;
  fact_sm80_fmha_tf32_f32_q32_k128_d128::Call c;
  if (!fact_sm80_fmha_tf32_f32_q32_k128_d128::make_call(a, c) || !AK::check_supported(c.p)) return FACT_CANNOT_IMPLEMENT;
  const size_t need = fact_sm80_fmha_tf32_f32_q32_k128_d128::accumulator_bytes(a);
  if (need > 0) {
    if (workspace == nullptr || workspace_size < need) return FACT_WORKSPACE_TOO_SMALL;
    c.p.output_accum_ptr = static_cast<typename AK::output_accum_t*>(workspace);
  }
  constexpr auto kernel = fact_sm80_fmha_tf32_f32_q32_k128_d128::attention;
  const int smem = static_cast<int>(sizeof(typename AK::SharedStorage));
  if (!fact_sm80_fmha_tf32_f32_q32_k128_d128::smem_opt_in<AK>(reinterpret_cast<const void*>(kernel), smem)) return FACT_INIT_FAILED;
  kernel<<<c.p.getBlocksGrid(), c.p.getThreadsGrid(), smem, static_cast<cudaStream_t>(stream)>>>(
      c.p, c.factor, c.factor_step, a->scalars[2] > 0 ? 1 : -1, c.lengths, c.group);
  return FACT_OK;
}
