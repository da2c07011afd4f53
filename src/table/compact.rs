//! Compaction (`fact table compact`): a table that stays small without forgetting what its
//! readers use. Kept: every run (provenance and torch's baseline, so `winner_run` and the
//! ratios stay), every timing of each kernel that was among the best few of its family
//! (`Spec::family`) in any run, and every timing of the winner, so that `Entry::from_runs`
//! compares the kept kernels over exactly the runs it compared them over before; every build or
//! run failure (the sweeps' list of kernels known to fail reads them); every other failure a
//! learned validity rule counts. Dropped: slower verified candidates, failures no rule counts,
//! compile logs past what a rule keeps as its example, failures recorded twice in one run. The rules
//! themselves are left as they are. An entry whose winner would change is kept whole. Rules
//! learned later see only the kept kernels as known to pass, so one may generalise over a
//! dropped (slower) kernel that passed.

use super::learning::failure_kind;
use super::{CandidateResult, Entry, Run, Table};
use crate::space::validity::{FailureKind, Rule};
use crate::tune::Outcome;
use std::collections::{BTreeMap, BTreeSet};

/// The characters of a compile log a compacted table keeps: as many as a learned rule keeps of
/// its example (`space::validity::learn`).
pub const LOG_CHARS: usize = 2000;

#[derive(Clone, Copy, Debug)]
pub struct CompactOptions {
    /// The best this many verified candidates of each kernel family in each run are kept.
    pub keep: usize,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions { keep: 3 }
    }
}

/// What a compaction kept and dropped.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct CompactStats {
    pub entries: usize,
    pub runs: usize,
    pub candidates_before: usize,
    pub candidates_after: usize,
    pub verified_before: usize,
    pub verified_after: usize,
    pub failures_before: usize,
    pub failures_after: usize,
    /// Entries left as they were: without them the winner choice would have come out otherwise.
    pub kept_whole: usize,
    pub bytes_before: usize,
    pub bytes_after: usize,
}

/// The table as `Table::save` writes it, in bytes.
pub fn saved_len(t: &Table) -> usize {
    t.text().len()
}

impl Table {
    /// This table compacted (see the module's doc), with what was kept and dropped.
    pub fn compacted(&self, opts: &CompactOptions) -> (Table, CompactStats) {
        let mut stats = CompactStats {
            entries: self.entries.len(),
            bytes_before: saved_len(self),
            ..Default::default()
        };
        let mut out = Table {
            schema: self.schema,
            entries: Vec::with_capacity(self.entries.len()),
            rules: self.rules.clone(),
        };
        for e in &self.entries {
            let c = compact_entry(e, &self.rules, opts);
            let kept = if same_choice(&c, e) {
                c
            } else {
                stats.kept_whole += 1;
                e.clone()
            };
            for (before, after) in e.runs.iter().zip(&kept.runs) {
                stats.runs += 1;
                count(before, &mut stats, true);
                count(after, &mut stats, false);
            }
            out.entries.push(kept);
        }
        stats.bytes_after = saved_len(&out);
        (out, stats)
    }
}

fn count(r: &Run, s: &mut CompactStats, before: bool) {
    let verified = r
        .candidates
        .iter()
        .filter(|c| c.outcome.median_ms().is_some())
        .count();
    let (all, ok, failed) = if before {
        (
            &mut s.candidates_before,
            &mut s.verified_before,
            &mut s.failures_before,
        )
    } else {
        (
            &mut s.candidates_after,
            &mut s.verified_after,
            &mut s.failures_after,
        )
    };
    *all += r.candidates.len();
    *ok += verified;
    *failed += r.candidates.len() - verified;
}

/// Whether `compacted` picks the winner `original` picked, with the same figures.
fn same_choice(compacted: &Entry, original: &Entry) -> bool {
    compacted.winner == original.winner
        && compacted.winner_spec == original.winner_spec
        && compacted.winner_ms == original.winner_ms
        && compacted.winner_run == original.winner_run
}

/// The kernels whose timings an entry keeps: the best `keep` verified ones of each family in
/// each run (by time: one run's torch time divides them all alike; ties by name), and the winner.
fn kept_kernels(e: &Entry, keep: usize) -> BTreeSet<String> {
    let mut kept = BTreeSet::from([e.winner.clone()]);
    for r in &e.runs {
        let mut by_family: BTreeMap<String, Vec<(f64, &str)>> = BTreeMap::new();
        for c in &r.candidates {
            if let Some(ms) = c.outcome.median_ms() {
                by_family
                    .entry(c.spec.family())
                    .or_default()
                    .push((ms, &c.kernel));
            }
        }
        for times in by_family.values_mut() {
            times.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
            kept.extend(times.iter().take(keep).map(|t| t.1.to_string()));
        }
    }
    kept
}

/// Whether a learned rule counts this failure of a sweep on `e`'s key in run `r` (the rule
/// learned in that sweep's scope, of its kind, matching the kernel's features).
fn rule_counts(rules: &[Rule], e: &Entry, r: &Run, c: &CandidateResult, kind: FailureKind) -> bool {
    let Some(features) = c.spec.features(kind) else {
        return false;
    };
    let scope = e.key.scope(&r.provenance.cutlass).for_kind(kind);
    rules
        .iter()
        .any(|x| x.kind == kind && x.scope == scope && x.matches(&features))
}

fn compact_entry(e: &Entry, rules: &[Rule], opts: &CompactOptions) -> Entry {
    let kept = kept_kernels(e, opts.keep);
    let runs = e
        .runs
        .iter()
        .map(|r| {
            let mut candidates: Vec<CandidateResult> = Vec::new();
            for c in &r.candidates {
                let c = shortened(c);
                let kind = failure_kind(&c.outcome);
                let counted = kind.is_some_and(|k| rule_counts(rules, e, r, &c, k));
                let keep = match kind {
                    None => kept.contains(&c.kernel),
                    _ if counted => true,
                    // The sweeps avoid every kernel a run saw fail to build or run: once a run
                    // is enough to say so.
                    Some(FailureKind::Compile | FailureKind::Launch | FailureKind::Fault) => {
                        !candidates.contains(&c)
                    }
                    Some(_) => false,
                };
                if keep {
                    candidates.push(c);
                }
            }
            Run {
                candidates,
                ..r.clone()
            }
        })
        .collect();
    Entry::from_runs(e.key.clone(), e.problem.clone(), runs).expect("the winner's timings are kept")
}

/// The candidate with its compile log cut to `LOG_CHARS`.
pub(super) fn shortened(c: &CandidateResult) -> CandidateResult {
    match &c.outcome {
        Outcome::CompileFailed { log } if log.chars().count() > LOG_CHARS => CandidateResult {
            outcome: Outcome::CompileFailed {
                log: log.chars().take(LOG_CHARS).collect(),
            },
            ..c.clone()
        },
        _ => c.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::gemm::space::{gemm_candidates, KernelSpec};
    use crate::kinds::Spec;
    use crate::table::learning::learn_run;
    use crate::table::tests::{gemm_key, ok, problem, provenance, timing};
    use crate::table::{shipped_table_path, Lookup, TableKey, Tables};
    use crate::types::{Arch, MathType};

    fn specs(m: i64) -> Vec<KernelSpec> {
        gemm_candidates(&problem(m), MathType::Tf32, Arch::Sm90)
    }
    fn key(m: i64) -> TableKey {
        gemm_key(&problem(m), MathType::Tf32, Arch::Sm90)
    }
    fn candidate(spec: &KernelSpec, outcome: Outcome) -> CandidateResult {
        CandidateResult {
            kernel: spec.name(),
            spec: Spec::from(spec.clone()),
            outcome,
        }
    }
    fn numeric() -> Outcome {
        Outcome::Numeric {
            max_rel_err: 0.5,
            tolerance: 1e-3,
        }
    }
    fn compile_failed() -> Outcome {
        Outcome::CompileFailed {
            log: format!(
                "error: static assertion failed\n{}",
                "x".repeat(3 * LOG_CHARS)
            ),
        }
    }

    fn launch_failed() -> Outcome {
        Outcome::LaunchFailed {
            error: "too many resources requested for launch".into(),
        }
    }

    /// A sweep of `problem(m)` against torch at 1 ms (on `date`): kernels `(which, ms)` timed,
    /// then `failed` kernels with their outcomes.
    fn sweep(m: i64, date: &str, times: &[(usize, f64)], failed: &[(usize, Outcome)]) -> Run {
        let ks = specs(m);
        Run {
            partial: false,
            provenance: Provenance {
                date: date.into(),
                ..provenance("H100")
            },
            baseline: Some(timing(1.0)),
            candidates: times
                .iter()
                .map(|&(i, ms)| ok(&ks[i], ms))
                .chain(failed.iter().map(|(i, o)| candidate(&ks[*i], o.clone())))
                .collect(),
        }
    }

    use super::super::Provenance;

    /// Two entries as sweeps leave them: the one of m=128 with two runs of twelve kernels and
    /// failures of every kind, learned from; the one of m=256 with failures no rule learned.
    fn swept() -> Table {
        // Kernels 0-5 are of one family, 6-11 of another (`specs`); 3 and 9 are never tried.
        let tried = [0, 1, 2, 6, 7, 8];
        let times: Vec<(usize, f64)> = tried
            .iter()
            .enumerate()
            .map(|(n, &i)| (i, 0.5 + 0.01 * n as f64))
            .collect();
        let a = sweep(
            128,
            "2026-11-20",
            &times,
            &[
                (4, numeric()),
                (5, numeric()),
                (10, compile_failed()),
                (11, Outcome::CannotImplement),
            ],
        );
        // The second run reverses the order: other kernels are its best.
        let rev: Vec<(usize, f64)> = tried
            .iter()
            .enumerate()
            .map(|(n, &i)| (i, 0.56 - 0.01 * n as f64))
            .collect();
        let b = sweep(128, "2026-11-21", &rev, &[(4, numeric())]);
        let mut t = Table::new();
        for run in [a, b] {
            learn_run(&mut t.rules, &key(128), &run, &t.entries.clone());
            t.insert_merged(Entry::from_runs(key(128), problem(128), vec![run]).unwrap());
        }
        let c = sweep(
            256,
            "2026-11-20",
            &[(0, 0.4), (1, 0.3), (2, 0.35), (6, 0.45)],
            &[
                (4, numeric()),
                (10, compile_failed()),
                (10, compile_failed()),
                (11, launch_failed()),
                (11, launch_failed()),
            ],
        );
        t.insert_merged(Entry::from_runs(key(256), problem(256), vec![c]).unwrap());
        t
    }

    fn failures_counted(t: &Table, rule: &Rule) -> usize {
        t.entries
            .iter()
            .flat_map(|e| e.runs.iter().map(move |r| (e, r)))
            .flat_map(|(e, r)| r.candidates.iter().map(move |c| (e, r, c)))
            .filter(|(e, r, c)| {
                failure_kind(&c.outcome).is_some_and(|k| {
                    k == rule.kind && rule_counts(std::slice::from_ref(rule), e, r, c, k)
                })
            })
            .count()
    }

    fn winners(t: &Table) -> Vec<(TableKey, String, f64, usize)> {
        t.entries
            .iter()
            .map(|e| (e.key.clone(), e.winner.clone(), e.winner_ms, e.winner_run))
            .collect()
    }

    fn kernels(r: &Run) -> Vec<&str> {
        r.candidates.iter().map(|c| c.kernel.as_str()).collect()
    }

    #[test]
    fn compaction_keeps_winners_rules_and_the_failures_rules_count() {
        let t = swept();
        assert!(
            t.rules.iter().any(|r| r.kind == FailureKind::Numeric),
            "{:?}",
            t.rules
        );
        let (c, stats) = t.compacted(&CompactOptions { keep: 2 });
        assert_eq!(winners(&c), winners(&t));
        assert_eq!(c.rules, t.rules, "the rules are kept as they are");
        for r in &t.rules {
            assert_eq!(failures_counted(&c, r), failures_counted(&t, r), "{r:?}");
            assert!(failures_counted(&t, r) >= r.count as usize, "{r:?}");
        }
        assert_eq!(stats.kept_whole, 0);
        assert!(stats.bytes_after < stats.bytes_before);
        assert_eq!(stats.candidates_before, 10 + 7 + 9);

        let ks = specs(128);
        let e = c.get(&key(128)).unwrap();
        let families: BTreeSet<String> =
            ks.iter().map(|k| Spec::from(k.clone()).family()).collect();
        assert_eq!(families.len(), 2);
        for (r, before) in e.runs.iter().zip(&t.get(&key(128)).unwrap().runs) {
            // Each family's two fastest of each run are kept, with every timing of theirs.
            for f in &families {
                let fam = |r: &Run| -> Vec<(f64, String)> {
                    let mut v: Vec<(f64, String)> = r
                        .candidates
                        .iter()
                        .filter(|c| c.spec.family() == *f)
                        .filter_map(|c| Some((c.outcome.median_ms()?, c.kernel.clone())))
                        .collect();
                    v.sort_by(|a, b| a.0.total_cmp(&b.0));
                    v
                };
                let (kept, all) = (fam(r), fam(before));
                assert_eq!(kept[..2], all[..2], "{f}");
            }
            // Build failures stay (sweeps avoid those kernels); their logs are cut.
            for c in &r.candidates {
                if let Outcome::CompileFailed { log } = &c.outcome {
                    assert_eq!(log.chars().count(), LOG_CHARS);
                    assert!(log.starts_with("error: static assertion failed"));
                }
            }
        }
        assert!(
            kernels(&e.runs[0]).contains(&ks[11].name().as_str()),
            "a learned cannot_implement"
        );
        // The m=256 entry: its numeric failure no rule counts goes; its build failures stay (the
        // shape-free compile rule counts them), its launch failure, which no rule counts, once.
        let ks = specs(256);
        let e = c.get(&key(256)).unwrap();
        let names = kernels(&e.runs[0]);
        assert!(!names.contains(&ks[4].name().as_str()));
        assert_eq!(names.iter().filter(|n| **n == ks[10].name()).count(), 2);
        assert_eq!(names.iter().filter(|n| **n == ks[11].name()).count(), 1);
    }

    #[test]
    fn compaction_is_idempotent() {
        let t = swept();
        for keep in [1, 2, 3, 20] {
            let (once, _) = t.compacted(&CompactOptions { keep });
            let (twice, stats) = once.compacted(&CompactOptions { keep });
            assert_eq!(twice, once, "keep {keep}");
            assert_eq!(stats.bytes_before, stats.bytes_after);
        }
        let (all, _) = t.compacted(&CompactOptions { keep: 20 });
        assert_eq!(
            all.entries[0].runs[0].candidates.len(),
            t.entries[0].runs[0].candidates.len(),
            "with room for every kernel only what no reader uses goes (none here)"
        );
    }

    #[test]
    fn a_merge_after_compaction_picks_the_winner_the_full_table_would() {
        let t = swept();
        let (c, _) = t.compacted(&CompactOptions { keep: 1 });
        let ks = specs(128);
        let w = t.get(&key(128)).unwrap().winner.clone();
        let wi = ks.iter().position(|k| k.name() == w).unwrap();
        let kept: BTreeSet<&str> = c
            .get(&key(128))
            .unwrap()
            .runs
            .iter()
            .flat_map(kernels)
            .collect();
        let dropped = [0, 1, 2, 6, 7, 8]
            .into_iter()
            .find(|i| !kept.contains(ks[*i].name().as_str()))
            .unwrap();
        let other_kept = [0, 1, 2, 6, 7, 8]
            .into_iter()
            .find(|i| *i != wi && kept.contains(ks[*i].name().as_str()))
            .unwrap();
        let new_runs = [
            // The winner again, a little slower: it stays.
            sweep(128, "2026-11-25", &[(wi, 0.52)], &[]),
            // A kept kernel beats it by 3% head to head: it takes over in both.
            sweep(128, "2026-11-25", &[(wi, 0.50), (other_kept, 0.485)], &[]),
            // A dropped kernel within the margin of the winner: the winner stays.
            sweep(128, "2026-11-25", &[(wi, 0.50), (dropped, 0.498)], &[]),
            // A kernel never timed before, fastest against torch: it wins.
            sweep(128, "2026-11-25", &[(9, 0.3)], &[]),
        ];
        for (i, run) in new_runs.into_iter().enumerate() {
            let new = Entry::from_runs(key(128), problem(128), vec![run]).unwrap();
            let (mut full, mut small) = (t.clone(), c.clone());
            full.insert_merged(new.clone());
            small.insert_merged(new);
            let pick = |t: &Table| t.get(&key(128)).unwrap().winner.clone();
            assert_eq!(pick(&small), pick(&full), "new run {i}");
        }
    }

    #[test]
    fn merging_the_full_table_into_the_compacted_one_restores_each_run_once() {
        let t = swept();
        let (mut c, _) = t.compacted(&CompactOptions { keep: 1 });
        c.merge(&Table {
            rules: vec![],
            ..t.clone()
        });
        let fix = |t: &Table| -> Vec<Vec<usize>> {
            t.entries
                .iter()
                .map(|e| e.runs.iter().map(|r| r.candidates.len()).collect())
                .collect()
        };
        assert_eq!(fix(&c), fix(&t), "one run is kept once, its fuller record");
        assert_eq!(winners(&c), winners(&t));
    }

    #[test]
    fn lookups_answer_alike_from_the_compacted_table() {
        let t = swept();
        let (c, _) = t.compacted(&CompactOptions { keep: 1 });
        let tables = |shipped: &Table| Tables {
            user_path: "/nonexistent/user.json".into(),
            user: Table::new(),
            shipped: shipped.clone(),
        };
        let (full, small) = (tables(&t), tables(&c));
        let answer = |l: Lookup| match l {
            Lookup::Exact { entry, .. } => ("exact", entry.winner, entry.winner_ms),
            Lookup::Bucket { entry, .. } => ("bucket", entry.winner, entry.winner_ms),
            Lookup::Miss => ("miss", String::new(), 0.0),
        };
        for m in [128, 100, 256, 200, 512] {
            let p = problem(m).into();
            let (a, b) = (
                answer(full.lookup(&key(m), &p)),
                answer(small.lookup(&key(m), &p)),
            );
            assert_eq!(a, b, "m {m}");
        }
    }

    #[test]
    fn an_entry_whose_winner_rests_on_a_dropped_kernel_is_kept_whole() {
        // Kernel 0 leads on ratios; 1 (never its family's fastest in a run) beats it head to
        // head, then 6 beats 1. Without 1's timings 0 would keep the lead.
        let runs = vec![
            sweep(128, "2026-11-20", &[(0, 0.80), (2, 0.90)], &[]),
            sweep(128, "2026-11-21", &[(0, 1.00), (1, 0.95), (2, 0.94)], &[]),
            sweep(128, "2026-11-22", &[(1, 1.00), (6, 0.95), (2, 0.99)], &[]),
        ];
        let mut t = Table::new();
        t.insert_merged(Entry::from_runs(key(128), problem(128), runs).unwrap());
        assert_eq!(t.entries[0].winner, specs(128)[6].name());
        let (c, stats) = t.compacted(&CompactOptions { keep: 1 });
        assert_eq!(stats.kept_whole, 1);
        assert_eq!(c, t);
        // With room for kernel 1 the entry compacts (nothing else to drop here).
        assert_eq!(t.compacted(&CompactOptions { keep: 2 }).1.kept_whole, 0);
    }

    #[test]
    fn the_shipped_table_is_compact_and_keeps_its_winners() {
        let path = shipped_table_path();
        let t = Table::load(&path).unwrap();
        let (c, stats) = t.compacted(&CompactOptions::default());
        assert!(
            c == t,
            "the shipped table is not compacted: run `fact table compact {}`",
            path.display()
        );
        assert!(
            stats.bytes_after <= 2_000_000,
            "{} bytes",
            stats.bytes_after
        );
        for e in &t.entries {
            assert!(e.runs[e.winner_run]
                .candidates
                .iter()
                .any(|c| c.kernel == e.winner && c.outcome.median_ms() == Some(e.winner_ms)));
        }
    }
}
