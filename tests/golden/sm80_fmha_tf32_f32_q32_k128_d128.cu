// generated from templates/sm80_fmha.cu.hbs; do not edit
// sm80_fmha_tf32_f32_q32_k128_d128: CUTLASS's fused multi-head attention forward (examples/41_fused_multi_head_attention,
// sm80 mma.sync code, built for sm90), 32 queries x 128 keys per CTA, head dim up to
// 128, tf32 math. Tensors (FactOpArgs): q [B,H,Tq,D], k [B,H,Tk,D], v [B,H,Tk,D] read through
// their strides (unit stride along D), out [B,H,Tq,D] stored as [B,Tq,H,D], and optionally a factor
// (one fp32 value in device memory, e.g. a divisor the graph computes on the GPU); scalars: scale,
// causal, and the factor's power (1: scale·factor, -1: scale/factor), read by the kernel itself so
// the host never waits for the value.
#include "fact_kernels.h"

#include <cuda_runtime.h>
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

namespace fact_sm80_fmha_tf32_f32_q32_k128_d128 {

using AK = AttentionKernel<float, cutlass::arch::Sm80, /*isAligned=*/true, 32, 128, 128,
                           /*kSupportsDropout=*/false, /*kSupportsBias=*/false>;

__global__ void __launch_bounds__(AK::kNumThreads, AK::kMinBlocksPerSm)
    attention(typename AK::Params p, const float* factor, int power) {
  if (factor != nullptr) p.scale = power > 0 ? p.scale * *factor : p.scale / *factor;
  if (!p.advance_to_block()) return;
  AK::attention_kernel(p);
}

constexpr int64_t kAlign = 16 / sizeof(float);

bool fits_i32(int64_t v) { return v >= 0 && v <= INT32_MAX; }

// The kernel's parameters for a call, or false when the call does not fit: every check the
// kernel's own check_supported makes (which would print), plus shapes, dtypes and the output
// layout the kernel writes.
bool make_params(const FactOpArgs* a, typename AK::Params& p) {
  if (a == nullptr || (a->num_tensors != 4 && a->num_tensors != 5) || a->num_scalars != 3) return false;
  if (a->num_tensors == 5) {
    const FactTensor& f = a->tensors[4];
    int64_t n = 1;
    for (int i = 0; i < f.rank; ++i) n *= f.sizes[i];
    if (f.dtype != FACT_F32 || n != 1 || f.data == nullptr || (a->scalars[2] != 1.0 && a->scalars[2] != -1.0)) return false;
  }
  const FactTensor& q = a->tensors[0];
  const FactTensor& k = a->tensors[1];
  const FactTensor& v = a->tensors[2];
  const FactTensor& o = a->tensors[3];
  for (const FactTensor* t : {&q, &k, &v, &o}) {
    if (t->rank != 4 || t->dtype != 0 || t->strides[3] != 1) return false;
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return false;
  }
  const int64_t B = q.sizes[0], H = q.sizes[1], Tq = q.sizes[2], D = q.sizes[3], Tk = k.sizes[2];
  if (B <= 0 || H <= 0 || Tq <= 0 || Tk <= 0 || D <= 0 || D > 128 || D % kAlign != 0) return false;
  if (k.sizes[0] != B || k.sizes[1] != H || k.sizes[3] != D) return false;
  for (int i = 0; i < 4; ++i) {
    if (v.sizes[i] != k.sizes[i] || o.sizes[i] != q.sizes[i]) return false;
  }
  // The kernel writes out[b][t][h][:] packed.
  if (o.strides[0] != Tq * H * D || o.strides[1] != D || o.strides[2] != H * D) return false;
  for (const FactTensor* t : {&q, &k, &v}) {
    for (int i = 0; i < 3; ++i) {
      if (t->strides[i] % kAlign != 0 || t->strides[i] < 0) return false;
    }
    if (!fits_i32(t->strides[1]) || !fits_i32(t->strides[2])) return false;
  }
  if (!fits_i32(B) || !fits_i32(H) || !fits_i32(Tq) || !fits_i32(Tk) || !fits_i32(H * D)) return false;
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

extern "C" __attribute__((weak)) int32_t fact_k_sm80_fmha_tf32_f32_q32_k128_d128_can_implement(const FactOpArgs* a, const FactKnobs*) {
  typename fact_sm80_fmha_tf32_f32_q32_k128_d128::AK::Params p;
  if (!fact_sm80_fmha_tf32_f32_q32_k128_d128::make_params(a, p)) return FACT_CANNOT_IMPLEMENT;
  return fact_sm80_fmha_tf32_f32_q32_k128_d128::AK::check_supported(p) ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm80_fmha_tf32_f32_q32_k128_d128_workspace_size(const FactOpArgs* a, const FactKnobs*) {
  typename fact_sm80_fmha_tf32_f32_q32_k128_d128::AK::Params p;
  if (!fact_sm80_fmha_tf32_f32_q32_k128_d128::make_params(a, p)) return 0;
  return fact_sm80_fmha_tf32_f32_q32_k128_d128::accumulator_bytes(a);
}

extern "C" __attribute__((weak)) int32_t fact_k_sm80_fmha_tf32_f32_q32_k128_d128_run(const FactOpArgs* a, const FactKnobs*, void* workspace,
                                                             size_t workspace_size, void* stream) {
  using AK = fact_sm80_fmha_tf32_f32_q32_k128_d128::AK;
  typename AK::Params p;
  if (!fact_sm80_fmha_tf32_f32_q32_k128_d128::make_params(a, p) || !AK::check_supported(p)) return FACT_CANNOT_IMPLEMENT;
  const size_t need = fact_sm80_fmha_tf32_f32_q32_k128_d128::accumulator_bytes(a);
  if (need > 0) {
    if (workspace == nullptr || workspace_size < need) return FACT_WORKSPACE_TOO_SMALL;
    p.output_accum_ptr = static_cast<typename AK::output_accum_t*>(workspace);
  }
  constexpr auto kernel = fact_sm80_fmha_tf32_f32_q32_k128_d128::attention;
  const int smem = static_cast<int>(sizeof(typename AK::SharedStorage));
  if (smem > 0xc000 && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
    return FACT_INIT_FAILED;
  }
  const float* factor = a->num_tensors == 5 ? static_cast<const float*>(a->tensors[4].data) : nullptr;
  kernel<<<p.getBlocksGrid(), p.getThreadsGrid(), smem, static_cast<cudaStream_t>(stream)>>>(
      p, factor, a->scalars[2] > 0 ? 1 : -1);
  return FACT_OK;
}
