#!/usr/bin/env bash
# Builds the simjoin PostgreSQL extension (PGXS) and installs it for the pg_config on PATH
# (or $PG_CONFIG), linked against an installed libsimjoin found through pkg-config.
#   bash bindings/postgres/install.sh [SIMJOIN_PREFIX]
# SIMJOIN_PREFIX (argument or environment variable) is a prefix made by cmake/install.cmake
# (it has lib/pkgconfig/simjoin.pc). Without one, the library is built from this repository
# (cargo build --release --lib) and installed into build/prefix first.
# SIMJOIN_PG_LINK picks how the module gets the library (neither leaves a path into the
# prefix or the build tree in the module):
#   static (default): libsimjoin.a is linked into simjoin.so, which needs nothing else;
#   shared: simjoin.so needs libsimjoin.so.<ABI>, copied next to it into PostgreSQL's
#           library directory (pg_config --pkglibdir) and found there through RUNPATH $ORIGIN;
#   system: simjoin.so needs libsimjoin.so.<ABI> from the system's library path (a
#           package that installs libsimjoin in /usr/lib); nothing is copied.
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
pkglibdir=$("$pg_config" --pkglibdir)
link=${SIMJOIN_PG_LINK:-static}
case $link in
  static)
    # -l:libsimjoin.a picks the archive over the shared library; the Rust library's symbols
    # stay out of the module's dynamic symbol table.
    libs="$(pkg-config --static --libs simjoin | sed 's/-lsimjoin/-l:libsimjoin.a/') -Wl,--exclude-libs,ALL" ;;
  shared)
    # make turns \$$ORIGIN into \$ORIGIN, and the shell into $ORIGIN.
    libs="$(pkg-config --libs simjoin) -Wl,-rpath,\\\$\$ORIGIN" ;;
  system)
    libs="$(pkg-config --libs simjoin)" ;;
  *)
    echo "install.sh: SIMJOIN_PG_LINK must be static, shared or system, not '$link'" >&2
    exit 1 ;;
esac
build=$root/build/postgres-ext
rm -rf "$build"
mkdir -p "$build"
cp "$here"/Makefile "$here"/simjoin.control "$here"/simjoin--*.sql "$here"/simjoin_pg.c \
  "$root"/bindings/common/sj_pipe.c "$root"/bindings/common/sj_pipe.h "$build"/
make -s -C "$build" PG_CONFIG="$pg_config" \
  SIMJOIN_CFLAGS="$(pkg-config --cflags simjoin)" SIMJOIN_LIBS="$libs"
make -s -C "$build" PG_CONFIG="$pg_config" install
if [ "$link" = shared ]; then
  soname=$(readelf -d "$libdir/libsimjoin.so" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
  install -m 755 "$libdir/libsimjoin.so" "$pkglibdir/$soname"
fi
echo "simjoin extension installed in $pkglibdir/simjoin.so ($link link to libsimjoin)"
