//! The sweep scatter plot for people: one point per timed candidate, its efficiency (achieved
//! TFLOP/s over the arch's datasheet peak for the math type) against its speedup over torch in the
//! same run, the winner marked, failures counted in the caption. Plain SVG, no dependencies.

use crate::table::Entry;
use crate::tune::Outcome;
use crate::types::{Arch, MathType};

/// Dense peak of the arch's reference GPU from its data sheet, TFLOP/s: the tensor cores' for
/// their maths, the CUDA cores' for fp32.
pub fn peak_tflops(arch: Arch, math: MathType) -> f64 {
    let h = arch.hardware();
    match math {
        MathType::Tf32 => h.peak_tf32_tflops,
        // Three tensor-core products per fp32-accurate multiply: on sm90 the bf16 split is the
        // fastest, sm80 has 3xTF32 alone.
        MathType::Tf32x3 => match arch {
            Arch::Sm80 => h.peak_tf32_tflops / 3.0,
            Arch::Sm90 => h.peak_bf16_tflops / 3.0,
        },
        MathType::Bf16 | MathType::F16 => h.peak_bf16_tflops,
        MathType::F32 => h.peak_fp32_tflops,
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The scatter plot of an entry's winning run.
pub fn scatter_svg(e: &Entry) -> String {
    let run = &e.runs[e.winner_run];
    let peak = peak_tflops(e.key.arch, e.key.math);
    let base = run.baseline.as_ref().map(|b| b.median_ms);
    let points: Vec<(f64, f64, &str)> = run
        .candidates
        .iter()
        .filter_map(|c| match &c.outcome {
            Outcome::Ok { timing, tflops, .. } => Some((
                tflops / peak * 100.0,
                base.map_or(0.0, |b| b / timing.median_ms),
                c.kernel.as_str(),
            )),
            _ => None,
        })
        .collect();
    let failed = run.candidates.len() - points.len();
    let (w, h, l, r, t, b) = (720.0, 460.0, 70.0, 30.0, 50.0, 70.0);
    // Efficiency spans 0–100% of peak; speedup is rounded up to a quarter above the best point.
    let xmax = 100.0;
    let ymax = ((points.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1) * 4.0).ceil() / 4.0;
    let x = |v: f64| l + v / xmax * (w - l - r);
    let y = |v: f64| h - b - v / ymax * (h - t - b);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{l}\" y=\"20\" font-size=\"14\">{}</text>\n\
         <text x=\"{l}\" y=\"38\" fill=\"#555\">{}: {} candidates timed, {failed} failed</text>\n",
        esc(&e.key.to_string()),
        esc(&run.provenance.device.name),
        points.len()
    );
    for i in 0..=5 {
        let xv = xmax * i as f64 / 5.0;
        let yv = ymax * i as f64 / 5.0;
        s += &format!(
            "<line x1=\"{:.1}\" y1=\"{t}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{xv:.0}%</text>\n\
             <line x1=\"{l}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{yv:.2}x</text>\n",
            x(xv), x(xv), h - b, x(xv), h - b + 18.0, y(yv), w - r, y(yv), l - 6.0, y(yv) + 4.0
        );
    }
    s += &format!(
        "<line x1=\"{l}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#999\" stroke-dasharray=\"5,4\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#666\" text-anchor=\"end\">torch {}</text>\n",
        y(1.0), w - r, y(1.0), w - r, y(1.0) - 5.0, base.map_or("-".to_string(), |b| format!("{b:.4} ms"))
    );
    s += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">efficiency: achieved TFLOP/s over the {} peak ({peak} TFLOP/s)</text>\n\
         <text transform=\"translate(18,{:.1}) rotate(-90)\" text-anchor=\"middle\">speedup over torch (same run)</text>\n",
        (l + w - r) / 2.0, h - 28.0, e.key.math.short_name(), (t + h - b) / 2.0
    );
    for (ex, sp, name) in &points {
        let win = *name == e.winner;
        s += &format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"{}\" fill=\"{}\" fill-opacity=\"0.8\"><title>{} {ex:.1}% {sp:.3}x</title></circle>\n",
            x(*ex), y(*sp), if win { 7 } else { 4 }, if win { "#d62728" } else { "#1f77b4" }, esc(name)
        );
        if win {
            s += &format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#d62728\">winner {} ({:.4} ms)</text>\n",
                l + 10.0,
                t + 16.0,
                esc(name),
                e.winner_ms
            );
        }
    }
    s + "</svg>\n"
}

/// One group of bars in the end-to-end figure: a model under a policy, its modules' times.
#[derive(Clone, Debug, PartialEq)]
pub struct BarGroup {
    pub label: String,
    /// (module, median ms); the first is the reference the speedups are over.
    pub bars: Vec<(String, f64)>,
    /// A line under the bars: what is missing and why (a failed stage).
    pub note: Option<String>,
}

/// The end-to-end figure: per group, a horizontal bar per module, its length the speedup over the
/// group's first module, labelled with the speedup and the time, and the group's note. Each line
/// of `subtitle` is a line under the title.
pub fn e2e_svg(title: &str, subtitle: &str, groups: &[BarGroup]) -> String {
    let lines: Vec<&str> = subtitle.lines().collect();
    let (w, l, r, bar, gap) = (760.0, 250.0, 150.0, 18.0, 26.0);
    let top = 46.0 + 18.0 * lines.len().max(1) as f64;
    let rows: usize = groups
        .iter()
        .map(|g| g.bars.len() + usize::from(g.note.is_some()))
        .sum();
    let h = top + rows as f64 * bar + groups.len() as f64 * gap + 40.0;
    let speedups = |g: &BarGroup| -> Vec<f64> {
        let base = g.bars.first().map_or(f64::NAN, |b| b.1);
        g.bars.iter().map(|b| base / b.1).collect()
    };
    let best = groups
        .iter()
        .flat_map(speedups)
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max);
    let xmax = (best * 1.1 * 2.0).ceil() / 2.0;
    let x = |v: f64| l + v / xmax * (w - l - r);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h:.0}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n",
        esc(title)
    );
    for (i, line) in lines.iter().enumerate() {
        s += &format!(
            "<text x=\"10\" y=\"{}\" fill=\"#555\">{}</text>\n",
            38 + 18 * i,
            esc(line)
        );
    }
    for i in 0..=(xmax * 2.0) as usize {
        let v = i as f64 / 2.0;
        s += &format!(
            "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{v}x</text>\n",
            x(v), top - 8.0, x(v), h - 30.0, if v == 1.0 { "#999" } else { "#eee" }, x(v), h - 14.0
        );
    }
    let mut y = top;
    for g in groups {
        s += &format!(
            "<text x=\"10\" y=\"{:.1}\" font-weight=\"bold\">{}</text>\n",
            y + 4.0,
            esc(&g.label)
        );
        y += 10.0;
        for ((name, ms), sp) in g.bars.iter().zip(speedups(g)) {
            let fact = name.starts_with("fact");
            let fill = if name == "fact" {
                "#d62728"
            } else if fact {
                "#f4a582"
            } else {
                "#1f77b4"
            };
            let len = if sp.is_finite() { x(sp) - l } else { 0.0 };
            s += &format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text><rect x=\"{l}\" y=\"{y:.1}\" width=\"{len:.1}\" height=\"{:.1}\" fill=\"{fill}\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\">{sp:.2}x ({ms:.3} ms)</text>\n",
                l - 6.0, y + bar - 5.0, esc(name), bar - 3.0, l + len + 4.0, y + bar - 5.0
            );
            y += bar;
        }
        if let Some(note) = &g.note {
            s += &format!(
                "<text x=\"{l}\" y=\"{:.1}\" fill=\"#888\">{}</text>\n",
                y + bar - 5.0,
                esc(note)
            );
            y += bar;
        }
        y += gap - 10.0;
    }
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::gemm::space::gemm_candidates;
    use crate::kinds::gemm::{GemmLayout, GemmProblem};
    use crate::table::CandidateResult;
    use crate::table::{Provenance, Run, TableKey};
    use crate::tune::cuda::DeviceInfo;
    use crate::tune::Timing;
    use crate::types::DType;

    #[test]
    fn every_timed_candidate_is_a_point_and_the_winner_is_marked() {
        let p = GemmProblem {
            m: 4096,
            n: 4096,
            k: 4096,
            layout: GemmLayout::Rrr,
            dtype: DType::F32,
            bias: false,
            batch: 1,
            epilogue: None,
            padded_from: None,
        };
        let specs = gemm_candidates(&p, MathType::Tf32, Arch::Sm90);
        let t = |ms: f64| Timing {
            median_ms: ms,
            min_ms: ms,
            max_ms: ms,
            spread: 0.0,
            samples: 1,
        };
        let cands = vec![
            CandidateResult {
                kernel: specs[0].name(),
                spec: specs[0].clone().into(),
                outcome: Outcome::Ok {
                    max_rel_err: 1e-4,
                    timing: t(0.5),
                    tflops: 275.0,
                },
            },
            CandidateResult {
                kernel: specs[1].name(),
                spec: specs[1].clone().into(),
                outcome: Outcome::Ok {
                    max_rel_err: 1e-4,
                    timing: t(0.4),
                    tflops: 343.0,
                },
            },
            CandidateResult {
                kernel: specs[2].name(),
                spec: specs[2].clone().into(),
                outcome: Outcome::CannotImplement,
            },
        ];
        let prov = Provenance {
            device: DeviceInfo {
                name: "H100".into(),
                sm_count: 132,
                compute_capability: "9.0".into(),
                driver: "-".into(),
                cuda_runtime: "-".into(),
                ..Default::default()
            },
            torch: "2.11.0".into(),
            nvcc: "13.0".into(),
            cutlass: "4.2.0".into(),
            fact: "0.1.0".into(),
            date: "2026-11-22".into(),
        };
        let run = Run {
            partial: false,
            provenance: prov,
            baseline: Some(t(0.35)),
            candidates: cands,
        };
        let e = Entry::from_runs(
            TableKey::of(&p.clone().into(), MathType::Tf32, Arch::Sm90),
            p,
            vec![run],
        )
        .unwrap();
        let svg = scatter_svg(&e);
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains(&format!("winner {}", specs[1].name())));
        assert!(svg.contains("2 candidates timed, 1 failed"));
        assert!(svg.contains("0.875x"), "speedup of the winner: 0.35/0.4");
    }

    #[test]
    fn e2e_bars_are_speedups_over_each_groups_first_module() {
        let groups = vec![
            BarGroup {
                label: "block tf32".into(),
                bars: vec![
                    ("eager".into(), 8.0),
                    ("fact".into(), 4.0),
                    ("fact without attention".into(), 5.0),
                ],
                note: None,
            },
            BarGroup {
                label: "block bf16".into(),
                bars: vec![("eager".into(), 6.0), ("fact".into(), 2.0)],
                note: Some("torch.compile: timed out & killed".into()),
            },
        ];
        let svg = e2e_svg("GPT block", "H100\ntorch 2.11", &groups);
        assert_eq!(svg.matches("<rect x=").count(), 5);
        assert!(svg.contains(">torch.compile: timed out &amp; killed</text>"));
        assert!(svg.contains(">H100</text>") && svg.contains(">torch 2.11</text>"));
        for label in [
            "2.00x (4.000 ms)",
            "1.60x (5.000 ms)",
            "3.00x (2.000 ms)",
            "1.00x (6.000 ms)",
            "block bf16",
            "fact without attention",
        ] {
            assert!(svg.contains(label), "{label}");
        }
    }
}
