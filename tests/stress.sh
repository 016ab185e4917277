#!/usr/bin/env bash
# Stress pass: runs the Vulkan and GPU test binaries (lavapipe, validation on) RUNS times
# each (default 10), with freed memory poisoned, each run with a fresh, empty cache
# directory (Mesa's shader cache and the validation layer's cache start cold, as on a fresh
# machine), while busy loops load the cores. Any failed run (a crash included) fails
# the pass; its log is kept. SIMJOIN_STRESS_CACHE=warm keeps the user's own cache directory
# instead (CI: tests/run.sh has just filled it, and a cold cache made each binary about six
# times slower, 170 s against 27 s for gpu_dot_filter, which put CI past its hour; the
# cold first compile of every kernel is still run once there, by tests/run.sh on a fresh
# machine). Do not pause a run (SIGSTOP) to free the cores: the
# validation layer bounds its own waits by 10 s of wall time and reports
# UNASSIGNED-VkSemaphore-state-timeout when a pause spans one (reproduced with 11 s stops).
#   bash tests/stress.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-${SIMJOIN_STRESS_RUNS:-10}}
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/share/vulkan/icd.d/lvp_icd.x86_64.json}
export SIMJOIN_VALIDATION=1
# glibc poisons freed memory (tcache off, so every free is poisoned): a write into freed
# memory, by simjoin or by the driver, then crashes instead of passing unnoticed. This is
# what made issue 10's rare SIGSEGV (lavapipe writing into a destroyed semaphore) show.
export GLIBC_TUNABLES=glibc.malloc.tcache_count=0 MALLOC_PERTURB_=165
bins=(vk_kernels gpu_join gpu_device_index gpu_dot_filter gpu_lifetimes engine_lifecycle kernel_interface gpu_lss)
cargo test --release --no-run -p simjoin "${bins[@]/#/--test=}" 2>/dev/null >/dev/null
logs=target/stress; mkdir -p "$logs"
load() { while :; do :; done; }
# Busy loops beside the tests (SIMJOIN_STRESS_LOADERS, default 2: both cores of a 2-core
# machine loaded). CI runs one: a round with two took about 20 minutes there.
pids=()
for _ in $(seq 1 "${SIMJOIN_STRESS_LOADERS:-2}"); do
  load &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
# A crash leaves a core file (core_pattern permitting): its backtrace goes into the log.
ulimit -c unlimited 2>/dev/null || true
failed=0
for name in "${bins[@]}"; do
  bin=$(ls -t target/release/deps/"$name"-* | grep -v '\.d$' | head -1)
  bad=0
  for i in $(seq 1 "$runs"); do
    cache=$(mktemp -d)
    rm -f "$cache"/core*
    xdg=$cache
    [ "${SIMJOIN_STRESS_CACHE:-cold}" = warm ] && xdg=${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}
    t0=$SECONDS
    if ! (cd "$cache" && XDG_CACHE_HOME=$xdg "$OLDPWD/$bin" -q) >"$logs/$name-$i.log" 2>&1; then
      bad=$((bad + 1)); echo "stress: $name run $i failed (log: $logs/$name-$i.log)"; tail -5 "$logs/$name-$i.log"
      core=$(ls "$cache"/core* 2>/dev/null | head -1)
      if [ -n "$core" ] && command -v gdb >/dev/null; then
        gdb -q -batch -ex "thread apply all bt 25" "$bin" "$core" >>"$logs/$name-$i.log" 2>&1 || true
        grep -m 30 -E '^#|^Thread' "$logs/$name-$i.log" || true
      fi
    else
      rm -f "$logs/$name-$i.log"
    fi
    rm -rf "$cache"
  done
  echo "stress: $name: $((runs - bad)) of $runs runs passed (last run $((SECONDS - t0)) s)"
  failed=$((failed + bad))
done
echo "stress: $((${#bins[@]} * runs - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
