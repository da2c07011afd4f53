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

/// GPU architecture a kernel is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Sm90,
}

impl Arch {
    pub fn short_name(self) -> &'static str {
        match self {
            Arch::Sm90 => "sm90",
        }
    }
    pub fn nvcc_gencode(self) -> &'static str {
        match self {
            Arch::Sm90 => "-gencode=arch=compute_90a,code=sm_90a",
        }
    }
    pub fn from_capability(major: i32, minor: i32) -> Option<Arch> {
        match (major, minor) {
            (9, 0) => Some(Arch::Sm90),
            _ => None,
        }
    }
    pub fn parse(s: &str) -> Option<Arch> {
        match s {
            "sm90" | "sm90a" => Some(Arch::Sm90),
            _ => None,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.short_name())
    }
}
