//! GEMMs, alone and with the elementwise epilogue after them, one kind: the GEMM rules
//! (`gemm_<layout>[_bias]`, `bmm_<layout>`) and the epilogue rule, as CUTLASS GEMM kernels (sm90
//! collective-builder, sm80 GemmUniversal, the split families for f32-accurate) whose space comes
//! from CUTLASS's generator, judged against the graph's own GEMM, called as `fact::gemm` and
//! `fact::gemm_ep` (whose fallback is the GEMM and the program interpreted op by op). This file
//! is the kind as the stages see it (`Gemm`), with its plan notes and its graph edit. The rest is
//! its own: rule.rs the GEMM rules and the problem, epilogue/ the epilogue rule and its program,
//! space/ the kernel spec and its candidates, sweep.rs the sweep's rounds, bench.rs the bench,
//! render.rs the kernel and op renders.

pub mod bench;
pub mod epilogue;
mod over;
pub mod render;
pub mod rule;
pub mod space;
pub mod sweep;

pub use epilogue::{match_epilogue, EpOp, Epilogue, EpilogueRule, LeafKind};
pub(crate) use over::over_gemm;
pub use rule::{
    major, match_gemms, EpilogueMatch, GemmLayout, GemmMatch, GemmOrigin, GemmProblem, GemmRule,
    Major,
};
pub use space::{gemm_candidates, KernelSpec, Knowledge};

use super::{
    Candidates, Dispatch, Measured, PlanFacts, Problem, Product, Spec, SweepCx, TypedKind, Unfused,
    Unit,
};
use crate::codegen::{OpCode, OpDef, Source};
use crate::graph::{Edit, Graph, NodeId, Operand};
use crate::nvcc::library::KernelLibrary;
use crate::rules::{PatternKind, Rule};
use crate::space::validity::{self, FailureKind, Scope};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};
use bench::GemmBench;
use serde_json::Value;
use space::knowledge::cutlass_layouts;
use std::collections::{BTreeMap, BTreeSet};

/// What users call a GEMM alone (`fact::gemm`).
pub const GEMM: PatternKind = PatternKind::new("gemm");
/// What users call a GEMM with its elementwise epilogue (`fact::gemm_ep`).
pub const EPILOGUE: PatternKind = PatternKind::new("epilogue");

/// The schema of the op composed graphs call; the op library template renders the same string.
pub const GEMM_OP_SCHEMA: &str =
    "gemm(Tensor a, Tensor b, Tensor? bias, str origin, str kernel) -> Tensor";

/// The schema of the fused GEMM + epilogue op: `epilogue` is the program's text
/// (`epilogue`), run over the GEMM's result and `leaves`.
pub const GEMM_EP_OP_SCHEMA: &str =
    "gemm_ep(Tensor a, Tensor b, Tensor? bias, Tensor[]? leaves, str origin, str epilogue, str kernel) -> Tensor";

/// The GEMM kind.
pub struct Gemm;

impl From<GemmProblem> for Problem {
    fn from(p: GemmProblem) -> Problem {
        Problem::new(&Gemm, p)
    }
}

impl From<KernelSpec> for Spec {
    fn from(s: KernelSpec) -> Spec {
        Spec::new(&Gemm, s)
    }
}

impl TypedKind for Gemm {
    type Match = GemmMatch;
    type Problem = GemmProblem;
    type Spec = KernelSpec;

    fn name(&self) -> &'static str {
        "gemm"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[GEMM, EPILOGUE]
    }
    fn letter(&self) -> char {
        'p'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&GemmRule, &EpilogueRule]
    }
    fn problem_of(&self, m: &GemmMatch) -> GemmProblem {
        m.problem.clone()
    }
    fn node_of(&self, m: &GemmMatch) -> NodeId {
        m.node
    }
    fn origin_of(&self, m: &GemmMatch) -> &'static str {
        m.origin.name()
    }
    fn copies_of(&self, m: &GemmMatch) -> Vec<String> {
        m.copies.clone()
    }
    fn plan_facts(&self, m: &GemmMatch, math: Option<MathType>, arch: Arch) -> PlanFacts {
        let p = &m.problem;
        PlanFacts {
            name: match &p.epilogue {
                Some(e) => {
                    let ops: Vec<&str> = e.instrs.iter().map(|i| i.op.short_name()).collect();
                    // A turned pattern's output is permuted (its ops follow a permute).
                    let turn = match m.epilogue.as_ref().and_then(|ep| ep.order.as_ref()) {
                        Some(o) => format!(
                            " permuted ({}) →",
                            o.iter()
                                .map(|d| d.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        None => String::new(),
                    };
                    format!(
                        "{} {} +{turn} {}",
                        m.origin.name(),
                        p.shape_key(),
                        ops.join(" → ")
                    )
                }
                None => format!("{} {}", m.origin.name(), p.shape_key()),
            },
            origin: m.origin.name().into(),
            operands: [Some(m.operand_a()), Some(m.b), m.bias]
                .into_iter()
                .flatten()
                .collect(),
            notes: notes(m, math, arch),
            pad: m.applied_pad().map(|p| p.describe()),
        }
    }
    fn products(&self, m: &GemmMatch) -> Vec<Product> {
        vec![Product {
            node: m.node,
            flops: m.problem.flops(),
            k: m.problem.k,
        }]
    }
    /// `fact::gemm(a, b, bias?, origin, kernel)` in place of the GEMM node, or, for a fused
    /// pattern, `fact::gemm_ep(a, b, bias?, [leaves], origin, epilogue, kernel)` in place of its
    /// last node, the GEMM and the other epilogue nodes removed (the transparent nodes it owns
    /// among them: a flattening view of a it reads unflattened, views of its leaves). A GEMM whose
    /// weight compose pads (`rule::WeightPad`) calls `fact::gemm(a, w_padded, bias_padded?,
    /// "linear;n=N", kernel)` on buffers the rewrite adds to the module: the op returns the first
    /// N columns, its fallback runs linear on the first N rows of each (the module's own tensors,
    /// exactly: `x @ w.t()` and `addmm(bias, x, w.t())` are what linear computes).
    fn edit(&self, g: &Graph, m: &GemmMatch, kernel: &str) -> Edit {
        edit(g, m, kernel)
    }
    /// A fused pattern no kernel realizes falls back to its GEMM alone; its epilogue stays in torch.
    fn unfused(&self, m: &GemmMatch) -> Option<Unfused> {
        m.epilogue.as_ref().map(|_| Unfused {
            kind: &Gemm,
            found: Box::new(m.plain()),
            what: "the fused epilogue",
            instead: "the GEMM alone",
        })
    }
    /// The GEMM nodes no pattern covers, with the reason: control flow (rules match only the
    /// top-level block), unknown shapes, or operands no rule takes.
    fn unmatched(&self, g: &Graph, matched: &BTreeSet<NodeId>) -> Vec<(NodeId, String)> {
        let mut out = Vec::new();
        for (id, n) in g.nodes.iter().enumerate() {
            if matched.contains(&id) || GemmOrigin::of_kind(&n.kind).is_none() {
                continue;
            }
            let reason = if n.depth > 0 {
                // The graph lists a block's nodes right after the node that owns it, so the owner is the
                // nearest earlier node one level up.
                let owner = g.nodes[..id]
                    .iter()
                    .rev()
                    .find(|o| o.depth < n.depth)
                    .map_or("a sub-block", |o| o.kind.as_str());
                let out_of = match owner {
                    "prim::If" => "move the GEMM out of the branch",
                    "prim::Loop" => "move the GEMM out of the loop body",
                    _ => "move the GEMM out of the block",
                };
                format!(
                    "inside {owner}: fact matches only the top-level block; trace the model (tracing unrolls control flow) or {out_of}"
                )
            } else {
                let operands: Vec<String> = n
                    .inputs
                    .iter()
                    .take(2)
                    .map(|&v| {
                        g.tensor(v)
                            .map_or("?".into(), |t| format!("{:?}:{}", t.shape, t.dtype))
                    })
                    .collect();
                if n.inputs.iter().take(2).any(|&v| g.tensor(v).is_none()) {
                    let after = if g.note.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", g.note.trim_end_matches("; "))
                    };
                    format!("its operand shapes are unknown{after}")
                } else if let Some(k) = g
                    .tensor(n.inputs[0])
                    .and_then(|a| a.shape.last().copied())
                    .filter(|&k| k < rule::MIN_K)
                {
                    format!("K = {k}, below one tensor-core step ({}): an outer product or near one, which only writes its output; it stays torch's", rule::MIN_K)
                } else {
                    format!("no rule takes its operands ({}): dtype, rank, broadcast batch dims or scaling outside the GEMM rules", operands.join(", "))
                }
            };
            out.push((id, reason));
        }
        out
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<GemmProblem, String>> {
        (rule.starts_with("gemm_") || rule.starts_with("bmm_"))
            .then(|| GemmProblem::from_rule(rule, dims, dtype))
    }
    fn rule_ids(&self) -> &'static str {
        "gemm_LAYOUT, gemm_LAYOUT_bias or bmm_LAYOUT (LAYOUT one of rrr, rcr, crr, ccr)"
    }
    fn rule_id(&self, p: &GemmProblem) -> String {
        p.rule_id()
    }
    fn shape_key(&self, p: &GemmProblem) -> String {
        p.shape_key()
    }
    fn flops(&self, p: &GemmProblem) -> f64 {
        p.flops()
    }
    fn dtype(&self, p: &GemmProblem) -> DType {
        p.dtype
    }
    /// In its own elements, 16 bytes at most.
    fn alignment(&self, p: &GemmProblem) -> u32 {
        p.alignment(16 / p.dtype.bytes() as u32)
    }
    /// The policy's math for fp32 tensors.
    fn math(&self, p: &GemmProblem, precision: Precision) -> Option<MathType> {
        MathType::for_tensor(p.dtype, precision)
    }
    fn pattern_kind(&self, p: &GemmProblem) -> PatternKind {
        if p.epilogue.is_some() {
            EPILOGUE
        } else {
            GEMM
        }
    }

    fn spec_name(&self, s: &KernelSpec) -> String {
        s.name()
    }
    fn kernel_name(&self, s: &KernelSpec) -> String {
        s.kernel_name()
    }
    fn kernel(&self, s: &KernelSpec) -> KernelSpec {
        s.kernel()
    }
    fn spec_arch(&self, s: &KernelSpec) -> Arch {
        s.arch
    }
    fn spec_dtype(&self, s: &KernelSpec) -> DType {
        s.dtype
    }
    fn render(&self, s: &KernelSpec) -> Source {
        render::render(s)
    }
    fn unit(&self, _s: &KernelSpec) -> Unit {
        Unit::plain("gemm")
    }
    /// One translation-unit family, but four kernel families that win on different problems.
    fn spec_family(&self, s: &KernelSpec) -> String {
        format!("gemm_{:?}", s.family)
    }
    /// A variant's entry holds its kernel and its launch knobs.
    fn dispatch(&self, v: &KernelSpec) -> Dispatch {
        Dispatch {
            kind: "gemm",
            signature: render::signature(v),
            layout: v.layout.short_name().into(),
            epilogue: v.fusion.as_ref().map(|e| e.text()).unwrap_or_default(),
            knobs: [
                i64::from(v.knobs.splits),
                i64::from(v.knobs.raster.abi()),
                i64::from(v.knobs.swizzle),
            ],
        }
    }
    fn features(&self, s: &KernelSpec, failure: FailureKind) -> Option<BTreeMap<String, Value>> {
        Some(features(s, failure))
    }

    fn candidates(&self, p: &GemmProblem, cx: &mut SweepCx) -> Result<Candidates, String> {
        sweep::first_round(p, cx)
    }
    /// M, where the GEMM is one (a batched GEMM's L and M are the batch and sequence both).
    fn rows(&self, p: &GemmProblem) -> Option<i64> {
        (p.batch == 1).then_some(p.m)
    }
    fn at_rows(&self, p: &GemmProblem, rows: i64) -> Option<GemmProblem> {
        (p.batch == 1).then(|| GemmProblem {
            m: rows,
            ..p.clone()
        })
    }
    fn waves(&self, p: &GemmProblem, s: &Spec) -> Option<f64> {
        Some(space::estimate::waves(s.get::<KernelSpec>()?, p))
    }
    /// A kernel an agent's proposal would pass as (`sweep::check_kernel`: this arch and math,
    /// a valid instantiation that fits the problem, not failed before, its compiled kernel
    /// neither) that no learned rule rejects for this sweep's scope: what the first round asks of
    /// its own kernels, less the estimate's cut (a tile outside the first round, the sibling
    /// round's 128x192, is admitted).
    fn admits(&self, p: &GemmProblem, s: &Spec, cx: &SweepCx) -> bool {
        s.get::<KernelSpec>().is_some_and(|k| {
            sweep::check_kernel(k, p, cx.math, cx.arch, cx.failed).is_ok()
                && !cx.failed.contains(&k.kernel_name())
                && rejecting(cx.rules, cx.scope, k).is_none()
        })
    }
    fn retry(
        &self,
        p: &GemmProblem,
        cx: &mut SweepCx,
        failures: &[(String, String)],
        avoid: &BTreeSet<String>,
    ) -> Option<Vec<Spec>> {
        Gemm::sweep_retry(p, cx, failures, avoid)
    }
    fn rounds(&self) -> &'static [&'static str] {
        sweep::ROUNDS
    }
    fn round(&self, i: usize, p: &GemmProblem, measured: &[Measured], cx: &SweepCx) -> Vec<Spec> {
        sweep::round(i, p, measured, cx.refine)
    }
    fn learns(&self) -> bool {
        true
    }
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &GemmProblem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Ok(Box::new(GemmBench::new(lib, p.clone(), protocol)?))
    }

    fn ops(&self) -> &'static [OpDef] {
        &[
            OpDef {
                name: "gemm",
                schema: GEMM_OP_SCHEMA,
                function: "gemm",
                meta: Some("gemm_meta"),
                flexible_layout: false,
            },
            OpDef {
                name: "gemm_ep",
                schema: GEMM_EP_OP_SCHEMA,
                function: "gemm_ep",
                meta: Some("gemm_ep_meta"),
                flexible_layout: false,
            },
        ]
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        render::op_code(arch)
    }
}

/// The parameters a learned validity rule may name (`space::validity`). Launch knobs count only
/// for failures at launch or later.
pub fn features(k: &KernelSpec, kind: FailureKind) -> BTreeMap<String, Value> {
    let mut m = BTreeMap::new();
    let s = |v: &str| Value::String(v.to_string());
    m.insert("family".into(), s(k.family.prefix()));
    m.insert("tile_m".into(), k.tile[0].into());
    m.insert("tile_n".into(), k.tile[1].into());
    m.insert("tile_k".into(), k.tile[2].into());
    m.insert(
        "cluster".into(),
        s(&format!(
            "{}x{}x{}",
            k.cluster[0], k.cluster[1], k.cluster[2]
        )),
    );
    m.insert("schedule".into(), s(k.schedule.short_name()));
    m.insert("scheduler".into(), s(k.scheduler.short_name()));
    m.insert(
        "epilogue".into(),
        s(match k.epilogue {
            space::EpilogueKind::Tma => "tma",
            space::EpilogueKind::NoSmem => "no_smem",
        }),
    );
    m.insert("stages".into(), k.stages.into());
    m.insert(
        "warps".into(),
        s(&format!("{}x{}x{}", k.warps[0], k.warps[1], k.warps[2])),
    );
    m.insert("align".into(), k.align.into());
    m.insert("align_out".into(), k.align_out().into());
    if kind != FailureKind::Compile {
        m.insert("splits".into(), k.knobs.splits.into());
        m.insert(
            "raster".into(),
            s(&format!("{:?}", k.knobs.raster).to_lowercase()),
        );
        m.insert("swizzle".into(), k.knobs.swizzle.into());
    }
    m
}

/// The validity scope of a sweep over `p` with CUTLASS `cutlass` (the table derives the same
/// from the sweep's key).
pub fn scope(p: &GemmProblem, math: MathType, arch: Arch, cutlass: &str) -> Scope {
    Scope::of(&p.rule_id(), p.dtype, &p.shape_key(), math, arch, cutlass)
}

/// Records a failure of `k` (`validity::learn` over its features); `passed` are kernels known
/// to have passed this failure's stage in scope.
pub fn learn(
    rules: &mut Vec<validity::Rule>,
    scope: &Scope,
    kind: FailureKind,
    k: &KernelSpec,
    msg: &str,
    passed: &[KernelSpec],
) {
    let passed: Vec<validity::Params> = passed.iter().map(|p| features(p, kind)).collect();
    validity::learn(
        rules,
        scope,
        kind,
        &k.name(),
        &features(k, kind),
        msg,
        &passed,
    );
}

/// The first rule that rejects `k` in a sweep scoped `sweep`.
pub fn rejecting<'a>(
    rules: &'a [validity::Rule],
    sweep: &Scope,
    k: &KernelSpec,
) -> Option<&'a validity::Rule> {
    validity::rejecting(rules, sweep, |f| features(k, f))
}

/// The match's graph rewrite (`Kind::edit`).
pub fn edit(g: &Graph, m: &GemmMatch, kernel: &str) -> Edit {
    if let Some(pad) = m.applied_pad() {
        let to = pad.to;
        return Edit {
            node: m.node as u32,
            expect_kind: m.origin.aten_kind().to_string(),
            op: "fact::gemm".to_string(),
            operands: vec![
                Operand::value(m.a),
                Operand::padded(pad.weight, to),
                pad.bias
                    .map_or_else(Operand::none, |b| Operand::padded(b, to)),
                Operand::text(&format!("linear;n={}", pad.from)),
                Operand::text(kernel),
            ],
            remove: pad.view.iter().map(|&v| v as u32).collect(),
            remove_kinds: pad.view.iter().map(|&v| g.nodes[v].kind.clone()).collect(),
            ..Default::default()
        };
    }
    let bias = Operand::optional(m.bias);
    let Some(ep) = &m.epilogue else {
        return Edit {
            node: m.node as u32,
            expect_kind: m.origin.aten_kind().to_string(),
            op: "fact::gemm".to_string(),
            operands: vec![
                Operand::value(m.a),
                Operand::value(m.b),
                bias,
                Operand::text(m.origin.name()),
                Operand::text(kernel),
            ],
            ..Default::default()
        };
    };
    let nodes = m.nodes();
    let (last, rest) = nodes.split_last().expect("a pattern has nodes");
    let leaves = Operand::values(&ep.leaves);
    // A turned pattern's op permutes its output (and reads its leaves permuted back).
    let origin = match &ep.order {
        None => m.origin.name().to_string(),
        Some(order) => format!(
            "{};perm={}",
            m.origin.name(),
            order
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
    };
    Edit {
        node: *last as u32,
        expect_kind: g.nodes[*last].kind.clone(),
        op: "fact::gemm_ep".to_string(),
        operands: vec![
            Operand::value(m.operand_a()),
            Operand::value(m.b),
            bias,
            leaves,
            Operand::text(&origin),
            Operand::text(&ep.epilogue.text()),
            Operand::text(kernel),
        ],
        remove: rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        ..Default::default()
    }
}

/// What the plan says a kernel for the match does: layout, pipelining, grid, tensor cores,
/// alignment and epilogue.
fn notes(m: &GemmMatch, math: Option<MathType>, arch: Arch) -> Vec<String> {
    let p = &m.problem;
    let Some(math) = math else {
        return vec![format!(
            "no {arch} kernel family computes {} under this precision policy",
            p.dtype
        )];
    };
    // The default 128x256 tile of the transposed problem: waves over the SMs of the arch's GPU.
    let tiles = ((p.n as f64) / 128.0).ceil() * ((p.m as f64) / 256.0).ceil() * p.batch as f64;
    let waves = tiles / arch.hardware().sms as f64;
    let grid = if waves < 1.0 {
        format!(
            "{tiles:.0} tiles of 128x256 fill {:.0}% of one wave: Stream-K or smaller tiles",
            waves * 100.0
        )
    } else {
        format!("{tiles:.0} tiles of 128x256, {waves:.2} waves: persistent data-parallel, Stream-K to even out the last wave")
    };
    let k_note = if p.k >= 65536 {
        "; K of {k} favours splitting K (Stream-K) for accuracy and parallelism"
    } else {
        ""
    };
    let kernels = Knowledge::shipped().kernels(p, math, arch);
    let wgmma = kernels.iter().any(|k| k.family.is_sm90());
    let tma = kernels
        .iter()
        .any(|k| k.family.is_sm90() && !k.schedule.is_cpasync());
    let lie = |major: Major| {
        if major == Major::Row {
            "row-major"
        } else {
            "column-major, read in place"
        }
    };
    vec![
        format!(
            "layout {}: a {}, B {} (CUTLASS \"{}\" in the transposed problem)",
            p.layout.short_name(),
            lie(p.layout.a()),
            lie(p.layout.b()),
            cutlass_layouts(p.layout)
        ),
        if wgmma && !tma {
            "pipelining: cp.async loads (any alignment) into a shared-memory ring feeding WGMMA, warp-specialized (CUTLASS's KernelCpAsyncWarpSpecialized), the output stored element-wise; or sm80 GemmUniversal kernels".into()
        } else if wgmma {
            "pipelining: TMA loads into a multistage shared-memory ring (stage count carved from the epilogue's share), warp-specialized producer and consumer warpgroups".into()
        } else {
            match arch {
                Arch::Sm80 => "pipelining: cp.async multistage shared-memory ring of sm80 GemmUniversal kernels".to_string(),
                Arch::Sm90 => format!("pipelining: cp.async multistage shared-memory ring of sm80 GemmUniversal kernels: CUTLASS instantiates no sm90 kernel for layout {} under {}", p.layout.short_name(), math.short_name()),
            }
        },
        format!("grid: {grid}{}", k_note.replace("{k}", &p.k.to_string())),
        format!(
            "tensor cores: {} {} with fp32 accumulation{}",
            if wgmma { "WGMMA (sm_90a)" } else { "mma.sync (sm_80 instructions)" },
            math.short_name(),
            match (p.bias, wgmma) {
                (false, _) => "",
                (true, true) => ", bias added in the TMA epilogue",
                (true, false) if p.epilogue.is_some() => ", bias added in the visitor tree",
                (true, false) => ", bias added as the epilogue's C operand",
            }
        ),
    ]
    .into_iter()
    .chain([space::alignment_note(p, arch)])
    .chain(space::epilogue_note(p, math, arch))
    .collect()
}

#[cfg(test)]
mod validity_tests;
