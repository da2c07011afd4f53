//! The shared compile cache: two fact processes with build caches of their own and one sccache
//! backend, a local disk folder or a Redis server (`.ci/run` starts one on 127.0.0.1:6379;
//! FACT_TEST_REDIS names another), each with a fresh sccache server as a second host would have.
//! The second compiles nothing: every cacheable step hits, by fact's report and by sccache's own
//! counters, and its objects are the first's. A broken sccache leaves the build to nvcc with one
//! line. Each test runs its own sccache server (its own port and folder) and stops it after.
//! They skip with a message only where sccache is not installed (never in CI).

use crate::common::fact;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The sccache fact would use, or None (after saying so) where none is installed outside CI.
fn sccache_binary() -> Option<PathBuf> {
    match fact::nvcc::sccache::find() {
        Ok(b) => Some(b),
        Err(why) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: sccache {why}");
            None
        }
        Err(why) => panic!("sccache {why} (CI runs ./setup, which installs it)"),
    }
}

/// A port no server listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One sccache set-up: its binary, its server's port and folder, and the backend settings.
struct Backend {
    binary: PathBuf,
    port: u16,
    dir: PathBuf,
    env: Vec<(String, String)>,
}

impl Backend {
    fn new(binary: PathBuf, root: &Path, env: &[(&str, String)]) -> Backend {
        Backend {
            binary,
            port: free_port(),
            dir: root.join("sccache"),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    /// `c` with this set-up's sccache settings in place of any the test run has.
    fn apply<'c>(&self, c: &'c mut Command) -> &'c mut Command {
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SCCACHE_") {
                c.env_remove(k);
            }
        }
        c.env("FACT_SCCACHE", &self.binary)
            .env("SCCACHE_SERVER_PORT", self.port.to_string())
            .env("SCCACHE_DIR", &self.dir)
            // A server a failed test leaves behind goes on its own.
            .env("SCCACHE_IDLE_TIMEOUT", "600");
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    fn sccache(&self, args: &[&str]) -> Output {
        self.apply(&mut Command::new(&self.binary))
            .args(args)
            .output()
            .unwrap()
    }

    /// The server's counters: (hits, misses) over every language, and where its cache is.
    fn stats(&self) -> (u64, u64, String) {
        let o = self.sccache(&["--show-stats", "--stats-format", "json"]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let s = fact::nvcc::sccache::Stats::parse(&String::from_utf8_lossy(&o.stdout)).unwrap();
        (s.hits, s.misses, s.location)
    }

    fn stop(&self) {
        self.sccache(&["--stop-server"]);
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `fact realize --compile-only` of one small LayerNorm kernel (and the library around it: the
/// torch op and the dispatch table) into a build cache and output folder of its own; its JSON
/// and stderr.
fn realize(backend: &Backend, root: &Path, host: &str) -> (serde_json::Value, String) {
    let mut c = fact();
    backend.apply(&mut c);
    let out = c
        .env("FACT_CACHE_DIR", root.join(host).join("build-cache"))
        .env("FACT_TABLE", root.join(host).join("table.json"))
        .env("FACT_SHIPPED_TABLE", root.join("none.json"))
        .args([
            "realize",
            "--compile-only",
            "--json",
            "--rule",
            "layernorm_affine",
            "--dtype",
            "f32",
            "--shape",
            "4096x1000",
            "--candidates",
            "1",
            "--jobs",
            "2",
            "--out",
        ])
        .arg(root.join(host).join("out"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    (serde_json::from_slice(&out.stdout).unwrap(), stderr)
}

/// The objects of a build cache, by kernel (the part of the file name before its key).
fn objects(cache: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "o"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            let stem = name
                .rsplit_once('-')
                .map_or(name.clone(), |(s, _)| s.into());
            (stem, std::fs::read(&p).unwrap())
        })
        .collect();
    v.sort();
    v
}

fn count(v: &serde_json::Value, key: &str) -> u64 {
    v["sccache"][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no sccache.{key} in {v}"))
}

/// Two hosts in turn over `backend`: the first (a fresh backend) compiles, the second hits for
/// every step. `location` is what sccache calls the backend (in any case).
fn second_host_compiles_nothing(backend: Backend, root: &Path, location: &str) {
    let (first, _) = realize(&backend, root, "host1");
    assert_eq!(first["realization"]["how"], "compiled", "{first}");
    let steps = count(&first, "hits") + count(&first, "misses");
    assert!(
        count(&first, "misses") > 0,
        "a fresh backend misses: {first}"
    );
    // The kernel, the dispatch table and the torch op: three compiles fact's cache missed.
    assert_eq!(count(&first, "units"), 3, "{first}");
    let names = |s: &str| s.to_lowercase().contains(&location.to_lowercase());
    assert!(
        names(first["sccache"]["location"].as_str().unwrap()),
        "{first}"
    );
    // The second host starts its own sccache server: nothing of the first's but the backend.
    backend.stop();
    let (second, _) = realize(&backend, root, "host2");
    assert_eq!(count(&second, "units"), 3, "{second}");
    assert_eq!(count(&second, "misses"), 0, "{second}");
    assert_eq!(count(&second, "hits"), steps, "every step hits: {second}");
    let (hits, misses, where_) = backend.stats();
    assert_eq!((hits, misses), (steps, 0), "sccache's own counters");
    assert!(names(&where_), "{where_}");
    let (a, b) = (
        objects(&root.join("host1/build-cache")),
        objects(&root.join("host2/build-cache")),
    );
    assert_eq!(a.len(), 3);
    assert!(a == b, "the second host's objects are the first's");
}

#[test]
fn a_second_build_cache_over_a_shared_sccache_disk_compiles_nothing() {
    let Some(binary) = sccache_binary() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let backend = Backend::new(binary, root.path(), &[]);
    second_host_compiles_nothing(backend, root.path(), "Local disk");
}

#[test]
fn a_second_build_cache_over_a_shared_redis_compiles_nothing() {
    let Some(binary) = sccache_binary() else {
        return;
    };
    let endpoint =
        std::env::var("FACT_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let addr = endpoint
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_string();
    if std::net::TcpStream::connect(&addr).is_err() {
        if std::env::var_os("CI").is_some() {
            panic!("no Redis at {endpoint}: .ci/run starts one");
        }
        eprintln!(
            "skipped: no Redis at {endpoint} (bash .ci/run starts one; or set FACT_TEST_REDIS)"
        );
        return;
    }
    let root = tempfile::tempdir().unwrap();
    // Keys of this run alone, so the first host starts from an empty backend; they expire.
    let prefix = format!(
        "fact-test-{}-{}",
        std::process::id(),
        root.path().file_name().unwrap().to_string_lossy()
    );
    let backend = Backend::new(
        binary,
        root.path(),
        &[
            ("SCCACHE_REDIS_ENDPOINT", endpoint),
            ("SCCACHE_REDIS_KEY_PREFIX", prefix),
            ("SCCACHE_REDIS_EXPIRATION", "3600".into()),
        ],
    );
    second_host_compiles_nothing(backend, root.path(), "Redis");
}

#[test]
fn a_broken_sccache_leaves_the_build_to_nvcc_with_one_line() {
    let Some(binary) = sccache_binary() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let conf = root.path().join("broken.toml");
    std::fs::write(&conf, "this is [not toml\n").unwrap();
    let backend = Backend::new(
        binary,
        root.path(),
        &[("SCCACHE_CONF", conf.display().to_string())],
    );
    let (r, stderr) = realize(&backend, root.path(), "host");
    assert_eq!(r["realization"]["how"], "compiled", "{r}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("sccache:"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("config file") && lines[0].contains("nvcc compiles directly"),
        "{stderr}"
    );
    let fallback = r["sccache"]["fallback"].as_str().unwrap_or_default();
    assert!(fallback.contains("config file"), "{r}");
    assert_eq!(count(&r, "units"), 0, "nothing went through sccache: {r}");
    assert_eq!(objects(&root.path().join("host/build-cache")).len(), 3);
}
