//! The residual add before a norm (`rules::residual`), a variant of the RMSNorm and LayerNorm
//! kinds, without a GPU: its kernels built by the pinned pip nvcc into one library beside the
//! plain norms and a GEMM, their can_implement taking the operands' rows through two strides
//! (a broadcast row of position embeddings) and refusing what they cannot take (host code, no
//! device needed); and modules composed from a test table: `fact::rmsnorm_add[_sum]` and
//! `fact::layernorm_add[_sum]` in the graph, the sum the graph reads again taken over by the op's
//! second output, their fallback computing bit for bit what the replaced add, casts and norm did,
//! counted with the reason, when the kind is off and on CPU tensors. Fixtures: traced here
//! (`SANDWICH`: Gemma's sandwich norms, an nn.RMSNorm of a sum nothing else reads, a Llama norm of
//! an fp32 residual stream cast to bf16; `EMBEDDINGS`: token plus broadcast position
//! embeddings before an affine LayerNorm, the sum and its norm added before a LayerNorm without
//! bias).

use crate::common::{build_all, compose_json, fake_tensor, op_args, run_python, sample_op_entry};
use fact::kinds::layernorm::{self, LayerNormProblem, LayerNormSpec};
use fact::kinds::rmsnorm::{self, RmsNormProblem, RmsNormSpec, Scale};
use fact::kinds::rows::RowReads;
use fact::kinds::{Problem, Spec};
use fact::nvcc::library::FactTensor;
use fact::nvcc::Toolchain;
use fact::rules::residual::Residual;
use fact::table::Table;
use fact::types::{Arch, DType, MathType};
use std::path::{Path, PathBuf};

/// An fp32 residual stream before a bf16 norm: fp32 plus bf16, the sum in fp32.
fn fp32_stream() -> Residual {
    Residual {
        a: DType::F32,
        b: DType::Bf16,
        sum: DType::F32,
        writes_sum: true,
    }
}

fn rms(rows: i64, cols: i64, scale: Scale, cast_first: bool, add: Residual) -> RmsNormProblem {
    RmsNormProblem::new(rows, cols, DType::Bf16, scale, cast_first).with_add(Some(add))
}

fn ln(rows: i64, cols: i64, dtype: DType, bias: bool, add: Residual) -> LayerNormProblem {
    LayerNormProblem {
        rows,
        cols,
        dtype,
        weight: true,
        bias,
        add: Some(add),
    }
}

#[test]
fn add_norm_kernels_build_beside_the_plain_norms_and_read_rows_through_two_strides() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let llama = rms(
        4096,
        2048,
        Scale::Weight,
        true,
        Residual::plain(DType::Bf16, true),
    );
    let rms_add = rmsnorm::candidates(&llama, Arch::Sm90).remove(0);
    // A vector of 8: the fp32 operand and sum take two 16-byte accesses per vector.
    let rms_mixed = rmsnorm::candidates(
        &rms(4096, 896, Scale::Weight, true, fp32_stream()),
        Arch::Sm90,
    )
    .into_iter()
    .find(|s| s.vector == 8)
    .unwrap();
    let bert = ln(
        16384,
        768,
        DType::Bf16,
        true,
        Residual::plain(DType::Bf16, false),
    );
    let ln_add = layernorm::candidates(&bert, Arch::Sm90).remove(0);
    let plain = rmsnorm::candidates(&llama.clone().with_add(None), Arch::Sm90).remove(0);
    assert_eq!(
        (rms_add.name(), ln_add.name()),
        (
            "rms_bf16_c2048_t128_v8_r1_add".to_string(),
            "ln_bf16_c768_t32_v8_r4_add".to_string()
        )
    );
    let mixed = rms_mixed.name();
    assert!(
        mixed.starts_with("rms_bf16_c896_")
            && mixed.contains("_v8_")
            && mixed.ends_with("_add_f32_bf16_f32"),
        "{mixed}"
    );
    // The norms' reads issued early, the operands streamed (RowReads), beside the others.
    let rms_streamed = RmsNormSpec {
        reads: RowReads::EarlyStreamed,
        ..rms_add.clone()
    };
    let ln_early = LayerNormSpec {
        reads: RowReads::EarlyStreamed,
        ..ln_add.clone()
    };

    let specs: Vec<Spec> = vec![
        rms_add.clone().into(),
        rms_mixed.clone().into(),
        ln_add.clone().into(),
        plain.clone().into(),
        crate::compile::good_spec().into(),
        rms_streamed.clone().into(),
        ln_early.clone().into(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(&tc, &specs, dir.path(), "libaddnorm.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    let kinds: Vec<Option<String>> = (0..lib.len()).map(|i| lib.kind(i)).collect();
    assert_eq!(
        kinds,
        [
            "rmsnorm",
            "rmsnorm",
            "layernorm",
            "rmsnorm",
            "gemm",
            "rmsnorm",
            "layernorm"
        ]
        .map(|k| Some(k.to_string()))
    );
    for (i, s) in specs.iter().enumerate() {
        assert_eq!(lib.name(i), Some(s.name()));
    }

    // Llama's add + norm: a, b [1, 4096, 2048] bf16, the sum and y [4096, 2048], the weight.
    let bf = |addr: usize, sizes: &[i64], strides: &[i64]| fake_tensor(addr, 1, sizes, strides);
    let f32t = |addr: usize, sizes: &[i64], strides: &[i64]| fake_tensor(addr, 0, sizes, strides);
    let none = fake_tensor(0, 0, &[], &[]);
    let a = bf(0x10000, &[1, 4096, 2048], &[0, 2048, 1]);
    let sum = bf(0x20000, &[4096, 2048], &[2048, 1]);
    let out = bf(0x30000, &[4096, 2048], &[2048, 1]);
    let w = bf(0x40000, &[2048], &[1]);
    let llama_scalars = [1e-6, 1.0, 1.0];
    let can =
        |k: usize, t: &[FactTensor], scalars: &[f64]| lib.can_implement(k, &op_args(t, scalars));
    assert!(can(0, &[a, a, sum, out, w], &llama_scalars));
    assert!(
        can(0, &[a, a, none, out, w], &llama_scalars),
        "no sum written"
    );
    assert!(
        can(
            0,
            &[a, bf(0x50000, &[32, 128, 2048], &[0, 2048, 1]), sum, out, w],
            &llama_scalars
        ),
        "b one sequence's rows for each of 32: [32, 128] rows, stride 0 over the batch"
    );
    let refused: [(&str, [FactTensor; 5]); 7] = [
        (
            "the plain kernel's x",
            [bf(0x10000, &[4096, 2048], &[2048, 1]), a, sum, out, w],
        ),
        (
            "rows of a that do not cover the output's",
            [bf(0x10000, &[1, 4095, 2048], &[0, 2048, 1]), a, sum, out, w],
        ),
        (
            "a row stride that splits a vector",
            [
                bf(0x10000, &[2, 2048, 2048], &[2048 * 2052, 2052, 1]),
                a,
                sum,
                out,
                w,
            ],
        ),
        (
            "a misaligned b",
            [a, bf(0x10008, &[1, 4096, 2048], &[0, 2048, 1]), sum, out, w],
        ),
        (
            "a sum of another dtype",
            [a, a, f32t(0x20000, &[4096, 2048], &[2048, 1]), out, w],
        ),
        (
            "rows of the sum overlapping",
            [a, a, bf(0x20000, &[4096, 2048], &[0, 1]), out, w],
        ),
        (
            "another C",
            [bf(0x10000, &[1, 4096, 1024], &[0, 1024, 1]), a, sum, out, w],
        ),
    ];
    // Reading early changes no host check: the streamed kernel (5) takes and refuses the same.
    assert!(can(5, &[a, a, sum, out, w], &llama_scalars));
    for (why, t) in refused {
        assert!(!can(0, &t, &llama_scalars), "{why}");
        assert!(!can(5, &t, &llama_scalars), "{why}, read early");
    }
    assert!(!can(0, &[a, a, out, w], &llama_scalars), "four tensors");

    // The fp32 stream: a fp32 (two 16-byte accesses per vector of 8), b bf16, the sum fp32.
    let q = |addr: usize, dtype: i32, rank3: bool| {
        if rank3 {
            fake_tensor(addr, dtype, &[1, 4096, 896], &[0, 896, 1])
        } else {
            fake_tensor(addr, dtype, &[4096, 896], &[896, 1])
        }
    };
    let qw = bf(0x40000, &[896], &[1]);
    let mixed = [
        q(0x10000, 0, true),
        q(0x20000, 1, true),
        q(0x30000, 0, false),
        q(0x40000, 1, false),
        qw,
    ];
    assert!(can(1, &mixed, &llama_scalars));
    let mut swapped = mixed;
    swapped.swap(0, 1);
    assert!(
        !can(1, &swapped, &llama_scalars),
        "operands in the kernel's dtype order"
    );
    let mut misaligned = mixed;
    misaligned[0] = fake_tensor(0x10020 + 8, 0, &[1, 4096, 896], &[0, 896, 1]);
    assert!(
        !can(1, &misaligned, &llama_scalars),
        "fp32 a aligned to its 16-byte accesses"
    );

    // BERT's embeddings: [32, 512] sequences of word (+ type) rows plus one sequence of position
    // rows for all, no sum, weight and bias.
    let words = bf(0x10000, &[1, 16384, 768], &[0, 768, 1]);
    let positions = bf(0x20000, &[32, 512, 768], &[0, 768, 1]);
    let y = bf(0x30000, &[16384, 768], &[768, 1]);
    let p = |addr: usize| bf(addr, &[768], &[1]);
    assert!(can(
        2,
        &[words, positions, none, y, p(0x40000), p(0x50000)],
        &[1e-12]
    ));
    assert!(can(
        2,
        &[
            words,
            positions,
            bf(0x60000, &[16384, 768], &[768, 1]),
            y,
            p(0x40000),
            none
        ],
        &[1e-12]
    ));
    assert!(
        !can(2, &[words, positions, none, y, p(0x40000)], &[1e-12]),
        "five tensors"
    );
    assert!(
        !can(
            2,
            &[
                words,
                bf(0x20000, &[32, 511, 768], &[0, 768, 1]),
                none,
                y,
                p(0x40000),
                p(0x50000)
            ],
            &[1e-12]
        ),
        "position rows that do not cover the output's"
    );
}

/// Traces `script` (which saves its module to sys.argv[1]) into `dir/name`.
fn trace(dir: &Path, name: &str, script: &str) -> PathBuf {
    let path = dir.join(name);
    let text = format!(
        "import sys\nsys.argv = ['trace', {:?}]\n{script}\nprint('ok')",
        path.display().to_string()
    );
    assert_eq!(run_python(&text), "ok");
    path
}

/// Gemma's sandwich norms (the post-attention norm of h, the residual add, the pre-feedforward
/// norm of the sum, the sum read again), nn.RMSNorm of a sum nothing else reads, and a Llama norm
/// of an fp32 residual stream (fp32 position rows plus the bf16 stream) cast to bf16, the fp32
/// sum read again. bf16, [4, 8, 64].
const SANDWICH: &str = r#"
import torch

class Llama(torch.nn.Module):
    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(c) * 0.5 + 1)
        self.eps = eps
    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

class Gemma(torch.nn.Module):
    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(c) * 0.5)
        self.eps = eps
    def forward(self, x):
        h = x.float()
        out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)

class Sandwich(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.post = Gemma(64)
        self.pre = Gemma(64)
        self.final = torch.nn.RMSNorm(64, eps=1e-5)
        self.last = Llama(64)
    def forward(self, x, h, r32):
        a = self.post(h)
        s = x + a
        y = self.pre(s)
        z = self.final(s + y)
        u = r32 + z
        w = self.last(u.to(torch.bfloat16))
        return a, y, z, w, u * 2

torch.manual_seed(0)
m = Sandwich().eval()
with torch.no_grad():
    m.final.weight.copy_(torch.randn(64) * 0.5 + 1)
m = m.to(torch.bfloat16)
bf = lambda *s: torch.randn(*s).to(torch.bfloat16)
with torch.no_grad():
    torch.jit.trace(m, (bf(4, 8, 64), bf(4, 8, 64), torch.randn(1, 8, 64))).save(sys.argv[1])
"#;

/// Token embeddings plus one sequence of position embeddings (broadcast over the batch), an
/// affine LayerNorm of the sum, and the sum plus that norm before a LayerNorm without bias. fp32,
/// [4, 8, 64].
const EMBEDDINGS: &str = r#"
import torch

class Embeddings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(64)
        self.ln2 = torch.nn.LayerNorm(64, bias=False)
    def forward(self, tokens, positions):
        e = tokens + positions
        y = self.ln1(e)
        return y, self.ln2(e + y)

torch.manual_seed(0)
m = Embeddings().eval()
with torch.no_grad():
    for ln in (m.ln1, m.ln2):
        ln.weight.copy_(torch.randn(64) * 0.5 + 1)
    m.ln1.bias.copy_(torch.randn(64))
    torch.jit.trace(m, (torch.randn(4, 8, 64), torch.randn(1, 8, 64))).save(sys.argv[1])
"#;

/// A test table holding `problems`, each with its first candidate, and those kernels' names.
fn table_of(problems: Vec<(Problem, Spec, MathType)>) -> Table {
    let mut t = Table::new();
    for (p, s, math) in problems {
        t.insert_merged(sample_op_entry(
            &p,
            &s,
            math,
            0.002,
            "test table (not a measurement)",
        ));
    }
    t
}

/// Composes `model` from `table` and runs `check` (Python, with `lib`, `m`, `orig` and `so` set)
/// twice: with the norms' kind turned off before the first call, then on CPU tensors.
fn compose_and_check(dir: &Path, model: &Path, table: Table, check: &str) -> serde_json::Value {
    let user = dir.join("table.json");
    table.save(&user).unwrap();
    let out_dir = dir.join("out");
    let v = compose_json(&user, model, &out_dir);
    let script = format!(
        r#"
import ctypes, json, os, torch
lib = {lib:?}
torch.ops.load_library(lib)
m = torch.jit.load({composed:?})
orig = torch.jit.load({orig:?})
{op_lib}
graph = str(m.forward.graph)

def run(inputs):
    with torch.no_grad():
        got, want = m(*inputs), orig(*inputs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), (g.float() - w.float()).abs().max()
    stats = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    return stats
{check}
print("ok")
"#,
        lib = out_dir.join("libfact_ops.so").display().to_string(),
        op_lib =
            crate::common::op_lib_python(&out_dir.join("libfact_ops.so").display().to_string()),
        composed = out_dir.join("composed.pt").display().to_string(),
        orig = model.display().to_string(),
    );
    assert_eq!(run_python(&script), "ok");
    v
}

fn rules_of(v: &serde_json::Value) -> Vec<String> {
    v["compose"]["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["rule"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn sandwich_norms_compose_fact_rmsnorm_add_whose_fallback_replays_the_add_and_the_norm() {
    let dir = tempfile::tempdir().unwrap();
    let model = trace(dir.path(), "sandwich.pt", SANDWICH);
    let problems = [
        RmsNormProblem::new(32, 64, DType::Bf16, Scale::WeightPlusOne, false),
        rms(
            32,
            64,
            Scale::WeightPlusOne,
            false,
            Residual::plain(DType::Bf16, true),
        ),
        rms(
            32,
            64,
            Scale::Weight,
            false,
            Residual::plain(DType::Bf16, false),
        ),
        rms(32, 64, Scale::Weight, true, fp32_stream()),
    ];
    let specs: Vec<_> = problems
        .iter()
        .map(|p| rmsnorm::candidates(p, Arch::Sm90).remove(0))
        .collect();
    let table = table_of(
        problems
            .iter()
            .zip(&specs)
            .map(|(p, s)| (p.clone().into(), s.clone().into(), MathType::Bf16))
            .collect(),
    );
    let check = format!(
        r#"
assert graph.count("fact::rmsnorm(") == 1 and graph.count("fact::rmsnorm_add(") == 1, graph
assert graph.count("fact::rmsnorm_add_sum(") == 2 and "aten::rms_norm" not in graph, graph
assert graph.count("aten::rsqrt") == 0 and graph.count("aten::add(") == 0, graph
torch.manual_seed(1)
bf = lambda *s: (torch.randn(*s) * 10 + 3).to(torch.bfloat16)
inputs = (bf(4, 8, 64), bf(4, 8, 64), torch.randn(1, 8, 64) * 10)
assert so.fact_disable(b"rmsnorm") == 0
off = run(inputs)
why = "rmsnorm is turned off (FACT_DISABLE or fact_disable)"
assert off == {{{plain:?}: {{"ran": 0, "copied": 0, "fell_back": 1, "why": why}},
               {add:?}: {{"ran": 0, "copied": 0, "fell_back": 2, "why": why}},
               {mixed:?}: {{"ran": 0, "copied": 0, "fell_back": 1, "why": why}}}}, off
assert so.fact_disable(b"") == 0
cpu = run(inputs)
assert all(c["fell_back"] > 0 and c["why"] == "not CUDA tensors of one device" for c in cpu.values()), cpu
"#,
        plain = specs[0].name(),
        add = specs[1].name(),
        mixed = specs[3].name(),
    );
    assert_eq!(specs[1], specs[2], "one kernel for both bf16 adds");
    let v = compose_and_check(dir.path(), &model, table, &check);
    assert_eq!(
        rules_of(&v),
        [
            "rmsnorm_weight1p",
            "add_rmsnorm_weight1p_sum",
            "add_rmsnorm_weight",
            "add_f32_bf16_f32_rmsnorm_cast_weight_sum"
        ]
    );
    let origins: Vec<&str> = v["compose"]["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["origin"].as_str().unwrap())
        .collect();
    assert_eq!(
        origins,
        [
            "rmsnorm (written out)",
            "add + rmsnorm (written out)",
            "add + rms_norm",
            "add + rmsnorm (written out)"
        ]
    );
}

#[test]
fn embeddings_compose_fact_layernorm_add_whose_fallback_replays_the_add_and_layer_norm() {
    let dir = tempfile::tempdir().unwrap();
    let model = trace(dir.path(), "embeddings.pt", EMBEDDINGS);
    let problems = [
        ln(32, 64, DType::F32, true, Residual::plain(DType::F32, true)),
        ln(
            32,
            64,
            DType::F32,
            false,
            Residual::plain(DType::F32, false),
        ),
    ];
    let spec = layernorm::candidates(&problems[0], Arch::Sm90).remove(0);
    assert!(spec.fits(&problems[1]), "one kernel for both");
    let table = table_of(
        problems
            .iter()
            .map(|p| (p.clone().into(), spec.clone().into(), MathType::F32))
            .collect(),
    );
    let check = format!(
        r#"
assert graph.count("fact::layernorm_add_sum(") == 1 and graph.count("fact::layernorm_add(") == 1, graph
assert "aten::layer_norm" not in graph and "aten::add(" not in graph, graph
torch.manual_seed(1)
inputs = (torch.randn(4, 8, 64) * 10 + 3, torch.randn(1, 8, 64))
assert so.fact_disable(b"layernorm") == 0
off = run(inputs)
assert off == {{{kernel:?}: {{"ran": 0, "copied": 0, "fell_back": 2, "why": "layernorm is turned off (FACT_DISABLE or fact_disable)"}}}}, off
assert so.fact_disable(b"") == 0
cpu = run(inputs)
assert cpu == {{{kernel:?}: {{"ran": 0, "copied": 0, "fell_back": 2, "why": "not CUDA tensors of one device"}}}}, cpu
"#,
        kernel = spec.name(),
    );
    let v = compose_and_check(dir.path(), &model, table, &check);
    assert_eq!(
        rules_of(&v),
        ["add_layernorm_affine_sum", "add_layernorm_weight"]
    );
}
