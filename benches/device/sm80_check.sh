#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: the sm80 build
# target on an H100. An sm80 library carries sm_80 code and its compute_80 PTX, which the driver
# compiles for the H100 when it loads the library, so its kernels can be verified against fp64 here
# (timings are the H100's, not an A100's). Each step realizes one problem with `fact realize --arch
# sm80` (compile, verify every candidate on fresh inputs against fp64, time) into a throwaway user
# table, or composes a model with `--arch sm80` and benchmarks it (the composed module's outputs
# against fp64, the op library's call counts). Results in $OUT (sm80_log.txt, sm80_check.json, the
# sweeps' sweep.json files and the compose reports).
# Usage: bash benches/device/sm80_check.sh [CANDIDATES] [STEP ...]
#   STEP of gemm (plain tf32 GEMM), evt (linear + bias + gelu + residual, tf32), leaves (bf16
#   epilogue over every leaf kind), residuals (two residuals, one aux load each), accurate
#   (fp32-accurate 3xTF32 with bias, gelu and a residual), attention (bf16 causal SDPA, the sm80
#   fused attention), layernorm (fact's LayerNorm built for sm80), block (the GPT block at C 768
#   composed and benchmarked). Default: all; at CANDIDATES=3 (the default) run them in two calls
#   sharing $OUT, e.g. `3 gemm evt leaves residuals` then `3 accurate attention layernorm block`.
set -uo pipefail
export FACT_CACHE_DIR=${FACT_CACHE_DIR:-/tmp/fact-cache} FACT_TABLE=$OUT/sm80_table.json FACT_SHIPPED_TABLE=/nonexistent.json
# The driver compiles each kernel's PTX at its first launch and caches the result: a cache big
# enough for every step's kernels lets the composed library reuse what tuning compiled.
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
bin=$PWD/.device/fact
candidates=${1:-3}
shift || true
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(gemm evt leaves residuals accurate attention layernorm block)
log=$OUT/sm80_log.txt
dir=/tmp/sm80_check
mkdir -p "$dir"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'; "$bin" --version
} >> "$log" 2>&1

realize() {  # name, then fact realize arguments
  local name=$1
  shift
  echo "== $name: realize --arch sm80 $*" | tee -a "$log"
  local t0=$(date +%s)
  "$bin" realize --arch sm80 --candidates "$candidates" --refine 0 --jobs 16 --out "$dir/$name" "$@" 2>&1 | tee -a "$log"
  echo "realize exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - t0 )) s" | tee -a "$log"
}

for step in "${steps[@]}"; do
  case $step in
    gemm) realize gemm --rule gemm_rcr --dtype f32 --shape 4096x4096x4096 ;;
    evt) realize evt --rule gemm_rcr_bias --dtype f32 --shape 8192x3072x768 --epilogue 'leaves=full;v1=gelu(v0);v2=add(v1,l0)' ;;
    leaves) realize leaves --rule gemm_rrr_bias --dtype bf16 --shape 4096x4096x1024 \
      --epilogue 'leaves=full,row,col,scalar;v1=gelu_tanh(v0);v2=mul(v1,l1);v3=add(v2,l2);v4=div(v3,l3);v5=add(v4,l0)' ;;
    residuals) realize residuals --rule gemm_rcr_bias --dtype f32 --shape 4096x768x3072 --epilogue 'leaves=full,full;v1=add(v0,l0);v2=sub(v1,l1)' ;;
    accurate) realize accurate --rule gemm_rcr_bias --dtype f32 --shape 4096x3072x768 --precision f32 --epilogue 'leaves=full;v1=gelu(v0);v2=add(v1,l0)' ;;
    attention) realize attention --rule sdpa_causal --dtype bf16 --shape 16x12x1024x1024x64 ;;
    layernorm) realize layernorm --rule layernorm_affine --dtype f32 --shape 65536x768 ;;
    block)
      [ -f "$dir/fixtures/minigpt768.pt" ] || python3 tests/fixtures/make_models.py "$dir/fixtures" >> "$log" 2>&1
      echo "== block: compose --arch sm80 minigpt768.pt --input 16x512x768:f32" | tee -a "$log"
      t0=$(date +%s)
      "$bin" compose "$dir/fixtures/minigpt768.pt" --input 16x512x768:f32 --arch sm80 --precision tf32 --candidates "$candidates" \
        --refine 0 --jobs 16 --keep-slower --out "$dir/block" --save-report "$OUT/sm80_block_report.json" 2>&1 | tee -a "$log"
      echo "compose exit ${PIPESTATUS[0]}, wall $(( $(date +%s) - t0 )) s" | tee -a "$log"
      cp "$dir/block/compose.json" "$OUT/sm80_block_compose.json" 2>/dev/null ;;
    *) echo "no step $step" | tee -a "$log" ;;
  esac
done

# Every candidate's outcome per sweep, and the block's bench: one line each, and sm80_check.json.
python3 - "$dir" "$OUT" <<'PY' 2>&1 | tee -a "$log"
import glob, json, os, sys
root, out = sys.argv[1], sys.argv[2]
summary = {}
for path in sorted(glob.glob(os.path.join(root, "*", "sweeps", "*", "sweep.json"))):
    rec = json.load(open(path))
    key = rec["key"]
    runs = rec.get("runs") or [rec["run"]]  # a run per GPU that measured
    cands = [c for r in runs for c in r["candidates"]]
    # The table stores each candidate's outcome flattened into it (status, max_rel_err, timing).
    ok = [c for c in cands if c["status"] == "ok"]
    bad = [(c["kernel"], c["status"]) for c in cands if c["status"] != "ok"]
    worst = max((c["max_rel_err"] for c in ok), default=float("nan"))
    best = min(ok, key=lambda c: c["timing"]["median_ms"], default=None)
    base = (runs[0].get("baseline") or {}).get("median_ms")
    name = os.path.relpath(path, root).split(os.sep)[0] + ":" + key["rule"]
    summary[name] = {"shape": key["shape"], "math": key["math"], "arch": key["arch"], "ok": len(ok), "failed": bad,
                     "max_rel_err": worst, "best": best and best["kernel"], "best_ms": best and best["timing"]["median_ms"],
                     "torch_ms": base}
    print(f"{name:60} {key['shape']:>22} {key['arch']} {key['math']:6} {len(ok)}/{len(cands)} verified, max rel err {worst:.2e}, "
          f"best {summary[name]['best_ms'] or float('nan'):.4f} ms (torch {base or float('nan'):.4f}) {'FAILED: ' + str(bad) if bad else ''}")
report = os.path.join(out, "sm80_block_report.json")
if os.path.exists(report):
    b = json.load(open(report))
    calls = b.get("op_calls", {})
    fell = {k: v for k, v in calls.items() if v.get("fell_back")}
    summary["block"] = {"max_rel_err": b["max_rel_err"], "speedup": b["speedup"], "op_calls": calls}
    print(f"block: composed vs fp64 rel err {b['max_rel_err']:.2e} (torch {b['baseline_rel_err']:.2e}), {b['fact_ms']:.3f} ms vs torch "
          f"{b['baseline_ms']:.3f} ms; {sum(v['ran'] for v in calls.values())} kernel calls ran, fell back: {fell or 'none'}")
json.dump(summary, open(os.path.join(out, "sm80_check.json"), "w"), indent=2)
PY
true
