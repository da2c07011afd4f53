//! 2-D convolutions, one kind: `aten::_convolution` / `aten::conv2d` forward with the eval-mode
//! BatchNorm, residual add and activation after it (rule.rs), as an implicit GEMM (problem.rs:
//! M = N·P·Q, N = K, K = C·R·S). The plan shows each chain with its problem and the cost model
//! prices it as the GEMM it is; the grouped, transposed and other convolutions it leaves are
//! listed with the reason. Its kernels (spec.rs, render.rs: CUTLASS's sm90 implicit-GEMM fprop
//! with the bias, residual and activation in its epilogue) render and compile, but no op calls
//! them yet: the sweep offers none and compose leaves every convolution to torch, saying so.
//! The op `fact::conv` with its exact fallback, the BatchNorm folded into a module buffer and the
//! bench are the next slices (issue 33); until then no convolution winner is read back from a
//! table (`spec_from_json`), so none reaches the graph edit.

mod problem;
mod render;
mod rule;
mod spec;

pub use problem::{ConvAct, ConvProblem};
pub use render::{render, signature};
pub use rule::{match_convs, refusals, BatchNorm, ConvCall, ConvMatch, ConvRule};
pub use spec::{candidates, ConvSpec};

use super::{own, own_match, Candidates, Dispatch, Kind, PlanFacts, Problem, Product, Spec};
use super::{SweepCx, Unit};
use crate::codegen::{OpCode, OpDef, Source};
use crate::graph::{Graph, NodeId};
use crate::nvcc::library::KernelLibrary;
use crate::rules::{Match, PatternKind, Rule};
use crate::torch::Edit;
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};
use std::collections::BTreeSet;

/// What users call convolution patterns (`FACT_DISABLE=conv`).
pub const CONV: PatternKind = PatternKind::new("conv");

/// Why a convolution gets no kernel in this slice: the sweep's and the plan's words.
pub const NO_KERNEL: &str = "no convolution op yet (issue 33: the sm90 fprop kernels compile; fact::conv and its bench come next): torch runs it";

/// The convolution kind.
pub struct Conv;

impl From<ConvProblem> for Problem {
    fn from(p: ConvProblem) -> Problem {
        Problem::new(&Conv, p)
    }
}

impl From<ConvSpec> for Spec {
    fn from(s: ConvSpec) -> Spec {
        Spec::new(&Conv, s)
    }
}

fn problem(p: &Problem) -> &ConvProblem {
    own("problem", p.get())
}

fn spec(s: &Spec) -> &ConvSpec {
    own("spec", s.get())
}

impl Kind for Conv {
    fn name(&self) -> &'static str {
        "conv"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[CONV]
    }
    fn letter(&self) -> char {
        'c'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&ConvRule]
    }
    fn problem_of(&self, m: &dyn Match) -> Problem {
        own_match::<ConvMatch>(m).problem.clone().into()
    }
    fn node_of(&self, m: &dyn Match) -> NodeId {
        own_match::<ConvMatch>(m).conv.node
    }
    fn origin_of(&self, _m: &dyn Match) -> &'static str {
        "convolution"
    }
    fn plan_facts(&self, m: &dyn Match, math: Option<MathType>, _arch: Arch) -> PlanFacts {
        let c = own_match::<ConvMatch>(m);
        PlanFacts {
            name: name(c),
            origin: "convolution".into(),
            operands: [Some(c.conv.x), Some(c.conv.weight), c.add.map(|a| a.1)]
                .into_iter()
                .flatten()
                .collect(),
            notes: math.map(|m| notes(c, m)).unwrap_or_default(),
            pad: None,
        }
    }
    /// The implicit GEMM, at the convolution node.
    fn products(&self, m: &dyn Match) -> Vec<Product> {
        let c = own_match::<ConvMatch>(m);
        let (rows, cols, k) = c.problem.gemm();
        vec![Product {
            node: c.conv.node,
            flops: 2.0 * (rows * cols * c.problem.groups) as f64 * k as f64,
            k,
        }]
    }
    fn edit(&self, _g: &Graph, _m: &dyn Match, kernel: &str) -> Edit {
        unreachable!("no convolution kernel wins a sweep or reads back from a table, yet compose rewrites with {kernel}")
    }
    fn unmatched(&self, g: &Graph, matched: &BTreeSet<NodeId>) -> Vec<(NodeId, String)> {
        refusals(g, matched)
    }

    fn problem_from_json(&self, v: serde_json::Value) -> Result<Problem, serde_json::Error> {
        serde_json::from_value::<ConvProblem>(v).map(Problem::from)
    }
    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<Problem, String>> {
        rule.starts_with("conv2d")
            .then(|| ConvProblem::from_rule(rule, dims, dtype).map(Problem::from))
    }
    fn rule_ids(&self) -> &'static str {
        "conv2d_s<stride>_p<padding>_d<dilation>[_bias][_add][_<act>]"
    }
    fn rule_id(&self, p: &Problem) -> String {
        problem(p).rule_id()
    }
    fn shape_key(&self, p: &Problem) -> String {
        problem(p).shape_key()
    }
    fn flops(&self, p: &Problem) -> f64 {
        problem(p).flops()
    }
    fn dtype(&self, p: &Problem) -> DType {
        problem(p).dtype
    }
    fn alignment(&self, p: &Problem) -> u32 {
        problem(p).alignment()
    }
    /// A GEMM's math: the tensors' own for bf16 and fp16, tf32 or 3xTF32 for fp32 by the policy.
    fn math(&self, p: &Problem, precision: Precision) -> Option<MathType> {
        MathType::for_tensor(problem(p).dtype, precision)
    }
    fn pattern_kind(&self, _p: &Problem) -> PatternKind {
        CONV
    }

    /// None yet: until `fact::conv` exists, a convolution winner in a table (which this version
    /// never writes) is no spec it can act on.
    fn spec_from_json(&self, _v: serde_json::Value) -> Result<Spec, serde_json::Error> {
        Err(serde::de::Error::custom(
            "this fact reads no convolution kernels from tables: fact::conv comes with the next slice of issue 33",
        ))
    }
    fn spec_name(&self, s: &Spec) -> String {
        spec(s).name()
    }
    fn kernel_name(&self, s: &Spec) -> String {
        spec(s).name()
    }
    fn kernel(&self, s: &Spec) -> Spec {
        s.clone()
    }
    fn spec_arch(&self, s: &Spec) -> Arch {
        spec(s).arch
    }
    fn spec_dtype(&self, s: &Spec) -> DType {
        spec(s).dtype
    }
    fn render(&self, s: &Spec) -> Source {
        render::render(spec(s))
    }
    fn unit(&self, _s: &Spec) -> Unit {
        Unit::plain("conv")
    }
    fn dispatch(&self, s: &Spec) -> Dispatch {
        Dispatch {
            kind: "conv",
            signature: signature(spec(s)),
            layout: String::new(),
            epilogue: String::new(),
            knobs: [0; 3],
        }
    }

    fn candidates(&self, _p: &Problem, _cx: &mut SweepCx) -> Result<Candidates, String> {
        Ok(Candidates::None(NO_KERNEL.into()))
    }
    fn bench<'l>(
        &self,
        _lib: &'l KernelLibrary,
        _p: &Problem,
        _protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Err(NO_KERNEL.into())
    }

    fn ops(&self) -> &'static [OpDef] {
        &[]
    }
    /// No op yet: an empty section.
    fn op_code(&self, _arch: Arch) -> OpCode {
        OpCode {
            prelude: String::new(),
            body: String::new(),
        }
    }
}

/// `conv2d 32x64x56x56 → 256 1x1 s1 p0 + bn + add + relu`: the input as the graph lays it out
/// (NCHW), the output channels, the filter, then the chain.
fn name(c: &ConvMatch) -> String {
    let p = &c.problem;
    let pair = |v: [i64; 2]| {
        if v[0] == v[1] {
            v[0].to_string()
        } else {
            format!("{}x{}", v[0], v[1])
        }
    };
    let mut s = format!(
        "conv2d {}x{}x{}x{} → {} {}x{} s{} p{}",
        p.images,
        p.in_channels,
        p.height,
        p.width,
        p.out_channels,
        p.filter[0],
        p.filter[1],
        pair(p.stride),
        pair(p.padding)
    );
    if p.dilation != [1, 1] {
        s += &format!(" d{}", pair(p.dilation));
    }
    if c.conv.bias.is_some() {
        s += " + bias";
    }
    if c.bn.is_some() {
        s += " + bn";
    }
    if c.add.is_some() {
        s += " + add";
    }
    if let Some((_, a)) = c.act {
        s += " + ";
        s += a.name();
    }
    s
}

/// What the plan says of the match: its implicit GEMM, the folding compose will do, and that no
/// kernel computes it yet.
fn notes(c: &ConvMatch, math: MathType) -> Vec<String> {
    let p = &c.problem;
    let (m, n, k) = p.gemm();
    let [out_h, out_w] = p.output();
    let mut notes = vec![format!(
        "an implicit GEMM of M = N·P·Q = {}·{out_h}·{out_w} = {m}, N = K = {n}, K = C·R·S = {}·{}·{} = {k}; {} arithmetic",
        p.images,
        p.in_channels,
        p.filter[0],
        p.filter[1],
        math.short_name()
    )];
    if c.bn.is_some() {
        notes.push(
            "the eval-mode BatchNorm is a per-channel scale and bias: folded into the weights and bias once, at compose time"
                .into(),
        );
    }
    notes.push(NO_KERNEL.into());
    notes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::node_costs;

    /// A bf16 1x1 convolution, 256 → 1024 channels on 14x14 at batch 32, with its BatchNorm,
    /// the residual add and ReLU (a resnet50 layer3 bottleneck's last convolution).
    const BLOCK: &str = "graph(%self: M, %x: bf16[32,256,14,14], %r: bf16[32,1024,14,14]):
       %none = prim::Constant[None]()
       %f = prim::Constant[False]()
       %t = prim::Constant[True]()
       %one = prim::Constant[1]()
       %zero = prim::Constant[0]()
       %eps = prim::Constant[1e-05]()
       %mom = prim::Constant[0.1]()
       %l1 = prim::ListConstruct(%one, %one) : List_int_
       %l0 = prim::ListConstruct(%zero, %zero) : List_int_
       %m = prim::GetAttr[name=\"m\"](%self) : Block
       %w = prim::GetAttr[name=\"w\"](%m) : bf16[1024,256,1,1]
       %g = prim::GetAttr[name=\"g\"](%m) : bf16[1024]
       %be = prim::GetAttr[name=\"be\"](%m) : bf16[1024]
       %mu = prim::GetAttr[name=\"mu\"](%m) : bf16[1024]
       %var = prim::GetAttr[name=\"var\"](%m) : bf16[1024]
       %y = aten::_convolution(%x, %w, %none, %l1, %l0, %l1, %f, %l0, %one, %f, %f, %t, %t) : bf16[32,1024,14,14]
       %n = aten::batch_norm(%y, %g, %be, %mu, %var, %f, %mom, %eps, %t) : bf16[32,1024,14,14]
       %s = aten::add_(%n, %r, %one) : bf16[32,1024,14,14]
       %a = aten::relu_(%s) : bf16[32,1024,14,14]
       return (%a)";

    #[test]
    fn the_plan_shows_the_chain_and_prices_it_as_its_implicit_gemm() {
        let g = Graph::parse(BLOCK).unwrap();
        let found = crate::kinds::registry::match_patterns(&g);
        assert_eq!(found.found.len(), 1);
        let f = &found.found[0];
        assert_eq!((f.id.as_str(), f.kind.name()), ("c0", "conv"));
        let m = found.of::<ConvMatch>()[0];
        let facts = Conv.plan_facts(m, Some(MathType::Bf16), Arch::Sm90);
        assert_eq!(
            facts.name,
            "conv2d 32x256x14x14 → 1024 1x1 s1 p0 + bn + add + relu"
        );
        assert!(facts.notes[0].starts_with(
            "an implicit GEMM of M = N·P·Q = 32·14·14 = 6272, N = K = 1024, K = C·R·S = 256·1·1 = 256"
        ));
        assert_eq!(facts.notes.last().unwrap(), NO_KERNEL);
        // The cost model prices the convolution node at the tensor-core rate: its FLOPs are the
        // GEMM's, not one per output element.
        let products = found.products();
        assert_eq!(products.len(), 1);
        assert_eq!(products[0].flops, 2.0 * 6272.0 * 1024.0 * 256.0);
        assert_eq!(products[0].k, 256);
        let costs = node_costs(&g, Arch::Sm90, Precision::Tf32, &products);
        let conv = costs
            .iter()
            .find(|c| c.kind == "aten::_convolution")
            .unwrap();
        assert_eq!(conv.flops, products[0].flops);
        let unpriced = node_costs(&g, Arch::Sm90, Precision::Tf32, &[]);
        let alone = unpriced
            .iter()
            .find(|c| c.kind == "aten::_convolution")
            .unwrap();
        assert!(alone.flops < conv.flops / 100.0, "{}", alone.flops);
    }

    #[test]
    fn the_problem_is_the_chains_and_no_spec_reads_back() {
        let g = Graph::parse(BLOCK).unwrap();
        let p = Conv.problem_of(&match_convs(&g).pop().unwrap());
        assert_eq!(p.rule_id(), "conv2d_s1_p0_d1_bias_add_relu");
        assert_eq!(p.shape_key(), "32x14x14x256x1024x1x1");
        assert_eq!(p.math(Precision::F32), Some(MathType::Bf16));
        let s = candidates(own("problem", p.get()), Arch::Sm90)
            .unwrap()
            .remove(0);
        let json = serde_json::to_value(Spec::from(s)).unwrap();
        assert!(Conv
            .spec_from_json(json)
            .unwrap_err()
            .to_string()
            .contains("fact::conv"));
    }
}
