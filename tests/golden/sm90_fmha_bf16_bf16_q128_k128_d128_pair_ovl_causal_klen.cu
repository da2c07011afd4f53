// generated from templates/sm90_fmha.cu.hbs; do not edit
// sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen: CUTLASS's sm90 fused multi-head attention forward (examples/88_hopper_fmha: TMA loads,
// WGMMA, a producer warp group and two consumer warp groups on a persistent grid, Q
// loaded by its own warp, fact's paired tile order),
// 128 queries x 128 keys per CTA, head-dim tile 128, bf16 math,
// causal (key j > query i masked, torch's top-left is_causal), and
// each sequence's keys end at its own length (keys at or past lengths[b] masked for every query of
// batch b, key blocks wholly past it skipped): CausalLengthFusion.
// Tensors (FactOpArgs, include/fact_kernels.h): q [B,Hq,Tq,D], k and v [B,Hkv,Tk,D] (Hkv dividing
// Hq: query head h reads k/v head h / (Hq/Hkv), in place), out [B,Hq,Tq,D],
// all read and written through their strides (unit stride along D, the others multiples of 16
// bytes: TMA), a factor (one fp32 value in device memory, e.g. a divisor the graph computes on the
// GPU; NULL data when none), each sequence's key count (int32 [B] in device
// memory), and no mask (NULL data);
// scalars: scale, causal, and the factor's power
// (1: scale·factor, -1: scale/factor). The kernel reads the factor and the
// lengths itself so the host never waits for them. The workspace holds the kernel's
// log-sum-exp rows (fp32 [B,Hq,Tq]).
#include "fact_kernels.h"

#include <cuda_runtime.h>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"
#include "cutlass/kernel_hardware_info.h"
#include "collective/fmha_fusion.hpp"
#include "kernel/fmha_kernel_builder.hpp"

// Internal linkage: a unit may hold a kernel that another object linked beside it holds too
// (a sweep's unit next to the same kernel built alone); only the weak entry points are shared.
namespace {
namespace fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen {

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

using namespace cute;

using Element = cutlass::bfloat16_t;
using StrideQKVO = cute::tuple<int, _1, cute::tuple<int, int>>;  // T, D, (B, H)

// The problem as the consumers of a tile see it where the call gives its mask in place of the key
// lengths (a CUDA graph capture cannot read a mask's class on the host): the fusions read the
// mask's cells themselves, in every key block. `get` reads it as the problem it derives from.
template <class P>
struct MaskedProblem : P {
  const char* mask;  // the tile's (batch, head) [Tq, Tk] slice; NULL: no mask
  int64_t mask_q;    // its query stride in elements (0: one row of keys for every query)
  int kind;          // 1: bool, a key visible where nonzero; 2: added to the scaled scores
  float inv_scale;   // an added value goes onto the unscaled scores divided by the scale,
  float lo;          // and no lower than lo, so scale·(score + lo) stays finite (-inf, or torch's
                     // finfo.min over the scale, would not)
};

template <class P>
CUTLASS_DEVICE bool has_mask(P const&) {
  return false;
}
template <class P>
CUTLASS_DEVICE bool has_mask(MaskedProblem<P> const& p) {
  return p.mask != nullptr;
}

// The call's mask on one key block's scores (cells past Tq or Tk are left to the fusion).
template <class AccQK, class IndexQK, class P>
CUTLASS_DEVICE void apply_call_mask(AccQK&, IndexQK const&, P const&) {}
template <class AccQK, class IndexQK, class P>
CUTLASS_DEVICE void apply_call_mask(AccQK& acc_qk, IndexQK const& index_qk, MaskedProblem<P> const& p) {
  if (p.mask == nullptr) return;
  const int tq = get<2>(p), tk = get<3>(p);
  const uint8_t* visible = reinterpret_cast<const uint8_t*>(p.mask);
  const Element* added = reinterpret_cast<const Element*>(p.mask);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(acc_qk); i++) {
    auto pos = index_qk(i);
    const int qi = get<0>(pos), kj = get<1>(pos);
    if (qi >= tq || kj >= tk) continue;
    const int64_t at = qi * p.mask_q + kj;
    if (p.kind == 1) {
      if (visible[at] == 0) acc_qk(i) = -INFINITY;
    } else {
      acc_qk(i) += ::fmaxf(static_cast<float>(added[at]) * p.inv_scale, p.lo);
    }
  }
}

// examples/88's CausalFusion with the keys at or past the sequence's length masked too. The
// mainloop hands the fusions a problem whose Tk is that length (`keys_of`), so CausalFusion's
// trip count already stops at the last key block holding a key below it, and that block is among
// the masked ones it counts from the end (at least one).
struct CausalLengthFusion : cutlass::fmha::collective::CausalFusion {
  template <class AccQK, class IndexQK, class ProblemSize>
  CUTLASS_DEVICE void before_softmax(AccQK& acc_qk, IndexQK const& index_qk, ProblemSize const& problem_size) {
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size(acc_qk); i++) {
      auto pos = index_qk(i);
      if (get<0>(pos) < get<1>(pos) || get<1>(pos) >= get<3>(problem_size)) acc_qk(i) = -INFINITY;
    }
  }
};


using Built = typename cutlass::fmha::kernel::FmhaBuilder<
    Element, float, float, Shape<_128, _128, _128>, StrideQKVO, StrideQKVO, StrideQKVO,
    CausalLengthFusion, cutlass::gemm::KernelTmaWarpSpecializedPingpong>::Kernel;

// The persistent grid's tile order under a causal mask, where query block m of M has m + 1 key
// blocks of work: a CTA takes blocks M-1-j and j of one (batch, head) one after the other, so every
// pair costs M + 1 key blocks (the middle block of an odd M goes alone), and the pairs are dealt to
// the CTAs in turn. A (batch, head)'s pairs go to neighbouring CTAs at about the same time, so its
// keys and values are read while they are in L2. In the rotated order a CTA's blocks are of any
// length, and at 12·16 heads of 8 blocks on 132 SMs the busiest CTA has 1.13x the mean work; paired,
// 1.03x, which is the rounding of 768 pairs over 132 CTAs.
struct PairedTileScheduler {
  struct Params {
    int num_pairs;
    int m_blocks;
    cutlass::FastDivmod divmod_pairs;  // pairs per (batch, head)
    cutlass::FastDivmod divmod_h;
    cutlass::KernelHardwareInfo hw_info;
  };

  int pair = 0;
  bool second = false;
  Params params;

  CUTLASS_DEVICE
  PairedTileScheduler(Params const& p) : pair(blockIdx.x), params(p) {}

  template <class ProblemSize, class ClusterShape, class TileShape>
  static Params to_underlying_arguments(ProblemSize const& problem_size, cutlass::KernelHardwareInfo hw_info,
                                        ClusterShape const&, TileShape const& tile_shape) {
    const int m_blocks = ceil_div(size<2>(problem_size), size<0>(tile_shape));
    const int pairs = (m_blocks + 1) / 2;
    return Params{pairs * size<0>(problem_size) * size<1>(problem_size), m_blocks, {pairs}, {size<1>(problem_size)}, hw_info};
  }

  static dim3 get_grid_shape(Params const& p) { return dim3(std::min(p.num_pairs, p.hw_info.sm_count), 1, 1); }

  CUTLASS_DEVICE
  bool is_valid() { return pair < params.num_pairs; }

  CUTLASS_DEVICE
  auto get_block_coord() {
    int bh, j, b, h;
    params.divmod_pairs(bh, j, pair);
    params.divmod_h(b, h, bh);
    return make_coord(second ? j : params.m_blocks - 1 - j, _0{}, make_coord(b, h));
  }

  CUTLASS_DEVICE
  PairedTileScheduler& operator++() {
    int bh, j;
    params.divmod_pairs(bh, j, pair);
    if (!second && params.m_blocks - 1 - j != j) {
      second = true;
    } else {
      second = false;
      pair += gridDim.x;
    }
    return *this;
  }
};

// The example's mainloop with the softmax scale of the call (the example fixes 1/sqrt(D)) and, when
// the graph computes the scale on the GPU, the factor read in the kernel. Only the consumer warps
// read the scale, so only `compute` sees the adjusted copy.
// Grouped-query heads: k and v have Hq / group heads, their TMA descriptors are built over those,
// and the producer loads k/v head h / group for query head h (`load_kv_maybe_q`); the consumers,
// the epilogue and the tile order see Hq heads as before.
// Key lengths: the producer and the consumers take the problem with Tk cut to the sequence's
// length (`keys_of`), so both count the same key blocks and the fusion masks past it. Where the
// call gives its mask beside them (a kernel without the causal mask) and a sequence's length is
// below 1, Tk stays whole and the consumers' problem carries the tile's slice of the mask
// (`masked`): a capture computes the lengths on the device, -1 where the mask is no prefix.
template <class Base>
struct ScaledMainloop : Base {
  static constexpr bool kKeyLengths = true;

  struct Arguments : Base::Arguments {
    float scale;
    const float* factor;
    int power;
    const int32_t* lengths;
    int group;
    const void* mask;
    int mask_kind;
    int64_t mask_b, mask_h, mask_q;  // strides in elements
  };
  struct Params : Base::Params {
    const float* factor;
    int power;
    const int32_t* lengths;
    int group;
    const void* mask;
    int mask_kind;
    int64_t mask_b, mask_h, mask_q;
  };

  // Any query length: the example refuses Tq % Alignment != 0, but TMA zero-fills the rows past Tq
  // in the last query block and bounds its store of O there, and the epilogue writes the LSE of
  // rows below Tq only, so the rest of the example's check is kept with Tq rounded up.
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem, Arguments const& a) {
    ProblemShape p = problem;
    get<2>(p) = ceil_div(get<2>(problem), Base::Alignment) * Base::Alignment;
    return Base::can_implement(p, a);
  }

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem, Arguments const& a, void* workspace) {
    Params p{Base::to_underlying_arguments(problem, a, workspace), a.factor, a.power, a.lengths, a.group,
             a.mask, a.mask_kind, a.mask_b, a.mask_h, a.mask_q};
    if (a.group > 1) {
      ProblemShape kv = problem;
      get<1>(kv) = get<1>(problem) / a.group;
      typename Base::Params kv_params = Base::to_underlying_arguments(kv, a, workspace);
      p.tma_load_k = kv_params.tma_load_k;
      p.tma_load_v = kv_params.tma_load_v;
    }
    p.scale_softmax = a.scale;
    p.scale_softmax_log2 = static_cast<float>(static_cast<double>(a.scale) * M_LOG2E);
    return p;
  }

  // The problem as tile `blk`'s key loop sees it: with key lengths, Tk is batch b's length, kept
  // within [1, Tk] (the op passes lengths in it; a 0 would leave the producer and the consumers
  // no key block to agree on); Tk where the mask is read cell by cell (`reads_mask`).
  template <class BlkCoord, class ProblemShape>
  CUTLASS_DEVICE static ProblemShape keys_of(BlkCoord const& blk, Params const& params, ProblemShape const& problem) {
    if constexpr (kKeyLengths) {
      if (reads_mask(blk, params)) return problem;
      ProblemShape p = problem;
      get<3>(p) = ::max(1, ::min(static_cast<int>(params.lengths[get<2, 0>(blk)]), get<3>(problem)));
      return p;
    } else {
      return problem;
    }
  }

  template <bool kLoadQ, class BlkCoord, class ProblemShape, class... Rest>
  CUTLASS_DEVICE void load_kv_maybe_q(int block_rank_in_cluster, BlkCoord const& blk, Params const& params,
                                      ProblemShape const& problem, Rest&&... rest) {
    if constexpr (kLoadQ) {
      // q and k/v load from one coordinate here: make_arguments refuses grouped heads.
      Base::template load_kv_maybe_q<true>(block_rank_in_cluster, blk, params, keys_of(blk, params, problem),
                                           static_cast<Rest&&>(rest)...);
    } else {
      auto kv_blk = make_coord(get<0>(blk), get<1>(blk), make_coord(get<2, 0>(blk), get<2, 1>(blk) / params.group));
      Base::template load_kv_maybe_q<false>(block_rank_in_cluster, kv_blk, params, keys_of(blk, params, problem),
                                            static_cast<Rest&&>(rest)...);
    }
  }

  // Whether tile `blk`'s sequence has its mask read cell by cell: a mask given, and no length of
  // at least 1 for it.
  template <class BlkCoord>
  CUTLASS_DEVICE static bool reads_mask(BlkCoord const& blk, Params const& params) {
    return params.mask != nullptr && (params.lengths == nullptr || params.lengths[get<2, 0>(blk)] < 1);
  }

  // The consumers' problem: keys_of's, with the tile's slice of the call's mask where it reads it,
  // against the scale the consumers use (`p`'s).
  template <class BlkCoord, class ProblemShape>
  CUTLASS_DEVICE static auto masked(BlkCoord const& blk, Params const& params, typename Base::Params const& p,
                                    ProblemShape const& problem) {
    const char* slice = nullptr;
    if (reads_mask(blk, params)) {
      const int64_t bytes = params.mask_kind == 1 ? 1 : static_cast<int64_t>(sizeof(Element));
      slice = static_cast<const char*>(params.mask) +
              bytes * (get<2, 0>(blk) * params.mask_b + get<2, 1>(blk) * params.mask_h);
    }
    const float lo = -1e37f / ::fmaxf(p.scale_softmax_log2, 1.f);
    return MaskedProblem<ProblemShape>{keys_of(blk, params, problem), slice, params.mask_q, params.mask_kind,
                                       1.f / p.scale_softmax, lo};
  }

  template <class BlkCoord, class ProblemShape, class... Rest>
  CUTLASS_DEVICE auto compute(BlkCoord const& blk, BlkCoord const& wg, Params const& params, ProblemShape const& problem,
                              Rest&... rest) {
    typename Base::Params p = params;
    if (params.factor != nullptr) {
      const float f = *params.factor;
      p.scale_softmax = params.power > 0 ? p.scale_softmax * f : p.scale_softmax / f;
      p.scale_softmax_log2 = p.scale_softmax * static_cast<float>(M_LOG2E);
    }
    return overlapped(blk, wg, p, masked(blk, params, p, problem), rest...);
  }

  // One key block's softmax on its scores alone, while the previous block's P·V product still
  // runs: the running max and sum move on, the scores become exp2(scale·s - scale·max), and each
  // row's factor for the output (exp2 of scale·(old max - new max)) is returned, to be applied
  // once that product is done. The row maxima reduce across the threads holding one row.
  template <class AccQK, class State>
  CUTLASS_DEVICE static auto softmax_scores(AccQK& acc_qk, State& state, float scale_log2) {
    using namespace cutlass::fmha::collective;
    typename Base::TiledMmaQK mma;
    Tensor s = make_tensor(acc_qk.data(), layout_acc_mn(mma, acc_qk.layout()));
    auto across = reduction_target_n(mma);
    constexpr int kRanks = decltype(rank(across))::value;
    auto& row_max = get<0>(state);
    auto& row_sum = get<1>(state);
    Tensor factor = make_fragment_like<float>(row_max);
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < size<0>(s); i++) {
      const float old_max = row_max(i);
      float m = old_max;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(s); j++) m = ::max(m, s(i, j));
      for_each(make_seq<kRanks>{}, [&](auto r) {
        CUTLASS_PRAGMA_UNROLL
        for (int k = 1; k < shape<r>(across); k *= 2) {
          m = ::max(m, __shfl_xor_sync(uint32_t(-1), m, stride<r>(across) * k));
        }
      });
      row_max(i) = m;
      // A row masked so far keeps a max of -inf: 0 stands in so no inf - inf appears.
      const float base = m == -INFINITY ? 0.f : m;
      const float scaled_max = scale_log2 * base;
      float sum = 0.f;
      CUTLASS_PRAGMA_UNROLL
      for (int j = 0; j < size<1>(s); j++) {
        s(i, j) = ::exp2f(scale_log2 * s(i, j) - scaled_max);
        sum += s(i, j);
      }
      factor(i) = ::exp2f((old_max - base) * scale_log2);
      row_sum(i) = row_sum(i) * factor(i) + sum;
    }
    return factor;
  }

  // examples/88's consumer loop with FlashAttention-3's in-warp-group pipelining: key block j's
  // Q·Kᵀ and block j-1's P·V are issued together, and block j's softmax runs while the tensor
  // cores still work on P·V; the output is rescaled once that product is done. examples/88 waits
  // for both products before each softmax, so its tensor cores idle while a warp group computes
  // exponentials (the other warp group's products fill part of that). Pipeline stages are given
  // back in the producer's order (K0, V0, K1, V1, ...), two per key block as there; K of block j
  // is waited on before V of block j-1, which the producer filled first, so that wait is short.
  template <class BlkCoord, class ProblemShape, class ReducerPipeline, class ReducerState, class OrderBarrier>
  CUTLASS_DEVICE auto overlapped(BlkCoord const& blk_coord, BlkCoord const& wg_coord, typename Base::Params const& params,
                                 ProblemShape const& problem_size, typename Base::MainloopPipeline& pipeline,
                                 typename Base::PipelineState& smem_pipe_read,
                                 typename Base::MainloopPipelineQ& pipeline_q,
                                 typename Base::PipelineStateQ& smem_pipe_read_q, ReducerPipeline&, ReducerState&,
                                 typename Base::SharedStorage& storage, OrderBarrier& math_wg_order_barrier) {
    // Built for the persistent grid only (the space refuses it elsewhere), whose CTAs give back
    // the last stages of a tile for the next one.
    static_assert(Base::kIsPersistent, "sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen: the overlapped loop needs the persistent grid");
    using namespace cutlass::fmha::collective;
    using TileShapeQK = typename Base::TileShapeQK;
    using TileShapePV = typename Base::TileShapePV;
    using TiledMmaPV = typename Base::TiledMmaPV;
    using Fusion = CausalLengthFusion;
    const int thread_idx = int(threadIdx.x);
    typename Base::PipelineState smem_pipe_release = smem_pipe_read;
    typename Base::PipelineStateQ smem_pipe_release_q = smem_pipe_read_q;

    typename Base::TiledMmaQK tiled_mma_qk;
    auto thr_mma_qk = tiled_mma_qk.get_thread_slice(thread_idx);
    Tensor sQ = make_tensor(make_smem_ptr(storage.smem_q.data()), typename Base::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(storage.smem_k.data()), typename Base::SmemLayoutK{});
    Tensor tSrQ = thr_mma_qk.make_fragment_A(thr_mma_qk.partition_A(sQ));
    Tensor tSrK = thr_mma_qk.make_fragment_B(thr_mma_qk.partition_B(sK));
    TiledMmaPV tiled_mma_pv;
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(thread_idx);
    Tensor sV = make_tensor(make_smem_ptr(storage.smem_v.data()), typename Base::SmemLayoutV{});
    Tensor tOrV = thr_mma_pv.make_fragment_B(thr_mma_pv.partition_B(sV));

    const int trips = Fusion{}.get_trip_count(blk_coord, typename Base::TileShape{}, problem_size);
    // Blocks from here on need the mask (examples/88 masks the first block too).
    const int first_masked = Fusion{}.get_unmasked_trip_count(blk_coord, typename Base::TileShape{}, problem_size);

    pipeline_q.consumer_wait(smem_pipe_read_q);
    Tensor cP = make_identity_tensor(take<0, 2>(TileShapeQK{}));
    Tensor tPcP = thr_mma_qk.partition_C(cP);
    tPcP.data() = tPcP.data() + E<0>{} * get<0>(wg_coord) * get<0>(TileShapeQK{});

    Tensor acc_pv = partition_fragment_C(tiled_mma_pv, take<0, 2>(TileShapePV{}));
    CollectiveSoftmax<typename Base::ElementAccumulatorQK, Fusion, typename Base::Params> softmax{params};
    auto state = softmax.init(acc_pv, tiled_mma_pv);

    // Block 0: its scores start the running max and sum.
    Tensor acc_qk = partition_fragment_C(tiled_mma_qk, take<0, 2>(TileShapeQK{}));
    pipeline.consumer_wait(smem_pipe_read);
    math_wg_order_barrier.wait();
    warpgroup_fence_operand(acc_qk);
    warpgroup_arrive();
    gemm_zero_acc(tiled_mma_qk, tSrQ(_, _, _, smem_pipe_read_q.index()), tSrK(_, _, _, smem_pipe_read.index()), acc_qk);
    warpgroup_commit_batch();
    math_wg_order_barrier.arrive();
    ++smem_pipe_read;
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_qk);
    softmax.step(acc_qk, tiled_mma_qk, tPcP, state, problem_size);
    pipeline.consumer_release(smem_pipe_release);  // K0
    ++smem_pipe_release;
    Tensor p = make_acc_into_op<typename Base::Element>(acc_qk, typename TiledMmaPV::LayoutA_TV{});
    typename Base::PipelineState v_read = smem_pipe_read;  // V of the block whose P is in p
    ++smem_pipe_read;

    CUTLASS_PRAGMA_NO_UNROLL
    for (int j = 1; j < trips; ++j) {
      tPcP.data() = tPcP.data() + E<1>{} * get<1>(TileShapeQK{});
      Tensor acc_s = partition_fragment_C(tiled_mma_qk, take<0, 2>(TileShapeQK{}));
      pipeline.consumer_wait(smem_pipe_read);
      warpgroup_fence_operand(acc_s);
      warpgroup_arrive();
      gemm_zero_acc(tiled_mma_qk, tSrQ(_, _, _, smem_pipe_read_q.index()), tSrK(_, _, _, smem_pipe_read.index()), acc_s);
      warpgroup_commit_batch();

      pipeline.consumer_wait(v_read);
      warpgroup_fence_operand(acc_pv);
      warpgroup_fence_operand(p);
      warpgroup_arrive();
      if (j == 1) {
        gemm_zero_acc(tiled_mma_pv, p, tOrV(_, _, _, v_read.index()), acc_pv);
      } else {
        cute::gemm(tiled_mma_pv, p, tOrV(_, _, _, v_read.index()), acc_pv);
      }
      warpgroup_commit_batch();

      // The scores are in; P·V still runs.
      warpgroup_wait<1>();
      warpgroup_fence_operand(acc_s);
      if (j >= first_masked) Fusion{}.before_softmax(acc_s, tPcP, problem_size);
      auto factor = softmax_scores(acc_s, state, params.scale_softmax_log2);

      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_pv);
      pipeline.consumer_release(smem_pipe_release);  // V of block j-1
      ++smem_pipe_release;
      pipeline.consumer_release(smem_pipe_release);  // K of block j
      ++smem_pipe_release;
      Tensor o = make_tensor(acc_pv.data(), layout_acc_mn(tiled_mma_pv, acc_pv.layout()));
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size<0>(o); i++) {
        CUTLASS_PRAGMA_UNROLL
        for (int k = 0; k < size<1>(o); k++) o(i, k) *= factor(i);
      }
      p = make_acc_into_op<typename Base::Element>(acc_s, typename TiledMmaPV::LayoutA_TV{});
      ++smem_pipe_read;
      v_read = smem_pipe_read;
      ++smem_pipe_read;
    }

    // The last block's P·V.
    pipeline.consumer_wait(v_read);
    warpgroup_fence_operand(acc_pv);
    warpgroup_fence_operand(p);
    warpgroup_arrive();
    if (trips == 1) {
      gemm_zero_acc(tiled_mma_pv, p, tOrV(_, _, _, v_read.index()), acc_pv);
    } else {
      cute::gemm(tiled_mma_pv, p, tOrV(_, _, _, v_read.index()), acc_pv);
    }
    warpgroup_commit_batch();
    pipeline_q.consumer_release(smem_pipe_release_q);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_pv);
    pipeline.consumer_release(smem_pipe_release);

    Tensor lse = softmax.tail(state, acc_pv, tiled_mma_pv);
    return make_tuple(acc_pv, lse);
  }
};

template <class K>
struct WithScaledMainloop;
template <class Mainloop, class Epilogue, class Scheduler, class... Options>
struct WithScaledMainloop<cutlass::fmha::kernel::FmhaKernelTmaWarpSpecialized<Mainloop, Epilogue, Scheduler, Options...>> {
  using mainloop = ScaledMainloop<Mainloop>;
  using type = cutlass::fmha::kernel::FmhaKernelTmaWarpSpecialized<mainloop, Epilogue, PairedTileScheduler, Options...>;
};
using Kernel = typename WithScaledMainloop<Built>::type;
using Mainloop = typename WithScaledMainloop<Built>::mainloop;

// The largest dynamic shared memory an sm90 CTA may opt into.
static_assert(Kernel::SharedStorageSize <= 232448, "sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen: the tile's pipeline stages do not fit in shared memory");

constexpr int64_t kAlign = 16 / sizeof(Element);
constexpr bool kCausal = true;
constexpr bool kKeyLengths = true;

bool fits_i32(int64_t v) { return v >= 0 && v <= INT32_MAX; }

// The stride of dim `i` as TMA takes it: a multiple of 16 bytes that fits the kernel's int strides;
// a dim of size 1 is never stepped, so any such value stands for its stride. -1 when it does not fit.
int64_t tma_stride(const FactTensor& t, int i) {
  if (t.sizes[i] == 1) return kAlign;
  const int64_t s = t.strides[i];
  return (s % kAlign == 0 && s > 0 && fits_i32(s)) ? s : -1;
}

// The kernel's arguments for a call, or false when the call does not fit: shapes, dtypes, the
// mask the kernel was built for, strides and alignments TMA takes, and CUTLASS's own check.
bool make_arguments(const FactOpArgs* a, void* workspace, typename Kernel::Arguments& args) {
  // The seventh tensor is a key-length kernel's mask, beside the lengths (a bias is
  // sm80_fmha's alone).
  if (a == nullptr || a->num_tensors != 7 || a->num_scalars != 3) return false;
  const float* factor = nullptr;
  const FactTensor& f = a->tensors[4];
  if (f.data != nullptr) {
    int64_t n = 1;
    for (int i = 0; i < f.rank; ++i) n *= f.sizes[i];
    if (f.dtype != FACT_F32 || n != 1 || (a->scalars[2] != 1.0 && a->scalars[2] != -1.0)) return false;
    factor = static_cast<const float*>(f.data);
  }
  // The softmax subtracts the row maximum of the unscaled scores, which is the maximum of the
  // scaled ones only for a scale that is not negative.
  if (!(a->scalars[0] >= 0.0) || !std::isfinite(a->scalars[0])) return false;
  if ((a->scalars[1] != 0.0) != kCausal) return false;
  const FactTensor& q = a->tensors[0];
  const FactTensor& k = a->tensors[1];
  const FactTensor& v = a->tensors[2];
  const FactTensor& o = a->tensors[3];
  for (const FactTensor* t : {&q, &k, &v, &o}) {
    if (t->rank != 4 || t->dtype != 1 || t->strides[3] != 1) return false;
    if (reinterpret_cast<uintptr_t>(t->data) % 16 != 0) return false;
  }
  const int64_t B = q.sizes[0], H = q.sizes[1], Tq = q.sizes[2], D = q.sizes[3], Tk = k.sizes[2], Hkv = k.sizes[1];
  if (B <= 0 || H <= 0 || Hkv <= 0 || Tq <= 0 || Tk <= 0 || D <= 0) return false;
  // Grouped heads: the persistent schedules load q on a warp of its own and k/v from head h / group;
  // the one-CTA-per-tile schedule loads both from one coordinate.
  if (H % Hkv != 0 || (Hkv != H && !Kernel::kLoadsQSeparately)) return false;
  const FactTensor& len = a->tensors[5];
  const FactTensor& m = a->tensors[6];
  const int32_t* lengths = nullptr;
  int mask_kind = 0;
  int64_t mask_strides[3] = {0, 0, 0};
  // A key-length kernel takes the lengths, the mask or both; another kernel neither.
  if (kKeyLengths ? (len.data == nullptr && m.data == nullptr) : (len.data != nullptr || m.data != nullptr)) return false;
  if (len.data != nullptr) {
    if (len.rank != 1 || len.dtype != FACT_I32 || len.sizes[0] != B || (B > 1 && len.strides[0] != 1)) return false;
    if (reinterpret_cast<uintptr_t>(len.data) % sizeof(int32_t) != 0) return false;
    lengths = static_cast<const int32_t*>(len.data);
  }
  if (m.data != nullptr) {
    // The causal fusion would mask on top of a mask that need not be causal.
    if (kCausal) return false;
    if (m.rank != 4 || m.sizes[0] != B || m.sizes[1] != H || m.sizes[2] != Tq || m.sizes[3] != Tk) return false;
    if (Tk > 1 && m.strides[3] != 1) return false;
    mask_kind = m.dtype == FACT_BOOL ? 1 : m.dtype == 1 ? 2 : 0;
    // An added mask goes onto the unscaled scores divided by the scale: a positive one known here.
    if (mask_kind == 0 || (mask_kind == 2 && (f.data != nullptr || !(a->scalars[0] > 0.0)))) return false;
    if (mask_kind == 2 && reinterpret_cast<uintptr_t>(m.data) % sizeof(Element) != 0) return false;
    for (int i = 0; i < 3; ++i) {
      if (m.strides[i] < 0) return false;
      mask_strides[i] = m.sizes[i] == 1 ? 0 : m.strides[i];
    }
  }
  // The one-CTA-per-tile grid is (query blocks, B, H).
  if (B > 65535 || H > 65535) return false;
  // The persistent grid numbers its tiles B·H·(query blocks) as int.
  if (!fits_i32(B) || !fits_i32(H) || !fits_i32(Tq) || !fits_i32(Tk) || !fits_i32(B * H * Tq)) return false;
  if (k.sizes[0] != B || k.sizes[3] != D) return false;
  for (int i = 0; i < 4; ++i) {
    if (v.sizes[i] != k.sizes[i] || o.sizes[i] != q.sizes[i]) return false;
  }
  // CausalFusion masks key j > query i only: with Tq > Tk a late query would also see the zeros
  // TMA loads past Tk.
  if (kCausal && Tq > Tk) return false;
  StrideQKVO strides[4];
  const FactTensor* ts[4] = {&q, &k, &v, &o};
  for (int t = 0; t < 4; ++t) {
    const int64_t sb = tma_stride(*ts[t], 0), sh = tma_stride(*ts[t], 1), st = tma_stride(*ts[t], 2);
    if (sb < 0 || sh < 0 || st < 0) return false;
    strides[t] = make_stride(static_cast<int>(st), _1{}, make_stride(static_cast<int>(sb), static_cast<int>(sh)));
  }
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count();
  const int b = static_cast<int>(B), h = static_cast<int>(H), tq = static_cast<int>(Tq);
  typename Mainloop::Arguments mainloop{};
  mainloop.ptr_Q = static_cast<const Element*>(q.data);
  mainloop.dQ = strides[0];
  mainloop.ptr_K = static_cast<const Element*>(k.data);
  mainloop.dK = strides[1];
  mainloop.ptr_V = static_cast<const Element*>(v.data);
  mainloop.dV = strides[2];
  mainloop.scale = static_cast<float>(a->scalars[0]);
  mainloop.factor = factor;
  mainloop.power = a->scalars[2] > 0 ? 1 : -1;
  mainloop.lengths = lengths;
  mainloop.group = static_cast<int>(H / Hkv);
  mainloop.mask = m.data;
  mainloop.mask_kind = mask_kind;
  mainloop.mask_b = mask_strides[0];
  mainloop.mask_h = mask_strides[1];
  mainloop.mask_q = mask_strides[2];
  args = typename Kernel::Arguments{
      {b, h, tq, static_cast<int>(Tk), static_cast<int>(D)},
      mainloop,
      {static_cast<Element*>(o.data), strides[3], static_cast<float*>(workspace), make_stride(_1{}, make_stride(h * tq, tq))},
      hw};
  return Kernel::can_implement(args);
}

// The log-sum-exp rows the epilogue writes: fp32 [B,H,Tq].
size_t lse_bytes(const FactOpArgs* a) {
  const FactTensor& q = a->tensors[0];
  return static_cast<size_t>(q.sizes[0] * q.sizes[1] * q.sizes[2]) * sizeof(float);
}

}  // namespace fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen_can_implement(const FactOpArgs* a, const FactKnobs*) {
  typename fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::Kernel::Arguments args;
  return fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::make_arguments(a, nullptr, args) ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen_workspace_size(const FactOpArgs* a, const FactKnobs*) {
  typename fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::Kernel::Arguments args;
  if (!fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::make_arguments(a, nullptr, args)) return 0;
  return fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::lse_bytes(a);
}

extern "C" __attribute__((weak)) int32_t fact_k_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen_run(const FactOpArgs* a, const FactKnobs*, void* workspace,
                                                             size_t workspace_size, void* stream) {
  using Kernel = fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::Kernel;
  typename Kernel::Arguments args;
  if (!fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::make_arguments(a, workspace, args)) return FACT_CANNOT_IMPLEMENT;
  if (workspace == nullptr || workspace_size < fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::lse_bytes(a)) return FACT_WORKSPACE_TOO_SMALL;
  // The arguments are a function of the call and the workspace alone: kept per call.
  fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::CallKey key;
  const typename Kernel::Params params = fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::kept_params<Kernel>(
      fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::key_of(a, nullptr, workspace, key), [&] { return Kernel::to_underlying_arguments(args, workspace); });
  constexpr auto kernel = cutlass::device_kernel<Kernel>;
  constexpr int smem = Kernel::SharedStorageSize;
  if (!fact_sm90_fmha_bf16_bf16_q128_k128_d128_pair_ovl_causal_klen::smem_opt_in<Kernel>(reinterpret_cast<const void*>(kernel), smem)) return FACT_INIT_FAILED;
  kernel<<<Kernel::get_grid_shape(params), Kernel::get_block_shape(), smem, static_cast<cudaStream_t>(stream)>>>(params);
  return FACT_OK;
}
