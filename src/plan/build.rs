//! Assembling the plan: costs, shares, expected gains, examples and the agent's ranking.

use super::{node_costs, unmatched_regions, Plan, PlannedPattern};
use crate::agent::{RankItem, Steward};
use crate::graph::{Graph, NodeId, ValueId};
use crate::kinds::{Found, Patterns, Problem, Work};
use crate::space::examples::index;
use crate::table::{Lookup, TableKey, Tables};
use crate::types::{Arch, MathType, Precision};
use std::collections::{BTreeSet, HashMap};

pub struct PlanOptions {
    pub arch: Arch,
    pub precision: Precision,
    /// Speedup assumed for a pattern the tables hold no measurement of.
    pub assumed_speedup: f64,
}

/// The measured speedup of a problem's winner over torch, where the tables hold one; else the
/// cost model's (`estimate`: the nodes' time over the kernel's, and what the kernel's counts),
/// where its kind prices its kernel; else the assumed one.
fn speedup(
    problem: &Problem,
    math: Option<MathType>,
    opts: &PlanOptions,
    tables: Option<&Tables>,
    estimate: Option<(f64, &str)>,
) -> (f64, String) {
    let assumed = |why: &str| match estimate {
        Some((s, note)) => (s, format!("estimated by the cost model ({note})")),
        None => (opts.assumed_speedup, why.to_string()),
    };
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
                None => assumed("assumed"),
            },
            _ => assumed("assumed (no measurement in the tables)"),
        },
        (Some(_), None) => assumed("assumed"),
    }
}

/// What a pattern's kind alone knows of its match; `Pricing::pattern` adds the plan's estimates.
struct Facts {
    /// Its plan id: its kind's letter and its index among the kind's patterns (`p0`, `a1`).
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
    /// The kernel's work as its kind describes it, for the cost model.
    work: Option<Work>,
}

impl Facts {
    /// A pattern's facts, as its kind gives them.
    fn of(f: &Found, opts: &PlanOptions) -> Facts {
        let problem = f.problem();
        let math = problem.math(opts.precision);
        let facts = f.kind.plan_facts(&*f.found, math, opts.arch);
        Facts {
            id: f.id.clone(),
            name: facts.name,
            origin: facts.origin,
            node: f.node(),
            // A fused pattern replaces its epilogue's kernels too.
            nodes: f.nodes(),
            operands: facts.operands,
            notes: facts.notes,
            copies: f.copies(),
            pad: facts.pad,
            work: math.and_then(|m| f.kind.work(&*f.found, m)),
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
        let kernel_ms = f
            .work
            .as_ref()
            .map(|w| super::price(w, self.opts.arch, self.opts.precision, f.problem.dtype()));
        let estimate = kernel_ms
            .zip(f.work.as_ref())
            .filter(|(ms, _)| *ms > 0.0 && est_ms > 0.0)
            .map(|(ms, w)| (est_ms / ms, w.note.as_str()));
        let (speedup, source) = speedup(&f.problem, f.math, self.opts, self.tables, estimate);
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
/// they hold a measurement, examples and order from the agent. Patterns are named by their plan
/// ids (`Found::id`).
pub fn plan(
    g: &Graph,
    matched: &Patterns,
    opts: &PlanOptions,
    tables: Option<&Tables>,
    steward: &mut Steward,
) -> Plan {
    let costs = node_costs(g, opts.arch, opts.precision, &matched.products());
    let total: f64 = costs.iter().map(|c| c.ms).sum();
    // The agent is asked about them in the registry's order of kinds.
    let facts: Vec<Facts> = matched.found.iter().map(|f| Facts::of(f, opts)).collect();
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
    // What the memo computes once per shape is neither a pattern nor left per forward.
    let memo: BTreeSet<NodeId> = (0..g.nodes.len())
        .filter(|&i| g.nodes[i].memo && !matched_nodes.contains(&i))
        .collect();
    let memo_ms: f64 = costs
        .iter()
        .filter(|c| memo.contains(&c.node))
        .fold(0.0, |s, c| s + c.ms);
    let memo_ops = costs.iter().filter(|c| memo.contains(&c.node)).count();
    let covered: BTreeSet<NodeId> = matched_nodes.union(&memo).copied().collect();
    let unmatched = unmatched_regions(g, &costs, &covered, total);
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
        memo_share: if total > 0.0 { memo_ms / total } else { 0.0 },
        memo_ops,
        source: Default::default(),
        unmatched_gemms,
        shapes: g.note.trim_end_matches("; ").to_string(),
        agent: steward.name(),
        agent_notes: steward.notes.clone(),
    }
}
