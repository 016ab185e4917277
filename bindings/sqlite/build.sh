#!/usr/bin/env bash
# Builds the simjoin SQLite loadable extension and prints its path (build/sqlite/simjoin.so).
#   bash bindings/sqlite/build.sh [SIMJOIN_PREFIX]
# SIMJOIN_PREFIX (argument or environment variable): a prefix made by cmake/install.cmake.
# Without one, the library is built from this repository and installed into build/prefix.
# Needs libsqlite3-dev (sqlite3ext.h). Load it with `.load build/sqlite/simjoin` in the
# sqlite3 shell or conn.load_extension("build/sqlite/simjoin") in Python.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
prefix=${1:-${SIMJOIN_PREFIX:-}}
if [ -z "$prefix" ]; then
  prefix=$root/build/prefix
  (cd "$root" && cargo build --release --lib >&2 && cmake -DPREFIX="$prefix" -P cmake/install.cmake >/dev/null)
fi
prefix=$(cd "$prefix" && pwd)
build=$root/build/sqlite
cmake -S "$here" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" >&2
echo "$build/simjoin.so"
