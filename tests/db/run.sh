#!/usr/bin/env bash
# Tests of the database extensions (bindings/postgres, bindings/sqlite) against a NumPy
# brute-force oracle: starts a throwaway PostgreSQL server (initdb in a temporary directory,
# Unix socket only, run as the unprivileged user simjoin_pg when started as root), installs
# the extension, builds the SQLite extension, and runs tests/db/test_db.py.
#   bash tests/db/run.sh [SIMJOIN_PREFIX]
# SIMJOIN_PREFIX defaults to build/prefix (built and installed from the repository when it
# is missing). Installing the PostgreSQL extension writes into pg_config's directories, so
# this needs root (or write access there).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
prefix=${1:-${SIMJOIN_PREFIX:-$root/build/prefix}}
if [ ! -f "$prefix/lib/pkgconfig/simjoin.pc" ]; then
  nice -n 10 cargo build --release --lib
  cmake -DPREFIX="$prefix" -P cmake/install.cmake >/dev/null
fi
prefix=$(cd "$prefix" && pwd)

echo "-- building the extensions"
bash bindings/postgres/install.sh "$prefix" >/dev/null
sqlite_ext=$(bash bindings/sqlite/build.sh "$prefix" 2>/dev/null)
# The installed module must not find libsimjoin through a path into the build tree.
module=$(pg_config --pkglibdir)/simjoin.so
if readelf -d "$module" | grep -E 'R(UN)?PATH' | grep -qF "$root" ||
  ldd "$module" | grep -qE "not found|$root"; then
  echo "FAIL: $module needs a path into $root:" >&2
  readelf -d "$module" | grep -E 'NEEDED|R(UN)?PATH' >&2
  exit 1
fi

# The oracle's Python: Debian's python3 (its sqlite3 module has enable_load_extension, which
# pyenv builds often lack) in a virtual environment with NumPy.
venv=$root/target/dbvenv
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv "$venv"
fi
"$venv/bin/python" -c "import numpy" 2>/dev/null || "$venv/bin/python" -m pip install -q numpy

# A throwaway server. PostgreSQL refuses to run as root: use an unprivileged user.
bindir=$(pg_config --bindir)
tmp=$(mktemp -d /tmp/simjoin-db-test.XXXXXX)
chmod 755 "$tmp"
run_pg=()
if [ "$(id -u)" = 0 ]; then
  id simjoin_pg >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /usr/sbin/nologin simjoin_pg
  chown simjoin_pg "$tmp"
  run_pg=(runuser -u simjoin_pg --)
fi
stop_server() {
  "${run_pg[@]}" "$bindir/pg_ctl" -D "$tmp/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap stop_server EXIT
port=$((20000 + RANDOM % 20000))
(cd "$tmp" && "${run_pg[@]}" "$bindir/initdb" -D "$tmp/data" -A trust -U postgres >/dev/null)
# SIMJOIN_PIPE_DEBUG makes the extension log one line per stopped join (the cancel tests
# read it from the server log).
# VK_DRIVER_FILES: the GPU backend runs on lavapipe, as in the other tests.
(cd "$tmp" && "${run_pg[@]}" env SIMJOIN_PIPE_DEBUG=1 \
  VK_DRIVER_FILES="${VK_DRIVER_FILES:-/usr/share/vulkan/icd.d/lvp_icd.x86_64.json}" "$bindir/pg_ctl" -D "$tmp/data" \
  -l "$tmp/server.log" -w -o "-k $tmp -p $port -c listen_addresses='' -c fsync=off" start >/dev/null)

"$venv/bin/python" tests/db/test_db.py --pg-host "$tmp" --pg-port "$port" \
  --pg-log "$tmp/server.log" --sqlite-ext "$sqlite_ext"
