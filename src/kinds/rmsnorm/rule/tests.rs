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
