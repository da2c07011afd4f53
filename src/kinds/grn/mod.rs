//! Global Response Normalization (ConvNeXt V2's), one kind: Hugging Face's and timm's spellings
//! over channels-last x [N,H,W,C] (rule.rs), as one kernel of fact's own in three launches
//! (spec.rs, render.rs, grn.cu.hbs: the sums of squares over slices of the positions, each
//! image's nf, then y), judged against the graph's own ops and fp64 (bench.rs), called as
//! `fact::grn(x, weight, bias, eps, form, kernel)` whose fallback replays the replaced ops
//! (grn_op.cpp.hbs). Torch runs the graph's nine ops as about as many passes over x, the largest
//! activation of the block; the kernel reads it twice and writes y once. This file is the kind as
//! the stages see it (`Grn`), with its plan notes and its graph edit.

mod bench;
mod problem;
mod render;
mod rule;
mod spec;

pub use bench::{GrnBench, Inputs, EPS};
pub use problem::{GrnProblem, RULE_IDS};
pub use render::{op_code, render};
pub use rule::{match_grns, Form, GrnMatch, GrnRule};
pub use spec::{candidates, GrnSpec};

use super::{Candidates, Dispatch, PlanFacts, Problem, Spec, SweepCx, TypedKind, Unit};
use crate::codegen::{OpCode, OpDef, Source};
use crate::graph::{Edit, Graph, NodeId, Operand};
use crate::nvcc::library::KernelLibrary;
use crate::rules::{PatternKind, Rule};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};

/// What users call GRN patterns (`FACT_DISABLE=grn`).
pub const GRN: PatternKind = PatternKind::new("grn");

/// The schema of the GRN op: eps is the graph's constant as text; `form` is `hf` or `addcmul`.
pub const GRN_OP_SCHEMA: &str =
    "grn(Tensor x, Tensor weight, Tensor bias, str eps, str form, str kernel) -> Tensor";

/// The GRN kind.
pub struct Grn;

impl From<GrnProblem> for Problem {
    fn from(p: GrnProblem) -> Problem {
        Problem::new(&Grn, p)
    }
}

impl From<GrnSpec> for Spec {
    fn from(s: GrnSpec) -> Spec {
        Spec::new(&Grn, s)
    }
}

impl TypedKind for Grn {
    type Match = GrnMatch;
    type Problem = GrnProblem;
    type Spec = GrnSpec;

    fn name(&self) -> &'static str {
        "grn"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[GRN]
    }
    /// `r` for response (normalization).
    fn letter(&self) -> char {
        'r'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&GrnRule]
    }
    fn problem_of(&self, m: &GrnMatch) -> GrnProblem {
        m.problem.clone()
    }
    /// The pattern's last node, the residual add: the op takes over its output.
    fn node_of(&self, m: &GrnMatch) -> NodeId {
        *m.nodes.last().expect("a pattern has nodes")
    }
    fn origin_of(&self, _m: &GrnMatch) -> &'static str {
        "global response norm"
    }
    fn plan_facts(&self, m: &GrnMatch, _math: Option<MathType>, _arch: Arch) -> PlanFacts {
        let p = &m.problem;
        PlanFacts {
            name: format!("grn {}", p.shape_key()),
            origin: format!("global response norm ({})", m.form.text()),
            operands: vec![m.x, m.weight, m.bias],
            notes: vec![
                format!(
                    "one kernel (fact's own) for {} nodes, three launches: sums of squares over slices of the {} positions (fp32, to a workspace), each image's norms, their mean over the {} channels and nf, then y = w·(x·nf) + b + x",
                    m.nodes.len(),
                    p.pixels,
                    p.channels
                ),
                format!(
                    "x read twice and y written once ({:.1} MB), where the graph's ops pass over x about nine times",
                    p.bytes() / 1e6
                ),
            ],
            pad: None,
        }
    }
    fn edit(&self, g: &Graph, m: &GrnMatch, kernel: &str) -> Edit {
        edit(g, m, kernel)
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<GrnProblem, String>> {
        (rule == "grn").then(|| GrnProblem::from_rule(rule, dims, dtype))
    }
    fn rule_ids(&self) -> &'static str {
        RULE_IDS
    }
    fn rule_id(&self, p: &GrnProblem) -> String {
        p.rule_id()
    }
    fn shape_key(&self, p: &GrnProblem) -> String {
        p.shape_key()
    }
    fn flops(&self, p: &GrnProblem) -> f64 {
        p.flops()
    }
    fn dtype(&self, p: &GrnProblem) -> DType {
        p.dtype
    }
    fn alignment(&self, p: &GrnProblem) -> u32 {
        p.alignment()
    }
    /// The tensors' own under either policy: no product the policy could lower.
    fn math(&self, p: &GrnProblem, _precision: Precision) -> Option<MathType> {
        Some(MathType::elementwise(p.dtype))
    }
    fn pattern_kind(&self, _p: &GrnProblem) -> PatternKind {
        GRN
    }

    fn spec_name(&self, s: &GrnSpec) -> String {
        s.name()
    }
    fn spec_arch(&self, s: &GrnSpec) -> Arch {
        s.arch
    }
    fn spec_dtype(&self, s: &GrnSpec) -> DType {
        s.dtype
    }
    fn render(&self, s: &GrnSpec) -> Source {
        render::render(s)
    }
    /// Its units include no CUTLASS: they stay small and quick.
    fn unit(&self, _s: &GrnSpec) -> Unit {
        Unit::plain("grn")
    }
    fn dispatch(&self, _s: &GrnSpec) -> Dispatch {
        Dispatch {
            kind: "grn",
            signature: "x[N,H,W,C] out[N,H,W,C] weight[C] bias[C]; eps; workspace fp32 [N,S+1,C]"
                .into(),
            layout: String::new(),
            epilogue: String::new(),
            knobs: [0; 3],
        }
    }

    /// The knobs for its C (`spec::candidates`), no agent.
    fn candidates(&self, p: &GrnProblem, cx: &mut SweepCx) -> Result<Candidates, String> {
        let mut specs: Vec<Spec> = candidates(p, cx.arch).into_iter().map(Spec::from).collect();
        if let Some(n) = cx.max_candidates {
            specs.truncate(n.max(1));
        }
        Ok(if specs.is_empty() {
            Candidates::None(format!(
                "no GRN kernel takes C = {}: the loads are vectors of 8 bytes at least, which C must divide",
                p.channels
            ))
        } else {
            Candidates::Kernels { specs, space: None }
        })
    }
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &GrnProblem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Ok(Box::new(GrnBench::new(lib, p.clone(), protocol)?))
    }

    fn ops(&self) -> &'static [OpDef] {
        &[OpDef {
            name: "grn",
            schema: GRN_OP_SCHEMA,
            function: "grn",
            meta: Some("grn_meta"),
            flexible_layout: false,
        }]
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        render::op_code(arch)
    }
}

/// The match's graph rewrite (`Kind::edit`): `fact::grn(x, weight, bias, eps, form, kernel)` in
/// place of the residual add, the pattern's other nodes removed.
pub fn edit(g: &Graph, m: &GrnMatch, kernel: &str) -> Edit {
    let (last, rest) = m.nodes.split_last().expect("a pattern has nodes");
    Edit {
        node: *last as u32,
        expect_kind: g.nodes[*last].kind.clone(),
        op: "fact::grn".to_string(),
        operands: vec![
            Operand::value(m.x),
            Operand::value(m.weight),
            Operand::value(m.bias),
            Operand::text(&format!("{:?}", m.eps)),
            Operand::text(m.form.text()),
            Operand::text(kernel),
        ],
        remove: rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        ..Default::default()
    }
}
