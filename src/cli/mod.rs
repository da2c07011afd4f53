//! The command line: the only place that parses arguments or prints. Tables for people, `--json`
//! for machines; errors are printed by main with their context chain.

use crate::bench::{self, BenchOptions, BenchReport};
use crate::compose::{self, ComposeReport, Realization};
use crate::nvcc::{self, Toolchain};
use crate::table;
use crate::torch::{self, InputShape};
use crate::tune::{worker, Protocol};
use crate::types::{Arch, Precision};
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(name = "fact", version, about = "Makes TorchScript models faster with tuned CUTLASS kernels")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Discover, realize (table hit or compile + tune) and substitute GEMMs, then benchmark.
    Compose {
        /// A TorchScript archive (torch.jit.trace(...).save(path)).
        model: PathBuf,
        /// Shape and dtype of a forward input, e.g. 4096x4096:f32; once per input, in order.
        /// Defaults to the example inputs a traced archive stores.
        #[arg(long = "input")]
        inputs: Vec<String>,
        /// Output folder (default out/<model name>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Precision policy for fp32 tensors: tf32 or f32. The baseline runs under the same one.
        #[arg(long, default_value = "tf32")]
        precision: String,
        /// Parallel compile jobs (default: all cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Compile and tune at most this many candidates per pattern (default: the whole sweep).
        #[arg(long)]
        candidates: Option<usize>,
        /// Skip the end-to-end benchmark.
        #[arg(long)]
        no_bench: bool,
        /// Write the benchmark report here too (e.g. benches/results/NAME.json).
        #[arg(long)]
        save_report: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Benchmark a composed output folder again: original vs composed, same run.
    Bench {
        /// The folder compose wrote (holds compose.json).
        dir: PathBuf,
        #[arg(long)]
        save_report: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Print the inlined forward graph of a TorchScript archive.
    Graph { model: PathBuf },
    /// Internal: judges kernel variants for the tuner in a child process.
    #[command(hide = true)]
    TuneWorker,
}

fn jobs(j: Option<usize>) -> usize {
    j.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2))
}

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

pub fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Compose { model, inputs, out, precision, jobs: j, candidates, no_bench, save_report, json } => {
            let precision: Precision = precision.parse().map_err(anyhow::Error::msg)?;
            let inputs = inputs.iter().map(|s| InputShape::parse(s)).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
            let stem = model.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "model".into());
            let out_dir = out.unwrap_or_else(|| PathBuf::from("out").join(stem));
            let opts = compose::Options {
                model: model.clone(),
                inputs,
                out_dir: out_dir.clone(),
                precision,
                arch: Arch::Sm90,
                jobs: jobs(j),
                user_table: table::user_table_path(),
                shipped_table: table::shipped_table_path(),
                cache_dir: nvcc::default_cache_dir(),
                exe: std::env::current_exe().context("cannot find the fact executable")?,
                protocol: Protocol::default(),
                progress: !json,
                max_candidates: candidates,
            };
            let report = compose::compose(&opts).with_context(|| format!("composing {}", model.display()))?;
            let bench = if report.gpu && report.composed.is_some() && !no_bench {
                Some(run_bench(&report, &out_dir, save_report.as_deref())?)
            } else {
                None
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "compose": report, "bench": bench }))?);
            } else {
                print_compose(&report, &out_dir);
                if let Some(b) = &bench {
                    print_bench(b);
                }
            }
            Ok(())
        }
        Command::Bench { dir, save_report, json } => {
            let path = dir.join(compose::REPORT);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("{}: no compose report; run fact compose first", path.display()))?;
            let report: ComposeReport = serde_json::from_str(&text).with_context(|| format!("{}: unreadable", path.display()))?;
            if report.composed.is_none() {
                bail!("{} holds no composed module (compose ran without a GPU?); run fact compose on a GPU machine", dir.display());
            }
            let b = run_bench(&report, &dir, save_report.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&b)?);
            } else {
                print_bench(&b);
            }
            Ok(())
        }
        Command::Graph { model } => {
            print!("{}", torch::graph_text(&model)?);
            Ok(())
        }
        Command::TuneWorker => {
            let mut body = String::new();
            std::io::stdin().read_to_string(&mut body)?;
            let req: worker::Request = serde_json::from_str(&body).context("bad tune-worker request")?;
            worker::serve(req).map_err(anyhow::Error::msg)
        }
    }
}

fn run_bench(report: &ComposeReport, out_dir: &Path, save: Option<&Path>) -> Result<BenchReport> {
    let tc = Toolchain::discover()?;
    let gemm_flops: f64 = report.patterns.iter().filter(|p| p.kernel.is_some()).map(|p| p.problem.flops()).sum();
    let name = report.model.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
    let inputs: Vec<String> = report.inputs.iter().map(InputShape::display).collect();
    let opts = BenchOptions {
        workload: format!("{name} ({})", inputs.join(", ")),
        original: report.model.clone(),
        composed: report.composed.clone().expect("checked by callers"),
        library: report.library.clone().expect("a composed module comes with its library"),
        inputs: report.inputs.clone(),
        precision: report.precision,
        protocol: Protocol::default(),
        gemm_flops,
        cutlass: tc.cutlass_version(),
        cuda: tc.nvcc_version(),
        command: command_line(),
    };
    let b = bench::bench(&opts).map_err(anyhow::Error::msg).context("benchmarking")?;
    let text = serde_json::to_string_pretty(&b)? + "\n";
    let path = out_dir.join("report.json");
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    if let Some(s) = save {
        if let Some(d) = s.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(s, &text).with_context(|| format!("writing {}", s.display()))?;
    }
    Ok(b)
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.4}"))
}

fn print_compose(r: &ComposeReport, out_dir: &Path) {
    println!("fact compose {} ({} precision, {})", r.model.display(), r.precision, r.arch);
    if !r.graph_note.is_empty() {
        println!("  shapes: {}", r.graph_note);
    }
    println!("{:<4} {:<14} {:<16} {:<5} {:<22} {:>10} {:>10}  kernel", "id", "rule", "shape MxNxK", "dtype", "realized", "kernel ms", "torch ms");
    for p in &r.patterns {
        let how = match &p.realization {
            Realization::Hit { table } => format!("hit ({table} table)"),
            Realization::Tuned { candidates, failed } => format!("tuned {}/{candidates} ok", candidates - failed),
            Realization::Compiled { candidates, failed } => format!("compiled {}/{candidates}", candidates - failed),
            Realization::Skipped { .. } => "left to torch".into(),
        };
        println!(
            "{:<4} {:<14} {:<16} {:<5} {:<22} {:>10} {:>10}  {}",
            p.id,
            p.rule,
            p.problem.shape_key(),
            p.problem.dtype,
            how,
            fmt_ms(p.kernel_ms),
            fmt_ms(p.torch_ms),
            p.kernel.as_deref().unwrap_or("-")
        );
        if let Realization::Skipped { reason } = &p.realization {
            println!("     {reason}");
        }
    }
    if r.patterns.is_empty() {
        println!("  no GEMM pattern matched; the model is left as it is");
    }
    for f in &r.compile_failures {
        print!("{f}");
    }
    if !r.gpu {
        let compiled = r.patterns.iter().filter(|p| matches!(p.realization, Realization::Compiled { .. })).count();
        println!(
            "\nno CUDA device: tuning needs a GPU. Discovered {} pattern(s); rendered and compiled the candidate kernels of {compiled} \
             (sources and libraries under {}/sweeps/). Run the same command on an sm90 machine to tune, compose and benchmark.",
            r.patterns.len(),
            out_dir.display()
        );
    }
    if let (Some(c), Some(l)) = (&r.composed, &r.library) {
        println!("\ncomposed module: {}\nop library:      {}", c.display(), l.display());
        println!("load in python:  torch.ops.load_library(\"{}\"); m = torch.jit.load(\"{}\")", l.display(), c.display());
    }
    println!("report: {}  ({:.1} s)", out_dir.join(compose::REPORT).display(), r.seconds);
}

fn print_bench(b: &BenchReport) {
    println!("\nbench on {} ({} SMs), torch {}, CUDA {}, CUTLASS {}, precision {}", b.device.name, b.device.sm_count, b.torch, b.cuda, b.cutlass, b.precision);
    println!("{:<10} {:>11} {:>9} {:>11} {:>13}", "module", "median ms", "spread", "GEMM TF/s", "rel err fp64");
    println!("{:<10} {:>11.4} {:>8.1}% {:>11.1} {:>13.2e}", "torch", b.baseline_ms, b.baseline.spread * 100.0, b.baseline_tflops, b.baseline_rel_err);
    println!("{:<10} {:>11.4} {:>8.1}% {:>11.1} {:>13.2e}", "fact", b.fact_ms, b.fact.spread * 100.0, b.fact_tflops, b.max_rel_err);
    println!("speedup {:.3}x", b.speedup);
}
