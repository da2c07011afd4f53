// generated from templates/sm90_gemm_x3.cu.hbs; do not edit
// spec: {"family":"sm90_gemm_x3","arch":"sm90","layout":"rrr","math":"tf32x3","dtype":"f32","tile":[128,256,32],"cluster":[2,1,1],"schedule":"ws","scheduler":"persistent","bias":false,"align":4,"epilogue":"no_smem"}
//
// sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4: fp32-accurate out[m,n] = a[m,k] . B (torch layout rrr) on WGMMA as three tf32
// products. Each fp32 operand x is split exactly into big = x with the low 13 mantissa bits cleared
// (a tf32 value, so the tensor core reads it without loss) and small = x - big; then
//   out = a_big . b_big + a_big . b_small + a_small . b_big
// by the same sm90 GEMM three times, the later two accumulating (beta = 1). The dropped
// a_small . b_small term and tf32's reading of the small parts are below 2^-20 relative. The four
// parts live in the workspace. Like the sm90 family it computes the column-major transposed problem.
#include "fact_kernels.h"

#include <cuda_runtime.h>

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
namespace sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4_ns {
using namespace cute;

using Element = float;
using ElementAccumulator = float;
using ElementCompute = float;
// CUTLASS operand A is torch's b (transposed view), operand B is torch's a.
using LayoutA = cutlass::layout::ColumnMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::ColumnMajor;
constexpr int Alignment = 4;

using TileShape = Shape<_128, _256, _32>;
using ClusterShape = Shape<_2, _1, _1>;

using FusionOp = cutlass::epilogue::fusion::LinearCombination<Element, ElementCompute, Element, ElementCompute>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto,
    ElementAccumulator, ElementCompute,
    Element, LayoutD, Alignment,
    Element, LayoutD, Alignment,
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
    cutlass::gemm::KernelTmaWarpSpecialized>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

int sm_count() {
  // Querying the device costs more than a short GEMM, so it is done once per process.
  static int count = [] {
    int device = 0;
    cudaGetDevice(&device);
    return cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  }();
  return count;
}

// The problem of `p` with operands a (torch's a) and b (torch's b) and out = a.b + beta.out.
typename Gemm::Arguments make_arguments(const FactGemmArgs& p, const void* a, const void* b, float beta) {
  const int M = p.n, N = p.m, K = p.k, L = p.batch;
  auto stride_a = cutlass::make_cute_packed_stride(typename GemmKernel::StrideA{}, {M, K, L});
  auto stride_b = cutlass::make_cute_packed_stride(typename GemmKernel::StrideB{}, {N, K, L});
  auto stride_d = cutlass::make_cute_packed_stride(typename GemmKernel::StrideD{}, {M, N, L});
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = sm_count();
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, L},
      {static_cast<const Element*>(b), stride_a, static_cast<const Element*>(a), stride_b},
      { {}, static_cast<const Element*>(p.out), stride_d, static_cast<Element*>(p.out), stride_d},
      hw};
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = beta;
  // Launch knobs (FactGemmArgs, set per variant by the dispatch index): no recompile needed.
  using RasterOrderOptions = cutlass::gemm::kernel::detail::RasterOrderOptions;
  args.scheduler.max_swizzle_size = p.swizzle > 0 ? p.swizzle : 1;
  args.scheduler.raster_order = p.raster == 1   ? RasterOrderOptions::AlongM
                                : p.raster == 2 ? RasterOrderOptions::AlongN
                                                : RasterOrderOptions::Heuristic;
  return args;
}

// Splits n floats (n % 4 == 0, 16-byte aligned) into tf32-exact big parts and fp32 remainders.
__global__ void split_tf32(const float4* __restrict__ x, float4* __restrict__ big, float4* __restrict__ small,
                           size_t n4) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    float4 b;
    b.x = __uint_as_float(__float_as_uint(v.x) & 0xffffe000u);
    b.y = __uint_as_float(__float_as_uint(v.y) & 0xffffe000u);
    b.z = __uint_as_float(__float_as_uint(v.z) & 0xffffe000u);
    b.w = __uint_as_float(__float_as_uint(v.w) & 0xffffe000u);
    big[i] = b;
    small[i] = make_float4(v.x - b.x, v.y - b.y, v.z - b.z, v.w - b.w);
  }
}

size_t numel_a(const FactGemmArgs& p) { return size_t(p.batch) * p.m * p.k; }
size_t numel_b(const FactGemmArgs& p) { return size_t(p.batch) * p.k * p.n; }
size_t round_up(size_t v) { return (v + 255) / 256 * 256; }
size_t parts_bytes(const FactGemmArgs& p) { return 2 * round_up(numel_a(p) * 4) + 2 * round_up(numel_b(p) * 4); }

void launch_split(const void* x, float* big, float* small, size_t n, cudaStream_t s) {
  const size_t n4 = n / 4;
  const size_t wanted = (n4 + 255) / 256;
  const int blocks = static_cast<int>(wanted < 132 * 16 ? wanted : 132 * 16);
  split_tf32<<<blocks, 256, 0, s>>>(static_cast<const float4*>(x), reinterpret_cast<float4*>(big),
                                    reinterpret_cast<float4*>(small), n4);
}
}  // namespace sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4_ns
}  // namespace

extern "C" __attribute__((weak)) int32_t fact_k_sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4_can_implement(const FactGemmArgs* p) {
  using namespace sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4_ns;
  if (numel_a(*p) % 4 != 0 || numel_b(*p) % 4 != 0) return FACT_CANNOT_IMPLEMENT;
  auto args = make_arguments(*p, p->a, p->b, 1.0f);
  return Gemm::can_implement(args) == cutlass::Status::kSuccess ? FACT_OK : FACT_CANNOT_IMPLEMENT;
}

extern "C" __attribute__((weak)) size_t fact_k_sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4_workspace_size(const FactGemmArgs* p) {
  using namespace sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4_ns;
  return parts_bytes(*p) + Gemm::get_workspace_size(make_arguments(*p, p->a, p->b, 1.0f));
}

extern "C" __attribute__((weak)) int32_t fact_k_sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4_run(const FactGemmArgs* p, void* workspace, size_t workspace_size,
                                       void* stream) {
  using namespace sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4_ns;
  if (fact_k_sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4_can_implement(p) != FACT_OK) return FACT_CANNOT_IMPLEMENT;
  if (fact_k_sm90x3_gemm_rrr_tf32x3_f32_128x256x32_2x1x1_ws_dp_nosmem_align4_workspace_size(p) > workspace_size) return FACT_WORKSPACE_TOO_SMALL;
  auto s = static_cast<cudaStream_t>(stream);
  char* w = static_cast<char*>(workspace);
  float* a_big = reinterpret_cast<float*>(w);
  float* a_small = reinterpret_cast<float*>(w + round_up(numel_a(*p) * 4));
  float* b_big = reinterpret_cast<float*>(w + 2 * round_up(numel_a(*p) * 4));
  float* b_small = reinterpret_cast<float*>(w + 2 * round_up(numel_a(*p) * 4) + round_up(numel_b(*p) * 4));
  void* gemm_ws = w + parts_bytes(*p);
  launch_split(p->a, a_big, a_small, numel_a(*p), s);
  launch_split(p->b, b_big, b_small, numel_b(*p), s);
  const void* passes[3][2] = { {a_big, b_big}, {a_big, b_small}, {a_small, b_big} };
  for (int i = 0; i < 3; ++i) {
    auto args = make_arguments(*p, passes[i][0], passes[i][1], i == 0 ? 0.0f : 1.0f);
    Gemm gemm;
    if (gemm.initialize(args, gemm_ws, s) != cutlass::Status::kSuccess) return FACT_INIT_FAILED;
    if (gemm.run(s) != cutlass::Status::kSuccess) return FACT_LAUNCH_FAILED;
  }
  return FACT_OK;
}
