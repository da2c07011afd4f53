#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: epilogue leaves
# through aux loads. Each MODEL POLICY pair of the epilogue suite (benches/device/epilogue_models.py)
# is traced, composed from the shipped table plus a user table kept in /tmp (a later call on the
# same machine reuses its tunings) and measured by benches/device/epilogue_suite.py (eager, traced,
# torch.compile, fact; verification against fp64; the op library's calls per kernel), into
# $OUT/aux/MODEL_POLICY. Then one verdict line per pair:
#   PASS MODEL POLICY: RULE on KERNEL, fact F ms (eager E, traced T), err X, kernel calls ran N, fell back 0
# where the fused pattern (rule *_ep_*) is substituted by a kernel of the expected family (f32: the
# split families sm90x3_/sm90b3_, whose second GEMM reads the residuals through aux loads; tf32 and
# bf16: sm90_), every call ran it, and the error is within the policy's bound; else FAIL and why.
# One pair takes 4-6 minutes (a sweep of 4 candidates, then torch.compile): one pair per call.
# FACT_ARGS (default "--candidates 4 --jobs 16") goes to fact compose.
#   bash benches/device/aux_check.sh gpt_proj_residual f32 [MODEL POLICY ...]
set -uo pipefail
[ $# -ge 2 ] && [ $(( $# % 2 )) -eq 0 ] || { echo "usage: aux_check.sh MODEL POLICY [MODEL POLICY ...]" >&2; exit 2; }
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=/tmp/aux_user_table.json FACT_SHIPPED_TABLE=$PWD/pattern-table/table.json
mkdir -p "$OUT/aux"
log=$OUT/aux/aux_log.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; "$PWD/.device/fact" --version
} >> "$log" 2>&1
while [ $# -ge 2 ]; do
  model=$1 policy=$2
  shift 2
  dir=$OUT/aux/${model}_$policy
  python3 benches/device/epilogue_suite.py "$dir" --policies "$policy" --only "$model" \
    --fact-args "${FACT_ARGS:---candidates 4 --jobs 16}" --compose-timeout 360 --measure-timeout 200 2>&1 | tee -a "$log"
  python3 - "$dir/suite.json" <<'PY' 2>&1 | tee -a "$log"
import json, sys
sys.path.insert(0, "benches/device")
from epilogue_suite import TOLERANCE
try:
    (rec,) = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(print(f"FAIL {sys.argv[1]}: no record ({e})"))
name, policy = rec["model"], rec["policy"]
fused = [s for s in rec["substituted"] or [] if "_ep_" in s["rule"]]
calls = rec.get("op_calls") or {}
ran = sum(c["ran"] for c in calls.values())
fell_back = sum(c["fell_back"] for c in calls.values())
families = ("sm90x3_", "sm90b3_") if policy == "f32" else ("sm90_",)
err = rec["max_rel_err"]
why = []
if rec["error"]:
    why.append(rec["error"])
if not fused:
    why.append("no fused pattern substituted: " + json.dumps(rec["substituted"]))
elif not fused[0]["kernel"].startswith(families):
    why.append(f"kernel {fused[0]['kernel']} is not of {'/'.join(families)}")
if ran == 0 or fell_back:
    why.append(f"kernel calls ran {ran}, fell back {fell_back}: {json.dumps(calls)}")
if err is None or not err <= TOLERANCE[policy]:
    why.append(f"error {err} over {TOLERANCE[policy]}")
fmt = lambda v: "-" if v is None else f"{v:.3f}"
head = (f"{name} {policy}: {fused[0]['rule'] if fused else '-'} on {fused[0]['kernel'] if fused else '-'}, "
        f"fact {fmt(rec['fact_ms'])} ms (eager {fmt(rec['eager_ms'])}, traced {fmt(rec['traced_ms'])}, compile {fmt(rec['compile_ms'])}), "
        f"err {err if err is None else format(err, '.1e')}, kernel calls ran {ran}, fell back {fell_back}")
print(("FAIL " + head + " | " + "; ".join(why)) if why else ("PASS " + head))
PY
  # What comes back: records, logs, sweeps' JSON; not the libraries, objects and archives.
  find "$dir" \( -name '*.so' -o -name '*.o' -o -name '*.pt' \) -delete
done
true
