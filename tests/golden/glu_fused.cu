// generated from templates/sm90_glu.cu.hbs; do not edit
// spec: {"glu":"fused","act":"silu","gemm":{"family":"sm90_gemm","arch":"sm90","layout":"rcr","math":"bf16","dtype":"bf16","tile":[128,256,64],"cluster":[1,2,1],"schedule":"ws_cooperative","scheduler":"stream_k","bias":false,"align":8,"epilogue":"no_smem"}}
//
// glu_silu_fused_sm90_gemm_rcr_bf16_bf16_128x256x64_1x2x1_ws_coop_sk_nosmem_align8: out[m,i] = silu(x[m,:] . w[gate row of i] ) * (x[m,:] . w[up row of i])
// as one GEMM over the interleaved weights w[2I,K] (blocks of 16 rows: 8 gate rows, then the 8 up
// rows of the same outputs), computed as the column-major CUTLASS problem h^T[2I,M] = w . x^T whose
// epilogue (GluEpilogue below) writes only out[M,I]: each thread holds a gate value and, 8 rows of
// the CUTLASS problem below it, its up value, in the same accumulator fragment.
#include "fact_kernels.h"

#include <cuda_runtime.h>

#include <atomic>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/kernel/tile_scheduler.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace {
namespace glu_silu_fused_sm90_gemm_rcr_bf16_bf16_128x256x64_1x2x1_ws_coop_sk_nosmem_align8_ns {
using namespace cute;

using Element = cutlass::bfloat16_t;
constexpr int kDtype = 1;
constexpr bool kBias = false;
constexpr int kInterleave = 8;

// The call: x[M,K], w[2I,K] and out[M,I] packed row-major, bias[2I] (NULL data without one).
struct Call {
  int m, inter, k;
  const void* x;
  const void* w;
  const void* bias;
  void* out;
  int raster, swizzle;
};

inline bool fits(const FactTensor& t, int rank, const int64_t* sizes, const int64_t* strides) {
  if (t.data == nullptr || t.dtype != kDtype || t.rank != rank) return false;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int d = 0; d < rank; ++d) {
    if (t.sizes[d] != sizes[d] || (sizes[d] != 1 && t.strides[d] != strides[d])) return false;
  }
  return true;
}

// The call `args` states (tensors x, w, bias, out; no scalars); false when this kernel cannot
// take it.
inline bool read_call(const FactOpArgs* args, const FactKnobs* knobs, Call& c) {
  if (args == nullptr || knobs == nullptr || args->tensors == nullptr) return false;
  if (args->num_tensors != 4 || args->num_scalars != 0) return false;
  const FactTensor* t = args->tensors;
  if (t[0].rank != 2 || t[1].rank != 2) return false;
  const int64_t M = t[0].sizes[0], K = t[0].sizes[1], N2 = t[1].sizes[0], I = N2 / 2;
  auto dim = [](int64_t v) { return v >= 1 && v <= INT32_MAX; };
  if (!dim(M) || !dim(K) || !dim(N2) || I % kInterleave != 0 || N2 != 2 * I) return false;
  const int64_t x_sizes[2] = {M, K}, x_strides[2] = {K, 1};
  const int64_t w_sizes[2] = {N2, K}, w_strides[2] = {K, 1};
  const int64_t out_sizes[2] = {M, I}, out_strides[2] = {I, 1};
  const int64_t row[1] = {N2}, one[1] = {1};
  if (!fits(t[0], 2, x_sizes, x_strides) || !fits(t[1], 2, w_sizes, w_strides)) return false;
  if (kBias ? !fits(t[2], 1, row, one) : t[2].data != nullptr) return false;
  if (!fits(t[3], 2, out_sizes, out_strides)) return false;
  c.m = static_cast<int>(M);
  c.inter = static_cast<int>(I);
  c.k = static_cast<int>(K);
  c.x = t[0].data;
  c.w = t[1].data;
  c.bias = t[2].data;
  c.out = t[3].data;
  c.raster = knobs->raster;
  c.swizzle = knobs->swizzle;
  return true;
}

__device__ __forceinline__ float act(float g) { return g / (1.0f + expf(-g)); }

// Registers to global memory, as CUTLASS's DefaultEpilogue (no shared memory), but pairing the
// thread's accumulators: fragment element ((v0, 0, v2), mm, nn) holds a gate row of the CUTLASS
// problem and ((v0, 1, v2), mm, nn) the row 8 below it, its up row (the accumulator layouts of
// WGMMA put value mode (0,1) 8 rows down; `pairs_in_threads` checks it on the host for every
// thread before a launch). It writes act(gate)·up at out[n, (m / 16) * 8 + m % 16], half the width.
class GluEpilogue {
 public:
  using EpilogueSchedule = cutlass::epilogue::NoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  // What the GEMM kernel and its adapter ask of an epilogue; C is never read.
  using ThreadEpilogueOp = cutlass::epilogue::thread::LinearCombination<Element, 1, float, float>;
  using ElementOutput = Element;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementC = void;
  using StrideC = cute::Stride<cute::Int<1>, int64_t, int64_t>;
  using ElementD = Element;
  using StrideD = cute::Stride<cute::Int<1>, int64_t, int64_t>;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;

  struct SharedStorage {};
  using TensorStorage = SharedStorage;

  struct Arguments {
    const Element* bias = nullptr;
    Element* out = nullptr;
    int inter = 0;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem, Arguments const& args) {
    return args.out != nullptr && 2 * args.inter == get<0>(problem) && args.inter % kInterleave == 0;
  }

  CUTLASS_HOST_DEVICE
  GluEpilogue(Params const& params, SharedStorage const& = SharedStorage()) : params(params) {}

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    static_assert(is_static<FrgLayout>::value, "the accumulator layout must be static");
    static_assert(rank<0>(FrgLayout{}) == 3 && size<0, 1>(FrgLayout{}) == 2,
                  "an accumulator value mode of WGMMA's (2, 2, N/8) form");
    const int M = get<0>(problem_shape_mnkl), N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    // The absolute (m, n) of every accumulator of this thread.
    Tensor coords = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_MNK),
                               make_coord(m_coord, n_coord));
    Tensor tCc = tiled_mma.get_thread_slice(thread_idx).partition_C(coords);
    CUTE_STATIC_ASSERT_V(size(tCc) == size(accumulators));
    const int64_t inter = params.inter;
    CUTLASS_PRAGMA_UNROLL
    for (int v0 = 0; v0 < size<0, 0>(accumulators); ++v0) {
      CUTLASS_PRAGMA_UNROLL
      for (int v2 = 0; v2 < size<0, 2>(accumulators); ++v2) {
        CUTLASS_PRAGMA_UNROLL
        for (int mm = 0; mm < size<1>(accumulators); ++mm) {
          CUTLASS_PRAGMA_UNROLL
          for (int nn = 0; nn < size<2>(accumulators); ++nn) {
            auto gate = make_coord(make_coord(v0, 0, v2), mm, nn);
            auto up = make_coord(make_coord(v0, 1, v2), mm, nn);
            const int m = get<0>(tCc(gate)), n = get<1>(tCc(gate));
            if (m >= M || n >= N) continue;
            float g = accumulators(gate), u = accumulators(up);
            if constexpr (kBias) {
              g += static_cast<float>(params.bias[m]);
              u += static_cast<float>(params.bias[m + kInterleave]);
            }
            const int64_t i = (m / (2 * kInterleave)) * kInterleave + m % (2 * kInterleave);
            params.out[static_cast<int64_t>(n) * inter + i] = static_cast<Element>(act(g) * u);
          }
        }
      }
    }
  }

 private:
  Params params;
};

using TileShape = Shape<_128, _256, _64>;
using ClusterShape = Shape<_1, _2, _1>;
using CollectiveEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<GluEpilogue>;

// CUTLASS's A is the interleaved weight (K-contiguous rows), its B is torch's x transposed.
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    Element, cutlass::layout::RowMajor, 8,
    Element, cutlass::layout::ColumnMajor, 8,
    float,
    TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<
        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, cutlass::gemm::StreamKScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

// Whether every thread of the MMA holds each gate value's up value 8 rows below it, in value
// mode (0,1) of its fragment, with the gate rows the first 8 of each 16: what the epilogue pairs
// on. Read from CuTe's layouts once per process, so a layout that breaks it refuses every call
// rather than writing wrong numbers.
bool pairs_in_threads() {
  static const bool ok = [] {
    using TiledMma = typename CollectiveMainloop::TiledMma;
    Tensor coords = make_identity_tensor(make_shape(Int<128>{}, Int<256>{}));
    for (int t = 0; t < int(size(TiledMma{})); ++t) {
      Tensor tCc = TiledMma{}.get_thread_slice(t).partition_C(coords);
      if (rank<0>(tCc) != 3 || size<0, 1>(tCc) != 2) return false;
      for (int v0 = 0; v0 < size<0, 0>(tCc); ++v0)
        for (int v2 = 0; v2 < size<0, 2>(tCc); ++v2)
          for (int mm = 0; mm < size<1>(tCc); ++mm)
            for (int nn = 0; nn < size<2>(tCc); ++nn) {
              auto g = tCc(make_coord(make_coord(v0, 0, v2), mm, nn));
              auto u = tCc(make_coord(make_coord(v0, 1, v2), mm, nn));
              if (int(get<0>(g)) % (2 * kInterleave) >= kInterleave || int(get<0>(u)) != int(get<0>(g)) + kInterleave ||
                  int(get<1>(u)) != int(get<1>(g))) {
                return false;
              }
            }
    }
    return true;
  }();
  return ok;
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

typename Gemm::Arguments make_arguments(const Call& p) {
  const int M = 2 * p.inter, N = p.m, K = p.k;
  auto stride_a = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, {M, K, 1});
  auto stride_b = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, {N, K, 1});
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count();
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {static_cast<const Element*>(p.w), stride_a, static_cast<const Element*>(p.x), stride_b},
      {static_cast<const Element*>(p.bias), static_cast<Element*>(p.out), p.inter},
      hw};
  using RasterOrderOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.scheduler.max_swizzle_size = p.swizzle > 0 ? p.swizzle : 1;
  args.scheduler.raster_order = p.raster == 1   ? RasterOrderOptions::AlongM
                                : p.raster == 2 ? RasterOrderOptions::AlongN
                                                : RasterOrderOptions::Heuristic;
  return args;
}
}  // namespace glu_silu_fused_sm90_gemm_rcr_bf16_bf16_128x256x64_1x2x1_ws_coop_sk_nosmem_align8_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_glu_silu_fused_sm90_gemm_rcr_bf16_bf16_128x256x64_1x2x1_ws_coop_sk_nosmem_align8_can_implement(const FactOpArgs* fact_args, const FactKnobs* knobs) {
  using namespace glu_silu_fused_sm90_gemm_rcr_bf16_bf16_128x256x64_1x2x1_ws_coop_sk_nosmem_align8_ns;
  Call p;
  if (!read_call(fact_args, knobs, p) || !pairs_in_threads()) return FACT_CANNOT_IMPLEMENT;
  return Gemm::can_implement(make_arguments(p)) == cutlass::Status::kSuccess ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_glu_silu_fused_sm90_gemm_rcr_bf16_bf16_128x256x64_1x2x1_ws_coop_sk_nosmem_align8_workspace_size(const FactOpArgs* fact_args, const FactKnobs* knobs) {
  using namespace glu_silu_fused_sm90_gemm_rcr_bf16_bf16_128x256x64_1x2x1_ws_coop_sk_nosmem_align8_ns;
  Call p;
  if (!read_call(fact_args, knobs, p)) return 0;
  return Gemm::get_workspace_size(make_arguments(p));
}

extern "C" __attribute__((weak)) int32_t fact_k_glu_silu_fused_sm90_gemm_rcr_bf16_bf16_128x256x64_1x2x1_ws_coop_sk_nosmem_align8_run(const FactOpArgs* fact_args, const FactKnobs* knobs,
                                                             void* workspace, size_t workspace_size, void* stream) {
  using namespace glu_silu_fused_sm90_gemm_rcr_bf16_bf16_128x256x64_1x2x1_ws_coop_sk_nosmem_align8_ns;
  Call p;
  if (!read_call(fact_args, knobs, p) || !pairs_in_threads()) return FACT_CANNOT_IMPLEMENT;
  auto args = make_arguments(p);
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return FACT_CANNOT_IMPLEMENT;
  if (Gemm::get_workspace_size(args) > workspace_size) return FACT_WORKSPACE_TOO_SMALL;
  CallKey key;
  return launch_adapter<Gemm, GemmKernel>(args, workspace, static_cast<cudaStream_t>(stream),
                                          key_of(fact_args, knobs, workspace, key));
}
