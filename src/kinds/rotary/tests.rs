//! Rotary matcher tests from text graphs written as the traces of transformers 5.17 write them
//! (LlamaForCausalLM and Qwen2ForCausalLM: halves on q and k; GPTNeoXForCausalLM: partial halves
//! on views of the fused qkv; GPTJForCausalLM: partial pairs on [B, T, H, D] behind full slices),
//! and the cover against the GEMM kind's rules.

use super::*;
use crate::graph::Graph;
use crate::kinds::{match_kinds, Patterns};
use crate::rules::Match;

/// The cover of `g` by the rotary and GEMM kinds' rules.
fn match_patterns(g: &Graph) -> Patterns {
    match_kinds(g, &[&crate::kinds::gemm::Gemm, &Rotary])
}

const CONSTANTS: &str = "
   %zero = prim::Constant[0]()
   %one = prim::Constant[1]()
   %two = prim::Constant[2]()
   %three = prim::Constant[3]()
   %m1 = prim::Constant[-1]()
   %m2 = prim::Constant[-2]()
   %max = prim::Constant[9223372036854775807]()
   %t2 = prim::Constant[{2}]()";

/// `rotate_half` of `x` ([1,H,8,W] with strides `st`), named after `p`, as Llama's trace writes
/// it: the half computed from the size at run time.
fn rotate_half(p: &str, x: &str, h: i64, w: i64, st: &str) -> String {
    let half = w / 2;
    format!(
        "
   %{p}n = aten::size(%{x}, %three)
   %{p}nt = prim::NumToTensor(%{p}n)
   %{p}h = aten::floor_divide(%{p}nt, %t2)
   %{p}hi = aten::Int(%{p}h)
   %{p}x1 = aten::slice(%{x}, %three, %zero, %{p}hi, %one) : f32[1,{h},8,{half}]{st}
   %{p}x2 = aten::slice(%{x}, %three, %{p}hi, %max, %one) : f32[1,{h},8,{half}]{st}
   %{p}neg = aten::neg(%{p}x2) : f32[1,{h},8,{half}]
   %{p}l = prim::ListConstruct(%{p}neg, %{p}x1)
   %{p}rot = aten::cat(%{p}l, %m1) : f32[1,{h},8,{w}]"
    )
}

/// Llama's attention inputs: q [1,4,8,16] and k [1,2,8,16] (transposed views of the
/// projections), cos and sin [1,1,8,16] unsqueezed from [1,8,16]; `cos_k` names the cos that k
/// is rotated by, `extra` goes before the return.
fn llama(cos_k: &str, extra: &str, ret: &str) -> Graph {
    Graph::parse(&llama_text(cos_k, extra, ret)).unwrap()
}

fn llama_text(cos_k: &str, extra: &str, ret: &str) -> String {
    let q = "{512,16,64,1}";
    let k = "{256,16,32,1}";
    let text = format!(
        "graph(%hq: f32[1,8,64], %hk: f32[1,8,32], %c: f32[1,8,16], %s: f32[1,8,16], %c2: f32[1,8,16]):{CONSTANTS}
   %four = prim::Constant[4]()
   %sixteen = prim::Constant[16]()
   %eight = prim::Constant[8]()
   %shq = prim::ListConstruct(%one, %eight, %four, %sixteen)
   %shk = prim::ListConstruct(%one, %eight, %two, %sixteen)
   %qv = aten::view(%hq, %shq) : f32[1,8,4,16]
   %q = aten::transpose(%qv, %one, %two) : f32[1,4,8,16]{q}
   %kv = aten::view(%hk, %shk) : f32[1,8,2,16]
   %k = aten::transpose(%kv, %one, %two) : f32[1,2,8,16]{k}
   %cos = aten::unsqueeze(%c, %one) : f32[1,1,8,16]
   %sin = aten::unsqueeze(%s, %one) : f32[1,1,8,16]
   %cos2 = aten::unsqueeze(%c2, %one) : f32[1,1,8,16]
   %qc = aten::mul(%q, %cos) : f32[1,4,8,16]{q}{rq}
   %qs = aten::mul(%qrot, %sin) : f32[1,4,8,16]
   %qe = aten::add(%qc, %qs, %one) : f32[1,4,8,16]{q}
   %kc = aten::mul(%k, %{cos_k}) : f32[1,2,8,16]{k}{rk}
   %ks = aten::mul(%krot, %sin) : f32[1,2,8,16]
   %ke = aten::add(%kc, %ks, %one) : f32[1,2,8,16]{k}{extra}
   return ({ret})",
        rq = rotate_half("q", "q", 4, 16, q),
        rk = rotate_half("k", "k", 2, 16, k),
    );
    text
}

fn name(g: &Graph, v: usize) -> &str {
    &g.values[v].name
}

fn producing(g: &Graph, value: &str) -> usize {
    let v = g.values.iter().position(|v| v.name == value).unwrap();
    g.values[v].producer.unwrap()
}

#[test]
fn llama_q_and_k_by_the_same_cos_and_sin_are_one_pattern_with_two_outputs() {
    let g = llama("cos", "", "%qe, %ke");
    let m = match_rotary(&g);
    assert_eq!(m.len(), 3, "q alone, k alone, and the pair: {m:#?}");
    let pair = m.iter().find(|m| m.k.is_some()).unwrap();
    let k = pair.k.as_ref().unwrap();
    assert_eq!(
        (
            name(&g, pair.q.x),
            name(&g, k.x),
            name(&g, pair.q.cos),
            name(&g, pair.q.sin)
        ),
        ("q", "k", "cos", "sin")
    );
    assert_eq!(
        pair.problem,
        RotaryProblem {
            batch: 1,
            heads_q: 4,
            heads_k: 2,
            seq: 8,
            head_dim: 16,
            rotary_dim: 16,
            dtype: DType::F32,
            form: Form::Halves,
        }
    );
    assert_eq!(pair.problem.rule_id(), "rotary_halves_qk");
    assert_eq!(pair.problem.shape_key(), "1x4x2x8x16x16");
    // Rows in q's order (the transposed view's), not packed.
    assert_eq!(pair.layout(), 0);
    // Each rotation: the two slices, neg, list, cat, two muls and the add, and the size
    // arithmetic only its slices read; the transposes stay.
    assert_eq!(pair.q.nodes.len(), 12);
    assert_eq!(pair.nodes().len(), 24);
    let kinds: Vec<&str> = pair
        .nodes()
        .iter()
        .map(|&n| g.nodes[n].kind.as_str())
        .collect();
    assert!(
        !kinds.contains(&"aten::transpose") && kinds.contains(&"aten::Int"),
        "{kinds:?}"
    );

    // The cover takes the pair; the edit calls rotary_qk in place of q's add and takes over k's.
    let found = match_patterns(&g);
    let rot = found.of::<RotaryMatch>();
    assert_eq!(rot.len(), 1);
    assert!(rot[0].k.is_some());
    let f = found
        .found
        .iter()
        .find(|f| f.kind.name() == "rotary")
        .unwrap();
    assert_eq!(f.id, "e0");
    let e = f.edit(&g, "rope_k");
    assert_eq!(e.op, "fact::rotary_qk");
    assert_eq!(e.node as usize, producing(&g, "qe"));
    assert_eq!(e.outputs, [producing(&g, "ke") as u32]);
    assert_eq!(e.output_kinds, ["aten::add"]);
    assert_eq!(e.operands.len(), 8);
    assert_eq!(
        [
            e.operands[4].int_value,
            e.operands[5].int_value,
            e.operands[6].int_value
        ],
        [16, 0, 0],
        "rotary_dim, halves, rows in x's order"
    );
    assert_eq!(e.operands[7].text, "rope_k");
}

#[test]
fn rotations_by_another_cos_are_patterns_alone() {
    // k rotated by another cos: two single patterns.
    let g = llama("cos2", "", "%qe, %ke");
    let m = match_rotary(&g);
    assert_eq!(m.len(), 2);
    assert!(m.iter().all(|m| m.k.is_none()));
    let found = match_patterns(&g);
    let f = found
        .found
        .iter()
        .find(|f| f.kind.name() == "rotary")
        .unwrap();
    let e = f.edit(&g, "rope_q");
    assert_eq!((e.op.as_str(), e.outputs.len()), ("fact::rotary", 0));
    assert_eq!(
        e.operands.iter().map(|o| o.int_value).collect::<Vec<_>>()[3..6],
        [16, 0, 0]
    );

    // Both rotations read only after the later one: still a pair.
    let g = llama(
        "cos",
        "\n   %early = aten::relu(%qe) : f32[1,4,8,16]\n   %late = aten::relu(%ke) : f32[1,2,8,16]",
        "%early, %late",
    );
    assert!(
        match_rotary(&g).iter().any(|m| m.k.is_some()),
        "read after both: a pair"
    );
}

#[test]
fn cos_and_sin_computed_again_the_same_way_still_pair() {
    // GPT-J computes k's cos from the same tensor again: equal values, distinct nodes.
    let again = |how: &str| {
        let text = llama_text("cos2", "", "%qe, %ke").replace("aten::unsqueeze(%c2, %one)", how);
        Graph::parse(&text).unwrap()
    };
    let m = match_rotary(&again("aten::unsqueeze(%c, %one)"));
    assert!(
        m.iter().any(|m| m.k.is_some()),
        "the same unsqueeze of c: a pair"
    );
    // Another dim, or another tensor: another cos, no pair.
    for how in ["aten::unsqueeze(%c, %two)", "aten::unsqueeze(%s, %one)"] {
        assert!(
            match_rotary(&again(how)).iter().all(|m| m.k.is_none()),
            "{how}"
        );
    }
}

#[test]
fn a_reader_between_the_two_rotations_keeps_them_apart() {
    // q's rotated value read by a node before k's rotation.
    let q = "{512,16,64,1}";
    let k = "{256,16,32,1}";
    let text = format!(
        "graph(%q: f32[1,4,8,16]{q}, %k: f32[1,2,8,16]{k}, %cos: f32[1,1,8,16], %sin: f32[1,1,8,16]):{CONSTANTS}
   %qc = aten::mul(%q, %cos) : f32[1,4,8,16]{q}{rq}
   %qs = aten::mul(%qrot, %sin) : f32[1,4,8,16]
   %qe = aten::add(%qc, %qs, %one) : f32[1,4,8,16]{q}
   %early = aten::relu(%qe) : f32[1,4,8,16]
   %kc = aten::mul(%k, %cos) : f32[1,2,8,16]{k}{rk}
   %ks = aten::mul(%krot, %sin) : f32[1,2,8,16]
   %ke = aten::add(%kc, %ks, %one) : f32[1,2,8,16]{k}
   return (%early, %ke)",
        rq = rotate_half("q", "q", 4, 16, q),
        rk = rotate_half("k", "k", 2, 16, k),
    );
    let g = Graph::parse(&text).unwrap();
    let m = match_rotary(&g);
    assert_eq!(m.len(), 2, "{m:#?}");
    assert!(m.iter().all(|m| m.k.is_none()));
}

#[test]
fn operand_orders_and_misfits() {
    // cos · q and sin · rot, the add's operands swapped: the same rotation.
    let q = "{512,16,64,1}";
    let body = |cos: &str, x2_end: &str, alpha: &str, ret: &str| {
        format!(
            "graph(%q: f32[1,4,8,16]{q}, %cos: f32[1,1,8,16], %sin: f32[1,1,8,16], %ch: f32[1,4,8,16], %cb: bf16[1,1,8,16]):{CONSTANTS}
   %eight = prim::Constant[8]()
   %x1 = aten::slice(%q, %m1, %zero, %eight, %one) : f32[1,4,8,8]{q}
   %x2 = aten::slice(%q, %m1, %eight, {x2_end}, %one) : f32[1,4,8,8]{q}
   %neg = aten::neg(%x2) : f32[1,4,8,8]
   %l = prim::ListConstruct(%neg, %x1)
   %rot = aten::cat(%l, %three) : f32[1,4,8,16]
   %qc = aten::mul({cos}, %q) : f32[1,4,8,16]{q}
   %qs = aten::mul(%sin, %rot) : f32[1,4,8,16]
   %qe = aten::add(%qs, %qc, {alpha}) : f32[1,4,8,16]{q}
   return ({ret})"
        )
    };
    let g = Graph::parse(&body("%cos", "%max", "%one", "%qe")).unwrap();
    let m = match_rotary(&g);
    assert_eq!(m.len(), 1);
    assert_eq!((name(&g, m[0].q.cos), name(&g, m[0].q.sin)), ("cos", "sin"));
    for (cos, end, alpha, ret, why) in [
        ("%ch", "%max", "%one", "%qe", "cos per head"),
        ("%cb", "%max", "%one", "%qe", "cos of another dtype"),
        ("%cos", "%max", "%two", "%qe", "alpha 2"),
        (
            "%cos",
            "%eight",
            "%one",
            "%qe",
            "x2 not known to run to the end",
        ),
        ("%cos", "%max", "%one", "%qe, %rot", "rot(q) read outside"),
    ] {
        let g = Graph::parse(&body(cos, end, alpha, ret)).unwrap();
        assert!(match_rotary(&g).is_empty(), "{why}");
    }
}

/// GPT-NeoX (Pythia): q and k are chunks of the fused qkv ([1,4,8,48] viewed, transposed), the
/// first 4 of each head of 16 rotated, the rest passed, the results concatenated back (packed).
#[test]
fn neox_partial_rotary_on_views_of_the_fused_qkv() {
    let st = "{1536,48,192,1}";
    let text = format!(
        "graph(%qkv: f32[1,8,192], %c: f32[1,8,4], %s: f32[1,8,4]):{CONSTANTS}
   %four = prim::Constant[4]()
   %rd = aten::Int(%c)
   %sh = prim::ListConstruct(%one, %four, %m1, %four)
   %v = aten::view(%qkv, %sh) : f32[1,8,4,48]
   %t = aten::transpose(%v, %one, %two) : f32[1,4,8,48]{{1536,48,192,1}}
   %ch = aten::chunk(%t, %three, %m1)
   %q, %k, %val = prim::ListUnpack(%ch) : f32[1,4,8,16]{st}, f32[1,4,8,16]{st}, f32[1,4,8,16]{st}
   %cos = aten::unsqueeze(%c, %one) : f32[1,1,8,4]
   %sin = aten::unsqueeze(%s, %one) : f32[1,1,8,4]
   %q_rot = aten::slice(%q, %three, %zero, %rd, %one) : f32[1,4,8,4]{st}
   %q_pass = aten::slice(%q, %three, %rd, %max, %one) : f32[1,4,8,12]{st}
   %k_rot = aten::slice(%k, %three, %zero, %rd, %one) : f32[1,4,8,4]{st}
   %k_pass = aten::slice(%k, %three, %rd, %max, %one) : f32[1,4,8,12]{st}
   %qc = aten::mul(%q_rot, %cos) : f32[1,4,8,4]{rq}
   %qs = aten::mul(%qrot, %sin) : f32[1,4,8,4]
   %q_embed = aten::add(%qc, %qs, %one) : f32[1,4,8,4]{{128,4,16,1}}
   %kc = aten::mul(%k_rot, %cos) : f32[1,4,8,4]{rk}
   %ks = aten::mul(%krot, %sin) : f32[1,4,8,4]
   %k_embed = aten::add(%kc, %ks, %one) : f32[1,4,8,4]{{128,4,16,1}}
   %ql = prim::ListConstruct(%q_embed, %q_pass)
   %query = aten::cat(%ql, %m1) : f32[1,4,8,16]
   %kl = prim::ListConstruct(%k_embed, %k_pass)
   %key = aten::cat(%kl, %m1) : f32[1,4,8,16]
   %a = aten::scaled_dot_product_attention(%query, %key, %val) : f32[1,4,8,16]
   return (%a)",
        rq = rotate_half("q", "q_rot", 4, 4, st),
        rk = rotate_half("k", "k_rot", 4, 4, st),
    );
    let g = Graph::parse(&text).unwrap();
    let m = match_rotary(&g);
    let pair = m.iter().find(|m| m.k.is_some()).expect("a pair");
    let k = pair.k.as_ref().unwrap();
    assert_eq!((name(&g, pair.q.x), name(&g, k.x)), ("q", "k"));
    assert_eq!(
        (
            pair.problem.head_dim,
            pair.problem.rotary_dim,
            pair.problem.rule_id().as_str()
        ),
        (16, 4, "rotary_halves_qk")
    );
    assert_eq!(pair.layout(), 3, "both outputs packed, as cat writes them");
    assert_eq!(
        (
            g.nodes[pair.q.out].kind.as_str(),
            g.nodes[k.out].kind.as_str()
        ),
        ("aten::cat", "aten::cat")
    );
    // The rotation's 8 nodes and its size arithmetic (NeoX's reads q_rot), the two slices, the
    // list and the cat; the rotary dim's Int, which q's and k's slices read, stays.
    assert_eq!(pair.q.nodes.len(), 16);
    assert!(pair
        .nodes()
        .iter()
        .all(|&n| g.nodes[n].outputs.iter().all(|&o| name(&g, o) != "rd")));
    let e = edit(&g, pair, "rope");
    assert_eq!(e.node as usize, producing(&g, "query"));
    assert_eq!(e.outputs, [producing(&g, "key") as u32]);
    assert_eq!(e.operands[4].int_value, 4);
    assert_eq!(e.operands[6].int_value, 3);
}

/// GPT-J: q and k [1,8,4,16] (before the permute), the first 8 of each head rotated in pairs;
/// every cut is preceded by full slices of the leading dims; sin and cos are repeat_interleave'd
/// for each of q and k separately: equal values from distinct nodes, so q and k still pair.
#[test]
fn gptj_partial_pairs_behind_full_slices() {
    let st = "{512,64,16,1}";
    let rot = |p: &str, x: &str| {
        format!(
            "
   %{p}a = aten::slice(%{x}, %zero, %zero, %max, %one) : f32[1,8,4,16]{st}
   %{p}b = aten::slice(%{p}a, %one, %zero, %max, %one) : f32[1,8,4,16]{st}
   %{p}r = aten::slice(%{p}b, %three, %zero, %eight, %one) : f32[1,8,4,8]{st}
   %{p}c = aten::slice(%{x}, %zero, %zero, %max, %one) : f32[1,8,4,16]{st}
   %{p}pass = aten::slice(%{p}c, %three, %eight, %max, %one) : f32[1,8,4,8]{st}
   %{p}cos = aten::repeat_interleave(%c4, %two, %three, %none) : f32[1,8,1,8]
   %{p}sin = aten::repeat_interleave(%s4, %two, %three, %none) : f32[1,8,1,8]
   %{p}mc = aten::mul(%{p}r, %{p}cos) : f32[1,8,4,8]
   %{p}d = aten::slice(%{p}r, %zero, %zero, %max, %one) : f32[1,8,4,8]{st}
   %{p}x1 = aten::slice(%{p}d, %three, %zero, %max, %two) : f32[1,8,4,4]{{512,64,16,2}}
   %{p}e = aten::slice(%{p}r, %zero, %zero, %max, %one) : f32[1,8,4,8]{st}
   %{p}x2 = aten::slice(%{p}e, %three, %one, %max, %two) : f32[1,8,4,4]{{512,64,16,2}}
   %{p}neg = aten::neg(%{p}x2) : f32[1,8,4,4]
   %{p}l = prim::ListConstruct(%{p}neg, %{p}x1)
   %{p}st = aten::stack(%{p}l, %m1) : f32[1,8,4,4,2]
   %{p}fl = aten::flatten(%{p}st, %m2, %m1) : f32[1,8,4,8]
   %{p}ms = aten::mul(%{p}fl, %{p}sin) : f32[1,8,4,8]
   %{p}rot = aten::add(%{p}mc, %{p}ms, %one) : f32[1,8,4,8]
   %{p}ol = prim::ListConstruct(%{p}rot, %{p}pass)
   %{p}out = aten::cat(%{p}ol, %m1) : f32[1,8,4,16]"
        )
    };
    let text = format!(
        "graph(%q: f32[1,8,4,16], %k: f32[1,8,4,16], %c: f32[1,8,4], %s: f32[1,8,4]):{CONSTANTS}
   %none = prim::Constant[None]()
   %eight = prim::Constant[8]()
   %c4 = aten::unsqueeze(%c, %two) : f32[1,8,1,4]
   %s4 = aten::unsqueeze(%s, %two) : f32[1,8,1,4]{}{}
   return (%qout, %kout)",
        rot("q", "q"),
        rot("k", "k")
    );
    let g = Graph::parse(&text).unwrap();
    let m = match_rotary(&g);
    assert_eq!(m.len(), 3, "q alone, k alone and the pair: {m:#?}");
    let pair = m.iter().find(|m| m.k.is_some()).unwrap();
    assert_eq!(pair.problem.rule_id(), "rotary_pairs_qk");
    assert_eq!(
        (name(&g, pair.k.as_ref().unwrap().cos), name(&g, pair.q.cos)),
        ("kcos", "qcos"),
        "each side keeps its own cos; the op is given q's"
    );
    let q = &m[0];
    assert_eq!(
        (name(&g, q.q.x), name(&g, q.q.cos), name(&g, q.q.sin)),
        ("q", "qcos", "qsin")
    );
    assert_eq!(
        (q.problem.rule_id().as_str(), q.problem.shape_key().as_str()),
        ("rotary_pairs", "1x4x0x8x16x8"),
        "heads along dim 2, positions along dim 1"
    );
    assert_eq!(q.layout(), 1);
    // The full slices are the rotation's too (nothing else reads them); the repeat_interleaves
    // stay: they compute cos and sin.
    let kinds: Vec<&str> = q
        .nodes()
        .iter()
        .map(|&n| g.nodes[n].kind.as_str())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "aten::slice").count(),
        9,
        "{kinds:?}"
    );
    assert!(!kinds.contains(&"aten::repeat_interleave"));
    let e = edit(&g, q, "rope");
    assert_eq!(
        (
            e.op.as_str(),
            e.operands[3].int_value,
            e.operands[4].int_value
        ),
        ("fact::rotary", 8, 1)
    );
}

#[test]
fn the_cover_keeps_rotary_beside_the_other_kinds() {
    // q and k from linears: the GEMMs stay GEMM patterns, the rotation is its own.
    let q = "{512,16,64,1}";
    let k = "{256,16,32,1}";
    let text = format!(
        "graph(%x: f32[1,8,64], %wq: f32[64,64], %wk: f32[32,64], %cos: f32[1,1,8,16], %sin: f32[1,1,8,16]):{CONSTANTS}
   %none = prim::Constant[None]()
   %four = prim::Constant[4]()
   %sixteen = prim::Constant[16]()
   %eight = prim::Constant[8]()
   %hq = aten::linear(%x, %wq, %none) : f32[1,8,64]
   %hk = aten::linear(%x, %wk, %none) : f32[1,8,32]
   %shq = prim::ListConstruct(%one, %eight, %four, %sixteen)
   %shk = prim::ListConstruct(%one, %eight, %two, %sixteen)
   %qv = aten::view(%hq, %shq) : f32[1,8,4,16]
   %q = aten::transpose(%qv, %one, %two) : f32[1,4,8,16]{q}
   %kv = aten::view(%hk, %shk) : f32[1,8,2,16]
   %k = aten::transpose(%kv, %one, %two) : f32[1,2,8,16]{k}
   %qc = aten::mul(%q, %cos) : f32[1,4,8,16]{q}{rq}
   %qs = aten::mul(%qrot, %sin) : f32[1,4,8,16]
   %qe = aten::add(%qc, %qs, %one) : f32[1,4,8,16]{q}
   %kc = aten::mul(%k, %cos) : f32[1,2,8,16]{k}{rk}
   %ks = aten::mul(%krot, %sin) : f32[1,2,8,16]
   %ke = aten::add(%kc, %ks, %one) : f32[1,2,8,16]{k}
   return (%qe, %ke)",
        rq = rotate_half("q", "q", 4, 16, q),
        rk = rotate_half("k", "k", 2, 16, k),
    );
    let g = Graph::parse(&text).unwrap();
    let found = match_patterns(&g);
    let ids: Vec<&str> = found.found.iter().map(|f| f.id.as_str()).collect();
    assert_eq!(ids, ["p0", "p1", "e0"]);
    assert!(found.of::<RotaryMatch>()[0].k.is_some());
}

/// Phi-3's attention inputs: q and k sliced from one fused projection [1,8,64] (two heads of 16
/// each), viewed and transposed; the rotation cut to cos's width, which is the whole head, and
/// the empty rest put back by a cat after the add, as `apply_rotary_pos_emb` writes the partial
/// form for every model.
fn phi3() -> Graph {
    let st = "{512,16,64,1}";
    let side = |p: &str, from: &str, to: &str| {
        format!(
            "
   %{p}s0 = aten::slice(%qkv, %m1, %{from}, %{to}, %one) : f32[1,8,32]{{512,64,1}}
   %{p}v = aten::view(%{p}s0, %sh) : f32[1,8,2,16]{{512,64,16,1}}
   %{p} = aten::transpose(%{p}v, %one, %two) : f32[1,2,8,16]{st}
   %{p}r = aten::slice(%{p}, %m1, %zero, %cn, %one) : f32[1,2,8,16]{st}
   %{p}p = aten::slice(%{p}, %m1, %cn, %max, %one) : f32[1,2,8,0]{st}
   %{p}c = aten::mul(%{p}r, %cos) : f32[1,2,8,16]{rot}
   %{p}m = aten::mul(%{p}rot, %sin) : f32[1,2,8,16]
   %{p}a = aten::add(%{p}c, %{p}m, %one) : f32[1,2,8,16]
   %{p}l = prim::ListConstruct(%{p}a, %{p}p)
   %{p}e = aten::cat(%{p}l, %m1) : f32[1,2,8,16]",
            rot = rotate_half(p, &format!("{p}r"), 2, 16, st),
        )
    };
    let text = format!(
        "graph(%qkv: f32[1,8,64], %c: f32[1,8,16], %s: f32[1,8,16]):{CONSTANTS}
   %sixteen = prim::Constant[16]()
   %eight = prim::Constant[8]()
   %thirtytwo = prim::Constant[32]()
   %sixtyfour = prim::Constant[64]()
   %sh = prim::ListConstruct(%one, %eight, %two, %sixteen)
   %cos = aten::unsqueeze(%c, %one) : f32[1,1,8,16]
   %sin = aten::unsqueeze(%s, %one) : f32[1,1,8,16]
   %cn = aten::size(%cos, %m1){q}{k}
   return (%qe, %ke)",
        q = side("q", "zero", "thirtytwo"),
        k = side("k", "thirtytwo", "sixtyfour"),
    );
    Graph::parse(&text).unwrap()
}

#[test]
fn phi3s_q_and_k_cut_to_the_whole_head_are_one_pattern() {
    let g = phi3();
    let m = match_rotary(&g);
    let pair = m
        .iter()
        .find(|m| m.k.is_some())
        .unwrap_or_else(|| panic!("q and k paired: {m:#?}"));
    let k = pair.k.as_ref().unwrap();
    assert_eq!((name(&g, pair.q.x), name(&g, k.x)), ("q", "k"));
    // Each rotation ends at the cat that puts the empty rest back, so both outputs are read
    // after the one call.
    assert_eq!(pair.q.out, producing(&g, "qe"));
    assert_eq!(k.out, producing(&g, "ke"));
    assert_eq!(pair.problem.rule_id(), "rotary_halves_qk");
    assert_eq!(pair.problem.shape_key(), "1x2x2x8x16x16");
    for r in [&pair.q, k] {
        for cut in ["r", "p"] {
            let side = if r.out == producing(&g, "qe") {
                "q"
            } else {
                "k"
            };
            assert!(r.nodes.contains(&producing(&g, &format!("{side}{cut}"))));
        }
    }
    // The size both cuts read stays the graph's (k's cuts read it too).
    assert!(!pair.nodes().contains(&producing(&g, "cn")));
}
