//! The kernel a GEMM-like pattern runs where a served call may have more rows than the sample it
//! was tuned at (a `.pt2` program whose dynamic dims reach past the sample). The sample's winner
//! may sit just under a wave boundary: the Llama-style decoder's 4096-row winners (128 x 128
//! tiles, 3.9 waves on 132 SMs; 256 tiles of 128 x 256, 1.9) ran its 4608-row calls 7% slower
//! than the kernels tuned there (benches/results/zoo/shapes/2026-11-30-h200-4ccd56d/). So among
//! the kernels the winner's own run measured within `SLACK` of it at the sample, compose takes
//! the one whose time over the sample's rows and `PAST` rows beyond them is least, each kernel's
//! time at more rows its measured time scaled by the waves it runs in there (`Kind::waves`).
//! Waves bound a kernel that is compute-bound per tile; one bound by memory grows more smoothly
//! with the rows, so this over-weighs a ragged last wave, which only breaks near-ties at the
//! sample. The table keeps the sample's winner: what was measured is unchanged. Nothing is
//! compiled or timed beyond the sweep's own kernels.

use crate::kinds::{Problem, Spec};
use crate::table::Entry;
use serde::{Deserialize, Serialize};

/// Rows past the sample's a choice is weighed at, as fractions of them: a sixteenth, an eighth
/// and a quarter more (8 x 549 and 8 x 576 against 4 x 1024 are 7% and 12.5% more).
pub const PAST: [(i64, i64); 3] = [(17, 16), (9, 8), (5, 4)];
/// How much slower than the winner at the sample a kernel may have measured, in the winner's run,
/// and still be chosen: about the spread of one kernel's medians between runs.
pub const SLACK: f64 = 0.03;
/// How much less a kernel's weighed time must be than the winner's for it to be chosen instead:
/// waves are a coarse model, and a small gain is not worth leaving the winner.
pub const GAIN: f64 = 0.03;

/// A pattern run on another kernel than its sample's winner, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SteadyChoice {
    /// The winner at the sample's rows, which the table keeps.
    pub winner: String,
    /// The winner's and the chosen kernel's medians at the sample, in the winner's run.
    pub winner_ms: f64,
    pub kernel_ms: f64,
    /// The rows weighed, the sample's first.
    pub rows: Vec<i64>,
    /// The sum over those rows of each one's time: measured at the sample, scaled by waves beyond.
    pub winner_weighed_ms: f64,
    pub weighed_ms: f64,
}

/// The kernel chosen over the winner: its name, its spec and the report.
#[derive(Clone, Debug)]
pub struct Pick {
    pub kernel: String,
    pub spec: Spec,
    pub choice: SteadyChoice,
}

/// The rows `steady` weighs a problem of `rows` rows at.
pub fn weighed_rows(rows: i64) -> Vec<i64> {
    std::iter::once(rows)
        .chain(PAST.iter().map(|(num, den)| rows * num / den))
        .collect()
}

/// Another kernel than `entry`'s winner for `problem` where one weighs `GAIN` less over the
/// sample's rows and those past them (`PAST`) within `SLACK` of the winner at the sample; None
/// where the winner stays (its kind has no rows or counts no waves, or nothing weighs less).
pub fn steady(entry: &Entry, problem: &Problem) -> Option<Pick> {
    let kind = problem.kind();
    let rows = weighed_rows(kind.rows(problem)?);
    let at: Vec<Problem> = rows
        .iter()
        .map(|&r| kind.at_rows(problem, r))
        .collect::<Option<_>>()?;
    // A kernel's time at each weighed row count: its measured time, scaled by its waves.
    let weigh = |spec: &Spec, ms: f64| -> Option<f64> {
        let waves: Vec<f64> = at
            .iter()
            .map(|p| kind.waves(p, spec))
            .collect::<Option<_>>()?;
        (waves[0] > 0.0).then(|| waves.iter().map(|w| ms * w / waves[0]).sum())
    };
    let run = entry.runs.get(entry.winner_run)?;
    let measured: Vec<(&str, &Spec, f64)> = run
        .candidates
        .iter()
        .filter_map(|c| Some((c.kernel.as_str(), &c.spec, c.outcome.median_ms()?)))
        .collect();
    let &(_, winner_spec, winner_ms) = measured.iter().find(|(k, _, _)| *k == entry.winner)?;
    // Never one torch ran faster than in the same run: compose left such winners to torch.
    let torch_ms = run
        .baseline
        .as_ref()
        .map_or(f64::INFINITY, crate::tune::Timing::judged_ms);
    let winner_weighed = weigh(winner_spec, winner_ms)?;
    let (kernel, spec, ms, weighed) = measured
        .iter()
        .filter(|(k, _, ms)| {
            *k != entry.winner && *ms <= winner_ms * (1.0 + SLACK) && *ms < torch_ms
        })
        .filter_map(|&(k, s, ms)| Some((k, s, ms, weigh(s, ms)?)))
        .min_by(|a, b| a.3.total_cmp(&b.3).then(a.2.total_cmp(&b.2)))?;
    (weighed < winner_weighed * (1.0 - GAIN)).then(|| Pick {
        kernel: kernel.to_string(),
        spec: spec.clone(),
        choice: SteadyChoice {
            winner: entry.winner.clone(),
            winner_ms,
            kernel_ms: ms,
            rows,
            winner_weighed_ms: winner_weighed,
            weighed_ms: weighed,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::gemm::space::{gemm_candidates, KernelSpec, TileScheduler};
    use crate::kinds::gemm::{GemmLayout, GemmProblem};
    use crate::table::tests::{ok, provenance, timing};
    use crate::table::{Run, TableKey};
    use crate::types::{Arch, DType, MathType};

    /// The Llama-style decoder's projection at 4 x 1024 rows (benches/results/zoo/shapes/).
    fn problem(m: i64, batch: i64) -> GemmProblem {
        GemmProblem {
            m,
            n: 2048,
            k: 2048,
            layout: GemmLayout::Rcr,
            dtype: DType::Bf16,
            bias: false,
            batch,
            epilogue: None,
            padded_from: None,
        }
    }

    /// The persistent sm90 128 x 128 kernel for `p`, or that kernel on another `tile` (CUTLASS's
    /// M x N: torch's N x rows), as the sweep's sibling round makes them.
    fn kernel(p: &GemmProblem, tile: [u32; 2]) -> KernelSpec {
        let k = gemm_candidates(p, MathType::Bf16, Arch::Sm90)
            .into_iter()
            .find(|k| k.tile[..2] == [128, 128] && k.scheduler == TileScheduler::Persistent)
            .expect("a persistent 128 x 128 kernel");
        KernelSpec {
            tile: [tile[0], tile[1], k.tile[2]],
            ..k
        }
    }

    /// An entry of one run over `kernels` (spec, ms) with torch at `torch_ms`.
    fn entry(p: &GemmProblem, kernels: &[(&KernelSpec, f64)], torch_ms: f64) -> Entry {
        let run = Run {
            provenance: provenance("NVIDIA H200"),
            baseline: Some(timing(torch_ms)),
            candidates: kernels.iter().map(|(k, ms)| ok(k, *ms)).collect(),
            partial: false,
        };
        let key = TableKey::of(&p.clone().into(), MathType::Bf16, Arch::Sm90);
        Entry::from_runs(key, p.clone(), vec![run]).unwrap()
    }

    #[test]
    fn a_kernel_as_fast_at_the_sample_that_keeps_its_waves_past_it_is_chosen() {
        let p = problem(4096, 1);
        // 2048/128 x 4096/128 = 512 tiles, 3.9 waves on 132 SMs, run as 4; at 4352 to 5120
        // rows 544 to 640, run as 5.
        let square = kernel(&p, [128, 128]);
        // 2048/128 x 4096/192 = 352 tiles, run as 3 waves, as at 4352 and 4608 rows; 4 at 5120.
        let wide = kernel(&p, [128, 192]);
        let e = entry(&p, &[(&square, 0.100), (&wide, 0.101)], 0.2);
        assert_eq!(e.winner, square.name());
        let pick = steady(&e, &p.clone().into()).expect("a steadier kernel");
        assert_eq!(pick.kernel, wide.name());
        assert_eq!(pick.spec, Spec::from(wide));
        assert_eq!(pick.choice.winner, square.name());
        assert_eq!(pick.choice.rows, vec![4096, 4352, 4608, 5120]);
        assert!(pick.choice.weighed_ms < pick.choice.winner_weighed_ms * (1.0 - GAIN));
        assert_eq!(pick.choice.kernel_ms, 0.101);
    }

    #[test]
    fn the_winner_stays_where_nothing_is_close_at_the_sample_or_torch_is_faster() {
        let p = problem(4096, 1);
        let square = kernel(&p, [128, 128]);
        let wide = kernel(&p, [128, 192]);
        // Within the slack it is chosen ...
        let e = entry(
            &p,
            &[(&square, 0.100), (&wide, 0.100 * (1.0 + SLACK) - 0.0005)],
            0.2,
        );
        assert!(steady(&e, &p.clone().into()).is_some());
        // ... past it not.
        let e = entry(
            &p,
            &[(&square, 0.100), (&wide, 0.100 * (1.0 + SLACK) + 0.0005)],
            0.2,
        );
        assert!(steady(&e, &p.clone().into()).is_none());
        // Within it, but torch ran faster than it (and slower than the winner).
        let e = entry(&p, &[(&square, 0.100), (&wide, 0.101)], 0.1005);
        assert!(steady(&e, &p.clone().into()).is_none());
        // A batched GEMM's rows are not the served rows alone: no choice.
        let b = problem(4096, 12);
        let e = entry(
            &b,
            &[
                (&kernel(&b, [128, 128]), 0.100),
                (&kernel(&b, [128, 192]), 0.101),
            ],
            0.2,
        );
        assert!(steady(&e, &b.clone().into()).is_none());
    }

    #[test]
    fn a_winner_already_steady_past_the_sample_stays() {
        let p = problem(4096, 1);
        let square = kernel(&p, [128, 128]);
        let wide = kernel(&p, [128, 192]);
        let e = entry(&p, &[(&wide, 0.100), (&square, 0.1005)], 0.2);
        assert_eq!(e.winner, wide.name());
        assert!(steady(&e, &p.clone().into()).is_none());
    }
}
