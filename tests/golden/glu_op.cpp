// The gated MLP as one GEMM: `fact::glu` takes the graph's own operands (x, both weights and
// biases), which its fallback replays, and the interleaved weight (and bias) compose made once,
// which the kernel reads.

// The activation the graph applied to the gate, by the name the rewrite passes.
at::Tensor glu_act(const at::Tensor& g, c10::string_view act) {
  if (act == "silu") return at::silu(g);
  if (act == "gelu_tanh") return at::gelu(g, "tanh");
  TORCH_CHECK(act == "gelu", "fact::glu: unknown activation '", std::string(act), "' (silu, gelu_tanh or gelu)");
  return at::gelu(g, "none");
}

// Runs kernel `kernel` for the call, or returns an undefined tensor when it does not fit, with the
// reason in `why`.
at::Tensor glu_kernel(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                      c10::string_view kernel, std::string& why) {
  const bool has_b = b.has_value() && b->defined();
  if (!x.is_cuda() || w.device() != x.device() || (has_b && b->device() != x.device())) {
    return why = "not CUDA tensors of one device", at::Tensor();
  }
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || (has_b && b->requires_grad()))) {
    return why = "autograd (the kernel has no backward)", at::Tensor();
  }
  if (*dtype_name(x.scalar_type()) == '\0') return why = "not an f32, bf16 or f16 tensor", at::Tensor();
  if (w.scalar_type() != x.scalar_type() || (has_b && b->scalar_type() != x.scalar_type())) {
    return why = "mixed dtypes", at::Tensor();
  }
  if (x.dim() < 1 || w.dim() != 2 || x.size(-1) != w.size(1) || w.size(0) % 2 != 0) {
    return why = "x's last dim is not the weights' K", at::Tensor();
  }
  if (!x.is_contiguous() || !w.is_contiguous() || (has_b && !b->is_contiguous())) {
    return why = "an operand that is not packed", at::Tensor();
  }
  if (x.numel() == 0) return why = "an empty tensor", at::Tensor();
  const int32_t index = find_kernel(kernel);
  if (index < 0) return why = "no such kernel in this library", at::Tensor();
  const auto* props = at::cuda::getDeviceProperties(x.device().index());
  if (!runs_here(*props)) return why = "not a device of compute capability 9.0 (an sm90 library)", at::Tensor();
  const int64_t k = x.size(-1), inter = w.size(0) / 2, rows = x.numel() / k;
  c10::cuda::CUDAGuard guard(x.device());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = inter;
  at::Tensor out = at::empty(shape, x.options());
  auto matrix = [](const at::Tensor& t, int64_t r, int64_t c) {
    FactTensor ft = fact_tensor(t);
    ft.rank = 2;
    ft.sizes[0] = r;
    ft.sizes[1] = c;
    ft.strides[0] = c;
    ft.strides[1] = 1;
    return ft;
  };
  const FactTensor tensors[4] = {matrix(x, rows, k), fact_tensor(w), has_b ? fact_tensor(*b) : FactTensor{},
                                 matrix(out, rows, inter)};
  const FactOpArgs args{tensors, 4, nullptr, 0};
  if (!launch_kernel(index, args, x, kernel, "glu")) {
    return why = "the kernel cannot implement this shape or alignment", at::Tensor();
  }
  return out;
}

at::Tensor glu(const at::Tensor& x, const at::Tensor& w_gate, const std::optional<at::Tensor>& b_gate,
               const at::Tensor& w_up, const std::optional<at::Tensor>& b_up, const at::Tensor& w,
               const std::optional<at::Tensor>& b, c10::string_view act, c10::string_view kernel) {
  std::string why = "glu is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kGluKind)) {
    at::Tensor out = glu_kernel(x, w, b, kernel, why);
    if (out.defined()) {
      count_ran(kernel, false);
      return out;
    }
  }
  count_fell_back(kernel, why);
  // The replaced nodes, as the graph ran them.
  return at::mul(glu_act(at::linear(x, w_gate, b_gate), act), at::linear(x, w_up, b_up));
}
