//! Sibling linears as one GEMM, one kind: two to four `linear`s reading the same x (q, k and v
//! projections; rule.rs) computed by one GEMM over their weights concatenated along N, a buffer
//! compose adds to the module once (the bridge's `Concatenated` operand). The op,
//! `fact::linears<N>(x, w, b?, n0, .., kernel)`, returns one tensor per linear, each a view of the
//! fused output's columns; it falls back to each linear over its rows of the concatenated weight
//! (the module's own values). This file is the kind as the stages see it (`Siblings`), with its
//! plan notes and its graph edit.
//!
//! Like the gated MLP, the kind is built over the GEMM kind: its kernels are GEMM kernels (the
//! GEMM kind's spec, candidate space, rounds, validity rules and renders, for the concatenated
//! GEMM `SiblingsProblem::gemm_problem`), so its sweeps' specs are GEMM specs and its winners
//! share the GEMM kind's build cache. What is its own is the problem (the table key: the
//! baseline is the separate linears, problem.rs), the bench's baseline, the edit and the op.
//!
//! The kind is off unless asked (`--fuse-siblings`, `registry::MatchOptions`): no GPU has yet
//! measured the fused GEMM against the separate ones.

mod bench;
mod problem;
pub(crate) mod rule;

pub use bench::SiblingsBench;
pub use problem::{SiblingsProblem, MAX_SIBLINGS};
pub use rule::{match_siblings, SiblingsMatch, SiblingsRule};

use super::{PlanFacts, Product, TypedKind};
use crate::codegen::{self, OpCode, OpDef};
use crate::graph::{Edit, Graph, NodeId, Operand};
use crate::kinds::gemm::KernelSpec;
use crate::nvcc::library::KernelLibrary;
use crate::rules::{PatternKind, Rule};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType};

/// What users call sibling-linear patterns (`FACT_DISABLE=siblings`).
pub const SIBLINGS: PatternKind = PatternKind::new("siblings");

const OP: &str = include_str!("siblings_op.cpp.hbs");

/// The op of each group size: the call takes over one output per linear.
const OPS: [OpDef; 3] = [
    OpDef {
        name: "linears2",
        schema: "linears2(Tensor x, Tensor w, Tensor? b, int n0, int n1, str kernel) -> (Tensor, Tensor)",
        function: "linears2",
        meta: Some("linears2_meta"),
        flexible_layout: false,
    },
    OpDef {
        name: "linears3",
        schema: "linears3(Tensor x, Tensor w, Tensor? b, int n0, int n1, int n2, str kernel) -> (Tensor, Tensor, Tensor)",
        function: "linears3",
        meta: Some("linears3_meta"),
        flexible_layout: false,
    },
    OpDef {
        name: "linears4",
        schema: "linears4(Tensor x, Tensor w, Tensor? b, int n0, int n1, int n2, int n3, str kernel) -> (Tensor, Tensor, Tensor, Tensor)",
        function: "linears4",
        meta: Some("linears4_meta"),
        flexible_layout: false,
    },
];

/// The sibling-linears kind.
pub struct Siblings;

impl From<SiblingsProblem> for super::Problem {
    fn from(p: SiblingsProblem) -> super::Problem {
        super::Problem::new(&Siblings, p)
    }
}

/// The concatenated GEMM as the GEMM kind's problem.
fn gemm(p: &SiblingsProblem) -> super::Problem {
    p.gemm_problem().into()
}

impl TypedKind for Siblings {
    type Match = SiblingsMatch;
    type Problem = SiblingsProblem;
    /// Its kernels are GEMM kernels: the specs its sweeps make are the GEMM kind's (`Spec::from`
    /// a `KernelSpec` is a GEMM spec), so the spec methods below are the GEMM kind's too.
    type Spec = KernelSpec;

    fn name(&self) -> &'static str {
        "siblings"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[SIBLINGS]
    }
    fn letter(&self) -> char {
        's'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&SiblingsRule]
    }
    fn problem_of(&self, m: &SiblingsMatch) -> SiblingsProblem {
        m.problem.clone()
    }
    fn node_of(&self, m: &SiblingsMatch) -> NodeId {
        m.linears[0]
    }
    fn origin_of(&self, _m: &SiblingsMatch) -> &'static str {
        "linear"
    }
    fn plan_facts(&self, m: &SiblingsMatch, math: Option<MathType>, _arch: Arch) -> PlanFacts {
        let p = &m.problem;
        let widths: Vec<String> = p.widths.iter().map(i64::to_string).collect();
        PlanFacts {
            name: format!(
                "{} sibling linears {}x({})x{}",
                p.widths.len(),
                p.m,
                widths.join("+"),
                p.k
            ),
            origin: "linear".into(),
            operands: std::iter::once(m.x)
                .chain(m.weights.iter().copied())
                .chain(m.biases.iter().copied())
                .collect(),
            notes: math
                .map(|math| {
                    vec![
                        format!(
                            "one GEMM {}x{}x{} over the weights concatenated along N (a buffer of the composed module, made once): x read once, one launch for {}",
                            p.m,
                            p.n(),
                            p.k,
                            p.widths.len()
                        ),
                        format!(
                            "{} products; each output a view of its columns (row stride {}), which the graph's views read in place; unmeasured: on only with --fuse-siblings",
                            math.short_name(),
                            p.n()
                        ),
                    ]
                })
                .unwrap_or_default(),
            pad: None,
        }
    }
    fn products(&self, m: &SiblingsMatch) -> Vec<Product> {
        let p = &m.problem;
        m.linears
            .iter()
            .zip(&p.widths)
            .map(|(&node, &n)| Product {
                node,
                flops: 2.0 * p.m as f64 * n as f64 * p.k as f64,
                k: p.k,
            })
            .collect()
    }
    fn edit(&self, g: &Graph, m: &SiblingsMatch, kernel: &str) -> Edit {
        edit(g, m, kernel)
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<SiblingsProblem, String>> {
        rule.starts_with("siblings")
            .then(|| SiblingsProblem::from_rule(rule, dims, dtype))
    }
    fn rule_ids(&self) -> &'static str {
        "siblings_rcr or siblings_rcr_bias (MxN1xN2[xN3[xN4]]xK)"
    }
    fn rule_id(&self, p: &SiblingsProblem) -> String {
        p.rule_id()
    }
    fn shape_key(&self, p: &SiblingsProblem) -> String {
        p.shape_key()
    }
    fn flops(&self, p: &SiblingsProblem) -> f64 {
        p.flops()
    }
    fn dtype(&self, p: &SiblingsProblem) -> DType {
        p.dtype
    }
    fn pattern_kind(&self, _p: &SiblingsProblem) -> PatternKind {
        SIBLINGS
    }

    crate::kinds::gemm::over_gemm!(SiblingsProblem, gemm);

    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &SiblingsProblem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Ok(Box::new(SiblingsBench::new(lib, p.clone(), protocol)?))
    }

    fn ops(&self) -> &'static [OpDef] {
        &OPS
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        let body = codegen::templates(&[], &[("op", OP)])
            .render("op", &codegen::op_vars(arch))
            .expect("the siblings op renders");
        OpCode {
            prelude: String::new(),
            body,
        }
    }
}

/// The match's graph rewrite (`Kind::edit`): `fact::linears<N>(x, w, b?, n0, .., kernel)` takes
/// over every linear's output, called where the first linear was (`Edit::first`: the others'
/// readers may come before the last one, as q's view does before k's linear), `w` and `b` the
/// module's weights and biases concatenated along their rows, a buffer the rewrite adds once.
pub fn edit(g: &Graph, m: &SiblingsMatch, kernel: &str) -> Edit {
    let (first, rest) = m.linears.split_first().expect("a group has linears");
    let mut operands = vec![
        Operand::value(m.x),
        Operand::concatenated(&m.weights),
        if m.biases.is_empty() {
            Operand::none()
        } else {
            Operand::concatenated(&m.biases)
        },
    ];
    operands.extend(m.problem.widths.iter().map(|&n| Operand::int(n)));
    operands.push(Operand::text(kernel));
    Edit {
        node: *first as u32,
        expect_kind: g.nodes[*first].kind.clone(),
        op: format!("fact::linears{}", m.linears.len()),
        operands,
        outputs: rest.iter().map(|&n| n as u32).collect(),
        output_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        first: true,
        ..Default::default()
    }
}
