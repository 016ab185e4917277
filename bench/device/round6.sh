#!/usr/bin/env bash
# The device check for the next session with 15 device minutes (start included): one call
# of at most 8 minutes, every step cut by one deadline (BUDGET_S, 440 s). In order:
#   1. every GPU test binary on the NVIDIA driver, validation on (the stop-timing ones
#      alone after the others), the new ones among them: the device's assignment of leaders
#      equals the CPU's plan, a stop while it runs;
#   2. issue 40 after the assignment's dispatches were made to fill the GPU (2^17 rows a
#      dispatch, not 832) and the first batches sized to fit: the grouped cosine join on
#      clustered, near-duplicate and uniform embeddings at 100k and clustered at 1M, in a
#      fresh process (CLI) and on an engine kept open (gpu_join_bench --npy, the runs after
#      the first), with the phases, against the CPU backend and PyTorch on the same GPU;
#      on uniform data also the brute force in the grouped join's tiles (`--algorithm
#      brute`, Plan::brute, 2026-11-29) against the general join `auto` falls back to;
#   3. low dimensions at 2M (simjoin GPU, CPU, auto, GDS-Join), while time is left.
# Rehearse here first (lavapipe; it unpacks the binaries into .device/, pack again after):
#   bash bench/device/pack.sh && OUT=/tmp/devout VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json \
#     REHEARSE=1 PATH=$PWD/target/pyvenv/bin:$PATH bash bench/device/round6.sh
# On the device: carry [".device"], run `bash bench/device/round6.sh` with timeout_s 480.
budget=440
source "$(dirname "$0")/steps.sh"
step env TEST_TIMEOUT=$(pick 300 160) TEST_JOBS=$(pick 2 8) bash $run tests
step env COSINE_TIMEOUT=$(pick 60 45) COSINE_WARM_REPEAT=2 bash $run cosine
step env REPEATS=1 COMPARE_ROWS=1 SIZES=$(pick 20000 2000000) BANDWIDTH_MIB=$(pick 16 1024) bash $run bench low
cd "$OUT" && tar czf bench.tgz bench-* 2>/dev/null && rm -rf bench-*
ls -la "$OUT"
