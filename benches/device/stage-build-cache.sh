#!/usr/bin/env bash
# Stages a build cache for zoo models into .device/build-cache.tgz, compiled here on the CPU, so a
# GPU call composes them with their kernels cached rather than spending device time in nvcc.
# Run here, from the repository root, after ./setup, cargo build --release and
# ../shared/tools/device-stage (as root: it makes the GPU machine's paths here):
#   bash benches/device/stage-build-cache.sh gpt2,llama,bert [USER_TABLE]
# Each model is built at its GPU run's size on the CPU (bf16), exported, and composed with
# --arch sm90 --no-bench from the user table given (a table measured on the GPU: every problem it
# answers is compiled as its winner; the others' first candidates) into a build cache at
# /tmp/fact-build-cache. A cached object's key holds its nvcc command, and so the paths in it:
# the compose here uses the GPU machine's (nvcc at /usr/local/cuda/bin, CUTLASS unpacked at
# /tmp/cutlass by .device/env.sh, torch at /opt/torch/.venv/lib/python3.12/site-packages/torch),
# made here as links to ./setup's. On the GPU machine, after `source .device/env.sh`:
#   unset CUDA_HOME; tar xzf .device/build-cache.tgz -C /tmp
#   FACT_CACHE_DIR=/tmp/fact-build-cache FACT_SCCACHE=off python3 benches/zoo/serve.py OUT ...
# A kernel that a compose there re-verifies or sweeps beyond what was compiled here still
# compiles there. compose_time.py measures cold composes and ignores this cache.
set -euo pipefail
models=${1:?usage: stage-build-cache.sh MODELS [USER_TABLE]}
table=${2:-}
root=$(git rev-parse --show-toplevel)
cd "$root"
venv=$root/.venv
site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
cuda=/usr/local/cuda torch_dir=/opt/torch/.venv/lib/python3.12/site-packages/torch
link() {  # link NAME TARGET, refusing to replace anything but a link
  if [ -e "$1" ] && [ ! -L "$1" ]; then echo "stage-build-cache: $1 exists and is no link; move it first" >&2; exit 1; fi
  mkdir -p "$(dirname "$1")" && ln -sfn "$2" "$1"
}
link "$cuda" "$site/nvidia/cu13"
link "$torch_dir" "$site/torch"
[ -d /tmp/cutlass/cutlass_library ] || "$venv/bin/python" -m zipfile -e .device/nvidia_cutlass-*.whl /tmp/cutlass
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$venv/bin/python" - "$work" "$models" <<'PY'
import sys
import torch
sys.path.insert(0, "benches/zoo")
import models
out, names = sys.argv[1], sys.argv[2]
for m in models.select(names):
    module = models.build(m, ci=False, device="cpu", dtype=torch.bfloat16)
    inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in m.inputs(ci=False))
    error = models.export(m, module, inputs, f"{out}/{m.name}.pt2")
    print(f"stage-build-cache: {m.name} {'exported' if error is None else 'does not export: ' + error}", flush=True)
PY
export PATH=$cuda/bin:$PATH CUTLASS_DIR=/tmp/cutlass/cutlass_library/source TORCH_DIR=$torch_dir
export FACT_CACHE_DIR=/tmp/fact-build-cache FACT_SCCACHE=off FACT_TABLE=$work/table.json
[ -z "$table" ] || cp "$table" "$work/table.json"
for pt2 in "$work"/*.pt2; do
  name=$(basename "$pt2" .pt2)
  start=$SECONDS
  if target/release/fact compose "$pt2" --out "$work/$name" --no-bench --arch sm90 > /dev/null 2> "$work/$name.log"; then
    echo "stage-build-cache: $name composed in $((SECONDS - start)) s ($(grep -o 'compiling [0-9]* kernels ([0-9]* cached)' "$work/$name.log" | head -1))"
  else
    echo "stage-build-cache: $name did not compose; its log's last lines:" >&2
    tail -5 "$work/$name.log" >&2
  fi
done
tar czf .device/build-cache.tgz -C /tmp fact-build-cache
du -sh .device/build-cache.tgz .device | awk '{print "stage-build-cache: " $2 " holds " $1}'
