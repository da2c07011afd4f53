"""Draws the serving grid's records (benches/zoo/serve.py --grid: shapes/NAME.json) as an SVG: per
shape, torch.compile (default) over the composition as TorchScript and under fact.compile, and
torch.compile mode="reduce-overhead" over fact.compile in a CUDA graph, as bars around 1.0x, with
fact's fallback calls under each shape. A record without a mode's field has no bar for it.

    python3 benches/zoo/shapes_figure.py RECORDS.json [...] --out FIGURE.svg
"""
import argparse
import json
from pathlib import Path

PAIRS = [("compile_ms", "fact_ts_ms", "#4c72b0", "fact as TorchScript / torch.compile"),
         ("compile_ms", "fact_compile_ms", "#55a868", "fact.compile / torch.compile"),
         ("compile_ro_ms", "fact_compile_graph_ms", "#dd8452", "fact.compile in a CUDA graph / reduce-overhead")]


def ratio(row, base, ours):
    return row[base] / row[ours] if row.get(base) and row.get(ours) else None


def figure(rows, title):
    width, height, left, top, bottom = max(100 * len(rows) + 120, 420), 400, 70, 50, 110
    plot_h = height - top - bottom
    peak = max([2.0] + [r for row in rows for b, o, _, _ in PAIRS if (r := ratio(row, b, o))])
    y = lambda v: top + plot_h * (1 - v / peak)  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="20" font-size="13">{title}</text>']
    for tick in [0.5 * i for i in range(int(peak / 0.5) + 1)]:
        out.append(f'<line x1="{left}" x2="{width - 20}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:.1f}x</text>')
    out.append(f'<line x1="{left}" x2="{width - 20}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="#333"/>')
    for i, row in enumerate(rows):
        x0 = left + 20 + 100 * i
        for j, (b, o, colour, _) in enumerate(PAIRS):
            r = ratio(row, b, o)
            if r is None:
                continue
            x = x0 + 27 * j
            out.append(f'<rect x="{x}" y="{y(r):.1f}" width="22" height="{y(0) - y(r):.1f}" fill="{colour}"/>')
            out.append(f'<text x="{x + 11}" y="{y(r) - 3:.1f}" text-anchor="middle">{r:.2f}</text>')
        out.append(f'<text x="{x0 + 38}" y="{height - bottom + 16}" text-anchor="middle">{row["shape"]}</text>')
        out.append(f'<text x="{x0 + 38}" y="{height - bottom + 30}" text-anchor="middle" fill="#666">'
                   f'{row.get("fallback_calls", "?")} fallbacks</text>')
    for j, (_, _, colour, label) in enumerate(PAIRS):
        # One legend line a pair: three labels side by side outrun a three-shape figure.
        out.append(f'<rect x="{left}" y="{height - 62 + 18 * j}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{left + 18}" y="{height - 52 + 18 * j}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = [r for p in args.records for r in json.loads(p.read_text())]
    first = rows[0]
    title = f"{first['model']} composed at {first['composed_at']}, {first['policy']}, {first['gpu']}, {first['fact_commit']}: speedup per shape"
    args.out.write_text(figure(rows, title))


if __name__ == "__main__":
    main()
