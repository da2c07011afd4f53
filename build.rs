//! Builds the C++ TorchScript bridge (cxx) against the libtorch that torch-sys links, binds the
//! kernel-library ABI header with bindgen, and bakes the set-up paths from ./setup as defaults that
//! the environment can override at run time (CUTLASS_DIR, CUDA_HOME, TORCH_DIR, FACT_SCCACHE).

use std::env;
use std::path::{Path, PathBuf};

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let libtorch = env::var("LIBTORCH")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join(".fact/torch"));
    let libtorch = libtorch.canonicalize().unwrap_or_else(|_| {
        panic!(
            "libtorch not found at {}: run ./setup first",
            libtorch.display()
        )
    });
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let include = libtorch.join("include");
    let lib = libtorch.join("lib");

    cxx_build::bridge("src/torch/mod.rs")
        .file("src/torch/bridge.cc")
        .file("src/torch/memo.cc")
        .file("src/torch/export.cc")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag_if_supported("-Wno-unused-parameter")
        .compile("fact_bridge");
    for f in [
        "src/torch/mod.rs",
        "src/torch/bridge.cc",
        "src/torch/bridge.h",
        "src/torch/memo.cc",
        "src/torch/export.cc",
        "src/torch/export.h",
        "src/torch/ir.h",
        "src/torch/mask_class.h",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
    println!("cargo:rustc-link-search=native={}", lib.display());
    for l in ["torch", "torch_cpu", "c10"] {
        println!("cargo:rustc-link-lib=dylib={l}");
    }

    // Let the binary and the tests find libtorch and the CUDA runtime libraries it needs
    // (libtorch_cpu itself links libcudart and libcupti) without LD_LIBRARY_PATH. On the GPU
    // machine LD_LIBRARY_PATH points at that machine's torch and is searched first.
    let mut rpaths = vec![lib.clone()];
    if let Some(site) = libtorch.parent() {
        if let Ok(entries) = std::fs::read_dir(site.join("nvidia")) {
            for e in entries.flatten() {
                if e.path().join("lib").is_dir() {
                    rpaths.push(e.path().join("lib"));
                }
            }
        }
    }
    for p in &rpaths {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", p.display());
    }

    let header = root.join("include/fact_kernels.h");
    println!("cargo:rerun-if-changed={}", header.display());
    // The pip libclang ships without clang's builtin headers (stddef.h); the C compiler's serve.
    let builtin = std::process::Command::new("cc")
        .arg("-print-file-name=include")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("-I{builtin}"))
        .allowlist_function("fact_.*")
        .allowlist_type("Fact.*")
        .allowlist_var("FACT_.*")
        .rustified_enum("FactStatus")
        .generate()
        .expect(
            "bindgen could not bind include/fact_kernels.h (is LIBCLANG_PATH set? run ./setup)",
        );
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    bindings.write_to_file(out.join("fact_kernels.rs")).unwrap();

    bake("FACT_DEFAULT_TORCH_DIR", &libtorch);
    bake("FACT_DEFAULT_CUTLASS_DIR", &root.join(".fact/cutlass"));
    bake("FACT_DEFAULT_CUDA_HOME", &root.join(".fact/cuda"));
    bake("FACT_DEFAULT_SCCACHE", &root.join(".fact/sccache"));
    println!("cargo:rustc-env=FACT_SOURCE_ROOT={}", root.display());
}

fn bake(name: &str, path: &Path) {
    let resolved = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    println!("cargo:rustc-env={name}={}", resolved.display());
}
