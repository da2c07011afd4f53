"""Where the zoo stands: the latest record of each model and policy among the committed ones.

    python3 benches/zoo/standing.py [--results benches/results/zoo] [--gpu H100] [--fact target/release/fact]

Reads every record under RESULTS (records/*.json at any depth, as benches/zoo/run.py writes them
and benches/results/zoo/YYYY-MM-DD-<gpu>-<commit>/ keeps them), keeps those measured on a GPU
whose name holds --gpu, with fact and torch.compile timed in the same process, and takes per model
and policy the latest by its `date`. Writes RESULTS/standing/zoo.json (the records, with where
each came from, less their profiles and substitution lists, which stay in each record),
standing.md (a table and the geomeans the issues ask for: fact over torch.compile per policy over
the transformers and over the CNNs, the lowest, and over max-autotune from the latest record that
timed it, where one did) and, given a fact binary, standing.svg (`fact plot-e2e --over
torch.compile`). Nothing is measured here: every figure is a committed record's, each ratio from
one process.
"""
import argparse
import json
import math
import subprocess
from pathlib import Path

# The zoo's convolutional networks (benches/zoo/models.py); every other family is a transformer.
CNN_FAMILIES = {"resnet", "mobilenet", "convnext"}
POLICIES = ["tf32", "bf16", "f32"]
# What standing/zoo.json leaves out of each record (the bulk of it; the record itself keeps them).
LEFT_IN_RECORD = ("profile", "substituted")


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def beside_max_autotune(r):
    """fact's time in the process that timed max-autotune: its own field where the record timed
    them apart, else fact's."""
    return r.get("fact_ms_beside_max_autotune") or r.get("fact_ms")


def latest(results, gpu):
    """Per (model, policy): the latest record with fact and torch.compile, and the latest with
    fact and max-autotune (often another record: max-autotune compiles for minutes)."""
    best, auto = {}, {}
    for path in sorted(results.glob("**/records/*.json")):
        if "standing" in path.parts:
            continue
        r = json.loads(path.read_text())
        if gpu not in (r.get("gpu") or ""):
            continue
        r["source"] = str(path.relative_to(results))
        key = (r["model"], r["policy"])
        for kept, ok in ((best, r.get("fact_ms") and r.get("compile_ms")), (auto, r.get("max_autotune_ms") and beside_max_autotune(r))):
            if ok and (key not in kept or r.get("date", "") > kept[key].get("date", "")):
                kept[key] = r
    return best, auto


def table(records, auto):
    rows = [
        "| model | policy | eager ms | torch.compile ms | fact ms | fact vs compile | vs eager | calls (kernel/fallback) | record | fact vs max-autotune (its record) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    for r in records:
        ratio = r["compile_ms"] / r["fact_ms"]
        eager = f"{r['eager_ms'] / r['fact_ms']:.2f}x" if r.get("eager_ms") else "-"
        a = auto.get((r["model"], r["policy"]))
        vs_auto = (
            f"{a['max_autotune_ms'] / beside_max_autotune(a):.2f}x ({fmt(a['max_autotune_ms'])} against {fmt(beside_max_autotune(a))}, `{a['source']}`)"
            if a
            else "-"
        )
        rows.append(
            f"| {r['model']} | {r['policy']} | {fmt(r.get('eager_ms'))} | {fmt(r['compile_ms'])} | "
            f"{fmt(r['fact_ms'])} | **{ratio:.2f}x** | {eager} | "
            f"{r.get('kernel_calls')}/{r.get('fallback_calls')} | `{r['source']}` | {vs_auto} |"
        )
    return rows


def summary(records, auto):
    lines = []
    for policy in POLICIES:
        tf = [r for r in records if r["policy"] == policy and r.get("family") not in CNN_FAMILIES]
        cnn = [r for r in records if r["policy"] == policy and r.get("family") in CNN_FAMILIES]
        for name, group in (("transformers", tf), ("CNNs", cnn)):
            if not group:
                continue
            ratios = {r["model"]: r["compile_ms"] / r["fact_ms"] for r in group}
            low = min(ratios, key=ratios.get)
            lines.append(
                f"- {policy}, {len(group)} {name}: geomean **{geomean(list(ratios.values())):.2f}x** torch.compile, "
                f"lowest {low} {ratios[low]:.2f}x"
            )
            vs_auto = {
                r["model"]: a["max_autotune_ms"] / beside_max_autotune(a)
                for r in group
                if (a := auto.get((r["model"], policy)))
            }
            if vs_auto:
                lines.append(
                    f"  - against max-autotune, {len(vs_auto)} of them: geomean {geomean(list(vs_auto.values())):.2f}x"
                    f" (not measured: {', '.join(sorted(set(ratios) - set(vs_auto))) or 'none'})"
                )
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="benches/results/zoo", type=Path)
    ap.add_argument("--gpu", default="H100", help="keep records measured on a GPU whose name holds this")
    ap.add_argument("--fact", type=Path, help="a fact binary, to draw standing.svg")
    args = ap.parse_args()
    best, auto = latest(args.results, args.gpu)
    if not best:
        raise SystemExit(f"no record under {args.results} has fact and torch.compile on a GPU named like {args.gpu!r}")
    order = lambda r: (r.get("family") in CNN_FAMILIES, r["model"], POLICIES.index(r["policy"]) if r["policy"] in POLICIES else 9)
    records = sorted(best.values(), key=order)
    out = args.results / "standing"
    out.mkdir(parents=True, exist_ok=True)
    gpus = sorted({r["gpu"] for r in records})
    meta = {"device": ", ".join(gpus), "date": max(r.get("date", "") for r in records)[:10], "torch": records[0].get("torch")}
    lean = [{k: v for k, v in r.items() if k not in LEFT_IN_RECORD} for r in records]
    (out / "zoo.json").write_text(json.dumps({"meta": meta, "records": lean}, indent=1) + "\n")
    text = [
        "# Where the zoo stands",
        "",
        f"Written by `python3 benches/zoo/standing.py --gpu {args.gpu}` from the committed records: per model and",
        "policy the latest record with fact and torch.compile timed in one process (each ratio is that",
        "process's; records of different rows may come from different machines, dates and commits of fact:",
        "each row names its record, whose folder is `YYYY-MM-DD-<gpu>-<commit>`).",
        "",
        *table(records, auto),
        "",
        *summary(records, auto),
        "",
    ]
    (out / "standing.md").write_text("\n".join(text))
    print("\n".join(text))
    if args.fact:
        subprocess.run(
            [str(args.fact), "plot-e2e", str(out / "zoo.json"), "--over", "torch.compile", "--out", str(out / "standing.svg"),
             "--title", f"the zoo's latest records ({meta['device']}): speedup over torch.compile (default)"],
            check=True,
        )


if __name__ == "__main__":
    main()
