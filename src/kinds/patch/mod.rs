//! Patch embeddings as one GEMM, one kind: a convolution whose filter is its stride, unpadded
//! (rule.rs), computed as x cut into patches times the weight. The op,
//! `fact::patch_conv(x, w, b?, r, s, kernel)`, cuts x into a [N·P·Q, C·R·S] buffer (one copy),
//! runs a GEMM kind kernel against the weight as it lies ([K, C·R·S] is the weight's own memory),
//! and hands the output back in torch's default strides (one transposing copy); it falls back to
//! torch's convolution. This file is the kind as the stages see it (`Patch`), with its plan notes
//! and its graph edit.
//!
//! Like the sibling linears, the kind is built over the GEMM kind: its kernels are GEMM kernels
//! (the GEMM kind's spec, candidate space, rounds, validity rules and renders, for
//! `PatchProblem::gemm_problem`), so its winners share the GEMM kind's build cache. What is its
//! own is the problem (the table key, whose baseline is torch's convolution: problem.rs), the
//! bench (bench.rs: the op's copies timed with the kernel), the edit and the op.
//!
//! The kind is on unless `--no-patch-conv` (`registry::MatchOptions`). Where no GEMM kernel
//! beats torch's convolution for a problem, compose realizes the convolution kind's pattern of
//! the same node instead (`unfused`), and that one's kernel or torch runs it.

mod bench;
mod problem;
mod rule;

pub use bench::PatchBench;
pub use problem::PatchProblem;
pub use rule::{match_patches, patch, PatchMatch, PatchRule};

use super::{PlanFacts, Product, TypedKind, Unfused, Work};
use crate::codegen::{self, OpCode, OpDef};
use crate::graph::{Edit, Graph, NodeId, Operand};
use crate::kinds::gemm::KernelSpec;
use crate::nvcc::library::KernelLibrary;
use crate::rules::{PatternKind, Rule};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType};

/// What users call patch-embedding patterns (`FACT_DISABLE=patch`).
pub const PATCH: PatternKind = PatternKind::new("patch");

const OP: &str = include_str!("patch_op.cpp.hbs");

const OPS: [OpDef; 1] = [OpDef {
    name: "patch_conv",
    schema: "patch_conv(Tensor x, Tensor w, Tensor? b, int r, int s, str kernel) -> Tensor",
    function: "patch_conv",
    meta: Some("patch_conv_meta"),
    flexible_layout: false,
}];

/// The patch-embedding kind.
pub struct Patch;

impl From<PatchProblem> for super::Problem {
    fn from(p: PatchProblem) -> super::Problem {
        super::Problem::new(&Patch, p)
    }
}

/// The patches-times-weight GEMM as the GEMM kind's problem.
fn gemm(p: &PatchProblem) -> super::Problem {
    p.gemm_problem().into()
}

impl TypedKind for Patch {
    type Match = PatchMatch;
    type Problem = PatchProblem;
    /// Its kernels are GEMM kernels: the specs its sweeps make are the GEMM kind's, so the spec
    /// methods below are the GEMM kind's too.
    type Spec = KernelSpec;

    fn name(&self) -> &'static str {
        "patch"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[PATCH]
    }
    fn letter(&self) -> char {
        'v'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&PatchRule]
    }
    fn problem_of(&self, m: &PatchMatch) -> PatchProblem {
        m.problem.clone()
    }
    fn node_of(&self, m: &PatchMatch) -> NodeId {
        m.conv
    }
    fn origin_of(&self, _m: &PatchMatch) -> &'static str {
        "convolution"
    }
    fn plan_facts(&self, m: &PatchMatch, math: Option<MathType>, _arch: Arch) -> PlanFacts {
        let p = &m.problem;
        let (rows, cols, k) = p.gemm_dims();
        PlanFacts {
            name: format!(
                "patch embedding {}x{}x{}x{} by {}x{} to {}",
                p.images, p.in_channels, p.height, p.width, p.patch[0], p.patch[1], p.out_channels
            ),
            origin: "convolution".into(),
            operands: std::iter::once(m.x)
                .chain([m.weight])
                .chain(m.bias)
                .collect(),
            notes: math
                .map(|math| {
                    vec![
                        format!(
                            "one GEMM {rows}x{cols}x{k} over x cut into patches (one copy) and the weight as it lies; {} products",
                            math.short_name()
                        ),
                        "the output handed back in torch's default strides (one transposing copy); where torch's convolution is faster, the convolution kind's pattern instead".into(),
                    ]
                })
                .unwrap_or_default(),
            pad: None,
        }
    }
    fn unfused(&self, m: &PatchMatch) -> Option<Unfused> {
        m.alone.clone().map(|c| Unfused {
            kind: &super::conv::Conv,
            found: Box::new(c),
            what: "the patch embedding as one GEMM",
            instead: "the convolution kind's pattern",
        })
    }
    fn products(&self, m: &PatchMatch) -> Vec<Product> {
        let (_, _, k) = m.problem.gemm_dims();
        vec![Product {
            node: m.conv,
            flops: m.problem.flops(),
            k,
        }]
    }
    /// Three kernels: the cut (x read, the patches written), the GEMM (the patches and the
    /// weight read, its output written) and the transposing copy (read and written again).
    fn work(&self, m: &PatchMatch, _math: MathType) -> Option<Work> {
        let p = &m.problem;
        let (rows, cols, k) = p.gemm_dims();
        let bytes = p.dtype.bytes() as f64;
        let x = (p.images * p.in_channels * p.height * p.width) as f64 * bytes;
        let patches = (rows * k) as f64 * bytes;
        let w = (cols * k) as f64 * bytes;
        let out = (rows * cols) as f64 * bytes;
        Some(Work {
            products: self.products(m),
            bytes: x + 2.0 * patches + w + 3.0 * out,
            launches: 3,
            note: "x cut into patches, one GEMM, the output transposed to NCHW".into(),
        })
    }
    fn edit(&self, g: &Graph, m: &PatchMatch, kernel: &str) -> Edit {
        edit(g, m, kernel)
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<PatchProblem, String>> {
        rule.starts_with("patch_conv")
            .then(|| PatchProblem::from_rule(rule, dims, dtype))
    }
    fn rule_ids(&self) -> &'static str {
        "patch_conv or patch_conv_bias (NxHxWxCxKxRxS)"
    }
    fn rule_id(&self, p: &PatchProblem) -> String {
        p.rule_id()
    }
    fn shape_key(&self, p: &PatchProblem) -> String {
        p.shape_key()
    }
    fn flops(&self, p: &PatchProblem) -> f64 {
        p.flops()
    }
    fn dtype(&self, p: &PatchProblem) -> DType {
        p.dtype
    }
    fn pattern_kind(&self, _p: &PatchProblem) -> PatternKind {
        PATCH
    }

    crate::kinds::gemm::over_gemm!(PatchProblem, gemm);

    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &PatchProblem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Ok(Box::new(PatchBench::new(lib, p.clone(), protocol)?))
    }

    fn ops(&self) -> &'static [OpDef] {
        &OPS
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        let body = codegen::templates(&[], &[("op", OP)])
            .render("op", &codegen::op_vars(arch))
            .expect("the patch op renders");
        OpCode {
            prelude: String::new(),
            body,
        }
    }
}

/// The match's graph rewrite (`Kind::edit`): `fact::patch_conv(x, w, b?, r, s, kernel)` in place
/// of the convolution, on the module's own weight and bias.
pub fn edit(g: &Graph, m: &PatchMatch, kernel: &str) -> Edit {
    Edit {
        node: m.conv as u32,
        expect_kind: g.nodes[m.conv].kind.clone(),
        op: "fact::patch_conv".into(),
        operands: vec![
            Operand::value(m.x),
            Operand::value(m.weight),
            Operand::optional(m.bias),
            Operand::int(m.problem.patch[0]),
            Operand::int(m.problem.patch[1]),
            Operand::text(kernel),
        ],
        ..Default::default()
    }
}
