//! The project's index of CUTLASS examples (cutlass-examples/index.json): which examples in the
//! installed CUTLASS tree ground each (rule, arch, math), with notes. Paths only, never copies.

use crate::types::{Arch, MathType};
use serde::{Deserialize, Serialize};

const INDEX: &str = include_str!("../../cutlass-examples/index.json");

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Example {
    pub path: String,
    pub notes: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IndexEntry {
    pub rule: String,
    pub arch: Arch,
    pub math: Vec<MathType>,
    pub examples: Vec<Example>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Index {
    pub schema: u32,
    pub cutlass: String,
    pub entries: Vec<IndexEntry>,
}

pub fn index() -> Index {
    serde_json::from_str(INDEX).expect("cutlass-examples/index.json parses")
}

impl Index {
    /// The examples for a rule; a rule without its own entry borrows the one of its base GEMM
    /// (`bmm_rrr` → `gemm_rrr`, `gemm_crr_bias` → `gemm_crr`), and a fused one
    /// (`gemm_rcr_bias_ep_gelu_…`) its GEMM's plus the epilogue visitor tree's.
    pub fn for_rule(&self, rule: &str, arch: Arch, math: Option<MathType>) -> Vec<Example> {
        // A padded GEMM's kernels are the aligned GEMM's.
        let rule = rule.strip_suffix("_padn").unwrap_or(rule);
        if let Some((gemm, _)) = rule.split_once("_ep_") {
            let mut out = self.for_rule(gemm, arch, math);
            out.extend(self.for_rule("epilogue", arch, math));
            return out;
        }
        let find = |r: &str| {
            self.entries
                .iter()
                .filter(|e| {
                    e.rule == r && e.arch == arch && math.is_none_or(|m| e.math.contains(&m))
                })
                .flat_map(|e| e.examples.clone())
                .collect::<Vec<_>>()
        };
        let gemm = rule.replacen("bmm_", "gemm_", 1);
        let found = [rule, gemm.as_str(), gemm.trim_end_matches("_bias")]
            .into_iter()
            .map(find)
            .find(|e| !e.is_empty());
        found.unwrap_or_default()
    }

    /// Every path the index names.
    pub fn paths(&self) -> Vec<String> {
        self.entries
            .iter()
            .flat_map(|e| e.examples.iter().map(|x| x.path.clone()))
            .collect()
    }
}
