//! Attention rule: `attention[_causal]`.
//!
//! out[b,h,i,:] = Σ_j p[b,h,i,j] · v[b,h,j,:],  p[b,h,i,:] = softmax_j(s · q[b,h,i,:]·k[b,h,j,:] + m[i,j])
//! where m[i,j] = -∞ for j > i under the causal mask (aligned at the top left: query i sees keys
//! 0..=i) and 0 otherwise, and s is the scale. Two forms in a graph:
//! - explicit: `matmul(q, transpose(k, -2, -1))`, then `mul` by a constant s or `div` by a
//!   constant 1/s (or neither; the factor may also be a one-element tensor the graph computes, as
//!   tracing records `(c // h) ** 0.5` from a runtime shape, or one per head, [H,1,1], Swin V2's
//!   logit scale over its normalized q and k), then optionally `masked_fill(·, mask, -inf)`, then `softmax(·, -1)`,
//!   then optionally `dropout(·, p, train=False)`, then `matmul(·, v)`. The mask is `~x`, `x == 0`
//!   or `x` itself; which cells it fills is known only at run time, so the op checks the mask
//!   tensor once (per tensor, cached) and runs the kernel only for the causal one. Or the mask
//!   is added to the scores (`add(·, m)`, GPT-J's, GPT-Neo's and hand-written models' additive
//!   mask), matched by what the graph knows of its value as SDPA's attn_mask is (below). GPT-J
//!   also casts q and k to fp32 before the product and the probabilities to v's dtype after the
//!   softmax (`upcast`): the kernel reads q and k as they were and accumulates in fp32 as that
//!   product does, and rounds the probabilities to v's dtype as the cast does. GPT-Neo also
//!   replaces the scores where a bool buffer's slice is false by finfo.min before the add
//!   (`where`, a second mask the bridge classifies; the two classes meet), and reads q's and k's
//!   lengths after the casts, which then stay in the graph for those sizes. A bias may stand
//!   beside the mask (`plus`): MPNet adds its relative position bias (in place) and then its
//!   padding mask, two terms the bridge classifies, the one of a class the kernels compute being
//!   the mask and the other the bias; MPT adds ALiBi ([H,1,Tk], one row of keys per head) before
//!   a `masked_fill` whose value is finfo.min rather than -inf (`fill`: at or below half the
//!   scores' lowest value, it masks as -inf does wherever a query sees a key).
//! - `aten::scaled_dot_product_attention(q, k, v, attn_mask?, 0.0, is_causal, scale?, enable_gqa)`.
//!   A mask (bool: true = visible; or additive: 0 = visible, -inf or finfo.min-like = masked,
//!   broadcast over batch and heads, [B|1, H|1, Tq|1, Tk]) is matched by what the graph knows of
//!   its value (`graph::MaskFact`, from the bridge's evaluation of its producers): every key
//!   visible, causal, key padding (a prefix of keys per sequence) or both set the problem's
//!   `causal` and `padded`; a general or unknown mask is no match (`sdpa_refusals` says why). A
//!   mask whose producers read input data (a user's attention_mask) was classified on one
//!   example, so its kernel is the padded one of its class: it also runs the padded masks other
//!   inputs give. The op classifies the mask it is given at run time and runs the kernel only
//!   where the mask's class fits the kernel's.
//!
//! q, k and v are [B,H,T,D] (or [B,T,D]: one head) with equal B and D; the kernel reads them
//! through their strides, so views of one qkv projection need no copies. Grouped-query SDPA: k and
//! v with Hkv heads dividing q's H, through `enable_gqa=True`, one head that SDPA broadcasts
//! (multi-query attention as Falcon writes it), or repeated to H heads before the
//! call as Hugging Face's repeat_kv writes it (`k[:, :, None]` → expand [B,Hkv,G,T,D] → reshape
//! [B,Hkv·G,T,D], or `repeat_interleave(k, G, 1)`): the match reads the un-repeated k and v (query
//! head h reads k/v head h / G, never copied) and owns the repeat nodes nothing else reads. The
//! intermediates (scores, probabilities) must be used only inside the pattern.
//!
//! `AttentionRule` offers each form's match; the explicit form's two products are GEMMs of the
//! GEMM rules too, and the cover gives them to the attention (it computes more products).

use super::{AttentionBias, AttentionOrigin, AttentionProblem, ATTENTION};
use crate::graph::{Const, Graph, MaskClass, MaskFact, NodeId, ValueId};
use crate::rules::{boxed, Match, PatternKind, Rule};
use crate::types::DType;

/// A factor of the explicit form's scale: a constant, or a one-element tensor of the graph.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Factor {
    Const(f64),
    Tensor(ValueId),
}

/// How the explicit form scales the scores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    None,
    Mul(Factor),
    Div(Factor),
    /// SDPA's: `scale` when given, else 1/√D.
    Sdpa(Option<f64>),
}

/// How the mask operand `x` marks the masked cells: the explicit form's `masked_fill` derives
/// them from x, SDPA takes x as its attn_mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskMode {
    /// `masked_fill(·, ~x, -inf)`: x marks the cells kept.
    Not,
    /// `masked_fill(·, x == 0, -inf)`: nonzero x marks the cells kept.
    Eq0,
    /// `masked_fill(·, x, -inf)`: x marks the cells filled.
    Fill,
    /// SDPA's bool attn_mask: x marks the cells kept.
    Bool,
    /// SDPA's float attn_mask, or the explicit form's mask, added to the scores.
    Add,
}

impl MaskMode {
    fn text(self) -> &'static str {
        match self {
            MaskMode::Not => "not",
            MaskMode::Eq0 => "eq0",
            MaskMode::Fill => "fill",
            MaskMode::Bool => "bool",
            MaskMode::Add => "add",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct AttentionMatch {
    /// Every node the pattern replaces, in program order; the last produces the output.
    pub nodes: Vec<NodeId>,
    pub q: ValueId,
    /// The key as [.., Tk, D] (before the explicit form's transpose).
    pub k: ValueId,
    pub v: ValueId,
    /// The tensor the mask is derived from (MaskMode), when the explicit form masks, or SDPA's
    /// attn_mask.
    pub mask: Option<(ValueId, MaskMode)>,
    /// SDPA's attn_mask reads only the inputs' sizes (with constants and module state), as a
    /// decoder's causal mask built from its positions does: the op may classify it once per
    /// shape, not once per forward (which costs a host sync each forward).
    pub mask_static: bool,
    /// GPT-Neo's `where(c, scores, fill)` before the added mask: the bool condition c (true:
    /// kept) and the fill (a constant at or below half the scores' lowest value, so the cells it
    /// fills are masked). The op reads both: the fallback replays the where.
    pub cond: Option<(ValueId, ValueId)>,
    /// SDPA's mask made by `where(c, bias, fill)` (Hugging Face's SDPA integration for a
    /// position bias, T5's): the bool c (true: kept) and the constant fill; the match's mask is
    /// the bias. The kernel computes c's class and adds the bias; the fallback replays the where.
    pub where_mask: Option<(ValueId, f64)>,
    /// Swin's shifted windows: after the added mask (its relative position bias) the scores are
    /// viewed [B/W, W, H, Tq, Tk], this per-window mask ([1|B/W, W, 1|H, Tq, Tk]) is added, and
    /// they are viewed back. The op reads it beside the mask; the kernel adds both as one bias,
    /// window b % W's for sequence b.
    pub window: Option<ValueId>,
    pub scale: Scale,
    /// The explicit form scales the scores after adding the mask (CodeGen's
    /// `softmax((q·kᵀ + m) / c)`): the fallback replays that order; the kernel's is the same
    /// function, since the scale (a positive constant) keeps masked cells masked.
    pub scale_last: bool,
    /// The explicit form scales q by a constant before the product (Swin's `q * c`): the
    /// fallback replays that order; the kernel scales the product by c.
    pub scale_q: bool,
    /// SDPA's `enable_gqa=True` (k and v of fewer heads than q).
    pub gqa: bool,
    /// k and v as the graph repeated them G times along the heads before SDPA (`k` and `v` are
    /// the un-repeated tensors, the repeat's nodes are the match's where nothing else reads them).
    pub repeat: Option<i64>,
    /// The explicit form's q and k cast to fp32 before q·kᵀ and the probabilities cast to v's
    /// dtype after the softmax (GPT-J); `q` and `k` are the tensors before the casts.
    pub upcast: bool,
    /// The explicit form's softmax runs in fp32 (`softmax(x, -1, dtype=float32)` or over
    /// `x.float()`) and its probabilities are cast back to v's dtype (Hugging Face's eager
    /// attention, MPT's, T5's).
    pub softmax_f32: bool,
    /// A bias the explicit form adds to the scaled scores beside its mask (MPNet's relative
    /// position bias before its padding mask, MPT's ALiBi before its causal fill), and whether
    /// the graph adds it before or after the mask: the op reads it as `plus`, the kernel adds it
    /// and computes the mask by its class (the problem's `bias`).
    pub plus: Option<(ValueId, Order)>,
    /// The explicit form's masked_fill value where it is not -inf: a constant at or below half
    /// the scores' lowest value (MPT's finfo.min), which masks a cell as -inf does wherever a
    /// query sees some key (the op's classification sends the other masks to the fallback).
    pub fill: Option<f64>,
    /// The memory order of the output [B,H,Tq,D] as the graph recorded it (dims outermost
    /// first), where it is not the kernels' [B,Tq,H,D] (0, 2, 1, 3): SDPA's CUDA kernels lay
    /// their output out as q's, and the graph after it may rely on that (an exported program
    /// records a `view` where the layout allowed one). The op lays its output out so.
    pub out_order: Option<[usize; 4]>,
    pub problem: AttentionProblem,
}

/// Where a bias stands against the mask it is added beside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Before,
    After,
}

impl AttentionMatch {
    /// The multiplier the kernel applies to q·k; None when a tensor of the graph holds it.
    pub fn kernel_scale(&self) -> Option<f64> {
        match self.scale {
            Scale::None => Some(1.0),
            Scale::Mul(Factor::Const(s)) => Some(s),
            Scale::Div(Factor::Const(d)) => Some(1.0 / d),
            Scale::Mul(Factor::Tensor(_)) | Scale::Div(Factor::Tensor(_)) => None,
            Scale::Sdpa(Some(s)) => Some(s),
            Scale::Sdpa(None) => Some(1.0 / (self.problem.head_dim as f64).sqrt()),
        }
    }
    /// The mask class the kernel is built for (the problem's `causal` and `padded`).
    pub fn kernel_mask(&self) -> MaskClass {
        match (self.problem.causal, self.problem.padded) {
            (false, false) => MaskClass::None,
            (true, false) => MaskClass::Causal,
            (false, true) => MaskClass::Padded,
            (true, true) => MaskClass::CausalPadded,
        }
    }
    /// The one-element tensor the scale comes from, when the graph computes it.
    pub fn scale_operand(&self) -> Option<ValueId> {
        match self.scale {
            Scale::Mul(Factor::Tensor(v)) | Scale::Div(Factor::Tensor(v)) => Some(v),
            _ => None,
        }
    }
    /// The op's `form` argument: what its fallback recomputes exactly as the graph did, e.g.
    /// `explicit;div=8.0;mask=not`, `sdpa;causal;scale=0.125`; for SDPA with a mask the mask's
    /// kind and the class the kernel is built for, `sdpa;mask=bool;repeat=4;class=causal`
    /// (`causal` alone is SDPA's is_causal, `gqa` its enable_gqa, `repeat=G` k and v repeated
    /// by the graph, which the op's fallback repeats the same way).
    pub fn form(&self) -> String {
        let mut f = self.form_of_call();
        if let Some(o) = self.out_order {
            f.push_str(&format!(";out={},{},{},{}", o[0], o[1], o[2], o[3]));
        }
        f
    }

    fn form_of_call(&self) -> String {
        match self.scale {
            Scale::Sdpa(s) => {
                let mut f = "sdpa".to_string();
                if self.problem.causal && self.mask.is_none() {
                    f.push_str(";causal");
                }
                if let Some((_, mode)) = self.mask {
                    f.push_str(&format!(";mask={}", mode.text()));
                }
                if self.gqa {
                    f.push_str(";gqa");
                }
                if let Some(g) = self.repeat {
                    f.push_str(&format!(";repeat={g}"));
                }
                if let Some((_, fill)) = self.where_mask {
                    f.push_str(&format!(";where;fill={fill:?}"));
                }
                if self.mask.is_some() {
                    f.push_str(&format!(";class={}", self.kernel_mask().name()));
                    if self.problem.bias.is_some() {
                        f.push_str(";bias");
                    }
                    // A class read from a mask: once per shape where only sizes make it.
                    let classified = self.problem.bias.is_none() || self.where_mask.is_some();
                    if self.mask_static && classified {
                        f.push_str(";static");
                    }
                }
                if let Some(s) = s {
                    f.push_str(&format!(";scale={s:?}"));
                }
                f
            }
            scale => {
                let mut f = "explicit".to_string();
                let factor = |x: Factor| match x {
                    Factor::Const(c) => format!("{c:?}"),
                    // The op's `scale` operand.
                    Factor::Tensor(_) => "tensor".into(),
                };
                match scale {
                    Scale::Mul(s) => f.push_str(&format!(";mul={}", factor(s))),
                    Scale::Div(d) => f.push_str(&format!(";div={}", factor(d))),
                    _ => {}
                }
                if self.scale_last {
                    f.push_str(";scale_last");
                }
                if self.scale_q {
                    f.push_str(";scale_q");
                }
                if let Some((_, mode)) = self.mask {
                    f.push_str(&format!(";mask={}", mode.text()));
                    if let Some(x) = self.fill {
                        f.push_str(&format!(";fill={x:?}"));
                    }
                    // An added mask is classified as SDPA's is: the kernel's class goes with it.
                    if mode == MaskMode::Add {
                        f.push_str(&format!(";class={}", self.kernel_mask().name()));
                        if self.problem.bias.is_some() && self.plus.is_none() {
                            f.push_str(";bias");
                        } else if self.mask_static {
                            f.push_str(";static");
                        }
                    }
                }
                if let Some((_, order)) = self.plus {
                    f.push_str(match order {
                        Order::Before => ";plus=before",
                        Order::After => ";plus=after",
                    });
                }
                if self.upcast {
                    f.push_str(";upcast");
                }
                if self.softmax_f32 {
                    f.push_str(";softmax_f32");
                }
                if let Some(g) = self.repeat {
                    f.push_str(&format!(";repeat={g}"));
                }
                if self.cond.is_some() {
                    f.push_str(";where");
                }
                if self.window.is_some() {
                    f.push_str(";windows");
                }
                f
            }
        }
    }
}

impl Match for AttentionMatch {
    fn nodes(&self) -> Vec<NodeId> {
        self.nodes.clone()
    }
}

/// The attention rule: both forms.
pub struct AttentionRule;

impl Rule for AttentionRule {
    fn name(&self) -> &'static str {
        "attention"
    }
    fn kind(&self) -> PatternKind {
        ATTENTION
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_attention(g))
    }
}

struct Ctx<'g> {
    g: &'g Graph,
    uses: Vec<usize>,
    /// For each value, the nodes reading it.
    readers: Vec<Vec<NodeId>>,
}

impl<'g> Ctx<'g> {
    fn new(g: &'g Graph) -> Ctx<'g> {
        Ctx {
            g,
            uses: g.use_counts(),
            readers: g.readers(),
        }
    }
    fn producer(&self, v: ValueId, kind: &str) -> Option<NodeId> {
        let n = self.g.values[v].producer?;
        (self.g.nodes[n].kind == kind && self.g.nodes[n].depth == 0).then_some(n)
    }
    /// The one node reading `v` (an intermediate used nowhere else), if it is of `kind`.
    fn only_reader(&self, v: ValueId, kind: &str) -> Option<NodeId> {
        if self.uses[v] != 1 {
            return None;
        }
        let &[n] = self.readers[v].as_slice() else {
            return None;
        };
        (self.g.nodes[n].kind == kind).then_some(n)
    }
    fn int(&self, v: ValueId) -> Option<i64> {
        self.g.constant(v).and_then(Const::as_int)
    }
    fn float(&self, v: ValueId) -> Option<f64> {
        self.g.constant(v).and_then(Const::as_f64)
    }
    fn is_none(&self, v: ValueId) -> bool {
        matches!(self.g.constant(v), Some(Const::None))
    }
    fn out(&self, n: NodeId) -> ValueId {
        self.g.nodes[n].outputs[0]
    }
}

/// Every attention pattern of the top-level block.
pub fn match_attention(g: &Graph) -> Vec<AttentionMatch> {
    let cx = Ctx::new(g);
    (0..g.nodes.len())
        .filter(|&n| g.nodes[n].depth == 0)
        .filter_map(|n| match g.nodes[n].kind.as_str() {
            "aten::softmax" => explicit(&cx, n),
            "aten::scaled_dot_product_attention" => sdpa(&cx, n).ok(),
            _ => None,
        })
        .collect()
}

/// Why each top-level SDPA call the rule does not match is no pattern (the plan lists them).
pub fn sdpa_refusals(g: &Graph) -> Vec<(NodeId, String)> {
    let cx = Ctx::new(g);
    (0..g.nodes.len())
        .filter(|&n| {
            g.nodes[n].depth == 0 && g.nodes[n].kind == "aten::scaled_dot_product_attention"
        })
        .filter_map(|n| sdpa(&cx, n).err().map(|why| (n, why)))
        .collect()
}

fn explicit(cx: &Ctx, softmax: NodeId) -> Option<AttentionMatch> {
    let g = cx.g;
    let sm = &g.nodes[softmax];
    // softmax(x, dim=-1 or the last dim, dtype=None or float32): Hugging Face's eager attention
    // takes the softmax in fp32 (`softmax(x, -1, dtype=torch.float32)`, or `x.float()` before
    // it) and casts the probabilities back; the kernel's softmax is fp32 and it rounds the
    // probabilities to v's dtype for their product, as that cast does.
    let mut x = sm.inputs[0];
    let rank = g.tensor(x)?.shape.len() as i64;
    let dim = cx.int(*sm.inputs.get(1)?)?;
    // ScalarType 6 is float32.
    let f32_softmax = match sm.inputs.get(2) {
        None => false,
        Some(&d) if cx.is_none(d) => false,
        Some(&d) if cx.int(d) == Some(6) => true,
        Some(_) => return None,
    };
    if dim != -1 && dim != rank - 1 {
        return None;
    }
    let mut nodes = vec![softmax];
    let mut softmax_f32 = f32_softmax;
    if let Some((c, true)) = to_f32(cx, x).filter(|&(_, take)| take) {
        nodes.push(c);
        x = g.nodes[c].inputs[0];
        softmax_f32 = true;
    }
    // Backwards: masked_fill, then the scale, then q @ kᵀ; or (CodeGen's) the scale over the
    // scores plus an added mask; Swin's window mask over the scores viewed per window first.
    let mut s = x;
    let mut window = None;
    if let Some((w_nodes, w, inner)) = windowed(cx, s) {
        nodes.extend(w_nodes);
        window = Some(w);
        s = inner;
    }
    let mut mask = None;
    let mut added = None;
    let mut scale = Scale::None;
    let mut scale_last = false;
    if let Some((sc, last)) = scaled(cx, s).filter(|&(sc, f)| {
        window.is_none() && added_mask(cx, g.nodes[sc].inputs[0]).is_some() && keeps_masked(f)
    }) {
        nodes.push(sc);
        (scale, scale_last) = (last, true);
        s = g.nodes[sc].inputs[0];
    }
    let mut plus = None;
    let mut fill = None;
    if let Some((ad, m, scores)) = added_mask(cx, s) {
        nodes.push(ad);
        mask = Some((m, MaskMode::Add));
        added = Some(m);
        s = scores;
    } else if window.is_some() {
        // A window mask comes after the position bias the kernel adds with it.
        return None;
    } else if let Some(two) = two_added(cx, s) {
        // MPNet's position bias and padding mask added in turn.
        nodes.extend([two.outer, two.inner]);
        let (m, b, order) = two.roles(g)?;
        mask = Some((m, MaskMode::Add));
        added = Some(m);
        plus = Some((b, order));
        s = two.scores;
    } else if let Some(mf) = cx.producer(s, "aten::masked_fill") {
        let n = &g.nodes[mf];
        let dtype = g.tensor(s).and_then(|t| DType::parse(&t.dtype))?;
        // -inf, or a constant at or below half the dtype's lowest value (which -inf is too).
        let value = cx.float(n.inputs[2])?;
        if cx.uses[s] != 1 || !masks_cells(cx, n.inputs[2], dtype) {
            return None;
        }
        fill = (value != f64::NEG_INFINITY).then_some(value);
        let m = n.inputs[1];
        mask = Some(
            if let Some(not) = cx
                .producer(m, "aten::bitwise_not")
                .or_else(|| cx.producer(m, "aten::logical_not"))
            {
                if cx.uses[m] != 1 {
                    return None;
                }
                nodes.push(not);
                (g.nodes[not].inputs[0], MaskMode::Not)
            } else if let Some(eq) = cx
                .producer(m, "aten::eq")
                .filter(|&e| cx.float(g.nodes[e].inputs[1]) == Some(0.0))
            {
                if cx.uses[m] != 1 {
                    return None;
                }
                nodes.push(eq);
                (g.nodes[eq].inputs[0], MaskMode::Eq0)
            } else {
                (m, MaskMode::Fill)
            },
        );
        nodes.push(mf);
        s = n.inputs[0];
        // MPT's ALiBi, added to the scaled scores before the fill.
        if let Some((ad, b, scores)) = added_mask(cx, s) {
            nodes.push(ad);
            plus = Some((b, Order::Before));
            s = scores;
        }
    }
    // GPT-Neo's where(c, scores, fill) under the added mask.
    let mut cond = None;
    if added.is_some() {
        if let Some(w) = cx.producer(s, "aten::where") {
            let i = &g.nodes[w].inputs;
            let bool_cond = g.tensor(i[0]).is_some_and(|t| t.dtype == "bool");
            let dtype = g.tensor(s).and_then(|t| DType::parse(&t.dtype))?;
            if cx.uses[s] != 1 || i.len() != 3 || !bool_cond || !masks_cells(cx, i[2], dtype) {
                return None;
            }
            nodes.push(w);
            cond = Some((i[0], i[2]));
            s = i[1];
        }
    }
    if !scale_last {
        if let Some(sc) = ["aten::mul", "aten::div"]
            .iter()
            .find_map(|k| cx.producer(s, k))
        {
            let (sc, found) = scaled(cx, s).filter(|&(n, _)| n == sc)?;
            scale = found;
            nodes.push(sc);
            s = g.nodes[sc].inputs[0];
        }
    }
    let qk = cx.producer(s, "aten::matmul")?;
    if cx.uses[s] != 1 {
        return None;
    }
    nodes.push(qk);
    let (q, kt) = (g.nodes[qk].inputs[0], g.nodes[qk].inputs[1]);
    let tr = cx.producer(kt, "aten::transpose")?;
    let (a, b) = (
        cx.int(g.nodes[tr].inputs[1])?,
        cx.int(g.nodes[tr].inputs[2])?,
    );
    let kr = g.tensor(g.nodes[tr].inputs[0])?.shape.len() as i64;
    let norm = |d: i64| if d < 0 { d + kr } else { d };
    let (a, b) = (norm(a).min(norm(b)), norm(a).max(norm(b)));
    if (a, b) != (kr - 2, kr - 1) {
        return None;
    }
    let mut k = g.nodes[tr].inputs[0];
    // The transpose is the pattern's when nothing else reads it.
    if cx.uses[kt] == 1 {
        nodes.push(tr);
    }
    // Swin's scale on q before the product (`q * c`, read by the product alone; c a constant or,
    // as torchvision traces `(C // heads) ** -0.5` from a traced size, a one-element tensor),
    // where the scores are not scaled after it: the kernel scales the product by c instead.
    let mut q = q;
    let mut scale_q = false;
    if scale == Scale::None {
        if let Some((sc, found)) = scaled(cx, q) {
            nodes.push(sc);
            (scale, scale_q, q) = (found, true, g.nodes[sc].inputs[0]);
        }
    }
    // GPT-J's casts of q and k to fp32 (both or neither).
    let mut upcast = false;
    if let (Some((cq, take_q)), Some((ck, take_k))) = (to_f32(cx, q), to_f32(cx, k)) {
        nodes.extend(take_q.then_some(cq).into_iter().chain(take_k.then_some(ck)));
        (q, k, upcast) = (g.nodes[cq].inputs[0], g.nodes[ck].inputs[0], true);
    }
    // Forwards: the probabilities' cast where q and k were cast or the softmax ran in fp32,
    // optional eval dropout, then @ v.
    if upcast && softmax_f32 {
        return None;
    }
    let mut p = cx.out(softmax);
    let mut cast_p = None;
    if upcast || softmax_f32 {
        let c = cx.only_reader(p, "aten::to")?;
        nodes.push(c);
        cast_p = Some(c);
        p = cx.out(c);
    }
    if let Some(d) = cx.only_reader(p, "aten::dropout") {
        let n = &g.nodes[d];
        if !matches!(g.constant(n.inputs[2]), Some(Const::Bool(false))) {
            return None;
        }
        nodes.push(d);
        p = cx.out(d);
    }
    let pv = cx.only_reader(p, "aten::matmul")?;
    if g.nodes[pv].inputs[0] != p {
        return None;
    }
    nodes.push(pv);
    let v = g.nodes[pv].inputs[1];
    // The probabilities go to v's dtype, which q and k had (and the scores, where the softmax
    // alone ran in fp32).
    if softmax_f32 && g.tensor(x).map(|t| t.dtype.clone()) != g.tensor(v).map(|t| t.dtype.clone()) {
        return None;
    }
    if let Some(c) = cast_p {
        let dt = |x: ValueId| g.tensor(x).map(|t| t.dtype.clone());
        if dt(cx.out(c)) != dt(v) || dt(q) != dt(v) || dt(k) != dt(v) {
            return None;
        }
    }
    let mut form = ProblemForm {
        origin: AttentionOrigin::Explicit,
        causal: mask.is_some(),
        padded: false,
        masked: false,
        bias: None,
        mask_strided: false,
        grouped: false,
    };
    // Hugging Face's eager attention repeats the K/V heads (repeat_kv) before the products, as
    // its SDPA path does: the kernel reads them in place.
    let (k, v, repeat) = kv_in_place(cx, (k, v), &mut form, &mut nodes);
    let mut mask_static = false;
    let shape = |v: ValueId| g.tensor(v).map(|t| t.shape.clone()).unwrap_or_default();
    if let Some(m) = added {
        if !broadcasts_to_scores(&shape(m), &shape(q), &shape(k)) {
            return None;
        }
        let mut fact = g.values[m].mask;
        if let Some((c, _)) = cond {
            if !broadcasts_to_scores(&shape(c), &shape(q), &shape(k)) {
                return None;
            }
            fact = both(fact, g.values[c].mask);
        }
        // A bias is added to the scaled scores as the graph computes them: not under a where
        // (the kernel has no fill), a scale after it, or scores upcast from q's dtype.
        let bias = (cond.is_none() && !scale_last && !upcast && plus.is_none())
            .then(|| bias_of(g, m, q))
            .flatten();
        if let Some(w) = window {
            // The position bias shared by the sequences and the window mask make one bias per
            // window, whatever either holds.
            let windows = shape(w).get(1).copied()?;
            if bias != Some(AttentionBias::Shared) || g.tensor(w)?.dtype != g.tensor(m)?.dtype {
                return None;
            }
            fact = None;
            form.masked_by(fact, Some(AttentionBias::Windows(windows)))
                .ok()?;
        } else {
            form.masked_by(fact, bias).ok()?;
        }
        mask_static = fact.is_some_and(|f| f.shape_only);
    }
    if let Some((b, order)) = plus {
        // The kernel adds the bias to the scores it scaled, in q's dtype, and masks by the class
        // of the mask beside it (a mask no class describes is refused above).
        let alone = cond.is_none() && !scale_last && !upcast && form.bias.is_none();
        if !alone || !broadcasts_to_scores(&shape(b), &shape(q), &shape(k)) {
            return None;
        }
        let b = unexpanded(cx, b);
        form.bias = Some(bias_of(g, b, q)?);
        plus = Some((b, order));
    }
    let problem = problem(g, [q, k, v], form)?;
    nodes.sort();
    nodes.dedup();
    let out_order = out_order(g, &nodes);
    Some(AttentionMatch {
        nodes,
        q,
        k,
        v,
        mask,
        mask_static,
        cond,
        where_mask: None,
        window,
        scale,
        scale_last,
        scale_q,
        gqa: false,
        repeat,
        upcast,
        softmax_f32,
        plus,
        fill,
        out_order,
        problem,
    })
}

/// Swin's shifted-window mask over the scores `v`: `view(add(view(s, [B/W, W, H, Tq, Tk]), w),
/// [B, H, Tq, Tk])` (either add order, alpha 1, each intermediate read once), w broadcasting to
/// the 5-d scores with its own window dim W and a heads dim of 1 or H: (the three nodes, w, s).
fn windowed(cx: &Ctx, v: ValueId) -> Option<(Vec<NodeId>, ValueId, ValueId)> {
    let g = cx.g;
    let view = |x: ValueId| {
        ["aten::view", "aten::reshape"]
            .iter()
            .find_map(|k| cx.producer(x, k))
    };
    let shape = |x: ValueId| g.tensor(x).map(|t| t.shape.clone());
    let back = view(v)?;
    let x5 = g.nodes[back].inputs[0];
    let ad = cx.producer(x5, "aten::add")?;
    let i = &g.nodes[ad].inputs;
    if cx.uses[x5] != 1 || i.len() != 3 || cx.float(i[2]) != Some(1.0) {
        return None;
    }
    let (v5, w) = [(i[0], i[1]), (i[1], i[0])].into_iter().find(|&(a, _)| {
        view(a).is_some_and(|n| shape(g.nodes[n].inputs[0]).is_some_and(|d| d.len() == 4))
    })?;
    let fwd = view(v5)?;
    let s = g.nodes[fwd].inputs[0];
    let (outer, inner, wd, back_dims) = (shape(s)?, shape(v5)?, shape(w)?, shape(v)?);
    let &[b, h, tq, tk] = outer.as_slice() else {
        return None;
    };
    let &[b2, windows, h5, tq5, tk5] = inner.as_slice() else {
        return None;
    };
    let mask_ok = wd.len() == 5
        && (wd[0] == 1 || wd[0] == b2)
        && wd[1] == windows
        && (wd[2] == 1 || wd[2] == h)
        && wd[3] == tq
        && wd[4] == tk;
    if cx.uses[v5] != 1
        || back_dims != outer
        || (b2 * windows, h5, tq5, tk5) != (b, h, tq, tk)
        || !mask_ok
    {
        return None;
    }
    Some((vec![back, ad, fwd], w, s))
}

/// `v` as the scores scaled: `mul(x, f)` or `div(x, f)`, read once, f a finite nonzero constant,
/// a one-element tensor of the graph, or one per head ([H,1,1] or [1,H,1,1] against `v`'s
/// [B,H,T,T]: Swin V2's logit scale), which the op reads; (the node, the scale).
fn scaled(cx: &Ctx, v: ValueId) -> Option<(NodeId, Scale)> {
    let g = cx.g;
    let (sc, wrap) = [
        ("aten::mul", Scale::Mul as fn(Factor) -> Scale),
        ("aten::div", Scale::Div as fn(Factor) -> Scale),
    ]
    .into_iter()
    .find_map(|(kind, wrap)| cx.producer(v, kind).map(|n| (n, wrap)))?;
    let x = *g.nodes[sc].inputs.get(1)?;
    let factor = match cx.float(x) {
        Some(c) if c.is_finite() && c != 0.0 => Factor::Const(c),
        Some(_) => return None,
        // A one-element tensor (not the scores' own shape) or one per head: the op reads it.
        None if g.tensor(x).is_some_and(|t| {
            let one = t.shape.iter().product::<i64>() == 1 && t.shape.len() <= 1;
            one || g.tensor(v).is_some_and(|s| per_head(&t.shape, &s.shape))
        }) =>
        {
            Factor::Tensor(x)
        }
        None => return None,
    };
    (cx.uses[v] == 1).then_some((sc, wrap(factor)))
}

/// Whether a factor of shape `f` is one per head of a [B,H,T,T'] tensor `x` (H > 1): [H,1,1] or
/// [1,H,1,1].
fn per_head(f: &[i64], x: &[i64]) -> bool {
    let &[_, h, _, _] = x else {
        return false;
    };
    h > 1
        && (3..=4).contains(&f.len())
        && f.iter()
            .rev()
            .enumerate()
            .all(|(i, &d)| d == if i == 2 { h } else { 1 })
}

/// Whether scaling a masked cell (at most half the dtype's lowest value) by `scale` after the
/// mask is added leaves it masked: a positive constant multiplier of at least 1/64 (a divisor
/// up to 64, √D for heads up to 4096) keeps it below -500 even for fp16, where exp underflows.
fn keeps_masked(scale: Scale) -> bool {
    let m = match scale {
        Scale::Mul(Factor::Const(s)) => s,
        Scale::Div(Factor::Const(d)) => 1.0 / d,
        _ => return false,
    };
    m >= 1.0 / 64.0
}

/// `v` as `add(scores, m)` (either order, alpha 1, the sum read once; or `scores.add_(m)`) where
/// the scores are as `scored` reads them and m is anything else: (the add, m, scores).
fn added_mask(cx: &Ctx, v: ValueId) -> Option<(NodeId, ValueId, ValueId)> {
    sum_of(cx, v, &|x| scored(cx, x))
}

/// `v` as `add(s, m)` or `s.add_(m)` (alpha 1, the sum read once) where `is_scores(s)` and not
/// `is_scores(m)`: (the add, m, s). An in-place add writes its first operand: that is s, read by
/// the add alone (MPNet's `scores += position_bias`).
fn sum_of(
    cx: &Ctx,
    v: ValueId,
    is_scores: &dyn Fn(ValueId) -> bool,
) -> Option<(NodeId, ValueId, ValueId)> {
    let g = cx.g;
    let (ad, in_place) = match cx.producer(v, "aten::add") {
        Some(n) => (n, false),
        None => (cx.producer(v, "aten::add_")?, true),
    };
    let i = &g.nodes[ad].inputs;
    if cx.uses[v] != 1 || i.len() != 3 || cx.float(i[2]) != Some(1.0) {
        return None;
    }
    let orders = [(i[0], i[1]), (i[1], i[0])];
    orders[..if in_place { 1 } else { 2 }]
        .iter()
        .find(|&&(s, m)| is_scores(s) && !is_scores(m) && (!in_place || cx.uses[s] == 1))
        .map(|&(s, m)| (ad, m, s))
}

/// MPNet's scores with two terms added in turn, `(s + first) + second`, each sum as `sum_of`
/// reads it and s the scaled product.
struct TwoAdded {
    outer: NodeId,
    inner: NodeId,
    first: ValueId,
    second: ValueId,
    scores: ValueId,
}

fn two_added(cx: &Ctx, v: ValueId) -> Option<TwoAdded> {
    let (outer, second, sum) = sum_of(cx, v, &|x| added_mask(cx, x).is_some())?;
    let (inner, first, scores) = added_mask(cx, sum)?;
    Some(TwoAdded {
        outer,
        inner,
        first,
        second,
        scores,
    })
}

impl TwoAdded {
    /// (the mask, the bias, where the bias stands against the mask): the mask is the term of a
    /// class the kernels compute, as the bridge read it (the later one where both are), the bias
    /// the other; None where neither is.
    fn roles(&self, g: &Graph) -> Option<(ValueId, ValueId, Order)> {
        let classed = |v: ValueId| {
            g.values[v]
                .mask
                .is_some_and(|f| !matches!(f.class, MaskClass::General | MaskClass::Unknown))
        };
        match (classed(self.first), classed(self.second)) {
            (_, true) => Some((self.second, self.first, Order::Before)),
            (true, false) => Some((self.first, self.second, Order::After)),
            (false, false) => None,
        }
    }
}

/// Whether `x` is the scores: the product (a matmul's output) or it scaled (a mul or div of it),
/// or a where over either (GPT-Neo's). A bias may be a product too (Swin V2's `16 *
/// sigmoid(..)`), but not of a matmul.
fn scored(cx: &Ctx, x: ValueId) -> bool {
    let product = |x: ValueId| {
        let matmul = |v: ValueId| cx.producer(v, "aten::matmul").is_some();
        matmul(x)
            || ["aten::mul", "aten::div"]
                .iter()
                .filter_map(|k| cx.producer(x, k))
                .any(|n| matmul(cx.g.nodes[n].inputs[0]))
    };
    // A mask may be a where too: the where's scores operand tells them apart.
    product(x)
        || cx
            .producer(x, "aten::where")
            .is_some_and(|w| product(cx.g.nodes[w].inputs[1]))
}

/// Whether `fill`, read through casts and detach, is a constant that masks a cell of scores of
/// `dtype` when it stands there: -inf or at most half the dtype's lowest value (finfo.min, as
/// GPT-Neo writes it), the bound the op's classification uses.
fn masks_cells(cx: &Ctx, fill: ValueId, dtype: DType) -> bool {
    fill_value(cx, fill).is_some_and(|x| x <= dtype.lowest() / 2.0)
}

/// The constant `fill` holds, read through casts and detach.
fn fill_value(cx: &Ctx, fill: ValueId) -> Option<f64> {
    let mut v = fill;
    while let Some(n) = cx
        .producer(v, "aten::detach")
        .or_else(|| cx.producer(v, "aten::to"))
    {
        v = cx.g.nodes[n].inputs[0];
    }
    cx.float(v)
}

/// The class of two masks applied together (a key is visible where both show it), and whether
/// both are functions of the input sizes alone.
fn both(a: Option<MaskFact>, b: Option<MaskFact>) -> Option<MaskFact> {
    let (a, b) = (a?, b?);
    let class = match (a.class, b.class) {
        (MaskClass::Unknown, _) | (_, MaskClass::Unknown) => MaskClass::Unknown,
        (MaskClass::General, _) | (_, MaskClass::General) => MaskClass::General,
        (MaskClass::None, x) | (x, MaskClass::None) => x,
        (MaskClass::Causal, MaskClass::Causal) => MaskClass::Causal,
        // A prefix of keys within a prefix of keys.
        (MaskClass::Padded, MaskClass::Padded) => MaskClass::Padded,
        _ => MaskClass::CausalPadded,
    };
    Some(MaskFact {
        class,
        shape_only: a.shape_only && b.shape_only,
    })
}

/// The node casting `v` to fp32 (`aten::to(x, float32, ..)`), if `v` is its output, read by the
/// product and otherwise only by `aten::size` (GPT-Neo reads q's and k's lengths); with whether
/// the pattern takes the cast (nothing else reads it) or leaves it to those sizes.
fn to_f32(cx: &Ctx, v: ValueId) -> Option<(NodeId, bool)> {
    let n = cx.producer(v, "aten::to")?;
    let i = &cx.g.nodes[n].inputs;
    // ScalarType 6 is float32.
    if i.len() < 2 || cx.int(i[1]) != Some(6) {
        return None;
    }
    let sizes = cx.readers[v]
        .iter()
        .filter(|&&r| cx.g.nodes[r].kind == "aten::size")
        .count();
    (cx.uses[v] == sizes + 1).then_some((n, sizes == 0))
}

fn sdpa(cx: &Ctx, n: NodeId) -> Result<AttentionMatch, String> {
    let g = cx.g;
    let i = &g.nodes[n].inputs;
    // (q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if i.len() < 6 {
        return Err("not the schema of scaled_dot_product_attention fact knows".into());
    }
    if cx.float(i[4]) != Some(0.0) {
        return Err("dropout_p is not a constant 0 (training)".into());
    }
    let Some(Const::Bool(is_causal)) = g.constant(i[5]) else {
        return Err("is_causal is not a constant".into());
    };
    let scale = match i.get(6) {
        None => None,
        Some(&s) if cx.is_none(s) => None,
        Some(&s) => Some(cx.float(s).ok_or("scale is not a constant")?),
    };
    let gqa = match i.get(7).map(|&e| g.constant(e)) {
        None | Some(Some(Const::Bool(false))) => false,
        Some(Some(Const::Bool(true))) => true,
        Some(_) => return Err("enable_gqa is not a constant".into()),
    };
    let (q, k, v) = (i[0], i[1], i[2]);
    let shape = |v: ValueId| g.tensor(v).map(|t| t.shape.clone()).unwrap_or_default();
    let mut form = ProblemForm {
        origin: AttentionOrigin::Sdpa,
        causal: *is_causal,
        padded: false,
        masked: false,
        bias: None,
        mask_strided: false,
        grouped: gqa,
    };
    let mut where_fold = None;
    let mask = if cx.is_none(i[3]) {
        None
    } else {
        let m = i[3];
        if *is_causal {
            return Err("is_causal with an attn_mask (torch refuses the call)".into());
        }
        let (qt, mt) = (g.tensor(q), g.tensor(m));
        let mode = match (qt, mt) {
            (Some(_), Some(mt)) if mt.dtype == "bool" => MaskMode::Bool,
            (Some(qt), Some(mt)) if mt.dtype == qt.dtype => MaskMode::Add,
            _ => {
                return Err(format!(
                    "the attn_mask is neither bool nor of q's dtype ({})",
                    mt.map_or("shape unknown".into(), |t| t.dtype.clone())
                ))
            }
        };
        let (qs, ks, ms) = (shape(q), shape(k), shape(m));
        if !broadcasts_to_scores(&ms, &qs, &ks) {
            return Err(format!(
                "the attn_mask {ms:?} does not broadcast to the scores of q {qs:?} and k {ks:?} over batch and heads alone"
            ));
        }
        // torch's fused kernels take a mask whose last stride is 1 only.
        form.mask_strided = mt.is_some_and(|t| {
            t.strides.last().is_some_and(|&s| s != 1) && t.shape.last().is_some_and(|&n| n > 1)
        });
        if let Some(w) = (mode == MaskMode::Add)
            .then(|| where_bias(cx, m, q, k))
            .flatten()
        {
            // The bool mask's class is the kernel's; the bias it selects is added.
            form.masked_by(g.values[w.cond].mask, None)?;
            form.bias = Some(w.bias);
            where_fold = Some(w);
            Some((g.nodes[w.node].inputs[1], mode))
        } else {
            let bias = (mode == MaskMode::Add).then(|| bias_of(g, m, q)).flatten();
            form.masked_by(g.values[m].mask, bias)?;
            Some((m, mode))
        }
    };
    let mut nodes = vec![n];
    let (k0, v0, repeat) = if gqa {
        (k, v, None)
    } else {
        kv_in_place(cx, (k, v), &mut form, &mut nodes)
    };
    // The class is of the where's bool mask where the where is folded in.
    let classified = where_fold.map_or(mask.map(|(m, _)| m), |w| Some(w.cond));
    let mask_static = classified.is_some_and(|m| g.values[m].mask.is_some_and(|f| f.shape_only));
    if let Some(w) = where_fold {
        nodes.push(w.node);
    }
    let problem = problem(g, [q, k0, v0], form).ok_or_else(|| {
        format!(
            "q {:?}, k {:?}, v {:?} are not [B,H,T,D] (or [B,T,D]) of one float dtype with equal B and D, and k/v heads dividing q's",
            shape(q),
            shape(k0),
            shape(v0)
        )
    })?;
    nodes.sort();
    nodes.dedup();
    let out_order = out_order(g, &nodes);
    Ok(AttentionMatch {
        nodes,
        q,
        k: k0,
        v: v0,
        mask,
        mask_static,
        cond: None,
        where_mask: where_fold.map(|w| (w.cond, w.fill)),
        window: None,
        scale: Scale::Sdpa(scale),
        scale_last: false,
        scale_q: false,
        gqa,
        repeat,
        upcast: false,
        softmax_f32: false,
        plus: None,
        fill: None,
        out_order,
        problem,
    })
}

/// The memory order (dims outermost first) of the output of the last of `nodes` where the graph
/// recorded one for a 4-d output that is neither the kernels' (0, 2, 1, 3) nor packed (0, 1, 2, 3),
/// with D innermost (the kernels write D at unit stride); None otherwise. A packed output keeps
/// the kernels' order, as it always has: what a graph does after it (transpose(1, 2), then a copy
/// or a reshape) reads either alike, and the kernels' needs no copy there. A dim of one lies
/// anywhere: it keeps its place in the kernels' order, and the others take the slots left in the
/// order of their strides.
fn out_order(g: &Graph, nodes: &[NodeId]) -> Option<[usize; 4]> {
    const KERNELS: [usize; 4] = [0, 2, 1, 3];
    let out = *g.nodes[*nodes.last()?].outputs.first()?;
    let t = g.tensor(out)?;
    if t.shape.len() != 4 || t.strides.len() != 4 {
        return None;
    }
    let mut moving: Vec<usize> = KERNELS
        .iter()
        .copied()
        .filter(|&d| t.shape[d] != 1)
        .collect();
    // Larger strides outermost; equal ones keep the kernels' order (a stable sort).
    moving.sort_by_key(|&d| std::cmp::Reverse(t.strides[d]));
    let mut order = KERNELS;
    let mut next = moving.into_iter();
    for slot in order.iter_mut() {
        if t.shape[*slot] != 1 {
            *slot = next.next()?;
        }
    }
    let unit_d = t.shape[3] == 1 || t.strides[3] == 1;
    (order != KERNELS && order != [0, 1, 2, 3] && order[3] == 3 && unit_d).then_some(order)
}

/// SDPA's float mask as Hugging Face's SDPA integration makes it for a position bias (T5's
/// family): `where(mask, bias, fill)`, read by the call alone, with a bool mask of a class the
/// kernels compute, a bias of q's dtype and a fill that masks (at or below half the dtype's
/// lowest value).
#[derive(Clone, Copy, Debug)]
struct WhereBias {
    node: NodeId,
    cond: ValueId,
    fill: f64,
    bias: AttentionBias,
}

fn where_bias(cx: &Ctx, m: ValueId, q: ValueId, k: ValueId) -> Option<WhereBias> {
    let g = cx.g;
    let w = cx.producer(m, "aten::where")?;
    let i = &g.nodes[w].inputs;
    if cx.uses[m] != 1 || i.len() != 3 {
        return None;
    }
    let (cond, b, fill) = (i[0], i[1], i[2]);
    let shape = |v: ValueId| g.tensor(v).map(|t| t.shape.clone()).unwrap_or_default();
    let dtype = DType::parse(&g.tensor(q)?.dtype)?;
    let classified = g.values[cond]
        .mask
        .is_some_and(|f| !matches!(f.class, MaskClass::General | MaskClass::Unknown));
    let fits = g.tensor(cond).is_some_and(|t| t.dtype == "bool")
        && classified
        && broadcasts_to_scores(&shape(cond), &shape(q), &shape(k))
        && broadcasts_to_scores(&shape(b), &shape(q), &shape(k))
        && masks_cells(cx, fill, dtype);
    fits.then_some(())?;
    Some(WhereBias {
        node: w,
        cond,
        fill: fill_value(cx, fill)?,
        bias: bias_of(g, b, q)?,
    })
}

/// The tensor a bias `b` copies where the graph makes it `contiguous(expand(x, ..))` (MPNet's
/// position bias, one per sequence in memory): the expand, whose broadcast dims step by 0, so
/// that the kernel reads one bias for every sequence (the same values). Only where no reader of
/// `b` writes it in place; else `b`.
fn unexpanded(cx: &Ctx, b: ValueId) -> ValueId {
    let g = cx.g;
    let Some(c) = cx.producer(b, "aten::contiguous") else {
        return b;
    };
    let x = g.nodes[c].inputs[0];
    let written = cx.readers[b]
        .iter()
        .any(|&r| g.nodes[r].kind.ends_with('_') && g.nodes[r].inputs.first() == Some(&b));
    if written || cx.producer(x, "aten::expand").is_none() {
        return b;
    }
    x
}

/// The mask `m` as a bias tensor the kernel adds to the scores of q: of q's float dtype, batched
/// when it has the scores' rank and a batch dim past 1 (one bias per sequence), else shared; a
/// row of keys per head where its query dim is 1 and q has several queries (ALiBi's [H,1,Tk]).
fn bias_of(g: &Graph, m: ValueId, q: ValueId) -> Option<AttentionBias> {
    let (mt, qt) = (g.tensor(m)?, g.tensor(q)?);
    if mt.dtype != qt.dtype || DType::parse(&mt.dtype).is_none() || qt.shape.len() < 2 {
        return None;
    }
    // A batch dim stepped by 0 (an expand) holds one bias for every sequence.
    let batched = mt.shape.len() == qt.shape.len()
        && mt.shape.first().is_some_and(|&b| b > 1)
        && mt.strides.first() != Some(&0);
    let rows = if mt.shape.len() >= 2 {
        mt.shape[mt.shape.len() - 2]
    } else {
        1
    };
    let keys = rows == 1 && qt.shape[qt.shape.len() - 2] > 1;
    Some(match (batched, keys) {
        (false, false) => AttentionBias::Shared,
        (true, false) => AttentionBias::Batched,
        (false, true) => AttentionBias::Keys,
        (true, true) => AttentionBias::KeysBatched,
    })
}

/// Whether a mask of shape `m` broadcasts (from the right) to the scores [B,H,Tq,Tk] of q and k
/// without widening them: each dim 1 or the scores' own.
fn broadcasts_to_scores(m: &[i64], q: &[i64], k: &[i64]) -> bool {
    let scores: Vec<i64> = match (q, k) {
        ([b, h, tq, _], [_, _, tk, _]) => vec![*b, *h, *tq, *tk],
        ([b, tq, _], [_, tk, _]) => vec![*b, *tq, *tk],
        _ => return false,
    };
    m.len() <= scores.len()
        && m.iter()
            .rev()
            .zip(scores.iter().rev())
            .all(|(&d, &s)| d == 1 || d == s)
}

/// k and v as the kernel reads them: where the graph repeated the heads of both alike
/// (`unrepeat`), their sources and the groups, the form grouped and the repeats' nodes the
/// match's; else as they are.
fn kv_in_place(
    cx: &Ctx,
    (k, v): (ValueId, ValueId),
    form: &mut ProblemForm,
    nodes: &mut Vec<NodeId>,
) -> (ValueId, ValueId, Option<i64>) {
    match (unrepeat(cx, k), unrepeat(cx, v)) {
        (Some(rk), Some(rv)) if rk.groups == rv.groups => {
            form.grouped = true;
            nodes.extend(rk.nodes.iter().chain(&rv.nodes));
            (rk.source, rv.source, Some(rk.groups))
        }
        _ => (k, v, None),
    }
}

/// k or v as the graph repeated its heads G times before the attention.
struct Repeat {
    /// The [B,Hkv,T,D] tensor before the repeat.
    source: ValueId,
    groups: i64,
    /// The repeat's nodes nothing outside the repeat reads (from its end back).
    nodes: Vec<NodeId>,
}

/// `x` read back through an interleaved repeat of its heads: Hugging Face's repeat_kv
/// (`s[:, :, None]`, as identity slices around an unsqueeze at dim 2, then expand to
/// [B,Hkv,G,T,D] with G a constant, then reshape to [B,Hkv·G,T,D]), or `repeat_interleave(s, G,
/// dim=1)`. Both put head h of the result at s's head h / G. `x.repeat(1, G, 1, 1)` (head h at
/// h % Hkv) is not one.
fn unrepeat(cx: &Ctx, x: ValueId) -> Option<Repeat> {
    let g = cx.g;
    let shape = |v: ValueId| g.tensor(v).map(|t| t.shape.clone());
    let out = shape(x)?;
    let &[b, h, t, d] = out.as_slice() else {
        return None;
    };
    let mut chain = Vec::new();
    let (source, groups) = if let Some(ri) = cx.producer(x, "aten::repeat_interleave") {
        let i = &g.nodes[ri].inputs;
        let (s, reps, dim) = (i[0], cx.int(*i.get(1)?)?, cx.int(*i.get(2)?)?);
        if g.tensor(i[1]).is_some() || !(dim == 1 || dim == -3) {
            return None;
        }
        chain.push(ri);
        (s, reps)
    } else {
        let r = ["aten::reshape", "aten::view", "aten::_unsafe_view"]
            .iter()
            .find_map(|k| cx.producer(x, k))?;
        chain.push(r);
        let e = cx.producer(g.nodes[r].inputs[0], "aten::expand")?;
        chain.push(e);
        let expanded = shape(g.nodes[e].outputs[0])?;
        let &[eb, kv, groups, et, ed] = expanded.as_slice() else {
            return None;
        };
        let sizes = g.nodes[e].inputs[1];
        let constant_groups = g.values[sizes].producer.is_some_and(|l| {
            let l = &g.nodes[l];
            l.kind == "prim::ListConstruct"
                && l.inputs.get(2).and_then(|&v| cx.int(v)) == Some(groups)
        });
        if (eb, et, ed) != (b, t, d) || !constant_groups {
            return None;
        }
        // Back to [B,Hkv,T,D]: identity slices, one unsqueeze at dim 2.
        let mut y = g.nodes[e].inputs[0];
        let mut unsqueezed = false;
        loop {
            let p = g.values[y].producer;
            match p.map(|p| (p, g.nodes[p].kind.as_str())) {
                Some((p, "aten::slice")) if identity_slice(cx, p) => chain.push(p),
                Some((p, "aten::unsqueeze")) if !unsqueezed => {
                    let dim = cx.int(g.nodes[p].inputs[1])?;
                    if !(dim == 2 || dim == -3) || shape(y)? != [b, kv, 1, t, d] {
                        return None;
                    }
                    unsqueezed = true;
                    chain.push(p);
                }
                _ if unsqueezed => break,
                _ => return None,
            }
            y = g.nodes[p?].inputs[0];
        }
        (y, groups)
    };
    if groups < 2 || h % groups != 0 || shape(source)? != [b, h / groups, t, d] {
        return None;
    }
    // From the SDPA back: a node is the match's while its output has no other reader.
    let nodes = chain
        .iter()
        .take_while(|&&n| cx.uses[g.nodes[n].outputs[0]] == 1)
        .copied()
        .collect();
    Some(Repeat {
        source,
        groups,
        nodes,
    })
}

/// `slice(x, dim, 0, end, 1)` with an end past any size (None or i64::MAX, as `x[:, :]` traces):
/// x itself at every shape.
fn identity_slice(cx: &Ctx, n: NodeId) -> bool {
    let i = &cx.g.nodes[n].inputs;
    let start_zero = i
        .get(2)
        .is_some_and(|&s| cx.is_none(s) || cx.int(s) == Some(0));
    let end_open = i
        .get(3)
        .is_some_and(|&e| cx.is_none(e) || cx.int(e) == Some(i64::MAX));
    let step_one = i.get(4).is_some_and(|&s| cx.int(s) == Some(1));
    i.len() == 5 && start_zero && end_open && step_one
}

/// What decides a problem besides its tensors.
#[derive(Clone, Copy, Debug)]
struct ProblemForm {
    origin: AttentionOrigin,
    /// The explicit form's "has a mask" (the op verifies it is the causal one), SDPA's is_causal
    /// or a causal attn_mask.
    causal: bool,
    padded: bool,
    /// SDPA is given a mask tensor (AttentionProblem::masked).
    masked: bool,
    /// k and v may have fewer heads than q (dividing them).
    grouped: bool,
    /// The mask is a bias tensor the kernel adds (AttentionProblem::bias).
    bias: Option<AttentionBias>,
    /// SDPA's mask is not dense along the keys (AttentionProblem::mask_strided).
    mask_strided: bool,
}

impl ProblemForm {
    /// A mask tensor given, by what the graph knows of its value (`fact`): its class sets the
    /// kernel's `causal` and `padded`; a class read from one example's input data is padded too
    /// (other inputs pad otherwise). A general or unknown mask that is added to the scores in
    /// their dtype (`bias`, from `bias_of`) is a bias tensor the kernel adds. Err for a mask no
    /// kernel takes (SDPA's refusal says why).
    fn masked_by(
        &mut self,
        fact: Option<MaskFact>,
        bias: Option<AttentionBias>,
    ) -> Result<(), String> {
        let class = fact.map_or(MaskClass::Unknown, |f| f.class);
        if let (MaskClass::General | MaskClass::Unknown, Some(b)) = (class, bias) {
            (self.causal, self.padded, self.bias) = (false, false, Some(b));
            return Ok(());
        }
        (self.causal, self.padded) = match class {
            MaskClass::None => (false, false),
            MaskClass::Causal => (true, false),
            MaskClass::Padded => (false, true),
            MaskClass::CausalPadded => (true, true),
            MaskClass::General => {
                return Err("the attn_mask is general (not all-visible, causal or a key-padding prefix, or a query sees no key) and not added to the scores in q's dtype: no kernel takes it".into())
            }
            MaskClass::Unknown => {
                return Err("the attn_mask's value is unknown (its producers could not be evaluated on the CPU, or read input data the archive stores no example of): trace with example inputs".into())
            }
        };
        self.padded |= fact.is_some_and(|f| !f.shape_only);
        self.masked = true;
        Ok(())
    }
}

/// The problem of q [B,H,Tq,D] (or [B,Tq,D]), k [B,Hkv,Tk,D], v [B,Hkv,Tk,D] of one float dtype
/// (Hkv = H unless `form.grouped`).
fn problem(g: &Graph, [q, k, v]: [ValueId; 3], form: ProblemForm) -> Option<AttentionProblem> {
    let (tq, tk, tv) = (g.tensor(q)?, g.tensor(k)?, g.tensor(v)?);
    let dtype = DType::parse(&tq.dtype)?;
    if tk.dtype != tq.dtype || tv.dtype != tq.dtype {
        return None;
    }
    let (lead, qs) = match tq.shape.as_slice() {
        [b, h, t, d] => ((*b, *h), (*t, *d)),
        [b, t, d] => ((*b, 1), (*t, *d)),
        _ => return None,
    };
    let lead_of = |s: &[i64]| -> Option<((i64, i64), (i64, i64))> {
        match s {
            [b, h, t, d] if s.len() == tq.shape.len() => Some(((*b, *h), (*t, *d))),
            [b, t, d] if s.len() == tq.shape.len() => Some(((*b, 1), (*t, *d))),
            _ => None,
        }
    };
    let (kl, ks) = lead_of(&tk.shape)?;
    let (vl, vs) = lead_of(&tv.shape)?;
    // One batch, k and v of one head count (q's, or a divisor of it when grouped), one head dim,
    // as many values as keys. One k/v head read by every query head is grouped too: SDPA and
    // matmul broadcast a head dim of 1 (multi-query attention as Falcon writes it, no
    // enable_gqa and no repeat).
    let kv = kl.1;
    let heads_ok = kv == lead.1 || ((form.grouped || kv == 1) && kv > 0 && lead.1 % kv == 0);
    if kl.0 != lead.0 || vl != kl || !heads_ok || ks.1 != qs.1 || vs.1 != qs.1 || vs.0 != ks.0 {
        return None;
    }
    let p = AttentionProblem {
        origin: form.origin,
        batch: lead.0,
        heads: lead.1,
        seq_q: qs.0,
        seq_k: ks.0,
        head_dim: qs.1,
        dtype,
        causal: form.causal,
        kv_heads: (kv != lead.1).then_some(kv),
        padded: form.padded,
        masked: form.masked && !form.padded && form.bias.is_none(),
        bias: form.bias,
        mask_strided: form.mask_strided,
    };
    (p.batch > 0 && p.heads > 0 && p.seq_q > 0 && p.seq_k > 0 && p.head_dim > 0).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MiniGPT block's attention as tracing records it, with `scale` and `mask` lines swapped in.
    fn block(scale: &str, mask: &str, tail: &str) -> String {
        format!(
            "graph(%q: f32[2,4,16,8], %k: f32[2,4,16,8], %v: f32[2,4,16,8], %buf: bool[32,32]):
               %m1 = prim::Constant[-1]()
               %m2 = prim::Constant[-2]()
               %zero = prim::Constant[0]()
               %one = prim::Constant[1]()
               %t = prim::Constant[16]()
               %ninf = prim::Constant[-inf]()
               %none = prim::Constant[None]()
               %c = prim::Constant[2.8284271247461903]()
               %kt = aten::transpose(%k, %m2, %m1) : f32[2,4,8,16]
               %s0 = aten::matmul(%q, %kt) : f32[2,4,16,16]
               {scale}
               %r0 = aten::slice(%buf, %zero, %zero, %t, %one) : bool[16,32]
               %r1 = aten::slice(%r0, %one, %zero, %t, %one) : bool[16,16]
               {mask}
               %p = aten::softmax(%s2, %m1, %none) : f32[2,4,16,16]
               {tail}
               return (%y)"
        )
    }

    #[test]
    fn explicit_causal_attention_with_div_and_inverted_mask() {
        let g = Graph::parse(&block(
            "%s1 = aten::div(%s0, %c) : f32[2,4,16,16]",
            "%nm = aten::bitwise_not(%r1) : bool[16,16]
             %s2 = aten::masked_fill(%s1, %nm, %ninf) : f32[2,4,16,16]",
            "%y = aten::matmul(%p, %v) : f32[2,4,16,8]",
        ))
        .unwrap();
        let m = match_attention(&g);
        assert_eq!(m.len(), 1);
        let a = &m[0];
        assert_eq!(
            a.problem,
            AttentionProblem {
                origin: AttentionOrigin::Explicit,
                batch: 2,
                heads: 4,
                seq_q: 16,
                seq_k: 16,
                head_dim: 8,
                dtype: DType::F32,
                causal: true,
                kv_heads: None,
                padded: false,
                masked: false,
                bias: None,
                mask_strided: false,
            }
        );
        assert_eq!(a.problem.rule_id(), "attention_causal");
        assert_eq!(a.form(), "explicit;div=2.8284271247461903;mask=not");
        assert!((a.kernel_scale().unwrap() - 1.0 / 8f64.sqrt()).abs() < 1e-12);
        // transpose, matmul, div, bitwise_not, masked_fill, softmax, matmul; the slices stay.
        let kinds: Vec<&str> = a.nodes.iter().map(|&n| g.nodes[n].kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "aten::transpose",
                "aten::matmul",
                "aten::div",
                "aten::bitwise_not",
                "aten::masked_fill",
                "aten::softmax",
                "aten::matmul"
            ]
        );
        assert_eq!(g.values[a.mask.unwrap().0].name, "r1");
        assert_eq!(a.mask.unwrap().1, MaskMode::Not);
    }

    #[test]
    fn scale_forms_mask_forms_and_eval_dropout() {
        // mul by a constant, `== 0` mask, dropout in eval.
        let g = Graph::parse(&block(
            "%s1 = aten::mul(%s0, %c) : f32[2,4,16,16]",
            "%eq = aten::eq(%r1, %zero) : bool[16,16]
             %s2 = aten::masked_fill(%s1, %eq, %ninf) : f32[2,4,16,16]",
            "%f = prim::Constant[False]()
             %pd = prim::Constant[0.1]()
             %d = aten::dropout(%p, %pd, %f) : f32[2,4,16,16]
             %y = aten::matmul(%d, %v) : f32[2,4,16,8]",
        ))
        .unwrap();
        let a = &match_attention(&g)[0];
        assert_eq!(a.form(), "explicit;mul=2.8284271247461903;mask=eq0");
        assert_eq!(a.nodes.len(), 8);
        // No scale and no mask: not causal.
        let g = Graph::parse(&block(
            "%s1 = aten::relu(%s0) : f32[2,4,16,16]",
            "%s2 = aten::neg(%s0) : f32[2,4,16,16]",
            "%y = aten::matmul(%p, %v) : f32[2,4,16,8]",
        ))
        .unwrap();
        assert!(
            match_attention(&g).is_empty(),
            "a neg between the product and softmax is not attention"
        );
        let plain = block("", "", "%y = aten::matmul(%p, %v) : f32[2,4,16,8]")
            .replace("softmax(%s2", "softmax(%s0");
        let a = &match_attention(&Graph::parse(&plain).unwrap())[0];
        assert_eq!(
            (a.form().as_str(), a.problem.causal, a.kernel_scale()),
            ("explicit", false, Some(1.0))
        );
        // A divisor the graph computes (tracing's `(c // h) ** 0.5`) is the op's scale operand.
        let g = Graph::parse(&block(
            "%d = aten::pow(%c, %c) : f32[]
             %s1 = aten::div(%s0, %d) : f32[2,4,16,16]",
            "%s2 = aten::masked_fill(%s1, %r1, %ninf) : f32[2,4,16,16]",
            "%y = aten::matmul(%p, %v) : f32[2,4,16,8]",
        ))
        .unwrap();
        let a = &match_attention(&g)[0];
        assert_eq!(
            (a.form().as_str(), a.kernel_scale()),
            ("explicit;div=tensor;mask=fill", None)
        );
        assert_eq!(g.values[a.scale_operand().unwrap()].name, "d");
    }

    #[test]
    fn q_k_and_v_used_elsewhere_still_match() {
        // They are the pattern's inputs, not its intermediates: other readers keep them.
        let g = block(
            "%s1 = aten::div(%s0, %c) : f32[2,4,16,16]",
            "%nm = aten::bitwise_not(%r1) : bool[16,16]
             %s2 = aten::masked_fill(%s1, %nm, %ninf) : f32[2,4,16,16]",
            "%y0 = aten::matmul(%p, %v) : f32[2,4,16,8]
             %y = aten::add(%y0, %q, %one) : f32[2,4,16,8]",
        )
        .replace("return (%y)", "return (%y, %k, %v)");
        let m = match_attention(&Graph::parse(&g).unwrap());
        assert_eq!(m.len(), 1);
        // A kᵀ read elsewhere stays in the graph: the pattern keeps only what it alone reads.
        let shared = g.replace("return (%y, %k, %v)", "return (%y, %kt)");
        let g = Graph::parse(&shared).unwrap();
        let m = match_attention(&g);
        assert!(!m[0]
            .nodes
            .iter()
            .any(|&n| g.nodes[n].kind == "aten::transpose"));
    }

    #[test]
    fn training_dropout_an_escaping_score_and_a_bad_softmax_dim_do_not_match() {
        let train = block(
            "%s1 = aten::div(%s0, %c) : f32[2,4,16,16]",
            "%s2 = aten::masked_fill(%s1, %r1, %ninf) : f32[2,4,16,16]",
            "%tr = prim::Constant[True]()
             %pd = prim::Constant[0.1]()
             %d = aten::dropout(%p, %pd, %tr) : f32[2,4,16,16]
             %y = aten::matmul(%d, %v) : f32[2,4,16,8]",
        );
        assert!(match_attention(&Graph::parse(&train).unwrap()).is_empty());
        // The scores are also returned: the pattern cannot swallow them.
        let escaping = block(
            "%s1 = aten::div(%s0, %c) : f32[2,4,16,16]",
            "%s2 = aten::masked_fill(%s1, %r1, %ninf) : f32[2,4,16,16]",
            "%y = aten::matmul(%p, %v) : f32[2,4,16,8]",
        )
        .replace("return (%y)", "return (%y, %s1)");
        assert!(match_attention(&Graph::parse(&escaping).unwrap()).is_empty());
        let dim0 = block(
            "%s1 = aten::div(%s0, %c) : f32[2,4,16,16]",
            "%s2 = aten::masked_fill(%s1, %r1, %ninf) : f32[2,4,16,16]",
            "%y = aten::matmul(%p, %v) : f32[2,4,16,8]",
        )
        .replace("softmax(%s2, %m1", "softmax(%s2, %zero");
        assert!(match_attention(&Graph::parse(&dim0).unwrap()).is_empty());
        // A plain masked_fill is the fill mode.
        let fill = block(
            "%s1 = aten::div(%s0, %c) : f32[2,4,16,16]",
            "%s2 = aten::masked_fill(%s1, %r1, %ninf) : f32[2,4,16,16]",
            "%y = aten::matmul(%p, %v) : f32[2,4,16,8]",
        );
        assert_eq!(
            match_attention(&Graph::parse(&fill).unwrap())[0].form(),
            "explicit;div=2.8284271247461903;mask=fill"
        );
    }

    #[test]
    fn sdpa_with_and_without_is_causal_and_scale() {
        let g = |causal: &str, scale: &str, mask: &str, p: &str| {
            Graph::parse(&format!(
                "graph(%q: bf16[2,12,64,64], %k: bf16[2,12,80,64], %v: bf16[2,12,80,64]):
                   %none = prim::Constant[None]()
                   %p = prim::Constant[{p}]()
                   %c = prim::Constant[{causal}]()
                   %s = prim::Constant[{scale}]()
                   %f = prim::Constant[False]()
                   %y = aten::scaled_dot_product_attention(%q, %k, %v, {mask}, %p, %c, %s, %f) : bf16[2,12,64,64]
                   return (%y)"
            ))
            .unwrap()
        };
        let a = &match_attention(&g("True", "None", "%none", "0."))[0];
        assert_eq!(
            a.problem,
            AttentionProblem {
                origin: AttentionOrigin::Sdpa,
                batch: 2,
                heads: 12,
                seq_q: 64,
                seq_k: 80,
                head_dim: 64,
                dtype: DType::Bf16,
                causal: true,
                kv_heads: None,
                padded: false,
                masked: false,
                bias: None,
                mask_strided: false,
            }
        );
        assert_eq!(
            (a.form().as_str(), a.kernel_scale()),
            ("sdpa;causal", Some(0.125))
        );
        let a = &match_attention(&g("False", "0.5", "%none", "0."))[0];
        assert_eq!(
            (a.form().as_str(), a.kernel_scale(), a.problem.causal),
            ("sdpa;scale=0.5", Some(0.5), false)
        );
        assert!(
            match_attention(&g("False", "None", "%q", "0.")).is_empty(),
            "an attn_mask that widens the scores is not matched"
        );
        assert!(
            match_attention(&g("False", "None", "%none", "0.1")).is_empty(),
            "dropout is not matched"
        );
    }

    /// GPT-2's attention as the bridge reads a trace of GPT2LMHeadModel (transformers 5.17, n_embd
    /// 128, 4 heads, B 2, T 16): q, k, v are views of one Conv1D output, the causal bool mask the
    /// graph computes once (`arange`/`le`/`__and__`/`expand`), SDPA with scale 1/√32.
    fn gpt2_block(mask_fact: &str) -> String {
        format!(
            "graph(%self: W, %x: f32[2,16,384], %am: bool[2,1,16,16]):
               %0 = prim::Constant[0]()
               %1 = prim::Constant[1]()
               %2 = prim::Constant[2]()
               %6 = prim::Constant[False]()
               %9 = prim::Constant[-1]()
               %20 = prim::Constant[32]()
               %21 = prim::Constant[0.]()
               %22 = prim::Constant[0.17677669529663689]()
               %26 = prim::Constant[128]()
               %64 = aten::size(%x, %0) : int
               %54 = aten::size(%x, %1) : int
               %94 = prim::ListConstruct(%64, %9, %54, %54) : int[]
               %attention_mask0.1 = aten::expand(%am, %94, %6) : bool[2,1,16,16]{{0,256,16,1}}{mask_fact}
               %118 = aten::split(%x, %26, %2) : Tensor[]
               %query_states.1, %key_states.1, %value_states.1 = prim::ListUnpack(%118) : f32[2,16,128]{{6144,384,1}}, f32[2,16,128]{{6144,384,1}}, f32[2,16,128]{{6144,384,1}}
               %124 = prim::ListConstruct(%64, %54, %9, %20) : int[]
               %125 = aten::view(%key_states.1, %124) : f32[2,16,4,32]{{6144,384,32,1}}
               %key.1 = aten::transpose(%125, %1, %2) : f32[2,4,16,32]{{6144,32,384,1}}
               %128 = aten::view(%value_states.1, %124) : f32[2,16,4,32]{{6144,384,32,1}}
               %value.1 = aten::transpose(%128, %1, %2) : f32[2,4,16,32]{{6144,32,384,1}}
               %133 = aten::view(%query_states.1, %124) : f32[2,16,4,32]{{6144,384,32,1}}
               %query.1 = aten::transpose(%133, %1, %2) : f32[2,4,16,32]{{6144,32,384,1}}
               %attn_output.2 = aten::scaled_dot_product_attention(%query.1, %key.1, %value.1, %attention_mask0.1, %21, %6, %22, %6) : f32[2,4,16,32]
               %136 = aten::transpose(%attn_output.2, %1, %2) : f32[2,16,4,32]
               return (%136)"
        )
    }

    fn sdpa_of(g: &Graph) -> NodeId {
        (0..g.nodes.len())
            .find(|&n| g.nodes[n].kind == "aten::scaled_dot_product_attention")
            .unwrap()
    }

    #[test]
    fn gpt2s_computed_causal_mask_matches_the_causal_kernel() {
        let g = Graph::parse(&gpt2_block(" @causal/shape")).unwrap();
        let m = match_attention(&g);
        assert_eq!(m.len(), 1);
        let a = &m[0];
        assert_eq!(
            (a.problem.rule_id(), a.problem.kv_heads, a.problem.padded),
            // The graph passes the mask tensor: torch's time is that call's (`masked`).
            ("sdpa_causal_mask".to_string(), None, false)
        );
        // A function of the shapes: the op classifies it once per shape (`static`).
        assert_eq!(
            a.form(),
            "sdpa;mask=bool;class=causal;static;scale=0.1767766952966369"
        );
        // The SDPA alone: the mask's computation stays (every layer reads it), q, k, v are views.
        assert_eq!(a.nodes, vec![sdpa_of(&g)]);
        assert_eq!(
            (
                g.values[a.q].name.as_str(),
                g.values[a.mask.unwrap().0].name.as_str()
            ),
            ("query.1", "attention_mask0.1")
        );
        assert_eq!(a.mask.unwrap().1, MaskMode::Bool);
        // The same mask read from a user's attention_mask (data): causal and padded.
        let a = &match_attention(&Graph::parse(&gpt2_block(" @causal")).unwrap())[0];
        assert_eq!(a.problem.rule_id(), "sdpa_causal_padded");
        assert!(a.form().contains(";class=causal_padded"), "{}", a.form());
        // Its value changes with the data of one shape: classified per forward, never `static`.
        assert!(!a.form().contains("static"), "{}", a.form());
    }

    #[test]
    fn general_and_unknown_masks_do_not_match_and_say_why() {
        for (fact, why) in [
            (" @general/shape", "general"),
            ("", "unknown"),
            (" @unknown", "unknown"),
        ] {
            let g = Graph::parse(&gpt2_block(fact)).unwrap();
            assert!(match_attention(&g).is_empty(), "{fact}");
            let refused = sdpa_refusals(&g);
            assert_eq!(refused.len(), 1, "{fact}");
            assert_eq!(refused[0].0, sdpa_of(&g));
            assert!(refused[0].1.contains(why), "{fact}: {}", refused[0].1);
        }
        // A mask of another dtype than bool or q's, or one that widens the scores.
        let other = gpt2_block(" @causal/shape")
            .replace("bool[2,1,16,16]{0,256,16,1}", "bf16[2,1,16,16]{0,256,16,1}");
        assert!(sdpa_refusals(&Graph::parse(&other).unwrap())[0]
            .1
            .contains("neither bool"));
        let wide =
            gpt2_block(" @causal/shape").replace("bool[2,1,16,16]{0,256,16,1}", "bool[2,8,16,16]");
        assert!(sdpa_refusals(&Graph::parse(&wide).unwrap())[0]
            .1
            .contains("does not broadcast"));
        // An additive mask of q's dtype is matched like a bool one.
        let add = gpt2_block(" @causal/shape")
            .replace("bool[2,1,16,16]{0,256,16,1}", "f32[2,1,16,16]{0,256,16,1}");
        let a = &match_attention(&Graph::parse(&add).unwrap())[0];
        assert!(
            a.form().starts_with("sdpa;mask=add;class=causal"),
            "{}",
            a.form()
        );
    }

    #[test]
    fn an_additive_mask_no_class_describes_is_a_bias_the_kernel_adds() {
        // T5's SDPA: its position bias with the padding mask summed in, [B,H,Tq,Tk], general.
        let sdpa = |dims: &str, strides: &str, fact: &str| {
            gpt2_block(fact).replace(
                "bool[2,1,16,16]{0,256,16,1}",
                &format!("f32[{dims}]{{{strides}}}"),
            )
        };
        for (dims, strides, fact, bias) in [
            (
                "2,4,16,16",
                "1024,256,16,1",
                " @general",
                AttentionBias::Batched,
            ),
            (
                "1,4,16,16",
                "0,256,16,1",
                " @general/shape",
                AttentionBias::Shared,
            ),
            // A mask the bridge could not evaluate is added whatever it holds.
            (
                "2,1,16,16",
                "256,256,16,1",
                " @unknown",
                AttentionBias::Batched,
            ),
            ("2,1,16,16", "256,256,16,1", "", AttentionBias::Batched),
            // One mask expanded over the sequences (stride 0) is one bias for all of them.
            ("2,1,16,16", "0,256,16,1", "", AttentionBias::Shared),
        ] {
            let g = Graph::parse(&sdpa(dims, strides, fact)).unwrap();
            let a = &match_attention(&g)[0];
            assert_eq!(a.problem.bias, Some(bias), "{dims}{fact}");
            assert!(!a.problem.mask_strided);
            assert!(!a.problem.causal && !a.problem.padded && !a.problem.masked);
            assert_eq!(
                a.problem.rule_id(),
                if bias == AttentionBias::Shared {
                    "sdpa_bias"
                } else {
                    "sdpa_bias_batched"
                }
            );
            // Classified nowhere: no `static`, whatever the mask reads.
            assert_eq!(
                a.form(),
                "sdpa;mask=add;class=none;bias;scale=0.1767766952966369"
            );
            assert!(sdpa_refusals(&g).is_empty());
        }
        // T5's: the bias permuted from [Tq,Tk,H] leaves the heads innermost, the keys strided;
        // torch's own call on it runs the math path, which the bench's baseline reproduces.
        let t5 = Graph::parse(&sdpa("2,4,16,16", "1024,1,64,4", " @general")).unwrap();
        let a = &match_attention(&t5)[0];
        assert!(a.problem.mask_strided);
        assert_eq!(a.problem.rule_id(), "sdpa_bias_batched_strided");
        // Hugging Face's SDPA integration for a position bias: `where(mask, bias, finfo.min)`,
        // the bool mask of a class the kernels compute (T5's padding) and the bias shared. The
        // where is the pattern's: the kernel masks by the class and adds the bias, the
        // fallback replays the where.
        let t5_where = |cond_fact: &str, fill: &str| {
            gpt2_block(" @general")
                .replace(
                    "%am: bool[2,1,16,16]",
                    &format!("%am: bool[2,1,16,16]{cond_fact}, %pb: f32[1,4,16,16]{{1024,1,64,4}}"),
                )
                .replace(
                    "%attention_mask0.1 = aten::expand(%am, %94, %6) : bool[2,1,16,16]{0,256,16,1} @general",
                    &format!(
                        "%fill = prim::Constant[{fill}]()
                         %attention_mask0.1 = aten::where(%am, %pb, %fill) : f32[2,4,16,16]{{1024,1,64,4}} @general"
                    ),
                )
        };
        let g = Graph::parse(&t5_where(" @padded", "-3.4028234663852886e+38")).unwrap();
        let a = &match_attention(&g)[0];
        assert_eq!(a.problem.rule_id(), "sdpa_padded_bias_strided");
        assert_eq!(
            a.form(),
            "sdpa;mask=add;where;fill=-3.4028234663852886e38;class=padded;bias;scale=0.1767766952966369"
        );
        assert_eq!(g.values[a.mask.unwrap().0].name, "pb");
        assert_eq!(g.values[a.where_mask.unwrap().0].name, "am");
        assert!(a.nodes.iter().any(|&n| g.nodes[n].kind == "aten::where"));
        // A fill that does not mask, or a general bool mask: the where's output is the bias.
        for (cond_fact, fill) in [
            (" @padded", "-1.0"),
            (" @general", "-3.4028234663852886e+38"),
        ] {
            let g = Graph::parse(&t5_where(cond_fact, fill)).unwrap();
            let a = &match_attention(&g)[0];
            assert!(a.where_mask.is_none() && a.problem.bias == Some(AttentionBias::Batched));
            assert_eq!(a.problem.rule_id(), "sdpa_bias_batched_strided");
        }
        // A class the kernels compute keeps its kernel.
        let causal = Graph::parse(&sdpa("2,1,16,16", "0,256,16,1", " @causal/shape")).unwrap();
        assert_eq!(match_attention(&causal)[0].problem.bias, None);

        // Swin's window attention: the scale on q before the product, then a relative-position
        // bias [1,H,N,N] added, no mask class.
        let swin = |bias_ty: &str| {
            block(
                "%s1 = aten::mul(%s0, %one) : f32[2,4,16,16]",
                &format!(
                    "%rb = aten::contiguous(%bsrc, %zero) : {bias_ty}[1,4,16,16] @general/shape
                     %s2 = aten::add(%s0, %rb, %one) : f32[2,4,16,16]"
                ),
                "%y = aten::matmul(%p, %v) : f32[2,4,16,8]",
            )
            .replace(
                "%buf: bool[32,32]",
                &format!("%buf: bool[32,32], %bsrc: {bias_ty}[1,4,16,16]"),
            )
            .replace("%s1 = aten::mul(%s0, %one) : f32[2,4,16,16]", "")
        };
        let g = Graph::parse(&swin("f32")).unwrap();
        let a = &match_attention(&g)[0];
        assert_eq!(a.problem.bias, Some(AttentionBias::Shared));
        assert_eq!(a.problem.rule_id(), "attention_bias");
        assert_eq!(a.form(), "explicit;mask=add;class=none;bias");
        assert_eq!(a.kernel_scale(), Some(1.0));
        // A bias of another dtype than the scores' is not the kernel's to add.
        assert!(match_attention(&Graph::parse(&swin("bf16")).unwrap()).is_empty());
    }

    /// Swin's window attention as torchvision writes it: q scaled before the product, the
    /// relative position bias added, and in shifted blocks (`shifted`) the scores viewed per
    /// window [B/W, W, H, N, N], the window mask added and viewed back.
    fn swin_block(shifted: bool, window_ty: &str) -> String {
        let shift = if shifted {
            "%w5 = prim::ListConstruct(%one, %two, %four, %n, %n) : int[]
             %v5 = aten::view(%s1, %w5) : f32[1,2,4,16,16]
             %x5 = aten::add(%v5, %wm, %one) : f32[1,2,4,16,16]
             %w4 = prim::ListConstruct(%m1, %four, %n, %n) : int[]
             %s2 = aten::view(%x5, %w4) : f32[2,4,16,16]"
        } else {
            ""
        };
        let last = if shifted { "%s2" } else { "%s1" };
        format!(
            "graph(%q0: f32[2,4,16,8], %k: f32[2,4,16,8], %v: f32[2,4,16,8], %rb: f32[1,4,16,16] @general/shape, %wm: {window_ty}[1,2,1,16,16]):
               %m1 = prim::Constant[-1]()
               %m2 = prim::Constant[-2]()
               %one = prim::Constant[1]()
               %two = prim::Constant[2]()
               %four = prim::Constant[4]()
               %n = prim::Constant[16]()
               %none = prim::Constant[None]()
               %c = prim::Constant[0.35355339059327373]()
               %q = aten::mul(%q0, %c) : f32[2,4,16,8]
               %kt = aten::transpose(%k, %m2, %m1) : f32[2,4,8,16]
               %s0 = aten::matmul(%q, %kt) : f32[2,4,16,16]
               %s1 = aten::add(%s0, %rb, %one) : f32[2,4,16,16]
               {shift}
               %p = aten::softmax({last}, %m1, %none) : f32[2,4,16,16]
               %y = aten::matmul(%p, %v) : f32[2,4,16,8]
               return (%y)"
        )
    }

    #[test]
    fn swins_windows_add_the_position_bias_and_the_window_mask_as_one_bias() {
        let g = Graph::parse(&swin_block(false, "f32")).unwrap();
        let a = &match_attention(&g)[0];
        // q's scale is the kernel's; the fallback scales q as the graph did.
        assert!(a.scale_q && a.window.is_none());
        assert_eq!(a.problem.rule_id(), "attention_bias");
        assert_eq!(
            a.form(),
            "explicit;mul=0.35355339059327373;scale_q;mask=add;class=none;bias"
        );
        assert!((a.kernel_scale().unwrap() - 0.35355339059327373).abs() < 1e-15);
        assert_eq!(g.values[a.q].name, "q0");
        // Shifted: the window mask through the 5-d view; one bias per window.
        let g = Graph::parse(&swin_block(true, "f32")).unwrap();
        let a = &match_attention(&g)[0];
        assert_eq!(a.problem.bias, Some(AttentionBias::Windows(2)));
        assert_eq!(a.problem.rule_id(), "attention_bias_windows2");
        assert_eq!(
            a.form(),
            "explicit;mul=0.35355339059327373;scale_q;mask=add;class=none;bias;windows"
        );
        assert_eq!(g.values[a.window.unwrap()].name, "wm");
        // The pattern holds every node from q's scale to the second product: 3 of the view.
        assert_eq!(a.nodes.len(), 9, "{:?}", a.nodes);
        // A window mask of another dtype than the position bias's: no match.
        assert!(match_attention(&Graph::parse(&swin_block(true, "bf16")).unwrap()).is_empty());
    }

    /// Swin V2's cosine attention: q and k normalized (the graph's), their product scaled by the
    /// logit scale, one per head ([H,1,1]), then the bias `16 * sigmoid(..)` added (a product,
    /// not of a matmul); shifted blocks add their window mask through the 5-d view.
    fn swin_v2_block(shifted: bool, scale: &str) -> String {
        swin_block(shifted, "f32")
            .replace(
                "%rb: f32[1,4,16,16] @general/shape",
                &format!("%rb0: f32[1,4,16,16], %ls: f32[{scale}]"),
            )
            .replace(
                "%q = aten::mul(%q0, %c) : f32[2,4,16,8]",
                "%q = aten::neg(%q0) : f32[2,4,16,8]",
            )
            .replace(
                "%s0 = aten::matmul(%q, %kt) : f32[2,4,16,16]",
                "%sg = aten::sigmoid(%rb0) : f32[1,4,16,16]
               %rb = aten::mul(%sg, %n) : f32[1,4,16,16] @general/shape
               %s00 = aten::matmul(%q, %kt) : f32[2,4,16,16]
               %s0 = aten::mul(%s00, %ls) : f32[2,4,16,16]",
            )
    }

    #[test]
    fn swin_v2s_logit_scale_per_head_and_its_bias_of_a_product() {
        for shifted in [false, true] {
            let g = Graph::parse(&swin_v2_block(shifted, "4,1,1")).unwrap();
            let a = &match_attention(&g)[0];
            assert_eq!(g.values[a.scale_operand().unwrap()].name, "ls");
            assert_eq!(g.values[a.q].name, "q");
            assert_eq!(a.kernel_scale(), None);
            let windows = if shifted { ";windows" } else { "" };
            assert_eq!(
                a.form(),
                format!("explicit;mul=tensor;mask=add;class=none;bias{windows}")
            );
        }
        // [1,H,1,1] too; a factor per query or per key is no kernel's.
        let g = Graph::parse(&swin_v2_block(false, "1,4,1,1")).unwrap();
        assert_eq!(match_attention(&g).len(), 1);
        for other in ["1,16,1", "4,16,1", "2,1,1,1"] {
            let g = Graph::parse(&swin_v2_block(false, other)).unwrap();
            assert!(match_attention(&g).is_empty(), "{other}");
        }
    }

    /// Hugging Face's eager attention (`eager_attention_forward`): the mask added to the scaled
    /// scores in bf16, the softmax in fp32 (its dtype argument, or over `x.float()`), the
    /// probabilities cast back (`cast_back`).
    fn eager_block(softmax: &str, cast_back: &str) -> String {
        format!(
            "graph(%q: bf16[2,4,16,8], %k: bf16[2,4,16,8], %v: bf16[2,4,16,8], %am: bf16[2,1,16,16] @causal/shape):
               %m1 = prim::Constant[-1]()
               %m2 = prim::Constant[-2]()
               %one = prim::Constant[1]()
               %f32 = prim::Constant[6]()
               %bf16 = prim::Constant[15]()
               %no = prim::Constant[False]()
               %none = prim::Constant[None]()
               %c = prim::Constant[0.35355339059327373]()
               %p0 = prim::Constant[0.0]()
               %kt = aten::transpose(%k, %m2, %m1) : bf16[2,4,8,16]
               %s0 = aten::matmul(%q, %kt) : bf16[2,4,16,16]
               %s1 = aten::mul(%s0, %c) : bf16[2,4,16,16]
               %s2 = aten::add(%s1, %am, %one) : bf16[2,4,16,16]
               {softmax}
               {cast_back}
               %pd = aten::dropout(%pc, %p0, %no) : bf16[2,4,16,16]
               %y = aten::matmul(%pd, %v) : bf16[2,4,16,8]
               return (%y)"
        )
    }

    #[test]
    fn eager_attention_with_its_softmax_in_fp32_is_one_pattern() {
        let to_bf16 = "%pc = aten::to(%p, %bf16, %no, %no, %none) : bf16[2,4,16,16]";
        for (softmax, cast_back) in [
            // softmax(x, -1, dtype=torch.float32).to(query.dtype)
            (
                "%p = aten::softmax(%s2, %m1, %f32) : f32[2,4,16,16]",
                to_bf16,
            ),
            // softmax(x.float(), -1).to(v.dtype) (MPT's eager attention)
            (
                "%x = aten::to(%s2, %f32, %no, %no, %none) : f32[2,4,16,16]
                 %p = aten::softmax(%x, %m1, %none) : f32[2,4,16,16]",
                to_bf16,
            ),
        ] {
            let g = Graph::parse(&eager_block(softmax, cast_back)).unwrap();
            let a = &match_attention(&g)[0];
            assert!(a.softmax_f32 && !a.upcast);
            assert_eq!(a.problem.rule_id(), "attention_causal_mask");
            assert_eq!(
                a.form(),
                "explicit;mul=0.35355339059327373;mask=add;class=causal;static;softmax_f32"
            );
            // Every node from k's transpose to the second product is the pattern's.
            let kinds: Vec<&str> = a.nodes.iter().map(|&n| g.nodes[n].kind.as_str()).collect();
            for k in [
                "aten::transpose",
                "aten::mul",
                "aten::add",
                "aten::softmax",
                "aten::to",
                "aten::dropout",
            ] {
                assert!(kinds.contains(&k), "{k}: {kinds:?}");
            }
        }
        // The probabilities cast to another dtype than v's, or left in fp32: no match.
        let f16 = eager_block(
            "%p = aten::softmax(%s2, %m1, %f32) : f32[2,4,16,16]",
            "%pc = aten::to(%p, %bf16, %no, %no, %none) : f16[2,4,16,16]",
        );
        assert!(match_attention(&Graph::parse(&f16).unwrap()).is_empty());
        let uncast = eager_block(
            "%p = aten::softmax(%s2, %m1, %f32) : f32[2,4,16,16]",
            "%pc = aten::relu(%p) : f32[2,4,16,16]",
        );
        assert!(match_attention(&Graph::parse(&uncast).unwrap()).is_empty());
    }

    #[test]
    fn a_general_mask_under_a_where_or_before_the_scale_is_no_bias() {
        // GPT-Neo's local layers: the where's condition is a general window; the kernel has no
        // fill to replace the scores with.
        let g = Graph::parse(&gpt_neo_block(" @general/shape", "%fill")).unwrap();
        assert!(match_attention(&g).is_empty());
        // CodeGen's order with a general mask: the kernel adds after the scale.
        let codegen = gptj_block("f32", " @general")
            .replace(
                "%s1 = aten::div(%s0, %root) : f32[2,4,16,16]",
                "%s1 = aten::add(%s0, %am, %one) : f32[2,4,16,16]",
            )
            .replace(
                "%s2 = aten::add(%s1, %am, %one) : f32[2,4,16,16]",
                "%s2 = aten::div(%s1, %root) : f32[2,4,16,16]",
            );
        assert!(match_attention(&Graph::parse(&codegen).unwrap()).is_empty());
    }

    /// Llama's attention as traced (LlamaForCausalLM, hidden 256, 8 heads, 2 KV heads, B 2,
    /// T 16): k and v repeated 4 times by repeat_kv (`[:, :, None]` as slices around an unsqueeze,
    /// expand, reshape) before SDPA.
    fn llama_block(repeat_tail: &str) -> String {
        let repeat = |src: &str, out: &str, p: &str| {
            format!(
                "%{p}a = aten::size(%{src}, %25) : int
                 %{p}b = aten::size(%{src}, %23) : int
                 %{p}n = prim::NumToTensor(%{p}b) : i64[]
                 %{p}c = aten::size(%{src}, %22) : int
                 %{p}d = aten::size(%{src}, %10) : int
                 %{p}0 = aten::slice(%{src}, %25, %25, %24, %23) : bf16[2,2,16,32]
                 %{p}1 = aten::slice(%{p}0, %23, %25, %24, %23) : bf16[2,2,16,32]
                 %{p}2 = aten::unsqueeze(%{p}1, %22) : bf16[2,2,1,16,32]
                 %{p}3 = aten::slice(%{p}2, %10, %25, %24, %23) : bf16[2,2,1,16,32]
                 %{p}4 = aten::slice(%{p}3, %17, %25, %24, %23) : bf16[2,2,1,16,32]
                 %{p}l = prim::ListConstruct(%{p}a, %{p}b, %17, %{p}c, %{p}d) : int[]
                 %{p}5 = aten::expand(%{p}4, %{p}l, %6) : bf16[2,2,4,16,32]{{1024,512,0,32,1}}
                 %{p}m = aten::mul(%{p}n, %14) : i64[]
                 %{p}i = aten::Int(%{p}m) : int
                 %{p}r = prim::ListConstruct(%{p}a, %{p}i, %{p}c, %{p}d) : int[]
                 %{out} = aten::reshape(%{p}5, %{p}r) : bf16[2,8,16,32]"
            )
        };
        format!(
            "graph(%self: W, %query.1: bf16[2,8,16,32], %k.1: bf16[2,2,16,32], %v.1: bf16[2,2,16,32], %am: bool[2,1,16,16] @causal/shape):
               %6 = prim::Constant[False]()
               %10 = prim::Constant[3]()
               %14 = prim::Constant[{{4}}]()
               %17 = prim::Constant[4]()
               %18 = prim::Constant[0.]()
               %19 = prim::Constant[0.17677669529663689]()
               %22 = prim::Constant[2]()
               %23 = prim::Constant[1]()
               %24 = prim::Constant[9223372036854775807]()
               %25 = prim::Constant[0]()
               {}
               {}
               %attn_output.1 = aten::scaled_dot_product_attention(%query.1, %key.1, %value.1, %am, %18, %6, %19, %6) : bf16[2,8,16,32]
               return (%attn_output.1{repeat_tail})",
            repeat("k.1", "key.1", "k"),
            repeat("v.1", "value.1", "v"),
        )
    }

    #[test]
    fn llamas_repeated_kv_heads_are_read_in_place() {
        let g = Graph::parse(&llama_block("")).unwrap();
        let a = &match_attention(&g)[0];
        assert_eq!(
            (
                a.problem.rule_id(),
                a.problem.heads,
                a.problem.kv_heads,
                a.repeat
            ),
            ("sdpa_causal_mask".to_string(), 8, Some(2), Some(4))
        );
        assert_eq!(
            (g.values[a.k].name.as_str(), g.values[a.v].name.as_str()),
            ("k.1", "v.1")
        );
        assert_eq!(
            a.form(),
            "sdpa;mask=bool;repeat=4;class=causal;static;scale=0.1767766952966369"
        );
        // SDPA and both repeats' tensor nodes (4 slices, unsqueeze, expand, reshape each); the
        // size arithmetic feeding the reshape stays (it reads only sizes).
        let kinds = |a: &AttentionMatch| -> Vec<String> {
            a.nodes.iter().map(|&n| g.nodes[n].kind.clone()).collect()
        };
        let k = kinds(a);
        assert_eq!(k.len(), 1 + 2 * 7, "{k:?}");
        assert_eq!(k.iter().filter(|k| *k == "aten::slice").count(), 8);
        assert!(!k
            .iter()
            .any(|k| k == "aten::mul" || k == "prim::ListConstruct"));
        // A repeated key the graph also returns stays: the match reads through it, and owns only
        // v's repeat.
        let g = Graph::parse(&llama_block(", %key.1")).unwrap();
        let a = &match_attention(&g)[0];
        assert_eq!((a.repeat, a.nodes.len()), (Some(4), 1 + 7));
        // `repeat(1, G, 1, 1)` tiles the heads (head h reads h % Hkv): no grouped match.
        let tiled = Graph::parse(
            "graph(%q: bf16[2,8,16,32], %k: bf16[2,2,16,32], %v: bf16[2,8,16,32]):
               %1 = prim::Constant[1]()
               %4 = prim::Constant[4]()
               %f = prim::Constant[False]()
               %p = prim::Constant[0.]()
               %none = prim::Constant[None]()
               %r = prim::ListConstruct(%1, %4, %1, %1) : int[]
               %kr = aten::repeat(%k, %r) : bf16[2,8,16,32]
               %y = aten::scaled_dot_product_attention(%q, %kr, %v, %none, %p, %f, %none, %f) : bf16[2,8,16,32]
               return (%y)",
        )
        .unwrap();
        let a = &match_attention(&tiled)[0];
        assert_eq!((a.repeat, a.problem.kv_heads), (None, None));
        assert_eq!(
            a.k,
            tiled.values.iter().position(|v| v.name == "kr").unwrap()
        );
    }

    #[test]
    fn the_output_keeps_the_memory_order_the_graph_recorded() {
        let g = |out: &str| {
            Graph::parse(&format!(
                "graph(%q: bf16[32,12,197,64], %k: bf16[32,12,197,64], %v: bf16[32,12,197,64]):
                   %f = prim::Constant[False]()
                   %p = prim::Constant[0.]()
                   %none = prim::Constant[None]()
                   %y = aten::scaled_dot_product_attention(%q, %k, %v, %none, %p, %f, %none, %f) : {out}
                   return (%y)"
            ))
            .unwrap()
        };
        let form = |out: &str| match_attention(&g(out))[0].form();
        // torchvision's MultiheadAttention: q is a view of [T, B*H, D], and SDPA's output lies
        // as q does, [T,B,H,D] memory; the exported graph then views it without a copy.
        assert_eq!(
            form("bf16[32,12,197,64]{768,64,24576,1}"),
            "sdpa;out=2,0,1,3"
        );
        // The kernels' own order, packed [B,H,T,D] (which keeps the kernels'), and nothing recorded.
        assert_eq!(form("bf16[32,12,197,64]{151296,64,768,1}"), "sdpa");
        assert_eq!(form("bf16[32,12,197,64]{151296,12608,64,1}"), "sdpa");
        assert_eq!(form("bf16[32,12,197,64]"), "sdpa");
        // A batch of one lies anywhere: what the other dims say decides.
        assert_eq!(form("bf16[1,12,197,64]{768,64,768,1}"), "sdpa");
        // D not innermost: no order a kernel writes (the kernels' own stays).
        assert_eq!(form("bf16[32,12,197,64]{151296,64,1,197}"), "sdpa");
    }

    #[test]
    fn enable_gqa_and_repeat_interleave_are_grouped_query() {
        let g = |call: &str, k_heads: i64| {
            Graph::parse(&format!(
                "graph(%q: f16[1,8,64,64], %k: f16[1,{k_heads},64,64], %v: f16[1,{k_heads},64,64]):
                   %1 = prim::Constant[1]()
                   %4 = prim::Constant[4]()
                   %t = prim::Constant[True]()
                   %f = prim::Constant[False]()
                   %p = prim::Constant[0.]()
                   %none = prim::Constant[None]()
                   {call}
                   return (%y)"
            ))
            .unwrap()
        };
        let gqa = g("%y = aten::scaled_dot_product_attention(%q, %k, %v, %none, %p, %t, %none, %t) : f16[1,8,64,64]", 2);
        let a = &match_attention(&gqa)[0];
        assert_eq!(
            (a.problem.rule_id(), a.problem.kv_heads, a.form()),
            (
                "sdpa_causal".to_string(),
                Some(2),
                "sdpa;causal;gqa".to_string()
            )
        );
        // Without enable_gqa, fewer k heads are no attention torch computes.
        let no = g("%y = aten::scaled_dot_product_attention(%q, %k, %v, %none, %p, %t, %none, %f) : f16[1,8,64,64]", 2);
        assert!(match_attention(&no).is_empty());
        // 8 heads by 2 does not divide 3.
        let bad = g("%y = aten::scaled_dot_product_attention(%q, %k, %v, %none, %p, %t, %none, %t) : f16[1,8,64,64]", 3);
        assert!(match_attention(&bad).is_empty());
        // One k/v head without enable_gqa is multi-query attention by broadcasting (Falcon's):
        // every query head reads head 0, as torch's SDPA computes it.
        let mqa = g("%y = aten::scaled_dot_product_attention(%q, %k, %v, %none, %p, %t, %none, %f) : f16[1,8,64,64]", 1);
        let a = &match_attention(&mqa)[0];
        assert_eq!(
            (a.problem.kv_heads, a.repeat, a.form()),
            (Some(1), None, "sdpa;causal".to_string())
        );
        let interleaved = g(
            "%kr = aten::repeat_interleave(%k, %4, %1, %none) : f16[1,8,64,64]
             %vr = aten::repeat_interleave(%v, %4, %1, %none) : f16[1,8,64,64]
             %y = aten::scaled_dot_product_attention(%q, %kr, %vr, %none, %p, %f, %none, %f) : f16[1,8,64,64]",
            2,
        );
        let a = &match_attention(&interleaved)[0];
        assert_eq!(
            (a.problem.kv_heads, a.repeat, a.nodes.len(), a.form()),
            (Some(2), Some(4), 3, "sdpa;repeat=4".to_string())
        );
    }

    /// BERT's attention as traced (BertModel, 128 wide, 4 heads, B 2, T 16): without an
    /// attention_mask the mask is `ge(q_idx, 0)` expanded to [B,H,T,T], every key visible; with
    /// one it also reads the input's data (classified on a sample, so the kernel is the padded
    /// one).
    fn bert_block(mask_fact: &str) -> String {
        format!(
            "graph(%self: W, %query0.1: f32[2,4,16,32]{{2048,32,128,1}}, %key0.1: f32[2,4,16,32]{{2048,32,128,1}}, %value0.1: f32[2,4,16,32]{{2048,32,128,1}}, %m: bool[2,1,16,16]):
               %4 = prim::Constant[4]()
               %6 = prim::Constant[0.]()
               %16 = prim::Constant[2]()
               %5 = prim::Constant[0.17677669529663689]()
               %20 = prim::Constant[False]()
               %-1 = prim::Constant[-1]()
               %l = prim::ListConstruct(%16, %4, %-1, %-1) : int[]
               %attention_mask0.1 = aten::expand(%m, %l, %20) : bool[2,4,16,16]{{256,0,16,1}}{mask_fact}
               %attn_output.1 = aten::scaled_dot_product_attention(%query0.1, %key0.1, %value0.1, %attention_mask0.1, %6, %20, %5, %20) : f32[2,4,16,32]
               return (%attn_output.1)"
        )
    }

    #[test]
    fn berts_masks_with_and_without_padding() {
        let rule = |fact: &str| {
            let g = Graph::parse(&bert_block(fact)).unwrap();
            match_attention(&g)
                .first()
                .map(|a| (a.problem.rule_id(), a.nodes.len(), a.form()))
        };
        let form = |class: &str| format!("sdpa;mask=bool;class={class};scale=0.1767766952966369");
        // Computed from shapes alone (no padding input): classified once per shape.
        assert_eq!(
            rule(" @none/shape"),
            Some(("sdpa_mask".to_string(), 1, form("none;static")))
        );
        // A user's attention_mask: the sample may show no padding, other inputs will.
        assert_eq!(
            rule(" @none"),
            Some(("sdpa_padded".to_string(), 1, form("padded")))
        );
        assert_eq!(
            rule(" @padded"),
            Some(("sdpa_padded".to_string(), 1, form("padded")))
        );
        // Left padding (a prefix no longer) is general.
        assert_eq!(rule(" @general"), None);
    }

    /// GPT-Neo's attention as traced (B 2, 4 heads, T 16, D 8, bf16): q and k cast to fp32 and
    /// their lengths read, q·kᵀ unscaled, `where(c, scores, fill)` with c a slice of a bool buffer
    /// (`cond` its annotation) and fill finfo(fp32).min, the computed mask added, softmax, the cast
    /// back, eval dropout, ·v.
    fn gpt_neo_block(cond: &str, fill: &str) -> String {
        format!(
            "graph(%q0: bf16[2,4,16,8], %k0: bf16[2,4,16,8], %v: bf16[2,4,16,8], %c: bool[1,1,16,16]{cond}, %am: f32[2,1,16,16] @causal/shape):
               %m1 = prim::Constant[-1]()
               %m2 = prim::Constant[-2]()
               %one = prim::Constant[1]()
               %f32 = prim::Constant[6]()
               %bf16 = prim::Constant[15]()
               %no = prim::Constant[False]()
               %none = prim::Constant[None]()
               %p0 = prim::Constant[0.0]()
               %fill = prim::Constant[{{{fill}}}]()
               %q = aten::to(%q0, %f32, %no, %no, %none) : f32[2,4,16,8]
               %k = aten::to(%k0, %f32, %no, %no, %none) : f32[2,4,16,8]
               %tq = aten::size(%q, %m2) : int
               %tk = aten::size(%k, %m2) : int
               %kt = aten::transpose(%k, %m1, %m2) : f32[2,4,8,16]
               %s0 = aten::matmul(%q, %kt) : f32[2,4,16,16]
               %mv = aten::to(%fill, %f32, %no, %no, %none) : f32[]
               %mvd = aten::detach(%mv) : f32[]
               %s1 = aten::where(%c, %s0, %mvd) : f32[2,4,16,16]
               %s2 = aten::add(%s1, %am, %one) : f32[2,4,16,16]
               %p = aten::softmax(%s2, %m1, %none) : f32[2,4,16,16]
               %pc = aten::to(%p, %bf16, %no, %no, %none) : bf16[2,4,16,16]
               %pd = aten::dropout(%pc, %p0, %no) : bf16[2,4,16,16]
               %o = aten::matmul(%pd, %v) : bf16[2,4,16,8]
               return (%o, %tq, %tk)"
        )
    }

    #[test]
    fn gpt_neos_attention_with_a_where_under_its_added_mask_is_one_pattern() {
        let g = Graph::parse(&gpt_neo_block(" @causal/shape", "-3.40282e+38")).unwrap();
        let a = &match_attention(&g)[0];
        let name = |v: ValueId| g.values[v].name.as_str();
        assert_eq!((name(a.q), name(a.k)), ("q0", "k0"));
        let (c, fill) = a.cond.unwrap();
        assert_eq!((name(c), name(fill)), ("c", "mvd"));
        assert!(a.upcast && a.problem.causal && !a.problem.padded);
        assert_eq!(
            a.form(),
            "explicit;mask=add;class=causal;static;upcast;where"
        );
        // The casts stay for the sizes that read them; the where is the pattern's.
        let kinds: Vec<&str> = a.nodes.iter().map(|&n| g.nodes[n].kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "aten::transpose",
                "aten::matmul",
                "aten::where",
                "aten::add",
                "aten::softmax",
                "aten::to",
                "aten::dropout",
                "aten::matmul"
            ]
        );
        // The two masks meet: a padded condition under the causal mask is causal and padded.
        let g = Graph::parse(&gpt_neo_block(" @padded/shape", "-3.40282e+38")).unwrap();
        let a = &match_attention(&g)[0];
        assert!(a.problem.causal && a.problem.padded && a.mask_static);
        // A fill that does not mask (-10000 is no bound), or a general condition, is no match.
        for (cond, fill) in [
            (" @causal/shape", "-10000."),
            (" @general/shape", "-3.40282e+38"),
            ("", "-3.40282e+38"),
        ] {
            let g = Graph::parse(&gpt_neo_block(cond, fill)).unwrap();
            assert!(match_attention(&g).is_empty(), "{cond} {fill}");
        }
    }

    /// GPT-J's attention as traced (B 2, 4 heads, T 16, D 8, in `dt`): q and k cast to fp32, q·kᵀ
    /// divided by √D, the causal mask the graph built added (`fact` its annotation), softmax,
    /// the probabilities cast to v's dtype, eval dropout, ·v.
    fn gptj_block(dt: &str, fact: &str) -> String {
        format!(
            "graph(%q0: {dt}[2,4,16,8], %k0: {dt}[2,4,16,8], %v: {dt}[2,4,16,8], %am: f32[2,1,16,16]{fact}):
               %m1 = prim::Constant[-1]()
               %m2 = prim::Constant[-2]()
               %one = prim::Constant[1]()
               %f32 = prim::Constant[6]()
               %dtv = prim::Constant[{code}]()
               %no = prim::Constant[False]()
               %none = prim::Constant[None]()
               %root = prim::Constant[2.8284271247461903]()
               %p0 = prim::Constant[0.0]()
               %q = aten::to(%q0, %f32, %no, %no, %none) : f32[2,4,16,8]
               %k = aten::to(%k0, %f32, %no, %no, %none) : f32[2,4,16,8]
               %kt = aten::transpose(%k, %m1, %m2) : f32[2,4,8,16]
               %s0 = aten::matmul(%q, %kt) : f32[2,4,16,16]
               %s1 = aten::div(%s0, %root) : f32[2,4,16,16]
               %s2 = aten::add(%s1, %am, %one) : f32[2,4,16,16]
               %p = aten::softmax(%s2, %m1, %none) : f32[2,4,16,16]
               %pc = aten::to(%p, %dtv, %no, %no, %none) : {dt}[2,4,16,16]
               %pd = aten::dropout(%pc, %p0, %no) : {dt}[2,4,16,16]
               %o = aten::matmul(%pd, %v) : {dt}[2,4,16,8]
               return (%o)",
            code = if dt == "bf16" { 15 } else { 6 }
        )
    }

    /// MPNet's eager attention: q·kᵀ / √D, its relative position bias added in place, then the
    /// padding mask, softmax, eval dropout, ·v; `pb` and `am` with the facts the bridge read.
    fn mpnet_block(dt: &str, pb: &str, am: &str) -> String {
        format!(
            "graph(%q: {dt}[2,4,16,8], %k: {dt}[2,4,16,8], %v: {dt}[2,4,16,8], %pb: {dt}[{pb}, %am: {dt}[{am}):
               %m1 = prim::Constant[-1]()
               %m2 = prim::Constant[-2]()
               %one = prim::Constant[1]()
               %no = prim::Constant[False]()
               %none = prim::Constant[None]()
               %root = prim::Constant[2.8284271247461903]()
               %p0 = prim::Constant[0.1]()
               %kt = aten::transpose(%k, %m2, %m1) : {dt}[2,4,8,16]
               %s0 = aten::matmul(%q, %kt) : {dt}[2,4,16,16]
               %s1 = aten::div(%s0, %root) : {dt}[2,4,16,16]
               %s2 = aten::add_(%s1, %pb, %one) : {dt}[2,4,16,16]
               %s3 = aten::add(%s2, %am, %one) : {dt}[2,4,16,16]
               %p = aten::softmax(%s3, %m1, %none) : {dt}[2,4,16,16]
               %pd = aten::dropout(%p, %p0, %no) : {dt}[2,4,16,16]
               %o = aten::matmul(%pd, %v) : {dt}[2,4,16,8]
               return (%o)"
        )
    }

    #[test]
    fn a_position_bias_and_a_padding_mask_added_in_turn_are_the_bias_and_the_class() {
        for dt in ["bf16", "f32"] {
            let text = mpnet_block(dt, "2,4,16,16] @general", "2,1,16,16] @padded");
            let g = Graph::parse(&text).unwrap();
            let a = &match_attention(&g)[0];
            assert_eq!(a.nodes.len(), 8, "{dt}: every node from kᵀ to the output");
            let pb = g.values.iter().position(|v| v.name == "pb").unwrap();
            let am = g.values.iter().position(|v| v.name == "am").unwrap();
            assert_eq!(
                (a.mask, a.plus),
                (Some((am, MaskMode::Add)), Some((pb, Order::Before)))
            );
            assert_eq!(a.problem.rule_id(), "attention_padded_bias_batched");
            assert_eq!(
                a.form(),
                "explicit;div=2.8284271247461903;mask=add;class=padded;plus=before"
            );
        }
        // One bias for every sequence; the mask a function of the sizes (static).
        let g = Graph::parse(&mpnet_block(
            "bf16",
            "1,4,16,16] @general",
            "2,1,16,16] @causal/shape",
        ))
        .unwrap();
        let a = &match_attention(&g)[0];
        assert_eq!(a.problem.rule_id(), "attention_causal_bias");
        assert!(a
            .form()
            .ends_with("mask=add;class=causal;static;plus=before"));
        // The mask added first, the bias after it (either operand order).
        let text = mpnet_block("bf16", "2,4,16,16] @general", "2,1,16,16] @padded")
            .replace("aten::add_(%s1, %pb, %one)", "aten::add(%am, %s1, %one)")
            .replace("aten::add(%s2, %am, %one)", "aten::add(%pb, %s2, %one)");
        let g = Graph::parse(&text).unwrap();
        let a = &match_attention(&g)[0];
        let pb = g.values.iter().position(|v| v.name == "pb").unwrap();
        assert_eq!(a.plus, Some((pb, Order::After)));
        assert!(a.form().ends_with("class=padded;plus=after"));
        // MPNet's bias in memory is one per sequence, `expand(x, ..).contiguous()`: the kernel
        // reads the expand, one bias for every sequence (shared, stepped by 0).
        let expanded = mpnet_block("bf16", "1,4,16,16]", "2,1,16,16] @padded")
            .replace("%pb: bf16[1,4,16,16]", "%pb0: bf16[1,4,16,16]")
            .replace(
                "%kt = aten::transpose",
                "%l = prim::ListConstruct(%m1, %m1, %m1, %m1)
               %pe = aten::expand(%pb0, %l, %no) : bf16[2,4,16,16]{0,256,16,1}
               %pb = aten::contiguous(%pe, %one) : bf16[2,4,16,16] @general
               %kt = aten::transpose",
            );
        let g = Graph::parse(&expanded).unwrap();
        let a = &match_attention(&g)[0];
        let pe = g.values.iter().position(|v| v.name == "pe").unwrap();
        assert_eq!(a.plus, Some((pe, Order::Before)));
        assert_eq!(a.problem.rule_id(), "attention_padded_bias");
        // Not where a reader writes the copy in place: then the copy holds other values.
        let written = expanded.replace(
            "%kt = aten::transpose",
            "%w = aten::mul_(%pb, %one) : bf16[2,4,16,16]
               %kt = aten::transpose",
        );
        let g = Graph::parse(&written).unwrap();
        let a = &match_attention(&g)[0];
        assert_eq!(a.problem.rule_id(), "attention_padded_bias_batched");
        // Two terms of no class: nothing says which is the mask.
        let g = Graph::parse(&mpnet_block(
            "bf16",
            "2,4,16,16] @general",
            "2,1,16,16] @general",
        ))
        .unwrap();
        assert!(match_attention(&g).is_empty());
        // An in-place add that writes the bias, not the scores, is the graph's.
        let text = mpnet_block("bf16", "2,4,16,16] @general", "2,1,16,16] @padded")
            .replace("aten::add_(%s1, %pb, %one)", "aten::add_(%pb, %s1, %one)");
        assert!(match_attention(&Graph::parse(&text).unwrap()).is_empty());
        // A bias of another dtype than q (the scores promoted past it) is no kernel's.
        let text = mpnet_block("bf16", "2,4,16,16] @general", "2,1,16,16] @padded")
            .replace("%pb: bf16", "%pb: f32");
        assert!(match_attention(&Graph::parse(&text).unwrap()).is_empty());
    }

    /// MPT's eager attention: q·kᵀ · s, its ALiBi bias ([H,1,Tk], one row of keys per head)
    /// added, masked_fill(mask, finfo.min), softmax over `x.float()`, cast back, ·v.
    fn mpt_block(dt: &str, fill: &str) -> String {
        format!(
            "graph(%q: {dt}[2,4,16,8], %k: {dt}[2,4,16,8], %v: {dt}[2,4,16,8], %alibi: {dt}[4,1,16], %mask: bool[2,1,16,16]):
               %m1 = prim::Constant[-1]()
               %m2 = prim::Constant[-2]()
               %one = prim::Constant[1]()
               %f32 = prim::Constant[6]()
               %dtv = prim::Constant[{code}]()
               %no = prim::Constant[False]()
               %none = prim::Constant[None]()
               %c = prim::Constant[0.35355339059327373]()
               %min = prim::Constant[{fill}]()
               %p0 = prim::Constant[0.0]()
               %kt = aten::transpose(%k, %m1, %m2) : {dt}[2,4,8,16]
               %s0 = aten::matmul(%q, %kt) : {dt}[2,4,16,16]
               %s1 = aten::mul(%s0, %c) : {dt}[2,4,16,16]
               %s2 = aten::add(%s1, %alibi, %one) : {dt}[2,4,16,16]
               %s3 = aten::masked_fill(%s2, %mask, %min) : {dt}[2,4,16,16]
               %sf = aten::to(%s3, %f32, %no, %no, %none) : f32[2,4,16,16]
               %p = aten::softmax(%sf, %m1, %none) : f32[2,4,16,16]
               %pc = aten::to(%p, %dtv, %no, %no, %none) : {dt}[2,4,16,16]
               %pd = aten::dropout(%pc, %p0, %no) : {dt}[2,4,16,16]
               %o = aten::matmul(%pd, %v) : {dt}[2,4,16,8]
               return (%o)",
            code = if dt == "bf16" { 15 } else { 6 }
        )
    }

    #[test]
    fn alibi_before_a_fill_of_the_lowest_value_is_a_row_of_keys_beside_the_causal_class() {
        for dt in ["bf16", "f32"] {
            let g = Graph::parse(&mpt_block(dt, "-3.4028234663852886e38")).unwrap();
            let a = &match_attention(&g)[0];
            let alibi = g.values.iter().position(|v| v.name == "alibi").unwrap();
            assert_eq!(a.plus, Some((alibi, Order::Before)), "{dt}");
            assert_eq!(a.fill, Some(-3.4028234663852886e38));
            assert!(a.softmax_f32 && a.problem.causal);
            assert_eq!(a.problem.bias, Some(AttentionBias::Keys));
            assert_eq!(a.problem.rule_id(), "attention_causal_bias_keys");
            assert_eq!(
                a.form(),
                "explicit;mul=0.35355339059327373;mask=fill;fill=-3.4028234663852886e38;plus=before;softmax_f32"
            );
            assert_eq!(a.nodes.len(), 10);
        }
        // -inf as before: no fill in the form.
        let g = Graph::parse(&mpt_block("bf16", "-inf")).unwrap();
        let a = &match_attention(&g)[0];
        assert_eq!(a.fill, None);
        assert!(!a.form().contains("fill="));
        // A fill that leaves the cells some weight (-10000 in fp32) masks nothing a kernel knows.
        let g = Graph::parse(&mpt_block("f32", "-10000.0")).unwrap();
        assert!(match_attention(&g).is_empty());
        // Without the bias, a plain masked_fill of the lowest value.
        let text = mpt_block("f32", "-3.4028234663852886e38")
            .replace("%s2 = aten::add(%s1, %alibi, %one) : f32[2,4,16,16]", "")
            .replace("aten::masked_fill(%s2,", "aten::masked_fill(%s1,");
        let a = &match_attention(&Graph::parse(&text).unwrap())[0];
        assert_eq!((a.plus, a.problem.bias), (None, None));
        assert_eq!(a.problem.rule_id(), "attention_causal");
    }

    #[test]
    fn codegens_attention_scales_after_its_added_mask() {
        // CodeGen: q·kᵀ in fp32, the mask added, then the sum divided by √D.
        let codegen = |divisor: &str| {
            gptj_block("bf16", " @causal/shape")
                .replace(
                    "%s1 = aten::div(%s0, %root) : f32[2,4,16,16]",
                    "%s1 = aten::add(%s0, %am, %one) : f32[2,4,16,16]",
                )
                .replace(
                    "%s2 = aten::add(%s1, %am, %one) : f32[2,4,16,16]",
                    "%s2 = aten::div(%s1, %root) : f32[2,4,16,16]",
                )
                .replace("2.8284271247461903", divisor)
        };
        let g = Graph::parse(&codegen("2.8284271247461903")).unwrap();
        let a = &match_attention(&g)[0];
        assert!(a.scale_last && a.upcast && a.problem.causal);
        assert_eq!(
            a.form(),
            "explicit;div=2.8284271247461903;scale_last;mask=add;class=causal;static;upcast"
        );
        assert!((a.kernel_scale().unwrap() - 1.0 / 8f64.sqrt()).abs() < 1e-12);
        // A divisor past 64 would lift masked cells toward the visible ones: no match.
        let g = Graph::parse(&codegen("100.0")).unwrap();
        assert!(match_attention(&g).is_empty());
        // The usual order still reads as before.
        let g = Graph::parse(&gptj_block("bf16", " @causal/shape")).unwrap();
        assert!(!match_attention(&g)[0].scale_last);
    }

    #[test]
    fn gptjs_eager_attention_with_an_added_mask_and_casts_is_one_pattern() {
        for dt in ["bf16", "f32"] {
            let g = Graph::parse(&gptj_block(dt, " @causal/shape")).unwrap();
            let m = match_attention(&g);
            assert_eq!(m.len(), 1, "{dt}");
            let a = &m[0];
            let name = |v: ValueId| g.values[v].name.as_str();
            // The kernel reads q and k before the casts, in v's dtype.
            assert_eq!((name(a.q), name(a.k), name(a.v)), ("q0", "k0", "v"));
            assert!(a.upcast && a.problem.causal && !a.problem.padded, "{dt}");
            assert_eq!(a.problem.dtype, DType::parse(dt).unwrap());
            assert_eq!(
                a.form(),
                "explicit;div=2.8284271247461903;mask=add;class=causal;static;upcast"
            );
            let kinds: Vec<&str> = a.nodes.iter().map(|&n| g.nodes[n].kind.as_str()).collect();
            assert_eq!(
                kinds,
                [
                    "aten::to",
                    "aten::to",
                    "aten::transpose",
                    "aten::matmul",
                    "aten::div",
                    "aten::add",
                    "aten::softmax",
                    "aten::to",
                    "aten::dropout",
                    "aten::matmul"
                ]
            );
        }
        // A general or unknown mask, or one that widens the scores, is no match.
        for fact in [" @general/shape", ""] {
            assert!(
                match_attention(&Graph::parse(&gptj_block("bf16", fact)).unwrap()).is_empty(),
                "{fact}"
            );
        }
        let wide = gptj_block("bf16", " @causal/shape")
            .replace("%am: f32[2,1,16,16]", "%am: f32[2,4,32,16]");
        assert!(match_attention(&Graph::parse(&wide).unwrap()).is_empty());
        // Only q cast: no match (the kernel would not compute what the graph does).
        let one = gptj_block("bf16", " @causal/shape")
            .replace("aten::matmul(%q, %kt)", "aten::matmul(%q0, %kt)");
        assert!(match_attention(&Graph::parse(&one).unwrap()).is_empty());
        // A hand-written model's: no casts, a padding mask added (its value read from an input,
        // so other inputs pad otherwise: the padded kernel, classified per call).
        let g = Graph::parse(
            "graph(%q: f32[2,4,16,8], %k: f32[2,4,16,8], %v: f32[2,4,16,8], %am: f32[2,1,1,16] @padded):
               %m1 = prim::Constant[-1]()
               %m2 = prim::Constant[-2]()
               %one = prim::Constant[1]()
               %none = prim::Constant[None]()
               %c = prim::Constant[0.35355339059327373]()
               %kt = aten::transpose(%k, %m1, %m2) : f32[2,4,8,16]
               %s0 = aten::matmul(%q, %kt) : f32[2,4,16,16]
               %s1 = aten::mul(%s0, %c) : f32[2,4,16,16]
               %s2 = aten::add(%am, %s1, %one) : f32[2,4,16,16]
               %p = aten::softmax(%s2, %m1, %none) : f32[2,4,16,16]
               %o = aten::matmul(%p, %v) : f32[2,4,16,8]
               return (%o)",
        )
        .unwrap();
        let a = &match_attention(&g)[0];
        assert!(!a.upcast && a.problem.padded && !a.problem.causal);
        assert_eq!(
            a.form(),
            "explicit;mul=0.35355339059327373;mask=add;class=padded"
        );
    }
}
