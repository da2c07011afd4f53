#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, after `source .device/env.sh`: torch's (cuDNN's)
# convolutions at every problem fact's convolution rule finds in torchvision's resnet50 (then
# mobilenet_v3_large and convnext_tiny, their groups-1 convolutions), batch 32, bf16: the graph's
# conv → batch_norm → add → act in NCHW, the same with the BatchNorm folded in NCHW and in
# channels-last, and the cost of converting x to channels-last per call (conv_baseline.py says
# what each is). No fact kernel runs here (benches/device/conv.sh times them): these are the
# baselines fact's kernels must beat, and the fold's error beside the chain's own.
# Usage: benches/device/conv_baseline.sh [MODEL...]   (default: resnet50 mobilenet_v3_large convnext_tiny)
# JSON under $OUT/conv_baseline/; each model's summary is its last line.
set -uo pipefail
models=${*:-resnet50 mobilenet_v3_large convnext_tiny}
bin=$PWD/.device/fact
dir=$OUT/conv_baseline
mkdir -p "$dir"
for m in $models; do
  python3 benches/device/conv_baseline.py "$bin" "$dir" 32 bf16 "$m" 2>&1 | tee "$dir/$m.log" | tail -n 40
done
