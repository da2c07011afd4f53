//! Fake GPUs for the tests of dealing and judging: a worker "process" that judges a scripted
//! bench in-process through the worker's own loop (`worker::judge_all`), one bench per device,
//! some devices slower than others (every time, torch's too, scaled alike, as a lower clock
//! does), and chosen variants that take a device's worker down mid-variant. It records what each
//! device timed and how many workers ran on a device at once.

use super::cuda::DeviceInfo;
use super::devices::Pool;
use super::worker::{judge_all, Event, Gpu, Request, Spawn};
use super::{Bench, BenchError, Protocol};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Mutex;

pub(crate) struct FakeGpus {
    /// Each variant's time on a device of slowdown 1; None where it computes wrong numbers.
    pub kernel_ms: Vec<Option<f64>>,
    pub torch_ms: f64,
    /// By device index: the factor every time on it is multiplied by.
    pub slowdown: Vec<f64>,
    /// (device, variant): judging that variant on that device kills its worker.
    pub crashes: Vec<(usize, usize)>,
    /// How long a timing takes in wall time, so that concurrent workers overlap.
    pub pause: std::time::Duration,
    /// Every (device, variant) timed, in the order it happened.
    pub timed: Mutex<Vec<(usize, usize)>>,
    /// Every worker started: (device, the variants it was asked for).
    pub spawned: Mutex<Vec<(usize, Vec<usize>)>>,
    /// Workers running now, and the most that ever ran at once, by device.
    running: Mutex<BTreeMap<usize, (usize, usize)>>,
}

impl FakeGpus {
    pub fn new(kernel_ms: Vec<Option<f64>>, torch_ms: f64, slowdown: Vec<f64>) -> FakeGpus {
        FakeGpus {
            kernel_ms,
            torch_ms,
            slowdown,
            crashes: vec![],
            pause: std::time::Duration::ZERO,
            timed: Mutex::new(vec![]),
            spawned: Mutex::new(vec![]),
            running: Mutex::new(BTreeMap::new()),
        }
    }

    /// The most workers that ever ran on one device at once.
    pub fn most_at_once(&self) -> usize {
        let running = self.running.lock().unwrap();
        running.values().map(|&(_, most)| most).max().unwrap_or(0)
    }
}

struct FakeBench<'a> {
    gpus: &'a FakeGpus,
    device: usize,
    crashed: &'a Cell<bool>,
}

impl FakeBench<'_> {
    fn scaled(&self, ms: f64) -> Vec<f64> {
        let s = self.gpus.slowdown[self.device];
        vec![ms * s, ms * s * 1.02, ms * s * 0.99]
    }
}

impl Bench for FakeBench<'_> {
    fn verify(&mut self, i: usize) -> Result<f64, BenchError> {
        if self.crashed.get() {
            return Err(BenchError::Launch("dead".into()));
        }
        if self.gpus.crashes.contains(&(self.device, i)) {
            self.crashed.set(true);
            return Err(BenchError::Launch("illegal address".into()));
        }
        Ok(if self.gpus.kernel_ms[i].is_some() {
            1e-6
        } else {
            f64::NAN
        })
    }
    fn time(&mut self, i: usize) -> Result<Vec<f64>, BenchError> {
        if self.crashed.get() {
            return Err(BenchError::Launch("dead".into()));
        }
        std::thread::sleep(self.gpus.pause);
        self.gpus.timed.lock().unwrap().push((self.device, i));
        Ok(self.scaled(self.gpus.kernel_ms[i].expect("verified")))
    }
    fn time_baseline(&mut self) -> Result<Vec<f64>, BenchError> {
        Ok(self.scaled(self.gpus.torch_ms))
    }
}

impl Spawn for FakeGpus {
    fn run(&self, gpu: &Gpu, req: &Request, on_event: &mut dyn FnMut(Event)) -> Result<(), String> {
        self.spawned
            .lock()
            .unwrap()
            .push((gpu.index, req.variants.clone()));
        {
            let mut running = self.running.lock().unwrap();
            let r = running.entry(gpu.index).or_default();
            r.0 += 1;
            r.1 = r.1.max(r.0);
        }
        let crashed = Cell::new(false);
        let mut bench = FakeBench {
            gpus: self,
            device: gpu.index,
            crashed: &crashed,
        };
        // A dead worker writes nothing more: events after the crash never reach the parent.
        judge_all(&mut bench, req, &mut |e| {
            if !crashed.get() {
                on_event(e)
            }
        });
        self.running.lock().unwrap().entry(gpu.index).or_default().0 -= 1;
        if crashed.get() {
            Err("worker exited with signal: 11 (SIGSEGV): an illegal memory access".into())
        } else {
            Ok(())
        }
    }
}

/// A fake device of this process: `index`, a model name and a compute capability.
pub(crate) fn gpu(index: usize, name: &str, cc: (i32, i32)) -> Gpu {
    Gpu {
        index,
        pin: index.to_string(),
        info: DeviceInfo {
            name: name.into(),
            index: Some(index),
            uuid: Some(format!("GPU-fake-{index}")),
            ..Default::default()
        },
        capability: cc,
    }
}

/// A request for `variants` of a problem of a 4096³ GEMM's flops (the fakes open no library).
pub(crate) fn request(variants: Vec<usize>) -> Request {
    let problem = crate::kinds::fake::problem(2 * 4096 * 4096 * 4096);
    Request {
        library: "/nonexistent/libsweep.so".into(),
        problem,
        math: crate::types::MathType::Bf16,
        precision: crate::types::Precision::Tf32,
        protocol: Protocol::default(),
        variants,
        baseline: true,
        gpu_uuid: None,
    }
}

/// A pool of H100s, one per entry of `fake.slowdown`, whose workers are `fake`'s; the test keeps
/// a view of the fake to read what it saw.
pub(crate) fn fake_pool(fake: FakeGpus) -> (Pool, &'static FakeGpus) {
    let fake: &'static FakeGpus = Box::leak(Box::new(fake));
    struct View(&'static FakeGpus);
    impl Spawn for View {
        fn run(
            &self,
            gpu: &Gpu,
            req: &Request,
            on_event: &mut dyn FnMut(Event),
        ) -> Result<(), String> {
            self.0.run(gpu, req, on_event)
        }
    }
    let devices = (0..fake.slowdown.len())
        .map(|i| gpu(i, "H100", (9, 0)))
        .collect();
    (Pool::new(devices, Box::new(View(fake))), fake)
}
