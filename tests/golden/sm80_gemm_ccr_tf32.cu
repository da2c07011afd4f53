// generated from templates/sm80_gemm.cu.hbs; do not edit
// spec: {"family":"sm80_gemm","arch":"sm90","layout":"ccr","math":"tf32","dtype":"f32","tile":[128,128,16],"cluster":[1,1,1],"schedule":"multistage","scheduler":"persistent","bias":false,"align":4,"warps":[2,2,1],"stages":3}
//
// sm80_gemm_ccr_tf32_f32_128x128x16_w2x2x1_s3_dp_align4: out[m,n] = a[m,k] . B (torch layout ccr) with CUTLASS 2.x
// GemmUniversal (sm80 multistage mainloop, cutlass::arch::OpMultiplyAdd), computed as the column-major problem
// out^T[n,m] = B^T . a^T like the sm90 family. The bias is operand C with a zero leading
// dimension, so C(i, j) = bias[i] broadcasts along the torch rows. FactKnobs::splits > 1 runs
// serial split-K (GemmUniversal's kGemm mode with batch_count slices, semaphore in the workspace).
#include "fact_kernels.h"

#include <cuda_runtime.h>

#include "cutlass/cutlass.h"
#include "cutlass/gemm/device/gemm_universal.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle.h"
#include "cutlass/gemm/threadblock/threadblock_swizzle_streamk.h"
#include "cutlass/epilogue/thread/linear_combination.h"

namespace {
namespace sm80_gemm_ccr_tf32_f32_128x128x16_w2x2x1_s3_dp_align4_ns {

// The call in torch's terms, out[L,M,N] = f(a[L,M,K] . B[L,K,N] + bias[N], leaves), every tensor
// packed as the layout says (a column-major, B column-major), so the kernel needs only their sizes and data.
struct Call {
  int m, n, k, batch;
  const void* a;
  const void* b;
  // NULL when the kernel adds no bias.
  const void* bias;
  void* out;
  // The epilogue's leaves, in the program's order.
  const void* leaves[FACT_MAX_LEAVES];
  // The variant's launch knobs (FactKnobs).
  int splits, raster, swizzle;
};

enum class Leaf { Full, Row, Col, Scalar };
constexpr int kDtype = 0;
constexpr bool kRowA = false, kRowB = false, kBias = false;
constexpr int kLeaves = 0;
constexpr Leaf kLeafKinds[FACT_MAX_LEAVES] = { };
static_assert(kLeaves <= FACT_MAX_LEAVES, "an epilogue reads at most FACT_MAX_LEAVES leaves");

// Whether `t` has element type `dtype`, `rank` dims of sizes `sizes` and, wherever a size is not
// one (a dim of size one is never stepped along), strides `strides`, from data aligned to `align`
// bytes.
inline bool fits(const FactTensor& t, int dtype, int rank, const int64_t* sizes, const int64_t* strides, uintptr_t align) {
  if (t.data == nullptr || t.dtype != dtype || t.rank != rank) return false;
  if (reinterpret_cast<uintptr_t>(t.data) % align != 0) return false;
  for (int d = 0; d < rank; ++d) {
    if (t.sizes[d] != sizes[d] || (sizes[d] != 1 && t.strides[d] != strides[d])) return false;
  }
  return true;
}

// The call `args` states, with the variant's `knobs`; false when this kernel cannot take it: the
// tensors are a, b, bias, the leaves and out, as include/fact_kernels.h says, and no scalars.
inline bool read_call(const FactOpArgs* args, const FactKnobs* knobs, Call& c) {
  if (args == nullptr || knobs == nullptr || args->tensors == nullptr) return false;
  if (args->num_tensors != 4 + kLeaves || args->num_scalars != 0) return false;
  const FactTensor* t = args->tensors;
  if (t[0].rank != 3 || t[1].rank != 3) return false;
  const int64_t L = t[0].sizes[0], M = t[0].sizes[1], K = t[0].sizes[2], N = t[1].sizes[2];
  auto dim = [](int64_t v) { return v >= 1 && v <= INT32_MAX; };
  if (!dim(L) || !dim(M) || !dim(K) || !dim(N)) return false;
  const int64_t a_sizes[3] = {L, M, K}, a_strides[3] = {M * K, kRowA ? K : 1, kRowA ? 1 : M};
  const int64_t b_sizes[3] = {L, K, N}, b_strides[3] = {K * N, kRowB ? N : 1, kRowB ? 1 : K};
  const int64_t out_sizes[3] = {L, M, N}, out_strides[3] = {M * N, N, 1};
  const int64_t row[1] = {N}, col[1] = {M}, one[1] = {1};
  if (!fits(t[0], kDtype, 3, a_sizes, a_strides, 16) || !fits(t[1], kDtype, 3, b_sizes, b_strides, 16)) return false;
  if (kBias ? !fits(t[2], kDtype, 1, row, one, 16) : t[2].data != nullptr) return false;
  if (!fits(t[3 + kLeaves], kDtype, 3, out_sizes, out_strides, 16)) return false;
  for (int i = 0; i < kLeaves; ++i) {
    const FactTensor& l = t[3 + i];
    bool ok = false;
    switch (kLeafKinds[i]) {
      case Leaf::Full: ok = fits(l, kDtype, 3, out_sizes, out_strides, 16); break;
      case Leaf::Row: ok = fits(l, kDtype, 1, row, one, 16); break;
      case Leaf::Col: ok = L == 1 && fits(l, kDtype, 1, col, one, 16); break;
      case Leaf::Scalar: ok = fits(l, FACT_F32, 1, one, one, sizeof(float)); break;
    }
    if (!ok) return false;
    c.leaves[i] = l.data;
  }
  for (int i = kLeaves; i < FACT_MAX_LEAVES; ++i) c.leaves[i] = nullptr;
  c.m = static_cast<int>(M);
  c.n = static_cast<int>(N);
  c.k = static_cast<int>(K);
  c.batch = static_cast<int>(L);
  c.a = t[0].data;
  c.b = t[1].data;
  c.bias = t[2].data;
  c.out = t[3 + kLeaves].data;
  c.splits = knobs->splits;
  c.raster = knobs->raster;
  c.swizzle = knobs->swizzle;
  return true;
}

using Element = float;
using ElementAccumulator = float;
// CUTLASS operand A is torch's B transposed, operand B is torch's a transposed: a row-major torch
// operand is a column-major CUTLASS one.
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::RowMajor;
using LayoutC = cutlass::layout::ColumnMajor;
constexpr int Alignment = 4;
constexpr bool kStreamK = false;

using EpilogueOp =
    cutlass::epilogue::thread::LinearCombination<Element, Alignment, ElementAccumulator, ElementAccumulator>;

using Gemm = cutlass::gemm::device::GemmUniversal<
    Element, LayoutA, Element, LayoutB, Element, LayoutC, ElementAccumulator,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<128, 128, 16>,
    cutlass::gemm::GemmShape<64, 64, 16>,
    cutlass::gemm::GemmShape<16, 8, 8>,
    EpilogueOp,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>,
    3, Alignment, Alignment, cutlass::arch::OpMultiplyAdd>;

typename Gemm::Arguments make_arguments(const Call& p) {
  const int M = p.n, N = p.m, K = p.k, L = p.batch;
  const bool batched = L > 1;
  const int slices = batched ? L : (!kStreamK && p.splits > 1 ? p.splits : 1);
  const auto mode = batched ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm;
  // Leading dimensions of the column-major views (see the header comment).
  const int64_t lda = K;
  const int64_t ldb = N, ldd = M;
  const void* c = p.out;
  const int64_t ldc = M, batch_c = int64_t(M) * N;
  const float beta = 0.0f;
  return typename Gemm::Arguments(
      mode, {M, N, K}, slices, {1.0f, beta},
      p.b, p.a, c, p.out,
      int64_t(M) * K, int64_t(N) * K, batch_c, int64_t(M) * N,
      lda, ldb, ldc, ldd);
}

// Whether the kernel takes the call (beyond its tensors, which read_call checked).
bool implementable(const Call& p) {
  // Serial split-K and Stream-K are for single GEMMs here.
  if (p.batch > 1 && (kStreamK || p.splits > 1)) return false;
  return Gemm::can_implement(make_arguments(p)) == cutlass::Status::kSuccess;
}
}  // namespace sm80_gemm_ccr_tf32_f32_128x128x16_w2x2x1_s3_dp_align4_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm80_gemm_ccr_tf32_f32_128x128x16_w2x2x1_s3_dp_align4_can_implement(const FactOpArgs* fact_args, const FactKnobs* knobs) {
  using namespace sm80_gemm_ccr_tf32_f32_128x128x16_w2x2x1_s3_dp_align4_ns;
  Call p;
  return read_call(fact_args, knobs, p) && implementable(p) ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm80_gemm_ccr_tf32_f32_128x128x16_w2x2x1_s3_dp_align4_workspace_size(const FactOpArgs* fact_args, const FactKnobs* knobs) {
  using namespace sm80_gemm_ccr_tf32_f32_128x128x16_w2x2x1_s3_dp_align4_ns;
  Call p;
  return read_call(fact_args, knobs, p) ? Gemm::get_workspace_size(make_arguments(p)) : 0;
}

extern "C" __attribute__((weak)) int32_t fact_k_sm80_gemm_ccr_tf32_f32_128x128x16_w2x2x1_s3_dp_align4_run(const FactOpArgs* fact_args, const FactKnobs* knobs,
                                                             void* workspace, size_t workspace_size, void* stream) {
  using namespace sm80_gemm_ccr_tf32_f32_128x128x16_w2x2x1_s3_dp_align4_ns;
  Call p;
  if (!read_call(fact_args, knobs, p) || !implementable(p)) return FACT_CANNOT_IMPLEMENT;
  auto args = make_arguments(p);
  if (Gemm::get_workspace_size(args) > workspace_size) return FACT_WORKSPACE_TOO_SMALL;
  // CUTLASS 2.x's GemmUniversal sets the shared memory attribute only when the thread's device
  // changes (its device properties are thread-local), so initialize costs no attribute per call.
  Gemm gemm;
  auto s = static_cast<cudaStream_t>(stream);
  if (gemm.initialize(args, workspace, s) != cutlass::Status::kSuccess) return FACT_INIT_FAILED;
  if (gemm.run(s) != cutlass::Status::kSuccess) return FACT_LAUNCH_FAILED;
  return FACT_OK;
}
