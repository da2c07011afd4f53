//! The RMSNorm bench: a library's RMSNorm kernels and torch's own ops for the problem on the GPU.
//! The inputs are far from unit scale (x = 3 + 10·randn, and rows of their own offsets and scales
//! every other time), so a kernel that drops eps's place, divides by C − 1, subtracts a mean or
//! reads another row's statistics misses the tolerance; the weight is random about 1 (about 0 for
//! one plus the weight), so ignoring it shows. The reference is the math in fp64 (no rounding
//! between); the baseline is the written-out ops as Llama's graph runs them: the upcast, the
//! square, the mean, the rsqrt, the casts where the problem has them. With the residual add
//! before the norm, x is the sum of a (as x above) and b (a block's output, spread 2), rounded to
//! the add's dtype as the graph's add rounds (the graph's value, which the reference normalizes in
//! fp64); the kernel's sum, where it writes one, must equal it, and the baseline runs the add too.

use super::{RmsNormProblem, Scale};
use crate::nvcc::library::KernelLibrary;
use crate::tune::cuda::Cuda;
use crate::tune::gpu::{relative_error, sample};
use crate::tune::op::{absent, fact_tensor, run_op};
use crate::tune::residual::{graph_sum, sum_tensor, worst, AddInputs};
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

/// Llama's and Qwen2's eps.
pub const EPS: f64 = 1e-6;

pub struct Inputs {
    /// [rows, C]: the norm's input (the add's sum as the norm's dtype, where there is an add).
    pub x: Tensor,
    pub weight: Option<Tensor>,
    /// The add's operands and their sum, where the problem has an add.
    pub add: Option<AddInputs>,
}

impl Inputs {
    /// Fresh random inputs; `rowwise` gives each row its own offset (in [-5, 5]) and scale (in
    /// [1, 20]) instead of 3 and 10.
    pub fn random(p: &RmsNormProblem, device: Device, rowwise: bool) -> Inputs {
        let kind = p.dtype.tch_kind();
        let normal = Tensor::randn([p.rows, p.cols], (Kind::Float, device));
        let x = if rowwise {
            let offset = Tensor::rand([p.rows, 1], (Kind::Float, device)) * 10.0 - 5.0;
            let scale = Tensor::rand([p.rows, 1], (Kind::Float, device)) * 19.0 + 1.0;
            normal * scale + offset
        } else {
            normal * 10.0 + 3.0
        };
        let add = p.add.map(|r| AddInputs::random(&r, &x));
        let center = match p.scale {
            Scale::WeightPlusOne => 0.0,
            _ => 1.0,
        };
        let weight = (p.scale != Scale::None)
            .then(|| (Tensor::randn([p.cols], (Kind::Float, device)) * 0.5 + center).to_kind(kind));
        let x = match &add {
            Some(add) => add.sum.to_kind(kind),
            None => x.to_kind(kind),
        };
        Inputs { x, weight, add }
    }

    /// The normalized x in `kind` (fp32 for the graph's ops, fp64 for the reference).
    fn normalized(x: &Tensor, kind: Kind) -> Tensor {
        let xf = x.to_kind(kind);
        let ms = xf
            .pow_tensor_scalar(2)
            .mean_dim(&[-1i64][..], true, None::<Kind>);
        &xf * (ms + EPS).rsqrt()
    }

    /// The written-out ops in the tensors' dtype, as the graph runs them (the add first, where
    /// there is one).
    pub fn torch(&self, p: &RmsNormProblem) -> Tensor {
        let dtype = self.x.kind();
        let x = match (&self.add, &p.add) {
            (Some(t), Some(add)) => graph_sum(add, &t.a, &t.b).to_kind(dtype),
            _ => self.x.shallow_clone(),
        };
        let n = Self::normalized(&x, Kind::Float);
        match (&self.weight, p.scale) {
            (Some(w), Scale::Weight) if p.cast_first => w * n.to_kind(dtype),
            (Some(w), Scale::Weight) => (n * w).to_kind(dtype),
            (Some(w), Scale::WeightPlusOne) => (n * (w.to_kind(Kind::Float) + 1.0)).to_kind(dtype),
            _ => n.to_kind(dtype),
        }
    }

    /// The same math in fp64 over the graph's x, rounded nowhere.
    pub fn reference(&self, p: &RmsNormProblem) -> Tensor {
        let n = Self::normalized(&self.x, Kind::Double);
        let w = self.weight.as_ref().map(|w| w.to_kind(Kind::Double));
        match (w, p.scale) {
            (Some(w), Scale::Weight) => n * w,
            (Some(w), Scale::WeightPlusOne) => n * (w + 1.0),
            _ => n,
        }
    }
}

pub struct RmsNormBench<'a> {
    lib: &'a KernelLibrary,
    p: RmsNormProblem,
    protocol: Protocol,
    cuda: &'static Cuda,
    device: Device,
    flush: Tensor,
    timed: Inputs,
    out: Tensor,
    /// Where the kernel writes the sum (a problem whose add's sum the graph reads).
    sum: Option<Tensor>,
    verified: usize,
}

impl<'a> RmsNormBench<'a> {
    pub fn new(
        lib: &'a KernelLibrary,
        p: RmsNormProblem,
        protocol: Protocol,
    ) -> Result<RmsNormBench<'a>, String> {
        let cuda = Cuda::get()?;
        let device = Device::Cuda(0);
        let timed = Inputs::random(&p, device, false);
        let out = Tensor::empty([p.rows, p.cols], (p.dtype.tch_kind(), device));
        let sum = p
            .add
            .filter(|a| a.writes_sum)
            .map(|a| Tensor::empty([p.rows, p.cols], (a.sum.tch_kind(), device)));
        let flush = protocol.flush_buffer(device);
        Ok(RmsNormBench {
            lib,
            p,
            protocol,
            cuda,
            device,
            flush,
            timed,
            out,
            sum,
            verified: 0,
        })
    }

    fn launch(
        &self,
        index: usize,
        x: &Inputs,
        out: &Tensor,
        sum: Option<&Tensor>,
    ) -> Result<(), BenchError> {
        let weight = x.weight.as_ref().map_or_else(absent, fact_tensor);
        let tensors: Vec<_> = match &x.add {
            Some(add) => {
                let [a, b] = add.operands();
                vec![a, b, sum_tensor(sum), fact_tensor(out), weight]
            }
            None => vec![fact_tensor(&x.x), fact_tensor(out), weight],
        };
        let scale = match self.p.scale {
            Scale::None => 0.0,
            Scale::Weight => 1.0,
            Scale::WeightPlusOne => 2.0,
        };
        let cast_first = if self.p.cast_first { 1.0 } else { 0.0 };
        // The kernels ask for no workspace.
        run_op(
            self.lib,
            index,
            &tensors,
            &[EPS, scale, cast_first],
            self.device,
        )
    }
}

impl Bench for RmsNormBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        let rowwise = self.verified % 2 == 1;
        self.verified += 1;
        let x = Inputs::random(&self.p, self.device, rowwise);
        let poisoned = |kind: Kind| {
            let t = Tensor::empty([self.p.rows, self.p.cols], (kind, self.device));
            let _ = t.shallow_clone().fill_(f64::NAN);
            t
        };
        let out = poisoned(self.p.dtype.tch_kind());
        let sum = self.sum.as_ref().map(|s| poisoned(s.kind()));
        self.launch(index, &x, &out, sum.as_ref())?;
        self.cuda.sync().map_err(BenchError::Launch)?;
        let y = relative_error(&out, &x.reference(&self.p));
        let s = x
            .add
            .as_ref()
            .map_or(0.0, |add| add.sum_error(sum.as_ref()));
        Ok(worst(y, s))
    }

    fn time(&mut self, index: usize) -> Result<Vec<f64>, BenchError> {
        let (x, out, sum) = (&self.timed, &self.out, self.sum.as_ref());
        let this = &*self;
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || this.launch(index, x, out, sum),
            BenchError::Launch,
        )
    }

    fn time_baseline(&mut self) -> Result<Vec<f64>, BenchError> {
        let (x, p) = (&self.timed, &self.p);
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || {
                let _ = x.torch(p);
                Ok(())
            },
            BenchError::Launch,
        )
    }
}
