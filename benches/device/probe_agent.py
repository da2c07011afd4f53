"""An external agent (fact-agent/2) for probing named kernels: it proposes the space's first sm90
kernel with each of $FACT_PROBE's overrides (a JSON list of objects of spec fields, e.g.
[{"tile": [128, 128, 32], "cluster": [2, 2, 1], "schedule": "ws_pingpong", "scheduler": "persistent"}]),
so a sweep measures exactly those in one run, and skips on failure. FACT_PROBE_SPACE=N adds the
space's first N sm90 kernels after them (what the probes are compared against).

    FACT_PROBE='[...]' fact realize ... --refine 0 --agent 'python3 benches/device/probe_agent.py'
"""
import json
import os
import sys

PROBE = json.loads(os.environ["FACT_PROBE"])
SPACE = int(os.environ.get("FACT_PROBE_SPACE", "0"))


def reply(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    req = json.loads(line)
    kind = req["kind"]
    if kind == "rank":
        reply({"id": req["id"], "order": [p["id"] for p in req["patterns"]]})
    elif kind == "examples":
        reply({"id": req["id"], "examples": [o["path"] for o in req["offered"]]})
    elif kind == "propose":
        sm90 = [k for k in req["space"] if k["family"] == "sm90_gemm"]
        if not sm90:
            reply({"id": req["id"], "error": "no sm90_gemm kernel in the space to base the probe on"})
            continue
        reply({"id": req["id"], "candidates": [dict(sm90[0], **o) for o in PROBE] + sm90[:SPACE]})
    elif kind == "after_failure":
        reply({"id": req["id"], "action": "skip"})
    else:
        reply({"id": req["id"], "error": "unknown kind " + kind})
