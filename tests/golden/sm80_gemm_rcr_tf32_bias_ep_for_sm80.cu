// generated from templates/sm80_gemm.cu.hbs; do not edit
// spec: {"family":"sm80_gemm","arch":"sm80","layout":"rcr","math":"tf32","dtype":"f32","tile":[128,128,32],"cluster":[1,1,1],"schedule":"multistage","scheduler":"persistent","bias":true,"align":4,"warps":[2,2,1],"stages":3,"fusion":{"leaves":["full"],"instrs":[{"op":"gelu","args":[{"value":0}]},{"op":"add","args":[{"value":1},{"leaf":0}]}]}}
//
// sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80: out[m,n] = f(a[m,k] . B + bias[n], leaves) (torch layout rcr) with CUTLASS 2.x
// GemmUniversal (sm80 multistage mainloop, cutlass::arch::OpMultiplyAdd) and an Sm80EVT epilogue visitor tree, f =
// leaves=full;v1=gelu(v0);v2=add(v1,l0).
// The kernel computes torch's row-major problem out[m,n] = a . B: the one the unfused sm80 kernels'
// column-major GemmUniversal transposes back into, with the same tile, warps and stages. The tree is
// one fp32 compute node over the accumulator, the bias and the leaves (a value used twice is
// computed once), under an aux-store node that writes out; a residual is an aux load. Stream-K
// kernels split K; serial split-K does not run with a visitor tree.
#include "fact_kernels.h"

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/default_gemm_universal_with_visitor.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle_streamk.h"
// After the kernel's headers, which declare what the visitors build on.
#include "cutlass/epilogue/threadblock/fusion/visitors.hpp"

namespace {
namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_ns {
using namespace cute;

using Element = float;
using ElementAccumulator = float;
using ElementCompute = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutC = cutlass::layout::RowMajor;
constexpr int Alignment = 4;
constexpr bool kStreamK = false;

using ThreadblockShape = cutlass::gemm::GemmShape<128, 128, 32>;
using WarpShape = cutlass::gemm::GemmShape<64, 64, 32>;
using InstructionShape = cutlass::gemm::GemmShape<16, 8, 8>;
// The output tile as the epilogue's threads visit it (one epilogue stage), as the mainloop's default
// epilogue lays it out.
using OutputTileThreadMap =
    cutlass::epilogue::threadblock::OutputTileThreadLayout<ThreadblockShape, WarpShape, Element, Alignment, 1>;

template <class T>
struct FusedEpilogue {
  CUTLASS_HOST_DEVICE T operator()(T const& acc, T const& bias, T const& l0) const {
    T out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < int(T::kElements); ++i) {
      const float v0 = acc[i] + bias[i];
      const float v1 = 0.5f * v0 * (1.f + erff(v0 * 0.70710678118654752f));
      const float v2 = v1 + l0[i];
      out[i] = v2;
    }
    return out;
  }
};

using Compute = cutlass::epilogue::threadblock::Sm80EVT<
    cutlass::epilogue::threadblock::VisitorCompute<FusedEpilogue, Element, ElementCompute, cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::threadblock::VisitorAccFetch,
    cutlass::epilogue::threadblock::VisitorRowBroadcast<OutputTileThreadMap, Element, Stride<_0, _1, int64_t>>,
    cutlass::epilogue::threadblock::VisitorAuxLoad<OutputTileThreadMap, Element, Stride<int64_t, _1, int64_t>>>;
using FusionCallbacks = cutlass::epilogue::threadblock::Sm80EVT<
    cutlass::epilogue::threadblock::VisitorAuxStore<OutputTileThreadMap, Element, cutlass::FloatRoundStyle::round_to_nearest,
                                                    Stride<int64_t, _1, int64_t>>,
    Compute>;

using GemmKernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
    Element, LayoutA, cutlass::ComplexTransform::kNone, Alignment,
    Element, LayoutB, cutlass::ComplexTransform::kNone, Alignment,
    Element, LayoutC, Alignment,
    ElementAccumulator, ElementCompute,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    ThreadblockShape, WarpShape, InstructionShape,
    FusionCallbacks,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>,
    3, cutlass::arch::OpMultiplyAdd, 1>::GemmKernel;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

typename Gemm::Arguments make_arguments(const FactGemmArgs& p) {
  const int M = p.m, N = p.n, K = p.k, L = p.batch;
  const auto mode = L > 1 ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm;
  const int64_t lda = K, ldb = K;
  const int64_t mn = int64_t(M) * N;
  typename FusionCallbacks::Arguments callbacks{
      { {}, {static_cast<const Element*>(p.bias), Element(0), {}}, {const_cast<Element*>(static_cast<const Element*>(p.leaves[0])), Element(0), {int64_t(N), _1{}, mn}}, {} },
      {static_cast<Element*>(p.out), {int64_t(N), _1{}, mn}},
  };
  return typename Gemm::Arguments(
      mode, {M, N, K}, L, callbacks,
      p.a, p.b, nullptr, nullptr,
      int64_t(M) * K, int64_t(N) * K, 0, mn,
      lda, ldb, 0, 0);
}
}  // namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_can_implement(const FactGemmArgs* p) {
  using namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_ns;
  if (p->bias == nullptr) return FACT_CANNOT_IMPLEMENT;
  for (int i = 0; i < 1; ++i) {
    if (p->leaves[i] == nullptr) return FACT_CANNOT_IMPLEMENT;
  }
  // CUTLASS's Sm80 EVT only asserts against serial split-K, which the NDEBUG build drops.
  if (p->splits > 1) return FACT_CANNOT_IMPLEMENT;
  // Serial split-K and Stream-K are for single GEMMs here.
  if (p->batch > 1 && (kStreamK || p->splits > 1)) return FACT_CANNOT_IMPLEMENT;
  return Gemm::can_implement(make_arguments(*p)) == cutlass::Status::kSuccess ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_workspace_size(const FactGemmArgs* p) {
  using namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_ns;
  return Gemm::get_workspace_size(make_arguments(*p));
}

extern "C" __attribute__((weak)) int32_t fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_run(const FactGemmArgs* p, void* workspace, size_t workspace_size,
                                       void* stream) {
  using namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_ns;
  if (fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_can_implement(p) != FACT_OK) return FACT_CANNOT_IMPLEMENT;
  auto args = make_arguments(*p);
  if (Gemm::get_workspace_size(args) > workspace_size) return FACT_WORKSPACE_TOO_SMALL;
  Gemm gemm;
  auto s = static_cast<cudaStream_t>(stream);
  if (gemm.initialize(args, workspace, s) != cutlass::Status::kSuccess) return FACT_INIT_FAILED;
  if (gemm.run(s) != cutlass::Status::kSuccess) return FACT_LAUNCH_FAILED;
  return FACT_OK;
}
