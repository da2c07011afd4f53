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
pub mod steady;

use realize::{measure_ahead, prefetch};
pub use realize::{
    realize, Ahead, Compiler, Nvcc, RealizeCtx, Realized, Shared, NVCC, QUICK_CANDIDATES,
};
use schedule::{realize_all, Chain, Countdown};

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
    /// The kinds matched (`--fuse-siblings`, `--no-patch-conv`).
    pub matching: registry::MatchOptions,
    /// The composed output's format; None: the input's.
    pub format: Option<Format>,
    /// With a `.pt2` output, also write the program and the composition as TorchScript
    /// (`torchscript/`), which fact's own benchmark times.
    pub torchscript_copies: bool,
    /// Both phases, or the quick one alone (`--quick`).
    pub phases: Phases,
    /// Whether the GEMM-like patterns get a second kernel for calls of few rows (`SmallRows`).
    pub small_rows: SmallRows,
    /// Whether a pattern may run a kernel steadier past the sample's rows than its winner, where
    /// the program's dims reach past the sample (`steady`; `--steady`).
    pub steady: bool,
}

/// The rows a GEMM-like pattern (`Kind::rows`) is realized again at, for the calls a server sends
/// at small batches and lengths (a decode step, a short prompt): a kernel tuned at the model's
/// batch and sequence has tiles that fill few of the GPU's SMs there (GPT-2's at one row ran
/// 15 µs a GEMM on an H200, cuBLAS 4 µs), while one tuned here streams the weights on many.
pub const SMALL_ROWS: i64 = 128;
/// The most rows a call may have to run the small-rows kernel: past it, the pattern's own.
pub const SMALL_ROWS_UPTO: i64 = 256;
/// A pattern of fewer rows than this is tuned near the small calls already: no second kernel.
pub const SMALL_ROWS_FROM: i64 = 1024;

/// Whether compose realizes each GEMM-like pattern again at `SMALL_ROWS` rows, its op running
/// that kernel (or torch's ops, where they measured faster there) on calls of at most
/// `SMALL_ROWS_UPTO` rows: on, off, or (auto, the default) where the input is a `.pt2` program
/// exported with a dynamic dim, whose calls come at other shapes than the sample's. Either way
/// only where a GPU tunes: without one nothing measures the choice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmallRows {
    #[default]
    Auto,
    On,
    Off,
}

impl std::str::FromStr for SmallRows {
    type Err = String;
    fn from_str(s: &str) -> Result<SmallRows, String> {
        match s {
            "auto" => Ok(SmallRows::Auto),
            "on" => Ok(SmallRows::On),
            "off" => Ok(SmallRows::Off),
            _ => Err(format!("--small-rows takes auto, on or off, not '{s}'")),
        }
    }
}

impl SmallRows {
    /// Whether a model read by `source` gets the small-rows kernels.
    pub fn wanted(self, source: &torch::FrontEnd) -> bool {
        match self {
            SmallRows::On => true,
            SmallRows::Off => false,
            SmallRows::Auto => !source.dynamic.is_empty(),
        }
    }
}

/// The small-rows problem of each pattern that gets one (by pattern id): a GEMM-like problem of
/// at least `SMALL_ROWS_FROM` rows at `SMALL_ROWS`.
fn small_rows_problems(order: &[String], problems: &[Problem]) -> BTreeMap<String, Problem> {
    order
        .iter()
        .zip(problems)
        .filter(|(_, p)| p.kind().rows(p).is_some_and(|m| m >= SMALL_ROWS_FROM))
        .filter_map(|(id, p)| Some((id.clone(), p.kind().at_rows(p, SMALL_ROWS)?)))
        .collect()
}

/// The kernel operand of a pattern with a small-rows kernel: its op runs `small` ("torch": torch's
/// ops) on calls of at most `SMALL_ROWS_UPTO` rows and `kernel` on the others (the op libraries'
/// `kernel_for_rows` reads it).
pub fn kernel_by_rows(small: &str, kernel: &str) -> String {
    format!("{small}@{SMALL_ROWS_UPTO};{kernel}")
}

/// What a pattern runs on calls of at most `upto` rows: the kernel of its problem at `rows` rows,
/// or torch's ops (`kernel` None) where they measured faster there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SmallRowsReport {
    pub rows: i64,
    pub upto: i64,
    pub key: Option<TableKey>,
    pub realization: Realization,
    pub kernel: Option<String>,
    pub kernel_ms: Option<f64>,
    pub torch_ms: Option<f64>,
}

impl SmallRowsReport {
    /// The op's choice at small rows, where it has one: the kernel, or torch's ops where the
    /// realization measured them faster; None where it measured neither (left to a full phase, or
    /// no kernel passed), and the pattern's own kernel runs every call.
    pub fn choice(&self) -> Option<&str> {
        match (&self.kernel, &self.realization) {
            (Some(k), _) => Some(k),
            (None, Realization::Skipped { .. }) if self.torch_ms.is_some() => Some("torch"),
            _ => None,
        }
    }
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
            reuse_linked: false,
        }
    }

    /// A sweep library's build: one linked ahead from the same objects is taken as it is
    /// (`link_ahead`).
    fn sweep_build(&self, dir: &Path) -> nvcc::BuildOptions {
        nvcc::BuildOptions {
            reuse_linked: true,
            ..self.build(dir)
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
    /// Tuned here; the winner went into the user table. `quick`: the sweep measured its first
    /// candidates alone (a quick compose's), and a full one finishes it (`fact tune`).
    Tuned {
        candidates: usize,
        failed: usize,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        quick: bool,
    },
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
                        ", not yet timed here"
                    }
                )
            }
            Realization::Bucket { from_shape, .. } => format!("bucket hit ({from_shape})"),
            Realization::Tuned {
                candidates,
                failed,
                quick,
            } => {
                format!(
                    "tuned {}/{candidates} ok{}",
                    candidates - failed,
                    if *quick { ", quick" } else { "" }
                )
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
    /// What runs the pattern's calls of few rows (`SmallRows`), where it has a kernel for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_rows: Option<SmallRowsReport>,
    /// Where the pattern runs another kernel than the sample's winner, one that holds up on
    /// calls of more rows than the sample's (`steady`), and the figures that chose it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steady: Option<steady::SteadyChoice>,
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
    /// The custom ops of other libraries the program calls (`graph::is_custom_op`): the composed
    /// program calls them as the original did, where their library is loaded; fact's own
    /// benchmark, which runs without it, skips such a program.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub custom_ops: Vec<String>,
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
    /// The command's wall seconds (`fact tune`'s own, for a report it wrote).
    pub seconds: f64,
    /// The phase the output is of: quick where sweeps were left for `fact tune`, full otherwise.
    #[serde(default)]
    pub phase: Phase,
    /// Distinct problems the quick phase left to a full one that has not run yet: sweeps it cut
    /// short, and table winners measured on another GPU that it took without timing them here.
    #[serde(default)]
    pub sweeps_left: usize,
    /// Each phase run for this output, in order: what it took.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<PhaseRecord>,
    /// The patterns whose kernel the full phase changed against the quick phase's output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
    /// Whether the full phase rewrote the composed output and the op library.
    #[serde(default)]
    pub rewritten: bool,
    /// How the realizations were asked for (what `fact tune` asks again).
    #[serde(default)]
    pub asked: Asked,
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

/// The quick sweeps cut to their first candidate (`RealizeCtx::singles`): the quick batch gives a
/// second candidate only to as many sweeps as fit, with one unit for each distinct problem's first
/// kernel and one for the torch ops, in half the build jobs, the largest shares of the model's
/// time first. A unit compiles more slowly the more run beside it (cicc contends for the host's
/// memory): on a 16-core H200 host a quick batch of 8 units took 58 s and one of 16 took 74 s,
/// where the second candidates bought the model 0.2% (benches/results/compose/README.md).
/// The `small` rows problems (`small_rows_problems`) count as units too, each with no share of
/// the plan's time: they are the first cut, since a call of few rows that their kernel does not
/// serve still runs torch's ops or the pattern's own kernel.
/// `--candidates` sets every sweep's count itself: none is cut here.
/// Also returns how many quick sweeps there are (the problems the tables miss).
pub fn quick_singles(
    plan: &plan::Plan,
    small: &BTreeMap<String, Problem>,
    opts: &Options,
    tables: &Tables,
) -> (BTreeSet<TableKey>, usize) {
    let shares = problem_shares(plan, opts);
    let mut missed: BTreeMap<TableKey, f64> = BTreeMap::new();
    // One unit for each distinct problem's first kernel, the plan's and the small rows' alike.
    let mut units: BTreeSet<TableKey> = BTreeSet::new();
    let problems = plan
        .patterns
        .iter()
        .map(|p| &p.problem)
        .chain(small.values());
    for problem in problems {
        let Some(math) = problem.math(opts.precision) else {
            continue;
        };
        let key = TableKey::of(problem, math, opts.arch);
        units.insert(key.clone());
        if matches!(tables.lookup(&key, problem), Lookup::Miss) {
            let share = shares.get(&key).copied().unwrap_or(0.0);
            missed.insert(key, share);
        }
    }
    let sweeps = missed.len();
    if opts.max_candidates.is_some() {
        return (BTreeSet::new(), sweeps);
    }
    (singles_of(missed, units.len() + 1, opts.jobs), sweeps)
}

/// What the quick phase measures of its `sweeps`, `singles` of them cut to their first candidate
/// (`quick_singles`), as its first line says.
fn quick_phase_words(opts: &Options, sweeps: usize, singles: usize) -> String {
    let first = realize::quick_words(realize::quick_count(opts.max_candidates));
    let jobs = opts.jobs;
    match singles {
        0 => format!("{first} of each sweep"),
        s if s >= sweeps => format!(
            "the first candidate of each sweep (their first kernels fill half of the {jobs} build jobs)"
        ),
        s => format!(
            "{first} of {} sweep(s) and the first of the other {s} (so the batch fills half of the {jobs} build jobs)",
            sweeps - s
        ),
    }
}

/// Of the sweeps `missed` (each with its share of the model's estimated time), those left with
/// one candidate where `units` first kernels already fill the batch: the second candidates take
/// the rest of half of `jobs`, the largest shares first.
fn singles_of(missed: BTreeMap<TableKey, f64>, units: usize, jobs: usize) -> BTreeSet<TableKey> {
    let room = (jobs / 2).saturating_sub(units);
    let mut by_share: Vec<(TableKey, f64)> = missed.into_iter().collect();
    by_share.sort_by(|a, b| b.1.total_cmp(&a.1));
    by_share.into_iter().skip(room).map(|(k, _)| k).collect()
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

/// Which phases a compose runs (`Options::phases`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phases {
    /// The quick phase, its output written, then the full one over it (the default).
    #[default]
    Both,
    /// The quick phase alone (`--quick`); `fact tune` runs the full one later (`tune`).
    Quick,
}

/// The phase a composed output is of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The tables' winners and, where they miss, the best of a sweep's first
    /// `QUICK_CANDIDATES` candidates: a fast model first.
    Quick,
    /// Every sweep run in full (a report written before the phases were is one).
    #[default]
    Full,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Quick => "quick",
            Phase::Full => "full",
        })
    }
}

/// What one phase took.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseRecord {
    pub phase: Phase,
    /// Wall seconds, its output written (the first phase's from the command's start, loading
    /// the model and planning included).
    pub seconds: f64,
    /// Wall seconds during which a compile ran (nvcc's units, the op library's C++:
    /// `nvcc::Tally`), and the units and kernels it compiled (the build cache's hits aside).
    pub nvcc_s: f64,
    pub units: usize,
    pub kernels: usize,
    /// Distinct problems it swept (a quick phase: their first candidates).
    pub sweeps: usize,
}

impl PhaseRecord {
    fn of(phase: Phase, seconds: f64, tally: nvcc::Tally, r: &Realizations) -> PhaseRecord {
        PhaseRecord {
            phase,
            seconds,
            nvcc_s: tally.seconds,
            units: tally.units,
            kernels: tally.kernels,
            sweeps: r.swept,
        }
    }
}

/// A pattern whose kernel the full phase changed against the output it rewrote.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub id: String,
    pub rule: String,
    pub kernel_before: Option<String>,
    pub kernel_after: Option<String>,
    pub ms_before: Option<f64>,
    pub ms_after: Option<f64>,
}

/// How a compose was asked to realize, as compose.json keeps it: what `fact tune` realizes
/// with again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Asked {
    pub candidates: Option<usize>,
    pub refine: usize,
    pub light_share: f64,
    pub keep_slower: bool,
    pub fuse_siblings: bool,
    /// The patch kind: on unless `--no-patch-conv`. A compose.json written while the kind was
    /// off unless asked holds no field where it was off, and reads back off.
    #[serde(default)]
    pub patch_conv: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default)]
    pub small_rows: SmallRows,
    /// Whether patterns may run a kernel steadier past the sample than its winner (`steady`).
    #[serde(default = "on")]
    pub steady: bool,
}

fn on() -> bool {
    true
}

impl Default for Asked {
    /// What `fact compose` asks for unless told otherwise.
    fn default() -> Asked {
        Asked {
            candidates: None,
            refine: 4,
            light_share: 0.0,
            keep_slower: false,
            fuse_siblings: false,
            patch_conv: true,
            agent: None,
            small_rows: SmallRows::Auto,
            steady: true,
        }
    }
}

impl Options {
    /// What these options ask of a realization, as compose.json keeps it.
    pub fn asked(&self) -> Asked {
        Asked {
            candidates: self.max_candidates,
            refine: self.refine,
            light_share: self.light_share,
            keep_slower: self.keep_slower,
            fuse_siblings: self.matching.fuse_siblings,
            patch_conv: self.matching.patch_conv,
            agent: self.agent.clone(),
            small_rows: self.small_rows,
            steady: self.steady,
        }
    }

    /// These options asking what `a` asked.
    pub fn asking(self, a: &Asked) -> Options {
        Options {
            max_candidates: a.candidates,
            refine: a.refine,
            light_share: a.light_share,
            keep_slower: a.keep_slower,
            matching: registry::MatchOptions {
                fuse_siblings: a.fuse_siblings,
                patch_conv: a.patch_conv,
            },
            agent: a.agent.clone(),
            small_rows: a.small_rows,
            steady: a.steady,
            ..self
        }
    }
}

/// A line that says which phase runs: on stderr wherever progress is shown, a terminal too (the
/// bars are drawn within a phase, never across its start or end).
fn phase_line(opts: &Options, line: std::fmt::Arguments) {
    if opts.progress {
        eprintln!("{line}");
    }
}

/// What every phase of one compose shares: the model's graph and plan, the tools, the GPUs,
/// the tables and the agent.
struct Front<'m> {
    model: &'m Path,
    graph: crate::graph::Graph,
    inputs: Vec<InputShape>,
    format: Format,
    tc: Toolchain,
    cache_mark: Option<nvcc::sccache::Mark>,
    device: Option<Device>,
    gpu: bool,
    plan: plan::Plan,
    order: Vec<String>,
    problems: Vec<Problem>,
    /// The small-rows problem of each pattern that gets one, by pattern id (`SmallRows`).
    small: BTreeMap<String, Problem>,
    pool: Pool,
    gpu_notes: Vec<String>,
    light: BTreeSet<TableKey>,
    singles: BTreeSet<TableKey>,
    /// The sweeps a quick phase runs (the problems the tables miss).
    quick_sweeps: usize,
    tables: Mutex<Tables>,
    steward: Mutex<Steward>,
}

impl<'m> Front<'m> {
    /// Loads the model, matches and plans it, finds the tools, the GPUs and the tables.
    fn load(
        model: &'m Path,
        inputs: &[InputShape],
        opts: &Options,
    ) -> Result<Front<'m>, ComposeError> {
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
        let found = registry::match_patterns_with(&graph, &opts.matching);
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
        let small_rows = opts.small_rows.wanted(&source);
        the_plan.source = source;
        let order: Vec<String> = the_plan.patterns.iter().map(|p| p.id.clone()).collect();
        let problems: Vec<Problem> = order
            .iter()
            .map(|id| found.get(id).expect("plan ids name patterns").problem())
            .collect();
        // Only where a GPU measures them: a small-rows kernel runs only where it measured faster
        // than the pattern's own choice at those rows, which nothing else tells.
        let small = if small_rows && gpu {
            small_rows_problems(&order, &problems)
        } else {
            BTreeMap::new()
        };
        if !small.is_empty() {
            nvcc::progress_line(
                opts.progress,
                format_args!(
                    "small rows: {} GEMM-like patterns get a second kernel, tuned at {SMALL_ROWS} rows, for calls of at most {SMALL_ROWS_UPTO} (--small-rows off: none)",
                    small.len()
                ),
            );
        }
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
        let (singles, quick_sweeps) = quick_singles(&the_plan, &small, opts, &tables);
        Ok(Front {
            model,
            graph,
            inputs,
            format,
            tc,
            cache_mark,
            device,
            gpu,
            plan: the_plan,
            order,
            problems,
            small,
            pool,
            gpu_notes,
            light,
            singles,
            quick_sweeps,
            tables: Mutex::new(tables),
            steward: Mutex::new(steward),
        })
    }

    fn cx<'a>(&'a self, opts: &'a Options, quick: bool) -> RealizeCtx<'a> {
        RealizeCtx {
            opts,
            tc: &self.tc,
            compiler: &NVCC,
            gpu: self.gpu,
            pool: &self.pool,
            light: &self.light,
            quick,
            singles: &self.singles,
        }
    }

    fn shared(&self) -> Shared<'_> {
        Shared {
            tables: &self.tables,
            steward: &self.steward,
        }
    }

    /// The report of a phase's realizations `r` and the outputs they are composed in.
    fn report(
        &self,
        opts: &Options,
        r: &Realizations,
        out: &Outputs,
        phase: Phase,
    ) -> ComposeReport {
        let steward = realize::lock(&self.steward);
        ComposeReport {
            model: self.model.to_path_buf(),
            inputs: self.inputs.clone(),
            precision: opts.precision,
            arch: opts.arch,
            patterns: r.patterns.clone(),
            library: out.library.clone(),
            composed: out.composed.clone(),
            format: self.format,
            torchscript: out.torchscript.clone(),
            gpu: self.gpu,
            device: self.device.clone(),
            gpus: self.pool.gpus().iter().map(|g| g.info.clone()).collect(),
            gpu_notes: self.gpu_notes.clone(),
            compile_failures: r.compile_failures.clone(),
            graph_note: self.graph.note.clone(),
            custom_ops: self.graph.custom_ops(),
            unmatched_gemms: self.plan.unmatched_gemms.clone(),
            order: self.order.clone(),
            agent: steward.name(),
            agent_notes: steward.notes.clone(),
            sccache: self.tc.sccache_report(self.cache_mark.as_ref()),
            seconds: 0.0,
            phase,
            sweeps_left: r.left,
            phases: vec![],
            changes: vec![],
            rewritten: false,
            asked: opts.asked(),
        }
    }
}

/// One phase's realizations, pattern by pattern, after the fallbacks they took.
struct Realizations {
    /// The patterns, a fused one that fell back replaced by the smaller one realized.
    found: crate::kinds::Patterns,
    patterns: Vec<PatternReport>,
    /// The winners substituted, by name.
    winners: BTreeMap<String, Spec>,
    compile_failures: Vec<CompileFailure>,
    /// Distinct problems the phase left to a full one (`Realized::cut`).
    left: usize,
    /// Distinct problems it swept.
    swept: usize,
}

/// Realizes `chains` in one phase (`cx.quick`): the prefetch build of every first candidate
/// (`problems`, the plan's, in its order), then, in a full phase, the first rounds of the GEMM
/// sweeps measured ahead with their sibling rounds compiling meanwhile, and every chain
/// (`realize_all`; `countdown` counts the sweeps down).
fn realize_chains(
    cx: RealizeCtx,
    sh: Shared,
    problems: &[Problem],
    chains: &[Chain],
    countdown: Option<&Countdown>,
) -> Result<schedule::AllRealized, ComposeError> {
    prefetch(
        cx,
        &realize::lock(sh.tables),
        &realize::lock(sh.steward),
        problems,
    )?;
    let ahead = Ahead::default();
    std::thread::scope(|s| {
        let batch = measure_ahead(cx, sh, problems, &ahead, s)?;
        let realized = realize_all(cx, sh, chains, &ahead, countdown);
        if let Some(batch) = batch {
            let compiled = batch.join().expect("the sibling batch's thread panicked");
            if realized.is_ok() {
                compiled?;
            }
        }
        realized
    })
}

/// Every pattern of the plan realized in one phase (`quick` or full).
fn realize_phase(
    front: &Front,
    opts: &Options,
    quick: bool,
    countdown: Option<&Countdown>,
) -> Result<Realizations, ComposeError> {
    // Matched again for each phase: a phase's fallbacks replace patterns (below).
    let mut found = registry::match_patterns_with(&front.graph, &opts.matching);
    // Each pattern's problem, then the smaller ones it falls back to where the larger gets no
    // kernel, or none faster than torch (a fused GEMM: the GEMM alone).
    let mut chains: Vec<Chain> = front
        .order
        .iter()
        .map(|id| Chain::of(found.get(id).expect("plan ids name patterns")))
        .collect();
    // Each small-rows problem after them, a chain of its own: where it gets no kernel faster
    // than torch, torch's ops run those calls.
    chains.extend(front.order.iter().filter_map(|id| {
        let p = front.small.get(id)?;
        Some(Chain::alone(
            format!("{id} at {SMALL_ROWS} rows"),
            p.clone(),
        ))
    }));
    let problems: Vec<Problem> = front
        .problems
        .iter()
        .chain(front.small.values())
        .cloned()
        .collect();
    let cx = front.cx(opts, quick);
    let realized = realize_chains(cx, front.shared(), &problems, &chains, countdown)?;
    let mut done: BTreeMap<ProblemKey, (Realization, Option<Entry>, Option<Entry>)> =
        BTreeMap::new();
    let mut compile_failures = Vec::new();
    {
        let mut steward = realize::lock(&front.steward);
        for (chain, steps) in chains.iter().zip(&realized.steps) {
            // The smaller patterns it fell back to, in turn: the rest stays in torch.
            for (i, (what, instead)) in chain.falls.iter().take(*steps).enumerate() {
                let reason = match &realized.done[&chain.keys[i]].realized.how {
                    Realization::Skipped { reason } => reason.clone(),
                    _ => unreachable!("only a pattern left to torch unfuses"),
                };
                let note = format!(
                    "{}: {what} is left to torch ({reason}); {instead} is realized",
                    chain.id
                );
                if !steward.notes.contains(&note) {
                    steward.notes.push(note);
                }
                let f = found.get_mut(&chain.id).expect("plan ids name patterns");
                let u = f
                    .kind
                    .unfused(&*f.found)
                    .expect("only patterns with a smaller one unfuse");
                f.kind = u.kind;
                f.found = u.found;
            }
        }
    }
    let left = realized.done.values().filter(|s| s.realized.cut).count();
    let swept = realized.swept;
    // `realize_all` has left every winner slower than torch to torch (`finish`).
    for (pk, r) in realized.done {
        let r = r.realized;
        compile_failures.extend(r.failures);
        done.insert(pk, (r.how, r.entry, r.lost.map(|e| *e)));
    }

    let mut patterns = Vec::new();
    let mut winners: BTreeMap<String, Spec> = BTreeMap::new();
    for f in &found.found {
        let problem = f.problem();
        let (how, entry, _) = &done[&ProblemKey::of(&problem)];
        // Where calls may bring more rows than the sample's, a kernel that holds up past them.
        let steady = entry
            .as_ref()
            .filter(|_| opts.steady && front.plan.source.past_sample)
            .and_then(|e| steady::steady(e, &problem));
        // The kernel the pattern runs, its spec and its time at the sample.
        let chosen = match (&steady, entry) {
            (Some(p), _) => Some((p.kernel.clone(), p.spec.clone(), p.choice.kernel_ms)),
            (None, Some(e)) => Some((e.winner.clone(), e.winner_spec.clone(), e.winner_ms)),
            (None, None) => None,
        };
        if let Some((kernel, spec, _)) = &chosen {
            winners.insert(kernel.clone(), spec.clone());
        }
        // The small-rows kernel, where the pattern realized is the one planned (not a smaller
        // one it fell back to) and has a kernel of its own.
        let small_rows = front
            .small
            .get(&f.id)
            .filter(|sp| {
                entry.is_some()
                    && problem.kind().at_rows(&problem, SMALL_ROWS).as_ref() == Some(*sp)
            })
            .and_then(|sp| {
                let (how, entry, lost) = done.get(&ProblemKey::of(sp))?;
                if let Some(e) = entry {
                    winners.insert(e.winner.clone(), e.winner_spec.clone());
                }
                let measured = entry.as_ref().or(lost.as_ref());
                Some(SmallRowsReport {
                    rows: SMALL_ROWS,
                    upto: SMALL_ROWS_UPTO,
                    key: measured.map(|e| e.key.clone()),
                    realization: how.clone(),
                    kernel: entry.as_ref().map(|e| e.winner.clone()),
                    kernel_ms: measured.map(|e| e.winner_ms),
                    torch_ms: measured.and_then(Entry::baseline_ms),
                })
            });
        patterns.push(PatternReport {
            id: f.id.clone(),
            node: f.node(),
            origin: f.origin().to_string(),
            rule: problem.rule_id(),
            kind: Some(problem.pattern_kind()),
            problem,
            key: entry.as_ref().map(|e| e.key.clone()),
            realization: how.clone(),
            kernel: chosen.as_ref().map(|(kernel, _, _)| kernel.clone()),
            kernel_ms: chosen.as_ref().map(|&(_, _, ms)| ms),
            torch_ms: entry.as_ref().and_then(Entry::baseline_ms),
            copies: f.copies(),
            small_rows,
            steady: steady.map(|p| p.choice),
        });
    }
    Ok(Realizations {
        found,
        patterns,
        winners,
        compile_failures,
        left,
        swept,
    })
}

/// Where a phase's composition is: the op library of its winners, the rewritten model and, for a
/// `.pt2` output asked to, both as TorchScript.
#[derive(Clone, Debug, Default)]
struct Outputs {
    library: Option<PathBuf>,
    composed: Option<PathBuf>,
    torchscript: Option<(PathBuf, PathBuf)>,
}

/// Builds the winners' op library and writes the composed model (each written whole); a winner
/// that fails to build here is left to torch, its pattern says why.
fn write_outputs(
    front: &Front,
    opts: &Options,
    r: &mut Realizations,
) -> Result<Outputs, ComposeError> {
    let mut out = Outputs::default();
    if r.winners.is_empty() {
        return Ok(out);
    }
    let specs: Vec<Spec> = r.winners.values().cloned().collect();
    let built = nvcc::build_library(&front.tc, &specs, LIBRARY, &opts.build(&opts.out_dir))?;
    r.compile_failures.extend(built.failures.iter().cloned());
    let in_lib: std::collections::HashSet<String> = built.kernels.iter().map(Spec::name).collect();
    // A winner that failed to build here is not substituted: say so rather than name it.
    for p in r
        .patterns
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
    // Nor a small-rows kernel: the pattern's own runs those calls.
    for s in r.patterns.iter_mut().filter_map(|p| p.small_rows.as_mut()) {
        if let Some(k) = s.kernel.take_if(|k| !in_lib.contains(k)) {
            s.realization = Realization::Skipped {
                reason: format!("the winner {k} failed to compile here"),
            };
            s.torch_ms = None;
        }
    }
    let chosen: Vec<(&crate::kinds::Found, String)> = r
        .found
        .found
        .iter()
        .zip(&r.patterns)
        .filter_map(|(f, p)| {
            let k = p.kernel.as_deref().filter(|k| in_lib.contains(*k))?;
            Some((
                f,
                match p.small_rows.as_ref().and_then(SmallRowsReport::choice) {
                    Some(small) => kernel_by_rows(small, k),
                    None => k.to_string(),
                },
            ))
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
            .map(|(f, k)| (&*f.found, k.as_str()))
            .collect();
        edits.extend(kind.edits(&front.graph, &mine));
    }
    let schemas = registry::op_schemas();
    let model = front.model;
    let composed = match front.format {
        Format::Torchscript => {
            let composed = opts.out_dir.join(COMPOSED);
            torch::rewrite_and_save(model, &composed, &edits, &schemas)?;
            composed
        }
        Format::Pt2 => {
            let composed = opts.out_dir.join(COMPOSED_PT2);
            torch::rewrite_and_write_pt2(model, &composed, &edits, &schemas)?;
            if opts.torchscript_copies {
                let dir = opts.out_dir.join("torchscript");
                std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
                let (original, copy) = (dir.join("original.pt"), dir.join(COMPOSED));
                torch::save_torchscript(model, &original)?;
                torch::rewrite_and_save(model, &copy, &edits, &schemas)?;
                out.torchscript = Some((original, copy));
            }
            composed
        }
    };
    out.library = Some(built.library);
    out.composed = Some(composed);
    Ok(out)
}

/// compose.json, written whole.
fn save_report(opts: &Options, report: &ComposeReport) -> Result<(), ComposeError> {
    let path = opts.out_dir.join(REPORT);
    crate::atomic::write(
        &path,
        serde_json::to_string_pretty(report).expect("report serializes"),
    )
    .map_err(io_err(&path))
}

/// Whether a composition of `after`'s kernels differs from the one `before` describes: some
/// pattern's kernel differs (a pattern left to torch has none).
fn winners_changed(before: &[PatternReport], after: &[PatternReport]) -> bool {
    // The op's kernel operand: a small-rows choice changes it as the pattern's own kernel does.
    let kernels = |ps: &[PatternReport]| -> BTreeMap<String, (Option<String>, Option<String>)> {
        ps.iter()
            .map(|p| {
                let small = p.small_rows.as_ref().and_then(SmallRowsReport::choice);
                (p.id.clone(), (p.kernel.clone(), small.map(str::to_string)))
            })
            .collect()
    };
    kernels(before) != kernels(after)
}

/// The patterns of `after` whose kernel is not `before`'s, with the times of both.
fn changes(before: &[PatternReport], after: &[PatternReport]) -> Vec<Change> {
    after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.id == a.id);
            let kernel_before = b.and_then(|b| b.kernel.clone());
            (kernel_before != a.kernel).then(|| Change {
                id: a.id.clone(),
                rule: a.rule.clone(),
                kernel_before,
                kernel_after: a.kernel.clone(),
                ms_before: b.and_then(|b| b.kernel_ms),
                ms_after: a.kernel_ms,
            })
        })
        .collect()
}

/// Runs discovery, realization and the rewrite, in two phases where a GPU tunes (`Phases`): the
/// quick phase composes and writes the module from the tables' winners and the best of each
/// sweep's first candidates; the full phase then runs every sweep in full, resuming the quick
/// ones, and rewrites the outputs where a winner changed. Without a GPU there is one phase (the
/// full one, or the quick one under `--quick`). Returns the report (also written as
/// compose.json after each phase).
pub fn compose(
    model: &Path,
    inputs: &[InputShape],
    opts: &Options,
) -> Result<ComposeReport, ComposeError> {
    let start = std::time::Instant::now();
    let tally = nvcc::tally();
    let front = Front::load(model, inputs, opts)?;
    let quick_first = front.gpu || opts.phases == Phases::Quick;
    if quick_first {
        phase_line(
            opts,
            format_args!(
                "phase 1 of 2: the tables' winners and {}, composed first",
                quick_phase_words(opts, front.quick_sweeps, front.singles.len())
            ),
        );
    }
    let mut r = realize_phase(&front, opts, quick_first, None)?;
    let out = write_outputs(&front, opts, &mut r)?;
    let phase = if quick_first && r.left > 0 {
        Phase::Quick
    } else {
        Phase::Full
    };
    let mut report = front.report(opts, &r, &out, phase);
    report.seconds = start.elapsed().as_secs_f64();
    report.phases = vec![PhaseRecord::of(
        if quick_first {
            Phase::Quick
        } else {
            Phase::Full
        },
        report.seconds,
        nvcc::tally().since(tally),
        &r,
    )];
    save_report(opts, &report)?;
    if !quick_first {
        return Ok(report);
    }
    let written = report
        .composed
        .as_ref()
        .map_or("nothing substituted".to_string(), |c| {
            format!("{} written", c.display())
        });
    if r.left == 0 {
        phase_line(
            opts,
            format_args!(
                "phase 1 of 2 done in {:.0} s ({written}): every pattern from the tables, no sweep left for phase 2",
                report.seconds
            ),
        );
        return Ok(report);
    }
    if opts.phases == Phases::Quick || !front.gpu {
        phase_line(
            opts,
            format_args!(
                "phase 1 of 2 done in {:.0} s ({written}); --quick: {} problem(s) left to the full phase, `fact tune {}` runs it",
                report.seconds,
                r.left,
                opts.out_dir.display()
            ),
        );
        return Ok(report);
    }
    phase_line(
        opts,
        format_args!("phase 1 of 2 done in {:.0} s ({written})", report.seconds),
    );
    full_phase(&front, opts, report, start)
}

/// `fact tune DIR`: the full phase over an output a quick compose wrote (`before`, its
/// compose.json), as `compose`'s second phase: every sweep run in full, resuming the quick ones,
/// and the outputs rewritten where a winner changed. `opts` are the ones `before` was composed
/// with (`Options::asking`), its folder the output folder. Without a GPU that tunes the arch,
/// as compose without one, the sweeps' kernels are compiled and left for a GPU.
pub fn tune(before: ComposeReport, opts: &Options) -> Result<ComposeReport, ComposeError> {
    let start = std::time::Instant::now();
    let model = before.model.clone();
    let front = Front::load(&model, &before.inputs, opts)?;
    if !front.gpu {
        let here = front
            .device
            .as_ref()
            .map_or("no CUDA device".to_string(), |d| {
                format!("{} runs no {} kernels", d.label(), opts.arch)
            });
        phase_line(
            opts,
            format_args!(
                "{here}: the sweeps' kernels are compiled, not tuned; run fact tune on {} to tune them",
                opts.arch.gpus()
            ),
        );
    }
    full_phase(&front, opts, before, start)
}

/// The full phase after `before` (the quick phase's report, or compose.json of a quick compose
/// for `fact tune`): every pattern realized in full, the outputs rewritten only where a winner
/// changed (else left as they are, byte for byte), compose.json saying what changed and what each
/// phase took. Its countdown counts the sweeps left (`realize::sweeps_left`); what else the quick
/// phase left (winners measured on another GPU, timed here) takes seconds.
fn full_phase(
    front: &Front,
    opts: &Options,
    before: ComposeReport,
    start: std::time::Instant,
) -> Result<ComposeReport, ComposeError> {
    let left = {
        let tables = realize::lock(&front.tables);
        realize::sweeps_left(front.cx(opts, false), &tables, &front.problems)
    };
    phase_line(
        opts,
        format_args!("phase 2 of 2: the full sweeps, {left} sweep(s) left"),
    );
    let tally = nvcc::tally();
    let began = std::time::Instant::now();
    let countdown = Countdown::new(left, opts.progress);
    let mut r = realize_phase(front, opts, false, Some(&countdown))?;
    let rewritten = winners_changed(&before.patterns, &r.patterns);
    let out = if rewritten {
        write_outputs(front, opts, &mut r)?
    } else {
        Outputs {
            library: before.library.clone(),
            composed: before.composed.clone(),
            torchscript: before.torchscript.clone(),
        }
    };
    let changes = changes(&before.patterns, &r.patterns);
    let mut report = front.report(opts, &r, &out, Phase::Full);
    report.sweeps_left = 0;
    report.seconds = start.elapsed().as_secs_f64();
    report.phases = before.phases.clone();
    report.phases.push(PhaseRecord::of(
        Phase::Full,
        began.elapsed().as_secs_f64(),
        nvcc::tally().since(tally),
        &r,
    ));
    report.changes = changes;
    report.rewritten = rewritten;
    save_report(opts, &report)?;
    let what = if rewritten {
        format!(
            "{} winner(s) changed: {} rewritten",
            report.changes.len(),
            [report.composed.as_ref(), report.library.as_ref()]
                .into_iter()
                .flatten()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        )
    } else {
        "no winner changed: the composed output stands as phase 1 wrote it".to_string()
    };
    phase_line(
        opts,
        format_args!(
            "phase 2 of 2 done in {:.0} s: {what}",
            began.elapsed().as_secs_f64()
        ),
    );
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
        phases: Phases::Both,
        small_rows: SmallRows::Auto,
        steady: true,
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

    /// The small-rows problems are units of the quick batch too, and the first cut to one
    /// candidate: they have no share of the plan's time.
    #[test]
    fn small_rows_problems_count_in_the_quick_batch_and_are_cut_first() {
        let g = crate::graph::Graph::parse(
            "graph(%x: f32[8192,4096], %w: f32[4096,4096]):
               %none = prim::Constant[None]()
               %y0 = aten::linear(%x, %w, %none) : f32[8192,4096]
               %y1 = aten::linear(%y0, %w, %none) : f32[8192,4096]
               return (%y1)",
        )
        .unwrap();
        let found = registry::match_patterns(&g);
        let plan_opts = PlanOptions {
            arch: Arch::Sm90,
            precision: Precision::Tf32,
            assumed_speedup: 1.05,
        };
        let the_plan = plan::plan(&g, &found, &plan_opts, None, &mut Steward::builtin());
        let order: Vec<String> = the_plan.patterns.iter().map(|p| p.id.clone()).collect();
        let problems: Vec<Problem> = the_plan
            .patterns
            .iter()
            .map(|p| p.problem.clone())
            .collect();
        let small = small_rows_problems(&order, &problems);
        assert_eq!(small.len(), 2, "both projections have 8192 rows");
        let dir = tempfile::tempdir().unwrap();
        let tables = Tables::load(
            &dir.path().join("user.json"),
            &dir.path().join("shipped.json"),
        )
        .unwrap();
        let mut opts = test_options();
        opts.max_candidates = None;
        let key_of = |p: &Problem| TableKey::of(p, p.math(opts.precision).unwrap(), opts.arch);
        // One distinct problem at each size: with the torch ops, 3 units of half of 8 jobs.
        opts.jobs = 8;
        let (singles, sweeps) = quick_singles(&the_plan, &small, &opts, &tables);
        assert_eq!(sweeps, 2);
        let small_key = key_of(small.values().next().unwrap());
        assert_eq!(singles, BTreeSet::from([small_key]));
        // Without them the plan's sweep alone fills the batch's room, and keeps both candidates.
        let (singles, sweeps) = quick_singles(&the_plan, &BTreeMap::new(), &opts, &tables);
        assert_eq!((singles.len(), sweeps), (0, 1));
        // Where the first kernels fill half of the jobs, every sweep measures one.
        opts.jobs = 6;
        let (singles, _) = quick_singles(&the_plan, &small, &opts, &tables);
        assert_eq!(singles.len(), 2);
    }

    /// A compiler that compiles nothing: it says which kernels each call was asked for, and
    /// writes each library as its kernels' names, one a line, for `Scripted` to read back.
    #[derive(Default)]
    struct Recorder {
        /// (library name, or "objects" for a batch into the cache; the kernels asked for).
        calls: Mutex<Vec<(String, Vec<String>)>>,
        /// Torch op objects asked for (beside a batch, so apart from `calls`' order).
        op_objects: std::sync::atomic::AtomicUsize,
        /// Kernels a batch into the cache fails to compile (each reported as a failure).
        failing: Vec<String>,
    }

    impl Recorder {
        fn take(&self) -> Vec<(String, Vec<String>)> {
            std::mem::take(&mut *realize::lock(&self.calls))
        }
    }

    impl Compiler for Recorder {
        fn library(
            &self,
            _tc: &Toolchain,
            specs: &[Spec],
            name: &str,
            opts: &nvcc::BuildOptions,
        ) -> Result<nvcc::Built, BuildError> {
            let names: Vec<String> = specs.iter().map(Spec::name).collect();
            let library = opts.out_dir.join(name);
            std::fs::create_dir_all(&opts.out_dir).unwrap();
            std::fs::write(&library, names.join("\n")).unwrap();
            realize::lock(&self.calls).push((name.to_string(), names));
            Ok(nvcc::Built {
                library,
                kernels: specs.to_vec(),
                failures: vec![],
                compiled: specs.len(),
                cached: 0,
                seconds: 0.0,
            })
        }
        fn objects(
            &self,
            _tc: &Toolchain,
            specs: &[Spec],
            _opts: &nvcc::BuildOptions,
        ) -> Result<nvcc::Objects, BuildError> {
            realize::lock(&self.calls)
                .push(("objects".into(), specs.iter().map(Spec::name).collect()));
            let (bad, good): (Vec<Spec>, Vec<Spec>) = specs
                .iter()
                .cloned()
                .partition(|s| self.failing.contains(&s.kernel_name()));
            Ok(nvcc::Objects {
                compiled: good.len(),
                kernels: good,
                objects: vec![],
                failures: bad
                    .iter()
                    .map(|s| nvcc::CompileFailure {
                        kernel: s.kernel_name(),
                        source: PathBuf::new(),
                        command: String::new(),
                        log: "error: scripted".into(),
                    })
                    .collect(),
                cached: 0,
            })
        }
        fn op_object(
            &self,
            _tc: &Toolchain,
            _arch: Arch,
            _opts: &nvcc::BuildOptions,
        ) -> Result<(), BuildError> {
            self.op_objects
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
    }

    /// A GPU whose kernels take the time `ms` gives their name, torch 1 ms: a worker judges the
    /// library `Recorder` wrote, by name. It says every kernel it timed.
    struct Scripted {
        ms: fn(&str) -> f64,
        timed: Mutex<Vec<String>>,
    }

    struct ByName<'a> {
        gpu: &'a Scripted,
        names: Vec<String>,
    }

    impl tune::Bench for ByName<'_> {
        fn verify(&mut self, _i: usize) -> Result<f64, tune::BenchError> {
            Ok(0.0)
        }
        fn time(&mut self, i: usize) -> Result<Vec<f64>, tune::BenchError> {
            realize::lock(&self.gpu.timed).push(self.names[i].clone());
            Ok(vec![(self.gpu.ms)(&self.names[i]); 3])
        }
        fn time_baseline(&mut self) -> Result<Vec<f64>, tune::BenchError> {
            Ok(vec![1.0; 3])
        }
    }

    impl worker::Spawn for &'static Scripted {
        fn run(
            &self,
            _gpu: &Gpu,
            req: &worker::Request,
            on_event: &mut dyn FnMut(worker::Event),
        ) -> Result<(), String> {
            let text = std::fs::read_to_string(&req.library).map_err(|e| e.to_string())?;
            let mut bench = ByName {
                gpu: self,
                names: text.lines().map(str::to_string).collect(),
            };
            worker::judge_all(&mut bench, req, on_event);
            Ok(())
        }
    }

    /// Fake problems' kernels: the later a first-round kernel, the faster (the estimate's order
    /// is wrong, so a full sweep finds a better one than a quick one), and a later round's
    /// kernel faster than the one it refines.
    fn ms_by_name(name: &str) -> f64 {
        let (base, again) = match name.strip_suffix("_r") {
            Some(b) => (b, 0.9),
            None => (name, 1.0),
        };
        let i: f64 = base.rsplit("_k").next().unwrap().parse().unwrap();
        (0.9 - 0.1 * i) * again
    }

    /// What a phase test realizes with: options into `dir`, the tables there, one fake H100.
    struct Bed {
        opts: Options,
        tc: Toolchain,
        pool: Pool,
        gpu: &'static Scripted,
        light: BTreeSet<TableKey>,
        singles: BTreeSet<TableKey>,
        problems: Vec<Problem>,
        chains: Vec<Chain>,
    }

    impl Bed {
        fn new(dir: &Path, flops: &[u64]) -> Bed {
            let gpu: &'static Scripted = Box::leak(Box::new(Scripted {
                ms: ms_by_name,
                timed: Mutex::new(vec![]),
            }));
            let mut opts = test_options();
            opts.out_dir = dir.join("out");
            opts.user_table = dir.join("user.json");
            opts.shipped_table = dir.join("none.json");
            opts.cache_dir = dir.join("cache");
            let problems: Vec<Problem> = flops
                .iter()
                .map(|&f| crate::kinds::fake::problem(f))
                .collect();
            let chains = problems
                .iter()
                .enumerate()
                .map(|(i, p)| Chain {
                    id: format!("p{i}"),
                    problems: vec![p.clone()],
                    keys: vec![ProblemKey::of(p)],
                    falls: vec![],
                })
                .collect();
            Bed {
                opts,
                tc: Toolchain::for_tests(),
                pool: Pool::new(
                    vec![crate::tune::fake::gpu(0, "H100", (9, 0))],
                    Box::new(gpu),
                ),
                gpu,
                light: BTreeSet::new(),
                singles: BTreeSet::new(),
                problems,
                chains,
            }
        }

        /// One phase over the tables on disk, compiled by `compiler`.
        fn phase(&self, quick: bool, compiler: &Recorder) -> schedule::AllRealized {
            let cx = RealizeCtx {
                opts: &self.opts,
                tc: &self.tc,
                compiler,
                gpu: true,
                pool: &self.pool,
                light: &self.light,
                quick,
                singles: &self.singles,
            };
            let tables =
                Mutex::new(Tables::load(&self.opts.user_table, &self.opts.shipped_table).unwrap());
            let steward = Mutex::new(Steward::builtin());
            let sh = Shared {
                tables: &tables,
                steward: &steward,
            };
            realize_chains(cx, sh, &self.problems, &self.chains, None).unwrap()
        }

        fn user_table(&self) -> crate::table::Table {
            crate::table::Table::load(&self.opts.user_table).unwrap()
        }

        fn timed(&self) -> Vec<String> {
            std::mem::take(&mut *realize::lock(&self.gpu.timed))
        }
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    /// The spec names of the winners a phase's realizations took, sorted.
    fn winner_specs(phase: &schedule::AllRealized) -> Vec<String> {
        sorted(
            phase
                .done
                .values()
                .map(|s| s.realized.entry.as_ref().unwrap().winner_spec.name())
                .collect(),
        )
    }

    fn kernels(flops: &[u64], first: std::ops::Range<usize>) -> Vec<String> {
        sorted(
            flops
                .iter()
                .flat_map(|&f| first.clone().map(move |i| crate::kinds::fake::kernel(f, i)))
                .collect(),
        )
    }

    /// The quick phase compiles the first candidates of every sweep in the one prefetch batch and
    /// nothing else, measures them and leaves them in the user table as checkpoints; the full
    /// phase compiles the rest of each first round in its prefetch batch and the later rounds in
    /// the sibling batch, measures every kernel the quick phase did not, and records each sweep
    /// finished, with a faster winner.
    #[test]
    fn the_quick_phase_measures_first_candidates_and_the_full_phase_resumes_them() {
        let dir = tempfile::tempdir().unwrap();
        let flops = [1000u64, 2000];
        // Two layers of the first problem: one sweep.
        let bed = Bed::new(dir.path(), &[1000, 2000, 1000]);

        let compiler = Recorder::default();
        let quick = bed.phase(true, &compiler);
        let calls = compiler.take();
        let first = kernels(&flops, 0..QUICK_CANDIDATES);
        assert_eq!(calls[0].0, "objects", "the prefetch batch comes first");
        assert_eq!(sorted(calls[0].1.clone()), first);
        // Then each sweep's library, linked ahead of the measurements (`link_ahead`).
        let mut ahead: Vec<Vec<String>> = calls[1..3]
            .iter()
            .map(|(name, k)| {
                assert_eq!(name, "libsweep.so", "{calls:?}");
                sorted(k.clone())
            })
            .collect();
        ahead.sort();
        assert_eq!(
            ahead,
            flops.map(|f| kernels(&[f], 0..QUICK_CANDIDATES)).to_vec()
        );
        assert!(
            calls
                .iter()
                .all(|(_, k)| k.iter().all(|k| first.contains(k))),
            "the quick phase compiles the first candidates alone: {calls:?}"
        );
        assert_eq!(sorted(bed.timed()), first, "each measured once");
        assert_eq!(quick.done.len(), 2, "each distinct problem once");
        for slot in quick.done.values() {
            let r = &slot.realized;
            assert!(r.cut, "a quick sweep leaves its sweep to the full phase");
            assert!(
                matches!(
                    r.how,
                    Realization::Tuned {
                        candidates: 2,
                        failed: 0,
                        quick: true
                    }
                ),
                "{:?}",
                r.how
            );
            let e = r.entry.as_ref().unwrap();
            assert!(e.winner.ends_with("_k1"), "{}", e.winner);
        }
        let table = bed.user_table();
        assert_eq!(table.entries.len(), 2);
        for e in &table.entries {
            assert!(e.runs.iter().all(|r| r.partial), "recorded as checkpoints");
            assert_eq!(e.runs.iter().map(|r| r.candidates.len()).sum::<usize>(), 2);
            assert!(e.unfinished_at(|p| p.device.name == "H100").is_some());
        }

        let compiler = Recorder::default();
        let full = bed.phase(false, &compiler);
        let calls = compiler.take();
        let rest = kernels(&flops, QUICK_CANDIDATES..crate::kinds::fake::CANDIDATES);
        assert_eq!(calls[0].0, "objects");
        assert_eq!(
            sorted(calls[0].1.clone()),
            rest,
            "the rest of both first rounds in one prefetch batch"
        );
        // The second round of each (the two fastest again), in one batch behind the others.
        let again: Vec<String> = sorted(
            flops
                .iter()
                .flat_map(|&f| [4, 5].map(|i| format!("{}_r", crate::kinds::fake::kernel(f, i))))
                .collect(),
        );
        let batches: Vec<&Vec<String>> = calls
            .iter()
            .filter(|(what, _)| what == "objects")
            .map(|(_, k)| k)
            .collect();
        assert_eq!(batches.len(), 2, "{calls:?}");
        assert_eq!(sorted(batches[1].clone()), again);
        let mut all = rest.clone();
        all.extend(again.iter().cloned());
        assert_eq!(
            sorted(bed.timed()),
            sorted(all),
            "the quick phase's kernels are not measured again"
        );
        for slot in full.done.values() {
            let r = &slot.realized;
            assert!(!r.cut);
            assert!(
                matches!(
                    r.how,
                    Realization::Tuned {
                        candidates: 8,
                        quick: false,
                        ..
                    }
                ),
                "{:?}",
                r.how
            );
            assert!(r.entry.as_ref().unwrap().winner.ends_with("_k5_r"));
        }
        let table = bed.user_table();
        for e in &table.entries {
            assert_eq!(e.runs.len(), 1, "the record replaced the checkpoint");
            assert!(!e.runs[0].partial);
            assert_eq!(e.runs[0].candidates.len(), 8);
            assert!(e.unfinished_at(|_| true).is_none());
        }

        // Another full phase: every problem a hit, nothing measured; the winners alone compiled
        // (for the library), no sweep's.
        let compiler = Recorder::default();
        let again = bed.phase(false, &compiler);
        let calls = compiler.take();
        assert!(calls.iter().all(|(what, _)| what != "libsweep.so"));
        let compiled: Vec<String> = calls
            .iter()
            .filter(|(what, _)| what == "objects")
            .flat_map(|(_, k)| k.clone())
            .collect();
        assert_eq!(
            sorted(compiled),
            sorted(
                flops
                    .iter()
                    .map(|&f| format!("{}_r", crate::kinds::fake::kernel(f, 5)))
                    .collect()
            )
        );
        assert!(bed.timed().is_empty());
        assert!(again
            .done
            .values()
            .all(|s| matches!(s.realized.how, Realization::Hit { .. }) && !s.realized.cut));
    }

    /// A sweep whose first candidate failed in the prefetch batch is not linked ahead (it would
    /// compile that kernel again on every sweep's critical path): it builds and reports it itself;
    /// the other sweep's library is linked ahead.
    #[test]
    fn a_quick_sweep_with_a_kernel_that_failed_in_the_batch_is_not_linked_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let bed = Bed::new(dir.path(), &[1000, 2000]);
        let compiler = Recorder {
            failing: vec![crate::kinds::fake::kernel(1000, 0)],
            ..Recorder::default()
        };
        bed.phase(true, &compiler);
        let calls = compiler.take();
        assert_eq!(calls[0].0, "objects", "{calls:?}");
        assert_eq!(calls[1].0, "libsweep.so", "{calls:?}");
        assert_eq!(
            sorted(calls[1].1.clone()),
            kernels(&[2000], 0..QUICK_CANDIDATES),
            "only the sweep whose kernels all compiled is linked ahead: {calls:?}"
        );
        assert_ne!(calls[2].1, calls[1].1, "{calls:?}");
    }

    /// A quick sweep cut to one candidate (`quick_singles`) compiles and measures its first
    /// alone; the full phase resumes it as it resumes any other, with the rest of its first round.
    #[test]
    fn a_single_quick_sweep_measures_its_first_candidate_and_the_full_phase_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut bed = Bed::new(dir.path(), &[1000, 2000]);
        let p = &bed.problems[1];
        let math = p.math(bed.opts.precision).unwrap();
        bed.singles.insert(TableKey::of(p, math, bed.opts.arch));

        let compiler = Recorder::default();
        let quick = bed.phase(true, &compiler);
        let calls = compiler.take();
        let mut first = kernels(&[1000], 0..QUICK_CANDIDATES);
        first.extend(kernels(&[2000], 0..1));
        assert_eq!(sorted(calls[0].1.clone()), sorted(first.clone()));
        assert_eq!(sorted(bed.timed()), sorted(first));
        let counts: BTreeSet<usize> = quick
            .done
            .values()
            .map(|s| match s.realized.how {
                Realization::Tuned { candidates, .. } => candidates,
                _ => panic!("{:?}", s.realized.how),
            })
            .collect();
        assert_eq!(counts, BTreeSet::from([1, QUICK_CANDIDATES]));

        let compiler = Recorder::default();
        let full = bed.phase(false, &compiler);
        let calls = compiler.take();
        let mut rest = kernels(&[1000], QUICK_CANDIDATES..crate::kinds::fake::CANDIDATES);
        rest.extend(kernels(&[2000], 1..crate::kinds::fake::CANDIDATES));
        assert_eq!(sorted(calls[0].1.clone()), sorted(rest));
        for slot in full.done.values() {
            assert!(matches!(
                slot.realized.how,
                Realization::Tuned {
                    candidates: 8,
                    quick: false,
                    ..
                }
            ));
        }
    }

    /// A fused pattern's kernels slower than torch: fake problem 3000's (torch takes 1 ms).
    fn fused_loses(name: &str) -> f64 {
        if name.starts_with("f3000_") {
            2.0
        } else {
            ms_by_name(name)
        }
    }

    /// Where a fused pattern loses to torch in the quick phase, the smaller pattern it falls back
    /// to is not realized when no table holds it exactly (its kernels would compile alone after
    /// the prefetch): it is left to torch, cut, and the full phase sweeps it. A problem some pattern
    /// realizes as its own is swept as ever.
    #[test]
    fn a_quick_phase_leaves_an_untabled_fallback_to_the_full_phase() {
        let dir = tempfile::tempdir().unwrap();
        let mut bed = Bed::new(dir.path(), &[3000, 1000]);
        let gpu: &'static Scripted = Box::leak(Box::new(Scripted {
            ms: fused_loses,
            timed: Mutex::new(vec![]),
        }));
        bed.gpu = gpu;
        bed.pool = Pool::new(
            vec![crate::tune::fake::gpu(0, "H100", (9, 0))],
            Box::new(gpu),
        );
        let (fused, alone, own) = (
            crate::kinds::fake::problem(3000),
            crate::kinds::fake::problem(4000),
            crate::kinds::fake::problem(1000),
        );
        // p0 falls back to 4000, which no pattern has as its own; p1 (1000) is its own.
        bed.chains = vec![
            Chain {
                id: "p0".into(),
                keys: vec![ProblemKey::of(&fused), ProblemKey::of(&alone)],
                problems: vec![fused.clone(), alone.clone()],
                falls: vec![("the fused epilogue", "the GEMM alone")],
            },
            Chain::alone("p1".into(), own.clone()),
        ];

        let compiler = Recorder::default();
        let quick = bed.phase(true, &compiler);
        let built: Vec<String> = compiler.take().into_iter().flat_map(|c| c.1).collect();
        assert!(
            !built.iter().any(|k| k.starts_with("f4000_")),
            "the fallback compiled in the quick phase: {built:?}"
        );
        assert_eq!(quick.steps, [1, 0]);
        let slot = &quick.done[&ProblemKey::of(&alone)];
        assert!(slot.skipped && slot.realized.cut, "{:?}", slot.realized.how);
        assert!(matches!(
            quick.done[&ProblemKey::of(&own)].realized.how,
            Realization::Tuned { .. }
        ));

        let compiler = Recorder::default();
        let full = bed.phase(false, &compiler);
        assert_eq!(full.steps, [1, 0]);
        assert!(matches!(
            full.done[&ProblemKey::of(&alone)].realized.how,
            Realization::Tuned { quick: false, .. }
        ));
    }

    /// The second candidates fill what the first kernels leave of half the build jobs, the
    /// largest shares first; where the first kernels fill it, every sweep measures one.
    #[test]
    fn quick_second_candidates_fill_half_the_jobs_the_largest_shares_first() {
        let key = |i: u64| {
            let p = crate::kinds::fake::problem(i);
            TableKey::of(&p, MathType::Bf16, Arch::Sm90)
        };
        let missed: BTreeMap<TableKey, f64> = [(key(1), 0.1), (key(2), 0.4), (key(3), 0.2)]
            .into_iter()
            .collect();
        // Half of 16 jobs is 8 units; 6 first kernels and the torch ops leave room for two.
        assert_eq!(singles_of(missed.clone(), 6, 16), BTreeSet::from([key(1)]));
        assert_eq!(singles_of(missed.clone(), 9, 16).len(), 3);
        assert!(singles_of(missed, 4, 64).is_empty());
        let mut opts = test_options();
        opts.jobs = 16;
        assert_eq!(
            quick_phase_words(&opts, 3, 0),
            "the first 2 candidates of each sweep"
        );
        assert_eq!(
            quick_phase_words(&opts, 3, 1),
            "the first 2 candidates of 2 sweep(s) and the first of the other 1 (so the batch fills half of the 16 build jobs)"
        );
        assert_eq!(
            quick_phase_words(&opts, 3, 3),
            "the first candidate of each sweep (their first kernels fill half of the 16 build jobs)"
        );
    }

    /// A quick compose over a table a quick compose left takes its checkpoints as they stand:
    /// nothing measured, their winners alone compiled (for the library), each still a sweep left
    /// for the full phase.
    #[test]
    fn a_second_quick_phase_takes_the_checkpoints_as_they_stand() {
        let dir = tempfile::tempdir().unwrap();
        let bed = Bed::new(dir.path(), &[1000, 2000]);
        bed.phase(true, &Recorder::default());
        bed.timed();
        let compiler = Recorder::default();
        let again = bed.phase(true, &compiler);
        let calls = compiler.take();
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(
            sorted(calls[0].1.clone()),
            kernels(&[1000, 2000], 1..2),
            "the checkpoints' winners, compiled together for the library"
        );
        assert!(bed.timed().is_empty());
        for slot in again.done.values() {
            assert!(slot.realized.cut);
            assert!(matches!(slot.realized.how, Realization::Hit { .. }));
            assert!(slot
                .realized
                .entry
                .as_ref()
                .unwrap()
                .winner
                .ends_with("_k1"));
        }
    }

    /// A quick phase over finished sweeps measured on this GPU times nothing, and compiles the
    /// winners it takes in one batch, with the library's torch op object beside it: the library
    /// build after it finds everything compiled.
    #[test]
    fn a_quick_phase_over_table_hits_compiles_their_winners_and_the_torch_ops_first() {
        let dir = tempfile::tempdir().unwrap();
        let bed = Bed::new(dir.path(), &[1000, 2000]);
        bed.phase(true, &Recorder::default());
        let full = bed.phase(false, &Recorder::default());
        bed.timed();
        let winners = winner_specs(&full);
        let compiler = Recorder::default();
        let again = bed.phase(true, &compiler);
        let calls = compiler.take();
        assert_eq!(calls.len(), 1, "one batch: {calls:?}");
        assert_eq!(calls[0].0, "objects");
        assert_eq!(sorted(calls[0].1.clone()), winners);
        assert_eq!(
            compiler
                .op_objects
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert!(
            bed.timed().is_empty(),
            "a finished sweep is not timed again"
        );
        for slot in again.done.values() {
            assert!(!slot.realized.cut);
            assert!(matches!(slot.realized.how, Realization::Hit { .. }));
        }
    }

    /// The user table's runs as measured on `device` with CUTLASS `cutlass` (another GPU's table).
    fn measured_elsewhere(bed: &Bed, device: &str, cutlass: &str) {
        let mut table = bed.user_table();
        for e in &mut table.entries {
            for r in &mut e.runs {
                r.provenance.device.name = device.into();
                r.provenance.cutlass = cutlass.into();
            }
        }
        table.save(&bed.opts.user_table).unwrap();
    }

    /// A quick phase over winners measured on another GPU model with this CUTLASS takes them as
    /// they stand, timing nothing here, and leaves each to the full phase, which times the
    /// leading kernels here before use.
    #[test]
    fn a_quick_phase_takes_another_gpus_winners_as_they_stand_and_the_full_phase_times_them() {
        let dir = tempfile::tempdir().unwrap();
        let bed = Bed::new(dir.path(), &[1000, 2000]);
        let full = bed.phase(false, &Recorder::default());
        bed.timed();
        let winners = winner_specs(&full);
        let cutlass = bed.tc.cutlass_version();
        measured_elsewhere(&bed, "H200", &cutlass);

        let compiler = Recorder::default();
        let quick = bed.phase(true, &compiler);
        let calls = compiler.take();
        assert_eq!(calls.len(), 1, "one batch: {calls:?}");
        assert_eq!(sorted(calls[0].1.clone()), winners, "the winners alone");
        assert!(bed.timed().is_empty(), "nothing timed in the quick phase");
        for slot in quick.done.values() {
            assert!(slot.realized.cut, "left to the full phase");
            match &slot.realized.how {
                Realization::Hit {
                    measured_on: Some(on),
                    reverified: false,
                    ..
                } => assert!(on.starts_with("H200"), "{on}"),
                other => panic!("{other:?}"),
            }
        }

        let again = bed.phase(false, &Recorder::default());
        assert!(!bed.timed().is_empty(), "the full phase times them here");
        for slot in again.done.values() {
            assert!(!slot.realized.cut);
            assert!(matches!(
                slot.realized.how,
                Realization::Hit {
                    reverified: true,
                    ..
                }
            ));
        }
    }

    /// A table hit whose runs on this GPU model rank another kernel first than the entry's
    /// winner over every GPU's runs: the prefetch batch compiles this model's winner, the one the
    /// realization takes, so the library build after it finds every kernel compiled.
    #[test]
    fn the_prefetch_compiles_the_winner_this_gpu_model_takes() {
        let dir = tempfile::tempdir().unwrap();
        let bed = Bed::new(dir.path(), &[1000, 2000]);
        bed.phase(false, &Recorder::default());
        bed.timed();
        // An H200 run of the same kernels, where the H100's winner is slow and its runner-up
        // fast, so the entry over both runs crowns the runner-up.
        let mut table = bed.user_table();
        let mut h100_winners = vec![];
        for e in &mut table.entries {
            let h100 = e.runs[0].clone();
            let mut timed: Vec<(f64, String)> = h100
                .candidates
                .iter()
                .filter_map(|c| Some((c.outcome.median_ms()?, c.kernel.clone())))
                .collect();
            timed.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (winner, second) = (timed[0].1.clone(), timed[1].1.clone());
            let mut h200 = h100.clone();
            h200.provenance.device.name = "H200".into();
            h200.provenance.device.uuid = Some("GPU-H200".into());
            for c in &mut h200.candidates {
                if let crate::tune::Outcome::Ok { timing, .. } = &mut c.outcome {
                    if c.kernel == winner {
                        timing.median_ms *= 2.0;
                    } else if c.kernel == second {
                        timing.median_ms *= 0.5;
                    }
                }
            }
            e.runs.push(h200);
            *e = crate::table::Entry::from_runs(e.key.clone(), e.problem.clone(), e.runs.clone())
                .unwrap();
            assert_eq!(
                e.winner, second,
                "the entry over both runs crowns the runner-up"
            );
            h100_winners.push(winner);
        }
        table.save(&bed.opts.user_table).unwrap();

        let compiler = Recorder::default();
        let quick = bed.phase(true, &compiler);
        let calls = compiler.take();
        assert_eq!(calls.len(), 1, "{calls:?}");
        let taken = winner_specs(&quick);
        assert_eq!(sorted(calls[0].1.clone()), taken);
        let kernels: Vec<String> = sorted(
            quick
                .done
                .values()
                .map(|s| s.realized.entry.as_ref().unwrap().winner.clone())
                .collect(),
        );
        assert_eq!(
            kernels,
            sorted(h100_winners),
            "this GPU model's own winners"
        );
        assert!(bed.timed().is_empty());
    }

    /// A winner measured with another CUTLASS is no kernel this compose has checked: the quick
    /// phase times its leading kernels here as a full one would.
    #[test]
    fn a_quick_phase_times_winners_of_another_cutlass_here() {
        let dir = tempfile::tempdir().unwrap();
        let bed = Bed::new(dir.path(), &[1000]);
        bed.phase(false, &Recorder::default());
        bed.timed();
        measured_elsewhere(&bed, "H100", "0.0.1");
        let quick = bed.phase(true, &Recorder::default());
        assert!(!bed.timed().is_empty());
        for slot in quick.done.values() {
            assert!(!slot.realized.cut);
            assert!(matches!(
                slot.realized.how,
                Realization::Hit {
                    reverified: true,
                    ..
                }
            ));
        }
    }

    fn pattern(id: &str, kernel: Option<&str>, ms: Option<f64>) -> PatternReport {
        let problem = crate::kinds::fake::problem(1000);
        PatternReport {
            id: id.into(),
            node: 0,
            origin: "test".into(),
            rule: problem.rule_id(),
            kind: None,
            problem,
            key: None,
            realization: Realization::Skipped {
                reason: "test".into(),
            },
            kernel: kernel.map(str::to_string),
            kernel_ms: ms,
            torch_ms: None,
            copies: vec![],
            small_rows: None,
            steady: None,
        }
    }

    fn gemm_problem(m: i64, batch: i64) -> Problem {
        crate::kinds::gemm::GemmProblem {
            m,
            n: 768,
            k: 3072,
            layout: crate::kinds::gemm::GemmLayout::Rcr,
            dtype: crate::types::DType::Bf16,
            bias: true,
            batch,
            epilogue: None,
            padded_from: None,
        }
        .into()
    }

    #[test]
    fn gemm_like_patterns_of_many_rows_get_a_problem_at_few_rows() {
        let order: Vec<String> = ["g1", "g2", "bmm", "ln"].map(String::from).to_vec();
        let problems = vec![
            gemm_problem(8192, 1),
            gemm_problem(SMALL_ROWS_FROM - 8, 1),
            gemm_problem(8192, 12),
            crate::kinds::fake::problem(1000),
        ];
        let small = small_rows_problems(&order, &problems);
        // Only the one GEMM tuned at many rows; a batched GEMM's rows are not the batch's alone,
        // and the fake kind has no rows.
        assert_eq!(small.keys().collect::<Vec<_>>(), ["g1"]);
        assert_eq!(small["g1"], gemm_problem(SMALL_ROWS, 1));
    }

    #[test]
    fn small_rows_are_asked_for_dynamic_programs_unless_told() {
        let dynamic = torch::FrontEnd {
            dynamic: vec!["x dim 0: batch in [1, 64]".into()],
            ..Default::default()
        };
        let fixed = torch::FrontEnd::default();
        assert!(SmallRows::Auto.wanted(&dynamic) && !SmallRows::Auto.wanted(&fixed));
        assert!(SmallRows::On.wanted(&fixed) && !SmallRows::Off.wanted(&dynamic));
        assert_eq!("off".parse::<SmallRows>(), Ok(SmallRows::Off));
        assert!("small"
            .parse::<SmallRows>()
            .unwrap_err()
            .contains("auto, on or off"));
    }

    fn small(
        kernel: Option<&str>,
        realization: Realization,
        torch_ms: Option<f64>,
    ) -> SmallRowsReport {
        SmallRowsReport {
            rows: SMALL_ROWS,
            upto: SMALL_ROWS_UPTO,
            key: None,
            realization,
            kernel: kernel.map(str::to_string),
            kernel_ms: Some(0.01),
            torch_ms,
        }
    }

    #[test]
    fn the_op_runs_the_small_rows_kernel_or_torch_where_it_measured_faster() {
        let tuned = Realization::Tuned {
            candidates: 2,
            failed: 0,
            quick: true,
        };
        let lost = Realization::Skipped {
            reason: "the winner k is slower than torch".into(),
        };
        assert_eq!(
            small(Some("k128"), tuned.clone(), Some(0.02)).choice(),
            Some("k128")
        );
        assert_eq!(
            small(None, lost.clone(), Some(0.005)).choice(),
            Some("torch")
        );
        // Nothing measured against torch (no kernel passed, or it failed to build): the
        // pattern's own kernel runs every call.
        assert_eq!(small(None, lost, None).choice(), None);
        assert_eq!(
            kernel_by_rows("k128", "k8192"),
            format!("k128@{SMALL_ROWS_UPTO};k8192")
        );
    }

    #[test]
    fn a_changed_small_rows_choice_rewrites_the_outputs() {
        let before = vec![pattern("g", Some("k"), Some(0.1))];
        let mut after = before.clone();
        assert!(!winners_changed(&before, &after));
        after[0].small_rows = Some(small(
            Some("k128"),
            Realization::Tuned {
                candidates: 4,
                failed: 0,
                quick: false,
            },
            Some(0.02),
        ));
        assert!(winners_changed(&before, &after));
    }

    /// The full phase rewrites the outputs only where some pattern's kernel changed (a pattern
    /// newly substituted, or left to torch, included); compose.json lists those patterns with
    /// both kernels and times.
    #[test]
    fn a_changed_winner_is_what_rewrites_the_outputs_and_is_reported() {
        let before = vec![
            pattern("p0", Some("a"), Some(0.5)),
            pattern("p1", None, None),
            pattern("p2", Some("c"), Some(0.2)),
        ];
        let mut after = before.clone();
        after[2].kernel_ms = Some(0.19);
        assert!(
            !winners_changed(&before, &after),
            "a time alone changes nothing"
        );
        assert!(changes(&before, &after).is_empty());
        after[0] = pattern("p0", Some("a2"), Some(0.4));
        after[1] = pattern("p1", Some("b"), Some(0.3));
        assert!(winners_changed(&before, &after));
        assert_eq!(
            changes(&before, &after),
            vec![
                Change {
                    id: "p0".into(),
                    rule: "fake".into(),
                    kernel_before: Some("a".into()),
                    kernel_after: Some("a2".into()),
                    ms_before: Some(0.5),
                    ms_after: Some(0.4),
                },
                Change {
                    id: "p1".into(),
                    rule: "fake".into(),
                    kernel_before: None,
                    kernel_after: Some("b".into()),
                    ms_before: None,
                    ms_after: Some(0.3),
                },
            ]
        );
        after[2].kernel = None;
        assert_eq!(changes(&before, &after).len(), 3, "left to torch now");
    }

    /// What a compose was asked to realize travels in compose.json to `fact tune`.
    #[test]
    fn fact_tune_asks_what_the_compose_asked() {
        let mut opts = test_options();
        opts.max_candidates = Some(3);
        opts.refine = 1;
        opts.light_share = 0.02;
        opts.keep_slower = true;
        opts.matching.fuse_siblings = true;
        opts.matching.patch_conv = false;
        let asked = opts.asked();
        let text = serde_json::to_string(&asked).unwrap();
        let back: Asked = serde_json::from_str(&text).unwrap();
        let again = test_options().asking(&back);
        assert_eq!(again.asked(), asked);
        assert_eq!((again.max_candidates, again.refine), (Some(3), 1));
        // A report from before: what compose asked by default then, when the patch kind was
        // off unless asked.
        let old: Asked = serde_json::from_str("{}").unwrap();
        assert_eq!(
            old,
            Asked {
                patch_conv: false,
                ..Asked::default()
            }
        );
        assert!(Asked::default().patch_conv && test_options().asked().patch_conv);
        assert_eq!(
            test_options().asking(&Asked::default()).asked(),
            test_options().asked()
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
