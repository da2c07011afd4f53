//! The ops norms are written out in (Hugging Face's RMSNorms, Cohere's LayerNorm), read the same
//! way by every norm kind's written spelling: a mean over the last dim, a square, a product's
//! other operand, a cast to a dtype.

use super::views;
use crate::graph::{Const, Graph, NodeId, ValueId};

/// A number constant (int, float or one-element tensor).
pub fn number(g: &Graph, v: ValueId) -> Option<f64> {
    g.constant(v).and_then(Const::as_f64)
}

/// Node `n` as `mean(x, [-1], keepdim=True, dtype=None)` over x's last dim (named -1 or by its
/// index): x.
pub fn mean_last(g: &Graph, n: NodeId) -> Option<ValueId> {
    let mean = &g.nodes[n];
    if mean.kind != "aten::mean" || mean.inputs.len() != 4 || mean.outputs.len() != 1 {
        return None;
    }
    let x = mean.inputs[0];
    let rank = g.tensor(x)?.shape.len() as i64;
    let dims = g.int_list(mean.inputs[1])?;
    ((dims == [-1] || dims == [rank - 1])
        && g.constant(mean.inputs[2]) == Some(&Const::Bool(true))
        && g.constant(mean.inputs[3]) == Some(&Const::None))
    .then_some(x)
}

/// `v` as a square, `pow(x, 2)` or `mul(x, x)`: its node and x.
pub fn square_of(g: &Graph, v: ValueId) -> Option<(NodeId, ValueId)> {
    let p = g.values[v].producer?;
    let pn = &g.nodes[p];
    let x = match pn.kind.as_str() {
        "aten::pow" if pn.inputs.len() == 2 && number(g, pn.inputs[1]) == Some(2.0) => pn.inputs[0],
        "aten::mul" if pn.inputs.len() == 2 && pn.inputs[0] == pn.inputs[1] => pn.inputs[0],
        _ => return None,
    };
    Some((p, x))
}

/// The other operand of a two-operand `mul` node `n` that reads `v` on one side.
pub fn mul_other(g: &Graph, n: NodeId, v: ValueId) -> Option<ValueId> {
    let node = &g.nodes[n];
    if node.kind != "aten::mul" || node.inputs.len() != 2 || node.outputs.len() != 1 {
        return None;
    }
    match (node.inputs[0] == v, node.inputs[1] == v) {
        (true, false) => Some(node.inputs[1]),
        (false, true) => Some(node.inputs[0]),
        _ => None,
    }
}

/// Node `n` as a dtype cast to `dtype` of its first operand, keeping the shape
/// (`views::dtype_cast`).
pub fn cast_to(g: &Graph, n: NodeId, dtype: &str) -> bool {
    views::dtype_cast(g, n).is_some()
        && g.tensor(g.nodes[n].outputs[0])
            .is_some_and(|y| y.dtype == dtype)
}
