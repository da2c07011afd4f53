//! The convolution bench: a library's convolution kernels and torch's (cuDNN's) convolution for
//! the problem on the GPU. The inputs are the kernels' function's: x, the weight (the BatchNorm
//! compose folds in is part of it by then), the bias per output channel and the residual, random,
//! channels-last as the kernels read them. The reference is the same function in fp64; the bias
//! and residual are of the output's scale, so a kernel that drops either misses the tolerance.
//!
//! A problem whose C the kernel pads (`ConvProblem::kernel_channels`, a stem's C = 3) draws its
//! inputs at the model's C; the kernel reads them padded with zero channels (`Inputs::for_kernel`,
//! made outside the timing, as the other problems' channels-last x is), and the baseline and the
//! reference compute the model's C = 3 convolution: what the user would otherwise run.
//!
//! The baseline is torch computing the same function, `act(conv2d(x, w, b) + residual)`, the
//! faster of NCHW (the layout the model runs in) and channels-last (cuDNN's NHWC kernels, what a
//! model converted to channels-last runs): a kernel is kept only where it beats cuDNN in both,
//! and the graph's own chain (an unfolded BatchNorm and the add and activation as kernels of
//! their own) is slower than either, so the plan's gain over the model is at least the measured
//! one.

use super::problem::{ConvAct, ConvProblem};
use crate::nvcc::library::KernelLibrary;
use crate::tune::cuda::Cuda;
use crate::tune::gpu::{relative_error, sample};
use crate::tune::op::{absent, fact_tensor, run_op};
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

/// `t` (4-D, NCHW sizes) laid out channels-last: NHWC memory, the same logical tensor.
pub fn channels_last(t: &Tensor) -> Tensor {
    t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2])
}

/// An uninitialised channels-last tensor of NCHW `sizes`.
fn empty_channels_last(sizes: [i64; 4], kind: Kind, device: Device) -> Tensor {
    let [n, c, h, w] = sizes;
    Tensor::empty([n, h, w, c], (kind, device)).permute([0, 3, 1, 2])
}

pub struct Inputs {
    /// [N, C, H, W].
    pub x: Tensor,
    /// [K, C, R, S].
    pub w: Tensor,
    pub bias: Option<Tensor>,
    /// [N, K, P, Q].
    pub residual: Option<Tensor>,
}

impl Inputs {
    /// Fresh random inputs, channels-last.
    pub fn random(p: &ConvProblem, device: Device) -> Inputs {
        let kind = p.dtype.tch_kind();
        let [out_h, out_w] = p.output();
        let fan_in = (p.in_channels / p.groups * p.filter[0] * p.filter[1]) as f64;
        let normal = |sizes: [i64; 4], scale: f64| {
            channels_last(&(Tensor::randn(sizes, (Kind::Float, device)) * scale).to_kind(kind))
        };
        Inputs {
            x: normal([p.images, p.in_channels, p.height, p.width], 1.0),
            w: normal(
                [
                    p.out_channels,
                    p.in_channels / p.groups,
                    p.filter[0],
                    p.filter[1],
                ],
                1.0 / fan_in.sqrt(),
            ),
            bias: p.bias.then(|| {
                (Tensor::randn([p.out_channels], (Kind::Float, device)) * 0.5).to_kind(kind)
            }),
            residual: p
                .residual
                .then(|| normal([p.images, p.out_channels, out_h, out_w], 1.0)),
        }
    }

    /// The tensors the kernel reads for `p`: x padded with zero channels to
    /// `p.kernel_channels()` and the weight to its share of them (`kernel_channels / groups`:
    /// a depthwise filter keeps its one channel), the op's and compose's padding, channels-last;
    /// the same tensors where the kernel runs the model's C.
    pub fn for_kernel(&self, p: &ConvProblem) -> Inputs {
        let pad = |t: &Tensor, channels: i64| {
            let [n, c, h, w] = t.size()[..] else {
                unreachable!("a 4-D convolution operand")
            };
            if c == channels {
                return t.shallow_clone();
            }
            let out = empty_channels_last([n, channels, h, w], t.kind(), t.device());
            let _ = out.narrow(1, c, channels - c).zero_();
            out.narrow(1, 0, c).copy_(t);
            out
        };
        let channels = p.kernel_channels();
        Inputs {
            x: pad(&self.x, channels),
            w: pad(&self.w, channels / p.groups),
            bias: self.bias.as_ref().map(Tensor::shallow_clone),
            residual: self.residual.as_ref().map(Tensor::shallow_clone),
        }
    }

    /// The same tensors in NCHW (packed row-major), as the model lays them out.
    pub fn nchw(&self) -> Inputs {
        Inputs {
            x: self.x.contiguous(),
            w: self.w.contiguous(),
            bias: self.bias.as_ref().map(Tensor::shallow_clone),
            residual: self.residual.as_ref().map(Tensor::contiguous),
        }
    }

    /// torch's convolution, then the residual and the activation, in the tensors' dtype and
    /// layout.
    pub fn torch(&self, p: &ConvProblem) -> Tensor {
        let y = self.x.conv2d(
            &self.w,
            self.bias.as_ref(),
            p.stride,
            p.padding,
            p.dilation,
            p.groups,
        );
        let y = match &self.residual {
            Some(r) => y + r,
            None => y,
        };
        match p.act {
            None => y,
            Some(ConvAct::Relu) => y.relu(),
            Some(ConvAct::Silu) => y.silu(),
            Some(ConvAct::Hardswish) => y.hardswish(),
            Some(ConvAct::Gelu) => y.gelu("none"),
            Some(ConvAct::GeluTanh) => y.gelu("tanh"),
            Some(ConvAct::Relu6) => y.clamp(0.0, 6.0),
            Some(ConvAct::Sigmoid) => y.sigmoid(),
            Some(ConvAct::Hardsigmoid) => y.hardsigmoid(),
        }
    }

    /// The same in fp64.
    pub fn reference(&self, p: &ConvProblem) -> Tensor {
        let up = |t: &Tensor| t.to_kind(Kind::Double);
        Inputs {
            x: up(&self.x),
            w: up(&self.w),
            bias: self.bias.as_ref().map(up),
            residual: self.residual.as_ref().map(up),
        }
        .torch(p)
    }
}

pub struct ConvBench<'a> {
    lib: &'a KernelLibrary,
    p: ConvProblem,
    protocol: Protocol,
    cuda: &'static Cuda,
    device: Device,
    flush: Tensor,
    /// The model's inputs (the baseline's) and the kernel's (`Inputs::for_kernel`).
    timed: Inputs,
    timed_kernel: Inputs,
    out: Tensor,
}

impl<'a> ConvBench<'a> {
    pub fn new(
        lib: &'a KernelLibrary,
        p: ConvProblem,
        protocol: Protocol,
    ) -> Result<ConvBench<'a>, String> {
        let cuda = Cuda::get()?;
        let device = Device::Cuda(0);
        let timed = Inputs::random(&p, device);
        let timed_kernel = timed.for_kernel(&p);
        let out = Self::output(&p, device);
        let flush = protocol.flush_buffer(device);
        Ok(ConvBench {
            lib,
            p,
            protocol,
            cuda,
            device,
            flush,
            timed,
            timed_kernel,
            out,
        })
    }

    fn output(p: &ConvProblem, device: Device) -> Tensor {
        let [out_h, out_w] = p.output();
        empty_channels_last(
            [p.images, p.out_channels, out_h, out_w],
            p.dtype.tch_kind(),
            device,
        )
    }

    fn launch(&self, index: usize, x: &Inputs, out: &Tensor) -> Result<(), BenchError> {
        let p = &self.p;
        let tensors = [
            fact_tensor(&x.x),
            fact_tensor(&x.w),
            x.bias.as_ref().map_or_else(absent, fact_tensor),
            x.residual.as_ref().map_or_else(absent, fact_tensor),
            fact_tensor(out),
        ];
        let scalars = [p.stride, p.padding, p.dilation]
            .iter()
            .flat_map(|v| v.map(|d| d as f64))
            .collect::<Vec<f64>>();
        run_op(self.lib, index, &tensors, &scalars, self.device)
    }
}

impl Bench for ConvBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        let x = Inputs::random(&self.p, self.device);
        let out = Self::output(&self.p, self.device);
        let _ = out.shallow_clone().fill_(f64::NAN);
        self.launch(index, &x.for_kernel(&self.p), &out)?;
        self.cuda.sync().map_err(BenchError::Launch)?;
        Ok(relative_error(&out, &x.reference(&self.p)))
    }

    fn time(&mut self, index: usize) -> Result<Vec<f64>, BenchError> {
        let (x, out) = (&self.timed_kernel, &self.out);
        let this = &*self;
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || this.launch(index, x, out),
            BenchError::Launch,
        )
    }

    /// The faster of torch in NCHW and in channels-last (the module doc says why).
    fn time_baseline(&mut self) -> Result<Vec<f64>, BenchError> {
        let p = &self.p;
        let nchw = self.timed.nchw();
        let mut runs = vec![];
        for x in [&self.timed, &nchw] {
            runs.push(sample(
                self.cuda,
                &self.flush,
                &self.protocol,
                &mut || {
                    let _ = x.torch(p);
                    Ok(())
                },
                BenchError::Launch,
            )?);
        }
        let median = |s: &Vec<f64>| {
            let mut s = s.clone();
            s.sort_by(f64::total_cmp);
            s.get(s.len() / 2).copied().unwrap_or(f64::INFINITY)
        };
        Ok(runs
            .into_iter()
            .min_by(|a, b| median(a).total_cmp(&median(b)))
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    /// resnet50's stem at a test's size: 7x7 stride 2 padding 3, three channels in, with its
    /// folded bias and ReLU.
    fn stem(dtype: DType) -> ConvProblem {
        ConvProblem {
            images: 2,
            height: 20,
            width: 18,
            in_channels: 3,
            out_channels: 16,
            filter: [7, 7],
            stride: [2, 2],
            padding: [3, 3],
            dilation: [1, 1],
            groups: 1,
            dtype,
            bias: true,
            residual: false,
            act: Some(ConvAct::Relu),
        }
    }

    #[test]
    fn the_kernels_inputs_pad_c_with_zero_channels_and_compute_the_models_convolution() {
        let _guard = tch::no_grad_guard();
        for (dtype, channels) in [(DType::F32, 4), (DType::Bf16, 8)] {
            let p = stem(dtype);
            let x = Inputs::random(&p, Device::Cpu);
            let k = x.for_kernel(&p);
            for (model, padded) in [(&x.x, &k.x), (&x.w, &k.w)] {
                assert_eq!(padded.size()[1], channels);
                assert_eq!(padded.size()[2..], model.size()[2..]);
                let [_, c, h, w] = padded.size()[..] else {
                    unreachable!()
                };
                assert_eq!(padded.stride(), [h * w * c, 1, w * c, c], "channels-last");
                assert!(padded.narrow(1, 0, 3).equal(model), "{dtype:?}");
                let zeros = padded.narrow(1, 3, channels - 3);
                assert_eq!(zeros.abs().sum(Kind::Double).double_value(&[]), 0.0);
            }
            // The padded convolution is the model's: zero channels add exact zeros.
            let up = |t: &Tensor| t.to_kind(Kind::Double);
            let want = x.reference(&p);
            let got = Inputs {
                x: up(&k.x),
                w: up(&k.w),
                bias: k.bias.as_ref().map(up),
                residual: None,
            }
            .torch(&p);
            assert!(got.equal(&want) || (got - &want).abs().max().double_value(&[]) < 1e-12);
        }
        // Aligned C: the kernel reads the model's tensors themselves.
        let aligned = ConvProblem {
            in_channels: 8,
            ..stem(DType::Bf16)
        };
        let x = Inputs::random(&aligned, Device::Cpu);
        assert_eq!(x.for_kernel(&aligned).x.data_ptr(), x.x.data_ptr());
    }

    /// A depthwise convolution (mobilenet's 3x3 over 16 channels) at a test's size: its filter
    /// has one input channel, which the kernel reads as the model has it. Padding it to C made
    /// every depthwise candidate refuse the bench's call (`cannot_implement` on the GPU).
    #[test]
    fn a_depthwise_filter_keeps_its_one_channel_for_the_kernel() {
        let _guard = tch::no_grad_guard();
        let p = ConvProblem {
            in_channels: 16,
            out_channels: 16,
            groups: 16,
            filter: [3, 3],
            stride: [1, 1],
            padding: [1, 1],
            ..stem(DType::Bf16)
        };
        let x = Inputs::random(&p, Device::Cpu);
        assert_eq!(x.w.size(), [16, 1, 3, 3]);
        let k = x.for_kernel(&p);
        assert_eq!(k.w.size(), [16, 1, 3, 3]);
        assert_eq!(k.w.data_ptr(), x.w.data_ptr());
        assert_eq!(k.x.data_ptr(), x.x.data_ptr());
        // The kernel's tensors compute the model's convolution.
        assert!(x.reference(&p).size() == [2, 16, 20, 18]);
    }
}
