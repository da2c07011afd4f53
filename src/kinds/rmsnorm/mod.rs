//! RMSNorm over the last dim, one kind: `aten::rms_norm` and the written-out form Llama-family
//! models trace to (rule.rs), as one kernel of fact's own (spec.rs, render.rs and the two
//! templates beside them: a group of threads holds a row in registers), judged against the
//! graph's own ops and fp64 (bench.rs), called as `fact::rmsnorm(x, weight?, eps, form, kernel)`
//! whose fallback replays the replaced ops (`form` says which). The norm of a residual add's sum
//! is the same kind with the add in its problem (`rules::residual`): one kernel reads both
//! operands, and `fact::rmsnorm_add` (or `fact::rmsnorm_add_sum`, which returns the sum too)
//! replays the add and the norm where it falls back. This file is the kind as the stages see it
//! (`RmsNorm`), with its plan notes and its graph edit. Everything of the kind lives in this
//! folder; the registry names it once.

mod bench;
mod problem;
mod render;
mod rule;
mod spec;

pub use bench::{Inputs, RmsNormBench, EPS};
pub use problem::{RmsNormProblem, Scale, RULE_IDS};
pub use render::{op_code, render};
pub use rule::{match_rmsnorms, RmsNormMatch, RmsNormRule, Spelling};
pub use spec::{candidates, RmsNormSpec, CANDIDATE_PER_THREAD, MAX_PER_THREAD, MAX_ROW};

use super::{Candidates, Dispatch, PlanFacts, Problem, Spec, SweepCx, TypedKind, Unit};
use crate::codegen::{OpCode, OpDef, Source};
use crate::graph::{Edit, Graph, NodeId, Operand};
use crate::nvcc::library::KernelLibrary;
use crate::rules::residual::Residual;
use crate::rules::{Match, PatternKind, Rule};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};

/// What users call RMSNorm patterns (`FACT_DISABLE=rmsnorm`).
pub const RMSNORM: PatternKind = PatternKind::new("rmsnorm");

/// The schema of the RMSNorm op. eps is the graph's constant as text (`None` for
/// `aten::rms_norm`'s default): the graph holds it as a float or a one-element tensor, and the
/// fallback replays the ops with it.
pub const RMSNORM_OP_SCHEMA: &str =
    "rmsnorm(Tensor x, Tensor? weight, str eps, str form, str kernel) -> Tensor";

/// The schemas of the RMSNorm of a residual add's sum a + b: `dtypes` is the add's dtype and the
/// norm's (`<sum>,<norm>`); `_sum` returns the sum after y, for the graph's other readers.
pub const RMSNORM_ADD_OP_SCHEMA: &str =
    "rmsnorm_add(Tensor a, Tensor b, Tensor? weight, str eps, str form, str dtypes, str kernel) -> Tensor";
pub const RMSNORM_ADD_SUM_OP_SCHEMA: &str =
    "rmsnorm_add_sum(Tensor a, Tensor b, Tensor? weight, str eps, str form, str dtypes, str kernel) -> (Tensor, Tensor)";

/// The RMSNorm kind.
pub struct RmsNorm;

impl From<RmsNormProblem> for Problem {
    fn from(p: RmsNormProblem) -> Problem {
        Problem::new(&RmsNorm, p)
    }
}

impl From<RmsNormSpec> for Spec {
    fn from(s: RmsNormSpec) -> Spec {
        Spec::new(&RmsNorm, s)
    }
}

impl TypedKind for RmsNorm {
    type Match = RmsNormMatch;
    type Problem = RmsNormProblem;
    type Spec = RmsNormSpec;

    fn name(&self) -> &'static str {
        "rmsnorm"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[RMSNORM]
    }
    /// `n` for norm (`r` is left to rotary).
    fn letter(&self) -> char {
        'n'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&RmsNormRule]
    }
    fn problem_of(&self, m: &RmsNormMatch) -> RmsNormProblem {
        m.problem.clone()
    }
    fn node_of(&self, m: &RmsNormMatch) -> NodeId {
        m.node
    }
    fn origin_of(&self, m: &RmsNormMatch) -> &'static str {
        origin(m)
    }
    fn plan_facts(&self, r: &RmsNormMatch, math: Option<MathType>, arch: Arch) -> PlanFacts {
        let x = match &r.add {
            Some(add) => vec![add.a, add.b],
            None => vec![r.x],
        };
        PlanFacts {
            name: format!("{} {}", r.problem.rule_id(), r.problem.shape_key()),
            origin: origin(r).into(),
            operands: x.into_iter().chain(r.weight).collect(),
            notes: math.map(|m| notes(r, m, arch)).unwrap_or_default(),
            pad: None,
        }
    }
    fn edit(&self, g: &Graph, m: &RmsNormMatch, kernel: &str) -> Edit {
        edit(g, m, kernel)
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<RmsNormProblem, String>> {
        Residual::split_rule(rule, dtype)
            .is_ok_and(|(_, norm)| norm.starts_with("rmsnorm"))
            .then(|| RmsNormProblem::from_rule(rule, dims, dtype))
    }
    fn rule_ids(&self) -> &'static str {
        RULE_IDS
    }
    fn rule_id(&self, p: &RmsNormProblem) -> String {
        p.rule_id()
    }
    fn shape_key(&self, p: &RmsNormProblem) -> String {
        p.shape_key()
    }
    fn flops(&self, p: &RmsNormProblem) -> f64 {
        p.flops()
    }
    fn dtype(&self, p: &RmsNormProblem) -> DType {
        p.dtype
    }
    fn alignment(&self, p: &RmsNormProblem) -> u32 {
        p.alignment()
    }
    /// The tensors' own under either policy: an RMSNorm computes no product the policy could
    /// lower, so one table entry serves both, judged at the dtype's tolerance.
    fn math(&self, p: &RmsNormProblem, _precision: Precision) -> Option<MathType> {
        Some(MathType::elementwise(p.dtype))
    }
    fn pattern_kind(&self, _p: &RmsNormProblem) -> PatternKind {
        RMSNORM
    }

    fn spec_name(&self, s: &RmsNormSpec) -> String {
        s.name()
    }
    fn spec_arch(&self, s: &RmsNormSpec) -> Arch {
        s.arch
    }
    fn spec_dtype(&self, s: &RmsNormSpec) -> DType {
        s.dtype
    }
    fn render(&self, s: &RmsNormSpec) -> Source {
        render::render(s)
    }
    /// Its units include no CUTLASS: they stay small and quick.
    fn unit(&self, _s: &RmsNormSpec) -> Unit {
        Unit::plain("rmsnorm")
    }
    fn dispatch(&self, s: &RmsNormSpec) -> Dispatch {
        let x = if s.add.is_some() {
            "a[O,I,C] b[O,I,C] sum[R,C]?"
        } else {
            "x[R,C]"
        };
        Dispatch {
            kind: "rmsnorm",
            signature: format!("{x} out[R,C] weight[C]? (NULL data when absent); eps, scale (0 none, 1 weight, 2 one plus weight), cast_first"),
            layout: String::new(),
            epilogue: String::new(),
            knobs: [0; 3],
        }
    }

    /// The knobs for its C (`spec::candidates`), no agent.
    fn candidates(&self, p: &RmsNormProblem, cx: &mut SweepCx) -> Result<Candidates, String> {
        let mut specs: Vec<Spec> = candidates(p, cx.arch).into_iter().map(Spec::from).collect();
        if let Some(n) = cx.max_candidates {
            specs.truncate(n.max(1));
        }
        Ok(if specs.is_empty() {
            Candidates::None(format!(
                "no RMSNorm kernel takes C = {}: a row is held in the registers of one CTA, at most {MAX_ROW} elements",
                p.cols
            ))
        } else {
            Candidates::Kernels { specs, space: None }
        })
    }
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &RmsNormProblem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Ok(Box::new(RmsNormBench::new(lib, p.clone(), protocol)?))
    }

    fn ops(&self) -> &'static [OpDef] {
        &[
            OpDef {
                name: "rmsnorm",
                schema: RMSNORM_OP_SCHEMA,
                function: "rmsnorm",
                meta: Some("rmsnorm_meta"),
                flexible_layout: false,
            },
            OpDef {
                name: "rmsnorm_add",
                schema: RMSNORM_ADD_OP_SCHEMA,
                function: "rmsnorm_add",
                meta: Some("rmsnorm_add_meta"),
                flexible_layout: false,
            },
            OpDef {
                name: "rmsnorm_add_sum",
                schema: RMSNORM_ADD_SUM_OP_SCHEMA,
                function: "rmsnorm_add_sum",
                meta: Some("rmsnorm_add_sum_meta"),
                flexible_layout: false,
            },
        ]
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        render::op_code(arch)
    }
}

fn origin(r: &RmsNormMatch) -> &'static str {
    match (r.spelling, r.add.is_some()) {
        (Spelling::Aten, false) => "rms_norm",
        (Spelling::Written, false) => "rmsnorm (written out)",
        (Spelling::Aten, true) => "add + rms_norm",
        (Spelling::Written, true) => "add + rmsnorm (written out)",
    }
}

/// The match's graph rewrite (`Kind::edit`): `fact::rmsnorm(x, weight?, eps, form, kernel)` in
/// place of the pattern's last node, its other nodes removed; after an add,
/// `fact::rmsnorm_add(a, b, weight?, eps, form, dtypes, kernel)`, or `fact::rmsnorm_add_sum`
/// whose second output takes over the sum the rest of the graph reads.
pub fn edit(g: &Graph, r: &RmsNormMatch, kernel: &str) -> Edit {
    let eps = r
        .eps
        .map_or_else(|| "None".to_string(), |e| format!("{e:?}"));
    let (op, x, dtypes, sum) = match &r.add {
        None => ("fact::rmsnorm", vec![Operand::value(r.x)], vec![], None),
        Some(add) => (
            if add.sum.is_some() {
                "fact::rmsnorm_add_sum"
            } else {
                "fact::rmsnorm_add"
            },
            vec![Operand::value(add.a), Operand::value(add.b)],
            vec![Operand::text(&format!(
                "{},{}",
                add.residual.sum.short_name(),
                r.problem.dtype.short_name()
            ))],
            add.sum,
        ),
    };
    let mut operands = x;
    operands.extend([
        Operand::optional(r.weight),
        Operand::text(&eps),
        Operand::text(&r.form()),
    ]);
    operands.extend(dtypes);
    operands.push(Operand::text(kernel));
    Edit {
        node: r.node as u32,
        expect_kind: g.nodes[r.node].kind.clone(),
        op: op.to_string(),
        operands,
        remove: r.rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: r.rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        outputs: sum.iter().map(|&n| n as u32).collect(),
        output_kinds: sum.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        first: false,
    }
}

/// What the plan says an RMSNorm kernel does for the match.
fn notes(r: &RmsNormMatch, math: MathType, arch: Arch) -> Vec<String> {
    let p = &r.problem;
    let Some(first) = candidates(p, arch).into_iter().next() else {
        return vec![format!(
            "no RMSNorm kernel takes C = {}: the row does not fit one CTA's registers",
            p.cols
        )];
    };
    let scale = match (p.scale, p.cast_first) {
        (Scale::None, _) => "no weight".to_string(),
        (Scale::Weight, true) => format!(
            "rounded to {} before the weight multiplies it, as the graph does",
            p.dtype.short_name()
        ),
        (Scale::Weight, false) => "times the weight, rounded once".to_string(),
        (Scale::WeightPlusOne, _) => "times one plus the weight, rounded once".to_string(),
    };
    let mut notes = vec![format!(
        "one kernel (fact's own) for {} node(s): each row of {} held in registers by a group of threads, {}-byte vector loads, the mean square in fp32 over the registers (warp shuffles, shared memory across the group's warps), {scale}; {} arithmetic",
        r.nodes().len(),
        p.cols,
        first.vector as usize * p.dtype.bytes(),
        math.short_name()
    )];
    notes.push(match &p.add {
        None => format!(
            "one read of x and one write of y ({:.1} MB); x's rows are read through their stride (a view whose rows are not one stride apart, as a norm of each head of q sliced from a fused projection, is copied into one run first)",
            p.bytes() / 1e6
        ),
        Some(add) => format!(
            "the residual add before it in the same pass: a ({}) and b ({}) read once, their sum rounded to {} as the graph's add rounds{}, then y written ({:.1} MB); an operand repeated along the leading dims is read in place",
            add.a.short_name(),
            add.b.short_name(),
            add.sum.short_name(),
            if add.writes_sum {
                " and written for the graph's other readers"
            } else {
                ", read by the norm alone"
            },
            p.bytes() / 1e6
        ),
    });
    notes
}
