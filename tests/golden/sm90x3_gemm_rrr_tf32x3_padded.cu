// generated from templates/sm90_gemm_x3.cu.hbs; do not edit
// spec: {"family":"sm90_gemm_x3","arch":"sm90","layout":"rrr","math":"tf32x3","dtype":"f32","tile":[128,256,32],"cluster":[1,2,1],"schedule":"ws_cooperative","scheduler":"persistent","bias":false,"align":1,"epilogue":"no_smem"}
//
// sm90x3_gemm_rrr_tf32x3_f32_128x256x32_1x2x1_ws_coop_dp_nosmem_align1: fp32-accurate out[m,n] = a[m,k] . B (torch layout rrr) on WGMMA as three
// products of split operands, a.b ~ a_hi.b_hi + a_hi.b_lo + a_lo.b_hi, in two GEMMs:
//   out  = a_hi . b_hi                        (over K)
//   out += [a_hi | a_lo] . [b_lo ; b_hi]      (over 2K, beta = 1)
// The split writes each operand's parts concatenated along K, a as [hi | lo] and b as [lo ; hi],
// so the second GEMM reads them as one operand twice as deep and the first reads a K-slice of
// each: the output is read back once, not twice, and nothing is written twice.
// tf32 split: hi = x with the low 13 mantissa bits cleared (a tf32 value, read without loss),
// lo = x - hi; the dropped term and tf32's reading of lo are below 2^-20 relative. tf32 WGMMA reads
// only K-major shared memory, so the split writes b K-major (transposing torch's
// row-major b) and no pass stages an operand through registers.
// The parts live in the workspace. Like the sm90 family it computes the column-major transposed
// problem.
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
namespace sm90x3_gemm_rrr_tf32x3_f32_128x256x32_1x2x1_ws_coop_dp_nosmem_align1_ns {
using namespace cute;

// The call in torch's terms, out[L,M,N] = f(a[L,M,K] . B[L,K,N] + bias[N], leaves), every tensor
// packed as the layout says (a row-major, B row-major), so the kernel needs only their sizes and data.
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
constexpr bool kRowA = true, kRowB = true, kBias = false;
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

using TileShape = Shape<_128, _256, _32>;
using ClusterShape = Shape<_1, _2, _1>;

// Only the split families read the output back (beta = 1); without a C operand the epilogue
// keeps no shared memory for it, which the mainloop's stages get instead.
using ElementC = ElementD;
using FusionOp = cutlass::epilogue::fusion::LinearCombination<ElementD, ElementCompute, ElementC, ElementCompute>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto,
    ElementAccumulator, ElementCompute,
    ElementC, LayoutD, AlignmentD,
    ElementD, LayoutD, AlignmentD,
    cutlass::epilogue::NoSmemWarpSpecialized,
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
// Padded parts: b's rows (torch's n) padded to `m_packed`, the output `out` with that leading dim.
typename Gemm::Arguments make_arguments(const Call& p, const void* a, const void* b, float beta, int k,
                                        int k_packed, int m_packed, void* out) {
  const int M = m_packed, N = p.m, K = k, L = p.batch;
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
      { {}, static_cast<const ElementD*>(out), stride_d, static_cast<ElementD*>(out), stride_d},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = beta;
  // Launch knobs (FactKnobs, set per variant by the dispatch table): no recompile needed.
  using RasterOrderOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.scheduler.max_swizzle_size = p.swizzle > 0 ? p.swizzle : 1;
  args.scheduler.raster_order = p.raster == 1   ? RasterOrderOptions::AlongM
                                : p.raster == 2 ? RasterOrderOptions::AlongN
                                                : RasterOrderOptions::Heuristic;
  return args;
}

[[maybe_unused]] typename Gemm::Arguments make_arguments(const Call& p, const void* a, const void* b, float beta) {
  return make_arguments(p, a, b, beta, p.k, p.k, p.n, p.out);
}
using FirstGemm = Gemm;
using SecondGemm = Gemm;
using FirstKernel = GemmKernel;
using SecondKernel = GemmKernel;
// Padded parts (torch's dims need not be whole vectors): K rounded up to 16 bytes of parts, and
// b's n (the CUTLASS problem's M, the output's contiguous dim) too, the padding zero, so both GEMMs
// see aligned extents and strides; they write an n-padded workspace when torch's output is not.
// (A padded split fuses no bias or epilogue: KernelSpec::invalid_reason.)
constexpr int kPartAlign = 16 / int(sizeof(Element));
int padded_k(const Call& p) { return (p.k + kPartAlign - 1) / kPartAlign * kPartAlign; }
int padded_n(const Call& p) { return (p.n + kPartAlign - 1) / kPartAlign * kPartAlign; }
Gemm::Arguments first_arguments(const Call& p, const void* a, const void* b, void* out) {
  return make_arguments(p, a, b, 0.0f, padded_k(p), 2 * padded_k(p), padded_n(p), out);
}
Gemm::Arguments second_arguments(const Call& p, const void* a, const void* b, void* out) {
  return make_arguments(p, a, b, 1.0f, 2 * padded_k(p), 2 * padded_k(p), padded_n(p), out);
}

__device__ __forceinline__ void split_one(float v, Element& hi, Element& lo) {
  hi = __uint_as_float(__float_as_uint(v) & 0xffffe000u);
  lo = v - hi;
}

struct alignas(4 * sizeof(Element)) Quad {
  Element v[4];
};

// Splits x, seen as groups of g floats (g % 4 == 0, 16-byte aligned), into parts laid out as
// groups of 2g: each group's hi parts at offset hi_at (0 or g), its lo parts at the other half.
__global__ void split_parts(const float4* __restrict__ x, Element* __restrict__ parts, size_t n4, size_t g,
                            size_t hi_at) {
  const size_t lo_at = g - hi_at;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    const float in[4] = {v.x, v.y, v.z, v.w};
    Quad h, l;
    for (int j = 0; j < 4; ++j) split_one(in[j], h.v[j], l.v[j]);
    // Four parts stay contiguous and aligned within a group (g % 4 == 0): one vector store each.
    const size_t e = 4 * i, o = e / g * 2 * g + e % g;
    *reinterpret_cast<Quad*>(parts + o + hi_at) = h;
    *reinterpret_cast<Quad*>(parts + o + lo_at) = l;
  }
}

// The split of a batch of row-major k x n matrices into K-major parts, batch x n x [lo | hi] (2k),
// through a shared-memory tile so both the reads and the writes are coalesced.
__global__ void split_parts_transposed(const float* __restrict__ x, Element* __restrict__ parts, int k, int n, int kp, int np) {
  __shared__ float tile[32][33];
  const size_t in_base = size_t(blockIdx.z) * k * n, out_base = size_t(blockIdx.z) * np * 2 * kp;
  const int n0 = blockIdx.x * 32, k0 = blockIdx.y * 32;
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    if (k0 + r < k && n0 + threadIdx.x < n) tile[r][threadIdx.x] = x[in_base + size_t(k0 + r) * n + n0 + threadIdx.x];
    else tile[r][threadIdx.x] = 0.f;  // the padding
  }
  __syncthreads();
  for (int c = threadIdx.y; c < 32; c += blockDim.y) {
    if (n0 + c < np && k0 + threadIdx.x < kp) {
      Element h, l;
      split_one(tile[threadIdx.x][c], h, l);
      const size_t o = out_base + size_t(n0 + c) * 2 * kp + k0 + threadIdx.x;
      parts[o] = l;
      parts[o + kp] = h;
    }
  }
}


// Splits a batch of rows x cols row-major fp32 matrices (any cols) into zero-padded parts: element
// (r, c) of batch z, r < rows_p and c < cols_p, goes to z * batch_stride + r * ld + c, plus hi_at
// for its hi part and lo_at for its lo part; x's element where r < rows and c < cols, else zero.
// Scalar loads and stores: a row of a ragged matrix starts at no vector boundary.
struct PaddedSplit {
  int batch, rows, cols, rows_p, cols_p;
  size_t ld, batch_stride, hi_at, lo_at;
};
__global__ void split_parts_padded(const float* __restrict__ x, Element* __restrict__ parts, PaddedSplit s) {
  const size_t per = size_t(s.rows_p) * s.cols_p, total = per * s.batch;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x) {
    const size_t z = i / per, r = i % per / s.cols_p, c = i % s.cols_p;
    const float v = r < size_t(s.rows) && c < size_t(s.cols) ? x[(z * s.rows + r) * s.cols + c] : 0.f;
    Element h, l;
    split_one(v, h, l);
    const size_t o = z * s.batch_stride + r * s.ld + c;
    parts[o + s.hi_at] = h;
    parts[o + s.lo_at] = l;
  }
}

// torch's output from the n-padded workspace the GEMMs wrote (rows ld apart).
__global__ void copy_out(const float* __restrict__ from, float* __restrict__ to, size_t rows, int n, int ld) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < rows * n; i += size_t(gridDim.x) * blockDim.x) {
    to[i] = from[i / n * ld + i % n];
  }
}

int grid_for(size_t n) {
  const size_t wanted = (n + 255) / 256;
  return static_cast<int>(wanted < 132 * 16 ? wanted : 132 * 16);
}

size_t numel_a(const Call& p) { return size_t(p.batch) * p.m * padded_k(p); }
size_t numel_b(const Call& p) { return size_t(p.batch) * padded_k(p) * padded_n(p); }
size_t round_up(size_t v) { return (v + 255) / 256 * 256; }
size_t a_parts_bytes(const Call& p) { return round_up(2 * numel_a(p) * sizeof(Element)); }
size_t b_parts_bytes(const Call& p) { return round_up(2 * numel_b(p) * sizeof(Element)); }
// The n-padded output the GEMMs write when torch's rows are not whole vectors, else none.
size_t out_ws_bytes(const Call& p) {
  return padded_n(p) == p.n ? 0 : round_up(size_t(p.batch) * p.m * padded_n(p) * sizeof(float));
}
size_t parts_bytes(const Call& p) { return a_parts_bytes(p) + b_parts_bytes(p) + out_ws_bytes(p); }

void launch_split(const void* x, Element* parts, size_t n, size_t g, size_t hi_at, cudaStream_t s) {
  const size_t n4 = n / 4;
  const size_t wanted = (n4 + 255) / 256;
  const int blocks = static_cast<int>(wanted < 132 * 16 ? wanted : 132 * 16);
  split_parts<<<blocks, 256, 0, s>>>(static_cast<const float4*>(x), parts, n4, g, hi_at);
}

// Whether both GEMMs (and the split) take the call.
bool implementable(const Call& p) {
  return FirstGemm::can_implement(first_arguments(p, p.a, p.b, p.out)) == cutlass::Status::kSuccess &&
         SecondGemm::can_implement(second_arguments(p, p.a, p.b, p.out)) == cutlass::Status::kSuccess;
}

// The parts and the larger of the two GEMMs' own workspaces.
size_t workspace_bytes(const Call& p) {
  const size_t first = FirstGemm::get_workspace_size(first_arguments(p, p.a, p.b, p.out));
  const size_t second = SecondGemm::get_workspace_size(second_arguments(p, p.a, p.b, p.out));
  return parts_bytes(p) + (first > second ? first : second);
}
}  // namespace sm90x3_gemm_rrr_tf32x3_f32_128x256x32_1x2x1_ws_coop_dp_nosmem_align1_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm90x3_gemm_rrr_tf32x3_f32_128x256x32_1x2x1_ws_coop_dp_nosmem_align1_can_implement(const FactOpArgs* fact_args, const FactKnobs* knobs) {
  using namespace sm90x3_gemm_rrr_tf32x3_f32_128x256x32_1x2x1_ws_coop_dp_nosmem_align1_ns;
  Call p;
  return read_call(fact_args, knobs, p) && implementable(p) ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm90x3_gemm_rrr_tf32x3_f32_128x256x32_1x2x1_ws_coop_dp_nosmem_align1_workspace_size(const FactOpArgs* fact_args, const FactKnobs* knobs) {
  using namespace sm90x3_gemm_rrr_tf32x3_f32_128x256x32_1x2x1_ws_coop_dp_nosmem_align1_ns;
  Call p;
  return read_call(fact_args, knobs, p) ? workspace_bytes(p) : 0;
}

extern "C" __attribute__((weak)) int32_t fact_k_sm90x3_gemm_rrr_tf32x3_f32_128x256x32_1x2x1_ws_coop_dp_nosmem_align1_run(const FactOpArgs* fact_args, const FactKnobs* knobs,
                                                             void* workspace, size_t workspace_size, void* stream) {
  using namespace sm90x3_gemm_rrr_tf32x3_f32_128x256x32_1x2x1_ws_coop_dp_nosmem_align1_ns;
  Call p;
  if (!read_call(fact_args, knobs, p) || !implementable(p)) return FACT_CANNOT_IMPLEMENT;
  if (workspace_bytes(p) > workspace_size) return FACT_WORKSPACE_TOO_SMALL;
  auto s = static_cast<cudaStream_t>(stream);
  char* w = static_cast<char*>(workspace);
  Element* a_parts = reinterpret_cast<Element*>(w);
  Element* b_parts = reinterpret_cast<Element*>(w + a_parts_bytes(p));
  void* gemm_ws = w + parts_bytes(p);
  const int kp = padded_k(p), np = padded_n(p);
  // torch's a is K-major (rows of k): each row becomes [hi | lo], kp each.
  const PaddedSplit sa{p.batch, p.m, p.k, p.m, kp, size_t(2) * kp, size_t(2) * kp * p.m, 0, size_t(kp)};
  split_parts_padded<<<grid_for(numel_a(p)), 256, 0, s>>>(static_cast<const float*>(p.a), a_parts, sa);
  const dim3 grid((np + 31) / 32, (kp + 31) / 32, p.batch);
  split_parts_transposed<<<grid, dim3(32, 8), 0, s>>>(static_cast<const float*>(p.b), b_parts, p.k, p.n, kp, np);
  const size_t b_hi_at = kp;
  void* out = np == p.n ? p.out : w + a_parts_bytes(p) + b_parts_bytes(p);
  const int32_t first = launch_adapter<FirstGemm, FirstKernel>(first_arguments(p, a_parts, b_parts + b_hi_at, out), gemm_ws, s);
  if (first != FACT_OK) return first;
  const int32_t second = launch_adapter<SecondGemm, SecondKernel>(second_arguments(p, a_parts, b_parts, out), gemm_ws, s);
  if (second != FACT_OK) return second;
  if (out != p.out) {
    const size_t rows = size_t(p.batch) * p.m;
    copy_out<<<grid_for(rows * p.n), 256, 0, s>>>(static_cast<const float*>(out), static_cast<float*>(p.out), rows, p.n, np);
  }
  return FACT_OK;
}
