//! Pattern kinds. A kind is one folder here (`gemm/` with its epilogues, `attention/`,
//! `layernorm/`) holding everything it is: its rules and match types, its problem (what the
//! pattern table keys on), its kernel spec with its name and candidate space, its bench (inputs,
//! fp64 reference, torch's baseline), the rendering of its kernel templates and of its section of
//! the torch op library (the op and its fallback), and its graph edit. `Kind` is what a kind
//! provides; `registry.rs` lists the kinds, and is the only place that names them all. The stages
//! that handle every kind (the plan, realize, the tune worker, the library build, compose's edit,
//! bench's ablations) iterate over the registry or ask a problem, spec or pattern for its kind.
//!
//! This module is the contract and sits below the kinds: it names none of them. A kind's values
//! travel through the stages erased, as `Problem` and `Spec` (`erased.rs`): each knows its kind,
//! compares, hashes and serializes as the kind's own type, and is read back (untagged, as before
//! kinds were folders) by trying each kind of the registry in turn.

pub mod attention;
pub mod conv;
pub mod erased;
#[cfg(test)]
pub mod fake;
pub mod gemm;
pub mod glu;
pub mod grn;
pub mod layernorm;
pub mod patch;
pub mod registry;
pub mod rmsnorm;
pub mod rotary;
pub mod rows;
pub mod siblings;
pub mod typed;

pub use typed::TypedKind;

use crate::agent::Steward;
use crate::codegen::{DispatchEntry, OpCode, OpDef, Source};
use crate::graph::{Edit, Graph, NodeId, ValueId};
use crate::nvcc::library::KernelLibrary;
use crate::rules::{candidates, cover, Match, PatternKind, Rule};
use crate::space::validity::{FailureKind, Scope};
use crate::space::SpaceOptions;
use crate::tune::{Bench, Protocol};
use crate::types::{Arch, DType, MathType, Precision};
use erased::Value;
use serde::{Serialize, Serializer};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Debug};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// What a pattern kind provides, in the order a pattern goes through fact: its rules and what
/// the plan and compose need of a match, its problem (the table key), its kernels (spec, build,
/// dispatch entry), its sweep and bench, and its section of the op library. A kind's values come
/// in erased (`&dyn Match`, `&Problem`, `&Spec`) and are always its own: a kind implements
/// `TypedKind` on its own types, whose adapter downcasts them (a value of another kind is a broken
/// invariant).
pub trait Kind: Sync + 'static {
    // What the kind is called.

    /// Its name: its folder under src/kinds.
    fn name(&self) -> &'static str;
    /// What users call its patterns and turn off by name (`FACT_DISABLE`, `fact bench
    /// --without`), in the op library's order; every pattern of the kind is one of them
    /// (`pattern_kind`).
    fn pattern_kinds(&self) -> &'static [PatternKind];
    /// The letter of its patterns' plan ids: `p0`, `a1`, `l0`.
    fn letter(&self) -> char;

    // Its rules, and its matches as the plan and compose see them.

    /// Its rules (`rules::Rule`): each match any of them finds takes part in the cover.
    fn rules(&self) -> &'static [&'static dyn Rule];
    /// The problem a match of its rules solves.
    fn problem_of(&self, m: &dyn Match) -> Problem;
    /// The node that names the pattern (the GEMM, the LayerNorm, attention's output).
    fn node_of(&self, m: &dyn Match) -> NodeId;
    /// The graph op the pattern stands for, as compose's report names it.
    fn origin_of(&self, m: &dyn Match) -> &'static str;
    /// Operands the op copies on every call (their strides fit no layout of the kernel).
    fn copies_of(&self, _m: &dyn Match) -> Vec<String> {
        vec![]
    }
    /// What the plan shows of the pattern: its name, origin, operands and implementation notes
    /// (`math`: the problem's under the plan's precision, None where no kernel computes it).
    fn plan_facts(&self, m: &dyn Match, math: Option<MathType>, arch: Arch) -> PlanFacts;
    /// The matrix products the pattern computes, as the plan's cost model prices them (tensor-core
    /// rate, tile efficiency); none for a kind that computes none.
    fn products(&self, _m: &dyn Match) -> Vec<Product> {
        vec![]
    }
    /// What the pattern's kernel computes and moves, for the plan's cost model to price against
    /// the nodes it replaces where no table holds a measurement (the plan's expected speedup),
    /// under `math`; None where the plan assumes one, or no kernel computes it.
    fn work(&self, _m: &dyn Match, _math: MathType) -> Option<Work> {
        None
    }
    /// The graph rewrite: its op (`ops`) called with `kernel` in place of the pattern's nodes.
    fn edit(&self, g: &Graph, m: &dyn Match, kernel: &str) -> Edit;
    /// The rewrites of the kind's patterns that get a kernel (`found`: each match with its
    /// kernel), made together: a kind whose edit depends on which of its other patterns are
    /// substituted overrides it (a convolution's output layout); by default each one's `edit`.
    fn edits(&self, g: &Graph, found: &[(&dyn Match, &str)]) -> Vec<Edit> {
        found.iter().map(|(m, k)| self.edit(g, *m, k)).collect()
    }
    /// The smaller pattern compose realizes when this one's problem gets no kernel (a GEMM
    /// whose fused epilogue none computes: the GEMM alone), if there is one.
    fn unfused(&self, _m: &dyn Match) -> Option<Unfused> {
        None
    }
    /// Nodes of the kind's ops its rules left alone, each with the reason a user can act on
    /// (the plan's `unmatched_gemms`); `matched` are every pattern's nodes.
    fn unmatched(&self, _g: &Graph, _matched: &BTreeSet<NodeId>) -> Vec<(NodeId, String)> {
        vec![]
    }

    // Its problem: what the pattern table keys on (with math and arch).

    /// A problem of the kind from its serde form; an error where the JSON is another kind's.
    fn problem_from_json(&self, v: serde_json::Value) -> Result<Problem, serde_json::Error>;
    /// The problem one of its rule ids names at a shape (`fact realize`); None for another
    /// kind's rule id.
    fn problem_from_rule(
        &self,
        rule: &str,
        dims: &[i64],
        dtype: DType,
    ) -> Option<Result<Problem, String>>;
    /// Its rule ids, for the message about one that no kind knows.
    fn rule_ids(&self) -> &'static str;
    fn rule_id(&self, p: &Problem) -> String;
    /// The shape part of the table key (`MxNxK`, `BxHxTqxTkxD`, `ROWSxC`).
    fn shape_key(&self, p: &Problem) -> String;
    fn flops(&self, p: &Problem) -> f64;
    fn dtype(&self, p: &Problem) -> DType;
    /// The problem's alignment class: which kernels can run it. Table entries serve another
    /// shape of their bucket only within one class.
    fn alignment(&self, p: &Problem) -> u32;
    /// The math a kernel for the problem performs under `precision`; None where no kernel
    /// family computes the combination.
    fn math(&self, p: &Problem, precision: Precision) -> Option<MathType>;
    /// Which of the kind's pattern kinds the problem is.
    fn pattern_kind(&self, p: &Problem) -> PatternKind;

    // Its kernels: the spec, whose name is the kernel's identity.

    /// A spec of the kind from its serde form; an error where the JSON is another kind's.
    fn spec_from_json(&self, v: serde_json::Value) -> Result<Spec, serde_json::Error>;
    /// The variant's identity (dispatch-index name, table value).
    fn spec_name(&self, s: &Spec) -> String;
    /// The compiled kernel's identity (symbol, build-cache key).
    fn kernel_name(&self, s: &Spec) -> String;
    /// The compiled kernel's spec: this one without launch knobs.
    fn kernel(&self, s: &Spec) -> Spec;
    fn spec_arch(&self, s: &Spec) -> Arch;
    /// The element type of the kernel's tensors.
    fn spec_dtype(&self, s: &Spec) -> DType;
    /// The kernel's translation unit, exporting `fact_k_<name>_{can_implement,workspace_size,run}`
    /// over the kernel ABI (include/fact_kernels.h).
    fn render(&self, s: &Spec) -> Source;
    /// How the kernel compiles: the units it may share (never with another family) and what
    /// its units add to the common nvcc command.
    fn unit(&self, s: &Spec) -> Unit;
    /// The kernel's dispatch-table entry beside its name and spec: its kind, signature, layout,
    /// epilogue and launch knobs.
    fn dispatch(&self, s: &Spec) -> Dispatch;
    /// Why `specs` (all of this kind) cannot share one library, if they cannot.
    fn check_library(&self, _specs: &[&Spec]) -> Result<(), String> {
        Ok(())
    }
    /// The family a kernel competes in when a table is compacted (`fact table compact` keeps
    /// the best few of each per run): its unit's family, unless the kind knows a finer one.
    fn spec_family(&self, s: &Spec) -> String {
        self.unit(s).family
    }
    /// The kernel parameters a learned validity rule may name (`space::validity`), for a
    /// failure of `failure`; None for a kind whose failures stay in their runs.
    fn features(
        &self,
        _s: &Spec,
        _failure: FailureKind,
    ) -> Option<BTreeMap<String, serde_json::Value>> {
        None
    }

    // Its sweep and its bench.

    /// The kernels a sweep of `p` compiles first, or why there are none; an error where the
    /// sweep cannot go on at all.
    fn candidates(&self, p: &Problem, cx: &mut SweepCx) -> Result<Candidates, String>;
    /// The kind's kernels for `p` under `math` on `arch`, best first, from its own space alone (no
    /// agent, no budget), for a table hit to find the kernel families (`spec_family`) its entry
    /// never tried: one added to the kind after the entry was measured. Empty (the default) for a
    /// kind that does not look.
    fn space_now(&self, _p: &Problem, _math: MathType, _arch: Arch) -> Vec<Spec> {
        vec![]
    }
    /// The rows `p`'s kernel runs over (a GEMM's M, x's rows of a gated MLP), where they are
    /// the model's batch and sequence (None: the kind's problems have no such dim, or a batched
    /// GEMM's rows are not the only dim they drive). Compose realizes such a problem again at
    /// few rows (`at_rows`), for the calls a server sends at small batches and lengths.
    fn rows(&self, _p: &Problem) -> Option<i64> {
        None
    }
    /// `p` at `rows` rows, all else the same; None where `rows` is None.
    fn at_rows(&self, _p: &Problem, _rows: i64) -> Option<Problem> {
        None
    }
    /// The waves kernel `s` runs `p` in over its arch's SMs, where the kind counts them (the
    /// GEMM-like kinds: output tiles, times K splits, over the SMs, rounded up where they run in
    /// rounds, not where stream-K balances them). Compose weighs how a measured kernel's time
    /// moves with `p`'s rows by it (`compose::steady`).
    fn waves(&self, _p: &Problem, _s: &Spec) -> Option<f64> {
        None
    }
    /// Whether `s`, a kernel the tables saw win on another shape of `p`'s family (a quick sweep's
    /// nearby winner, `compose::realize::quick_cut`), runs `p` by the kind's own checks (validity,
    /// fit, the rules the tables learned, the kernels known to fail) though its first round does
    /// not hold it. False (the default) for a kind that does not check: only its first round's
    /// kernels are taken.
    fn admits(&self, _p: &Problem, _s: &Spec, _cx: &SweepCx) -> bool {
        false
    }
    /// After a first round in which no kernel passed: one more set (`failures`: each kernel
    /// with its outcome; `avoid`: every kernel tried or known to fail), or None.
    fn retry(
        &self,
        _p: &Problem,
        _cx: &mut SweepCx,
        _failures: &[(String, String)],
        _avoid: &BTreeSet<String>,
    ) -> Option<Vec<Spec>> {
        None
    }
    /// The rounds after the first, by the suffix of the folder each compiles in
    /// (`sweeps/<key>_siblings`); `round(i, ..)` gives round i's kernels.
    fn rounds(&self) -> &'static [&'static str] {
        &[]
    }
    /// Round i's kernels, from every kernel the sweep measured so far (each with its median
    /// time where it passed).
    fn round(&self, _i: usize, _p: &Problem, _measured: &[Measured], _cx: &SweepCx) -> Vec<Spec> {
        vec![]
    }
    /// Whether the failures of its sweeps become validity rules (`features`).
    fn learns(&self) -> bool {
        false
    }
    /// Its bench of the kernels of `lib` (all of this kind) on the GPU.
    fn bench<'l>(
        &self,
        lib: &'l KernelLibrary,
        p: &Problem,
        protocol: Protocol,
    ) -> Result<Box<dyn Bench + 'l>, String>;

    // Its section of the torch op library.

    /// Its ops: each one's name, schema (defined before a rewrite is saved) and C++ function.
    fn ops(&self) -> &'static [OpDef];
    /// Its section's code in a library for `arch` (the ops and their fallbacks).
    fn op_code(&self, arch: Arch) -> OpCode;
}

impl Debug for dyn Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Two kinds are one kind when they have one name.
fn same(a: &dyn Kind, b: &dyn Kind) -> bool {
    a.name() == b.name()
}

/// What the plan shows of a pattern beside its estimates (`Kind::plan_facts`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlanFacts {
    /// `linear 65536x3072x768 + mul → pow → …`, `attention causal 128x8x512x512x96`.
    pub name: String,
    /// The graph op it stands for, as the plan names it.
    pub origin: String,
    /// The operands whose shapes the plan shows.
    pub operands: Vec<ValueId>,
    /// Pipelining, grid schedule and instruction a kernel for it would use.
    pub notes: Vec<String>,
    /// The weight compose pads, and what that does.
    pub pad: Option<String>,
}

/// A matrix product of a pattern, as the plan's cost model prices it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Product {
    pub node: NodeId,
    pub flops: f64,
    /// The reduction length: a short K runs far below the roofline (the tiles' fill and epilogue).
    pub k: i64,
}

/// A pattern's kernel as the plan's cost model prices it (`Kind::work`): its matrix products
/// at their math's rate and tiles' efficiency, its DRAM bytes and its launches.
#[derive(Clone, Debug, PartialEq)]
pub struct Work {
    pub products: Vec<Product>,
    /// Bytes it reads and writes, any copies it makes included.
    pub bytes: f64,
    /// Kernels it launches, its own and each copy's.
    pub launches: usize,
    /// What the estimate counts, for the plan (`one kernel, x converted to channels-last`).
    pub note: String,
}

/// A pattern's smaller fallback (`Kind::unfused`) and how compose's notes say it.
pub struct Unfused {
    /// The smaller pattern's kind (another kind's where a kind is built over it: the gated MLP
    /// falls back to a GEMM with its epilogue).
    pub kind: &'static dyn Kind,
    pub found: Box<dyn Match>,
    /// What is left to torch (`the fused epilogue`).
    pub what: &'static str,
    /// What is realized instead (`the GEMM alone`).
    pub instead: &'static str,
}

/// How a kind's kernel compiles (`Kind::unit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Kernels of one family may share a translation unit; units never mix families.
    pub family: String,
    /// Folders of the CUTLASS tree its units add to the include path.
    pub cutlass_includes: Vec<&'static str>,
    /// Flags its units add to the nvcc command.
    pub flags: Vec<&'static str>,
}

impl Unit {
    /// A family with the common command.
    pub fn plain(family: impl Into<String>) -> Unit {
        Unit {
            family: family.into(),
            cutlass_includes: vec![],
            flags: vec![],
        }
    }
}

/// A kernel's dispatch-table entry as its kind gives it (`Kind::dispatch`).
#[derive(Clone, Debug, PartialEq)]
pub struct Dispatch {
    /// The kind the op checks (`FactKernelInfo::kind`): "gemm", "attention", "layernorm".
    pub kind: &'static str,
    /// What its tensors and scalars are, by position.
    pub signature: String,
    /// The operands' layout, where the kind has one.
    pub layout: String,
    /// The fused epilogue program's text, where there is one.
    pub epilogue: String,
    /// Launch knobs passed with every call: splits, raster, swizzle (zeros for none).
    pub knobs: [i64; 3],
}

/// What a kind's sweep is given to choose its kernels (`Kind::candidates`, `retry`, `round`).
pub struct SweepCx<'a> {
    pub arch: Arch,
    pub math: MathType,
    /// The installed CUTLASS's version.
    pub cutlass: &'a str,
    /// The validity rules both tables learned, and the scope of this sweep's key.
    pub rules: &'a [crate::space::validity::Rule],
    pub scope: &'a Scope,
    /// Kernels that failed to build or run on this arch and dtype in any run the tables hold.
    pub failed: &'a BTreeSet<String>,
    /// The derived space's budget and cuts (`--candidates` applied).
    pub space: &'a SpaceOptions,
    /// `--candidates`: at most this many kernels in the first round.
    pub max_candidates: Option<usize>,
    /// `--refine`: how many of the fastest kernels the later rounds refine.
    pub refine: usize,
    /// The agent (its notes are the run's).
    pub steward: &'a mut Steward,
}

/// A sweep's first round as its kind derives it (`Kind::candidates`).
pub enum Candidates {
    Kernels {
        specs: Vec<Spec>,
        /// What the kernels came from, for the sweep's record (sweep.json's `space`).
        space: Option<serde_json::Value>,
    },
    /// No kernel: why (the pattern is left to torch).
    None(String),
}

/// A kernel a sweep measured: its spec, and its median time where it passed.
pub struct Measured {
    pub spec: Spec,
    pub ms: Option<f64>,
}

/// Any kind's problem: what a table entry and a tuning request carry. It compares, hashes and
/// serializes as its kind's problem type; `get` gives that type back.
#[derive(Clone)]
pub struct Problem {
    kind: &'static dyn Kind,
    value: Arc<dyn Value>,
}

impl Problem {
    /// `value` as a problem of `kind` (kinds give `From` for their problem types).
    pub fn new<T: Value>(kind: &'static dyn Kind, value: T) -> Problem {
        Problem {
            kind,
            value: Arc::new(value),
        }
    }
    pub fn kind(&self) -> &'static dyn Kind {
        self.kind
    }
    /// The kind's own problem, when it is a `T`.
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.value.as_any().downcast_ref()
    }
    pub fn rule_id(&self) -> String {
        self.kind.rule_id(self)
    }
    pub fn shape_key(&self) -> String {
        self.kind.shape_key(self)
    }
    pub fn flops(&self) -> f64 {
        self.kind.flops(self)
    }
    pub fn dtype(&self) -> DType {
        self.kind.dtype(self)
    }
    /// See `Kind::alignment`.
    pub fn alignment(&self) -> u32 {
        self.kind.alignment(self)
    }
    /// See `Kind::math`.
    pub fn math(&self, precision: Precision) -> Option<MathType> {
        self.kind.math(self, precision)
    }
    pub fn pattern_kind(&self) -> PatternKind {
        self.kind.pattern_kind(self)
    }
}

impl PartialEq for Problem {
    fn eq(&self, o: &Problem) -> bool {
        same(self.kind, o.kind) && self.value.eq_value(o.value.as_any())
    }
}

impl Eq for Problem {}

impl Hash for Problem {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.kind.name().hash(h);
        self.value.hash_value(h);
    }
}

impl Debug for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl Serialize for Problem {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.capture().serialize(s)
    }
}

/// Any kind's kernel spec: a table entry's winner, a tuning candidate, a library's kernel. It
/// compares and serializes as its kind's spec type; `get` gives that type back.
#[derive(Clone)]
pub struct Spec {
    kind: &'static dyn Kind,
    value: Arc<dyn Value>,
}

impl Spec {
    /// `value` as a spec of `kind` (kinds give `From` for their spec types).
    pub fn new<T: Value>(kind: &'static dyn Kind, value: T) -> Spec {
        Spec {
            kind,
            value: Arc::new(value),
        }
    }
    pub fn kind(&self) -> &'static dyn Kind {
        self.kind
    }
    /// The kind's own spec, when it is a `T`.
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.value.as_any().downcast_ref()
    }
    /// The variant's identity (dispatch-index name, table value).
    pub fn name(&self) -> String {
        self.kind.spec_name(self)
    }
    /// The compiled kernel's identity (symbol, build-cache key).
    pub fn kernel_name(&self) -> String {
        self.kind.kernel_name(self)
    }
    /// The compiled kernel's spec: this one without launch knobs.
    pub fn kernel(&self) -> Spec {
        self.kind.kernel(self)
    }
    pub fn arch(&self) -> Arch {
        self.kind.spec_arch(self)
    }
    /// The element type of the kernel's tensors.
    pub fn dtype(&self) -> DType {
        self.kind.spec_dtype(self)
    }
    pub fn render(&self) -> Source {
        self.kind.render(self)
    }
    pub fn unit(&self) -> Unit {
        self.kind.unit(self)
    }
    pub fn dispatch(&self) -> Dispatch {
        self.kind.dispatch(self)
    }
    /// See `Kind::spec_family`.
    pub fn family(&self) -> String {
        self.kind.spec_family(self)
    }
    /// See `Kind::features`.
    pub fn features(&self, failure: FailureKind) -> Option<BTreeMap<String, serde_json::Value>> {
        self.kind.features(self, failure)
    }
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("spec serializes")
    }
    /// Its entry in a library's dispatch table.
    pub fn dispatch_entry(&self) -> DispatchEntry {
        let d = self.dispatch();
        DispatchEntry {
            name: self.name(),
            symbol: self.kernel_name(),
            kind: d.kind,
            signature: d.signature,
            spec_json: self.to_json(),
            dtype: self.dtype().short_name(),
            layout: d.layout,
            epilogue: d.epilogue,
            knobs: d.knobs,
        }
    }
}

/// The dispatch table over `specs` (any kinds'), in the given order (index = position).
pub fn render_dispatch(specs: &[Spec]) -> Source {
    let entries: Vec<DispatchEntry> = specs.iter().map(Spec::dispatch_entry).collect();
    crate::codegen::render_dispatch(&entries)
}

impl PartialEq for Spec {
    fn eq(&self, o: &Spec) -> bool {
        same(self.kind, o.kind) && self.value.eq_value(o.value.as_any())
    }
}

impl Eq for Spec {}

impl Hash for Spec {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.kind.name().hash(h);
        self.value.hash_value(h);
    }
}

impl Debug for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

impl Serialize for Spec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.value.capture().serialize(s)
    }
}

/// One pattern of a graph: a match one of its kind's rules found and the cover kept, with its
/// plan id (`p0`, `a1`, `l0`: the kind's letter and its index among the kind's patterns).
pub struct Found {
    pub id: String,
    pub kind: &'static dyn Kind,
    pub found: Box<dyn Match>,
}

impl Found {
    /// The match, when it is a `T`.
    pub fn get<T: Match>(&self) -> Option<&T> {
        let m: &dyn std::any::Any = &*self.found;
        m.downcast_ref()
    }
    pub fn problem(&self) -> Problem {
        self.kind.problem_of(&*self.found)
    }
    /// See `Kind::node_of`.
    pub fn node(&self) -> NodeId {
        self.kind.node_of(&*self.found)
    }
    pub fn nodes(&self) -> Vec<NodeId> {
        self.found.nodes()
    }
    pub fn origin(&self) -> &'static str {
        self.kind.origin_of(&*self.found)
    }
    pub fn copies(&self) -> Vec<String> {
        self.kind.copies_of(&*self.found)
    }
    pub fn edit(&self, g: &Graph, kernel: &str) -> Edit {
        self.kind.edit(g, &*self.found, kernel)
    }
}

impl Debug for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.id, self.found)
    }
}

/// Every pattern of a graph, no node in two: the kinds in the registry's order, each kind's
/// patterns in graph order.
#[derive(Debug, Default)]
pub struct Patterns {
    pub found: Vec<Found>,
}

impl Patterns {
    /// The patterns whose match is a `T`, in order: one kind's matches.
    pub fn of<T: Match>(&self) -> Vec<&T> {
        self.found.iter().filter_map(Found::get).collect()
    }
    /// The pattern a plan id names.
    pub fn get(&self, id: &str) -> Option<&Found> {
        self.found.iter().find(|f| f.id == id)
    }
    pub fn get_mut(&mut self, id: &str) -> Option<&mut Found> {
        self.found.iter_mut().find(|f| f.id == id)
    }
    /// The matrix products of every pattern (`Kind::products`).
    pub fn products(&self) -> Vec<Product> {
        self.found
            .iter()
            .flat_map(|f| f.kind.products(&*f.found))
            .collect()
    }
}

/// The cover of `g` by the patterns of `kinds`: every match their rules find takes part, no node
/// in two (`rules::cover`); the kinds in the order given, each kind's patterns in graph order with
/// its plan ids. The registry's `match_patterns` is this over its kinds; a kind's tests give the
/// kinds they need.
pub fn match_kinds(g: &Graph, kinds: &[&'static dyn Kind]) -> Patterns {
    let rules: Vec<&'static dyn Rule> = kinds
        .iter()
        .flat_map(|k| k.rules().iter().copied())
        .collect();
    let mut by_kind: Vec<Vec<Box<dyn Match>>> = kinds.iter().map(|_| vec![]).collect();
    for c in cover(candidates(g, &rules)) {
        let i = kinds
            .iter()
            .position(|k| k.pattern_kinds().contains(&c.kind))
            .unwrap_or_else(|| panic!("rule {}: no kind's patterns are called {}", c.rule, c.kind));
        by_kind[i].push(c.found);
    }
    let found = kinds
        .iter()
        .zip(by_kind)
        .flat_map(|(&kind, matches)| {
            matches
                .into_iter()
                .enumerate()
                .map(move |(i, found)| Found {
                    id: format!("{}{i}", kind.letter()),
                    kind,
                    found,
                })
        })
        .collect();
    Patterns { found }
}

/// The torch op library for `arch` with the sections of `kinds` (the registry's: every kind) in
/// the frame, their pattern kinds its switches.
pub fn render_op_library(kinds: &[&dyn Kind], arch: Arch) -> Source {
    let sections: Vec<_> = kinds.iter().map(|k| (k.ops(), k.op_code(arch))).collect();
    let switches: Vec<&str> = kinds
        .iter()
        .flat_map(|k| k.pattern_kinds().iter().map(|p| p.name()))
        .collect();
    crate::codegen::render_torch_op(arch, &sections, &switches)
}

/// A kind's value behind `&dyn Match`, `&Problem` or `&Spec`, as the kind's own type: a value of
/// another type is a broken invariant (the registry hands a kind only its own values).
pub fn own<'a, T: 'static>(what: &str, v: Option<&'a T>) -> &'a T {
    v.unwrap_or_else(|| {
        panic!(
            "a {what} of another kind reached {}",
            std::any::type_name::<T>()
        )
    })
}

/// `m` as the kind's match type `T`.
pub fn own_match<T: Match>(m: &dyn Match) -> &T {
    let any: &dyn std::any::Any = m;
    own("match", any.downcast_ref())
}
