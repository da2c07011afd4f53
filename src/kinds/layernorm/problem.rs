//! The LayerNorm problem: what a LayerNorm kernel computes, the pattern table's key (with math
//! and arch), with its rule id and shape, and the problem a rule id names at a shape (`fact
//! realize`). The rule that finds it is rule.rs. A problem may take the residual add before the
//! norm (`add`: `rules::residual`), which its rule id names (`add_layernorm_affine_sum`).

use crate::rules::residual::Residual;
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
    /// The residual add whose sum the norm reads, computed by the same kernel (absent from the
    /// serde form without one, so the keys of plain LayerNorms are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add: Option<Residual>,
}

impl LayerNormProblem {
    /// The widest vector, in elements and at most 16 bytes, that C divides: the loads a kernel
    /// may use on every row.
    pub fn alignment(&self) -> u32 {
        let mut align = 16 / self.dtype.bytes() as u32;
        while align > 1 && self.cols % align as i64 != 0 {
            align /= 2;
        }
        align
    }
    /// `layernorm_affine` (weight and bias), `layernorm_weight`, `layernorm_bias` or `layernorm`;
    /// with the add before it `add_` in front and `_sum` behind where the sum is written
    /// (`Residual::rule_id`).
    pub fn rule_id(&self) -> String {
        let norm = match (self.weight, self.bias) {
            (true, true) => "layernorm_affine",
            (true, false) => "layernorm_weight",
            (false, true) => "layernorm_bias",
            (false, false) => "layernorm",
        };
        match &self.add {
            Some(add) => add.rule_id(self.dtype, norm),
            None => norm.into(),
        }
    }
    /// `ROWSxC`.
    pub fn shape_key(&self) -> String {
        format!("{}x{}", self.rows, self.cols)
    }
    /// Per element: the add where there is one, the mean's add, the variance's subtract, square
    /// and add, the normalization's subtract and multiply, and one operation per affine
    /// parameter.
    pub fn flops(&self) -> f64 {
        let ops = 6 + self.weight as i64 + self.bias as i64 + self.add.is_some() as i64;
        (self.rows * self.cols) as f64 * ops as f64
    }
    /// Fewest bytes a kernel moves: x read once (or the add's operands, and its sum written
    /// where it is), y written once, the parameters read once.
    pub fn bytes(&self) -> f64 {
        let params = (self.weight as i64 + self.bias as i64) * self.cols;
        let elem = self.dtype.bytes() as f64;
        let x = match &self.add {
            Some(add) => add.bytes(self.rows, self.cols),
            None => (self.rows * self.cols) as f64 * elem,
        };
        x + (self.rows * self.cols + params) as f64 * elem
    }
    /// The problem a rule id names at a shape `ROWSxC` (the add's tensors in `dtype` unless the
    /// id names theirs).
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<LayerNormProblem, String> {
        let (add, norm) = Residual::split_rule(rule, dtype)?;
        let (weight, bias) = match norm {
            "layernorm_affine" => (true, true),
            "layernorm_weight" => (true, false),
            "layernorm_bias" => (false, true),
            "layernorm" => (false, false),
            _ => return Err(format!("unknown rule '{rule}': use {RULE_IDS}")),
        };
        match dims {
            &[rows, cols] if rows > 0 && cols > 0 => Ok(LayerNormProblem { rows, cols, dtype, weight, bias, add }),
            _ => Err(format!("{rule} takes a shape of 2 positive dims (ROWSxC: rows, then the normalized dim), got {dims:?}")),
        }
    }
}

/// Every rule id of the kind.
pub const RULE_IDS: &str = "layernorm, layernorm_affine, layernorm_weight or layernorm_bias, each also after an add: add_[A_B_SUM_]<rule>[_sum]";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_and_shapes_round_trip() {
        let adds = [
            None,
            Some(Residual::plain(DType::Bf16, false)),
            Some(Residual::plain(DType::Bf16, true)),
            Some(Residual {
                a: DType::F32,
                b: DType::Bf16,
                sum: DType::F32,
                writes_sum: true,
            }),
        ];
        for (weight, bias) in [(true, true), (true, false), (false, true), (false, false)] {
            for add in adds {
                let p = LayerNormProblem {
                    rows: 65536,
                    cols: 768,
                    dtype: DType::Bf16,
                    weight,
                    bias,
                    add,
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
            add: None,
        };
        assert_eq!(p.bytes(), (2.0 * 65536.0 * 768.0 + 2.0 * 768.0) * 4.0);
        assert_eq!(p.flops(), 65536.0 * 768.0 * 8.0);
        assert!(
            !serde_json::to_string(&p).unwrap().contains("add"),
            "a plain problem's key is as it was"
        );
        // BERT's embeddings: two reads, no sum written; GPT-2's: the sum written too.
        let bert = LayerNormProblem {
            add: Some(Residual::plain(DType::F32, false)),
            ..p.clone()
        };
        assert_eq!(bert.rule_id(), "add_layernorm_affine");
        assert_eq!(bert.bytes(), (3.0 * 65536.0 * 768.0 + 2.0 * 768.0) * 4.0);
        assert_eq!(bert.flops(), 65536.0 * 768.0 * 9.0);
        let gpt2 = LayerNormProblem {
            add: Some(Residual::plain(DType::F32, true)),
            ..p
        };
        assert_eq!(gpt2.rule_id(), "add_layernorm_affine_sum");
        assert_eq!(gpt2.bytes(), (4.0 * 65536.0 * 768.0 + 2.0 * 768.0) * 4.0);
    }
}
