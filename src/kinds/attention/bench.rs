//! The attention bench: a library's attention kernels and torch's original ops on the GPU.
//! q, k and v are strided views of one packed projection, as a GPT block's `qkv.split(...).view(...)
//! .transpose(1, 2)` makes them (k and v with their own heads when grouped; separate contiguous
//! tensors when Tq ≠ Tk). A padded problem's key lengths are drawn per sequence from [1, Tk], with
//! a full one, one of length 1 and a short one in every round of three sequences or more (across
//! three rounds for fewer). The reference is the explicit form in fp64 (a query head reads its k/v
//! head by index, masked by the lengths and the causal triangle), checked on every sequence and
//! every output row (`attention_error`); the baseline is what the graph ran: the explicit ops (two
//! matmuls, scale, masked_fill, softmax) or torch's scaled_dot_product_attention, with k/v repeated
//! as Hugging Face's `repeat_kv` does (expand + reshape) and, for key lengths, the boolean mask it
//! passes ([B,1,1,Tk] expanded, or with the causal triangle [B,1,Tq,Tk]). A bias problem's bias
//! is drawn per head (and per sequence where batched, else [1,H,Tq,Tk] broadcast over the
//! sequences; one row of keys per head broadcast over the queries, query stride 0, for the
//! `Keys` forms), with a quarter of each row's cells at the dtype's lowest value, as a padding or
//! window mask summed into a position bias puts them (key 0 always visible); its rows lie 16
//! bytes apart as the kernel reads them (the op pads a bias whose rows do not).

use super::{AttentionBias, AttentionOrigin, AttentionProblem};
use crate::nvcc::library::KernelLibrary;
use crate::tune::cuda::Cuda;
use crate::tune::gpu::sample;
use crate::tune::op::{absent, fact_tensor, run_op};
use crate::tune::{Bench, BenchError, Protocol};
use tch::{Device, Kind, Tensor};

pub struct Inputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// Each sequence's key count (int32 [B]), for a padded problem.
    pub lengths: Option<Tensor>,
    /// True where query i (of batch b) may see key j: the causal [Tq, Tk], or with key lengths
    /// [B,1,Tq,Tk]; None where every key is visible.
    pub keep: Option<Tensor>,
    /// A bias problem's bias, [B,H,Tq,Tk] (a broadcast view over the sequences when shared), or
    /// for W windows [B/W,W,H,Tq,Tk] (a broadcast view of one bias per window).
    pub bias: Option<Tensor>,
}

impl Inputs {
    /// Fresh random inputs; `logit_scale` stretches q so the scores reach larger magnitudes;
    /// `round` rotates which sequences get the full, the length-1 and the short key lengths.
    pub fn random(p: &AttentionProblem, device: Device, logit_scale: f64, round: usize) -> Inputs {
        let kind = p.dtype.tch_kind();
        let (b, h, hkv, d) = (p.batch, p.heads, p.key_heads(), p.head_dim);
        let (q, k, v) = if p.seq_q == p.seq_k {
            let t = p.seq_q;
            let qkv = Tensor::randn([b, t, (h + 2 * hkv) * d], (Kind::Float, device));
            let part = |start: i64, heads: i64, s: f64| {
                (qkv.narrow(2, start * d, heads * d) * s).to_kind(kind)
            };
            // Scaling makes each part its own tensor; re-pack them as one projection's views.
            let packed = Tensor::cat(
                &[
                    part(0, h, logit_scale),
                    part(h, hkv, 1.0),
                    part(h + hkv, hkv, 1.0),
                ],
                2,
            );
            let view = |start: i64, heads: i64| {
                packed
                    .narrow(2, start * d, heads * d)
                    .view([b, t, heads, d])
                    .transpose(1, 2)
            };
            (view(0, h), view(h, hkv), view(h + hkv, hkv))
        } else {
            let r = |t: i64, heads: i64, s: f64| {
                (Tensor::randn([b, t, heads, d], (Kind::Float, device)) * s)
                    .to_kind(kind)
                    .transpose(1, 2)
            };
            (
                r(p.seq_q, h, logit_scale),
                r(p.seq_k, hkv, 1.0),
                r(p.seq_k, hkv, 1.0),
            )
        };
        let lengths = p.padded.then(|| key_lengths(p, round).to_device(device));
        let keep = keep_mask(p, lengths.as_ref(), device);
        let bias = p.bias.map(|b| random_bias(p, b, device, round));
        Inputs {
            q,
            k,
            v,
            lengths,
            keep,
            bias,
        }
    }

    /// The explicit form as eager runs it, in the tensors' dtype (fp32 follows the matmul
    /// precision): q·kᵀ, scale, masked_fill, softmax, ·v (k and v repeated per query head).
    pub fn explicit(&self, p: &AttentionProblem, scale: f64) -> Tensor {
        let (k, v) = (repeat_kv(&self.k, p), repeat_kv(&self.v, p));
        let s = self.q.matmul(&k.transpose(-2, -1)) * scale;
        let s = match &self.bias {
            // Swin's: the scores viewed per window, the bias added, viewed back.
            Some(bias) if bias.dim() == 5 => {
                let dims = s.size();
                (s.view(bias.size().as_slice()) + bias).view(dims.as_slice())
            }
            Some(bias) => s + bias,
            None => s,
        };
        let s = match &self.keep {
            Some(keep) => s.masked_fill(&keep.logical_not(), f64::NEG_INFINITY),
            None => s,
        };
        s.softmax(-1, None::<Kind>).matmul(&v)
    }

    /// torch's SDPA as Hugging Face calls it: k and v repeated per query head, the causal flag,
    /// or with key lengths the boolean mask (with the causal triangle in it).
    pub fn sdpa(&self, p: &AttentionProblem, scale: f64) -> Tensor {
        let (k, v) = (repeat_kv(&self.k, p), repeat_kv(&self.v, p));
        // The graph's call: a mask tensor where it passes one (padded, or a computed all-visible
        // or causal mask; a bias, with a mask class beside it as `where(keep, bias, lowest)`,
        // Hugging Face's SDPA integration's), else the is_causal flag.
        let mask = if let Some(bias) = &self.bias {
            let bias = scores_bias(bias, p);
            Some(match &self.keep {
                Some(keep) => bias.where_scalarother(keep, p.dtype.lowest()),
                None => bias,
            })
        } else if p.padded || p.masked {
            Some(self.keep.as_ref().map_or_else(
                || {
                    Tensor::ones([1, 1, 1, 1], (Kind::Bool, self.q.device()))
                        .expand([p.batch, 1, p.seq_q, p.seq_k], false)
                },
                Tensor::shallow_clone,
            ))
        } else {
            None
        };
        // The graph's mask not dense along the keys: laid out so here too (the keys strided by
        // the queries), which sends torch's call where the graph's goes.
        let mask = mask.map(|m| {
            if p.mask_strided {
                m.transpose(-1, -2).contiguous().transpose(-1, -2)
            } else {
                m
            }
        });
        Tensor::scaled_dot_product_attention(
            &self.q,
            &k,
            &v,
            mask,
            0.0,
            p.causal && !p.padded && !p.masked && p.bias.is_none(),
            Some(scale),
            false,
        )
    }

    /// The explicit form in fp64, query head h reading k/v head h / (Hq/Hkv) by index.
    pub fn reference(&self, p: &AttentionProblem, scale: f64) -> Tensor {
        let device = self.q.device();
        let group = p.heads / p.key_heads();
        let heads = Tensor::arange(p.heads, (Kind::Int64, device)).floor_divide_scalar(group);
        let kv = |t: &Tensor| t.to_kind(Kind::Double).index_select(1, &heads);
        let s = self
            .q
            .to_kind(Kind::Double)
            .matmul(&kv(&self.k).transpose(-2, -1))
            * scale;
        let s = match &self.bias {
            Some(bias) => s + scores_bias(bias, p).to_kind(Kind::Double),
            None => s,
        };
        let s = match &self.keep {
            Some(keep) => s.masked_fill(&keep.logical_not(), f64::NEG_INFINITY),
            None => s,
        };
        s.softmax(-1, None::<Kind>).matmul(&kv(&self.v))
    }
}

/// A bias as the scores [B,H,Tq,Tk] read it (windows' repeated over the sequences).
fn scores_bias(bias: &Tensor, p: &AttentionProblem) -> Tensor {
    if bias.dim() == 5 {
        bias.reshape([p.batch, p.heads, p.seq_q, p.seq_k])
    } else {
        bias.shallow_clone()
    }
}

/// A bias for `p` (`Inputs::bias`): normal values of standard deviation 2, a quarter of the cells
/// of each row past key 0 at the dtype's lowest value, in rows 16 bytes apart. In odd rounds one
/// bias serves every head (a head stride of 0, as a [B,1,Tq,Tk] mask broadcast over the heads is
/// read), so every kernel kept for a bias was verified reading both layouts (windows' biases are
/// one per head always).
fn random_bias(p: &AttentionProblem, bias: AttentionBias, device: Device, round: usize) -> Tensor {
    let kind = p.dtype.tch_kind();
    let windows = matches!(bias, AttentionBias::Windows(_));
    let heads = if round % 2 == 1 && !windows {
        1
    } else {
        p.heads
    };
    let dims = [bias.count(p.batch), heads, bias.rows(p.seq_q), p.seq_k];
    let masked = Tensor::rand(dims, (Kind::Float, device))
        .lt(0.25)
        .index_fill(3, &Tensor::from_slice(&[0i64]).to_device(device), 0);
    let values = (Tensor::randn(dims, (Kind::Float, device)) * 2.0)
        .masked_fill(&masked, p.dtype.lowest())
        .to_kind(kind);
    let rows = aligned_rows(&values);
    match bias {
        AttentionBias::Windows(w) => rows
            .unsqueeze(0)
            .expand([p.batch / w, w, p.heads, p.seq_q, p.seq_k], false),
        _ => rows.expand([p.batch, p.heads, p.seq_q, p.seq_k], false),
    }
}

/// `x` [.., Tk] copied into rows of a multiple of 16 bytes (a view of the first Tk of each), as
/// the kernel reads a bias; `x` itself when its rows already are.
pub fn aligned_rows(x: &Tensor) -> Tensor {
    let tk = *x.size().last().expect("a bias has dims");
    let align = 16 / x.kind().elt_size_in_bytes() as i64;
    if tk % align == 0 {
        return x.shallow_clone();
    }
    let mut dims = x.size();
    *dims.last_mut().unwrap() = (tk + align - 1) / align * align;
    let padded = Tensor::zeros(dims, (x.kind(), x.device()));
    let mut rows = padded.narrow(-1, 0, tk);
    rows.copy_(x);
    rows
}

/// Each sequence's key count: drawn from [1, Tk]; then, for the first three sequences from
/// `round` on (wrapping), all Tk keys, one key, and a count from [2, Tk - 1] (from [1, Tk] when
/// Tk < 3), in turn by the sequence's place in that order plus `round`, so one round of three
/// sequences or more holds all three kinds and fewer sequences meet them over three rounds.
fn key_lengths(p: &AttentionProblem, round: usize) -> Tensor {
    let tk = p.seq_k;
    let cpu = (Kind::Int64, Device::Cpu);
    let drawn = Tensor::randint_low(1, tk + 1, [p.batch], cpu);
    let short = if tk >= 3 {
        Tensor::randint_low(2, tk, [1], cpu)
    } else {
        Tensor::randint_low(1, tk + 1, [1], cpu)
    }
    .int64_value(&[0]);
    let mut lengths: Vec<i32> = (0..p.batch)
        .map(|i| drawn.int64_value(&[i]) as i32)
        .collect();
    let n = lengths.len();
    for j in 0..n.min(3) {
        lengths[(round + j) % n] = match (round + j) % 3 {
            0 => tk,
            1 => 1,
            _ => short,
        } as i32;
    }
    Tensor::from_slice(&lengths)
}

/// The keep-mask of `Inputs::keep`: HF's key-padding mask is [B,1,1,Tk] expanded over the
/// queries (a view); with the causal triangle it is one [B,1,Tq,Tk] tensor.
fn keep_mask(p: &AttentionProblem, lengths: Option<&Tensor>, device: Device) -> Option<Tensor> {
    let causal = p
        .causal
        .then(|| Tensor::ones([p.seq_q, p.seq_k], (Kind::Bool, device)).tril(0));
    let padding = lengths.map(|l| {
        Tensor::arange(p.seq_k, (Kind::Int, device))
            .view([1, 1, 1, -1])
            .lt_tensor(&l.view([-1, 1, 1, 1]))
    });
    match (causal, padding) {
        // A causal mask tensor as the graph passes it: [B,1,Tq,Tk] (a broadcast view).
        (Some(causal), None) if p.masked => Some(
            causal
                .view([1, 1, p.seq_q, p.seq_k])
                .expand([p.batch, 1, p.seq_q, p.seq_k], false),
        ),
        (causal, None) => causal,
        (None, Some(keys)) => Some(keys.expand([p.batch, 1, p.seq_q, p.seq_k], false)),
        (Some(causal), Some(keys)) => Some(keys.logical_and(&causal)),
    }
}

/// k or v with each head repeated for its query heads, as Hugging Face's `repeat_kv` does
/// (expand, then reshape: a copy); itself when not grouped.
fn repeat_kv(x: &Tensor, p: &AttentionProblem) -> Tensor {
    match p.kv_heads {
        Some(kv) if kv != p.heads => {
            let s = x.size();
            x.unsqueeze(2)
                .expand([s[0], kv, p.heads / kv, s[2], s[3]], false)
                .reshape([s[0], p.heads, s[2], s[3]])
        }
        _ => x.shallow_clone(),
    }
}

/// How much larger than a sequence's relative error one output row's may be: a row sums few
/// weighted values where its sequence is short, so its rounding spreads more (tf32 rows reached
/// 2e-3 where their sequences stayed under 5e-4, in an fp64 emulation of the kernels' roundings),
/// while a row computed wrong (a masked key seen, another head's values) is off by its own size.
const ROW_SLACK: f64 = 20.0;

/// The verification error of an attention output [B,H,Tq,D] against its fp64 reference: the
/// largest relative error of one sequence (batch b's [H,Tq,D], so a short sequence cannot hide in
/// the whole's norm) or of one output row over `ROW_SLACK`, whichever is larger; NaN when any
/// output is (a poisoned row left unwritten).
pub fn attention_error(out: &Tensor, reference: &Tensor) -> f64 {
    let diff = out.to_kind(Kind::Double) - reference;
    let b = reference.size()[0];
    let norms = |t: &Tensor, dims: &[i64]| t.norm_scalaropt_dim(2, dims, false);
    let sequences = norms(&diff.reshape([b, -1]), &[1]) / norms(&reference.reshape([b, -1]), &[1]);
    let rows = norms(&diff, &[-1]) / norms(reference, &[-1]);
    // torch's max propagates NaN (f64::max would drop it).
    Tensor::stack(&[sequences.max(), rows.max() / ROW_SLACK], 0)
        .max()
        .double_value(&[])
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
        let timed = Inputs::random(&p, device, 1.0, 0);
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
            absent(),
            x.lengths.as_ref().map_or_else(absent, fact_tensor),
            x.bias.as_ref().map_or_else(absent, fact_tensor),
        ];
        let scalars = [self.scale, if self.p.causal { 1.0 } else { 0.0 }, 1.0];
        run_op(self.lib, index, &tensors, &scalars, self.device)
    }
}

impl Bench for AttentionBench<'_> {
    fn verify(&mut self, index: usize) -> Result<f64, BenchError> {
        // Every other input stretches the logits (scores of standard deviation 2).
        let stretch = if self.verified % 2 == 1 { 2.0 } else { 1.0 };
        let x = Inputs::random(&self.p, self.device, stretch, self.verified);
        self.verified += 1;
        let out = output(&self.p, self.device);
        let _ = out.shallow_clone().fill_(f64::NAN);
        self.launch(index, &x, &out)?;
        self.cuda.sync().map_err(BenchError::Launch)?;
        Ok(attention_error(&out, &x.reference(&self.p, self.scale)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::DType;

    fn problem(causal: bool, padded: bool, kv_heads: Option<i64>) -> AttentionProblem {
        AttentionProblem {
            origin: AttentionOrigin::Sdpa,
            batch: 5,
            heads: 4,
            seq_q: 48,
            seq_k: 48,
            head_dim: 16,
            dtype: DType::F32,
            causal,
            kv_heads,
            padded,
            masked: false,
            bias: None,
            mask_strided: false,
        }
    }

    /// `x`'s tensors and mask without its bias.
    fn without_bias(x: &Inputs) -> Inputs {
        Inputs {
            q: x.q.shallow_clone(),
            k: x.k.shallow_clone(),
            v: x.v.shallow_clone(),
            lengths: x.lengths.as_ref().map(Tensor::shallow_clone),
            keep: x.keep.as_ref().map(Tensor::shallow_clone),
            bias: None,
        }
    }

    fn rel(a: &Tensor, b: &Tensor) -> f64 {
        let diff = (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
            .norm()
            .double_value(&[]);
        diff / b.to_kind(Kind::Double).norm().double_value(&[])
    }

    #[test]
    fn key_lengths_hold_a_full_a_single_and_a_short_sequence() {
        let p = problem(false, true, None);
        for round in 0..4 {
            let l: Vec<i64> = Vec::try_from(key_lengths(&p, round).to_kind(Kind::Int64)).unwrap();
            assert_eq!(l.len(), 5);
            assert!(l.iter().all(|&n| (1..=48).contains(&n)), "{l:?}");
            assert!(l.contains(&48) && l.contains(&1), "{l:?}");
            assert!(l.iter().any(|&n| (2..48).contains(&n)), "{l:?}");
        }
        // One sequence meets each kind over three rounds.
        let one = AttentionProblem { batch: 1, ..p };
        let mut seen: Vec<i64> = (0..3)
            .map(|r| key_lengths(&one, r).int64_value(&[0]))
            .collect();
        seen.sort();
        assert!(
            seen[0] == 1 && (2..48).contains(&seen[1]) && seen[2] == 48,
            "{seen:?}"
        );
    }

    #[test]
    fn the_reference_reads_grouped_heads_by_index_and_masks_past_each_length() {
        let _guard = tch::no_grad_guard();
        for causal in [false, true] {
            let p = problem(causal, true, Some(2));
            let x = Inputs::random(&p, Device::Cpu, 1.0, 0);
            assert_eq!((x.q.size()[1], x.k.size()[1], x.v.size()[1]), (4, 2, 2));
            let r = x.reference(&p, 0.25);
            assert_eq!(r.size(), [5, 4, 48, 16]);
            let lengths: Vec<i64> =
                Vec::try_from(x.lengths.as_ref().unwrap().to_kind(Kind::Int64)).unwrap();
            for (b, &len) in lengths.iter().enumerate() {
                let b = b as i64;
                for h in 0..4 {
                    // Query head h reads k/v head h / 2.
                    let v = x.v.get(b).get(h / 2).to_kind(Kind::Double);
                    if len == 1 {
                        // One key: every query's output is that key's value.
                        let want = v.get(0).unsqueeze(0).expand([48, 16], false);
                        assert!(rel(&r.get(b).get(h), &want) < 1e-12);
                    }
                    // Another head's values (or keys past the length) would change the row.
                    let own = r.get(b).get(h).get(47);
                    let k = x.k.get(b).get(h / 2).to_kind(Kind::Double);
                    let q = x.q.get(b).get(h).get(47).to_kind(Kind::Double);
                    let w = (k.narrow(0, 0, len).matmul(&q) * 0.25).softmax(0, None::<Kind>);
                    let want = w.matmul(&v.narrow(0, 0, len));
                    assert!(rel(&own, &want) < 1e-12, "b {b} h {h} len {len}");
                }
            }
        }
    }

    #[test]
    fn baselines_compute_what_the_reference_does() {
        let _guard = tch::no_grad_guard();
        for (causal, padded, kv, masked) in [
            (true, false, Some(2), false),
            (false, true, None, false),
            (true, true, Some(1), false),
            (false, false, None, false),
            // The graph's own mask tensors: the causal triangle and an all-visible one.
            (true, false, Some(2), true),
            (false, false, None, true),
        ] {
            let p = AttentionProblem {
                masked,
                ..problem(causal, padded, kv)
            };
            let x = Inputs::random(&p, Device::Cpu, 2.0, 1);
            let r = x.reference(&p, 0.25);
            assert!(rel(&x.sdpa(&p, 0.25), &r) < 1e-5, "{}", p.rule_id());
            assert!(rel(&x.explicit(&p, 0.25), &r) < 1e-5, "{}", p.rule_id());
            if padded {
                // The mask HF passes: [B,1,Tq,Tk].
                assert_eq!(x.keep.as_ref().unwrap().size(), [5, 1, 48, 48]);
            }
        }
    }

    #[test]
    fn bias_baselines_add_the_bias_the_reference_adds_in_rows_the_kernel_reads() {
        let _guard = tch::no_grad_guard();
        for (bias, origin, seq) in [
            (AttentionBias::Shared, AttentionOrigin::Sdpa, 49),
            (AttentionBias::Batched, AttentionOrigin::Explicit, 48),
            (AttentionBias::Windows(5), AttentionOrigin::Explicit, 49),
            // ALiBi's [H,1,Tk] (MPT's, beside its causal fill) and a per-sequence row of keys.
            (AttentionBias::Keys, AttentionOrigin::Explicit, 48),
            (AttentionBias::KeysBatched, AttentionOrigin::Sdpa, 49),
        ] {
            // T5's: a shared bias beside padded keys (SDPA's where), or the causal triangle.
            for (causal, padded) in [(false, true), (true, false), (true, true)] {
                let p = AttentionProblem {
                    seq_q: seq,
                    seq_k: seq,
                    bias: Some(AttentionBias::Shared),
                    ..problem(causal, padded, None)
                };
                let x = Inputs::random(&p, Device::Cpu, 1.0, 0);
                let r = x.reference(&p, 0.25);
                assert!(r.isfinite().all().int64_value(&[]) == 1);
                assert!(rel(&x.sdpa(&p, 0.25), &r) < 1e-5, "{}", p.rule_id());
                // The bias moves the output: the baseline reads it beside the mask.
                let without = without_bias(&x);
                let plain = AttentionProblem {
                    bias: None,
                    ..p.clone()
                };
                assert!(rel(&without.reference(&plain, 0.25), &r) > 1e-2);
            }
            let p = AttentionProblem {
                origin,
                seq_q: seq,
                seq_k: seq,
                bias: Some(bias),
                ..problem(false, false, None)
            };
            let x = Inputs::random(&p, Device::Cpu, 1.0, 0);
            let b = scores_bias(x.bias.as_ref().unwrap(), &p);
            assert_eq!(b.size(), [5, 4, seq, seq]);
            // Shared: one bias broadcast over the sequences; rows a multiple of 16 bytes apart.
            let raw = x.bias.as_ref().unwrap();
            let strides = raw.stride();
            let per_sequence = raw.size()[0] > 1 && strides[0] != 0;
            let batched = matches!(bias, AttentionBias::Batched | AttentionBias::KeysBatched);
            assert_eq!(per_sequence, batched, "{strides:?}");
            if let AttentionBias::Windows(w) = bias {
                assert_eq!(raw.size()[..2], [5 / w, w]);
            }
            // A row of keys per head: every query reads it through a stride of 0.
            let keys = matches!(bias, AttentionBias::Keys | AttentionBias::KeysBatched);
            assert_eq!(strides[2] == 0, keys, "{strides:?}");
            assert_eq!(strides[strides.len() - 2] % 4, 0, "{strides:?}");
            // Masked cells at the lowest value, key 0 never among them: a quarter of the others,
            // within five standard deviations of the cells drawn (a row of keys draws few).
            let masked = b
                .le(-1e38)
                .to_kind(Kind::Double)
                .mean(None::<Kind>)
                .double_value(&[]);
            let drawn = (bias.count(5) * 4 * bias.rows(seq) * (seq - 1)) as f64;
            let expected = 0.25 * (seq - 1) as f64 / seq as f64;
            let spread = 5.0 * (0.25 * 0.75 / drawn).sqrt();
            assert!((masked - expected).abs() < spread, "{masked}");
            assert_eq!(
                b.narrow(3, 0, 1)
                    .le(-1e38)
                    .sum(None::<Kind>)
                    .int64_value(&[]),
                0
            );
            let r = x.reference(&p, 0.25);
            assert!(r.isfinite().all().int64_value(&[]) == 1);
            assert!(rel(&x.sdpa(&p, 0.25), &r) < 1e-5, "{}", p.rule_id());
            assert!(rel(&x.explicit(&p, 0.25), &r) < 1e-5, "{}", p.rule_id());
            // Odd rounds broadcast one bias over the heads (stride 0), which the baselines and
            // the reference read as the kernel does.
            let odd = Inputs::random(&p, Device::Cpu, 1.0, 1);
            let head_stride =
                odd.bias.as_ref().unwrap().stride()[odd.bias.as_ref().unwrap().dim() - 3];
            assert_eq!(
                head_stride == 0,
                !matches!(bias, AttentionBias::Windows(_)),
                "{}",
                p.rule_id()
            );
            let ro = odd.reference(&p, 0.25);
            assert!(
                rel(&odd.sdpa(&p, 0.25), &ro) < 1e-5 && rel(&odd.explicit(&p, 0.25), &ro) < 1e-5
            );
            // A mask laid out with the keys strided is the same mask to the baseline.
            let strided = AttentionProblem {
                mask_strided: true,
                ..p.clone()
            };
            if origin == AttentionOrigin::Sdpa {
                assert!(rel(&x.sdpa(&strided, 0.25), &r) < 1e-5);
            }
            // Without the bias the outputs differ: the baselines and reference read it.
            let without = without_bias(&x);
            assert!(rel(&without.reference(&p, 0.25), &r) > 1e-2);
        }
    }

    #[test]
    fn the_error_sees_one_wrong_row_and_an_unwritten_one() {
        let _guard = tch::no_grad_guard();
        let p = problem(true, true, Some(2));
        let x = Inputs::random(&p, Device::Cpu, 1.0, 0);
        let r = x.reference(&p, 0.25);
        let out = r.to_kind(Kind::Float);
        assert!(attention_error(&out, &r) < 1e-6);
        // One row of 960 with another row's values: a twentieth of its error is still well past
        // every policy's tolerance, where the whole output's relative error stays near it. In
        // batch 0, whose keys are all there (round 0), so rows 10 and 30 see different keys; in a
        // short sequence both could see the same ones and hold the same values.
        let wrong = out.copy();
        wrong
            .get(0)
            .get(1)
            .get(10)
            .copy_(&out.get(0).get(1).get(30));
        assert!(attention_error(&wrong, &r) > 1e-2);
        let unwritten = out.copy();
        let _ = unwritten.get(4).get(3).get(47).fill_(f64::NAN);
        assert!(attention_error(&unwritten, &r).is_nan());
    }
}
