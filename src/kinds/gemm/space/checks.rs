//! What CUTLASS would reject and what a problem admits: a spec's validity (mirroring the
//! static_asserts of the families fact renders), whether a kernel fits a problem, the launch knobs
//! worth timing, and the plan's lines on alignment and epilogue fusion.

use super::*;
use crate::kinds::gemm::Major;
use crate::types::DType;

impl KernelSpec {
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
                // The 128x192 tile was measured in the plain family's TMA kernels only.
                let n192 = [tm, tn] == SM90_TILE_N192
                    && self.family == Family::Sm90Gemm
                    && SM90_TILE_N192_SCHEDULES.contains(&self.schedule);
                if !n192 && (![64, 128, 256].contains(&tn) || ![64, 128, 256].contains(&tm)) {
                    return Some(format!(
                        "tile {tm}x{tn} outside the generator's 64/128/256 set and its cooperative and ping-pong 128x192"
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
                    if e.full_leaves() > crate::kinds::gemm::epilogue::MAX_FULL_LEAVES {
                        return Some(format!("an epilogue reads at most {} full-size tensors (the C operand and aux loads)", crate::kinds::gemm::epilogue::MAX_FULL_LEAVES));
                    }
                }
                if !SM90_CLUSTERS.contains(&self.cluster) {
                    let shape = |[m, n, k]: [u32; 3]| format!("{m}x{n}x{k}");
                    let all: Vec<String> = SM90_CLUSTERS.into_iter().map(shape).collect();
                    return Some(format!(
                        "cluster {} is none of CUTLASS's sm90 shapes ({})",
                        shape(self.cluster),
                        all.join(", ")
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
                !e.leaves.contains(&crate::kinds::gemm::LeafKind::Col) || (p.batch == 1 && (!self.family.is_sm90() || p.m % self.align_out() as i64 == 0))
            })
            // The contiguous dim of each operand and of the output in whole vectors (batch
            // strides are multiples of them).
            && p.alignment(self.align) == self.align
            && p.n % self.align_out() as i64 == 0
            // Serial split-K and Stream-K in CUTLASS 2.x's GemmUniversal are for single GEMMs.
            && !(self.family == Family::Sm80Gemm && p.batch > 1 && (self.knobs.splits > 1 || self.scheduler == TileScheduler::StreamK))
    }

    /// The same kernel in CUTLASS's other sm90 cluster shapes that run `p` (TMA mainloops only:
    /// cp.async ones multicast nothing), with default knobs.
    pub fn cluster_siblings(&self, p: &GemmProblem) -> Vec<KernelSpec> {
        if !self.family.is_sm90() || self.schedule.is_cpasync() {
            return Vec::new();
        }
        SM90_CLUSTERS
            .iter()
            .filter(|c| **c != self.cluster)
            .map(|&cluster| KernelSpec {
                cluster,
                knobs: Knobs::default(),
                ..self.clone()
            })
            .filter(|k| k.invalid_reason().is_none() && k.fits(p))
            .collect()
    }

    /// The 128x192 tile (`SM90_TILE_N192`) of a TMA cooperative or ping-pong (plain family) 128x128
    /// or 128x256 kernel where it runs `p`: in both schedules (the ping-pong one data-parallel),
    /// each in the kernel's own cluster shape and in 1x1x1, with default knobs; none for others.
    /// Both schedules, whatever the leader's: ping-pong runs the epilogue beside the other warp
    /// group's mainloop and won the tf32 GELU and the bf16 residual, whose sweeps 128x128 ping-pong
    /// and 128x256 cooperative had led; cooperative keeps a residual's mainloop stages and ran the
    /// tf32 out + residual 2% behind ping-pong, ahead of every other tile. 1x1x1 because the
    /// tile's cluster shapes differ more than the tiles do and that one ran it best: tf32
    /// 65536x768x3072 + bias + residual on the H100 took 0.811 ms in 1x1x1, 0.849 in 2x1x1 and
    /// 0.956 in 1x2x1 (cooperative), tf32 65536x3072x768 + bias + tanh GELU 0.776 in 1x1x1, 0.796
    /// in 2x1x1 and 0.821 in 2x2x1 (ping-pong; benches/results/parity, the 128x192 tiles).
    pub fn tile_siblings(&self, p: &GemmProblem) -> Vec<KernelSpec> {
        let [tm, tn, tk] = self.tile;
        if self.family != Family::Sm90Gemm
            || !SM90_TILE_N192_SCHEDULES.contains(&self.schedule)
            || tm != SM90_TILE_N192[0]
            || ![128, 256].contains(&tn)
        {
            return Vec::new();
        }
        let mut clusters = vec![self.cluster];
        if self.cluster != [1, 1, 1] {
            clusters.push([1, 1, 1]);
        }
        SM90_TILE_N192_SCHEDULES
            .into_iter()
            .flat_map(|schedule| clusters.iter().map(move |&cluster| (schedule, cluster)))
            .map(|(schedule, cluster)| KernelSpec {
                tile: [tm, SM90_TILE_N192[1], tk],
                cluster,
                schedule,
                // Stream-K runs only with the cooperative schedule.
                scheduler: if schedule.is_cooperative() {
                    self.scheduler
                } else {
                    TileScheduler::Persistent
                },
                knobs: Knobs::default(),
                ..self.clone()
            })
            .filter(|k| k.invalid_reason().is_none() && k.fits(p))
            .collect()
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
pub(super) fn fusing_kernel(p: &GemmProblem, math: MathType, arch: Arch) -> Option<KernelSpec> {
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

#[cfg(test)]
mod tests {
    use super::super::tests::problem;
    use super::*;
    use crate::kinds::gemm::{Epilogue, GemmLayout};

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
}
