// generated from src/kinds/grn/grn.cu.hbs; do not edit
// spec: {"arch":"sm90","dtype":"bf16","vector":8,"sum_rows":8}
// grn_bf16_v8_s8: ConvNeXt V2's Global Response Normalization over x [N,H,W,C] (bf16, channels last),
// in fp32: g[n,c] = sqrt(sum over the H*W positions of x^2), nf = g / (mean over c of g + eps),
// y = w * (x * nf) + b + x. Three launches: the sums of squares over S slices of the positions (a
// CTA's 32 lanes across 32 vectors of 8 channels, 8 positions at a time, each
// slice's partial sums to the workspace), each image's finish (g, its mean, nf), then y (one thread
// a vector of channels at one position). x is read twice and y written once.
// Tensors (FactOpArgs): x [N,H,W,C] (unit stride along C, the positions one run: stride(1) = W *
// stride(2), strides a multiple of the vector), out [N,H,W,C] packed, weight [C] and bias [C]
// packed, all of the kernel's dtype and aligned to a vector; scalars: eps. Workspace: fp32 partial
// sums [N,S,C], then nf [N,C].
#include "fact_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cstdint>

// Internal linkage: a unit may hold a kernel that another object linked beside it holds too
// (a sweep's unit next to the same kernel built alone); only the weak entry points are shared.
namespace {
namespace fact_grn_bf16_v8_s8 {

using Element = __nv_bfloat16;
// One load: 8 elements.
using Vec = uint4;
constexpr int kDtype = 1;
constexpr int kVector = 8;
constexpr int kSumRows = 8;
// Lanes of the sum pass across the channels: a warp.
constexpr int kLanes = 32;
constexpr int kApplyBlock = 256;
constexpr int kFinishBlock = 256;
// Slices of the positions at most: the partial sums the finish adds per channel.
constexpr int64_t kMaxSlices = 64;
static_assert(sizeof(Vec) == kVector * sizeof(Element), "a load is one vector");

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

// The sums of squares of slice blockIdx.y (positions s*R + ty, stepped by S*R) of image blockIdx.z
// over 32 vectors of channels: partial[n][s][c].
__global__ void __launch_bounds__(kLanes * kSumRows)
    partial_squares(const Element* __restrict__ x, int64_t image_stride, int64_t pixel_stride, int64_t pixels,
                    int64_t channels, float* __restrict__ partial) {
  __shared__ float sums[kSumRows][kLanes * kVector];
  const int64_t n = blockIdx.z, slices = gridDim.y, s = blockIdx.y;
  const int64_t c0 = (int64_t(blockIdx.x) * kLanes + threadIdx.x) * kVector;
  float acc[kVector];
#pragma unroll
  for (int k = 0; k < kVector; ++k) acc[k] = 0.f;
  if (c0 < channels) {
    const Element* row = x + n * image_stride + c0;
    for (int64_t p = s * kSumRows + threadIdx.y; p < pixels; p += slices * kSumRows) {
      float v[kVector];
      load(row + p * pixel_stride, v);
#pragma unroll
      for (int k = 0; k < kVector; ++k) acc[k] = fmaf(v[k], v[k], acc[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < kVector; ++k) sums[threadIdx.y][threadIdx.x * kVector + k] = acc[k];
  __syncthreads();
  // The block's rows added in order, each channel by one thread.
  for (int i = threadIdx.y * kLanes + threadIdx.x; i < kLanes * kVector; i += kLanes * kSumRows) {
    const int64_t c = int64_t(blockIdx.x) * kLanes * kVector + i;
    if (c >= channels) continue;
    float t = 0.f;
#pragma unroll
    for (int r = 0; r < kSumRows; ++r) t += sums[r][i];
    partial[(n * slices + s) * channels + c] = t;
  }
}

// Image blockIdx.x's nf: g = sqrt of its partial sums, their mean over the channels, g / (mean +
// eps), in nf[n][c].
__global__ void __launch_bounds__(kFinishBlock)
    finish(const float* __restrict__ partial, int64_t slices, int64_t channels, float eps, float* __restrict__ nf) {
  __shared__ float warp_sums[kFinishBlock / 32];
  const int64_t n = blockIdx.x;
  float local = 0.f;
  for (int64_t c = threadIdx.x; c < channels; c += kFinishBlock) {
    float ss = 0.f;
    for (int64_t s = 0; s < slices; ++s) ss += partial[(n * slices + s) * channels + c];
    const float g = sqrtf(ss);
    nf[n * channels + c] = g;
    local += g;
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) local += __shfl_xor_sync(0xffffffffu, local, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = local;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kFinishBlock / 32; ++w) total += warp_sums[w];
  const float denominator = total / float(channels) + eps;
  // Each thread rewrites the channels it wrote above.
  for (int64_t c = threadIdx.x; c < channels; c += kFinishBlock) nf[n * channels + c] /= denominator;
}

// y = w * (x * nf) + b + x, one thread a vector of channels at one position.
__global__ void __launch_bounds__(kApplyBlock)
    apply(const Element* __restrict__ x, int64_t image_stride, int64_t pixel_stride, int64_t pixels, int64_t channels,
          const float* __restrict__ nf, const Element* __restrict__ weight, const Element* __restrict__ bias,
          Element* __restrict__ out) {
  const int64_t vectors = channels / kVector;
  const int64_t n = blockIdx.y;
  for (int64_t i = int64_t(blockIdx.x) * kApplyBlock + threadIdx.x; i < pixels * vectors;
       i += int64_t(gridDim.x) * kApplyBlock) {
    const int64_t p = i / vectors, c0 = (i % vectors) * kVector;
    float v[kVector], w[kVector], b[kVector], y[kVector];
    load(x + n * image_stride + p * pixel_stride + c0, v);
    load(weight + c0, w);
    load(bias + c0, b);
#pragma unroll
    for (int k = 0; k < kVector; ++k) y[k] = fmaf(w[k], v[k] * nf[n * channels + c0 + k], b[k]) + v[k];
    store(out + (n * pixels + p) * channels + c0, y);
  }
}

__host__ __device__ __forceinline__ bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Vec) == 0;
}

// One call as the launches read it.
struct Call {
  int64_t images = 0, pixels = 0, channels = 0, image_stride = 0, pixel_stride = 0, slices = 1;
};

// The call, or false when the kernel cannot take it: shapes, dtypes, strides and alignment as the
// header says, and grids the launches can hold. Host helpers are inline (weak), as the entry
// points are.
inline bool read_call(const FactOpArgs* a, Call& c) {
  if (a == nullptr || a->num_tensors != 4 || a->num_scalars != 1) return false;
  const FactTensor& x = a->tensors[0];
  const FactTensor& o = a->tensors[1];
  const FactTensor& w = a->tensors[2];
  const FactTensor& b = a->tensors[3];
  for (const FactTensor* t : {&x, &o}) {
    if (t->rank != 4 || t->dtype != kDtype || t->data == nullptr || !aligned(t->data)) return false;
    for (int i = 0; i < 4; ++i) {
      if (t->sizes[i] != x.sizes[i]) return false;
    }
  }
  c.images = x.sizes[0];
  c.pixels = x.sizes[1] * x.sizes[2];
  c.channels = x.sizes[3];
  if (c.images < 1 || c.pixels < 1 || c.channels < 1 || c.channels % kVector != 0) return false;
  // x: unit stride along C, the positions one run, steps whole vectors.
  if (x.strides[3] != 1 || x.strides[1] != x.sizes[2] * x.strides[2] || x.strides[2] % kVector != 0 ||
      x.strides[0] % kVector != 0 || x.strides[2] < c.channels) {
    return false;
  }
  if (o.strides[3] != 1 || o.strides[2] != c.channels || o.strides[1] != x.sizes[2] * c.channels ||
      o.strides[0] != c.pixels * c.channels) {
    return false;
  }
  for (const FactTensor* t : {&w, &b}) {
    if (t->rank != 1 || t->dtype != kDtype || t->data == nullptr || !aligned(t->data)) return false;
    if (t->sizes[0] != c.channels || t->strides[0] != 1) return false;
  }
  c.image_stride = x.strides[0];
  c.pixel_stride = x.strides[2];
  // Enough slices that each holds about 16 rounds of the CTA's positions, at most kMaxSlices.
  const int64_t rounds = (c.pixels + 16 * kSumRows - 1) / (16 * kSumRows);
  c.slices = rounds < 1 ? 1 : (rounds > kMaxSlices ? kMaxSlices : rounds);
  const int64_t channel_blocks = (c.channels + kLanes * kVector - 1) / (kLanes * kVector);
  return c.images <= 65535 && channel_blocks <= INT32_MAX;
}

inline size_t workspace_bytes(const Call& c) {
  return size_t(c.images) * size_t(c.slices + 1) * size_t(c.channels) * sizeof(float);
}

}  // namespace fact_grn_bf16_v8_s8
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_grn_bf16_v8_s8_can_implement(const FactOpArgs* a, const FactKnobs*) {
  fact_grn_bf16_v8_s8::Call c;
  return fact_grn_bf16_v8_s8::read_call(a, c) ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_grn_bf16_v8_s8_workspace_size(const FactOpArgs* a, const FactKnobs*) {
  fact_grn_bf16_v8_s8::Call c;
  return fact_grn_bf16_v8_s8::read_call(a, c) ? fact_grn_bf16_v8_s8::workspace_bytes(c) : 0;
}

extern "C" __attribute__((weak)) int32_t fact_k_grn_bf16_v8_s8_run(const FactOpArgs* a, const FactKnobs*, void* workspace,
                                                             size_t workspace_size, void* stream) {
  using namespace fact_grn_bf16_v8_s8;
  Call c;
  if (!read_call(a, c) || workspace == nullptr || workspace_size < workspace_bytes(c)) return FACT_CANNOT_IMPLEMENT;
  const Element* x = static_cast<const Element*>(a->tensors[0].data);
  Element* out = static_cast<Element*>(a->tensors[1].data);
  const Element* weight = static_cast<const Element*>(a->tensors[2].data);
  const Element* bias = static_cast<const Element*>(a->tensors[3].data);
  float* partial = static_cast<float*>(workspace);
  float* nf = partial + c.images * c.slices * c.channels;
  const float eps = static_cast<float>(a->scalars[0]);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned channel_blocks = unsigned((c.channels + kLanes * kVector - 1) / (kLanes * kVector));
  partial_squares<<<dim3(channel_blocks, unsigned(c.slices), unsigned(c.images)), dim3(kLanes, kSumRows), 0, s>>>(
      x, c.image_stride, c.pixel_stride, c.pixels, c.channels, partial);
  finish<<<unsigned(c.images), kFinishBlock, 0, s>>>(partial, c.slices, c.channels, eps, nf);
  // One thread a vector of channels at one position, a grid-stride loop past 4096 CTAs an image.
  const int64_t work = c.pixels * (c.channels / kVector);
  const int64_t blocks = (work + kApplyBlock - 1) / kApplyBlock;
  apply<<<dim3(unsigned(blocks < 4096 ? blocks : 4096), unsigned(c.images)), kApplyBlock, 0, s>>>(
      x, c.image_stride, c.pixel_stride, c.pixels, c.channels, nf, weight, bias, out);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? FACT_OK : FACT_LAUNCH_FAILED;
}
