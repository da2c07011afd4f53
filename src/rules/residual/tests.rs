//! The add before a norm on text graphs, most copied from traces (transformers 5.17, torch 2.11):
//! the zoo's OPT and Llama (fp32, batch 1), BERT and GPT-2's embeddings, and what stays torch's.

use super::*;

fn graph(text: &str) -> Graph {
    Graph::parse(text).unwrap()
}

fn value(g: &Graph, name: &str) -> ValueId {
    g.values
        .iter()
        .position(|v| v.name == name)
        .unwrap_or_else(|| panic!("no value %{name}"))
}

fn node(g: &Graph, name: &str) -> NodeId {
    g.values[value(g, name)].producer.unwrap()
}

fn name(g: &Graph, v: ValueId) -> &str {
    &g.values[v].name
}

/// The add before the `aten::layer_norm` whose output is `y` (the norm is that one node).
fn before_layernorm(g: &Graph, y: &str) -> Option<ResidualAdd> {
    let ln = node(g, y);
    let x = g.nodes[ln].inputs[0];
    residual_add(g, &Readers::of(g), x, &BTreeSet::from([ln]))
}

/// The kinds of nodes, in order.
fn kinds(g: &Graph, nodes: &[NodeId]) -> Vec<String> {
    nodes
        .iter()
        .map(|&n| g.nodes[n].kind.trim_start_matches("aten::").to_string())
        .collect()
}

#[test]
fn opt_writes_the_embeddings_sum_its_first_residual_reads() {
    // The zoo's OPT (fp32, batch 1): token and position embeddings summed, the first layer's
    // self_attn_layer_norm of the sum, and the sum again as the attention's residual.
    let g = graph(
        "graph(%46: f32[1,64,768], %94: f32[1,64,768], %weight.12: f32[768], %bias.8: f32[768], %hidden_states.5: f32[1,64,768]):
           %5 = prim::Constant[False]()
           %7 = prim::Constant[None]()
           %13 = prim::Constant[6]()
           %20 = prim::Constant[True]()
           %21 = prim::Constant[1e-05]()
           %25 = prim::Constant[1]()
           %27 = prim::Constant[0]()
           %c = prim::Constant[768]()
           %pos_embeds.1 = aten::to(%94, %13, %27, %7, %7, %5, %5, %7) : f32[1,64,768]
           %input0.6 = aten::add(%46, %pos_embeds.1, %25) : f32[1,64,768]
           %104 = prim::ListConstruct(%c)
           %hidden_states.3 = aten::layer_norm(%input0.6, %104, %weight.12, %bias.8, %21, %20) : f32[1,64,768]
           %hidden_states0.2 = aten::add(%input0.6, %hidden_states.5, %25) : f32[1,64,768]
           return (%hidden_states.3, %hidden_states0.2)",
    );
    let r = before_layernorm(&g, "hidden_states.3").unwrap();
    assert_eq!(r.add, node(&g, "input0.6"));
    assert_eq!(
        r.sum,
        Some(r.add),
        "the add's own output is the next residual"
    );
    assert_eq!(r.residual, Residual::plain(DType::F32, true));
    assert!(r.nodes.is_empty(), "{:?}", kinds(&g, &r.nodes));
    // OPT's `to(dtype)` of its position embeddings stays: the kernel reads what it returns.
    assert_eq!((name(&g, r.a), name(&g, r.b)), ("46", "pos_embeds.1"));
    assert_eq!(
        r.residual.rule_id(DType::F32, "layernorm_affine"),
        "add_layernorm_affine_sum"
    );
}

#[test]
fn bert_broadcasts_its_position_rows_and_keeps_no_sum() {
    // BERT's embeddings in bf16 at batch 2: word + token type, + position embeddings of one
    // sequence for both, then the LayerNorm; nothing else reads the sum.
    let g = graph(
        "graph(%inputs_embeds.1: bf16[2,8,64], %token_type_embeddings.1: bf16[2,8,64], %position_embeddings.1: bf16[1,8,64], %w: bf16[64], %b: bf16[64]):
           %13 = prim::Constant[1]()
           %18 = prim::Constant[True]()
           %19 = prim::Constant[1e-12]()
           %c = prim::Constant[64]()
           %embeddings.1 = aten::add(%inputs_embeds.1, %token_type_embeddings.1, %13) : bf16[2,8,64]
           %input.3 = aten::add(%embeddings.1, %position_embeddings.1, %13) : bf16[2,8,64]
           %53 = prim::ListConstruct(%c)
           %input.5 = aten::layer_norm(%input.3, %53, %w, %b, %19, %18) : bf16[2,8,64]
           return (%input.5)",
    );
    let r = before_layernorm(&g, "input.5").unwrap();
    assert_eq!(r.add, node(&g, "input.3"), "the add the norm reads");
    assert_eq!(
        (name(&g, r.a), name(&g, r.b)),
        ("embeddings.1", "position_embeddings.1")
    );
    assert_eq!(r.sum, None);
    assert_eq!(r.nodes, [r.add]);
    assert_eq!(r.residual, Residual::plain(DType::Bf16, false));
    assert_eq!(
        r.residual.rule_id(DType::Bf16, "layernorm_affine"),
        "add_layernorm_affine"
    );
}

#[test]
fn gpt2_and_vit_read_their_embeddings_sum_through_eval_dropout_so_the_add_stays_torchs() {
    // GPT-2 (the zoo's trace): wte + wpe, eval dropout, ln_1, the dropout's output the first
    // residual. The call could take over only the dropout's output, and the c_proj epilogue that
    // adds that residual reads through the dropout to the add's output. GPT2Model also sizes the
    // dropout's output (`output_shape`) before ln_1, where the call would stand. torchvision's
    // ViT adds its position embedding the same way.
    let text = |size: &str| {
        format!(
            "graph(%47: f32[1,64,768], %position_embeds.1: f32[1,64,768], %weight.8: f32[768], %bias.4: f32[768], %attn_output.5: f32[1,64,768]):
               %6 = prim::Constant[False]()
               %9 = prim::Constant[-1]()
               %13 = prim::Constant[0.1]()
               %24 = prim::Constant[True]()
               %25 = prim::Constant[1e-05]()
               %26 = prim::Constant[768]()
               %28 = prim::Constant[1]()
               %input0.1 = aten::add(%47, %position_embeds.1, %28) : f32[1,64,768]
               %hidden_states.4 = aten::dropout(%input0.1, %13, %6) : f32[1,64,768]
               {size}
               %103 = prim::ListConstruct(%26)
               %x.5 = aten::layer_norm(%hidden_states.4, %103, %weight.8, %bias.4, %25, %24) : f32[1,64,768]
               %input.4 = aten::add(%attn_output.5, %hidden_states.4, %28) : f32[1,64,768]
               return (%x.5, %input.4)"
        )
    };
    let g = graph(&text("%96 = aten::size(%hidden_states.4, %9) : int"));
    assert_eq!(before_layernorm(&g, "x.5"), None);
    let g = graph(&text(""));
    assert_eq!(before_layernorm(&g, "x.5"), None);
    // With the residual read from the add's own output, the dropout is the pattern's.
    let g = graph(&text("").replace(
        "aten::add(%attn_output.5, %hidden_states.4, %28)",
        "aten::add(%attn_output.5, %input0.1, %28)",
    ));
    let r = before_layernorm(&g, "x.5").unwrap();
    assert_eq!(r.sum, Some(r.add));
    assert_eq!(kinds(&g, &r.nodes), ["dropout"]);
    assert_eq!(r.residual, Residual::plain(DType::F32, true));
}

#[test]
fn an_fp32_trace_whose_next_residual_reads_the_upcast_leaves_the_add() {
    // The zoo's Llama (fp32): the last layer's residual add, then the final norm, whose
    // `to(float32)` of the sum is a no-op that tracing records as what else reads the sum: the
    // call could take over only the upcast's output (see the GPT-2 case above).
    let g = graph(
        "graph(%368: f32[1,64,2048], %379: f32[1,64,2048], %weight.13: f32[2048]):
           %6 = prim::Constant[False]()
           %8 = prim::Constant[None]()
           %9 = prim::Constant[-1]()
           %12 = prim::Constant[6]()
           %20 = prim::Constant[{1e-6}]()
           %21 = prim::Constant[True]()
           %22 = prim::Constant[2]()
           %23 = prim::Constant[1]()
           %380 = aten::add(%368, %379, %23) : f32[1,64,2048]
           %hidden_states.1 = aten::to(%380, %12, %6, %6, %8) : f32[1,64,2048]
           %383 = aten::pow(%hidden_states.1, %22) : f32[1,64,2048]
           %384 = prim::ListConstruct(%9)
           %variance.1 = aten::mean(%383, %384, %21, %8) : f32[1,64,1]
           %386 = aten::add(%variance.1, %20, %23) : f32[1,64,1]
           %387 = aten::rsqrt(%386) : f32[1,64,1]
           %hidden_states0.1 = aten::mul(%hidden_states.1, %387) : f32[1,64,2048]
           %hidden_states1.1 = aten::to(%hidden_states0.1, %12, %6, %6, %8) : f32[1,64,2048]
           %390 = aten::mul(%weight.13, %hidden_states1.1) : f32[1,64,2048]
           %t = prim::TupleConstruct(%390, %hidden_states.1)
           return (%t)",
    );
    let norm: BTreeSet<NodeId> = [
        "383",
        "variance.1",
        "386",
        "387",
        "hidden_states0.1",
        "hidden_states1.1",
        "390",
    ]
    .iter()
    .map(|v| node(&g, v))
    .collect();
    // The RMSNorm rule's x is the sum (the upcast, read elsewhere, is not its own).
    assert_eq!(
        residual_add(&g, &Readers::of(&g), value(&g, "380"), &norm),
        None
    );
}

/// A bf16 LayerNorm `%y` of `%x` after the graph's `body`, with `tail` read after it.
fn norm_after(inputs: &str, body: &str, tail: &str) -> Graph {
    graph(&format!(
        "graph({inputs}, %w: bf16[64], %b: bf16[64]):
           %one = prim::Constant[1]()
           %two = prim::Constant[2]()
           %false = prim::Constant[False]()
           %none = prim::Constant[None]()
           %bf16 = prim::Constant[15]()
           %f32 = prim::Constant[6]()
           %true = prim::Constant[True]()
           %eps = prim::Constant[1e-05]()
           %half = prim::Constant[0.5]()
           %c = prim::Constant[64]()
           %m1 = prim::Constant[-1]()
           {body}
           %shape = prim::ListConstruct(%c)
           %y = aten::layer_norm(%x, %shape, %w, %b, %eps, %true) : bf16[2,8,64]
           {tail}
           return (%y)"
    ))
}

#[test]
fn a_residual_stream_kept_in_fp32_before_a_bf16_norm() {
    // Mamba's residual_in_fp32 spelling: an fp32 residual plus the bf16 block output (type
    // promotion), the sum cast to the norm's dtype, the fp32 sum the next residual.
    let inputs = "%residual: f32[2,8,64], %h: bf16[2,8,64], %next: f32[2,8,64]";
    let body = "%s = aten::add(%residual, %h, %one) : f32[2,8,64]
                %x = aten::to(%s, %bf16, %false, %false, %none) : bf16[2,8,64]";
    let g = norm_after(
        inputs,
        body,
        "%r2 = aten::add(%s, %next, %one) : f32[2,8,64]",
    );
    let r = before_layernorm(&g, "y").unwrap();
    assert_eq!(r.sum, Some(r.add));
    assert_eq!(kinds(&g, &r.nodes), ["to"]);
    assert_eq!(
        r.residual,
        Residual {
            a: DType::F32,
            b: DType::Bf16,
            sum: DType::F32,
            writes_sum: true
        }
    );
    assert_eq!((name(&g, r.a), name(&g, r.b)), ("residual", "h"));
    assert_eq!(
        r.residual.rule_id(DType::Bf16, "layernorm_affine"),
        "add_f32_bf16_f32_layernorm_affine_sum"
    );
    // Either operand order is one problem, the fp32 operand first.
    let g = norm_after(
        inputs,
        "%s = aten::add(%h, %residual, %one) : f32[2,8,64]
         %x = aten::to(%s, %bf16, %false, %false, %none) : bf16[2,8,64]",
        "",
    );
    let r = before_layernorm(&g, "y").unwrap();
    assert_eq!((name(&g, r.a), name(&g, r.b)), ("residual", "h"));
    assert_eq!(r.residual.a, DType::F32);
    assert!(!r.residual.writes_sum);
    // The cast sum read elsewhere is no sum the kernel writes: torch's.
    let g = norm_after(inputs, body, "%r2 = aten::mul(%x, %x) : bf16[2,8,64]");
    assert_eq!(before_layernorm(&g, "y"), None);
}

#[test]
fn an_operand_that_went_through_a_cast_is_read_as_the_cast_wrote_it() {
    // `residual + hidden.to(residual.dtype)`: the cast stays (it may end another pattern, as
    // Gemma's norms end in `type_as`), and the kernel reads its bf16 output.
    let inputs = "%residual: bf16[2,8,64], %hf: f32[2,8,64]";
    let body = "%h = aten::to(%hf, %bf16, %false, %false, %none) : bf16[2,8,64]
                %x = aten::add(%residual, %h, %one) : bf16[2,8,64]";
    let g = norm_after(inputs, body, "");
    let r = before_layernorm(&g, "y").unwrap();
    assert_eq!((name(&g, r.a), name(&g, r.b)), ("residual", "h"));
    assert_eq!(kinds(&g, &r.nodes), ["add"]);
    assert_eq!(r.residual, Residual::plain(DType::Bf16, false));
}

#[test]
fn other_adds_and_readers_stay_torchs() {
    let inputs = "%a: bf16[2,8,64], %b2: bf16[2,8,64], %col: bf16[2,8,1], %row: bf16[64]";
    let none = |body: &str, tail: &str, why: &str| {
        let g = norm_after(inputs, body, tail);
        assert_eq!(before_layernorm(&g, "y"), None, "{why}");
    };
    none(
        "%x = aten::add(%a, %b2, %two) : bf16[2,8,64]",
        "",
        "alpha 2",
    );
    none(
        "%x = aten::add(%a, %col, %one) : bf16[2,8,64]",
        "",
        "an operand broadcast along the normalized dim",
    );
    none(
        "%x = aten::add(%a, %half, %one) : bf16[2,8,64]",
        "",
        "a Python scalar",
    );
    none("%x = aten::sub(%a, %b2, %one) : bf16[2,8,64]", "", "no add");
    none(
        "%s = aten::add(%a, %b2, %one) : bf16[2,8,64]
         %sh = prim::ListConstruct(%m1, %c)
         %x = aten::view(%s, %sh) : bf16[16,64]",
        "",
        "a reshape between the sum and the norm (the op returns the sum's shape)",
    );
    none(
        "%s = aten::add(%a, %b2, %one) : bf16[2,8,64]
         %x = aten::dropout(%s, %half, %false) : bf16[2,8,64]",
        "%r1 = aten::mul(%s, %s) : bf16[2,8,64]
         %r2 = aten::mul(%x, %x) : bf16[2,8,64]",
        "two spellings of the sum read elsewhere",
    );
    none(
        "%x = aten::add(%a, %b2, %one) : bf16[2,8,64]
         %early = aten::mul(%x, %x) : bf16[2,8,64]",
        "",
        "the sum read before the norm ends",
    );
    // A bias row broadcast over every row is an operand like any other.
    let g = norm_after(inputs, "%x = aten::add(%a, %row, %one) : bf16[2,8,64]", "");
    assert!(before_layernorm(&g, "y").is_some());
}

#[test]
fn rule_ids_name_the_add_and_read_back() {
    let norm = DType::Bf16;
    for (r, id) in [
        (Residual::plain(norm, false), "add_rmsnorm_weight"),
        (Residual::plain(norm, true), "add_rmsnorm_weight_sum"),
        (
            Residual {
                a: DType::F32,
                b: DType::Bf16,
                sum: DType::F32,
                writes_sum: true,
            },
            "add_f32_bf16_f32_rmsnorm_weight_sum",
        ),
    ] {
        assert_eq!(r.rule_id(norm, "rmsnorm_weight"), id);
        assert_eq!(
            Residual::split_rule(id, norm).unwrap(),
            (Some(r), "rmsnorm_weight")
        );
    }
    assert_eq!(
        Residual::split_rule("rmsnorm_weight", norm).unwrap(),
        (None, "rmsnorm_weight")
    );
    // Operands in either order read back as one problem.
    assert_eq!(
        Residual::split_rule("add_bf16_f32_f32_layernorm", norm)
            .unwrap()
            .0
            .unwrap()
            .a,
        DType::F32
    );
    assert!(Residual::split_rule("add_", norm)
        .unwrap_err()
        .contains("add_[A_B_SUM_]<norm rule>[_sum]"));
    let r = Residual {
        a: DType::F32,
        b: DType::Bf16,
        sum: DType::F32,
        writes_sum: true,
    };
    assert_eq!(r.bytes(4, 8), 32.0 * (4.0 + 2.0 + 4.0));
    assert_eq!(Residual::plain(norm, false).bytes(4, 8), 32.0 * 4.0);
}
