//! Rotary rules: `rotary_halves`, `rotary_pairs`, each with `_qk` when one kernel rotates q and k.
//!
//! For a head x[0..D) and its position's cos[0..R), sin[0..R) (R = rotary_dim ≤ D, even):
//! y[j] = x[j]·cos[j] + rot(x)[j]·sin[j] for j < R, and y[j] = x[j] for R ≤ j < D, where
//! - halves (`rotate_half`, Llama, Qwen2, GPT-NeoX): rot(x) = cat(−x[R/2..R), x[0..R/2)), so
//!   rot(x)[j] = −x[j + R/2] for j < R/2 and x[j − R/2] above;
//! - pairs (`rotate_every_two`, GPT-J, CodeGen): rot(x) = stack(−x[1::2], x[0::2], −1).flatten(−2),
//!   so rot(x)[2i] = −x[2i+1] and rot(x)[2i+1] = x[2i].
//!
//! The graph writes it as `add(mul(x_rot, cos), mul(rot(x_rot), sin))` (either operand order),
//! rot as the slices of x_rot's last dim, `neg` and `cat` (or `stack` and `flatten`). Partial
//! rotary cuts x_rot = x[..., :R] and x_pass = x[..., R:] and ends in `cat(y_rot, x_pass)`. Each
//! multiply and the add round to the tensors' dtype, which the kernel does too. cos and sin are
//! operands, whatever computes them (any position ids): tensors of x's dtype that broadcast to
//! x_rot's shape, with R elements along the last dim and one along the heads dim (dim 1 of
//! Llama's [B, H, T, D], dim 2 of GPT-J's [B, T, H, D]). Slice bounds are read from the shapes
//! (traces compute `x.shape[-1] // 2` at run time): x1 starts at 0, x2 runs to the end.
//!
//! q and k rotated by the same cos and sin values are one pattern (`_qk`): one kernel, two
//! outputs, the call placed where the second rotation was, so the first's readers must all come
//! after it. Each rotation alone is a pattern too; the cover prefers the pair (more traffic kept).

use super::{Form, RotaryProblem, ROTARY};
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::rules::views::{self, Readers};
use crate::rules::{boxed, Match, PatternKind, Rule};
use crate::types::DType;
use std::collections::BTreeSet;

/// One tensor's rotation as the graph writes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rotation {
    /// The tensor the op reads: all D of each head (the source behind views and full slices).
    pub x: ValueId,
    pub cos: ValueId,
    pub sin: ValueId,
    /// The node whose output is the rotated tensor: the add, or the partial form's final cat.
    pub out: NodeId,
    /// Every node the rotation replaces, in program order.
    pub nodes: Vec<NodeId>,
    pub form: Form,
    pub head_dim: i64,
    pub rotary_dim: i64,
    /// The graph's output is packed row-major (the partial form's cat); otherwise its rows are
    /// laid out in x's order, as torch's elementwise ops write them.
    pub contiguous: bool,
    /// x's [B, ?, ?, D] shape, and which of dims 1 and 2 holds the heads.
    pub shape: Vec<i64>,
    pub heads_dim: usize,
    pub dtype: DType,
}

impl Rotation {
    /// The problem of rotating this tensor (and `k`) in one kernel.
    fn problem(&self, k: Option<&Rotation>) -> RotaryProblem {
        RotaryProblem {
            batch: self.shape[0],
            heads_q: self.shape[self.heads_dim],
            heads_k: k.map_or(0, |k| k.shape[k.heads_dim]),
            seq: self.shape[3 - self.heads_dim],
            head_dim: self.head_dim,
            rotary_dim: self.rotary_dim,
            dtype: self.dtype,
            form: self.form,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct RotaryMatch {
    pub q: Rotation,
    /// k, rotated by the same cos and sin in the same kernel.
    pub k: Option<Rotation>,
    pub problem: RotaryProblem,
}

impl RotaryMatch {
    /// The op's `layout` operand: bit 0 when q's output is packed row-major, bit 1 for k's.
    pub fn layout(&self) -> i64 {
        self.q.contiguous as i64 | (self.k.as_ref().is_some_and(|k| k.contiguous) as i64) << 1
    }
}

impl Match for RotaryMatch {
    fn nodes(&self) -> Vec<NodeId> {
        let mut n = self.q.nodes.clone();
        if let Some(k) = &self.k {
            n.extend(&k.nodes);
        }
        n.sort_unstable();
        n
    }
}

/// The rotary rule.
pub struct RotaryRule;

impl Rule for RotaryRule {
    fn name(&self) -> &'static str {
        "rotary"
    }
    fn kind(&self) -> PatternKind {
        ROTARY
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_rotary(g))
    }
}

/// Every rotation of the top-level block alone, then each pair of rotations by the same cos and
/// sin that one call can replace (each rotation in at most one pair, paired with the next one
/// in program order).
pub fn match_rotary(g: &Graph) -> Vec<RotaryMatch> {
    let readers = Readers::of(g);
    let singles: Vec<Rotation> = (0..g.nodes.len())
        .filter(|&n| g.nodes[n].depth == 0 && g.nodes[n].kind == "aten::add")
        .filter_map(|n| rotation(g, &readers, n))
        .collect();
    let mut out: Vec<RotaryMatch> = singles
        .iter()
        .map(|r| RotaryMatch {
            q: r.clone(),
            k: None,
            problem: r.problem(None),
        })
        .collect();
    let users = g.readers();
    let mut paired = vec![false; singles.len()];
    for i in 0..singles.len() {
        if paired[i] {
            continue;
        }
        let Some(j) = (i + 1..singles.len())
            .find(|&j| !paired[j] && pairs_with(g, &users, &singles[i], &singles[j]))
        else {
            continue;
        };
        paired[i] = true;
        paired[j] = true;
        out.push(RotaryMatch {
            q: singles[i].clone(),
            k: Some(singles[j].clone()),
            problem: singles[i].problem(Some(&singles[j])),
        });
    }
    out
}

/// Whether one call in place of `b`'s output can compute `a` and `b`: the same cos and sin,
/// form and sizes but the heads, no node in both, and `a`'s output read only after `b`'s.
fn pairs_with(g: &Graph, users: &[Vec<NodeId>], a: &Rotation, b: &Rotation) -> bool {
    let same = same_value(g, a.cos, b.cos, SAME_DEPTH)
        && same_value(g, a.sin, b.sin, SAME_DEPTH)
        && a.form == b.form
        && a.head_dim == b.head_dim
        && a.rotary_dim == b.rotary_dim
        && a.dtype == b.dtype
        && a.heads_dim == b.heads_dim
        && a.shape[0] == b.shape[0]
        && a.shape[3 - a.heads_dim] == b.shape[3 - b.heads_dim];
    let disjoint = a.nodes.iter().all(|n| !b.nodes.contains(n));
    // The call goes where the later output was made: both outputs are read after it (the
    // graph's return comes after every node).
    let at = a.out.max(b.out);
    let later = [a.out, b.out].iter().all(|&o| {
        let v = g.nodes[o].outputs[0];
        users[v].iter().all(|&u| u > at)
    });
    same && disjoint && later
}

/// How far back `same_value` compares producers: GPT-J's cos is five nodes from the value q's
/// and k's share.
const SAME_DEPTH: usize = 8;

/// Whether `a` and `b` hold the same values by construction: one value, equal constants, or the
/// same output of nodes of one kind over inputs that are so in turn (`depth` levels back). GPT-J's
/// `apply_rotary_pos_emb` recomputes `repeat_interleave(sin[:, :, None, :], 2, 3)` for q and for
/// k from one sin, so their cos and sin are equal values of distinct nodes. Attribute reads (the
/// node does not say which attribute), random, in-place and nested nodes never compare equal.
fn same_value(g: &Graph, a: ValueId, b: ValueId, depth: usize) -> bool {
    if a == b {
        return true;
    }
    if let (Some(x), Some(y)) = (g.constant(a), g.constant(b)) {
        return x == y;
    }
    let (Some(na), Some(nb)) = (g.values[a].producer, g.values[b].producer) else {
        return false;
    };
    let (x, y) = (&g.nodes[na], &g.nodes[nb]);
    let pure = |k: &str| {
        k != "prim::GetAttr"
            && !k.ends_with('_')
            && ![
                "rand",
                "dropout",
                "bernoulli",
                "normal",
                "multinomial",
                "uniform",
            ]
            .iter()
            .any(|r| k.contains(r))
    };
    depth > 0
        && x.kind == y.kind
        && pure(&x.kind)
        && x.depth == 0
        && y.depth == 0
        && x.constant.is_none()
        && x.inputs.len() == y.inputs.len()
        && x.outputs.iter().position(|&o| o == a) == y.outputs.iter().position(|&o| o == b)
        && x.inputs
            .iter()
            .zip(&y.inputs)
            .all(|(&p, &q)| same_value(g, p, q, depth - 1))
}

/// The tensor `v` is, behind the transparent nodes that keep its shape (GPT-J's full slices,
/// eval dropout, same-dtype `to`): a reshaping view ends the walk, since the op reads a
/// [B, ?, ?, D] tensor.
fn root(g: &Graph, v: ValueId) -> ValueId {
    let shape = g.tensor(v).map(|t| t.shape.clone());
    views::back(g, v)
        .iter()
        .take_while(|s| {
            s.pass == views::Pass::Same && g.tensor(s.from).map(|t| &t.shape) == shape.as_ref()
        })
        .last()
        .map_or(v, |s| s.from)
}

/// The transparent nodes between `to` and `v` (`v` read through them from `to`).
fn chain(g: &Graph, v: ValueId, to: ValueId) -> Vec<NodeId> {
    let mut out = vec![];
    if v == to {
        return out;
    }
    for s in views::back(g, v) {
        out.push(s.node);
        if s.from == to {
            return out;
        }
    }
    vec![]
}

/// Adds to `inside` the size arithmetic only its slices read: traces compute a slice's bound as
/// `Int(floor_divide(NumToTensor(size(x, -1)), 2))`, and where x is the rotation's own (NeoX's
/// q_rot) the size must go with it.
fn shape_arithmetic(g: &Graph, readers: &Readers, inside: &mut BTreeSet<NodeId>) {
    const ARITHMETIC: &[&str] = &[
        "aten::Int",
        "aten::floor_divide",
        "aten::floordiv",
        "aten::div",
        "prim::NumToTensor",
        "aten::size",
    ];
    let mut work: Vec<ValueId> = inside
        .iter()
        .filter(|&&n| g.nodes[n].kind == "aten::slice")
        .flat_map(|&n| g.nodes[n].inputs[2..4].to_vec())
        .collect();
    while let Some(v) = work.pop() {
        let Some(p) = g.values[v].producer else {
            continue;
        };
        if inside.contains(&p) || !ARITHMETIC.contains(&g.nodes[p].kind.as_str()) {
            continue;
        }
        if g.nodes[p]
            .outputs
            .iter()
            .any(|&o| readers.escapes(o, inside))
        {
            continue;
        }
        inside.insert(p);
        if g.nodes[p].kind != "aten::size" {
            work.extend(&g.nodes[p].inputs);
        }
    }
}

fn int(g: &Graph, v: ValueId) -> Option<i64> {
    g.constant(v).and_then(Const::as_int)
}

/// The node producing `v` when it is of `kind` (top level).
fn made_by(g: &Graph, v: ValueId, kind: &str) -> Option<NodeId> {
    let n = g.values[v].producer?;
    (g.nodes[n].kind == kind && g.nodes[n].depth == 0).then_some(n)
}

/// Whether the dim operand `d` names the last of `rank` dims.
fn is_last(g: &Graph, d: ValueId, rank: usize) -> bool {
    matches!(int(g, d), Some(i) if i == -1 || i == rank as i64 - 1)
}

/// A slice of a tensor's last dim: `slice(from, dim, start, end, step)`.
struct Slice {
    node: NodeId,
    from: ValueId,
    /// The start when a constant (traces compute some bounds at run time).
    start: Option<i64>,
    /// Whether it runs to the end of `from` (its end a constant past it).
    to_end: bool,
    step: i64,
    len: i64,
    from_len: i64,
}

fn last_slice(g: &Graph, v: ValueId) -> Option<Slice> {
    let node = made_by(g, v, "aten::slice")?;
    let i = &g.nodes[node].inputs;
    if i.len() != 5 {
        return None;
    }
    let (from, out) = (g.tensor(i[0])?, g.tensor(v)?);
    let from_len = *from.shape.last()?;
    if !is_last(g, i[1], from.shape.len()) || out.shape.len() != from.shape.len() {
        return None;
    }
    Some(Slice {
        node,
        from: i[0],
        start: int(g, i[2]),
        to_end: int(g, i[3]).is_some_and(|e| e >= from_len),
        step: int(g, i[4])?,
        len: *out.shape.last()?,
        from_len,
    })
}

/// The two parts of a `[-a, b]` list: `(a, b)` when the list's first element is `neg(a)`; the
/// list node, the neg node.
fn neg_then(g: &Graph, list: ValueId) -> Option<(ValueId, ValueId, NodeId, NodeId)> {
    let l = made_by(g, list, "prim::ListConstruct")?;
    let &[first, second] = g.nodes[l].inputs.as_slice() else {
        return None;
    };
    let neg = made_by(g, first, "aten::neg")?;
    Some((g.nodes[neg].inputs[0], second, l, neg))
}

/// What computes `rot(x_rot)`: its form, x_rot, its nodes (the slices, neg, list, cat or stack
/// and flatten) and the transparent nodes its slices read x_rot through.
struct Rotated {
    form: Form,
    xr: ValueId,
    nodes: Vec<NodeId>,
    steps: Vec<NodeId>,
}

/// The two slices of x_rot: their common root, and the nodes between.
fn halves_of(g: &Graph, a: &Slice, b: &Slice) -> Option<(ValueId, Vec<NodeId>)> {
    let xr = root(g, a.from);
    (root(g, b.from) == xr).then(|| {
        let mut steps = chain(g, a.from, xr);
        steps.extend(chain(g, b.from, xr));
        (xr, steps)
    })
}

/// `rot(x_rot)` as `v` computes it, if it does.
fn rotated(g: &Graph, v: ValueId) -> Option<Rotated> {
    let rank = g.tensor(v)?.shape.len();
    // halves: cat([-x[.., h:], x[.., :h]], -1)
    if let Some(cat) = made_by(g, v, "aten::cat") {
        let i = &g.nodes[cat].inputs;
        if i.len() != 2 || !is_last(g, i[1], rank) {
            return None;
        }
        let (second, first, list, neg) = neg_then(g, i[0])?;
        let (x2, x1) = (last_slice(g, second)?, last_slice(g, first)?);
        let (xr, steps) = halves_of(g, &x1, &x2)?;
        let h = x1.len;
        let ok = x1.start == Some(0)
            && x1.step == 1
            && x2.step == 1
            && x2.to_end
            && x2.len == h
            && x1.from_len == 2 * h
            && h > 0;
        return ok.then(|| Rotated {
            form: Form::Halves,
            xr,
            nodes: vec![x1.node, x2.node, neg, list, cat],
            steps,
        });
    }
    // pairs: flatten(stack([-x[.., 1::2], x[.., ::2]], -1), -2, -1), or a view of the stack
    let flat = g.values[v].producer?;
    let fk = g.nodes[flat].kind.as_str();
    if g.nodes[flat].depth != 0
        || !matches!(
            fk,
            "aten::flatten" | "aten::view" | "aten::reshape" | "aten::_unsafe_view"
        )
    {
        return None;
    }
    let stacked = g.nodes[flat].inputs[0];
    let stack = made_by(g, stacked, "aten::stack")?;
    let (st, out) = (g.tensor(stacked)?, g.tensor(v)?);
    // [.., R/2, 2] read as [.., R]
    if st.shape.len() != rank + 1
        || st.shape[rank] != 2
        || st.shape[..rank - 1] != out.shape[..rank - 1]
        || out.shape[rank - 1] != 2 * st.shape[rank - 1]
    {
        return None;
    }
    let i = &g.nodes[stack].inputs;
    if i.len() != 2 || !is_last(g, i[1], rank + 1) {
        return None;
    }
    let (odd, even, list, neg) = neg_then(g, i[0])?;
    let (x2, x1) = (last_slice(g, odd)?, last_slice(g, even)?);
    let (xr, steps) = halves_of(g, &x1, &x2)?;
    let h = x1.len;
    let ok = x1.start == Some(0)
        && x2.start == Some(1)
        && x1.step == 2
        && x2.step == 2
        && x2.len == h
        && x1.from_len == 2 * h
        && h > 0;
    ok.then(|| Rotated {
        form: Form::Pairs,
        xr,
        nodes: vec![x1.node, x2.node, neg, list, stack, flat],
        steps,
    })
}

/// The rotation whose add is node `n`, if it is one (see the module doc).
fn rotation(g: &Graph, readers: &Readers, n: NodeId) -> Option<Rotation> {
    let i = &g.nodes[n].inputs;
    if i.len() != 3 || !matches!(g.constant(i[2]), Some(c) if c.as_f64() == Some(1.0)) {
        return None;
    }
    for (a, b) in [(i[0], i[1]), (i[1], i[0])] {
        let (Some(m1), Some(m2)) = (made_by(g, a, "aten::mul"), made_by(g, b, "aten::mul")) else {
            continue;
        };
        let (p, q) = (&g.nodes[m1].inputs, &g.nodes[m2].inputs);
        for (rot, sin) in [(q[0], q[1]), (q[1], q[0])] {
            let Some(r) = rotated(g, rot) else {
                continue;
            };
            for (x, cos) in [(p[0], p[1]), (p[1], p[0])] {
                if root(g, x) != root(g, r.xr) {
                    continue;
                }
                let mut nodes = r.nodes.clone();
                nodes.extend([m1, m2, n]);
                let core = Core {
                    add: n,
                    x,
                    rot: &r,
                    cos,
                    sin,
                    nodes,
                };
                if let Some(r) = finish(g, readers, core) {
                    return Some(r);
                }
            }
        }
    }
    None
}

/// A rotation's core as `rotation` found it: add `add` of `x`·`cos` (x the x_rot the multiply
/// reads) and `rot`·`sin`, with those nodes.
struct Core<'a> {
    add: NodeId,
    x: ValueId,
    rot: &'a Rotated,
    cos: ValueId,
    sin: ValueId,
    nodes: Vec<NodeId>,
}

/// The rotation of a core, with the partial form's pass-through when the add's output is cut
/// back onto the rest of the head; None when its operands or outputs do not fit the kernel.
fn finish(g: &Graph, readers: &Readers, core: Core) -> Option<Rotation> {
    let Core {
        add: n,
        x,
        rot: r,
        cos,
        sin,
        mut nodes,
    } = core;
    let form = r.form;
    let y = g.nodes[n].outputs[0];
    let (tx, ty) = (g.tensor(x)?, g.tensor(y)?);
    let rotary_dim = *tx.shape.last()?;
    if tx.shape.len() != 4 || ty.shape != tx.shape || ty.dtype != tx.dtype || rotary_dim % 2 != 0 {
        return None;
    }
    let dtype = DType::parse(&tx.dtype)?;
    // The partial form: x_rot = x[.., :R] and cat(y, x[.., R:]) after the add.
    let (mut full, mut out) = (root(g, x), n);
    // The transparent nodes read through (GPT-J's full slices of each dim), for ownership.
    let mut steps = chain(g, x, full);
    steps.extend(chain(g, r.xr, full));
    steps.extend(&r.steps);
    let users = g.readers();
    // Where R is the whole head (Phi-3: x[.., :D] and an empty x[.., D:] after the add), the cut
    // keeps x's shape and `root` walked through it: the slice is x's own.
    let rot_cut = last_slice(g, full).or_else(|| last_slice(g, x));
    if let (Some(cut), &[list]) = (rot_cut, users[y].as_slice()) {
        let cat = users[g.nodes[list].outputs[0]].first().copied();
        let partial = cat.and_then(|cat| {
            let ci = &g.nodes[cat].inputs;
            let ok = g.nodes[list].kind == "prim::ListConstruct"
                && g.nodes[list].inputs.len() == 2
                && g.nodes[list].inputs[0] == y
                && g.nodes[cat].kind == "aten::cat"
                && users[g.nodes[list].outputs[0]].len() == 1
                && ci.len() == 2
                && is_last(g, ci[1], 4);
            if !ok {
                return None;
            }
            let pass = last_slice(g, g.nodes[list].inputs[1])?;
            let whole = root(g, cut.from);
            let fits = cut.start == Some(0)
                && cut.step == 1
                && cut.len == rotary_dim
                && pass.step == 1
                && pass.to_end
                && pass.len == cut.from_len - rotary_dim
                && root(g, pass.from) == whole;
            fits.then_some((cat, cut, pass, list, whole))
        });
        if let Some((cat, cut, pass, list, whole)) = partial {
            nodes.extend([cut.node, pass.node, list, cat]);
            steps.extend(chain(g, cut.from, whole));
            steps.extend(chain(g, pass.from, whole));
            full = whole;
            out = cat;
        }
    }
    let shape = g.tensor(full)?.shape.clone();
    let head_dim = *shape.last()?;
    if shape.len() != 4 || g.tensor(full)?.dtype != tx.dtype {
        return None;
    }
    // cos and sin: x's dtype, R along the last dim, broadcast along the heads.
    let table = |v: ValueId| -> Option<Vec<i64>> {
        let t = g.tensor(v)?;
        if t.dtype != tx.dtype || t.shape.len() > 4 || t.shape.last() != Some(&rotary_dim) {
            return None;
        }
        let mut s = vec![1; 4 - t.shape.len()];
        s.extend(&t.shape);
        (0..3).all(|d| s[d] == 1 || s[d] == shape[d]).then_some(s)
    };
    let (c, s) = (table(cos)?, table(sin)?);
    let heads_dim = [1, 2].into_iter().find(|&d| c[d] == 1 && s[d] == 1)?;
    // Every node but the last is read only inside the rotation.
    let mut inside: BTreeSet<NodeId> = nodes.iter().copied().collect();
    inside.extend(readers.owned(g, &inside, &steps));
    shape_arithmetic(g, readers, &mut inside);
    if inside.iter().filter(|&&m| m != out).any(|&m| {
        g.nodes[m]
            .outputs
            .iter()
            .any(|&o| readers.escapes(o, &inside))
    }) {
        return None;
    }
    let out_t = g.tensor(g.nodes[out].outputs[0])?;
    Some(Rotation {
        x: full,
        cos,
        sin,
        out,
        nodes: inside.into_iter().collect(),
        form,
        head_dim,
        rotary_dim,
        contiguous: out_t.is_packed(),
        shape,
        heads_dim,
        dtype,
    })
}
