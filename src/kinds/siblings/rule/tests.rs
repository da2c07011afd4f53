//! The sibling-linears rule from text graphs copied from the zoo's traces (transformers 5.17,
//! `fact graph` of target/zoo-fixtures/{llama,qwen2,bert}.pt, shapes written in at the zoo's real
//! widths), and the graphs it must leave alone.

use super::*;

/// One attention block's projections as Llama, Qwen2 and BERT trace them: per projection the
/// bias (where there is one) and weight read by `prim::GetAttr`, `linear(x, w, b)`, `view` to
/// [B, T, H, D] and `transpose(1, 2)`; the three heads' views returned. `widths` are q's, k's and
/// v's N; `extra` goes before the return.
pub(crate) fn projections(dtype: &str, k: i64, widths: &[i64], bias: bool, extra: &str) -> String {
    let mut text = format!(
        "graph(%self.1: Model, %x: {dtype}[1,8,{k}], %z: {dtype}[1,8,{k}]):
           %8 = prim::Constant[None]()
           %c1 = prim::Constant[1]()
           %c2 = prim::Constant[2]()
           %c16 = prim::Constant[16]()
           %cm1 = prim::Constant[-1]()
           %attn = prim::GetAttr[name=\"self_attn\"](%self.1) : Attention
           %b1 = aten::size(%x, %c1) : int
"
    );
    let mut outs = Vec::new();
    for (i, n) in widths.iter().enumerate() {
        let b = if bias {
            text += &format!(
                "           %bias.{i} = prim::GetAttr[name=\"bias\"](%proj.{i}) : {dtype}[{n}]\n"
            );
            format!("%bias.{i}")
        } else {
            "%8".to_string()
        };
        text += &format!(
            "           %proj.{i} = prim::GetAttr[name=\"p{i}\"](%attn) : Linear
           %weight.{i} = prim::GetAttr[name=\"weight\"](%proj.{i}) : {dtype}[{n},{k}]
           %lin.{i} = aten::linear(%x, %weight.{i}, {b}) : {dtype}[1,8,{n}]
           %shape.{i} = prim::ListConstruct(%c1, %b1, %cm1, %c16)
           %view.{i} = aten::view(%lin.{i}, %shape.{i}) : {dtype}[1,8,{h},16]
           %t.{i} = aten::transpose(%view.{i}, %c1, %c2) : {dtype}[1,{h},8,16]
",
            h = n / 16
        );
        outs.push(format!("%t.{i}"));
    }
    // GetAttr of a projection's module must come before its bias is read.
    let text = reorder_bias_reads(&text);
    format!("{text}{extra}\n           return ({})", outs.join(", "))
}

/// Moves each `%bias.i` line after its projection's `%proj.i` line (the trace reads the module,
/// then its bias and weight).
fn reorder_bias_reads(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<&str> = Vec::new();
    let mut pending: Vec<&str> = Vec::new();
    for l in lines {
        if l.contains("%bias.") && l.contains("GetAttr") {
            pending.push(l);
            continue;
        }
        out.push(l);
        if l.contains("%proj.") && l.contains("GetAttr[name=\"p") {
            let id = l
                .trim()
                .split(' ')
                .next()
                .unwrap()
                .trim_start_matches("%proj.");
            if let Some(i) = pending
                .iter()
                .position(|p| p.contains(&format!("(%proj.{id})")))
            {
                out.push(pending.remove(i));
            }
        }
    }
    out.join("\n") + "\n"
}

pub(crate) fn parse(text: &str) -> Graph {
    Graph::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn llamas_gqa_projections_are_one_group_of_three() {
    let g = parse(&projections("bf16", 2048, &[2048, 512, 512], false, ""));
    let m = match_siblings(&g);
    assert_eq!(m.len(), 1, "{m:#?}");
    assert_eq!(
        m[0].problem,
        SiblingsProblem {
            m: 8,
            k: 2048,
            widths: vec![2048, 512, 512],
            dtype: DType::Bf16,
            bias: false
        }
    );
    assert_eq!(m[0].problem.rule_id(), "siblings_rcr");
    let names: Vec<&str> = m[0]
        .weights
        .iter()
        .map(|&w| g.values[w].name.as_str())
        .collect();
    assert_eq!(names, ["weight.0", "weight.1", "weight.2"]);
    assert!(m[0].biases.is_empty());
    assert!(m[0]
        .linears
        .iter()
        .all(|&n| g.nodes[n].kind == "aten::linear"));
    assert!(m[0].linears.windows(2).all(|w| w[0] < w[1]), "graph order");
}

#[test]
fn qwen2s_biased_projections_and_berts_are_groups_with_biases() {
    let g = parse(&projections("bf16", 896, &[896, 128, 128], true, ""));
    let m = match_siblings(&g);
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].problem.widths, [896, 128, 128]);
    assert_eq!(m[0].problem.rule_id(), "siblings_rcr_bias");
    assert_eq!(m[0].biases.len(), 3);
    let g = parse(&projections("f32", 768, &[768, 768, 768], true, ""));
    let m = match_siblings(&g);
    assert_eq!(m.len(), 1);
    assert_eq!(
        (
            m[0].problem.dtype,
            m[0].problem.n(),
            m[0].problem.shape_key()
        ),
        (DType::F32, 2304, "8x768x768x768x768".to_string())
    );
}

#[test]
fn linears_of_different_inputs_weights_or_biases_are_no_group() {
    // v reads another x: q and k stay a group of two.
    let text = projections("bf16", 64, &[64, 32, 32], false, "")
        .replace("%lin.2 = aten::linear(%x,", "%lin.2 = aten::linear(%z,");
    let m = match_siblings(&parse(&text));
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].problem.widths, [64, 32]);
    // Each reads its own x: nothing.
    let text = text.replace("%lin.1 = aten::linear(%x,", "%lin.1 = aten::linear(%z,");
    let text = text.replace(
        "%lin.2 = aten::linear(%z,",
        "%lin.2 = aten::linear(%self.1,",
    );
    assert!(match_siblings(&parse(&text)).is_empty());
    // A weight that is a graph input, not a parameter.
    let text = projections("bf16", 64, &[64, 32], false, "")
        .replace("%z: bf16[1,8,64]", "%wz: bf16[32,64]")
        .replace("aten::linear(%x, %weight.1,", "aten::linear(%x, %wz,");
    assert!(match_siblings(&parse(&text)).is_empty());
    // Biases in some but not all: the two without one are a group.
    let text = projections("bf16", 64, &[64, 32, 32], true, "").replace(
        "aten::linear(%x, %weight.0, %bias.0)",
        "aten::linear(%x, %weight.0, %8)",
    );
    let m = match_siblings(&parse(&text));
    assert_eq!(m.len(), 1);
    assert_eq!(
        (m[0].problem.widths.as_slice(), m[0].problem.bias),
        (&[32, 32][..], true)
    );
}

#[test]
fn a_sibling_with_an_epilogue_or_a_reader_that_is_no_row_view_stays_alone() {
    // OPT scales q after its projection: q's GEMM takes the mul, k and v are the group.
    let text = projections(
        "f16",
        64,
        &[64, 64, 64],
        true,
        "           %s = prim::Constant[0.25]()
           %q2 = aten::mul(%lin.0, %s) : f16[1,8,64]",
    );
    let text = text.replace("return (%t.0,", "return (%q2, %t.0,");
    let g = parse(&text);
    let m = match_siblings(&g);
    assert_eq!(m.len(), 1, "{m:#?}");
    assert_eq!(m[0].linears.len(), 2);
    let q = g.values.iter().position(|v| v.name == "lin.0").unwrap();
    assert!(!m[0].linears.contains(&g.values[q].producer.unwrap()));
    // A view that merges a row with the next ([1, 8, 64] as [512]) cannot read a row-strided
    // output: that linear stays alone.
    let text = projections(
        "bf16",
        64,
        &[64, 32, 32],
        false,
        "           %flat = prim::ListConstruct(%cm1)
           %f = aten::view(%lin.2, %flat) : bf16[256]",
    )
    .replace("return (%t.0, %t.1, %t.2)", "return (%t.0, %t.1, %t.2, %f)");
    let m = match_siblings(&parse(&text));
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].problem.widths, [64, 32]);
    // An output the graph returns.
    let text = projections("bf16", 64, &[64, 32], false, "")
        .replace("return (%t.0, %t.1)", "return (%t.0, %t.1, %lin.1)");
    assert!(match_siblings(&parse(&text)).is_empty());
}

#[test]
fn a_linear_reading_its_siblings_output_is_none_of_its_siblings() {
    // k reads q's output through its view: q feeds k.
    let text = projections("bf16", 64, &[64, 64], false, "").replace(
        "%lin.1 = aten::linear(%x,",
        "%qv = aten::view(%lin.0, %shape.0) : bf16[1,8,64]\n           %lin.1 = aten::linear(%qv,",
    );
    assert!(match_siblings(&parse(&text)).is_empty());
}

#[test]
fn widths_and_k_must_be_whole_vectors_and_groups_at_most_four() {
    // N = 36 bf16 values is no whole number of 16-byte vectors.
    let text = projections("bf16", 64, &[64, 48, 48], false, "")
        .replace("bf16[48,64]", "bf16[36,64]")
        .replace("bf16[1,8,48]", "bf16[1,8,36]")
        .replace("bf16[1,8,3,16]", "bf16[1,8,36,1]")
        .replace("bf16[1,3,8,16]", "bf16[1,36,8,1]");
    let m = match_siblings(&parse(&text));
    assert!(m.is_empty(), "{m:#?}");
    // Six siblings are a group of four and one of two; of five, the fifth stays alone.
    let g = parse(&projections("f32", 64, &[16; 6], false, ""));
    let sizes: Vec<usize> = match_siblings(&g).iter().map(|m| m.linears.len()).collect();
    assert_eq!(sizes, [MAX_SIBLINGS, 2]);
    let g = parse(&projections("f32", 64, &[16; 5], false, ""));
    let sizes: Vec<usize> = match_siblings(&g).iter().map(|m| m.linears.len()).collect();
    assert_eq!(sizes, [MAX_SIBLINGS]);
}

#[test]
fn gptjs_projections_sized_before_their_views_are_a_group() {
    // GPT-J's `_split_heads` reads each projection's sizes for its view's shape
    // (`tensor.size()[:-1] + (heads, dim)`): size reads of the op's view read the same.
    let mut text = projections("bf16", 64, &[64, 64, 64], false, "").replace(
        "%c1 = prim::Constant[1]()",
        "%c0 = prim::Constant[0]()\n           %c1 = prim::Constant[1]()",
    );
    for i in 0..3 {
        text = text.replace(
            &format!("%shape.{i} = prim::ListConstruct(%c1, %b1, %cm1, %c16)"),
            &format!(
                "%s0.{i} = aten::size(%lin.{i}, %c0) : int
           %s1.{i} = aten::size(%lin.{i}, %c1) : int
           %shape.{i} = prim::ListConstruct(%s0.{i}, %s1.{i}, %cm1, %c16)"
            ),
        );
    }
    assert_eq!(text.matches("aten::size(%lin.").count(), 6, "{text}");
    let m = match_siblings(&parse(&text));
    assert_eq!(m.len(), 1, "{m:#?}");
    assert_eq!(m[0].problem.widths, [64, 64, 64]);
    // A projection read by its size alone, with no view of its rows, stays alone.
    let text = text.replace(
        "%view.2 = aten::view(%lin.2, %shape.2) : bf16[1,8,4,16]",
        "%view.2 = aten::view(%x, %shape.2) : bf16[1,8,4,16]",
    );
    let m = match_siblings(&parse(&text));
    assert_eq!(m.len(), 1, "{m:#?}");
    assert_eq!(m[0].problem.widths, [64, 64]);
}
