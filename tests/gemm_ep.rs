//! The fused GEMM + epilogue op at the TorchScript boundary: a pattern of several nodes rewritten
//! into one fact::gemm_ep call, and the op's fallback (the GEMM, then the epilogue program run
//! with aten ops) computing what the replaced nodes computed. Fixtures: linear_ep.pt,
//! `r + gelu(fc(x), approximate="tanh") * 0.5`; minigpt.pt; conv1d_mlp.pt, GPT-2's MLP on Conv1D.

use crate::common::{build_options, fixture};
use fact::graph::Graph;
use fact::graph::{Edit, Operand};
use fact::nvcc::{self, Toolchain};
use fact::torch;
use std::path::Path;
use tch::{CModule, Kind, Tensor};

const EPILOGUE: &str = "leaves=full;v1=gelu_tanh(v0);v2=mul(v1,0.5);v3=add(l0,v2)";
const EPILOGUE_NO_LEAVES: &str = "leaves=;v1=gelu_tanh(v0);v2=mul(v1,0.5)";

fn node(g: &Graph, kind: &str) -> usize {
    let found: Vec<usize> = (0..g.nodes.len())
        .filter(|&i| g.nodes[i].kind == kind)
        .collect();
    assert_eq!(found.len(), 1, "one {kind} in the fixture");
    found[0]
}

/// The fused call for linear → gelu → mul, ending at `last` ("aten::add" takes the residual as a
/// full leaf, "aten::mul" leaves the add in the graph and passes no leaves).
fn ep_edit(g: &Graph, last: &str, epilogue: &str) -> Edit {
    let linear = node(g, "aten::linear");
    let mut inner = vec![
        (linear, "aten::linear"),
        (node(g, "aten::gelu"), "aten::gelu"),
    ];
    if last == "aten::add" {
        inner.push((node(g, "aten::mul"), "aten::mul"));
    }
    let end = node(g, last);
    let leaves: Vec<usize> = if last == "aten::add" {
        vec![g.nodes[end].inputs[0]]
    } else {
        vec![]
    };
    let lin = &g.nodes[linear].inputs;
    Edit {
        node: end as u32,
        expect_kind: last.to_string(),
        op: "fact::gemm_ep".to_string(),
        operands: vec![
            Operand::value(lin[0]),
            Operand::value(lin[1]),
            Operand::value(lin[2]),
            Operand::values(&leaves),
            Operand::text("linear"),
            Operand::text(epilogue),
            Operand::text("none"),
        ],
        remove: inner.iter().map(|(n, _)| *n as u32).collect(),
        remove_kinds: inner.iter().map(|(_, k)| k.to_string()).collect(),
        ..Default::default()
    }
}

fn rewrite(edit: Edit, out: &Path) -> Result<String, String> {
    torch::rewrite_and_save(
        &fixture("linear_ep.pt"),
        out,
        &[edit],
        &fact::kinds::registry::op_schemas(),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn a_multi_node_edit_replaces_the_pattern_by_one_gemm_ep_call() {
    let (g, _) = torch::load_graph(&fixture("linear_ep.pt"), &[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fused.pt");
    let saved = rewrite(ep_edit(&g, "aten::add", EPILOGUE), &out).unwrap();
    // The archive loads again (rewrite_and_save registered the schemas in this process).
    let text = torch::graph_text(&out).unwrap();
    for t in [&saved, &text] {
        assert_eq!(t.matches("fact::gemm_ep(").count(), 1, "{t}");
        for gone in [
            "aten::linear",
            "aten::gelu",
            "aten::mul",
            "aten::add",
            "\"tanh\"",
        ] {
            assert!(!t.contains(gone), "{gone} left in\n{t}");
        }
        assert!(t.contains("Tensor[] = prim::ListConstruct(%r"), "{t}");
    }

    let out = dir.path().join("no_leaves.pt");
    let text = rewrite(ep_edit(&g, "aten::mul", EPILOGUE_NO_LEAVES), &out).unwrap();
    assert!(
        text.contains("Tensor[] = prim::ListConstruct()"),
        "an empty leaf list: {text}"
    );
    assert!(
        text.contains("aten::add") && !text.contains("aten::gelu"),
        "{text}"
    );
}

/// Every pattern compose finds in a GPT block, rewritten at once: the proj pattern's output (its
/// residual add) is the out pattern's residual leaf, so one edit reads a value another replaced.
#[test]
fn compose_edits_of_a_whole_block_chain_through_each_other() {
    let (g, _) = torch::load_graph(&fixture("minigpt.pt"), &[]).unwrap();
    let found = fact::kinds::registry::match_patterns(&g);
    let matches = &found.of::<fact::kinds::gemm::GemmMatch>();
    let fused = matches.iter().filter(|m| m.epilogue.is_some()).count();
    assert_eq!(
        (matches.len(), fused),
        (4, 3),
        "qkv; fc + gelu, proj + residual, out + residual"
    );
    // The attention (q·kᵀ, div, the inverted causal mask, softmax, ·v) is one pattern.
    assert_eq!(
        found.of::<fact::kinds::attention::AttentionMatch>().len(),
        1
    );
    let a = found.of::<fact::kinds::attention::AttentionMatch>()[0];
    assert!(
        a.form().starts_with("explicit;div=") && a.form().ends_with(";mask=not"),
        "{}",
        a.form()
    );
    assert!(a.problem.causal);
    // Both LayerNorms are their own patterns; the qkv linear and the fc linear read their outputs.
    assert_eq!(
        found.of::<fact::kinds::layernorm::LayerNormMatch>().len(),
        2
    );
    let mut edits: Vec<Edit> = matches
        .iter()
        .map(|m| fact::kinds::gemm::edit(&g, m, "k"))
        .collect();
    edits.push(fact::kinds::attention::edit(&g, a, "a"));
    edits.extend(
        found
            .of::<fact::kinds::layernorm::LayerNormMatch>()
            .iter()
            .map(|l| fact::kinds::layernorm::edit(&g, l, "n")),
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("block.pt");
    let text = torch::rewrite_and_save(
        &fixture("minigpt.pt"),
        &out,
        &edits,
        &fact::kinds::registry::op_schemas(),
    )
    .unwrap();
    assert_eq!(
        (
            text.matches("fact::gemm_ep(").count(),
            text.matches("fact::gemm(").count()
        ),
        (3, 1),
        "{text}"
    );
    assert_eq!(text.matches("fact::attention(").count(), 1, "{text}");
    assert_eq!(text.matches("fact::layernorm(").count(), 2, "{text}");
    for gone in [
        "aten::linear",
        "aten::gelu",
        "aten::matmul",
        "aten::div(",
        "aten::softmax",
        "aten::masked_fill",
        "aten::bitwise_not",
        "aten::layer_norm",
    ] {
        assert!(!text.contains(gone), "{gone} left in\n{text}");
    }
    // `c // h` and its square root stay on the host wherever the module is loaded: the traced 0-d
    // tensor constant they divided by (moved to the GPU by map_location="cuda", which made the
    // view's aten::Int wait for the stream) is now a NumToTensor of the same number.
    assert!(
        !text.contains("prim::Constant[value={"),
        "a tensor constant is left\n{text}"
    );
    let divides: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("aten::floor_divide("))
        .collect();
    assert!(!divides.is_empty(), "{text}");
    for line in divides {
        let operand = line
            .split("aten::floor_divide(")
            .nth(1)
            .unwrap()
            .split([',', ')'])
            .nth(1)
            .unwrap()
            .trim();
        let producer = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{operand} :")))
            .unwrap_or("");
        assert!(
            producer.contains("prim::NumToTensor"),
            "{line}: {operand} comes from `{producer}`"
        );
    }
    assert!(
        torch::graph_text(&out).is_ok(),
        "the composed block loads again"
    );
}

#[test]
fn a_multi_node_edit_refuses_escaping_values_and_other_kinds() {
    let (g, _) = torch::load_graph(&fixture("linear_ep.pt"), &[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bad.pt");

    // The mul stays, so the gelu's output is still used when the gelu is to be removed.
    let mut e = ep_edit(&g, "aten::add", EPILOGUE);
    let mul = node(&g, "aten::mul") as u32;
    let at = e.remove.iter().position(|&n| n == mul).unwrap();
    e.remove.remove(at);
    e.remove_kinds.remove(at);
    let err = rewrite(e, &out).unwrap_err();
    let gelu = node(&g, "aten::gelu");
    assert!(
        err.contains(&format!("node {gelu} (aten::gelu) is still used"))
            && err.contains("aten::mul"),
        "{err}"
    );

    let mut e = ep_edit(&g, "aten::add", EPILOGUE);
    e.remove_kinds[0] = "aten::matmul".into();
    let err = rewrite(e, &out).unwrap_err();
    assert!(
        err.contains("(aten::linear) is not the expected aten::matmul"),
        "{err}"
    );

    let mut e = ep_edit(&g, "aten::add", EPILOGUE);
    e.remove_kinds.pop();
    assert!(rewrite(e, &out).unwrap_err().contains("kinds"));
    assert!(!out.exists(), "nothing is saved on error");
}

fn forward(m: &CModule, x: &Tensor, r: &Tensor) -> Result<Tensor, String> {
    tch::no_grad(|| m.forward_ts(&[x.shallow_clone(), r.shallow_clone()]))
        .map_err(|e| e.to_string())
}

/// The op library loaded into this test process (a process holds one: the other tests that run
/// composed modules do so in Python child processes).
#[test]
fn gemm_ep_falls_back_to_the_original_ops_on_cpu() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let _calls_are_ours = crate::common::own_op_registrations();
    let dir = tempfile::tempdir().unwrap();
    let built = nvcc::build_library(
        &tc,
        &[crate::compile::good_spec()],
        "libep.so",
        &build_options(dir.path(), 2),
    )
    .unwrap();
    torch::load_op_library(&built.library).unwrap();
    torch::op_stats(&built.library, true).unwrap();

    let (g, _) = torch::load_graph(&fixture("linear_ep.pt"), &[]).unwrap();
    let original = CModule::load(fixture("linear_ep.pt")).unwrap();
    let x = Tensor::randn([32, 64], (Kind::Float, tch::Device::Cpu));
    let r = Tensor::randn([32, 128], (Kind::Float, tch::Device::Cpu));
    let want = forward(&original, &x, &r).unwrap();
    for (last, epilogue) in [("aten::add", EPILOGUE), ("aten::mul", EPILOGUE_NO_LEAVES)] {
        let out = dir.path().join("composed.pt");
        rewrite(ep_edit(&g, last, epilogue), &out).unwrap();
        let got = forward(&CModule::load(&out).unwrap(), &x, &r).unwrap();
        assert_eq!(got.size(), want.size());
        let diff = (&got - &want).abs().max().double_value(&[]);
        assert!(diff <= 1e-6, "{epilogue}: max difference {diff}");
    }
    // Both calls fell back (CPU tensors), and the library says so.
    let calls = torch::op_stats(&built.library, false).unwrap();
    let total: Vec<(u64, u64)> = calls.values().map(|c| (c.ran, c.fell_back)).collect();
    assert_eq!(total, vec![(0, 2)], "{calls:?}");

    let out = dir.path().join("malformed.pt");
    rewrite(ep_edit(&g, "aten::add", "leaves=full;v1=frob(v0)"), &out).unwrap();
    let err = forward(&CModule::load(&out).unwrap(), &x, &r).unwrap_err();
    assert!(
        err.contains("malformed epilogue 'leaves=full;v1=frob(v0)': unknown epilogue op 'frob'"),
        "{err}"
    );

    // A whole block, attention and LayerNorms included, recomputes the original on CPU tensors:
    // the attention op's fallback replays the graph's own ops (its divisor is the tensor tracing
    // computed), the LayerNorm op's the same layer_norm call.
    torch::op_stats(&built.library, true).unwrap();
    let (g, _) = torch::load_graph(&fixture("minigpt.pt"), &[]).unwrap();
    let found = fact::kinds::registry::match_patterns(&g);
    assert_eq!(
        found.of::<fact::kinds::attention::AttentionMatch>()[0].form(),
        "explicit;div=tensor;mask=not"
    );
    let mut edits: Vec<Edit> = found
        .of::<fact::kinds::gemm::GemmMatch>()
        .iter()
        .map(|m| fact::kinds::gemm::edit(&g, m, "k"))
        .collect();
    edits.push(fact::kinds::attention::edit(
        &g,
        found.of::<fact::kinds::attention::AttentionMatch>()[0],
        "a",
    ));
    edits.extend(
        found
            .of::<fact::kinds::layernorm::LayerNormMatch>()
            .iter()
            .map(|l| fact::kinds::layernorm::edit(&g, l, "n")),
    );
    let out = dir.path().join("block.pt");
    torch::rewrite_and_save(
        &fixture("minigpt.pt"),
        &out,
        &edits,
        &fact::kinds::registry::op_schemas(),
    )
    .unwrap();
    let x = Tensor::randn([2, 16, 32], (Kind::Float, tch::Device::Cpu));
    let run = |m: &CModule| tch::no_grad(|| m.forward_ts(&[x.shallow_clone()])).unwrap();
    let (want, got) = (
        run(&CModule::load(fixture("minigpt.pt")).unwrap()),
        run(&CModule::load(&out).unwrap()),
    );
    let diff = (&got - &want).abs().max().double_value(&[]);
    assert!(diff <= 1e-5, "composed block differs by {diff}");
    let calls = torch::op_stats(&built.library, false).unwrap();
    assert_eq!(
        calls.get("a").map(|c| (c.ran, c.fell_back)),
        Some((0, 1)),
        "{calls:?}"
    );
    assert_eq!(
        calls
            .get("n")
            .map(|c| (c.ran, c.fell_back, c.why.as_deref())),
        Some((0, 2, Some("not CUDA tensors of one device"))),
        "{calls:?}"
    );
    conv1d_mlp_falls_back_to_what_its_views_computed(&built.library, dir.path());
    convnext_blocks_turn_through_their_permute(&built.library, dir.path());
    coheres_written_norms_replay_their_ops(&built.library, dir.path());
    crate::attention::composed_sdpa_falls_back_exactly(&built.library);
    crate::grn::composed_grn_falls_back_exactly(&built.library);
}

/// GPT-2's MLP on Conv1D (conv1d_mlp.pt): each GEMM reads x's rows through a view, and its
/// pattern takes the view back, eval dropout, a residual met in the flattened rows ([B*T, C]) and
/// a scale expanded over [B, T, C]. The composed module computes the original's function, at the
/// traced shape and at another (the views' sizes are read from x at run time, as the op's output
/// shape is).
fn conv1d_mlp_falls_back_to_what_its_views_computed(library: &Path, dir: &Path) {
    torch::op_stats(library, true).unwrap();
    let model = fixture("conv1d_mlp.pt");
    let (g, _) = torch::load_graph(&model, &[]).unwrap();
    let found = fact::kinds::registry::match_patterns(&g);
    let shapes: Vec<(Vec<i64>, String)> = found
        .of::<fact::kinds::gemm::GemmMatch>()
        .iter()
        .map(|m| {
            let e = m.epilogue.as_ref().expect("both GEMMs fused");
            (
                g.tensor(m.operand_a()).unwrap().shape.clone(),
                e.epilogue.text(),
            )
        })
        .collect();
    assert_eq!(
        shapes,
        [
            (vec![2, 8, 64], "leaves=;v1=mul(v0,0.5);v2=pow(v0,3.0);v3=mul(v2,0.044715);v4=add(v0,v3);v5=mul(v4,0.7978845608028654);v6=tanh(v5);v7=add(v6,1.0);v8=mul(v1,v7)".to_string()),
            (vec![2, 8, 256], "leaves=full,row;v1=add(v0,l0);v2=mul(v1,l1)".to_string()),
        ]
    );
    let edits: Vec<Edit> = found
        .of::<fact::kinds::gemm::GemmMatch>()
        .iter()
        .map(|m| fact::kinds::gemm::edit(&g, m, "c"))
        .collect();
    let out = dir.join("conv1d_mlp.pt");
    let text = torch::rewrite_and_save(&model, &out, &edits, &fact::kinds::registry::op_schemas())
        .unwrap();
    assert_eq!(text.matches("fact::gemm_ep(").count(), 2, "{text}");
    for gone in [
        "aten::addmm",
        "aten::view(",
        "aten::dropout",
        "aten::expand_as",
        "aten::tanh",
        "aten::mul(",
    ] {
        assert!(!text.contains(gone), "{gone} left in\n{text}");
    }
    let (original, composed) = (CModule::load(&model).unwrap(), CModule::load(&out).unwrap());
    for (b, t) in [(2, 8), (3, 5)] {
        let cpu = (Kind::Float, tch::Device::Cpu);
        let inputs = [
            Tensor::randn([b, t, 64], cpu),
            Tensor::randn([b * t, 64], cpu),
            Tensor::randn([64], cpu),
        ];
        let run = |m: &CModule| {
            tch::no_grad(|| m.forward_ts(&inputs.each_ref().map(Tensor::shallow_clone))).unwrap()
        };
        let (want, got) = (run(&original), run(&composed));
        assert_eq!(got.size(), [b, t, 64]);
        // The same ops on the same values; CPU sgemm rounds by its buffers' alignment, which
        // differs between the two modules' runs (one ulp of outputs near 8).
        let diff = (&got - &want).abs().max().double_value(&[]);
        assert!(diff <= 1e-5, "B {b}, T {t}: differs by {diff}");
    }
    let calls = torch::op_stats(library, false).unwrap();
    assert_eq!(
        calls.get("c").map(|c| (c.ran, c.fell_back)),
        Some((0, 4)),
        "{calls:?}"
    );
}

/// The zoo's ConvNeXt as traced: each block's second linear takes the permute back to NCHW, the
/// layer scale ([C, 1, 1]) and the residual added in place (`gemm_ep` with origin
/// `linear;perm=0,3,1,2`). Composed, with every other pattern left to torch, the module computes
/// the original's output on the CPU through the op's fallback, which reads the leaves permuted
/// back and returns its output permuted.
fn convnext_blocks_turn_through_their_permute(library: &Path, dir: &Path) {
    torch::op_stats(library, true).unwrap();
    let model = crate::common::zoo_fixtures().join("convnext_tiny.pt");
    let (g, _) = torch::load_graph(&model, &[]).unwrap();
    let found = fact::kinds::registry::match_patterns(&g);
    let turned: Vec<&fact::kinds::gemm::GemmMatch> = found
        .of::<fact::kinds::gemm::GemmMatch>()
        .into_iter()
        .filter(|m| m.epilogue.as_ref().is_some_and(|e| e.order.is_some()))
        .collect();
    assert_eq!(turned.len(), 4, "one block per stage");
    let edits: Vec<Edit> = turned
        .iter()
        .map(|m| fact::kinds::gemm::edit(&g, m, "t"))
        .collect();
    let out = dir.join("convnext_tiny.pt");
    let text = torch::rewrite_and_save(&model, &out, &edits, &fact::kinds::registry::op_schemas())
        .unwrap();
    assert_eq!(text.matches("\"linear;perm=0,3,1,2\"").count(), 4, "{text}");
    assert!(!text.contains("aten::add_("), "{text}");
    let shape = g.tensor(g.inputs[1]).unwrap().shape.clone();
    let x = Tensor::randn(shape.as_slice(), (Kind::Float, tch::Device::Cpu));
    let run = |p: &Path| {
        tch::no_grad(|| CModule::load(p).unwrap().forward_ts(&[x.shallow_clone()])).unwrap()
    };
    let (want, got) = (run(&model), run(&out));
    assert_eq!(got.size(), want.size());
    let diff = (&got - &want).abs().max().double_value(&[]);
    assert!(diff <= 1e-4, "convnext differs by {diff}");
    let calls = torch::op_stats(library, false).unwrap();
    assert_eq!(
        calls.get("t").map(|c| (c.ran, c.fell_back)),
        Some((0, 4)),
        "{calls:?}"
    );
}

/// The zoo's Cohere as traced: each LayerNorm written out (`layernorm::Spelling::Written`)
/// rewritten to `fact::layernorm_written` (kernel "w", not in the library), every other pattern
/// left to torch. On the CPU the op replays the graph's ops: the outputs are the original's.
fn coheres_written_norms_replay_their_ops(library: &Path, dir: &Path) {
    use fact::kinds::layernorm::{LayerNormMatch, Spelling};
    torch::op_stats(library, true).unwrap();
    let model = crate::common::zoo_fixtures().join("cohere.pt");
    let (g, _) = torch::load_graph(&model, &[]).unwrap();
    let found = fact::kinds::registry::match_patterns(&g);
    let written: Vec<&LayerNormMatch> = found
        .of::<LayerNormMatch>()
        .into_iter()
        .filter(|m| matches!(m.spelling, Spelling::Written { .. }))
        .collect();
    assert_eq!(written.len(), 3, "two layers' norms and the final one");
    let edits: Vec<Edit> = written
        .iter()
        .map(|m| fact::kinds::layernorm::edit(&g, m, "w"))
        .collect();
    let out = dir.join("cohere.pt");
    let text = torch::rewrite_and_save(&model, &out, &edits, &fact::kinds::registry::op_schemas())
        .unwrap();
    assert_eq!(
        text.matches("fact::layernorm_written(").count(),
        3,
        "{text}"
    );
    assert!(!text.contains("aten::rsqrt"), "{text}");
    let ids = Tensor::randint(1024, [1, 64], (Kind::Int64, tch::Device::Cpu));
    let diff = crate::common::outputs_differ_by(&model, &out, &[ids]);
    assert!(diff <= 1e-6, "cohere differs by {diff}");
    let calls = torch::op_stats(library, false).unwrap();
    assert_eq!(
        calls.get("w").map(|c| (c.ran, c.fell_back)),
        Some((0, 3)),
        "{calls:?}"
    );
}

/// An edit whose op returns two tensors: the gelu's output and the mul's are taken over by one
/// call's two outputs (the call where the later of them, the mul, was), and the add reads the
/// second. An output read before that point cannot be taken over, and says so.
#[test]
fn an_edit_with_two_outputs_replaces_two_nodes_by_one_call() {
    let (g, _) = torch::load_graph(&fixture("linear_ep.pt"), &[]).unwrap();
    let schema = "pair_probe(Tensor x, Tensor w) -> (Tensor, Tensor)";
    let linear = node(&g, "aten::linear");
    let lin = &g.nodes[linear].inputs;
    let edit = |first: usize, second: usize, remove: &[usize]| Edit {
        node: first as u32,
        expect_kind: g.nodes[first].kind.clone(),
        op: "fact::pair_probe".to_string(),
        operands: vec![Operand::value(lin[0]), Operand::value(lin[1])],
        remove: remove.iter().map(|&n| n as u32).collect(),
        remove_kinds: remove.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        outputs: vec![second as u32],
        output_kinds: vec![g.nodes[second].kind.clone()],
        first: false,
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pair.pt");
    let (gelu, mul) = (node(&g, "aten::gelu"), node(&g, "aten::mul"));
    let text = torch::rewrite_and_save(
        &fixture("linear_ep.pt"),
        &out,
        &[edit(gelu, mul, &[linear])],
        &[schema],
    )
    .unwrap();
    assert_eq!(text.matches("fact::pair_probe(").count(), 1, "{text}");
    for gone in ["aten::linear", "aten::gelu", "aten::mul"] {
        assert!(!text.contains(gone), "{gone} left in\n{text}");
    }
    // `%a : Tensor, %b : Tensor = fact::pair_probe(..)`, and the add reads %b.
    let line = text
        .lines()
        .find(|l| l.contains("fact::pair_probe("))
        .unwrap();
    let names: Vec<&str> = line
        .split(" = ")
        .next()
        .unwrap()
        .split(',')
        .map(|o| o.trim().split(' ').next().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{line}");
    let add_line = text.lines().find(|l| l.contains("aten::add(")).unwrap();
    assert!(
        add_line.contains(&format!("{},", names[1]))
            || add_line.contains(&format!("{})", names[1])),
        "the add reads the call's second output: {add_line}\n{text}"
    );
    assert!(
        !add_line.contains(&format!("{},", names[0]))
            && !add_line.contains(&format!("{})", names[0]))
    );
    assert!(torch::graph_text(&out)
        .unwrap()
        .contains("fact::pair_probe("));

    // The linear's output is read by the gelu, which stays and comes before the mul.
    let err = torch::rewrite_and_save(
        &fixture("linear_ep.pt"),
        &dir.path().join("bad.pt"),
        &[edit(linear, mul, &[])],
        &[schema],
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("(aten::linear) is read (by aten::gelu) before the call"),
        "{err}"
    );
}
