//! Compose: realizes every matched pattern (pattern-table hit, or a compiled and tuned sweep) and
//! rewrites the TorchScript graph so each matched node calls `fact::gemm` with its winner. Writes
//! the composed module, the winners-only op library and compose.json to the output folder. Without
//! a GPU it still discovers, renders and compiles, and says what is left for a GPU.

use crate::nvcc::{self, BuildError, CompileFailure, Toolchain};
use crate::rules::{match_gemms, GemmMatch, GemmProblem};
use crate::space::{gemm_candidates, KernelSpec};
use crate::table::{self, Entry, Provenance, Table, TableKey};
use crate::torch::{self, Edit, InputShape, Operand, OperandKind};
use crate::tune::{self, worker, CandidateResult, Outcome, Protocol};
use crate::types::{Arch, MathType, Precision};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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
    move |e| ComposeError::Io { path: path.display().to_string(), detail: e.to_string() }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub model: PathBuf,
    pub inputs: Vec<InputShape>,
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
}

/// How a pattern was realized.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum Realization {
    /// Found in a pattern table ("user" or "shipped"): only the winner was built.
    Hit { table: String },
    /// Tuned here; the winner went into the user table.
    Tuned { candidates: usize, failed: usize },
    /// Compiled but not tuned (no GPU).
    Compiled { candidates: usize, failed: usize },
    /// Left to torch.
    Skipped { reason: String },
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PatternReport {
    pub id: String,
    pub node: usize,
    pub origin: String,
    pub rule: String,
    pub problem: GemmProblem,
    pub key: Option<TableKey>,
    pub realization: Realization,
    pub kernel: Option<String>,
    pub kernel_ms: Option<f64>,
    pub torch_ms: Option<f64>,
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
    pub gpu: bool,
    pub compile_failures: Vec<CompileFailure>,
    pub graph_note: String,
    pub seconds: f64,
}

/// Replacing node `m.node` with `fact::gemm(a, b, bias?, origin, kernel)`.
pub fn gemm_edit(m: &GemmMatch, kernel: &str) -> Edit {
    let value = |v: usize| Operand { kind: OperandKind::Value, value: v as u32, text: String::new(), int_value: 0 };
    let text = |s: &str| Operand { kind: OperandKind::Str, value: 0, text: s.to_string(), int_value: 0 };
    let none = Operand { kind: OperandKind::None, value: 0, text: String::new(), int_value: 0 };
    Edit {
        node: m.node as u32,
        expect_kind: m.origin.aten_kind().to_string(),
        op: "fact::gemm".to_string(),
        operands: vec![
            value(m.a),
            value(m.b),
            m.bias.map_or(none, value),
            text(m.origin.name()),
            text(kernel),
        ],
    }
}

fn provenance(tc: &Toolchain) -> Provenance {
    let device = tune::cuda::Cuda::get().map(|c| c.device_info(0)).unwrap_or_else(|_| tune::cuda::DeviceInfo {
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

fn tune_problem(
    opts: &Options,
    tc: &Toolchain,
    problem: &GemmProblem,
    math: MathType,
    candidates: &[KernelSpec],
    dir: &Path,
) -> Result<(Entry, usize, usize, Vec<CompileFailure>), ComposeError> {
    let key = TableKey::gemm(problem, math, opts.arch);
    let built = nvcc::build_library(tc, candidates, dir, "libsweep.so", &opts.cache_dir, opts.jobs, opts.progress)?;
    let bar = if opts.progress {
        let b = ProgressBar::new(built.kernels.len() as u64);
        b.set_style(ProgressStyle::with_template("tuning    {bar:30} {pos}/{len} variants {elapsed} {msg}").expect("template"));
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
    let sweep = worker::run_sweep(&opts.exe, req, built.kernels.len(), &|_| bar.inc(1))
        .map_err(|detail| ComposeError::Tune { key: key.to_string(), detail })?;
    bar.finish_and_clear();
    let mut results: Vec<CandidateResult> = Vec::new();
    for (index, outcome) in sweep.outcomes {
        let spec = built.kernels[index].clone();
        results.push(CandidateResult { kernel: spec.name(), spec, outcome });
    }
    for f in &built.failures {
        let spec = candidates.iter().find(|k| k.name() == f.kernel).expect("failure names a candidate").clone();
        results.push(CandidateResult { kernel: f.kernel.clone(), spec, outcome: Outcome::CompileFailed { log: f.log.clone() } });
    }
    let failed = results.iter().filter(|r| r.outcome.median_ms().is_none()).count();
    let w = tune::winner(&results).ok_or_else(|| ComposeError::Tune {
        key: key.to_string(),
        detail: format!(
            "no candidate passed verification: {}",
            results.iter().map(|r| format!("{} {}", r.kernel, r.outcome.label())).collect::<Vec<_>>().join(", ")
        ),
    })?;
    let entry = Entry {
        key,
        problem: problem.clone(),
        winner: w.kernel.clone(),
        winner_spec: w.spec.clone(),
        winner_ms: w.outcome.median_ms().expect("winner is timed"),
        baseline: sweep.baseline,
        candidates: results.clone(),
        provenance: provenance(tc),
    };
    Ok((entry, results.len(), failed, built.failures))
}

/// Runs discovery, realization and the rewrite. Returns the report (also written as compose.json).
pub fn compose(opts: &Options) -> Result<ComposeReport, ComposeError> {
    let start = std::time::Instant::now();
    std::fs::create_dir_all(&opts.out_dir).map_err(io_err(&opts.out_dir))?;
    let (graph, inputs) = torch::load_graph(&opts.model, &opts.inputs)?;
    let matches = match_gemms(&graph);
    let tc = Toolchain::discover()?;
    let gpu = torch::cuda_available();
    let mut user = Table::load(&opts.user_table)?;
    let shipped = Table::load(&opts.shipped_table)?;

    let mut patterns = Vec::new();
    let mut winners: BTreeMap<String, KernelSpec> = BTreeMap::new();
    let mut tuned: BTreeMap<TableKey, (Entry, usize, usize)> = BTreeMap::new();
    let mut compile_failures = Vec::new();
    for (i, m) in matches.iter().enumerate() {
        let id = format!("p{i}");
        let mut report = PatternReport {
            id: id.clone(),
            node: m.node,
            origin: m.origin.name().into(),
            rule: m.problem.rule_id(),
            problem: m.problem.clone(),
            key: None,
            realization: Realization::Skipped { reason: String::new() },
            kernel: None,
            kernel_ms: None,
            torch_ms: None,
        };
        let Some(math) = MathType::for_tensor(m.problem.dtype, opts.precision) else {
            report.realization = Realization::Skipped {
                reason: format!("no kernel family computes {} under precision {}; use --precision tf32", m.problem.dtype, opts.precision),
            };
            patterns.push(report);
            continue;
        };
        let key = TableKey::gemm(&m.problem, math, opts.arch);
        report.key = Some(key.clone());
        if let Some((entry, from)) = table::lookup(&user, &shipped, &key) {
            report.realization = Realization::Hit { table: from.into() };
            report.kernel = Some(entry.winner.clone());
            report.kernel_ms = Some(entry.winner_ms);
            report.torch_ms = entry.baseline.as_ref().map(|b| b.median_ms);
            winners.insert(entry.winner.clone(), entry.winner_spec.clone());
            patterns.push(report);
            continue;
        }
        let mut candidates = gemm_candidates(&m.problem, math, opts.arch);
        candidates.truncate(opts.max_candidates.unwrap_or(usize::MAX).max(1));
        if candidates.is_empty() {
            report.realization = Realization::Skipped {
                reason: format!("no valid {} kernel for {} (alignment needs N and K divisible by {})", opts.arch, m.problem.shape_key(), 16 / m.problem.dtype.bytes()),
            };
            patterns.push(report);
            continue;
        }
        let dir = opts.out_dir.join("sweeps").join(format!("{}_{}_{}", key.rule, key.dtype, key.shape));
        if !gpu {
            let built = nvcc::build_library(&tc, &candidates, &dir, "libsweep.so", &opts.cache_dir, opts.jobs, opts.progress)?;
            report.realization = Realization::Compiled { candidates: candidates.len(), failed: built.failures.len() };
            compile_failures.extend(built.failures);
            patterns.push(report);
            continue;
        }
        if !tuned.contains_key(&key) {
            let (entry, n, failed, failures) = tune_problem(opts, &tc, &m.problem, math, &candidates, &dir)?;
            compile_failures.extend(failures);
            // Saved at once, so a later failure loses no tuning result.
            let mut fresh = Table::load(&opts.user_table)?;
            fresh.insert(entry.clone());
            fresh.save(&opts.user_table)?;
            user = fresh;
            tuned.insert(key.clone(), (entry, n, failed));
        }
        let (entry, n, failed) = &tuned[&key];
        report.realization = Realization::Tuned { candidates: *n, failed: *failed };
        report.kernel = Some(entry.winner.clone());
        report.kernel_ms = Some(entry.winner_ms);
        report.torch_ms = entry.baseline.as_ref().map(|b| b.median_ms);
        winners.insert(entry.winner.clone(), entry.winner_spec.clone());
        patterns.push(report);
    }

    let mut library = None;
    let mut composed = None;
    if !winners.is_empty() {
        let specs: Vec<KernelSpec> = winners.values().cloned().collect();
        let built = nvcc::build_library(&tc, &specs, &opts.out_dir, LIBRARY, &opts.cache_dir, opts.jobs, opts.progress)?;
        compile_failures.extend(built.failures.iter().cloned());
        let in_lib: std::collections::HashSet<String> = built.kernels.iter().map(KernelSpec::name).collect();
        let edits: Vec<Edit> = matches
            .iter()
            .zip(&patterns)
            .filter_map(|(m, r)| r.kernel.as_ref().filter(|k| in_lib.contains(*k)).map(|k| gemm_edit(m, k)))
            .collect();
        let out = opts.out_dir.join(COMPOSED);
        torch::rewrite_and_save(&opts.model, &out, &edits)?;
        library = Some(built.library);
        composed = Some(out);
    }
    let report = ComposeReport {
        model: opts.model.clone(),
        inputs,
        precision: opts.precision,
        arch: opts.arch,
        patterns,
        library,
        composed,
        gpu,
        compile_failures,
        graph_note: graph.note.clone(),
        seconds: start.elapsed().as_secs_f64(),
    };
    let path = opts.out_dir.join(REPORT);
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("report serializes")).map_err(io_err(&path))?;
    Ok(report)
}
