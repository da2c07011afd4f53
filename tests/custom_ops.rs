//! fact's ops are PyTorch custom ops of full standing, checked on the CPU (each call falls back to
//! the original ops there): every op of the library passes `torch.library.opcheck` in each of its
//! forms (schema, autograd registration, FakeTensor against the real outputs, AOT dispatch with
//! dynamic sizes, with and without inputs that require grad), and its outputs' strides and
//! storage offsets are the meta function's; a compiled function calls a fact op between aten ops
//! with no graph break, as an extern kernel; an exported module of fact ops with a dynamic batch
//! saves, loads and runs, and AOTInductor packages it; autograd records through the ops; and the
//! `fact` Python package (python/fact) exports, runs the CLI and loads what it wrote. The library
//! is one RMSNorm kernel's: every library holds every kind's ops.

use crate::common::{build_all, python, root, run_python};
use fact::kinds::registry::KINDS;
use fact::kinds::rmsnorm::{candidates, RmsNormProblem, Scale};
use fact::nvcc::Toolchain;
use fact::types::{Arch, DType};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The op library these tests load, built once per run (target/custom-ops; the build cache makes
/// a rebuild a link).
fn op_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| rmsnorm_library(64, "target/custom-ops"))
}

/// A second op library with another RMSNorm kernel (target/custom-ops-2), as a second composition
/// in the same process has.
fn second_op_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| rmsnorm_library(128, "target/custom-ops-2"))
}

/// A library of one RMSNorm kernel, the first candidate for rows of `cols`, built into `dir`.
fn rmsnorm_library(cols: i64, dir: &str) -> PathBuf {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let p = RmsNormProblem::new(32, cols, DType::F32, Scale::Weight, false);
    let spec = candidates(&p, Arch::Sm90).remove(0);
    build_all(&tc, &[spec], &root().join(dir), "libfact_ops.so", 2).library
}

/// `preamble()` with the op library's call counters at hand: `so.fact_op_stats()` (JSON).
fn counters_preamble() -> String {
    format!(
        "{}import ctypes, json\nso = ctypes.CDLL({:?})\nso.fact_op_stats.restype = ctypes.c_char_p\n",
        preamble(),
        op_library().display().to_string()
    )
}

/// Python that imports torch and loads the op library.
fn preamble() -> String {
    format!(
        "import torch\ntorch.ops.load_library({:?})\n",
        op_library().display().to_string()
    )
}

/// Each op's forms, as arguments that drive its fallback on the CPU (`CASES[op]`: (form, args)).
const CASES: &str = r#"
torch.manual_seed(0)
r = torch.randn
B, T, K, N, H, D, C, I = 2, 5, 16, 8, 4, 8, 16, 12
x3, w, bias = r(B, T, K), r(N, K), r(N)
q, k, v = (r(B, T, H, D).transpose(1, 2) for _ in range(3))
causal = torch.ones(T, T, dtype=torch.bool).tril()
add_mask = torch.zeros(B, 1, T, T).masked_fill(~causal, float("-inf"))
def att(q, k, v, mask, scale, form, cond=None, fill=None, window=None, plus=None):
    return (q, k, v, mask, scale, form, "k", cond, fill, window, plus)
xs, xb, wb = r(B, T, C), r(B, T, C).bfloat16(), r(C).bfloat16()
def ln_add(dtypes):
    return (xs, r(T, C), [C], r(C), r(C), 1e-5, dtypes, "k")
def rms_add(form, dtypes, weight):
    return (xb, r(T, C).bfloat16(), weight, "1e-06", form, dtypes, "k")
qr, kr, cos, sin = r(B, T, H, 16).transpose(1, 2), r(B, T, 2, 16).transpose(1, 2), r(T, 16), r(T, 16)
xc, cl = r(B, 4, 6, 6), torch.channels_last
bn = (r(8), r(8), r(8), r(8).abs() + 0.5)
def conv(x, weight, b, stride, padding, groups, bn, residual, form):
    return (x, weight, b, stride, padding, [1, 1], groups, *(bn or (None,) * 4), residual,
            weight.contiguous(memory_format=cl), b, form, "k")
CASES = {
    "gemm": [
        ("linear", (x3, w, bias, "linear", "k")),
        ("linear, no bias", (x3, w, None, "linear", "k")),
        ("linear over a padded weight", (x3, r(12, K), r(12), "linear;n=8", "k")),
        ("addmm", (r(T, K), r(K, N), bias, "addmm", "k")),
        ("addmm of 3-d rows", (x3, r(K, N), bias, "addmm", "k")),
        ("mm", (r(T, K), r(K, N), None, "mm", "k")),
        ("mm of 3-d rows", (x3, r(K, N), None, "mm", "k")),
        ("bmm", (x3, r(B, K, N), None, "bmm", "k")),
        ("matmul 4-d", (r(B, H, T, K), r(B, H, K, N), None, "matmul", "k")),
        ("matmul folded", (x3, r(K, N), None, "matmul", "k")),
        ("matmul of a transposed a", (r(B, K, T).transpose(1, 2), r(K, N), None, "matmul", "k")),
    ],
    "gemm_ep": [
        ("gelu_tanh", (x3, w, bias, [], "linear", "leaves=;v1=gelu_tanh(v0)", "k")),
        ("residual and row", (x3, w, bias, [r(B, T, N), r(N)], "linear", "leaves=full,row;v1=add(v0,l0);v2=mul(v1,l1)", "k")),
        ("respelled residual", (x3, w, bias, [r(B * T, N)], "linear", "leaves=full;v1=add(v0,l0)", "k")),
        ("scalar leaf", (x3, w, None, [torch.tensor(0.5)], "linear", "leaves=scalar;v1=mul(v0,l0)", "k")),
        ("numbers on the left", (x3, w, bias, [], "linear", "leaves=;v1=sub(1.0,v0);v2=div(2.0,v1);v3=clamp(v2,-1.0,1.0)", "k")),
        ("column leaf", (r(T, K), w, bias, [r(T, 1)], "linear", "leaves=col;v1=add(v0,l0);v2=silu(v1)", "k")),
        ("turned", (r(B, 3, 3, K), w, bias, [r(N, 1, 1), r(B, N, 3, 3)], "linear;perm=0,3,1,2",
                    "leaves=row,full;v1=mul(v0,l0);v2=add(v1,l1)", "k")),
    ],
    "attention": [
        ("sdpa", att(q, k, v, None, None, "sdpa")),
        ("sdpa causal", att(q, k, v, None, None, "sdpa;causal")),
        ("sdpa scale", att(q, k, v, None, None, "sdpa;scale=0.125")),
        ("sdpa bool mask", att(q, k, v, causal, None, "sdpa;mask=bool;class=causal")),
        ("sdpa additive mask as a bias", att(q, k, v, add_mask, None, "sdpa;mask=add;class=none;bias")),
        ("sdpa gqa", att(q, r(B, 2, T, D), r(B, 2, T, D), None, None, "sdpa;gqa")),
        ("sdpa repeated heads", att(q, r(B, 2, T, D), r(B, 2, T, D), None, None, "sdpa;causal;repeat=2")),
        ("sdpa where", att(q, k, v, torch.zeros(B, 1, T, T), None, "sdpa;mask=add;where;fill=-1e9;class=causal", cond=causal)),
        ("sdpa [B,T,D]", att(r(B, T, D), r(B, T, D), r(B, T, D), None, None, "sdpa")),
        ("explicit div", att(q, k, v, None, None, "explicit;div=8.0")),
        ("explicit not-mask", att(q, k, v, causal, None, "explicit;mul=0.125;mask=not")),
        ("explicit tensor scale", att(q, k, v, None, torch.tensor(8.0), "explicit;div=tensor")),
        ("explicit added mask, upcast", att(q.bfloat16(), k.bfloat16(), v.bfloat16(), add_mask.bfloat16(), None,
                                            "explicit;div=8.0;mask=add;class=causal;upcast")),
        ("explicit where", att(q, k, v, add_mask, None, "explicit;div=8.0;mask=add;class=padded;where",
                               cond=causal, fill=torch.tensor(-1e9))),
        ("explicit scale last", att(q, k, v, add_mask, None, "explicit;mul=0.125;mask=add;class=causal;scale_last")),
        ("explicit scaled q", att(q, k, v, causal, None, "explicit;mul=0.125;scale_q;mask=not")),
        ("explicit eq0 mask, fp32 softmax", att(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal.int(), None,
                                                "explicit;div=8.0;softmax_f32;mask=eq0")),
        ("explicit fill", att(q, k, v, ~causal, None, "explicit;div=8.0;mask=fill;fill=-10000.0")),
        ("explicit plus", att(q, k, v, causal, None, "explicit;div=8.0;mask=not;plus=before", plus=r(1, H, T, T))),
        ("explicit windows", att(r(4, H, T, D), r(4, H, T, D), r(4, H, T, D), r(1, H, T, T), None,
                                 "explicit;mul=0.125;scale_q;mask=add;class=none;bias;windows", window=r(1, 2, 1, T, T))),
        ("explicit repeated heads", att(q, r(B, 1, T, D), r(B, 1, T, D), None, None, "explicit;div=8.0;repeat=4")),
    ],
    "layernorm": [
        ("affine", (xs, [C], r(C), r(C), 1e-5, "k")),
        ("plain", (xs, [C], None, None, 1e-5, "k")),
        ("transposed x", (r(T, B, C).transpose(0, 1), [C], r(C), None, 1e-5, "k")),
    ],
    "layernorm_written": [
        ("f32", (xs, r(C), "1e-05", "", "k")),
        ("upcast", (xb, wb, "1e-05", "upcast", "k")),
        ("transposed x", (r(T, B, C).transpose(0, 1), None, "1e-05", "", "k")),
    ],
    "layernorm_add": [("f32", ln_add("f32,f32")), ("norm in bf16", ln_add("f32,bf16"))],
    "layernorm_add_sum": [
        ("f32", ln_add("f32,f32")),
        ("norm in bf16", ln_add("f32,bf16")),
        ("transposed a", (r(T, B, C).transpose(0, 1), xs, [C], None, None, 1e-5, "f32,f32", "k")),
    ],
    "rmsnorm": [
        ("rms_norm", (xs, r(C), "1e-06", "rms_norm", "k")),
        ("rms_norm, its default eps", (xs, None, "None", "rms_norm", "k")),
        ("weight", (xb, wb, "1e-06", "rmsnorm_weight", "k")),
        ("cast before the weight", (xb, wb, "1e-06", "rmsnorm_cast_weight", "k")),
        ("one plus the weight", (xb, wb, "1e-06", "rmsnorm_weight1p", "k")),
        ("no weight", (xb, None, "1e-06", "rmsnorm", "k")),
        ("heads sliced from qkv", (r(B, T, 3 * C)[..., :C].view(B, T, 2, C // 2), r(C // 2), "1e-06", "rms_norm", "k")),
    ],
    "rmsnorm_add": [("weight", rms_add("rmsnorm_weight", "bf16,bf16", wb)),
                    ("rms_norm, sum in f32", rms_add("rms_norm", "f32,bf16", wb))],
    "rmsnorm_add_sum": [("weight", rms_add("rmsnorm_weight", "bf16,bf16", wb)),
                        ("rms_norm, sum in f32", rms_add("rms_norm", "f32,bf16", None))],
    "rotary": [
        ("halves, x's order", (qr, cos, sin, 16, 0, 0, "k")),
        ("halves, packed", (qr, cos, sin, 16, 0, 1, "k")),
        ("pairs", (qr, r(B, 1, T, 16), r(B, 1, T, 16), 16, 1, 0, "k")),
        ("partial", (qr, r(T, 8), r(T, 8), 8, 0, 0, "k")),
        ("packed x", (qr.contiguous(), cos, sin, 16, 0, 1, "k")),
        ("rank 3", (r(B, T, 16), cos, sin, 16, 0, 0, "k")),
    ],
    "rotary_qk": [(f"layout {l}", (qr, kr, cos, sin, 16, 0, l, "k")) for l in range(4)]
                 + [("pairs, partial", (qr, kr, r(T, 8), r(T, 8), 8, 1, 2, "k"))],
    "glu": [
        ("two linears, silu", (xs, r(I, C), None, r(I, C), None, r(2 * I, C), None, "silu", "k")),
        ("two linears with biases, gelu", (xs, r(I, C), r(I), r(I, C), r(I), r(2 * I, C), r(2 * I), "gelu", "k")),
        ("stacked, gelu_tanh", (xs, r(2 * I, C), None, None, None, r(2 * I, C), None, "gelu_tanh", "k")),
    ],
    "conv": [
        ("conv2d, channels-last out", conv(xc, r(8, 4, 3, 3), r(8), [1, 1], [1, 1], 1, None, None, "conv2d;out:cl")),
        ("conv2d, NCHW out", conv(xc, r(8, 4, 3, 3), r(8), [1, 1], [1, 1], 1, None, None, "conv2d;out:nchw")),
        ("channels-last x, NCHW out", conv(xc.contiguous(memory_format=cl), r(8, 4, 3, 3), None, [2, 2], [1, 1], 1,
                                           None, None, "conv2d;act:relu;out:nchw")),
        ("BatchNorm, residual, silu", conv(xc, r(8, 4, 3, 3), None, [1], [1], 1, bn, r(B, 8, 6, 6),
                                           "conv2d;bn:1e-05:1;act:silu;out:cl")),
        ("_convolution, 4 flags", conv(xc, r(8, 4, 1, 1), r(8), [1, 1], [0, 0], 1, bn, None,
                                       "_convolution:0011;bn:0.001:1;act:hardswish;out:cl")),
        ("_convolution, 3 flags", conv(xc, r(8, 4, 3, 3), r(8), [2, 2], [1, 1], 1, None, None,
                                       "_convolution:001;act:relu6;out:nchw")),
        ("depthwise", conv(xc, r(4, 1, 3, 3), r(4), [1, 1], [1, 1], 4, None, None, "conv2d;act:gelu_tanh;out:cl")),
    ],
    "grn": [
        ("hf", (r(B, 5, 5, C), r(1, 1, 1, C), r(1, 1, 1, C), "1e-06", "hf", "k")),
        ("addcmul", (r(B, 5, 5, C), r(C), r(C), "1e-06", "addcmul", "k")),
        ("channels-last view", (r(B, C, 5, 5).permute(0, 2, 3, 1), r(C), r(C), "1e-06", "hf", "k")),
    ],
    "patch_conv": [
        ("bias", (r(B, 3, 8, 8), r(8, 3, 4, 4), r(8), 4, 4, "k")),
        ("no bias, rows and columns past the last patch", (r(B, 3, 9, 10), r(8, 3, 2, 2), None, 2, 2, "k")),
        ("channels-last x", (r(B, 4, 8, 8).contiguous(memory_format=cl), r(8, 4, 4, 2), None, 4, 2, "k")),
    ],
    "linears2": [("bias", (xs, r(12, C), r(12), 4, 8, "k")), ("no bias", (xs, r(12, C), None, 8, 4, "k"))],
    "linears3": [("bias", (xs, r(12, C), r(12), 4, 4, 4, "k"))],
    "linears4": [("no bias, 2-d x", (r(T, C), r(10, C), None, 1, 2, 3, 4, "k"))],
}
# Arguments that are buffers, never differentiated (BatchNorm's running statistics).
BUFFERS = {"conv": {9, 10}}
"#;

/// Every op with a meta function passes opcheck in each of its forms, without and with inputs that
/// require grad, and FakeTensor gives its outputs the real ones' sizes, strides (every dim of more
/// than one element: opcheck compares strides on CUDA alone), storage offsets and dtypes. Its
/// registrations are the ones the frame makes (the memo's stay CompositeImplicitAutograd).
#[test]
fn every_op_passes_opcheck_in_each_of_its_forms() {
    let ops: Vec<&str> = KINDS
        .iter()
        .flat_map(|k| k.ops().iter())
        .filter(|o| o.meta.is_some())
        .map(|o| o.name)
        .collect();
    let script = format!(
        r#"{preamble}{CASES}
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._prims_common import check_significant_strides
ops = {ops:?}
assert sorted(CASES) == sorted(ops), (sorted(CASES), sorted(ops))
has = torch._C._dispatch_has_kernel_for_dispatch_key
for name in ops:
    op = getattr(torch.ops.fact, name).default
    keys = [key for key in ("CPU", "CUDA", "Meta", "Autograd", "CompositeImplicitAutograd") if has(op.name(), key)]
    assert keys == ["CPU", "CUDA", "Meta", "Autograd"], (name, keys)
    assert torch.Tag.pt2_compliant_tag in op.tags, name
for name in ("memo_get", "memo_put"):
    op = getattr(torch.ops.fact, name).default
    assert has(op.name(), "CompositeImplicitAutograd") and not has(op.name(), "Meta"), name

def outputs(o):
    return list(o) if isinstance(o, (tuple, list)) else [o]

def requiring_grad(name, args):
    keep = BUFFERS.get(name, set())
    return tuple(a if i in keep else pytree.tree_map_only(
        torch.Tensor, lambda t: t.detach().clone().requires_grad_(t.is_floating_point()), a) for i, a in enumerate(args))

failed = []
for name in ops:
    op = getattr(torch.ops.fact, name).default
    for form, args in CASES[name]:
        try:
            mode = FakeTensorMode()
            fake_args = pytree.tree_map_only(torch.Tensor, mode.from_tensor, args)
            with mode:
                fake = outputs(op(*fake_args))
            for real, f in zip(outputs(op(*args)), fake):
                assert (real.shape, real.dtype) == (f.shape, f.dtype), (real.shape, real.dtype, f.shape, f.dtype)
                same, _ = check_significant_strides(real, f, only_cuda=False)
                assert same and real.storage_offset() == f.storage_offset(), \
                    ("layout", real.stride(), real.storage_offset(), f.stride(), f.storage_offset())
            torch.library.opcheck(op, args)
            torch.library.opcheck(op, requiring_grad(name, args))
            print(f"opcheck fact::{{name}} ({{form}}): ok")
        except Exception as e:
            failed.append(f"fact::{{name}} ({{form}}): {{str(e).splitlines()[0]}}")
assert not failed, "\n".join(failed)
print(sum(len(CASES[n]) for n in ops), "forms")
"#,
        preamble = preamble(),
    );
    let out = run_python(&script);
    let forms = out.lines().last().unwrap();
    assert!(
        forms.ends_with(" forms")
            && forms.split(' ').next().unwrap().parse::<usize>().unwrap() >= 80,
        "{out}"
    );
}

/// torch.compile of a function calling fact::gemm between aten ops: one graph, no break, and the
/// op an extern kernel of Inductor's code (checked against the meta function's sizes and
/// strides), at another batch too (dynamic sizes).
#[test]
fn a_compiled_function_calls_a_fact_op_as_an_extern_kernel_without_a_graph_break() {
    let script = format!(
        r#"{preamble}
from torch._inductor.utils import run_and_get_code
def fn(x, w, b):
    y = torch.ops.fact.gemm(torch.relu(x) * 2, w, b, "linear", "k")
    return torch.tanh(y) + 1
x, w, b = torch.randn(2, 5, 16), torch.randn(8, 16), torch.randn(8)
explained = torch._dynamo.explain(fn)(x, w, b)
assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained
compiled = torch.compile(fn, fullgraph=True, dynamic=True)
got, code = run_and_get_code(compiled, x, w, b)
assert "torch.ops.fact.gemm.default(" in code[0] and "assert_size_stride" in code[0], code[0]
assert torch.allclose(got, fn(x, w, b), atol=1e-5)
x = torch.randn(3, 7, 16)
assert torch.allclose(compiled(x, w, b), fn(x, w, b), atol=1e-5)
print("ok")
"#,
        preamble = preamble()
    );
    assert_eq!(run_python(&script), "ok");
}

/// A causal mask that three attention calls read, computed from the sizes as Hugging Face's
/// decoders compute theirs: compiled, Inductor writes it once (fact::attention is tagged
/// flexible_layout; under torch's default for custom ops, exact strides, it writes this mask
/// once for each call).
#[test]
fn a_compiled_program_computes_a_mask_its_attention_calls_share_once() {
    let script = format!(
        r#"{preamble}
from torch._inductor.utils import run_and_get_code
B, H, T, D = 2, 4, 5, 8
def fn(x):
    q = x.view(B, T, H, D).transpose(1, 2)
    i = torch.arange(T)
    pos = i[None, :].expand(B, T)
    # The packed-sequence check transformers' masks hold: a sequence starts where positions restart.
    seq = torch.cumsum(torch.diff(pos, dim=-1, prepend=pos[:, :1] - 1) != 1, -1)
    mask = (i[None, :] <= i[:, None])[None, None] & (seq[:, None, :, None] == seq[:, None, None, :])
    for _ in range(3):
        q = torch.ops.fact.attention(q, q, q, mask, None, "sdpa;mask=bool;class=causal;static", "k") + 1
    return q
x = torch.randn(B, T, H * D)
got, code = run_and_get_code(torch.compile(fn, fullgraph=True), x)
assert code[0].count("torch.ops.fact.attention.default(") == 3, code[0]
masks = [l for l in code[0].splitlines() if "empty_strided_cpu(" in l and "torch.bool" in l]
assert len(masks) == 1, masks
assert torch.allclose(got, fn(x), atol=1e-5)
print("ok")
"#,
        preamble = preamble()
    );
    assert_eq!(run_python(&script), "ok");
}

/// A module of fact ops (a LayerNorm, sibling linears, GEMMs with an epilogue, one reading no
/// leaves as GPT-2's MLP does) exported with dynamic batch and sequence dims holds them as calls,
/// saves, loads and runs as the module does at other sizes; AOTInductor packages it and its runner
/// calls them through the dispatcher (whose proxy executor passes an empty leaf list as None), or,
/// with their C shims registered (`fact.use_c_shims`), through those.
#[test]
fn an_exported_module_of_fact_ops_saves_loads_runs_and_packages() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        r#"{preamble}
from torch.export import Dim
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.g, self.beta = torch.nn.Parameter(torch.randn(16)), torch.nn.Parameter(torch.randn(16))
        self.w, self.b = torch.nn.Parameter(torch.randn(12, 16)), torch.nn.Parameter(torch.randn(12))
    def forward(self, x):
        h = torch.ops.fact.layernorm(x, [16], self.g, self.beta, 1e-5, "k")
        y0, y1 = torch.ops.fact.linears2(h, self.w, self.b, 4, 8, "k")
        y = torch.ops.fact.gemm_ep(h, self.w[:8], None, [y1], "linear", "leaves=full;v1=add(v0,l0);v2=gelu(v1)", "k")
        z = torch.ops.fact.gemm_ep(h, self.w[:4], None, [], "linear", "leaves=;v1=gelu_tanh(v0)", "k")
        return y * y0.sum(-1, keepdim=True) + z.sum(-1, keepdim=True)
m = M().eval()
x = torch.randn(2, 5, 16)
program = torch.export.export(m, (x,), dynamic_shapes=({{0: Dim.DYNAMIC, 1: Dim.DYNAMIC}},), strict=False)
calls = [str(n.target) for n in program.graph.nodes if str(n.target).startswith("fact.")]
assert calls == ["fact.layernorm.default", "fact.linears2.default", "fact.gemm_ep.default", "fact.gemm_ep.default"], calls
torch.export.save(program, {saved:?})
loaded = torch.export.load({saved:?}).module()
package = torch._inductor.aoti_compile_and_package(program, package_path={package:?})
runner = torch._inductor.aoti_load_package(package)
with torch.no_grad():
    for x in (torch.randn(3, 7, 16), torch.randn(4, 2, 16)):
        want = m(x)
        assert torch.allclose(loaded(x), want, atol=1e-5)
        assert torch.allclose(runner(x), want, atol=1e-5)
# With the ops' C shims registered, a package calls them directly: two results, an empty leaf
# list and None among them.
import fact, zipfile
shimmed = fact.use_c_shims({lib:?})
assert {{"layernorm", "gemm_ep", "linears2"}} <= set(shimmed), shimmed
shims = torch._inductor.aoti_compile_and_package(program, package_path={shims:?})
with zipfile.ZipFile(shims) as z:
    code = "".join(z.read(n).decode(errors="replace") for n in z.namelist() if n.endswith(".cpp"))
assert all(f"aoti_torch_cpu_{{op}}(" in code for op in ("layernorm", "linears2", "gemm_ep")), [n for n in zipfile.ZipFile(shims).namelist()]
runner = torch._inductor.aoti_load_package(shims)
with torch.no_grad():
    for x in (torch.randn(3, 7, 16), torch.randn(4, 2, 16)):
        assert torch.allclose(runner(x), m(x), atol=1e-5)
print("ok")
"#,
        preamble = preamble(),
        lib = op_library().display().to_string(),
        saved = dir.path().join("m.pt2").display().to_string(),
        package = dir.path().join("m_aoti.pt2").display().to_string(),
        shims = dir.path().join("m_shims.pt2").display().to_string(),
    );
    assert_eq!(run_python(&script), "ok");
}

/// Recording autograd, an op runs its fallback with every kernel off (none has a backward): the
/// gradients are the original ops', and the counters say why; without grad the call is
/// redispatched to its device's kernel, which on the CPU falls back for that reason.
#[test]
fn autograd_records_through_the_original_ops() {
    let script = format!(
        r#"{preamble}x = torch.randn(2, 5, 16, requires_grad=True)
w = torch.randn(8, 16, requires_grad=True)
g = torch.randn(16, requires_grad=True)
def loss(norm, linear):
    return linear(norm(x, g), w).square().sum()
fact = loss(lambda x, g: torch.ops.fact.rmsnorm(x, g, "1e-06", "rms_norm", "rms"),
            lambda h, w: torch.ops.fact.gemm(h, w, None, "linear", "gemm"))
want = loss(lambda x, g: torch.rms_norm(x, [16], g, 1e-6), torch.nn.functional.linear)
got = torch.autograd.grad(fact, (x, w, g))
for a, b in zip(got, torch.autograd.grad(want, (x, w, g))):
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
stats = json.loads(so.fact_op_stats())
assert stats["gemm"] == {{"ran": 0, "copied": 0, "fell_back": 1, "why": "autograd (the kernel has no backward)"}}, stats
with torch.no_grad():
    torch.ops.fact.gemm(x, w, None, "linear", "gemm")
stats = json.loads(so.fact_op_stats())
assert stats["gemm"] == {{"ran": 0, "copied": 0, "fell_back": 2, "why": "not CUDA tensors of one device"}}, stats
print("ok")
"#,
        preamble = counters_preamble(),
    );
    assert_eq!(run_python(&script), "ok");
}

/// A kernel operand of two kernels by rows ("SMALL@R;KERNEL", compose's small rows): a call of at
/// most R rows runs SMALL, or torch's ops where SMALL is "torch" (counted under KERNEL as
/// "torch", no fallback); others run KERNEL. On the CPU every kernel falls back, which the
/// counters tell apart.
/// A malformed operand is an error that names the form.
#[test]
fn a_kernel_operand_by_rows_runs_each_call_on_its_rows_choice() {
    let script = format!(
        r#"{preamble}F = torch.nn.functional
few, many = torch.randn(1, 3, 16), torch.randn(2, 5, 16)
w, b = torch.randn(8, 16), torch.randn(8)
wg, wu = torch.randn(16, 16), torch.randn(16, 16)
both = torch.cat([wg.view(2, 8, 16), wu.view(2, 8, 16)], 1).view(32, 16)
torch.set_grad_enabled(False)
def stats():
    s = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    return s
stats()
for x in (few, many):
    assert torch.allclose(torch.ops.fact.gemm(x, w, b, "linear", "torch@4;big"), F.linear(x, w, b), atol=1e-5)
    y = torch.ops.fact.gemm_ep(x, w, b, [], "linear", "leaves=;v1=gelu(v0)", "torch@4;big")
    assert torch.allclose(y, F.gelu(F.linear(x, w, b)), atol=1e-5)
    y = torch.ops.fact.glu(x, wg, None, wu, None, both, None, "silu", "torch@4;big")
    assert torch.allclose(y, F.silu(F.linear(x, wg)) * F.linear(x, wu), atol=1e-5)
    s = stats()
    if x is few:
        assert s == {{"big": {{"ran": 0, "copied": 0, "fell_back": 0, "torch": 3}}}}, s
    else:
        assert s == {{"big": {{"ran": 0, "copied": 0, "fell_back": 3, "why": "not CUDA tensors of one device"}}}}, s
torch.ops.fact.gemm(few, w, b, "linear", "small@3;big")
torch.ops.fact.gemm(many, w, b, "linear", "small@3;big")
s = stats()
assert s["small"]["fell_back"] == 1 and s["big"]["fell_back"] == 1, s
for bad in ("small@;big", "small@x;big", "@4;big", "small@4;", "small@4"):
    try:
        torch.ops.fact.gemm(few, w, b, "linear", bad)
    except RuntimeError as e:
        assert "malformed kernel operand" in str(e) and "SMALL@ROWS;KERNEL" in str(e), e
    else:
        raise AssertionError(bad)
print("ok")
"#,
        preamble = counters_preamble(),
    );
    assert_eq!(run_python(&script), "ok");
}

/// Two compositions' op libraries in one process: torch keeps the ops of the last one loaded, so its
/// op code serves the first composition's calls too, and finds their kernels in the first library
/// (a kernel's name is its identity), counting each call there. On the CPU every call falls back,
/// so what is checked is where each call counts; a name no library has counts where it ran.
#[test]
fn a_second_op_library_serves_the_first_ones_kernels_and_counts_them_there() {
    let (first, second) = (op_library(), second_op_library());
    let script = format!(
        r#"import ctypes, json, torch
libs = {{}}
for name, path in (("first", {first:?}), ("second", {second:?})):
    torch.ops.load_library(path)
    so = ctypes.CDLL(path)
    so.fact_op_stats.restype = ctypes.c_char_p
    so.fact_kernel_info.restype = ctypes.POINTER(ctypes.c_char_p)
    assert so.fact_kernel_count() == 1
    libs[name] = (so, so.fact_kernel_info(0)[0].decode())
(a, ka), (b, kb) = libs["first"], libs["second"]
assert ka != kb, (ka, kb)
def stats(so):
    s = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    return s
x, w = torch.randn(4, 3, 64), torch.randn(64)
for kernel in (ka, kb, "no_such_kernel", ka):
    torch.ops.fact.rmsnorm(x, w, "1e-06", "rms_norm", kernel)
sa, sb = stats(a), stats(b)
assert set(sa) == {{ka}} and sa[ka]["fell_back"] == 2 and sa[ka]["why"] != "", sa
assert set(sb) == {{kb, "no_such_kernel"}} and sb[kb]["fell_back"] == 1 and sb["no_such_kernel"]["fell_back"] == 1, sb
print("ok")
"#,
        first = first.display().to_string(),
        second = second.display().to_string(),
    );
    assert_eq!(run_python(&script), "ok");
}

/// Runs `script` with the venv's python and `env`; returns its exit status and both outputs.
fn run_python_env(script: &str, env: &[(&str, &Path)]) -> (bool, String, String) {
    let mut c = Command::new(python());
    c.arg("-c").arg(script);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// A stand-in for the fact CLI (FACT_BIN): it checks the command line, prints progress on stderr
/// and a result on stdout as the CLI does, and writes into --out what compose would: the op
/// library and a composed program calling it (torch.export's, or TorchScript's where
/// FAKE_OUTPUT=pt; none, as without a GPU, where FAKE_OUTPUT=none); FAKE_FAIL=1 makes it fail as
/// the CLI does, FAKE_FAIL=bench as the CLI does when its benchmark fails after composing (exit 3).
const FAKE_CLI: &str = r#"#!/usr/bin/env python3
import os, shutil, sys
args = sys.argv[1:]
assert args[0] == "compose" and args[1].endswith("model.pt2") and args[2] == "--out", args
out = args[3]
print("compose: reading model.pt2", file=sys.stderr, flush=True)
if os.environ.get("FAKE_FAIL") == "1":
    print("some log line", file=sys.stderr)
    print("error: no CUDA device: tuning needs a GPU; the plan and the generated sources are in " + out, file=sys.stderr)
    print("    (an indented detail)", file=sys.stderr)
    sys.exit(1)
if os.environ.get("FAKE_OUTPUT") == "none":
    print("no CUDA device: tuning and benchmarking sm90 kernels need an sm90 GPU (H100, H200).")
    print("  1 need tuning: their candidate kernels are rendered and compiled under " + out)
    sys.exit(0)
import torch
torch.ops.load_library(os.environ["FAKE_LIB"])
program = torch.export.load(args[1])
weights = program.state_dict
class Composed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight, self.bias = torch.nn.Parameter(weights["weight"]), torch.nn.Parameter(weights["bias"])
    def forward(self, x):
        return torch.ops.fact.gemm(x, self.weight, self.bias, "linear", "k")
x = torch.randn(3, 16)
shutil.copy(os.environ["FAKE_LIB"], os.path.join(out, "libfact_ops.so"))
if os.environ.get("FAKE_OUTPUT") == "pt":
    torch.jit.trace(Composed().eval(), x).save(os.path.join(out, "composed.pt"))
else:
    batch = ({0: torch.export.Dim.DYNAMIC},)
    program = torch.export.export(Composed().eval(), (x,), dynamic_shapes=batch, strict=False)
    torch.export.save(program, os.path.join(out, "composed.pt2"))
    if "--torchscript-copy" in args:
        os.makedirs(os.path.join(out, "torchscript"), exist_ok=True)
        torch.jit.trace(Composed().eval(), x).save(os.path.join(out, "torchscript", "composed.pt"))
print("composed: 1 pattern, extra args " + " ".join(args[4:]))
if os.environ.get("FAKE_FAIL") == "bench":
    print("error: the composition is written to " + out + " and its benchmark failed (`--no-bench` composes without it): CUDA error: out of memory", file=sys.stderr)
    sys.exit(3)
"#;

/// The Python package: fact.compose exports the module, saves model.pt2, runs the CLI with its
/// output shown as it prints it and returns the program the CLI wrote, loaded (a program with its
/// TorchScript copy as `fact.Composed`, running the copy; without the copy the program; a
/// TorchScript output as itself); a failing CLI, or one that writes no program (no GPU), raises ComposeError with
/// what it said; a module in training mode is refused; fact.stats reads the library's counters. The CLI is a stand-in (FACT_BIN):
/// composing for real needs a GPU.
#[test]
fn the_python_package_exports_runs_the_cli_and_loads_what_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let cli = dir.path().join("fact-cli");
    std::fs::write(
        &cli,
        FAKE_CLI.replacen("python3", &python().display().to_string(), 1),
    )
    .unwrap();
    let mut perms = std::fs::metadata(&cli).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&cli, perms).unwrap();
    let script = format!(
        r#"import os, sys, torch, fact
model = torch.nn.Linear(16, 8).eval()
x = torch.randn(3, 16)
out = os.path.join({dir:?}, "linear")
composed = fact.compose(model, x, dynamic_shapes=({{0: torch.export.Dim.DYNAMIC}},), out=out, args=["--budget", 2])
assert os.path.isfile(os.path.join(out, "model.pt2"))
# Eagerly the program's TorchScript copy runs; torch.compile gets the program.
assert isinstance(composed, fact.Composed) and isinstance(composed.script, torch.jit.ScriptModule)
assert not isinstance(composed.program, torch.jit.ScriptModule)
with torch.no_grad():
    x = torch.randn(5, 16)
    assert torch.allclose(composed(x), model(x), atol=1e-6)
    assert torch.allclose(composed.program(x), model(x), atol=1e-6)
assert fact.stats(out)["k"]["fell_back"] == 2, fact.stats(out)
# fact.compile compiles the program, not its TorchScript copy.
compiled, torch.compile = torch.compile, lambda program, **kwargs: program
assert fact.compile(composed) is composed.program
torch.compile = compiled
# Without the copy (compose --no-bench), the program itself.
os.remove(os.path.join(out, "torchscript", "composed.pt"))
program = fact.load(out)
assert not isinstance(program, fact.Composed) and isinstance(program, torch.fx.GraphModule), type(program)
with torch.no_grad():
    assert torch.allclose(program(x), model(x), atol=1e-6)
assert fact.stats(out)["k"]["fell_back"] == 3, fact.stats(out)
os.environ["FAKE_OUTPUT"] = "pt"
script = fact.compose(model, (x,), out=os.path.join({dir:?}, "ts"), quiet=True)
assert isinstance(script, torch.jit.ScriptModule) and "fact::gemm" in str(script.graph)
os.environ["FAKE_OUTPUT"] = "none"
try:
    fact.compose(model, (x,), out=os.path.join({dir:?}, "no_gpu"), quiet=True)
    raise AssertionError("no error")
except fact.ComposeError as e:
    # Both streams' last lines, in the order they came.
    lines = str(e).splitlines()
    assert e.returncode == 0 and lines[0] == "fact compose wrote no composed program into " + \
        os.path.join({dir:?}, "no_gpu") + ":", lines
    assert "compose: reading model.pt2" in lines and lines[1:].count(
        "no CUDA device: tuning and benchmarking sm90 kernels need an sm90 GPU (H100, H200).") == 1, lines
os.environ["FAKE_FAIL"] = "1"
try:
    fact.compose(model, (x,), out=os.path.join({dir:?}, "fails"), quiet=True)
    raise AssertionError("no error")
except fact.ComposeError as e:
    assert e.returncode == 1 and e.lines[-3:][0] == "some log line", e.lines
    assert str(e).splitlines()[1:] == [
        "error: no CUDA device: tuning needs a GPU; the plan and the generated sources are in " + os.path.join({dir:?}, "fails"),
        "    (an indented detail)"], str(e)
# Composed, and the CLI's own benchmark failed after (exit 3): the composition is loaded, with a warning.
del os.environ["FAKE_OUTPUT"]
os.environ["FAKE_FAIL"] = "bench"
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    kept = fact.compose(model, (x,), out=os.path.join({dir:?}, "unbenched"), quiet=True)
assert isinstance(kept, fact.Composed), type(kept)
with torch.no_grad():
    assert torch.allclose(kept(x), model(x), atol=1e-6)
said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
assert any("its benchmark failed" in m and "CUDA error: out of memory" in m for m in said), said
try:
    fact.compose(torch.nn.Linear(16, 8), (x,), out=os.path.join({dir:?}, "training"))
    raise AssertionError("no error")
except ValueError as e:
    assert "model.eval()" in str(e), e
print("ok")
"#,
        dir = dir.path().display().to_string(),
    );
    let (ok, stdout, stderr) =
        run_python_env(&script, &[("FACT_BIN", &cli), ("FAKE_LIB", op_library())]);
    assert!(ok, "{stdout}\n{stderr}");
    // The CLI's own output, as it printed it (quiet calls print none of theirs).
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        [
            "composed: 1 pattern, extra args --torchscript-copy --budget 2",
            "ok"
        ],
        "{stderr}"
    );
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.starts_with("compose:"))
            .collect::<Vec<_>>(),
        ["compose: reading model.pt2"],
        "{stderr}"
    );
}

/// fact.load_library registers the library's ops with Inductor, so that compiling a program
/// never takes Inductor's implicit fallback for them: that path formats the call's arguments (IR
/// trees, here a deep chain of pointwise ops) into a log line whatever the log level, which took
/// minutes on a composed Qwen2. The memo ops, traced through before Inductor, are left alone.
#[test]
fn the_python_package_registers_the_ops_with_inductor() {
    let script = format!(
        r#"import torch, fact
import torch._inductor.exc as exc
from torch._inductor.lowering import lowerings
fact.load_library({lib:?})
fact.load_library({lib:?})  # once is enough; a second call changes nothing
assert torch.ops.fact.gemm.default in lowerings and torch.ops.fact.memo_get.default not in lowerings
def implicit(target, args, kwargs):
    raise AssertionError(f"Inductor took its implicit fallback for {{target}}")
exc.OperatorIssue.operator_str = staticmethod(implicit)
torch._inductor.config.fx_graph_cache = False
torch._functorch.config.enable_autograd_cache = False
def fn(x, w, b):
    for _ in range(30):
        x = torch.sin(x) * 0.9 + 0.1
    return torch.ops.fact.gemm(x, w, b, "linear", "k")
x, w, b = torch.randn(2, 5, 16), torch.randn(8, 16), torch.randn(8)
with torch.no_grad():
    assert torch.allclose(torch.compile(fn, fullgraph=True)(x, w, b), fn(x, w, b), atol=1e-5)
print("ok")
"#,
        lib = op_library().display().to_string()
    );
    let (ok, stdout, stderr) = run_python_env(&script, &[]);
    assert!(ok && stdout.trim() == "ok", "{stdout}\n{stderr}");
}

/// fact.load of a folder without an op library or without a composed program says what is
/// missing; the package's CLI is FACT_BIN where set.
#[test]
fn the_python_package_says_what_a_folder_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        r#"import os, fact
assert fact.cli() == ["/opt/fact"], fact.cli()
try:
    fact.load({dir:?})
    raise AssertionError("no error")
except FileNotFoundError as e:
    assert "no op library at" in str(e), e
print("ok")
"#,
        dir = dir.path().display().to_string()
    );
    let (ok, stdout, stderr) = run_python_env(&script, &[("FACT_BIN", Path::new("/opt/fact"))]);
    assert!(ok && stdout.trim() == "ok", "{stdout}\n{stderr}");
}
