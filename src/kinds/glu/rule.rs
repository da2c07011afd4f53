//! Gated-MLP rule: `glu_<act>[_bias]`.
//!
//! out[m,i] = act(Σ_k x[m,k]·Wg[i,k] + bg[i]) · (Σ_k x[m,k]·Wu[i,k] + bu[i]) for x [.., K] (M rows:
//! its leading dims) and the gate and up weights Wg, Wu [I,K], act SiLU or GELU (tanh or erf).
//! The graph writes it `mul(act(linear(x, Wg, bg)), linear(x, Wu, bu))` (Llama's, Qwen2's,
//! Gemma's MLP before its down projection), the mul's operands in either order. Both linears read
//! the same x; both weights (and biases, present in both or neither) are module parameters read
//! through `prim::GetAttr`, because compose concatenates them once into a buffer of the composed
//! module; nothing outside the pattern reads the gate, its activation or up (the op returns only
//! their product). I a multiple of `INTERLEAVE`, K of 16 bytes (the kernels' rows).
//!
//! The pattern holds two GEMMs, so the cover takes it before the gate GEMM's epilogue match of
//! `act · up` (one GEMM, up a residual leaf); that match is kept on the GLU match (`unfused`), the
//! smaller pattern compose realizes when no GLU kernel wins.
//!
//! The fused form: one linear over the gate and up weights stacked in one parameter [2I, K],
//! its output chunked in two along the last dim, `mul(up, act(gate))` (Phi-3's `gate_up_proj`).
//! The same problem; compose interleaves the parameter's two halves, and the op's fallback
//! replays the one linear and the chunk.

use super::problem::{Act, GluProblem, INTERLEAVE};
use super::GLU;
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::kinds::gemm::GemmMatch;
use crate::rules::{boxed, Match, PatternKind, Rule};
use crate::types::DType;

#[derive(Clone, Debug, PartialEq)]
pub struct GluMatch {
    /// The `aten::mul`: the pattern's last node, whose output the op's takes over.
    pub node: NodeId,
    pub gate: NodeId,
    pub act_node: NodeId,
    pub up: NodeId,
    pub x: ValueId,
    pub w_gate: ValueId,
    pub w_up: ValueId,
    pub b_gate: Option<ValueId>,
    pub b_up: Option<ValueId>,
    pub problem: GluProblem,
    /// The gate GEMM with `act · up` as its epilogue (the GEMM kind's match of those nodes),
    /// where the GEMM kind finds one: what compose realizes when no GLU kernel wins.
    pub unfused: Option<GemmMatch>,
    /// The fused form's chunk of the one linear's output: then `gate` and `up` are that linear,
    /// `w_gate` and `w_up` its [2I, K] weight (gate rows first), `b_gate` and `b_up` its bias.
    pub split: Option<Split>,
}

/// `chunk(linear(..), 2, -1)` and the `prim::ListUnpack` of its two halves (gate, up).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Split {
    pub chunk: NodeId,
    pub unpack: NodeId,
}

impl Match for GluMatch {
    fn nodes(&self) -> Vec<NodeId> {
        match self.split {
            Some(s) => vec![self.gate, s.chunk, s.unpack, self.act_node, self.node],
            None => vec![self.gate, self.act_node, self.up, self.node],
        }
    }
}

/// The gated-MLP rule.
pub struct GluRule;

impl Rule for GluRule {
    fn name(&self) -> &'static str {
        "glu"
    }
    fn kind(&self) -> PatternKind {
        GLU
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_glus(g))
    }
}

/// Every gated MLP of the top-level block.
pub fn match_glus(g: &Graph) -> Vec<GluMatch> {
    let readers = g.readers();
    let mut found: Vec<GluMatch> = (0..g.nodes.len())
        .filter(|&n| g.nodes[n].depth == 0 && g.nodes[n].kind == "aten::mul")
        .filter_map(|n| glu(g, &readers, n))
        .collect();
    if !found.is_empty() {
        let epilogues: Vec<GemmMatch> = crate::kinds::gemm::EpilogueRule
            .find(g)
            .into_iter()
            .filter_map(|m| {
                let any: &dyn std::any::Any = &*m;
                any.downcast_ref::<GemmMatch>().cloned()
            })
            .collect();
        for f in &mut found {
            let mine = f.nodes();
            f.unfused = epilogues
                .iter()
                .filter(|e| e.node == f.gate && e.nodes().iter().all(|n| mine.contains(n)))
                .max_by_key(|e| e.nodes().len())
                .cloned();
        }
    }
    found
}

/// The single reader of `v` is `node`, and the graph does not return it.
fn only_read_by(g: &Graph, readers: &[Vec<NodeId>], v: ValueId, node: NodeId) -> bool {
    readers[v].iter().all(|&r| r == node) && !g.outputs.contains(&v)
}

/// A `linear(x, w, b?)` node producing `v`: (node, x, w, b).
fn linear(g: &Graph, v: ValueId) -> Option<(NodeId, ValueId, ValueId, Option<ValueId>)> {
    let n = g.values[v].producer?;
    let node = &g.nodes[n];
    if node.kind != "aten::linear" || node.depth != 0 || node.inputs.len() != 3 {
        return None;
    }
    let b = match g.constant(node.inputs[2]) {
        Some(Const::None) => None,
        _ => Some(node.inputs[2]),
    };
    Some((n, node.inputs[0], node.inputs[1], b))
}

/// The activation node producing `v`, and what it reads: `silu(g)` or `gelu(g, approximate)`.
fn activation(g: &Graph, v: ValueId) -> Option<(NodeId, Act, ValueId)> {
    let n = g.values[v].producer?;
    let node = &g.nodes[n];
    if node.depth != 0 {
        return None;
    }
    let act = match node.kind.as_str() {
        "aten::silu" if node.inputs.len() == 1 => Act::Silu,
        "aten::gelu" if node.inputs.len() == 1 => Act::Gelu,
        "aten::gelu" if node.inputs.len() == 2 => match g.constant(node.inputs[1]) {
            Some(Const::Str(s)) if s == "tanh" => Act::GeluTanh,
            Some(Const::Str(s)) if s == "none" => Act::Gelu,
            _ => return None,
        },
        _ => return None,
    };
    Some((n, act, node.inputs[0]))
}

fn glu(g: &Graph, readers: &[Vec<NodeId>], mul: NodeId) -> Option<GluMatch> {
    let n = &g.nodes[mul];
    if n.inputs.len() != 2 || n.outputs.len() != 1 {
        return None;
    }
    let (a, b) = (n.inputs[0], n.inputs[1]);
    [(a, b), (b, a)]
        .into_iter()
        .find_map(|(act_side, up_side)| {
            glu_of(g, readers, mul, act_side, up_side)
                .or_else(|| fused_glu_of(g, readers, mul, act_side, up_side))
        })
}

/// The fused form (module doc): `act_side` is act(the first half), `up_side` the second half of
/// one linear's output chunked in two along its last dim.
fn fused_glu_of(
    g: &Graph,
    readers: &[Vec<NodeId>],
    mul: NodeId,
    act_side: ValueId,
    up_side: ValueId,
) -> Option<GluMatch> {
    let (act_node, act, gate_half) = activation(g, act_side)?;
    let unpack = g.values[gate_half].producer?;
    let u = &g.nodes[unpack];
    if u.kind != "prim::ListUnpack" || u.depth != 0 || u.outputs != [gate_half, up_side] {
        return None;
    }
    let chunk = g.values[*u.inputs.first()?].producer?;
    let c = &g.nodes[chunk];
    if c.kind != "aten::chunk" || c.depth != 0 || c.inputs.len() != 3 {
        return None;
    }
    let out = c.inputs[0];
    let rank = g.tensor(out)?.shape.len() as i64;
    let two = matches!(g.constant(c.inputs[1]), Some(Const::Int(2)));
    let last = matches!(g.constant(c.inputs[2]), Some(Const::Int(d)) if *d == -1 || *d == rank - 1);
    if !two || !last {
        return None;
    }
    let (linear_node, x, w, b) = linear(g, out)?;
    if !(only_read_by(g, readers, act_side, mul)
        && only_read_by(g, readers, gate_half, act_node)
        && only_read_by(g, readers, up_side, mul)
        && only_read_by(g, readers, c.outputs[0], unpack)
        && only_read_by(g, readers, out, chunk))
    {
        return None;
    }
    let tx = g.tensor(x)?;
    let tw = g.tensor(w)?;
    let rows = *tw.shape.first()?;
    if tw.shape != [rows, *tx.shape.last()?]
        || tw.dtype != tx.dtype
        || !tw.is_packed()
        || !g.is_attribute(w)
        || rows % 2 != 0
    {
        return None;
    }
    if let Some(b) = b {
        let ok = g
            .tensor(b)
            .is_some_and(|t| t.shape == [rows] && t.dtype == tx.dtype)
            && g.is_attribute(b);
        if !ok {
            return None;
        }
    }
    let problem = glu_problem(g, mul, x, rows / 2, act, b.is_some())?;
    Some(GluMatch {
        node: mul,
        gate: linear_node,
        act_node,
        up: linear_node,
        x,
        w_gate: w,
        w_up: w,
        b_gate: b,
        b_up: b,
        problem,
        unfused: None,
        split: Some(Split { chunk, unpack }),
    })
}

/// The problem of a GLU over x (packed) whose product, `mul`'s output, is [.., inter] of x's
/// dtype, if the kernels take it: I a multiple of `INTERLEAVE`, K of 16-byte rows.
fn glu_problem(
    g: &Graph,
    mul: NodeId,
    x: ValueId,
    inter: i64,
    act: Act,
    bias: bool,
) -> Option<GluProblem> {
    let tx = g.tensor(x)?;
    let dtype = DType::parse(&tx.dtype)?;
    if !tx.is_packed() {
        return None;
    }
    let k = *tx.shape.last()?;
    let out = g.tensor(g.nodes[mul].outputs[0])?;
    let mut want = tx.shape.clone();
    *want.last_mut()? = inter;
    if out.shape != want || out.dtype != tx.dtype {
        return None;
    }
    let m: i64 = tx.shape[..tx.shape.len() - 1].iter().product();
    let vector = 16 / dtype.bytes() as i64;
    if m <= 0 || inter <= 0 || k <= 0 || inter % INTERLEAVE != 0 || k % vector != 0 {
        return None;
    }
    Some(GluProblem {
        m,
        inter,
        k,
        dtype,
        act,
        bias,
    })
}

fn glu_of(
    g: &Graph,
    readers: &[Vec<NodeId>],
    mul: NodeId,
    act_side: ValueId,
    up_side: ValueId,
) -> Option<GluMatch> {
    let (act_node, act, gate_out) = activation(g, act_side)?;
    let (gate, x, w_gate, b_gate) = linear(g, gate_out)?;
    let (up, x_up, w_up, b_up) = linear(g, up_side)?;
    if x != x_up || gate == up {
        return None;
    }
    if !(only_read_by(g, readers, act_side, mul)
        && only_read_by(g, readers, gate_out, act_node)
        && only_read_by(g, readers, up_side, mul))
    {
        return None;
    }
    let tx = g.tensor(x)?;
    let k = *tx.shape.last()?;
    let (wg, wu) = (g.tensor(w_gate)?, g.tensor(w_up)?);
    let inter = *wg.shape.first()?;
    let weight_ok = |w: &crate::graph::TensorInfo| {
        w.shape == [inter, k] && w.dtype == tx.dtype && w.is_packed()
    };
    if !weight_ok(wg) || !weight_ok(wu) || !g.is_attribute(w_gate) || !g.is_attribute(w_up) {
        return None;
    }
    let bias = match (b_gate, b_up) {
        (None, None) => false,
        (Some(bg), Some(bu)) => {
            let ok = |b: ValueId| {
                g.tensor(b)
                    .is_some_and(|t| t.shape == [inter] && t.dtype == tx.dtype)
                    && g.is_attribute(b)
            };
            if !ok(bg) || !ok(bu) {
                return None;
            }
            true
        }
        _ => return None,
    };
    let problem = glu_problem(g, mul, x, inter, act, bias)?;
    Some(GluMatch {
        node: mul,
        gate,
        act_node,
        up,
        x,
        w_gate,
        w_up,
        b_gate,
        b_up,
        problem,
        unfused: None,
        split: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gated MLP over x [2,8,64] with I = 32: `act` is the activation's line (of %g, into %a),
    /// `mul` the product's operands.
    fn graph(act: &str, mul: &str, extra: &str) -> Graph {
        Graph::parse(&format!(
            "graph(%self: Model, %x: bf16[2,8,64], %z: bf16[2,8,64]):
               %none = prim::Constant[None]()
               %tanh = prim::Constant[\"tanh\"]()
               %exact = prim::Constant[\"none\"]()
               %mlp = prim::GetAttr[name=\"mlp\"](%self) : Mlp
               %gp = prim::GetAttr[name=\"gate_proj\"](%mlp) : Linear
               %up = prim::GetAttr[name=\"up_proj\"](%mlp) : Linear
               %wg = prim::GetAttr[name=\"weight\"](%gp) : bf16[32,64]
               %wu = prim::GetAttr[name=\"weight\"](%up) : bf16[32,64]
               %g = aten::linear(%x, %wg, %none) : bf16[2,8,32]
               {act}
               %u = aten::linear(%x, %wu, %none) : bf16[2,8,32]
               %h = aten::mul({mul}) : bf16[2,8,32]
               {extra}
               return (%h)"
        ))
        .unwrap()
    }

    const SILU: &str = "%a = aten::silu(%g) : bf16[2,8,32]";

    #[test]
    fn silu_and_gelu_glus_match_in_either_order() {
        for (act, want) in [
            (SILU, Act::Silu),
            ("%a = aten::gelu(%g, %tanh) : bf16[2,8,32]", Act::GeluTanh),
            ("%a = aten::gelu(%g, %exact) : bf16[2,8,32]", Act::Gelu),
            ("%a = aten::gelu(%g) : bf16[2,8,32]", Act::Gelu),
        ] {
            for mul in ["%a, %u", "%u, %a"] {
                let g = graph(act, mul, "");
                let m = match_glus(&g);
                assert_eq!(m.len(), 1, "{act} / {mul}");
                let p = &m[0].problem;
                assert_eq!(
                    *p,
                    GluProblem {
                        m: 16,
                        inter: 32,
                        k: 64,
                        dtype: DType::Bf16,
                        act: want,
                        bias: false
                    }
                );
                let name = |v: ValueId| g.values[v].name.as_str();
                assert_eq!(
                    (name(m[0].x), name(m[0].w_gate), name(m[0].w_up)),
                    ("x", "wg", "wu")
                );
                assert_eq!(m[0].nodes().len(), 4);
                assert_eq!(g.nodes[m[0].node].kind, "aten::mul");
            }
        }
    }

    #[test]
    fn glus_that_are_not_one_gemm_stay_apart() {
        // Up reads another x.
        let g = Graph::parse(
            "graph(%self: Model, %x: bf16[2,8,64], %z: bf16[2,8,64]):
               %none = prim::Constant[None]()
               %mlp = prim::GetAttr[name=\"mlp\"](%self) : Mlp
               %wg = prim::GetAttr[name=\"wg\"](%mlp) : bf16[32,64]
               %wu = prim::GetAttr[name=\"wu\"](%mlp) : bf16[32,64]
               %g = aten::linear(%x, %wg, %none) : bf16[2,8,32]
               %a = aten::silu(%g) : bf16[2,8,32]
               %u = aten::linear(%z, %wu, %none) : bf16[2,8,32]
               %h = aten::mul(%a, %u) : bf16[2,8,32]
               return (%h)",
        )
        .unwrap();
        assert!(match_glus(&g).is_empty(), "different x");
        // Up (or the activation) read elsewhere too.
        let g = graph(
            SILU,
            "%a, %u",
            "%e = aten::add(%u, %u, %none) : bf16[2,8,32]",
        );
        assert!(match_glus(&g).is_empty(), "up read elsewhere");
        let g = graph(SILU, "%a, %u", "%e = aten::neg(%a) : bf16[2,8,32]");
        assert!(match_glus(&g).is_empty(), "the activation read elsewhere");
        // Another activation, or a product of the gate with itself.
        assert!(match_glus(&graph("%a = aten::relu(%g) : bf16[2,8,32]", "%a, %u", "")).is_empty());
        assert!(match_glus(&graph(SILU, "%a, %a", "")).is_empty());
        // Weights that are graph inputs, not parameters.
        let g = Graph::parse(
            "graph(%self: Model, %x: bf16[2,8,64], %wg: bf16[32,64], %wu: bf16[32,64]):
               %none = prim::Constant[None]()
               %g = aten::linear(%x, %wg, %none) : bf16[2,8,32]
               %a = aten::silu(%g) : bf16[2,8,32]
               %u = aten::linear(%x, %wu, %none) : bf16[2,8,32]
               %h = aten::mul(%a, %u) : bf16[2,8,32]
               return (%h)",
        )
        .unwrap();
        assert!(match_glus(&g).is_empty(), "weights from inputs");
    }

    #[test]
    fn biases_match_in_both_or_neither() {
        let text = |bu: &str| {
            format!(
                "graph(%self: Model, %x: f16[4,64]):
                   %m = prim::GetAttr[name=\"m\"](%self) : Mlp
                   %wg = prim::GetAttr[name=\"wg\"](%m) : f16[16,64]
                   %wu = prim::GetAttr[name=\"wu\"](%m) : f16[16,64]
                   %bg = prim::GetAttr[name=\"bg\"](%m) : f16[16]
                   %bu = prim::GetAttr[name=\"bu\"](%m) : f16[16]
                   %none = prim::Constant[None]()
                   %g = aten::linear(%x, %wg, %bg) : f16[4,16]
                   %a = aten::silu(%g) : f16[4,16]
                   %u = aten::linear(%x, %wu, {bu}) : f16[4,16]
                   %h = aten::mul(%u, %a) : f16[4,16]
                   return (%h)"
            )
        };
        let m = match_glus(&Graph::parse(&text("%bu")).unwrap());
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].problem.rule_id(), "glu_silu_bias");
        assert_eq!(m[0].problem.dtype, DType::F16);
        assert!(
            match_glus(&Graph::parse(&text("%none")).unwrap()).is_empty(),
            "one bias only"
        );
    }

    /// Llama's MLP as torch.jit.trace records it (transformers 5.17, `fact graph` of the zoo's
    /// llama), hidden 64, MLP 128, bf16: the post-attention RMSNorm's output and its fp32 input
    /// leave through a tuple, gate and up read the same unpacked x, down adds the residual.
    const LLAMA_MLP: &str = "graph(%self.1: CausalLM, %h: bf16[1,8,64], %r: f32[1,8,64]):
       %8 = prim::Constant[None]()
       %23 = prim::Constant[1]()
       %mlp.2 = prim::GetAttr[name=\"mlp\"](%self.1) : LlamaMLP
       %228 = prim::TupleConstruct(%h, %r) : Tuple
       %229, %230 = prim::TupleUnpack(%228) : bf16[1,8,64], f32[1,8,64]
       %down_proj.2 = prim::GetAttr[name=\"down_proj\"](%mlp.2) : Linear
       %up_proj.2 = prim::GetAttr[name=\"up_proj\"](%mlp.2) : Linear
       %gate_proj.2 = prim::GetAttr[name=\"gate_proj\"](%mlp.2) : Linear
       %weight.22 = prim::GetAttr[name=\"weight\"](%gate_proj.2) : bf16[128,64]
       %235 = aten::linear(%229, %weight.22, %8) : bf16[1,8,128]
       %236 = aten::silu(%235) : bf16[1,8,128]
       %weight.24 = prim::GetAttr[name=\"weight\"](%up_proj.2) : bf16[128,64]
       %238 = aten::linear(%229, %weight.24, %8) : bf16[1,8,128]
       %input.7 = aten::mul(%236, %238) : bf16[1,8,128]
       %weight.26 = prim::GetAttr[name=\"weight\"](%down_proj.2) : bf16[64,128]
       %241 = aten::linear(%input.7, %weight.26, %8) : bf16[1,8,64]
       %hidden_states0.3 = aten::add(%229, %241, %23) : bf16[1,8,64]
       return (%hidden_states0.3)";

    #[test]
    fn llamas_mlp_is_one_glu_that_the_cover_prefers_to_the_gate_epilogue() {
        let g = Graph::parse(LLAMA_MLP).unwrap();
        let m = match_glus(&g);
        assert_eq!(m.len(), 1);
        assert_eq!(
            m[0].problem,
            GluProblem {
                m: 8,
                inter: 128,
                k: 64,
                dtype: DType::Bf16,
                act: Act::Silu,
                bias: false
            }
        );
        // The GEMM kind's match of the same nodes, the gate with silu times up, is the fallback.
        let unfused = m[0]
            .unfused
            .as_ref()
            .expect("the gate GEMM's epilogue match");
        assert_eq!(unfused.node, m[0].gate);
        assert!(
            unfused
                .problem
                .rule_id()
                .starts_with("gemm_rcr_ep_silu_mul"),
            "{}",
            unfused.problem.rule_id()
        );
        // The cover takes the GLU (two products) over the gate's epilogue (one); down keeps its
        // residual add.
        let found =
            crate::kinds::match_kinds(&g, &[&crate::kinds::gemm::Gemm, &crate::kinds::glu::Glu]);
        let rules: Vec<String> = found.found.iter().map(|f| f.problem().rule_id()).collect();
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert!(rules.contains(&"glu_silu".to_string()), "{rules:?}");
        assert!(
            rules.iter().any(|r| r.starts_with("gemm_rcr_ep_add")),
            "{rules:?}"
        );
        let glu = found.found.iter().find(|f| f.kind.name() == "glu").unwrap();
        assert_eq!(glu.id, "g0");
        let u = glu.kind.unfused(&*glu.found).expect("a smaller pattern");
        assert_eq!(u.kind.name(), "gemm");
        assert_eq!(u.found.nodes(), unfused.nodes());
    }

    #[test]
    fn the_edit_passes_the_graphs_operands_and_the_interleaved_buffer() {
        let g = Graph::parse(LLAMA_MLP).unwrap();
        let m = &match_glus(&g)[0];
        let e = super::super::edit(&g, m, "k");
        assert_eq!(e.node as usize, m.node);
        assert_eq!(e.op, "fact::glu");
        assert_eq!(
            e.remove_kinds,
            ["aten::linear", "aten::silu", "aten::linear"]
        );
        use crate::graph::OperandKind as K;
        let want = [
            K::Value,
            K::Value,
            K::None,
            K::Value,
            K::None,
            K::Interleaved,
            K::None,
            K::Str,
            K::Str,
        ];
        assert_eq!(e.operands.len(), want.len());
        assert!(e.operands.iter().zip(want).all(|(o, k)| o.kind == k));
        assert_eq!(g.values[e.operands[0].value as usize].name, "229");
        assert_eq!(e.operands[5].values, [m.w_gate as u32, m.w_up as u32]);
        assert_eq!(e.operands[5].int_value, INTERLEAVE);
        assert_eq!(
            (e.operands[7].text.as_str(), e.operands[8].text.as_str()),
            ("silu", "k")
        );
    }

    /// Phi-3's MLP over x [2,8,64], I = 32: one linear over the stacked weights, chunked along
    /// `dim` (`parts` halves), the activation of `%g` (the first half), `mul` the product's
    /// operands; `extra` more lines.
    fn fused(dim: &str, parts: &str, mul: &str, extra: &str) -> Graph {
        fused_act(dim, parts, "%g", mul, extra)
    }

    fn fused_act(dim: &str, parts: &str, act_of: &str, mul: &str, extra: &str) -> Graph {
        Graph::parse(&format!(
            "graph(%self: Model, %x: bf16[2,8,64]):
               %none = prim::Constant[None]()
               %two = prim::Constant[{parts}]()
               %dim = prim::Constant[{dim}]()
               %mlp = prim::GetAttr[name=\"mlp\"](%self) : Mlp
               %gu = prim::GetAttr[name=\"gate_up_proj\"](%mlp) : Linear
               %w = prim::GetAttr[name=\"weight\"](%gu) : bf16[64,64]
               %y = aten::linear(%x, %w, %none) : bf16[2,8,64]
               %ch = aten::chunk(%y, %two, %dim) : Tensor[]
               %g, %u = prim::ListUnpack(%ch) : bf16[2,8,32], bf16[2,8,32]
               %a = aten::silu({act_of}) : bf16[2,8,32]
               %h = aten::mul({mul}) : bf16[2,8,32]
               {extra}
               return (%h)"
        ))
        .unwrap()
    }

    #[test]
    fn a_fused_gate_up_linear_chunked_in_two_is_one_glu() {
        for dim in ["-1", "2"] {
            for mul in ["%u, %a", "%a, %u"] {
                let g = fused(dim, "2", mul, "");
                let m = match_glus(&g);
                assert_eq!(m.len(), 1, "dim {dim}, {mul}");
                let m = &m[0];
                assert_eq!(
                    m.problem,
                    GluProblem {
                        m: 16,
                        inter: 32,
                        k: 64,
                        dtype: DType::Bf16,
                        act: Act::Silu,
                        bias: false
                    }
                );
                assert_eq!((m.gate, m.w_gate), (m.up, m.w_up), "one linear, one weight");
                assert_eq!(g.values[m.w_gate].name, "w");
                let kinds: Vec<&str> = m
                    .nodes()
                    .iter()
                    .map(|&n| g.nodes[n].kind.as_str())
                    .collect();
                assert_eq!(
                    kinds,
                    [
                        "aten::linear",
                        "aten::chunk",
                        "prim::ListUnpack",
                        "aten::silu",
                        "aten::mul"
                    ]
                );
                let products = crate::kinds::typed::TypedKind::products(&super::super::Glu, m);
                assert_eq!(products.len(), 1);
                assert_eq!(products[0].flops, m.problem.flops());
            }
        }
        // Not the gate-and-up split: three parts, another dim, halves swapped, a half read
        // elsewhere, the linear's output read elsewhere.
        for (g, why) in [
            (fused("-1", "3", "%u, %a", ""), "three parts"),
            (fused("1", "2", "%u, %a", ""), "along the sequence"),
            (
                fused_act("-1", "2", "%u", "%g, %a", ""),
                "the activation on the second half",
            ),
            (
                fused("-1", "2", "%u, %a", "%e = aten::neg(%u) : bf16[2,8,32]"),
                "up read elsewhere",
            ),
            (
                fused("-1", "2", "%u, %a", "%e = aten::neg(%y) : bf16[2,8,64]"),
                "the linear read elsewhere",
            ),
        ] {
            assert!(match_glus(&g).is_empty(), "{why}");
        }
    }

    #[test]
    fn the_fused_forms_edit_passes_one_weight_and_its_interleaved_halves() {
        let g = fused("-1", "2", "%u, %a", "");
        let m = &match_glus(&g)[0];
        let e = super::super::edit(&g, m, "k");
        assert_eq!(
            e.remove_kinds,
            [
                "aten::linear",
                "aten::chunk",
                "prim::ListUnpack",
                "aten::silu"
            ]
        );
        use crate::graph::OperandKind as K;
        let want = [
            K::Value,
            K::Value,
            K::None,
            K::None,
            K::None,
            K::Interleaved,
            K::None,
            K::Str,
            K::Str,
        ];
        assert_eq!(e.operands.len(), want.len());
        assert!(e.operands.iter().zip(want).all(|(o, k)| o.kind == k));
        assert_eq!(e.operands[1].value as usize, m.w_gate);
        assert_eq!(
            e.operands[5].values,
            [m.w_gate as u32],
            "the halves of one weight"
        );
        assert_eq!(e.operands[5].int_value, INTERLEAVE);
    }
}
