//! The LayerNorm bench: a library's LayerNorm kernels and torch's own `layer_norm` on the GPU. The
//! inputs have a mean far from zero against a large spread (x = 3 + 10·randn, and rows of their own
//! offsets and scales every other time), so a variance formula that cancels, drops the mean or
//! divides by C − 1, or a row that reads another's statistics, misses fp32's tolerance; weight
//! and bias are random, so swapping them shows. The reference is torch's layer_norm in fp64, the
//! baseline torch's layer_norm on the same input.

use super::LayerNormProblem;
use crate::nvcc::library::KernelLibrary;
use crate::tune::cuda::Cuda;
use crate::tune::gpu::{relative_error, sample};
use crate::tune::op::{absent, fact_tensor, run_op};
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

/// torch's default, and nn.LayerNorm's.
pub const EPS: f64 = 1e-5;

pub struct Inputs {
    /// [rows, C].
    pub x: Tensor,
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
}

impl Inputs {
    /// Fresh random inputs; `rowwise` gives each row its own offset (in [-5, 5]) and scale (in
    /// [1, 20]) instead of 3 and 10.
    pub fn random(p: &LayerNormProblem, device: Device, rowwise: bool) -> Inputs {
        let kind = p.dtype.tch_kind();
        let normal = Tensor::randn([p.rows, p.cols], (Kind::Float, device));
        let x = if rowwise {
            let offset = Tensor::rand([p.rows, 1], (Kind::Float, device)) * 10.0 - 5.0;
            let scale = Tensor::rand([p.rows, 1], (Kind::Float, device)) * 19.0 + 1.0;
            normal * scale + offset
        } else {
            normal * 10.0 + 3.0
        };
        let param = |on: bool, center: f64| {
            on.then(|| {
                (Tensor::randn([p.cols], (Kind::Float, device)) * 0.5 + center).to_kind(kind)
            })
        };
        Inputs {
            x: x.to_kind(kind),
            weight: param(p.weight, 1.0),
            bias: param(p.bias, 0.0),
        }
    }

    /// torch's layer_norm over the last dim, in the tensors' dtype.
    pub fn torch(&self) -> Tensor {
        let c = self.x.size()[1];
        self.x
            .layer_norm([c], self.weight.as_ref(), self.bias.as_ref(), EPS, true)
    }

    /// The same in fp64.
    pub fn reference(&self) -> Tensor {
        let up = |t: &Tensor| t.to_kind(Kind::Double);
        Inputs {
            x: up(&self.x),
            weight: self.weight.as_ref().map(up),
            bias: self.bias.as_ref().map(up),
        }
        .torch()
    }
}

pub struct LayerNormBench<'a> {
    lib: &'a KernelLibrary,
    p: LayerNormProblem,
    protocol: Protocol,
    cuda: &'static Cuda,
    device: Device,
    flush: Tensor,
    timed: Inputs,
    out: Tensor,
    verified: usize,
}

impl<'a> LayerNormBench<'a> {
    pub fn new(
        lib: &'a KernelLibrary,
        p: LayerNormProblem,
        protocol: Protocol,
    ) -> Result<LayerNormBench<'a>, String> {
        let cuda = Cuda::get()?;
        let device = Device::Cuda(0);
        let timed = Inputs::random(&p, device, false);
        let out = Tensor::empty([p.rows, p.cols], (p.dtype.tch_kind(), device));
        let flush = protocol.flush_buffer(device);
        Ok(LayerNormBench {
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
        let param = |t: &Option<Tensor>| t.as_ref().map_or_else(absent, fact_tensor);
        let tensors = [
            fact_tensor(&x.x),
            fact_tensor(out),
            param(&x.weight),
            param(&x.bias),
        ];
        // The kernels ask for no workspace.
        run_op(self.lib, index, &tensors, &[EPS], self.device)
    }
}

impl Bench for LayerNormBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        let rowwise = self.verified % 2 == 1;
        self.verified += 1;
        let x = Inputs::random(&self.p, self.device, rowwise);
        let out = Tensor::empty(
            [self.p.rows, self.p.cols],
            (self.p.dtype.tch_kind(), self.device),
        );
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
