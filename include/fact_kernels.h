/* The C ABI of every kernel library fact builds: two dispatch tables, found by index or by name.
 * Rust binds this header with bindgen (build.rs); the generated torch op calls it too.
 * - GEMM variants (fact_kernel_*): the problem is stated in torch's terms:
 *   out[batch][m][n] = f(a . B + bias[n], leaves), packed row-major, where f is the kernel's
 *   epilogue program (FactKernelInfo::epilogue; the identity when empty) and the layout's first two
 *   letters say how a and B lie, packed per batch: a is a[batch][m][k] ("r") or a[batch][k][m]
 *   ("c", a column-major a), B is b[batch][k][n] ("r") or b[batch][n][k] ("c", as linear's weight).
 * - Kernels of other pattern kinds (fact_op_kernel_*): a list of tensors with their sizes and
 *   strides, and a list of scalars; FactOpKernelInfo::signature says what each position means. */
#ifndef FACT_KERNELS_H
#define FACT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FACT_ABI_VERSION 4
/* Leaf tensors an epilogue may read. */
#define FACT_MAX_LEAVES 4

typedef struct FactGemmArgs {
  int32_t m;
  int32_t n;
  int32_t k;
  int32_t batch;
  const void* a;
  const void* b;
  /* NULL when the kernel has no bias epilogue. */
  const void* bias;
  void* out;
  /* Launch knobs. Callers leave them 0; the dispatch index sets each variant's own before it
   * calls the kernel, so variants of one compiled kernel differ only here. */
  /* K splits: serial split-K (sm80 family) or split-K through the Stream-K scheduler (sm90). */
  int32_t splits;
  /* Tile raster order of the sm90 schedulers: 0 heuristic, 1 along M, 2 along N. */
  int32_t raster;
  /* Tile swizzle of the sm90 schedulers (max_swizzle_size): 1, 2, 4 or 8. */
  int32_t swizzle;
  /* The epilogue's leaf tensors, in the program's order: a "full" leaf has out's shape and is
   * packed like it; "row" is n contiguous elements, "col" m (batch 1); "scalar" is one float. Full,
   * row and col leaves have out's element type. Unused entries are NULL. */
  const void* leaves[FACT_MAX_LEAVES];
} FactGemmArgs;

typedef enum FactStatus {
  FACT_OK = 0,
  FACT_BAD_INDEX = 1,
  FACT_CANNOT_IMPLEMENT = 2,
  FACT_WORKSPACE_TOO_SMALL = 3,
  FACT_INIT_FAILED = 4,
  FACT_LAUNCH_FAILED = 5
} FactStatus;

typedef struct FactKernelInfo {
  /* The variant's identity (KernelSpec::name in Rust): the pattern-table value. */
  const char* name;
  /* The KernelSpec the kernel was rendered from, as one line of JSON. */
  const char* spec_json;
  /* Element type of a, b, bias and out: "f32", "bf16" or "f16". */
  const char* dtype;
  /* How a and B lie: "rrr" (as in mm), "rcr" (b is [n,k], as in linear), "crr" (a is [k,m]: a.t() @ b)
   * or "ccr" (both). */
  const char* layout;
  /* 1 when the kernel adds bias[n] and needs FactGemmArgs::bias. */
  int32_t bias;
  /* The fused epilogue program (rules::epilogue's text form), "" for none. */
  const char* epilogue;
} FactKernelInfo;

int32_t fact_abi_version(void);
int32_t fact_kernel_count(void);
/* NULL for a bad index. */
const FactKernelInfo* fact_kernel_info(int32_t index);
/* The index of the named kernel, or -1. */
int32_t fact_kernel_find(const char* name);
/* FACT_OK when the kernel can run this problem (alignment, sizes), else FACT_CANNOT_IMPLEMENT. */
int32_t fact_kernel_can_implement(int32_t index, const FactGemmArgs* args);
size_t fact_kernel_workspace_size(int32_t index, const FactGemmArgs* args);
/* Launches asynchronously on `stream` (a cudaStream_t; NULL is the legacy default stream). */
int32_t fact_kernel_run(int32_t index, const FactGemmArgs* args, void* workspace, size_t workspace_size,
                        void* stream);
/* A tensor as a kernel of the op-kernel table reads it: sizes and strides in elements. */
#define FACT_MAX_RANK 6
typedef struct FactTensor {
  void* data;
  /* "f32", "bf16" or "f16" as 0, 1, 2 (FactDtype). */
  int32_t dtype;
  int32_t rank;
  int64_t sizes[FACT_MAX_RANK];
  int64_t strides[FACT_MAX_RANK];
} FactTensor;

typedef enum FactDtype { FACT_F32 = 0, FACT_BF16 = 1, FACT_F16 = 2 } FactDtype;

typedef struct FactOpArgs {
  const FactTensor* tensors;
  int32_t num_tensors;
  const double* scalars;
  int32_t num_scalars;
} FactOpArgs;

typedef struct FactOpKernelInfo {
  /* The kernel's identity (Spec::name in Rust): the pattern-table value. */
  const char* name;
  /* The pattern kind: "attention". */
  const char* kind;
  /* What the tensors and scalars are, e.g. "q[B,H,Tq,D] k[B,H,Tk,D] v[B,H,Tk,D] out[B,H,Tq,D]; scale causal". */
  const char* signature;
  /* The spec the kernel was rendered from, as one line of JSON. */
  const char* spec_json;
} FactOpKernelInfo;

int32_t fact_op_kernel_count(void);
const FactOpKernelInfo* fact_op_kernel_info(int32_t index);
int32_t fact_op_kernel_find(const char* name);
int32_t fact_op_kernel_can_implement(int32_t index, const FactOpArgs* args);
size_t fact_op_kernel_workspace_size(int32_t index, const FactOpArgs* args);
int32_t fact_op_kernel_run(int32_t index, const FactOpArgs* args, void* workspace, size_t workspace_size,
                           void* stream);

/* The last CUDA error text seen by this library on this thread, for messages. */
const char* fact_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
