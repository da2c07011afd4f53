#!/usr/bin/env bash
# The lines of an Nsight Compute report worth reading first: each kernel's name line, duration and
# clock, throughputs, launch shape, registers and shared memory, occupancy and issue rates.
# Usage: benches/device/ncu_summary.sh REPORT MAX_LINES [EXTRA]   (EXTRA: more grep -E alternatives)
set -u
report=$1 lines=$2 extra=${3:-}
grep -E "^  [a-zA-Z_0-9]+.*\(|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Dynamic Shared|Grid Size|Block Size|Theoretical Occ|Achieved Occ|Issue Slots|Executed Ipc${extra:+|$extra}" \
  "$report" | head -"$lines"
