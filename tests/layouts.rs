//! Operand layouts end to end without a GPU: transposed views traced into a model reach the rules
//! with their strides (layouts.pt: one GEMM per layout and broadcast form), kernels of the new
//! layouts compile with the pip nvcc, and a composed `a.t() @ b` (transposed.pt) keeps the view
//! feeding fact::gemm and computes the original's numbers when the op falls back on the CPU.

use crate::common::{build_all, compose_json, fact, fixture, run_python, sample_entry};
use fact::kinds::gemm::space::{
    EpilogueKind, Family, KernelSchedule, KernelSpec, Knowledge, TileScheduler,
};
use fact::kinds::gemm::{match_gemms, GemmLayout, GemmProblem};
use fact::nvcc::Toolchain;
use fact::table::Table;
use fact::torch;
use fact::types::{Arch, DType, MathType};

#[test]
fn traced_views_reach_the_rules_as_layouts() {
    let (g, _) = torch::load_graph(&fixture("layouts.pt"), &[]).unwrap();
    let m = match_gemms(&g);
    let got: Vec<(String, String, usize)> = m
        .iter()
        .map(|m| (m.problem.rule_id(), m.problem.shape_key(), m.copies.len()))
        .collect();
    let want = [
        ("gemm_crr", "32x16x64", 0),
        ("gemm_rcr", "32x16x64", 0),
        ("gemm_ccr", "32x16x64", 0),
        ("bmm_rcr", "8x32x16x64", 0),
        ("gemm_rrr", "96x16x64", 0),
        ("bmm_crr", "3x32x16x64", 0),
        ("bmm_rcr", "8x32x16x64", 1),
    ];
    assert_eq!(got, want.map(|(r, s, c)| (r.to_string(), s.to_string(), c)));
    assert!(
        m[6].copies[0]
            .starts_with("a f32[2, 4, 32, 64] with strides [8192, 64, 256, 1] fits no layout"),
        "{}",
        m[6].copies[0]
    );
}

#[test]
fn discover_says_which_operands_are_copied() {
    let out = fact()
        .args(["discover", "--json"])
        .arg(fixture("layouts.pt"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let patterns = v["plan"]["patterns"].as_array().unwrap();
    let copied: Vec<&serde_json::Value> = patterns
        .iter()
        .filter(|p| p.get("copies").is_some())
        .collect();
    assert_eq!(copied.len(), 1, "{patterns:?}");
    assert_eq!(copied[0]["rule"], "bmm_rcr");
    // tf32 ccr has sm80 kernels only (CUTLASS's sm90 tf32 "tt" writes a transposed output): the
    // plan says so rather than promising WGMMA.
    let ccr = patterns.iter().find(|p| p["rule"] == "gemm_ccr").unwrap();
    let notes: Vec<&str> = ccr["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("tensor cores: mma.sync"))
            && notes
                .iter()
                .any(|n| n.contains("no sm90 kernel for layout ccr")),
        "{notes:?}"
    );
    let text = fact()
        .args(["discover"])
        .arg(fixture("layouts.pt"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("layout ccr: a column-major, read in place, B column-major, read in place (CUTLASS \"tt\""), "{text}");
    assert!(
        text.contains("copy: a f32[2, 4, 32, 64] with strides"),
        "{text}"
    );
}

/// transposed.pt's problem: out[32,16] = a[64,32]ᵀ · b[64,16].
fn transposed_problem() -> GemmProblem {
    GemmProblem {
        m: 32,
        n: 16,
        k: 64,
        layout: GemmLayout::Crr,
        dtype: DType::F32,
        bias: false,
        batch: 1,
        epilogue: None,
        padded_from: None,
    }
}

/// A 128x128 persistent kernel of `family` for `p` (cooperative 1x2x1 with the TMA epilogue on sm90).
fn pick(p: &GemmProblem, family: Family) -> KernelSpec {
    let math = MathType::for_tensor(p.dtype, fact::types::Precision::Tf32).unwrap();
    Knowledge::shipped()
        .kernels(p, math, Arch::Sm90)
        .into_iter()
        .find(|k| {
            k.family == family
                && k.tile[..2] == [128, 128]
                && k.scheduler == TileScheduler::Persistent
                && (family == Family::Sm80Gemm
                    || (k.schedule == KernelSchedule::WsCooperative
                        && k.epilogue == EpilogueKind::Tma
                        && k.cluster == [1, 2, 1]))
        })
        .unwrap_or_else(|| panic!("a 128x128 {family:?} kernel for {}", p.rule_id()))
}

fn crr_spec() -> KernelSpec {
    pick(&transposed_problem(), Family::Sm90Gemm)
}

/// Both new layouts on both families: tf32 crr on WGMMA (through the register-staged mainloop),
/// bf16 ccr on WGMMA with a bias and a fused epilogue, and tf32 ccr on sm80 (CUTLASS instantiates
/// tf32 "tt" on sm90 only with a transposed epilogue).
#[test]
fn transposed_layouts_compile_into_one_library() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let epilogue = fact::kinds::gemm::Epilogue::parse("leaves=;v1=gelu(v0)").unwrap();
    let fused = GemmProblem {
        layout: GemmLayout::Ccr,
        dtype: DType::Bf16,
        bias: true,
        epilogue: Some(epilogue),
        ..transposed_problem()
    };
    let ccr_tf32 = GemmProblem {
        layout: GemmLayout::Ccr,
        ..transposed_problem()
    };
    let specs = [
        crr_spec(),
        pick(&fused, Family::Sm90Gemm),
        pick(&ccr_tf32, Family::Sm80Gemm),
    ];
    for (s, layout) in specs
        .iter()
        .zip(["_gemm_crr_tf32_", "_gemm_ccr_bf16_", "_gemm_ccr_tf32_"])
    {
        assert!(s.kernel_name().contains(layout), "{}", s.kernel_name());
    }
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(&tc, &specs, dir.path(), "libl.so", 3);
    let lib = crate::common::open_kernels(&built.library);
    for (i, s) in specs.iter().enumerate() {
        assert_eq!(lib.find(&s.name()), Some(i));
    }
}

/// The composed `a.t() @ b` passes the transposed view to fact::gemm (no copy in the graph); on
/// the CPU the op falls back to aten::matmul of the same view, so the numbers are the original's.
#[test]
fn a_composed_transposed_matmul_falls_back_on_cpu_with_the_original_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    let mut t = Table::new();
    t.insert_merged(sample_entry(
        &transposed_problem(),
        &crr_spec(),
        0.01,
        "test table (not a measurement)",
    ));
    t.save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json(&user, &fixture("transposed.pt"), &out_dir);
    let p = &v["compose"]["patterns"][0];
    assert_eq!(
        (p["rule"].as_str(), p["realization"]["how"].as_str()),
        (Some("gemm_crr"), Some("hit")),
        "{p}"
    );
    assert_eq!(p["kernel"], crr_spec().name());
    assert!(p.get("copies").is_none(), "{p}");

    let script = format!(
        r#"
import ctypes, json, torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert "fact::gemm" in graph and "aten::matmul" not in graph, graph
assert "aten::t(" in graph and "contiguous" not in graph, graph
orig = torch.jit.load({orig:?})
a, b = torch.randn(64, 32), torch.randn(64, 16)
with torch.no_grad():
    got, want = m(a, b), orig(a, b)
    # A call whose a is already packed [32, 64] (not the crr view) falls back the same way.
    other = torch.ops.fact.gemm(a.t().contiguous(), b, None, "matmul", {kernel:?})
assert torch.equal(got, want), (got - want).abs().max()
assert torch.equal(other, want), (other - want).abs().max()
{op_lib}
stats = json.loads(so.fact_op_stats())
assert stats == {{{kernel:?}: {{"ran": 0, "copied": 0, "fell_back": 2, "why": "not CUDA tensors of one device"}}}}, stats
print("ok", tuple(got.shape))
"#,
        lib = out_dir.join("libfact_ops.so").display().to_string(),
        op_lib =
            crate::common::op_lib_python(&out_dir.join("libfact_ops.so").display().to_string()),
        composed = out_dir.join("composed.pt").display().to_string(),
        orig = fixture("transposed.pt").display().to_string(),
        kernel = crr_spec().name(),
    );
    assert_eq!(run_python(&script), "ok (32, 16)");
}
