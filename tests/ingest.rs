//! Ingestion through the bridge and the GEMM rule on real TorchScript archives.

use crate::common::{fact, fixture, run_python};
use fact::kinds::gemm::{match_gemms, GemmLayout, GemmOrigin};
use fact::torch::{self, InputShape};
use fact::types::DType;

#[test]
fn linear_fixture_gives_one_rcr_bias_gemm_with_traced_shapes() {
    let (g, inputs) = torch::load_graph(&fixture("linear.pt"), &[]).unwrap();
    assert_eq!(
        inputs,
        vec![InputShape {
            shape: vec![32, 64],
            dtype: "f32".into()
        }]
    );
    let m = match_gemms(&g);
    assert_eq!(m.len(), 1);
    let p = &m[0].problem;
    assert_eq!(
        (p.m, p.n, p.k, p.layout, p.dtype, p.bias),
        (32, 128, 64, GemmLayout::Rcr, DType::F32, true)
    );
    assert_eq!(m[0].origin, GemmOrigin::Linear);
}

#[test]
fn matmul_fixture_is_rrr_and_user_shapes_override_traced_ones() {
    let (g, _) = torch::load_graph(&fixture("matmul.pt"), &[]).unwrap();
    let m = match_gemms(&g);
    assert_eq!(
        (m[0].origin, m[0].problem.shape_key()),
        (GemmOrigin::Matmul, "32x16x64".to_string())
    );
    let given = [
        InputShape::parse("256x512:bf16").unwrap(),
        InputShape::parse("512x128:bf16").unwrap(),
    ];
    let (g, _) = torch::load_graph(&fixture("matmul.pt"), &given).unwrap();
    let m = match_gemms(&g);
    assert_eq!(m[0].problem.shape_key(), "256x128x512");
    assert_eq!(m[0].problem.dtype, DType::Bf16);
}

#[test]
fn mlp_fixture_gives_two_gemms_through_relu_with_leading_dims_folded() {
    let (g, _) = torch::load_graph(&fixture("mlp.pt"), &[]).unwrap();
    let m = match_gemms(&g);
    let keys: Vec<(String, String)> = m
        .iter()
        .map(|m| (m.problem.rule_id(), m.problem.shape_key()))
        .collect();
    assert_eq!(
        keys,
        vec![
            ("gemm_rcr_bias".to_string(), "32x256x64".to_string()),
            ("gemm_rcr".to_string(), "32x64x256".to_string())
        ]
    );
    let relu = g.nodes.iter().find(|n| n.kind == "aten::relu").unwrap();
    assert_eq!(
        g.tensor(relu.outputs[0]).unwrap().shape,
        vec![4, 8, 256],
        "shape propagated through relu"
    );
}

#[test]
fn addmm_fixture_is_rrr_with_bias() {
    let (g, _) = torch::load_graph(&fixture("addmm.pt"), &[]).unwrap();
    let m = match_gemms(&g);
    assert_eq!(
        (m[0].problem.rule_id(), m[0].problem.shape_key()),
        ("gemm_rrr_bias".to_string(), "16x32x64".to_string())
    );
}

#[test]
fn bmm_fixture_is_batched_and_three_gemms_take_their_shapes_from_input() {
    let (g, _) = torch::load_graph(&fixture("bmm.pt"), &[]).unwrap();
    let m = match_gemms(&g);
    assert_eq!(
        (
            m[0].origin,
            m[0].problem.rule_id(),
            m[0].problem.shape_key()
        ),
        (GemmOrigin::Bmm, "bmm_rrr".into(), "4x32x16x64".into())
    );

    let shapes = [
        "4096x4096",
        "4096x4096",
        "128x512x1024",
        "128x1024x2048",
        "256x524288",
        "524288x256",
    ];
    let inputs: Vec<InputShape> = shapes
        .iter()
        .map(|s| InputShape::parse(s).unwrap())
        .collect();
    let (g, _) = torch::load_graph(&fixture("three_gemms.pt"), &inputs).unwrap();
    let keys: Vec<(String, String)> = match_gemms(&g)
        .iter()
        .map(|m| (m.problem.rule_id(), m.problem.shape_key()))
        .collect();
    assert_eq!(
        keys,
        vec![
            ("gemm_rrr".to_string(), "4096x4096x4096".to_string()),
            ("bmm_rrr".to_string(), "128x512x2048x1024".to_string()),
            ("gemm_rrr".to_string(), "256x256x524288".to_string()),
        ]
    );
}

#[test]
fn bad_inputs_get_errors_that_name_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let not_ts = dir.path().join("weights.pt");
    std::fs::write(&not_ts, b"not a zip archive at all").unwrap();
    let e = torch::load_graph(&not_ts, &[]).unwrap_err().to_string();
    assert!(
        e.contains("this is not a TorchScript module") && e.contains("torch.jit.trace"),
        "{e}"
    );

    let e = torch::load_graph(&fixture("no_inputs.pt"), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--input"), "{e}");

    let one = [InputShape::parse("4x4:f32").unwrap()];
    let e = torch::load_graph(&fixture("no_inputs.pt"), &one)
        .unwrap_err()
        .to_string();
    assert!(e.contains("forward takes 2 inputs, 1 given"), "{e}");

    let out = fact()
        .args(["compose"])
        .arg(fixture("linear.pt"))
        .args(["--input", "32x64:f8"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("dtype 'f8' is not one of"), "{err}");

    let out = fact()
        .args(["compose"])
        .arg(fixture("linear.pt"))
        .args(["--precision", "fp8"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("use tf32 or f32"));

    let out = fact()
        .args([
            "realize",
            "--rule",
            "gemm_rcr_bias",
            "--dtype",
            "f32",
            "--shape",
            "64x64x64",
            "--epilogue",
            "leaves=;v1=frob(v0)",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad --epilogue")
            && err.contains("unknown epilogue op 'frob'")
            && err.contains("as discover prints it"),
        "{err}"
    );
}

#[test]
fn f32_accurate_policy_plans_3xtf32_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let out = fact()
        .env("FACT_TABLE", dir.path().join("t.json"))
        .args(["discover", "--precision", "f32", "--json"])
        .arg(fixture("linear.pt"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["plan"]["patterns"][0]["math"], "tf32x3",
        "{}",
        v["plan"]["patterns"][0]
    );
}

/// The composed module reads one copy of a buffer every layer holds alike (GPT-J's rotary table),
/// so TorchScript's executor computes what depends on it once; parameters, a buffer the graph
/// writes in place and one it returns keep their own reads, and the module computes what the
/// archive did; two equal buffers read back to back are read once.
#[test]
fn equal_buffers_are_read_once_and_their_ops_run_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    let script = format!(
        r#"
import torch
class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(12.0).reshape(3, 4).sin())
        self.weight = torch.nn.Parameter(torch.ones(4))
    def forward(self, x, x0):
        # With the input's data, so that no memo keeps the sum (tests/memo.rs).
        return x * (self.table * x0.mean()).sum(0) * self.weight
class Counted(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(4))
    def forward(self, x):
        self.count.add_(1.0)
        return x + self.count
class Model(torch.nn.Module):
    def __init__(self, counted, returned):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer() for _ in range(3)])
        self.counted = torch.nn.ModuleList([Counted() for _ in range(counted)])
        self.returned = returned
    def forward(self, x):
        x0 = x
        for l in self.layers:
            x = l(x, x0)
        for c in self.counted:
            x = c(x)
        return (x, self.layers[2].table) if self.returned else x
class Pair(torch.nn.Module):
    # Two equal buffers read back to back: the second read is pooled into the one just before it.
    def __init__(self):
        super().__init__()
        self.register_buffer("first", torch.arange(4.0).cos())
        self.register_buffer("second", torch.arange(4.0).cos())
    def forward(self, x):
        return x * torch.stack([self.first, self.second]).sum(0)
for counted, returned, name in [(0, False, "{}"), (2, False, "{}"), (0, True, "{}")]:
    torch.jit.trace(Model(counted, returned).eval(), torch.randn(2, 4), check_trace=False).save(name)
torch.jit.trace(Pair().eval(), torch.randn(2, 4), check_trace=False).save("{}")
print("ok")
"#,
        path("layers.pt").display(),
        path("counted.pt").display(),
        path("returned.pt").display(),
        path("pair.pt").display()
    );
    assert_eq!(run_python(&script), "ok");
    let schemas = fact::kinds::registry::op_schemas();
    let reads = |text: &str, name: &str| {
        text.matches(&format!("prim::GetAttr[name=\"{name}\"]"))
            .count()
    };
    let text =
        torch::rewrite_and_save(&path("layers.pt"), &path("layers_out.pt"), &[], &schemas).unwrap();
    assert_eq!(
        (reads(&text, "table"), reads(&text, "weight")),
        (1, 3),
        "{text}"
    );
    let text = torch::rewrite_and_save(&path("counted.pt"), &path("counted_out.pt"), &[], &schemas)
        .unwrap();
    assert_eq!(
        (
            reads(&text, "table"),
            reads(&text, "weight"),
            reads(&text, "count")
        ),
        (1, 3, 2),
        "{text}"
    );
    // The table the graph returns keeps its own read; the other two layers share one.
    let text = torch::rewrite_and_save(
        &path("returned.pt"),
        &path("returned_out.pt"),
        &[],
        &schemas,
    )
    .unwrap();
    assert_eq!(reads(&text, "table"), 2, "{text}");
    // Pooling a read into the one just before it ends (it once met that read again and pooled it
    // into itself, for ever), and one read is left.
    let text =
        torch::rewrite_and_save(&path("pair.pt"), &path("pair_out.pt"), &[], &schemas).unwrap();
    assert_eq!(reads(&text, "first") + reads(&text, "second"), 1, "{text}");
    // In TorchScript's executor: the archives' results, and after the profiling runs the optimized
    // graph sums the table once where the archive's sums it in every layer. (With the in-place
    // writes in the graph its alias analysis keeps every sum: the pooling is only a read.)
    let check = format!(
        r#"
import torch
def run(path):
    m = torch.jit.load(path)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    outs = [m(x) for _ in range(3)]
    return outs, str(torch.jit.last_executed_optimized_graph()).count("aten::sum(")
sums = []
for a, b in [("{}", "{}"), ("{}", "{}")]:
    (x, sa), (y, sb) = run(a), run(b)
    assert all(torch.equal(p, q) for p, q in zip(x, y)), (x, y)
    sums += [sa, sb]
print(*sums)
"#,
        path("layers.pt").display(),
        path("layers_out.pt").display(),
        path("counted.pt").display(),
        path("counted_out.pt").display()
    );
    assert_eq!(run_python(&check), "3 1 3 3");
}

/// The fp64 reference a bench verifies against computes in fp64 throughout: a cast the trace
/// baked to the dtype it ran in (`x.to(weight.dtype)` before a convolution, as DINOv2 casts its
/// pixels) and a bf16 tensor constant become fp64, so the copy runs (a bf16 operand beside fp64
/// weights is refused) and matches the model built in fp64.
#[test]
fn the_fp64_copy_computes_in_fp64_through_casts_the_trace_baked() {
    let dir = tempfile::tempdir().unwrap();
    let (model, reference, copy) = (
        dir.path().join("m.pt"),
        dir.path().join("ref.pt"),
        dir.path().join("fp64.pt"),
    );
    run_python(&format!(
        r#"
import torch
torch.manual_seed(0)
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 2, stride=2)
        self.lin = torch.nn.Linear(4, 5)
    def forward(self, x):
        y = self.conv(x.to(self.conv.weight.dtype)).flatten(2).transpose(1, 2)
        h = self.lin(y.to(torch.float32).to(self.lin.weight.dtype))
        return h * torch.tensor(0.3, dtype=self.lin.weight.dtype)
m = M().eval()
x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
torch.jit.trace(m.double(), x).save(r"{reference}")
torch.jit.trace(m.to(torch.bfloat16), x.to(torch.bfloat16), check_trace=False).save(r"{model}")
"#,
        reference = reference.display(),
        model = model.display()
    ));
    torch::save_fp64_copy(&model, &copy).unwrap();
    let out = run_python(&format!(
        r#"
import torch
torch.manual_seed(1)
x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
a = torch.jit.load(r"{copy}")(x)
b = torch.jit.load(r"{reference}")(x)
print(a.dtype, float((a - b).abs().max() / b.abs().max()))
"#,
        copy = copy.display(),
        reference = reference.display()
    ));
    let (dtype, err) = out.rsplit_once(' ').unwrap();
    assert_eq!(dtype, "torch.float64", "{out}");
    // bf16 weights made fp64 are the reference's weights rounded once: within bf16's rounding.
    assert!(err.parse::<f64>().unwrap() < 2e-2, "{out}");
}
