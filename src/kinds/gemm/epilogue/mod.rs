//! GEMM + elementwise epilogue: a GEMM rule's match extended by the chain or DAG of elementwise
//! ops that consume its output, when every intermediate is used only inside the pattern.
//!
//! out = f(a · B (+ bias), l₀, l₁, …) where f is a program of elementwise ops over fp32 values:
//! `v0` is the GEMM's result (with its bias, if any), each instruction defines the next value
//! from earlier values, leaves and scalars, and the last value is the output. A leaf is an input
//! from outside the pattern: a tensor with the output's elements (a residual, in any spelling of
//! the output's leading dims with N last), a vector along the output's last dim (`row`, indexed
//! by n, like a bias), a vector along its rows (`col`, shape [..., 1] over the output's leading
//! dims, indexed by m; only where the value it meets has the output's shape) or a one-element
//! tensor (`scalar`). Python scalars are constants
//! of the program. A value used twice (x·sigmoid(x)) is computed once: the program is a DAG.
//!
//! The pattern reads through transparent nodes (`rules::views`): views and reshapes that keep N
//! last, eval dropout, `contiguous` and same-dtype `to` between the GEMM and its ops are the value
//! they pass on (every pattern value is the GEMM's output in some spelling of its leading dims); a
//! residual is read from the tensor its views respell, and a row leaf through the `expand` that
//! broadcast it. A GEMM whose a is a flattening view (`addmm(bias, x.view(-1, K), W)`, GPT-2's
//! `Conv1D`) reads x instead where the pattern ends in x's leading dims (`view(B, T, N)` back), so
//! the op's output, a.shape[:-1] + [N], has the shape the graph expects; where it ends in the
//! flattened rows, the op reads the 2-D operand. The pattern owns the transparent nodes it reads
//! through that nothing else reads.
//!
//! The program (program.rs) has one text form (`Epilogue::text`), read by the torch op to run the
//! original ops when a call does not fit the kernel (leaves respelled in the output's shape), and
//! rendered by the kind's render.rs into a device functor. Ops: add, sub, mul, div (value, leaf or scalar on
//! either side), relu, gelu (erf), gelu_tanh, sigmoid, silu, tanh, mish, softplus, exp, neg,
//! leaky_relu, hardtanh/clamp/clamp_min/clamp_max, pow with a scalar exponent (square as pow 2).
//! Anything else ends the chain.
//!
//! `EpilogueRule` offers each GEMM with its longest epilogue; the GEMM alone is `GemmRule`'s match.

pub mod eager;
pub mod program;

use super::rule::{match_gemms, EpilogueMatch, GemmMatch};
use crate::graph::{Const, Graph, NodeId, TensorInfo, ValueId};
use crate::rules::views::{self, Pass, Readers};
use crate::rules::{boxed, Match, PatternKind, Rule};
use crate::types::DType;
use std::collections::{BTreeSet, HashMap};

pub use program::*;

/// A pattern's one reordering: the GEMM-order shape it turned from and the order it took.
#[derive(Clone, Debug)]
struct Turn {
    from: Vec<i64>,
    order: Vec<usize>,
    /// The pattern's graph values before the turn: they lie in the GEMM's order.
    before: BTreeSet<ValueId>,
}

impl Turn {
    /// The shape in the graph's order: `from` permuted.
    fn to(&self) -> Vec<i64> {
        self.order.iter().map(|&d| self.from[d]).collect()
    }
    /// A leaf's shape (in the graph's order, broadcasting against the turned value) in the
    /// GEMM's order: leading ones to the value's rank, then the inverse permutation. None when it
    /// has more dims than the value.
    fn back(&self, shape: &[i64]) -> Option<Vec<i64>> {
        let rank = self.order.len();
        let pad = rank.checked_sub(shape.len())?;
        let aligned: Vec<i64> = std::iter::repeat_n(1, pad)
            .chain(shape.iter().copied())
            .collect();
        let mut out = vec![1; rank];
        for (i, &d) in self.order.iter().enumerate() {
            out[d] = aligned[i];
        }
        Some(out)
    }
}

/// The order a reordering node gives (output dim i is its operand's dim `order[i]`):
/// `permute(x, dims)` or `transpose(x, d0, d1)`, negative dims counted from the end.
fn reorder(g: &Graph, id: NodeId) -> Option<Vec<usize>> {
    let n = &g.nodes[id];
    let rank = g.tensor(*n.inputs.first()?)?.shape.len();
    let dim = |d: i64| -> Option<usize> {
        let d = if d < 0 { d + rank as i64 } else { d };
        usize::try_from(d).ok().filter(|&d| d < rank)
    };
    let order: Vec<usize> = match n.kind.as_str() {
        "aten::permute" if n.inputs.len() == 2 => g
            .int_list(n.inputs[1])?
            .into_iter()
            .map(dim)
            .collect::<Option<_>>()?,
        "aten::transpose" if n.inputs.len() == 3 => {
            let (a, b) = (
                dim(g.constant(n.inputs[1])?.as_int()?)?,
                dim(g.constant(n.inputs[2])?.as_int()?)?,
            );
            let mut o: Vec<usize> = (0..rank).collect();
            o.swap(a, b);
            o
        }
        _ => return None,
    };
    let mut seen = vec![false; rank];
    for &d in &order {
        if std::mem::replace(&mut seen[d], true) {
            return None;
        }
    }
    (order.len() == rank).then_some(order)
}

/// One elementwise node read as an instruction over graph values: operands as values or
/// constants, before they are mapped to program values and leaves.
enum Operand {
    Tensor(ValueId),
    Scalar(f64),
}

/// The instruction a node computes, if it is one the epilogue supports: (op, operands).
fn read_node(g: &Graph, id: NodeId) -> Option<(EpOp, Vec<Operand>)> {
    let n = &g.nodes[id];
    let kind = n.kind.strip_prefix("aten::")?;
    let kind = kind.strip_suffix('_').unwrap_or(kind);
    let cst = |i: usize| -> Option<&Const> { n.inputs.get(i).and_then(|&v| g.constant(v)) };
    let num = |i: usize| cst(i).and_then(Const::as_f64);
    let operand = |i: usize| -> Option<Operand> {
        let v = *n.inputs.get(i)?;
        match g.constant(v) {
            Some(c) => c.as_f64().map(Operand::Scalar),
            None if g.tensor(v).is_some() => Some(Operand::Tensor(v)),
            None => None,
        }
    };
    if n.outputs.len() != 1 {
        return None;
    }
    let unary = |op: EpOp| Some((op, vec![operand(0)?]));
    match kind {
        "add" | "sub" => {
            // alpha must be 1; add(Tensor, Scalar, alpha) and add(Tensor, Tensor, alpha) alike.
            if n.inputs.len() == 3 && num(2) != Some(1.0) {
                return None;
            }
            let op = if kind == "add" { EpOp::Add } else { EpOp::Sub };
            Some((op, vec![operand(0)?, operand(1)?]))
        }
        "rsub" => {
            if n.inputs.len() == 3 && num(2) != Some(1.0) {
                return None;
            }
            Some((EpOp::Sub, vec![operand(1)?, operand(0)?]))
        }
        "mul" | "div" if n.inputs.len() == 2 => Some((
            if kind == "mul" { EpOp::Mul } else { EpOp::Div },
            vec![operand(0)?, operand(1)?],
        )),
        "relu" => unary(EpOp::Relu),
        "gelu" => match cst(1) {
            None => unary(EpOp::Gelu),
            Some(Const::Str(s)) if s == "none" => unary(EpOp::Gelu),
            Some(Const::Str(s)) if s == "tanh" => unary(EpOp::GeluTanh),
            _ => None,
        },
        "sigmoid" => unary(EpOp::Sigmoid),
        "silu" => unary(EpOp::Silu),
        "tanh" => unary(EpOp::Tanh),
        "mish" => unary(EpOp::Mish),
        "exp" => unary(EpOp::Exp),
        "neg" => unary(EpOp::Neg),
        "softplus" => Some((
            EpOp::Softplus,
            vec![
                operand(0)?,
                Operand::Scalar(num(1)?),
                Operand::Scalar(num(2)?),
            ],
        )),
        "leaky_relu" => Some((
            EpOp::LeakyRelu,
            vec![operand(0)?, Operand::Scalar(num(1).unwrap_or(0.01))],
        )),
        "hardtanh" => Some((
            EpOp::Clamp,
            vec![
                operand(0)?,
                Operand::Scalar(num(1)?),
                Operand::Scalar(num(2)?),
            ],
        )),
        "relu6" => Some((
            EpOp::Clamp,
            vec![operand(0)?, Operand::Scalar(0.0), Operand::Scalar(6.0)],
        )),
        "clamp" => match (num(1), num(2), cst(1), cst(2)) {
            (Some(lo), Some(hi), _, _) => Some((
                EpOp::Clamp,
                vec![operand(0)?, Operand::Scalar(lo), Operand::Scalar(hi)],
            )),
            (Some(lo), None, _, Some(Const::None)) => {
                Some((EpOp::ClampMin, vec![operand(0)?, Operand::Scalar(lo)]))
            }
            (None, Some(hi), Some(Const::None), _) => {
                Some((EpOp::ClampMax, vec![operand(0)?, Operand::Scalar(hi)]))
            }
            _ => None,
        },
        "clamp_min" => Some((EpOp::ClampMin, vec![operand(0)?, Operand::Scalar(num(1)?)])),
        "clamp_max" => Some((EpOp::ClampMax, vec![operand(0)?, Operand::Scalar(num(1)?)])),
        "pow" => Some((EpOp::Pow, vec![operand(0)?, Operand::Scalar(num(1)?)])),
        // Nemotron's squared ReLU: `relu(x).square()`, pow by 2 (the fallback's at::pow(x, 2)
        // is x·x, as square is).
        "square" => Some((EpOp::Pow, vec![operand(0)?, Operand::Scalar(2.0)])),
        _ => None,
    }
}

/// The GEMM's output as every pattern value holds it: its elements, in any spelling of the
/// leading dims with N last, in its dtype.
struct Space {
    numel: i64,
    n: i64,
    tensor_dtype: String,
    dtype: DType,
    batched: bool,
}

impl Space {
    fn holds(&self, t: Option<&TensorInfo>) -> bool {
        t.is_some_and(|t| {
            t.dtype == self.tensor_dtype
                && t.numel() == self.numel
                && t.shape.last() == Some(&self.n)
        })
    }
}

/// How a tensor of `shape` and `dtype` lies over a pattern value of `out` shape (a spelling of
/// the GEMM's output) and dtype, if it can be a leaf.
fn leaf_kind(
    shape: &[i64],
    dtype: &str,
    out: &[i64],
    out_dtype: DType,
    batched: bool,
) -> Option<LeafKind> {
    let numel: i64 = shape.iter().product();
    if numel == 1 {
        // Type promotion keeps the output's dtype for a one-element floating tensor only if it
        // has no more dims than the output.
        return (DType::parse(dtype).is_some() && shape.len() <= out.len())
            .then_some(LeafKind::Scalar);
    }
    if DType::parse(dtype) != Some(out_dtype) || shape.len() > out.len() {
        return None;
    }
    let n = *out.last()?;
    // The value's elements one for one (broadcasting may have added leading ones on either side).
    if numel == out.iter().product::<i64>() && shape.last() == Some(&n) {
        return Some(LeafKind::Full);
    }
    let lead_ones = shape.iter().take_while(|&&d| d == 1).count();
    if shape[lead_ones..] == [n] {
        return Some(LeafKind::Row);
    }
    if !batched
        && shape.len() == out.len()
        && shape.last() == Some(&1)
        && shape[..shape.len() - 1] == out[..out.len() - 1]
    {
        return Some(LeafKind::Col);
    }
    None
}

/// The leaf an operand `v` of a node whose output has `out` shape is, and the transparent nodes
/// it is read through: a full-size or row operand is read from the tensor it respells (or, for a
/// row vector, broadcasts), as far back as N stays its last dim, so `x.view(...)` and
/// `bias.expand_as(h)` are leaves x and bias; a col or scalar operand is read as it is (a scalar's
/// rank decides its type promotion).
fn leaf(
    g: &Graph,
    v: ValueId,
    out: &[i64],
    space: &Space,
    program: &HashMap<ValueId, usize>,
    turn: Option<&Turn>,
) -> Option<(ValueId, LeafKind, Vec<NodeId>)> {
    let t = g.tensor(v)?;
    if let Some(turn) = turn {
        // In the GEMM's order, as the op reads it; a full-size leaf has the value's own shape.
        let back = turn.back(&t.shape)?;
        return match leaf_kind(&back, &t.dtype, &turn.from, space.dtype, space.batched)? {
            LeafKind::Full if t.shape != out => None,
            LeafKind::Col => None,
            kind => Some((v, kind, vec![])),
        };
    }
    let kind = leaf_kind(&t.shape, &t.dtype, out, space.dtype, space.batched)?;
    if !matches!(kind, LeafKind::Full | LeafKind::Row) {
        return Some((v, kind, vec![]));
    }
    let steps = views::back(g, v);
    let (mut found, mut taken) = ((v, kind), 0);
    let mut broadcast = false;
    for (i, s) in steps.iter().enumerate() {
        let Some(from) = g.tensor(s.from) else { break };
        if program.contains_key(&s.from) || from.shape.last() != Some(&space.n) {
            break;
        }
        broadcast |= s.pass == Pass::Broadcast;
        // Behind a broadcast only a row vector ([1, .., 1, N]) is a leaf the kernel broadcasts.
        if !broadcast {
            (found, taken) = ((s.from, kind), i + 1);
        } else if from.numel() == space.n {
            (found, taken) = ((s.from, LeafKind::Row), i + 1);
        }
    }
    Some((
        found.0,
        found.1,
        steps[..taken].iter().map(|s| s.node).collect(),
    ))
}

/// A tensor the op can read as a: the GEMM's own operand or one it respells, with the output
/// shape the op then has (its leading dims, N last) and the transparent nodes between them.
struct Rows {
    value: ValueId,
    out: Vec<i64>,
    steps: Vec<NodeId>,
}

/// The tensors the op can read as a, the GEMM's operand first: for a GEMM whose B is 2-D (linear,
/// mm, addmm, matmul folding a's rows into M) and whose a is packed, also each tensor a is a
/// respelling of that is packed with K last (the op folds its leading dims into M).
fn rows(g: &Graph, gm: &GemmMatch) -> Vec<Rows> {
    let n = gm.problem.n;
    let out = |t: &TensorInfo| {
        let mut s = t.shape[..t.shape.len() - 1].to_vec();
        s.push(n);
        s
    };
    let Some(ta) = g.tensor(gm.a) else {
        return vec![];
    };
    let mut found = vec![Rows {
        value: gm.a,
        out: out(ta),
        steps: vec![],
    }];
    let b_2d = g.tensor(gm.b).is_some_and(|t| t.shape.len() == 2);
    if gm.problem.batch != 1 || !b_2d || !ta.is_packed() {
        return found;
    }
    let mut steps = Vec::new();
    for s in views::back(g, gm.a) {
        if s.pass != Pass::Same {
            break;
        }
        steps.push(s.node);
        match g.tensor(s.from) {
            Some(t)
                if t.dtype == ta.dtype
                    && t.is_packed()
                    && t.shape.last() == Some(&gm.problem.k) =>
            {
                found.push(Rows {
                    value: s.from,
                    out: out(t),
                    steps: steps.clone(),
                })
            }
            Some(_) => {}
            None => break,
        }
    }
    found
}

/// The longest epilogue after `gm`'s GEMM: nodes are taken in program order while they are
/// supported elementwise ops (or transparent nodes) over the pattern's values, leaves and
/// constants; the pattern is cut at the last point where exactly one of its values is used
/// outside it (or is a graph output), that value is the last node's, and its shape is the one the
/// op can give (a.shape[:-1] + [N] for an a of `rows`). A pattern ends at a transparent node only
/// where it cannot end at the instruction before it: a trailing view is left to the ops that read
/// it (it may be the next GEMM's flattening view). `None` when not even one op can be fused.
pub fn match_epilogue(g: &Graph, gm: &GemmMatch) -> Option<EpilogueMatch> {
    let gemm_out = *g.nodes[gm.node].outputs.first()?;
    let out_info = g.tensor(gemm_out)?;
    let space = Space {
        numel: out_info.numel(),
        n: *out_info.shape.last()?,
        tensor_dtype: out_info.dtype.clone(),
        dtype: gm.problem.dtype,
        batched: gm.problem.batch > 1,
    };
    let cx = Cut {
        g,
        readers: Readers::of(g),
        rows: rows(g, gm),
        gemm: gm.node,
    };
    // Program values by graph value; value 0 is the GEMM's output.
    let mut pat = Pattern {
        program: HashMap::from([(gemm_out, 0)]),
        instrs: Vec::new(),
        leaves: Vec::new(),
        nodes: Vec::new(),
        leaf_steps: Vec::new(),
        col_at: Vec::new(),
        turn: None,
    };
    let mut best: Option<EpilogueMatch> = None;
    // Whether the pattern as it stands can end at its last instruction.
    let mut ends = false;
    for id in gm.node + 1..g.nodes.len() {
        let n = &g.nodes[id];
        if n.depth != 0 || !n.inputs.iter().any(|v| pat.program.contains_key(v)) {
            continue;
        }
        if n.outputs.len() != 1 {
            break;
        }
        let out = n.outputs[0];
        let Some(t) = g.tensor(out) else { break };
        // The turn: a reordering of a pattern value that has no leaf yet (they would lie in the
        // GEMM's order, the later ones in the graph's).
        if pat.turn.is_none() && pat.leaves.is_empty() {
            if let (Some(order), Some(&p)) = (reorder(g, id), pat.program.get(&n.inputs[0])) {
                let from = g.tensor(n.inputs[0]).map(|f| f.shape.clone());
                match from {
                    Some(from)
                        if space.holds(g.tensor(n.inputs[0])) && t.dtype == space.tensor_dtype =>
                    {
                        pat.turn = Some(Turn {
                            from,
                            order,
                            before: pat.program.keys().copied().collect(),
                        });
                        pat.program.insert(out, p);
                        pat.nodes.push(id);
                        continue;
                    }
                    _ => break,
                }
            }
        }
        let held = match &pat.turn {
            None => space.holds(Some(t)),
            Some(turn) => t.dtype == space.tensor_dtype && t.shape == turn.to(),
        };
        // After the turn a value from before it lies in the other order (even where the two
        // shapes agree, as a square one's do).
        if !held
            || pat
                .turn
                .as_ref()
                .is_some_and(|turn| n.inputs.iter().any(|v| turn.before.contains(v)))
        {
            break;
        }
        match views::pass(g, id) {
            // A respelling of a pattern value is that value.
            Some(Pass::Same) => {
                let Some(&p) = pat.program.get(&n.inputs[0]) else {
                    break;
                };
                pat.program.insert(out, p);
                pat.nodes.push(id);
                if !ends {
                    best = cx.cut(&pat, out).or(best);
                }
                continue;
            }
            Some(Pass::Broadcast) => break,
            None => {}
        }
        // An in-place op writes its first operand: only a pattern value may be written.
        if n.kind.ends_with('_') && !pat.program.contains_key(&n.inputs[0]) {
            break;
        }
        let Some((op, operands)) = read_node(g, id) else {
            break;
        };
        let shape = &t.shape;
        let Some(args) = operands
            .into_iter()
            .map(|o| pat.arg(o, g, shape, &space))
            .collect::<Option<Vec<Arg>>>()
        else {
            break;
        };
        // Unary ops take a value first; binary ops may hold it on either side.
        if op.scalar_params() && !matches!(args[0], Arg::Value(_)) {
            break;
        }
        pat.instrs.push(Instr { op, args });
        pat.program.insert(out, pat.instrs.len());
        pat.nodes.push(id);
        let m = cx.cut(&pat, out);
        ends = m.is_some();
        best = m.or(best);
    }
    best
}

/// The epilogue rule: each GEMM with the longest epilogue after it, where it has one.
pub struct EpilogueRule;

impl Rule for EpilogueRule {
    fn name(&self) -> &'static str {
        "epilogue"
    }
    fn kind(&self) -> PatternKind {
        crate::kinds::gemm::EPILOGUE
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        // A GEMM whose weight compose would pad fuses at the graph's N: its leaves are the
        // graph's width, not the padded one (`GemmMatch::plain` pads it again).
        let fused = match_gemms(g).into_iter().filter_map(|m| {
            let mut m = m.unpadded();
            let e = match_epilogue(g, &m)?;
            m.problem.epilogue = Some(e.epilogue.clone());
            m.epilogue = Some(e);
            Some(m)
        });
        boxed(fused.collect())
    }
}

/// What deciding a cut needs besides the pattern: the graph, who reads what, the tensors the op
/// can read as a, and the GEMM node.
struct Cut<'g> {
    g: &'g Graph,
    readers: Readers,
    rows: Vec<Rows>,
    gemm: NodeId,
}

impl Cut<'_> {
    /// The pattern as it stands, if `last` is its only value seen outside it and has a shape the
    /// op gives (the a that gives it read farthest back, so the pattern owns the most views).
    fn cut(&self, pat: &Pattern, last: ValueId) -> Option<EpilogueMatch> {
        if pat.instrs.is_empty() {
            return None;
        }
        let inside: BTreeSet<NodeId> = pat.nodes.iter().copied().chain([self.gemm]).collect();
        if pat
            .program
            .keys()
            .any(|&v| v != last && self.readers.escapes(v, &inside))
        {
            return None;
        }
        let shape = &self.g.tensor(last)?.shape;
        // A col leaf indexes the rows of the value it meets: unambiguous where that value has the
        // output's own shape, as the op reads it.
        if pat.col_at.iter().any(|s| s != shape) {
            return None;
        }
        // The op gives a.shape[:-1] + [N], permuted where the pattern turned.
        let gives = |r: &Rows| match &pat.turn {
            None => &r.out == shape,
            Some(turn) => r.out == turn.from && &turn.to() == shape,
        };
        let rows = self.rows.iter().rev().find(|r| gives(r))?;
        let steps: Vec<NodeId> = rows.steps.iter().chain(&pat.leaf_steps).copied().collect();
        let mut nodes = pat.nodes.clone();
        nodes.extend(self.readers.owned(self.g, &inside, &steps));
        nodes.sort_unstable();
        Some(EpilogueMatch {
            epilogue: Epilogue {
                leaves: pat.leaves.iter().map(|l| l.1).collect(),
                instrs: pat.instrs.clone(),
            },
            nodes,
            leaves: pat.leaves.iter().map(|l| l.0).collect(),
            output: last,
            a: (rows.value != self.rows[0].value).then_some(rows.value),
            order: pat.turn.as_ref().map(|t| t.order.clone()),
        })
    }
}

/// The pattern taken so far: program values by graph value, instructions, leaves, nodes, the
/// transparent nodes its leaves are read through, and where its col leaves are read.
struct Pattern {
    program: HashMap<ValueId, usize>,
    instrs: Vec<Instr>,
    leaves: Vec<(ValueId, LeafKind)>,
    nodes: Vec<NodeId>,
    leaf_steps: Vec<NodeId>,
    /// The shapes of the values col leaves meet.
    col_at: Vec<Vec<i64>>,
    /// Where the pattern turned, if it did.
    turn: Option<Turn>,
}

impl Pattern {
    /// The program operand for a node's operand: a program value, a constant, or a leaf (taken
    /// now if new). None when it cannot be one: a tensor that does not lie over the node's
    /// output (`out` shape), or more leaves (or full-size leaves) than kernels take.
    fn arg(&mut self, o: Operand, g: &Graph, out: &[i64], space: &Space) -> Option<Arg> {
        let v = match o {
            Operand::Scalar(s) => return Some(Arg::Scalar(Scalar(s))),
            Operand::Tensor(v) => v,
        };
        if let Some(&p) = self.program.get(&v) {
            return Some(Arg::Value(p));
        }
        let (v, kind, steps) = leaf(g, v, out, space, &self.program, self.turn.as_ref())?;
        if kind == LeafKind::Col {
            self.col_at.push(out.to_vec());
        }
        if let Some(i) = self.leaves.iter().position(|(lv, _)| *lv == v) {
            self.leaf_steps.extend(steps);
            return Some(Arg::Leaf(i));
        }
        let full = self
            .leaves
            .iter()
            .filter(|(_, k)| *k == LeafKind::Full)
            .count();
        if self.leaves.len() == MAX_LEAVES || (kind == LeafKind::Full && full == MAX_FULL_LEAVES) {
            return None;
        }
        self.leaves.push((v, kind));
        self.leaf_steps.extend(steps);
        Some(Arg::Leaf(self.leaves.len() - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epilogue_of(text: &str) -> Option<EpilogueMatch> {
        let g = Graph::parse(text).unwrap();
        let gm = match_gemms(&g).into_iter().next().expect("a GEMM");
        match_epilogue(&g, &gm)
    }

    #[test]
    fn chain_of_unary_and_scalar_ops() {
        let m = epilogue_of(
            "graph(%x: f32[8,16], %w: f32[32,16], %b: f32[32]):
               %h = aten::linear(%x, %w, %b) : f32[8,32]
               %half = prim::Constant[0.5]()
               %one = prim::Constant[1]()
               %r = aten::relu(%h) : f32[8,32]
               %s = aten::mul(%r, %half) : f32[8,32]
               %t = aten::add(%s, %one, %one) : f32[8,32]
               return (%t)",
        )
        .unwrap();
        assert_eq!(
            m.epilogue.text(),
            "leaves=;v1=relu(v0);v2=mul(v1,0.5);v3=add(v2,1.0)"
        );
        assert_eq!(m.epilogue.label(), "relu_mul_add");
        assert_eq!(m.nodes.len(), 3);
    }

    #[test]
    fn squared_relu_is_relu_then_pow_two() {
        let m = epilogue_of(
            "graph(%x: f32[8,16], %w: f32[32,16], %b: f32[32]):
               %h = aten::linear(%x, %w, %b) : f32[8,32]
               %r = aten::relu(%h) : f32[8,32]
               %y = aten::square(%r) : f32[8,32]
               return (%y)",
        )
        .unwrap();
        assert_eq!(m.epilogue.text(), "leaves=;v1=relu(v0);v2=pow(v1,2.0)");
    }

    #[test]
    fn a_value_used_twice_is_a_dag() {
        let m = epilogue_of(
            "graph(%x: f32[8,16], %w: f32[32,16], %b: f32[32]):
               %h = aten::linear(%x, %w, %b) : f32[8,32]
               %s = aten::sigmoid(%h) : f32[8,32]
               %y = aten::mul(%h, %s) : f32[8,32]
               return (%y)",
        )
        .unwrap();
        assert_eq!(m.epilogue.text(), "leaves=;v1=sigmoid(v0);v2=mul(v0,v1)");
    }

    #[test]
    fn written_out_tanh_gelu_with_leaves() {
        let m = epilogue_of(
            "graph(%x: f32[4,8,16], %w: f32[32,16], %b: f32[32], %res: f32[4,8,32], %scale: f32[32]):
               %h = aten::linear(%x, %w, %b) : f32[4,8,32]
               %c05 = prim::Constant[0.5]()
               %c3 = prim::Constant[3.0]()
               %cc = prim::Constant[0.044715]()
               %ck = prim::Constant[0.7978845608028654]()
               %one = prim::Constant[1]()
               %p = aten::pow(%h, %c3) : f32[4,8,32]
               %q = aten::mul(%p, %cc) : f32[4,8,32]
               %r = aten::add(%h, %q, %one) : f32[4,8,32]
               %s = aten::mul(%r, %ck) : f32[4,8,32]
               %t = aten::tanh(%s) : f32[4,8,32]
               %u = aten::add(%t, %one, %one) : f32[4,8,32]
               %hh = aten::mul(%h, %c05) : f32[4,8,32]
               %g = aten::mul(%hh, %u) : f32[4,8,32]
               %gs = aten::mul(%g, %scale) : f32[4,8,32]
               %y = aten::add(%res, %gs, %one) : f32[4,8,32]
               return (%y)",
        )
        .unwrap();
        assert_eq!(m.epilogue.leaves, vec![LeafKind::Row, LeafKind::Full]);
        assert_eq!(
            m.epilogue.label(),
            "pow_mul_add_mul_tanh_add_mul_mul_mul_add"
        );
        assert!(
            m.epilogue.text().ends_with("v9=mul(v8,l0);v10=add(l1,v9)"),
            "{}",
            m.epilogue.text()
        );
        assert_eq!(m.nodes.len(), 10);
    }

    #[test]
    fn stops_at_an_unsupported_op_and_at_escaping_intermediates() {
        // softmax ends the chain; the relu before it is fused.
        let m = epilogue_of(
            "graph(%x: f32[8,16], %w: f32[32,16]):
               %none = prim::Constant[None]()
               %dim = prim::Constant[-1]()
               %h = aten::linear(%x, %w, %none) : f32[8,32]
               %r = aten::relu(%h) : f32[8,32]
               %s = aten::softmax(%r, %dim, %none) : f32[8,32]
               return (%s)",
        )
        .unwrap();
        assert_eq!(m.epilogue.label(), "relu");
        // The GEMM's output is also returned: nothing can be fused after it.
        assert!(epilogue_of(
            "graph(%x: f32[8,16], %w: f32[32,16]):
               %none = prim::Constant[None]()
               %h = aten::linear(%x, %w, %none) : f32[8,32]
               %r = aten::relu(%h) : f32[8,32]
               return (%r, %h)"
        )
        .is_none());
        // An intermediate used elsewhere: the pattern is cut before it escapes.
        let m = epilogue_of(
            "graph(%x: f32[8,16], %w: f32[32,16]):
               %none = prim::Constant[None]()
               %h = aten::linear(%x, %w, %none) : f32[8,32]
               %r = aten::relu(%h) : f32[8,32]
               %t = aten::tanh(%r) : f32[8,32]
               %e = aten::exp(%t) : f32[8,32]
               return (%e, %t)",
        )
        .unwrap();
        assert_eq!(m.epilogue.label(), "relu_tanh");
    }

    #[test]
    fn two_residuals_fuse_and_a_third_or_broadcasting_that_grows_the_output_ends_the_chain() {
        // Two full-size leaves (C and an aux load); the third residual stays in torch. A residual
        // read twice is one leaf.
        let m = epilogue_of(
            "graph(%x: f32[8,16], %w: f32[32,16], %r1: f32[8,32], %r2: f32[8,32], %r3: f32[8,32]):
               %none = prim::Constant[None]()
               %one = prim::Constant[1]()
               %h = aten::linear(%x, %w, %none) : f32[8,32]
               %a = aten::add(%h, %r1, %one) : f32[8,32]
               %b = aten::mul(%a, %r2) : f32[8,32]
               %c = aten::sub(%b, %r1, %one) : f32[8,32]
               %d = aten::add(%c, %r3, %one) : f32[8,32]
               return (%d)",
        )
        .unwrap();
        assert_eq!(
            m.epilogue.text(),
            "leaves=full,full;v1=add(v0,l0);v2=mul(v1,l1);v3=sub(v2,l0)"
        );
        assert_eq!(m.epilogue.full_leaves(), MAX_FULL_LEAVES);
        assert_eq!(m.nodes.len(), 3);
        assert!(epilogue_of(
            "graph(%x: f32[8,16], %w: f32[32,16], %big: f32[2,8,32]):
               %none = prim::Constant[None]()
               %one = prim::Constant[1]()
               %h = aten::linear(%x, %w, %none) : f32[8,32]
               %a = aten::add(%h, %big, %one) : f32[2,8,32]
               return (%a)"
        )
        .is_none());
    }

    #[test]
    fn column_vectors_scalars_and_rsub() {
        let m = epilogue_of(
            "graph(%x: bf16[8,16], %w: bf16[32,16], %c: bf16[8,1], %s: f32[]):
               %none = prim::Constant[None]()
               %one = prim::Constant[1]()
               %h = aten::linear(%x, %w, %none) : bf16[8,32]
               %a = aten::mul(%h, %c) : bf16[8,32]
               %b = aten::rsub(%a, %one, %one) : bf16[8,32]
               %d = aten::div(%b, %s) : bf16[8,32]
               return (%d)",
        )
        .unwrap();
        assert_eq!(
            m.epilogue.text(),
            "leaves=col,scalar;v1=mul(v0,l0);v2=sub(1.0,v1);v3=div(v2,l1)"
        );
    }

    /// The graph and its first GEMM's epilogue.
    fn parsed(text: &str) -> (Graph, Option<EpilogueMatch>) {
        let g = Graph::parse(text).unwrap();
        let gm = match_gemms(&g).into_iter().next().expect("a GEMM");
        let m = match_epilogue(&g, &gm);
        (g, m)
    }

    /// The names of the values the nodes produce, in order.
    fn outputs(g: &Graph, nodes: &[NodeId]) -> Vec<String> {
        nodes
            .iter()
            .map(|&n| g.values[g.nodes[n].outputs[0]].name.clone())
            .collect()
    }

    fn name(g: &Graph, v: Option<ValueId>) -> Option<&str> {
        v.map(|v| g.values[v].name.as_str())
    }

    /// GPT-2's Conv1D: x [2,8,16] flattened to rows by `flatten` (%x2), addmm, then `tail` (ops on
    /// %h2, the addmm's [16,32]; %s3 spells [2,8,32], %s4 [-1,32]).
    fn conv1d(flatten: &str, tail: &str) -> String {
        format!(
            "graph(%x: f32[2,8,16], %w: f32[16,32], %b: f32[32], %res: f32[2,8,32], %bias: f32[32], %c: f32[2,8,1]):
               %one = prim::Constant[1]()
               %zero = prim::Constant[0]()
               %m1 = prim::Constant[-1]()
               %f = prim::Constant[False]()
               %t = prim::Constant[True]()
               %p = prim::Constant[0.1]()
               %none = prim::Constant[None]()
               %c2 = prim::Constant[2]()
               %c8 = prim::Constant[8]()
               %c16 = prim::Constant[16]()
               %c32 = prim::Constant[32]()
               %f32 = prim::Constant[6]()
               %bf16 = prim::Constant[15]()
               %s2 = prim::ListConstruct(%m1, %c16)
               %s3 = prim::ListConstruct(%c2, %c8, %c32)
               %s4 = prim::ListConstruct(%m1, %c32)
               {flatten}
               %h2 = aten::addmm(%b, %x2, %w, %one, %one) : f32[16,32]
               {tail}"
        )
    }

    const VIEW_X: &str = "%x2 = aten::view(%x, %s2) : f32[16,16]";
    const VIEW_BACK: &str = "%h = aten::view(%h2, %s3) : f32[2,8,32]";

    #[test]
    fn addmm_over_a_flattened_input_reads_the_original_rows() {
        let (g, m) = parsed(&conv1d(
            VIEW_X,
            &format!(
                "{VIEW_BACK}
                 %d = aten::dropout(%h, %p, %f) : f32[2,8,32]
                 %y = aten::add(%d, %res, %one) : f32[2,8,32]
                 return (%y)"
            ),
        ));
        let m = m.unwrap();
        assert_eq!(m.epilogue.text(), "leaves=full;v1=add(v0,l0)");
        // The op reads x, so its output is [2,8,32], the add's shape; both views and the dropout
        // are the pattern's.
        assert_eq!(name(&g, m.a), Some("x"));
        assert_eq!(outputs(&g, &m.nodes), ["x2", "h", "d", "y"]);
        assert_eq!(name(&g, Some(m.output)), Some("y"));
        // reshape, _unsafe_view and flatten flatten the same way.
        for flatten in [
            "%x2 = aten::reshape(%x, %s2) : f32[16,16]",
            "%x2 = aten::_unsafe_view(%x, %s2) : f32[16,16]",
            "%x2 = aten::flatten(%x, %zero, %one) : f32[16,16]",
        ] {
            let (g, m) = parsed(&conv1d(
                flatten,
                &format!(
                    "{VIEW_BACK}
                     %y = aten::relu(%h) : f32[2,8,32]
                     return (%y)"
                ),
            ));
            let m = m.unwrap();
            assert_eq!(name(&g, m.a), Some("x"), "{flatten}");
            assert_eq!(outputs(&g, &m.nodes), ["x2", "h", "y"], "{flatten}");
        }
    }

    #[test]
    fn a_pattern_ending_in_the_flattened_rows_keeps_the_2d_operand() {
        // No view back: the pattern ends at [16,32], the addmm's own shape.
        let (g, m) = parsed(&conv1d(
            VIEW_X,
            "%r = aten::relu(%h2) : f32[16,32]
             return (%r)",
        ));
        let m = m.unwrap();
        assert_eq!((m.a, outputs(&g, &m.nodes)), (None, vec!["r".to_string()]));
        // A view of x that another node reads is left in the graph; the op still reads x.
        let (g, m) = parsed(&conv1d(
            VIEW_X,
            &format!(
                "{VIEW_BACK}
                 %y = aten::relu(%h) : f32[2,8,32]
                 %s = aten::sum(%x2, %none) : f32[]
                 return (%y, %s)"
            ),
        ));
        let m = m.unwrap();
        assert_eq!(name(&g, m.a), Some("x"));
        assert_eq!(outputs(&g, &m.nodes), ["h", "y"]);
        // A transposed x is no row-major tensor to read in place: the op reads the copy the
        // reshape made, so the pattern ends where its shape is the addmm's.
        let (_, m) = parsed(
            &conv1d(
                "%xt = aten::transpose(%x, %zero, %one) : f32[8,2,16]{16,128,1}
                 %x2 = aten::reshape(%xt, %s2) : f32[16,16]",
                "%r = aten::relu(%h2) : f32[16,32]
                 %y = aten::view(%r, %s5) : f32[8,2,32]
                 %e = aten::exp(%y) : f32[8,2,32]
                 return (%e)",
            )
            .replace(
                "%s4 = prim::ListConstruct(%m1, %c32)",
                "%s5 = prim::ListConstruct(%c8, %c2, %c32)",
            ),
        );
        let m = m.unwrap();
        assert_eq!((m.epilogue.label(), m.a), ("relu".to_string(), None));
    }

    #[test]
    fn views_within_the_epilogue_keep_n_last_and_the_order() {
        // unsqueeze, squeeze and contiguous of packed values; a residual met in the flattened
        // rows; the view back to [2,8,32] last.
        let (g, m) = parsed(&conv1d(
            VIEW_X,
            &format!(
                "{VIEW_BACK}
                 %u = aten::unsqueeze(%h, %zero) : f32[1,2,8,32]
                 %r = aten::relu(%u) : f32[1,2,8,32]
                 %q = aten::squeeze(%r, %zero) : f32[2,8,32]
                 %k = aten::contiguous(%q, %zero) : f32[2,8,32]
                 %k2 = aten::view(%k, %s4) : f32[16,32]
                 %res2 = aten::view(%res, %s4) : f32[16,32]
                 %a = aten::add(%k2, %res2, %one) : f32[16,32]
                 %y = aten::view(%a, %s3) : f32[2,8,32]
                 %e = aten::exp(%y) : f32[2,8,32]
                 return (%e)"
            ),
        ));
        let m = m.unwrap();
        assert_eq!(
            m.epilogue.text(),
            "leaves=full;v1=relu(v0);v2=add(v1,l0);v3=exp(v2)"
        );
        // The residual is read from %res, the tensor its view respells; the op reads x, whose
        // leading dims the exp has.
        assert_eq!(name(&g, Some(m.leaves[0])), Some("res"));
        assert_eq!(name(&g, m.a), Some("x"));
        assert_eq!(
            outputs(&g, &m.nodes),
            ["x2", "h", "u", "r", "q", "k", "k2", "res2", "a", "y", "e"]
        );
        // Ending at the add, in the flattened rows, the op reads the addmm's own operand and
        // leaves the view back to the graph.
        let (g, m) = parsed(&conv1d(
            VIEW_X,
            &format!(
                "{VIEW_BACK}
                 %r = aten::relu(%h) : f32[2,8,32]
                 %r2 = aten::view(%r, %s4) : f32[16,32]
                 %res2 = aten::view(%res, %s4) : f32[16,32]
                 %a = aten::add(%r2, %res2, %one) : f32[16,32]
                 %y = aten::view(%a, %s3) : f32[2,8,32]
                 return (%y)"
            ),
        ));
        let m = m.unwrap();
        assert_eq!(m.a, None);
        assert_eq!(outputs(&g, &m.nodes), ["h", "r", "r2", "res2", "a"]);
    }

    #[test]
    fn to_the_same_dtype_and_eval_dropout_are_transparent_a_cast_and_train_dropout_are_not() {
        let tail = |node: &str| {
            conv1d(
                VIEW_X,
                &format!(
                    "{VIEW_BACK}
                     %r = aten::relu(%h) : f32[2,8,32]
                     {node}
                     %y = aten::exp(%z) : f32[2,8,32]
                     return (%y)"
                ),
            )
        };
        for node in [
            "%z = aten::to(%r, %f32, %f, %f, %none) : f32[2,8,32]",
            "%z = aten::type_as(%r, %res) : f32[2,8,32]",
            "%z = aten::dropout(%r, %p, %f) : f32[2,8,32]",
            "%z = aten::detach(%r) : f32[2,8,32]",
        ] {
            let m = parsed(&tail(node)).1.unwrap();
            assert_eq!(m.epilogue.label(), "relu_exp", "{node}");
        }
        for node in [
            "%z = aten::to(%r, %bf16, %f, %f, %none) : bf16[2,8,32]",
            "%z = aten::to(%r, %f32, %f, %t, %none) : f32[2,8,32]",
            "%z = aten::dropout(%r, %p, %t) : f32[2,8,32]",
        ] {
            let (g, m) = parsed(
                &tail(node).replace("%y = aten::exp(%z) : f32", "%y = aten::exp(%z) : bf16"),
            );
            let m = m.unwrap();
            assert_eq!(
                (m.epilogue.label(), name(&g, Some(m.output))),
                ("relu".to_string(), Some("r")),
                "{node}"
            );
        }
    }

    #[test]
    fn an_expanded_bias_is_a_row_leaf_and_its_expand_the_patterns() {
        let text = |reader: &str| {
            conv1d(
                VIEW_X,
                &format!(
                    "{VIEW_BACK}
                     %b3 = aten::view(%bias, %s4) : f32[1,32]
                     %e = aten::expand(%b3, %s3, %f) : f32[2,8,32]{{0,0,1}}
                     %y = aten::mul(%h, %e) : f32[2,8,32]
                     {reader}
                     return (%y)"
                ),
            )
        };
        let (g, m) = parsed(&text(""));
        let m = m.unwrap();
        assert_eq!(m.epilogue.text(), "leaves=row;v1=mul(v0,l0)");
        assert_eq!(name(&g, Some(m.leaves[0])), Some("bias"));
        assert_eq!(outputs(&g, &m.nodes), ["x2", "h", "b3", "e", "y"]);
        // Read elsewhere too, the expand stays (and so does the view it reads); the leaf is still
        // the bias, a row.
        let (g, m) = parsed(
            &text("%s = aten::sum(%e, %none) : f32[]").replace("return (%y)", "return (%y, %s)"),
        );
        let m = m.unwrap();
        assert_eq!(m.epilogue.text(), "leaves=row;v1=mul(v0,l0)");
        assert_eq!(outputs(&g, &m.nodes), ["x2", "h", "y"]);
        // An expanded [2,1,32] is no row: the expanded tensor is a full-size leaf, read as it is.
        let (g, m) = parsed(
            &conv1d(
                VIEW_X,
                &format!(
                    "{VIEW_BACK}
                     %e = aten::expand(%g, %s3, %f) : f32[2,8,32]{{32,0,1}}
                     %y = aten::mul(%h, %e) : f32[2,8,32]
                     return (%y)"
                ),
            )
            .replace("%c: f32[2,8,1]", "%g: f32[2,1,32]"),
        );
        let m = m.unwrap();
        assert_eq!(m.epilogue.text(), "leaves=full;v1=mul(v0,l0)");
        assert_eq!(name(&g, Some(m.leaves[0])), Some("e"));
    }

    #[test]
    fn a_col_leaf_only_meets_the_outputs_own_shape() {
        // [2,8,1] over the [2,8,32] output: a col leaf.
        let text = |tail: &str| conv1d(VIEW_X, &format!("{VIEW_BACK}\n{tail}"));
        let m = parsed(&text(
            "%y = aten::mul(%h, %c) : f32[2,8,32]
             return (%y)",
        ))
        .1
        .unwrap();
        assert_eq!(m.epilogue.text(), "leaves=col;v1=mul(v0,l0)");
        // Met in the flattened rows, [16,1] is a col leaf of a [16,32] value: the pattern may end
        // there (reading the addmm's own operand), but not at the exp in [2,8,32] after it.
        let (g, m) = parsed(
            &text(
                "%r = aten::relu(%h) : f32[2,8,32]
                 %r2 = aten::view(%r, %s4) : f32[16,32]
                 %y2 = aten::mul(%r2, %c2d) : f32[16,32]
                 %y = aten::view(%y2, %s3) : f32[2,8,32]
                 %e = aten::exp(%y) : f32[2,8,32]
                 return (%e)",
            )
            .replace("%c: f32[2,8,1]", "%c2d: f32[16,1]"),
        );
        let m = m.unwrap();
        assert_eq!(
            (m.epilogue.text().as_str(), name(&g, Some(m.output)), m.a),
            ("leaves=col;v1=relu(v0);v2=mul(v1,l0)", Some("y2"), None)
        );
    }

    #[test]
    fn a_trailing_view_is_left_to_the_next_gemm() {
        // The MLP of a GPT-2 block without its size reads: the first pattern ends at its GELU,
        // leaving the view that flattens it to the second GEMM, which reads the GELU's output.
        let g = Graph::parse(
            "graph(%x: f32[2,8,16], %w: f32[16,32], %b: f32[32], %v: f32[32,16], %c: f32[16]):
               %one = prim::Constant[1]()
               %m1 = prim::Constant[-1]()
               %c2 = prim::Constant[2]()
               %c8 = prim::Constant[8]()
               %c16 = prim::Constant[16]()
               %c32 = prim::Constant[32]()
               %exact = prim::Constant[\"none\"]()
               %s2 = prim::ListConstruct(%m1, %c16)
               %s3 = prim::ListConstruct(%c2, %c8, %c32)
               %s4 = prim::ListConstruct(%m1, %c32)
               %s5 = prim::ListConstruct(%c2, %c8, %c16)
               %x2 = aten::view(%x, %s2) : f32[16,16]
               %h2 = aten::addmm(%b, %x2, %w, %one, %one) : f32[16,32]
               %h = aten::view(%h2, %s3) : f32[2,8,32]
               %g = aten::gelu(%h, %exact) : f32[2,8,32]
               %g2 = aten::view(%g, %s4) : f32[16,32]
               %o2 = aten::addmm(%c, %g2, %v, %one, %one) : f32[16,16]
               %o = aten::view(%o2, %s5) : f32[2,8,16]
               %y = aten::add(%x, %o, %one) : f32[2,8,16]
               return (%y)",
        )
        .unwrap();
        let found = crate::kinds::match_kinds(&g, &[&crate::kinds::gemm::Gemm]);
        let got: Vec<(Option<&str>, Vec<String>)> = found
            .of::<GemmMatch>()
            .iter()
            .map(|m| {
                let e = m.epilogue.as_ref().expect("both fused");
                (name(&g, e.a), outputs(&g, &e.nodes))
            })
            .collect();
        assert_eq!(
            got,
            [
                (Some("x"), vec!["x2".into(), "h".into(), "g".into()]),
                (Some("g"), vec!["g2".into(), "o".into(), "y".into()])
            ]
        );
    }

    /// ConvNeXt's block end: the second linear, the permute back to NCHW, the layer scale
    /// ([C, 1, 1]) and the residual added in place (a channels-last block input).
    const CONVNEXT: &str = "graph(%x: bf16[8,16,16,128], %w: bf16[32,128], %b: bf16[32], %gamma: bf16[32,1,1], %res: bf16[8,32,16,16]{8192,1,512,32}):
               %h = aten::linear(%x, %w, %b) : bf16[8,16,16,32]
               %p = prim::Constant[[0, 3, 1, 2]]()
               %t = aten::permute(%h, %p) : bf16[8,32,16,16]{8192,1,512,32}
               %one = prim::Constant[1]()
               %s = aten::mul(%gamma, %t) : bf16[8,32,16,16]{8192,1,512,32}
               %y = aten::add_(%s, %res, %one) : bf16[8,32,16,16]{8192,1,512,32}
               return (%y)";

    fn names(g: &Graph, nodes: &[NodeId]) -> Vec<String> {
        nodes.iter().map(|&n| g.nodes[n].kind.clone()).collect()
    }

    #[test]
    fn a_permute_with_ops_after_it_turns_the_pattern() {
        let g = Graph::parse(CONVNEXT).unwrap();
        let gm = match_gemms(&g).into_iter().next().unwrap();
        let m = match_epilogue(&g, &gm).unwrap();
        assert_eq!(m.order, Some(vec![0, 3, 1, 2]));
        assert_eq!(
            m.epilogue.text(),
            "leaves=row,full;v1=mul(l0,v0);v2=add(v1,l1)"
        );
        assert_eq!(
            names(&g, &m.nodes),
            ["aten::permute", "aten::mul", "aten::add_"]
        );
        assert_eq!(g.values[m.output].name, "y");
        // transpose is a reordering too: [B, T, C] → [B, C, T], a vector over C as [C, 1].
        let m = epilogue_of(
            "graph(%x: f32[4,8,16], %w: f32[32,16], %v: f32[32,1], %r: f32[4,32,8]):
               %none = prim::Constant[None]()
               %h = aten::linear(%x, %w, %none) : f32[4,8,32]
               %a = prim::Constant[1]()
               %c = prim::Constant[2]()
               %t = aten::transpose(%h, %a, %c) : f32[4,32,8]{256,1,32}
               %s = aten::mul(%t, %v) : f32[4,32,8]{256,1,32}
               %y = aten::sub(%s, %r, %a) : f32[4,32,8]{256,1,32}
               return (%y)",
        )
        .unwrap();
        assert_eq!(m.order, Some(vec![0, 2, 1]));
        assert_eq!(m.epilogue.leaves, vec![LeafKind::Row, LeafKind::Full]);
    }

    #[test]
    fn a_turn_needs_ops_after_it_and_no_leaf_before_it() {
        // A permute the pattern would end at is left to the graph: the GELU alone fuses.
        let m = epilogue_of(
            "graph(%x: f32[8,16,16,128], %w: f32[32,128]):
               %none = prim::Constant[None]()
               %h = aten::linear(%x, %w, %none) : f32[8,16,16,32]
               %g = aten::gelu(%h) : f32[8,16,16,32]
               %p = prim::Constant[[0, 3, 1, 2]]()
               %t = aten::permute(%g, %p) : f32[8,32,16,16]{8192,1,512,32}
               %c = aten::contiguous(%t) : f32[8,32,16,16]
               return (%c)",
        )
        .unwrap();
        assert_eq!(
            (m.order, m.epilogue.text()),
            (None, "leaves=;v1=gelu(v0)".to_string())
        );
        // A leaf read before the turn lies in the GEMM's order: the chain stops at the permute.
        let m = epilogue_of(
            "graph(%x: f32[8,16,16,128], %w: f32[32,128], %v: f32[32], %g: f32[32,1,1]):
               %none = prim::Constant[None]()
               %h = aten::linear(%x, %w, %none) : f32[8,16,16,32]
               %u = aten::mul(%h, %v) : f32[8,16,16,32]
               %p = prim::Constant[[0, 3, 1, 2]]()
               %t = aten::permute(%u, %p) : f32[8,32,16,16]{8192,1,512,32}
               %s = aten::mul(%t, %g) : f32[8,32,16,16]{8192,1,512,32}
               return (%s)",
        )
        .unwrap();
        assert_eq!(
            (m.order, m.epilogue.text()),
            (None, "leaves=row;v1=mul(v0,l0)".to_string())
        );
    }

    #[test]
    fn after_a_turn_values_from_before_it_and_other_shapes_end_the_chain() {
        // [4, 4, 4, 4]: the GEMM's value and its permute have one shape, not one order.
        let m = epilogue_of(
            "graph(%x: f32[4,4,4,8], %w: f32[4,8]):
               %none = prim::Constant[None]()
               %h = aten::linear(%x, %w, %none) : f32[4,4,4,4]
               %e = aten::exp(%h) : f32[4,4,4,4]
               %p = prim::Constant[[0, 3, 1, 2]]()
               %t = aten::permute(%e, %p) : f32[4,4,4,4]{64,1,16,4}
               %s = aten::mul(%t, %e) : f32[4,4,4,4]
               return (%s)",
        )
        .unwrap();
        assert_eq!(
            (m.order, m.epilogue.text()),
            (None, "leaves=;v1=exp(v0)".to_string())
        );
        // The same through a transparent node: eval dropout keeps the earlier order.
        let m = epilogue_of(
            "graph(%x: f32[4,4,4,8], %w: f32[4,8]):
               %none = prim::Constant[None]()
               %h = aten::linear(%x, %w, %none) : f32[4,4,4,4]
               %e = aten::exp(%h) : f32[4,4,4,4]
               %p = prim::Constant[[0, 3, 1, 2]]()
               %t = aten::permute(%e, %p) : f32[4,4,4,4]{64,1,16,4}
               %zero = prim::Constant[0.0]()
               %no = prim::Constant[False]()
               %d = aten::dropout(%e, %zero, %no) : f32[4,4,4,4]
               %s = aten::mul(%t, %d) : f32[4,4,4,4]
               return (%s)",
        )
        .unwrap();
        assert_eq!(m.order, None);
        // A leaf that broadcasts over the channels (one value per pixel) is no row, full or
        // scalar leaf in the GEMM's order: the turn is not taken.
        let m = epilogue_of(
            "graph(%x: f32[8,16,16,128], %w: f32[32,128], %r: f32[8,1,16,16]):
               %none = prim::Constant[None]()
               %h = aten::linear(%x, %w, %none) : f32[8,16,16,32]
               %g = aten::relu(%h) : f32[8,16,16,32]
               %p = prim::Constant[[0, 3, 1, 2]]()
               %t = aten::permute(%g, %p) : f32[8,32,16,16]{8192,1,512,32}
               %s = aten::mul(%t, %r) : f32[8,32,16,16]{8192,1,512,32}
               return (%s)",
        )
        .unwrap();
        assert_eq!(m.order, None);
    }

    #[test]
    fn an_in_place_op_may_write_only_a_pattern_value() {
        // `res += h` writes the residual, which lives on past the pattern: not fused.
        let m = epilogue_of(
            "graph(%x: f32[8,16], %w: f32[32,16], %res: f32[8,32]):
               %none = prim::Constant[None]()
               %h = aten::linear(%x, %w, %none) : f32[8,32]
               %r = aten::relu(%h) : f32[8,32]
               %one = prim::Constant[1]()
               %y = aten::add_(%res, %r, %one) : f32[8,32]
               return (%y, %res)",
        )
        .unwrap();
        assert_eq!(m.epilogue.text(), "leaves=;v1=relu(v0)");
        // `h += res` writes the pattern's own value: fused.
        let m = epilogue_of(
            "graph(%x: f32[8,16], %w: f32[32,16], %res: f32[8,32]):
               %none = prim::Constant[None]()
               %h = aten::linear(%x, %w, %none) : f32[8,32]
               %one = prim::Constant[1]()
               %y = aten::add_(%h, %res, %one) : f32[8,32]
               return (%y)",
        )
        .unwrap();
        assert_eq!(m.epilogue.text(), "leaves=full;v1=add(v0,l0)");
    }
}
