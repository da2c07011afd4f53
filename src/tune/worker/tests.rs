//! The worker's own loop (`judge_all`) and the parent's side (`run_sweep`) over scripted benches.

use super::super::fake::{gpu, request};
use super::*;
use crate::tune::BenchError;

/// Torch's op timed first at a GPU's low clock (half its samples at twice the time), then
/// clean, around one variant.
struct Clocking {
    baselines: usize,
}

impl Bench for Clocking {
    fn verify(&mut self, _: usize) -> Result<f64, BenchError> {
        Ok(1e-6)
    }
    fn time(&mut self, _: usize) -> Result<Vec<f64>, BenchError> {
        Ok(vec![0.056; 30])
    }
    fn time_baseline(&mut self) -> Result<Vec<f64>, BenchError> {
        self.baselines += 1;
        Ok(if self.baselines == 1 {
            [vec![0.030; 15], vec![0.060; 15]].concat()
        } else {
            vec![0.024; 30]
        })
    }
}

/// The worker times torch before and after its variants and the sweep keeps the better: the
/// clean second timing, which the kernel does not beat.
#[test]
fn torch_is_timed_before_and_after_the_variants_and_the_better_timing_stands() {
    struct InProcess;
    impl Spawn for InProcess {
        fn run(
            &self,
            _: &Gpu,
            req: &Request,
            on_event: &mut dyn FnMut(Event),
        ) -> Result<(), String> {
            let mut bench = Clocking { baselines: 0 };
            judge_all(&mut bench, req, on_event);
            assert_eq!(bench.baselines, 2);
            Ok(())
        }
    }
    let r = run_sweep(
        &InProcess,
        &gpu(0, "H200", (9, 0)),
        request(vec![0]),
        &|_| {},
    )
    .unwrap();
    let b = r.baseline.unwrap();
    assert_eq!(b.median_ms, 0.024);
    assert!(b.judged_ms() < 0.056, "the kernel loses to torch");
    assert!(r.baseline_error.is_none());
}
