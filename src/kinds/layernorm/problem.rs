//! The LayerNorm problem: what a LayerNorm kernel computes, the pattern table's key (with math
//! and arch), with its rule id and shape, and the problem a rule id names at a shape (`fact
//! realize`). The rule that finds it is rule.rs.

use crate::types::DType;
use serde::{Deserialize, Serialize};

/// What a LayerNorm kernel computes: the pattern table keys on it (with math and arch).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LayerNormProblem {
    /// Rows: the product of the leading dims.
    pub rows: i64,
    /// C: the normalized (last) dim.
    pub cols: i64,
    pub dtype: DType,
    pub weight: bool,
    pub bias: bool,
}

impl LayerNormProblem {
    /// `layernorm_affine` (weight and bias), `layernorm_weight`, `layernorm_bias` or `layernorm`.
    /// The widest vector, in elements and at most 16 bytes, that C divides: the loads a kernel
    /// may use on every row.
    pub fn alignment(&self) -> u32 {
        let mut align = 16 / self.dtype.bytes() as u32;
        while align > 1 && self.cols % align as i64 != 0 {
            align /= 2;
        }
        align
    }
    pub fn rule_id(&self) -> String {
        match (self.weight, self.bias) {
            (true, true) => "layernorm_affine",
            (true, false) => "layernorm_weight",
            (false, true) => "layernorm_bias",
            (false, false) => "layernorm",
        }
        .into()
    }
    /// `ROWSxC`.
    pub fn shape_key(&self) -> String {
        format!("{}x{}", self.rows, self.cols)
    }
    /// Per element: the mean's add, the variance's subtract, square and add, the normalization's
    /// subtract and multiply, and one operation per affine parameter.
    pub fn flops(&self) -> f64 {
        (self.rows * self.cols) as f64 * (6 + self.weight as i64 + self.bias as i64) as f64
    }
    /// Fewest bytes a kernel moves: x read once, y written once, the parameters read once.
    pub fn bytes(&self) -> f64 {
        let params = (self.weight as i64 + self.bias as i64) * self.cols;
        (2 * self.rows * self.cols + params) as f64 * self.dtype.bytes() as f64
    }
    /// The problem a rule id names at a shape `ROWSxC`.
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<LayerNormProblem, String> {
        let (weight, bias) = match rule {
            "layernorm_affine" => (true, true),
            "layernorm_weight" => (true, false),
            "layernorm_bias" => (false, true),
            "layernorm" => (false, false),
            _ => return Err(format!("unknown rule '{rule}': use layernorm, layernorm_affine, layernorm_weight or layernorm_bias")),
        };
        match dims {
            &[rows, cols] if rows > 0 && cols > 0 => Ok(LayerNormProblem { rows, cols, dtype, weight, bias }),
            _ => Err(format!("{rule} takes a shape of 2 positive dims (ROWSxC: rows, then the normalized dim), got {dims:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_and_shapes_round_trip() {
        for (weight, bias) in [(true, true), (true, false), (false, true), (false, false)] {
            let p = LayerNormProblem {
                rows: 65536,
                cols: 768,
                dtype: DType::Bf16,
                weight,
                bias,
            };
            let dims: Vec<i64> = p
                .shape_key()
                .split('x')
                .map(|d| d.parse().unwrap())
                .collect();
            assert_eq!(
                LayerNormProblem::from_rule(&p.rule_id(), &dims, DType::Bf16).unwrap(),
                p
            );
        }
        assert!(
            LayerNormProblem::from_rule("layernorm", &[1, 2, 3], DType::F32)
                .unwrap_err()
                .contains("ROWSxC")
        );
        assert!(LayerNormProblem::from_rule("rmsnorm", &[1, 2], DType::F32)
            .unwrap_err()
            .contains("use layernorm"));
        let p = LayerNormProblem {
            rows: 65536,
            cols: 768,
            dtype: DType::F32,
            weight: true,
            bias: true,
        };
        assert_eq!(p.bytes(), (2.0 * 65536.0 * 768.0 + 2.0 * 768.0) * 4.0);
        assert_eq!(p.flops(), 65536.0 * 768.0 * 8.0);
    }
}
