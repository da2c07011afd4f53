//! Stage 1 on fixture models: the plan, the examples index, and an external agent driving fact
//! through the fact-agent/2 protocol.

use crate::common::{fact, fixture, python, root};
use fact::space::examples::index;
use std::path::Path;

fn discover(model: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = fact()
        .env("FACT_TABLE", dir.path().join("t.json"))
        .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"))
        .arg("discover")
        .arg(model)
        .arg("--json")
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        serde_json::from_slice(&out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn rules_in_order(plan: &serde_json::Value) -> Vec<(String, String)> {
    plan["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["rule"].as_str().unwrap().to_string(),
                p["problem"]["m"].to_string() + "/" + &p["problem"]["k"].to_string(),
            )
        })
        .collect()
}

#[test]
fn minigpt_plan_ranks_patterns_and_reports_the_unmatched_regions() {
    let (v, _) = discover(&fixture("minigpt768.pt"), &["--input", "128x512x768"]);
    let plan = &v["plan"];
    let pats = plan["patterns"].as_array().unwrap();
    assert_eq!(
        pats.len(),
        7,
        "4 linears, the attention and the two LayerNorms"
    );
    // The cost model's order for this block: the attention (q·kᵀ, its scale, the causal mask,
    // softmax and ·v as one pattern: a 512x512 score matrix per head), then the MLP, then qkv and
    // the projection, then the LayerNorms (one pass over 65536 rows of 768 each way). The GELU and
    // both residual adds are fused into their GEMMs.
    let order: Vec<&str> = pats.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(
        order,
        vec![
            "attention causal 128x8x512x512x96",
            "linear 65536x3072x768 + gelu",
            "linear 65536x768x3072 + add",
            "linear 65536x2304x768",
            "linear 65536x768x768 + add",
            "layer_norm 65536x768",
            "layer_norm 65536x768"
        ]
    );
    assert_eq!(pats[0]["rule"], "attention_causal");
    assert_eq!(pats[0]["id"], "a0");
    assert_eq!(
        pats[0]["input_shapes"],
        serde_json::json!([[128, 8, 512, 96], [128, 8, 512, 96], [128, 8, 512, 96]])
    );
    for (i, p) in pats.iter().enumerate() {
        assert_eq!(p["priority"], i + 1);
        if i == 0 || i >= 5 {
            continue;
        }
        assert!(p["id"].as_str().unwrap().starts_with('p'), "{}", p["id"]);
        let examples = p["examples"].as_array().unwrap();
        assert!(!examples.is_empty(), "{}", p["name"]);
        let fused = p["problem"]["epilogue"].is_object();
        assert_eq!(
            p["notes"].as_array().unwrap().len(),
            if fused { 6 } else { 5 }
        );
        assert!(
            p["notes"][4].as_str().unwrap().starts_with("alignment 4: "),
            "{}",
            p["notes"]
        );
        if fused {
            assert!(
                examples
                    .iter()
                    .any(|e| e.as_str().unwrap().contains("sm90_visitor")),
                "{examples:?}"
            );
        }
    }
    // q, k and v are heads split from the qkv linear's output (rows strided by 3C, the heads
    // interleaved with them): no GEMM layout fits them, but they are the attention's operands now,
    // which its kernel reads through their strides; no pattern of the block copies an operand.
    assert!(pats.iter().all(|p| p.get("copies").is_none()), "{pats:?}");
    assert!(
        pats[1..5].iter().all(|p| p["notes"][0]
            .as_str()
            .unwrap()
            .starts_with("layout rcr: a row-major, B column-major, read in place")),
        "{pats:?}"
    );
    assert!(
        pats[0]["notes"][1]
            .as_str()
            .unwrap()
            .starts_with("q, k, v read through their strides"),
        "{}",
        pats[0]["notes"]
    );
    // Both LayerNorms are affine, over C = 768, and their key's math is fp32 under the tf32 policy.
    for p in &pats[5..] {
        assert_eq!(
            (
                p["id"].as_str().unwrap().chars().next(),
                p["rule"].as_str(),
                p["math"].as_str()
            ),
            (Some('l'), Some("layernorm_affine"), Some("f32")),
            "{p}"
        );
        assert_eq!(
            p["input_shapes"],
            serde_json::json!([[128, 512, 768], [768], [768]])
        );
        assert!(
            p["notes"][0]
                .as_str()
                .unwrap()
                .contains("16-byte vector loads"),
            "{}",
            p["notes"]
        );
    }
    // What is left: the contiguous after att·v (the heads merged back).
    let regions = plan["unmatched"].as_array().unwrap();
    let names: Vec<&str> = regions
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["contiguous"]);
    let shares: f64 = pats
        .iter()
        .map(|p| p["share"].as_f64().unwrap())
        .sum::<f64>()
        + plan["unmatched_share"].as_f64().unwrap();
    assert!(
        (shares - 1.0).abs() < 1e-9,
        "patterns and regions account for all the time: {shares}"
    );
}

#[test]
fn mlp_and_bmm_plans() {
    let (v, _) = discover(&fixture("mlp.pt"), &["--input", "4096x1024x64"]);
    // fc1 (K = 64, N = 256) outweighs fc2 (K = 256, N = 64): a short K and a wider output.
    // fc1's relu is fused into it: nothing is left unmatched.
    assert_eq!(
        rules_in_order(&v["plan"]),
        vec![
            ("gemm_rcr_bias_ep_relu_97bd3c0c".into(), "4194304/64".into()),
            ("gemm_rcr".into(), "4194304/256".into())
        ]
    );
    assert!(
        v["plan"]["unmatched"].as_array().unwrap().is_empty(),
        "{}",
        v["plan"]["unmatched"]
    );
    // Nothing unmatched is a share of +0 (an empty f64 sum is -0.0, printed "-0.0%").
    let share = v["plan"]["unmatched_share"].as_f64().unwrap();
    assert!(share == 0.0 && share.is_sign_positive(), "{share}");
    let (v, _) = discover(&fixture("bmm.pt"), &[]);
    assert_eq!(
        rules_in_order(&v["plan"]),
        vec![("bmm_rrr".into(), "32/64".into())]
    );
}

/// The epilogue line of the pattern named `name` in a discover plan.
fn epilogue_line<'a>(plan: &'a serde_json::Value, name: &str) -> &'a str {
    let p = plan["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no pattern {name}: {plan}"));
    p["notes"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_str()
        .unwrap()
}

#[test]
fn plans_say_how_residuals_are_read() {
    // Two residuals after one linear: one pattern, a residual on C and one through an aux load.
    // The residual after the 64 -> 30 linear: rows of 30 floats are no 16-byte vectors, so no TMA
    // kernel fuses it; an sm80 visitor tree of alignment 2 does, the residual through an aux load.
    let (v, _) = discover(&fixture("residuals.pt"), &[]);
    let two = epilogue_line(&v["plan"], "linear 32x128x64 + add → add");
    assert!(
        two.ends_with(
            "(2 ops, 2 leaves); full-size leaves: l0 as the C operand, l1 through an aux load"
        ),
        "{two}"
    );
    let sm80 = "epilogue fused as a visitor tree (sm80 EVT over the mainloop's accumulators, fp32): leaves=full;v1=add(v0,l0) (1 ops, 1 leaves); full-size leaves: l0 through an aux load";
    let odd = epilogue_line(&v["plan"], "linear 32x30x64 + add");
    assert_eq!(odd, sm80);
    // Under f32-accurate the split families' second GEMM reads its first's result as C, and the
    // residuals through aux loads; the ragged one runs on sm80 3xTF32's visitor tree.
    let (v, _) = discover(&fixture("residuals.pt"), &["--precision", "f32"]);
    let two = epilogue_line(&v["plan"], "linear 32x128x64 + add → add");
    assert!(two.ends_with("full-size leaves: l0 through an aux load, l1 through an aux load (C holds the split's first GEMM)"), "{two}");
    assert_eq!(epilogue_line(&v["plan"], "linear 32x30x64 + add"), sm80);
    let (v, _) = discover(&fixture("linear_ep.pt"), &["--precision", "f32"]);
    let ep = epilogue_line(&v["plan"], "linear 32x128x64 + gelu_tanh → mul → add");
    assert!(
        ep.starts_with("epilogue fused as a visitor tree")
            && ep.ends_with("l0 through an aux load (C holds the split's first GEMM)"),
        "{ep}"
    );
}

#[test]
fn every_indexed_example_exists_in_the_installed_cutlass() {
    let cutlass = std::env::var_os("CUTLASS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root().join(".fact/cutlass"));
    let idx = index();
    assert_eq!(idx.cutlass, "4.2.0");
    assert!(!idx.paths().is_empty());
    for p in idx.paths() {
        assert!(
            cutlass.join(&p).is_file(),
            "{p} is not in {}",
            cutlass.display()
        );
    }
}

fn agent_cmd(mode: &str, log: &Path) -> String {
    format!(
        "{} {} {mode} {}",
        python().display(),
        root().join("tests/agents/scripted_agent.py").display(),
        log.display()
    )
}

fn requests(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn an_external_agent_ranks_and_chooses_examples() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let (v, _) = discover(
        &fixture("mlp.pt"),
        &["--agent", &agent_cmd("reject-then-propose", &log)],
    );
    let plan = &v["plan"];
    assert!(plan["agent"]
        .as_str()
        .unwrap()
        .contains("scripted_agent.py"));
    // The agent reversed the built-in order and kept one example per pattern.
    assert_eq!(plan["patterns"][0]["rule"], "gemm_rcr");
    assert_eq!(plan["patterns"][0]["examples"].as_array().unwrap().len(), 1);
    let kinds: Vec<String> = requests(&log)
        .iter()
        .map(|r| r["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, vec!["examples", "examples", "rank"]);
}

#[test]
fn a_silent_or_garbled_agent_times_out_and_the_builtin_takes_over() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let started = std::time::Instant::now();
    let (v, _) = discover(
        &fixture("mlp.pt"),
        &[
            "--agent",
            &agent_cmd("sleep-on-rank", &log),
            "--agent-timeout",
            "1",
        ],
    );
    assert!(
        started.elapsed().as_secs() < 30,
        "the timeout bounds the wait"
    );
    let notes = v["plan"]["agent_notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().contains("did not answer within")),
        "{notes:?}"
    );
    assert_eq!(v["plan"]["agent"], "builtin");
    assert_eq!(
        v["plan"]["patterns"][0]["rule"], "gemm_rcr_bias_ep_relu_97bd3c0c",
        "the built-in order"
    );

    let (v, _) = discover(
        &fixture("mlp.pt"),
        &["--agent", &agent_cmd("garbage", &log)],
    );
    let notes = v["plan"]["agent_notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().contains("malformed")),
        "{notes:?}"
    );
    let (v, _) = discover(
        &fixture("mlp.pt"),
        &["--agent", "/nonexistent/agent-binary"],
    );
    assert_eq!(v["plan"]["agent"], "builtin");
}

#[test]
fn an_external_agent_drives_a_compose_through_a_rejected_proposal() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    let out = fact()
        .env("FACT_TABLE", dir.path().join("t.json"))
        .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"))
        .args(["compose", "--json", "--candidates", "1", "--out"])
        .arg(dir.path().join("out"))
        .arg(fixture("linear.pt"))
        .args(["--agent", &agent_cmd("reject-then-propose", &log)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["compose"];
    let notes: Vec<&str> = c["agent_notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("rejected a candidate") && n.contains("cooperative")),
        "{notes:?}"
    );
    let reqs = requests(&log);
    let proposes: Vec<&serde_json::Value> =
        reqs.iter().filter(|r| r["kind"] == "propose").collect();
    assert_eq!(
        proposes.len(),
        2,
        "one proposal, one retry after the rejection"
    );
    assert!(proposes[1]["rejected"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("cooperative"));
    // Without a GPU the agent's accepted candidate is what got compiled.
    assert_eq!(c["patterns"][0]["realization"]["how"], "compiled");
    let space0 = &proposes[0]["space"][0];
    let name = fact::kinds::gemm::space::KernelSpec::name(
        &serde_json::from_value(space0.clone()).unwrap(),
    );
    assert!(dir
        .path()
        .join("out/sweeps")
        .read_dir()
        .unwrap()
        .flatten()
        .any(|d| d.path().join("src").join(format!("{name}.cu")).is_file()));

    // The same compose with an agent that stops answering: the built-in agent finishes the job.
    let silent = dir.path().join("silent.jsonl");
    let out = fact()
        .env("FACT_TABLE", dir.path().join("t.json"))
        .env("FACT_SHIPPED_TABLE", dir.path().join("none.json"))
        .args([
            "compose",
            "--json",
            "--candidates",
            "1",
            "--agent-timeout",
            "1",
            "--out",
        ])
        .arg(dir.path().join("out2"))
        .arg(fixture("linear.pt"))
        .args(["--agent", &agent_cmd("sleep-on-rank", &silent)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = &v["compose"];
    assert_eq!(c["agent"], "builtin");
    assert!(
        c["agent_notes"][0]
            .as_str()
            .unwrap()
            .contains("did not answer within 1s while ranking"),
        "{}",
        c["agent_notes"]
    );
    assert_eq!(
        c["patterns"][0]["realization"]["how"], "compiled",
        "the work went on"
    );
}
