//! The sibling-linears problem: what one GEMM over the concatenated weights computes, the pattern
//! table's key (with math and arch), its rule id and shape, and the problem a rule id names at a
//! shape (`fact realize`). The rule that finds it is rule.rs.
//!
//! The kernel is an ordinary GEMM kind kernel (`gemm_problem`: x [M,K] times the weights
//! concatenated along N), yet the key is not that GEMM's: a table entry says whether the kernel
//! beats what the traced model runs, and that is torch running the separate linears (each width
//! its own cuBLAS GEMM, two or three launches), not torch running the concatenated GEMM. So the
//! rule id is the kind's own (`siblings_rcr[_bias]`) and the shape key holds every width in graph
//! order (`MxN1xN2xN3xK`): torch's time depends on each width, not only on their sum.

use crate::kinds::gemm::{GemmLayout, GemmProblem};
use crate::types::DType;
use serde::{Deserialize, Serialize};

/// At most this many linears in one group: the op has one schema per count of outputs.
pub const MAX_SIBLINGS: usize = 4;

/// `y_i = x · W_iᵀ (+ b_i)` for the linears of one group, x [M, K], W_i [N_i, K].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SiblingsProblem {
    pub m: i64,
    pub k: i64,
    /// Each linear's N, in graph order (the order of the op's outputs and of the weight's rows).
    pub widths: Vec<i64>,
    pub dtype: DType,
    pub bias: bool,
}

impl SiblingsProblem {
    pub fn rule_id(&self) -> String {
        format!("siblings_rcr{}", if self.bias { "_bias" } else { "" })
    }

    /// `MxN1xN2[xN3..]xK`.
    pub fn shape_key(&self) -> String {
        let mut dims = vec![self.m];
        dims.extend(&self.widths);
        dims.push(self.k);
        dims.iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join("x")
    }

    /// The concatenated width, ΣN_i.
    pub fn n(&self) -> i64 {
        self.widths.iter().sum()
    }

    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n() as f64 * self.k as f64
    }

    /// The GEMM the kernel computes: M × ΣN × K, rcr, the biases concatenated too.
    pub fn gemm_problem(&self) -> GemmProblem {
        GemmProblem {
            m: self.m,
            n: self.n(),
            k: self.k,
            layout: GemmLayout::Rcr,
            dtype: self.dtype,
            bias: self.bias,
            batch: 1,
            epilogue: None,
            padded_from: None,
        }
    }

    /// The problem `siblings_rcr[_bias]` names at `MxN1x..xK` (`fact realize`).
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<SiblingsProblem, String> {
        let bias = match rule {
            "siblings_rcr" => false,
            "siblings_rcr_bias" => true,
            _ => {
                return Err(format!(
                    "unknown rule '{rule}': use siblings_rcr or siblings_rcr_bias"
                ))
            }
        };
        let count = dims.len().saturating_sub(2);
        if !(2..=MAX_SIBLINGS).contains(&count) {
            return Err(format!(
                "{rule} takes MxN1xN2[xN3[xN4]]xK (2 to {MAX_SIBLINGS} widths), e.g. 4096x2048x512x512x2048"
            ));
        }
        Ok(SiblingsProblem {
            m: dims[0],
            k: dims[dims.len() - 1],
            widths: dims[1..dims.len() - 1].to_vec(),
            dtype,
            bias,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_and_shapes_read_back() {
        let p = SiblingsProblem::from_rule(
            "siblings_rcr_bias",
            &[4096, 2048, 512, 512, 2048],
            DType::Bf16,
        )
        .unwrap();
        assert_eq!(p.widths, [2048, 512, 512]);
        assert_eq!((p.m, p.k, p.n(), p.bias), (4096, 2048, 3072, true));
        assert_eq!(p.rule_id(), "siblings_rcr_bias");
        assert_eq!(p.shape_key(), "4096x2048x512x512x2048");
        let g = p.gemm_problem();
        assert_eq!((g.m, g.n, g.k, g.bias), (4096, 3072, 2048, true));
        assert!(SiblingsProblem::from_rule("siblings_rcr", &[64, 32, 64], DType::F32).is_err());
        assert!(SiblingsProblem::from_rule("gemm_rcr", &[64, 32, 32, 64], DType::F32).is_err());
        // An entry of this kind is no GEMM problem, and no GEMM problem is one of these.
        let json = serde_json::to_string(&p).unwrap();
        assert!(serde_json::from_str::<GemmProblem>(&json).is_err());
        let gemm = serde_json::to_string(&g).unwrap();
        assert!(serde_json::from_str::<SiblingsProblem>(&gemm).is_err());
    }
}
