//! The knowledge base: the GEMM instantiations CUTLASS's own generator declares valid, distilled
//! from cutlass_library by tools/distill_cutlass.py into knowledge/cutlass-<version>.json. The
//! file for the pinned CUTLASS ships inside the binary; `fact knowledge refresh` distils the
//! installed CUTLASS again into the user's data folder, and that copy wins when its version
//! matches the toolchain's.

use super::{EpilogueKind, Family, KernelSchedule, KernelSpec, Knobs, TileScheduler};
use crate::kinds::gemm::{GemmLayout, GemmProblem, Major};
use crate::types::{Arch, DType, MathType};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const SHIPPED: &str = include_str!("../../../../knowledge/cutlass-4.2.0.0.json");
pub const FORMAT: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Sm90Row {
    pub math: String,
    pub element: String,
    pub tile: [u32; 3],
    pub instruction: [u32; 3],
    pub cluster: [u32; 3],
    pub kernel_schedule: String,
    pub epilogue_schedule: String,
    pub tile_scheduler: String,
    pub stages: u32,
    pub layouts: Vec<String>,
    pub alignment: [u32; 3],
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Sm80Row {
    pub math: String,
    pub element: String,
    pub tile: [u32; 3],
    pub warp_count: [u32; 3],
    pub instruction: [u32; 3],
    pub stages: u32,
    pub layouts: Vec<String>,
    pub alignment: [u32; 3],
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Knowledge {
    pub format: u32,
    pub cutlass_version: String,
    pub source: String,
    pub sm90: Vec<Sm90Row>,
    pub sm80: Vec<Sm80Row>,
    /// Where this copy was read from (not part of the file).
    #[serde(skip)]
    pub origin: String,
}

/// CUTLASS's letters for the operand layouts of fact's problem. fact hands CUTLASS the transposed
/// problem (operand A is torch's Bᵀ, operand B is torch's aᵀ, the output column-major), so a
/// row-major torch operand is a column-major ("n") CUTLASS one and a column-major one is "t":
/// torch's rcr is CUTLASS "tn" (both K-major), rrr "nn", crr "nt" and ccr "tt".
pub fn cutlass_layouts(layout: GemmLayout) -> &'static str {
    match layout {
        GemmLayout::Rcr => "tn",
        GemmLayout::Rrr => "nn",
        GemmLayout::Crr => "nt",
        GemmLayout::Ccr => "tt",
    }
}

impl Knowledge {
    pub fn parse(text: &str, origin: &str) -> Result<Knowledge, String> {
        let mut kb: Knowledge = serde_json::from_str(text)
            .map_err(|e| format!("{origin}: not a fact knowledge base: {e}"))?;
        if kb.format != FORMAT {
            return Err(format!(
                "{origin}: knowledge format {} but this fact reads format {FORMAT}; run `fact knowledge refresh`",
                kb.format
            ));
        }
        kb.origin = origin.to_string();
        Ok(kb)
    }

    /// The copy built into this binary (the pinned CUTLASS).
    pub fn shipped() -> &'static Knowledge {
        static KB: OnceLock<Knowledge> = OnceLock::new();
        KB.get_or_init(|| {
            Knowledge::parse(SHIPPED, "shipped knowledge/cutlass-4.2.0.0.json")
                .expect("the shipped knowledge base parses")
        })
    }

    /// The folder `fact knowledge refresh` writes to: $FACT_DATA_DIR, else $XDG_DATA_HOME/fact,
    /// else ~/.local/share/fact; plus knowledge/.
    pub fn user_dir() -> PathBuf {
        let base = std::env::var_os("FACT_DATA_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::var_os("XDG_DATA_HOME")
                    .map(|d| PathBuf::from(d).join("fact"))
                    .unwrap_or_else(|| {
                        std::env::var_os("HOME")
                            .map(PathBuf::from)
                            .unwrap_or_else(std::env::temp_dir)
                            .join(".local/share/fact")
                    })
            });
        base.join("knowledge")
    }

    pub fn file_name(cutlass_version: &str) -> String {
        format!("cutlass-{cutlass_version}.json")
    }

    /// The knowledge base for the CUTLASS `version` the toolchain compiles with: $FACT_KNOWLEDGE if
    /// set, else a refreshed copy for that version, else the shipped one. A shipped copy of
    /// another version is used with a note saying how to refresh.
    pub fn for_cutlass(version: &str) -> Result<(Knowledge, Option<String>), String> {
        if let Some(p) = std::env::var_os("FACT_KNOWLEDGE") {
            return Ok((Knowledge::read(Path::new(&p))?, None));
        }
        let user = Knowledge::user_dir().join(Knowledge::file_name(version));
        if user.is_file() {
            return Ok((Knowledge::read(&user)?, None));
        }
        let shipped = Knowledge::shipped().clone();
        let note = (!shipped.is_for(version) && version != "unknown").then(|| {
            format!(
                "the shipped knowledge base is for CUTLASS {} but the toolchain has {version}; run `fact knowledge refresh`",
                shipped.cutlass_version
            )
        });
        Ok((shipped, note))
    }

    /// Whether this knowledge base describes CUTLASS `version`: the wheel's version ("4.2.0.0")
    /// or the headers' ("4.2.0").
    pub fn is_for(&self, version: &str) -> bool {
        self.cutlass_version == version || self.cutlass_version.starts_with(&format!("{version}."))
    }

    pub fn read(path: &Path) -> Result<Knowledge, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Knowledge::parse(&text, &path.display().to_string())
    }

    pub fn describe(&self) -> String {
        format!(
            "CUTLASS {} knowledge base ({})",
            self.cutlass_version, self.origin
        )
    }

    /// Every kernel CUTLASS instantiates for this problem's (math, dtype, layout) on `arch` at the
    /// problem's alignment (`GemmProblem::alignment`), as fact specs with default knobs: TMA rows when
    /// every contiguous dim is a whole 16-byte vector, else the cp.async rows and sm80 rows of that
    /// alignment, and the split families with padded parts. Rows fact's templates do not render
    /// (transposed epilogues, automatic schedules) are left out: so tf32 "tt" (torch's ccr), which
    /// CUTLASS's generator instantiates only with a transposed epilogue, gets sm80 kernels alone.
    pub fn kernels(&self, p: &GemmProblem, math: MathType, arch: Arch) -> Vec<KernelSpec> {
        let letters = cutlass_layouts(p.layout);
        let full = 16 / p.dtype.bytes() as u32;
        let align = p.alignment(full);
        let mut out = Vec::new();
        // fp32-accurate runs tf32 instantiations over K-major tf32 parts (x3) and bf16
        // instantiations over bf16 parts in torch's layout (b3). Their split passes read a
        // row-major a; a column-major one has the sm80 3xTF32 kernels. A problem whose dims are
        // not whole vectors of parts gets the padded split (alignment 1), which has no bias or
        // epilogue.
        let split = p.dtype == DType::F32 && p.layout.a() == Major::Row;
        let plain = !p.bias && p.epilogue.is_none();
        let split_align = |parts: u32| {
            if p.alignment(parts) == parts {
                Some(parts)
            } else {
                plain.then_some(1)
            }
        };
        // (row math, row element, row layouts, row alignment, the spec's alignment, family)
        let mut sm90_sources: Vec<(&str, &str, &str, u32, u32, Family)> = Vec::new();
        match math {
            MathType::Tf32x3 if split => {
                if let Some(a) = split_align(full) {
                    sm90_sources.push((
                        "tf32",
                        "f32",
                        cutlass_layouts(GemmLayout::Rcr),
                        full,
                        a,
                        Family::Sm90GemmX3,
                    ));
                }
                if let Some(a) = split_align(8) {
                    sm90_sources.push(("bf16", "bf16", letters, 8, a, Family::Sm90GemmBf16x3));
                }
            }
            MathType::Tf32x3 => {}
            _ => sm90_sources.push((
                math.short_name(),
                p.dtype.short_name(),
                letters,
                align,
                align,
                Family::Sm90Gemm,
            )),
        }
        // An sm80 build takes the sm80 rows alone.
        sm90_sources.retain(|s| s.5.builds_for(arch));
        for (r, &(row_math, element, letters, row_align, align, family)) in sm90_sources
            .iter()
            .flat_map(|s| self.sm90.iter().map(move |r| (r, s)))
        {
            if r.math != row_math || r.element != element || !r.layouts.iter().any(|l| l == letters)
            {
                continue;
            }
            if r.alignment[0] != row_align || r.alignment[1] != row_align {
                continue;
            }
            let schedule = match r.kernel_schedule.as_str() {
                "ws" => KernelSchedule::Ws,
                "ws_cooperative" => KernelSchedule::WsCooperative,
                "ws_pingpong" => KernelSchedule::WsPingpong,
                "cpasync_ws" => KernelSchedule::CpAsyncWs,
                "cpasync_ws_cooperative" => KernelSchedule::CpAsyncWsCooperative,
                _ => continue,
            };
            // A TMA row at full alignment serves aligned problems only; cp.async rows only
            // problems that are not (an aligned problem keeps exactly its TMA candidates).
            if schedule.is_cpasync() != (row_align < full) {
                continue;
            }
            let fused = p.bias || p.epilogue.is_some();
            let epilogue = match r.epilogue_schedule.as_str() {
                "tma_ws" | "tma_ws_cooperative" => EpilogueKind::Tma,
                // The no-smem epilogue takes only a plain linear combination: no bias, no
                // fusion. The epilogue is the builder's choice apart from the mainloop, and the
                // generator pairs its big tf32 tiles (128x256, 256x128, 256x256) with the
                // no-smem and transposed epilogues only; a fused problem gets such a TMA row with
                // the TMA epilogue instead (measured on the H100: 128x256 cooperative ran
                // 65536x768x3072 bias + residual in 0.843 ms where the generator's best pairing
                // took 0.967). One that fails to build or run is learned like any other failure.
                "no_smem" if fused && !schedule.is_cpasync() => EpilogueKind::Tma,
                "no_smem" if !fused => EpilogueKind::NoSmem,
                _ => continue,
            };
            let scheduler = match r.tile_scheduler.as_str() {
                "persistent" => TileScheduler::Persistent,
                "stream_k" => TileScheduler::StreamK,
                _ => continue,
            };
            let mut spec = KernelSpec {
                family,
                arch,
                layout: p.layout,
                math,
                dtype: p.dtype,
                tile: r.tile,
                cluster: r.cluster,
                schedule,
                scheduler,
                bias: p.bias,
                align,
                align_c: 0,
                warps: [0, 0, 0],
                stages: r.stages,
                epilogue,
                knobs: Knobs::default(),
                fusion: p.epilogue.clone(),
            };
            // The row's own output alignment where it differs from the operands' (cp.async rows).
            if family == Family::Sm90Gemm && r.alignment[2] != spec.implied_align_out() {
                spec.align_c = r.alignment[2];
            }
            out.push(spec);
        }
        // The sm80 family renders a fused epilogue as an Sm80EVT visitor tree.
        for r in &self.sm80 {
            if r.math != math.short_name()
                || r.element != p.dtype.short_name()
                || !r.layouts.iter().any(|l| l == letters)
            {
                continue;
            }
            if r.alignment != [align; 3] {
                continue;
            }
            // CUTLASS's generator builds these with the identity swizzle; GemmUniversal runs the
            // same mainloop under Stream-K too, so both grid levels are candidates.
            for scheduler in [TileScheduler::Persistent, TileScheduler::StreamK] {
                out.push(KernelSpec {
                    family: Family::Sm80Gemm,
                    arch,
                    layout: p.layout,
                    math,
                    dtype: p.dtype,
                    tile: r.tile,
                    cluster: [1, 1, 1],
                    schedule: KernelSchedule::Multistage,
                    scheduler,
                    bias: p.bias,
                    align,
                    align_c: 0,
                    warps: r.warp_count,
                    stages: r.stages,
                    epilogue: EpilogueKind::Tma,
                    knobs: Knobs::default(),
                    fusion: p.epilogue.clone(),
                });
            }
        }
        let mut seen = std::collections::HashSet::new();
        out.retain(|k| seen.insert(k.kernel_name()));
        out
    }
}

/// Runs tools/distill_cutlass.py with `python` and writes the knowledge base of the installed
/// CUTLASS into the user folder. `site` (put first on PYTHONPATH) is the folder holding the
/// cutlass_library whose headers the toolchain compiles with. Returns the path written.
pub fn refresh(
    python: &Path,
    script: &Path,
    site: Option<&Path>,
    version: &str,
) -> Result<PathBuf, String> {
    let dir = Knowledge::user_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let out = dir.join(Knowledge::file_name(version));
    crate::atomic::write_with(
        &out,
        |tmp| {
            let mut cmd = std::process::Command::new(python);
            if let Some(site) = site {
                cmd.env("PYTHONPATH", site);
            }
            let status = cmd
                .arg(script)
                .arg("--out")
                .arg(tmp)
                .output()
                .map_err(|e| {
                    format!("cannot run {} {}: {e}", python.display(), script.display())
                })?;
            if !status.status.success() {
                return Err(format!(
                    "{} failed:\n{}{}",
                    script.display(),
                    String::from_utf8_lossy(&status.stdout),
                    String::from_utf8_lossy(&status.stderr)
                ));
            }
            let kb = Knowledge::read(tmp)?;
            if !kb.is_for(version) {
                return Err(format!(
                    "the distiller read CUTLASS {} but the toolchain compiles with {version}; point {} at the same install",
                    kb.cutlass_version,
                    python.display()
                ));
            }
            Ok(())
        },
        |e| format!("cannot write {}: {e}", out.display()),
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    fn problem(layout: GemmLayout, dtype: DType) -> GemmProblem {
        GemmProblem {
            m: 4096,
            n: 4096,
            k: 4096,
            layout,
            dtype,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        }
    }

    #[test]
    fn shipped_knowledge_parses_and_names_its_cutlass() {
        let kb = Knowledge::shipped();
        assert_eq!(kb.cutlass_version, "4.2.0.0");
        assert!(
            kb.sm90.len() > 100 && kb.sm80.len() > 100,
            "{} {}",
            kb.sm90.len(),
            kb.sm80.len()
        );
    }

    #[test]
    fn derived_kernels_come_from_the_generator_rows() {
        let kb = Knowledge::shipped();
        for (layout, dtype, math) in [
            (GemmLayout::Rrr, DType::F32, MathType::Tf32),
            (GemmLayout::Rcr, DType::F32, MathType::Tf32),
            (GemmLayout::Rrr, DType::Bf16, MathType::Bf16),
            (GemmLayout::Rcr, DType::F16, MathType::F16),
        ] {
            let ks = kb.kernels(&problem(layout, dtype), math, Arch::Sm90);
            assert!(
                ks.iter().any(|k| k.family == Family::Sm90Gemm),
                "{layout:?} {dtype}"
            );
            assert!(
                ks.iter().any(|k| k.family == Family::Sm80Gemm),
                "{layout:?} {dtype}"
            );
            for k in &ks {
                // Each sm90 kernel is a generator row with the same tile, cluster and schedule.
                if k.family == Family::Sm90Gemm {
                    assert!(kb.sm90.iter().any(|r| r.tile == k.tile
                        && r.cluster == k.cluster
                        && r.math == math.short_name()
                        && r.layouts.iter().any(|l| l == cutlass_layouts(layout))));
                } else {
                    assert!(kb.sm80.iter().any(|r| r.tile == k.tile
                        && r.warp_count == k.warps
                        && r.stages == k.stages));
                }
            }
        }
        // fp32-accurate: sm80 3xTF32 mainloops, the sm90 tf32 rows over K-major parts (x3) and
        // the sm90 bf16 rows over bf16 parts (b3), whose alignment counts bf16 elements.
        let ks = kb.kernels(
            &problem(GemmLayout::Rrr, DType::F32),
            MathType::Tf32x3,
            Arch::Sm90,
        );
        assert!(!ks.is_empty());
        assert!(ks
            .iter()
            .all(|k| k.math == MathType::Tf32x3 && k.dtype == DType::F32));
        for family in [Family::Sm80Gemm, Family::Sm90GemmX3, Family::Sm90GemmBf16x3] {
            assert!(ks.iter().any(|k| k.family == family), "{family:?}");
        }
        let tf32_tn: Vec<_> = kb
            .sm90
            .iter()
            .filter(|r| r.math == "tf32" && r.layouts.iter().any(|l| l == "tn"))
            .collect();
        for k in ks.iter().filter(|k| k.family == Family::Sm90GemmX3) {
            assert!(
                tf32_tn
                    .iter()
                    .any(|r| r.tile == k.tile && r.cluster == k.cluster),
                "{}",
                k.name()
            );
        }
        for k in ks.iter().filter(|k| k.family == Family::Sm90GemmBf16x3) {
            assert_eq!(
                (k.align, k.operand_bytes(), k.tile[2]),
                (8, 2, 64),
                "{}",
                k.name()
            );
            assert!(
                k.kernel_name().starts_with("sm90b3_gemm_rrr_bf16x3_f32_"),
                "{}",
                k.kernel_name()
            );
        }
        assert!(ks
            .iter()
            .any(|k| k.family == Family::Sm90GemmBf16x3 && k.invalid_reason().is_none()));
        let with_bias = GemmProblem {
            bias: true,
            ..problem(GemmLayout::Rcr, DType::F32)
        };
        // The split families add the bias in their second GEMM's visitor tree: TMA epilogues only.
        let biased = kb.kernels(&with_bias, MathType::Tf32x3, Arch::Sm90);
        assert!(biased.iter().any(|k| k.family.is_split()));
        assert!(biased
            .iter()
            .filter(|k| k.family.is_split())
            .all(|k| k.epilogue == EpilogueKind::Tma && k.bias));
    }

    #[test]
    fn every_layout_has_kernels_from_its_generator_rows() {
        let kb = Knowledge::shipped();
        for layout in GemmLayout::ALL {
            for (dtype, math) in [
                (DType::F32, MathType::Tf32),
                (DType::Bf16, MathType::Bf16),
                (DType::F32, MathType::Tf32x3),
            ] {
                let ks = kb.kernels(&problem(layout, dtype), math, Arch::Sm90);
                assert!(
                    ks.iter()
                        .any(|k| k.family == Family::Sm80Gemm && k.layout == layout),
                    "{layout:?} {math:?}"
                );
                assert!(ks.iter().all(|k| k
                    .kernel_name()
                    .contains(&format!("_gemm_{}_", layout.short_name()))));
                // CUTLASS instantiates tf32 "tt" only with a transposed epilogue, which fact does
                // not render; the split families read a row-major a.
                let sm90 = ks.iter().any(|k| k.family.is_sm90());
                let want = match math {
                    MathType::Tf32 => layout != GemmLayout::Ccr,
                    MathType::Tf32x3 => layout.a() == Major::Row,
                    _ => true,
                };
                assert_eq!(sm90, want, "{layout:?} {math:?}");
            }
        }
    }

    #[test]
    fn a_wrong_format_is_refused_with_the_fix() {
        let text = SHIPPED.replacen("\"format\": 1", "\"format\": 9", 1);
        let e = Knowledge::parse(&text, "x.json").unwrap_err();
        assert!(e.contains("fact knowledge refresh"), "{e}");
    }
}
