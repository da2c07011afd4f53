// RMSNorm over the last dim: the kernel reads x as [R, C] rows one stride apart. `form` says which
// ops the call replaced, and so what the fallback replays: "rms_norm" (torch's op, eps "None" for
// its default) or the written-out form's rule id (rmsnorm, rmsnorm_weight, rmsnorm_cast_weight,
// rmsnorm_weight1p); eps is the graph's constant as text. On CUDA outputs lie packed, as the kernel
// writes them (frame: kernel_layout); each meta function runs its op's fallback on Meta tensors.

struct RmsForm {
  bool aten = false;
  // 0: no scale, 1: the weight, 2: one plus the weight (the kernel's scalars).
  int scale = 0;
  // The normalized value rounded to x's dtype before the weight multiplies it.
  bool cast_first = false;
};

RmsForm rms_form(c10::string_view text, bool has_weight) {
  const std::string f(text);
  RmsForm r;
  if (f == "rms_norm") {
    r.aten = true;
    r.scale = has_weight ? 1 : 0;
  } else if (f == "rmsnorm_weight") {
    r.scale = 1;
  } else if (f == "rmsnorm_cast_weight") {
    r.scale = 1;
    r.cast_first = true;
  } else if (f == "rmsnorm_weight1p") {
    r.scale = 2;
  } else {
    TORCH_CHECK(f == "rmsnorm", "fact::rmsnorm: unknown form '", f, "' (a rewrite from another fact version?)");
  }
  TORCH_CHECK(r.aten || (r.scale != 0) == has_weight, "fact::rmsnorm: form '", f, "' ",
              has_weight ? "takes no weight" : "needs a weight");
  return r;
}

std::optional<double> rms_eps(c10::string_view text) {
  const std::string s(text);
  if (s == "None") return std::nullopt;
  double eps = 0;
  TORCH_CHECK(parse_number(s, eps), "fact::rmsnorm: eps '", s, "' is not a number");
  return eps;
}

// The replaced nodes, replayed: torch's rms_norm, or the written-out ops in the graph's dtypes and
// order (the square as pow, the normalized value in fp32, the casts where the graph has them).
at::Tensor rmsnorm_ops(const at::Tensor& x, const std::optional<at::Tensor>& weight, const std::optional<double>& eps,
                       const RmsForm& f) {
  if (f.aten) return at::rms_norm_symint(x, c10::SymDimVector{x.sym_size(-1)}, weight, eps);
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor n = xf * at::rsqrt(xf.pow(2).mean({-1}, true) + *eps);
  switch (f.scale) {
    case 1:
      return f.cast_first ? *weight * n.to(x.scalar_type()) : (n * *weight).to(x.scalar_type());
    case 2:
      return (n * (weight->to(at::kFloat) + 1.0)).to(x.scalar_type());
    default:
      return n.to(x.scalar_type());
  }
}

at::Tensor rmsnorm_replay(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                          const std::optional<double>& eps, const RmsForm& f) {
  return kernel_packed(x, rmsnorm_ops(x, weight, eps, f));
}

// Runs kernel `kernel` for the call, or returns an undefined tensor when it does not fit, with the
// reason in `why`; `copied` says whether x was copied into one run of rows first.
at::Tensor rmsnorm_kernel(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                          const std::optional<double>& eps, const RmsForm& f, c10::string_view kernel,
                          std::string& why, bool& copied) {
  const bool has_w = weight.has_value() && weight->defined();
  if (!x.is_cuda() || (has_w && weight->device() != x.device())) return why = "not CUDA tensors of one device", at::Tensor();
  if (at::GradMode::is_enabled() && (x.requires_grad() || (has_w && weight->requires_grad()))) {
    return why = "autograd (the kernel has no backward)", at::Tensor();
  }
  if (x.dim() < 1) return why = "a scalar", at::Tensor();
  if (*dtype_name(x.scalar_type()) == '\0') return why = "not an f32, bf16 or f16 tensor", at::Tensor();
  if (has_w && weight->scalar_type() != x.scalar_type()) return why = "mixed dtypes", at::Tensor();
  const int64_t c = x.size(-1);
  if (x.numel() == 0) return why = "an empty tensor", at::Tensor();
  const int32_t index = find_kernel(kernel);
  if (index < 0) return why = "no op library loaded in this process has the kernel", at::Tensor();
  const auto* props = at::cuda::getDeviceProperties(x.device().index());
  if (!runs_here(*props)) return why = "not a device of compute capability 9.0 (an sm90 library)", at::Tensor();
  // Rows not one stride apart (a norm of each head of q sliced from a fused qkv projection, as
  // Qwen3 and Gemma 3 write it: heads one stride apart, tokens another) are copied into one run
  // first: a copy and the kernel move a fraction of the bytes the replaced ops would.
  c10::cuda::CUDAGuard guard(x.device());
  const std::optional<int64_t> one_stride = row_stride_of(x);
  copied = !one_stride;
  const at::Tensor xr = one_stride ? x : x.contiguous();
  const int64_t row_stride = one_stride ? *one_stride : c;
  const int64_t rows = x.numel() / c;
  at::Tensor out = at::empty(x.sizes(), x.options());
  auto matrix = [&](const at::Tensor& t, int64_t stride) {
    FactTensor ft = fact_tensor(t);
    ft.rank = 2;
    ft.sizes[0] = rows;
    ft.sizes[1] = c;
    ft.strides[0] = stride < 0 ? c : stride;
    ft.strides[1] = t.stride(-1);
    return ft;
  };
  const FactTensor tensors[3] = {matrix(xr, row_stride), matrix(out, c), has_w ? fact_tensor(*weight) : FactTensor{}};
  // torch's rms_norm without eps takes fp32's machine epsilon (its opmath type's for every dtype
  // the kernels take).
  const double scalars[3] = {eps.value_or(std::numeric_limits<float>::epsilon()), static_cast<double>(f.scale),
                             f.cast_first ? 1.0 : 0.0};
  const FactOpArgs args{tensors, 3, scalars, 3};
  if (!launch_kernel(index, args, x, kernel, "rmsnorm")) {
    return why = "the kernel cannot implement this C, stride or alignment", at::Tensor();
  }
  return out;
}

at::Tensor rmsnorm(const at::Tensor& x, const std::optional<at::Tensor>& weight, c10::string_view eps_text,
                   c10::string_view form, c10::string_view kernel) {
  const bool has_w = weight.has_value() && weight->defined();
  const RmsForm f = rms_form(form, has_w);
  const std::optional<double> eps = rms_eps(eps_text);
  TORCH_CHECK(f.aten || eps.has_value(), "fact::rmsnorm: the written-out form '", std::string(form), "' needs eps");
  std::string why = "rmsnorm is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kRmsnormKind)) {
    bool copied = false;
    at::Tensor out = rmsnorm_kernel(x, weight, eps, f, kernel, why, copied);
    if (out.defined()) {
      count_ran(kernel, copied);
      return out;
    }
  }
  count_fell_back(kernel, why);
  return rmsnorm_replay(x, weight, eps, f);
}

at::Tensor rmsnorm_meta(const at::Tensor& x, const std::optional<at::Tensor>& weight, c10::string_view eps_text,
                        c10::string_view form, c10::string_view kernel) {
  const RmsForm f = rms_form(form, weight.has_value() && weight->defined());
  const std::optional<double> eps = rms_eps(eps_text);
  TORCH_CHECK(f.aten || eps.has_value(), "fact::rmsnorm: the written-out form '", std::string(form), "' needs eps");
  return rmsnorm_replay(x, weight, eps, f);
}

// After a residual add (`fact::rmsnorm_add`, and `fact::rmsnorm_add_sum` where the graph reads the
// sum too): s = a + b in the add's dtype, the norm of s cast to the norm's dtype (`dtypes`, the
// frame's ResidualDtypes), the norm as `form` says. The kernel reads a and b (either repeated along
// leading dims) and writes y, and s where asked; a call it does not fit replays the add, the cast and
// the norm.

// Runs kernel `kernel` for the call: y, and s where `with_sum`; undefined tensors when the call does
// not fit it, with the reason in `why`.
std::tuple<at::Tensor, at::Tensor> rmsnorm_add_kernel(const at::Tensor& a, const at::Tensor& b,
                                                      const std::optional<at::Tensor>& weight,
                                                      const std::optional<double>& eps, const RmsForm& f,
                                                      const ResidualDtypes& d, bool with_sum,
                                                      c10::string_view kernel, std::string& why) {
  const auto fail = [&](const char* reason) {
    why = reason;
    return std::make_tuple(at::Tensor(), at::Tensor());
  };
  const bool has_w = weight.has_value() && weight->defined();
  std::vector<int64_t> shape;
  FactTensor rows[2];
  if (!residual_operands(a, b, shape, rows, why)) return std::make_tuple(at::Tensor(), at::Tensor());
  if (has_w && weight->device() != a.device()) return fail("not CUDA tensors of one device");
  if (has_w && at::GradMode::is_enabled() && weight->requires_grad()) return fail("autograd (the kernel has no backward)");
  const int32_t index = find_kernel(kernel);
  if (index < 0) return fail("no op library loaded in this process has the kernel");
  const auto* props = at::cuda::getDeviceProperties(a.device().index());
  if (!runs_here(*props)) return fail("not a device of compute capability 9.0 (an sm90 library)");
  c10::cuda::CUDAGuard guard(a.device());
  const ResidualOutputs o = residual_outputs(a, shape, d, with_sum);
  const FactTensor tensors[5] = {rows[0], rows[1], o.s_rows, o.y_rows, has_w ? fact_tensor(*weight) : FactTensor{}};
  const double scalars[3] = {eps.value_or(std::numeric_limits<float>::epsilon()), static_cast<double>(f.scale),
                             f.cast_first ? 1.0 : 0.0};
  const FactOpArgs args{tensors, 5, scalars, 3};
  if (!launch_kernel(index, args, a, kernel, "rmsnorm_add")) {
    return fail("the kernel cannot implement these dtypes, this C, stride or alignment");
  }
  return {o.y, o.s};
}

// A norm-after-add call read: its form, eps and dtypes.
struct RmsAddCall {
  RmsForm f;
  std::optional<double> eps;
  ResidualDtypes d;
};

RmsAddCall rms_add_call(const std::optional<at::Tensor>& weight, c10::string_view eps_text, c10::string_view form,
                        c10::string_view dtypes) {
  RmsAddCall c{rms_form(form, weight.has_value() && weight->defined()), rms_eps(eps_text),
               residual_dtypes(dtypes, "rmsnorm_add")};
  TORCH_CHECK(c.f.aten || c.eps.has_value(), "fact::rmsnorm_add: the written-out form '", std::string(form),
              "' needs eps");
  return c;
}

// The replayed add, cast and norm: y, and s laid out where the op returns it.
std::tuple<at::Tensor, at::Tensor> rmsnorm_add_replay(const at::Tensor& a, const at::Tensor& b,
                                                      const std::optional<at::Tensor>& weight, const RmsAddCall& c,
                                                      bool with_sum) {
  const at::Tensor s = residual_sum(a, b, c.d.sum);
  return {rmsnorm_replay(s.to(c.d.norm), weight, c.eps, c.f), with_sum ? kernel_packed(a, s) : s};
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_add_call(const at::Tensor& a, const at::Tensor& b,
                                                    const std::optional<at::Tensor>& weight, c10::string_view eps_text,
                                                    c10::string_view form, c10::string_view dtypes,
                                                    c10::string_view kernel, bool with_sum) {
  const RmsAddCall c = rms_add_call(weight, eps_text, form, dtypes);
  const RmsForm& f = c.f;
  const std::optional<double>& eps = c.eps;
  const ResidualDtypes& d = c.d;
  std::string why = "rmsnorm is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kRmsnormKind)) {
    auto out = rmsnorm_add_kernel(a, b, weight, eps, f, d, with_sum, kernel, why);
    if (std::get<0>(out).defined()) {
      count_ran(kernel, false);
      return out;
    }
  }
  count_fell_back(kernel, why);
  return rmsnorm_add_replay(a, b, weight, c, with_sum);
}

at::Tensor rmsnorm_add(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& weight,
                       c10::string_view eps, c10::string_view form, c10::string_view dtypes, c10::string_view kernel) {
  return std::get<0>(rmsnorm_add_call(a, b, weight, eps, form, dtypes, kernel, false));
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_add_sum(const at::Tensor& a, const at::Tensor& b,
                                                   const std::optional<at::Tensor>& weight, c10::string_view eps,
                                                   c10::string_view form, c10::string_view dtypes,
                                                   c10::string_view kernel) {
  return rmsnorm_add_call(a, b, weight, eps, form, dtypes, kernel, true);
}

at::Tensor rmsnorm_add_meta(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& weight,
                            c10::string_view eps, c10::string_view form, c10::string_view dtypes,
                            c10::string_view kernel) {
  return std::get<0>(rmsnorm_add_replay(a, b, weight, rms_add_call(weight, eps, form, dtypes), false));
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_add_sum_meta(const at::Tensor& a, const at::Tensor& b,
                                                        const std::optional<at::Tensor>& weight, c10::string_view eps,
                                                        c10::string_view form, c10::string_view dtypes,
                                                        c10::string_view kernel) {
  return rmsnorm_add_replay(a, b, weight, rms_add_call(weight, eps, form, dtypes), true);
}
