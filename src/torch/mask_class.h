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
#pragma once

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
