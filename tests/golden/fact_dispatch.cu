// generated from templates/dispatch.cu.hbs; do not edit
// The dispatch tables of one kernel library, looked up by index or name: 2 GEMM variants (a
// variant is a compiled kernel plus its launch knobs; several variants may share one kernel) and
// 0 kernels of other pattern kinds, called with lists of tensors and scalars.
#include "fact_kernels.h"

#include <cuda_runtime.h>
#include <cstring>
#include <string>

extern "C" int32_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_can_implement(const FactGemmArgs*);
extern "C" size_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_workspace_size(const FactGemmArgs*);
extern "C" int32_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_run(const FactGemmArgs*, void*, size_t, void*);
extern "C" int32_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_can_implement(const FactGemmArgs*);
extern "C" size_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_workspace_size(const FactGemmArgs*);
extern "C" int32_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_run(const FactGemmArgs*, void*, size_t, void*);

namespace {
struct Entry {
  FactKernelInfo info;
  int32_t (*can_implement)(const FactGemmArgs*);
  size_t (*workspace_size)(const FactGemmArgs*);
  int32_t (*run)(const FactGemmArgs*, void*, size_t, void*);
  int32_t splits, raster, swizzle;
};

// Each table ends in an empty entry, so a library without GEMMs (or without other kinds) still
// declares a non-empty array; the counts leave it out.
const Entry kEntries[] = {
    { {"sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4", R"fact_spec({"family":"sm90_gemm","arch":"sm90","layout":"rcr","math":"tf32","dtype":"f32","tile":[128,128,32],"cluster":[1,2,1],"schedule":"ws_cooperative","scheduler":"persistent","bias":true,"align":4})fact_spec", "f32", "rcr", 1,
      R"fact_ep()fact_ep"},
     fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_can_implement,
     fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_workspace_size, fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_run, 1, 0, 1},
    { {"sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4", R"fact_spec({"family":"sm90_gemm","arch":"sm90","layout":"rcr","math":"tf32","dtype":"f32","tile":[128,128,32],"cluster":[1,2,1],"schedule":"ws_cooperative","scheduler":"persistent","bias":false,"align":4})fact_spec", "f32", "rcr", 0,
      R"fact_ep()fact_ep"},
     fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_can_implement,
     fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_workspace_size, fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_run, 1, 0, 1},
    { {nullptr, nullptr, nullptr, nullptr, 0, nullptr}, nullptr, nullptr, nullptr, 0, 0, 0},
};
constexpr int32_t kCount = static_cast<int32_t>(sizeof(kEntries) / sizeof(kEntries[0])) - 1;

struct OpEntry {
  FactOpKernelInfo info;
  int32_t (*can_implement)(const FactOpArgs*);
  size_t (*workspace_size)(const FactOpArgs*);
  int32_t (*run)(const FactOpArgs*, void*, size_t, void*);
};

const OpEntry kOpEntries[] = {
    { {nullptr, nullptr, nullptr, nullptr}, nullptr, nullptr, nullptr},
};
constexpr int32_t kOpCount = static_cast<int32_t>(sizeof(kOpEntries) / sizeof(kOpEntries[0])) - 1;

thread_local std::string last_error;

bool valid(int32_t i) { return i >= 0 && i < kCount; }

// The caller's problem with the variant's launch knobs.
FactGemmArgs with_knobs(int32_t i, const FactGemmArgs* args) {
  FactGemmArgs a = *args;
  a.splits = kEntries[i].splits;
  a.raster = kEntries[i].raster;
  a.swizzle = kEntries[i].swizzle;
  return a;
}
}  // namespace

extern "C" int32_t fact_abi_version(void) { return FACT_ABI_VERSION; }
extern "C" int32_t fact_kernel_count(void) { return kCount; }
extern "C" const FactKernelInfo* fact_kernel_info(int32_t i) { return valid(i) ? &kEntries[i].info : nullptr; }

extern "C" int32_t fact_kernel_find(const char* name) {
  for (int32_t i = 0; i < kCount; ++i) {
    if (std::strcmp(kEntries[i].info.name, name) == 0) return i;
  }
  return -1;
}

extern "C" int32_t fact_kernel_can_implement(int32_t i, const FactGemmArgs* args) {
  if (!valid(i)) return FACT_BAD_INDEX;
  const FactGemmArgs a = with_knobs(i, args);
  return kEntries[i].can_implement(&a);
}

extern "C" size_t fact_kernel_workspace_size(int32_t i, const FactGemmArgs* args) {
  if (!valid(i)) return 0;
  const FactGemmArgs a = with_knobs(i, args);
  return kEntries[i].workspace_size(&a);
}

extern "C" int32_t fact_kernel_run(int32_t i, const FactGemmArgs* args, void* workspace,
                                   size_t workspace_size, void* stream) {
  if (!valid(i)) return FACT_BAD_INDEX;
  const FactGemmArgs a = with_knobs(i, args);
  int32_t status = kEntries[i].run(&a, workspace, workspace_size, stream);
  if (status == FACT_OK) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      last_error = cudaGetErrorString(err);
      return FACT_LAUNCH_FAILED;
    }
  }
  return status;
}

extern "C" int32_t fact_op_kernel_count(void) { return kOpCount; }
extern "C" const FactOpKernelInfo* fact_op_kernel_info(int32_t i) {
  return i >= 0 && i < kOpCount ? &kOpEntries[i].info : nullptr;
}

extern "C" int32_t fact_op_kernel_find(const char* name) {
  for (int32_t i = 0; i < kOpCount; ++i) {
    if (std::strcmp(kOpEntries[i].info.name, name) == 0) return i;
  }
  return -1;
}

extern "C" int32_t fact_op_kernel_can_implement(int32_t i, const FactOpArgs* args) {
  if (i < 0 || i >= kOpCount) return FACT_BAD_INDEX;
  return kOpEntries[i].can_implement(args);
}

extern "C" size_t fact_op_kernel_workspace_size(int32_t i, const FactOpArgs* args) {
  if (i < 0 || i >= kOpCount) return 0;
  return kOpEntries[i].workspace_size(args);
}

extern "C" int32_t fact_op_kernel_run(int32_t i, const FactOpArgs* args, void* workspace,
                                      size_t workspace_size, void* stream) {
  if (i < 0 || i >= kOpCount) return FACT_BAD_INDEX;
  int32_t status = kOpEntries[i].run(args, workspace, workspace_size, stream);
  if (status == FACT_OK) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
      last_error = cudaGetErrorString(err);
      return FACT_LAUNCH_FAILED;
    }
  }
  return status;
}

extern "C" const char* fact_last_error(void) { return last_error.c_str(); }
