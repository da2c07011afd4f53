// generated from templates/sm90_gemm.cu.hbs; do not edit
// spec: {"family":"sm90_gemm","arch":"sm90","layout":"rcr","math":"tf32","dtype":"f32","tile":[128,128,32],"cluster":[1,2,1],"schedule":"ws_cooperative","scheduler":"persistent","bias":true,"align":4,"fusion":{"leaves":["full","row","col","scalar"],"instrs":[{"op":"gelu_tanh","args":[{"value":0}]},{"op":"mul","args":[{"value":1},{"leaf":1}]},{"op":"sigmoid","args":[{"value":0}]},{"op":"mul","args":[{"value":2},{"value":3}]},{"op":"add","args":[{"value":4},{"leaf":2}]},{"op":"div","args":[{"value":5},{"leaf":3}]},{"op":"pow","args":[{"value":6},{"scalar":3.0}]},{"op":"add","args":[{"leaf":0},{"value":7}]},{"op":"clamp","args":[{"value":8},{"scalar":null},{"scalar":6.0}]}]}}
//
// sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_ep_gelu_tanh_mul_sigmoid_mul_add_div_pow_add_clamp_b133fc1f_align4: out[m,n] = f(a[m,k] . B + bias[n], leaves) (torch layout rcr), computed as the
// column-major CUTLASS problem out^T[n,m] = B^T . a^T, so a torch row-major output needs no transpose
// and the bias is per row of the CUTLASS problem.
#include "fact_kernels.h"

#include <cuda_runtime.h>

#include <atomic>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace {
namespace sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_ep_gelu_tanh_mul_sigmoid_mul_add_div_pow_add_clamp_b133fc1f_align4_ns {
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
constexpr int kLeaves = 4;
constexpr Leaf kLeafKinds[FACT_MAX_LEAVES] = { Leaf::Full, Leaf::Row, Leaf::Col, Leaf::Scalar, };
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

// Operands and output share a type except in the split families, whose parts are narrower than
// the fp32 output.
using Element = float;
using ElementD = float;
using ElementAccumulator = float;
using ElementCompute = float;
// CUTLASS operand A is torch's B transposed, operand B is torch's a transposed: a row-major torch
// operand is a column-major CUTLASS one.
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::ColumnMajor;
constexpr int Alignment = 4;
constexpr int AlignmentD = 4;

using TileShape = Shape<_128, _128, _32>;
using ClusterShape = Shape<_1, _2, _1>;

// The fused epilogue leaves=full,row,col,scalar;v1=gelu_tanh(v0);v2=mul(v1,l1);v3=sigmoid(v0);v4=mul(v2,v3);v5=add(v4,l2);v6=div(v5,l3);v7=pow(v6,3.0);v8=add(l0,v7);v9=clamp(v8,-inf,6.0)
// as one fp32 functor over the accumulator, the bias and the leaves: a visitor tree of
// one compute node whose children fetch its inputs, so a value used twice is computed once.
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
  CUTLASS_HOST_DEVICE T operator()(T const& acc, T const& bias, T const& l0, T const& l1, T const& l2, T const& l3) const {
    T out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < int(T::kElements); ++i) {
      const float v0 = acc[i] + bias[i];
      const float v1 = 0.5f * v0 * (1.f + fact_tanh_approx(0.79788456080286536f * (v0 + 0.044715f * v0 * v0 * v0)));
      const float v2 = v1 * l1[i];
      const float v3 = 1.f / (1.f + fact_exp_approx(-v0));
      const float v4 = v2 * v3;
      const float v5 = v4 + l2[i];
      const float v6 = v5 / l3[i];
      const float v7 = v6 * v6 * v6;
      const float v8 = l0[i] + v7;
      const float v9 = v8 != v8 ? v8 : fminf(fmaxf(v8, (-INFINITY)), 6e0f);
      out[i] = v9;
    }
    return out;
  }
};

using ElementC = ElementD;
using FusionOp = cutlass::epilogue::fusion::Sm90EVT<
    cutlass::epilogue::fusion::Sm90Compute<FusedEpilogue, ElementD, ElementCompute, cutlass::FloatRoundStyle::round_to_nearest>,
    cutlass::epilogue::fusion::Sm90AccFetch,
    cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, ElementD, ElementCompute, Stride<_1, _0, int64_t>, AlignmentD>,
    cutlass::epilogue::fusion::Sm90SrcFetch<ElementD>,
    cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, ElementD, ElementCompute, Stride<_1, _0, int64_t>, AlignmentD>,
    cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementD, ElementCompute, Stride<_0, _1, int64_t>, AlignmentD>,
    cutlass::epilogue::fusion::Sm90ScalarBroadcast<ElementCompute, Stride<_0, _0, int64_t>>>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto,
    ElementAccumulator, ElementCompute,
    ElementC, LayoutD, AlignmentD,
    ElementD, LayoutD, AlignmentD,
    cutlass::epilogue::TmaWarpSpecializedCooperative,
    FusionOp>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    Element, LayoutA, Alignment,
    Element, LayoutB, Alignment,
    ElementAccumulator,
    TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

// How many of this kernel's clusters the device runs at once, asked once per device. Without it
// CUTLASS's persistent scheduler assumes 18 SMs in every GPC and launches 116 CTAs of 2x2 clusters
// on the H100's 132 SMs, where cudaOccupancyMaxActiveClusters finds room for 30 clusters (120
// CTAs). 0 (the query failed) leaves CUTLASS's own estimate.
int max_active_clusters() {
  struct Clusters;
  const int count = per_device<Clusters>([](int) {
    auto* kernel = cutlass::device_kernel<GemmKernel>;
    const int smem = static_cast<int>(GemmKernel::SharedStorageSize);
    if (!smem_opt_in<GemmKernel>(reinterpret_cast<const void*>(kernel), smem)) return 0;
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = cute::size<0>(ClusterShape{});
    cluster.val.clusterDim.y = cute::size<1>(ClusterShape{});
    cluster.val.clusterDim.z = cute::size<2>(ClusterShape{});
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(cluster.val.clusterDim.x, cluster.val.clusterDim.y, cluster.val.clusterDim.z);
    config.blockDim = dim3(GemmKernel::MaxThreadsPerBlock, 1, 1);
    config.dynamicSmemBytes = smem;
    config.attrs = &cluster;
    config.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return n;
  });
  return count > 0 ? count : 0;
}

// The problem of `p` with operands a (torch's a) and b (torch's b) and out = a.b + beta.out, over
// `k` of K from operands packed with `k_packed` of it (k < k_packed runs on a K-slice).
typename Gemm::Arguments make_arguments(const Call& p, const void* a, const void* b, float beta, int k,
                                        int k_packed) {
  const int M = p.n, N = p.m, K = k, L = p.batch;
  auto stride_a = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, {M, k_packed, L});
  auto stride_b = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, {N, k_packed, L});
  auto stride_d = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, {M, N, L});
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count();
  hw.max_active_clusters = max_active_clusters();
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, L},
      {static_cast<const Element*>(b), stride_a, static_cast<const Element*>(a), stride_b},
      { {}, static_cast<const ElementD*>(p.leaves[0]), stride_d, static_cast<ElementD*>(p.out), stride_d},
      hw};
  (void)beta;
  args.epilogue.thread = { {}, {static_cast<const ElementD*>(p.bias), ElementD(0), {}}, {}, {static_cast<const ElementD*>(p.leaves[1]), ElementD(0), {}}, {static_cast<const ElementD*>(p.leaves[2]), ElementD(0), {}}, {{ElementCompute(0)}, {static_cast<const ElementCompute*>(p.leaves[3])}, {}}, {} };
  // Launch knobs (FactKnobs, set per variant by the dispatch table): no recompile needed.
  using RasterOrderOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.scheduler.max_swizzle_size = p.swizzle > 0 ? p.swizzle : 1;
  args.scheduler.raster_order = p.raster == 1   ? RasterOrderOptions::AlongM
                                : p.raster == 2 ? RasterOrderOptions::AlongN
                                                : RasterOrderOptions::Heuristic;
  return args;
}

[[maybe_unused]] typename Gemm::Arguments make_arguments(const Call& p, const void* a, const void* b, float beta) {
  return make_arguments(p, a, b, beta, p.k, p.k);
}
}  // namespace sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_ep_gelu_tanh_mul_sigmoid_mul_add_div_pow_add_clamp_b133fc1f_align4_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_ep_gelu_tanh_mul_sigmoid_mul_add_div_pow_add_clamp_b133fc1f_align4_can_implement(const FactOpArgs* fact_args, const FactKnobs* knobs) {
  using namespace sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_ep_gelu_tanh_mul_sigmoid_mul_add_div_pow_add_clamp_b133fc1f_align4_ns;
  Call p;
  if (!read_call(fact_args, knobs, p)) return FACT_CANNOT_IMPLEMENT;
  auto args = make_arguments(p, p.a, p.b, 0.0f);
  return Gemm::can_implement(args) == cutlass::Status::kSuccess ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_ep_gelu_tanh_mul_sigmoid_mul_add_div_pow_add_clamp_b133fc1f_align4_workspace_size(const FactOpArgs* fact_args, const FactKnobs* knobs) {
  using namespace sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_ep_gelu_tanh_mul_sigmoid_mul_add_div_pow_add_clamp_b133fc1f_align4_ns;
  Call p;
  if (!read_call(fact_args, knobs, p)) return 0;
  return Gemm::get_workspace_size(make_arguments(p, p.a, p.b, 0.0f));
}

extern "C" __attribute__((weak)) int32_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_ep_gelu_tanh_mul_sigmoid_mul_add_div_pow_add_clamp_b133fc1f_align4_run(const FactOpArgs* fact_args, const FactKnobs* knobs,
                                                             void* workspace, size_t workspace_size, void* stream) {
  using namespace sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_ep_gelu_tanh_mul_sigmoid_mul_add_div_pow_add_clamp_b133fc1f_align4_ns;
  Call p;
  if (!read_call(fact_args, knobs, p)) return FACT_CANNOT_IMPLEMENT;
  auto args = make_arguments(p, p.a, p.b, 0.0f);
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return FACT_CANNOT_IMPLEMENT;
  if (Gemm::get_workspace_size(args) > workspace_size) return FACT_WORKSPACE_TOO_SMALL;
  CallKey key;
  return launch_adapter<Gemm, GemmKernel>(args, workspace, static_cast<cudaStream_t>(stream),
                                          key_of(fact_args, knobs, workspace, key));
}
