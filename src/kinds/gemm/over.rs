//! The `TypedKind` methods of a kind built over the GEMM kind (`type Spec = KernelSpec`): the
//! sibling linears and the patch embeddings. Their kernels are GEMM kernels, so a problem's
//! alignment class and math and a spec's name, render, compile unit, dispatch, family and
//! failure features are the GEMM kind's, and a sweep
//! is the GEMM kind's sweep (first round, retry, later rounds) of the GEMM the kind's problem
//! computes. What stays the kind's own is written in its impl beside the invocation: the match,
//! the problem (its table key), the bench, the edit and the op.

/// Expands, inside `impl TypedKind for K`, to the spec and sweep methods of a kind whose
/// `Problem` is `$problem` and whose GEMM, as the GEMM kind's erased problem, `$gemm(p)` gives.
macro_rules! over_gemm {
    ($problem:ty, $gemm:expr) => {
        /// The GEMM's alignment class and math: its kernels are that GEMM's.
        fn alignment(&self, p: &$problem) -> u32 {
            $gemm(p).alignment()
        }
        fn math(
            &self,
            p: &$problem,
            precision: $crate::types::Precision,
        ) -> Option<$crate::types::MathType> {
            $gemm(p).math(precision)
        }

        fn spec_name(&self, s: &$crate::kinds::gemm::KernelSpec) -> String {
            $crate::kinds::TypedKind::spec_name(&$crate::kinds::gemm::Gemm, s)
        }
        fn kernel_name(&self, s: &$crate::kinds::gemm::KernelSpec) -> String {
            $crate::kinds::TypedKind::kernel_name(&$crate::kinds::gemm::Gemm, s)
        }
        fn kernel(&self, s: &$crate::kinds::gemm::KernelSpec) -> $crate::kinds::gemm::KernelSpec {
            $crate::kinds::TypedKind::kernel(&$crate::kinds::gemm::Gemm, s)
        }
        fn spec_arch(&self, s: &$crate::kinds::gemm::KernelSpec) -> $crate::types::Arch {
            $crate::kinds::TypedKind::spec_arch(&$crate::kinds::gemm::Gemm, s)
        }
        fn spec_dtype(&self, s: &$crate::kinds::gemm::KernelSpec) -> $crate::types::DType {
            $crate::kinds::TypedKind::spec_dtype(&$crate::kinds::gemm::Gemm, s)
        }
        fn render(&self, s: &$crate::kinds::gemm::KernelSpec) -> $crate::codegen::Source {
            $crate::kinds::TypedKind::render(&$crate::kinds::gemm::Gemm, s)
        }
        fn unit(&self, s: &$crate::kinds::gemm::KernelSpec) -> $crate::kinds::Unit {
            $crate::kinds::TypedKind::unit(&$crate::kinds::gemm::Gemm, s)
        }
        fn dispatch(&self, s: &$crate::kinds::gemm::KernelSpec) -> $crate::kinds::Dispatch {
            $crate::kinds::TypedKind::dispatch(&$crate::kinds::gemm::Gemm, s)
        }
        fn spec_family(&self, s: &$crate::kinds::gemm::KernelSpec) -> String {
            $crate::kinds::TypedKind::spec_family(&$crate::kinds::gemm::Gemm, s)
        }
        fn features(
            &self,
            s: &$crate::kinds::gemm::KernelSpec,
            failure: $crate::space::validity::FailureKind,
        ) -> Option<std::collections::BTreeMap<String, serde_json::Value>> {
            $crate::kinds::TypedKind::features(&$crate::kinds::gemm::Gemm, s, failure)
        }

        /// The GEMM kind's sweep of the kind's GEMM: its first round, retry and rounds.
        fn candidates(
            &self,
            p: &$problem,
            cx: &mut $crate::kinds::SweepCx,
        ) -> Result<$crate::kinds::Candidates, String> {
            $crate::kinds::Kind::candidates(&$crate::kinds::gemm::Gemm, &$gemm(p), cx)
        }
        fn admits(
            &self,
            p: &$problem,
            s: &$crate::kinds::Spec,
            cx: &$crate::kinds::SweepCx,
        ) -> bool {
            $crate::kinds::Kind::admits(&$crate::kinds::gemm::Gemm, &$gemm(p), s, cx)
        }
        fn retry(
            &self,
            p: &$problem,
            cx: &mut $crate::kinds::SweepCx,
            failures: &[(String, String)],
            avoid: &std::collections::BTreeSet<String>,
        ) -> Option<Vec<$crate::kinds::Spec>> {
            $crate::kinds::Kind::retry(&$crate::kinds::gemm::Gemm, &$gemm(p), cx, failures, avoid)
        }
        fn rounds(&self) -> &'static [&'static str] {
            $crate::kinds::Kind::rounds(&$crate::kinds::gemm::Gemm)
        }
        fn round(
            &self,
            i: usize,
            p: &$problem,
            measured: &[$crate::kinds::Measured],
            cx: &$crate::kinds::SweepCx,
        ) -> Vec<$crate::kinds::Spec> {
            $crate::kinds::Kind::round(&$crate::kinds::gemm::Gemm, i, &$gemm(p), measured, cx)
        }
        fn learns(&self) -> bool {
            $crate::kinds::Kind::learns(&$crate::kinds::gemm::Gemm)
        }
    };
}

pub(crate) use over_gemm;
