//! The pattern table: tuned winners keyed by (rule with its epilogue chain, dtypes of A, B, C and
//! the accumulator, math, arch, shape), each with every run's measurements (all candidates,
//! failures included) and provenance. This module alone defines on-disk formats; every file
//! carries a schema version, older schemas are migrated on read, writes are atomic (write, then
//! rename) and read-modify-write cycles hold a lock file, so concurrent fact runs never tear or
//! drop each other's entries.

pub mod compact;
pub mod learning;

use crate::kinds::{Problem, Spec};
use crate::tune::cuda::DeviceInfo;
use crate::tune::{Outcome, Timing};
use crate::types::{Arch, DType, MathType};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// 3: problems and kernel specs may carry a fused epilogue (`epilogue`, `fusion`); a fact that
/// reads schema 2 would ignore them and run a plain GEMM in their place, so it must refuse these.
/// 4: entries of other pattern kinds (attention problems and kernel specs) beside GEMMs.
/// 5: LayerNorm problems and kernel specs, keyed under the `f32` math of kernels that multiply no
/// matrices; a fact that reads schema 4 cannot parse them, so it must refuse these.
/// 6: gated-MLP problems and kernel specs (`kinds::glu`), which schema 5 cannot parse.
/// 7: norm problems and kernel specs with the residual add before the norm (`add`:
/// `rules::residual`), which schema 6 would refuse (RMSNorm's) or read as the norm alone
/// (LayerNorm's). A run's GPU index and UUID (`DeviceInfo::index`, `uuid`: a sweep spread over
/// several GPUs records a run per GPU) are optional fields an older fact ignores; it still reads
/// each GPU's run as a run of its own (their baselines and candidates differ), so they needed no
/// schema of their own.
/// 8: convolution kernel specs (`kinds::conv`), which a schema 7 fact does not read back.
pub const SCHEMA: u32 = 8;

#[derive(Debug, Error)]
pub enum TableError {
    #[error("{path}: cannot read the pattern table: {detail}")]
    Read { path: String, detail: String },
    #[error("{path}: the pattern table is corrupt ({detail}); nothing was changed: restore it from a `fact table export`, or move it aside to start a new one")]
    Corrupt { path: String, detail: String },
    #[error("{path}: schema {found} is newer than this fact understands ({SCHEMA}); upgrade fact, nothing was changed")]
    Newer { path: String, found: u32 },
    #[error("{path}: cannot write the pattern table: {detail}")]
    Write { path: String, detail: String },
    #[error("no entry matches '{0}'; `fact table list` shows the ids")]
    NoEntry(String),
    #[error("'{0}' matches several entries; give more of the id")]
    Ambiguous(String),
}

/// Element types of the operands, the output and the accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct Dtypes {
    pub a: DType,
    pub b: DType,
    pub c: DType,
    pub acc: DType,
}

impl Dtypes {
    /// fact's GEMM kernels read and write one dtype and accumulate in fp32.
    pub fn gemm(dtype: DType) -> Dtypes {
        Dtypes {
            a: dtype,
            b: dtype,
            c: dtype,
            acc: DType::F32,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct TableKey {
    /// Rule id with its epilogue chain, e.g. `gemm_rcr_bias`.
    pub rule: String,
    pub dtypes: Dtypes,
    pub math: MathType,
    pub arch: Arch,
    /// Problem shape, `MxNxK`.
    pub shape: String,
}

/// How far apart two shapes are: the sum over their dims of |ln(a/b)|; infinite where either
/// does not parse or they differ in rank.
fn shape_distance(a: &str, b: &str) -> f64 {
    match (parse_shape(a), parse_shape(b)) {
        (Some(a), Some(b)) if a.len() == b.len() => a
            .iter()
            .zip(&b)
            .map(|(x, y)| ((*x as f64) / (*y as f64)).ln().abs())
            .sum(),
        _ => f64::INFINITY,
    }
}

/// Parses `MxNxK` into its dims.
pub fn parse_shape(s: &str) -> Option<Vec<i64>> {
    let dims: Result<Vec<i64>, _> = s.split('x').map(str::parse::<i64>).collect();
    dims.ok()
        .filter(|d| !d.is_empty() && d.iter().all(|&v| v > 0))
}

impl TableKey {
    /// The key of any pattern kind's problem (every kind's kernels read and write one dtype and
    /// accumulate in fp32, as fact's GEMMs do).
    pub fn of(p: &Problem, math: MathType, arch: Arch) -> TableKey {
        TableKey {
            rule: p.rule_id(),
            dtypes: Dtypes::gemm(p.dtype()),
            math,
            arch,
            shape: p.shape_key(),
        }
    }

    /// The shape bucket: every dim rounded up to a power of two. Shapes in one bucket share tile
    /// and wave behaviour closely enough that a winner is worth re-verifying before a full sweep.
    pub fn bucket(&self) -> String {
        match parse_shape(&self.shape) {
            Some(dims) => dims
                .iter()
                .map(|d| (*d as u64).next_power_of_two().to_string())
                .collect::<Vec<_>>()
                .join("x"),
            None => self.shape.clone(),
        }
    }

    /// Same rule, dtypes, math and arch: entries that may serve each other through a bucket.
    pub fn same_family(&self, other: &TableKey) -> bool {
        self.rule == other.rule
            && self.dtypes == other.dtypes
            && self.math == other.math
            && self.arch == other.arch
    }

    /// A short stable id for the CLI: the first hex digits of the key's hash.
    pub fn id(&self) -> String {
        let json = serde_json::to_string(self).expect("key serializes");
        Sha256::digest(json.as_bytes())
            .iter()
            .take(4)
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl std::fmt::Display for TableKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} ({}) {} {}",
            self.rule,
            self.dtypes.a,
            self.math.short_name(),
            self.arch,
            self.shape
        )
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub device: DeviceInfo,
    pub torch: String,
    pub nvcc: String,
    pub cutlass: String,
    pub fact: String,
    pub date: String,
}

/// One candidate of a run: the kernel variant, its spec and what happened to it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct CandidateResult {
    pub kernel: String,
    pub spec: Spec,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// One tuning run: every candidate it judged, and torch's time for the same problem.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub provenance: Provenance,
    pub baseline: Option<Timing>,
    pub candidates: Vec<CandidateResult>,
    /// What a sweep had measured when its process stopped before the last round (a timeout, a
    /// kill): its kernels are measured, the rounds after them are not. compose resumes the sweep
    /// on a GPU of the model that ran it (`Entry::unfinished_at`); false in every finished run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

impl Run {
    /// Whether `other` is this run or this run compacted (`compact`), or the other way round:
    /// the same provenance and torch timing, and every candidate of the one with fewer in the
    /// other (compile logs as a compacted table keeps them).
    pub fn same_run(&self, other: &Run) -> bool {
        let (small, large) = if self.candidates.len() <= other.candidates.len() {
            (self, other)
        } else {
            (other, self)
        };
        self.provenance == other.provenance
            && self.baseline == other.baseline
            && small.candidates.iter().all(|c| {
                let c = compact::shortened(c);
                large
                    .candidates
                    .iter()
                    .any(|d| d.kernel == c.kernel && compact::shortened(d) == c)
            })
    }
}

/// How timings compare across `runs` (`Entry::from_runs`, `Entry::leading_specs`): a candidate's
/// time over torch's in its own run (`Timing::judged_ms`) where every run with a verified
/// candidate has a baseline, else its time alone. `score(run, ms)`.
struct Scorer(Vec<Option<f64>>);

impl Scorer {
    fn of(runs: &[Run]) -> Scorer {
        let baseline = |r: &Run| {
            r.baseline
                .as_ref()
                .map(Timing::judged_ms)
                .filter(|ms| *ms > 0.0)
        };
        let relative = runs
            .iter()
            .filter(|r| r.candidates.iter().any(|c| c.outcome.median_ms().is_some()))
            .all(|r| baseline(r).is_some());
        Scorer(
            runs.iter()
                .map(|r| baseline(r).filter(|_| relative))
                .collect(),
        )
    }

    fn score(&self, run: usize, ms: f64) -> f64 {
        self.0[run].map_or(ms, |b| ms / b)
    }
}

/// How much faster than the winner, in the runs that timed both, another kernel must be to take
/// over (`Entry::from_runs`): a margin over the tuner's noise, so that kernels tied within it keep
/// the ratios' choice.
pub const HEAD_TO_HEAD_MARGIN: f64 = 0.01;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub key: TableKey,
    pub problem: Problem,
    /// The verified candidate with the best time over its own run's torch time, unless a kernel
    /// ran clearly faster than it in the runs that timed both (`from_runs`).
    pub winner: String,
    pub winner_spec: Spec,
    pub winner_ms: f64,
    /// Index into `runs` of the run that measured the winner.
    pub winner_run: usize,
    pub runs: Vec<Run>,
}

impl Entry {
    /// An entry from its runs; None when no run has a verified candidate. Runs are compared by
    /// each candidate's time over torch's time in its own run: the GPU's clock under its power
    /// limit moves both alike between runs. Where a run with a verified candidate has no
    /// baseline, by time alone; ties go to the faster time. Then comparisons within runs, free of
    /// the differences between machines and of torch's own noise, override the ratios: while a
    /// kernel ran faster than the winner in the runs that timed both, by more than
    /// `HEAD_TO_HEAD_MARGIN` in the geometric mean, the one that did so most takes over (never
    /// back to one it took over from), with its figures from its best run by the ratios.
    pub fn from_runs(key: TableKey, problem: impl Into<Problem>, runs: Vec<Run>) -> Option<Entry> {
        let problem = problem.into();
        // Every verified timing, by kernel: (run, candidate, ms).
        let mut by_kernel: BTreeMap<&str, Vec<(usize, &CandidateResult, f64)>> = BTreeMap::new();
        for (i, r) in runs.iter().enumerate() {
            for c in &r.candidates {
                if let Some(ms) = c.outcome.median_ms() {
                    by_kernel.entry(&c.kernel).or_default().push((i, c, ms));
                }
            }
        }
        let scorer = Scorer::of(&runs);
        let score = |i: usize, ms: f64| scorer.score(i, ms);
        let by_score = |a: &&(usize, &CandidateResult, f64),
                        b: &&(usize, &CandidateResult, f64)| {
            score(a.0, a.2)
                .total_cmp(&score(b.0, b.2))
                .then(a.2.total_cmp(&b.2))
        };
        let mut best = *by_kernel.values().flatten().min_by(by_score)?;
        let mut held = vec![best.1.kernel.as_str()];
        loop {
            let mine = &by_kernel[best.1.kernel.as_str()];
            // (kernel, geometric mean of its time over the winner's in the runs that timed both)
            let mut faster: Option<(&str, f64)> = None;
            for (&kernel, times) in by_kernel.iter().filter(|(&k, _)| k != best.1.kernel) {
                let logs: Vec<f64> = times
                    .iter()
                    .filter_map(|&(i, _, ms)| {
                        let &(_, _, w) = mine.iter().find(|t| t.0 == i)?;
                        Some((ms / w).ln())
                    })
                    .collect();
                if logs.is_empty() {
                    continue;
                }
                let h = (logs.iter().sum::<f64>() / logs.len() as f64).exp();
                if h < 1.0 - HEAD_TO_HEAD_MARGIN && faster.is_none_or(|f| h < f.1) {
                    faster = Some((kernel, h));
                }
            }
            match faster {
                Some((kernel, _)) if !held.contains(&kernel) => {
                    held.push(kernel);
                    best = *by_kernel[kernel].iter().min_by(by_score).expect("timed");
                }
                _ => break,
            }
        }
        let (run, best, best_ms) = best;
        Some(Entry {
            winner: best.kernel.clone(),
            winner_spec: best.spec.clone(),
            winner_ms: best_ms,
            winner_run: run,
            key,
            problem,
            runs,
        })
    }

    /// Both entries' runs (one run once, the fuller record of it where one table holds it
    /// compacted: `Run::same_run`), and the winner over all of them (`from_runs`).
    pub fn merged(&self, other: &Entry) -> Entry {
        let mut runs = self.runs.clone();
        for r in &other.runs {
            match runs.iter().position(|x| x.same_run(r)) {
                // The run with more kernels, or its finished form: a sweep's record replaces
                // the checkpoints it left on the way.
                Some(i)
                    if r.candidates.len() > runs[i].candidates.len()
                        || (r.candidates.len() == runs[i].candidates.len()
                            && runs[i].partial
                            && !r.partial) =>
                {
                    runs[i] = r.clone()
                }
                Some(_) => {}
                None => runs.push(r.clone()),
            }
        }
        Entry::from_runs(self.key.clone(), self.problem.clone(), runs)
            .expect("merging verified entries keeps a winner")
    }

    pub fn winner_provenance(&self) -> &Provenance {
        &self.runs[self.winner_run].provenance
    }

    /// The checkpoints where `here` holds (`Run::partial`): the runs of a sweep stopped before its
    /// last round, by a timeout, a kill or a quick compose (which measures a sweep's first
    /// candidates alone), that a resumed sweep starts from. None where no run there is one. A
    /// finished run there beside them is another realization's (the table's leading kernels timed
    /// before the sweep began, or a bucket neighbour's winner): a sweep's record replaces its
    /// checkpoints (`merged`), so none outlives the sweep that left it.
    pub fn unfinished_at(&self, here: impl Fn(&Provenance) -> bool) -> Option<Vec<Run>> {
        let local: Vec<Run> = self
            .runs
            .iter()
            .filter(|r| r.partial && here(&r.provenance))
            .cloned()
            .collect();
        (!local.is_empty()).then_some(local)
    }

    /// The entry as a GPU where `here` holds should use it: the winner among the runs measured
    /// there alone (`from_runs` over them), every run kept; None when no run was. A kernel's rank
    /// moves between GPU models of one arch (on an H100, the gated MLP kernel an H200 had chosen
    /// ran 3.5% behind cuBLAS's two GEMMs and torch.compile's silu·mul together), and the ratios
    /// across GPUs would let another model's run pick the kernel this one runs.
    pub fn for_device(&self, here: impl Fn(&Provenance) -> bool) -> Option<Entry> {
        let local: Vec<usize> = (0..self.runs.len())
            .filter(|&i| here(&self.runs[i].provenance))
            .collect();
        let runs = local.iter().map(|&i| self.runs[i].clone()).collect();
        let best = Entry::from_runs(self.key.clone(), self.problem.clone(), runs)?;
        Some(Entry {
            winner_run: local[best.winner_run],
            runs: self.runs.clone(),
            ..best
        })
    }

    /// The specs of the `n` best distinct verified kernels over every run, the winner first, then
    /// as `from_runs` compares timings across runs (`Scorer`): the ones to time on a GPU model that
    /// has not tried them.
    pub fn leading_specs(&self, n: usize) -> Vec<Spec> {
        let scorer = Scorer::of(&self.runs);
        let mut timed: Vec<(f64, f64, &CandidateResult)> = Vec::new();
        for (i, r) in self.runs.iter().enumerate() {
            for c in &r.candidates {
                if let Some(ms) = c.outcome.median_ms() {
                    timed.push((scorer.score(i, ms), ms, c));
                }
            }
        }
        timed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let mut specs = vec![self.winner_spec.clone()];
        let mut seen = BTreeSet::from([self.winner.as_str()]);
        for (_, _, c) in timed {
            if specs.len() >= n {
                break;
            }
            if seen.insert(c.kernel.as_str()) {
                specs.push(c.spec.clone());
            }
        }
        specs.truncate(n.max(1));
        specs
    }

    /// Torch's time in the winner's run, as decisions read it (`Timing::judged_ms`: a disturbed
    /// baseline counts its fastest sample).
    pub fn baseline_ms(&self) -> Option<f64> {
        self.runs[self.winner_run]
            .baseline
            .as_ref()
            .map(Timing::judged_ms)
    }

    /// Whether torch ran faster than the winner in the winner's own run.
    pub fn loses_to_torch(&self) -> bool {
        self.baseline_ms().is_some_and(|b| b < self.winner_ms)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub schema: u32,
    pub entries: Vec<Entry>,
    /// Validity rules learned from every failure of every sweep (space::validity).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<crate::space::validity::Rule>,
}

/// The first entry of a table's JSON that does not read as an `Entry`, by index, key and error. A
/// build that added a kernel spec variant without a schema bump writes entries that fail on their
/// spec, so the message says so for those.
fn first_unreadable_entry(raw: &serde_json::Value) -> Option<String> {
    let entries = raw.get("entries")?.as_array()?;
    entries.iter().enumerate().find_map(|(i, e)| {
        let err = Entry::deserialize(e).err()?;
        let key = e
            .get("key")
            .map(|k| {
                let field = |f: &str| k.get(f).and_then(|v| v.as_str()).unwrap_or("?").to_string();
                format!("{} {} {}", field("rule"), field("shape"), field("math"))
            })
            .unwrap_or_else(|| "without a key".into());
        let unknown = err.to_string().contains("any variant");
        Some(format!(
            "entry {i} of {} ({key}): {err}{}",
            entries.len(),
            if unknown {
                "; this build of fact does not know that kernel spec: a build with other spec variants wrote it"
            } else {
                ""
            }
        ))
    })
}

/// Schema 1 (fact 0.1.0 before the table became a product): one run per entry, dtype in the key.
mod v1 {
    use super::*;
    #[derive(Deserialize)]
    pub struct Key {
        pub rule: String,
        pub dtype: DType,
        pub math: MathType,
        pub arch: Arch,
        pub shape: String,
    }
    #[derive(Deserialize)]
    pub struct Entry {
        pub key: Key,
        /// A GEMM problem: schema 1 held no other kind.
        pub problem: Problem,
        pub baseline: Option<Timing>,
        pub candidates: Vec<CandidateResult>,
        pub provenance: Provenance,
    }
    #[derive(Deserialize)]
    pub struct Table {
        pub entries: Vec<Entry>,
    }
    pub fn migrate(t: Table) -> super::Table {
        let mut out = super::Table::new();
        for e in t.entries {
            let key = TableKey {
                rule: e.key.rule,
                dtypes: Dtypes::gemm(e.key.dtype),
                math: e.key.math,
                arch: e.key.arch,
                shape: e.key.shape,
            };
            let run = Run {
                provenance: e.provenance,
                baseline: e.baseline,
                candidates: e.candidates,
                partial: false,
            };
            if let Some(entry) = super::Entry::from_runs(key, e.problem, vec![run]) {
                out.insert_merged(entry);
            }
        }
        out
    }
}

/// Where a lookup found its winner.
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    Exact {
        entry: Entry,
        table: &'static str,
    },
    /// A winner for another shape of the same bucket: re-verify on this shape before use.
    Bucket {
        entry: Entry,
        table: &'static str,
    },
    Miss,
}

impl Table {
    pub fn new() -> Table {
        Table {
            schema: SCHEMA,
            entries: Vec::new(),
            rules: Vec::new(),
        }
    }

    /// Reads a table; a missing file is an empty table, an older schema is migrated.
    pub fn load(path: &Path) -> Result<Table, TableError> {
        let p = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Table::new()),
            Err(e) => {
                return Err(TableError::Read {
                    path: p,
                    detail: e.to_string(),
                })
            }
        };
        Table::parse(&text, &p)
    }

    pub fn parse(text: &str, origin: &str) -> Result<Table, TableError> {
        let corrupt = |e: serde_json::Error| TableError::Corrupt {
            path: origin.to_string(),
            detail: e.to_string(),
        };
        let raw: serde_json::Value = serde_json::from_str(text).map_err(corrupt)?;
        let schema = raw.get("schema").and_then(|s| s.as_u64()).unwrap_or(0) as u32;
        // Where a table of a known schema does not parse, name the entry that does not.
        let located = |e: serde_json::Error| TableError::Corrupt {
            path: origin.to_string(),
            detail: first_unreadable_entry(&raw).unwrap_or_else(|| e.to_string()),
        };
        match schema {
            s if s > SCHEMA => Err(TableError::Newer {
                path: origin.to_string(),
                found: s,
            }),
            1 => Ok(v1::migrate(v1::Table::deserialize(&raw).map_err(corrupt)?)),
            // Schemas 2 to 7 are schema 8 without epilogues, attention, LayerNorm, gated MLPs,
            // norms after an add or convolutions: nothing to convert.
            2..=7 => Ok(Table {
                schema: SCHEMA,
                ..Table::deserialize(&raw).map_err(located)?
            }),
            SCHEMA => Table::deserialize(&raw).map_err(located),
            s => Err(TableError::Corrupt {
                path: origin.to_string(),
                detail: format!("unknown schema {s}"),
            }),
        }
    }

    /// Writes atomically: a reader sees the old table or the new one, never a torn file.
    pub fn save(&self, path: &Path) -> Result<(), TableError> {
        let p = path.display().to_string();
        let werr = |e: std::io::Error| TableError::Write {
            path: p.clone(),
            detail: e.to_string(),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(werr)?;
        }
        crate::atomic::write(path, self.text()).map_err(werr)
    }

    /// The table as `save` writes it: JSON with one entry (and one learned rule) a line. Entries
    /// are sorted by key, so a diff names one line per key that changed, at under half the bytes
    /// of an indented dump (the shipped table: 0.95 MB against 2.06).
    pub fn text(&self) -> String {
        let mut s = format!("{{\"schema\":{},\"entries\":[", self.schema);
        push_lines(&mut s, &self.entries);
        s.push(']');
        if !self.rules.is_empty() {
            s.push_str(",\"rules\":[");
            push_lines(&mut s, &self.rules);
            s.push(']');
        }
        s.push_str("}\n");
        s
    }

    /// Loads, changes and saves the table at `path` while holding `path.lock`, so two fact
    /// processes updating one table both land.
    pub fn update<T>(path: &Path, f: impl FnOnce(&mut Table) -> T) -> Result<T, TableError> {
        let werr = |e: std::io::Error| TableError::Write {
            path: path.display().to_string(),
            detail: e.to_string(),
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(werr)?;
        }
        let lock_path = path.with_extension("json.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(werr)?;
        lock.lock().map_err(werr)?;
        let mut table = Table::load(path)?;
        let out = f(&mut table);
        table.save(path)?;
        drop(lock);
        Ok(out)
    }

    pub fn get(&self, key: &TableKey) -> Option<&Entry> {
        self.entries.iter().find(|e| &e.key == key)
    }

    /// Adds the entry; an entry already under its key is merged with it (both runs kept, the
    /// winner picked over all of them by `Entry::from_runs`). Keeps the table sorted by key for
    /// stable diffs.
    pub fn insert_merged(&mut self, entry: Entry) {
        let merged = match self.entries.iter().position(|e| e.key == entry.key) {
            Some(i) => self.entries.remove(i).merged(&entry),
            None => entry,
        };
        self.entries.push(merged);
        self.entries.sort_by(|a, b| a.key.cmp(&b.key));
    }

    /// Merges every entry of `other` into this table.
    pub fn merge(&mut self, other: &Table) {
        for e in &other.entries {
            self.insert_merged(e.clone());
        }
        // Rules from elsewhere join as they are; an identical rule is kept once, counts summed.
        for r in &other.rules {
            match self
                .rules
                .iter_mut()
                .find(|x| x.scope == r.scope && x.kind == r.kind && x.predicate == r.predicate)
            {
                Some(x) => x.count += r.count,
                None => self.rules.push(r.clone()),
            }
        }
    }

    /// The entry whose id starts with `prefix`.
    pub fn find_id(&self, prefix: &str) -> Result<&Entry, TableError> {
        let hits: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.key.id().starts_with(prefix))
            .collect();
        match hits.len() {
            0 => Err(TableError::NoEntry(prefix.to_string())),
            1 => Ok(hits[0]),
            _ => Err(TableError::Ambiguous(prefix.to_string())),
        }
    }

    pub fn remove_id(&mut self, prefix: &str) -> Result<Entry, TableError> {
        let key = self.find_id(prefix)?.key.clone();
        let i = self
            .entries
            .iter()
            .position(|e| e.key == key)
            .expect("found above");
        Ok(self.entries.remove(i))
    }

    /// The nearest entry in the same bucket and alignment class (by log-distance of the shape), if
    /// any: a winner tuned on a problem of another class came from another candidate space (an
    /// alignment-1 kernel would run an aligned shape slower than its own space's; a TMA kernel
    /// cannot run a ragged one at all).
    pub fn bucket_match(&self, key: &TableKey, alignment: u32) -> Option<&Entry> {
        self.nearest(key, alignment)
            .into_iter()
            .find(|e| e.key.bucket() == key.bucket())
    }

    /// The other entries of `key`'s family (`TableKey::same_family`) and alignment class, nearest
    /// first by the log-distance of their shapes (the sum over dims of |ln(a/b)|; ties in the
    /// table's order). Empty where the shape does not parse.
    pub fn nearest(&self, key: &TableKey, alignment: u32) -> Vec<&Entry> {
        if parse_shape(&key.shape).is_none() {
            return vec![];
        }
        let mut near: Vec<(f64, &Entry)> = self
            .entries
            .iter()
            .filter(|e| {
                e.key.same_family(key) && e.key != *key && e.problem.alignment() == alignment
            })
            .map(|e| (shape_distance(&e.key.shape, &key.shape), e))
            .collect();
        near.sort_by(|a, b| a.0.total_cmp(&b.0));
        near.into_iter().map(|(_, e)| e).collect()
    }
}

/// The user's table and the shipped one, looked up user first.
pub struct Tables {
    pub user_path: PathBuf,
    pub user: Table,
    pub shipped: Table,
}

impl Tables {
    pub fn load(user_path: &Path, shipped_path: &Path) -> Result<Tables, TableError> {
        Ok(Tables {
            user_path: user_path.to_path_buf(),
            user: Table::load(user_path)?,
            shipped: Table::load(shipped_path)?,
        })
    }

    /// Exact hits first (user, then shipped), then bucket hits (user, then shipped) for `problem`,
    /// the problem `key` is the key of.
    pub fn lookup(&self, key: &TableKey, problem: &Problem) -> Lookup {
        for (table, name) in [(&self.user, "user"), (&self.shipped, "shipped")] {
            if let Some(e) = table.get(key) {
                return Lookup::Exact {
                    entry: e.clone(),
                    table: name,
                };
            }
        }
        for (table, name) in [(&self.user, "user"), (&self.shipped, "shipped")] {
            if let Some(e) = table.bucket_match(key, problem.alignment()) {
                return Lookup::Bucket {
                    entry: e.clone(),
                    table: name,
                };
            }
        }
        Lookup::Miss
    }

    /// The winners' kernels (`Spec::kernel`: without launch knobs, distinct kernel names) of the
    /// `n` entries nearest `key` in its family and alignment class (`Table::nearest`), the user
    /// table's before the shipped one's at equal distance: what the table knows wins near a shape
    /// it misses, for a quick sweep to try first.
    pub fn nearby_winners(&self, key: &TableKey, problem: &Problem, n: usize) -> Vec<Spec> {
        let mut near: Vec<&Entry> = self.user.nearest(key, problem.alignment());
        near.extend(self.shipped.nearest(key, problem.alignment()));
        // Stable: the user's first among equals.
        near.sort_by(|a, b| {
            shape_distance(&a.key.shape, &key.shape)
                .total_cmp(&shape_distance(&b.key.shape, &key.shape))
        });
        let mut out: Vec<Spec> = Vec::new();
        for e in near {
            let k = e.winner_spec.kernel();
            if !out.iter().any(|o| o.kernel_name() == k.kernel_name()) {
                out.push(k);
            }
            if out.len() >= n {
                break;
            }
        }
        out
    }

    /// Learns validity rules from every failure of `run`, a sweep on `key`, into the user table.
    pub fn learn(&mut self, key: &TableKey, run: &Run) -> Result<usize, TableError> {
        let mut n = 0;
        self.user = Table::update(&self.user_path, |t| {
            let history = t.entries.clone();
            n = learning::learn_run(&mut t.rules, key, run, &history);
            t.clone()
        })?;
        Ok(n)
    }

    /// Rules of both tables (the user's first).
    pub fn rules(&self) -> Vec<crate::space::validity::Rule> {
        self.user
            .rules
            .iter()
            .chain(self.shipped.rules.iter())
            .cloned()
            .collect()
    }

    /// Adds an entry to the user table on disk (under its lock) and here.
    pub fn record(&mut self, entry: Entry) -> Result<(), TableError> {
        self.user = Table::update(&self.user_path, |t| {
            t.insert_merged(entry);
            t.clone()
        })?;
        Ok(())
    }
}

/// `items` into a JSON array's body, one compact item a line.
fn push_lines<T: Serialize>(s: &mut String, items: &[T]) {
    for (i, item) in items.iter().enumerate() {
        s.push_str(if i == 0 { "\n" } else { ",\n" });
        s.push_str(&serde_json::to_string(item).expect("table serializes"));
    }
    if !items.is_empty() {
        s.push('\n');
    }
}

/// The user's table: $FACT_TABLE, else $XDG_DATA_HOME/fact/table.json, else ~/.local/share/fact/table.json.
pub fn user_table_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FACT_TABLE") {
        return PathBuf::from(p);
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir)
                .join(".local/share")
        });
    data.join("fact/table.json")
}

/// The table shipped in the repository (pattern-table/table.json), seeded with H100 winners.
pub fn shipped_table_path() -> PathBuf {
    std::env::var_os("FACT_SHIPPED_TABLE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("FACT_SOURCE_ROOT")).join("pattern-table/table.json"))
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
pub(crate) mod tests;
