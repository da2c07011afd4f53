//! Assembling the plan: costs, shares, expected gains, examples and the agent's ranking.

use super::{node_costs, unmatched_regions, Plan, PlannedPattern};
use crate::agent::{RankItem, Steward};
use crate::graph::{Graph, NodeId};
use crate::rules::{AttentionMatch, GemmMatch, LayerNormMatch, Major, Patterns, Problem};
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

/// The plan of a graph's patterns: shares from the cost model, gains from the tables where
/// they hold a measurement, examples and order from the agent. GEMM patterns are `p<i>` (the
/// i-th of `patterns.gemm`), attention patterns `a<i>`, LayerNorm patterns `l<i>`.
pub fn plan(
    g: &Graph,
    matched: &Patterns,
    opts: &PlanOptions,
    tables: Option<&Tables>,
    steward: &mut Steward,
) -> Plan {
    let matches = &matched.gemm;
    let costs = node_costs(g, opts.arch, opts.precision, matches);
    let total: f64 = costs.iter().map(|c| c.ms).sum();
    let cost_of: HashMap<NodeId, f64> = costs.iter().map(|c| (c.node, c.ms)).collect();
    let idx = index();
    let mut patterns: Vec<PlannedPattern> = Vec::new();
    for (i, a) in matched.attention.iter().enumerate() {
        let p = &a.problem;
        let math = MathType::for_tensor(p.dtype, opts.precision);
        let problem = Problem::Attention(p.clone());
        let est_ms: f64 = a.nodes.iter().filter_map(|n| cost_of.get(n)).sum();
        let (speedup, source) = speedup(&problem, math, opts, tables);
        let shapes = [a.q, a.k, a.v]
            .iter()
            .map(|&v| g.tensor(v).map(|t| t.shape.clone()).unwrap_or_default())
            .collect();
        patterns.push(PlannedPattern {
            id: format!("a{i}"),
            name: format!(
                "attention{} {}",
                if p.causal { " causal" } else { "" },
                p.shape_key()
            ),
            rule: p.rule_id(),
            arch: opts.arch,
            node: *a.nodes.last().expect("a pattern has nodes"),
            origin: if a.form().starts_with("sdpa") {
                "scaled_dot_product_attention".into()
            } else {
                "softmax(q·kᵀ)·v".into()
            },
            input_shapes: shapes,
            dtype: p.dtype,
            math,
            notes: attention_notes(a, math),
            copies: vec![],
            problem,
            examples: vec![],
            est_ms,
            share: if total > 0.0 { est_ms / total } else { 0.0 },
            expected_speedup: speedup,
            speedup_source: source,
            expected_gain_ms: est_ms * (1.0 - 1.0 / speedup),
            priority: 0,
        });
    }
    for (i, l) in matched.layernorm.iter().enumerate() {
        let p = &l.problem;
        let problem = Problem::LayerNorm(p.clone());
        let math = problem.math(opts.precision);
        let est_ms = cost_of.get(&l.node).copied().unwrap_or(0.0);
        let (speedup, source) = speedup(&problem, math, opts, tables);
        let shapes = [Some(l.x), l.weight, l.bias]
            .into_iter()
            .flatten()
            .map(|v| g.tensor(v).map(|t| t.shape.clone()).unwrap_or_default())
            .collect();
        patterns.push(PlannedPattern {
            id: format!("l{i}"),
            name: format!("layer_norm {}", p.shape_key()),
            rule: p.rule_id(),
            arch: opts.arch,
            node: l.node,
            origin: "layer_norm".into(),
            input_shapes: shapes,
            dtype: p.dtype,
            math,
            notes: math
                .map(|m| layernorm_notes(l, m, opts.arch))
                .unwrap_or_default(),
            copies: vec![],
            problem,
            examples: vec![],
            est_ms,
            share: if total > 0.0 { est_ms / total } else { 0.0 },
            expected_speedup: speedup,
            speedup_source: source,
            expected_gain_ms: est_ms * (1.0 - 1.0 / speedup),
            priority: 0,
        });
    }
    for (i, m) in matches.iter().enumerate() {
        let p = &m.problem;
        let math = MathType::for_tensor(p.dtype, opts.precision);
        // A fused pattern replaces its epilogue's kernels too.
        let est_ms: f64 = m.nodes().iter().filter_map(|n| cost_of.get(n)).sum();
        let (speedup, source) = speedup(&Problem::Gemm(p.clone()), math, opts, tables);
        let shapes = [Some(m.a), Some(m.b), m.bias]
            .into_iter()
            .flatten()
            .map(|v| g.tensor(v).map(|t| t.shape.clone()).unwrap_or_default())
            .collect();
        patterns.push(PlannedPattern {
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
            rule: p.rule_id(),
            arch: opts.arch,
            node: m.node,
            origin: m.origin.name().into(),
            input_shapes: shapes,
            dtype: p.dtype,
            math,
            problem: Problem::Gemm(p.clone()),
            notes: notes(m, math, opts.arch),
            copies: m.copies.clone(),
            examples: vec![],
            est_ms,
            share: if total > 0.0 { est_ms / total } else { 0.0 },
            expected_speedup: speedup,
            speedup_source: source,
            expected_gain_ms: est_ms * (1.0 - 1.0 / speedup),
            priority: 0,
        });
    }
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
    let matched: BTreeSet<NodeId> = matches
        .iter()
        .flat_map(GemmMatch::nodes)
        .chain(
            matched
                .attention
                .iter()
                .flat_map(|a| a.nodes.iter().copied()),
        )
        .chain(matched.layernorm.iter().map(|l| l.node))
        .collect();
    let unmatched = unmatched_regions(g, &costs, &matched, total);
    let unmatched_share = unmatched.iter().map(|r| r.share).sum();
    let unmatched_gemms = super::unmatched_gemms(g, &matched);
    Plan {
        arch: opts.arch,
        precision: opts.precision,
        ceilings: super::ceilings(opts.arch),
        total_est_ms: total,
        patterns,
        unmatched,
        unmatched_share,
        unmatched_gemms,
        agent: steward.name(),
        agent_notes: steward.notes.clone(),
    }
}
