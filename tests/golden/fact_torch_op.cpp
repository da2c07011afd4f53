// generated from templates/torch_op.cpp.hbs; do not edit
// The torch custom op fact::gemm that composed modules call. It runs the named kernel of this
// library when the call fits it (CUDA tensors on an sm90 device, the kernel's dtype, layout and
// bias, CUTLASS's alignment rules) and otherwise falls back to the original aten op, so a composed
// module never computes a different function than the one it replaced.
#include "fact_kernels.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <limits>
#include <string>

namespace {

at::Tensor original(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                    c10::string_view origin) {
  if (origin == "linear") return at::linear(a, b, bias);
  if (origin == "addmm") return at::addmm(*bias, a, b);
  if (origin == "mm") return at::mm(a, b);
  if (origin == "bmm") return at::bmm(a, b);
  return at::matmul(a, b);
}

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "f32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "f16";
    default: return "";
  }
}

bool fits_i32(int64_t v) { return v > 0 && v <= std::numeric_limits<int32_t>::max(); }

at::Tensor gemm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                c10::string_view origin, c10::string_view kernel) {
  auto fallback = [&] { return original(a, b, bias, origin); };
  const bool has_bias = bias.has_value() && bias->defined();
  if (origin != "linear" && origin != "addmm" && origin != "mm" && origin != "bmm" && origin != "matmul") {
    TORCH_CHECK(false, "fact::gemm: unknown origin op '", std::string(origin), "'");
  }
  if (!a.is_cuda() || !b.is_cuda() || a.device() != b.device()) return fallback();
  if (at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad() ||
                                     (has_bias && bias->requires_grad()))) {
    return fallback();  // the kernels have no backward; autograd keeps the original op
  }
  const int32_t index = fact_kernel_find(std::string(kernel).c_str());
  if (index < 0) return fallback();
  const FactKernelInfo* info = fact_kernel_info(index);
  const std::string layout = origin == "linear" ? "rcr" : "rrr";
  if (layout != info->layout || std::string(dtype_name(a.scalar_type())) != info->dtype) return fallback();
  if (b.scalar_type() != a.scalar_type() || b.dim() < 2 || a.dim() < 2) return fallback();
  if (has_bias != (info->bias != 0)) return fallback();
  // Batched: equal leading dims on both sides, folded into the kernel's L.
  const bool batched = b.dim() > 2;
  int64_t batch = 1;
  if (batched) {
    if (layout != "rrr" || has_bias || a.dim() != b.dim()) return fallback();
    for (int64_t d = 0; d < a.dim() - 2; ++d) {
      if (a.size(d) != b.size(d)) return fallback();
      batch *= a.size(d);
    }
  } else if ((origin == "mm" || origin == "bmm") && a.dim() != 2) {
    return fallback();
  }
  const int64_t k = a.size(-1);
  const int64_t n = layout == "rcr" ? b.size(0) : b.size(-1);
  if ((layout == "rcr" ? b.size(1) : b.size(-2)) != k) return fallback();
  if (has_bias && (bias->dim() != 1 || bias->size(0) != n || bias->scalar_type() != a.scalar_type() ||
                   bias->device() != a.device())) {
    return fallback();
  }
  const int64_t m = batched ? a.size(-2) : a.numel() / k;
  if (!fits_i32(m) || !fits_i32(n) || !fits_i32(k) || !fits_i32(batch)) return fallback();
  const auto* props = at::cuda::getDeviceProperties(a.device().index());
  if (props->major != 9 || props->minor != 0) return fallback();

  c10::cuda::CUDAGuard guard(a.device());
  at::Tensor ac = a.contiguous();
  at::Tensor bc = b.contiguous();
  at::Tensor biasc = has_bias ? bias->contiguous() : at::Tensor();
  std::vector<int64_t> out_shape(a.sizes().begin(), a.sizes().end() - 1);
  out_shape.push_back(n);
  at::Tensor out = at::empty(out_shape, a.options());

  FactGemmArgs args{};
  args.m = static_cast<int32_t>(m);
  args.n = static_cast<int32_t>(n);
  args.k = static_cast<int32_t>(k);
  args.batch = static_cast<int32_t>(batch);
  args.a = ac.data_ptr();
  args.b = bc.data_ptr();
  args.bias = has_bias ? biasc.data_ptr() : nullptr;
  args.out = out.data_ptr();
  if (fact_kernel_can_implement(index, &args) != FACT_OK) return fallback();
  const size_t ws_size = fact_kernel_workspace_size(index, &args);
  at::Tensor ws = at::empty({static_cast<int64_t>(ws_size > 0 ? ws_size : 1)}, a.options().dtype(at::kByte));
  const int32_t status = fact_kernel_run(index, &args, ws.data_ptr(), ws_size,
                                         c10::cuda::getCurrentCUDAStream(a.device().index()).stream());
  TORCH_CHECK(status == FACT_OK, "fact::gemm: kernel ", std::string(kernel), " failed with status ", status,
              ": ", fact_last_error());
  return out;
}

}  // namespace

// A fragment that defines the schema only where it is missing: the fact CLI defines it before it
// saves a rewritten graph, and may load this library into the same process afterwards.
TORCH_LIBRARY_FRAGMENT(fact, m) {
  if (!c10::Dispatcher::singleton().findSchema({"fact::gemm", ""}).has_value()) {
    m.def("gemm(Tensor a, Tensor b, Tensor? bias, str origin, str kernel) -> Tensor");
  }
  m.impl("gemm", torch::dispatch(c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(gemm)));
}
