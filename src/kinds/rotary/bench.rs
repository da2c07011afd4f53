//! The rotary bench: a library's rotary kernels and the graph's own ops on the GPU. q and k are
//! laid out as Llama's are, the transposed view of the projection's [B, T, H·D] output; cos and
//! sin are computed the way the models do (inverse frequencies times position ids, then cos and
//! sin in fp32, cast to the dtype) from random position ids per batch, so a kernel that assumes
//! positions 0..T, or reads another batch's row, misses. The reference is the graph's ops in
//! fp64 on the same inputs, the baseline the graph's ops in the dtype (`Inputs::torch`).

use super::{Form, RotaryProblem};
use crate::nvcc::library::KernelLibrary;
use crate::tune::cuda::Cuda;
use crate::tune::gpu::{relative_error, sample};
use crate::tune::op::{absent, fact_tensor, run_op};
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

pub struct Inputs {
    /// [B, Hq, T, D], a transposed view of a packed [B, T, Hq, D].
    pub q: Tensor,
    /// [B, Hk, T, D] likewise, when the problem rotates k too.
    pub k: Option<Tensor>,
    /// [B, 1, T, R].
    pub cos: Tensor,
    pub sin: Tensor,
    pub rotary_dim: i64,
    pub form: Form,
}

fn heads(p: &RotaryProblem, h: i64, kind: Kind, device: Device) -> Tensor {
    Tensor::randn([p.batch, p.seq, h, p.head_dim], (Kind::Float, device))
        .to_kind(kind)
        .transpose(1, 2)
}

impl Inputs {
    pub fn random(p: &RotaryProblem, device: Device) -> Inputs {
        let kind = p.dtype.tch_kind();
        let half = p.rotary_dim / 2;
        let inv_freq = (Tensor::arange(half, (Kind::Float, device))
            * (-2.0 * 10000f64.ln() / p.rotary_dim as f64))
            .exp();
        let positions = Tensor::randint(4096, [p.batch, p.seq], (Kind::Float, device));
        let freqs = positions.unsqueeze(-1) * inv_freq.view([1, 1, half]);
        let emb = match p.form {
            Form::Halves => Tensor::cat(&[&freqs, &freqs], -1),
            Form::Pairs => freqs.repeat_interleave_self_int(2, -1, None),
        };
        Inputs {
            q: heads(p, p.heads_q, kind, device),
            k: (p.heads_k > 0).then(|| heads(p, p.heads_k, kind, device)),
            cos: emb.cos().to_kind(kind).unsqueeze(1),
            sin: emb.sin().to_kind(kind).unsqueeze(1),
            rotary_dim: p.rotary_dim,
            form: p.form,
        }
    }

    /// The graph's ops on x: `x_rot·cos + rot(x_rot)·sin`, then the rest of the head.
    fn rotate(&self, x: &Tensor) -> Tensor {
        let (d, r) = (x.size()[3], self.rotary_dim);
        let xr = x.slice(-1, 0, r, 1);
        let rot = match self.form {
            Form::Halves => Tensor::cat(
                &[xr.slice(-1, r / 2, r, 1).neg(), xr.slice(-1, 0, r / 2, 1)],
                -1,
            ),
            Form::Pairs => Tensor::stack(&[xr.slice(-1, 1, r, 2).neg(), xr.slice(-1, 0, r, 2)], -1)
                .flatten(-2, -1),
        };
        let y = &xr * &self.cos + rot * &self.sin;
        if r == d {
            y
        } else {
            Tensor::cat(&[y, x.slice(-1, r, d, 1)], -1)
        }
    }

    /// The graph's ops in the tensors' dtype: q's rotation, and k's.
    pub fn torch(&self) -> (Tensor, Option<Tensor>) {
        (
            self.rotate(&self.q),
            self.k.as_ref().map(|k| self.rotate(k)),
        )
    }

    /// The same in fp64.
    pub fn reference(&self) -> (Tensor, Option<Tensor>) {
        let up = |t: &Tensor| t.to_kind(Kind::Double);
        Inputs {
            q: up(&self.q),
            k: self.k.as_ref().map(up),
            cos: up(&self.cos),
            sin: up(&self.sin),
            rotary_dim: self.rotary_dim,
            form: self.form,
        }
        .torch()
    }
}

/// What the kernel writes: [B, H, T, D] in q's layout (a transposed view of a packed [B, T, H, D]).
fn output(x: &Tensor) -> Tensor {
    let s = x.size();
    Tensor::empty([s[0], s[2], s[1], s[3]], (x.kind(), x.device())).transpose(1, 2)
}

pub struct RotaryBench<'a> {
    lib: &'a KernelLibrary,
    p: RotaryProblem,
    protocol: Protocol,
    cuda: &'static Cuda,
    device: Device,
    flush: Tensor,
    timed: Inputs,
    out: (Tensor, Option<Tensor>),
}

impl<'a> RotaryBench<'a> {
    pub fn new(
        lib: &'a KernelLibrary,
        p: RotaryProblem,
        protocol: Protocol,
    ) -> Result<RotaryBench<'a>, String> {
        let cuda = Cuda::get()?;
        let device = Device::Cuda(0);
        let timed = Inputs::random(&p, device);
        let out = (output(&timed.q), timed.k.as_ref().map(output));
        let flush = protocol.flush_buffer(device);
        Ok(RotaryBench {
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

    /// The kernel ABI's tensors, rows ordered [B, T, H] as the op orders them (x's strides).
    fn launch(
        &self,
        index: usize,
        x: &Inputs,
        out: &(Tensor, Option<Tensor>),
    ) -> Result<(), BenchError> {
        let rows = |t: &Tensor| fact_tensor(&t.permute([0, 2, 1, 3]));
        let table = |t: &Tensor, like: &Tensor| {
            let s = like.size();
            rows(&t.expand([s[0], s[1], s[2], self.p.rotary_dim], false))
        };
        let k = x.k.as_ref();
        let tensors = [
            rows(&x.q),
            k.map_or_else(absent, rows),
            table(&x.cos, &x.q),
            table(&x.sin, &x.q),
            k.map_or_else(absent, |k| table(&x.cos, k)),
            k.map_or_else(absent, |k| table(&x.sin, k)),
            rows(&out.0),
            out.1.as_ref().map_or_else(absent, rows),
        ];
        // The kernels ask for no workspace.
        run_op(self.lib, index, &tensors, &[], self.device)
    }
}

impl Bench for RotaryBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        let x = Inputs::random(&self.p, self.device);
        let out = (output(&x.q), x.k.as_ref().map(output));
        let _ = out.0.shallow_clone().fill_(f64::NAN);
        if let Some(k) = &out.1 {
            let _ = k.shallow_clone().fill_(f64::NAN);
        }
        self.launch(index, &x, &out)?;
        self.cuda.sync().map_err(BenchError::Launch)?;
        let (rq, rk) = x.reference();
        let eq = relative_error(&out.0, &rq);
        Ok(match (&out.1, rk) {
            (Some(k), Some(rk)) => eq.max(relative_error(k, &rk)),
            _ => eq,
        })
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
