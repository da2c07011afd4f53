fn main() {
    use fact::*;
    let p = rules::GemmProblem { m: 4096, n: 4096, k: 4096, layout: rules::GemmLayout::Rcr, dtype: types::DType::F32, bias: true };
    let c = space::gemm_candidates(&p, types::MathType::Tf32, types::Arch::Sm90);
    let tc = nvcc::Toolchain::discover().unwrap();
    println!("{tc:?} {} {}", tc.cutlass_version(), tc.nvcc_version());
    let b = nvcc::build_library(&tc, &c[..1], std::path::Path::new("/tmp/fb"), "libfact_ops.so", std::path::Path::new("/tmp/fcache"), 2, true).unwrap();
    println!("{:?}", b);
}
