// generated from templates/torch_op.cpp.hbs; do not edit
// The torch custom ops that composed modules call, each pattern kind's in its section below:
//   fact::gemm, fact::gemm_ep, fact::attention, fact::layernorm, fact::layernorm_written, fact::layernorm_add, fact::layernorm_add_sum, fact::rmsnorm, fact::rmsnorm_add, fact::rmsnorm_add_sum, fact::rotary, fact::rotary_qk, fact::glu, fact::patch_conv, fact::conv, fact::grn, fact::linears2, fact::linears3, fact::linears4, fact::memo_get, fact::memo_put
// Each runs the named kernel of this library when the call fits it (CUDA tensors on a device that
// runs sm90, and what its section says) and otherwise falls back to the original aten ops (its
// section says which), so a composed module never computes a different function than the one it
// replaced. FACT_DISABLE=1 in the environment makes every call fall back (FACT_DISABLE=attention,
// epilogue: those kinds' calls); fact_op_stats() counts, per kernel, the calls that ran it, those
// that copied an operand first and those that fell back. The frame around the sections (helpers
// every section uses, the kinds a user turns off, call counts, schemas, registrations) names no
// kind.
//
// Each op is a custom op of full standing, registered per dispatch key: CPU and CUDA run its
// function (the kernel where the call fits, else the fallback); Meta runs its meta function, which
// gives the outputs' sizes, strides and dtypes from the inputs' alone (in SymInts, so symbolic
// sizes pass), what FakeTensor, torch.export, torch.compile and AOTInductor read; Autograd runs the
// function itself where grad mode is on and an input requires grad (no kernel has a backward, so
// every such call falls back to the original ops, which record the graph), else redispatches below
// autograd, so that Fake and Meta tensors reach the meta function and real ones their device's.
// Every output lies in the layout the meta function says, whichever path computed it, since
// torch's compilers plan and check the buffers around an op by it: on CUDA, where a kernel may
// compute it, as the kernel writes it (each section says how; the fallback's result is copied
// into that layout where it lies otherwise); elsewhere as the original ops lay it out (attention's
// says why its is the kernels' everywhere). The frame's memo ops stay CompositeImplicitAutograd
// (codegen::FRAME_OPS says why).
#include "fact_kernels.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/autocast_mode.h>
#include <c10/core/InferenceMode.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

// The attention mask classifier the bridge uses at load, src/torch/mask_class.h as codegen
// inlines it.
// Classifies an attention mask's value: which keys each query sees. One implementation for two
// users: the bridge (bridge.cc) classifies each SDPA mask on the CPU at load, so the graph carries
// the class the rules read, and the op library (templates/torch_op.cpp.hbs, which codegen renders
// with this file's text in it) classifies the mask a call is given, on its device, to decide
// whether the kernel computes the call. Keep it self-contained: ATen only.
//
// Classes (MaskClass in src/graph): none (every key visible), causal (key j visible to query i
// iff j <= i, top-left aligned), padded (j < len[b]: a prefix per sequence, the same for every
// query and head), causal_padded (both), general (anything else, a query with no visible key
// included). What "visible" means depends on how the graph passes the mask (MaskMode).

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

namespace fact_mask {

enum class MaskClass { None, Causal, Padded, CausalPadded, General };

inline const char* class_name(MaskClass c) {
  switch (c) {
    case MaskClass::None: return "none";
    case MaskClass::Causal: return "causal";
    case MaskClass::Padded: return "padded";
    case MaskClass::CausalPadded: return "causal_padded";
    case MaskClass::General: return "general";
  }
  return "general";
}

// How the tensor given marks the visible keys.
enum class MaskMode {
  // SDPA's bool attn_mask: true = visible.
  Bool,
  // SDPA's float attn_mask, added to the scores: 0 = visible; -inf or at most half the dtype's
  // lowest value = masked (HF writes finfo.min); any other value makes the mask general.
  Additive,
  // The explicit form's masked_fill(s, ~x, -inf), masked_fill(s, x == 0, -inf) and
  // masked_fill(s, x, -inf): the filled cells are masked.
  Not,
  Eq0,
  Fill,
};

// Half the lowest finite value of a float dtype: an additive mask value at or below it masks.
// Why half: softmax(s + m) gives key j exactly 0 (fp32's exp underflows below -104) as long as
// m + s_j - s_max < -104; with m <= lowest/2 that holds for any scores that differ by less than
// |lowest|/2 - 104 (1.7e38 in fp32 and bf16, 32648 in fp16), which is every score a finite
// product of q and k in that dtype gives in practice. A bound like -1e30 would miss fp16's
// finfo.min (-65504), the value HF's fp16 masks hold. -1e9 or -10000 masks stay general: exact
// only for bounded scores, so they run torch's SDPA.
inline double masked_bound(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return -65504.0 / 2;
    case at::kBFloat16: return -3.3895313892515355e38 / 2;
    case at::kDouble: return -std::numeric_limits<double>::max() / 2;
    default: return -static_cast<double>(std::numeric_limits<float>::max()) / 2;
  }
}

struct MaskValue {
  MaskClass cls = MaskClass::General;
  // int32 [B] on the mask's device: the keys each sequence sees (j < len[b]), counted in its last
  // query row; under none Tk, under causal min(Tq, Tk), so a padded kernel runs those masks too.
  // Undefined for general.
  at::Tensor lengths;
};

// `mask` as the scores [B, H, Tq, Tk] see it: broadcast from the right, as SDPA and masked_fill
// broadcast it (for q of rank 3, `q_rank` 3, the scores are [B, Tq, Tk], one head), four dims,
// each 1 or the scores' own, a dim of stride 0 (an expand) narrowed to one so it is read once;
// undefined where it does not broadcast so.
inline at::Tensor as_scores(const at::Tensor& mask, int64_t q_rank, int64_t b, int64_t h, int64_t tq, int64_t tk) {
  if (!mask.defined() || tq < 1 || tk < 1 || b < 1 || h < 1 || mask.dim() > q_rank) return at::Tensor();
  at::Tensor m = mask;
  while (m.dim() < q_rank) m = m.unsqueeze(0);
  if (q_rank == 3) m = m.unsqueeze(1);
  if (m.dim() != 4) return at::Tensor();
  const int64_t want[4] = {b, h, tq, tk};
  for (int64_t d = 0; d < 4; ++d) {
    if (m.size(d) != 1 && m.size(d) != want[d]) return at::Tensor();
    if (m.size(d) > 1 && m.stride(d) == 0) m = m.narrow(d, 0, 1);
  }
  return m;
}

// Which cells of a mask `as_scores` gave are visible (`vis`), and where each cell is either
// visible or masked (`valid`, per sequence, [B or 1]): the mode's reading. False where the
// mask's dtype is not the mode's.
inline bool visible(const at::Tensor& m, MaskMode mode, at::Tensor& vis, at::Tensor& valid) {
  valid = at::ones({m.size(0)}, at::TensorOptions().dtype(at::kBool).device(m.device()));
  switch (mode) {
    case MaskMode::Bool:
      if (m.scalar_type() != at::kBool) return false;
      vis = m;
      return true;
    case MaskMode::Additive:
      if (!at::isFloatingType(m.scalar_type())) return false;
      vis = m == 0;
      valid = (vis | (m <= masked_bound(m.scalar_type()))).flatten(1).all(-1);
      return true;
    case MaskMode::Not:
    case MaskMode::Eq0:
    case MaskMode::Fill: {
      const at::Tensor fill = mode == MaskMode::Not ? at::bitwise_not(m) : mode == MaskMode::Eq0 ? at::eq(m, 0) : m;
      if (fill.scalar_type() != at::kBool) return false;
      vis = at::logical_not(fill);
      return true;
    }
  }
  return false;
}

// The keys each sequence sees, counted in the last query row of its first head (`lengths`, [B or
// 1]), and the key-padding prefix of that many keys over the scores (`cells`, [B or 1, 1, 1, Tk],
// keys `j`): a mask, as `visible` reads it, is a padding prefix where its cells equal these.
struct KeyPrefix {
  at::Tensor lengths;
  at::Tensor cells;
};
inline KeyPrefix key_prefix(const at::Tensor& vis, const at::Tensor& j) {
  const at::Tensor lengths = vis.select(2, vis.size(2) - 1).select(1, 0).sum(-1);
  return {lengths, j.view({1, 1, 1, -1}) < lengths.view({-1, 1, 1, 1})};
}

// The class of `mask` as the scores [B, H, Tq, Tk] see it (`as_scores`). A few small ops on the
// mask's device and one host sync (the flags).
inline MaskValue classify(const at::Tensor& mask, MaskMode mode, int64_t q_rank, int64_t b, int64_t h, int64_t tq,
                          int64_t tk) {
  MaskValue general;
  const at::Tensor m = as_scores(mask, q_rank, b, h, tq, tk);
  at::Tensor vis, valid;
  if (!m.defined() || !visible(m, mode, vis, valid)) return general;
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(m.device());
  const at::Tensor j = at::arange(tk, longs);
  const at::Tensor tri = j.view({1, tk}) <= at::arange(tq, longs).view({tq, 1});
  const auto [lengths, prefix] = key_prefix(vis, j);
  const at::Tensor flags = at::stack({valid.all(), vis.all(), at::eq(vis, tri).all(), at::eq(vis, prefix).all(),
                                      at::eq(vis, prefix.logical_and(tri)).all(), (lengths > 0).all()})
                               .to(at::kCPU);
  const bool* f = flags.data_ptr<bool>();
  MaskValue out;
  if (!f[0]) return general;
  if (f[1]) out.cls = MaskClass::None;
  else if (f[2]) out.cls = MaskClass::Causal;
  else if (f[3] && f[5]) out.cls = MaskClass::Padded;
  else if (f[4] && f[5]) out.cls = MaskClass::CausalPadded;
  else return general;
  out.lengths = lengths.to(at::kInt).expand({b}).contiguous();
  return out;
}

// Per sequence, the keys it sees where its mask (`as_scores`) is a key-padding prefix of at least
// one key (none masked counts, as Tk), else -1: int32 [B] on the mask's device, from a few ops
// there and no host sync, so a CUDA graph captures them (a padded kernel given the mask beside
// them reads the cells of a -1 sequence itself). Undefined where the mask does not broadcast to
// the scores or is not of the mode's dtype.
inline at::Tensor prefix_lengths(const at::Tensor& mask, MaskMode mode, int64_t q_rank, int64_t b, int64_t h, int64_t tq,
                                 int64_t tk) {
  const at::Tensor m = as_scores(mask, q_rank, b, h, tq, tk);
  at::Tensor vis, valid;
  if (!m.defined() || !visible(m, mode, vis, valid)) return at::Tensor();
  const at::Tensor j = at::arange(tk, at::TensorOptions().dtype(at::kLong).device(m.device()));
  const auto [lengths, prefix] = key_prefix(vis, j);
  const at::Tensor ok = at::eq(vis, prefix).flatten(1).all(-1).logical_and(valid).logical_and(lengths > 0);
  return at::where(ok, lengths, -1).to(at::kInt).expand({b}).contiguous();
}

}  // namespace fact_mask

namespace {

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "f32";
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "f16";
    default: return "";
  }
}

bool fits_i32(int64_t v) { return v > 0 && v <= std::numeric_limits<int32_t>::max(); }

// A dtype by the name fact gives it ("f32", "bf16", "f16"); false for another name.
bool parse_dtype(const std::string& name, at::ScalarType& out) {
  for (at::ScalarType t : {at::kFloat, at::kBFloat16, at::kHalf}) {
    if (name == dtype_name(t)) return out = t, true;
  }
  return false;
}

// Whether the device runs every kernel of this sm90 library: compute capability 9.0.
bool runs_here(const cudaDeviceProp& props) { return (props.major == 9 && props.minor == 0); }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}

bool parse_index(const std::string& s, size_t& out) {
  if (s.empty() || s.size() > 9) return false;
  out = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + static_cast<size_t>(c - '0');
  }
  return true;
}

// Numbers are printed by Rust's {:?} (0.5, 3.0, 1e-5, inf, -inf, nan), all of which strtod reads.
bool parse_number(const std::string& s, double& out) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

// A text's hash (FNV-1a), for the per-text caches below.
uint64_t text_hash(c10::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// `parse(text)`, kept per text (by content, as find_kernel's names) and per thread: an op's form
// or dtypes are the same few constant strings on every forward, parsed once each. A text that
// fails to parse (parse throws) is not kept.
template <class T, class Parse>
T parsed(c10::string_view text, Parse parse) {
  struct Slot {
    std::string text;
    std::optional<T> value;
  };
  constexpr size_t kSlots = 64;
  thread_local Slot slots[kSlots];
  Slot& s = slots[text_hash(text) % kSlots];
  if (s.value.has_value() && c10::string_view(s.text) == text) return *s.value;
  T value = parse(text);
  s.text = std::string(text);
  s.value = value;
  return value;
}

// A kernel operand names one kernel, or two by the call's rows (compose's small rows):
// "SMALL@R;KERNEL" runs SMALL on a call of at most R rows and KERNEL on the others; a SMALL of
// "torch" runs torch's ops there, which measured faster at those rows. Kernel names hold no '@'.
struct ByRows {
  size_t small_end = 0, kernel_at = 0;
  int64_t upto = 0;
};

ByRows read_by_rows(c10::string_view text) {
  const std::string s(text);
  const size_t at = s.find('@'), semi = s.find(';', at);
  size_t upto = 0;
  TORCH_CHECK(at > 0 && semi != std::string::npos && semi + 1 < s.size() &&
                  parse_index(s.substr(at + 1, semi - at - 1), upto),
              "fact: malformed kernel operand '", s, "' (a kernel's name, or SMALL@ROWS;KERNEL)");
  return {at, semi + 1, static_cast<int64_t>(upto)};
}

// The rows of x [.., K], the product of its leading dims; past any bound where its sizes are
// symbolic (a compiler's trace, which never runs a kernel).
int64_t rows_of(const at::Tensor& x) {
  if (x.dim() < 1) return 0;
  const std::optional<int64_t> n = x.sym_numel().maybe_as_int(), k = x.sym_size(-1).maybe_as_int();
  if (!n.has_value() || !k.has_value()) return std::numeric_limits<int64_t>::max();
  return *k > 0 ? *n / *k : 0;
}

// The kernel, or "torch", that runs a call of `rows` rows.
c10::string_view kernel_at_rows(c10::string_view text, int64_t rows) {
  if (text.find('@') == c10::string_view::npos) return text;
  const ByRows b = parsed<ByRows>(text, read_by_rows);
  return rows <= b.upto ? text.substr(0, b.small_end) : text.substr(b.kernel_at);
}

// The kernel, or "torch", that runs a call whose rows are x's (`rows_of`).
c10::string_view kernel_for_rows(c10::string_view text, const at::Tensor& x) {
  if (text.find('@') == c10::string_view::npos) return text;
  return kernel_at_rows(text, rows_of(x));
}

// The kernel operand's name for the op's counters: the kernel of calls of any rows.
c10::string_view kernel_counted(c10::string_view text) {
  return kernel_at_rows(text, std::numeric_limits<int64_t>::max());
}

// The name a call that did not run `run` (the kernel its rows chose, or "torch") falls back
// under: torch's choice counts under the operand's kernel of calls of any rows.
c10::string_view fell_back_as(c10::string_view run, c10::string_view kernel) {
  return run == "torch" ? kernel_counted(kernel) : run;
}

// A tensor as a kernel reads it (include/fact_kernels.h): its data, dtype, sizes and strides.
FactTensor fact_tensor(const at::Tensor& t) {
  FactTensor ft{};
  ft.data = t.data_ptr();
  // Another dtype (f64) is none of FactDtype's, so no kernel's check takes it for one.
  const at::ScalarType s = t.scalar_type();
  ft.dtype = s == at::kFloat      ? FACT_F32
             : s == at::kBFloat16 ? FACT_BF16
             : s == at::kHalf     ? FACT_F16
             : s == at::kInt      ? FACT_I32   // an attention kernel's key lengths
             : s == at::kBool     ? FACT_BOOL  // an attention kernel's bool mask
                                  : -1;
  ft.rank = static_cast<int32_t>(t.dim());
  for (int64_t i = 0; i < t.dim() && i < FACT_MAX_RANK; ++i) {
    ft.sizes[i] = t.size(i);
    ft.strides[i] = t.stride(i);
  }
  return ft;
}

// Strides of a packed row-major tensor of `sizes`.
c10::SymDimVector packed_strides(c10::SymIntArrayRef sizes) {
  c10::SymDimVector strides(sizes.size());
  c10::SymInt step = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = step;
    step *= sizes[d];
  }
  return strides;
}

// `t` in the layout of `strides` (an op's outputs' layout, as its meta function gives it): itself
// where its strides are those on every dim of more than one element (a dim of one is never
// stepped), else a copy laid out so. Symbolic sizes compare as torch's shape environment decides.
at::Tensor laid_out(const at::Tensor& t, c10::SymIntArrayRef strides) {
  bool same = t.dim() == static_cast<int64_t>(strides.size());
  for (int64_t d = 0; same && d < t.dim(); ++d) {
    same = t.sym_size(d) == 1 || t.sym_stride(d) == strides[d];
  }
  if (same) return t;
  return at::empty_strided_symint(t.sym_sizes(), strides, t.options()).copy_(t);
}

// `t` packed row-major (torch's contiguous), the layout most kernels write.
at::Tensor laid_packed(const at::Tensor& t) { return laid_out(t, packed_strides(t.sym_sizes())); }

// Whether an op's outputs lie as its kernels write them, from one of its inputs: on CUDA (a CUDA
// tensor, or a Fake one of a CUDA device, whose dispatch keys name that device even as the meta
// function sees it). Elsewhere no kernel runs, and the outputs lie as the original ops lay them
// out, so that a composed module computes there what the module it replaced did, bit for bit, the
// ops after it included.
bool kernel_layout(const at::Tensor& input) {
  return input.is_cuda() || input.key_set().has(c10::DispatchKey::CUDA);
}

// `t` packed where the op's outputs lie as its kernels write them (`kernel_layout(input)`), else
// as it is.
at::Tensor kernel_packed(const at::Tensor& input, const at::Tensor& t) {
  return kernel_layout(input) ? laid_packed(t) : t;
}

// The stride between x's rows as a norm kernel reads them (its leading dims as one; dims of size
// one have no say), -1 for one row, or nullopt when the rows are not one stride apart.
std::optional<int64_t> row_stride_of(const at::Tensor& x) {
  int64_t row_stride = -1, next = 0;
  for (int64_t d = x.dim() - 2; d >= 0; --d) {
    if (x.size(d) == 1) continue;
    if (row_stride < 0) {
      row_stride = next = x.stride(d);
    } else if (x.stride(d) != next) {
      return std::nullopt;
    }
    next *= x.size(d);
  }
  return row_stride;
}

// `t` broadcast to `shape` along its leading dims as a kernel reads an operand's rows: [O,I,C], row
// r at (r / I) * strides[0] + (r % I) * strides[1] (a repeated row has stride 0); false where its
// rows need more than two strides.
bool rows_in_two_strides(const at::Tensor& t, at::IntArrayRef shape, FactTensor& out) {
  const at::Tensor e = t.expand(shape);
  if (e.dim() < 1) return false;
  // (size, stride) of the leading dims, innermost first, a dim merged into the one inside it where
  // it steps over all of that one's rows; dims of size one have no say.
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int64_t d = e.dim() - 2; d >= 0; --d) {
    if (e.size(d) == 1) continue;
    if (!dims.empty() && e.stride(d) == dims.back().first * dims.back().second) {
      dims.back().first *= e.size(d);
    } else {
      dims.emplace_back(e.size(d), e.stride(d));
    }
  }
  if (dims.size() > 2) return false;
  dims.resize(2, {1, 0});
  out = fact_tensor(e);
  out.rank = 3;
  out.sizes[0] = dims[1].first;
  out.sizes[1] = dims[0].first;
  out.sizes[2] = e.size(-1);
  out.strides[0] = dims[1].second;
  out.strides[1] = dims[0].second;
  out.strides[2] = e.stride(-1);
  return true;
}

// The residual add before a norm (the norm kinds' ops after an add): its dtypes as the op gets them,
// "<sum>,<norm>" (the add's dtype, and the norm's, which reads the sum cast to it).
struct ResidualDtypes {
  at::ScalarType sum, norm;
};

ResidualDtypes residual_dtypes(c10::string_view text, const char* op) {
  return parsed<ResidualDtypes>(text, [op](c10::string_view text) {
    const std::vector<std::string> parts = split(std::string(text), ',');
    ResidualDtypes d{};
    TORCH_CHECK(parts.size() == 2 && parse_dtype(parts[0], d.sum) && parse_dtype(parts[1], d.norm), "fact::", op,
                ": dtypes '", std::string(text), "' are not <sum>,<norm> (a rewrite from another fact version?)");
    return d;
  });
}

// The add as the graph computes it: each operand cast to the sum's dtype (exact where that widens, as
// type promotion does), then torch's add.
at::Tensor residual_sum(const at::Tensor& a, const at::Tensor& b, at::ScalarType sum) {
  return at::add(a.to(sum), b.to(sum));
}

// The add's operands as a norm kernel reads them: `shape` their broadcast shape, `rows` a and b as
// rows of two strides over it; false, with the reason in `why`, where a call does not fit such a
// kernel (the caller falls back).
bool residual_operands(const at::Tensor& a, const at::Tensor& b, std::vector<int64_t>& shape, FactTensor (&rows)[2],
                       std::string& why) {
  if (!a.is_cuda() || b.device() != a.device()) return why = "not CUDA tensors of one device", false;
  if (at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad())) {
    return why = "autograd (the kernel has no backward)", false;
  }
  if (a.dim() < 1 || b.dim() < 1) return why = "a scalar", false;
  shape = at::infer_size(a.sizes(), b.sizes());
  if (a.size(-1) != shape.back() || b.size(-1) != shape.back()) {
    return why = "an operand repeated along the normalized dim", false;
  }
  if (c10::multiply_integers(shape) == 0) return why = "an empty tensor", false;
  if (!rows_in_two_strides(a, shape, rows[0]) || !rows_in_two_strides(b, shape, rows[1])) {
    return why = "an operand's rows are not two strides", false;
  }
  return true;
}

// A norm-after-add call's outputs over the operands' broadcast `shape`, on `like`'s device: y in
// the norm's dtype and, where the graph reads it (`with_sum`), s in the add's; each with the
// kernel's packed [rows, C] view of it (s's NULL without it).
struct ResidualOutputs {
  at::Tensor y, s;
  FactTensor y_rows{}, s_rows{};
};

ResidualOutputs residual_outputs(const at::Tensor& like, const std::vector<int64_t>& shape, const ResidualDtypes& d,
                                 bool with_sum) {
  const int64_t c = shape.back();
  const int64_t n = c10::multiply_integers(shape) / c;
  auto matrix = [&](const at::Tensor& t) {
    FactTensor ft = fact_tensor(t);
    ft.rank = 2;
    ft.sizes[0] = n;
    ft.sizes[1] = c;
    ft.strides[0] = c;
    ft.strides[1] = 1;
    return ft;
  };
  ResidualOutputs o;
  o.y = at::empty(shape, like.options().dtype(d.norm));
  o.y_rows = matrix(o.y);
  if (with_sum) {
    o.s = at::empty(shape, like.options().dtype(d.sum));
    o.s_rows = matrix(o.s);
  }
  return o;
}

// Kernels of the other fact op libraries in this process. torch keeps one kernel per op and
// dispatch key, the last library's to register, and Inductor's C++ wrappers bind an op's C shim to
// the first library made global: so when a process loads two compositions' libraries, one
// library's op code serves both. A kernel's name is its identity, so a name missing from this
// library's table is looked up in every other loaded library of this ABI (each found by its
// exported table functions, whichever way it was opened) and run from there. A kernel's handle is
// its index in this table, or kForeign plus its place among the foreign kernels found so far.
struct ForeignTable {
  int32_t (*find)(const char*);
  const FactKernelInfo* (*info)(int32_t);
  size_t (*workspace_size)(int32_t, const FactOpArgs*);
  int32_t (*run)(int32_t, const FactOpArgs*, void*, size_t, void*);
  const char* (*last_error)();
  // The owner's call counters (`fact_op_count`); null in a library built before they existed.
  void (*count)(const char*, int32_t, const char*);
};
struct ForeignKernel {
  const ForeignTable* table;
  int32_t index;
};
constexpr int32_t kForeign = 1 << 30;
constexpr int32_t kMaxForeign = 4096;
std::mutex foreign_mutex;
ForeignKernel foreign_kernels[kMaxForeign];
std::atomic<int32_t> foreign_count{0};
// Under foreign_mutex: handles by name, the names no library held at the last scan, and how many
// objects the process had loaded then (a new library warrants a new scan).
std::unordered_map<std::string, int32_t> foreign_by_name;
std::vector<std::unique_ptr<ForeignTable>> foreign_tables;
unsigned long long scanned_adds = 0;

// How many objects the process has loaded so far (the loader's count, which only grows).
unsigned long long objects_added() {
  unsigned long long adds = 0;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t size, void* data) {
        if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds)) {
          *static_cast<unsigned long long*>(data) = info->dlpi_adds;
        }
        return 1;
      },
      &adds);
  return adds;
}

// The other fact libraries of this ABI loaded now, each once (by its find function).
void scan_foreign_tables() {
  scanned_adds = objects_added();
  std::vector<std::string> paths;
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name != nullptr && info->dlpi_name[0] != '\0') {
          static_cast<std::vector<std::string>*>(data)->push_back(info->dlpi_name);
        }
        return 0;
      },
      &paths);
  for (const std::string& path : paths) {
    // Already open: RTLD_NOLOAD opens nothing new, and the handle is kept with the table.
    void* h = dlopen(path.c_str(), RTLD_NOLOAD | RTLD_LAZY);
    if (h == nullptr) continue;
    auto find = reinterpret_cast<int32_t (*)(const char*)>(dlsym(h, "fact_kernel_find"));
    auto abi = reinterpret_cast<int32_t (*)()>(dlsym(h, "fact_abi_version"));
    const bool mine = find == &fact_kernel_find;
    const bool known = std::any_of(foreign_tables.begin(), foreign_tables.end(),
                                   [&](const std::unique_ptr<ForeignTable>& t) { return t->find == find; });
    if (find == nullptr || abi == nullptr || mine || known || abi() != FACT_ABI_VERSION) {
      dlclose(h);
      continue;
    }
    auto t = std::make_unique<ForeignTable>();
    t->find = find;
    t->info = reinterpret_cast<const FactKernelInfo* (*)(int32_t)>(dlsym(h, "fact_kernel_info"));
    t->workspace_size = reinterpret_cast<size_t (*)(int32_t, const FactOpArgs*)>(dlsym(h, "fact_kernel_workspace_size"));
    t->run = reinterpret_cast<int32_t (*)(int32_t, const FactOpArgs*, void*, size_t, void*)>(dlsym(h, "fact_kernel_run"));
    t->last_error = reinterpret_cast<const char* (*)()>(dlsym(h, "fact_last_error"));
    t->count = reinterpret_cast<void (*)(const char*, int32_t, const char*)>(dlsym(h, "fact_op_count"));
    if (t->info == nullptr || t->workspace_size == nullptr || t->run == nullptr || t->last_error == nullptr) {
      dlclose(h);
      continue;
    }
    foreign_tables.push_back(std::move(t));
  }
}

// The handle of a kernel no entry of this table names, -1 where no other library has it either.
int32_t find_foreign_kernel(const std::string& name) {
  std::lock_guard<std::mutex> lock(foreign_mutex);
  const auto seen = foreign_by_name.find(name);
  if (seen != foreign_by_name.end() && seen->second >= 0) return seen->second;
  // A name found nowhere is looked for again only once the process has loaded another object.
  const unsigned long long adds = objects_added();
  if (seen != foreign_by_name.end() && adds == scanned_adds) return -1;
  if (adds != scanned_adds) scan_foreign_tables();
  int32_t handle = -1;
  for (const auto& t : foreign_tables) {
    const int32_t index = t->find(name.c_str());
    const int32_t n = foreign_count.load(std::memory_order_relaxed);
    if (index < 0 || n >= kMaxForeign) continue;
    foreign_kernels[n] = ForeignKernel{t.get(), index};
    foreign_count.store(n + 1, std::memory_order_release);
    handle = kForeign + n;
    break;
  }
  foreign_by_name[name] = handle;
  return handle;
}

const ForeignKernel* foreign_kernel(int32_t handle) {
  const int32_t n = handle - kForeign;
  return handle >= kForeign && n < foreign_count.load(std::memory_order_acquire) ? &foreign_kernels[n] : nullptr;
}

// What a handle's table says of its kernel (null for none), and the table's run functions.
const FactKernelInfo* kernel_info(int32_t handle) {
  if (const ForeignKernel* f = foreign_kernel(handle)) return f->table->info(f->index);
  return fact_kernel_info(handle);
}

size_t kernel_workspace_size(int32_t handle, const FactOpArgs* args) {
  if (const ForeignKernel* f = foreign_kernel(handle)) return f->table->workspace_size(f->index, args);
  return fact_kernel_workspace_size(handle, args);
}

int32_t kernel_run(int32_t handle, const FactOpArgs* args, void* ws, size_t ws_size, void* stream) {
  if (const ForeignKernel* f = foreign_kernel(handle)) return f->table->run(f->index, args, ws, ws_size, stream);
  return fact_kernel_run(handle, args, ws, ws_size, stream);
}

const char* kernel_last_error(int32_t handle) {
  if (const ForeignKernel* f = foreign_kernel(handle)) return f->table->last_error();
  return fact_last_error();
}

// The handle of kernel `name` (this table's index, or a foreign kernel's), -1 for none. A composed
// module calls each op with the same constant strings on every forward, so the answer is kept per
// name; by its content, not its address, since a call from Python (torch.compile's wrapper, an
// exported program) hands the op a new copy of each string every time. The table's own lookup
// compares names one by one.
int32_t find_kernel(c10::string_view name) {
  struct Slot {
    uint64_t hash = 0;
    int32_t index = -1;
  };
  constexpr size_t kSlots = 256;
  thread_local Slot slots[kSlots];
  const uint64_t h = text_hash(name);
  Slot& s = slots[h % kSlots];
  if (s.index >= 0 && s.hash == h) {
    const char* kept = kernel_info(s.index)->name;
    if (std::strncmp(kept, name.data(), name.size()) == 0 && kept[name.size()] == '\0') return s.index;
  }
  const std::string text(name);
  int32_t index = fact_kernel_find(text.c_str());
  if (index < 0) index = find_foreign_kernel(text);
  if (index >= 0) s = Slot{h, index};
  return index;
}

// Launches kernel `index` on the current stream of `like`'s device, its workspace from torch's
// allocator; false when the kernel cannot implement the call (the op falls back).
bool launch_kernel(int32_t index, const FactOpArgs& args, const at::Tensor& like, c10::string_view kernel,
                   const char* op) {
  // The host path is per call and the GPU waits on it after a short kernel, so it is kept short:
  // no separate can_implement (run checks the call before it launches anything and says
  // FACT_CANNOT_IMPLEMENT), and no workspace allocation where the kernel needs none.
  const size_t ws_size = kernel_workspace_size(index, &args);
  at::Tensor ws;
  if (ws_size > 0) ws = at::empty({static_cast<int64_t>(ws_size)}, like.options().dtype(at::kByte));
  const int32_t status = kernel_run(index, &args, ws_size > 0 ? ws.data_ptr() : nullptr, ws_size,
                                         c10::cuda::getCurrentCUDAStream(like.device().index()).stream());
  if (status == FACT_CANNOT_IMPLEMENT) return false;
  TORCH_CHECK(status == FACT_OK, "fact::", op, ": kernel ", std::string(kernel), " failed with status ", status,
              ": ", kernel_last_error(index));
  return true;
}

// The pattern kinds a user or fact bench can turn off, so their calls run the original ops:
// FACT_DISABLE=1 (or "all") in the environment turns every kind off (and the memo: "memo"), FACT_DISABLE=attention,epilogue
// the kinds named (read once per process); fact_disable() sets the same at run time.
enum KindBit : unsigned { kGemmKind = 1, kEpilogueKind = 2, kAttentionKind = 4, kLayernormKind = 8, kRmsnormKind = 16, kRotaryKind = 32, kGluKind = 64, kPatchKind = 128, kConvKind = 256, kGrnKind = 512, kSiblingsKind = 1024, kMemoKind = 2048, kAllKinds = 4095 };

// The bits of a comma-separated list of kind names; false on a name that is no kind.
bool parse_kinds(const std::string& text, unsigned& bits) {
  bits = 0;
  for (const std::string& name : split(text, ',')) {
    if (name == "gemm") bits |= kGemmKind;
    else if (name == "epilogue") bits |= kEpilogueKind;
    else if (name == "attention") bits |= kAttentionKind;
    else if (name == "layernorm") bits |= kLayernormKind;
    else if (name == "rmsnorm") bits |= kRmsnormKind;
    else if (name == "rotary") bits |= kRotaryKind;
    else if (name == "glu") bits |= kGluKind;
    else if (name == "patch") bits |= kPatchKind;
    else if (name == "conv") bits |= kConvKind;
    else if (name == "grn") bits |= kGrnKind;
    else if (name == "siblings") bits |= kSiblingsKind;
    else if (name == "memo") bits |= kMemoKind;
    else if (name == "all" || name == "1") bits |= kAllKinds;
    else if (!name.empty()) return false;
  }
  return true;
}

std::atomic<unsigned>& disabled_kinds() {
  static std::atomic<unsigned> bits{[] {
    const char* v = std::getenv("FACT_DISABLE");
    if (v == nullptr || *v == '\0' || std::string(v) == "0") return 0u;
    unsigned b = 0;
    if (!parse_kinds(v, b)) {
      // Safer to run torch's ops everywhere than to guess which kind was meant.
      std::fprintf(stderr, "fact: FACT_DISABLE=%s names no pattern kind (gemm, epilogue, attention, layernorm, rmsnorm, rotary, glu, patch, conv, grn, siblings, memo, all); every fact op falls back\n", v);
      return unsigned(kAllKinds);
    }
    return b;
  }()};
  return bits;
}

// Set while this thread runs an op for autograd (`Registered::autograd`): no kernel has a backward,
// so every kind is off and each call falls back to the original ops, which record the graph.
thread_local bool for_autograd = false;

bool disabled(unsigned kind) {
  return for_autograd || (disabled_kinds().load(std::memory_order_relaxed) & kind) != 0;
}

// Calls per kernel: how many ran it (of those, how many on a copied operand) and how many fell
// back to the original ops (with the reason of the last fallback, where the op knows it).
struct Counts {
  uint64_t ran = 0, copied = 0, fell_back = 0, torch = 0;
  std::string why;
};
std::mutex stats_mutex;
// Fallbacks (and their reasons) by kernel name; calls that ran are counted per table entry below.
std::map<std::string, Counts> stats;

// The calls that ran each kernel of the table, by index: counted without a lock or a string on the
// path every call takes.
struct RanCounts {
  std::atomic<uint64_t> ran{0}, copied{0};
};

RanCounts* ran_counts() {
  static const std::unique_ptr<RanCounts[]> counts(new RanCounts[std::max<int32_t>(fact_kernel_count(), 1)]);
  return counts.get();
}

// A call of a foreign kernel (`find_kernel`) counts in its own library's counters, where a caller
// of `fact_op_stats` on that library (its composition's) looks; what a library built before those
// counters existed cannot take counts here, by name.
enum CountWhat : int32_t { kCountRan = 0, kCountRanCopied = 1, kCountFellBack = 2, kCountTorch = 3 };
bool counted_by_owner(int32_t index, c10::string_view kernel, CountWhat what, const std::string& why) {
  const ForeignKernel* f = foreign_kernel(index);
  if (f == nullptr || f->table->count == nullptr) return false;
  f->table->count(std::string(kernel).c_str(), what, why.c_str());
  return true;
}

void count_ran(c10::string_view kernel, bool copied) {
  const int32_t index = find_kernel(kernel);
  if (counted_by_owner(index, kernel, copied ? kCountRanCopied : kCountRan, "")) return;
  if (index < 0 || index >= kForeign) {
    // Not a kernel of the table (no op gets here): counted by name.
    std::lock_guard<std::mutex> lock(stats_mutex);
    Counts& c = stats[std::string(kernel)];
    c.ran += 1;
    if (copied) c.copied += 1;
    return;
  }
  RanCounts& c = ran_counts()[index];
  c.ran.fetch_add(1, std::memory_order_relaxed);
  if (copied) c.copied.fetch_add(1, std::memory_order_relaxed);
}

// A call of few rows that ran torch's ops by its kernel operand's choice (`kernel_at_rows`):
// no fallback, the op did what compose measured fastest.
void count_torch(c10::string_view kernel) {
  if (counted_by_owner(find_kernel(kernel), kernel, kCountTorch, "")) return;
  std::lock_guard<std::mutex> lock(stats_mutex);
  stats[std::string(kernel)].torch += 1;
}

void count_fell_back(c10::string_view kernel, const std::string& why = "") {
  const std::string reason = for_autograd ? "autograd (the kernel has no backward)" : why;
  if (counted_by_owner(find_kernel(kernel), kernel, kCountFellBack, reason)) return;
  std::lock_guard<std::mutex> lock(stats_mutex);
  Counts& c = stats[std::string(kernel)];
  c.fell_back += 1;
  if (!reason.empty()) c.why = reason;
}

// ---------------------------------------------------------------------------------------------
// Values a forward computes from its inputs' shapes and the module's buffers and parameters alone
// (the causal mask, the rotary cos and sin, a position bias gathered from its table), kept per
// key: compose wraps such a subgraph in
// `if memo_get(..) is empty: values = memo_put(.., <the subgraph>)`, so a forward at shapes seen
// before issues none of its ops. The key is everything the subgraph's values can depend on: the
// metadata of the tensors it reads only the shapes of, the identity, version counter (bumped by
// every in-place write) and layout of each buffer and parameter it reads, and the modes that change
// what ops compute (grad, inference, autocast, reduced-precision math). An entry holds its state
// tensors, so no other tensor can take their addresses while it lives.
//
// The stream is not in the key: a server warms up on one stream and captures a CUDA graph on
// another (torch.cuda.graph's own), and the capture must hit, since a miss would run the subgraph
// inside the graph (a model that builds its position indices on the CPU and copies them to the GPU
// cannot be captured at all). A call on another stream than the values were computed on orders
// itself after them through the entry's event; a capture cannot wait on an event recorded outside
// it, so it takes the values only where that event has completed (torch.cuda.graph synchronizes
// the device before it captures) and otherwise computes them in the graph. Values a capture reads
// are kept for good: the graph holds their addresses.
struct MemoEntry {
  std::vector<int64_t> key;
  std::vector<at::Tensor> state, values;
  std::optional<c10::cuda::CUDAStream> stream;  // where the values were computed, for values on a GPU
  std::shared_ptr<at::cuda::CUDAEvent> done;    // recorded there after them
  bool captured = false;                        // read by a CUDA graph: never dropped
};
constexpr size_t kMemoEntries = 8;  // per site: the shapes a server cycles through
std::mutex memo_mutex;
std::unordered_map<int64_t, std::vector<MemoEntry>> memo_sites;

void key_metadata(const at::Tensor& t, std::vector<int64_t>& key) {
  key.push_back(t.defined());
  if (!t.defined()) return;
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(static_cast<int64_t>(t.layout()));
  key.push_back(static_cast<int64_t>(t.device().type()));
  key.push_back(t.device().index());
  key.push_back(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) key.push_back(t.size(d));
  if (t.layout() == at::kStrided) {
    for (int64_t d = 0; d < t.dim(); ++d) key.push_back(t.stride(d));
    key.push_back(t.storage_offset());
  }
}

// The key of a call, or false where the values must not be kept: memo turned off, or autograd
// recording through a buffer or parameter that requires grad (a kept value would cut the graph).
bool memo_key(const std::vector<at::Tensor>& shapes, const std::vector<at::Tensor>& state, std::vector<int64_t>& key) {
  if (disabled(kMemoKind)) return false;
  const bool grad = at::GradMode::is_enabled();
  for (const at::Tensor& t : state) {
    if (grad && t.defined() && t.requires_grad()) return false;
  }
  const at::Context& ctx = at::globalContext();
  key = {grad, c10::InferenceMode::is_enabled(), at::autocast::is_autocast_enabled(at::kCUDA),
         static_cast<int64_t>(at::autocast::get_autocast_dtype(at::kCUDA)), at::autocast::is_autocast_enabled(at::kCPU),
         static_cast<int64_t>(at::autocast::get_autocast_dtype(at::kCPU)), ctx.allowTF32CuBLAS(), ctx.allowTF32CuDNN(),
         static_cast<int64_t>(ctx.float32MatmulPrecision()), static_cast<int64_t>(ctx.allowBF16ReductionCuBLAS()),
         static_cast<int64_t>(ctx.allowFP16ReductionCuBLAS()), ctx.deterministicAlgorithms(),
         static_cast<int64_t>(shapes.size()), static_cast<int64_t>(state.size())};
  for (const at::Tensor& t : shapes) key_metadata(t, key);
  for (const at::Tensor& t : state) {
    key_metadata(t, key);
    if (!t.defined()) continue;
    key.push_back(reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl()));
    key.push_back(t.layout() == at::kStrided ? reinterpret_cast<intptr_t>(t.data_ptr()) : 0);
    key.push_back(static_cast<int64_t>(t._version()));
  }
  return true;
}

// The device of the first GPU tensor among `values`, if any.
std::optional<c10::DeviceIndex> gpu_of(const std::vector<at::Tensor>& values) {
  for (const at::Tensor& v : values) {
    if (v.defined() && v.is_cuda()) return v.device().index();
  }
  return std::nullopt;
}

bool stream_capturing(const c10::cuda::CUDAStream& s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(s.stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

// The values kept for this key at site `site`, or none (the caller computes them and calls
// memo_put).
std::vector<at::Tensor> memo_get(int64_t site, std::vector<at::Tensor> shapes, std::vector<at::Tensor> state) {
  std::vector<int64_t> key;
  if (!memo_key(shapes, state, key)) return {};
  std::lock_guard<std::mutex> lock(memo_mutex);
  auto it = memo_sites.find(site);
  if (it == memo_sites.end()) return {};
  for (MemoEntry& e : it->second) {
    if (e.key != key) continue;
    if (!e.stream.has_value()) return e.values;
    const c10::cuda::CUDAStream now = c10::cuda::getCurrentCUDAStream(e.stream->device_index());
    if (stream_capturing(now)) {
      if (now != *e.stream) {
        // Querying an event is not allowed in a capture of the global mode: relaxed for this call.
        c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
        if (!e.done->query()) return {};
      }
      e.captured = true;
      return e.values;
    }
    if (now != *e.stream) {
      e.done->block(now);
      // Their memory must not go to another tensor of their stream before this one has read them.
      for (const at::Tensor& v : e.values) {
        if (v.defined() && v.is_cuda()) c10::cuda::CUDACachingAllocator::recordStream(v.storage().data_ptr(), now);
      }
    }
    return e.values;
  }
  return {};
}

// Keeps `values` for this key at site `site` (the oldest entry no graph reads goes past
// kMemoEntries) and returns them. Values computed while the stream captures a graph are not kept:
// they hold nothing until the graph replays.
std::vector<at::Tensor> memo_put(int64_t site, std::vector<at::Tensor> shapes, std::vector<at::Tensor> state,
                                 std::vector<at::Tensor> values) {
  std::vector<int64_t> key;
  if (values.empty() || !memo_key(shapes, state, key)) return values;
  std::optional<c10::cuda::CUDAStream> stream;
  std::shared_ptr<at::cuda::CUDAEvent> done;
  if (const std::optional<c10::DeviceIndex> gpu = gpu_of(values)) {
    stream = c10::cuda::getCurrentCUDAStream(*gpu);
    if (stream_capturing(*stream)) return values;
    done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(*stream);
  }
  std::lock_guard<std::mutex> lock(memo_mutex);
  std::vector<MemoEntry>& entries = memo_sites[site];
  for (const MemoEntry& e : entries) {
    if (e.key == key) return values;
  }
  if (entries.size() >= kMemoEntries) {
    auto old = std::find_if(entries.begin(), entries.end(), [](const MemoEntry& e) { return !e.captured; });
    if (old != entries.end()) entries.erase(old);
  }
  entries.push_back(MemoEntry{std::move(key), std::move(state), values, stream, std::move(done)});
  return values;
}

// ---------------------------------------------------------------------------------------------
// GEMMs: fact::gemm (one GEMM) and fact::gemm_ep (a GEMM followed by an elementwise epilogue
// program). A call fits its kernel with the kernel's dtype, bias and epilogue and CUTLASS's
// alignment rules; an operand whose strides do not fit the kernel's layout is copied into it.
// The fallback is the graph's GEMM (for gemm_ep, then the program interpreted op by op). Outputs
// lie as the kernels write them on CUDA (frame: kernel_layout): packed (gemm_ep's in the GEMM's
// order, then turned; a padded GEMM's as the first n columns of its padded output); the meta
// functions run the fallback on Meta tensors.

// The GEMM the graph computed. addmm and mm take a 2-D a; a fused pattern that reads the tensor a
// flattening view made (x in addmm(bias, x.view(-1, K), W), GPT-2's Conv1D) passes x: the same 2-D
// call on its rows, viewed with its leading dims, as the view after the GEMM did.
at::Tensor original(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                    c10::string_view origin) {
  if ((origin == "addmm" || origin == "mm") && a.dim() > 2) {
    c10::SymDimVector shape(a.sym_sizes().begin(), a.sym_sizes().end() - 1);
    shape.push_back(b.sym_size(-1));
    const at::Tensor rows = a.reshape_symint(c10::SymDimVector{-1, a.sym_size(-1)});
    return (origin == "addmm" ? at::addmm(*bias, rows, b) : at::mm(rows, b)).view_symint(shape);
  }
  if (origin == "linear") return at::linear(a, b, bias);
  if (origin == "addmm") return at::addmm(*bias, a, b);
  if (origin == "mm") return at::mm(a, b);
  if (origin == "bmm") return at::bmm(a, b);
  return at::matmul(a, b);
}

void check_origin(c10::string_view origin, const char* op) {
  if (origin != "linear" && origin != "addmm" && origin != "mm" && origin != "bmm" && origin != "matmul") {
    TORCH_CHECK(false, "fact::", op, ": unknown origin op '", std::string(origin), "'");
  }
}

// ---------------------------------------------------------------------------------------------
// The epilogue program, in rules::epilogue's text form:
//   leaves=full,row;v1=add(v0,l0);v2=mul(v1,0.5);v3=gelu_tanh(v2)
// v0 is the GEMM's result, instruction i defines v<i>, operands are earlier values, leaves or
// numbers, and the last value is the output.

enum class LeafKind { Full, Row, Col, Scalar };

enum class EpOp {
  Add, Sub, Mul, Div, Relu, Gelu, GeluTanh, Sigmoid, Silu, Tanh, Mish, Softplus, Exp, Neg, LeakyRelu,
  Clamp, ClampMin, ClampMax, Pow,
};

struct OpInfo {
  const char* name;
  EpOp op;
  size_t arity;
  // Operands after the first are numbers (parameters of a unary op), not tensors.
  bool scalar_params;
};

const OpInfo kOps[] = {
    {"add", EpOp::Add, 2, false},         {"sub", EpOp::Sub, 2, false},
    {"mul", EpOp::Mul, 2, false},         {"div", EpOp::Div, 2, false},
    {"relu", EpOp::Relu, 1, true},        {"gelu", EpOp::Gelu, 1, true},
    {"gelu_tanh", EpOp::GeluTanh, 1, true}, {"sigmoid", EpOp::Sigmoid, 1, true},
    {"silu", EpOp::Silu, 1, true},        {"tanh", EpOp::Tanh, 1, true},
    {"mish", EpOp::Mish, 1, true},        {"softplus", EpOp::Softplus, 3, true},
    {"exp", EpOp::Exp, 1, true},          {"neg", EpOp::Neg, 1, true},
    {"leaky_relu", EpOp::LeakyRelu, 2, true}, {"clamp", EpOp::Clamp, 3, true},
    {"clamp_min", EpOp::ClampMin, 2, true}, {"clamp_max", EpOp::ClampMax, 2, true},
    {"pow", EpOp::Pow, 2, true},
};

struct EpArg {
  enum Kind { Value, Leaf, Number } kind;
  size_t index;
  double number;
};

struct EpInstr {
  const OpInfo* op;
  std::vector<EpArg> args;
};

struct Program {
  std::vector<LeafKind> leaves;
  std::vector<EpInstr> instrs;
};

// Throws std::invalid_argument saying what is wrong; the same rules as Epilogue::parse and
// Epilogue::check, plus a tensor operand for every op (the interpreter needs one).
Program parse_program(const std::string& text) {
  auto fail = [](const std::string& why) { throw std::invalid_argument(why); };
  Program p;
  std::vector<std::string> parts = split(text, ';');
  const std::string head = parts[0];
  if (head.rfind("leaves=", 0) != 0) fail("it does not start with leaves=");
  for (const std::string& l : split(head.substr(7), ',')) {
    if (l.empty()) continue;
    if (l == "full") p.leaves.push_back(LeafKind::Full);
    else if (l == "row") p.leaves.push_back(LeafKind::Row);
    else if (l == "col") p.leaves.push_back(LeafKind::Col);
    else if (l == "scalar") p.leaves.push_back(LeafKind::Scalar);
    else fail("unknown leaf kind '" + l + "'");
  }
  if (p.leaves.size() > FACT_MAX_LEAVES) fail("more than " + std::to_string(FACT_MAX_LEAVES) + " leaves");
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    const std::string v = "v" + std::to_string(i);
    const size_t eq = part.find('=');
    if (eq == std::string::npos) fail("instruction '" + part + "' has no '='");
    if (part.substr(0, eq) != v) fail("instruction '" + part + "' should define " + v);
    const std::string rhs = part.substr(eq + 1);
    const size_t open = rhs.find('(');
    if (open == std::string::npos || rhs.empty() || rhs.back() != ')') {
      fail("instruction '" + part + "' is not op(args)");
    }
    const std::string name = rhs.substr(0, open);
    EpInstr ins;
    ins.op = nullptr;
    for (const OpInfo& o : kOps) {
      if (name == o.name) ins.op = &o;
    }
    if (ins.op == nullptr) fail("unknown epilogue op '" + name + "'");
    for (const std::string& a : split(rhs.substr(open + 1, rhs.size() - open - 2), ',')) {
      EpArg arg{EpArg::Number, 0, 0.0};
      if (!a.empty() && a[0] == 'v') {
        arg.kind = EpArg::Value;
        if (!parse_index(a.substr(1), arg.index)) fail("bad value '" + a + "'");
        if (arg.index >= i) fail(v + ": " + a + " is not defined yet");
      } else if (!a.empty() && a[0] == 'l') {
        arg.kind = EpArg::Leaf;
        if (!parse_index(a.substr(1), arg.index)) fail("bad leaf '" + a + "'");
        if (arg.index >= p.leaves.size()) fail(v + ": no leaf " + a);
      } else if (!parse_number(a, arg.number)) {
        fail("bad scalar '" + a + "'");
      }
      ins.args.push_back(arg);
    }
    if (ins.args.size() != ins.op->arity) {
      fail(v + ": " + name + " takes " + std::to_string(ins.op->arity) + " operands");
    }
    for (size_t j = 1; j < ins.args.size(); ++j) {
      if (ins.op->scalar_params && ins.args[j].kind != EpArg::Number) fail(v + ": " + name + " takes scalar parameters");
    }
    const bool first_tensor = ins.args[0].kind != EpArg::Number;
    if (ins.op->scalar_params ? !first_tensor : !first_tensor && ins.args[1].kind == EpArg::Number) {
      fail(v + ": " + name + " has no tensor operand");
    }
    p.instrs.push_back(std::move(ins));
  }
  if (p.instrs.empty()) fail("an epilogue has at least one instruction");
  return p;
}

// Programs are parsed once per distinct text: a composed module calls the op with the same few
// strings on every forward. Entries are never erased, so references to them stay valid.
const Program& program_of(c10::string_view text) {
  static std::mutex mu;
  static std::unordered_map<std::string, Program> cache;
  std::string key(text);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::string why;
  try {
    return cache.emplace(key, parse_program(key)).first->second;
  } catch (const std::invalid_argument& e) {
    why = e.what();
  }
  TORCH_CHECK(false, "fact::gemm_ep: malformed epilogue '", key, "': ", why);
  throw std::logic_error("unreachable");
}

// A number on the left of a tensor, as torch treats a Python scalar there: a zero-dim double on
// the CPU (for a tensor of any device), which promotes no floating tensor's dtype, as the wrapped
// number torch makes does not (every value a program computes is floating). Not wrapped itself:
// torch's tracing reads a wrapped number as a Python one, which a Fake tensor cannot give.
at::Tensor number(double x) { return at::scalar_tensor(x, at::TensorOptions().dtype(at::kDouble)); }

// The program run with the aten ops the traced graph held, on the original GEMM's result, so the
// fallback computes what the replaced nodes computed. A number operand on the left of a tensor
// is what Python's reflected operators give: add and mul commute, sub is rsub. The graph may have
// met a residual in another spelling of the output's leading dims (a pattern read through views:
// [B*T, N] before the view back to [B, T, N]): such a leaf is respelled in v0's shape, as is the
// result, so nothing broadcasts that the graph did not ([B*T, N] + [B, T, N] is no [B, B*T, N]).
at::Tensor interpret(const Program& p, const at::Tensor& v0, at::TensorList given) {
  std::vector<at::Tensor> leaves(given.begin(), given.end());
  auto respelled = [&](const at::Tensor& t) {
    return t.sym_numel() == v0.sym_numel() && t.dim() >= 1 && t.sym_size(-1) == v0.sym_size(-1) &&
           t.sym_sizes() != v0.sym_sizes();
  };
  for (size_t i = 0; i < leaves.size() && i < p.leaves.size(); ++i) {
    if (p.leaves[i] == LeafKind::Full && leaves[i].defined() && respelled(leaves[i])) {
      leaves[i] = leaves[i].reshape_symint(v0.sym_sizes());
    }
  }
  std::vector<at::Tensor> values{v0};
  for (const EpInstr& ins : p.instrs) {
    auto tensor = [&](size_t j) -> at::Tensor {
      const EpArg& a = ins.args[j];
      return a.kind == EpArg::Value ? values[a.index] : a.kind == EpArg::Leaf ? leaves[a.index] : at::Tensor();
    };
    auto num = [&](size_t j) { return c10::Scalar(ins.args[j].number); };
    const bool lhs_tensor = ins.args[0].kind != EpArg::Number;
    const bool rhs_tensor = ins.args.size() > 1 && ins.args[1].kind != EpArg::Number;
    at::Tensor r;
    switch (ins.op->op) {
      case EpOp::Add:
        r = !lhs_tensor ? at::add(tensor(1), num(0)) : rhs_tensor ? at::add(tensor(0), tensor(1)) : at::add(tensor(0), num(1));
        break;
      case EpOp::Sub:
        r = !lhs_tensor ? at::rsub(tensor(1), num(0)) : rhs_tensor ? at::sub(tensor(0), tensor(1)) : at::sub(tensor(0), num(1));
        break;
      case EpOp::Mul:
        r = !lhs_tensor ? at::mul(tensor(1), num(0)) : rhs_tensor ? at::mul(tensor(0), tensor(1)) : at::mul(tensor(0), num(1));
        break;
      case EpOp::Div:
        r = !lhs_tensor ? at::div(number(ins.args[0].number), tensor(1))
            : rhs_tensor ? at::div(tensor(0), tensor(1))
                         : at::div(tensor(0), num(1));
        break;
      case EpOp::Relu: r = at::relu(tensor(0)); break;
      case EpOp::Gelu: r = at::gelu(tensor(0), "none"); break;
      case EpOp::GeluTanh: r = at::gelu(tensor(0), "tanh"); break;
      case EpOp::Sigmoid: r = at::sigmoid(tensor(0)); break;
      case EpOp::Silu: r = at::silu(tensor(0)); break;
      case EpOp::Tanh: r = at::tanh(tensor(0)); break;
      case EpOp::Mish: r = at::mish(tensor(0)); break;
      case EpOp::Softplus: r = at::softplus(tensor(0), num(1), num(2)); break;
      case EpOp::Exp: r = at::exp(tensor(0)); break;
      case EpOp::Neg: r = at::neg(tensor(0)); break;
      case EpOp::LeakyRelu: r = at::leaky_relu(tensor(0), num(1)); break;
      // clamp and hardtanh: torch clamps with infinite bounds as with any other.
      case EpOp::Clamp: r = at::clamp(tensor(0), num(1), num(2)); break;
      case EpOp::ClampMin: r = at::clamp_min(tensor(0), num(1)); break;
      case EpOp::ClampMax: r = at::clamp_max(tensor(0), num(1)); break;
      case EpOp::Pow: r = at::pow(tensor(0), num(1)); break;
    }
    values.push_back(std::move(r));
  }
  // A row or scalar leaf with leading ones may have added dims of size one.
  return respelled(values.back()) ? values.back().reshape_symint(v0.sym_sizes()) : values.back();
}

// ---------------------------------------------------------------------------------------------
// The kernel path.

// How a kernel reads a matrix operand: packed row-major, or packed column-major (the transpose of a
// packed tensor, as `x.t()` and `x.transpose(-2, -1)` give), batch dims packed outside the matrix.
enum class Major { Row, Col };

// Whether `t` lies as `major` says (as torch's is_contiguous, of `t` or of its transpose, it ignores
// dims of size one, as the kernel's indexing does) from a 16-byte aligned start (the kernels' vector
// and TMA loads need one). Read from the strides: a transposed view per call costs host time.
bool lies(const at::Tensor& t, Major major) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  if (major == Major::Row) return t.is_contiguous();
  if (t.dim() < 2) return false;
  if (t.numel() == 0) return true;
  const int64_t n = t.dim();
  int64_t expected = 1;
  // Innermost first: the rows dim (n - 2), then the columns (n - 1), then the leading dims.
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = i == 0 ? n - 2 : i == 1 ? n - 1 : n - 1 - i;
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

// `t` (lying as `major` says) as the kernel reads it: [batch, rows, cols], packed.
FactTensor gemm_matrix(const at::Tensor& t, Major major, int64_t batch, int64_t rows, int64_t cols) {
  FactTensor ft = fact_tensor(t);
  ft.rank = 3;
  ft.sizes[0] = batch;
  ft.sizes[1] = rows;
  ft.sizes[2] = cols;
  ft.strides[0] = rows * cols;
  ft.strides[1] = major == Major::Row ? cols : 1;
  ft.strides[2] = major == Major::Row ? 1 : rows;
  return ft;
}

// The tensor whose memory the kernel reads as operand `t` ([.., rows, cols], read as [rows, cols]
// when `fold` joins its leading dims to the rows), and in `ft` the kernel's [batch, rows, cols] of
// it: `t` itself when it lies as the kernel's layout says, else a copy that does. A call whose
// strides fit no layout of its kernel runs the kernel on the copy rather than the original op: the
// kernel was measured faster than torch on this problem and the copy costs one pass over the
// operand; fact_op_stats counts such calls as "copied".
at::Tensor operand(const at::Tensor& t, Major major, bool fold, int64_t batch, int64_t rows, int64_t cols,
                   bool& copied, FactTensor& ft) {
  // A packed row-major operand's leading dims join its rows as they lie: no reshape needed.
  const bool reshape = fold && t.dim() > 2 && !(major == Major::Row && t.is_contiguous());
  at::Tensor v = reshape ? t.reshape({rows, cols}) : t;
  if (!v.is_alias_of(t)) copied = true;  // reshape had to copy: a folded column-major a
  if (!lies(v, major)) {
    copied = true;
    v = major == Major::Row ? v.clone(at::MemoryFormat::Contiguous)
                            : v.transpose(-2, -1).clone(at::MemoryFormat::Contiguous).transpose(-2, -1);
  }
  // Its leading dims lie packed outside the matrix, so they join into one.
  ft = gemm_matrix(v, major, batch, rows, cols);
  return v;
}

// `t` packed from an aligned start, for vectors and leaves (read packed, not as layouts).
at::Tensor packed(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

// A GEMM call that fits a kernel of this library: operands as the kernel's layout reads them, the
// output allocated, the device selected for as long as the launch lives.
struct Launch {
  c10::cuda::OptionalCUDAGuard guard;
  int32_t index = -1;
  // The kernel's problem: out[batch, m, n].
  int64_t batch = 1, m = 0, n = 0;
  // a and b as the kernel's [batch, rows, cols] views; out as the op returns it.
  at::Tensor a, b, bias, out;
  // Whether an operand had to be copied into the kernel's layout.
  bool copied = false;
  // The kernel's tensors in its signature's order: a, b, the bias (NULL data without one), then
  // the leaves once bound; `launch` adds out.
  std::vector<FactTensor> tensors;
  // Tensors `tensors` points into besides the operands (converted leaves), kept alive for the launch.
  std::vector<at::Tensor> keep;
  // Why the call does not fit, once a check has said so (fact_op_stats reports it).
  std::string why;
  bool fail(const char* reason) {
    why = reason;
    return false;
  }
};

// The checks fact::gemm and fact::gemm_ep share: false when the call does not fit kernel `kernel`
// with epilogue program `epilogue` ("" for none), and the op must fall back.
bool prepare(Launch& l, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
             c10::string_view origin, c10::string_view kernel, c10::string_view epilogue) {
  const bool has_bias = bias.has_value() && bias->defined();
  if (!a.is_cuda() || !b.is_cuda() || a.device() != b.device()) return l.fail("not CUDA tensors of one device");
  if (at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad() ||
                                     (has_bias && bias->requires_grad()))) {
    return l.fail("autograd (the kernel has no backward)");
  }
  const int32_t index = find_kernel(kernel);
  if (index < 0) return l.fail("no op library loaded in this process has the kernel");
  const FactKernelInfo* info = kernel_info(index);
  if (std::strcmp(info->kind, "gemm") != 0) return l.fail("the kernel is no GEMM");
  // The layout's letters say how the kernel reads a and B ("crr": a column-major, B row-major).
  const char* layout = info->layout;
  if (std::strlen(layout) != 3 || std::strcmp(dtype_name(a.scalar_type()), info->dtype) != 0) return l.fail("a's dtype is not the kernel's");
  const Major want_a = layout[0] == 'c' ? Major::Col : Major::Row;
  const Major want_b = layout[1] == 'c' ? Major::Col : Major::Row;
  if (b.scalar_type() != a.scalar_type() || b.dim() < 2 || a.dim() < 2) return l.fail("mixed dtypes, or an operand of fewer than 2 dims");
  if (epilogue != c10::string_view(info->epilogue != nullptr ? info->epilogue : "")) return l.fail("the kernel computes another epilogue");
  if (origin == "linear" && b.dim() != 2) return l.fail("linear's weight is not 2-D");
  // torch's B[.., K, N]: linear's weight is w[N, K], B = wᵀ.
  const at::Tensor bt = origin == "linear" ? b.t() : b;
  // B's leading dims all 1 broadcast over a's: folded into M like a 2-D B.
  bool b_ones = true;
  for (int64_t d = 0; d < bt.dim() - 2; ++d) b_ones = b_ones && bt.size(d) == 1;
  const bool folds = bt.dim() == 2 || (origin == "matmul" && a.dim() >= bt.dim() && b_ones);
  int64_t batch = 1;
  if (!folds) {
    // Batched: equal leading dims on both sides, folded into the kernel's L.
    if (has_bias || a.dim() != bt.dim()) return l.fail("a batched call with a bias or unequal ranks");
    for (int64_t d = 0; d < a.dim() - 2; ++d) {
      if (a.size(d) != bt.size(d)) return l.fail("batch dims differ");
      batch *= a.size(d);
    }
  } else if (origin == "bmm" && a.dim() != 2) {
    return l.fail("bmm of a 2-D b");
  }
  const int64_t k = a.size(-1);
  const int64_t n = bt.size(-1);
  if (bt.size(-2) != k || !fits_i32(k) || !fits_i32(n) || !fits_i32(batch)) return l.fail("K differs, or a dim past 32 bits");
  if (has_bias && (bias->dim() != 1 || bias->size(0) != n || bias->scalar_type() != a.scalar_type() ||
                   bias->device() != a.device())) {
    return l.fail("the bias is not a vector of N of a's dtype and device");
  }
  const int64_t m = folds ? a.numel() / k : a.size(-2);
  if (!fits_i32(m)) return l.fail("M past 32 bits");
  const auto* props = at::cuda::getDeviceProperties(a.device().index());
  if (!runs_here(*props)) return l.fail("not a device of compute capability 9.0 (an sm90 library)");

  l.guard.set_device(a.device());
  l.index = index;
  l.batch = batch;
  l.m = m;
  l.n = n;
  FactTensor ta, tb;
  l.a = operand(a, want_a, folds, batch, m, k, l.copied, ta);
  l.b = operand(bt, want_b, folds, batch, k, n, l.copied, tb);
  l.bias = has_bias ? packed(*bias) : at::Tensor();
  std::vector<int64_t> out_shape(a.sizes().begin(), a.sizes().end() - 1);
  out_shape.push_back(n);
  l.out = at::empty(out_shape, a.options());
  l.tensors = {ta, tb, has_bias ? fact_tensor(l.bias) : FactTensor{}};
  return true;
}

// Runs a prepared GEMM call, the output last among its tensors (no scalars: the dispatch table
// passes the variant's knobs); false when the kernel cannot implement it (the op falls back).
bool launch(Launch& l, c10::string_view kernel, const char* op) {
  // out is new and packed: the kernel's [batch, m, n] of it, without a view.
  l.tensors.push_back(gemm_matrix(l.out, Major::Row, l.batch, l.m, l.n));
  const FactOpArgs args{l.tensors.data(), static_cast<int32_t>(l.tensors.size()), nullptr, 0};
  return launch_kernel(l.index, args, l.a, kernel, op) ||
         l.fail("the kernel cannot implement these shapes, strides or alignments");
}

// Adds `leaves`, laid as the program says over the output [.., M, N], to the kernel's tensors as
// it reads them (full ones as [batch, M, N], in any spelling of the output's leading dims, as
// `interpret` reads them; the others as vectors); false when one does not fit (or torch's
// broadcasting would give another result type or shape than the kernel's output).
bool bind_leaves(Launch& l, const Program& p, at::TensorList leaves) {
  const at::Tensor& out = l.out;
  const int64_t m = l.m;
  const int64_t n = l.n;
  if (leaves.size() != p.leaves.size() || leaves.size() > FACT_MAX_LEAVES) return l.fail("leaves do not match the program");
  for (size_t i = 0; i < leaves.size(); ++i) {
    const at::Tensor& t = leaves[i];
    if (!t.defined() || t.device() != out.device()) return l.fail("a leaf is undefined or on another device");
    if (at::GradMode::is_enabled() && t.requires_grad()) return l.fail("autograd (the kernel has no backward)");
    if (p.leaves[i] != LeafKind::Scalar && t.scalar_type() != out.scalar_type()) return l.fail("a leaf's dtype is not the output's");
    // A vector or scalar with more dims than the output would broadcast the output to more dims; a
    // full-size leaf is the output's shape in any spelling of its leading dims, more or fewer (a
    // residual read through the reshape that flattened it, as OPT's fc2 adds [B,T,C] to [B*T,C]).
    if (p.leaves[i] != LeafKind::Full && t.dim() > out.dim()) return l.fail("a vector leaf has more dims than the output");
    at::Tensor c;
    switch (p.leaves[i]) {
      case LeafKind::Full:
        if (t.numel() != out.numel() || t.dim() < 1 || t.size(-1) != n) return l.fail("a full-size leaf is not the output's shape");
        c = packed(t).view({l.batch, m, n});
        // A residual that does not lie packed (an NCHW input under a turned epilogue) is copied
        // each call: counted as the operands' copies are.
        if (!c.is_alias_of(t)) l.copied = true;
        break;
      case LeafKind::Row:
        if (t.numel() != n || t.dim() < 1 || t.size(-1) != n) return l.fail("a row leaf is not a vector of N");
        c = packed(t).view({n});
        break;
      case LeafKind::Col:
        if (l.batch != 1 || t.numel() != m || t.dim() < 1 || t.size(-1) != 1) return l.fail("a column leaf is not a vector of M");
        for (int64_t d = 2; d <= t.dim(); ++d) {
          if (t.size(-d) != out.size(-d)) return l.fail("a column leaf's leading dims are not the output's");
        }
        c = packed(t).view({m});
        break;
      case LeafKind::Scalar:
        if (t.numel() != 1 || !c10::isFloatingType(t.scalar_type())) return l.fail("a scalar leaf is not one floating value");
        if (at::result_type(out, t) != out.scalar_type()) return l.fail("a scalar leaf would promote the output's dtype");
        c = t.to(at::kFloat).contiguous().view({1});
        break;
    }
    l.keep.push_back(c);
    l.tensors.push_back(fact_tensor(c));
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// The ops.

// fact::gemm's origin "linear;n=50257": compose padded the weight (and bias) with zeros along N
// to whole 16-byte vectors, as buffers of the module, and the graph's GEMM computes the first n
// columns. The kernel runs the padded GEMM and the op returns a view of those columns; the
// fallback runs linear on the first n rows of each, which are the module's own tensors.
struct Origin {
  std::string op;
  int64_t n = -1;
};

Origin parse_origin(c10::string_view text, const at::Tensor& b, const std::optional<at::Tensor>& bias) {
  const std::string s(text);
  const size_t semi = s.find(";n=");
  if (semi == std::string::npos) {
    check_origin(text, "gemm");
    return {s, -1};
  }
  Origin o{s.substr(0, semi), -1};
  size_t n = 0;
  TORCH_CHECK(o.op == "linear" && parse_index(s.substr(semi + 3), n) && n > 0, "fact::gemm: malformed origin '", s,
              "' (a padded GEMM's is linear;n=N)");
  o.n = static_cast<int64_t>(n);
  TORCH_CHECK(b.dim() == 2 && b.sym_size(0) >= o.n &&
                  (!bias.has_value() || !bias->defined() || (bias->dim() == 1 && bias->sym_size(0) == b.sym_size(0))),
              "fact::gemm: origin '", s, "' takes a weight of at least ", o.n, " rows and a bias as long");
  return o;
}

// The fallback, on CUDA laid out as the kernel's output: packed, or (padded) the first n columns
// of a packed [.., N] over the padded weight's N rows, into which the graph's GEMM is copied.
at::Tensor gemm_fallback(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                         const Origin& o) {
  if (o.n < 0) return kernel_packed(a, original(a, b, bias, o.op));
  const bool has_bias = bias.has_value() && bias->defined();
  const at::Tensor y = original(a, b.narrow(0, 0, o.n),
                                has_bias ? std::optional<at::Tensor>(bias->narrow(0, 0, o.n)) : std::nullopt, o.op);
  if (!kernel_layout(a)) return y;
  c10::SymDimVector padded(y.sym_sizes().begin(), y.sym_sizes().end());
  padded.back() = b.sym_size(0);
  return at::empty_symint(padded, y.options()).narrow(-1, 0, o.n).copy_(y);
}

at::Tensor gemm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                c10::string_view origin, c10::string_view kernel) {
  const Origin o = parse_origin(origin, b, bias);
  const c10::string_view run = kernel_for_rows(kernel, a);
  Launch l;
  if (disabled(kGemmKind)) {
    l.why = "gemm is turned off (FACT_DISABLE or fact_disable)";
  } else if (run == "torch") {
    count_torch(kernel_counted(kernel));
    return gemm_fallback(a, b, bias, o);
  } else if (prepare(l, a, b, bias, o.op, run, "") && launch(l, run, "gemm")) {
    count_ran(run, l.copied);
    return o.n < 0 ? l.out : l.out.narrow(-1, 0, o.n);
  }
  count_fell_back(fell_back_as(run, kernel), l.why);
  return gemm_fallback(a, b, bias, o);
}

at::Tensor gemm_meta(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                     c10::string_view origin, c10::string_view kernel) {
  return gemm_fallback(a, b, bias, parse_origin(origin, b, bias));
}

// fact::gemm_ep's origin "linear;perm=0,3,1,2": the pattern turned (a permute of the GEMM's
// output with ops after it, ConvNeXt's layer scale and residual after the permute back to NCHW).
// The kernel, or the fallback, computes in the GEMM's order on the leaves permuted back (each given
// in the graph's order, leading ones added to the output's rank), and the op returns its result
// permuted: elementwise ops commute with a reordering, so the values are the graph's.
struct EpOrigin {
  std::string op;
  std::vector<int64_t> perm;  // empty: not turned
};

EpOrigin read_ep_origin(c10::string_view text) {
  const std::string s(text);
  const size_t semi = s.find(";perm=");
  if (semi == std::string::npos) {
    check_origin(text, "gemm_ep");
    return {s, {}};
  }
  EpOrigin o{s.substr(0, semi), {}};
  check_origin(o.op, "gemm_ep");
  const std::string dims = s.substr(semi + 6);
  for (size_t at = 0; at <= dims.size();) {
    const size_t comma = std::min(dims.find(',', at), dims.size());
    size_t i = 0;
    TORCH_CHECK(parse_index(dims.substr(at, comma - at), i), "fact::gemm_ep: malformed origin '", s,
                "' (a turned pattern's is OP;perm=D0,D1,...)");
    o.perm.push_back(static_cast<int64_t>(i));
    at = comma + 1;
  }
  std::vector<bool> seen(o.perm.size(), false);
  for (int64_t i : o.perm) {
    TORCH_CHECK(i < static_cast<int64_t>(seen.size()) && !seen[i], "fact::gemm_ep: origin '", s,
                "' does not name a permutation of its dims");
    seen[i] = true;
  }
  return o;
}

// An origin is one of a few constant strings a composed module passes on every call: read once each.
EpOrigin parse_ep_origin(c10::string_view text) { return parsed<EpOrigin>(text, read_ep_origin); }

// A leaf given in the graph's (permuted) order, in the GEMM's: leading ones to the output's rank,
// then the inverse permutation (a view: the kernel path packs it as any leaf).
at::Tensor unturn(const at::Tensor& t, const std::vector<int64_t>& perm) {
  const int64_t rank = static_cast<int64_t>(perm.size());
  TORCH_CHECK(t.dim() <= rank, "fact::gemm_ep: a leaf has ", t.dim(), " dims, more than the output's ", rank);
  at::Tensor v = t;
  while (v.dim() < rank) v = v.unsqueeze(0);
  std::vector<int64_t> inverse(perm.size());
  for (int64_t i = 0; i < rank; ++i) inverse[perm[i]] = i;
  return v.permute(inverse);
}

at::Tensor turn(const at::Tensor& out, const std::vector<int64_t>& perm) {
  if (perm.empty()) return out;
  TORCH_CHECK(out.dim() == static_cast<int64_t>(perm.size()), "fact::gemm_ep: the GEMM's output has ", out.dim(),
              " dims; the pattern was composed for ", perm.size(), " (recompose for these shapes)");
  return out.permute(perm);
}

// A gemm_ep call read: its origin, its program, and its leaves in the GEMM's order (`unturned`
// holds them where the pattern turned).
struct EpCall {
  EpOrigin o;
  const Program* program;
  std::vector<at::Tensor> unturned;
};

EpCall ep_call(at::TensorList given, c10::string_view origin, c10::string_view epilogue) {
  EpCall c{parse_ep_origin(origin), &program_of(epilogue), {}};
  TORCH_CHECK(given.size() == c.program->leaves.size(), "fact::gemm_ep: epilogue '", std::string(epilogue), "' reads ",
              c.program->leaves.size(), " leaves, the call passes ", given.size());
  for (const at::Tensor& t : c.o.perm.empty() ? at::TensorList() : given) c.unturned.push_back(unturn(t, c.o.perm));
  return c;
}

// The fallback, on CUDA laid out as the kernel's output: packed in the GEMM's order, then turned.
at::Tensor gemm_ep_fallback(const EpCall& c, const at::Tensor& a, const at::Tensor& b,
                            const std::optional<at::Tensor>& bias, at::TensorList leaves) {
  return turn(kernel_packed(a, interpret(*c.program, original(a, b, bias, c.o.op), leaves)), c.o.perm);
}

// `leaves` is optional in the schema only for AOTInductor, whose proxy executor hands an empty
// tensor list over as None (a program without leaves); None is read as no leaves.
at::Tensor gemm_ep(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                   std::optional<at::TensorList> leaves_or_none, c10::string_view origin, c10::string_view epilogue,
                   c10::string_view kernel) {
  const at::TensorList given = leaves_or_none.value_or(at::TensorList());
  const EpCall c = ep_call(given, origin, epilogue);
  const at::TensorList leaves = c.o.perm.empty() ? given : at::TensorList(c.unturned);
  const c10::string_view run = kernel_for_rows(kernel, a);
  Launch l;
  if (disabled(kEpilogueKind)) {
    l.why = "epilogue is turned off (FACT_DISABLE or fact_disable)";
  } else if (run == "torch") {
    count_torch(kernel_counted(kernel));
    return gemm_ep_fallback(c, a, b, bias, leaves);
  } else if (prepare(l, a, b, bias, c.o.op, run, epilogue) && bind_leaves(l, *c.program, leaves) &&
             launch(l, run, "gemm_ep")) {
    count_ran(run, l.copied);
    return turn(l.out, c.o.perm);
  }
  count_fell_back(fell_back_as(run, kernel), l.why);
  return gemm_ep_fallback(c, a, b, bias, leaves);
}

at::Tensor gemm_ep_meta(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                        std::optional<at::TensorList> leaves_or_none, c10::string_view origin,
                        c10::string_view epilogue, c10::string_view kernel) {
  const at::TensorList given = leaves_or_none.value_or(at::TensorList());
  const EpCall c = ep_call(given, origin, epilogue);
  return gemm_ep_fallback(c, a, b, bias, c.o.perm.empty() ? given : at::TensorList(c.unturned));
}

// ---------------------------------------------------------------------------------------------
// Attention. The form says what the graph computed, e.g. "explicit;div=9.79;mask=not" (q·kᵀ, then
// div by 9.79, then masked_fill(~mask, -inf), softmax(-1), ·v; "div=tensor" divides by the scale
// operand; "mask=add;class=..." adds the mask to the scores; "upcast" casts q and k to fp32 and
// the probabilities to v's dtype; "where" first replaces the scores where the cond operand is
// false by the fill operand, GPT-Neo's where(c, scores, finfo.min) under its added mask;
// "scale_last" scales after the mask is added, CodeGen's softmax((q·kᵀ + m) / c); "bias" adds the
// additive mask itself after the scale, whatever it holds, beside the class named; "windows" then
// views the scores [B/W, W, H, Tq, Tk], adds the window operand and views them back, Swin's
// shifted windows; "scale_q" scales q before the product rather than the scores after it, Swin's
// q * c; "softmax_f32" takes the softmax in fp32 and casts the probabilities to v's dtype, Hugging
// Face's eager attention; "fill=x" fills the masked cells with x rather than -inf, MPT's
// finfo.min; "plus=before" or "plus=after" adds the plus operand, a bias, to the scaled scores
// before or after the mask, which keeps its class (MPNet's position bias before its padding mask,
// MPT's ALiBi before its causal fill); "repeat=G", as for SDPA below) or
// "sdpa;causal;scale=0.1" (at::scaled_dot_product_attention with is_causal and scale).
// An SDPA form also says how the call passed its attn_mask ("mask=bool" or "mask=add", additive),
// "gqa" (enable_gqa), "repeat=G" (the graph repeated k and v G times along the heads before the
// call: the op is given them un-repeated), "class=..." (the mask class the kernel was built for:
// none, causal, padded or causal_padded; none beside "bias", where the kernel adds the additive mask
// itself, whatever it holds, unless SDPA's where names the class by its condition) and "static" (the
// graph computes the mask from the inputs' sizes alone, so its class is one per shape).
// The output lies as the kernels write it, [B,Tq,H,D] memory viewed as [B,H,Tq,D] (the graph's
// transpose(1, 2) and reshape to [B,Tq,H*D] after it then move nothing), or in the memory order
// "out=a,b,c,d" names (dims of [B,H,Tq,D] outermost first: the order the graph recorded for SDPA's
// output, which lays it out as q's, where the graph after it relies on that, as torchvision's
// MultiheadAttention's view of [Tq,B,H,D] memory does), [B,Tq,D] packed, on every
// device (not only on CUDA, as other kinds' outputs: frame, kernel_layout): SDPA lays its output
// out as the backend torch picks for the call does, which no meta function can say. The fallback's
// result is copied into that layout where it lies otherwise, which changes no value, nor what the
// transpose and reshape after it read. The meta function runs the fallback on Meta tensors.

struct Form {
  bool sdpa = false, causal = false, gqa = false, upcast = false, where = false, scale_last = false, windows = false,
       scale_q = false, softmax_f32 = false;
  // The plus operand is a bias the graph adds beside the mask: 'b' before it, 'a' after, 0 none.
  char plus = 0;
  // Explicit form: 'm' mul, 'd' div, 0 none. SDPA: 's' when a scale was given.
  char scale_op = 0;
  double scale = 1.0;
  // The explicit form's factor is the op's scale operand.
  bool scale_tensor = false;
  // How the mask operand is read: "" none; explicit "not", "eq0" or "fill"; SDPA "bool" or "add".
  std::string mask;
  // K/V repeats along the heads that the graph made (1: none).
  int64_t repeat = 1;
  // The mask class the kernel computes.
  fact_mask::MaskClass kernel_class = fact_mask::MaskClass::None;
  // The mask is a function of the inputs' sizes: classified once per shape, not per forward.
  bool static_mask = false;
  // The kernel adds the (additive) mask to the scaled scores: nothing to classify but a where's
  // condition.
  bool bias = false;
  // SDPA's where(cond, mask, fill): the fill a constant of the form; the explicit form's
  // masked_fill value where it is not -inf.
  double fill = 0.0;
  bool has_fill = false;
  // The output's memory order over [B,H,Tq,D], outermost first (the kernels', [B,Tq,H,D], unless
  // "out=").
  std::array<int64_t, 4> order{0, 2, 1, 3};
};

Form read_form(c10::string_view text) {
  Form f;
  const std::vector<std::string> parts = split(std::string(text), ';');
  auto bad = [&] { TORCH_CHECK(false, "fact::attention: bad form '", std::string(text), "'"); };
  if (parts.empty() || (parts[0] != "explicit" && parts[0] != "sdpa")) bad();
  f.sdpa = parts[0] == "sdpa";
  bool has_class = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    const size_t eq = p.find('=');
    const std::string key = p.substr(0, eq), val = eq == std::string::npos ? "" : p.substr(eq + 1);
    size_t groups = 0;
    if (key == "causal" && f.sdpa && eq == std::string::npos) {
      f.causal = true;
    } else if (key == "gqa" && f.sdpa && eq == std::string::npos) {
      f.gqa = true;
    } else if ((key == "mul" || key == "div") && !f.sdpa) {
      f.scale_op = key[0];
      f.scale_tensor = val == "tensor";
      if (!f.scale_tensor) f.scale = std::stod(val);
    } else if (key == "scale" && f.sdpa) {
      f.scale_op = 's';
      f.scale = std::stod(val);
    } else if (key == "mask" && !f.sdpa && (val == "not" || val == "eq0" || val == "fill" || val == "add")) {
      f.mask = val;
    } else if (key == "upcast" && !f.sdpa && eq == std::string::npos) {
      f.upcast = true;
    } else if (key == "where" && eq == std::string::npos) {
      f.where = true;
    } else if (key == "fill" && (f.sdpa || f.mask == "not" || f.mask == "eq0" || f.mask == "fill")) {
      f.fill = std::stod(val);
      f.has_fill = true;
    } else if (key == "plus" && !f.sdpa && (val == "before" || val == "after")) {
      f.plus = val[0];
    } else if (key == "bias" && eq == std::string::npos) {
      f.bias = true;
    } else if (key == "scale_last" && !f.sdpa && eq == std::string::npos) {
      f.scale_last = true;
    } else if (key == "windows" && !f.sdpa && eq == std::string::npos) {
      f.windows = true;
    } else if (key == "scale_q" && !f.sdpa && eq == std::string::npos) {
      f.scale_q = true;
    } else if (key == "softmax_f32" && !f.sdpa && eq == std::string::npos) {
      f.softmax_f32 = true;
    } else if (key == "mask" && f.sdpa && (val == "bool" || val == "add")) {
      f.mask = val;
    } else if (key == "repeat" && parse_index(val, groups) && groups >= 2) {
      f.repeat = static_cast<int64_t>(groups);
    } else if (key == "out") {
      const std::vector<std::string> dims = split(val, ',');
      std::array<bool, 4> seen{};
      if (dims.size() != 4) bad();
      for (size_t i = 0; i < 4; ++i) {
        size_t dim = 0;
        if (!parse_index(dims[i], dim) || dim > 3 || seen[dim]) bad();
        seen[dim] = true;
        f.order[i] = static_cast<int64_t>(dim);
      }
      // The kernels write D at unit stride.
      if (f.order[3] != 3) bad();
    } else if (key == "static" && eq == std::string::npos) {
      f.static_mask = true;
    } else if (key == "class" && (f.sdpa || f.mask == "add")) {
      has_class = true;
      if (val == "none") f.kernel_class = fact_mask::MaskClass::None;
      else if (val == "causal") f.kernel_class = fact_mask::MaskClass::Causal;
      else if (val == "padded") f.kernel_class = fact_mask::MaskClass::Padded;
      else if (val == "causal_padded") f.kernel_class = fact_mask::MaskClass::CausalPadded;
      else bad();
    } else {
      bad();
    }
  }
  // SDPA with a mask names its kernel's class; without one it is is_causal's; the explicit
  // form's masked kernel is the causal one (forms written before classes read the same way).
  if (f.sdpa && f.mask.empty() == has_class) bad();
  // An added mask is classified as SDPA's: its class is named.
  if (!f.sdpa && (f.mask == "add") != has_class) bad();
  if (f.sdpa && f.causal && !f.mask.empty()) bad();
  if (f.static_mask && f.mask.empty()) bad();
  // The where form is read under an added mask only, and so is a scale after the mask.
  if (f.where && f.mask != "add") bad();
  if (f.scale_last && (f.mask != "add" || f.scale_op == 0 || f.scale_tensor)) bad();
  // A bias is an additive mask the kernel adds after the scale; beside SDPA's where (whose
  // condition names the class) or alone (no class, nothing classified).
  if (f.bias && (f.mask != "add" || f.scale_last || f.upcast || (f.where && !f.sdpa))) bad();
  if (f.bias && !f.where && (f.static_mask || f.kernel_class != fact_mask::MaskClass::None)) bad();
  // SDPA's where has its fill in the form, the explicit form's is an operand.
  if (f.sdpa && f.where != f.has_fill) bad();
  // The masked_fill's value masks (at or below half the lowest value, the rule's bound).
  if (!f.sdpa && f.has_fill && !(f.fill < 0.0)) bad();
  // A bias beside a mask, which keeps its class: not the mask itself a bias, nor with a where,
  // a scale after the mask, casts of q and k, or windows.
  if (f.plus && (f.mask.empty() || f.bias || f.where || f.scale_last || f.upcast || f.windows)) bad();
  // The windows' mask is added with the position bias, as one bias.
  if (f.windows && !f.bias) bad();
  // The softmax in fp32 is the form's where q and k were not cast before the product.
  if (f.softmax_f32 && f.upcast) bad();
  // A scale of q stands for the scores' scale.
  if (f.scale_q && (f.scale_op == 0 || f.scale_last || f.upcast)) bad();
  if (!has_class && (f.causal || (!f.sdpa && !f.mask.empty()))) f.kernel_class = fact_mask::MaskClass::Causal;
  return f;
}

// A form is one of a few constant strings a composed module passes on every call: read once each.
Form parse_form(c10::string_view text) { return parsed<Form>(text, read_form); }

// Whether the current stream is capturing a CUDA graph.
bool capturing() { return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None; }

// cuDNN's SDPA turned off while it lives (the user's choice restored after).
struct NoCudnnSdpa {
  bool was = at::globalContext().userEnabledCuDNNSDP();
  NoCudnnSdpa() { at::globalContext().setSDPUseCuDNN(false); }
  ~NoCudnnSdpa() { at::globalContext().setSDPUseCuDNN(was); }
  NoCudnnSdpa(const NoCudnnSdpa&) = delete;
  NoCudnnSdpa& operator=(const NoCudnnSdpa&) = delete;
};

// The tensor masked_fill fills, as the graph derived it from `mask`.
at::Tensor filled(const Form& f, const at::Tensor& mask) {
  if (f.mask == "not") return at::bitwise_not(mask);
  if (f.mask == "eq0") return at::eq(mask, 0);
  return mask;
}

// k or v [B,Hkv,T,D] with each head repeated `groups` times, as Hugging Face's repeat_kv writes it
// (head h of the result is head h / groups), for the fallback of a form whose graph repeated them.
at::Tensor repeat_heads(const at::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  TORCH_CHECK(x.dim() == 4, "fact::attention: the form repeats the heads of a tensor of rank ", x.dim());
  const c10::SymIntArrayRef s = x.sym_sizes();
  return x.unsqueeze(2)
      .expand_symint(c10::SymDimVector{s[0], s[1], groups, s[2], s[3]})
      .reshape_symint(c10::SymDimVector{s[0], s[1] * groups, s[2], s[3]});
}

at::Tensor attention_original(const Form& f, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& scale,
                              const std::optional<at::Tensor>& cond, const std::optional<at::Tensor>& fill,
                              const std::optional<at::Tensor>& window, const std::optional<at::Tensor>& plus) {
  if (f.sdpa) {
    // torch's fused kernels refuse a mask whose last stride is not 1 (T5's, summed from a
    // position bias permuted from [Tq,Tk,H]) and run the math path: the same values laid out
    // densely take a fused one.
    std::optional<at::Tensor> dense = f.mask.empty() ? std::nullopt : mask;
    if (f.where) dense = at::where(*cond, *mask, f.fill);
    if (dense.has_value() && dense->defined() && dense->dim() > 0 && dense->sym_size(-1) > 1 &&
        dense->sym_stride(-1) != 1) {
      dense = dense->contiguous();
    }
    const std::optional<double> sdpa_scale = f.scale_op == 's' ? std::optional<double>(f.scale) : std::nullopt;
    // On Meta tensors (the meta function's), SDPA's math: the same sizes and dtype, without asking
    // which backend the tensors' device would run.
    if (q.is_meta()) {
      return std::get<0>(at::_scaled_dot_product_attention_math(q, repeat_heads(k, f.repeat), repeat_heads(v, f.repeat),
                                                                dense, 0.0, f.causal, std::nullopt, sdpa_scale, f.gqa));
    }
    // Under CUDA graph capture, the backend SDPA picks for a masked call (cuDNN's) fails to
    // allocate while the stream captures: torch picks among the others (mem-efficient takes a mask).
    std::optional<NoCudnnSdpa> no_cudnn;
    if (q.is_cuda() && capturing()) no_cudnn.emplace();
    return at::scaled_dot_product_attention(q, repeat_heads(k, f.repeat), repeat_heads(v, f.repeat), dense, 0.0,
                                            f.causal, sdpa_scale, f.gqa);
  }
  auto scaled = [&](const at::Tensor& x) {
    if (f.scale_op == 'm') return f.scale_tensor ? at::mul(x, *scale) : at::mul(x, f.scale);
    if (f.scale_op == 'd') return f.scale_tensor ? at::div(x, *scale) : at::div(x, f.scale);
    return x;
  };
  const at::Tensor kr = repeat_heads(k, f.repeat), vr = repeat_heads(v, f.repeat);
  const at::Tensor qs = f.upcast ? q.to(at::kFloat) : f.scale_q ? scaled(q) : q, ks = f.upcast ? kr.to(at::kFloat) : kr;
  at::Tensor s = at::matmul(qs, ks.transpose(-2, -1));
  if (!f.scale_last && !f.scale_q) s = scaled(s);
  if (f.plus == 'b') s = at::add(s, *plus);
  if (f.where) s = at::where(*cond, s, *fill);
  if (f.mask == "add") {
    s = at::add(s, *mask);
    if (f.windows) {
      const c10::SymDimVector dims(s.sym_sizes().begin(), s.sym_sizes().end());
      const c10::SymInt w = window->sym_size(1);
      s = at::add(s.view_symint(c10::SymDimVector{dims[0] / w, w, dims[1], dims[2], dims[3]}), *window)
              .view_symint(dims);
    }
  } else if (!f.mask.empty()) {
    s = s.masked_fill(filled(f, *mask), f.has_fill ? f.fill : -std::numeric_limits<double>::infinity());
  }
  if (f.plus == 'a') s = at::add(s, *plus);
  if (f.scale_last) s = scaled(s);
  at::Tensor p = f.softmax_f32 ? at::softmax(s, -1, at::kFloat) : at::softmax(s, -1);
  if (f.upcast || f.softmax_f32) p = p.to(v.scalar_type());
  return at::matmul(p, vr);
}

// The kernels' memory order over [B,H,Tq,D]: [B,Tq,H,D].
constexpr std::array<int64_t, 4> kKernelsOrder{0, 2, 1, 3};

// The strides of a [B,H,Tq,D] output of `sizes` in memory order `order` (outermost first).
c10::SymDimVector out_strides(const std::array<int64_t, 4>& order, c10::SymIntArrayRef sizes) {
  c10::SymDimVector strides(4);
  c10::SymInt step = 1;
  for (int64_t i = 3; i >= 0; --i) {
    strides[order[i]] = step;
    step *= sizes[order[i]];
  }
  return strides;
}

// The fallback's result in the layout the kernels write (above).
at::Tensor attention_laid_out(const Form& f, const at::Tensor& y) {
  if (y.dim() != 4) return laid_packed(y);
  return laid_out(y, out_strides(f.order, y.sym_sizes()));
}

fact_mask::MaskMode mask_mode(const Form& f) {
  if (f.mask == "bool") return fact_mask::MaskMode::Bool;
  if (f.mask == "add") return fact_mask::MaskMode::Additive;
  if (f.mask == "not") return fact_mask::MaskMode::Not;
  if (f.mask == "eq0") return fact_mask::MaskMode::Eq0;
  return fact_mask::MaskMode::Fill;
}

// Masks already classified, newest first: a reference to each (so its memory is never another
// tensor's while it is here), the version it had, how it was read and against which scores. A
// mask is new each forward but one serves every layer, so the first layer classifies it and the
// others hit; a slice of a mask buffer taken anew each call hits through its memory. A static
// mask (the graph computes it from the inputs' sizes alone, as a decoder's causal mask) hits on
// its shape, layout and the scores' dims whatever tensor holds it: one classification (and host
// sync) per shape, not per forward. At most four are kept (an encoder-decoder passes two per
// forward), so the memory held is a few masks.
struct ClassifiedMask {
  at::Tensor mask;
  uint32_t version;
  fact_mask::MaskMode mode;
  int64_t dims[5];
  bool by_shape;
  fact_mask::MaskValue value;
};
std::mutex masks_mutex;
std::vector<ClassifiedMask> classified_masks;
constexpr size_t kMaskCache = 4;

// The class of `mask` against the scores [b, h, tq, tk] (q of rank `q_rank`), from the cache or
// classified now (one pass on its device and one host sync); nullopt for a mask read anew each
// forward while the stream captures a CUDA graph, which can neither wait for the device nor
// replay a class read on the host against the masks later replays hold (a padded kernel then
// reads the mask itself; other calls fall back: torch's ops capture). A static mask classified
// at its shape before, on the warm-up call, is a hit.
std::optional<fact_mask::MaskValue> mask_value(const at::Tensor& mask, fact_mask::MaskMode mode, bool by_shape, int64_t q_rank,
                                int64_t b, int64_t h, int64_t tq, int64_t tk) {
  // A mask read anew each forward is never a hit while the stream captures: the tensor the warm-up
  // call classified is the one captured only where it is an input of the graph, whose replays
  // hold other values.
  if (!by_shape && capturing()) return std::nullopt;
  const int64_t dims[5] = {q_rank, b, h, tq, tk};
  auto same = [&](const ClassifiedMask& c) {
    const bool layout = c.mask.sizes() == mask.sizes() && c.mask.strides() == mask.strides() &&
                        c.mask.dtype() == mask.dtype() && c.mask.device() == mask.device();
    const bool tensor = by_shape ? c.by_shape && layout
                                 : !c.by_shape && c.version == mask._version() &&
                                       (c.mask.is_same(mask) || (c.mask.data_ptr() == mask.data_ptr() && layout));
    return tensor && c.mode == mode && std::equal(dims, dims + 5, c.dims);
  };
  {
    std::lock_guard<std::mutex> lock(masks_mutex);
    for (size_t i = 0; i < classified_masks.size(); ++i) {
      if (same(classified_masks[i])) {
        std::rotate(classified_masks.begin(), classified_masks.begin() + i, classified_masks.begin() + i + 1);
        return classified_masks.front().value;
      }
    }
  }
  if (capturing()) return std::nullopt;
  ClassifiedMask c{mask, mask._version(), mode, {q_rank, b, h, tq, tk}, by_shape,
                   fact_mask::classify(mask, mode, q_rank, b, h, tq, tk)};
  std::lock_guard<std::mutex> lock(masks_mutex);
  classified_masks.insert(classified_masks.begin(), c);
  if (classified_masks.size() > kMaskCache) classified_masks.pop_back();
  return c.value;
}

// Each sequence's length where its mask is a key-padding prefix, else -1 (fact_mask::prefix_lengths),
// computed while the stream captures a CUDA graph: once per mask tensor and capture, so the layers
// after the first that share a mask read the lengths its call wrote (the graph replays that
// computation before them). Keyed on the capture's id, so another graph computes its own; held
// until another capture computes lengths. Holding the mask and the lengths keeps their memory
// from other tensors of the capture.
struct CapturedLengths {
  unsigned long long capture;
  at::Tensor mask;
  uint32_t version;
  fact_mask::MaskMode mode;
  int64_t dims[5];
  at::Tensor lengths;
};
std::vector<CapturedLengths> captured_lengths;

at::Tensor lengths_in_capture(const at::Tensor& mask, fact_mask::MaskMode mode, int64_t q_rank, int64_t b, int64_t h,
                              int64_t tq, int64_t tk) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;
  if (cudaStreamGetCaptureInfo(at::cuda::getCurrentCUDAStream(), &status, &capture) != cudaSuccess ||
      status != cudaStreamCaptureStatusActive) {
    return fact_mask::prefix_lengths(mask, mode, q_rank, b, h, tq, tk);
  }
  const int64_t dims[5] = {q_rank, b, h, tq, tk};
  std::lock_guard<std::mutex> lock(masks_mutex);
  for (const CapturedLengths& c : captured_lengths) {
    if (c.capture == capture && c.mask.is_same(mask) && c.version == mask._version() && c.mode == mode &&
        std::equal(dims, dims + 5, c.dims)) {
      return c.lengths;
    }
  }
  at::Tensor lengths = fact_mask::prefix_lengths(mask, mode, q_rank, b, h, tq, tk);
  if (!lengths.defined()) return lengths;
  // An earlier capture's entries are never hits again: their memory goes back to its graph.
  captured_lengths.erase(std::remove_if(captured_lengths.begin(), captured_lengths.end(),
                                        [&](const CapturedLengths& c) { return c.capture != capture; }),
                         captured_lengths.end());
  captured_lengths.insert(captured_lengths.begin(),
                          CapturedLengths{capture, mask, static_cast<uint32_t>(mask._version()), mode, {q_rank, b, h, tq, tk}, lengths});
  if (captured_lengths.size() > kMaskCache) captured_lengths.pop_back();
  return lengths;
}

// Two masks applied together (the where form's condition and its added mask): a key is visible
// where both show it. Their classes meet (a prefix within a prefix is the shorter one; causal
// with a prefix is causal and padded) and each sequence sees the fewer keys of the two.
fact_mask::MaskValue both(const fact_mask::MaskValue& a, const fact_mask::MaskValue& b) {
  using fact_mask::MaskClass;
  fact_mask::MaskValue out;
  if (a.cls == MaskClass::General || b.cls == MaskClass::General) return out;
  auto causal = [](MaskClass c) { return c == MaskClass::Causal || c == MaskClass::CausalPadded; };
  auto padded = [](MaskClass c) { return c == MaskClass::Padded || c == MaskClass::CausalPadded; };
  const bool c = causal(a.cls) || causal(b.cls), p = padded(a.cls) || padded(b.cls);
  out.cls = c ? (p ? MaskClass::CausalPadded : MaskClass::Causal) : (p ? MaskClass::Padded : MaskClass::None);
  out.lengths = at::minimum(a.lengths, b.lengths);
  return out;
}

// Whether a kernel built for mask class `kernel` computes a mask of class `mask`: a padded kernel
// also runs the masks it covers with every length Tk (none) or min(Tq, Tk) (causal).
bool kernel_takes(fact_mask::MaskClass kernel, fact_mask::MaskClass mask, int64_t tk) {
  using fact_mask::MaskClass;
  // A causal mask hides key j from query i where j > i: over one key it hides none, so a causal
  // kernel computes a mask that shows every key there too (a one-token call of a decoder).
  if (tk == 1 && kernel == MaskClass::Causal && mask == MaskClass::None) return true;
  if (tk == 1 && kernel == MaskClass::CausalPadded && (mask == MaskClass::None || mask == MaskClass::Padded)) return true;
  switch (kernel) {
    case MaskClass::None: return mask == MaskClass::None;
    case MaskClass::Causal: return mask == MaskClass::Causal;
    case MaskClass::Padded: return mask == MaskClass::None || mask == MaskClass::Padded;
    case MaskClass::CausalPadded: return mask == MaskClass::Causal || mask == MaskClass::CausalPadded;
    case MaskClass::General: return false;
  }
  return false;
}

// The additive mask as the bias a kernel reads: [B,H,Tq,Tk] (broadcast dims at stride 0), its rows
// whole 16-byte vectors apart from an aligned start; the mask itself where it already is, else
// its own elements copied once into padded rows (`copied`).
// With `windows` W the bias is one per window, [1|B/W, W, H, Tq, Tk] read as sequence b's window
// b % W's, given as [B/W, W, H, Tq, Tk].
at::Tensor bias_rows(const at::Tensor& mask, int64_t q_rank, int64_t b, int64_t h, int64_t tq, int64_t tk, int64_t windows,
                     bool& copied) {
  const int64_t align = 16 / static_cast<int64_t>(mask.element_size());
  auto expanded = [&](const at::Tensor& m) {
    if (windows > 0) return m.expand({b / windows, windows, h, tq, tk});
    return q_rank == 4 ? m.expand({b, h, tq, tk}) : m.expand({b, tq, tk}).unsqueeze(1);
  };
  at::Tensor e = expanded(mask);
  const int64_t rank = e.dim();
  bool fits = e.stride(rank - 1) == 1 && reinterpret_cast<uintptr_t>(e.data_ptr()) % 16 == 0;
  // A batch, window or head dim of one is never stepped.
  for (int64_t i = 0; i < rank - 1; ++i) fits = fits && ((i < rank - 2 && e.size(i) == 1) || e.stride(i) % align == 0);
  if (fits) return e;
  copied = true;
  // One copy of what the mask holds: a dim it broadcasts (stride 0, an expand's) stays broadcast.
  at::Tensor base = mask;
  for (int64_t i = 0; i < base.dim() - 1; ++i) {
    if (base.stride(i) == 0 && base.size(i) > 1) base = base.narrow(i, 0, 1);
  }
  std::vector<int64_t> sizes = base.sizes().vec();
  const int64_t cols = sizes.back();
  sizes.back() = (cols + align - 1) / align * align;
  at::Tensor rows = at::empty(sizes, base.options()).narrow(-1, 0, cols);
  rows.copy_(base);
  return expanded(rows);
}

// The mask as a padded kernel without the causal mask reads it where a sequence's length is below
// 1, under CUDA graph capture: over the scores [B,H,Tq,Tk] (a broadcast dim at stride 0), its keys at unit
// stride; SDPA's bool mask (a key visible where true) or an additive one of q's dtype (SDPA's
// float mask, the explicit form's add), which the kernel adds to the scaled scores. Undefined,
// with the reason in `why`, for any other form: a where, a masked_fill, a bias beside the mask,
// casts, a scale after the mask or one the graph computes (the kernel divides the added values
// by a scale it is given).
at::Tensor mask_cells(const Form& f, const at::Tensor& mask, int64_t q_rank, int64_t b, int64_t h, int64_t tq, int64_t tk,
                      at::ScalarType dtype, std::string& why) {
  const bool as_bool = f.mask == "bool" && mask.scalar_type() == at::kBool;
  const bool as_added = f.mask == "add" && mask.scalar_type() == dtype && !f.scale_tensor;
  if (f.kernel_class != fact_mask::MaskClass::Padded || !(as_bool || as_added) || f.where || f.bias || f.plus ||
      f.windows || f.scale_last || f.upcast) {
    why = "a mask read anew each forward, under CUDA graph capture, of a form the kernel does not read itself (its class is read on the host)";
    return at::Tensor();
  }
  // Broadcast as the classifier reads it, then stepped by 0 over the scores' dims it lacks.
  const at::Tensor m = fact_mask::as_scores(mask, q_rank, b, h, tq, tk);
  if (!m.defined()) {
    why = "the mask does not broadcast to the scores";
    return at::Tensor();
  }
  const at::Tensor cells = m.expand({b, h, tq, tk});
  if (tk > 1 && cells.stride(3) != 1) {
    why = "a mask read anew each forward, under CUDA graph capture, whose keys are not at unit stride";
    return at::Tensor();
  }
  return cells;
}

// Runs kernel `kernel` for the call, or returns an undefined tensor when it does not fit, with the
// reason in `why`.
at::Tensor attention_kernel(const Form& f, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& scale_t,
                            const std::optional<at::Tensor>& cond, const std::optional<at::Tensor>& window,
                            const std::optional<at::Tensor>& plus, c10::string_view kernel, std::string& why,
                            bool& copied) {
  using fact_mask::MaskClass;
  if (!q.is_cuda() || k.device() != q.device() || v.device() != q.device()) return why = "not CUDA tensors of one device", at::Tensor();
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    return why = "autograd (the kernel has no backward)", at::Tensor();
  }
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type()) return why = "mixed dtypes", at::Tensor();
  if (q.dim() != k.dim() || q.dim() != v.dim() || (q.dim() != 4 && q.dim() != 3)) return why = "q, k, v not all [B,H,T,D] or [B,T,D]", at::Tensor();
  const int32_t index = find_kernel(kernel);
  if (index < 0) return why = "no op library loaded in this process has the kernel", at::Tensor();
  const auto* props = at::cuda::getDeviceProperties(q.device().index());
  if (!runs_here(*props)) return why = "not a device of compute capability 9.0 (an sm90 library)", at::Tensor();
  // [B,T,D] is one head.
  const at::Tensor q4 = q.dim() == 4 ? q : q.unsqueeze(1);
  const at::Tensor k4 = k.dim() == 4 ? k : k.unsqueeze(1);
  const at::Tensor v4 = v.dim() == 4 ? v : v.unsqueeze(1);
  const int64_t b = q4.size(0), h = q4.size(1), tq = q4.size(2), tk = k4.size(2), d = q4.size(3);
  // k and v heads: q's, or a divisor of them where the graph repeated k and v or asked for GQA
  // (query head i reads k/v head i / (h / hkv)), or one head that SDPA and matmul broadcast.
  const int64_t hkv = k4.size(1);
  const bool heads_ok = f.repeat > 1 ? hkv * f.repeat == h : f.gqa ? hkv > 0 && h % hkv == 0 : hkv == h || hkv == 1;
  if (!heads_ok || v4.size(1) != hkv) return why = "k and v heads do not divide q's as the form says", at::Tensor();
  // The mask's class at run time must be one the kernel computes.
  at::Tensor lengths, bias;
  // The tensor the kernel adds: the additive mask itself ("bias"), or the bias beside a mask that
  // is classified below as without it ("plus"; the parse allows one of the two).
  const std::optional<at::Tensor>& added = f.plus ? plus : mask;
  if (f.bias || f.plus) {
    if (!added.has_value() || !added->defined() || added->device() != q.device()) return why = "the bias is not on q's device", at::Tensor();
    if (added->scalar_type() != q.scalar_type()) return why = "the bias is not of q's dtype", at::Tensor();
    if (added->dim() > q.dim()) return why = "the bias has more dims than the scores", at::Tensor();
    if (f.windows) {
      // The position bias and the windows' mask as one bias per window: [1|B/W, W, H, Tq, Tk].
      if (!window.has_value() || !window->defined() || window->device() != q.device() || window->dim() != 5 ||
          window->scalar_type() != q.scalar_type() || q.dim() != 4) {
        return why = "the windows' mask is not a 5-d tensor of q's dtype on its device", at::Tensor();
      }
      const int64_t w = window->size(1);
      if (w < 1 || b % w != 0) return why = "the windows do not divide the batch", at::Tensor();
      at::Tensor m = *added;
      while (m.dim() < 4) m = m.unsqueeze(0);
      if (m.size(0) != 1) return why = "the position bias differs per sequence", at::Tensor();
      bias = bias_rows(at::add(m.unsqueeze(0), *window), 4, b, h, tq, tk, w, copied);
      copied = true;
    } else {
      bias = bias_rows(*added, q.dim(), b, h, tq, tk, 0, copied);
    }
  }
  const bool padded = f.kernel_class == MaskClass::Padded || f.kernel_class == MaskClass::CausalPadded;
  const bool causal = f.kernel_class == MaskClass::Causal || f.kernel_class == MaskClass::CausalPadded;
  // The mask itself, which a padded kernel reads beside the lengths under capture.
  at::Tensor cells;
  // The class: of the mask (no bias), or of SDPA's where condition beside a bias.
  if (!f.mask.empty() && (!f.bias || f.where)) {
    if (!mask.has_value() || !mask->defined() || mask->device() != q.device()) return why = "the mask is not on q's device", at::Tensor();
    if (f.where && cond->device() != q.device()) return why = "the where condition is not on q's device", at::Tensor();
    // The where form: the fill masks the cells (the rule read it as a constant at or below the
    // bound), so the condition is one more bool mask (beside a bias, the only one).
    const auto cond_value = [&] { return mask_value(*cond, fact_mask::MaskMode::Bool, f.static_mask, q.dim(), b, h, tq, tk); };
    std::optional<fact_mask::MaskValue> read =
        f.bias ? cond_value() : mask_value(*mask, mask_mode(f), f.static_mask, q.dim(), b, h, tq, tk);
    if (read.has_value() && f.where && !f.bias) {
      const std::optional<fact_mask::MaskValue> c = cond_value();
      read = c.has_value() ? std::optional<fact_mask::MaskValue>(both(*read, *c)) : std::nullopt;
    }
    if (read.has_value()) {
      const fact_mask::MaskValue m = *read;
      if (!kernel_takes(f.kernel_class, m.cls, tk)) {
        switch (m.cls) {
          case MaskClass::None: return why = "the mask shows every key (the kernel is built for another mask)", at::Tensor();
          case MaskClass::Causal: return why = "the mask is causal (the kernel is built for another mask)", at::Tensor();
          case MaskClass::Padded: return why = "the mask pads keys (the kernel is built for another mask)", at::Tensor();
          case MaskClass::CausalPadded: return why = "the mask is causal and pads keys (the kernel is built for another mask)", at::Tensor();
          case MaskClass::General: return why = "the mask is general (not all-visible, causal or a key-padding prefix)", at::Tensor();
        }
      }
      lengths = m.lengths;
    } else if (padded) {
      // Under CUDA graph capture, which can neither wait for a class nor replay one read from
      // this call's values: each sequence's length where its mask is a key-padding prefix,
      // computed on the device, and the mask beside them, whose cells the kernel reads itself
      // for the other sequences, whatever they hold.
      cells = mask_cells(f, *mask, q.dim(), b, h, tq, tk, q.scalar_type(), why);
      if (!cells.defined()) return at::Tensor();
      lengths = lengths_in_capture(*mask, mask_mode(f), q.dim(), b, h, tq, tk);
      if (!lengths.defined()) return why = "the mask does not broadcast to the scores", at::Tensor();
    } else {
      return why = "a mask read anew each forward, under CUDA graph capture (its class is read on the host)", at::Tensor();
    }
  }
  if (padded && !lengths.defined()) return why = "a padded kernel without a mask", at::Tensor();
  double scale = 1.0;
  if (f.scale_op == 'm' || f.scale_op == 's') scale = f.scale;
  if (f.scale_op == 'd') scale = 1.0 / f.scale;
  // A factor the graph computes (tracing records `(c // h) ** 0.5` from shapes, and a traced
  // constant in it moves the result to the GPU): read on the host when it is a CPU value, else by
  // the kernel from device memory, so the host never waits for it. A floating factor keeps
  // torch's type promotion the kernel's.
  // Swin V2's logit scale is one factor per head, [H,1,1] against the scores [B,H,Tq,Tk]: the
  // kernel reads head h's.
  at::Tensor factor;
  if (f.scale_tensor) {
    const int64_t n = scale_t->numel();
    bool per_head = n == h && h > 1 && q.dim() == 4 && scale_t->dim() >= 3 && scale_t->dim() <= 4;
    for (int64_t i = 0; per_head && i < scale_t->dim(); ++i) {
      per_head = scale_t->size(i) == (i == scale_t->dim() - 3 ? h : 1);
    }
    if (!c10::isFloatingType(scale_t->scalar_type()) || (n != 1 && !per_head)) {
      return why = "the scale is neither one floating value nor one per head", at::Tensor();
    }
    if (n == 1 && !scale_t->is_cuda()) {
      const double x = scale_t->item<double>();
      scale = f.scale_op == 'm' ? x : 1.0 / x;
    } else if (scale_t->device() == q.device()) {
      factor = scale_t->to(at::kFloat).reshape({n}).contiguous();
      scale = 1.0;
    } else {
      return why = "the scale is on another device", at::Tensor();
    }
  }
  if (f.sdpa && f.scale_op == 0) scale = 1.0 / std::sqrt(static_cast<double>(d));
  c10::cuda::CUDAGuard guard(q.device());
  // The output in the form's memory order; a kernel that writes only its own ([B,Tq,H,D], the
  // sm80 kernels) writes that, and the op copies it into the form's order (counted as a copy).
  const c10::SymDimVector sizes{b, h, tq, d};
  auto allocate = [&](const std::array<int64_t, 4>& order) {
    return at::empty_strided_symint(sizes, out_strides(order, sizes), q.options());
  };
  const at::Tensor out = allocate(f.order);
  // The kernel ABI: q, k, v (k/v with their own heads), out, the scale factor, each sequence's
  // key length (a padded kernel's alone: a class of another kernel has lengths too) and the bias,
  // or the mask a padded kernel reads where a length is below 1 (NULL data when absent).
  FactTensor tensors[7] = {fact_tensor(q4), fact_tensor(k4), fact_tensor(v4), fact_tensor(out),
                           factor.defined() ? fact_tensor(factor) : FactTensor{},
                           padded ? fact_tensor(lengths) : FactTensor{},
                           bias.defined() ? fact_tensor(bias) : cells.defined() ? fact_tensor(cells) : FactTensor{}};
  const double scalars[3] = {scale, causal ? 1.0 : 0.0, f.scale_op == 'd' ? -1.0 : 1.0};
  const FactOpArgs args{tensors, 7, scalars, 3};
  if (launch_kernel(index, args, q, kernel, "attention")) return q.dim() == 4 ? out : out.squeeze(1);
  if (f.order != kKernelsOrder) {
    const at::Tensor own = allocate(kKernelsOrder);
    tensors[3] = fact_tensor(own);
    if (launch_kernel(index, args, q, kernel, "attention")) {
      copied = true;
      out.copy_(own);
      return q.dim() == 4 ? out : out.squeeze(1);
    }
  }
  return why = "the kernel cannot implement these shapes, strides or alignments", at::Tensor();
}

// The form of a call, checked against the operands it passes.
Form checked_form(c10::string_view form, const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& scale,
                  const std::optional<at::Tensor>& cond, const std::optional<at::Tensor>& fill,
                  const std::optional<at::Tensor>& window, const std::optional<at::Tensor>& plus) {
  const Form f = parse_form(form);
  TORCH_CHECK(f.mask.empty() || (mask.has_value() && mask->defined()), "fact::attention: form '",
              std::string(form), "' masks but the call passes no mask");
  TORCH_CHECK(!f.scale_tensor || (scale.has_value() && scale->defined()), "fact::attention: form '",
              std::string(form), "' scales by a tensor but the call passes none");
  TORCH_CHECK(!f.where || (cond.has_value() && cond->defined() && (f.has_fill || (fill.has_value() && fill->defined()))),
              "fact::attention: form '", std::string(form), "' has a where but the call passes no condition or fill");
  TORCH_CHECK(!f.windows || (window.has_value() && window->defined() && window->dim() == 5), "fact::attention: form '",
              std::string(form), "' adds a windows' mask but the call passes no 5-d one");
  TORCH_CHECK(!f.plus || (plus.has_value() && plus->defined()), "fact::attention: form '", std::string(form),
              "' adds a bias beside its mask but the call passes none");
  return f;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& scale,
                     c10::string_view form, c10::string_view kernel, const std::optional<at::Tensor>& cond,
                     const std::optional<at::Tensor>& fill, const std::optional<at::Tensor>& window,
                     const std::optional<at::Tensor>& plus) {
  const Form f = checked_form(form, mask, scale, cond, fill, window, plus);
  std::string why = "attention is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kAttentionKind)) {
    bool copied = false;
    at::Tensor out = attention_kernel(f, q, k, v, mask, scale, cond, window, plus, kernel, why, copied);
    if (out.defined()) {
      count_ran(kernel, copied);
      return out;
    }
  }
  count_fell_back(kernel, why);
  return attention_laid_out(f, attention_original(f, q, k, v, mask, scale, cond, fill, window, plus));
}

at::Tensor attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& scale,
                          c10::string_view form, c10::string_view kernel, const std::optional<at::Tensor>& cond,
                          const std::optional<at::Tensor>& fill, const std::optional<at::Tensor>& window,
                          const std::optional<at::Tensor>& plus) {
  const Form f = checked_form(form, mask, scale, cond, fill, window, plus);
  return attention_laid_out(f, attention_original(f, q, k, v, mask, scale, cond, fill, window, plus));
}

// ---------------------------------------------------------------------------------------------
// LayerNorm over the last dim: the kernel reads x as [R, C] rows one stride apart. On CUDA outputs
// lie packed, as the kernel writes them (frame: kernel_layout); each meta function runs its op's
// fallback on Meta tensors.

// Runs kernel `kernel` for the call, or returns an undefined tensor when it does not fit, with the
// reason in `why`.
at::Tensor layernorm_kernel(const at::Tensor& x, at::IntArrayRef normalized_shape,
                            const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
                            c10::string_view kernel, std::string& why) {
  const bool has_w = weight.has_value() && weight->defined(), has_b = bias.has_value() && bias->defined();
  if (!x.is_cuda() || (has_w && weight->device() != x.device()) || (has_b && bias->device() != x.device())) {
    return why = "not CUDA tensors of one device", at::Tensor();
  }
  if (at::GradMode::is_enabled() &&
      (x.requires_grad() || (has_w && weight->requires_grad()) || (has_b && bias->requires_grad()))) {
    return why = "autograd (the kernel has no backward)", at::Tensor();
  }
  if (x.dim() < 1 || normalized_shape.size() != 1 || normalized_shape[0] != x.size(-1)) {
    return why = "not normalized over the last dim alone", at::Tensor();
  }
  if (*dtype_name(x.scalar_type()) == '\0') return why = "not an f32, bf16 or f16 tensor", at::Tensor();
  if ((has_w && weight->scalar_type() != x.scalar_type()) || (has_b && bias->scalar_type() != x.scalar_type())) {
    return why = "mixed dtypes", at::Tensor();
  }
  const int64_t c = x.size(-1);
  if (x.numel() == 0) return why = "an empty tensor", at::Tensor();
  const int32_t index = find_kernel(kernel);
  if (index < 0) return why = "no op library loaded in this process has the kernel", at::Tensor();
  const auto* props = at::cuda::getDeviceProperties(x.device().index());
  if (!runs_here(*props)) return why = "not a device of compute capability 9.0 (an sm90 library)", at::Tensor();
  // The leading dims as one: rows one stride apart.
  const std::optional<int64_t> one_stride = row_stride_of(x);
  if (!one_stride) return why = "x's rows are not one stride apart", at::Tensor();
  const int64_t row_stride = *one_stride;
  const int64_t rows = x.numel() / c;
  c10::cuda::CUDAGuard guard(x.device());
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
  const FactTensor tensors[4] = {matrix(x, row_stride), matrix(out, c), has_w ? fact_tensor(*weight) : FactTensor{},
                                 has_b ? fact_tensor(*bias) : FactTensor{}};
  const double scalars[1] = {eps};
  const FactOpArgs args{tensors, 4, scalars, 1};
  if (!launch_kernel(index, args, x, kernel, "layernorm")) {
    return why = "the kernel cannot implement this C, stride or alignment", at::Tensor();
  }
  return out;
}

at::Tensor layernorm(const at::Tensor& x, at::IntArrayRef normalized_shape, const std::optional<at::Tensor>& weight,
                     const std::optional<at::Tensor>& bias, double eps, c10::string_view kernel) {
  std::string why = "layernorm is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kLayernormKind)) {
    at::Tensor out = layernorm_kernel(x, normalized_shape, weight, bias, eps, kernel, why);
    if (out.defined()) {
      count_ran(kernel, false);
      return out;
    }
  }
  count_fell_back(kernel, why);
  return kernel_packed(x, at::layer_norm(x, normalized_shape, weight, bias, eps));
}

at::Tensor layernorm_meta(const at::Tensor& x, at::IntArrayRef normalized_shape,
                          const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
                          c10::string_view kernel) {
  return kernel_packed(x, at::layer_norm(x, normalized_shape, weight, bias, eps));
}

// The written-out norm (Cohere's): eps as text, form "upcast" where the graph cast x to fp32 (and
// the weight) and the result back, else "" (an fp32 x). The kernel is the one of aten's spelling
// over the last dim with the weight alone; a call it does not fit replays the graph's ops.
// The written-out ops replayed, in the graph's dtypes and order.
at::Tensor layernorm_written_replay(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                                    bool upcast) {
  const at::Tensor xf = upcast ? x.to(at::kFloat) : x;
  const at::Tensor mean = xf.mean({-1}, true);
  const at::Tensor d = xf - mean;
  at::Tensor y = d * at::rsqrt(d.pow(2).mean({-1}, true) + eps);
  if (weight.has_value() && weight->defined()) y = (upcast ? weight->to(at::kFloat) : *weight) * y;
  return kernel_packed(x, upcast ? y.to(x.scalar_type()) : y);
}

bool written_upcast(c10::string_view form) {
  TORCH_CHECK(form.empty() || form == "upcast", "fact::layernorm_written: bad form '", std::string(form), "'");
  return form == "upcast";
}

at::Tensor layernorm_written(const at::Tensor& x, const std::optional<at::Tensor>& weight, c10::string_view eps_text,
                             c10::string_view form, c10::string_view kernel) {
  const bool upcast = written_upcast(form);
  const double eps = std::stod(std::string(eps_text));
  std::string why = "layernorm is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kLayernormKind)) {
    const int64_t shape[1] = {x.dim() > 0 ? x.size(-1) : 0};
    at::Tensor out = layernorm_kernel(x, at::IntArrayRef(shape, 1), weight, std::nullopt, eps, kernel, why);
    if (out.defined()) {
      count_ran(kernel, false);
      return out;
    }
  }
  count_fell_back(kernel, why);
  return layernorm_written_replay(x, weight, eps, upcast);
}

at::Tensor layernorm_written_meta(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                  c10::string_view eps_text, c10::string_view form, c10::string_view kernel) {
  return layernorm_written_replay(x, weight, std::stod(std::string(eps_text)), written_upcast(form));
}

// After a residual add (`fact::layernorm_add`, and `fact::layernorm_add_sum` where the graph reads
// the sum too): s = a + b in the add's dtype, the LayerNorm of s cast to the norm's dtype (`dtypes`,
// the frame's ResidualDtypes). The kernel reads a and b (either repeated along leading dims) and
// writes y, and s where asked; a call it does not fit replays the add, the cast and the
// `layer_norm` call.

// Runs kernel `kernel` for the call: y, and s where `with_sum`; undefined tensors when the call does
// not fit it, with the reason in `why`.
std::tuple<at::Tensor, at::Tensor> layernorm_add_kernel(const at::Tensor& a, const at::Tensor& b,
                                                        at::IntArrayRef normalized_shape,
                                                        const std::optional<at::Tensor>& weight,
                                                        const std::optional<at::Tensor>& bias, double eps,
                                                        const ResidualDtypes& d, bool with_sum,
                                                        c10::string_view kernel, std::string& why) {
  const auto fail = [&](const char* reason) {
    why = reason;
    return std::make_tuple(at::Tensor(), at::Tensor());
  };
  const bool has_w = weight.has_value() && weight->defined(), has_b = bias.has_value() && bias->defined();
  std::vector<int64_t> shape;
  FactTensor rows[2];
  if (!residual_operands(a, b, shape, rows, why)) return std::make_tuple(at::Tensor(), at::Tensor());
  if ((has_w && weight->device() != a.device()) || (has_b && bias->device() != a.device())) {
    return fail("not CUDA tensors of one device");
  }
  if (at::GradMode::is_enabled() && ((has_w && weight->requires_grad()) || (has_b && bias->requires_grad()))) {
    return fail("autograd (the kernel has no backward)");
  }
  if (normalized_shape.size() != 1 || normalized_shape[0] != shape.back()) {
    return fail("not normalized over the last dim alone");
  }
  const int32_t index = find_kernel(kernel);
  if (index < 0) return fail("no op library loaded in this process has the kernel");
  const auto* props = at::cuda::getDeviceProperties(a.device().index());
  if (!runs_here(*props)) return fail("not a device of compute capability 9.0 (an sm90 library)");
  c10::cuda::CUDAGuard guard(a.device());
  const ResidualOutputs o = residual_outputs(a, shape, d, with_sum);
  const FactTensor tensors[6] = {rows[0],
                                 rows[1],
                                 o.s_rows,
                                 o.y_rows,
                                 has_w ? fact_tensor(*weight) : FactTensor{},
                                 has_b ? fact_tensor(*bias) : FactTensor{}};
  const double scalars[1] = {eps};
  const FactOpArgs args{tensors, 6, scalars, 1};
  if (!launch_kernel(index, args, a, kernel, "layernorm_add")) {
    return fail("the kernel cannot implement these dtypes, this C, stride or alignment");
  }
  return {o.y, o.s};
}

// The replayed add, cast and layer_norm: y, and s laid out where the op returns it.
std::tuple<at::Tensor, at::Tensor> layernorm_add_replay(const at::Tensor& a, const at::Tensor& b,
                                                        at::IntArrayRef normalized_shape,
                                                        const std::optional<at::Tensor>& weight,
                                                        const std::optional<at::Tensor>& bias, double eps,
                                                        const ResidualDtypes& d, bool with_sum) {
  const at::Tensor s = residual_sum(a, b, d.sum);
  return {kernel_packed(a, at::layer_norm(s.to(d.norm), normalized_shape, weight, bias, eps)),
          with_sum ? kernel_packed(a, s) : s};
}

std::tuple<at::Tensor, at::Tensor> layernorm_add_call(const at::Tensor& a, const at::Tensor& b,
                                                      at::IntArrayRef normalized_shape,
                                                      const std::optional<at::Tensor>& weight,
                                                      const std::optional<at::Tensor>& bias, double eps,
                                                      c10::string_view dtypes, c10::string_view kernel,
                                                      bool with_sum) {
  const ResidualDtypes d = residual_dtypes(dtypes, "layernorm_add");
  std::string why = "layernorm is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kLayernormKind)) {
    auto out = layernorm_add_kernel(a, b, normalized_shape, weight, bias, eps, d, with_sum, kernel, why);
    if (std::get<0>(out).defined()) {
      count_ran(kernel, false);
      return out;
    }
  }
  count_fell_back(kernel, why);
  return layernorm_add_replay(a, b, normalized_shape, weight, bias, eps, d, with_sum);
}

at::Tensor layernorm_add(const at::Tensor& a, const at::Tensor& b, at::IntArrayRef normalized_shape,
                         const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, double eps,
                         c10::string_view dtypes, c10::string_view kernel) {
  return std::get<0>(layernorm_add_call(a, b, normalized_shape, weight, bias, eps, dtypes, kernel, false));
}

std::tuple<at::Tensor, at::Tensor> layernorm_add_sum(const at::Tensor& a, const at::Tensor& b,
                                                     at::IntArrayRef normalized_shape,
                                                     const std::optional<at::Tensor>& weight,
                                                     const std::optional<at::Tensor>& bias, double eps,
                                                     c10::string_view dtypes, c10::string_view kernel) {
  return layernorm_add_call(a, b, normalized_shape, weight, bias, eps, dtypes, kernel, true);
}

at::Tensor layernorm_add_meta(const at::Tensor& a, const at::Tensor& b, at::IntArrayRef normalized_shape,
                              const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                              double eps, c10::string_view dtypes, c10::string_view kernel) {
  const ResidualDtypes d = residual_dtypes(dtypes, "layernorm_add");
  return std::get<0>(layernorm_add_replay(a, b, normalized_shape, weight, bias, eps, d, false));
}

std::tuple<at::Tensor, at::Tensor> layernorm_add_sum_meta(const at::Tensor& a, const at::Tensor& b,
                                                          at::IntArrayRef normalized_shape,
                                                          const std::optional<at::Tensor>& weight,
                                                          const std::optional<at::Tensor>& bias, double eps,
                                                          c10::string_view dtypes, c10::string_view kernel) {
  const ResidualDtypes d = residual_dtypes(dtypes, "layernorm_add");
  return layernorm_add_replay(a, b, normalized_shape, weight, bias, eps, d, true);
}

// ---------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------
// The gated MLP as one GEMM: `fact::glu` takes the graph's own operands (x, both weights and
// biases, or the one stacked weight and bias as the gate's), which its fallback replays, and the
// interleaved weight (and bias) compose made once, which the kernel reads. On CUDA the output lies
// packed, as the kernel writes it (frame: kernel_layout); the meta function runs the fallback on
// Meta tensors.

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
  if (index < 0) return why = "no op library loaded in this process has the kernel", at::Tensor();
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

// The replaced nodes, as the graph ran them (two linears, or, without w_up, one linear over the
// stacked weights chunked into gate and up), packed on CUDA.
at::Tensor glu_replay(const at::Tensor& x, const at::Tensor& w_gate, const std::optional<at::Tensor>& b_gate,
                      const std::optional<at::Tensor>& w_up, const std::optional<at::Tensor>& b_up,
                      c10::string_view act) {
  if (!w_up.has_value() || !w_up->defined()) {
    const std::vector<at::Tensor> halves = at::linear(x, w_gate, b_gate).chunk(2, -1);
    return kernel_packed(x, at::mul(halves[1], glu_act(halves[0], act)));
  }
  return kernel_packed(x, at::mul(glu_act(at::linear(x, w_gate, b_gate), act), at::linear(x, *w_up, b_up)));
}

at::Tensor glu(const at::Tensor& x, const at::Tensor& w_gate, const std::optional<at::Tensor>& b_gate,
               const std::optional<at::Tensor>& w_up, const std::optional<at::Tensor>& b_up, const at::Tensor& w,
               const std::optional<at::Tensor>& b, c10::string_view act, c10::string_view kernel) {
  std::string why = "glu is turned off (FACT_DISABLE or fact_disable)";
  const c10::string_view run = kernel_for_rows(kernel, x);
  if (!disabled(kGluKind)) {
    if (run == "torch") {
      count_torch(kernel_counted(kernel));
      return glu_replay(x, w_gate, b_gate, w_up, b_up, act);
    }
    at::Tensor out = glu_kernel(x, w, b, run, why);
    if (out.defined()) {
      count_ran(run, false);
      return out;
    }
  }
  count_fell_back(fell_back_as(run, kernel), why);
  return glu_replay(x, w_gate, b_gate, w_up, b_up, act);
}

at::Tensor glu_meta(const at::Tensor& x, const at::Tensor& w_gate, const std::optional<at::Tensor>& b_gate,
                    const std::optional<at::Tensor>& w_up, const std::optional<at::Tensor>& b_up, const at::Tensor& w,
                    const std::optional<at::Tensor>& b, c10::string_view act, c10::string_view kernel) {
  return glu_replay(x, w_gate, b_gate, w_up, b_up, act);
}

// ---------------------------------------------------------------------------------------------
// A patch embedding as one GEMM: `fact::patch_conv(x, w, b, r, s, kernel)` returns conv2d(x, w, b,
// stride = [r, s]) for w [K, C, r, s], no padding. The kernel is a GEMM kind kernel: x cut into
// its whole patches, [N*P*Q, C*r*s] row-major (one copy; rows and columns past the last whole
// patch are not read, as the convolution reads none of them), times the weight as it lies
// ([K, C*r*s] row-major is the weight's own memory), plus the bias, written [N*P*Q, K]; the output
// is handed back packed NCHW (one transposing copy), as torch's convolution of a packed x lays it
// out. The fallback is torch's convolution, its output packed too; the meta function runs it on
// Meta tensors.

// Runs kernel `kernel` for the call, or returns an undefined tensor when it does not fit, with
// the reason in `why`.
at::Tensor patch_conv_kernel(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, int64_t r,
                             int64_t s, c10::string_view kernel, std::string& why) {
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
  if (x.dim() != 4 || w.dim() != 4 || w.size(1) != x.size(1) || w.size(2) != r || w.size(3) != s) {
    return why = "x is not [N,C,H,W] or w not [K,C,r,s] of its C", at::Tensor();
  }
  if (!w.is_contiguous() || (has_b && !b->is_contiguous())) {
    return why = "a weight or bias that is not packed", at::Tensor();
  }
  const int64_t n = x.size(0), c = x.size(1), rows = x.size(2) / r, cols = x.size(3) / s, k_out = w.size(0);
  const int64_t m = n * rows * cols, k = c * r * s;
  if (m == 0 || k_out == 0) return why = "an empty tensor", at::Tensor();
  if (reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 != 0) {
    return why = "a weight that does not start at a 16-byte boundary", at::Tensor();
  }
  const int32_t index = find_kernel(kernel);
  if (index < 0) return why = "no op library loaded in this process has the kernel", at::Tensor();
  const auto* props = at::cuda::getDeviceProperties(x.device().index());
  if (!runs_here(*props)) return why = "not a device of compute capability 9.0 (an sm90 library)", at::Tensor();
  c10::cuda::CUDAGuard guard(x.device());
  // [N, P, Q, C, r, s]: each patch a row in the weight's (c, r, s) order. The copy is torch's.
  at::Tensor patches = at::empty({m, k}, x.options());
  patches.view({n, rows, cols, c, r, s})
      .copy_(x.narrow(2, 0, rows * r).narrow(3, 0, cols * s).view({n, c, rows, r, cols, s}).permute({0, 2, 4, 1, 3, 5}));
  at::Tensor out = at::empty({m, k_out}, x.options());
  // The GEMM kind's call: a = the patches as [1, M, K] row-major, B = w^T as [1, K, N]
  // column-major (w's own memory), the bias, out as [1, M, N].
  auto matrix = [](const at::Tensor& t, int64_t rows, int64_t cols, bool row_major) {
    FactTensor ft = fact_tensor(t);
    ft.rank = 3;
    ft.sizes[0] = 1;
    ft.sizes[1] = rows;
    ft.sizes[2] = cols;
    ft.strides[0] = rows * cols;
    ft.strides[1] = row_major ? cols : 1;
    ft.strides[2] = row_major ? 1 : rows;
    return ft;
  };
  const FactTensor tensors[4] = {matrix(patches, m, k, true), matrix(w, k, k_out, false),
                                 has_b ? fact_tensor(*b) : FactTensor{}, matrix(out, m, k_out, true)};
  const FactOpArgs args{tensors, 4, nullptr, 0};
  if (!launch_kernel(index, args, x, kernel, "patch_conv")) {
    return why = "the kernel cannot implement this shape or alignment", at::Tensor();
  }
  return out.view({n, rows, cols, k_out}).permute({0, 3, 1, 2}).contiguous();
}

// The replaced convolution, as the graph ran it, packed as the kernel path hands its output back
// on every device: a channels-last x makes torch's CPU convolution write channels-last, which its
// meta function does not say (the values are the convolution's, bit for bit).
at::Tensor patch_conv_replay(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, int64_t r,
                             int64_t s) {
  return laid_packed(at::conv2d(x, w, b, {r, s}));
}

at::Tensor patch_conv(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, int64_t r,
                      int64_t s, c10::string_view kernel) {
  std::string why = "patch is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kPatchKind)) {
    at::Tensor y = patch_conv_kernel(x, w, b, r, s, kernel, why);
    if (y.defined()) {
      count_ran(kernel, false);
      return y;
    }
  }
  count_fell_back(kernel, why);
  return patch_conv_replay(x, w, b, r, s);
}

at::Tensor patch_conv_meta(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b, int64_t r,
                           int64_t s, c10::string_view kernel) {
  return patch_conv_replay(x, w, b, r, s);
}

// ---------------------------------------------------------------------------------------------
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
// where every reader takes it, the chain's end otherwise). On CUDA the output lies so whichever
// path computed it (the fallback's result copied where it lies otherwise; frame: kernel_layout);
// elsewhere "out:cl" hands back what the graph's ops gave, in x's memory format. The meta
// function runs the fallback on Meta tensors.

struct ConvForm {
  bool conv2d = true;
  std::vector<bool> flags;
  bool bn = false;
  double eps = 1e-5;
  bool bn_cudnn = true;
  std::string act;
  bool out_cl = false;
};

ConvForm read_conv_form(c10::string_view text) {
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

// A form is one of a few constant strings a composed module passes on every call: read once each.
ConvForm conv_form(c10::string_view text) { return parsed<ConvForm>(text, read_conv_form); }

// The activation the graph applied, by its name in the form.
at::Tensor conv_act(const at::Tensor& y, const std::string& act) {
  if (act.empty()) return y;
  if (act == "relu") return at::relu(y);
  if (act == "silu") return at::silu(y);
  if (act == "hardswish") return at::hardswish(y);
  if (act == "gelu") return at::gelu(y, "none");
  if (act == "relu6") return at::hardtanh(y, 0.0, 6.0);
  if (act == "sigmoid") return at::sigmoid(y);
  if (act == "hardsigmoid") return at::hardsigmoid(y);
  TORCH_CHECK(act == "gelu_tanh", "fact::conv: unknown activation '", act,
              "' (relu, silu, hardswish, gelu, gelu_tanh, relu6, sigmoid, hardsigmoid)");
  return at::gelu(y, "tanh");
}

// The replaced nodes, as the graph ran them, on the module's own parameters: the convolution in
// the graph's spelling and flags, the BatchNorm in eval mode, the add, the activation (in-place
// forms compute the same values), in the layout the op returns. Where x holds no data to compute
// on (a Meta tensor, or a Fake one of symbolic sizes that torch traces), `_convolution` is
// at::convolution, which gives the same sizes and dtype: `_convolution`'s own code reads sizes
// that are not numbers yet.
at::Tensor conv_replay(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       const std::optional<at::Tensor>& bn_weight, const std::optional<at::Tensor>& bn_bias,
                       const std::optional<at::Tensor>& bn_mean, const std::optional<at::Tensor>& bn_var,
                       const std::optional<at::Tensor>& residual, const ConvForm& f) {
  at::Tensor y;
  const std::vector<int64_t> output_padding(stride.size(), 0);
  if (f.conv2d) {
    y = at::conv2d(x, weight, bias, stride, padding, dilation, groups);
  } else if (x.is_meta() || x.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
    y = at::convolution(x, weight, bias, stride, padding, dilation, false, output_padding, groups);
  } else {
    y = f.flags.size() == 4
            ? at::_convolution(x, weight, bias, stride, padding, dilation, false, output_padding, groups, f.flags[0],
                               f.flags[1], f.flags[2], f.flags[3])
            : at::_convolution(x, weight, bias, stride, padding, dilation, false, output_padding, groups, f.flags[0],
                               f.flags[1], f.flags[2]);
  }
  // Momentum does not enter an eval-mode BatchNorm's output.
  if (f.bn) y = at::batch_norm(y, bn_weight, bn_bias, bn_mean, bn_var, false, 0.1, f.eps, f.bn_cudnn);
  if (residual.has_value() && residual->defined()) y = at::add(y, *residual);
  y = conv_act(y, f.act);
  // The chain's end: a reader that needs torch's default strides gets them, whatever layout x came
  // in; elsewhere on CUDA the kernels' channels-last.
  if (!f.out_cl) return y.contiguous();
  // Off CUDA, in x's memory format: the CPU's convolutions hand back a channels-last x's output
  // channels-last (the depthwise ones too), where torch's meta functions need not (they pack a
  // depthwise convolution's), and torch.compile checks the op's output against this function run
  // on Meta tensors.
  if (!kernel_layout(x)) return y.contiguous(x.suggest_memory_format());
  if (y.dim() != 4) return laid_packed(y);
  const c10::SymInt &c = y.sym_size(1), &h = y.sym_size(2), &w = y.sym_size(3);
  return laid_out(y, c10::SymDimVector{c * h * w, 1, w * c, c});
}

ConvForm conv_checked_form(c10::string_view form, const std::optional<at::Tensor>& bn_mean,
                           const std::optional<at::Tensor>& bn_var) {
  const ConvForm f = conv_form(form);
  TORCH_CHECK(!f.bn || (bn_mean.has_value() && bn_mean->defined() && bn_var.has_value() && bn_var->defined()),
              "fact::conv: form '", std::string(form), "' replays a BatchNorm but the call passes no running statistics");
  return f;
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
// have them times `groups`, and `w` (the kernel's weight) as many or more, zero past them.
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
  // A depthwise call (groups = C = K, one input channel a filter) runs the depthwise kernels,
  // which check the weight's [K,1,R,S] themselves; any other grouping is no kernel's.
  const bool depthwise = groups > 1 && x.dim() == 4 && w.dim() == 4 && groups == x.size(1) && groups == w.size(0) &&
                         w.size(1) == 1 && in_channels == 1;
  if (groups != 1 && !depthwise) return why = "groups other than 1 and not depthwise", at::Tensor();
  int64_t s[2], p[2], d[2];
  if (!conv_pair(stride, s) || !conv_pair(padding, p) || !conv_pair(dilation, d)) {
    return why = "not a 2-D convolution's arguments", at::Tensor();
  }
  if (x.dim() != 4 || w.dim() != 4 || x.size(1) != in_channels * groups || w.size(1) < in_channels) {
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
  if (index < 0) return why = "no op library loaded in this process has the kernel", at::Tensor();
  const auto* props = at::cuda::getDeviceProperties(x.device().index());
  if (!runs_here(*props)) return why = "not a device of compute capability 9.0 (an sm90 library)", at::Tensor();
  c10::cuda::CUDAGuard guard(x.device());
  bool conv_copied = false;
  const at::Tensor xc = conv_input(x, depthwise ? x.size(1) : w.size(1), conv_copied);
  const at::Tensor wc = conv_channels_last(w, conv_copied);
  const at::Tensor rc = has_r ? conv_channels_last(*residual, conv_copied) : at::Tensor();
  at::Tensor out = at::empty({x.size(0), w.size(0), out_h, out_w}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  // As torch lays them out: the kernels' layout check takes any stride on a dim of size one.
  const FactTensor tensors[5] = {fact_tensor(xc), fact_tensor(wc), has_b ? fact_tensor(*b) : FactTensor{},
                                 has_r ? fact_tensor(rc) : FactTensor{}, fact_tensor(out)};
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
  const ConvForm f = conv_checked_form(form, bn_mean, bn_var);
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
  return conv_replay(x, weight, bias, stride, padding, dilation, groups, bn_weight, bn_bias, bn_mean, bn_var, residual,
                     f);
}

at::Tensor conv_meta(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                     at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                     const std::optional<at::Tensor>& bn_weight, const std::optional<at::Tensor>& bn_bias,
                     const std::optional<at::Tensor>& bn_mean, const std::optional<at::Tensor>& bn_var,
                     const std::optional<at::Tensor>& residual, const at::Tensor& w_kernel,
                     const std::optional<at::Tensor>& b_kernel, c10::string_view form, c10::string_view kernel) {
  return conv_replay(x, weight, bias, stride, padding, dilation, groups, bn_weight, bn_bias, bn_mean, bn_var, residual,
                     conv_checked_form(form, bn_mean, bn_var));
}

// ---------------------------------------------------------------------------------------------
// ConvNeXt V2's Global Response Normalization over x [N,H,W,C] (channels last): `fact::grn(x,
// weight, bias, eps, form, kernel)`. `form` says how the graph wrote the scale, bias and residual,
// and so what the fallback replays: "hf" (w * (x * nf) + b + x, Hugging Face's) or "addcmul" (x +
// addcmul(b, w, x * nf), timm's); eps is the graph's constant as text. The kernel reads the weight
// and bias as [C] views of the graph's ([C] or [1,1,1,C]). On CUDA the output lies packed, as the
// kernel writes it (frame: kernel_layout); the meta function runs the fallback on Meta tensors.

enum class GrnForm { kHf, kAddcmul };

GrnForm grn_form(c10::string_view text) {
  const std::string f(text);
  if (f == "hf") return GrnForm::kHf;
  TORCH_CHECK(f == "addcmul", "fact::grn: unknown form '", f, "' (a rewrite from another fact version?)");
  return GrnForm::kAddcmul;
}

// The replaced nodes, replayed in the graph's dtype and order, packed on CUDA.
at::Tensor grn_replay(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps, GrnForm f) {
  const at::Tensor g = at::linalg_vector_norm(x, 2, at::IntArrayRef({1, 2}), true, std::nullopt);
  const at::Tensor nf = g / (g.mean({-1}, true) + eps);
  const at::Tensor t = x * nf;
  if (f == GrnForm::kHf) return kernel_packed(x, weight * t + bias + x);
  return kernel_packed(x, x + at::addcmul(bias, weight, t));
}

double grn_eps(c10::string_view eps_text) {
  double eps = 0;
  TORCH_CHECK(parse_number(std::string(eps_text), eps), "fact::grn: eps '", std::string(eps_text), "' is not a number");
  return eps;
}

// Runs kernel `kernel` for the call, or returns an undefined tensor when it does not fit, with the
// reason in `why`.
at::Tensor grn_kernel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps,
                      c10::string_view kernel, std::string& why) {
  if (!x.is_cuda() || weight.device() != x.device() || bias.device() != x.device()) {
    return why = "not CUDA tensors of one device", at::Tensor();
  }
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() || bias.requires_grad())) {
    return why = "autograd (the kernel has no backward)", at::Tensor();
  }
  if (x.dim() != 4) return why = "x is not [N,H,W,C]", at::Tensor();
  if (*dtype_name(x.scalar_type()) == '\0') return why = "not an f32, bf16 or f16 tensor", at::Tensor();
  if (weight.scalar_type() != x.scalar_type() || bias.scalar_type() != x.scalar_type()) return why = "mixed dtypes", at::Tensor();
  const int64_t c = x.size(3);
  if (weight.numel() != c || bias.numel() != c) return why = "the weight or bias is not one value a channel", at::Tensor();
  if (x.numel() == 0) return why = "an empty tensor", at::Tensor();
  const int32_t index = find_kernel(kernel);
  if (index < 0) return why = "no op library loaded in this process has the kernel", at::Tensor();
  const auto* props = at::cuda::getDeviceProperties(x.device().index());
  if (!runs_here(*props)) return why = "not a device of compute capability 9.0 (an sm90 library)", at::Tensor();
  c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor w = weight.reshape({c}).contiguous(), b = bias.reshape({c}).contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const FactTensor tensors[4] = {fact_tensor(x), fact_tensor(out), fact_tensor(w), fact_tensor(b)};
  const double scalars[1] = {eps};
  const FactOpArgs args{tensors, 4, scalars, 1};
  if (!launch_kernel(index, args, x, kernel, "grn")) {
    return why = "the kernel cannot implement this C, layout or alignment", at::Tensor();
  }
  return out;
}

at::Tensor grn(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, c10::string_view eps_text,
               c10::string_view form, c10::string_view kernel) {
  const GrnForm f = grn_form(form);
  const double eps = grn_eps(eps_text);
  std::string why = "grn is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kGrnKind)) {
    at::Tensor out = grn_kernel(x, weight, bias, eps, kernel, why);
    if (out.defined()) {
      count_ran(kernel, false);
      return out;
    }
  }
  count_fell_back(kernel, why);
  return grn_replay(x, weight, bias, eps, f);
}

at::Tensor grn_meta(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, c10::string_view eps_text,
                    c10::string_view form, c10::string_view kernel) {
  return grn_replay(x, weight, bias, grn_eps(eps_text), grn_form(form));
}

// ---------------------------------------------------------------------------------------------
// Sibling linears as one GEMM: `fact::linears<N>(x, w, b, n0, .., kernel)` returns y_i = linear(x,
// W_i, b_i) for the N linears of one group, where w (and b) are their weights (biases) concatenated
// along the rows once at compose time. The kernel is a GEMM kind kernel writing [.., sum n_i]; each
// y_i is a view of its columns (row stride sum n_i), which the graph's row-preserving views take
// in place. The fallback runs each linear over its rows of w and b: the module's own values, so
// the same numbers as the graph's separate linears on any input; on CUDA each copied into the
// columns of a [.., sum n_i] of its own (frame: kernel_layout): the layout of the kernel's views,
// in memory no other output shares, as the schema says (the kernel's views share its output). The
// meta functions run the fallback on Meta tensors.

// Runs kernel `kernel` for the call, or returns no tensors when it does not fit, with the reason in
// `why`.
std::vector<at::Tensor> linears_kernel(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                                       const std::vector<int64_t>& widths, c10::string_view kernel, std::string& why) {
  const bool has_b = b.has_value() && b->defined();
  if (!x.is_cuda() || w.device() != x.device() || (has_b && b->device() != x.device())) {
    return why = "not CUDA tensors of one device", std::vector<at::Tensor>();
  }
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad() || (has_b && b->requires_grad()))) {
    return why = "autograd (the kernel has no backward)", std::vector<at::Tensor>();
  }
  if (*dtype_name(x.scalar_type()) == '\0') return why = "not an f32, bf16 or f16 tensor", std::vector<at::Tensor>();
  if (w.scalar_type() != x.scalar_type() || (has_b && b->scalar_type() != x.scalar_type())) {
    return why = "mixed dtypes", std::vector<at::Tensor>();
  }
  if (x.dim() < 1 || w.dim() != 2 || x.size(-1) != w.size(1)) {
    return why = "x's last dim is not the weights' K", std::vector<at::Tensor>();
  }
  if (!x.is_contiguous() || !w.is_contiguous() || (has_b && !b->is_contiguous())) {
    return why = "an operand that is not packed", std::vector<at::Tensor>();
  }
  if (reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0 || reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 != 0) {
    return why = "an operand that does not start at a 16-byte boundary", std::vector<at::Tensor>();
  }
  if (x.numel() == 0) return why = "an empty tensor", std::vector<at::Tensor>();
  const int32_t index = find_kernel(kernel);
  if (index < 0) return why = "no op library loaded in this process has the kernel", std::vector<at::Tensor>();
  const auto* props = at::cuda::getDeviceProperties(x.device().index());
  if (!runs_here(*props)) return why = "not a device of compute capability 9.0 (an sm90 library)", std::vector<at::Tensor>();
  const int64_t k = x.size(-1), n = w.size(0), m = x.numel() / k;
  c10::cuda::CUDAGuard guard(x.device());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  at::Tensor out = at::empty(shape, x.options());
  // The GEMM kind's call: a = x as [1, M, K] row-major, B = w^T as [1, K, N] column-major, the
  // bias, out as [1, M, N].
  auto matrix = [](const at::Tensor& t, int64_t rows, int64_t cols, bool row_major) {
    FactTensor ft = fact_tensor(t);
    ft.rank = 3;
    ft.sizes[0] = 1;
    ft.sizes[1] = rows;
    ft.sizes[2] = cols;
    ft.strides[0] = rows * cols;
    ft.strides[1] = row_major ? cols : 1;
    ft.strides[2] = row_major ? 1 : rows;
    return ft;
  };
  const FactTensor tensors[4] = {matrix(x, m, k, true), matrix(w, k, n, false),
                                 has_b ? fact_tensor(*b) : FactTensor{}, matrix(out, m, n, true)};
  const FactOpArgs args{tensors, 4, nullptr, 0};
  if (!launch_kernel(index, args, x, kernel, "linears")) {
    return why = "the kernel cannot implement this shape or alignment", std::vector<at::Tensor>();
  }
  std::vector<at::Tensor> outs;
  int64_t at = 0;
  for (int64_t width : widths) {
    outs.push_back(out.narrow(-1, at, width));
    at += width;
  }
  return outs;
}

// The sum of the widths, checked against the concatenated weight's (and bias's) rows.
int64_t linears_sum(const at::Tensor& w, const std::optional<at::Tensor>& b, const std::vector<int64_t>& widths) {
  int64_t sum = 0;
  for (int64_t width : widths) sum += width;
  const bool has_b = b.has_value() && b->defined();
  TORCH_CHECK(w.dim() == 2 && w.sym_size(0) == sum && (!has_b || (b->dim() == 1 && b->sym_size(0) == sum)),
              "fact::linears: the concatenated weight and bias do not hold the widths' rows");
  return sum;
}

// The replaced linears, as the graph ran them, each on its weight's (and bias's) values, on CUDA
// laid out as the kernel's views.
std::vector<at::Tensor> linears_replay(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                                       const std::vector<int64_t>& widths, int64_t sum) {
  const bool has_b = b.has_value() && b->defined();
  std::vector<at::Tensor> outs;
  int64_t at = 0;
  for (int64_t width : widths) {
    const std::optional<at::Tensor> bias = has_b ? std::optional<at::Tensor>(b->narrow(0, at, width)) : std::nullopt;
    const at::Tensor y = at::linear(x, w.narrow(0, at, width), bias);
    if (kernel_layout(x)) {
      c10::SymDimVector whole(y.sym_sizes().begin(), y.sym_sizes().end());
      whole.back() = sum;
      outs.push_back(at::empty_symint(whole, y.options()).narrow(-1, at, width).copy_(y));
    } else {
      outs.push_back(y);
    }
    at += width;
  }
  return outs;
}

std::vector<at::Tensor> linears(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                                const std::vector<int64_t>& widths, c10::string_view kernel) {
  const int64_t sum = linears_sum(w, b, widths);
  std::string why = "siblings is turned off (FACT_DISABLE or fact_disable)";
  if (!disabled(kSiblingsKind)) {
    std::vector<at::Tensor> outs = linears_kernel(x, w, b, widths, kernel, why);
    if (!outs.empty()) {
      count_ran(kernel, false);
      return outs;
    }
  }
  count_fell_back(kernel, why);
  return linears_replay(x, w, b, widths, sum);
}

std::vector<at::Tensor> linears_meta(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
                                     const std::vector<int64_t>& widths) {
  return linears_replay(x, w, b, widths, linears_sum(w, b, widths));
}

std::tuple<at::Tensor, at::Tensor> linears2(const at::Tensor& x, const at::Tensor& w,
                                            const std::optional<at::Tensor>& b, int64_t n0, int64_t n1,
                                            c10::string_view kernel) {
  auto o = linears(x, w, b, {n0, n1}, kernel);
  return {o[0], o[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linears3(const at::Tensor& x, const at::Tensor& w,
                                                        const std::optional<at::Tensor>& b, int64_t n0, int64_t n1,
                                                        int64_t n2, c10::string_view kernel) {
  auto o = linears(x, w, b, {n0, n1, n2}, kernel);
  return {o[0], o[1], o[2]};
}

std::tuple<at::Tensor, at::Tensor> linears2_meta(const at::Tensor& x, const at::Tensor& w,
                                                 const std::optional<at::Tensor>& b, int64_t n0, int64_t n1,
                                                 c10::string_view kernel) {
  auto o = linears_meta(x, w, b, {n0, n1});
  return {o[0], o[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linears3_meta(const at::Tensor& x, const at::Tensor& w,
                                                             const std::optional<at::Tensor>& b, int64_t n0,
                                                             int64_t n1, int64_t n2, c10::string_view kernel) {
  auto o = linears_meta(x, w, b, {n0, n1, n2});
  return {o[0], o[1], o[2]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linears4_meta(const at::Tensor& x, const at::Tensor& w,
                                                                         const std::optional<at::Tensor>& b,
                                                                         int64_t n0, int64_t n1, int64_t n2,
                                                                         int64_t n3, c10::string_view kernel) {
  auto o = linears_meta(x, w, b, {n0, n1, n2, n3});
  return {o[0], o[1], o[2], o[3]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linears4(const at::Tensor& x, const at::Tensor& w,
                                                                    const std::optional<at::Tensor>& b, int64_t n0,
                                                                    int64_t n1, int64_t n2, int64_t n3,
                                                                    c10::string_view kernel) {
  auto o = linears(x, w, b, {n0, n1, n2, n3}, kernel);
  return {o[0], o[1], o[2], o[3]};
}

}  // namespace

// The call counts since the library was loaded (or last reset) as JSON,
// {"kernel": {"ran": n, "copied": n, "fell_back": n, "why": "..."}, ...} ("copied" counts the calls
// among "ran" whose operands had to be copied into the kernel's layout; "why", present after a
// fallback whose reason the op knows, is the last one's; "torch", present where nonzero, the calls
// of few rows whose kernel operand chose torch's ops, `count_torch`); valid until the next call.
extern "C" const char* fact_op_stats(void) {
  static thread_local std::string text;
  std::lock_guard<std::mutex> lock(stats_mutex);
  std::map<std::string, Counts> all = stats;
  for (int32_t i = 0; i < fact_kernel_count(); ++i) {
    const RanCounts& r = ran_counts()[i];
    const uint64_t ran = r.ran.load(std::memory_order_relaxed);
    if (ran == 0) continue;
    Counts& c = all[fact_kernel_info(i)->name];
    c.ran += ran;
    c.copied += r.copied.load(std::memory_order_relaxed);
  }
  text = "{";
  for (const auto& [kernel, c] : all) {
    if (text.size() > 1) text += ",";
    text += "\"" + kernel + "\":{\"ran\":" + std::to_string(c.ran) + ",\"copied\":" + std::to_string(c.copied) +
            ",\"fell_back\":" + std::to_string(c.fell_back);
    if (c.torch > 0) text += ",\"torch\":" + std::to_string(c.torch);
    // Reasons are fixed texts of this file: no quoting needed.
    if (!c.why.empty()) text += ",\"why\":\"" + c.why + "\"";
    text += "}";
  }
  text += "}";
  return text.c_str();
}

// Turns the pattern kinds named (comma-separated: gemm, epilogue, attention, layernorm, rmsnorm, rotary, glu, patch, conv, grn, siblings, memo, all) off
// and every other kind on; "" turns all on. Returns -1, changing nothing, on a name that is no kind.
extern "C" int32_t fact_disable(const char* kinds) {
  unsigned bits = 0;
  if (kinds == nullptr || !parse_kinds(kinds, bits)) return -1;
  disabled_kinds().store(bits, std::memory_order_relaxed);
  return 0;
}

// One call of kernel `kernel` (a CountWhat; `why` a fallback's reason or ""), made by another fact
// library's op code that found the kernel in this library's table (`find_kernel`).
extern "C" void fact_op_count(const char* kernel, int32_t what, const char* why) {
  const std::string reason = why != nullptr ? why : "";
  if (what == kCountRan || what == kCountRanCopied) {
    count_ran(kernel, what == kCountRanCopied);
  } else if (what == kCountTorch) {
    count_torch(kernel);
  } else {
    count_fell_back(kernel, reason);
  }
}

extern "C" void fact_op_stats_reset(void) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  stats.clear();
  for (int32_t i = 0; i < fact_kernel_count(); ++i) {
    ran_counts()[i].ran.store(0, std::memory_order_relaxed);
    ran_counts()[i].copied.store(0, std::memory_order_relaxed);
  }
}

namespace {

// Whether an argument of an op is a tensor that autograd records through.
bool needs_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
bool needs_grad(const std::optional<at::Tensor>& t) { return t.has_value() && needs_grad(*t); }
bool needs_grad(at::TensorList ts) {
  return std::any_of(ts.begin(), ts.end(), [](const at::Tensor& t) { return needs_grad(t); });
}
bool needs_grad(const std::optional<at::TensorList>& ts) { return ts.has_value() && needs_grad(*ts); }
template <class T>
bool needs_grad(const T&) {
  return false;
}

// Turns the kernels off on this thread for as long as it lives (`for_autograd`).
struct ForAutograd {
  bool was = for_autograd;
  ForAutograd() { for_autograd = true; }
  ~ForAutograd() { for_autograd = was; }
};

// The autograd kernel of op `kName` (its function `kFunction`), one piece of code for every op.
// Recording autograd, the function runs with the kernels off: its fallback's aten ops record the
// graph (on Fake tensors too: torch.compile's joint graph holds them). Otherwise the op is
// redispatched below autograd, as torch's own non-differentiable ops are: Fake tensors reach
// FakeTensor's handling and so the meta function, real ones their device's kernel.
template <const char* kName, auto kFunction>
struct Registered;

template <const char* kName, class R, class... A, R (*kFunction)(A...)>
struct Registered<kName, kFunction> {
  static R autograd(c10::DispatchKeySet keys, A... args) {
    if (at::GradMode::is_enabled() && (needs_grad(args) || ...)) {
      const ForAutograd off;
      return kFunction(args...);
    }
    static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(kName, "").template typed<R(A...)>();
    at::AutoDispatchBelowADInplaceOrView below;
    return op.redispatch(keys & c10::after_ADInplaceOrView_keyset, args...);
  }
};

constexpr char k_gemm[] = "fact::gemm";
constexpr char k_gemm_ep[] = "fact::gemm_ep";
constexpr char k_attention[] = "fact::attention";
constexpr char k_layernorm[] = "fact::layernorm";
constexpr char k_layernorm_written[] = "fact::layernorm_written";
constexpr char k_layernorm_add[] = "fact::layernorm_add";
constexpr char k_layernorm_add_sum[] = "fact::layernorm_add_sum";
constexpr char k_rmsnorm[] = "fact::rmsnorm";
constexpr char k_rmsnorm_add[] = "fact::rmsnorm_add";
constexpr char k_rmsnorm_add_sum[] = "fact::rmsnorm_add_sum";
constexpr char k_rotary[] = "fact::rotary";
constexpr char k_rotary_qk[] = "fact::rotary_qk";
constexpr char k_glu[] = "fact::glu";
constexpr char k_patch_conv[] = "fact::patch_conv";
constexpr char k_conv[] = "fact::conv";
constexpr char k_grn[] = "fact::grn";
constexpr char k_linears2[] = "fact::linears2";
constexpr char k_linears3[] = "fact::linears3";
constexpr char k_linears4[] = "fact::linears4";

}  // namespace

// A fragment that defines the schemas only where they are missing: the fact CLI defines them
// before it saves a rewritten graph, and may load this library into the same process afterwards.
// An op with a meta function is tagged pt2_compliant (torch.library.opcheck passes on it, as
// torch.library.custom_op's are); one that reads any layout, flexible_layout as well.
TORCH_LIBRARY_FRAGMENT(fact, m) {
  if (!c10::Dispatcher::singleton().findSchema({"fact::gemm", ""}).has_value()) {
    m.def("gemm(Tensor a, Tensor b, Tensor? bias, str origin, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::gemm_ep", ""}).has_value()) {
    m.def("gemm_ep(Tensor a, Tensor b, Tensor? bias, Tensor[]? leaves, str origin, str epilogue, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::attention", ""}).has_value()) {
    m.def("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor? scale, str form, str kernel, Tensor? cond=None, Tensor? fill=None, Tensor? window=None, Tensor? plus=None) -> Tensor", {at::Tag::pt2_compliant_tag, at::Tag::flexible_layout});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::layernorm", ""}).has_value()) {
    m.def("layernorm(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::layernorm_written", ""}).has_value()) {
    m.def("layernorm_written(Tensor x, Tensor? weight, str eps, str form, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::layernorm_add", ""}).has_value()) {
    m.def("layernorm_add(Tensor a, Tensor b, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, str dtypes, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::layernorm_add_sum", ""}).has_value()) {
    m.def("layernorm_add_sum(Tensor a, Tensor b, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, str dtypes, str kernel) -> (Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::rmsnorm", ""}).has_value()) {
    m.def("rmsnorm(Tensor x, Tensor? weight, str eps, str form, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::rmsnorm_add", ""}).has_value()) {
    m.def("rmsnorm_add(Tensor a, Tensor b, Tensor? weight, str eps, str form, str dtypes, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::rmsnorm_add_sum", ""}).has_value()) {
    m.def("rmsnorm_add_sum(Tensor a, Tensor b, Tensor? weight, str eps, str form, str dtypes, str kernel) -> (Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::rotary", ""}).has_value()) {
    m.def("rotary(Tensor x, Tensor cos, Tensor sin, int rotary_dim, int form, int layout, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::rotary_qk", ""}).has_value()) {
    m.def("rotary_qk(Tensor q, Tensor k, Tensor cos, Tensor sin, int rotary_dim, int form, int layout, str kernel) -> (Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::glu", ""}).has_value()) {
    m.def("glu(Tensor x, Tensor w_gate, Tensor? b_gate, Tensor? w_up, Tensor? b_up, Tensor w, Tensor? b, str act, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::patch_conv", ""}).has_value()) {
    m.def("patch_conv(Tensor x, Tensor w, Tensor? b, int r, int s, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::conv", ""}).has_value()) {
    m.def("conv(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, Tensor? bn_weight, Tensor? bn_bias, Tensor? bn_mean, Tensor? bn_var, Tensor? residual, Tensor w_kernel, Tensor? b_kernel, str form, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::grn", ""}).has_value()) {
    m.def("grn(Tensor x, Tensor weight, Tensor bias, str eps, str form, str kernel) -> Tensor", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::linears2", ""}).has_value()) {
    m.def("linears2(Tensor x, Tensor w, Tensor? b, int n0, int n1, str kernel) -> (Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::linears3", ""}).has_value()) {
    m.def("linears3(Tensor x, Tensor w, Tensor? b, int n0, int n1, int n2, str kernel) -> (Tensor, Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::linears4", ""}).has_value()) {
    m.def("linears4(Tensor x, Tensor w, Tensor? b, int n0, int n1, int n2, int n3, str kernel) -> (Tensor, Tensor, Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::memo_get", ""}).has_value()) {
    m.def("memo_get(int site, Tensor[] shapes, Tensor[] state) -> Tensor[]");
  }
  if (!c10::Dispatcher::singleton().findSchema({"fact::memo_put", ""}).has_value()) {
    m.def("memo_put(int site, Tensor[] shapes, Tensor[] state, Tensor[] values) -> Tensor[]");
  }
  m.impl("gemm", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(gemm)));
  m.impl("gemm", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(gemm)));
  m.impl("gemm", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(gemm_meta)));
  m.impl("gemm", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_gemm, gemm>::autograd))));
  m.impl("gemm_ep", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(gemm_ep)));
  m.impl("gemm_ep", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(gemm_ep)));
  m.impl("gemm_ep", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(gemm_ep_meta)));
  m.impl("gemm_ep", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_gemm_ep, gemm_ep>::autograd))));
  m.impl("attention", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(attention)));
  m.impl("attention", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(attention)));
  m.impl("attention", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(attention_meta)));
  m.impl("attention", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_attention, attention>::autograd))));
  m.impl("layernorm", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(layernorm)));
  m.impl("layernorm", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(layernorm)));
  m.impl("layernorm", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(layernorm_meta)));
  m.impl("layernorm", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_layernorm, layernorm>::autograd))));
  m.impl("layernorm_written", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(layernorm_written)));
  m.impl("layernorm_written", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(layernorm_written)));
  m.impl("layernorm_written", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(layernorm_written_meta)));
  m.impl("layernorm_written", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_layernorm_written, layernorm_written>::autograd))));
  m.impl("layernorm_add", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(layernorm_add)));
  m.impl("layernorm_add", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(layernorm_add)));
  m.impl("layernorm_add", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(layernorm_add_meta)));
  m.impl("layernorm_add", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_layernorm_add, layernorm_add>::autograd))));
  m.impl("layernorm_add_sum", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(layernorm_add_sum)));
  m.impl("layernorm_add_sum", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(layernorm_add_sum)));
  m.impl("layernorm_add_sum", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(layernorm_add_sum_meta)));
  m.impl("layernorm_add_sum", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_layernorm_add_sum, layernorm_add_sum>::autograd))));
  m.impl("rmsnorm", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(rmsnorm)));
  m.impl("rmsnorm", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(rmsnorm)));
  m.impl("rmsnorm", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(rmsnorm_meta)));
  m.impl("rmsnorm", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_rmsnorm, rmsnorm>::autograd))));
  m.impl("rmsnorm_add", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(rmsnorm_add)));
  m.impl("rmsnorm_add", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(rmsnorm_add)));
  m.impl("rmsnorm_add", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(rmsnorm_add_meta)));
  m.impl("rmsnorm_add", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_rmsnorm_add, rmsnorm_add>::autograd))));
  m.impl("rmsnorm_add_sum", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(rmsnorm_add_sum)));
  m.impl("rmsnorm_add_sum", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(rmsnorm_add_sum)));
  m.impl("rmsnorm_add_sum", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(rmsnorm_add_sum_meta)));
  m.impl("rmsnorm_add_sum", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_rmsnorm_add_sum, rmsnorm_add_sum>::autograd))));
  m.impl("rotary", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(rotary)));
  m.impl("rotary", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(rotary)));
  m.impl("rotary", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(rotary_meta)));
  m.impl("rotary", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_rotary, rotary>::autograd))));
  m.impl("rotary_qk", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(rotary_qk)));
  m.impl("rotary_qk", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(rotary_qk)));
  m.impl("rotary_qk", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(rotary_qk_meta)));
  m.impl("rotary_qk", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_rotary_qk, rotary_qk>::autograd))));
  m.impl("glu", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(glu)));
  m.impl("glu", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(glu)));
  m.impl("glu", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(glu_meta)));
  m.impl("glu", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_glu, glu>::autograd))));
  m.impl("patch_conv", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(patch_conv)));
  m.impl("patch_conv", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(patch_conv)));
  m.impl("patch_conv", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(patch_conv_meta)));
  m.impl("patch_conv", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_patch_conv, patch_conv>::autograd))));
  m.impl("conv", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(conv)));
  m.impl("conv", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(conv)));
  m.impl("conv", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(conv_meta)));
  m.impl("conv", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_conv, conv>::autograd))));
  m.impl("grn", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(grn)));
  m.impl("grn", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(grn)));
  m.impl("grn", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(grn_meta)));
  m.impl("grn", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_grn, grn>::autograd))));
  m.impl("linears2", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(linears2)));
  m.impl("linears2", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(linears2)));
  m.impl("linears2", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(linears2_meta)));
  m.impl("linears2", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_linears2, linears2>::autograd))));
  m.impl("linears3", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(linears3)));
  m.impl("linears3", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(linears3)));
  m.impl("linears3", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(linears3_meta)));
  m.impl("linears3", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_linears3, linears3>::autograd))));
  m.impl("linears4", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(linears4)));
  m.impl("linears4", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(linears4)));
  m.impl("linears4", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(linears4_meta)));
  m.impl("linears4", torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN((Registered<k_linears4, linears4>::autograd))));
  m.impl("memo_get", torch::dispatch(c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(memo_get)));
  m.impl("memo_put", torch::dispatch(c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(memo_put)));
}

// The ops' C shims (codegen::c_shim): what Inductor's C++ wrappers call directly, without Python
// or the dispatcher, once `fact.use_c_shims` registers them. A shim runs the op's function, as the
// CPU and CUDA registrations do: Inductor calls an op below autograd. fact_c_shims() names each
// shimmed op's declarations, for that registration.
namespace fact_shim {
const at::Tensor& tensor(AtenTensorHandle h) { return *torch::aot_inductor::tensor_handle_to_tensor_pointer(h); }
std::optional<at::Tensor> optional(AtenTensorHandle* h) {
  return h ? std::optional<at::Tensor>(tensor(*h)) : std::nullopt;
}
std::vector<at::Tensor> list(const AtenTensorHandle* h, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) out.push_back(tensor(h[i]));
  return out;
}
// A pointer to the list's pointer (codegen::c_shim says why it is read only for a length above
// 0). The list lives as long as the call's full expression, which the op's TensorList views.
std::optional<std::vector<at::Tensor>> optional_list(const void* h, int64_t n) {
  if (h == nullptr) return std::nullopt;
  if (n == 0) return std::vector<at::Tensor>();
  return list(*static_cast<const AtenTensorHandle* const*>(h), n);
}
}  // namespace fact_shim

extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_gemm(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* bias, const char* origin, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(gemm(fact_shim::tensor(a), fact_shim::tensor(b), fact_shim::optional(bias), c10::string_view(origin), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_gemm(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* bias, const char* origin, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(gemm(fact_shim::tensor(a), fact_shim::tensor(b), fact_shim::optional(bias), c10::string_view(origin), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_gemm_ep(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* bias, const void* leaves, int64_t leaves_len_, const char* origin, const char* epilogue, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(gemm_ep(fact_shim::tensor(a), fact_shim::tensor(b), fact_shim::optional(bias), fact_shim::optional_list(leaves, leaves_len_), c10::string_view(origin), c10::string_view(epilogue), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_gemm_ep(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* bias, const void* leaves, int64_t leaves_len_, const char* origin, const char* epilogue, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(gemm_ep(fact_shim::tensor(a), fact_shim::tensor(b), fact_shim::optional(bias), fact_shim::optional_list(leaves, leaves_len_), c10::string_view(origin), c10::string_view(epilogue), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_attention(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v, AtenTensorHandle* mask, AtenTensorHandle* scale, const char* form, const char* kernel, AtenTensorHandle* cond, AtenTensorHandle* fill, AtenTensorHandle* window, AtenTensorHandle* plus, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(attention(fact_shim::tensor(q), fact_shim::tensor(k), fact_shim::tensor(v), fact_shim::optional(mask), fact_shim::optional(scale), c10::string_view(form), c10::string_view(kernel), fact_shim::optional(cond), fact_shim::optional(fill), fact_shim::optional(window), fact_shim::optional(plus))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_attention(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v, AtenTensorHandle* mask, AtenTensorHandle* scale, const char* form, const char* kernel, AtenTensorHandle* cond, AtenTensorHandle* fill, AtenTensorHandle* window, AtenTensorHandle* plus, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(attention(fact_shim::tensor(q), fact_shim::tensor(k), fact_shim::tensor(v), fact_shim::optional(mask), fact_shim::optional(scale), c10::string_view(form), c10::string_view(kernel), fact_shim::optional(cond), fact_shim::optional(fill), fact_shim::optional(window), fact_shim::optional(plus))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_layernorm(AtenTensorHandle x, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(layernorm(fact_shim::tensor(x), at::IntArrayRef(normalized_shape, normalized_shape_len_), fact_shim::optional(weight), fact_shim::optional(bias), eps, c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_layernorm(AtenTensorHandle x, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(layernorm(fact_shim::tensor(x), at::IntArrayRef(normalized_shape, normalized_shape_len_), fact_shim::optional(weight), fact_shim::optional(bias), eps, c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_layernorm_written(AtenTensorHandle x, AtenTensorHandle* weight, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(layernorm_written(fact_shim::tensor(x), fact_shim::optional(weight), c10::string_view(eps), c10::string_view(form), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_layernorm_written(AtenTensorHandle x, AtenTensorHandle* weight, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(layernorm_written(fact_shim::tensor(x), fact_shim::optional(weight), c10::string_view(eps), c10::string_view(form), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_layernorm_add(AtenTensorHandle a, AtenTensorHandle b, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* dtypes, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(layernorm_add(fact_shim::tensor(a), fact_shim::tensor(b), at::IntArrayRef(normalized_shape, normalized_shape_len_), fact_shim::optional(weight), fact_shim::optional(bias), eps, c10::string_view(dtypes), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_layernorm_add(AtenTensorHandle a, AtenTensorHandle b, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* dtypes, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(layernorm_add(fact_shim::tensor(a), fact_shim::tensor(b), at::IntArrayRef(normalized_shape, normalized_shape_len_), fact_shim::optional(weight), fact_shim::optional(bias), eps, c10::string_view(dtypes), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_layernorm_add_sum(AtenTensorHandle a, AtenTensorHandle b, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* dtypes, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = layernorm_add_sum(fact_shim::tensor(a), fact_shim::tensor(b), at::IntArrayRef(normalized_shape, normalized_shape_len_), fact_shim::optional(weight), fact_shim::optional(bias), eps, c10::string_view(dtypes), c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_layernorm_add_sum(AtenTensorHandle a, AtenTensorHandle b, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* dtypes, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = layernorm_add_sum(fact_shim::tensor(a), fact_shim::tensor(b), at::IntArrayRef(normalized_shape, normalized_shape_len_), fact_shim::optional(weight), fact_shim::optional(bias), eps, c10::string_view(dtypes), c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_rmsnorm(AtenTensorHandle x, AtenTensorHandle* weight, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(rmsnorm(fact_shim::tensor(x), fact_shim::optional(weight), c10::string_view(eps), c10::string_view(form), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_rmsnorm(AtenTensorHandle x, AtenTensorHandle* weight, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(rmsnorm(fact_shim::tensor(x), fact_shim::optional(weight), c10::string_view(eps), c10::string_view(form), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_rmsnorm_add(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* weight, const char* eps, const char* form, const char* dtypes, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(rmsnorm_add(fact_shim::tensor(a), fact_shim::tensor(b), fact_shim::optional(weight), c10::string_view(eps), c10::string_view(form), c10::string_view(dtypes), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_rmsnorm_add(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* weight, const char* eps, const char* form, const char* dtypes, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(rmsnorm_add(fact_shim::tensor(a), fact_shim::tensor(b), fact_shim::optional(weight), c10::string_view(eps), c10::string_view(form), c10::string_view(dtypes), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_rmsnorm_add_sum(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* weight, const char* eps, const char* form, const char* dtypes, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = rmsnorm_add_sum(fact_shim::tensor(a), fact_shim::tensor(b), fact_shim::optional(weight), c10::string_view(eps), c10::string_view(form), c10::string_view(dtypes), c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_rmsnorm_add_sum(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* weight, const char* eps, const char* form, const char* dtypes, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = rmsnorm_add_sum(fact_shim::tensor(a), fact_shim::tensor(b), fact_shim::optional(weight), c10::string_view(eps), c10::string_view(form), c10::string_view(dtypes), c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_rotary(AtenTensorHandle x, AtenTensorHandle cos, AtenTensorHandle sin, int64_t rotary_dim, int64_t form, int64_t layout, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(rotary(fact_shim::tensor(x), fact_shim::tensor(cos), fact_shim::tensor(sin), rotary_dim, form, layout, c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_rotary(AtenTensorHandle x, AtenTensorHandle cos, AtenTensorHandle sin, int64_t rotary_dim, int64_t form, int64_t layout, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(rotary(fact_shim::tensor(x), fact_shim::tensor(cos), fact_shim::tensor(sin), rotary_dim, form, layout, c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_rotary_qk(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle cos, AtenTensorHandle sin, int64_t rotary_dim, int64_t form, int64_t layout, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = rotary_qk(fact_shim::tensor(q), fact_shim::tensor(k), fact_shim::tensor(cos), fact_shim::tensor(sin), rotary_dim, form, layout, c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_rotary_qk(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle cos, AtenTensorHandle sin, int64_t rotary_dim, int64_t form, int64_t layout, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = rotary_qk(fact_shim::tensor(q), fact_shim::tensor(k), fact_shim::tensor(cos), fact_shim::tensor(sin), rotary_dim, form, layout, c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_glu(AtenTensorHandle x, AtenTensorHandle w_gate, AtenTensorHandle* b_gate, AtenTensorHandle* w_up, AtenTensorHandle* b_up, AtenTensorHandle w, AtenTensorHandle* b, const char* act, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(glu(fact_shim::tensor(x), fact_shim::tensor(w_gate), fact_shim::optional(b_gate), fact_shim::optional(w_up), fact_shim::optional(b_up), fact_shim::tensor(w), fact_shim::optional(b), c10::string_view(act), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_glu(AtenTensorHandle x, AtenTensorHandle w_gate, AtenTensorHandle* b_gate, AtenTensorHandle* w_up, AtenTensorHandle* b_up, AtenTensorHandle w, AtenTensorHandle* b, const char* act, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(glu(fact_shim::tensor(x), fact_shim::tensor(w_gate), fact_shim::optional(b_gate), fact_shim::optional(w_up), fact_shim::optional(b_up), fact_shim::tensor(w), fact_shim::optional(b), c10::string_view(act), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_patch_conv(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t r, int64_t s, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(patch_conv(fact_shim::tensor(x), fact_shim::tensor(w), fact_shim::optional(b), r, s, c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_patch_conv(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t r, int64_t s, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(patch_conv(fact_shim::tensor(x), fact_shim::tensor(w), fact_shim::optional(b), r, s, c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_conv(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, const int64_t* stride, int64_t stride_len_, const int64_t* padding, int64_t padding_len_, const int64_t* dilation, int64_t dilation_len_, int64_t groups, AtenTensorHandle* bn_weight, AtenTensorHandle* bn_bias, AtenTensorHandle* bn_mean, AtenTensorHandle* bn_var, AtenTensorHandle* residual, AtenTensorHandle w_kernel, AtenTensorHandle* b_kernel, const char* form, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(conv(fact_shim::tensor(x), fact_shim::tensor(weight), fact_shim::optional(bias), at::IntArrayRef(stride, stride_len_), at::IntArrayRef(padding, padding_len_), at::IntArrayRef(dilation, dilation_len_), groups, fact_shim::optional(bn_weight), fact_shim::optional(bn_bias), fact_shim::optional(bn_mean), fact_shim::optional(bn_var), fact_shim::optional(residual), fact_shim::tensor(w_kernel), fact_shim::optional(b_kernel), c10::string_view(form), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_conv(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, const int64_t* stride, int64_t stride_len_, const int64_t* padding, int64_t padding_len_, const int64_t* dilation, int64_t dilation_len_, int64_t groups, AtenTensorHandle* bn_weight, AtenTensorHandle* bn_bias, AtenTensorHandle* bn_mean, AtenTensorHandle* bn_var, AtenTensorHandle* residual, AtenTensorHandle w_kernel, AtenTensorHandle* b_kernel, const char* form, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(conv(fact_shim::tensor(x), fact_shim::tensor(weight), fact_shim::optional(bias), at::IntArrayRef(stride, stride_len_), at::IntArrayRef(padding, padding_len_), at::IntArrayRef(dilation, dilation_len_), groups, fact_shim::optional(bn_weight), fact_shim::optional(bn_bias), fact_shim::optional(bn_mean), fact_shim::optional(bn_var), fact_shim::optional(residual), fact_shim::tensor(w_kernel), fact_shim::optional(b_kernel), c10::string_view(form), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_grn(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle bias, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(grn(fact_shim::tensor(x), fact_shim::tensor(weight), fact_shim::tensor(bias), c10::string_view(eps), c10::string_view(form), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_grn(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle bias, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ *ret0 = torch::aot_inductor::new_tensor_handle(grn(fact_shim::tensor(x), fact_shim::tensor(weight), fact_shim::tensor(bias), c10::string_view(eps), c10::string_view(form), c10::string_view(kernel))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_linears2(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = linears2(fact_shim::tensor(x), fact_shim::tensor(w), fact_shim::optional(b), n0, n1, c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_linears2(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = linears2(fact_shim::tensor(x), fact_shim::tensor(w), fact_shim::optional(b), n0, n1, c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_linears3(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, int64_t n2, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1, AtenTensorHandle* ret2) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = linears3(fact_shim::tensor(x), fact_shim::tensor(w), fact_shim::optional(b), n0, n1, n2, c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); *ret2 = torch::aot_inductor::new_tensor_handle(std::move(std::get<2>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_linears3(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, int64_t n2, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1, AtenTensorHandle* ret2) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = linears3(fact_shim::tensor(x), fact_shim::tensor(w), fact_shim::optional(b), n0, n1, n2, c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); *ret2 = torch::aot_inductor::new_tensor_handle(std::move(std::get<2>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cpu_linears4(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, int64_t n2, int64_t n3, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1, AtenTensorHandle* ret2, AtenTensorHandle* ret3) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = linears4(fact_shim::tensor(x), fact_shim::tensor(w), fact_shim::optional(b), n0, n1, n2, n3, c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); *ret2 = torch::aot_inductor::new_tensor_handle(std::move(std::get<2>(r))); *ret3 = torch::aot_inductor::new_tensor_handle(std::move(std::get<3>(r))); });
}
extern "C" __attribute__((visibility("default"))) AOTITorchError aoti_torch_cuda_linears4(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, int64_t n2, int64_t n3, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1, AtenTensorHandle* ret2, AtenTensorHandle* ret3) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({ auto r = linears4(fact_shim::tensor(x), fact_shim::tensor(w), fact_shim::optional(b), n0, n1, n2, n3, c10::string_view(kernel)); *ret0 = torch::aot_inductor::new_tensor_handle(std::move(std::get<0>(r))); *ret1 = torch::aot_inductor::new_tensor_handle(std::move(std::get<1>(r))); *ret2 = torch::aot_inductor::new_tensor_handle(std::move(std::get<2>(r))); *ret3 = torch::aot_inductor::new_tensor_handle(std::move(std::get<3>(r))); });
}

extern "C" const char* fact_c_shims(void) { return R"fact_shims({"attention":["AOTITorchError aoti_torch_cpu_attention(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v, AtenTensorHandle* mask, AtenTensorHandle* scale, const char* form, const char* kernel, AtenTensorHandle* cond, AtenTensorHandle* fill, AtenTensorHandle* window, AtenTensorHandle* plus, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_attention(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle v, AtenTensorHandle* mask, AtenTensorHandle* scale, const char* form, const char* kernel, AtenTensorHandle* cond, AtenTensorHandle* fill, AtenTensorHandle* window, AtenTensorHandle* plus, AtenTensorHandle* ret0)"],"conv":["AOTITorchError aoti_torch_cpu_conv(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, const int64_t* stride, int64_t stride_len_, const int64_t* padding, int64_t padding_len_, const int64_t* dilation, int64_t dilation_len_, int64_t groups, AtenTensorHandle* bn_weight, AtenTensorHandle* bn_bias, AtenTensorHandle* bn_mean, AtenTensorHandle* bn_var, AtenTensorHandle* residual, AtenTensorHandle w_kernel, AtenTensorHandle* b_kernel, const char* form, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_conv(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle* bias, const int64_t* stride, int64_t stride_len_, const int64_t* padding, int64_t padding_len_, const int64_t* dilation, int64_t dilation_len_, int64_t groups, AtenTensorHandle* bn_weight, AtenTensorHandle* bn_bias, AtenTensorHandle* bn_mean, AtenTensorHandle* bn_var, AtenTensorHandle* residual, AtenTensorHandle w_kernel, AtenTensorHandle* b_kernel, const char* form, const char* kernel, AtenTensorHandle* ret0)"],"gemm":["AOTITorchError aoti_torch_cpu_gemm(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* bias, const char* origin, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_gemm(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* bias, const char* origin, const char* kernel, AtenTensorHandle* ret0)"],"gemm_ep":["AOTITorchError aoti_torch_cpu_gemm_ep(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* bias, const void* leaves, int64_t leaves_len_, const char* origin, const char* epilogue, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_gemm_ep(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* bias, const void* leaves, int64_t leaves_len_, const char* origin, const char* epilogue, const char* kernel, AtenTensorHandle* ret0)"],"glu":["AOTITorchError aoti_torch_cpu_glu(AtenTensorHandle x, AtenTensorHandle w_gate, AtenTensorHandle* b_gate, AtenTensorHandle* w_up, AtenTensorHandle* b_up, AtenTensorHandle w, AtenTensorHandle* b, const char* act, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_glu(AtenTensorHandle x, AtenTensorHandle w_gate, AtenTensorHandle* b_gate, AtenTensorHandle* w_up, AtenTensorHandle* b_up, AtenTensorHandle w, AtenTensorHandle* b, const char* act, const char* kernel, AtenTensorHandle* ret0)"],"grn":["AOTITorchError aoti_torch_cpu_grn(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle bias, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_grn(AtenTensorHandle x, AtenTensorHandle weight, AtenTensorHandle bias, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0)"],"layernorm":["AOTITorchError aoti_torch_cpu_layernorm(AtenTensorHandle x, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_layernorm(AtenTensorHandle x, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* kernel, AtenTensorHandle* ret0)"],"layernorm_add":["AOTITorchError aoti_torch_cpu_layernorm_add(AtenTensorHandle a, AtenTensorHandle b, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* dtypes, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_layernorm_add(AtenTensorHandle a, AtenTensorHandle b, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* dtypes, const char* kernel, AtenTensorHandle* ret0)"],"layernorm_add_sum":["AOTITorchError aoti_torch_cpu_layernorm_add_sum(AtenTensorHandle a, AtenTensorHandle b, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* dtypes, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1)","AOTITorchError aoti_torch_cuda_layernorm_add_sum(AtenTensorHandle a, AtenTensorHandle b, const int64_t* normalized_shape, int64_t normalized_shape_len_, AtenTensorHandle* weight, AtenTensorHandle* bias, double eps, const char* dtypes, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1)"],"layernorm_written":["AOTITorchError aoti_torch_cpu_layernorm_written(AtenTensorHandle x, AtenTensorHandle* weight, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_layernorm_written(AtenTensorHandle x, AtenTensorHandle* weight, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0)"],"linears2":["AOTITorchError aoti_torch_cpu_linears2(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1)","AOTITorchError aoti_torch_cuda_linears2(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1)"],"linears3":["AOTITorchError aoti_torch_cpu_linears3(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, int64_t n2, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1, AtenTensorHandle* ret2)","AOTITorchError aoti_torch_cuda_linears3(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, int64_t n2, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1, AtenTensorHandle* ret2)"],"linears4":["AOTITorchError aoti_torch_cpu_linears4(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, int64_t n2, int64_t n3, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1, AtenTensorHandle* ret2, AtenTensorHandle* ret3)","AOTITorchError aoti_torch_cuda_linears4(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t n0, int64_t n1, int64_t n2, int64_t n3, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1, AtenTensorHandle* ret2, AtenTensorHandle* ret3)"],"patch_conv":["AOTITorchError aoti_torch_cpu_patch_conv(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t r, int64_t s, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_patch_conv(AtenTensorHandle x, AtenTensorHandle w, AtenTensorHandle* b, int64_t r, int64_t s, const char* kernel, AtenTensorHandle* ret0)"],"rmsnorm":["AOTITorchError aoti_torch_cpu_rmsnorm(AtenTensorHandle x, AtenTensorHandle* weight, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_rmsnorm(AtenTensorHandle x, AtenTensorHandle* weight, const char* eps, const char* form, const char* kernel, AtenTensorHandle* ret0)"],"rmsnorm_add":["AOTITorchError aoti_torch_cpu_rmsnorm_add(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* weight, const char* eps, const char* form, const char* dtypes, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_rmsnorm_add(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* weight, const char* eps, const char* form, const char* dtypes, const char* kernel, AtenTensorHandle* ret0)"],"rmsnorm_add_sum":["AOTITorchError aoti_torch_cpu_rmsnorm_add_sum(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* weight, const char* eps, const char* form, const char* dtypes, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1)","AOTITorchError aoti_torch_cuda_rmsnorm_add_sum(AtenTensorHandle a, AtenTensorHandle b, AtenTensorHandle* weight, const char* eps, const char* form, const char* dtypes, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1)"],"rotary":["AOTITorchError aoti_torch_cpu_rotary(AtenTensorHandle x, AtenTensorHandle cos, AtenTensorHandle sin, int64_t rotary_dim, int64_t form, int64_t layout, const char* kernel, AtenTensorHandle* ret0)","AOTITorchError aoti_torch_cuda_rotary(AtenTensorHandle x, AtenTensorHandle cos, AtenTensorHandle sin, int64_t rotary_dim, int64_t form, int64_t layout, const char* kernel, AtenTensorHandle* ret0)"],"rotary_qk":["AOTITorchError aoti_torch_cpu_rotary_qk(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle cos, AtenTensorHandle sin, int64_t rotary_dim, int64_t form, int64_t layout, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1)","AOTITorchError aoti_torch_cuda_rotary_qk(AtenTensorHandle q, AtenTensorHandle k, AtenTensorHandle cos, AtenTensorHandle sin, int64_t rotary_dim, int64_t form, int64_t layout, const char* kernel, AtenTensorHandle* ret0, AtenTensorHandle* ret1)"]})fact_shims"; }
