//! Assembling the plan: costs, shares, expected gains, examples and the agent's ranking.

use super::{node_costs, unmatched_regions, Plan, PlannedPattern};
use crate::agent::{RankItem, Steward};
use crate::graph::{Graph, NodeId, ValueId};
use crate::rules::{AttentionMatch, GemmMatch, LayerNormMatch, Major, Match, Patterns, Problem};
use crate::space::examples::index;
use crate::space::knowledge::cutlass_layouts;
use crate::space::Knowledge;
use crate::table::{Lookup, TableKey, Tables};
use crate::types::{Arch, MathType, Precision};
use std::collections::{BTreeSet, HashMap};

pub struct PlanOptions {
    pub arch: Arch,
    pub precision: Precision,
    /// Speedup assumed for a pattern the tables hold no measurement of.
    pub assumed_speedup: f64,
}

fn gemm_notes(m: &GemmMatch, math: Option<MathType>, arch: Arch) -> Vec<String> {
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
    .chain([crate::space::alignment_note(p, arch)])
    .chain(crate::space::epilogue_note(p, math, arch))
    .collect()
}

fn attention_notes(a: &AttentionMatch, math: Option<MathType>) -> Vec<String> {
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
            if p.causal { "causal mask (key blocks past the diagonal skipped), " } else { "" },
            math.short_name(),
            p.seq_q,
            p.seq_k
        ),
        format!("q, k, v read through their strides ({}), the output written as [B,T,H,D]", a.form()),
    ]
}

fn layernorm_notes(l: &LayerNormMatch, math: MathType, arch: Arch) -> Vec<String> {
    let p = &l.problem;
    let Some(first) = crate::space::layernorm::candidates(p, arch)
        .into_iter()
        .next()
    else {
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
    vec![
        format!(
            "one kernel (fact's own): each row of {} held in registers by a group of threads, {}-byte vector loads, mean and variance in fp32 over the registers (warp shuffles, shared memory across the group's warps), then {params}; {} arithmetic",
            p.cols,
            first.vector as usize * p.dtype.bytes(),
            math.short_name()
        ),
        format!(
            "one read of x and one write of y ({:.1} MB); x's rows are read through their stride (a view whose rows are not one stride apart runs torch's layer_norm)",
            p.bytes() / 1e6
        ),
    ]
}

/// The measured speedup of a problem's winner over torch, where the tables hold one.
fn speedup(
    problem: &Problem,
    math: Option<MathType>,
    opts: &PlanOptions,
    tables: Option<&Tables>,
) -> (f64, String) {
    match (math, tables) {
        (None, _) => (1.0, "left to torch under this precision".to_string()),
        (Some(math), Some(t)) => match t.lookup(&TableKey::of(problem, math, opts.arch), problem) {
            Lookup::Exact { entry, table } => match entry.baseline_ms() {
                Some(b) => (
                    b / entry.winner_ms,
                    format!(
                        "measured ({table} table, {})",
                        entry.winner_provenance().device.name
                    ),
                ),
                None => (opts.assumed_speedup, "assumed".into()),
            },
            _ => (
                opts.assumed_speedup,
                "assumed (no measurement in the tables)".into(),
            ),
        },
        (Some(_), None) => (opts.assumed_speedup, "assumed".into()),
    }
}

/// What a pattern's kind alone knows of its match; `Pricing::pattern` adds the plan's estimates.
struct Facts {
    /// `a<i>` for the i-th attention pattern, `l<i>` for LayerNorm, `p<i>` for GEMM.
    id: String,
    name: String,
    origin: String,
    /// The node that names the pattern: the GEMM, the LayerNorm, attention's output.
    node: NodeId,
    /// Every node the pattern replaces (`Match::nodes`): its time is theirs.
    nodes: Vec<NodeId>,
    /// The operands whose shapes the plan shows (`PlannedPattern::input_shapes`).
    operands: Vec<ValueId>,
    problem: Problem,
    math: Option<MathType>,
    notes: Vec<String>,
    copies: Vec<String>,
    pad: Option<String>,
}

impl Facts {
    fn attention(i: usize, a: &AttentionMatch, opts: &PlanOptions) -> Facts {
        let p = &a.problem;
        let problem = Problem::Attention(p.clone());
        let math = problem.math(opts.precision);
        Facts {
            id: format!("a{i}"),
            name: format!(
                "attention{} {}",
                if p.causal { " causal" } else { "" },
                p.shape_key()
            ),
            origin: if a.form().starts_with("sdpa") {
                "scaled_dot_product_attention".into()
            } else {
                "softmax(q·kᵀ)·v".into()
            },
            node: *a.nodes.last().expect("a pattern has nodes"),
            nodes: a.nodes(),
            operands: vec![a.q, a.k, a.v],
            notes: attention_notes(a, math),
            copies: vec![],
            pad: None,
            problem,
            math,
        }
    }

    fn layernorm(i: usize, l: &LayerNormMatch, opts: &PlanOptions) -> Facts {
        let problem = Problem::LayerNorm(l.problem.clone());
        let math = problem.math(opts.precision);
        Facts {
            id: format!("l{i}"),
            name: format!("layer_norm {}", l.problem.shape_key()),
            origin: "layer_norm".into(),
            node: l.node,
            nodes: l.nodes(),
            operands: [Some(l.x), l.weight, l.bias]
                .into_iter()
                .flatten()
                .collect(),
            notes: math
                .map(|m| layernorm_notes(l, m, opts.arch))
                .unwrap_or_default(),
            copies: vec![],
            pad: None,
            problem,
            math,
        }
    }

    fn gemm(i: usize, m: &GemmMatch, opts: &PlanOptions) -> Facts {
        let p = &m.problem;
        let problem = Problem::Gemm(p.clone());
        let math = problem.math(opts.precision);
        Facts {
            id: format!("p{i}"),
            name: match &p.epilogue {
                Some(e) => {
                    let ops: Vec<&str> = e.instrs.iter().map(|i| i.op.short_name()).collect();
                    format!(
                        "{} {} + {}",
                        m.origin.name(),
                        p.shape_key(),
                        ops.join(" → ")
                    )
                }
                None => format!("{} {}", m.origin.name(), p.shape_key()),
            },
            origin: m.origin.name().into(),
            node: m.node,
            // A fused pattern replaces its epilogue's kernels too.
            nodes: m.nodes(),
            operands: [Some(m.operand_a()), Some(m.b), m.bias]
                .into_iter()
                .flatten()
                .collect(),
            notes: gemm_notes(m, math, opts.arch),
            copies: m.copies.clone(),
            pad: m.applied_pad().map(|p| p.describe()),
            problem,
            math,
        }
    }
}

/// What the plan prices a pattern by: the cost model's time per node and the tables.
struct Pricing<'a> {
    g: &'a Graph,
    cost_of: HashMap<NodeId, f64>,
    total_ms: f64,
    opts: &'a PlanOptions,
    tables: Option<&'a Tables>,
}

impl Pricing<'_> {
    /// The planned pattern of a kind's facts: its nodes' time, share and expected gain, no
    /// examples or priority yet (the agent's).
    fn pattern(&self, f: Facts) -> PlannedPattern {
        let est_ms: f64 = f.nodes.iter().filter_map(|n| self.cost_of.get(n)).sum();
        let (speedup, source) = speedup(&f.problem, f.math, self.opts, self.tables);
        PlannedPattern {
            id: f.id,
            name: f.name,
            rule: f.problem.rule_id(),
            arch: self.opts.arch,
            node: f.node,
            origin: f.origin,
            input_shapes: f
                .operands
                .iter()
                .map(|&v| {
                    self.g
                        .tensor(v)
                        .map(|t| t.shape.clone())
                        .unwrap_or_default()
                })
                .collect(),
            dtype: f.problem.dtype(),
            math: f.math,
            problem: f.problem,
            notes: f.notes,
            copies: f.copies,
            pad: f.pad,
            examples: vec![],
            est_ms,
            share: if self.total_ms > 0.0 {
                est_ms / self.total_ms
            } else {
                0.0
            },
            expected_speedup: speedup,
            speedup_source: source,
            expected_gain_ms: est_ms * (1.0 - 1.0 / speedup),
            priority: 0,
        }
    }
}

/// The plan of a graph's patterns: shares from the cost model, gains from the tables where
/// they hold a measurement, examples and order from the agent. Patterns are named by kind and
/// index in their kind's list of `matched` (see `Facts::id`).
pub fn plan(
    g: &Graph,
    matched: &Patterns,
    opts: &PlanOptions,
    tables: Option<&Tables>,
    steward: &mut Steward,
) -> Plan {
    let costs = node_costs(g, opts.arch, opts.precision, &matched.gemm);
    let total: f64 = costs.iter().map(|c| c.ms).sum();
    // The agent is asked about them in this order: attention, LayerNorm, GEMM.
    let attention = matched
        .attention
        .iter()
        .enumerate()
        .map(|(i, a)| Facts::attention(i, a, opts));
    let layernorm = matched
        .layernorm
        .iter()
        .enumerate()
        .map(|(i, l)| Facts::layernorm(i, l, opts));
    let gemm = matched
        .gemm
        .iter()
        .enumerate()
        .map(|(i, m)| Facts::gemm(i, m, opts));
    let facts: Vec<Facts> = attention.chain(layernorm).chain(gemm).collect();
    let matched_nodes: BTreeSet<NodeId> = facts.iter().flat_map(|f| f.nodes.clone()).collect();
    let pricing = Pricing {
        g,
        cost_of: costs.iter().map(|c| (c.node, c.ms)).collect(),
        total_ms: total,
        opts,
        tables,
    };
    let mut patterns: Vec<PlannedPattern> = facts.into_iter().map(|f| pricing.pattern(f)).collect();
    let idx = index();
    for pat in &mut patterns {
        let offered = idx.for_rule(&pat.rule, pat.arch, pat.math);
        pat.examples = steward.examples(&pat.id, &pat.rule, pat.arch, &offered);
    }
    let items: Vec<RankItem> = patterns
        .iter()
        .map(|p| RankItem {
            id: p.id.clone(),
            rule: p.rule.clone(),
            shape: p.problem.shape_key(),
            est_ms: p.est_ms,
            share: p.share,
            expected_gain_ms: p.expected_gain_ms,
        })
        .collect();
    let order = steward.rank(&items);
    let rank: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i + 1))
        .collect();
    for p in &mut patterns {
        p.priority = rank[p.id.as_str()];
    }
    patterns.sort_by_key(|p| p.priority);
    let unmatched = unmatched_regions(g, &costs, &matched_nodes, total);
    // From +0.0: f64's `sum` starts at -0.0, which a plan with nothing unmatched printed as "-0.0%".
    let unmatched_share = unmatched.iter().fold(0.0, |s, r| s + r.share);
    let unmatched_gemms = super::unmatched_gemms(g, &matched_nodes);
    Plan {
        arch: opts.arch,
        precision: opts.precision,
        ceilings: super::ceilings(opts.arch),
        total_est_ms: total,
        patterns,
        unmatched,
        unmatched_share,
        unmatched_gemms,
        shapes: g.note.trim_end_matches("; ").to_string(),
        agent: steward.name(),
        agent_notes: steward.notes.clone(),
    }
}
