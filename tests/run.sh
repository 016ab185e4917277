#!/usr/bin/env bash
# The whole test suite: Rust unit and integration tests (GPU paths on lavapipe with the
# Vulkan validation layers on; the CLI in tests/cli.rs; the header check in tests/header.rs),
# then the C/C++ tests under ctest (shared, static, and AddressSanitizer builds), the static
# link line check, the database extensions (PostgreSQL and SQLite, tests/db/run.sh), the
# Python tests under pytest, and the randomised differential tests (tests/fuzz).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# System packages (Vulkan, lavapipe, validation layers, shaderc, CMake, venv): installed only
# when missing, so this one command also works on a fresh Debian/Ubuntu machine.
bash scripts/setup-debian.sh
# Pin the software GPU so GPU-path tests are reproducible on any machine.
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/share/vulkan/icd.d/lvp_icd.x86_64.json}
export SIMJOIN_VALIDATION=1
jobs=$(nproc 2>/dev/null || echo 2)

echo "== Rust tests (library and command) [at ${SECONDS} s]"
cargo test --release --workspace

echo "== C and C++ tests (ctest) [at ${SECONDS} s]"
cargo build --release -p simjoin --lib
prefix=$root/build/prefix
cmake -DPREFIX="$prefix" -P cmake/install.cmake >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
for variant in shared static asan; do
  flags=()
  case $variant in
    static) flags=(-DSIMJOIN_STATIC=ON) ;;
    asan) flags=(-DSIMJOIN_ASAN=ON) ;;
  esac
  cmake -S tests/c -B "build/c-$variant" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Debug \
    "${flags[@]}" >/dev/null
  cmake --build "build/c-$variant" -j "$jobs" >/dev/null
  echo "-- ctest ($variant)"
  ctest --test-dir "build/c-$variant" --output-on-failure
done
bash tests/check-static-libs.sh
# The installed shared library carries the ABI version in its SONAME, and the C tests
# record that name.
abi=$(sed -n 's/^#define SIMJOIN_ABI_VERSION \([0-9]*\)/\1/p' include/simjoin.h)
objdump -p "$prefix/lib/libsimjoin.so.$abi" | grep -q "SONAME *libsimjoin.so.$abi" ||
  { echo "libsimjoin.so.$abi has no SONAME libsimjoin.so.$abi" >&2; exit 1; }
objdump -p build/c-shared/test_join | grep -q "NEEDED *libsimjoin.so.$abi" ||
  { echo "test_join does not record libsimjoin.so.$abi" >&2; exit 1; }
echo "-- SONAME: libsimjoin.so.$abi"

echo "== Database extensions [at ${SECONDS} s]"
# PostgreSQL (a throwaway server) and SQLite, against the library installed in build/prefix.
bash tests/db/run.sh "$prefix"

echo "== Python tests (pytest) [at ${SECONDS} s]"
venv=$root/target/pyvenv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# scikit-learn: the kNN tests compare with its kneighbors; dask, distributed, pandas and
# pyarrow: simjoin.dask on a LocalCluster; faiss-cpu and matplotlib: the benchmark
# harness's own tests (its peers and plots). distributed at least 2024.1, as the package's
# `dask` extra asks: when a dask release had no distributed of its own yet, pip fell back
# to distributed 2021.4.1, which cannot import with a new dask (2026-12-06).
"$venv/bin/python" -m pip install -q numpy scipy pytest scikit-learn 'dask[dataframe]' 'distributed>=2024.1' pandas pyarrow duckdb polars faiss-cpu matplotlib
# Reinstall the package (no cache) so it bundles the library just built.
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps --no-cache-dir ./bindings/python
# Run from outside the source tree so the installed package, not bindings/python/src, is tested.
(cd /tmp && "$venv/bin/python" -m pytest -q "$root/bindings/python/tests")

echo "== The wheel: built (scripts/build-wheel.sh), installed where cargo is not on PATH, checked [at ${SECONDS} s]"
bash tests/wheel_smoke.sh

echo "== Randomised differential tests (tests/fuzz/fuzz.py: every backend against an oracle) [at ${SECONDS} s]"
for what in join knn dbscan; do
  (cd /tmp && "$venv/bin/python" "$root/tests/fuzz/fuzz.py" "$what" --seed 1 --iterations 150)
done
# Cosine cases are larger (up to 5,000 rows, where the grouped index runs; 1024-D): fewer.
for what in cosine cosine-knn; do
  (cd /tmp && "$venv/bin/python" "$root/tests/fuzz/fuzz.py" "$what" --seed 1 --iterations 40)
done

echo "== Benchmark harness tests (pytest) [at ${SECONDS} s]"
# The harness's logic (peers' counts normalised, eps by sampling, the runners, the gpu
# mode with GDS-Join) against fake binaries: no benchmark is timed here.
(cd bench && "$venv/bin/python" -m pytest -q tests)
