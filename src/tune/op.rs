//! The kernel ABI from the tuner's side: tensors as `FactTensor`s, and one launch of a library's
//! kernel (any kind's) with its implementability check and workspace, shared by every bench.

use super::BenchError;
use crate::nvcc::library::{FactOpArgs, FactTensor, KernelLibrary};
use tch::{Device, Kind, Tensor};

/// A tensor as the kernel ABI passes it.
pub fn fact_tensor(t: &Tensor) -> FactTensor {
    // Another kind (f64) is none of FactDtype's, so no kernel's check takes it for one.
    let dtype = match t.kind() {
        Kind::Float => 0,
        Kind::BFloat16 => 1,
        Kind::Half => 2,
        Kind::Int => 3,
        Kind::Bool => 4,
        _ => -1,
    };
    let mut ft = FactTensor {
        data: t.data_ptr(),
        dtype,
        rank: t.dim() as i32,
        sizes: [0; 6],
        strides: [0; 6],
    };
    for (i, (s, st)) in t.size().iter().zip(t.stride()).enumerate().take(6) {
        ft.sizes[i] = *s;
        ft.strides[i] = st;
    }
    ft
}

/// An absent optional tensor as the kernel ABI passes it: NULL data.
pub fn absent() -> FactTensor {
    FactTensor {
        data: std::ptr::null_mut(),
        dtype: 0,
        rank: 0,
        sizes: [0; 6],
        strides: [0; 6],
    }
}

/// Runs kernel `index` of `lib` on `tensors` and `scalars`, with the workspace it asks for (none
/// when it asks for none); `CannotImplement` when the kernel refuses the call.
pub fn run_op(
    lib: &KernelLibrary,
    index: usize,
    tensors: &[FactTensor],
    scalars: &[f64],
    device: Device,
) -> Result<(), BenchError> {
    let args = FactOpArgs {
        tensors: tensors.as_ptr(),
        num_tensors: tensors.len() as i32,
        scalars: scalars.as_ptr(),
        num_scalars: scalars.len() as i32,
    };
    if !lib.can_implement(index, &args) {
        return Err(BenchError::CannotImplement);
    }
    let ws_size = lib.workspace_size(index, &args);
    let ws = (ws_size > 0).then(|| Tensor::empty([ws_size as i64], (Kind::Uint8, device)));
    let ws_ptr = ws.as_ref().map_or(std::ptr::null_mut(), |t| t.data_ptr());
    // SAFETY: the tensors are live device tensors of the sizes their FactTensors state, the
    // workspace one of ws_size bytes; callers synchronize before dropping them.
    unsafe { lib.run(index, &args, ws_ptr, ws_size) }.map_err(BenchError::Launch)
}
