//! The pattern table: tuned winners keyed by (rule, dtype, math, arch, shape), each with every
//! candidate's measurement, the failures and the provenance. This module alone defines on-disk
//! formats; every file carries a schema version, and writes are atomic (write, then rename).

use crate::rules::GemmProblem;
use crate::space::KernelSpec;
use crate::tune::cuda::DeviceInfo;
use crate::tune::{CandidateResult, Timing};
use crate::types::{Arch, DType, MathType};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use thiserror::Error;

pub const SCHEMA: u32 = 1;

#[derive(Debug, Error)]
pub enum TableError {
    #[error("{path}: cannot read the pattern table: {detail}")]
    Read { path: String, detail: String },
    #[error("{path}: the pattern table is corrupt ({detail}); move it aside or fix it, nothing was changed")]
    Corrupt { path: String, detail: String },
    #[error("{path}: schema {found} is newer than this fact understands ({SCHEMA}); upgrade fact")]
    Newer { path: String, found: u32 },
    #[error("{path}: cannot write the pattern table: {detail}")]
    Write { path: String, detail: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct TableKey {
    /// Rule id with its epilogue chain, e.g. `gemm_rcr_bias`.
    pub rule: String,
    pub dtype: DType,
    pub math: MathType,
    pub arch: Arch,
    /// Problem shape, `MxNxK`.
    pub shape: String,
}

impl TableKey {
    pub fn gemm(p: &GemmProblem, math: MathType, arch: Arch) -> TableKey {
        TableKey { rule: p.rule_id(), dtype: p.dtype, math, arch, shape: p.shape_key() }
    }
}

impl std::fmt::Display for TableKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({}) {} {}", self.rule, self.dtype, self.math.short_name(), self.arch, self.shape)
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    pub device: DeviceInfo,
    pub torch: String,
    pub nvcc: String,
    pub cutlass: String,
    pub fact: String,
    pub date: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub key: TableKey,
    pub problem: GemmProblem,
    pub winner: String,
    pub winner_spec: KernelSpec,
    pub winner_ms: f64,
    pub baseline: Option<Timing>,
    /// Every candidate, failures included, as measured.
    pub candidates: Vec<CandidateResult>,
    pub provenance: Provenance,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub schema: u32,
    pub entries: Vec<Entry>,
}

impl Table {
    pub fn new() -> Table {
        Table { schema: SCHEMA, entries: Vec::new() }
    }

    /// Reads a table; a missing file is an empty table.
    pub fn load(path: &Path) -> Result<Table, TableError> {
        let p = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Table::new()),
            Err(e) => return Err(TableError::Read { path: p, detail: e.to_string() }),
        };
        let raw: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| TableError::Corrupt { path: p.clone(), detail: e.to_string() })?;
        let schema = raw.get("schema").and_then(|s| s.as_u64()).unwrap_or(0) as u32;
        if schema > SCHEMA {
            return Err(TableError::Newer { path: p, found: schema });
        }
        serde_json::from_value(raw).map_err(|e| TableError::Corrupt { path: p, detail: e.to_string() })
    }

    /// Writes atomically: a reader sees the old table or the new one, never a torn file.
    pub fn save(&self, path: &Path) -> Result<(), TableError> {
        let p = path.display().to_string();
        let werr = |e: std::io::Error| TableError::Write { path: p.clone(), detail: e.to_string() };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(werr)?;
        }
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        let text = serde_json::to_string_pretty(self).expect("table serializes");
        std::fs::write(&tmp, text + "\n").map_err(werr)?;
        std::fs::rename(&tmp, path).map_err(werr)
    }

    pub fn get(&self, key: &TableKey) -> Option<&Entry> {
        self.entries.iter().find(|e| &e.key == key)
    }

    /// Adds or replaces the entry for its key; keeps the table sorted by key for stable diffs.
    pub fn insert(&mut self, entry: Entry) {
        self.entries.retain(|e| e.key != entry.key);
        self.entries.push(entry);
        self.entries.sort_by(|a, b| a.key.cmp(&b.key));
    }
}

/// The user's table: $FACT_TABLE, else $XDG_DATA_HOME/fact/table.json, else ~/.local/share/fact/table.json.
pub fn user_table_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FACT_TABLE") {
        return PathBuf::from(p);
    }
    let data = std::env::var_os("XDG_DATA_HOME").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir).join(".local/share")
    });
    data.join("fact/table.json")
}

/// The table shipped in the repository (pattern-table/table.json), seeded with H100 winners.
pub fn shipped_table_path() -> PathBuf {
    std::env::var_os("FACT_SHIPPED_TABLE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("FACT_SOURCE_ROOT")).join("pattern-table/table.json"))
}

/// Looks `key` up in the user table first, then the shipped one.
pub fn lookup(user: &Table, shipped: &Table, key: &TableKey) -> Option<(Entry, &'static str)> {
    user.get(key).map(|e| (e.clone(), "user")).or_else(|| shipped.get(key).map(|e| (e.clone(), "shipped")))
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 86_400)
        .unwrap_or(0) as i64;
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::GemmLayout;
    use crate::space::gemm_candidates;
    use crate::tune::Outcome;

    pub(crate) fn entry(m: i64, ms: f64) -> Entry {
        let problem = GemmProblem { m, n: 256, k: 512, layout: GemmLayout::Rcr, dtype: DType::F32, bias: true };
        let spec = gemm_candidates(&problem, MathType::Tf32, Arch::Sm90)[0].clone();
        let timing = Timing { median_ms: ms, min_ms: ms, max_ms: ms, spread: 0.0, samples: 1 };
        Entry {
            key: TableKey::gemm(&problem, MathType::Tf32, Arch::Sm90),
            problem,
            winner: spec.name(),
            winner_spec: spec.clone(),
            winner_ms: ms,
            baseline: Some(timing.clone()),
            candidates: vec![CandidateResult {
                kernel: spec.name(),
                spec,
                outcome: Outcome::Ok { max_rel_err: 1e-4, timing, tflops: 1.0 },
            }],
            provenance: Provenance {
                device: DeviceInfo {
                    name: "NVIDIA H100 80GB HBM3".into(),
                    sm_count: 132,
                    compute_capability: "9.0".into(),
                    driver: "13.0".into(),
                    cuda_runtime: "13.0".into(),
                },
                torch: "2.11.0".into(),
                nvcc: "13.0".into(),
                cutlass: "4.2.0".into(),
                fact: "0.1.0".into(),
                date: "2026-11-22".into(),
            },
        }
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let mut t = Table::new();
        t.insert(entry(128, 0.5));
        t.insert(entry(64, 0.25));
        t.insert(entry(128, 0.4));
        t.save(&path).unwrap();
        let back = Table::load(&path).unwrap();
        assert_eq!(back, t);
        assert_eq!(back.entries.len(), 2, "same key replaces");
        assert_eq!(back.get(&entry(128, 0.0).key).unwrap().winner_ms, 0.4);
        assert!(std::fs::read_dir(dir.path()).unwrap().count() == 1, "no temp file left behind");
    }

    #[test]
    fn corrupt_and_newer_tables_are_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let mut t = Table::new();
        t.insert(entry(128, 0.5));
        t.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        let e = Table::load(&path).unwrap_err();
        assert!(matches!(e, TableError::Corrupt { .. }), "{e}");
        std::fs::write(&path, text.replace("\"schema\": 1", "\"schema\": 99")).unwrap();
        assert!(Table::load(&path).unwrap_err().to_string().contains("upgrade fact"));
        assert_eq!(Table::load(&dir.path().join("missing.json")).unwrap(), Table::new());
    }

    #[test]
    fn user_entries_shadow_shipped_ones() {
        let mut user = Table::new();
        let mut shipped = Table::new();
        shipped.insert(entry(128, 0.5));
        let key = entry(128, 0.0).key;
        assert_eq!(lookup(&user, &shipped, &key).unwrap().1, "shipped");
        user.insert(entry(128, 0.3));
        let (e, from) = lookup(&user, &shipped, &key).unwrap();
        assert_eq!((from, e.winner_ms), ("user", 0.3));
        assert!(lookup(&user, &shipped, &entry(64, 0.0).key).is_none());
    }

    #[test]
    fn date_is_iso() {
        let d = today();
        assert_eq!(d.len(), 10);
        assert!(d.starts_with("20"));
    }
}
