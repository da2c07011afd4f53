//! The epilogue program: elementwise ops over fp32 values (`EpOp`, their math in torch's terms),
//! leaves, scalars and instructions (`Epilogue`), its one text form (`Epilogue::text`, `parse`)
//! and the name and limits kernels take from it. The epilogue rule (mod.rs) reads programs off the
//! graph; the kind's render.rs renders them into device functors; the torch op runs them as the original ops.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::hash::{Hash, Hasher};

/// Leaf tensors a kernel takes (FACT_MAX_LEAVES in include/fact_kernels.h).
pub const MAX_LEAVES: usize = 4;

/// Full-size leaves a pattern takes. Kernels read one as the GEMM's C operand where C is free and
/// the others through aux loads (`space::LeafRead`), each staging as many epilogue subtiles in
/// shared memory as C (64 KB for the cooperative schedule's 128-row fp32 subtiles). Two keep the
/// sm90 family's cooperative tiles (C and one aux load, 128 KB, beside two mainloop stages); a
/// third would leave it the 64-row subtiles of the ping-pong schedule alone, as two already do
/// for the split families, whose C is their first GEMM's result.
pub const MAX_FULL_LEAVES: usize = 2;

/// How a kernel's epilogue computes tanh, exp and erf. Under f32-accurate they are the accurate
/// library functions (CUTLASS's `Tanh` and `GELU_taylor` go through `tanh.approx`, which the 1e-4
/// bound does not allow). Under tf32, bf16 and fp16 they are the hardware approximations
/// (`tanh.approx.f32`, relative error under 2^-10.9, and `__expf`), erf as tanh(x P(x²)) through
/// the former (`fact_erf_approx` in templates/fused_epilogue.hbs: 4e-5 from erf with an exact
/// tanh): well inside those policies' 1e-3 and 1e-2. An accurate `tanhf` per element made the
/// bf16 fc + tanh GELU epilogue cost 29% of its GEMM on the H100, and `erff` kept the bf16 fc +
/// GELU at 0.596 ms where the tanh GELU ran 0.403 (benches/results/parity). pow and softplus's
/// and mish's log1p(exp(x)) stay accurate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transcendentals {
    Accurate,
    Approximate,
}

impl Transcendentals {
    pub fn for_math(math: crate::types::MathType) -> Transcendentals {
        use crate::types::MathType;
        match math {
            MathType::Tf32x3 | MathType::F32 => Transcendentals::Accurate,
            MathType::Tf32 | MathType::Bf16 | MathType::F16 => Transcendentals::Approximate,
        }
    }
}

/// The elementwise operations an epilogue program can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpOp {
    Add,
    Sub,
    Mul,
    Div,
    Relu,
    Gelu,
    GeluTanh,
    Sigmoid,
    Silu,
    Tanh,
    Mish,
    /// softplus(x, beta, threshold)
    Softplus,
    Exp,
    Neg,
    /// leaky_relu(x, slope)
    LeakyRelu,
    /// clamp(x, lo, hi): torch's clamp and hardtanh (NaN propagates)
    Clamp,
    /// clamp_min(x, lo)
    ClampMin,
    /// clamp_max(x, hi)
    ClampMax,
    /// pow(x, e) with a scalar exponent
    Pow,
}

impl EpOp {
    pub const ALL: [EpOp; 19] = [
        EpOp::Add,
        EpOp::Sub,
        EpOp::Mul,
        EpOp::Div,
        EpOp::Relu,
        EpOp::Gelu,
        EpOp::GeluTanh,
        EpOp::Sigmoid,
        EpOp::Silu,
        EpOp::Tanh,
        EpOp::Mish,
        EpOp::Softplus,
        EpOp::Exp,
        EpOp::Neg,
        EpOp::LeakyRelu,
        EpOp::Clamp,
        EpOp::ClampMin,
        EpOp::ClampMax,
        EpOp::Pow,
    ];

    pub fn short_name(self) -> &'static str {
        match self {
            EpOp::Add => "add",
            EpOp::Sub => "sub",
            EpOp::Mul => "mul",
            EpOp::Div => "div",
            EpOp::Relu => "relu",
            EpOp::Gelu => "gelu",
            EpOp::GeluTanh => "gelu_tanh",
            EpOp::Sigmoid => "sigmoid",
            EpOp::Silu => "silu",
            EpOp::Tanh => "tanh",
            EpOp::Mish => "mish",
            EpOp::Softplus => "softplus",
            EpOp::Exp => "exp",
            EpOp::Neg => "neg",
            EpOp::LeakyRelu => "leaky_relu",
            EpOp::Clamp => "clamp",
            EpOp::ClampMin => "clamp_min",
            EpOp::ClampMax => "clamp_max",
            EpOp::Pow => "pow",
        }
    }

    /// Operands: the first is the value operated on, the rest (for unary ops with parameters)
    /// are scalars.
    pub fn arity(self) -> usize {
        match self {
            EpOp::Add
            | EpOp::Sub
            | EpOp::Mul
            | EpOp::Div
            | EpOp::LeakyRelu
            | EpOp::ClampMin
            | EpOp::ClampMax
            | EpOp::Pow => 2,
            EpOp::Softplus | EpOp::Clamp => 3,
            EpOp::Relu
            | EpOp::Gelu
            | EpOp::GeluTanh
            | EpOp::Sigmoid
            | EpOp::Silu
            | EpOp::Tanh
            | EpOp::Mish
            | EpOp::Exp
            | EpOp::Neg => 1,
        }
    }

    /// Whether operands after the first must be scalars (parameters of a unary op).
    pub fn scalar_params(self) -> bool {
        !matches!(self, EpOp::Add | EpOp::Sub | EpOp::Mul | EpOp::Div)
    }

    /// The fp32 device expression over operand expressions `x` (`scalars` holds the operands
    /// that are constants), its tanh, exp and erf as `f` says (not the exp inside log1p); NaN
    /// propagates as in torch; pow special-cases the exponents torch's kernel does.
    pub fn device_expr(self, x: &[String], scalars: &[Option<f64>], f: Transcendentals) -> String {
        let a = &x[0];
        let (tanh, exp, erf) = match f {
            Transcendentals::Accurate => ("tanhf", "expf", "erff"),
            Transcendentals::Approximate => {
                ("fact_tanh_approx", "fact_exp_approx", "fact_erf_approx")
            }
        };
        match self {
            EpOp::Add => format!("{a} + {}", x[1]),
            EpOp::Sub => format!("{a} - {}", x[1]),
            EpOp::Mul => format!("{a} * {}", x[1]),
            EpOp::Div => format!("{a} / {}", x[1]),
            EpOp::Relu => format!("{a} < 0.f ? 0.f : {a}"),
            EpOp::Gelu => format!("0.5f * {a} * (1.f + {erf}({a} * 0.70710678118654752f))"),
            EpOp::GeluTanh => format!("0.5f * {a} * (1.f + {tanh}(0.79788456080286536f * ({a} + 0.044715f * {a} * {a} * {a})))"),
            EpOp::Sigmoid => format!("1.f / (1.f + {exp}(-{a}))"),
            EpOp::Silu => format!("{a} / (1.f + {exp}(-{a}))"),
            EpOp::Tanh => format!("{tanh}({a})"),
            EpOp::Mish => format!("{a} * {tanh}(log1pf(expf({a})))"),
            EpOp::Softplus => format!("({a} * {b} > {t}) ? {a} : log1pf(expf({a} * {b})) / {b}", b = x[1], t = x[2]),
            EpOp::Exp => format!("{exp}({a})"),
            EpOp::Neg => format!("-{a}"),
            EpOp::LeakyRelu => format!("{a} > 0.f ? {a} : {a} * {}", x[1]),
            EpOp::Clamp => format!("{a} != {a} ? {a} : fminf(fmaxf({a}, {}), {})", x[1], x[2]),
            EpOp::ClampMin => format!("{a} != {a} ? {a} : fmaxf({a}, {})", x[1]),
            EpOp::ClampMax => format!("{a} != {a} ? {a} : fminf({a}, {})", x[1]),
            EpOp::Pow => match scalars.get(1).copied().flatten() {
                Some(2.0) => format!("{a} * {a}"),
                Some(3.0) => format!("{a} * {a} * {a}"),
                Some(0.5) => format!("sqrtf({a})"),
                Some(1.0) => a.to_string(),
                _ => format!("powf({a}, {})", x[1]),
            },
        }
    }

    /// Single-precision transcendental calls per element, for the cost model.
    pub fn special_calls(self) -> u32 {
        match self {
            EpOp::Gelu
            | EpOp::GeluTanh
            | EpOp::Sigmoid
            | EpOp::Silu
            | EpOp::Tanh
            | EpOp::Exp
            | EpOp::Pow => 1,
            EpOp::Softplus => 2,
            EpOp::Mish => 3,
            _ => 0,
        }
    }

    pub fn parse(s: &str) -> Option<EpOp> {
        EpOp::ALL.into_iter().find(|o| o.short_name() == s)
    }
}

/// A scalar constant of the program. Compared and hashed by its bits, so a program is a key.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Scalar(pub f64);

impl PartialEq for Scalar {
    fn eq(&self, o: &Scalar) -> bool {
        self.0.to_bits() == o.0.to_bits()
    }
}
impl Eq for Scalar {}
impl Hash for Scalar {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.to_bits().hash(h)
    }
}

impl Scalar {
    /// Exact in the text form (shortest round-trip digits), `inf`/`-inf`/`nan` for non-finite values.
    fn text(self) -> String {
        if self.0.is_nan() {
            "nan".into()
        } else {
            format!("{:?}", self.0)
        }
    }
    /// As an fp32 literal for device code (the epilogue computes in fp32).
    pub fn device_literal(self) -> String {
        let v = self.0 as f32;
        // <cmath>'s macros: valid in host and device code alike.
        if v.is_nan() {
            "NAN".into()
        } else if v.is_infinite() {
            if v > 0.0 {
                "INFINITY".into()
            } else {
                "(-INFINITY)".into()
            }
        } else {
            format!("{v:e}f")
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Arg {
    /// An earlier value: 0 is the GEMM's result.
    Value(usize),
    /// A leaf tensor, by its index in `Epilogue::leaves`.
    Leaf(usize),
    Scalar(Scalar),
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Value(i) => write!(f, "v{i}"),
            Arg::Leaf(i) => write!(f, "l{i}"),
            Arg::Scalar(s) => f.write_str(&s.text()),
        }
    }
}

/// How a leaf tensor is laid over the output [.., M, N] (torch's terms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeafKind {
    /// The output's shape: read element by element (a residual).
    Full,
    /// A vector of N, broadcast over the rows (indexed by n, like a bias).
    Row,
    /// A vector of M (shape [.., M, 1]), broadcast over the columns.
    Col,
    /// One element, broadcast everywhere (passed to kernels as fp32).
    Scalar,
}

impl LeafKind {
    pub fn short_name(self) -> &'static str {
        match self {
            LeafKind::Full => "full",
            LeafKind::Row => "row",
            LeafKind::Col => "col",
            LeafKind::Scalar => "scalar",
        }
    }
    fn parse(s: &str) -> Option<LeafKind> {
        [
            LeafKind::Full,
            LeafKind::Row,
            LeafKind::Col,
            LeafKind::Scalar,
        ]
        .into_iter()
        .find(|k| k.short_name() == s)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Instr {
    pub op: EpOp,
    pub args: Vec<Arg>,
}

/// An epilogue program: instruction i defines value i + 1; the last value is the output.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Epilogue {
    pub leaves: Vec<LeafKind>,
    pub instrs: Vec<Instr>,
}

impl Epilogue {
    /// `leaves=full,row;v1=add(v0,l0);v2=relu(v1)`: the form the torch op and the table read.
    pub fn text(&self) -> String {
        let leaves: Vec<_> = self.leaves.iter().map(|l| l.short_name()).collect();
        let mut s = format!("leaves={}", leaves.join(","));
        for (i, ins) in self.instrs.iter().enumerate() {
            let args: Vec<_> = ins.args.iter().map(Arg::to_string).collect();
            s.push_str(&format!(
                ";v{}={}({})",
                i + 1,
                ins.op.short_name(),
                args.join(",")
            ));
        }
        s
    }

    pub fn parse(text: &str) -> Result<Epilogue, String> {
        let mut parts = text.split(';');
        let head = parts.next().unwrap_or_default();
        let leaves = head
            .strip_prefix("leaves=")
            .ok_or_else(|| format!("epilogue '{text}' does not start with leaves="))?;
        let leaves: Vec<LeafKind> = leaves
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| LeafKind::parse(s).ok_or_else(|| format!("unknown leaf kind '{s}'")))
            .collect::<Result<_, _>>()?;
        let mut instrs = Vec::new();
        for (i, p) in parts.enumerate() {
            let (lhs, rhs) = p
                .split_once('=')
                .ok_or_else(|| format!("instruction '{p}' has no '='"))?;
            if lhs != format!("v{}", i + 1) {
                return Err(format!("instruction '{p}' should define v{}", i + 1));
            }
            let (op, args) = rhs
                .strip_suffix(')')
                .and_then(|r| r.split_once('('))
                .ok_or_else(|| format!("instruction '{p}' is not op(args)"))?;
            let op = EpOp::parse(op).ok_or_else(|| format!("unknown epilogue op '{op}'"))?;
            let args: Vec<Arg> = args
                .split(',')
                .map(|a| {
                    if let Some(v) = a.strip_prefix('v') {
                        v.parse()
                            .map(Arg::Value)
                            .map_err(|_| format!("bad value '{a}'"))
                    } else if let Some(l) = a.strip_prefix('l') {
                        l.parse()
                            .map(Arg::Leaf)
                            .map_err(|_| format!("bad leaf '{a}'"))
                    } else {
                        a.parse::<f64>()
                            .map(|f| Arg::Scalar(Scalar(f)))
                            .map_err(|_| format!("bad scalar '{a}'"))
                    }
                })
                .collect::<Result<_, _>>()?;
            instrs.push(Instr { op, args });
        }
        let e = Epilogue { leaves, instrs };
        e.check()?;
        Ok(e)
    }

    /// Every operand refers backwards, leaves exist, arities and scalar parameters hold.
    pub fn check(&self) -> Result<(), String> {
        if self.instrs.is_empty() {
            return Err("an epilogue has at least one instruction".into());
        }
        for (i, ins) in self.instrs.iter().enumerate() {
            if ins.args.len() != ins.op.arity() {
                return Err(format!(
                    "v{}: {} takes {} operands",
                    i + 1,
                    ins.op.short_name(),
                    ins.op.arity()
                ));
            }
            for (j, a) in ins.args.iter().enumerate() {
                match *a {
                    Arg::Value(v) if v > i => {
                        return Err(format!("v{}: v{v} is not defined yet", i + 1))
                    }
                    Arg::Leaf(l) if l >= self.leaves.len() => {
                        return Err(format!("v{}: no leaf l{l}", i + 1))
                    }
                    Arg::Scalar(_) => {}
                    _ if j > 0 && ins.op.scalar_params() => {
                        return Err(format!(
                            "v{}: {} takes scalar parameters",
                            i + 1,
                            ins.op.short_name()
                        ))
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The ops in program order, joined: `add_relu`.
    pub fn label(&self) -> String {
        self.instrs
            .iter()
            .map(|i| i.op.short_name())
            .collect::<Vec<_>>()
            .join("_")
    }

    /// Eight hex digits of the text's hash: programs with the same ops but other constants or
    /// wiring get other names.
    pub fn digest(&self) -> String {
        let h = Sha256::digest(self.text().as_bytes());
        h.iter().take(4).map(|b| format!("{b:02x}")).collect()
    }

    /// `ep_<label>_<digest>`: the suffix of rule ids and kernel names.
    pub fn tag(&self) -> String {
        format!("ep_{}_{}", self.label(), self.digest())
    }

    pub fn full_leaves(&self) -> usize {
        self.leaves.iter().filter(|l| **l == LeafKind::Full).count()
    }

    /// Arithmetic per output element (special functions counted as 8), for the cost model.
    pub fn flops_per_element(&self) -> f64 {
        self.instrs
            .iter()
            .map(|i| 1.0 + 8.0 * i.op.special_calls() as f64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_abi_takes_as_many_leaves_as_the_rules_match() {
        assert_eq!(
            crate::nvcc::library::abi::FACT_MAX_LEAVES as usize,
            MAX_LEAVES
        );
    }

    #[test]
    fn text_round_trips_and_names_differ_by_constants() {
        let e = Epilogue::parse("leaves=row;v1=add(v0,l0);v2=clamp(v1,-1.5,inf);v3=pow(v2,3.0)")
            .unwrap();
        assert_eq!(Epilogue::parse(&e.text()).unwrap(), e);
        let other =
            Epilogue::parse("leaves=row;v1=add(v0,l0);v2=clamp(v1,-1.0,inf);v3=pow(v2,3.0)")
                .unwrap();
        assert_eq!(e.label(), other.label());
        assert_ne!(e.digest(), other.digest());
        assert!(Epilogue::parse("leaves=;v1=relu(v2)")
            .unwrap_err()
            .contains("not defined"));
        assert!(Epilogue::parse("leaves=;v1=clamp(v0,l0,1.0)").is_err());
        assert!(Epilogue::parse("leaves=;v1=frob(v0)")
            .unwrap_err()
            .contains("unknown epilogue op"));
    }
}
