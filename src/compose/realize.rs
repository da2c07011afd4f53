//! Realization of one pattern: a pattern-table hit (re-verified where the GPU or CUTLASS version
//! differs), a bucket neighbour's winner, or a sweep (candidates from the agent, compiled into one
//! library, verified and timed in the crash-resuming worker, knob variants of the fastest refined),
//! recorded in the user table.

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
/// sweep, taking a GEMM sweep's first round from `ahead` where `measure_ahead` measured it. Every
/// new measurement goes into the user table at once, so a later failure loses no tuning result.
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
    let mut sweep = |tables: &mut Tables, steward: &mut Steward| match problem {
        Problem::Gemm(p) => {
            let first = ahead.0.remove(&key);
            realize_sweep(cx, tables, steward, p, math, first)
        }
        Problem::Attention(_) | Problem::LayerNorm(_) => {
            realize_op_sweep(cx, tables, problem, math, key.clone())
        }
    };
    let here = if cx.gpu { Some(provenance(tc)) } else { None };
    match tables.lookup(&key, problem) {
        Lookup::Exact { entry, table } => {
            let prov = entry.winner_provenance();
            let elsewhere = here
                .as_ref()
                .filter(|h| h.device.name != prov.device.name || h.cutlass != prov.cutlass)
                .map(|_| format!("{} with CUTLASS {}", prov.device.name, prov.cutlass));
            if let Some(on) = elsewhere {
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
    cx: RealizeCtx,
    tables: &Tables,
    steward: &mut Steward,
    problem: &GemmProblem,
    math: MathType,
    key: &TableKey,
) -> Result<Result<SweepCandidates, String>, ComposeError> {
    let RealizeCtx { opts, tc, .. } = cx;
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
    let here = if cx.gpu { Some(provenance(cx.tc)) } else { None };
    for problem in problems {
        let Some(math) = problem.math(opts.precision) else {
            continue;
        };
        let key = TableKey::of(problem, math, opts.arch);
        match tables.lookup(&key, problem) {
            Lookup::Miss => {}
            Lookup::Exact { entry, .. } => {
                let prov = entry.winner_provenance();
                if here.as_ref().is_some_and(|h| {
                    h.device.name != prov.device.name || h.cutlass != prov.cutlass
                }) {
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
        let found = match problem {
            Problem::Gemm(p) => sweep_candidates(cx, tables, &mut builtin, p, math, &key)?
                .map(|c| c.kernels.into_iter().map(Spec::from).collect()),
            Problem::Attention(_) | Problem::LayerNorm(_) => {
                op_sweep_candidates(opts, problem, math)
            }
        };
        missed += 1;
        specs.extend(found.unwrap_or_default());
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

/// GEMM kernels as the specs a build and a run take.
fn specs(ks: &[KernelSpec]) -> Vec<Spec> {
    ks.iter().cloned().map(Spec::from).collect()
}

/// A GEMM sweep's first round: the agent's candidates measured, with what they came from.
pub(super) struct FirstRound {
    run: Run,
    failures: Vec<CompileFailure>,
    candidates: Vec<KernelSpec>,
    space: space::Space,
    seconds: f64,
}

/// What a GEMM sweep's first round came to: measured, or the sweep's end (no candidates, or no
/// GPU to tune on, where compiling them is all there is).
enum Round {
    Measured(FirstRound),
    Done(Realized),
}

/// First rounds measured ahead of their sweeps' turns, by table key (`measure_ahead`); empty
/// where a problem is realized on its own.
#[derive(Default)]
pub struct Ahead(BTreeMap<TableKey, FirstRound>);

fn first_round(
    cx: RealizeCtx,
    tables: &Tables,
    steward: &mut Steward,
    problem: &GemmProblem,
    math: MathType,
    key: &TableKey,
) -> Result<Round, ComposeError> {
    let opts = cx.opts;
    let SweepCandidates {
        kernels: candidates,
        space,
        failed_before,
    } = match sweep_candidates(cx, tables, steward, problem, math, key)? {
        Ok(c) => c,
        Err(reason) => return Ok(Round::Done(Realized::skipped(reason))),
    };
    let dir = sweep_dir(opts, key, "");
    if !cx.gpu {
        return compile_only(cx, &specs(&candidates), &dir).map(Round::Done);
    }
    let started = std::time::Instant::now();
    let gemm = Problem::Gemm(problem.clone());
    let (mut run, mut failures) = measure(cx, &gemm, math, &specs(&candidates), &dir)?;
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
                cx,
                &gemm,
                math,
                &specs(&retry),
                &sweep_dir(opts, key, "_retry"),
            )?;
            run.candidates.extend(again.candidates);
            failures.extend(more);
        }
    }
    Ok(Round::Measured(FirstRound {
        run,
        failures,
        candidates,
        space,
        seconds: started.elapsed().as_secs_f64(),
    }))
}

/// The sibling round's kernels of a first round (CUTLASS's other cluster shapes and the
/// cooperative and ping-pong 128x192 tiles of its fastest tile and schedule pairs).
fn sibling_round(opts: &Options, run: &Run, problem: &GemmProblem) -> Vec<KernelSpec> {
    refine_siblings(run, problem, opts.refine.min(SIBLING_ROUND_TOP))
}

/// The GEMM problems of `problems` the tables miss (so each is a sweep), each once, in order.
fn gemm_sweeps<'a>(
    tables: &Tables,
    problems: &'a [Problem],
    precision: Precision,
    arch: Arch,
) -> Vec<(&'a GemmProblem, MathType, TableKey)> {
    let mut seen = BTreeSet::new();
    problems
        .iter()
        .filter_map(|problem| {
            let Problem::Gemm(p) = problem else {
                return None;
            };
            let math = problem.math(precision)?;
            let key = TableKey::of(problem, math, arch);
            (matches!(tables.lookup(&key, problem), Lookup::Miss) && seen.insert(key.clone()))
                .then_some((p, math, key))
        })
        .collect()
}

/// Measures the first round of every GEMM sweep the tables miss, in the plan's order, then
/// compiles all their sibling rounds in one nvcc batch into the object cache: on the H100
/// machine (16 cores) 48 sm90 units built in 88 s where 12 took 64, so one batch spares each
/// sweep after the first most of a round. The sweeps then take their first rounds from what
/// this returns. Only the built-in agent's proposals may be asked for ahead of their turn (as in
/// `prefetch`); without a GPU that tunes (`cx.gpu`) there is nothing to measure. Compile
/// failures are left to the sweeps to report. The first rounds live in memory until their
/// sweeps record them: a crash before then costs their measurement again (their objects are
/// cached), no table write.
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
    let sweeps = gemm_sweeps(tables, problems, opts.precision, opts.arch);
    if sweeps.len() < 2 {
        return Ok(ahead);
    }
    nvcc::progress_line(opts.progress, format_args!("measuring ahead: the first rounds of {} GEMM sweeps, then their sibling rounds compile together", sweeps.len()));
    let mut specs: Vec<Spec> = Vec::new();
    for (p, math, key) in sweeps {
        if let Round::Measured(first) = first_round(cx, tables, steward, p, math, &key)? {
            specs.extend(
                sibling_round(opts, &first.run, p)
                    .into_iter()
                    .map(Spec::from),
            );
            ahead.0.insert(key, first);
        }
    }
    compile_ahead(cx, specs, "siblings_ahead", 1, None)?;
    Ok(ahead)
}

/// A GEMM sweep: its first round (measured here or ahead), the sibling and knob rounds, recorded.
fn realize_sweep(
    cx: RealizeCtx,
    tables: &mut Tables,
    steward: &mut Steward,
    problem: &GemmProblem,
    math: MathType,
    first: Option<FirstRound>,
) -> Result<Realized, ComposeError> {
    let opts = cx.opts;
    let gemm = Problem::Gemm(problem.clone());
    let key = TableKey::of(&gemm, math, opts.arch);
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
        candidates,
        space,
        seconds: first_seconds,
    } = first;
    let dir = sweep_dir(opts, &key, "");
    let started = std::time::Instant::now();
    // Two more rounds over what the first measured, each adding to the run.
    let mut extend = |run: &mut Run, variants: Vec<KernelSpec>, suffix: &str| {
        if variants.is_empty() {
            return Ok(());
        }
        let (more, fails) = measure(
            cx,
            &gemm,
            math,
            &specs(&variants),
            &sweep_dir(opts, &key, suffix),
        )?;
        run.candidates.extend(more.candidates);
        failures.extend(fails);
        Ok::<(), ComposeError>(())
    };
    // CUTLASS's other cluster shapes and the 128x192 tiles of the fastest tile and schedule
    // pairs: one more nvcc round, in parallel.
    let siblings = sibling_round(opts, &run, problem);
    extend(&mut run, siblings, "_siblings")?;
    // Launch knobs (raster, swizzle, K splits) of the fastest kernels: new variants of objects
    // already compiled, so this costs a dispatch index and a link, not nvcc time.
    let knobs = refine_candidates(&run, problem, opts.refine);
    extend(&mut run, knobs, "_knobs")?;
    let seconds = first_seconds + started.elapsed().as_secs_f64();
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

/// Sweeps a problem of a kind other than GEMM: its kind's candidates (the block shapes of
/// CUTLASS's fused attention that take the head dim, space::attention; the LayerNorm knobs for
/// its C, space::layernorm), compiled into one library and judged like GEMM candidates.
fn realize_op_sweep(
    cx: RealizeCtx,
    tables: &mut Tables,
    problem: &Problem,
    math: MathType,
    key: TableKey,
) -> Result<Realized, ComposeError> {
    let opts = cx.opts;
    let candidates = match op_sweep_candidates(opts, problem, math) {
        Ok(c) => c,
        Err(reason) => return Ok(Realized::skipped(reason)),
    };
    let dir = sweep_dir(opts, &key, "");
    if !cx.gpu {
        return compile_only(cx, &candidates, &dir);
    }
    let started = std::time::Instant::now();
    let (run, failures) = measure(cx, problem, math, &candidates, &dir)?;
    let record = serde_json::json!({ "key": key, "problem": problem, "compile_and_tune_s": started.elapsed().as_secs_f64(), "run": run });
    let _ = std::fs::write(
        dir.join("sweep.json"),
        serde_json::to_string_pretty(&record).expect("run serializes"),
    );
    record_sweep(tables, key, problem.clone(), run, failures, &dir)
}

/// How many of a sweep's fastest tile and schedule pairs get a sibling round: each brings up to
/// nine new nvcc units (five cluster shapes, four of the 192-wide tile), compiled in parallel.
const SIBLING_ROUND_TOP: usize = 3;

/// The `top` fastest verified GEMM kernels of `run`, fastest first.
fn fastest(run: &Run, top: usize) -> Vec<&KernelSpec> {
    let mut ok: Vec<(&KernelSpec, f64)> = run
        .candidates
        .iter()
        .filter_map(|c| Some((c.spec.as_gemm()?, c.outcome.median_ms()?)))
        .collect();
    ok.sort_by(|a, b| a.1.total_cmp(&b.1));
    ok.into_iter().take(top).map(|(k, _)| k).collect()
}

/// `derive`'s variants of `leaders` not yet measured in `run`, each once.
fn unmeasured_variants<'a>(
    run: &Run,
    leaders: impl IntoIterator<Item = &'a KernelSpec>,
    derive: impl Fn(&KernelSpec) -> Vec<KernelSpec>,
) -> Vec<KernelSpec> {
    let seen: BTreeSet<String> = run.candidates.iter().map(|c| c.kernel.clone()).collect();
    let mut out: Vec<KernelSpec> = Vec::new();
    for v in leaders.into_iter().flat_map(derive) {
        if !seen.contains(&v.name()) && !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// Knob variants of the `top` fastest verified kernels of `run` not yet measured in it.
pub fn refine_candidates(run: &Run, p: &GemmProblem, top: usize) -> Vec<KernelSpec> {
    unmeasured_variants(run, fastest(run, top), |spec| {
        spec.knob_grid(p)
            .into_iter()
            .map(|knobs| spec.with_knobs(knobs))
            .filter(|v| v.fits(p))
            .collect()
    })
}

/// CUTLASS's other sm90 cluster shapes (space::SM90_CLUSTERS) and, for a cooperative or ping-pong
/// 128x128 or 128x256 tile, the 128x192 one in both schedules (space::SM90_TILE_N192), of the
/// fastest kernel of each of the `top` fastest tile and schedule pairs in `run`, those not yet
/// measured in it. The estimate cannot tell cluster shapes apart, and the knowledge base's
/// default build pairs TMA kernels with two of them and has no 192-wide tile, so the sweep
/// measures these where a tile and schedule have done well. Pairs, not kernels: one pair's
/// clusters differ by more than pairs do (tf32 65536x2304x768 + bias on the H100: 128x128
/// ping-pong 0.693 ms in 1x2x1, 0.629 in 2x2x1; 128x256 cooperative 0.656).
pub fn refine_siblings(run: &Run, p: &GemmProblem, top: usize) -> Vec<KernelSpec> {
    let mut pairs = std::collections::HashSet::new();
    let leaders: Vec<&KernelSpec> = fastest(run, usize::MAX)
        .into_iter()
        .filter(|k| pairs.insert((k.family, k.tile, k.schedule, k.epilogue, k.stages)))
        .take(top)
        .collect();
    unmeasured_variants(run, leaders, |k| {
        let mut v = k.cluster_siblings(p);
        v.extend(k.tile_siblings(p));
        v
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
    use crate::rules::GemmLayout;
    use crate::space::{gemm_candidates, Family, SM90_CLUSTERS};
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
        let hit = Problem::Gemm(b.clone());
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
            Problem::Gemm(c.clone()),
            hit,
            Problem::Gemm(a.clone()),
            Problem::Gemm(c.clone()),
        ];
        let sweeps = gemm_sweeps(&tables, &problems, Precision::Tf32, Arch::Sm90);
        let shapes: Vec<String> = sweeps.iter().map(|(_, _, k)| k.shape.clone()).collect();
        assert_eq!(shapes, [c.shape_key(), a.shape_key()]);
        assert!(sweeps.iter().all(|(_, m, _)| *m == math));
    }

    #[test]
    fn the_sibling_round_tries_the_other_shapes_of_the_fastest_tma_kernels_only() {
        let p = problem();
        let ks = gemm_candidates(&p, MathType::Tf32, Arch::Sm90);
        let tma: Vec<&KernelSpec> = ks
            .iter()
            .filter(|k| k.family == Family::Sm90Gemm && !k.schedule.is_cpasync())
            .collect();
        let first = tma[0];
        let other_pair = |k: &&&KernelSpec| k.tile != first.tile || k.schedule != first.schedule;
        let second = *tma.iter().find(other_pair).unwrap();
        let third = *tma
            .iter()
            .filter(other_pair)
            .find(|k| k.tile != second.tile || k.schedule != second.schedule)
            .unwrap();
        // first's pair in another cluster, faster than second: the pair leads once.
        let first_again = KernelSpec {
            cluster: [1, 1, 1],
            ..first.clone()
        };
        // The second-fastest's 1x1x1 shape was measured already; a failed kernel is not "fastest".
        let measured_sibling = KernelSpec {
            cluster: [1, 1, 1],
            ..second.clone()
        };
        let mut failed = timed(third, 0.0);
        failed.outcome = Outcome::Numeric {
            max_rel_err: 0.5,
            tolerance: 1e-3,
        };
        let r = run(vec![
            timed(second, 0.30),
            timed(first, 0.25),
            timed(&first_again, 0.27),
            timed(&measured_sibling, 0.40),
            failed,
        ]);
        let out = refine_siblings(&r, &p, 2);
        let names: Vec<String> = out.iter().map(|k| k.name()).collect();
        assert!(!out.is_empty());
        for k in &out {
            assert!(k.invalid_reason().is_none() && k.fits(&p), "{}", k.name());
            assert!(SM90_CLUSTERS.contains(&k.cluster));
            let base = KernelSpec {
                cluster: [0; 3],
                ..k.clone()
            };
            // Another cluster shape of a leader, or one of its 128x192 tiles.
            let of = |s: &KernelSpec| {
                KernelSpec {
                    cluster: [0; 3],
                    ..s.clone()
                } == base
                    || s.tile_siblings(&p).contains(k)
            };
            assert!(
                of(first) || of(second),
                "{} is no sibling of the two fastest (the failed one brings none)",
                k.name()
            );
        }
        assert!(
            !names.contains(&measured_sibling.name()),
            "measured once is enough"
        );
        assert!(!names.contains(&first.name()) && !names.contains(&second.name()));
        assert!(!names.contains(&first_again.name()));
        assert!(
            out.iter()
                .any(|k| k.tile == second.tile && k.schedule == second.schedule),
            "the second pair leads although first's pair measured twice"
        );
        let firsts = out
            .iter()
            .filter(|k| {
                k.tile == first.tile
                    && k.schedule == first.schedule
                    && k.epilogue == first.epilogue
                    && k.scheduler == first.scheduler
            })
            .count();
        assert!(firsts >= 1 && firsts < SM90_CLUSTERS.len());
        assert!(
            refine_siblings(&r, &p, 0).is_empty(),
            "--refine 0 turns it off"
        );
        // Only the fastest pair: the second's siblings stay out.
        let one = refine_siblings(&r, &p, 1);
        assert!(!one.is_empty());
        assert!(one.iter().all(|k| KernelSpec {
            cluster: first.cluster,
            ..k.clone()
        } == *first
            || first.tile_siblings(&p).contains(k)));
        // cp.async mainloops and sm80 kernels have no clusters or tiles to try.
        let cp = ks.iter().find(|k| k.schedule.is_cpasync());
        let sm80 = ks.iter().find(|k| k.family == Family::Sm80Gemm);
        for k in cp.into_iter().chain(sm80) {
            assert!(k.cluster_siblings(&p).is_empty(), "{}", k.name());
            assert!(k.tile_siblings(&p).is_empty(), "{}", k.name());
        }
    }

    #[test]
    fn a_cooperative_leader_brings_its_192_wide_tiles_to_the_sibling_round() {
        let p = problem();
        let ks = gemm_candidates(&p, MathType::Tf32, Arch::Sm90);
        let coop = ks
            .iter()
            .find(|k| {
                k.family == Family::Sm90Gemm
                    && k.schedule == crate::space::KernelSchedule::WsCooperative
                    && k.tile[..2] == [128, 256]
            })
            .expect("a cooperative 128x256 candidate");
        let wide = KernelSpec {
            tile: [128, 192, coop.tile[2]],
            ..coop.clone()
        };
        let pingpong = KernelSpec {
            schedule: crate::space::KernelSchedule::WsPingpong,
            scheduler: crate::space::TileScheduler::Persistent,
            ..wide.clone()
        };
        let out = refine_siblings(&run(vec![timed(coop, 0.8)]), &p, 1);
        let names: Vec<String> = out.iter().map(|k| k.name()).collect();
        for k in [&wide, &pingpong] {
            let alone = KernelSpec {
                cluster: [1, 1, 1],
                ..k.clone()
            };
            assert!(out.contains(k) && out.contains(&alone), "{names:?}");
        }
        assert_eq!(out.iter().filter(|k| k.tile != coop.tile).count(), 4);
        // Measured once is enough.
        let out = refine_siblings(&run(vec![timed(coop, 0.8), timed(&pingpong, 0.9)]), &p, 1);
        assert!(out.contains(&wide) && !out.contains(&pingpong));
    }
}
