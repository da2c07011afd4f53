//! `TypedKind`: the `Kind` contract over a kind's own types, and the one adapter that erases it.
//! A kind names its match, problem and spec types and implements its methods on them; the
//! adapter (`impl<K: TypedKind> Kind for K`) downcasts the erased values the stages hand it,
//! reads problems and specs back from JSON, and erases what the kind returns. So no kind repeats
//! the downcasts or the serde read-back, and a value of another kind stays a broken invariant
//! caught in one place (`own`). The methods mean what `Kind`'s of the same name mean.

use super::erased::Value;
use super::{
    own, own_match, Candidates, Dispatch, Kind, Measured, PlanFacts, Problem, Product, Spec,
    SweepCx, Unfused, Unit, Work,
};
use crate::codegen::{OpCode, OpDef, Source};
use crate::graph::{Edit, Graph, NodeId};
use crate::nvcc::library::KernelLibrary;
use crate::rules::{self, PatternKind, Rule};
use crate::space::validity::FailureKind;
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};

/// What a pattern kind provides, on its own types (see `Kind` for each method).
pub trait TypedKind: Sync + 'static {
    /// What its rules find.
    type Match: rules::Match;
    /// What its table keys on; `Into<Problem>` erases it as this kind's.
    type Problem: Value + Clone + DeserializeOwned + Into<Problem>;
    /// Its kernel spec; `Into<Spec>` erases it as this kind's.
    type Spec: Value + Clone + DeserializeOwned + Into<Spec>;

    fn name(&self) -> &'static str;
    fn pattern_kinds(&self) -> &'static [PatternKind];
    fn letter(&self) -> char;

    fn rules(&self) -> &'static [&'static dyn Rule];
    fn problem_of(&self, m: &Self::Match) -> Self::Problem;
    fn node_of(&self, m: &Self::Match) -> NodeId;
    fn origin_of(&self, m: &Self::Match) -> &'static str;
    fn copies_of(&self, _m: &Self::Match) -> Vec<String> {
        vec![]
    }
    fn plan_facts(&self, m: &Self::Match, math: Option<MathType>, arch: Arch) -> PlanFacts;
    fn products(&self, _m: &Self::Match) -> Vec<Product> {
        vec![]
    }
    fn work(&self, _m: &Self::Match, _math: MathType) -> Option<Work> {
        None
    }
    fn edit(&self, g: &Graph, m: &Self::Match, kernel: &str) -> Edit;
    fn edits(&self, g: &Graph, found: &[(&Self::Match, &str)]) -> Vec<Edit> {
        found.iter().map(|(m, k)| self.edit(g, m, k)).collect()
    }
    fn unfused(&self, _m: &Self::Match) -> Option<Unfused> {
        None
    }
    fn unmatched(&self, _g: &Graph, _matched: &BTreeSet<NodeId>) -> Vec<(NodeId, String)> {
        vec![]
    }

    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<Self::Problem, String>>;
    fn rule_ids(&self) -> &'static str;
    fn rule_id(&self, p: &Self::Problem) -> String;
    fn shape_key(&self, p: &Self::Problem) -> String;
    fn flops(&self, p: &Self::Problem) -> f64;
    fn dtype(&self, p: &Self::Problem) -> DType;
    fn alignment(&self, p: &Self::Problem) -> u32;
    fn math(&self, p: &Self::Problem, precision: Precision) -> Option<MathType>;
    fn pattern_kind(&self, p: &Self::Problem) -> PatternKind;

    fn spec_name(&self, s: &Self::Spec) -> String;
    /// The variant's name, where a spec has no launch knobs (it is its own kernel).
    fn kernel_name(&self, s: &Self::Spec) -> String {
        self.spec_name(s)
    }
    /// The spec itself, where it has no launch knobs.
    fn kernel(&self, s: &Self::Spec) -> Self::Spec {
        s.clone()
    }
    fn spec_arch(&self, s: &Self::Spec) -> Arch;
    fn spec_dtype(&self, s: &Self::Spec) -> DType;
    fn render(&self, s: &Self::Spec) -> Source;
    fn unit(&self, s: &Self::Spec) -> Unit;
    fn dispatch(&self, s: &Self::Spec) -> Dispatch;
    fn check_library(&self, _specs: &[&Self::Spec]) -> Result<(), String> {
        Ok(())
    }
    fn spec_family(&self, s: &Self::Spec) -> String {
        self.unit(s).family
    }
    fn features(
        &self,
        _s: &Self::Spec,
        _failure: FailureKind,
    ) -> Option<BTreeMap<String, serde_json::Value>> {
        None
    }

    fn candidates(&self, p: &Self::Problem, cx: &mut SweepCx) -> Result<Candidates, String>;
    fn space_now(&self, _p: &Self::Problem, _math: MathType, _arch: Arch) -> Vec<Spec> {
        vec![]
    }
    fn admits(&self, _p: &Self::Problem, _s: &Spec, _cx: &SweepCx) -> bool {
        false
    }
    fn rows(&self, _p: &Self::Problem) -> Option<i64> {
        None
    }
    fn at_rows(&self, _p: &Self::Problem, _rows: i64) -> Option<Self::Problem> {
        None
    }
    fn waves(&self, _p: &Self::Problem, _s: &Spec) -> Option<f64> {
        None
    }
    fn retry(
        &self,
        _p: &Self::Problem,
        _cx: &mut SweepCx,
        _failures: &[(String, String)],
        _avoid: &BTreeSet<String>,
    ) -> Option<Vec<Spec>> {
        None
    }
    fn rounds(&self) -> &'static [&'static str] {
        &[]
    }
    /// `measured` stays erased: its specs are this kind's (`spec_of` reads one).
    fn round(
        &self,
        _i: usize,
        _p: &Self::Problem,
        _measured: &[Measured],
        _cx: &SweepCx,
    ) -> Vec<Spec> {
        vec![]
    }
    fn learns(&self) -> bool {
        false
    }
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &Self::Problem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String>;

    fn ops(&self) -> &'static [OpDef];
    fn op_code(&self, arch: Arch) -> OpCode;
}

/// `p` as kind `K`'s problem.
pub fn problem_of<K: TypedKind>(p: &Problem) -> &K::Problem {
    own("problem", p.get())
}

/// `s` as kind `K`'s spec.
pub fn spec_of<K: TypedKind>(s: &Spec) -> &K::Spec {
    own("spec", s.get())
}

impl<K: TypedKind> Kind for K {
    fn name(&self) -> &'static str {
        TypedKind::name(self)
    }
    fn pattern_kinds(&self) -> &'static [PatternKind] {
        TypedKind::pattern_kinds(self)
    }
    fn letter(&self) -> char {
        TypedKind::letter(self)
    }

    fn rules(&self) -> &'static [&'static dyn Rule] {
        TypedKind::rules(self)
    }
    fn problem_of(&self, m: &dyn rules::Match) -> Problem {
        TypedKind::problem_of(self, own_match(m)).into()
    }
    fn node_of(&self, m: &dyn rules::Match) -> NodeId {
        TypedKind::node_of(self, own_match(m))
    }
    fn origin_of(&self, m: &dyn rules::Match) -> &'static str {
        TypedKind::origin_of(self, own_match(m))
    }
    fn copies_of(&self, m: &dyn rules::Match) -> Vec<String> {
        TypedKind::copies_of(self, own_match(m))
    }
    fn plan_facts(&self, m: &dyn rules::Match, math: Option<MathType>, arch: Arch) -> PlanFacts {
        TypedKind::plan_facts(self, own_match(m), math, arch)
    }
    fn products(&self, m: &dyn rules::Match) -> Vec<Product> {
        TypedKind::products(self, own_match(m))
    }
    fn work(&self, m: &dyn rules::Match, math: MathType) -> Option<Work> {
        TypedKind::work(self, own_match(m), math)
    }
    fn edit(&self, g: &Graph, m: &dyn rules::Match, kernel: &str) -> Edit {
        TypedKind::edit(self, g, own_match(m), kernel)
    }
    fn edits(&self, g: &Graph, found: &[(&dyn rules::Match, &str)]) -> Vec<Edit> {
        let found: Vec<(&K::Match, &str)> = found.iter().map(|&(m, k)| (own_match(m), k)).collect();
        TypedKind::edits(self, g, &found)
    }
    fn unfused(&self, m: &dyn rules::Match) -> Option<Unfused> {
        TypedKind::unfused(self, own_match(m))
    }
    fn unmatched(&self, g: &Graph, matched: &BTreeSet<NodeId>) -> Vec<(NodeId, String)> {
        TypedKind::unmatched(self, g, matched)
    }

    fn problem_from_json(&self, v: serde_json::Value) -> Result<Problem, serde_json::Error> {
        serde_json::from_value::<K::Problem>(v).map(Into::into)
    }
    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<Problem, String>> {
        TypedKind::problem_from_rule(self, rule, dims, dtype).map(|r| r.map(Into::into))
    }
    fn rule_ids(&self) -> &'static str {
        TypedKind::rule_ids(self)
    }
    fn rule_id(&self, p: &Problem) -> String {
        TypedKind::rule_id(self, problem_of::<K>(p))
    }
    fn shape_key(&self, p: &Problem) -> String {
        TypedKind::shape_key(self, problem_of::<K>(p))
    }
    fn flops(&self, p: &Problem) -> f64 {
        TypedKind::flops(self, problem_of::<K>(p))
    }
    fn dtype(&self, p: &Problem) -> DType {
        TypedKind::dtype(self, problem_of::<K>(p))
    }
    fn alignment(&self, p: &Problem) -> u32 {
        TypedKind::alignment(self, problem_of::<K>(p))
    }
    fn math(&self, p: &Problem, precision: Precision) -> Option<MathType> {
        TypedKind::math(self, problem_of::<K>(p), precision)
    }
    fn pattern_kind(&self, p: &Problem) -> PatternKind {
        TypedKind::pattern_kind(self, problem_of::<K>(p))
    }

    fn spec_from_json(&self, v: serde_json::Value) -> Result<Spec, serde_json::Error> {
        serde_json::from_value::<K::Spec>(v).map(Into::into)
    }
    fn spec_name(&self, s: &Spec) -> String {
        TypedKind::spec_name(self, spec_of::<K>(s))
    }
    fn kernel_name(&self, s: &Spec) -> String {
        TypedKind::kernel_name(self, spec_of::<K>(s))
    }
    fn kernel(&self, s: &Spec) -> Spec {
        TypedKind::kernel(self, spec_of::<K>(s)).into()
    }
    fn spec_arch(&self, s: &Spec) -> Arch {
        TypedKind::spec_arch(self, spec_of::<K>(s))
    }
    fn spec_dtype(&self, s: &Spec) -> DType {
        TypedKind::spec_dtype(self, spec_of::<K>(s))
    }
    fn render(&self, s: &Spec) -> Source {
        TypedKind::render(self, spec_of::<K>(s))
    }
    fn unit(&self, s: &Spec) -> Unit {
        TypedKind::unit(self, spec_of::<K>(s))
    }
    fn dispatch(&self, s: &Spec) -> Dispatch {
        TypedKind::dispatch(self, spec_of::<K>(s))
    }
    fn check_library(&self, specs: &[&Spec]) -> Result<(), String> {
        let specs: Vec<&K::Spec> = specs.iter().map(|s| spec_of::<K>(s)).collect();
        TypedKind::check_library(self, &specs)
    }
    fn spec_family(&self, s: &Spec) -> String {
        TypedKind::spec_family(self, spec_of::<K>(s))
    }
    fn features(
        &self,
        s: &Spec,
        failure: FailureKind,
    ) -> Option<BTreeMap<String, serde_json::Value>> {
        TypedKind::features(self, spec_of::<K>(s), failure)
    }

    fn candidates(&self, p: &Problem, cx: &mut SweepCx) -> Result<Candidates, String> {
        TypedKind::candidates(self, problem_of::<K>(p), cx)
    }
    fn space_now(&self, p: &Problem, math: MathType, arch: Arch) -> Vec<Spec> {
        TypedKind::space_now(self, problem_of::<K>(p), math, arch)
    }
    fn admits(&self, p: &Problem, s: &Spec, cx: &SweepCx) -> bool {
        TypedKind::admits(self, problem_of::<K>(p), s, cx)
    }
    fn rows(&self, p: &Problem) -> Option<i64> {
        TypedKind::rows(self, problem_of::<K>(p))
    }
    fn at_rows(&self, p: &Problem, rows: i64) -> Option<Problem> {
        TypedKind::at_rows(self, problem_of::<K>(p), rows).map(Into::into)
    }
    fn waves(&self, p: &Problem, s: &Spec) -> Option<f64> {
        TypedKind::waves(self, problem_of::<K>(p), s)
    }
    fn retry(
        &self,
        p: &Problem,
        cx: &mut SweepCx,
        failures: &[(String, String)],
        avoid: &BTreeSet<String>,
    ) -> Option<Vec<Spec>> {
        TypedKind::retry(self, problem_of::<K>(p), cx, failures, avoid)
    }
    fn rounds(&self) -> &'static [&'static str] {
        TypedKind::rounds(self)
    }
    fn round(&self, i: usize, p: &Problem, measured: &[Measured], cx: &SweepCx) -> Vec<Spec> {
        TypedKind::round(self, i, problem_of::<K>(p), measured, cx)
    }
    fn learns(&self) -> bool {
        TypedKind::learns(self)
    }
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &Problem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String> {
        TypedKind::bench(self, lib, problem_of::<K>(p), protocol)
    }

    fn ops(&self) -> &'static [OpDef] {
        TypedKind::ops(self)
    }
    fn op_code(&self, arch: Arch) -> OpCode {
        TypedKind::op_code(self, arch)
    }
}
