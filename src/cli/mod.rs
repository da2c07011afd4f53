//! The command line: the only place that parses arguments or prints. Tables for people, `--json`
//! for machines; errors are printed by main with their context chain.

use crate::bench::{self, BenchOptions, BenchReport};
use crate::compose::{self, ComposeReport, Realization};
use crate::nvcc::{self, Toolchain};
use crate::plan::{Plan, PlanOptions, UnmatchedGemm};
use crate::rules::{GemmProblem, PatternKind};
use crate::table::{self, Entry, Table, Tables};
use crate::types::DType;
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
        #[command(flatten)]
        agent: AgentArgs,
        #[arg(long)]
        json: bool,
    },
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
        /// Compile and tune at most this many kernels per pattern (default 12, best estimate first; the best 3 of each family always).
        #[arg(long)]
        candidates: Option<usize>,
        /// Tune launch knobs (raster, swizzle, K splits) of this many of each sweep's fastest kernels.
        #[arg(long, default_value_t = 4)]
        refine: usize,
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
        /// Pattern kinds to turn off one at a time (gemm, epilogue, attention; comma-separated,
        /// or none). Default: each kind the module substitutes, when it substitutes two or more.
        #[arg(long)]
        without: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Tune a rule for a shape and add the winner to the user pattern table, without a model.
    Realize {
        /// gemm_rcr, gemm_rcr_bias, gemm_rrr, gemm_rrr_bias, bmm_rrr; attention, attention_causal
        /// (the explicit softmax(q·kᵀ)·v form), sdpa or sdpa_causal.
        #[arg(long)]
        rule: String,
        /// Tensor dtype: f32, bf16 or f16.
        #[arg(long)]
        dtype: String,
        /// MxNxK, LxMxNxK for bmm_rrr, BxHxTqxTkxD (batch, heads, query and key lengths, head
        /// dim) for attention.
        #[arg(long)]
        shape: String,
        /// An elementwise program fused after the GEMM, in the text form discover prints
        /// (e.g. 'leaves=row;v1=gelu(v0);v2=mul(v1,l0)').
        #[arg(long)]
        epilogue: Option<String>,
        #[arg(long, default_value = "tf32")]
        precision: String,
        #[arg(long, default_value = "sm90")]
        arch: String,
        /// Compile and tune at most this many kernels (default 12, best estimate first; the best 3 of each family always).
        #[arg(long)]
        candidates: Option<usize>,
        /// Tune launch knobs (raster, swizzle, K splits) of this many of the fastest kernels.
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
    /// Draw the end-to-end figure of benchmark records: a list of {model, policy, eager_ms,
    /// traced_ms, compile_ms, fact_ms, ablations: [{without, ms}]} (what benches/device writes).
    PlotE2e {
        records: PathBuf,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "fact end to end")]
        title: String,
    },
    /// Internal: judges kernel variants for the tuner in a child process.
    #[command(hide = true)]
    TuneWorker,
}

#[derive(Subcommand)]
enum KnowledgeCommand {
    /// Which knowledge base is in use, its rows per arch and math; with --rule/--dtype/--shape,
    /// the space derived for that problem: candidates in estimate order and what was pruned, why.
    Show {
        #[arg(long)]
        rule: Option<String>,
        #[arg(long, default_value = "f32")]
        dtype: String,
        #[arg(long)]
        shape: Option<String>,
        #[arg(long, default_value = "tf32")]
        precision: String,
        #[arg(long)]
        json: bool,
    },
    /// Distil the installed CUTLASS's generator again (tools/distill_cutlass.py) into the user's
    /// data folder; used from then on for that CUTLASS version.
    Refresh {
        /// The Python that has cutlass_library (default: $FACT_PYTHON, else the setup's .venv).
        #[arg(long)]
        python: Option<PathBuf>,
    },
}

#[derive(clap::Args, Clone, Default)]
struct Filter {
    #[arg(long)]
    rule: Option<String>,
    #[arg(long)]
    dtype: Option<String>,
    #[arg(long)]
    arch: Option<String>,
}

impl Filter {
    fn keeps(&self, e: &Entry) -> bool {
        self.rule.as_ref().is_none_or(|r| &e.key.rule == r)
            && self.dtype.as_ref().is_none_or(|d| e.key.dtypes.a.short_name() == d)
            && self.arch.as_ref().is_none_or(|a| e.key.arch.short_name() == a)
    }
}

#[derive(Subcommand)]
enum TableCommand {
    /// The entries of the user and shipped tables (user first).
    List {
        #[command(flatten)]
        filter: Filter,
        #[arg(long)]
        json: bool,
    },
    /// One entry with every candidate of every run.
    Show {
        /// An entry id (or its first characters) from `fact table list`.
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Write the selected entries (user and shipped, merged) to a table file.
    Export {
        file: PathBuf,
        #[command(flatten)]
        filter: Filter,
        #[arg(long)]
        json: bool,
    },
    /// Merge a table file into the user table.
    Import {
        file: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Merge table files into OUT (OUT's own entries kept): both runs kept, the faster verified winner wins.
    Merge {
        files: Vec<PathBuf>,
        #[arg(long, short)]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Write an entry's sweep as an SVG scatter plot (efficiency vs speedup over torch).
    Plot {
        id: String,
        file: PathBuf,
    },
    /// The validity rules learned from failures (scope, predicate, count, example).
    Rules {
        #[arg(long)]
        json: bool,
    },
    /// Remove an entry from the user table.
    Remove {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

fn jobs(j: Option<usize>) -> usize {
    j.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2))
}

/// The realization options every command shares; the rest are defaults from the environment.
fn options(out_dir: PathBuf, precision: Precision, arch: Arch, agent: &AgentArgs, json: bool) -> Result<compose::Options> {
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
        progress: !json,
        max_candidates: None,
        space: crate::space::SpaceOptions::default(),
        refine: 4,
        keep_slower: false,
        agent: agent.agent.clone(),
        agent_timeout: std::time::Duration::from_secs_f64(agent.agent_timeout),
    })
}

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

pub fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Compose { model, inputs, out, precision, jobs: j, candidates, refine, no_bench, keep_slower, agent, save_report, without, json } => {
            let without = parse_kinds(without.as_deref())?;
            let precision: Precision = precision.parse().map_err(anyhow::Error::msg)?;
            let inputs = inputs.iter().map(|s| InputShape::parse(s)).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
            let stem = model.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_else(|| "model".into());
            let out_dir = out.unwrap_or_else(|| PathBuf::from("out").join(stem));
            let opts = compose::Options {
                jobs: jobs(j),
                max_candidates: candidates,
                refine,
                keep_slower,
                ..options(out_dir.clone(), precision, Arch::Sm90, &agent, json)?
            };
            let report = compose::compose(&model, &inputs, &opts).with_context(|| format!("composing {}", model.display()))?;
            let bench = if report.gpu && report.composed.is_some() && !no_bench {
                Some(run_bench(&report, &out_dir, save_report.as_deref(), without)?)
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
        Command::Bench { dir, save_report, without, json } => {
            let without = parse_kinds(without.as_deref())?;
            let path = dir.join(compose::REPORT);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("{}: no compose report; run fact compose first", path.display()))?;
            let report: ComposeReport = serde_json::from_str(&text).with_context(|| format!("{}: unreadable", path.display()))?;
            if report.composed.is_none() {
                bail!("{} holds no composed module (compose ran without a GPU?); run fact compose on a GPU machine", dir.display());
            }
            let b = run_bench(&report, &dir, save_report.as_deref(), without)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&b)?);
            } else {
                print_bench(&b);
            }
            Ok(())
        }
        Command::Realize { rule, dtype, shape, epilogue, precision, arch, candidates, refine, hopeless, jobs: j, out, agent, json } => {
            if hopeless.is_nan() || hopeless < 1.0 {
                bail!("--hopeless {hopeless} must be at least 1 (the best estimate itself)");
            }
            let precision: Precision = precision.parse().map_err(anyhow::Error::msg)?;
            let dtype = DType::parse(&dtype).with_context(|| format!("unknown dtype '{dtype}': use f32, bf16 or f16"))?;
            let arch = Arch::parse(&arch).with_context(|| format!("unknown arch '{arch}': use sm90"))?;
            let dims = table::parse_shape(&shape).with_context(|| {
                format!("bad --shape '{shape}': write MxNxK (LxMxNxK for bmm_rrr, BxHxTqxTkxD for attention), e.g. 4096x4096x4096")
            })?;
            let problem = if rule.starts_with("attention") || rule.starts_with("sdpa") {
                if epilogue.is_some() {
                    bail!("--epilogue goes with a GEMM rule, not {rule}");
                }
                crate::rules::Problem::Attention(crate::rules::AttentionProblem::from_rule(&rule, &dims, dtype).map_err(anyhow::Error::msg)?)
            } else {
                let mut problem = GemmProblem::from_rule(&rule, &dims, dtype).map_err(anyhow::Error::msg)?;
                if let Some(text) = epilogue {
                    let e = crate::rules::Epilogue::parse(&text)
                        .map_err(|why| anyhow::anyhow!("bad --epilogue '{text}': {why}; write it as discover prints it, e.g. 'leaves=;v1=relu(v0)'"))?;
                    problem.epilogue = Some(e);
                }
                crate::rules::Problem::Gemm(problem)
            };
            let opts = compose::Options {
                jobs: jobs(j),
                max_candidates: candidates,
                refine,
                keep_slower: true,
                space: crate::space::SpaceOptions { hopeless, ..Default::default() },
                ..options(out.unwrap_or_else(|| PathBuf::from("out/realize")), precision, arch, &agent, json)?
            };
            let start = std::time::Instant::now();
            let tc = Toolchain::discover()?;
            let gpu = torch::cuda_available();
            if !gpu {
                bail!("no CUDA device: realize tunes on the GPU; run it on an sm90 machine (the sources go to {})", opts.out_dir.display());
            }
            let mut tables = Tables::load(&opts.user_table, &opts.shipped_table)?;
            let mut steward = opts.steward();
            let r = compose::realize(&opts, &tc, &mut tables, &mut steward, &problem, gpu)?;
            for n in &steward.notes {
                eprintln!("agent: {n}");
            }
            let seconds = start.elapsed().as_secs_f64();
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "realization": r.how, "entry": r.entry, "seconds": seconds, "table": opts.user_table,
                    }))?
                );
            } else {
                println!("{} {} under {}: {}", problem.rule_id(), problem.shape_key(), precision, r.how.label());
                if let Some(e) = &r.entry {
                    println!("  winner {} at {:.4} ms (torch {})", e.winner, e.winner_ms, fmt_ms(e.baseline_ms()));
                    println!("  entry {} in {}  ({seconds:.1} s)", e.key.id(), opts.user_table.display());
                }
                for f in &r.failures {
                    print!("{f}");
                }
            }
            Ok(())
        }
        Command::Table { command } => table_command(command),
        Command::Knowledge { command } => knowledge_command(command),
        Command::Discover { model, inputs, precision, agent, json } => {
            let precision: Precision = precision.parse().map_err(anyhow::Error::msg)?;
            let inputs = inputs.iter().map(|s| InputShape::parse(s)).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
            let (graph, inputs) = torch::load_graph(&model, &inputs).with_context(|| format!("discovering {}", model.display()))?;
            let matches = crate::rules::match_patterns(&graph);
            let tables = Tables::load(&table::user_table_path(), &table::shipped_table_path())?;
            let mut steward = options(PathBuf::new(), precision, Arch::Sm90, &agent, json)?.steward();
            let plan_opts = PlanOptions { arch: Arch::Sm90, precision, assumed_speedup: 1.05 };
            let plan = crate::plan::plan(&graph, &matches, &plan_opts, Some(&tables), &mut steward);
            if json {
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "model": model, "inputs": inputs, "plan": plan }))?);
            } else {
                print_plan(&model, &inputs, &plan);
            }
            Ok(())
        }
        Command::Graph { model } => {
            print!("{}", torch::graph_text(&model)?);
            Ok(())
        }
        Command::PlotE2e { records, out, title } => {
            let text = std::fs::read_to_string(&records).with_context(|| format!("reading {}", records.display()))?;
            let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", records.display()))?;
            // A bare list of records, or {"meta": {...}, "records": [...]} as the harnesses write.
            let (list, meta) = match &v {
                serde_json::Value::Array(_) => (v.clone(), serde_json::Value::Null),
                _ => (v["records"].clone(), v["meta"].clone()),
            };
            let list: Vec<bench::SuiteRecord> = serde_json::from_value(list)
                .with_context(|| format!("{}: not a list of benchmark records (model, policy, eager_ms, …, fact_ms)", records.display()))?;
            if list.iter().all(|r| r.fact_ms.is_none()) {
                bail!("{}: no record has a fact_ms to draw", records.display());
            }
            let field = |k: &str| meta[k].as_str().unwrap_or("").to_string();
            let torch = field("torch");
            let subtitle = [field("device"), if torch.is_empty() { torch } else { format!("torch {torch}") }, field("date")]
                .into_iter()
                .filter(|f| !f.is_empty())
                .collect::<Vec<_>>()
                .join(", ");
            std::fs::write(&out, bench::suite_figure(&title, &subtitle, &list)).with_context(|| format!("writing {}", out.display()))?;
            println!("wrote {}", out.display());
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

fn print_plan(model: &Path, inputs: &[InputShape], plan: &Plan) {
    let shapes: Vec<String> = inputs.iter().map(InputShape::display).collect();
    println!("plan for {} ({}) on {}, precision {}, agent: {}", model.display(), shapes.join(", "), plan.arch, plan.precision, plan.agent);
    println!(
        "cost model: {:.3} ms estimated (tf32 {} TFLOP/s, bf16 {} TFLOP/s, DRAM {} TB/s, {} us a launch)",
        plan.total_est_ms, plan.ceilings.tf32_tflops, plan.ceilings.bf16_tflops, plan.ceilings.dram_tbps, plan.ceilings.launch_us
    );
    println!("{:<4} {:<4} {:<14} {:<22} {:>9} {:>7} {:>8} {:>9}  speedup source", "prio", "id", "rule", "shape", "est ms", "share", "speedup", "gain ms");
    for p in &plan.patterns {
        println!(
            "{:<4} {:<4} {:<14} {:<22} {:>9.4} {:>6.1}% {:>7.2}x {:>9.4}  {}",
            p.priority, p.id, p.rule, p.problem.shape_key(), p.est_ms, p.share * 100.0, p.expected_speedup, p.expected_gain_ms, p.speedup_source
        );
        println!("     {} ({}, {} {}), inputs {:?}", p.name, p.arch, p.dtype, p.math.map_or("-", |m| m.short_name()), p.input_shapes);
        for n in &p.notes {
            println!("     {n}");
        }
        for c in &p.copies {
            println!("     copy: {c}");
        }
        for e in &p.examples {
            println!("     example: {e}");
        }
    }
    println!("unmatched: {:.1}% of the estimated time", plan.unmatched_share * 100.0);
    for r in plan.unmatched.iter().take(8) {
        println!("  {:>6.1}%  {:>9.4} ms  {} ({} nodes)", r.share * 100.0, r.est_ms, r.name, r.nodes.len());
    }
    print_unmatched_gemms(&plan.unmatched_gemms);
    for n in &plan.agent_notes {
        println!("agent: {n}");
    }
}

fn print_unmatched_gemms(gemms: &[UnmatchedGemm]) {
    for u in gemms {
        let scope = if u.scope.is_empty() { String::new() } else { format!(" ({})", u.scope) };
        println!("  unmatched GEMM: node {} {}{scope}: {}", u.node, u.kind, u.reason);
    }
}

fn all_entries(tables: &Tables) -> Vec<(&'static str, &Entry)> {
    let user = tables.user.entries.iter().map(|e| ("user", e));
    let shipped = tables.shipped.entries.iter().filter(|e| tables.user.get(&e.key).is_none()).map(|e| ("shipped", e));
    user.chain(shipped).collect()
}

fn entry_summary(from: &str, e: &Entry) -> serde_json::Value {
    let p = e.winner_provenance();
    serde_json::json!({
        "id": e.key.id(), "table": from, "key": e.key, "bucket": e.key.bucket(), "winner": e.winner,
        "winner_ms": e.winner_ms, "torch_ms": e.baseline_ms(), "runs": e.runs.len(),
        "device": p.device.name, "cutlass": p.cutlass, "date": p.date,
    })
}

fn knowledge_command(command: KnowledgeCommand) -> Result<()> {
    use crate::space::{self, Knowledge};
    match command {
        KnowledgeCommand::Show { rule, dtype, shape, precision, json } => {
            let version = Toolchain::discover().map(|t| t.cutlass_version()).unwrap_or_else(|_| "unknown".into());
            let (kb, note) = Knowledge::for_cutlass(&version).map_err(anyhow::Error::msg)?;
            let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
            for r in &kb.sm90 {
                *counts.entry(format!("sm90 {}", r.math)).or_default() += 1;
            }
            for r in &kb.sm80 {
                *counts.entry(format!("sm80 {}", r.math)).or_default() += 1;
            }
            let derived = match (rule, shape) {
                (Some(rule), Some(shape)) => {
                    let precision: Precision = precision.parse().map_err(anyhow::Error::msg)?;
                    let dtype = DType::parse(&dtype).with_context(|| format!("unknown dtype '{dtype}': use f32, bf16 or f16"))?;
                    let dims = table::parse_shape(&shape).with_context(|| format!("bad --shape '{shape}': write MxNxK"))?;
                    let p = GemmProblem::from_rule(&rule, &dims, dtype).map_err(anyhow::Error::msg)?;
                    let math = crate::types::MathType::for_tensor(dtype, precision).context("no math for this dtype and precision")?;
                    let tables = Tables::load(&table::user_table_path(), &table::shipped_table_path())?;
                    let key = table::TableKey::gemm(&p, math, Arch::Sm90);
                    let scope = key.scope(&version);
                    Some(space::derive(&kb, &p, math, Arch::Sm90, &tables.rules(), &scope, &space::SpaceOptions::default()))
                }
                (None, None) => None,
                _ => bail!("give both --rule and --shape to derive a space"),
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({
                    "cutlass_version": kb.cutlass_version, "origin": kb.origin, "source": kb.source, "rows": counts, "note": note, "space": derived,
                }))?);
                return Ok(());
            }
            println!("{}", kb.describe());
            println!("  {}", kb.source);
            if let Some(n) = note {
                println!("  note: {n}");
            }
            for (k, n) in &counts {
                println!("  {k:<12} {n:>4} rows");
            }
            if let Some(sp) = derived {
                println!("derived space: {} candidates, {} pruned", sp.candidates.len(), sp.pruned.len());
                for (k, ms) in sp.candidates.iter().zip(&sp.estimates_ms) {
                    println!("  {ms:>9.4} ms  {}", k.name());
                }
                for p in &sp.pruned {
                    println!("  pruned {}: {}", p.kernel, p.reason);
                }
            }
            Ok(())
        }
        KnowledgeCommand::Refresh { python } => {
            let tc = Toolchain::discover()?;
            let root = PathBuf::from(env!("FACT_SOURCE_ROOT"));
            let python = python
                .or_else(|| std::env::var_os("FACT_PYTHON").map(PathBuf::from))
                .unwrap_or_else(|| root.join(".venv/bin/python"));
            let script = root.join("tools/distill_cutlass.py");
            // Import the cutlass_library that sits above the toolchain's CUTLASS headers, so the
            // knowledge matches what nvcc compiles against.
            let site = tc.cutlass.parent().and_then(Path::parent);
            let out = space::knowledge::refresh(&python, &script, site, &tc.cutlass_version()).map_err(anyhow::Error::msg)?;
            let kb = Knowledge::read(&out).map_err(anyhow::Error::msg)?;
            println!("wrote {} ({} sm90 + {} sm80 rows, CUTLASS {})", out.display(), kb.sm90.len(), kb.sm80.len(), kb.cutlass_version);
            Ok(())
        }
    }
}

fn table_command(command: TableCommand) -> Result<()> {
    let user_path = table::user_table_path();
    let shipped_path = table::shipped_table_path();
    match command {
        TableCommand::Rules { json } => {
            let tables = Tables::load(&user_path, &shipped_path)?;
            let rules = tables.rules();
            if json {
                println!("{}", serde_json::to_string_pretty(&rules)?);
                return Ok(());
            }
            if rules.is_empty() {
                println!("no validity rules learned yet (they come from failed variants of tuned sweeps)");
            }
            for (i, r) in rules.iter().enumerate() {
                println!(
                    "#{i:<3} {:<16} x{:<3} {} {} {} {} cutlass {}{}",
                    r.kind.label(), r.count, r.scope.rule, r.scope.dtype, r.scope.math.short_name(), r.scope.arch, r.scope.cutlass,
                    r.scope.shape.as_ref().map(|s| format!(" shape {s}")).unwrap_or_default()
                );
                println!("     when {}", r.predicate_text());
                println!("     e.g. {}", r.example.lines().find(|l| l.contains("error")).or_else(|| r.example.lines().next()).unwrap_or("").trim());
            }
            Ok(())
        }
        TableCommand::List { filter, json } => {
            let tables = Tables::load(&user_path, &shipped_path)?;
            let rows: Vec<_> = all_entries(&tables).into_iter().filter(|(_, e)| filter.keeps(e)).collect();
            if json {
                let v: Vec<_> = rows.iter().map(|(f, e)| entry_summary(f, e)).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            println!("user table: {}
shipped table: {}", user_path.display(), shipped_path.display());
            println!("{:<9} {:<8} {:<14} {:<5} {:<5} {:<6} {:<18} {:>10} {:>9}  {:<24} winner", "id", "table", "rule", "dtype", "math", "arch", "shape", "kernel ms", "torch ms", "device");
            for (from, e) in rows {
                println!(
                    "{:<9} {:<8} {:<14} {:<5} {:<5} {:<6} {:<18} {:>10.4} {:>9}  {:<24} {}",
                    e.key.id(), from, e.key.rule, e.key.dtypes.a, e.key.math.short_name(), e.key.arch, e.key.shape,
                    e.winner_ms, fmt_ms(e.baseline_ms()), e.winner_provenance().device.name, e.winner
                );
            }
            Ok(())
        }
        TableCommand::Show { id, json } => {
            let tables = Tables::load(&user_path, &shipped_path)?;
            let (from, e) = match tables.user.find_id(&id) {
                Ok(e) => ("user", e),
                Err(_) => ("shipped", tables.shipped.find_id(&id)?),
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "table": from, "entry": e }))?);
                return Ok(());
            }
            println!("{} [{}] ({from} table), bucket {}", e.key, e.key.id(), e.key.bucket());
            println!("winner {} at {:.4} ms", e.winner, e.winner_ms);
            for (i, r) in e.runs.iter().enumerate() {
                let p = &r.provenance;
                println!(
                    "run {i}: {} ({} SMs), torch {}, nvcc {}, CUTLASS {}, fact {}, {}; torch {} ms",
                    p.device.name, p.device.sm_count, p.torch, p.nvcc, p.cutlass, p.fact, p.date,
                    fmt_ms(r.baseline.as_ref().map(|b| b.median_ms))
                );
                for c in &r.candidates {
                    println!("  {:<16} {:>10}  {}", c.outcome.label(), fmt_ms(c.outcome.median_ms()), c.kernel);
                }
            }
            Ok(())
        }
        TableCommand::Export { file, filter, json } => {
            let tables = Tables::load(&user_path, &shipped_path)?;
            let mut out = Table::new();
            for (_, e) in all_entries(&tables).into_iter().filter(|(_, e)| filter.keeps(e)) {
                out.insert_merged(e.clone());
            }
            out.save(&file)?;
            report_count(json, "exported", out.entries.len(), &file)
        }
        TableCommand::Import { file, json } => {
            if !file.exists() {
                bail!("{}: no such table file", file.display());
            }
            let incoming = Table::load(&file)?;
            Table::update(&user_path, |t| t.merge(&incoming))?;
            report_count(json, "imported", incoming.entries.len(), &user_path)
        }
        TableCommand::Merge { files, out, json } => {
            let mut loaded = Vec::new();
            for f in &files {
                if !f.exists() {
                    bail!("{}: no such table file", f.display());
                }
                loaded.push(Table::load(f)?);
            }
            let n = Table::update(&out, |t| {
                for l in &loaded {
                    t.merge(l);
                }
                t.entries.len()
            })?;
            report_count(json, "merged", n, &out)
        }
        TableCommand::Plot { id, file } => {
            let tables = Tables::load(&user_path, &shipped_path)?;
            let e = tables.user.find_id(&id).or_else(|_| tables.shipped.find_id(&id))?;
            std::fs::write(&file, crate::bench::plot::scatter_svg(e)).with_context(|| format!("writing {}", file.display()))?;
            println!("{}: {} candidates of {}", file.display(), e.runs[e.winner_run].candidates.len(), e.key);
            Ok(())
        }
        TableCommand::Remove { id, json } => {
            let removed = Table::update(&user_path, |t| t.remove_id(&id))??;
            if json {
                println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "removed": removed.key, "id": removed.key.id() }))?);
            } else {
                println!("removed {} [{}] from {}", removed.key, removed.key.id(), user_path.display());
            }
            Ok(())
        }
    }
}

fn report_count(json: bool, what: &str, n: usize, path: &Path) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ what: n, "table": path }))?);
    } else {
        println!("{what} {n} entries: {}", path.display());
    }
    Ok(())
}

/// `--without`'s kinds: None for the default (each kind substituted, when two or more are).
fn parse_kinds(text: Option<&str>) -> Result<Option<Vec<PatternKind>>> {
    let Some(text) = text else { return Ok(None) };
    if text == "none" {
        return Ok(Some(vec![]));
    }
    text.split(',').map(|k| k.trim().parse::<PatternKind>()).collect::<Result<Vec<_>, _>>().map(Some).map_err(anyhow::Error::msg)
}

fn run_bench(report: &ComposeReport, out_dir: &Path, save: Option<&Path>, without: Option<Vec<PatternKind>>) -> Result<BenchReport> {
    let tc = Toolchain::discover()?;
    let patterns: Vec<bench::PatternTime> = report
        .patterns
        .iter()
        .filter_map(|p| {
            Some(bench::PatternTime {
                id: p.id.clone(),
                kind: p.problem.kind(),
                rule: p.rule.clone(),
                kernel: p.kernel.clone()?,
                kernel_ms: p.kernel_ms,
                torch_ms: p.torch_ms,
            })
        })
        .collect();
    let mut kinds: Vec<PatternKind> = patterns.iter().map(|p| p.kind).collect();
    kinds.sort();
    kinds.dedup();
    let without = without.unwrap_or_else(|| if kinds.len() >= 2 { kinds.clone() } else { vec![] });
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
        kernels: report.patterns.iter().filter_map(|p| p.kernel.clone()).collect(),
        without,
        patterns,
    };
    let b = bench::bench(&opts).map_err(anyhow::Error::msg).context("benchmarking")?;
    let text = serde_json::to_string_pretty(&b)? + "\n";
    let path = out_dir.join("report.json");
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    let svg = out_dir.join("e2e.svg");
    std::fs::write(&svg, bench::e2e_figure(&b)).with_context(|| format!("writing {}", svg.display()))?;
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
        let how = p.realization.label();
        println!(
            "{:<4} {:<14} {:<16} {:<5} {:<22} {:>10} {:>10}  {}",
            p.id,
            p.rule,
            p.problem.shape_key(),
            p.problem.dtype(),
            how,
            fmt_ms(p.kernel_ms),
            fmt_ms(p.torch_ms),
            p.kernel.as_deref().unwrap_or("-")
        );
        if let Realization::Skipped { reason } = &p.realization {
            println!("     {reason}");
        }
        for c in &p.copies {
            println!("     copy: {c}");
        }
    }
    print_unmatched_gemms(&r.unmatched_gemms);
    if r.patterns.is_empty() {
        println!("  no GEMM pattern matched; the model is left as it is");
    }
    for f in &r.compile_failures {
        print!("{f}");
    }
    if !r.gpu {
        let compiled = r.patterns.iter().filter(|p| matches!(p.realization, Realization::Compiled { .. })).count();
        let hits = r.patterns.iter().filter(|p| p.kernel.is_some()).count();
        println!("\nno CUDA device: tuning and benchmarking need an sm90 GPU.");
        println!("  discovered {} pattern(s); {hits} realized from the pattern tables (winners built)", r.patterns.len());
        if compiled > 0 {
            println!(
                "  {compiled} need tuning: their candidate kernels are rendered and compiled under {}/sweeps/; \
                 run the same command on an sm90 machine to tune, compose and benchmark them",
                out_dir.display()
            );
        }
        if r.composed.is_some() {
            println!("  the composed module runs fact's kernels on an sm90 GPU; elsewhere fact::gemm falls back to torch");
        }
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
    for a in &b.ablations {
        println!("{:<10} {:>11.4} {:>8.1}% {:>11} {:>13.2e}  (without {}: {:.2}x the composed time)", format!("-{}", a.without), a.ms, a.timing.spread * 100.0, "", a.max_rel_err, a.without, a.slowdown);
    }
    for p in &b.patterns {
        println!("  {} {:<9} {}: kernel {} ms, torch {} ms", p.id, p.kind.name(), p.kernel, fmt_ms(p.kernel_ms), fmt_ms(p.torch_ms));
    }
    for (kernel, c) in &b.op_calls {
        println!("  {kernel}: ran {} calls ({} on a copied operand), fell back {}", c.ran, c.copied, c.fell_back);
    }
}
