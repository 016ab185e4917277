#!/usr/bin/env bash
# The whole test suite: Rust unit and integration tests (GPU paths on lavapipe with the
# Vulkan validation layers on), then the C, Python and CLI tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# Pin the software GPU so GPU-path tests are reproducible on any machine.
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/share/vulkan/icd.d/lvp_icd.x86_64.json}
export SIMJOIN_VALIDATION=1
cargo test --release
