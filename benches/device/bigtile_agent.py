"""An external agent (fact-agent/2) for one experiment: does CUTLASS's sm90 tf32 GEMM with the
TMA epilogue (bias, EVT) run faster on the big tiles (128x256, 256x128 cooperative) that the
generator instantiates only with the no-smem or transposed epilogue? It proposes the space's sm90
kernels plus those tiles with the space's first sm90 kernel's other fields, and skips on failure.

    fact realize ... --agent 'python3 benches/device/bigtile_agent.py'
"""
import json
import sys


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
        extra = []
        if sm90 and req["math"] == "tf32":
            base = sm90[0]
            for tile in ([128, 256, 32], [256, 128, 32]):
                for cluster in ([1, 2, 1], [2, 1, 1]):
                    for sched in ("ws_cooperative",):
                        k = dict(base, tile=tile, cluster=cluster, schedule=sched, scheduler="persistent")
                        extra.append(k)
        reply({"id": req["id"], "candidates": extra + sm90[:6]})
    elif kind == "after_failure":
        reply({"id": req["id"], "action": "skip"})
    else:
        reply({"id": req["id"], "error": "unknown kind " + kind})
