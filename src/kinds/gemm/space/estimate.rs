//! The analytic estimate that orders a sweep before nvcc and cuts its hopeless members. It is a
//! roofline per CTA tile: each tile costs its MMA work plus a fixed pipeline-fill and epilogue
//! overhead (so small tiles and short K lose), tiles run in waves over the SMs (so a last wave
//! that leaves SMs idle costs a whole wave), K splits add their partial-sum traffic, and the
//! whole is bounded below by DRAM and L2 traffic. The rates are the kernel's arch's
//! (`Arch::hardware`: for sm90 the H100 ceilings measured in benches/results, cuBLAS-level tf32 and
//! bf16), scaled per family: sm80 mma.sync kernels reach the arch's mma.sync share (about half the
//! WGMMA rate on sm90, all of it on sm80), tf32 WGMMA on an M-major operand goes through registers
//! (CUTLASS's RS mainloop) at about three quarters, the split families pay their split pass and two
//! GEMMs. It only has to rank; the tuner measures.

use super::{Family, KernelSchedule, KernelSpec, Knobs, TileScheduler};
use crate::kinds::gemm::{GemmLayout, GemmProblem};
use crate::types::{Hardware, MathType};

/// The GPU the kernel is built for.
fn hw(k: &KernelSpec) -> Hardware {
    k.arch.hardware()
}

fn sms(k: &KernelSpec) -> f64 {
    hw(k).sms as f64
}

fn launch_ms(k: &KernelSpec) -> f64 {
    hw(k).launch_us * 1e-3
}
/// What a split kernel costs beyond its launches and traffic on small problems (two CUTLASS
/// initialisations, a dependent chain of three kernels): 0.011–0.018 ms over this model on
/// 1000×1016×1032 (benches/results/2026-11-22-split), where sm80 3xTF32 wins.
const SPLIT_FIXED_MS: f64 = 0.010;

/// Mainloop rate by the width of a kernel's global loads, relative to 16-byte ones (TMA or
/// 16-byte cp.async): 8, 4 and 2 bytes per load (alignment 2 and 1 of fp32, 1 of bf16) issue two,
/// four and eight times the load instructions per byte and, on sm90, give up TMA. Guesses to rank
/// ragged kernels below aligned ones, not yet measured on the H100 (benches/device/coverage.sh).
const NARROW_LOAD_RATE: [(u32, f64); 3] = [(8, 0.85), (4, 0.7), (2, 0.6)];
/// The sm90 cp.async mainloop beyond its load width: producer warps compute addresses and
/// predicates that TMA does in hardware, and the no-smem epilogue stores element by element.
const CPASYNC_RATE: f64 = 0.9;
/// The padded split pass reads and writes element by element (the aligned one in 16-byte
/// vectors): its traffic at this fraction of DRAM bandwidth.
const PADDED_SPLIT_EFFICIENCY: f64 = 0.8;

/// TFLOP/s one SM sustains on this kernel's mainloop.
fn sm_rate(k: &KernelSpec) -> f64 {
    // The rate of the tensor-core math the mainloop runs: split families run tf32 or bf16 GEMMs.
    let h = hw(k);
    let chip = if k.operand_bytes() == 2 {
        h.bf16_tflops
    } else {
        h.tf32_tflops
    };
    let mut rate = chip / h.sms as f64;
    if k.family == Family::Sm80Gemm {
        rate *= h.mma_sync_share;
        if k.math == MathType::Tf32x3 {
            // Three products plus the big/small split in registers.
            rate /= 3.3;
        }
    }
    // tf32 WGMMA with an M- or N-major operand stages one through registers (CUTLASS's RS
    // mainloop): every layout but rcr (both K-major). The tf32 split family writes its parts
    // K-major, so only the plain family pays.
    let rs = k.family == Family::Sm90Gemm && k.operand_bytes() == 4 && k.layout != GemmLayout::Rcr;
    if rs {
        rate *= 0.75;
    }
    let load_bytes = k.gemm_align() * k.operand_bytes();
    rate *= NARROW_LOAD_RATE
        .iter()
        .find(|(b, _)| *b == load_bytes)
        .map_or(1.0, |(_, f)| *f);
    if k.schedule.is_cpasync() {
        rate *= CPASYNC_RATE;
    }
    if k.family.is_sm90() {
        // Accumulators per consumer thread: cooperative tiles are shared by two warpgroups, the
        // others held by one. Past 128 fp32 registers of accumulators the mainloop spills.
        let threads = if k.schedule.is_cooperative() {
            256
        } else {
            128
        };
        if k.tile[0] * k.tile[1] / threads > 128 {
            rate *= 0.1;
        }
        if rs && k.cluster[1] > 1 {
            // The register-staged operand is multicast only by a cluster along M; one along N
            // doubles its traffic (H100 sweeps).
            rate *= 0.5;
        }
    }
    if k.schedule == KernelSchedule::Ws {
        // One consumer warpgroup: the epilogue does not overlap the next tile's mainloop.
        rate *= 0.85;
    }
    rate
}

/// Output tiles of the CUTLASS problem (torch's transposed: its M is torch's N).
fn tiles(k: &KernelSpec, p: &GemmProblem) -> f64 {
    let (mm, nn) = (p.n as f64, p.m as f64);
    (mm / k.tile[0] as f64).ceil() * (nn / k.tile[1] as f64).ceil() * p.batch as f64
}

/// The waves `k` runs `p` in over its arch's SMs: its work units (tiles times K splits) over the
/// SMs, rounded up where they run in rounds (a last wave that leaves SMs idle costs a whole one),
/// as they are where stream-K balances them.
pub fn waves(k: &KernelSpec, p: &GemmProblem) -> f64 {
    let units = tiles(k, p) * k.knobs.splits.max(1) as f64;
    match k.scheduler {
        TileScheduler::StreamK if k.knobs.splits <= 1 => units / sms(k),
        _ => (units / sms(k)).ceil(),
    }
}

/// Milliseconds for one CTA to compute a tile over `kt` of K.
fn tile_ms(k: &KernelSpec, kt: f64) -> f64 {
    let (tm, tn, tk) = (k.tile[0] as f64, k.tile[1] as f64, k.tile[2] as f64);
    let k0 = tm * tn / (tm + tn) + 4.0 * tk;
    2.0 * tm * tn * (kt + k0) / (sm_rate(k) * 1e12) * 1e3
}

/// Estimated kernel time in milliseconds for `k` (with its knobs) on `p`.
pub fn estimate_ms(k: &KernelSpec, p: &GemmProblem) -> f64 {
    if !k.family.is_split() {
        return pass_ms(k, p, false) + launch_ms(k);
    }
    // Split families: one pass reading both fp32 operands and writing their two parts, then a
    // GEMM over K and one over 2K that reads the output back (templates/sm90_gemm_x3.cu.hbs).
    let (m, n, kk, b) = (p.m as f64, p.n as f64, p.k as f64, p.batch as f64);
    let dram_tbps = hw(k).dram_tbps;
    let mut split =
        (m * kk + kk * n) * b * (4.0 + 2.0 * k.operand_bytes() as f64) / (dram_tbps * 1e12) * 1e3;
    let mut gemm_p = p.clone();
    let mut copy_out = 0.0;
    if k.is_padded_split() {
        // Parts padded to whole vectors; an output whose rows are not goes through a workspace
        // and one more pass (read and write).
        let part = (16 / k.operand_bytes()) as i64;
        let pad = |v: i64| (v + part - 1) / part * part;
        gemm_p = GemmProblem {
            n: pad(p.n),
            k: pad(p.k),
            ..p.clone()
        };
        split /= PADDED_SPLIT_EFFICIENCY;
        if p.n % 4 != 0 {
            copy_out = 2.0 * m * n * b * 4.0 / (dram_tbps * 1e12) * 1e3 + launch_ms(k);
        }
    }
    let deep = GemmProblem {
        k: 2 * gemm_p.k,
        ..gemm_p.clone()
    };
    split
        + pass_ms(k, &gemm_p, false)
        + pass_ms(k, &deep, true)
        + 3.0 * launch_ms(k)
        + SPLIT_FIXED_MS
        + copy_out
}

/// One GEMM over the kernel's operands; `accumulate` reads the output back (beta = 1).
fn pass_ms(k: &KernelSpec, p: &GemmProblem, accumulate: bool) -> f64 {
    let t = tiles(k, p);
    let kk = p.k as f64;
    let splits = k.knobs.splits.max(1) as f64;
    let (h, sms) = (hw(k), sms(k));
    let compute = match k.scheduler {
        TileScheduler::StreamK if splits <= 1.0 => {
            // Work spread evenly over the SMs; partial tiles pay a fix-up.
            let total = t * tile_ms(k, kk);
            let fixup = if t < sms { tile_ms(k, 0.0) } else { 0.0 };
            (total / sms).max(tile_ms(k, kk / sms.max(1.0))) + fixup
        }
        _ => waves(k, p) * tile_ms(k, kk / splits),
    };
    let e = k.operand_bytes() as f64;
    let out = p.dtype.bytes() as f64;
    let (m, n, b) = (p.m as f64, p.n as f64, p.batch as f64);
    let mut dram = (m * kk + kk * n) * b * e + m * n * b * out * if accumulate { 2.0 } else { 1.0 };
    if splits > 1.0 || (k.scheduler == TileScheduler::StreamK && t < sms) {
        // Partial accumulators written and read back in fp32.
        dram += 2.0 * splits.max(2.0) * m * n * b * 4.0;
    }
    let l2 = t * (k.tile[0] + k.tile[1]) as f64 * kk * e;
    let memory = (dram / (h.dram_tbps * 1e12)).max(l2 / (h.l2_tbps * 1e12)) * 1e3;
    compute.max(memory)
}

/// K split counts worth trying for `k` on `p`, best estimate first (at most three).
pub fn split_choices(k: &KernelSpec, p: &GemmProblem) -> Vec<u32> {
    if p.batch > 1 {
        return vec![];
    }
    let t = tiles(k, p);
    let mut scored: Vec<(f64, u32)> = [2u32, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
        .into_iter()
        .filter(|&s| {
            t * s as f64 <= 2.0 * sms(k) && p.k as f64 / s as f64 >= 8.0 * k.tile[2] as f64
        })
        .map(|s| {
            (
                estimate_ms(
                    &k.with_knobs(Knobs {
                        splits: s,
                        ..k.knobs
                    }),
                    p,
                ),
                s,
            )
        })
        .collect();
    scored.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    scored.into_iter().take(3).map(|(_, s)| s).collect()
}

/// `k` with the split count the estimate prefers for its first timing: sm80 data-parallel kernels
/// that would leave most SMs idle split K (unless they fuse an epilogue, which serial split-K
/// cannot); everything else starts unsplit (sm90 Stream-K balances K by itself).
pub fn with_best_splits(k: &KernelSpec, p: &GemmProblem) -> KernelSpec {
    if k.family != Family::Sm80Gemm
        || k.scheduler != TileScheduler::Persistent
        || k.fusion.is_some()
        || tiles(k, p) * 2.0 > sms(k)
    {
        return k.clone();
    }
    let base = estimate_ms(k, p);
    match split_choices(k, p).first() {
        Some(&s)
            if estimate_ms(
                &k.with_knobs(Knobs {
                    splits: s,
                    ..k.knobs
                }),
                p,
            ) < base =>
        {
            k.with_knobs(Knobs {
                splits: s,
                ..k.knobs
            })
        }
        _ => k.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::gemm::space::Knowledge;
    use crate::types::{Arch, DType};

    fn problem(m: i64, n: i64, k: i64) -> GemmProblem {
        GemmProblem {
            m,
            n,
            k,
            layout: GemmLayout::Rrr,
            dtype: DType::F32,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        }
    }

    fn kernels(p: &GemmProblem) -> Vec<KernelSpec> {
        Knowledge::shipped().kernels(p, MathType::Tf32, Arch::Sm90)
    }

    #[test]
    fn a_full_last_wave_beats_a_ragged_one() {
        // 4096² with 128x256 tiles is 512 tiles: 3.9 waves on 132 SMs; a problem one tile row
        // bigger in M' runs 528 tiles = exactly 4 waves, almost no slower.
        let k = kernels(&problem(4096, 4096, 4096))
            .into_iter()
            .find(|k| k.tile[..2] == [128, 256] && k.scheduler == TileScheduler::Persistent)
            .unwrap();
        let a = estimate_ms(&k, &problem(4096, 4096, 4096));
        let b = estimate_ms(&k, &problem(4096, 4096 + 128, 4096));
        assert!(b / a < 1.05, "{a} {b}");
        // ... while one more tile than 4 full waves costs a fifth wave.
        let c = estimate_ms(&k, &problem(4096 + 256, 4096 + 128, 4096));
        assert!(c / b > 1.15, "{b} {c}");
    }

    #[test]
    fn waves_round_up_where_tiles_run_in_rounds_and_not_under_stream_k() {
        let p = problem(4096, 4096 + 128, 4096);
        let ks = kernels(&p);
        let k = |s: TileScheduler| {
            ks.iter()
                .find(|k| k.tile[..2] == [128, 256] && k.scheduler == s && k.knobs.splits <= 1)
                .unwrap()
        };
        // 4224/128 x 4096/256 = 33 x 16 = 528 tiles on 132 SMs: 4 waves exactly; one tile row
        // more, 544: a fifth, where stream-K spreads the 16 extra tiles over the SMs.
        assert_eq!(waves(k(TileScheduler::Persistent), &p), 4.0);
        let more = problem(4096, 4096 + 256, 4096);
        assert_eq!(waves(k(TileScheduler::Persistent), &more), 5.0);
        assert!((waves(k(TileScheduler::StreamK), &more) - 544.0 / 132.0).abs() < 1e-9);
    }

    #[test]
    fn the_estimate_runs_at_the_rates_of_the_kernels_arch() {
        let p = problem(4096, 4096, 4096);
        let best = |arch: Arch| {
            Knowledge::shipped()
                .kernels(&p, MathType::Tf32, arch)
                .iter()
                .filter(|k| k.family == Family::Sm80Gemm)
                .map(|k| estimate_ms(k, &p))
                .fold(f64::INFINITY, f64::min)
        };
        // On an A100 the sm80 family is the native path: 2·4096³ at its 125 TFLOP/s is 1.10 ms,
        // plus tile overheads. On an H100 it runs at half of 397.
        let (a100, h100) = (best(Arch::Sm80), best(Arch::Sm90));
        assert!(a100 > 1.1 && a100 < 1.5, "{a100}");
        assert!(h100 < 0.8 * a100, "{h100} vs {a100}");
    }

    #[test]
    fn long_k_with_few_tiles_wants_k_splitting() {
        let p = problem(256, 256, 524288);
        let ks = kernels(&p);
        let dp = ks
            .iter()
            .find(|k| k.family == Family::Sm80Gemm && k.scheduler == TileScheduler::Persistent)
            .unwrap();
        let split = with_best_splits(dp, &p);
        assert!(split.knobs.splits > 1, "{}", split.name());
        assert!(estimate_ms(&split, &p) < estimate_ms(dp, &p) / 4.0);
        let best = ks
            .iter()
            .map(|k| with_best_splits(k, &p))
            .min_by(|a, b| estimate_ms(a, &p).partial_cmp(&estimate_ms(b, &p)).unwrap())
            .unwrap();
        assert!(
            best.knobs.splits > 1 || best.scheduler == TileScheduler::StreamK,
            "{}",
            best.name()
        );
    }

    #[test]
    fn small_tiles_lose_to_big_ones_on_big_problems_and_rs_costs() {
        let p = problem(4096, 4096, 4096);
        let ks = kernels(&p);
        let by_tile = |t: [u32; 2]| {
            ks.iter()
                .find(|k| {
                    k.tile[..2] == t
                        && k.family == Family::Sm90Gemm
                        && k.scheduler == TileScheduler::Persistent
                        && k.cluster == [2, 1, 1]
                        && k.schedule != KernelSchedule::Ws
                })
                .unwrap()
        };
        assert!(estimate_ms(by_tile([64, 128]), &p) > estimate_ms(by_tile([128, 256]), &p));
        let rcr = GemmProblem {
            layout: GemmLayout::Rcr,
            ..p.clone()
        };
        let k = by_tile([128, 256]);
        let k_rcr = KernelSpec {
            layout: GemmLayout::Rcr,
            ..k.clone()
        };
        assert!(estimate_ms(&k_rcr, &rcr) < estimate_ms(k, &p));
        // Register pressure: a 128x256 tile on one warpgroup (ping-pong) spills; shared by two
        // (cooperative) it does not.
        let spill = ks
            .iter()
            .find(|k| k.tile[..2] == [128, 256] && k.schedule == KernelSchedule::WsPingpong)
            .unwrap();
        let coop = ks
            .iter()
            .find(|k| {
                k.tile[..2] == [128, 256]
                    && k.schedule == KernelSchedule::WsCooperative
                    && k.cluster == spill.cluster
            })
            .unwrap();
        assert!(estimate_ms(spill, &p) > 3.0 * estimate_ms(coop, &p));
    }

    #[test]
    fn narrow_loads_rank_below_aligned_ones() {
        // One problem, one tile: the aligned TMA kernel, the cp.async one at alignment 1 (as if the
        // problem were ragged), sm80 at 4 and at 1.
        let p = problem(4096, 4096, 4096);
        let ragged = problem(4096, 4095, 4096);
        let cp = Knowledge::shipped()
            .kernels(&ragged, MathType::Tf32, Arch::Sm90)
            .into_iter()
            .find(|k| {
                k.schedule == KernelSchedule::CpAsyncWsCooperative
                    && k.tile == [128, 128, 32]
                    && k.scheduler == TileScheduler::Persistent
            })
            .unwrap();
        let tma = kernels(&p)
            .into_iter()
            .find(|k| {
                k.schedule == KernelSchedule::WsCooperative
                    && k.tile == [128, 128, 32]
                    && k.cluster == [1, 1, 1]
                    && k.scheduler == TileScheduler::Persistent
            })
            .unwrap_or_else(|| KernelSpec {
                schedule: KernelSchedule::WsCooperative,
                align: 4,
                epilogue: crate::kinds::gemm::space::EpilogueKind::Tma,
                ..cp.clone()
            });
        assert!(
            estimate_ms(&cp, &p) > 1.3 * estimate_ms(&tma, &p),
            "{} vs {}",
            estimate_ms(&cp, &p),
            estimate_ms(&tma, &p)
        );
        let sm80 = kernels(&p)
            .into_iter()
            .find(|k| k.family == Family::Sm80Gemm && k.tile == [128, 128, 32])
            .unwrap();
        let sm80_1 = KernelSpec {
            align: 1,
            ..sm80.clone()
        };
        assert!(estimate_ms(&sm80_1, &p) > 1.3 * estimate_ms(&sm80, &p));
        // The padded split pays its scalar pass and, for ragged rows, the copy out: a little, not
        // a family's worth.
        let aligned = Knowledge::shipped()
            .kernels(&p, MathType::Tf32x3, Arch::Sm90)
            .into_iter()
            .find(|k| k.family == Family::Sm90GemmBf16x3)
            .unwrap();
        let padded = KernelSpec {
            align: 1,
            ..aligned.clone()
        };
        let (a, b) = (estimate_ms(&aligned, &p), estimate_ms(&padded, &ragged));
        assert!(b > a && b < 1.15 * a, "{a} {b}");
    }

    #[test]
    fn split_families_pay_the_split_and_the_bf16_split_runs_faster() {
        // The best estimate of a family's kernels that fit `p`.
        let best = |f: Family, p: &GemmProblem| {
            Knowledge::shipped()
                .kernels(p, MathType::Tf32x3, Arch::Sm90)
                .iter()
                .filter(|k| k.family == f && k.fits(p))
                .map(|k| estimate_ms(k, p))
                .fold(f64::INFINITY, f64::min)
        };
        let p = problem(4096, 4096, 4096);
        let ks = Knowledge::shipped().kernels(&p, MathType::Tf32x3, Arch::Sm90);
        let (b3, x3, sm80) = (
            best(Family::Sm90GemmBf16x3, &p),
            best(Family::Sm90GemmX3, &p),
            best(Family::Sm80Gemm, &p),
        );
        assert!(b3 < x3 && x3 < sm80, "b3 {b3} x3 {x3} sm80 {sm80}");
        // Three tf32 GEMMs' worth of work (one over K, one over 2K) plus the split pass: above
        // three single tf32 GEMMs of the same tile on a K-major layout.
        let x3k = ks
            .iter()
            .find(|k| {
                k.family == Family::Sm90GemmX3
                    && k.tile[..2] == [128, 256]
                    && k.schedule == KernelSchedule::WsCooperative
            })
            .unwrap();
        let single = KernelSpec {
            family: Family::Sm90Gemm,
            math: MathType::Tf32,
            layout: GemmLayout::Rcr,
            ..x3k.clone()
        };
        let rcr = GemmProblem {
            layout: GemmLayout::Rcr,
            ..p.clone()
        };
        assert!(
            estimate_ms(x3k, &p) > 3.0 * estimate_ms(&single, &rcr),
            "{} vs {}",
            estimate_ms(x3k, &p),
            estimate_ms(&single, &rcr)
        );
        // On a small problem their fixed costs lose to sm80's in-register split (as measured).
        let small = problem(1000, 1016, 1032);
        assert!(best(Family::Sm80Gemm, &small) < best(Family::Sm90GemmBf16x3, &small));
        // The tf32 split writes K-major parts: an rrr problem costs no RS penalty.
        let x3_rcr = KernelSpec {
            layout: GemmLayout::Rcr,
            ..x3k.clone()
        };
        assert!((estimate_ms(x3k, &p) - estimate_ms(&x3_rcr, &rcr)).abs() < 1e-9);
    }
}
