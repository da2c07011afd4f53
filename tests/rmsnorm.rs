//! The RMSNorm kind without a GPU: its kernels built by the pinned pip nvcc into a library beside a
//! GEMM and a LayerNorm, their can_implement refusing what they cannot take (host code, no device
//! needed), and a module composed from a test table: `fact::rmsnorm` in the graph for each
//! spelling, its fallback computing bit for bit what the replaced ops did, counted with the reason,
//! when the kind is off and on CPU tensors. Fixture: traced here (`NORMS`), bf16: Llama's norm
//! (cast before the weight), Gemma's (one plus the weight), nn.RMSNorm with and without its weight,
//! and a norm whose fp32 result is kept (no pattern).

use crate::common::{build_all, compose_json, fake_tensor, op_args, run_python, sample_op_entry};
use fact::kinds::layernorm::{self, LayerNormProblem};
use fact::kinds::rmsnorm::{candidates, RmsNormProblem, RmsNormSpec, Scale};
use fact::kinds::rows::RowReads;
use fact::kinds::{Problem, Spec};
use fact::nvcc::library::FactTensor;
use fact::nvcc::Toolchain;
use fact::table::Table;
use fact::types::{Arch, DType, MathType};
use std::path::Path;

fn problem(rows: i64, cols: i64, dtype: DType) -> RmsNormProblem {
    RmsNormProblem::new(rows, cols, dtype, Scale::Weight, true)
}

fn first(p: &RmsNormProblem, pick: impl Fn(&RmsNormSpec) -> bool) -> RmsNormSpec {
    candidates(p, Arch::Sm90)
        .into_iter()
        .find(pick)
        .expect("a candidate")
}

/// Every shape of the template: Llama's row of 2048 over four warps (shared-memory sums) and
/// over two, Qwen2's 896 whole and ragged, eight threads per row of f32, f16, and a C of 8192;
/// each compiles, beside a GEMM and a LayerNorm, into one library whose dispatch table lists them.
#[test]
fn rmsnorm_kernels_build_beside_a_gemm_and_a_layernorm_and_refuse_what_they_cannot_take() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let llama = problem(4096, 2048, DType::Bf16);
    let qwen = problem(4096, 896, DType::Bf16);
    let specs = [
        first(&llama, |s| s.threads == 128 && s.vector == 8),
        first(&llama, |s| s.threads == 64),
        first(&qwen, |_| true),
        first(&qwen, |s| s.ragged()),
        first(&problem(32, 64, DType::F32), |s| s.threads == 8),
        first(&problem(4096, 2048, DType::F16), |_| true),
        first(&problem(1024, 8192, DType::F32), |_| true),
        // Its reads early, x streamed, on the ragged tail.
        first(&qwen, |s| s.ragged() && s.reads == RowReads::EarlyStreamed),
    ];
    assert!(specs[3].ragged() && !specs[2].ragged());
    let dir = tempfile::tempdir().unwrap();
    let mut all: Vec<Spec> = specs.iter().cloned().map(Spec::from).collect();
    let ln = LayerNormProblem {
        rows: 4096,
        cols: 2048,
        dtype: DType::Bf16,
        weight: true,
        bias: true,
        add: None,
    };
    all.push(layernorm::candidates(&ln, Arch::Sm90).remove(0).into());
    all.push(crate::compile::good_spec().into());
    let built = build_all(&tc, &all, dir.path(), "librms.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.len(), specs.len() + 2);
    for (i, s) in specs.iter().enumerate() {
        assert_eq!(
            (lib.name(i), lib.kind(i).as_deref()),
            (Some(s.name()), Some("rmsnorm"))
        );
    }
    assert_eq!(lib.kind(specs.len()).as_deref(), Some("layernorm"));
    assert_eq!(lib.kind(specs.len() + 1).as_deref(), Some("gemm"));

    // rms_bf16_c2048_t128_v8_r1: x and out [4096, 2048] bf16, weight [2048].
    let k = 0;
    assert_eq!(specs[k].name(), "rms_bf16_c2048_t128_v8_r1");
    let bf = |addr: usize, sizes: &[i64], strides: &[i64]| fake_tensor(addr, 1, sizes, strides);
    let x = bf(0x10000, &[4096, 2048], &[2048, 1]);
    let out = bf(0x20000, &[4096, 2048], &[2048, 1]);
    let w = bf(0x30000, &[2048], &[1]);
    let none = fake_tensor(0, 0, &[], &[]);
    let can = |t: &[FactTensor], scalars: &[f64]| lib.can_implement(k, &op_args(t, scalars));
    // (eps, scale, cast_first): Llama's, the weight rounded once, one plus the weight, none.
    for scalars in [[1e-6, 1.0, 1.0], [1e-6, 1.0, 0.0], [1e-6, 2.0, 0.0]] {
        assert!(can(&[x, out, w], &scalars), "{scalars:?}");
    }
    assert!(can(&[x, out, none], &[1e-6, 0.0, 0.0]), "no weight");
    assert!(
        can(
            &[bf(0x10000, &[4096, 2048], &[4096, 1]), out, w],
            &[1e-6, 1.0, 1.0]
        ),
        "rows of x a stride apart"
    );
    let refused: [(&str, [FactTensor; 3], [f64; 3]); 9] = [
        (
            "another C",
            [
                bf(0x10000, &[4096, 1024], &[1024, 1]),
                bf(0x20000, &[4096, 1024], &[1024, 1]),
                none,
            ],
            [1e-6, 0.0, 0.0],
        ),
        (
            "a misaligned x",
            [bf(0x10008, &[4096, 2048], &[2048, 1]), out, w],
            [1e-6, 1.0, 1.0],
        ),
        (
            "a row stride that splits a vector",
            [bf(0x10000, &[4096, 2048], &[2052, 1]), out, w],
            [1e-6, 1.0, 1.0],
        ),
        (
            "another dtype",
            [fake_tensor(0x10000, 2, &[4096, 2048], &[2048, 1]), out, w],
            [1e-6, 1.0, 1.0],
        ),
        (
            "rows of the output overlapping",
            [x, bf(0x20000, &[4096, 2048], &[0, 1]), w],
            [1e-6, 1.0, 1.0],
        ),
        (
            "a weight of another C",
            [x, out, bf(0x30000, &[1024], &[1])],
            [1e-6, 1.0, 1.0],
        ),
        (
            "a weight the scale does not use",
            [x, out, w],
            [1e-6, 0.0, 0.0],
        ),
        (
            "a scale without its weight",
            [x, out, none],
            [1e-6, 1.0, 0.0],
        ),
        (
            "a cast before one plus the weight",
            [x, out, w],
            [1e-6, 2.0, 1.0],
        ),
    ];
    for (why, t, scalars) in refused {
        assert!(!can(&t, &scalars), "{why}");
    }
    assert!(!can(&[x, out, w], &[1e-6, 1.0]), "two scalars");
    assert!(!can(&[x, out], &[1e-6, 0.0, 0.0]), "two tensors");
    // The ragged 896 takes rows whose last load leaves threads idle.
    let q = |addr: usize| bf(addr, &[4096, 896], &[896, 1]);
    assert!(lib.can_implement(
        3,
        &op_args(
            &[q(0x10000), q(0x20000), bf(0x30000, &[896], &[1])],
            &[1e-6, 1.0, 1.0]
        )
    ));
}

/// An sm80 library (A100, and H100 through its PTX) builds the same template.
#[test]
fn an_sm80_library_builds_an_rmsnorm_kernel() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let spec = candidates(&problem(4096, 2048, DType::Bf16), Arch::Sm80).remove(0);
    assert_eq!(spec.name(), "rms_bf16_c2048_t128_v8_r1_for_sm80");
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(
        &tc,
        std::slice::from_ref(&spec),
        dir.path(),
        "librms80.so",
        1,
    );
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(
        (lib.name(0), lib.kind(0).as_deref()),
        (Some(spec.name()), Some("rmsnorm"))
    );
}

/// The fixture, traced here with the venv's torch: each norm feeds the next, and the last one
/// keeps its fp32 result.
const NORMS: &str = r#"
import sys, torch

class Llama(torch.nn.Module):
    # LlamaRMSNorm's forward as transformers writes it: the cast back before the weight.
    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(c) * 0.5 + 1)
        self.eps = eps
    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(dtype)

class Gemma(torch.nn.Module):
    # Gemma's: the weight an offset from one, in fp32, one cast back.
    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(c) * 0.5)
        self.eps = eps
    def forward(self, x):
        h = x.float()
        out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)

class Norms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.llama = Llama(64)
        self.gemma = Gemma(64)
        self.rms = torch.nn.RMSNorm(64, eps=1e-5)
        self.bare = torch.nn.RMSNorm(64, elementwise_affine=False)
    def forward(self, x):
        a = self.llama(x)
        b = self.gemma(a)
        c = self.rms(b)
        d = self.bare(c)
        f = c.float()
        e = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)
        return a, b, c, d, e

torch.manual_seed(0)
m = Norms().eval()
with torch.no_grad():
    m.rms.weight.copy_(torch.randn(64) * 0.5 + 1)
m = m.to(torch.bfloat16)
with torch.no_grad():
    torch.jit.trace(m, (torch.randn(4, 8, 64).to(torch.bfloat16),)).save(sys.argv[1])
"#;

fn trace_norms(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("norms.pt");
    let script = format!(
        "import sys\nsys.argv = ['norms', {:?}]\n{NORMS}\nprint('ok')",
        path.display().to_string()
    );
    assert_eq!(run_python(&script), "ok");
    path
}

/// The fixture's four problems (32 rows of 64, bf16), one kernel for all.
fn test_table() -> (Table, RmsNormSpec) {
    let p = |scale, cast_first| RmsNormProblem::new(32, 64, DType::Bf16, scale, cast_first);
    let problems = [
        p(Scale::Weight, true),
        p(Scale::WeightPlusOne, false),
        p(Scale::Weight, false),
        p(Scale::None, false),
    ];
    let spec = candidates(&problems[0], Arch::Sm90).remove(0);
    let mut t = Table::new();
    for problem in problems {
        t.insert_merged(sample_op_entry(
            &Problem::from(problem),
            &spec.clone().into(),
            MathType::Bf16,
            0.002,
            "test table (not a measurement)",
        ));
    }
    (t, spec)
}

#[test]
fn a_table_hit_composes_fact_rmsnorm_whose_fallback_replays_the_replaced_ops() {
    let dir = tempfile::tempdir().unwrap();
    let model = trace_norms(dir.path());
    let user = dir.path().join("table.json");
    let (table, spec) = test_table();
    table.save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json(&user, &model, &out_dir);
    let patterns = v["compose"]["patterns"].as_array().unwrap();
    let rules: Vec<&str> = patterns
        .iter()
        .map(|p| p["rule"].as_str().unwrap())
        .collect();
    assert_eq!(
        rules,
        [
            "rmsnorm_cast_weight",
            "rmsnorm_weight1p",
            "rmsnorm_weight",
            "rmsnorm"
        ],
        "the norm kept in fp32 is no pattern"
    );
    for p in patterns {
        assert_eq!(
            (p["realization"]["how"].as_str(), p["kernel"].as_str()),
            (Some("hit"), Some(spec.name().as_str())),
            "{p}"
        );
        assert_eq!(p["kind"], "rmsnorm");
    }
    let origins: Vec<&str> = patterns
        .iter()
        .map(|p| p["origin"].as_str().unwrap())
        .collect();
    assert_eq!(
        origins,
        [
            "rmsnorm (written out)",
            "rmsnorm (written out)",
            "rms_norm",
            "rms_norm"
        ]
    );
    let lib = out_dir.join("libfact_ops.so");
    let composed = out_dir.join("composed.pt");
    // FACT_DISABLE names the kind before the first call; fact_disable("") turns it on again, and
    // on CPU tensors the op still falls back, saying why. Each time every output is the
    // original's, bit for bit.
    let script = format!(
        r#"
import ctypes, json, os
os.environ["FACT_DISABLE"] = "rmsnorm"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert graph.count("fact::rmsnorm(") == 4 and "aten::rms_norm" not in graph, graph
assert graph.count("aten::rsqrt(") == 1 and "aten::type_as" not in graph, graph
orig = torch.jit.load({orig:?})
{op_lib}
torch.manual_seed(1)
x = (torch.randn(4, 8, 64) * 10 + 3).to(torch.bfloat16)

def check():
    with torch.no_grad():
        got, want = m(x), orig(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), (g.float() - w.float()).abs().max()
    stats = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    return stats[{kernel:?}]

off = check()
assert off == {{"ran": 0, "copied": 0, "fell_back": 4, "why": "rmsnorm is turned off (FACT_DISABLE or fact_disable)"}}, off
assert so.fact_disable(b"") == 0
cpu = check()
assert cpu == {{"ran": 0, "copied": 0, "fell_back": 4, "why": "not CUDA tensors of one device"}}, cpu
print("ok")
"#,
        lib = lib.display().to_string(),
        op_lib = crate::common::op_lib_python(&lib.display().to_string()),
        composed = composed.display().to_string(),
        orig = model.display().to_string(),
        kernel = spec.name(),
    );
    assert_eq!(run_python(&script), "ok");
}
