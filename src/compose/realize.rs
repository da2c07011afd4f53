//! Realization of one problem of any kind: a pattern-table hit (re-verified where the GPU or
//! CUTLASS version differs), a bucket neighbour's winner, or a sweep, recorded in the user table.
//! A sweep is its kind's rounds (`kinds::Kind::candidates`, `retry`, `rounds`): each round's
//! kernels compiled into one library and verified and timed in the crash-resuming worker, the
//! later rounds derived from what the earlier ones measured (a GEMM's cluster shapes and launch
//! knobs of its fastest kernels).

use super::*;

/// What every realization of one command shares: its options, the toolchain, and whether a GPU
/// here tunes for the options' arch (`tunes_here`, found once by the caller, so that every sweep
/// agrees with it).
#[derive(Clone, Copy)]
pub struct RealizeCtx<'a> {
    pub opts: &'a Options,
    pub tc: &'a Toolchain,
    pub gpu: bool,
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

/// Where a table winner was measured, when that is not here (another GPU or CUTLASS): such a
/// winner is re-verified before use. None without a GPU here (`here` is None).
fn measured_elsewhere(here: Option<&Provenance>, entry: &Entry) -> Option<String> {
    let prov = entry.winner_provenance();
    here.filter(|h| h.device.name != prov.device.name || h.cutlass != prov.cutlass)
        .map(|_| format!("{} with CUTLASS {}", prov.device.name, prov.cutlass))
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
    cx: RealizeCtx,
    problem: &Problem,
    math: MathType,
    candidates: &[Spec],
    dir: &Path,
) -> Result<(Run, Vec<CompileFailure>), ComposeError> {
    let RealizeCtx { opts, tc, .. } = cx;
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
/// bucket hit re-verified on this shape (and swept after all where it loses to torch), or a full
/// sweep, taking its first round from `ahead` where `measure_ahead` measured it. Every new
/// measurement goes into the user table at once, so a later failure loses no tuning result.
pub fn realize(
    cx: RealizeCtx,
    tables: &mut Tables,
    steward: &mut Steward,
    problem: &Problem,
    ahead: &mut Ahead,
) -> Result<Realized, ComposeError> {
    let RealizeCtx { opts, tc, .. } = cx;
    let Some(math) = problem.math(opts.precision) else {
        return Ok(Realized::skipped(format!(
            "no kernel family computes {} under precision {}; use --precision tf32",
            problem.dtype(),
            opts.precision
        )));
    };
    let key = TableKey::of(problem, math, opts.arch);
    let mut sweep = |tables: &mut Tables, steward: &mut Steward| {
        let first = ahead.0.remove(&key);
        realize_sweep(cx, tables, steward, problem, math, first)
    };
    let here = if cx.gpu { Some(provenance(tc)) } else { None };
    match tables.lookup(&key, problem) {
        Lookup::Exact { entry, table } => {
            if let Some(on) = measured_elsewhere(here.as_ref(), &entry) {
                return match reverify(cx, tables, problem, math, &entry.winner_spec, "_reverify")? {
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
        Lookup::Bucket { entry, table } if cx.gpu => {
            match reverify(cx, tables, problem, math, &entry.winner_spec, "_bucket")? {
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
                    sweep(tables, steward)
                }
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
fn reverify(
    cx: RealizeCtx,
    tables: &mut Tables,
    problem: &Problem,
    math: MathType,
    winner: &Spec,
    what: &str,
) -> Result<Option<(Entry, Vec<CompileFailure>)>, ComposeError> {
    let opts = cx.opts;
    let key = &TableKey::of(problem, math, opts.arch);
    let dir = sweep_dir(opts, key, what);
    let (run, failures) = measure(cx, problem, math, std::slice::from_ref(winner), &dir)?;
    let Some(fresh) = Entry::from_runs(key.clone(), problem.clone(), vec![run]) else {
        return Ok(None);
    };
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
}

impl SweepInputs {
    fn new(cx: RealizeCtx, tables: &Tables, key: &TableKey) -> SweepInputs {
        let cutlass = cx.tc.cutlass_version();
        let mut space = cx.opts.space.clone();
        if let Some(n) = cx.opts.max_candidates {
            space.budget = n.max(1);
        }
        SweepInputs {
            scope: key.scope(&cutlass),
            rules: tables.rules(),
            failed: failed_kernels(tables, key),
            cutlass,
            space,
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
            max_candidates: cx.opts.max_candidates,
            refine: cx.opts.refine,
            steward,
        }
    }
}

/// The kernels a sweep of `problem` compiles first (its kind's, `Kind::candidates`), or why there
/// are none.
fn first_candidates(
    cx: RealizeCtx,
    inputs: &SweepInputs,
    steward: &mut Steward,
    problem: &Problem,
    math: MathType,
    key: &TableKey,
) -> Result<Candidates, ComposeError> {
    problem
        .kind()
        .candidates(problem, &mut inputs.cx(cx, math, steward))
        .map_err(|detail| ComposeError::Tune {
            key: key.to_string(),
            detail,
        })
}

/// Compiles the first candidates of every problem the tables cannot answer, and the winners that
/// `realize` will re-verify here (measured on another GPU or CUTLASS, or a bucket neighbour's), in
/// one parallel build into the object cache, before the patterns run one by one: one nvcc unit
/// takes the better part of a minute and a single sweep or re-verification rarely fills every
/// core, so pooling them shortens a cold compose by about the number of patterns times a unit (a
/// Llama-style model from a table measured on another GPU spent 50 s a pattern re-verifying one
/// kernel at a time). Only the built-in agent's candidates are known in advance; an external
/// agent's sweeps compile as they come. Failures are left to the sweeps to report.
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
    let here = if cx.gpu {
        Some(provenance(cx.tc))
    } else {
        None
    };
    for problem in problems {
        let Some(math) = problem.math(opts.precision) else {
            continue;
        };
        let key = TableKey::of(problem, math, opts.arch);
        match tables.lookup(&key, problem) {
            Lookup::Miss => {}
            Lookup::Exact { entry, .. } => {
                if measured_elsewhere(here.as_ref(), &entry).is_some() {
                    again += 1;
                    specs.push(entry.winner_spec.clone());
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
        let inputs = SweepInputs::new(cx, tables, &key);
        let found = first_candidates(cx, &inputs, &mut builtin, problem, math, &key)?;
        missed += 1;
        if let Candidates::Kernels { specs: first, .. } = found {
            specs.extend(first);
        }
    }
    let line = format!(
        "prefetch: compiling together the first candidates of the {missed} pattern(s) the tables miss and the winners of the {again} to re-verify here"
    );
    compile_ahead(cx, specs, "prefetch", 2, Some(&line))
}

/// Compiles `specs`, each kernel once, into the object cache in one nvcc batch under
/// sweeps/`folder`, saying `line` first; nothing when fewer than `at_least` kernels remain.
/// Failures are left to the sweeps that meet them to report.
fn compile_ahead(
    cx: RealizeCtx,
    mut specs: Vec<Spec>,
    folder: &str,
    at_least: usize,
    line: Option<&str>,
) -> Result<(), ComposeError> {
    let mut seen = BTreeSet::new();
    specs.retain(|s| seen.insert(s.kernel_name()));
    if specs.is_empty() || specs.len() < at_least {
        return Ok(());
    }
    if let Some(line) = line {
        nvcc::progress_line(cx.opts.progress, format_args!("{line}"));
    }
    let dir = cx.opts.out_dir.join("sweeps").join(folder);
    nvcc::compile_objects(cx.tc, &specs, &cx.opts.build(&dir)).map_err(ComposeError::from)?;
    Ok(())
}

/// A sweep's first round: its kernels measured, with what they came from.
pub(super) struct FirstRound {
    run: Run,
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

/// First rounds measured ahead of their sweeps' turns, by table key (`measure_ahead`); empty
/// where a problem is realized on its own.
#[derive(Default)]
pub struct Ahead(BTreeMap<TableKey, FirstRound>);

/// Every kernel a run measured, as a kind's later rounds read it.
fn measured(run: &Run) -> Vec<Measured> {
    run.candidates
        .iter()
        .map(|c| Measured {
            spec: c.spec.clone(),
            ms: c.outcome.median_ms(),
        })
        .collect()
}

fn first_round(
    cx: RealizeCtx,
    tables: &Tables,
    steward: &mut Steward,
    problem: &Problem,
    math: MathType,
    key: &TableKey,
) -> Result<Round, ComposeError> {
    let opts = cx.opts;
    let inputs = SweepInputs::new(cx, tables, key);
    let (candidates, space) = match first_candidates(cx, &inputs, steward, problem, math, key)? {
        Candidates::Kernels { specs, space } => (specs, space),
        Candidates::None(reason) => return Ok(Round::Done(Realized::skipped(reason))),
    };
    let dir = sweep_dir(opts, key, "");
    if !cx.gpu {
        return compile_only(cx, &candidates, &dir).map(Round::Done);
    }
    let started = std::time::Instant::now();
    let (mut run, mut failures) = measure(cx, problem, math, &candidates, &dir)?;
    if run
        .candidates
        .iter()
        .all(|c| c.outcome.median_ms().is_none())
    {
        // Nothing survived: the kind (its agent) may propose one more set.
        let seen: Vec<(String, String)> = run
            .candidates
            .iter()
            .map(|c| (c.kernel.clone(), c.outcome.label().to_string()))
            .collect();
        let mut avoid = inputs.failed.clone();
        avoid.extend(seen.iter().map(|(k, _)| k.clone()));
        let retry = problem
            .kind()
            .retry(problem, &mut inputs.cx(cx, math, steward), &seen, &avoid);
        if let Some(retry) = retry {
            let (again, more) =
                measure(cx, problem, math, &retry, &sweep_dir(opts, key, "_retry"))?;
            run.candidates.extend(again.candidates);
            failures.extend(more);
        }
    }
    Ok(Round::Measured(FirstRound {
        run,
        failures,
        space,
        seconds: started.elapsed().as_secs_f64(),
    }))
}

/// The problems of `problems` the tables miss whose kind has rounds after the first (so each is
/// a sweep whose next round can compile ahead), each once, in order.
fn sweeps_ahead<'a>(
    tables: &Tables,
    problems: &'a [Problem],
    precision: Precision,
    arch: Arch,
) -> Vec<(&'a Problem, MathType, TableKey)> {
    let mut seen = BTreeSet::new();
    problems
        .iter()
        .filter(|p| !p.kind().rounds().is_empty())
        .filter_map(|problem| {
            let math = problem.math(precision)?;
            let key = TableKey::of(problem, math, arch);
            (matches!(tables.lookup(&key, problem), Lookup::Miss) && seen.insert(key.clone()))
                .then_some((problem, math, key))
        })
        .collect()
}

/// Measures the first round of every sweep the tables miss whose kind has later rounds (the
/// GEMMs), in the plan's order, then compiles all their second rounds (a GEMM's sibling round) in
/// one nvcc batch into the object cache: on the H100 machine (16 cores) 48 sm90 units built in
/// 88 s where 12 took 64, so one batch spares each sweep after the first most of a round. The
/// sweeps then take their first rounds from what this returns. Only the built-in agent's
/// proposals may be asked for ahead of their turn (as in `prefetch`); without a GPU that tunes
/// (`cx.gpu`) there is nothing to measure. Compile failures are left to the sweeps to report. The
/// first rounds live in memory until their sweeps record them: a crash before then costs their
/// measurement again (their objects are cached), no table write.
/// Rules learned from one sweep's failures now reach the next sweep's sibling round, not its
/// first round.
pub(super) fn measure_ahead(
    cx: RealizeCtx,
    tables: &Tables,
    steward: &mut Steward,
    problems: &[Problem],
) -> Result<Ahead, ComposeError> {
    let opts = cx.opts;
    let mut ahead = Ahead::default();
    if !steward.is_builtin() || !cx.gpu {
        return Ok(ahead);
    }
    let sweeps = sweeps_ahead(tables, problems, opts.precision, opts.arch);
    if sweeps.len() < 2 {
        return Ok(ahead);
    }
    nvcc::progress_line(opts.progress, format_args!("measuring ahead: the first rounds of {} sweeps, then their sibling rounds compile together", sweeps.len()));
    let mut specs: Vec<Spec> = Vec::new();
    for (p, math, key) in sweeps {
        if let Round::Measured(first) = first_round(cx, tables, steward, p, math, &key)? {
            let inputs = SweepInputs::new(cx, tables, &key);
            let next = p
                .kind()
                .round(0, p, &measured(&first.run), &inputs.cx(cx, math, steward));
            specs.extend(next);
            ahead.0.insert(key, first);
        }
    }
    compile_ahead(cx, specs, "siblings_ahead", 1, None)?;
    Ok(ahead)
}

/// A sweep: its first round (measured here or ahead), its kind's later rounds, each adding to the
/// run, then recorded (with sweep.json and scatter.svg beside the sources).
fn realize_sweep(
    cx: RealizeCtx,
    tables: &mut Tables,
    steward: &mut Steward,
    problem: &Problem,
    math: MathType,
    first: Option<FirstRound>,
) -> Result<Realized, ComposeError> {
    let opts = cx.opts;
    let key = TableKey::of(problem, math, opts.arch);
    let first = match first {
        Some(f) => f,
        None => match first_round(cx, tables, steward, problem, math, &key)? {
            Round::Measured(f) => f,
            Round::Done(r) => return Ok(r),
        },
    };
    let FirstRound {
        mut run,
        mut failures,
        space,
        seconds: first_seconds,
    } = first;
    let dir = sweep_dir(opts, &key, "");
    let started = std::time::Instant::now();
    let kind = problem.kind();
    let inputs = SweepInputs::new(cx, tables, &key);
    for (i, suffix) in kind.rounds().iter().enumerate() {
        let variants = kind.round(i, problem, &measured(&run), &inputs.cx(cx, math, steward));
        if variants.is_empty() {
            continue;
        }
        let (more, fails) = measure(cx, problem, math, &variants, &sweep_dir(opts, &key, suffix))?;
        run.candidates.extend(more.candidates);
        failures.extend(fails);
    }
    let seconds = first_seconds + started.elapsed().as_secs_f64();
    // Every candidate with its status, and what the kernels came from (for a GEMM: what was
    // pruned before nvcc and why), next to the sweep's sources.
    let mut record = serde_json::json!({
        "key": key,
        "problem": problem,
        "compile_and_tune_s": seconds,
        "run": run,
    });
    if kind.learns() {
        record["rules_learned"] = tables.learn(&key, &run)?.into();
    }
    if let Some(space) = space {
        record["space"] = space;
    }
    let _ = std::fs::write(
        dir.join("sweep.json"),
        serde_json::to_string_pretty(&record).expect("run serializes"),
    );
    record_sweep(tables, key, problem.clone(), run, failures, &dir)
}

/// Without a GPU that runs them a sweep ends once its candidates are compiled.
fn compile_only(cx: RealizeCtx, candidates: &[Spec], dir: &Path) -> Result<Realized, ComposeError> {
    let RealizeCtx { opts, tc, .. } = cx;
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
        r.entry = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::gemm::space::{gemm_candidates, KernelSpec};
    use crate::kinds::gemm::{GemmLayout, GemmProblem};
    use crate::tune::Timing;
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

    fn timed(k: &KernelSpec, ms: f64) -> CandidateResult {
        CandidateResult {
            kernel: k.name(),
            spec: k.clone().into(),
            outcome: Outcome::Ok {
                max_rel_err: 1e-4,
                timing: Timing {
                    median_ms: ms,
                    min_ms: ms,
                    max_ms: ms,
                    spread: 0.0,
                    samples: 1,
                },
                tflops: 1.0,
            },
        }
    }

    fn run(candidates: Vec<CandidateResult>) -> Run {
        Run {
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
            vec![run(vec![timed(&kb, 0.5)])],
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
        let sweeps = sweeps_ahead(&tables, &problems, Precision::Tf32, Arch::Sm90);
        let shapes: Vec<String> = sweeps.iter().map(|(_, _, k)| k.shape.clone()).collect();
        assert_eq!(shapes, [c.shape_key(), a.shape_key()]);
        assert!(sweeps.iter().all(|(_, m, _)| *m == math));
    }
}
