//! Bench: the original and the composed module, timed in the same run under the same precision
//! policy, their outputs checked against an fp64 run of the original. Same protocol as the tuner:
//! warm-up, L2 flushed before each forward, CUDA events, median and spread.

pub mod plot;

use crate::rules::PatternKind;
use crate::torch::{self, InputShape};
use crate::tune::cuda::{Cuda, DeviceInfo};
use crate::tune::gpu::{relative_error, sample};
use crate::tune::{Protocol, Timing};
use crate::types::Precision;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tch::{CModule, Device, IValue, Kind, Tensor};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    pub workload: String,
    pub device: DeviceInfo,
    pub torch: String,
    pub cuda: String,
    pub cutlass: String,
    pub precision: Precision,
    pub inputs: Vec<InputShape>,
    pub baseline_ms: f64,
    pub fact_ms: f64,
    pub speedup: f64,
    /// Composed output against the fp64 original.
    pub max_rel_err: f64,
    /// The original (same precision policy) against the fp64 original, for scale.
    pub baseline_rel_err: f64,
    /// Composed against original, both under the policy: 0 means bit-identical outputs.
    pub composed_vs_baseline: f64,
    pub baseline: Timing,
    pub fact: Timing,
    /// FLOPs of the substituted GEMMs, and their rate over the whole composed forward.
    pub gemm_flops: f64,
    pub fact_tflops: f64,
    pub baseline_tflops: f64,
    pub date: String,
    pub command: String,
    /// Calls of each substituted kernel during the composed runs: ran it, or fell back.
    #[serde(default)]
    pub op_calls: std::collections::BTreeMap<String, torch::OpCalls>,
    /// The composed module with one pattern kind turned off at a time, same inputs, same run.
    #[serde(default)]
    pub ablations: Vec<Ablation>,
    /// Each substituted pattern's kernel and torch times as tuned (from the compose report).
    #[serde(default)]
    pub patterns: Vec<PatternTime>,
}

/// The composed module timed with the calls of one pattern kind running the original ops.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Ablation {
    pub without: PatternKind,
    pub ms: f64,
    pub timing: Timing,
    /// Against the fp64 original, on the first verification input.
    pub max_rel_err: f64,
    /// How much of the composed module's gain over the original this kind holds: its time
    /// without the kind over its time with it.
    pub slowdown: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PatternTime {
    pub id: String,
    pub kind: PatternKind,
    pub rule: String,
    pub kernel: String,
    pub kernel_ms: Option<f64>,
    pub torch_ms: Option<f64>,
}

pub struct BenchOptions {
    pub workload: String,
    pub original: PathBuf,
    pub composed: PathBuf,
    pub library: PathBuf,
    pub inputs: Vec<InputShape>,
    pub precision: Precision,
    pub protocol: Protocol,
    pub gemm_flops: f64,
    pub cutlass: String,
    pub cuda: String,
    pub command: String,
    /// Pattern kinds to turn off one at a time after the composed module is timed.
    pub without: Vec<PatternKind>,
    /// The substituted patterns: each one's kernel must run, or the bench fails.
    pub patterns: Vec<PatternTime>,
}

fn kind_of(dtype: &str) -> Kind {
    match dtype {
        "f64" => Kind::Double,
        "bf16" => Kind::BFloat16,
        "f16" => Kind::Half,
        "i64" => Kind::Int64,
        "i32" => Kind::Int,
        "bool" => Kind::Bool,
        _ => Kind::Float,
    }
}

/// Fresh random inputs: normal floats, small non-negative integers (indices), random booleans.
pub fn random_inputs(shapes: &[InputShape], device: Device) -> Vec<Tensor> {
    shapes
        .iter()
        .map(|s| match kind_of(&s.dtype) {
            k @ (Kind::Int64 | Kind::Int) => Tensor::randint(2, s.shape.as_slice(), (k, device)),
            Kind::Bool => {
                Tensor::randint(2, s.shape.as_slice(), (Kind::Int64, device)).to_kind(Kind::Bool)
            }
            k => Tensor::randn(s.shape.as_slice(), (Kind::Float, device)).to_kind(k),
        })
        .collect()
}

/// Runs `forward` and returns every tensor of its output (a tensor, or tuples and lists of them).
fn forward(m: &CModule, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
    let args: Vec<IValue> = inputs
        .iter()
        .map(|t| IValue::Tensor(t.shallow_clone()))
        .collect();
    let out = m.forward_is(&args).map_err(|e| e.to_string())?;
    fn collect(v: IValue, into: &mut Vec<Tensor>) {
        match v {
            IValue::Tensor(t) => into.push(t),
            IValue::Tuple(vs) | IValue::GenericList(vs) => {
                vs.into_iter().for_each(|v| collect(v, into))
            }
            IValue::TensorList(ts) => into.extend(ts),
            _ => {}
        }
    }
    let mut tensors = Vec::new();
    collect(out, &mut tensors);
    if tensors.is_empty() {
        return Err("forward returned no tensor".into());
    }
    Ok(tensors)
}

/// The worst relative error over corresponding outputs.
fn worst_error(outs: &[Tensor], refs: &[Tensor]) -> f64 {
    if outs.len() != refs.len() {
        return f64::NAN;
    }
    outs.iter()
        .zip(refs)
        .map(|(o, r)| relative_error(o, &r.to_kind(Kind::Double)))
        .fold(0.0, nan_max)
}

/// max that keeps NaN (f64::max drops it): a NaN anywhere must fail the comparison.
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn time_forward(
    m: &CModule,
    inputs: &[Tensor],
    protocol: &Protocol,
    cuda: &Cuda,
) -> Result<Timing, String> {
    let flush = protocol.flush_buffer(Device::Cuda(0));
    let samples = sample(
        cuda,
        &flush,
        protocol,
        &mut || forward(m, inputs).map(|_| ()),
        |e| e,
    )?;
    Timing::from_samples(samples).ok_or_else(|| "no valid timings".to_string())
}

pub fn bench(opts: &BenchOptions) -> Result<BenchReport, String> {
    if !torch::cuda_available() {
        return Err("no CUDA device: bench needs a GPU".into());
    }
    let cuda = Cuda::get()?;
    torch::load_op_library(&opts.library).map_err(|e| e.to_string())?;
    torch::set_float32_matmul_precision(opts.precision.torch_matmul_precision())
        .map_err(|e| e.to_string())?;
    let device = Device::Cuda(0);
    let load = |p: &Path| -> Result<CModule, String> {
        let mut m =
            CModule::load_on_device(p, device).map_err(|e| format!("{}: {e}", p.display()))?;
        m.set_eval();
        Ok(m)
    };
    let original = load(&opts.original)?;
    let composed = load(&opts.composed)?;
    // The fp64 reference module lives next to the composed one while the bench runs.
    let fp64 = opts
        .composed
        .with_file_name(format!("reference_fp64_{}.pt", std::process::id()));
    torch::save_fp64_copy(&opts.original, &fp64).map_err(|e| e.to_string())?;
    let reference = load(&fp64);
    let _ = std::fs::remove_file(&fp64);
    let reference = reference?;
    torch::op_stats(&opts.library, true).map_err(|e| e.to_string())?;

    tch::no_grad(|| {
        // Verify first, on fresh inputs each time; keep the worst error. The first input and its
        // reference outputs also check the ablations.
        let (mut worst, mut worst_base, mut worst_pair) = (0f64, 0f64, 0f64);
        let mut first: Option<(Vec<Tensor>, Vec<Tensor>)> = None;
        for _ in 0..opts.protocol.verify_inputs.max(1) {
            let inputs = random_inputs(&opts.inputs, device);
            let up: Vec<Tensor> = inputs
                .iter()
                .map(|t| {
                    if t.is_floating_point() {
                        t.to_kind(Kind::Double)
                    } else {
                        t.shallow_clone()
                    }
                })
                .collect();
            let r = forward(&reference, &up)
                .map_err(|e| format!("the original's fp64 copy (the reference) failed: {e}"))?;
            let o = forward(&original, &inputs)?;
            let c = forward(&composed, &inputs)?;
            cuda.sync()?;
            worst = nan_max(worst, worst_error(&c, &r));
            worst_base = nan_max(worst_base, worst_error(&o, &r));
            worst_pair = nan_max(worst_pair, worst_error(&c, &o));
            first.get_or_insert((inputs, r));
            if worst.is_nan() {
                break;
            }
        }
        let inputs = random_inputs(&opts.inputs, device);
        let baseline = time_forward(&original, &inputs, &opts.protocol, cuda)?;
        let fact = time_forward(&composed, &inputs, &opts.protocol, cuda)?;
        let op_calls = torch::op_stats(&opts.library, false).map_err(|e| e.to_string())?;
        let kernels: Vec<String> = opts.patterns.iter().map(|p| p.kernel.clone()).collect();
        never_ran(&kernels, &op_calls)?;
        let mut ablations = Vec::new();
        for &kind in &opts.without {
            torch::disable_kinds(&opts.library, &[kind]).map_err(|e| e.to_string())?;
            let run = || -> Result<Ablation, String> {
                let (check, r) = first.as_ref().expect("at least one verification input");
                let err = worst_error(&forward(&composed, check)?, r);
                let timing = time_forward(&composed, &inputs, &opts.protocol, cuda)?;
                Ok(Ablation {
                    without: kind,
                    ms: timing.median_ms,
                    max_rel_err: err,
                    slowdown: timing.median_ms / fact.median_ms,
                    timing,
                })
            };
            let result = run();
            torch::disable_kinds(&opts.library, &[]).map_err(|e| e.to_string())?;
            ablations.push(result?);
        }
        let rate = |t: &Timing| opts.gemm_flops / (t.median_ms * 1e-3) / 1e12;
        Ok(BenchReport {
            workload: opts.workload.clone(),
            device: cuda.device_info(0),
            torch: torch::torch_version(),
            cuda: opts.cuda.clone(),
            cutlass: opts.cutlass.clone(),
            precision: opts.precision,
            inputs: opts.inputs.clone(),
            baseline_ms: baseline.median_ms,
            fact_ms: fact.median_ms,
            speedup: baseline.median_ms / fact.median_ms,
            max_rel_err: worst,
            baseline_rel_err: worst_base,
            composed_vs_baseline: worst_pair,
            fact_tflops: rate(&fact),
            baseline_tflops: rate(&baseline),
            baseline,
            fact,
            gemm_flops: opts.gemm_flops,
            date: crate::table::today(),
            command: opts.command.clone(),
            op_calls,
            ablations,
            patterns: opts.patterns.clone(),
        })
    })
}

/// `fact bench`'s end-to-end figure: the original, the composed module and each ablation.
pub fn e2e_figure(b: &BenchReport) -> String {
    let mut bars = vec![
        ("original (traced)".to_string(), b.baseline_ms),
        ("fact".to_string(), b.fact_ms),
    ];
    bars.extend(
        b.ablations
            .iter()
            .map(|a| (format!("fact without {}", a.without), a.ms)),
    );
    let group = plot::BarGroup {
        label: format!("{} ({})", b.workload, b.precision),
        bars,
        note: None,
    };
    let subtitle = format!(
        "{}, torch {}, CUTLASS {}, {}: median of {} runs each, one process",
        b.device.name, b.torch, b.cutlass, b.date, b.fact.samples
    );
    plot::e2e_svg("speedup over the original module", &subtitle, &[group])
}

/// A record of the benchmark harnesses (benches/device's suite.json, benches/zoo's zoo.json): one
/// model under one policy, the modules a user could pick timed in one process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SuiteRecord {
    pub model: String,
    pub policy: String,
    #[serde(default)]
    pub eager_ms: Option<f64>,
    #[serde(default)]
    pub traced_ms: Option<f64>,
    #[serde(default)]
    pub compile_ms: Option<f64>,
    #[serde(default)]
    pub max_autotune_ms: Option<f64>,
    #[serde(default)]
    pub fact_ms: Option<f64>,
    /// Absent or null where the harness ran none (one kind substituted, or the fact stage failed).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub ablations: Vec<SuiteAblation>,
    /// What failed: one text (epilogue suite) or a text per stage (zoo).
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub errors: BTreeMap<String, String>,
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SuiteAblation {
    pub without: String,
    pub ms: f64,
}

/// The module a suite figure's speedups are over (`fact plot-e2e --over`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reference {
    Eager,
    Traced,
    Compile,
    MaxAutotune,
}

impl Reference {
    pub const ALL: [Reference; 4] = [
        Reference::Eager,
        Reference::Traced,
        Reference::Compile,
        Reference::MaxAutotune,
    ];

    /// The name `--over` takes, and the bar's label.
    pub fn name(self) -> &'static str {
        match self {
            Reference::Eager => "eager",
            Reference::Traced => "traced",
            Reference::Compile => "torch.compile",
            Reference::MaxAutotune => "max-autotune",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Reference::MaxAutotune => "torch.compile max-autotune",
            r => r.name(),
        }
    }

    fn ms(self, r: &SuiteRecord) -> Option<f64> {
        match self {
            Reference::Eager => r.eager_ms,
            Reference::Traced => r.traced_ms,
            Reference::Compile => r.compile_ms,
            Reference::MaxAutotune => r.max_autotune_ms,
        }
    }
}

impl std::str::FromStr for Reference {
    type Err = String;
    fn from_str(s: &str) -> Result<Reference, String> {
        let s = if s == "compile" { "torch.compile" } else { s };
        Reference::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Reference::ALL.iter().map(|r| r.name()).collect();
                format!(
                    "unknown module '{s}' to draw speedups over: use one of {}",
                    names.join(", ")
                )
            })
    }
}

/// The figure of suite records: a group per record, `over`'s time first (the speedups are over
/// it), then the other modules and fact's ablations; a record missing fact's time or `over`'s
/// says so under its bars, with its errors. The subtitle gains fact's geomean speedup over `over`
/// per policy, over the records that have both times.
pub fn suite_figure(
    title: &str,
    subtitle: &str,
    records: &[SuiteRecord],
    over: Reference,
) -> String {
    let groups: Vec<plot::BarGroup> = records
        .iter()
        .map(|r| {
            let errors = || {
                let mut all: Vec<String> = r.error.iter().cloned().collect();
                all.extend(r.errors.iter().map(|(stage, e)| format!("{stage}: {e}")));
                let text = all.join("; ");
                // What fits beside the bars at 12 px.
                let short: String = text.chars().take(60).collect();
                match (text.is_empty(), short.len() < text.len()) {
                    (true, _) => String::new(),
                    (false, false) => format!(" ({short})"),
                    (false, true) => format!(" ({short}…)"),
                }
            };
            let label = format!("{} ({})", r.model, r.policy);
            let Some(base) = over.ms(r) else {
                return plot::BarGroup {
                    label,
                    bars: vec![],
                    note: Some(format!("no {} time{}", over.name(), errors())),
                };
            };
            let mut bars = vec![(over.label().to_string(), base)];
            bars.extend(
                Reference::ALL
                    .into_iter()
                    .filter(|&m| m != over)
                    .filter_map(|m| Some((m.label().to_string(), m.ms(r)?))),
            );
            bars.extend(r.fact_ms.map(|ms| ("fact".to_string(), ms)));
            bars.extend(
                r.ablations
                    .iter()
                    .map(|a| (format!("fact without {}", a.without), a.ms)),
            );
            let note = r
                .fact_ms
                .is_none()
                .then(|| format!("no fact time{}", errors()));
            plot::BarGroup { label, bars, note }
        })
        .collect();
    let mut policies: Vec<&str> = Vec::new();
    for r in records {
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    let means: Vec<String> = policies
        .iter()
        .filter_map(|p| {
            let ratios: Vec<f64> = records
                .iter()
                .filter(|r| r.policy == *p)
                .filter_map(|r| Some(over.ms(r)? / r.fact_ms?))
                .collect();
            let n = ratios.len();
            (n > 0).then(|| {
                let g = (ratios.iter().map(|x| x.ln()).sum::<f64>() / n as f64).exp();
                format!("{p} {g:.2}x ({n} model{})", if n == 1 { "" } else { "s" })
            })
        })
        .collect();
    let geomeans = format!("fact over {}, geomean: {}", over.label(), means.join(", "));
    let subtitle = match (means.is_empty(), subtitle.is_empty()) {
        (true, _) => subtitle.to_string(),
        (false, true) => geomeans,
        (false, false) => format!("{subtitle}\n{geomeans}"),
    };
    plot::e2e_svg(title, &subtitle, &groups)
}

/// An error naming the substituted kernels that never ran during the composed runs: the module
/// fell back to torch's ops for them, so its timing is not fact's.
fn never_ran(
    kernels: &[String],
    calls: &std::collections::BTreeMap<String, torch::OpCalls>,
) -> Result<(), String> {
    let idle: Vec<String> = kernels
        .iter()
        .filter(|k| calls.get(*k).is_none_or(|c| c.ran == 0))
        .map(|k| {
            let c = calls.get(k).cloned().unwrap_or_default();
            format!(
                "{k} ({} calls fell back{})",
                c.fell_back,
                c.why.map(|w| format!(": {w}")).unwrap_or_default()
            )
        })
        .collect();
    if idle.is_empty() {
        return Ok(());
    }
    let why = if std::env::var_os("FACT_DISABLE").is_some_and(|v| !v.is_empty() && v != "0") {
        "FACT_DISABLE is set, so every call runs torch's ops; unset it to bench fact"
    } else {
        "the calls did not fit their kernels (device, dtype, shapes or alignment); the composed module ran torch's ops there"
    };
    Err(format!(
        "substituted kernels never ran: {}: {why}",
        idle.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_substituted_kernel_that_never_ran_fails_the_bench() {
        let mut calls = std::collections::BTreeMap::new();
        calls.insert(
            "k1".to_string(),
            torch::OpCalls {
                ran: 36,
                copied: 0,
                fell_back: 0,
                why: None,
                torch: 0,
            },
        );
        calls.insert(
            "k2".to_string(),
            torch::OpCalls {
                ran: 0,
                copied: 0,
                fell_back: 36,
                why: Some("the mask is not the causal one".into()),
                torch: 0,
            },
        );
        assert!(never_ran(&["k1".into()], &calls).is_ok());
        let e = never_ran(&["k1".into(), "k2".into(), "k3".into()], &calls).unwrap_err();
        assert!(
            e.contains("k2 (36 calls fell back: the mask is not the causal one)")
                && e.contains("k3 (0 calls fell back)")
                && !e.contains("k1"),
            "{e}"
        );
    }

    #[test]
    fn a_zoo_record_without_ablations_reads_as_none() {
        let r: SuiteRecord = serde_json::from_str(
            r#"{"model":"gpt2","policy":"bf16","fact_ms":12.5,"ablations":null,"errors":{}}"#,
        )
        .unwrap();
        assert!(r.ablations.is_empty() && r.fact_ms == Some(12.5));
        assert!(serde_json::from_str::<SuiteRecord>(
            r#"{"model":"m","policy":"bf16","ablations":3}"#
        )
        .is_err());
    }
}
