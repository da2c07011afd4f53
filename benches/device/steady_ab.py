"""The steady choice against the sample's winners (issue 52, rows past the sample): one zoo
model exported at its zoo shape, composed twice from the same user table (`--steady on` and
`--steady off`), then each composition's TorchScript copy timed at the grid's shapes in its own
process (two op libraries cannot share one), in turns A B A B, each checked against the traced
original first. `--against-compile` then times the `--steady on` composition's TorchScript copy
against torch.compile of the model in one process (torch.compile's output the reference).

    python3 benches/device/steady_ab.py OUT --model llama --shapes 8x549,8x576,4x1024 [--against-compile]

OUT/NAME.steady.json holds every process's medians (L2 flushed, 30 iterations) per shape;
OUT/NAME.steady_ratio.json the ratios."""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zoo"))
import serve  # noqa: E402
import fact  # noqa: E402
import models  # noqa: E402
from harness import flush_buffer, rel_err, time_interleaved, write_json  # noqa: E402


def child(folder, shapes, model):
    """Times the composition in `folder` at each shape: {shape: ms}, with its error."""
    fact.load_library(Path(folder) / "libfact_ops.so")
    ts = torch.jit.load(str(Path(folder) / "torchscript" / "composed.pt"), map_location="cuda")
    orig = torch.jit.load(str(Path(folder) / "torchscript" / "original.pt"), map_location="cuda")
    out = {}
    flush = flush_buffer()
    with torch.no_grad():
        for s in shapes:
            b, t = (int(x) for x in s.split("x"))
            xs = serve.inputs_at(model, b, t, models.SEED)
            err = rel_err(ts(*xs).float(), orig(*xs).float())
            ms = time_interleaved({"ts": ts}, xs, flush)["ts"]
            out[s] = {"ms": round(ms, 4), "err_vs_original": err}
    return out


def against_compile(folder, shapes, model, path, fact_bin):
    """The composition in `folder` as TorchScript against torch.compile of the model, in turns."""
    torch.set_float32_matmul_precision("high")
    fact.load_library(Path(folder) / "libfact_ops.so")
    ts = torch.jit.load(str(Path(folder) / "torchscript" / "composed.pt"), map_location="cuda")
    compiled = torch.compile(models.build(model, ci=False, device="cuda", dtype=serve.DTYPE))
    rec = {"model": model.name, "gpu": torch.cuda.get_device_name(), "fact_commit": serve.fact_version(fact_bin),
           "composed_at": serve.shape_label(model.batch, model.seq), "steady": "on", "shapes": {}}
    flush = flush_buffer()
    for s in shapes:
        b, t = (int(x) for x in s.split("x"))
        xs = serve.inputs_at(model, b, t, models.SEED)
        start = time.monotonic()
        want = compiled(*xs)
        torch.cuda.synchronize()
        first = time.monotonic() - start
        err = rel_err(ts(*xs).float(), want.float())
        ms = time_interleaved({"ts": ts, "compile": compiled}, xs, flush)
        rec["shapes"][s] = {"fact_ts_ms": round(ms["ts"], 4), "compile_ms": round(ms["compile"], 4),
                            "ratio": round(ms["compile"] / ms["ts"], 3), "err_ts_vs_compile": err,
                            "compile_first_s": round(first, 1)}
        print(s, rec["shapes"][s], flush=True)
        write_json(path, rec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="llama")
    ap.add_argument("--shapes", default="8x549,8x576,4x1024")
    ap.add_argument("--fact", default=".device/fact")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--against-compile", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    model = models.by_name()[args.model]
    shapes = args.shapes.split(",")
    torch.set_grad_enabled(False)
    if args.child:
        print(json.dumps(child(args.child, shapes, model)))
        return
    for sub in ("models", "fact", "logs"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    rec = {"model": model.name, "gpu": torch.cuda.get_device_name(), "fact_commit": serve.fact_version(args.fact),
           "composed_at": serve.shape_label(model.batch, model.seq), "shapes": shapes, "compose": {}, "runs": []}
    path = args.out / f"{model.name}.steady.json"
    rec.update(serve.export_stage(args.out, model))
    for steady in ("on", "off"):
        folder = args.out / "fact" / f"{model.name}_{steady}"
        cmd = [args.fact, "compose", str(args.out / "models" / f"{model.name}.pt2"), "--out", str(folder),
               "--no-bench", "--torchscript-copy", "--json", "--steady", steady]
        with open(args.out / "logs" / f"{steady}.log", "w") as err, open(folder.with_suffix(".json"), "w") as so:
            p = subprocess.run(cmd, stdout=so, stderr=err)
        comp = json.loads(folder.with_suffix(".json").read_text())
        comp = comp.get("compose", comp)
        rec["compose"][steady] = {
            "exit": p.returncode,
            "kernels": sorted({pt["kernel"] for pt in comp["patterns"] if pt.get("kernel")}),
            "steady": [{"id": pt["id"], "kernel": pt["kernel"], **pt["steady"]} for pt in comp["patterns"] if pt.get("steady")],
        }
        write_json(path, rec)
    for _ in range(args.rounds):
        for steady in ("on", "off"):
            folder = args.out / "fact" / f"{model.name}_{steady}"
            p = subprocess.run([sys.executable, __file__, str(args.out), "--model", model.name, "--shapes", args.shapes,
                                "--child", str(folder)], capture_output=True, text=True)
            res = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-2000:]}
            rec["runs"].append({"steady": steady, "shapes": res})
            write_json(path, rec)
            print(steady, res, flush=True)
    if args.against_compile:
        against_compile(args.out / "fact" / f"{model.name}_on", shapes, model,
                        args.out / f"{model.name}.steady_ratio.json", args.fact)


if __name__ == "__main__":
    main()
