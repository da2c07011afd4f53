//! Kernel specifications and the candidate space for a pattern. A `KernelSpec` is everything that
//! makes a kernel different; its name is computed from it alone and is the generated symbol, the
//! pattern-table value and the build-cache key. The candidates follow the validity rules CUTLASS's
//! own generator applies to sm90 instantiations (cutlass_library/sm90_utils.py, 4.2.0).

use crate::rules::{GemmLayout, GemmProblem};
use crate::types::{Arch, DType, MathType};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelSchedule {
    /// TMA warp-specialized, one consumer warpgroup per tile.
    Ws,
    /// TMA warp-specialized cooperative: two consumer warpgroups share a tile (tile M ≥ 128).
    WsCooperative,
    /// TMA warp-specialized ping-pong: two consumer warpgroups alternate tiles.
    WsPingpong,
}

impl KernelSchedule {
    pub fn short_name(self) -> &'static str {
        match self {
            KernelSchedule::Ws => "ws",
            KernelSchedule::WsCooperative => "ws_coop",
            KernelSchedule::WsPingpong => "ws_pp",
        }
    }
    pub fn cutlass_tag(self) -> &'static str {
        match self {
            KernelSchedule::Ws => "cutlass::gemm::KernelTmaWarpSpecialized",
            KernelSchedule::WsCooperative => "cutlass::gemm::KernelTmaWarpSpecializedCooperative",
            KernelSchedule::WsPingpong => "cutlass::gemm::KernelTmaWarpSpecializedPingpong",
        }
    }
    /// The TMA epilogue schedule that pairs with this kernel schedule.
    pub fn epilogue_tag(self) -> &'static str {
        match self {
            KernelSchedule::WsCooperative => "cutlass::epilogue::TmaWarpSpecializedCooperative",
            KernelSchedule::Ws | KernelSchedule::WsPingpong => "cutlass::epilogue::TmaWarpSpecialized",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TileScheduler {
    /// Persistent data-parallel tiles.
    Persistent,
    /// Stream-K: K-dimension work split across persistent CTAs.
    StreamK,
}

impl TileScheduler {
    pub fn short_name(self) -> &'static str {
        match self {
            TileScheduler::Persistent => "dp",
            TileScheduler::StreamK => "sk",
        }
    }
    pub fn cutlass_tag(self) -> &'static str {
        match self {
            TileScheduler::Persistent => "cutlass::gemm::PersistentScheduler",
            TileScheduler::StreamK => "cutlass::gemm::StreamKScheduler",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// CUTLASS 3.x GEMM through the sm90 collective builder (templates/sm90_gemm.cu.hbs).
    Sm90Gemm,
}

impl Family {
    pub fn template(self) -> &'static str {
        match self {
            Family::Sm90Gemm => "sm90_gemm",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelSpec {
    pub family: Family,
    pub arch: Arch,
    pub layout: GemmLayout,
    pub math: MathType,
    pub dtype: DType,
    pub tile: [u32; 3],
    pub cluster: [u32; 3],
    pub schedule: KernelSchedule,
    pub scheduler: TileScheduler,
    pub bias: bool,
    pub align: u32,
}

impl KernelSpec {
    /// cutlass_library-style identity, e.g. `sm90_gemm_rcr_tf32_f32_128x256x32_2x1x1_ws_coop_dp_bias_align4`.
    pub fn name(&self) -> String {
        let [tm, tn, tk] = self.tile;
        let [cm, cn, ck] = self.cluster;
        format!(
            "{}_gemm_{}_{}_{}_{tm}x{tn}x{tk}_{cm}x{cn}x{ck}_{}_{}{}_align{}",
            self.arch.short_name(),
            self.layout.short_name(),
            self.math.short_name(),
            self.dtype.short_name(),
            self.schedule.short_name(),
            self.scheduler.short_name(),
            if self.bias { "_bias" } else { "" },
            self.align
        )
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("KernelSpec serializes")
    }

    /// Why CUTLASS would reject this instantiation, if it would. Mirrors the static_asserts and
    /// generator pruning that apply to the families fact renders.
    pub fn invalid_reason(&self) -> Option<String> {
        let [tm, tn, tk] = self.tile;
        let elem_bytes = self.dtype.bytes() as u32;
        if tk * elem_bytes != 128 {
            return Some(format!("tile K {tk} must span 128 bytes of {}", self.dtype));
        }
        if self.schedule == KernelSchedule::WsCooperative && tm % 128 != 0 {
            return Some(format!("cooperative schedule needs tile M divisible by 128, got {tm}"));
        }
        if self.schedule != KernelSchedule::WsCooperative && tm != 64 && tm != 128 {
            return Some(format!("{} needs tile M of 64 or 128, got {tm}", self.schedule.short_name()));
        }
        if self.scheduler == TileScheduler::StreamK && self.schedule != KernelSchedule::WsCooperative {
            return Some("Stream-K runs only with the cooperative schedule".into());
        }
        if ![64, 128, 256].contains(&tn) || ![64, 128, 256].contains(&tm) {
            return Some(format!("tile {tm}x{tn} outside the generator's 64/128/256 set"));
        }
        // fp32 operands in CUTLASS's nn/tn arrangements need the N tile to be a multiple of K
        // (static_assert in the smem layout of B).
        if self.math == MathType::Tf32 && tn % tk != 0 {
            return Some(format!("tf32 needs tile N {tn} divisible by tile K {tk}"));
        }
        let cluster_size = self.cluster.iter().product::<u32>();
        if cluster_size > 2 || self.cluster[2] != 1 {
            return Some(format!("cluster {:?} beyond the 1x1x1/2x1x1/1x2x1 set", self.cluster));
        }
        let stage_bytes = (tm + tn) * tk * elem_bytes;
        let epilogue_bytes = 32 * 1024;
        if 2 * stage_bytes + epilogue_bytes > 227 * 1024 {
            return Some(format!("two stages of {stage_bytes} B do not fit in shared memory"));
        }
        None
    }

    /// Whether this kernel can run `p` at all (alignment of the contiguous dims).
    pub fn fits(&self, p: &GemmProblem) -> bool {
        p.dtype == self.dtype
            && p.layout == self.layout
            && p.bias == self.bias
            && p.k % self.align as i64 == 0
            && p.n % self.align as i64 == 0
    }
}

/// The default sweep for a GEMM problem: valid sm90 configurations covering the three levels
/// (tile and instruction shape; schedule and cluster; tile scheduler), most promising first.
pub fn gemm_candidates(p: &GemmProblem, math: MathType, arch: Arch) -> Vec<KernelSpec> {
    let tk = 128 / p.dtype.bytes() as u32;
    let align = 16 / p.dtype.bytes() as u32;
    let base = |tile: [u32; 3], cluster: [u32; 3], schedule, scheduler| KernelSpec {
        family: Family::Sm90Gemm,
        arch,
        layout: p.layout,
        math,
        dtype: p.dtype,
        tile,
        cluster,
        schedule,
        scheduler,
        bias: p.bias,
        align,
    };
    use KernelSchedule::*;
    use TileScheduler::*;
    let configs = [
        ([128, 256, tk], [1, 2, 1], WsCooperative, Persistent),
        ([256, 128, tk], [2, 1, 1], WsCooperative, Persistent),
        ([128, 128, tk], [1, 2, 1], WsCooperative, Persistent),
        ([128, 128, tk], [2, 1, 1], WsCooperative, Persistent),
        ([64, 128, tk], [1, 2, 1], WsPingpong, Persistent),
        ([64, 256, tk], [1, 1, 1], WsPingpong, Persistent),
        ([128, 256, tk], [1, 1, 1], WsCooperative, StreamK),
        ([128, 128, tk], [1, 1, 1], Ws, Persistent),
    ];
    let mut out: Vec<KernelSpec> = configs
        .into_iter()
        .map(|(t, c, s, ts)| base(t, c, s, ts))
        .filter(|k| k.invalid_reason().is_none() && k.fits(p))
        .collect();
    // Wave quantisation: fewer idle SMs in the last wave first, larger tiles on ties.
    let sms = 132.0;
    out.sort_by(|x, y| {
        let score = |k: &KernelSpec| {
            // CUTLASS's problem is transposed: its M is torch's N.
            let tiles = ((p.n as f64) / k.tile[0] as f64).ceil() * ((p.m as f64) / k.tile[1] as f64).ceil();
            let waves = tiles / sms;
            let eff = waves / waves.ceil();
            -(eff * 1000.0) - (k.tile[0] * k.tile[1]) as f64 / 1e6
        };
        score(x).partial_cmp(&score(y)).unwrap()
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(m: i64, n: i64, k: i64, dtype: DType) -> GemmProblem {
        GemmProblem { m, n, k, layout: GemmLayout::Rrr, dtype, bias: false, batch: 1 }
    }

    #[test]
    fn name_is_computed_from_the_spec() {
        let k = &gemm_candidates(&problem(4096, 4096, 4096, DType::F32), MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| k.tile == [128, 256, 32] && k.scheduler == TileScheduler::Persistent)
            .unwrap();
        assert_eq!(k.name(), "sm90_gemm_rrr_tf32_f32_128x256x32_1x2x1_ws_coop_dp_align4");
        let back: KernelSpec = serde_json::from_str(&k.to_json()).unwrap();
        assert_eq!(back.name(), k.name());
    }

    #[test]
    fn sweep_has_at_least_four_valid_distinct_variants() {
        for dtype in [DType::F32, DType::Bf16] {
            let math = MathType::for_tensor(dtype, crate::types::Precision::Tf32).unwrap();
            let c = gemm_candidates(&problem(4096, 4096, 4096, dtype), math, Arch::Sm90);
            assert!(c.len() >= 4, "{dtype}: {}", c.len());
            let names: std::collections::HashSet<_> = c.iter().map(KernelSpec::name).collect();
            assert_eq!(names.len(), c.len());
            assert!(c.iter().any(|k| k.schedule == KernelSchedule::WsPingpong));
            assert!(c.iter().any(|k| k.scheduler == TileScheduler::StreamK));
        }
    }

    #[test]
    fn validity_rules_reject_what_cutlass_rejects() {
        let mut k = gemm_candidates(&problem(512, 512, 512, DType::F32), MathType::Tf32, Arch::Sm90)[0].clone();
        k.schedule = KernelSchedule::WsCooperative;
        k.tile = [64, 128, 32];
        assert!(k.invalid_reason().unwrap().contains("cooperative"));
        k.tile = [128, 128, 64];
        assert!(k.invalid_reason().unwrap().contains("128 bytes"));
    }

    #[test]
    fn misaligned_problems_get_no_candidates() {
        assert!(gemm_candidates(&problem(64, 30, 64, DType::F32), MathType::Tf32, Arch::Sm90).is_empty());
    }
}
