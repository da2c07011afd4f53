//! The graph edit: what a kind's rewrite of its pattern is (`kinds::Kind::edit`), as every back
//! end reads it. A pattern's nodes give way to one call of the kind's op, whose operands are graph
//! values, constants, or buffers the rewrite makes once from module attributes (a padded weight,
//! interleaved gate and up projections, a convolution with its BatchNorm folded in). Node and value
//! ids are the graph's own (`Graph::nodes`, `Graph::values`), taken before any edit. Plain data:
//! src/torch hands it to the cxx bridge in the bridge's own struct.

/// How an operand of a custom-op call is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandKind {
    /// The graph value `value`.
    Value,
    /// A string constant `text`.
    Str,
    /// An int constant `int_value`.
    Int,
    /// The None constant (an absent optional).
    None,
    /// A Tensor[] built from the graph values `values` (may be empty).
    Values,
    /// The module attribute the graph value `value` reads (a `prim::GetAttr` chain from the
    /// module), padded with zeros along its first dim to `int_value` rows: a buffer the
    /// rewrite adds to the composed module once, whatever reads it.
    Padded,
    /// The module attributes the two graph values `values` read, interleaved along their
    /// first dim in blocks of `int_value` rows: a buffer the rewrite adds once. One value:
    /// the two halves (along the first dim) of the attribute it reads.
    Interleaved,
    /// A convolution's weight or bias with an eval-mode BatchNorm folded in, from the module
    /// attributes `values` reads: [weight, bias, γ, β, mean, var], each absent one `ABSENT`,
    /// the BatchNorm's eps as `text` (empty without a BatchNorm). `int_value` 0 makes the
    /// bias; a positive one the weight with that many input channels, those past the
    /// weight's own zero (a stem's C = 3 padded to 16-byte rows), laid out channels-last
    /// (KRSC), the kernels' layout: a buffer the rewrite adds once.
    Folded,
    /// The module attributes graph values `values` read (one dtype, and one shape past their
    /// first dim), concatenated along their first dim: a buffer the rewrite adds once.
    Concatenated,
}

/// One operand of the call: its kind says which of the other fields it reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Operand {
    pub kind: OperandKind,
    pub value: u32,
    pub text: String,
    pub int_value: i64,
    pub values: Vec<u32>,
}

/// Replaces the pattern ending at node `node` (whose output the call takes over) by one call
/// of `op`. `remove` are the pattern's other nodes, each of kind `remove_kinds[i]`: they are
/// destroyed after the call took over, and must have no uses left by then.
///
/// A pattern with several outputs names the further nodes whose (single) outputs the call's
/// later outputs take over, in order, in `outputs` (each of kind `output_kinds[i]`); the op
/// then returns that many tensors more, and the call goes where the latest of these nodes and
/// `node` was, so every output but that node's must be read only after it. Empty for the
/// usual one output. `first` puts the call where the earliest of these nodes was instead (each
/// operand must be defined there; sibling linears, whose earlier outputs are read before the
/// later ones exist). `Default` leaves every list empty and `first` false: kinds spell only
/// what they fill.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Edit {
    pub node: u32,
    pub expect_kind: String,
    pub op: String,
    pub operands: Vec<Operand>,
    pub remove: Vec<u32>,
    pub remove_kinds: Vec<String>,
    pub outputs: Vec<u32>,
    pub output_kinds: Vec<String>,
    pub first: bool,
}

/// An absent value among an operand's `values` (`Operand::folded`).
pub const ABSENT: u32 = u32::MAX;

/// The module attributes a folded convolution operand is made of (graph values reading them).
#[derive(Clone, Debug, PartialEq)]
pub struct Fold {
    pub weight: usize,
    /// The input channels of the folded weight: the weight's own, or more, padded with zeros.
    pub channels: i64,
    pub bias: Option<usize>,
    pub bn: Option<FoldBn>,
}

/// An eval-mode BatchNorm's attributes (γ and β absent for `affine=False`) and its eps.
#[derive(Clone, Debug, PartialEq)]
pub struct FoldBn {
    pub weight: Option<usize>,
    pub bias: Option<usize>,
    pub mean: usize,
    pub var: usize,
    pub eps: f64,
}

/// One constructor per operand kind of a graph edit.
impl Operand {
    fn of(kind: OperandKind) -> Operand {
        Operand {
            kind,
            value: 0,
            text: String::new(),
            int_value: 0,
            values: vec![],
        }
    }
    /// Graph value `v` (a `load_graph` id).
    pub fn value(v: usize) -> Operand {
        Operand {
            value: v as u32,
            ..Operand::of(OperandKind::Value)
        }
    }
    /// The None constant (an absent optional).
    pub fn none() -> Operand {
        Operand::of(OperandKind::None)
    }
    /// Graph value `v` when there is one, else None.
    pub fn optional(v: Option<usize>) -> Operand {
        v.map_or_else(Operand::none, Operand::value)
    }
    /// A string constant.
    pub fn text(s: &str) -> Operand {
        Operand {
            text: s.to_string(),
            ..Operand::of(OperandKind::Str)
        }
    }
    /// The module attribute graph value `v` reads, padded with zeros to `rows` rows, as a buffer
    /// of the composed module.
    pub fn padded(v: usize, rows: i64) -> Operand {
        Operand {
            value: v as u32,
            int_value: rows,
            ..Operand::of(OperandKind::Padded)
        }
    }
    /// The module attributes graph values `a` and `b` read (one shape), interleaved along their
    /// first dim in blocks of `block` rows, as a buffer of the composed module.
    pub fn interleaved(a: usize, b: usize, block: i64) -> Operand {
        Operand {
            values: vec![a as u32, b as u32],
            int_value: block,
            ..Operand::of(OperandKind::Interleaved)
        }
    }
    /// The module attribute graph value `v` reads, its first and second halves (along its first
    /// dim) interleaved in blocks of `block` rows, as a buffer of the composed module: a fused
    /// gate-and-up weight as two weights' `interleaved`.
    pub fn interleaved_halves(v: usize, block: i64) -> Operand {
        Operand {
            values: vec![v as u32],
            int_value: block,
            ..Operand::of(OperandKind::Interleaved)
        }
    }
    /// A convolution's weight (`bias` false) or bias (true) with an eval-mode BatchNorm folded
    /// in, as a buffer of the composed module: w' = w·γ/√(var+eps) in the kernels' channels-last
    /// layout with `fold.channels` input channels (zero past the weight's own), b' = (b −
    /// mean)·γ/√(var+eps) + β, computed once in fp64 from the module's attributes `fold` names,
    /// and rounded to their dtype.
    pub fn folded(bias: bool, fold: &Fold) -> Operand {
        let id = |v: Option<usize>| v.map_or(ABSENT, |v| v as u32);
        let (bn, eps) = match &fold.bn {
            Some(bn) => (
                [
                    id(bn.weight),
                    id(bn.bias),
                    id(Some(bn.mean)),
                    id(Some(bn.var)),
                ],
                format!("{:?}", bn.eps),
            ),
            None => ([ABSENT; 4], String::new()),
        };
        let mut values = vec![fold.weight as u32, id(fold.bias)];
        values.extend(bn);
        Operand {
            values,
            text: eps,
            int_value: if bias { 0 } else { fold.channels },
            ..Operand::of(OperandKind::Folded)
        }
    }
    /// An int constant.
    pub fn int(v: i64) -> Operand {
        Operand {
            int_value: v,
            ..Operand::of(OperandKind::Int)
        }
    }
    /// The module attributes graph values `vs` read, concatenated along their first dim, as a
    /// buffer of the composed module.
    pub fn concatenated(vs: &[usize]) -> Operand {
        Operand {
            values: vs.iter().map(|&v| v as u32).collect(),
            ..Operand::of(OperandKind::Concatenated)
        }
    }
    /// A Tensor[] of graph values.
    pub fn values(vs: &[usize]) -> Operand {
        Operand {
            values: vs.iter().map(|&v| v as u32).collect(),
            ..Operand::of(OperandKind::Values)
        }
    }
}
