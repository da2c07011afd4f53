//! The gated MLP as one GEMM, one kind: `mul(act(linear(x, Wg)), linear(x, Wu))` (rule.rs) as one
//! GEMM over the two weights interleaved in one buffer compose adds to the module once (blocks of
//! `INTERLEAVE` gate rows, then as many up rows), whose epilogue writes act(gate)·up at half the
//! width (spec.rs, render.rs: the fused form, sm90), or the same GEMM writing both halves and one
//! elementwise kernel after it (the split form, the candidate the fused one must beat and the one
//! sm80 takes); both judged against the graph's own ops (bench.rs). The op,
//! `fact::glu(x, w_gate, b_gate?, w_up, b_up?, w, b?, act, kernel)`, falls back to those ops on the
//! module's own parameters. This file is the kind as the stages see it (`Glu`), with its plan
//! notes and its graph edit.
//!
//! Unlike the other kinds, this one is built over another: its kernels are the GEMM kind's
//! (`KernelSpec`, its candidate space, its rendered units for the split form), and a GLU that
//! gets no kernel falls back to the GEMM kind's epilogue match of the same nodes.

mod bench;
mod problem;
mod render;
mod rule;
mod spec;

pub use bench::{interleave, GluBench, Inputs};
pub use problem::{Act, GluProblem, INTERLEAVE};
pub use render::{render, SIGNATURE};
pub use rule::{match_glus, GluMatch, GluRule};
pub use spec::{candidates, fuses, gemm_problem, Form, GluSpec};

use super::typed::spec_of;
use super::{
    Candidates, Dispatch, Measured, PlanFacts, Problem, Product, Spec, SweepCx, TypedKind, Unfused,
    Unit,
};
use crate::codegen::{OpCode, OpDef, Source};
use crate::graph::{Edit, Graph, NodeId, Operand};
use crate::nvcc::library::KernelLibrary;
use crate::rules::{PatternKind, Rule};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};

/// What users call gated-MLP patterns (`FACT_DISABLE=glu`).
pub const GLU: PatternKind = PatternKind::new("glu");

/// The schema of the GLU op: the graph's operands (which the fallback replays), the interleaved
/// weight and bias the kernel reads, the activation and the kernel.
pub const GLU_OP_SCHEMA: &str =
    "glu(Tensor x, Tensor w_gate, Tensor? b_gate, Tensor? w_up, Tensor? b_up, Tensor w, Tensor? b, str act, str kernel) -> Tensor";

/// The gated-MLP kind.
pub struct Glu;

impl From<GluProblem> for Problem {
    fn from(p: GluProblem) -> Problem {
        Problem::new(&Glu, p)
    }
}

impl From<GluSpec> for Spec {
    fn from(s: GluSpec) -> Spec {
        Spec::new(&Glu, s)
    }
}

impl TypedKind for Glu {
    type Match = GluMatch;
    type Problem = GluProblem;
    type Spec = GluSpec;

    fn name(&self) -> &'static str {
        "glu"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[GLU]
    }
    fn letter(&self) -> char {
        'g'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&GluRule]
    }
    fn problem_of(&self, m: &GluMatch) -> GluProblem {
        m.problem.clone()
    }
    fn node_of(&self, m: &GluMatch) -> NodeId {
        m.node
    }
    fn origin_of(&self, _m: &GluMatch) -> &'static str {
        "linear"
    }
    fn plan_facts(&self, l: &GluMatch, math: Option<MathType>, arch: Arch) -> PlanFacts {
        let p = &l.problem;
        PlanFacts {
            name: format!("gated MLP {} {}", p.act.short_name(), p.shape_key()),
            origin: "linear".into(),
            operands: match l.split {
                // The fused form: one weight (and bias) holds both.
                Some(_) => [Some(l.x), Some(l.w_gate), l.b_gate]
                    .into_iter()
                    .flatten()
                    .collect(),
                None => [Some(l.x), Some(l.w_gate), Some(l.w_up), l.b_gate, l.b_up]
                    .into_iter()
                    .flatten()
                    .collect(),
            },
            notes: math.map(|m| notes(p, m, arch)).unwrap_or_default(),
            pad: None,
        }
    }
    fn products(&self, l: &GluMatch) -> Vec<Product> {
        let gemms = if l.split.is_some() {
            vec![l.gate]
        } else {
            vec![l.gate, l.up]
        };
        let flops = l.problem.flops() / gemms.len() as f64;
        gemms
            .into_iter()
            .map(|node| Product {
                node,
                flops,
                k: l.problem.k,
            })
            .collect()
    }
    fn edit(&self, g: &Graph, m: &GluMatch, kernel: &str) -> Edit {
        edit(g, m, kernel)
    }
    /// A GLU no kernel realizes falls back to the gate GEMM with act·up as its epilogue (the
    /// GEMM kind's match of those nodes; up stays torch's), which falls back in turn to the GEMM
    /// alone.
    fn unfused(&self, l: &GluMatch) -> Option<Unfused> {
        l.unfused.clone().map(|e| Unfused {
            kind: &super::gemm::Gemm,
            found: Box::new(e),
            what: "the gated MLP as one GEMM",
            instead: "the gate GEMM with act·up as its epilogue",
        })
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<GluProblem, String>> {
        rule.starts_with("glu")
            .then(|| GluProblem::from_rule(rule, dims, dtype))
    }
    fn rule_ids(&self) -> &'static str {
        "glu_silu, glu_gelu_tanh or glu_gelu (each with _bias)"
    }
    fn rule_id(&self, p: &GluProblem) -> String {
        p.rule_id()
    }
    fn shape_key(&self, p: &GluProblem) -> String {
        p.shape_key()
    }
    fn flops(&self, p: &GluProblem) -> f64 {
        p.flops()
    }
    fn dtype(&self, p: &GluProblem) -> DType {
        p.dtype
    }
    fn alignment(&self, p: &GluProblem) -> u32 {
        p.alignment()
    }
    fn math(&self, p: &GluProblem, precision: Precision) -> Option<MathType> {
        MathType::for_tensor(p.dtype, precision)
    }
    fn pattern_kind(&self, _p: &GluProblem) -> PatternKind {
        GLU
    }

    fn spec_name(&self, s: &GluSpec) -> String {
        s.name()
    }
    fn kernel_name(&self, s: &GluSpec) -> String {
        s.kernel_name()
    }
    fn kernel(&self, s: &GluSpec) -> GluSpec {
        s.kernel()
    }
    fn spec_arch(&self, s: &GluSpec) -> Arch {
        s.gemm.arch
    }
    fn spec_dtype(&self, s: &GluSpec) -> DType {
        s.gemm.dtype
    }
    fn render(&self, s: &GluSpec) -> Source {
        render::render(s)
    }
    /// The fused kernels share units; a split kernel holds its GEMM's unit (namespaces and all),
    /// so it compiles alone: two of them over one GEMM would define it twice in one unit.
    /// A split kernel is its own unit; the split form is one family all the same.
    fn spec_family(&self, s: &GluSpec) -> String {
        format!("glu_{}_{:?}", s.glu.short_name(), s.gemm.family)
    }
    fn unit(&self, s: &GluSpec) -> Unit {
        match s.glu {
            Form::Fused => Unit::plain("glu"),
            Form::Split => Unit::plain(s.kernel_name()),
        }
    }
    fn dispatch(&self, s: &GluSpec) -> Dispatch {
        let k = &s.gemm.knobs;
        Dispatch {
            kind: "glu",
            signature: SIGNATURE.into(),
            layout: String::new(),
            epilogue: String::new(),
            knobs: [
                i64::from(k.splits),
                k.raster.abi() as i64,
                i64::from(k.swizzle),
            ],
        }
    }

    fn rows(&self, p: &GluProblem) -> Option<i64> {
        Some(p.m)
    }
    fn at_rows(&self, p: &GluProblem, rows: i64) -> Option<GluProblem> {
        Some(GluProblem {
            m: rows,
            ..p.clone()
        })
    }
    /// The concatenated GEMM's (`spec::gemm_problem`), the work the rows drive in either form.
    fn waves(&self, p: &GluProblem, s: &Spec) -> Option<f64> {
        Some(crate::kinds::gemm::space::estimate::waves(
            &s.get::<GluSpec>()?.gemm,
            &gemm_problem(p),
        ))
    }
    /// The fused and split forms of the GEMM kind's best kernels for the concatenated GEMM
    /// (`spec::candidates`), no agent.
    fn candidates(&self, p: &GluProblem, cx: &mut SweepCx) -> Result<Candidates, String> {
        let mut specs: Vec<Spec> = candidates(p, cx.math, cx.arch)
            .into_iter()
            .filter(|s| !cx.failed.contains(&s.kernel_name()))
            .map(Spec::from)
            .collect();
        if let Some(n) = cx.max_candidates {
            specs.truncate(n.max(1));
        }
        Ok(if specs.is_empty() {
            Candidates::None(format!(
                "no GEMM kernel of the {} space takes the concatenated GEMM {}x{}x{}",
                cx.arch.short_name(),
                p.m,
                2 * p.inter,
                p.k
            ))
        } else {
            Candidates::Kernels { specs, space: None }
        })
    }
    /// The GEMM kind's rounds, each over both forms (`spec::round`).
    fn rounds(&self) -> &'static [&'static str] {
        crate::kinds::gemm::sweep::ROUNDS
    }
    fn round(&self, i: usize, p: &GluProblem, measured: &[Measured], cx: &SweepCx) -> Vec<Spec> {
        let mine: Vec<(GluSpec, Option<f64>)> = measured
            .iter()
            .map(|m| (spec_of::<Glu>(&m.spec).clone(), m.ms))
            .collect();
        spec::round(i, p, &mine, cx.refine)
            .into_iter()
            .map(Spec::from)
            .collect()
    }
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &GluProblem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Ok(Box::new(GluBench::new(lib, p.clone(), protocol)?))
    }

    fn ops(&self) -> &'static [OpDef] {
        &[OpDef {
            name: "glu",
            schema: GLU_OP_SCHEMA,
            function: "glu",
            meta: Some("glu_meta"),
            flexible_layout: false,
        }]
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        render::op_code(arch)
    }
}

/// The match's graph rewrite (`Kind::edit`): `fact::glu(x, w_gate, b_gate?, w_up, b_up?, w, b?,
/// act, kernel)` in place of the mul, the two linears and the activation removed; `w` and `b` are
/// the interleaved buffers the rewrite adds to the module once.
pub fn edit(g: &Graph, l: &GluMatch, kernel: &str) -> Edit {
    let mut remove = crate::rules::Match::nodes(l);
    remove.retain(|&n| n != l.node);
    // The fused form passes its one weight (and bias) as the gate's and no up: the fallback
    // replays the linear and the chunk; the kernel's buffer interleaves the weight's halves.
    let (graphs, kernels) = match l.split {
        Some(_) => (
            [
                Operand::value(l.w_gate),
                Operand::optional(l.b_gate),
                Operand::none(),
                Operand::none(),
            ],
            [
                Operand::interleaved_halves(l.w_gate, INTERLEAVE),
                match l.b_gate {
                    Some(b) => Operand::interleaved_halves(b, INTERLEAVE),
                    None => Operand::none(),
                },
            ],
        ),
        None => (
            [
                Operand::value(l.w_gate),
                Operand::optional(l.b_gate),
                Operand::value(l.w_up),
                Operand::optional(l.b_up),
            ],
            [
                Operand::interleaved(l.w_gate, l.w_up, INTERLEAVE),
                match (l.b_gate, l.b_up) {
                    (Some(bg), Some(bu)) => Operand::interleaved(bg, bu, INTERLEAVE),
                    _ => Operand::none(),
                },
            ],
        ),
    };
    let mut operands = vec![Operand::value(l.x)];
    operands.extend(graphs);
    operands.extend(kernels);
    operands.push(Operand::text(l.problem.act.short_name()));
    operands.push(Operand::text(kernel));
    Edit {
        node: l.node as u32,
        expect_kind: g.nodes[l.node].kind.clone(),
        op: "fact::glu".to_string(),
        operands,
        remove_kinds: remove.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        remove: remove.into_iter().map(|n| n as u32).collect(),
        ..Default::default()
    }
}

/// What the plan says a GLU kernel does for the problem.
fn notes(p: &GluProblem, math: MathType, arch: Arch) -> Vec<String> {
    // The f32-accurate GEMMs are split families of their own: no fused epilogue over them.
    let forms = if arch == Arch::Sm90 && math != MathType::Tf32x3 {
        "fused (the epilogue writes act(gate)·up, half the width) or split (both halves written, then one elementwise kernel), the faster verified"
    } else {
        "split (both halves written, then one elementwise kernel); the fused epilogue is sm90's, over bf16, fp16 or tf32 products"
    };
    vec![
        format!(
            "one GEMM {}x{}x{} over gate and up interleaved in blocks of {INTERLEAVE} rows (a buffer of the composed module, made once): x read once, not twice",
            p.m,
            2 * p.inter,
            p.k
        ),
        format!(
            "{forms}; {} products, the activation and the mul in fp32",
            math.short_name()
        ),
    ]
}
