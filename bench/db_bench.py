"""Times simjoin_self_join against PostGIS self-joins in one server (run by bench/db_bench.sh).

Per case: a table of n uniform random points in the unit square/cube (setseed), with x, y[, z]
columns and a GiST-indexed geometry column; then, with the table warm,
  simjoin:  SELECT count(*) FROM simjoin_self_join('SELECT id, x, y FROM t', eps)
  PostGIS:  SELECT count(*) FROM t a JOIN t b ON a.id < b.id AND ST_DWithin(a.geom, b.geom, eps)
(ST_3DDWithin and a gist_geometry_ops_nd index in 3-D). Wall-clock seconds of the whole SQL
statement as psql's \\timing reports it; the best of `reps` runs. Pair counts must agree.

--geography: points on the Earth instead (issue 41): a GiST-indexed `geography` column of n
GPS-like positions over a city (uniform in a 20 km x 20 km square around Paris) or uniform
over the globe, then
  simjoin:  SELECT count(*) FROM simjoin_self_join('t', 'id', ARRAY['g'], eps, 'haversine')
  PostGIS:  SELECT count(*) FROM t a JOIN t b ON a.id < b.id AND ST_DWithin(a.g, b.g, eps, false)
(eps in metres; `false`: PostGIS's sphere, as ST_DistanceSphere). PostGIS's sphere radius
(2a + b) / 3 = 6,371,008.7714 m is simjoin's 6,371,008.8 m less 3e-8 relative, so a pair
within about 3e-8 eps of eps may be counted by one only: the counts may differ by a few.
"""
import argparse
import os
import re
import subprocess
import sys

CASES = [  # (dims, n, eps): about 8 neighbours per point
    (2, 100_000, 0.005),
    (2, 1_000_000, 0.0016),
    (3, 100_000, 0.025),
    (3, 1_000_000, 0.0115),
]


GEO_CASES = [  # (place, n, eps metres): about 8 neighbours per point
    ("city", 100_000, 100.0),
    ("city", 1_000_000, 32.0),
    ("globe", 1_000_000, 36_000.0),
]


def psql(args, sql):
    cmd = ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", args.host, "-p",
           str(args.port), "-U", "postgres", "-c", "\\timing on"]
    for stmt in [sql] if isinstance(sql, str) else sql:
        cmd += ["-c", stmt]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"psql failed: {sql}\n{r.stderr}")
    lines = r.stdout.strip().splitlines()
    times = [float(m.group(1)) / 1000 for m in (re.match(r"Time: ([\d.]+) ms", l) for l in lines) if m]
    values = [l for l in lines if not l.startswith("Time:")]
    return values, times


def timed(args, sql, reps):
    best, value = None, None
    for _ in range(reps):
        values, times = psql(args, sql)  # the last statement is the timed one
        value = int(values[-1])
        best = times[-1] if best is None else min(best, times[-1])
    return value, best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    ap.add_argument("--max-n", type=int, default=10**9)
    ap.add_argument("--geography", action="store_true", help="points on the Earth (geography) instead")
    args = ap.parse_args()
    psql(args, "CREATE EXTENSION IF NOT EXISTS postgis; CREATE EXTENSION IF NOT EXISTS simjoin")
    if args.geography:
        return geography(args)
    version = psql(args, "SELECT postgis_lib_version() || ' / ' || version()")[0][0]
    cores = psql(args, "SHOW max_parallel_workers_per_gather")[0][0]
    print(f"PostGIS / PostgreSQL: {version}; max_parallel_workers_per_gather = {cores}; "
          "simjoin through the table form with simjoin.max_threads = all cores unless noted",
          file=sys.stderr)
    rows = []
    for dims, n, eps in CASES:
        if n > args.max_n:
            continue
        t = f"pts{dims}d_{n}"
        cols = "x, y" if dims == 2 else "x, y, z"
        make = f"ST_MakePoint({cols})"
        opclass = "" if dims == 2 else " gist_geometry_ops_nd"
        psql(args, f"DROP TABLE IF EXISTS {t}; SELECT setseed(0.25); "
                   f"CREATE TABLE {t} AS SELECT g AS id, {', '.join('random() AS ' + c for c in cols.split(', '))} "
                   f"FROM generate_series(1, {n}) g; "
                   f"ALTER TABLE {t} ADD COLUMN geom geometry; UPDATE {t} SET geom = {make}; "
                   f"CREATE INDEX ON {t} USING gist (geom{opclass})")
        psql(args, [f"VACUUM ANALYZE {t}", f"SELECT count(*) FROM {t}"])
        reps = 2 if n <= 100_000 else 1
        within = "ST_DWithin" if dims == 2 else "ST_3DDWithin"
        # The table form (no SQL built by the caller); every core allowed (a superuser
        # setting, default 4).
        coords = "ARRAY[" + ", ".join(f"'{c}'" for c in cols.split(", ")) + "]"
        sj_sql = [f"SET simjoin.max_threads = {os.cpu_count()}",
                  f"SELECT count(*) FROM simjoin_self_join('{t}', 'id', {coords}, {eps})"]
        pg_sql = (f"SELECT count(*) FROM {t} a JOIN {t} b ON a.id < b.id AND "
                  f"{within}(a.geom, b.geom, {eps})")
        sj_pairs, sj_s = timed(args, sj_sql, reps)
        sj1_pairs, sj1_s = timed(args, ["SET simjoin.threads = 1", sj_sql[-1]], reps)
        pg_pairs, pg_s = timed(args, pg_sql, reps)
        plan = psql(args, "EXPLAIN " + pg_sql)[0]
        uses_index = any("Index" in l for l in plan)
        ok = sj_pairs == pg_pairs == sj1_pairs
        rows.append((dims, n, eps, sj_pairs, pg_pairs, sj_s, sj1_s, pg_s, uses_index, ok))
        print(f"{dims}-D n={n} eps={eps}: simjoin {sj_pairs} pairs {sj_s:.2f} s "
              f"(1 thread {sj1_s:.2f} s), PostGIS {pg_pairs} pairs {pg_s:.2f} s, "
              f"index used: {uses_index}, ratio {pg_s / sj_s:.1f}x", file=sys.stderr, flush=True)
    print("| dims | n | eps | pairs | simjoin s | simjoin s (1 thread) | PostGIS s | PostGIS / simjoin | PostGIS / simjoin (1 thread) | counts equal |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dims, n, eps, sjp, pgp, sj_s, sj1_s, pg_s, idx, ok in rows:
        pairs = f"{sjp}" if sjp == pgp else f"{sjp} vs PostGIS {pgp}"
        print(f"| {dims} | {n:,} | {eps} | {pairs} | {sj_s:.2f} | {sj1_s:.2f} | {pg_s:.2f} | "
              f"{pg_s / sj_s:.1f}x | {pg_s / sj1_s:.1f}x | {'yes' if ok else 'NO'} |")
    sys.exit(0 if all(r[-1] for r in rows) else 1)


def geography(args):
    version = psql(args, "SELECT postgis_lib_version() || ' / ' || version()")[0][0]
    print(f"PostGIS / PostgreSQL: {version}; simjoin.max_threads = all cores", file=sys.stderr)
    rows = []
    for place, n, eps in GEO_CASES:
        if n > args.max_n:
            continue
        t = f"geo_{place}_{n}"
        if place == "city":
            # 20 km x 20 km around Paris: 0.18 degrees of latitude, 0.27 of longitude.
            lat, lon = "48.766 + 0.18 * random()", "2.217 + 0.27 * random()"
        else:
            lat, lon = "degrees(asin(2 * random() - 1))", "360 * random() - 180"
        psql(args, f"DROP TABLE IF EXISTS {t}; SELECT setseed(0.5); "
                   f"CREATE TABLE {t} AS SELECT g AS id, "
                   f"ST_SetSRID(ST_MakePoint({lon}, {lat}), 4326)::geography AS g "
                   f"FROM generate_series(1, {n}) g; CREATE INDEX ON {t} USING gist (g)")
        psql(args, [f"VACUUM ANALYZE {t}", f"SELECT count(*) FROM {t}"])
        reps = 2 if n <= 100_000 else 1
        # A warm session for both: PostGIS's and simjoin's libraries loaded, simjoin's
        # engine made, by a statement before the timed one (a fresh backend spends about
        # 0.1 s on that once).
        warm = [f"SET simjoin.max_threads = {os.cpu_count()}",
                "SELECT count(*) FROM simjoin_self_join('SELECT 1, 0.0::float8, 0.0::float8', 1.0, 'haversine')"]
        sj_sql = warm + [f"SELECT count(*) FROM simjoin_self_join('{t}', 'id', ARRAY['g'], {eps}, 'haversine')"]
        pg_sql = warm + [f"SELECT count(*) FROM {t} a JOIN {t} b ON a.id < b.id AND "
                         f"ST_DWithin(a.g, b.g, {eps}, false)"]
        sj_pairs, sj_s = timed(args, sj_sql, reps)
        pg_pairs, pg_s = timed(args, pg_sql, reps)
        plan = psql(args, "EXPLAIN " + pg_sql[-1])[0]
        uses_index = any("Index" in l for l in plan)
        rows.append((place, n, eps, sj_pairs, pg_pairs, sj_s, pg_s, uses_index))
        print(f"{place} n={n} eps={eps} m: simjoin {sj_pairs} pairs {sj_s:.2f} s, PostGIS {pg_pairs} "
              f"pairs {pg_s:.2f} s, index used: {uses_index}, ratio {pg_s / sj_s:.1f}x",
              file=sys.stderr, flush=True)
    print("| points | n | eps (m) | pairs | simjoin s | PostGIS s | PostGIS / simjoin | PostGIS's count | GiST index used |")
    print("|---|---|---|---|---|---|---|---|---|")
    for place, n, eps, sjp, pgp, sj_s, pg_s, idx in rows:
        diff = "equal" if sjp == pgp else f"{pgp - sjp:+d}"
        print(f"| {place} | {n:,} | {eps:g} | {sjp} | {sj_s:.2f} | {pg_s:.2f} | {pg_s / sj_s:.1f}x | "
              f"{diff} | {'yes' if idx else 'NO'} |")
    # Counts within a few pairs of each other (the spheres' radii differ by 3e-8).
    sys.exit(0 if all(abs(r[3] - r[4]) <= max(2, r[3] // 10**6) for r in rows) else 1)


if __name__ == "__main__":
    main()
