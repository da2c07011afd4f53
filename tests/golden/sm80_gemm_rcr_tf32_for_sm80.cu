// generated from templates/sm80_gemm.cu.hbs; do not edit
// spec: {"family":"sm80_gemm","arch":"sm80","layout":"rcr","math":"tf32","dtype":"f32","tile":[128,128,32],"cluster":[1,1,1],"schedule":"multistage","scheduler":"persistent","bias":false,"align":4,"warps":[2,2,1],"stages":3}
//
// sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80: out[m,n] = a[m,k] . B (torch layout rcr) with CUTLASS 2.x
// GemmUniversal (sm80 multistage mainloop, cutlass::arch::OpMultiplyAdd), computed as the column-major problem
// out^T[n,m] = B^T . a^T like the sm90 family. The bias is operand C with a zero leading
// dimension, so C(i, j) = bias[i] broadcasts along the torch rows. FactGemmArgs::splits > 1 runs
// serial split-K (GemmUniversal's kGemm mode with batch_count slices, semaphore in the workspace).
#include "fact_kernels.h"

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cutlass/gemm/device/gemm_universal.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle_streamk.h"
#include "cutlass/epilogue/thread/linear_combination.h"

namespace {
namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80_ns {

using Element = float;
using ElementAccumulator = float;
// CUTLASS operand A is torch's B transposed, operand B is torch's a transposed: a row-major torch
// operand is a column-major CUTLASS one.
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutC = cutlass::layout::ColumnMajor;
constexpr int Alignment = 4;
constexpr bool kStreamK = false;

using EpilogueOp =
    cutlass::epilogue::thread::LinearCombination<Element, Alignment, ElementAccumulator, ElementAccumulator>;

using Gemm = cutlass::gemm::device::GemmUniversal<
    Element, LayoutA, Element, LayoutB, Element, LayoutC, ElementAccumulator,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<128, 128, 32>,
    cutlass::gemm::GemmShape<64, 64, 32>,
    cutlass::gemm::GemmShape<16, 8, 8>,
    EpilogueOp,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>,
    3, Alignment, Alignment, cutlass::arch::OpMultiplyAdd>;

typename Gemm::Arguments make_arguments(const FactGemmArgs& p) {
  const int M = p.n, N = p.m, K = p.k, L = p.batch;
  const bool batched = L > 1;
  const int slices = batched ? L : (!kStreamK && p.splits > 1 ? p.splits : 1);
  const auto mode = batched ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm;
  // Leading dimensions of the column-major views (see the header comment).
  const int64_t lda = K;
  const int64_t ldb = K, ldd = M;
  const void* c = p.out;
  const int64_t ldc = M, batch_c = int64_t(M) * N;
  const float beta = 0.0f;
  return typename Gemm::Arguments(
      mode, {M, N, K}, slices, {1.0f, beta},
      p.b, p.a, c, p.out,
      int64_t(M) * K, int64_t(N) * K, batch_c, int64_t(M) * N,
      lda, ldb, ldc, ldd);
}
}  // namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80_can_implement(const FactGemmArgs* p) {
  using namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80_ns;
  // Serial split-K and Stream-K are for single GEMMs here.
  if (p->batch > 1 && (kStreamK || p->splits > 1)) return FACT_CANNOT_IMPLEMENT;
  return Gemm::can_implement(make_arguments(*p)) == cutlass::Status::kSuccess ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80_workspace_size(const FactGemmArgs* p) {
  using namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80_ns;
  return Gemm::get_workspace_size(make_arguments(*p));
}

extern "C" __attribute__((weak)) int32_t fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80_run(const FactGemmArgs* p, void* workspace, size_t workspace_size,
                                       void* stream) {
  using namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80_ns;
  if (fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_align4_for_sm80_can_implement(p) != FACT_OK) return FACT_CANNOT_IMPLEMENT;
  auto args = make_arguments(*p);
  if (Gemm::get_workspace_size(args) > workspace_size) return FACT_WORKSPACE_TOO_SMALL;
  Gemm gemm;
  auto s = static_cast<cudaStream_t>(stream);
  if (gemm.initialize(args, workspace, s) != cutlass::Status::kSuccess) return FACT_INIT_FAILED;
  if (gemm.run(s) != cutlass::Status::kSuccess) return FACT_LAUNCH_FAILED;
  return FACT_OK;
}
