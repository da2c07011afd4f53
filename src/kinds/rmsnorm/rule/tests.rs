//! The RMSNorm rule on text graphs: each spelling the libraries write (Llama's copied from a
//! traced LlamaForCausalLM in bf16 and in fp32), and what stays torch's.

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

fn name(g: &Graph, v: ValueId) -> &str {
    &g.values[v].name
}

/// The kinds of a match's nodes, in graph order.
fn kinds(g: &Graph, m: &RmsNormMatch) -> Vec<String> {
    m.nodes()
        .iter()
        .map(|&n| g.nodes[n].kind.trim_start_matches("aten::").to_string())
        .collect()
}

/// The only match of the graph.
fn one(g: &Graph) -> RmsNormMatch {
    let m = match_rmsnorms(g);
    assert_eq!(m.len(), 1, "{m:?}");
    m.into_iter().next().unwrap()
}

/// Constants every written-out graph below uses.
const CONSTANTS: &str = "
    %false = prim::Constant[False]()
    %true = prim::Constant[True]()
    %one = prim::Constant[1]()
    %onef = prim::Constant[1.0]()
    %none = prim::Constant[None]()
    %m1 = prim::Constant[-1]()
    %two = prim::Constant[2]()
    %bf16 = prim::Constant[15]()
    %f32 = prim::Constant[6]()
    %f16 = prim::Constant[5]()
    %eps = prim::Constant[{1e-06}]()
    %epsf = prim::Constant[1e-05]()
    %dims = prim::ListConstruct(%m1)";

/// A [2,8,64] `%x` of `dtype` and a [64] `%w`, the constants, then `body` (returning `%y`).
fn written(dtype: &str, wdtype: &str, body: &str) -> Graph {
    graph(&format!(
        "graph(%x: {dtype}[2,8,64], %w: {wdtype}[64], %h: {dtype}[2,8,64]):{CONSTANTS}
         {body}
         return (%y)"
    ))
}

/// The statistics of `%xf` (f32[2,8,64]) down to `%n = xf · rsqrt(mean(xf²) + eps)`.
const STATS: &str = "
    %sq = aten::pow(%xf, %two) : f32[2,8,64]
    %var = aten::mean(%sq, %dims, %true, %none) : f32[2,8,1]
    %ve = aten::add(%var, %eps, %one) : f32[2,8,1]
    %r = aten::rsqrt(%ve) : f32[2,8,1]
    %n = aten::mul(%xf, %r) : f32[2,8,64]";

#[test]
fn llama_rmsnorm_traced_in_bf16_matches_with_its_rounding_before_the_weight() {
    // Copied from `torch.jit.trace` of a bf16 LlamaForCausalLM (transformers 5.17): the
    // post-attention norm, whose input is also the residual the block adds back.
    let g = graph(
        "graph(%hidden_states.17: bf16[2,8,64], %weight.15: bf16[64], %hidden_states.23: bf16[2,8,64]):
           %4 = prim::Constant[False]()
           %6 = prim::Constant[1]()
           %7 = prim::Constant[None]()
           %9 = prim::Constant[-1]()
           %13 = prim::Constant[2]()
           %16 = prim::Constant[15]()
           %18 = prim::Constant[6]()
           %24 = prim::Constant[True]()
           %25 = prim::Constant[{1e-06}]()
           %hidden_states.19 = aten::to(%hidden_states.17, %18, %4, %4, %7) : f32[2,8,64]
           %218 = aten::pow(%hidden_states.19, %13) : f32[2,8,64]
           %219 = prim::ListConstruct(%9)
           %variance.3 = aten::mean(%218, %219, %24, %7) : f32[2,8,1]
           %221 = aten::add(%variance.3, %25, %6) : f32[2,8,1]
           %222 = aten::rsqrt(%221) : f32[2,8,1]
           %hidden_states.21 = aten::mul(%hidden_states.19, %222) : f32[2,8,64]
           %224 = aten::to(%hidden_states.21, %16, %4, %4, %7) : bf16[2,8,64]
           %input.3 = aten::mul(%weight.15, %224) : bf16[2,8,64]
           %hidden_states.25 = aten::add(%hidden_states.17, %hidden_states.23, %6) : bf16[2,8,64]
           return (%input.3, %hidden_states.25)",
    );
    let m = one(&g);
    assert_eq!(
        m.problem,
        RmsNormProblem::new(16, 64, DType::Bf16, Scale::Weight, true)
    );
    assert_eq!(m.problem.rule_id(), "rmsnorm_cast_weight");
    assert_eq!(m.form(), "rmsnorm_cast_weight");
    assert_eq!(
        (name(&g, m.x), name(&g, m.weight.unwrap()), m.eps),
        ("hidden_states.17", "weight.15", Some(1e-6))
    );
    assert_eq!(g.nodes[m.node].outputs[0], value(&g, "input.3"));
    assert_eq!(
        kinds(&g, &m),
        ["to", "pow", "mean", "add", "rsqrt", "mul", "to", "mul"],
        "the upcast is the pattern's: nothing else reads it"
    );
}

#[test]
fn llama_rmsnorm_traced_in_fp32_leaves_the_upcast_its_residual_reads() {
    // From the zoo's fp32 trace: `to(float32)` of an fp32 tensor is the tensor itself, and
    // tracing records the block's residual as that `to`'s output.
    let g = written(
        "f32",
        "f32",
        "%xf = aten::to(%x, %f32, %false, %false, %none) : f32[2,8,64]
         %sq = aten::pow(%xf, %two) : f32[2,8,64]
         %var = aten::mean(%sq, %dims, %true, %none) : f32[2,8,1]
         %ve = aten::add(%var, %eps, %one) : f32[2,8,1]
         %r = aten::rsqrt(%ve) : f32[2,8,1]
         %n = aten::mul(%xf, %r) : f32[2,8,64]
         %c = aten::to(%n, %f32, %false, %false, %none) : f32[2,8,64]
         %y = aten::mul(%w, %c) : f32[2,8,64]
         %res = aten::add(%xf, %h, %one) : f32[2,8,64]
         %t = prim::TupleConstruct(%y, %res)",
    );
    let m = one(&g);
    assert_eq!(m.problem.rule_id(), "rmsnorm_weight", "fp32: one rounding");
    assert_eq!(name(&g, m.x), "x");
    assert_eq!(
        kinds(&g, &m),
        ["pow", "mean", "add", "rsqrt", "mul", "to", "mul"]
    );
}

#[test]
fn the_weight_multiplied_in_fp32_then_cast_rounds_once() {
    // (w · x̂).to(dtype), the weight promoted or cast with `.float()` first.
    for (w, prep) in [
        ("%w", ""),
        (
            "%wf",
            "%wf = aten::to(%w, %f32, %false, %false, %none) : f32[64]",
        ),
    ] {
        let g = written(
            "bf16",
            "bf16",
            &format!(
                "%xf = aten::to(%x, %f32, %false, %false, %none) : f32[2,8,64]{STATS}
                 {prep}
                 %s = aten::mul(%n, {w}) : f32[2,8,64]
                 %y = aten::to(%s, %bf16, %false, %false, %none) : bf16[2,8,64]"
            ),
        );
        let m = one(&g);
        assert_eq!(m.problem.rule_id(), "rmsnorm_weight", "{w}");
        assert_eq!(name(&g, m.weight.unwrap()), "w");
        assert_eq!(m.nodes().len(), 8 + usize::from(!prep.is_empty()));
    }
}

#[test]
fn gemma_scales_by_one_plus_the_weight_and_casts_back_with_type_as() {
    let g = written(
        "bf16",
        "bf16",
        &format!(
            "%xf = aten::to(%x, %f32, %false, %false, %none) : f32[2,8,64]{STATS}
             %wf = aten::to(%w, %f32, %false, %false, %none) : f32[64]
             %w1 = aten::add(%wf, %onef, %one) : f32[64]
             %s = aten::mul(%n, %w1) : f32[2,8,64]
             %y = aten::type_as(%s, %x) : bf16[2,8,64]"
        ),
    );
    let m = one(&g);
    assert_eq!(m.problem.rule_id(), "rmsnorm_weight1p");
    assert_eq!(m.problem.scale, Scale::WeightPlusOne);
    assert_eq!(name(&g, m.weight.unwrap()), "w");
    assert_eq!(m.nodes().len(), 10, "the weight's cast and offset too");
    // 1 + w computed in bf16: a [C] tensor of the dtype like any weight, which torch computes
    // and the kernel reads.
    let g = written(
        "bf16",
        "bf16",
        &format!(
            "%xf = aten::to(%x, %f32, %false, %false, %none) : f32[2,8,64]{STATS}
             %w1 = aten::add(%w, %onef, %one) : bf16[64]
             %s = aten::mul(%n, %w1) : f32[2,8,64]
             %y = aten::type_as(%s, %x) : bf16[2,8,64]"
        ),
    );
    let m = one(&g);
    assert_eq!(
        (m.problem.rule_id().as_str(), name(&g, m.weight.unwrap())),
        ("rmsnorm_weight", "w1")
    );
    assert_eq!(m.nodes().len(), 8, "the bf16 offset stays torch's");
}

#[test]
fn gemma_traced_in_fp32_ends_at_the_weight_and_leaves_its_type_as_a_view() {
    // In fp32 the `type_as` back is a view, which Gemma's lm_head reads its operand through: the
    // norm ends at the product, so a GEMM may take the view (the norm stood there before and lost
    // the final norm to the lm_head's epilogue GEMM).
    let g = written(
        "f32",
        "f32",
        &format!(
            "%xf = aten::to(%x, %f32, %false, %false, %none) : f32[2,8,64]{STATS}
             %wf = aten::to(%w, %f32, %false, %false, %none) : f32[64]
             %w1 = aten::add(%wf, %onef, %one) : f32[64]
             %s = aten::mul(%n, %w1) : f32[2,8,64]
             %y = aten::type_as(%s, %xf) : f32[2,8,64]"
        ),
    );
    let m = one(&g);
    // In fp32, 1 + w is a [C] tensor of x's dtype like any weight, which torch computes.
    assert_eq!(
        (m.problem.rule_id().as_str(), name(&g, m.weight.unwrap())),
        ("rmsnorm_weight", "w1")
    );
    assert_eq!(g.nodes[m.node].kind, "aten::mul");
    assert!(
        !kinds(&g, &m).contains(&"type_as".to_string()),
        "{:?}",
        kinds(&g, &m)
    );
}

#[test]
fn t5_multiplies_the_unconverted_input_and_squares_with_mul() {
    // T5LayerNorm: `x * rsqrt(x.to(f32).pow(2).mean(-1, keepdim) + eps)`, cast to the weight's
    // dtype, then `w * ·`; here with `x · x` for the square and a float eps.
    let g = written(
        "f16",
        "f16",
        "%xf = aten::to(%x, %f32, %false, %false, %none) : f32[2,8,64]
         %sq = aten::mul(%xf, %xf) : f32[2,8,64]
         %var = aten::mean(%sq, %dims, %true, %none) : f32[2,8,1]
         %ve = aten::add(%var, %epsf, %one) : f32[2,8,1]
         %r = aten::rsqrt(%ve) : f32[2,8,1]
         %n = aten::mul(%x, %r) : f32[2,8,64]
         %c = aten::to(%n, %f16, %false, %false, %none) : f16[2,8,64]
         %y = aten::mul(%w, %c) : f16[2,8,64]",
    );
    let m = one(&g);
    assert_eq!(
        m.problem,
        RmsNormProblem::new(16, 64, DType::F16, Scale::Weight, true)
    );
    assert_eq!(m.eps, Some(1e-5));
}

#[test]
fn without_a_weight_or_an_upcast() {
    // bf16 in, the normalized value cast back, no weight.
    let g = written(
        "bf16",
        "bf16",
        &format!(
            "%xf = aten::to(%x, %f32, %false, %false, %none) : f32[2,8,64]{STATS}
             %y = aten::to(%n, %bf16, %false, %false, %none) : bf16[2,8,64]"
        ),
    );
    assert_eq!(one(&g).problem.rule_id(), "rmsnorm");
    // fp32 throughout: no cast at all, with and without the weight, eps first in the add.
    let g = graph(&format!(
        "graph(%xf: f32[4,64], %w: f32[64]):{CONSTANTS}
         %sq = aten::pow(%xf, %two) : f32[4,64]
         %var = aten::mean(%sq, %dims, %true, %none) : f32[4,1]
         %ve = aten::add(%eps, %var, %one) : f32[4,1]
         %r = aten::rsqrt(%ve) : f32[4,1]
         %n = aten::mul(%r, %xf) : f32[4,64]
         %y = aten::mul(%n, %w) : f32[4,64]
         return (%y)"
    ));
    let m = one(&g);
    assert_eq!(
        (
            m.problem.rule_id().as_str(),
            m.problem.rows,
            m.nodes().len()
        ),
        ("rmsnorm_weight", 4, 6)
    );
    let g = graph(&format!(
        "graph(%xf: f32[4,64]):{CONSTANTS}
         %sq = aten::pow(%xf, %two) : f32[4,64]
         %var = aten::mean(%sq, %dims, %true, %none) : f32[4,1]
         %ve = aten::add(%var, %eps, %one) : f32[4,1]
         %r = aten::rsqrt(%ve) : f32[4,1]
         %y = aten::mul(%xf, %r) : f32[4,64]
         return (%y)"
    ));
    assert_eq!(one(&g).problem.rule_id(), "rmsnorm");
}

#[test]
fn aten_rms_norm_matches_with_and_without_weight_and_eps() {
    let g = graph(
        "graph(%x: bf16[4,16,32], %w: bf16[32], %v: f32[32]):
           %none = prim::Constant[None]()
           %eps = prim::Constant[1e-05]()
           %c = prim::Constant[32]()
           %shape = prim::ListConstruct(%c)
           %y = aten::rms_norm(%x, %shape, %w, %eps) : bf16[4,16,32]
           %z = aten::rms_norm(%y, %shape, %none, %none) : bf16[4,16,32]
           %u = aten::rms_norm(%z, %shape, %v, %eps) : bf16[4,16,32]
           return (%u)",
    );
    let m = match_rmsnorms(&g);
    assert_eq!(m.len(), 2, "a weight of another dtype stays torch's");
    assert_eq!(
        (
            m[0].problem.rule_id().as_str(),
            m[0].eps,
            m[0].form().as_str()
        ),
        ("rmsnorm_weight", Some(1e-5), "rms_norm")
    );
    assert_eq!(
        (m[1].problem.rule_id().as_str(), m[1].eps, m[1].weight),
        ("rmsnorm", None, None)
    );
    assert_eq!(m[0].problem.rows, 64);
}

#[test]
fn other_reductions_and_escaping_statistics_stay_torch() {
    let stats = |mean: &str, tail: &str| {
        written(
            "bf16",
            "bf16",
            &format!(
                "%xf = aten::to(%x, %f32, %false, %false, %none) : f32[2,8,64]
                 %sq = aten::pow(%xf, %two) : f32[2,8,64]
                 {mean}
                 %ve = aten::add(%var, %eps, %one) : f32[2,8,1]
                 %r = aten::rsqrt(%ve) : f32[2,8,1]
                 %n = aten::mul(%xf, %r) : f32[2,8,64]
                 %c = aten::to(%n, %bf16, %false, %false, %none) : bf16[2,8,64]
                 %y = aten::mul(%w, %c) : bf16[2,8,64]
                 {tail}"
            ),
        )
    };
    let mean = "%var = aten::mean(%sq, %dims, %true, %none) : f32[2,8,1]";
    assert_eq!(match_rmsnorms(&stats(mean, "")).len(), 1);
    assert!(
        match_rmsnorms(&stats(mean, "%z = aten::add(%var, %h, %one) : f32[2,8,64]")).is_empty(),
        "the variance is read elsewhere"
    );
    assert!(
        match_rmsnorms(&stats(
            "%var = aten::mean(%sq, %dims, %false, %none) : f32[2,8]",
            ""
        ))
        .is_empty(),
        "no keepdim"
    );
    assert!(
        match_rmsnorms(&stats(
            "%d1 = prim::ListConstruct(%one)
             %var = aten::mean(%sq, %d1, %true, %none) : f32[2,1,64]",
            ""
        ))
        .is_empty(),
        "not over the last dim"
    );
    // x / sqrt(var + eps): rounds otherwise than the rsqrt the op replays.
    let g = written(
        "f32",
        "f32",
        "%sq = aten::pow(%x, %two) : f32[2,8,64]
         %var = aten::mean(%sq, %dims, %true, %none) : f32[2,8,1]
         %ve = aten::add(%var, %eps, %one) : f32[2,8,1]
         %r = aten::sqrt(%ve) : f32[2,8,1]
         %y = aten::div(%x, %r) : f32[2,8,64]",
    );
    assert!(match_rmsnorms(&g).is_empty());
    // A weight in fp32 against bf16 activations promotes the product to fp32.
    let g = written(
        "bf16",
        "f32",
        &format!(
            "%xf = aten::to(%x, %f32, %false, %false, %none) : f32[2,8,64]{STATS}
             %c = aten::to(%n, %bf16, %false, %false, %none) : bf16[2,8,64]
             %y = aten::mul(%w, %c) : f32[2,8,64]"
        ),
    );
    let m = one(&g);
    assert_eq!(
        (m.problem.rule_id().as_str(), g.nodes[m.node].kind.as_str()),
        ("rmsnorm", "aten::to"),
        "the cast is the pattern's end; the fp32 product stays torch's"
    );
}

/// The matches of the graph with the add before their norm.
fn with_add(g: &Graph) -> Vec<RmsNormMatch> {
    match_rmsnorms(g)
        .into_iter()
        .filter(|m| m.add.is_some())
        .collect()
}

#[test]
fn gemma_sandwich_norms_take_the_residual_add_between_them() {
    // Copied from `torch.jit.trace` of a bf16 Gemma2ForCausalLM (transformers 5.17): the
    // post-attention norm of o_proj's output, the residual add, the pre-feedforward norm of the
    // sum, and the sum again as the MLP's residual. No GEMM reaches that add: its operand is a
    // norm's output.
    let g = graph(
        "graph(%238: bf16[2,8,64], %inputs_embeds.1: bf16[2,8,64], %weight.7: bf16[64], %weight.13: bf16[64], %286: bf16[2,8,64]):
           %7 = prim::Constant[False]()
           %9 = prim::Constant[None]()
           %10 = prim::Constant[-1]()
           %14 = prim::Constant[6]()
           %15 = prim::Constant[{1.0}]()
           %22 = prim::Constant[{1e-6}]()
           %23 = prim::Constant[True]()
           %24 = prim::Constant[2]()
           %25 = prim::Constant[1]()
           %x.6 = aten::to(%238, %14, %7, %7, %9) : f32[2,8,64]
           %241 = aten::pow(%x.6, %24) : f32[2,8,64]
           %242 = prim::ListConstruct(%10)
           %243 = aten::mean(%241, %242, %23, %9) : f32[2,8,1]
           %244 = aten::add(%243, %22, %25) : f32[2,8,1]
           %245 = aten::rsqrt(%244) : f32[2,8,1]
           %output.4 = aten::mul(%x.6, %245) : f32[2,8,64]
           %247 = aten::to(%weight.7, %14, %7, %7, %9) : f32[64]
           %248 = aten::add(%247, %15, %25) : f32[64]
           %output0.4 = aten::mul(%output.4, %248) : f32[2,8,64]
           %250 = aten::type_as(%output0.4, %238) : bf16[2,8,64]
           %x.2 = aten::add(%inputs_embeds.1, %250, %25) : bf16[2,8,64]
           %x0.1 = aten::to(%x.2, %14, %7, %7, %9) : f32[2,8,64]
           %254 = aten::pow(%x0.1, %24) : f32[2,8,64]
           %255 = prim::ListConstruct(%10)
           %256 = aten::mean(%254, %255, %23, %9) : f32[2,8,1]
           %257 = aten::add(%256, %22, %25) : f32[2,8,1]
           %258 = aten::rsqrt(%257) : f32[2,8,1]
           %output.6 = aten::mul(%x0.1, %258) : f32[2,8,64]
           %260 = aten::to(%weight.13, %14, %7, %7, %9) : f32[64]
           %261 = aten::add(%260, %15, %25) : f32[64]
           %output0.6 = aten::mul(%output.6, %261) : f32[2,8,64]
           %263 = aten::type_as(%output0.6, %x.2) : bf16[2,8,64]
           %287 = aten::add(%x.2, %286, %25) : bf16[2,8,64]
           return (%263, %287)",
    );
    let all = match_rmsnorms(&g);
    assert_eq!(
        all.iter().map(|m| m.problem.rule_id()).collect::<Vec<_>>(),
        [
            "rmsnorm_weight1p",
            "rmsnorm_weight1p",
            "add_rmsnorm_weight1p_sum"
        ],
        "each norm alone, and the second with the add: the cover picks"
    );
    let m = &all[2];
    let add = m.add.as_ref().unwrap();
    assert_eq!(
        (name(&g, add.a), name(&g, add.b)),
        ("inputs_embeds.1", "250"),
        "the residual and the first norm's output, whose type_as stays that norm's"
    );
    assert_eq!(
        add.sum,
        g.values[value(&g, "x.2")].producer,
        "the MLP's residual"
    );
    assert_eq!(g.nodes[m.node].outputs[0], value(&g, "263"));
    assert_eq!(
        m.form(),
        "rmsnorm_weight1p",
        "the fallback replays the norm's own form"
    );
    // Every node from the add to the norm's end but the sum's: the add's is an output.
    assert_eq!(m.nodes().len(), 11);
    assert!(!m.rest.contains(&add.sum.unwrap()));
    // Without the later residual the sum is the norm's alone.
    let last = graph(
        "graph(%x.2: bf16[2,8,64], %286: bf16[2,8,64], %weight.1: bf16[64]):
           %7 = prim::Constant[False]()
           %9 = prim::Constant[None]()
           %10 = prim::Constant[-1]()
           %14 = prim::Constant[6]()
           %15 = prim::Constant[{1.0}]()
           %22 = prim::Constant[{1e-6}]()
           %23 = prim::Constant[True]()
           %24 = prim::Constant[2]()
           %25 = prim::Constant[1]()
           %287 = aten::add(%x.2, %286, %25) : bf16[2,8,64]
           %x.1 = aten::to(%287, %14, %7, %7, %9) : f32[2,8,64]
           %290 = aten::pow(%x.1, %24) : f32[2,8,64]
           %291 = prim::ListConstruct(%10)
           %292 = aten::mean(%290, %291, %23, %9) : f32[2,8,1]
           %293 = aten::add(%292, %22, %25) : f32[2,8,1]
           %294 = aten::rsqrt(%293) : f32[2,8,1]
           %output.1 = aten::mul(%x.1, %294) : f32[2,8,64]
           %296 = aten::to(%weight.1, %14, %7, %7, %9) : f32[64]
           %297 = aten::add(%296, %15, %25) : f32[64]
           %output0.1 = aten::mul(%output.1, %297) : f32[2,8,64]
           %299 = aten::type_as(%output0.1, %287) : bf16[2,8,64]
           return (%299)",
    );
    let m = with_add(&last);
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].problem.rule_id(), "add_rmsnorm_weight1p");
    assert_eq!(m[0].add.as_ref().unwrap().sum, None);
    assert_eq!(m[0].nodes().len(), 11);
}

#[test]
fn an_add_before_aten_rms_norm_but_not_one_an_fp32_traces_upcast_respells() {
    // nn.RMSNorm after a residual add whose sum is read again.
    let g = graph(
        "graph(%r: bf16[4,16,32], %h: bf16[4,16,32], %w: bf16[32]):
           %one = prim::Constant[1]()
           %eps = prim::Constant[1e-05]()
           %c = prim::Constant[32]()
           %shape = prim::ListConstruct(%c)
           %s = aten::add(%r, %h, %one) : bf16[4,16,32]
           %y = aten::rms_norm(%s, %shape, %w, %eps) : bf16[4,16,32]
           %next = aten::add(%s, %y, %one) : bf16[4,16,32]
           return (%next)",
    );
    let m = with_add(&g);
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].problem.rule_id(), "add_rmsnorm_weight_sum");
    assert_eq!(m[0].form(), "rms_norm");
    assert!(m[0].rest.is_empty(), "the add is the sum's node");
    // The zoo's fp32 Llama: the norm's `to(float32)` of the sum is what the residual reads, so
    // the add stays torch's (rules::residual).
    let g = written(
        "f32",
        "f32",
        "%s = aten::add(%x, %h, %one) : f32[2,8,64]
         %xf = aten::to(%s, %f32, %false, %false, %none) : f32[2,8,64]
         %sq = aten::pow(%xf, %two) : f32[2,8,64]
         %var = aten::mean(%sq, %dims, %true, %none) : f32[2,8,1]
         %ve = aten::add(%var, %eps, %one) : f32[2,8,1]
         %r = aten::rsqrt(%ve) : f32[2,8,1]
         %n = aten::mul(%xf, %r) : f32[2,8,64]
         %c = aten::to(%n, %f32, %false, %false, %none) : f32[2,8,64]
         %y = aten::mul(%w, %c) : f32[2,8,64]
         %t = prim::TupleConstruct(%y, %xf)",
    );
    assert!(
        with_add(&g).is_empty(),
        "the call could take over only the upcast's output, which other patterns read through"
    );
    assert_eq!(match_rmsnorms(&g).len(), 1, "the norm alone");
}
