// Rotary embedding of the last dim of [.., .., .., D] tensors: the kernel reads each head of x and
// its position's cos and sin through their strides, and writes out in the layout the graph's own
// ops write (bit `side` of `layout`: packed row-major, else rows in x's order). On CUDA the
// fallback's result is copied into that layout where it lies otherwise (a tensor of another rank:
// packed; frame: kernel_layout); the meta functions run the fallback on Meta tensors.

// The nodes the op replaces, replayed with the same aten ops in the same order: the same numbers
// as the graph on any input.
at::Tensor rotary_ops(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rotary_dim,
                      int64_t form) {
  const int64_t r = rotary_dim;
  const bool whole = x.sym_size(-1) == r;
  const at::Tensor xr = whole ? x : x.slice(-1, 0, r);
  at::Tensor rot;
  if (form == 0) {
    rot = at::cat({at::neg(xr.slice(-1, r / 2)), xr.slice(-1, 0, r / 2)}, -1);
  } else {
    rot = at::stack({at::neg(xr.slice(-1, 1, r, 2)), xr.slice(-1, 0, r, 2)}, -1).flatten(-2, -1);
  }
  const at::Tensor y = at::add(at::mul(xr, cos), at::mul(rot, sin));
  return whole ? y : at::cat({y, x.slice(-1, r)}, -1);
}

// The strides rotary_side gives out for x [.., .., .., D] (`packed`: row-major; else row-major
// in the order of x's strides, the largest outermost), over `y`'s sizes.
c10::SymDimVector rotary_strides(const at::Tensor& x, const at::Tensor& y, bool packed) {
  std::array<int64_t, 4> perm = {0, 1, 2, 3};
  std::stable_sort(perm.begin(), perm.begin() + 3,
                   [&](int64_t a, int64_t b) { return x.sym_stride(a) > x.sym_stride(b); });
  c10::SymDimVector strides(4);
  c10::SymInt step = 1;
  for (int64_t i = 3; i >= 0; --i) {
    const int64_t d = packed ? i : perm[i];
    strides[d] = step;
    step *= y.sym_size(d);
  }
  return strides;
}

// The fallback: the replayed ops' result, on CUDA laid out as the kernel writes out (of a tensor of
// another rank, packed).
at::Tensor rotary_replay(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rotary_dim,
                         int64_t form, bool packed) {
  const at::Tensor y = rotary_ops(x, cos, sin, rotary_dim, form);
  if (!kernel_layout(x)) return y;
  if (x.dim() != 4 || y.dim() != 4) return laid_packed(y);
  return laid_out(y, rotary_strides(x, y, packed));
}

// Why the kernel cannot rotate x by cos and sin, or "" when it can (the op's checks beyond the
// kernel's own).
std::string rotary_refusal(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rotary_dim,
                           int64_t form) {
  if (!x.is_cuda() || cos.device() != x.device() || sin.device() != x.device()) return "not CUDA tensors of one device";
  if (at::GradMode::is_enabled() && (x.requires_grad() || cos.requires_grad() || sin.requires_grad())) {
    return "autograd (the kernel has no backward)";
  }
  if (*dtype_name(x.scalar_type()) == '\0') return "not an f32, bf16 or f16 tensor";
  if (cos.scalar_type() != x.scalar_type() || sin.scalar_type() != x.scalar_type()) return "mixed dtypes";
  if (x.dim() != 4 || x.numel() == 0) return "not a non-empty [.., .., .., D] tensor";
  if (form != 0 && form != 1) return "an unknown form";
  if (rotary_dim < 2 || rotary_dim % 2 != 0 || rotary_dim > x.size(-1)) return "rotary_dim is not even and at most D";
  std::vector<int64_t> rot(x.sizes().begin(), x.sizes().end());
  rot[3] = rotary_dim;
  for (const at::Tensor* t : {&cos, &sin}) {
    if (t->dim() > 4 || t->dim() < 1 || t->size(-1) != rotary_dim) return "cos or sin do not hold rotary_dim elements";
    for (int64_t i = 1; i <= t->dim(); ++i) {
      const int64_t have = t->size(-i), want = rot[4 - i];
      if (have != want && have != 1) return "cos or sin do not broadcast to x";
    }
  }
  return "";
}

// x, cos, sin and out as the kernel reads them: the row dims ordered by x's strides (the largest
// outermost, so consecutive rows are near in memory), cos and sin broadcast to x's rows; and out,
// allocated packed or in x's order. The FactTensors are computed from sizes and strides, as the
// permuted and expanded views would hold them, without making those views: a call would otherwise
// build about ten tensors on the host, which a short kernel waits on.
struct RotarySide {
  at::Tensor out;
  FactTensor x, cos, sin, o;
};

// t's FactTensor as `t.expand(shape).permute(perm)` would give it: at::expand's own geometry (a
// dim that broadcasts, or a new leading dim of size above one, steps by 0), in perm's order.
FactTensor expanded_permuted(const at::Tensor& t, const std::array<int64_t, 4>& shape,
                             const std::array<int64_t, 4>& perm) {
  const auto e = at::inferExpandGeometry_dimvector(t.sizes(), t.strides(), shape);
  FactTensor ft = fact_tensor(t);
  ft.rank = 4;
  for (int64_t i = 0; i < 4; ++i) {
    ft.sizes[i] = e.sizes[perm[i]];
    ft.strides[i] = e.strides[perm[i]];
  }
  return ft;
}

RotarySide rotary_side(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rotary_dim,
                       bool packed) {
  std::array<int64_t, 4> perm = {0, 1, 2, 3};
  std::stable_sort(perm.begin(), perm.begin() + 3, [&](int64_t a, int64_t b) { return x.stride(a) > x.stride(b); });
  const std::array<int64_t, 4> sizes = {x.size(0), x.size(1), x.size(2), x.size(3)};
  std::array<int64_t, 4> rot = sizes;
  rot[3] = rotary_dim;
  // out's strides: packed row-major in x's dims, else row-major in perm's order (x's).
  std::array<int64_t, 4> out_strides{};
  int64_t step = 1;
  for (int64_t i = 3; i >= 0; --i) {
    const int64_t d = packed ? i : perm[i];
    out_strides[d] = step;
    step *= sizes[d];
  }
  RotarySide s;
  s.out = at::empty_strided(sizes, out_strides, x.options());
  s.x = expanded_permuted(x, sizes, perm);
  s.cos = expanded_permuted(cos, rot, perm);
  s.sin = expanded_permuted(sin, rot, perm);
  s.o = expanded_permuted(s.out, sizes, perm);
  return s;
}

// Runs kernel `kernel` on q (and k when defined), or returns false when it does not fit, with the
// reason in `why`.
bool rotary_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                   int64_t rotary_dim, int64_t form, int64_t layout, c10::string_view kernel, at::Tensor& out_q,
                   at::Tensor& out_k, std::string& why) {
  why = rotary_refusal(q, cos, sin, rotary_dim, form);
  if (why.empty() && k.defined()) {
    why = rotary_refusal(k, cos, sin, rotary_dim, form);
    if (why.empty() && (k.device() != q.device() || k.scalar_type() != q.scalar_type() || k.size(-1) != q.size(-1))) {
      why = "q and k differ in device, dtype or head dim";
    }
  }
  if (!why.empty()) return false;
  const int32_t index = find_kernel(kernel);
  if (index < 0) return why = "no op library loaded in this process has the kernel", false;
  const auto* props = at::cuda::getDeviceProperties(q.device().index());
  if (!runs_here(*props)) return why = "not a device of compute capability 9.0 (an sm90 library)", false;
  c10::cuda::CUDAGuard guard(q.device());
  const RotarySide sq = rotary_side(q, cos, sin, rotary_dim, (layout & 1) != 0);
  // Without k (one tensor rotated) its side is absent: zeroed FactTensors, no data, which the
  // kernel reads as "q alone" (a default-initialized one would hold whatever the stack did).
  RotarySide sk{};
  if (k.defined()) sk = rotary_side(k, cos, sin, rotary_dim, (layout & 2) != 0);
  const FactTensor tensors[8] = {sq.x, k.defined() ? sk.x : FactTensor{}, sq.cos, sq.sin,
                                 k.defined() ? sk.cos : FactTensor{},
                                 k.defined() ? sk.sin : FactTensor{}, sq.o, k.defined() ? sk.o : FactTensor{}};
  const FactOpArgs args{tensors, 8, nullptr, 0};
  if (!launch_kernel(index, args, q, kernel, "rotary")) {
    return why = "the kernel cannot implement this head dim, stride or alignment", false;
  }
  out_q = sq.out;
  out_k = sk.out;
  return true;
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rotary_dim, int64_t form,
                  int64_t layout, c10::string_view kernel) {
  std::string why = "rotary is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kRotaryKind)) {
    at::Tensor out, none;
    if (rotary_kernel(x, at::Tensor(), cos, sin, rotary_dim, form, layout, kernel, out, none, why)) {
      count_ran(kernel, false);
      return out;
    }
  }
  count_fell_back(kernel, why);
  return rotary_replay(x, cos, sin, rotary_dim, form, (layout & 1) != 0);
}

at::Tensor rotary_meta(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t rotary_dim,
                       int64_t form, int64_t layout, c10::string_view kernel) {
  return rotary_replay(x, cos, sin, rotary_dim, form, (layout & 1) != 0);
}

std::tuple<at::Tensor, at::Tensor> rotary_qk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                             const at::Tensor& sin, int64_t rotary_dim, int64_t form, int64_t layout,
                                             c10::string_view kernel) {
  std::string why = "rotary is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kRotaryKind)) {
    at::Tensor out_q, out_k;
    if (rotary_kernel(q, k, cos, sin, rotary_dim, form, layout, kernel, out_q, out_k, why)) {
      count_ran(kernel, false);
      return {out_q, out_k};
    }
  }
  count_fell_back(kernel, why);
  return {rotary_replay(q, cos, sin, rotary_dim, form, (layout & 1) != 0),
          rotary_replay(k, cos, sin, rotary_dim, form, (layout & 2) != 0)};
}

std::tuple<at::Tensor, at::Tensor> rotary_qk_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                                  const at::Tensor& sin, int64_t rotary_dim, int64_t form,
                                                  int64_t layout, c10::string_view kernel) {
  return {rotary_replay(q, cos, sin, rotary_dim, form, (layout & 1) != 0),
          rotary_replay(k, cos, sin, rotary_dim, form, (layout & 2) != 0)};
}
