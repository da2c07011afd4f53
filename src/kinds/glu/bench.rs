//! The GLU bench: a library's GLU kernels and torch's ops for the pattern on the GPU. The inputs
//! are as the model holds them: x [M,K], the gate and up weights [I,K] and biases as the graph
//! reads them, and the interleaved weight (and bias) compose builds from them
//! (`interleave`, the same block order as the bridge's buffer). The reference is the graph's
//! function in fp64; the baseline is the graph's own ops (two `linear`s, the activation, the mul).
//! Gate and up differ in scale (gate ×2), so a kernel that swaps them or pairs a gate with
//! another column's up misses the tolerance.

use super::problem::{Act, GluProblem, INTERLEAVE};
use crate::nvcc::library::KernelLibrary;
use crate::tune::cuda::Cuda;
use crate::tune::gpu::{relative_error, sample};
use crate::tune::op::{absent, fact_tensor, run_op};
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

pub struct Inputs {
    /// [M, K].
    pub x: Tensor,
    pub w_gate: Tensor,
    pub w_up: Tensor,
    pub b_gate: Option<Tensor>,
    pub b_up: Option<Tensor>,
    /// The interleaved weight [2I, K] and bias [2I] the kernels read.
    pub w: Tensor,
    pub b: Option<Tensor>,
}

/// `gate` and `up` ([I, ..]) interleaved along their first dim in blocks of `INTERLEAVE` rows.
pub fn interleave(gate: &Tensor, up: &Tensor) -> Tensor {
    let shape = gate.size();
    let mut blocks = vec![shape[0] / INTERLEAVE, 1, INTERLEAVE];
    blocks.extend_from_slice(&shape[1..]);
    let mut out = shape.clone();
    out[0] *= 2;
    Tensor::cat(&[gate.reshape(&blocks), up.reshape(&blocks)], 1)
        .reshape(&out)
        .contiguous()
}

impl Inputs {
    pub fn random(p: &GluProblem, device: Device) -> Inputs {
        let kind = p.dtype.tch_kind();
        let scale = 1.0 / (p.k as f64).sqrt();
        let w = |s: f64| {
            (Tensor::randn([p.inter, p.k], (Kind::Float, device)) * scale * s).to_kind(kind)
        };
        let b = |s: f64| {
            p.bias
                .then(|| (Tensor::randn([p.inter], (Kind::Float, device)) * 0.1 * s).to_kind(kind))
        };
        let (w_gate, w_up, b_gate, b_up) = (w(2.0), w(1.0), b(2.0), b(1.0));
        let w_cat = interleave(&w_gate, &w_up);
        let b_cat = b_gate
            .as_ref()
            .zip(b_up.as_ref())
            .map(|(g, u)| interleave(g, u));
        Inputs {
            x: Tensor::randn([p.m, p.k], (Kind::Float, device)).to_kind(kind),
            w_gate,
            w_up,
            b_gate,
            b_up,
            w: w_cat,
            b: b_cat,
        }
    }

    /// The graph's ops, in the tensors' dtype.
    pub fn torch(&self, act: Act) -> Tensor {
        let g = self.x.linear(&self.w_gate, self.b_gate.as_ref());
        let u = self.x.linear(&self.w_up, self.b_up.as_ref());
        let a = match act {
            Act::Silu => g.silu(),
            Act::GeluTanh => g.gelu("tanh"),
            Act::Gelu => g.gelu("none"),
        };
        a * u
    }

    /// The same in fp64.
    pub fn reference(&self, act: Act) -> Tensor {
        let up = |t: &Tensor| t.to_kind(Kind::Double);
        Inputs {
            x: up(&self.x),
            w_gate: up(&self.w_gate),
            w_up: up(&self.w_up),
            b_gate: self.b_gate.as_ref().map(up),
            b_up: self.b_up.as_ref().map(up),
            w: up(&self.w),
            b: self.b.as_ref().map(up),
        }
        .torch(act)
    }
}

pub struct GluBench<'a> {
    lib: &'a KernelLibrary,
    p: GluProblem,
    protocol: Protocol,
    cuda: &'static Cuda,
    device: Device,
    flush: Tensor,
    timed: Inputs,
    out: Tensor,
}

impl<'a> GluBench<'a> {
    pub fn new(
        lib: &'a KernelLibrary,
        p: GluProblem,
        protocol: Protocol,
    ) -> Result<GluBench<'a>, String> {
        let cuda = Cuda::get()?;
        let device = Device::Cuda(0);
        let timed = Inputs::random(&p, device);
        let out = Tensor::empty([p.m, p.inter], (p.dtype.tch_kind(), device));
        let flush = protocol.flush_buffer(device);
        Ok(GluBench {
            lib,
            p,
            protocol,
            cuda,
            device,
            flush,
            timed,
            out,
        })
    }

    fn launch(&self, index: usize, x: &Inputs, out: &Tensor) -> Result<(), BenchError> {
        let tensors = [
            fact_tensor(&x.x),
            fact_tensor(&x.w),
            x.b.as_ref().map_or_else(absent, fact_tensor),
            fact_tensor(out),
        ];
        run_op(self.lib, index, &tensors, &[], self.device)
    }
}

impl Bench for GluBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        let x = Inputs::random(&self.p, self.device);
        let out = Tensor::empty(
            [self.p.m, self.p.inter],
            (self.p.dtype.tch_kind(), self.device),
        );
        let _ = out.shallow_clone().fill_(f64::NAN);
        self.launch(index, &x, &out)?;
        self.cuda.sync().map_err(BenchError::Launch)?;
        Ok(relative_error(&out, &x.reference(self.p.act)))
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
        let (x, act) = (&self.timed, self.p.act);
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || {
                let _ = x.torch(act);
                Ok(())
            },
            BenchError::Launch,
        )
    }
}
