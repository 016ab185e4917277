#!/usr/bin/env bash
# On the device machine (the `device` tool: an H100/H200, x86-64, the NVIDIA driver, nvcc,
# python3 with numpy and pyarrow, no Rust), from the repository root, with .device/ from
# bench/device/pack.sh carried. Every step appends to $OUT/run.log, so what finished comes
# back even when the call is stopped at its limit; results go under $OUT (the tool returns
# at most 8 files, two folders deep).
#   bash bench/device/run.sh tests          GPU test binaries, NVIDIA driver, validation on
#   bash bench/device/run.sh bench low      uniform 2-D and 6-D (GPU-SJ): simjoin vs GDS-Join
#   bash bench/device/run.sh bench high     exponential 16/32/64-D (GPU-JOIN), tiles on and off
#   bash bench/device/run.sh stress         the test binaries repeatedly (STRESS_RUNS, STRESS_JOBS)
#   bash bench/device/run.sh cosine         issue 40: grouped cosine join, GPU vs CPU vs GPU brute
#                                           (and on an engine kept open: COSINE_WARM_REPEAT runs, 2)
#   bash bench/device/run.sh tests bench low    steps run in order, in one call
# Sizes, selectivities and repeats: SIZES (default 2000000,10000000 for low, 2000000 for
# high), SEL (10,100 low; 1,10,100 high), WORKLOADS (a comma list), REPEATS (2), RUN_TIMEOUT
# per run (300 s: GDS-Join parses a CSV each run); each row runs simjoin on the GPU, its CPU
# backend (WITH_CPU=0: not), `auto` (WITH_AUTO=0: not) and GDS-Join (WITH_GDS=0: not), and
# `high` the GPU filter's tiles forced off and on (COMPARE_TILES=0: not). BANDWIDTH_MIB
# (1024): the link measurement's size. TESTS="gpu_join vk_kernels" runs only those test
# binaries, TEST_JOBS (6) at a time.
# Off the device (lavapipe, no nvcc) the same steps run as a rehearsal with small SIZES.
set -uo pipefail
cd "$(dirname "$0")/../.."
kit=.device
OUT=${OUT:-/tmp/simjoin-device-out}
mkdir -p "$OUT"
log=$OUT/run.log
say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }

[ -f $kit/bins.tar.xz ] || { echo "no $kit/bins.tar.xz: run bench/device/pack.sh here first and carry .device" >&2; exit 2; }
[ -x $kit/simjoin ] || tar -C $kit -xJf $kit/bins.tar.xz
say "kit of $(tr '\n' ' ' <$kit/COMMIT)on $(uname -m), $(nproc) cores"
export SIMJOIN_COMMIT="$(tr '\n' ' ' <$kit/COMMIT | sed 's/ *$//') (bench/device kit)"

# The Vulkan loader, where the machine has none (the device tool's recipe), and the
# validation layers unpacked beside the tree (into / they could break the system).
# The NVIDIA ICD (libGLX_nvidia.so.0) needs glvnd's dispatch libraries, which the device
# image lacks (first H100 run, 2026-11-25: "Unable to find a Vulkan driver"): the device
# tool's recipe unpacks those packages into /. The X11 libraries they link go beside the tree,
# after the system's in the search path, so nothing of the image is replaced.
if ! ldconfig -p | grep >/dev/null 'libvulkan.so.1 '; then
  for f in $kit/debs/libvulkan1_*.deb; do dpkg -x "$f" /; done
fi
for p in libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2; do
  ldconfig -p | grep >/dev/null "$(case $p in libglvnd0) echo libGLdispatch;; libegl1) echo 'libEGL.so.1 ';; libgl1) echo 'libGL.so.1 ';;
    libglx0) echo 'libGLX.so.0 ';; libopengl0) echo libOpenGL;; libgles2) echo 'libGLESv2.so.2 ';; esac)" ||
    for f in $kit/debs/${p}_*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
done
ldconfig
x11=/tmp/simjoin-x11
if [ ! -d $x11 ]; then
  mkdir -p $x11
  for f in $kit/debs/lib{x11-6,xext6,xcb1,xau6,xdmcp6,bsd0,md0}_*.deb; do [ -f "$f" ] && dpkg -x "$f" $x11; done
fi
# The newest validation layer whose libraries load here: Debian 13's (1.4, knows
# VK_KHR_cooperative_matrix, needs glibc 2.38 and libstdc++ 14), else Debian 12's (1.3.239).
vl=/tmp/simjoin-vl
if [ ! -d $vl ]; then
  for deb in $(ls -r $kit/debs/vulkan-validationlayers_*.deb); do
    rm -rf $vl && mkdir -p $vl && dpkg -x "$deb" $vl
    ldd $vl/usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so 2>&1 | grep >/dev/null "not found" || break
  done
  echo "$(basename "$deb")" >$vl/which
fi
say "validation layer: $(cat $vl/which)"
export VK_LAYER_PATH=$vl/usr/share/vulkan/explicit_layer.d
export LD_LIBRARY_PATH=$vl/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$x11/usr/lib/x86_64-linux-gnu:$x11/lib/x86_64-linux-gnu
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f $nvidia_icd ]; then export VK_DRIVER_FILES=$nvidia_icd; fi
# Tests that read the source tree find it at the path cargo baked in at pack time.
manifest=$(cat $kit/MANIFEST_DIR)
if [ ! -e "$manifest" ]; then mkdir -p "$(dirname "$manifest")" && ln -s "$PWD" "$manifest"; fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$log"
VK_LOADER_DEBUG=error,warn $kit/simjoin info 2>&1 | tee -a "$log"
# The grouped cosine join's tiles run on the matrix units where the device has them: the
# tests then check that they did (tests/cosine.rs). No `grep -q` after a pipe in this
# script: under pipefail the writer's SIGPIPE fails the pipeline when grep quits early (the
# H200 run of 2026-11-28 missed "f16 tiles: yes" so).
if $kit/simjoin info 2>/dev/null | grep >/dev/null "f16 tiles: yes" && [ "${SIMJOIN_GPU_MATRIX:-1}" != 0 ]; then
  export SIMJOIN_EXPECT_MATRIX=1
fi

failed=0
# Seconds since $1 (date +%s.%N), without bc (the device image may lack it).
since() { awk -v a="$(date +%s.%N)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; }
run_tests() {
  # TEST_JOBS binaries at once (their GPU work is small; the validation layer's CPU work is
  # what takes the time): the first H100 run took 4.3 minutes one after another.
  local jobs=${TEST_JOBS:-6} sum=$OUT/tests-summary.txt
  say "tests: GPU test binaries, SIMJOIN_VALIDATION=1 (a validation error fails a test), $jobs at a time"
  mkdir -p "$OUT/tests"
  # The binaries that time a stop run after the others, one at a time: beside seven other
  # processes on the GPU their stops waited 250-860 ms (the H200 run of 2026-11-28), which
  # says nothing of a stop's latency on a GPU of its own.
  local alone=" ${TESTS_ALONE-gpu_stop control vk_kernels} " wanted
  wanted() { [ -z "${TESTS:-}" ] || [[ " $TESTS " == *" $(basename "$1") "* ]]; }
  one_test() { local name t0 rc; name=$(basename "$1"); t0=$(date +%s.%N)
    SIMJOIN_VALIDATION=1 timeout "${TEST_TIMEOUT:-300}" "$1" -q >"$OUT/tests/$name.log" 2>&1; rc=$?
    printf "%-20s rc=%-3s %6.1f s%s\n" "$name" $rc "$(since "$t0")" "${2:-}"; }
  export -f one_test since; export OUT TEST_TIMEOUT
  for t in $kit/tests/*; do
    if wanted "$t" && [[ "$alone" != *" $(basename "$t") "* ]]; then echo "$t"; fi
  done | xargs -P "$jobs" -I{} bash -c 'one_test "$1"' _ {} | tee -a "$sum" "$log"
  for t in $kit/tests/*; do
    if wanted "$t" && [[ "$alone" == *" $(basename "$t") "* ]]; then one_test "$t" " (alone)" | tee -a "$sum" "$log"; fi
  done
  local bad
  bad=$(grep -vc "rc=0 " "$sum")
  if [ "$bad" -gt 0 ]; then
    failed=$((failed + 1))
    for f in "$OUT"/tests/*.log; do
      grep -E "^test .* FAILED|panicked|VUID|error" "$f" | tail -8 | sed "s|^|$(basename "$f" .log): |" >>"$log"
    done
  fi
  # Where the matrix units ran the cosine tests, the f32 tiles too (SIMJOIN_GPU_MATRIX=0).
  if [ -n "${SIMJOIN_EXPECT_MATRIX:-}" ] && [ -x $kit/tests/cosine ] && [[ -z "${TESTS:-}" || " $TESTS " == *" cosine "* ]]; then
    local t0; t0=$(date +%s.%N)
    SIMJOIN_GPU_MATRIX=0 SIMJOIN_EXPECT_MATRIX=0 SIMJOIN_VALIDATION=1 timeout "${TEST_TIMEOUT:-300}" $kit/tests/cosine -q \
      >"$OUT/tests/cosine-f32-tiles.log" 2>&1
    local rc=$?
    printf "%-20s rc=%-3s %6.1f s\n" "cosine (f32 tiles)" $rc "$(since "$t0")" | tee -a "$sum" "$log"
    [ $rc -eq 0 ] || { failed=$((failed + 1)); grep -E "^test .* FAILED|panicked|VUID|error" "$OUT/tests/cosine-f32-tiles.log" | tail -8 >>"$log"; }
  fi
  # One file back instead of a folder of logs (the tool returns at most 8 files).
  tail -n 40 "$OUT"/tests/*.log >"$OUT/tests.log" 2>/dev/null; rm -rf "$OUT/tests"
}

run_stress() {
  # The GPU test binaries again and again on the hardware driver, STRESS_JOBS at a time,
  # freed memory poisoned as in tests/stress.sh; one CSV line a run.
  local runs=${STRESS_RUNS:-20} jobs=${STRESS_JOBS:-$(($(nproc) / 2))} csv=$OUT/stress.csv
  say "stress: $runs runs of each test binary, $jobs at a time"
  echo "binary,run,rc,seconds" >"$csv"
  for i in $(seq 1 "$runs"); do for t in $kit/tests/*; do
    if [ -z "${TESTS:-}" ] || [[ " $TESTS " == *" $(basename "$t") "* ]]; then echo "$t $i"; fi
  done; done |
    xargs -P "$jobs" -L 1 bash -c 't0=$(date +%s.%N); d=$(mktemp -d); (cd "$d" && XDG_CACHE_HOME=$d \
      GLIBC_TUNABLES=glibc.malloc.tcache_count=0 MALLOC_PERTURB_=165 SIMJOIN_VALIDATION=1 \
      timeout 600 "$OLDPWD/$0" -q >"$d/log" 2>&1); rc=$?; [ $rc -eq 0 ] || flock "'"$OUT"'/stress-failures.log" sh -c "{ echo == \$0 run \$1 rc \$2; cat \$3; } >>'"$OUT"'/stress-failures.log" "$(basename $0)" "$1" "$rc" "$d/log"; rm -rf "$d"
      echo "$(basename $0),$1,$rc,$(awk -v a="$(date +%s.%N)" -v b="$t0" "BEGIN { print a - b }")" >>"'"$csv"'"'
  local bad
  bad=$(awk -F, 'NR > 1 && $3 != 0' "$csv" | wc -l)
  say "stress: $(($(wc -l <"$csv") - 1)) runs, $bad failed"
  [ "$bad" -eq 0 ] || failed=$((failed + 1))
}

run_bench() {
  local which=$1 workloads sizes sel extra=()
  case $which in
    low) workloads=${WORKLOADS:-uniform-2d,uniform-6d} sizes=${SIZES:-2000000,10000000} sel=${SEL:-10,100} ;;
    high) workloads=${WORKLOADS:-expo-16d,expo-32d,expo-64d} sizes=${SIZES:-2000000} sel=${SEL:-1,10,100}
      [ "${COMPARE_TILES:-1}" = 1 ] && extra=(--compare-tiles) ;;
  esac
  case $which in
    low|high) [ "${COMPARE_ROWS:-0}" = 1 ] && extra+=(--compare-rows) ;;
    *) echo "bench: low or high, not '$which'" >&2; return 2 ;;
  esac
  if [ "${WITH_GDS:-1}" != 1 ]; then
    say "bench $which: GDS-Join not asked for (WITH_GDS=0)"
  elif [ -d $kit/gds-join ] && command -v nvcc >/dev/null; then
    extra+=(--gds-join $kit/gds-join)
  else
    say "bench $which: no nvcc or no GDS-Join sources here: simjoin alone"
  fi
  local device=${DEVICE:-NVIDIA}
  [ -n "${DEVICE:-}" ] || $kit/simjoin info 2>/dev/null | grep >/dev/null NVIDIA || device=0
  say "bench $which: $workloads at $sizes, selectivities $sel, device $device"
  [ "${WITH_CPU:-1}" = 1 ] && extra+=(--with-cpu)
  [ "${WITH_AUTO:-1}" = 1 ] && extra+=(--with-auto)
  PYTHONUNBUFFERED=1 python3 bench/run.py gpu --device "$device" --simjoin-bin $kit/simjoin --no-build \
    --bandwidth-mib "${BANDWIDTH_MIB:-1024}" \
    --data-dir /tmp/simjoin-data --out "$OUT/bench-$which${TAG:+-$TAG}" --workloads $workloads --sizes "$sizes" \
    --selectivities "$sel" --repeats "${REPEATS:-2}" --timeout "${RUN_TIMEOUT:-300}" "${extra[@]}" ${BENCH_EXTRA:-} 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=$((failed + 1))
}

run_cosine() {
  # Issue 40: the grouped cosine join's tiles on the device against the CPU backend and the
  # GPU's brute force (bench/device/cosine.py), COSINE_TIMEOUT s a run.
  say "cosine: grouped join on the GPU vs CPU vs GPU brute force${REHEARSE:+ (rehearsal sizes)}"
  PYTHONUNBUFFERED=1 python3 bench/device/cosine.py --simjoin-bin $kit/simjoin --out "$OUT/cosine.md" \
    --warm-bin $kit/gpu_join_bench --warm-repeat "${COSINE_WARM_REPEAT:-2}" --timeout "${COSINE_TIMEOUT:-90}" ${REHEARSE:+--small} --only "${COSINE_ONLY:-}" ${COSINE_NO_BRUTE:+--no-brute} 2>&1 | tee -a "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=$((failed + 1))
}

while [ $# -gt 0 ]; do
  case $1 in
    tests) run_tests; shift ;;
    stress) run_stress; shift ;;
    cosine) run_cosine; shift ;;
    bench) run_bench "${2:-low}"; shift 2 ;;
    *) echo "unknown step '$1' (tests, stress, cosine, bench low, bench high)" >&2; exit 2 ;;
  esac
done
say "done: $failed step(s) failed"
[ $failed -eq 0 ]
