"""torch/cuBLAS reference timings on the GPU machine for the auto-tuning targets, under each
precision policy, so fact's sweeps have a same-machine landscape to compare with.
Usage: python benches/device/landscape.py OUT.json"""
import json, sys, torch

def time_ms(fn, reps=30):
    fn(); torch.cuda.synchronize()
    flush = torch.empty(64 << 20, dtype=torch.int8, device="cuda")
    ts = []
    for _ in range(reps):
        flush.zero_()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts) // 2]

def case(name, flops, fn, policy):
    torch.backends.cuda.matmul.allow_tf32 = policy == "tf32"
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    ms = time_ms(fn)
    r = {"case": name, "policy": policy, "median_ms": ms, "tflops": flops / ms / 1e9}
    print(json.dumps(r)); return r

out = []
d = "cuda"
for dt, pol in [(torch.float32, "tf32"), (torch.float32, "ieee"), (torch.bfloat16, "bf16"), (torch.float16, "f16")]:
    a = torch.randn(4096, 4096, device=d, dtype=dt); b = torch.randn(4096, 4096, device=d, dtype=dt)
    bt = b.t().contiguous()
    f = 2 * 4096 ** 3
    out.append(case("gemm_rrr 4096^3", f, lambda: a @ b, pol))
    out.append(case("gemm_rcr 4096^3", f, lambda: a @ bt.t(), pol))
    out.append(case("transpose 4096^2", 0.0001, lambda: b.t().contiguous(), pol))
    x = torch.randn(128, 512, 1024, device=d, dtype=dt); y = torch.randn(128, 1024, 2048, device=d, dtype=dt)
    out.append(case("bmm_rrr 128x512x2048x1024", 2 * 128 * 512 * 2048 * 1024, lambda: torch.bmm(x, y), pol))
    p = torch.randn(256, 524288, device=d, dtype=dt); q = torch.randn(524288, 256, device=d, dtype=dt)
    out.append(case("gemm_rrr 256x256x524288", 2 * 256 * 256 * 524288, lambda: p @ q, pol))
    del a, b, bt, x, y, p, q
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": out}, open(sys.argv[1], "w"), indent=1)
