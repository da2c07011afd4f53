//! `fact bench` and `fact plot-e2e`: the benchmark of a composed folder (ablations, e2e.svg) and
//! the figure of the harnesses' records.

use super::command_line;
use crate::atomic;
use crate::bench::{self, BenchOptions, BenchReport};
use crate::compose::ComposeReport;
use crate::nvcc::Toolchain;
use crate::rules::PatternKind;
use crate::torch::InputShape;
use crate::tune::Protocol;
use anyhow::{bail, Context, Result};
use std::path::Path;

/// `--without`'s kinds: None for the default (each kind substituted, when two or more are).
pub(super) fn parse_kinds(text: Option<&str>) -> Result<Option<Vec<PatternKind>>> {
    let Some(text) = text else { return Ok(None) };
    if text == "none" {
        return Ok(Some(vec![]));
    }
    text.split(',')
        .map(|k| k.trim().parse::<PatternKind>())
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
        .map_err(anyhow::Error::msg)
}

pub(super) fn run_bench(
    report: &ComposeReport,
    out_dir: &Path,
    save: Option<&Path>,
    without: Option<Vec<PatternKind>>,
) -> Result<BenchReport> {
    let tc = Toolchain::discover()?;
    let patterns: Vec<bench::PatternTime> = report
        .patterns
        .iter()
        .filter_map(|p| {
            Some(bench::PatternTime {
                id: p.id.clone(),
                kind: p.problem.pattern_kind(),
                rule: p.rule.clone(),
                kernel: p.kernel.clone()?,
                kernel_ms: p.kernel_ms,
                torch_ms: p.torch_ms,
            })
        })
        .collect();
    // The kinds substituted, in the registry's order.
    let kinds: Vec<PatternKind> = crate::kinds::registry::pattern_kinds()
        .into_iter()
        .filter(|k| patterns.iter().any(|p| p.kind == *k))
        .collect();
    let without = without.unwrap_or_else(|| {
        if kinds.len() >= 2 {
            kinds.clone()
        } else {
            vec![]
        }
    });
    let gemm_flops: f64 = report
        .patterns
        .iter()
        .filter(|p| p.kernel.is_some())
        .map(|p| p.problem.flops())
        .sum();
    let name = report
        .model
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let inputs: Vec<String> = report.inputs.iter().map(InputShape::display).collect();
    let opts = BenchOptions {
        workload: format!("{name} ({})", inputs.join(", ")),
        // A .pt2 output is timed through its TorchScript copies: the same edits, the same ops.
        original: report
            .torchscript
            .as_ref()
            .map_or_else(|| report.model.clone(), |t| t.0.clone()),
        composed: report.torchscript.as_ref().map_or_else(
            || report.composed.clone().expect("checked by callers"),
            |t| t.1.clone(),
        ),
        library: report
            .library
            .clone()
            .expect("a composed module comes with its library"),
        inputs: report.inputs.clone(),
        precision: report.precision,
        protocol: Protocol::default(),
        gemm_flops,
        cutlass: tc.cutlass_version(),
        cuda: tc.nvcc_version(),
        command: command_line(),
        without,
        patterns,
    };
    let b = bench::bench(&opts)
        .map_err(anyhow::Error::msg)
        .context("benchmarking")?;
    let text = serde_json::to_string_pretty(&b)? + "\n";
    let path = out_dir.join("report.json");
    atomic::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    let svg = out_dir.join("e2e.svg");
    atomic::write(&svg, bench::e2e_figure(&b))
        .with_context(|| format!("writing {}", svg.display()))?;
    if let Some(s) = save {
        if let Some(d) = s.parent() {
            std::fs::create_dir_all(d)?;
        }
        atomic::write(s, &text).with_context(|| format!("writing {}", s.display()))?;
    }
    Ok(b)
}

/// `fact plot-e2e`: the end-to-end figure of the benchmark harnesses' records.
pub(super) fn plot_e2e(records: &Path, out: &Path, title: &str, over: &str) -> Result<()> {
    let over: bench::Reference = over.parse().map_err(anyhow::Error::msg)?;
    let text = std::fs::read_to_string(records)
        .with_context(|| format!("reading {}", records.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", records.display()))?;
    // A bare list of records, or {"meta": {...}, "records": [...]} as the harnesses write.
    let (list, meta) = match &v {
        serde_json::Value::Array(_) => (v.clone(), serde_json::Value::Null),
        _ => (v["records"].clone(), v["meta"].clone()),
    };
    let list: Vec<bench::SuiteRecord> = serde_json::from_value(list).with_context(|| {
        format!(
            "{}: not a list of benchmark records (model, policy, eager_ms, …, fact_ms)",
            records.display()
        )
    })?;
    if list.iter().all(|r| r.fact_ms.is_none()) {
        bail!("{}: no record has a fact_ms to draw", records.display());
    }
    let field = |k: &str| meta[k].as_str().unwrap_or("").to_string();
    let torch = field("torch");
    let subtitle = [
        field("device"),
        if torch.is_empty() {
            torch
        } else {
            format!("torch {torch}")
        },
        field("date"),
    ]
    .into_iter()
    .filter(|f| !f.is_empty())
    .collect::<Vec<_>>()
    .join(", ");
    atomic::write(out, bench::suite_figure(title, &subtitle, &list, over))
        .with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}
