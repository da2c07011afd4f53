//! Compose: realizes every matched pattern (pattern-table hit, or a compiled and tuned sweep) and
//! rewrites the TorchScript graph so each pattern calls its kind's op with its winner (each kind's
//! edit, `kinds::Kind::edit`). Writes the composed module, the winners-only op library and
//! compose.json to the output folder. Without a GPU it still discovers, renders and compiles, and
//! says what is left for a GPU. realize.rs realizes one problem of any kind. With several GPUs
//! the distinct problems are realized side by side, one at a time per GPU
//! (`realize_all`), each measurement dealt across the GPUs free when it starts.

use crate::agent::external::ExternalAgent;
use crate::agent::Steward;
use crate::graph::Edit;
use crate::kinds::{registry, Candidates, Measured, Problem, Spec, SweepCx};
use crate::nvcc::{self, BuildError, CompileFailure, SccacheReport, Toolchain};
use crate::plan::{self, PlanOptions, UnmatchedGemm};
use crate::rules::PatternKind;
use crate::space::SpaceOptions;
use crate::table::{self, CandidateResult, Entry, Lookup, Provenance, Run, TableKey, Tables};
use crate::torch::{self, InputShape};
use crate::tune::devices::{self, GpuChoice, Pool};
use crate::tune::worker::Gpu;
use crate::tune::{self, worker, Outcome, Protocol};
use crate::types::{Arch, MathType, Precision};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use thiserror::Error;

mod realize;
mod schedule;

use realize::{finish, measure_ahead, prefetch};
pub use realize::{realize, Ahead, RealizeCtx, Realized, Shared};
use schedule::{realize_all, Chain};

pub const LIBRARY: &str = "libfact_ops.so";
pub const COMPOSED: &str = "composed.pt";
/// The composed program of a `.pt2` input.
pub const COMPOSED_PT2: &str = "composed.pt2";
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
    #[error("{0}")]
    Gpus(String),
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
    /// A problem whose patterns the plan puts, all together, under this share of the model's
    /// estimated time gets a light sweep (`LIGHT_BUDGET` first candidates, no later rounds): its
    /// best kernel can save little, and every candidate costs an nvcc unit (0: every sweep full).
    pub light_share: f64,
    /// An external agent command (`fact-agent/2` over stdin/stdout); None for the built-in one.
    pub agent: Option<String>,
    pub agent_timeout: std::time::Duration,
    /// The GPUs that tune (`--gpus`): all visible ones that run the arch's kernels by default.
    pub gpus: GpuChoice,
    /// The kinds matched beyond the default ones (`--fuse-siblings`).
    pub matching: registry::MatchOptions,
    /// The composed output's format; None: the input's.
    pub format: Option<Format>,
    /// With a `.pt2` output, also write the program and the composition as TorchScript
    /// (`torchscript/`), which fact's own benchmark times.
    pub torchscript_copies: bool,
}

/// The format of a composed output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// A TorchScript module (`composed.pt`).
    #[default]
    Torchscript,
    /// A torch.export program (`composed.pt2`), from a `.pt2` input.
    Pt2,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "torchscript" | "pt" => Ok(Format::Torchscript),
            "pt2" => Ok(Format::Pt2),
            _ => Err(format!("--format {s}: give torchscript or pt2")),
        }
    }
}

/// The GPUs this command tunes on, as `opts.gpus` picks them among those visible, with a note for
/// each GPU left out; none where no GPU tunes here (`gpu`: `tunes_here`), as without one.
pub fn gpu_pool(opts: &Options, gpu: bool) -> Result<(Pool, Vec<String>), ComposeError> {
    let spawn = Box::new(worker::Process {
        exe: opts.exe.clone(),
    });
    if !gpu {
        return Ok((Pool::new(vec![], spawn), vec![]));
    }
    let arch = opts.arch;
    let (gpus, notes) = devices::select(&opts.gpus, &devices::visible(), |g: &Gpu| {
        arch.runs_on(g.capability)
    })
    .map_err(ComposeError::Gpus)?;
    if gpus.is_empty() {
        // Device 0 runs the arch's kernels, yet CUDA listed no device to pin a worker to.
        return Err(ComposeError::Gpus(format!(
            "cudaGetDeviceCount lists no GPU that runs {arch} kernels, though torch sees one: check CUDA_VISIBLE_DEVICES and the driver"
        )));
    }
    Ok((Pool::new(gpus, spawn), notes))
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
            kinds: registry::KINDS,
        }
    }
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
    /// The problem's kind, for readers of compose.json (the harnesses count calls per kind);
    /// absent in reports written before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<PatternKind>,
    pub problem: Problem,
    pub key: Option<TableKey>,
    pub realization: Realization,
    pub kernel: Option<String>,
    pub kernel_ms: Option<f64>,
    pub torch_ms: Option<f64>,
    /// Operands whose strides fit no layout: the op copies them on every call (`kinds::gemm::GemmMatch`).
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
    /// The composed output's format.
    #[serde(default)]
    pub format: Format,
    /// The program and its composition as TorchScript, which fact's benchmark times, where the
    /// output is a `.pt2` program (`Options::torchscript_copies`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torchscript: Option<(PathBuf, PathBuf)>,
    /// Whether a GPU that runs the arch's kernels tuned them (and the bench may run).
    pub gpu: bool,
    /// The CUDA device present, whether or not it runs the arch's kernels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<Device>,
    /// The GPUs that tuned (`--gpus`), and why any other was left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<tune::cuda::DeviceInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_notes: Vec<String>,
    pub compile_failures: Vec<CompileFailure>,
    pub graph_note: String,
    /// GEMMs no rule took (inside control flow, shapes unknown), with the reason.
    #[serde(default)]
    pub unmatched_gemms: Vec<UnmatchedGemm>,
    /// Pattern ids in the order they were realized (the plan's priority).
    pub order: Vec<String>,
    pub agent: String,
    pub agent_notes: Vec<String>,
    /// What the shared compile cache did during the compose; None without sccache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sccache: Option<SccacheReport>,
    pub seconds: f64,
}

/// The first candidates of a light sweep (`Options::light_share`).
pub const LIGHT_BUDGET: usize = 4;

/// The table keys of the problems whose patterns the plan puts, all together, under
/// `opts.light_share` of the model's estimated time: each gets a light sweep.
pub fn light_keys(plan: &plan::Plan, opts: &Options) -> BTreeSet<TableKey> {
    problem_shares(plan, opts)
        .into_iter()
        .filter(|&(_, s)| s < opts.light_share)
        .map(|(k, _)| k)
        .collect()
}

/// The plan's distinct problems by table key, each with its patterns' share of the model's
/// estimated time summed.
fn problem_shares(plan: &plan::Plan, opts: &Options) -> BTreeMap<TableKey, f64> {
    let mut share: BTreeMap<TableKey, f64> = BTreeMap::new();
    for p in &plan.patterns {
        if let Some(math) = p.problem.math(opts.precision) {
            *share
                .entry(TableKey::of(&p.problem, math, opts.arch))
                .or_default() += p.share;
        }
    }
    share
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
    let source = torch::FrontEnd::of(model)?;
    let format = match opts.format {
        Some(f) => f,
        None if source.is_pt2() => Format::Pt2,
        None => Format::Torchscript,
    };
    if format == Format::Pt2 && !source.is_pt2() {
        return Err(ComposeError::Torch(torch::TorchError::Export(format!(
            "{}: --format pt2 needs a .pt2 input: fact writes a torch.export program from one it read (a TorchScript module has no export graph to keep); export the model with torch.export.export, save it with torch.export.save and compose that file",
            model.display()
        ))));
    }
    let mut found = registry::match_patterns_with(&graph, &opts.matching);
    let tc = Toolchain::discover()?;
    let cache_mark = tc.sccache_mark();
    let device = Device::detect();
    let gpu = tunes_here(opts.arch, device.as_ref());
    let tables = Tables::load(&opts.user_table, &opts.shipped_table)?;
    let mut steward = opts.steward();
    let plan_opts = PlanOptions {
        arch: opts.arch,
        precision: opts.precision,
        assumed_speedup: 1.05,
    };
    let mut the_plan = plan::plan(&graph, &found, &plan_opts, Some(&tables), &mut steward);
    the_plan.source = source;
    let order: Vec<String> = the_plan.patterns.iter().map(|p| p.id.clone()).collect();
    let pattern = |found: &crate::kinds::Patterns, id: &str| -> Problem {
        found.get(id).expect("plan ids name patterns").problem()
    };

    let problems: Vec<Problem> = order.iter().map(|id| pattern(&found, id)).collect();
    let (pool, gpu_notes) = gpu_pool(opts, gpu)?;
    for n in &gpu_notes {
        nvcc::progress_line(opts.progress, format_args!("gpus: {n}"));
    }
    if pool.gpus().len() > 1 {
        let names: Vec<String> = pool.gpus().iter().map(Gpu::label).collect();
        nvcc::progress_line(
            opts.progress,
            format_args!("tuning on {} GPUs: {}", names.len(), names.join(", ")),
        );
    }
    let light = light_keys(&the_plan, opts);
    if !light.is_empty() {
        let distinct = problem_shares(&the_plan, opts).len();
        nvcc::progress_line(
            opts.progress,
            format_args!(
                "light sweeps for {} of the {} distinct problems, each under {}% of the estimated time (--light-share): at most {LIGHT_BUDGET} first candidates, no later rounds",
                light.len(),
                distinct,
                opts.light_share * 100.0
            ),
        );
    }
    let cx = RealizeCtx {
        opts,
        tc: &tc,
        gpu,
        pool: &pool,
        light: &light,
    };
    prefetch(cx, &tables, &steward, &problems)?;

    // Each pattern's problem, then the smaller ones it falls back to where the larger gets no
    // kernel (a fused GEMM: the GEMM alone).
    let chains: Vec<Chain> = order
        .iter()
        .map(|id| Chain::of(found.get(id).expect("plan ids name patterns")))
        .collect();
    let tables = Mutex::new(tables);
    let steward = Mutex::new(steward);
    let sh = Shared {
        tables: &tables,
        steward: &steward,
    };
    let ahead = Ahead::default();
    let realized = std::thread::scope(|s| {
        let batch = measure_ahead(cx, sh, &problems, &ahead, s)?;
        let realized = realize_all(cx, sh, &chains, &ahead);
        if let Some(batch) = batch {
            let compiled = batch.join().expect("the sibling batch's thread panicked");
            if realized.is_ok() {
                compiled?;
            }
        }
        realized
    })?;
    let mut steward = steward.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut done: BTreeMap<ProblemKey, (Realization, Option<Entry>)> = BTreeMap::new();
    let mut compile_failures = Vec::new();
    for (chain, steps) in chains.iter().zip(realized.steps) {
        // The smaller patterns it fell back to, in turn: the rest stays in torch.
        for (i, (what, instead)) in chain.falls.iter().take(steps).enumerate() {
            let reason = match &realized.done[&chain.keys[i]].realized.how {
                Realization::Skipped { reason } => reason.clone(),
                _ => unreachable!("only a pattern left to torch unfuses"),
            };
            steward.notes.push(format!(
                "{}: {what} is left to torch ({reason}); {instead} is realized",
                chain.id
            ));
            let f = found.get_mut(&chain.id).expect("plan ids name patterns");
            let u = f
                .kind
                .unfused(&*f.found)
                .expect("only patterns with a smaller one unfuse");
            f.kind = u.kind;
            f.found = u.found;
        }
    }
    for (pk, r) in realized.done {
        let mut r = r.realized;
        finish(opts, &mut r);
        compile_failures.extend(r.failures);
        done.insert(pk, (r.how, r.entry));
    }

    let mut patterns = Vec::new();
    let mut winners: BTreeMap<String, Spec> = BTreeMap::new();
    for f in &found.found {
        let problem = f.problem();
        let (how, entry) = &done[&ProblemKey::of(&problem)];
        if let Some(e) = entry {
            winners.insert(e.winner.clone(), e.winner_spec.clone());
        }
        patterns.push(PatternReport {
            id: f.id.clone(),
            node: f.node(),
            origin: f.origin().to_string(),
            rule: problem.rule_id(),
            kind: Some(problem.pattern_kind()),
            problem,
            key: entry.as_ref().map(|e| e.key.clone()),
            realization: how.clone(),
            kernel: entry.as_ref().map(|e| e.winner.clone()),
            kernel_ms: entry.as_ref().map(|e| e.winner_ms),
            torch_ms: entry.as_ref().and_then(Entry::baseline_ms),
            copies: f.copies(),
        });
    }

    let mut library = None;
    let mut composed = None;
    let mut torchscript = None;
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
        let chosen: Vec<(&crate::kinds::Found, &str)> = found
            .found
            .iter()
            .zip(&patterns)
            .filter_map(|(f, r)| {
                r.kernel
                    .as_deref()
                    .filter(|k| in_lib.contains(*k))
                    .map(|k| (f, k))
            })
            .collect();
        // Each kind's edits are made together (`Kind::edits`), kinds in the order they appear.
        let mut edits: Vec<Edit> = Vec::new();
        let mut kinds: Vec<&'static dyn crate::kinds::Kind> = Vec::new();
        for (f, _) in &chosen {
            if !kinds.iter().any(|k| k.name() == f.kind.name()) {
                kinds.push(f.kind);
            }
        }
        for kind in kinds {
            let mine: Vec<(&dyn crate::rules::Match, &str)> = chosen
                .iter()
                .filter(|(f, _)| f.kind.name() == kind.name())
                .map(|(f, k)| (&*f.found, *k))
                .collect();
            edits.extend(kind.edits(&graph, &mine));
        }
        let schemas = registry::op_schemas();
        let out = match format {
            Format::Torchscript => {
                let out = opts.out_dir.join(COMPOSED);
                torch::rewrite_and_save(model, &out, &edits, &schemas)?;
                out
            }
            Format::Pt2 => {
                let out = opts.out_dir.join(COMPOSED_PT2);
                torch::rewrite_and_write_pt2(model, &out, &edits, &schemas)?;
                if opts.torchscript_copies {
                    let dir = opts.out_dir.join("torchscript");
                    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
                    let (original, composed) = (dir.join("original.pt"), dir.join(COMPOSED));
                    torch::save_torchscript(model, &original)?;
                    torch::rewrite_and_save(model, &composed, &edits, &schemas)?;
                    torchscript = Some((original, composed));
                }
                out
            }
        };
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
        format,
        torchscript,
        gpu,
        device: device.clone(),
        gpus: pool.gpus().iter().map(|g| g.info.clone()).collect(),
        gpu_notes,
        compile_failures,
        graph_note: graph.note.clone(),
        unmatched_gemms: the_plan.unmatched_gemms.clone(),
        order,
        agent: steward.name(),
        agent_notes: steward.notes.clone(),
        sccache: tc.sccache_report(cache_mark.as_ref()),
        seconds: start.elapsed().as_secs_f64(),
    };
    let path = opts.out_dir.join(REPORT);
    crate::atomic::write(
        &path,
        serde_json::to_string_pretty(&report).expect("report serializes"),
    )
    .map_err(io_err(&path))?;
    Ok(report)
}

/// Identity of a problem within one compose (patterns with equal problems realize once).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ProblemKey(String);

impl ProblemKey {
    fn of(p: &Problem) -> ProblemKey {
        ProblemKey(serde_json::to_string(p).expect("problem serializes"))
    }
}

/// Options as a test sets them: defaults, no agent, no GPU asked for.
#[cfg(test)]
pub(crate) fn test_options() -> Options {
    Options {
        out_dir: PathBuf::from("out/test"),
        precision: Precision::Tf32,
        arch: Arch::Sm90,
        jobs: 1,
        user_table: PathBuf::from("user_table.json"),
        shipped_table: PathBuf::from("shipped_table.json"),
        cache_dir: PathBuf::from("cache"),
        exe: PathBuf::from("fact"),
        protocol: Protocol::default(),
        progress: false,
        max_candidates: None,
        keep_slower: false,
        space: SpaceOptions::default(),
        refine: 4,
        light_share: 0.0,
        agent: None,
        agent_timeout: std::time::Duration::from_secs(30),
        gpus: GpuChoice::All,
        matching: registry::MatchOptions::default(),
        format: None,
        torchscript_copies: false,
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
    fn problems_worth_under_the_light_share_get_light_sweeps() {
        // Two layers' big projection (one problem) and a small head: the head's share of the
        // estimated time is far under 1%, each projection's well over it.
        let g = crate::graph::Graph::parse(
            "graph(%x: f32[8192,4096], %w: f32[4096,4096], %h: f32[64,64]):
               %none = prim::Constant[None]()
               %y0 = aten::linear(%x, %w, %none) : f32[8192,4096]
               %y1 = aten::linear(%y0, %w, %none) : f32[8192,4096]
               %s = aten::slice(%y1, %none, %none, %none, %none) : f32[8192,4096]
               %z = aten::linear(%h, %h, %none) : f32[64,64]
               return (%s, %z)",
        )
        .unwrap();
        let found = registry::match_patterns(&g);
        let mut steward = Steward::builtin();
        let plan_opts = PlanOptions {
            arch: Arch::Sm90,
            precision: Precision::Tf32,
            assumed_speedup: 1.05,
        };
        let the_plan = plan::plan(&g, &found, &plan_opts, None, &mut steward);
        let mut opts = test_options();
        opts.light_share = 0.01;
        let keys = light_keys(&the_plan, &opts);
        let shapes: Vec<&str> = keys.iter().map(|k| k.shape.as_str()).collect();
        assert_eq!(
            shapes,
            ["64x64x64"],
            "{:?}",
            the_plan
                .patterns
                .iter()
                .map(|p| (&p.rule, p.share))
                .collect::<Vec<_>>()
        );
        // Each projection alone is under 60%, both together are one problem over it.
        opts.light_share = 0.6;
        assert_eq!(light_keys(&the_plan, &opts).len(), 1);
        opts.light_share = 0.0;
        assert!(light_keys(&the_plan, &opts).is_empty());
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
