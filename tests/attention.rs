//! Attention as Hugging Face's sdpa path calls it, end to end on the CPU: the bridge classifies each
//! SDPA mask's value at load (the graph's mask facts), the rule matches by them and reads k and v
//! through their head repeat, and the composed module's op falls back to exactly the graph's call.
//! Fixtures: sdpa_*.pt (tests/fixtures/make_models.py, `SdpaAttention`).

use crate::common::{fixture, outputs_differ_by};
use fact::graph::{Graph, MaskClass, MaskFact};
use fact::kinds::attention::{match_attention, sdpa_refusals};
use fact::torch::{self, InputShape};
use std::path::Path;
use tch::{Kind, Tensor};

fn sdpa_node(g: &Graph) -> usize {
    let found: Vec<usize> = (0..g.nodes.len())
        .filter(|&n| g.nodes[n].kind == "aten::scaled_dot_product_attention")
        .collect();
    assert_eq!(found.len(), 1);
    found[0]
}

fn mask_fact(g: &Graph) -> Option<MaskFact> {
    g.values[g.nodes[sdpa_node(g)].inputs[3]].mask
}

fn fact_of(class: MaskClass, shape_only: bool) -> Option<MaskFact> {
    Some(MaskFact { class, shape_only })
}

#[test]
fn sdpa_masks_are_classified_at_load_and_matched_by_class() {
    let load = |name: &str| torch::load_graph(&fixture(name), &[]).unwrap().0;

    // Causal from positions (shape-only, so the op classifies it once per shape: `static`), K/V
    // repeated by repeat_kv: the match reads the un-repeated [2,2,16,16] tensors and owns the
    // repeat's nodes.
    let g = load("sdpa_causal_repeat.pt");
    assert_eq!(mask_fact(&g), fact_of(MaskClass::Causal, true));
    let a = &match_attention(&g)[0];
    assert_eq!(
        (a.problem.rule_id(), a.problem.kv_heads, a.repeat, a.form()),
        (
            "sdpa_causal_mask".to_string(),
            Some(2),
            Some(2),
            "sdpa;mask=bool;repeat=2;class=causal;static".to_string()
        )
    );
    assert_eq!(g.tensor(a.k).unwrap().shape, vec![2, 2, 16, 16]);
    let kinds: Vec<&str> = a.nodes.iter().map(|&n| g.nodes[n].kind.as_str()).collect();
    for (kind, count) in [
        ("aten::reshape", 2),
        ("aten::expand", 2),
        ("aten::unsqueeze", 2),
    ] {
        assert_eq!(
            kinds.iter().filter(|&&k| k == kind).count(),
            count,
            "{kinds:?}"
        );
    }

    // All-visible and'ed with an attention_mask input: it reads input data, classified on the
    // probe of ones (no stored values), so the kernel is the padded one; enable_gqa reads k and v
    // with their own 2 heads.
    let g = load("sdpa_padded_gqa.pt");
    assert_eq!(mask_fact(&g), fact_of(MaskClass::None, false));
    let a = &match_attention(&g)[0];
    assert_eq!(
        (a.problem.rule_id(), a.problem.kv_heads, a.form()),
        (
            "sdpa_padded".to_string(),
            Some(2),
            "sdpa;mask=bool;gqa;class=padded".to_string()
        )
    );
    assert_eq!(a.nodes, vec![sdpa_node(&g)]);

    // An additive mask of 0 and finfo.min is causal too.
    let g = load("sdpa_causal_additive.pt");
    assert_eq!(mask_fact(&g), fact_of(MaskClass::Causal, true));
    let a = &match_attention(&g)[0];
    assert_eq!(
        (a.problem.kv_heads, a.form().as_str()),
        (None, "sdpa;mask=add;class=causal;static")
    );

    // A sliding window of 4 keys is general at T 16: no match, and the plan says why. At T 4 the
    // same shape-only mask is causal: a class holds at the shapes it was evaluated at only.
    let g = load("sdpa_window.pt");
    assert_eq!(mask_fact(&g), fact_of(MaskClass::General, true));
    assert!(match_attention(&g).is_empty());
    let refusals = sdpa_refusals(&g);
    assert_eq!(refusals.len(), 1);
    assert!(refusals[0].1.contains("general"), "{refusals:?}");
    let short = [InputShape::parse("2x4x64:f32").unwrap()];
    let (g, _) = torch::load_graph(&fixture("sdpa_window.pt"), &short).unwrap();
    assert_eq!(mask_fact(&g), fact_of(MaskClass::Causal, true));
}

/// GPT-J's eager attention (q and k cast to fp32, the mask added to the scores, the probabilities
/// cast back): the bridge classifies the added mask as it does SDPA's, and the explicit rule
/// matches by its class: causal from positions (static), or padded where an attention_mask input
/// is and'ed in.
#[test]
fn added_masks_of_eager_attention_are_classified_and_matched() {
    let load = |name: &str| torch::load_graph(&fixture(name), &[]).unwrap().0;
    let added = |g: &Graph| {
        let sm = (0..g.nodes.len())
            .find(|&n| g.nodes[n].kind == "aten::softmax")
            .unwrap();
        let add = g.values[g.nodes[sm].inputs[0]].producer.unwrap();
        g.values[g.nodes[add].inputs[1]].mask
    };
    let g = load("eager_causal.pt");
    assert_eq!(added(&g), fact_of(MaskClass::Causal, true));
    let a = &match_attention(&g)[0];
    assert!(a.upcast);
    assert_eq!(
        (a.problem.rule_id(), a.form()),
        (
            "attention_causal_mask".to_string(),
            "explicit;div=4.0;mask=add;class=causal;static;upcast".to_string()
        )
    );
    let g = load("eager_padded.pt");
    assert_eq!(added(&g), fact_of(MaskClass::Causal, false));
    let a = &match_attention(&g)[0];
    assert_eq!(
        a.form(),
        "explicit;div=4.0;mask=add;class=causal_padded;upcast"
    );
}

/// The zoo's `name` as traced, its `count` attention patterns (each one `is` describes) rewritten
/// with kernel `kernel` into `dir`: the rewritten graph's text, once the module is checked to
/// compute the model's output on `inputs` (token ids when none) through the op's fallback
/// (within 1e-5).
fn zoo_attention_rewritten(
    dir: &Path,
    name: &str,
    kernel: &str,
    (count, inputs): (usize, &[Tensor]),
    is: impl Fn(&fact::kinds::attention::AttentionMatch) -> bool,
) -> String {
    let model = crate::common::zoo_fixtures().join(format!("{name}.pt"));
    let (g, _) = torch::load_graph(&model, &[]).unwrap();
    let found = match_attention(&g);
    assert_eq!(found.len(), count, "{name}");
    assert!(found.iter().all(is), "{name}");
    let edits: Vec<_> = found
        .iter()
        .map(|a| fact::kinds::attention::edit(&g, a, kernel))
        .collect();
    let out = dir.join(format!("{name}.pt"));
    let text = torch::rewrite_and_save(&model, &out, &edits, &fact::kinds::registry::op_schemas())
        .unwrap();
    let ids = [Tensor::randint(
        1024,
        [1, 64],
        (Kind::Int64, tch::Device::Cpu),
    )];
    let diff = outputs_differ_by(&model, &out, if inputs.is_empty() { &ids } else { inputs });
    assert!(diff <= 1e-5, "{name}: differs by {diff}");
    text
}

/// Each fixture composed with its attention pattern (kernel "a", which the library does not hold)
/// computes what the original computes on CPU tensors, the mask classes the kernels would not take
/// included: the fallback repeats k and v as the graph did and passes the same mask, is_causal,
/// scale and enable_gqa. Run by `gemm_ep_falls_back_to_the_original_ops_on_cpu`, which holds this
/// process's op library.
pub fn composed_sdpa_falls_back_exactly(library: &Path) {
    let dir = tempfile::tempdir().unwrap();
    torch::op_stats(library, true).unwrap();
    let x = Tensor::randn([2, 16, 64], (Kind::Float, tch::Device::Cpu));
    // Right padding for the second sequence, then left padding (a general mask).
    let right = Tensor::ones([2, 16], (Kind::Int64, tch::Device::Cpu));
    let _ = right.narrow(1, 10, 6).narrow(0, 1, 1).fill_(0);
    let left = Tensor::ones([2, 16], (Kind::Int64, tch::Device::Cpu));
    let _ = left.narrow(1, 0, 3).narrow(0, 0, 1).fill_(0);
    let cases: [(&str, Vec<Tensor>); 8] = [
        ("sdpa_causal_repeat.pt", vec![x.shallow_clone()]),
        (
            "sdpa_padded_gqa.pt",
            vec![x.shallow_clone(), right.shallow_clone()],
        ),
        ("sdpa_causal_additive.pt", vec![x.shallow_clone()]),
        ("sdpa_padded_gqa.pt", vec![x.shallow_clone(), left]),
        ("eager_causal.pt", vec![x.shallow_clone()]),
        (
            "eager_padded.pt",
            vec![x.shallow_clone(), right.shallow_clone()],
        ),
        // Hugging Face's eager attention: the softmax in fp32, the probabilities cast back;
        // then with grouped K/V heads repeated by repeat_kv, which the fallback repeats.
        ("eager_f32_softmax.pt", vec![x.shallow_clone()]),
        ("eager_gqa.pt", vec![x.shallow_clone()]),
    ];
    for (name, inputs) in cases {
        let (g, _) = torch::load_graph(&fixture(name), &[]).unwrap();
        let a = &match_attention(&g)[0];
        let out = dir.path().join(name);
        let text = torch::rewrite_and_save(
            &fixture(name),
            &out,
            &[fact::kinds::attention::edit(&g, a, "a")],
            &fact::kinds::registry::op_schemas(),
        )
        .unwrap();
        assert!(
            !text.contains("scaled_dot_product_attention") && !text.contains("aten::softmax"),
            "{text}"
        );
        if a.repeat.is_some() {
            let before = torch::graph_text(&fixture(name)).unwrap();
            let count = |t: &str| t.matches("aten::reshape(").count();
            assert_eq!(
                count(&text) + 2,
                count(&before),
                "k's and v's repeats are gone: {text}"
            );
        }
        let diff = outputs_differ_by(&fixture(name), &out, &inputs);
        assert!(diff <= 1e-6, "{name}: differs by {diff}");
    }
    // The zoo's GPT-J as traced, both layers' eager attention and q-and-k rotations rewritten at
    // once (each rotation pair given q's cos and sin, k's equal ones left unread): the graph's
    // casts, added mask, dropout and rotations go, and the outputs stay the model's.
    let gptj = crate::common::zoo_fixtures().join("gptj.pt");
    let (g, _) = torch::load_graph(&gptj, &[]).unwrap();
    let found = match_attention(&g);
    assert_eq!(found.len(), 2);
    let mut edits: Vec<_> = found
        .iter()
        .map(|a| fact::kinds::attention::edit(&g, a, "a"))
        .collect();
    let pairs: Vec<_> = fact::kinds::rotary::match_rotary(&g)
        .into_iter()
        .filter(|m| m.k.is_some())
        .collect();
    assert_eq!(pairs.len(), 2);
    edits.extend(pairs.iter().map(|m| fact::kinds::rotary::edit(&g, m, "r")));
    let out = dir.path().join("gptj.pt");
    let text =
        torch::rewrite_and_save(&gptj, &out, &edits, &fact::kinds::registry::op_schemas()).unwrap();
    assert!(
        !text.contains("aten::softmax") && text.matches("fact::rotary_qk(").count() == 2,
        "{text}"
    );
    let ids = Tensor::randint(1024, [1, 64], (Kind::Int64, tch::Device::Cpu));
    let diff = outputs_differ_by(&gptj, &out, &[ids]);
    assert!(diff <= 1e-5, "gptj: differs by {diff}");
    // The zoo's GPT-Neo as traced: both layers' attention (a where over the scores under the
    // added mask, the q and k casts left to the sizes that read them) rewritten, kernel "n".
    let text = zoo_attention_rewritten(dir.path(), "gpt_neo", "n", (2, &[]), |a| {
        a.cond.is_some() && a.upcast
    });
    assert!(
        !text.contains("aten::softmax") && text.matches("fact::attention(").count() == 2,
        "{text}"
    );
    // The casts of q and k the pattern left for their sizes go too: the sizes read q and k
    // (two layers: the probabilities' casts went with the patterns, q's and k's after them).
    let before = torch::graph_text(&crate::common::zoo_fixtures().join("gpt_neo.pt")).unwrap();
    let casts = |t: &str| t.matches("aten::to(").count();
    assert_eq!(casts(&before) - casts(&text), 2 + 4, "{text}");
    // The zoo's CodeGen as traced: the mask added before the scale (`scale_last`), kernel "cg".
    let text = zoo_attention_rewritten(dir.path(), "codegen", "cg", (2, &[]), |a| {
        a.scale_last && a.upcast && a.problem.causal
    });
    assert!(
        !text.contains("aten::softmax") && text.matches("scale_last").count() == 2,
        "{text}"
    );
    // The zoo's T5 encoder: SDPA's float mask is the relative position bias selected by the
    // padding mask (a where the op replays), the last 8 tokens padded (kernel "t5").
    let ids = Tensor::randint(1024, [1, 64], (Kind::Int64, tch::Device::Cpu));
    let keep = Tensor::ones([1, 64], (Kind::Int64, tch::Device::Cpu));
    let _ = keep.narrow(1, 56, 8).fill_(0);
    let text = zoo_attention_rewritten(dir.path(), "t5_encoder", "t5", (2, &[ids, keep]), |a| {
        a.problem.bias.is_some()
            && a.form()
                == "sdpa;mask=add;where;fill=-3.4028234663852886e38;class=padded;bias;scale=1.0"
    });
    assert_eq!(text.matches("fact::attention(").count(), 2, "{text}");
    // The zoo's Swin: every window's attention adds the relative position bias, the shifted
    // ones their window mask with it (kernel "sw"), q's scale (a tensor torchvision computes from
    // a traced size) the kernel's.
    let image = Tensor::randn([1, 3, 224, 224], (Kind::Float, tch::Device::Cpu));
    let text = zoo_attention_rewritten(dir.path(), "swin_t", "sw", (8, &[image]), |a| {
        a.problem.rule_id().starts_with("attention_bias")
            && a.form()
                .starts_with("explicit;mul=tensor;scale_q;mask=add;class=none;bias")
    });
    assert_eq!(text.matches("fact::attention(").count(), 8, "{text}");
    assert_eq!(text.matches(";windows\"").count(), 3, "{text}");
    // The zoo's Swin V2: cosine attention, the logit scale one per head (the op's scale
    // operand), the bias of an MLP added, the shifted blocks' window masks with it (kernel "s2").
    let image = Tensor::randn([1, 3, 224, 224], (Kind::Float, tch::Device::Cpu));
    let text = zoo_attention_rewritten(dir.path(), "swin_v2_t", "s2", (8, &[image]), |a| {
        a.scale_operand().is_some()
            && a.form()
                .starts_with("explicit;mul=tensor;mask=add;class=none;bias")
    });
    assert_eq!(text.matches(";windows\"").count(), 3, "{text}");
    // The zoo's BEiT: each layer's SDPA adds the relative position bias through its float mask
    // (kernel "bt"); the bias, gathered from its table by the index BEiT rebuilds in place each
    // forward, is the memo's, and the module still computes the model's output.
    let image = Tensor::randn([1, 3, 224, 224], (Kind::Float, tch::Device::Cpu));
    let text = zoo_attention_rewritten(dir.path(), "beit", "bt", (2, &[image]), |a| {
        a.problem.bias.is_some() && a.form().starts_with("sdpa;mask=add;class=none;bias")
    });
    assert_eq!(text.matches("fact::attention(").count(), 2, "{text}");
    assert!(text.contains("fact::memo_get("), "{text}");
    // The zoo's MPNet: each layer's eager attention adds the relative position bias in place,
    // then the padding mask (kernel "mp"; the last 8 tokens padded): the op adds the bias beside
    // the mask's class, and the fallback adds both in the graph's order.
    let ids = Tensor::randint(1024, [1, 64], (Kind::Int64, tch::Device::Cpu));
    let keep = Tensor::ones([1, 64], (Kind::Int64, tch::Device::Cpu));
    let _ = keep.narrow(1, 56, 8).fill_(0);
    let text = zoo_attention_rewritten(dir.path(), "mpnet", "mp", (2, &[ids, keep]), |a| {
        a.form() == "explicit;div=8.0;mask=add;class=padded;plus=before"
    });
    assert_eq!(text.matches("fact::attention(").count(), 2, "{text}");
    // The zoo's MPT: ALiBi's row of keys per head added before the causal fill of finfo.min,
    // the softmax over `x.float()` (kernel "al"): the fallback fills with the same value.
    let text = zoo_attention_rewritten(dir.path(), "mpt", "al", (2, &[]), |a| {
        a.problem.bias == Some(fact::kinds::attention::AttentionBias::Keys)
            && a.form()
                .contains(";mask=fill;fill=-3.4028234663852886e38;plus=before")
    });
    assert!(!text.contains("aten::masked_fill"), "{text}");
    let calls = torch::op_stats(library, false).unwrap();
    for (kernel, n) in [
        ("t5", 2),
        ("sw", 8),
        ("bt", 2),
        ("mp", 2),
        ("al", 2),
        ("s2", 8),
    ] {
        assert_eq!(
            calls.get(kernel).map(|c| (c.ran, c.fell_back)),
            Some((0, n)),
            "{calls:?}"
        );
    }
    assert_eq!(
        calls.get("cg").map(|c| (c.ran, c.fell_back)),
        Some((0, 2)),
        "{calls:?}"
    );
    assert_eq!(
        calls
            .get("a")
            .map(|c| (c.ran, c.fell_back, c.why.as_deref())),
        Some((0, 10, Some("not CUDA tensors of one device"))),
        "{calls:?}"
    );
    assert_eq!(
        calls.get("n").map(|c| (c.ran, c.fell_back)),
        Some((0, 2)),
        "{calls:?}"
    );
    assert_eq!(
        calls.get("r").map(|c| (c.ran, c.fell_back)),
        Some((0, 2)),
        "{calls:?}"
    );
}
