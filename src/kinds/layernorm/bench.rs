//! The LayerNorm bench: a library's LayerNorm kernels and torch's own `layer_norm` on the GPU. The
//! inputs have a mean far from zero against a large spread (x = 3 + 10·randn, and rows of their own
//! offsets and scales every other time), so a variance formula that cancels, drops the mean or
//! divides by C − 1, or a row that reads another's statistics, misses fp32's tolerance; weight
//! and bias are random, so swapping them shows. The reference is torch's layer_norm in fp64, the
//! baseline torch's layer_norm on the same input. With the residual add before the norm
//! (`tune::residual`), x is the sum of two operands rounded as the graph's add rounds (the
//! graph's value, which the reference normalizes in fp64); the kernel's sum, where it writes one,
//! must equal it, and the baseline runs the add before the layer_norm.

use super::LayerNormProblem;
use crate::nvcc::library::KernelLibrary;
use crate::tune::cuda::Cuda;
use crate::tune::gpu::{relative_error, sample};
use crate::tune::op::{absent, fact_tensor, run_op};
use crate::tune::residual::{graph_sum, sum_tensor, worst, AddInputs};
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

/// torch's default, and nn.LayerNorm's.
pub const EPS: f64 = 1e-5;

pub struct Inputs {
    /// [rows, C]: the norm's input (the add's sum as the norm's dtype, where there is an add).
    pub x: Tensor,
    pub weight: Option<Tensor>,
    pub bias: Option<Tensor>,
    /// The add's operands and their sum, where the problem has an add.
    pub add: Option<AddInputs>,
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
        let add = p.add.map(|r| AddInputs::random(&r, &x));
        let x = match &add {
            Some(add) => add.sum.to_kind(kind),
            None => x.to_kind(kind),
        };
        Inputs {
            x,
            weight: param(p.weight, 1.0),
            bias: param(p.bias, 0.0),
            add,
        }
    }

    /// torch's layer_norm of `x` over the last dim.
    fn layer_norm(&self, x: &Tensor, up: impl Fn(&Tensor) -> Tensor) -> Tensor {
        let c = x.size()[1];
        x.layer_norm(
            [c],
            self.weight.as_ref().map(&up).as_ref(),
            self.bias.as_ref().map(&up).as_ref(),
            EPS,
            true,
        )
    }

    /// torch's layer_norm over the last dim, in the tensors' dtype (the graph's add first, where
    /// the problem has one).
    pub fn torch(&self, p: &LayerNormProblem) -> Tensor {
        let x = match (&self.add, &p.add) {
            (Some(t), Some(add)) => graph_sum(add, &t.a, &t.b).to_kind(self.x.kind()),
            _ => self.x.shallow_clone(),
        };
        self.layer_norm(&x, Tensor::shallow_clone)
    }

    /// The same in fp64, of the graph's x.
    pub fn reference(&self) -> Tensor {
        let up = |t: &Tensor| t.to_kind(Kind::Double);
        self.layer_norm(&up(&self.x), up)
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
    /// Where the kernel writes the sum (a problem whose add's sum the graph reads).
    sum: Option<Tensor>,
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
        let sum = p
            .add
            .filter(|a| a.writes_sum)
            .map(|a| Tensor::empty([p.rows, p.cols], (a.sum.tch_kind(), device)));
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
        let param = |t: &Option<Tensor>| t.as_ref().map_or_else(absent, fact_tensor);
        let mut tensors = match &x.add {
            Some(add) => {
                let [a, b] = add.operands();
                vec![a, b, sum_tensor(sum)]
            }
            None => vec![fact_tensor(&x.x)],
        };
        tensors.extend([fact_tensor(out), param(&x.weight), param(&x.bias)]);
        // The kernels ask for no workspace.
        run_op(self.lib, index, &tensors, &[EPS], self.device)
    }
}

impl Bench for LayerNormBench<'_> {
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
        let y = relative_error(&out, &x.reference());
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
