"""The shared compile cache on the GPU machine (issue 34, part 2), run by scale_cache.sh: traces one
zoo model there (benches/zoo/run.py's own trace child), then composes it as two hosts would in
turn, each with a fresh fact build cache, a fresh user table and a fresh sccache server over one
sccache backend (a Redis server, or a disk folder both share): the first host finds the backend
empty (the cold compose), the second should compile nothing (every sccache step a hit).
Optionally (--with-direct) a third fresh host composes with FACT_SCCACHE=off, nvcc alone, for
what sccache costs a compose that misses. Writes OUT/cache.json after every compose.

    python3 benches/device/scale_cache.py OUT --sccache BIN [--redis URL] [--model gpt2]
        [--policy bf16] [--with-direct] [--budget-s 420] [--fact-args '--jobs 16']

Both hosts compose from the repository's shipped pattern table (its hits build only their
winners and the op library; a cold compose without the table tunes every pattern, several
minutes a host), with --no-bench.
"""
import argparse
import datetime
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benches" / "device"))
from harness import FACT_PRECISION, log, write_json  # noqa: E402 -- the shared harness's helpers


def sccache_env(args, host, backend_dir):
    """The environment of one host's fact and sccache: this script's sccache settings alone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_")}
    env.update({
        "FACT_SCCACHE": str(args.sccache),
        "SCCACHE_SERVER_PORT": str(args.port),
        "SCCACHE_IDLE_TIMEOUT": "600",
        # The disk backend both hosts share, or (over Redis) this host's own unused folder.
        "SCCACHE_DIR": str(backend_dir or args.work / host / "sccache"),
        "FACT_CACHE_DIR": str(args.work / host / "build-cache"),
        "FACT_TABLE": str(args.work / host / "user_table.json"),
        "FACT_SHIPPED_TABLE": str(REPO / "pattern-table" / "table.json"),
    })
    if args.redis:
        env["SCCACHE_REDIS_ENDPOINT"] = args.redis
    return env


def sccache(args, env, *flags):
    return subprocess.run([str(args.sccache), *flags], env=env, capture_output=True, text=True, timeout=120)


def server_stats(args, env):
    """The server's counters by tool (`cuda [nvcc]`, `ptx [cicc]`, ...): hits and misses."""
    r = sccache(args, env, "--show-stats", "--stats-format", "json")
    try:
        s = json.loads(r.stdout)
    except ValueError:
        return {"error": (r.stderr or r.stdout).strip()}
    st = s.get("stats", {})
    return {
        "location": s.get("cache_location"),
        "hits": st.get("cache_hits", {}).get("adv_counts", {}),
        "misses": st.get("cache_misses", {}).get("adv_counts", {}),
        "not_cacheable": st.get("requests_not_cacheable"),
        "cache_errors": st.get("cache_errors", {}).get("counts", {}),
        "cache_read_errors": st.get("cache_read_errors"),
    }


def compose(args, model_pt, host, backend_dir, direct=False):
    """One host's compose: a fresh build cache, user table and sccache server; its wall time,
    fact's report of the compile cache and the server's own counters."""
    env = sccache_env(args, host, backend_dir)
    if direct:
        env["FACT_SCCACHE"] = "off"
    (args.work / host).mkdir(parents=True, exist_ok=True)
    sccache(args, env, "--stop-server")
    out_dir = args.work / host / "out"
    cmd = [str(args.fact), "compose", str(model_pt), "--out", str(out_dir), "--no-bench", "--json",
           "--precision", FACT_PRECISION[args.policy]] + shlex.split(args.fact_args)
    log_path = args.out / f"{host}.compose.log"
    log(f"{host}: {shlex.join(cmd)}")
    start = time.monotonic()
    with open(log_path, "w") as err:
        p = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                           timeout=args.compose_timeout)
    seconds = time.monotonic() - start
    rec = {"compose_s": seconds, "rc": p.returncode, "log": log_path.name}
    try:
        report = json.loads(p.stdout)["compose"]
        rec["sccache"] = report.get("sccache")
        rec["realized"] = {}
        for pat in report["patterns"]:
            how = pat["realization"]["how"]
            rec["realized"][how] = rec["realized"].get(how, 0) + 1
        rec["kernels"] = len({pat["kernel"] for pat in report["patterns"] if pat.get("kernel")})
        rec["compile_failures"] = len(report.get("compile_failures", []))
        rec["fact_seconds"] = report.get("seconds")
    except (ValueError, KeyError, TypeError) as e:
        rec["error"] = f"no compose report ({e}); see {log_path.name}"
    if not direct:
        rec["server"] = server_stats(args, env)
    sccache(args, env, "--stop-server")
    log(f"{host}: {seconds:.1f} s, rc {p.returncode}, sccache {rec.get('sccache')}")
    return rec


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip().split("\n")[0] or None
    except (OSError, subprocess.SubprocessError):
        return None


def redis_answers(url):
    host, _, port = url.removeprefix("redis://").rstrip("/").partition(":")
    try:
        with socket.create_connection((host, int(port or 6379)), timeout=2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="where cache.json and the compose logs go")
    ap.add_argument("--sccache", type=Path, required=True)
    ap.add_argument("--redis", default="", help="the Redis backend (redis://127.0.0.1:PORT); a shared disk folder without")
    ap.add_argument("--redis-note", default="", help="why there is no Redis backend, for the record")
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--model-pt", type=Path, help="a traced model to compose instead of tracing --model here")
    ap.add_argument("--policy", default="bf16", choices=sorted(FACT_PRECISION))
    ap.add_argument("--fact", type=Path, default=REPO / ".device" / "fact")
    ap.add_argument("--fact-args", default="")
    ap.add_argument("--work", type=Path, default=Path("/tmp/scale-cache"))
    ap.add_argument("--port", type=int, default=4431, help="the sccache servers' port")
    ap.add_argument("--with-direct", action="store_true", help="a third host with FACT_SCCACHE=off, time allowing")
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--compose-timeout", type=float, default=400)
    args = ap.parse_args()
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)
    for sub in ("models", "work"):
        (args.work / sub).mkdir(parents=True)
    if args.redis and not redis_answers(args.redis):
        args.redis_note = f"no answer from {args.redis}"
        args.redis = ""
    backend_dir = None if args.redis else args.work / "shared-sccache-disk"
    version = sccache(args, dict(os.environ), "--version").stdout.strip()
    record = {
        "what": "issue 34 part 2: two hosts in turn over one sccache backend, each with a fresh fact build cache, "
                "user table and sccache server; the shipped pattern table; compose --no-bench",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": gpu_name(),
        "cores": os.cpu_count(),
        "fact": subprocess.run([str(args.fact), "--version"], capture_output=True, text=True).stdout.strip(),
        "sccache": version,
        "model": args.model,
        "policy": args.policy,
        "backend": "redis" if args.redis else "disk",
        "backend_note": args.redis_note or ("Redis " + args.redis if args.redis else "a disk folder both hosts share"),
        "command": shlex.join(["python3"] + sys.argv),
    }
    path = args.out / "cache.json"
    if args.model_pt:
        model_pt = args.model_pt.resolve()
        record["model"] = str(args.model_pt)
    else:
        t = subprocess.run([sys.executable, str(REPO / "benches" / "zoo" / "run.py"), str(args.work), "--child",
                            "trace", args.model, args.policy], cwd=REPO, capture_output=True, text=True, timeout=300)
        model_pt = args.work / "models" / f"{args.model}_{args.policy}.pt"
        if not model_pt.exists():
            record["error"] = f"trace failed: {(t.stderr or t.stdout)[-2000:]}"
            write_json(path, record)
            sys.exit(1)
    record["cold"] = compose(args, model_pt, "cold", backend_dir)
    write_json(path, record)
    record["shared"] = compose(args, model_pt, "shared", backend_dir)
    record["cold_s"] = record["cold"]["compose_s"]
    record["shared_s"] = record["shared"]["compose_s"]
    record["shared_cache_vs_cold"] = record["shared_s"] / record["cold_s"]
    s = record["shared"].get("sccache") or {}
    record["shared_compiled_nothing"] = s.get("misses") == 0 and s.get("units", 0) > 0 and not s.get("fallback")
    write_json(path, record)
    log(f"shared_cache_vs_cold {record['shared_cache_vs_cold']:.3f} ({record['shared_s']:.1f} s / {record['cold_s']:.1f} s), "
        f"second host's sccache: {s.get('hits')} hits, {s.get('misses')} misses over {s.get('units')} compiles")
    if args.with_direct:
        left = args.budget_s - (time.monotonic() - start)
        if left > 1.2 * record["cold_s"]:
            record["direct"] = compose(args, model_pt, "direct", None, direct=True)
            record["direct_s"] = record["direct"]["compose_s"]
            record["cold_vs_direct"] = record["cold_s"] / record["direct_s"]
        else:
            record["direct_note"] = f"not run: {left:.0f} s left of --budget-s, the cold compose took {record['cold_s']:.0f}"
        write_json(path, record)


if __name__ == "__main__":
    main()
