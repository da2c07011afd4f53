/* The C ABI of every kernel library fact builds: one dispatch table of kernels of every pattern kind
 * (GEMM, attention, LayerNorm), found by index or by name. Every kernel is called the same way: a
 * list of tensors (FactTensor: data, dtype, sizes and strides in elements) and a list of scalars,
 * whose meaning by position FactKernelInfo::signature states. can_implement refuses
 * (FACT_CANNOT_IMPLEMENT) any call whose counts, dtypes, sizes, strides or alignment the kernel cannot
 * run, so a call that does not fit never gets a wrong number: the caller falls back.
 * Rust binds this header with bindgen (build.rs); the generated torch op calls it too.
 *
 * Kind "gemm": out[L][m][n] = f(a[L][m][k] . B[L][k][n] + bias[n], leaves) in torch's terms, where f
 * is the kernel's epilogue program (FactKernelInfo::epilogue; the identity when empty) and L the
 * batch (torch's leading dims joined into one). Tensors, in this order:
 *   a     [L,M,K] as the layout's first letter says: "r" row-major (strides [M*K, K, 1]) or "c"
 *         column-major, the transpose of a packed [L,K,M] (strides [M*K, 1, M]);
 *   b     [L,K,N], torch's B, as the second letter says: "r" row-major (strides [K*N, N, 1]) or
 *         "c" the transpose of a packed [L,N,K], as linear's weight is (strides [K*N, 1, K]);
 *   bias  [N] (stride 1) for a kernel that adds one (its signature names bias[N]), else data NULL;
 *   the epilogue's leaves in the program's order: "full" [L,M,N] packed like out, "row" [N], "col"
 *         [M] (L = 1) and "scalar" [1] (f32; the others of the kernel's dtype), vectors of stride 1;
 *   out   [L,M,N] row-major (strides [M*N, N, 1]).
 * No scalars. M, N, K and L are 1 to INT32_MAX; a stride of a dim of size one is never stepped
 * along and so is free; every tensor's data is 16-byte aligned (a scalar leaf's 4). Each kernel adds
 * its own conditions (CUTLASS's alignment of M, N and K, which splits it takes).
 *
 * Kind "attention": out = softmax(scale · q·kᵀ, masked)·v per (batch, query head). Six tensors:
 *   q       [B,Hq,Tq,D], k and v [B,Hkv,Tk,D] (Hkv divides Hq; query head h reads k/v head
 *           h / (Hq/Hkv), grouped-query attention read in place), out [B,Hq,Tq,D], unit stride along D;
 *   factor  f32 [1] on the device (the scale times it, or over it: scalar power), else data NULL;
 *   lengths i32 [B] on the device, each sequence's key count (keys j >= lengths[b] masked for every
 *           query of batch b; 1 <= lengths[b] <= Tk), for the kernels that take them, else data NULL.
 * Scalars: scale, causal (1: key j > query i masked), power (1 or -1).
 *
 * Kind "conv": out = act(conv2d(x, w) + bias[K] + residual), a 2-D forward convolution (groups 1).
 * Five tensors, sizes in torch's order, laid out channels-last: x [N,C,H,W] strides [H*W*C, 1, W*C, C];
 * w [K,C,R,S] strides [R*S*C, 1, S*C, C]; bias [K] (stride 1) or data NULL, as the kernel's signature
 * says; residual [N,K,P,Q] laid out as out, or data NULL; out [N,K,P,Q] strides [P*Q*K, 1, Q*K, K].
 * Scalars: stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w. */
#ifndef FACT_KERNELS_H
#define FACT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FACT_ABI_VERSION 6
/* Leaf tensors a GEMM's epilogue program may read. */
#define FACT_MAX_LEAVES 4
/* Dims a FactTensor holds. */
#define FACT_MAX_RANK 6

typedef enum FactStatus {
  FACT_OK = 0,
  FACT_BAD_INDEX = 1,
  FACT_CANNOT_IMPLEMENT = 2,
  FACT_WORKSPACE_TOO_SMALL = 3,
  FACT_INIT_FAILED = 4,
  FACT_LAUNCH_FAILED = 5
} FactStatus;

/* FACT_I32 only for index tensors (an attention kernel's key lengths), FACT_BOOL (one byte, nonzero
 * true) only for masks (an attention kernel's bool mask). */
typedef enum FactDtype { FACT_F32 = 0, FACT_BF16 = 1, FACT_F16 = 2, FACT_I32 = 3, FACT_BOOL = 4 } FactDtype;

/* A tensor as a kernel reads it: sizes and strides in elements. */
typedef struct FactTensor {
  void* data;
  /* A FactDtype. */
  int32_t dtype;
  int32_t rank;
  int64_t sizes[FACT_MAX_RANK];
  int64_t strides[FACT_MAX_RANK];
} FactTensor;

/* One call of a kernel: what its signature lists, in that order. */
typedef struct FactOpArgs {
  const FactTensor* tensors;
  int32_t num_tensors;
  const double* scalars;
  int32_t num_scalars;
} FactOpArgs;

/* A GEMM variant's launch knobs: runtime arguments of CUTLASS's schedulers, so variants of one
 * compiled kernel differ only here. The dispatch table holds each variant's and passes them to its
 * kernel beside the caller's FactOpArgs (callers never set them); other kinds' kernels get zeros. */
typedef struct FactKnobs {
  /* K splits: serial split-K (sm80 family) or split-K through the Stream-K scheduler (sm90). */
  int32_t splits;
  /* Tile raster order of the sm90 schedulers: 0 heuristic, 1 along M, 2 along N. */
  int32_t raster;
  /* Tile swizzle of the sm90 schedulers (max_swizzle_size): 1, 2, 4 or 8. */
  int32_t swizzle;
} FactKnobs;

typedef struct FactKernelInfo {
  /* The kernel's identity (Spec::name in Rust; a GEMM variant's adds its knobs): the pattern-table value. */
  const char* name;
  /* The pattern kind: "gemm", "attention" or "layernorm". */
  const char* kind;
  /* What the tensors and scalars are, e.g. "x[R,C] out[R,C] weight[C]? bias[C]? (NULL data when absent); eps". */
  const char* signature;
  /* The spec the kernel was rendered from, as one line of JSON. */
  const char* spec_json;
  /* Element type of the kernel's tensors: "f32", "bf16" or "f16". */
  const char* dtype;
  /* GEMMs: how a and B lie, "rrr" (as in mm), "rcr" (b is [n,k], as in linear), "crr" (a is [k,m]:
   * a.t() @ b) or "ccr" (both); "" for other kinds. */
  const char* layout;
  /* GEMMs: the fused epilogue program (rules::epilogue's text form); "" for none and other kinds. */
  const char* epilogue;
} FactKernelInfo;

int32_t fact_abi_version(void);
int32_t fact_kernel_count(void);
/* NULL for a bad index. */
const FactKernelInfo* fact_kernel_info(int32_t index);
/* The index of the named kernel, or -1. */
int32_t fact_kernel_find(const char* name);
/* FACT_OK when the kernel can run this call, else FACT_CANNOT_IMPLEMENT (FACT_BAD_INDEX for a bad index). */
int32_t fact_kernel_can_implement(int32_t index, const FactOpArgs* args);
/* Bytes of device workspace the call needs, once can_implement has taken it. */
size_t fact_kernel_workspace_size(int32_t index, const FactOpArgs* args);
/* Launches asynchronously on `stream` (a cudaStream_t; NULL is the legacy default stream). */
int32_t fact_kernel_run(int32_t index, const FactOpArgs* args, void* workspace, size_t workspace_size,
                        void* stream);

/* The last CUDA error text seen by this library on this thread, for messages. */
const char* fact_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
