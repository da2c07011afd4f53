//! The gated-MLP problem: what a GLU kernel computes, the pattern table's key (with math and
//! arch), its rule id and shape, and the problem a rule id names at a shape (`fact realize`).
//! The rule that finds it is rule.rs.

use crate::types::DType;
use serde::{Deserialize, Serialize};

/// The gate's activation: SiLU, or GELU with torch's two `approximate` modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    Silu,
    /// `gelu(x, approximate='tanh')`.
    GeluTanh,
    /// `gelu(x)`, the exact erf form.
    Gelu,
}

impl Act {
    /// The name in rule ids, kernel names and the op's `act` operand.
    pub fn short_name(self) -> &'static str {
        match self {
            Act::Silu => "silu",
            Act::GeluTanh => "gelu_tanh",
            Act::Gelu => "gelu",
        }
    }
    pub fn parse(s: &str) -> Option<Act> {
        [Act::Silu, Act::GeluTanh, Act::Gelu]
            .into_iter()
            .find(|a| a.short_name() == s)
    }
    /// The activation as a device expression of the fp32 value `g` (templates/*.hbs).
    pub fn device_expr(self) -> &'static str {
        match self {
            Act::Silu => "g / (1.0f + expf(-g))",
            Act::GeluTanh => {
                "0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)))"
            }
            Act::Gelu => "0.5f * g * (1.0f + erff(g * 0.7071067811865476f))",
        }
    }
}

/// What a GLU kernel computes: `out[M,I] = act(x·Wgᵀ + bg) · (x·Wuᵀ + bu)` with x [M,K] and
/// both weights [I,K]; the pattern table keys on it (with math and arch).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GluProblem {
    /// Rows of x: the product of its leading dims.
    pub m: i64,
    /// I: each projection's width (the output's last dim; the one GEMM's N is 2I).
    pub inter: i64,
    pub k: i64,
    pub dtype: DType,
    pub act: Act,
    /// Both projections add a bias (a GLU matches with both or neither).
    pub bias: bool,
}

/// Rows of gate and up that alternate in the concatenated weight: 8 gate rows, then 8 up rows.
/// Eight rows apart is where both tensor-core accumulator layouts (sm90's WGMMA, sm80's mma.sync,
/// on the CUTLASS problem, which is torch's transposed) put a second value in the same thread, so
/// a thread holds each gate value and its up value (see templates/sm90_glu.cu.hbs).
pub const INTERLEAVE: i64 = 8;

impl GluProblem {
    /// `glu_silu`, `glu_gelu_tanh_bias`, ...
    pub fn rule_id(&self) -> String {
        format!(
            "glu_{}{}",
            self.act.short_name(),
            if self.bias { "_bias" } else { "" }
        )
    }
    /// `MxIxK`.
    pub fn shape_key(&self) -> String {
        format!("{}x{}x{}", self.m, self.inter, self.k)
    }
    /// The two products.
    pub fn flops(&self) -> f64 {
        2.0 * 2.0 * (self.m * self.inter * self.k) as f64
    }
    /// The widest vector, in elements and at most 16 bytes, that K and I divide.
    pub fn alignment(&self) -> u32 {
        let mut align = 16 / self.dtype.bytes() as u32;
        while align > 1 && [self.k, self.inter].iter().any(|d| d % align as i64 != 0) {
            align /= 2;
        }
        align
    }
    /// The problem a rule id names at a shape `MxIxK`.
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<GluProblem, String> {
        let use_ = "use glu_<act>[_bias] with act silu, gelu_tanh or gelu";
        let rest = rule
            .strip_prefix("glu_")
            .ok_or_else(|| format!("unknown rule '{rule}': {use_}"))?;
        let (act, bias) = match rest.strip_suffix("_bias") {
            Some(a) => (a, true),
            None => (rest, false),
        };
        let act = Act::parse(act).ok_or_else(|| format!("unknown rule '{rule}': {use_}"))?;
        match dims {
            &[m, inter, k] if m > 0 && inter > 0 && k > 0 => {
                if inter % INTERLEAVE != 0 {
                    return Err(format!("{rule}: I = {inter} is no multiple of {INTERLEAVE} (the weights interleave in blocks of {INTERLEAVE} rows)"));
                }
                Ok(GluProblem { m, inter, k, dtype, act, bias })
            }
            _ => Err(format!("{rule} takes a shape of 3 positive dims (MxIxK: rows of x, each projection's width, x's last dim), got {dims:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gated_mlps_rows_are_xs() {
        use crate::kinds::{glu::Glu, Kind, Problem};
        let p = GluProblem {
            m: 4096,
            inter: 5632,
            k: 2048,
            dtype: DType::Bf16,
            act: Act::Silu,
            bias: false,
        };
        let erased: Problem = p.clone().into();
        assert_eq!(Glu.rows(&erased), Some(4096));
        assert_eq!(
            Glu.at_rows(&erased, 128),
            Some(GluProblem { m: 128, ..p }.into())
        );
    }

    #[test]
    fn rule_ids_and_shapes_round_trip() {
        for act in [Act::Silu, Act::GeluTanh, Act::Gelu] {
            for bias in [false, true] {
                let p = GluProblem {
                    m: 4096,
                    inter: 5632,
                    k: 2048,
                    dtype: DType::Bf16,
                    act,
                    bias,
                };
                let dims: Vec<i64> = p
                    .shape_key()
                    .split('x')
                    .map(|d| d.parse().unwrap())
                    .collect();
                assert_eq!(
                    GluProblem::from_rule(&p.rule_id(), &dims, DType::Bf16).unwrap(),
                    p
                );
            }
        }
        assert_eq!(
            GluProblem::from_rule("glu_gelu_tanh_bias", &[8, 16, 32], DType::F16)
                .unwrap()
                .act,
            Act::GeluTanh
        );
        assert!(GluProblem::from_rule("glu_relu", &[8, 16, 32], DType::Bf16)
            .unwrap_err()
            .contains("silu, gelu_tanh or gelu"));
        assert!(GluProblem::from_rule("glu_silu", &[8, 12, 32], DType::Bf16)
            .unwrap_err()
            .contains("multiple of 8"));
        let f32 = GluProblem::from_rule("glu_silu", &[8, 16, 12], DType::F32).unwrap();
        assert_eq!(f32.alignment(), 4);
        let p = GluProblem::from_rule("glu_silu", &[4096, 4864, 896], DType::Bf16).unwrap();
        assert_eq!(p.flops(), 4.0 * 4096.0 * 4864.0 * 896.0);
        assert_eq!(p.alignment(), 8);
    }
}
