//! The RMSNorm problem: what an RMSNorm kernel computes, the pattern table's key (with math and
//! arch), with its rule id and shape, and the problem a rule id names at a shape (`fact
//! realize`). The rules that find it are rule.rs. A problem may take the residual add before the
//! norm (`add`: `rules::residual`), which its rule id names (`add_rmsnorm_cast_weight_sum`).

use crate::rules::residual::Residual;
use crate::types::DType;
use serde::{Deserialize, Serialize};

/// What multiplies the normalized row: nothing, the weight, or one plus the weight (Gemma's
/// `x · (1 + w)`, the weight stored as an offset from one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    None,
    Weight,
    WeightPlusOne,
}

/// What an RMSNorm kernel computes: the pattern table keys on it (with math and arch). Its
/// fields are none of the other kinds' (an untagged problem reads back as this kind's only).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RmsNormProblem {
    /// Rows: the product of the leading dims.
    pub rows: i64,
    /// C: the normalized (last) dim.
    pub cols: i64,
    pub dtype: DType,
    pub scale: Scale,
    /// Whether the normalized value is rounded to the dtype before the weight multiplies it (in
    /// the dtype), as Llama writes `w · x̂.to(dtype)`; otherwise the product is rounded once.
    /// Always false where it changes nothing (fp32 tensors, no weight) and for one plus the
    /// weight (no library rounds before that scale).
    pub cast_first: bool,
    /// The residual add whose sum the norm reads, computed by the same kernel (absent from the
    /// serde form without one, so the keys of plain RMSNorms are unchanged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add: Option<Residual>,
}

impl RmsNormProblem {
    /// The problem with `cast_first` dropped where it changes nothing, so one computation has one
    /// key.
    pub fn new(rows: i64, cols: i64, dtype: DType, scale: Scale, cast_first: bool) -> Self {
        let cast_first = cast_first && dtype != DType::F32 && scale == Scale::Weight;
        RmsNormProblem {
            rows,
            cols,
            dtype,
            scale,
            cast_first,
            add: None,
        }
    }
    /// The problem with the residual add `add` before the norm.
    pub fn with_add(self, add: Option<Residual>) -> Self {
        RmsNormProblem { add, ..self }
    }
    /// The widest vector, in elements and at most 16 bytes, that C divides: the loads a kernel
    /// may use on every row.
    pub fn alignment(&self) -> u32 {
        let mut align = 16 / self.dtype.bytes() as u32;
        while align > 1 && self.cols % align as i64 != 0 {
            align /= 2;
        }
        align
    }
    /// `rmsnorm`, `rmsnorm_weight`, `rmsnorm_weight1p` (one plus the weight), and
    /// `rmsnorm_cast_weight` where the normalized value is rounded before the weight (Llama);
    /// with the add before it `add_` in front and `_sum` behind where the sum is written
    /// (`Residual::rule_id`).
    pub fn rule_id(&self) -> String {
        let norm = match (self.scale, self.cast_first) {
            (Scale::None, _) => "rmsnorm",
            (Scale::Weight, false) => "rmsnorm_weight",
            (Scale::Weight, true) => "rmsnorm_cast_weight",
            (Scale::WeightPlusOne, _) => "rmsnorm_weight1p",
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
    /// Per element: the add where there is one, the square and its sum, the normalization's
    /// multiply, and the scale's operations.
    pub fn flops(&self) -> f64 {
        let scale = match self.scale {
            Scale::None => 0,
            Scale::Weight => 1,
            Scale::WeightPlusOne => 2,
        };
        let add = self.add.is_some() as i64;
        (self.rows * self.cols) as f64 * (3 + scale + add) as f64
    }
    /// Fewest bytes a kernel moves: x read once (or the add's operands, and its sum written
    /// where it is), y written once, the weight read once.
    pub fn bytes(&self) -> f64 {
        let weight = if self.scale == Scale::None {
            0
        } else {
            self.cols
        };
        let elem = self.dtype.bytes() as f64;
        let x = match &self.add {
            Some(add) => add.bytes(self.rows, self.cols),
            None => (self.rows * self.cols) as f64 * elem,
        };
        x + (self.rows * self.cols + weight) as f64 * elem
    }
    /// The problem a rule id names at a shape `ROWSxC` (the add's tensors in `dtype` unless the
    /// id names theirs).
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<RmsNormProblem, String> {
        let (add, norm) = Residual::split_rule(rule, dtype)?;
        let (scale, cast_first) = match norm {
            "rmsnorm" => (Scale::None, false),
            "rmsnorm_weight" => (Scale::Weight, false),
            "rmsnorm_cast_weight" => (Scale::Weight, true),
            "rmsnorm_weight1p" => (Scale::WeightPlusOne, false),
            _ => return Err(format!("unknown rule '{rule}': use {}", RULE_IDS)),
        };
        match dims {
            &[rows, cols] if rows > 0 && cols > 0 => {
                Ok(RmsNormProblem::new(rows, cols, dtype, scale, cast_first).with_add(add))
            }
            _ => Err(format!(
                "{rule} takes a shape of 2 positive dims (ROWSxC: rows, then the normalized dim), got {dims:?}"
            )),
        }
    }
}

/// Every rule id of the kind.
pub const RULE_IDS: &str = "rmsnorm, rmsnorm_weight, rmsnorm_cast_weight or rmsnorm_weight1p, each also after an add: add_[A_B_SUM_]<rule>[_sum]";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_and_shapes_round_trip() {
        let adds = |dtype| {
            [
                None,
                Some(Residual::plain(dtype, false)),
                Some(Residual::plain(dtype, true)),
                Some(Residual {
                    a: DType::F32,
                    b: DType::Bf16,
                    sum: DType::F32,
                    writes_sum: true,
                }),
            ]
        };
        for dtype in [DType::Bf16, DType::F32] {
            for (scale, cast_first, add) in [Scale::None, Scale::Weight, Scale::WeightPlusOne]
                .into_iter()
                .flat_map(|s| [(s, false), (s, true)])
                .flat_map(|(s, c)| adds(dtype).map(|a| (s, c, a)))
            {
                let p = RmsNormProblem::new(4096, 2048, dtype, scale, cast_first).with_add(add);
                let dims: Vec<i64> = p
                    .shape_key()
                    .split('x')
                    .map(|d| d.parse().unwrap())
                    .collect();
                assert_eq!(
                    RmsNormProblem::from_rule(&p.rule_id(), &dims, dtype).unwrap(),
                    p
                );
            }
        }
        assert_eq!(
            RmsNormProblem::new(8, 64, DType::Bf16, Scale::Weight, true).rule_id(),
            "rmsnorm_cast_weight"
        );
        assert_eq!(
            RmsNormProblem::new(8, 64, DType::F32, Scale::Weight, true).rule_id(),
            "rmsnorm_weight",
            "fp32 has no rounding to tell apart"
        );
        assert!(RmsNormProblem::from_rule("rmsnorm", &[1, 2, 3], DType::F32)
            .unwrap_err()
            .contains("ROWSxC"));
        assert!(
            RmsNormProblem::from_rule("rmsnorm_bias", &[1, 2], DType::F32)
                .unwrap_err()
                .contains("use rmsnorm,")
        );
        let p = RmsNormProblem::new(4096, 2048, DType::Bf16, Scale::Weight, true);
        assert_eq!(p.bytes(), (2.0 * 4096.0 * 2048.0 + 2048.0) * 2.0);
        assert_eq!(p.flops(), 4096.0 * 2048.0 * 4.0);
        assert_eq!(p.alignment(), 8);
        // The add reads two tensors where the norm read one, and writes the sum where it is.
        let sum = p.clone().with_add(Some(Residual::plain(DType::Bf16, true)));
        assert_eq!(sum.bytes(), (4.0 * 4096.0 * 2048.0 + 2048.0) * 2.0);
        assert_eq!(sum.flops(), 4096.0 * 2048.0 * 5.0);
        assert_eq!(sum.rule_id(), "add_rmsnorm_cast_weight_sum");
        let y_only = p.with_add(Some(Residual::plain(DType::Bf16, false)));
        assert_eq!(y_only.bytes(), (3.0 * 4096.0 * 2048.0 + 2048.0) * 2.0);
        assert!(
            serde_json::to_string(&RmsNormProblem::new(8, 64, DType::Bf16, Scale::None, false))
                .unwrap()
                .find("add")
                .is_none(),
            "a plain problem's key is as it was"
        );
        assert!(RmsNormProblem::from_rule("add_", &[8, 64], DType::Bf16)
            .unwrap_err()
            .contains("add_[A_B_SUM_]"));
    }

    #[test]
    fn a_layernorm_problem_is_not_read_as_an_rmsnorm_one() {
        let ln = r#"{"rows":64,"cols":768,"dtype":"bf16","weight":true,"bias":true}"#;
        assert!(serde_json::from_str::<RmsNormProblem>(ln).is_err());
    }
}
