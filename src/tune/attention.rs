//! The attention bench: a library's attention kernels and torch's original ops on the GPU.
//! q, k and v are strided views of one packed projection, as a GPT block's `qkv.split(...).view(...)
//! .transpose(1, 2)` makes them (separate contiguous tensors when Tq ≠ Tk); the reference is the
//! explicit form in fp64; the baseline is what the graph ran: the explicit ops (two matmuls,
//! scale, masked_fill, softmax) or torch's scaled_dot_product_attention.

use super::cuda::Cuda;
use super::gpu::{relative_error, sample};
use super::op::{fact_tensor, run_op};
use super::{Bench, BenchError, Protocol};
use crate::nvcc::library::KernelLibrary;
use crate::rules::attention::AttentionOrigin;
use crate::rules::AttentionProblem;
use tch::{Device, Kind, Tensor};

pub struct Inputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// The causal keep-mask [Tq, Tk] (true where query i may see key j).
    pub keep: Tensor,
}

impl Inputs {
    /// Fresh random inputs; `logit_scale` stretches q so the scores reach larger magnitudes.
    pub fn random(p: &AttentionProblem, device: Device, logit_scale: f64) -> Inputs {
        let kind = p.dtype.tch_kind();
        let (b, h, d) = (p.batch, p.heads, p.head_dim);
        let (q, k, v) = if p.seq_q == p.seq_k {
            let qkv = Tensor::randn([b, p.seq_q, 3 * h * d], (Kind::Float, device));
            let part = |i: i64, s: f64| (qkv.narrow(2, i * h * d, h * d) * s).to_kind(kind);
            // Scaling makes each part its own tensor; re-pack them as one projection's views.
            let packed = Tensor::cat(&[part(0, logit_scale), part(1, 1.0), part(2, 1.0)], 2);
            let view = |i: i64| {
                packed
                    .narrow(2, i * h * d, h * d)
                    .view([b, p.seq_q, h, d])
                    .transpose(1, 2)
            };
            (view(0), view(1), view(2))
        } else {
            let r = |t: i64, s: f64| {
                (Tensor::randn([b, t, h, d], (Kind::Float, device)) * s)
                    .to_kind(kind)
                    .transpose(1, 2)
            };
            (r(p.seq_q, logit_scale), r(p.seq_k, 1.0), r(p.seq_k, 1.0))
        };
        let keep = Tensor::ones([p.seq_q, p.seq_k], (Kind::Bool, device)).tril(0);
        Inputs { q, k, v, keep }
    }

    /// The explicit form as eager runs it, in the tensors' dtype (fp32 follows the matmul
    /// precision): q·kᵀ, scale, masked_fill, softmax, ·v.
    pub fn explicit(&self, p: &AttentionProblem, scale: f64) -> Tensor {
        let s = self.q.matmul(&self.k.transpose(-2, -1)) * scale;
        let s = if p.causal {
            s.masked_fill(&self.keep.logical_not(), f64::NEG_INFINITY)
        } else {
            s
        };
        s.softmax(-1, None::<Kind>).matmul(&self.v)
    }

    pub fn sdpa(&self, p: &AttentionProblem, scale: f64) -> Tensor {
        Tensor::scaled_dot_product_attention(
            &self.q,
            &self.k,
            &self.v,
            None::<Tensor>,
            0.0,
            p.causal,
            Some(scale),
            false,
        )
    }

    /// The explicit form in fp64.
    pub fn reference(&self, p: &AttentionProblem, scale: f64) -> Tensor {
        let up = |t: &Tensor| t.to_kind(Kind::Double);
        Inputs {
            q: up(&self.q),
            k: up(&self.k),
            v: up(&self.v),
            keep: self.keep.shallow_clone(),
        }
        .explicit(p, scale)
    }
}

/// The kernel's output: [B,H,Tq,D] stored as [B,Tq,H,D], what `y.transpose(1, 2).contiguous()` wants.
pub fn output(p: &AttentionProblem, device: Device) -> Tensor {
    Tensor::empty(
        [p.batch, p.seq_q, p.heads, p.head_dim],
        (p.dtype.tch_kind(), device),
    )
    .transpose(1, 2)
}

pub struct AttentionBench<'a> {
    lib: &'a KernelLibrary,
    p: AttentionProblem,
    origin: AttentionOrigin,
    scale: f64,
    protocol: Protocol,
    cuda: &'static Cuda,
    device: Device,
    flush: Tensor,
    timed: Inputs,
    out: Tensor,
    verified: usize,
}

impl<'a> AttentionBench<'a> {
    pub fn new(
        lib: &'a KernelLibrary,
        p: AttentionProblem,
        protocol: Protocol,
    ) -> Result<AttentionBench<'a>, String> {
        let cuda = Cuda::get()?;
        let device = Device::Cuda(0);
        let timed = Inputs::random(&p, device, 1.0);
        let out = output(&p, device);
        let flush = protocol.flush_buffer(device);
        let scale = 1.0 / (p.head_dim as f64).sqrt();
        Ok(AttentionBench {
            lib,
            origin: p.origin,
            p,
            scale,
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
            fact_tensor(&x.q),
            fact_tensor(&x.k),
            fact_tensor(&x.v),
            fact_tensor(out),
        ];
        let scalars = [self.scale, if self.p.causal { 1.0 } else { 0.0 }, 1.0];
        run_op(self.lib, index, &tensors, &scalars, self.device)
    }
}

impl Bench for AttentionBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        // Every other input stretches the logits (scores of standard deviation 2).
        let stretch = if self.verified % 2 == 1 { 2.0 } else { 1.0 };
        self.verified += 1;
        let x = Inputs::random(&self.p, self.device, stretch);
        let out = output(&self.p, self.device);
        let _ = out.shallow_clone().fill_(f64::NAN);
        self.launch(index, &x, &out)?;
        self.cuda.sync().map_err(BenchError::Launch)?;
        Ok(relative_error(&out, &x.reference(&self.p, self.scale)))
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
        let (x, p, scale, origin) = (&self.timed, &self.p, self.scale, self.origin);
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || {
                let _ = match origin {
                    AttentionOrigin::Explicit => x.explicit(p, scale),
                    AttentionOrigin::Sdpa => x.sdpa(p, scale),
                };
                Ok(())
            },
            BenchError::Launch,
        )
    }
}
