//! GEMM + elementwise epilogue: a GEMM rule's match extended by the chain or DAG of elementwise
//! ops that consume its output, when every intermediate is used only inside the pattern.
//!
//! out = f(a · B (+ bias), l₀, l₁, …) where f is a program of elementwise ops over fp32 values:
//! `v0` is the GEMM's result (with its bias, if any), each instruction defines the next value
//! from earlier values, leaves and scalars, and the last value is the output. A leaf is an input
//! from outside the pattern: a tensor of the output's shape (a residual), a vector along the
//! output's last dim (`row`, indexed by n, like a bias), a vector along its rows (`col`, shape
//! [..., 1], indexed by m) or a one-element tensor (`scalar`). Python scalars are constants of the
//! program. A value used twice (x·sigmoid(x)) is computed once: the program is a DAG.
//!
//! The program (program.rs) has one text form (`Epilogue::text`), read by the torch op to run the
//! original ops when a call does not fit the kernel, and rendered by codegen into a device functor.
//! Ops: add, sub, mul, div (value, leaf or scalar on either side), relu, gelu (erf), gelu_tanh,
//! sigmoid, silu, tanh, mish, softplus, exp, neg, leaky_relu, hardtanh/clamp/clamp_min/clamp_max,
//! pow with a scalar exponent; `dropout` in eval is the identity. Anything else ends the chain.
//!
//! `EpilogueRule` offers each GEMM with its longest epilogue; the GEMM alone is `GemmRule`'s match.

mod program;

use super::gemm::{match_gemms, GemmMatch};
use super::{boxed, Match, PatternKind, Rule};
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::types::DType;
use std::collections::{BTreeSet, HashMap};

pub use program::*;

/// A GEMM match with the epilogue that follows it.
#[derive(Clone, Debug, PartialEq)]
pub struct EpilogueMatch {
    pub epilogue: Epilogue,
    /// The pattern's elementwise nodes, in program order (the GEMM node is not among them).
    pub nodes: Vec<NodeId>,
    /// The leaf tensors, in `epilogue.leaves` order.
    pub leaves: Vec<ValueId>,
    /// The value the pattern produces (the last node's output).
    pub output: ValueId,
}

/// One elementwise node read as an instruction over graph values: operands as values or
/// constants, before they are mapped to program values and leaves.
enum Operand {
    Tensor(ValueId),
    Scalar(f64),
}

/// The instruction a node computes, if it is one the epilogue supports: (op, operands), with
/// `dropout` in eval as `None` op (the identity).
fn read_node(g: &Graph, id: NodeId) -> Option<(Option<EpOp>, Vec<Operand>)> {
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
    let unary = |op: EpOp| Some((Some(op), vec![operand(0)?]));
    match kind {
        "add" | "sub" => {
            // alpha must be 1; add(Tensor, Scalar, alpha) and add(Tensor, Tensor, alpha) alike.
            if n.inputs.len() == 3 && num(2) != Some(1.0) {
                return None;
            }
            let op = if kind == "add" { EpOp::Add } else { EpOp::Sub };
            Some((Some(op), vec![operand(0)?, operand(1)?]))
        }
        "rsub" => {
            if n.inputs.len() == 3 && num(2) != Some(1.0) {
                return None;
            }
            Some((Some(EpOp::Sub), vec![operand(1)?, operand(0)?]))
        }
        "mul" | "div" if n.inputs.len() == 2 => Some((
            Some(if kind == "mul" { EpOp::Mul } else { EpOp::Div }),
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
            Some(EpOp::Softplus),
            vec![
                operand(0)?,
                Operand::Scalar(num(1)?),
                Operand::Scalar(num(2)?),
            ],
        )),
        "leaky_relu" => Some((
            Some(EpOp::LeakyRelu),
            vec![operand(0)?, Operand::Scalar(num(1).unwrap_or(0.01))],
        )),
        "hardtanh" => Some((
            Some(EpOp::Clamp),
            vec![
                operand(0)?,
                Operand::Scalar(num(1)?),
                Operand::Scalar(num(2)?),
            ],
        )),
        "relu6" => Some((
            Some(EpOp::Clamp),
            vec![operand(0)?, Operand::Scalar(0.0), Operand::Scalar(6.0)],
        )),
        "clamp" => match (num(1), num(2), cst(1), cst(2)) {
            (Some(lo), Some(hi), _, _) => Some((
                Some(EpOp::Clamp),
                vec![operand(0)?, Operand::Scalar(lo), Operand::Scalar(hi)],
            )),
            (Some(lo), None, _, Some(Const::None)) => {
                Some((Some(EpOp::ClampMin), vec![operand(0)?, Operand::Scalar(lo)]))
            }
            (None, Some(hi), Some(Const::None), _) => {
                Some((Some(EpOp::ClampMax), vec![operand(0)?, Operand::Scalar(hi)]))
            }
            _ => None,
        },
        "clamp_min" => Some((
            Some(EpOp::ClampMin),
            vec![operand(0)?, Operand::Scalar(num(1)?)],
        )),
        "clamp_max" => Some((
            Some(EpOp::ClampMax),
            vec![operand(0)?, Operand::Scalar(num(1)?)],
        )),
        "pow" => Some((Some(EpOp::Pow), vec![operand(0)?, Operand::Scalar(num(1)?)])),
        "dropout" if matches!(cst(2), Some(Const::Bool(false))) => Some((None, vec![operand(0)?])),
        _ => None,
    }
}

/// How a tensor of `shape` and `dtype` lies over an output of `out` shape, if it can be a leaf.
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
    if shape == out {
        return Some(LeafKind::Full);
    }
    let lead_ones = shape.iter().take_while(|&&d| d == 1).count();
    let rest = &shape[lead_ones..];
    let n = *out.last()?;
    if rest == [n] {
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

/// The longest epilogue after `gm`'s GEMM: nodes are taken in program order while they are
/// supported elementwise ops over the pattern's values, leaves and constants; the pattern is
/// cut at the last point where exactly one of its values is used outside it (or is a graph
/// output) and that value is the last node's. `None` when not even one op can be fused.
pub fn match_epilogue(g: &Graph, gm: &GemmMatch) -> Option<EpilogueMatch> {
    let gemm_out = *g.nodes[gm.node].outputs.first()?;
    let out_info = g.tensor(gemm_out)?.clone();
    let batched = gm.problem.batch > 1;
    let readers = Readers {
        users: g.readers(),
        graph_outputs: g.outputs.iter().copied().collect(),
    };
    // Program values by graph value; value 0 is the GEMM's output.
    let mut pat = Pattern {
        program: HashMap::from([(gemm_out, 0)]),
        instrs: Vec::new(),
        leaves: Vec::new(),
        nodes: Vec::new(),
    };
    let mut best: Option<EpilogueMatch> = None;
    for id in gm.node + 1..g.nodes.len() {
        let n = &g.nodes[id];
        if n.depth != 0 || !n.inputs.iter().any(|v| pat.program.contains_key(v)) {
            continue;
        }
        let Some((op, operands)) = read_node(g, id) else {
            break;
        };
        let out = n.outputs[0];
        match g.tensor(out) {
            Some(t) if t.shape == out_info.shape && t.dtype == out_info.dtype => {}
            _ => break,
        }
        let Some(args) = operands
            .into_iter()
            .map(|o| pat.arg(o, g, &out_info.shape, gm.problem.dtype, batched))
            .collect::<Option<Vec<Arg>>>()
        else {
            break;
        };
        match (op, args[0]) {
            // The identity (eval dropout): the output is the operand's program value.
            (None, Arg::Value(p)) => {
                pat.program.insert(out, p);
            }
            (None, _) => break,
            // Unary ops take a value first; binary ops may hold it on either side.
            (Some(op), first) if op.scalar_params() && !matches!(first, Arg::Value(_)) => break,
            (Some(op), _) => {
                pat.instrs.push(Instr { op, args });
                pat.program.insert(out, pat.instrs.len());
            }
        }
        pat.nodes.push(id);
        if let Some(m) = pat.cut(out, &readers) {
            best = Some(m);
        }
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
        PatternKind::Epilogue
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

/// Who reads each value, and what the graph returns: what decides whether a value escapes.
struct Readers {
    users: Vec<Vec<NodeId>>,
    graph_outputs: BTreeSet<ValueId>,
}

/// The pattern taken so far: program values by graph value, instructions, leaves and nodes.
struct Pattern {
    program: HashMap<ValueId, usize>,
    instrs: Vec<Instr>,
    leaves: Vec<(ValueId, LeafKind)>,
    nodes: Vec<NodeId>,
}

impl Pattern {
    /// The program operand for a node's operand: a program value, a constant, or a leaf (taken
    /// now if new). None when it cannot be one: a tensor that does not lie over the output, or
    /// more leaves (or full-size leaves) than kernels take.
    fn arg(
        &mut self,
        o: Operand,
        g: &Graph,
        out: &[i64],
        dtype: DType,
        batched: bool,
    ) -> Option<Arg> {
        let v = match o {
            Operand::Scalar(s) => return Some(Arg::Scalar(Scalar(s))),
            Operand::Tensor(v) => v,
        };
        if let Some(&p) = self.program.get(&v) {
            return Some(Arg::Value(p));
        }
        if let Some(i) = self.leaves.iter().position(|(lv, _)| *lv == v) {
            return Some(Arg::Leaf(i));
        }
        let t = g.tensor(v)?;
        let kind = leaf_kind(&t.shape, &t.dtype, out, dtype, batched)?;
        let full = self
            .leaves
            .iter()
            .filter(|(_, k)| *k == LeafKind::Full)
            .count();
        if self.leaves.len() == MAX_LEAVES || (kind == LeafKind::Full && full == MAX_FULL_LEAVES) {
            return None;
        }
        self.leaves.push((v, kind));
        Some(Arg::Leaf(self.leaves.len() - 1))
    }

    /// The pattern as it stands, if `last` is its only value seen outside it.
    fn cut(&self, last: ValueId, readers: &Readers) -> Option<EpilogueMatch> {
        if self.instrs.is_empty() {
            return None;
        }
        let inside: BTreeSet<NodeId> = self.nodes.iter().copied().collect();
        let escapes = |v: ValueId| {
            readers.graph_outputs.contains(&v)
                || readers.users[v].iter().any(|u| !inside.contains(u))
        };
        if self.program.keys().any(|&v| v != last && escapes(v)) {
            return None;
        }
        Some(EpilogueMatch {
            epilogue: Epilogue {
                leaves: self.leaves.iter().map(|l| l.1).collect(),
                instrs: self.instrs.clone(),
            },
            nodes: self.nodes.clone(),
            leaves: self.leaves.iter().map(|l| l.0).collect(),
            output: last,
        })
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
}
