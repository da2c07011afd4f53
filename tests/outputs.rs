//! Outputs written whole (src/atomic.rs): a compose killed while it saves leaves each of its
//! outputs (the composed module, the op library, compose.json) as the compose before it wrote them,
//! or absent where there was none, never truncated; a compose that finishes leaves no temporary
//! file beside them. The kill is `FACT_TEST_KILL_WRITING`: the process aborts inside the write of
//! the file it names, after the writer (the bridge's save, the linker) wrote half of it.

use crate::common::{compose_json, fact, fixture, run_python};
use crate::compile::{good_spec, table_with};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

const OUTPUTS: [&str; 3] = ["libfact_ops.so", "composed.pt", "compose.json"];

/// `fact compose` of linear.pt into `out`, with `user` its only table, killed while it writes
/// the file `killed`.
fn killed_compose(user: &Path, out: &Path, killed: &str) {
    let o = fact()
        .env("FACT_TABLE", user)
        .env("FACT_SHIPPED_TABLE", out.with_file_name("none.json"))
        .env("FACT_TEST_KILL_WRITING", killed)
        .args(["compose", "--json", "--out"])
        .arg(out)
        .arg(fixture("linear.pt"))
        .output()
        .unwrap();
    assert_eq!(
        o.status.signal(),
        Some(6),
        "the compose was to abort while writing {killed}: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The composed module at `out` loads with its op library and computes the original's output.
fn loads_and_runs(out: &Path) {
    let script = format!(
        r#"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
orig = torch.jit.load({orig:?})
x = torch.randn(32, 64)
with torch.no_grad():
    assert torch.equal(m(x), orig(x))
print("ok")
"#,
        lib = out.join("libfact_ops.so").display().to_string(),
        composed = out.join("composed.pt").display().to_string(),
        orig = fixture("linear.pt").display().to_string(),
    );
    assert_eq!(run_python(&script), "ok");
}

#[test]
fn a_compose_killed_while_saving_leaves_the_previous_outputs_whole() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    table_with(&good_spec()).save(&user).unwrap();

    // Killed saving the module of a first compose: no module (the library before it is whole).
    let first = dir.path().join("first");
    killed_compose(&user, &first, "composed.pt");
    assert!(!first.join("composed.pt").exists());
    assert!(first.join("libfact_ops.so").is_file());

    // A compose that finishes: its outputs in place, no temporary file or folder beside them.
    let out = dir.path().join("out");
    compose_json(&user, &fixture("linear.pt"), &out);
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["compose.json", "composed.pt", "libfact_ops.so", "src"]
    );
    let before: Vec<Vec<u8>> = OUTPUTS
        .iter()
        .map(|f| std::fs::read(out.join(f)).unwrap())
        .collect();

    // Killed while writing each output in turn: that output is the previous compose's, byte for
    // byte, and the module still loads and runs with its library.
    for (name, previous) in OUTPUTS.iter().zip(&before) {
        killed_compose(&user, &out, name);
        assert!(
            std::fs::read(out.join(name)).unwrap() == *previous,
            "{name} is not the previous compose's after a kill while writing it"
        );
        loads_and_runs(&out);
    }
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("compose.json")).unwrap()).unwrap();
    assert_eq!(report["patterns"][0]["kernel"], good_spec().name());
}

/// A disk that fills while a module is saved (/dev/full refuses every write) is an error that
/// says so and names the fix; torch's zip writer, told of the short write, would abort the process.
#[test]
fn a_full_disk_while_saving_is_an_error_not_an_abort() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        return;
    }
    let e = fact::torch::save_torchscript(&fixture("linear.pt"), full)
        .expect_err("a save to a full disk succeeded")
        .to_string();
    assert!(e.contains("No space left on device"), "{e}");
    assert!(e.contains("free space"), "{e}");
}
