//! The convolution kind composed without a GPU: a torchvision-style fixture (conv_blocks.pt: a
//! stem, max pooling, a bottleneck with its residual add, a convolution with a bias and
//! hardswish) composed from a test table, so every convolution chain becomes one `fact::conv`;
//! the BatchNorms folded into buffers of the module (the weights channels-last, the stem's 3 input
//! channels padded with a zero one to fp32's 16-byte rows); the op's
//! fallback computing exactly what the replaced nodes did, on NCHW and channels-last inputs,
//! counted with its reason when the kind is off and on CPU tensors; `FACT_DISABLE=conv`.

use crate::common::{compose_json, fixture, run_python, sample_op_entry};
use fact::kinds::conv::{candidates, ConvMatch, ConvSpec};
use fact::kinds::{Problem, Spec};
use fact::table::Table;
use fact::types::{Arch, MathType};

/// The fixture's convolution problems under the tf32 policy, each with the generator's 64x64x32
/// tf32 tile in a 2x1x1 cluster (one kernel per epilogue: three for five problems).
fn test_table() -> (Table, Vec<(String, ConvSpec)>) {
    let (g, _) = fact::torch::load_graph(&fixture("conv_blocks.pt"), &[]).unwrap();
    let found = fact::kinds::registry::match_patterns(&g);
    let mut t = Table::new();
    let mut out = Vec::new();
    for m in found.of::<ConvMatch>() {
        let spec = candidates(&m.problem, MathType::Tf32, Arch::Sm90)
            .unwrap()
            .into_iter()
            .find(|s| s.conv_tile == [64, 64, 32] && s.conv_cluster == [2, 1, 1])
            .expect("the generator's 64x64x32 tf32 tile");
        let problem = Problem::from(m.problem.clone());
        t.insert_merged(sample_op_entry(
            &problem,
            &Spec::from(spec.clone()),
            MathType::Tf32,
            0.01,
            "test table (not a measurement)",
        ));
        out.push((problem.rule_id(), spec));
    }
    (t, out)
}

#[test]
fn a_table_hit_composes_fact_conv_on_folded_weights_whose_fallback_is_the_graphs_ops() {
    let (table, specs) = test_table();
    let rules: Vec<&str> = specs.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        rules,
        [
            "conv2d_s1_p1_d1_bias_relu",
            "conv2d_s1_p0_d1_bias_relu",
            "conv2d_s1_p1_d1_bias_relu",
            "conv2d_s1_p0_d1_bias_add_relu",
            "conv2d_s1_p0_d1_bias_hardswish",
        ]
    );
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    table.save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json(&user, &fixture("conv_blocks.pt"), &out_dir);
    let patterns = v["compose"]["patterns"].as_array().unwrap();
    assert_eq!(patterns.len(), 5, "{patterns:?}");
    for p in patterns {
        assert_eq!(p["kind"], "conv", "{p}");
        assert_eq!(p["realization"]["how"], "hit", "{p}");
    }
    // The chain converts where it starts (the graph's NCHW input) and nowhere else: between its
    // convolutions, and at its end, where the globally pooled output is flattened (a tensor of
    // one pixel lies alike in either layout).
    let copies: Vec<usize> = patterns
        .iter()
        .map(|p| p["copies"].as_array().map_or(0, Vec::len))
        .collect();
    assert_eq!(copies, [1, 0, 0, 0, 0], "{patterns:?}");
    // The stem's one copy pads x's 3 channels to 4 as it converts it.
    let stem_copy = patterns[0]["copies"][0].as_str().unwrap();
    assert!(
        stem_copy.starts_with("x padded from 3 to 4 channels, channels-last"),
        "{stem_copy}"
    );
    let mut kernels: Vec<String> = specs.iter().map(|(_, s)| s.name()).collect();
    kernels.sort();
    kernels.dedup();
    assert_eq!(kernels.len(), 3);
    let lib = out_dir.join("libfact_ops.so");
    let composed = out_dir.join("composed.pt");
    let script = format!(
        r#"
import ctypes, json, os
os.environ["FACT_DISABLE"] = "conv"
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
for op in ("aten::_convolution", "aten::batch_norm", "aten::relu", "aten::add_", "aten::hardswish"):
    assert op not in graph, (op, graph)
forms = [n.inputsAt(14).toIValue() for n in m.forward.graph.nodes() if n.kind() == "fact::conv"]
assert len(forms) == 5, graph
# Every chain hands its output on channels-last, the last one's pooled and flattened.
assert [f.split(";")[-1] for f in forms] == ["out:cl"] * 5, forms
assert forms[3] == "_convolution:0011;bn:1e-5:1;act:relu;out:cl" and forms[4] == "_convolution:0011;act:hardswish;out:cl", forms
orig = torch.jit.load({orig:?})
params = dict(orig.named_parameters())
params.update(dict(orig.named_buffers()))
buffers = dict(m.named_buffers())
cl = torch.channels_last

def fold(conv, bn):
    w = params[conv + ".weight"].double()
    b = params[conv + ".bias"].double() if conv + ".bias" in params else torch.zeros(w.shape[0], dtype=torch.float64)
    if bn is None:
        return w, b
    scale = params[bn + ".weight"].double() / torch.sqrt(params[bn + ".running_var"].double() + 1e-5)
    shift = params[bn + ".bias"].double() - params[bn + ".running_mean"].double() * scale
    return w * scale[:, None, None, None], b * scale + shift

for conv, bn in (("stem", "bn0"), ("c1", "bn1"), ("c2", "bn2"), ("c3", "bn3"), ("tail", None)):
    w, b = fold(conv, bn)
    # The stem's 3 input channels padded to 4: the kernel reads x in 16-byte rows of fp32.
    padded = "_c4" if conv == "stem" else ""
    fw, fb = buffers["fact_folded_" + conv + "_weight" + padded], buffers["fact_folded_" + conv + "_weight_bias"]
    # KRSC; a 1x1 filter's is its KCRS too.
    assert fw.is_contiguous(memory_format=cl) and (fw.shape[2] == 1 or not fw.is_contiguous()), (conv, fw.stride())
    if padded:
        assert fw.shape == (16, 4, 3, 3) and w.shape == (16, 3, 3, 3), (fw.shape, w.shape)
        assert torch.equal(fw[:, 3:], torch.zeros(16, 1, 3, 3)), fw[:, 3:]
        assert "fact_folded_stem_weight" not in buffers, sorted(buffers)
        fw = fw[:, :3]
    assert fw.dtype == torch.float32 and fb.dtype == torch.float32
    assert torch.allclose(fw.double(), w, rtol=1e-6, atol=1e-7), conv
    assert torch.allclose(fb.double(), b, rtol=1e-6, atol=1e-7), conv
# The fallback's weight is the model's own, unpadded.
assert params["stem.weight"].shape == (16, 3, 3, 3)
# Without a BatchNorm the weight and bias are the module's own, laid out for the kernel.
assert torch.equal(buffers["fact_folded_tail_weight"], params["tail.weight"])
assert torch.equal(buffers["fact_folded_tail_weight_bias"], params["tail.bias"])
{op_lib}

def check(x):
    with torch.no_grad():
        got, want = m(x), orig(x)
    assert got.shape == want.shape and torch.equal(got, want), (got - want).abs().max()
    stats = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    assert sorted(stats) == sorted({kernels:?}), stats
    counts = [stats[k] for k in sorted(stats)]
    assert sum(c["fell_back"] for c in counts) == 5 and all(c["ran"] == 0 for c in counts), stats
    return {{c["why"] for c in counts}}

x = torch.randn(2, 3, 16, 16)
assert check(x) == {{"conv is turned off (FACT_DISABLE or fact_disable)"}}
assert so.fact_disable(b"") == 0
assert check(x) == {{"not CUDA tensors of one device"}}
assert check(x.contiguous(memory_format=cl)) == {{"not CUDA tensors of one device"}}
# Another batch and image size: the same function.
assert check(torch.randn(3, 3, 12, 20)) == {{"not CUDA tensors of one device"}}
print("ok")
"#,
        lib = lib.display().to_string(),
        op_lib = crate::common::op_lib_python(&lib.display().to_string()),
        composed = composed.display().to_string(),
        orig = fixture("conv_blocks.pt").display().to_string(),
        kernels = kernels,
    );
    assert_eq!(run_python(&script), "ok");
}

/// Depthwise convolutions composed from a test table (depthwise_blocks.pt: a 1x1 expansion with
/// BatchNorm and ReLU6, a 3x3 stride-2 depthwise convolution with BatchNorm and hardswish,
/// convnext's 7x7 depthwise with its own bias, then a grouped convolution that stays torch's):
/// each depthwise chain is one
/// `fact::conv` on a folded [K,1,R,S] weight, its fallback on CPU tensors computes exactly what
/// the graph did, and the grouped convolution is left in the graph.
#[test]
fn depthwise_chains_compose_on_folded_weights_and_fall_back_to_the_graphs_ops() {
    let (g, _) = fact::torch::load_graph(&fixture("depthwise_blocks.pt"), &[]).unwrap();
    let found = fact::kinds::registry::match_patterns(&g);
    let mut table = Table::new();
    let mut specs = vec![];
    for m in found.of::<ConvMatch>() {
        let spec = candidates(&m.problem, MathType::Tf32, Arch::Sm90)
            .unwrap()
            .remove(0);
        let problem = Problem::from(m.problem.clone());
        table.insert_merged(sample_op_entry(
            &problem,
            &Spec::from(spec.clone()),
            MathType::Tf32,
            0.01,
            "test table (not a measurement)",
        ));
        specs.push((problem.rule_id(), spec));
    }
    let rules: Vec<&str> = specs.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        rules,
        [
            "conv2d_s1_p0_d1_bias_relu6",
            "conv2d_s2_p1_d1_g32_bias_hardswish",
            "conv2d_s1_p3_d1_g32_bias",
        ]
    );
    assert!(specs[1].1.name().starts_with("sm80_dwconv2d_fprop_f32_"));
    assert!(specs[2].1.name().contains("_r7x7_"));
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    table.save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json(&user, &fixture("depthwise_blocks.pt"), &out_dir);
    let patterns = v["compose"]["patterns"].as_array().unwrap();
    assert_eq!(patterns.len(), 3, "{patterns:?}");
    let mut kernels: Vec<String> = specs.iter().map(|(_, s)| s.name()).collect();
    kernels.sort();
    kernels.dedup();
    let script = format!(
        r#"
import ctypes, json
import torch
torch.ops.load_library({lib:?})
m = torch.jit.load({composed:?})
graph = str(m.forward.graph)
assert graph.count("fact::conv") == 3 and graph.count("aten::_convolution") == 1, graph
for op in ("aten::batch_norm", "aten::hardswish", "aten::hardtanh"):
    assert op not in graph, (op, graph)
orig = torch.jit.load({orig:?})
params = dict(orig.named_parameters())
params.update(dict(orig.named_buffers()))
buffers = dict(m.named_buffers())
w = params["dw.weight"].double()
scale = params["bn1.weight"].double() / torch.sqrt(params["bn1.running_var"].double() + 1e-5)
shift = params["bn1.bias"].double() - params["bn1.running_mean"].double() * scale
fw, fb = buffers["fact_folded_dw_weight"], buffers["fact_folded_dw_weight_bias"]
# One input channel a filter, folded per output channel, laid out [K,R,S,1] (channels-last of one channel).
assert fw.shape == (32, 1, 3, 3) and fw.is_contiguous(memory_format=torch.channels_last), (fw.shape, fw.stride())
assert torch.allclose(fw.double(), w * scale[:, None, None, None], rtol=1e-6, atol=1e-7)
assert torch.allclose(fb.double(), shift, rtol=1e-6, atol=1e-7)
assert torch.equal(buffers["fact_folded_dw7_weight"], params["dw7.weight"])
assert torch.equal(buffers["fact_folded_dw7_weight_bias"], params["dw7.bias"])
{op_lib}

def check(x):
    with torch.no_grad():
        got, want = m(x), orig(x)
    assert got.shape == want.shape and torch.equal(got, want), (got - want).abs().max()
    stats = json.loads(so.fact_op_stats())
    so.fact_op_stats_reset()
    assert sorted(stats) == sorted({kernels:?}), stats
    counts = [stats[k] for k in sorted(stats)]
    assert sum(c["fell_back"] for c in counts) == 3 and all(c["ran"] == 0 for c in counts), stats
    return {{c["why"] for c in counts}}

x = torch.randn(2, 16, 16, 16)
assert check(x) == {{"not CUDA tensors of one device"}}
assert check(x.contiguous(memory_format=torch.channels_last)) == {{"not CUDA tensors of one device"}}
assert check(torch.randn(3, 16, 10, 14)) == {{"not CUDA tensors of one device"}}
print("ok")
"#,
        lib = out_dir.join("libfact_ops.so").display().to_string(),
        op_lib =
            crate::common::op_lib_python(&out_dir.join("libfact_ops.so").display().to_string()),
        composed = out_dir.join("composed.pt").display().to_string(),
        orig = fixture("depthwise_blocks.pt").display().to_string(),
        kernels = kernels,
    );
    assert_eq!(run_python(&script), "ok");
}
