// generated from templates/layernorm.cu.hbs; do not edit
// spec: {"arch":"sm90","dtype":"bf16","cols":768,"threads_per_row":32,"vector":8,"rows_per_cta":4,"reads":"early_streamed"}
// ln_bf16_c768_t32_v8_r4_es: LayerNorm over rows of 768 bf16 elements with fp32 statistics,
// y = (x - mean) / sqrt(var + eps) * weight + bias (biased variance). 32 thread(s) own a row,
// each holding 3 load(s) of 8 elements in registers, 4 row(s) per CTA: one read of x,
// two reductions over the registers (mean, then the squares about it), one write of y.
// Tensors (FactOpArgs): x [R,C] and out [R,C], rows a stride apart (a multiple of the vector,
// unit stride along C), weight [C] and bias [C] (data NULL when absent), all of the kernel's dtype
// and aligned to a vector; scalars: eps.
#include "fact_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

// Internal linkage: a unit may hold a kernel that another object linked beside it holds too
// (a sweep's unit next to the same kernel built alone); only the weak entry points are shared.
namespace {
namespace fact_ln_bf16_c768_t32_v8_r4_es {

using Element = __nv_bfloat16;
// One load: 8 elements.
using Vec = uint4;
constexpr int kDtype = 1;
constexpr int kCols = 768;
constexpr int kThreads = 32;
constexpr int kVector = 8;
constexpr int kRows = 4;
constexpr int kSpan = kThreads * kVector;
constexpr int kLoads = (kCols + kSpan - 1) / kSpan;
// Whether the last load leaves some of the group's threads past C.
constexpr bool kRagged = kCols % kSpan != 0;
constexpr int kBlock = kThreads * kRows;
// Warps that share a row (0 when a row's group is part of one warp).
constexpr int kWarps = kThreads / 32;
static_assert(sizeof(Vec) == kVector * sizeof(Element), "a load is one vector");
static_assert(kCols % kVector == 0 && kBlock % 32 == 0 && kBlock <= 1024, "checked by LayerNormSpec::invalid_reason");

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ void from_float(float v, float& out) { out = v; }
__device__ __forceinline__ void from_float(float v, __nv_bfloat16& out) { out = __float2bfloat16_rn(v); }
__device__ __forceinline__ void from_float(float v, __half& out) { out = __float2half_rn(v); }

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

// x's row, read once: streamed past L1 and L2 (evict-first), so what the kernel writes keeps its
// place in L2.
__device__ __forceinline__ void load_row(const Element* p, float (&v)[kVector]) {
  const Vec raw = __ldcs(reinterpret_cast<const Vec*>(p));
  const Element* e = reinterpret_cast<const Element*>(&raw);
#pragma unroll
  for (int k = 0; k < kVector; ++k) v[k] = to_float(e[k]);
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
    // The next sum writes the partials again.
    __syncthreads();
  }
  return v;
}

template <bool kWeight, bool kBias>
__global__ void __launch_bounds__(kBlock)
    layernorm(const Element* __restrict__ x, int64_t x_stride, Element* __restrict__ out, int64_t out_stride,
              const Element* __restrict__ weight, const Element* __restrict__ bias, int64_t rows, float eps) {
  __shared__ float partial[kWarps > 1 ? kRows * kWarps : 1];
  const int lane = threadIdx.x % kThreads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x / kThreads;
  // A group past the last row computes on zeros and writes nothing, so every thread reaches the
  // warp's shuffles and the CTA's barriers.
  const bool live = row < rows;
  const Element* xr = x + (live ? row : 0) * x_stride;
  // Every load the row needs issues before any arithmetic, store or reduction: its operands, then
  // the weight and bias, whose latency so hides under theirs.
  float v[kLoads][kVector], wr[kLoads][kVector], bsr[kLoads][kVector];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int col = (i * kThreads + lane) * kVector;
    if (live && inside(i, lane)) {
      load_row(xr + col, v[i]);
    } else {
#pragma unroll
      for (int k = 0; k < kVector; ++k) v[i][k] = 0.f;
    }
  }
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    if (inside(i, lane)) {
      if constexpr (kWeight) load(weight + (i * kThreads + lane) * kVector, wr[i]);
      if constexpr (kBias) load(bias + (i * kThreads + lane) * kVector, bsr[i]);
    }
  }
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
#pragma unroll
    for (int k = 0; k < kVector; ++k) sum += v[i][k];
  }
  const float mean = group_sum(sum, partial) / static_cast<float>(kCols);
  // The variance about the mean, from the same registers: no cancellation between E[x^2] and
  // mean^2 when the mean is large against the spread.
  float squares = 0.f;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    if (inside(i, lane)) {
#pragma unroll
      for (int k = 0; k < kVector; ++k) {
        const float d = v[i][k] - mean;
        squares += d * d;
      }
    }
  }
  const float rstd = rsqrtf(group_sum(squares, partial) / static_cast<float>(kCols) + eps);
  if (!live) return;
  Element* yr = out + row * out_stride;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    if (!inside(i, lane)) continue;
    const int col = (i * kThreads + lane) * kVector;
    const float(&w)[kVector] = wr[i];
    const float(&b)[kVector] = bsr[i];
    float y[kVector];
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      y[k] = (v[i][k] - mean) * rstd;
      if constexpr (kWeight) y[k] *= w[k];
      if constexpr (kBias) y[k] += b[k];
    }
    store(yr + col, y);
  }
}

inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % sizeof(Vec) == 0; }

// The call's row count, or -1 when the kernel cannot take it: shapes, dtypes, strides and
// alignment as the header says, and a grid the launch can hold. Host helpers are inline (weak), as
// the entry points are: an object linked beside another holding the same kernel is harmless.
inline int64_t rows_of(const FactOpArgs* a) {
  if (a == nullptr || a->num_tensors != 4 || a->num_scalars != 1) return -1;
  const FactTensor& x = a->tensors[0];
  const FactTensor& o = a->tensors[1];
  const int64_t rows = x.sizes[0];
  for (const FactTensor* t : {&x, &o}) {
    if (t->rank != 2 || t->dtype != kDtype || t->data == nullptr || !aligned(t->data)) return -1;
    if (t->sizes[0] != rows || t->sizes[1] != kCols || t->strides[1] != 1) return -1;
    if (t->strides[0] < 0 || t->strides[0] % kVector != 0) return -1;
  }
  // Rows of the output must not overlap (x's may: a broadcast row is read, never written).
  if (rows > 1 && o.strides[0] < kCols) return -1;
  if (rows < 1 || (rows + kRows - 1) / kRows > INT32_MAX) return -1;
  for (int i = 2; i < 4; ++i) {
    const FactTensor& p = a->tensors[i];
    if (p.data == nullptr) continue;
    if (p.rank != 1 || p.dtype != kDtype || p.sizes[0] != kCols || p.strides[0] != 1 || !aligned(p.data)) return -1;
  }
  return rows;
}

}  // namespace fact_ln_bf16_c768_t32_v8_r4_es
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_ln_bf16_c768_t32_v8_r4_es_can_implement(const FactOpArgs* a, const FactKnobs*) {
  return fact_ln_bf16_c768_t32_v8_r4_es::rows_of(a) >= 0 ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_ln_bf16_c768_t32_v8_r4_es_workspace_size(const FactOpArgs*, const FactKnobs*) { return 0; }

extern "C" __attribute__((weak)) int32_t fact_k_ln_bf16_c768_t32_v8_r4_es_run(const FactOpArgs* a, const FactKnobs*, void*, size_t,
                                                             void* stream) {
  using namespace fact_ln_bf16_c768_t32_v8_r4_es;
  const int64_t rows = rows_of(a);
  if (rows < 0) return FACT_CANNOT_IMPLEMENT;
  const Element* x = static_cast<const Element*>(a->tensors[0].data);
  Element* out = static_cast<Element*>(a->tensors[1].data);
  const Element* weight = static_cast<const Element*>(a->tensors[2].data);
  const Element* bias = static_cast<const Element*>(a->tensors[3].data);
  const int64_t xs = a->tensors[0].strides[0], os = a->tensors[1].strides[0];
  const float eps = static_cast<float>(a->scalars[0]);
  const dim3 grid(static_cast<unsigned>((rows + kRows - 1) / kRows));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (weight != nullptr && bias != nullptr) {
    layernorm<true, true><<<grid, kBlock, 0, s>>>(x, xs, out, os, weight, bias, rows, eps);
  } else if (weight != nullptr) {
    layernorm<true, false><<<grid, kBlock, 0, s>>>(x, xs, out, os, weight, bias, rows, eps);
  } else if (bias != nullptr) {
    layernorm<false, true><<<grid, kBlock, 0, s>>>(x, xs, out, os, weight, bias, rows, eps);
  } else {
    layernorm<false, false><<<grid, kBlock, 0, s>>>(x, xs, out, os, weight, bias, rows, eps);
  }
  return FACT_OK;
}
