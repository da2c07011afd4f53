//! The GEMM kernels' side of the kernel ABI without a GPU: their can_implement (host code) takes
//! the call include/fact_kernels.h states (a, b, bias, leaves, out, packed as the layout says, no
//! scalars) and refuses any other count, size, stride, dtype or alignment; the dispatch table
//! passes each variant's knobs to its kernel.

use crate::common::{build_all, fake_tensor, op_args};
use crate::compile::{accurate_spec, fused_spec, good_spec, split_spec};
use fact::kinds::gemm::space::{Family, Knobs};
use fact::kinds::gemm::GemmLayout;
use fact::kinds::Spec;
use fact::nvcc::library::FactTensor;
use fact::nvcc::Toolchain;
use fact::types::DType;

const F32: i32 = 0;
const BF16: i32 = 1;

/// The linear problem's tensors at batch `l` (M 32, N 128, K 64; a row-major, b column-major as
/// linear's weight): a, b, bias, out, each at its own 16-byte aligned fake address.
fn linear_call(l: i64) -> [FactTensor; 4] {
    [
        fake_tensor(0x10000, F32, &[l, 32, 64], &[2048, 64, 1]),
        fake_tensor(0x20000, F32, &[l, 64, 128], &[8192, 1, 64]),
        fake_tensor(0x30000, F32, &[128], &[1]),
        fake_tensor(0x40000, F32, &[l, 32, 128], &[4096, 128, 1]),
    ]
}

#[test]
fn gemm_kernels_take_the_abi_s_packed_call_and_refuse_any_other() {
    let tc = Toolchain::discover().expect("./setup provides nvcc, CUTLASS and torch");
    let split = accurate_spec().with_knobs(Knobs {
        splits: 2,
        ..Knobs::default()
    });
    let x3 = split_spec(GemmLayout::Rrr, Family::Sm90GemmX3);
    let specs: Vec<Spec> = vec![
        good_spec().into(),
        fused_spec(DType::F32).into(),
        accurate_spec().into(),
        split.into(),
        x3.into(),
    ];
    let dir = tempfile::tempdir().unwrap();
    let built = build_all(&tc, &specs, dir.path(), "libabi.so", 2);
    let lib = crate::common::open_kernels(&built.library);
    assert_eq!(lib.len(), specs.len());
    assert!((0..specs.len()).all(|i| lib.kind(i).as_deref() == Some("gemm")));
    let can = |index: usize, t: &[FactTensor]| lib.can_implement(index, &op_args(t, &[]));

    // The sm90 kernel with a bias.
    let [a, b, bias, out] = linear_call(1);
    assert!(can(0, &[a, b, bias, out]));
    let mut unbatched = a;
    unbatched.strides[0] = 0;
    assert!(
        can(0, &[unbatched, b, bias, out]),
        "the stride of a dim of size one is free"
    );
    assert!(can(0, &linear_call(2)), "a packed batch");
    let none = fake_tensor(0, F32, &[], &[]);
    let refused: Vec<(&str, [FactTensor; 4])> = vec![
        (
            "b row-major in an rcr kernel",
            [
                a,
                fake_tensor(0x20000, F32, &[1, 64, 128], &[8192, 128, 1]),
                bias,
                out,
            ],
        ),
        (
            "a's rows 128 apart",
            [
                fake_tensor(0x10000, F32, &[1, 32, 64], &[4096, 128, 1]),
                b,
                bias,
                out,
            ],
        ),
        (
            "out's rows 256 apart",
            [
                a,
                b,
                bias,
                fake_tensor(0x40000, F32, &[1, 32, 128], &[8192, 256, 1]),
            ],
        ),
        ("no bias for a kernel that adds one", [a, b, none, out]),
        (
            "a bias of K",
            [a, b, fake_tensor(0x30000, F32, &[64], &[1]), out],
        ),
        (
            "a bias of stride 2",
            [a, b, fake_tensor(0x30000, F32, &[128], &[2]), out],
        ),
        (
            "a bf16 a",
            [
                fake_tensor(0x10000, BF16, &[1, 32, 64], &[2048, 64, 1]),
                b,
                bias,
                out,
            ],
        ),
        (
            "a misaligned a",
            [
                fake_tensor(0x10004, F32, &[1, 32, 64], &[2048, 64, 1]),
                b,
                bias,
                out,
            ],
        ),
        (
            "a misaligned out",
            [
                a,
                b,
                bias,
                fake_tensor(0x40008, F32, &[1, 32, 128], &[4096, 128, 1]),
            ],
        ),
        (
            "a of rank 2",
            [fake_tensor(0x10000, F32, &[32, 64], &[64, 1]), b, bias, out],
        ),
        (
            "b of another K",
            [
                a,
                fake_tensor(0x20000, F32, &[1, 32, 128], &[4096, 1, 32]),
                bias,
                out,
            ],
        ),
        (
            "out of another N",
            [
                a,
                b,
                bias,
                fake_tensor(0x40000, F32, &[1, 32, 64], &[2048, 64, 1]),
            ],
        ),
        (
            "no rows",
            [
                fake_tensor(0x10000, F32, &[1, 0, 64], &[0, 64, 1]),
                b,
                bias,
                fake_tensor(0x40000, F32, &[1, 0, 128], &[0, 128, 1]),
            ],
        ),
        (
            "a batch of two in a alone",
            [
                fake_tensor(0x10000, F32, &[2, 32, 64], &[2048, 64, 1]),
                b,
                bias,
                out,
            ],
        ),
        ("one a broadcast over the batch", {
            let [_, b2, bias2, out2] = linear_call(2);
            [
                fake_tensor(0x10000, F32, &[2, 32, 64], &[0, 64, 1]),
                b2,
                bias2,
                out2,
            ]
        }),
    ];
    for (why, t) in &refused {
        assert!(!can(0, t), "{why}");
    }
    assert!(!can(0, &[a, b, bias]), "three tensors");
    assert!(
        !lib.can_implement(0, &op_args(&[a, b, bias, out], &[1.0])),
        "a scalar"
    );

    // The fused kernel: a, b, bias, then the leaves full, row, col and scalar, then out.
    let full = fake_tensor(0x50000, F32, &[1, 32, 128], &[4096, 128, 1]);
    let row = fake_tensor(0x60000, F32, &[128], &[1]);
    let col = fake_tensor(0x70000, F32, &[32], &[1]);
    // A scalar leaf needs only a float's alignment.
    let scalar = fake_tensor(0x80004, F32, &[1], &[1]);
    assert!(can(1, &[a, b, bias, full, row, col, scalar, out]));
    let leaves_refused: Vec<(&str, Vec<FactTensor>)> = vec![
        (
            "row and col swapped",
            vec![a, b, bias, full, col, row, scalar, out],
        ),
        ("no scalar", vec![a, b, bias, full, row, col, out]),
        (
            "a residual with rows 256 apart",
            vec![
                a,
                b,
                bias,
                fake_tensor(0x50000, F32, &[1, 32, 128], &[8192, 256, 1]),
                row,
                col,
                scalar,
                out,
            ],
        ),
        (
            "a bf16 scalar",
            vec![
                a,
                b,
                bias,
                full,
                row,
                col,
                fake_tensor(0x80004, BF16, &[1], &[1]),
                out,
            ],
        ),
        (
            "a scalar of two",
            vec![
                a,
                b,
                bias,
                full,
                row,
                col,
                fake_tensor(0x80004, F32, &[2], &[1]),
                out,
            ],
        ),
        (
            "a misaligned scalar",
            vec![
                a,
                b,
                bias,
                full,
                row,
                col,
                fake_tensor(0x80002, F32, &[1], &[1]),
                out,
            ],
        ),
        (
            "a misaligned row",
            vec![
                a,
                b,
                bias,
                full,
                fake_tensor(0x60004, F32, &[128], &[1]),
                col,
                scalar,
                out,
            ],
        ),
        ("a col leaf under a batch", {
            let [a2, b2, bias2, out2] = linear_call(2);
            let full2 = fake_tensor(0x50000, F32, &[2, 32, 128], &[4096, 128, 1]);
            vec![a2, b2, bias2, full2, row, col, scalar, out2]
        }),
    ];
    for (why, t) in &leaves_refused {
        assert!(!can(1, t), "{why}");
    }

    // The sm80 kernel runs a batch; its variant of two K splits does not (serial split-K is for
    // single GEMMs): the dispatch table passed the variant's knobs.
    assert!(can(2, &linear_call(1)) && can(2, &linear_call(2)));
    assert!(can(3, &linear_call(1)) && !can(3, &linear_call(2)));

    // The tf32 split of an rrr problem, no bias: a batch of two, b row-major.
    let rrr = [
        fake_tensor(0x10000, F32, &[2, 32, 64], &[2048, 64, 1]),
        fake_tensor(0x20000, F32, &[2, 64, 128], &[8192, 128, 1]),
        none,
        fake_tensor(0x40000, F32, &[2, 32, 128], &[4096, 128, 1]),
    ];
    assert!(can(4, &rrr));
    let [a3, b3, _, out3] = rrr;
    assert!(
        !can(4, &[a3, b3, bias, out3]),
        "a bias for a kernel without one"
    );
    assert!(
        !can(
            4,
            &[
                a3,
                fake_tensor(0x20000, F32, &[2, 64, 128], &[8192, 1, 64]),
                none,
                out3
            ]
        ),
        "b column-major in an rrr kernel"
    );
}
