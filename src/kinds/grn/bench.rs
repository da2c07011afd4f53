//! The GRN bench: a library's GRN kernels and torch's own ops for the problem on the GPU. x is
//! [N, P, 1, C] (the positions as one run, as the kernel reads H·W), far from unit scale, every
//! other time with a scale of its own per channel (so nf differs across the channels and a kernel
//! that reads another channel's norm, or averages over the positions instead, misses the
//! tolerance); the weight and bias are normal, so ignoring either shows. The reference is the
//! math in fp64; the baseline is the graph's ops as Hugging Face's module runs them, in the
//! tensors' dtype.

use super::GrnProblem;
use crate::nvcc::library::KernelLibrary;
use crate::tune::cuda::Cuda;
use crate::tune::gpu::{relative_error, sample};
use crate::tune::op::{fact_tensor, run_op};
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

/// ConvNeXt V2's eps.
pub const EPS: f64 = 1e-6;

pub struct Inputs {
    /// [N, P, 1, C].
    pub x: Tensor,
    /// [C] each.
    pub weight: Tensor,
    pub bias: Tensor,
}

impl Inputs {
    /// Fresh random inputs; `per_channel` gives each channel its own scale (in [0.1, 10]).
    pub fn random(p: &GrnProblem, device: Device, per_channel: bool) -> Inputs {
        let kind = p.dtype.tch_kind();
        let shape = [p.batch, p.pixels, 1, p.channels];
        let normal = Tensor::randn(shape, (Kind::Float, device));
        let x = if per_channel {
            normal * (Tensor::rand([p.channels], (Kind::Float, device)) * 9.9 + 0.1) + 0.5
        } else {
            normal * 3.0 + 1.0
        };
        let param = || Tensor::randn([p.channels], (Kind::Float, device)).to_kind(kind);
        Inputs {
            x: x.to_kind(kind),
            weight: param(),
            bias: param(),
        }
    }

    /// nf = g / (mean_c g + eps) of x in x's kind (`x` already in the kind to compute in).
    fn nf(x: &Tensor) -> Tensor {
        let g = x.norm_scalaropt_dim(2, [1i64, 2], true);
        &g / (g.mean_dim(&[-1i64][..], true, None::<Kind>) + EPS)
    }

    /// The graph's ops in the tensors' dtype: w * (x * nf) + b + x.
    pub fn torch(&self) -> Tensor {
        &self.weight * (&self.x * Self::nf(&self.x)) + &self.bias + &self.x
    }

    /// The same math in fp64, rounded nowhere.
    pub fn reference(&self) -> Tensor {
        let x = self.x.to_kind(Kind::Double);
        let (w, b) = (
            self.weight.to_kind(Kind::Double),
            self.bias.to_kind(Kind::Double),
        );
        w * (&x * Self::nf(&x)) + b + &x
    }
}

pub struct GrnBench<'a> {
    lib: &'a KernelLibrary,
    p: GrnProblem,
    protocol: Protocol,
    cuda: &'static Cuda,
    device: Device,
    flush: Tensor,
    timed: Inputs,
    out: Tensor,
    verified: usize,
}

impl<'a> GrnBench<'a> {
    pub fn new(
        lib: &'a KernelLibrary,
        p: GrnProblem,
        protocol: Protocol,
    ) -> Result<GrnBench<'a>, String> {
        let cuda = Cuda::get()?;
        let device = Device::Cuda(0);
        let timed = Inputs::random(&p, device, false);
        let out = Tensor::empty(timed.x.size(), (p.dtype.tch_kind(), device));
        let flush = protocol.flush_buffer(device);
        Ok(GrnBench {
            lib,
            p,
            protocol,
            cuda,
            device,
            flush,
            timed,
            out,
            verified: 0,
        })
    }

    fn launch(&self, index: usize, x: &Inputs, out: &Tensor) -> Result<(), BenchError> {
        let tensors = [
            fact_tensor(&x.x),
            fact_tensor(out),
            fact_tensor(&x.weight),
            fact_tensor(&x.bias),
        ];
        run_op(self.lib, index, &tensors, &[EPS], self.device)
    }
}

impl Bench for GrnBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        let per_channel = self.verified % 2 == 1;
        self.verified += 1;
        let x = Inputs::random(&self.p, self.device, per_channel);
        let out = Tensor::empty(x.x.size(), (self.p.dtype.tch_kind(), self.device));
        let _ = out.shallow_clone().fill_(f64::NAN);
        self.launch(index, &x, &out)?;
        self.cuda.sync().map_err(BenchError::Launch)?;
        Ok(relative_error(&out, &x.reference()))
    }

    fn time(&mut self, index: usize) -> Result<Vec<f64>, BenchError> {
        let (x, out) = (&self.timed, &self.out);
        let this = &*self;
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || this.launch(index, x, out),
            BenchError::Launch,
        )
    }

    fn time_baseline(&mut self) -> Result<Vec<f64>, BenchError> {
        let x = &self.timed;
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || {
                let _ = x.torch();
                Ok(())
            },
            BenchError::Launch,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    #[test]
    fn the_baseline_and_reference_compute_one_grn() {
        let _guard = tch::no_grad_guard();
        let p = GrnProblem {
            batch: 3,
            pixels: 20,
            channels: 16,
            dtype: DType::F32,
        };
        for per_channel in [false, true] {
            let x = Inputs::random(&p, Device::Cpu, per_channel);
            let r = x.reference();
            assert_eq!(r.size(), [3, 20, 1, 16]);
            assert!(relative_error(&x.torch(), &r) < 1e-5);
            // nf moves the output: without it (nf = 1) the same weight and bias give another y.
            let (w, b) = (x.weight.to_kind(Kind::Double), x.bias.to_kind(Kind::Double));
            let plain = &w * x.x.to_kind(Kind::Double) + &b + x.x.to_kind(Kind::Double);
            assert!(relative_error(&plain, &r) > 1e-2);
        }
    }
}
