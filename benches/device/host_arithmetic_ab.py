"""One-off A/B: the block composed by two fact builds (OLD_DIR, NEW_DIR; same kernels, NEW's op
library), timed interleaved in one process: suite protocol (L2 flush, sync per forward) and back to back."""
import sys, time
from pathlib import Path
import torch
sys.path.insert(0, str(Path(__file__).resolve().parent))
import epilogue_suite as es

old, new = Path(sys.argv[1]), Path(sys.argv[2])
torch.set_float32_matmul_precision("high")
torch.ops.load_library(str(new / "libfact_ops.so"))
x = torch.randn(128, 512, 768, device="cuda")
flush = torch.empty(es.FLUSH_FLOATS, device="cuda")
with torch.no_grad():
    mods = {n: torch.jit.load(str(d / "composed.pt"), map_location="cuda").eval() for n, d in (("old", old), ("new", new))}
    print("max |old - new|", (mods["old"](x) - mods["new"](x)).abs().max().item())
    for i in range(3):
        for n, m in mods.items():
            suite = es.time_ms(m, (x,), flush)
            torch.cuda.synchronize(); t0 = time.perf_counter()
            for _ in range(30):
                m(x)
            torch.cuda.synchronize()
            print(f"{n}: suite protocol {suite:.3f} ms, back to back {(time.perf_counter() - t0) / 30 * 1e3:.3f} ms")
