"""A scripted external agent for the protocol tests (fact-agent/2 over stdin/stdout).

Usage: python scripted_agent.py MODE LOG
  MODE "reject-then-propose": reverses fact's ranking, picks the first offered example, proposes
      an invalid kernel first (a cooperative schedule on a 64-row tile) and, once fact sends the
      rejection back, the first kernel of fact's space.
  MODE "sleep-on-rank": never answers the rank request (fact must time out and carry on).
  MODE "garbage": answers every request with a line that is not JSON.
Every request is appended to LOG, one JSON per line, for the test to read.
"""
import json
import sys
import time

mode, log = sys.argv[1], sys.argv[2]


def reply(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    req = json.loads(line)
    with open(log, "a") as f:
        f.write(json.dumps(req) + "\n")
    assert req["protocol"] == "fact-agent/2", req
    if mode == "garbage":
        sys.stdout.write("this is not json\n")
        sys.stdout.flush()
        continue
    kind = req["kind"]
    if kind == "rank":
        if mode == "sleep-on-rank":
            time.sleep(60)
        ids = [p["id"] for p in req["patterns"]]
        reply({"id": req["id"], "order": list(reversed(ids))})
    elif kind == "examples":
        reply({"id": req["id"], "examples": [req["offered"][0]["path"]]})
    elif kind == "propose":
        if not req["rejected"]:
            bad = dict(next(k for k in req["space"] if k["family"] == "sm90_gemm"))
            bad["tile"] = [64, 128, bad["tile"][2]]
            bad["schedule"] = "ws_cooperative"
            reply({"id": req["id"], "candidates": [bad]})
        else:
            reply({"id": req["id"], "candidates": [req["space"][0]]})
    elif kind == "after_failure":
        reply({"id": req["id"], "action": "skip"})
    else:
        reply({"id": req["id"], "error": "unknown kind " + kind})
