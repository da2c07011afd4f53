//! The graph rewrite of each pattern kind: which node its op replaces, with which operands, and
//! which nodes it removes.

use super::*;

/// The rewrite of a match: `fact::gemm(a, b, bias?, origin, kernel)` in place of the GEMM node,
/// or, for a fused pattern, `fact::gemm_ep(a, b, bias?, [leaves], origin, epilogue, kernel)` in
/// place of its last node, the GEMM and the other epilogue nodes removed (the transparent nodes it
/// owns among them: a flattening view of a it reads unflattened, views of its leaves).
/// A GEMM whose weight compose pads (`rules::WeightPad`) calls `fact::gemm(a, w_padded,
/// bias_padded?, "linear;n=N", kernel)` on buffers the rewrite adds to the module: the op returns
/// the first N columns, its fallback runs linear on the first N rows of each (the module's own
/// tensors, exactly: `x @ w.t()` and `addmm(bias, x, w.t())` are what linear computes).
pub fn gemm_edit(g: &Graph, m: &GemmMatch, kernel: &str) -> Edit {
    if let Some(pad) = m.applied_pad() {
        let to = pad.to;
        return Edit {
            node: m.node as u32,
            expect_kind: m.origin.aten_kind().to_string(),
            op: "fact::gemm".to_string(),
            operands: vec![
                Operand::value(m.a),
                Operand::padded(pad.weight, to),
                pad.bias
                    .map_or_else(Operand::none, |b| Operand::padded(b, to)),
                Operand::text(&format!("linear;n={}", pad.from)),
                Operand::text(kernel),
            ],
            remove: pad.view.iter().map(|&v| v as u32).collect(),
            remove_kinds: pad.view.iter().map(|&v| g.nodes[v].kind.clone()).collect(),
        };
    }
    let bias = Operand::optional(m.bias);
    let Some(ep) = &m.epilogue else {
        return Edit {
            node: m.node as u32,
            expect_kind: m.origin.aten_kind().to_string(),
            op: "fact::gemm".to_string(),
            operands: vec![
                Operand::value(m.a),
                Operand::value(m.b),
                bias,
                Operand::text(m.origin.name()),
                Operand::text(kernel),
            ],
            remove: vec![],
            remove_kinds: vec![],
        };
    };
    let nodes = m.nodes();
    let (last, rest) = nodes.split_last().expect("a pattern has nodes");
    let leaves = Operand::values(&ep.leaves);
    Edit {
        node: *last as u32,
        expect_kind: g.nodes[*last].kind.clone(),
        op: "fact::gemm_ep".to_string(),
        operands: vec![
            Operand::value(m.operand_a()),
            Operand::value(m.b),
            bias,
            leaves,
            Operand::text(m.origin.name()),
            Operand::text(&ep.epilogue.text()),
            Operand::text(kernel),
        ],
        remove: rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
    }
}

/// The rewrite of an attention match: `fact::attention(q, k, v, mask?, scale?, form, kernel)` in place of
/// its last node, the pattern's other nodes removed.
pub fn attention_edit(g: &Graph, a: &AttentionMatch, kernel: &str) -> Edit {
    let (last, rest) = a.nodes.split_last().expect("a pattern has nodes");
    Edit {
        node: *last as u32,
        expect_kind: g.nodes[*last].kind.clone(),
        op: "fact::attention".to_string(),
        operands: vec![
            Operand::value(a.q),
            Operand::value(a.k),
            Operand::value(a.v),
            Operand::optional(a.mask.map(|(m, _)| m)),
            Operand::optional(a.scale_operand()),
            Operand::text(&a.form()),
            Operand::text(kernel),
        ],
        remove: rest.iter().map(|&n| n as u32).collect(),
        remove_kinds: rest.iter().map(|&n| g.nodes[n].kind.clone()).collect(),
    }
}

/// The rewrite of a LayerNorm match: `fact::layernorm(x, normalized_shape, weight?, bias?, eps,
/// kernel)` in place of the `aten::layer_norm` node, its operands the node's own (the fallback
/// replays the call with them).
pub fn layernorm_edit(g: &Graph, l: &LayerNormMatch, kernel: &str) -> Edit {
    Edit {
        node: l.node as u32,
        expect_kind: g.nodes[l.node].kind.clone(),
        op: "fact::layernorm".to_string(),
        operands: vec![
            Operand::value(l.x),
            Operand::value(l.normalized_shape),
            Operand::optional(l.weight),
            Operand::optional(l.bias),
            Operand::value(l.eps),
            Operand::text(kernel),
        ],
        remove: vec![],
        remove_kinds: vec![],
    }
}
