// Convolutions: `fact::conv` runs an implicit-GEMM fprop kernel over channels-last tensors in
// place of a convolution and the eval-mode BatchNorm, residual add and activation after it. It
// takes the graph's own operands (x, the convolution's weight, bias and arguments, the
// BatchNorm's parameters, the residual), which its fallback replays, and the weight and bias
// compose folded the BatchNorm into once (`w_kernel`, KRSC: channels-last), which the kernel
// reads. Where the kernels' 16-byte rows of channels are more than x's (a stem's C = 3), compose
// padded `w_kernel` with zero input channels, and the op pads x to match where it converts it.
// `form` says what the call replaced: the convolution as the graph wrote it ("conv2d", or
// "_convolution:BDCT" with its benchmark, deterministic, cudnn_enabled and allow_tf32 flags as
// 0/1, three of them for the older overload), "bn:EPS:C" (the BatchNorm's eps and cudnn_enabled),
// "act:NAME", and "out:cl" or "out:nchw": the layout the output is handed back in (channels-last
// where every reader takes it, the chain's end otherwise).

struct ConvForm {
  bool conv2d = true;
  std::vector<bool> flags;
  bool bn = false;
  double eps = 1e-5;
  bool bn_cudnn = true;
  std::string act;
  bool out_cl = false;
};

ConvForm conv_form(c10::string_view text) {
  ConvForm f;
  for (const std::string& part : split(std::string(text), ';')) {
    const std::vector<std::string> fields = split(part, ':');
    const std::string& key = fields[0];
    if (key == "conv2d" && fields.size() == 1) {
      f.conv2d = true;
    } else if (key == "_convolution" && fields.size() == 2 && (fields[1].size() == 3 || fields[1].size() == 4)) {
      f.conv2d = false;
      for (char c : fields[1]) {
        TORCH_CHECK(c == '0' || c == '1', "fact::conv: form '", std::string(text), "': flags are 0 or 1");
        f.flags.push_back(c == '1');
      }
    } else if (key == "bn" && fields.size() == 3) {
      f.bn = true;
      TORCH_CHECK(parse_number(fields[1], f.eps), "fact::conv: form '", std::string(text), "': eps is no number");
      f.bn_cudnn = fields[2] == "1";
    } else if (key == "act" && fields.size() == 2) {
      f.act = fields[1];
    } else if (key == "out" && fields.size() == 2 && (fields[1] == "cl" || fields[1] == "nchw")) {
      f.out_cl = fields[1] == "cl";
    } else {
      TORCH_CHECK(false, "fact::conv: unknown part '", part, "' of form '", std::string(text),
                  "' (a rewrite from another fact version?)");
    }
  }
  return f;
}

// The activation the graph applied, by its name in the form.
at::Tensor conv_act(const at::Tensor& y, const std::string& act) {
  if (act.empty()) return y;
  if (act == "relu") return at::relu(y);
  if (act == "silu") return at::silu(y);
  if (act == "hardswish") return at::hardswish(y);
  if (act == "gelu") return at::gelu(y, "none");
  TORCH_CHECK(act == "gelu_tanh", "fact::conv: unknown activation '", act, "' (relu, silu, hardswish, gelu, gelu_tanh)");
  return at::gelu(y, "tanh");
}

// The replaced nodes, as the graph ran them, on the module's own parameters: the convolution in
// the graph's spelling and flags, the BatchNorm in eval mode, the add, the activation (in-place
// forms compute the same values).
at::Tensor conv_replay(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       const std::optional<at::Tensor>& bn_weight, const std::optional<at::Tensor>& bn_bias,
                       const std::optional<at::Tensor>& bn_mean, const std::optional<at::Tensor>& bn_var,
                       const std::optional<at::Tensor>& residual, const ConvForm& f) {
  at::Tensor y;
  if (f.conv2d) {
    y = at::conv2d(x, weight, bias, stride, padding, dilation, groups);
  } else {
    const std::vector<int64_t> output_padding(stride.size(), 0);
    y = f.flags.size() == 4
            ? at::_convolution(x, weight, bias, stride, padding, dilation, false, output_padding, groups, f.flags[0],
                               f.flags[1], f.flags[2], f.flags[3])
            : at::_convolution(x, weight, bias, stride, padding, dilation, false, output_padding, groups, f.flags[0],
                               f.flags[1], f.flags[2]);
  }
  // Momentum does not enter an eval-mode BatchNorm's output.
  if (f.bn) y = at::batch_norm(y, bn_weight, bn_bias, bn_mean, bn_var, false, 0.1, f.eps, f.bn_cudnn);
  if (residual.has_value() && residual->defined()) y = at::add(y, *residual);
  return conv_act(y, f.act);
}

// `t` (a 4-D tensor) as the kernels read it: channels-last and 16-byte aligned, copied into that
// layout where it lies otherwise (`copied` set).
at::Tensor conv_channels_last(const at::Tensor& t, bool& copied) {
  if (t.is_contiguous(at::MemoryFormat::ChannelsLast) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0) {
    return t;
  }
  copied = true;
  at::Tensor c = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::ChannelsLast));
  c.copy_(t);
  return c;
}

// `x` as the kernel reads it with `channels` input channels: where that is x's own, x channels-last
// (`conv_channels_last`); where it is more (the weight compose padded with zero channels), a fresh
// channels-last tensor, x in its first channels and zeros after: a zero channel meets a zero
// weight, so the convolution is the model's. Each channel is written once: the zeros, then x (the
// conversion x would need anyway, made into the wider rows).
at::Tensor conv_input(const at::Tensor& x, int64_t channels, bool& copied) {
  const int64_t c = x.size(1);
  if (c == channels) return conv_channels_last(x, copied);
  copied = true;
  at::Tensor padded = at::empty({x.size(0), channels, x.size(2), x.size(3)},
                                x.options().memory_format(at::MemoryFormat::ChannelsLast));
  padded.narrow(1, c, channels - c).zero_();
  padded.narrow(1, 0, c).copy_(x);
  return padded;
}

// A channels-last tensor as the ABI passes it, its strides the packed NHWC ones (a dim of size
// one may carry any stride in torch; the kernels check the packed ones).
FactTensor conv_tensor(const at::Tensor& t) {
  FactTensor ft = fact_tensor(t);
  const int64_t c = t.size(1), h = t.size(2), w = t.size(3);
  ft.strides[0] = h * w * c;
  ft.strides[1] = 1;
  ft.strides[2] = w * c;
  ft.strides[3] = c;
  return ft;
}

// A conv argument list as two ints (conv2d takes one for both dims), or false.
bool conv_pair(at::IntArrayRef v, int64_t out[2]) {
  if (v.size() == 1) {
    out[0] = out[1] = v[0];
    return true;
  }
  if (v.size() != 2) return false;
  out[0] = v[0];
  out[1] = v[1];
  return true;
}

// Runs kernel `kernel` for the call, or returns an undefined tensor when it does not fit, with the
// reason in `why`; `copied` says whether x (padded or not) or the residual was converted to
// channels-last first, or the output back to NCHW. `in_channels` are the graph's weight's: x must
// have them, and `w` (the kernel's weight) as many or more, zero past them.
at::Tensor conv_kernel(const at::Tensor& x, int64_t in_channels, const at::Tensor& w, const std::optional<at::Tensor>& b,
                       const std::optional<at::Tensor>& residual, at::IntArrayRef stride, at::IntArrayRef padding,
                       at::IntArrayRef dilation, int64_t groups, bool out_cl, c10::string_view kernel,
                       std::string& why, bool& copied) {
  const bool has_b = b.has_value() && b->defined(), has_r = residual.has_value() && residual->defined();
  if (!x.is_cuda() || w.device() != x.device() || (has_b && b->device() != x.device()) ||
      (has_r && residual->device() != x.device())) {
    return why = "not CUDA tensors of one device", at::Tensor();
  }
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || (has_b && b->requires_grad()) ||
                                     (has_r && residual->requires_grad()))) {
    return why = "autograd (the kernel has no backward)", at::Tensor();
  }
  if (*dtype_name(x.scalar_type()) == '\0') return why = "not an f32, bf16 or f16 tensor", at::Tensor();
  if (w.scalar_type() != x.scalar_type() || (has_b && b->scalar_type() != x.scalar_type()) ||
      (has_r && residual->scalar_type() != x.scalar_type())) {
    return why = "mixed dtypes", at::Tensor();
  }
  if (groups != 1) return why = "groups other than 1", at::Tensor();
  int64_t s[2], p[2], d[2];
  if (!conv_pair(stride, s) || !conv_pair(padding, p) || !conv_pair(dilation, d)) {
    return why = "not a 2-D convolution's arguments", at::Tensor();
  }
  if (x.dim() != 4 || w.dim() != 4 || x.size(1) != in_channels || w.size(1) < in_channels) {
    return why = "not a 2-D convolution of x's channels", at::Tensor();
  }
  if (x.numel() == 0) return why = "an empty tensor", at::Tensor();
  const int64_t out_h = (x.size(2) + 2 * p[0] - d[0] * (w.size(2) - 1) - 1) / s[0] + 1;
  const int64_t out_w = (x.size(3) + 2 * p[1] - d[1] * (w.size(3) - 1) - 1) / s[1] + 1;
  if (out_h < 1 || out_w < 1) return why = "an empty output", at::Tensor();
  if (has_r && residual->sizes() != at::IntArrayRef({x.size(0), w.size(0), out_h, out_w})) {
    return why = "a residual of another shape than the output (a broadcast)", at::Tensor();
  }
  const int32_t index = find_kernel(kernel);
  if (index < 0) return why = "no such kernel in this library", at::Tensor();
  const auto* props = at::cuda::getDeviceProperties(x.device().index());
  if (!runs_here(*props)) return why = "not a device of compute capability 9.0 (an sm90 library)", at::Tensor();
  c10::cuda::CUDAGuard guard(x.device());
  bool conv_copied = false;
  const at::Tensor xc = conv_input(x, w.size(1), conv_copied);
  const at::Tensor wc = conv_channels_last(w, conv_copied);
  const at::Tensor rc = has_r ? conv_channels_last(*residual, conv_copied) : at::Tensor();
  at::Tensor out = at::empty({x.size(0), w.size(0), out_h, out_w}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  const FactTensor tensors[5] = {conv_tensor(xc), conv_tensor(wc), has_b ? fact_tensor(*b) : FactTensor{},
                                 has_r ? conv_tensor(rc) : FactTensor{}, conv_tensor(out)};
  const double scalars[6] = {double(s[0]), double(s[1]), double(p[0]), double(p[1]), double(d[0]), double(d[1])};
  const FactOpArgs args{tensors, 5, scalars, 6};
  if (!launch_kernel(index, args, x, kernel, "conv")) {
    return why = "the kernel cannot implement this shape, argument or alignment", at::Tensor();
  }
  copied = conv_copied;
  if (!out_cl) {
    copied = true;
    return out.contiguous();
  }
  return out;
}

at::Tensor conv(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                const std::optional<at::Tensor>& bn_weight, const std::optional<at::Tensor>& bn_bias,
                const std::optional<at::Tensor>& bn_mean, const std::optional<at::Tensor>& bn_var,
                const std::optional<at::Tensor>& residual, const at::Tensor& w_kernel,
                const std::optional<at::Tensor>& b_kernel, c10::string_view form, c10::string_view kernel) {
  const ConvForm f = conv_form(form);
  TORCH_CHECK(!f.bn || (bn_mean.has_value() && bn_mean->defined() && bn_var.has_value() && bn_var->defined()),
              "fact::conv: form '", std::string(form), "' replays a BatchNorm but the call passes no running statistics");
  std::string why = "conv is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kConvKind)) {
    bool copied = false;
    const int64_t in_channels = weight.dim() == 4 ? weight.size(1) : -1;
    at::Tensor out = conv_kernel(x, in_channels, w_kernel, b_kernel, residual, stride, padding, dilation, groups,
                                 f.out_cl, kernel, why, copied);
    if (out.defined()) {
      count_ran(kernel, copied);
      return out;
    }
  }
  count_fell_back(kernel, why);
  at::Tensor y = conv_replay(x, weight, bias, stride, padding, dilation, groups, bn_weight, bn_bias, bn_mean, bn_var,
                             residual, f);
  // The chain's end: a reader that needs torch's default strides gets them, whatever layout x came in.
  return f.out_cl ? y : y.contiguous();
}
