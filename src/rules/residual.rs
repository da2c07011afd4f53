//! The residual add before a norm, which the norm kinds (LayerNorm, RMSNorm) take into their
//! kernel: `s = a + b`, then the norm of s, as one kernel that reads a and b once, writes the norm's
//! y, and writes s too where the graph reads it elsewhere (the next layer's residual). Each norm
//! kind's rule finds its norm and asks `residual_add` for the add before its input; the kind's
//! problem carries the `Residual` (its rule id, and so its table key, says the add, the dtypes and
//! whether s is written).
//!
//! Math: s = round_Ts(a' + b'), the sum in fp32 rounded to the add's dtype Ts as torch's add
//! rounds, where a' is a cast to Ts (exact: type promotion widens), b' likewise; the norm then reads
//! x = s cast to its own dtype D (s itself unless the graph casts it: a residual stream kept in
//! fp32 before a bf16 norm). Each operand is broadcast over the leading dims only (its last dim is
//! the norm's C): BERT's and GPT-2's position embeddings are one row per position for every
//! sequence of the batch.
//!
//! Spellings: `aten::add(a, b, alpha=1)` either way round; between the sum and the norm, the
//! transparent nodes that keep its shape (`views::pass`: GPT-2's eval dropout after the
//! embeddings' sum) and at most one cast to another dtype. An operand that went through a cast
//! (`residual + h.to(residual.dtype)`, Gemma's `type_as` at the end of the norm before the add)
//! is read as the cast wrote it: the cast stays the graph's, or the pattern's it ends (a norm's
//! output written in the narrow dtype is cheaper to read than its fp32 value, and taking the cast
//! would cut that norm's pattern short). A shape change between the sum and the norm is not taken
//! (the op returns y and s in the sum's shape).
//!
//! The sum is written where the add's own output is read outside the pattern, and only where
//! every such reader comes after the norm's last node (the op's call stands there). A node between
//! the add and the norm that the rest of the graph reads too (GPT-2's and ViT's eval dropout after
//! their embeddings' sum, read again as the first residual; an fp32 trace's `to(float32)`, RMSNorm's
//! upcast, read as the next residual) leaves the add to torch: the call could only take its
//! output over, and other patterns read through such nodes to the tensor they respell (a GEMM's
//! residual leaf is the add's output, `views::source`), which the rewrite would have removed.
//!
//! What the cover decides, not this module: an add that a GEMM's epilogue can take too (Llama's o
//! and down projections, GPT-2's c_proj, BERT's output denses) goes to the GEMM, whose match
//! replaces a product (`cover.rs`). That is also the cheaper of the two: the epilogue writes s
//! once where the GEMM would otherwise write its output and the norm kernel read it back, so the
//! GEMM with the add moves one pass less than the GEMM alone and the add with the norm where s is
//! read again (the next residual), and as many where it is not.

use super::views::{self, Pass, Readers};
use crate::graph::{Const, Graph, NodeId, ValueId};
use crate::types::DType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The add before a norm, as a norm problem carries it (part of the table key through the rule
/// id): the dtypes the kernel reads and writes, and whether it writes the sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Residual {
    /// The operands' dtypes as the kernel reads them, in `DType`'s order (the add commutes, so
    /// `h + r` and `r + h` are one problem).
    pub a: DType,
    pub b: DType,
    /// The add's dtype: what the sum is rounded to (and written in).
    pub sum: DType,
    /// Whether the kernel writes the sum: the graph reads it outside the pattern.
    pub writes_sum: bool,
}

impl Residual {
    /// The add with every tensor in the norm's dtype.
    pub fn plain(dtype: DType, writes_sum: bool) -> Residual {
        Residual {
            a: dtype,
            b: dtype,
            sum: dtype,
            writes_sum,
        }
    }

    /// A norm rule id with the add: `add_` before it (`add_<a>_<b>_<sum>_` where a tensor of the
    /// add is not in the norm's dtype `norm`), `_sum` after it where the sum is written:
    /// `add_rmsnorm_cast_weight_sum`, `add_f32_bf16_f32_rmsnorm_weight`.
    pub fn rule_id(&self, norm: DType, rule: &str) -> String {
        let dtypes = if [self.a, self.b, self.sum].iter().all(|&d| d == norm) {
            String::new()
        } else {
            format!(
                "{}_{}_{}_",
                self.a.short_name(),
                self.b.short_name(),
                self.sum.short_name()
            )
        };
        let sum = if self.writes_sum { "_sum" } else { "" };
        format!("add_{dtypes}{rule}{sum}")
    }

    /// A rule id split into the add it names (None without `add_`) and the norm's own rule id;
    /// `norm` is the problem's dtype (the add's where the id names none). An error names the
    /// form an id with the add takes.
    pub fn split_rule(rule: &str, norm: DType) -> Result<(Option<Residual>, &str), String> {
        let Some(rest) = rule.strip_prefix("add_") else {
            return Ok((None, rule));
        };
        let (rest, writes_sum) = match rest.strip_suffix("_sum") {
            Some(r) => (r, true),
            None => (rest, false),
        };
        let parts: Vec<&str> = rest.splitn(4, '_').collect();
        let dtypes: Option<Vec<DType>> = parts.iter().take(3).map(|p| DType::parse(p)).collect();
        match dtypes {
            Some(d) if parts.len() == 4 => Ok((
                Some(Residual {
                    a: d[0].min(d[1]),
                    b: d[0].max(d[1]),
                    sum: d[2],
                    writes_sum,
                }),
                parts[3],
            )),
            _ if !rest.is_empty() => Ok((Some(Residual::plain(norm, writes_sum)), rest)),
            _ => Err(format!(
                "'{rule}': an add before a norm is add_[A_B_SUM_]<norm rule>[_sum], e.g. add_rmsnorm_weight_sum"
            )),
        }
    }

    /// Bytes the add moves in a fused kernel over `rows` x `cols`: a and b read once, the sum
    /// written where it is.
    pub fn bytes(&self, rows: i64, cols: i64) -> f64 {
        let n = (rows * cols) as f64;
        let sum = if self.writes_sum { self.sum.bytes() } else { 0 };
        n * (self.a.bytes() + self.b.bytes() + sum) as f64
    }

    /// What a kernel compiles in: the dtypes (one kernel writes the sum or not, as it is asked).
    pub fn dtypes(&self) -> AddDtypes {
        AddDtypes {
            a: self.a,
            b: self.b,
            sum: self.sum,
        }
    }
}

/// The add's dtypes as a norm kernel compiles them in (a field of its spec, a part of its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddDtypes {
    pub a: DType,
    pub b: DType,
    pub sum: DType,
}

impl AddDtypes {
    /// The kernel name's part: `_add`, or `_add_<a>_<b>_<sum>` where a tensor of the add is not
    /// in the norm's dtype `norm`.
    pub fn name_suffix(&self, norm: DType) -> String {
        if [self.a, self.b, self.sum].iter().all(|&d| d == norm) {
            "_add".into()
        } else {
            format!(
                "_add_{}_{}_{}",
                self.a.short_name(),
                self.b.short_name(),
                self.sum.short_name()
            )
        }
    }
}

/// The add a norm rule found before its input, with the nodes the pattern takes with it.
#[derive(Clone, Debug, PartialEq)]
pub struct ResidualAdd {
    /// The `aten::add` node.
    pub add: NodeId,
    /// What the kernel reads: the add's operands; `a` is the one of `residual.a`'s dtype.
    pub a: ValueId,
    pub b: ValueId,
    /// The nodes the pattern takes besides the norm's, other than `sum`: the add and the nodes
    /// between it and the norm; in program order.
    pub nodes: Vec<NodeId>,
    /// The add, where the rest of the graph reads its output: the op's second output takes it
    /// over.
    pub sum: Option<NodeId>,
    pub residual: Residual,
}

fn number(g: &Graph, v: ValueId) -> Option<f64> {
    g.constant(v).and_then(Const::as_f64)
}

/// The add before the norm whose input is `x` and whose nodes are `norm` (its last node the one
/// the op's call replaces), if the graph has one the module doc describes.
pub fn residual_add(
    g: &Graph,
    readers: &Readers,
    x: ValueId,
    norm: &BTreeSet<NodeId>,
) -> Option<ResidualAdd> {
    let tx = g.tensor(x)?;
    let norm_dtype = DType::parse(&tx.dtype)?;
    let cols = *tx.shape.last()?;
    let end = *norm.iter().max()?;
    // Back from x to the add: transparent nodes keeping the shape, and at most one cast.
    let mut chain: Vec<NodeId> = Vec::new();
    let mut cast = false;
    let mut v = x;
    let add = loop {
        let p = g.values[v].producer?;
        let n = &g.nodes[p];
        if n.depth != 0 || norm.contains(&p) {
            return None;
        }
        if n.kind == "aten::add" {
            break p;
        }
        let from = if views::pass(g, p) == Some(Pass::Same) {
            n.inputs[0]
        } else if !cast {
            cast = true;
            views::dtype_cast(g, p)?
        } else {
            return None;
        };
        if g.tensor(from)?.shape != tx.shape {
            return None;
        }
        chain.push(p);
        v = from;
    };
    let an = &g.nodes[add];
    if an.inputs.len() != 3 || an.outputs.len() != 1 || number(g, an.inputs[2]) != Some(1.0) {
        return None;
    }
    let s = an.outputs[0];
    let ts = g.tensor(s)?;
    let sum_dtype = DType::parse(&ts.dtype)?;
    if ts.shape != tx.shape || (!cast && sum_dtype != norm_dtype) {
        return None;
    }
    // An operand: a tensor broadcast over the leading dims only.
    let operand = |v: ValueId| -> Option<DType> {
        let t = g.tensor(v).filter(|_| g.constant(v).is_none())?;
        let rank = ts.shape.len();
        if t.shape.last() != Some(&cols) || t.shape.len() > rank {
            return None;
        }
        let lead = &ts.shape[rank - t.shape.len()..];
        if t.shape.iter().zip(lead).any(|(&d, &e)| d != 1 && d != e) {
            return None;
        }
        DType::parse(&t.dtype)
    };
    let (mut a, mut b) = (an.inputs[0], an.inputs[1]);
    let (mut da, mut db) = (operand(a)?, operand(b)?);
    let mut nodes: BTreeSet<NodeId> = chain.iter().copied().collect();
    nodes.insert(add);
    let inside: BTreeSet<NodeId> = nodes.union(norm).copied().collect();
    // The nodes between the add and the norm are the pattern's alone; the sum is read elsewhere
    // only after the norm (see the module doc).
    if chain.iter().any(|&c| {
        g.nodes[c]
            .outputs
            .iter()
            .any(|&o| readers.escapes(o, &inside))
    }) || readers.outside(s, &inside).any(|u| u < end)
    {
        return None;
    }
    let sum = readers.escapes(s, &inside).then_some(add);
    if da > db {
        std::mem::swap(&mut a, &mut b);
        std::mem::swap(&mut da, &mut db);
    }
    if let Some(s) = sum {
        nodes.remove(&s);
    }
    Some(ResidualAdd {
        add,
        a,
        b,
        nodes: nodes.into_iter().collect(),
        sum,
        residual: Residual {
            a: da,
            b: db,
            sum: sum_dtype,
            writes_sum: sum.is_some(),
        },
    })
}

#[cfg(test)]
mod tests;
