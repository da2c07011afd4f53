//! The zoo in CI. Here so far: the MultiheadAttention fixture, which discover must see past.

use crate::common::{fact, fixture};
use fact::plan::Plan;
use std::path::Path;

/// `fact discover --json` on `model` with no pattern tables: (the plan, or discover's stderr).
fn discover(model: &Path) -> Result<Plan, String> {
    let dir = tempfile::tempdir().unwrap();
    let out = fact()
        .env("FACT_TABLE", dir.path().join("t.json"))
        .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"))
        .arg("discover")
        .arg(model)
        .arg("--json")
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Ok(serde_json::from_value(v["plan"].clone()).expect("discover --json's plan"))
}

#[test]
fn discover_sees_past_multihead_attention() {
    // _native_multi_head_attention returns an undefined weights tensor: shape propagation must
    // carry on to the Linear after it, whose operand shape comes from the attention's output.
    let plan = discover(&fixture("mha.pt")).unwrap_or_else(|e| panic!("{e}"));
    let linear = plan
        .patterns
        .iter()
        .find(|p| p.rule == "gemm_rcr_bias")
        .expect("the Linear after the attention is a pattern");
    assert_eq!(linear.input_shapes[0], vec![2, 16, 32]);
    assert!(plan.patterns.iter().any(|p| p.rule == "layernorm_affine"));
}
