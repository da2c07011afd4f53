//! Builds kernel libraries: each kernel is its own translation unit compiled by nvcc (through `cc`)
//! in parallel and cached by its name and a hash of its source and flags; the dispatch table and
//! the torch op join them in one shared library. A kernel that fails to compile costs only itself:
//! its source stays on disk and the failure (command and log) is returned, not raised.

use crate::codegen::{self, Source};
use crate::space::KernelSpec;
use crate::types::Arch;
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use thiserror::Error;

pub mod library;
pub use library::KernelLibrary;

pub const ABI_HEADER: &str = include_str!("../../include/fact_kernels.h");

#[derive(Debug, Error)]
pub enum BuildError {
    #[error("nvcc not found: set CUDA_HOME or put nvcc on PATH (./setup installs a pinned pip nvcc)")]
    NoNvcc,
    #[error("CUTLASS not found at {0}: set CUTLASS_DIR to the cutlass_library/source folder of nvidia-cutlass==4.2.0.0 (./setup installs it)")]
    NoCutlass(String),
    #[error("libtorch headers not found at {0}: set TORCH_DIR to the torch package folder (./setup installs torch 2.11.0)")]
    NoTorch(String),
    #[error("every kernel failed to compile; first failure:\n{0}")]
    AllFailed(String),
    #[error("{what} failed: {command}\n{log}")]
    Tool { what: String, command: String, log: String },
    #[error("io error at {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |source| BuildError::Io { path: path.display().to_string(), source }
}

/// Where the compilers and headers are. Environment first (CUDA_HOME, CUTLASS_DIR, TORCH_DIR), then
/// the paths ./setup made when this binary was built.
#[derive(Clone, Debug)]
pub struct Toolchain {
    pub nvcc: PathBuf,
    pub cuda_home: PathBuf,
    pub cutlass: PathBuf,
    pub torch: PathBuf,
}

impl Toolchain {
    pub fn discover() -> Result<Toolchain, BuildError> {
        let nvcc = std::env::var_os("CUDA_HOME")
            .map(|h| PathBuf::from(h).join("bin/nvcc"))
            .filter(|p| p.is_file())
            .or_else(|| find_on_path("nvcc"))
            .or_else(|| Some(PathBuf::from(env!("FACT_DEFAULT_CUDA_HOME")).join("bin/nvcc")).filter(|p| p.is_file()))
            .ok_or(BuildError::NoNvcc)?;
        let cuda_home = nvcc.parent().and_then(Path::parent).ok_or(BuildError::NoNvcc)?.to_path_buf();
        let cutlass = std::env::var_os("CUTLASS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("FACT_DEFAULT_CUTLASS_DIR")));
        if !cutlass.join("include/cutlass/cutlass.h").is_file() {
            return Err(BuildError::NoCutlass(cutlass.display().to_string()));
        }
        let torch = std::env::var_os("TORCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("FACT_DEFAULT_TORCH_DIR")));
        if !torch.join("include/torch/library.h").is_file() {
            return Err(BuildError::NoTorch(torch.display().to_string()));
        }
        Ok(Toolchain { nvcc, cuda_home, cutlass, torch })
    }

    /// CUTLASS's version from its headers, e.g. "4.2.0".
    pub fn cutlass_version(&self) -> String {
        let text = std::fs::read_to_string(self.cutlass.join("include/cutlass/version.h")).unwrap_or_default();
        let grab = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("#define {key} ")).map(|v| v.trim().to_string()))
                .unwrap_or_else(|| "?".into())
        };
        format!("{}.{}.{}", grab("CUTLASS_MAJOR"), grab("CUTLASS_MINOR"), grab("CUTLASS_PATCH"))
    }

    pub fn nvcc_version(&self) -> String {
        Command::new(&self.nvcc)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().find(|l| l.contains("release")).map(str::to_string))
            .and_then(|l| l.split("release ").nth(1).map(|v| v.split(',').next().unwrap_or(v).to_string()))
            .unwrap_or_else(|| "unknown".into())
    }

    fn cudart(&self) -> Option<PathBuf> {
        for dir in ["lib64", "lib", "targets/x86_64-linux/lib"] {
            let d = self.cuda_home.join(dir);
            if d.join("libcudart.so").exists() {
                return Some(d.join("libcudart.so"));
            }
            if let Ok(rd) = std::fs::read_dir(&d) {
                let mut found: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libcudart.so.")))
                    .collect();
                found.sort();
                if let Some(p) = found.into_iter().next() {
                    return Some(p);
                }
            }
        }
        None
    }

    fn nvcc_command(&self, arch: Arch, include: &Path) -> Command {
        let tool = cc::Build::new()
            .cuda(true)
            .cudart("shared")
            .compiler(&self.nvcc)
            .target("x86_64-unknown-linux-gnu")
            .host("x86_64-unknown-linux-gnu")
            .opt_level(3)
            .debug(false)
            .cargo_metadata(false)
            .cargo_warnings(false)
            .warnings(false)
            // cc's defaults are host-compiler flags that nvcc rejects unwrapped.
            .no_default_flags(true)
            .flag("-O3")
            .flag("-Xcompiler=-fPIC")
            .flag("-std=c++17")
            .flag(arch.nvcc_gencode())
            .flag("--expt-relaxed-constexpr")
            .flag("-DNDEBUG")
            .include(include)
            .include(self.cutlass.join("include"))
            .include(self.cutlass.join("tools/util/include"))
            .get_compiler();
        tool.to_command()
    }

    fn cxx_command(&self, include: &Path) -> Command {
        let tool = cc::Build::new()
            .cpp(true)
            .target("x86_64-unknown-linux-gnu")
            .host("x86_64-unknown-linux-gnu")
            .opt_level(2)
            .debug(false)
            .cargo_metadata(false)
            .cargo_warnings(false)
            .warnings(false)
            .pic(true)
            .flag("-std=c++17")
            .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
            .flag("-DGLOG_USE_GLOG_EXPORT")
            .include(include)
            .include(self.torch.join("include"))
            .include(self.torch.join("include/torch/csrc/api/include"))
            .include(self.cuda_home.join("include"))
            .get_compiler();
        tool.to_command()
    }
}

fn find_on_path(exe: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(exe)).find(|p| p.is_file())
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
        writeln!(f, "{} failed to compile\n  source: {}\n  command: {}", self.kernel, self.source.display(), self.command)?;
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
    /// Kernels in the library, in dispatch order.
    pub kernels: Vec<KernelSpec>,
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
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn command_line(c: &Command) -> String {
    std::iter::once(c.get_program().to_string_lossy().to_string())
        .chain(c.get_args().map(|a| a.to_string_lossy().to_string()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn run(mut c: Command, what: &str) -> Result<(), BuildError> {
    let line = command_line(&c);
    let out = c.output().map_err(|e| BuildError::Tool { what: what.into(), command: line.clone(), log: e.to_string() })?;
    if out.status.success() {
        return Ok(());
    }
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Err(BuildError::Tool { what: what.into(), command: line, log })
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
    std::fs::write(&src, &source.text).map_err(io(&src))?;
    let key = hash_hex(&[source.text.as_bytes(), command_line(&cmd).as_bytes(), tc.nvcc.as_os_str().as_encoded_bytes()]);
    let obj = cache.join(format!("{stem}-{key}.o"));
    if obj.is_file() {
        return Ok((obj, true));
    }
    let tmp = cache.join(format!("{stem}-{key}.o.tmp{}", std::process::id()));
    let mut cmd = cmd;
    cmd.arg("-c").arg(&src).arg("-o").arg(&tmp);
    run(cmd, &format!("compiling {}", source.file_name))?;
    std::fs::rename(&tmp, &obj).map_err(io(&obj))?;
    Ok((obj, false))
}

/// The folder compiled objects are cached in: $FACT_CACHE_DIR, else ~/.cache/fact/build.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FACT_CACHE_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache/fact/build")
}

/// Renders, compiles and links `specs` into `out_dir/<lib_name>`. Kernels that fail to compile are
/// left out of the library and reported in `Built::failures`.
pub fn build_library(
    tc: &Toolchain,
    specs: &[KernelSpec],
    out_dir: &Path,
    lib_name: &str,
    cache: &Path,
    jobs: usize,
    show_progress: bool,
) -> Result<Built, BuildError> {
    let start = std::time::Instant::now();
    let arch = specs.first().map(|k| k.arch).unwrap_or(Arch::Sm90);
    let src_dir = out_dir.join("src");
    // The ABI header lives in the cache, not the output folder, so the compile command (part of
    // each object's cache key) is the same whichever folder a library is built for.
    let include = cache.join("include");
    for d in [&src_dir, &include] {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    let header = include.join("fact_kernels.h");
    if std::fs::read_to_string(&header).ok().as_deref() != Some(ABI_HEADER) {
        let tmp = include.join(format!("fact_kernels.h.tmp{}", std::process::id()));
        std::fs::write(&tmp, ABI_HEADER).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &header).map_err(io(&header))?;
    }

    let bar = if show_progress {
        let b = ProgressBar::new(specs.len() as u64);
        b.set_style(
            ProgressStyle::with_template("compiling {bar:30} {pos}/{len} kernels {elapsed} {msg}")
                .expect("progress template"),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let results: Mutex<Vec<(usize, Result<(PathBuf, bool), CompileFailure>)>> = Mutex::new(Vec::new());
    let next = Mutex::new(0usize);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1).min(specs.len().max(1)) {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some(spec) = specs.get(i) else { break };
                let source = codegen::render_kernel(spec);
                let cmd = tc.nvcc_command(spec.arch, &include);
                let line = command_line(&cmd);
                let r = compile_cached(tc, &src_dir, cache, &source, cmd, &spec.name()).map_err(|e| {
                    let log = match e {
                        BuildError::Tool { log, .. } => log,
                        other => other.to_string(),
                    };
                    CompileFailure { kernel: spec.name(), source: src_dir.join(&source.file_name), command: line, log }
                });
                bar.inc(1);
                results.lock().unwrap().push((i, r));
            });
        }
    });
    bar.finish_and_clear();
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|(i, _)| *i);
    let mut objects = Vec::new();
    let mut kernels = Vec::new();
    let mut failures = Vec::new();
    let (mut compiled, mut cached) = (0, 0);
    for (i, r) in results {
        match r {
            Ok((obj, was_cached)) => {
                if was_cached {
                    cached += 1
                } else {
                    compiled += 1
                }
                objects.push(obj);
                kernels.push(specs[i].clone());
            }
            Err(f) => failures.push(f),
        }
    }
    if kernels.is_empty() {
        let first = failures.first().map(|f| f.to_string()).unwrap_or_else(|| "no kernels requested".into());
        return Err(BuildError::AllFailed(first));
    }
    let dispatch = codegen::render_dispatch(&kernels);
    let (dispatch_obj, _) = compile_cached(tc, &src_dir, cache, &dispatch, tc.nvcc_command(arch, &include), "dispatch")?;
    let op = codegen::render_torch_op(arch);
    let (op_obj, _) = compile_cached(tc, &src_dir, cache, &op, tc.cxx_command(&include), "torch_op")?;

    let library = out_dir.join(lib_name);
    let torch_lib = tc.torch.join("lib");
    let mut link = Command::new("c++");
    link.arg("-shared").arg("-o").arg(&library).args(&objects).arg(&dispatch_obj).arg(&op_obj);
    link.arg(format!("-L{}", torch_lib.display()));
    link.arg(format!("-Wl,-rpath,{}", torch_lib.display()));
    // torch_cuda and c10_cuda are needed for their static initialisers even where no symbol is.
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
    // Bind the library's own symbols inside it, so the dispatch table never resolves to another
    // fact library's that happens to be loaded in the same process.
    link.arg("-Wl,-Bsymbolic");
    run(link, "linking the kernel library")?;
    Ok(Built { library, kernels, failures, compiled, cached, seconds: start.elapsed().as_secs_f64() })
}
