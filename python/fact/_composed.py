"""The composed program as `fact.load` returns it for eager calls (see `Composed`)."""
import json
import zipfile
from pathlib import Path

import torch


def program_device(pt2):
    """The device the program's weights were exported on (`cuda:0`), read from the archive's
    program without loading its weights; "cpu" where it names none."""
    with zipfile.ZipFile(pt2) as z:
        name = next((n for n in z.namelist() if n.endswith("models/model.json")), None)
        if name is None:
            return "cpu"
        program = json.loads(z.read(name))
    graph = program.get("graph_module", {}).get("graph", {})
    values = graph.get("tensor_values", {})
    for spec in program.get("graph_module", {}).get("signature", {}).get("input_specs", []):
        kind, body = next(iter(spec.items()))
        if kind not in ("parameter", "buffer"):
            continue
        device = values.get(body.get("arg", {}).get("name"), {}).get("device", {})
        if device.get("type"):
            index = device.get("index")
            return device["type"] if index is None else f"{device['type']}:{index}"
    return "cpu"


class Composed(torch.nn.Module):
    """A composed program for eager calls: each call runs its TorchScript copy (compose writes it
    as torchscript/composed.pt: the same edits, the same op library), whose interpreter issues the
    ops from C++, where `torch.export.load(...).module()` runs the program's Python forward, op by
    op, before the GPU gets each kernel: on an H200 the copy ran StarCoder2 (4 layers, 4 x 1024,
    bf16) in 6.67 ms against the program's 8.53 ms (benches/results/zoo/export/README.md).
    `program` is the torch.export program, loaded on first use (its weights are a second copy):
    what torch.compile, `fact.compile`, AOTInductor and torch.export take."""

    def __init__(self, script, pt2):
        super().__init__()
        self.script = script
        self._pt2 = str(pt2)
        self._program = None

    @property
    def program(self):
        if self._program is None:
            self._program = torch.export.load(self._pt2).module()
        return self._program

    def forward(self, *args, **kwargs):
        return self.script(*args, **kwargs)


def load(out):
    """`Composed` of the folder `out` where it holds the TorchScript copy, else the program."""
    out = Path(out)
    pt2, copy = out / "composed.pt2", out / "torchscript" / "composed.pt"
    if copy.is_file():
        device = program_device(pt2)
        if device.startswith("cuda") and not torch.cuda.is_available():
            device = "cpu"  # as torch.export.load leaves it: the ops' CPU fallbacks run
        return Composed(torch.jit.load(str(copy), map_location=device), pt2)
    return torch.export.load(str(pt2)).module()
