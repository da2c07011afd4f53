//! Pattern rules: pure matchers from the graph IR to the subgraphs fact can replace. No rule
//! touches libtorch, the GPU or the disk. Each rule's module doc states its math.
//!
//! Pattern kinds:
//! - a GEMM (`gemm.rs`) and, where the graph allows, the elementwise epilogue that follows it
//!   (`epilogue.rs`), the plain GEMM always available as the fallback when the fused pattern
//!   cannot be realized;
//! - attention (`attention.rs`): q·kᵀ, scale, mask, softmax and ·v as one pattern;
//! - LayerNorm over the last dim (`layernorm.rs`), one node.
//!
//! `match_patterns` returns a non-overlapping cover of the graph by all kinds.

pub mod attention;
pub mod epilogue;
pub mod gemm;
pub mod layernorm;

pub use attention::{match_attention, AttentionMatch, AttentionProblem};
pub use epilogue::{match_epilogue, EpOp, Epilogue, EpilogueMatch, LeafKind};
pub use gemm::{major, match_gemms, GemmLayout, GemmMatch, GemmOrigin, GemmProblem, Major};
pub use layernorm::{match_layernorms, LayerNormMatch, LayerNormProblem};

use crate::graph::Graph;
use serde::{Deserialize, Serialize};

/// The problem of any pattern kind: what a table entry and a tuning request carry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Problem {
    Gemm(GemmProblem),
    Attention(AttentionProblem),
    /// Last: untagged, a LayerNorm problem's fields (rows, cols) are none of the others'.
    LayerNorm(LayerNormProblem),
}

impl Problem {
    pub fn rule_id(&self) -> String {
        match self {
            Problem::Gemm(p) => p.rule_id(),
            Problem::Attention(p) => p.rule_id(),
            Problem::LayerNorm(p) => p.rule_id(),
        }
    }
    pub fn shape_key(&self) -> String {
        match self {
            Problem::Gemm(p) => p.shape_key(),
            Problem::Attention(p) => p.shape_key(),
            Problem::LayerNorm(p) => p.shape_key(),
        }
    }
    pub fn flops(&self) -> f64 {
        match self {
            Problem::Gemm(p) => p.flops(),
            Problem::Attention(p) => p.flops(),
            Problem::LayerNorm(p) => p.flops(),
        }
    }
    pub fn dtype(&self) -> crate::types::DType {
        match self {
            Problem::Gemm(p) => p.dtype,
            Problem::Attention(p) => p.dtype,
            Problem::LayerNorm(p) => p.dtype,
        }
    }
    /// The problem's alignment class: which kernels can run it (in its own elements, 16 bytes
    /// at most for a GEMM). Table entries serve another shape of their bucket only within one class.
    pub fn alignment(&self) -> u32 {
        match self {
            Problem::Gemm(p) => p.alignment(16 / p.dtype.bytes() as u32),
            Problem::Attention(p) => p.alignment(),
            Problem::LayerNorm(p) => p.alignment(),
        }
    }
    pub fn kind(&self) -> PatternKind {
        match self {
            Problem::Gemm(p) if p.epilogue.is_some() => PatternKind::Epilogue,
            Problem::Gemm(_) => PatternKind::Gemm,
            Problem::Attention(_) => PatternKind::Attention,
            Problem::LayerNorm(_) => PatternKind::LayerNorm,
        }
    }
    pub fn as_gemm(&self) -> Option<&GemmProblem> {
        match self {
            Problem::Gemm(p) => Some(p),
            Problem::Attention(_) | Problem::LayerNorm(_) => None,
        }
    }
    /// The math a kernel for the problem performs under `precision`: for fp32 tensors the policy's
    /// for products (GEMMs, attention), fp32 itself for a LayerNorm, which computes no product
    /// the policy could lower (so one table entry serves both policies, and it is judged at
    /// fp32's tolerance); None where no kernel family computes the combination.
    pub fn math(&self, precision: crate::types::Precision) -> Option<crate::types::MathType> {
        match self {
            Problem::LayerNorm(p) => Some(crate::types::MathType::elementwise(p.dtype)),
            _ => crate::types::MathType::for_tensor(self.dtype(), precision),
        }
    }
}

/// What a pattern is, as users name it: the composed op library turns kinds off by these names
/// (`FACT_DISABLE=attention`, `fact bench --without epilogue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PatternKind {
    /// A GEMM alone (`fact::gemm`).
    Gemm,
    /// A GEMM with its elementwise epilogue (`fact::gemm_ep`).
    Epilogue,
    /// q·kᵀ, scale, mask, softmax and ·v (`fact::attention`).
    Attention,
    /// LayerNorm over the last dim (`fact::layernorm`).
    LayerNorm,
}

impl PatternKind {
    pub const ALL: [PatternKind; 4] = [
        PatternKind::Gemm,
        PatternKind::Epilogue,
        PatternKind::Attention,
        PatternKind::LayerNorm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PatternKind::Gemm => "gemm",
            PatternKind::Epilogue => "epilogue",
            PatternKind::Attention => "attention",
            PatternKind::LayerNorm => "layernorm",
        }
    }
}

impl std::fmt::Display for PatternKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PatternKind {
    type Err = String;
    fn from_str(s: &str) -> Result<PatternKind, String> {
        PatternKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = PatternKind::ALL.iter().map(|k| k.name()).collect();
                format!(
                    "unknown pattern kind '{s}': use one of {}",
                    names.join(", ")
                )
            })
    }
}

impl From<GemmProblem> for Problem {
    fn from(p: GemmProblem) -> Problem {
        Problem::Gemm(p)
    }
}

impl From<AttentionProblem> for Problem {
    fn from(p: AttentionProblem) -> Problem {
        Problem::Attention(p)
    }
}

impl From<LayerNormProblem> for Problem {
    fn from(p: LayerNormProblem) -> Problem {
        Problem::LayerNorm(p)
    }
}

/// Every pattern of a graph, no node in two.
#[derive(Clone, Debug, Default)]
pub struct Patterns {
    pub gemm: Vec<GemmMatch>,
    pub attention: Vec<AttentionMatch>,
    pub layernorm: Vec<LayerNormMatch>,
}

/// Attention patterns first (their two matmuls are not GEMM patterns of their own), and the
/// LayerNorms (one node each), then every other GEMM of the top-level block, each with the longest
/// epilogue the graph allows, as a non-overlapping cover: two epilogues can claim one node
/// (`linear(x) + linear(z)`: the add is in both), and then the one that fuses more of the graph
/// (the larger output times ops) keeps it and the other GEMM stays plain. An epilogue reaching into
/// an attention or LayerNorm pattern is cut.
pub fn match_patterns(g: &Graph) -> Patterns {
    let attention = match_attention(g);
    let mut claimed: std::collections::BTreeSet<usize> = attention
        .iter()
        .flat_map(|a| a.nodes.iter().copied())
        .collect();
    let layernorm: Vec<LayerNormMatch> = match_layernorms(g)
        .into_iter()
        .filter(|l| !claimed.contains(&l.node))
        .collect();
    claimed.extend(layernorm.iter().map(|l| l.node));
    let mut matches: Vec<GemmMatch> = match_gemms(g)
        .into_iter()
        .filter(|m| !claimed.contains(&m.node))
        .map(|mut m| {
            if let Some(e) = match_epilogue(g, &m) {
                m.problem.epilogue = Some(e.epilogue.clone());
                m.epilogue = Some(e);
            }
            m
        })
        .collect();
    let gain = |m: &GemmMatch| {
        m.epilogue.as_ref().map_or(0.0, |e| {
            e.nodes.len() as f64 * (m.problem.batch * m.problem.m * m.problem.n) as f64
        })
    };
    let mut order: Vec<usize> = (0..matches.len()).collect();
    order.sort_by(|&a, &b| {
        gain(&matches[b])
            .total_cmp(&gain(&matches[a]))
            .then(a.cmp(&b))
    });
    claimed.extend(matches.iter().map(|m| m.node));
    for i in order {
        let Some(e) = &matches[i].epilogue else {
            continue;
        };
        if e.nodes.iter().any(|n| claimed.contains(n)) {
            matches[i] = matches[i].plain();
        } else {
            claimed.extend(e.nodes.iter().copied());
        }
    }
    Patterns {
        gemm: matches,
        attention,
        layernorm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_kinds_parse_by_name_and_problems_know_theirs() {
        for k in PatternKind::ALL {
            assert_eq!(k.name().parse::<PatternKind>().unwrap(), k);
        }
        assert!("rmsnorm"
            .parse::<PatternKind>()
            .unwrap_err()
            .contains("use one of gemm, epilogue, attention, layernorm"));
        let mut p = GemmProblem {
            m: 8,
            n: 8,
            k: 8,
            layout: GemmLayout::Rcr,
            dtype: crate::types::DType::F32,
            bias: true,
            batch: 1,
            epilogue: None,
        };
        assert_eq!(Problem::Gemm(p.clone()).kind(), PatternKind::Gemm);
        p.epilogue = Some(Epilogue::parse("leaves=;v1=relu(v0)").unwrap());
        assert_eq!(Problem::Gemm(p).kind(), PatternKind::Epilogue);
        let ln = Problem::LayerNorm(LayerNormProblem {
            rows: 8,
            cols: 8,
            dtype: crate::types::DType::F32,
            weight: false,
            bias: false,
        });
        assert_eq!(
            (ln.kind(), ln.kind().name()),
            (PatternKind::LayerNorm, "layernorm")
        );
    }

    #[test]
    fn a_layernorm_between_gemms_is_its_own_pattern() {
        // A residual add before the LayerNorm (the first linear's epilogue), a linear reading it.
        let g = Graph::parse(
            "graph(%x: f32[8,32], %w: f32[32,32], %v: f32[64,32], %g: f32[32], %b: f32[32]):
               %none = prim::Constant[None]()
               %one = prim::Constant[1]()
               %eps = prim::Constant[1e-05]()
               %on = prim::Constant[True]()
               %c = prim::Constant[32]()
               %shape = prim::ListConstruct(%c)
               %a = aten::linear(%x, %w, %none) : f32[8,32]
               %s = aten::add(%a, %x, %one) : f32[8,32]
               %n = aten::layer_norm(%s, %shape, %g, %b, %eps, %on) : f32[8,32]
               %y = aten::linear(%n, %v, %none) : f32[8,64]
               %r = aten::relu(%y) : f32[8,64]
               return (%r)",
        )
        .unwrap();
        let found = match_patterns(&g);
        assert_eq!(found.layernorm.len(), 1);
        let ln = &found.layernorm[0];
        assert_eq!(
            (
                g.nodes[ln.node].kind.as_str(),
                ln.problem.rule_id().as_str()
            ),
            ("aten::layer_norm", "layernorm_affine")
        );
        assert_eq!(found.gemm.len(), 2);
        let texts: Vec<String> = found
            .gemm
            .iter()
            .map(|m| {
                m.epilogue
                    .as_ref()
                    .map(|e| e.epilogue.text())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(texts, ["leaves=full;v1=add(v0,l0)", "leaves=;v1=relu(v0)"]);
        assert_eq!(
            g.values[found.gemm[1].a].name, "n",
            "the second linear reads the LayerNorm's output"
        );
        assert!(
            found.gemm.iter().all(|m| !m.nodes().contains(&ln.node)),
            "no GEMM pattern claims the LayerNorm"
        );
    }

    #[test]
    fn two_epilogues_claiming_one_node_leave_one_gemm_plain() {
        // The add joins two linears: each sees the other's output as a full-size leaf.
        let g = Graph::parse(
            "graph(%x: f32[8,16], %w: f32[32,16], %z: f32[8,16], %v: f32[32,16]):
               %none = prim::Constant[None]()
               %one = prim::Constant[1]()
               %a = aten::linear(%x, %w, %none) : f32[8,32]
               %b = aten::linear(%z, %v, %none) : f32[8,32]
               %r = aten::relu(%b) : f32[8,32]
               %y = aten::add(%a, %r, %one) : f32[8,32]
               return (%y)",
        )
        .unwrap();
        let m = match_patterns(&g).gemm;
        assert_eq!(m.len(), 2);
        // The second linear's pattern (relu, add) fuses more than the first's (add): it wins.
        assert!(m[0].epilogue.is_none() && m[0].problem.epilogue.is_none());
        assert_eq!(
            m[1].epilogue.as_ref().unwrap().epilogue.text(),
            "leaves=full;v1=relu(v0);v2=add(l0,v1)"
        );
        let mut nodes: Vec<usize> = m.iter().flat_map(GemmMatch::nodes).collect();
        let n = nodes.len();
        nodes.sort();
        nodes.dedup();
        assert_eq!(nodes.len(), n, "no node in two patterns");
    }
}
