//! compose's two phases through the CLI, without a GPU: `compose --quick` writes the output of
//! its first phase and records how it was asked for in compose.json; `fact tune DIR` reads that
//! report back, runs the full phase over the folder and, where no winner changes, leaves the
//! composed output and the op library as they were, byte for byte, in the format the compose
//! wrote. (The phases' sweeps, resumed and rewritten, are compose's unit tests, on fake GPUs.)

use crate::common::{fact, fixture};
use crate::compile::{good_spec, table_with};
use std::path::Path;

/// `fact ARGS` with `user` as the only pattern table; asserts it succeeded, returns its JSON
/// and its stderr.
fn run_json(user: &Path, args: &[&str]) -> (serde_json::Value, String) {
    let o = fact()
        .env("FACT_TABLE", user)
        .env("FACT_SHIPPED_TABLE", user.with_file_name("none.json"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "fact {args:?}: {stderr}");
    (serde_json::from_slice(&o.stdout).unwrap(), stderr)
}

#[test]
fn fact_tune_over_a_quick_compose_keeps_its_outputs_where_no_winner_changes() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    table_with(&good_spec()).save(&user).unwrap();
    for (model, composed) in [("linear.pt", "composed.pt"), ("linear.pt2", "composed.pt2")] {
        let out = dir.path().join(model.replace('.', "_"));
        let out_s = out.to_str().unwrap();
        let model = fixture(model);
        let (v, stderr) = run_json(
            &user,
            &[
                "compose",
                "--quick",
                "--refine",
                "2",
                "--no-bench",
                "--json",
                "--out",
                out_s,
                model.to_str().unwrap(),
            ],
        );
        assert!(stderr.contains("phase 1 of 2"), "{stderr}");
        let c = &v["compose"];
        assert_eq!(c["patterns"][0]["realization"]["how"], "hit");
        // Every pattern from the tables: nothing left, the output is the full one already.
        assert_eq!(c["sweeps_left"], 0);
        assert_eq!(c["phase"], "full");
        assert_eq!(c["phases"][0]["phase"], "quick");
        assert_eq!(c["asked"]["refine"], 2, "how it was asked, for fact tune");
        let outputs = [composed, "libfact_ops.so"];
        let before: Vec<Vec<u8>> = outputs
            .iter()
            .map(|f| std::fs::read(out.join(f)).unwrap())
            .collect();

        let (t, stderr) = run_json(&user, &["tune", out_s, "--json"]);
        assert!(stderr.contains("phase 2 of 2"), "{stderr}");
        assert_eq!(t["phase"], "full");
        assert_eq!(t["rewritten"], false);
        assert!(t.get("changes").is_none(), "no change listed: {t}");
        let phases: Vec<&str> = t["phases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["phase"].as_str().unwrap())
            .collect();
        assert_eq!(phases, ["quick", "full"]);
        assert_eq!(t["asked"]["refine"], 2, "fact tune asks what compose asked");
        assert_eq!(t["patterns"][0]["kernel"], good_spec().name());
        for (f, bytes) in outputs.iter().zip(&before) {
            assert_eq!(
                &std::fs::read(out.join(f)).unwrap(),
                bytes,
                "{f} rewritten though no winner changed"
            );
        }
        // The report on disk is the tune's, and names the format compose wrote.
        let on_disk: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("compose.json")).unwrap())
                .unwrap();
        assert_eq!(on_disk["phases"], t["phases"]);
        assert!(on_disk["composed"].as_str().unwrap().ends_with(composed));
    }
}

#[test]
fn fact_tune_says_what_it_needs_of_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    let o = fact().args(["tune"]).arg(dir.path()).output().unwrap();
    assert!(!o.status.success());
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("compose.json") && stderr.contains("run fact compose first"),
        "{stderr}"
    );
}
