//! The command line: the only place that parses arguments or prints. Tables for people, `--json`
//! for machines; errors are printed by main with their context chain. This file holds the
//! arguments and the dispatch; `tables` the table and knowledge commands, `benchmark` the bench
//! and its figures, `doctor` the set-up check, `show` what the commands print for people.

use crate::compose::{self, ComposeReport};
use crate::kinds::registry::MatchOptions;
use crate::nvcc::{self, Toolchain};
use crate::plan::PlanOptions;
use crate::table::{self, Tables};
use crate::torch::{self, InputShape};
use crate::tune::devices::GpuChoice;
use crate::tune::{worker, Protocol};
use crate::types::DType;
use crate::types::{Arch, Precision};
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::io::Read;
use std::path::PathBuf;

mod benchmark;
mod doctor;
mod show;
mod tables;

use show::{fmt_ms, print_bench, print_compose, print_plan};
use tables::{knowledge_command, table_command, KnowledgeCommand, TableCommand};

/// The exit status of a compose that wrote its composition and whose own benchmark then failed:
/// the composition stands (the Python package loads it, with a warning), so a caller can tell
/// this apart from a compose that wrote nothing (1).
pub const EXIT_UNBENCHED: i32 = 3;

/// The error of a compose whose benchmark failed after the composition was written (its message
/// says where the composition is).
#[derive(Debug)]
pub struct Unbenched(pub String);

impl std::fmt::Display for Unbenched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The process's exit status for an error `main` returned.
pub fn exit_code(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<Unbenched>().is_some() {
        EXIT_UNBENCHED
    } else {
        1
    }
}

/// `fact --version`: the package's version and the commit it was built from (`-dirty` where the
/// sources differed from it: fact_version).
fn version() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| format!("{} ({})", env!("CARGO_PKG_VERSION"), fact_version::COMMIT))
}

#[derive(Parser)]
#[command(
    name = "fact",
    version = version(),
    about = "Makes PyTorch models (TorchScript archives and torch.export programs) faster with tuned CUTLASS kernels"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct AgentArgs {
    /// An external agent: a command that speaks fact-agent/2 (one JSON request per line on its
    /// stdin, one JSON reply per line on its stdout). Default: the built-in agent.
    #[arg(long)]
    agent: Option<String>,
    /// Seconds to wait for each agent reply before the built-in agent takes over.
    #[arg(long, default_value_t = 30.0)]
    agent_timeout: f64,
}

#[derive(Subcommand)]
enum Command {
    /// Print the plan: matched patterns ranked by estimated share of model time, with their
    /// supporting CUTLASS examples, and the time left in unmatched regions.
    Discover {
        model: PathBuf,
        #[arg(long = "input")]
        inputs: Vec<String>,
        #[arg(long, default_value = "tf32")]
        precision: String,
        /// The GPU arch to plan for: sm80 (A100) or sm90 (H100). Default: the GPU's, else sm90.
        #[arg(long)]
        arch: Option<String>,
        #[command(flatten)]
        agent: AgentArgs,
        /// Run sibling linears reading one x (q, k and v projections) as one GEMM over their
        /// concatenated weights. Off by default: not yet measured on a GPU.
        #[arg(long)]
        fuse_siblings: bool,
        /// Leave patch embeddings (a convolution whose filter is its stride, unpadded: ViT's,
        /// Swin's, ConvNeXt's stem) to the convolution kind, where by default each is one GEMM
        /// over the image cut into patches.
        #[arg(long)]
        no_patch_conv: bool,
        #[arg(long)]
        json: bool,
    },
    /// Discover, realize (table hit or compile + tune) and substitute the patterns (GEMMs, fused
    /// epilogues, attention), then benchmark.
    Compose {
        /// A torch.export program (torch.export.save(torch.export.export(model, inputs), path),
        /// a .pt2 archive) or a TorchScript archive (torch.jit.trace(model, inputs).save(path)).
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
        /// The GPU arch to build for: sm80 (A100) or sm90 (H100). Default: the GPU's, else sm90.
        /// Kernels for another arch than the GPU's are compiled, not tuned (an H100 tunes sm80
        /// kernels too, through their PTX).
        #[arg(long)]
        arch: Option<String>,
        /// Parallel compile jobs (default: all cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// Compile and tune at most this many kernels per pattern (default 12, best estimate first; the best 2 of each family and kernel schedule always).
        #[arg(long)]
        candidates: Option<usize>,
        /// Tune launch knobs (raster, swizzle, K splits) of this many of each sweep's fastest kernels,
        /// and CUTLASS's other cluster shapes of its fastest tile and schedule pairs (at most 3;
        /// 0: neither).
        #[arg(long, default_value_t = 4)]
        refine: usize,
        /// A problem whose patterns the plan puts, all together, under this share of the model's
        /// estimated time gets a light sweep: at most 4 first candidates and no later rounds (0,
        /// the default: every sweep full). Off by default: a cold compose of MobileNetV3 took 348 s
        /// with 0.01 against 351 s without (benches/results/scale, light sweeps), the kernel
        /// units' compile time, not their count, setting the prefetch's wall time.
        #[arg(long, default_value_t = 0.0)]
        light_share: f64,
        /// The GPUs that time the candidates: a count (2: the first two), device indices (0,1; one
        /// alone as 1,) or all (default: every visible GPU that runs the arch's kernels, of the
        /// first one's model). One tuning worker per GPU; each sweep's variants are dealt across
        /// them, and independent patterns' sweeps run side by side.
        #[arg(long, default_value = "all")]
        gpus: String,
        /// Skip the end-to-end benchmark.
        #[arg(long)]
        no_bench: bool,
        /// Substitute winners even where torch measured faster.
        #[arg(long)]
        keep_slower: bool,
        #[command(flatten)]
        agent: AgentArgs,
        /// Write the benchmark report here too (e.g. benches/results/NAME.json).
        #[arg(long)]
        save_report: Option<PathBuf>,
        /// Pattern kinds the benchmark turns off one at a time (as `fact bench --without`).
        #[arg(long)]
        without: Option<String>,
        /// Run sibling linears reading one x (q, k and v projections) as one GEMM over their
        /// concatenated weights. Off by default: not yet measured on a GPU.
        #[arg(long)]
        fuse_siblings: bool,
        /// Leave patch embeddings (a convolution whose filter is its stride, unpadded: ViT's,
        /// Swin's, ConvNeXt's stem) to the convolution kind, where by default each is one GEMM
        /// over the image cut into patches.
        #[arg(long)]
        no_patch_conv: bool,
        /// Whether each GEMM-like pattern also gets a kernel tuned at 128 rows, which its op runs
        /// on calls of at most 256 rows (a decode step, a short prompt; torch's ops where they
        /// measured faster there): on, off, or auto (on for a .pt2 program with a dynamic dim).
        /// Only where a GPU tunes.
        #[arg(long, default_value = "auto")]
        small_rows: String,
        /// Where a .pt2 program's dynamic dims reach past the sample's: whether a GEMM-like
        /// pattern runs, instead of the sample's winner, a kernel measured within 3% of it there
        /// whose waves hold up on calls of up to a quarter more rows (on), or the winner (off).
        #[arg(long, default_value = "on")]
        steady: String,
        /// The composed output's format: pt2 (composed.pt2, a torch.export program; from a .pt2
        /// input only) or torchscript (composed.pt). Default: the input's.
        #[arg(long)]
        format: Option<String>,
        /// With a pt2 output, also write its TorchScript copies (torchscript/original.pt and
        /// torchscript/composed.pt, the same edits on the same op library), as the benchmark does,
        /// under --no-bench too: the two runtimes of one composition, for a measuring harness.
        #[arg(long)]
        torchscript_copy: bool,
        /// Stop after the quick phase: the tables' winners and, where they miss, the best of each
        /// sweep's first 1-2 candidates, composed and written; `fact tune OUT` runs the full sweeps
        /// later and rewrites the output where a winner changes.
        #[arg(long)]
        quick: bool,
        #[arg(long)]
        json: bool,
    },
    /// Run the full sweeps of an output folder composed with --quick (its compose.json says
    /// the model, inputs, precision, arch and options), resuming the quick ones, and rewrite the
    /// composed output and op library where a winner changes; compose.json says what changed.
    Tune {
        /// The folder compose wrote (holds compose.json).
        dir: PathBuf,
        /// Parallel compile jobs (default: all cores).
        #[arg(long)]
        jobs: Option<usize>,
        /// The GPUs that time the candidates, as compose takes them.
        #[arg(long, default_value = "all")]
        gpus: String,
        #[arg(long)]
        json: bool,
    },
    /// Benchmark a composed output folder again: original vs composed, same run, then the
    /// composed module with each pattern kind turned off; writes report.json and e2e.svg.
    Bench {
        /// The folder compose wrote (holds compose.json).
        dir: PathBuf,
        #[arg(long)]
        save_report: Option<PathBuf>,
        /// Pattern kinds to turn off one at a time (gemm, epilogue, attention, layernorm;
        /// comma-separated, or none). Default: each kind the module substitutes, when it substitutes two or more.
        #[arg(long)]
        without: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Tune a rule for a shape and add the winner to the user pattern table, without a model.
    Realize {
        /// gemm_rcr, gemm_rcr_bias, gemm_rrr, gemm_rrr_bias, bmm_rrr; attention, attention_causal
        /// (the explicit softmax(q·kᵀ)·v form), sdpa, sdpa_causal, sdpa_padded or
        /// sdpa_causal_padded (a key-padding mask: each sequence's own key length), and with a bias
        /// tensor added to the scores _bias (one for all sequences), _bias_batched (one per
        /// sequence) or _bias_windowsW (one per window: attention_bias_windows64), then _strided
        /// for an SDPA mask whose keys are not dense (sdpa_padded_bias_strided); layernorm,
        /// layernorm_affine (weight and bias), layernorm_weight or layernorm_bias;
        /// conv2d_s<stride>_p<padding>_d<dilation>[_bias][_add][_<act>] (a convolution with its
        /// bias, residual add and activation: conv2d_s1_p1_d1_bias_relu); the other kinds' rule ids
        /// as an unknown rule's error lists them.
        #[arg(long)]
        rule: String,
        /// Tensor dtype: f32, bf16 or f16.
        #[arg(long)]
        dtype: String,
        /// MxNxK, LxMxNxK for bmm_rrr, BxHxTqxTkxD (batch, heads, query and key lengths, head
        /// dim) for attention, or BxHxTqxTkxDxHkv with k/v's fewer heads (grouped-query), ROWSxC
        /// (C the normalized dim) for layernorm, NxHxWxCxKxRxS (images, input height and width,
        /// input and output channels, filter height and width) for a convolution.
        #[arg(long)]
        shape: String,
        /// An elementwise program fused after the GEMM, in the text form discover prints
        /// (e.g. 'leaves=row;v1=gelu(v0);v2=mul(v1,l0)').
        #[arg(long)]
        epilogue: Option<String>,
        #[arg(long, default_value = "tf32")]
        precision: String,
        /// The GPU arch to tune for: sm80 (A100) or sm90 (H100). Default: the GPU's. An H100
        /// tunes sm80 kernels too, through their PTX.
        #[arg(long)]
        arch: Option<String>,
        /// Compile and tune at most this many kernels (default 12, best estimate first; the best 2 of each family and kernel schedule always).
        #[arg(long)]
        candidates: Option<usize>,
        /// Tune launch knobs (raster, swizzle, K splits) of this many of the fastest kernels, and
        /// CUTLASS's other cluster shapes of the fastest tile and schedule pairs (at most 3; 0:
        /// neither).
        #[arg(long, default_value_t = 4)]
        refine: usize,
        /// Cut kernels the estimate puts over this factor times the best one (the best 3 of
        /// each family within it are always kept); raise it to measure what the estimate doubts.
        #[arg(long, default_value_t = 1.8)]
        hopeless: f64,
        #[arg(long)]
        jobs: Option<usize>,
        /// Folder for the sweep's sources and libraries (default out/realize).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The GPUs that time the candidates: a count (2: the first two), device indices (0,1; one
        /// alone as 1,) or all (default: every visible GPU that runs the arch's kernels, of the
        /// first one's model). One tuning worker per GPU; each sweep's variants are dealt across
        /// them, and independent patterns' sweeps run side by side.
        #[arg(long, default_value = "all")]
        gpus: String,
        /// Compile the sweep's kernels into the build cache and stop, without a GPU or tuning (a
        /// table hit compiles nothing): realizes compiled side by side then tune one by one.
        #[arg(long)]
        compile_only: bool,
        #[command(flatten)]
        agent: AgentArgs,
        #[arg(long)]
        json: bool,
    },
    /// Inspect and share the pattern tables.
    Table {
        #[command(subcommand)]
        command: TableCommand,
    },
    /// The knowledge base of CUTLASS instantiations the candidate space is derived from.
    Knowledge {
        #[command(subcommand)]
        command: KnowledgeCommand,
    },
    /// Print the inlined forward graph of a TorchScript archive.
    Graph { model: PathBuf },
    /// Check the set-up: the compilers and headers found, the build cache, the shared compile
    /// cache (sccache: its backend and hit rate) and the GPU.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Draw the end-to-end figure of benchmark records: a list of {model, policy, eager_ms,
    /// traced_ms, compile_ms, max_autotune_ms, fact_ms, ablations: [{without, ms}], errors} (what
    /// benches/device and benches/zoo write), or {"meta": {device, torch, date}, "records": [...]}.
    PlotE2e {
        records: PathBuf,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "fact end to end")]
        title: String,
        /// The module the speedups are over: eager, traced, torch.compile or max-autotune.
        #[arg(long, default_value = "eager")]
        over: String,
    },
    /// Internal: judges kernel variants for the tuner in a child process.
    #[command(hide = true)]
    TuneWorker,
}

/// `--arch`, parsed.
pub(super) fn parse_arch(s: &str) -> Result<Arch> {
    Arch::parse(s).with_context(|| format!("unknown arch '{s}': use sm80 or sm90"))
}

/// The arch a command builds for: `--arch`, else the GPU's, else sm90; and the device present.
fn target(arch: Option<&str>) -> Result<(Arch, Option<compose::Device>)> {
    let requested = arch.map(parse_arch).transpose()?;
    let device = compose::Device::detect();
    let arch = compose::target_arch(requested, device.as_ref()).map_err(anyhow::Error::msg)?;
    Ok((arch, device))
}

fn jobs(j: Option<usize>) -> usize {
    j.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    })
}

/// The realization options every command shares; the rest are defaults from the environment.
fn options(
    out_dir: PathBuf,
    precision: Precision,
    arch: Arch,
    agent: &AgentArgs,
) -> Result<compose::Options> {
    Ok(compose::Options {
        out_dir,
        precision,
        arch,
        jobs: jobs(None),
        user_table: table::user_table_path(),
        shipped_table: table::shipped_table_path(),
        cache_dir: nvcc::default_cache_dir(),
        exe: std::env::current_exe().context("cannot find the fact executable")?,
        protocol: Protocol::default(),
        // Step lines go to stderr, so a harness logging a `--json` run still sees where time goes.
        progress: true,
        max_candidates: None,
        space: crate::space::SpaceOptions::default(),
        refine: 4,
        light_share: 0.0,
        keep_slower: false,
        agent: agent.agent.clone(),
        agent_timeout: std::time::Duration::from_secs_f64(agent.agent_timeout),
        gpus: GpuChoice::All,
        matching: MatchOptions::default(),
        format: None,
        torchscript_copies: false,
        phases: compose::Phases::Both,
        small_rows: compose::SmallRows::Auto,
        steady: true,
    })
}

/// The compose.json of an output folder.
fn read_report(dir: &std::path::Path) -> Result<ComposeReport> {
    let path = dir.join(compose::REPORT);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{}: no compose report; run fact compose first",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("{}: unreadable", path.display()))
}

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

pub fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Compose {
            model,
            inputs,
            out,
            precision,
            arch,
            jobs: j,
            candidates,
            refine,
            light_share,
            gpus,
            no_bench,
            keep_slower,
            agent,
            save_report,
            without,
            fuse_siblings,
            no_patch_conv,
            small_rows,
            steady,
            format,
            torchscript_copy,
            quick,
            json,
        } => {
            let without = benchmark::parse_kinds(without.as_deref())?;
            let format: Option<compose::Format> = format
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(anyhow::Error::msg)?;
            let precision: Precision = precision.parse().map_err(anyhow::Error::msg)?;
            let (arch, _) = target(arch.as_deref())?;
            let inputs = inputs
                .iter()
                .map(|s| InputShape::parse(s))
                .collect::<Result<Vec<_>, _>>()
                .map_err(anyhow::Error::msg)?;
            let stem = model
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_else(|| "model".into());
            let out_dir = out.unwrap_or_else(|| PathBuf::from("out").join(stem));
            if !(0.0..=1.0).contains(&light_share) {
                anyhow::bail!("--light-share {light_share}: give a share of the model's time between 0 and 1 (0.01 is 1%; 0 sweeps every problem in full)");
            }
            let opts = compose::Options {
                jobs: jobs(j),
                max_candidates: candidates,
                refine,
                light_share,
                keep_slower,
                gpus: gpus.parse().map_err(anyhow::Error::msg)?,
                matching: MatchOptions {
                    fuse_siblings,
                    patch_conv: !no_patch_conv,
                },
                small_rows: small_rows.parse().map_err(anyhow::Error::msg)?,
                steady: match steady.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => anyhow::bail!("--steady takes on or off, not '{steady}'"),
                },
                format,
                torchscript_copies: !no_bench || torchscript_copy,
                phases: if quick {
                    compose::Phases::Quick
                } else {
                    compose::Phases::Both
                },
                ..options(out_dir.clone(), precision, arch, &agent)?
            };
            let report = compose::compose(&model, &inputs, &opts)
                .with_context(|| format!("composing {}", model.display()))?;
            // fact's benchmark runs the program without the libraries behind its custom ops.
            let unbenched = !report.custom_ops.is_empty() && !no_bench;
            if unbenched && report.gpu && report.composed.is_some() {
                eprintln!(
                    "not benchmarked: the program calls {}, which fact's benchmark cannot run without its library; time composed.pt2 where it is imported (docs/export.md)",
                    report.custom_ops.join(", ")
                );
            }
            let bench = if report.gpu && report.composed.is_some() && !no_bench && !unbenched {
                Some(benchmark::run_bench(
                    &report,
                    &out_dir,
                    save_report.as_deref(),
                    without,
                ))
            } else {
                None
            };
            // A failed benchmark leaves the composition standing: what was written is printed
            // first, then why the benchmark failed.
            let (bench, failed) = match bench {
                Some(Ok(b)) => (Some(b), None),
                Some(Err(e)) => (None, Some(e)),
                None => (None, None),
            };
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "compose": report, "bench": bench })
                    )?
                );
            } else {
                print_compose(&report, &out_dir);
                if let Some(b) = &bench {
                    print_bench(b);
                }
            }
            if let Some(e) = failed {
                return Err(e.context(Unbenched(format!(
                    "the composition is written to {} and its benchmark failed \
                     (`--no-bench` composes without it)",
                    out_dir.display()
                ))));
            }
            Ok(())
        }
        Command::Tune {
            dir,
            jobs: j,
            gpus,
            json,
        } => {
            let before = read_report(&dir)?;
            let agent = AgentArgs {
                agent: before.asked.agent.clone(),
                agent_timeout: 30.0,
            };
            let opts = compose::Options {
                jobs: jobs(j),
                gpus: gpus.parse().map_err(anyhow::Error::msg)?,
                format: Some(before.format),
                torchscript_copies: before.torchscript.is_some(),
                ..options(dir.clone(), before.precision, before.arch, &agent)?
            }
            .asking(&before.asked);
            let model = before.model.clone();
            if !model.is_file() {
                bail!(
                    "{}: the model {} it was composed from is gone; fact tune composes it again",
                    dir.join(compose::REPORT).display(),
                    model.display()
                );
            }
            let report = compose::tune(before, &opts)
                .with_context(|| format!("tuning {}", dir.display()))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_compose(&report, &dir);
            }
            Ok(())
        }
        Command::Bench {
            dir,
            save_report,
            without,
            json,
        } => {
            let without = benchmark::parse_kinds(without.as_deref())?;
            let report = read_report(&dir)?;
            if report.composed.is_none() {
                bail!("{} holds no composed module (compose ran without a GPU?); run fact compose on a GPU machine", dir.display());
            }
            if !report.custom_ops.is_empty() {
                bail!("{} calls {}, which fact's benchmark cannot run without its library: time composed.pt2 in Python where the library is imported (docs/export.md)", dir.display(), report.custom_ops.join(", "));
            }
            let b = benchmark::run_bench(&report, &dir, save_report.as_deref(), without)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&b)?);
            } else {
                print_bench(&b);
            }
            Ok(())
        }
        Command::Realize {
            rule,
            dtype,
            shape,
            epilogue,
            precision,
            arch,
            candidates,
            refine,
            hopeless,
            jobs: j,
            out,
            gpus,
            compile_only,
            agent,
            json,
        } => {
            if hopeless.is_nan() || hopeless < 1.0 {
                bail!("--hopeless {hopeless} must be at least 1 (the best estimate itself)");
            }
            let precision: Precision = precision.parse().map_err(anyhow::Error::msg)?;
            let dtype = DType::parse(&dtype)
                .with_context(|| format!("unknown dtype '{dtype}': use f32, bf16 or f16"))?;
            let (arch, device) = target(arch.as_deref())?;
            let dims = table::parse_shape(&shape).with_context(|| {
                format!("bad --shape '{shape}': write MxNxK (LxMxNxK for bmm_rrr, BxHxTqxTkxD for attention, ROWSxC for layernorm), e.g. 4096x4096x4096")
            })?;
            let mut problem = crate::kinds::registry::problem_from_rule(&rule, &dims, dtype)
                .map_err(anyhow::Error::msg)?;
            if let Some(text) = epilogue {
                let Some(p) = problem.get::<crate::kinds::gemm::GemmProblem>() else {
                    bail!("--epilogue goes with a GEMM rule, not {rule}");
                };
                let e = crate::kinds::gemm::Epilogue::parse(&text)
                    .map_err(|why| anyhow::anyhow!("bad --epilogue '{text}': {why}; write it as discover prints it, e.g. 'leaves=;v1=relu(v0)'"))?;
                problem = crate::kinds::gemm::GemmProblem {
                    epilogue: Some(e),
                    ..p.clone()
                }
                .into();
            }
            let opts = compose::Options {
                jobs: jobs(j),
                max_candidates: candidates,
                refine,
                keep_slower: true,
                gpus: gpus.parse().map_err(anyhow::Error::msg)?,
                space: crate::space::SpaceOptions {
                    hopeless,
                    ..Default::default()
                },
                ..options(
                    out.unwrap_or_else(|| PathBuf::from("out/realize")),
                    precision,
                    arch,
                    &agent,
                )?
            };
            let start = std::time::Instant::now();
            let tc = Toolchain::discover()?;
            let gpu = !compile_only && compose::tunes_here(arch, device.as_ref());
            if !gpu && !compile_only {
                let here = device.map_or("no CUDA device".to_string(), |d| {
                    format!("{} runs no {arch} kernels", d.label())
                });
                bail!(
                    "{here}: realize tunes on the GPU; run it on {} (the sources go to {})",
                    arch.gpus(),
                    opts.out_dir.display()
                );
            }
            let tables =
                std::sync::Mutex::new(Tables::load(&opts.user_table, &opts.shipped_table)?);
            let steward = std::sync::Mutex::new(opts.steward());
            let (pool, notes) = compose::gpu_pool(&opts, gpu)?;
            for n in &notes {
                eprintln!("gpus: {n}");
            }
            let cache_mark = tc.sccache_mark();
            // One problem, asked for by name: its sweep is a full one (no light or quick cut).
            let none = std::collections::BTreeSet::new();
            let cx = compose::RealizeCtx {
                opts: &opts,
                tc: &tc,
                compiler: &compose::NVCC,
                gpu,
                pool: &pool,
                light: &none,
                quick: false,
                singles: &none,
            };
            let sh = compose::Shared {
                tables: &tables,
                steward: &steward,
            };
            let r = compose::realize(cx, sh, &problem, &compose::Ahead::default())?;
            let steward = steward.into_inner().unwrap_or_else(|e| e.into_inner());
            for n in &steward.notes {
                eprintln!("agent: {n}");
            }
            let sccache = tc.sccache_report(cache_mark.as_ref());
            let seconds = start.elapsed().as_secs_f64();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "realization": r.how, "entry": r.entry, "seconds": seconds, "table": opts.user_table,
                        "sccache": sccache,
                    }))?
                );
            } else {
                println!(
                    "{} {} under {}: {}",
                    problem.rule_id(),
                    problem.shape_key(),
                    precision,
                    r.how.label()
                );
                if let Some(e) = &r.entry {
                    println!(
                        "  winner {} at {:.4} ms (torch {})",
                        e.winner,
                        e.winner_ms,
                        fmt_ms(e.baseline_ms())
                    );
                    println!(
                        "  entry {} in {}  ({seconds:.1} s)",
                        e.key.id(),
                        opts.user_table.display()
                    );
                }
                for f in &r.failures {
                    print!("{f}");
                }
                if let Some(c) = &sccache {
                    println!("  compile cache: {}", c.summary());
                }
            }
            Ok(())
        }
        Command::Table { command } => table_command(command),
        Command::Knowledge { command } => knowledge_command(command),
        Command::Discover {
            model,
            inputs,
            precision,
            arch,
            agent,
            fuse_siblings,
            no_patch_conv,
            json,
        } => {
            let precision: Precision = precision.parse().map_err(anyhow::Error::msg)?;
            let (arch, _) = target(arch.as_deref())?;
            let inputs = inputs
                .iter()
                .map(|s| InputShape::parse(s))
                .collect::<Result<Vec<_>, _>>()
                .map_err(anyhow::Error::msg)?;
            let (graph, inputs) = torch::load_graph(&model, &inputs)
                .with_context(|| format!("discovering {}", model.display()))?;
            let matches = crate::kinds::registry::match_patterns_with(
                &graph,
                &MatchOptions {
                    fuse_siblings,
                    patch_conv: !no_patch_conv,
                },
            );
            let tables = Tables::load(&table::user_table_path(), &table::shipped_table_path())?;
            let mut steward = options(PathBuf::new(), precision, arch, &agent)?.steward();
            let plan_opts = PlanOptions {
                arch,
                precision,
                assumed_speedup: 1.05,
            };
            let mut plan =
                crate::plan::plan(&graph, &matches, &plan_opts, Some(&tables), &mut steward);
            plan.source = torch::FrontEnd::of(&model)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "model": model, "inputs": inputs, "plan": plan })
                    )?
                );
            } else {
                print_plan(&model, &inputs, &plan);
            }
            Ok(())
        }
        Command::Doctor { json } => doctor::doctor(json),
        Command::Graph { model } => {
            print!("{}", torch::graph_text(&model)?);
            Ok(())
        }
        Command::PlotE2e {
            records,
            out,
            title,
            over,
        } => benchmark::plot_e2e(&records, &out, &title, &over),
        Command::TuneWorker => {
            let mut body = String::new();
            std::io::stdin().read_to_string(&mut body)?;
            let req: worker::Request =
                serde_json::from_str(&body).context("bad tune-worker request")?;
            worker::serve(req).map_err(anyhow::Error::msg)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_benchmark_after_the_composition_exits_apart_from_other_errors() {
        let cause = anyhow::anyhow!("CUDA error: out of memory");
        let unbenched = cause.context(Unbenched("the composition is written to out".into()));
        assert_eq!(exit_code(&unbenched), EXIT_UNBENCHED);
        assert_eq!(
            format!("{unbenched:#}"),
            "the composition is written to out: CUDA error: out of memory"
        );
        // Still told apart under a caller's context.
        assert_eq!(
            exit_code(&unbenched.context("composing m.pt2")),
            EXIT_UNBENCHED
        );
        let other = anyhow::anyhow!("no such file").context("composing m.pt2");
        assert_eq!(exit_code(&other), 1);
    }
}
