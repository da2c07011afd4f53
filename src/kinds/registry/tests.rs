//! The registry's rules together: the cover between kinds, on text graphs (one copied from a
//! traced GPT-2 block).

use super::*;
use crate::graph::ValueId;
use crate::kinds::attention::AttentionMatch;
use crate::kinds::attention::ATTENTION;
use crate::kinds::gemm::*;
use crate::kinds::gemm::{EPILOGUE, GEMM};
use crate::kinds::layernorm::{LayerNormMatch, LayerNormProblem, LAYERNORM};
use crate::kinds::rmsnorm::RMSNORM;
use crate::kinds::rows::RowReads;
use crate::rules::*;
use crate::types::Arch;
use std::collections::BTreeSet;

#[test]
fn a_rule_id_names_its_familys_problem() {
    use crate::types::DType::Bf16;
    let kind =
        |rule: &str, dims: &[i64]| problem_from_rule(rule, dims, Bf16).map(|p| p.pattern_kind());
    assert_eq!(kind("gemm_rcr_bias", &[64, 64, 64]), Ok(GEMM));
    assert_eq!(kind("bmm_rrr", &[2, 64, 64, 64]), Ok(GEMM));
    assert_eq!(kind("sdpa_causal", &[1, 2, 64, 64, 64]), Ok(ATTENTION));
    assert_eq!(kind("layernorm_affine", &[64, 768]), Ok(LAYERNORM));
    // A family's own parser says what is wrong with its shape; an unknown id lists them all.
    assert!(kind("sdpa", &[64, 64, 64])
        .unwrap_err()
        .contains("BxHxTqxTkxD"));
    assert_eq!(kind("rmsnorm_cast_weight", &[4096, 2048]), Ok(RMSNORM));
    assert_eq!(
        kind("conv2d_s1_p1_d1_bias_add_relu", &[32, 56, 56, 64, 64, 3, 3]),
        Ok(crate::kinds::conv::CONV)
    );
    let e = kind("groupnorm", &[64, 768]).unwrap_err();
    assert!(
        e.contains("gemm_LAYOUT")
            && e.contains("sdpa_causal")
            && e.contains("layernorm_bias")
            && e.contains("rmsnorm_weight1p")
            && e.contains("conv2d_s<stride>"),
        "{e}"
    );
}

#[test]
fn a_convolution_problem_reads_back_as_the_convolution_kinds_alone() {
    use crate::kinds::conv::{ConvAct, ConvProblem, CONV};
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
        dtype: crate::types::DType::Bf16,
        bias: true,
        residual: true,
        act: Some(ConvAct::Relu),
    };
    let json = serde_json::to_string(&Problem::from(p.clone())).unwrap();
    let back: Problem = serde_json::from_str(&json).unwrap();
    assert_eq!(back.pattern_kind(), CONV);
    assert_eq!(back.get::<ConvProblem>(), Some(&p));
    // No other kind's problem parses as a convolution's, nor the other way round.
    for k in KINDS.iter().filter(|k| k.name() != "conv") {
        assert!(
            k.problem_from_json(serde_json::from_str(&json).unwrap())
                .is_err(),
            "{}",
            k.name()
        );
    }
    let ln = serde_json::to_value(LayerNormProblem {
        rows: 8,
        cols: 8,
        dtype: crate::types::DType::F32,
        weight: true,
        bias: true,
        add: None,
    })
    .unwrap();
    assert!(crate::kinds::conv::Conv.problem_from_json(ln).is_err());
}

/// The node producing the value named `name`.
fn node(g: &Graph, name: &str) -> NodeId {
    g.values[value(g, name)].producer.expect("a produced value")
}

fn value(g: &Graph, name: &str) -> ValueId {
    g.values
        .iter()
        .position(|v| v.name == name)
        .unwrap_or_else(|| panic!("no value %{name}"))
}

/// Whether the nodes are one piece through the values they pass each other.
fn connected(g: &Graph, nodes: &[NodeId]) -> bool {
    let inside: BTreeSet<NodeId> = nodes.iter().copied().collect();
    let mut seen = BTreeSet::from([nodes[0]]);
    let mut todo = vec![nodes[0]];
    while let Some(n) = todo.pop() {
        for &m in &inside {
            let linked = |a: NodeId, b: NodeId| {
                g.nodes[a]
                    .outputs
                    .iter()
                    .any(|o| g.nodes[b].inputs.contains(o))
            };
            if !seen.contains(&m) && (linked(n, m) || linked(m, n)) {
                seen.insert(m);
                todo.push(m);
            }
        }
    }
    seen == inside
}

/// Every pattern node of the cover, checking none is in two patterns.
fn covered(chosen: &[Candidate]) -> BTreeSet<NodeId> {
    let mut all = BTreeSet::new();
    for c in chosen {
        for &n in &c.site.nodes {
            assert!(all.insert(n), "node {n} is in two patterns");
        }
    }
    all
}

#[test]
fn the_registry_has_a_rule_for_every_kind_under_its_own_name() {
    for k in pattern_kinds() {
        assert!(
            rules().iter().any(|r| r.kind() == k),
            "no rule finds {k} patterns"
        );
    }
    let names: BTreeSet<&str> = rules().iter().map(|r| r.name()).collect();
    assert_eq!(names.len(), rules().len(), "two rules share a name");
}

/// A match of the tests' own, as hand-made sites give it.
#[derive(Debug)]
struct Nodes(Vec<NodeId>);

impl Match for Nodes {
    fn nodes(&self) -> Vec<NodeId> {
        self.0.clone()
    }
}

#[test]
fn every_kind_has_a_letter_of_its_own() {
    // A plan id is the kind's letter and an index: two kinds sharing a letter name two patterns
    // alike, and compose realizes one of them twice and the other never.
    let mut seen = std::collections::BTreeMap::new();
    for k in KINDS {
        if let Some(other) = seen.insert(k.letter(), k.name()) {
            panic!(
                "kinds {other} and {} both use the letter {}",
                k.name(),
                k.letter()
            );
        }
    }
}

#[test]
fn the_cover_takes_the_largest_gain_first_and_no_node_twice() {
    let site = |rule: &'static str, nodes: &[NodeId], products: usize, bytes: f64| Candidate {
        rule,
        kind: EPILOGUE,
        site: Site {
            nodes: nodes.to_vec(),
            inputs: vec![],
            outputs: vec![],
            gain: Gain { products, bytes },
        },
        found: Box::new(Nodes(nodes.to_vec())),
    };
    let chosen = cover(vec![
        site("a", &[1, 2], 0, 10.0),
        site("b", &[2, 3], 0, 20.0),
        site("c", &[4], 0, 5.0),
        // A product outranks any bytes: d, not c, takes node 4.
        site("d", &[4, 5], 1, 0.0),
        site("e", &[6], 0, 0.0),
        // Equal gains: the one starting earlier.
        site("g", &[8], 0, 3.0),
        site("f", &[7, 8], 0, 3.0),
    ]);
    let got: Vec<&str> = chosen.iter().map(|c| c.rule).collect();
    assert_eq!(got, ["b", "d", "e", "f"], "in graph order");
    assert_eq!(covered(&chosen), BTreeSet::from([2, 3, 4, 5, 6, 7, 8]));
}

#[test]
fn a_site_is_its_nodes_inputs_outputs_and_the_traffic_it_removes() {
    // A chain of two ops after a linear, with a residual leaf.
    let g = Graph::parse(
        "graph(%x: f32[8,16], %w: f32[32,16], %r: f32[8,32]):
           %none = prim::Constant[None]()
           %one = prim::Constant[1]()
           %a = aten::linear(%x, %w, %none) : f32[8,32]
           %s = aten::add(%a, %r, %one) : f32[8,32]
           %y = aten::relu(%s) : f32[8,32]
           return (%y)",
    )
    .unwrap();
    let fused = &candidates(&g, &[&EpilogueRule])[0];
    let s = &fused.site;
    assert_eq!(s.nodes, [node(&g, "a"), node(&g, "s"), node(&g, "y")]);
    assert_eq!(s.inputs, [value(&g, "x"), value(&g, "w"), value(&g, "r")]);
    assert_eq!(s.outputs, [value(&g, "y")]);
    // a and s stay on chip: each written once and read once, 8·32 f32 each.
    assert_eq!(
        s.gain,
        Gain {
            products: 1,
            bytes: 2.0 * 2.0 * 8.0 * 32.0 * 4.0
        }
    );
    let plain = &candidates(&g, &[&GemmRule])[0].site;
    assert_eq!(
        (plain.outputs.as_slice(), plain.gain.bytes),
        ([value(&g, "a")].as_slice(), 0.0)
    );
    assert!(s.gain > plain.gain);
}

/// A causal attention over [1,1,8,64] whose ·v feeds a mul and an add: an epilogue that, by
/// bytes alone (D = 64 against Tk = 8), would remove more traffic than the attention.
const ATTENTION_THEN_EPILOGUE: &str =
    "graph(%q: f32[1,1,8,64], %k: f32[1,1,8,64], %v: f32[1,1,8,64], %m: bool[8,8], %r: f32[1,1,8,64]):
       %m1 = prim::Constant[-1]()
       %m2 = prim::Constant[-2]()
       %one = prim::Constant[1]()
       %ninf = prim::Constant[-inf]()
       %none = prim::Constant[None]()
       %c = prim::Constant[0.125]()
       %two = prim::Constant[2.0]()
       %kt = aten::transpose(%k, %m2, %m1) : f32[1,1,64,8]
       %s0 = aten::matmul(%q, %kt) : f32[1,1,8,8]
       %s1 = aten::mul(%s0, %c) : f32[1,1,8,8]
       %nm = aten::bitwise_not(%m) : bool[8,8]
       %s2 = aten::masked_fill(%s1, %nm, %ninf) : f32[1,1,8,8]
       %p = aten::softmax(%s2, %m1, %none) : f32[1,1,8,8]
       %o = aten::matmul(%p, %v) : f32[1,1,8,64]
       %o2 = aten::mul(%o, %two) : f32[1,1,8,64]
       %y = aten::add(%o2, %r, %one) : f32[1,1,8,64]
       return (%y)";

#[test]
fn an_attentions_products_are_not_gemm_patterns() {
    let g = Graph::parse(ATTENTION_THEN_EPILOGUE).unwrap();
    let all = candidates(&g, &rules());
    let (qk, pv) = (node(&g, "s0"), node(&g, "o"));
    let attention = all
        .iter()
        .find(|c| c.kind == ATTENTION)
        .expect("the attention matches");
    let fused_pv = all
        .iter()
        .find(|c| c.kind == EPILOGUE && c.site.nodes[0] == pv)
        .expect("·v has an epilogue of its own");
    assert!(
        fused_pv.site.gain.bytes > attention.site.gain.bytes,
        "the products decide, not the bytes"
    );
    for n in [qk, pv] {
        assert!(
            all.iter().any(|c| c.kind == GEMM && c.site.nodes == [n]),
            "each product is a GEMM match too"
        );
    }
    assert!(all.iter().all(|c| connected(&g, &c.site.nodes)));
    let found = match_patterns(&g);
    assert_eq!(found.of::<AttentionMatch>().len(), 1);
    assert!(
        found.of::<GemmMatch>().is_empty(),
        "{:?}",
        found.of::<GemmMatch>()
    );
    let a = found.of::<AttentionMatch>()[0];
    assert!(a.nodes.contains(&qk) && a.nodes.contains(&pv));
    let site = Match::site(a, &g);
    let inputs: BTreeSet<ValueId> = site.inputs.iter().copied().collect();
    let want: BTreeSet<ValueId> = ["q", "k", "v", "m"].map(|v| value(&g, v)).into();
    assert_eq!(
        (inputs, site.outputs.as_slice()),
        (want, [value(&g, "o")].as_slice())
    );
}

/// A rule of the tests' own, registered nowhere: each relu alone, and each relu with the relu
/// it reads when nothing else reads that one.
struct Relus;

impl Rule for Relus {
    fn name(&self) -> &'static str {
        "relus"
    }
    fn kind(&self) -> PatternKind {
        EPILOGUE
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        let uses = g.use_counts();
        let relu = |n: NodeId| g.nodes[n].kind == "aten::relu" && g.nodes[n].depth == 0;
        let mut found = Vec::new();
        for n in (0..g.nodes.len()).filter(|&n| relu(n)) {
            found.push(Nodes(vec![n]));
            let x = g.nodes[n].inputs[0];
            if let Some(p) = g.values[x].producer.filter(|&p| relu(p) && uses[x] == 1) {
                found.push(Nodes(vec![p, n]));
            }
        }
        boxed(found)
    }
}

#[test]
fn a_rule_outside_the_registry_takes_part_in_the_cover() {
    let g = Graph::parse(
        "graph(%x: f32[8,16], %w: f32[32,16]):
           %none = prim::Constant[None]()
           %a = aten::relu(%x) : f32[8,16]
           %b = aten::relu(%a) : f32[8,16]
           %h = aten::linear(%b, %w, %none) : f32[8,32]
           %c = aten::relu(%h) : f32[8,32]
           return (%c)",
    )
    .unwrap();
    let rules: Vec<&dyn Rule> = rules().into_iter().chain([&Relus as _]).collect();
    let all = candidates(&g, &rules);
    assert_eq!(all.iter().filter(|c| c.rule == "relus").count(), 4);
    let chosen = cover(all);
    let got: Vec<(&str, Vec<NodeId>)> = chosen
        .iter()
        .map(|c| (c.rule, c.site.nodes.clone()))
        .collect();
    // The pair of relus removes a's traffic, so it beats either relu alone; the relu after
    // the linear is its epilogue's, which holds a product.
    let n = |v| node(&g, v);
    assert_eq!(
        got,
        [
            ("relus", vec![n("a"), n("b")]),
            ("epilogue", vec![n("h"), n("c")])
        ]
    );
    covered(&chosen);
}

#[test]
fn pattern_kinds_parse_by_name_and_problems_know_theirs() {
    for k in pattern_kinds() {
        assert_eq!(k.name().parse::<PatternKind>().unwrap(), k);
    }
    assert!("groupnorm"
        .parse::<PatternKind>()
        .unwrap_err()
        .contains("use one of gemm, epilogue, attention, layernorm, rmsnorm"));
    let mut p = GemmProblem {
        m: 8,
        n: 8,
        k: 8,
        layout: GemmLayout::Rcr,
        dtype: crate::types::DType::F32,
        bias: true,
        batch: 1,
        epilogue: None,
        padded_from: None,
    };
    assert_eq!(Problem::from(p.clone()).pattern_kind(), GEMM);
    p.epilogue = Some(Epilogue::parse("leaves=;v1=relu(v0)").unwrap());
    assert_eq!(Problem::from(p).pattern_kind(), EPILOGUE);
    let ln = Problem::from(LayerNormProblem {
        rows: 8,
        cols: 8,
        dtype: crate::types::DType::F32,
        weight: false,
        bias: false,
        add: None,
    });
    assert_eq!(
        (ln.pattern_kind(), ln.pattern_kind().name()),
        (LAYERNORM, "layernorm")
    );
}

#[test]
fn a_layernorm_between_gemms_is_its_own_pattern() {
    // A residual add before the LayerNorm (the first linear's epilogue), a linear reading it.
    let g = Graph::parse(
        "graph(%x: f32[8,32], %w: f32[32,32], %v: f32[64,32], %g: f32[32], %b: f32[32]):
           %none = prim::Constant[None]()
           %one = prim::Constant[1]()
           %eps = prim::Constant[1e-05]()
           %on = prim::Constant[True]()
           %c = prim::Constant[32]()
           %shape = prim::ListConstruct(%c)
           %a = aten::linear(%x, %w, %none) : f32[8,32]
           %s = aten::add(%a, %x, %one) : f32[8,32]
           %n = aten::layer_norm(%s, %shape, %g, %b, %eps, %on) : f32[8,32]
           %y = aten::linear(%n, %v, %none) : f32[8,64]
           %r = aten::relu(%y) : f32[8,64]
           return (%r)",
    )
    .unwrap();
    let found = match_patterns(&g);
    assert_eq!(found.of::<LayerNormMatch>().len(), 1);
    let ln = found.of::<LayerNormMatch>()[0];
    assert_eq!(
        (
            g.nodes[ln.node].kind.as_str(),
            ln.problem.rule_id().as_str()
        ),
        ("aten::layer_norm", "layernorm_affine")
    );
    assert_eq!(found.of::<GemmMatch>().len(), 2);
    let texts: Vec<String> = found
        .of::<GemmMatch>()
        .iter()
        .map(|m| {
            m.epilogue
                .as_ref()
                .map(|e| e.epilogue.text())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(texts, ["leaves=full;v1=add(v0,l0)", "leaves=;v1=relu(v0)"]);
    assert_eq!(
        g.values[found.of::<GemmMatch>()[1].a].name,
        "n",
        "the second linear reads the LayerNorm's output"
    );
    assert!(
        found
            .of::<GemmMatch>()
            .iter()
            .all(|m| !m.nodes().contains(&ln.node)),
        "no GEMM pattern claims the LayerNorm"
    );
}

#[test]
fn two_epilogues_claiming_one_node_leave_one_gemm_plain() {
    // The add joins two linears: each sees the other's output as a full-size leaf.
    let g = Graph::parse(
        "graph(%x: f32[8,16], %w: f32[32,16], %z: f32[8,16], %v: f32[32,16]):
           %none = prim::Constant[None]()
           %one = prim::Constant[1]()
           %a = aten::linear(%x, %w, %none) : f32[8,32]
           %b = aten::linear(%z, %v, %none) : f32[8,32]
           %r = aten::relu(%b) : f32[8,32]
           %y = aten::add(%a, %r, %one) : f32[8,32]
           return (%y)",
    )
    .unwrap();
    let found = match_patterns(&g);
    let m = found.of::<GemmMatch>();
    assert_eq!(m.len(), 2);
    // The second linear's pattern (relu, add) fuses more than the first's (add): it wins.
    assert!(m[0].epilogue.is_none() && m[0].problem.epilogue.is_none());
    assert_eq!(
        m[1].epilogue.as_ref().unwrap().epilogue.text(),
        "leaves=full;v1=relu(v0);v2=add(l0,v1)"
    );
    let mut nodes: Vec<usize> = m.iter().flat_map(|m| m.nodes()).collect();
    let n = nodes.len();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), n, "no node in two patterns");
}

/// One GPT-2 block as a traced `GPT2LMHeadModel` reads (transformers 5.17, B 2, T 64).
const GPT2_BLOCK: &str = include_str!("testdata/gpt2_block.graph");

#[test]
fn a_gpt2_block_fuses_its_gelu_and_residual_adds_through_the_conv1d_views() {
    let g = Graph::parse(GPT2_BLOCK).unwrap();
    let found = match_patterns(&g);
    assert_eq!(found.of::<LayerNormMatch>().len(), 2);
    let name = |v: ValueId| g.values[v].name.clone();
    let made = |n: NodeId| name(g.nodes[n].outputs[0]);
    // (the tensor the op reads as a, the epilogue, its leaves, its nodes, its output) per GEMM.
    let got: Vec<_> = found
        .of::<GemmMatch>()
        .iter()
        .map(|m| {
            let e = m.epilogue.as_ref();
            (
                name(m.operand_a()),
                e.map(|e| e.epilogue.text()).unwrap_or_default(),
                e.map(|e| e.leaves.iter().map(|&l| name(l)).collect::<Vec<_>>()),
                m.nodes().into_iter().map(made).collect::<Vec<_>>(),
            )
        })
        .collect();
    let strs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(got.len(), 4, "{got:#?}");
    // c_attn: addmm → view → split, a GEMM alone on its own 2-D operand.
    assert_eq!(got[0], ("111".into(), String::new(), None, strs(&["x.6"])));
    // attn.c_proj: reads the heads merged back (the contiguous before its view is read by
    // size nodes too, so it stays), takes view → dropout → add, the residual read through
    // the embeddings' dropout.
    assert_eq!(
        got[1],
        (
            "138".into(),
            "leaves=full;v1=add(v0,l0)".into(),
            Some(strs(&["input0.1"])),
            strs(&["x0.1", "146", "149", "attn_output.1", "input.1"])
        )
    );
    // c_fc: the whole written-out tanh GELU, its output [B,T,3072].
    assert_eq!(
        got[2],
        (
            "x.10".into(),
            "leaves=;v1=mul(v0,0.5);v2=pow(v0,3.0);v3=mul(v2,0.044715);v4=add(v0,v3);v5=mul(v4,0.7978845608028654);v6=tanh(v5);v7=add(v6,1.0);v8=mul(v1,v7)".into(),
            Some(vec![]),
            strs(&["x.2", "164", "167", "168", "169", "170", "171", "172", "173", "174", "175"])
        )
    );
    let gelu = found.of::<GemmMatch>()[2].epilogue.as_ref().unwrap().output;
    assert_eq!(g.tensor(gelu).unwrap().shape, [2, 64, 3072]);
    // mlp.c_proj: reads the GELU's output, takes view → dropout → add.
    assert_eq!(
        got[3],
        (
            "175".into(),
            "leaves=full;v1=add(l0,v0)".into(),
            Some(strs(&["input.1"])),
            strs(&["x.1", "182", "185", "feed_forward_hidden_states.1", "187"])
        )
    );
    // Nothing left in the graph reads a value a pattern removes: each pattern hands back its
    // output alone.
    let chosen = cover(candidates(&g, &rules()));
    let all = covered(&chosen);
    for c in &chosen {
        let last = *c.site.nodes.last().unwrap();
        assert_eq!(c.site.outputs, g.nodes[last].outputs, "{}", made(last));
    }
    for (i, n) in g.nodes.iter().enumerate().filter(|(i, _)| !all.contains(i)) {
        for &v in &n.inputs {
            if let Some(p) = g.values[v].producer.filter(|p| all.contains(p)) {
                assert!(
                    chosen.iter().any(|c| c.site.outputs.contains(&v)),
                    "{} ({}) reads {} of a pattern's {}",
                    made(i),
                    n.kind,
                    name(v),
                    made(p)
                );
            }
        }
    }
}

#[test]
fn a_view_moves_no_bytes_in_the_cover() {
    // The same GEMM and relu, once as GPT-2's Conv1D (view, addmm, view back), once as a
    // linear over [2,8,16]: the views add nothing to the traffic the pattern removes.
    let conv1d = Graph::parse(
        "graph(%x: f32[2,8,16], %w: f32[16,32], %b: f32[32]):
           %one = prim::Constant[1]()
           %m1 = prim::Constant[-1]()
           %c2 = prim::Constant[2]()
           %c8 = prim::Constant[8]()
           %c16 = prim::Constant[16]()
           %c32 = prim::Constant[32]()
           %s2 = prim::ListConstruct(%m1, %c16)
           %s3 = prim::ListConstruct(%c2, %c8, %c32)
           %x2 = aten::view(%x, %s2) : f32[16,16]
           %h2 = aten::addmm(%b, %x2, %w, %one, %one) : f32[16,32]
           %h = aten::view(%h2, %s3) : f32[2,8,32]
           %y = aten::relu(%h) : f32[2,8,32]
           return (%y)",
    )
    .unwrap();
    let linear = Graph::parse(
        "graph(%x: f32[2,8,16], %w: f32[32,16], %b: f32[32]):
           %h = aten::linear(%x, %w, %b) : f32[2,8,32]
           %y = aten::relu(%h) : f32[2,8,32]
           return (%y)",
    )
    .unwrap();
    let site = |g: &Graph| {
        let chosen = cover(candidates(g, &rules()));
        assert_eq!(chosen.len(), 1);
        assert_eq!(chosen[0].kind, EPILOGUE);
        chosen[0].site.clone()
    };
    let (a, b) = (site(&conv1d), site(&linear));
    assert_eq!(a.nodes.len(), 4, "both views are the pattern's");
    assert_eq!(
        (a.gain.products, a.gain.bytes),
        (b.gain.products, b.gain.bytes)
    );
}

#[test]
fn torch_op_render_is_golden() {
    expect_test::expect_file!["../../../tests/golden/fact_torch_op.cpp"]
        .assert_eq(&render_torch_op(Arch::Sm90).text);
}

#[test]
fn the_attention_op_hands_lengths_to_padded_kernels_alone_and_the_mask_under_capture() {
    let text = render_torch_op(Arch::Sm90).text;
    // Every class has lengths (none: Tk, causal: min(Tq, Tk)), but only a padded kernel takes
    // them: sm90's others refuse any, so handing them over would send every causal call back to
    // torch's ops.
    assert!(
        text.contains("                           padded ? fact_tensor(lengths) : FactTensor{},")
    );
    // Under capture a mask read anew each forward is never a classification hit (a graph input's
    // replays hold other values); a padded kernel gets lengths computed on the device and the mask.
    assert!(text.contains("  if (!by_shape && capturing()) return std::nullopt;"));
    assert!(text.contains(
        "      cells = mask_cells(f, *mask, q.dim(), b, h, tq, tk, q.scalar_type(), why);"
    ));
    assert!(text.contains(
        "      lengths = lengths_in_capture(*mask, mask_mode(f), q.dim(), b, h, tq, tk);"
    ));
    assert!(text.contains(
        "bias.defined() ? fact_tensor(bias) : cells.defined() ? fact_tensor(cells) : FactTensor{}};"
    ));
    // The mask's bool dtype reaches the kernels as FACT_BOOL.
    assert!(text.contains("s == at::kBool     ? FACT_BOOL"));
}

#[test]
fn the_op_library_runs_its_kernels_where_its_arch_runs() {
    let sm80 = render_torch_op(Arch::Sm80).text;
    assert!(sm80.contains(
        "return (props.major == 8 && props.minor == 0) || (props.major == 9 && props.minor == 0);"
    ));
    assert!(sm80.contains("\"not a device of compute capability 8.0 or 9.0 (an sm80 library)\""));
    assert!(render_torch_op(Arch::Sm90)
        .text
        .contains("return (props.major == 9 && props.minor == 0);"));
}

#[test]
fn the_op_library_has_every_kinds_section_ops_and_switches() {
    let text = render_torch_op(Arch::Sm90).text;
    for kind in KINDS {
        for op in kind.ops() {
            assert!(
                text.contains(&format!(
                    "m.def(\"{}\", {{at::Tag::pt2_compliant_tag",
                    op.schema
                )) && text.contains(&format!("TORCH_FN({})));", op.function))
                    && op
                        .meta
                        .is_some_and(|meta| text.contains(&format!("TORCH_FN({meta})));"))),
                "{}: {}",
                kind.name(),
                op.name
            );
        }
    }
    // Attention reads its inputs in any layout, so Inductor realizes the mask every layer's call
    // reads once; the other ops keep torch's default (exact strides).
    let flexible: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("at::Tag::flexible_layout}"))
        .collect();
    assert_eq!(flexible.len(), 1, "{flexible:?}");
    assert!(
        flexible[0].contains("m.def(\"attention(")
            && flexible[0].ends_with("{at::Tag::pt2_compliant_tag, at::Tag::flexible_layout});"),
        "{}",
        flexible[0]
    );
    let names: Vec<&str> = pattern_kinds().iter().map(|k| k.name()).collect();
    assert_eq!(
        names,
        [
            "gemm",
            "epilogue",
            "attention",
            "layernorm",
            "rmsnorm",
            "rotary",
            "glu",
            "patch",
            "conv",
            "grn",
            "siblings"
        ]
    );
    // The frame's memo switch follows the kinds'; its ops follow theirs.
    assert!(text.contains("enum KindBit : unsigned { kGemmKind = 1, kEpilogueKind = 2, kAttentionKind = 4, kLayernormKind = 8, kRmsnormKind = 16, kRotaryKind = 32, kGluKind = 64, kPatchKind = 128, kConvKind = 256, kGrnKind = 512, kSiblingsKind = 1024, kMemoKind = 2048, kAllKinds = 4095 };"));
    assert!(text.contains(
        "names no pattern kind (gemm, epilogue, attention, layernorm, rmsnorm, rotary, glu, patch, conv, grn, siblings, memo, all); every fact op falls back"
    ));
    for op in codegen::FRAME_OPS {
        assert!(
            text.contains(&format!("m.def(\"{}\");", op.schema))
                && text.contains(&format!("TORCH_FN({})));", op.function)),
            "{}",
            op.name
        );
    }
    assert_eq!(
        op_schemas().len(),
        KINDS.iter().map(|k| k.ops().len()).sum::<usize>() + codegen::FRAME_OPS.len()
    );
}

#[test]
fn only_sm90_attention_units_take_fast_math_and_examples_88() {
    use crate::kinds::attention::AttentionSpec;
    use crate::kinds::layernorm::LayerNormSpec;
    use crate::types::{DType, MathType};
    let attention = |family| -> Spec {
        AttentionSpec {
            arch: Arch::Sm90,
            dtype: DType::Bf16,
            math: MathType::Bf16,
            queries_per_block: 128,
            keys_per_block: 128,
            max_k: 128,
            family,
            bias: false,
        }
        .into()
    };
    let sm90 = attention(crate::kinds::attention::AttentionFamily::Sm90 {
        schedule: crate::kinds::attention::Sm90Schedule::Cooperative,
        causal: false,
        overlap: false,
        prefetch_q: false,
        key_lengths: false,
    })
    .unit();
    assert!(sm90.flags.contains(&"--use_fast_math"), "{sm90:?}");
    assert!(
        sm90.cutlass_includes.contains(&"examples/88_hopper_fmha"),
        "{sm90:?}"
    );
    let gemm: Spec = crate::kinds::gemm::space::gemm_candidates(
        &GemmProblem {
            m: 64,
            n: 64,
            k: 64,
            layout: GemmLayout::Rrr,
            dtype: DType::F32,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        },
        MathType::Tf32,
        Arch::Sm90,
    )
    .remove(0)
    .into();
    let layernorm: Spec = LayerNormSpec {
        arch: Arch::Sm90,
        dtype: DType::F32,
        cols: 768,
        threads_per_row: 32,
        vector: 4,
        rows_per_cta: 4,
        add: None,
        reads: RowReads::InTurn,
    }
    .into();
    for other in [
        gemm,
        layernorm,
        attention(crate::kinds::attention::AttentionFamily::Sm80),
    ] {
        let u = other.unit();
        assert!(
            u.flags.is_empty() && u.cutlass_includes.is_empty(),
            "{}: {u:?}",
            other.name()
        );
    }
}

#[test]
fn one_dispatch_table_lists_every_kind_in_the_order_given() {
    use crate::kinds::attention::{AttentionFamily, AttentionSpec};
    use crate::kinds::layernorm::LayerNormSpec;
    use crate::types::{DType, MathType};
    let attention: Spec = AttentionSpec {
        arch: Arch::Sm90,
        dtype: DType::F32,
        math: MathType::Tf32,
        queries_per_block: 32,
        keys_per_block: 128,
        max_k: 128,
        family: AttentionFamily::Sm80,
        bias: false,
    }
    .into();
    let gemm: Spec = crate::kinds::gemm::space::gemm_candidates(
        &GemmProblem {
            m: 4096,
            n: 4096,
            k: 4096,
            layout: GemmLayout::Rcr,
            dtype: DType::F32,
            bias: true,
            batch: 1,
            epilogue: None,
            padded_from: None,
        },
        MathType::Tf32,
        Arch::Sm90,
    )
    .remove(0)
    .into();
    let layernorm: Spec = LayerNormSpec {
        arch: Arch::Sm90,
        dtype: DType::F32,
        cols: 768,
        threads_per_row: 32,
        vector: 4,
        rows_per_cta: 4,
        add: None,
        reads: RowReads::InTurn,
    }
    .into();
    let d =
        crate::kinds::render_dispatch(&[attention.clone(), gemm.clone(), layernorm.clone()]).text;
    let at = |s: &Spec, kind: &str| {
        d.find(&format!("{{\"{}\", \"{kind}\"", s.name()))
            .unwrap_or_else(|| panic!("{} in\n{d}", s.name()))
    };
    assert!(at(&attention, "attention") < at(&gemm, "gemm"));
    assert!(at(&gemm, "gemm") < at(&layernorm, "layernorm"));
}

/// The rule ids of the patterns the cover keeps, in order.
fn rule_ids(found: &Patterns) -> Vec<String> {
    let mut ids: Vec<(NodeId, String)> = found
        .found
        .iter()
        .map(|f| (f.node(), f.problem().rule_id()))
        .collect();
    ids.sort();
    ids.into_iter().map(|(_, r)| r).collect()
}

#[test]
fn a_residual_add_a_gemm_reaches_is_the_gemms_epilogue_not_the_norms() {
    // Copied from `torch.jit.trace` of a bf16 LlamaForCausalLM (transformers 5.17): o_proj, the
    // residual add, the post-attention RMSNorm, the sum read again as the MLP's residual. Both
    // the GEMM's epilogue and the norm's add claim the add: the GEMM's takes it (one product
    // replaced), and it is also the cheaper: o_proj writes the sum once, where with the add in
    // the norm kernel it would write its output for that kernel to read back.
    let g = Graph::parse(
        "graph(%input.2: bf16[2,8,64], %weight.5: bf16[64,64], %34: bf16[2,8,64], %weight.11: bf16[64], %236: bf16[2,8,64]):
           %6 = prim::Constant[False]()
           %8 = prim::Constant[None]()
           %9 = prim::Constant[-1]()
           %12 = prim::Constant[15]()
           %13 = prim::Constant[6]()
           %20 = prim::Constant[{1e-6}]()
           %21 = prim::Constant[True]()
           %22 = prim::Constant[2]()
           %23 = prim::Constant[1]()
           %214 = aten::linear(%input.2, %weight.5, %8) : bf16[2,8,64]
           %hidden_states.2 = aten::add(%34, %214, %23) : bf16[2,8,64]
           %hidden_states0.3 = aten::to(%hidden_states.2, %13, %6, %6, %8) : f32[2,8,64]
           %218 = aten::pow(%hidden_states0.3, %22) : f32[2,8,64]
           %219 = prim::ListConstruct(%9)
           %variance.3 = aten::mean(%218, %219, %21, %8) : f32[2,8,1]
           %221 = aten::add(%variance.3, %20, %23) : f32[2,8,1]
           %222 = aten::rsqrt(%221) : f32[2,8,1]
           %hidden_states1.3 = aten::mul(%hidden_states0.3, %222) : f32[2,8,64]
           %224 = aten::to(%hidden_states1.3, %12, %6, %6, %8) : bf16[2,8,64]
           %input.4 = aten::mul(%weight.11, %224) : bf16[2,8,64]
           %hidden_states0.2 = aten::add(%hidden_states.2, %236, %23) : bf16[2,8,64]
           return (%input.4, %hidden_states0.2)",
    )
    .unwrap();
    let all = candidates(&g, &rules());
    let gain = |rule: &str| {
        all.iter()
            .find(|c| {
                let p = crate::kinds::registry::KINDS
                    .iter()
                    .find(|k| k.pattern_kinds().contains(&c.kind))
                    .unwrap()
                    .problem_of(&*c.found);
                p.rule_id().starts_with(rule)
            })
            .map(|c| c.site.gain)
            .unwrap_or_else(|| panic!("no {rule} candidate"))
    };
    let (epilogue, add_norm) = (gain("gemm_rcr_ep_add"), gain("add_rmsnorm"));
    assert!(epilogue.products == 1 && add_norm.products == 0 && add_norm.bytes > 0.0);
    assert!(epilogue > add_norm);
    assert_eq!(
        rule_ids(&match_patterns(&g))
            .iter()
            .map(|r| r.split("_ep_add").next().unwrap())
            .collect::<Vec<_>>(),
        ["gemm_rcr", "rmsnorm_cast_weight"]
    );
}

#[test]
fn an_add_no_gemm_reaches_goes_with_the_norm_after_it() {
    // The zoo's OPT (fp32, batch 1): the embeddings' sum, the first self_attn_layer_norm, the sum
    // as the first residual. The add with the norm keeps the sum's read by the norm on chip, so
    // it outranks the norm alone.
    let g = Graph::parse(
        "graph(%46: f32[1,64,768], %pos_embeds.1: f32[1,64,768], %weight.12: f32[768], %bias.8: f32[768], %hidden_states.5: f32[1,64,768]):
           %20 = prim::Constant[True]()
           %21 = prim::Constant[1e-05]()
           %25 = prim::Constant[1]()
           %c = prim::Constant[768]()
           %input0.6 = aten::add(%46, %pos_embeds.1, %25) : f32[1,64,768]
           %104 = prim::ListConstruct(%c)
           %hidden_states.3 = aten::layer_norm(%input0.6, %104, %weight.12, %bias.8, %21, %20) : f32[1,64,768]
           %hidden_states0.2 = aten::add(%input0.6, %hidden_states.5, %25) : f32[1,64,768]
           return (%hidden_states.3, %hidden_states0.2)",
    )
    .unwrap();
    let found = match_patterns(&g);
    assert_eq!(rule_ids(&found), ["add_layernorm_affine_sum"]);
    let ln = found.of::<LayerNormMatch>()[0];
    let site = ln.site(&g);
    assert_eq!(
        site.gain.bytes,
        64.0 * 768.0 * 4.0,
        "the norm's read of the sum"
    );
    assert_eq!(
        site.outputs,
        [value(&g, "input0.6"), value(&g, "hidden_states.3")],
        "the sum and y"
    );
    let edit = found.found[0].edit(&g, "k");
    assert_eq!(
        (edit.op.as_str(), edit.outputs.len(), edit.remove.len()),
        ("fact::layernorm_add_sum", 1, 0)
    );
}

#[test]
fn the_cover_takes_the_group_over_its_members_only_when_asked() {
    use crate::kinds::siblings::rule::tests::{parse, projections};
    let g = parse(&projections("bf16", 2048, &[2048, 512, 512], false, ""));
    let rules = |p: &crate::kinds::Patterns| -> Vec<String> {
        p.found.iter().map(|f| f.problem().rule_id()).collect()
    };
    // Off by default: three plain GEMMs, as before the kind.
    assert_eq!(rules(&match_patterns(&g)), ["gemm_rcr"; 3]);
    let on = match_patterns_with(
        &g,
        &MatchOptions {
            fuse_siblings: true,
            ..MatchOptions::default()
        },
    );
    assert_eq!(rules(&on), ["siblings_rcr"]);
    assert_eq!(on.found[0].id, "s0");
}
