//! What a user sees when the model or its inputs are wrong: the error names the problem and the
//! fix, and the exit status is non-zero, for `discover` and `compose` alike.

use crate::common::{fact, fixture};
use std::path::Path;
use std::process::Output;

/// Runs `fact discover` and `fact compose` on `model` with `args`; both must fail with the same
/// message, which is returned.
fn both_fail(model: &Path, args: &[&str]) -> String {
    let out_dir = tempfile::tempdir().unwrap();
    let discover = fact()
        .arg("discover")
        .arg(model)
        .args(args)
        .output()
        .unwrap();
    let compose = fact()
        .arg("compose")
        .arg(model)
        .args(args)
        .arg("--out")
        .arg(out_dir.path())
        .output()
        .unwrap();
    let err = |o: &Output| {
        assert!(
            !o.status.success(),
            "exit status {:?}, stdout:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout)
        );
        let e = String::from_utf8_lossy(&o.stderr).into_owned();
        e.lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_else(|| panic!("no error line in:\n{e}"))
            .to_string()
    };
    let (d, c) = (err(&discover), err(&compose));
    // Each wraps the same stage error, which names the model last. Numbers aside: an op that
    // failed on CPU empties says how many elements its uninitialised input gave it, which differs
    // from one process to the next.
    let path = model.display().to_string();
    let cause = |l: &str| {
        l.rfind(&path).map_or(String::new(), |i| {
            let mut out = String::new();
            for c in l[i..].chars() {
                if !c.is_ascii_digit() {
                    out.push(c);
                } else if !out.ends_with('#') {
                    out.push('#');
                }
            }
            out
        })
    };
    assert!(
        !cause(&d).is_empty() && cause(&d) == cause(&c),
        "discover and compose disagree:\n{d}\n{c}"
    );
    d
}

#[test]
fn an_input_the_model_rejects_names_the_op_its_shapes_and_torchs_message() {
    // linear.pt is a traced Linear(64, 128): K = 63 cannot multiply its 128x64 weight.
    let e = both_fail(&fixture("linear.pt"), &["--input", "4x63"]);
    assert!(
        e.contains(
            "shape propagation stops at aten::linear on inputs 4x63:f32: aten::linear got 4x63:f32, 128x64:f32, 128:f32"
        ),
        "{e}"
    );
    assert!(
        e.contains(
            "and torch says \"mat1 and mat2 shapes cannot be multiplied (4x63 and 64x128)\""
        ),
        "{e}"
    );
    assert!(
        e.contains("pass --input shapes the model's forward accepts"),
        "{e}"
    );
    assert!(!e.contains("shapes unknown"), "{e}");
    // The op may also be one fact cannot run for shapes: the message says so too.
    assert!(
        e.contains("or aten::linear needs more than sizes to run")
            && e.contains("that is fact's limit, not your input"),
        "{e}"
    );
}

/// data_dependent.pt views a boolean-mask index back to its traced sizes: no run on meta
/// tensors, CPU empties or CPU zeros has the rows. On the archive's own inputs that is fact's
/// limit: discover succeeds, matches the linear before the op, and says which op stopped shapes;
/// with --input the error names the op and both possible causes.
#[test]
fn an_op_fact_cannot_run_for_shapes_stops_propagation_not_discover() {
    let model = fixture("data_dependent.pt");
    let out = fact()
        .args(["discover", "--json"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let plan = &v["plan"];
    let patterns = plan["patterns"].as_array().unwrap();
    assert_eq!(patterns.len(), 1, "{plan}");
    assert_eq!(patterns[0]["rule"], "gemm_rcr_bias");
    let shapes = plan["shapes"].as_str().unwrap();
    assert!(
        shapes.starts_with("shape propagation stopped at aten::view:")
            && shapes.contains("this is fact's limit, not the model's input"),
        "{shapes}"
    );
    let unmatched = plan["unmatched_gemms"].as_array().unwrap();
    assert_eq!(unmatched.len(), 1, "{plan}");
    assert!(
        unmatched[0]["reason"]
            .as_str()
            .unwrap()
            .contains("its operand shapes are unknown (shape propagation stopped at aten::view"),
        "{}",
        unmatched[0]
    );
    // The plan a person reads says it too.
    let text = fact().arg("discover").arg(&model).output().unwrap();
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("shapes: shape propagation stopped at aten::view"),
        "{text}"
    );

    let e = both_fail(&model, &["--input", "64x64"]);
    assert!(
        e.contains("shape propagation stops at aten::view on inputs 64x64:f32")
            && e.contains("either these inputs are not ones the model's forward takes")
            && e.contains("or aten::view needs more than sizes to run"),
        "{e}"
    );
}

#[test]
fn a_zero_size_input_says_nothing_can_be_tuned_on_it() {
    let e = both_fail(&fixture("linear.pt"), &["--input", "0x64"]);
    assert!(
        e.contains(
            "input 1 (0x64:f32) has a zero-size dimension: nothing can be tuned on an empty tensor"
        ),
        "{e}"
    );
    assert!(
        e.contains("pass the shape of a real batch with --input"),
        "{e}"
    );
}

const TRACE: &str =
    "export the model and save it with torch.export.save(torch.export.export(model.eval(), example_inputs), \"model.pt2\"), or trace it and save it with torch.jit.trace(model.eval(), example_inputs).save(path)";

#[test]
fn a_state_dict_is_not_a_torchscript_module() {
    let e = both_fail(&fixture("state_dict.pt"), &[]);
    assert!(e.contains("state_dict.pt: this is not a TorchScript module: it is a state dict saved with torch.save"), "{e}");
    assert!(
        e.contains("model.load_state_dict(torch.load(path))") && e.contains(TRACE),
        "{e}"
    );
    assert!(!e.contains("no example inputs"), "{e}");
    // With shapes given, the answer is the same.
    let e = both_fail(&fixture("state_dict.pt"), &["--input", "32x64"]);
    assert!(e.contains("it is a state dict"), "{e}");
}

#[test]
fn a_plain_pickle_or_a_pickled_module_is_not_a_torchscript_module() {
    let e = both_fail(&fixture("pickle.pt"), &[]);
    assert!(e.contains("pickle.pt: this is not a TorchScript module: it is a plain pickle saved with torch.save"), "{e}");
    assert!(e.contains(TRACE), "{e}");
    let e = both_fail(&fixture("module_pickle.pt"), &[]);
    assert!(
        e.contains("it is a pickled __main__.Linear object saved with torch.save"),
        "{e}"
    );
    assert!(e.contains(TRACE), "{e}");
}

#[test]
fn a_garbage_file_is_not_a_torchscript_module() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("model.pt");
    std::fs::write(&garbage, b"\x00\x01 these bytes are no model").unwrap();
    let e = both_fail(&garbage, &[]);
    assert!(
        e.contains("model.pt: this is not a TorchScript module: it is not a zip archive"),
        "{e}"
    );
    assert!(e.contains(TRACE), "{e}");
    let empty = dir.path().join("empty.pt");
    std::fs::write(&empty, b"").unwrap();
    assert!(both_fail(&empty, &[]).contains("the file is empty"));
    let e = both_fail(&dir.path().join("missing.pt"), &[]);
    assert!(e.contains("cannot read") && e.contains("missing.pt"), "{e}");
}

#[test]
fn gemms_inside_control_flow_are_listed_as_unmatched_with_the_reason() {
    // branchy.pt is scripted: fc (a linear) runs in the If's then-branch, x @ w (a matmul) in its else.
    let out = fact()
        .args(["discover", "--input", "4x64"])
        .arg(fixture("branchy.pt"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reason = "inside prim::If: fact matches only the top-level block; trace the model (tracing unrolls control flow) or move the GEMM out of the branch";
    let unmatched: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("unmatched GEMM"))
        .collect();
    assert_eq!(unmatched.len(), 2, "{stdout}");
    assert!(
        unmatched[0].contains("aten::linear") && unmatched[0].ends_with(reason),
        "{stdout}"
    );
    assert!(
        unmatched[1].contains("aten::matmul") && unmatched[1].ends_with(reason),
        "{stdout}"
    );

    let out = fact()
        .args(["discover", "--json", "--input", "4x64"])
        .arg(fixture("branchy.pt"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["plan"]["patterns"].as_array().unwrap().len(), 0);
    let kinds: Vec<&str> = v["plan"]["unmatched_gemms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["aten::linear", "aten::matmul"]);
}

#[test]
fn a_model_that_names_a_gpu_still_interprets_on_the_cpu() {
    // cuda_constant.pt adds torch.ones(128, device="cuda"): no op may fail for want of a GPU.
    let out = fact()
        .args(["discover", "--json", "--input", "32x64"])
        .arg(fixture("cuda_constant.pt"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let patterns = v["plan"]["patterns"].as_array().unwrap();
    assert_eq!(patterns.len(), 1, "{}", v["plan"]);
    assert!(
        patterns[0]["rule"]
            .as_str()
            .unwrap()
            .starts_with("gemm_rcr_bias"),
        "{}",
        patterns[0]
    );
    assert_eq!(v["plan"]["unmatched_gemms"].as_array().unwrap().len(), 0);
}

#[test]
fn a_gpus_value_that_is_no_count_list_or_all_names_the_forms() {
    let out_dir = tempfile::tempdir().unwrap();
    let compose = fact()
        .arg("compose")
        .arg(fixture("linear.pt"))
        .args(["--gpus", "two", "--out"])
        .arg(out_dir.path())
        .output()
        .unwrap();
    let realize = fact()
        .args([
            "realize", "--rule", "gemm_rcr", "--dtype", "f32", "--shape", "64x64x64",
        ])
        .args(["--gpus", "0", "--out"])
        .arg(out_dir.path())
        .output()
        .unwrap();
    for (o, says) in [
        (&compose, "bad --gpus 'two': write a count (2), device indices with commas (0,1; one device alone as 1,) or all"),
        (&realize, "--gpus 0: a count is at least 1; for device 0 alone write --gpus 0, (with the comma)"),
    ] {
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains(says), "{e}");
    }
}
