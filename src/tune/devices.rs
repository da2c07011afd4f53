//! The GPUs tuning runs on: which of the visible devices (`--gpus`), how a worker is pinned to
//! one, and the pool that deals a measurement's variants across the free ones. One worker runs on
//! a GPU at a time (two would time each other's kernels); each worker times torch's baseline on
//! its own GPU, so every time it reports is judged against a baseline of the same GPU, and the
//! variants of one sweep measured on two GPUs come back as two results, one per GPU. Which
//! variants a GPU gets is fixed by the order of the variants and the GPUs the pool hands out
//! (round-robin), so a measurement on an idle pool deals the same way every time.

use super::cuda::Cuda;
use super::worker::{run_sweep, Gpu, Request, Spawn, SweepResult};
use std::str::FromStr;
use std::sync::{Condvar, Mutex};

/// `--gpus`: every visible GPU that tunes, the first N of them, or those listed.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum GpuChoice {
    #[default]
    All,
    Count(usize),
    List(Vec<usize>),
}

impl FromStr for GpuChoice {
    type Err = String;

    /// `all`, a count (`2`), or device indices with a comma (`0,1`; one device alone: `1,`).
    fn from_str(s: &str) -> Result<GpuChoice, String> {
        let bad = || {
            format!("bad --gpus '{s}': write a count (2), device indices with commas (0,1; one device alone as 1,) or all")
        };
        let s = s.trim();
        if s == "all" {
            return Ok(GpuChoice::All);
        }
        if s.contains(',') {
            let mut list = Vec::new();
            for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let i: usize = part.parse().map_err(|_| bad())?;
                if !list.contains(&i) {
                    list.push(i);
                }
            }
            if list.is_empty() {
                return Err(bad());
            }
            return Ok(GpuChoice::List(list));
        }
        match s.parse::<usize>() {
            Ok(0) => Err(
                "--gpus 0: a count is at least 1; for device 0 alone write --gpus 0, (with the comma)"
                    .to_string(),
            ),
            Ok(n) => Ok(GpuChoice::Count(n)),
            Err(_) => Err(bad()),
        }
    }
}

/// The CUDA_VISIBLE_DEVICES value that shows a worker device `index` of this process alone:
/// the entry this process's own list gives it (an index, a UUID or a MIG name), else the index.
pub fn pin(index: usize, visible: Option<&str>) -> String {
    visible
        .and_then(|v| v.split(',').map(str::trim).nth(index))
        .filter(|t| !t.is_empty())
        .map_or_else(|| index.to_string(), str::to_string)
}

/// Every CUDA device this process sees; none without CUDA.
pub fn visible() -> Vec<Gpu> {
    if !crate::torch::cuda_available() {
        return vec![];
    }
    let Ok(cuda) = Cuda::get() else {
        return vec![];
    };
    let env = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    (0..cuda.device_count())
        .map(|i| Gpu {
            index: i,
            pin: pin(i, env.as_deref()),
            info: cuda.device_info(i as i32),
            capability: cuda.capability(i as i32),
        })
        .collect()
}

/// The GPUs of `visible` that `choice` names among those that run the target's kernels
/// (`runs`), and a note for each left out. A sweep's variants are judged by their time over
/// torch's on the GPU that timed them, which ranks kernels across GPUs of one model, not across
/// models: the GPUs must all be the model of the first. Without such a GPU there is nothing to
/// pick (compose compiles and stops, as on a machine without one); a choice that names more or
/// other GPUs than there are is an error.
pub fn select(
    choice: &GpuChoice,
    visible: &[Gpu],
    runs: impl Fn(&Gpu) -> bool,
) -> Result<(Vec<Gpu>, Vec<String>), String> {
    let mut notes = Vec::new();
    let usable: Vec<&Gpu> = visible.iter().filter(|g| runs(g)).collect();
    for g in visible.iter().filter(|g| !runs(g)) {
        notes.push(format!(
            "{} ({}, compute capability {}.{}) does not run the target's kernels: it tunes nothing",
            g.label(),
            g.info.name,
            g.capability.0,
            g.capability.1
        ));
    }
    let Some(first) = usable.first() else {
        return match choice {
            GpuChoice::List(list) => Err(format!(
                "--gpus {}: no GPU here runs the target's kernels",
                join(list)
            )),
            _ => Ok((vec![], notes)),
        };
    };
    let model = first.info.name.clone();
    let picked: Vec<Gpu> = match choice {
        GpuChoice::All | GpuChoice::Count(_) => {
            let same: Vec<Gpu> = usable
                .iter()
                .filter(|g| g.info.name == model)
                .map(|g| (*g).clone())
                .collect();
            for g in usable.iter().filter(|g| g.info.name != model) {
                notes.push(format!(
                    "{} ({}) is another model than {} ({model}): ratios measured on one do not rank kernels on the other, so it tunes nothing",
                    g.label(),
                    g.info.name,
                    first.label()
                ));
            }
            match choice {
                GpuChoice::Count(n) if *n > same.len() => {
                    return Err(format!(
                        "--gpus {n}: {} GPU(s) here tune ({}); pass --gpus {} or all",
                        same.len(),
                        same.iter().map(Gpu::label).collect::<Vec<_>>().join(", "),
                        same.len()
                    ))
                }
                GpuChoice::Count(n) => same.into_iter().take(*n).collect(),
                _ => same,
            }
        }
        GpuChoice::List(list) => {
            let mut out = Vec::new();
            for &i in list {
                let Some(g) = visible.iter().find(|g| g.index == i) else {
                    return Err(format!(
                        "--gpus {}: there is no GPU {i} here ({} visible: indices 0 to {}; CUDA_VISIBLE_DEVICES renumbers them from 0)",
                        join(list),
                        visible.len(),
                        visible.len().saturating_sub(1)
                    ));
                };
                if !runs(g) {
                    return Err(format!(
                        "--gpus {}: {} ({}) does not run the target's kernels",
                        join(list),
                        g.label(),
                        g.info.name
                    ));
                }
                out.push(g.clone());
            }
            if let Some(g) = out.iter().find(|g| g.info.name != out[0].info.name) {
                return Err(format!(
                    "--gpus {}: {} ({}) and {} ({}) are different models, whose ratios over torch do not rank kernels against each other; name GPUs of one model",
                    join(list),
                    out[0].label(),
                    out[0].info.name,
                    g.label(),
                    g.info.name
                ));
            }
            // The GPUs named are all that tune: what the others are is beside the point.
            notes.clear();
            out
        }
    };
    Ok((picked, notes))
}

fn join(list: &[usize]) -> String {
    list.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// `variants` dealt round-robin into `hands` hands (the first to hand 0, the next to hand 1, …),
/// so each GPU gets as many of the estimate's favourites as of its long shots.
pub fn deal(variants: &[usize], hands: usize) -> Vec<Vec<usize>> {
    let hands = hands.max(1);
    let mut out = vec![Vec::new(); hands];
    for (k, &v) in variants.iter().enumerate() {
        out[k % hands].push(v);
    }
    out
}

/// What one GPU measured of a request: its hand of the variants.
#[derive(Debug)]
pub struct GpuResult {
    pub gpu: Gpu,
    pub variants: Vec<usize>,
    pub result: SweepResult,
    pub seconds: f64,
}

/// What a measurement says before its workers start: each GPU it took, with how many variants.
pub type Dealt<'a> = dyn Fn(&[(&Gpu, usize)]) + 'a;

/// The GPUs tuning may use, each free or running one worker, and how workers start.
pub struct Pool {
    gpus: Vec<Gpu>,
    spawn: Box<dyn Spawn>,
    free: Mutex<Vec<bool>>,
    freed: Condvar,
}

/// A GPU taken from the pool; given back when dropped (also when its worker's thread fails).
struct Held<'a> {
    pool: &'a Pool,
    slot: usize,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut free = self.pool.free.lock().unwrap_or_else(|e| e.into_inner());
        free[self.slot] = true;
        self.pool.freed.notify_all();
    }
}

impl Pool {
    pub fn new(gpus: Vec<Gpu>, spawn: Box<dyn Spawn>) -> Pool {
        let free = Mutex::new(vec![true; gpus.len()]);
        Pool {
            gpus,
            spawn,
            free,
            freed: Condvar::new(),
        }
    }

    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// Waits until a GPU is free, then takes the free ones, lowest first, up to `want`.
    fn acquire(&self, want: usize) -> Vec<Held<'_>> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while !free.iter().any(|&f| f) {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        let slots: Vec<usize> = (0..free.len()).filter(|&i| free[i]).take(want).collect();
        for &i in &slots {
            free[i] = false;
        }
        slots
            .into_iter()
            .map(|slot| Held { pool: self, slot })
            .collect()
    }

    /// Judges the variants of `req` (`req.variants`) on the GPUs that are free when it starts
    /// (waiting for one if none is), one worker per GPU, each with its hand of the variants
    /// (`deal`) and its own baseline; `on_dealt` hears which GPU took how many before they
    /// start, `on_done` each variant as it is judged. The results come in the pool's order of
    /// GPUs. A worker's crash costs only the variant it was judging (`run_sweep`); a worker that
    /// cannot judge at all fails the measurement, naming its GPU.
    pub fn measure(
        &self,
        req: &Request,
        on_dealt: &Dealt,
        on_done: &(dyn Fn(usize) + Sync),
    ) -> Result<Vec<GpuResult>, String> {
        if self.gpus.is_empty() {
            return Err("no GPU to tune on".into());
        }
        if req.variants.is_empty() {
            return Ok(vec![]);
        }
        let held = self.acquire(req.variants.len().min(self.gpus.len()));
        let hands = deal(&req.variants, held.len());
        let dealt: Vec<(&Gpu, usize)> = held
            .iter()
            .zip(&hands)
            .map(|(h, hand)| (&self.gpus[h.slot], hand.len()))
            .collect();
        on_dealt(&dealt);
        let results: Vec<Result<GpuResult, String>> = std::thread::scope(|s| {
            let threads: Vec<_> = held
                .into_iter()
                .zip(hands)
                .map(|(held, hand)| {
                    s.spawn(move || {
                        let gpu = &self.gpus[held.slot];
                        let started = std::time::Instant::now();
                        let mut r = req.clone();
                        r.variants = hand.clone();
                        r.gpu_uuid = gpu.info.uuid.clone();
                        let result = run_sweep(&*self.spawn, gpu, r, on_done)?;
                        drop(held);
                        Ok(GpuResult {
                            gpu: gpu.clone(),
                            variants: hand,
                            result,
                            seconds: started.elapsed().as_secs_f64(),
                        })
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("a tuning thread panicked"))
                .collect()
        });
        let mut out: Vec<GpuResult> = results.into_iter().collect::<Result<_, _>>()?;
        out.sort_by_key(|r| r.gpu.index);
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
