//! RMSNorm rule: `rmsnorm`, `rmsnorm_weight`, `rmsnorm_cast_weight`, `rmsnorm_weight1p`.
//!
//! y[r,:] = x[r,:] / √(Σ_c x[r,c]² / C + eps) · s over the last dim of C elements, one row r per
//! position of the leading dims, the statistics in fp32 whatever the tensor dtype; s is nothing,
//! the weight w [C] or 1 + w (Gemma). Found in two spellings:
//! - `aten::rms_norm(x, [C], w?, eps?)` (nn.RMSNorm, F.rms_norm);
//! - written out, as Hugging Face's Llama, Mistral, Qwen, Gemma and T5 norms trace:
//!   `xf = to(x, f32)` (none when x is fp32), `pow(xf, 2)` or `xf · xf`, `mean([-1], keepdim)`,
//!   `add(eps)`, `rsqrt`, `mul(xf or x, ·)`, then either `to(dtype)` and `mul(w, ·)` in the dtype
//!   (`_cast`: the normalized value rounded before the weight, Llama and T5), or `mul(·, w)`
//!   with w, `to(w, f32)` or `1 + to(w, f32)` in fp32 and one `to(dtype)` (or `type_as`) after.
//!   eps is a constant (a float, or the one-element tensor tracing records).
//!
//! Each of the matcher's nodes but the last must be read only inside the pattern; the upcast of x
//! and the weight's own cast and offset are the pattern's where nothing else reads them (Llama's
//! fp32 copy of x is also its residual: it stays). `x / sqrt(·)` is not matched: its roundings
//! differ from the rsqrt spelling the op's fallback replays.
//!
//! Where x is the sum of a residual add (`rules::residual`: Gemma's sandwich norms, an embedding
//! sum, an fp32 residual stream), each norm is offered twice, alone and with the add (`add_`
//! rule ids): the cover keeps the add with the norm unless a GEMM's epilogue takes it.

use super::{RmsNormProblem, Scale, RMSNORM};
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::rules::residual::{residual_add, ResidualAdd};
use crate::rules::views::Readers;
use crate::rules::written::{self, cast_to, mul_other, number};
use crate::rules::{boxed, Match, PatternKind, Rule};
use crate::types::DType;
use std::collections::BTreeSet;

/// Which spelling the graph used: the op's fallback replays it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spelling {
    /// `aten::rms_norm`, with its `normalized_shape` operand.
    Aten,
    /// The written-out ops.
    Written,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RmsNormMatch {
    /// The node whose output is the result: the rewrite's call takes it over.
    pub node: NodeId,
    /// The pattern's other nodes, in graph order.
    pub rest: Vec<NodeId>,
    /// x in its own dtype (before any upcast).
    pub x: ValueId,
    /// The weight, in x's dtype (before any cast or offset).
    pub weight: Option<ValueId>,
    /// eps; None for `aten::rms_norm`'s default (fp32's machine epsilon).
    pub eps: Option<f64>,
    pub spelling: Spelling,
    pub problem: RmsNormProblem,
    /// The residual add whose sum x is, where the match takes it: the operands the kernel reads
    /// and the node whose output the call's second output takes over (its nodes are in `rest`).
    pub add: Option<ResidualAdd>,
}

impl RmsNormMatch {
    /// What the op's fallback replays: `rms_norm` (torch's op), or the rule id of the written
    /// form (the norm's alone: the add is the op's).
    pub fn form(&self) -> String {
        match self.spelling {
            Spelling::Aten => "rms_norm".into(),
            Spelling::Written => self.problem.clone().with_add(None).rule_id(),
        }
    }

    /// This norm with the residual add before it, where x is such a sum.
    fn with_add(&self, g: &Graph, readers: &Readers) -> Option<RmsNormMatch> {
        let norm: BTreeSet<NodeId> = self.nodes().into_iter().collect();
        let add = residual_add(g, readers, self.x, &norm)?;
        let mut rest = self.rest.clone();
        rest.extend(&add.nodes);
        rest.sort_unstable();
        Some(RmsNormMatch {
            rest,
            problem: self.problem.clone().with_add(Some(add.residual)),
            add: Some(add),
            ..self.clone()
        })
    }
}

impl Match for RmsNormMatch {
    fn nodes(&self) -> Vec<NodeId> {
        let mut all = self.rest.clone();
        all.push(self.node);
        all.extend(self.add.as_ref().and_then(|a| a.sum));
        all.sort_unstable();
        all
    }
}

/// The RMSNorm rule: both spellings.
pub struct RmsNormRule;

impl Rule for RmsNormRule {
    fn name(&self) -> &'static str {
        "rmsnorm"
    }
    fn kind(&self) -> PatternKind {
        RMSNORM
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_rmsnorms(g))
    }
}

/// Every RMSNorm of the top-level block over the last dim alone, in graph order, each followed by
/// the same norm with the residual add before it where x is such a sum.
pub fn match_rmsnorms(g: &Graph) -> Vec<RmsNormMatch> {
    let cx = Cx {
        g,
        readers: g.readers(),
        returned: g.outputs.iter().copied().collect(),
    };
    let mut norms: Vec<RmsNormMatch> = (0..g.nodes.len())
        .filter(|&n| g.nodes[n].depth == 0)
        .filter_map(|n| match g.nodes[n].kind.as_str() {
            "aten::rms_norm" => aten(g, n),
            "aten::mean" => cx.written(n),
            _ => None,
        })
        .collect();
    norms.sort_by_key(|m| m.node);
    let readers = Readers::of(g);
    norms
        .into_iter()
        .flat_map(|m| {
            let add = m.with_add(g, &readers);
            std::iter::once(m).chain(add)
        })
        .collect()
}

/// The row count of a tensor of shape `shape`, its last dim C.
fn rows(shape: &[i64]) -> i64 {
    shape[..shape.len() - 1].iter().product()
}

/// A [C] tensor of dtype `dtype`: a weight the kernel reads.
fn is_weight(g: &Graph, v: ValueId, cols: i64, dtype: &str) -> bool {
    g.constant(v).is_none()
        && g.tensor(v)
            .is_some_and(|t| t.shape == [cols] && t.dtype == dtype)
}

fn aten(g: &Graph, n: NodeId) -> Option<RmsNormMatch> {
    // (input, normalized_shape, weight?, eps?)
    let node = &g.nodes[n];
    let i = &node.inputs;
    if i.len() != 4 || node.outputs.len() != 1 {
        return None;
    }
    let tx = g.tensor(i[0])?;
    let dtype = DType::parse(&tx.dtype)?;
    let cols = *tx.shape.last()?;
    if g.int_list(i[1])? != [cols] || g.tensor(node.outputs[0])?.shape != tx.shape {
        return None;
    }
    let weight = match g.constant(i[2]) {
        Some(Const::None) => None,
        _ => Some(i[2])
            .filter(|&w| is_weight(g, w, cols, &tx.dtype))?
            .into(),
    };
    let eps = match g.constant(i[3])? {
        Const::None => None,
        c => Some(c.as_f64()?),
    };
    let scale = if weight.is_some() {
        Scale::Weight
    } else {
        Scale::None
    };
    let rows = rows(&tx.shape);
    (rows > 0 && cols > 0).then(|| RmsNormMatch {
        node: n,
        rest: vec![],
        x: i[0],
        weight,
        eps,
        spelling: Spelling::Aten,
        problem: RmsNormProblem::new(rows, cols, dtype, scale, false),
        add: None,
    })
}

/// The graph and who reads what.
struct Cx<'g> {
    g: &'g Graph,
    readers: Vec<Vec<NodeId>>,
    returned: BTreeSet<ValueId>,
}

impl Cx<'_> {
    /// The one node reading node `n`'s output, when exactly one does and the graph does not
    /// return it.
    fn only_reader(&self, n: NodeId) -> Option<NodeId> {
        let out = *self.g.nodes[n].outputs.first()?;
        match self.readers[out].as_slice() {
            [r] if !self.returned.contains(&out) && self.g.nodes[*r].depth == 0 => Some(*r),
            _ => None,
        }
    }

    /// Whether node `n`'s outputs are read only by `inside` (and not returned).
    fn owned(&self, n: NodeId, inside: &BTreeSet<NodeId>) -> bool {
        self.g.nodes[n].outputs.iter().all(|&o| {
            !self.returned.contains(&o) && self.readers[o].iter().all(|r| inside.contains(r))
        })
    }

    /// The fp32 scale operand of `mul(n, s)`: w, `to(w, f32)`, or `add(w or to(w, f32), 1)`;
    /// with the weight w (x's dtype, [C]) and the nodes between (the pattern's where owned).
    fn scale(&self, s: ValueId, cols: i64, dtype: &str) -> Option<(Scale, ValueId, Vec<NodeId>)> {
        let g = self.g;
        let weight = |v: ValueId| -> Option<(ValueId, Vec<NodeId>)> {
            if is_weight(g, v, cols, dtype) {
                return Some((v, vec![]));
            }
            // `to(w, f32)` of a weight in x's dtype.
            let p = g.values[v].producer?;
            let w = *g.nodes[p].inputs.first()?;
            (cast_to(g, p, "f32") && is_weight(g, w, cols, dtype)).then(|| (w, vec![p]))
        };
        if let Some((w, nodes)) = weight(s) {
            return Some((Scale::Weight, w, nodes));
        }
        // 1 + w: `add(w', 1, alpha=1)` (Python's `1.0 + w'` traces so), either operand order.
        let p = g.values[s].producer?;
        let node = &g.nodes[p];
        if node.kind != "aten::add"
            || node.inputs.len() != 3
            || number(g, node.inputs[2]) != Some(1.0)
        {
            return None;
        }
        let (a, b) = (node.inputs[0], node.inputs[1]);
        let other = match (number(g, a), number(g, b)) {
            (None, Some(1.0)) => a,
            (Some(1.0), None) => b,
            _ => return None,
        };
        if g.tensor(s)?.dtype != "f32" {
            // 1 + w rounded to a narrower dtype: not the fp32 offset the kernel computes.
            return None;
        }
        let (w, mut nodes) = weight(other)?;
        nodes.push(p);
        Some((Scale::WeightPlusOne, w, nodes))
    }

    /// The written-out form whose mean is node `m`.
    fn written(&self, m: NodeId) -> Option<RmsNormMatch> {
        let g = self.g;
        // mean(sq, [-1], keepdim=True, dtype=None) in fp32, of the square pow(xf, 2) or xf · xf.
        let mean = &g.nodes[m];
        let sq = written::mean_last(g, m)?;
        let tsq = g.tensor(sq)?;
        let rank = tsq.shape.len() as i64;
        if tsq.dtype != "f32" {
            return None;
        }
        let (p, xf) = written::square_of(g, sq)?;
        let txf = g.tensor(xf)?;
        if txf.dtype != "f32" || txf.shape != tsq.shape || rank < 1 {
            return None;
        }
        let cols = *txf.shape.last()?;
        // x: what the upcast read, or xf itself (fp32 throughout).
        let upcast = g.values[xf]
            .producer
            .filter(|&u| cast_to(g, u, "f32"))
            .filter(|&u| {
                let t = g.tensor(g.nodes[u].inputs[0]);
                t.is_some_and(|t| DType::parse(&t.dtype).is_some())
            });
        let x = upcast.map_or(xf, |u| g.nodes[u].inputs[0]);
        let dt = g.tensor(x)?.dtype.clone();
        let dtype = DType::parse(&dt)?;
        // add(mean, eps, alpha=1), either operand order; then rsqrt.
        let a = self.only_reader(m)?;
        let an = &g.nodes[a];
        if an.kind != "aten::add" || an.inputs.len() != 3 || number(g, an.inputs[2]) != Some(1.0) {
            return None;
        }
        let var = mean.outputs[0];
        let eps = match (an.inputs[0] == var, an.inputs[1] == var) {
            (true, false) => number(g, an.inputs[1])?,
            (false, true) => number(g, an.inputs[0])?,
            _ => return None,
        };
        let r = self.only_reader(a)?;
        if g.nodes[r].kind != "aten::rsqrt" {
            return None;
        }
        // n = xf · rsqrt (or x · rsqrt, which promotes to the same fp32 product: T5).
        let n = self.only_reader(r)?;
        let other = mul_other(g, n, g.nodes[r].outputs[0])?;
        let nv = g.nodes[n].outputs[0];
        let tn = g.tensor(nv)?;
        if (other != xf && other != x) || tn.dtype != "f32" || tn.shape != txf.shape {
            return None;
        }
        let mut core = vec![p, m, a, r, n];
        let mut extra: Vec<NodeId> = vec![];
        let (end, scale, cast_first, weight) = match self.only_reader(n) {
            // to(dtype), then maybe w · it in the dtype.
            Some(c) if cast_to(g, c, &dt) => {
                let cv = g.nodes[c].outputs[0];
                let mul = self.only_reader(c).and_then(|w| {
                    let wv = mul_other(g, w, cv)?;
                    let ty = g.tensor(g.nodes[w].outputs[0])?;
                    (is_weight(g, wv, cols, &dt) && ty.dtype == dt && ty.shape == txf.shape)
                        .then_some((w, wv))
                });
                match mul {
                    Some((w, wv)) => {
                        core.push(c);
                        (w, Scale::Weight, true, Some(wv))
                    }
                    None => (c, Scale::None, false, None),
                }
            }
            // n · s in fp32, then one cast to the dtype (none for fp32).
            Some(t) if mul_other(g, t, nv).is_some() => {
                let s = mul_other(g, t, nv)?;
                let (scale, w, prep) = self.scale(s, cols, &dt)?;
                let tt = g.tensor(g.nodes[t].outputs[0])?;
                if tt.dtype != "f32" || tt.shape != txf.shape {
                    return None;
                }
                extra.extend(prep);
                // The cast back to x's dtype ends the norm, except in fp32, where it is a view
                // (`rules::views`) that the norm's reader reads through: Gemma's final norm ends in
                // `type_as`, which the lm_head's GEMM takes as its operand's view.
                let end = match self.only_reader(t).filter(|&c| cast_to(g, c, &dt)) {
                    Some(c) if dt != "f32" => {
                        core.push(t);
                        c
                    }
                    _ if dt == "f32" => t,
                    _ => return None,
                };
                (end, scale, false, Some(w))
            }
            _ if dt == "f32" => (n, Scale::None, false, None),
            _ => return None,
        };
        core.retain(|&c| c != end);
        let mut inside: BTreeSet<NodeId> = core.iter().copied().collect();
        inside.insert(end);
        if core.iter().any(|&c| !self.owned(c, &inside)) {
            return None;
        }
        // The upcast and the weight's cast and offset, where nothing else reads them (the
        // offset first: the cast is owned once the offset is).
        for &e in extra.iter().rev().chain(upcast.iter()) {
            let mut with = inside.clone();
            with.insert(e);
            if self.owned(e, &with) {
                inside = with;
            }
        }
        let ty = g.tensor(g.nodes[end].outputs[0])?;
        if ty.dtype != dt || ty.shape != txf.shape {
            return None;
        }
        let rows = rows(&txf.shape);
        inside.remove(&end);
        (rows > 0 && cols > 0).then(|| RmsNormMatch {
            node: end,
            rest: inside.into_iter().collect(),
            x,
            weight,
            eps: Some(eps),
            spelling: Spelling::Written,
            problem: RmsNormProblem::new(rows, cols, dtype, scale, cast_first),
            add: None,
        })
    }
}

#[cfg(test)]
mod tests;
