//! `fact doctor`: what this set-up compiles and tunes with, each part checked on its own so that
//! one missing piece hides none of the others: the toolchain (nvcc, CUTLASS, libtorch), fact's
//! build cache, the shared compile cache under it (sccache: the binary, the backend its server
//! uses and that server's hits and misses) and the GPU. What is missing comes with its fix. It
//! changes nothing, except that it starts sccache's server where none runs (as a compile would).

use crate::compose::{self, Device};
use crate::nvcc::sccache::{self, Sccache};
use crate::nvcc::{self, Toolchain};
use crate::types::Arch;
use anyhow::Result;
use serde_json::{json, Value};
use std::path::Path;

pub(super) fn doctor(json: bool) -> Result<()> {
    let toolchain = match Toolchain::discover() {
        Ok(tc) => json!({
            "nvcc": tc.nvcc,
            "cuda": tc.nvcc_version(),
            "cutlass": tc.cutlass,
            "cutlass_version": tc.cutlass_version(),
            "torch": tc.torch,
        }),
        Err(e) => json!({ "error": e.to_string() }),
    };
    let dir = nvcc::default_cache_dir();
    let (objects, bytes) = cache_size(&dir);
    let build_cache = json!({ "dir": dir, "objects": objects, "bytes": bytes });
    let sccache = sccache_status();
    let device = Device::detect();
    let gpu = match &device {
        Some(d) => json!({
            "device": d.label(),
            "tunes": compose::target_arch(None, Some(d)).ok().map(Arch::short_name),
        }),
        None => Value::Null,
    };
    let report = json!({
        "fact": env!("CARGO_PKG_VERSION"),
        "toolchain": toolchain,
        "build_cache": build_cache,
        "sccache": sccache,
        "gpu": gpu,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_doctor(&report);
    }
    Ok(())
}

/// Objects in fact's build cache and their bytes (0 where it does not exist yet).
fn cache_size(dir: &Path) -> (usize, u64) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    rd.flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "o"))
        .fold((0, 0), |(n, b), e| {
            (n + 1, b + e.metadata().map_or(0, |m| m.len()))
        })
}

/// sccache as a compose would find it: off (and why), or its binary, version, backend and its
/// server's counts since that server started.
fn sccache_status() -> Value {
    let binary = match sccache::find() {
        Ok(b) => b,
        Err(why) => return json!({ "in_use": false, "why": why }),
    };
    match Sccache::new(binary.clone()).check() {
        Ok((version, st)) => {
            let steps = st.hits + st.misses;
            json!({
                "binary": binary,
                "in_use": true,
                "version": version,
                "location": st.location,
                "hits": st.hits,
                "misses": st.misses,
                "hit_rate": (steps > 0).then(|| st.hits as f64 / steps as f64),
                "not_cacheable": st.not_cacheable,
                "errors": st.errors,
            })
        }
        Err(why) => json!({ "binary": binary, "in_use": false, "why": why }),
    }
}

fn print_doctor(r: &Value) {
    let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
    println!("fact {}", s(&r["fact"]));
    let tc = &r["toolchain"];
    if let Some(e) = tc["error"].as_str() {
        println!("{:<13}{e}", "toolchain");
    } else {
        println!("{:<13}{} (CUDA {})", "nvcc", s(&tc["nvcc"]), s(&tc["cuda"]));
        println!(
            "{:<13}{} ({})",
            "CUTLASS",
            s(&tc["cutlass"]),
            s(&tc["cutlass_version"])
        );
        println!("{:<13}{}", "torch", s(&tc["torch"]));
    }
    let bc = &r["build_cache"];
    println!(
        "{:<13}{}: {} objects, {:.1} MB (FACT_CACHE_DIR moves it)",
        "build cache",
        s(&bc["dir"]),
        bc["objects"],
        bc["bytes"].as_u64().unwrap_or(0) as f64 / 1e6
    );
    let sc = &r["sccache"];
    match (sc["in_use"].as_bool(), sc["binary"].as_str()) {
        (Some(true), Some(b)) => {
            println!(
                "{:<13}{b} {}: compiles that miss the build cache go through it",
                "sccache",
                s(&sc["version"])
            );
            println!("{:<13}{}", "  backend", s(&sc["location"]));
            let rate = sc["hit_rate"]
                .as_f64()
                .map_or("no cacheable step yet".to_string(), |h| {
                    format!("{:.0}% from the cache", 100.0 * h)
                });
            println!(
                "{:<13}since its server started: {} hits, {} misses ({rate}), {} not cacheable, {} cache errors",
                "  server", sc["hits"], sc["misses"], sc["not_cacheable"], sc["errors"]
            );
        }
        (_, Some(b)) => println!(
            "{:<13}{b}: not in use ({}); nvcc compiles directly",
            "sccache",
            s(&sc["why"])
        ),
        _ => println!("{:<13}{}", "sccache", s(&sc["why"])),
    }
    match r["gpu"]["device"].as_str() {
        Some(d) => match r["gpu"]["tunes"].as_str() {
            Some(a) => println!("{:<13}{d}: tunes {a} kernels", "GPU"),
            None => println!(
                "{:<13}{d}: no target of fact's (--arch compiles for one)",
                "GPU"
            ),
        },
        None => println!(
            "{:<13}none: compose compiles and stops before tuning (--arch picks the target)",
            "GPU"
        ),
    }
}
