"""Where a composed module's time goes on the GPU: every CUDA kernel of its forward, summed over a
few profiled iterations, the forward's wall time against the sum of its kernels (the gap is
launch and host work the GPU waits on), and the GPU's idle gaps over 5 us with the kernel before
each (a gap after a device-to-host copy is the host catching up after waiting for the stream),
and each op's host time per call (harness.kernel_profile, which the zoo's --profile records too).

    python3 benches/device/profile_composed.py COMPOSED_DIR POLICY SHAPE [OUT.json]

POLICY is tf32, f32 or bf16 (input dtype and matmul precision, as epilogue_suite.py); SHAPE the
forward's one input, e.g. 128x512x768.
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from epilogue_suite import DTYPE, MATMUL_PRECISION  # noqa: E402 -- the suite's, one copy each
from harness import kernel_profile  # noqa: E402

ITERS = 5


def load_composed(argv):
    """COMPOSED_DIR POLICY SHAPE [OUT.json] from `argv`: the composed module (its op library
    loaded, the policy's matmul precision set), a random input of SHAPE and the output path."""
    d, policy, shape = Path(argv[1]), argv[2], [int(v) for v in argv[3].split("x")]
    out = Path(argv[4]) if len(argv) > 4 else None
    torch.set_float32_matmul_precision(MATMUL_PRECISION[policy])
    torch.ops.load_library(str(d / "libfact_ops.so"))
    m = torch.jit.load(str(d / "composed.pt"), map_location="cuda").eval()
    return m, torch.randn(shape, device="cuda", dtype=DTYPE[policy]), out


def main():
    m, x, out = load_composed(sys.argv)
    with torch.no_grad():
        r = kernel_profile(m, (x,), iters=ITERS, top=1000)
    print(f"forward wall {r['wall_ms']:.3f} ms (back to back), kernels {r['kernels_ms']:.3f} ms per forward")
    for k in r["kernels"]:
        print(f"{k['ms']:8.3f} ms {100 * k['ms'] / r['kernels_ms']:5.1f}%  x{k['calls']:<3} {k['name']}")
    print(f"idle gaps over 5 us: {r['idle_ms']:.3f} ms per forward")
    for g in r["gaps_after"]:
        print(f"{g['ms']:8.3f} ms  x{g['count']:<3} after {g['name']}")
    print("host time per call:")
    for h in r["host_ops"][:30]:
        print(f"{h['us_per_call']:9.1f} us  x{h['calls']:<3} {h['name']}")
    if out:
        shape = [int(v) for v in sys.argv[3].split("x")]
        out.write_text(json.dumps({"policy": sys.argv[2], "shape": shape, **r}, indent=1) + "\n")


if __name__ == "__main__":
    main()
