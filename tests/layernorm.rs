//! The LayerNorm kind without a GPU: its kernels built by the pinned pip nvcc into a library beside
//! a GEMM, their can_implement refusing what they cannot take (host code, no device needed), and a
//! fixture composed from a test table: `fact::layernorm` in the graph, its fallback computing what
//! `aten::layer_norm` did and counted, with the reason, when the kind is off and on CPU tensors.
//! Fixture: layernorms.pt (an affine LayerNorm feeding a linear, one without parameters, one with
//! the weight alone, and one over two dims).

use crate::common::{
    build_all, compose_json, fake_tensor, fixture, op_args, run_python, sample_entry,
    sample_op_entry,
};
use fact::kinds::gemm::{GemmLayout, GemmProblem};
use fact::kinds::layernorm::{candidates, LayerNormProblem, LayerNormSpec};
use fact::kinds::rows::RowReads;
use fact::kinds::{Problem, Spec};
use fact::nvcc::library::FactTensor;
use fact::nvcc::Toolchain;
use fact::table::Table;
use fact::types::{Arch, DType, MathType};

fn problem(rows: i64, cols: i64, dtype: DType) -> LayerNormProblem {
    LayerNormProblem {
        rows,
        cols,
        dtype,
        weight: true,
        bias: true,
        add: None,
    }
}

fn first(p: &LayerNormProblem, pick: impl Fn(&LayerNormSpec) -> bool) -> LayerNormSpec {
    candidates(p, Arch::Sm90)
        .into_iter()
        .find(pick)
        .expect("a candidate")
}

/// Every shape of the template: a row split over warps (shared-memory sums), a warp per row, eight
/// threads per row, bf16, f16 with 4-byte loads of a C the 16-byte ones do not divide, and a
/// C of 8192; each compiles, beside a GEMM, into one library whose dispatch table lists them.
#[test]
fn layernorm_kernels_build_beside_a_gemm_and_refuse_what_they_cannot_take() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let gpt = problem(65536, 768, DType::F32);
    let specs = [
        first(&gpt, |s| s.threads_per_row == 64),
        first(&gpt, |s| s.threads_per_row == 32),
        first(&problem(32, 32, DType::F32), |s| s.threads_per_row == 8),
        first(&problem(65536, 768, DType::Bf16), |_| true),
        first(&problem(4096, 770, DType::F16), |_| true),
        first(&problem(1024, 8192, DType::F32), |_| true),
        // Its reads early (the weight and bias with the row), x streamed, on 770's ragged tail.
        first(&problem(4096, 770, DType::F16), |s| {
            s.reads == RowReads::EarlyStreamed
        }),
    ];
    assert_eq!(specs[4].vector, 2, "770 halves take 4-byte loads");
    assert!(specs[5].threads_per_row >= 256);
    let dir = tempfile::tempdir().unwrap();
    let mut all: Vec<Spec> = specs.iter().cloned().map(Spec::from).collect();
    all.push(crate::compile::good_spec().into());
    let built = build_all(&tc, &all, dir.path(), "libln.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.len(), specs.len() + 1);
    for (i, s) in specs.iter().enumerate() {
        assert_eq!(
            (lib.name(i), lib.kind(i).as_deref()),
            (Some(s.name()), Some("layernorm"))
        );
    }
    assert_eq!(lib.kind(specs.len()).as_deref(), Some("gemm"));

    // ln_f32_c768_t64_v4_r2: x and out [4096, 768], weight [768], no bias.
    let k = 0;
    assert_eq!(specs[k].name(), "ln_f32_c768_t64_v4_r2");
    let x = fake_tensor(0x10000, 0, &[4096, 768], &[768, 1]);
    let out = fake_tensor(0x20000, 0, &[4096, 768], &[768, 1]);
    let w = fake_tensor(0x30000, 0, &[768], &[1]);
    let none = fake_tensor(0, 0, &[], &[]);
    let can = |t: &[FactTensor]| lib.can_implement(k, &op_args(t, &[1e-5]));
    assert!(can(&[x, out, w, none]));
    assert!(can(&[x, out, none, w]), "a bias alone");
    assert!(
        can(&[
            fake_tensor(0x10000, 0, &[4096, 768], &[1536, 1]),
            out,
            w,
            none
        ]),
        "rows of x a stride apart"
    );
    assert!(
        can(&[fake_tensor(0x10000, 0, &[4096, 768], &[0, 1]), out, w, none]),
        "one row broadcast"
    );
    let refused = [
        (
            "another C",
            [
                fake_tensor(0x10000, 0, &[4096, 1024], &[1024, 1]),
                fake_tensor(0x20000, 0, &[4096, 1024], &[1024, 1]),
                none,
                none,
            ],
        ),
        (
            "a misaligned x",
            [
                fake_tensor(0x10004, 0, &[4096, 768], &[768, 1]),
                out,
                w,
                none,
            ],
        ),
        (
            "a strided last dim",
            [
                fake_tensor(0x10000, 0, &[4096, 768], &[1536, 2]),
                out,
                w,
                none,
            ],
        ),
        (
            "a row stride that splits a vector",
            [
                fake_tensor(0x10000, 0, &[4096, 768], &[770, 1]),
                out,
                w,
                none,
            ],
        ),
        (
            "another dtype",
            [
                fake_tensor(0x10000, 1, &[4096, 768], &[768, 1]),
                out,
                w,
                none,
            ],
        ),
        (
            "rows of the output overlapping",
            [x, fake_tensor(0x20000, 0, &[4096, 768], &[0, 1]), w, none],
        ),
        (
            "a weight of another C",
            [x, out, fake_tensor(0x30000, 0, &[1024], &[1]), none],
        ),
        (
            "a misaligned bias",
            [x, out, w, fake_tensor(0x30008, 0, &[768], &[1])],
        ),
        (
            "no rows",
            [
                fake_tensor(0x10000, 0, &[0, 768], &[768, 1]),
                fake_tensor(0x20000, 0, &[0, 768], &[768, 1]),
                none,
                none,
            ],
        ),
    ];
    for (why, t) in refused {
        assert!(!can(&t), "{why}");
    }
    assert!(
        !lib.can_implement(k, &op_args(&[x, out, w], &[1e-5])),
        "three tensors"
    );
    assert!(
        !lib.can_implement(k, &op_args(&[x, out, w, none], &[])),
        "no eps"
    );
    // f16 with 4-byte loads takes rows 2 elements apart, which 16-byte kernels could not.
    let h = |addr: usize, stride: i64| fake_tensor(addr, 2, &[4096, 770], &[stride, 1]);
    assert!(lib.can_implement(
        4,
        &op_args(&[h(0x10004, 772), h(0x20000, 770), none, none], &[1e-5])
    ));
    assert!(!lib.can_implement(
        4,
        &op_args(&[h(0x10002, 772), h(0x20000, 770), none, none], &[1e-5])
    ));
}

/// The fixture's problems: the linear, and its three LayerNorms over the last dim (32 rows of 64).
fn test_table() -> (Table, LayerNormSpec) {
    let ln = |weight: bool, bias: bool| LayerNormProblem {
        rows: 32,
        cols: 64,
        dtype: DType::F32,
        weight,
        bias,
        add: None,
    };
    let spec = candidates(&ln(true, true), Arch::Sm90).remove(0);
    let mut t = Table::new();
    let linear = GemmProblem {
        m: 32,
        n: 128,
        k: 64,
        layout: GemmLayout::Rcr,
        dtype: DType::F32,
        bias: true,
        batch: 1,
        epilogue: None,
        padded_from: None,
    };
    t.insert_merged(sample_entry(
        &linear,
        &crate::compile::good_spec(),
        0.01,
        "test table (not a measurement)",
    ));
    for (weight, bias) in [(true, true), (false, false), (true, false)] {
        // Under either policy a LayerNorm's key is the f32 math's.
        t.insert_merged(sample_op_entry(
            &Problem::from(ln(weight, bias)),
            &spec.clone().into(),
            MathType::F32,
            0.002,
            "test table (not a measurement)",
        ));
    }
    (t, spec)
}

#[test]
fn a_table_hit_composes_fact_layernorm_whose_fallback_is_layer_norm() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    let (table, spec) = test_table();
    table.save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json(&user, &fixture("layernorms.pt"), &out_dir);
    let patterns = v["compose"]["patterns"].as_array().unwrap();
    let ln: Vec<&serde_json::Value> = patterns
        .iter()
        .filter(|p| p["rule"].as_str().unwrap().starts_with("layernorm"))
        .collect();
    let rules: Vec<&str> = ln.iter().map(|p| p["rule"].as_str().unwrap()).collect();
    assert_eq!(
        rules,
        [
            "layernorm_affine",
            "layernorm",
            "layernorm_weight",
            "layernorm_weight"
        ],
        "the norm over two dims is no pattern; the written-out one is the weight-only problem"
    );
    for p in &ln {
        assert_eq!(
            (p["realization"]["how"].as_str(), p["kernel"].as_str()),
            (Some("hit"), Some(spec.name().as_str())),
            "{p}"
        );
        assert!(
            p["origin"] == "layer_norm" || p["origin"] == "layer_norm (written out)",
            "{p}"
        );
        assert_eq!(
            p["kind"], "layernorm",
            "compose.json names each pattern's kind"
        );
    }
    let linear = patterns
        .iter()
        .find(|p| p["rule"] == "gemm_rcr_bias")
        .expect("the Linear after the affine LayerNorm");
    assert_eq!(linear["kind"], "gemm");
    let lib = out_dir.join("libfact_ops.so");
    let composed = out_dir.join("composed.pt");
    // FACT_DISABLE names the kind before the first call; fact_disable("") turns it on again, and
    // on CPU tensors the op still falls back, saying why. Each time the outputs are the original's.
    let script = format!(
        r#"
import ctypes, json, os
os.environ["FACT_DISABLE"] = "layernorm"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert graph.count("fact::layernorm(") == 3 and graph.count("aten::layer_norm(") == 1, graph
assert graph.count("fact::layernorm_written(") == 1 and "aten::rsqrt" not in graph, graph
assert graph.count("fact::gemm(") == 1 and "aten::linear" not in graph, graph
orig = torch.jit.load({orig:?})
{op_lib}
x = torch.randn(32, 64) * 10 + 3

def check():
    with torch.no_grad():
        got, want = m(x), orig(x)
    for g, w in zip(got, want):
        assert torch.equal(g, w), (g - w).abs().max()
    stats = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    return stats[{kernel:?}]

off = check()
assert off == {{"ran": 0, "copied": 0, "fell_back": 4, "why": "layernorm is turned off (FACT_DISABLE or fact_disable)"}}, off
assert so.fact_disable(b"") == 0
cpu = check()
assert cpu == {{"ran": 0, "copied": 0, "fell_back": 4, "why": "not CUDA tensors of one device"}}, cpu
print("ok")
"#,
        lib = lib.display().to_string(),
        op_lib = crate::common::op_lib_python(&lib.display().to_string()),
        composed = composed.display().to_string(),
        orig = fixture("layernorms.pt").display().to_string(),
        kernel = spec.name(),
    );
    assert_eq!(run_python(&script), "ok");
}
