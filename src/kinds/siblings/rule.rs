//! Sibling-linears rule: `siblings_rcr[_bias]`.
//!
//! y_i[m,n] = Σ_k x[m,k]·W_i[n,k] (+ b_i[n]) for two to `MAX_SIBLINGS` `aten::linear` nodes that
//! read the same value x [.., K] (M rows: its leading dims): Hugging Face's q, k and v projections
//! (Llama, Qwen2, Mistral, BERT, OPT's k and v). One GEMM over the weights concatenated along N
//! computes them all, x read once. Each weight (and bias, present in all or none) is a module
//! parameter read through `prim::GetAttr`, because compose concatenates them once into a buffer of
//! the composed module; all of x's dtype, packed, each N_i and K whole 16-byte vectors (each
//! output starts a 16-byte vector of the fused row).
//!
//! The op returns each y_i as a view of the fused output [.., ΣN] (row stride ΣN), so every reader
//! of a y_i must take such a view: the rule admits only `view`, `reshape` and `_unsafe_view` to a
//! shape that keeps x's rows whole (`[B, T, H, D]` from `[B, T, H·D]`), which a row-strided tensor
//! takes without a copy, besides `aten::size` reads (the y_i has the linear's shape), and no y_i
//! the graph returns. A linear whose GEMM takes an elementwise
//! epilogue (OPT's scaled q, a gate before its activation) is left to the GEMM kind: the group
//! would take its products but leave the epilogue to torch.
//!
//! The group holds several GEMMs, so the cover takes it before each member's plain GEMM match; the
//! kind is off unless compose is asked (`--fuse-siblings`, `registry::MatchOptions`).

use super::problem::{SiblingsProblem, MAX_SIBLINGS};
use super::SIBLINGS;
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::kinds::gemm::GemmMatch;
use crate::rules::{boxed, views, Match, PatternKind, Rule};
use crate::types::DType;
use std::collections::BTreeSet;

#[derive(Clone, Debug, PartialEq)]
pub struct SiblingsMatch {
    /// The linears, in graph order: the op's outputs in this order.
    pub linears: Vec<NodeId>,
    pub x: ValueId,
    /// Each linear's weight (and bias, where they have them), in the same order.
    pub weights: Vec<ValueId>,
    pub biases: Vec<ValueId>,
    pub problem: SiblingsProblem,
}

impl Match for SiblingsMatch {
    fn nodes(&self) -> Vec<NodeId> {
        self.linears.clone()
    }
}

/// The sibling-linears rule.
pub struct SiblingsRule;

impl Rule for SiblingsRule {
    fn name(&self) -> &'static str {
        "siblings"
    }
    fn kind(&self) -> PatternKind {
        SIBLINGS
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_siblings(g))
    }
}

/// One linear that may join a group: its node, x, weight, bias and N.
#[derive(Clone, Copy, Debug)]
struct Linear {
    node: NodeId,
    x: ValueId,
    w: ValueId,
    b: Option<ValueId>,
    n: i64,
}

/// Every group of sibling linears of the top-level block.
pub fn match_siblings(g: &Graph) -> Vec<SiblingsMatch> {
    let readers = g.readers();
    let fused = with_epilogue(g);
    let linears: Vec<Linear> = (0..g.nodes.len())
        .filter(|n| !fused.contains(n))
        .filter_map(|n| linear(g, &readers, n))
        .collect();
    let outputs: BTreeSet<ValueId> = linears.iter().map(|l| g.nodes[l.node].outputs[0]).collect();
    let mut groups: Vec<Vec<Linear>> = Vec::new();
    for l in linears {
        // A linear reading another's output (through views) is not its sibling.
        if outputs.contains(&views::source(g, l.x)) {
            continue;
        }
        match groups
            .iter_mut()
            .find(|grp| grp[0].x == l.x && grp[0].b.is_some() == l.b.is_some())
        {
            Some(grp) => grp.push(l),
            None => groups.push(vec![l]),
        }
    }
    groups
        .iter()
        .flat_map(|grp| grp.chunks(MAX_SIBLINGS))
        .filter(|grp| grp.len() >= 2)
        .filter_map(|grp| group(g, grp))
        .collect()
}

/// The linears whose GEMM takes an elementwise epilogue (the GEMM kind's epilogue matches).
fn with_epilogue(g: &Graph) -> BTreeSet<NodeId> {
    crate::kinds::gemm::EpilogueRule
        .find(g)
        .into_iter()
        .filter_map(|m| {
            let any: &dyn std::any::Any = &*m;
            any.downcast_ref::<GemmMatch>()
                .filter(|e| e.epilogue.is_some())
                .map(|e| e.node)
        })
        .collect()
}

/// Whether `shape` regroups x's `rows` rows of `n` elements without splitting or merging a row:
/// its leading dims hold the rows, its trailing ones the row.
fn keeps_rows(shape: &[i64], rows: i64, n: i64) -> bool {
    (0..=shape.len()).any(|j| {
        shape[..j].iter().product::<i64>() == rows && shape[j..].iter().product::<i64>() == n
    })
}

/// Node `n` as a linear that may join a group, or None.
fn linear(g: &Graph, readers: &[Vec<NodeId>], n: NodeId) -> Option<Linear> {
    let node = &g.nodes[n];
    if node.kind != "aten::linear"
        || node.depth != 0
        || node.inputs.len() != 3
        || node.outputs.len() != 1
    {
        return None;
    }
    let (x, w, out) = (node.inputs[0], node.inputs[1], node.outputs[0]);
    let tx = g.tensor(x)?;
    let dtype = DType::parse(&tx.dtype)?;
    let vector = 16 / dtype.bytes() as i64;
    let k = *tx.shape.last()?;
    let rows: i64 = tx.shape[..tx.shape.len() - 1].iter().product();
    if !tx.is_packed() || k <= 0 || rows <= 0 || k % vector != 0 {
        return None;
    }
    let tw = g.tensor(w)?;
    let nw = *tw.shape.first()?;
    if tw.shape != [nw, k] || tw.dtype != tx.dtype || !tw.is_packed() || !g.is_attribute(w) {
        return None;
    }
    if nw <= 0 || nw % vector != 0 {
        return None;
    }
    let b = match g.constant(node.inputs[2]) {
        Some(Const::None) => None,
        _ => {
            let b = node.inputs[2];
            let tb = g.tensor(b)?;
            if tb.shape != [nw] || tb.dtype != tx.dtype || !g.is_attribute(b) {
                return None;
            }
            Some(b)
        }
    };
    let ty = g.tensor(out)?;
    let mut want = tx.shape.clone();
    *want.last_mut()? = nw;
    if ty.shape != want || ty.dtype != tx.dtype || g.outputs.contains(&out) {
        return None;
    }
    let row_view = |r: NodeId| {
        let rn = &g.nodes[r];
        matches!(
            rn.kind.as_str(),
            "aten::view" | "aten::reshape" | "aten::_unsafe_view"
        ) && rn.inputs[0] == out
            && !rn.inputs[1..].contains(&out)
            && rn.outputs.len() == 1
            && g.tensor(rn.outputs[0])
                .is_some_and(|t| keeps_rows(&t.shape, rows, nw))
    };
    // GPT-J sizes each projection before its view (`tensor.size()[:-1] + (heads, dim)`): the op's
    // view of the fused output has the linear's shape, so a size read of it reads the same.
    let size_read = |r: NodeId| {
        let rn = &g.nodes[r];
        rn.kind == "aten::size" && rn.inputs.first() == Some(&out) && !rn.inputs[1..].contains(&out)
    };
    let views = readers[out].iter().filter(|&&r| row_view(r)).count();
    if views == 0 || !readers[out].iter().all(|&r| row_view(r) || size_read(r)) {
        return None;
    }
    Some(Linear {
        node: n,
        x,
        w,
        b,
        n: nw,
    })
}

fn group(g: &Graph, grp: &[Linear]) -> Option<SiblingsMatch> {
    let tx = g.tensor(grp[0].x)?;
    let dtype = DType::parse(&tx.dtype)?;
    let k = *tx.shape.last()?;
    let m: i64 = tx.shape[..tx.shape.len() - 1].iter().product();
    Some(SiblingsMatch {
        linears: grp.iter().map(|l| l.node).collect(),
        x: grp[0].x,
        weights: grp.iter().map(|l| l.w).collect(),
        biases: grp.iter().filter_map(|l| l.b).collect(),
        problem: SiblingsProblem {
            m,
            k,
            widths: grp.iter().map(|l| l.n).collect(),
            dtype,
            bias: grp[0].b.is_some(),
        },
    })
}

#[cfg(test)]
pub(crate) mod tests;
