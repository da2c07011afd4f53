"""The held-out survey: families the zoo does not hold, traced small on the CPU as a user traces
them and `fact discover`ed, to find what fact's rules miss in models it was not built on. No GPU:
it reads the plan (patterns by rule, the share of the estimated time left unmatched and where,
the ops a rule saw and refused with its reason), not timings.

    python benches/zoo/survey.py OUT_DIR [--models a,b] [--fact target/release/fact] [--export]

Writes OUT_DIR/NAME.pt, OUT_DIR/NAME.plan.json (discover's JSON), OUT_DIR/survey.json (one entry a
model) and OUT_DIR/survey.md (a table and each model's largest unmatched regions). A model that
does not build or trace is listed with torch's error: that is the library's limit, not fact's.
`--export` also exports each family as a user does (`torch.export.export(..., strict=False)`,
batch and length dynamic where the model allows), discovers OUT_DIR/NAME.pt2, and says whether its
patterns (rules and counts) are the trace's, and where they differ.
Sizes are small on purpose (2 layers, vocabulary 1024, T 64, batch 1): the graph's ops, not its
shapes, are what the survey reads. When a family joins the zoo (benches/zoo/models.py, with its
expectations in tests/zoo.rs), drop it here.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import warnings
from collections import Counter

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as zoo  # noqa: E402

LAYERS = 2
VOCAB = 1024
SEQ = 64


def causal(config, model, **kw):
    import transformers

    return zoo.CausalLM(getattr(transformers, model)(getattr(transformers, config)(**kw)))


def encoder(config, model, **kw):
    import transformers

    return zoo.Encoder(getattr(transformers, model)(getattr(transformers, config)(**kw)))


def vision(name):
    import torchvision

    return getattr(torchvision.models, name)()


def hf_image(config, model, **kw):
    import transformers

    return zoo.HFImage(getattr(transformers, model)(getattr(transformers, config)(**kw)))


L, V = LAYERS, VOCAB
# name -> (builder, kind): "causal" takes token ids, "encoder" ids and a padding mask, "image" a
# 224x224 image.
FAMILIES = {
    "mistral": (lambda: causal("MistralConfig", "MistralForCausalLM", hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, intermediate_size=3584, num_hidden_layers=L, vocab_size=V), "causal"),
    "gemma2": (lambda: causal("Gemma2Config", "Gemma2ForCausalLM", hidden_size=1024, num_attention_heads=8, num_key_value_heads=4, head_dim=256, intermediate_size=4096, num_hidden_layers=L, vocab_size=V), "causal"),
    "stablelm": (lambda: causal("StableLmConfig", "StableLmForCausalLM", hidden_size=1024, num_attention_heads=16, num_key_value_heads=16, intermediate_size=2816, num_hidden_layers=L, vocab_size=V, partial_rotary_factor=0.25), "causal"),
    "olmo2": (lambda: causal("Olmo2Config", "Olmo2ForCausalLM", hidden_size=1024, num_attention_heads=16, num_key_value_heads=16, intermediate_size=2816, num_hidden_layers=L, vocab_size=V), "causal"),
    "granite": (lambda: causal("GraniteConfig", "GraniteForCausalLM", hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, intermediate_size=2816, num_hidden_layers=L, vocab_size=V), "causal"),
    "bloom": (lambda: causal("BloomConfig", "BloomForCausalLM", hidden_size=1024, n_head=16, n_layer=L, vocab_size=V), "causal"),
    "roberta": (lambda: encoder("RobertaConfig", "RobertaModel", num_hidden_layers=L, vocab_size=V), "encoder"),
    "distilbert": (lambda: encoder("DistilBertConfig", "DistilBertModel", n_layers=L, vocab_size=V), "encoder"),
    "electra": (lambda: encoder("ElectraConfig", "ElectraModel", num_hidden_layers=L, vocab_size=V), "encoder"),
    "deberta_v2": (lambda: encoder("DebertaV2Config", "DebertaV2Model", num_hidden_layers=L, vocab_size=V), "encoder"),
    "t5_encoder": (lambda: encoder("T5Config", "T5EncoderModel", num_layers=L, vocab_size=V), "encoder"),
    "swin_t": (lambda: vision("swin_t"), "image"),
    "maxvit_t": (lambda: vision("maxvit_t"), "image"),
    "vit_b_32": (lambda: vision("vit_b_32"), "image"),
    "convnext_small": (lambda: vision("convnext_small"), "image"),
    "efficientnet_b0": (lambda: vision("efficientnet_b0"), "image"),
    "regnet_y_400mf": (lambda: vision("regnet_y_400mf"), "image"),
    "resnext50_32x4d": (lambda: vision("resnext50_32x4d"), "image"),
    "densenet121": (lambda: vision("densenet121"), "image"),
    # The second group (first surveyed in benches/results/survey/2026-11-27-cpu-494f83f): more
    # decoders (multi-query, parallel blocks, ALiBi, experts), encoders with their own position
    # schemes, Hugging Face vision backbones and torchvision's other families.
    "starcoder2": (lambda: causal("Starcoder2Config", "Starcoder2ForCausalLM", hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, intermediate_size=4096, num_hidden_layers=L, vocab_size=V), "causal"),
    "gpt_bigcode": (lambda: causal("GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_embd=1024, n_head=16, n_layer=L, vocab_size=V, multi_query=True), "causal"),
    "phi": (lambda: causal("PhiConfig", "PhiForCausalLM", hidden_size=1024, num_attention_heads=16, intermediate_size=4096, num_hidden_layers=L, vocab_size=V, partial_rotary_factor=0.5), "causal"),
    "olmo": (lambda: causal("OlmoConfig", "OlmoForCausalLM", hidden_size=1024, num_attention_heads=16, intermediate_size=2816, num_hidden_layers=L, vocab_size=V), "causal"),
    "nemotron": (lambda: causal("NemotronConfig", "NemotronForCausalLM", hidden_size=1024, num_attention_heads=16, num_key_value_heads=4, intermediate_size=4096, num_hidden_layers=L, vocab_size=V), "causal"),
    "mixtral": (lambda: causal("MixtralConfig", "MixtralForCausalLM", hidden_size=512, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1024, num_hidden_layers=L, vocab_size=V, num_local_experts=4, num_experts_per_tok=2), "causal"),
    "albert": (lambda: encoder("AlbertConfig", "AlbertModel", num_hidden_layers=L, vocab_size=V), "encoder"),
    "dinov2": (lambda: hf_image("Dinov2Config", "Dinov2Model", num_hidden_layers=L), "image"),
    "clip_vision": (lambda: hf_image("CLIPVisionConfig", "CLIPVisionModel", num_hidden_layers=L), "image"),
    "efficientnet_v2_s": (lambda: vision("efficientnet_v2_s"), "image"),
    "shufflenet_v2_x1_0": (lambda: vision("shufflenet_v2_x1_0"), "image"),
    "regnet_x_400mf": (lambda: vision("regnet_x_400mf"), "image"),
    "resnet18": (lambda: vision("resnet18"), "image"),
    "mnasnet1_0": (lambda: vision("mnasnet1_0"), "image"),
    "googlenet": (lambda: vision("googlenet"), "image"),
    "vgg11_bn": (lambda: vision("vgg11_bn"), "image"),
}


def built(name, save):
    """Builds family `name` (seeded, eval mode) and its inputs and passes them to `save(module,
    inputs, kind)`; returns None, or torch's error in one line (the library's or torch's limit:
    reported, the survey goes on)."""
    build, kind = FAMILIES[name]
    torch.manual_seed(zoo.SEED)
    try:
        module = build().eval()
        with torch.no_grad():
            save(module, model_inputs(kind), kind)
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"


def trace(name, path):
    """Traces family `name` into `path`."""
    return built(name, lambda m, inputs, _: torch.jit.trace(m, inputs, strict=False, check_trace=False).save(path))


def export(name, path):
    """Exports family `name` into `path` as the zoo exports its models (batch and length Dim.AUTO)."""
    from torch.export import Dim

    def save(module, inputs, kind):
        dims = {0: Dim.AUTO} if kind == "image" else {0: Dim.AUTO, 1: Dim.AUTO}
        program = torch.export.export(module, inputs, dynamic_shapes=tuple(dims for _ in inputs), strict=False)
        torch.export.save(program, path)

    return built(name, save)


def model_inputs(kind):
    if kind == "image":
        return (torch.randn(1, 3, 224, 224),)
    ids = torch.randint(0, VOCAB, (1, SEQ))
    return (ids,) if kind == "causal" else zoo.padding(ids, SEQ)


def rule_counts(plan):
    return Counter(re.sub(r"_[0-9a-f]{8}$", "", p["rule"]) for p in plan["patterns"])


def discover(fact, path):
    """discover's plan of `path`, or its error in one line."""
    run = subprocess.run([fact, "discover", path, "--json"], capture_output=True, text=True)
    if run.returncode != 0:
        return None, "fact discover failed: " + " ".join(run.stderr.split())[-300:]
    return json.loads(run.stdout)["plan"], None


def parity(name, out, fact, traced):
    """The .pt2 side of an entry: export, discover, and the rules whose counts differ from the
    trace's (`rule: trace -> pt2`)."""
    path = os.path.join(out, f"{name}.pt2")
    error = export(name, path)
    if error is not None:
        return {"pt2_error": "does not export: " + error}
    plan, error = discover(fact, path)
    if error is not None:
        return {"pt2_error": error}
    found = rule_counts(plan)
    diff = [f"{r}: {traced.get(r, 0)} -> {found.get(r, 0)}" for r in sorted(set(traced) | set(found)) if traced.get(r, 0) != found.get(r, 0)]
    return {"pt2_patterns": dict(sorted(found.items())), "pt2_diff": diff}


def summarize(name, plan):
    """One model's entry from discover's JSON plan."""
    rules = rule_counts(plan)
    return {
        "model": name,
        "patterns": dict(sorted(rules.items())),
        "unmatched_share": round(plan["unmatched_share"], 3),
        "memo_share": round(plan.get("memo_share", 0.0), 3),
        "unmatched": [
            {"share": round(u["est_ms"] / plan["total_est_ms"], 3), "ops": u["name"]}
            for u in sorted(plan["unmatched"], key=lambda u: -u["est_ms"])[:4]
        ],
        "refused": sorted({f"{r['kind']}: {r['reason']}" for r in plan["unmatched_gemms"]}),
    }


def pt2_status(e):
    if "pt2_error" in e:
        return e["pt2_error"]
    if "error" in e:
        return f"{sum(e['pt2_patterns'].values())} patterns (no trace to compare)"
    return "the trace's patterns" if not e["pt2_diff"] else "differs: " + "; ".join(e["pt2_diff"])


def write_md(out, entries):
    lines = [
        "# Held-out survey",
        "",
        "`python benches/zoo/survey.py` (CPU, no timings): each family traced small and discovered;",
        "the share is of discover's estimated time (its cost model, not a measurement); the memo's",
        "share is what the composed module computes once per input shape (masks, positions).",
        "",
        "| model | patterns by rule | memo share | unmatched share |",
        "|---|---|---|---|",
    ]
    exported = any("pt2_error" in e or "pt2_patterns" in e for e in entries)
    if exported:
        lines[-2] = lines[-2] + " from `.pt2` |"
        lines[-1] = lines[-1] + "---|"
    for e in entries:
        pt2 = f" {pt2_status(e)} |" if exported else ""
        if "error" in e:
            lines.append(f"| {e['model']} | does not trace: {e['error']} | - | - |{pt2}")
            continue
        pats = ", ".join(f"{r} {n}" for r, n in e["patterns"].items())
        lines.append(f"| {e['model']} | {pats} | {e['memo_share']:.0%} | {e['unmatched_share']:.0%} |{pt2}")
    lines.append("")
    for e in entries:
        if "error" in e or not (e["unmatched"] or e["refused"]):
            continue
        lines.append(f"## {e['model']}")
        for u in e["unmatched"]:
            ops = u["ops"] if len(u["ops"]) < 200 else u["ops"][:200] + " …"
            lines.append(f"- {u['share']:.1%} unmatched: {ops}")
        for r in e["refused"]:
            lines.append(f"- refused: {r}")
        lines.append("")
    with open(os.path.join(out, "survey.md"), "w") as f:
        f.write("\n".join(lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--models", help="comma-separated families (default: all): " + ", ".join(FAMILIES))
    ap.add_argument("--fact", default="target/release/fact")
    ap.add_argument("--export", action="store_true", help="also export each family and compare its .pt2's patterns with the trace's")
    args = ap.parse_args()
    names = args.models.split(",") if args.models else list(FAMILIES)
    if bad := [n for n in names if n not in FAMILIES]:
        raise SystemExit(f"unknown families {bad}: the survey has {', '.join(FAMILIES)}")
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    entries = []
    for i, name in enumerate(names, 1):
        path = os.path.join(args.out, f"{name}.pt")
        error = trace(name, path)
        if error is None:
            plan, error = discover(args.fact, path)
        if error is not None:
            entries.append({"model": name, "error": error})
        else:
            with open(os.path.join(args.out, f"{name}.plan.json"), "w") as f:
                json.dump(plan, f)
            entries.append(summarize(name, plan))
        e = entries[-1]
        if args.export:
            e.update(parity(name, args.out, args.fact, e.get("patterns", {})))
        status = e.get("error") or f"{sum(e['patterns'].values())} patterns, {e['unmatched_share']:.0%} unmatched"
        if args.export:
            status += "; .pt2: " + pt2_status(e)
        print(f"[{i}/{len(names)}] {name}: {status}", flush=True)
    with open(os.path.join(args.out, "survey.json"), "w") as f:
        json.dump(entries, f, indent=1)
    write_md(args.out, entries)
    print(f"wrote {os.path.join(args.out, 'survey.md')}")


if __name__ == "__main__":
    main()
