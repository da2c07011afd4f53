//! Crash isolation: tuning runs in a child process (`fact tune-worker`) that reads one JSON
//! request on stdin and writes one JSON event per line. A variant that takes the child down
//! (illegal address, any sticky CUDA error) is recorded as a fault and the sweep resumes in a fresh
//! child after it. It also keeps the sweep library, which registers fact's ops with torch, out of
//! the process that later loads the composed module's library. The request carries any kind's
//! problem, which builds its kind's bench (`kinds::Kind::bench`): the worker names no kind.

use super::{judge, Outcome, Protocol, Timing};
use crate::kinds::Problem;
use crate::nvcc::KernelLibrary;
use crate::types::{MathType, Precision};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    pub library: PathBuf,
    pub problem: Problem,
    pub math: MathType,
    pub precision: Precision,
    pub protocol: Protocol,
    /// First variant index to judge.
    pub start: usize,
    /// Also time torch's op for the problem.
    pub baseline: bool,
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

/// The child's side: judges variants from `start` on, one event per line.
pub fn serve(req: Request) -> Result<(), String> {
    if !crate::torch::cuda_available() {
        return Err("no CUDA device: tuning needs a GPU".into());
    }
    crate::torch::set_float32_matmul_precision(req.precision.torch_matmul_precision())
        .map_err(|e| e.to_string())?;
    let lib = KernelLibrary::open(&req.library)?;
    let mut bench = req
        .problem
        .kind()
        .bench(&lib, &req.problem, req.protocol.clone())?;
    let count = lib.len();
    if req.baseline {
        let e = match bench.time_baseline() {
            Ok(s) => Event::Baseline {
                timing: Timing::from_samples(s),
                error: None,
            },
            Err(err) => Event::Baseline {
                timing: None,
                error: Some(format!("{err:?}")),
            },
        };
        emit(&e);
    }
    for index in req.start..count {
        emit(&Event::Start { index });
        let outcome = judge(
            bench.as_mut(),
            index,
            req.problem.flops(),
            req.math,
            &req.protocol,
        );
        emit(&Event::Result { index, outcome });
    }
    Ok(())
}

/// What a whole sweep measured.
#[derive(Debug, Default)]
pub struct SweepResult {
    pub outcomes: Vec<(usize, Outcome)>,
    pub baseline: Option<Timing>,
    pub baseline_error: Option<String>,
}

/// The parent's side: runs `exe tune-worker` until every variant of the library has an outcome.
pub fn run_sweep(
    exe: &Path,
    mut req: Request,
    count: usize,
    on_done: &dyn Fn(usize),
) -> Result<SweepResult, String> {
    let mut result = SweepResult::default();
    while req.start < count {
        let mut child = Command::new(exe)
            .arg("tune-worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the tuning worker {}: {e}", exe.display()))?;
        let body = serde_json::to_string(&req).expect("request serializes");
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
        let mut started: Option<usize> = None;
        let mut last_done: Option<usize> = None;
        for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
            let Ok(line) = line else { break };
            match serde_json::from_str::<Event>(&line) {
                Ok(Event::Baseline { timing, error }) => {
                    result.baseline = timing;
                    result.baseline_error = error;
                    req.baseline = false;
                }
                Ok(Event::Start { index }) => started = Some(index),
                Ok(Event::Result { index, outcome }) => {
                    result.outcomes.push((index, outcome));
                    last_done = Some(index);
                    started = None;
                    on_done(index);
                }
                Err(_) => {}
            }
        }
        let status = child.wait().map_err(|e| e.to_string())?;
        let log = err_reader.join().unwrap_or_default();
        let tail: String = log
            .lines()
            .rev()
            .take(6)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        match started {
            Some(index) => {
                result.outcomes.push((
                    index,
                    Outcome::Fault {
                        error: format!("worker exited with {status}: {tail}"),
                    },
                ));
                on_done(index);
                req.start = index + 1;
            }
            None if status.success() => break,
            None => {
                let next = last_done.map_or(req.start, |i| i + 1);
                if next == req.start && last_done.is_none() {
                    return Err(format!(
                        "the tuning worker failed before judging any variant ({status}):\n{tail}"
                    ));
                }
                req.start = next;
            }
        }
    }
    Ok(result)
}
