//! Where a convolution's tensors lie in memory: the channels-last chain. The kernels read x and
//! the residual and write the output channels-last (NHWC memory under torch's logical NCHW
//! sizes). torch's elementwise ops, pooling, BatchNorm and its own convolutions keep an input's
//! memory format, so the output of one `fact::conv` reaches the next convolution channels-last
//! and is read in place: a chain converts where it starts (the first convolution's x, from an
//! NCHW producer) and nowhere between its convolutions.
//!
//! The chain must end before any reader that needs torch's default strides: `view` of a
//! channels-last tensor fails where the original's succeeded, and a caller may do the same with
//! what the graph returns. `nchw_reader` follows every reader of the op's output through the
//! ops that pass strides on and names the first one that is no such op and not known to read any
//! layout; there the op hands back NCHW (one conversion, the chain's end). The convolution
//! patterns compose substitutes (`Substituted`) read any layout and hand their own output back
//! as their readers need, so the walk stops at them; a convolution torch keeps passes its
//! input's layout on like any op that keeps it. An op this file does not know ends the chain: a
//! slower call, never a failing one. `x_source` walks back from a convolution's input the same
//! way, for the plan's count of conversions. Pure: graph in, facts out.

use crate::graph::{Graph, NodeId, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// The nodes of the convolution patterns compose substitutes, each mapped to its convolution
/// node: one `fact::conv` replaces them, which reads x and the residual in any layout and hands
/// its output back in the layout its own readers take.
pub type Substituted = BTreeMap<NodeId, NodeId>;

/// What an op does with the layout of a tensor it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Its output's strides follow its input's (elementwise ops, pooling, BatchNorm, torch's
    /// convolution, views that permute or merge dims): its own readers decide.
    Passes,
    /// It reads any strides and its output is laid out its own way (a GEMM, LayerNorm, an
    /// explicit `contiguous`, a shape query).
    Reads,
}

/// The role of an op kind, None where it may need torch's default strides (a `view`) or is none
/// this file knows.
fn role(kind: &str) -> Option<Role> {
    let Some(op) = kind.strip_prefix("aten::") else {
        return match kind {
            // A list of tensors goes on to its reader (`cat`).
            "prim::ListConstruct" => Some(Role::Passes),
            _ => None,
        };
    };
    let op = op.strip_suffix('_').unwrap_or(op);
    let passes = [
        "relu",
        "relu6",
        "silu",
        "hardswish",
        "hardsigmoid",
        "sigmoid",
        "tanh",
        "gelu",
        "leaky_relu",
        "hardtanh",
        "elu",
        "mish",
        "clamp",
        "clamp_min",
        "clamp_max",
        "neg",
        "add",
        "sub",
        "mul",
        "div",
        "dropout",
        "feature_dropout",
        "batch_norm",
        "_convolution",
        "conv2d",
        "max_pool2d",
        "avg_pool2d",
        "adaptive_avg_pool2d",
        "adaptive_max_pool2d",
        "upsample_nearest2d",
        "upsample_bilinear2d",
        "mean",
        "sum",
        "cat",
        "clone",
        "detach",
        "to",
        "type_as",
        "flatten",
        "reshape",
        "permute",
        "transpose",
    ];
    let reads = [
        "contiguous",
        "linear",
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "layer_norm",
        "softmax",
        "size",
        "dim",
    ];
    if passes.contains(&op) {
        Some(Role::Passes)
    } else if reads.contains(&op) {
        Some(Role::Reads)
    } else {
        None
    }
}

/// The first reader (in program order, depth first) of `v` that may need torch's default
/// strides, described for the plan (`aten::view`, `the graph's output`), or None where every
/// reader takes `v` channels-last.
pub fn nchw_reader(
    g: &Graph,
    readers: &[Vec<NodeId>],
    subs: &Substituted,
    v: ValueId,
) -> Option<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![v];
    while let Some(v) = todo.pop() {
        if !seen.insert(v) {
            continue;
        }
        if g.outputs.contains(&v) {
            return Some("the graph's output".into());
        }
        for &r in &readers[v] {
            let node = &g.nodes[r];
            match role(&node.kind) {
                _ if subs.contains_key(&r) || pooled_view(g, r, v) => {}
                _ if node.depth > 0 => return Some(format!("{} inside a block", node.kind)),
                Some(Role::Reads) => {}
                Some(Role::Passes) => todo.extend(node.outputs.iter().rev()),
                None => return Some(node.kind.clone()),
            }
        }
    }
    None
}

/// Whether node `r` views `v`, a 4-D tensor of one pixel ([N,C,1,1], a global pool's output),
/// as `[N, C]` or the like: its channels-last strides and torch's default ones differ only
/// along dims of size one, which a view ignores (`x.view(x.size(0), -1)` after pooling).
fn pooled_view(g: &Graph, r: NodeId, v: ValueId) -> bool {
    let node = &g.nodes[r];
    matches!(
        node.kind.as_str(),
        "aten::view" | "aten::_unsafe_view" | "aten::reshape" | "aten::flatten"
    ) && node.inputs.first() == Some(&v)
        && g.tensor(v)
            .is_some_and(|t| t.shape.len() == 4 && t.shape[2] == 1 && t.shape[3] == 1)
}

/// Where a convolution's input comes from, as far as its layout goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The output of the matched convolution at this node, channels-last (its chain's op writes
    /// channels-last and every reader takes it), through ops that keep its layout.
    Chain(NodeId),
    /// A tensor the graph itself lays out channels-last (its recorded strides: ConvNeXt's
    /// `permute` back from NHWC), made by this op: read in place.
    Strided(String),
    /// An NCHW tensor: the graph's input, or the output of this op (which makes its own layout
    /// or reads an NCHW tensor): the op converts it on every call.
    Nchw(String),
}

/// Whether the graph recorded `v`'s strides as channels-last for its 4-D shape (dims of size one
/// lie either way): the op reads such a tensor in place.
fn strided_channels_last(g: &Graph, v: ValueId) -> bool {
    let Some(t) = g.tensor(v) else { return false };
    if t.shape.len() != 4 || t.strides.len() != 4 {
        return false;
    }
    // NHWC order: C innermost, then W, H, N.
    let mut want = 1;
    for d in [1, 3, 2, 0] {
        if t.shape[d] != 1 && t.strides[d] != want {
            return false;
        }
        want *= t.shape[d];
    }
    true
}

/// The inputs that decide the layout of `node`'s output: those of its output's shape (an
/// elementwise op's; a broadcast operand does not decide it), else its first tensor input of the
/// output's rank (a pool's, torch's convolution's), and every tensor of a list.
fn layout_inputs(g: &Graph, node: NodeId) -> Vec<ValueId> {
    let n = &g.nodes[node];
    let tensors = || n.inputs.iter().copied().filter(|&i| g.tensor(i).is_some());
    if n.kind == "prim::ListConstruct" {
        return tensors().collect();
    }
    let Some(out) = n.outputs.first().and_then(|&o| g.tensor(o)) else {
        // A list's reader (`cat`): the list decides.
        return n.inputs.first().copied().into_iter().collect();
    };
    let same: Vec<ValueId> = tensors()
        .filter(|&i| g.tensor(i).map(|t| &t.shape) == Some(&out.shape))
        .collect();
    if !same.is_empty() {
        return same;
    }
    let first = n.inputs.first().copied();
    match first.and_then(|i| g.tensor(i)) {
        Some(t) if t.shape.len() == out.shape.len() => first.into_iter().collect(),
        _ if first.is_some_and(|i| {
            g.values[i]
                .producer
                .is_some_and(|p| g.nodes[p].kind == "prim::ListConstruct")
        }) =>
        {
            first.into_iter().collect()
        }
        _ => vec![],
    }
}

/// Where `x` (a tensor a convolution reads) comes from: walking back through the ops that keep a
/// layout (`layout_inputs`) to matched convolutions whose chains stay channels-last, or to the
/// first op that does not.
pub fn x_source(g: &Graph, readers: &[Vec<NodeId>], subs: &Substituted, x: ValueId) -> Source {
    let mut todo = vec![x];
    let mut seen = BTreeSet::new();
    let mut from = None;
    while let Some(v) = todo.pop() {
        if !seen.insert(v) {
            continue;
        }
        let Some(p) = g.values[v].producer else {
            return Source::Nchw("the graph's input".into());
        };
        let node = &g.nodes[p];
        if v == x && !subs.contains_key(&p) && strided_channels_last(g, v) {
            return Source::Strided(node.kind.clone());
        }
        if let Some(&conv) = subs.get(&p) {
            if nchw_reader(g, readers, subs, v).is_some() {
                return Source::Nchw(format!(
                    "the convolution at node {conv}, whose output is handed back in NCHW"
                ));
            }
            from.get_or_insert(conv);
            continue;
        }
        // Views that move the channels (flatten, permute) lead to no convolution's x of NCHW
        // sizes in a layout the kernel reads.
        let keeps = matches!(role(&node.kind), Some(Role::Passes))
            && !matches!(
                node.kind.as_str(),
                "aten::flatten" | "aten::reshape" | "aten::permute" | "aten::transpose"
            );
        let inputs = layout_inputs(g, p);
        if !keeps || node.depth > 0 || inputs.is_empty() {
            return Source::Nchw(node.kind.clone());
        }
        todo.extend(inputs);
    }
    match from {
        Some(p) => Source::Chain(p),
        None => Source::Nchw("no convolution".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two bf16 convolutions, each with its BatchNorm and ReLU, and `between` (ops over %a1, the
    /// first chain's output, ending in %m) before the second; `after` reads the second's output
    /// %a2 and `ret` is returned.
    fn chain(between: &str, after: &str, ret: &str) -> Graph {
        Graph::parse(&format!(
            "graph(%self: M, %x: bf16[8,32,16,16]):
               %none = prim::Constant[None]()
               %f = prim::Constant[False]()
               %t = prim::Constant[True]()
               %one = prim::Constant[1]()
               %zero = prim::Constant[0]()
               %two = prim::Constant[2]()
               %three = prim::Constant[3]()
               %eps = prim::Constant[1e-05]()
               %mom = prim::Constant[0.1]()
               %l1 = prim::ListConstruct(%one, %one) : List_int_
               %l0 = prim::ListConstruct(%zero, %zero) : List_int_
               %l2 = prim::ListConstruct(%two, %two) : List_int_
               %l3 = prim::ListConstruct(%three, %three) : List_int_
               %m1 = prim::GetAttr[name=\"m1\"](%self) : Block
               %w1 = prim::GetAttr[name=\"w\"](%m1) : bf16[32,32,3,3]
               %g1 = prim::GetAttr[name=\"g\"](%m1) : bf16[32]
               %b1 = prim::GetAttr[name=\"b\"](%m1) : bf16[32]
               %mu1 = prim::GetAttr[name=\"mu\"](%m1) : bf16[32]
               %v1 = prim::GetAttr[name=\"v\"](%m1) : bf16[32]
               %wl = prim::GetAttr[name=\"wl\"](%self) : bf16[10,64]
               %m2 = prim::GetAttr[name=\"m2\"](%self) : Block
               %w2 = prim::GetAttr[name=\"w\"](%m2) : bf16[64,32,1,1]
               %g2 = prim::GetAttr[name=\"g\"](%m2) : bf16[64]
               %b2 = prim::GetAttr[name=\"b\"](%m2) : bf16[64]
               %mu2 = prim::GetAttr[name=\"mu\"](%m2) : bf16[64]
               %v2 = prim::GetAttr[name=\"v\"](%m2) : bf16[64]
               %y1 = aten::_convolution(%x, %w1, %none, %l1, %l1, %l1, %f, %l0, %one, %f, %f, %t, %t) : bf16[8,32,16,16]
               %n1 = aten::batch_norm(%y1, %g1, %b1, %mu1, %v1, %f, %mom, %eps, %t) : bf16[8,32,16,16]
               %a1 = aten::relu_(%n1) : bf16[8,32,16,16]
               {between}
               %y2 = aten::_convolution(%m, %w2, %none, %l1, %l0, %l1, %f, %l0, %one, %f, %f, %t, %t) : bf16[8,64,8,8]
               %n2 = aten::batch_norm(%y2, %g2, %b2, %mu2, %v2, %f, %mom, %eps, %t) : bf16[8,64,8,8]
               %a2 = aten::relu_(%n2) : bf16[8,64,8,8]
               {after}
               return ({ret})"
        ))
        .unwrap()
    }

    fn value(g: &Graph, name: &str) -> ValueId {
        g.values.iter().position(|v| v.name == name).unwrap()
    }

    /// Both chains substituted (each convolution with its BatchNorm and ReLU), or only those
    /// whose convolution's output is named in `only`.
    fn subs(g: &Graph, only: &[&str]) -> Substituted {
        let mut out = Substituted::new();
        for (y, n, a) in [("y1", "n1", "a1"), ("y2", "n2", "a2")] {
            if only.is_empty() || only.contains(&y) {
                for v in [y, n, a] {
                    out.insert(producer(g, v), producer(g, y));
                }
            }
        }
        out
    }

    fn reader(g: &Graph, s: &Substituted, v: &str) -> Option<String> {
        nchw_reader(g, &g.readers(), s, value(g, v))
    }

    fn source(g: &Graph, s: &Substituted, v: &str) -> Source {
        x_source(g, &g.readers(), s, value(g, v))
    }

    fn producer(g: &Graph, name: &str) -> NodeId {
        g.values[value(g, name)].producer.unwrap()
    }

    const POOL: &str = "%m = aten::max_pool2d(%a1, %l3, %l2, %l1, %l1, %f) : bf16[8,32,8,8]";
    const HEAD: &str = "%p = aten::adaptive_avg_pool2d(%a2, %l1) : bf16[8,64,1,1]
               %s = aten::flatten(%p, %one, %three) : bf16[8,64]
               %o = aten::linear(%s, %wl, %none) : bf16[8,10]";

    #[test]
    fn a_pool_between_two_convolutions_keeps_the_chain_channels_last() {
        let g = chain(POOL, HEAD, "%o");
        let both = subs(&g, &[]);
        // The first convolution reads the graph's NCHW input: one conversion where the chain
        // starts. The second reads the first's output through the pool: none.
        assert_eq!(
            source(&g, &both, "x"),
            Source::Nchw("the graph's input".into())
        );
        assert_eq!(source(&g, &both, "m"), Source::Chain(producer(&g, "y1")));
        // ConvNeXt's downsampling reads the permute back from NHWC, which the graph records with
        // channels-last strides.
        let g = chain(
            "%p = prim::ListConstruct(%zero, %two, %three, %one) : List_int_
               %nhwc = aten::permute(%a1, %p) : bf16[8,16,16,32]
               %q = prim::ListConstruct(%zero, %three, %one, %two) : List_int_
               %m = aten::permute(%nhwc, %q) : bf16[8,32,16,16]{8192,1,512,32}",
            HEAD,
            "%o",
        );
        assert_eq!(
            source(&g, &subs(&g, &[]), "m"),
            Source::Strided("aten::permute".into())
        );
        // Every reader of either output takes channels-last: the pool, the convolution, the
        // head's pooling, flatten and linear.
        assert_eq!(reader(&g, &both, "a1"), None);
        assert_eq!(reader(&g, &both, "a2"), None);
    }

    #[test]
    fn a_view_or_the_graphs_output_ends_the_chain_and_says_which() {
        let view = "%sz = prim::ListConstruct(%one, %one) : List_int_
               %o = aten::view(%a2, %sz) : bf16[8,4096]";
        let g = chain(POOL, view, "%o");
        let both = subs(&g, &[]);
        assert_eq!(reader(&g, &both, "a2").as_deref(), Some("aten::view"));
        // The second op hands the view NCHW, so the first's output stays channels-last...
        assert_eq!(reader(&g, &both, "a1"), None);
        // ...unless torch keeps the second convolution: torch's convolution keeps its input's
        // layout, so the first op hands back NCHW itself.
        let first = subs(&g, &["y1"]);
        assert_eq!(reader(&g, &first, "a1").as_deref(), Some("aten::view"));
        let g = chain(POOL, HEAD, "%o, %a2");
        assert_eq!(
            reader(&g, &subs(&g, &[]), "a2").as_deref(),
            Some("the graph's output")
        );
        // A view of the globally pooled output, as older CNNs write their head, takes either.
        let pooled = "%p = aten::adaptive_avg_pool2d(%a2, %l1) : bf16[8,64,1,1]
               %sz = prim::ListConstruct(%one, %one) : List_int_
               %o = aten::view(%p, %sz) : bf16[8,64]";
        let g = chain(POOL, pooled, "%o");
        assert_eq!(reader(&g, &subs(&g, &[]), "a2"), None);
        // A view of the pool's output between the two.
        let g = chain(
            &format!("{POOL}\n %sz = prim::ListConstruct(%one, %one) : List_int_\n %v = aten::view(%m, %sz) : bf16[8,2048]"),
            HEAD,
            "%o, %v",
        );
        let both = subs(&g, &[]);
        assert_eq!(reader(&g, &both, "a1").as_deref(), Some("aten::view"));
        assert_eq!(reader(&g, &both, "a2"), None);
        // A convolution whose output goes back to NCHW hands the next one an NCHW tensor.
        assert!(
            matches!(source(&g, &both, "m"), Source::Nchw(why) if why.contains("handed back in NCHW"))
        );
    }

    #[test]
    fn an_op_that_makes_its_own_layout_or_is_unknown_starts_a_new_chain() {
        let g = chain(
            "%m = aten::pixel_shuffle(%a1, %one) : bf16[8,32,8,8]",
            "",
            "%a2",
        );
        let both = subs(&g, &[]);
        assert_eq!(
            reader(&g, &both, "a1").as_deref(),
            Some("aten::pixel_shuffle")
        );
        assert_eq!(
            source(&g, &both, "m"),
            Source::Nchw("aten::pixel_shuffle".into())
        );
        // Torch's convolution over a channels-last tensor writes channels-last: a chain torch
        // keeps still comes from the substituted one before it.
        let g = chain(POOL, "", "%a2");
        let first = subs(&g, &["y1"]);
        assert_eq!(
            reader(&g, &first, "a1").as_deref(),
            Some("the graph's output")
        );
    }
}
