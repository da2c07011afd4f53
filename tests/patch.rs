//! The patch-embedding kind without a GPU: a fixture composed from a test table has
//! `fact::patch_conv` where each patch embedding's convolution was, on the module's own weight
//! and bias, and the op's fallback computes exactly what the convolution did, counted with the
//! reason, when the kind is turned off and on CPU tensors; with `--no-patch-conv` the same model
//! plans the convolution kind's patterns, and a patch embedding torch's convolution beats falls
//! to the convolution kind's pattern.
//! The same model exported (`.pt2`) composes to a program that runs eagerly, under torch.compile
//! and under Inductor's C++ wrapper, which calls the op's C shim.
//! Fixture: patch_embeds.pt and .pt2 (x [2, 3, 32, 34], the batch dynamic in the program:
//! ViT-style 8x8 patches to 64 channels with a bias, then flattened to tokens that a linear reads;
//! a 4x4 stem to 32 channels without one).

use crate::common::{compose_json_with, first_gemm_kernels_table, fixture, plan_rules, run_python};
use fact::kinds::patch::PatchProblem;
use fact::kinds::Problem;
use fact::table::Table;
use fact::types::DType;

/// The fixture's two patch embeddings under the default tf32 policy, each with the GEMM kind's
/// first candidate for its GEMM as the winner (test data, not a measurement).
fn test_table() -> (Table, Vec<String>) {
    let p = |out_channels: i64, patch: i64, bias: bool| PatchProblem {
        images: 2,
        height: 32,
        width: 34,
        in_channels: 3,
        out_channels,
        patch: [patch, patch],
        dtype: DType::F32,
        bias,
    };
    first_gemm_kernels_table(
        [p(64, 8, true), p(32, 4, false)].map(|p| (Problem::from(p.clone()), p.gemm_problem())),
    )
}

/// The compose report's patch patterns, after checking that every pattern of the plan (the
/// head's GEMM too, which the test table leaves untuned) has a plan id of its own and a
/// realization: a GEMM's id and a patch embedding's once collided, and compose realized one
/// problem twice and then found no realization for the other.
fn patch_patterns(v: &serde_json::Value) -> Vec<serde_json::Value> {
    let patterns = v["compose"]["patterns"].as_array().unwrap();
    let ids: std::collections::BTreeSet<&str> =
        patterns.iter().map(|p| p["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), patterns.len(), "{patterns:?}");
    let rules: Vec<&str> = patterns
        .iter()
        .map(|p| p["rule"].as_str().unwrap())
        .collect();
    assert_eq!(
        rules,
        ["gemm_rcr_bias", "patch_conv_bias", "patch_conv"],
        "{patterns:?}"
    );
    assert!(
        patterns.iter().all(|p| p["realization"]["how"].is_string()),
        "{patterns:?}"
    );
    patterns
        .iter()
        .filter(|p| p["kind"] == "patch")
        .cloned()
        .collect()
}

#[test]
fn patch_embeddings_compose_to_patch_conv_whose_fallback_is_the_convolution() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    let (table, kernels) = test_table();
    table.save(&user).unwrap();
    let model = fixture("patch_embeds.pt");

    // On by default; --no-patch-conv leaves both to the convolution kind.
    assert_eq!(
        plan_rules(&model, &["--no-patch-conv"]),
        ["conv2d_s4_p0_d1", "conv2d_s8_p0_d1_bias", "gemm_rcr_bias"]
    );
    assert_eq!(
        plan_rules(&model, &[]),
        ["gemm_rcr_bias", "patch_conv", "patch_conv_bias"]
    );

    let out_dir = dir.path().join("out");
    let v = compose_json_with(&user, &model, &out_dir, &[]);
    let patterns = patch_patterns(&v);
    for (p, kernel) in patterns.iter().zip(&kernels) {
        assert_eq!(p["kind"], "patch");
        assert_eq!(
            (p["realization"]["how"].as_str(), p["kernel"].as_str()),
            (Some("hit"), Some(kernel.as_str())),
            "{p}"
        );
    }
    let lib = out_dir.join("libfact_ops.so");
    let composed = out_dir.join("composed.pt");
    let script = format!(
        r#"
import collections, ctypes, json, os
os.environ["FACT_DISABLE"] = "patch"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert graph.count("fact::patch_conv(") == 2, graph
assert "aten::_convolution" not in graph, graph
orig = torch.jit.load({orig:?})
{op_lib}
# Rows and columns past the last whole patch, at another batch too.
xs = [torch.randn(2, 3, 32, 34), torch.randn(3, 3, 35, 33)]

def check(x):
    with torch.no_grad():
        got, want = m(x), orig(x)
    assert len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.stride() == w.stride() and torch.equal(g, w), (g - w).abs().max()
    stats = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    return {{k: stats[k] for k in {kernels:?}}}

calls = collections.Counter({kernels:?})
for x in xs:
    off = check(x)
    assert off == {{k: {{"ran": 0, "copied": 0, "fell_back": n, "why": "patch is turned off (FACT_DISABLE or fact_disable)"}} for k, n in calls.items()}}, off
assert so.fact_disable(b"") == 0
for x in xs:
    cpu = check(x)
    assert cpu == {{k: {{"ran": 0, "copied": 0, "fell_back": n, "why": "not CUDA tensors of one device"}} for k, n in calls.items()}}, cpu
print("ok")
"#,
        lib = lib.display().to_string(),
        op_lib = crate::common::op_lib_python(&lib.display().to_string()),
        composed = composed.display().to_string(),
        orig = model.display().to_string(),
        kernels = kernels,
    );
    assert_eq!(run_python(&script), "ok");
}

#[test]
fn a_composed_pt2_program_runs_patch_conv_eagerly_compiled_and_through_its_c_shim() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    test_table().0.save(&user).unwrap();
    let model = fixture("patch_embeds.pt2");
    let out_dir = dir.path().join("out");
    let v = compose_json_with(&user, &model, &out_dir, &["--no-bench"]);
    assert_eq!(v["compose"]["format"], "pt2");
    patch_patterns(&v);
    let script = format!(
        r#"
import re
import torch
import fact
from torch._inductor.utils import run_and_get_code
fact.load_library({lib:?})
fact.use_c_shims({lib:?})
# Inductor's caches key a compiled graph by the graph, not by the op library's code.
torch._inductor.config.fx_graph_cache = False
torch._functorch.config.enable_autograd_cache = False
ep = torch.export.load({composed:?})
targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
assert targets.count("fact.patch_conv.default") == 2 and "aten.conv2d.default" not in targets, targets
orig = torch.export.load({orig:?}).module()
# Another batch than the sample's: the program's batch is dynamic.
x = torch.randn(3, 3, 32, 34)
with torch.no_grad():
    want = orig(x)
    have = ep.module()(x)
    for h, w in zip(have, want):
        assert torch.equal(h, w), (h - w).abs().max()
    compiled = torch.compile(ep.module())(x)
    for c, w in zip(compiled, want):
        err = ((c.double() - w.double()).norm() / w.double().norm()).item()
        assert err <= 1e-5, err
    compiled, code = run_and_get_code(torch.compile(ep.module(), options={{"cpp_wrapper": True}}), x)
code = "\n".join(code)
assert "aoti_torch_cpu_patch_conv(" in code and '"torch.ops.fact.' not in code, code[-3000:]
for c, w in zip(compiled, want):
    err = ((c.double() - w.double()).norm() / w.double().norm()).item()
    assert err <= 1e-5, err
print("ok")
"#,
        lib = out_dir.join("libfact_ops.so").display().to_string(),
        composed = out_dir.join("composed.pt2").display().to_string(),
        orig = model.display().to_string(),
    );
    assert_eq!(run_python(&script), "ok");
}

/// A patch embedding whose GEMM kernel torch's convolution beats (in the table: the stem's entry
/// times its kernel slower than its baseline) falls to the convolution kind's pattern of the same
/// node, which its own table entry realizes; the ViT-style embedding stays `fact::patch_conv`.
#[test]
fn a_patch_embedding_torch_beats_falls_to_the_convolution_kinds_pattern() {
    use fact::kinds::conv::candidates;
    use fact::types::{Arch, MathType};
    let model = fixture("patch_embeds.pt");
    let (g, _) = fact::torch::load_graph(&model, &[]).unwrap();
    let stem = fact::kinds::patch::match_patches(&g)
        .into_iter()
        .find(|m| !m.problem.bias)
        .expect("the stem's patch embedding");
    let alone = stem
        .alone
        .clone()
        .expect("the convolution kind's match of the stem");
    assert_eq!(fact::rules::Match::nodes(&alone), [stem.conv]);

    let (mut table, kernels) = test_table();
    let key = fact::table::TableKey::of(
        &Problem::from(stem.problem.clone()),
        MathType::Tf32,
        Arch::Sm90,
    );
    let entry = table
        .entries
        .iter_mut()
        .find(|e| e.key == key)
        .expect("the stem's entry");
    // torch's convolution twice as fast as the kernel.
    let mut baseline = entry.runs[0].baseline.clone().unwrap();
    baseline.median_ms /= 2.0;
    baseline.min_ms /= 2.0;
    baseline.max_ms /= 2.0;
    let runs = entry.runs.iter().cloned().map(|mut r| {
        r.baseline = Some(baseline.clone());
        r
    });
    let slower =
        fact::table::Entry::from_runs(entry.key.clone(), entry.problem.clone(), runs.collect())
            .unwrap();
    *entry = slower;
    let conv_spec = candidates(&alone.problem, MathType::Tf32, Arch::Sm90)
        .unwrap()
        .remove(0);
    table.insert_merged(crate::common::sample_op_entry(
        &Problem::from(alone.problem.clone()),
        &fact::kinds::Spec::from(conv_spec.clone()),
        MathType::Tf32,
        0.001,
        "test table (not a measurement)",
    ));
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    table.save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json_with(&user, &model, &out_dir, &["--no-bench"]);
    let patterns = v["compose"]["patterns"].as_array().unwrap();
    let realized: Vec<(&str, &str, Option<&str>)> = patterns
        .iter()
        .map(|p| {
            (
                p["kind"].as_str().unwrap(),
                p["rule"].as_str().unwrap(),
                p["kernel"].as_str(),
            )
        })
        .filter(|(kind, _, _)| *kind != "gemm")
        .collect();
    assert_eq!(
        realized,
        [
            ("patch", "patch_conv_bias", Some(kernels[0].as_str())),
            ("conv", "conv2d_s4_p0_d1", Some(conv_spec.name().as_str())),
        ],
        "{patterns:?}"
    );
    assert!(
        v.to_string()
            .contains("the patch embedding as one GEMM is left to torch"),
        "compose's notes say what fell back: {v}"
    );
    let script = format!(
        r#"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert graph.count("fact::patch_conv(") == 1 and graph.count("fact::conv(") == 1, graph
orig = torch.jit.load({orig:?})
x = torch.randn(2, 3, 32, 34)
with torch.no_grad():
    for g, w in zip(m(x), orig(x)):
        assert g.shape == w.shape and torch.allclose(g, w, rtol=1e-5, atol=1e-5), (g - w).abs().max()
print("ok")
"#,
        lib = out_dir.join("libfact_ops.so").display().to_string(),
        composed = out_dir.join("composed.pt").display().to_string(),
        orig = model.display().to_string(),
    );
    assert_eq!(run_python(&script), "ok");
}
