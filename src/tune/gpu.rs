//! What every bench measures on the GPU with: the fp64 relative error a kernel is verified by,
//! and the fixed timing protocol (warmup, L2 flushed before each run, CUDA events around the op
//! alone). Each kind's bench (inputs, reference, torch's baseline) lives in its folder.

use super::cuda::Cuda;
use super::Protocol;
use tch::{Device, Kind, Tensor};

/// ‖out − ref‖ / ‖ref‖ in fp64; NaN if any element of `out` is NaN.
pub fn relative_error(out: &Tensor, reference: &Tensor) -> f64 {
    let diff = (out.to_kind(Kind::Double) - reference)
        .norm()
        .double_value(&[]);
    let norm = reference.norm().double_value(&[]);
    if norm == 0.0 {
        return if diff == 0.0 { 0.0 } else { f64::INFINITY };
    }
    diff / norm
}

impl Protocol {
    /// The buffer `sample` writes between timed runs to flush L2 (`flush_bytes` of it).
    pub fn flush_buffer(&self, device: Device) -> Tensor {
        Tensor::empty([(self.flush_bytes / 4) as i64], (Kind::Float, device))
    }
}

/// The fixed timing protocol, shared by the tuner and the module bench: `warmup` unmeasured runs,
/// then `iterations` runs, each bracketed by CUDA events with L2 flushed (by writing `flush`)
/// first. An error of `run` ends it as that error; a CUDA error becomes `cuda_err`.
pub fn sample<E>(
    cuda: &Cuda,
    flush: &Tensor,
    protocol: &Protocol,
    run: &mut dyn FnMut() -> Result<(), E>,
    cuda_err: fn(String) -> E,
) -> Result<Vec<f64>, E> {
    for _ in 0..protocol.warmup {
        run()?;
    }
    cuda.sync().map_err(cuda_err)?;
    let mut samples = Vec::with_capacity(protocol.iterations);
    for i in 0..protocol.iterations {
        let _ = flush.shallow_clone().fill_(i as f64);
        let mut failed = None;
        let ms = cuda.time_ms(&mut || {
            run().map_err(|e| {
                failed = Some(e);
                "the timed run failed".to_string()
            })
        });
        match (ms, failed) {
            (_, Some(e)) => return Err(e),
            (Ok(ms), None) => samples.push(ms),
            (Err(e), None) => return Err(cuda_err(e)),
        }
    }
    cuda.sync().map_err(cuda_err)?;
    Ok(samples)
}
