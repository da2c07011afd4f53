//! Compose: realizes every matched pattern (pattern-table hit, or a compiled and tuned sweep) and
//! rewrites the TorchScript graph so each pattern calls its kind's op (`fact::gemm`, `gemm_ep`,
//! `attention`, `layernorm`) with its winner. Writes the composed module, the winners-only op
//! library and compose.json to the output folder. Without a GPU it still discovers, renders and
//! compiles, and says what is left for a GPU.

use crate::agent::external::ExternalAgent;
use crate::agent::Steward;
use crate::graph::Graph;
use crate::nvcc::{self, BuildError, CompileFailure, Toolchain};
use crate::plan::{self, PlanOptions, UnmatchedGemm};
use crate::rules::{
    match_patterns, AttentionMatch, GemmMatch, GemmProblem, LayerNormMatch, Problem,
};
use crate::space::{self, validity, KernelSpec, Knowledge, SpaceOptions, Spec};
use crate::table::{self, Entry, Lookup, Provenance, Run, TableKey, Tables};
use crate::torch::{self, Edit, InputShape, Operand};
use crate::tune::{self, worker, CandidateResult, Outcome, Protocol};
use crate::types::{Arch, MathType, Precision};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use thiserror::Error;

pub const LIBRARY: &str = "libfact_ops.so";
pub const COMPOSED: &str = "composed.pt";
pub const REPORT: &str = "compose.json";

#[derive(Debug, Error)]
pub enum ComposeError {
    #[error(transparent)]
    Torch(#[from] torch::TorchError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Table(#[from] table::TableError),
    #[error("tuning {key} failed: {detail}")]
    Tune { key: String, detail: String },
    #[error("io error at {path}: {detail}")]
    Io { path: String, detail: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ComposeError + '_ {
    move |e| ComposeError::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

/// The CUDA device of this process, as compose sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    pub capability: (i32, i32),
}

impl Device {
    /// The first CUDA device, when torch sees one (looked up once per process).
    pub fn detect() -> Option<Device> {
        static DEVICE: std::sync::OnceLock<Option<Device>> = std::sync::OnceLock::new();
        DEVICE
            .get_or_init(|| {
                if !torch::cuda_available() {
                    return None;
                }
                let cuda = tune::cuda::Cuda::get().ok()?;
                Some(Device {
                    name: cuda.device_info(0).name,
                    capability: cuda.capability(0),
                })
            })
            .clone()
    }

    /// `NVIDIA H100 80GB HBM3 (compute capability 9.0)`.
    pub fn label(&self) -> String {
        format!(
            "{} (compute capability {}.{})",
            self.name, self.capability.0, self.capability.1
        )
    }
}

/// The arch to build for: the one asked for, else the device's, else sm90 (without a GPU, what
/// fact builds unless told). A device that is no target (8.6, 8.9: `Arch::from_capability`) has
/// the user name one.
pub fn target_arch(requested: Option<Arch>, device: Option<&Device>) -> Result<Arch, String> {
    match (requested, device) {
        (Some(arch), _) => Ok(arch),
        (None, None) => Ok(Arch::Sm90),
        (None, Some(d)) => Arch::from_capability(d.capability.0, d.capability.1).ok_or_else(|| {
            format!(
                "{} is not a device fact tunes for (sm80: 8.0, A100; sm90: 9.0, H100): sm80 kernels assume the A100's 163 KB of shared memory per CTA; pass --arch sm80 or --arch sm90 to build kernels for one (compiled, not tuned, here)",
                d.label()
            )
        }),
    }
}

/// Whether kernels built for `arch` are tuned here: the device runs them (`Arch::devices`).
pub fn tunes_here(arch: Arch, device: Option<&Device>) -> bool {
    device.is_some_and(|d| arch.runs_on(d.capability))
}

/// How to realize patterns: where things go and how hard to look.
#[derive(Clone, Debug)]
pub struct Options {
    /// Output folder: sweeps/, the op library, the composed module, compose.json.
    pub out_dir: PathBuf,
    pub precision: Precision,
    pub arch: Arch,
    pub jobs: usize,
    pub user_table: PathBuf,
    pub shipped_table: PathBuf,
    pub cache_dir: PathBuf,
    /// The fact executable that serves `tune-worker`.
    pub exe: PathBuf,
    pub protocol: Protocol,
    pub progress: bool,
    /// Cut each sweep to its first N candidates (they come ordered by the analytic estimate).
    pub max_candidates: Option<usize>,
    /// Substitute a winner even when torch measured faster (for ablations).
    pub keep_slower: bool,
    /// Budget and hopelessness cut of the derived space.
    pub space: SpaceOptions,
    /// How many of a sweep's fastest kernels get their launch knobs tuned.
    pub refine: usize,
    /// An external agent command (`fact-agent/2` over stdin/stdout); None for the built-in one.
    pub agent: Option<String>,
    pub agent_timeout: std::time::Duration,
}

impl Options {
    /// The agent this run consults: the external one when it starts, else the built-in one.
    pub fn steward(&self) -> Steward {
        match &self.agent {
            None => Steward::builtin(),
            Some(cmd) => match ExternalAgent::start(cmd, self.agent_timeout) {
                Ok(a) => Steward::with(Box::new(a)),
                Err(e) => {
                    let mut s = Steward::builtin();
                    s.notes.push(format!("{e}; the built-in agent is used"));
                    s
                }
            },
        }
    }

    /// How this run builds a library (or compiles objects) into `out_dir`.
    fn build(&self, out_dir: &Path) -> nvcc::BuildOptions {
        nvcc::BuildOptions {
            out_dir: out_dir.to_path_buf(),
            cache: self.cache_dir.clone(),
            jobs: self.jobs,
            show_progress: self.progress,
        }
    }
}

/// Kernel names that failed to build or run (not numerics, which depend on the shape) in any
/// run the tables remember, for the arch and dtype of `key`.
fn failed_kernels(tables: &Tables, key: &TableKey) -> BTreeSet<String> {
    tables
        .user
        .entries
        .iter()
        .chain(&tables.shipped.entries)
        .filter(|e| e.key.arch == key.arch && e.key.dtypes == key.dtypes)
        .flat_map(|e| e.runs.iter().flat_map(|r| r.candidates.iter()))
        .filter(|c| {
            matches!(
                c.outcome,
                Outcome::CompileFailed { .. }
                    | Outcome::Fault { .. }
                    | Outcome::LaunchFailed { .. }
            )
        })
        .map(|c| c.kernel.clone())
        .collect()
}

/// How a pattern was realized.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum Realization {
    /// Found in a pattern table ("user" or "shipped"): only the winner was built. `measured_on`
    /// names another GPU or CUTLASS version the winner was measured with; it was re-verified here
    /// when a GPU was present (`reverified`).
    Hit {
        table: String,
        measured_on: Option<String>,
        reverified: bool,
    },
    /// The winner of a nearby shape in the same bucket, re-verified (and timed) on this shape.
    Bucket { table: String, from_shape: String },
    /// Tuned here; the winner went into the user table.
    Tuned { candidates: usize, failed: usize },
    /// Compiled but not tuned (no GPU).
    Compiled { candidates: usize, failed: usize },
    /// Left to torch.
    Skipped { reason: String },
}

impl Realization {
    pub fn label(&self) -> String {
        match self {
            Realization::Hit {
                table,
                measured_on: None,
                ..
            } => format!("hit ({table} table)"),
            Realization::Hit {
                table,
                measured_on: Some(_),
                reverified,
            } => {
                format!(
                    "hit ({table}, other GPU{})",
                    if *reverified {
                        ", re-verified"
                    } else {
                        ", unverified"
                    }
                )
            }
            Realization::Bucket { from_shape, .. } => format!("bucket hit ({from_shape})"),
            Realization::Tuned { candidates, failed } => {
                format!("tuned {}/{candidates} ok", candidates - failed)
            }
            Realization::Compiled { candidates, failed } => {
                format!("compiled {}/{candidates}", candidates - failed)
            }
            Realization::Skipped { .. } => "left to torch".into(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PatternReport {
    pub id: String,
    pub node: usize,
    pub origin: String,
    pub rule: String,
    pub problem: Problem,
    pub key: Option<TableKey>,
    pub realization: Realization,
    pub kernel: Option<String>,
    pub kernel_ms: Option<f64>,
    pub torch_ms: Option<f64>,
    /// Operands whose strides fit no layout: the op copies them on every call (rules::GemmMatch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ComposeReport {
    pub model: PathBuf,
    pub inputs: Vec<InputShape>,
    pub precision: Precision,
    pub arch: Arch,
    pub patterns: Vec<PatternReport>,
    pub library: Option<PathBuf>,
    pub composed: Option<PathBuf>,
    /// Whether a GPU that runs the arch's kernels tuned them (and the bench may run).
    pub gpu: bool,
    /// The CUDA device present, whether or not it runs the arch's kernels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<Device>,
    pub compile_failures: Vec<CompileFailure>,
    pub graph_note: String,
    /// GEMMs no rule took (inside control flow, shapes unknown), with the reason.
    #[serde(default)]
    pub unmatched_gemms: Vec<UnmatchedGemm>,
    /// Pattern ids in the order they were realized (the plan's priority).
    pub order: Vec<String>,
    pub agent: String,
    pub agent_notes: Vec<String>,
    pub seconds: f64,
}

/// The rewrite of a match: `fact::gemm(a, b, bias?, origin, kernel)` in place of the GEMM node,
/// or, for a fused pattern, `fact::gemm_ep(a, b, bias?, [leaves], origin, epilogue, kernel)` in
/// place of its last node, the GEMM and the other epilogue nodes removed.
pub fn gemm_edit(g: &Graph, m: &GemmMatch, kernel: &str) -> Edit {
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
            remove: vec![],
            remove_kinds: vec![],
        };
    };
    let nodes = m.nodes();
    let (last, rest) = nodes.split_last().expect("a pattern has nodes");
    let leaves = Operand::values(&ep.leaves);
    Edit {
        node: *last as u32,
        expect_kind: g.nodes[*last].kind.clone(),
        op: "fact::gemm_ep".to_string(),
        operands: vec![
            Operand::value(m.a),
            Operand::value(m.b),
            bias,
            leaves,
            Operand::text(m.origin.name()),
            Operand::text(&ep.epilogue.text()),
            Operand::text(kernel),
        ],
        remove: rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
    }
}

/// The rewrite of an attention match: `fact::attention(q, k, v, mask?, scale?, form, kernel)` in place of
/// its last node, the pattern's other nodes removed.
pub fn attention_edit(g: &Graph, a: &AttentionMatch, kernel: &str) -> Edit {
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
        ],
        remove: rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
    }
}

/// The rewrite of a LayerNorm match: `fact::layernorm(x, normalized_shape, weight?, bias?, eps,
/// kernel)` in place of the `aten::layer_norm` node, its operands the node's own (the fallback
/// replays the call with them).
pub fn layernorm_edit(g: &Graph, l: &LayerNormMatch, kernel: &str) -> Edit {
    Edit {
        node: l.node as u32,
        expect_kind: g.nodes[l.node].kind.clone(),
        op: "fact::layernorm".to_string(),
        operands: vec![
            Operand::value(l.x),
            Operand::value(l.normalized_shape),
            Operand::optional(l.weight),
            Operand::optional(l.bias),
            Operand::value(l.eps),
            Operand::text(kernel),
        ],
        remove: vec![],
        remove_kinds: vec![],
    }
}

fn provenance(tc: &Toolchain) -> Provenance {
    let device = tune::cuda::Cuda::get()
        .map(|c| c.device_info(0))
        .unwrap_or_else(|_| tune::cuda::DeviceInfo {
            name: "unknown".into(),
            sm_count: 0,
            compute_capability: "?".into(),
            driver: "?".into(),
            cuda_runtime: "?".into(),
        });
    Provenance {
        device,
        torch: torch::torch_version(),
        nvcc: tc.nvcc_version(),
        cutlass: tc.cutlass_version(),
        fact: env!("CARGO_PKG_VERSION").to_string(),
        date: table::today(),
    }
}

/// Compiles `candidates` into one library and judges every one on the GPU in child processes.
/// Returns the run (all outcomes, compile failures included) and the compile failures.
fn measure(
    opts: &Options,
    tc: &Toolchain,
    problem: &Problem,
    math: MathType,
    candidates: &[Spec],
    dir: &Path,
) -> Result<(Run, Vec<CompileFailure>), ComposeError> {
    let key = TableKey::of(problem, math, opts.arch);
    let built = nvcc::build_library(tc, candidates, "libsweep.so", &opts.build(dir))?;
    let bar = if opts.progress {
        let b = ProgressBar::new(built.kernels.len() as u64);
        b.set_style(
            ProgressStyle::with_template("tuning    {bar:30} {pos}/{len} variants {elapsed} {msg}")
                .expect("template"),
        );
        b.set_message(problem.shape_key());
        b
    } else {
        ProgressBar::hidden()
    };
    let req = worker::Request {
        library: built.library.clone(),
        problem: problem.clone(),
        math,
        precision: opts.precision,
        protocol: opts.protocol.clone(),
        start: 0,
        baseline: true,
    };
    let started = std::time::Instant::now();
    nvcc::progress_line(
        opts.progress,
        format_args!(
            "tuning {} variants of {} {}",
            built.kernels.len(),
            key.rule,
            key.shape
        ),
    );
    let sweep = worker::run_sweep(&opts.exe, req, built.kernels.len(), &|_| bar.inc(1)).map_err(
        |detail| ComposeError::Tune {
            key: key.to_string(),
            detail,
        },
    )?;
    bar.finish_and_clear();
    nvcc::progress_line(
        opts.progress,
        format_args!(
            "tuned {} in {:.0} s",
            key.shape,
            started.elapsed().as_secs_f64()
        ),
    );
    let mut candidates_out: Vec<CandidateResult> = Vec::new();
    // A sweep holds one pattern kind: the worker's indices are positions in `built.kernels`.
    for (index, outcome) in sweep.outcomes {
        let spec = built.kernels[index].clone();
        candidates_out.push(CandidateResult {
            kernel: spec.name(),
            spec,
            outcome,
        });
    }
    for f in &built.failures {
        for spec in candidates.iter().filter(|k| k.kernel_name() == f.kernel) {
            candidates_out.push(CandidateResult {
                kernel: spec.name(),
                spec: spec.clone(),
                outcome: Outcome::CompileFailed { log: f.log.clone() },
            });
        }
    }
    let run = Run {
        provenance: provenance(tc),
        baseline: sweep.baseline,
        candidates: candidates_out,
    };
    Ok((run, built.failures))
}

/// What realizing one problem produced.
pub struct Realized {
    pub how: Realization,
    pub entry: Option<Entry>,
    pub failures: Vec<CompileFailure>,
}

impl Realized {
    /// Left to torch, and why.
    fn skipped(reason: String) -> Realized {
        Realized {
            how: Realization::Skipped { reason },
            entry: None,
            failures: vec![],
        }
    }
}

fn sweep_dir(opts: &Options, key: &TableKey, what: &str) -> PathBuf {
    opts.out_dir
        .join("sweeps")
        .join(format!("{}_{}_{}{what}", key.rule, key.dtypes.a, key.shape))
}

/// Realizes one problem of any kind: a table hit (re-verified where it was measured elsewhere), a
/// bucket hit re-verified on this shape, or a full sweep. Every new measurement goes into the user
/// table at once, so a later failure loses no tuning result.
pub fn realize(
    opts: &Options,
    tc: &Toolchain,
    tables: &mut Tables,
    steward: &mut Steward,
    problem: &Problem,
    gpu: bool,
) -> Result<Realized, ComposeError> {
    let Some(math) = problem.math(opts.precision) else {
        return Ok(Realized::skipped(format!(
            "no kernel family computes {} under precision {}; use --precision tf32",
            problem.dtype(),
            opts.precision
        )));
    };
    let key = TableKey::of(problem, math, opts.arch);
    let sweep = |tables: &mut Tables, steward: &mut Steward| match problem {
        Problem::Gemm(p) => realize_sweep(opts, tc, tables, steward, p, math, key.clone()),
        Problem::Attention(_) | Problem::LayerNorm(_) => {
            realize_op_sweep(opts, tc, tables, problem, math, key.clone())
        }
    };
    let here = if gpu { Some(provenance(tc)) } else { None };
    match tables.lookup(&key, problem) {
        Lookup::Exact { entry, table } => {
            let prov = entry.winner_provenance();
            let elsewhere = here
                .as_ref()
                .filter(|h| h.device.name != prov.device.name || h.cutlass != prov.cutlass)
                .map(|_| format!("{} with CUTLASS {}", prov.device.name, prov.cutlass));
            if let Some(on) = elsewhere {
                return match reverify(
                    opts,
                    tc,
                    tables,
                    problem,
                    math,
                    &key,
                    &entry.winner_spec,
                    "_reverify",
                )? {
                    Some((entry, failures)) => Ok(Realized {
                        how: Realization::Hit {
                            table: table.into(),
                            measured_on: Some(on),
                            reverified: true,
                        },
                        entry: Some(entry),
                        failures,
                    }),
                    None => sweep(tables, steward),
                };
            }
            let how = Realization::Hit {
                table: table.into(),
                measured_on: None,
                reverified: false,
            };
            Ok(Realized {
                how,
                entry: Some(entry),
                failures: vec![],
            })
        }
        Lookup::Bucket { entry, table } if gpu => {
            match reverify(
                opts,
                tc,
                tables,
                problem,
                math,
                &key,
                &entry.winner_spec,
                "_bucket",
            )? {
                Some((fresh, failures)) => Ok(Realized {
                    how: Realization::Bucket {
                        table: table.into(),
                        from_shape: entry.key.shape.clone(),
                    },
                    entry: Some(fresh),
                    failures,
                }),
                None => sweep(tables, steward),
            }
        }
        _ => sweep(tables, steward),
    }
}

/// Builds and judges a winner from elsewhere on this problem. When it passes, the run goes into
/// the user table and the entry as it stands there now comes back; None when it failed here.
#[allow(clippy::too_many_arguments)]
fn reverify(
    opts: &Options,
    tc: &Toolchain,
    tables: &mut Tables,
    problem: &Problem,
    math: MathType,
    key: &TableKey,
    winner: &Spec,
    what: &str,
) -> Result<Option<(Entry, Vec<CompileFailure>)>, ComposeError> {
    let dir = sweep_dir(opts, key, what);
    let (run, failures) = measure(opts, tc, problem, math, std::slice::from_ref(winner), &dir)?;
    let Some(fresh) = Entry::from_runs(key.clone(), problem.clone(), vec![run]) else {
        return Ok(None);
    };
    tables.record(fresh)?;
    Ok(tables.user.get(key).cloned().map(|e| (e, failures)))
}

/// The kernels a GEMM sweep compiles first, with the space they came from and the kernels the
/// tables saw fail before.
struct SweepCandidates {
    kernels: Vec<KernelSpec>,
    space: space::Space,
    failed_before: BTreeSet<String>,
}

/// The kernels a GEMM sweep compiles first: the derived space (less what the tables learned to
/// fail), as the agent proposes it, capped at the budget; or why there are none.
fn sweep_candidates(
    opts: &Options,
    tc: &Toolchain,
    tables: &Tables,
    steward: &mut Steward,
    problem: &GemmProblem,
    math: MathType,
    key: &TableKey,
) -> Result<Result<SweepCandidates, String>, ComposeError> {
    let failed_before = failed_kernels(tables, key);
    let cutlass = tc.cutlass_version();
    let (kb, kb_note) = Knowledge::for_cutlass(&cutlass).map_err(|detail| ComposeError::Tune {
        key: key.to_string(),
        detail,
    })?;
    if let Some(n) = kb_note {
        if !steward.notes.contains(&n) {
            steward.notes.push(n);
        }
    }
    let rules = tables.rules();
    let scope = key.scope(&cutlass);
    let mut space_opts = opts.space.clone();
    if let Some(n) = opts.max_candidates {
        space_opts.budget = n.max(1);
    }
    let space = space::derive(&kb, problem, math, opts.arch, &rules, &scope, &space_opts);
    let mut candidates = steward.propose(
        problem,
        math,
        opts.arch,
        space.candidates.clone(),
        &failed_before,
    );
    candidates.retain(|k| match validity::rejecting(&rules, &scope, k) {
        Some(r) => {
            steward
                .notes
                .push(format!("{} not tried: {}", k.name(), r.describe()));
            false
        }
        None => true,
    });
    candidates.truncate(space_opts.budget);
    if candidates.is_empty() {
        return Ok(Err(format!(
            "no valid {} kernel for {} ({} in the knowledge base, {} pruned; {}{})",
            opts.arch,
            problem.shape_key(),
            space.candidates.len() + space.pruned.len(),
            space.pruned.len(),
            space::alignment_note(problem, opts.arch),
            space::fusion_refusal(problem, math, opts.arch)
                .map(|why| format!("; {why}"))
                .unwrap_or_default()
        )));
    }
    Ok(Ok(SweepCandidates {
        kernels: candidates,
        space,
        failed_before,
    }))
}

/// The kernels a sweep of a kind other than GEMM compiles (the kind's space, no agent), or why
/// there are none.
fn op_sweep_candidates(
    opts: &Options,
    problem: &Problem,
    math: MathType,
) -> Result<Vec<Spec>, String> {
    let mut candidates: Vec<Spec> = match problem {
        Problem::Attention(p) => space::attention::candidates(p, math, opts.arch)
            .into_iter()
            .map(Spec::from)
            .collect(),
        Problem::LayerNorm(p) => space::layernorm::candidates(p, opts.arch)
            .into_iter()
            .map(Spec::from)
            .collect(),
        Problem::Gemm(_) => unreachable!("GEMM sweeps go through sweep_candidates"),
    };
    if let Some(n) = opts.max_candidates {
        candidates.truncate(n.max(1));
    }
    if !candidates.is_empty() {
        return Ok(candidates);
    }
    Err(match problem {
        Problem::Attention(p) => {
            format!("no attention kernel takes head dim {} in {} (multiples of {} up to 256)", p.head_dim, p.dtype, 16 / p.dtype.bytes())
        }
        Problem::LayerNorm(p) => format!(
            "no LayerNorm kernel takes C = {}: a row is held in the registers of one CTA, at most {} elements",
            p.cols,
            space::layernorm::MAX_ROW
        ),
        Problem::Gemm(_) => unreachable!("GEMM sweeps go through sweep_candidates"),
    })
}

/// Compiles the first candidates of every problem the tables cannot answer in one parallel build,
/// into the object cache, before the sweeps run one by one: one nvcc unit takes the better part of
/// a minute and a single sweep rarely fills every core, so pooling them shortens a cold compose
/// by about the number of sweeps times a unit. Only the built-in agent's candidates are known in
/// advance; an external agent's sweeps compile as they come. Failures are left to the sweeps to
/// report.
fn prefetch(
    opts: &Options,
    tc: &Toolchain,
    tables: &Tables,
    steward: &Steward,
    problems: &[Problem],
) -> Result<(), ComposeError> {
    if !steward.is_builtin() {
        return Ok(());
    }
    let mut specs: Vec<Spec> = Vec::new();
    let mut builtin = Steward::builtin();
    let mut missed = 0;
    for problem in problems {
        let Some(math) = problem.math(opts.precision) else {
            continue;
        };
        let key = TableKey::of(problem, math, opts.arch);
        if !matches!(tables.lookup(&key, problem), Lookup::Miss) {
            continue;
        }
        let found = match problem {
            Problem::Gemm(p) => sweep_candidates(opts, tc, tables, &mut builtin, p, math, &key)?
                .map(|c| c.kernels.into_iter().map(Spec::from).collect()),
            Problem::Attention(_) | Problem::LayerNorm(_) => {
                op_sweep_candidates(opts, problem, math)
            }
        };
        missed += 1;
        specs.extend(found.unwrap_or_default());
    }
    let mut seen = BTreeSet::new();
    specs.retain(|s| seen.insert(s.kernel_name()));
    if specs.len() < 2 {
        return Ok(());
    }
    nvcc::progress_line(opts.progress, format_args!("prefetch: compiling together the first candidates of the {missed} pattern(s) the tables miss"));
    let dir = opts.out_dir.join("sweeps").join("prefetch");
    nvcc::compile_objects(tc, &specs, &opts.build(&dir)).map_err(ComposeError::from)?;
    Ok(())
}

fn realize_sweep(
    opts: &Options,
    tc: &Toolchain,
    tables: &mut Tables,
    steward: &mut Steward,
    problem: &GemmProblem,
    math: MathType,
    key: TableKey,
) -> Result<Realized, ComposeError> {
    let SweepCandidates {
        kernels: candidates,
        space,
        failed_before,
    } = match sweep_candidates(opts, tc, tables, steward, problem, math, &key)? {
        Ok(c) => c,
        Err(reason) => return Ok(Realized::skipped(reason)),
    };
    let dir = sweep_dir(opts, &key, "");
    let specs = |ks: &[KernelSpec]| -> Vec<Spec> { ks.iter().cloned().map(Spec::from).collect() };
    if !tunes_here(opts.arch, Device::detect().as_ref()) {
        return compile_only(opts, tc, &specs(&candidates), &dir);
    }
    let started = std::time::Instant::now();
    let gemm = Problem::Gemm(problem.clone());
    let (mut run, mut failures) = measure(opts, tc, &gemm, math, &specs(&candidates), &dir)?;
    if run
        .candidates
        .iter()
        .all(|c| c.outcome.median_ms().is_none())
    {
        // Nothing survived: the agent may propose one more set.
        let seen: Vec<(String, String)> = run
            .candidates
            .iter()
            .map(|c| (c.kernel.clone(), c.outcome.label().to_string()))
            .collect();
        let mut avoid = failed_before.clone();
        avoid.extend(seen.iter().map(|(k, _)| k.clone()));
        if let Some(retry) = steward.after_failure(problem, math, opts.arch, &seen, &avoid) {
            let (again, more) = measure(
                opts,
                tc,
                &gemm,
                math,
                &specs(&retry),
                &sweep_dir(opts, &key, "_retry"),
            )?;
            run.candidates.extend(again.candidates);
            failures.extend(more);
        }
    }
    // Launch knobs (raster, swizzle, K splits) of the fastest kernels: new variants of objects
    // already compiled, so this costs a dispatch index and a link, not nvcc time.
    let knob_variants = refine_candidates(&run, problem, opts.refine);
    if !knob_variants.is_empty() {
        let (more, _) = measure(
            opts,
            tc,
            &gemm,
            math,
            &specs(&knob_variants),
            &sweep_dir(opts, &key, "_knobs"),
        )?;
        run.candidates.extend(more.candidates);
    }
    let seconds = started.elapsed().as_secs_f64();
    let learned = tables.learn(&key, &run)?;
    // Every candidate with its status, what was pruned before nvcc and why, next to the sweep's
    // sources.
    let record = serde_json::json!({
        "key": key,
        "problem": problem,
        "space": { "source": space.source, "estimates_ms": candidates.iter().map(|k| (k.name(), space::estimate::estimate_ms(k, problem))).collect::<BTreeMap<_, _>>(), "pruned": space.pruned },
        "rules_learned": learned,
        "compile_and_tune_s": seconds,
        "run": run,
    });
    let _ = std::fs::write(
        dir.join("sweep.json"),
        serde_json::to_string_pretty(&record).expect("run serializes"),
    );
    record_sweep(tables, key, gemm, run, failures, &dir)
}

/// Without a GPU that runs them a sweep ends once its candidates are compiled.
fn compile_only(
    opts: &Options,
    tc: &Toolchain,
    candidates: &[Spec],
    dir: &Path,
) -> Result<Realized, ComposeError> {
    let built = nvcc::build_library(tc, candidates, "libsweep.so", &opts.build(dir))?;
    Ok(Realized {
        how: Realization::Compiled {
            candidates: candidates.len(),
            failed: built.failures.len(),
        },
        entry: None,
        failures: built.failures,
    })
}

/// A finished sweep's run into the user table (its scatter plot beside the sources), and the
/// entry as it stands there now; left to torch, naming every candidate's outcome, when none passed.
fn record_sweep(
    tables: &mut Tables,
    key: TableKey,
    problem: Problem,
    run: Run,
    failures: Vec<CompileFailure>,
    dir: &Path,
) -> Result<Realized, ComposeError> {
    let n = run.candidates.len();
    let failed = run
        .candidates
        .iter()
        .filter(|c| c.outcome.median_ms().is_none())
        .count();
    let summary = run
        .candidates
        .iter()
        .map(|c| format!("{} {}", c.kernel, c.outcome.label()))
        .collect::<Vec<_>>()
        .join(", ");
    let Some(entry) = Entry::from_runs(key.clone(), problem, vec![run]) else {
        return Ok(Realized {
            how: Realization::Skipped {
                reason: format!("no candidate passed verification: {summary}"),
            },
            entry: None,
            failures,
        });
    };
    let _ = std::fs::write(
        dir.join("scatter.svg"),
        crate::bench::plot::scatter_svg(&entry),
    );
    tables.record(entry)?;
    let merged = tables.user.get(&key).cloned();
    Ok(Realized {
        how: Realization::Tuned {
            candidates: n,
            failed,
        },
        entry: merged,
        failures,
    })
}

/// Sweeps a problem of a kind other than GEMM: its kind's candidates (the block shapes of
/// CUTLASS's fused attention that take the head dim, space::attention; the LayerNorm knobs for
/// its C, space::layernorm), compiled into one library and judged like GEMM candidates.
fn realize_op_sweep(
    opts: &Options,
    tc: &Toolchain,
    tables: &mut Tables,
    problem: &Problem,
    math: MathType,
    key: TableKey,
) -> Result<Realized, ComposeError> {
    let candidates = match op_sweep_candidates(opts, problem, math) {
        Ok(c) => c,
        Err(reason) => return Ok(Realized::skipped(reason)),
    };
    let dir = sweep_dir(opts, &key, "");
    if !tunes_here(opts.arch, Device::detect().as_ref()) {
        return compile_only(opts, tc, &candidates, &dir);
    }
    let started = std::time::Instant::now();
    let (run, failures) = measure(opts, tc, problem, math, &candidates, &dir)?;
    let record = serde_json::json!({ "key": key, "problem": problem, "compile_and_tune_s": started.elapsed().as_secs_f64(), "run": run });
    let _ = std::fs::write(
        dir.join("sweep.json"),
        serde_json::to_string_pretty(&record).expect("run serializes"),
    );
    record_sweep(tables, key, problem.clone(), run, failures, &dir)
}

/// Knob variants of the `top` fastest verified kernels of `run` not yet measured in it.
pub fn refine_candidates(run: &Run, p: &GemmProblem, top: usize) -> Vec<KernelSpec> {
    let mut ok: Vec<&CandidateResult> = run
        .candidates
        .iter()
        .filter(|c| c.outcome.median_ms().is_some())
        .collect();
    ok.sort_by(|a, b| {
        a.outcome
            .median_ms()
            .partial_cmp(&b.outcome.median_ms())
            .unwrap()
    });
    let seen: BTreeSet<String> = run.candidates.iter().map(|c| c.kernel.clone()).collect();
    let mut out: Vec<KernelSpec> = Vec::new();
    for c in ok.into_iter().take(top) {
        let Some(spec) = c.spec.as_gemm() else {
            continue;
        };
        for knobs in spec.knob_grid(p) {
            let v = spec.with_knobs(knobs);
            if !seen.contains(&v.name()) && !out.contains(&v) && v.fits(p) {
                out.push(v);
            }
        }
    }
    out
}

/// Leaves a winner slower than torch to torch, unless the options keep it.
fn finish(opts: &Options, r: &mut Realized) {
    if let Some(e) = r
        .entry
        .as_ref()
        .filter(|e| !opts.keep_slower && e.baseline_ms().is_some_and(|b| b < e.winner_ms))
    {
        r.how = Realization::Skipped {
            reason: format!(
                "the winner {} ({:.4} ms) is slower than torch ({:.4} ms); --keep-slower substitutes it anyway",
                e.winner,
                e.winner_ms,
                e.baseline_ms().unwrap_or_default()
            ),
        };
        r.entry = None;
    }
}

/// Runs discovery, realization and the rewrite. Returns the report (also written as compose.json).
pub fn compose(
    model: &Path,
    inputs: &[InputShape],
    opts: &Options,
) -> Result<ComposeReport, ComposeError> {
    let start = std::time::Instant::now();
    std::fs::create_dir_all(&opts.out_dir).map_err(io_err(&opts.out_dir))?;
    let (graph, inputs) = torch::load_graph(model, inputs)?;
    let found = match_patterns(&graph);
    let tc = Toolchain::discover()?;
    let device = Device::detect();
    let gpu = tunes_here(opts.arch, device.as_ref());
    let mut tables = Tables::load(&opts.user_table, &opts.shipped_table)?;
    let mut steward = opts.steward();
    let plan_opts = PlanOptions {
        arch: opts.arch,
        precision: opts.precision,
        assumed_speedup: 1.05,
    };
    let the_plan = plan::plan(&graph, &found, &plan_opts, Some(&tables), &mut steward);
    let (mut matches, attention, layernorm) = (found.gemm, found.attention, found.layernorm);
    let order: Vec<String> = the_plan.patterns.iter().map(|p| p.id.clone()).collect();

    let problems: Vec<Problem> = order
        .iter()
        .map(|id| Matched::of_plan_id(id, &matches, &attention, &layernorm).problem())
        .collect();
    prefetch(opts, &tc, &tables, &steward, &problems)?;

    // Realize in the plan's order, so the patterns worth most are tuned first.
    let mut done: BTreeMap<ProblemKey, (Realization, Option<Entry>)> = BTreeMap::new();
    let mut compile_failures = Vec::new();
    // Fused problems no kernel could realize: every match of one falls back to its plain GEMM.
    let mut unfused: BTreeSet<ProblemKey> = BTreeSet::new();
    for id in &order {
        loop {
            let m = Matched::of_plan_id(id, &matches, &attention, &layernorm);
            let i = plan_index(id);
            let problem = m.problem();
            let pk = ProblemKey::of(&problem);
            if !done.contains_key(&pk) {
                nvcc::progress_line(
                    opts.progress,
                    format_args!(
                        "pattern {id}: {} {}",
                        problem.rule_id(),
                        problem.shape_key()
                    ),
                );
                let mut r = realize(opts, &tc, &mut tables, &mut steward, &problem, gpu)?;
                if let (
                    Matched::Gemm(GemmMatch {
                        epilogue: Some(_), ..
                    }),
                    Realization::Skipped { reason },
                ) = (&m, &r.how)
                {
                    steward.notes.push(format!("{id}: the fused epilogue is left to torch ({reason}); the GEMM alone is realized"));
                    unfused.insert(pk.clone());
                }
                finish(opts, &mut r);
                compile_failures.extend(r.failures);
                done.insert(pk.clone(), (r.how, r.entry));
            }
            if !unfused.contains(&pk) {
                break;
            }
            // No fused kernel: the GEMM alone is still worth one; its epilogue stays in torch.
            matches[i] = matches[i].plain();
        }
    }

    let mut patterns = Vec::new();
    let mut winners: BTreeMap<String, Spec> = BTreeMap::new();
    let all: Vec<(String, Matched)> = matches
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("p{i}"), Matched::Gemm(m)))
        .chain(
            attention
                .iter()
                .enumerate()
                .map(|(i, a)| (format!("a{i}"), Matched::Attention(a))),
        )
        .chain(
            layernorm
                .iter()
                .enumerate()
                .map(|(i, l)| (format!("l{i}"), Matched::LayerNorm(l))),
        )
        .collect();
    for (id, m) in &all {
        let problem = m.problem();
        let (how, entry) = &done[&ProblemKey::of(&problem)];
        if let Some(e) = entry {
            winners.insert(e.winner.clone(), e.winner_spec.clone());
        }
        patterns.push(PatternReport {
            id: id.clone(),
            node: m.node(),
            origin: m.origin().to_string(),
            rule: problem.rule_id(),
            problem,
            key: entry.as_ref().map(|e| e.key.clone()),
            realization: how.clone(),
            kernel: entry.as_ref().map(|e| e.winner.clone()),
            kernel_ms: entry.as_ref().map(|e| e.winner_ms),
            torch_ms: entry.as_ref().and_then(Entry::baseline_ms),
            copies: m.copies(),
        });
    }

    let mut library = None;
    let mut composed = None;
    if !winners.is_empty() {
        let specs: Vec<Spec> = winners.values().cloned().collect();
        let built = nvcc::build_library(&tc, &specs, LIBRARY, &opts.build(&opts.out_dir))?;
        compile_failures.extend(built.failures.iter().cloned());
        let in_lib: std::collections::HashSet<String> =
            built.kernels.iter().map(Spec::name).collect();
        // A winner that failed to build here is not substituted: say so rather than name it.
        for p in patterns
            .iter_mut()
            .filter(|p| p.kernel.as_ref().is_some_and(|k| !in_lib.contains(k)))
        {
            p.realization = Realization::Skipped {
                reason: format!(
                    "the winner {} failed to compile here",
                    p.kernel.take().unwrap_or_default()
                ),
            };
        }
        let edits: Vec<Edit> = all
            .iter()
            .zip(&patterns)
            .filter_map(|((_, m), r)| {
                r.kernel
                    .as_ref()
                    .filter(|k| in_lib.contains(*k))
                    .map(|k| m.edit(&graph, k))
            })
            .collect();
        let out = opts.out_dir.join(COMPOSED);
        torch::rewrite_and_save(model, &out, &edits)?;
        library = Some(built.library);
        composed = Some(out);
    }
    let report = ComposeReport {
        model: model.to_path_buf(),
        inputs,
        precision: opts.precision,
        arch: opts.arch,
        patterns,
        library,
        composed,
        gpu,
        device: device.clone(),
        compile_failures,
        graph_note: graph.note.clone(),
        unmatched_gemms: the_plan.unmatched_gemms.clone(),
        order,
        agent: steward.name(),
        agent_notes: steward.notes.clone(),
        seconds: start.elapsed().as_secs_f64(),
    };
    let path = opts.out_dir.join(REPORT);
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&report).expect("report serializes"),
    )
    .map_err(io_err(&path))?;
    Ok(report)
}

/// The index in its kind's match list of the pattern a plan id (`p<i>`, `a<i>`, `l<i>`) names.
fn plan_index(id: &str) -> usize {
    id[1..]
        .parse::<usize>()
        .expect("plan ids are p<index>, a<index> or l<index>")
}

/// A match of any pattern kind, as the report and the rewrite see it.
enum Matched<'a> {
    Gemm(&'a GemmMatch),
    Attention(&'a AttentionMatch),
    LayerNorm(&'a LayerNormMatch),
}

impl<'a> Matched<'a> {
    /// The match a plan id names: `p<i>` the i-th GEMM match, `a<i>` the i-th attention match,
    /// `l<i>` the i-th LayerNorm match.
    fn of_plan_id(
        id: &str,
        gemm: &'a [GemmMatch],
        attention: &'a [AttentionMatch],
        layernorm: &'a [LayerNormMatch],
    ) -> Matched<'a> {
        match id.as_bytes().first() {
            Some(b'a') => Matched::Attention(&attention[plan_index(id)]),
            Some(b'l') => Matched::LayerNorm(&layernorm[plan_index(id)]),
            _ => Matched::Gemm(&gemm[plan_index(id)]),
        }
    }
    fn problem(&self) -> Problem {
        match self {
            Matched::Gemm(m) => Problem::Gemm(m.problem.clone()),
            Matched::Attention(a) => Problem::Attention(a.problem.clone()),
            Matched::LayerNorm(l) => Problem::LayerNorm(l.problem.clone()),
        }
    }
    /// The node the op replaces (the pattern's last).
    fn node(&self) -> usize {
        match self {
            Matched::Gemm(m) => m.node,
            Matched::Attention(a) => *a.nodes.last().expect("a pattern has nodes"),
            Matched::LayerNorm(l) => l.node,
        }
    }
    fn origin(&self) -> &'static str {
        match self {
            Matched::Gemm(m) => m.origin.name(),
            Matched::Attention(a) if a.form().starts_with("sdpa") => "scaled_dot_product_attention",
            Matched::Attention(_) => "attention",
            Matched::LayerNorm(_) => "layer_norm",
        }
    }
    /// Operands the op copies on every call (their strides fit no layout of the kernel); the
    /// attention kernel reads q, k and v through their strides, the LayerNorm kernel x's rows
    /// through a row stride.
    fn copies(&self) -> Vec<String> {
        match self {
            Matched::Gemm(m) => m.copies.clone(),
            Matched::Attention(_) | Matched::LayerNorm(_) => vec![],
        }
    }
    fn edit(&self, g: &Graph, kernel: &str) -> Edit {
        match self {
            Matched::Gemm(m) => gemm_edit(g, m, kernel),
            Matched::Attention(a) => attention_edit(g, a, kernel),
            Matched::LayerNorm(l) => layernorm_edit(g, l, kernel),
        }
    }
}

/// Identity of a problem within one compose (patterns with equal problems realize once).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ProblemKey(String);

impl ProblemKey {
    fn of(p: &Problem) -> ProblemKey {
        ProblemKey(serde_json::to_string(p).expect("problem serializes"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(major: i32, minor: i32) -> Device {
        Device {
            name: "GPU".into(),
            capability: (major, minor),
        }
    }

    #[test]
    fn the_arch_is_the_one_asked_for_else_the_devices_else_sm90() {
        assert_eq!(target_arch(Some(Arch::Sm80), None), Ok(Arch::Sm80));
        assert_eq!(
            target_arch(Some(Arch::Sm80), Some(&device(9, 0))),
            Ok(Arch::Sm80)
        );
        assert_eq!(target_arch(None, Some(&device(8, 0))), Ok(Arch::Sm80));
        assert_eq!(target_arch(None, Some(&device(9, 0))), Ok(Arch::Sm90));
        assert_eq!(target_arch(None, None), Ok(Arch::Sm90));
        let e = target_arch(None, Some(&device(8, 9))).unwrap_err();
        assert!(
            e.contains("compute capability 8.9") && e.contains("--arch sm80"),
            "{e}"
        );
        assert_eq!(
            target_arch(Some(Arch::Sm80), Some(&device(8, 9))),
            Ok(Arch::Sm80),
            "compiled for a named arch"
        );
    }

    #[test]
    fn kernels_are_tuned_only_on_a_device_that_runs_them() {
        assert!(
            tunes_here(Arch::Sm80, Some(&device(8, 0)))
                && tunes_here(Arch::Sm80, Some(&device(9, 0)))
        );
        assert!(tunes_here(Arch::Sm90, Some(&device(9, 0))));
        assert!(
            !tunes_here(Arch::Sm90, Some(&device(8, 0)))
                && !tunes_here(Arch::Sm80, Some(&device(8, 6)))
        );
        assert!(!tunes_here(Arch::Sm80, None));
    }
}
