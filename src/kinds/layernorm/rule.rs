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
//! GEMM's epilogue reaches into one. Where x is the sum of a residual add (`rules::residual`:
//! BERT's and OPT's embeddings, a sandwich norm's residual), it offers the node a second time with
//! the add (`add_` rule ids); the cover keeps the add with the norm unless a GEMM's epilogue
//! takes it.

use super::{LayerNormProblem, LAYERNORM};
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::rules::residual::{residual_add, ResidualAdd};
use crate::rules::views::Readers;
use crate::rules::{boxed, Match, PatternKind, Rule};
use crate::types::DType;
use std::collections::BTreeSet;

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
    /// The residual add whose sum x is, where the match takes it: its operands, its nodes and the
    /// node whose output the call's second output takes over.
    pub add: Option<ResidualAdd>,
}

impl LayerNormMatch {
    /// The nodes the rewrite removes besides the norm and the sum's node: the add's.
    pub fn rest(&self) -> &[NodeId] {
        self.add.as_ref().map_or(&[], |a| &a.nodes)
    }

    /// This norm with the residual add before it, where x is such a sum.
    fn with_add(&self, g: &Graph, readers: &Readers) -> Option<LayerNormMatch> {
        let add = residual_add(g, readers, self.x, &BTreeSet::from([self.node]))?;
        Some(LayerNormMatch {
            problem: LayerNormProblem {
                add: Some(add.residual),
                ..self.problem.clone()
            },
            add: Some(add),
            ..self.clone()
        })
    }
}

impl Match for LayerNormMatch {
    fn nodes(&self) -> Vec<NodeId> {
        let mut all = vec![self.node];
        if let Some(add) = &self.add {
            all.extend(&add.nodes);
            all.extend(add.sum);
        }
        all.sort_unstable();
        all
    }
}

/// The LayerNorm rule: `aten::layer_norm` over the last dim.
pub struct LayerNormRule;

impl Rule for LayerNormRule {
    fn name(&self) -> &'static str {
        "layernorm"
    }
    fn kind(&self) -> PatternKind {
        LAYERNORM
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_layernorms(g))
    }
}

/// Every LayerNorm of the top-level block over the last dim alone, each followed by the same
/// norm with the residual add before it where x is such a sum.
pub fn match_layernorms(g: &Graph) -> Vec<LayerNormMatch> {
    let readers = Readers::of(g);
    (0..g.nodes.len())
        .filter(|&n| g.nodes[n].depth == 0 && g.nodes[n].kind == "aten::layer_norm")
        .filter_map(|n| layernorm(g, n))
        .flat_map(|m| {
            let add = m.with_add(g, &readers);
            std::iter::once(m).chain(add)
        })
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
    if g.int_list(i[1])? != [cols] {
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
        add: None,
    };
    (rows > 0 && cols > 0).then_some(LayerNormMatch {
        node: n,
        x,
        normalized_shape: i[1],
        weight,
        bias,
        eps: i[4],
        problem,
        add: None,
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
                bias: true,
                add: None,
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
}
