//! LayerNorm over the last dim, one kind: `aten::layer_norm` (rule.rs) as one kernel of fact's own
//! (spec.rs, render.rs: a group of threads holds a row in registers), judged against torch's
//! `layer_norm` (bench.rs), called as `fact::layernorm(x, normalized_shape, weight?, bias?, eps,
//! kernel)` whose fallback replays the node's own call. The LayerNorm of a residual add's sum is
//! the same kind with the add in its problem (`rules::residual`): one kernel reads both operands,
//! and `fact::layernorm_add` (or `fact::layernorm_add_sum`, which returns the sum too) replays the
//! add and the call where it falls back. This file is the kind as the stages see it
//! (`LayerNorm`), with its plan notes and its graph edit.

mod bench;
mod problem;
mod render;
mod rule;
mod spec;

pub use bench::{Inputs, LayerNormBench, EPS};
pub use problem::{LayerNormProblem, RULE_IDS};
pub use render::render;
pub use rule::{match_layernorms, LayerNormMatch, LayerNormRule, Spelling};
pub use spec::{candidates, LayerNormSpec, CANDIDATE_PER_THREAD, MAX_PER_THREAD, MAX_ROW};

use super::{Candidates, Dispatch, PlanFacts, Problem, Spec, SweepCx, TypedKind, Unit};
use crate::codegen::{OpCode, OpDef, Source};
use crate::graph::{Edit, Graph, NodeId, Operand};
use crate::nvcc::library::KernelLibrary;
use crate::rules::residual::Residual;
use crate::rules::{PatternKind, Rule};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};

/// What users call LayerNorm patterns (`FACT_DISABLE=layernorm`).
pub const LAYERNORM: PatternKind = PatternKind::new("layernorm");

/// The schema of the LayerNorm op: the `aten::layer_norm` call's own operands (without
/// cudnn_enable, which torch ignores), which the fallback replays.
pub const LAYERNORM_OP_SCHEMA: &str =
    "layernorm(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, str kernel) -> Tensor";

/// The schemas of the LayerNorm of a residual add's sum a + b: `dtypes` is the add's dtype and
/// the norm's (`<sum>,<norm>`); `_sum` returns the sum after y, for the graph's other readers.
/// The schema of the written-out norm's op (`rule::Spelling::Written`): eps as text, form
/// `upcast` (x cast to fp32 and the result back) or empty.
pub const LAYERNORM_WRITTEN_OP_SCHEMA: &str =
    "layernorm_written(Tensor x, Tensor? weight, str eps, str form, str kernel) -> Tensor";

pub const LAYERNORM_ADD_OP_SCHEMA: &str =
    "layernorm_add(Tensor a, Tensor b, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, str dtypes, str kernel) -> Tensor";
pub const LAYERNORM_ADD_SUM_OP_SCHEMA: &str =
    "layernorm_add_sum(Tensor a, Tensor b, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps, str dtypes, str kernel) -> (Tensor, Tensor)";

/// The LayerNorm kind.
pub struct LayerNorm;

impl From<LayerNormProblem> for Problem {
    fn from(p: LayerNormProblem) -> Problem {
        Problem::new(&LayerNorm, p)
    }
}

impl From<LayerNormSpec> for Spec {
    fn from(s: LayerNormSpec) -> Spec {
        Spec::new(&LayerNorm, s)
    }
}

impl TypedKind for LayerNorm {
    type Match = LayerNormMatch;
    type Problem = LayerNormProblem;
    type Spec = LayerNormSpec;

    fn name(&self) -> &'static str {
        "layernorm"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[LAYERNORM]
    }
    fn letter(&self) -> char {
        'l'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&LayerNormRule]
    }
    fn problem_of(&self, m: &LayerNormMatch) -> LayerNormProblem {
        m.problem.clone()
    }
    fn node_of(&self, m: &LayerNormMatch) -> NodeId {
        m.node
    }
    fn origin_of(&self, m: &LayerNormMatch) -> &'static str {
        origin(m)
    }
    fn plan_facts(&self, l: &LayerNormMatch, math: Option<MathType>, arch: Arch) -> PlanFacts {
        let x = match &l.add {
            Some(add) => vec![add.a, add.b],
            None => vec![l.x],
        };
        let name = match &l.problem.add {
            Some(_) => format!("{} {}", l.problem.rule_id(), l.problem.shape_key()),
            None => format!("layer_norm {}", l.problem.shape_key()),
        };
        PlanFacts {
            name,
            origin: origin(l).into(),
            operands: x.into_iter().chain(l.weight).chain(l.bias).collect(),
            notes: math.map(|m| notes(l, m, arch)).unwrap_or_default(),
            pad: None,
        }
    }
    fn edit(&self, g: &Graph, m: &LayerNormMatch, kernel: &str) -> Edit {
        edit(g, m, kernel)
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<LayerNormProblem, String>> {
        Residual::split_rule(rule, dtype)
            .is_ok_and(|(_, norm)| norm.starts_with("layernorm"))
            .then(|| LayerNormProblem::from_rule(rule, dims, dtype))
    }
    fn rule_ids(&self) -> &'static str {
        RULE_IDS
    }
    fn rule_id(&self, p: &LayerNormProblem) -> String {
        p.rule_id()
    }
    fn shape_key(&self, p: &LayerNormProblem) -> String {
        p.shape_key()
    }
    fn flops(&self, p: &LayerNormProblem) -> f64 {
        p.flops()
    }
    fn dtype(&self, p: &LayerNormProblem) -> DType {
        p.dtype
    }
    fn alignment(&self, p: &LayerNormProblem) -> u32 {
        p.alignment()
    }
    /// fp32 itself under either policy: a LayerNorm computes no product the policy could lower,
    /// so one table entry serves both policies, and it is judged at fp32's tolerance.
    fn math(&self, p: &LayerNormProblem, _precision: Precision) -> Option<MathType> {
        Some(MathType::elementwise(p.dtype))
    }
    fn pattern_kind(&self, _p: &LayerNormProblem) -> PatternKind {
        LAYERNORM
    }

    fn spec_name(&self, s: &LayerNormSpec) -> String {
        s.name()
    }
    fn spec_arch(&self, s: &LayerNormSpec) -> Arch {
        s.arch
    }
    fn spec_dtype(&self, s: &LayerNormSpec) -> DType {
        s.dtype
    }
    fn render(&self, s: &LayerNormSpec) -> Source {
        render::render(s)
    }
    /// Its units include no CUTLASS: they stay small and quick.
    fn unit(&self, _s: &LayerNormSpec) -> Unit {
        Unit::plain("layernorm")
    }
    fn dispatch(&self, s: &LayerNormSpec) -> Dispatch {
        let x = if s.add.is_some() {
            "a[O,I,C] b[O,I,C] sum[R,C]?"
        } else {
            "x[R,C]"
        };
        Dispatch {
            kind: "layernorm",
            signature: format!("{x} out[R,C] weight[C]? bias[C]? (NULL data when absent); eps"),
            layout: String::new(),
            epilogue: String::new(),
            knobs: [0; 3],
        }
    }

    /// The knobs for its C (`spec::candidates`), no agent.
    fn candidates(&self, p: &LayerNormProblem, cx: &mut SweepCx) -> Result<Candidates, String> {
        let mut specs: Vec<Spec> = candidates(p, cx.arch).into_iter().map(Spec::from).collect();
        if let Some(n) = cx.max_candidates {
            specs.truncate(n.max(1));
        }
        Ok(if specs.is_empty() {
            Candidates::None(format!(
                "no LayerNorm kernel takes C = {}: a row is held in the registers of one CTA, at most {} elements",
                p.cols, MAX_ROW
            ))
        } else {
            Candidates::Kernels { specs, space: None }
        })
    }
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &LayerNormProblem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Ok(Box::new(LayerNormBench::new(lib, p.clone(), protocol)?))
    }

    fn ops(&self) -> &'static [OpDef] {
        &[
            OpDef {
                name: "layernorm",
                schema: LAYERNORM_OP_SCHEMA,
                function: "layernorm",
                meta: Some("layernorm_meta"),
                flexible_layout: false,
            },
            OpDef {
                name: "layernorm_written",
                schema: LAYERNORM_WRITTEN_OP_SCHEMA,
                function: "layernorm_written",
                meta: Some("layernorm_written_meta"),
                flexible_layout: false,
            },
            OpDef {
                name: "layernorm_add",
                schema: LAYERNORM_ADD_OP_SCHEMA,
                function: "layernorm_add",
                meta: Some("layernorm_add_meta"),
                flexible_layout: false,
            },
            OpDef {
                name: "layernorm_add_sum",
                schema: LAYERNORM_ADD_SUM_OP_SCHEMA,
                function: "layernorm_add_sum",
                meta: Some("layernorm_add_sum_meta"),
                flexible_layout: false,
            },
        ]
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        render::op_code(arch)
    }
}

fn origin(l: &LayerNormMatch) -> &'static str {
    match (&l.spelling, &l.add) {
        (Spelling::Written { .. }, _) => "layer_norm (written out)",
        (_, Some(_)) => "add + layer_norm",
        (_, None) => "layer_norm",
    }
}

/// The match's graph rewrite (`Kind::edit`): `fact::layernorm(x, normalized_shape, weight?,
/// bias?, eps, kernel)` in place of the `aten::layer_norm` node, its operands the node's own (the
/// fallback replays the call with them); after an add, `fact::layernorm_add(a, b, ...,
/// dtypes, kernel)`, or `fact::layernorm_add_sum` whose second output takes over the sum the rest
/// of the graph reads, the add's nodes removed.
pub fn edit(g: &Graph, l: &LayerNormMatch, kernel: &str) -> Edit {
    let (normalized_shape, eps) = match &l.spelling {
        Spelling::Aten {
            normalized_shape,
            eps,
        } => (*normalized_shape, *eps),
        Spelling::Written { eps, upcast, .. } => return edit_written(g, l, *eps, *upcast, kernel),
    };
    let (op, x, dtypes, sum) = match &l.add {
        None => ("fact::layernorm", vec![Operand::value(l.x)], vec![], None),
        Some(add) => (
            if add.sum.is_some() {
                "fact::layernorm_add_sum"
            } else {
                "fact::layernorm_add"
            },
            vec![Operand::value(add.a), Operand::value(add.b)],
            vec![Operand::text(&format!(
                "{},{}",
                add.residual.sum.short_name(),
                l.problem.dtype.short_name()
            ))],
            add.sum,
        ),
    };
    let mut operands = x;
    operands.extend([
        Operand::value(normalized_shape),
        Operand::optional(l.weight),
        Operand::optional(l.bias),
        Operand::value(eps),
    ]);
    operands.extend(dtypes);
    operands.push(Operand::text(kernel));
    let rest = l.rest();
    Edit {
        node: l.node as u32,
        expect_kind: g.nodes[l.node].kind.clone(),
        op: op.to_string(),
        operands,
        remove: rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        outputs: sum.iter().map(|&n| n as u32).collect(),
        output_kinds: sum.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        first: false,
    }
}

/// The written-out norm's rewrite: `fact::layernorm_written(x, weight?, eps, form, kernel)` in
/// place of its last op, eps as its text (the graph holds it as a constant of no node the op
/// could read) and form `upcast` where x was cast to fp32 and back.
fn edit_written(g: &Graph, l: &LayerNormMatch, eps: f64, upcast: bool, kernel: &str) -> Edit {
    let rest = l.rest();
    Edit {
        node: l.node as u32,
        expect_kind: g.nodes[l.node].kind.clone(),
        op: "fact::layernorm_written".to_string(),
        operands: vec![
            Operand::value(l.x),
            Operand::optional(l.weight),
            Operand::text(&format!("{eps:?}")),
            Operand::text(if upcast { "upcast" } else { "" }),
            Operand::text(kernel),
        ],
        remove: rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        ..Default::default()
    }
}

/// What the plan says a LayerNorm kernel does for the match.
fn notes(l: &LayerNormMatch, math: MathType, arch: Arch) -> Vec<String> {
    let p = &l.problem;
    let Some(first) = candidates(p, arch).into_iter().next() else {
        return vec![format!(
            "no LayerNorm kernel takes C = {}: the row does not fit one CTA's registers",
            p.cols
        )];
    };
    let params = match (p.weight, p.bias) {
        (true, true) => "weight and bias",
        (true, false) => "the weight",
        (false, true) => "the bias",
        (false, false) => "no affine parameters",
    };
    let mut notes = vec![format!(
        "one kernel (fact's own): each row of {} held in registers by a group of threads, {}-byte vector loads, mean and variance in fp32 over the registers (warp shuffles, shared memory across the group's warps), then {params}; {} arithmetic",
        p.cols,
        first.vector as usize * p.dtype.bytes(),
        math.short_name()
    )];
    notes.push(match &p.add {
        None => format!(
            "one read of x and one write of y ({:.1} MB); x's rows are read through their stride (a view whose rows are not one stride apart runs torch's layer_norm)",
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
