"""The ways to run a composed `.pt2` eagerly, timed in turns in one process on the GPU machine:
its TorchScript copy of the original (`orig_ts`, no fact op), the program as
`torch.export.load(...).module()` (`ep`), the same without its input-check pre-hook
(`ep_nohook`), and the composed TorchScript copy (`ts`, what `fact.load` runs), each with its
error against the original copy.

    python3 benches/device/eager_runners.py MODEL FOLDER

MODEL is a zoo or held-out model (benches/zoo/models.py), FOLDER what `fact compose ... --out
FOLDER --torchscript-copy` wrote. Prints one JSON object of medians in ms.
"""
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "benches" / "device"), str(REPO / "benches" / "zoo"), str(REPO / "python")]
import fact  # noqa: E402
import harness  # noqa: E402
import models  # noqa: E402


def main():
    name, folder = sys.argv[1], Path(sys.argv[2])
    m = models.by_name()[name]
    xs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in m.inputs(ci=False, device="cuda"))
    fact.load_library(folder / "libfact_ops.so")
    ep = torch.export.load(str(folder / "composed.pt2")).module()
    ep_nohook = torch.export.load(str(folder / "composed.pt2")).module()
    for h in list(ep_nohook._forward_pre_hooks):
        del ep_nohook._forward_pre_hooks[h]
    ts = torch.jit.load(str(folder / "torchscript" / "composed.pt"), map_location="cuda")
    orig = torch.jit.load(str(folder / "torchscript" / "original.pt"), map_location="cuda")
    runners = {"orig_ts": orig, "ep": ep, "ep_nohook": ep_nohook, "ts": ts}
    with torch.no_grad():
        want = orig(*xs).double()
        errors = {k: ((f(*xs).double() - want).norm() / want.norm()).item() for k, f in runners.items()}
        ms = harness.time_interleaved(runners, xs, torch.empty(64 << 20, dtype=torch.int8, device="cuda"))
    print(json.dumps({"model": name, "ms": ms, "error": errors}))


if __name__ == "__main__":
    main()
