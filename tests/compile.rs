//! The GPU-free half of the GPU path: CUTLASS sources rendered, compiled by the pinned pip nvcc and
//! linked into a kernel library; the composed module rewritten to call fact::gemm and loaded from
//! Python with the README's two lines.

use crate::common::{
    build_all, build_options, compose_json, fact, fixture, run_python, sample_entry,
};
use fact::kinds::gemm::space::{
    EpilogueKind, Family, KernelSchedule, KernelSpec, Knobs, Knowledge, TileScheduler,
};
use fact::kinds::gemm::{GemmLayout, GemmProblem};
use fact::nvcc::{self, Toolchain};
use fact::table::Table;
use fact::types::{Arch, DType, MathType};

/// The linear fixture's problem: out[32,128] = x[32,64] · w[128,64]ᵀ + b.
fn linear_problem() -> GemmProblem {
    GemmProblem {
        m: 32,
        n: 128,
        k: 64,
        layout: GemmLayout::Rcr,
        dtype: DType::F32,
        bias: true,
        batch: 1,
        epilogue: None,
        padded_from: None,
    }
}

pub(crate) fn good_spec() -> KernelSpec {
    Knowledge::shipped()
        .kernels(&linear_problem(), MathType::Tf32, Arch::Sm90)
        .into_iter()
        .find(|k| {
            k.tile == [128, 128, 32]
                && k.cluster == [1, 2, 1]
                && k.schedule == KernelSchedule::WsCooperative
                && k.scheduler == TileScheduler::Persistent
                && k.epilogue == EpilogueKind::Tma
        })
        .expect("a 128x128 cooperative candidate")
}

/// An fp32-accurate (3xTF32) sm80-family kernel for the same problem.
pub(crate) fn accurate_spec() -> KernelSpec {
    Knowledge::shipped()
        .kernels(&linear_problem(), MathType::Tf32x3, Arch::Sm90)
        .into_iter()
        .find(|k| {
            k.family == Family::Sm80Gemm
                && k.tile == [64, 64, 32]
                && k.scheduler == TileScheduler::Persistent
        })
        .expect("a 64x64 3xTF32 candidate")
}

#[test]
fn library_compiles_and_a_failing_kernel_costs_only_itself() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let mut bad = good_spec();
    // Cooperative kernels need tile M of 128 or more: CUTLASS static_asserts, nvcc fails.
    bad.tile = [64, 128, 32];
    assert!(
        bad.invalid_reason().is_some(),
        "the validity rules know this one"
    );
    let split = accurate_spec().with_knobs(Knobs {
        splits: 2,
        ..Knobs::default()
    });
    let dir = tempfile::tempdir().unwrap();
    // Two jobs: the uncached kernels go into two translation units; a unit holding the bad kernel
    // fails and is bisected, so the others still make it (the 3xTF32 one with both variants).
    let variants = [good_spec(), accurate_spec(), bad.clone(), split.clone()];
    let built =
        nvcc::build_library(&tc, &variants, "libt.so", &build_options(dir.path(), 2)).unwrap();

    assert_eq!(
        built.kernels,
        vec![
            good_spec().into(),
            accurate_spec().into(),
            split.clone().into()
        ]
    );
    assert_eq!(built.failures.len(), 1);
    let f = &built.failures[0];
    assert_eq!(f.kernel, bad.name());
    assert!(
        f.source.is_file(),
        "the failing kernel's own .cu stays on disk"
    );
    assert!(
        f.command.contains("nvcc") && f.command.contains("sm_90a"),
        "{}",
        f.command
    );
    assert!(f.log.contains("error"), "{}", f.log);
    assert!(f.to_string().contains("\n    "), "the log is indented");

    let again = tempfile::tempdir().unwrap();
    // A library of `specs` in `again`, taking one linked from the same objects as it is where
    // `reuse_linked` says so (a sweep library's build).
    let build = |specs: &[KernelSpec], reuse_linked: bool| {
        let opts = nvcc::BuildOptions {
            reuse_linked,
            ..build_options(again.path(), 2)
        };
        nvcc::build_library(&tc, specs, "libt.so", &opts).unwrap()
    };
    let rebuilt = build(&[good_spec()], false);
    assert_eq!(
        (rebuilt.compiled, rebuilt.cached),
        (0, 1),
        "a kernel compiles once, whatever the output folder"
    );
    // A library linked from the same objects is taken as it is (not linked again: the same
    // file); one of other kernels is linked, and so is the first set again after it.
    use std::os::unix::fs::MetadataExt;
    let inode = |p: &std::path::Path| std::fs::metadata(p).unwrap().ino();
    let stamp = again.path().join(".libt.so.inputs");
    // (Each library's inode read as it is built: they share one path.) Linked once with its
    // stamp, then taken as it is.
    let first = inode(&build(&[good_spec()], true).library);
    assert_eq!(
        inode(&build(&[good_spec()], true).library),
        first,
        "linked again from the same objects"
    );
    let other = build(&[good_spec(), accurate_spec()], true);
    let other_inode = inode(&other.library);
    assert_ne!(other_inode, first);
    assert_eq!(crate::common::open_kernels(&other.library).len(), 2);
    let back = inode(&build(&[good_spec()], true).library);
    assert_ne!(back, other_inode, "a stamp of other objects");
    // Without its stamp (a link stopped midway) the library is linked again.
    std::fs::remove_file(&stamp).unwrap();
    let relinked = inode(&build(&[good_spec()], true).library);
    assert_ne!(relinked, back);
    // A build that does not reuse (a composed output's library) links anew and leaves no stamp.
    assert_ne!(inode(&build(&[good_spec()], false).library), relinked);
    assert!(!stamp.exists());

    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.len(), 3);
    assert_eq!(lib.name(0).unwrap(), good_spec().name());
    assert_eq!(
        lib.find(&split.name()),
        Some(2),
        "knob variants are dispatch entries of their kernel"
    );
    assert_eq!(lib.find(&bad.name()), None);
    let generated = std::fs::read_to_string(
        dir.path()
            .join("src")
            .join(format!("{}.cu", good_spec().name())),
    )
    .unwrap();
    assert!(
        generated.contains(&good_spec().to_json()),
        "the source carries its spec"
    );
}

/// A 128x128 cooperative kernel of split `family` for the linear problem in `layout`, no bias.
pub(crate) fn split_spec(layout: GemmLayout, family: Family) -> KernelSpec {
    let p = GemmProblem {
        layout,
        bias: false,
        ..linear_problem()
    };
    Knowledge::shipped()
        .kernels(&p, MathType::Tf32x3, Arch::Sm90)
        .into_iter()
        .find(|k| {
            k.family == family
                && k.tile[..2] == [128, 128]
                && k.schedule == KernelSchedule::WsCooperative
                && k.scheduler == TileScheduler::Persistent
                && k.epilogue == EpilogueKind::Tma
                && k.invalid_reason().is_none()
        })
        .expect("a 128x128 cooperative split kernel")
}

/// The fp32-accurate split families on WGMMA: the tf32 split of an rrr problem (transposing b into
/// K-major parts) and the bf16 split of an rcr one, each with its second, 2K-deep GEMM.
#[test]
fn split_families_compile_into_one_library() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let x3 = split_spec(GemmLayout::Rrr, Family::Sm90GemmX3);
    let b3 = split_spec(GemmLayout::Rcr, Family::Sm90GemmBf16x3);
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(&tc, &[x3.clone(), b3.clone()], dir.path(), "libs.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(
        (lib.find(&x3.name()), lib.find(&b3.name())),
        (Some(0), Some(1))
    );
}

/// An epilogue over every leaf kind: a residual (the C operand), a bias-like row vector, a column
/// vector and a scalar, as a DAG (v0 is read twice).
pub(crate) const EVERY_LEAF: &str = "leaves=full,row,col,scalar;v1=gelu_tanh(v0);v2=mul(v1,l1);v3=sigmoid(v0);v4=mul(v2,v3);v5=add(v4,l2);v6=div(v5,l3);v7=add(l0,v6)";

/// A 128x128 cooperative sm90 kernel for the linear problem in `dtype` (with its bias) fused with
/// EVERY_LEAF.
pub(crate) fn fused_spec(dtype: DType) -> KernelSpec {
    let p = GemmProblem {
        dtype,
        epilogue: Some(fact::kinds::gemm::Epilogue::parse(EVERY_LEAF).unwrap()),
        ..linear_problem()
    };
    let math = MathType::for_tensor(dtype, fact::types::Precision::Tf32).unwrap();
    Knowledge::shipped()
        .kernels(&p, math, Arch::Sm90)
        .into_iter()
        .find(|k| {
            k.tile[..2] == [128, 128]
                && k.schedule == KernelSchedule::WsCooperative
                && k.scheduler == TileScheduler::Persistent
        })
        .expect("a 128x128 cooperative kernel with the epilogue")
}

/// Epilogue fusion through sm90 visitor trees: EVERY_LEAF in fp32 and bf16 compiles into one
/// library whose dispatch entries carry their programs.
#[test]
fn fused_epilogues_compile_into_one_library() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let program = EVERY_LEAF;
    let epilogue = fact::kinds::gemm::Epilogue::parse(program).unwrap();
    let (f32k, bf16k) = (fused_spec(DType::F32), fused_spec(DType::Bf16));
    assert!(f32k.fits(&GemmProblem {
        epilogue: Some(epilogue.clone()),
        ..linear_problem()
    }));
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(
        &tc,
        &[f32k.clone(), bf16k.clone()],
        dir.path(),
        "libe.so",
        2,
    );
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(
        (lib.find(&f32k.name()), lib.find(&bf16k.name())),
        (Some(0), Some(1))
    );
    assert_eq!(lib.epilogue(0).as_deref(), Some(program));
}

/// Full-size leaves through aux loads: a tf32 kernel reading one residual as its C operand and a
/// second through an aux load, and a bf16-split kernel (f32-accurate) whose second GEMM reads its
/// first's result as C and the residual through an aux load, compile into one library (the
/// goldens tests/golden/*_ep_aux.cu are these kernels).
#[test]
fn aux_load_epilogues_compile_into_one_library() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let pick = |family: Family, math: MathType, program: &str| {
        let epilogue = fact::kinds::gemm::Epilogue::parse(program).unwrap();
        let p = GemmProblem {
            m: 65536,
            n: 768,
            k: 768,
            epilogue: Some(epilogue),
            ..linear_problem()
        };
        Knowledge::shipped()
            .kernels(&p, math, Arch::Sm90)
            .into_iter()
            .find(|k| {
                k.family == family
                    && k.tile[..2] == [128, 128]
                    && k.schedule == KernelSchedule::WsCooperative
                    && k.scheduler == TileScheduler::Persistent
                    && k.cluster == [1, 2, 1]
            })
            .expect("a 128x128 cooperative kernel with the epilogue")
    };
    let two = pick(
        Family::Sm90Gemm,
        MathType::Tf32,
        "leaves=full,full;v1=add(v0,l0);v2=add(v1,l1)",
    );
    let split = pick(
        Family::Sm90GemmBf16x3,
        MathType::Tf32x3,
        "leaves=full;v1=add(l0,v0)",
    );
    assert_eq!((two.aux_loads(), split.aux_loads()), (1, 1));
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(
        &tc,
        &[two.clone(), split.clone()],
        dir.path(),
        "libaux.so",
        2,
    );
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(
        (lib.find(&two.name()), lib.find(&split.name())),
        (Some(0), Some(1))
    );
    assert_eq!(
        lib.epilogue(1).as_deref(),
        Some("leaves=full;v1=add(l0,v0)")
    );
}

/// Two residuals after one linear compose into one fused pattern (a tf32 kernel reading one as C,
/// the other through an aux load, compiled); a residual after a linear whose rows are no 16-byte
/// vectors has no TMA kernel, so an sm80 visitor tree of its alignment fuses it (the residual
/// through an aux load). Fixture: residuals.pt.
#[test]
fn two_residuals_fuse_and_a_ragged_residual_fuses_on_sm80() {
    let dir = tempfile::tempdir().unwrap();
    let out = fact()
        .env("FACT_TABLE", dir.path().join("table.json"))
        .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"))
        .args(["compose", "--json", "--candidates", "1", "--out"])
        .arg(dir.path().join("out"))
        .arg(fixture("residuals.pt"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["compose"];
    let patterns = c["patterns"].as_array().unwrap();
    let mut rules: Vec<&str> = patterns
        .iter()
        .map(|p| p["rule"].as_str().unwrap())
        .collect();
    rules.sort();
    assert_eq!(rules.len(), 2, "{c}");
    assert!(
        rules[0].starts_with("gemm_rcr_bias_ep_add_")
            && !rules[0].starts_with("gemm_rcr_bias_ep_add_add_"),
        "{c}"
    );
    assert!(rules[1].starts_with("gemm_rcr_bias_ep_add_add_"), "{c}");
    assert!(
        patterns
            .iter()
            .all(|p| p["realization"]["how"] == "compiled"),
        "{c}"
    );
    // The ragged pattern's sweep compiled an sm80 kernel of alignment 2 with the residual.
    let ragged: Vec<String> = std::fs::read_dir(dir.path().join("out/sweeps"))
        .unwrap()
        .flatten()
        .filter(|d| d.file_name().to_string_lossy().ends_with("_32x30x64"))
        .flat_map(|d| std::fs::read_dir(d.path().join("src")).unwrap().flatten())
        .map(|f| f.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cu"))
        .collect();
    assert!(
        !ragged.is_empty()
            && ragged.iter().all(|n| n.starts_with("sm80_gemm_")
                && n.contains("_ep_add_")
                && n.ends_with("_align2.cu")),
        "{ragged:?}"
    );
    let notes = c["agent_notes"].as_array().unwrap();
    assert!(
        !notes
            .iter()
            .filter_map(|n| n.as_str())
            .any(|n| n.contains("the fused epilogue is left to torch")),
        "{notes:?}"
    );
}

/// A fused pattern no kernel realizes (here the user table has learned that every kernel of it
/// fails to compile) falls back to its GEMM alone, and compose says why. Fixture: linear_ep.pt.
#[test]
fn a_fused_pattern_without_a_kernel_falls_back_to_its_gemm() {
    use fact::space::validity::{FailureKind, Rule, Scope};
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let dir = tempfile::tempdir().unwrap();
    let fused = GemmProblem {
        epilogue: Some(
            fact::kinds::gemm::Epilogue::parse(
                "leaves=full;v1=gelu_tanh(v0);v2=mul(v1,0.5);v3=add(l0,v2)",
            )
            .unwrap(),
        ),
        ..linear_problem()
    };
    let mut t = Table::new();
    t.rules.push(Rule {
        scope: Scope {
            arch: "sm90".into(),
            dtype: "f32".into(),
            math: MathType::Tf32x3,
            rule: fused.rule_id(),
            cutlass: tc.cutlass_version(),
            shape: None,
        },
        kind: FailureKind::Compile,
        predicate: Default::default(),
        count: 2,
        example: "error: test rule (no kernel of this pattern compiles)".into(),
        kernels: vec![],
    });
    let user = dir.path().join("table.json");
    t.save(&user).unwrap();
    let out = fact()
        .env("FACT_TABLE", &user)
        .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"))
        .args([
            "compose",
            "--json",
            "--arch",
            "sm90",
            "--precision",
            "f32",
            "--candidates",
            "1",
            "--out",
        ])
        .arg(dir.path().join("out"))
        .arg(fixture("linear_ep.pt"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["compose"];
    assert_eq!(c["patterns"][0]["rule"], "gemm_rcr_bias", "{c}");
    assert_eq!(c["patterns"][0]["realization"]["how"], "compiled", "{c}");
    let notes = c["agent_notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n
            .as_str()
            .unwrap()
            .contains("the fused epilogue is left to torch")),
        "{notes:?}"
    );
}

pub(crate) fn table_with(spec: &KernelSpec) -> Table {
    let mut t = Table::new();
    t.insert_merged(sample_entry(
        &linear_problem(),
        spec,
        0.01,
        "test table (not a measurement)",
    ));
    t
}

#[test]
fn table_hit_composes_a_module_that_calls_the_op_and_loads_in_python() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    table_with(&good_spec()).save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json(&user, &fixture("linear.pt"), &out_dir);
    let p = &v["compose"]["patterns"][0];
    assert_eq!(p["realization"]["how"], "hit");
    assert_eq!(p["realization"]["table"], "user");
    assert_eq!(p["kernel"], good_spec().name());
    assert!(!out_dir.join("sweeps").exists(), "a hit compiles no sweep");
    // Without --json and with stderr not a terminal, each stage says what it does on one line.
    let plain = fact()
        .env("FACT_TABLE", &user)
        .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"))
        .args(["compose", "--out"])
        .arg(dir.path().join("plain"))
        .arg(fixture("linear.pt"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(plain.status.success(), "{err}");
    assert!(
        err.contains("pattern p0: gemm_rcr_bias 32x128x64") && err.contains("compiling 1 kernels"),
        "{err}"
    );
    let lib = out_dir.join("libfact_ops.so");
    let composed = out_dir.join("composed.pt");
    assert!(lib.is_file() && composed.is_file());

    // The README's two lines, then the composed module against the original (on CPU the op falls
    // back to aten::linear, so the numbers must match exactly).
    let script = format!(
        r#"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert "fact::gemm" in graph and "aten::linear" not in graph, graph
orig = torch.jit.load({orig:?})
x = torch.randn(32, 64)
with torch.no_grad():
    a, b = m(x), orig(x)
assert torch.equal(a, b), (a - b).abs().max()
# The op counts what ran: on CPU tensors the one call fell back to aten::linear.
import ctypes, json
{op_lib}
stats = json.loads(so.fact_op_stats())
assert stats == {{{kernel:?}: {{"ran": 0, "copied": 0, "fell_back": 1, "why": "not CUDA tensors of one device"}}}}, stats
so.fact_op_stats_reset()
assert json.loads(so.fact_op_stats()) == {{}}
# Pattern kinds turn off by name (fact bench's ablations); a name that is no kind changes nothing.
assert so.fact_disable(b"gemm,attention") == 0 and so.fact_disable(b"epilogue,bogus") == -1
assert so.fact_disable(b"") == 0
with torch.no_grad():
    assert torch.equal(m(x), b)
print("ok", tuple(a.shape))
"#,
        lib = lib.display().to_string(),
        op_lib = crate::common::op_lib_python(&lib.display().to_string()),
        composed = composed.display().to_string(),
        orig = fixture("linear.pt").display().to_string(),
        kernel = good_spec().name(),
    );
    assert_eq!(run_python(&script), "ok (32, 128)");
}

/// Attention kernels of both fp32 maths' policies and bf16, built by nvcc next to a GEMM: one
/// dispatch table lists them in the order given, each with its kind, and a library mixing the two
/// fp32 maths is refused.
#[test]
fn attention_kernels_build_beside_gemms_in_one_library() {
    use fact::kinds::attention::candidates;
    use fact::kinds::attention::AttentionOrigin;
    use fact::kinds::attention::AttentionProblem;
    use fact::kinds::Spec;
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let p = |dtype: DType| AttentionProblem {
        origin: AttentionOrigin::Explicit,
        batch: 2,
        heads: 8,
        seq_q: 512,
        seq_k: 512,
        head_dim: 96,
        dtype,
        causal: true,
        kv_heads: None,
        padded: false,
        masked: false,
        bias: None,
        mask_strided: false,
    };
    let tf32 = candidates(&p(DType::F32), MathType::Tf32, Arch::Sm90).remove(0);
    let bf16 = candidates(&p(DType::Bf16), MathType::Bf16, Arch::Sm90)
        .into_iter()
        .find(|a| a.name().starts_with("sm80_"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = vec![tf32.clone().into(), good_spec().into(), bf16.clone().into()];
    let built = build_all(&tc, &specs, dir.path(), "liba.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.len(), 3);
    assert_eq!(lib.find(&good_spec().name()), Some(1));
    assert_eq!(
        (lib.name(0), lib.name(2)),
        (Some(tf32.name()), Some(bf16.name()))
    );
    assert_eq!(
        (0..3).map(|i| lib.kind(i).unwrap()).collect::<Vec<_>>(),
        ["attention", "gemm", "attention"]
    );
    let source =
        std::fs::read_to_string(dir.path().join("src").join(format!("{}.cu", tf32.name())))
            .unwrap();
    assert!(
        source.contains("using Operator = cutlass::arch::OpMultiplyAdd;"),
        "the tf32 policy's kernel multiplies once"
    );

    let x3 = candidates(&p(DType::F32), MathType::Tf32x3, Arch::Sm90).remove(0);
    let mixed: Vec<Spec> = vec![tf32.into(), x3.into()];
    let err =
        nvcc::build_library(&tc, &mixed, "libm.so", &build_options(dir.path(), 2)).unwrap_err();
    assert!(
        err.to_string().contains("one library per precision policy"),
        "{err}"
    );
}

/// Ragged shapes (every contiguous dim odd): an sm90 cp.async warp-specialized tf32 kernel (the
/// register-staged one CUTLASS builds for torch's rrr), and the padded tf32 and bf16 splits of
/// f32-accurate, compile into one library.
#[test]
fn ragged_kernels_compile_into_one_library() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let p = GemmProblem {
        m: 4099,
        n: 5003,
        k: 3001,
        layout: GemmLayout::Rrr,
        dtype: DType::F32,
        bias: false,
        batch: 1,
        epilogue: None,
        padded_from: None,
    };
    let pick = |math: MathType, family: Family, schedule: KernelSchedule| {
        Knowledge::shipped()
            .kernels(&p, math, Arch::Sm90)
            .into_iter()
            .find(|k| {
                k.family == family
                    && k.schedule == schedule
                    && k.tile[..2] == [128, 128]
                    && k.scheduler == TileScheduler::Persistent
                    && k.invalid_reason().is_none()
            })
            .expect("a ragged 128x128 kernel")
    };
    let cp = pick(
        MathType::Tf32,
        Family::Sm90Gemm,
        KernelSchedule::CpAsyncWsCooperative,
    );
    let x3 = pick(
        MathType::Tf32x3,
        Family::Sm90GemmX3,
        KernelSchedule::WsCooperative,
    );
    let b3 = pick(
        MathType::Tf32x3,
        Family::Sm90GemmBf16x3,
        KernelSchedule::WsCooperative,
    );
    assert!(cp.kernel_name().ends_with("_align1") && x3.is_padded_split() && b3.is_padded_split());
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(
        &tc,
        &[cp.clone(), x3.clone(), b3.clone()],
        dir.path(),
        "libr.so",
        2,
    );
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(
        (
            lib.find(&cp.name()),
            lib.find(&x3.name()),
            lib.find(&b3.name())
        ),
        (Some(0), Some(1), Some(2))
    );
}

/// CUTLASS's sm90 attention (examples/88) through the attention kind's sm90_fmha.cu.hbs, built
/// by nvcc into one library with an sm80 attention kernel (each family in its own units, with its example's
/// headers): fact's paired tile order under the causal mask with the overlapped loop and four Q
/// stages; a key-length kernel on one CTA per tile (BERT's padded encoder, examples/88's loads of q
/// and k/v together); and a causal key-length kernel at head dim 80 (the 96 tile) for a padded,
/// grouped-query decoder. Then, without a GPU, every kernel's can_implement (host code) against
/// the six-tensor call of include/fact_kernels.h: grouped heads read in place where the kernel
/// can (every sm80 kernel, sm90's persistent schedules), key lengths where it takes them (every
/// sm80 kernel, sm90's `_klen` ones and only those), the mask a capture gives beside them (sm90's
/// `_klen` kernels without the causal mask), and any other call refused.
#[test]
fn sm90_attention_kernels_build_into_a_library_and_take_grouped_heads_and_key_lengths() {
    use crate::common::{fake_tensor, op_args};
    use fact::kinds::attention::candidates;
    use fact::kinds::attention::AttentionOrigin;
    use fact::kinds::attention::AttentionProblem;
    use fact::kinds::Spec;
    use fact::nvcc::library::FactTensor;
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let p = |d: i64, causal: bool, padded: bool, kv_heads: Option<i64>| AttentionProblem {
        origin: AttentionOrigin::Sdpa,
        batch: 2,
        heads: 8,
        seq_q: 512,
        seq_k: 512,
        head_dim: d,
        dtype: DType::Bf16,
        causal,
        kv_heads,
        padded,
        masked: false,
        bias: None,
        mask_strided: false,
    };
    let named = |c: Vec<fact::kinds::attention::AttentionSpec>, name: &str| {
        c.into_iter()
            .find(|a| a.name() == name)
            .unwrap_or_else(|| panic!("{name} is a candidate"))
    };
    let causal = named(
        candidates(&p(96, true, false, None), MathType::Bf16, Arch::Sm90),
        "sm90_fmha_bf16_bf16_q128_k128_d96_pair_ovl_pq_causal",
    );
    let sm80 = candidates(&p(96, true, false, None), MathType::Bf16, Arch::Sm90)
        .into_iter()
        .find(|a| a.name().starts_with("sm80_"))
        .unwrap();
    let padded = named(
        candidates(&p(64, false, true, None), MathType::Bf16, Arch::Sm90),
        "sm90_fmha_bf16_bf16_q128_k128_d64_coop_full_klen",
    );
    let grouped_padded = named(
        candidates(&p(80, true, true, Some(2)), MathType::Bf16, Arch::Sm90),
        "sm90_fmha_bf16_bf16_q128_k128_d96_pair_ovl_pq_causal_klen",
    );
    let with_bias = AttentionProblem {
        causal: false,
        bias: Some(fact::kinds::attention::AttentionBias::Batched),
        ..p(96, false, false, None)
    };
    let biased = candidates(&with_bias, MathType::Bf16, Arch::Sm90).remove(0);
    assert!(biased.name().starts_with("sm80_") && biased.name().ends_with("_bias"));
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = vec![
        causal.clone().into(),
        sm80.clone().into(),
        padded.clone().into(),
        grouped_padded.clone().into(),
        biased.clone().into(),
    ];
    let built = build_all(&tc, &specs, dir.path(), "libfmha90.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(
        (0..lib.len())
            .map(|i| lib.name(i).unwrap())
            .collect::<Vec<_>>(),
        specs.iter().map(Spec::name).collect::<Vec<_>>()
    );

    const BF16: i32 = 1;
    const F32: i32 = 0;
    const I32: i32 = 3;
    // q and out as views of [B,T,Hq,D] (a projection's), k and v contiguous [B,Hkv,T,D]; the
    // factor absent; the lengths int32 [B] when `lengths`; no bias.
    let call = |hkv: i64, d: i64, lengths: bool| -> Vec<FactTensor> {
        let (b, h, t) = (2, 8, 512);
        let bthd = [t * h * d, d, h * d, 1];
        let kv = [hkv * t * d, t * d, d, 1];
        vec![
            fake_tensor(0x100000, BF16, &[b, h, t, d], &bthd),
            fake_tensor(0x200000, BF16, &[b, hkv, t, d], &kv),
            fake_tensor(0x300000, BF16, &[b, hkv, t, d], &kv),
            fake_tensor(0x400000, BF16, &[b, h, t, d], &bthd),
            fake_tensor(0, F32, &[], &[]),
            if lengths {
                fake_tensor(0x500000, I32, &[b], &[1])
            } else {
                fake_tensor(0, I32, &[], &[])
            },
            fake_tensor(0, BF16, &[], &[]),
        ]
    };
    let can = |index: usize, t: &[FactTensor], causal: bool| {
        let scalars = [0.125, if causal { 1.0 } else { 0.0 }, 1.0];
        lib.can_implement(index, &op_args(t, &scalars))
    };

    // sm80: grouped heads and key lengths are arguments of every kernel.
    for (hkv, lengths) in [(8, false), (2, false), (8, true), (1, true)] {
        assert!(
            can(1, &call(hkv, 96, lengths), true),
            "sm80 Hkv {hkv} lengths {lengths}"
        );
    }
    assert!(
        !can(1, &call(3, 96, false), true),
        "3 k/v heads do not divide 8"
    );
    assert!(
        !can(1, &call(2, 96, true)[..5], true),
        "the five-tensor call of ABI v5"
    );
    assert!(
        !can(1, &call(2, 96, true)[..6], true),
        "the six-tensor call before the bias"
    );
    assert!(!can(1, &call(2, 96, true)[..4], true));
    let mut f32_lengths = call(2, 96, true);
    f32_lengths[5].dtype = F32;
    assert!(!can(1, &f32_lengths, true), "lengths are int32");
    let mut short = call(2, 96, true);
    short[5].sizes[0] = 1;
    assert!(!can(1, &short, true), "one length per sequence");
    let mut factor = call(2, 96, true);
    factor[4] = fake_tensor(0x600000, F32, &[1], &[1]);
    assert!(
        can(1, &factor, true),
        "a device factor beside grouped heads and lengths"
    );

    // sm90, persistent, no lengths: grouped heads yes, lengths no, and the mask it was built for.
    assert!(can(0, &call(8, 96, false), true) && can(0, &call(2, 96, false), true));
    assert!(
        !can(0, &call(2, 96, true), true),
        "an unpadded kernel refuses lengths"
    );
    assert!(
        !can(0, &call(2, 96, false), false),
        "a causal kernel refuses the full mask"
    );
    assert!(!can(0, &call(3, 96, false), true));

    // sm90, one CTA per tile, key lengths: lengths required, grouped heads refused.
    assert!(can(2, &call(8, 64, true), false));
    assert!(
        !can(2, &call(8, 64, false), false),
        "a padded kernel needs its lengths"
    );
    assert!(
        !can(2, &call(2, 64, true), false),
        "q and k/v load from one coordinate here"
    );
    assert!(!can(2, &call(8, 64, true), true));
    // Under capture the op gives the mask beside the lengths (or alone): [B,H,Tq,Tk], keys at
    // unit stride, bool or of q's dtype (an added one needs a positive scale known on the host).
    const BOOL: i32 = 4;
    let masked = |lengths: bool, dtype: i32, strides: &[i64]| {
        let mut c = call(8, 64, lengths);
        c[6] = fake_tensor(0x700000, dtype, &[2, 8, 512, 512], strides);
        c
    };
    let per_query = [512 * 512, 0, 512, 1];
    assert!(
        can(2, &masked(true, BOOL, &per_query), false),
        "a bool mask beside the lengths"
    );
    assert!(
        can(2, &masked(false, BOOL, &per_query), false),
        "a bool mask alone"
    );
    assert!(
        can(2, &masked(true, BF16, &[512, 0, 0, 1]), false),
        "an added mask of q's dtype, one row of keys per sequence"
    );
    assert!(
        !can(2, &masked(true, F32, &per_query), false),
        "an added mask of another dtype"
    );
    assert!(
        !can(
            2,
            &masked(true, BOOL, &[2 * 512 * 512, 0, 2 * 512, 2]),
            false
        ),
        "keys not at unit stride"
    );
    let mut factored = masked(true, BF16, &per_query);
    factored[4] = fake_tensor(0x600000, F32, &[1], &[1]);
    assert!(
        !can(2, &factored, false),
        "an added mask under a scale the kernel reads on the device"
    );
    let mut narrow = masked(true, BOOL, &per_query);
    narrow[6].sizes[2] = 256;
    assert!(!can(2, &narrow, false), "a mask of other sizes");

    // sm90, persistent, causal with key lengths, head dim 80 in the 96 tile, grouped.
    assert!(can(3, &call(2, 80, true), true) && can(3, &call(8, 80, true), true));
    assert!(!can(3, &call(2, 80, false), true));
    assert!(!can(3, &call(2, 104, true), true), "past the 96 tile");
    // A mask to a kernel that does not read one: the causal key-length kernel (its fusion would
    // mask on top of it), one without lengths, and sm80's without a bias.
    let mut causal_masked = call(2, 80, true);
    causal_masked[6] = fake_tensor(0x700000, BOOL, &[2, 8, 512, 512], &per_query);
    assert!(!can(3, &causal_masked, true));
    let mut unpadded_masked = call(8, 96, false);
    unpadded_masked[6] = fake_tensor(0x700000, BOOL, &[2, 8, 512, 512], &per_query);
    assert!(!can(0, &unpadded_masked, true) && !can(1, &unpadded_masked, true));

    // The bias kernel: a bias [B,H,Tq,Tk] of q's dtype, read through its strides (0 where it is
    // broadcast), rows and steps whole 16-byte vectors apart; the others refuse one.
    let (b, h, t) = (2i64, 8i64, 512i64);
    let bias = |strides: &[i64], addr: usize| {
        let mut c = call(8, 96, false);
        c[6] = fake_tensor(addr, BF16, &[b, h, t, t], strides);
        c
    };
    let full = [h * t * t, t * t, t, 1];
    assert!(
        can(4, &bias(&full, 0x700000), false),
        "one bias per sequence"
    );
    assert!(
        can(4, &bias(&[0, t * t, t, 1], 0x700000), false),
        "shared by the sequences"
    );
    assert!(
        can(4, &bias(&[0, 0, 0, 1], 0x700000), false),
        "one row for all (ALiBi-like)"
    );
    assert!(
        !can(4, &call(8, 96, false), false),
        "a bias kernel needs its bias"
    );
    // T5's: the bias beside key lengths (the padding class of SDPA's where) and the causal flag.
    let mut with_lengths = bias(&[0, t * t, t, 1], 0x700000);
    with_lengths[5] = fake_tensor(0x500000, I32, &[b], &[1]);
    assert!(can(4, &with_lengths, false) && can(4, &with_lengths, true));
    assert!(
        !can(4, &bias(&[h * t * 51, t * 51, 51, 1], 0x700000), false),
        "rows 51 apart"
    );
    assert!(
        !can(4, &bias(&full, 0x700008), false),
        "a start off 16 bytes"
    );
    // One bias per window, [B/W, W, H, Tq, Tk] (Swin's shifted windows): W = 2 divides B = 2.
    let mut windows = call(8, 96, false);
    windows[6] = fake_tensor(
        0x700000,
        BF16,
        &[1, 2, h, t, t],
        &[0, h * t * t, t * t, t, 1],
    );
    assert!(can(4, &windows, false), "one bias per window");
    windows[6].sizes[1] = 4;
    assert!(
        !can(4, &windows, false),
        "4 windows of 1 sequence are not the batch of 2"
    );
    let mut f32_bias = bias(&full, 0x700000);
    f32_bias[6].dtype = F32;
    assert!(!can(4, &f32_bias, false), "the bias is q's dtype");
    // The sm90 causal kernel and sm80's plain one take this call without the bias (above).
    for plain in [0, 1] {
        assert!(
            !can(plain, &bias(&full, 0x700000), true),
            "kernel {plain} adds no bias"
        );
    }
}

/// The fused GEMM of linear_ep.pt: out = r + gelu_tanh(x·wᵀ + b)·0.5.
fn linear_ep_problem() -> GemmProblem {
    let e = fact::kinds::gemm::Epilogue::parse(
        "leaves=full;v1=gelu_tanh(v0);v2=mul(v1,0.5);v3=add(l0,v2)",
    )
    .unwrap();
    GemmProblem {
        epilogue: Some(e),
        ..linear_problem()
    }
}

/// An sm80 build without a GPU: a plain GEMM, EVT GEMMs (linear_ep's bias + gelu + residual, and
/// every leaf kind in bf16 under Stream-K) and the sm80 attention, compiled by nvcc for sm_80 with
/// compute_80 PTX (which newer GPUs compile when they load it) into one library.
#[test]
fn an_sm80_library_holds_gemms_evt_gemms_and_attention() {
    use fact::kinds::attention::candidates;
    use fact::kinds::attention::AttentionOrigin;
    use fact::kinds::attention::AttentionProblem;
    use fact::kinds::gemm::space::gemm_candidates;
    use fact::kinds::Spec;
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let plain = GemmProblem {
        bias: false,
        ..linear_problem()
    };
    let plain = gemm_candidates(&plain, MathType::Tf32, Arch::Sm80).remove(0);
    // The kernel `fact compose --arch sm80 --candidates 1 linear_ep.pt` compiles first.
    let evt = gemm_candidates(&linear_ep_problem(), MathType::Tf32, Arch::Sm80).remove(0);
    let leaves = fact::kinds::gemm::Epilogue::parse("leaves=full,row,col,scalar;v1=gelu(v0);v2=mul(v1,l1);v3=add(v2,l2);v4=div(v3,l3);v5=add(v4,l0)").unwrap();
    let every = GemmProblem {
        layout: GemmLayout::Rrr,
        dtype: DType::Bf16,
        epilogue: Some(leaves.clone()),
        ..linear_problem()
    };
    let every = Knowledge::shipped()
        .kernels(&every, MathType::Bf16, Arch::Sm80)
        .into_iter()
        .find(|k| {
            k.scheduler == TileScheduler::StreamK && k.tile[..2] == [128, 128] && k.fits(&every)
        })
        .expect("a bf16 Stream-K kernel with every leaf kind");
    let p = AttentionProblem {
        origin: AttentionOrigin::Sdpa,
        batch: 2,
        heads: 8,
        seq_q: 512,
        seq_k: 512,
        head_dim: 64,
        dtype: DType::Bf16,
        causal: true,
        kv_heads: None,
        padded: false,
        masked: false,
        bias: None,
        mask_strided: false,
    };
    let attention = candidates(&p, MathType::Bf16, Arch::Sm80).remove(0);
    for name in [plain.name(), evt.name(), every.name(), attention.name()] {
        assert!(
            name.starts_with("sm80_") && name.ends_with("_for_sm80"),
            "{name}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = vec![
        plain.clone().into(),
        evt.clone().into(),
        every.clone().into(),
        attention.clone().into(),
    ];
    let built = build_all(&tc, &specs, dir.path(), "libsm80.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.len(), 4);
    assert_eq!(
        (
            lib.find(&plain.name()),
            lib.find(&evt.name()),
            lib.find(&every.name())
        ),
        (Some(0), Some(1), Some(2))
    );
    assert_eq!(
        lib.epilogue(1),
        Some(linear_ep_problem().epilogue.unwrap().text())
    );
    assert_eq!(lib.epilogue(2), Some(leaves.text()));
    assert_eq!(
        (lib.name(3), lib.kind(3).as_deref()),
        (Some(attention.name()), Some("attention"))
    );
    // PTX for an H100 to run (compressed: read from the fat binaries' entry headers).
    let entries = crate::common::fatbin_entries(&std::fs::read(&built.library).unwrap());
    assert!(
        entries.contains(&(1, 80)),
        "the library carries sm_80 PTX: {entries:?}"
    );
    assert!(entries.contains(&(2, 80)), "and sm_80 cubins: {entries:?}");
    let op = std::fs::read_to_string(dir.path().join("src/fact_torch_op.cpp")).unwrap();
    assert!(op.contains(
        "(props.major == 8 && props.minor == 0) || (props.major == 9 && props.minor == 0)"
    ));
    // One library, one arch.
    let mixed: Vec<Spec> = vec![plain.into(), good_spec().into()];
    let err =
        nvcc::build_library(&tc, &mixed, "libmixed.so", &build_options(dir.path(), 2)).unwrap_err();
    assert!(err.to_string().contains("two archs"), "{err}");
}

/// `fact compose --arch sm80` without a GPU: the fused pattern of linear_ep.pt gets sm80 visitor-tree
/// candidates, compiled for sm80, and compose says what is left for a GPU. Fixture: linear_ep.pt.
#[test]
fn an_sm80_compose_without_a_gpu_compiles_and_says_what_is_left() {
    if fact::torch::cuda_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |json: bool| {
        let mut c = fact();
        c.env("FACT_TABLE", dir.path().join("table.json"))
            .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"));
        c.args(["compose", "--arch", "sm80", "--candidates", "1", "--out"])
            .arg(dir.path().join("out"));
        if json {
            c.arg("--json");
        }
        c.arg(fixture("linear_ep.pt")).output().unwrap()
    };
    let out = run(true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["compose"];
    assert_eq!(
        (c["arch"].as_str(), c["gpu"].as_bool()),
        (Some("sm80"), Some(false)),
        "{c}"
    );
    let p = &c["patterns"][0];
    assert_eq!(p["rule"], linear_ep_problem().rule_id(), "{c}");
    assert_eq!(
        p["realization"],
        serde_json::json!({ "how": "compiled", "candidates": 1, "failed": 0 }),
        "{c}"
    );
    let evt =
        fact::kinds::gemm::space::gemm_candidates(&linear_ep_problem(), MathType::Tf32, Arch::Sm80)
            .remove(0);
    let sweep = dir
        .path()
        .join("out/sweeps")
        .join(format!("{}_f32_32x128x64", linear_ep_problem().rule_id()));
    let source =
        std::fs::read_to_string(sweep.join("src").join(format!("{}.cu", evt.kernel_name())))
            .unwrap();
    assert!(
        source.contains("cutlass::epilogue::threadblock::Sm80EVT<")
            && sweep.join("libsweep.so").is_file()
    );
    let text = String::from_utf8_lossy(&run(false).stdout).to_string();
    assert!(
        text.contains("fact compose") && text.contains("(tf32 precision, sm80)"),
        "{text}"
    );
    assert!(text.contains("no CUDA device: tuning and benchmarking sm80 kernels need an sm80 GPU (A100, A30) or an sm90 one (H100, H200)"), "{text}");
    assert!(
        text.contains("1 need tuning: their candidate kernels are rendered and compiled under"),
        "{text}"
    );
}

/// The convolution kind's sm90 fprop kernels (bf16 with bias, residual and ReLU in the epilogue;
/// tf32 with none of them; fp16 with a sigmoid alone), the depthwise direct convolution and a
/// stem's fixed-channels implicit GEMM (sm80 code built for sm90: bf16 3x3 with bias and ReLU6;
/// tf32 of four channels with bias and hardsigmoid, fact's functor) and the 1x1 family's GEMMs (tf32 cooperative, bf16 ping-pong
/// with ReLU6, as the depthwise one) compile beside a GEMM into one library, each listed as a conv
/// kernel with its signature.
#[test]
fn sm90_conv_kernels_build_beside_a_gemm_in_one_library() {
    use fact::kinds::conv::{ConvAct, ConvSpec, GemmSchedule};
    use fact::kinds::Spec;
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let bf16 = ConvSpec {
        arch: Arch::Sm90,
        dtype: DType::Bf16,
        conv_tile: [128, 128, 64],
        conv_cluster: [1, 1, 1],
        conv_warps: None,
        conv_stages: None,
        conv_fixed_channels: None,
        conv_gemm: None,
        conv_depthwise: None,
        bias: true,
        residual: true,
        act: Some(ConvAct::Relu),
    };
    let tf32 = ConvSpec {
        dtype: DType::F32,
        conv_tile: [128, 128, 32],
        conv_cluster: [2, 1, 1],
        bias: false,
        residual: false,
        act: None,
        ..bf16.clone()
    };
    let f16 = ConvSpec {
        dtype: DType::F16,
        conv_tile: [64, 128, 64],
        bias: false,
        residual: false,
        act: Some(ConvAct::Sigmoid),
        ..bf16.clone()
    };
    // A tf32 stem's fixed-channels kernel (CUTLASS 2's code, C = 4) built for sm90.
    let stem = ConvSpec {
        dtype: DType::F32,
        conv_tile: [128, 64, 16],
        conv_warps: Some([2, 2, 1]),
        conv_stages: Some(6),
        conv_fixed_channels: Some(4),
        act: Some(ConvAct::Hardsigmoid),
        residual: false,
        ..bf16.clone()
    };
    // The 1x1 family: sm90's GEMM builder over the pixels' rows, tf32 cooperative with the
    // bottleneck's whole epilogue and bf16 ping-pong with bias and ReLU.
    let pointwise_tf32 = ConvSpec {
        dtype: DType::F32,
        conv_tile: [128, 128, 32],
        conv_gemm: Some(GemmSchedule::Coop),
        ..bf16.clone()
    };
    // ReLU6 (fact's functor, CUTLASS has none) on the 1x1 family's EVT and the depthwise kernel.
    let pointwise_bf16 = ConvSpec {
        conv_tile: [64, 128, 64],
        conv_gemm: Some(GemmSchedule::Pingpong),
        residual: false,
        act: Some(ConvAct::Relu6),
        ..bf16.clone()
    };
    let depthwise = ConvSpec {
        act: Some(ConvAct::Relu6),
        ..crate::conv_abi::depthwise_spec()
    };
    for s in [&bf16, &tf32, &f16, &stem, &pointwise_tf32, &pointwise_bf16] {
        assert_eq!(s.invalid_reason(), None, "{}", s.name());
    }
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = vec![
        bf16.clone().into(),
        good_spec().into(),
        tf32.clone().into(),
        f16.clone().into(),
        depthwise.into(),
        stem.clone().into(),
        pointwise_tf32.clone().into(),
        pointwise_bf16.clone().into(),
    ];
    let built = build_all(&tc, &specs, dir.path(), "libc.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.len(), 8);
    assert_eq!(
        (0..8).map(|i| lib.kind(i).unwrap()).collect::<Vec<_>>(),
        ["conv", "gemm", "conv", "conv", "conv", "conv", "conv", "conv"]
    );
    assert_eq!(
        lib.find("sm90_conv2d_fprop_tf32_128x128x32_1x1x1_1x1gemm_coop_bias_add_relu"),
        Some(6)
    );
    assert_eq!(
        lib.find("sm90_conv2d_fprop_bf16_64x128x64_1x1x1_1x1gemm_pp_bias_relu6"),
        Some(7)
    );
    assert_eq!(lib.find(&bf16.name()), Some(0));
    assert_eq!(lib.find(&f16.name()), Some(3));
    assert_eq!(
        lib.find("sm80_dwconv2d_fprop_bf16_8x8x64_r3x3_stride1x1_4x1x1_s3_bias_relu6"),
        Some(4)
    );
    assert_eq!(
        lib.find("sm80_conv2d_fprop_tf32_128x64x16_2x2x1_s6_fixedc4_bias_hardsigmoid"),
        Some(5)
    );
}

/// The convolution kind's sm80 kernels (CUTLASS 2's implicit GEMM: bf16 with bias, residual and
/// ReLU through the broadcast epilogue; tf32 with none of them) compile for sm_80 beside an sm80
/// GEMM into one library, so CI builds both families' convolutions.
#[test]
fn sm80_conv_kernels_build_beside_a_gemm_in_an_sm80_library() {
    use fact::kinds::conv::{candidates, ConvAct, ConvProblem};
    use fact::kinds::gemm::space::gemm_candidates;
    use fact::kinds::Spec;
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let p = ConvProblem {
        images: 32,
        height: 56,
        width: 56,
        in_channels: 64,
        out_channels: 256,
        filter: [1, 1],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        groups: 1,
        dtype: DType::Bf16,
        bias: true,
        residual: true,
        // ReLU6 through the broadcast epilogue (fact's functor).
        act: Some(ConvAct::Relu6),
    };
    let pick = |p: &ConvProblem, math, tile: [u32; 3]| {
        candidates(p, math, Arch::Sm80)
            .unwrap()
            .into_iter()
            .find(|s| s.conv_tile == tile)
            .expect("a generator tile")
    };
    let bf16 = pick(&p, MathType::Bf16, [128, 128, 32]);
    let plain = ConvProblem {
        dtype: DType::F32,
        bias: false,
        residual: false,
        act: None,
        ..p
    };
    let tf32 = pick(&plain, MathType::Tf32, [128, 128, 16]);
    let gemm = gemm_candidates(&linear_problem(), MathType::Tf32, Arch::Sm80).remove(0);
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = vec![bf16.clone().into(), gemm.into(), tf32.clone().into()];
    let built = build_all(&tc, &specs, dir.path(), "libconv80.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(
        (0..3).map(|i| lib.kind(i).unwrap()).collect::<Vec<_>>(),
        ["conv", "gemm", "conv"]
    );
    assert_eq!(lib.find(&bf16.name()), Some(0));
    assert_eq!(lib.find(&tf32.name()), Some(2));
    assert!(tf32.name().ends_with("_for_sm80"), "{}", tf32.name());
}

/// GRN kernels (fact's own, no CUTLASS: bf16 of 16-byte vectors and fp32 of 8-byte ones, each
/// with its three launches and workspace) compile beside a GEMM into one library, listed as grn
/// kernels.
#[test]
fn grn_kernels_build_beside_a_gemm_in_one_library() {
    use fact::kinds::grn::{candidates, GrnProblem};
    use fact::kinds::Spec;
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let p = GrnProblem {
        batch: 32,
        pixels: 3136,
        channels: 384,
        dtype: DType::Bf16,
    };
    let bf16 = candidates(&p, Arch::Sm90).remove(0);
    let f32 = candidates(
        &GrnProblem {
            dtype: DType::F32,
            ..p
        },
        Arch::Sm90,
    )
    .into_iter()
    .find(|s| s.vector == 2)
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = vec![bf16.clone().into(), good_spec().into(), f32.clone().into()];
    let built = build_all(&tc, &specs, dir.path(), "libgrn.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(
        (0..3).map(|i| lib.kind(i).unwrap()).collect::<Vec<_>>(),
        ["grn", "gemm", "grn"]
    );
    assert_eq!(lib.find("grn_bf16_v8_s8"), Some(0));
    assert_eq!(lib.find(&f32.name()), Some(2));
}
