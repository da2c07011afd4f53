//! Patch-embedding rule: `patch_conv[_bias]`.
//!
//! y[n,k,p,q] = Σ_{c,r,s} x[n,c,p·R+r,q·S+s]·w[k,c,r,s] (+ b[k]) for a 2-D convolution whose
//! stride equals its filter [R,S], with no padding, dilation 1 and groups 1: the patch
//! embeddings of ViT, DeiT, BEiT and Swin, ConvNeXt's stem. The graph writes it as the
//! convolution kind reads any convolution (`conv::conv_call`: `aten::_convolution` of a traced
//! `nn.Conv2d` or export's `convolution`, `aten::conv2d`), its weight and bias module parameters
//! of x's dtype. Each output pixel reads one patch and no other, so the convolution is one GEMM
//! over the image cut into patches, with no implicit-GEMM gather and none of the layout
//! conversions torch's convolution makes around its 3-channel input.
//!
//! The op copies x into patches and hands its output back NCHW, so where the convolution kind
//! reads x in place and keeps a channels-last chain going, that kind stays the better one: a
//! pointwise (1x1) convolution (its 1x1 family), and a convolution whose x lies channels-last
//! (ConvNeXt's downsampling, after its LayerNorm2d's permute back) or comes from a convolution
//! chain the convolution kind keeps channels-last (`conv::x_source`) are no patch embeddings
//! here. A patch embedding reads the image as the model is given it, NCHW.
//!
//! The convolution kind matches the same node; the cover's sites are equal (one node), and the
//! registry lists this kind first, so unless `--no-patch-conv` (`registry::MatchOptions`) it
//! takes the node, keeping the convolution kind's match of it as what compose falls back to. A convolution followed by a BatchNorm or an
//! activation the convolution kind would fold is left to that kind (its site is larger).

use super::problem::PatchProblem;
use super::PATCH;
use crate::graph::{Graph, NodeId, ValueId};
use crate::kinds::conv::{
    conv_call, conv_nodes, kernels_take, match_convs, substituted, x_source, ConvCall, ConvMatch,
    ConvProblem, Source, Substituted,
};
use crate::rules::{boxed, Match, PatternKind, Rule};

#[derive(Clone, Debug, PartialEq)]
pub struct PatchMatch {
    pub conv: NodeId,
    pub x: ValueId,
    pub weight: ValueId,
    pub bias: Option<ValueId>,
    pub problem: PatchProblem,
    /// The convolution kind's match of the convolution alone, which compose realizes instead
    /// when no GEMM kernel beats torch here (`Kind::unfused`): a 4x4 stem's two copies can cost
    /// more than the GEMM saves, and the convolution kind's kernel reads x in place.
    pub alone: Option<ConvMatch>,
}

impl Match for PatchMatch {
    fn nodes(&self) -> Vec<NodeId> {
        vec![self.conv]
    }
}

/// The patch-embedding rule.
pub struct PatchRule;

impl Rule for PatchRule {
    fn name(&self) -> &'static str {
        "patch_conv"
    }
    fn kind(&self) -> PatternKind {
        PATCH
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_patches(g))
    }
}

/// Every top-level convolution that is a patch embedding. Where x comes from is asked only of
/// those whose own arguments make one (a CNN has none), since that matches every convolution
/// chain of the graph (`Convs::of`).
pub fn match_patches(g: &Graph) -> Vec<PatchMatch> {
    let candidates: Vec<(NodeId, ConvCall, ConvProblem)> = conv_nodes(g)
        .filter_map(|n| shaped(g, n).ok().map(|(call, conv)| (n, call, conv)))
        .collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    let convs = Convs::of(g);
    candidates
        .into_iter()
        .filter_map(|(n, call, conv)| patch_in(g, &convs, n, call, conv).ok())
        .collect()
}

/// The convolution at `n` as a patch embedding, or why it is none.
pub fn patch(g: &Graph, n: NodeId) -> Result<PatchMatch, String> {
    let (call, conv) = shaped(g, n)?;
    patch_in(g, &Convs::of(g), n, call, conv)
}

/// What the convolution kind makes of the graph: its matches, the nodes of its chains that
/// kernels take and the graph's readers (what `x_source` reads to tell where x comes from).
struct Convs {
    matches: Vec<ConvMatch>,
    chains: Substituted,
    readers: Vec<Vec<NodeId>>,
}

impl Convs {
    fn of(g: &Graph) -> Convs {
        let matches = match_convs(g);
        let chains = substituted(matches.iter().filter(|m| kernels_take(&m.problem)));
        Convs {
            matches,
            chains,
            readers: g.readers(),
        }
    }

    /// The convolution kind's match of the convolution at `n` alone.
    fn alone(&self, n: NodeId) -> Option<ConvMatch> {
        self.matches
            .iter()
            .find(|m| m.conv.node == n && m.nodes() == [n])
            .cloned()
    }
}

/// The convolution at `n` if its own arguments make it a patch embedding: groups 1, the stride
/// its filter, no padding or dilation, and no 1x1.
fn shaped(g: &Graph, n: NodeId) -> Result<(ConvCall, ConvProblem), String> {
    let (call, conv) = conv_call(g, n)?;
    if conv.groups != 1 {
        return Err(format!(
            "groups = {} (a patch embedding has one)",
            conv.groups
        ));
    }
    if conv.filter != conv.stride || conv.padding != [0, 0] || conv.dilation != [1, 1] {
        return Err(format!(
            "filter {:?}, stride {:?}, padding {:?}, dilation {:?}: patches are a filter's own stride apart, unpadded",
            conv.filter, conv.stride, conv.padding, conv.dilation
        ));
    }
    if conv.filter == [1, 1] {
        return Err(
            "a pointwise convolution: the convolution kind's 1x1 family reads x in place".into(),
        );
    }
    Ok((call, conv))
}

/// A shaped convolution as a patch embedding where x lies NCHW.
fn patch_in(
    g: &Graph,
    convs: &Convs,
    n: NodeId,
    call: ConvCall,
    conv: ConvProblem,
) -> Result<PatchMatch, String> {
    match x_source(g, &convs.readers, &convs.chains, call.x) {
        Source::Nchw(_) => {}
        Source::Strided(op) => {
            return Err(format!(
                "x comes channels-last from {op}: the convolution kind reads it in place, where this op would copy it"
            ))
        }
        Source::Chain(p) => {
            return Err(format!(
                "x comes channels-last from the convolution at node {p}: the convolution kind keeps its chain, where this op would copy x"
            ))
        }
    }
    let problem = PatchProblem {
        images: conv.images,
        height: conv.height,
        width: conv.width,
        in_channels: conv.in_channels,
        out_channels: conv.out_channels,
        patch: conv.filter,
        dtype: conv.dtype,
        bias: call.bias.is_some(),
    };
    problem.check()?;
    Ok(PatchMatch {
        conv: n,
        x: call.x,
        weight: call.weight,
        bias: call.bias,
        problem,
        alone: convs.alone(n),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    /// One convolution of `x` (bf16[2,3,H,W]) by `w` (bf16[64,3,R,S]) written `conv`, its output
    /// `y` of sizes `y`.
    fn graph(x: &str, w: &str, conv: &str, y: &str) -> Graph {
        Graph::parse(&format!(
            "graph(%self: M, %x: bf16[{x}], %wx: bf16[{w}]):
               %none = prim::Constant[None]()
               %f = prim::Constant[False]()
               %t = prim::Constant[True]()
               %zero = prim::Constant[0]()
               %one = prim::Constant[1]()
               %four = prim::Constant[4]()
               %sixteen = prim::Constant[16]()
               %l0 = prim::ListConstruct(%zero, %zero) : List_int_
               %l1 = prim::ListConstruct(%one, %one) : List_int_
               %l4 = prim::ListConstruct(%four, %four) : List_int_
               %l16 = prim::ListConstruct(%sixteen, %sixteen) : List_int_
               %m = prim::GetAttr[name=\"m\"](%self) : Block
               %w = prim::GetAttr[name=\"w\"](%m) : bf16[{w}]
               %b = prim::GetAttr[name=\"b\"](%m) : bf16[64]
               %y = {conv} : bf16[{y}]
               return (%y)"
        ))
        .unwrap()
    }

    const VIT: &str =
        "aten::_convolution(%x, %w, %b, %l16, %l0, %l1, %f, %l0, %one, %f, %f, %t, %t)";

    #[test]
    fn a_vit_patch_embedding_is_one_patch_conv() {
        let g = graph("2,3,224,224", "64,3,16,16", VIT, "2,64,14,14");
        let found = match_patches(&g);
        assert_eq!(found.len(), 1, "{found:#?}");
        let m = &found[0];
        assert_eq!(m.problem.rule_id(), "patch_conv_bias");
        assert_eq!(m.problem.shape_key(), "2x224x224x3x64x16x16");
        assert_eq!(m.problem.dtype, DType::Bf16);
        assert_eq!(m.problem.gemm_dims(), (2 * 196, 64, 768));
        let name = |v: ValueId| g.values[v].name.as_str();
        assert_eq!((name(m.x), name(m.weight)), ("x", "w"));
        assert_eq!(m.bias.map(name), Some("b"));
        // conv2d's form without a bias, a 4x4 stem over an odd image (the last row dropped).
        let g = graph(
            "2,3,57,56",
            "64,3,4,4",
            "aten::conv2d(%x, %w, %none, %l4, %l0, %l1, %one)",
            "2,64,14,14",
        );
        let m = &match_patches(&g)[0];
        assert_eq!(m.problem.rule_id(), "patch_conv");
        assert_eq!(m.problem.output(), [14, 14]);
        assert_eq!(m.bias, None);
    }

    #[test]
    fn other_convolutions_are_no_patch_embedding_and_say_why() {
        let why = |w: &str, conv: &str, y: &str| {
            let g = graph("2,3,224,224", w, conv, y);
            let n = g.values[g.values.iter().position(|v| v.name == "y").unwrap()]
                .producer
                .unwrap();
            assert!(match_patches(&g).is_empty(), "{conv}");
            patch(&g, n).unwrap_err()
        };
        // A stride other than the filter, padding, dilation.
        let s = "aten::conv2d(%x, %w, %b, %l1, %l0, %l1, %one)";
        assert!(why("64,3,4,4", s, "2,64,221,221").contains("stride [1, 1]"));
        let p = "aten::conv2d(%x, %w, %b, %l4, %l1, %l1, %one)";
        assert!(why("64,3,4,4", p, "2,64,56,56").contains("padding [1, 1]"));
        // A pointwise convolution.
        let pw = "aten::conv2d(%x, %w, %b, %l1, %l0, %l1, %one)";
        assert!(why("64,3,1,1", pw, "2,64,224,224").contains("pointwise"));
        // A weight the graph computes (the convolution kind's own reason).
        let g = graph(
            "2,3,224,224",
            "64,3,16,16",
            "aten::conv2d(%x, %wx, %b, %l16, %l0, %l1, %one)",
            "2,64,14,14",
        );
        assert!(match_patches(&g).is_empty());
    }
    #[test]
    fn x_lying_channels_last_stays_the_convolution_kinds() {
        // ConvNeXt's downsampling: x is the permute back from NHWC after a LayerNorm, recorded
        // with channels-last strides.
        let g = Graph::parse(
            "graph(%self: M, %h: bf16[2,56,56,96]):
               %f = prim::Constant[False]()
               %t = prim::Constant[True]()
               %zero = prim::Constant[0]()
               %one = prim::Constant[1]()
               %two = prim::Constant[2]()
               %three = prim::Constant[3]()
               %l0 = prim::ListConstruct(%zero, %zero) : List_int_
               %l1 = prim::ListConstruct(%one, %one) : List_int_
               %l2 = prim::ListConstruct(%two, %two) : List_int_
               %q = prim::ListConstruct(%zero, %three, %one, %two) : List_int_
               %x = aten::permute(%h, %q) : bf16[2,96,56,56]{301056,1,5376,96}
               %m = prim::GetAttr[name=\"m\"](%self) : Block
               %w = prim::GetAttr[name=\"w\"](%m) : bf16[192,96,2,2]
               %b = prim::GetAttr[name=\"b\"](%m) : bf16[192]
               %y = aten::_convolution(%x, %w, %b, %l2, %l0, %l1, %f, %l0, %one, %f, %f, %t, %t) : bf16[2,192,28,28]
               return (%y)",
        )
        .unwrap();
        assert!(match_patches(&g).is_empty());
        let n = g.values[g.values.iter().position(|v| v.name == "y").unwrap()]
            .producer
            .unwrap();
        let why = patch(&g, n).unwrap_err();
        assert!(why.contains("channels-last from aten::permute"), "{why}");
    }
}
