// generated from templates/dispatch.cpp.hbs; do not edit
// The dispatch table of one kernel library, looked up by index or name: 2 kernels of every
// pattern kind, each called with lists of tensors and scalars (include/fact_kernels.h). A GEMM
// variant is a compiled kernel plus its launch knobs, which the table passes the kernel; several
// variants may share one kernel. Host code alone: the host compiler builds it, in a fraction of
// nvcc's time for a unit without device code (every sweep's library has one).
#include "fact_kernels.h"

#include <cuda_runtime.h>
#include <cstring>
#include <string>

extern "C" int32_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_can_implement(const FactOpArgs*, const FactKnobs*);
extern "C" size_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_workspace_size(const FactOpArgs*, const FactKnobs*);
extern "C" int32_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_run(const FactOpArgs*, const FactKnobs*, void*, size_t, void*);
extern "C" int32_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_can_implement(const FactOpArgs*, const FactKnobs*);
extern "C" size_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_workspace_size(const FactOpArgs*, const FactKnobs*);
extern "C" int32_t fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_run(const FactOpArgs*, const FactKnobs*, void*, size_t, void*);

namespace {
struct Entry {
  FactKernelInfo info;
  int32_t (*can_implement)(const FactOpArgs*, const FactKnobs*);
  size_t (*workspace_size)(const FactOpArgs*, const FactKnobs*);
  int32_t (*run)(const FactOpArgs*, const FactKnobs*, void*, size_t, void*);
  FactKnobs knobs;
};

// The table ends in an empty entry, so a library without kernels still declares a non-empty
// array; the count leaves it out.
const Entry kEntries[] = {
    { {"sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4", "gemm", "a[L,M,K] b[L,K,N] (stored [L,N,K]) bias[N] out[L,M,N]; no scalars", R"fact_spec({"family":"sm90_gemm","arch":"sm90","layout":"rcr","math":"tf32","dtype":"f32","tile":[128,128,32],"cluster":[1,2,1],"schedule":"ws_cooperative","scheduler":"persistent","bias":true,"align":4})fact_spec", "f32", "rcr",
       R"fact_ep()fact_ep"},
     fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_can_implement, fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_workspace_size, fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_bias_align4_run, { 1, 0, 1 }},
    { {"sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4", "gemm", "a[L,M,K] b[L,K,N] (stored [L,N,K]) bias (NULL data) out[L,M,N]; no scalars", R"fact_spec({"family":"sm90_gemm","arch":"sm90","layout":"rcr","math":"tf32","dtype":"f32","tile":[128,128,32],"cluster":[1,2,1],"schedule":"ws_cooperative","scheduler":"persistent","bias":false,"align":4})fact_spec", "f32", "rcr",
       R"fact_ep()fact_ep"},
     fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_can_implement, fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_workspace_size, fact_k_sm90_gemm_rcr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4_run, { 1, 0, 1 }},
    { {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr}, nullptr, nullptr, nullptr, {0, 0, 0}},
};
constexpr int32_t kCount = static_cast<int32_t>(sizeof(kEntries) / sizeof(kEntries[0])) - 1;

thread_local std::string last_error;

bool valid(int32_t i) { return i >= 0 && i < kCount; }
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

extern "C" int32_t fact_kernel_can_implement(int32_t i, const FactOpArgs* args) {
  if (!valid(i)) return FACT_BAD_INDEX;
  return kEntries[i].can_implement(args, &kEntries[i].knobs);
}

extern "C" size_t fact_kernel_workspace_size(int32_t i, const FactOpArgs* args) {
  if (!valid(i)) return 0;
  return kEntries[i].workspace_size(args, &kEntries[i].knobs);
}

extern "C" int32_t fact_kernel_run(int32_t i, const FactOpArgs* args, void* workspace, size_t workspace_size,
                                   void* stream) {
  if (!valid(i)) return FACT_BAD_INDEX;
  int32_t status = kEntries[i].run(args, &kEntries[i].knobs, workspace, workspace_size, stream);
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
