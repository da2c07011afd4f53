"""Prints every candidate of a pattern table (a probe's or a sweep's): tuner median ms, torch's
baseline of its run, status and kernel name, fastest first.

    python3 benches/device/table_print.py TABLE.json [LABEL]
"""
import json
import signal
import sys

# Quiet under `| head`.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

label = sys.argv[2] if len(sys.argv) > 2 else ""
table = json.load(open(sys.argv[1]))
for entry in table["entries"]:
    for run in entry["runs"]:
        base = (run.get("baseline") or {}).get("median_ms")
        timed = lambda c: (c.get("timing") or {}).get("median_ms")
        for c in sorted(run["candidates"], key=lambda c: timed(c) or 1e9):
            t = timed(c)
            print(f"{label:>10} {'-' if t is None else f'{t:.4f}'} torch {'-' if base is None else f'{base:.4f}'} {c.get('status')} {c['kernel']}")
