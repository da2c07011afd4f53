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
//! Written out, as Cohere's norm traces (`CohereLayerNorm`): `xf = to(x, f32)` (none when x is
//! fp32), `mu = mean(xf, [-1], keepdim)`, `var = mean(pow(xf - mu, 2), [-1], keepdim)`,
//! `(xf - mu) · rsqrt(var + eps)` (the difference written once or twice), then `w′ · ·` (either
//! side) with w′ = `to(w, f32)` or w, and `to(dtype)` back where x was cast: the weight applied in
//! fp32 before the one rounding, which is what the kernel computes. eps is a constant. No bias;
//! a norm whose statistics are not in fp32 stays torch's. The op (`fact::layernorm_written`)
//! replays those ops where the kernel does not fit.
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
use crate::rules::written::{self, cast_to, mul_other, number};
use crate::rules::{boxed, Match, PatternKind, Rule};
use crate::types::DType;
use std::collections::BTreeSet;

/// How the graph spells the norm: the op and its fallback follow it.
#[derive(Clone, Debug, PartialEq)]
pub enum Spelling {
    /// `aten::layer_norm`: its `normalized_shape` (`[C]`) and `eps` operands, which the op
    /// passes on as they are.
    Aten {
        normalized_shape: ValueId,
        eps: ValueId,
    },
    /// The written-out ops (see the module doc): eps, whether x was cast to fp32 (and the result
    /// back), and the pattern's nodes besides the last.
    Written {
        eps: f64,
        upcast: bool,
        rest: Vec<NodeId>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct LayerNormMatch {
    /// The node whose output is the norm (`aten::layer_norm`, or the written form's last op).
    pub node: NodeId,
    /// x in its own dtype (before any upcast).
    pub x: ValueId,
    /// The weight in x's dtype (before any cast).
    pub weight: Option<ValueId>,
    pub bias: Option<ValueId>,
    pub spelling: Spelling,
    pub problem: LayerNormProblem,
    /// The residual add whose sum x is, where the match takes it: its operands, its nodes and the
    /// node whose output the call's second output takes over.
    pub add: Option<ResidualAdd>,
}

impl LayerNormMatch {
    /// The nodes the rewrite removes besides the norm and the sum's node: the add's, or the
    /// written form's.
    pub fn rest(&self) -> &[NodeId] {
        match (&self.spelling, &self.add) {
            (Spelling::Written { rest, .. }, _) => rest,
            (Spelling::Aten { .. }, add) => add.as_ref().map_or(&[], |a| &a.nodes),
        }
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
        all.extend(self.rest());
        if let Some(add) = &self.add {
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
    let aten = (0..g.nodes.len())
        .filter(|&n| g.nodes[n].depth == 0 && g.nodes[n].kind == "aten::layer_norm")
        .filter_map(|n| layernorm(g, n))
        .flat_map(|m| {
            let add = m.with_add(g, &readers);
            std::iter::once(m).chain(add)
        });
    let written = (0..g.nodes.len())
        .filter(|&n| g.nodes[n].depth == 0 && g.nodes[n].kind == "aten::rsqrt")
        .filter_map(|n| written(g, &readers, n));
    aten.chain(written).collect()
}

/// The written-out LayerNorm around `rsqrt` node `r`, if it is one (module doc).
fn written(g: &Graph, readers: &Readers, r: NodeId) -> Option<LayerNormMatch> {
    let producer = |v: ValueId, kind: &str| {
        g.values[v]
            .producer
            .filter(|&n| g.nodes[n].kind == kind && g.nodes[n].depth == 0)
    };
    let out = |n: NodeId| g.nodes[n].outputs.first().copied();
    let only_reader = |v: ValueId| match readers.of_value(v) {
        [n] if g.nodes[*n].depth == 0 && !g.outputs.contains(&v) => Some(*n),
        _ => None,
    };
    let alpha_one = |n: NodeId| {
        let i = &g.nodes[n].inputs;
        i.len() == 2 || (i.len() == 3 && number(g, i[2]) == Some(1.0))
    };
    // rsqrt(var + eps), var = mean((xf - mu)²), mu = mean(xf).
    let add = producer(g.nodes[r].inputs[0], "aten::add")?;
    let eps = number(g, *g.nodes[add].inputs.get(1)?)?;
    let var = producer(g.nodes[add].inputs[0], "aten::mean")?;
    if !(alpha_one(add) && eps.is_finite() && eps >= 0.0) {
        return None;
    }
    let (sq_node, d1) = written::square_of(g, written::mean_last(g, var)?)?;
    let sub1 = producer(d1, "aten::sub").filter(|&n| alpha_one(n))?;
    let (xf, mu) = (g.nodes[sub1].inputs[0], g.nodes[sub1].inputs[1]);
    let mu_node = producer(mu, "aten::mean")?;
    if written::mean_last(g, mu_node)? != xf {
        return None;
    }
    // (xf - mu) · rsqrt(·), the difference this one or a second sub of the same operands.
    let norm = only_reader(out(r)?)?;
    let other = mul_other(g, norm, out(r)?)?;
    let sub2 = if other == d1 {
        None
    } else {
        let s2 = producer(other, "aten::sub").filter(|&n| alpha_one(n))?;
        (g.nodes[s2].inputs[..2] == [xf, mu]).then_some(s2)?;
        Some(s2)
    };
    // The upcast: xf = to(x, f32) where x is not fp32 already.
    let tx = g.tensor(xf)?;
    let cols = *tx.shape.last()?;
    let (x, cast_x) = match g.values[xf].producer {
        Some(c)
            if cast_to(g, c, "f32")
                && g.tensor(g.nodes[c].inputs[0])
                    .is_some_and(|t| t.dtype != "f32") =>
        {
            (g.nodes[c].inputs[0], Some(c))
        }
        _ => (xf, None),
    };
    if tx.dtype != "f32" {
        return None;
    }
    let dtype_x = g.tensor(x)?.dtype.clone();
    let dtype = DType::parse(&dtype_x)?;
    // The weight, either side, as w or to(w, f32); a [C] tensor of x's dtype.
    let mut last = norm;
    let (mut weight, mut cast_w, mut wm) = (None, None, None);
    let weighted = only_reader(out(norm)?).and_then(|m| Some((m, mul_other(g, m, out(norm)?)?)));
    if let Some((m, wv)) = weighted {
        let (w, cw) = match g.values[wv].producer.filter(|&c| cast_to(g, c, "f32")) {
            Some(c) => (g.nodes[c].inputs[0], Some(c)),
            None => (wv, None),
        };
        let tw = g.tensor(w)?;
        if tw.shape == [cols] && tw.dtype == dtype_x {
            (weight, cast_w, wm, last) = (Some(w), cw, Some(m), m);
        }
    }
    // Cast back to x's dtype where x was cast.
    let mut back = None;
    if cast_x.is_some() {
        let b = only_reader(out(last)?).filter(|&n| cast_to(g, n, &dtype_x))?;
        (back, last) = (Some(b), b);
    }
    // Every node but the last read only inside; the casts of x and w are the pattern's where
    // nothing else reads them (else they stay in the graph).
    let mut inside: BTreeSet<NodeId> = [mu_node, sub1, sq_node, var, add, r, norm]
        .into_iter()
        .chain(sub2)
        .chain(wm)
        .chain(back)
        .collect();
    for cast in [cast_x, cast_w].into_iter().flatten() {
        if !readers.escapes(out(cast)?, &inside) {
            inside.insert(cast);
        }
    }
    if inside
        .iter()
        .filter(|&&n| n != last)
        .filter_map(|&n| out(n))
        .any(|v| readers.escapes(v, &inside))
    {
        return None;
    }
    let rows: i64 = tx.shape[..tx.shape.len() - 1].iter().product();
    (rows > 0 && cols > 0).then(|| LayerNormMatch {
        node: last,
        x,
        weight,
        bias: None,
        spelling: Spelling::Written {
            eps,
            upcast: cast_x.is_some(),
            rest: inside.into_iter().filter(|&n| n != last).collect(),
        },
        problem: LayerNormProblem {
            rows,
            cols,
            dtype,
            weight: weight.is_some(),
            bias: false,
            add: None,
        },
        add: None,
    })
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
        weight,
        bias,
        spelling: Spelling::Aten {
            normalized_shape: i[1],
            eps: i[4],
        },
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
        let Spelling::Aten { eps, .. } = m[0].spelling else {
            panic!("aten::layer_norm's spelling")
        };
        assert_eq!(
            (
                g.values[m[0].weight.unwrap()].name.as_str(),
                g.values[eps].name.as_str()
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

    /// Cohere's norm as traced (bf16 x [2,8,32]): cast to fp32, the mean, the difference written
    /// twice, its square's mean, eps, rsqrt, the weight cast to fp32 on the left, and back.
    fn cohere(x_dt: &str, square: &str, second_sub: &str) -> String {
        format!(
            "graph(%x: {x_dt}[2,8,32], %w: {x_dt}[32]):
               %f32 = prim::Constant[6]()
               %bf = prim::Constant[15]()
               %no = prim::Constant[False]()
               %yes = prim::Constant[True]()
               %none = prim::Constant[None]()
               %m1 = prim::Constant[-1]()
               %dims = prim::ListConstruct(%m1)
               %one = prim::Constant[1]()
               %two = prim::Constant[2]()
               %eps = prim::Constant[1e-05]()
               %xf = aten::to(%x, %f32, %no, %no, %none) : f32[2,8,32]
               %mu = aten::mean(%xf, %dims, %yes, %none) : f32[2,8,1]
               %d1 = aten::sub(%xf, %mu, %one) : f32[2,8,32]
               {square}
               %var = aten::mean(%sq, %dims, %yes, %none) : f32[2,8,1]
               {second_sub}
               %ve = aten::add(%var, %eps, %one) : f32[2,8,1]
               %r = aten::rsqrt(%ve) : f32[2,8,1]
               %n = aten::mul(%d2, %r) : f32[2,8,32]
               %wf = aten::to(%w, %f32, %no, %no, %none) : f32[32]
               %y = aten::mul(%wf, %n) : f32[2,8,32]
               %o = aten::to(%y, %bf, %no, %no, %none) : {x_dt}[2,8,32]
               return (%o, %x)"
        )
    }
    const POW: &str = "%sq = aten::pow(%d1, %two) : f32[2,8,32]";
    const SUB2: &str = "%d2 = aten::sub(%xf, %mu, %one) : f32[2,8,32]";

    #[test]
    fn coheres_written_out_layernorm_matches_with_its_casts() {
        let g = Graph::parse(&cohere("bf16", POW, SUB2)).unwrap();
        let m = match_layernorms(&g);
        assert_eq!(m.len(), 1);
        let m = &m[0];
        let name = |v: ValueId| g.values[v].name.as_str();
        assert_eq!((name(m.x), name(m.weight.unwrap())), ("x", "w"));
        assert_eq!(
            (m.problem.rule_id().as_str(), m.problem.shape_key().as_str()),
            ("layernorm_weight", "16x32")
        );
        assert_eq!(g.nodes[m.node].kind, "aten::to");
        let Spelling::Written { eps, upcast, rest } = &m.spelling else {
            panic!("written out")
        };
        assert_eq!((*eps, *upcast, rest.len()), (1e-5, true, 11));
        // x·x for the square and one difference read twice read the same.
        let g = Graph::parse(
            &cohere("bf16", "%sq = aten::mul(%d1, %d1) : f32[2,8,32]", "")
                .replace("aten::mul(%d2, %r)", "aten::mul(%r, %d1)"),
        )
        .unwrap();
        assert_eq!(match_layernorms(&g).len(), 1);
        // No weight: the normalized value cast back is the norm.
        let g = Graph::parse(
            &cohere("bf16", POW, SUB2)
                .replace(
                    "               %wf = aten::to(%w, %f32, %no, %no, %none) : f32[32]\n",
                    "",
                )
                .replace("               %y = aten::mul(%wf, %n) : f32[2,8,32]\n", "")
                .replace("aten::to(%y, %bf", "aten::to(%n, %bf"),
        )
        .unwrap();
        let m = match_layernorms(&g);
        assert_eq!(
            (m.len(), m[0].weight, m[0].problem.rule_id().as_str()),
            (1, None, "layernorm")
        );
    }

    #[test]
    fn a_written_norm_off_fp32_statistics_or_read_midway_stays_torchs() {
        // Statistics in bf16 (no upcast): the kernel's fp32 ones would differ.
        let bf16_math = cohere("bf16", POW, SUB2)
            .replace(
                "%xf = aten::to(%x, %f32, %no, %no, %none) : f32[2,8,32]",
                "%xf = aten::alias(%x) : bf16[2,8,32]",
            )
            .replace("f32[2,8,32]", "bf16[2,8,32]")
            .replace("f32[2,8,1]", "bf16[2,8,1]");
        assert!(match_layernorms(&Graph::parse(&bf16_math).unwrap()).is_empty());
        // The mean read by another op: not the pattern's alone.
        let g =
            Graph::parse(&cohere("bf16", POW, SUB2).replace("return (%o, %x)", "return (%o, %mu)"))
                .unwrap();
        assert!(match_layernorms(&g).is_empty());
        // A square that is not one (a cube) is no variance.
        let g = Graph::parse(
            &cohere("bf16", POW, SUB2)
                .replace("%two = prim::Constant[2]()", "%two = prim::Constant[3]()"),
        )
        .unwrap();
        assert!(match_layernorms(&g).is_empty());
    }
}
