//! Convolution rule: `conv2d_s<stride>_p<padding>_d<dilation>[_bias][_add][_<act>]`.
//!
//! y[n,k,p,q] = act(Σ_{c,r,s} x[n,c,p·sh+r·dh−ph, q·sw+s·dw−pw]·w[k,c,r,s] + b[k] + res[n,k,p,q])
//! for x [N,C,H,W] (zero outside the image), w [K,C,R,S], then, where the graph applies one, an
//! eval-mode BatchNorm y' = (y − mean[k]) / √(var[k] + eps) · γ[k] + β[k] before the residual
//! add; b and the BatchNorm are one per-channel scale and bias, which compose folds into the
//! weights once. The graph writes the convolution `aten::_convolution(x, w, b?, stride, padding,
//! dilation, transposed, output_padding, groups, benchmark, deterministic, cudnn_enabled,
//! allow_tf32)` (a traced `nn.Conv2d`) or `aten::conv2d(x, w, b?, stride, padding, dilation,
//! groups)`, then `aten::batch_norm(y, γ?, β?, mean, var, training, momentum, eps, cudnn)`, then
//! `add`/`add_` of a tensor of y's shape (either order; alpha 1), then `relu`, `silu`,
//! `hardswish`, `gelu`, ReLU6 (`hardtanh(y, 0, 6)`, `clamp(y, 0, 6)` or `relu6`), `sigmoid` or
//! `hardsigmoid` (the gates of squeeze-excitation; each in place or not). Each step is optional,
//! in that order, and a step joins only where the previous one's output is read by it alone (and
//! not returned).
//!
//! What matches: a 2-D forward convolution (4-D tensors, not transposed, integer padding) with
//! groups 1, or depthwise (groups = C = K: w [K,1,R,S], one filter a channel; the rule id says
//! `_g<groups>`), whose weight, bias and BatchNorm tensors are module parameters (`prim::GetAttr`:
//! compose folds them once) of x's dtype; a BatchNorm in eval mode (`training` the constant False;
//! folding it is per output channel, so depthwise weights fold the same way).
//! Grouped convolutions (1 < groups < C), transposed ones, `padding='same'` and convolutions over
//! parameters the graph computes stay torch's, each with its reason in the plan (`refusal`).
//! `add_(residual, y)` writes into the residual; it joins only where nothing else can see that
//! write (the residual read by the add alone, not a view, not a graph input or output).
//!
//! `ConvRule` offers every prefix of the chain (the convolution, + BatchNorm, + add, + act): a
//! residual add that two chains reach (a bottleneck's last convolution and its downsample's) goes
//! to the one the cover prefers, and the other keeps the chain before the add.

use super::layout::{nchw_reader, x_source, Source, Substituted};
use super::problem::{ConvAct, ConvProblem};
use super::spec::kernels_take;
use super::CONV;
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::rules::{boxed, views, Match, PatternKind, Rule};
use crate::types::DType;

/// An eval-mode BatchNorm after the convolution: its operands, as the graph passes them.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNorm {
    pub node: NodeId,
    /// γ and β: absent for `affine=False`.
    pub weight: Option<ValueId>,
    pub bias: Option<ValueId>,
    pub mean: ValueId,
    pub var: ValueId,
    pub eps: ValueId,
}

/// The convolution node's own operands, as the graph passes them (the fallback replays them).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvCall {
    pub node: NodeId,
    pub x: ValueId,
    pub weight: ValueId,
    pub bias: Option<ValueId>,
    pub stride: ValueId,
    pub padding: ValueId,
    pub dilation: ValueId,
    pub groups: ValueId,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ConvMatch {
    pub conv: ConvCall,
    pub bn: Option<BatchNorm>,
    /// The residual add (`add` or `add_`) and the tensor it adds.
    pub add: Option<(NodeId, ValueId)>,
    pub act: Option<(NodeId, ConvAct)>,
    pub problem: ConvProblem,
    /// Where x comes from, as far as its layout goes (layout.rs): a channels-last chain or an
    /// NCHW producer the op converts on every call.
    pub x_from: Source,
    /// The reader of the pattern's output that needs torch's default strides (so the op hands
    /// its output back in NCHW), if there is one.
    pub out_nchw: Option<String>,
}

impl ConvMatch {
    /// The pattern's last node, whose output the op's takes over.
    pub fn last(&self) -> NodeId {
        *self.nodes().last().expect("a match holds its convolution")
    }
}

impl Match for ConvMatch {
    fn nodes(&self) -> Vec<NodeId> {
        [
            Some(self.conv.node),
            self.bn.as_ref().map(|b| b.node),
            self.add.map(|a| a.0),
            self.act.map(|a| a.0),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The convolution rule.
pub struct ConvRule;

impl Rule for ConvRule {
    fn name(&self) -> &'static str {
        "conv2d"
    }
    fn kind(&self) -> PatternKind {
        CONV
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_convs(g))
    }
}

/// Every chain of every matching convolution of the top-level block, each prefix its own match,
/// its layouts (`x_from`, `out_nchw`) as they would be were every chain a kernel takes
/// substituted (the plan's view; compose's edit decides them again over the chains it
/// substitutes, `with_layout`).
pub fn match_convs(g: &Graph) -> Vec<ConvMatch> {
    let readers = g.readers();
    let mut all: Vec<ConvMatch> = conv_nodes(g)
        .filter_map(|n| conv_call(g, n).ok())
        .flat_map(|(call, problem)| chains(g, &readers, call, problem))
        .collect();
    let subs = substituted(all.iter().filter(|m| kernels_take(&m.problem)));
    for m in &mut all {
        with_layout(g, &readers, &subs, m);
    }
    all
}

/// The nodes of `matches`, each mapped to its convolution (layout.rs's `Substituted`).
pub fn substituted<'a>(matches: impl Iterator<Item = &'a ConvMatch>) -> Substituted {
    let mut out = Substituted::new();
    for m in matches {
        for n in m.nodes() {
            out.insert(n, m.conv.node);
        }
    }
    out
}

/// Sets where `m`'s x comes from and whether its output goes back to NCHW, were `subs`
/// substituted.
pub fn with_layout(g: &Graph, readers: &[Vec<NodeId>], subs: &Substituted, m: &mut ConvMatch) {
    m.x_from = x_source(g, readers, subs, m.conv.x);
    m.out_nchw = nchw_reader(g, readers, subs, g.nodes[m.last()].outputs[0]);
}

/// The top-level convolution nodes, matched or not.
pub fn conv_nodes(g: &Graph) -> impl Iterator<Item = NodeId> + '_ {
    (0..g.nodes.len()).filter(|&n| {
        g.nodes[n].depth == 0
            && matches!(
                g.nodes[n].kind.as_str(),
                "aten::_convolution" | "aten::conv2d"
            )
    })
}

/// Every convolution node outside `matched` with the reason its rule left it to torch.
pub fn refusals(g: &Graph, matched: &std::collections::BTreeSet<NodeId>) -> Vec<(NodeId, String)> {
    conv_nodes(g)
        .filter(|n| !matched.contains(n))
        .filter_map(|n| conv_call(g, n).err().map(|why| (n, why)))
        .collect()
}

/// A 2-D argument: two ints, or one for both dims (as `conv2d` expands it).
fn pair(g: &Graph, v: ValueId) -> Option<[i64; 2]> {
    match *g.int_list(v)?.as_slice() {
        [a] => Some([a, a]),
        [a, b] => Some([a, b]),
        _ => None,
    }
}

fn is_none(g: &Graph, v: ValueId) -> bool {
    matches!(g.constant(v), Some(Const::None))
}

/// A per-channel parameter of `k` elements in `dtype`, read from the module: Ok(None) for the
/// None constant, an error naming `what` otherwise.
fn channel_param(
    g: &Graph,
    v: ValueId,
    k: i64,
    dtype: &str,
    what: &str,
) -> Result<Option<ValueId>, String> {
    if is_none(g, v) {
        return Ok(None);
    }
    let t = g
        .tensor(v)
        .ok_or_else(|| format!("its {what} has no known shape"))?;
    if t.shape != [k] || t.dtype != dtype {
        return Err(format!(
            "its {what} is {}{:?}, not {dtype}[{k}]",
            t.dtype, t.shape
        ));
    }
    if !g.is_attribute(v) {
        return Err(format!(
            "its {what} is computed by the graph, not a module parameter that compose can fold"
        ));
    }
    Ok(Some(v))
}

/// The convolution at `n` as the rule reads it, or why it stays torch's.
pub fn conv_call(g: &Graph, n: NodeId) -> Result<(ConvCall, ConvProblem), String> {
    let node = &g.nodes[n];
    let i = &node.inputs;
    // (x, w, b, stride, padding, dilation, transposed, output_padding, groups, ...) or
    // conv2d's (x, w, b, stride, padding, dilation, groups).
    let groups_at = match (node.kind.as_str(), i.len()) {
        ("aten::_convolution", 12 | 13) => {
            if g.constant(i[6]) != Some(&Const::Bool(false)) {
                return Err("a transposed convolution (no fprop kernel computes it)".into());
            }
            8
        }
        ("aten::conv2d", 7) => 6,
        (kind, len) => {
            return Err(format!(
                "{kind} with {len} operands is no form the rule reads"
            ))
        }
    };
    if node.outputs.len() != 1 {
        return Err("a convolution with several outputs".into());
    }
    let (x, w) = (i[0], i[1]);
    let (Some(tx), Some(tw), Some(ty)) = (g.tensor(x), g.tensor(w), g.tensor(node.outputs[0]))
    else {
        return Err("its input, weight or output has no known shape".into());
    };
    if tx.shape.len() != 4 || tw.shape.len() != 4 || ty.shape.len() != 4 {
        return Err(format!(
            "a convolution over {}-D input (only 2-D convolutions of [N,C,H,W] match)",
            tx.shape.len()
        ));
    }
    let dtype = DType::parse(&tx.dtype)
        .ok_or_else(|| format!("its input is {}, not f32, bf16 or f16", tx.dtype))?;
    if tw.dtype != tx.dtype || ty.dtype != tx.dtype {
        return Err(format!(
            "its weight ({}) or output ({}) is not its input's dtype ({})",
            tw.dtype, ty.dtype, tx.dtype
        ));
    }
    let Some(groups) = g.constant(i[groups_at]).and_then(Const::as_int) else {
        return Err("its groups is not a constant".into());
    };
    let (Some(stride), Some(dilation)) = (pair(g, i[3]), pair(g, i[5])) else {
        return Err("its stride or dilation is not a constant pair".into());
    };
    let Some(padding) = pair(g, i[4]) else {
        return Err(match g.constant(i[4]) {
            Some(Const::Str(s)) => format!("padding='{s}' (only integer padding matches)"),
            _ => "its padding is not a constant pair".into(),
        });
    };
    let depthwise = groups == tx.shape[1] && groups == tw.shape[0] && tw.shape[1] == 1;
    if groups != 1 && !depthwise {
        return Err(format!(
            "groups = {groups} of C = {}: a grouped convolution (1 < groups < C) stays torch's (CUTLASS's sm90 conv builder computes groups of 1; its sm80 grouped kernels are not measured against cuDNN; depthwise ones, groups = C = K, are a pattern)",
            tx.shape[1]
        ));
    }
    if !g.is_attribute(w) {
        return Err(
            "its weight is computed by the graph, not a module parameter that compose can fold"
                .into(),
        );
    }
    let [k, c, r, s] = tw.shape[..] else {
        unreachable!("a 4-D weight")
    };
    let bias = channel_param(g, i[2], k, &tx.dtype, "bias")?;
    let problem = ConvProblem {
        images: tx.shape[0],
        height: tx.shape[2],
        width: tx.shape[3],
        in_channels: tx.shape[1],
        out_channels: k,
        filter: [r, s],
        stride,
        padding,
        dilation,
        groups,
        dtype,
        bias: bias.is_some(),
        residual: false,
        act: None,
    };
    problem.check()?;
    let [p, q] = problem.output();
    if c * groups != tx.shape[1] || ty.shape != [tx.shape[0], k, p, q] {
        return Err(format!(
            "its shapes (x {:?}, w {:?}, y {:?}) are not those of the convolution its arguments describe",
            tx.shape, tw.shape, ty.shape
        ));
    }
    let call = ConvCall {
        node: n,
        x,
        weight: w,
        bias,
        stride: i[3],
        padding: i[4],
        dilation: i[5],
        groups: i[groups_at],
    };
    Ok((call, problem))
}

/// The node reading `v` alone (the graph not returning it), if there is one.
fn sole_reader(g: &Graph, readers: &[Vec<NodeId>], v: ValueId) -> Option<NodeId> {
    match *readers[v].as_slice() {
        [r] if !g.outputs.contains(&v) && g.nodes[r].depth == 0 => Some(r),
        _ => None,
    }
}

/// An eval-mode BatchNorm at `n` over `y` with `k` channels of `dtype`.
fn batch_norm(g: &Graph, n: NodeId, y: ValueId, k: i64, dtype: &str) -> Option<BatchNorm> {
    let node = &g.nodes[n];
    let i = &node.inputs;
    if node.kind != "aten::batch_norm" || i.len() != 9 || i[0] != y || node.outputs.len() != 1 {
        return None;
    }
    if g.constant(i[5]) != Some(&Const::Bool(false)) {
        return None;
    }
    let param = |v| channel_param(g, v, k, dtype, "BatchNorm parameter").ok();
    let (weight, bias) = (param(i[1])?, param(i[2])?);
    // The running statistics are there in eval mode, always: None would be a training-mode call.
    let (mean, var) = (param(i[3])??, param(i[4])??);
    g.constant(i[7]).and_then(Const::as_f64)?;
    Some(BatchNorm {
        node: n,
        weight,
        bias,
        mean,
        var,
        eps: i[7],
    })
}

/// A residual add at `n` of `y` and another tensor of its shape and dtype: (the tensor).
fn residual_add(g: &Graph, readers: &[Vec<NodeId>], n: NodeId, y: ValueId) -> Option<ValueId> {
    let node = &g.nodes[n];
    let i = &node.inputs;
    let in_place = match node.kind.as_str() {
        "aten::add" => false,
        "aten::add_" => true,
        _ => return None,
    };
    if i.len() != 3
        || node.outputs.len() != 1
        || g.constant(i[2]).and_then(Const::as_f64) != Some(1.0)
    {
        return None;
    }
    let other = match (i[0] == y, i[1] == y) {
        (true, false) => i[1],
        (false, true) => i[0],
        _ => return None,
    };
    let (ty, tr) = (g.tensor(y)?, g.tensor(other)?);
    if tr.shape != ty.shape || tr.dtype != ty.dtype {
        return None;
    }
    // add_(residual, y) writes into the residual: the op returns a new tensor instead, which
    // only the add itself may see the difference of.
    if in_place && i[0] == other {
        let fresh = g.values[other]
            .producer
            .is_some_and(|p| views::pass(g, p).is_none());
        if !fresh || sole_reader(g, readers, other) != Some(n) {
            return None;
        }
    }
    Some(other)
}

/// The activation at `n` of `y`, if it is one the epilogue computes.
fn activation(g: &Graph, n: NodeId, y: ValueId) -> Option<ConvAct> {
    let node = &g.nodes[n];
    if node.inputs.first() != Some(&y) || node.outputs.len() != 1 {
        return None;
    }
    let kind = node.kind.strip_prefix("aten::")?;
    Some(match kind.strip_suffix('_').unwrap_or(kind) {
        "relu" => ConvAct::Relu,
        "silu" => ConvAct::Silu,
        "hardswish" => ConvAct::Hardswish,
        "sigmoid" => ConvAct::Sigmoid,
        "hardsigmoid" => ConvAct::Hardsigmoid,
        // torch's ReLU6 module is hardtanh(x, 0, 6).
        "relu6" if node.inputs.len() == 1 => ConvAct::Relu6,
        "hardtanh" | "clamp"
            if node.inputs.len() == 3
                && node.inputs[1..]
                    .iter()
                    .map(|&v| g.constant(v).and_then(Const::as_f64))
                    .eq([Some(0.0), Some(6.0)]) =>
        {
            ConvAct::Relu6
        }
        "gelu" => match node.inputs.get(1).map(|&a| g.constant(a)) {
            None => ConvAct::Gelu,
            Some(Some(Const::Str(s))) if s == "none" => ConvAct::Gelu,
            Some(Some(Const::Str(s))) if s == "tanh" => ConvAct::GeluTanh,
            _ => return None,
        },
        _ => return None,
    })
}

/// The chain after the convolution, each prefix a match.
fn chains(
    g: &Graph,
    readers: &[Vec<NodeId>],
    conv: ConvCall,
    problem: ConvProblem,
) -> Vec<ConvMatch> {
    let dtype = g
        .tensor(conv.x)
        .expect("a matched convolution's input")
        .dtype
        .clone();
    let mut at = ConvMatch {
        conv,
        bn: None,
        add: None,
        act: None,
        problem,
        x_from: Source::Nchw(String::new()),
        out_nchw: None,
    };
    let mut y = g.nodes[at.conv.node].outputs[0];
    let mut out = vec![at.clone()];
    let next = |y: ValueId| sole_reader(g, readers, y);
    if let Some(bn) = next(y).and_then(|n| batch_norm(g, n, y, at.problem.out_channels, &dtype)) {
        y = g.nodes[bn.node].outputs[0];
        at.bn = Some(bn);
        at.problem.bias = true;
        out.push(at.clone());
    }
    if let Some(n) = next(y) {
        if let Some(r) = residual_add(g, readers, n, y) {
            y = g.nodes[n].outputs[0];
            at.add = Some((n, r));
            at.problem.residual = true;
            out.push(at.clone());
        }
    }
    if let Some(n) = next(y) {
        if let Some(a) = activation(g, n, y) {
            at.act = Some((n, a));
            at.problem.act = Some(a);
            out.push(at);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torchvision's resnet50 as torch.jit.trace records it (torchvision 0.26, torch 2.11, f32,
    /// 1x3x224x224): the stem and the first bottleneck, whose downsample branch the trace
    /// computes after conv3's BatchNorm and adds in place (`out += identity`). The module
    /// attributes are trimmed to those the nodes read; constants are the trace's.
    const RESNET50: &str = "graph(%self.1: ResNet, %x.2: f32[1,3,224,224]):
       %25 = prim::Constant[0]()
       %26 = prim::Constant[1]()
       %27 = prim::Constant[3]()
       %28 = prim::Constant[2]()
       %29 = prim::Constant[None]()
       %30 = prim::Constant[False]()
       %31 = prim::Constant[True]()
       %38 = prim::Constant[1e-05]()
       %39 = prim::Constant[0.1]()
       %layer1.1 = prim::GetAttr[name=\"layer1\"](%self.1) : Sequential
       %bn1.3 = prim::GetAttr[name=\"bn1\"](%self.1) : BatchNorm2d
       %conv1.3 = prim::GetAttr[name=\"conv1\"](%self.1) : Conv2d
       %weight.16 = prim::GetAttr[name=\"weight\"](%conv1.3) : f32[64,3,7,7]
       %33 = prim::ListConstruct(%28, %28) : List_int_
       %34 = prim::ListConstruct(%27, %27) : List_int_
       %35 = prim::ListConstruct(%26, %26) : List_int_
       %36 = prim::ListConstruct(%25, %25) : List_int_
       %input.14 = aten::_convolution(%x.2, %weight.16, %29, %33, %34, %35, %30, %36, %26, %30, %30, %31, %31) : f32[1,64,112,112]
       %running_var.8 = prim::GetAttr[name=\"running_var\"](%bn1.3) : f32[64]
       %running_mean.8 = prim::GetAttr[name=\"running_mean\"](%bn1.3) : f32[64]
       %bias.8 = prim::GetAttr[name=\"bias\"](%bn1.3) : f32[64]
       %weight.18 = prim::GetAttr[name=\"weight\"](%bn1.3) : f32[64]
       %input.16 = aten::batch_norm(%input.14, %weight.18, %bias.8, %running_mean.8, %running_var.8, %30, %39, %38, %31) : f32[1,64,112,112]
       %47 = aten::relu_(%input.16) : f32[1,64,112,112]
       %52 = prim::ListConstruct(%27, %27) : List_int_
       %53 = prim::ListConstruct(%28, %28) : List_int_
       %54 = prim::ListConstruct(%26, %26) : List_int_
       %input.18 = aten::max_pool2d(%47, %52, %53, %54, %54, %30) : f32[1,64,56,56]
       %_0.2 = prim::GetAttr[name=\"0\"](%layer1.1) : Bottleneck
       %downsample.2 = prim::GetAttr[name=\"downsample\"](%_0.2) : Sequential
       %bn3.3 = prim::GetAttr[name=\"bn3\"](%_0.2) : BatchNorm2d
       %conv3.3 = prim::GetAttr[name=\"conv3\"](%_0.2) : Conv2d
       %bn2.3 = prim::GetAttr[name=\"bn2\"](%_0.2) : BatchNorm2d
       %conv2.3 = prim::GetAttr[name=\"conv2\"](%_0.2) : Conv2d
       %bn1.5 = prim::GetAttr[name=\"bn1\"](%_0.2) : BatchNorm2d
       %conv1.5 = prim::GetAttr[name=\"conv1\"](%_0.2) : Conv2d
       %weight.20 = prim::GetAttr[name=\"weight\"](%conv1.5) : f32[64,64,1,1]
       %76 = prim::ListConstruct(%26, %26) : List_int_
       %77 = prim::ListConstruct(%25, %25) : List_int_
       %input.22 = aten::_convolution(%input.18, %weight.20, %29, %76, %77, %76, %30, %77, %26, %30, %30, %31, %31) : f32[1,64,56,56]
       %running_var.10 = prim::GetAttr[name=\"running_var\"](%bn1.5) : f32[64]
       %running_mean.10 = prim::GetAttr[name=\"running_mean\"](%bn1.5) : f32[64]
       %bias.10 = prim::GetAttr[name=\"bias\"](%bn1.5) : f32[64]
       %weight.22 = prim::GetAttr[name=\"weight\"](%bn1.5) : f32[64]
       %input.24 = aten::batch_norm(%input.22, %weight.22, %bias.10, %running_mean.10, %running_var.10, %30, %39, %38, %31) : f32[1,64,56,56]
       %86 = aten::relu_(%input.24) : f32[1,64,56,56]
       %weight.24 = prim::GetAttr[name=\"weight\"](%conv2.3) : f32[64,64,3,3]
       %88 = prim::ListConstruct(%26, %26) : List_int_
       %91 = prim::ListConstruct(%25, %25) : List_int_
       %input.26 = aten::_convolution(%86, %weight.24, %29, %88, %88, %88, %30, %91, %26, %30, %30, %31, %31) : f32[1,64,56,56]
       %running_var.12 = prim::GetAttr[name=\"running_var\"](%bn2.3) : f32[64]
       %running_mean.12 = prim::GetAttr[name=\"running_mean\"](%bn2.3) : f32[64]
       %bias.12 = prim::GetAttr[name=\"bias\"](%bn2.3) : f32[64]
       %weight.26 = prim::GetAttr[name=\"weight\"](%bn2.3) : f32[64]
       %input.28 = aten::batch_norm(%input.26, %weight.26, %bias.12, %running_mean.12, %running_var.12, %30, %39, %38, %31) : f32[1,64,56,56]
       %98 = aten::relu_(%input.28) : f32[1,64,56,56]
       %weight.28 = prim::GetAttr[name=\"weight\"](%conv3.3) : f32[256,64,1,1]
       %100 = prim::ListConstruct(%26, %26) : List_int_
       %101 = prim::ListConstruct(%25, %25) : List_int_
       %input.30 = aten::_convolution(%98, %weight.28, %29, %100, %101, %100, %30, %101, %26, %30, %30, %31, %31) : f32[1,256,56,56]
       %running_var.14 = prim::GetAttr[name=\"running_var\"](%bn3.3) : f32[256]
       %running_mean.14 = prim::GetAttr[name=\"running_mean\"](%bn3.3) : f32[256]
       %bias.14 = prim::GetAttr[name=\"bias\"](%bn3.3) : f32[256]
       %weight.30 = prim::GetAttr[name=\"weight\"](%bn3.3) : f32[256]
       %out.3 = aten::batch_norm(%input.30, %weight.30, %bias.14, %running_mean.14, %running_var.14, %30, %39, %38, %31) : f32[1,256,56,56]
       %_1.4 = prim::GetAttr[name=\"1\"](%downsample.2) : BatchNorm2d
       %_0.4 = prim::GetAttr[name=\"0\"](%downsample.2) : Conv2d
       %weight.32 = prim::GetAttr[name=\"weight\"](%_0.4) : f32[256,64,1,1]
       %113 = prim::ListConstruct(%26, %26) : List_int_
       %114 = prim::ListConstruct(%25, %25) : List_int_
       %input.32 = aten::_convolution(%input.18, %weight.32, %29, %113, %114, %113, %30, %114, %26, %30, %30, %31, %31) : f32[1,256,56,56]
       %running_var.16 = prim::GetAttr[name=\"running_var\"](%_1.4) : f32[256]
       %running_mean.16 = prim::GetAttr[name=\"running_mean\"](%_1.4) : f32[256]
       %bias.16 = prim::GetAttr[name=\"bias\"](%_1.4) : f32[256]
       %weight.34 = prim::GetAttr[name=\"weight\"](%_1.4) : f32[256]
       %identity.2 = aten::batch_norm(%input.32, %weight.34, %bias.16, %running_mean.16, %running_var.16, %30, %39, %38, %31) : f32[1,256,56,56]
       %input.34 = aten::add_(%out.3, %identity.2, %26) : f32[1,256,56,56]
       %124 = aten::relu_(%input.34) : f32[1,256,56,56]
       return (%124)";

    fn node(g: &Graph, name: &str) -> NodeId {
        let v = g.values.iter().position(|v| v.name == name).unwrap();
        g.values[v].producer.unwrap()
    }

    fn value(g: &Graph, name: &str) -> ValueId {
        g.values.iter().position(|v| v.name == name).unwrap()
    }

    /// The cover's convolution patterns of `g`, by their first node's output name.
    fn covered(g: &Graph) -> Vec<ConvMatch> {
        crate::kinds::match_kinds(g, &[&super::super::Conv])
            .of::<ConvMatch>()
            .into_iter()
            .cloned()
            .collect()
    }

    #[test]
    fn resnet50s_stem_and_bottleneck_are_five_chains_with_one_residual_add() {
        let g = Graph::parse(RESNET50).unwrap();
        let found = covered(&g);
        let ids: Vec<(String, String)> = found
            .iter()
            .map(|m| (m.problem.rule_id(), m.problem.shape_key()))
            .collect();
        let s = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(
            ids,
            vec![
                s("conv2d_s2_p3_d1_bias_relu", "1x224x224x3x64x7x7"),
                s("conv2d_s1_p0_d1_bias_relu", "1x56x56x64x64x1x1"),
                s("conv2d_s1_p1_d1_bias_relu", "1x56x56x64x64x3x3"),
                s("conv2d_s1_p0_d1_bias_add_relu", "1x56x56x64x256x1x1"),
                s("conv2d_s1_p0_d1_bias", "1x56x56x64x256x1x1"),
            ],
            "{found:#?}"
        );
        // conv3 takes the in-place add (its BatchNorm is add_'s self) with the downsample's
        // output as the residual; the downsample keeps its convolution and BatchNorm.
        let conv3 = &found[3];
        assert_eq!(conv3.conv.node, node(&g, "input.30"));
        assert_eq!(
            conv3.add,
            Some((node(&g, "input.34"), value(&g, "identity.2")))
        );
        assert_eq!(conv3.act, Some((node(&g, "124"), ConvAct::Relu)));
        let bn = conv3.bn.as_ref().unwrap();
        assert_eq!(
            (bn.mean, bn.var, bn.eps),
            (
                value(&g, "running_mean.14"),
                value(&g, "running_var.14"),
                value(&g, "38")
            )
        );
        assert_eq!(found[4].conv.node, node(&g, "input.32"));
        assert_eq!(
            found[4].nodes(),
            vec![node(&g, "input.32"), node(&g, "identity.2")]
        );
        // The stem's ReLU is read by max_pool2d, which stays torch's: the pool ends one chain,
        // and the next starts after it.
        assert_eq!(found[0].last(), node(&g, "47"));
        assert!(found
            .iter()
            .all(|m| !m.nodes().contains(&node(&g, "input.18"))));
        assert_eq!(found[1].conv.x, value(&g, "input.18"));
        // The stem's 3 channels are padded to fp32's 16-byte rows, so it runs a kernel too and
        // both of the pool's readers read its channels-last output in place.
        assert!(found[0].problem.padded() && kernels_take(&found[0].problem));
        let stem = Source::Chain(node(&g, "input.14"));
        assert_eq!((&found[1].x_from, &found[4].x_from), (&stem, &stem));
    }

    #[test]
    fn the_downsample_may_take_the_add_but_not_write_into_a_residual_others_read() {
        let g = Graph::parse(RESNET50).unwrap();
        let all = match_convs(&g);
        // The downsample's chain may end in add_(out, identity) too: the op's new tensor is
        // what add_ returns, and nothing else reads `out`.
        let down: Vec<_> = all
            .iter()
            .filter(|m| m.conv.node == node(&g, "input.32"))
            .collect();
        assert_eq!(down.len(), 4, "conv, + bn, + add, + relu");
        assert_eq!(down[2].add.unwrap().1, value(&g, "out.3"));
        // Where `out` is read elsewhere too (here: returned), writing into it is visible.
        let returned = RESNET50.replace("return (%124)", "return (%124, %out.3)");
        let g = Graph::parse(&returned).unwrap();
        let down: Vec<_> = match_convs(&g)
            .into_iter()
            .filter(|m| m.conv.node == node(&g, "input.32"))
            .collect();
        assert_eq!(down.len(), 2, "{down:#?}");
        assert!(down.iter().all(|m| m.add.is_none()));
    }

    /// One convolution `conv` (its operand list after x and w) into `rest`, on bf16 parameters.
    fn graph(conv: &str, rest: &str, ret: &str) -> Graph {
        Graph::parse(&format!(
            "graph(%self: M, %x: bf16[8,32,16,16], %r: bf16[8,64,16,16], %wx: bf16[64,32,3,3]):
               %none = prim::Constant[None]()
               %f = prim::Constant[False]()
               %t = prim::Constant[True]()
               %one = prim::Constant[1]()
               %two = prim::Constant[2]()
               %zero = prim::Constant[0]()
               %eps = prim::Constant[1e-05]()
               %mom = prim::Constant[0.1]()
               %tanh = prim::Constant[\"tanh\"]()
               %same = prim::Constant[\"same\"]()
               %z0 = prim::Constant[0.0]()
               %six = prim::Constant[6.0]()
               %m1 = prim::Constant[-1.0]()
               %l1 = prim::ListConstruct(%one, %one) : List_int_
               %l0 = prim::ListConstruct(%zero, %zero) : List_int_
               %m = prim::GetAttr[name=\"m\"](%self) : Block
               %w = prim::GetAttr[name=\"w\"](%m) : bf16[64,32,3,3]
               %wg = prim::GetAttr[name=\"wg\"](%m) : bf16[64,16,3,3]
               %b = prim::GetAttr[name=\"b\"](%m) : bf16[64]
               %g = prim::GetAttr[name=\"g\"](%m) : bf16[64]
               %be = prim::GetAttr[name=\"be\"](%m) : bf16[64]
               %mu = prim::GetAttr[name=\"mu\"](%m) : bf16[64]
               %var = prim::GetAttr[name=\"var\"](%m) : bf16[64]
               %y = {conv} : bf16[8,64,16,16]
               {rest}
               return ({ret})"
        ))
        .unwrap()
    }

    const CONV: &str =
        "aten::_convolution(%x, %w, %none, %l1, %l1, %l1, %f, %l0, %one, %f, %f, %t, %t)";
    const BN: &str =
        "%n = aten::batch_norm(%y, %g, %be, %mu, %var, %f, %mom, %eps, %t) : bf16[8,64,16,16]";

    /// The longest chain found at the convolution of `g`.
    fn longest(g: &Graph) -> ConvMatch {
        match_convs(g).into_iter().last().expect("a match")
    }

    #[test]
    fn conv2d_with_bias_then_an_activation_matches_without_a_batchnorm() {
        for (act, want) in [
            ("aten::silu(%y)", ConvAct::Silu),
            ("aten::hardswish_(%y)", ConvAct::Hardswish),
            ("aten::gelu(%y, %tanh)", ConvAct::GeluTanh),
            ("aten::gelu(%y)", ConvAct::Gelu),
            ("aten::relu(%y)", ConvAct::Relu),
            // ReLU6 as nn.ReLU6(inplace=True), F.relu6 and a clamp write it.
            ("aten::hardtanh_(%y, %z0, %six)", ConvAct::Relu6),
            ("aten::hardtanh(%y, %z0, %six)", ConvAct::Relu6),
            ("aten::clamp(%y, %z0, %six)", ConvAct::Relu6),
            ("aten::relu6(%y)", ConvAct::Relu6),
            // Squeeze-excitation's gates.
            ("aten::sigmoid(%y)", ConvAct::Sigmoid),
            ("aten::hardsigmoid_(%y)", ConvAct::Hardsigmoid),
        ] {
            let g = graph(
                "aten::conv2d(%x, %w, %b, %l1, %l1, %l1, %one)",
                &format!("%a = {act} : bf16[8,64,16,16]"),
                "%a",
            );
            let m = longest(&g);
            assert_eq!(m.act.map(|a| a.1), Some(want), "{act}");
            assert_eq!(m.conv.bias, Some(value(&g, "b")));
            assert!(m.bn.is_none());
            assert_eq!(
                m.problem.rule_id(),
                format!("conv2d_s1_p1_d1_bias_{}", want.name())
            );
            assert_eq!(m.problem.dtype, DType::Bf16);
        }
    }

    #[test]
    fn a_hardtanh_other_than_relu6_is_no_activation() {
        for act in [
            "aten::hardtanh(%y, %m1, %six)",
            "aten::clamp(%y, %z0, %none)",
        ] {
            let g = graph(
                "aten::conv2d(%x, %w, %b, %l1, %l1, %l1, %one)",
                &format!("%a = {act} : bf16[8,64,16,16]"),
                "%a",
            );
            assert_eq!(longest(&g).act, None, "{act}");
        }
    }

    #[test]
    fn the_residual_add_joins_in_either_order_before_the_activation() {
        for add in [
            "aten::add(%n, %r, %one)",
            "aten::add(%r, %n, %one)",
            "aten::add_(%n, %r, %one)",
        ] {
            let g = graph(
                CONV,
                &format!("{BN}\n %s = {add} : bf16[8,64,16,16]\n %a = aten::relu_(%s) : bf16[8,64,16,16]"),
                "%a",
            );
            let m = longest(&g);
            assert_eq!(m.add.map(|a| a.1), Some(value(&g, "r")), "{add}");
            assert_eq!(m.problem.rule_id(), "conv2d_s1_p1_d1_bias_add_relu");
            assert_eq!(m.nodes().len(), 4);
        }
        // alpha 2 is no residual add; add_ into the graph's input is a write the caller sees.
        for add in ["aten::add(%n, %r, %two)", "aten::add_(%r, %n, %one)"] {
            let g = graph(CONV, &format!("{BN}\n %s = {add} : bf16[8,64,16,16]"), "%s");
            assert!(longest(&g).add.is_none(), "{add}");
        }
    }

    #[test]
    fn a_training_batchnorm_or_one_read_elsewhere_ends_the_chain() {
        let training = BN.replace("%f, %mom", "%t, %mom");
        let g = graph(
            CONV,
            &format!("{training}\n %a = aten::relu(%n) : bf16[8,64,16,16]"),
            "%a",
        );
        let m = longest(&g);
        assert!(m.bn.is_none() && m.act.is_none(), "{m:#?}");
        assert_eq!(m.problem.rule_id(), "conv2d_s1_p1_d1");
        // The BatchNorm's output also returned: the chain ends with the BatchNorm.
        let g = graph(
            CONV,
            &format!("{BN}\n %a = aten::relu(%n) : bf16[8,64,16,16]"),
            "%a, %n",
        );
        let m = longest(&g);
        assert_eq!(m.bn.as_ref().map(|b| b.node), Some(node(&g, "n")));
        assert!(m.act.is_none());
        // Running statistics the graph computes are not the module's constants.
        let computed = BN.replace("%mu,", "%b2,");
        let g = graph(
            CONV,
            &format!("%b2 = aten::mul(%mu, %two) : bf16[64]\n {computed}"),
            "%n",
        );
        assert!(longest(&g).bn.is_none());
    }

    #[test]
    fn grouped_transposed_and_computed_weight_convolutions_stay_torch_with_the_reason() {
        let cases = [
            (
                "aten::_convolution(%x, %wg, %none, %l1, %l1, %l1, %f, %l0, %two, %f, %f, %t, %t)",
                "groups = 2",
            ),
            (
                "aten::_convolution(%x, %w, %none, %l1, %l1, %l1, %t, %l0, %one, %f, %f, %t, %t)",
                "transposed",
            ),
            (
                "aten::conv2d(%x, %w, %b, %l1, %same, %l1, %one)",
                "padding='same'",
            ),
            (
                "aten::conv2d(%x, %wx, %b, %l1, %l1, %l1, %one)",
                "weight is computed",
            ),
        ];
        for (conv, why) in cases {
            let g = graph(conv, "", "%y");
            assert!(match_convs(&g).is_empty(), "{conv}");
            let refused = refusals(&g, &Default::default());
            assert_eq!(refused.len(), 1);
            assert_eq!(refused[0].0, node(&g, "y"));
            assert!(refused[0].1.contains(why), "{}", refused[0].1);
        }
        let g = graph(CONV, "", "%y");
        let matched = match_convs(&g)[0].nodes().into_iter().collect();
        assert!(refusals(&g, &matched).is_empty());
    }

    /// mobilenet_v3_large's depthwise convolutions as `fact graph` prints the zoo fixture's
    /// (features.7: 3x3 stride 2 on 240 channels, BatchNorm (eps 0.001, momentum 0.01),
    /// hardswish_; features.4: 5x5 stride 2 on 72 channels with ReLU), at batch 32 in bf16, and
    /// convnext_tiny's 7x7 with its own bias, read by a permute.
    const DEPTHWISE: &str = "graph(%self: M, %x: bf16[32,240,28,28], %x72: bf16[32,72,56,56], %xc: bf16[32,96,56,56]):
       %21 = prim::Constant[0]()
       %22 = prim::Constant[1]()
       %23 = prim::Constant[2]()
       %24 = prim::Constant[None]()
       %25 = prim::Constant[False]()
       %26 = prim::Constant[True]()
       %27 = prim::Constant[0.001]()
       %28 = prim::Constant[0.01]()
       %g240 = prim::Constant[240]()
       %g72 = prim::Constant[72]()
       %g96 = prim::Constant[96]()
       %g48 = prim::Constant[48]()
       %p3 = prim::Constant[3]()
       %b = prim::GetAttr[name=\"b\"](%self) : Block
       %weight.92 = prim::GetAttr[name=\"weight\"](%b) : bf16[240,1,3,3]
       %w72 = prim::GetAttr[name=\"w72\"](%b) : bf16[72,1,5,5]
       %wc = prim::GetAttr[name=\"wc\"](%b) : bf16[96,1,7,7]
       %bc = prim::GetAttr[name=\"bc\"](%b) : bf16[96]
       %wg = prim::GetAttr[name=\"wg\"](%b) : bf16[240,5,3,3]
       %running_var.43 = prim::GetAttr[name=\"running_var\"](%b) : bf16[240]
       %running_mean.43 = prim::GetAttr[name=\"running_mean\"](%b) : bf16[240]
       %bias.41 = prim::GetAttr[name=\"bias\"](%b) : bf16[240]
       %weight.94 = prim::GetAttr[name=\"weight\"](%b) : bf16[240]
       %s2 = prim::ListConstruct(%23, %23) : List_int_
       %p1 = prim::ListConstruct(%22, %22) : List_int_
       %d1 = prim::ListConstruct(%22, %22) : List_int_
       %op = prim::ListConstruct(%21, %21) : List_int_
       %pp2 = prim::ListConstruct(%23, %23) : List_int_
       %pp3 = prim::ListConstruct(%p3, %p3) : List_int_
       %input.101 = aten::_convolution(%x, %weight.92, %24, %s2, %p1, %d1, %25, %op, %g240, %25, %25, %26, %26) : bf16[32,240,14,14]
       %input.103 = aten::batch_norm(%input.101, %weight.94, %bias.41, %running_mean.43, %running_var.43, %25, %28, %27, %26) : bf16[32,240,14,14]
       %424 = aten::hardswish_(%input.103) : bf16[32,240,14,14]
       %y72 = aten::_convolution(%x72, %w72, %24, %s2, %pp2, %d1, %25, %op, %g72, %25, %25, %26, %26) : bf16[32,72,28,28]
       %r72 = aten::relu_(%y72) : bf16[32,72,28,28]
       %yc = aten::_convolution(%xc, %wc, %bc, %d1, %pp3, %d1, %25, %op, %g96, %25, %25, %26, %26) : bf16[32,96,56,56]
       %perm = prim::ListConstruct(%21, %23, %p3, %22) : List_int_
       %t = aten::permute(%yc, %perm) : bf16[32,56,56,96]
       %yg = aten::_convolution(%x, %wg, %24, %d1, %p1, %d1, %25, %op, %g48, %25, %25, %26, %26) : bf16[32,240,28,28]
       return (%424, %r72, %t, %yg)";

    #[test]
    fn depthwise_convolutions_are_problems_with_groups_in_the_key_and_grouped_ones_stay_torchs() {
        let g = Graph::parse(DEPTHWISE).unwrap();
        let all = match_convs(&g);
        let longest = |conv: &str| {
            all.iter()
                .rfind(|m| m.conv.node == node(&g, conv))
                .cloned()
                .unwrap_or_else(|| panic!("{conv} matches"))
        };
        // mobilenet's 3x3 s2: the BatchNorm folds per channel and the hardswish joins.
        let m = longest("input.101");
        assert_eq!(m.problem.rule_id(), "conv2d_s2_p1_d1_g240_bias_hardswish");
        assert_eq!(m.problem.shape_key(), "32x28x28x240x240x3x3");
        assert!(m.bn.is_some() && m.act.map(|a| a.1) == Some(ConvAct::Hardswish));
        assert!(super::super::is_depthwise(&m.problem) && kernels_take(&m.problem));
        // The 5x5 on 72 channels is a problem too, but no depthwise CTA's channels divide 72:
        // the plan says so, and the kernels take none of it.
        let m72 = longest("y72");
        assert_eq!(m72.problem.rule_id(), "conv2d_s2_p2_d1_g72_relu");
        assert!(!kernels_take(&m72.problem));
        let why = super::super::refusal(&m72.problem, crate::types::MathType::Bf16).unwrap();
        assert!(why.contains("multiple of 16"), "{why}");
        // convnext's 7x7 with its own bias; the permute after it is no epilogue op.
        let c = longest("yc");
        assert_eq!(c.problem.rule_id(), "conv2d_s1_p3_d1_g96_bias");
        assert_eq!(c.problem.shape_key(), "32x56x56x96x96x7x7");
        assert_eq!(c.conv.bias, Some(value(&g, "bc")));
        assert!(kernels_take(&c.problem));
        // groups = 48 of 240 channels (5 a group) is grouped, not depthwise: torch's.
        let refused = refusals(&g, &Default::default());
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].0, node(&g, "yg"));
        assert!(
            refused[0]
                .1
                .contains("groups = 48 of C = 240: a grouped convolution"),
            "{}",
            refused[0].1
        );
    }
}
