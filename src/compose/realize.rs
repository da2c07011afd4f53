//! Realization of one problem of any kind: a pattern-table hit (re-verified where the GPU or
//! CUTLASS version differs), a bucket neighbour's winner, or a sweep, recorded in the user table.
//! A sweep is its kind's rounds (`kinds::Kind::candidates`, `retry`, `rounds`): each round's
//! kernels compiled into one library and verified and timed in the crash-resuming worker, the
//! later rounds derived from what the earlier ones measured (a GEMM's cluster shapes and launch
//! knobs of its fastest kernels).
//!
//! Several realizations may run side by side (`compose` runs one per GPU): they share the tables
//! and the agent behind locks held for a lookup, a record or a proposal, never across a build or
//! a measurement, and a measurement's variants are dealt across the GPUs free when it starts
//! (`tune::devices::Pool`). Each GPU's part comes back as a run of its own, judged against torch
//! on that GPU, so a winner is always chosen by ratios over torch measured on one GPU
//! (`Entry::from_runs`).

use super::*;
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};

/// What every realization of one command shares: its options, the toolchain and how it compiles,
/// whether a GPU here tunes for the options' arch (`tunes_here`, found once by the caller, so that
/// every sweep agrees with it) and the GPUs that measure (`gpu_pool`; empty where `gpu` is false).
#[derive(Clone, Copy)]
pub struct RealizeCtx<'a> {
    pub opts: &'a Options,
    pub tc: &'a Toolchain,
    /// nvcc (`NVCC`), or a test's stand-in.
    pub compiler: &'a dyn Compiler,
    pub gpu: bool,
    pub pool: &'a Pool,
    /// The problems that get a light sweep (`compose::light_keys`).
    pub light: &'a BTreeSet<TableKey>,
    /// A quick realization (compose's first phase, `--quick`): a sweep measures its first
    /// `QUICK_CANDIDATES` candidates (the tables' nearby winners first, `quick_cut`) and stops
    /// there, its runs left in the user table as checkpoints (`Run::partial`) for a full
    /// realization to resume; an entry such a sweep left is used as it stands.
    pub quick: bool,
    /// The quick sweeps cut to their first candidate alone (`compose::quick_singles`): the
    /// quick batch's second candidates fill spare build jobs only.
    pub singles: &'a BTreeSet<TableKey>,
}

/// How realizations compile kernels: `nvcc::build_library` and `nvcc::compile_objects`, or in
/// tests a stand-in that compiles nothing and says what it was asked for.
pub trait Compiler: Sync {
    /// `specs` built into the library `name` under `opts.out_dir` (`nvcc::build_library`).
    fn library(
        &self,
        tc: &Toolchain,
        specs: &[Spec],
        name: &str,
        opts: &nvcc::BuildOptions,
    ) -> Result<nvcc::Built, BuildError>;
    /// `specs` compiled into the object cache (`nvcc::compile_objects`).
    fn objects(
        &self,
        tc: &Toolchain,
        specs: &[Spec],
        opts: &nvcc::BuildOptions,
    ) -> Result<nvcc::Objects, BuildError>;
    /// The library's torch op object for `arch` compiled into the object cache
    /// (`nvcc::compile_op_object`).
    fn op_object(
        &self,
        tc: &Toolchain,
        arch: Arch,
        opts: &nvcc::BuildOptions,
    ) -> Result<(), BuildError>;
}

/// nvcc, as every command compiles.
pub struct Nvcc;

/// The compiler of every command (`RealizeCtx::compiler`).
pub static NVCC: Nvcc = Nvcc;

impl Compiler for Nvcc {
    fn library(
        &self,
        tc: &Toolchain,
        specs: &[Spec],
        name: &str,
        opts: &nvcc::BuildOptions,
    ) -> Result<nvcc::Built, BuildError> {
        nvcc::build_library(tc, specs, name, opts)
    }
    fn objects(
        &self,
        tc: &Toolchain,
        specs: &[Spec],
        opts: &nvcc::BuildOptions,
    ) -> Result<nvcc::Objects, BuildError> {
        nvcc::compile_objects(tc, specs, opts)
    }
    fn op_object(
        &self,
        tc: &Toolchain,
        arch: Arch,
        opts: &nvcc::BuildOptions,
    ) -> Result<(), BuildError> {
        nvcc::compile_op_object(tc, arch, opts).map(|_| ())
    }
}

/// How many candidates a quick sweep measures (`RealizeCtx::quick`): the nearest table winner
/// among the kind's candidates and the estimate's best, or the estimate's best two.
pub const QUICK_CANDIDATES: usize = 2;

/// How many of a sweep's first round its quick phase measures: `QUICK_CANDIDATES`, fewer where
/// --candidates asks for fewer.
pub fn quick_count(max_candidates: Option<usize>) -> usize {
    max_candidates
        .unwrap_or(QUICK_CANDIDATES)
        .clamp(1, QUICK_CANDIDATES)
}

/// "the first candidate" or "the first N candidates", as the quick phase's lines say.
pub fn quick_words(n: usize) -> String {
    if n == 1 {
        "the first candidate".to_string()
    } else {
        format!("the first {n} candidates")
    }
}

/// What a quick batch compiles for the `missed` problems the tables miss: the first `n`
/// candidates of each, `singles` of them cut to their first (`RealizeCtx::singles`).
pub fn quick_batch_words(n: usize, missed: usize, singles: usize) -> String {
    let of = format!("the {missed} distinct problem(s) the tables miss");
    match singles.min(missed) {
        0 => format!("{} of {of}", quick_words(n)),
        s if s == missed || n == 1 => format!("the first candidate of {of}"),
        s => format!(
            "{} of {} and the first candidate of {s} of {of}",
            quick_words(n),
            missed - s
        ),
    }
}

/// A quick sweep's kernels: the winners the tables hold near the problem (`nearby`: kernels,
/// nearest first) and the estimate's best of `specs` (a kind's first round, best estimate first),
/// taken in turn, `n` in all. A nearby winner is taken as the first round holds it, else where the
/// kind admits it (`admits`: `Kind::admits`, its own checks); one it does not admit is not taken.
/// The first round is cut by its estimate, which ranks some tiles that win ahead of others that
/// win (stream-K before the 128x192 data-parallel kernels that won every nearby N = 768 GEMM of
/// the shipped table, and lost to cuBLAS where the estimate's stream-K ran alone: vit_b_16's
/// 6304x768x768 in 0.0246 ms against 0.0176, benches/results/zoo/export/README.md).
pub(super) fn quick_cut(
    mut specs: Vec<Spec>,
    nearby: &[Spec],
    n: usize,
    admits: impl Fn(&Spec) -> bool,
) -> Vec<Spec> {
    let first_round = specs.len();
    let mut near: Vec<usize> = Vec::new();
    for k in nearby {
        let name = k.kernel_name();
        if let Some(i) = specs.iter().position(|s| s.kernel_name() == name) {
            near.push(i);
        } else if admits(k) {
            specs.push(k.clone());
            near.push(specs.len() - 1);
        }
    }
    let mut order: Vec<usize> = Vec::new();
    let (mut a, mut b) = (near.into_iter(), 0..first_round);
    while order.len() < n {
        let from_table = a.by_ref().find(|i| !order.contains(i));
        if let Some(i) = from_table {
            order.push(i);
            if order.len() == n {
                break;
            }
        }
        let by_estimate = b.by_ref().find(|i| !order.contains(i));
        if let Some(i) = by_estimate {
            order.push(i);
        }
        if from_table.is_none() && by_estimate.is_none() {
            break;
        }
    }
    order.into_iter().map(|i| specs[i].clone()).collect()
}

/// What realizations running side by side share: the tables (lookups, and each measurement's
/// record as it lands) and the agent.
#[derive(Clone, Copy)]
pub struct Shared<'a> {
    pub tables: &'a Mutex<Tables>,
    pub steward: &'a Mutex<Steward>,
}

/// The lock of `m`; a thread that panicked holding it left the value whole (every change under
/// these locks is one call), so it is taken as it is.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

/// Whether a run measured at `run` counts as measured `here`: the same GPU model and CUTLASS.
fn same_place(here: &Provenance, run: &Provenance) -> bool {
    here.device.name == run.device.name && here.cutlass == run.cutlass
}

/// How many of a table entry's best kernels a GPU model must have timed before it uses the entry
/// as it stands (`Entry::leading_specs`): a kernel's rank moves between GPU models of one arch, so
/// the winner elsewhere is often not the winner here, and its runners-up mostly are.
const REVERIFY_KERNELS: usize = 3;

/// The entry's leading kernels when any of them was never tried here (this GPU model and
/// CUTLASS), with where the first such one was measured: they are timed here, in one run, before use;
/// once a run here has tried them all, the entry is used as this model's runs rank it. None
/// without a GPU here (`here` is None) or when every leading kernel was tried here.
fn to_time_here(here: Option<&Provenance>, entry: &Entry) -> Option<(String, Vec<Spec>)> {
    let here = here?;
    let tried: BTreeSet<&str> = entry
        .runs
        .iter()
        .filter(|r| same_place(here, &r.provenance))
        .flat_map(|r| r.candidates.iter().map(|c| c.kernel.as_str()))
        .collect();
    let leading = entry.leading_specs(REVERIFY_KERNELS);
    let untried = leading
        .iter()
        .map(|s| s.kernel_name())
        .find(|k| !tried.contains(k.as_str()))?;
    // Every leading kernel comes from a run's candidates; an untried one's runs are elsewhere.
    let prov = entry
        .runs
        .iter()
        .find(|r| r.candidates.iter().any(|c| c.kernel == untried))
        .map_or(entry.winner_provenance(), |r| &r.provenance);
    Some((
        format!("{} with CUTLASS {}", prov.device.name, prov.cutlass),
        leading,
    ))
}

/// Where a quick realization takes an exact hit as it stands, though a full one would time kernels
/// here first (its leading kernels were measured on another GPU model, or its kind gained a family
/// since: `has_new_families`): the GPU and CUTLASS its winner was measured with. Only for a winner
/// measured with this CUTLASS on another GPU of the arch: it passed its fp64 check there and
/// computes the same here, and what may differ here is its rank, which the full phase settles
/// (the realization is `cut`). A winner of another CUTLASS is re-verified in the quick phase too.
fn quick_as_it_stands(
    cx: RealizeCtx,
    here: Option<&Provenance>,
    entry: &Entry,
    has_new_families: bool,
) -> Option<String> {
    let h = here.filter(|_| cx.quick)?;
    let winner = entry.winner_provenance();
    if winner.cutlass != h.cutlass {
        return None;
    }
    match to_time_here(here, entry) {
        Some((on, _)) => Some(on),
        None if has_new_families => Some(format!(
            "{} with CUTLASS {}",
            winner.device.name, winner.cutlass
        )),
        None => None,
    }
}

/// How many kernels of a family its entry never tried a table hit times (`untried_families`).
const FAMILY_KERNELS: usize = 4;

/// The kernels of `space` (the kind's space for the problem now, best first: `Kind::space_now`)
/// of families no run of `entry` tried, passing or failing, the first `FAMILY_KERNELS` of each: a
/// family the kind gained after the entry was measured (the 1x1 convolutions' GEMMs, the stems'
/// fixed-channels kernels). A hit on a GPU times them before it uses the entry, and their run
/// merges into it, so its winner is chosen over every family the kind has now; a compacted
/// table keeps a kernel of each family a run tried, so a family stays tried.
fn untried_families(entry: &Entry, space: Vec<Spec>) -> Vec<Spec> {
    let tried: BTreeSet<String> = entry
        .runs
        .iter()
        .flat_map(|r| &r.candidates)
        .map(|c| c.spec.family())
        .collect();
    let mut taken: BTreeMap<String, usize> = BTreeMap::new();
    space
        .into_iter()
        .filter(|s| {
            let family = s.family();
            if tried.contains(&family) {
                return false;
            }
            let n = taken.entry(family).or_default();
            *n += 1;
            *n <= FAMILY_KERNELS
        })
        .collect()
}

/// `untried_families` of the entry a hit found, where a GPU is here to time them.
fn new_families(
    cx: RealizeCtx,
    here: Option<&Provenance>,
    problem: &Problem,
    math: MathType,
    entry: &Entry,
) -> Vec<Spec> {
    if here.is_none() || !cx.gpu {
        return vec![];
    }
    untried_families(entry, problem.kind().space_now(problem, math, cx.opts.arch))
}

/// Whether a hit whose leading kernels just ran here (`fresh`, the entry with that run) earns a
/// sweep on this GPU model: they lose to torch here while some kernel beat torch where `before`
/// was measured, so this model may want another. Where none beat torch there either, the sweep
/// behind `before` already searched this space (a K = 1 product, a GEMM of a few thousand
/// FLOPs): another costs the compose its nvcc time for nothing, and torch keeps the pattern.
fn sweep_here(before: &Entry, fresh: &Entry) -> bool {
    fresh.loses_to_torch() && !before.loses_to_torch()
}

/// `entry` as this GPU model uses it (`Entry::for_device`), or as it stands without a GPU here.
fn for_here(here: Option<&Provenance>, entry: Entry) -> Entry {
    match here {
        Some(h) => entry.for_device(|p| same_place(h, p)).unwrap_or(entry),
        None => entry,
    }
}

/// The checkpoints `entry` holds of a sweep on this GPU model and CUTLASS (`Entry::unfinished_at`),
/// which a full realization resumes; None without a GPU here or where there are none.
fn unfinished_here(here: Option<&Provenance>, entry: &Entry) -> Option<Vec<Run>> {
    let here = here?;
    entry.unfinished_at(|p| same_place(here, p))
}

/// The provenance of a run measured on `device` with this toolchain.
fn provenance(tc: &Toolchain, device: &tune::cuda::DeviceInfo) -> Provenance {
    Provenance {
        device: device.clone(),
        torch: torch::torch_version(),
        nvcc: tc.nvcc_version(),
        cutlass: tc.cutlass_version(),
        fact: env!("CARGO_PKG_VERSION").to_string(),
        date: table::today(),
    }
}

/// Where this command measures, for telling table winners measured elsewhere: its first GPU.
fn here(cx: RealizeCtx) -> Option<Provenance> {
    let gpu = cx.pool.gpus().first().filter(|_| cx.gpu)?;
    Some(provenance(cx.tc, &gpu.info))
}

/// Compiles `candidates` into one library and judges every one on the GPUs in child processes.
/// Returns one run per GPU that measured (each with its own torch baseline; compile failures in
/// the first) and the compile failures.
fn measure(
    cx: RealizeCtx,
    problem: &Problem,
    math: MathType,
    candidates: &[Spec],
    dir: &Path,
) -> Result<(Vec<Run>, Vec<CompileFailure>), ComposeError> {
    let RealizeCtx { opts, tc, pool, .. } = cx;
    let key = TableKey::of(problem, math, opts.arch);
    let built = cx
        .compiler
        .library(tc, candidates, "libsweep.so", &opts.sweep_build(dir))?;
    // Measurements run side by side where there are several GPUs, whose bars would draw over
    // each other: lines then, on a terminal too.
    let lines = pool.gpus().len() > 1;
    let bar = if opts.progress && !lines {
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
    let say = |line: std::fmt::Arguments| {
        if lines && opts.progress {
            eprintln!("{line}");
        } else {
            nvcc::progress_line(opts.progress, line);
        }
    };
    let req = worker::Request {
        library: built.library.clone(),
        problem: problem.clone(),
        math,
        precision: opts.precision,
        protocol: opts.protocol.clone(),
        variants: (0..built.kernels.len()).collect(),
        baseline: true,
        gpu_uuid: None,
    };
    let started = std::time::Instant::now();
    let results = pool
        .measure(
            &req,
            &|dealt| {
                say(format_args!(
                    "tuning {} variants of {} {}{}",
                    built.kernels.len(),
                    key.rule,
                    key.shape,
                    on_gpus(lines, dealt)
                ))
            },
            &|_| bar.inc(1),
        )
        .map_err(|detail| ComposeError::Tune {
            key: key.to_string(),
            detail,
        })?;
    bar.finish_and_clear();
    let each: Vec<String> = results
        .iter()
        .map(|r| {
            format!(
                "{} {} in {:.1} s",
                r.gpu.label(),
                r.variants.len(),
                r.seconds
            )
        })
        .collect();
    say(format_args!(
        "tuned {} in {:.0} s{}",
        key.shape,
        started.elapsed().as_secs_f64(),
        if lines && !each.is_empty() {
            format!(" ({})", each.join(", "))
        } else {
            String::new()
        }
    ));
    let mut failed: Vec<CandidateResult> = Vec::new();
    for f in &built.failures {
        for spec in candidates.iter().filter(|k| k.kernel_name() == f.kernel) {
            failed.push(CandidateResult {
                kernel: spec.name(),
                spec: spec.clone(),
                outcome: Outcome::CompileFailed { log: f.log.clone() },
            });
        }
    }
    let first = &pool.gpus().first().expect("measured on a GPU").info;
    let runs = runs_of(results, &built.kernels, failed, first, &|d| {
        provenance(tc, d)
    });
    Ok((runs, built.failures))
}

/// ` on GPU0 (6), GPU1 (6)`: which GPU takes how many variants, where there are several.
fn on_gpus(lines: bool, dealt: &[(&Gpu, usize)]) -> String {
    if !lines {
        return String::new();
    }
    let parts: Vec<String> = dealt
        .iter()
        .map(|(g, n)| format!("{} ({n})", g.label()))
        .collect();
    format!(" on {}", parts.join(", "))
}

/// The table runs of one measurement: one per GPU that measured, in the pool's order, each
/// with the variants it judged (a worker's indices are positions in `kernels`: a library holds
/// one kind) and its own torch baseline; the compile failures join the first. Without any GPU
/// result (nothing compiled) the failures are a run of `first`'s, without a baseline.
fn runs_of(
    results: Vec<tune::devices::GpuResult>,
    kernels: &[Spec],
    failed: Vec<CandidateResult>,
    first: &tune::cuda::DeviceInfo,
    provenance: &dyn Fn(&tune::cuda::DeviceInfo) -> Provenance,
) -> Vec<Run> {
    let mut runs: Vec<Run> = results
        .into_iter()
        .map(|r| Run {
            provenance: provenance(&r.gpu.info),
            baseline: r.result.baseline,
            partial: false,
            candidates: r
                .result
                .outcomes
                .into_iter()
                .map(|(index, outcome)| {
                    let spec = kernels[index].clone();
                    CandidateResult {
                        kernel: spec.name(),
                        spec,
                        outcome,
                    }
                })
                .collect(),
        })
        .collect();
    match runs.first_mut() {
        Some(run) => run.candidates.extend(failed),
        None => runs.push(Run {
            provenance: provenance(first),
            baseline: None,
            candidates: failed,
            partial: false,
        }),
    }
    runs
}

/// `more` added to a sweep's `runs`: a GPU's candidates join the run of the same GPU (its
/// baseline stays the first it measured, as one GPU's rounds always shared one), a GPU new to
/// the sweep brings its run.
fn merge_runs(runs: &mut Vec<Run>, more: Vec<Run>) {
    for r in more {
        match runs
            .iter_mut()
            .find(|x| x.provenance.device == r.provenance.device)
        {
            Some(x) => {
                if x.baseline.is_none() {
                    x.baseline = r.baseline;
                }
                x.candidates.extend(r.candidates);
            }
            None => runs.push(r),
        }
    }
}

/// What realizing one problem produced.
pub struct Realized {
    pub how: Realization,
    pub entry: Option<Entry>,
    pub failures: Vec<CompileFailure>,
    /// A quick realization left the problem to a full one (`RealizeCtx::quick`): it measured a
    /// sweep's first candidates alone, took the entry such a sweep left, or took a winner
    /// measured on another GPU without timing it here (`quick_as_it_stands`).
    pub cut: bool,
    /// The entry whose winner `finish` left to torch, slower than torch's ops.
    pub lost: Option<Box<Entry>>,
}

impl Realized {
    /// Left to torch, and why.
    pub(super) fn skipped(reason: String) -> Realized {
        Realized {
            how: Realization::Skipped { reason },
            entry: None,
            failures: vec![],
            cut: false,
            lost: None,
        }
    }
}

fn sweep_dir(opts: &Options, key: &TableKey, what: &str) -> PathBuf {
    opts.out_dir
        .join("sweeps")
        .join(format!("{}_{}_{}{what}", key.rule, key.dtypes.a, key.shape))
}

/// Realizes one problem of any kind: a table hit (re-verified where it was measured elsewhere), a
/// bucket hit re-verified on this shape (and swept after all where it loses to torch), or a full
/// sweep, taking its first round from `ahead` where `measure_ahead` measured it, or resuming
/// one a quick realization or a stopped process left on this GPU model (`Entry::unfinished_at`).
/// A quick realization (`RealizeCtx::quick`) sweeps its first candidates alone and takes an
/// unfinished entry as it stands. Every new measurement goes into the user table at once (a
/// sweep's rounds as checkpoints), so a later failure, a timeout or a kill loses no tuning result.
pub fn realize(
    cx: RealizeCtx,
    sh: Shared,
    problem: &Problem,
    ahead: &Ahead,
) -> Result<Realized, ComposeError> {
    let RealizeCtx { opts, .. } = cx;
    let Some(math) = problem.math(opts.precision) else {
        return Ok(Realized::skipped(format!(
            "no kernel family computes {} under precision {}; use --precision tf32",
            problem.dtype(),
            opts.precision
        )));
    };
    let key = TableKey::of(problem, math, opts.arch);
    let sweep = || {
        let first = ahead.take(&key);
        realize_sweep(cx, sh, problem, math, first, vec![], ahead)
    };
    let here = here(cx);
    let found = lock(sh.tables).lookup(&key, problem);
    if let Lookup::Exact { entry, table } = &found {
        if let Some(runs) = unfinished_here(here.as_ref(), entry) {
            if cx.quick {
                // A quick compose measured its first candidates before: used as it stands, the
                // rest of its sweep left to a full realization.
                return Ok(Realized {
                    how: Realization::Hit {
                        table: (*table).into(),
                        measured_on: None,
                        reverified: false,
                    },
                    entry: Some(for_here(here.as_ref(), entry.clone())),
                    failures: vec![],
                    cut: true,
                    lost: None,
                });
            }
            // Measured ahead by this compose (its checkpoint is the entry), or left by a quick
            // compose or a process that stopped mid-sweep: the sweep goes on from what is
            // measured, the rest of its first round first.
            let first = ahead.take(&key);
            if first.is_none() {
                nvcc::progress_line(
                    opts.progress,
                    format_args!(
                        "{key}: resuming a sweep left after {} kernels",
                        runs.iter().map(|r| r.candidates.len()).sum::<usize>()
                    ),
                );
            }
            return realize_sweep(cx, sh, problem, math, first, runs, ahead);
        }
    }
    match found {
        Lookup::Exact { mut entry, table } => {
            let new = new_families(cx, here.as_ref(), problem, math, &entry);
            if let Some(on) = quick_as_it_stands(cx, here.as_ref(), &entry, !new.is_empty()) {
                nvcc::progress_line(
                    opts.progress,
                    format_args!(
                        "{key}: {} from the {table} table, measured on {on}, taken as it stands; the full phase times its leading kernels here",
                        entry.winner
                    ),
                );
                return Ok(Realized {
                    how: Realization::Hit {
                        table: table.into(),
                        measured_on: Some(on),
                        reverified: false,
                    },
                    entry: Some(for_here(here.as_ref(), entry)),
                    failures: vec![],
                    cut: true,
                    lost: None,
                });
            }
            let mut family_failures = vec![];
            if !new.is_empty() {
                let families: BTreeSet<String> = new.iter().map(Spec::family).collect();
                nvcc::progress_line(
                    opts.progress,
                    format_args!(
                        "{key}: the table's entry never tried the kernel family {} (added since it was measured); timing its {} leading kernel(s) here",
                        families.into_iter().collect::<Vec<_>>().join(", "),
                        new.len()
                    ),
                );
                // The user table's entry now holds the new run; a shipped entry's runs are not
                // in it, so the two merge, and the leading kernels of both families are timed
                // here below where they were not.
                if let Some((fresh, failures)) = reverify(cx, sh, problem, math, &new, "_family")? {
                    entry = entry.merged(&fresh);
                    family_failures = failures;
                }
            }
            if let Some((on, leading)) = to_time_here(here.as_ref(), &entry) {
                let Some((fresh, mut failures)) =
                    reverify(cx, sh, problem, math, &leading, "_reverify")?
                else {
                    return sweep();
                };
                failures.extend(family_failures);
                let fresh = for_here(here.as_ref(), fresh);
                // As a bucket neighbour's (below): what loses to torch here earns a sweep, unless
                // nothing beat torch where the entry was measured either.
                if sweep_here(&entry, &fresh) {
                    nvcc::progress_line(
                        opts.progress,
                        format_args!(
                            "{key}: the {} kernel(s) leading on {on} lose to torch here; sweeping",
                            leading.len()
                        ),
                    );
                    return sweep();
                }
                if fresh.loses_to_torch() {
                    nvcc::progress_line(
                        opts.progress,
                        format_args!(
                            "{key}: the {} kernel(s) leading on {on} lose to torch here as every kernel did there; no sweep",
                            leading.len()
                        ),
                    );
                }
                return Ok(Realized {
                    how: Realization::Hit {
                        table: table.into(),
                        measured_on: Some(on),
                        reverified: true,
                    },
                    entry: Some(fresh),
                    failures,
                    cut: false,
                    lost: None,
                });
            }
            let how = Realization::Hit {
                table: table.into(),
                measured_on: None,
                reverified: false,
            };
            Ok(Realized {
                how,
                entry: Some(for_here(here.as_ref(), entry)),
                failures: family_failures,
                cut: false,
                lost: None,
            })
        }
        Lookup::Bucket { entry, table } if cx.gpu => {
            match reverify(
                cx,
                sh,
                problem,
                math,
                std::slice::from_ref(&entry.winner_spec),
                "_bucket",
            )? {
                // A neighbour's launch knobs can cost another shape 10% (on the H100, tf32
                // 65536x3072x768's swizzle 2 ran 65536x2304x768 at 0.89x torch where its own
                // sweep's winner ran 0.98x): a bucket winner that loses here earns the shape a
                // sweep of its own, which merges with this run.
                Some((fresh, _)) if fresh.loses_to_torch() => {
                    nvcc::progress_line(
                        opts.progress,
                        format_args!(
                            "{key}: {} from bucket neighbour {} ran {:.4} ms against torch's {:.4}; sweeping this shape",
                            fresh.winner,
                            entry.key.shape,
                            fresh.winner_ms,
                            fresh.baseline_ms().unwrap_or(f64::NAN)
                        ),
                    );
                    sweep()
                }
                Some((fresh, failures)) => Ok(Realized {
                    how: Realization::Bucket {
                        table: table.into(),
                        from_shape: entry.key.shape.clone(),
                    },
                    entry: Some(fresh),
                    failures,
                    cut: false,
                    lost: None,
                }),
                None => sweep(),
            }
        }
        _ => sweep(),
    }
}

/// Builds and judges kernels from elsewhere (a winner, and its runners-up) on this problem. When
/// one passes, the run goes into the user table and the entry as it stands there now comes back;
/// None when every one failed here.
fn reverify(
    cx: RealizeCtx,
    sh: Shared,
    problem: &Problem,
    math: MathType,
    kernels: &[Spec],
    what: &str,
) -> Result<Option<(Entry, Vec<CompileFailure>)>, ComposeError> {
    let opts = cx.opts;
    let key = &TableKey::of(problem, math, opts.arch);
    let dir = sweep_dir(opts, key, what);
    let (runs, failures) = measure(cx, problem, math, kernels, &dir)?;
    let Some(fresh) = Entry::from_runs(key.clone(), problem.clone(), runs) else {
        return Ok(None);
    };
    let mut tables = lock(sh.tables);
    tables.record(fresh)?;
    Ok(tables.user.get(key).cloned().map(|e| (e, failures)))
}

/// What a sweep of one key is given beside its problem (`kinds::SweepCx`), owned.
struct SweepInputs {
    cutlass: String,
    rules: Vec<crate::space::validity::Rule>,
    scope: crate::space::validity::Scope,
    failed: BTreeSet<String>,
    space: SpaceOptions,
    effort: Effort,
    /// The winners the tables hold near the problem, nearest first, where the sweep is cut
    /// (`Effort::cut`): what it measures first (`quick_cut`).
    nearby: Vec<Spec>,
}

/// How hard a sweep looks: its first round's size, how many of its kernels it measures (a quick
/// sweep's cut) and how many kernels its later rounds refine.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Effort {
    max_candidates: Option<usize>,
    refine: usize,
    /// A quick sweep measures this many of its first round (`quick_cut`) and no later round.
    cut: Option<usize>,
}

impl Effort {
    /// `--candidates` and `--refine`, or for a light sweep at most `LIGHT_BUDGET` first
    /// candidates and no later rounds; a quick sweep (`quick`) cut to `QUICK_CANDIDATES` of
    /// that first round (fewer where `--candidates` asks for fewer, one where `single`), with
    /// no later rounds.
    fn of(opts: &Options, light: bool, quick: bool, single: bool) -> Effort {
        let full = if light {
            Effort {
                max_candidates: Some(
                    opts.max_candidates
                        .unwrap_or(LIGHT_BUDGET)
                        .min(LIGHT_BUDGET),
                ),
                refine: 0,
                cut: None,
            }
        } else {
            Effort {
                max_candidates: opts.max_candidates,
                refine: opts.refine,
                cut: None,
            }
        };
        if !quick {
            return full;
        }
        Effort {
            refine: 0,
            cut: Some(if single {
                1
            } else {
                quick_count(full.max_candidates)
            }),
            ..full
        }
    }
}

impl SweepInputs {
    /// The inputs of a sweep of `problem` (whose key is `key`), resuming the runs `done` (none
    /// for a new sweep): the kernels they measured, failed or not, do not count as failures the
    /// tables know, so the kind derives the first round the sweep began with.
    fn new(
        cx: RealizeCtx,
        tables: &Tables,
        key: &TableKey,
        problem: &Problem,
        done: &[Run],
    ) -> SweepInputs {
        let cutlass = cx.tc.cutlass_version();
        let effort = Effort::of(
            cx.opts,
            cx.light.contains(key),
            cx.quick,
            cx.singles.contains(key),
        );
        let mut space = cx.opts.space.clone();
        if let Some(n) = effort.max_candidates {
            space.budget = n.max(1);
        }
        let mut failed = failed_kernels(tables, key);
        for c in done.iter().flat_map(|r| &r.candidates) {
            failed.remove(&c.kernel);
            failed.remove(&c.spec.kernel_name());
        }
        let nearby = match effort.cut {
            Some(n) => tables.nearby_winners(key, problem, n),
            None => vec![],
        };
        SweepInputs {
            scope: key.scope(&cutlass),
            rules: tables.rules(),
            failed,
            cutlass,
            space,
            effort,
            nearby,
        }
    }

    fn cx<'a>(&'a self, cx: RealizeCtx, math: MathType, steward: &'a mut Steward) -> SweepCx<'a> {
        SweepCx {
            arch: cx.opts.arch,
            math,
            cutlass: &self.cutlass,
            rules: &self.rules,
            scope: &self.scope,
            failed: &self.failed,
            space: &self.space,
            max_candidates: self.effort.max_candidates,
            refine: self.effort.refine,
            steward,
        }
    }
}

/// The kernels a sweep of `problem` compiles first (its kind's, `Kind::candidates`; a quick
/// sweep's cut of them, `quick_cut`), or why there are none.
fn first_candidates(
    cx: RealizeCtx,
    inputs: &SweepInputs,
    steward: &mut Steward,
    problem: &Problem,
    math: MathType,
    key: &TableKey,
) -> Result<Candidates, ComposeError> {
    let found = problem
        .kind()
        .candidates(problem, &mut inputs.cx(cx, math, steward))
        .map_err(|detail| ComposeError::Tune {
            key: key.to_string(),
            detail,
        })?;
    Ok(match (found, inputs.effort.cut) {
        (Candidates::Kernels { specs, space }, Some(n)) => {
            let cx = inputs.cx(cx, math, steward);
            Candidates::Kernels {
                specs: quick_cut(specs, &inputs.nearby, n, |s| {
                    problem.kind().admits(problem, s, &cx)
                }),
                space,
            }
        }
        (found, _) => found,
    })
}

/// Of `candidates`, those the runs `done` did not measure.
fn unmeasured(candidates: Vec<Spec>, done: &[Run]) -> Vec<Spec> {
    let measured: BTreeSet<&str> = done
        .iter()
        .flat_map(|r| r.candidates.iter().map(|c| c.kernel.as_str()))
        .collect();
    candidates
        .into_iter()
        .filter(|s| !measured.contains(s.name().as_str()))
        .collect()
}

/// Compiles the first candidates of every problem the tables cannot answer (a quick
/// realization's cut of them), the rest of the first rounds of the sweeps a full realization
/// resumes, and the winners that `realize` will re-verify here (measured on another GPU or
/// CUTLASS, or a bucket neighbour's), in one parallel build into the object cache, before the
/// patterns run one by one: one nvcc unit takes the better part of a minute and a single sweep
/// or re-verification rarely fills every core, so pooling them shortens a cold compose by about
/// the number of patterns times a unit (a Llama-style model from a table measured on another GPU
/// spent 50 s a pattern re-verifying one kernel at a time). Only the built-in agent's candidates
/// are known in advance; an external agent's sweeps compile as they come. Failures are left to
/// the sweeps to report.
pub(super) fn prefetch(
    cx: RealizeCtx,
    tables: &Tables,
    steward: &Steward,
    problems: &[Problem],
) -> Result<(), ComposeError> {
    let opts = cx.opts;
    if !steward.is_builtin() {
        return Ok(());
    }
    let mut specs: Vec<Spec> = Vec::new();
    let mut builtin = Steward::builtin();
    let mut missed = 0;
    let mut again = 0;
    let mut resumed = 0;
    let mut hits = 0;
    let mut singles = 0;
    // The quick sweeps' libraries, linked side by side after the batch (`link_ahead`).
    let mut sweep_libraries: Vec<(TableKey, Vec<Spec>)> = Vec::new();
    let here = here(cx);
    // A model's layers repeat their problems: each distinct one once.
    let mut seen = BTreeSet::new();
    for problem in problems {
        let Some(math) = problem.math(opts.precision) else {
            continue;
        };
        let key = TableKey::of(problem, math, opts.arch);
        if !seen.insert(key.clone()) {
            continue;
        }
        match tables.lookup(&key, problem) {
            Lookup::Miss => {}
            Lookup::Exact { entry, .. } => {
                if let Some(done) = unfinished_here(here.as_ref(), &entry) {
                    // A quick realization takes it as it stands (its winner compiled with the
                    // rest); a full one resumes its sweep.
                    if cx.quick {
                        specs.push(entry.winner_spec.clone());
                        hits += 1;
                    } else {
                        let inputs = SweepInputs::new(cx, tables, &key, problem, &done);
                        let found =
                            first_candidates(cx, &inputs, &mut builtin, problem, math, &key)?;
                        if let Candidates::Kernels { specs: first, .. } = found {
                            specs.extend(unmeasured(first, &done));
                        }
                        resumed += 1;
                    }
                    continue;
                }
                let new = new_families(cx, here.as_ref(), problem, math, &entry);
                // A quick realization takes another GPU model's winner as it stands; the leading
                // kernels wait for the full phase.
                let timed_later =
                    quick_as_it_stands(cx, here.as_ref(), &entry, !new.is_empty()).is_some();
                let leading = to_time_here(here.as_ref(), &entry).map(|(_, l)| l);
                if !timed_later && (!new.is_empty() || leading.is_some()) {
                    again += 1;
                    specs.extend(new);
                    specs.extend(leading.unwrap_or_default());
                } else {
                    // A winner taken as it stands goes into the library: compiled here with the
                    // rest rather than alone after them. The one `realize` takes: this GPU
                    // model's (`for_here`), which another model's runs in the entry may not rank
                    // first (a Llama-style decoder's library then compiled one unit, 37 s, after
                    // the batch).
                    specs.push(for_here(here.as_ref(), entry).winner_spec);
                    hits += 1;
                }
                continue;
            }
            Lookup::Bucket { entry, .. } => {
                if cx.gpu {
                    again += 1;
                    specs.push(entry.winner_spec.clone());
                }
                continue;
            }
        }
        let inputs = SweepInputs::new(cx, tables, &key, problem, &[]);
        let found = first_candidates(cx, &inputs, &mut builtin, problem, math, &key)?;
        missed += 1;
        if cx.quick && cx.singles.contains(&key) {
            singles += 1;
        }
        if let Candidates::Kernels { specs: first, .. } = found {
            if cx.quick && cx.gpu {
                sweep_libraries.push((key.clone(), first.clone()));
            }
            specs.extend(first);
        }
    }
    if seen.is_empty() {
        return Ok(());
    }
    // Says what the batch holds, the parts there are.
    let mut parts = Vec::new();
    if missed > 0 {
        parts.push(if cx.quick {
            quick_batch_words(quick_count(cx.opts.max_candidates), missed, singles)
        } else {
            format!("the first candidates of the {missed} distinct problem(s) the tables miss")
        });
    }
    if resumed > 0 {
        parts.push(format!(
            "the rest of the first rounds of the {resumed} sweep(s) to finish"
        ));
    }
    if again > 0 {
        parts.push(format!(
            "the leading kernels of the {again} to re-verify here"
        ));
    }
    if hits > 0 {
        parts.push(format!("the winners of the {hits} taken as they stand"));
    }
    parts.push("the library's torch ops".to_string());
    let last = parts.pop().unwrap_or_default();
    let line = if parts.is_empty() {
        format!("prefetch: compiling {last}")
    } else {
        format!(
            "prefetch: compiling together {}, and {last}",
            parts.join(", ")
        )
    };
    // Where every problem is a hit taken as it stands, the batch is the library's own kernels:
    // their sources go where the library's do, and no sweep folder is made.
    let folder = if missed + again + resumed == 0 {
        ""
    } else {
        "prefetch"
    };
    // The library's torch op object is a host compile as long as a kernel's: built beside the
    // batch, the library build after the patterns finds it done.
    let build = opts.build(&batch_dir(cx, folder));
    let failed = std::thread::scope(|scope| {
        let op = scope.spawn(|| cx.compiler.op_object(cx.tc, opts.arch, &build));
        let kernels = compile_ahead(
            cx,
            specs,
            Batch {
                folder,
                at_least: 1,
                line: Some(&line),
                jobs: cx.opts.jobs,
                behind: false,
            },
        );
        // A failure here is the library build's to report, where it compiles the object again.
        let _ = op.join().expect("the torch op compile does not panic");
        kernels
    })?;
    // A sweep with a kernel that failed compiles it again itself (and reports it): linking it
    // ahead would compile it once more, on every core's critical path.
    sweep_libraries.retain(|(_, specs)| specs.iter().all(|s| !failed.contains(&s.kernel_name())));
    link_ahead(cx, &sweep_libraries);
    Ok(())
}

/// `f` of each of `items`, on up to `workers` threads (at least one) each taking the next item in
/// turn, the results in the items' order.
fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..workers.clamp(1, items.len().max(1)))
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let Some(item) = items.get(i) else {
                            return mine;
                        };
                        mine.push((i, f(item)));
                    }
                })
            })
            .collect();
        let mut all: Vec<(usize, R)> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("a worker thread panicked"))
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, r)| r).collect()
    })
}

/// Links each quick sweep's library (its first candidates, compiled by the batch) into its sweep
/// folder, side by side on the compose's jobs, before the sweeps measure one at a time: each
/// sweep then finds its library linked (`nvcc::build_library`'s stamp) and goes straight to its
/// GPU. A sweep library's host part (its dispatch table, the link against torch) takes about a
/// second, and a model new to the tables has a sweep for each distinct problem (a Llama-style
/// decoder nine), which its quick phase otherwise links in turn. Failures are left to the sweeps,
/// which build again and report them.
fn link_ahead(cx: RealizeCtx, sweeps: &[(TableKey, Vec<Spec>)]) {
    if sweeps.is_empty() {
        return;
    }
    let started = std::time::Instant::now();
    in_parallel(sweeps, cx.opts.jobs, |(key, specs)| {
        let build = nvcc::BuildOptions {
            jobs: 1,
            show_progress: false,
            ..cx.opts.sweep_build(&sweep_dir(cx.opts, key, ""))
        };
        let _ = cx.compiler.library(cx.tc, specs, "libsweep.so", &build);
    });
    nvcc::progress_line(
        cx.opts.progress,
        format_args!(
            "linked the {} quick sweeps' libraries in {:.0} s",
            sweeps.len(),
            started.elapsed().as_secs_f64()
        ),
    );
}

/// Where a batch's sources go: `folder` under sweeps/, or, for "", the output folder (the
/// library's own).
fn batch_dir(cx: RealizeCtx, folder: &str) -> std::path::PathBuf {
    if folder.is_empty() {
        cx.opts.out_dir.clone()
    } else {
        cx.opts.out_dir.join("sweeps").join(folder)
    }
}

/// How `compile_ahead` builds its batch.
struct Batch<'a> {
    /// Under sweeps/ ("": the output folder, `batch_dir`).
    folder: &'a str,
    /// Nothing is built for fewer kernels.
    at_least: usize,
    /// Said first.
    line: Option<&'a str>,
    /// nvcc units.
    jobs: usize,
    /// Built behind other work: lines rather than a bar, which would draw over the tuning bars
    /// on a terminal.
    behind: bool,
}

/// Compiles `specs`, each kernel once, into the object cache in one nvcc batch. Failures are
/// left to the sweeps that meet them to report; the names of the kernels that failed are returned.
fn compile_ahead(
    cx: RealizeCtx,
    mut specs: Vec<Spec>,
    batch: Batch,
) -> Result<BTreeSet<String>, ComposeError> {
    let Batch {
        folder,
        at_least,
        line,
        jobs,
        behind,
    } = batch;
    let mut seen = BTreeSet::new();
    specs.retain(|s| seen.insert(s.kernel_name()));
    if specs.is_empty() || specs.len() < at_least {
        return Ok(BTreeSet::new());
    }
    let show = cx.opts.progress;
    if let Some(line) = line {
        nvcc::progress_line(show, format_args!("{line}"));
    }
    let dir = batch_dir(cx, folder);
    let build = nvcc::BuildOptions {
        jobs,
        show_progress: show && !behind,
        ..cx.opts.build(&dir)
    };
    if behind && show {
        eprintln!(
            "compiling {} kernels in the background on {jobs} jobs into {}",
            specs.len(),
            dir.display()
        );
    }
    let started = std::time::Instant::now();
    let built = cx
        .compiler
        .objects(cx.tc, &specs, &build)
        .map_err(ComposeError::from)?;
    if behind && show {
        eprintln!(
            "compiled {} kernels in {:.0} s, {} failed (in the background)",
            specs.len(),
            started.elapsed().as_secs_f64(),
            built.failures.len()
        );
    }
    Ok(built.failures.into_iter().map(|f| f.kernel).collect())
}

/// A sweep's first round: its kernels measured (a run per GPU), with what they came from.
pub(super) struct FirstRound {
    runs: Vec<Run>,
    failures: Vec<CompileFailure>,
    /// What the kernels came from (sweep.json's `space`), where the kind says.
    space: Option<serde_json::Value>,
    seconds: f64,
}

/// What a sweep's first round came to: measured, or the sweep's end (no candidates, or no GPU to
/// tune on, where compiling them is all there is).
enum Round {
    Measured(FirstRound),
    Done(Realized),
}

/// Shut until a background job ends (the sibling rounds' batch), then open for good.
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn new(open: bool) -> Gate {
        Gate {
            open: Mutex::new(open),
            opened: Condvar::new(),
        }
    }
    pub(super) fn is_open(&self) -> bool {
        *lock(&self.open)
    }
    pub(super) fn open(&self) {
        *lock(&self.open) = true;
        self.opened.notify_all();
    }
    pub(super) fn close(&self) {
        *lock(&self.open) = false;
    }
    /// Returns once the gate is open.
    pub(super) fn wait(&self) {
        let mut open = lock(&self.open);
        while !*open {
            open = self.opened.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// First rounds measured ahead of their sweeps' turns, by table key (`measure_ahead`), and the
/// gate their sibling rounds' batch opens when it has compiled: a sweep that takes its first round
/// from here waits at it before its later rounds, whose kernels the batch holds. Empty, and open,
/// where a problem is realized on its own.
pub struct Ahead {
    first: Mutex<BTreeMap<TableKey, FirstRound>>,
    /// The keys measured ahead, taken or not.
    keys: Mutex<BTreeSet<TableKey>>,
    pub(super) siblings: Gate,
}

impl Default for Ahead {
    fn default() -> Ahead {
        Ahead {
            first: Mutex::new(BTreeMap::new()),
            keys: Mutex::new(BTreeSet::new()),
            siblings: Gate::new(true),
        }
    }
}

impl Ahead {
    fn take(&self, key: &TableKey) -> Option<FirstRound> {
        lock(&self.first).remove(key)
    }
    /// Whether a sweep of `key` waits for the sibling batch.
    pub(super) fn waits(&self, key: &TableKey) -> bool {
        lock(&self.keys).contains(key)
    }
}

/// Every kernel the runs measured, as a kind's later rounds read it: each time taken over torch's
/// on the GPU that measured it and put back in the first GPU's milliseconds (the first run's
/// baseline), so kernels timed on two GPUs are ranked by their ratios. Runs without a baseline
/// keep their times.
fn measured(runs: &[Run]) -> Vec<Measured> {
    let base = |r: &Run| {
        r.baseline
            .as_ref()
            .map(|b| b.median_ms)
            .filter(|b| *b > 0.0)
    };
    let reference = runs.iter().find_map(base);
    runs.iter()
        .flat_map(|r| {
            let scale = match (reference, base(r)) {
                (Some(a), Some(b)) => a / b,
                _ => 1.0,
            };
            r.candidates.iter().map(move |c| Measured {
                spec: c.spec.clone(),
                ms: c.outcome.median_ms().map(|ms| ms * scale),
            })
        })
        .collect()
}

/// The candidates of every run, as one run of the first's provenance (what learning from a
/// sweep's failures reads: a kernel that passed on one GPU counts against a rule learned from a
/// failure on another).
fn joined(runs: &[Run]) -> Option<Run> {
    let first = runs.first()?;
    Some(Run {
        provenance: first.provenance.clone(),
        baseline: first.baseline.clone(),
        candidates: runs.iter().flat_map(|r| r.candidates.clone()).collect(),
        partial: false,
    })
}

/// A sweep's first round: its kind's first candidates (a quick sweep's cut of them), less those
/// the runs `done` of a sweep it resumes measured, compiled and measured (compiled alone without
/// a GPU here), then where nothing passed the kind's retry; the runs so far into the user table
/// as a checkpoint where more rounds follow or the sweep is quick.
fn first_round(
    cx: RealizeCtx,
    sh: Shared,
    problem: &Problem,
    math: MathType,
    key: &TableKey,
    done: Vec<Run>,
) -> Result<Round, ComposeError> {
    let opts = cx.opts;
    let inputs = SweepInputs::new(cx, &lock(sh.tables), key, problem, &done);
    let found = first_candidates(cx, &inputs, &mut lock(sh.steward), problem, math, key)?;
    let (candidates, space) = match found {
        Candidates::Kernels { specs, space } => (unmeasured(specs, &done), space),
        Candidates::None(reason) if done.is_empty() => {
            return Ok(Round::Done(Realized::skipped(reason)))
        }
        Candidates::None(_) => (vec![], None),
    };
    if candidates.is_empty() && done.is_empty() {
        return Ok(Round::Done(Realized::skipped(format!(
            "the {} kind offered no kernel for {}",
            problem.kind().name(),
            key.shape
        ))));
    }
    let dir = sweep_dir(opts, key, "");
    if !cx.gpu {
        return compile_only(cx, &candidates, &dir).map(Round::Done);
    }
    let started = std::time::Instant::now();
    let mut runs = done;
    let mut failures = vec![];
    if !candidates.is_empty() {
        let (more, fails) = measure(cx, problem, math, &candidates, &dir)?;
        merge_runs(&mut runs, more);
        failures = fails;
    }
    if runs
        .iter()
        .flat_map(|r| &r.candidates)
        .all(|c| c.outcome.median_ms().is_none())
    {
        // Nothing survived: the kind (its agent) may propose one more set.
        let seen: Vec<(String, String)> = runs
            .iter()
            .flat_map(|r| &r.candidates)
            .map(|c| (c.kernel.clone(), c.outcome.label().to_string()))
            .collect();
        let mut avoid = inputs.failed.clone();
        avoid.extend(seen.iter().map(|(k, _)| k.clone()));
        let retry = problem.kind().retry(
            problem,
            &mut inputs.cx(cx, math, &mut lock(sh.steward)),
            &seen,
            &avoid,
        );
        if let Some(retry) = retry {
            let (again, more) =
                measure(cx, problem, math, &retry, &sweep_dir(opts, key, "_retry"))?;
            merge_runs(&mut runs, again);
            failures.extend(more);
        }
    }
    if !problem.kind().rounds().is_empty() || cx.quick {
        checkpoint(sh, key, problem, &runs)?;
    }
    Ok(Round::Measured(FirstRound {
        runs,
        failures,
        space,
        seconds: started.elapsed().as_secs_f64(),
    }))
}

/// A sweep's runs so far into the user table, each marked `partial`: a process stopped before
/// the sweep's last round (a timeout, a kill) keeps what it measured, and the next compose on
/// this GPU model resumes from it (`Entry::unfinished_at`); a quick sweep's runs stay so until a
/// full realization resumes it. The sweep's record replaces them (`Entry::merged`). Nothing
/// where no kernel passed.
fn checkpoint(
    sh: Shared,
    key: &TableKey,
    problem: &Problem,
    runs: &[Run],
) -> Result<(), ComposeError> {
    let runs = runs
        .iter()
        .map(|r| Run {
            partial: true,
            ..r.clone()
        })
        .collect();
    if let Some(entry) = Entry::from_runs(key.clone(), problem.clone(), runs) {
        lock(sh.tables).record(entry)?;
    }
    Ok(())
}

/// How many distinct problems of `problems` a full realization here sweeps: those the tables
/// miss, and those whose entry holds a sweep's checkpoints on this GPU model (`unfinished_here`).
pub(super) fn sweeps_left(cx: RealizeCtx, tables: &Tables, problems: &[Problem]) -> usize {
    let here = here(cx);
    let mut seen = BTreeSet::new();
    problems
        .iter()
        .filter_map(|problem| {
            let math = problem.math(cx.opts.precision)?;
            let key = TableKey::of(problem, math, cx.opts.arch);
            let open = match tables.lookup(&key, problem) {
                Lookup::Miss => true,
                Lookup::Exact { entry, .. } => unfinished_here(here.as_ref(), &entry).is_some(),
                Lookup::Bucket { .. } => false,
            };
            (open && seen.insert(key)).then_some(())
        })
        .count()
}

/// A sweep measured ahead: its problem, math and key, and the runs it resumes (none for a new one).
type SweepAhead<'a> = (&'a Problem, MathType, TableKey, Vec<Run>);

/// The problems of `problems` the tables miss, or whose entry holds a sweep's checkpoints here
/// (`here`: `unfinished_here`), whose kind has rounds after the first (so each is a sweep whose
/// next round can compile ahead), each once, in order, with the runs each resumes.
fn sweeps_ahead<'a>(
    tables: &Tables,
    problems: &'a [Problem],
    precision: Precision,
    arch: Arch,
    here: Option<&Provenance>,
) -> Vec<SweepAhead<'a>> {
    let mut seen = BTreeSet::new();
    problems
        .iter()
        .filter(|p| !p.kind().rounds().is_empty())
        .filter_map(|problem| {
            let math = problem.math(precision)?;
            let key = TableKey::of(problem, math, arch);
            let done = match tables.lookup(&key, problem) {
                Lookup::Miss => vec![],
                Lookup::Exact { entry, .. } => unfinished_here(here, &entry)?,
                Lookup::Bucket { .. } => return None,
            };
            seen.insert(key.clone())
                .then_some((problem, math, key, done))
        })
        .collect()
}

/// Measures the first round of every sweep the tables miss whose kind has later rounds (the
/// GEMMs), side by side on the GPUs, then starts compiling all their second rounds (a GEMM's
/// sibling round) in one nvcc batch into the object cache on a thread of `scope`, and returns
/// with the batch under way: on the H100 machine (16 cores) 48 sm90 units built in 88 s where 12
/// took 64, so one batch spares each sweep after the first most of a round. The sweeps then take
/// their first rounds from `ahead` and wait at its gate, which the batch opens, while the
/// patterns that need nothing of it (other kinds, table hits) are measured meanwhile. The batch
/// leaves a core to each GPU's worker, whose timed launches would otherwise wait behind nvcc.
/// Only the built-in agent's proposals may be asked for ahead of their turn (as in `prefetch`);
/// without a GPU that tunes (`cx.gpu`) there is nothing to measure. Compile failures are left to
/// the sweeps to report. Each first round goes into the user table as it is measured, as a
/// checkpoint (`checkpoint`): the table then holds the key, and its sweep takes the round from
/// `ahead` (or, after a crash, from the checkpoint) and records the whole. Rules
/// learned from one sweep's failures reach the sweeps that start after it has recorded them.
pub(super) fn measure_ahead<'s>(
    cx: RealizeCtx<'s>,
    sh: Shared<'s>,
    problems: &[Problem],
    ahead: &'s Ahead,
    scope: &'s std::thread::Scope<'s, '_>,
) -> Result<Option<std::thread::ScopedJoinHandle<'s, Result<(), ComposeError>>>, ComposeError> {
    let opts = cx.opts;
    if !lock(sh.steward).is_builtin() || !cx.gpu || cx.quick {
        return Ok(None);
    }
    let sweeps = sweeps_ahead(
        &lock(sh.tables),
        problems,
        opts.precision,
        opts.arch,
        here(cx).as_ref(),
    );
    if sweeps.len() < 2 {
        return Ok(None);
    }
    nvcc::progress_line(opts.progress, format_args!("measuring ahead: the first rounds of {} sweeps, then their sibling rounds compile together", sweeps.len()));
    let rounds: Vec<Result<Round, ComposeError>> =
        in_parallel(&sweeps, cx.pool.gpus().len(), |(p, math, key, done)| {
            first_round(cx, sh, p, *math, key, done.clone())
        });
    let mut specs: Vec<Spec> = Vec::new();
    let mut first = BTreeMap::new();
    for ((p, math, key, _), round) in sweeps.into_iter().zip(rounds) {
        if let Round::Measured(f) = round? {
            let inputs = SweepInputs::new(cx, &lock(sh.tables), &key, p, &[]);
            let next = p.kind().round(
                0,
                p,
                &measured(&f.runs),
                &inputs.cx(cx, math, &mut lock(sh.steward)),
            );
            specs.extend(next);
            first.insert(key, f);
        }
    }
    *lock(&ahead.keys) = first.keys().cloned().collect();
    *lock(&ahead.first) = first;
    ahead.siblings.close();
    let jobs = opts.jobs.saturating_sub(cx.pool.gpus().len()).max(1);
    Ok(Some(scope.spawn(move || {
        // Opened however the batch ends, so no sweep waits for ever.
        struct Opens<'a>(&'a Gate);
        impl Drop for Opens<'_> {
            fn drop(&mut self) {
                self.0.open();
            }
        }
        let _opens = Opens(&ahead.siblings);
        let batch = Batch {
            folder: "siblings_ahead",
            at_least: 1,
            line: None,
            jobs,
            behind: true,
        };
        compile_ahead(cx, specs, batch).map(|_| ())
    })))
}

/// A sweep: its first round (measured ahead, or here resuming the runs `done`), its kind's later
/// rounds, each adding to the runs, then recorded (with sweep.json and scatter.svg beside the
/// sources). A quick sweep stops after its first round (`quick_record`).
fn realize_sweep(
    cx: RealizeCtx,
    sh: Shared,
    problem: &Problem,
    math: MathType,
    first: Option<FirstRound>,
    done: Vec<Run>,
    ahead: &Ahead,
) -> Result<Realized, ComposeError> {
    let opts = cx.opts;
    let key = TableKey::of(problem, math, opts.arch);
    let first = match first {
        Some(f) => {
            // Its later rounds are in the sibling batch: compiling them here too would race it.
            if ahead.waits(&key) {
                ahead.siblings.wait();
            }
            f
        }
        None => match first_round(cx, sh, problem, math, &key, done)? {
            Round::Measured(f) => f,
            Round::Done(r) => return Ok(r),
        },
    };
    if cx.quick {
        return quick_record(cx, sh, &key, problem, first);
    }
    let FirstRound {
        mut runs,
        mut failures,
        space,
        seconds: first_seconds,
    } = first;
    let dir = sweep_dir(opts, &key, "");
    let started = std::time::Instant::now();
    let kind = problem.kind();
    let inputs = SweepInputs::new(cx, &lock(sh.tables), &key, problem, &[]);
    for (i, suffix) in kind.rounds().iter().enumerate() {
        let variants = kind.round(
            i,
            problem,
            &measured(&runs),
            &inputs.cx(cx, math, &mut lock(sh.steward)),
        );
        // A resumed sweep may have measured a round's kernels before its process stopped.
        let done: BTreeSet<String> = runs
            .iter()
            .flat_map(|r| r.candidates.iter().map(|c| c.kernel.clone()))
            .collect();
        let variants: Vec<Spec> = variants
            .into_iter()
            .filter(|v| !done.contains(&v.kernel_name()))
            .collect();
        if variants.is_empty() {
            continue;
        }
        let (more, fails) = measure(cx, problem, math, &variants, &sweep_dir(opts, &key, suffix))?;
        merge_runs(&mut runs, more);
        failures.extend(fails);
        if i + 1 < kind.rounds().len() {
            checkpoint(sh, &key, problem, &runs)?;
        }
    }
    let seconds = first_seconds + started.elapsed().as_secs_f64();
    // Every candidate with its status, and what the kernels came from (for a GEMM: what was
    // pruned before nvcc and why), next to the sweep's sources. `run` where one GPU measured
    // it all, as before sweeps spread over GPUs.
    let mut record = serde_json::json!({
        "key": key,
        "problem": problem,
        "compile_and_tune_s": seconds,
        "runs": runs,
    });
    if let [run] = runs.as_slice() {
        record["run"] = serde_json::to_value(run).expect("run serializes");
    }
    if kind.learns() {
        if let Some(all) = joined(&runs) {
            record["rules_learned"] = lock(sh.tables).learn(&key, &all)?.into();
        }
    }
    if let Some(space) = space {
        record["space"] = space;
    }
    let _ = crate::atomic::write(
        &dir.join("sweep.json"),
        serde_json::to_string_pretty(&record).expect("run serializes"),
    );
    record_sweep(sh, key, problem.clone(), runs, failures, &dir)
}

/// A quick sweep's end: its first candidates measured, and left in the user table as its
/// checkpoint (`first_round`), which a full realization resumes; the entry as it stands there
/// now. Left to torch, naming every candidate's outcome, where none passed and the table holds no
/// entry for the key. Its sweep.json says it was quick; the full sweep's replaces it.
fn quick_record(
    cx: RealizeCtx,
    sh: Shared,
    key: &TableKey,
    problem: &Problem,
    first: FirstRound,
) -> Result<Realized, ComposeError> {
    let FirstRound {
        runs,
        failures,
        space,
        seconds,
    } = first;
    let all: Vec<&CandidateResult> = runs.iter().flat_map(|r| &r.candidates).collect();
    let failed = all
        .iter()
        .filter(|c| c.outcome.median_ms().is_none())
        .count();
    let mut record = serde_json::json!({
        "key": key,
        "problem": problem,
        "quick": true,
        "compile_and_tune_s": seconds,
        "runs": runs,
    });
    if let Some(space) = space {
        record["space"] = space;
    }
    let _ = crate::atomic::write(
        &sweep_dir(cx.opts, key, "").join("sweep.json"),
        serde_json::to_string_pretty(&record).expect("run serializes"),
    );
    let entry = lock(sh.tables).user.get(key).cloned();
    let how = match &entry {
        Some(_) => Realization::Tuned {
            candidates: all.len(),
            failed,
            quick: true,
        },
        None => Realization::Skipped {
            reason: format!(
                "no candidate passed verification: {}",
                all.iter()
                    .map(|c| format!("{} {}", c.kernel, c.outcome.label()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
    };
    Ok(Realized {
        how,
        entry,
        failures,
        cut: true,
        lost: None,
    })
}

/// Without a GPU that runs them a sweep ends once its candidates are compiled.
fn compile_only(cx: RealizeCtx, candidates: &[Spec], dir: &Path) -> Result<Realized, ComposeError> {
    let RealizeCtx { opts, tc, .. } = cx;
    let built = cx
        .compiler
        .library(tc, candidates, "libsweep.so", &opts.sweep_build(dir))?;
    Ok(Realized {
        how: Realization::Compiled {
            candidates: candidates.len(),
            failed: built.failures.len(),
        },
        entry: None,
        failures: built.failures,
        cut: cx.quick,
        lost: None,
    })
}

/// A finished sweep's runs into the user table (its scatter plot beside the sources), and the
/// entry as it stands there now; left to torch, naming every candidate's outcome, when none passed.
fn record_sweep(
    sh: Shared,
    key: TableKey,
    problem: Problem,
    runs: Vec<Run>,
    failures: Vec<CompileFailure>,
    dir: &Path,
) -> Result<Realized, ComposeError> {
    let runs: Vec<Run> = runs
        .into_iter()
        .map(|r| Run {
            partial: false,
            ..r
        })
        .collect();
    let all: Vec<&CandidateResult> = runs.iter().flat_map(|r| &r.candidates).collect();
    let n = all.len();
    let failed = all
        .iter()
        .filter(|c| c.outcome.median_ms().is_none())
        .count();
    let summary = all
        .iter()
        .map(|c| format!("{} {}", c.kernel, c.outcome.label()))
        .collect::<Vec<_>>()
        .join(", ");
    let Some(entry) = Entry::from_runs(key.clone(), problem, runs) else {
        return Ok(Realized {
            how: Realization::Skipped {
                reason: format!("no candidate passed verification: {summary}"),
            },
            entry: None,
            failures,
            cut: false,
            lost: None,
        });
    };
    let _ = crate::atomic::write(
        &dir.join("scatter.svg"),
        crate::bench::plot::scatter_svg(&entry),
    );
    let mut tables = lock(sh.tables);
    tables.record(entry)?;
    let merged = tables.user.get(&key).cloned();
    Ok(Realized {
        how: Realization::Tuned {
            candidates: n,
            failed,
            quick: false,
        },
        entry: merged,
        failures,
        cut: false,
        lost: None,
    })
}

/// Leaves a winner slower than torch to torch, unless the options keep it.
pub(super) fn finish(opts: &Options, r: &mut Realized) {
    if let Some(e) = r
        .entry
        .as_ref()
        .filter(|e| !opts.keep_slower && e.loses_to_torch())
    {
        r.how = Realization::Skipped {
            reason: format!(
                "the winner {} ({:.4} ms) is slower than torch ({:.4} ms); --keep-slower substitutes it anyway",
                e.winner,
                e.winner_ms,
                e.baseline_ms().unwrap_or_default()
            ),
        };
        r.lost = r.entry.take().map(Box::new);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A winner slower than torch is left to torch, and the entry that says so is kept beside
    /// (`lost`): compose's small rows read torch's win at few rows from it.
    #[test]
    fn finish_leaves_a_slower_winner_to_torch_and_keeps_its_entry() {
        let kernels = six_kernels();
        let key = TableKey::of(&Problem::from(problem()), MathType::Tf32, Arch::Sm90);
        let mut entry = Entry::from_runs(key, problem(), two_gpu_runs(&kernels)).unwrap();
        entry.winner_ms = 2.0;
        assert!(entry.loses_to_torch());
        let realized = |entry: &Entry| Realized {
            how: Realization::Tuned {
                candidates: 6,
                failed: 1,
                quick: false,
            },
            entry: Some(entry.clone()),
            failures: vec![],
            cut: false,
            lost: None,
        };
        let mut opts = crate::compose::test_options();
        let mut r = realized(&entry);
        finish(&opts, &mut r);
        assert!(
            matches!(&r.how, Realization::Skipped { reason } if reason.contains("slower than torch"))
        );
        assert!(r.entry.is_none());
        assert_eq!(r.lost.as_deref(), Some(&entry));
        opts.keep_slower = true;
        let mut kept = realized(&entry);
        finish(&opts, &mut kept);
        assert!(kept.entry.is_some() && kept.lost.is_none());
    }

    #[test]
    fn a_light_sweep_takes_at_most_four_first_candidates_and_no_later_rounds() {
        let mut opts = crate::compose::test_options();
        opts.refine = 4;
        opts.max_candidates = None;
        let full = Effort::of(&opts, false, false, false);
        assert_eq!(
            (full.max_candidates, full.refine, full.cut),
            (None, 4, None)
        );
        let light = Effort::of(&opts, true, false, false);
        assert_eq!(
            (light.max_candidates, light.refine),
            (Some(LIGHT_BUDGET), 0)
        );
        // --candidates below the light budget stands.
        opts.max_candidates = Some(2);
        assert_eq!(
            Effort::of(&opts, true, false, false).max_candidates,
            Some(2)
        );
        opts.max_candidates = Some(8);
        assert_eq!(
            Effort::of(&opts, true, false, false).max_candidates,
            Some(LIGHT_BUDGET)
        );
        assert_eq!(
            Effort::of(&opts, false, false, false).max_candidates,
            Some(8)
        );
    }

    /// A quick sweep derives the first round a full one would (so the full one resumes it) and
    /// measures `QUICK_CANDIDATES` of it, fewer where --candidates asks for fewer, with no
    /// later round.
    #[test]
    fn a_quick_sweep_cuts_the_full_first_round_to_its_first_candidates() {
        let mut opts = crate::compose::test_options();
        opts.max_candidates = None;
        let quick = Effort::of(&opts, false, true, false);
        assert_eq!(
            (quick.max_candidates, quick.refine, quick.cut),
            (None, 0, Some(QUICK_CANDIDATES))
        );
        let light = Effort::of(&opts, true, true, false);
        assert_eq!(
            (light.max_candidates, light.cut),
            (Some(LIGHT_BUDGET), Some(QUICK_CANDIDATES))
        );
        opts.max_candidates = Some(1);
        assert_eq!(Effort::of(&opts, false, true, false).cut, Some(1));
        // A single measures one candidate of the same first round; a full sweep ignores it.
        opts.max_candidates = None;
        let single = Effort::of(&opts, false, true, true);
        assert_eq!((single.max_candidates, single.cut), (None, Some(1)));
        assert_eq!(Effort::of(&opts, false, false, true).cut, None);
    }

    /// The quick phase's lines name the count it measures: --candidates 1 says one candidate.
    #[test]
    fn the_quick_phase_says_how_many_candidates_it_measures() {
        assert_eq!(quick_words(quick_count(None)), "the first 2 candidates");
        assert_eq!(quick_words(quick_count(Some(1))), "the first candidate");
        assert_eq!(quick_words(quick_count(Some(8))), "the first 2 candidates");
        assert_eq!(
            quick_batch_words(2, 9, 0),
            "the first 2 candidates of the 9 distinct problem(s) the tables miss"
        );
        assert_eq!(
            quick_batch_words(2, 9, 3),
            "the first 2 candidates of 6 and the first candidate of 3 of the 9 distinct problem(s) the tables miss"
        );
        assert_eq!(
            quick_batch_words(2, 9, 9),
            "the first candidate of the 9 distinct problem(s) the tables miss"
        );
    }

    /// A quick sweep takes the nearest table winners and the estimate's best of the kind's first
    /// round in turn; a winner the first round does not hold is taken only where the kind admits
    /// it.
    #[test]
    fn a_quick_sweep_takes_the_nearby_winner_and_the_estimates_best() {
        let spec = |i: usize| crate::kinds::fake::spec(&format!("k{i}"), Arch::Sm90);
        let specs: Vec<Spec> = (0..6).map(spec).collect();
        let names = |v: Vec<Spec>| v.iter().map(Spec::name).collect::<Vec<_>>();
        let none = |_: &Spec| false;
        let any = |_: &Spec| true;
        assert_eq!(names(quick_cut(specs.clone(), &[], 2, none)), ["k0", "k1"]);
        let near = [spec(4), spec(2)];
        assert_eq!(
            names(quick_cut(specs.clone(), &near, 2, none)),
            ["k4", "k0"]
        );
        assert_eq!(
            names(quick_cut(specs.clone(), &near, 4, none)),
            ["k4", "k0", "k2", "k1"]
        );
        // The nearest winner is the estimate's best: the next one by estimate joins it.
        let best = [spec(0)];
        assert_eq!(
            names(quick_cut(specs.clone(), &best, 2, none)),
            ["k0", "k1"]
        );
        // Outside the first round: taken where the kind admits it, else the estimate's order.
        let outside = [spec(9)];
        assert_eq!(
            names(quick_cut(specs.clone(), &outside, 2, none)),
            ["k0", "k1"]
        );
        assert_eq!(
            names(quick_cut(specs.clone(), &outside, 2, any)),
            ["k9", "k0"]
        );
        assert_eq!(names(quick_cut(specs.clone(), &outside, 1, any)), ["k9"]);
        // An admitted outsider never displaces the estimate's own beyond its turn.
        assert_eq!(
            names(quick_cut(specs.clone(), &[spec(9), spec(8)], 3, |s| s
                .name()
                == "k8")),
            ["k8", "k0", "k1"]
        );
        assert_eq!(
            names(quick_cut(specs[..1].to_vec(), &near, 2, none)),
            ["k0"]
        );
        assert_eq!(names(quick_cut(vec![], &outside, 2, any)), ["k9"]);
        assert!(quick_cut(vec![], &near, 2, none).is_empty());
    }
    use crate::kinds::gemm::space::gemm_candidates;
    use crate::kinds::gemm::{GemmLayout, GemmProblem};
    use crate::table::tests::{ok, timing};
    use crate::types::DType;

    fn problem() -> GemmProblem {
        GemmProblem {
            m: 65536,
            n: 768,
            k: 768,
            layout: GemmLayout::Rcr,
            dtype: DType::F32,
            bias: true,
            batch: 1,
            epilogue: None,
            padded_from: None,
        }
    }

    fn run(candidates: Vec<CandidateResult>) -> Run {
        Run {
            partial: false,
            provenance: crate::table::tests::provenance("H100"),
            baseline: None,
            candidates,
        }
    }

    #[test]
    fn sweeps_measured_ahead_are_the_gemm_misses_each_once_in_order() {
        let a = problem();
        let b = GemmProblem {
            n: 2304,
            ..a.clone()
        };
        let c = GemmProblem {
            k: 3072,
            ..a.clone()
        };
        let math = MathType::Tf32;
        // b has a winner in the user table: a hit, no sweep.
        let kb = gemm_candidates(&b, math, Arch::Sm90)[0].clone();
        let hit = Problem::from(b.clone());
        let entry = Entry::from_runs(
            TableKey::of(&hit, math, Arch::Sm90),
            hit.clone(),
            vec![run(vec![ok(&kb, 0.5)])],
        )
        .unwrap();
        let mut tables = Tables {
            user_path: PathBuf::from("/nonexistent/user.json"),
            user: crate::table::Table::new(),
            shipped: crate::table::Table::new(),
        };
        tables.user.insert_merged(entry);
        let problems = [
            Problem::from(c.clone()),
            hit,
            Problem::from(a.clone()),
            Problem::from(c.clone()),
        ];
        let sweeps = sweeps_ahead(&tables, &problems, Precision::Tf32, Arch::Sm90, None);
        let shapes: Vec<String> = sweeps.iter().map(|(_, _, k, _)| k.shape.clone()).collect();
        assert_eq!(shapes, [c.shape_key(), a.shape_key()]);
        assert!(sweeps
            .iter()
            .all(|(_, m, _, done)| *m == math && done.is_empty()));
        // b's entry a checkpoint measured here: its sweep is resumed ahead, from those runs.
        let h100 = crate::table::tests::provenance("H100");
        let mut partial = run(vec![ok(&kb, 0.5)]);
        partial.partial = true;
        let hit = Problem::from(b.clone());
        tables.user = crate::table::Table::new();
        tables.user.insert_merged(
            Entry::from_runs(
                TableKey::of(&hit, math, Arch::Sm90),
                hit,
                vec![partial.clone()],
            )
            .unwrap(),
        );
        let sweeps = sweeps_ahead(&tables, &problems, Precision::Tf32, Arch::Sm90, Some(&h100));
        let shapes: Vec<String> = sweeps.iter().map(|(_, _, k, _)| k.shape.clone()).collect();
        assert_eq!(shapes, [c.shape_key(), b.shape_key(), a.shape_key()]);
        assert_eq!(sweeps[1].3, vec![partial]);
        // Elsewhere (another GPU model) the checkpoint is no sweep to resume.
        let h200 = crate::table::tests::provenance("H200");
        assert_eq!(
            sweeps_ahead(&tables, &problems, Precision::Tf32, Arch::Sm90, Some(&h200)).len(),
            2
        );
    }

    /// Six candidates of `problem()` measured on two fake H100s, GPU1 1.3x slower at everything
    /// (torch too), GPU0's worker dying on the fifth: the table runs of that measurement.
    fn two_gpu_runs(kernels: &[Spec]) -> Vec<Run> {
        use crate::tune::fake::{fake_pool, request, FakeGpus};
        // On a GPU of speed 1: the fourth is the fastest, by 0.85 over torch's 1.0.
        let ms = [1.00, 0.90, 0.95, 0.85, 1.10, 0.92];
        let mut fake = FakeGpus::new(ms.iter().map(|&m| Some(m)).collect(), 1.0, vec![1.0, 1.3]);
        fake.crashes = vec![(0, 4)];
        let (pool, _) = fake_pool(fake);
        let results = pool
            .measure(&request((0..6).collect()), &|_| {}, &|_| {})
            .unwrap();
        runs_of(results, kernels, vec![], &pool.gpus()[0].info, &|d| {
            Provenance {
                device: d.clone(),
                ..crate::table::tests::provenance("H100")
            }
        })
    }

    fn six_kernels() -> Vec<Spec> {
        let k: Vec<Spec> = gemm_candidates(&problem(), MathType::Tf32, Arch::Sm90)
            .into_iter()
            .take(6)
            .map(Spec::from)
            .collect();
        assert_eq!(k.len(), 6);
        k
    }

    #[test]
    fn a_sweep_dealt_over_two_gpus_is_won_by_the_best_ratio_over_torch_on_its_own_gpu() {
        let kernels = six_kernels();
        let runs = two_gpu_runs(&kernels);
        let key = TableKey::of(&Problem::from(problem()), MathType::Tf32, Arch::Sm90);
        let entry = Entry::from_runs(key.clone(), problem(), runs.clone()).unwrap();
        assert_eq!(entry.runs.len(), 2, "a run per GPU");
        for (i, r) in entry.runs.iter().enumerate() {
            assert_eq!(r.provenance.device.index, Some(i));
            assert_eq!(
                r.provenance.device.uuid.as_deref(),
                Some(format!("GPU-fake-{i}").as_str())
            );
            let slow = [1.0, 1.3][i];
            assert_eq!(
                r.baseline.as_ref().unwrap().median_ms,
                slow,
                "torch on GPU{i}"
            );
        }
        // Dealt round-robin: GPU0 timed 0, 2 (4 died), GPU1 1, 3, 5. By milliseconds the third
        // (0.95 on GPU0) would win over the fourth (1.105 on the slower GPU1); by ratio over
        // torch on its own GPU the fourth wins, as it does on one GPU.
        assert_eq!(entry.winner, kernels[3].name());
        assert_eq!(entry.winner_provenance().device.index, Some(1));
        assert!((entry.winner_ms - 0.85 * 1.3).abs() < 1e-9);
        assert_eq!(entry.baseline_ms(), Some(1.3));
        assert!(!entry.loses_to_torch());
        let fault = entry.runs[0]
            .candidates
            .iter()
            .find(|c| c.kernel == kernels[4].name())
            .expect("the crashed variant is recorded");
        assert_eq!(fault.outcome.label(), "fault");
        let judged: usize = entry.runs.iter().map(|r| r.candidates.len()).sum();
        assert_eq!(judged, 6, "every variant judged once");
        // The same measurement again: the same runs, the same winner.
        assert_eq!(two_gpu_runs(&kernels), runs);
        // The later rounds rank the kernels by the same ratios (in GPU0's milliseconds).
        let m = measured(&runs);
        let best = m
            .iter()
            .filter_map(|k| k.ms.map(|ms| (ms, k.spec.name())))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap();
        assert_eq!(best.1, kernels[3].name());
        assert!((best.0 - 0.85).abs() < 1e-9);
    }

    #[test]
    fn a_later_round_joins_each_gpus_own_run() {
        let kernels = six_kernels();
        let mut runs = two_gpu_runs(&kernels);
        let base1 = runs[1].baseline.clone();
        let later = |index: usize, ms: f64| Run {
            partial: false,
            provenance: Provenance {
                device: crate::tune::fake::gpu(index, "H100", (9, 0)).info,
                ..crate::table::tests::provenance("H100")
            },
            baseline: Some(timing(9.0)),
            candidates: vec![ok(
                gemm_candidates(&problem(), MathType::Tf32, Arch::Sm90)
                    .last()
                    .unwrap(),
                ms,
            )],
        };
        merge_runs(&mut runs, vec![later(1, 0.5), later(2, 0.4)]);
        assert_eq!(runs.len(), 3, "a GPU new to the sweep brings its run");
        assert_eq!(runs[1].candidates.len(), 4);
        assert_eq!(
            runs[1].baseline, base1,
            "a GPU's rounds share its first baseline"
        );
        assert_eq!(runs[2].candidates.len(), 1);
        assert_eq!(runs[2].baseline.as_ref().unwrap().median_ms, 9.0);
    }

    /// What a GPU model times of a table entry before using it: the leading kernels where any of
    /// them was never tried there, nothing once a run there tried them all.
    #[test]
    fn a_gpu_model_times_the_leading_kernels_it_never_tried() {
        use crate::table::tests::{entry_against, provenance, two_gpus};
        let names = |specs: &[Spec]| specs.iter().map(|s| s.kernel_name()).collect::<Vec<_>>();
        let kernels = gemm_candidates(
            &crate::table::tests::problem(128),
            MathType::Tf32,
            Arch::Sm90,
        );
        let e = two_gpus(); // kernel 0 timed on the H200 only, kernel 2 on the H100 only
        let h100 = provenance("NVIDIA H100 80GB HBM3");
        let (on, leading) = to_time_here(Some(&h100), &e).expect("kernel 0 never ran here");
        assert_eq!(on, "NVIDIA H200 with CUTLASS 4.2.0");
        assert_eq!(names(&leading), vec![kernels[0].name(), kernels[2].name()]);
        assert!(
            to_time_here(None, &e).is_none(),
            "nothing to time without a GPU"
        );
        // The winner ran here; a runner-up never did: the hit names where that one was measured.
        let won_here = entry_against(128, 0, 0.9, Some(1.0), "NVIDIA H200").merged(&entry_against(
            128,
            2,
            0.3,
            Some(0.9),
            "NVIDIA H100 80GB HBM3",
        ));
        assert_eq!(won_here.winner, kernels[2].name());
        let (on, leading) = to_time_here(Some(&h100), &won_here).expect("kernel 0 never ran here");
        assert_eq!(on, "NVIDIA H200 with CUTLASS 4.2.0");
        assert_eq!(names(&leading), vec![kernels[2].name(), kernels[0].name()]);
        assert!(
            to_time_here(Some(&provenance("NVIDIA A100-SXM4-80GB")), &e).is_some(),
            "a model that ran none of them"
        );

        // A run here that tried both (one of them failing counts as tried): used as it stands,
        // by this model's runs.
        let mut both = entry_against(128, 0, 0.7, Some(0.9), "NVIDIA H100 80GB HBM3");
        let two = entry_against(128, 2, 0.6, Some(0.9), "NVIDIA H100 80GB HBM3");
        both.runs[0]
            .candidates
            .extend(two.runs[0].candidates.iter().cloned());
        let merged = e.merged(&both);
        assert!(to_time_here(Some(&h100), &merged).is_none());
        let used = for_here(Some(&h100), merged.clone());
        assert_eq!(used.winner, kernels[2].name(), "this model's own ranking");
        let other_cutlass = Provenance {
            cutlass: "4.3.0".into(),
            ..h100.clone()
        };
        assert!(to_time_here(Some(&other_cutlass), &merged).is_some());
    }

    /// A hit's leading kernels that lose to torch here earn a sweep only where some kernel beat
    /// torch where the entry was measured.
    #[test]
    fn a_hit_that_lost_to_torch_everywhere_is_not_swept_again() {
        use crate::table::tests::entry_against;
        let h100 = "NVIDIA H100 80GB HBM3";
        // (kernel, ms, torch's ms) on the H200, then the same kernel on the H100.
        let won_there = entry_against(128, 0, 0.8, Some(1.0), "NVIDIA H200");
        let lost_there = entry_against(128, 0, 1.2, Some(1.0), "NVIDIA H200");
        let loses_here = entry_against(128, 0, 1.3, Some(1.0), h100);
        let wins_here = entry_against(128, 0, 0.9, Some(1.0), h100);
        let here = crate::table::tests::provenance(h100);
        let fresh = |before: &Entry, run: &Entry| for_here(Some(&here), before.merged(run));
        assert!(sweep_here(&won_there, &fresh(&won_there, &loses_here)));
        assert!(!sweep_here(&won_there, &fresh(&won_there, &wins_here)));
        assert!(!sweep_here(&lost_there, &fresh(&lost_there, &loses_here)));
        assert!(!sweep_here(&lost_there, &fresh(&lost_there, &wins_here)));
        // Without torch's time where it was measured, the entry is not known to lose: swept.
        let unknown = entry_against(128, 0, 1.2, None, "NVIDIA H200");
        assert!(sweep_here(&unknown, &fresh(&unknown, &loses_here)));
    }

    /// A table hit times the kernel families its entry never tried (passing or failing), four of
    /// each, from the kind's space now: a 1x1 convolution measured before the GEMM family
    /// existed gets the GEMM kernels timed; once a run tried that family, nothing more; a 3x3
    /// convolution has no family its runs lack; a kind that does not look (GEMM) times nothing.
    #[test]
    fn a_hit_times_the_kernel_families_its_entry_never_tried() {
        use crate::kinds::conv::{candidates, ConvAct, ConvProblem, ConvSpec};
        let p = ConvProblem {
            images: 32,
            height: 56,
            width: 56,
            in_channels: 64,
            out_channels: 256,
            filter: [1, 1],
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
            dtype: DType::Bf16,
            bias: true,
            residual: true,
            act: Some(ConvAct::Relu),
        };
        let math = MathType::Bf16;
        let space = |p: &ConvProblem| -> Vec<Spec> {
            Problem::from(p.clone())
                .kind()
                .space_now(&Problem::from(p.clone()), math, Arch::Sm90)
        };
        let entry_of = |p: &ConvProblem, kernels: Vec<(ConvSpec, Outcome)>| {
            let problem = Problem::from(p.clone());
            Entry::from_runs(
                TableKey::of(&problem, math, Arch::Sm90),
                problem,
                vec![run(kernels
                    .into_iter()
                    .map(|(k, outcome)| CandidateResult {
                        kernel: k.name(),
                        spec: k.into(),
                        outcome,
                    })
                    .collect())],
            )
            .unwrap()
        };
        let ok = |ms: f64| {
            ok(
                &gemm_candidates(&problem(), MathType::Tf32, Arch::Sm90)[0],
                ms,
            )
            .outcome
        };
        let all = candidates(&p, math, Arch::Sm90).unwrap();
        let (gemm_family, builder): (Vec<ConvSpec>, Vec<ConvSpec>) =
            all.into_iter().partition(|s| s.conv_gemm.is_some());
        // Measured when the conv builder's kernels were all there were.
        let before = entry_of(
            &p,
            vec![
                (builder[0].clone(), ok(0.12)),
                (builder[1].clone(), ok(0.13)),
            ],
        );
        let new = untried_families(&before, space(&p));
        assert_eq!(new.len(), FAMILY_KERNELS);
        let names: Vec<String> = new.iter().map(Spec::kernel_name).collect();
        let leading: Vec<String> = gemm_family[..FAMILY_KERNELS]
            .iter()
            .map(ConvSpec::name)
            .collect();
        assert_eq!(
            names, leading,
            "the GEMM family's leading kernels, in the sweep's order"
        );
        assert!(new.iter().all(|s| s.family() == "conv_sm90_gemm"));
        // One of them tried, even failing: the family is tried.
        let after = entry_of(
            &p,
            vec![
                (builder[0].clone(), ok(0.12)),
                (gemm_family[5].clone(), Outcome::CannotImplement),
            ],
        );
        assert!(untried_families(&after, space(&p)).is_empty());
        // A 3x3 convolution's space is the builder's alone, which its runs tried.
        let three = ConvProblem {
            filter: [3, 3],
            padding: [1, 1],
            in_channels: 64,
            out_channels: 64,
            residual: false,
            ..p.clone()
        };
        let first = candidates(&three, math, Arch::Sm90).unwrap()[0].clone();
        let e3 = entry_of(&three, vec![(first, ok(0.06))]);
        assert!(untried_families(&e3, space(&three)).is_empty());
        // Attention at head dim 256, measured when only sm80 took it (Gemma's entry from
        // before): the sm90 kernels that take it now are timed.
        use crate::kinds::attention::{
            candidates as attention_candidates, AttentionOrigin, AttentionProblem,
        };
        let a = AttentionProblem {
            origin: AttentionOrigin::Sdpa,
            batch: 2,
            heads: 8,
            seq_q: 1024,
            seq_k: 1024,
            head_dim: 256,
            dtype: DType::Bf16,
            causal: true,
            kv_heads: Some(1),
            padded: false,
            masked: true,
            bias: None,
            mask_strided: false,
        };
        let ap = Problem::from(a.clone());
        let (sm80, sm90): (Vec<_>, Vec<_>) = attention_candidates(&a, math, Arch::Sm90)
            .into_iter()
            .partition(|s| s.family.is_sm80());
        assert!(!sm90.is_empty() && !sm80.is_empty());
        let old = Entry::from_runs(
            TableKey::of(&ap, math, Arch::Sm90),
            ap.clone(),
            vec![run(vec![CandidateResult {
                kernel: sm80[0].name(),
                spec: sm80[0].clone().into(),
                outcome: ok(0.1085),
            }])],
        )
        .unwrap();
        let new = untried_families(&old, ap.kind().space_now(&ap, math, Arch::Sm90));
        let want: Vec<String> = sm90.iter().take(FAMILY_KERNELS).map(|s| s.name()).collect();
        assert_eq!(new.iter().map(Spec::kernel_name).collect::<Vec<_>>(), want);
        // GEMMs do not look.
        let g = Problem::from(problem());
        assert!(g
            .kind()
            .space_now(&g, MathType::Tf32, Arch::Sm90)
            .is_empty());
    }
}
