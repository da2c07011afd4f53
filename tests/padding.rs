//! Ragged GEMMs against weights: compose pads a weight whose N is off 16 bytes once, as a buffer
//! of the composed module, and `fact::gemm` computes the graph's extent from it ("linear;n=N").
//! Fixture: lm_head.pt (a logits linear tied to the token embedding, vocabulary 1001; an
//! nn.Linear with 37 outputs and a bias; `h @ proj.t()` and `h.flip(1) @ proj.T`, 21 rows; fp32,
//! so 16 bytes are 4).

use crate::common::{compose_json, fact, fixture, run_python, sample_entry};
use fact::graph::{Edit, Operand};
use fact::kinds::registry::match_patterns;
use fact::table::Table;
use fact::torch;

#[test]
fn the_plan_says_which_weights_are_padded() {
    let out = fact()
        .arg("discover")
        .arg(fixture("lm_head.pt"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for (rule, shape, pad) in [
        (
            "gemm_rcr_padn",
            "16x1001x64",
            "pad: n 1001 → 1004: the weight padded",
        ),
        (
            "gemm_rcr_bias_padn",
            "16x37x64",
            "pad: n 37 → 40: the weight and bias",
        ),
        ("gemm_rcr_padn", "16x21x64", "pad: n 21 → 24"),
    ] {
        let line = text
            .lines()
            .find(|l| l.contains(shape))
            .unwrap_or_else(|| panic!("{shape} in\n{text}"));
        assert!(line.contains(rule), "{line}");
        assert!(text.contains(pad), "{pad} in\n{text}");
    }
}

/// The rewrite adds each padded weight as a buffer (the tied embedding keeps its own tensor; the
/// two GEMMs on `proj` share one), calls `fact::gemm` on it, and removes the transposing views of
/// `proj`; a value that is no module attribute is refused, naming it.
#[test]
fn the_rewrite_adds_padded_buffers_and_calls_the_op_on_them() {
    let model = fixture("lm_head.pt");
    let (g, _) = torch::load_graph(&model, &[]).unwrap();
    let found = match_patterns(&g);
    assert_eq!(found.of::<fact::kinds::gemm::GemmMatch>().len(), 4);
    assert!(found
        .of::<fact::kinds::gemm::GemmMatch>()
        .iter()
        .all(|m| m.pad.is_some()));
    let edits: Vec<Edit> = found
        .of::<fact::kinds::gemm::GemmMatch>()
        .iter()
        .map(|m| fact::kinds::gemm::edit(&g, m, "k"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("padded.pt");
    torch::rewrite_and_save(&model, &out, &edits, &fact::kinds::registry::op_schemas()).unwrap();
    let text = torch::graph_text(&out).unwrap();
    assert_eq!(text.matches("fact::gemm(").count(), 4, "{text}");
    // Both calls on `proj` read one buffer, read once (equal buffers are read once).
    assert_eq!(
        text.matches("prim::GetAttr[name=\"fact_padded_proj_24\"]")
            .count(),
        1,
        "{text}"
    );
    assert!(!text.contains("fact_padded_proj_24_1"), "{text}");
    for name in [
        "fact_padded_wte_weight_1004",
        "fact_padded_odd_weight_40",
        "fact_padded_odd_bias_40",
        "fact_padded_proj_24",
    ] {
        assert!(
            text.contains(&format!("prim::GetAttr[name=\"{name}\"]")),
            "{name} in\n{text}"
        );
    }
    for origin in ["linear;n=1001", "linear;n=37", "linear;n=21"] {
        assert!(
            text.contains(&format!("\"{origin}\"")),
            "{origin} in\n{text}"
        );
    }
    assert!(
        !text.contains("aten::t(")
            && !text.contains("aten::numpy_T(")
            && !text.contains("aten::linear")
            && !text.contains("aten::matmul"),
        "{text}"
    );
    assert!(
        text.contains("aten::embedding"),
        "the embedding stays: {text}"
    );

    // The embedding's output is no module attribute.
    let mut bad = fact::kinds::gemm::edit(&g, found.of::<fact::kinds::gemm::GemmMatch>()[0], "k");
    let embedding = g
        .nodes
        .iter()
        .find(|n| n.kind == "aten::embedding")
        .unwrap()
        .outputs[0];
    bad.operands[1] = Operand::padded(embedding, 1004);
    let err = torch::rewrite_and_save(
        &model,
        &dir.path().join("bad.pt"),
        &[bad],
        &fact::kinds::registry::op_schemas(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("is no module attribute: it cannot be padded"),
        "{err}"
    );
}

/// Composed from a table that holds the three padded problems (a kernel name for each: on CPU the
/// op falls back), the module carries the padded buffers, zero past the graph's N, and computes
/// exactly what the original computes: the fallback runs linear on the first N rows.
#[test]
fn a_composed_padded_module_computes_the_original_on_cpu() {
    let model = fixture("lm_head.pt");
    let (g, _) = torch::load_graph(&model, &[]).unwrap();
    let spec = crate::compile::good_spec();
    let mut table = Table::new();
    for m in match_patterns(&g).of::<fact::kinds::gemm::GemmMatch>() {
        table.insert_merged(sample_entry(
            &m.problem,
            &spec,
            0.01,
            "test table (not a measurement)",
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
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
            "gemm_rcr_padn",
            "gemm_rcr_bias_padn",
            "gemm_rcr_padn",
            "gemm_rcr_padn"
        ]
    );
    assert!(patterns.iter().all(|p| p["realization"]["how"] == "hit"));
    let script = format!(
        r#"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
orig = torch.jit.load({orig:?})
graph = str(m.forward.graph)
assert graph.count("fact::gemm(") == 4, graph
buffers = dict(m.named_buffers())
w = buffers["fact_padded_wte_weight_1004"]
assert w.shape == (1004, 64) and torch.equal(w[:1001], orig.wte.weight) and not w[1001:].any()
assert w.data_ptr() != m.wte.weight.data_ptr(), "the embedding keeps its own tensor"
assert torch.equal(buffers["fact_padded_odd_bias_40"][:37], orig.odd.bias)
assert buffers["fact_padded_proj_24"].shape == (24, 64) and "fact_padded_proj_24_1" not in buffers
ids = torch.randint(0, 1001, (3, 5))
with torch.no_grad():
    got, want = m(ids), orig(ids)
for g, w in zip(got, want):
    assert g.shape == w.shape and torch.equal(g, w), (g.shape, w.shape)
print("ok")
"#,
        lib = out_dir.join("libfact_ops.so").display().to_string(),
        composed = out_dir.join("composed.pt").display().to_string(),
        orig = model.display().to_string(),
    );
    assert_eq!(run_python(&script), "ok");
}
