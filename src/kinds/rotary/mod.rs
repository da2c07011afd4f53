//! Rotary embedding, one kind: `q·cos + rot(q)·sin` in the halves (`rotate_half`) and pairs
//! (`rotate_every_two`) forms, partial rotary, and q and k by the same cos and sin in one kernel
//! (rule.rs); one kernel of fact's own per head dim (spec.rs, render.rs, rotary.cu.hbs), judged
//! against the graph's own ops (bench.rs); called as `fact::rotary(x, cos, sin, rotary_dim, form,
//! layout, kernel)` or `fact::rotary_qk(q, k, cos, sin, ..)` (two outputs), whose fallback replays
//! the replaced nodes (rotary_op.cpp.hbs). This file is the kind as the stages see it (`Rotary`),
//! with its plan notes and its graph edit. Everything of the kind lives in this folder.

mod bench;
mod problem;
mod render;
mod rule;
mod spec;

pub use bench::{Inputs, RotaryBench};
pub use problem::{Form, RotaryProblem, RULE_IDS};
pub use render::render;
pub use rule::{match_rotary, RotaryMatch, RotaryRule, Rotation};
pub use spec::{candidates, RotarySpec};

use super::{Candidates, Dispatch, PlanFacts, Problem, Spec, SweepCx, TypedKind, Unit};
use crate::codegen::{OpCode, OpDef, Source};
use crate::graph::{Edit, Graph, NodeId, Operand, OperandKind};
use crate::nvcc::library::KernelLibrary;
use crate::rules::{Match, PatternKind, Rule};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};

/// What users call rotary patterns (`FACT_DISABLE=rotary`).
pub const ROTARY: PatternKind = PatternKind::new("rotary");

/// The op that rotates one tensor. `form`: 0 halves, 1 pairs; `layout` bit 0: the output is
/// packed row-major (else its rows follow x's order).
pub const ROTARY_OP_SCHEMA: &str =
    "rotary(Tensor x, Tensor cos, Tensor sin, int rotary_dim, int form, int layout, str kernel) -> Tensor";
/// The op that rotates q and k by the same cos and sin (`layout` bit 1: k's output packed).
pub const ROTARY_QK_OP_SCHEMA: &str =
    "rotary_qk(Tensor q, Tensor k, Tensor cos, Tensor sin, int rotary_dim, int form, int layout, str kernel) -> (Tensor, Tensor)";

/// The rotary kind.
pub struct Rotary;

impl From<RotaryProblem> for Problem {
    fn from(p: RotaryProblem) -> Problem {
        Problem::new(&Rotary, p)
    }
}

impl From<RotarySpec> for Spec {
    fn from(s: RotarySpec) -> Spec {
        Spec::new(&Rotary, s)
    }
}

impl TypedKind for Rotary {
    type Match = RotaryMatch;
    type Problem = RotaryProblem;
    type Spec = RotarySpec;

    fn name(&self) -> &'static str {
        "rotary"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[ROTARY]
    }
    /// `e` for (rotary) embedding.
    fn letter(&self) -> char {
        'e'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&RotaryRule]
    }
    fn problem_of(&self, m: &RotaryMatch) -> RotaryProblem {
        m.problem.clone()
    }
    fn node_of(&self, m: &RotaryMatch) -> NodeId {
        m.q.out
    }
    fn origin_of(&self, _m: &RotaryMatch) -> &'static str {
        "rotary embedding"
    }
    fn plan_facts(&self, r: &RotaryMatch, math: Option<MathType>, arch: Arch) -> PlanFacts {
        let mut operands = vec![r.q.x];
        operands.extend(r.k.as_ref().map(|k| k.x));
        operands.extend([r.q.cos, r.q.sin]);
        PlanFacts {
            name: format!("rotary {} {}", r.problem.form.name(), r.problem.shape_key()),
            origin: "rotary embedding".into(),
            operands,
            notes: math.map(|_| notes(r, arch)).unwrap_or_default(),
            pad: None,
        }
    }
    fn edit(&self, g: &Graph, m: &RotaryMatch, kernel: &str) -> Edit {
        edit(g, m, kernel)
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<RotaryProblem, String>> {
        rule.starts_with("rotary")
            .then(|| RotaryProblem::from_rule(rule, dims, dtype))
    }
    fn rule_ids(&self) -> &'static str {
        RULE_IDS
    }
    fn rule_id(&self, p: &RotaryProblem) -> String {
        p.rule_id()
    }
    fn shape_key(&self, p: &RotaryProblem) -> String {
        p.shape_key()
    }
    fn flops(&self, p: &RotaryProblem) -> f64 {
        p.flops()
    }
    fn dtype(&self, p: &RotaryProblem) -> DType {
        p.dtype
    }
    fn alignment(&self, p: &RotaryProblem) -> u32 {
        p.alignment()
    }
    /// The dtype itself under either policy: no product the policy could lower, so one table
    /// entry serves both.
    fn math(&self, p: &RotaryProblem, _precision: Precision) -> Option<MathType> {
        Some(MathType::elementwise(p.dtype))
    }
    fn pattern_kind(&self, _p: &RotaryProblem) -> PatternKind {
        ROTARY
    }

    fn spec_name(&self, s: &RotarySpec) -> String {
        s.name()
    }
    fn spec_arch(&self, s: &RotarySpec) -> Arch {
        s.arch
    }
    fn spec_dtype(&self, s: &RotarySpec) -> DType {
        s.dtype
    }
    fn render(&self, s: &RotarySpec) -> Source {
        render::render(s)
    }
    /// Its units include no CUTLASS: they stay small and quick.
    fn unit(&self, _s: &RotarySpec) -> Unit {
        Unit::plain("rotary")
    }
    fn dispatch(&self, _s: &RotarySpec) -> Dispatch {
        Dispatch {
            kind: "rotary",
            signature: "q[N0,N1,N2,D] k[..,D]? cos_q[..,R] sin_q[..,R] cos_k[..,R]? sin_k[..,R]? out_q[..,D] out_k[..,D]? (NULL data when absent; cos and sin broadcast with stride 0)".into(),
            layout: String::new(),
            epilogue: String::new(),
            knobs: [0; 3],
        }
    }

    /// The knobs for its head (`spec::candidates`), no agent.
    fn candidates(&self, p: &RotaryProblem, cx: &mut SweepCx) -> Result<Candidates, String> {
        let mut specs: Vec<Spec> = candidates(p, cx.arch).into_iter().map(Spec::from).collect();
        if let Some(n) = cx.max_candidates {
            specs.truncate(n.max(1));
        }
        Ok(if specs.is_empty() {
            Candidates::None(format!(
                "no rotary kernel takes D = {}, R = {} ({}): the rotated part and the rest are read in vectors",
                p.head_dim,
                p.rotary_dim,
                p.form.name()
            ))
        } else {
            Candidates::Kernels { specs, space: None }
        })
    }
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &RotaryProblem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Ok(Box::new(RotaryBench::new(lib, p.clone(), protocol)?))
    }

    fn ops(&self) -> &'static [OpDef] {
        &[
            OpDef {
                name: "rotary",
                schema: ROTARY_OP_SCHEMA,
                function: "rotary",
                meta: Some("rotary_meta"),
                flexible_layout: false,
            },
            OpDef {
                name: "rotary_qk",
                schema: ROTARY_QK_OP_SCHEMA,
                function: "rotary_qk",
                meta: Some("rotary_qk_meta"),
                flexible_layout: false,
            },
        ]
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        render::op_code(arch)
    }
}

fn int(i: i64) -> Operand {
    Operand {
        kind: OperandKind::Int,
        value: 0,
        text: String::new(),
        int_value: i,
        values: vec![],
    }
}

/// The match's graph rewrite (`Kind::edit`): `fact::rotary(x, cos, sin, rotary_dim, form,
/// layout, kernel)` in place of the rotation's last node, or `fact::rotary_qk(q, k, ..)` taking
/// over q's last node and k's (the call where the later of them was); the other nodes removed.
pub fn edit(g: &Graph, r: &RotaryMatch, kernel: &str) -> Edit {
    let mut x = vec![Operand::value(r.q.x)];
    x.extend(r.k.as_ref().map(|k| Operand::value(k.x)));
    let mut operands = x;
    operands.extend([
        Operand::value(r.q.cos),
        Operand::value(r.q.sin),
        int(r.q.rotary_dim),
        int(r.q.form.code()),
        int(r.layout()),
        Operand::text(kernel),
    ]);
    let outs: Vec<NodeId> = r.k.iter().map(|k| k.out).collect();
    let rest: Vec<NodeId> = r
        .nodes()
        .into_iter()
        .filter(|n| *n != r.q.out && !outs.contains(n))
        .collect();
    Edit {
        node: r.q.out as u32,
        expect_kind: g.nodes[r.q.out].kind.clone(),
        op: if r.k.is_some() {
            "fact::rotary_qk"
        } else {
            "fact::rotary"
        }
        .to_string(),
        operands,
        remove: rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        outputs: outs.iter().map(|&n| n as u32).collect(),
        output_kinds: outs.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        first: false,
    }
}

/// What the plan says a rotary kernel does for the match.
fn notes(r: &RotaryMatch, arch: Arch) -> Vec<String> {
    let p = &r.problem;
    let Some(first) = candidates(p, arch).into_iter().next() else {
        return vec![format!(
            "no rotary kernel takes D = {}, R = {}: the parts of a head are read in vectors",
            p.head_dim, p.rotary_dim
        )];
    };
    let what = if r.k.is_some() {
        "q and k"
    } else {
        "the tensor"
    };
    vec![
        format!(
            "one kernel (fact's own) rotates {what} ({} form, the first {} of each head of {}), {}-byte accesses through the tensors' strides (no copy of the transposed view), each product and the sum rounded to {} as the graph's ops round",
            p.form.name(),
            p.rotary_dim,
            p.head_dim,
            first.vector as usize * p.dtype.bytes(),
            p.dtype.short_name()
        ),
        format!(
            "one read and one write of each head, cos and sin read once per head ({:.1} MB at least); the graph's mul, neg, cat, mul and add each go through memory",
            p.bytes() / 1e6
        ),
    ]
}

#[cfg(test)]
mod tests;
