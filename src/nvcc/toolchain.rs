//! Where the compilers and headers are (nvcc, CUDA, CUTLASS, libtorch, sccache) and the compile
//! commands built from them: one for each unit family, another for the torch op's C++.

use super::sccache::{self, Sccache};
use super::{find_on_path, BuildError};
use crate::kinds::Unit;
use crate::types::Arch;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

/// Where the compilers and headers are. Environment first (CUDA_HOME, CUTLASS_DIR, TORCH_DIR), then
/// the paths ./setup made when this binary was built.
#[derive(Clone, Debug)]
pub struct Toolchain {
    pub nvcc: PathBuf,
    pub cuda_home: PathBuf,
    pub cutlass: PathBuf,
    pub torch: PathBuf,
    /// The shared compile cache every compile goes through (`sccache::find`), or why there is
    /// none. Its server starts on the first compile that needs it.
    pub sccache: Result<Arc<Sccache>, String>,
    /// nvcc's version once asked (`nvcc_version`): every realized pattern's provenance names it,
    /// and each ask spawns nvcc.
    nvcc_version: OnceLock<String>,
}

impl Toolchain {
    pub fn discover() -> Result<Toolchain, BuildError> {
        let nvcc = std::env::var_os("CUDA_HOME")
            .map(|h| PathBuf::from(h).join("bin/nvcc"))
            .filter(|p| p.is_file())
            .or_else(|| find_on_path("nvcc"))
            .or_else(|| {
                Some(PathBuf::from(env!("FACT_DEFAULT_CUDA_HOME")).join("bin/nvcc"))
                    .filter(|p| p.is_file())
            })
            .ok_or(BuildError::NoNvcc)?;
        let cuda_home = nvcc
            .parent()
            .and_then(Path::parent)
            .ok_or(BuildError::NoNvcc)?
            .to_path_buf();
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
        Ok(Toolchain {
            nvcc,
            cuda_home,
            cutlass,
            torch,
            sccache: sccache::find().map(|b| Arc::new(Sccache::new(b))),
            nvcc_version: OnceLock::new(),
        })
    }

    /// A toolchain of paths alone, for tests that compile nothing: no sccache, and an nvcc that
    /// is not there (its version reads "unknown").
    #[cfg(test)]
    pub(crate) fn for_tests() -> Toolchain {
        Toolchain {
            nvcc: "/nonexistent/cuda/bin/nvcc".into(),
            cuda_home: "/nonexistent/cuda".into(),
            cutlass: "/nonexistent/cutlass".into(),
            torch: "/nonexistent/torch".into(),
            sccache: Err("off".into()),
            nvcc_version: OnceLock::new(),
        }
    }

    /// sccache where compiles go through it now (found, its server answering, no request failed).
    pub(super) fn sccache(&self) -> Option<&Sccache> {
        self.sccache.as_deref().ok().filter(|s| s.ready())
    }

    /// The compile cache's state before a window of compiles (a compose), to report it with
    /// `sccache_report`; None without sccache.
    pub fn sccache_mark(&self) -> Option<sccache::Mark> {
        self.sccache.as_deref().ok().map(Sccache::mark)
    }

    /// What sccache did since `mark`.
    pub fn sccache_report(&self, mark: Option<&sccache::Mark>) -> Option<sccache::SccacheReport> {
        let s = self.sccache.as_deref().ok()?;
        Some(s.since(mark?))
    }

    /// CUTLASS's version from its headers, e.g. "4.2.0".
    pub fn cutlass_version(&self) -> String {
        let text = std::fs::read_to_string(self.cutlass.join("include/cutlass/version.h"))
            .unwrap_or_default();
        let grab = |key: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(&format!("#define {key} "))
                        .map(|v| v.trim().to_string())
                })
                .unwrap_or_else(|| "?".into())
        };
        format!(
            "{}.{}.{}",
            grab("CUTLASS_MAJOR"),
            grab("CUTLASS_MINOR"),
            grab("CUTLASS_PATCH")
        )
    }

    /// nvcc's release, e.g. "13.0" ("unknown" where it does not say), asked once.
    pub fn nvcc_version(&self) -> String {
        self.nvcc_version
            .get_or_init(|| ask_nvcc_version(&self.nvcc))
            .clone()
    }

    pub(super) fn cudart(&self) -> Option<PathBuf> {
        for dir in ["lib64", "lib", "targets/x86_64-linux/lib"] {
            let d = self.cuda_home.join(dir);
            if d.join("libcudart.so").exists() {
                return Some(d.join("libcudart.so"));
            }
            if let Ok(rd) = std::fs::read_dir(&d) {
                let mut found: Vec<PathBuf> = rd
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("libcudart.so."))
                    })
                    .collect();
                found.sort();
                if let Some(p) = found.into_iter().next() {
                    return Some(p);
                }
            }
        }
        None
    }

    pub(super) fn nvcc_command(&self, arch: Arch, include: &Path) -> Command {
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
            // The fused attention kernel's headers (src/kinds/attention/templates/sm80_fmha.cu.hbs).
            .include(self.cutlass.join("examples/41_fused_multi_head_attention"))
            .get_compiler();
        tool.to_command()
    }

    /// The compile command of a unit of kernels: the common one, plus the CUTLASS folders and
    /// flags their kind adds (`kinds::Unit`: examples/88's folder and fast math for the sm90
    /// attention kernels), so every other object keeps its cache key.
    pub(super) fn unit_command(&self, arch: Arch, include: &Path, unit: &Unit) -> Command {
        let mut cmd = self.nvcc_command(arch, include);
        for folder in &unit.cutlass_includes {
            cmd.arg(format!("-I{}", self.cutlass.join(folder).display()));
        }
        for flag in &unit.flags {
            cmd.arg(flag);
        }
        cmd
    }

    /// The host compile of a unit without device code (a library's dispatch table): the host
    /// compiler with fact's and CUDA's headers. nvcc took 1.9 s for one (its device passes run
    /// on an empty device unit), the host compiler 0.4 s, and each sweep's library has one.
    pub(super) fn host_command(&self, include: &Path) -> Command {
        let tool = host_build()
            .flag("-DNDEBUG")
            .include(include)
            .include(self.cuda_home.join("include"))
            .get_compiler();
        tool.to_command()
    }

    /// The host compile of the op library's torch ops: against torch's headers and ABI.
    pub(super) fn cxx_command(&self, include: &Path) -> Command {
        let tool = host_build()
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

/// What every host (not nvcc) compile shares: C++17, -O2, position-independent, cc's cargo
/// output off.
fn host_build() -> cc::Build {
    let mut b = cc::Build::new();
    b.cpp(true)
        .target("x86_64-unknown-linux-gnu")
        .host("x86_64-unknown-linux-gnu")
        .opt_level(2)
        .debug(false)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .warnings(false)
        .pic(true)
        .flag("-std=c++17");
    b
}

/// The release `nvcc --version` states (its child process: the reason `nvcc_version` keeps it).
fn ask_nvcc_version(nvcc: &Path) -> String {
    Command::new(nvcc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find(|l| l.contains("release"))
                .map(str::to_string)
        })
        .and_then(|l| {
            l.split("release ")
                .nth(1)
                .map(|v| v.split(',').next().unwrap_or(v).to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::super::command_line;
    use super::*;

    #[test]
    fn a_units_kind_adds_its_folders_and_flags_to_the_common_command() {
        // Paths only: building a command runs nothing.
        let tc = Toolchain {
            nvcc: "/opt/cuda/bin/nvcc".into(),
            cuda_home: "/opt/cuda".into(),
            cutlass: "/opt/cutlass".into(),
            torch: "/opt/torch".into(),
            sccache: Err("off".into()),
            nvcc_version: OnceLock::new(),
        };
        let line = |unit: &Unit| command_line(&tc.unit_command(Arch::Sm90, Path::new("/i"), unit));
        let common = command_line(&tc.nvcc_command(Arch::Sm90, Path::new("/i")));
        assert_eq!(line(&Unit::plain("gemm")), common);
        let attention = line(&Unit {
            family: "attention_sm90_bf16".into(),
            cutlass_includes: vec!["examples/88_hopper_fmha"],
            flags: vec!["--use_fast_math"],
        });
        assert_eq!(
            attention,
            format!("{common} -I/opt/cutlass/examples/88_hopper_fmha --use_fast_math")
        );
    }

    #[test]
    fn nvccs_version_is_asked_once_and_read_from_its_release_line() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let calls = dir.path().join("calls");
        let nvcc = dir.path().join("nvcc");
        std::fs::write(
            &nvcc,
            format!(
                "#!/bin/sh\necho asked >> {}\necho 'nvcc: NVIDIA (R) Cuda compiler driver'\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n",
                calls.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();
        let tc = Toolchain {
            nvcc,
            cuda_home: "/opt/cuda".into(),
            cutlass: "/opt/cutlass".into(),
            torch: "/opt/torch".into(),
            sccache: Err("off".into()),
            nvcc_version: OnceLock::new(),
        };
        assert_eq!(tc.nvcc_version(), "13.0");
        assert_eq!(tc.clone().nvcc_version(), "13.0");
        assert_eq!(std::fs::read_to_string(&calls).unwrap(), "asked\n");
    }
}
