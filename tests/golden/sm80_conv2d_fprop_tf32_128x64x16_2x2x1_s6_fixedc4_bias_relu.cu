// generated from src/kinds/conv/templates/sm80_conv.cu.hbs; do not edit
// spec: {"arch":"sm90","dtype":"f32","conv_tile":[128,64,16],"conv_cluster":[1,1,1],"conv_warps":[2,2,1],"conv_stages":6,"conv_fixed_channels":4,"bias":true,"residual":false,"act":"relu"}
//
// sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_relu: y = relu(conv2d(x, w) + bias[K]), the
// implicit GEMM of M = N*P*Q output pixels, N = K output channels, K = C*R*S through CUTLASS's
// ImplicitGemmConvolution for sm80 (fixed-channels iterators: each pixel's 4 channels in one
// access, C = 4 exactly, 6-stage cp.async pipeline,
// mma.sync 16, 8, 8), tf32 multiplies, fp32 accumulation and epilogue: the broadcast
// epilogue adds the bias (a NULL vector reads as zeros), beta times C (the residual) and applies
// the activation.
// Tensors (FactOpArgs), as torch lays out channels-last tensors (sizes in torch's NCHW order):
//   x [N,C,H,W] strides [H*W*C, 1, W*C, C]; w [K,C,R,S] strides [R*S*C, 1, S*C, C];
//   bias [K] stride 1 (required); residual [N,K,P,Q] laid out as out (data NULL);
//   out [N,K,P,Q] strides [P*Q*K, 1, Q*K, K]; all of the kernel's dtype, 16-byte aligned.
// Scalars: stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w.
#include "fact_kernels.h"

#include <cuda_runtime.h>

#include <atomic>

#include "cutlass/cutlass.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/conv/kernel/default_conv2d_fprop_with_broadcast.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/epilogue/thread/linear_combination_bias_elementwise.h"

// Internal linkage: a unit may hold a kernel another object linked beside it holds too; only the
// weak entry points are shared.
namespace {
namespace sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_relu_ns {

using Element = float;
using ElementAccumulator = float;
using ElementCompute = float;
constexpr int kDtype = 0;
constexpr int Alignment = 128 / cutlass::sizeof_bits<Element>::value;

using ThreadblockShape = cutlass::gemm::GemmShape<128, 64, 16>;
using WarpShape = cutlass::gemm::GemmShape<64, 32, 16>;
using InstructionShape = cutlass::gemm::GemmShape<16, 8, 8>;

// D = act(acc + bias[K] + beta * C): output channels are the GEMM's N, so the bias is the
// epilogue's broadcast vector along N; T (the value before the activation) is not stored.
using EpilogueOp = cutlass::epilogue::thread::LinearCombinationBiasElementwise<
    Element, ElementAccumulator, ElementCompute, Element, Element, Alignment,
    cutlass::epilogue::thread::ReLu<ElementCompute>, cutlass::plus<ElementCompute>, false, Element>;

using ConvKernel = typename cutlass::conv::kernel::DefaultConv2dFpropWithBroadcast<
    Element, cutlass::layout::TensorNHWC,
    Element, cutlass::layout::TensorNHWC,
    Element, cutlass::layout::TensorNHWC,
    ElementAccumulator,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    ThreadblockShape, WarpShape, InstructionShape,
    EpilogueOp,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>,
    6,
    cutlass::arch::OpMultiplyAdd,
    cutlass::conv::IteratorAlgorithm::kFixedChannels,
    cutlass::conv::StrideSupport::kStrided,
    Alignment, Alignment>::Kernel;
using Conv = cutlass::conv::device::ImplicitGemmConvolution<ConvKernel>;

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
  if (w.sizes[1] != c.c || o.sizes[0] != c.n || o.sizes[1] != c.k) return false;
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

inline typename Conv::Arguments make_arguments(const Call& c) {
  cutlass::conv::Conv2dProblemSize shape(
      c.n, c.h, c.w, c.c, c.k, c.r, c.s, c.p, c.q,
      c.pad[0], c.pad[1], c.stride[0], c.stride[1], c.dil[0], c.dil[1],
      cutlass::conv::Mode::kCrossCorrelation);
  using Layout = cutlass::layout::TensorNHWC;
  // Without a residual C is never read (beta 0); it points at the output only to be valid.
  Element* source = const_cast<Element*>(c.residual != nullptr ? c.residual : c.out);
  return typename Conv::Arguments(
      shape,
      {const_cast<Element*>(c.x), Layout::packed({c.n, c.h, c.w, c.c})},
      {const_cast<Element*>(c.wt), Layout::packed({c.k, c.r, c.s, c.c})},
      {source, Layout::packed({c.n, c.p, c.q, c.k})},
      {c.out, Layout::packed({c.n, c.p, c.q, c.k})},
      {ElementCompute(1), ElementCompute(0)},
      cutlass::conv::SplitKMode::kSerial,
      const_cast<Element*>(c.bias),
      nullptr);
}

// What ImplicitGemmConvolution's initialize and run do, but the shared memory opt-in, which its
// initialize sets on every call and smem_opt_in once per device (the adapter keeps its Params
// private, so the launch is its own): the workspace zeroed for serial split-K (none here: one
// slice), the kernel's Params, one launch over the swizzle's grid. A FACT_ status.
int32_t launch(const typename Conv::Arguments& args, void* workspace, cudaStream_t s) {
  constexpr int smem = static_cast<int>(sizeof(typename ConvKernel::SharedStorage));
  if (!smem_opt_in<ConvKernel>(reinterpret_cast<const void*>(cutlass::Kernel<ConvKernel>), smem)) return FACT_INIT_FAILED;
  if (args.problem_size.split_k_slices > 1) {
    if (workspace == nullptr || cudaMemsetAsync(workspace, 0, Conv::get_workspace_size(args), s) != cudaSuccess) {
      return FACT_INIT_FAILED;
    }
  }
  typename ConvKernel::Params params(args, static_cast<int*>(workspace));
  const dim3 grid = typename Conv::ThreadblockSwizzle().get_grid_shape(params.grid_tiled_shape);
  cutlass::Kernel<ConvKernel><<<grid, dim3(32 * Conv::kWarpCount, 1, 1), smem, s>>>(params);
  return cudaGetLastError() == cudaSuccess ? FACT_OK : FACT_LAUNCH_FAILED;
}

}  // namespace sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_relu_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_relu_can_implement(const FactOpArgs* fact_args, const FactKnobs*) {
  using namespace sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_relu_ns;
  Call c;
  if (!read_call(fact_args, c)) return FACT_CANNOT_IMPLEMENT;
  return Conv::can_implement(make_arguments(c)) == cutlass::Status::kSuccess ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_relu_workspace_size(const FactOpArgs* fact_args, const FactKnobs*) {
  using namespace sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_relu_ns;
  Call c;
  if (!read_call(fact_args, c)) return 0;
  return Conv::get_workspace_size(make_arguments(c));
}

extern "C" __attribute__((weak)) int32_t fact_k_sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_relu_run(const FactOpArgs* fact_args, const FactKnobs* knobs,
                                                             void* workspace, size_t workspace_size, void* stream) {
  using namespace sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_relu_ns;
  Call c;
  if (!read_call(fact_args, c)) return FACT_CANNOT_IMPLEMENT;
  auto args = make_arguments(c);
  if (Conv::can_implement(args) != cutlass::Status::kSuccess) return FACT_CANNOT_IMPLEMENT;
  if (Conv::get_workspace_size(args) > workspace_size) return FACT_WORKSPACE_TOO_SMALL;
  (void)knobs;
  return launch(args, workspace, static_cast<cudaStream_t>(stream));
}
