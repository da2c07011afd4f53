//! `aten::_native_multi_head_attention` (nn.MultiheadAttention's fast path) as fact reads it: the
//! bridge rewrites it into linear in-projection, SDPA and linear out-projection, which the rules
//! match, and the module saved from that graph (with or without fact's ops in it) computes what
//! the original did. Fixtures: attentions.pt (every form the op takes, see make_models.py) and
//! vit.pt (torchvision's VisionTransformer, two layers).

use crate::common::{build_all, fixture, run_python};
use fact::graph::Edit;
use fact::kinds::registry::match_patterns;
use fact::kinds::Problem;
use fact::nvcc::Toolchain;
use fact::torch;
use std::path::Path;

/// The problems of a graph's patterns as `(rule, MxNxK or shape)`, the attention ones too.
fn problems(model: &Path) -> Vec<Problem> {
    let (g, _) = torch::load_graph(model, &[]).unwrap();
    let found = match_patterns(&g);
    found
        .of::<fact::kinds::gemm::GemmMatch>()
        .iter()
        .map(|m| Problem::from(m.problem.clone()))
        .chain(
            found
                .of::<fact::kinds::attention::AttentionMatch>()
                .iter()
                .map(|a| Problem::from(a.problem.clone())),
        )
        .collect()
}

/// Every pattern of `model` rewritten to fact's ops under made-up kernel names (the op library's
/// fallback runs the original ops for them), saved to `out`.
fn compose_all(model: &Path, out: &Path) {
    let (g, _) = torch::load_graph(model, &[]).unwrap();
    let found = match_patterns(&g);
    let mut edits: Vec<Edit> = found
        .of::<fact::kinds::gemm::GemmMatch>()
        .iter()
        .map(|m| fact::kinds::gemm::edit(&g, m, "k"))
        .collect();
    edits.extend(
        found
            .of::<fact::kinds::attention::AttentionMatch>()
            .iter()
            .map(|a| fact::kinds::attention::edit(&g, a, "a")),
    );
    edits.extend(
        found
            .of::<fact::kinds::layernorm::LayerNormMatch>()
            .iter()
            .map(|l| fact::kinds::layernorm::edit(&g, l, "n")),
    );
    torch::rewrite_and_save(model, out, &edits, &fact::kinds::registry::op_schemas()).unwrap();
}

#[test]
fn the_native_op_is_read_as_projections_and_sdpa() {
    let text = torch::graph_text(&fixture("attentions.pt")).unwrap();
    assert!(!text.contains("_native_multi_head_attention"), "{text}");
    // Five through the native op (the sixth form, batch_first=False, never was one) and the
    // seq-first module's own.
    assert_eq!(
        text.matches("aten::scaled_dot_product_attention(").count(),
        7,
        "{text}"
    );
    let gemm = |p: &Problem| {
        p.get::<fact::kinds::gemm::GemmProblem>()
            .map(|g| (g.n, g.k, g.bias))
    };
    let all = problems(&fixture("attentions.pt"));
    let count = |n: i64| {
        all.iter()
            .filter(|p| gemm(p) == Some((n, 32, true)))
            .count()
    };
    // In-projections: one [3E] GEMM per self-attention (four), a [2E] one for the shared k and
    // v of the first cross-attention, weight slices of E rows for q there and for all three in
    // the second; the out-projections (N = E) of all six; the seq-first module's four.
    assert_eq!(count(96), 4, "{all:?}");
    assert_eq!(count(64), 1, "{all:?}");
    assert_eq!(count(32), 1 + 3 + 6 + 4, "{all:?}");
    // Unmasked ones are attention patterns (a mask is the attention rule's business).
    let sdpa = all
        .iter()
        .filter(|p| {
            p.get::<fact::kinds::attention::AttentionProblem>()
                .is_some_and(|a| a.head_dim == 8 && a.heads == 4)
        })
        .count();
    assert!(sdpa >= 5, "{all:?}");

    // torchvision's ViT: per layer the [3E] in-projection, the SDPA and the out-projection.
    let vit = problems(&fixture("vit.pt"));
    let shapes: Vec<String> = vit.iter().map(Problem::shape_key).collect();
    for (shape, times) in [("5x192x64", 2), ("5x64x64", 2), ("1x4x5x5x16", 2)] {
        assert_eq!(
            shapes.iter().filter(|s| *s == shape).count(),
            times,
            "{shape} in {shapes:?}"
        );
    }
}

/// The archive rewritten with no edit (the decomposed graph alone) and with every pattern
/// replaced by fact's ops computes, on CPU, what the original computes, up to fp32 reordering:
/// each form of attentions.pt (a key-padding mask included, no row fully masked) and the ViT.
#[test]
fn the_decomposed_module_composed_or_not_computes_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let mut saved = vec![];
    for name in ["attentions.pt", "vit.pt"] {
        let plain = dir.path().join(format!("plain_{name}"));
        torch::rewrite_and_save(
            &fixture(name),
            &plain,
            &[],
            &fact::kinds::registry::op_schemas(),
        )
        .unwrap();
        let composed = dir.path().join(format!("composed_{name}"));
        compose_all(&fixture(name), &composed);
        saved.push((fixture(name), plain, composed));
    }
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let built = build_all(
        &tc,
        &[crate::compile::good_spec()],
        dir.path(),
        "libmha.so",
        2,
    );
    let s = |p: &Path| p.display().to_string();
    let models = saved
        .iter()
        .map(|(o, p, c)| format!("({:?}, {:?}, {:?})", s(o), s(p), s(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let script = format!(
        r#"
import torch
torch.ops.load_library({lib:?})
torch.manual_seed(0)
x, y, z = (torch.randn(2, 6, 32) for _ in range(3))
kpm = torch.zeros(2, 6, dtype=torch.bool)
kpm[0, 5:] = True
kpm[1, 2:] = True
inputs = {{"attentions": (x, y, z, kpm), "vit": (torch.randn(3, 3, 32, 32),)}}
for (orig, plain, composed), name in zip([{models}], ["attentions", "vit"]):
    want = torch.jit.load(orig)
    assert "_native_multi_head_attention" in str(want.inlined_graph)
    for path in (plain, composed):
        m = torch.jit.load(path)
        graph = str(m.inlined_graph)
        assert "_native_multi_head_attention" not in graph, graph
        if path == composed:
            assert "fact::attention(" in graph and "fact::gemm" in graph, graph
        with torch.no_grad():
            a, b = m(*inputs[name]), want(*inputs[name])
        for i, (g, w) in enumerate(zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,))):
            assert g.shape == w.shape, (name, i, g.shape, w.shape)
            d = (g - w).abs().max().item()
            assert d <= 1e-5 * max(1.0, w.abs().max().item()), (path, i, d)
print("ok")
"#,
        lib = s(&built.library),
        models = models,
    );
    assert_eq!(run_python(&script), "ok");
}
