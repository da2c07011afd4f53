//! The sibling-linears bench: a library's GEMM kernels over the concatenated weight, against what
//! the traced model runs. Verification and the kernel's timing are the GEMM kind's bench of the
//! concatenated GEMM (fresh inputs, NaN-poisoned output, fp64 reference); the baseline is torch
//! running the separate linears, one per width over its rows of the weight (each a packed
//! [N_i, K] as the module's own weights are), which is what the table key says the kernel must
//! beat (problem.rs).

use super::problem::SiblingsProblem;
use crate::kinds::gemm::bench::GemmBench;
use crate::nvcc::library::KernelLibrary;
use crate::tune::gpu::sample;
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

pub struct SiblingsBench<'a> {
    gemm: GemmBench<'a>,
    p: SiblingsProblem,
    protocol: Protocol,
    cuda: &'static crate::tune::cuda::Cuda,
    flush: Tensor,
    x: Tensor,
    w: Tensor,
    b: Option<Tensor>,
}

impl<'a> SiblingsBench<'a> {
    pub fn new(
        lib: &'a KernelLibrary,
        p: SiblingsProblem,
        protocol: Protocol,
    ) -> Result<SiblingsBench<'a>, String> {
        let gemm = GemmBench::new(lib, p.gemm_problem(), protocol.clone())?;
        let cuda = crate::tune::cuda::Cuda::get()?;
        let device = Device::Cuda(0);
        let kind = p.dtype.tch_kind();
        let rand = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, device)).to_kind(kind);
        let (x, w) = (rand(&[p.m, p.k]), rand(&[p.n(), p.k]));
        let b = p.bias.then(|| rand(&[p.n()]));
        let flush = protocol.flush_buffer(device);
        Ok(SiblingsBench {
            gemm,
            p,
            protocol,
            cuda,
            flush,
            x,
            w,
            b,
        })
    }
}

impl Bench for SiblingsBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        self.gemm.verify(index)
    }

    fn time(&mut self, index: usize) -> Result<Vec<f64>, BenchError> {
        self.gemm.time(index)
    }

    fn time_baseline(&mut self) -> Result<Vec<f64>, BenchError> {
        let (x, w, b, widths) = (&self.x, &self.w, &self.b, &self.p.widths);
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || {
                let mut at = 0;
                for &n in widths {
                    let bias = b.as_ref().map(|b| b.narrow(0, at, n));
                    let _ = x.linear(&w.narrow(0, at, n), bias.as_ref());
                    at += n;
                }
                Ok(())
            },
            BenchError::Launch,
        )
    }
}
