//! Shared set-up: fixture models, the fact binary, and the one compiled kernel library the
//! compile and compose tests share (compiling CUTLASS takes a minute; the cache makes reuse free).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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

pub fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

/// A build cache shared by the tests of one run, so each CUTLASS kernel compiles once.
pub fn cache_dir() -> PathBuf {
    root().join("target/test-build-cache")
}

pub fn fact() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fact"));
    c.env("FACT_CACHE_DIR", cache_dir());
    c
}
