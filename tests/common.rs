//! Shared set-up: fixture models, the fact binary, and the one compiled kernel library the
//! compile and compose tests share (compiling CUTLASS takes a minute; the cache makes reuse free).

use fact::kinds::gemm::space::KernelSpec;
use fact::kinds::gemm::GemmProblem;
use fact::kinds::{Problem, Spec};
use fact::nvcc::library::{FactOpArgs, FactTensor};
use fact::nvcc::{self, BuildOptions, Built, Toolchain};
use fact::table::{CandidateResult, Entry, Provenance, Run, TableKey};
use fact::tune::cuda::DeviceInfo;
use fact::tune::{Outcome, Timing};
use fact::types::{Arch, MathType};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Condvar, Mutex, OnceLock};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn python() -> PathBuf {
    root().join(".venv/bin/python")
}

/// The folder with every fixture model, made on first use.
pub fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = root().join("target/fixtures");
        let status = Command::new(python())
            .arg(root().join("tests/fixtures/make_models.py"))
            .arg(&dir)
            .status()
            .expect("run tests/fixtures/make_models.py (did ./setup run?)");
        assert!(status.success(), "make_models.py failed");
        dir
    })
}

/// The zoo traced small on the CPU (benches/zoo/models.py --ci): NAME.pt per model and
/// manifest.json, made on first use.
pub fn zoo_fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = root().join("target/zoo-fixtures");
        let status = Command::new(python())
            .arg(root().join("benches/zoo/models.py"))
            .arg("--ci")
            .arg(&dir)
            .status()
            .expect("run benches/zoo/models.py --ci (did ./setup run?)");
        assert!(status.success(), "benches/zoo/models.py --ci failed");
        dir
    })
}

/// Runs `script` with the project venv's python; asserts it succeeded (showing both outputs
/// otherwise) and returns what it printed, trimmed.
pub fn run_python(script: &str) -> String {
    let py = Command::new(python())
        .arg("-c")
        .arg(script)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&py.stdout);
    assert!(
        py.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&py.stderr)
    );
    stdout.trim().to_string()
}

/// The largest difference between the outputs of the modules at `original` and `rewritten` on
/// `inputs` (CPU, no autograd).
pub fn outputs_differ_by(original: &Path, rewritten: &Path, inputs: &[tch::Tensor]) -> f64 {
    let run =
        |p: &Path| tch::no_grad(|| tch::CModule::load(p).unwrap().forward_ts(inputs)).unwrap();
    (run(rewritten) - run(original))
        .abs()
        .max()
        .double_value(&[])
}

pub fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

/// A build cache shared by the tests of one run, so each CUTLASS kernel compiles once.
pub fn cache_dir() -> PathBuf {
    root().join("target/test-build-cache")
}

/// A quiet build into `dir` on `jobs` threads through the shared build cache.
pub fn build_options(dir: &Path, jobs: usize) -> BuildOptions {
    BuildOptions {
        out_dir: dir.to_path_buf(),
        cache: cache_dir(),
        jobs,
        show_progress: false,
        kinds: fact::kinds::registry::KINDS,
        reuse_linked: false,
    }
}

/// Builds `specs` into the library `name` under `dir` through the shared build cache, and asserts
/// that every kernel compiled (listing the failures otherwise).
pub fn build_all(
    tc: &Toolchain,
    specs: &[impl Clone + Into<Spec>],
    dir: &Path,
    name: &str,
    jobs: usize,
) -> Built {
    let built = nvcc::build_library(tc, specs, name, &build_options(dir, jobs)).unwrap();
    let failures: Vec<String> = built.failures.iter().map(|f| f.to_string()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    built
}

/// The device code entries of every CUDA fat binary in `bytes` (an object or a library), as
/// (kind, SM version): kind 1 is PTX, 2 a cubin. nvcc compresses their payloads, so the PTX text
/// itself cannot be searched for; the entry headers say what each holds (fatbin header: magic
/// 0xBA55ED50, its size at byte 6, the entries' size at 8; an entry: kind at 0, its header size
/// at 4, its padded payload size at 8, the SM version at 28).
pub fn fatbin_entries(bytes: &[u8]) -> Vec<(u16, u32)> {
    let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
    let magic = 0xBA55_ED50u32.to_le_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = bytes[i..].windows(4).position(|w| w == magic) {
        let start = i + at;
        let body = start + u16_at(start + 6) as usize;
        let end = (body + u64_at(start + 8) as usize).min(bytes.len());
        let mut p = body;
        while p + 32 <= end {
            out.push((u16_at(p), u32_at(p + 28)));
            let step = u32_at(p + 4) as usize + u32_at(p + 8) as usize;
            if step == 0 {
                break;
            }
            p += step;
        }
        i = end.max(start + 4);
    }
    out
}

pub fn fact() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fact"));
    c.env("FACT_CACHE_DIR", cache_dir());
    c
}

/// `fact compose --json --out OUT_DIR MODEL` with `user_table` as the only pattern table (the
/// shipped one pointed away); asserts it succeeded and returns its JSON.
pub fn compose_json(user_table: &Path, model: &Path, out_dir: &Path) -> serde_json::Value {
    compose_json_with(user_table, model, out_dir, &[])
}

/// `compose_json` with more of compose's options (`extra`).
pub fn compose_json_with(
    user_table: &Path,
    model: &Path,
    out_dir: &Path,
    extra: &[&str],
) -> serde_json::Value {
    let out = fact()
        .env("FACT_TABLE", user_table)
        .env("FACT_SHIPPED_TABLE", out_dir.with_file_name("none.json"))
        .args(["compose", "--json"])
        .args(extra)
        .arg("--out")
        .arg(out_dir)
        .arg(model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `fact discover --json MODEL` with `extra` arguments: the plan's rule ids, sorted.
pub fn plan_rules(model: &Path, extra: &[&str]) -> Vec<String> {
    let out = fact()
        .args(["discover", "--json"])
        .args(extra)
        .arg(model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut rules: Vec<String> = v["plan"]["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["rule"].as_str().unwrap().to_string())
        .collect();
    rules.sort();
    rules
}

/// A table for problems of a kind built over the GEMM kind (each with the GEMM its kernels
/// compute), under the default tf32 policy, each entry's winner the GEMM kind's first candidate
/// for its GEMM (test data, not a measurement); and those kernels' names, in order.
pub fn first_gemm_kernels_table(
    problems: impl IntoIterator<Item = (Problem, GemmProblem)>,
) -> (fact::table::Table, Vec<String>) {
    let mut t = fact::table::Table::new();
    let mut kernels = Vec::new();
    for (problem, gemm) in problems {
        let spec = fact::kinds::gemm::gemm_candidates(&gemm, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .next()
            .expect("a GEMM kernel for the problem's GEMM");
        kernels.push(spec.name());
        t.insert_merged(sample_op_entry(
            &problem,
            &Spec::from(spec),
            MathType::Tf32,
            0.002,
            "test table (not a measurement)",
        ));
    }
    (t, kernels)
}

/// A table entry whose one run timed `spec` at `ms` on `device`: test data, never a measurement.
pub fn sample_entry(problem: &GemmProblem, spec: &KernelSpec, ms: f64, device: &str) -> Entry {
    sample_op_entry(
        &problem.clone().into(),
        &spec.clone().into(),
        MathType::Tf32,
        ms,
        device,
    )
}

/// The same for a problem of any kind, under `math`.
pub fn sample_op_entry(
    problem: &Problem,
    spec: &Spec,
    math: MathType,
    ms: f64,
    device: &str,
) -> Entry {
    let timing = Timing {
        median_ms: ms,
        min_ms: ms,
        max_ms: ms,
        spread: 0.0,
        samples: 1,
    };
    let run = Run {
        partial: false,
        provenance: Provenance {
            device: DeviceInfo {
                name: device.into(),
                sm_count: 0,
                compute_capability: "9.0".into(),
                driver: "-".into(),
                cuda_runtime: "-".into(),
                ..Default::default()
            },
            torch: "2.11.0".into(),
            nvcc: "13.0".into(),
            cutlass: "4.2.0".into(),
            fact: "test".into(),
            date: "2026-11-22".into(),
        },
        baseline: Some(timing.clone()),
        candidates: vec![CandidateResult {
            kernel: spec.name(),
            spec: spec.clone(),
            outcome: Outcome::Ok {
                max_rel_err: 0.0,
                timing,
                tflops: 0.0,
            },
        }],
    };
    Entry::from_runs(
        TableKey::of(problem, math, Arch::Sm90),
        problem.clone(),
        vec![run],
    )
    .expect("one timed candidate")
}

/// A tensor as the kernel ABI passes it, at a fake address (can_implement never reads the data):
/// `dtype` as FactDtype (0 f32, 1 bf16, 2 f16), sizes and strides in elements.
pub fn fake_tensor(addr: usize, dtype: i32, sizes: &[i64], strides: &[i64]) -> FactTensor {
    let mut t = FactTensor {
        data: addr as *mut std::ffi::c_void,
        dtype,
        rank: sizes.len() as i32,
        sizes: [0; 6],
        strides: [0; 6],
    };
    t.sizes[..sizes.len()].copy_from_slice(sizes);
    t.strides[..strides.len()].copy_from_slice(strides);
    t
}

/// A kernel call over `tensors` and `scalars`, which must outlive it.
pub fn op_args(tensors: &[FactTensor], scalars: &[f64]) -> FactOpArgs {
    FactOpArgs {
        tensors: tensors.as_ptr(),
        num_tensors: tensors.len() as i32,
        scalars: scalars.as_ptr(),
        num_scalars: scalars.len() as i32,
    }
}

/// Python that loads the op library at `lib` with ctypes as `so`, its call counters
/// (`so.fact_op_stats()`, a JSON bytes string; `so.fact_op_stats_reset()`) and its kinds' switch
/// (`so.fact_disable(b"kind,..")`, 0 on success) typed: the tests' scripts that read what ran
/// begin with it (after `import ctypes`).
pub fn op_lib_python(lib: &str) -> String {
    format!(
        "so = ctypes.CDLL({lib:?})
so.fact_op_stats.restype = ctypes.c_char_p
so.fact_disable.argtypes, so.fact_disable.restype = [ctypes.c_char_p], ctypes.c_int32"
    )
}

/// Every library fact builds registers its torch ops when it is loaded (and withdraws them when it
/// is closed), and the last one loaded takes the calls. A test that counts the calls of the op
/// library it loaded into this process owns the registrations (`own_op_registrations`); a test
/// that opens a kernel library here shares them while the library is open (`open_kernels`).
/// Shares never wait for an owner that is only waiting, so a test may hold two.
#[derive(Default)]
struct Registrations {
    shared: usize,
    owned: bool,
}

fn registrations() -> &'static (Mutex<Registrations>, Condvar) {
    static R: OnceLock<(Mutex<Registrations>, Condvar)> = OnceLock::new();
    R.get_or_init(Default::default)
}

fn lock_registrations() -> std::sync::MutexGuard<'static, Registrations> {
    registrations().0.lock().unwrap_or_else(|e| e.into_inner())
}

/// A kernel library opened in this process, with its share of the op registrations.
pub struct OpenKernels {
    lib: std::mem::ManuallyDrop<fact::nvcc::KernelLibrary>,
}

impl std::ops::Deref for OpenKernels {
    type Target = fact::nvcc::KernelLibrary;
    fn deref(&self) -> &fact::nvcc::KernelLibrary {
        &self.lib
    }
}

impl Drop for OpenKernels {
    fn drop(&mut self) {
        // Closed first (its registrations withdrawn), then its share given back.
        // SAFETY: `lib` is not used after this.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.lib) };
        lock_registrations().shared -= 1;
        registrations().1.notify_all();
    }
}

pub fn open_kernels(path: &Path) -> OpenKernels {
    let mut r = lock_registrations();
    while r.owned {
        r = registrations().1.wait(r).unwrap_or_else(|e| e.into_inner());
    }
    r.shared += 1;
    drop(r);
    match fact::nvcc::KernelLibrary::open(path) {
        Ok(lib) => OpenKernels {
            lib: std::mem::ManuallyDrop::new(lib),
        },
        Err(e) => {
            lock_registrations().shared -= 1;
            registrations().1.notify_all();
            panic!("{e}");
        }
    }
}

/// Held while a test runs composed modules in this process on the op library it loaded: no other
/// library's ops take its calls meanwhile.
pub struct OwnedRegistrations;

impl Drop for OwnedRegistrations {
    fn drop(&mut self) {
        lock_registrations().owned = false;
        registrations().1.notify_all();
    }
}

pub fn own_op_registrations() -> OwnedRegistrations {
    let mut r = lock_registrations();
    while r.owned || r.shared > 0 {
        r = registrations().1.wait(r).unwrap_or_else(|e| e.into_inner());
    }
    r.owned = true;
    OwnedRegistrations
}
