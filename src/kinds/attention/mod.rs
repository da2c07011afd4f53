//! Attention, one kind: `softmax(q·kᵀ)·v` written out or through `scaled_dot_product_attention`
//! (rule.rs), as one CUTLASS fused-attention kernel (spec.rs, render.rs: examples/41 on sm80,
//! examples/88 on sm90), judged against the graph's own ops (bench.rs), called as
//! `fact::attention(q, k, v, mask?, scale?, form, kernel)` whose fallback replays the graph's ops
//! as `form` records them. This file is the kind as the stages see it (`Attention`), with its plan
//! notes and its graph edit.

mod bench;
mod problem;
mod render;
mod rule;
mod spec;

pub use bench::{attention_error, output, AttentionBench, Inputs};
pub use problem::{AttentionBias, AttentionOrigin, AttentionProblem};
pub use render::{render, signature};
pub use rule::{
    match_attention, sdpa_refusals, AttentionMatch, AttentionRule, Factor, MaskMode, Scale,
};
pub use spec::{candidates, AttentionFamily, AttentionSpec, Sm90Schedule};

use super::{Candidates, Dispatch, PlanFacts, Problem, Spec, SweepCx, TypedKind, Unit};
use crate::codegen::{OpCode, OpDef, Source};
use crate::graph::{Edit, Graph, NodeId, Operand};
use crate::nvcc::library::KernelLibrary;
use crate::rules::{PatternKind, Rule};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};
use std::collections::BTreeSet;

/// What users call attention patterns (`FACT_DISABLE=attention`).
pub const ATTENTION: PatternKind = PatternKind::new("attention");

/// The schema of the attention op: `form` is what the graph computed (`AttentionMatch::form`),
/// which the fallback recomputes and the kernel's scale comes from; `scale` is the one-element
/// tensor of a form whose factor the graph computes (`div=tensor`); `cond` and `fill` are a
/// `where` form's condition and fill (GPT-Neo's `where(c, scores, finfo.min)`); `window` a
/// `windows` form's per-window mask (Swin's shifted windows); `plus` a `plus` form's bias beside
/// the mask (MPNet's position bias, MPT's ALiBi).
pub const ATTENTION_OP_SCHEMA: &str =
    "attention(Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor? scale, str form, str kernel, Tensor? cond=None, Tensor? fill=None, Tensor? window=None, Tensor? plus=None) -> Tensor";

/// The attention kind.
pub struct Attention;

impl From<AttentionProblem> for Problem {
    fn from(p: AttentionProblem) -> Problem {
        Problem::new(&Attention, p)
    }
}

impl From<AttentionSpec> for Spec {
    fn from(s: AttentionSpec) -> Spec {
        Spec::new(&Attention, s)
    }
}

impl TypedKind for Attention {
    type Match = AttentionMatch;
    type Problem = AttentionProblem;
    type Spec = AttentionSpec;

    fn name(&self) -> &'static str {
        "attention"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[ATTENTION]
    }
    fn letter(&self) -> char {
        'a'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&AttentionRule]
    }
    fn problem_of(&self, m: &AttentionMatch) -> AttentionProblem {
        m.problem.clone()
    }
    /// The pattern's last node: the op takes over its output.
    fn node_of(&self, m: &AttentionMatch) -> NodeId {
        *m.nodes.last().expect("a pattern has nodes")
    }
    fn origin_of(&self, m: &AttentionMatch) -> &'static str {
        if m.form().starts_with("sdpa") {
            "scaled_dot_product_attention"
        } else {
            "attention"
        }
    }
    fn plan_facts(&self, a: &AttentionMatch, math: Option<MathType>, _arch: Arch) -> PlanFacts {
        let p = &a.problem;
        PlanFacts {
            name: format!(
                "attention{}{} {}",
                if p.causal { " causal" } else { "" },
                if p.bias.is_some() { " bias" } else { "" },
                p.shape_key()
            ),
            origin: if a.form().starts_with("sdpa") {
                "scaled_dot_product_attention".into()
            } else {
                "softmax(q·kᵀ)·v".into()
            },
            operands: vec![a.q, a.k, a.v],
            notes: notes(a, math),
            pad: None,
        }
    }
    fn edit(&self, g: &Graph, m: &AttentionMatch, kernel: &str) -> Edit {
        edit(g, m, kernel)
    }
    /// The `scaled_dot_product_attention` calls the rule refuses, with its reason (a general or
    /// unknown mask, dropout, ...).
    fn unmatched(&self, g: &Graph, matched: &BTreeSet<NodeId>) -> Vec<(NodeId, String)> {
        sdpa_refusals(g)
            .into_iter()
            .filter(|(id, _)| !matched.contains(id))
            .collect()
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<AttentionProblem, String>> {
        (rule.starts_with("attention") || rule.starts_with("sdpa"))
            .then(|| AttentionProblem::from_rule(rule, dims, dtype))
    }
    fn rule_ids(&self) -> &'static str {
        "attention, attention_causal, attention_padded, attention_causal_padded, sdpa, sdpa_causal, sdpa_padded, sdpa_causal_padded, sdpa_mask or sdpa_causal_mask; with a bias tensor attention_bias or sdpa_bias (after any of those but the _mask ones: attention_padded_bias), and their _bias_batched, _bias_keys, _bias_keys_batched and _bias_windowsW forms"
    }
    fn rule_id(&self, p: &AttentionProblem) -> String {
        p.rule_id()
    }
    fn shape_key(&self, p: &AttentionProblem) -> String {
        p.shape_key()
    }
    fn flops(&self, p: &AttentionProblem) -> f64 {
        p.flops()
    }
    fn dtype(&self, p: &AttentionProblem) -> DType {
        p.dtype
    }
    fn alignment(&self, p: &AttentionProblem) -> u32 {
        p.alignment()
    }
    /// The policy's math for its two products.
    fn math(&self, p: &AttentionProblem, precision: Precision) -> Option<MathType> {
        MathType::for_tensor(p.dtype, precision)
    }
    fn pattern_kind(&self, _p: &AttentionProblem) -> PatternKind {
        ATTENTION
    }

    fn spec_name(&self, s: &AttentionSpec) -> String {
        s.name()
    }
    fn spec_arch(&self, s: &AttentionSpec) -> Arch {
        s.arch
    }
    fn spec_dtype(&self, s: &AttentionSpec) -> DType {
        s.dtype
    }
    fn render(&self, s: &AttentionSpec) -> Source {
        render::render(s)
    }
    /// Units never mix the two examples (each declares its own kernels) nor the two float maths
    /// (templates/sm80_fmha.cu.hbs specializes the float MMA for tf32). The sm90 units add
    /// examples/88's folder (its collective/ and kernel/ headers) and fast math, as the example
    /// builds (its CMakeLists): without it the online softmax's exp2f is the accurate,
    /// denormal-handling sequence, and the kernel issues about 30% more instructions than cuDNN's
    /// of the same structure (benches/results/attention90/ncu). Its inputs are bf16/fp16, whose
    /// rounding dwarfs the approximations' error; every other unit keeps its command (and cache key).
    fn unit(&self, a: &AttentionSpec) -> Unit {
        match a.family {
            AttentionFamily::Sm80 => Unit::plain(format!("attention_{}", a.math.short_name())),
            AttentionFamily::Sm90 { .. } => Unit {
                family: format!("attention_sm90_{}", a.math.short_name()),
                cutlass_includes: vec!["examples/88_hopper_fmha"],
                flags: vec!["--use_fast_math"],
            },
        }
    }
    fn dispatch(&self, s: &AttentionSpec) -> Dispatch {
        Dispatch {
            kind: "attention",
            signature: signature(s),
            layout: String::new(),
            epilogue: String::new(),
            knobs: [0; 3],
        }
    }
    /// templates/sm80_fmha.cu.hbs specializes the float MMA of the attention headers for tf32:
    /// one library holds fp32 attention kernels of one math.
    fn check_library(&self, specs: &[&AttentionSpec]) -> Result<(), String> {
        let maths: BTreeSet<&str> = specs
            .iter()
            .filter(|a| a.dtype == DType::F32)
            .map(|a| a.math.short_name())
            .collect();
        if maths.len() > 1 {
            return Err(format!(
                "one library cannot hold fp32 attention kernels of two maths ({}); build one library per precision policy",
                maths.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
        Ok(())
    }

    /// The block shapes of CUTLASS's fused attention that take the head dim (`candidates`), no
    /// agent.
    fn candidates(&self, p: &AttentionProblem, cx: &mut SweepCx) -> Result<Candidates, String> {
        let mut specs: Vec<Spec> = candidates(p, cx.math, cx.arch)
            .into_iter()
            .map(Spec::from)
            .collect();
        if let Some(n) = cx.max_candidates {
            specs.truncate(n.max(1));
        }
        Ok(if specs.is_empty() {
            Candidates::None(format!(
                "no attention kernel takes head dim {} in {} (multiples of {} up to 256)",
                p.head_dim,
                p.dtype,
                16 / p.dtype.bytes()
            ))
        } else {
            Candidates::Kernels { specs, space: None }
        })
    }
    /// Every candidate, so that a hit whose entry never tried a family (the sm90 kernels at head
    /// dims past 128, which only sm80 took before) times its leading kernels before it is used.
    fn space_now(&self, p: &AttentionProblem, math: MathType, arch: Arch) -> Vec<Spec> {
        candidates(p, math, arch)
            .into_iter()
            .map(Spec::from)
            .collect()
    }
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &AttentionProblem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Ok(Box::new(AttentionBench::new(lib, p.clone(), protocol)?))
    }

    fn ops(&self) -> &'static [OpDef] {
        &[OpDef {
            name: "attention",
            schema: ATTENTION_OP_SCHEMA,
            function: "attention",
            meta: Some("attention_meta"),
            flexible_layout: true,
        }]
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        render::op_code(arch)
    }
}

/// The match's graph rewrite (`Kind::edit`): `fact::attention(q, k, v, mask?, scale?, form,
/// kernel)` in place of the pattern's last node, its other nodes removed.
pub fn edit(g: &Graph, a: &AttentionMatch, kernel: &str) -> Edit {
    let (last, rest) = a.nodes.split_last().expect("a pattern has nodes");
    Edit {
        node: *last as u32,
        expect_kind: g.nodes[*last].kind.clone(),
        op: "fact::attention".to_string(),
        operands: vec![
            Operand::value(a.q),
            Operand::value(a.k),
            Operand::value(a.v),
            Operand::optional(a.mask.map(|(m, _)| m)),
            Operand::optional(a.scale_operand()),
            Operand::text(&a.form()),
            Operand::text(kernel),
            // The where's bool mask: the explicit form's (with its fill), or SDPA's (its fill a
            // constant of the form).
            Operand::optional(a.cond.map(|(c, _)| c).or(a.where_mask.map(|(c, _)| c))),
            Operand::optional(a.cond.map(|(_, f)| f)),
            Operand::optional(a.window),
            Operand::optional(a.plus.map(|(b, _)| b)),
        ],
        remove: rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        ..Default::default()
    }
}

/// What the plan says the fused-attention kernel does for the match.
fn notes(a: &AttentionMatch, math: Option<MathType>) -> Vec<String> {
    let p = &a.problem;
    let Some(math) = math else {
        return vec![format!(
            "no kernel family computes {} attention under this precision policy",
            p.dtype
        )];
    };
    vec![
        format!(
            "one kernel (CUTLASS's fused multi-head attention): q·kᵀ, scale {}, {}softmax online in registers and ·v, {} mma.sync with fp32 accumulation; the {}x{} score matrix never reaches memory",
            a.kernel_scale().map_or("read from the graph".to_string(), |s| format!("{s:.4}")),
            match p.bias {
                Some(AttentionBias::Windows(w)) => format!("the mask added as a bias tile (one per window, {w} windows), "),
                Some(b) => format!(
                    "{} added as a bias tile ({}{}), ",
                    if a.plus.is_some() { "the bias beside the mask" } else { "the mask" },
                    if matches!(b, AttentionBias::Batched | AttentionBias::KeysBatched) { "one per sequence" } else { "shared by the sequences" },
                    if matches!(b, AttentionBias::Keys | AttentionBias::KeysBatched) { ", one row of keys per head for every query" } else { "" }
                ),
                None if p.causal => "causal mask (key blocks past the diagonal skipped), ".into(),
                None => String::new(),
            },
            math.short_name(),
            p.seq_q,
            p.seq_k
        ),
        format!("q, k, v read through their strides ({}), the output written as [B,T,H,D]", a.form()),
    ]
}
