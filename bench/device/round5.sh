#!/usr/bin/env bash
# A short device check for a session with little device time left (about 7 minutes, the
# machine's start included): one call of at most 270 s, every step cut by one deadline
# (BUDGET_S, 250 s).
#   1. every GPU test binary on the NVIDIA driver, validation on (Debian 13's 1.4 layer,
#      which knows VK_KHR_cooperative_matrix): the two causes of failure of 2026-11-28 fixed;
#   2. issue 40: the grouped cosine join after the per-workgroup result reservation, on
#      clustered 384-D and 768-D at 100k and 384-D at 1M, against the CPU backend and
#      PyTorch on the same GPU (no GPU brute force: measured on 2026-11-28).
# Rehearse here first (lavapipe; it unpacks the binaries into .device/, pack again after):
#   bash bench/device/pack.sh && OUT=/tmp/devout VK_DRIVER_FILES=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json \
#     REHEARSE=1 bash bench/device/round5.sh
# On the device: carry [".device"], run `bash bench/device/round5.sh` with timeout_s 270.
budget=250
source "$(dirname "$0")/steps.sh"
step env TEST_TIMEOUT=$(pick 300 140) TEST_JOBS=$(pick 2 8) bash $run tests
step env COSINE_TIMEOUT=$(pick 60 40) COSINE_NO_BRUTE=1 \
  COSINE_ONLY=$(pick clusters-384d-6k clusters-384d-100k,clusters-768d-100k,clusters-384d-1m) bash $run cosine
ls -la "$OUT"
