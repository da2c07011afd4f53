//! GEMM rules: `gemm_rcr[_bias]` and `gemm_rrr[_bias]`.
//!
//! out[M,N] = a[M,K] · B (+ bias[N]), a row-major with any leading dims folded into M, where
//! - rcr: B = w[N,K]ᵀ, as in `aten::linear(a, w, bias?)`;
//! - rrr: B = b[K,N], as in `aten::mm(a, b)`, 2-D `aten::matmul(a, b)` (a may have leading dims),
//!   and `aten::addmm(bias, a, b, beta=1, alpha=1)` with a 1-D bias.
//! Batched operands (b with more than two dims) are not GEMMs here.

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
    Matmul,
    Addmm,
}

impl GemmOrigin {
    pub fn aten_kind(self) -> &'static str {
        match self {
            GemmOrigin::Linear => "aten::linear",
            GemmOrigin::Mm => "aten::mm",
            GemmOrigin::Matmul => "aten::matmul",
            GemmOrigin::Addmm => "aten::addmm",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            GemmOrigin::Linear => "linear",
            GemmOrigin::Mm => "mm",
            GemmOrigin::Matmul => "matmul",
            GemmOrigin::Addmm => "addmm",
        }
    }
    pub fn layout(self) -> GemmLayout {
        match self {
            GemmOrigin::Linear => GemmLayout::Rcr,
            GemmOrigin::Mm | GemmOrigin::Matmul | GemmOrigin::Addmm => GemmLayout::Rrr,
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
}

impl GemmProblem {
    /// The rule id: math and layouts, e.g. `gemm_rcr_bias`.
    pub fn rule_id(&self) -> String {
        format!("gemm_{}{}", self.layout.short_name(), if self.bias { "_bias" } else { "" })
    }
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
    /// Fewest bytes moved: each operand read once, the output written once.
    pub fn bytes(&self) -> f64 {
        let e = self.dtype.bytes() as f64;
        let (m, n, k) = (self.m as f64, self.n as f64, self.k as f64);
        e * (m * k + k * n + m * n + if self.bias { n } else { 0.0 })
    }
    /// The problem a rule id names at a shape, e.g. (`gemm_rcr_bias`, 4096, 4096, 4096, f32).
    pub fn from_rule(rule: &str, m: i64, n: i64, k: i64, dtype: DType) -> Result<GemmProblem, String> {
        let rest = rule
            .strip_prefix("gemm_")
            .ok_or_else(|| format!("unknown rule '{rule}': use gemm_rcr, gemm_rcr_bias, gemm_rrr or gemm_rrr_bias"))?;
        let (layout, bias) = match rest.strip_suffix("_bias") {
            Some(l) => (l, true),
            None => (rest, false),
        };
        let layout = GemmLayout::parse(layout)
            .ok_or_else(|| format!("unknown rule '{rule}': use gemm_rcr, gemm_rcr_bias, gemm_rrr or gemm_rrr_bias"))?;
        if m <= 0 || n <= 0 || k <= 0 {
            return Err(format!("shape {m}x{n}x{k}: every dim must be positive"));
        }
        Ok(GemmProblem { m, n, k, layout, dtype, bias })
    }

    pub fn shape_key(&self) -> String {
        format!("{}x{}x{}", self.m, self.n, self.k)
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
}

/// Every GEMM in the top-level block whose shapes and dtypes are known and supported.
pub fn match_gemms(g: &Graph) -> Vec<GemmMatch> {
    g.nodes.iter().enumerate().filter(|(_, n)| n.depth == 0).filter_map(|(i, _)| match_node(g, i)).collect()
}

fn match_node(g: &Graph, id: NodeId) -> Option<GemmMatch> {
    let n = &g.nodes[id];
    let origin = match n.kind.as_str() {
        "aten::linear" => GemmOrigin::Linear,
        "aten::mm" => GemmOrigin::Mm,
        "aten::matmul" => GemmOrigin::Matmul,
        "aten::addmm" => GemmOrigin::Addmm,
        _ => return None,
    };
    let (a, b, bias) = match origin {
        GemmOrigin::Linear => {
            let bias = n.inputs[2];
            let bias = if matches!(g.constant(bias), Some(Const::None)) { None } else { Some(bias) };
            (n.inputs[0], n.inputs[1], bias)
        }
        GemmOrigin::Mm | GemmOrigin::Matmul => (n.inputs[0], n.inputs[1], None),
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
    if tb.dtype != ta.dtype || tb.shape.len() != 2 || ta.shape.len() < 2 {
        return None;
    }
    if origin == GemmOrigin::Mm && ta.shape.len() != 2 {
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
        problem: GemmProblem { m, n: nn, k, layout: origin.layout(), dtype, bias: bias.is_some() },
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
            assert_eq!(GemmProblem::from_rule(rule, 8, 16, 32, DType::F32).unwrap().rule_id(), rule);
        }
        assert!(GemmProblem::from_rule("bmm_rrr", 8, 16, 32, DType::F32).unwrap_err().contains("use gemm_rcr"));
        assert!(GemmProblem::from_rule("gemm_rcr", 0, 16, 32, DType::F32).is_err());
    }

    #[test]
    fn batched_unknown_and_unsupported_operands_do_not_match() {
        assert!(one(
            "graph(%a: f32[2,8,16], %b: f32[2,16,4]):
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
