//! The attention problem: what an attention kernel computes, the pattern table's key (with math
//! and arch), with its rule id and shape, and the problem a rule id names at a shape (`fact
//! realize`). The rule that finds it is rule.rs.

use crate::types::DType;
use serde::{Deserialize, Serialize};

/// Which form the graph wrote: it decides torch's baseline (eager's five kernels, or torch's own
/// fused SDPA), so the two are separate table entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionOrigin {
    Explicit,
    Sdpa,
}

/// A tensor the kernel adds to the scaled scores: a mask the graph computes that no mask class
/// describes (relative-position biases, ALiBi, a bias with a padding mask summed into it), read
/// through its strides. Whether it holds one [H,Tq,Tk] for every sequence (BEiT's and Swin's
/// relative-position bias, [1,H,Tq,Tk]) or one per sequence (T5's, whose padding mask is in it,
/// [B,H,Tq,Tk]) decides how many bytes the kernel and torch's baseline read, so the two are
/// separate table entries. Swin's shifted windows add a mask per window through a view of the
/// scores as [B/W, W, H, Tq, Tk] after the position bias: sequence b reads window b % W's bias.
/// A bias of one row of keys per head, the same for every query (ALiBi's [H,1,Tk], or an
/// additive padding mask no class describes, [B,1,1,Tk]), is read with a query stride of 0: its
/// own entries (`Keys`, `KeysBatched`), so that the kernels verified for it read it so.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionBias {
    Shared,
    Batched,
    Windows(i64),
    Keys,
    KeysBatched,
}

impl AttentionBias {
    /// How many [H,Tq,Tk] biases (or [H,1,Tk] rows of keys) there are among `batch` sequences.
    pub fn count(self, batch: i64) -> i64 {
        match self {
            AttentionBias::Shared | AttentionBias::Keys => 1,
            AttentionBias::Batched | AttentionBias::KeysBatched => batch,
            AttentionBias::Windows(w) => w,
        }
    }
    /// Rows of keys each [H,..,Tk] bias holds: 1 where every query reads the same, else `seq_q`.
    pub fn rows(self, seq_q: i64) -> i64 {
        match self {
            AttentionBias::Keys | AttentionBias::KeysBatched => 1,
            _ => seq_q,
        }
    }
    /// The rule id's part: `_bias`, `_bias_batched`, `_bias_windowsW`, `_bias_keys`,
    /// `_bias_keys_batched`.
    pub fn suffix(self) -> String {
        match self {
            AttentionBias::Shared => "_bias".into(),
            AttentionBias::Batched => "_bias_batched".into(),
            AttentionBias::Windows(w) => format!("_bias_windows{w}"),
            AttentionBias::Keys => "_bias_keys".into(),
            AttentionBias::KeysBatched => "_bias_keys_batched".into(),
        }
    }
}

/// What an attention kernel computes: the pattern table keys on it (with math and arch).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttentionProblem {
    pub origin: AttentionOrigin,
    pub batch: i64,
    pub heads: i64,
    pub seq_q: i64,
    pub seq_k: i64,
    pub head_dim: i64,
    pub dtype: DType,
    pub causal: bool,
    /// Heads of k and v where they are fewer than q's (grouped-query attention: query head h
    /// reads key/value head h / (heads / kv_heads), in place); None where they are as many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<i64>,
    /// Each sequence's keys end at a length of its own (a key-padding mask: keys at or past
    /// batch b's length are masked for every query of b); the kernel reads the lengths.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub padded: bool,
    /// The graph hands SDPA a mask tensor (of a class the kernel computes: every key visible, or
    /// the causal triangle) rather than is_causal: torch's time, against which a kernel is kept or
    /// left, is that call's (a bool mask keeps torch off its flash and cuDNN paths). A padded
    /// problem's mask is always a tensor, so this is set only where `padded` is not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub masked: bool,
    /// The kernel adds a bias tensor to the scaled scores: alone (whatever it masks, it masks by
    /// its values), or beside the class of a mask the graph applies with it (T5's and MPNet's
    /// padding, MPT's causal fill); never with `masked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias: Option<AttentionBias>,
    /// SDPA's mask tensor is not dense along the keys (its last stride is not 1: T5's position
    /// bias, permuted from [Tq,Tk,H], leaves the mask summed from it so). torch's fused SDPA
    /// kernels refuse such a mask and the graph's call runs the math path, which the bench's
    /// baseline reproduces by passing its mask laid out the same way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mask_strided: bool,
}

impl AttentionProblem {
    /// `attention`, `attention_causal` (the explicit form), `sdpa`, `sdpa_causal`, for SDPA with a
    /// key-padding mask `sdpa_padded`, `sdpa_causal_padded`, and with an all-visible or causal mask
    /// tensor `sdpa_mask`, `sdpa_causal_mask`; with a bias tensor `attention_bias`, `sdpa_bias`,
    /// and `..._bias_batched` for one bias per sequence; `_strided` after any SDPA id whose mask is
    /// not dense along the keys.
    pub fn rule_id(&self) -> String {
        let kind = match self.origin {
            AttentionOrigin::Explicit => "attention",
            AttentionOrigin::Sdpa => "sdpa",
        };
        let causal = if self.causal { "_causal" } else { "" };
        let padded = if self.padded { "_padded" } else { "" };
        let masked = if self.masked { "_mask" } else { "" };
        let bias = self.bias.map_or(String::new(), AttentionBias::suffix);
        let strided = if self.mask_strided { "_strided" } else { "" };
        format!("{kind}{causal}{padded}{masked}{bias}{strided}")
    }
    /// Heads of k and v (q's heads unless grouped).
    pub fn key_heads(&self) -> i64 {
        self.kv_heads.unwrap_or(self.heads)
    }
    /// The widest power of two, at most 8, that both sequence lengths divide: part of the table
    /// key, so a winner measured at lengths of one class does not stand in for another's (the
    /// kernels take any length; their tails cost differently).
    pub fn alignment(&self) -> u32 {
        let mut align = 8u32;
        while align > 1
            && [self.seq_q, self.seq_k]
                .iter()
                .any(|t| t % align as i64 != 0)
        {
            align /= 2;
        }
        align
    }
    /// `BxHxTqxTkxD`, and `BxHxTqxTkxDxHkv` for grouped-query attention.
    pub fn shape_key(&self) -> String {
        let base = format!(
            "{}x{}x{}x{}x{}",
            self.batch, self.heads, self.seq_q, self.seq_k, self.head_dim
        );
        match self.kv_heads {
            Some(kv) => format!("{base}x{kv}"),
            None => base,
        }
    }
    /// Multiply-adds of the two products, halved under the causal mask (the kernel skips the
    /// key blocks a query block cannot see).
    pub fn flops(&self) -> f64 {
        let full = 4.0
            * (self.batch * self.heads) as f64
            * self.seq_q as f64
            * self.seq_k as f64
            * self.head_dim as f64;
        if self.causal {
            full / 2.0
        } else {
            full
        }
    }
    /// Fewest bytes a fused kernel moves: q, k, v read once (k and v with their own heads), the
    /// output written once, and a bias read once (per sequence where it is batched).
    pub fn bytes(&self) -> f64 {
        let e = self.dtype.bytes() as f64;
        let bias = self.bias.map_or(0.0, |b| {
            (b.count(self.batch) * self.heads * b.rows(self.seq_q) * self.seq_k) as f64
        });
        e * ((self.batch * self.head_dim) as f64
            * (2.0 * (self.heads * self.seq_q) as f64
                + 2.0 * (self.key_heads() * self.seq_k) as f64)
            + bias)
    }
    /// Bytes eager torch moves in the explicit form: the score matrix written and read by each of
    /// scale, mask, softmax and the second product (fp32 scores for fp32 tensors).
    pub fn eager_bytes(&self) -> f64 {
        let scores = (self.batch * self.heads) as f64
            * self.seq_q as f64
            * self.seq_k as f64
            * self.dtype.bytes() as f64;
        self.bytes() + 7.0 * scores
    }
    /// The problem a rule id names at a shape `BxHxTqxTkxD` (or `BxHxTqxTkxDxHkv`, grouped-query).
    pub fn from_rule(rule: &str, dims: &[i64], dtype: DType) -> Result<AttentionProblem, String> {
        let (rule, mask_strided) = match rule.strip_suffix("_strided") {
            Some(r) if r.starts_with("sdpa") && r != "sdpa" && r != "sdpa_causal" => (r, true),
            Some(_) => {
                return Err(format!(
                    "{rule}: _strided names an SDPA call's mask laid out with the keys not dense; this rule passes no mask"
                ))
            }
            None => (rule, false),
        };
        let windows = rule
            .rsplit_once("_bias_windows")
            .and_then(|(r, w)| w.parse::<i64>().ok().filter(|&w| w > 0).map(|w| (r, w)));
        let (rule, bias) = if let Some((r, w)) = windows {
            (r, Some(AttentionBias::Windows(w)))
        } else if let Some(r) = rule.strip_suffix("_bias_keys_batched") {
            (r, Some(AttentionBias::KeysBatched))
        } else if let Some(r) = rule.strip_suffix("_bias_keys") {
            (r, Some(AttentionBias::Keys))
        } else if let Some(r) = rule.strip_suffix("_bias_batched") {
            (r, Some(AttentionBias::Batched))
        } else if let Some(r) = rule.strip_suffix("_bias") {
            (r, Some(AttentionBias::Shared))
        } else {
            (rule, None)
        };
        let (origin, causal, padded, masked) = match rule {
            // A bias beside a mask class the kernel computes: SDPA's `where(mask, bias, min)`.
            _ if bias.is_some()
                && !matches!(
                    rule,
                    "attention"
                        | "attention_causal"
                        | "attention_padded"
                        | "attention_causal_padded"
                        | "sdpa"
                        | "sdpa_causal"
                        | "sdpa_padded"
                        | "sdpa_causal_padded"
                ) =>
            {
                return Err(format!(
                    "unknown rule '{rule}' with a bias: use attention_bias, sdpa_bias, their _causal, _padded and _causal_padded forms (attention_padded_bias), or their _bias_batched, _bias_keys, _bias_keys_batched and _bias_windowsW forms (a bias takes no mask tensor of a class beside it)"
                ))
            }
            "attention" => (AttentionOrigin::Explicit, false, false, false),
            "attention_causal" => (AttentionOrigin::Explicit, true, false, false),
            // An added mask of key padding (an attention_mask input), classified as SDPA's is.
            "attention_padded" => (AttentionOrigin::Explicit, false, true, false),
            "attention_causal_padded" => (AttentionOrigin::Explicit, true, true, false),
            "sdpa" => (AttentionOrigin::Sdpa, false, false, false),
            "sdpa_causal" => (AttentionOrigin::Sdpa, true, false, false),
            "sdpa_padded" => (AttentionOrigin::Sdpa, false, true, false),
            "sdpa_causal_padded" => (AttentionOrigin::Sdpa, true, true, false),
            "sdpa_mask" => (AttentionOrigin::Sdpa, false, false, true),
            "sdpa_causal_mask" => (AttentionOrigin::Sdpa, true, false, true),
            _ => {
                return Err(format!(
                    "unknown rule '{rule}': use attention, attention_causal, attention_padded, attention_causal_padded, sdpa, sdpa_causal, sdpa_padded, sdpa_causal_padded, sdpa_mask or sdpa_causal_mask, or attention_bias, sdpa_bias and their _bias_batched, _bias_keys, _bias_keys_batched and _bias_windowsW forms"
                ))
            }
        };
        let (batch, heads, seq_q, seq_k, head_dim, kv_heads) = match *dims {
            [b, h, tq, tk, d] => (b, h, tq, tk, d, None),
            [b, h, tq, tk, d, kv] => (b, h, tq, tk, d, Some(kv)),
            _ => (0, 0, 0, 0, 0, None),
        };
        let grouped_ok = kv_heads.is_none_or(|kv| kv > 0 && kv < heads && heads % kv == 0);
        if let Some(AttentionBias::Windows(w)) = bias {
            if origin == AttentionOrigin::Sdpa {
                return Err(format!("{rule}_bias_windows{w}: windows are the explicit form's (a view of its scores); use attention_bias_windows{w}"));
            }
            if batch > 0 && batch % w != 0 {
                return Err(format!(
                    "{rule}_bias_windows{w}: {w} windows do not divide the batch {batch}"
                ));
            }
        }
        if !(5..=6).contains(&dims.len()) || dims.iter().any(|&d| d <= 0) || !grouped_ok {
            return Err(format!(
                "{rule} takes a shape of 5 positive dims (BxHxTqxTkxD), or 6 for grouped-query attention (BxHxTqxTkxDxHkv, Hkv < H dividing it), got {dims:?}"
            ));
        }
        Ok(AttentionProblem {
            origin,
            batch,
            heads,
            seq_q,
            seq_k,
            head_dim,
            dtype,
            causal,
            kv_heads,
            padded,
            masked,
            bias,
            mask_strided,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_and_shapes_round_trip() {
        let p = AttentionProblem {
            origin: AttentionOrigin::Explicit,
            batch: 128,
            heads: 8,
            seq_q: 512,
            seq_k: 512,
            head_dim: 96,
            dtype: DType::F32,
            causal: true,
            kv_heads: None,
            padded: false,
            masked: false,
            bias: None,
            mask_strided: false,
        };
        let dims: Vec<i64> = p
            .shape_key()
            .split('x')
            .map(|d| d.parse().unwrap())
            .collect();
        assert_eq!(
            AttentionProblem::from_rule(&p.rule_id(), &dims, DType::F32).unwrap(),
            p
        );
        assert!(
            AttentionProblem::from_rule("attention", &[1, 2, 3], DType::F32)
                .unwrap_err()
                .contains("5 positive dims")
        );
        assert!(p.flops() > 0.0 && p.eager_bytes() > p.bytes());
        // Grouped-query and key-padded SDPA problems round-trip too; k/v heads must divide q's.
        let g = AttentionProblem {
            origin: AttentionOrigin::Sdpa,
            kv_heads: Some(2),
            padded: true,
            masked: false,
            dtype: DType::Bf16,
            ..p
        };
        assert_eq!(
            (g.rule_id(), g.shape_key()),
            (
                "sdpa_causal_padded".to_string(),
                "128x8x512x512x96x2".to_string()
            )
        );
        let dims: Vec<i64> = g
            .shape_key()
            .split('x')
            .map(|d| d.parse().unwrap())
            .collect();
        assert_eq!(
            AttentionProblem::from_rule(&g.rule_id(), &dims, DType::Bf16).unwrap(),
            g
        );
        assert!(
            g.bytes()
                < AttentionProblem {
                    kv_heads: None,
                    ..g.clone()
                }
                .bytes()
        );
        // A computed mask tensor of a class the kernels take is its own key: torch's time is
        // that call's.
        for (causal, id) in [(false, "sdpa_mask"), (true, "sdpa_causal_mask")] {
            let m = AttentionProblem {
                origin: AttentionOrigin::Sdpa,
                causal,
                masked: true,
                ..p.clone()
            };
            assert_eq!(m.rule_id(), id);
            assert_eq!(
                AttentionProblem::from_rule(id, &dims[..5], DType::F32).unwrap(),
                m
            );
        }
        for bad in [[1, 8, 64, 64, 64, 3], [1, 8, 64, 64, 64, 8]] {
            assert!(
                AttentionProblem::from_rule("sdpa", &bad, DType::Bf16).is_err(),
                "{bad:?}"
            );
        }
        // A bias tensor, shared by the sequences or one per sequence, is its own key, and reads
        // more bytes per sequence when batched; it takes no mask class beside it.
        for (bias, id) in [
            (AttentionBias::Shared, "sdpa_bias"),
            (AttentionBias::Batched, "sdpa_bias_batched"),
            (AttentionBias::Windows(4), "attention_bias_windows4"),
            (AttentionBias::Keys, "attention_bias_keys"),
            (AttentionBias::KeysBatched, "sdpa_bias_keys_batched"),
        ] {
            let b = AttentionProblem {
                origin: if id.starts_with("sdpa") {
                    AttentionOrigin::Sdpa
                } else {
                    AttentionOrigin::Explicit
                },
                causal: false,
                bias: Some(bias),
                ..p.clone()
            };
            assert_eq!(b.rule_id(), id);
            assert_eq!(
                AttentionProblem::from_rule(id, &dims[..5], DType::F32).unwrap(),
                b
            );
        }
        let shared = AttentionProblem::from_rule("attention_bias", &dims[..5], DType::F32).unwrap();
        let batched =
            AttentionProblem::from_rule("attention_bias_batched", &dims[..5], DType::F32).unwrap();
        let plain = AttentionProblem::from_rule("attention", &dims[..5], DType::F32).unwrap();
        assert!(plain.bytes() < shared.bytes() && shared.bytes() < batched.bytes());
        // A row of keys per head reads Tq times fewer bytes of bias than a bias per query.
        let keys =
            AttentionProblem::from_rule("attention_bias_keys", &dims[..5], DType::F32).unwrap();
        assert!(plain.bytes() < keys.bytes() && keys.bytes() < shared.bytes());
        // MPNet's: a padding class from the added mask beside its position bias; MPT's: the
        // causal fill beside ALiBi's row of keys.
        for id in [
            "attention_padded_bias_batched",
            "attention_causal_bias_keys",
        ] {
            let b = AttentionProblem::from_rule(id, &dims[..5], DType::F32).unwrap();
            assert_eq!(b.rule_id(), id);
            assert_eq!(b.origin, AttentionOrigin::Explicit);
        }
        assert!(
            AttentionProblem::from_rule("sdpa_causal_mask_bias", &dims[..5], DType::F32)
                .unwrap_err()
                .contains("takes no mask tensor")
        );
        // T5's: the padding class from the where's bool mask, the position bias added.
        let t5 = AttentionProblem::from_rule("sdpa_padded_bias_strided", &dims[..5], DType::F32)
            .unwrap();
        assert!(t5.padded && t5.bias == Some(AttentionBias::Shared) && t5.mask_strided);
        assert_eq!(t5.rule_id(), "sdpa_padded_bias_strided");
        assert!(
            AttentionProblem::from_rule("attention_bias_windows3", &dims[..5], DType::F32)
                .unwrap_err()
                .contains("do not divide the batch")
        );
        assert!(
            AttentionProblem::from_rule("sdpa_bias_windows4", &dims[..5], DType::F32)
                .unwrap_err()
                .contains("explicit form's")
        );
        // An SDPA mask not dense along the keys is its own key; only SDPA calls with a mask have one.
        let strided =
            AttentionProblem::from_rule("sdpa_bias_batched_strided", &dims[..5], DType::F32)
                .unwrap();
        assert!(strided.mask_strided && strided.bias == Some(AttentionBias::Batched));
        assert_eq!(strided.rule_id(), "sdpa_bias_batched_strided");
        assert!(
            AttentionProblem::from_rule("sdpa_padded_strided", &dims[..5], DType::F32)
                .unwrap()
                .mask_strided
        );
        for bad in ["sdpa_strided", "attention_bias_strided"] {
            assert!(
                AttentionProblem::from_rule(bad, &dims[..5], DType::F32)
                    .unwrap_err()
                    .contains("passes no mask"),
                "{bad}"
            );
        }
        // An older table's entry (no kv_heads, no padded) reads as before.
        let old: AttentionProblem = serde_json::from_str(
            r#"{"origin":"sdpa","batch":1,"heads":2,"seq_q":8,"seq_k":8,"head_dim":64,"dtype":"bf16","causal":false}"#,
        )
        .unwrap();
        assert_eq!((old.kv_heads, old.padded), (None, false));
        assert!(!serde_json::to_string(&old).unwrap().contains("padded"));
    }
}
