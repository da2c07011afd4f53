//! The graph IR every later stage reads: nodes in program order, values with dtype, shape and
//! strides when known, constants decoded. It never touches libtorch, the GPU or the disk: src/torch
//! fills it from an archive, and tests write it as text (`Graph::parse`) in a TorchScript-like
//! notation.

pub mod edit;

pub use edit::{Edit, Fold, FoldBn, Operand, OperandKind, ABSENT};

use std::collections::HashMap;
use thiserror::Error;

pub type ValueId = usize;
pub type NodeId = usize;

#[derive(Debug, Error)]
pub enum GraphError {
    #[error("graph text line {line}: {msg}")]
    Parse { line: usize, msg: String },
}

/// A decoded `prim::Constant`.
#[derive(Clone, Debug, PartialEq)]
pub enum Const {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Ints(Vec<i64>),
    /// A one-element tensor constant (`{0.5}`), as tracing records a Python scalar in arithmetic.
    Tensor0(f64),
    Other(String),
}

impl Const {
    /// Decodes the bridge's constant notation (torch's IValue printing).
    pub fn parse(s: &str) -> Const {
        let s = s.trim();
        match s {
            "None" => return Const::None,
            "True" => return Const::Bool(true),
            "False" => return Const::Bool(false),
            _ => {}
        }
        if let Ok(i) = s.parse::<i64>() {
            return Const::Int(i);
        }
        if let Ok(f) = s.parse::<f64>() {
            return Const::Float(f);
        }
        if s.len() >= 2 && s.starts_with('"') && s.ends_with('"') {
            return Const::Str(s[1..s.len() - 1].to_string());
        }
        if let Some(v) = s
            .strip_prefix('{')
            .and_then(|r| r.strip_suffix('}'))
            .and_then(|r| r.trim().parse::<f64>().ok())
        {
            return Const::Tensor0(v);
        }
        if s.starts_with('[') && s.ends_with(']') {
            let inner = &s[1..s.len() - 1];
            let ints: Result<Vec<i64>, _> = inner
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(str::parse)
                .collect();
            if let Ok(v) = ints {
                return Const::Ints(v);
            }
        }
        Const::Other(s.to_string())
    }
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Const::Int(i) => Some(*i),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Const::Int(i) => Some(*i as f64),
            Const::Float(f) | Const::Tensor0(f) => Some(*f),
            _ => None,
        }
    }
}

/// Dtype, shape and strides of a tensor value, as seen when the graph ran on the example inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The bridge's dtype name (`f32`, `bf16`, `i64`, ...).
    pub dtype: String,
    pub shape: Vec<i64>,
    /// Elements between neighbours along each dim; empty when not recorded, which reads as packed
    /// row-major (what almost every op returns).
    pub strides: Vec<i64>,
}

/// Bytes of one element of a dtype the bridge names (`f32`, `i64`, `bool`, ...); 4 for one it
/// does not.
pub fn elem_bytes(dtype: &str) -> f64 {
    match dtype {
        "f64" | "i64" => 8.0,
        "bf16" | "f16" => 2.0,
        "bool" => 1.0,
        _ => 4.0,
    }
}

impl TensorInfo {
    /// Bytes the tensor's elements take (as if packed).
    pub fn bytes(&self) -> f64 {
        self.shape.iter().map(|&d| d as f64).product::<f64>() * elem_bytes(&self.dtype)
    }
    pub fn numel(&self) -> i64 {
        self.shape.iter().product()
    }
    /// Whether the elements lie packed in row-major order, as `is_contiguous` says (dims of size
    /// one lie either way).
    pub fn is_packed(&self) -> bool {
        is_packed(&self.shape, &self.strides())
    }
    /// The strides, or a packed row-major tensor's when none were recorded.
    pub fn strides(&self) -> Vec<i64> {
        if self.strides.len() == self.shape.len() {
            return self.strides.clone();
        }
        let mut out = vec![1; self.shape.len()];
        for d in (0..self.shape.len().saturating_sub(1)).rev() {
            out[d] = out[d + 1] * self.shape[d + 1].max(1);
        }
        out
    }
}

/// Whether `strides` lay out `shape` packed in row-major order (dims of size one lie either way).
pub fn is_packed(shape: &[i64], strides: &[i64]) -> bool {
    let mut want = 1;
    for d in (0..shape.len()).rev() {
        if shape[d] != 1 && strides[d] != want {
            return false;
        }
        want *= shape[d];
    }
    true
}

/// What is known of an attention mask's value: which keys each query sees. The bridge evaluates
/// the producers of every `scaled_dot_product_attention` mask at load and classifies the result
/// (bool masks: true = visible; additive float masks: 0 = visible, -inf or at most half the
/// dtype's lowest value = masked).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaskClass {
    /// Every key visible to every query.
    None,
    /// Key j visible to query i iff j ≤ i (aligned at the top left).
    Causal,
    /// Key j visible iff j < len[b]: a prefix per sequence, the same for every query and head
    /// (every len ≥ 1).
    Padded,
    /// Both: j ≤ i and j < len[b].
    CausalPadded,
    /// Anything else: another pattern, a query with no visible key, other additive values.
    General,
    /// Not evaluated (the producers read something the bridge cannot run or has no value of).
    Unknown,
}

impl MaskClass {
    pub const ALL: [MaskClass; 6] = [
        MaskClass::None,
        MaskClass::Causal,
        MaskClass::Padded,
        MaskClass::CausalPadded,
        MaskClass::General,
        MaskClass::Unknown,
    ];
    /// The name the bridge, the text notation and the op's form use.
    pub fn name(self) -> &'static str {
        match self {
            MaskClass::None => "none",
            MaskClass::Causal => "causal",
            MaskClass::Padded => "padded",
            MaskClass::CausalPadded => "causal_padded",
            MaskClass::General => "general",
            MaskClass::Unknown => "unknown",
        }
    }
    pub fn parse(s: &str) -> Option<MaskClass> {
        MaskClass::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// A mask value's class, and whether its producers read only the graph inputs' sizes (with
/// constants and module state): then its value is a function of the input shapes, classified at
/// the shapes the graph was loaded with; else it also reads input data, classified on the example
/// inputs the archive stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaskFact {
    pub class: MaskClass,
    pub shape_only: bool,
}

#[derive(Clone, Debug)]
pub struct Value {
    pub name: String,
    /// TorchScript type, e.g. `Tensor`, `int`, `__torch__.Model`.
    pub ty: String,
    pub tensor: Option<TensorInfo>,
    pub producer: Option<NodeId>,
    /// What is known of the value as an attention mask (set for the masks of SDPA calls).
    pub mask: Option<MaskFact>,
}

#[derive(Clone, Debug)]
pub struct Node {
    pub kind: String,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    pub constant: Option<Const>,
    /// 0 for the top-level block; nodes inside If/Loop bodies are deeper.
    pub depth: u32,
    /// The module path the node came from (`fc1`, `blocks.0.attn`), empty when unknown.
    pub scope: String,
    /// The composed module's memo computes it once per shape, not once per forward: fixed by the
    /// inputs' shapes and the module's buffers (the bridge's `memo_static_nodes`). A text graph
    /// marks one with a trailing `@memo`.
    pub memo: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// What shape propagation had to fall back on, if anything.
    pub note: String,
}

/// Whether op `kind` (`ns::name`) is a custom op some library registers: not torch's own (its
/// operators are in every libtorch of its version) nor fact's.
pub fn is_custom_op(kind: &str) -> bool {
    let Some((ns, _)) = kind.split_once("::") else {
        return false;
    };
    ![
        "aten",
        "prim",
        "prims",
        "quantized",
        "_quantized",
        "_c10d_functional",
        "c10d",
        "fact",
    ]
    .contains(&ns)
}

impl Graph {
    /// The custom ops the graph calls (`is_custom_op`), each once, sorted.
    pub fn custom_ops(&self) -> Vec<String> {
        let ops: std::collections::BTreeSet<&str> = self
            .nodes
            .iter()
            .map(|n| n.kind.as_str())
            .filter(|k| is_custom_op(k))
            .collect();
        ops.into_iter().map(str::to_string).collect()
    }

    pub fn tensor(&self, v: ValueId) -> Option<&TensorInfo> {
        self.values[v].tensor.as_ref()
    }

    /// The constant behind a value, when a `prim::Constant` produced it.
    pub fn constant(&self, v: ValueId) -> Option<&Const> {
        let n = self.values[v].producer?;
        self.nodes[n].constant.as_ref()
    }

    /// The ints a list operand holds: a constant list, or a `prim::ListConstruct` of int
    /// constants (as tracing records `nn.LayerNorm`'s normalized_shape or `nn.Conv2d`'s stride).
    pub fn int_list(&self, v: ValueId) -> Option<Vec<i64>> {
        if let Some(Const::Ints(v)) = self.constant(v) {
            return Some(v.clone());
        }
        let n = &self.nodes[self.values[v].producer?];
        if n.kind != "prim::ListConstruct" {
            return None;
        }
        n.inputs
            .iter()
            .map(|&i| self.constant(i).and_then(Const::as_int))
            .collect()
    }

    /// Whether `v` is read from the module: a chain of `prim::GetAttr` from the graph's first
    /// input (the module itself).
    pub fn is_attribute(&self, v: ValueId) -> bool {
        let mut at = v;
        while let Some(p) = self.values[at].producer {
            let n = &self.nodes[p];
            if n.kind != "prim::GetAttr" || n.inputs.len() != 1 {
                return false;
            }
            at = n.inputs[0];
        }
        at != v && self.inputs.first() == Some(&at)
    }

    /// How many nodes read each value.
    pub fn use_counts(&self) -> Vec<usize> {
        let mut uses = vec![0; self.values.len()];
        for n in &self.nodes {
            for &i in &n.inputs {
                uses[i] += 1;
            }
        }
        for &o in &self.outputs {
            uses[o] += 1;
        }
        uses
    }

    /// The nodes reading each value, in program order.
    pub fn readers(&self) -> Vec<Vec<NodeId>> {
        let mut readers = vec![Vec::new(); self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &v in &n.inputs {
                readers[v].push(i);
            }
        }
        readers
    }

    /// Parses the test notation:
    /// ```text
    /// graph(%self: Model, %x: f32[8,16], %w: f32[32,16]):
    ///   %none = prim::Constant[None]()
    ///   %y = aten::linear(%x, %w, %none) : f32[8,32]
    ///   return (%y)
    /// ```
    /// A value's annotation is `dtype[d0,d1,...]` for tensors (optionally followed by the strides,
    /// `f32[8,16]{1,8}` for the transpose of a packed [16,8]) or a bare type name otherwise. A
    /// mask's fact follows as `@class` (`bool[2,1,16,16] @causal`: its producers read input
    /// data) or `@class/shape` (a function of the input shapes), classes as `MaskClass::name`.
    pub fn parse(text: &str) -> Result<Graph, GraphError> {
        let mut g = Graph::default();
        let mut names: HashMap<String, ValueId> = HashMap::new();
        let err = |line: usize, msg: String| GraphError::Parse { line, msg };
        for (ln, raw) in text.lines().enumerate() {
            let line = raw.trim();
            let ln = ln + 1;
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix("graph(") {
                let inner = rest.trim_end_matches(':').trim_end_matches(')');
                for decl in split_top(inner) {
                    let id = declare(&mut g, &mut names, &decl, None).map_err(|m| err(ln, m))?;
                    g.inputs.push(id);
                }
                continue;
            }
            if let Some(rest) = line.strip_prefix("return") {
                let inner = rest.trim().trim_start_matches('(').trim_end_matches(')');
                for name in split_top(inner) {
                    let id = *names
                        .get(name.trim())
                        .ok_or_else(|| err(ln, format!("unknown value {name}")))?;
                    g.outputs.push(id);
                }
                continue;
            }
            let (line, memo) = match line.strip_suffix(" @memo") {
                Some(l) => (l, true),
                None => (line, false),
            };
            let (lhs, rhs) = line
                .split_once(" = ")
                .ok_or_else(|| err(ln, "expected `outs = kind(args)`".into()))?;
            let (call, annot) = match rhs.rsplit_once(") : ") {
                Some((c, a)) => (format!("{c})"), Some(a.trim().to_string())),
                None => (rhs.to_string(), None),
            };
            let open = call
                .find('(')
                .ok_or_else(|| err(ln, "missing `(`".into()))?;
            let mut kind = call[..open].trim().to_string();
            let mut constant = None;
            if let Some(b) = kind.find('[') {
                constant = Some(Const::parse(&kind[b + 1..kind.len() - 1]));
                kind.truncate(b);
            }
            let args = call[open + 1..call.len() - 1].trim();
            let mut inputs = Vec::new();
            for a in split_top(args) {
                let id = *names
                    .get(a.trim())
                    .ok_or_else(|| err(ln, format!("unknown value {a}")))?;
                inputs.push(id);
            }
            let node_id = g.nodes.len();
            let annots: Vec<String> = annot.map(|a| split_top(&a)).unwrap_or_default();
            let mut outputs = Vec::new();
            for (i, o) in split_top(lhs).into_iter().enumerate() {
                let decl = match annots.get(i) {
                    Some(a) => format!("{o}: {a}"),
                    None => o,
                };
                outputs.push(
                    declare(&mut g, &mut names, &decl, Some(node_id)).map_err(|m| err(ln, m))?,
                );
            }
            g.nodes.push(Node {
                kind,
                inputs,
                outputs,
                constant,
                depth: 0,
                scope: String::new(),
                memo,
            });
        }
        Ok(g)
    }
}

fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '[' | '(' | '{' => depth += 1,
            ']' | ')' | '}' => depth -= 1,
            ',' if depth == 0 => {
                if !cur.trim().is_empty() {
                    out.push(cur.trim().to_string());
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

fn declare(
    g: &mut Graph,
    names: &mut HashMap<String, ValueId>,
    decl: &str,
    producer: Option<NodeId>,
) -> Result<ValueId, String> {
    let (name, annot) = match decl.split_once(':') {
        Some((n, a)) => (n.trim(), Some(a.trim())),
        None => (decl.trim(), None),
    };
    if !name.starts_with('%') {
        return Err(format!("value names start with %: {name}"));
    }
    let (annot, mask) = match annot.and_then(|a| a.split_once('@')) {
        Some((a, fact)) => {
            let (class, shape_only) = match fact.trim().strip_suffix("/shape") {
                Some(c) => (c, true),
                None => (fact.trim(), false),
            };
            let class = MaskClass::parse(class)
                .ok_or_else(|| format!("unknown mask class '{class}' in {decl}"))?;
            (Some(a.trim()), Some(MaskFact { class, shape_only }))
        }
        None => (annot, None),
    };
    let (ty, tensor) = match annot {
        Some(a) if a.contains('[') => {
            let (dt, rest) = a.split_once('[').unwrap();
            let (shape, strides) = rest
                .split_once(']')
                .ok_or_else(|| format!("unclosed shape in {a}"))?;
            let ints = |text: &str| -> Result<Vec<i64>, String> {
                text.split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("bad dims in {a}: {e}"))
            };
            let dims = ints(shape)?;
            let strides = match strides.trim() {
                "" => vec![],
                s => ints(
                    s.strip_prefix('{')
                        .and_then(|s| s.strip_suffix('}'))
                        .ok_or_else(|| format!("strides go in braces after the shape: {a}"))?,
                )?,
            };
            if !strides.is_empty() && strides.len() != dims.len() {
                return Err(format!(
                    "{a}: {} strides for {} dims",
                    strides.len(),
                    dims.len()
                ));
            }
            (
                "Tensor".to_string(),
                Some(TensorInfo {
                    dtype: dt.trim().to_string(),
                    shape: dims,
                    strides,
                }),
            )
        }
        Some(a) => (a.to_string(), None),
        None => ("Tensor".to_string(), None),
    };
    let id = g.values.len();
    g.values.push(Value {
        name: name.trim_start_matches('%').to_string(),
        ty,
        tensor,
        producer,
        mask,
    });
    names.insert(name.to_string(), id);
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_ops_are_other_libraries_ops_each_once() {
        let g = Graph::parse(
            "graph(%self: M, %x: f32[8,16]):
               %a = mylib::scaled(%x)
               %b = aten::relu(%a)
               %c = mylib::scaled(%b)
               %d = fact::gemm(%c)
               %e = transformers::grouped_mm_fallback(%d)
               return (%e)",
        )
        .unwrap();
        assert_eq!(
            g.custom_ops(),
            ["mylib::scaled", "transformers::grouped_mm_fallback"]
        );
        assert!(
            !is_custom_op("prim::ListConstruct") && !is_custom_op("_c10d_functional::all_reduce")
        );
    }

    #[test]
    fn parses_text_graph_with_shapes_and_constants() {
        let g = Graph::parse(
            "graph(%self: M, %x: f32[8,16], %w: f32[32,16]):
               %none = prim::Constant[None]()
               %two = prim::Constant[[0, 1]]()
               %y = aten::linear(%x, %w, %none) : f32[8,32]
               return (%y)",
        )
        .unwrap();
        assert_eq!(g.inputs.len(), 3);
        assert_eq!(g.nodes.len(), 3);
        assert_eq!(g.nodes[1].constant, Some(Const::Ints(vec![0, 1])));
        let y = g.outputs[0];
        assert_eq!(g.tensor(y).unwrap().shape, vec![8, 32]);
        assert_eq!(g.constant(g.nodes[2].inputs[2]), Some(&Const::None));
        assert_eq!(g.use_counts()[y], 1);
    }

    #[test]
    fn strides_are_read_after_the_shape_and_default_to_packed() {
        let g = Graph::parse(
            "graph(%x: f32[16,8]):
               %t = aten::t(%x) : f32[8,16]{1,8}
               return (%t)",
        )
        .unwrap();
        assert_eq!(g.tensor(g.inputs[0]).unwrap().strides(), vec![8, 1]);
        let t = g.tensor(g.outputs[0]).unwrap();
        assert_eq!((t.shape.clone(), t.strides()), (vec![8, 16], vec![1, 8]));
        assert!(Graph::parse("graph(%x: f32[2,2]{1}):\n")
            .unwrap_err()
            .to_string()
            .contains("1 strides for 2 dims"));
    }

    #[test]
    fn mask_facts_follow_the_annotation() {
        let g = Graph::parse(
            "graph(%am: i64[2,16] @padded, %x: f32[2,16]):
               %m = aten::expand(%am) : bool[2,1,16,16] @causal_padded/shape
               return (%m)",
        )
        .unwrap();
        let fact = |v: usize| g.values[v].mask;
        assert_eq!(
            fact(g.inputs[0]),
            Some(MaskFact {
                class: MaskClass::Padded,
                shape_only: false
            })
        );
        assert_eq!(fact(g.inputs[1]), None);
        let m = fact(g.outputs[0]).unwrap();
        assert_eq!((m.class, m.shape_only), (MaskClass::CausalPadded, true));
        assert_eq!(g.tensor(g.outputs[0]).unwrap().shape, vec![2, 1, 16, 16]);
        assert!(Graph::parse("graph(%m: bool[2] @lower):\n")
            .unwrap_err()
            .to_string()
            .contains("unknown mask class 'lower'"));
        for c in MaskClass::ALL {
            assert_eq!(MaskClass::parse(c.name()), Some(c));
        }
    }

    #[test]
    fn unknown_value_is_an_error_with_line() {
        let e = Graph::parse("graph(%x: f32[2,2]):\n  %y = aten::mm(%x, %z)\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn constants_decode_like_torch_prints_them() {
        assert_eq!(Const::parse("1"), Const::Int(1));
        assert_eq!(Const::parse("0.5"), Const::Float(0.5));
        assert_eq!(
            Const::parse("{0.044715}").as_f64(),
            Some(0.044715),
            "a traced scalar is a 0-d tensor constant"
        );
        assert_eq!(Const::parse("\"tanh\""), Const::Str("tanh".into()));
        assert_eq!(Const::parse("cpu"), Const::Other("cpu".into()));
    }
}
