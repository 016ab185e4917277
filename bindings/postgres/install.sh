#!/usr/bin/env bash
# Builds the simjoin PostgreSQL extension (PGXS) and installs it for the pg_config on PATH
# (or $PG_CONFIG), linked against an installed libsimjoin found through pkg-config.
#   bash bindings/postgres/install.sh [SIMJOIN_PREFIX]
# SIMJOIN_PREFIX (argument or environment variable) is a prefix made by cmake/install.cmake
# (it has lib/pkgconfig/simjoin.pc). Without one, the library is built from this repository
# (cargo build --release --lib) and installed into build/prefix first. The extension records
# the library's directory as its RPATH, so the server must be able to read that prefix.
# Needs postgresql-server-dev-<version> (Debian) and write access to PostgreSQL's directories.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
prefix=${1:-${SIMJOIN_PREFIX:-}}
if [ -z "$prefix" ]; then
  prefix=$root/build/prefix
  (cd "$root" && cargo build --release --lib && cmake -DPREFIX="$prefix" -P cmake/install.cmake >/dev/null)
fi
prefix=$(cd "$prefix" && pwd)
pg_config=${PG_CONFIG:-pg_config}
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
if ! pkg-config --exists simjoin; then
  echo "install.sh: $prefix/lib/pkgconfig/simjoin.pc not found (install with cmake/install.cmake)" >&2
  exit 1
fi
libdir=$(pkg-config --variable=libdir simjoin)
build=$root/build/postgres-ext
rm -rf "$build"
mkdir -p "$build"
cp "$here"/Makefile "$here"/simjoin.control "$here"/simjoin--*.sql "$here"/simjoin_pg.c \
  "$root"/bindings/common/sj_pipe.c "$root"/bindings/common/sj_pipe.h "$build"/
make -s -C "$build" PG_CONFIG="$pg_config" \
  SIMJOIN_CFLAGS="$(pkg-config --cflags simjoin)" \
  SIMJOIN_LIBS="$(pkg-config --libs simjoin) -Wl,-rpath,$libdir"
make -s -C "$build" PG_CONFIG="$pg_config" install
echo "simjoin extension installed in $("$pg_config" --pkglibdir)/simjoin.so (libsimjoin from $libdir)"
