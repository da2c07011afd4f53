//! What a forward computes from its inputs' shapes and the module's buffers and parameters alone
//! (positions from arange, the rotary cos and sin, a causal mask, a position bias gathered from a
//! parameter table) is kept by the op library per key and issued once per shape: the rewrite wraps
//! it in `fact::memo_get` / `fact::memo_put`, and leaves
//! everything else (a buffer the forward writes, a table read with the input's data, values the
//! graph returns) as it was. Fixtures: static_rotaries.pt (StaticRotaries), rotaries.pt (positions
//! passed in: nothing to keep).

use crate::common::{compose_json, fixture, run_python};
use fact::torch;

/// The lines of `text` at the graph's top level and those inside a block.
fn levels(text: &str) -> (Vec<&str>, Vec<&str>) {
    text.lines()
        .filter(|l| l.trim_start().starts_with('%'))
        .partition(|l| !l.starts_with("    "))
}

#[test]
fn values_fixed_by_shapes_buffers_and_parameters_are_computed_in_one_memo() {
    let dir = tempfile::tempdir().unwrap();
    let schemas = fact::kinds::registry::op_schemas();
    let text = torch::rewrite_and_save(
        &fixture("static_rotaries.pt"),
        &dir.path().join("out.pt"),
        &[],
        &schemas,
    )
    .unwrap();
    let (top, inner) = levels(&text);
    let count = |lines: &[&str], op: &str| lines.iter().filter(|l| l.contains(op)).count();
    assert_eq!(count(&top, "fact::memo_get("), 1, "{text}");
    assert_eq!(count(&inner, "fact::memo_put("), 1, "{text}");
    // The positions, cos, sin, the mask, the position bias's gather and layout, and the mask
    // made and written in place: only in the memo's branch that computes them.
    for op in [
        "aten::arange(",
        "aten::cos(",
        "aten::sin(",
        "aten::masked_fill(",
        "aten::gt(",
        "aten::contiguous(",
        "aten::new_zeros(",
        "aten::fill_(",
        "aten::copy_(",
    ] {
        assert_eq!(
            (count(&top, op), count(&inner, op) > 0),
            (0, true),
            "{op}: {text}"
        );
    }
    // The counter the forward writes and the table it reads with the input's data stay outside:
    // their values change from call to call. The parameter table's gathers (by the buffer index,
    // and by the index built in place through the index op's list) and the mask's `+=` are the
    // memo's.
    assert_eq!(
        (count(&top, "aten::argmax("), count(&inner, "aten::argmax(")),
        (1, 0),
        "{text}"
    );
    assert_eq!(
        (count(&top, "aten::add_("), count(&inner, "aten::add_(")),
        (1, 1),
        "{text}"
    );
    assert_eq!(
        (count(&top, "aten::index("), count(&inner, "aten::index(")),
        (1, 2),
        "{text}"
    );
    // An op that changes a tensor's shape in place could tell where the memo reads the shapes
    // from where the graph did: such a graph keeps its ops (and without it, the same ops go).
    let script = format!(
        r#"
import torch
class M(torch.nn.Module):
    def __init__(self, reshape):
        super().__init__()
        self.reshape = reshape
    def forward(self, x):
        y = x * torch.arange(x.size(1), device=x.device).float().cos()
        if self.reshape:
            x.unsqueeze_(0)
        return y, x
for reshape, name in [(True, "{}"), (False, "{}")]:
    torch.jit.trace(M(reshape), torch.randn(2, 4), check_trace=False).save(name)
print("ok")
"#,
        dir.path().join("reshaped.pt").display(),
        dir.path().join("kept.pt").display()
    );
    assert_eq!(run_python(&script), "ok");
    for (name, memo) in [("reshaped.pt", false), ("kept.pt", true)] {
        let text = torch::rewrite_and_save(
            &dir.path().join(name),
            &dir.path().join(format!("out_{name}")),
            &[],
            &schemas,
        )
        .unwrap();
        assert_eq!(text.contains("fact::memo_get("), memo, "{name}: {text}");
    }

    // Positions passed in make cos and sin the input's: no memo.
    let text = torch::rewrite_and_save(
        &fixture("rotaries.pt"),
        &dir.path().join("rotaries_out.pt"),
        &[],
        &schemas,
    )
    .unwrap();
    assert!(!text.contains("fact::memo_get("), "{text}");
}

#[test]
fn a_memo_computes_once_per_shape_and_again_after_its_state_changes() {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().join("table.json");
    // static_rotaries.pt's q and k are rotaries.pt's: the rotary tests' table holds their kernel.
    let (t, _) = crate::rotary::test_table();
    t.save(&user).unwrap();
    let out_dir = dir.path().join("out");
    let v = compose_json(&user, &fixture("static_rotaries.pt"), &out_dir);
    let rules: Vec<&str> = v["compose"]["patterns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["rotary_halves_qk"], "{v}");
    let lib = out_dir.join("libfact_ops.so");
    // Each call's outputs are the original module's, bit for bit (the counter the forward writes
    // too); cos runs on the first call at a shape and not on the next, again after the buffer it
    // reads changes in place, on every call with the memo turned off, and once in inference mode.
    // The position bias's gathers (the index ops past the one the input's argmax reads: the
    // parameter table's by a buffer index and by an index built in place) are in the same memo: a change of the parameter in place computes both again once, and where autograd
    // records through the parameter both run on every call.
    let script = format!(
        r#"
import ctypes
import torch
torch.ops.load_library({lib:?})
{op_lib}
m = torch.jit.load({composed:?})
orig = torch.jit.load({orig:?})
graph = str(m.forward.graph)
assert graph.count("fact::memo_get(") == 1 and graph.count("fact::rotary_qk(") == 1, graph
g = torch.Generator().manual_seed(0)
def inputs(t):
    return torch.randn(2, t, 64, generator=g), torch.randn(2, t, 32, generator=g)
gathers = []
def call(x, grad=False):
    with torch.set_grad_enabled(grad), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = m(*x)
    with torch.set_grad_enabled(grad):
        want = orig(*x)
    assert len(got) == len(want) == 5
    for a, b in zip(got, want):
        assert torch.equal(a, b), (a - b).abs().max()
    # Autograd reaches the parameter through the gather where it records.
    assert (got[4].grad_fn is not None) == grad
    gathers.append(sum(1 for e in prof.events() if e.name == "aten::index") - 1)
    return sum(1 for e in prof.events() if e.name == "aten::cos")
x8, x5 = inputs(8), inputs(5)
runs = [call(x8), call(x8), call(x5), call(x8), call(x5)]
m.inv_freq.mul_(0.5)
orig.inv_freq.mul_(0.5)
runs += [call(x8), call(x8)]
assert so.fact_disable(b"memo") == 0
runs += [call(x8), call(x8)]
assert so.fact_disable(b"") == 0
# Inference mode is part of the key: its tensors must not reach a call outside it.
with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    inferred = m(*x8)
runs.append(sum(1 for e in prof.events() if e.name == "aten::cos"))
assert all(torch.equal(a, b) for a, b in zip(inferred[:3], orig(*x8)[:3]))
runs.append(call(x8))
with torch.no_grad():
    m.bias_table.mul_(0.5)
    orig.bias_table.mul_(0.5)
runs += [call(x8), call(x8), call(x8, grad=True), call(x8, grad=True)]
print(runs, gathers)
"#,
        lib = lib.display().to_string(),
        op_lib = crate::common::op_lib_python(&lib.display().to_string()),
        composed = out_dir.join("composed.pt").display().to_string(),
        orig = fixture("static_rotaries.pt").display().to_string(),
    );
    assert_eq!(
        run_python(&script),
        "[1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 1, 0, 1, 1] [2, 0, 2, 0, 0, 2, 0, 2, 2, 0, 2, 0, 2, 2]"
    );
}

/// A tensor made and then written in place is the memo's only where its value is fixed when it is
/// read: every write's operands fixed by the shapes and state, no op reading it before its last
/// write, and the graph not returning it.
#[test]
fn a_tensor_written_in_place_is_kept_only_where_its_value_is_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let schemas = fact::kinds::registry::op_schemas();
    let script = format!(
        r#"
import torch
class M(torch.nn.Module):
    def __init__(self, case):
        super().__init__()
        self.case = case
        self.table = torch.nn.Parameter(torch.tensor([0.5, 2.0]))
    def forward(self, x):
        t = x.size(0)
        mask = x.new_zeros(t, 4)
        mask[: t // 2] = 1.0
        early = x + mask
        if self.case == "data":
            mask[:, 1] = x[0, 0]
        else:
            mask[:, 1] += 2.0
        if self.case == "read_early":
            return x * mask + early
        if self.case == "returned":
            return x * mask, mask
        if self.case == "indexed":
            # An index built in place, read through the list of an index op (BEiT's bias).
            idx = torch.zeros(t, dtype=torch.long)
            idx[1:] = 1
            return x * mask * self.table[idx].unsqueeze(1)
        return x * mask
for case in ["kept", "data", "read_early", "returned", "indexed"]:
    torch.jit.trace(M(case), torch.randn(6, 4), check_trace=False).save(f"{}/{{case}}.pt")
print("ok")
"#,
        dir.path().display()
    );
    assert_eq!(run_python(&script), "ok");
    for (case, kept) in [
        ("kept", true),
        ("data", false),
        ("read_early", false),
        ("returned", false),
        ("indexed", true),
    ] {
        let text = torch::rewrite_and_save(
            &dir.path().join(format!("{case}.pt")),
            &dir.path().join(format!("out_{case}.pt")),
            &[],
            &schemas,
        )
        .unwrap();
        let (top, inner) = levels(&text);
        let fills = |lines: &[&str]| lines.iter().filter(|l| l.contains("aten::fill_(")).count();
        assert_eq!(text.contains("fact::memo_get("), kept, "{case}: {text}");
        if case == "indexed" {
            assert_eq!((fills(&top), fills(&inner)), (0, 2), "{case}: {text}");
            assert!(inner.iter().any(|l| l.contains("aten::index(")), "{text}");
        } else if kept {
            assert_eq!((fills(&top), fills(&inner)), (0, 1), "{case}: {text}");
        } else {
            assert_eq!(fills(&inner), 0, "{case}: {text}");
            assert!(fills(&top) > 0, "{case}: {text}");
        }
    }
}
