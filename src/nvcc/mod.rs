//! Builds kernel libraries. The kernels of a sweep are split into as many translation units as
//! there are jobs (cores), compiled by nvcc (through `cc`) in parallel and cached by a hash of
//! source, flags and the ABI header; a unit that misses that cache is compiled through sccache
//! where it is installed, the shared layer under it (sccache.rs). The dispatch table (one entry
//! per kernel of any kind, a GEMM variant being a kernel plus launch knobs) and the torch op join
//! them in one shared library. A unit that fails to compile is bisected until the failing kernels
//! stand alone, so one bad instantiation costs only itself: its source stays on disk and the
//! failure (command and log) is returned, not raised. toolchain.rs finds the tools and builds the
//! commands; library.rs opens a built library.

use crate::atomic;
use crate::codegen::{self, Source};
use crate::kinds::{render_op_library, Kind, Spec, Unit};
use crate::types::Arch;
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use thiserror::Error;

pub mod library;
pub mod sccache;
mod toolchain;
pub use library::KernelLibrary;
pub use sccache::SccacheReport;
pub use toolchain::Toolchain;

pub const ABI_HEADER: &str = include_str!("../../include/fact_kernels.h");

#[derive(Debug, Error)]
pub enum BuildError {
    #[error(
        "nvcc not found: set CUDA_HOME or put nvcc on PATH (./setup installs a pinned pip nvcc)"
    )]
    NoNvcc,
    #[error("CUTLASS not found at {0}: set CUTLASS_DIR to the cutlass_library/source folder of nvidia-cutlass==4.2.0.0 (./setup installs it)")]
    NoCutlass(String),
    #[error("libtorch headers not found at {0}: set TORCH_DIR to the torch package folder (./setup installs torch 2.11.0)")]
    NoTorch(String),
    #[error("{0}")]
    Mixed(String),
    #[error("every kernel failed to compile; first failure:\n{0}")]
    AllFailed(String),
    #[error("{what} failed: {command}\n{log}")]
    Tool {
        what: String,
        command: String,
        log: String,
    },
    #[error("io error at {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// The file `exe` in the first folder of PATH that has it.
fn find_on_path(exe: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(exe))
        .find(|p| p.is_file())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// One kernel that did not compile: what a user needs to reproduce it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CompileFailure {
    pub kernel: String,
    pub source: PathBuf,
    pub command: String,
    pub log: String,
}

impl std::fmt::Display for CompileFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} failed to compile\n  source: {}\n  command: {}",
            self.kernel,
            self.source.display(),
            self.command
        )?;
        for line in self.log.lines() {
            writeln!(f, "    {line}")?;
        }
        Ok(())
    }
}

/// What a build produced.
#[derive(Debug)]
pub struct Built {
    pub library: PathBuf,
    /// Kernels in the library, in dispatch order (the order given, less those that failed).
    pub kernels: Vec<Spec>,
    pub failures: Vec<CompileFailure>,
    pub compiled: usize,
    pub cached: usize,
    pub seconds: f64,
}

fn hash_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0u8]);
    }
    h.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn command_line(c: &Command) -> String {
    std::iter::once(c.get_program().to_string_lossy().to_string())
        .chain(c.get_args().map(|a| a.to_string_lossy().to_string()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn run(mut c: Command, what: &str) -> Result<(), BuildError> {
    let line = command_line(&c);
    let out = c.output().map_err(|e| BuildError::Tool {
        what: what.into(),
        command: line.clone(),
        log: e.to_string(),
    })?;
    if out.status.success() {
        return Ok(());
    }
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Err(BuildError::Tool {
        what: what.into(),
        command: line,
        log,
    })
}

/// Where `source` compiled with `command` is cached: keyed by source, flags, compiler and the ABI
/// header (which the sources include but do not contain).
fn object_path(
    tc: &Toolchain,
    cache: &Path,
    source: &Source,
    command: &str,
    stem: &str,
) -> PathBuf {
    let key = hash_hex(&[
        source.text.as_bytes(),
        command.as_bytes(),
        tc.nvcc.as_os_str().as_encoded_bytes(),
        ABI_HEADER.as_bytes(),
    ]);
    cache.join(format!("{stem}-{key}.o"))
}

/// The cached object holding this kernel: its own, or (through a `.ref` file) the object of a
/// multi-kernel unit it was compiled in. Kernel entry points are weak symbols, so linking a unit
/// for one of its kernels next to another object with the same kernel is harmless.
fn cached_object(
    tc: &Toolchain,
    cache: &Path,
    source: &Source,
    command: &str,
    stem: &str,
) -> Option<PathBuf> {
    let own = object_path(tc, cache, source, command, stem);
    if own.is_file() {
        return Some(own);
    }
    let target = PathBuf::from(
        std::fs::read_to_string(own.with_extension("ref"))
            .ok()?
            .trim(),
    );
    target.is_file().then_some(target)
}

/// Records that the kernel of `source` lives in `unit_object`.
fn note_in_unit(
    tc: &Toolchain,
    cache: &Path,
    source: &Source,
    command: &str,
    stem: &str,
    unit_object: &Path,
) {
    let r = object_path(tc, cache, source, command, stem).with_extension("ref");
    let _ = atomic::write(&r, unit_object.display().to_string());
}

/// Compiles `source` to a cached object; returns (object, was_cached).
fn compile_cached(
    tc: &Toolchain,
    src_dir: &Path,
    cache: &Path,
    source: &Source,
    cmd: Command,
    stem: &str,
) -> Result<(PathBuf, bool), BuildError> {
    let src = src_dir.join(&source.file_name);
    atomic::write(&src, &source.text).map_err(io(&src))?;
    let obj = object_path(tc, cache, source, &command_line(&cmd), stem);
    if obj.is_file() {
        return Ok((obj, true));
    }
    atomic::write_with(&obj, |tmp| compile_to(tc, cmd, source, &src, tmp), io(&obj))?;
    Ok((obj, false))
}

/// What this process's compiles have cost so far (`tally`): the units compiled (objects the
/// cache did not hold, the op library's C++ among them), the kernels in them, and the wall time
/// during which at least one compile ran, so compiles side by side count once.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tally {
    pub units: usize,
    pub kernels: usize,
    pub seconds: f64,
}

impl Tally {
    /// What was compiled between `before` and this tally.
    pub fn since(self, before: Tally) -> Tally {
        Tally {
            units: self.units.saturating_sub(before.units),
            kernels: self.kernels.saturating_sub(before.kernels),
            seconds: (self.seconds - before.seconds).max(0.0),
        }
    }
}

/// The counters behind `tally`: compiles running now and since when, and what finished.
struct Busy {
    done: Tally,
    running: usize,
    since: Option<std::time::Instant>,
}

static BUSY: Mutex<Busy> = Mutex::new(Busy {
    done: Tally {
        units: 0,
        kernels: 0,
        seconds: 0.0,
    },
    running: 0,
    since: None,
});

fn busy() -> std::sync::MutexGuard<'static, Busy> {
    BUSY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The compiles of this process so far (the one in flight counted up to now).
pub fn tally() -> Tally {
    let b = busy();
    let running = b.since.map_or(0.0, |t| t.elapsed().as_secs_f64());
    Tally {
        seconds: b.done.seconds + running,
        ..b.done
    }
}

/// One compile in flight, counted into `tally` while it lives.
struct Compiling;

impl Compiling {
    fn start() -> Compiling {
        let mut b = busy();
        if b.running == 0 {
            b.since = Some(std::time::Instant::now());
        }
        b.running += 1;
        Compiling
    }
}

impl Drop for Compiling {
    fn drop(&mut self) {
        let mut b = busy();
        b.running -= 1;
        b.done.units += 1;
        if b.running == 0 {
            if let Some(t) = b.since.take() {
                b.done.seconds += t.elapsed().as_secs_f64();
            }
        }
    }
}

/// Compiles `source` (written at `src`) with `cmd` into `out`: through sccache where it is in
/// use, else (or where sccache itself fails) directly.
fn compile_to(
    tc: &Toolchain,
    cmd: Command,
    source: &Source,
    src: &Path,
    out: &Path,
) -> Result<(), BuildError> {
    let _counted = Compiling::start();
    let what = format!("compiling {}", source.file_name);
    if let Some(s) = tc.sccache() {
        match s.compile(&cmd, source, src, out) {
            sccache::Routed::Compiled => return Ok(()),
            sccache::Routed::Failed(log) => {
                let mut line = cmd;
                line.arg("-c").arg(src).arg("-o").arg(out);
                return Err(BuildError::Tool {
                    what,
                    command: command_line(&line),
                    log,
                });
            }
            sccache::Routed::Unavailable => {}
        }
    }
    let mut cmd = cmd;
    cmd.arg("-c").arg(src).arg("-o").arg(out);
    run(cmd, &what)
}

/// The folder compiled objects are cached in: $FACT_CACHE_DIR, else ~/.cache/fact/build.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FACT_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache/fact/build")
}

/// What `compile_bisecting` settles: the units that compiled, each with its result, and the
/// kernels that failed alone, each with its log.
pub type Bisected<T> = (Vec<(Vec<usize>, T)>, Vec<(usize, String)>);

/// Compiles `units` (lists of kernel indices) with `compile` on `jobs` threads. A unit that fails
/// is split in halves which go back on the queue, down to single kernels; those failures are the
/// result's second half. `done(n)` reports n more kernels settled.
pub fn compile_bisecting<T: Send>(
    units: Vec<Vec<usize>>,
    jobs: usize,
    compile: &(dyn Fn(&[usize]) -> Result<T, String> + Sync),
    done: &(dyn Fn(usize) + Sync),
) -> Bisected<T> {
    let queue = Mutex::new((units, 0usize)); // (pending units, units in flight)
    let ok = Mutex::new(Vec::new());
    let failed = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let unit = {
                    let mut q = queue.lock().unwrap();
                    match q.0.pop() {
                        Some(u) => {
                            q.1 += 1;
                            Some(u)
                        }
                        None if q.1 == 0 => break,
                        None => None,
                    }
                };
                let Some(unit) = unit else {
                    // Another thread may still split a failing unit into new work.
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    continue;
                };
                let r = compile(&unit);
                let mut q = queue.lock().unwrap();
                q.1 -= 1;
                match r {
                    Ok(obj) => {
                        done(unit.len());
                        ok.lock().unwrap().push((unit, obj));
                    }
                    Err(log) if unit.len() == 1 => {
                        done(1);
                        failed.lock().unwrap().push((unit[0], log));
                    }
                    Err(_) => {
                        let (a, b) = unit.split_at(unit.len() / 2);
                        q.0.push(a.to_vec());
                        q.0.push(b.to_vec());
                    }
                }
            });
        }
    });
    let mut ok = ok.into_inner().unwrap();
    ok.sort_by_key(|(u, _)| u[0]);
    let mut failed = failed.into_inner().unwrap();
    failed.sort_by_key(|(i, _)| *i);
    (ok, failed)
}

/// Splits `n` kernels into at most `jobs` contiguous units of near-equal size.
pub fn partition(n: usize, jobs: usize) -> Vec<Vec<usize>> {
    let units = jobs.max(1).min(n.max(1));
    (0..units)
        .map(|u| (u * n / units..(u + 1) * n / units).collect::<Vec<_>>())
        .filter(|u| !u.is_empty())
        .collect()
}

/// One line on stderr for a long step, when progress is wanted but stderr is no terminal (where
/// the bars do not draw): logs of runs in the background show what is compiling and tuning.
pub fn progress_line(show: bool, line: std::fmt::Arguments) {
    use std::io::IsTerminal;
    if show && !std::io::stderr().is_terminal() {
        eprintln!("{line}");
    }
}

/// The one arch `specs` are built for (sm90 for none): nvcc's target is the library's, so a
/// library never mixes them.
fn target_arch(specs: &[Spec]) -> Result<Arch, BuildError> {
    let archs: std::collections::BTreeSet<Arch> = specs.iter().map(Spec::arch).collect();
    match archs.len() {
        0 => Ok(Arch::Sm90),
        1 => Ok(archs.into_iter().next().expect("one arch")),
        _ => Err(BuildError::Mixed(format!(
            "one library cannot hold kernels of two archs ({}); build one library per --arch",
            archs
                .iter()
                .map(|a| a.short_name())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Kernels compiled into cached objects (`compile_objects`).
pub struct Objects {
    /// The requested variants whose kernels compiled, in the order given.
    pub kernels: Vec<Spec>,
    /// Each object once (a multi-kernel unit serves several kernels).
    pub objects: Vec<PathBuf>,
    pub failures: Vec<CompileFailure>,
    pub compiled: usize,
    pub cached: usize,
}

/// Where the ABI header lives: in the cache, not the output folder, so the compile command (part
/// of each object's cache key) is the same whichever folder a library is built for; in a folder
/// named for the header's hash, so a fact of another ABI sharing the cache at the same time never
/// swaps the header under this one's compiles.
fn include_dir(cache: &Path) -> Result<PathBuf, BuildError> {
    let include = cache.join(format!("include-{}", hash_hex(&[ABI_HEADER.as_bytes()])));
    std::fs::create_dir_all(&include).map_err(io(&include))?;
    let header = include.join("fact_kernels.h");
    if std::fs::read_to_string(&header).ok().as_deref() != Some(ABI_HEADER) {
        atomic::write(&header, ABI_HEADER).map_err(io(&header))?;
    }
    Ok(include)
}

/// Where a build writes and how it runs (`compile_objects`, `build_library`).
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// The folder the kernels' sources (`src/`) and the library go to.
    pub out_dir: PathBuf,
    /// The object cache (`default_cache_dir`), shared by every output folder.
    pub cache: PathBuf,
    /// Parallel nvcc jobs: uncached kernels split into about this many translation units.
    pub jobs: usize,
    /// Progress bars (or lines, where stderr is no terminal) on stderr.
    pub show_progress: bool,
    /// The kinds a library holds the torch ops of and checks its kernels with
    /// (`Kind::check_library`): the registry's, `kinds::registry::KINDS`.
    pub kinds: &'static [&'static dyn Kind],
    /// Take a library already linked here from the same objects (the stamp beside it says so) as
    /// it is, and stamp what is linked: for sweep libraries, which a quick phase links ahead of
    /// its sweeps (`compose::realize::link_ahead`). A composed output's library is linked anew.
    pub reuse_linked: bool,
}

/// Compiles the kernels of `specs` to objects in the build cache (what is cached already is
/// taken as it is), on `opts.jobs` threads, a failing unit bisected down to the kernels that
/// fail; their sources go to `opts.out_dir/src`.
pub fn compile_objects(
    tc: &Toolchain,
    specs: &[impl Clone + Into<Spec>],
    opts: &BuildOptions,
) -> Result<Objects, BuildError> {
    let (out_dir, cache) = (opts.out_dir.as_path(), opts.cache.as_path());
    let (jobs, show_progress) = (opts.jobs, opts.show_progress);
    let start = std::time::Instant::now();
    let specs: Vec<Spec> = specs.iter().cloned().map(Into::into).collect();
    let arch = target_arch(&specs)?;
    let src_dir = out_dir.join("src");
    std::fs::create_dir_all(&src_dir).map_err(io(&src_dir))?;
    let include = include_dir(cache)?;
    // Distinct kernels in first-seen order; variants only differ in launch knobs.
    let mut kernels: Vec<Spec> = Vec::new();
    for v in &specs {
        let k = v.kernel();
        if !kernels.iter().any(|x| x.kernel_name() == k.kernel_name()) {
            kernels.push(k);
        }
    }
    let bar = if show_progress {
        let b = ProgressBar::new(kernels.len() as u64);
        b.set_style(
            ProgressStyle::with_template("compiling {bar:30} {pos}/{len} kernels {elapsed} {msg}")
                .expect("progress template"),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    // Kernels already compiled alone (an earlier bisection or a small library) come from the
    // cache as they are; the rest are split into one unit per job. Units never mix families
    // (`kinds::Unit`: the attention headers and the GEMM templates declare overlapping CUTLASS
    // extensions, the two attention examples each their own kernels).
    let units: Vec<Unit> = kernels.iter().map(Spec::unit).collect();
    let families: Vec<String> = units.iter().map(|u| u.family.clone()).collect();
    let nvcc_lines: Vec<String> = units
        .iter()
        .map(|u| command_line(&tc.unit_command(arch, &include, u)))
        .collect();
    let mut objects: Vec<(Vec<usize>, PathBuf)> = Vec::new();
    let mut todo = Vec::new();
    let mut cached = 0;
    // Each kernel is rendered once: for the cache probe, its unit and the unit's `.ref` notes.
    let sources: Vec<codegen::Source> = kernels.iter().map(Spec::render).collect();
    for (i, (k, source)) in kernels.iter().zip(&sources).enumerate() {
        match cached_object(tc, cache, source, &nvcc_lines[i], &k.kernel_name()) {
            Some(obj) => {
                // The sweep folder shows every kernel's source, compiled now or before.
                let path = src_dir.join(&source.file_name);
                atomic::write(&path, &source.text).map_err(io(&path))?;
                objects.push((vec![i], obj));
                cached += 1;
                bar.inc(1);
            }
            None => todo.push(i),
        }
    }
    let compile = |unit: &[usize]| -> Result<(PathBuf, bool), String> {
        let source = codegen::unit_of(&unit.iter().map(|&i| &sources[i]).collect::<Vec<_>>());
        let stem = source.file_name.trim_end_matches(".cu").to_string();
        // Units never mix families, so the first kernel's command is the unit's.
        let cmd = tc.unit_command(arch, &include, &units[unit[0]]);
        let r = compile_cached(tc, &src_dir, cache, &source, cmd, &stem).map_err(|e| match e {
            BuildError::Tool { log, .. } => log,
            other => other.to_string(),
        })?;
        if unit.len() > 1 {
            for &i in unit {
                note_in_unit(
                    tc,
                    cache,
                    &sources[i],
                    &nvcc_lines[i],
                    &kernels[i].kernel_name(),
                    &r.0,
                );
            }
        }
        Ok(r)
    };
    // Each family's kernels split into units over the jobs, in proportion to its share.
    let mut by_family: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for &i in &todo {
        by_family.entry(families[i].clone()).or_default().push(i);
    }
    let units: Vec<Vec<usize>> = by_family
        .values()
        .flat_map(|members| {
            let share = (jobs * members.len()).div_ceil(todo.len().max(1)).max(1);
            partition(members.len(), share)
                .into_iter()
                .map(|u| u.into_iter().map(|j| members[j]).collect::<Vec<usize>>())
        })
        .collect();
    progress_line(
        show_progress,
        format_args!(
            "compiling {} kernels ({cached} cached) into {}",
            kernels.len(),
            out_dir.display()
        ),
    );
    let (built, failed) = compile_bisecting(units, jobs, &compile, &|n| bar.inc(n as u64));
    bar.finish_and_clear();
    progress_line(
        show_progress,
        format_args!(
            "compiled {} kernels in {:.0} s, {} failed",
            kernels.len(),
            start.elapsed().as_secs_f64(),
            failed.len()
        ),
    );
    let mut compiled = 0;
    for (unit, (obj, was_cached)) in built {
        if was_cached {
            cached += unit.len();
        } else {
            compiled += unit.len();
        }
        objects.push((unit, obj));
    }
    busy().done.kernels += compiled;
    let failures: Vec<CompileFailure> = failed
        .into_iter()
        .map(|(i, log)| {
            let k = &kernels[i];
            CompileFailure {
                kernel: k.kernel_name(),
                source: src_dir.join(format!("{}.cu", k.kernel_name())),
                command: nvcc_lines[i].clone(),
                log,
            }
        })
        .collect();
    let bad: std::collections::HashSet<&str> = failures.iter().map(|f| f.kernel.as_str()).collect();
    let kernels: Vec<Spec> = specs
        .iter()
        .filter(|v| !bad.contains(v.kernel_name().as_str()))
        .cloned()
        .collect();
    let mut objects: Vec<PathBuf> = objects.into_iter().map(|(_, o)| o).collect();
    objects.sort();
    objects.dedup();
    Ok(Objects {
        kernels,
        objects,
        failures,
        compiled,
        cached,
    })
}

/// Compiles the library's torch op object (the kinds' torch ops for `arch`, a host compile
/// against torch's headers, the better part of a minute) into the build cache, where
/// `build_library` takes it; a compose starts it beside its first kernels. Returns the object
/// and whether it was cached.
pub fn compile_op_object(
    tc: &Toolchain,
    arch: Arch,
    opts: &BuildOptions,
) -> Result<(PathBuf, bool), BuildError> {
    let src_dir = opts.out_dir.join("src");
    std::fs::create_dir_all(&src_dir).map_err(io(&src_dir))?;
    let include = include_dir(&opts.cache)?;
    let op = render_op_library(opts.kinds, arch);
    compile_cached(
        tc,
        &src_dir,
        &opts.cache,
        &op,
        tc.cxx_command(&include),
        "torch_op",
    )
}

/// Renders, compiles and links `specs` (GEMM variants and other kinds' kernels) into
/// `opts.out_dir/<lib_name>`, one library with its dispatch table and the torch op (compiled
/// beside the kernels: it does not depend on them). Kernels that fail to compile are left out
/// (with every variant of them) and reported in `Built::failures`.
pub fn build_library(
    tc: &Toolchain,
    specs: &[impl Clone + Into<Spec>],
    lib_name: &str,
    opts: &BuildOptions,
) -> Result<Built, BuildError> {
    let (out_dir, cache) = (opts.out_dir.as_path(), opts.cache.as_path());
    let start = std::time::Instant::now();
    let specs: Vec<Spec> = specs.iter().cloned().map(Into::into).collect();
    // What each kind's kernels cannot share (fp32 attention kernels of two maths).
    for kind in opts.kinds {
        let mine: Vec<&Spec> = specs
            .iter()
            .filter(|s| s.kind().name() == kind.name())
            .collect();
        kind.check_library(&mine).map_err(BuildError::Mixed)?;
    }
    let arch = target_arch(&specs)?;
    let src_dir = out_dir.join("src");
    std::fs::create_dir_all(&src_dir).map_err(io(&src_dir))?;
    let include = include_dir(cache)?;
    let (objects, op_obj) = std::thread::scope(|scope| {
        let op_obj = scope.spawn(|| compile_op_object(tc, arch, opts));
        let objects = compile_objects(tc, &specs, opts);
        (
            objects,
            op_obj.join().expect("the torch op compile does not panic"),
        )
    });
    let Objects {
        kernels,
        objects,
        failures,
        compiled,
        cached,
    } = objects?;
    let (op_obj, _) = op_obj?;
    if kernels.is_empty() {
        let first = failures
            .first()
            .map(|f| f.to_string())
            .unwrap_or_else(|| "no kernels requested".into());
        return Err(BuildError::AllFailed(first));
    }
    let dispatch = crate::kinds::render_dispatch(&kernels);
    let (dispatch_obj, _) = compile_cached(
        tc,
        &src_dir,
        cache,
        &dispatch,
        tc.host_command(&include),
        "dispatch",
    )?;

    let library = out_dir.join(lib_name);
    let torch_lib = tc.torch.join("lib");
    // What the link reads, each object named by its content (the cache's names) and the link's
    // own inputs: a sweep library already linked from these (its stamp beside it says so) is
    // taken as it is. A quick phase links its sweeps' libraries side by side (`link_ahead`), and
    // each sweep then finds its own linked.
    let mut inputs: Vec<String> = objects.iter().map(|o| o.display().to_string()).collect();
    inputs.push(dispatch_obj.display().to_string());
    inputs.push(op_obj.display().to_string());
    inputs.push(torch_lib.display().to_string());
    inputs.push(format!("{:?}", tc.cudart()));
    // The link's flags are this build's.
    inputs.push(format!(
        "{} {}",
        env!("CARGO_PKG_VERSION"),
        fact_version::COMMIT
    ));
    let stamp_text = inputs.join("\n");
    let stamp = out_dir.join(format!(".{lib_name}.inputs"));
    let linked = opts.reuse_linked
        && library.is_file()
        && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&stamp_text);
    if !linked {
        // Gone before the link and written after it: a link stopped midway never leaves a stamp
        // that vouches for another library.
        match std::fs::remove_file(&stamp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&stamp)(e)),
            _ => {}
        }
        // Linked beside its place and renamed into it: a process that loaded the previous
        // library keeps it, and a build stopped midway leaves the previous one whole.
        atomic::write_with(
            &library,
            |tmp| {
                let mut link = Command::new("c++");
                link.arg("-shared")
                    .arg("-o")
                    .arg(tmp)
                    .args(&objects)
                    .arg(&dispatch_obj)
                    .arg(&op_obj);
                link.arg(format!("-L{}", torch_lib.display()));
                link.arg(format!("-Wl,-rpath,{}", torch_lib.display()));
                // torch_cuda and c10_cuda are needed for their static initialisers even where no
                // symbol is.
                link.arg("-Wl,--no-as-needed");
                for l in ["torch", "torch_cpu", "torch_cuda", "c10", "c10_cuda"] {
                    link.arg(format!("-l{l}"));
                }
                match tc.cudart() {
                    Some(p) => {
                        link.arg(&p);
                        if let Some(d) = p.parent() {
                            link.arg(format!("-Wl,-rpath,{}", d.display()));
                        }
                    }
                    None => {
                        link.arg("-lcudart");
                    }
                }
                // Bind the library's own symbols inside it, so the dispatch table never resolves to
                // another fact library's that happens to be loaded in the same process.
                link.arg("-Wl,-Bsymbolic");
                run(link, "linking the kernel library")
            },
            io(&library),
        )?;
        if opts.reuse_linked {
            atomic::write(&stamp, &stamp_text).map_err(io(&stamp))?;
        }
    }
    Ok(Built {
        library,
        kernels,
        failures,
        compiled,
        cached,
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_library_has_one_arch() {
        let a = |arch| crate::kinds::fake::spec("k", arch);
        assert_eq!(
            target_arch(&[a(Arch::Sm80), a(Arch::Sm80)]).unwrap(),
            Arch::Sm80
        );
        let e = target_arch(&[a(Arch::Sm80), a(Arch::Sm90)])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("two archs (sm80, sm90)") && e.contains("--arch"),
            "{e}"
        );
    }

    #[test]
    fn partition_covers_every_kernel_once_in_at_most_jobs_units() {
        for (n, jobs) in [(0, 4), (1, 16), (5, 2), (32, 16), (33, 16), (7, 7)] {
            let units = partition(n, jobs);
            assert!(units.len() <= jobs.max(1));
            let all: Vec<usize> = units.concat();
            assert_eq!(all, (0..n).collect::<Vec<_>>());
        }
    }

    #[test]
    fn bisection_isolates_bad_kernels_and_keeps_the_rest() {
        // A fake compiler: a unit fails when it holds kernel 5 or 11.
        let calls = AtomicUsize::new(0);
        let settled = AtomicUsize::new(0);
        let compile = |u: &[usize]| -> Result<usize, String> {
            calls.fetch_add(1, Ordering::SeqCst);
            if u.contains(&5) || u.contains(&11) {
                Err(format!("error: static_assert in unit {u:?}"))
            } else {
                Ok(u.len())
            }
        };
        let (ok, failed) = compile_bisecting(partition(16, 2), 3, &compile, &|n| {
            settled.fetch_add(n, Ordering::SeqCst);
        });
        assert_eq!(failed.iter().map(|f| f.0).collect::<Vec<_>>(), vec![5, 11]);
        let mut good: Vec<usize> = ok.iter().flat_map(|(u, _)| u.clone()).collect();
        good.sort();
        assert_eq!(
            good,
            (0..16).filter(|i| *i != 5 && *i != 11).collect::<Vec<_>>()
        );
        assert_eq!(settled.load(Ordering::SeqCst), 16);
        // Two units of 8, each bisected down to its bad kernel: 2 + 2·(2+2+2) compiles, far fewer
        // than recompiling all 16 alone.
        assert_eq!(calls.load(Ordering::SeqCst), 14);
    }

    #[test]
    fn a_clean_build_compiles_each_unit_once() {
        let calls = AtomicUsize::new(0);
        let (ok, failed) = compile_bisecting(
            partition(9, 4),
            4,
            &|u: &[usize]| {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(u.len())
            },
            &|_| {},
        );
        assert!(failed.is_empty());
        assert_eq!(ok.len(), 4);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }
}
