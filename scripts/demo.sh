#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, and run a real join on
# generated data (200,000 clustered 3-D points), printing what it found.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-debian.sh
cargo run --release --bin simjoin -- demo "$@"
