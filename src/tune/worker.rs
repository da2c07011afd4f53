//! Crash isolation: tuning runs in a child process (`fact tune-worker`) that reads one JSON
//! request on stdin and writes one JSON event per line. A variant that takes the child down
//! (illegal address, any sticky CUDA error) is recorded as a fault and the sweep resumes in a fresh
//! child after it. It also keeps the sweep library, which registers fact's ops with torch, out of
//! the process that later loads the composed module's library. The request carries any kind's
//! problem, which builds its kind's bench (`kinds::Kind::bench`): the worker names no kind.
//! A worker runs on one GPU (`Gpu`, pinned through CUDA_VISIBLE_DEVICES) and judges the
//! variants it is dealt, timing torch's baseline itself, so its ratios are that GPU's. `Spawn` is
//! where the process starts; the resuming logic (`run_sweep`) is tested with fake benches judged
//! in-process.

use super::cuda::DeviceInfo;
use super::{judge, Bench, Outcome, Protocol, Timing};
use crate::kinds::Problem;
use crate::nvcc::library::KernelLibrary;
use crate::types::{MathType, Precision};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// One CUDA device of this process, as a worker is pinned to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpu {
    /// Its CUDA ordinal here (after CUDA_VISIBLE_DEVICES).
    pub index: usize,
    /// What a worker's CUDA_VISIBLE_DEVICES says to see it alone: this process's own entry for
    /// it where CUDA_VISIBLE_DEVICES was set, else its ordinal.
    pub pin: String,
    pub info: DeviceInfo,
    pub capability: (i32, i32),
}

impl Gpu {
    /// `GPU1`, as progress lines name it.
    pub fn label(&self) -> String {
        format!("GPU{}", self.index)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    pub library: PathBuf,
    pub problem: Problem,
    pub math: MathType,
    pub precision: Precision,
    pub protocol: Protocol,
    /// The variants to judge, by index into the library, in this order.
    pub variants: Vec<usize>,
    /// Also time torch's op for the problem.
    pub baseline: bool,
    /// The UUID of the GPU the worker was pinned to, where known: a worker that finds itself on
    /// another refuses, so no run records a GPU that did not measure it.
    #[serde(default)]
    pub gpu_uuid: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    Baseline {
        timing: Option<Timing>,
        error: Option<String>,
    },
    Start {
        index: usize,
    },
    Result {
        index: usize,
        outcome: Outcome,
    },
}

fn emit(e: &Event) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "{}",
        serde_json::to_string(e).expect("event serializes")
    );
    let _ = out.flush();
}

/// The child's side: judges the request's variants on its GPU (the process's device 0), one
/// event per line.
pub fn serve(req: Request) -> Result<(), String> {
    if !crate::torch::cuda_available() {
        return Err("no CUDA device: tuning needs a GPU".into());
    }
    let cuda = super::cuda::Cuda::get()?;
    if let Some(want) = &req.gpu_uuid {
        let here = cuda.device_info(0).uuid;
        if here.as_ref().is_some_and(|h| h != want) {
            return Err(format!(
                "the tuning worker was pinned to {want} but runs on {}: CUDA_VISIBLE_DEVICES names devices in another order here; set CUDA_DEVICE_ORDER=PCI_BUS_ID or name the GPUs by UUID",
                here.unwrap_or_default()
            ));
        }
    }
    crate::torch::set_float32_matmul_precision(req.precision.torch_matmul_precision())
        .map_err(|e| e.to_string())?;
    let lib = KernelLibrary::open(&req.library)?;
    if let Some(i) = req.variants.iter().find(|&&i| i >= lib.len()) {
        return Err(format!(
            "variant {i} is not in {} ({} kernels)",
            req.library.display(),
            lib.len()
        ));
    }
    let mut bench = req
        .problem
        .kind()
        .bench(&lib, &req.problem, req.protocol.clone())?;
    judge_all(bench.as_mut(), &req, &mut |e| emit(&e));
    Ok(())
}

/// Judges the request's variants on `bench`, torch's baseline first where asked: a `Start`
/// before each variant and its `Result` after, so a death in between names the variant. The
/// baseline is timed again after the variants: the first timing of a fresh worker can meet a GPU
/// still clocking up, and the parent keeps the better of the two (`run_sweep`).
pub fn judge_all(bench: &mut dyn Bench, req: &Request, emit: &mut dyn FnMut(Event)) {
    let baseline = |bench: &mut dyn Bench| match bench.time_baseline() {
        Ok(s) => Event::Baseline {
            timing: Timing::from_samples(s),
            error: None,
        },
        Err(err) => Event::Baseline {
            timing: None,
            error: Some(format!("{err:?}")),
        },
    };
    if req.baseline {
        emit(baseline(bench));
    }
    for &index in &req.variants {
        emit(Event::Start { index });
        let outcome = judge(bench, index, req.problem.flops(), req.math, &req.protocol);
        emit(Event::Result { index, outcome });
    }
    if req.baseline && !req.variants.is_empty() {
        emit(baseline(bench));
    }
}

/// Where a worker runs: `Process` starts `fact tune-worker` on a GPU; tests judge fake benches
/// in-process instead.
pub trait Spawn: Sync {
    /// Runs one worker for `req` on `gpu` until it ends, passing on each event it writes: Ok when
    /// it exited cleanly, else what its death left (exit status and the end of its log).
    fn run(&self, gpu: &Gpu, req: &Request, on_event: &mut dyn FnMut(Event)) -> Result<(), String>;
}

/// The worker as a child process of `exe`, pinned to its GPU through CUDA_VISIBLE_DEVICES.
pub struct Process {
    pub exe: PathBuf,
}

impl Spawn for Process {
    fn run(&self, gpu: &Gpu, req: &Request, on_event: &mut dyn FnMut(Event)) -> Result<(), String> {
        let mut child = Command::new(&self.exe)
            .arg("tune-worker")
            .env("CUDA_VISIBLE_DEVICES", &gpu.pin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the tuning worker {}: {e}", self.exe.display()))?;
        let body = serde_json::to_string(req).expect("request serializes");
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(body.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut stderr = child.stderr.take().expect("piped");
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
            let Ok(line) = line else { break };
            if let Ok(e) = serde_json::from_str::<Event>(&line) {
                on_event(e);
            }
        }
        let status = child.wait().map_err(|e| e.to_string())?;
        let log = err_reader.join().unwrap_or_default();
        if status.success() {
            return Ok(());
        }
        let tail: Vec<&str> = log.lines().rev().take(6).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Err(format!("worker exited with {status}: {}", tail.join("\n")))
    }
}

/// What a sweep measured on one GPU.
#[derive(Debug, Default)]
pub struct SweepResult {
    pub outcomes: Vec<(usize, Outcome)>,
    pub baseline: Option<Timing>,
    pub baseline_error: Option<String>,
}

/// The parent's side: runs workers on `gpu` until every variant of `req` has an outcome. A
/// variant a worker started and never finished is a fault, and a fresh worker goes on after it;
/// a worker that ends having judged nothing is an error (the library, the GPU or the worker is
/// broken, not a variant).
pub fn run_sweep(
    spawn: &dyn Spawn,
    gpu: &Gpu,
    mut req: Request,
    on_done: &dyn Fn(usize),
) -> Result<SweepResult, String> {
    let mut result = SweepResult::default();
    let mut left = req.variants.clone();
    while !left.is_empty() {
        req.variants = left.clone();
        let mut started: Option<usize> = None;
        let mut judged = 0;
        let exit = spawn.run(gpu, &req, &mut |e| match e {
            // The worker times torch before and after the variants: the better timing stands,
            // an error only where neither timed.
            Event::Baseline { timing, error } => {
                result.baseline = Timing::better(result.baseline.take(), timing);
                if result.baseline.is_some() {
                    result.baseline_error = None;
                } else if result.baseline_error.is_none() {
                    result.baseline_error = error;
                }
            }
            Event::Start { index } => started = Some(index),
            Event::Result { index, outcome } => {
                result.outcomes.push((index, outcome));
                left.retain(|&i| i != index);
                started = None;
                judged += 1;
                on_done(index);
            }
        });
        if result.baseline.is_some() || result.baseline_error.is_some() {
            req.baseline = false;
        }
        match (started, exit) {
            (Some(index), exit) => {
                let error = exit
                    .err()
                    .unwrap_or_else(|| "the worker exited cleanly in the middle of it".into());
                result.outcomes.push((index, Outcome::Fault { error }));
                left.retain(|&i| i != index);
                on_done(index);
            }
            (None, _) if judged > 0 => {}
            (None, Ok(())) => {
                return Err(format!(
                    "the tuning worker on {} exited without judging variants {left:?}",
                    gpu.label()
                ))
            }
            (None, Err(e)) => {
                return Err(format!(
                    "the tuning worker on {} failed before judging any variant: {e}",
                    gpu.label()
                ))
            }
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests;
