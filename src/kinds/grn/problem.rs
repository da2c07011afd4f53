//! The GRN problem: ConvNeXt V2's Global Response Normalization over x [N, H, W, C] (channels
//! last): the pattern table's key (with arch), its rule id and shape, and the problem a rule id
//! names at a shape (`fact realize`). The rule that finds it is rule.rs.

use crate::types::DType;
use serde::{Deserialize, Serialize};

/// Every rule id of the kind.
pub const RULE_IDS: &str = "grn";

/// What a GRN kernel computes: g[n,c] = ‖x[n,·,·,c]‖₂ over the H·W positions, nf = g / (eps +
/// mean_c g), y = w·(x·nf) + b + x. The positions' layout (H by W) is one run to the kernel, so
/// the key holds their count.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrnProblem {
    /// N: images.
    pub batch: i64,
    /// H·W: the positions each channel's norm runs over.
    pub pixels: i64,
    /// C: channels, the last dim.
    pub channels: i64,
    pub dtype: DType,
}

impl GrnProblem {
    pub fn rule_id(&self) -> String {
        "grn".into()
    }
    /// `NxPxC`: images, positions (H·W), channels.
    pub fn shape_key(&self) -> String {
        format!("{}x{}x{}", self.batch, self.pixels, self.channels)
    }
    fn elements(&self) -> f64 {
        (self.batch * self.pixels * self.channels) as f64
    }
    /// A square and a sum per element, then the scale, the bias and the residual.
    pub fn flops(&self) -> f64 {
        5.0 * self.elements()
    }
    /// Fewest bytes a kernel moves: x read twice (the norms need every position before the first
    /// output), y written once, the weight and bias read once.
    pub fn bytes(&self) -> f64 {
        self.dtype.bytes() as f64 * (3.0 * self.elements() + 2.0 * self.channels as f64)
    }
    /// The widest power of two, at most 16 bytes of elements, that C divides: the vector loads.
    pub fn alignment(&self) -> u32 {
        let mut align = (16 / self.dtype.bytes()) as u32;
        while align > 1 && self.channels % align as i64 != 0 {
            align /= 2;
        }
        align
    }
    /// The problem `grn` names at a shape `NxPxC`.
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<GrnProblem, String> {
        if rule != "grn" {
            return Err(format!("unknown rule '{rule}': use {RULE_IDS}"));
        }
        match *dims {
            [batch, pixels, channels] if batch > 0 && pixels > 0 && channels > 0 => Ok(GrnProblem {
                batch,
                pixels,
                channels,
                dtype,
            }),
            _ => Err(format!(
                "{rule} takes a shape of 3 positive dims (NxPxC: images, positions H·W, channels), got {dims:?}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_and_shapes_round_trip() {
        let p = GrnProblem {
            batch: 32,
            pixels: 56 * 56,
            channels: 384,
            dtype: DType::Bf16,
        };
        assert_eq!(
            (p.rule_id(), p.shape_key()),
            ("grn".into(), "32x3136x384".into())
        );
        assert_eq!(
            GrnProblem::from_rule("grn", &[32, 3136, 384], DType::Bf16).unwrap(),
            p
        );
        assert_eq!(p.bytes(), 2.0 * (3.0 * 32.0 * 3136.0 * 384.0 + 768.0));
        assert_eq!(p.alignment(), 8);
        let odd = GrnProblem {
            channels: 100,
            ..p.clone()
        };
        assert_eq!(odd.alignment(), 4);
        assert!(GrnProblem::from_rule("grn", &[32, 384], DType::Bf16)
            .unwrap_err()
            .contains("NxPxC"));
        assert!(GrnProblem::from_rule("grn_bias", &[1, 2, 3], DType::Bf16)
            .unwrap_err()
            .contains("use grn"));
        // Another kind's key is not read as this one's.
        let rms = r#"{"rows":64,"cols":768,"dtype":"bf16"}"#;
        assert!(serde_json::from_str::<GrnProblem>(rms).is_err());
    }
}
