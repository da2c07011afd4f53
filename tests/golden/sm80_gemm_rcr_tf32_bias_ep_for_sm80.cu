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

// The call in torch's terms, out[L,M,N] = f(a[L,M,K] . B[L,K,N] + bias[N], leaves), every tensor
// packed as the layout says (a row-major, B column-major), so the kernel needs only their sizes and data.
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
constexpr bool kRowA = true, kRowB = false, kBias = true;
constexpr int kLeaves = 1;
constexpr Leaf kLeafKinds[FACT_MAX_LEAVES] = { Leaf::Full, };
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

// The hardware's tanh and exp, which the program uses outside f32-accurate kernels (its accurate
// ones are tanhf and expf); the host pass gets the library's.
CUTLASS_HOST_DEVICE float fact_tanh_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return tanhf(x);
#endif
}
CUTLASS_HOST_DEVICE float fact_exp_approx(float x) {
#if defined(__CUDA_ARCH__)
  return __expf(x);
#else
  return expf(x);
#endif
}
// erf as tanh(x P(x^2)), P fitted to erf on [-4, 4] (|error| under 4e-5 with an exact tanh; erf
// is 1 within 2e-8 beyond), through the hardware's tanh: erff spends about twenty instructions,
// which a ping-pong warp group's epilogue cannot hide behind a bf16 mainloop.
CUTLASS_HOST_DEVICE float fact_erf_approx(float x) {
  const float u = fminf(fmaxf(x, -4.f), 4.f);
  const float s = u * u;
  return fact_tanh_approx(u * (1.128140f + s * (0.1040865f - 0.001787860f * s)));
}

template <class T>
struct FusedEpilogue {
  CUTLASS_HOST_DEVICE T operator()(T const& acc, T const& bias, T const& l0) const {
    T out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < int(T::kElements); ++i) {
      const float v0 = acc[i] + bias[i];
      const float v1 = 0.5f * v0 * (1.f + fact_erf_approx(v0 * 0.70710678118654752f));
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

typename Gemm::Arguments make_arguments(const Call& p) {
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

// Whether the kernel takes the call (beyond its tensors, which read_call checked).
bool implementable(const Call& p) {
  // CUTLASS's Sm80 EVT only asserts against serial split-K, which the NDEBUG build drops.
  if (p.splits > 1) return false;
  // Serial split-K and Stream-K are for single GEMMs here.
  if (p.batch > 1 && (kStreamK || p.splits > 1)) return false;
  return Gemm::can_implement(make_arguments(p)) == cutlass::Status::kSuccess;
}
}  // namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_can_implement(const FactOpArgs* fact_args, const FactKnobs* knobs) {
  using namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_ns;
  Call p;
  return read_call(fact_args, knobs, p) && implementable(p) ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_workspace_size(const FactOpArgs* fact_args, const FactKnobs* knobs) {
  using namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_ns;
  Call p;
  return read_call(fact_args, knobs, p) ? Gemm::get_workspace_size(make_arguments(p)) : 0;
}

extern "C" __attribute__((weak)) int32_t fact_k_sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_run(const FactOpArgs* fact_args, const FactKnobs* knobs,
                                                             void* workspace, size_t workspace_size, void* stream) {
  using namespace sm80_gemm_rcr_tf32_f32_128x128x32_w2x2x1_s3_dp_bias_ep_gelu_add_dba1399e_align4_for_sm80_ns;
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
