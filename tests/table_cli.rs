//! The pattern table as users drive it: `fact table ...` on temporary tables.

use crate::common::{fact, sample_entry};
use fact::kinds::gemm::space::gemm_candidates;
use fact::kinds::gemm::{GemmLayout, GemmProblem};
use fact::table::Table;
use fact::types::{Arch, DType, MathType};
use std::path::Path;

fn problem(m: i64, dtype: DType) -> GemmProblem {
    GemmProblem {
        m,
        n: 1024,
        k: 1024,
        layout: GemmLayout::Rrr,
        dtype,
        bias: false,
        batch: 1,
        epilogue: None,
        padded_from: None,
    }
}

/// A table file with one entry for `problem(m, dtype)`, its candidate `which` timed at `ms`.
fn table_file(
    dir: &Path,
    name: &str,
    m: i64,
    dtype: DType,
    which: usize,
    ms: f64,
) -> std::path::PathBuf {
    let p = problem(m, dtype);
    let math = MathType::for_tensor(dtype, fact::types::Precision::Tf32).unwrap();
    let spec = gemm_candidates(&p, math, Arch::Sm90)[which].clone();
    let mut t = Table::new();
    let mut e = sample_entry(&p, &spec, ms, name);
    e.key.math = math;
    t.insert_merged(e);
    let path = dir.join(format!("{name}.json"));
    t.save(&path).unwrap();
    path
}

fn run(user: &Path, args: &[&str]) -> (bool, serde_json::Value, String) {
    let out = fact()
        .env("FACT_TABLE", user)
        .env("FACT_SHIPPED_TABLE", user.with_file_name("no-shipped.json"))
        .args(args)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.success(),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn import_list_show_export_merge_remove() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("user.json");
    let a = table_file(dir.path(), "a", 2048, DType::F32, 0, 0.5);
    let b = table_file(dir.path(), "b", 4096, DType::Bf16, 0, 0.7);

    for f in [&a, &b] {
        let (ok, v, err) = run(&user, &["table", "import", f.to_str().unwrap(), "--json"]);
        assert!(ok, "{err}");
        assert_eq!(v["imported"], 1);
    }
    let (_, all, _) = run(&user, &["table", "list", "--json"]);
    assert_eq!(all.as_array().unwrap().len(), 2);
    let (_, bf16, _) = run(&user, &["table", "list", "--dtype", "bf16", "--json"]);
    let rows = bf16.as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["key"]["shape"], "4096x1024x1024");
    assert_eq!(rows[0]["table"], "user");
    let id = rows[0]["id"].as_str().unwrap().to_string();

    let (ok, shown, _) = run(&user, &["table", "show", &id[..5], "--json"]);
    assert!(ok);
    assert_eq!(
        shown["entry"]["runs"][0]["provenance"]["device"]["name"],
        "b"
    );

    let exported = dir.path().join("export.json");
    let (ok, v, _) = run(
        &user,
        &[
            "table",
            "export",
            exported.to_str().unwrap(),
            "--rule",
            "gemm_rrr",
            "--dtype",
            "f32",
            "--json",
        ],
    );
    assert!(ok);
    assert_eq!(v["exported"], 1);
    assert_eq!(
        Table::load(&exported).unwrap().entries[0].key.dtypes.a,
        DType::F32
    );

    // A faster run of a's key from another machine: merge keeps both runs, the faster one wins.
    let faster = table_file(dir.path(), "faster", 2048, DType::F32, 1, 0.3);
    let merged = dir.path().join("merged.json");
    let (ok, v, err) = run(
        &user,
        &[
            "table",
            "merge",
            a.to_str().unwrap(),
            faster.to_str().unwrap(),
            "-o",
            merged.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(v["merged"], 1);
    let m = &Table::load(&merged).unwrap().entries[0];
    assert_eq!((m.runs.len(), m.winner_ms), (2, 0.3));

    let (ok, _, _) = run(&user, &["table", "remove", &id, "--json"]);
    assert!(ok);
    let (_, all, _) = run(&user, &["table", "list", "--json"]);
    assert_eq!(all.as_array().unwrap().len(), 1);
    let (ok, _, err) = run(&user, &["table", "remove", "ffffffff"]);
    assert!(!ok && err.contains("fact table list"), "{err}");
}

#[test]
fn concurrent_writers_all_land() {
    // Four processes import disjoint tables of 200 entries each into one user table at once; a
    // read-modify-write without the lock loses whole tables.
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("user.json");
    let files: Vec<_> = (0..4)
        .map(|w| {
            let mut t = Table::new();
            for i in 0..200 {
                let one = table_file(
                    dir.path(),
                    "one",
                    8 * (1000 * w + i + 1),
                    DType::F32,
                    0,
                    0.1,
                );
                t.merge(&Table::load(&one).unwrap());
            }
            let path = dir.path().join(format!("w{w}.json"));
            t.save(&path).unwrap();
            path
        })
        .collect();
    std::thread::scope(|s| {
        for f in &files {
            let user = &user;
            s.spawn(move || {
                for _ in 0..3 {
                    let (ok, _, err) = run(user, &["table", "import", f.to_str().unwrap()]);
                    assert!(ok, "{err}");
                }
            });
        }
    });
    let t = Table::load(&user).unwrap();
    assert_eq!(t.entries.len(), 800, "no writer's entries were lost");
    assert!(
        t.entries.iter().all(|e| e.runs.len() == 1),
        "re-importing a run keeps it once"
    );
}

#[test]
fn a_truncated_user_table_is_reported_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("user.json");
    let a = table_file(dir.path(), "a", 2048, DType::F32, 0, 0.5);
    assert!(run(&user, &["table", "import", a.to_str().unwrap()]).0);
    let text = std::fs::read_to_string(&user).unwrap();
    std::fs::write(&user, &text[..text.len() - 40]).unwrap();
    let (ok, _, err) = run(&user, &["table", "list"]);
    assert!(
        !ok && err.contains("corrupt") && err.contains("nothing was changed"),
        "{err}"
    );
    let b = table_file(dir.path(), "b", 4096, DType::F32, 0, 0.5);
    assert!(!run(&user, &["table", "import", b.to_str().unwrap()]).0);
    assert_eq!(
        std::fs::read_to_string(&user).unwrap(),
        text[..text.len() - 40],
        "nothing overwritten"
    );
    assert_eq!(
        Table::load(&a).unwrap().entries.len(),
        1,
        "the other tables are intact"
    );
}

#[test]
fn realize_names_every_rule_family_for_an_unknown_rule() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = run(
        &dir.path().join("user.json"),
        &[
            "realize",
            "--rule",
            "groupnorm",
            "--dtype",
            "f32",
            "--shape",
            "64x64",
        ],
    );
    assert!(!ok, "{err}");
    for family in [
        "unknown rule 'groupnorm'",
        "gemm_LAYOUT",
        "sdpa_causal",
        "layernorm_affine",
        "rmsnorm_cast_weight",
    ] {
        assert!(err.contains(family), "{family}: {err}");
    }
}

#[test]
fn realize_without_a_gpu_says_so() {
    if fact::torch::cuda_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("user.json");
    let (ok, _, err) = run(
        &user,
        &[
            "realize",
            "--rule",
            "gemm_rrr",
            "--dtype",
            "f32",
            "--shape",
            "256x256x256",
        ],
    );
    assert!(!ok && err.contains("no CUDA device"), "{err}");
    let (ok, _, err) = run(
        &user,
        &[
            "realize",
            "--arch",
            "sm80",
            "--rule",
            "gemm_rrr",
            "--dtype",
            "f32",
            "--shape",
            "256x256x256",
        ],
    );
    assert!(
        !ok && err.contains("no CUDA device")
            && err.contains("an sm80 GPU (A100, A30) or an sm90 one"),
        "{err}"
    );
    let (ok, _, err) = run(
        &user,
        &[
            "realize",
            "--arch",
            "sm70",
            "--rule",
            "gemm_rrr",
            "--dtype",
            "f32",
            "--shape",
            "256x256x256",
        ],
    );
    assert!(
        !ok && err.contains("unknown arch 'sm70': use sm80 or sm90"),
        "{err}"
    );
    let (ok, _, err) = run(
        &user,
        &[
            "realize",
            "--rule",
            "gemm_xyz",
            "--dtype",
            "f32",
            "--shape",
            "256x256x256",
        ],
    );
    assert!(!ok && err.contains("use gemm_LAYOUT"), "{err}");
    let (ok, _, err) = run(
        &user,
        &[
            "realize", "--rule", "gemm_rrr", "--dtype", "f32", "--shape", "256x256",
        ],
    );
    assert!(!ok && err.contains("MxNxK"), "{err}");
}

/// `realize --compile-only` builds a sweep's kernels without a GPU and records nothing: here the
/// first candidate of a padded, grouped-query attention under tf32 (an sm80 kernel, which takes
/// both as arguments; the compile tests build the same one, so the shared cache has it).
#[test]
fn realize_compile_only_builds_a_grouped_padded_attention_sweep_without_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("user.json");
    let out = dir.path().join("out");
    let (ok, v, err) = run(
        &user,
        &[
            "realize",
            "--rule",
            "sdpa_causal_padded",
            "--dtype",
            "f32",
            "--shape",
            "2x8x512x512x96x2",
            "--candidates",
            "1",
            "--compile-only",
            "--json",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(v["realization"]["how"], "compiled", "{v}");
    assert_eq!(
        (&v["realization"]["candidates"], &v["realization"]["failed"]),
        (&serde_json::json!(1), &serde_json::json!(0))
    );
    assert!(
        v["entry"].is_null() && !user.exists(),
        "nothing tuned, nothing recorded"
    );
    let lib = std::fs::read_dir(out.join("sweeps"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("libsweep.so"))
        .find(|p| p.exists());
    assert!(lib.is_some(), "the sweep's library is built");
}

#[test]
fn learned_rules_are_listed_with_scope_predicate_and_count() {
    use fact::kinds::gemm::{learn, scope as gemm_scope};
    use fact::space::validity::FailureKind;
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    let p = problem(512, DType::F32);
    let k = gemm_candidates(&p, MathType::Tf32, Arch::Sm90)[0].clone();
    let scope = gemm_scope(&p, MathType::Tf32, Arch::Sm90, "4.2.0");
    let mut t = Table::new();
    learn(
        &mut t.rules,
        &scope,
        FailureKind::Compile,
        &k,
        "error: static assertion failed",
        &[],
    );
    learn(
        &mut t.rules,
        &scope,
        FailureKind::Compile,
        &k,
        "error: static assertion failed",
        &[],
    );
    t.save(&user).unwrap();
    let (ok, v, err) = run(&user, &["table", "rules", "--json"]);
    assert!(ok, "{err}");
    assert_eq!(v[0]["kind"], "compile");
    assert_eq!(v[0]["count"], 2);
    assert_eq!(v[0]["scope"]["cutlass"], "4.2.0");
    assert_eq!(v[0]["predicate"]["tile_m"], k.tile[0]);
    let text = fact()
        .env("FACT_TABLE", &user)
        .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"))
        .args(["table", "rules"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("compile") && text.contains("x2") && text.contains("static assertion"),
        "{text}"
    );
}

#[test]
fn knowledge_refresh_reproduces_the_shipped_knowledge_and_is_then_used() {
    let dir = tempfile::tempdir().unwrap();
    let out = fact()
        .env("FACT_DATA_DIR", dir.path())
        .args(["knowledge", "refresh"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let show = fact()
        .env("FACT_DATA_DIR", dir.path())
        .args(["knowledge", "show", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert!(
        v["origin"]
            .as_str()
            .unwrap()
            .starts_with(&dir.path().display().to_string()),
        "{}",
        v["origin"]
    );
    // The distiller run on the pinned CUTLASS gives exactly the rows the binary ships with.
    let fresh = fact::kinds::gemm::space::Knowledge::read(Path::new(v["origin"].as_str().unwrap()))
        .unwrap();
    let shipped = fact::kinds::gemm::space::Knowledge::shipped();
    assert_eq!((&fresh.sm90, &fresh.sm80), (&shipped.sm90, &shipped.sm80));
    // And a derived space names its candidates and every pruned row's reason.
    let show = fact()
        .env("FACT_DATA_DIR", dir.path())
        .args([
            "knowledge",
            "show",
            "--json",
            "--rule",
            "gemm_rrr",
            "--shape",
            "256x256x524288",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert!(!v["space"]["candidates"].as_array().unwrap().is_empty());
    assert!(v["space"]["pruned"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| !p["reason"].as_str().unwrap().is_empty()));
}

/// A user table whose entry for `problem(m)` timed every kernel of its space (kernel i at
/// 0.5 + 0.01 i ms) and saw the last one fail its numerics, learned from.
fn swept_table(path: &Path, ms: &[i64]) {
    use fact::table::learning::learn_run;
    use fact::table::{CandidateResult, Entry};
    use fact::tune::Outcome;
    let mut t = Table::new();
    for &m in ms {
        let p = problem(m, DType::F32);
        let ks = gemm_candidates(&p, MathType::Tf32, Arch::Sm90);
        let mut e = sample_entry(&p, &ks[0], 0.5, "H100");
        let run = &mut e.runs[0];
        let timed = run.candidates[0].clone();
        for (i, k) in ks.iter().enumerate().skip(1) {
            let outcome = if i + 1 == ks.len() {
                Outcome::Numeric {
                    max_rel_err: 0.5,
                    tolerance: 1e-3,
                }
            } else {
                let mut o = timed.outcome.clone();
                if let Outcome::Ok { timing, .. } = &mut o {
                    timing.median_ms = 0.5 + 0.01 * i as f64;
                }
                o
            };
            run.candidates.push(CandidateResult {
                kernel: k.name(),
                spec: k.clone().into(),
                outcome,
            });
        }
        let e = Entry::from_runs(e.key, e.problem, e.runs).unwrap();
        let history = t.entries.clone();
        learn_run(&mut t.rules, &e.key, &e.runs[0], &history);
        t.insert_merged(e);
    }
    t.save(path).unwrap();
}

#[test]
fn compact_keeps_the_listing_and_the_rules_and_says_what_it_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    swept_table(&user, &[512, 1024]);
    let show = |args: &[&str]| {
        let out = fact()
            .env("FACT_TABLE", &user)
            .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (rules, list) = (show(&["table", "rules"]), show(&["table", "list"]));
    assert!(rules.contains("numeric"), "{rules}");
    let size = std::fs::metadata(&user).unwrap().len();

    // Into another file: the user table is left as it was.
    let out = dir.path().join("small.json");
    let (ok, v, err) = run(
        &user,
        &[
            "table",
            "compact",
            "--keep",
            "1",
            "--out",
            out.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(std::fs::metadata(&user).unwrap().len(), size);
    assert_eq!(v["stats"]["candidates_before"], 24);
    assert_eq!(v["stats"]["kept_whole"], 0);
    // One kernel of each of the two families, and the learned failure, in each entry.
    assert_eq!(v["stats"]["candidates_after"], 6);
    assert_eq!(
        v["stats"]["bytes_after"],
        std::fs::metadata(&out).unwrap().len()
    );

    // In place, by default the user table: the listing and the rules are unchanged.
    let (ok, v, err) = run(&user, &["table", "compact", "--json"]);
    assert!(ok, "{err}");
    assert!(v["stats"]["bytes_after"].as_u64() < v["stats"]["bytes_before"].as_u64());
    assert_eq!(show(&["table", "rules"]), rules);
    assert_eq!(show(&["table", "list"]), list);
    let text = show(&["table", "compact"]);
    assert!(text.contains("size") && text.contains("MB"), "{text}");

    let (ok, _, err) = run(&user, &["table", "compact", "nowhere.json"]);
    assert!(!ok && err.contains("no such table file"), "{err}");
    let (ok, _, err) = run(&user, &["table", "compact", "--keep", "0"]);
    assert!(!ok && err.contains("give 1 or more"), "{err}");
}

#[test]
fn compact_holds_the_lock_so_concurrent_imports_all_land() {
    // Imports of disjoint tables while compactions of the same user table run: a compaction
    // that read the table without the lock would write back a table without some imports.
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("user.json");
    swept_table(&user, &[512]);
    let files: Vec<_> = (0..3)
        .map(|w| {
            let path = dir.path().join(format!("w{w}.json"));
            swept_table(&path, &[8 * (100 * w + 1), 8 * (100 * w + 2)]);
            path
        })
        .collect();
    std::thread::scope(|s| {
        for f in &files {
            let user = &user;
            s.spawn(move || {
                let (ok, _, err) = run(user, &["table", "import", f.to_str().unwrap()]);
                assert!(ok, "{err}");
            });
            s.spawn(move || {
                for _ in 0..2 {
                    let (ok, _, err) = run(user, &["table", "compact", "--keep", "1"]);
                    assert!(ok, "{err}");
                }
            });
        }
    });
    let t = Table::load(&user).unwrap();
    assert_eq!(t.entries.len(), 7, "no import was lost");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().all(|f| !f
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp")),
        "no temporary file left"
    );
}
