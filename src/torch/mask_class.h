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

// The class of `mask` as the scores [B, H, Tq, Tk] see it: broadcast from the right, as SDPA and
// masked_fill broadcast it (for q of rank 3, `q_rank` 3, the scores are [B, Tq, Tk], one head).
// A few small ops on the mask's device and one host sync (the flags); a dim of stride 0 (an
// expand) is read once.
inline MaskValue classify(const at::Tensor& mask, MaskMode mode, int64_t q_rank, int64_t b, int64_t h, int64_t tq,
                          int64_t tk) {
  MaskValue general;
  if (!mask.defined() || tq < 1 || tk < 1 || b < 1 || h < 1 || mask.dim() > q_rank) return general;
  at::Tensor m = mask;
  while (m.dim() < q_rank) m = m.unsqueeze(0);
  if (q_rank == 3) m = m.unsqueeze(1);
  if (m.dim() != 4) return general;
  const int64_t want[4] = {b, h, tq, tk};
  for (int64_t d = 0; d < 4; ++d) {
    if (m.size(d) != 1 && m.size(d) != want[d]) return general;
    if (m.size(d) > 1 && m.stride(d) == 0) m = m.narrow(d, 0, 1);
  }
  const at::TensorOptions bools = at::TensorOptions().dtype(at::kBool).device(m.device());
  at::Tensor vis;
  at::Tensor valid = at::ones({}, bools);
  switch (mode) {
    case MaskMode::Bool:
      if (m.scalar_type() != at::kBool) return general;
      vis = m;
      break;
    case MaskMode::Additive: {
      if (!at::isFloatingType(m.scalar_type())) return general;
      vis = m == 0;
      valid = (vis | (m <= masked_bound(m.scalar_type()))).all();
      break;
    }
    case MaskMode::Not:
    case MaskMode::Eq0:
    case MaskMode::Fill: {
      const at::Tensor fill = mode == MaskMode::Not ? at::bitwise_not(m) : mode == MaskMode::Eq0 ? at::eq(m, 0) : m;
      if (fill.scalar_type() != at::kBool) return general;
      vis = at::logical_not(fill);
      break;
    }
  }
  const at::TensorOptions longs = at::TensorOptions().dtype(at::kLong).device(m.device());
  const at::Tensor j = at::arange(tk, longs);
  const at::Tensor tri = j.view({1, tk}) <= at::arange(tq, longs).view({tq, 1});
  const at::Tensor lengths = vis.select(2, vis.size(2) - 1).select(1, 0).sum(-1);
  const at::Tensor prefix = j.view({1, 1, 1, tk}) < lengths.view({-1, 1, 1, 1});
  const at::Tensor flags = at::stack({valid.reshape({}), vis.all(), at::eq(vis, tri).all(), at::eq(vis, prefix).all(),
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

}  // namespace fact_mask
