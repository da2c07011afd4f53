//! LayerNorm rule: `layernorm`, `layernorm_affine`, `layernorm_weight`, `layernorm_bias`.
//!
//! y[r,:] = (x[r,:] − mean_r) / √(var_r + eps) · w + b over the last dim of C elements, one row r
//! per position of the leading dims, where mean_r = Σ_c x[r,c] / C and var_r = Σ_c (x[r,c] −
//! mean_r)² / C (the biased variance, as torch computes it), with fp32 statistics whatever the
//! tensor dtype; w and b are optional ([C] each, the tensor's dtype). The graph writes it as
//! `aten::layer_norm(x, normalized_shape, weight?, bias?, eps, cudnn_enable)`; only a
//! normalized_shape of the last dim alone (`[C]`) matches: a norm over several trailing dims stays
//! torch's. The rule id says which of w and b the call passes: both (`_affine`, nn.LayerNorm),
//! neither, or one of them (`nn.LayerNorm(bias=False)` passes the weight alone).
//!
//! `LayerNormRule` offers each such node as its own pattern: `layer_norm` is no epilogue op, so no
//! GEMM's epilogue reaches into one.

use super::{boxed, Match, PatternKind, Rule};
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::types::DType;
use serde::{Deserialize, Serialize};

/// What a LayerNorm kernel computes: the pattern table keys on it (with math and arch).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LayerNormProblem {
    /// Rows: the product of the leading dims.
    pub rows: i64,
    /// C: the normalized (last) dim.
    pub cols: i64,
    pub dtype: DType,
    pub weight: bool,
    pub bias: bool,
}

impl LayerNormProblem {
    /// `layernorm_affine` (weight and bias), `layernorm_weight`, `layernorm_bias` or `layernorm`.
    /// The widest vector, in elements and at most 16 bytes, that C divides: the loads a kernel
    /// may use on every row.
    pub fn alignment(&self) -> u32 {
        let mut align = 16 / self.dtype.bytes() as u32;
        while align > 1 && self.cols % align as i64 != 0 {
            align /= 2;
        }
        align
    }
    pub fn rule_id(&self) -> String {
        match (self.weight, self.bias) {
            (true, true) => "layernorm_affine",
            (true, false) => "layernorm_weight",
            (false, true) => "layernorm_bias",
            (false, false) => "layernorm",
        }
        .into()
    }
    /// `ROWSxC`.
    pub fn shape_key(&self) -> String {
        format!("{}x{}", self.rows, self.cols)
    }
    /// Per element: the mean's add, the variance's subtract, square and add, the normalization's
    /// subtract and multiply, and one operation per affine parameter.
    pub fn flops(&self) -> f64 {
        (self.rows * self.cols) as f64 * (6 + self.weight as i64 + self.bias as i64) as f64
    }
    /// Fewest bytes a kernel moves: x read once, y written once, the parameters read once.
    pub fn bytes(&self) -> f64 {
        let params = (self.weight as i64 + self.bias as i64) * self.cols;
        (2 * self.rows * self.cols + params) as f64 * self.dtype.bytes() as f64
    }
    /// The problem a rule id names at a shape `ROWSxC`.
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<LayerNormProblem, String> {
        let (weight, bias) = match rule {
            "layernorm_affine" => (true, true),
            "layernorm_weight" => (true, false),
            "layernorm_bias" => (false, true),
            "layernorm" => (false, false),
            _ => return Err(format!("unknown rule '{rule}': use layernorm, layernorm_affine, layernorm_weight or layernorm_bias")),
        };
        match dims {
            &[rows, cols] if rows > 0 && cols > 0 => Ok(LayerNormProblem { rows, cols, dtype, weight, bias }),
            _ => Err(format!("{rule} takes a shape of 2 positive dims (ROWSxC: rows, then the normalized dim), got {dims:?}")),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormMatch {
    /// The `aten::layer_norm` node: the pattern is this one node.
    pub node: NodeId,
    pub x: ValueId,
    /// The call's `normalized_shape` operand (`[C]`), which the op's fallback passes on as it is.
    pub normalized_shape: ValueId,
    pub weight: Option<ValueId>,
    pub bias: Option<ValueId>,
    pub eps: ValueId,
    pub problem: LayerNormProblem,
}

impl Match for LayerNormMatch {
    fn nodes(&self) -> Vec<NodeId> {
        vec![self.node]
    }
}

/// The LayerNorm rule: `aten::layer_norm` over the last dim.
pub struct LayerNormRule;

impl Rule for LayerNormRule {
    fn name(&self) -> &'static str {
        "layernorm"
    }
    fn kind(&self) -> PatternKind {
        PatternKind::LayerNorm
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_layernorms(g))
    }
}

/// Every LayerNorm of the top-level block over the last dim alone.
pub fn match_layernorms(g: &Graph) -> Vec<LayerNormMatch> {
    (0..g.nodes.len())
        .filter(|&n| g.nodes[n].depth == 0 && g.nodes[n].kind == "aten::layer_norm")
        .filter_map(|n| layernorm(g, n))
        .collect()
}

/// The ints a list operand holds: a constant list, or a `prim::ListConstruct` of int constants
/// (as tracing records `nn.LayerNorm`'s normalized_shape).
fn int_list(g: &Graph, v: ValueId) -> Option<Vec<i64>> {
    if let Some(Const::Ints(v)) = g.constant(v) {
        return Some(v.clone());
    }
    let n = &g.nodes[g.values[v].producer?];
    if n.kind != "prim::ListConstruct" {
        return None;
    }
    n.inputs
        .iter()
        .map(|&i| g.constant(i).and_then(Const::as_int))
        .collect()
}

fn layernorm(g: &Graph, n: NodeId) -> Option<LayerNormMatch> {
    // (input, normalized_shape, weight, bias, eps, cudnn_enable)
    let i = &g.nodes[n].inputs;
    if i.len() < 5 || g.nodes[n].outputs.len() != 1 {
        return None;
    }
    let x = i[0];
    let tx = g.tensor(x)?;
    let dtype = DType::parse(&tx.dtype)?;
    let cols = *tx.shape.last()?;
    if int_list(g, i[1])? != [cols] {
        return None;
    }
    // An absent parameter is the None constant; a present one is a [C] tensor of x's dtype.
    let param = |v: ValueId| -> Option<Option<ValueId>> {
        if matches!(g.constant(v), Some(Const::None)) {
            return Some(None);
        }
        let t = g.tensor(v)?;
        (t.shape == [cols] && t.dtype == tx.dtype).then_some(Some(v))
    };
    let (weight, bias) = (param(i[2])?, param(i[3])?);
    let rows: i64 = tx.shape[..tx.shape.len() - 1].iter().product();
    let problem = LayerNormProblem {
        rows,
        cols,
        dtype,
        weight: weight.is_some(),
        bias: bias.is_some(),
    };
    (rows > 0 && cols > 0).then_some(LayerNormMatch {
        node: n,
        x,
        normalized_shape: i[1],
        weight,
        bias,
        eps: i[4],
        problem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A [4,16,32] f32 input normalized with `shape`, `weight` and `bias` (values of the graph).
    fn graph(shape: &str, weight: &str, bias: &str) -> Graph {
        Graph::parse(&format!(
            "graph(%x: f32[4,16,32], %w: f32[32], %b: f32[32], %h: bf16[32]):
               %none = prim::Constant[None]()
               %eps = prim::Constant[1e-05]()
               %on = prim::Constant[True]()
               %c = prim::Constant[32]()
               %t = prim::Constant[16]()
               %last = prim::ListConstruct(%c)
               %two = prim::ListConstruct(%t, %c)
               %k = prim::Constant[[32]]()
               %y = aten::layer_norm(%x, {shape}, {weight}, {bias}, %eps, %on) : f32[4,16,32]
               return (%y)"
        ))
        .unwrap()
    }

    #[test]
    fn affine_and_plain_layernorms_over_the_last_dim_match() {
        let g = graph("%last", "%w", "%b");
        let m = match_layernorms(&g);
        assert_eq!(m.len(), 1);
        let p = &m[0].problem;
        assert_eq!(
            *p,
            LayerNormProblem {
                rows: 64,
                cols: 32,
                dtype: DType::F32,
                weight: true,
                bias: true
            }
        );
        assert_eq!(
            (p.rule_id().as_str(), p.shape_key().as_str()),
            ("layernorm_affine", "64x32")
        );
        assert_eq!(
            (
                g.values[m[0].weight.unwrap()].name.as_str(),
                g.values[m[0].eps].name.as_str()
            ),
            ("w", "eps")
        );
        let plain = &match_layernorms(&graph("%last", "%none", "%none"))[0];
        assert_eq!(
            (plain.problem.rule_id().as_str(), plain.weight, plain.bias),
            ("layernorm", None, None)
        );
        assert_eq!(
            match_layernorms(&graph("%k", "%w", "%none"))[0]
                .problem
                .rule_id(),
            "layernorm_weight",
            "a constant list, and bias=False"
        );
        assert_eq!(
            match_layernorms(&graph("%last", "%none", "%b"))[0]
                .problem
                .rule_id(),
            "layernorm_bias"
        );
    }

    #[test]
    fn other_norms_and_parameters_stay_torch() {
        assert!(
            match_layernorms(&graph("%two", "%w", "%b")).is_empty(),
            "normalized over the last two dims"
        );
        assert!(
            match_layernorms(&graph("%last", "%h", "%b")).is_empty(),
            "a weight of another dtype"
        );
        assert!(
            match_layernorms(&graph("%last", "%x", "%b")).is_empty(),
            "a weight that is not [C]"
        );
    }

    #[test]
    fn rule_ids_and_shapes_round_trip() {
        for (weight, bias) in [(true, true), (true, false), (false, true), (false, false)] {
            let p = LayerNormProblem {
                rows: 65536,
                cols: 768,
                dtype: DType::Bf16,
                weight,
                bias,
            };
            let dims: Vec<i64> = p
                .shape_key()
                .split('x')
                .map(|d| d.parse().unwrap())
                .collect();
            assert_eq!(
                LayerNormProblem::from_rule(&p.rule_id(), &dims, DType::Bf16).unwrap(),
                p
            );
        }
        assert!(
            LayerNormProblem::from_rule("layernorm", &[1, 2, 3], DType::F32)
                .unwrap_err()
                .contains("ROWSxC")
        );
        assert!(LayerNormProblem::from_rule("rmsnorm", &[1, 2], DType::F32)
            .unwrap_err()
            .contains("use layernorm"));
        let p = LayerNormProblem {
            rows: 65536,
            cols: 768,
            dtype: DType::F32,
            weight: true,
            bias: true,
        };
        assert_eq!(p.bytes(), (2.0 * 65536.0 * 768.0 + 2.0 * 768.0) * 4.0);
        assert_eq!(p.flops(), 65536.0 * 768.0 * 8.0);
    }
}
