//! GEMM rules: `gemm_<layout>[_bias]` and the batched `bmm_<layout>`, for the four layouts
//! rrr, rcr, crr and ccr (`GemmLayout`: how a and B lie, read from their strides).
//!
//! out[M,N] = a[M,K] · B (+ bias[N]), where
//! - B = w[N,K]ᵀ in `aten::linear(a, w, bias?)`;
//! - B = b[K,N] in `aten::mm(a, b)`, `aten::matmul(a, b)` with a 2-D b, or one whose leading dims
//!   are all 1 (broadcast over a's), and `aten::addmm(bias, a, b, beta=1, alpha=1)` with a 1-D
//!   bias;
//! - a's leading dims fold into M (a row-major a only: a column-major one has no single row
//!   stride once folded).
//!
//! bmm: out[L,M,N] = a[L,M,K] · b[L,K,N], as in `aten::bmm` and `aten::matmul` whose operands
//! carry the same batch dims (folded into L: `[B,H,M,K]·[B,H,K,N]` is L = B·H).
//!
//! An operand lies row-major (packed, `r`) or column-major (the transpose of a packed tensor,
//! `c`: what `x.t()`, `x.mT` or `x.transpose(-2, -1)` give), with any batch dims packed outside
//! its two matrix dims; linear's B is `c` when w is packed. An operand that lies neither way (a
//! slice, a permutation interleaving batch and matrix dims) takes the row-major layout and the
//! match says the op copies it (`GemmMatch::copies`). Other broadcasts are not matched.
//!
//! `GemmRule` offers every GEMM alone: the pattern of a GEMM whose epilogue (`epilogue.rs`) has no
//! kernel or lost a node to another pattern. A fused pattern may read a in place of a 2-D operand
//! that flattens it (`GemmMatch::operand_a`; the problem is the same GEMM).
//!
//! A GEMM whose only extent off the 16-byte vectors is N, where N comes from a weight the module
//! holds (GPT-2's lm_head: `linear(x, wte.weight)`, N = 50257; any nn.Linear with an odd
//! out_features), is matched padded (`WeightPad`): compose pads w[N,K] (and the bias) with zeros
//! to the next multiple of 16 bytes once, as a buffer of the composed module, an aligned kernel
//! computes the padded N, and the op returns the first N columns, a view whose rows lie the
//! padded N apart. Spelled `linear(x, w, bias?)`, `matmul(x, wᵀ)`, `mm(x, wᵀ)` or `addmm(bias, x, wᵀ)`
//! (wᵀ a transposing view of w); w and the bias must be plain module attributes (a `prim::GetAttr`
//! chain from the module) and every `view` of the output must keep its last dim (a view can merge
//! the leading dims of such rows, not split them); else the GEMM is matched as the graph has it.
//! An epilogue fuses at the graph's N (`epilogue.rs`): its leaves are the graph's width.

use super::epilogue::program::Epilogue;
use crate::graph::{is_packed, Const, Graph, NodeId, TensorInfo, ValueId};
use crate::rules::{boxed, Match, PatternKind, Rule};
use crate::types::DType;
use serde::{Deserialize, Serialize};

/// How the operands lie in memory, as three letters for a, B and out: `r` row-major (packed, the
/// last dim contiguous), `c` column-major (the transpose of a packed tensor: `x.t()`,
/// `x.transpose(-2, -1)`). The output is always written row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum GemmLayout {
    Rcr,
    Rrr,
    /// a column-major (`a.t() @ b`), B row-major.
    Crr,
    /// Both column-major (`a.t() @ b.t()`).
    Ccr,
}

impl GemmLayout {
    pub const ALL: [GemmLayout; 4] = [
        GemmLayout::Rrr,
        GemmLayout::Rcr,
        GemmLayout::Crr,
        GemmLayout::Ccr,
    ];

    pub fn short_name(self) -> &'static str {
        match self {
            GemmLayout::Rcr => "rcr",
            GemmLayout::Rrr => "rrr",
            GemmLayout::Crr => "crr",
            GemmLayout::Ccr => "ccr",
        }
    }
    /// The layout of operands lying as `a` and `b` say.
    pub fn of(a: Major, b: Major) -> GemmLayout {
        match (a, b) {
            (Major::Row, Major::Row) => GemmLayout::Rrr,
            (Major::Row, Major::Col) => GemmLayout::Rcr,
            (Major::Col, Major::Row) => GemmLayout::Crr,
            (Major::Col, Major::Col) => GemmLayout::Ccr,
        }
    }
    /// How torch's a[M,K] lies.
    pub fn a(self) -> Major {
        match self {
            GemmLayout::Rcr | GemmLayout::Rrr => Major::Row,
            GemmLayout::Crr | GemmLayout::Ccr => Major::Col,
        }
    }
    /// How torch's B[K,N] lies (`c` for linear's weight w[N,K], B = wᵀ).
    pub fn b(self) -> Major {
        match self {
            GemmLayout::Rrr | GemmLayout::Crr => Major::Row,
            GemmLayout::Rcr | GemmLayout::Ccr => Major::Col,
        }
    }
    /// CUTLASS layout of operand A in the transposed problem the templates compute (A = Bᵀ,
    /// [N,K]): a column-major B[K,N] is a row-major Bᵀ.
    pub fn cutlass_layout_a(self) -> &'static str {
        match self.b() {
            Major::Col => "cutlass::layout::RowMajor",
            Major::Row => "cutlass::layout::ColumnMajor",
        }
    }
    /// CUTLASS layout of operand B in the transposed problem (B = aᵀ, [K,M]).
    pub fn cutlass_layout_b(self) -> &'static str {
        match self.a() {
            Major::Row => "cutlass::layout::ColumnMajor",
            Major::Col => "cutlass::layout::RowMajor",
        }
    }
    pub fn parse(s: &str) -> Option<GemmLayout> {
        GemmLayout::ALL.into_iter().find(|l| l.short_name() == s)
    }
}

/// How a matrix operand lies in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Major {
    /// Packed row-major: the last dim is contiguous.
    Row,
    /// The transpose of a packed row-major tensor: the second-to-last dim is contiguous.
    Col,
}

impl Major {
    fn flip(self) -> Major {
        match self {
            Major::Row => Major::Col,
            Major::Col => Major::Row,
        }
    }
}

/// The aten op a match replaces; the custom op falls back to exactly this op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GemmOrigin {
    Linear,
    Mm,
    Bmm,
    Matmul,
    Addmm,
}

impl GemmOrigin {
    /// The origin of a node kind, if it is a GEMM the rules know.
    pub fn of_kind(kind: &str) -> Option<GemmOrigin> {
        match kind {
            "aten::linear" => Some(GemmOrigin::Linear),
            "aten::mm" => Some(GemmOrigin::Mm),
            "aten::bmm" => Some(GemmOrigin::Bmm),
            "aten::matmul" => Some(GemmOrigin::Matmul),
            "aten::addmm" => Some(GemmOrigin::Addmm),
            _ => None,
        }
    }
    pub fn aten_kind(self) -> &'static str {
        match self {
            GemmOrigin::Linear => "aten::linear",
            GemmOrigin::Mm => "aten::mm",
            GemmOrigin::Bmm => "aten::bmm",
            GemmOrigin::Matmul => "aten::matmul",
            GemmOrigin::Addmm => "aten::addmm",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            GemmOrigin::Linear => "linear",
            GemmOrigin::Mm => "mm",
            GemmOrigin::Bmm => "bmm",
            GemmOrigin::Matmul => "matmul",
            GemmOrigin::Addmm => "addmm",
        }
    }
}

/// The problem a GEMM kernel solves: what the pattern table keys on (with arch and precision).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GemmProblem {
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub layout: GemmLayout,
    pub dtype: DType,
    pub bias: bool,
    /// Independent GEMMs of the same shape (L); 1 for a plain GEMM.
    #[serde(default = "one")]
    pub batch: i64,
    /// Elementwise ops fused after the GEMM (and its bias), see `super::epilogue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epilogue: Option<Epilogue>,
    /// The graph's own N where compose pads the weight along N (`WeightPad`): `n` is then the
    /// padded extent the kernel computes. Such a problem has a rule id of its own (`_padn`) and
    /// the graph's shape as its key, because the baseline it is judged against is the unpadded
    /// GEMM the graph ran (unaligned in cuBLAS, far slower than the padded one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padded_from: Option<i64>,
}

fn one() -> i64 {
    1
}

/// `n` rounded up to whole 16-byte vectors of `dtype`: the N a padded weight gets (50257 is
/// 50264 in bf16 and fp16, 50260 in fp32).
pub fn padded_extent(n: i64, dtype: DType) -> i64 {
    let v = 16 / dtype.bytes() as i64;
    (n + v - 1) / v * v
}

impl GemmProblem {
    /// The widest alignment, in elements and at most `max`, that the contiguous dim of each operand
    /// and of the output divides (a row-major a reads K, a column-major one M; B reads N or K; the
    /// output N). Batch strides are multiples of these dims, so they follow. It picks the kernels
    /// that can run the problem (TMA rows need whole 16-byte vectors).
    pub fn alignment(&self, max: u32) -> u32 {
        let a = if self.layout.a() == Major::Row {
            self.k
        } else {
            self.m
        };
        let b = if self.layout.b() == Major::Row {
            self.n
        } else {
            self.k
        };
        let mut align = max.max(1);
        while align > 1 && [a, b, self.n].iter().any(|d| d % align as i64 != 0) {
            align /= 2;
        }
        align
    }
    /// The rule id: math and layouts, e.g. `gemm_rcr_bias`, `bmm_rrr`, and the epilogue's tag
    /// (`gemm_rcr_bias_ep_gelu_tanh_1a2b3c4d`).
    pub fn rule_id(&self) -> String {
        let kind = if self.batch > 1 { "bmm" } else { "gemm" };
        let ep = self
            .epilogue
            .as_ref()
            .map(|e| format!("_{}", e.tag()))
            .unwrap_or_default();
        format!(
            "{kind}_{}{}{}{ep}",
            self.layout.short_name(),
            if self.bias { "_bias" } else { "" },
            if self.padded_from.is_some() {
                "_padn"
            } else {
                ""
            }
        )
    }
    /// The same GEMM without its epilogue.
    pub fn plain(&self) -> GemmProblem {
        GemmProblem {
            epilogue: None,
            ..self.clone()
        }
    }
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }
    /// Fewest bytes moved: each operand read once, the output written once (and a full-size
    /// epilogue leaf, a residual, read once).
    pub fn bytes(&self) -> f64 {
        let e = self.dtype.bytes() as f64;
        let (m, n, k, l) = (
            self.m as f64,
            self.n as f64,
            self.k as f64,
            self.batch as f64,
        );
        let full = self.epilogue.as_ref().map_or(0, Epilogue::full_leaves) as f64;
        e * (l * (m * k + k * n + m * n * (1.0 + full)) + if self.bias { n } else { 0.0 })
    }
    /// The problem a rule id names at a shape: `dims` is M,N,K, or L,M,N,K for `bmm_*`; for
    /// `gemm_rcr[_bias]_padn` N is the graph's, padded to 16 bytes.
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<GemmProblem, String> {
        let unknown = || {
            format!("unknown rule '{rule}': use gemm_LAYOUT, gemm_LAYOUT_bias or bmm_LAYOUT, LAYOUT one of rrr, rcr, crr, ccr (gemm_rcr and gemm_rcr_bias also with _padn: N padded)")
        };
        let (rule, padn) = match rule.strip_suffix("_padn") {
            Some(r) => (r, true),
            None => (rule, false),
        };
        let (rest, batched) = match (rule.strip_prefix("gemm_"), rule.strip_prefix("bmm_")) {
            (Some(r), _) => (r, false),
            (None, Some(r)) => (r, true),
            _ => return Err(unknown()),
        };
        let want = if batched { 4 } else { 3 };
        if dims.len() != want {
            return Err(format!(
                "{rule} takes a shape of {want} dims ({})",
                if batched { "LxMxNxK" } else { "MxNxK" }
            ));
        }
        let (batch, m, n, k) = if batched {
            (dims[0], dims[1], dims[2], dims[3])
        } else {
            (1, dims[0], dims[1], dims[2])
        };
        let (layout, bias) = match rest.strip_suffix("_bias") {
            Some(l) => (l, true),
            None => (rest, false),
        };
        let layout = GemmLayout::parse(layout).ok_or_else(unknown)?;
        if batched && (bias || batch < 2) {
            return Err(format!(
                "{rule}: the batched rules take no bias and a batch of 2 or more"
            ));
        }
        if dims.iter().any(|&d| d <= 0) {
            return Err(format!("shape {dims:?}: every dim must be positive"));
        }
        let padded = padded_extent(n, dtype);
        if padn && (batched || layout != GemmLayout::Rcr || padded == n) {
            return Err(format!(
                "{rule}_padn: only gemm_rcr and gemm_rcr_bias pad N, and only an N off 16-byte vectors ({n} {dtype} is {})",
                if padded == n { "on them" } else { "off them" }
            ));
        }
        Ok(GemmProblem {
            m,
            n: if padn { padded } else { n },
            k,
            layout,
            dtype,
            bias,
            batch,
            epilogue: None,
            padded_from: padn.then_some(n),
        })
    }

    /// `MxNxK`, or `LxMxNxK` when batched; a padded problem's N is the graph's.
    pub fn shape_key(&self) -> String {
        let n = self.padded_from.unwrap_or(self.n);
        if self.batch > 1 {
            format!("{}x{}x{}x{}", self.batch, self.m, n, self.k)
        } else {
            format!("{}x{}x{}", self.m, n, self.k)
        }
    }
}

/// The elementwise ops fused after a GEMM match (`GemmMatch::epilogue`), as the epilogue rule
/// (`epilogue/`) finds them.
#[derive(Clone, Debug, PartialEq)]
pub struct EpilogueMatch {
    pub epilogue: Epilogue,
    /// The pattern's nodes besides the GEMM, in program order: its elementwise ops, the
    /// transparent nodes between them, and the transparent nodes its leaves and its a are read
    /// through that nothing else reads.
    pub nodes: Vec<NodeId>,
    /// The leaf tensors, in `epilogue.leaves` order.
    pub leaves: Vec<ValueId>,
    /// The value the pattern produces (the last node's output).
    pub output: ValueId,
    /// The tensor the op reads as a in place of the GEMM's own operand, which flattens it: the
    /// op's output, a.shape[:-1] + [N], then has its leading dims, as `output` does.
    pub a: Option<ValueId>,
    /// The pattern turned (see the module doc): output dim i is dim `order[i]` of the GEMM's
    /// output; every leaf lies in this order.
    pub order: Option<Vec<usize>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GemmMatch {
    pub node: NodeId,
    pub origin: GemmOrigin,
    pub a: ValueId,
    pub b: ValueId,
    pub bias: Option<ValueId>,
    pub problem: GemmProblem,
    /// The fused elementwise ops after the GEMM (`problem.epilogue` is their program).
    pub epilogue: Option<EpilogueMatch>,
    /// The operands whose strides fit no layout, each with why: the op copies them on every call.
    pub copies: Vec<String>,
    /// Where the weight can be padded along N: applied to the GEMM alone (`problem.padded_from`
    /// set, `padded`); a fused match keeps the graph's N (its leaves are the graph's width) and
    /// pads again should compose fall back to the GEMM alone (`plain`).
    pub pad: Option<WeightPad>,
}

/// A weight (and its bias) that compose pads with zeros along N, once, as buffers of the composed
/// module (the module's own tensors stay, for the fallback and for whatever else reads them:
/// GPT-2's lm_head shares its weight with the token embedding).
#[derive(Clone, Debug, PartialEq)]
pub struct WeightPad {
    /// w[N, K], packed, as the graph reads it from the module.
    pub weight: ValueId,
    /// The bias [N], a module attribute too.
    pub bias: Option<ValueId>,
    /// The transposing view that makes wᵀ the GEMM's B (`x @ w.t()`), where the GEMM alone
    /// reads it: the rewrite removes it with the GEMM.
    pub view: Option<NodeId>,
    /// N as the graph has it, and padded.
    pub from: i64,
    pub to: i64,
}

impl WeightPad {
    /// What the plan says of it.
    pub fn describe(&self) -> String {
        format!(
            "n {} → {}: the weight{} padded with zeros once, in the composed module; the aligned kernel computes {} columns and the op returns the first {} (a view, rows {} apart); torch's baseline is the unpadded GEMM the graph runs",
            self.from,
            self.to,
            if self.bias.is_some() { " and bias" } else { "" },
            self.to,
            self.from,
            self.to
        )
    }
}

impl GemmMatch {
    /// The match of the GEMM node alone: what compose falls back to when the fused pattern
    /// has no kernel.
    pub fn plain(&self) -> GemmMatch {
        GemmMatch {
            epilogue: None,
            problem: self.problem.plain(),
            ..self.clone()
        }
        .padded()
    }
    /// The match with its weight's padding applied (`pad`), where it has one.
    pub fn padded(mut self) -> GemmMatch {
        if let Some(pad) = &self.pad {
            self.problem.padded_from = Some(pad.from);
            self.problem.n = pad.to;
        }
        self
    }
    /// The match at the graph's N (its padding not applied).
    pub fn unpadded(mut self) -> GemmMatch {
        if let Some(from) = self.problem.padded_from.take() {
            self.problem.n = from;
        }
        self
    }
    /// The padding this match applies: `pad` where the problem is padded.
    pub fn applied_pad(&self) -> Option<&WeightPad> {
        self.pad
            .as_ref()
            .filter(|_| self.problem.padded_from.is_some())
    }
    /// The tensor the op reads as a: the GEMM's own operand, or the tensor it flattens where the
    /// fused pattern reads that instead (`EpilogueMatch::a`).
    pub fn operand_a(&self) -> ValueId {
        self.epilogue.as_ref().and_then(|e| e.a).unwrap_or(self.a)
    }
    /// The graph nodes the pattern replaces: the GEMM and its epilogue's nodes.
    pub fn nodes(&self) -> Vec<NodeId> {
        let mut v = vec![self.node];
        v.extend(self.epilogue.iter().flat_map(|e| e.nodes.iter().copied()));
        v
    }
}

impl Match for GemmMatch {
    fn nodes(&self) -> Vec<NodeId> {
        GemmMatch::nodes(self)
    }
}

/// The GEMM rule: each GEMM node alone.
pub struct GemmRule;

impl Rule for GemmRule {
    fn name(&self) -> &'static str {
        "gemm"
    }
    fn kind(&self) -> PatternKind {
        crate::kinds::gemm::GEMM
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_gemms(g))
    }
}

/// Every GEMM in the top-level block whose shapes and dtypes are known and supported, padded
/// where its weight can be (`WeightPad`).
pub fn match_gemms(g: &Graph) -> Vec<GemmMatch> {
    let readers = g.readers();
    g.nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.depth == 0)
        .filter_map(|(i, _)| match_node(g, i))
        .map(|mut m| {
            m.pad = weight_pad(g, &readers, &m);
            m.padded()
        })
        .collect()
}

/// Views that transpose a 2-D weight (`w.t()`, `w.T`, `w.transpose(0, 1)`, `w.permute(1, 0)`,
/// `w.mT`); shapes and strides say the rest.
const TRANSPOSES: [&str; 5] = [
    "aten::t",
    "aten::numpy_T",
    "aten::transpose",
    "aten::permute",
    "aten::mT",
];

/// Whether a tensor whose rows lie further apart than its last dim (a padded output, narrowed)
/// can stand for `v`: every `view` of it (`view`, `_unsafe_view`, `view_as`, `unflatten`),
/// directly or through views that keep its strides (`alias`, `detach`) or other views that keep
/// the last dim, keeps the last dim. Ops that compute read any strides; `reshape`, `flatten` and
/// `contiguous` copy where they must; a view behind a view that moves or cuts dims (transpose,
/// slice, split, ...) is refused, not reasoned about.
fn takes_row_stride(g: &Graph, readers: &[Vec<NodeId>], v: ValueId) -> bool {
    const RESHAPES: [&str; 4] = [
        "aten::view",
        "aten::_unsafe_view",
        "aten::view_as",
        "aten::unflatten",
    ];
    const SAME: [&str; 2] = ["aten::alias", "aten::detach"];
    const MOVES: [&str; 20] = [
        "aten::t",
        "aten::numpy_T",
        "aten::transpose",
        "aten::permute",
        "aten::mT",
        "aten::movedim",
        "aten::swapaxes",
        "aten::swapdims",
        "aten::slice",
        "aten::select",
        "aten::narrow",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::expand",
        "aten::expand_as",
        "aten::as_strided",
        "aten::split",
        "aten::chunk",
        "aten::unbind",
        "prim::ListUnpack",
    ];
    let last = |x: ValueId| g.tensor(x).and_then(|t| t.shape.last().copied());
    let mut stack = vec![(v, false)];
    while let Some((v, behind)) = stack.pop() {
        for &r in &readers[v] {
            let n = &g.nodes[r];
            let kind = n.kind.as_str();
            if n.inputs.first() != Some(&v) {
                continue; // it reads v otherwise (view_as's sizes): no view of v
            }
            let moved = if RESHAPES.contains(&kind) {
                let out = *n.outputs.first().unwrap_or(&v);
                if behind || last(v).is_none() || last(v) != last(out) {
                    return false;
                }
                false
            } else if SAME.contains(&kind) {
                behind
            } else if MOVES.contains(&kind) || kind.starts_with("aten::split") {
                true
            } else {
                continue;
            };
            stack.extend(n.outputs.iter().map(|&o| (o, moved)));
        }
    }
    true
}

/// The padding of a GEMM's weight along N, where the module docs say it applies.
fn weight_pad(g: &Graph, readers: &[Vec<NodeId>], m: &GemmMatch) -> Option<WeightPad> {
    let p = &m.problem;
    let vector = 16 / p.dtype.bytes() as i64;
    if p.batch != 1 || p.layout != GemmLayout::Rcr || p.k % vector != 0 || p.n % vector == 0 {
        return None;
    }
    let (weight, view) = match m.origin {
        GemmOrigin::Linear => (m.b, None),
        GemmOrigin::Matmul | GemmOrigin::Mm | GemmOrigin::Addmm => {
            let t = g.values[m.b].producer?;
            let n = &g.nodes[t];
            if !TRANSPOSES.contains(&n.kind.as_str()) {
                return None;
            }
            (n.inputs[0], (readers[m.b] == [m.node]).then_some(t))
        }
        GemmOrigin::Bmm => return None,
    };
    let w = g.tensor(weight)?;
    if w.shape != [p.n, p.k] || major(w) != Some(Major::Row) || !g.is_attribute(weight) {
        return None;
    }
    if m.bias.is_some_and(|b| !g.is_attribute(b)) {
        return None;
    }
    if !takes_row_stride(g, readers, *g.nodes[m.node].outputs.first()?) {
        return None;
    }
    Some(WeightPad {
        weight,
        bias: m.bias,
        view,
        from: p.n,
        to: padded_extent(p.n, p.dtype),
    })
}

/// How the matrix dims of `t` lie, with its leading dims packed outside them: `Row` for a packed
/// tensor, `Col` for one whose last two dims are swapped from packed; None otherwise. Dims of size
/// one lie either way (as torch's `is_contiguous` treats them), and row-major is preferred.
pub fn major(t: &TensorInfo) -> Option<Major> {
    let n = t.shape.len();
    if n < 2 {
        return None;
    }
    if t.is_packed() {
        return Some(Major::Row);
    }
    let (mut shape, mut st) = (t.shape.clone(), t.strides());
    shape.swap(n - 2, n - 1);
    st.swap(n - 2, n - 1);
    is_packed(&shape, &st).then_some(Major::Col)
}

fn lead(t: &TensorInfo) -> i64 {
    t.shape[..t.shape.len() - 2].iter().product()
}

/// The smallest K a GEMM pattern takes: one tensor-core step (8 for tf32, half of bf16's 16).
/// Below it the product is an outer product or close to one (a rotary embedding's
/// `inv_freq[:, None] @ positions[None, :]`, K = 1): it only writes its output, as torch's
/// kernel does, so a sweep would compile kernels that cannot win.
pub const MIN_K: i64 = 8;

fn match_node(g: &Graph, id: NodeId) -> Option<GemmMatch> {
    let n = &g.nodes[id];
    let origin = GemmOrigin::of_kind(&n.kind)?;
    let (a, b, bias) = match origin {
        GemmOrigin::Linear => {
            let bias = n.inputs[2];
            let bias = if matches!(g.constant(bias), Some(Const::None)) {
                None
            } else {
                Some(bias)
            };
            (n.inputs[0], n.inputs[1], bias)
        }
        GemmOrigin::Mm | GemmOrigin::Bmm | GemmOrigin::Matmul => (n.inputs[0], n.inputs[1], None),
        GemmOrigin::Addmm => {
            let one = |v: ValueId| g.constant(v).and_then(Const::as_f64) == Some(1.0);
            if !one(n.inputs[3]) || !one(n.inputs[4]) {
                return None;
            }
            (n.inputs[1], n.inputs[2], Some(n.inputs[0]))
        }
    };
    let ta = g.tensor(a)?;
    let tb = g.tensor(b)?;
    let dtype = DType::parse(&ta.dtype)?;
    let (ra, rb) = (ta.shape.len(), tb.shape.len());
    if tb.dtype != ta.dtype || ra < 2 || rb < 2 {
        return None;
    }
    // A b whose leading dims are all 1 broadcasts over a's: the GEMM folds a's into M as with a
    // 2-D b ([B,M,K]·[1,K,N]).
    let folds = rb == 2 || (origin == GemmOrigin::Matmul && ra >= rb && lead(tb) == 1);
    if !folds {
        // Batched: only bmm and matmul, with identical batch dims on both sides.
        if !matches!(origin, GemmOrigin::Bmm | GemmOrigin::Matmul)
            || ra != rb
            || ta.shape[..ra - 2] != tb.shape[..rb - 2]
        {
            return None;
        }
    } else if matches!(origin, GemmOrigin::Mm | GemmOrigin::Bmm) && ra != 2 {
        return None;
    }
    let k = ta.shape[ra - 1];
    let (kb, nn) = match origin {
        GemmOrigin::Linear => (tb.shape[1], tb.shape[0]),
        _ => (tb.shape[rb - 2], tb.shape[rb - 1]),
    };
    if kb != k {
        return None;
    }
    if let Some(bias) = bias {
        let tbias = g.tensor(bias)?;
        if !folds || tbias.shape != [nn] || tbias.dtype != ta.dtype {
            return None;
        }
    }
    let (batch, m) = if folds {
        (1, ta.shape[..ra - 1].iter().product())
    } else {
        (lead(ta), ta.shape[ra - 2])
    };
    if batch == 0 || m == 0 || nn == 0 || k < MIN_K {
        return None;
    }
    let mut copies = Vec::new();
    let mut lie = |name: &str, t: &TensorInfo, found: Option<Major>, copy_as: Major, why: &str| {
        found.unwrap_or_else(|| {
            copies.push(format!(
                "{name} {}{:?} with strides {:?} fits no layout{why}: the op copies it before each call",
                t.dtype,
                t.shape,
                t.strides()
            ));
            copy_as
        })
    };
    // Folded into M, a column-major a would need a stride per leading dim.
    let a_major = match major(ta) {
        Some(Major::Col) if folds && lead(ta) > 1 => None,
        found => found,
    };
    let why_a = if folds && ra > 2 {
        " (its leading dims fold into M only when it is row-major)"
    } else {
        ""
    };
    let a_major = lie("a", ta, a_major, Major::Row, why_a);
    // linear's B is wᵀ: a packed w is a column-major B.
    let (b_major, b_copy) = match origin {
        GemmOrigin::Linear => (major(tb).map(Major::flip), Major::Col),
        _ => (major(tb), Major::Row),
    };
    let b_major = lie("b", tb, b_major, b_copy, "");
    let layout = GemmLayout::of(a_major, b_major);
    Some(GemmMatch {
        node: id,
        origin,
        a,
        b,
        bias,
        problem: GemmProblem {
            m,
            n: nn,
            k,
            layout,
            dtype,
            bias: bias.is_some(),
            batch,
            epilogue: None,
            padded_from: None,
        },
        epilogue: None,
        copies,
        pad: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Vec<GemmMatch> {
        match_gemms(&Graph::parse(text).unwrap())
    }

    #[test]
    fn an_outer_product_is_no_gemm_pattern() {
        // A rotary embedding's frequencies: inv_freq [1, 64, 1] @ positions [1, 1, 1024], K = 1.
        let g = Graph::parse(
            "graph(%f: f32[1,64,1], %p: f32[1,1,1024]):
               %y = aten::matmul(%f, %p) : f32[1,64,1024]
               return (%y)",
        )
        .unwrap();
        assert!(match_gemms(&g).is_empty());
        let why = crate::kinds::Kind::unmatched(&crate::kinds::gemm::Gemm, &g, &Default::default());
        assert_eq!(why.len(), 1);
        assert!(
            why[0]
                .1
                .starts_with("K = 1, below one tensor-core step (8)"),
            "{}",
            why[0].1
        );
        // K = 8 is one.
        assert_eq!(
            one("graph(%f: f32[64,8], %p: f32[8,1024]):
                   %y = aten::mm(%f, %p) : f32[64,1024]
                   return (%y)")
            .len(),
            1
        );
    }

    #[test]
    fn linear_with_bias_folds_leading_dims_into_m() {
        let m = one(
            "graph(%self: M, %x: f32[4,5,16], %w: f32[32,16], %b: f32[32]):
               %y = aten::linear(%x, %w, %b) : f32[4,5,32]
               return (%y)",
        );
        assert_eq!(m.len(), 1);
        let p = &m[0].problem;
        assert_eq!(
            (p.m, p.n, p.k, p.layout, p.bias),
            (20, 32, 16, GemmLayout::Rcr, true)
        );
        assert_eq!(p.rule_id(), "gemm_rcr_bias");
    }

    #[test]
    fn linear_without_bias_is_plain_rcr() {
        let m = one("graph(%x: bf16[8,16], %w: bf16[32,16]):
               %none = prim::Constant[None]()
               %y = aten::linear(%x, %w, %none) : bf16[8,32]
               return (%y)");
        assert_eq!(m[0].problem.rule_id(), "gemm_rcr");
        assert_eq!(m[0].problem.dtype, DType::Bf16);
        assert_eq!(m[0].bias, None);
    }

    #[test]
    fn mm_and_2d_matmul_are_rrr() {
        let m = one("graph(%a: f32[64,128], %b: f32[128,32]):
               %c = aten::mm(%a, %b) : f32[64,32]
               %d = aten::matmul(%c, %c2) : f32[64,32]
               return (%d)"
            .replace("%c2", "%b2")
            .replace(
                "graph(%a: f32[64,128], %b: f32[128,32])",
                "graph(%a: f32[64,128], %b: f32[128,32], %b2: f32[32,32])",
            )
            .as_str());
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].origin, m[0].problem.shape_key()),
            (GemmOrigin::Mm, "64x32x128".to_string())
        );
        assert_eq!(
            (m[1].origin, m[1].problem.layout),
            (GemmOrigin::Matmul, GemmLayout::Rrr)
        );
    }

    #[test]
    fn addmm_matches_only_unit_scales_and_vector_bias() {
        let text = |beta: &str, bias: &str| {
            format!(
                "graph(%bias: f32[{bias}], %a: f32[8,16], %b: f32[16,32]):
                   %one = prim::Constant[1]()
                   %beta = prim::Constant[{beta}]()
                   %y = aten::addmm(%bias, %a, %b, %beta, %one) : f32[8,32]
                   return (%y)"
            )
        };
        let m = one(&text("1", "32"));
        assert_eq!(m[0].problem.rule_id(), "gemm_rrr_bias");
        assert!(
            one(&text("0.5", "32")).is_empty(),
            "beta != 1 is not a plain bias"
        );
        assert!(one(&text("1", "8,32")).is_empty(), "a 2-D C is not a bias");
    }

    #[test]
    fn rule_ids_round_trip_through_problems() {
        for rule in ["gemm_rcr", "gemm_rcr_bias", "gemm_rrr", "gemm_rrr_bias"] {
            assert_eq!(
                GemmProblem::from_rule(rule, &[8, 16, 32], DType::F32)
                    .unwrap()
                    .rule_id(),
                rule
            );
        }
        let b = GemmProblem::from_rule("bmm_rrr", &[128, 512, 2048, 1024], DType::F32).unwrap();
        assert_eq!(
            (b.rule_id(), b.shape_key(), b.batch),
            ("bmm_rrr".to_string(), "128x512x2048x1024".to_string(), 128)
        );
        assert!(GemmProblem::from_rule("bmm_rrr", &[8, 16, 32], DType::F32)
            .unwrap_err()
            .contains("LxMxNxK"));
        assert!(GemmProblem::from_rule("conv_rrr", &[8, 16, 32], DType::F32)
            .unwrap_err()
            .contains("use gemm_LAYOUT"));
        assert!(GemmProblem::from_rule("gemm_rcr", &[0, 16, 32], DType::F32).is_err());
    }

    #[test]
    fn bmm_and_batched_matmul_fold_batch_dims() {
        let m = one(
            "graph(%a: f32[128,512,1024], %b: f32[128,1024,2048], %c: f32[2,3,8,16], %d: f32[2,3,16,4]):
               %y = aten::bmm(%a, %b) : f32[128,512,2048]
               %z = aten::matmul(%c, %d) : f32[2,3,8,4]
               return (%y, %z)",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(
            (
                m[0].origin,
                m[0].problem.rule_id(),
                m[0].problem.shape_key()
            ),
            (
                GemmOrigin::Bmm,
                "bmm_rrr".into(),
                "128x512x2048x1024".into()
            )
        );
        assert_eq!(
            (
                m[1].problem.batch,
                m[1].problem.m,
                m[1].problem.n,
                m[1].problem.k
            ),
            (6, 8, 4, 16)
        );
    }

    #[test]
    fn unknown_and_unsupported_operands_do_not_match() {
        assert!(one("graph(%a, %b: f32[16,4]):
               %y = aten::mm(%a, %b)
               return (%y)")
        .is_empty());
        assert!(one("graph(%a: f64[8,16], %b: f64[16,4]):
               %y = aten::mm(%a, %b) : f64[8,4]
               return (%y)")
        .is_empty());
    }

    /// `a.t() @ b`, `a @ b.t()`, `a.t() @ b.t()` and plain `a @ b`: the operands' strides say
    /// which (a transposed view of a packed [2048,4096] has strides [1,4096]).
    #[test]
    fn transposed_views_are_layouts_read_from_their_strides() {
        let g = |a: &str, b: &str| {
            one(&format!(
                "graph(%a: {a}, %b: {b}):
                   %c = aten::matmul(%a, %b) : f32[4096,4096]
                   return (%c)"
            ))
        };
        let (col_a, row_a) = ("f32[4096,2048]{1,4096}", "f32[4096,2048]");
        let (col_b, row_b) = ("f32[2048,4096]{1,2048}", "f32[2048,4096]");
        for (a, b, rule) in [
            (row_a, row_b, "gemm_rrr"),
            (row_a, col_b, "gemm_rcr"),
            (col_a, row_b, "gemm_crr"),
            (col_a, col_b, "gemm_ccr"),
        ] {
            let m = g(a, b);
            assert_eq!(m.len(), 1);
            let p = &m[0].problem;
            assert_eq!(
                (p.rule_id().as_str(), p.m, p.n, p.k),
                (rule, 4096, 4096, 2048)
            );
            assert!(m[0].copies.is_empty(), "{rule}: {:?}", m[0].copies);
        }
        // linear's B is wᵀ: a packed w is column-major, a transposed one row-major.
        let linear = |w: &str| {
            one(&format!(
                "graph(%x: f32[64,32], %v: f32[32,16]):
                   %none = prim::Constant[None]()
                   %w = aten::t(%v) : {w}
                   %y = aten::linear(%x, %w, %none) : f32[64,16]
                   return (%y)"
            ))[0]
                .problem
                .layout
        };
        assert_eq!(linear("f32[16,32]"), GemmLayout::Rcr);
        assert_eq!(linear("f32[16,32]{1,16}"), GemmLayout::Rrr);
    }

    #[test]
    fn batched_layouts_need_packed_batch_dims() {
        let m = one("graph(%x: f32[4,64,32], %y: f32[4,64,16]):
               %a = aten::transpose(%x) : f32[4,32,64]{2048,1,32}
               %c = aten::bmm(%a, %y) : f32[4,32,16]
               return (%c)");
        assert_eq!(
            (m[0].problem.rule_id().as_str(), m[0].problem.batch),
            ("bmm_crr", 4)
        );
        // [B,H,M,K]·[B,H,K,N] with kᵀ from permute(0, 1, 3, 2): L = B·H, B column-major.
        let m = one("graph(%q: f32[2,8,128,64], %k: f32[2,8,128,64]):
               %kt = aten::permute(%k) : f32[2,8,64,128]{65536,8192,1,64}
               %s = aten::matmul(%q, %kt) : f32[2,8,128,128]
               return (%s)");
        assert_eq!(
            (
                m[0].problem.rule_id().as_str(),
                m[0].problem.shape_key().as_str()
            ),
            ("bmm_rcr", "16x128x128x64")
        );
        assert!(m[0].copies.is_empty());
        // Heads split from a [B,S,H,D] tensor: batch dims interleave with the matrix dims, no
        // layout fits and the match says the op copies the operand.
        let m = one("graph(%q: f32[2,128,8,64], %k: f32[2,8,64,128]):
               %qh = aten::permute(%q) : f32[2,8,128,64]{65536,64,512,1}
               %s = aten::matmul(%qh, %k) : f32[2,8,128,128]
               return (%s)");
        assert_eq!(m[0].problem.rule_id(), "bmm_rrr");
        assert_eq!(m[0].copies.len(), 1);
        assert!(
            m[0].copies[0].starts_with(
                "a f32[2, 8, 128, 64] with strides [65536, 64, 512, 1] fits no layout"
            ),
            "{}",
            m[0].copies[0]
        );
    }

    #[test]
    fn broadcast_b_folds_batch_dims_into_m() {
        // [B,M,K]·[K,N] and [B,M,K]·[1,K,N]: M = B·M, whatever b's layout.
        for b in ["f32[16,4]", "f32[1,16,4]", "f32[1,16,4]{64,1,16}"] {
            let m = one(&format!(
                "graph(%a: f32[2,8,16], %b: {b}):
                   %y = aten::matmul(%a, %b) : f32[2,8,4]
                   return (%y)"
            ));
            assert_eq!(m.len(), 1, "{b}");
            let p = &m[0].problem;
            assert_eq!((p.batch, p.m, p.n, p.k), (1, 16, 4, 16), "{b}");
            let want = if b.contains('{') {
                "gemm_rcr"
            } else {
                "gemm_rrr"
            };
            assert_eq!(p.rule_id(), want);
        }
        // A column-major a cannot fold its batch into M: copied, and the plan says why.
        let m = one("graph(%a: f32[2,8,16]{128,1,8}, %b: f32[16,4]):
               %y = aten::matmul(%a, %b) : f32[2,8,4]
               return (%y)");
        assert_eq!(m[0].problem.rule_id(), "gemm_rrr");
        assert!(
            m[0].copies[0].contains("leading dims fold into M only when it is row-major"),
            "{:?}",
            m[0].copies
        );
        // ... unless its leading dims are all 1.
        let m = one("graph(%a: f32[1,8,16]{128,1,8}, %b: f32[16,4]):
               %y = aten::matmul(%a, %b) : f32[1,8,4]
               return (%y)");
        assert_eq!(
            (m[0].problem.rule_id().as_str(), m[0].copies.len()),
            ("gemm_crr", 0)
        );
        // Other broadcasts (a broadcast over b's batch, mixed batch dims) are not matched.
        for (a, b) in [
            ("f32[8,16]", "f32[1,16,4]"),
            ("f32[2,8,16]", "f32[2,1,16,4]"),
            ("f32[2,3,8,16]", "f32[3,16,4]"),
        ] {
            assert!(
                one(&format!(
                    "graph(%a: {a}, %b: {b}):
                   %y = aten::matmul(%a, %b)
                   return (%y)"
                ))
                .is_empty(),
                "{a} {b}"
            );
        }
    }

    /// GPT-2's lm_head as torch.jit.trace writes it (transformers 5.17, B 8, T 1024): the logits
    /// linear reads the token embedding's weight, tied to it, through the module's attributes.
    /// `linear` is the GEMM's line (`%weight` is the module's weight), `more` the lines after it.
    fn lm_head(dtype: &str, k: i64, linear: &str, more: &str) -> String {
        lm_head_after("", dtype, k, linear, more)
    }

    /// The same with `before` lines ahead of the GEMM.
    fn lm_head_after(before: &str, dtype: &str, k: i64, linear: &str, more: &str) -> String {
        format!(
            "graph(%self.1: __torch__.Wrapper, %h: {dtype}[8,1024,{k}], %b: {dtype}[50257]):
               %m = prim::GetAttr[name=\"m\"](%self.1) : __torch__.GPT2LMHeadModel
               %transformer = prim::GetAttr[name=\"transformer\"](%m) : __torch__.GPT2Model
               %wte = prim::GetAttr[name=\"wte\"](%transformer) : __torch__.Embedding
               %weight = prim::GetAttr[name=\"weight\"](%wte) : {dtype}[50257,{k}]
               %none = prim::Constant[None]()
               {before}
               {linear} : {dtype}[8,1024,50257]
               {more}
               return (%logits)"
        )
    }

    const LINEAR: &str = "%logits = aten::linear(%h, %weight, %none)";

    #[test]
    fn an_odd_n_from_a_module_weight_is_padded_to_16_bytes() {
        let g = Graph::parse(&lm_head("bf16", 768, LINEAR, "")).unwrap();
        let m = &match_gemms(&g)[0];
        let p = &m.problem;
        assert_eq!(
            (p.m, p.n, p.k, p.padded_from),
            (8192, 50264, 768, Some(50257))
        );
        assert_eq!(
            p.alignment(8),
            8,
            "an ordinary aligned GEMM for the kernels"
        );
        assert_eq!(
            (p.rule_id().as_str(), p.shape_key().as_str()),
            ("gemm_rcr_padn", "8192x50257x768"),
            "its own key, at the graph's shape"
        );
        let pad = m.pad.as_ref().unwrap();
        assert_eq!(g.values[pad.weight].name, "weight");
        assert_eq!(
            (pad.bias, pad.view, pad.from, pad.to),
            (None, None, 50257, 50264)
        );
        assert!(pad
            .describe()
            .starts_with("n 50257 → 50264: the weight padded"));
        // fp32: 16 bytes are four elements.
        let g = Graph::parse(&lm_head("f32", 768, LINEAR, "")).unwrap();
        assert_eq!(match_gemms(&g)[0].problem.n, 50260);
        // The rule id names the same problem.
        let from =
            GemmProblem::from_rule("gemm_rcr_padn", &[8192, 50257, 768], DType::Bf16).unwrap();
        assert_eq!(&from, p);
        assert!(
            GemmProblem::from_rule("gemm_rcr_padn", &[8192, 50264, 768], DType::Bf16)
                .unwrap_err()
                .contains("only an N off 16-byte vectors")
        );
        assert!(GemmProblem::from_rule("gemm_rrr_padn", &[8192, 50257, 768], DType::Bf16).is_err());
    }

    #[test]
    fn matmul_and_addmm_with_the_weight_transposed_pad_too_with_a_bias() {
        // x @ w.t() (the view goes with the GEMM) and addmm(bias, x, w.t()) with a module bias.
        let g = Graph::parse(
            "graph(%self: M, %x: f16[64,512]):
               %fc = prim::GetAttr[name=\"fc\"](%self) : Linear
               %w = prim::GetAttr[name=\"weight\"](%fc) : f16[1001,512]
               %b = prim::GetAttr[name=\"bias\"](%fc) : f16[1001]
               %one = prim::Constant[1]()
               %wt = aten::t(%w) : f16[512,1001]{1,512}
               %y = aten::matmul(%x, %wt) : f16[64,1001]
               %wt2 = aten::numpy_T(%w) : f16[512,1001]{1,512}
               %z = aten::addmm(%b, %x, %wt2, %one, %one) : f16[64,1001]
               %u = aten::add(%wt2, %wt2) : f16[512,1001]
               return (%y, %z, %u)",
        )
        .unwrap();
        let m = match_gemms(&g);
        let (mm, addmm) = (&m[0], &m[1]);
        assert_eq!(
            (mm.problem.rule_id().as_str(), mm.problem.n),
            ("gemm_rcr_padn", 1008)
        );
        let pad = mm.pad.as_ref().unwrap();
        assert_eq!(
            (g.values[pad.weight].name.as_str(), pad.view),
            ("w", Some(4))
        );
        assert_eq!(addmm.problem.rule_id(), "gemm_rcr_bias_padn");
        let pad = addmm.pad.as_ref().unwrap();
        assert_eq!(pad.bias, Some(addmm.bias.unwrap()));
        assert_eq!(
            pad.view, None,
            "the add reads the second view too: it stays"
        );
        assert!(pad.describe().contains("the weight and bias padded"));
    }

    #[test]
    fn a_weight_padding_would_not_fit_is_left_as_the_graph_has_it() {
        let plain = |text: &str| {
            let g = Graph::parse(text).unwrap();
            let m = match_gemms(&g).remove(0);
            assert_eq!(m.problem.padded_from, None, "{text}");
            assert_eq!(m.problem.n % 8, 1, "{text}");
            assert!(m.pad.is_none());
        };
        // A weight the graph computes is no module attribute.
        plain(&lm_head_after(
            "%w = aten::mul(%weight, %weight) : bf16[50257,768]",
            "bf16",
            768,
            "%logits = aten::linear(%h, %w, %none)",
            "",
        ));
        // A bias from the inputs.
        plain(&lm_head(
            "bf16",
            768,
            "%logits = aten::linear(%h, %weight, %b)",
            "",
        ));
        // K off the vectors too: padding the weight alone would not align a's rows.
        plain(&lm_head("bf16", 770, LINEAR, ""));
        // A view that splits the rows cannot take rows 50264 apart.
        plain(&lm_head(
            "bf16",
            768,
            LINEAR,
            "%v = aten::view(%logits) : bf16[8,1024,7,7179]",
        ));
        // Nor one behind another view.
        plain(&lm_head(
            "bf16",
            768,
            LINEAR,
            "%t = aten::transpose(%logits) : bf16[8,50257,1024]{51463168,1,50257}
             %v = aten::view(%t) : bf16[8,50257,1024]",
        ));
        // Nor an unflatten of the last dim, nor a view of one split of it.
        plain(&lm_head(
            "bf16",
            768,
            LINEAR,
            "%u = aten::unflatten(%logits) : bf16[8,1024,7,7179]",
        ));
        plain(&lm_head(
            "bf16",
            768,
            LINEAR,
            "%parts = aten::split(%logits) : Tensor[]
             %p0, %p1 = prim::ListUnpack(%parts) : bf16[8,1024,25000], bf16[8,1024,25257]
             %v = aten::view(%p1) : bf16[8192,25257]",
        ));
        // A view that merges the leading dims is fine, through a detach too, and so is a view_as
        // of the same shape (which also reads the logits' sizes: no view of them there).
        let text = lm_head(
            "bf16",
            768,
            LINEAR,
            "%d = aten::detach(%logits) : bf16[8,1024,50257]
             %v = aten::view(%d) : bf16[8192,50257]
             %w = aten::view_as(%d, %logits) : bf16[8,1024,50257]",
        );
        let m = &match_gemms(&Graph::parse(&text).unwrap())[0];
        assert_eq!(m.problem.padded_from, Some(50257));
    }

    /// An epilogue fuses on the GEMM as the graph has it (its leaves are the graph's width): the
    /// cover weighs that against the padded GEMM alone, and the fused match pads again when it
    /// falls back to the GEMM alone.
    #[test]
    fn a_gemm_with_an_epilogue_fuses_it_unpadded_and_pads_alone() {
        let text = lm_head(
            "bf16",
            768,
            LINEAR,
            "%y = aten::tanh(%logits) : bf16[8,1024,50257]",
        )
        .replace("return (%logits)", "return (%y)");
        let g = Graph::parse(&text).unwrap();
        let found = crate::kinds::match_kinds(&g, &[&crate::kinds::gemm::Gemm]);
        assert_eq!(found.of::<GemmMatch>().len(), 1);
        let fused = found.of::<GemmMatch>()[0];
        assert!(fused.epilogue.is_some() && fused.applied_pad().is_none());
        assert_eq!((fused.problem.n, fused.problem.padded_from), (50257, None));
        let alone = fused.plain();
        assert_eq!(
            (alone.problem.rule_id().as_str(), alone.problem.n),
            ("gemm_rcr_padn", 50264)
        );
        assert!(alone.applied_pad().is_some() && alone.epilogue.is_none());
    }

    #[test]
    fn every_layout_names_its_rules_and_cutlass_layouts() {
        for l in GemmLayout::ALL {
            assert_eq!(GemmLayout::parse(l.short_name()), Some(l));
            assert_eq!(GemmLayout::of(l.a(), l.b()), l);
            let p = GemmProblem::from_rule(
                &format!("bmm_{}", l.short_name()),
                &[4, 8, 16, 32],
                DType::F32,
            )
            .unwrap();
            assert_eq!(p.rule_id(), format!("bmm_{}", l.short_name()));
        }
        // The transposed problem: CUTLASS's A is Bᵀ, its B is aᵀ.
        assert_eq!(
            (
                GemmLayout::Crr.cutlass_layout_a(),
                GemmLayout::Crr.cutlass_layout_b()
            ),
            ("cutlass::layout::ColumnMajor", "cutlass::layout::RowMajor")
        );
        assert_eq!(
            (
                GemmLayout::Ccr.cutlass_layout_a(),
                GemmLayout::Ccr.cutlass_layout_b()
            ),
            ("cutlass::layout::RowMajor", "cutlass::layout::RowMajor")
        );
        assert!(
            GemmProblem::from_rule("bmm_crr_bias", &[4, 8, 16, 32], DType::F32)
                .unwrap_err()
                .contains("no bias")
        );
    }
}
