"""The steady choice against the sample's winners (issue 52, rows past the sample): one zoo
model exported at its zoo shape, composed twice from the same user table (`--steady on` and
`--steady off`), then each composition's TorchScript copy timed at the grid's shapes in its own
process (two op libraries cannot share one), in turns A B A B, each checked against the traced
original first.

    python3 benches/device/steady_ab.py OUT --model llama --shapes 8x549,8x576,4x1024

OUT/NAME.steady.json holds every process's medians (L2 flushed, 30 iterations) per shape."""
import argparse
import json
import subprocess
import sys
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="llama")
    ap.add_argument("--shapes", default="8x549,8x576,4x1024")
    ap.add_argument("--fact", default=".device/fact")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    model = models.by_name()[args.model]
    shapes = args.shapes.split(",")
    torch.set_grad_enabled(False)
    if args.child:
        print(json.dumps(child(args.child[0], shapes, model)))
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
                                "--child", str(folder), "x"], capture_output=True, text=True)
            res = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else {"error": p.stderr[-2000:]}
            rec["runs"].append({"steady": steady, "shapes": res})
            write_json(path, rec)
            print(steady, res, flush=True)


if __name__ == "__main__":
    main()
