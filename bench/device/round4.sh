#!/usr/bin/env bash
# Issue 39's device check for a session with 15 device minutes (start included): one call
# of at most 8 minutes, every step cut by one deadline (BUDGET_S, 440 s) so that what ran
# comes back packed. In order of what no other session can learn:
#   1. every GPU test binary on the NVIDIA driver, validation on;
#   2. issue 40: the grouped cosine join (clustered, near-duplicate and uniform embeddings at
#      100k, clustered at 1M): tiles on the matrix units, the same with f32 tiles, the CPU
#      backend, the GPU's brute force and PyTorch's on the same GPU;
#   3. low dimensions at 2M (uniform 2-D and 6-D, selectivities 10 and 100): simjoin GPU
#      (sorted pairs as rows sorted on the device), the same with the host's sort
#      (SIMJOIN_GPU_ROWS=0), its CPU backend on all cores, `auto`, GDS-Join, in the same
#      run, and the link;
#   4. exponential 16-D, 32-D, 64-D at 2M, one eps each (selectivity 10), the same four;
#   5. 16-D at selectivities 1 and 100, while time is left.
# Rehearse here first (lavapipe, no nvcc: simjoin alone, small sizes; it unpacks the binaries
# into .device/, so pack again before the device call: the tool carries 64 MiB):
#   bash bench/device/pack.sh && OUT=/tmp/devout VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json \
#     REHEARSE=1 bash bench/device/round4.sh
# On the device: carry [".device"], run `bash bench/device/round4.sh` with timeout_s 480.
budget=440
source "$(dirname "$0")/steps.sh"
step env TEST_TIMEOUT=$(pick 300 180) TEST_JOBS=$(pick 2 8) bash $run tests
step env COSINE_TIMEOUT=$(pick 60 45) bash $run cosine
step env REPEATS=1 COMPARE_ROWS=1 SIZES=$(pick 20000 2000000) BANDWIDTH_MIB=$(pick 16 1024) bash $run bench low
for wl in expo-16d expo-32d expo-64d; do
  step env TAG=${wl#expo-} WORKLOADS=$wl SIZES=$(pick 10000 2000000) SEL=10 REPEATS=1 BANDWIDTH_MIB=16 \
    COMPARE_TILES=0 RUN_TIMEOUT=$(pick 60 100) BENCH_EXTRA="--in-process-repeat 1 --no-gpu-warmup" bash $run bench high
done
step env TAG=16d-sel WORKLOADS=expo-16d SIZES=$(pick 10000 2000000) SEL=1,100 REPEATS=1 BANDWIDTH_MIB=16 \
  COMPARE_TILES=0 RUN_TIMEOUT=$(pick 60 100) BENCH_EXTRA="--in-process-repeat 1 --no-gpu-warmup" bash $run bench high
cd "$OUT" && tar czf bench.tgz bench-* 2>/dev/null && rm -rf bench-*
ls -la "$OUT"
