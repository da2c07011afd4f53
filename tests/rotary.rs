//! The rotary kind without a GPU: its kernels built by the pinned pip nvcc into a library beside a
//! GEMM and a LayerNorm, their can_implement refusing what they cannot take (host code, no device
//! needed), and a fixture composed from a test table: `fact::rotary_qk` and `fact::rotary` in the
//! graph, their fallback computing exactly what the replaced nodes did, counted with the reason,
//! when the kind is off and on CPU tensors. Fixture: rotaries.pt (Llama's halves on q and k from
//! position ids, GPT-J's partial pairs on v).

use crate::common::{
    build_all, compose_json, fake_tensor, fixture, op_args, run_python, sample_op_entry,
};
use fact::kinds::layernorm::{self, LayerNormProblem};
use fact::kinds::rotary::{candidates, Form, RotaryProblem, RotarySpec};
use fact::kinds::{Problem, Spec};
use fact::nvcc::library::FactTensor;
use fact::nvcc::Toolchain;
use fact::table::Table;
use fact::types::{Arch, DType, MathType};

fn problem(rule: &str, dims: &[i64], dtype: DType) -> RotaryProblem {
    RotaryProblem::from_rule(rule, dims, dtype).unwrap()
}

fn first(p: &RotaryProblem) -> RotarySpec {
    candidates(p, Arch::Sm90).remove(0)
}

/// Llama's halves (bf16, 16-byte accesses), Pythia's partial halves, GPT-J's pairs in f32 and
/// f16 with one pair per access: each compiles beside a GEMM and a LayerNorm into one library
/// whose dispatch table lists them as rotary kernels.
#[test]
fn rotary_kernels_build_beside_the_others_and_refuse_what_they_cannot_take() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let specs = [
        first(&problem(
            "rotary_halves_qk",
            &[4, 16, 4, 1024, 128, 128],
            DType::Bf16,
        )),
        first(&problem(
            "rotary_halves_qk",
            &[8, 12, 12, 512, 64, 16],
            DType::Bf16,
        )),
        first(&problem(
            "rotary_pairs",
            &[2, 16, 0, 128, 256, 64],
            DType::F32,
        )),
        candidates(
            &problem("rotary_pairs_qk", &[1, 4, 4, 8, 16, 6], DType::F16),
            Arch::Sm90,
        )
        .remove(0),
    ];
    assert_eq!(specs[0].vector, 8);
    assert_eq!(specs[3].vector, 2);
    let ln = layernorm::candidates(
        &LayerNormProblem {
            rows: 64,
            cols: 768,
            dtype: DType::Bf16,
            weight: true,
            bias: true,
            add: None,
        },
        Arch::Sm90,
    )
    .remove(0);
    let dir = tempfile::tempdir().unwrap();
    let mut all: Vec<Spec> = specs.iter().cloned().map(Spec::from).collect();
    all.push(crate::compile::good_spec().into());
    all.push(ln.into());
    let built = build_all(&tc, &all, dir.path(), "librope.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.len(), specs.len() + 2);
    for (i, s) in specs.iter().enumerate() {
        assert_eq!(
            (lib.name(i), lib.kind(i).as_deref()),
            (Some(s.name()), Some("rotary"))
        );
    }

    // rope_halves_bf16_d128_r128_v8_*: q [4,1024,16,128] rows in memory order (the op orders
    // the transposed view's dims by stride), k with 4 heads, cos and sin [4,1024,1,128] broadcast
    // along the heads (stride 0).
    let k = 0;
    let bf = 1;
    let q = fake_tensor(0x100000, bf, &[4, 1024, 16, 128], &[2097152, 2048, 128, 1]);
    let kk = fake_tensor(0x200000, bf, &[4, 1024, 4, 128], &[524288, 512, 128, 1]);
    let cq = fake_tensor(0x300000, bf, &[4, 1024, 16, 128], &[131072, 128, 0, 1]);
    let ck = fake_tensor(0x300000, bf, &[4, 1024, 4, 128], &[131072, 128, 0, 1]);
    let oq = fake_tensor(0x400000, bf, &[4, 1024, 16, 128], &[2097152, 2048, 128, 1]);
    let ok = fake_tensor(0x500000, bf, &[4, 1024, 4, 128], &[524288, 512, 128, 1]);
    let none = fake_tensor(0, 0, &[], &[]);
    let can = |t: [FactTensor; 8]| lib.can_implement(k, &op_args(&t, &[]));
    assert!(can([q, kk, cq, cq, ck, ck, oq, ok]));
    assert!(can([q, none, cq, cq, none, none, oq, none]), "q alone");
    assert!(
        can([
            fake_tensor(0x100000, bf, &[4, 1024, 16, 128], &[6291456, 6144, 128, 1]),
            kk,
            cq,
            cq,
            ck,
            ck,
            oq,
            ok
        ]),
        "q a view of a fused qkv"
    );
    let refused = [
        (
            "another head dim",
            [
                fake_tensor(0x100000, bf, &[4, 1024, 16, 64], &[1048576, 1024, 64, 1]),
                none,
                cq,
                cq,
                none,
                none,
                oq,
                none,
            ],
        ),
        (
            "a misaligned q",
            [
                fake_tensor(0x100008, bf, &[4, 1024, 16, 128], &[2097152, 2048, 128, 1]),
                kk,
                cq,
                cq,
                ck,
                ck,
                oq,
                ok,
            ],
        ),
        (
            "a row stride that splits a vector",
            [
                fake_tensor(0x100000, bf, &[4, 1024, 16, 128], &[2097152, 2048, 132, 1]),
                kk,
                cq,
                cq,
                ck,
                ck,
                oq,
                ok,
            ],
        ),
        (
            "a strided last dim",
            [
                fake_tensor(0x100000, bf, &[4, 1024, 16, 128], &[2097152, 4096, 256, 2]),
                kk,
                cq,
                cq,
                ck,
                ck,
                oq,
                ok,
            ],
        ),
        (
            "another dtype",
            [
                fake_tensor(0x100000, 0, &[4, 1024, 16, 128], &[2097152, 2048, 128, 1]),
                kk,
                cq,
                cq,
                ck,
                ck,
                oq,
                ok,
            ],
        ),
        (
            "cos of another shape",
            [
                q,
                kk,
                fake_tensor(0x300000, bf, &[4, 1024, 16, 64], &[65536, 64, 0, 1]),
                cq,
                ck,
                ck,
                oq,
                ok,
            ],
        ),
        ("k's cos not k's shape", [q, kk, cq, cq, cq, cq, oq, ok]),
        (
            "output rows overlapping",
            [
                q,
                kk,
                cq,
                cq,
                ck,
                ck,
                fake_tensor(0x400000, bf, &[4, 1024, 16, 128], &[2097152, 2048, 0, 1]),
                ok,
            ],
        ),
        (
            "no rows",
            [
                fake_tensor(0x100000, bf, &[0, 1024, 16, 128], &[2097152, 2048, 128, 1]),
                none,
                fake_tensor(0x300000, bf, &[0, 1024, 16, 128], &[131072, 128, 0, 1]),
                fake_tensor(0x300000, bf, &[0, 1024, 16, 128], &[131072, 128, 0, 1]),
                none,
                none,
                fake_tensor(0x400000, bf, &[0, 1024, 16, 128], &[2097152, 2048, 128, 1]),
                none,
            ],
        ),
    ];
    for (why, t) in refused {
        assert!(!can(t), "{why}");
    }
    assert!(
        !lib.can_implement(k, &op_args(&[q, kk, cq, cq, ck, ck, oq], &[])),
        "seven tensors"
    );
    assert!(
        !lib.can_implement(k, &op_args(&[q, kk, cq, cq, ck, ck, oq, ok], &[1.0])),
        "a scalar"
    );
    // f16 pairs of R = 6 read 4-byte vectors: rows 2 elements apart are fine, 1 apart not.
    let h = |addr: usize, s: i64, last: i64| {
        fake_tensor(addr, 2, &[1, 8, 4, last], &[s * 32, s * 4, s, 1])
    };
    let t = |s: i64| {
        [
            h(0x1000, s, 16),
            none,
            h(0x2000, 6, 6),
            h(0x3000, 6, 6),
            none,
            none,
            h(0x4000, 16, 16),
            none,
        ]
    };
    assert!(lib.can_implement(3, &op_args(&t(18), &[])));
    assert!(!lib.can_implement(3, &op_args(&t(17), &[])));
}

/// The fixture's two problems, each with its first candidate (rotaries.pt's; static_rotaries.pt's
/// q and k are the first).
pub fn test_table() -> (Table, [RotarySpec; 2]) {
    let qk = RotaryProblem {
        batch: 2,
        heads_q: 4,
        heads_k: 2,
        seq: 8,
        head_dim: 16,
        rotary_dim: 16,
        dtype: DType::F32,
        form: Form::Halves,
    };
    let v = RotaryProblem {
        heads_q: 4,
        heads_k: 0,
        rotary_dim: 8,
        form: Form::Pairs,
        ..qk.clone()
    };
    let specs = [first(&qk), first(&v)];
    let mut t = Table::new();
    for (p, s) in [qk, v].into_iter().zip(&specs) {
        // Under either policy a rotary's key is the dtype's own math.
        t.insert_merged(sample_op_entry(
            &Problem::from(p),
            &s.clone().into(),
            MathType::F32,
            0.002,
            "test table (not a measurement)",
        ));
    }
    (t, specs)
}

#[test]
fn a_table_hit_composes_fact_rotary_whose_fallback_replays_the_graph() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    let (table, specs) = test_table();
    table.save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json(&user, &fixture("rotaries.pt"), &out_dir);
    let patterns = v["compose"]["patterns"].as_array().unwrap();
    let rules: Vec<&str> = patterns
        .iter()
        .map(|p| p["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["rotary_halves_qk", "rotary_pairs"], "{v}");
    for (p, s) in patterns.iter().zip(&specs) {
        assert_eq!(
            (p["realization"]["how"].as_str(), p["kernel"].as_str()),
            (Some("hit"), Some(s.name().as_str())),
            "{p}"
        );
        assert_eq!(
            (p["kind"].as_str(), p["origin"].as_str()),
            (Some("rotary"), Some("rotary embedding"))
        );
    }
    let lib = out_dir.join("libfact_ops.so");
    let composed = out_dir.join("composed.pt");
    // FACT_DISABLE names the kind before the first call; fact_disable("") turns it on again, and
    // on CPU tensors the ops still fall back, saying why. Each time the outputs are the
    // original's, bit for bit, on positions other than the traced ones too.
    let script = format!(
        r#"
import ctypes, json, os
os.environ["FACT_DISABLE"] = "rotary"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert graph.count("fact::rotary_qk(") == 1 and graph.count("fact::rotary(") == 1, graph
for gone in ("aten::neg", "aten::stack", "aten::flatten"):
    assert gone not in graph, (gone, graph)
orig = torch.jit.load({orig:?})
{op_lib}
x = (torch.randn(2, 8, 64), torch.randn(2, 8, 32), torch.randn(2, 8, 64), torch.randint(0, 8192, (2, 8)))

def check():
    with torch.no_grad():
        got, want = m(*x), orig(*x)
    for g, w in zip(got, want):
        assert torch.equal(g, w), (g - w).abs().max()
        assert g.stride() == w.stride(), (g.stride(), w.stride())
    stats = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    return [stats[k] for k in {kernels:?}]

off = check()
why = "rotary is turned off (FACT_DISABLE or fact_disable)"
assert off == [{{"ran": 0, "copied": 0, "fell_back": 1, "why": why}}] * 2, off
assert so.fact_disable(b"") == 0
cpu = check()
why = "not CUDA tensors of one device"
assert cpu == [{{"ran": 0, "copied": 0, "fell_back": 1, "why": why}}] * 2, cpu
print("ok")
"#,
        lib = lib.display().to_string(),
        op_lib = crate::common::op_lib_python(&lib.display().to_string()),
        composed = composed.display().to_string(),
        orig = fixture("rotaries.pt").display().to_string(),
        kernels = specs.iter().map(|s| s.name()).collect::<Vec<_>>(),
    );
    assert_eq!(run_python(&script), "ok");
}
