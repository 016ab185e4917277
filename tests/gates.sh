#!/usr/bin/env bash
# CI gates beside the tests: formatting, clippy with warnings denied (every `unsafe` block
# must carry a SAFETY comment: clippy::undocumented_unsafe_blocks), rustdoc with warnings
# denied, a check with the MSRV Cargo.toml declares, and the library without the `gpu`
# feature (no shaderc, no Vulkan) built and tested on its own; and the layout table of
# docs/architecture.md naming every top-level folder and every file of src/, and the README
# linking every page of docs/.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== docs/architecture.md's Layout table names every top-level folder and every file directly in src/"
layout=$(awk '/^## Layout/{on=1; next} /^## /{on=0} on' docs/architecture.md)
missing=0
tracked=$(git ls-files)
dirs=$(grep / <<<"$tracked" | grep -v '^\.' | cut -d/ -f1 | sort -u | sed 's|$|/|')
src_dirs=$(grep '^src/[^/]*/' <<<"$tracked" | cut -d/ -f1-2 | sort -u | sed 's|$|/|')
for path in $dirs $src_dirs $(grep '^src/[^/]*\.rs$' <<<"$tracked"); do
  if ! grep -qF "\`$path" <<<"$layout"; then
    echo "docs/architecture.md's Layout table does not name $path"; missing=1
  fi
done
[ "$missing" = 0 ]

echo "== README.md links every page of docs/"
for page in $(grep '^docs/.*\.md$' <<<"$tracked"); do
  if ! grep -qF "]($page)" README.md; then
    echo "README.md does not link $page"; missing=1
  fi
done
[ "$missing" = 0 ]

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (all targets, warnings denied)"
cargo clippy --workspace --all-targets --release -- -D warnings

echo "== rustdoc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc -p simjoin --no-deps --release

msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml | head -1)
echo "== MSRV check (Rust $msrv, as Cargo.toml declares)"
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
  rustup toolchain install "$msrv" --profile minimal
fi
# `check`: what a version decides (syntax, the standard library's API, inference, build
# scripts) without code generation, which took 4 of this gate's 5 minutes on 2 cores.
CARGO_TARGET_DIR=target/msrv cargo "+$msrv" check --workspace --release --locked
# A CI machine's disk is small: SIMJOIN_TIDY=1 drops each gate's build once it passed.
if [ "${SIMJOIN_TIDY:-0}" = 1 ]; then rm -rf target/msrv; fi

echo "== without the gpu feature: CPU backend only (no shaderc, no Vulkan loader)"
CARGO_TARGET_DIR=target/no-gpu cargo test --release --locked -p simjoin --no-default-features
# The command without the feature is checked, not built: its build recompiles the library
# with the command's features (3.5 minutes on 2 cores) and nothing runs it.
CARGO_TARGET_DIR=target/no-gpu cargo check --release --locked -p simjoin-cli --no-default-features
if [ "${SIMJOIN_TIDY:-0}" = 1 ]; then rm -rf target/no-gpu; fi
