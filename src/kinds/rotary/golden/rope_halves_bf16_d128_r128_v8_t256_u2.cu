// generated from src/kinds/rotary/rotary.cu.hbs; do not edit
// spec: {"arch":"sm90","dtype":"bf16","form":"halves","head_dim":128,"rotary_dim":128,"vector":8,"block":256,"per_thread":2}
// rope_halves_bf16_d128_r128_v8_t256_u2: rotary embedding (halves) of heads of 128 bf16 elements, the first 128
// rotated, the rest passed through: y[j] = x[j]*cos[j] + rot(x)[j]*sin[j] for j < 128, each product and
// the sum rounded to bf16 as the graph's mul, mul and add round, with
// rot(x)[j] = -x[j+64] for j < 64, x[j-64] above.
// One thread writes 8 elements of a head (2 such per thread, 256 threads per CTA);
// q's heads and k's in one grid, each read and written once through its strides.
// Tensors (FactOpArgs), each [N0,N1,N2,last] with unit stride along the last dim, the other strides
// multiples of the vector (0 for a broadcast dim), the data aligned to a vector, all of the kernel's
// dtype: q [..,128], k [..,128] (data NULL for q alone), cos and sin as q reads them
// [..,128], cos and sin as k reads them, out_q and out_k [..,128] (rows not overlapping). No
// scalars.
#include "fact_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

// Internal linkage: a unit may hold a kernel that another object linked beside it holds too
// (a sweep's unit next to the same kernel built alone); only the weak entry points are shared.
namespace {
namespace fact_rope_halves_bf16_d128_r128_v8_t256_u2 {

using Element = __nv_bfloat16;
// One access: 8 elements.
using Vec = uint4;
constexpr int kDtype = 1;
constexpr int kHeadDim = 128;
constexpr int kRotary = 128;
constexpr int kVector = 8;
constexpr int kBlock = 256;
constexpr int kPerThread = 2;
constexpr bool kPairs = false;
// Vectors per head: the unit of work.
constexpr int kUnits = kHeadDim / kVector;
static_assert(sizeof(Vec) == kVector * sizeof(Element), "an access is one vector");
static_assert(kHeadDim % kVector == 0 && kRotary % kVector == 0 && (kPairs ? kVector % 2 == 0 : (kRotary / 2) % kVector == 0),
              "checked by RotarySpec::invalid_reason");

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ void from_float(float v, float& out) { out = v; }
__device__ __forceinline__ void from_float(float v, __nv_bfloat16& out) { out = __float2bfloat16_rn(v); }
__device__ __forceinline__ void from_float(float v, __half& out) { out = __float2half_rn(v); }
// v rounded to the dtype, as a torch op on tensors of it returns it.
__device__ __forceinline__ float round_dt(float v) {
  Element e;
  from_float(v, e);
  return to_float(e);
}

__device__ __forceinline__ void load(const Element* p, float (&v)[kVector]) {
  const Vec raw = __ldg(reinterpret_cast<const Vec*>(p));
  const Element* e = reinterpret_cast<const Element*>(&raw);
#pragma unroll
  for (int i = 0; i < kVector; ++i) v[i] = to_float(e[i]);
}

__device__ __forceinline__ void store(Element* p, const float (&v)[kVector]) {
  Vec raw;
  Element* e = reinterpret_cast<Element*>(&raw);
#pragma unroll
  for (int i = 0; i < kVector; ++i) from_float(v[i], e[i]);
  *reinterpret_cast<Vec*>(p) = raw;
}

// Division of 32-bit numbers by a size known at launch without a divide instruction, a multiply-high
// and a shift (Granlund and Montgomery's round-up method, exact for every 32-bit n): each unit
// splits its row into three indices, and two divides would cost as much as its arithmetic.
struct Divisor {
  uint32_t d, m, l;
};

inline Divisor divisor(uint32_t d) {
  uint32_t l = 0;
  while ((uint64_t{1} << l) < d) ++l;
  const uint64_t m = ((uint64_t{1} << 32) * ((uint64_t{1} << l) - d)) / d + 1;
  return {d, static_cast<uint32_t>(m), l};
}

__device__ __forceinline__ uint32_t divide(uint32_t n, const Divisor& v) {
  return static_cast<uint32_t>((static_cast<uint64_t>(__umulhi(n, v.m)) + n) >> v.l);
}

// One tensor's rotation: its rows (one head of one position) as [N0,N1,N2] with the strides of
// x, cos, sin and out along them.
struct Side {
  const Element* x;
  const Element* cos;
  const Element* sin;
  Element* out;
  Divisor n1, n2;
  int64_t xs[3], cs[3], ss[3], os[3];
};

// Vector `u` of row `row` of one side.
__device__ __forceinline__ void unit(const Side& s, uint32_t row, int u) {
  const uint32_t rest = divide(row, s.n2), i2 = row - rest * s.n2.d;
  const uint32_t i0 = divide(rest, s.n1), i1 = rest - i0 * s.n1.d;
  const int col = u * kVector;
  const Element* x = s.x + i0 * s.xs[0] + i1 * s.xs[1] + i2 * s.xs[2];
  Element* out = s.out + i0 * s.os[0] + i1 * s.os[1] + i2 * s.os[2];
  float v[kVector], y[kVector];
  load(x + col, v);
  if (col >= kRotary) {
    store(out + col, v);
    return;
  }
  float c[kVector], sn[kVector], r[kVector];
  load(s.cos + i0 * s.cs[0] + i1 * s.cs[1] + i2 * s.cs[2] + col, c);
  load(s.sin + i0 * s.ss[0] + i1 * s.ss[1] + i2 * s.ss[2] + col, sn);
  if constexpr (kPairs) {
#pragma unroll
    for (int i = 0; i < kVector; i += 2) {
      r[i] = -v[i + 1];
      r[i + 1] = v[i];
    }
  } else {
    // The other half's vector: the first half rotates by minus the second, the second by the first.
    constexpr int kHalf = kRotary / 2;
    const bool first = col < kHalf;
    load(x + (first ? col + kHalf : col - kHalf), r);
#pragma unroll
    for (int i = 0; i < kVector; ++i) r[i] = first ? -r[i] : r[i];
  }
#pragma unroll
  for (int i = 0; i < kVector; ++i) {
    // Rounded as the graph rounds; _rn keeps nvcc from contracting them into one fma.
    y[i] = __fadd_rn(round_dt(__fmul_rn(v[i], c[i])), round_dt(__fmul_rn(r[i], sn[i])));
  }
  store(out + col, y);
}

__global__ void __launch_bounds__(kBlock) rotary(const Side q, const Side k, uint32_t units_q, uint32_t units) {
  const uint32_t base = blockIdx.x * (kBlock * kPerThread) + threadIdx.x;
#pragma unroll
  for (int p = 0; p < kPerThread; ++p) {
    const uint32_t w = base + p * kBlock;
    if (w >= units) return;
    if (w < units_q) {
      unit(q, w / kUnits, static_cast<int>(w % kUnits));
    } else {
      unit(k, (w - units_q) / kUnits, static_cast<int>((w - units_q) % kUnits));
    }
  }
}

inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % sizeof(Vec) == 0; }

// Whether t is [sizes of x's rows, last] as the header says.
inline bool fits(const FactTensor& t, const FactTensor& x, int64_t last) {
  if (t.rank != 4 || t.dtype != kDtype || t.data == nullptr || !aligned(t.data)) return false;
  if (t.sizes[3] != last || t.strides[3] != 1) return false;
  for (int d = 0; d < 3; ++d) {
    if (t.sizes[d] != x.sizes[d] || t.strides[d] < 0 || t.strides[d] % kVector != 0) return false;
  }
  return true;
}

// One side from tensors x, cos, sin, out (indices into the call's); its units, or -1 when the
// kernel cannot take it.
inline int64_t side_of(const FactOpArgs* a, int x, int cos, int sin, int out, Side& s) {
  const FactTensor& t = a->tensors[x];
  if (!fits(t, t, kHeadDim) || !fits(a->tensors[cos], t, kRotary) || !fits(a->tensors[sin], t, kRotary) ||
      !fits(a->tensors[out], t, kHeadDim)) {
    return -1;
  }
  // An output row's strides must not let two rows meet.
  const FactTensor& o = a->tensors[out];
  for (int d = 0; d < 3; ++d) {
    if (o.sizes[d] > 1 && o.strides[d] < kHeadDim) return -1;
  }
  if (t.sizes[0] < 1 || t.sizes[1] < 1 || t.sizes[2] < 1 || t.sizes[1] > UINT32_MAX || t.sizes[2] > UINT32_MAX) return -1;
  s.x = static_cast<const Element*>(t.data);
  s.cos = static_cast<const Element*>(a->tensors[cos].data);
  s.sin = static_cast<const Element*>(a->tensors[sin].data);
  s.out = static_cast<Element*>(o.data);
  s.n1 = divisor(static_cast<uint32_t>(t.sizes[1]));
  s.n2 = divisor(static_cast<uint32_t>(t.sizes[2]));
  for (int d = 0; d < 3; ++d) {
    s.xs[d] = t.strides[d];
    s.cs[d] = a->tensors[cos].strides[d];
    s.ss[d] = a->tensors[sin].strides[d];
    s.os[d] = o.strides[d];
  }
  return t.sizes[0] * t.sizes[1] * t.sizes[2] * kUnits;
}

// The call's units of q and of both, or false when the kernel cannot take it: shapes, dtypes,
// strides and alignment as the header says, and a grid of 32-bit indices.
inline bool plan(const FactOpArgs* a, Side& q, Side& k, int64_t& units_q, int64_t& units) {
  if (a == nullptr || a->num_tensors != 8 || a->num_scalars != 0) return false;
  units_q = side_of(a, 0, 2, 3, 6, q);
  if (units_q < 0) return false;
  units = units_q;
  k = q;
  if (a->tensors[1].data != nullptr) {
    const int64_t units_k = side_of(a, 1, 4, 5, 7, k);
    if (units_k < 0) return false;
    units += units_k;
  }
  return units + int64_t{kBlock} * kPerThread <= int64_t{UINT32_MAX};
}

}  // namespace fact_rope_halves_bf16_d128_r128_v8_t256_u2
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_rope_halves_bf16_d128_r128_v8_t256_u2_can_implement(const FactOpArgs* a, const FactKnobs*) {
  fact_rope_halves_bf16_d128_r128_v8_t256_u2::Side q, k;
  int64_t units_q, units;
  return fact_rope_halves_bf16_d128_r128_v8_t256_u2::plan(a, q, k, units_q, units) ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_rope_halves_bf16_d128_r128_v8_t256_u2_workspace_size(const FactOpArgs*, const FactKnobs*) { return 0; }

extern "C" __attribute__((weak)) int32_t fact_k_rope_halves_bf16_d128_r128_v8_t256_u2_run(const FactOpArgs* a, const FactKnobs*, void*, size_t,
                                                             void* stream) {
  using namespace fact_rope_halves_bf16_d128_r128_v8_t256_u2;
  Side q, k;
  int64_t units_q, units;
  if (!plan(a, q, k, units_q, units)) return FACT_CANNOT_IMPLEMENT;
  const int64_t per_cta = int64_t{kBlock} * kPerThread;
  const dim3 grid(static_cast<unsigned>((units + per_cta - 1) / per_cta));
  rotary<<<grid, kBlock, 0, static_cast<cudaStream_t>(stream)>>>(q, k, static_cast<uint32_t>(units_q),
                                                                  static_cast<uint32_t>(units));
  return FACT_OK;
}
