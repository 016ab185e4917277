#!/usr/bin/env bash
# AddressSanitizer (with LeakSanitizer) over the Vulkan and GPU test binaries: the Rust
# code, the ash calls and the buffers the driver reads, built with nightly's
# -Zsanitizer=address (the driver itself is not instrumented). Leaks inside the driver and
# the validation layer are suppressed (tests/lsan-vulkan.supp); any other leak, and any
# memory error, fails the pass.
# The CPU join and distances tests run under it too: the CSR from whole rows writes into
# memory not yet initialised (cpu/rows.rs).
#   bash tests/asan.sh [test-binary ...]     (default: the Vulkan lifetime and kernel tests,
#                                             the CPU join and distances tests)
set -euo pipefail
cd "$(dirname "$0")/.."
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/share/vulkan/icd.d/lvp_icd.x86_64.json}
export SIMJOIN_VALIDATION=1
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(gpu_lifetimes kernel_interface engine_lifecycle vk_kernels cpu_join distances)
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal
fi
target=x86_64-unknown-linux-gnu
export CARGO_TARGET_DIR=target/asan
RUSTFLAGS="-Zsanitizer=address" cargo +nightly test --release --target "$target" --no-run \
  -p simjoin "${bins[@]/#/--test=}" 2>/dev/null >/dev/null
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
# engine_lifecycle's resident-set check: see the test.
export SIMJOIN_TEST_RSS_BUDGET_MIB=256
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan-vulkan.supp:print_suppressions=0
failed=0
for name in "${bins[@]}"; do
  bin=$(ls -t "$CARGO_TARGET_DIR/$target/release/deps/$name"-* | grep -v '\.d$' | head -1)
  log=$CARGO_TARGET_DIR/$name.log
  if "$bin" -q >"$log" 2>&1; then
    echo "asan: $name clean"
  else
    failed=$((failed + 1)); echo "asan: $name FAILED (log: $log)"; grep -m 20 -E "ERROR|SUMMARY|#[0-9] " "$log" || tail -20 "$log"
  fi
done
[ "$failed" -eq 0 ]
