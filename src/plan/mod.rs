//! Stage 1: the plan. A cost model of the whole graph (FLOPs and bytes per node against the arch's
//! measured ceilings) estimates where the time goes; matched patterns get their share and an
//! expected gain, and what no rule matched is grouped into regions so a user sees what is left on
//! the table. Pure: no libtorch, GPU or disk.

use crate::graph::{elem_bytes, Graph, NodeId, TensorInfo};
use crate::kinds::{registry, Product};
use crate::rules::views;
use crate::types::{Arch, DType, MathType, Precision};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};

/// The ceilings of the arch's reference GPU (`Arch::hardware`), the denominators of the cost model.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Ceilings {
    pub tf32_tflops: f64,
    pub bf16_tflops: f64,
    pub fp32_tflops: f64,
    pub dram_tbps: f64,
    /// Fixed cost of one kernel launch in eager execution.
    pub launch_us: f64,
}

pub fn ceilings(arch: Arch) -> Ceilings {
    let h = arch.hardware();
    Ceilings {
        tf32_tflops: h.tf32_tflops,
        bf16_tflops: h.bf16_tflops,
        fp32_tflops: h.fp32_tflops,
        dram_tbps: h.dram_tbps,
        launch_us: h.launch_us,
    }
}

/// Ops that only make views, read sizes or build lists: no kernel, no traffic.
fn is_free(kind: &str) -> bool {
    kind.starts_with("prim::")
        || matches!(
            kind,
            "aten::view"
                | "aten::reshape"
                | "aten::transpose"
                | "aten::permute"
                | "aten::t"
                | "aten::numpy_T"
                | "aten::mT"
                | "aten::movedim"
                | "aten::_unsafe_view"
                | "aten::view_as"
                | "aten::unflatten"
                | "aten::narrow"
                | "aten::expand_as"
                | "aten::select"
                | "aten::slice"
                | "aten::size"
                | "aten::Int"
                | "aten::split"
                | "aten::split_with_sizes"
                | "aten::tensor_split"
                | "aten::swapaxes"
                | "aten::swapdims"
                | "aten::chunk"
                | "aten::unsqueeze"
                | "aten::squeeze"
                | "aten::expand"
                | "aten::unbind"
                | "aten::detach"
                | "aten::alias"
                | "aten::ScalarImplicit"
                | "aten::dropout"
                | "aten::flatten"
        )
}

/// Whether node `n` computes on 0-dim integer tensors alone, into 0-dim tensors: the sizes tracing
/// turns into tensors (`prim::NumToTensor`, as Hugging Face's `repeat_kv` multiplies the KV heads
/// by the repeat count, and torchvision's `(C // heads) ** -0.5` a scale, whose result is a float).
/// They live on the host; no kernel runs. (A `pow` or `floor_divide` of a real tensor is a kernel.)
fn host_arithmetic(g: &Graph, n: &crate::graph::Node) -> bool {
    let scalar = |v: &usize| g.tensor(*v).is_some_and(|t| t.shape.is_empty());
    let int = |v: &usize| {
        g.tensor(*v)
            .is_some_and(|t| matches!(t.dtype.as_str(), "i64" | "i32"))
    };
    let tensor = |v: &&usize| g.tensor(**v).is_some();
    let inputs: Vec<&usize> = n.inputs.iter().filter(tensor).collect();
    let outputs: Vec<&usize> = n.outputs.iter().filter(tensor).collect();
    !inputs.is_empty()
        && inputs.iter().all(|v| scalar(v) && int(v))
        && outputs.iter().all(|v| scalar(v))
}

fn numel(shape: &[i64]) -> f64 {
    shape.iter().map(|&d| d as f64).product()
}

/// Estimated cost of one node.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NodeCost {
    pub node: NodeId,
    pub kind: String,
    pub flops: f64,
    pub bytes: f64,
    pub ms: f64,
}

fn math_rate(c: &Ceilings, dtype: &str, precision: Precision) -> f64 {
    match DType::parse(dtype).and_then(|d| MathType::for_tensor(d, precision)) {
        Some(MathType::Tf32) => c.tf32_tflops,
        // The model as torch runs it: fp32 under matmul precision "highest" uses no tensor cores
        // (51.8 TFLOP/s over the three benchmark GEMMs on the H100, benches/results/2026-11-22-split).
        Some(MathType::Tf32x3 | MathType::F32) => c.fp32_tflops,
        Some(MathType::Bf16 | MathType::F16) => c.bf16_tflops,
        None => c.fp32_tflops,
    }
}

/// FLOPs and bytes of every node that launches work, and the time the roofline gives it;
/// `products` are the matched patterns' matrix products (`Patterns::products`), priced at their
/// math's rate and their tiles' efficiency.
pub fn node_costs(
    g: &Graph,
    arch: Arch,
    precision: Precision,
    products: &[Product],
) -> Vec<NodeCost> {
    let c = ceilings(arch);
    let gemm_at: HashMap<NodeId, &Product> = products.iter().map(|p| (p.node, p)).collect();
    let mut out = Vec::new();
    for (id, n) in g.nodes.iter().enumerate() {
        // Transparent nodes (`rules::views`: contiguous of a packed tensor, same-dtype `to`) launch
        // nothing either.
        if is_free(&n.kind) || views::pass(g, id).is_some() {
            continue;
        }
        let tensors = |vs: &[usize]| -> f64 {
            vs.iter()
                .filter_map(|&v| g.tensor(v))
                .map(TensorInfo::bytes)
                .sum()
        };
        let bytes = tensors(&n.inputs) + tensors(&n.outputs);
        if bytes == 0.0 || host_arithmetic(g, n) {
            continue;
        }
        let out_t = n.outputs.first().and_then(|&o| g.tensor(o));
        let dtype = out_t
            .map(|t| t.dtype.clone())
            .unwrap_or_else(|| "f32".into());
        let flops = match gemm_at.get(&id) {
            Some(p) => p.flops,
            None if n.kind.contains("matmul")
                || n.kind.contains("linear")
                || n.kind.contains("mm") =>
            {
                // An unmatched GEMM-like node: 2·K per output element, K from the first input.
                let k = n
                    .inputs
                    .first()
                    .and_then(|&v| g.tensor(v))
                    .and_then(|t| t.shape.last().copied())
                    .unwrap_or(1);
                out_t.map_or(0.0, |t| 2.0 * numel(&t.shape) * k as f64)
            }
            None => out_t.map_or(0.0, |t| {
                numel(&t.shape) * if n.kind.contains("softmax") { 5.0 } else { 1.0 }
            }),
        };
        let rate = if gemm_at.contains_key(&id) {
            math_rate(&c, &dtype, precision)
        } else {
            c.fp32_tflops
        };
        let mut roofline = (flops / (rate * 1e12)).max(bytes / (c.dram_tbps * 1e12));
        if let Some(k) = gemm_k(g, id, &gemm_at) {
            roofline /= tile_efficiency(k as f64, elem_bytes(&dtype));
        }
        let ms = roofline * 1e3 + c.launch_us * 1e-3;
        out.push(NodeCost {
            node: id,
            kind: n.kind.clone(),
            flops,
            bytes,
            ms,
        });
    }
    out
}

/// The time the cost model gives a pattern's kernel (`Kind::work`): each product at its math's
/// rate over its tiles' efficiency, or its bytes at the DRAM rate where that is longer, and a
/// launch each.
pub fn price(work: &crate::kinds::Work, arch: Arch, precision: Precision, dtype: DType) -> f64 {
    let c = ceilings(arch);
    let rate = math_rate(&c, dtype.short_name(), precision) * 1e12;
    let compute: f64 = work
        .products
        .iter()
        .map(|p| p.flops / rate / tile_efficiency(p.k as f64, dtype.bytes() as f64))
        .sum();
    let memory = work.bytes / (c.dram_tbps * 1e12);
    compute.max(memory) * 1e3 + work.launches as f64 * c.launch_us * 1e-3
}

/// K of a GEMM-like node (matched, or an unmatched matmul/linear/bmm), if it is one.
fn gemm_k(g: &Graph, id: NodeId, gemm_at: &HashMap<NodeId, &Product>) -> Option<i64> {
    if let Some(p) = gemm_at.get(&id) {
        return Some(p.k);
    }
    let n = &g.nodes[id];
    if !(n.kind.contains("matmul") || n.kind.contains("linear") || n.kind.ends_with("mm")) {
        return None;
    }
    n.inputs
        .first()
        .and_then(|&v| g.tensor(v))
        .and_then(|t| t.shape.last().copied())
}

/// The fraction of a tile's time spent in its K loop. Each 128x256 output tile also fills its
/// pipeline (about 4 stages of one K block) and writes its output through the epilogue; in bytes
/// the epilogue equals (128·256·out) / ((128+256)·in) units of K. With K0 the sum of both, a
/// tile's time scales as K + K0, so short-K GEMMs (attention's q·kᵀ, K = head dim) run far below
/// the roofline while long-K ones approach it.
fn tile_efficiency(k: f64, elem: f64) -> f64 {
    let (tm, tn, stages) = (128.0, 256.0, 4.0);
    let tk = 128.0 / elem;
    let k0 = (tm * tn * elem) / ((tm + tn) * elem) + stages * tk;
    k / (k + k0)
}

/// Nodes no rule matched, connected through data edges (views included), with their share.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Region {
    pub name: String,
    pub nodes: Vec<NodeId>,
    pub kinds: Vec<String>,
    pub est_ms: f64,
    pub share: f64,
}

/// Groups the costed nodes outside `matched` into connected regions, largest first (ties in graph
/// order).
pub fn unmatched_regions(
    g: &Graph,
    costs: &[NodeCost],
    matched: &BTreeSet<NodeId>,
    total_ms: f64,
) -> Vec<Region> {
    let costed: HashMap<NodeId, &NodeCost> = costs.iter().map(|c| (c.node, c)).collect();
    // Union-find over unmatched nodes joined by producer→consumer edges.
    let n = g.nodes.len();
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(p: &mut [usize], x: usize) -> usize {
        let mut r = x;
        while p[r] != r {
            r = p[r];
        }
        let mut y = x;
        while p[y] != r {
            let next = p[y];
            p[y] = r;
            y = next;
        }
        r
    }
    let joinable = |id: NodeId| {
        !matched.contains(&id)
            && g.nodes[id].kind != "prim::Constant"
            && g.nodes[id].kind != "prim::GetAttr"
    };
    for (id, node) in g.nodes.iter().enumerate() {
        if !joinable(id) {
            continue;
        }
        for &v in &node.inputs {
            if let Some(p) = g.values[v].producer.filter(|&p| joinable(p)) {
                let (a, b) = (find(&mut parent, id), find(&mut parent, p));
                parent[a] = b;
            }
        }
    }
    let mut groups: HashMap<usize, Vec<NodeId>> = HashMap::new();
    for &id in costed.keys() {
        if !matched.contains(&id) {
            let r = find(&mut parent, id);
            groups.entry(r).or_default().push(id);
        }
    }
    let mut regions: Vec<Region> = groups
        .into_values()
        .map(|mut nodes| {
            nodes.sort();
            let kinds: Vec<String> = nodes.iter().map(|&i| g.nodes[i].kind.clone()).collect();
            let est_ms: f64 = nodes.iter().map(|i| costed[i].ms).sum();
            let mut names: Vec<&str> = Vec::new();
            for k in &kinds {
                let short = k.trim_start_matches("aten::");
                if names.last() != Some(&short) {
                    names.push(short);
                }
            }
            Region {
                name: names.join(" → "),
                nodes,
                kinds,
                est_ms,
                share: if total_ms > 0.0 {
                    est_ms / total_ms
                } else {
                    0.0
                },
            }
        })
        .collect();
    // Equal estimates keep graph order, so `discover` prints the same plan every run.
    regions.sort_by(|a, b| {
        b.est_ms
            .total_cmp(&a.est_ms)
            .then_with(|| a.nodes.cmp(&b.nodes))
    });
    regions
}

/// A GEMM the rules left alone, and why: a user sees what fact skipped and what to change.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct UnmatchedGemm {
    pub node: NodeId,
    pub kind: String,
    /// The module path it came from, empty when unknown.
    pub scope: String,
    pub reason: String,
}

/// The nodes of the ops fact's kinds compute that no match in `matched` covers, with the reason
/// each kind gives (`kinds::Kind::unmatched`): GEMMs inside control flow (rules match only the
/// top-level block), of unknown shapes or with operands no rule takes, and the
/// `scaled_dot_product_attention` calls the attention rule refuses (a general or unknown mask,
/// dropout, ...).
pub fn unmatched_gemms(g: &Graph, matched: &BTreeSet<NodeId>) -> Vec<UnmatchedGemm> {
    registry::unmatched(g, matched)
        .into_iter()
        .map(|(id, reason)| UnmatchedGemm {
            node: id,
            kind: g.nodes[id].kind.clone(),
            scope: g.nodes[id].scope.clone(),
            reason,
        })
        .collect()
}

mod build;
pub use build::{plan, PlanOptions};

/// One pattern of the plan.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PlannedPattern {
    pub id: String,
    pub name: String,
    pub rule: String,
    pub arch: Arch,
    pub node: NodeId,
    pub origin: String,
    /// Shapes of the pattern's operands as the graph carries them: a, b (and bias) for a GEMM;
    /// q, k, v for attention (k as [.., Tk, D]); x (and weight, bias) for a LayerNorm.
    pub input_shapes: Vec<Vec<i64>>,
    pub dtype: DType,
    pub math: Option<MathType>,
    pub problem: crate::kinds::Problem,
    /// Pipelining, grid schedule and tensor-core instruction a kernel for it would use.
    pub notes: Vec<String>,
    /// Operands whose strides fit no layout: the op copies them on every call (`kinds::gemm::GemmMatch`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<String>,
    /// The weight compose pads along N, and what that does (rules::WeightPad).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad: Option<String>,
    /// Supporting CUTLASS examples (paths in the installed CUTLASS tree).
    pub examples: Vec<String>,
    pub est_ms: f64,
    pub share: f64,
    /// Kernel speedup over torch: measured (a pattern-table entry) or estimated.
    pub expected_speedup: f64,
    pub speedup_source: String,
    pub expected_gain_ms: f64,
    /// 1 is tuned first.
    pub priority: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Plan {
    pub arch: Arch,
    pub precision: Precision,
    pub ceilings: Ceilings,
    pub total_est_ms: f64,
    pub patterns: Vec<PlannedPattern>,
    pub unmatched: Vec<Region>,
    pub unmatched_share: f64,
    /// What the composed module's memo computes once per shape instead of every forward (masks,
    /// positions, rotary tables built from the inputs' sizes and buffers): its share of the
    /// estimate, counted neither as a pattern nor as unmatched, and how many ops it is.
    #[serde(default)]
    pub memo_share: f64,
    #[serde(default)]
    pub memo_ops: usize,
    /// The front end that read the model: `torchscript`, or `pt2` (a torch.export program as
    /// saved, not decomposed further), and the dynamic dims of a `.pt2` program's inputs.
    #[serde(default)]
    pub source: crate::torch::FrontEnd,
    /// GEMMs no rule took (inside control flow, shapes unknown), with the reason.
    pub unmatched_gemms: Vec<UnmatchedGemm>,
    /// What shape propagation fell back on or where it stopped (the graph's note): patterns
    /// downstream of an op it could not run are not matched, and this says which op it was.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub shapes: String,
    /// Which agent ranked and chose examples, and anything it had to fall back on.
    pub agent: String,
    pub agent_notes: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::attention::AttentionMatch;
    use crate::kinds::conv::tests::BLOCK as CONV_BLOCK;
    use crate::kinds::conv::{Conv, ConvMatch, Source as ConvSource};
    use crate::kinds::gemm::{match_gemms, GemmMatch};
    use crate::kinds::layernorm::LayerNormMatch;
    use crate::kinds::registry::match_patterns;
    use crate::kinds::Kind;
    use crate::rules::Match;

    /// The matrix products of GEMM matches, as the cost model takes them.
    fn products(ms: &[GemmMatch]) -> Vec<Product> {
        ms.iter()
            .flat_map(|m| crate::kinds::gemm::Gemm.products(m))
            .collect()
    }

    fn attention_like() -> Graph {
        Graph::parse(
            "graph(%x: f32[64,512,256], %w: f32[768,256], %b: f32[768], %q: f32[64,8,512,32], %k: f32[64,8,32,512], %m: bool[512,512]):
               %y = aten::linear(%x, %w, %b) : f32[64,512,768]
               %s = aten::matmul(%q, %k) : f32[64,8,512,512]
               %d = aten::div(%s, %s) : f32[64,8,512,512]
               %f = aten::masked_fill(%d, %m, %m) : f32[64,8,512,512]
               %p = aten::softmax(%f) : f32[64,8,512,512]
               %v = aten::view(%p) : f32[64,8,512,512]
               %g = aten::gelu(%y) : f32[64,512,768]
               return (%v, %g)",
        )
        .unwrap()
    }

    #[test]
    fn gemms_cost_by_flops_and_elementwise_by_bytes() {
        let g = attention_like();
        let m = match_gemms(&g);
        let costs = node_costs(&g, Arch::Sm90, Precision::Tf32, &products(&m));
        let linear = costs.iter().find(|c| c.kind == "aten::linear").unwrap();
        assert_eq!(linear.flops, 2.0 * 64.0 * 512.0 * 768.0 * 256.0);
        let roofline_ms = linear.flops / 397e12 * 1e3;
        assert!(
            linear.ms > roofline_ms * 1.5,
            "K = 256 pays pipeline fill and epilogue: {} vs {roofline_ms}",
            linear.ms
        );
        let softmax = costs.iter().find(|c| c.kind == "aten::softmax").unwrap();
        assert_eq!(softmax.bytes, 2.0 * 4.0 * 64.0 * 8.0 * 512.0 * 512.0);
        assert!(
            softmax.ms > 0.1,
            "a 0.5 GB read and write takes time: {}",
            softmax.ms
        );
        assert!(
            costs.iter().all(|c| c.kind != "aten::view"),
            "views are free"
        );
    }

    #[test]
    fn a_contiguous_costs_only_where_it_copies() {
        let g = Graph::parse(
            "graph(%x: f32[64,32], %t: f32[32,64]{1,32}):
               %zero = prim::Constant[0]()
               %f32 = prim::Constant[6]()
               %f = prim::Constant[False]()
               %none = prim::Constant[None]()
               %a = aten::contiguous(%x, %zero) : f32[64,32]
               %b = aten::contiguous(%t, %zero) : f32[32,64]
               %c = aten::to(%x, %f32, %f, %f, %none) : f32[64,32]
               return (%a, %b, %c)",
        )
        .unwrap();
        let costs = node_costs(&g, Arch::Sm90, Precision::Tf32, &[]);
        let names: Vec<&str> = costs
            .iter()
            .map(|c| g.values[g.nodes[c.node].outputs[0]].name.as_str())
            .collect();
        assert_eq!(names, ["b"], "the transposed tensor's copy alone");
    }

    #[test]
    fn views_of_a_weight_cost_nothing() {
        // Falcon's linear reads `weight.T`; unflatten and narrow are views too, and so is
        // GPT-BigCode's split of its fused projection (`split_with_sizes`).
        let g = Graph::parse(
            "graph(%w: f32[64,32]):
               %zero = prim::Constant[0]()
               %two = prim::Constant[2]()
               %s = prim::ListConstruct(%two, %two) : int[]
               %a = aten::numpy_T(%w) : f32[32,64]
               %b = aten::mT(%w) : f32[32,64]
               %c = aten::narrow(%w, %zero, %zero, %two) : f32[2,32]
               %d = aten::unflatten(%w, %zero, %s) : f32[2,32,32]
               %e = aten::neg(%w) : f32[64,32]
               %sizes = prim::ListConstruct(%two, %two) : int[]
               %parts = aten::split_with_sizes(%w, %sizes, %zero) : Tensor[]
               %f = aten::swapaxes(%w, %zero, %two) : f32[32,64]
               %kv = prim::NumToTensor(%two) : i64[]
               %heads = aten::mul(%kv, %two) : i64[]
               %half = prim::Constant[-0.5]()
               %per = aten::floor_divide(%kv, %two) : i64[]
               %scale = aten::pow(%per, %half) : f32[]
               %sq = aten::pow(%w, %two) : f32[64,32]
               return (%a, %b, %c, %d, %e, %parts, %f, %heads, %scale, %sq)",
        )
        .unwrap();
        let costs = node_costs(&g, Arch::Sm90, Precision::Tf32, &[]);
        let names: Vec<&str> = costs
            .iter()
            .map(|c| g.values[g.nodes[c.node].outputs[0]].name.as_str())
            .collect();
        assert_eq!(
            names,
            ["e", "sq"],
            "the neg and the square of w run kernels (the KV heads times the repeat count, and a \
             scale from a traced size, are host arithmetic)"
        );
    }

    #[test]
    fn the_f32_accurate_baseline_runs_without_tensor_cores() {
        let g = attention_like();
        let m = match_gemms(&g);
        let cost = |p: Precision| {
            node_costs(&g, Arch::Sm90, p, &products(&m))
                .into_iter()
                .find(|c| c.kind == "aten::linear")
                .unwrap()
                .ms
        };
        let ratio = cost(Precision::F32) / cost(Precision::Tf32);
        assert!(
            ratio > 5.0 && ratio < 8.5,
            "torch fp32 'highest' vs tf32: {ratio}"
        );
    }

    #[test]
    fn long_k_approaches_the_roofline_and_short_k_does_not() {
        assert!(tile_efficiency(8192.0, 4.0) > 0.95);
        assert!(tile_efficiency(96.0, 4.0) < 0.35);
        assert!(tile_efficiency(96.0, 4.0) < tile_efficiency(96.0, 2.0) * 1.5);
    }

    #[test]
    fn sdpa_calls_the_rule_refuses_are_listed_with_the_reason() {
        let g = |fact: &str| {
            Graph::parse(&format!(
                "graph(%q: bf16[2,8,64,64], %k: bf16[2,8,64,64], %v: bf16[2,8,64,64], %m: bool[2,1,64,64]{fact}):
                   %f = prim::Constant[False]()
                   %p = prim::Constant[0.]()
                   %none = prim::Constant[None]()
                   %y = aten::scaled_dot_product_attention(%q, %k, %v, %m, %p, %f, %none, %f) : bf16[2,8,64,64]
                   return (%y)"
            ))
            .unwrap()
        };
        let window = g(" @general/shape");
        let skipped = unmatched_gemms(&window, &BTreeSet::new());
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].kind, "aten::scaled_dot_product_attention");
        assert!(
            skipped[0].reason.contains("general"),
            "{}",
            skipped[0].reason
        );
        // A causal one is a pattern: nothing to list once the plan covers it.
        let causal = g(" @causal/shape");
        let found = match_patterns(&causal);
        let covered: BTreeSet<NodeId> = found.of::<AttentionMatch>()[0]
            .nodes()
            .into_iter()
            .collect();
        assert!(unmatched_gemms(&causal, &covered).is_empty());
    }

    #[test]
    fn gemms_in_control_flow_are_listed_with_the_reason() {
        let mut g = Graph::parse(
            "graph(%x: f32[4,64], %w: f32[64,64], %c: bool[]):
               %y = prim::If(%c) : f32[4,64]
               %a = aten::linear(%x, %w, %w) : f32[4,64]
               %b = aten::matmul(%x, %w) : f32[4,64]
               %z = aten::mm(%x, %w) : f32[4,64]
               return (%y, %z)",
        )
        .unwrap();
        g.nodes[1].depth = 1;
        g.nodes[2].depth = 1;
        let matches = match_gemms(&g);
        assert_eq!(
            matches.iter().map(|m| m.node).collect::<Vec<_>>(),
            vec![3],
            "only the top-level mm"
        );
        let matched: BTreeSet<NodeId> = matches.iter().map(|m| m.node).collect();
        let skipped = unmatched_gemms(&g, &matched);
        assert_eq!(
            skipped
                .iter()
                .map(|u| (u.node, u.kind.as_str()))
                .collect::<Vec<_>>(),
            vec![(1, "aten::linear"), (2, "aten::matmul")]
        );
        assert!(
            skipped[0]
                .reason
                .starts_with("inside prim::If: fact matches only the top-level block"),
            "{}",
            skipped[0].reason
        );
        assert!(
            skipped[1]
                .reason
                .ends_with("move the GEMM out of the branch"),
            "{}",
            skipped[1].reason
        );
    }

    /// A causal attention whose output a weight-only LayerNorm reads, then a linear with a relu.
    const ONE_OF_EACH_KIND: &str =
        "graph(%q: f32[1,2,16,32], %k: f32[1,2,16,32], %v: f32[1,2,16,32], %m: bool[16,16], %g: f32[32], %w: f32[64,32]):
           %m1 = prim::Constant[-1]()
           %m2 = prim::Constant[-2]()
           %ninf = prim::Constant[-inf]()
           %none = prim::Constant[None]()
           %c = prim::Constant[0.125]()
           %eps = prim::Constant[1e-05]()
           %on = prim::Constant[True]()
           %d = prim::Constant[32]()
           %shape = prim::ListConstruct(%d)
           %kt = aten::transpose(%k, %m2, %m1) : f32[1,2,32,16]
           %s0 = aten::matmul(%q, %kt) : f32[1,2,16,16]
           %s1 = aten::mul(%s0, %c) : f32[1,2,16,16]
           %nm = aten::bitwise_not(%m) : bool[16,16]
           %s2 = aten::masked_fill(%s1, %nm, %ninf) : f32[1,2,16,16]
           %p = aten::softmax(%s2, %m1, %none) : f32[1,2,16,16]
           %o = aten::matmul(%p, %v) : f32[1,2,16,32]
           %n = aten::layer_norm(%o, %shape, %g, %none, %eps, %on) : f32[1,2,16,32]
           %h = aten::linear(%n, %w, %none) : f32[1,2,16,64]
           %y = aten::relu(%h) : f32[1,2,16,64]
           return (%y)";

    /// The options the plan tests price with: sm90, tf32, matches assumed twice as fast.
    const OPTS: PlanOptions = PlanOptions {
        arch: Arch::Sm90,
        precision: Precision::Tf32,
        assumed_speedup: 2.0,
    };

    /// `g`'s plan under `OPTS`, with no tables and the built-in agent.
    fn plan_of(g: &Graph, found: &crate::kinds::Patterns) -> Plan {
        plan(g, found, &OPTS, None, &mut crate::agent::Steward::builtin())
    }

    #[test]
    fn every_kind_is_priced_by_its_own_nodes_and_shows_its_operands() {
        let g = Graph::parse(ONE_OF_EACH_KIND).unwrap();
        let found = match_patterns(&g);
        let (opts, p) = (OPTS, plan_of(&g, &found));
        let costs = node_costs(&g, opts.arch, opts.precision, &found.products());
        let total: f64 = costs.iter().map(|c| c.ms).sum();
        let cost: HashMap<NodeId, f64> = costs.iter().map(|c| (c.node, c.ms)).collect();
        let time = |nodes: Vec<NodeId>| -> f64 { nodes.iter().filter_map(|n| cost.get(n)).sum() };
        let want = [
            (
                "a0",
                found.of::<AttentionMatch>()[0].nodes(),
                vec![vec![1, 2, 16, 32]; 3],
            ),
            (
                "l0",
                found.of::<LayerNormMatch>()[0].nodes(),
                vec![vec![1, 2, 16, 32], vec![32]],
            ),
            (
                "p0",
                found.of::<GemmMatch>()[0].nodes(),
                vec![vec![1, 2, 16, 32], vec![64, 32]],
            ),
        ];
        for (id, nodes, shapes) in want {
            let pat = p.patterns.iter().find(|q| q.id == id).expect(id);
            let est_ms = time(nodes);
            assert!(est_ms > 0.0, "{id}");
            assert_eq!(
                (pat.est_ms, pat.share, &pat.input_shapes),
                (est_ms, est_ms / total, &shapes),
                "{id}"
            );
            assert_eq!(pat.expected_gain_ms, est_ms / 2.0, "{id}");
        }
        assert_eq!(p.patterns.len(), 3);
        // Only the views and constants are left: no kind's nodes are unmatched.
        assert!(p.unmatched.is_empty(), "{:?}", p.unmatched);
        assert!(p.unmatched_gemms.is_empty(), "{:?}", p.unmatched_gemms);
    }

    #[test]
    fn unmatched_nodes_group_into_connected_regions() {
        let g = attention_like();
        let m = match_gemms(&g);
        let matched: BTreeSet<NodeId> = m.iter().map(|m| m.node).collect();
        let costs = node_costs(&g, Arch::Sm90, Precision::Tf32, &products(&m));
        let total: f64 = costs.iter().map(|c| c.ms).sum();
        let regions = unmatched_regions(&g, &costs, &matched, total);
        assert_eq!(regions.len(), 2);
        assert_eq!(regions[0].name, "div → masked_fill → softmax");
        assert_eq!(regions[1].name, "gelu");
        assert!(regions[0].share > regions[1].share);
    }

    #[test]
    fn what_the_memo_computes_is_neither_a_pattern_nor_unmatched() {
        // `@memo`: the bridge found the exp fixed by buffers and shapes (a rotary table).
        let g = Graph::parse(
            "graph(%x: f32[16,32], %b: f32[64,32]):
               %e = aten::exp(%b) : f32[64,32] @memo
               %y = aten::relu(%x) : f32[16,32]
               return (%y, %e)",
        )
        .unwrap();
        assert!(g.nodes[0].memo && !g.nodes[1].memo);
        let p = plan_of(&g, &match_patterns(&g));
        let costs = node_costs(&g, OPTS.arch, OPTS.precision, &[]);
        let total: f64 = costs.iter().map(|c| c.ms).sum();
        let exp = costs.iter().find(|c| c.kind == "aten::exp").unwrap().ms;
        assert_eq!((p.memo_ops, p.memo_share), (1, exp / total));
        let names: Vec<&str> = p.unmatched.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["relu"]);
        assert!((p.unmatched_share + p.memo_share - 1.0).abs() < 1e-12);
    }

    #[test]
    fn regions_of_equal_cost_keep_graph_order() {
        let g = attention_like();
        let m = match_gemms(&g);
        let matched: BTreeSet<NodeId> = m.iter().map(|m| m.node).collect();
        let mut costs = node_costs(&g, Arch::Sm90, Precision::Tf32, &products(&m));
        // The gelu alone costs what the three nodes of the softmax region cost together.
        for c in &mut costs {
            c.ms = if c.kind == "aten::gelu" { 3.0 } else { 1.0 };
        }
        let first = unmatched_regions(&g, &costs, &matched, 10.0);
        let by_kind = |k: &str| first.iter().position(|r| r.kinds.contains(&k.to_string()));
        let (softmax, gelu) = (
            by_kind("aten::softmax").unwrap(),
            by_kind("aten::gelu").unwrap(),
        );
        assert_eq!(first[softmax].est_ms, first[gelu].est_ms);
        // Graph order: the region whose first node comes first is listed first, every time.
        assert_eq!(
            softmax < gelu,
            first[softmax].nodes[0] < first[gelu].nodes[0]
        );
        for _ in 0..20 {
            assert_eq!(unmatched_regions(&g, &costs, &matched, 10.0), first);
        }
    }

    #[test]
    fn the_plan_shows_the_chain_and_prices_it_as_its_implicit_gemm() {
        let g = Graph::parse(CONV_BLOCK).unwrap();
        let found = match_patterns(&g);
        assert_eq!(found.found.len(), 1);
        let f = &found.found[0];
        assert_eq!((f.id.as_str(), f.kind.name()), ("c0", "conv"));
        let m = found.of::<ConvMatch>()[0];
        let facts = Conv.plan_facts(m, Some(MathType::Bf16), Arch::Sm90);
        assert_eq!(
            facts.name,
            "conv2d 32x256x14x14 → 1024 1x1 s1 p0 + bn + add + relu"
        );
        assert!(facts.notes[0].starts_with(
            "an implicit GEMM of M = N·P·Q = 32·14·14 = 6272, N = K = 1024, K = C·R·S = 256·1·1 = 256"
        ));
        // x is the graph's input and the output is returned: the op converts both ways.
        let notes = facts.notes.join("\n");
        for note in [
            "folded into the weights and bias once",
            "x converted to channels-last on every call: it comes NCHW from the graph's input",
            "the output handed back in NCHW for the graph's output",
            "sm90 conv collective builder",
        ] {
            assert!(notes.contains(note), "{note}: {notes}");
        }
        assert_eq!(Conv.copies_of(m).len(), 2);
        let f32_accurate = Conv.plan_facts(m, Some(MathType::Tf32x3), Arch::Sm90);
        assert!(f32_accurate.notes[1].starts_with("no kernel: f32-accurate"));
        // The cost model prices the convolution node at the tensor-core rate: its FLOPs are the
        // GEMM's, not one per output element.
        let products = found.products();
        assert_eq!(products.len(), 1);
        assert_eq!(products[0].flops, 2.0 * 6272.0 * 1024.0 * 256.0);
        assert_eq!(products[0].k, 256);
        let costs = node_costs(&g, Arch::Sm90, Precision::Tf32, &products);
        let conv = costs
            .iter()
            .find(|c| c.kind == "aten::_convolution")
            .unwrap();
        assert_eq!(conv.flops, products[0].flops);
        let unpriced = node_costs(&g, Arch::Sm90, Precision::Tf32, &[]);
        let alone = unpriced
            .iter()
            .find(|c| c.kind == "aten::_convolution")
            .unwrap();
        assert!(alone.flops < conv.flops / 100.0, "{}", alone.flops);
    }

    /// Without a measurement the plan prices the kernel with the cost model: one pass over its
    /// tensors in place of the convolution's, the BatchNorm's, the add's and the ReLU's, less
    /// the conversions this chain makes.
    #[test]
    fn the_plan_estimates_the_gain_from_the_passes_the_kernel_saves() {
        let g = Graph::parse(CONV_BLOCK).unwrap();
        let found = match_patterns(&g);
        let opts = PlanOptions {
            arch: Arch::Sm90,
            precision: Precision::Tf32,
            assumed_speedup: 1.05,
        };
        let plan = plan(
            &g,
            &found,
            &opts,
            None,
            &mut crate::agent::Steward::builtin(),
        );
        let p = &plan.patterns[0];
        assert!(
            p.speedup_source.starts_with("estimated by the cost model (one kernel, x converted to channels-last, the output converted back to NCHW)"),
            "{}",
            p.speedup_source
        );
        assert!(p.expected_speedup > 1.05, "{}", p.expected_speedup);
        // Read in place and handed on channels-last, the same chain saves more.
        let m = found.of::<ConvMatch>()[0];
        let inside = ConvMatch {
            x_from: ConvSource::Chain(0),
            out_nchw: None,
            ..m.clone()
        };
        let price = |m: &ConvMatch| {
            price(
                &Conv.work(m, MathType::Bf16).unwrap(),
                Arch::Sm90,
                Precision::Tf32,
                DType::Bf16,
            )
        };
        assert!(price(&inside) < price(m));
    }
}
