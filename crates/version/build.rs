//! Reads the checkout's commit and whether the sources fact is built from differ from it, and
//! reruns whenever one of those sources, HEAD or its branch changes.
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the fact binary is built from, relative to the checkout's root.
const SOURCES: [&str; 9] = [
    "src",
    "templates",
    "include",
    "knowledge",
    "pattern-table",
    "crates",
    "build.rs",
    "Cargo.toml",
    "Cargo.lock",
];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.join("../..");
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    for s in SOURCES {
        let path = root.join(s);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    let Some(hash) = git(&["rev-parse", "--short=7", "HEAD"]) else {
        println!("cargo:rustc-env=FACT_COMMIT=unknown");
        return;
    };
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = root.join(dir);
        rerun(&dir.join("HEAD"));
        // The index too: a commit of staged edits leaves HEAD's file as it was on a branch.
        rerun(&dir.join("index"));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            rerun(&dir.join(branch));
        }
    }
    let mut status = vec!["status", "--porcelain", "--untracked-files=normal", "--"];
    status.extend(SOURCES);
    let dirty = git(&status).is_some_and(|s| !s.is_empty());
    let suffix = if dirty { "-dirty" } else { "" };
    println!("cargo:rustc-env=FACT_COMMIT={hash}{suffix}");
}

fn rerun(path: &Path) {
    println!("cargo:rerun-if-changed={}", path.display());
}
