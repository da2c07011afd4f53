//! The GPUs tuning runs on: which of the visible devices (`--gpus`), how a worker is pinned to
//! one, and the pool that deals a measurement's variants across the free ones. One worker runs on
//! a GPU at a time (two would time each other's kernels); each worker times torch's baseline on
//! its own GPU, so every time it reports is judged against a baseline of the same GPU, and the
//! variants of one sweep measured on two GPUs come back as two results, one per GPU. Which
//! variants a GPU gets is fixed by the order of the variants and the GPUs the pool hands out
//! (round-robin), so a measurement on an idle pool deals the same way every time.

use super::cuda::{Cuda, DeviceInfo};
use super::worker::{run_sweep, Request, Spawn, SweepResult};
use std::str::FromStr;
use std::sync::{Condvar, Mutex};

/// One CUDA device of this process.
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
mod tests {
    use super::super::fake::{fake_pool, gpu, request, FakeGpus};
    use super::*;

    fn sm90(g: &Gpu) -> bool {
        g.capability == (9, 0)
    }

    #[test]
    fn gpus_are_a_count_a_list_or_all() {
        assert_eq!("all".parse(), Ok(GpuChoice::All));
        assert_eq!("2".parse(), Ok(GpuChoice::Count(2)));
        assert_eq!("0,1".parse(), Ok(GpuChoice::List(vec![0, 1])));
        assert_eq!("1,".parse(), Ok(GpuChoice::List(vec![1])));
        assert_eq!(" 3, 1,3".parse(), Ok(GpuChoice::List(vec![3, 1])));
        let zero = "0".parse::<GpuChoice>().unwrap_err();
        assert!(zero.contains("--gpus 0,"), "{zero}");
        for bad in ["", "two", "0,x", ",", "-1"] {
            let e = bad.parse::<GpuChoice>().unwrap_err();
            assert!(e.contains("--gpus"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_worker_is_pinned_by_this_process_own_entry() {
        assert_eq!(pin(1, None), "1");
        assert_eq!(pin(1, Some("4,6")), "6");
        assert_eq!(pin(0, Some("GPU-ab, GPU-cd")), "GPU-ab");
        // A list shorter than the devices CUDA reports cannot be: fall back to the ordinal.
        assert_eq!(pin(2, Some("4,6")), "2");
    }

    #[test]
    fn the_choice_picks_among_gpus_of_one_model_that_run_the_target() {
        let here = [
            gpu(0, "H100", (9, 0)),
            gpu(1, "A10", (8, 6)),
            gpu(2, "H100", (9, 0)),
            gpu(3, "H200", (9, 0)),
        ];
        let indices = |v: &[Gpu]| v.iter().map(|g| g.index).collect::<Vec<_>>();
        let (all, notes) = select(&GpuChoice::All, &here, sm90).unwrap();
        assert_eq!(indices(&all), [0, 2]);
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes
            .iter()
            .any(|n| n.starts_with("GPU1") && n.contains("8.6")));
        assert!(notes
            .iter()
            .any(|n| n.starts_with("GPU3") && n.contains("another model")));
        let (one, _) = select(&GpuChoice::Count(1), &here, sm90).unwrap();
        assert_eq!(indices(&one), [0]);
        let e = select(&GpuChoice::Count(3), &here, sm90).unwrap_err();
        assert!(e.contains("--gpus 2"), "{e}");
        let (listed, notes) = select(&GpuChoice::List(vec![2, 0]), &here, sm90).unwrap();
        assert_eq!(indices(&listed), [2, 0]);
        assert!(notes.is_empty(), "{notes:?}");
        for (list, says) in [
            (vec![1], "does not run"),
            (vec![0, 3], "different models"),
            (vec![7], "no GPU 7"),
        ] {
            let e = select(&GpuChoice::List(list), &here, sm90).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        // No GPU that tunes: nothing picked, as on a machine without a GPU.
        let (none, _) = select(&GpuChoice::All, &here[1..2], sm90).unwrap();
        assert!(none.is_empty());
        assert!(select(&GpuChoice::Count(2), &[], sm90)
            .unwrap()
            .0
            .is_empty());
    }

    #[test]
    fn dealing_is_round_robin_and_loses_nothing() {
        assert_eq!(deal(&[0, 1, 2, 3, 4], 2), [vec![0, 2, 4], vec![1, 3]]);
        assert_eq!(deal(&[7], 3), [vec![7], vec![], vec![]]);
        assert_eq!(deal(&[5, 6], 0), [vec![5, 6]]);
    }

    fn timed_ms(r: &GpuResult, variant: usize) -> Option<f64> {
        r.result
            .outcomes
            .iter()
            .find(|(i, _)| *i == variant)
            .and_then(|(_, o)| o.median_ms())
    }

    #[test]
    fn a_measurement_deals_every_variant_once_across_the_gpus_each_with_its_own_baseline() {
        let kernels: Vec<Option<f64>> = (0..8).map(|i| Some(1.0 + i as f64 * 0.1)).collect();
        let slowdown = vec![1.0, 1.5, 1.0];
        let (pool, fake) = fake_pool(FakeGpus::new(kernels, 2.0, slowdown.clone()));
        let done = Mutex::new(Vec::new());
        let dealt = Mutex::new(Vec::new());
        let results = pool
            .measure(
                &request((0..8).collect()),
                &|d| {
                    dealt
                        .lock()
                        .unwrap()
                        .extend(d.iter().map(|(g, n)| (g.index, *n)))
                },
                &|i| done.lock().unwrap().push(i),
            )
            .unwrap();
        assert_eq!(*dealt.lock().unwrap(), [(0, 3), (1, 3), (2, 2)]);
        let hands: Vec<(usize, Vec<usize>)> = results
            .iter()
            .map(|r| (r.gpu.index, r.variants.clone()))
            .collect();
        assert_eq!(
            hands,
            [(0, vec![0, 3, 6]), (1, vec![1, 4, 7]), (2, vec![2, 5])]
        );
        let mut timed: Vec<usize> = fake.timed.lock().unwrap().iter().map(|t| t.1).collect();
        timed.sort();
        assert_eq!(
            timed,
            (0..8).collect::<Vec<_>>(),
            "every variant timed exactly once"
        );
        let mut heard = done.into_inner().unwrap();
        heard.sort();
        assert_eq!(heard, (0..8).collect::<Vec<_>>());
        for r in &results {
            let b = r
                .result
                .baseline
                .as_ref()
                .expect("each worker times torch")
                .median_ms;
            assert_eq!(
                b,
                2.0 * slowdown[r.gpu.index],
                "torch timed on {}",
                r.gpu.label()
            );
            for &v in &r.variants {
                let ms = timed_ms(r, v).unwrap();
                assert!((ms / b - (1.0 + v as f64 * 0.1) / 2.0).abs() < 1e-12);
            }
        }
        assert_eq!(fake.most_at_once(), 1);
    }

    #[test]
    fn a_crash_costs_only_its_variant_and_the_gpu_goes_on_in_a_fresh_worker() {
        use super::super::Outcome;
        let kernels = vec![Some(1.0), Some(1.1), None, Some(0.9), Some(1.2), Some(0.8)];
        let mut fake = FakeGpus::new(kernels, 1.0, vec![1.0, 1.0]);
        // GPU1's hand is 1, 3, 5: its worker dies on 3.
        fake.crashes = vec![(1, 3)];
        let (pool, fake) = fake_pool(fake);
        let results = pool
            .measure(&request((0..6).collect()), &|_| {}, &|_| {})
            .unwrap();
        let outcome = |v: usize| {
            results
                .iter()
                .flat_map(|r| r.result.outcomes.iter())
                .filter(|(i, _)| *i == v)
                .map(|(_, o)| o.clone())
                .collect::<Vec<_>>()
        };
        for v in 0..6 {
            assert_eq!(outcome(v).len(), 1, "variant {v} judged once");
        }
        assert!(
            matches!(&outcome(3)[0], Outcome::Fault { error } if error.contains("SIGSEGV")),
            "{:?}",
            outcome(3)
        );
        assert_eq!(outcome(2)[0].label(), "numeric");
        for v in [0, 1, 4, 5] {
            assert_eq!(outcome(v)[0].label(), "ok", "variant {v}");
        }
        let spawned = fake.spawned.lock().unwrap().clone();
        let on1: Vec<Vec<usize>> = spawned
            .iter()
            .filter(|(d, _)| *d == 1)
            .map(|(_, v)| v.clone())
            .collect();
        assert_eq!(
            on1,
            [vec![1, 3, 5], vec![5]],
            "resumed after the fault, on its GPU"
        );
        // The baseline survives the crash: the fresh worker does not time torch again.
        assert!(results[1].result.baseline.is_some());
    }

    #[test]
    fn a_worker_that_judges_nothing_fails_the_measurement_naming_its_gpu() {
        struct Broken;
        impl Spawn for Broken {
            fn run(
                &self,
                _: &Gpu,
                _: &Request,
                _: &mut dyn FnMut(super::super::worker::Event),
            ) -> Result<(), String> {
                Err("worker exited with exit status: 1: cannot open the library".into())
            }
        }
        let pool = Pool::new(vec![gpu(0, "H100", (9, 0))], Box::new(Broken));
        let e = pool
            .measure(&request(vec![0, 1]), &|_| {}, &|_| {})
            .unwrap_err();
        assert!(
            e.contains("GPU0") && e.contains("cannot open the library"),
            "{e}"
        );
    }

    #[test]
    fn measurements_side_by_side_share_the_gpus_one_worker_each_and_deal_alike_when_idle() {
        let kernels: Vec<Option<f64>> = (0..6).map(|i| Some(1.0 + i as f64)).collect();
        let mut fake = FakeGpus::new(kernels, 3.0, vec![1.0, 1.0]);
        fake.pause = std::time::Duration::from_millis(5);
        let (pool, fake) = fake_pool(fake);
        let all: Vec<Vec<GpuResult>> = std::thread::scope(|s| {
            let t: Vec<_> = (0..4)
                .map(|_| s.spawn(|| pool.measure(&request((0..6).collect()), &|_| {}, &|_| {})))
                .collect();
            t.into_iter().map(|t| t.join().unwrap().unwrap()).collect()
        });
        assert_eq!(fake.most_at_once(), 1, "never two workers on one GPU");
        for results in &all {
            let mut judged: Vec<usize> = results
                .iter()
                .flat_map(|r| r.result.outcomes.iter().map(|(i, _)| *i))
                .collect();
            judged.sort();
            assert_eq!(judged, (0..6).collect::<Vec<_>>());
        }
        assert_eq!(fake.timed.lock().unwrap().len(), 24);
        // On an idle pool the same measurement deals the same hands, with the same figures.
        let once = |pool: &Pool| {
            pool.measure(&request((0..6).collect()), &|_| {}, &|_| {})
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r.gpu.index,
                        r.variants.clone(),
                        format!("{:?}", r.result.outcomes),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(once(&pool), once(&pool));
    }
}
