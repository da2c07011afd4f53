"""Models the zoo does not hold, composed as a user composes them: built at a realistic size in
bf16 on the GPU (random weights), `fact.compose(model, inputs, dynamic_shapes=...)` (torch.export,
`fact compose`, the composed program loaded), then timed in one process in turns (L2 flushed, CUDA
events, medians; harness.time_interleaved) after each mode is checked against an fp64 copy of the
model: the model eagerly, torch.compile of the model (default), the composition as loaded
(`fact_ms`: its TorchScript copy) and `fact.compile` of it (`fact_compile_ms`), with the op
library's kernel and fallback calls in one forward.

From the repository root on the GPU machine, after `source .device/env.sh`:

    python3 benches/device/held_out.py OUT [--models mistral,dinov2] [--compose-args=--quick] [--budget-s 540] [--profile]

Writes OUT/NAME.json as each model finishes (a stopped call keeps what it measured) and the
compositions under OUT/fact/NAME. `--profile` adds `profile`: where the GPU time of a forward of
the composition as loaded and of `fact.compile` goes (harness.kernel_profile, top kernels).
"""
import argparse
import copy
import datetime
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "benches" / "device"))
sys.path.insert(0, str(ROOT / "benches" / "zoo"))
import fact  # noqa: E402
import models as zoo  # noqa: E402
import serve  # noqa: E402
import survey  # noqa: E402
from harness import flush_buffer, kernel_profile, rel_err, time_interleaved, write_json  # noqa: E402

DTYPE = torch.bfloat16


# name -> (builder, kind, batch, seq): sizes a server would run, families absent from the zoo,
# built as the held-out survey builds its families (at its small sizes).
MODELS = {
    "mistral": (lambda: survey.causal("MistralConfig", "MistralForCausalLM", hidden_size=2048, num_attention_heads=16,
                                      num_key_value_heads=4, intermediate_size=5632, num_hidden_layers=8, vocab_size=32000),
                "causal", 4, 512),
    "starcoder2": (lambda: survey.causal("Starcoder2Config", "Starcoder2ForCausalLM", hidden_size=2048, num_attention_heads=16,
                                         num_key_value_heads=4, intermediate_size=8192, num_hidden_layers=8, vocab_size=49152),
                   "causal", 4, 512),
    "granite": (lambda: survey.causal("GraniteConfig", "GraniteForCausalLM", hidden_size=2048, num_attention_heads=16,
                                      num_key_value_heads=8, intermediate_size=5632, num_hidden_layers=8, vocab_size=49152),
                "causal", 4, 512),
    "roberta": (lambda: survey.encoder("RobertaConfig", "RobertaModel"), "encoder", 16, 384),
    "dinov2": (lambda: survey.hf_image("Dinov2Config", "Dinov2Model"), "image", 32, None),
    "efficientnet_b0": (lambda: survey.vision("efficientnet_b0"), "image", 32, None),
    "regnet_y_1_6gf": (lambda: survey.vision("regnet_y_1_6gf"), "image", 32, None),
    "gemma2": (lambda: survey.causal("Gemma2Config", "Gemma2ForCausalLM", hidden_size=2048, num_attention_heads=8,
                                     num_key_value_heads=4, head_dim=256, intermediate_size=8192, num_hidden_layers=8,
                                     vocab_size=32000),
               "causal", 4, 512),
    "phi": (lambda: survey.causal("PhiConfig", "PhiForCausalLM", hidden_size=2048, num_attention_heads=32,
                                  intermediate_size=8192, num_hidden_layers=8, vocab_size=51200, partial_rotary_factor=0.5),
            "causal", 4, 512),
    "bloom": (lambda: survey.causal("BloomConfig", "BloomForCausalLM", hidden_size=2048, n_head=16, n_layer=8,
                                    vocab_size=32000),
              "causal", 4, 512),
    "resnext50_32x4d": (lambda: survey.vision("resnext50_32x4d"), "image", 32, None),
    "densenet121": (lambda: survey.vision("densenet121"), "image", 32, None),
    "efficientnet_v2_s": (lambda: survey.vision("efficientnet_v2_s"), "image", 32, None),
}


def inputs(kind, batch, seq, vocab, seed):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    if kind == "image":
        return (torch.randn(batch, 3, 224, 224, generator=gen, device="cuda").to(DTYPE),)
    ids = torch.randint(0, vocab, (batch, seq), generator=gen, device="cuda")
    return zoo.padding(ids, seq) if kind == "encoder" else (ids,)


def dynamic(kind):
    from torch.export import Dim

    dims = {0: Dim.AUTO} if kind == "image" else {0: Dim.AUTO, 1: Dim.AUTO}
    return tuple(dims for _ in range(2 if kind == "encoder" else 1))


def run(name, out, compose_args, rec, profile):
    build, kind, batch, seq = MODELS[name]
    torch.manual_seed(0)
    model = build().eval()
    vocab = getattr(getattr(getattr(model, "model", None), "config", None), "vocab_size", 1000)
    ref_model = copy.deepcopy(model).double().cuda()
    model = model.to(device="cuda", dtype=DTYPE)
    rec.update(kind=kind, batch=batch, seq=seq, params_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 1))
    xs = inputs(kind, batch, seq, vocab, 0)
    start = time.monotonic()
    with torch.no_grad():
        composed = fact.compose(model, xs, dynamic_shapes=dynamic(kind), out=out / "fact" / name, args=compose_args, quiet=True)
    rec["compose_s"] = round(time.monotonic() - start, 1)
    lib = out / "fact" / name / "libfact_ops.so"
    modes = {"eager_ms": model}
    with torch.no_grad():
        start = time.monotonic()
        compiled = torch.compile(model)
        compiled(*xs)
        rec["compile_s"] = round(time.monotonic() - start, 1)
        modes["compile_ms"] = compiled
        modes["fact_ms"] = composed
        start = time.monotonic()
        fc = fact.compile(composed)
        fc(*xs)
        rec["fact_compile_s"] = round(time.monotonic() - start, 1)
        modes["fact_compile_ms"] = fc
        # Checked first, on fresh inputs, against fp64.
        for k, fn in modes.items():
            errs = []
            for seed in (1, 2, 3):
                x = inputs(kind, batch, seq, vocab, seed)
                ref = ref_model(*[t.double() if t.is_floating_point() else t for t in x])
                got = fn(*x)
                errs.append(rel_err(got[0] if isinstance(got, (tuple, list)) else got, ref[0] if isinstance(ref, (tuple, list)) else ref))
            rec[k.replace("_ms", "_err")] = max(errs)
        rec["kernel_calls"], rec["fallback_calls"], rec["fallback_why"], _ = serve.Library(lib).counted(composed, xs)
        del ref_model
        torch.cuda.empty_cache()
        flush = flush_buffer()
        rec.update({k: round(v, 4) for k, v in time_interleaved(modes, xs, flush).items()})
        if profile:
            rec["profile"] = {k: kernel_profile(modes[k], xs, top=40) for k in ("fact_ms", "fact_compile_ms")}
    rec["fact_vs_compile"] = round(rec["compile_ms"] / rec["fact_ms"], 3)
    rec["fact_compile_vs_compile"] = round(rec["compile_ms"] / rec["fact_compile_ms"], 3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--models", default="mistral,dinov2")
    ap.add_argument("--compose-args", default="")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    deadline = time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run([*fact.cli(), "--version"], capture_output=True, text=True).stdout.strip()
    for name in args.models.split(","):
        if time.monotonic() > deadline:
            print("budget spent before", name, flush=True)
            break
        rec = {"model": name, "policy": "bf16", "gpu": torch.cuda.get_device_name(), "fact_commit": commit,
               "torch": torch.__version__, "date": f"{datetime.date.today()}", "compose_args": args.compose_args}
        try:
            run(name, args.out, args.compose_args.split(), rec, args.profile)
        except Exception as e:  # noqa: BLE001 -- one model's failure is its record; the next runs
            traceback.print_exc()
            rec["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:600]}"
        write_json(args.out / f"{name}.json", rec)
        print(json.dumps({k: rec.get(k) for k in ("model", "compose_s", "eager_ms", "compile_ms", "fact_ms", "fact_compile_ms",
                                                   "fact_vs_compile", "kernel_calls", "fallback_calls", "error")}), flush=True)


if __name__ == "__main__":
    main()
