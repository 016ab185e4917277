#!/usr/bin/env bash
# The main job on a fresh machine: install what is missing, build, and run a real join on
# generated data (200,000 clustered 3-D points), printing what it found.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-debian.sh --build
if [ ! -x target/release/simjoin ]; then
  echo "demo: building simjoin first (about 15 minutes on 2 cores the first time; seconds after)" >&2
fi
cargo run --release --bin simjoin -- demo "$@"
