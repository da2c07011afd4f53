//! Kernel specifications and the candidate space for a pattern. A `KernelSpec` is everything that
//! makes a kernel different; its name is computed from it alone and is the generated symbol, the
//! pattern-table value and the build-cache key. The candidates are the instantiations CUTLASS's
//! own generator declares valid (the knowledge base distilled from cutlass_library, knowledge.rs),
//! pruned by learned validity rules (validity.rs) and ordered by an analytic estimate (estimate.rs).

pub mod attention;
pub mod estimate;
pub mod examples;
pub mod knowledge;
pub mod layernorm;
pub mod validity;

pub use attention::AttentionSpec;
pub use knowledge::Knowledge;
pub use layernorm::LayerNormSpec;

use crate::rules::{Epilogue, GemmLayout, GemmProblem, Major};
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

/// The kernel spec of any pattern kind: what a table entry's winner and a tuning candidate are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Spec {
    Attention(AttentionSpec),
    Gemm(KernelSpec),
    /// Last: untagged, a LayerNorm spec's fields (cols, threads_per_row, ...) are none of the others'.
    LayerNorm(LayerNormSpec),
}

impl Spec {
    /// The variant's identity (dispatch-index name, table value).
    pub fn name(&self) -> String {
        match self {
            Spec::Gemm(k) => k.name(),
            Spec::Attention(a) => a.name(),
            Spec::LayerNorm(l) => l.name(),
        }
    }
    /// The compiled kernel's identity (symbol, build-cache key).
    pub fn kernel_name(&self) -> String {
        match self {
            Spec::Gemm(k) => k.kernel_name(),
            Spec::Attention(a) => a.name(),
            Spec::LayerNorm(l) => l.name(),
        }
    }
    /// The compiled kernel's spec: this one without launch knobs.
    pub fn kernel(&self) -> Spec {
        match self {
            Spec::Gemm(k) => Spec::Gemm(k.kernel()),
            Spec::Attention(a) => Spec::Attention(a.clone()),
            Spec::LayerNorm(l) => Spec::LayerNorm(l.clone()),
        }
    }
    pub fn arch(&self) -> Arch {
        match self {
            Spec::Gemm(k) => k.arch,
            Spec::Attention(a) => a.arch,
            Spec::LayerNorm(l) => l.arch,
        }
    }
    /// The element type of the kernel's tensors.
    pub fn dtype(&self) -> DType {
        match self {
            Spec::Gemm(k) => k.dtype,
            Spec::Attention(a) => a.dtype,
            Spec::LayerNorm(l) => l.dtype,
        }
    }
    pub fn as_gemm(&self) -> Option<&KernelSpec> {
        match self {
            Spec::Gemm(k) => Some(k),
            Spec::Attention(_) | Spec::LayerNorm(_) => None,
        }
    }
    pub fn as_attention(&self) -> Option<&AttentionSpec> {
        match self {
            Spec::Attention(a) => Some(a),
            Spec::Gemm(_) | Spec::LayerNorm(_) => None,
        }
    }
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("spec serializes")
    }
}

impl From<KernelSpec> for Spec {
    fn from(k: KernelSpec) -> Spec {
        Spec::Gemm(k)
    }
}

impl From<AttentionSpec> for Spec {
    fn from(a: AttentionSpec) -> Spec {
        Spec::Attention(a)
    }
}

impl From<LayerNormSpec> for Spec {
    fn from(l: LayerNormSpec) -> Spec {
        Spec::LayerNorm(l)
    }
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
                (l == crate::rules::LeafKind::Full).then(|| {
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

    /// Why CUTLASS would reject this instantiation, if it would. Mirrors the static_asserts that
    /// apply to the families fact renders; candidates from the knowledge base already satisfy
    /// CUTLASS's generator, this guards what agents and users propose.
    pub fn invalid_reason(&self) -> Option<String> {
        let [tm, tn, tk] = self.tile;
        let elem_bytes = self.operand_bytes();
        if !self.align.is_power_of_two() || self.align * elem_bytes > 16 {
            return Some(format!(
                "alignment {} is not a power of two in 1..{} elements",
                self.align,
                16 / elem_bytes
            ));
        }
        if self.align_c > 0 {
            let derived = self.implied_align_out();
            if !self.align_c.is_power_of_two()
                || self.align_c * self.dtype.bytes() as u32 > 16
                || self.align_c == derived
            {
                return Some(format!(
                    "output alignment {} must be a power of two of at most 16 bytes other than {derived} (0 says the operands' alignment)",
                    self.align_c
                ));
            }
        }
        if let Some(r) = self.knob_reason() {
            return Some(r);
        }
        if !self.family.builds_for(self.arch) {
            return Some(format!(
                "the {} family needs sm90 (TMA, WGMMA); an {} build has the sm80 family only",
                self.family.prefix(),
                self.arch
            ));
        }
        let smem = self.arch.hardware().smem_per_cta;
        match self.family {
            Family::Sm90Gemm | Family::Sm90GemmX3 | Family::Sm90GemmBf16x3 => {
                if self.family == Family::Sm90Gemm && self.math == MathType::Tf32x3 {
                    return Some("sm90 has no 3xTF32 mainloop; fp32-accurate sm90 kernels are the x3 and b3 families".into());
                }
                if self.family.is_split()
                    && (self.math != MathType::Tf32x3 || self.dtype != DType::F32)
                {
                    return Some(
                        "the split families compute fp32-accurate GEMMs of fp32 tensors".into(),
                    );
                }
                if tk * elem_bytes != 128 {
                    return Some(format!(
                        "tile K {tk} must span 128 bytes of {}",
                        self.math_label()
                    ));
                }
                if self.schedule == KernelSchedule::Multistage {
                    return Some("the multistage schedule belongs to the sm80 family".into());
                }
                let full = 16 / elem_bytes;
                if self.schedule.is_cpasync() {
                    if self.family != Family::Sm90Gemm {
                        return Some(
                            "the split families load their aligned parts through TMA, not cp.async"
                                .into(),
                        );
                    }
                    if self.epilogue != EpilogueKind::NoSmem {
                        return Some(
                            "the cp.async schedules pair with the no-smem epilogue".into(),
                        );
                    }
                    if self.cluster != [1, 1, 1] {
                        return Some("cp.async mainloops multicast nothing: cluster 1x1x1".into());
                    }
                } else if self.is_padded_split() {
                    if self.align != 1 {
                        return Some(format!(
                            "a padded split runs any dims: alignment 1, not {}",
                            self.align
                        ));
                    }
                    if self.bias || self.fusion.is_some() {
                        return Some("a padded split (ragged dims) fuses no bias, epilogue or residual yet (its GEMMs write an n-padded workspace); the sm80 family does the bias".into());
                    }
                } else if self.align != full {
                    return Some(format!(
                        "TMA loads need 16-byte aligned rows ({full} elements), not {}: smaller alignments take the cp.async schedules or the sm80 family",
                        self.align
                    ));
                }
                if self.schedule.is_cooperative() && tm % 128 != 0 {
                    return Some(format!(
                        "cooperative schedule needs tile M divisible by 128, got {tm}"
                    ));
                }
                if !self.schedule.is_cooperative() && tm != 64 && tm != 128 {
                    return Some(format!(
                        "{} needs tile M of 64 or 128, got {tm}",
                        self.schedule.short_name()
                    ));
                }
                if self.scheduler == TileScheduler::StreamK && !self.schedule.is_cooperative() {
                    return Some("Stream-K runs only with the cooperative schedule".into());
                }
                if ![64, 128, 256].contains(&tn) || ![64, 128, 256].contains(&tm) {
                    return Some(format!(
                        "tile {tm}x{tn} outside the generator's 64/128/256 set"
                    ));
                }
                if elem_bytes == 4 && tn % tk != 0 {
                    return Some(format!("tf32 needs tile N {tn} divisible by tile K {tk}"));
                }
                if (self.bias || self.fusion.is_some()) && self.epilogue == EpilogueKind::NoSmem {
                    return Some("the no-smem epilogue has no bias or epilogue fusion".into());
                }

                if let Some(e) = &self.fusion {
                    if let Err(why) = e.check() {
                        return Some(format!("epilogue: {why}"));
                    }
                    if e.full_leaves() > crate::rules::epilogue::MAX_FULL_LEAVES {
                        return Some(format!("an epilogue reads at most {} full-size tensors (the C operand and aux loads)", crate::rules::epilogue::MAX_FULL_LEAVES));
                    }
                }
                let cluster_size = self.cluster.iter().product::<u32>();
                if cluster_size > 2 || self.cluster[2] != 1 {
                    return Some(format!(
                        "cluster {:?} beyond the 1x1x1/2x1x1/1x2x1 set",
                        self.cluster
                    ));
                }
                // Beside its subtiles the epilogue's carve-out holds barriers and swizzle alignment
                // (under 1 KB); the builder gives the mainloop what is left, and it needs 2 stages.
                let epilogue_bytes = if self.epilogue == EpilogueKind::Tma {
                    self.epilogue_smem_bytes() + 1024
                } else {
                    0
                };
                let stages = self.stages.max(2);
                if stages * self.stage_bytes() + epilogue_bytes > smem {
                    let aux = match self.aux_loads() {
                        0 => String::new(),
                        n => format!(" ({n} aux load(s) as deep as C)"),
                    };
                    return Some(format!("{stages} stages of {} B and the epilogue's {epilogue_bytes} B{aux} do not fit in shared memory", self.stage_bytes()));
                }
            }
            Family::Sm80Gemm => {
                if self.align_c > 0 {
                    return Some("sm80 kernels read and write with one alignment".into());
                }
                if let Some(e) = &self.fusion {
                    if let Err(why) = e.check() {
                        return Some(format!("epilogue: {why}"));
                    }
                }
                if self.schedule != KernelSchedule::Multistage {
                    return Some("sm80 kernels use the multistage schedule".into());
                }
                if self.cluster != [1, 1, 1] {
                    return Some("sm80 kernels have no clusters".into());
                }
                let [wm, wn, wk] = self.warps;
                if wm == 0 || wn == 0 || wk != 1 || tm % wm != 0 || tn % wn != 0 {
                    return Some(format!(
                        "warp count {:?} does not divide tile {tm}x{tn}",
                        self.warps
                    ));
                }
                let [im, inn, _] = self.instruction();
                if (tm / wm) % im != 0 || (tn / wn) % inn != 0 {
                    return Some("warp tile not a multiple of the mma instruction".into());
                }
                if !(2..=10).contains(&self.stages) {
                    return Some(format!(
                        "sm80 stages must be 2..10 (CUTLASS's generator goes to 10), got {}",
                        self.stages
                    ));
                }
                if self.stages * self.stage_bytes() > smem {
                    return Some(format!(
                        "{} stages of {} B do not fit in {}'s shared memory",
                        self.stages,
                        self.stage_bytes(),
                        self.arch.hardware().gpu
                    ));
                }
            }
        }
        None
    }

    fn knob_reason(&self) -> Option<String> {
        let k = self.knobs;
        if ![1, 2, 4, 8].contains(&k.swizzle) {
            return Some(format!("swizzle {} is not 1, 2, 4 or 8", k.swizzle));
        }
        if k.splits == 0 || k.splits > 64 {
            return Some(format!("split count {} outside 1..64", k.splits));
        }
        match (self.family, self.scheduler) {
            (f, TileScheduler::Persistent) if f.is_sm90() && k.splits > 1 => {
                Some("K splits need the Stream-K scheduler on sm90".into())
            }
            (Family::Sm80Gemm, _) if k.raster != Raster::Heuristic || k.swizzle != 1 => {
                Some("sm80 kernels fix raster and swizzle at compile time".into())
            }
            (Family::Sm80Gemm, TileScheduler::StreamK) if k.splits > 1 => {
                Some("Stream-K balances K itself; no split count".into())
            }
            (Family::Sm80Gemm, _) if k.splits > 1 && self.fusion.is_some() => {
                Some("the sm80 visitor-tree epilogue has no serial split-K (CUTLASS's Sm80 EVT refuses it); the Stream-K kernels split K".into())
            }
            _ => None,
        }
    }

    /// Whether this kernel can run `p` at all (alignment of the contiguous dims).
    pub fn fits(&self, p: &GemmProblem) -> bool {
        p.dtype == self.dtype
            && p.layout == self.layout
            && p.bias == self.bias
            && p.epilogue == self.fusion
            // A column leaf has one batch; sm90 reads it along the CUTLASS problem's N (torch's M)
            // in vectors, sm80 element by element.
            && self.fusion.as_ref().is_none_or(|e| {
                !e.leaves.contains(&crate::rules::LeafKind::Col) || (p.batch == 1 && (!self.family.is_sm90() || p.m % self.align_out() as i64 == 0))
            })
            // The contiguous dim of each operand and of the output in whole vectors (batch
            // strides are multiples of them).
            && p.alignment(self.align) == self.align
            && p.n % self.align_out() as i64 == 0
            // Serial split-K and Stream-K in CUTLASS 2.x's GemmUniversal are for single GEMMs.
            && !(self.family == Family::Sm80Gemm && p.batch > 1 && (self.knobs.splits > 1 || self.scheduler == TileScheduler::StreamK))
    }

    /// Knob settings worth timing for this kernel on `p` beyond its first one.
    pub fn knob_grid(&self, p: &GemmProblem) -> Vec<Knobs> {
        let mut out = Vec::new();
        match (self.family, self.scheduler) {
            (f, s) if f.is_sm90() => {
                for raster in [Raster::AlongM, Raster::AlongN] {
                    for swizzle in [1, 2, 4, 8] {
                        out.push(Knobs {
                            raster,
                            swizzle,
                            splits: 1,
                        });
                    }
                }
                if s == TileScheduler::StreamK {
                    for splits in estimate::split_choices(self, p) {
                        out.push(Knobs {
                            splits,
                            ..Knobs::default()
                        });
                    }
                }
            }
            (Family::Sm80Gemm, TileScheduler::Persistent) if p.batch == 1 => {
                for splits in estimate::split_choices(self, p) {
                    out.push(Knobs {
                        splits,
                        ..Knobs::default()
                    });
                }
            }
            _ => {}
        }
        out.retain(|k| *k != self.knobs && self.with_knobs(*k).invalid_reason().is_none());
        out.sort();
        out.dedup();
        out
    }
}

/// The problem's alignment in its own elements (16 bytes at most), and what it takes on `arch`: a
/// line for the plan.
pub fn alignment_note(p: &GemmProblem, arch: Arch) -> String {
    let full = 16 / p.dtype.bytes() as u32;
    let sm90 = arch == Arch::Sm90;
    match p.alignment(full) {
        a if a == full => format!("alignment {a}: contiguous dims are whole 16-byte vectors ({})", if sm90 { "TMA kernels" } else { "16-byte cp.async loads" }),
        1 if p.dtype != DType::F32 => format!("alignment 1: a contiguous dim is odd, and CUTLASS's generator has no {} kernel that narrow; pad it to an even size", p.dtype),
        a => format!(
            "alignment {a}: {} (a contiguous dim is not a multiple of {full}){}",
            if sm90 { "cp.async / sm80 candidates" } else { "sm80 kernels of that alignment" },
            if sm90 && p.dtype == DType::F32 && p.layout.a() == Major::Row { "; f32-accurate pads its split parts" } else { "" }
        ),
    }
}

/// The first kernel of the shipped knowledge base that fuses `p`'s epilogue and fits `p`.
fn fusing_kernel(p: &GemmProblem, math: MathType, arch: Arch) -> Option<KernelSpec> {
    Knowledge::shipped()
        .kernels(p, math, arch)
        .into_iter()
        .find(|k| k.fusion.is_some() && k.invalid_reason().is_none() && k.fits(p))
}

/// Why no kernel fuses `p`'s epilogue under `math` on `arch` (None when one does, or there is no
/// epilogue): the reason a plan and a compose give when the epilogue is left to torch and the GEMM
/// alone realized.
pub fn fusion_refusal(p: &GemmProblem, math: MathType, arch: Arch) -> Option<String> {
    p.epilogue.as_ref()?;
    fusing_kernel(p, math, arch)
        .is_none()
        .then(|| refusal_reason(p, math, arch))
}

/// What keeps every kernel from fusing `p`'s epilogue, for a problem no kernel fuses.
fn refusal_reason(p: &GemmProblem, math: MathType, arch: Arch) -> String {
    let full = 16 / p.dtype.bytes() as u32;
    let align = p.alignment(full);
    if align < full {
        format!(
            "sm90 fused epilogues run on TMA kernels only (their C operand, aux loads and output move 16-byte rows), no sm80 kernel of this alignment fuses it, and alignment {align} says a contiguous dim (of a, B or the output's n = {}, which full-size leaves share) is not a multiple of {full}{}",
            p.n,
            if math == MathType::Tf32x3 { "; the padded split fuses no epilogue or residual yet" } else { "" }
        )
    } else if math == MathType::Tf32x3 && p.layout.a() == Major::Col {
        "f32-accurate with a column-major a runs on the sm80 family (3xTF32), and none of its kernels that fuse this program fits".to_string()
    } else {
        format!("no {arch} kernel that fuses it fits the problem")
    }
}

/// The plan's line on a fused problem under `math`: the program and how its full-size leaves are
/// read (C operand or aux load), or why no kernel fuses it.
pub fn epilogue_note(p: &GemmProblem, math: MathType, arch: Arch) -> Option<String> {
    let e = p.epilogue.as_ref()?;
    let program = format!(
        "{} ({} ops, {} leaves)",
        e.text(),
        e.instrs.len(),
        e.leaves.len()
    );
    let Some(k) = fusing_kernel(p, math, arch) else {
        return Some(format!(
            "epilogue {program} left to torch, the GEMM alone realized: {}",
            refusal_reason(p, math, arch)
        ));
    };
    let reads: Vec<String> = k
        .leaf_reads()
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            r.map(|r| {
                format!(
                    "l{i} {}",
                    if r == LeafRead::C {
                        "as the C operand"
                    } else {
                        "through an aux load"
                    }
                )
            })
        })
        .collect();
    let leaves = if reads.is_empty() {
        String::new()
    } else {
        format!(
            "; full-size leaves: {}{}",
            reads.join(", "),
            if k.family.is_split() {
                " (C holds the split's first GEMM)"
            } else {
                ""
            }
        )
    };
    let how = if k.family == Family::Sm80Gemm {
        "sm80 EVT over the mainloop's accumulators"
    } else {
        "TMA warp-specialized epilogue"
    };
    Some(format!(
        "epilogue fused as a visitor tree ({how}, fp32): {program}{leaves}"
    ))
}

/// A candidate the space left out before nvcc, and why.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Pruned {
    pub kernel: String,
    pub reason: String,
    pub estimate_ms: Option<f64>,
}

/// The candidates of a sweep, best estimate first, and everything pruned on the way.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Space {
    pub candidates: Vec<KernelSpec>,
    pub estimates_ms: Vec<f64>,
    pub pruned: Vec<Pruned>,
    /// Where the space came from: the knowledge base's CUTLASS version and source.
    pub source: String,
}

/// Options of the space derivation.
#[derive(Clone, Debug)]
pub struct SpaceOptions {
    /// Keep at most this many kernels (compile units) after ordering.
    pub budget: usize,
    /// Drop kernels estimated slower than this factor times the best estimate.
    pub hopeless: f64,
    /// Keep the best this many of each family and kernel schedule (within the hopeless cut)
    /// whatever their rank, so the estimate's rates for each are checked by measurement rather
    /// than trusted (the GPT block's GEMMs are won by ping-pong kernels the estimate ranks below
    /// cooperative ones at 4096³).
    pub per_group: usize,
}

impl Default for SpaceOptions {
    /// A budget of 12: in the GPT block's cold compose on the H100 every sweep's winner was among
    /// the estimate's best 6 (benches/results/e2e), and one nvcc unit costs most of a minute.
    fn default() -> Self {
        SpaceOptions {
            budget: 12,
            hopeless: 1.8,
            per_group: 2,
        }
    }
}

/// The sweep for a GEMM problem: CUTLASS's own valid instantiations for (arch, math, dtype,
/// layout) from the knowledge base, less what cannot run the problem, what a learned validity
/// rule rejects and what the analytic estimate calls hopeless; ordered by estimate.
pub fn derive(
    kb: &Knowledge,
    p: &GemmProblem,
    math: MathType,
    arch: Arch,
    rules: &[validity::Rule],
    scope: &validity::Scope,
    opts: &SpaceOptions,
) -> Space {
    let mut space = Space {
        source: kb.describe(),
        ..Space::default()
    };
    let mut scored: Vec<(f64, KernelSpec)> = Vec::new();
    for k in kb.kernels(p, math, arch) {
        if let Some(r) = k.invalid_reason() {
            space.pruned.push(Pruned {
                kernel: k.name(),
                reason: r,
                estimate_ms: None,
            });
            continue;
        }
        if !k.fits(p) {
            space.pruned.push(Pruned {
                kernel: k.name(),
                reason: "alignment does not fit the problem".into(),
                estimate_ms: None,
            });
            continue;
        }
        let k = estimate::with_best_splits(&k, p);
        if let Some(rule) = validity::rejecting(rules, scope, &k) {
            space.pruned.push(Pruned {
                kernel: k.name(),
                reason: rule.describe(),
                estimate_ms: None,
            });
            continue;
        }
        scored.push((estimate::estimate_ms(&k, p), k));
    }
    scored.sort_by(|a, b| {
        a.0.partial_cmp(&b.0)
            .unwrap()
            .then_with(|| a.1.name().cmp(&b.1.name()))
    });
    let best = scored.first().map(|s| s.0).unwrap_or(0.0);
    let (hopeful, hopeless): (Vec<_>, Vec<_>) = scored
        .into_iter()
        .partition(|(ms, _)| *ms <= best * opts.hopeless);
    for (ms, k) in hopeless {
        space.pruned.push(Pruned {
            kernel: k.name(),
            reason: format!(
                "estimate {ms:.4} ms is over {:.1}x the best {best:.4} ms",
                opts.hopeless
            ),
            estimate_ms: Some(ms),
        });
    }
    let mut keep = vec![false; hopeful.len()];
    let mut kept_of: std::collections::HashMap<(Family, KernelSchedule), usize> =
        std::collections::HashMap::new();
    for (i, (_, k)) in hopeful.iter().enumerate() {
        let n = kept_of.entry((k.family, k.schedule)).or_default();
        if *n < opts.per_group {
            *n += 1;
            keep[i] = true;
        }
    }
    let mut room = opts
        .budget
        .saturating_sub(keep.iter().filter(|k| **k).count());
    for k in keep.iter_mut() {
        if !*k && room > 0 {
            *k = true;
            room -= 1;
        }
    }
    for ((ms, k), kept) in hopeful.into_iter().zip(keep) {
        if kept {
            space.candidates.push(k);
            space.estimates_ms.push(ms);
        } else {
            space.pruned.push(Pruned {
                kernel: k.name(),
                reason: format!("beyond the budget of {}", opts.budget),
                estimate_ms: Some(ms),
            });
        }
    }
    space
}

/// The default sweep for a GEMM problem from the shipped knowledge base with no learned rules.
pub fn gemm_candidates(p: &GemmProblem, math: MathType, arch: Arch) -> Vec<KernelSpec> {
    let scope = validity::Scope::of(p, math, arch, "");
    derive(
        Knowledge::shipped(),
        p,
        math,
        arch,
        &[],
        &scope,
        &SpaceOptions::default(),
    )
    .candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(m: i64, n: i64, k: i64, dtype: DType) -> GemmProblem {
        GemmProblem {
            m,
            n,
            k,
            layout: GemmLayout::Rrr,
            dtype,
            bias: false,
            batch: 1,
            epilogue: None,
        }
    }

    #[test]
    fn name_is_computed_from_the_spec() {
        let k = &Knowledge::shipped()
            .kernels(
                &problem(4096, 4096, 4096, DType::F32),
                MathType::Tf32,
                Arch::Sm90,
            )
            .into_iter()
            .find(|k| {
                k.tile == [128, 128, 32]
                    && k.scheduler == TileScheduler::Persistent
                    && k.epilogue == EpilogueKind::Tma
                    && k.schedule == KernelSchedule::WsCooperative
                    && k.cluster == [1, 2, 1]
            })
            .unwrap();
        assert_eq!(
            k.name(),
            "sm90_gemm_rrr_tf32_f32_128x128x32_1x2x1_ws_coop_dp_align4"
        );
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
        let all = Knowledge::shipped().kernels(
            &problem(512, 512, 512, DType::F32),
            MathType::Tf32,
            Arch::Sm90,
        );
        let mut k = all
            .iter()
            .find(|k| k.family == Family::Sm90Gemm)
            .unwrap()
            .clone();
        k.schedule = KernelSchedule::WsCooperative;
        k.tile = [64, 128, 32];
        assert!(k.invalid_reason().unwrap().contains("cooperative"));
        k.tile = [128, 128, 64];
        assert!(k.invalid_reason().unwrap().contains("128 bytes"));
        let mut s = all
            .iter()
            .find(|k| k.family == Family::Sm80Gemm)
            .unwrap()
            .clone();
        assert_eq!(s.invalid_reason(), None);
        s.stages = 11;
        assert!(s.invalid_reason().unwrap().contains("stages"));
        s.stages = 3;
        s.knobs.swizzle = 4;
        assert!(
            s.invalid_reason().unwrap().contains("compile time"),
            "sm80 swizzle is not a launch knob"
        );
        let mut dp = all
            .iter()
            .find(|k| k.family == Family::Sm90Gemm && k.scheduler == TileScheduler::Persistent)
            .unwrap()
            .clone();
        dp.knobs.splits = 4;
        assert!(dp.invalid_reason().unwrap().contains("Stream-K"));
    }

    #[test]
    fn split_families_check_their_part_type_and_the_problem() {
        let p = problem(4096, 4096, 4096, DType::F32);
        let ks = Knowledge::shipped().kernels(&p, MathType::Tf32x3, Arch::Sm90);
        let b3 = ks
            .iter()
            .find(|k| k.family == Family::Sm90GemmBf16x3)
            .unwrap()
            .clone();
        assert!(b3.fits(&p));
        // bf16 parts read 8-element (16-byte) vectors along K and N; an fp32 GEMM with N % 8 == 4
        // runs on the tf32 families only.
        let odd = problem(4096, 4100, 4096, DType::F32);
        assert!(!b3.fits(&odd));
        assert!(ks
            .iter()
            .any(|k| k.family == Family::Sm90GemmX3 && k.fits(&odd)));
        // A K tile of 32 spans 128 bytes of fp32, not of bf16 parts.
        let mut k = b3.clone();
        k.tile[2] = 32;
        assert!(
            k.invalid_reason().unwrap().contains("128 bytes of bf16x3"),
            "{:?}",
            k.invalid_reason()
        );
        // Bias and epilogues go into the second GEMM's epilogue, whose C operand is the first
        // GEMM's result: a residual comes in through an aux load.
        let mut k = b3.clone();
        k.bias = true;
        k.epilogue = EpilogueKind::Tma;
        k.fusion = Some(Epilogue::parse("leaves=row;v1=gelu(v0);v2=mul(v1,l0)").unwrap());
        assert_eq!(k.invalid_reason(), None);
        k.fusion = Some(Epilogue::parse("leaves=full;v1=add(v0,l0)").unwrap());
        assert_eq!(
            (k.invalid_reason(), k.leaf_reads()),
            (None, vec![Some(LeafRead::Aux)])
        );
        let with_residual = GemmProblem {
            bias: true,
            epilogue: k.fusion.clone(),
            ..p.clone()
        };
        let ks = Knowledge::shipped().kernels(&with_residual, MathType::Tf32x3, Arch::Sm90);
        for family in [Family::Sm90GemmX3, Family::Sm90GemmBf16x3] {
            assert!(
                ks.iter().any(|k| k.family == family
                    && k.invalid_reason().is_none()
                    && k.fits(&with_residual)),
                "{family:?}"
            );
        }
        // The padded split (ragged dims) still takes none: its GEMMs write an n-padded workspace.
        let ragged = GemmProblem {
            n: 4095,
            ..with_residual.clone()
        };
        assert!(Knowledge::shipped()
            .kernels(&ragged, MathType::Tf32x3, Arch::Sm90)
            .iter()
            .all(|k| !k.family.is_split()));
        let padded = KernelSpec {
            align: 1,
            ..k.clone()
        };
        assert!(
            padded.is_padded_split()
                && padded
                    .invalid_reason()
                    .unwrap()
                    .contains("no bias, epilogue or residual"),
            "{:?}",
            padded.invalid_reason()
        );
        // sm80 3xTF32 takes the residual as an aux load of its visitor tree.
        assert!(ks.iter().any(|k| k.family == Family::Sm80Gemm
            && k.fits(&with_residual)
            && k.invalid_reason().is_none()));
        let mut k = b3;
        k.dtype = DType::Bf16;
        assert!(k.invalid_reason().is_some(), "bf16 tensors have no split");
    }

    #[test]
    fn aux_loads_take_the_epilogue_shared_memory_of_c_from_the_mainloop() {
        let e = |text: &str| Some(Epilogue::parse(text).unwrap());
        let residuals = e("leaves=full,full;v1=add(v0,l0);v2=add(v1,l1)");
        let p = GemmProblem {
            bias: true,
            epilogue: residuals,
            ..problem(4096, 4096, 4096, DType::F32)
        };
        let coop = Knowledge::shipped()
            .kernels(&p, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| k.tile[..2] == [128, 128] && k.schedule == KernelSchedule::WsCooperative)
            .unwrap();
        assert_eq!(
            coop.leaf_reads(),
            vec![Some(LeafRead::C), Some(LeafRead::Aux)]
        );
        // A 128-row fp32 subtile of 128x32 is 16 KB, staged 4 deep: C (D reuses it) and one aux
        // load; without a full-size leaf the builder stages D alone, 2 deep.
        assert_eq!(coop.epilogue_smem_bytes(), 2 * 4 * 16 * 1024);
        assert_eq!(
            KernelSpec {
                fusion: e("leaves=full;v1=add(v0,l0)"),
                ..coop.clone()
            }
            .epilogue_smem_bytes(),
            4 * 16 * 1024
        );
        assert_eq!(
            KernelSpec {
                fusion: e("leaves=;v1=relu(v0)"),
                ..coop.clone()
            }
            .epilogue_smem_bytes(),
            2 * 16 * 1024
        );
        // 64-row subtiles (one consumer warpgroup) are half of that.
        let pp = KernelSpec {
            schedule: KernelSchedule::WsPingpong,
            ..coop.clone()
        };
        assert_eq!(pp.epilogue_smem_bytes(), 2 * 4 * 8 * 1024);
        assert_eq!(coop.invalid_reason(), None);
        // A 256x256 tile's 2 stages of 64 KB fit beside the epilogue's C (64 KB), not beside C and
        // an aux load (128 KB), and that is said before nvcc finds out.
        let big = KernelSpec {
            tile: [256, 256, 32],
            ..coop.clone()
        };
        assert_eq!(
            KernelSpec {
                fusion: e("leaves=full;v1=add(v0,l0)"),
                ..big.clone()
            }
            .invalid_reason(),
            None
        );
        let why = big.invalid_reason().unwrap();
        assert!(
            why.contains("(1 aux load(s) as deep as C) do not fit in shared memory"),
            "{why}"
        );
        let three = KernelSpec {
            fusion: e("leaves=full,full,full;v1=add(v0,l0);v2=add(v1,l1);v3=add(v2,l2)"),
            ..coop.clone()
        };
        assert!(
            three
                .invalid_reason()
                .unwrap()
                .contains("at most 2 full-size tensors"),
            "{:?}",
            three.invalid_reason()
        );
        // bf16 output: subtiles of half the bytes.
        let bf16 = KernelSpec {
            dtype: DType::Bf16,
            math: MathType::Bf16,
            align: 8,
            tile: [128, 128, 64],
            ..coop.clone()
        };
        assert_eq!(
            (bf16.epilogue_smem_bytes(), bf16.invalid_reason()),
            (2 * 4 * 8 * 1024, None)
        );
    }

    #[test]
    fn refusals_to_fuse_say_why() {
        let residual = Some(Epilogue::parse("leaves=full;v1=add(v0,l0)").unwrap());
        let p = GemmProblem {
            epilogue: residual,
            ..problem(4096, 4096, 4096, DType::F32)
        };
        assert_eq!(
            (
                fusion_refusal(&p, MathType::Tf32, Arch::Sm90),
                fusion_refusal(&p, MathType::Tf32x3, Arch::Sm90)
            ),
            (None, None)
        );
        // f32-accurate with a column-major a has no split kernel; sm80 3xTF32 fuses it through
        // its visitor tree.
        let crr = GemmProblem {
            layout: GemmLayout::Crr,
            ..p.clone()
        };
        assert_eq!(fusion_refusal(&crr, MathType::Tf32, Arch::Sm90), None);
        assert_eq!(fusion_refusal(&crr, MathType::Tf32x3, Arch::Sm90), None);
        assert_eq!(
            fusing_kernel(&crr, MathType::Tf32x3, Arch::Sm90).map(|k| k.family),
            Some(Family::Sm80Gemm)
        );
        // Rows that are no 16-byte vectors: no TMA kernel fuses, an sm80 one of that alignment
        // does (every residual an aux load).
        let ragged = GemmProblem {
            n: 4094,
            ..p.clone()
        };
        let k = fusing_kernel(&ragged, MathType::Tf32, Arch::Sm90).unwrap();
        assert_eq!((k.family, k.align, k.aux_loads()), (Family::Sm80Gemm, 2, 1));
        // bf16 with an odd dim: CUTLASS's generator has no kernel that narrow, so nothing fuses.
        let odd = GemmProblem {
            n: 4095,
            dtype: DType::Bf16,
            ..p.clone()
        };
        let why = fusion_refusal(&odd, MathType::Bf16, Arch::Sm90).unwrap();
        assert!(
            why.contains("alignment 1") && why.contains("n = 4095"),
            "{why}"
        );
        assert_eq!(
            fusion_refusal(
                &GemmProblem {
                    epilogue: None,
                    ..odd
                },
                MathType::Bf16,
                Arch::Sm90
            ),
            None,
            "nothing to fuse"
        );
    }

    #[test]
    fn variants_share_their_kernel_and_name_their_knobs() {
        let p = problem(256, 256, 524288, DType::F32);
        let ks = Knowledge::shipped().kernels(&p, MathType::Tf32x3, Arch::Sm90);
        let k = ks
            .iter()
            .find(|k| k.family == Family::Sm80Gemm && k.scheduler == TileScheduler::Persistent)
            .unwrap();
        assert!(
            k.kernel_name().starts_with("sm80_gemm_rrr_tf32x3_f32_"),
            "{}",
            k.kernel_name()
        );
        let v = k.with_knobs(Knobs {
            splits: 8,
            ..Knobs::default()
        });
        assert_eq!(v.kernel_name(), k.kernel_name());
        assert_eq!(v.name(), format!("{}__rhw1k8", k.kernel_name()));
        assert_eq!(v.kernel(), *k);
        // Knob variants of a kernel stay valid and distinct.
        let grid = k.knob_grid(&p);
        assert!(!grid.is_empty() && grid.iter().all(|g| g.splits > 1));
        // Old table entries (no knobs, no sm80 fields) still read.
        let old = r#"{"family":"sm90_gemm","arch":"sm90","layout":"rrr","math":"tf32","dtype":"f32","tile":[128,256,32],"cluster":[1,2,1],"schedule":"ws_cooperative","scheduler":"persistent","bias":false,"align":4}"#;
        let back: KernelSpec = serde_json::from_str(old).unwrap();
        assert_eq!(
            back.name(),
            "sm90_gemm_rrr_tf32_f32_128x256x32_1x2x1_ws_coop_dp_align4"
        );
        assert_eq!(
            back.to_json(),
            old,
            "defaults are not written, so names and files stay stable"
        );
    }

    #[test]
    fn derivation_keeps_both_families_and_explains_every_prune() {
        let p = problem(4096, 4096, 4096, DType::F32);
        let scope = validity::Scope::of(&p, MathType::Tf32, Arch::Sm90, "4.2.0");
        let opts = SpaceOptions {
            budget: 10,
            ..SpaceOptions::default()
        };
        let sp = derive(
            Knowledge::shipped(),
            &p,
            MathType::Tf32,
            Arch::Sm90,
            &[],
            &scope,
            &opts,
        );
        assert_eq!(sp.candidates.len(), 10);
        assert!(sp.candidates.iter().any(|k| k.family == Family::Sm80Gemm));
        assert!(sp.candidates.iter().any(|k| k.family == Family::Sm90Gemm));
        let total = Knowledge::shipped()
            .kernels(&p, MathType::Tf32, Arch::Sm90)
            .len();
        assert_eq!(
            sp.candidates.len() + sp.pruned.len(),
            total,
            "every kernel is either a candidate or pruned with a reason"
        );
        assert!(sp.pruned.iter().all(|x| !x.reason.is_empty()));
        // A learned rule prunes what it matches, and says so.
        let mut rules = vec![];
        validity::learn(
            &mut rules,
            &scope,
            validity::FailureKind::Compile,
            &sp.candidates[0],
            "error: boom",
            &[],
        );
        let again = derive(
            Knowledge::shipped(),
            &p,
            MathType::Tf32,
            Arch::Sm90,
            &rules,
            &scope,
            &opts,
        );
        assert!(!again.candidates.contains(&sp.candidates[0]));
        assert!(again
            .pruned
            .iter()
            .any(|x| x.kernel == sp.candidates[0].name()
                && x.reason.contains("learned compile rule")));
    }

    #[test]
    fn an_sm80_build_has_the_sm80_family_alone_under_its_own_names() {
        for (dtype, math) in [
            (DType::F32, MathType::Tf32),
            (DType::F32, MathType::Tf32x3),
            (DType::Bf16, MathType::Bf16),
        ] {
            let p = problem(4096, 4096, 4096, dtype);
            let ks = Knowledge::shipped().kernels(&p, math, Arch::Sm80);
            assert!(!ks.is_empty(), "{math:?}");
            assert!(
                ks.iter().all(|k| k.family == Family::Sm80Gemm
                    && k.arch == Arch::Sm80
                    && k.invalid_reason().is_none()),
                "{math:?}"
            );
            // The same instantiations as an sm90 build's sm80 family, each under a name of its own.
            let on_sm90: Vec<KernelSpec> = Knowledge::shipped()
                .kernels(&p, math, Arch::Sm90)
                .into_iter()
                .filter(|k| k.family == Family::Sm80Gemm)
                .collect();
            assert_eq!(on_sm90.len(), ks.len());
            for (a, b) in ks.iter().zip(&on_sm90) {
                assert_eq!(a.kernel_name(), format!("{}_for_sm80", b.kernel_name()));
            }
            let c = gemm_candidates(&p, math, Arch::Sm80);
            assert!(
                c.len() >= 4 && c.iter().all(|k| k.arch == Arch::Sm80),
                "{math:?}: {}",
                c.len()
            );
        }
        let p = problem(4096, 4096, 4096, DType::F32);
        let wgmma = Knowledge::shipped()
            .kernels(&p, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| k.family == Family::Sm90Gemm)
            .unwrap();
        let on_sm80 = KernelSpec {
            arch: Arch::Sm80,
            ..wgmma
        };
        assert!(
            on_sm80.invalid_reason().unwrap().contains("needs sm90"),
            "{:?}",
            on_sm80.invalid_reason()
        );
        // Six 32 KB stages fit an H100's shared memory, not an A100's.
        let mut k = Knowledge::shipped()
            .kernels(&p, MathType::Tf32, Arch::Sm80)
            .into_iter()
            .find(|k| k.tile == [128, 128, 32])
            .unwrap();
        k.stages = 6;
        assert!(
            k.invalid_reason().unwrap().contains("A100's shared memory"),
            "{:?}",
            k.invalid_reason()
        );
        assert_eq!(
            KernelSpec {
                arch: Arch::Sm90,
                ..k
            }
            .invalid_reason(),
            None
        );
    }

    #[test]
    fn sm80_kernels_fuse_epilogues_without_serial_split_k() {
        let e = Epilogue::parse("leaves=full,col;v1=gelu(v0);v2=mul(v1,l1);v3=add(v2,l0)").unwrap();
        // Long K over few tiles: an unfused data-parallel kernel would split K.
        let p = GemmProblem {
            bias: true,
            epilogue: Some(e.clone()),
            ..problem(256, 256, 524288, DType::F32)
        };
        for arch in Arch::ALL {
            let ks = Knowledge::shipped().kernels(&p, MathType::Tf32, arch);
            let sm80: Vec<&KernelSpec> =
                ks.iter().filter(|k| k.family == Family::Sm80Gemm).collect();
            assert!(
                !sm80.is_empty()
                    && sm80.iter().all(|k| k.fusion.as_ref() == Some(&e)
                        && k.fits(&p)
                        && k.invalid_reason().is_none()),
                "{arch}"
            );
            let dp = sm80
                .iter()
                .find(|k| k.scheduler == TileScheduler::Persistent)
                .unwrap();
            assert_eq!(estimate::with_best_splits(dp, &p).knobs.splits, 1, "{arch}");
            assert!(dp.knob_grid(&p).is_empty(), "{arch}");
            let split = dp.with_knobs(Knobs {
                splits: 4,
                ..Knobs::default()
            });
            assert!(
                split
                    .invalid_reason()
                    .unwrap()
                    .contains("no serial split-K"),
                "{arch}"
            );
            assert!(
                sm80.iter().any(|k| k.scheduler == TileScheduler::StreamK),
                "Stream-K splits K for them"
            );
        }
        let c = gemm_candidates(&p, MathType::Tf32, Arch::Sm80);
        assert!(!c.is_empty() && c.iter().all(|k| k.fusion.is_some() && k.knobs.splits == 1));
        // A column leaf is read element by element on sm80: an m that is no multiple of the
        // output's vector still fits, where sm90's vector reads refuse it.
        let odd_m = GemmProblem {
            m: 250,
            ..p.clone()
        };
        let ks = Knowledge::shipped().kernels(&odd_m, MathType::Tf32, Arch::Sm90);
        assert!(ks
            .iter()
            .any(|k| k.family == Family::Sm80Gemm && k.fits(&odd_m)));
        assert!(ks
            .iter()
            .filter(|k| k.family == Family::Sm90Gemm)
            .all(|k| !k.fits(&odd_m)));
    }

    #[test]
    fn alignment_reads_each_contiguous_dim() {
        let p = |m, n, k, layout| GemmProblem {
            layout,
            ..problem(m, n, k, DType::F32)
        };
        assert_eq!(p(4096, 4096, 4096, GemmLayout::Rrr).alignment(4), 4);
        // rrr: a reads K, b and the output N; M is no operand's contiguous dim.
        assert_eq!(p(4099, 4096, 4096, GemmLayout::Rrr).alignment(4), 4);
        assert_eq!(p(4096, 4096, 4094, GemmLayout::Rrr).alignment(4), 2);
        assert_eq!(p(4096, 4095, 4096, GemmLayout::Rrr).alignment(4), 1);
        // crr: a column-major reads M.
        assert_eq!(p(4098, 4096, 4096, GemmLayout::Crr).alignment(4), 2);
        assert_eq!(p(4096, 4096, 4098, GemmLayout::Crr).alignment(4), 4);
        // bf16 counts 8 elements to 16 bytes.
        assert_eq!(
            (GemmProblem {
                dtype: DType::Bf16,
                ..p(64, 4100, 64, GemmLayout::Rcr)
            })
            .alignment(8),
            4
        );
        // The plan's note names what the arch has: no TMA and no split on sm80.
        let ragged = p(4096, 4094, 4096, GemmLayout::Rrr);
        assert!(
            alignment_note(&ragged, Arch::Sm90).contains("cp.async / sm80 candidates")
                && alignment_note(&ragged, Arch::Sm90).contains("pads its split parts")
        );
        assert_eq!(
            alignment_note(&ragged, Arch::Sm80),
            "alignment 2: sm80 kernels of that alignment (a contiguous dim is not a multiple of 4)"
        );
        assert!(!alignment_note(&p(4096, 4096, 4096, GemmLayout::Rrr), Arch::Sm80).contains("TMA"));
    }

    #[test]
    fn ragged_problems_get_cp_async_sm80_and_padded_split_candidates() {
        // n = 30: every contiguous dim is even, none a multiple of 4.
        let even = problem(64, 30, 64, DType::F32);
        let ks = Knowledge::shipped().kernels(&even, MathType::Tf32, Arch::Sm90);
        assert!(!ks.is_empty());
        assert!(
            ks.iter()
                .all(|k| k.align == 2 && k.fits(&even) && k.invalid_reason().is_none()),
            "{:?}",
            ks.iter().map(KernelSpec::name).collect::<Vec<_>>()
        );
        let cp = ks
            .iter()
            .find(|k| k.schedule == KernelSchedule::CpAsyncWsCooperative)
            .expect("an sm90 cp.async kernel");
        // CUTLASS's generator stores the tf32 cp.async rows' output element by element.
        assert_eq!(
            (cp.align_out(), cp.epilogue, cp.cluster),
            (1, EpilogueKind::NoSmem, [1, 1, 1])
        );
        assert!(
            cp.kernel_name().ends_with("_cp_ws_coop_dp_nosmem_align2c1"),
            "{}",
            cp.kernel_name()
        );
        assert!(ks.iter().any(|k| k.family == Family::Sm80Gemm));
        // An odd dim: alignment 1.
        let odd = problem(4099, 5003, 3001, DType::F32);
        let c = gemm_candidates(&odd, MathType::Tf32, Arch::Sm90);
        assert!(c
            .iter()
            .any(|k| k.family == Family::Sm90Gemm && k.schedule.is_cpasync()));
        assert!(c.iter().any(|k| k.family == Family::Sm80Gemm));
        assert!(c
            .iter()
            .all(|k| k.align == 1 && k.align_c == 0 && k.kernel_name().ends_with("_align1")));
        // f32-accurate: the padded splits (alignment 1) and sm80 3xTF32.
        assert!(gemm_candidates(&odd, MathType::Tf32x3, Arch::Sm90)
            .iter()
            .any(|k| k.is_padded_split()));
        let c: Vec<_> = Knowledge::shipped()
            .kernels(&odd, MathType::Tf32x3, Arch::Sm90)
            .into_iter()
            .filter(|k| k.invalid_reason().is_none())
            .collect();
        for family in [Family::Sm90GemmX3, Family::Sm90GemmBf16x3, Family::Sm80Gemm] {
            assert!(
                c.iter().any(|k| k.family == family && k.align == 1),
                "{family:?}"
            );
        }
        assert!(c
            .iter()
            .filter(|k| k.family.is_split())
            .all(|k| k.is_padded_split()
                && k.gemm_align() == 16 / k.operand_bytes()
                && !k.schedule.is_cpasync()));
        // A ragged GEMM with a bias: sm80 takes the bias as its C operand; the no-smem epilogue
        // and the padded split fuse none.
        let biased = GemmProblem {
            bias: true,
            ..odd.clone()
        };
        for math in [MathType::Tf32, MathType::Tf32x3] {
            let c = gemm_candidates(&biased, math, Arch::Sm90);
            assert!(
                !c.is_empty() && c.iter().all(|k| k.family == Family::Sm80Gemm && k.bias),
                "{math:?}"
            );
        }
        // bf16 with an odd dim has no kernel at alignment 1 in CUTLASS's generator.
        let bf16 = problem(4099, 5003, 3001, DType::Bf16);
        assert!(gemm_candidates(&bf16, MathType::Bf16, Arch::Sm90).is_empty());
    }

    #[test]
    fn aligned_problems_keep_their_tma_candidates() {
        for math in [MathType::Tf32, MathType::Tf32x3] {
            let p = problem(4096, 4096, 4096, DType::F32);
            let ks = Knowledge::shipped().kernels(&p, math, Arch::Sm90);
            assert!(
                ks.iter()
                    .all(|k| !k.schedule.is_cpasync() && k.align_c == 0 && !k.is_padded_split()),
                "{math:?}"
            );
            assert!(
                ks.iter().all(|k| k.align == 16 / k.operand_bytes()),
                "{math:?}"
            );
        }
        // An n that is a multiple of 4 but not 8: the tf32 split keeps its aligned kernels; the
        // bf16 split, whose parts want 8, pads.
        let p = problem(4096, 4100, 4096, DType::F32);
        let ks = Knowledge::shipped().kernels(&p, MathType::Tf32x3, Arch::Sm90);
        assert!(ks
            .iter()
            .filter(|k| k.family == Family::Sm90GemmX3)
            .all(|k| k.align == 4));
        assert!(ks
            .iter()
            .filter(|k| k.family == Family::Sm90GemmBf16x3)
            .all(|k| k.align == 1));
    }

    #[test]
    fn alignment_rules_name_their_fix() {
        let odd = problem(4099, 5003, 3001, DType::F32);
        let ks = Knowledge::shipped().kernels(&odd, MathType::Tf32, Arch::Sm90);
        let cp = ks
            .iter()
            .find(|k| k.schedule == KernelSchedule::CpAsyncWs)
            .unwrap();
        let mut tma = KernelSpec {
            schedule: KernelSchedule::Ws,
            ..cp.clone()
        };
        assert!(tma
            .invalid_reason()
            .unwrap()
            .contains("cp.async schedules or the sm80 family"));
        tma.align = 3;
        assert!(tma.invalid_reason().unwrap().contains("power of two"));
        let clustered = KernelSpec {
            cluster: [2, 1, 1],
            ..cp.clone()
        };
        assert!(clustered
            .invalid_reason()
            .unwrap()
            .contains("cluster 1x1x1"));
        let canonical = KernelSpec {
            align_c: 1,
            ..cp.clone()
        };
        assert!(
            canonical.invalid_reason().unwrap().contains("other than 1"),
            "one kernel, one name"
        );
        // A kernel of alignment 4 does not fit a ragged problem; its alignment-1 sibling does.
        let aligned = Knowledge::shipped().kernels(
            &problem(4096, 4096, 4096, DType::F32),
            MathType::Tf32,
            Arch::Sm90,
        );
        assert!(aligned.iter().all(|k| !k.fits(&odd)));
        assert!(ks
            .iter()
            .all(|k| k.fits(&odd) && k.fits(&problem(4096, 4096, 4096, DType::F32))));
    }
}
