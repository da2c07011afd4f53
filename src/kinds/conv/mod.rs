//! 2-D convolutions, one kind: `aten::_convolution` / `aten::conv2d` forward with the eval-mode
//! BatchNorm, residual add and activation after it (rule.rs), as an implicit GEMM (problem.rs:
//! M = N·P·Q, N = K, K = C·R·S) over channels-last tensors. Its kernels (spec.rs, render.rs:
//! CUTLASS's sm90 conv collective builder and sm80 `ImplicitGemmConvolution`, bias, residual and
//! activation in the epilogue; for depthwise problems, groups = C = K, CUTLASS's SIMT direct
//! convolution with bias and activation) are judged against cuDNN on the same function (bench.rs). The op,
//! `fact::conv(x, weight, bias?, stride, padding, dilation, groups, bn_weight?, bn_bias?, bn_mean?,
//! bn_var?, residual?, w_kernel, b_kernel?, form, kernel)`, runs the kernel on the weight and bias
//! compose folds the BatchNorm into once (module buffers, the weight channels-last), and falls
//! back to the replaced ops on the module's own parameters. Outputs stay channels-last from one
//! convolution to the next (layout.rs): a chain converts where it starts and where a reader needs
//! NCHW. This file is the kind as the stages see it (`Conv`), with its plan notes and its edit.

mod bench;
mod layout;
mod problem;
mod render;
mod rule;
mod spec;

pub use bench::{channels_last, ConvBench, Inputs};
pub use layout::{nchw_reader, x_source, Source, Substituted};
pub use problem::{ConvAct, ConvProblem};
pub use render::{op_code, render, signature};
pub use rule::{
    conv_call, conv_nodes, match_convs, refusals, substituted, with_layout, BatchNorm, ConvCall,
    ConvMatch, ConvRule,
};
pub use spec::{
    candidates, estimate, is_depthwise, is_pointwise, kernels_take, refusal, ConvSpec, Depthwise,
    GemmSchedule,
};

use super::{Candidates, Dispatch, PlanFacts, Problem, Product, Spec, TypedKind};
use super::{SweepCx, Unit, Work};
use crate::codegen::{OpCode, OpDef, Source as Code};
use crate::graph::{Const, Edit, Fold, FoldBn, Graph, NodeId, Operand};
use crate::nvcc::library::KernelLibrary;
use crate::rules::{Match, PatternKind, Rule};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};
use std::collections::BTreeSet;

/// What users call convolution patterns (`FACT_DISABLE=conv`).
pub const CONV: PatternKind = PatternKind::new("conv");

/// The schema of the convolution op: the graph's operands (which the fallback replays), the
/// folded weight and bias the kernel reads, what the call replaced and the kernel.
pub const CONV_OP_SCHEMA: &str = "conv(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, Tensor? bn_weight, Tensor? bn_bias, Tensor? bn_mean, Tensor? bn_var, Tensor? residual, Tensor w_kernel, Tensor? b_kernel, str form, str kernel) -> Tensor";

/// The convolution kind.
pub struct Conv;

impl From<ConvProblem> for Problem {
    fn from(p: ConvProblem) -> Problem {
        Problem::new(&Conv, p)
    }
}

impl From<ConvSpec> for Spec {
    fn from(s: ConvSpec) -> Spec {
        Spec::new(&Conv, s)
    }
}

impl TypedKind for Conv {
    type Match = ConvMatch;
    type Problem = ConvProblem;
    type Spec = ConvSpec;

    fn name(&self) -> &'static str {
        "conv"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[CONV]
    }
    fn letter(&self) -> char {
        'c'
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[&ConvRule]
    }
    fn problem_of(&self, m: &ConvMatch) -> ConvProblem {
        m.problem.clone()
    }
    fn node_of(&self, m: &ConvMatch) -> NodeId {
        m.conv.node
    }
    fn origin_of(&self, _m: &ConvMatch) -> &'static str {
        "convolution"
    }
    fn copies_of(&self, m: &ConvMatch) -> Vec<String> {
        copies(m)
    }
    fn plan_facts(&self, c: &ConvMatch, math: Option<MathType>, arch: Arch) -> PlanFacts {
        PlanFacts {
            name: name(c),
            origin: "convolution".into(),
            operands: [Some(c.conv.x), Some(c.conv.weight), c.add.map(|a| a.1)]
                .into_iter()
                .flatten()
                .collect(),
            notes: math.map(|m| notes(c, m, arch)).unwrap_or_default(),
            pad: None,
        }
    }
    /// The implicit GEMM, at the convolution node.
    fn products(&self, c: &ConvMatch) -> Vec<Product> {
        let (rows, cols, k) = c.problem.gemm();
        vec![Product {
            node: c.conv.node,
            flops: 2.0 * (rows * cols * c.problem.groups) as f64 * k as f64,
            k,
        }]
    }
    /// One kernel: the implicit GEMM (of the padded channels where the kernel pads C), x, the
    /// weight, bias and residual read once and the output written once, and each conversion the
    /// chain makes here (layout.rs) a copy of its own; padding x is one wherever x comes from
    /// (zeroing the pad channels and copying x in: two launches).
    fn work(&self, c: &ConvMatch, math: MathType) -> Option<Work> {
        let p = &c.problem;
        if refusal(p, math).is_some() {
            return None;
        }
        let runs = p.kernel_problem();
        let bytes = p.dtype.bytes() as f64;
        let [out_h, out_w] = p.output();
        let image = (p.images * p.height * p.width) as f64 * bytes;
        let (x, x_kernel) = (
            image * p.in_channels as f64,
            image * runs.in_channels as f64,
        );
        let w = (p.out_channels * runs.in_channels / p.groups * p.filter[0] * p.filter[1]) as f64
            * bytes;
        let out = (p.images * p.out_channels * out_h * out_w) as f64 * bytes;
        let mut total = x_kernel + w + out + if p.residual { out } else { 0.0 };
        let mut launches = 1;
        let mut note = "one kernel".to_string();
        if p.padded() {
            total += x + x_kernel;
            launches += 2;
            note += &format!(
                ", x padded to {} channels as it is converted to channels-last",
                runs.in_channels
            );
        } else if matches!(c.x_from, Source::Nchw(_)) {
            total += 2.0 * x;
            launches += 1;
            note += ", x converted to channels-last";
        }
        if c.out_nchw.is_some() {
            total += 2.0 * out;
            launches += 1;
            note += ", the output converted back to NCHW";
        }
        let (rows, cols, k) = runs.gemm();
        Some(Work {
            products: vec![Product {
                node: c.conv.node,
                flops: 2.0 * (rows * cols * p.groups) as f64 * k as f64,
                k,
            }],
            bytes: total,
            launches,
            note,
        })
    }
    fn edit(&self, g: &Graph, m: &ConvMatch, kernel: &str) -> Edit {
        edit(g, m, kernel)
    }
    /// Each chain's layouts decided again over the chains that are substituted: a chain torch
    /// keeps passes its input's layout on, so one before it hands back NCHW where a reader after
    /// it needs that.
    fn edits(&self, g: &Graph, found: &[(&ConvMatch, &str)]) -> Vec<Edit> {
        let matches: Vec<ConvMatch> = found.iter().map(|(m, _)| (*m).clone()).collect();
        let subs = substituted(matches.iter());
        let readers = g.readers();
        matches
            .into_iter()
            .zip(found)
            .map(|(mut m, (_, kernel))| {
                with_layout(g, &readers, &subs, &mut m);
                edit(g, &m, kernel)
            })
            .collect()
    }
    fn unmatched(&self, g: &Graph, matched: &BTreeSet<NodeId>) -> Vec<(NodeId, String)> {
        refusals(g, matched)
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<ConvProblem, String>> {
        rule.starts_with("conv2d")
            .then(|| ConvProblem::from_rule(rule, dims, dtype))
    }
    fn rule_ids(&self) -> &'static str {
        "conv2d_s<stride>_p<padding>_d<dilation>[_bias][_add][_<act>]"
    }
    fn rule_id(&self, p: &ConvProblem) -> String {
        p.rule_id()
    }
    fn shape_key(&self, p: &ConvProblem) -> String {
        p.shape_key()
    }
    fn flops(&self, p: &ConvProblem) -> f64 {
        p.flops()
    }
    fn dtype(&self, p: &ConvProblem) -> DType {
        p.dtype
    }
    fn alignment(&self, p: &ConvProblem) -> u32 {
        p.alignment()
    }
    /// A GEMM's math: the tensors' own for bf16 and fp16, tf32 or 3xTF32 for fp32 by the policy.
    fn math(&self, p: &ConvProblem, precision: Precision) -> Option<MathType> {
        MathType::for_tensor(p.dtype, precision)
    }
    fn pattern_kind(&self, _p: &ConvProblem) -> PatternKind {
        CONV
    }

    fn spec_name(&self, s: &ConvSpec) -> String {
        s.name()
    }
    fn spec_arch(&self, s: &ConvSpec) -> Arch {
        s.arch
    }
    fn spec_dtype(&self, s: &ConvSpec) -> DType {
        s.dtype
    }
    fn render(&self, s: &ConvSpec) -> Code {
        render::render(s)
    }
    /// One family per arch: CUTLASS 3's builder and CUTLASS 2's implicit GEMM share no unit;
    /// the 1x1 family's GEMMs (the GEMM builder's headers) have their own.
    fn unit(&self, s: &ConvSpec) -> Unit {
        match s.conv_gemm {
            Some(_) => Unit::plain(format!("conv_{}_gemm", s.arch.short_name())),
            None => Unit::plain(format!("conv_{}", s.arch.short_name())),
        }
    }
    /// Finer than the units: the stems' fixed-channels kernels and the depthwise direct
    /// convolutions share their arch's unit but win on problems of their own, and a table hit
    /// looks for each family by this name (`space_now`).
    fn spec_family(&self, s: &ConvSpec) -> String {
        let unit = self.unit(s).family;
        match (s.conv_depthwise, s.conv_fixed_channels) {
            (Some(_), _) => format!("{unit}_depthwise"),
            (None, Some(_)) => format!("{unit}_fixedc"),
            (None, None) => unit,
        }
    }
    fn dispatch(&self, s: &ConvSpec) -> Dispatch {
        Dispatch {
            kind: "conv",
            signature: signature(s),
            layout: String::new(),
            epilogue: String::new(),
            knobs: [0; 3],
        }
    }

    /// CUTLASS's generator's tiles for the arch, best estimate first, within the space's budget
    /// (`--candidates` cuts further), less those that failed before; no agent.
    fn candidates(&self, p: &ConvProblem, cx: &mut SweepCx) -> Result<Candidates, String> {
        let specs = match candidates(p, cx.math, cx.arch) {
            Ok(specs) => specs,
            Err(why) => return Ok(Candidates::None(why)),
        };
        let mut specs: Vec<Spec> = specs
            .into_iter()
            .filter(|s| !cx.failed.contains(&s.name()))
            .map(Spec::from)
            .collect();
        specs.truncate(cx.max_candidates.unwrap_or(cx.space.budget).max(1));
        Ok(if specs.is_empty() {
            Candidates::None(format!(
                "every {} convolution kernel for it failed before",
                cx.arch.short_name()
            ))
        } else {
            Candidates::Kernels { specs, space: None }
        })
    }
    /// Every kernel the generator's space holds for `p`, in the sweep's order (no budget).
    fn space_now(&self, p: &ConvProblem, math: MathType, arch: Arch) -> Vec<Spec> {
        candidates(p, math, arch)
            .map(|specs| specs.into_iter().map(Spec::from).collect())
            .unwrap_or_default()
    }
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &ConvProblem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Ok(Box::new(ConvBench::new(lib, p.clone(), protocol)?))
    }

    fn ops(&self) -> &'static [OpDef] {
        &[OpDef {
            name: "conv",
            schema: CONV_OP_SCHEMA,
            function: "conv",
            meta: Some("conv_meta"),
            flexible_layout: false,
        }]
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        op_code(arch)
    }
}

/// What the op copies on every call: x where it comes from an NCHW producer or the kernel pads
/// its channels, the output where a reader needs NCHW.
fn copies(c: &ConvMatch) -> Vec<String> {
    let mut out = vec![];
    let p = &c.problem;
    let from = match &c.x_from {
        Source::Nchw(from) => format!("it comes NCHW from {from}"),
        Source::Chain(node) => {
            format!("it comes channels-last from the convolution at node {node}")
        }
        Source::Strided(op) => format!("it comes channels-last from {op}"),
    };
    if p.padded() {
        out.push(format!(
            "x padded from {} to {} channels, channels-last ({from})",
            p.in_channels,
            p.kernel_channels()
        ));
    } else if matches!(c.x_from, Source::Nchw(_)) {
        out.push(format!("x to channels-last ({from})"));
    }
    if let Some(reader) = &c.out_nchw {
        out.push(format!("the output back to NCHW (for {reader})"));
    }
    out
}

/// The match's graph rewrite (`Kind::edit`): `fact::conv` in place of the chain's last node,
/// the chain's other nodes removed. The weight and bias the kernel reads are buffers the rewrite
/// adds once, the BatchNorm folded in (`Operand::folded`); the graph's own operands go along for
/// the fallback.
pub fn edit(g: &Graph, c: &ConvMatch, kernel: &str) -> Edit {
    let last = c.last();
    let remove: Vec<NodeId> = c.nodes().into_iter().filter(|&n| n != last).collect();
    let bn = c.bn.as_ref();
    let fold = Fold {
        weight: c.conv.weight,
        // The weight's own input channels (one a filter where depthwise), or the stem's padded ones.
        channels: c.problem.kernel_channels() / c.problem.groups,
        bias: c.conv.bias,
        bn: bn.map(|b| FoldBn {
            weight: b.weight,
            bias: b.bias,
            mean: b.mean,
            var: b.var,
            eps: eps(g, b),
        }),
    };
    let opt = |v: Option<usize>| Operand::optional(v);
    Edit {
        node: last as u32,
        expect_kind: g.nodes[last].kind.clone(),
        op: "fact::conv".to_string(),
        operands: vec![
            Operand::value(c.conv.x),
            Operand::value(c.conv.weight),
            opt(c.conv.bias),
            Operand::value(c.conv.stride),
            Operand::value(c.conv.padding),
            Operand::value(c.conv.dilation),
            Operand::value(c.conv.groups),
            opt(bn.and_then(|b| b.weight)),
            opt(bn.and_then(|b| b.bias)),
            opt(bn.map(|b| b.mean)),
            opt(bn.map(|b| b.var)),
            opt(c.add.map(|a| a.1)),
            Operand::folded(false, &fold),
            if c.problem.bias {
                Operand::folded(true, &fold)
            } else {
                Operand::none()
            },
            Operand::text(&form(g, c)),
            Operand::text(kernel),
        ],
        remove_kinds: remove.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
        remove: remove.into_iter().map(|n| n as u32).collect(),
        outputs: vec![],
        output_kinds: vec![],
        first: false,
    }
}

/// The BatchNorm's eps (the rule matched it only as a number).
fn eps(g: &Graph, b: &BatchNorm) -> f64 {
    g.constant(b.eps)
        .and_then(Const::as_f64)
        .expect("a matched BatchNorm's eps is a constant")
}

/// The op's `form`: the convolution as the graph wrote it (`_convolution` with its flags), the
/// BatchNorm's eps and cudnn flag, the activation, and the layout the output is handed back in.
pub fn form(g: &Graph, c: &ConvMatch) -> String {
    let node = &g.nodes[c.conv.node];
    let flag = |v: usize| match g.constant(v) {
        Some(Const::Bool(true)) => '1',
        _ => '0',
    };
    let mut parts = vec![match node.kind.as_str() {
        "aten::_convolution" => format!(
            "_convolution:{}",
            node.inputs[9..]
                .iter()
                .map(|&v| flag(v))
                .collect::<String>()
        ),
        _ => "conv2d".to_string(),
    }];
    if let Some(b) = &c.bn {
        let cudnn = flag(g.nodes[b.node].inputs[8]);
        parts.push(format!("bn:{:?}:{cudnn}", eps(g, b)));
    }
    if let Some((_, a)) = c.act {
        parts.push(format!("act:{}", a.name()));
    }
    parts.push(
        if c.out_nchw.is_some() {
            "out:nchw"
        } else {
            "out:cl"
        }
        .into(),
    );
    parts.join(";")
}

/// `conv2d 32x64x56x56 → 256 1x1 s1 p0 + bn + add + relu`: the input as the graph lays it out
/// (NCHW), the output channels, the filter, then the chain.
fn name(c: &ConvMatch) -> String {
    let p = &c.problem;
    let pair = |v: [i64; 2]| {
        if v[0] == v[1] {
            v[0].to_string()
        } else {
            format!("{}x{}", v[0], v[1])
        }
    };
    let mut s = format!(
        "conv2d {}x{}x{}x{} → {} {}x{} s{} p{}",
        p.images,
        p.in_channels,
        p.height,
        p.width,
        p.out_channels,
        p.filter[0],
        p.filter[1],
        pair(p.stride),
        pair(p.padding)
    );
    if p.dilation != [1, 1] {
        s += &format!(" d{}", pair(p.dilation));
    }
    if c.conv.bias.is_some() {
        s += " + bias";
    }
    if c.bn.is_some() {
        s += " + bn";
    }
    if c.add.is_some() {
        s += " + add";
    }
    if let Some((_, a)) = c.act {
        s += " + ";
        s += a.name();
    }
    s
}

/// What the plan says of the match: its implicit GEMM, the folding compose does, where its
/// tensors' layouts change, and the kernel family that computes it or why none does.
fn notes(c: &ConvMatch, math: MathType, arch: Arch) -> Vec<String> {
    let p = &c.problem;
    let refused = refusal(p, math);
    // The GEMM the kernel runs: of the padded channels where it pads them.
    let runs = if refused.is_none() {
        p.kernel_problem()
    } else {
        p.clone()
    };
    let (m, n, k) = runs.gemm();
    let [out_h, out_w] = p.output();
    let depthwise = is_depthwise(p);
    let mut notes = vec![if depthwise {
        format!(
            "a depthwise convolution: each of the {} channels convolved with its own {}x{} filter over N·P·Q = {}·{out_h}·{out_w} = {m} output pixels ({k} multiply-adds each); fp32 multiply-adds on CUDA cores (the tensor cores have no depthwise form)",
            p.in_channels, p.filter[0], p.filter[1], p.images
        )
    } else {
        format!(
        "an implicit GEMM of M = N·P·Q = {}·{out_h}·{out_w} = {m}, N = K = {n}, K = C·R·S = {}·{}·{} = {k}; {} arithmetic",
        p.images,
        runs.in_channels,
        p.filter[0],
        p.filter[1],
        math.short_name()
    )
    }];
    if let Some(why) = refused {
        notes.push(format!("no kernel: {why}"));
        return notes;
    }
    if p.padded() {
        notes.push(format!(
            "C = {} padded to {} (zero channels; x padded where it is converted): the kernels read 16-byte rows of channels; the weight is padded once at compose time, x on every call",
            p.in_channels,
            runs.in_channels
        ));
    }
    if c.bn.is_some() {
        notes.push(
            "the eval-mode BatchNorm is a per-channel scale and bias: folded into the weights and bias once, at compose time (module buffers; the fallback replays the BatchNorm on the module's own parameters)"
                .into(),
        );
    }
    let in_place = if p.padded() {
        format!(
            "copied on every call all the same, its {} channels padded to {}",
            p.in_channels, runs.in_channels
        )
    } else {
        "read in place".to_string()
    };
    notes.push(match &c.x_from {
        Source::Chain(node) => {
            format!("x channels-last from the convolution at node {node}: {in_place}")
        }
        Source::Strided(op) => {
            format!("x channels-last as the graph lays it out ({op}): {in_place}")
        }
        Source::Nchw(from) if p.padded() => format!(
            "x padded to {} channels as it is converted to channels-last on every call (one copy): it comes NCHW from {from}",
            runs.in_channels
        ),
        Source::Nchw(from) => {
            format!("x converted to channels-last on every call: it comes NCHW from {from}")
        }
    });
    notes.push(match &c.out_nchw {
        None => "the output stays channels-last: every reader takes it".into(),
        Some(reader) => format!(
            "the output handed back in NCHW for {reader} (the channels-last chain ends here)"
        ),
    });
    notes.push(match arch {
        _ if depthwise => "CUTLASS's sm80 depthwise direct convolution (examples/46; built for either arch): a CTA holds an output tile of pixels and channels, cp.async pipeline, SIMT; bias and activation in its epilogue",
        Arch::Sm90 => "CUTLASS's sm90 conv collective builder: TMA im2col loads, warp-specialized GMMA; bias, residual and activation in its epilogue",
        Arch::Sm80 => "CUTLASS's sm80 ImplicitGemmConvolution: multistage cp.async, mma.sync; bias, residual and activation in its epilogue",
    }.into());
    notes
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kinds::own;

    /// A bf16 1x1 convolution, 256 → 1024 channels on 14x14 at batch 32, with its BatchNorm,
    /// the residual add and ReLU (a resnet50 layer3 bottleneck's last convolution).
    pub(crate) const BLOCK: &str = "graph(%self: M, %x: bf16[32,256,14,14], %r: bf16[32,1024,14,14]):
       %none = prim::Constant[None]()
       %f = prim::Constant[False]()
       %t = prim::Constant[True]()
       %one = prim::Constant[1]()
       %zero = prim::Constant[0]()
       %eps = prim::Constant[1e-05]()
       %mom = prim::Constant[0.1]()
       %l1 = prim::ListConstruct(%one, %one) : List_int_
       %l0 = prim::ListConstruct(%zero, %zero) : List_int_
       %m = prim::GetAttr[name=\"m\"](%self) : Block
       %w = prim::GetAttr[name=\"w\"](%m) : bf16[1024,256,1,1]
       %g = prim::GetAttr[name=\"g\"](%m) : bf16[1024]
       %be = prim::GetAttr[name=\"be\"](%m) : bf16[1024]
       %mu = prim::GetAttr[name=\"mu\"](%m) : bf16[1024]
       %var = prim::GetAttr[name=\"var\"](%m) : bf16[1024]
       %y = aten::_convolution(%x, %w, %none, %l1, %l0, %l1, %f, %l0, %one, %f, %f, %t, %t) : bf16[32,1024,14,14]
       %n = aten::batch_norm(%y, %g, %be, %mu, %var, %f, %mom, %eps, %t) : bf16[32,1024,14,14]
       %s = aten::add_(%n, %r, %one) : bf16[32,1024,14,14]
       %a = aten::relu_(%s) : bf16[32,1024,14,14]
       return (%a)";

    #[test]
    fn the_problem_is_the_chains_and_its_winner_reads_back() {
        let g = Graph::parse(BLOCK).unwrap();
        let p = crate::kinds::Kind::problem_of(&Conv, &match_convs(&g).pop().unwrap());
        assert_eq!(p.rule_id(), "conv2d_s1_p0_d1_bias_add_relu");
        assert_eq!(p.shape_key(), "32x14x14x256x1024x1x1");
        assert_eq!(p.math(Precision::F32), Some(MathType::Bf16));
        for arch in Arch::ALL {
            let s = candidates(own("problem", p.get()), MathType::Bf16, arch)
                .unwrap()
                .remove(0);
            let spec = Spec::from(s);
            let json = serde_json::to_value(&spec).unwrap();
            assert_eq!(
                crate::kinds::Kind::spec_from_json(&Conv, json).unwrap(),
                spec
            );
        }
    }

    /// The edit: `fact::conv` at the ReLU, the convolution, BatchNorm and add removed, the graph's
    /// operands for the fallback, the folded weight and bias, the form.
    #[test]
    fn the_edit_replaces_the_chain_with_one_call_on_folded_buffers() {
        let g = Graph::parse(BLOCK).unwrap();
        let m = match_convs(&g).pop().unwrap();
        let e = edit(&g, &m, "k");
        let id = |name: &str| g.values.iter().position(|v| v.name == name).unwrap();
        let node = |name: &str| g.values[id(name)].producer.unwrap() as u32;
        assert_eq!((e.node, e.expect_kind.as_str()), (node("a"), "aten::relu_"));
        assert_eq!(e.op, "fact::conv");
        assert_eq!(e.remove, vec![node("y"), node("n"), node("s")]);
        assert_eq!(
            e.remove_kinds,
            ["aten::_convolution", "aten::batch_norm", "aten::add_"]
        );
        let values: Vec<u32> = e.operands[..12].iter().map(|o| o.value).collect();
        assert_eq!(
            values,
            [
                id("x"),
                id("w"),
                0,
                id("l1"),
                id("l0"),
                id("l1"),
                id("one"),
                id("g"),
                id("be"),
                id("mu"),
                id("var"),
                id("r")
            ]
            .map(|v| v as u32)
        );
        use crate::graph::OperandKind;
        assert!(e.operands[2].kind == OperandKind::None);
        let (w, b) = (&e.operands[12], &e.operands[13]);
        assert!(w.kind == OperandKind::Folded && b.kind == OperandKind::Folded);
        // The weight's buffer has its own 256 input channels (none padded); 0 makes the bias.
        assert_eq!(
            (w.int_value, b.int_value, w.text.as_str()),
            (256, 0, "1e-5")
        );
        let absent = crate::graph::ABSENT;
        assert_eq!(
            w.values,
            [
                id("w") as u32,
                absent,
                id("g") as u32,
                id("be") as u32,
                id("mu") as u32,
                id("var") as u32
            ]
        );
        assert_eq!(
            e.operands[14].text,
            "_convolution:0011;bn:1e-5:1;act:relu;out:nchw"
        );
        assert_eq!(e.operands[15].text, "k");
        // The convolution alone substituted (its BatchNorm, add and ReLU left to torch, which
        // keep its layout up to the graph's output): without BatchNorm or bias, the weight is
        // still laid out for the kernel; no bias; the output back in NCHW.
        let plain = match_convs(&g).remove(0);
        let e = Conv.edits(&g, &[(&plain, "k")]).remove(0);
        assert_eq!(e.node, node("y"));
        assert!(e.remove.is_empty());
        assert!(e.operands[12].kind == OperandKind::Folded && e.operands[12].text.is_empty());
        assert!(e.operands[13].kind == OperandKind::None);
        assert_eq!(e.operands[14].text, "_convolution:0011;out:nchw");
    }
}

#[cfg(test)]
mod stem_tests {
    use super::*;
    use crate::graph::OperandKind;

    /// torchvision's resnet stem at batch 32 in `dtype`: conv 7x7 stride 2 padding 3 over the
    /// image's 3 channels, its BatchNorm and ReLU, max pooling, then a 1x1 convolution with a
    /// bias (the first bottleneck's, as `aten::conv2d`), whose output `out_channels` channels
    /// are returned.
    fn stem(dtype: &str, out_channels: i64) -> Graph {
        Graph::parse(&format!(
            "graph(%self: M, %x: {dtype}[32,3,224,224]):
               %none = prim::Constant[None]()
               %f = prim::Constant[False]()
               %t = prim::Constant[True]()
               %zero = prim::Constant[0]()
               %one = prim::Constant[1]()
               %two = prim::Constant[2]()
               %three = prim::Constant[3]()
               %eps = prim::Constant[1e-05]()
               %mom = prim::Constant[0.1]()
               %l0 = prim::ListConstruct(%zero, %zero) : List_int_
               %l1 = prim::ListConstruct(%one, %one) : List_int_
               %l2 = prim::ListConstruct(%two, %two) : List_int_
               %l3 = prim::ListConstruct(%three, %three) : List_int_
               %m = prim::GetAttr[name=\"m\"](%self) : Stem
               %w = prim::GetAttr[name=\"w\"](%m) : {dtype}[64,3,7,7]
               %g = prim::GetAttr[name=\"g\"](%m) : {dtype}[64]
               %be = prim::GetAttr[name=\"be\"](%m) : {dtype}[64]
               %mu = prim::GetAttr[name=\"mu\"](%m) : {dtype}[64]
               %var = prim::GetAttr[name=\"var\"](%m) : {dtype}[64]
               %w2 = prim::GetAttr[name=\"w2\"](%m) : {dtype}[{out_channels},64,1,1]
               %b2 = prim::GetAttr[name=\"b2\"](%m) : {dtype}[{out_channels}]
               %y = aten::_convolution(%x, %w, %none, %l2, %l3, %l1, %f, %l0, %one, %f, %f, %t, %t) : {dtype}[32,64,112,112]
               %n = aten::batch_norm(%y, %g, %be, %mu, %var, %f, %mom, %eps, %t) : {dtype}[32,64,112,112]
               %a = aten::relu_(%n) : {dtype}[32,64,112,112]
               %p = aten::max_pool2d(%a, %l3, %l2, %l1, %l1, %f) : {dtype}[32,64,56,56]
               %z = aten::conv2d(%p, %w2, %b2, %l1, %l0, %l1, %one) : {dtype}[32,{out_channels},56,56]
               return (%z)"
        ))
        .unwrap()
    }

    fn convs(g: &Graph) -> Vec<ConvMatch> {
        crate::kinds::match_kinds(g, &[&Conv])
            .of::<ConvMatch>()
            .into_iter()
            .cloned()
            .collect()
    }

    fn value(g: &Graph, name: &str) -> usize {
        g.values.iter().position(|v| v.name == name).unwrap()
    }

    #[test]
    fn resnets_stem_runs_the_kernel_on_channels_padded_to_sixteen_bytes() {
        let g = stem("bf16", 64);
        let found = convs(&g);
        assert_eq!(found.len(), 2);
        let (s, next) = (&found[0], &found[1]);
        // The table keys the model's problem; the kernel runs it on 8 channels.
        assert_eq!(s.problem.rule_id(), "conv2d_s2_p3_d1_bias_relu");
        assert_eq!(s.problem.shape_key(), "32x224x224x3x64x7x7");
        assert!(kernels_take(&s.problem) && s.problem.padded());
        let facts = Conv.plan_facts(s, Some(MathType::Bf16), Arch::Sm90);
        assert_eq!(facts.name, "conv2d 32x3x224x224 → 64 7x7 s2 p3 + bn + relu");
        let notes = facts.notes.join("\n");
        for note in [
            "K = C·R·S = 8·7·7 = 392; bf16 arithmetic",
            "C = 3 padded to 8 (zero channels; x padded where it is converted)",
            "x padded to 8 channels as it is converted to channels-last on every call (one copy): it comes NCHW from the graph's input",
            "folded into the weights and bias once",
        ] {
            assert!(notes.contains(note), "{note}: {notes}");
        }
        assert!(!notes.contains("no kernel"), "{notes}");
        assert_eq!(
            Conv.copies_of(s),
            ["x padded from 3 to 8 channels, channels-last (it comes NCHW from the graph's input)"]
        );
        // Substituted, the stem hands its output on channels-last: through the max pool the
        // next convolution reads it in place (before, it converted there).
        assert_eq!(s.out_nchw, None);
        assert_eq!(next.x_from, Source::Chain(s.conv.node));
        assert!(Conv.copies_of(next).iter().all(|c| !c.starts_with("x ")));
        // The cost model charges the padded GEMM and the pad's passes: x read at 3 channels and
        // written at 8, then read by the kernel at 8.
        let work = Conv.work(s, MathType::Bf16).unwrap();
        let m = 32.0 * 112.0 * 112.0;
        assert_eq!(work.products[0].flops, 2.0 * m * 64.0 * 392.0);
        assert_eq!(work.products[0].k, 392);
        assert_eq!(Conv.products(s)[0].flops, 2.0 * m * 64.0 * 147.0, "torch's");
        let image = 32.0 * 224.0 * 224.0 * 2.0;
        let (w, out) = (64.0 * 392.0 * 2.0, m * 64.0 * 2.0);
        assert_eq!(
            work.bytes,
            8.0 * image + w + out + 3.0 * image + 8.0 * image
        );
        assert_eq!(work.launches, 3);
        assert!(
            work.note
                .contains("x padded to 8 channels as it is converted to channels-last"),
            "{}",
            work.note
        );
        // fp32 rows of 16 bytes are 4 channels.
        let g32 = stem("f32", 64);
        let s32 = &convs(&g32)[0];
        let notes = Conv
            .plan_facts(s32, Some(MathType::Tf32), Arch::Sm90)
            .notes
            .join("\n");
        assert!(
            notes.contains("C = 3 padded to 4 (zero channels"),
            "{notes}"
        );
    }

    #[test]
    fn the_stems_edit_pads_the_folded_weight_and_keeps_the_models_own_for_the_fallback() {
        let g = stem("bf16", 64);
        let found = convs(&g);
        let e = Conv
            .edits(&g, &[(&found[0], "k"), (&found[1], "k2")])
            .remove(0);
        assert_eq!(e.operands[0].value as usize, value(&g, "x"));
        assert_eq!(
            e.operands[1].value as usize,
            value(&g, "w"),
            "the fallback's"
        );
        let (w, b) = (&e.operands[12], &e.operands[13]);
        assert!(w.kind == OperandKind::Folded && b.kind == OperandKind::Folded);
        assert_eq!((w.int_value, b.int_value), (8, 0));
        assert_eq!(w.values[0] as usize, value(&g, "w"));
        assert_eq!(
            e.operands[14].text,
            "_convolution:0011;bn:1e-5:1;act:relu;out:cl"
        );
    }

    #[test]
    fn a_patch_embedding_without_a_batchnorm_pads_too_and_three_output_channels_stay_torchs() {
        // ViT's conv_proj: 16x16 stride 16 with a bias, the model's weight padded alone.
        let g = Graph::parse(
            "graph(%self: M, %x: bf16[8,3,224,224]):
               %zero = prim::Constant[0]()
               %one = prim::Constant[1]()
               %s = prim::Constant[16]()
               %l0 = prim::ListConstruct(%zero, %zero) : List_int_
               %l1 = prim::ListConstruct(%one, %one) : List_int_
               %l16 = prim::ListConstruct(%s, %s) : List_int_
               %m = prim::GetAttr[name=\"conv_proj\"](%self) : Conv2d
               %w = prim::GetAttr[name=\"weight\"](%m) : bf16[768,3,16,16]
               %b = prim::GetAttr[name=\"bias\"](%m) : bf16[768]
               %y = aten::conv2d(%x, %w, %b, %l16, %l0, %l1, %one) : bf16[8,768,14,14]
               return (%y)",
        )
        .unwrap();
        let found = convs(&g);
        assert_eq!(found.len(), 1);
        let p = &found[0].problem;
        assert_eq!(
            (p.rule_id().as_str(), p.shape_key().as_str()),
            ("conv2d_s16_p0_d1_bias", "8x224x224x3x768x16x16")
        );
        assert_eq!(p.kernel_problem().gemm(), (8 * 14 * 14, 768, 8 * 256));
        let e = edit(&g, &found[0], "k");
        let w = &e.operands[12];
        assert_eq!((w.int_value, w.text.as_str()), (8, ""), "no BatchNorm");
        assert_eq!(e.operands[14].text, "conv2d;out:nchw");
        // The stem's chain ending in 3 output channels (an image-to-image head): that
        // convolution stays torch's, with the reason; the stem still runs its kernel.
        let g = stem("bf16", 3);
        let found = convs(&g);
        let facts = Conv.plan_facts(&found[1], Some(MathType::Bf16), Arch::Sm90);
        assert!(
            facts.notes[1].starts_with("no kernel: K = 3 output channels must be a multiple of 8"),
            "{:?}",
            facts.notes
        );
        assert!(Conv.work(&found[1], MathType::Bf16).is_none());
        assert!(kernels_take(&found[0].problem));
    }
}
