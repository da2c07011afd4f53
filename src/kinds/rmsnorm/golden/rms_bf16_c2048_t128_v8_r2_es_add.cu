// generated from src/kinds/rmsnorm/rmsnorm.cu.hbs; do not edit
// spec: {"arch":"sm90","dtype":"bf16","cols":2048,"threads":128,"vector":8,"rows_per_block":2,"add":{"a":"bf16","b":"bf16","sum":"bf16"},"reads":"early_streamed"}
// rms_bf16_c2048_t128_v8_r2_es_add: RMSNorm over rows of 2048 bf16 elements with fp32 statistics,
// y = x / sqrt(mean(x^2) + eps) * s, s nothing, the weight or 1 + weight; where the graph rounds
// the normalized value to bf16 before the weight multiplies it (Llama), so does the kernel.
// 128 thread(s) own a row, each holding 2 load(s) of 8 elements in registers,
// 2 row(s) per CTA: one read of x, one reduction over the registers, one write of y.
// x is the sum of the residual add before the norm: s = a + b in fp32 rounded to bf16 (each
// operand first rounded to bf16, as the graph's casts and type promotion do), then x = s as
// bf16; the kernel writes s too where the caller asks.
// Tensors (FactOpArgs): a [O,I,C] (bf16) and b [O,I,C] (bf16), row r of each at
// (r / I) * stride0 + (r % I) * stride1 (a broadcast operand repeats its rows: stride 0), sum [R,C]
// (bf16; data NULL when not written) and out [R,C] rows a stride apart, unit stride along C,
// weight [C] (data NULL when absent); every tensor aligned to its access of a vector (16 bytes at
// most) and its row strides a multiple of it; scalars: eps, the scale (0 none, 1 weight, 2 one plus
// weight), whether to round before the weight (0 or 1).
#include "fact_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <type_traits>

// Internal linkage: a unit may hold a kernel that another object linked beside it holds too
// (a sweep's unit next to the same kernel built alone); only the weak entry points are shared.
namespace {
namespace fact_rms_bf16_c2048_t128_v8_r2_es_add {

using Element = __nv_bfloat16;
// One load: 8 elements.
using Vec = uint4;
constexpr int kDtype = 1;
constexpr int kCols = 2048;
constexpr int kThreads = 128;
constexpr int kVector = 8;
constexpr int kRows = 2;
constexpr int kSpan = kThreads * kVector;
constexpr int kLoads = (kCols + kSpan - 1) / kSpan;
// Whether the last load leaves some of the group's threads past C.
constexpr bool kRagged = kCols % kSpan != 0;
constexpr int kBlock = kThreads * kRows;
// Warps that share a row (0 when a row's group is part of one warp).
constexpr int kWarps = kThreads / 32;
static_assert(sizeof(Vec) == kVector * sizeof(Element), "a load is one vector");
static_assert(kCols % kVector == 0 && kBlock % 32 == 0 && kBlock <= 1024, "checked by RmsNormSpec::invalid_reason");

enum Scale { kNone = 0, kWeight = 1, kWeightPlusOne = 2 };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ void from_float(float v, float& out) { out = v; }
__device__ __forceinline__ void from_float(float v, __nv_bfloat16& out) { out = __float2bfloat16_rn(v); }
__device__ __forceinline__ void from_float(float v, __half& out) { out = __float2half_rn(v); }
// v rounded to the element type and back: the graph's cast to the dtype before the weight.
__device__ __forceinline__ float round_trip(float v) {
  Element e;
  from_float(v, e);
  return to_float(e);
}

__device__ __forceinline__ void load(const Element* p, float (&v)[kVector]) {
  const Vec raw = __ldg(reinterpret_cast<const Vec*>(p));
  const Element* e = reinterpret_cast<const Element*>(&raw);
#pragma unroll
  for (int k = 0; k < kVector; ++k) v[k] = to_float(e[k]);
}

__device__ __forceinline__ void store(Element* p, const float (&v)[kVector]) {
  Vec raw;
  Element* e = reinterpret_cast<Element*>(&raw);
#pragma unroll
  for (int k = 0; k < kVector; ++k) from_float(v[k], e[k]);
  *reinterpret_cast<Vec*>(p) = raw;
}

using ElementA = __nv_bfloat16;
using ElementB = __nv_bfloat16;
using ElementS = __nv_bfloat16;
constexpr int kDtypeA = 1;
constexpr int kDtypeB = 1;
constexpr int kDtypeS = 1;

// One vector of T in accesses of at most 16 bytes: an fp32 operand of a bf16 norm takes two.
template <int kBytes> struct Access;
template <> struct Access<16> { using Type = uint4; };
template <> struct Access<8> { using Type = uint2; };
template <> struct Access<4> { using Type = unsigned int; };
template <> struct Access<2> { using Type = unsigned short; };
template <typename T>
constexpr int access_bytes() { return kVector * sizeof(T) < 16 ? kVector * static_cast<int>(sizeof(T)) : 16; }

template <typename T>
__device__ __forceinline__ void load_as(const T* p, float (&v)[kVector]) {
  constexpr int kPer = access_bytes<T>() / sizeof(T);
  using A = typename Access<access_bytes<T>()>::Type;
#pragma unroll
  for (int c = 0; c < kVector / kPer; ++c) {
    // Read once, the operands stream past L1 and L2 (evict-first).
    const A raw = __ldcs(reinterpret_cast<const A*>(p) + c);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[c * kPer + k] = to_float(e[k]);
  }
}

template <typename T>
__device__ __forceinline__ void store_as(T* p, const float (&v)[kVector]) {
  constexpr int kPer = access_bytes<T>() / sizeof(T);
  using A = typename Access<access_bytes<T>()>::Type;
#pragma unroll
  for (int c = 0; c < kVector / kPer; ++c) {
    A raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int k = 0; k < kPer; ++k) from_float(v[c * kPer + k], e[k]);
    reinterpret_cast<A*>(p)[c] = raw;
  }
}

// v as the graph's cast from F to T gives it back in fp32: rounded where T is narrower, exact
// where it is as wide or wider (and no instruction where F is T).
template <typename F, typename T>
__device__ __forceinline__ float cast(float v) {
  if constexpr (std::is_same<F, T>::value || std::is_same<T, float>::value) {
    return v;
  } else {
    T e;
    from_float(v, e);
    return to_float(e);
  }
}

// An operand's rows: row r starts at (r / inner) * outer + (r % inner) * stride elements.
struct Rows {
  int64_t inner, outer, stride;
};
__device__ __forceinline__ int64_t row_at(const Rows& t, int64_t r) { return (r / t.inner) * t.outer + (r % t.inner) * t.stride; }

// Row r's start as row_at gives it, without its 64-bit division: an operand that is one run of
// rows (its outer stride inner · stride, or r in its first block) steps by its stride; otherwise
// a 32-bit division where r and inner fit.
__device__ __forceinline__ int64_t row_at_early(const Rows& t, int64_t r) {
  if (r < t.inner || t.outer == t.inner * t.stride) return r * t.stride;
  if (r <= INT32_MAX && t.inner <= INT32_MAX) {
    const uint32_t q = static_cast<uint32_t>(r) / static_cast<uint32_t>(t.inner);
    return q * t.outer + (r - static_cast<int64_t>(q) * t.inner) * t.stride;
  }
  return row_at(t, r);
}

// Whether load i of thread `lane` lies inside the row.
__device__ __forceinline__ bool inside(int i, int lane) { return !kRagged || (i * kThreads + lane) * kVector < kCols; }

// The sum of v over the row's group, in every thread of it: xor shuffles within the warp (a group
// smaller than a warp is aligned in it, so offsets below its size stay inside), then one partial
// per warp through shared memory, added in warp order by each thread.
__device__ __forceinline__ float group_sum(float v, float* partial) {
#pragma unroll
  for (int o = (kThreads < 32 ? kThreads : 32) / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if constexpr (kWarps > 1) {
    const int group = threadIdx.x / kThreads;
    if (threadIdx.x % 32 == 0) partial[group * kWarps + (threadIdx.x % kThreads) / 32] = v;
    __syncthreads();
    v = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += partial[group * kWarps + w];
  }
  return v;
}

template <int kScale, bool kCastFirst>
__global__ void __launch_bounds__(kBlock)
    rmsnorm(const ElementA* __restrict__ a, Rows a_rows, const ElementB* __restrict__ b, Rows b_rows,
            ElementS* __restrict__ sum_out, int64_t sum_stride, Element* __restrict__ out, int64_t out_stride,
            const Element* __restrict__ weight, int64_t rows, float eps) {
  __shared__ float partial[kWarps > 1 ? kRows * kWarps : 1];
  const int lane = threadIdx.x % kThreads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x / kThreads;
  // A group past the last row computes on zeros and writes nothing, so every thread reaches the
  // warp's shuffles and the CTA's barrier.
  const bool live = row < rows;
  const ElementA* ar = a + row_at_early(a_rows, live ? row : 0);
  const ElementB* br = b + row_at_early(b_rows, live ? row : 0);
  ElementS* sr = live && sum_out != nullptr ? sum_out + row * sum_stride : nullptr;
  // Every load the row needs issues before any arithmetic, store or reduction: its operands, then
  // the weight, whose latency so hides under theirs.
  float va[kLoads][kVector], vb[kLoads][kVector];
  float v[kLoads][kVector], wr[kLoads][kVector];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int col = (i * kThreads + lane) * kVector;
    if (live && inside(i, lane)) {
      load_as(ar + col, va[i]);
      load_as(br + col, vb[i]);
    }
  }
  if constexpr (kScale != kNone) {
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      if (inside(i, lane)) load(weight + (i * kThreads + lane) * kVector, wr[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    if (live && inside(i, lane)) {
      // s rounded as the graph's add rounds, written where asked; x is s as the norm's dtype.
      float s[kVector];
#pragma unroll
      for (int k = 0; k < kVector; ++k) {
        s[k] = cast<float, ElementS>(cast<ElementA, ElementS>(va[i][k]) + cast<ElementB, ElementS>(vb[i][k]));
        v[i][k] = cast<ElementS, Element>(s[k]);
      }
      if (sr != nullptr) store_as(sr + (i * kThreads + lane) * kVector, s);
    } else {
#pragma unroll
      for (int k = 0; k < kVector; ++k) v[i][k] = 0.f;
    }
  }
  float squares = 0.f;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
#pragma unroll
    for (int k = 0; k < kVector; ++k) squares += v[i][k] * v[i][k];
  }
  const float rstd = rsqrtf(group_sum(squares, partial) / static_cast<float>(kCols) + eps);
  if (!live) return;
  Element* yr = out + row * out_stride;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    if (!inside(i, lane)) continue;
    const int col = (i * kThreads + lane) * kVector;
    const float(&w)[kVector] = wr[i];
    float y[kVector];
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      y[k] = v[i][k] * rstd;
      if constexpr (kCastFirst) y[k] = round_trip(y[k]);
      if constexpr (kScale == kWeight) y[k] *= w[k];
      if constexpr (kScale == kWeightPlusOne) y[k] *= 1.f + w[k];
    }
    store(yr + col, y);
  }
}

inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % sizeof(Vec) == 0; }

// Whether tensor t of dtype `dtype` (T's) holds R rows of C as its signature says: rank `rank`
// (3: [O,I,C] through two row strides; 2: [R,C]), unit stride along C, data and row strides
// aligned to T's access of a vector.
template <typename T>
bool rows_fit(const FactTensor& t, int dtype, int rank, int64_t rows) {
  constexpr int kAccess = access_bytes<T>();
  constexpr int64_t kElems = kAccess / sizeof(T);
  if (t.rank != rank || t.dtype != dtype || t.data == nullptr || reinterpret_cast<uintptr_t>(t.data) % kAccess != 0) return false;
  if (t.sizes[rank - 1] != kCols || t.strides[rank - 1] != 1) return false;
  int64_t n = 1;
  for (int d = 0; d < rank - 1; ++d) {
    if (t.sizes[d] < 1) return false;
    if (t.sizes[d] > 1 && (t.strides[d] < 0 || t.strides[d] % kElems != 0)) return false;
    n *= t.sizes[d];
  }
  return n == rows;
}

// The rows of an operand [O,I,C] (its signature's two row strides; a stride of a dim of size one is
// never stepped along).
inline Rows rows_of_operand(const FactTensor& t) {
  return Rows{t.sizes[1], t.sizes[0] > 1 ? t.strides[0] : 0, t.sizes[1] > 1 ? t.strides[1] : 0};
}

// The call's row count, or -1 when the kernel cannot take it: shapes, dtypes, strides, alignment
// and flags as the header says, and a grid the launch can hold. Host helpers are inline (weak), as
// the entry points are.
inline int64_t rows_of(const FactOpArgs* a) {
  if (a == nullptr || a->num_tensors != 5 || a->num_scalars != 3) return -1;
  const FactTensor& o = a->tensors[3];
  const FactTensor& s = a->tensors[2];
  const FactTensor& w = a->tensors[4];
  const int64_t rows = o.rank == 2 ? o.sizes[0] : -1;
  if (rows < 1 || (rows + kRows - 1) / kRows > INT32_MAX) return -1;
  if (!rows_fit<Element>(o, kDtype, 2, rows) || (rows > 1 && o.strides[0] < kCols)) return -1;
  if (!rows_fit<ElementA>(a->tensors[0], kDtypeA, 3, rows) || !rows_fit<ElementB>(a->tensors[1], kDtypeB, 3, rows)) return -1;
  // The sum's rows must not overlap, nor y's (the operands' may: a broadcast row is read, never written).
  if (s.data != nullptr && (!rows_fit<ElementS>(s, kDtypeS, 2, rows) || (rows > 1 && s.strides[0] < kCols))) return -1;
  const double scale = a->scalars[1], cast_first = a->scalars[2];
  if (scale != kNone && scale != kWeight && scale != kWeightPlusOne) return -1;
  if (cast_first != 0 && !(cast_first == 1 && scale == kWeight)) return -1;
  if ((scale == kNone) != (w.data == nullptr)) return -1;
  if (w.data != nullptr &&
      (w.rank != 1 || w.dtype != kDtype || w.sizes[0] != kCols || w.strides[0] != 1 || !aligned(w.data))) {
    return -1;
  }
  return rows;
}

}  // namespace fact_rms_bf16_c2048_t128_v8_r2_es_add
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_rms_bf16_c2048_t128_v8_r2_es_add_can_implement(const FactOpArgs* a, const FactKnobs*) {
  return fact_rms_bf16_c2048_t128_v8_r2_es_add::rows_of(a) >= 0 ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_rms_bf16_c2048_t128_v8_r2_es_add_workspace_size(const FactOpArgs*, const FactKnobs*) { return 0; }

extern "C" __attribute__((weak)) int32_t fact_k_rms_bf16_c2048_t128_v8_r2_es_add_run(const FactOpArgs* a, const FactKnobs*, void*, size_t,
                                                             void* stream) {
  using namespace fact_rms_bf16_c2048_t128_v8_r2_es_add;
  const int64_t rows = rows_of(a);
  if (rows < 0) return FACT_CANNOT_IMPLEMENT;
  const ElementA* ta = static_cast<const ElementA*>(a->tensors[0].data);
  const ElementB* tb = static_cast<const ElementB*>(a->tensors[1].data);
  ElementS* sum = static_cast<ElementS*>(a->tensors[2].data);
  Element* out = static_cast<Element*>(a->tensors[3].data);
  const Element* weight = static_cast<const Element*>(a->tensors[4].data);
  const Rows ra = rows_of_operand(a->tensors[0]), rb = rows_of_operand(a->tensors[1]);
  const int64_t ss = sum != nullptr ? a->tensors[2].strides[0] : 0, os = a->tensors[3].strides[0];
  const float eps = static_cast<float>(a->scalars[0]);
  const int scale = static_cast<int>(a->scalars[1]);
  const bool cast_first = a->scalars[2] != 0;
  const dim3 grid(static_cast<unsigned>((rows + kRows - 1) / kRows));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (scale == kWeight && cast_first) {
    rmsnorm<kWeight, true><<<grid, kBlock, 0, s>>>(ta, ra, tb, rb, sum, ss, out, os, weight, rows, eps);
  } else if (scale == kWeight) {
    rmsnorm<kWeight, false><<<grid, kBlock, 0, s>>>(ta, ra, tb, rb, sum, ss, out, os, weight, rows, eps);
  } else if (scale == kWeightPlusOne) {
    rmsnorm<kWeightPlusOne, false><<<grid, kBlock, 0, s>>>(ta, ra, tb, rb, sum, ss, out, os, weight, rows, eps);
  } else {
    rmsnorm<kNone, false><<<grid, kBlock, 0, s>>>(ta, ra, tb, rb, sum, ss, out, os, weight, rows, eps);
  }
  return FACT_OK;
}
