"""A composed model CUDA-graphed at small shapes three ways: as composed, with the GEMM kinds off
(cuBLAS), and with every kind off; plus a profile of one replay of each graph, to see what
fact's GEMMs cost at few rows. Run from the repository root on the GPU machine:

    python3 benches/device/small_shapes_graph.py OUT MODEL FACT_BINARY
"""
import sys, json, collections, time
from pathlib import Path
sys.path.insert(0, "benches/zoo"); sys.path.insert(0, "benches/device"); sys.path.insert(0, "python")
import torch, models, fact, serve
from harness import flush_buffer, time_interleaved, OpLibrary
out = Path(sys.argv[1]); name = sys.argv[2]; fact_bin = sys.argv[3]
model = models.by_name()[name]
import transformers; transformers.logging.set_verbosity_error()
t0 = time.monotonic()
if not (out / "fact" / name / "libfact_ops.so").exists():
    for sub in ("models", "fact", "logs"): (out / sub).mkdir(parents=True, exist_ok=True)
    print(serve.export_stage(out, model), flush=True)
    print(serve.compose_stage(out, model, fact_bin, ["--jobs", "16", "--quick"], 400), flush=True)
print("composed", round(time.monotonic() - t0, 1), flush=True)
rep = json.load(open(out / "fact" / name / "compose.json"))
for p in rep["patterns"]:
    sr = p.get("small_rows")
    if sr: print("small", p["id"], p["rule"], p.get("kernel"), p.get("kernel_ms"), "|", sr.get("kernel"), sr.get("kernel_ms"), sr.get("torch_ms"), str(sr.get("realization"))[:90], flush=True)
torch.set_grad_enabled(False)
d = out / "fact" / name
fact.load_library(d / "libfact_ops.so")
lib = OpLibrary(d / "libfact_ops.so")
ts = torch.jit.load(str(serve.ts_copy(out, name)), map_location="cuda")
flush = flush_buffer()
res = {}
def prof(fn, xs, n=5):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        for _ in range(n): fn(*xs)
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0.0, 0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            agg[e.name[:140]][0] += e.device_time_total / n / 1000
            agg[e.name[:140]][1] += 1
    rows = sorted(agg.items(), key=lambda kv: -kv[1][0])
    return {"sum_ms": round(sum(v[0] for v in agg.values()), 4), "launches": sum(v[1] for v in agg.values()) // n,
            "top": [(k, round(v[0], 4), v[1] // n) for k, v in rows[:30]]}
for b, t in [(1, 1), (1, 37), (1, 128), (8, 1024) if name == "gpt2" else (4, 1024)]:
    xs = serve.inputs_at(model, b, t, models.SEED)
    graphs = {}
    for key, off in [("on", ""), ("off_gemm", "gemm,epilogue,glu"), ("off_all", "gemm,epilogue,glu,attention,layernorm,rmsnorm,rotary")]:
        try:
            lib.disable(off); graphs[key] = serve.graphed(ts, xs)
        except Exception as e:
            print("capture", key, e)
    lib.disable("")
    r = {k: round(v, 4) for k, v in time_interleaved(graphs, xs, flush).items()}
    r["prof_graph_on"] = prof(graphs["on"], xs)
    r["prof_graph_off_gemm"] = prof(graphs["off_gemm"], xs)
    r["prof_eager_on"] = prof(ts, xs)
    res[f"{b}x{t}"] = r
    print(name, b, t, {k: v for k, v in r.items() if not k.startswith("prof")},
          "graph kernels on/off", r["prof_graph_on"]["sum_ms"], r["prof_graph_off_gemm"]["sum_ms"], "eager", r["prof_eager_on"]["sum_ms"], flush=True)
    json.dump(res, open(out / f"small_{name}.json", "w"), indent=1)
