//! The GEMM bench: a kernel library's variants and torch's own op on the GPU, with tch tensors.
//! Verification draws fresh random inputs, poisons the output with NaN and compares against an
//! fp64 reference; timing flushes L2 before every run and brackets only the op with CUDA events.

use super::{Epilogue, GemmLayout, GemmProblem, LeafKind, Major};
use crate::nvcc::library::{FactTensor, KernelLibrary};
use crate::tune::cuda::Cuda;
use crate::tune::gpu::{relative_error, sample};
use crate::tune::op::{absent, fact_tensor, run_op};
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

pub struct Operands {
    /// a[.., M, K] and B[.., K, N] as views lying in the problem's layout (a column-major operand
    /// is the transpose of a packed tensor; linear's B is wᵀ), so their data is what the kernel
    /// reads.
    pub a: Tensor,
    pub b: Tensor,
    pub bias: Option<Tensor>,
    /// The epilogue's leaves, shaped to broadcast against the output (scalars as fp32 0-d).
    pub leaves: Vec<Tensor>,
    pub epilogue: Option<Epilogue>,
}

impl Operands {
    /// Fresh random operands for `p` on the GPU. Normal operands make the GEMM's outputs
    /// O(√K): the saturating ranges of tanh, sigmoid and exp are reached.
    pub fn random(p: &GemmProblem, device: Device) -> Operands {
        let kind = p.dtype.tch_kind();
        let rand = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, device)).to_kind(kind);
        // A [.., rows, cols] operand lying as `major` says.
        let matrix = |rows: i64, cols: i64, major: Major| {
            let lead: &[i64] = if p.batch > 1 { &[p.batch] } else { &[] };
            match major {
                Major::Row => rand(&[lead, &[rows, cols]].concat()),
                Major::Col => rand(&[lead, &[cols, rows]].concat()).transpose(-2, -1),
            }
        };
        let leaves = p
            .epilogue
            .iter()
            .flat_map(|e| e.leaves.iter())
            .map(|l| match l {
                LeafKind::Full => rand(&Operands::out_shape(p)),
                LeafKind::Row => rand(&[p.n]),
                LeafKind::Col => rand(&[p.m, 1]),
                LeafKind::Scalar => Tensor::randn([], (Kind::Float, device)),
            })
            .collect();
        Operands {
            a: matrix(p.m, p.k, p.layout.a()),
            b: matrix(p.k, p.n, p.layout.b()),
            bias: p.bias.then(|| rand(&[p.n])),
            leaves,
            epilogue: p.epilogue.clone(),
        }
    }

    /// The output shape of the problem.
    pub fn out_shape(p: &GemmProblem) -> Vec<i64> {
        if p.batch > 1 {
            vec![p.batch, p.m, p.n]
        } else {
            vec![p.m, p.n]
        }
    }

    /// torch's ops for the problem, in the tensors' dtype (fp32 follows the matmul precision):
    /// the GEMM (the op a pattern of this layout comes from: linear for rcr, which reads w = Bᵀ
    /// packed; mm, addmm or bmm on the views otherwise, as cuBLAS reads transposed operands in
    /// place), then each epilogue op as its own kernel, as eager runs them.
    pub fn torch_op(&self, layout: GemmLayout) -> Tensor {
        let out = if self.a.dim() == 3 {
            self.a.bmm(&self.b)
        } else {
            match (layout, &self.bias) {
                (GemmLayout::Rcr, bias) => self.a.linear(&self.b.tr(), bias.as_ref()),
                (_, Some(bias)) => bias.addmm(&self.a, &self.b),
                (_, None) => self.a.mm(&self.b),
            }
        };
        match &self.epilogue {
            Some(e) => super::epilogue::eager::apply(e, &out, &self.leaves),
            None => out,
        }
    }

    /// What the graph ran for `p`, the baseline a substitution is judged against: `torch_op`,
    /// or for a padded problem (`padded_from`) linear on the first N rows of the padded weight and
    /// bias, which lie as the module's own do, so torch runs the unpadded GEMM the graph ran
    /// (under bf16 cuBLAS takes an align-1 kernel for N = 50257: far slower than the padded GEMM).
    pub fn graph_op(&self, p: &GemmProblem) -> Tensor {
        match p.padded_from {
            Some(n) => {
                let bias = self.bias.as_ref().map(|b| b.narrow(0, 0, n));
                self.a.linear(&self.b.tr().narrow(0, 0, n), bias.as_ref())
            }
            None => self.torch_op(p.layout),
        }
    }

    /// The fp64 reference.
    pub fn reference(&self, layout: GemmLayout) -> Tensor {
        let up = |t: &Tensor| t.to_kind(Kind::Double);
        Operands {
            a: up(&self.a),
            b: up(&self.b),
            bias: self.bias.as_ref().map(up),
            leaves: self.leaves.iter().map(up).collect(),
            epilogue: self.epilogue.clone(),
        }
        .torch_op(layout)
    }

    /// The kernel's tensors for these operands and `out` (include/fact_kernels.h, kind "gemm"):
    /// a, b, the bias (absent without one), the leaves and out, matrices as [L, rows, cols] and
    /// vectors and scalars as [len]; views of the same memory.
    fn abi_tensors(&self, batch: i64, out: &Tensor) -> Vec<FactTensor> {
        let matrix = |t: &Tensor| {
            let s = t.size();
            fact_tensor(&t.view([batch, s[s.len() - 2], s[s.len() - 1]]))
        };
        let kinds = self.epilogue.iter().flat_map(|e| &e.leaves);
        let leaves = self.leaves.iter().zip(kinds).map(|(t, kind)| match kind {
            LeafKind::Full => matrix(t),
            LeafKind::Row | LeafKind::Col | LeafKind::Scalar => fact_tensor(&t.view([-1])),
        });
        [
            matrix(&self.a),
            matrix(&self.b),
            self.bias.as_ref().map_or_else(absent, fact_tensor),
        ]
        .into_iter()
        .chain(leaves)
        .chain([matrix(out)])
        .collect()
    }
}

pub struct GemmBench<'a> {
    lib: &'a KernelLibrary,
    p: GemmProblem,
    protocol: Protocol,
    cuda: &'static Cuda,
    device: Device,
    flush: Tensor,
    timed: Operands,
    out: Tensor,
}

impl<'a> GemmBench<'a> {
    pub fn new(
        lib: &'a KernelLibrary,
        p: GemmProblem,
        protocol: Protocol,
    ) -> Result<GemmBench<'a>, String> {
        let cuda = Cuda::get()?;
        let device = Device::Cuda(0);
        let timed = Operands::random(&p, device);
        let out = Tensor::empty(Operands::out_shape(&p), (p.dtype.tch_kind(), device));
        let flush = protocol.flush_buffer(device);
        Ok(GemmBench {
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
}

impl Bench for GemmBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        let ops = Operands::random(&self.p, self.device);
        let out = Tensor::empty(
            Operands::out_shape(&self.p),
            (self.p.dtype.tch_kind(), self.device),
        );
        let _ = out.shallow_clone().fill_(f64::NAN);
        // No scalars: the dispatch table passes the variant's knobs.
        run_op(
            self.lib,
            index,
            &ops.abi_tensors(self.p.batch, &out),
            &[],
            self.device,
        )?;
        self.cuda.sync().map_err(BenchError::Launch)?;
        Ok(relative_error(&out, &ops.reference(self.p.layout)))
    }

    fn time(&mut self, index: usize) -> Result<Vec<f64>, BenchError> {
        let tensors = self.timed.abi_tensors(self.p.batch, &self.out);
        let (lib, device) = (self.lib, self.device);
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || run_op(lib, index, &tensors, &[], device),
            BenchError::Launch,
        )
    }

    fn time_baseline(&mut self) -> Result<Vec<f64>, BenchError> {
        let (timed, p) = (&self.timed, &self.p);
        sample(
            self.cuda,
            &self.flush,
            &self.protocol,
            &mut || {
                let _ = timed.graph_op(p);
                Ok(())
            },
            BenchError::Launch,
        )
    }
}
