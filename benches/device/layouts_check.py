"""The models and GPU checks of benches/device/layouts_check.sh.

    python3 layouts_check.py trace NAME PATH       traces model NAME small, saves it to PATH and
                                                   prints the --input flags of its real shapes
    python3 layouts_check.py check NAME DIR ORIG REPORT
                                                   checks DIR's composed module against ORIG on the
                                                   GPU and adds the result to the JSON file REPORT

Each model's forward makes its GEMM operands from packed inputs (transposed views, broadcast
batches), as a traced model's own code would; `operands` returns them for the direct op calls.
"""
import ctypes
import json
import os
import sys

import torch


class Gemm(torch.nn.Module):
    def forward(self, *xs):
        a, b = self.operands(*xs)
        return a @ b


class AtB(Gemm):
    """a.t() @ b, the issue's 2048x4096x8192: gemm_crr."""

    def operands(self, a, b):
        return a.t(), b


class ABt(Gemm):
    """a @ b.t() through matmul: gemm_rcr."""

    def operands(self, a, b):
        return a, b.t()


class AtBt(Gemm):
    """a.t() @ b.t(): gemm_ccr (tf32 on sm80 kernels: CUTLASS has no sm90 tf32 "tt" with a
    column-major output)."""

    def operands(self, a, b):
        return a.t(), b.t()


class HeadsBmm(Gemm):
    """Attention scores q @ k.transpose(-2, -1) over [B, H]: bmm_rcr with L = B*H."""

    def operands(self, q, k):
        return q, k.transpose(-2, -1)


class TBmm(Gemm):
    """x.transpose(1, 2) @ y: bmm_crr."""

    def operands(self, x, y):
        return x.transpose(1, 2), y


class Bcast(Gemm):
    """[B, M, K] @ [1, K, N]: the batch folds into M, gemm_rrr."""

    def operands(self, x, w):
        return x, w


# name: (model, small shapes to trace with, real shapes, the rule compose must match)
MODELS = {
    "at_b": (AtB, [(16, 8), (16, 4)], [(8192, 2048), (8192, 4096)], "gemm_crr"),
    "a_bt": (ABt, [(8, 16), (4, 16)], [(2048, 8192), (4096, 8192)], "gemm_rcr"),
    "at_bt": (AtBt, [(16, 8), (4, 16)], [(8192, 2048), (4096, 8192)], "gemm_ccr"),
    "heads_bmm": (HeadsBmm, [(2, 2, 8, 4), (2, 2, 8, 4)], [(8, 16, 512, 64), (8, 16, 512, 64)], "bmm_rcr"),
    "t_bmm": (TBmm, [(2, 16, 8), (2, 16, 4)], [(32, 1024, 512), (32, 1024, 256)], "bmm_crr"),
    "bcast": (Bcast, [(2, 8, 16), (1, 16, 4)], [(16, 1024, 1024), (1, 1024, 2048)], "gemm_rrr"),
}


def trace(name, path):
    model, small, real, _ = MODELS[name]
    torch.manual_seed(0)
    with torch.no_grad():
        torch.jit.trace(model().eval(), tuple(torch.randn(*s) for s in small)).save(path)
    print(" ".join("--input " + "x".join(map(str, s)) for s in real))


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def flip(t):
    """The same values in the other layout: packed if `t` is not, else a transposed copy."""
    return t.contiguous() if not t.is_contiguous() else t.transpose(-2, -1).contiguous().transpose(-2, -1)


def check(name, out_dir, orig_path, report_path):
    model, _, real, rule = MODELS[name]
    result = {"name": name, "rule_expected": rule, "ok": False}
    try:
        compose = json.load(open(os.path.join(out_dir, "compose.json")))
    except OSError as e:
        compose = {"patterns": []}
        result["compose_error"] = str(e)
    result["patterns"] = [
        {"rule": p["rule"], "shape": p["problem"], "kernel": p.get("kernel"), "realization": p["realization"],
         "kernel_ms": p.get("kernel_ms"), "torch_ms": p.get("torch_ms"), "copies": p.get("copies", [])}
        for p in compose["patterns"]
    ]
    lib = os.path.join(out_dir, "libfact_ops.so")
    problems = []
    if [p["rule"] for p in compose["patterns"]] != [rule]:
        problems.append(f"compose matched {[p['rule'] for p in compose['patterns']]}, expected [{rule}]")
    if not os.path.exists(lib):
        problems.append("no op library (no kernel substituted)")
    else:
        torch.ops.load_library(lib)
        so = ctypes.CDLL(lib)
        so.fact_op_stats.restype = ctypes.c_char_p
        stats = lambda: json.loads(so.fact_op_stats())
        torch.set_float32_matmul_precision("high")
        composed = torch.jit.load(os.path.join(out_dir, "composed.pt")).cuda()
        orig = torch.jit.load(orig_path).cuda()
        result["graph_has_fact"] = "fact::gemm" in str(composed.forward.graph)
        torch.manual_seed(1)
        xs = [torch.randn(*s, device="cuda") for s in real]
        so.fact_op_stats_reset()
        with torch.no_grad():
            got = composed(*xs)
            want = orig(*xs)
            ref = orig(*[x.double() for x in xs])
            torch.cuda.synchronize()
            calls = stats()
            result["stats_forward"] = calls
            result["rel_err_fact"] = rel(got, ref)
            result["rel_err_torch"] = rel(want, ref)
            # Copy kernels a forward launches (the profiler's CUDA kernel names), the composed
            # module's and, for comparison, torch's.
            from torch.profiler import ProfilerActivity, profile

            def kernels(module):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    module(*xs)
                    torch.cuda.synchronize()
                return [e.name[:160] for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]

            def copies(names):
                return [n for n in names if ("copy" in n.lower() or "transpose" in n.lower()) and "cutlass" not in n]

            names = kernels(composed)
            result["kernels"] = sorted(set(names))
            result["copy_kernels"] = copies(names)
            result["copy_kernels_torch"] = copies(kernels(orig))
            # A call whose operands lie in the other layout: copied into the kernel's, counted, right.
            kernel = next(iter(calls), None)
            if kernel is not None:
                a, b = model().operands(*xs)
                so.fact_op_stats_reset()
                out = torch.ops.fact.gemm(flip(a), flip(b), None, "matmul", kernel)
                torch.cuda.synchronize()
                result["stats_flipped"] = stats()
                result["rel_err_flipped"] = rel(out, a.double() @ b.double())
        if not result["graph_has_fact"]:
            problems.append("no fact::gemm in the composed graph")
        for k, c in result["stats_forward"].items():
            if c["ran"] < 1 or c["copied"] != 0 or c["fell_back"] != 0:
                problems.append(f"{k}: {c} in the forward (want ran >= 1, copied 0, fell_back 0)")
        if not result["stats_forward"]:
            problems.append("no fact call in the forward")
        if result["rel_err_fact"] > 1e-3:
            problems.append(f"relative error {result['rel_err_fact']:.2e} against fp64 (tf32 policy: 1e-3)")
        if result["copy_kernels"]:
            problems.append(f"copy kernels in the composed forward: {result['copy_kernels']}")
        flipped = result.get("stats_flipped", {})
        if flipped and (list(flipped.values())[0] != {"ran": 1, "copied": 1, "fell_back": 0} or result["rel_err_flipped"] > 1e-3):
            problems.append(f"other-layout call: {flipped}, rel err {result.get('rel_err_flipped')}")
    result["problems"] = problems
    result["ok"] = not problems
    print(json.dumps({k: v for k, v in result.items() if k != "kernels"}, indent=1))
    print(f"{name}: {'OK' if result['ok'] else 'FAILED: ' + '; '.join(problems)}")
    report = json.load(open(report_path)) if os.path.exists(report_path) else {}
    report[name] = result
    with open(report_path, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "trace":
        trace(sys.argv[2], sys.argv[3])
    else:
        check(*sys.argv[2:6])
