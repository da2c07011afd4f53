//! GRN rule: `grn`.
//!
//! g[n,c] = ‖x[n,·,·,c]‖₂, nf = g / (mean_c g + eps), y = w·(x·nf) + b + x, for x [N,H,W,C] (channels
//! last; ConvNeXt V2's Global Response Normalization). The graph writes it as Hugging Face's
//! ConvNextV2GRN does: `linalg_vector_norm(x, 2, [1, 2], keepdim=True)`, `mean(g, [-1],
//! keepdim=True)`, `add(·, eps)`, `div(g, ·)`, `mul(x, nf)`, `mul(w, ·)`, `add(·, b)`, `add(·, x)`;
//! or as timm's GlobalResponseNorm does, `x + addcmul(b, w, x·nf)`. Products and sums in either
//! operand order (alpha 1); the dims as [1, 2] or [-3, -2], the mean's as [-1] or [3]; w and b of
//! C elements ([C] or [1,1,1,C]) and x's dtype; eps a constant. Every intermediate is read by the
//! next step alone; x may have other readers.

use super::{GrnProblem, GRN};
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::rules::written::{mean_last, number};
use crate::rules::{boxed, Match, PatternKind, Rule};
use crate::types::DType;

/// How the graph writes the scale, bias and residual, which the op's fallback replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `w * (x * nf) + b + x` (Hugging Face's).
    Hf,
    /// `x + addcmul(b, w, x * nf)` (timm's).
    Addcmul,
}

impl Form {
    pub fn text(self) -> &'static str {
        match self {
            Form::Hf => "hf",
            Form::Addcmul => "addcmul",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct GrnMatch {
    /// Every node the pattern replaces, in program order; the last produces y.
    pub nodes: Vec<NodeId>,
    pub x: ValueId,
    pub weight: ValueId,
    pub bias: ValueId,
    pub eps: f64,
    pub form: Form,
    pub problem: GrnProblem,
}

impl Match for GrnMatch {
    fn nodes(&self) -> Vec<NodeId> {
        self.nodes.clone()
    }
}

pub struct GrnRule;

impl Rule for GrnRule {
    fn name(&self) -> &'static str {
        "grn"
    }
    fn kind(&self) -> PatternKind {
        GRN
    }
    fn find(&self, g: &Graph) -> Vec<Box<dyn Match>> {
        boxed(match_grns(g))
    }
}

struct Ctx<'g> {
    g: &'g Graph,
    uses: Vec<usize>,
    readers: Vec<Vec<NodeId>>,
}

impl Ctx<'_> {
    /// The one node reading `v`, if it is of `kind` (at the top level).
    fn only_reader(&self, v: ValueId, kind: &str) -> Option<NodeId> {
        let &[n] = self.readers[v].as_slice() else {
            return None;
        };
        let node = &self.g.nodes[n];
        (self.uses[v] == 1 && node.kind == kind && node.depth == 0).then_some(n)
    }
    fn out(&self, n: NodeId) -> ValueId {
        self.g.nodes[n].outputs[0]
    }
    /// Node `n`, a two-operand op (an `add` with alpha 1), reading `v` on one side: its other
    /// operand.
    fn other(&self, n: NodeId, v: ValueId) -> Option<ValueId> {
        let node = &self.g.nodes[n];
        let alpha_one =
            node.kind != "aten::add" || number(self.g, *node.inputs.get(2)?) == Some(1.0);
        if node.outputs.len() != 1 || node.inputs.len() < 2 || !alpha_one {
            return None;
        }
        match (node.inputs[0] == v, node.inputs[1] == v) {
            (true, false) => Some(node.inputs[1]),
            (false, true) => Some(node.inputs[0]),
            _ => None,
        }
    }
}

/// Every GRN of the top-level block.
pub fn match_grns(g: &Graph) -> Vec<GrnMatch> {
    let cx = Ctx {
        g,
        uses: g.use_counts(),
        readers: g.readers(),
    };
    (0..g.nodes.len())
        .filter(|&n| g.nodes[n].kind == "aten::linalg_vector_norm" && g.nodes[n].depth == 0)
        .filter_map(|n| grn(&cx, n))
        .collect()
}

fn grn(cx: &Ctx, norm: NodeId) -> Option<GrnMatch> {
    let g = cx.g;
    // linalg_vector_norm(x, ord, dim, keepdim, dtype)
    let i = &g.nodes[norm].inputs;
    let (x, gv) = (i[0], cx.out(norm));
    let xt = g.tensor(x)?;
    let dtype = DType::parse(&xt.dtype)?;
    let &[batch, h, w, channels] = xt.shape.as_slice() else {
        return None;
    };
    let dims = g.int_list(*i.get(2)?)?;
    let keep = g.constant(*i.get(3)?) == Some(&Const::Bool(true));
    let plain = i
        .get(4)
        .is_none_or(|&d| g.constant(d) == Some(&Const::None));
    if number(g, i[1]) != Some(2.0) || !(dims == [1, 2] || dims == [-3, -2]) || !keep || !plain {
        return None;
    }
    // The norms feed their mean and the division by it, nothing else.
    let mut readers = cx.readers[gv].clone();
    readers.sort();
    let &[a, b] = readers.as_slice() else {
        return None;
    };
    let (mean, div) = if g.nodes[a].kind == "aten::mean" {
        (a, b)
    } else {
        (b, a)
    };
    // Their mean over the channels (the last dim), kept.
    if cx.uses[gv] != 2 || mean_last(g, mean) != Some(gv) || g.nodes[div].kind != "aten::div" {
        return None;
    }
    let add_eps = cx.only_reader(cx.out(mean), "aten::add")?;
    let eps = number(g, cx.other(add_eps, cx.out(mean))?)?;
    let dn = &g.nodes[div].inputs;
    if dn.len() != 2 || dn[0] != gv || dn[1] != cx.out(add_eps) || cx.uses[cx.out(add_eps)] != 1 {
        return None;
    }
    let nf = cx.out(div);
    let xn = cx.only_reader(nf, "aten::mul")?;
    if cx.other(xn, nf)? != x {
        return None;
    }
    let t = cx.out(xn);
    let channel_param = |v: ValueId| {
        g.tensor(v).is_some_and(|tt| {
            let (last, lead) = tt.shape.split_last().map_or((0, &[][..]), |(l, r)| (*l, r));
            tt.dtype == xt.dtype
                && last == channels
                && lead.iter().all(|&d| d == 1)
                && lead.len() < 4
        })
    };
    let mut nodes = vec![norm, mean, add_eps, div, xn];
    let (form, weight, bias, sum) = if let Some(wm) = cx.only_reader(t, "aten::mul") {
        // Hugging Face's: w * t, + b, + x.
        let weight = cx.other(wm, t)?;
        let bm = cx.only_reader(cx.out(wm), "aten::add")?;
        let bias = cx.other(bm, cx.out(wm))?;
        nodes.extend([wm, bm]);
        (Form::Hf, weight, bias, cx.out(bm))
    } else {
        // timm's: addcmul(b, w, t, value=1).
        let ac = cx.only_reader(t, "aten::addcmul")?;
        let ai = &g.nodes[ac].inputs;
        if ai.len() != 4 || ai[2] != t || number(g, ai[3]) != Some(1.0) {
            return None;
        }
        nodes.push(ac);
        (Form::Addcmul, ai[1], ai[0], cx.out(ac))
    };
    let last = cx.only_reader(sum, "aten::add")?;
    if cx.other(last, sum)? != x || !channel_param(weight) || !channel_param(bias) {
        return None;
    }
    nodes.push(last);
    nodes.sort();
    Some(GrnMatch {
        nodes,
        x,
        weight,
        bias,
        eps,
        form,
        problem: GrnProblem {
            batch,
            pixels: h * w,
            channels,
            dtype,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ConvNeXt V2's GRN as Hugging Face's module traces, with `tail` after `%t = x * nf`.
    fn hf(dims: &str, tail: &str) -> String {
        format!(
            "graph(%x: bf16[2,7,7,64], %w: bf16[1,1,1,64], %b: bf16[1,1,1,64]):
               %two = prim::Constant[2]()
               %one = prim::Constant[1]()
               %m1 = prim::Constant[-1]()
               %t1 = prim::Constant[True]()
               %none = prim::Constant[None]()
               %eps = prim::Constant[1e-06]()
               %d = prim::ListConstruct({dims}) : int[]
               %l = prim::ListConstruct(%m1) : int[]
               %g = aten::linalg_vector_norm(%x, %two, %d, %t1, %none) : bf16[2,1,1,64]
               %m = aten::mean(%g, %l, %t1, %none) : bf16[2,1,1,1]
               %me = aten::add(%m, %eps, %one) : bf16[2,1,1,1]
               %nf = aten::div(%g, %me) : bf16[2,1,1,64]
               %t = aten::mul(%x, %nf) : bf16[2,7,7,64]
               {tail}
               return (%y)"
        )
    }

    const HF_TAIL: &str = "%u = aten::mul(%w, %t) : bf16[2,7,7,64]
               %v = aten::add(%u, %b, %one) : bf16[2,7,7,64]
               %y = aten::add(%v, %x, %one) : bf16[2,7,7,64]";

    #[test]
    fn hugging_faces_and_timms_grn_match_with_their_form() {
        let g = Graph::parse(&hf("%one, %two", HF_TAIL)).unwrap();
        let m = &match_grns(&g)[0];
        assert_eq!((m.form, m.eps), (Form::Hf, 1e-6));
        assert_eq!(m.nodes.len(), 8);
        assert_eq!(m.problem.shape_key(), "2x49x64");
        assert_eq!(g.values[m.weight].name, "w");
        assert_eq!(g.values[m.bias].name, "b");
        // timm's: x + addcmul(b, w, x * nf), the residual first; dims as negative indices.
        let timm = hf(
            "%m3, %m2",
            "%val = prim::Constant[1]()
               %u = aten::addcmul(%b, %w, %t, %val) : bf16[2,7,7,64]
               %y = aten::add(%x, %u, %one) : bf16[2,7,7,64]",
        )
        .replace(
            "%m1 = prim::Constant[-1]()",
            "%m1 = prim::Constant[-1]()\n %m3 = prim::Constant[-3]()\n %m2 = prim::Constant[-2]()",
        );
        let g = Graph::parse(&timm).unwrap();
        let m = &match_grns(&g)[0];
        assert_eq!(m.form, Form::Addcmul);
        assert_eq!(m.nodes.len(), 7);
    }

    #[test]
    fn other_norms_and_escaping_intermediates_do_not_match() {
        // Over H alone, or over the channels: no GRN.
        for dims in ["%one", "%two, %m1"] {
            let g = Graph::parse(&hf(dims, HF_TAIL)).unwrap();
            assert!(match_grns(&g).is_empty(), "{dims}");
        }
        // nf read by something else too.
        let escaping = hf("%one, %two", HF_TAIL).replace(
            "return (%y)",
            "%z = aten::neg(%nf) : bf16[2,1,1,64]\n return (%y, %z)",
        );
        assert!(match_grns(&Graph::parse(&escaping).unwrap()).is_empty());
        // A weight of the wrong width, and a sum whose residual is another tensor.
        let wide = hf("%one, %two", HF_TAIL).replace("%w: bf16[1,1,1,64]", "%w: bf16[1,1,7,64]");
        assert!(match_grns(&Graph::parse(&wide).unwrap()).is_empty());
        let other =
            hf("%one, %two", HF_TAIL).replace("aten::add(%v, %x, %one)", "aten::add(%v, %t, %one)");
        assert!(match_grns(&Graph::parse(&other).unwrap()).is_empty());
    }
}
