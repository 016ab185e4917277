"""Tests of the simjoin PostgreSQL and SQLite extensions (run by tests/db/run.sh).

Every join's pair set must equal a NumPy brute-force oracle's exactly, and every distance
must match the oracle's (same double formula, to 1e-12 relative). Also: SQL errors for bad
input with the server still up, cancel and statement_timeout stopping a long join, a result
far beyond work_mem (spilled to disk), the sqlite3 shell and Python's sqlite3 module.
"""
import argparse
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time

import numpy as np

ARGS = None
FAILURES = []
METRICS = ["euclidean", "manhattan", "chebyshev"]


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)
    return cond


# ---------------------------------------------------------------- oracle


def dist_matrix(x, y, metric):
    d = x[:, None, :] - y[None, :, :]
    if metric == "euclidean":
        return np.sqrt((d * d).sum(axis=2))
    if metric == "manhattan":
        return np.abs(d).sum(axis=2)
    return np.abs(d).max(axis=2)


def oracle(ids_a, xa, eps, metric, ids_b=None, xb=None):
    """{(id_a, id_b): distance} by brute force, in blocks; self-join when xb is None."""
    self_join = xb is None
    if self_join:
        ids_b, xb = ids_a, xa
    out = {}
    for s in range(0, len(xa), 512):
        d = dist_matrix(xa[s:s + 512], xb, metric)
        # simjoin's rule (src/metric.rs): Euclidean compares the squared distance with eps*eps.
        ii, jj = np.nonzero(d * d <= eps * eps if metric == "euclidean" else d <= eps)
        for i, j in zip(ii, jj):
            gi = s + i
            if self_join:
                if gi >= j:
                    continue
                key = (min(ids_a[gi], ids_b[j]), max(ids_a[gi], ids_b[j]))
            else:
                key = (ids_a[gi], ids_b[j])
            out[(int(key[0]), int(key[1]))] = float(d[i, j])
    return out


def pick_eps(x, metric, per_point, rng):
    """An eps with about `per_point` neighbours per point, in a gap between two distinct
    distances (so no pair lies within rounding of eps and the oracle's arithmetic cannot
    matter)."""
    sample = x[rng.choice(len(x), size=min(len(x), 400), replace=False)]
    d = np.unique(dist_matrix(sample, x, metric).ravel())
    k = int(len(sample) * per_point)
    while d[k + 1] - d[k] < 1e-9 * d[k + 1]:
        k += 1
    return float((d[k] + d[k + 1]) / 2)


def compare(got, want, what):
    """got: list of (id_a, id_b, distance) rows."""
    keys = [(a, b) for a, b, _ in got]
    ok = check(len(keys) == len(set(keys)), f"{what}: duplicate pairs")
    gotd = {(a, b): d for a, b, d in got}
    if set(gotd) != set(want):
        missing = sorted(set(want) - set(gotd))[:5]
        extra = sorted(set(gotd) - set(want))[:5]
        return check(False, f"{what}: pair sets differ ({len(gotd)} vs {len(want)} pairs; "
                            f"missing {missing}, extra {extra})")
    bad = [k for k in want if abs(gotd[k] - want[k]) > 1e-12 * max(1.0, abs(want[k]))]
    ok &= check(not bad, f"{what}: distances differ at {bad[:3]}")
    ok &= check(len(want) > 0 or "empty" in what, f"{what}: the oracle found no pairs")
    return ok


# ---------------------------------------------------------------- PostgreSQL


def psql(sql, *, input=None, timeout=120, check_rc=True, settings=()):
    cmd = ["psql", "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-h", ARGS.pg_host, "-p",
           str(ARGS.pg_port), "-U", "postgres", "-d", "postgres"]
    for s in settings:
        cmd += ["-c", s]
    cmd += ["-c", sql]
    r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check_rc and r.returncode != 0:
        raise RuntimeError(f"psql failed: {sql}\n{r.stderr}")
    return r


def pg_rows(sql, settings=()):
    out = psql(f"COPY ({sql}) TO STDOUT WITH (FORMAT csv)", settings=settings).stdout
    rows = []
    for line in out.splitlines():
        a, b, d = line.split(",")
        rows.append((int(a), int(b), float(d)))
    return rows


def pg_load(name, ids, x, layout):
    """layout: 'cols' (one float8 column per dimension), 'arr8' (float8[]), 'arr4' (float4[])."""
    dim = x.shape[1]
    if layout == "cols":
        cols = ", ".join(f"c{k} float8" for k in range(dim))
        lines = [f"{i}," + ",".join(repr(float(v)) for v in row) for i, row in zip(ids, x)]
    else:
        cols = "v float8[]" if layout == "arr8" else "v float4[]"
        lines = [f'{i},"{{' + ",".join(repr(float(v)) for v in row) + '}"' for i, row in zip(ids, x)]
    psql(f"DROP TABLE IF EXISTS {name}; CREATE TABLE {name} (id bigint, {cols});")
    psql(f"\\copy {name} FROM STDIN WITH (FORMAT csv)", input="\n".join(lines) + "\n")


def pg_query(name, x, layout):
    if layout == "cols":
        return f"SELECT id, {', '.join(f'c{k}' for k in range(x.shape[1]))} FROM {name}"
    return f"SELECT id, v FROM {name}"


def q(s):
    return "'" + s.replace("'", "''") + "'"


def make_data(rng, n, dim, kind):
    if kind == "clustered":
        centres = rng.uniform(0, 10, size=(max(1, n // 50), dim))
        x = centres[rng.integers(0, len(centres), size=n)] + rng.normal(0, 0.3, size=(n, dim))
    else:
        x = rng.uniform(-5, 5, size=(n, dim))
    ids = rng.permutation(n * 3)[:n].astype(np.int64) * 7 - 1000  # sparse, some negative
    return ids, x


def make_b(rng, x, n):
    """A second point set near the first: random points of x, moved a little."""
    ids = rng.permutation(n * 3)[:n].astype(np.int64) * 5 + 11
    xb = x[rng.integers(0, len(x), size=n)] + rng.normal(0, 0.2, size=(n, x.shape[1]))
    return ids, xb


def test_pg_correctness(rng):
    print("-- PostgreSQL: pair sets against the oracle", flush=True)
    for dim, n, kind in [(2, 2000, "uniform"), (3, 1500, "clustered"), (16, 1200, "clustered")]:
        ids, x = make_data(rng, n, dim, kind)
        ids_b, xb = make_b(rng, x, n // 2)
        for layout in ["cols", "arr8"]:
            pg_load("ta", ids, x, layout)
            pg_load("tb", ids_b, xb, layout)
            for metric in METRICS:
                eps = pick_eps(x, metric, 4, rng)
                what = f"pg {dim}-D {layout} {metric} eps={eps:.4g}"
                got = pg_rows(f"SELECT * FROM simjoin_self_join({q(pg_query('ta', x, layout))}, "
                              f"{eps!r}, {q(metric)})")
                compare(got, oracle(ids, x, eps, metric), what + " self")
                check(all(a < b for a, b, _ in got), what + ": id_a < id_b")
                got = pg_rows(f"SELECT * FROM simjoin_join({q(pg_query('ta', x, layout))}, "
                              f"{q(pg_query('tb', xb, layout))}, {eps!r}, {q(metric)}, 'cpu')")
                compare(got, oracle(ids, x, eps, metric, ids_b, xb), what + " join")
    # float4[] coordinates: the oracle sees the same float32 values.
    ids, x = make_data(rng, 1000, 3, "clustered")
    x4 = x.astype(np.float32).astype(np.float64)
    pg_load("ta", ids, x, "arr4")
    eps = pick_eps(x4, "euclidean", 4, rng)
    compare(pg_rows(f"SELECT * FROM simjoin_self_join('SELECT id, v FROM ta', {eps!r})"),
            oracle(ids, x4, eps, "euclidean"), "pg float4[]")
    # Integer lattice, every column type: pairs at exactly eps are in (dist <= eps).
    psql("DROP TABLE IF EXISTS lat; CREATE TABLE lat AS SELECT (i * 10 + j)::int AS id, "
         "i::smallint AS a, j::numeric AS b, (i + j)::real AS c FROM generate_series(0, 9) i, "
         "generate_series(0, 9) j")
    ids = np.array([i * 10 + j for i in range(10) for j in range(10)])
    x = np.array([[i, j, i + j] for i in range(10) for j in range(10)], dtype=np.float64)
    for metric, eps in [("euclidean", 2 ** 0.5), ("manhattan", 2.0), ("chebyshev", 1.0)]:
        compare(pg_rows(f"SELECT * FROM simjoin_self_join('SELECT id, a, b, c FROM lat', "
                        f"{eps!r}, {q(metric)})"), oracle(ids, x, eps, metric),
                f"pg lattice {metric}")
    # Empty inputs.
    compare(pg_rows("SELECT * FROM simjoin_self_join('SELECT 1, 2.0 WHERE false', 1)"), {},
            "pg empty self")
    compare(pg_rows("SELECT * FROM simjoin_join('SELECT 1, 2.0', 'SELECT 1, 2.0 WHERE false', 1)"),
            {}, "pg empty join")


PG_ERRORS = [
    ("SELECT * FROM simjoin_self_join('SELECT 1, 0.0 UNION ALL SELECT 2, NULL', 0.1)",
     "NULL coordinate"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, ARRAY[1.0, NULL]', 0.1)", "NULL coordinate"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, NULL::float8[]', 0.1)", "NULL coordinates"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, ''a''::text', 0.1)", "not a number"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 1.0, now()', 0.1)", "not a number"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, ARRAY[1.0] UNION ALL SELECT 2, ARRAY[1.0, 2.0]', 0.1)",
     "has 2 coordinates"),
    ("SELECT * FROM simjoin_join('SELECT 1, 1.0', 'SELECT 1, 1.0, 2.0', 0.1)", "dimensions"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0', 0)", "eps must be"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0', -1)", "eps must be"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0', 'nan')", "eps must be"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, ''nan''::float8', 1)", "not finite"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0', 1, 'cosine')", "unknown metric"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0', 1, 'euclidean', 'tpu')", "unknown backend"),
    ("SELECT * FROM simjoin_self_join('SELECT 1.5, 2.0', 1)", "integer id"),
    ("SELECT * FROM simjoin_self_join('SELECT NULL::int, 2.0', 1)", "NULL id"),
    ("SELECT * FROM simjoin_self_join('SELECT 1', 1)", "integer id and coordinates"),
    ("SELECT * FROM simjoin_self_join('SELEC 1', 1)", "syntax error"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, ARRAY[[1.0]]', 1)", "not a vector"),
]


def test_pg_errors():
    print("-- PostgreSQL: bad input gives SQL errors, the server stays up", flush=True)
    pid = psql("SELECT pg_backend_pid()").stdout
    for sql, want in PG_ERRORS:
        r = psql(sql, check_rc=False)
        check(r.returncode != 0 and "ERROR:" in r.stderr and want in r.stderr,
              f"pg error for {sql!r}: want {want!r}, got rc={r.returncode} {r.stderr.strip()!r}")
    # An error inside a transaction, then the session goes on.
    r = psql("BEGIN; SELECT count(*) FROM simjoin_self_join('SELECT 1, NULL::float8', 1); COMMIT;",
             check_rc=False)
    check("NULL coordinate" in r.stderr, "pg error inside a transaction")
    check(psql("SELECT 42").stdout.strip() == "42", "pg server answers after the errors")
    check(pid != "", "pg backend pid")


def server_log():
    with open(ARGS.pg_log, errors="replace") as f:
        return f.read()


def test_pg_cancel():
    print("-- PostgreSQL: cancel and statement_timeout stop a long join", flush=True)
    # 1M uniform 2-D points; eps 0.004 gives ~25M pairs: a join of many seconds.
    psql("SELECT setseed(0.5); DROP TABLE IF EXISTS big; CREATE TABLE big AS SELECT g AS id, "
         "random() AS x, random() AS y FROM generate_series(1, 1000000) g")
    # Large enough to be still running 3 s in even on an idle machine (0.004 was not).
    long_join = "SELECT count(*) FROM simjoin_self_join('SELECT id, x, y FROM big', 0.008)"
    cmd = ["psql", "-X", "-At", "-h", ARGS.pg_host, "-p", str(ARGS.pg_port), "-U", "postgres",
           "-c", long_join]
    for attempt in ("cancel", "timeout"):
        before = server_log().count("sj_pipe: stop asked")
        t0 = time.time()
        if attempt == "cancel":
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(3.0)
            r = psql("SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity "
                     "WHERE query LIKE '%simjoin_self_join%FROM big%' AND pid <> pg_backend_pid()")
            t_cancel = time.time()
            check(r.stdout.strip() == "1", f"pg cancel: cancelled {r.stdout.strip()} backends")
            out, err = p.communicate(timeout=60)
            want = "canceling statement due to user request"
        else:
            t_cancel = t0 + 3.0
            p = subprocess.Popen(cmd[:-2] + ["-c", "SET statement_timeout = '3s'", "-c", long_join],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            out, err = p.communicate(timeout=60)
            want = "canceling statement due to statement timeout"
        t_end = time.time()
        check(want in err, f"pg {attempt}: want {want!r}, got {out!r} {err!r}")
        lag = t_end - t_cancel
        print(f"   {attempt}: query ended {lag:.2f} s after the {attempt} "
              f"({t_end - t0:.1f} s in all)", flush=True)
        check(lag < 3.0, f"pg {attempt}: the query took {lag:.2f} s to stop")
        time.sleep(0.3)
        lines = re.findall(r"sj_pipe: stop asked .*", server_log())[before:]
        print("   server log:", lines, flush=True)
        check(len(lines) == 1 and "join ended" in lines[0],
              f"pg {attempt}: the join itself must have stopped (log: {lines})")
    # Uncancelled, the same join runs to its end (so the cancels above did interrupt it).
    t0 = time.time()
    n = int(psql(long_join.replace("0.008", "0.001")).stdout)
    print(f"   the same join at eps 0.001: {n} pairs in {time.time() - t0:.1f} s", flush=True)
    check(n > 1_000_000, "pg uncancelled join")
    check(psql("SELECT 1").stdout.strip() == "1", "pg server answers after the cancels")


def test_pg_work_mem(rng):
    print("-- PostgreSQL: a result far beyond work_mem", flush=True)
    ids, x = make_data(rng, 20000, 2, "uniform")
    pg_load("wm", ids, x, "cols")
    eps = pick_eps(x, "euclidean", 20, rng)
    want = oracle(ids, x, eps, "euclidean")
    stat = ("SELECT pg_stat_force_next_flush(); SELECT temp_files FROM pg_stat_database "
            "WHERE datname = current_database()")
    before = int(psql(stat).stdout.split()[-1])
    got = pg_rows(f"SELECT * FROM simjoin_self_join('SELECT id, c0, c1 FROM wm', {eps!r})",
                  settings=["SET work_mem = '64kB'"])
    time.sleep(0.5)
    after = int(psql(stat).stdout.split()[-1])
    print(f"   {len(got)} rows (~{len(got) * 40 // 1024} KiB of tuples), work_mem 64kB, "
          f"temp files {before} -> {after}", flush=True)
    check(len(want) > 100000, "work_mem test: enough pairs")
    compare(got, want, "pg work_mem=64kB")
    check(after > before, "pg work_mem: the tuplestore spilled to a temporary file")


# ---------------------------------------------------------------- SQLite


def sqlite_connect():
    con = sqlite3.connect(":memory:")
    con.enable_load_extension(True)
    con.load_extension(os.path.splitext(ARGS.sqlite_ext)[0])
    con.enable_load_extension(False)
    return con


def sqlite_load(con, name, ids, x):
    cols = ", ".join(f"c{k} REAL" for k in range(x.shape[1]))
    con.execute(f"DROP TABLE IF EXISTS {name}")
    con.execute(f"CREATE TABLE {name} (id INTEGER, {cols})")
    con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * (x.shape[1] + 1))})",
                    [(int(i), *map(float, row)) for i, row in zip(ids, x)])


def test_sqlite(rng):
    print("-- SQLite (Python sqlite3): pair sets against the oracle", flush=True)
    con = sqlite_connect()
    for dim, n, kind in [(2, 2000, "uniform"), (3, 1500, "clustered"), (16, 1200, "clustered")]:
        ids, x = make_data(rng, n, dim, kind)
        ids_b, xb = make_b(rng, x, n // 2)
        sqlite_load(con, "ta", ids, x)
        sqlite_load(con, "tb", ids_b, xb)
        sel = lambda t: f"SELECT id, {', '.join(f'c{k}' for k in range(dim))} FROM {t}"
        for metric in METRICS:
            eps = pick_eps(x, metric, 4, rng)
            what = f"sqlite {dim}-D {metric} eps={eps:.4g}"
            args = (sel("ta"), eps) if metric == "euclidean" else (sel("ta"), eps, metric)
            marks = ", ".join("?" * len(args))
            got = con.execute(f"SELECT id_a, id_b, distance FROM simjoin_self_join({marks})",
                              args).fetchall()
            compare(got, oracle(ids, x, eps, metric), what + " self")
            check(all(a < b for a, b, _ in got), what + ": id_a < id_b")
            got = con.execute("SELECT id_a, id_b, distance FROM simjoin_join(?, ?, ?, ?)",
                              (sel("ta"), sel("tb"), eps, metric)).fetchall()
            compare(got, oracle(ids, x, eps, metric, ids_b, xb), what + " join")
    # A big streamed result (rows come while the join runs), and joining on its output.
    ids, x = make_data(rng, 20000, 2, "uniform")
    sqlite_load(con, "big", ids, x)
    eps = pick_eps(x, "euclidean", 20, rng)
    want = oracle(ids, x, eps, "euclidean")
    got = con.execute("SELECT id_a, id_b, distance FROM simjoin_self_join("
                      "'SELECT id, c0, c1 FROM big', ?)", (eps,)).fetchall()
    compare(got, want, "sqlite 20k points")
    # Stop early (LIMIT) and go on using the connection.
    check(len(con.execute("SELECT * FROM simjoin_self_join('SELECT id, c0, c1 FROM big', ?) "
                          "LIMIT 10", (eps,)).fetchall()) == 10, "sqlite LIMIT")
    # Neighbour counts per point through a join with the table.
    n_of = dict(con.execute("SELECT big.id, count(s.id_b) FROM big JOIN simjoin_self_join("
                            "'SELECT id, c0, c1 FROM big', ?) s ON s.id_a = big.id GROUP BY big.id",
                            (eps,)).fetchall())
    want_n = {}
    for a, _ in want:
        want_n[a] = want_n.get(a, 0) + 1
    check(n_of == want_n, "sqlite join with a table")

    print("-- SQLite: bad input gives SQL errors", flush=True)
    errors = [
        ("SELECT * FROM simjoin_self_join('SELECT 1, NULL', 1)", "NULL or not a number"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, ''a''', 1)", "NULL or not a number"),
        ("SELECT * FROM simjoin_self_join('SELECT 1.5, 1', 1)", "not an integer"),
        ("SELECT * FROM simjoin_join('SELECT 1, 1', 'SELECT 1, 1, 2', 1)", "dimensions"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1', 0)", "eps must be"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1', -2)", "eps must be"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1', 'x')", "eps must be a number"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1', 1, 'cosine')", "unknown metric"),
        ("SELECT * FROM simjoin_self_join('SELECT 1', 1)", "integer id and coordinates"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1')", "usage"),
        ("SELECT * FROM simjoin_self_join('SELEC 1', 1)", "syntax error"),
        ("SELECT * FROM simjoin_self_join('SELECT * FROM nosuchtable', 1)", "no such table"),
    ]
    for sql, want_msg in errors:
        try:
            con.execute(sql).fetchall()
            check(False, f"sqlite error for {sql!r}: no error")
        except sqlite3.Error as e:
            check(want_msg in str(e), f"sqlite error for {sql!r}: want {want_msg!r}, got {e!r}")
    check(con.execute("SELECT count(*) FROM big").fetchone()[0] == 20000,
          "sqlite connection works after the errors")


def test_sqlite_shell():
    print("-- SQLite: the sqlite3 shell", flush=True)
    script = f""".load {os.path.splitext(ARGS.sqlite_ext)[0]}
CREATE TABLE p(id INTEGER PRIMARY KEY, x REAL, y REAL);
INSERT INTO p VALUES (1, 0, 0), (2, 0.5, 0), (3, 3, 3), (4, 3, 3.5), (5, 9, 9);
SELECT id_a, id_b, distance FROM simjoin_self_join('SELECT id, x, y FROM p', 0.5) ORDER BY 1, 2;
SELECT id_a, id_b, distance FROM simjoin_join('SELECT id, x, y FROM p WHERE id = 3', 'SELECT id, x, y FROM p', 1, 'manhattan') ORDER BY 1, 2;
SELECT count(*) FROM simjoin_self_join('SELECT id, x, y FROM p', 100, 'chebyshev');
"""
    r = subprocess.run(["sqlite3", "-batch", ":memory:"], input=script, capture_output=True,
                       text=True, timeout=60)
    want = "1|2|0.5\n3|4|0.5\n3|3|0.0\n3|4|0.5\n10\n"
    check(r.returncode == 0 and r.stdout == want, f"sqlite3 shell: got {r.stdout!r} {r.stderr!r}")
    r = subprocess.run(["sqlite3", "-batch", ":memory:"], capture_output=True, text=True,
                       input=script.splitlines()[0] + "\nSELECT * FROM simjoin_self_join('SELECT 1, 1', 0);\n")
    check(r.returncode != 0 and "eps must be" in r.stderr, f"sqlite3 shell error: {r.stderr!r}")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg-host")
    ap.add_argument("--pg-port", type=int)
    ap.add_argument("--pg-log")
    ap.add_argument("--sqlite-ext")
    ap.add_argument("--only", choices=["pg", "sqlite"])
    ARGS = ap.parse_args()
    rng = np.random.default_rng(14)
    t0 = time.time()
    if ARGS.only != "sqlite":
        psql("DROP EXTENSION IF EXISTS simjoin; CREATE EXTENSION simjoin")
        test_pg_correctness(rng)
        test_pg_errors()
        test_pg_work_mem(rng)
        test_pg_cancel()
        log = server_log()
        check("terminated by signal" not in log and "PANIC" not in log,
              "pg server log: no crashed backend")
    if ARGS.only != "pg":
        test_sqlite(rng)
        test_sqlite_shell()
    print(f"db tests: {len(FAILURES)} failures, {time.time() - t0:.0f} s", flush=True)
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
