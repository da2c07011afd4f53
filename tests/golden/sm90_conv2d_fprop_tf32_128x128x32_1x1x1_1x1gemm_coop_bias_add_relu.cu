// generated from src/kinds/conv/templates/sm90_conv_gemm.cu.hbs; do not edit
// spec: {"arch":"sm90","dtype":"f32","conv_tile":[128,128,32],"conv_cluster":[1,1,1],"conv_gemm":"coop","bias":true,"residual":true,"act":"relu"}
//
// sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu: y = relu(conv2d(x, w) + bias[K] + residual) for a 1x1 filter of stride 1
// and no padding: over channels-last tensors that is the GEMM out[N*H*W, K] = x[N*H*W, C] . w[K, C]^T,
// both operands K-major, through CUTLASS's sm90 GEMM collective builder (cooperative, persistent),
// tf32 multiplies, fp32 accumulation and epilogue. Any other filter, stride or padding is refused
// (FACT_CANNOT_IMPLEMENT), so the op falls back.
// Tensors (FactOpArgs), as torch lays out channels-last tensors (sizes in torch's NCHW order):
//   x [N,C,H,W] strides [H*W*C, 1, W*C, C]; w [K,C,1,1]; bias [K] stride 1 (required);
//   residual [N,K,H,W] laid out as out (required); out [N,K,H,W] strides [H*W*K, 1, W*K, K];
//   all of the kernel's dtype, 16-byte aligned.
// Scalars: stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w.
#include "fact_kernels.h"

#include <cuda_runtime.h>

#include <atomic>

#include "cutlass/cutlass.h"
#include "cutlass/kernel_hardware_info.hpp"
#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

// Internal linkage: a unit may hold a kernel another object linked beside it holds too; only the
// weak entry points are shared.
namespace {
namespace sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu_ns {
using namespace cute;

using Element = float;
using ElementAccumulator = float;
using ElementCompute = float;
constexpr int kDtype = 0;
constexpr int Alignment = 128 / cutlass::sizeof_bits<Element>::value;

// M: output pixels, N: output channels, K: input channels.
using TileShape = Shape<_128, _128, _32>;
using ClusterShape = Shape<_1, _1, _1>;

// The residual is the epilogue's C operand (beta = 1); without one there is no C, and its shared
// memory goes to the mainloop's stages.
using ElementC = Element;
// Output channels are the GEMM's N: the bias is per column.
using FusionOp = cutlass::epilogue::fusion::LinCombPerColBiasEltAct<cutlass::epilogue::thread::ReLu, Element, ElementCompute, Element, ElementC, ElementCompute>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto,
    ElementAccumulator, ElementCompute,
    ElementC, cutlass::layout::RowMajor, Alignment,
    Element, cutlass::layout::RowMajor, Alignment,
    cutlass::epilogue::TmaWarpSpecializedCooperative,
    FusionOp>::CollectiveOp;

// x's rows are pixels of C channels (row-major, K-major); w's rows are output channels of C
// (column-major B, K-major too).
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    Element, cutlass::layout::RowMajor, Alignment,
    Element, cutlass::layout::ColumnMajor, Alignment,
    ElementAccumulator,
    TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

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
  if (!channels_last(r)) return false;
  for (int i = 0; i < 4; ++i) if (r.sizes[i] != o.sizes[i]) return false;
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

// The device's SMs, asked once per device: querying costs more than a short kernel.
int sm_count() {
  struct SmCount;
  return per_device<SmCount>([](int device) {
    return cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  });
}

// A call as its kernel's Params depend on it: every tensor's data, dtype, sizes and strides, the
// scalars, the knobs, the workspace and the device, as words. The Params of an sm90 kernel hold
// TMA descriptors, and CUTLASS encodes each anew on every call, through a driver entry point it
// looks up by name each time: microseconds of host time per launch, which the GPU waits for
// behind a short kernel. A forward calls each kernel with the same few calls every time (the
// caching allocator hands the same addresses back), so they are kept per call (`kept_params`).
struct CallKey {
  static constexpr int kWords = 160;
  int64_t words[kWords];
  int size = 0;
  uint64_t hash = 1469598103934665603ull;
  bool push(int64_t w) {
    if (size == kWords) return false;
    words[size++] = w;
    hash = (hash ^ static_cast<uint64_t>(w)) * 1099511628211ull;
    return true;
  }
  bool operator==(const CallKey& o) const {
    if (size != o.size || hash != o.hash) return false;
    for (int i = 0; i < size; ++i) {
      if (words[i] != o.words[i]) return false;
    }
    return true;
  }
};

// The key of a call on `device`; false where it does not fit in one (nothing is kept for it).
inline bool device_call_key(int device, const FactOpArgs* a, const FactKnobs* knobs, const void* workspace,
                            CallKey& key) {
  if (a == nullptr) return false;
  bool ok = key.push(device) && key.push(reinterpret_cast<intptr_t>(workspace)) && key.push(a->num_tensors) &&
            key.push(a->num_scalars);
  for (int32_t i = 0; ok && i < a->num_tensors; ++i) {
    const FactTensor& t = a->tensors[i];
    const int rank = t.rank < 0 ? 0 : t.rank > FACT_MAX_RANK ? FACT_MAX_RANK : t.rank;
    ok = key.push(reinterpret_cast<intptr_t>(t.data)) && key.push((int64_t{t.dtype} << 32) | uint32_t(t.rank));
    for (int d = 0; ok && d < rank; ++d) ok = key.push(t.sizes[d]) && key.push(t.strides[d]);
  }
  for (int32_t i = 0; ok && i < a->num_scalars; ++i) {
    int64_t bits = 0;
    static_assert(sizeof(bits) == sizeof(double), "a scalar is one word");
    __builtin_memcpy(&bits, &a->scalars[i], sizeof(bits));
    ok = key.push(bits);
  }
  if (ok && knobs != nullptr) ok = key.push(knobs->splits) && key.push(knobs->raster) && key.push(knobs->swizzle);
  return ok;
}

// The key of a call on the current device, for `kept_params`: `&key`, or NULL where the call has
// none (then nothing is kept). Only for a call whose arguments are a function of `a`, `knobs` and
// the workspace alone.
inline const CallKey* key_of(const FactOpArgs* a, const FactKnobs* knobs, const void* workspace, CallKey& key) {
  int device = 0;
  return cudaGetDevice(&device) == cudaSuccess && device_call_key(device, a, knobs, workspace, key) ? &key : nullptr;
}

// `params` for the call `key` names: those kept for it, else `make()`'s, then kept. A table of
// kSlots per kernel (two ways per hash), shared by the process's threads behind a spin lock
// (launches from several threads are rare, and each holds it for a copy).
template <class Kernel, class Make>
typename Kernel::Params kept_params(const CallKey* key, Make make) {
  if (key == nullptr) return make();
  struct Slot {
    CallKey key;
    typename Kernel::Params params;
    uint64_t used = 0;
  };
  constexpr uint64_t kSlots = 128;
  static std::atomic_flag lock = ATOMIC_FLAG_INIT;
  static Slot* slots = nullptr;
  static uint64_t clock = 0;
  struct Hold {
    Hold() { while (lock.test_and_set(std::memory_order_acquire)) {} }
    ~Hold() { lock.clear(std::memory_order_release); }
  };
  // The hash's high bits mixed into its low ones first: FNV's low bits see only the words' low
  // bits, which aligned addresses and sizes leave alike (every call would share one set).
  uint64_t h = key->hash;
  h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdull;
  h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  const uint64_t at = (h % kSlots) & ~uint64_t{1};
  {
    const Hold hold;
    if (slots != nullptr) {
      for (uint64_t i = at; i < at + 2; ++i) {
        if (slots[i].used != 0 && slots[i].key == *key) {
          slots[i].used = ++clock;
          return slots[i].params;
        }
      }
    }
  }
  const typename Kernel::Params params = make();
  const Hold hold;
  if (slots == nullptr) slots = new Slot[kSlots];
  Slot& s = slots[slots[at].used <= slots[at + 1].used ? at : at + 1];
  s.key = *key;
  s.params = params;
  s.used = ++clock;
  return params;
}

template <class Kernel>
struct ClusterOptIn {};

// Launches `Kernel` on `params` as adapter `Op`'s static run does. An sm90 kernel whose cluster
// holds more than one CTA is launched here: CUTLASS's ClusterLauncher::launch sets the kernel's
// non-portable cluster size attribute before every launch (3 us of host time a call, as much as
// the launch), which is kept per device and so set here once per device. A FACT_ status.
template <class Op, class Kernel>
int32_t run_adapter(typename Kernel::Params& params, cudaStream_t stream) {
  if constexpr (Kernel::ArchTag::kMinComputeCapability == 90) {
    using Cluster = typename Kernel::DispatchPolicy::ClusterShape;
    if constexpr (cute::is_static_v<Cluster> && cute::size(Cluster{}) > 1) {
      const void* kernel = reinterpret_cast<const void*>(cutlass::device_kernel<Kernel>);
      if (per_device<ClusterOptIn<Kernel>>([&](int) {
            if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) return 1;
            (void)cudaGetLastError();
            return -1;
          }) < 0) {
        return FACT_INIT_FAILED;
      }
      const dim3 cluster(cute::size<0>(Cluster{}), cute::size<1>(Cluster{}), cute::size<2>(Cluster{}));
      const dim3 grid = Op::get_grid_shape(params);
      // The adapter's check: a grid of whole clusters.
      if (grid.x % cluster.x != 0 || grid.y % cluster.y != 0 || grid.z % cluster.z != 0) return FACT_LAUNCH_FAILED;
      cudaLaunchAttribute attribute;
      attribute.id = cudaLaunchAttributeClusterDimension;
      attribute.val.clusterDim.x = cluster.x;
      attribute.val.clusterDim.y = cluster.y;
      attribute.val.clusterDim.z = cluster.z;
      cudaLaunchConfig_t config{};
      config.gridDim = grid;
      config.blockDim = Kernel::get_block_shape();
      config.dynamicSmemBytes = static_cast<size_t>(Kernel::SharedStorageSize);
      config.stream = stream;
      config.attrs = &attribute;
      config.numAttrs = 1;
      void* kernel_params[] = {&params};
      return cudaLaunchKernelExC(&config, kernel, kernel_params) == cudaSuccess ? FACT_OK : FACT_LAUNCH_FAILED;
    }
  }
  return Op::run(params, stream) == cutlass::Status::kSuccess ? FACT_OK : FACT_LAUNCH_FAILED;
}

// Runs CUTLASS 3.x adapter `Op` (GemmUniversalAdapter, ConvUniversalAdapter) of kernel `Kernel` on
// `args`: the adapter's initialize (the kernel's workspace, then its Params: kept per call where
// `key` names the call `args` were made from alone, see `kept_params`) without the shared memory
// attribute it sets on every call, which smem_opt_in sets once per device, then the launch
// (`run_adapter`). A FACT_ status.
template <class Op, class Kernel>
int32_t launch_adapter(const typename Op::Arguments& args, void* workspace, cudaStream_t stream,
                       const CallKey* key = nullptr) {
  if (!smem_opt_in<Kernel>(reinterpret_cast<const void*>(cutlass::device_kernel<Kernel>),
                           static_cast<int>(Kernel::SharedStorageSize))) {
    return FACT_INIT_FAILED;
  }
  if (Kernel::initialize_workspace(args, workspace, stream, nullptr) != cutlass::Status::kSuccess) return FACT_INIT_FAILED;
  // Non-const: the adapter's static run takes it by reference.
  typename Kernel::Params params =
      kept_params<Kernel>(key, [&] { return Kernel::to_underlying_arguments(args, workspace); });
  return run_adapter<Op, Kernel>(params, stream);
}

// A 1x1 filter of stride 1 without padding reads each output pixel's own input pixel, so the
// pixels are the GEMM's rows; anything else is not this GEMM.
inline bool pointwise(const Call& c) {
  return c.r == 1 && c.s == 1 && c.stride[0] == 1 && c.stride[1] == 1 && c.pad[0] == 0 && c.pad[1] == 0 &&
         int64_t(c.n) * c.h * c.w <= INT32_MAX;
}

inline typename Gemm::Arguments make_arguments(const Call& c) {
  const int M = c.n * c.h * c.w, N = c.k, K = c.c;
  auto stride_a = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, {M, K, 1});
  auto stride_b = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, {N, K, 1});
  auto stride_c = cutlass::make_cute_packed_stride(typename GemmKernel::StrideC{}, {M, N, 1});
  auto stride_d = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, {M, N, 1});
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count();
  // The residual's pointer is NULL where the kernel reads no C.
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {c.x, stride_a, c.wt, stride_b},
      { {}, c.residual, stride_c, c.out, stride_d },
      hw};
  auto& fusion = args.epilogue.thread;
  fusion.alpha = 1.0f;
  fusion.beta = 1.0f;
  fusion.bias_ptr = c.bias;
  return args;
}

}  // namespace sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu_can_implement(const FactOpArgs* fact_args, const FactKnobs*) {
  using namespace sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu_ns;
  Call c;
  if (!read_call(fact_args, c) || !pointwise(c)) return FACT_CANNOT_IMPLEMENT;
  return Gemm::can_implement(make_arguments(c)) == cutlass::Status::kSuccess ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu_workspace_size(const FactOpArgs* fact_args, const FactKnobs*) {
  using namespace sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu_ns;
  Call c;
  if (!read_call(fact_args, c) || !pointwise(c)) return 0;
  return Gemm::get_workspace_size(make_arguments(c));
}

extern "C" __attribute__((weak)) int32_t fact_k_sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu_run(const FactOpArgs* fact_args, const FactKnobs* knobs,
                                                             void* workspace, size_t workspace_size, void* stream) {
  using namespace sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu_ns;
  Call c;
  if (!read_call(fact_args, c) || !pointwise(c)) return FACT_CANNOT_IMPLEMENT;
  auto args = make_arguments(c);
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return FACT_CANNOT_IMPLEMENT;
  if (Gemm::get_workspace_size(args) > workspace_size) return FACT_WORKSPACE_TOO_SMALL;
  CallKey key;
  return launch_adapter<Gemm, GemmKernel>(args, workspace, static_cast<cudaStream_t>(stream), key_of(fact_args, knobs, workspace, key));
}
