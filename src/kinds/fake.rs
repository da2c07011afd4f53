//! A kind for the tests of the services below the kinds (the tuner's dealing, the library
//! build's checks) and of realization (compose's phases), which handle any kind's values through
//! the contract and so are tested without naming a real one. Its problem is a flop count, its
//! spec a kernel name and an arch; its sweep is `CANDIDATES` named kernels (`f<flops>_k<i>`, in
//! the order an estimate would rank them) and one later round (the two fastest again, `…_r`); it
//! has no rules, kernel source or bench, and those methods are never called.

use super::{Candidates, Dispatch, Kind, Measured, PlanFacts, Problem, Spec, SweepCx, Unit};
use crate::codegen::{OpCode, OpDef, Source};
use crate::graph::{Edit, Graph, NodeId};
use crate::nvcc::library::KernelLibrary;
use crate::rules::{Match, PatternKind, Rule};
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};
use serde::{Deserialize, Serialize};

/// What users would call its patterns.
pub const FAKE: PatternKind = PatternKind::new("fake");

/// The fake kind.
pub struct Fake;

/// A problem of `flops` floating-point operations.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FakeProblem {
    pub flops: u64,
}

/// A kernel called `name`, built for `arch`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FakeSpec {
    pub name: String,
    pub arch: Arch,
}

/// How many kernels a fake problem's first round has (fewer under `--candidates`).
pub const CANDIDATES: usize = 6;

/// The name of a fake problem's first-round kernel `i`.
pub fn kernel(flops: u64, i: usize) -> String {
    format!("f{flops}_k{i}")
}

/// A fake problem of `flops` operations, erased.
pub fn problem(flops: u64) -> Problem {
    Problem::new(&Fake, FakeProblem { flops })
}

/// A fake kernel for `arch`, erased.
pub fn spec(name: &str, arch: Arch) -> Spec {
    Spec::new(
        &Fake,
        FakeSpec {
            name: name.into(),
            arch,
        },
    )
}

fn fake_problem(p: &Problem) -> &FakeProblem {
    super::own("problem", p.get())
}

fn fake_spec(s: &Spec) -> &FakeSpec {
    super::own("spec", s.get())
}

impl Kind for Fake {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        &[FAKE]
    }
    fn letter(&self) -> char {
        'f'
    }
    fn rules(&self) -> &'static [&'static dyn Rule] {
        &[]
    }
    fn problem_of(&self, _m: &dyn Match) -> Problem {
        unreachable!("the fake kind has no rules")
    }
    fn node_of(&self, _m: &dyn Match) -> NodeId {
        unreachable!("the fake kind has no rules")
    }
    fn origin_of(&self, _m: &dyn Match) -> &'static str {
        unreachable!("the fake kind has no rules")
    }
    fn plan_facts(&self, _m: &dyn Match, _math: Option<MathType>, _arch: Arch) -> PlanFacts {
        unreachable!("the fake kind has no rules")
    }
    fn edit(&self, _g: &Graph, _m: &dyn Match, _kernel: &str) -> Edit {
        unreachable!("the fake kind has no rules")
    }
    fn problem_from_json(&self, v: serde_json::Value) -> Result<Problem, serde_json::Error> {
        serde_json::from_value::<FakeProblem>(v).map(|p| Problem::new(&Fake, p))
    }
    fn problem_from_rule(
        &self,
        _rule: &str,
        _dims: &[i64],
        _dtype: DType,
    ) -> Option<Result<Problem, String>> {
        None
    }
    fn rule_ids(&self) -> &'static str {
        "fake"
    }
    fn rule_id(&self, _p: &Problem) -> String {
        "fake".into()
    }
    fn shape_key(&self, p: &Problem) -> String {
        fake_problem(p).flops.to_string()
    }
    fn flops(&self, p: &Problem) -> f64 {
        fake_problem(p).flops as f64
    }
    fn dtype(&self, _p: &Problem) -> DType {
        DType::F32
    }
    fn alignment(&self, _p: &Problem) -> u32 {
        1
    }
    fn math(&self, _p: &Problem, _precision: Precision) -> Option<MathType> {
        Some(MathType::F32)
    }
    fn pattern_kind(&self, _p: &Problem) -> PatternKind {
        FAKE
    }
    fn spec_from_json(&self, v: serde_json::Value) -> Result<Spec, serde_json::Error> {
        serde_json::from_value::<FakeSpec>(v).map(|s| Spec::new(&Fake, s))
    }
    fn spec_name(&self, s: &Spec) -> String {
        fake_spec(s).name.clone()
    }
    fn kernel_name(&self, s: &Spec) -> String {
        fake_spec(s).name.clone()
    }
    fn kernel(&self, s: &Spec) -> Spec {
        s.clone()
    }
    fn spec_arch(&self, s: &Spec) -> Arch {
        fake_spec(s).arch
    }
    fn spec_dtype(&self, _s: &Spec) -> DType {
        DType::F32
    }
    fn render(&self, _s: &Spec) -> Source {
        unreachable!("the fake kind has no kernels")
    }
    fn unit(&self, _s: &Spec) -> Unit {
        Unit::plain("fake")
    }
    fn dispatch(&self, _s: &Spec) -> Dispatch {
        unreachable!("the fake kind has no kernels")
    }
    fn candidates(&self, p: &Problem, cx: &mut SweepCx) -> Result<Candidates, String> {
        let flops = fake_problem(p).flops;
        let n = cx.max_candidates.unwrap_or(CANDIDATES).min(CANDIDATES);
        let specs: Vec<Spec> = (0..CANDIDATES)
            .map(|i| kernel(flops, i))
            .filter(|k| !cx.failed.contains(k))
            .take(n)
            .map(|k| spec(&k, cx.arch))
            .collect();
        Ok(Candidates::Kernels { specs, space: None })
    }
    fn rounds(&self) -> &'static [&'static str] {
        &["_again"]
    }
    fn round(&self, _i: usize, _p: &Problem, measured: &[Measured], cx: &SweepCx) -> Vec<Spec> {
        let mut timed: Vec<(f64, String)> = measured
            .iter()
            .filter_map(|m| Some((m.ms?, m.spec.name())))
            .filter(|(_, k)| !k.ends_with("_r"))
            .collect();
        timed.sort_by(|a, b| a.0.total_cmp(&b.0));
        timed
            .into_iter()
            .take(cx.refine.min(2))
            .map(|(_, k)| spec(&format!("{k}_r"), cx.arch))
            .collect()
    }
    fn bench<'l>(
        &self,
        _lib: &'l KernelLibrary,
        _p: &Problem,
        _protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        Err("the fake kind has no bench".into())
    }
    fn ops(&self) -> &'static [OpDef] {
        &[]
    }
    fn op_code(&self, _arch: Arch) -> OpCode {
        unreachable!("the fake kind has no ops")
    }
}
