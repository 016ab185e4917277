#!/usr/bin/env bash
# simjoin_self_join against a PostGIS self-join (ST_DWithin / ST_3DDWithin on a GiST-indexed
# geometry column) in one PostgreSQL server, on uniform 2-D and 3-D points; pair counts must
# agree. Writes a Markdown table on stdout (bench/DB_RESULTS.md records a run).
#   bash bench/db_bench.sh [SIMJOIN_PREFIX]
# Needs postgresql-15-postgis-3 (apt) besides what tests/db/run.sh needs. Starts a throwaway
# server (as the unprivileged user simjoin_pg when run as root), like the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
prefix=${1:-${SIMJOIN_PREFIX:-$root/build/prefix}}
if [ ! -f "$prefix/lib/pkgconfig/simjoin.pc" ]; then
  cargo build --release --lib
  cmake -DPREFIX="$prefix" -P cmake/install.cmake >/dev/null
fi
bash bindings/postgres/install.sh "$prefix" >&2
bindir=$(pg_config --bindir)
tmp=$(mktemp -d /tmp/simjoin-db-bench.XXXXXX)
chmod 755 "$tmp"
run_pg=()
if [ "$(id -u)" = 0 ]; then
  id simjoin_pg >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /usr/sbin/nologin simjoin_pg
  chown simjoin_pg "$tmp"
  run_pg=(runuser -u simjoin_pg --)
fi
trap '"${run_pg[@]}" "$bindir/pg_ctl" -D "$tmp/data" -m fast stop >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
port=$((20000 + RANDOM % 20000))
(cd "$tmp" && "${run_pg[@]}" "$bindir/initdb" -D "$tmp/data" -A trust -U postgres >/dev/null)
(cd "$tmp" && "${run_pg[@]}" "$bindir/pg_ctl" -D "$tmp/data" -l "$tmp/server.log" -w \
  -o "-k $tmp -p $port -c listen_addresses='' -c shared_buffers=1GB -c fsync=off" start >/dev/null)
python3 bench/db_bench.py --host "$tmp" --port "$port" "${@:2}"
