//! The `table` and `knowledge` commands: the pattern tables and the CUTLASS knowledge base, as
//! tables for people or JSON.

use super::show::fmt_ms;
use crate::kinds::gemm::GemmProblem;
use crate::nvcc::Toolchain;
use crate::table::{self, Entry, Table, Tables};
use crate::types::{DType, Precision};
use anyhow::{bail, Context, Result};
use clap::Subcommand;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub(super) enum KnowledgeCommand {
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
        /// The arch whose space to derive: sm80 or sm90.
        #[arg(long, default_value = "sm90")]
        arch: String,
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
pub(super) struct Filter {
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
            && self
                .dtype
                .as_ref()
                .is_none_or(|d| e.key.dtypes.a.short_name() == d)
            && self
                .arch
                .as_ref()
                .is_none_or(|a| e.key.arch.short_name() == a)
    }
}

#[derive(Subcommand)]
pub(super) enum TableCommand {
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
    /// Merge table files into OUT (OUT's own entries kept): both runs kept; the winner is the verified kernel fastest against torch in its own run, unless another ran more than 1% faster than it in the runs that timed both.
    Merge {
        files: Vec<PathBuf>,
        #[arg(long, short)]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Write an entry's sweep as an SVG scatter plot (efficiency vs speedup over torch).
    Plot { id: String, file: PathBuf },
    /// The validity rules learned from failures (scope, predicate, count, example).
    Rules {
        #[arg(long)]
        json: bool,
    },
    /// Shrink a table: keep each entry's runs and winner, the best N verified kernels of each
    /// family of each run (all their timings), every failure a learned rule counts or a sweep
    /// avoids; drop the rest. Winners and rules come out unchanged.
    Compact {
        /// The table to compact (default: the user table).
        file: Option<PathBuf>,
        /// Verified kernels kept per family per run, fastest first.
        #[arg(long, default_value_t = 3)]
        keep: usize,
        /// Write the compacted table here instead of over FILE.
        #[arg(long)]
        out: Option<PathBuf>,
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

pub(super) fn all_entries(tables: &Tables) -> Vec<(&'static str, &Entry)> {
    let user = tables.user.entries.iter().map(|e| ("user", e));
    let shipped = tables
        .shipped
        .entries
        .iter()
        .filter(|e| tables.user.get(&e.key).is_none())
        .map(|e| ("shipped", e));
    user.chain(shipped).collect()
}

pub(super) fn entry_summary(from: &str, e: &Entry) -> serde_json::Value {
    let p = e.winner_provenance();
    serde_json::json!({
        "id": e.key.id(), "table": from, "key": e.key, "bucket": e.key.bucket(), "winner": e.winner,
        "winner_ms": e.winner_ms, "torch_ms": e.baseline_ms(), "runs": e.runs.len(),
        "device": p.device.name, "cutlass": p.cutlass, "date": p.date,
    })
}

pub(super) fn knowledge_command(command: KnowledgeCommand) -> Result<()> {
    use crate::kinds::gemm::space::{self, Knowledge};
    match command {
        KnowledgeCommand::Show {
            rule,
            dtype,
            shape,
            precision,
            arch,
            json,
        } => {
            let arch = super::parse_arch(&arch)?;
            let version = Toolchain::discover()
                .map(|t| t.cutlass_version())
                .unwrap_or_else(|_| "unknown".into());
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
                    let dtype = DType::parse(&dtype).with_context(|| {
                        format!("unknown dtype '{dtype}': use f32, bf16 or f16")
                    })?;
                    let dims = table::parse_shape(&shape)
                        .with_context(|| format!("bad --shape '{shape}': write MxNxK"))?;
                    let p =
                        GemmProblem::from_rule(&rule, &dims, dtype).map_err(anyhow::Error::msg)?;
                    let math = crate::types::MathType::for_tensor(dtype, precision)
                        .context("no math for this dtype and precision")?;
                    let tables =
                        Tables::load(&table::user_table_path(), &table::shipped_table_path())?;
                    let key = table::TableKey::of(&p.clone().into(), math, arch);
                    let scope = key.scope(&version);
                    Some(space::derive(
                        &kb,
                        &p,
                        math,
                        arch,
                        &tables.rules(),
                        &scope,
                        &crate::space::SpaceOptions::default(),
                    ))
                }
                (None, None) => None,
                _ => bail!("give both --rule and --shape to derive a space"),
            };
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::json!({
                        "cutlass_version": kb.cutlass_version, "origin": kb.origin, "source": kb.source, "rows": counts, "note": note, "space": derived,
                    }))?
                );
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
                println!(
                    "derived space: {} candidates, {} pruned",
                    sp.candidates.len(),
                    sp.pruned.len()
                );
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
            let out = space::knowledge::refresh(&python, &script, site, &tc.cutlass_version())
                .map_err(anyhow::Error::msg)?;
            let kb = Knowledge::read(&out).map_err(anyhow::Error::msg)?;
            println!(
                "wrote {} ({} sm90 + {} sm80 rows, CUTLASS {})",
                out.display(),
                kb.sm90.len(),
                kb.sm80.len(),
                kb.cutlass_version
            );
            Ok(())
        }
    }
}

pub(super) fn table_command(command: TableCommand) -> Result<()> {
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
                    r.kind.label(),
                    r.count,
                    r.scope.rule,
                    r.scope.dtype,
                    r.scope.math.short_name(),
                    r.scope.arch,
                    r.scope.cutlass,
                    r.scope
                        .shape
                        .as_ref()
                        .map(|s| format!(" shape {s}"))
                        .unwrap_or_default()
                );
                println!("     when {}", r.predicate_text());
                println!(
                    "     e.g. {}",
                    r.example
                        .lines()
                        .find(|l| l.contains("error"))
                        .or_else(|| r.example.lines().next())
                        .unwrap_or("")
                        .trim()
                );
            }
            Ok(())
        }
        TableCommand::List { filter, json } => {
            let tables = Tables::load(&user_path, &shipped_path)?;
            let rows: Vec<_> = all_entries(&tables)
                .into_iter()
                .filter(|(_, e)| filter.keeps(e))
                .collect();
            if json {
                let v: Vec<_> = rows.iter().map(|(f, e)| entry_summary(f, e)).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            println!(
                "user table: {}
shipped table: {}",
                user_path.display(),
                shipped_path.display()
            );
            println!(
                "{:<9} {:<8} {:<14} {:<5} {:<5} {:<6} {:<18} {:>10} {:>9}  {:<24} winner",
                "id",
                "table",
                "rule",
                "dtype",
                "math",
                "arch",
                "shape",
                "kernel ms",
                "torch ms",
                "device"
            );
            for (from, e) in rows {
                println!(
                    "{:<9} {:<8} {:<14} {:<5} {:<5} {:<6} {:<18} {:>10.4} {:>9}  {:<24} {}",
                    e.key.id(),
                    from,
                    e.key.rule,
                    e.key.dtypes.a,
                    e.key.math.short_name(),
                    e.key.arch,
                    e.key.shape,
                    e.winner_ms,
                    fmt_ms(e.baseline_ms()),
                    e.winner_provenance().device.name,
                    e.winner
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
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "table": from, "entry": e })
                    )?
                );
                return Ok(());
            }
            println!(
                "{} [{}] ({from} table), bucket {}",
                e.key,
                e.key.id(),
                e.key.bucket()
            );
            println!("winner {} at {:.4} ms", e.winner, e.winner_ms);
            for (i, r) in e.runs.iter().enumerate() {
                let p = &r.provenance;
                println!(
                    "run {i}: {} ({} SMs), torch {}, nvcc {}, CUTLASS {}, fact {}, {}; torch {} ms",
                    p.device.name,
                    p.device.sm_count,
                    p.torch,
                    p.nvcc,
                    p.cutlass,
                    p.fact,
                    p.date,
                    fmt_ms(r.baseline.as_ref().map(|b| b.median_ms))
                );
                for c in &r.candidates {
                    println!(
                        "  {:<16} {:>10}  {}",
                        c.outcome.label(),
                        fmt_ms(c.outcome.median_ms()),
                        c.kernel
                    );
                }
            }
            Ok(())
        }
        TableCommand::Export { file, filter, json } => {
            let tables = Tables::load(&user_path, &shipped_path)?;
            let mut out = Table::new();
            for (_, e) in all_entries(&tables)
                .into_iter()
                .filter(|(_, e)| filter.keeps(e))
            {
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
            let e = tables
                .user
                .find_id(&id)
                .or_else(|_| tables.shipped.find_id(&id))?;
            crate::atomic::write(&file, crate::bench::plot::scatter_svg(e))
                .with_context(|| format!("writing {}", file.display()))?;
            println!(
                "{}: {} candidates of {}",
                file.display(),
                e.runs[e.winner_run].candidates.len(),
                e.key
            );
            Ok(())
        }
        TableCommand::Compact {
            file,
            keep,
            out,
            json,
        } => compact(file.unwrap_or(user_path), keep, out, json),
        TableCommand::Remove { id, json } => {
            let removed = Table::update(&user_path, |t| t.remove_id(&id))??;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "removed": removed.key, "id": removed.key.id() })
                    )?
                );
            } else {
                println!(
                    "removed {} [{}] from {}",
                    removed.key,
                    removed.key.id(),
                    user_path.display()
                );
            }
            Ok(())
        }
    }
}

/// `fact table compact`: in place under the table's lock, or into OUT under OUT's.
fn compact(file: PathBuf, keep: usize, out: Option<PathBuf>, json: bool) -> Result<()> {
    use crate::table::compact::CompactOptions;
    if keep == 0 {
        bail!("--keep 0 would keep no kernel but the winner: give 1 or more");
    }
    if !file.exists() {
        bail!(
            "{}: no such table file (nothing to compact)",
            file.display()
        );
    }
    let opts = CompactOptions { keep };
    let (stats, written) = match out {
        None => (
            Table::update(&file, |t| {
                let (c, stats) = t.compacted(&opts);
                *t = c;
                stats
            })?,
            file,
        ),
        Some(out) => {
            let (c, stats) = Table::load(&file)?.compacted(&opts);
            Table::update(&out, |t| *t = c)?;
            (stats, out)
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "table": written, "keep": keep, "stats": stats })
            )?
        );
        return Ok(());
    }
    let s = &stats;
    println!(
        "compacted {} (best {keep} of each family per run)",
        written.display()
    );
    println!(
        "  {} entries, {} runs; {} kept whole (their winner rests on every timing)",
        s.entries, s.runs, s.kept_whole
    );
    println!(
        "  candidates {} -> {} (verified {} -> {}, failures {} -> {})",
        s.candidates_before,
        s.candidates_after,
        s.verified_before,
        s.verified_after,
        s.failures_before,
        s.failures_after
    );
    println!(
        "  size {:.2} MB -> {:.2} MB",
        s.bytes_before as f64 / 1e6,
        s.bytes_after as f64 / 1e6
    );
    Ok(())
}

pub(super) fn report_count(json: bool, what: &str, n: usize, path: &Path) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ what: n, "table": path }))?
        );
    } else {
        println!("{what} {n} entries: {}", path.display());
    }
    Ok(())
}
