// generated from src/kinds/conv/templates/sm80_dwconv.cu.hbs; do not edit
// spec: {"arch":"sm80","dtype":"bf16","conv_tile":[8,8,64],"conv_cluster":[1,1,1],"conv_warps":[4,1,1],"conv_stages":3,"conv_depthwise":{"filter":[3,3],"stride":[1,1]},"bias":true,"residual":false,"act":"relu6"}
//
// sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6_for_sm80: y = relu6(conv2d(x, w, groups = C) + bias[K]), the depthwise
// convolution (groups = C = K, one filter of 3x3 per channel) through CUTLASS's direct
// convolution for sm80 (DefaultDepthwiseDirect2dConvFprop, fixed-stride-and-dilation iterators, SIMT fp32 multiply-adds
// into fp32 accumulators, a 3-stage cp.async pipeline): a CTA computes 8x8 output
// pixels of 64 channels, the epilogue act(acc + beta * C). The bias is that C operand read with
// row stride 0 (every output pixel reads the same K-vector); there is no residual.
// Tensors (FactOpArgs), as torch lays out channels-last tensors (sizes in torch's NCHW order):
//   x [N,C,H,W] strides [H*W*C, 1, W*C, C]; w [K,1,R,S] (CUTLASS's [K,R,S,1]) strides [R*S, 1, S, 1];
//   bias [K] stride 1 (required); residual: data NULL;
//   out [N,K,P,Q] strides [P*Q*K, 1, Q*K, K]; all of the kernel's dtype, 16-byte aligned; K = C.
// Scalars: stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w.
// The workspace holds the filter reordered to [R*S, K] (CUTLASS's reorder kernel, run before each
// launch: the weight may change between calls).
#include "fact_kernels.h"

#include <cuda_runtime.h>

#include <atomic>

#include "cutlass/cutlass.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/kernel/default_depthwise_fprop.h"
#include "cutlass/conv/device/direct_convolution.h"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/epilogue/thread/linear_combination_generic.h"

// Internal linkage: a unit may hold a kernel another object linked beside it holds too; only the
// weak entry points are shared.
namespace {
namespace sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6_for_sm80_ns {

using Element = cutlass::bfloat16_t;
using ElementAccumulator = float;
using ElementCompute = float;
constexpr int kDtype = 1;
constexpr int Alignment = 128 / cutlass::sizeof_bits<Element>::value;
constexpr int kFilterR = 3;
constexpr int kFilterS = 3;
constexpr int kGroupsPerCta = 64;

using ThreadBlockOutputShape = cutlass::conv::TensorNHWCShape<1, 8, 8, kGroupsPerCta>;
using FilterShape = cutlass::MatrixShape<kFilterR, kFilterS>;
using ThreadblockShape = cutlass::gemm::GemmShape<ThreadBlockOutputShape::kNHW, kGroupsPerCta, FilterShape::kCount>;
using WarpShape = cutlass::gemm::GemmShape<ThreadBlockOutputShape::kNHW / 4, kGroupsPerCta, FilterShape::kCount>;
using InstructionShape = cutlass::gemm::GemmShape<1, 1, 1>;
using Swizzle = cutlass::conv::threadblock::DepthwiseDirect2dConvIdentityThreadblockSwizzle<
    1, ThreadBlockOutputShape::kN, ThreadBlockOutputShape::kH, ThreadBlockOutputShape::kW>;
using StrideShape = cutlass::MatrixShape<1, 1>;
using DilationShape = cutlass::MatrixShape<1, 1>;

// ReLU6: min(max(x, 0), 6), NaN propagated (torch's hardtanh(x, 0, 6)).
namespace fact_act {
template <typename T>
struct ReLu6 {
  static const bool kIsHeavy = false;
  CUTLASS_HOST_DEVICE T operator()(T value) const {
    cutlass::maximum<T, true> mx;
    cutlass::minimum<T, true> mn;
    return mn(mx(value, T(0)), T(6));
  }
};
template <typename T, int N>
struct ReLu6<cutlass::Array<T, N>> {
  static const bool kIsHeavy = false;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& frag) const {
    cutlass::Array<T, N> out;
    ReLu6<T> op;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = op(frag[i]);
    return out;
  }
};
}  // namespace fact_act

// D = act(alpha * acc + beta * C), alpha 1; beta 1 with the bias as C, 0 without one.
using EpilogueOp = cutlass::epilogue::thread::LinearCombinationGeneric<
    fact_act::ReLu6, Element, Alignment, ElementAccumulator, ElementCompute>;

using ConvKernel = typename cutlass::conv::kernel::DefaultDepthwiseDirect2dConvFprop<
    Element, cutlass::layout::TensorNHWC,
    Element, cutlass::layout::TensorNHWC,
    Element, cutlass::layout::TensorNHWC,
    ElementAccumulator,
    cutlass::arch::OpClassSimt, cutlass::arch::Sm80,
    ThreadblockShape, ThreadBlockOutputShape, FilterShape, WarpShape, InstructionShape,
    EpilogueOp, Swizzle, 3,
    cutlass::arch::OpMultiplyAdd,
    cutlass::conv::IteratorAlgorithm::kFixedStrideDilation,
    cutlass::conv::StrideSupport::kFixed,
    StrideShape, DilationShape>::Kernel;
using Conv = cutlass::conv::device::DirectConvolution<ConvKernel>;

inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// A tensor [D0,D1,D2,D3] laid out channels-last: dim 1 innermost, then 3, 2, 0, packed. A dim of
// size one may carry any stride (torch leaves a 1x1 filter's or a 1x1 image's NCHW strides when it
// makes it channels-last: no element moves); the kernels compute the packed strides themselves.
inline bool channels_last(const FactTensor& t) {
  if (t.rank != 4 || t.dtype != kDtype || t.data == nullptr || !aligned(t.data)) return false;
  const int64_t* s = t.sizes;
  const int64_t* st = t.strides;
  const int64_t packed[4] = {s[2] * s[3] * s[1], 1, s[3] * s[1], s[1]};
  for (int i = 0; i < 4; ++i) {
    if (s[i] != 1 && st[i] != packed[i]) return false;
  }
  return true;
}

struct Call {
  int n, h, w, c, k, r, s, p, q;
  int stride[2], pad[2], dil[2];
  const Element* x;
  const Element* wt;
  const Element* bias;
  const Element* residual;
  Element* out;
};

// The call as the header says, or false when the kernel cannot take it: counts, dtypes, layouts,
// alignment, sizes that agree, and every size in int range.
inline bool read_call(const FactOpArgs* a, Call& c) {
  if (a == nullptr || a->num_tensors != 5 || a->num_scalars != 6) return false;
  const FactTensor& x = a->tensors[0];
  const FactTensor& w = a->tensors[1];
  const FactTensor& b = a->tensors[2];
  const FactTensor& r = a->tensors[3];
  const FactTensor& o = a->tensors[4];
  if (!channels_last(x) || !channels_last(w) || !channels_last(o)) return false;
  for (int i = 0; i < 4; ++i) {
    if (x.sizes[i] < 1 || x.sizes[i] > INT32_MAX || w.sizes[i] < 1 || w.sizes[i] > INT32_MAX ||
        o.sizes[i] < 1 || o.sizes[i] > INT32_MAX) return false;
  }
  c.n = int(x.sizes[0]); c.c = int(x.sizes[1]); c.h = int(x.sizes[2]); c.w = int(x.sizes[3]);
  c.k = int(w.sizes[0]); c.r = int(w.sizes[2]); c.s = int(w.sizes[3]);
  c.p = int(o.sizes[2]); c.q = int(o.sizes[3]);
  // Depthwise: one input channel a filter (w [K,1,R,S]), groups = C = K.
  if (w.sizes[1] != 1 || c.k != c.c || o.sizes[0] != c.n || o.sizes[1] != c.k) return false;
  if (c.c % Alignment != 0 || c.k % Alignment != 0) return false;
  for (int i = 0; i < 6; ++i) {
    const double v = a->scalars[i];
    if (v != double(int(v)) || v < (i == 2 || i == 3 ? 0 : 1)) return false;
  }
  c.stride[0] = int(a->scalars[0]); c.stride[1] = int(a->scalars[1]);
  c.pad[0] = int(a->scalars[2]); c.pad[1] = int(a->scalars[3]);
  c.dil[0] = int(a->scalars[4]); c.dil[1] = int(a->scalars[5]);
  const int p = (c.h + 2 * c.pad[0] - c.dil[0] * (c.r - 1) - 1) / c.stride[0] + 1;
  const int q = (c.w + 2 * c.pad[1] - c.dil[1] * (c.s - 1) - 1) / c.stride[1] + 1;
  if (p != c.p || q != c.q) return false;
  if (b.data == nullptr || !aligned(b.data) || b.dtype != kDtype || b.rank != 1 || b.sizes[0] != c.k || (c.k > 1 && b.strides[0] != 1)) return false;
  if (r.data != nullptr) return false;
  c.x = static_cast<const Element*>(x.data);
  c.wt = static_cast<const Element*>(w.data);
  c.bias = static_cast<const Element*>(b.data);
  c.residual = static_cast<const Element*>(r.data);
  c.out = static_cast<Element*>(o.data);
  return true;
}

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

// The filter's bytes, each 16-byte aligned: the workspace the reordered filter takes.
inline size_t filter_bytes(const Call& c) {
  return (size_t(c.k) * c.r * c.s * sizeof(Element) + 15) / 16 * 16;
}

inline typename Conv::Arguments make_arguments(const Call& c, void* workspace) {
  cutlass::conv::Conv2dProblemSize shape(
      c.n, c.h, c.w, c.c, c.k, c.r, c.s, c.p, c.q,
      c.pad[0], c.pad[1], c.stride[0], c.stride[1], c.dil[0], c.dil[1],
      cutlass::conv::Mode::kCrossCorrelation, 1, c.c);
  using Layout = cutlass::layout::TensorNHWC;
  // The bias as C: a tensor of the output's extent whose every pixel is the same K channels
  // (strides 0). Without a bias C is never read (beta 0); it points at the output only to be valid.
  Element* source = const_cast<Element*>(c.bias != nullptr ? c.bias : c.out);
  const Layout source_layout = c.bias != nullptr ? Layout(typename Layout::Stride(0))
                                                 : Layout::packed({c.n, c.p, c.q, c.k});
  return typename Conv::Arguments(
      shape,
      {const_cast<Element*>(c.x), Layout::packed({c.n, c.h, c.w, c.c})},
      {const_cast<Element*>(c.wt), Layout::packed({c.k, c.r, c.s, 1})},
      {source, source_layout},
      {c.out, Layout::packed({c.n, c.p, c.q, c.k})},
      {ElementCompute(1), ElementCompute(1)},
      {static_cast<Element*>(workspace), Layout::packed({c.k, c.r, c.s, 1})});
}

// The filter as this kernel instantiates it (compile-time R and S) and K a whole number of CTA
// columns, then CUTLASS's own checks.
inline bool fits(const Call& c) {
  if (c.r != kFilterR || c.s != kFilterS || c.k % kGroupsPerCta != 0) return false;
  return Conv::can_implement(make_arguments(c, nullptr)) == cutlass::Status::kSuccess;
}

// What DirectConvolution's initialize and run do, but the shared memory opt-in once per device:
// the filter reordered into the workspace, then one launch over the swizzle's grid. A FACT_ status.
int32_t launch(const typename Conv::Arguments& args, cudaStream_t s) {
  typename ConvKernel::Params params(args, nullptr);
  const int smem = int(params.get_smem_size());
  if (!smem_opt_in<ConvKernel>(reinterpret_cast<const void*>(cutlass::Kernel<ConvKernel>), smem)) return FACT_INIT_FAILED;
  using Reorder = typename ConvKernel::ReorderKernel;
  cutlass::Kernel<Reorder><<<Reorder::get_grid_shape(params), Reorder::get_block_shape(), 0, s>>>(params);
  const dim3 grid = Swizzle().get_grid_shape(params.grid_tiled_shape);
  cutlass::Kernel<ConvKernel><<<grid, dim3(32 * Conv::kWarpCount, 1, 1), smem, s>>>(params);
  return cudaGetLastError() == cudaSuccess ? FACT_OK : FACT_LAUNCH_FAILED;
}

}  // namespace sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6_for_sm80_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6_for_sm80_can_implement(const FactOpArgs* fact_args, const FactKnobs*) {
  using namespace sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6_for_sm80_ns;
  Call c;
  if (!read_call(fact_args, c)) return FACT_CANNOT_IMPLEMENT;
  return fits(c) ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6_for_sm80_workspace_size(const FactOpArgs* fact_args, const FactKnobs*) {
  using namespace sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6_for_sm80_ns;
  Call c;
  if (!read_call(fact_args, c)) return 0;
  return filter_bytes(c);
}

extern "C" __attribute__((weak)) int32_t fact_k_sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6_for_sm80_run(const FactOpArgs* fact_args, const FactKnobs*,
                                                             void* workspace, size_t workspace_size, void* stream) {
  using namespace sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6_for_sm80_ns;
  Call c;
  if (!read_call(fact_args, c) || !fits(c)) return FACT_CANNOT_IMPLEMENT;
  if (workspace == nullptr || workspace_size < filter_bytes(c) || reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
    return FACT_WORKSPACE_TOO_SMALL;
  }
  return launch(make_arguments(c, workspace), static_cast<cudaStream_t>(stream));
}
