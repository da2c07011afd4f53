//! The rotary problem: what a rotary kernel computes, the pattern table's key (with math and
//! arch), with its rule id and shape, and the problem a rule id names at a shape (`fact
//! realize`). The rule that finds it is rule.rs.

use crate::types::DType;
use serde::{Deserialize, Serialize};

/// How a head's rotated elements pair up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Form {
    /// Element i with element i + R/2 (`rotate_half`: `cat(-x2, x1)` of the two halves).
    Halves,
    /// Element 2i with element 2i + 1 (`rotate_every_two`: `stack(-x[1::2], x[::2]).flatten(-2)`).
    Pairs,
}

impl Form {
    pub fn name(self) -> &'static str {
        match self {
            Form::Halves => "halves",
            Form::Pairs => "pairs",
        }
    }
    /// The op's `form` operand.
    pub fn code(self) -> i64 {
        match self {
            Form::Halves => 0,
            Form::Pairs => 1,
        }
    }
}

/// What a rotary kernel computes: the pattern table keys on it (with math and arch). q (and k,
/// when `heads_k` > 0) are [batch, heads, seq, head_dim] as the model lays them out (any strides);
/// cos and sin [batch, 1, seq, rotary_dim], one row per position, shared by q's and k's heads.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RotaryProblem {
    pub batch: i64,
    pub heads_q: i64,
    /// k's heads, 0 when the pattern rotates q alone.
    pub heads_k: i64,
    pub seq: i64,
    pub head_dim: i64,
    /// The rotated leading part of each head (`rotary_dim`); the rest passes through.
    pub rotary_dim: i64,
    pub dtype: DType,
    pub form: Form,
}

impl RotaryProblem {
    /// `rotary_halves`, `rotary_pairs`, with `_qk` when one kernel rotates q and k.
    pub fn rule_id(&self) -> String {
        let qk = if self.heads_k > 0 { "_qk" } else { "" };
        format!("rotary_{}{qk}", self.form.name())
    }
    /// `BxHqxHkxTxDxR` (Hk 0 for q alone).
    pub fn shape_key(&self) -> String {
        format!(
            "{}x{}x{}x{}x{}x{}",
            self.batch, self.heads_q, self.heads_k, self.seq, self.head_dim, self.rotary_dim
        )
    }
    /// The widest vector, in elements and at most 16 bytes, that every part of a head divides
    /// (the rotated half or pair, the passed rest): the accesses a kernel may use on every row.
    pub fn alignment(&self) -> u32 {
        let part = match self.form {
            Form::Halves => self.rotary_dim / 2,
            Form::Pairs => self.rotary_dim,
        };
        let mut align = 16 / self.dtype.bytes() as u32;
        while align > 1
            && (part % align as i64 != 0 || (self.head_dim - self.rotary_dim) % align as i64 != 0)
        {
            align /= 2;
        }
        align
    }
    /// Rows (one head of one position) of q and k together.
    pub fn rows(&self) -> i64 {
        self.batch * (self.heads_q + self.heads_k) * self.seq
    }
    /// Per rotated element two multiplies and an add.
    pub fn flops(&self) -> f64 {
        (self.rows() * self.rotary_dim * 3) as f64
    }
    /// Fewest bytes a kernel moves: q and k read and written once, cos and sin read once.
    pub fn bytes(&self) -> f64 {
        let rows = 2 * self.rows() * self.head_dim;
        let tables = 2 * self.batch * self.seq * self.rotary_dim;
        (rows + tables) as f64 * self.dtype.bytes() as f64
    }
    /// The problem a rule id names at a shape `BxHqxHkxTxDxR`.
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<RotaryProblem, String> {
        let (form, qk) = match rule {
            "rotary_halves" => (Form::Halves, false),
            "rotary_halves_qk" => (Form::Halves, true),
            "rotary_pairs" => (Form::Pairs, false),
            "rotary_pairs_qk" => (Form::Pairs, true),
            _ => return Err(format!("unknown rule '{rule}': use {}", RULE_IDS)),
        };
        let &[batch, heads_q, heads_k, seq, head_dim, rotary_dim] = dims else {
            return Err(format!(
                "{rule} takes a shape of 6 dims (BxHqxHkxTxDxR: batch, q heads, k heads, positions, head dim, rotated dims), got {dims:?}"
            ));
        };
        if qk != (heads_k > 0) {
            return Err(format!(
                "{rule}: k heads (the third dim) must be {} for this rule",
                if qk { "positive" } else { "0" }
            ));
        }
        let p = RotaryProblem {
            batch,
            heads_q,
            heads_k,
            seq,
            head_dim,
            rotary_dim,
            dtype,
            form,
        };
        if batch < 1
            || heads_q < 1
            || seq < 1
            || rotary_dim < 2
            || rotary_dim % 2 != 0
            || rotary_dim > head_dim
        {
            return Err(format!(
                "{rule}: dims must be positive and R even, at most D, got {dims:?}"
            ));
        }
        Ok(p)
    }
}

/// Every rule id of the kind, for messages.
pub const RULE_IDS: &str = "rotary_halves, rotary_halves_qk, rotary_pairs or rotary_pairs_qk";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_and_shapes_round_trip() {
        for (form, heads_k) in [(Form::Halves, 4), (Form::Halves, 0), (Form::Pairs, 16)] {
            let p = RotaryProblem {
                batch: 4,
                heads_q: 16,
                heads_k,
                seq: 1024,
                head_dim: 128,
                rotary_dim: 64,
                dtype: DType::Bf16,
                form,
            };
            let dims: Vec<i64> = p
                .shape_key()
                .split('x')
                .map(|d| d.parse().unwrap())
                .collect();
            assert_eq!(
                RotaryProblem::from_rule(&p.rule_id(), &dims, DType::Bf16).unwrap(),
                p
            );
        }
        assert!(
            RotaryProblem::from_rule("rotary_halves", &[4, 16, 4, 1024, 128, 128], DType::F32)
                .unwrap_err()
                .contains("must be 0")
        );
        assert!(
            RotaryProblem::from_rule("rotary_halves", &[4, 16, 0, 1024, 128, 130], DType::F32)
                .unwrap_err()
                .contains("at most D")
        );
        assert!(RotaryProblem::from_rule("rotary", &[1], DType::F32)
            .unwrap_err()
            .contains("use rotary_halves"));
    }

    #[test]
    fn alignment_takes_the_rotated_part_and_the_rest() {
        let p =
            RotaryProblem::from_rule("rotary_halves_qk", &[8, 12, 12, 512, 64, 16], DType::Bf16)
                .unwrap();
        // Halves of 8 and a rest of 48: one 16-byte vector.
        assert_eq!(p.alignment(), 8);
        let p = RotaryProblem { rotary_dim: 8, ..p };
        assert_eq!(p.alignment(), 4);
        let p = RotaryProblem {
            form: Form::Pairs,
            ..p
        };
        assert_eq!(p.alignment(), 8);
        let llama =
            RotaryProblem::from_rule("rotary_halves_qk", &[4, 16, 4, 1024, 128, 128], DType::Bf16)
                .unwrap();
        assert_eq!(
            llama.bytes(),
            (2.0 * 4.0 * 20.0 * 1024.0 * 128.0 + 2.0 * 4.0 * 1024.0 * 128.0) * 2.0
        );
    }
}
