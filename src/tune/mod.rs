//! The tuner: verifies every variant against torch, then times the correct ones, and picks the
//! fastest. The harness is fixed code: templates never time themselves, and nothing an agent
//! proposes changes how correctness or speed are judged. `Bench` is the seam between the judging
//! logic here and the GPU (a kind's bench, `crate::kinds`), so the logic is tested with a fake bench.

pub mod cuda;
pub mod devices;
#[cfg(test)]
pub(crate) mod fake;
pub mod gpu;
pub mod op;
pub mod residual;
pub mod worker;

use crate::types::MathType;
use serde::{Deserialize, Serialize};

/// Measuring protocol. Fixed defaults; tests shrink them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Protocol {
    /// Fresh random inputs each variant is checked on.
    pub verify_inputs: usize,
    pub warmup: usize,
    pub iterations: usize,
    /// Bytes written between timed runs to flush L2 (≥ 2× the H100's 50 MB).
    pub flush_bytes: usize,
}

impl Default for Protocol {
    fn default() -> Self {
        Protocol {
            verify_inputs: 3,
            warmup: 5,
            iterations: 30,
            flush_bytes: 256 << 20,
        }
    }
}

/// Robust summary of repeated timings.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// (p90 - p10) / median.
    pub spread: f64,
    pub samples: usize,
}

/// A timing whose samples spread past this (p90 − p10 over the median) was disturbed: of the
/// shipped table's 744 torch baselines, 10 spread past 0.25 and 9 of every 10 under 0.09. An
/// H200's baseline of vit_b_16's attention spread 0.45, its median (0.060 ms) twice its fastest
/// sample (0.030 ms, the H100s' median 0.029), and a kernel of 0.056 ms was taken over it; in
/// the model torch's call took 0.024 ms.
pub const DISTURBED_SPREAD: f64 = 0.25;

impl Timing {
    /// The time a decision reads: the median, or where the samples spread past
    /// `DISTURBED_SPREAD` the fastest sample. Baselines read it, so a disturbed torch time
    /// leaves the pattern to torch rather than substitute a kernel that only beat the noise.
    pub fn judged_ms(&self) -> f64 {
        if self.spread > DISTURBED_SPREAD {
            self.min_ms
        } else {
            self.median_ms
        }
    }

    /// The less disturbed of two timings of one thing: the lower `judged_ms`.
    pub fn better(a: Option<Timing>, b: Option<Timing>) -> Option<Timing> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.judged_ms() < a.judged_ms() { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    pub fn from_samples(mut ms: Vec<f64>) -> Option<Timing> {
        if ms.is_empty() || ms.iter().any(|v| !v.is_finite()) {
            return None;
        }
        ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let q = |f: f64| ms[((ms.len() - 1) as f64 * f).round() as usize];
        let median = q(0.5);
        Some(Timing {
            median_ms: median,
            min_ms: ms[0],
            max_ms: ms[ms.len() - 1],
            spread: if median > 0.0 {
                (q(0.9) - q(0.1)) / median
            } else {
                0.0
            },
            samples: ms.len(),
        })
    }
}

/// What happened to one candidate.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Ok {
        max_rel_err: f64,
        timing: Timing,
        tflops: f64,
    },
    CompileFailed {
        log: String,
    },
    CannotImplement,
    LaunchFailed {
        error: String,
    },
    /// Wrong numbers: relative error over the tolerance, or NaN (an unwritten, poisoned output).
    Numeric {
        max_rel_err: f64,
        tolerance: f64,
    },
    /// The variant took down its tuning process (illegal address, sticky CUDA error).
    Fault {
        error: String,
    },
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Ok { .. } => "ok",
            Outcome::CompileFailed { .. } => "compile_failed",
            Outcome::CannotImplement => "cannot_implement",
            Outcome::LaunchFailed { .. } => "launch_failed",
            Outcome::Numeric { .. } => "numeric",
            Outcome::Fault { .. } => "fault",
        }
    }
    pub fn median_ms(&self) -> Option<f64> {
        match self {
            Outcome::Ok { timing, .. } => Some(timing.median_ms),
            _ => None,
        }
    }
}

/// Why a bench call failed.
#[derive(Clone, Debug, PartialEq)]
pub enum BenchError {
    CannotImplement,
    Launch(String),
}

/// The GPU as the tuner sees it: a kernel library's variants by index, and torch's own op.
pub trait Bench {
    /// Runs variant `index` on fresh random inputs (output poisoned first) and returns the relative
    /// error (Frobenius norm) against an fp64 reference; NaN when any output was not written.
    fn verify(&mut self, index: usize) -> Result<f64, BenchError>;
    /// Timings of variant `index`, one per iteration, L2 flushed before each.
    fn time(&mut self, index: usize) -> Result<Vec<f64>, BenchError>;
    /// Timings of torch's op for the same problem under the same precision policy.
    fn time_baseline(&mut self) -> Result<Vec<f64>, BenchError>;
}

/// Judges variant `index` of a problem of `flops`: verification on every input first, timing
/// only if all pass.
pub fn judge(
    bench: &mut dyn Bench,
    index: usize,
    flops: f64,
    math: MathType,
    protocol: &Protocol,
) -> Outcome {
    let tolerance = math.tolerance();
    let mut worst: f64 = 0.0;
    for _ in 0..protocol.verify_inputs.max(1) {
        match bench.verify(index) {
            Ok(err) if err.is_nan() || err > tolerance => {
                return Outcome::Numeric {
                    max_rel_err: err,
                    tolerance,
                }
            }
            Ok(err) => worst = worst.max(err),
            Err(BenchError::CannotImplement) => return Outcome::CannotImplement,
            Err(BenchError::Launch(e)) => return Outcome::LaunchFailed { error: e },
        }
    }
    match bench.time(index) {
        Ok(samples) => match Timing::from_samples(samples) {
            Some(timing) => {
                let tflops = flops / (timing.median_ms * 1e-3) / 1e12;
                Outcome::Ok {
                    max_rel_err: worst,
                    timing,
                    tflops,
                }
            }
            None => Outcome::LaunchFailed {
                error: "no valid timing samples".into(),
            },
        },
        Err(BenchError::CannotImplement) => Outcome::CannotImplement,
        Err(BenchError::Launch(e)) => Outcome::LaunchFailed { error: e },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted GPU: per variant an error, a time, or a failure.
    struct FakeBench {
        errs: Vec<Result<f64, BenchError>>,
        times: Vec<f64>,
        verified: Vec<usize>,
        timed: Vec<usize>,
    }

    impl Bench for FakeBench {
        fn verify(&mut self, i: usize) -> Result<f64, BenchError> {
            self.verified.push(i);
            self.errs[i].clone()
        }
        fn time(&mut self, i: usize) -> Result<Vec<f64>, BenchError> {
            self.timed.push(i);
            Ok(vec![
                self.times[i],
                self.times[i] * 1.1,
                self.times[i] * 0.95,
            ])
        }
        fn time_baseline(&mut self) -> Result<Vec<f64>, BenchError> {
            Ok(vec![1.0])
        }
    }

    /// A 1024³ GEMM's.
    const FLOPS: f64 = 2.0 * 1024.0 * 1024.0 * 1024.0;

    #[test]
    fn correct_variants_are_timed_and_wrong_ones_never_are() {
        let mut bench = FakeBench {
            errs: vec![
                Ok(2e-4),
                Ok(5e-3),
                Ok(f64::NAN),
                Err(BenchError::CannotImplement),
                Ok(3e-4),
            ],
            times: vec![0.5, 0.1, 0.05, 0.01, 0.4],
            verified: vec![],
            timed: vec![],
        };
        let protocol = Protocol {
            verify_inputs: 3,
            ..Protocol::default()
        };
        let results: Vec<Outcome> = (0..5)
            .map(|i| judge(&mut bench, i, FLOPS, MathType::Tf32, &protocol))
            .collect();
        assert_eq!(bench.timed, vec![0, 4], "only verified variants are timed");
        assert_eq!(
            bench.verified.iter().filter(|&&i| i == 0).count(),
            3,
            "three fresh inputs each"
        );
        assert_eq!(results[1].label(), "numeric");
        assert_eq!(results[2].label(), "numeric", "NaN fails");
        assert_eq!(results[3], Outcome::CannotImplement);
        // The winner is picked from these times by the table (`Entry::from_runs`).
        let timed: Vec<(usize, f64)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.median_ms().map(|ms| (i, ms)))
            .collect();
        assert_eq!(timed, vec![(0, 0.5), (4, 0.4)]);
        match &results[4] {
            Outcome::Ok { timing, tflops, .. } => {
                assert_eq!(timing.median_ms, 0.4);
                assert!((tflops - 2.0 * 1024f64.powi(3) / 0.4e-3 / 1e12).abs() < 1e-9);
            }
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn timing_summary_is_robust() {
        let t = Timing::from_samples(vec![3.0, 1.0, 2.0, 100.0, 2.0]).unwrap();
        assert_eq!(
            (t.median_ms, t.min_ms, t.max_ms, t.samples),
            (2.0, 1.0, 100.0, 5)
        );
        assert!(Timing::from_samples(vec![]).is_none());
        assert!(Timing::from_samples(vec![1.0, f64::NAN]).is_none());
    }

    /// Of two timings of one thing the less disturbed stands: a first timing half of whose samples
    /// ran at twice the time (a GPU clocking up) loses to a clean one after it.
    #[test]
    fn the_better_of_two_timings_is_the_less_disturbed() {
        let mut disturbed = vec![0.030; 15];
        disturbed.extend(vec![0.060; 15]);
        let first = Timing::from_samples(disturbed).unwrap();
        assert!(first.spread > DISTURBED_SPREAD);
        assert_eq!(first.judged_ms(), 0.030);
        let clean = Timing::from_samples(vec![0.024, 0.0245, 0.025]).unwrap();
        assert_eq!(clean.judged_ms(), 0.0245);
        let kept = Timing::better(Some(first.clone()), Some(clean.clone())).unwrap();
        assert_eq!(kept, clean);
        assert_eq!(Timing::better(Some(first.clone()), None), Some(first));
        assert_eq!(Timing::better(None, None), None);
    }
}
