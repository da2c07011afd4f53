//! The patch-embedding bench: what the op does on the GPU against torch's convolution. The op
//! cuts x into patches (one copy, [N·P·Q, C·R·S] row-major), runs the GEMM kernel against the
//! weight as it lies, and hands the output back in torch's default strides (one transposing
//! copy, patch-major to NCHW); a kernel's time here is those three, so the table compares what a
//! composed module would run. The baseline is `conv2d(x, w, b, stride = patch)` on x in NCHW, as
//! the model runs it. Verification runs the same three on fresh inputs into a NaN-filled output,
//! against the convolution in fp64.

use super::problem::PatchProblem;
use crate::nvcc::library::{FactTensor, KernelLibrary};
use crate::tune::cuda::Cuda;
use crate::tune::gpu::{relative_error, sample};
use crate::tune::op::{absent, fact_tensor, run_op};
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

/// x [N,C,H,W], w [K,C,R,S], b [K], random, with the op's buffers: the patches and the GEMM's
/// output.
struct Operands {
    x: Tensor,
    w: Tensor,
    b: Option<Tensor>,
    patches: Tensor,
    out: Tensor,
}

impl Operands {
    fn random(p: &PatchProblem, device: Device) -> Operands {
        let kind = p.dtype.tch_kind();
        let (m, n, k) = p.gemm_dims();
        // Weights of fan-in scale keep the outputs O(1), as a model's are.
        let scale = 1.0 / (k as f64).sqrt();
        let rand =
            |shape: &[i64], s: f64| (Tensor::randn(shape, (Kind::Float, device)) * s).to_kind(kind);
        Operands {
            x: rand(&[p.images, p.in_channels, p.height, p.width], 1.0),
            w: rand(&[n, p.in_channels, p.patch[0], p.patch[1]], scale),
            b: p.bias.then(|| rand(&[n], 1.0)),
            patches: Tensor::empty([m, k], (kind, device)),
            out: Tensor::empty([m, n], (kind, device)),
        }
    }

    /// The op's first step: x's whole patches, each a row of C·R·S in (c, r, s) order (the
    /// weight's), rows in (n, p, q) order.
    fn cut(&self, p: &PatchProblem) {
        let [ph, pw] = p.patch;
        let [rows, cols] = p.output();
        let x = self
            .x
            .narrow(2, 0, rows * ph)
            .narrow(3, 0, cols * pw)
            .view([p.images, p.in_channels, rows, ph, cols, pw])
            .permute([0, 2, 4, 1, 3, 5]);
        self.patches
            .view([p.images, rows, cols, p.in_channels, ph, pw])
            .copy_(&x);
    }

    /// The GEMM kind's call (include/fact_kernels.h, kind "gemm"): a = the patches as [1, M, K],
    /// B = wᵀ as [1, K, N] (the weight read in place), the bias, out as [1, M, N].
    fn abi(&self, p: &PatchProblem) -> Vec<FactTensor> {
        let (m, n, k) = p.gemm_dims();
        [
            fact_tensor(&self.patches.view([1, m, k])),
            fact_tensor(&self.w.view([n, k]).tr().view([1, k, n])),
            self.b.as_ref().map_or_else(absent, fact_tensor),
            fact_tensor(&self.out.view([1, m, n])),
        ]
        .into_iter()
        .collect()
    }

    /// The op's last step: the output in torch's default strides, [N, K, P, Q].
    fn nchw(&self, p: &PatchProblem) -> Tensor {
        let [rows, cols] = p.output();
        self.out
            .view([p.images, rows, cols, p.out_channels])
            .permute([0, 3, 1, 2])
            .contiguous()
    }

    fn conv(&self, p: &PatchProblem, double: bool) -> Tensor {
        let up = |t: &Tensor| {
            if double {
                t.to_kind(Kind::Double)
            } else {
                t.shallow_clone()
            }
        };
        up(&self.x).conv2d(
            &up(&self.w),
            self.b.as_ref().map(up).as_ref(),
            p.patch,
            [0, 0],
            [1, 1],
            1,
        )
    }
}

pub struct PatchBench<'a> {
    lib: &'a KernelLibrary,
    p: PatchProblem,
    protocol: Protocol,
    cuda: &'static Cuda,
    device: Device,
    flush: Tensor,
    timed: Operands,
}

impl<'a> PatchBench<'a> {
    pub fn new(
        lib: &'a KernelLibrary,
        p: PatchProblem,
        protocol: Protocol,
    ) -> Result<PatchBench<'a>, String> {
        let cuda = Cuda::get()?;
        let device = Device::Cuda(0);
        let timed = Operands::random(&p, device);
        let flush = protocol.flush_buffer(device);
        Ok(PatchBench {
            lib,
            p,
            protocol,
            cuda,
            device,
            flush,
            timed,
        })
    }
}

impl Bench for PatchBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        let ops = Operands::random(&self.p, self.device);
        let _ = ops.out.shallow_clone().fill_(f64::NAN);
        ops.cut(&self.p);
        run_op(self.lib, index, &ops.abi(&self.p), &[], self.device)?;
        let got = ops.nchw(&self.p);
        self.cuda.sync().map_err(BenchError::Launch)?;
        Ok(relative_error(&got, &ops.conv(&self.p, true)))
    }

    fn time(&mut self, index: usize) -> Result<Vec<f64>, BenchError> {
        let (lib, device, p, ops) = (self.lib, self.device, &self.p, &self.timed);
        let tensors = ops.abi(p);
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || {
                ops.cut(p);
                run_op(lib, index, &tensors, &[], device)?;
                let _ = ops.nchw(p);
                Ok(())
            },
            BenchError::Launch,
        )
    }

    fn time_baseline(&mut self) -> Result<Vec<f64>, BenchError> {
        let (p, ops) = (&self.p, &self.timed);
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || {
                let _ = ops.conv(p, false);
                Ok(())
            },
            BenchError::Launch,
        )
    }
}
