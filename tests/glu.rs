//! The gated-MLP kind without a GPU: its fused and split kernels built by the pinned pip nvcc into
//! a library beside a GEMM, their can_implement taking the interleaved call and refusing what they
//! cannot take (host code, no device needed; the fused kernel's check reads CuTe's accumulator
//! layout for every thread, so it also proves each gate value's up value lies 8 rows below it in
//! the same thread); sm80's split kernel in an sm80 library; and a fixture composed from a test table: `fact::glu` in the graph, its
//! interleaved buffers in the module, its fallback computing what the replaced nodes did and
//! counted, with the reason, when the kind is off and on CPU tensors; and a GLU no kernel
//! realizes composed as the gate GEMM with its epilogue, as before the kind.
//! Fixtures: gated_mlps.pt (Llama's silu MLP without biases, and a tanh-GELU one with biases and
//! the product's operands swapped, off one x [2, 8, 64], I = 32); fused_gated_mlps.pt (the same
//! two as Phi-3 writes them: one linear over the stacked weights, chunked).

use crate::common::{
    build_all, compose_json, fake_tensor, fixture, op_args, run_python, sample_op_entry,
};
use fact::kinds::gemm::space::{KernelSchedule, TileScheduler};
use fact::kinds::glu::{candidates, Act, Form, GluProblem, GluSpec};
use fact::kinds::{Problem, Spec};
use fact::nvcc::library::FactTensor;
use fact::nvcc::Toolchain;
use fact::table::Table;
use fact::types::{Arch, DType, MathType};

fn first(p: &GluProblem, math: MathType, form: Form) -> GluSpec {
    candidates(p, math, Arch::Sm90)
        .into_iter()
        .find(|s| s.glu == form)
        .expect("a candidate of the form")
}

fn llama(act: Act, bias: bool) -> GluProblem {
    GluProblem {
        m: 4096,
        inter: 5632,
        k: 2048,
        dtype: DType::Bf16,
        act,
        bias,
    }
}

#[test]
fn glu_kernels_build_beside_a_gemm_and_refuse_what_they_cannot_take() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let fused = candidates(&llama(Act::Silu, false), MathType::Bf16, Arch::Sm90);
    let pingpong = fused
        .iter()
        .find(|s| s.glu == Form::Fused && s.gemm.schedule == KernelSchedule::WsPingpong)
        .expect("a ping-pong fused candidate")
        .clone();
    let specs = [
        first(&llama(Act::Silu, false), MathType::Bf16, Form::Fused),
        first(&llama(Act::Gelu, true), MathType::Bf16, Form::Split),
        pingpong,
    ];
    assert_eq!(
        specs[0].gemm.scheduler,
        TileScheduler::StreamK,
        "{}",
        specs[0].name()
    );
    let dir = tempfile::tempdir().unwrap();
    let mut all: Vec<Spec> = specs.iter().cloned().map(Spec::from).collect();
    all.push(crate::compile::good_spec().into());
    let built = build_all(&tc, &all, dir.path(), "libglu.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.len(), specs.len() + 1);
    for (i, s) in specs.iter().enumerate() {
        assert_eq!(
            (lib.name(i), lib.kind(i).as_deref()),
            (Some(s.name()), Some("glu"))
        );
    }
    assert_eq!(lib.kind(specs.len()).as_deref(), Some("gemm"));

    // x [4096, 2048], w [11264, 2048], out [4096, 5632], bf16.
    let (m, i, k) = (4096, 5632, 2048);
    let x = fake_tensor(0x10000, 1, &[m, k], &[k, 1]);
    let w = fake_tensor(0x20000, 1, &[2 * i, k], &[k, 1]);
    let b = fake_tensor(0x30000, 1, &[2 * i], &[1]);
    let out = fake_tensor(0x40000, 1, &[m, i], &[i, 1]);
    let none = fake_tensor(0, 0, &[], &[]);
    let can = |kernel: usize, t: &[FactTensor]| lib.can_implement(kernel, &op_args(t, &[]));
    assert!(
        can(0, &[x, w, none, out]),
        "the fused kernel takes the call"
    );
    assert!(can(2, &[x, w, none, out]), "so does the ping-pong one");
    assert!(
        can(1, &[x, w, b, out]),
        "the split kernel takes it with the bias"
    );
    assert!(
        !can(0, &[x, w, b, out]),
        "a bias the fused kernel does not add"
    );
    assert!(
        !can(1, &[x, w, none, out]),
        "no bias where the split kernel adds one"
    );
    let odd = 5636;
    let refused = [
        (
            "I no multiple of 8",
            [
                x,
                fake_tensor(0x20000, 1, &[2 * odd, k], &[k, 1]),
                none,
                fake_tensor(0x40000, 1, &[m, odd], &[odd, 1]),
            ],
        ),
        (
            "an output of the GEMM's width",
            [
                x,
                w,
                none,
                fake_tensor(0x40000, 1, &[m, 2 * i], &[2 * i, 1]),
            ],
        ),
        (
            "a misaligned x",
            [fake_tensor(0x10002, 1, &[m, k], &[k, 1]), w, none, out],
        ),
        (
            "a strided x",
            [fake_tensor(0x10000, 1, &[m, k], &[2 * k, 1]), w, none, out],
        ),
        (
            "another dtype",
            [fake_tensor(0x10000, 2, &[m, k], &[k, 1]), w, none, out],
        ),
        (
            "a weight of another K",
            [
                x,
                fake_tensor(0x20000, 1, &[2 * i, 1024], &[1024, 1]),
                none,
                out,
            ],
        ),
    ];
    for (why, t) in refused {
        assert!(!can(0, &t) && !can(2, &t), "fused: {why}");
        let mut with_bias = t;
        with_bias[2] = b;
        assert!(!can(1, &with_bias), "split: {why}");
    }
    assert!(!can(0, &[x, w, none]), "three tensors");
}

/// sm80 takes the split form alone: its GEMM kind kernel (an sm80 multistage one, built as sm_80
/// code) and the elementwise kernel build into an sm80 library of their own and take the call.
#[test]
fn the_sm80_split_kernel_builds_for_sm80() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let p = llama(Act::Silu, false);
    let spec = candidates(&p, MathType::Bf16, Arch::Sm80)
        .into_iter()
        .next()
        .expect("an sm80 candidate");
    assert_eq!((spec.glu, spec.gemm.arch), (Form::Split, Arch::Sm80));
    assert!(spec.name().ends_with("_for_sm80"), "{}", spec.name());
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(
        &tc,
        &[Spec::from(spec.clone())],
        dir.path(),
        "libglu80.so",
        2,
    );
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(
        (lib.name(0), lib.kind(0).as_deref()),
        (Some(spec.name()), Some("glu"))
    );
    let (m, i, k) = (p.m, p.inter, p.k);
    let t = [
        fake_tensor(0x10000, 1, &[m, k], &[k, 1]),
        fake_tensor(0x20000, 1, &[2 * i, k], &[k, 1]),
        fake_tensor(0, 0, &[], &[]),
        fake_tensor(0x40000, 1, &[m, i], &[i, 1]),
    ];
    assert!(lib.can_implement(0, &op_args(&t, &[])));
}

/// The fixture's two problems (x [2, 8, 64] is 16 rows, I = 32), under the default tf32 policy.
fn test_table() -> (Table, Vec<GluSpec>) {
    let p = |act: Act, bias: bool| GluProblem {
        m: 16,
        inter: 32,
        k: 64,
        dtype: DType::F32,
        act,
        bias,
    };
    let mut t = Table::new();
    let mut specs = Vec::new();
    for problem in [p(Act::Silu, false), p(Act::GeluTanh, true)] {
        let spec = first(&problem, MathType::Tf32, Form::Fused);
        t.insert_merged(sample_op_entry(
            &Problem::from(problem),
            &spec.clone().into(),
            MathType::Tf32,
            0.002,
            "test table (not a measurement)",
        ));
        specs.push(spec);
    }
    (t, specs)
}

/// Composes `fixture` (two GLUs off x [2, 8, 64]: silu without biases, tanh GELU with them)
/// with the test table and checks the composed module: both GLUs hit their kernels as
/// `fact::glu`, none of the ops in `gone` stays in the graph, `buffers` (Python over `params`,
/// the original's parameters, `buffers`, the composed module's, and `torch`) checks the
/// interleaved buffers, and the fallback computes the original's outputs exactly, counted with
/// its reason, with the kind off and on CPU tensors.
fn composes_fact_glu(fixture_name: &str, gone: &[&str], buffers: &str) {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    let (table, specs) = test_table();
    table.save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json(&user, &fixture(fixture_name), &out_dir);
    let patterns = v["compose"]["patterns"].as_array().unwrap();
    let rules: Vec<&str> = patterns
        .iter()
        .map(|p| p["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["glu_silu", "glu_gelu_tanh_bias"], "{patterns:?}");
    for (p, spec) in patterns.iter().zip(&specs) {
        assert_eq!(
            (p["realization"]["how"].as_str(), p["kernel"].as_str()),
            (Some("hit"), Some(spec.name().as_str())),
            "{p}"
        );
        assert_eq!(p["kind"], "glu");
    }
    let lib = out_dir.join("libfact_ops.so");
    let composed = out_dir.join("composed.pt");
    let script = format!(
        r#"
import ctypes, json, os
os.environ["FACT_DISABLE"] = "glu"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert graph.count("fact::glu(") == 2, graph
for op in {gone:?}:
    assert op not in graph, (op, graph)
orig = torch.jit.load({orig:?})
params = dict(orig.named_parameters())
buffers = dict(m.named_buffers())
{buffers}
assert len([b for b in buffers if b.startswith("fact_interleaved_")]) == 3, list(buffers)
{op_lib}
x = torch.randn(2, 8, 64)

def check():
    with torch.no_grad():
        got, want = m(x), orig(x)
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g, w), (g - w).abs().max()
    stats = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    return [stats[k] for k in {kernels:?}]

off = check()
assert off == [{{"ran": 0, "copied": 0, "fell_back": 1, "why": "glu is turned off (FACT_DISABLE or fact_disable)"}}] * 2, off
assert so.fact_disable(b"") == 0
cpu = check()
assert cpu == [{{"ran": 0, "copied": 0, "fell_back": 1, "why": "not CUDA tensors of one device"}}] * 2, cpu
print("ok")
"#,
        lib = lib.display().to_string(),
        op_lib = crate::common::op_lib_python(&lib.display().to_string()),
        composed = composed.display().to_string(),
        orig = fixture(fixture_name).display().to_string(),
        kernels = specs.iter().map(|s| s.name()).collect::<Vec<_>>(),
    );
    assert_eq!(run_python(&script), "ok");
}

#[test]
fn a_table_hit_composes_fact_glu_whose_fallback_is_the_graphs_ops() {
    composes_fact_glu(
        "gated_mlps.pt",
        &["aten::linear", "aten::silu", "aten::gelu", "aten::mul"],
        r#"
def interleaved(gate, up):
    blocks = [gate.shape[0] // 8, 1, 8] + list(gate.shape[1:])
    return torch.cat([gate.reshape(blocks), up.reshape(blocks)], 1).reshape([2 * gate.shape[0]] + list(gate.shape[1:]))

for g, u in (("gate.weight", "up.weight"), ("gate_b.weight", "up_b.weight"), ("gate_b.bias", "up_b.bias")):
    name = "fact_interleaved_" + g.replace(".", "_") + "_" + u.replace(".", "_")
    assert torch.equal(buffers[name], interleaved(params[g], params[u])), name
"#,
    );
}

/// Phi-3's form, one linear over the stacked gate and up weights chunked in two, is the same
/// problem: the same table entries compose it to `fact::glu` over the parameter's halves
/// interleaved, and the fallback replays the one linear and the chunk.
#[test]
fn a_fused_gate_up_linear_composes_fact_glu_over_its_halves() {
    composes_fact_glu(
        "fused_gated_mlps.pt",
        &[
            "aten::linear",
            "aten::chunk",
            "aten::silu",
            "aten::gelu",
            "aten::mul",
        ],
        r#"
def interleaved(t):
    gate, up = t.chunk(2, 0)
    blocks = [gate.shape[0] // 8, 1, 8] + list(gate.shape[1:])
    return torch.cat([gate.reshape(blocks), up.reshape(blocks)], 1).reshape(t.shape)

for p in ("gate_up.weight", "gate_up_b.weight", "gate_up_b.bias"):
    name = "fact_interleaved_" + p.replace(".", "_") + "_halves"
    assert torch.equal(buffers[name], interleaved(params[p])), name
"#,
    );
}

/// A GLU no kernel realizes (every candidate failed to build in a run the table holds) falls
/// back to what ran before the GLU kind: the gate GEMM with silu times up as its epilogue, up
/// left to torch as its leaf.
#[test]
fn a_glu_with_no_kernel_falls_back_to_the_gate_gemm_with_its_epilogue() {
    use fact::kinds::gemm::space::gemm_candidates;
    use fact::table::CandidateResult;
    use fact::tune::Outcome;
    let (g, _) = fact::torch::load_graph(&fixture("gated_mlps.pt"), &[]).unwrap();
    let glus = fact::kinds::glu::match_glus(&g);
    let silu = glus
        .iter()
        .find(|m| m.problem.act == Act::Silu)
        .expect("the silu GLU");
    let ep = silu.unfused.clone().expect("the gate's epilogue match");
    let ep_spec = gemm_candidates(&ep.problem, MathType::Tf32, Arch::Sm90).remove(0);
    assert!(ep_spec.fusion.is_some());
    let (mut table, _) = test_table();
    let mut entry = crate::common::sample_entry(&ep.problem, &ep_spec, 0.01, "test table");
    for s in candidates(&silu.problem, MathType::Tf32, Arch::Sm90) {
        entry.runs[0].candidates.push(CandidateResult {
            kernel: s.name(),
            spec: s.into(),
            outcome: Outcome::CompileFailed {
                log: "test: failed to build".into(),
            },
        });
    }
    table.insert_merged(entry);
    // The silu GLU's own entry is dropped: its problem is a miss whose candidates all failed.
    table
        .entries
        .retain(|e| !e.key.rule.starts_with("glu_silu"));
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    table.save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json(&user, &fixture("gated_mlps.pt"), &out_dir);
    let patterns = v["compose"]["patterns"].as_array().unwrap();
    let rules: Vec<&str> = patterns
        .iter()
        .map(|p| p["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules.len(), 2, "{rules:?}");
    assert!(rules.contains(&"glu_gelu_tanh_bias"), "{rules:?}");
    let fallback = patterns
        .iter()
        .find(|p| p["rule"] == ep.problem.rule_id())
        .unwrap_or_else(|| panic!("the gate's epilogue realized: {rules:?}"));
    assert_eq!(fallback["kernel"].as_str(), Some(ep_spec.name().as_str()));
    assert_eq!(fallback["kind"], "epilogue");
    assert!(
        v.to_string()
            .contains("the gated MLP as one GEMM is left to torch"),
        "compose's notes say what fell back"
    );
    let script = format!(
        r#"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert graph.count("fact::glu(") == 1 and graph.count("fact::gemm_ep(") == 1, graph
assert graph.count("aten::linear(") == 1 and "aten::silu" not in graph, graph
orig = torch.jit.load({orig:?})
x = torch.randn(2, 8, 64)
with torch.no_grad():
    for g, w in zip(m(x), orig(x)):
        assert torch.equal(g, w), (g - w).abs().max()
print("ok")
"#,
        lib = out_dir.join("libfact_ops.so").display().to_string(),
        composed = out_dir.join("composed.pt").display().to_string(),
        orig = fixture("gated_mlps.pt").display().to_string(),
    );
    assert_eq!(run_python(&script), "ok");
}
