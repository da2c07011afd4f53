//! What the commands print for people: the plan, the compose table and the bench.

use crate::bench::BenchReport;
use crate::compose::{self, ComposeReport, Realization};
use crate::plan::{Plan, UnmatchedGemm};
use crate::torch::InputShape;
use crate::types::Arch;
use std::path::Path;

pub(super) fn print_plan(model: &Path, inputs: &[InputShape], plan: &Plan) {
    let shapes: Vec<String> = inputs.iter().map(InputShape::display).collect();
    println!(
        "plan for {} ({}) on {}, precision {}, agent: {}",
        model.display(),
        shapes.join(", "),
        plan.arch,
        plan.precision,
        plan.agent
    );
    if plan.source.is_pt2() {
        let form = if plan.source.dialect == "ATEN" {
            "ATEN IR, decomposed by run_decompositions(): fact matches the aten ops a trace spells too, and a pattern decomposed past them (SDPA into bmm and softmax) stays torch's; export without run_decompositions() for the most patterns"
        } else {
            "the IR torch.export.export returns, not decomposed further"
        };
        println!("read as a torch.export program (.pt2, {form})");
    }
    if !plan.source.dynamic.is_empty() {
        println!(
            "dynamic: {}; each pattern is tuned at the sample's sizes, and its kernel runs every size in the range it implements, falling back to torch's ops for the others (counted per call: fact_op_stats)",
            plan.source.dynamic.join("; ")
        );
        if plan.source.past_sample {
            println!(
                "a call past the sample's sizes runs kernels tuned at the sample's, which can lose there (a GEMM's tiles fill the GPU's waves at the rows they were tuned at): export at the largest batch and length you serve (docs/export.md)"
            );
        }
    }
    println!(
        "cost model: {:.3} ms estimated (tf32 {} TFLOP/s, bf16 {} TFLOP/s, DRAM {} TB/s, {} us a launch)",
        plan.total_est_ms, plan.ceilings.tf32_tflops, plan.ceilings.bf16_tflops, plan.ceilings.dram_tbps, plan.ceilings.launch_us
    );
    println!(
        "{:<4} {:<4} {:<14} {:<22} {:>9} {:>7} {:>8} {:>9}  speedup source",
        "prio", "id", "rule", "shape", "est ms", "share", "speedup", "gain ms"
    );
    for p in &plan.patterns {
        println!(
            "{:<4} {:<4} {:<14} {:<22} {:>9.4} {:>6.1}% {:>7.2}x {:>9.4}  {}",
            p.priority,
            p.id,
            p.rule,
            p.problem.shape_key(),
            p.est_ms,
            p.share * 100.0,
            p.expected_speedup,
            p.expected_gain_ms,
            p.speedup_source
        );
        println!(
            "     {} ({}, {} {}), inputs {:?}",
            p.name,
            p.arch,
            p.dtype,
            p.math.map_or("-", |m| m.short_name()),
            p.input_shapes
        );
        for n in &p.notes {
            println!("     {n}");
        }
        for c in &p.copies {
            println!("     copy: {c}");
        }
        if let Some(pad) = &p.pad {
            println!("     pad: {pad}");
        }
        for e in &p.examples {
            println!("     example: {e}");
        }
    }
    if plan.memo_ops > 0 {
        println!(
            "memo: {:.1}% of the estimated time, {} ops computed once per input shape (masks, positions, rotary tables)",
            plan.memo_share * 100.0,
            plan.memo_ops
        );
    }
    println!(
        "unmatched: {:.1}% of the estimated time",
        plan.unmatched_share * 100.0
    );
    for r in plan.unmatched.iter().take(8) {
        println!(
            "  {:>6.1}%  {:>9.4} ms  {} ({} nodes)",
            r.share * 100.0,
            r.est_ms,
            r.name,
            r.nodes.len()
        );
    }
    print_unmatched_gemms(&plan.unmatched_gemms);
    if !plan.shapes.is_empty() {
        println!("shapes: {}", plan.shapes);
    }
    for n in &plan.agent_notes {
        println!("agent: {n}");
    }
}

pub(super) fn print_unmatched_gemms(gemms: &[UnmatchedGemm]) {
    for u in gemms {
        let scope = if u.scope.is_empty() {
            String::new()
        } else {
            format!(" ({})", u.scope)
        };
        let what = if u.kind == "aten::scaled_dot_product_attention" {
            "attention"
        } else {
            "GEMM"
        };
        println!(
            "  unmatched {what}: node {} {}{scope}: {}",
            u.node, u.kind, u.reason
        );
    }
}

pub(super) fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.4}"))
}

/// What each phase took, what the full one changed, and what is left for `fact tune`.
fn print_phases(r: &ComposeReport, out_dir: &Path) {
    for p in &r.phases {
        println!(
            "  {} phase: {:.0} s, {:.0} s compiling ({} kernels in {} units), {} sweeps",
            p.phase, p.seconds, p.nvcc_s, p.kernels, p.units, p.sweeps
        );
    }
    for c in &r.changes {
        println!(
            "  {}: {} ({}) -> {} ({})",
            c.id,
            c.kernel_before.as_deref().unwrap_or("torch"),
            fmt_ms(c.ms_before),
            c.kernel_after.as_deref().unwrap_or("torch"),
            fmt_ms(c.ms_after)
        );
    }
    if r.phase == compose::Phase::Quick && r.sweeps_left > 0 {
        println!(
            "  quick: {} problem(s) left to the full phase (sweeps, winners measured on another GPU); `fact tune {}` runs it and rewrites what it changes",
            r.sweeps_left,
            out_dir.display()
        );
    }
}

pub(super) fn print_compose(r: &ComposeReport, out_dir: &Path) {
    println!(
        "fact compose {} ({} precision, {})",
        r.model.display(),
        r.precision,
        r.arch
    );
    if !r.custom_ops.is_empty() {
        println!(
            "  custom ops: {} (other libraries': the composed program calls them as the original did; import their library before loading it)",
            r.custom_ops.join(", ")
        );
    }
    if !r.graph_note.is_empty() {
        println!("  shapes: {}", r.graph_note);
    }
    if r.gpus.len() > 1 {
        let which: Vec<String> = r
            .gpus
            .iter()
            .map(|g| g.index.map_or("GPU?".into(), |i| format!("GPU{i}")))
            .collect();
        println!(
            "  tuned on {} GPUs ({}, {})",
            r.gpus.len(),
            which.join(", "),
            r.gpus[0].name
        );
    }
    for n in &r.gpu_notes {
        println!("  gpus: {n}");
    }
    println!(
        "{:<4} {:<14} {:<16} {:<5} {:<22} {:>10} {:>10}  kernel",
        "id", "rule", "shape MxNxK", "dtype", "realized", "kernel ms", "torch ms"
    );
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
        if let Some(s) = &p.small_rows {
            let runs = match s.choice() {
                Some("torch") => "torch's ops (faster there)",
                Some(k) => k,
                None => "the pattern's own kernel (nothing measured there)",
            };
            println!(
                "     up to {} rows: {runs}  ({} ms, torch {} ms at {} rows)",
                s.upto,
                fmt_ms(s.kernel_ms),
                fmt_ms(s.torch_ms),
                s.rows
            );
        }
        if let Some(s) = &p.steady {
            println!(
                "     past the sample's rows: this kernel, not the winner {} ({:.4} against {:.4} ms at {} rows; over {} rows {:.4} against {:.4} ms by their waves)",
                s.winner,
                s.kernel_ms,
                s.winner_ms,
                s.rows[0],
                s.rows.iter().map(i64::to_string).collect::<Vec<_>>().join(", "),
                s.weighed_ms,
                s.winner_weighed_ms
            );
        }
    }
    print_unmatched_gemms(&r.unmatched_gemms);
    print_phases(r, out_dir);
    if r.patterns.is_empty() {
        println!("  no GEMM pattern matched; the model is left as it is");
    }
    for f in &r.compile_failures {
        print!("{f}");
    }
    if !r.gpu {
        let compiled = r
            .patterns
            .iter()
            .filter(|p| matches!(p.realization, Realization::Compiled { .. }))
            .count();
        let hits = r.patterns.iter().filter(|p| p.kernel.is_some()).count();
        let here = r.device.as_ref().map_or("no CUDA device".to_string(), |d| {
            format!("{} runs no {} kernels", d.label(), r.arch)
        });
        println!(
            "\n{here}: tuning and benchmarking {} kernels need {}.",
            r.arch,
            r.arch.gpus()
        );
        println!(
            "  discovered {} pattern(s); {hits} realized from the pattern tables (winners built)",
            r.patterns.len()
        );
        if compiled > 0 {
            println!(
                "  {compiled} need tuning: their candidate kernels are rendered and compiled under {}/sweeps/; \
                 run the same command there to tune, compose and benchmark them",
                out_dir.display()
            );
        }
        if r.composed.is_some() {
            println!("  the composed module runs fact's kernels on {}; elsewhere its ops fall back to torch", r.arch.gpus());
        }
    } else if let Some(d) = r
        .device
        .as_ref()
        .filter(|d| Arch::from_capability(d.capability.0, d.capability.1) != Some(r.arch))
    {
        println!(
            "\n{} kernels were tuned on {} through their PTX: the table entries record this device, so an {} GPU re-verifies the winners it takes from them",
            r.arch,
            d.label(),
            r.arch
        );
    }
    if let (Some(c), Some(l)) = (&r.composed, &r.library) {
        println!(
            "\ncomposed module: {}\nop library:      {}",
            c.display(),
            l.display()
        );
        match (r.format, &r.torchscript) {
            // fact.load runs the TorchScript copy eagerly: the program's module issues each op
            // from Python (docs/python.md).
            (compose::Format::Pt2, Some(_)) => println!(
                "load in python:  import fact; m = fact.load(\"{}\")  (eagerly its TorchScript copy; m.program: the torch.export program)",
                c.parent().unwrap_or(out_dir).display()
            ),
            (compose::Format::Pt2, None) => println!(
                "load in python:  torch.ops.load_library(\"{}\"); m = torch.export.load(\"{}\").module()",
                l.display(),
                c.display()
            ),
            (compose::Format::Torchscript, _) => println!(
                "load in python:  torch.ops.load_library(\"{}\"); m = torch.jit.load(\"{}\")",
                l.display(),
                c.display()
            ),
        }
    }
    if let Some(c) = &r.sccache {
        println!("compile cache: {}", c.summary());
    }
    println!(
        "report: {}  ({:.1} s)",
        out_dir.join(compose::REPORT).display(),
        r.seconds
    );
}

pub(super) fn print_bench(b: &BenchReport) {
    println!(
        "\nbench on {} ({} SMs), torch {}, CUDA {}, CUTLASS {}, precision {}",
        b.device.name, b.device.sm_count, b.torch, b.cuda, b.cutlass, b.precision
    );
    println!(
        "{:<10} {:>11} {:>9} {:>11} {:>13}",
        "module", "median ms", "spread", "GEMM TF/s", "rel err fp64"
    );
    println!(
        "{:<10} {:>11.4} {:>8.1}% {:>11.1} {:>13.2e}",
        "torch",
        b.baseline_ms,
        b.baseline.spread * 100.0,
        b.baseline_tflops,
        b.baseline_rel_err
    );
    println!(
        "{:<10} {:>11.4} {:>8.1}% {:>11.1} {:>13.2e}",
        "fact",
        b.fact_ms,
        b.fact.spread * 100.0,
        b.fact_tflops,
        b.max_rel_err
    );
    println!("speedup {:.3}x", b.speedup);
    for a in &b.ablations {
        println!(
            "{:<10} {:>11.4} {:>8.1}% {:>11} {:>13.2e}  (without {}: {:.2}x the composed time)",
            format!("-{}", a.without),
            a.ms,
            a.timing.spread * 100.0,
            "",
            a.max_rel_err,
            a.without,
            a.slowdown
        );
    }
    for p in &b.patterns {
        println!(
            "  {} {:<9} {}: kernel {} ms, torch {} ms",
            p.id,
            p.kind.name(),
            p.kernel,
            fmt_ms(p.kernel_ms),
            fmt_ms(p.torch_ms)
        );
    }
    for (kernel, c) in &b.op_calls {
        let why = c
            .why
            .as_deref()
            .map(|w| format!(" (last: {w})"))
            .unwrap_or_default();
        println!(
            "  {kernel}: ran {} calls ({} on a copied operand), fell back {}{why}",
            c.ran, c.copied, c.fell_back
        );
    }
}
