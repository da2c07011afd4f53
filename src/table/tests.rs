use super::*;
use crate::kinds::gemm::space::{gemm_candidates, KernelSpec};
use crate::kinds::gemm::{GemmLayout, GemmProblem};
use crate::tune::Outcome;

/// The key of a GEMM problem.
pub(crate) fn gemm_key(p: &GemmProblem, math: MathType, arch: Arch) -> TableKey {
    TableKey::of(&p.clone().into(), math, arch)
}

pub(crate) fn problem(m: i64) -> GemmProblem {
    GemmProblem {
        m,
        n: 256,
        k: 512,
        layout: GemmLayout::Rcr,
        dtype: DType::F32,
        bias: true,
        batch: 1,
        epilogue: None,
        padded_from: None,
    }
}

pub(crate) fn provenance(device: &str) -> Provenance {
    Provenance {
        device: DeviceInfo {
            name: device.into(),
            sm_count: 132,
            compute_capability: "9.0".into(),
            driver: "13.0".into(),
            cuda_runtime: "13.0".into(),
            ..Default::default()
        },
        torch: "2.11.0".into(),
        nvcc: "13.0".into(),
        cutlass: "4.2.0".into(),
        fact: "0.1.0".into(),
        date: "2026-11-22".into(),
    }
}

/// A timing of `ms` every sample.
pub(crate) fn timing(ms: f64) -> Timing {
    Timing {
        median_ms: ms,
        min_ms: ms,
        max_ms: ms,
        spread: 0.0,
        samples: 1,
    }
}

/// `spec` verified and timed at `ms`.
pub(crate) fn ok(spec: &KernelSpec, ms: f64) -> CandidateResult {
    CandidateResult {
        kernel: spec.name(),
        spec: spec.clone().into(),
        outcome: Outcome::Ok {
            max_rel_err: 1e-4,
            timing: timing(ms),
            tflops: 1.0,
        },
    }
}

/// An entry for `problem(m)` whose run timed candidate `which` at `ms` (torch at the same time)
/// and failed another.
fn entry(m: i64, which: usize, ms: f64, device: &str) -> Entry {
    entry_against(m, which, ms, Some(ms), device)
}

/// `entry` with torch's time in the run set apart: `baseline_ms`, or none.
pub(crate) fn entry_against(
    m: i64,
    which: usize,
    ms: f64,
    baseline_ms: Option<f64>,
    device: &str,
) -> Entry {
    let p = problem(m);
    let specs = gemm_candidates(&p, MathType::Tf32, Arch::Sm90);
    let bad = CandidateResult {
        kernel: specs[which + 1].name(),
        spec: specs[which + 1].clone().into(),
        outcome: Outcome::Numeric {
            max_rel_err: 0.5,
            tolerance: 1e-3,
        },
    };
    let run = Run {
        partial: false,
        provenance: provenance(device),
        baseline: baseline_ms.map(timing),
        candidates: vec![ok(&specs[which], ms), bad],
    };
    Entry::from_runs(gemm_key(&p, MathType::Tf32, Arch::Sm90), p, vec![run]).unwrap()
}

#[test]
fn round_trip_keeps_every_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let mut t = Table::new();
    t.insert_merged(entry(128, 0, 0.5, "H100"));
    t.insert_merged(entry(64, 0, 0.25, "H100"));
    t.save(&path).unwrap();
    let back = Table::load(&path).unwrap();
    assert_eq!(back, t);
    assert_eq!(back.schema, SCHEMA);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temp file left behind"
    );
}

/// What the tables know wins near a shape they miss: the winners of the nearest entries of its
/// family and alignment class, nearest first, each kernel once, the user's first among equals.
#[test]
fn the_nearby_winners_are_the_nearest_entries_winners_of_the_family() {
    let mut tables = Tables {
        user_path: PathBuf::from("/nonexistent/user.json"),
        user: Table::new(),
        shipped: Table::new(),
    };
    // Shapes M = 128, 256 and 4096 (N 256, K 512): 256 is the nearest to 300, then 128.
    let (far, m128, m256) = (
        entry(4096, 3, 0.5, "H100"),
        entry(128, 0, 0.5, "H100"),
        entry(256, 2, 0.5, "H100"),
    );
    let winner = |e: &Entry| e.winner_spec.kernel_name();
    assert_ne!(winner(&m128), winner(&m256));
    tables.user.insert_merged(far.clone());
    tables.shipped.insert_merged(m128.clone());
    tables.shipped.insert_merged(m256.clone());
    let key = |p: &GemmProblem| gemm_key(p, MathType::Tf32, Arch::Sm90);
    let p = problem(300);
    let names = |v: Vec<crate::kinds::Spec>| v.iter().map(|s| s.kernel_name()).collect::<Vec<_>>();
    let near = tables.nearby_winners(&key(&p), &p.clone().into(), 2);
    assert_eq!(names(near.clone()), [winner(&m256), winner(&m128)]);
    // Each as its kernel, without the launch knobs it won with.
    assert!(near.iter().all(|s| s.name() == s.kernel().name()));
    assert_eq!(
        names(tables.nearby_winners(&key(&p), &p.clone().into(), 5)),
        [winner(&m256), winner(&m128), winner(&far)]
    );
    // Another family (no bias): no neighbour.
    let mut other = problem(300);
    other.bias = false;
    assert!(tables
        .nearby_winners(&key(&other), &other.clone().into(), 2)
        .is_empty());
    // The entry at the shape itself is no neighbour (it is a hit).
    let at = problem(256);
    assert_eq!(
        names(tables.nearby_winners(&key(&at), &at.clone().into(), 1)),
        [winner(&m128)]
    );
}

#[test]
fn keys_bucket_by_powers_of_two_within_one_family() {
    let k = |m: i64| gemm_key(&problem(m), MathType::Tf32, Arch::Sm90);
    assert_eq!(k(3000).bucket(), "4096x256x512");
    assert_eq!(k(4096).bucket(), k(3000).bucket());
    assert_ne!(k(4097).bucket(), k(4096).bucket());
    let mut bf16 = k(3000);
    bf16.dtypes = Dtypes::gemm(DType::Bf16);
    assert!(!bf16.same_family(&k(3000)));
    assert_eq!(k(3000).id().len(), 8);
    assert_ne!(k(3000).id(), k(4096).id());
}

#[test]
fn lookup_prefers_exact_then_user_then_bucket() {
    let mut tables = Tables {
        user_path: PathBuf::from("/unused"),
        user: Table::new(),
        shipped: Table::new(),
    };
    let key = |m| gemm_key(&problem(m), MathType::Tf32, Arch::Sm90);
    let lookup = |tables: &Tables, m| tables.lookup(&key(m), &Problem::from(problem(m)));
    assert_eq!(lookup(&tables, 3000), Lookup::Miss);
    tables.shipped.insert_merged(entry(4096, 0, 0.5, "H100"));
    tables.shipped.insert_merged(entry(2048, 0, 0.5, "H100"));
    match lookup(&tables, 3000) {
        Lookup::Bucket { entry, table } => assert_eq!(
            (entry.key.shape.as_str(), table),
            ("4096x256x512", "shipped")
        ),
        other => panic!("{other:?}"),
    }
    tables.user.insert_merged(entry(3000, 1, 0.4, "H100"));
    assert!(matches!(
        lookup(&tables, 3000),
        Lookup::Exact { table: "user", .. }
    ));
    assert!(matches!(
        lookup(&tables, 4096),
        Lookup::Exact {
            table: "shipped",
            ..
        }
    ));
    assert_eq!(lookup(&tables, 8192), Lookup::Miss, "another bucket");
}

#[test]
fn bucket_hits_stay_within_the_alignment_class() {
    // An rcr GEMM reads K and N contiguously; n = 250 makes the problem alignment 2 (f32), a
    // different candidate space from the alignment-4 entries of its bucket.
    let mut tables = Tables {
        user_path: PathBuf::from("/unused"),
        user: Table::new(),
        shipped: Table::new(),
    };
    tables.shipped.insert_merged(entry(4096, 0, 0.5, "H100"));
    let ragged = GemmProblem {
        n: 250,
        ..problem(3000)
    };
    let key = gemm_key(&ragged, MathType::Tf32, Arch::Sm90);
    assert_eq!(
        key.bucket(),
        gemm_key(&problem(4096), MathType::Tf32, Arch::Sm90).bucket()
    );
    assert_eq!(
        tables.lookup(&key, &Problem::from(ragged.clone())),
        Lookup::Miss
    );
    // The same bucket at the entry's alignment is a hit.
    let aligned = GemmProblem {
        n: 252,
        ..problem(3000)
    };
    let key = gemm_key(&aligned, MathType::Tf32, Arch::Sm90);
    assert!(matches!(
        tables.lookup(&key, &Problem::from(aligned)),
        Lookup::Bucket { .. }
    ));
}

#[test]
fn runs_on_two_gpus_of_one_host_stay_two_runs_and_name_their_gpu() {
    // Two H100s of one host measuring alike: only the GPU's index and UUID tell the runs apart,
    // and merging keeps both (one run merged twice is kept once).
    let on = |i: usize, which: usize, ms: f64| {
        let mut e = entry(128, which, ms, "H100");
        e.runs[0].provenance.device.index = Some(i);
        e.runs[0].provenance.device.uuid = Some(format!("GPU-{i}"));
        e
    };
    let m = on(0, 0, 0.5).merged(&on(1, 0, 0.5));
    assert_eq!(m.runs.len(), 2);
    let m = m.merged(&on(1, 2, 0.3));
    assert_eq!(m.runs.len(), 3);
    assert_eq!(m.winner_provenance().device.index, Some(1));
    assert_eq!(m.winner_provenance().device.uuid.as_deref(), Some("GPU-1"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let mut t = Table::new();
    t.insert_merged(m);
    t.save(&path).unwrap();
    assert_eq!(Table::load(&path).unwrap(), t);
    // A run recorded before tuning spread over GPUs names none, and writes as it did.
    let old = entry(64, 0, 0.25, "H100");
    assert_eq!(old.runs[0].provenance.device.index, None);
    let json = serde_json::to_string(&old).unwrap();
    assert!(
        !json.contains("\"index\"") && !json.contains("uuid"),
        "{json}"
    );
}

#[test]
fn merge_keeps_both_runs_and_the_faster_verified_winner() {
    let slow = entry(128, 0, 0.5, "H100 (a)");
    let fast = entry(128, 2, 0.3, "H100 (b)");
    let m = slow.merged(&fast);
    assert_eq!(m.runs.len(), 2);
    assert_eq!(
        (m.winner.as_str(), m.winner_ms),
        (fast.winner.as_str(), 0.3)
    );
    assert_eq!(m.winner_provenance().device.name, "H100 (b)");
    assert_eq!(m.merged(&fast), m, "merging a run twice keeps it once");
    let mut t = Table::new();
    t.insert_merged(fast.clone());
    t.insert_merged(slow.clone());
    assert_eq!(t.entries.len(), 1);
    assert_eq!(
        t.entries[0].winner_ms, 0.3,
        "a slower run never displaces the winner"
    );
}

#[test]
fn runs_are_compared_by_their_own_torch_time() {
    // Run b ran on a GPU slowed down 20% (torch too): its kernel is the faster one, though its
    // time is not.
    let a = entry_against(128, 0, 0.9, Some(1.0), "H100 (a)");
    let b = entry_against(128, 2, 1.0, Some(1.2), "H100 (b)");
    for m in [a.merged(&b), b.merged(&a)] {
        assert_eq!((m.winner.as_str(), m.winner_ms), (b.winner.as_str(), 1.0));
        assert_eq!(
            m.baseline_ms(),
            Some(1.2),
            "the winner's own run's torch time"
        );
    }
    // A run without torch's time leaves nothing to compare against: times decide.
    let c = entry_against(128, 2, 1.0, None, "H100 (c)");
    assert_eq!(a.merged(&c).winner, a.winner);
}

/// A run of `problem(128)` timing candidates `(which, ms)` against torch at `baseline_ms`.
pub(crate) fn run_of(times: &[(usize, f64)], baseline_ms: f64) -> Run {
    let specs = gemm_candidates(&problem(128), MathType::Tf32, Arch::Sm90);
    let timing = |ms: f64| Timing {
        median_ms: ms,
        min_ms: ms,
        max_ms: ms,
        spread: 0.0,
        samples: 1,
    };
    Run {
        partial: false,
        provenance: provenance("H100"),
        baseline: Some(timing(baseline_ms)),
        candidates: times
            .iter()
            .map(|&(which, ms)| CandidateResult {
                kernel: specs[which].name(),
                spec: specs[which].clone().into(),
                outcome: Outcome::Ok {
                    max_rel_err: 1e-4,
                    timing: timing(ms),
                    tflops: 1.0,
                },
            })
            .collect(),
    }
}

#[test]
fn a_kernel_beaten_within_another_run_does_not_win_on_its_own_runs_ratio() {
    let p = problem(128);
    let specs = gemm_candidates(&p, MathType::Tf32, Arch::Sm90);
    let key = gemm_key(&p, MathType::Tf32, Arch::Sm90);
    let winner = |runs: Vec<Run>| {
        let e = Entry::from_runs(key.clone(), p.clone(), runs).unwrap();
        let which = specs.iter().position(|k| k.name() == e.winner).unwrap();
        (which, e.winner_ms, e.baseline_ms())
    };
    // Run a timed kernel 0 against a slow torch (0.84 / 1.03); run b timed it again beside
    // kernel 1, which beat it there by 2.8%, against a faster torch (0.82 / 0.99).
    let a = run_of(&[(0, 0.84)], 1.03);
    let b = run_of(&[(0, 0.843), (1, 0.82)], 0.99);
    assert_eq!(winner(vec![a.clone(), b.clone()]), (1, 0.82, Some(0.99)));
    assert_eq!(winner(vec![b, a.clone()]), (1, 0.82, Some(0.99)));
    // Within the margin the ratios decide.
    let tied = run_of(&[(0, 0.824), (1, 0.82)], 0.99);
    assert_eq!(winner(vec![a.clone(), tied]).0, 0);
    // Kernels never timed together are compared by their ratios.
    let c = run_of(&[(2, 0.80)], 0.99);
    assert_eq!(winner(vec![a.clone(), c.clone()]).0, 2);
    // Two runs that disagree by more than the margin end on one of their kernels, never on a
    // slower one neither timed.
    let x = run_of(&[(0, 0.80), (1, 0.816)], 1.0);
    let y = run_of(&[(1, 0.80), (0, 0.816)], 1.0);
    let z = run_of(&[(2, 0.95)], 1.0);
    assert!([0, 1].contains(&winner(vec![x.clone(), y.clone(), z.clone()]).0));
    assert!([0, 1].contains(&winner(vec![z, y, x]).0));
    // One run's win does not outweigh losses in the others that timed both kernels.
    let most = vec![
        run_of(&[(0, 0.90), (1, 0.91)], 1.34),
        run_of(&[(0, 0.904), (1, 0.924)], 1.35),
        run_of(&[(1, 0.958), (0, 0.973)], 1.39),
    ];
    assert_eq!(winner(most).0, 0);
}

#[test]
fn a_winner_loses_to_torch_only_against_its_own_run() {
    // A bucket neighbour's winner re-verified here at 0.89x torch: the shape earns a sweep.
    let bucket = entry_against(128, 0, 0.69, Some(0.61), "H100");
    assert!(bucket.loses_to_torch());
    // Its sweep merges with that run; the sweep's winner, ahead of torch in its own run, serves.
    let swept = bucket.merged(&entry_against(128, 2, 0.62, Some(0.63), "H100"));
    assert!(!swept.loses_to_torch(), "{}", swept.winner);
    assert!(
        !entry_against(128, 0, 0.69, None, "H100").loses_to_torch(),
        "no torch time, no verdict"
    );
}

/// A disturbed torch time (samples spread past `DISTURBED_SPREAD`) counts its fastest sample: the
/// vit_b_16 attention entry's H200 run, whose torch median was twice its fastest sample, leaves
/// the pattern to torch; the same times clean keep the kernel.
#[test]
fn a_disturbed_torch_time_counts_its_fastest_sample() {
    let mut e = entry_against(128, 0, 0.0564, Some(0.0602), "H200");
    assert!(!e.loses_to_torch());
    let b = e.runs[e.winner_run].baseline.as_mut().unwrap();
    b.min_ms = 0.0300;
    b.spread = 0.45;
    assert_eq!(e.baseline_ms(), Some(0.0300));
    assert!(e.loses_to_torch());
    e.runs[e.winner_run].baseline.as_mut().unwrap().spread = 0.05;
    assert_eq!(e.baseline_ms(), Some(0.0602));
}

#[test]
fn an_entry_with_a_spec_this_build_does_not_know_is_named_and_the_table_left_intact() {
    let mut t = Table::new();
    t.insert_merged(entry(128, 0, 0.5, "H100"));
    t.insert_merged(entry(256, 0, 0.5, "H100"));
    // Another build's epilogue kind in one candidate of the second entry.
    let mut raw = serde_json::to_value(&t).unwrap();
    raw["entries"][1]["runs"][0]["candidates"][0]["spec"]["epilogue"] = "tma_other".into();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let text = serde_json::to_string_pretty(&raw).unwrap();
    std::fs::write(&path, &text).unwrap();
    let e = Table::load(&path).unwrap_err().to_string();
    let shape = raw["entries"][1]["key"]["shape"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(e.contains("entry 1 of 2") && e.contains(&shape), "{e}");
    assert!(e.contains("does not know that kernel spec"), "{e}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

#[test]
fn truncated_and_newer_tables_are_refused_and_left_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let mut t = Table::new();
    t.insert_merged(entry(128, 0, 0.5, "H100"));
    t.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, &text[..text.len() / 2]).unwrap();
    let e = Table::load(&path).unwrap_err();
    assert!(matches!(e, TableError::Corrupt { .. }), "{e}");
    let e = Table::update(&path, |t| t.insert_merged(entry(64, 0, 0.1, "H100"))).unwrap_err();
    assert!(matches!(e, TableError::Corrupt { .. }));
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text[..text.len() / 2],
        "a failed update writes nothing"
    );
    std::fs::write(
        &path,
        text.replace(&format!("\"schema\":{SCHEMA}"), "\"schema\":99"),
    )
    .unwrap();
    assert!(Table::load(&path)
        .unwrap_err()
        .to_string()
        .contains("upgrade fact"));
    assert_eq!(
        Table::load(&dir.path().join("missing.json")).unwrap(),
        Table::new()
    );
}

#[test]
fn schema_one_tables_are_migrated() {
    let e = entry(128, 0, 0.5, "H100");
    let run = &e.runs[0];
    let v1 = serde_json::json!({
        "schema": 1,
        "entries": [{
            "key": {"rule": e.key.rule, "dtype": "f32", "math": "tf32", "arch": "sm90", "shape": e.key.shape},
            "problem": e.problem,
            "winner": e.winner,
            "winner_spec": e.winner_spec,
            "winner_ms": e.winner_ms,
            "baseline": run.baseline,
            "candidates": run.candidates,
            "provenance": run.provenance,
        }]
    });
    let t = Table::parse(&v1.to_string(), "v1.json").unwrap();
    assert_eq!(t.schema, SCHEMA);
    assert_eq!(t.entries, vec![e]);
}

#[test]
fn schema_two_to_four_tables_are_read_as_five_and_keep_their_entries() {
    let mut t = Table::new();
    t.insert_merged(entry(128, 0, 0.5, "H100"));
    for old in 2..SCHEMA {
        let text = serde_json::to_string(&t).unwrap().replace(
            &format!("\"schema\":{SCHEMA}"),
            &format!("\"schema\":{old}"),
        );
        assert!(text.contains(&format!("\"schema\":{old}")));
        let back = Table::parse(&text, "old.json").unwrap();
        assert_eq!(back.schema, SCHEMA);
        assert_eq!(back.entries, t.entries);
    }
    // A fused problem keeps its epilogue through a save and a load.
    let mut fused = entry(256, 0, 0.5, "H100");
    let ep =
        crate::kinds::gemm::Epilogue::parse("leaves=full;v1=gelu_tanh(v0);v2=add(v1,l0)").unwrap();
    let p = fused
        .problem
        .get::<GemmProblem>()
        .expect("a GEMM entry")
        .clone();
    fused.problem = GemmProblem {
        epilogue: Some(ep.clone()),
        ..p
    }
    .into();
    fused.key.rule = fused.problem.rule_id();
    let mut t = Table::new();
    t.insert_merged(fused.clone());
    let back = Table::parse(&serde_json::to_string(&t).unwrap(), "v3.json").unwrap();
    assert_eq!(
        back.entries[0]
            .problem
            .get::<GemmProblem>()
            .unwrap()
            .epilogue,
        Some(ep)
    );
    assert!(
        back.entries[0].key.rule.contains("_ep_gelu_tanh_add_"),
        "{}",
        back.entries[0].key.rule
    );
}

/// A LayerNorm entry beside a GEMM one: each problem and spec parses back as its own kind (the
/// enums are untagged), and the entry's key is the f32 math's whatever the policy.
#[test]
fn layernorm_entries_round_trip_beside_gemm_entries() {
    use crate::kinds::layernorm::LayerNormProblem;
    let p = LayerNormProblem {
        rows: 65536,
        cols: 768,
        dtype: DType::F32,
        weight: true,
        bias: true,
        add: None,
    };
    let problem = Problem::from(p.clone());
    let math = problem.math(crate::types::Precision::Tf32).unwrap();
    assert_eq!(
        (math, problem.math(crate::types::Precision::F32)),
        (MathType::F32, Some(MathType::F32))
    );
    let spec = crate::kinds::layernorm::candidates(&p, Arch::Sm90).remove(0);
    let timing = Timing {
        median_ms: 0.14,
        min_ms: 0.14,
        max_ms: 0.14,
        spread: 0.0,
        samples: 1,
    };
    let ok = CandidateResult {
        kernel: spec.name(),
        spec: spec.clone().into(),
        outcome: Outcome::Ok {
            max_rel_err: 2e-7,
            timing: timing.clone(),
            tflops: 0.3,
        },
    };
    let run = Run {
        partial: false,
        provenance: provenance("H100"),
        baseline: Some(timing),
        candidates: vec![ok],
    };
    let ln =
        Entry::from_runs(TableKey::of(&problem, math, Arch::Sm90), problem, vec![run]).unwrap();
    assert_eq!(
        (ln.key.rule.as_str(), ln.key.shape.as_str(), ln.key.math),
        ("layernorm_affine", "65536x768", MathType::F32)
    );
    let mut t = Table::new();
    t.insert_merged(entry(128, 0, 0.5, "H100"));
    t.insert_merged(ln.clone());
    let back = Table::parse(&serde_json::to_string(&t).unwrap(), "t.json").unwrap();
    assert_eq!(back, t);
    assert_eq!(back.get(&ln.key).unwrap().winner_spec, Spec::from(spec));
    assert!(
        back.entries
            .iter()
            .any(|e| e.problem.get::<GemmProblem>().is_some()),
        "the GEMM entry stays a GEMM"
    );
}

#[test]
fn ids_find_and_remove_entries() {
    let mut t = Table::new();
    let e = entry(128, 0, 0.5, "H100");
    t.insert_merged(e.clone());
    t.insert_merged(entry(64, 0, 0.5, "H100"));
    assert_eq!(t.find_id(&e.key.id()[..6]).unwrap().key, e.key);
    assert!(matches!(t.find_id("zz"), Err(TableError::NoEntry(_))));
    assert!(matches!(t.find_id(""), Err(TableError::Ambiguous(_))));
    assert_eq!(t.remove_id(&e.key.id()).unwrap().key, e.key);
    assert_eq!(t.entries.len(), 1);
}

#[test]
fn date_is_iso() {
    let d = today();
    assert_eq!(d.len(), 10);
    assert!(d.starts_with("20"));
}

#[test]
fn the_shipped_table_loads_and_serializes_to_the_same_json() {
    // Every kind's problems and kernel specs as the shipped table holds them: what a build reads
    // it writes back byte for byte, as `Table::save` writes it.
    let path = shipped_table_path();
    let text = std::fs::read_to_string(&path).expect("the shipped table");
    let t = Table::parse(&text, &path.display().to_string()).expect("the shipped table parses");
    assert!(t.entries.len() > 100, "{} entries", t.entries.len());
    let rules: std::collections::BTreeSet<&str> =
        t.entries.iter().map(|e| e.key.rule.as_str()).collect();
    for kind in ["gemm_", "sdpa", "attention", "layernorm"] {
        assert!(
            rules.iter().any(|r| r.starts_with(kind)),
            "{kind}: {rules:?}"
        );
    }
    let back = t.text();
    assert!(
        back == text,
        "the shipped table changed on its way through this build"
    );
}

/// An H200's run where kernel 0 ran at half torch's time and an H100's where kernel 2 ran at two
/// thirds of it: by the ratios kernel 0 wins, which is the H200's choice.
pub(crate) fn two_gpus() -> Entry {
    let h200 = entry_against(128, 0, 0.5, Some(1.0), "NVIDIA H200");
    let h100 = entry_against(128, 2, 0.6, Some(0.9), "NVIDIA H100 80GB HBM3");
    h200.merged(&h100)
}

#[test]
fn a_gpu_model_uses_the_winner_of_its_own_runs() {
    let e = two_gpus();
    let specs = gemm_candidates(&problem(128), MathType::Tf32, Arch::Sm90);
    assert_eq!(e.winner, specs[0].name());
    let on = |name: &'static str| move |p: &Provenance| p.device.name == name;

    let h100 = e.for_device(on("NVIDIA H100 80GB HBM3")).unwrap();
    assert_eq!(h100.winner, specs[2].name());
    assert_eq!(h100.winner_ms, 0.6);
    assert_eq!(h100.runs, e.runs, "every run kept");
    assert_eq!(
        h100.winner_provenance().device.name,
        "NVIDIA H100 80GB HBM3"
    );
    assert_eq!(h100.baseline_ms(), Some(0.9));

    let h200 = e.for_device(on("NVIDIA H200")).unwrap();
    assert_eq!(h200.winner, specs[0].name());
    assert_eq!(h200.winner_provenance().device.name, "NVIDIA H200");
    assert!(e.for_device(on("NVIDIA A100-SXM4-80GB")).is_none());
}

#[test]
fn the_kernels_to_time_elsewhere_lead_with_the_winner_and_skip_failures() {
    let e = two_gpus();
    let specs = gemm_candidates(&problem(128), MathType::Tf32, Arch::Sm90);
    let names = |n| {
        e.leading_specs(n)
            .iter()
            .map(|s| s.kernel_name())
            .collect::<Vec<_>>()
    };
    // Kernels 1 and 3 failed verification in their runs: only 0 and 2 were timed.
    assert_eq!(names(4), vec![specs[0].name(), specs[2].name()]);
    assert_eq!(names(1), vec![specs[0].name()]);
    assert_eq!(names(0), vec![specs[0].name()], "the winner at least");
}

/// What `Table::save` writes is the table's JSON, one entry and one learned rule a line.
#[test]
fn a_saved_table_is_its_json_one_entry_a_line() {
    let mut t = Table {
        schema: SCHEMA,
        entries: vec![],
        rules: vec![],
    };
    assert_eq!(
        t.text(),
        format!("{{\"schema\":{SCHEMA},\"entries\":[]}}\n")
    );
    t.insert_merged(two_gpus());
    t.insert_merged(entry_against(
        256,
        1,
        0.4,
        Some(0.5),
        "NVIDIA H100 80GB HBM3",
    ));
    let text = t.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2 + t.entries.len(), "{text}");
    for (line, e) in lines[1..=t.entries.len()].iter().zip(&t.entries) {
        let back: Entry =
            serde_json::from_str(line.trim_end_matches(',')).expect("an entry a line");
        assert_eq!(&back, e);
    }
    let parsed: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(parsed, serde_json::to_value(&t).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    t.save(&path).unwrap();
    assert_eq!(Table::load(&path).unwrap(), t);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

/// A sweep's checkpoint (its runs so far, `partial`) and its record: the record replaces the
/// checkpoint in the table, a checkpoint never replaces a finished run, and an entry is
/// unfinished on a GPU model while a run there is a checkpoint (a finished run beside it being
/// another realization's, the table's leading kernels timed there before the sweep began).
#[test]
fn a_sweeps_checkpoint_is_replaced_by_its_record_and_marks_it_unfinished_until_then() {
    let h100 = "NVIDIA H100 80GB HBM3";
    let here = |p: &Provenance| p.device.name == h100;
    let finished = entry_against(128, 0, 0.5, Some(1.0), h100);
    let partial = |e: &Entry| {
        let runs = e
            .runs
            .iter()
            .map(|r| Run {
                partial: true,
                ..r.clone()
            })
            .collect();
        Entry::from_runs(e.key.clone(), e.problem.clone(), runs).unwrap()
    };
    let checkpoint = partial(&finished);
    assert_eq!(
        checkpoint.unfinished_at(here),
        Some(checkpoint.runs.clone())
    );
    assert_eq!(finished.unfinished_at(here), None);
    assert_eq!(checkpoint.unfinished_at(|_| false), None, "none ran there");

    // The same candidates, finished: the record replaces the checkpoint, not the other way.
    let recorded = checkpoint.merged(&finished);
    assert_eq!(recorded.runs.len(), 1);
    assert!(!recorded.runs[0].partial);
    assert_eq!(recorded.unfinished_at(here), None);
    assert_eq!(finished.merged(&checkpoint), finished);

    // A later round added kernels: the record (more candidates) replaces the first round's
    // checkpoint.
    let mut longer = finished.clone();
    let more = entry_against(128, 2, 0.4, Some(1.0), h100);
    longer.runs[0]
        .candidates
        .extend(more.runs[0].candidates.iter().cloned());
    let longer = Entry::from_runs(longer.key.clone(), longer.problem.clone(), longer.runs).unwrap();
    let recorded = checkpoint.merged(&longer);
    assert_eq!(recorded.runs.len(), 1);
    assert!(!recorded.runs[0].partial);
    assert_eq!(recorded.winner, longer.winner);

    // A finished run on another model does not finish this one's sweep.
    let elsewhere = entry_against(128, 1, 0.6, Some(1.0), "NVIDIA H200");
    let both = checkpoint.merged(&elsewhere);
    assert_eq!(both.unfinished_at(here).map(|r| r.len()), Some(1));

    // Leading kernels timed here before a sweep (their own run, torch timed apart), then the
    // sweep's checkpoint: the checkpoint alone is what the sweep resumes, until its record.
    let timed_here = entry_against(128, 2, 0.7, Some(0.9), h100);
    let swept = timed_here.merged(&checkpoint);
    assert_eq!(swept.runs.len(), 2);
    assert_eq!(swept.unfinished_at(here), Some(checkpoint.runs.clone()));
    assert_eq!(swept.merged(&finished).unfinished_at(here), None);

    // On disk: `partial` only where true; a run without it reads as finished.
    let text = serde_json::to_string(&finished.runs[0]).unwrap();
    assert!(!text.contains("partial"), "{text}");
    let back: Run = serde_json::from_str(&text).unwrap();
    assert!(!back.partial);
    let text = serde_json::to_string(&checkpoint.runs[0]).unwrap();
    assert!(text.contains("\"partial\":true"));
    assert!(serde_json::from_str::<Run>(&text).unwrap().partial);
}
