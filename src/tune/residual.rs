//! The residual add before a norm as the norm kinds' benches feed it (`rules::residual`): the two
//! operands, laid out as a block's residual and its output, their sum as the graph computes it
//! (each operand cast to the add's dtype, then torch's add: the value the norm reads and the kernel
//! must write), the operands as the kernel ABI reads them, and the error of a call that writes
//! two outputs.

use super::gpu::relative_error;
use super::op::{absent, fact_tensor};
use crate::nvcc::library::FactTensor;
use crate::rules::residual::Residual;
use tch::{Kind, Tensor};

/// An add's operands ([rows, C] each, of the add's dtypes) and their sum in the add's dtype.
pub struct AddInputs {
    pub a: Tensor,
    pub b: Tensor,
    pub sum: Tensor,
}

impl AddInputs {
    /// Operands whose sum is about `x` (fp32 [rows, C]): b a block's output (spread 2), a the
    /// rest, so the norm sees x's offsets and spreads.
    pub fn random(add: &Residual, x: &Tensor) -> AddInputs {
        let b = x.randn_like() * 2.0;
        let a = (x - &b).to_kind(add.a.tch_kind());
        let b = b.to_kind(add.b.tch_kind());
        let sum = graph_sum(add, &a, &b);
        AddInputs { a, b, sum }
    }

    /// a and b as the kernels' signature reads them: [1, rows, C], one stride of rows.
    pub fn operands(&self) -> [FactTensor; 2] {
        let rows = |t: &Tensor| {
            let (r, c) = t.size2().expect("[rows, C] operands");
            fact_tensor(&t.view([1, r, c]))
        };
        [rows(&self.a), rows(&self.b)]
    }

    /// The relative error of the sum a kernel wrote (None where it writes none): the graph's value,
    /// so any difference is the kernel's.
    pub fn sum_error(&self, written: Option<&Tensor>) -> f64 {
        written.map_or(0.0, |s| relative_error(s, &self.sum.to_kind(Kind::Double)))
    }
}

/// The add as the graph computes it: each operand cast to the add's dtype, then torch's add.
pub fn graph_sum(add: &Residual, a: &Tensor, b: &Tensor) -> Tensor {
    let kind = add.sum.tch_kind();
    a.to_kind(kind) + b.to_kind(kind)
}

/// Where a kernel writes the sum: the tensor, or NULL data.
pub fn sum_tensor(sum: Option<&Tensor>) -> FactTensor {
    sum.map_or_else(absent, fact_tensor)
}

/// The worse of two outputs' errors, NaN where either is (an output left unwritten): `f64::max`
/// would drop the NaN.
pub fn worst(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_error_stays_nan() {
        assert!(worst(f64::NAN, 0.0).is_nan() && worst(0.0, f64::NAN).is_nan());
        assert_eq!(worst(1e-3, 2e-3), 2e-3);
    }
}
