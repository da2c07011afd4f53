//! GEMM rules: `gemm_rcr[_bias]`, `gemm_rrr[_bias]` and the batched `bmm_rrr`.
//!
//! out[M,N] = a[M,K] · B (+ bias[N]), a row-major with any leading dims folded into M, where
//! - rcr: B = w[N,K]ᵀ, as in `aten::linear(a, w, bias?)`;
//! - rrr: B = b[K,N], as in `aten::mm(a, b)`, `aten::matmul(a, b)` with a 2-D b (a may have
//!   leading dims), and `aten::addmm(bias, a, b, beta=1, alpha=1)` with a 1-D bias.
//!
//! bmm_rrr: out[L,M,N] = a[L,M,K] · b[L,K,N], as in `aten::bmm` and `aten::matmul` whose operands
//! carry the same batch dims (folded into L). Broadcast batch dims are not matched.

use super::epilogue::{Epilogue, EpilogueMatch};
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::types::DType;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum GemmLayout {
    Rcr,
    Rrr,
}

impl GemmLayout {
    pub fn short_name(self) -> &'static str {
        match self {
            GemmLayout::Rcr => "rcr",
            GemmLayout::Rrr => "rrr",
        }
    }
    /// CUTLASS layout of operand A in the transposed problem the templates compute (A = Bᵀ).
    pub fn cutlass_layout_a(self) -> &'static str {
        match self {
            GemmLayout::Rcr => "cutlass::layout::RowMajor",
            GemmLayout::Rrr => "cutlass::layout::ColumnMajor",
        }
    }
    pub fn parse(s: &str) -> Option<GemmLayout> {
        match s {
            "rcr" => Some(GemmLayout::Rcr),
            "rrr" => Some(GemmLayout::Rrr),
            _ => None,
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
    pub fn layout(self) -> GemmLayout {
        match self {
            GemmOrigin::Linear => GemmLayout::Rcr,
            GemmOrigin::Mm | GemmOrigin::Bmm | GemmOrigin::Matmul | GemmOrigin::Addmm => GemmLayout::Rrr,
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
    /// Elementwise ops fused after the GEMM (and its bias), see `rules::epilogue`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epilogue: Option<Epilogue>,
}

fn one() -> i64 {
    1
}

impl GemmProblem {
    /// The rule id: math and layouts, e.g. `gemm_rcr_bias`, `bmm_rrr`, and the epilogue's tag
    /// (`gemm_rcr_bias_ep_gelu_tanh_1a2b3c4d`).
    pub fn rule_id(&self) -> String {
        let kind = if self.batch > 1 { "bmm" } else { "gemm" };
        let ep = self.epilogue.as_ref().map(|e| format!("_{}", e.tag())).unwrap_or_default();
        format!("{kind}_{}{}{ep}", self.layout.short_name(), if self.bias { "_bias" } else { "" })
    }
    /// The same GEMM without its epilogue.
    pub fn plain(&self) -> GemmProblem {
        GemmProblem { epilogue: None, ..self.clone() }
    }
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }
    /// Fewest bytes moved: each operand read once, the output written once (and a full-size
    /// epilogue leaf, a residual, read once).
    pub fn bytes(&self) -> f64 {
        let e = self.dtype.bytes() as f64;
        let (m, n, k, l) = (self.m as f64, self.n as f64, self.k as f64, self.batch as f64);
        let full = self.epilogue.as_ref().map_or(0, Epilogue::full_leaves) as f64;
        e * (l * (m * k + k * n + m * n * (1.0 + full)) + if self.bias { n } else { 0.0 })
    }
    /// The problem a rule id names at a shape: `dims` is M,N,K, or L,M,N,K for `bmm_rrr`.
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<GemmProblem, String> {
        let unknown = || format!("unknown rule '{rule}': use gemm_rcr, gemm_rcr_bias, gemm_rrr, gemm_rrr_bias or bmm_rrr");
        let (rest, batched) = match (rule.strip_prefix("gemm_"), rule.strip_prefix("bmm_")) {
            (Some(r), _) => (r, false),
            (None, Some(r)) => (r, true),
            _ => return Err(unknown()),
        };
        let want = if batched { 4 } else { 3 };
        if dims.len() != want {
            return Err(format!("{rule} takes a shape of {want} dims ({})", if batched { "LxMxNxK" } else { "MxNxK" }));
        }
        let (batch, m, n, k) = if batched { (dims[0], dims[1], dims[2], dims[3]) } else { (1, dims[0], dims[1], dims[2]) };
        let (layout, bias) = match rest.strip_suffix("_bias") {
            Some(l) => (l, true),
            None => (rest, false),
        };
        let layout = GemmLayout::parse(layout).ok_or_else(unknown)?;
        if batched && (layout != GemmLayout::Rrr || bias || batch < 2) {
            return Err(format!("{rule}: the batched rule is bmm_rrr with a batch of 2 or more"));
        }
        if dims.iter().any(|&d| d <= 0) {
            return Err(format!("shape {dims:?}: every dim must be positive"));
        }
        Ok(GemmProblem { m, n, k, layout, dtype, bias, batch, epilogue: None })
    }

    /// `MxNxK`, or `LxMxNxK` when batched.
    pub fn shape_key(&self) -> String {
        if self.batch > 1 {
            format!("{}x{}x{}x{}", self.batch, self.m, self.n, self.k)
        } else {
            format!("{}x{}x{}", self.m, self.n, self.k)
        }
    }
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
}

impl GemmMatch {
    /// The match of the GEMM node alone: what compose falls back to when the fused pattern
    /// has no kernel.
    pub fn plain(&self) -> GemmMatch {
        GemmMatch { epilogue: None, problem: self.problem.plain(), ..self.clone() }
    }
    /// The graph nodes the pattern replaces: the GEMM and its epilogue's nodes.
    pub fn nodes(&self) -> Vec<NodeId> {
        let mut v = vec![self.node];
        v.extend(self.epilogue.iter().flat_map(|e| e.nodes.iter().copied()));
        v
    }
}

/// Every GEMM in the top-level block whose shapes and dtypes are known and supported.
pub fn match_gemms(g: &Graph) -> Vec<GemmMatch> {
    g.nodes.iter().enumerate().filter(|(_, n)| n.depth == 0).filter_map(|(i, _)| match_node(g, i)).collect()
}

fn match_node(g: &Graph, id: NodeId) -> Option<GemmMatch> {
    let n = &g.nodes[id];
    let origin = GemmOrigin::of_kind(&n.kind)?;
    let (a, b, bias) = match origin {
        GemmOrigin::Linear => {
            let bias = n.inputs[2];
            let bias = if matches!(g.constant(bias), Some(Const::None)) { None } else { Some(bias) };
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
    if tb.dtype != ta.dtype || tb.shape.len() < 2 || ta.shape.len() < 2 {
        return None;
    }
    if tb.shape.len() > 2 {
        // Batched: only bmm and matmul, with identical batch dims on both sides.
        let (ra, rb) = (ta.shape.len(), tb.shape.len());
        if !matches!(origin, GemmOrigin::Bmm | GemmOrigin::Matmul) || ra != rb || ta.shape[..ra - 2] != tb.shape[..rb - 2] {
            return None;
        }
        let batch: i64 = ta.shape[..ra - 2].iter().product();
        let (m, k, n) = (ta.shape[ra - 2], ta.shape[ra - 1], tb.shape[rb - 1]);
        if tb.shape[rb - 2] != k || batch == 0 || m == 0 || n == 0 || k == 0 {
            return None;
        }
        let problem = GemmProblem { m, n, k, layout: GemmLayout::Rrr, dtype, bias: false, batch, epilogue: None };
        return Some(GemmMatch { node: id, origin, a, b, bias: None, problem, epilogue: None });
    }
    if matches!(origin, GemmOrigin::Mm | GemmOrigin::Bmm) && ta.shape.len() != 2 {
        return None;
    }
    let k = *ta.shape.last()?;
    let (kb, nn) = match origin.layout() {
        GemmLayout::Rcr => (tb.shape[1], tb.shape[0]),
        GemmLayout::Rrr => (tb.shape[0], tb.shape[1]),
    };
    if kb != k {
        return None;
    }
    if let Some(bias) = bias {
        let tbias = g.tensor(bias)?;
        if tbias.shape != [nn] || tbias.dtype != ta.dtype {
            return None;
        }
    }
    let m: i64 = ta.shape[..ta.shape.len() - 1].iter().product();
    if m == 0 || nn == 0 || k == 0 {
        return None;
    }
    Some(GemmMatch {
        node: id,
        origin,
        a,
        b,
        bias,
        problem: GemmProblem { m, n: nn, k, layout: origin.layout(), dtype, bias: bias.is_some(), batch: 1, epilogue: None },
        epilogue: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Vec<GemmMatch> {
        match_gemms(&Graph::parse(text).unwrap())
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
        assert_eq!((p.m, p.n, p.k, p.layout, p.bias), (20, 32, 16, GemmLayout::Rcr, true));
        assert_eq!(p.rule_id(), "gemm_rcr_bias");
    }

    #[test]
    fn linear_without_bias_is_plain_rcr() {
        let m = one(
            "graph(%x: bf16[8,16], %w: bf16[32,16]):
               %none = prim::Constant[None]()
               %y = aten::linear(%x, %w, %none) : bf16[8,32]
               return (%y)",
        );
        assert_eq!(m[0].problem.rule_id(), "gemm_rcr");
        assert_eq!(m[0].problem.dtype, DType::Bf16);
        assert_eq!(m[0].bias, None);
    }

    #[test]
    fn mm_and_2d_matmul_are_rrr() {
        let m = one(
            "graph(%a: f32[64,128], %b: f32[128,32]):
               %c = aten::mm(%a, %b) : f32[64,32]
               %d = aten::matmul(%c, %c2) : f32[64,32]
               return (%d)"
                .replace("%c2", "%b2")
                .replace("graph(%a: f32[64,128], %b: f32[128,32])", "graph(%a: f32[64,128], %b: f32[128,32], %b2: f32[32,32])")
                .as_str(),
        );
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].origin, m[0].problem.shape_key()), (GemmOrigin::Mm, "64x32x128".to_string()));
        assert_eq!((m[1].origin, m[1].problem.layout), (GemmOrigin::Matmul, GemmLayout::Rrr));
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
        assert!(one(&text("0.5", "32")).is_empty(), "beta != 1 is not a plain bias");
        assert!(one(&text("1", "8,32")).is_empty(), "a 2-D C is not a bias");
    }

    #[test]
    fn rule_ids_round_trip_through_problems() {
        for rule in ["gemm_rcr", "gemm_rcr_bias", "gemm_rrr", "gemm_rrr_bias"] {
            assert_eq!(GemmProblem::from_rule(rule, &[8, 16, 32], DType::F32).unwrap().rule_id(), rule);
        }
        let b = GemmProblem::from_rule("bmm_rrr", &[128, 512, 2048, 1024], DType::F32).unwrap();
        assert_eq!((b.rule_id(), b.shape_key(), b.batch), ("bmm_rrr".to_string(), "128x512x2048x1024".to_string(), 128));
        assert!(GemmProblem::from_rule("bmm_rrr", &[8, 16, 32], DType::F32).unwrap_err().contains("LxMxNxK"));
        assert!(GemmProblem::from_rule("conv_rrr", &[8, 16, 32], DType::F32).unwrap_err().contains("use gemm_rcr"));
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
        assert_eq!((m[0].origin, m[0].problem.rule_id(), m[0].problem.shape_key()), (GemmOrigin::Bmm, "bmm_rrr".into(), "128x512x2048x1024".into()));
        assert_eq!((m[1].problem.batch, m[1].problem.m, m[1].problem.n, m[1].problem.k), (6, 8, 4, 16));
    }

    #[test]
    fn broadcast_unknown_and_unsupported_operands_do_not_match() {
        assert!(one(
            "graph(%a: f32[2,8,16], %b: f32[1,16,4]):
               %y = aten::matmul(%a, %b) : f32[2,8,4]
               return (%y)"
        )
        .is_empty());
        assert!(one(
            "graph(%a, %b: f32[16,4]):
               %y = aten::mm(%a, %b)
               return (%y)"
        )
        .is_empty());
        assert!(one(
            "graph(%a: f64[8,16], %b: f64[16,4]):
               %y = aten::mm(%a, %b) : f64[8,4]
               return (%y)"
        )
        .is_empty());
    }
}
