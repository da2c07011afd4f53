//! What a GEMM kernel is: the schedule, scheduler, family, epilogue and launch-knob choices, the
//! `KernelSpec` they make up, its name (the symbol, the pattern-table value and the build-cache
//! key) and the sizes derived from it.

use crate::kinds::gemm::{Epilogue, GemmLayout};
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
    /// sm80 multistage cp.async mainloop (CUTLASS 2.x).
    Multistage,
    /// cp.async warp-specialized, one consumer warpgroup: loads of any alignment (no TMA), for
    /// contiguous dims that are not whole 16-byte vectors; pairs with the no-smem epilogue.
    CpAsyncWs,
    /// cp.async warp-specialized cooperative: two consumer warpgroups share a tile (tile M ≥ 128).
    CpAsyncWsCooperative,
}

impl KernelSchedule {
    pub fn short_name(self) -> &'static str {
        match self {
            KernelSchedule::Ws => "ws",
            KernelSchedule::WsCooperative => "ws_coop",
            KernelSchedule::WsPingpong => "ws_pp",
            KernelSchedule::Multistage => "ms",
            KernelSchedule::CpAsyncWs => "cp_ws",
            KernelSchedule::CpAsyncWsCooperative => "cp_ws_coop",
        }
    }
    pub fn cutlass_tag(self) -> &'static str {
        match self {
            KernelSchedule::Ws => "cutlass::gemm::KernelTmaWarpSpecialized",
            KernelSchedule::WsCooperative => "cutlass::gemm::KernelTmaWarpSpecializedCooperative",
            KernelSchedule::WsPingpong => "cutlass::gemm::KernelTmaWarpSpecializedPingpong",
            KernelSchedule::Multistage => "",
            KernelSchedule::CpAsyncWs => "cutlass::gemm::KernelCpAsyncWarpSpecialized",
            KernelSchedule::CpAsyncWsCooperative => {
                "cutlass::gemm::KernelCpAsyncWarpSpecializedCooperative"
            }
        }
    }
    /// The TMA epilogue schedule that pairs with this kernel schedule.
    pub fn epilogue_tag(self) -> &'static str {
        match self {
            KernelSchedule::WsCooperative => "cutlass::epilogue::TmaWarpSpecializedCooperative",
            KernelSchedule::Ws | KernelSchedule::WsPingpong => {
                "cutlass::epilogue::TmaWarpSpecialized"
            }
            KernelSchedule::Multistage
            | KernelSchedule::CpAsyncWs
            | KernelSchedule::CpAsyncWsCooperative => "",
        }
    }
    /// Whether the mainloop loads through cp.async rather than TMA (any alignment, no multicast).
    pub fn is_cpasync(self) -> bool {
        matches!(
            self,
            KernelSchedule::CpAsyncWs | KernelSchedule::CpAsyncWsCooperative
        )
    }
    /// Whether two consumer warpgroups share each tile.
    pub fn is_cooperative(self) -> bool {
        matches!(
            self,
            KernelSchedule::WsCooperative | KernelSchedule::CpAsyncWsCooperative
        )
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
    /// CUTLASS 2.x GemmUniversal with sm80 multistage mainloops (templates/sm80_gemm.cu.hbs); runs
    /// on Hopper too, and is the family of the fp32-accurate 3xTF32 kernels and of serial split-K.
    Sm80Gemm,
    /// fp32-accurate on WGMMA: the three products of 3xTF32 over exact tf32 hi/lo splits of the
    /// operands, written K-major and concatenated along K by the split, as two sm90 GEMMs (over K
    /// and 2K; templates/sm90_gemm_x3.cu.hbs); bias and epilogue in the second GEMM's epilogue.
    Sm90GemmX3,
    /// fp32-accurate on bf16 WGMMA: each fp32 operand split into bf16 hi + lo parts (16
    /// significant bits, relative error ≤ 2^-16, far inside the policy's 1e-4) and the same three
    /// products as two bf16 GEMMs accumulated in fp32 (the same template, bf16 split). bf16 WGMMA reads either
    /// operand layout from shared memory, so no layout costs a register pass.
    Sm90GemmBf16x3,
}

impl Family {
    /// Whether the kernel is built on the sm90 collective builder (shares its rules and knobs).
    pub fn is_sm90(self) -> bool {
        matches!(
            self,
            Family::Sm90Gemm | Family::Sm90GemmX3 | Family::Sm90GemmBf16x3
        )
    }
    /// Whether the kernel splits its operands and runs three products as two GEMMs (fp32-accurate
    /// on WGMMA).
    pub fn is_split(self) -> bool {
        matches!(self, Family::Sm90GemmX3 | Family::Sm90GemmBf16x3)
    }
    /// Whether the family's kernels build for `arch`: the sm90 ones need TMA and WGMMA (sm_90a);
    /// the sm80 one runs anywhere from sm80 on.
    pub fn builds_for(self, arch: Arch) -> bool {
        !self.is_sm90() || arch == Arch::Sm90
    }
    pub fn template(self) -> &'static str {
        match self {
            Family::Sm90Gemm => "sm90_gemm",
            Family::Sm80Gemm => "sm80_gemm",
            Family::Sm90GemmX3 | Family::Sm90GemmBf16x3 => "sm90_gemm_x3",
        }
    }
    pub fn prefix(self) -> &'static str {
        match self {
            Family::Sm90Gemm => "sm90",
            Family::Sm80Gemm => "sm80",
            Family::Sm90GemmX3 => "sm90x3",
            Family::Sm90GemmBf16x3 => "sm90b3",
        }
    }
}

/// How an sm90 kernel writes its output tile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpilogueKind {
    /// TMA store through shared memory, the schedule's own TMA epilogue (fusions such as bias).
    #[default]
    Tma,
    /// Direct register-to-global stores, no shared memory (more pipeline stages; no fusion).
    NoSmem,
}

/// How a kernel reads a full-size epilogue leaf (a residual).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafRead {
    /// As the collective's C operand (`Sm90SrcFetch`): the cheaper way, since D's staging reuses
    /// C's shared memory; one leaf at most, and none where C is taken.
    C,
    /// Through an `Sm90AuxLoad`: a TMA load of its own (16-byte aligned rows), staged in shared
    /// memory as deep as C.
    Aux,
}

/// Raster order of output tiles over the grid: a runtime argument of CUTLASS's sm90 schedulers.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum Raster {
    #[default]
    Heuristic,
    AlongM,
    AlongN,
}

impl Raster {
    fn letter(self) -> char {
        match self {
            Raster::Heuristic => 'h',
            Raster::AlongM => 'm',
            Raster::AlongN => 'n',
        }
    }
    /// The value of FactKnobs::raster.
    pub fn abi(self) -> i32 {
        match self {
            Raster::Heuristic => 0,
            Raster::AlongM => 1,
            Raster::AlongN => 2,
        }
    }
}

/// Launch-time parameters of a compiled kernel. Variants that differ only here share one object
/// file: the dispatch index holds one entry per variant, each with its knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct Knobs {
    #[serde(default)]
    pub raster: Raster,
    /// Tile swizzle (CUTLASS max_swizzle_size): 1, 2, 4 or 8.
    pub swizzle: u32,
    /// K splits: serial split-K for sm80, split-K through the Stream-K scheduler for sm90.
    pub splits: u32,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            raster: Raster::Heuristic,
            swizzle: 1,
            splits: 1,
        }
    }
}

impl Knobs {
    pub fn is_default(&self) -> bool {
        *self == Knobs::default()
    }
    /// `r{h|m|n}w{swizzle}k{splits}`: the suffix of a variant's name.
    pub fn suffix(&self) -> String {
        format!("r{}w{}k{}", self.raster.letter(), self.swizzle, self.splits)
    }
}

/// The sm90 cluster shapes CUTLASS's generator stamps out up to its cluster instantiation level 3
/// (cutlass_library/sm90_shapes.py, `SM90_CLUSTER_SIZES`). Its default library build, which the
/// knowledge base distills, pairs TMA kernels with 1x2x1 and 2x1x1 only; the others are tried on a
/// sweep's fastest tile and schedule pairs (compose::refine_siblings). On the H100 a 128x128x32
/// ping-pong kernel ran tf32 65536x768x768 + bias in 0.221 ms without a cluster and 0.248 ms in
/// 1x2x1, and 65536x2304x768 + bias in 0.629 ms in 2x2x1 and 0.693 ms in 1x2x1
/// (benches/results/parity/clusters).
pub const SM90_CLUSTERS: [[u32; 3]; 6] = [
    [1, 2, 1],
    [2, 1, 1],
    [1, 1, 1],
    [2, 2, 1],
    [1, 4, 1],
    [4, 1, 1],
];

/// The 128x192 tile from CUTLASS's level-3 WGMMA shape 64x192 (cutlass_library/sm90_shapes.py,
/// `SM90_WGMMA_SHAPES_*_DENSE`): times the generator's default MMA multiplier (2, 1, 4) in the
/// cooperative schedule, and two of them stacked in one ping-pong warp group (192 fp32
/// accumulators per thread of the 240 registers a ping-pong consumer gets). The default library
/// build, which the knowledge base distills, has the shapes 64x128 and 64x256 only; the sibling
/// round tries this one beside the 128x128 and 128x256 kernels that lead a sweep
/// (compose::refine_siblings). Cooperative, its C tile leaves the mainloop as many stages with a
/// residual as without (tf32 65536x768x3072 + bias + residual: 0.8244 ms against 0.8557 for
/// 128x256). Ping-pong, its epilogue runs beside the other warp group's mainloop: on the H100, in
/// one sweep each, tf32 65536x3072x768 + bias + tanh GELU took 0.7761 ms against 0.8402 for
/// 128x128 ping-pong 2x2x1, bf16 0.4031 against 0.4325, and bf16 65536x768x3072 + bias +
/// residual 0.4021 against 0.4243 for 128x256 cooperative (benches/results/parity, the
/// 128x192 tiles).
pub const SM90_TILE_N192: [u32; 2] = [128, 192];
/// The schedules `SM90_TILE_N192` runs in (TMA mainloops).
pub const SM90_TILE_N192_SCHEDULES: [KernelSchedule; 2] =
    [KernelSchedule::WsCooperative, KernelSchedule::WsPingpong];

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelSpec {
    pub family: Family,
    pub arch: Arch,
    pub layout: GemmLayout,
    pub math: MathType,
    pub dtype: DType,
    /// CTA tile M×N×K of the CUTLASS problem (which is torch's transposed; see the templates).
    pub tile: [u32; 3],
    pub cluster: [u32; 3],
    pub schedule: KernelSchedule,
    pub scheduler: TileScheduler,
    pub bias: bool,
    /// Alignment of the operands' contiguous dims, in elements. For the split families it is the
    /// problem's: 1 means the split pads the parts (any dims), else the parts' own.
    pub align: u32,
    /// Alignment of the output when CUTLASS's generator gives it one other than the operands'
    /// (the sm90 cp.async rows: (2,2,1) for tf32, (2,2,8) for bf16); 0 when it is `align`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub align_c: u32,
    /// Warps per CTA along M, N, K (sm80 family; zeros for sm90).
    #[serde(default, skip_serializing_if = "is_zero3")]
    pub warps: [u32; 3],
    /// Mainloop stages; 0 lets the sm90 builder fill shared memory.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stages: u32,
    #[serde(default, skip_serializing_if = "is_tma")]
    pub epilogue: EpilogueKind,
    #[serde(default, skip_serializing_if = "Knobs::is_default")]
    pub knobs: Knobs,
    /// The fused elementwise epilogue (after the bias), rendered as a visitor tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fusion: Option<Epilogue>,
}

fn is_zero3(v: &[u32; 3]) -> bool {
    *v == [0, 0, 0]
}
fn is_zero(v: &u32) -> bool {
    *v == 0
}
fn is_tma(e: &EpilogueKind) -> bool {
    *e == EpilogueKind::Tma
}

impl KernelSpec {
    /// The compiled kernel's identity, cutlass_library style, e.g.
    /// `sm90_gemm_rcr_tf32_f32_128x256x32_2x1x1_ws_coop_dp_bias_align4` or
    /// `sm80_gemm_rrr_tf32x3_f32_128x128x32_w4x2x1_s3_dp_align4` (built for sm90), and
    /// `sm80_gemm_rrr_tf32x3_f32_128x128x32_w4x2x1_s3_dp_align4_for_sm80` (the same kernel built for
    /// sm80): symbol and build-cache key.
    pub fn kernel_name(&self) -> String {
        let [tm, tn, tk] = self.tile;
        let [cm, cn, ck] = self.cluster;
        let head = format!(
            "{}_gemm_{}_{}_{}_{tm}x{tn}x{tk}",
            self.family.prefix(),
            self.layout.short_name(),
            self.math_label(),
            self.dtype.short_name()
        );
        let body = match self.family {
            Family::Sm90Gemm | Family::Sm90GemmX3 | Family::Sm90GemmBf16x3 => format!(
                "{cm}x{cn}x{ck}_{}_{}{}{}",
                self.schedule.short_name(),
                self.scheduler.short_name(),
                if self.epilogue == EpilogueKind::NoSmem {
                    "_nosmem"
                } else {
                    ""
                },
                if self.stages > 0 {
                    format!("_s{}", self.stages)
                } else {
                    String::new()
                }
            ),
            Family::Sm80Gemm => {
                let [wm, wn, wk] = self.warps;
                format!(
                    "w{wm}x{wn}x{wk}_s{}_{}",
                    self.stages,
                    self.scheduler.short_name()
                )
            }
        };
        let fusion = self
            .fusion
            .as_ref()
            .map(|e| format!("_{}", e.tag()))
            .unwrap_or_default();
        let align_c = if self.align_c > 0 {
            format!("c{}", self.align_c)
        } else {
            String::new()
        };
        format!(
            "{head}_{body}{}{fusion}_align{}{align_c}{}",
            if self.bias { "_bias" } else { "" },
            self.align,
            self.arch.name_suffix()
        )
    }

    /// The math as the kernel does it: the policy's math type, except that the bf16-split family
    /// does the fp32-accurate policy with bf16 products.
    pub fn math_label(&self) -> &'static str {
        match self.family {
            Family::Sm90GemmBf16x3 => "bf16x3",
            _ => self.math.short_name(),
        }
    }

    /// Bytes of one operand element as the tensor cores read it (the split parts for bf16x3).
    pub fn operand_bytes(&self) -> u32 {
        match self.family {
            Family::Sm90GemmBf16x3 => 2,
            _ => self.dtype.bytes() as u32,
        }
    }

    /// Alignment of the output in its elements: the generator row's C alignment where it has its
    /// own, else the operands' alignment, at most 16 bytes.
    pub fn align_out(&self) -> u32 {
        if self.align_c > 0 {
            self.align_c
        } else {
            self.implied_align_out()
        }
    }

    /// The output alignment the operands' alignment implies (at most 16 bytes): what
    /// `align_c == 0` stands for.
    pub fn implied_align_out(&self) -> u32 {
        self.align.min(16 / self.dtype.bytes() as u32)
    }

    /// Whether this split-family kernel pads its parts to the part element's 16 bytes (and stores
    /// through an aligned workspace), so it runs any dims: alignment 1 below the parts' own.
    pub fn is_padded_split(&self) -> bool {
        self.family.is_split() && self.align < 16 / self.operand_bytes()
    }

    /// Alignment the tensor-core GEMMs inside the kernel load with: a padded split's parts are
    /// aligned whatever the problem.
    pub fn gemm_align(&self) -> u32 {
        if self.is_padded_split() {
            16 / self.operand_bytes()
        } else {
            self.align
        }
    }

    /// How the kernel reads each leaf of its epilogue that is full-size, in the program's leaf
    /// order (None for the other kinds). The sm90 family reads the first through its C operand and
    /// the others through aux loads; the split families' second GEMM reads the first GEMM's result
    /// as C, so theirs are all aux loads, and the sm80 family's visitor tree has no C source, so
    /// its are too. This follows from the family and the program's leaf order, both in the kernel's name, so the name stays the identity: a kernel that assigned
    /// them otherwise would need a name of its own.
    pub fn leaf_reads(&self) -> Vec<Option<LeafRead>> {
        let mut c_free = !self.family.is_split() && self.family != Family::Sm80Gemm;
        let leaves = self.fusion.as_ref().map_or(&[][..], |e| &e.leaves[..]);
        leaves
            .iter()
            .map(|&l| {
                (l == crate::kinds::gemm::LeafKind::Full).then(|| {
                    if std::mem::take(&mut c_free) {
                        LeafRead::C
                    } else {
                        LeafRead::Aux
                    }
                })
            })
            .collect()
    }

    /// Full-size leaves the kernel reads through aux loads.
    pub fn aux_loads(&self) -> usize {
        self.leaf_reads()
            .iter()
            .filter(|r| **r == Some(LeafRead::Aux))
            .count()
    }

    /// Shared memory of an sm90 TMA epilogue in bytes, as CUTLASS 4.2's builder stages it
    /// (sm90_get_tma_dispatch_policy): subtiles of 128 (cooperative) or 64 rows by 32 columns of
    /// the CUTLASS output, C staged min(subtiles, 4) deep (at least 3) with D reusing its buffers,
    /// D alone 2 deep, and every aux load as deep as C. A 128-row fp32 subtile is 16 KB, so C and
    /// one aux load take 128 KB of the 227.
    pub fn epilogue_smem_bytes(&self) -> u32 {
        if self.epilogue == EpilogueKind::NoSmem || !self.family.is_sm90() {
            return 0;
        }
        let [tm, tn, _] = self.tile;
        let rows = if self.schedule.is_cooperative() {
            tm.min(128)
        } else {
            tm.min(64)
        };
        // Tile N is one of 64, 128, 256: the builder's gcd(min(32, N), N) is 32.
        let cols = tn.min(32);
        let subtiles = (tm / rows) * (tn / cols);
        let stages_d = subtiles.min(2);
        // The split families' second GEMM reads its first's result as C.
        let reads_c = self.family.is_split() || self.leaf_reads().contains(&Some(LeafRead::C));
        let (c_or_d, stages_c) = if reads_c {
            let c = subtiles.min(4).max(stages_d + 1);
            (c, c)
        } else {
            (stages_d, subtiles.min(4))
        };
        (c_or_d + self.aux_loads() as u32 * stages_c) * rows * cols * self.dtype.bytes() as u32
    }

    /// The variant's identity: the kernel name, plus the knobs when they are not the defaults.
    /// It is the dispatch-index name and the pattern-table value.
    pub fn name(&self) -> String {
        if self.knobs.is_default() {
            self.kernel_name()
        } else {
            format!("{}__{}", self.kernel_name(), self.knobs.suffix())
        }
    }

    /// The spec of the compiled kernel: this one without its launch knobs.
    pub fn kernel(&self) -> KernelSpec {
        KernelSpec {
            knobs: Knobs::default(),
            ..self.clone()
        }
    }

    pub fn with_knobs(&self, knobs: Knobs) -> KernelSpec {
        KernelSpec {
            knobs,
            ..self.clone()
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("KernelSpec serializes")
    }

    /// Instruction shape (M, N, K) the kernel's MMA uses.
    pub fn instruction(&self) -> [u32; 3] {
        let k = match self.operand_bytes() {
            4 => 8,
            _ => 16,
        };
        match self.family {
            Family::Sm90Gemm | Family::Sm90GemmX3 | Family::Sm90GemmBf16x3 => {
                [64, self.tile[1].min(256), k]
            }
            Family::Sm80Gemm => [16, 8, k],
        }
    }

    /// Shared memory of one mainloop stage, bytes.
    pub fn stage_bytes(&self) -> u32 {
        (self.tile[0] + self.tile[1]) * self.tile[2] * self.operand_bytes()
    }
}
