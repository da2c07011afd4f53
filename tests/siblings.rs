//! The sibling-linears kind without a GPU: a fixture composed with `--fuse-siblings` from a test
//! table: `fact::linears3` and `fact::linears2` in the graph where the linears were, the
//! concatenated weights and biases as buffers of the module, and the op's fallback computing
//! exactly what the replaced linears did, counted with the reason, when the kind is off and on
//! CPU tensors; without the flag the same model composes to plain GEMMs.
//! Fixture: qkv_projections.pt (q, k, v of widths 64, 32, 32 off x [2, 8, 64] without biases;
//! biased k and v of 32 off y).

use crate::common::{compose_json_with, first_gemm_kernels_table, fixture, plan_rules, run_python};
use fact::kinds::siblings::SiblingsProblem;
use fact::kinds::Problem;
use fact::table::Table;
use fact::types::DType;

/// The fixture's two groups under the default tf32 policy, each with the GEMM kind's first
/// candidate for its concatenated GEMM as the winner (test data, not a measurement).
fn test_table() -> (Table, Vec<String>) {
    let p = |widths: Vec<i64>, bias: bool| SiblingsProblem {
        m: 16,
        k: 64,
        widths,
        dtype: DType::F32,
        bias,
    };
    first_gemm_kernels_table(
        [p(vec![64, 32, 32], false), p(vec![32, 32], true)]
            .map(|p| (Problem::from(p.clone()), p.gemm_problem())),
    )
}

#[test]
fn fused_siblings_compose_to_one_op_whose_fallback_is_the_graphs_linears() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    let (table, kernels) = test_table();
    table.save(&user).unwrap();
    let model = fixture("qkv_projections.pt");

    // Off by default: discover plans five plain GEMMs; asked, two groups.
    assert_eq!(
        plan_rules(&model, &[]),
        [
            "gemm_rcr",
            "gemm_rcr",
            "gemm_rcr",
            "gemm_rcr_bias",
            "gemm_rcr_bias"
        ]
    );
    assert_eq!(
        plan_rules(&model, &["--fuse-siblings"]),
        ["siblings_rcr", "siblings_rcr_bias"]
    );

    let out_dir = dir.path().join("out");
    let v = compose_json_with(&user, &model, &out_dir, &["--fuse-siblings"]);
    let patterns = v["compose"]["patterns"].as_array().unwrap();
    let rules: Vec<&str> = patterns
        .iter()
        .map(|p| p["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["siblings_rcr", "siblings_rcr_bias"], "{patterns:?}");
    for (p, kernel) in patterns.iter().zip(&kernels) {
        assert_eq!(
            (p["realization"]["how"].as_str(), p["kernel"].as_str()),
            (Some("hit"), Some(kernel.as_str())),
            "{p}"
        );
        assert_eq!(p["kind"], "siblings");
    }
    let lib = out_dir.join("libfact_ops.so");
    let composed = out_dir.join("composed.pt");
    let script = format!(
        r#"
import ctypes, json, os
os.environ["FACT_DISABLE"] = "siblings"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert graph.count("fact::linears3(") == 1 and graph.count("fact::linears2(") == 1, graph
assert "aten::linear" not in graph, graph
orig = torch.jit.load({orig:?})
params = dict(orig.named_parameters())
buffers = dict(m.named_buffers())
for names in (("q.weight", "k.weight", "v.weight"), ("k_b.weight", "v_b.weight"), ("k_b.bias", "v_b.bias")):
    name = "fact_concatenated_" + "_".join(n.replace(".", "_") for n in names)
    assert torch.equal(buffers[name], torch.cat([params[n] for n in names])), name
{op_lib}
x, y = torch.randn(2, 8, 64), torch.randn(2, 8, 64)

def check():
    with torch.no_grad():
        got, want = m(x, y), orig(x, y)
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g, w), (g - w).abs().max()
    stats = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    return [stats[k] for k in {kernels:?}]

off = check()
assert off == [{{"ran": 0, "copied": 0, "fell_back": 1, "why": "siblings is turned off (FACT_DISABLE or fact_disable)"}}] * 2, off
assert so.fact_disable(b"") == 0
cpu = check()
assert cpu == [{{"ran": 0, "copied": 0, "fell_back": 1, "why": "not CUDA tensors of one device"}}] * 2, cpu
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
