#!/usr/bin/env bash
# Issue 39's device check in one call of about 7 minutes on an H100 (the machine's 15
# minutes a session include its start): the GPU test binaries with validation, then each
# benchmark row with simjoin on the GPU, its CPU backend on all cores, `auto` and GDS-Join,
# in the same run, and the link's bandwidth. Results under $OUT (one tarball and the log).
# Rehearse here first (lavapipe, no nvcc: simjoin alone, small sizes):
#   bash bench/device/pack.sh && OUT=/tmp/devout VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json \
#     REHEARSE=1 bash bench/device/round3.sh
# On the device: carry [".device"], run `bash bench/device/round3.sh`.
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/simjoin-device-out}
mkdir -p "$OUT"
pick() { if [ -n "${REHEARSE:-}" ]; then echo "$1"; else echo "$2"; fi; }
run=bench/device/run.sh
# 1. Every GPU test binary, validation on, six at a time.
TEST_TIMEOUT=${TEST_TIMEOUT:-180} TESTS=${TESTS:-} bash $run tests
# 2. Low dimensions, 2M points (GPU-SJ's workloads): GPU, CPU, auto, GDS-Join; 2 joins a
#    process, the second timed.
REPEATS=1 SIZES=$(pick 20000 2000000) BANDWIDTH_MIB=$(pick 16 1024) bash $run bench low
# 3. 10M uniform 2-D (GDS-Join's figures there are from 2026-11-25: its CSV import and
#    16 s index build cost more than this call has).
TAG=10m WORKLOADS=uniform-2d SIZES=$(pick 50000 10000000) REPEATS=1 WITH_GDS=0 BANDWIDTH_MIB=64 bash $run bench low
# 4. 16-D exponential (GPU-JOIN's Syn16D2M), selectivity 10: one join a process (its
#    fixed costs are a rounding error beside 20 s), the tiled filter forced beside the rule.
TAG=16d WORKLOADS=expo-16d SIZES=$(pick 20000 2000000) SEL=10 REPEATS=1 BANDWIDTH_MIB=64 \
  BENCH_EXTRA="--in-process-repeat 1 --no-gpu-warmup --tiled-only" bash $run bench high
cd "$OUT" && tar czf bench.tgz bench-* && rm -rf bench-*
ls -la "$OUT"
