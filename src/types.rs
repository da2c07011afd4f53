//! The shared vocabulary of every stage: element types, precision policies and GPU architectures.
//! Each enum owns its lookup tables as exhaustive matches, so a new variant breaks the build
//! wherever a table needs a row.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Element type of a tensor as fact sees it in a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Bf16,
    F16,
}

impl DType {
    pub fn short_name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }
    pub fn cutlass_tag(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::Bf16 => "cutlass::bfloat16_t",
            DType::F16 => "cutlass::half_t",
        }
    }
    pub fn bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 | DType::F16 => 2,
        }
    }
    /// The lowest finite value (torch's `finfo.min`), which masks an attention score where it is
    /// added or filled.
    pub fn lowest(self) -> f64 {
        match self {
            DType::F32 => f32::MIN as f64,
            DType::Bf16 => -3.389_531_389_251_535_5e38,
            DType::F16 => -65504.0,
        }
    }
    pub fn tch_kind(self) -> tch::Kind {
        match self {
            DType::F32 => tch::Kind::Float,
            DType::Bf16 => tch::Kind::BFloat16,
            DType::F16 => tch::Kind::Half,
        }
    }
    /// Parses the names the bridge and the CLI use (`f32`, `bf16`, `f16`).
    pub fn parse(s: &str) -> Option<DType> {
        match s {
            "f32" | "float32" | "float" => Some(DType::F32),
            "bf16" | "bfloat16" => Some(DType::Bf16),
            "f16" | "float16" | "half" => Some(DType::F16),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.short_name())
    }
}

/// The precision policy for fp32 tensors. Always explicit: the torch baseline runs under the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// fp32 tensors, tensor-core tf32 multiplies, fp32 accumulation (torch: matmul precision "high").
    Tf32,
    /// fp32 tensors computed to full fp32 accuracy (torch: matmul precision "highest").
    F32,
}

impl Precision {
    pub fn short_name(self) -> &'static str {
        match self {
            Precision::Tf32 => "tf32",
            Precision::F32 => "f32",
        }
    }
    /// The value for torch.set_float32_matmul_precision that makes the baseline follow this policy.
    pub fn torch_matmul_precision(self) -> &'static str {
        match self {
            Precision::Tf32 => "high",
            Precision::F32 => "highest",
        }
    }
}

impl FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tf32" => Ok(Precision::Tf32),
            "f32" | "fp32" | "f32-accurate" | "fp32-accurate" => Ok(Precision::F32),
            _ => Err(format!("unknown precision '{s}': use tf32 or f32")),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.short_name())
    }
}

/// The math a kernel performs on its operands, derived from the tensor dtype and the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum MathType {
    Tf32,
    /// fp32-accurate: each fp32 operand split into a big and a small tf32 part, three tensor-core
    /// products summed (CUTLASS's OpMultiplyAddFastF32, "3xTF32").
    Tf32x3,
    Bf16,
    F16,
    /// fp32 arithmetic on CUDA cores, with nothing computed at a lower precision: the math of fp32
    /// kernels that multiply no matrices (LayerNorm), under either policy.
    F32,
}

impl MathType {
    /// None where no kernel family implements the combination (fp32 under the strict policy).
    pub fn for_tensor(dtype: DType, precision: Precision) -> Option<MathType> {
        match (dtype, precision) {
            (DType::F32, Precision::Tf32) => Some(MathType::Tf32),
            (DType::F32, Precision::F32) => Some(MathType::Tf32x3),
            (DType::Bf16, _) => Some(MathType::Bf16),
            (DType::F16, _) => Some(MathType::F16),
        }
    }
    /// The math of a kernel that multiplies no matrices and computes in fp32 (LayerNorm): fp32
    /// itself for fp32 tensors, the tensors' own for bf16 and fp16 (their rounding bounds the
    /// error).
    pub fn elementwise(dtype: DType) -> MathType {
        match dtype {
            DType::F32 => MathType::F32,
            DType::Bf16 => MathType::Bf16,
            DType::F16 => MathType::F16,
        }
    }
    pub fn short_name(self) -> &'static str {
        match self {
            MathType::Tf32 => "tf32",
            MathType::Tf32x3 => "tf32x3",
            MathType::Bf16 => "bf16",
            MathType::F16 => "f16",
            MathType::F32 => "f32",
        }
    }
    /// Relative error (Frobenius norm) a correct kernel stays under against an fp64 reference.
    pub fn tolerance(self) -> f64 {
        match self {
            MathType::Tf32 => 1e-3,
            // The fp32-accurate policy promises fp32-level results: 1e-4 relative.
            MathType::Tf32x3 => 1e-4,
            MathType::Bf16 => 1e-2,
            MathType::F16 => 5e-3,
            // A few fp32 roundings per output: a LayerNorm's is about 1e-7; 1e-5 still fails a
            // variance off by C/(C-1) up to C of 50000.
            MathType::F32 => 1e-5,
        }
    }
}

/// GPU architecture a kernel is built for: the library's nvcc target, the table key's arch, the
/// device the op library runs on. The sm80 families (CUTLASS 2.x mma.sync GEMMs, examples/41
/// attention) are built for both; the sm90 ones (TMA, WGMMA) only for sm90.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Sm80,
    Sm90,
}

/// What the cost model and the sweep's estimate know of an arch's reference GPU. Each arch's
/// numbers live in `Arch::hardware` alone.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hardware {
    /// The reference GPU the numbers describe.
    pub gpu: &'static str,
    pub sms: u32,
    /// Dense peaks from the data sheet, TFLOP/s: tensor cores, and CUDA cores for fp32.
    pub peak_tf32_tflops: f64,
    pub peak_bf16_tflops: f64,
    pub peak_fp32_tflops: f64,
    /// Dense tensor-core rates a tuned GEMM reaches, and fp32 without tensor cores.
    pub tf32_tflops: f64,
    pub bf16_tflops: f64,
    pub fp32_tflops: f64,
    pub dram_tbps: f64,
    pub l2_tbps: f64,
    /// Fixed cost of one kernel launch in eager execution.
    pub launch_us: f64,
    /// Shared memory one CTA may use (the opt-in maximum), bytes.
    pub smem_per_cta: u32,
    /// The share of the tensor-core rate the sm80 families' mma.sync mainloops reach.
    pub mma_sync_share: f64,
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Sm80, Arch::Sm90];

    pub fn short_name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm80",
            Arch::Sm90 => "sm90",
        }
    }
    /// nvcc's target: sm_90a for the sm90 families' arch-specific instructions (TMA, WGMMA; that
    /// code runs on 9.0 only); for sm80 the sm_80 code and its PTX, which the driver compiles for
    /// a newer GPU (an H100 runs an sm80 library too).
    pub fn nvcc_gencode(self) -> &'static str {
        match self {
            Arch::Sm80 => "-gencode=arch=compute_80,code=[sm_80,compute_80]",
            Arch::Sm90 => "-gencode=arch=compute_90a,code=sm_90a",
        }
    }
    /// The arch a device of this compute capability is tuned as. Only the reference GPUs' own
    /// capabilities map: 8.6 and 8.9 devices (RTX 30/40, A10, L4, L40) run sm_80 code but have 99 KB of
    /// shared memory per CTA where CUTLASS's sm80 instantiations assume the A100's 163 KB, and
    /// other SM counts and rates; measurements there would teach the sm80 tables and validity
    /// rules launch failures an A100 does not have.
    pub fn from_capability(major: i32, minor: i32) -> Option<Arch> {
        match (major, minor) {
            (8, 0) => Some(Arch::Sm80),
            (9, 0) => Some(Arch::Sm90),
            _ => None,
        }
    }
    /// Compute capabilities whose devices run every kernel of a library built for this arch,
    /// so tuning may measure them there and the op library runs its kernels there: the arch's own
    /// and, for sm80, 9.0 (through the PTX; an H100 has more shared memory per CTA than an A100).
    pub fn devices(self) -> &'static [(i32, i32)] {
        match self {
            Arch::Sm80 => &[(8, 0), (9, 0)],
            Arch::Sm90 => &[(9, 0)],
        }
    }
    pub fn runs_on(self, capability: (i32, i32)) -> bool {
        self.devices().contains(&capability)
    }
    /// The GPUs a person would run this arch's kernels on, for messages.
    pub fn gpus(self) -> &'static str {
        match self {
            Arch::Sm80 => "an sm80 GPU (A100, A30) or an sm90 one (H100, H200)",
            Arch::Sm90 => "an sm90 GPU (H100, H200)",
        }
    }
    /// What a kernel name adds for this build target: nothing for sm90, the target of every name
    /// written before sm80 was one; `_for_sm80` otherwise. The sm80 families build for both
    /// targets, and one name is one binary (symbol, table value, build-cache key).
    pub fn name_suffix(self) -> &'static str {
        match self {
            Arch::Sm80 => "_for_sm80",
            Arch::Sm90 => "",
        }
    }
    pub fn hardware(self) -> Hardware {
        match self {
            // A100 SXM4 80GB: its data sheet (fp32 19.5 TFLOP/s, 2.04 TB/s HBM2e) scaled by what
            // the H100 measured against its own (tensor cores 0.80, fp32 0.75, DRAM 0.90); L2
            // assumed 5 TB/s. Not yet measured on an A100.
            Arch::Sm80 => Hardware {
                gpu: "A100",
                sms: 108,
                peak_tf32_tflops: 156.0,
                peak_bf16_tflops: 312.0,
                peak_fp32_tflops: 19.5,
                tf32_tflops: 125.0,
                bf16_tflops: 250.0,
                fp32_tflops: 14.6,
                dram_tbps: 1.8,
                l2_tbps: 5.0,
                launch_us: 4.0,
                smem_per_cta: 163 * 1024,
                mma_sync_share: 1.0,
            },
            // H100 SXM5 80GB HBM3, measured here: cuBLAS tf32 4096³ 0.347 ms (397 TFLOP/s), fp32 2.76 ms
            // (50 TFLOP/s), bf16 8192³ 798 TFLOP/s, device-to-device copy about 3.0 TB/s; sm80
            // mma.sync kernels reach about half the WGMMA rate.
            Arch::Sm90 => Hardware {
                gpu: "H100",
                sms: 132,
                peak_tf32_tflops: 494.7,
                peak_bf16_tflops: 989.4,
                peak_fp32_tflops: 66.9,
                tf32_tflops: 397.0,
                bf16_tflops: 790.0,
                fp32_tflops: 50.0,
                dram_tbps: 3.0,
                l2_tbps: 9.0,
                launch_us: 4.0,
                smem_per_cta: 227 * 1024,
                mma_sync_share: 0.5,
            },
        }
    }
    pub fn parse(s: &str) -> Option<Arch> {
        match s {
            "sm80" | "sm_80" => Some(Arch::Sm80),
            "sm90" | "sm90a" | "sm_90a" => Some(Arch::Sm90),
            _ => None,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.short_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_map_to_the_arch_they_are_tuned_as_and_run_what_they_can() {
        assert_eq!(Arch::from_capability(8, 0), Some(Arch::Sm80));
        assert_eq!(Arch::from_capability(9, 0), Some(Arch::Sm90));
        // 8.6/8.9 run sm_80 code but not every sm80 instantiation (99 KB of shared memory per CTA).
        assert_eq!(Arch::from_capability(8, 6), None);
        assert_eq!(Arch::from_capability(8, 9), None);
        // An H100 runs an sm80 library through its PTX; an A100 runs no sm_90a code.
        assert!(Arch::Sm80.runs_on((9, 0)) && Arch::Sm80.runs_on((8, 0)));
        assert!(!Arch::Sm90.runs_on((8, 0)) && !Arch::Sm80.runs_on((8, 6)));
        for a in Arch::ALL {
            assert_eq!(Arch::parse(a.short_name()), Some(a));
            assert!(
                a.runs_on(a.devices()[0])
                    && Arch::from_capability(a.devices()[0].0, a.devices()[0].1) == Some(a)
            );
        }
    }

    #[test]
    fn each_arch_has_its_own_hardware_and_build_target() {
        let (a100, h100) = (Arch::Sm80.hardware(), Arch::Sm90.hardware());
        assert_eq!((a100.sms, h100.sms), (108, 132));
        assert!(
            a100.tf32_tflops < a100.peak_tf32_tflops && h100.tf32_tflops < h100.peak_tf32_tflops
        );
        assert!(
            a100.smem_per_cta < h100.smem_per_cta,
            "an H100 runs every A100 kernel"
        );
        assert!(
            Arch::Sm80
                .nvcc_gencode()
                .contains("code=[sm_80,compute_80]"),
            "sm_80 code plus PTX for newer GPUs"
        );
        assert_eq!(
            Arch::Sm90.nvcc_gencode(),
            "-gencode=arch=compute_90a,code=sm_90a"
        );
        assert_ne!(Arch::Sm80.name_suffix(), Arch::Sm90.name_suffix());
    }
}
