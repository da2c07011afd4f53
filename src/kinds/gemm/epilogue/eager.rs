//! An epilogue program run with torch's own ops, for the tuner: in fp64 it is the reference a
//! fused kernel is verified against, in the tensors' dtype it is the eager baseline it is timed
//! against (one torch kernel per op, as the original module runs them).

use crate::kinds::gemm::epilogue::{Arg, EpOp, Epilogue};
use tch::Tensor;

/// `e` over the GEMM result `v0` (bias included) and the leaf tensors, each shaped to broadcast
/// against `v0` (row: [n], col: [m, 1], scalar: 0-d, full: v0's shape).
pub fn apply(e: &Epilogue, v0: &Tensor, leaves: &[Tensor]) -> Tensor {
    let mut values: Vec<Tensor> = vec![v0.shallow_clone()];
    for ins in &e.instrs {
        let t = |a: &Arg| -> Option<Tensor> {
            match a {
                Arg::Value(v) => Some(values[*v].shallow_clone()),
                Arg::Leaf(l) => Some(leaves[*l].shallow_clone()),
                Arg::Scalar(_) => None,
            }
        };
        let s = |i: usize| match ins.args[i] {
            Arg::Scalar(s) => s.0,
            _ => unreachable!("checked programs hold scalar parameters here"),
        };
        let (a, b) = (&ins.args[0], ins.args.get(1));
        let out = match ins.op {
            EpOp::Add | EpOp::Sub | EpOp::Mul | EpOp::Div => {
                let b = b.expect("binary op");
                match (t(a), t(b)) {
                    (Some(x), Some(y)) => match ins.op {
                        EpOp::Add => x + y,
                        EpOp::Sub => x - y,
                        EpOp::Mul => x * y,
                        _ => x / y,
                    },
                    (Some(x), None) => {
                        let y = s(1);
                        match ins.op {
                            EpOp::Add => x.g_add_scalar(y),
                            EpOp::Sub => x.g_sub_scalar(y),
                            EpOp::Mul => x.g_mul_scalar(y),
                            _ => x.g_div_scalar(y),
                        }
                    }
                    (None, Some(y)) => {
                        let x = s(0);
                        match ins.op {
                            EpOp::Add => y.g_add_scalar(x),
                            EpOp::Sub => y.rsub_scalar(x),
                            EpOp::Mul => y.g_mul_scalar(x),
                            _ => y.reciprocal().g_mul_scalar(x),
                        }
                    }
                    (None, None) => {
                        unreachable!("the matcher never builds an op over two constants")
                    }
                }
            }
            op => {
                let x = t(a).expect("unary ops take a value");
                match op {
                    EpOp::Relu => x.relu(),
                    EpOp::Gelu => x.gelu("none"),
                    EpOp::GeluTanh => x.gelu("tanh"),
                    EpOp::Sigmoid => x.sigmoid(),
                    EpOp::Silu => x.silu(),
                    EpOp::Tanh => x.tanh(),
                    EpOp::Mish => x.mish(),
                    EpOp::Softplus => {
                        let (beta, threshold) = (s(1), s(2));
                        let xb = x.g_mul_scalar(beta);
                        x.where_self(&xb.gt(threshold), &xb.exp().log1p().g_div_scalar(beta))
                    }
                    EpOp::Exp => x.exp(),
                    EpOp::Neg => x.neg(),
                    EpOp::LeakyRelu => x.where_self(&x.gt(0.0), &x.g_mul_scalar(s(1))),
                    EpOp::Clamp => x.clamp(s(1), s(2)),
                    EpOp::ClampMin => x.clamp_min(s(1)),
                    EpOp::ClampMax => x.clamp_max(s(1)),
                    EpOp::Pow => x.pow_tensor_scalar(s(1)),
                    EpOp::Add | EpOp::Sub | EpOp::Mul | EpOp::Div => unreachable!(),
                }
            }
        };
        values.push(out);
    }
    values.pop().expect("an epilogue has instructions")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn programs_compute_what_the_ops_say() {
        let x = Tensor::from_slice(&[-2.0f64, -0.5, 0.0, 0.5, 3.0]).to_device(Device::Cpu);
        let row = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0]);
        let e = Epilogue::parse(
            "leaves=row,scalar;v1=mul(v0,l0);v2=sub(1.0,v1);v3=clamp(v2,-3.0,2.0);v4=div(v3,l1)",
        )
        .unwrap();
        let got = apply(&e, &x, &[row.shallow_clone(), Tensor::from(2.0f64)]);
        let want = ((&x * &row).neg().g_add_scalar(1.0))
            .clamp(-3.0, 2.0)
            .g_div_scalar(2.0);
        assert!(got.allclose(&want, 0.0, 0.0, false), "{got} vs {want}");
        let e =
            Epilogue::parse("leaves=;v1=leaky_relu(v0,0.1);v2=softplus(v1,2.0,1.0);v3=pow(v2,3.0)")
                .unwrap();
        let got = apply(&e, &x, &[]);
        let v1 = x.where_self(&x.gt(0.0), &(&x * 0.1));
        let sp = v1.where_self(&(&v1 * 2.0).gt(1.0), &((&v1 * 2.0).exp().log1p() / 2.0));
        assert!(got.allclose(&sp.pow_tensor_scalar(3.0), 1e-12, 0.0, false));
        assert_eq!(got.kind(), Kind::Double);
    }
}
