//! Transparent nodes: the normalisation every rule reads the graph through. Real models put
//! shape-only ops between the ops that matter (GPT-2's `Conv1D` is `view → addmm → view`, eval
//! `dropout` and `contiguous` sit everywhere); a rule asks `pass` of a node and walks values back
//! with `back`, so it stays about its math and the spellings live here, once.
//!
//! A node is transparent when its output holds its operand's elements in the same row-major order
//! (`Pass::Same`): `view`, `reshape`, `_unsafe_view`, `flatten`, `unsqueeze`, `squeeze`,
//! `view_as` and `reshape_as` of a packed tensor (no copy, no reordering); `contiguous` of a packed
//! tensor; a `slice` that keeps every element (start 0, step 1: GPT-J writes `x[:, :, :, :r]` as
//! one such slice per leading dim); `to` and `type_as` to the dtype the tensor has, without a copy and without naming a
//! device; eval dropout (`train=False`); `detach` and `alias`. Or when it repeats its operand
//! (`Pass::Broadcast`: `expand`, `expand_as`, `broadcast_to`), which a rule reads through only where
//! its kernel broadcasts the operand itself (an epilogue's row vector or scalar).
//!
//! Not transparent: a dtype change, a reordering (transpose, permute), a copy asked for (`clone`,
//! `to(copy=True)`), a `to` that names a device (the graph does not say where tensors live), train
//! dropout, and anything inside control flow. `to`/`type_as` are read at the dtypes the graph was
//! traced with: the tensors' dtypes are the trace's.
//!
//! A transparent node moves no bytes, so the cover counts no traffic for it. A match that reads
//! through one owns it where nothing outside the match reads its output (`Readers::owned`: the
//! rewrite removes it), and leaves it in the graph otherwise.

use crate::graph::{Const, Graph, NodeId, ValueId};
use std::collections::BTreeSet;

/// What a transparent node passes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Its operand's elements in the same row-major order, the shape perhaps spelled otherwise
    /// (same dtype, same number of elements).
    Same,
    /// Its operand repeated along new or size-one dims (same dtype).
    Broadcast,
}

/// How node `id` passes its first operand on, if it is transparent (see the module doc).
pub fn pass(g: &Graph, id: NodeId) -> Option<Pass> {
    let n = &g.nodes[id];
    if n.depth != 0 || n.outputs.len() != 1 || n.inputs.is_empty() {
        return None;
    }
    let kind = n.kind.strip_prefix("aten::")?;
    let (x, y) = (g.tensor(n.inputs[0])?, g.tensor(n.outputs[0])?);
    if x.dtype != y.dtype {
        return None;
    }
    let cst = |i: usize| n.inputs.get(i).and_then(|&v| g.constant(v));
    let respells = x.numel() == y.numel() && x.is_packed();
    let identity = x.shape == y.shape;
    let same = match kind {
        "view" | "reshape" | "_unsafe_view" | "flatten" | "unsqueeze" | "squeeze" | "view_as"
        | "reshape_as" => respells,
        // contiguous_format (0) of a packed tensor returns the tensor itself.
        "contiguous" => {
            respells && identity && (n.inputs.len() < 2 || matches!(cst(1), Some(Const::Int(0))))
        }
        "dropout"
        | "dropout_"
        | "feature_dropout"
        | "feature_dropout_"
        | "alpha_dropout"
        | "alpha_dropout_"
        | "feature_alpha_dropout"
        | "feature_alpha_dropout_" => identity && matches!(cst(2), Some(Const::Bool(false))),
        "detach" | "alias" | "type_as" => identity,
        "slice" => {
            identity
                && matches!(cst(2), Some(Const::Int(0)))
                && matches!(cst(4), Some(Const::Int(1)))
        }
        "to" => identity && to_keeps(g, id, x.is_packed()),
        "expand" | "expand_as" | "broadcast_to" => return Some(Pass::Broadcast),
        _ => false,
    };
    same.then_some(Pass::Same)
}

/// Whether an `aten::to` of a tensor whose dtype it keeps returns the tensor itself: no copy, no
/// device named, no memory format that reorders. The overloads, by their operands:
/// `to.dtype(self, dtype, non_blocking, copy, memory_format)`, `to.other(self, other, non_blocking,
/// copy, memory_format)`, `to.dtype_layout(self, dtype, layout, device, pin_memory, non_blocking,
/// copy, memory_format)`, `to.prim_dtype(self, dtype, non_blocking, copy)`,
/// `to.prim_Device(self, device, dtype, non_blocking, copy)`; `to.device` names a device.
fn to_keeps(g: &Graph, id: NodeId, packed: bool) -> bool {
    let n = &g.nodes[id];
    let cst = |i: usize| n.inputs.get(i).and_then(|&v| g.constant(v));
    let no = |i: usize| matches!(cst(i), Some(Const::Bool(false)));
    let none = |i: usize| matches!(cst(i), Some(Const::None));
    // None or preserve_format (1) keep the strides; contiguous_format (0) keeps a packed tensor's.
    let format = |i: usize| {
        matches!(cst(i), Some(Const::None | Const::Int(1)))
            || (packed && matches!(cst(i), Some(Const::Int(0))))
    };
    let other_tensor = g.constant(n.inputs[1]).is_none() && g.tensor(n.inputs[1]).is_some();
    match n.inputs.len() {
        5 if other_tensor => no(3) && format(4),
        5 if matches!(cst(1), Some(Const::Int(_))) => no(3) && format(4),
        5 => none(1) && no(4),
        4 => no(3),
        8 => none(3) && no(6) && format(7),
        _ => false,
    }
}

/// Node `id` as a cast of its first operand to an element type (its own or another), keeping
/// the shape: `to` with a dtype and no device named, or `type_as`; the value it casts. A cast to
/// another dtype is no transparent node (it rounds where it narrows): a rule reads through one
/// only where its kernel rounds as the cast does, and checks the dtypes itself.
pub fn dtype_cast(g: &Graph, id: NodeId) -> Option<ValueId> {
    let n = &g.nodes[id];
    if n.depth != 0 || n.outputs.len() != 1 {
        return None;
    }
    let x = *n.inputs.first()?;
    if g.tensor(x)?.shape != g.tensor(n.outputs[0])?.shape {
        return None;
    }
    let cst = |i: usize| n.inputs.get(i).and_then(|&v| g.constant(v));
    let cast = match n.kind.as_str() {
        "aten::type_as" => n.inputs.len() == 2,
        // to.dtype / to.other (5), to.prim_dtype (4), to.dtype_layout with no device (8).
        "aten::to" => match n.inputs.len() {
            4 | 5 => !matches!(cst(1), Some(Const::Str(_)) | Some(Const::Other(_))),
            8 => matches!(cst(3), Some(Const::None)),
            _ => false,
        },
        _ => false,
    };
    cast.then_some(x)
}

/// One transparent node a value comes through: the node, how it passes, and the value it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub node: NodeId,
    pub pass: Pass,
    pub from: ValueId,
}

/// The transparent nodes `v` comes through, nearest first: `v`'s producer when it is one, then
/// the producer of that node's operand, and so on.
pub fn back(g: &Graph, v: ValueId) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut at = v;
    while let Some(node) = g.values[at].producer {
        let Some(pass) = pass(g, node) else { break };
        let from = g.nodes[node].inputs[0];
        steps.push(Step { node, pass, from });
        at = from;
    }
    steps
}

/// The value `v` respells: the far end of the `Pass::Same` nodes it comes through (`v` itself
/// when its producer is none). What a rule asks when it needs the tensor behind a view.
pub fn source(g: &Graph, v: ValueId) -> ValueId {
    back(g, v)
        .iter()
        .take_while(|s| s.pass == Pass::Same)
        .last()
        .map_or(v, |s| s.from)
}

/// Who reads each value, and what the graph returns: whether a value is seen outside a match.
pub struct Readers {
    users: Vec<Vec<NodeId>>,
    returned: BTreeSet<ValueId>,
}

impl Readers {
    pub fn of(g: &Graph) -> Readers {
        Readers {
            users: g.readers(),
            returned: g.outputs.iter().copied().collect(),
        }
    }

    /// The nodes outside `inside` that read `v`, in program order.
    pub fn outside<'a>(
        &'a self,
        v: ValueId,
        inside: &'a BTreeSet<NodeId>,
    ) -> impl Iterator<Item = NodeId> + 'a {
        self.users[v]
            .iter()
            .copied()
            .filter(|u| !inside.contains(u))
    }

    /// The nodes that read `v`, in program order.
    pub fn of_value(&self, v: ValueId) -> &[NodeId] {
        &self.users[v]
    }

    /// Whether a node outside `inside` reads `v`, or the graph returns it.
    pub fn escapes(&self, v: ValueId, inside: &BTreeSet<NodeId>) -> bool {
        self.returned.contains(&v) || self.users[v].iter().any(|u| !inside.contains(u))
    }

    /// The nodes of `steps` (transparent nodes a match reads through) that a match of the nodes
    /// `inside` owns: those whose output only the match and the steps it owns read, in program
    /// order. A step read from outside stays in the graph, and so do the steps it reads through.
    pub fn owned(&self, g: &Graph, inside: &BTreeSet<NodeId>, steps: &[NodeId]) -> Vec<NodeId> {
        let mut order: Vec<NodeId> = steps.to_vec();
        order.sort_unstable();
        order.dedup();
        let mut held = inside.clone();
        let mut owned = Vec::new();
        // Latest first: a step's readers come after it, so each is decided once they are.
        for &s in order.iter().rev() {
            if held.contains(&s) {
                continue;
            }
            if g.nodes[s].outputs.iter().all(|&o| !self.escapes(o, &held)) {
                held.insert(s);
                owned.push(s);
            }
        }
        owned.reverse();
        owned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(text: &str) -> Graph {
        Graph::parse(text).unwrap()
    }

    fn node(g: &Graph, name: &str) -> NodeId {
        let v = g.values.iter().position(|v| v.name == name).unwrap();
        g.values[v].producer.unwrap()
    }

    fn passes(g: &Graph, name: &str) -> Option<Pass> {
        pass(g, node(g, name))
    }

    #[test]
    fn shape_only_ops_of_packed_tensors_are_transparent() {
        let g = graph(
            "graph(%x: f32[2,8,16], %t: f32[8,2,16]{16,128,1}):
               %m1 = prim::Constant[-1]()
               %c16 = prim::Constant[16]()
               %zero = prim::Constant[0]()
               %one = prim::Constant[1]()
               %two = prim::Constant[2]()
               %shape = prim::ListConstruct(%m1, %c16)
               %v = aten::view(%x, %shape) : f32[16,16]
               %r = aten::reshape(%x, %shape) : f32[16,16]
               %u = aten::_unsafe_view(%x, %shape) : f32[16,16]
               %f = aten::flatten(%x, %zero, %one) : f32[16,16]
               %un = aten::unsqueeze(%x, %zero) : f32[1,2,8,16]
               %sq = aten::squeeze(%un, %zero) : f32[2,8,16]
               %c = aten::contiguous(%x, %zero) : f32[2,8,16]
               %ct = aten::contiguous(%t, %zero) : f32[8,2,16]
               %rt = aten::reshape(%t, %shape) : f32[16,16]
               %ut = aten::unsqueeze(%t, %zero) : f32[1,8,2,16]{256,16,128,1}
               %cl = aten::contiguous(%x, %two) : f32[2,8,16]
               return (%v, %r, %u, %f, %sq, %c, %ct, %rt, %ut, %cl)",
        );
        for name in ["v", "r", "u", "f", "un", "sq", "c"] {
            assert_eq!(passes(&g, name), Some(Pass::Same), "{name}");
        }
        // Of a transposed tensor: contiguous and reshape copy, a view would reorder.
        for name in ["ct", "rt", "ut"] {
            assert_eq!(passes(&g, name), None, "{name}");
        }
        assert_eq!(passes(&g, "cl"), None, "channels_last reorders");
    }

    #[test]
    fn identities_keep_dtype_device_and_storage() {
        let g = graph(
            "graph(%x: f32[4,8], %y: f32[4,8], %h: bf16[4,8]):
               %none = prim::Constant[None]()
               %f = prim::Constant[False]()
               %t = prim::Constant[True]()
               %p = prim::Constant[0.1]()
               %f32 = prim::Constant[6]()
               %bf16 = prim::Constant[15]()
               %cpu = prim::Constant[cpu]()
               %d = aten::dropout(%x, %p, %f) : f32[4,8]
               %dt = aten::dropout(%x, %p, %t) : f32[4,8]
               %det = aten::detach(%x) : f32[4,8]
               %to = aten::to(%x, %f32, %f, %f, %none) : f32[4,8]
               %tocopy = aten::to(%x, %f32, %f, %t, %none) : f32[4,8]
               %tobf = aten::to(%x, %bf16, %f, %f, %none) : bf16[4,8]
               %tolayout = aten::to(%x, %f32, %none, %none, %none, %f, %f, %none) : f32[4,8]
               %todev = aten::to(%x, %f32, %none, %cpu, %none, %f, %f, %none) : f32[4,8]
               %todevice = aten::to(%x, %cpu, %f32, %f, %f, %none) : f32[4,8]
               %toother = aten::to(%x, %y, %f, %f, %none) : f32[4,8]
               %ta = aten::type_as(%x, %y) : f32[4,8]
               %tah = aten::type_as(%x, %h) : bf16[4,8]
               return (%d, %dt, %det, %to, %tocopy, %tobf, %tolayout, %todev, %todevice, %toother, %ta, %tah)",
        );
        for name in ["d", "det", "to", "tolayout", "toother", "ta"] {
            assert_eq!(passes(&g, name), Some(Pass::Same), "{name}");
        }
        for name in ["dt", "tocopy", "tobf", "todev", "todevice", "tah"] {
            assert_eq!(passes(&g, name), None, "{name}");
        }
    }

    #[test]
    fn a_slice_that_keeps_every_element_is_transparent() {
        // GPT-J's `k[:, :, :, : self.rotary_dim]`: a full slice of each leading dim, then the cut.
        let g = graph(
            "graph(%x: f32[1,8,4,16]):
               %zero = prim::Constant[0]()
               %one = prim::Constant[1]()
               %two = prim::Constant[2]()
               %three = prim::Constant[3]()
               %eight = prim::Constant[8]()
               %max = prim::Constant[9223372036854775807]()
               %a = aten::slice(%x, %zero, %zero, %max, %one) : f32[1,8,4,16]
               %b = aten::slice(%a, %one, %zero, %max, %one) : f32[1,8,4,16]
               %cut = aten::slice(%b, %three, %zero, %eight, %one) : f32[1,8,4,8]{512,64,16,1}
               %odd = aten::slice(%b, %three, %zero, %max, %two) : f32[1,8,4,8]{512,64,16,2}
               %late = aten::slice(%b, %one, %one, %max, %one) : f32[1,7,4,16]
               return (%cut, %odd, %late)",
        );
        assert_eq!(passes(&g, "a"), Some(Pass::Same));
        assert_eq!(passes(&g, "b"), Some(Pass::Same));
        for name in ["cut", "odd", "late"] {
            assert_eq!(passes(&g, name), None, "{name}");
        }
        let cut = g.nodes[node(&g, "cut")].inputs[0];
        assert_eq!(g.values[source(&g, cut)].name, "x");
    }

    #[test]
    fn expand_is_a_broadcast_and_back_walks_to_the_source() {
        let g = graph(
            "graph(%b: f32[32], %x: f32[2,8,16]):
               %one = prim::Constant[1]()
               %m1 = prim::Constant[-1]()
               %c32 = prim::Constant[32]()
               %c16 = prim::Constant[16]()
               %f = prim::Constant[False]()
               %s3 = prim::ListConstruct(%one, %one, %c32)
               %b3 = aten::view(%b, %s3) : f32[1,1,32]
               %size = prim::ListConstruct(%m1, %m1, %c32)
               %e = aten::expand(%b3, %size, %f) : f32[2,8,32]{0,0,1}
               %s2 = prim::ListConstruct(%m1, %c16)
               %x2 = aten::view(%x, %s2) : f32[16,16]
               %r = aten::relu(%x2) : f32[16,16]
               return (%e, %r)",
        );
        let e = g.outputs[0];
        let steps = back(&g, e);
        assert_eq!(
            steps.iter().map(|s| s.pass).collect::<Vec<_>>(),
            [Pass::Broadcast, Pass::Same]
        );
        assert_eq!(g.values[steps[1].from].name, "b");
        // source stops at the broadcast: the expanded tensor is no respelling of the bias.
        assert_eq!(g.values[source(&g, e)].name, "e");
        let x2 = g.nodes[node(&g, "r")].inputs[0];
        assert_eq!(g.values[source(&g, x2)].name, "x");
        assert!(back(&g, g.inputs[0]).is_empty());
    }

    #[test]
    fn a_match_owns_the_steps_nothing_else_reads() {
        // x → view → contiguous → relu, the view also read by a sum.
        let g = graph(
            "graph(%x: f32[2,8,16]):
               %m1 = prim::Constant[-1]()
               %c16 = prim::Constant[16]()
               %zero = prim::Constant[0]()
               %none = prim::Constant[None]()
               %s = prim::ListConstruct(%m1, %c16)
               %v = aten::view(%x, %s) : f32[16,16]
               %c = aten::contiguous(%v, %zero) : f32[16,16]
               %r = aten::relu(%c) : f32[16,16]
               %t = aten::sum(%v, %none) : f32[]
               return (%r, %t)",
        );
        let readers = Readers::of(&g);
        let (v, c, r) = (node(&g, "v"), node(&g, "c"), node(&g, "r"));
        let inside = BTreeSet::from([r]);
        assert_eq!(readers.owned(&g, &inside, &[v, c]), [c]);
        let mut g2 = g.clone();
        g2.nodes.pop();
        g2.outputs.pop();
        assert_eq!(Readers::of(&g2).owned(&g2, &inside, &[c, v]), [v, c]);
        assert!(readers.escapes(g.nodes[v].outputs[0], &BTreeSet::from([c, r])));
    }
}
