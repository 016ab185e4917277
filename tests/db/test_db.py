"""Tests of the simjoin PostgreSQL and SQLite extensions (run by tests/db/run.sh).

Every join's pair set must equal a NumPy brute-force oracle's exactly, and every distance
must match the oracle's (same double formula, to 1e-12 relative). Also: SQL errors for bad
input (NULL arguments, duplicate ids, data-modifying points queries) with the server still
up; statement_timeout, pg_cancel_backend, sqlite3_interrupt and SQLite's progress handler
stopping a join that finds no pairs within 250 ms, with every thread of it stopped after
(their CPU ticks stay still) and the next join at its usual speed; rows streamed (LIMIT 10
on 20M+ pairs in at most 5% of the whole join's time, no temporary files for a result far
beyond work_mem); the superuser-only thread and memory limits; the sqlite3 shell and
Python's sqlite3 module; the SQL examples of README.md and docs/sql.md, their output compared.
"""
import argparse
import contextlib
import io
import os
import re
import select
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ARGS = None
FAILURES = []
METRICS = ["euclidean", "manhattan", "chebyshev", "cosine"]


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL:", what, flush=True)
    return cond


# ---------------------------------------------------------------- oracle


def dist_matrix(x, y, metric):
    if metric == "cosine":
        # 1 - cos(a, b): the extensions report simjoin's f64 rule (src/metric.rs); eps is
        # picked in a gap between distances, so the summation order cannot matter.
        nx, ny = np.linalg.norm(x, axis=1), np.linalg.norm(y, axis=1)
        return 1.0 - (x @ y.T) / (nx[:, None] * ny[None, :])
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


class PgSession:
    """One psql session kept open: statements go in on stdin and each one's output (stderr
    included) comes back followed by a marker line, read as soon as psql prints it (stdbuf
    makes psql's stdout line-buffered). wait() returns the lines and when the marker came."""

    def __init__(self):
        cmd = ["stdbuf", "-oL", "-eL", "psql", "-X", "-q", "-At", "-h", ARGS.pg_host, "-p",
               str(ARGS.pg_port), "-U", "postgres", "-d", "postgres"]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
        self.buf = b""
        self.pid = int(self.run("SELECT pg_backend_pid()")[0])

    def send(self, sql):
        self.p.stdin.write((sql.strip().rstrip(";") + ";\n\\echo @@done\n").encode())
        self.p.stdin.flush()

    def wait(self, timeout=120):
        lines, deadline = [], time.time() + timeout
        while True:
            while b"\n" not in self.buf:
                left = deadline - time.time()
                if left <= 0 or not select.select([self.p.stdout], [], [], left)[0]:
                    raise RuntimeError(f"psql session: no answer in {timeout} s ({lines})")
                chunk = os.read(self.p.stdout.fileno(), 65536)
                if not chunk:
                    raise RuntimeError(f"psql session ended ({lines})")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            if line == b"@@done":
                return lines, time.time()
            lines.append(line.decode(errors="replace"))

    def run(self, sql):
        self.send(sql)
        return self.wait()[0]

    def timed(self, sql):
        t0 = time.time()
        self.send(sql)
        lines, t1 = self.wait()
        return lines, t1 - t0

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


def thread_ticks(pid):
    """{thread id: user + system CPU ticks} of every thread of process `pid`."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        out[int(t)] = int(fields[11]) + int(fields[12])
    return out


def thread_name(pid, tid):
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def threads_idle(pid, what, skip=()):
    """After a stop: no thread of process `pid` uses the CPU for 0.5 s (the join's threads
    ended and the engine's pool sleeps). The engine's "simjoin-scratch" thread is not the
    join: it frees the result path's idle scratch memory a second after its last use
    (src/result/scratch.rs), on a timer, and may do so in this window."""
    if pid == os.getpid():
        # The calling thread measures (it reads /proc and sleeps): a tick is sampled, so the
        # reads themselves took one in the window once (CI, 2026-11-28). The join ran on the
        # engine's threads; this one's statement has returned.
        skip = tuple(skip) + (threading.get_native_id(),)
    time.sleep(0.1)
    before = thread_ticks(pid)
    time.sleep(0.5)
    after = thread_ticks(pid)
    busy = {t: after[t] - before.get(t, 0) for t in after
            if t not in skip and after[t] != before.get(t, 0)
            and thread_name(pid, t) != "simjoin-scratch"}
    return check(not busy, f"{what}: threads still running after the stop "
                           f"(CPU ticks in 0.5 s by thread: "
                           f"{ {t: (n, thread_name(pid, t)) for t, n in busy.items()} }; {len(after)} threads)")


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
            # The same through a table and column names.
            cols = ("ARRAY[" + ", ".join(f"'c{k}'" for k in range(dim)) + "]" if layout == "cols"
                    else "ARRAY['v']")
            got = pg_rows(f"SELECT * FROM simjoin_self_join('ta', 'id', {cols}, {eps!r}, {q(metric)})")
            compare(got, oracle(ids, x, eps, metric), what + " self, table and columns")
            got = pg_rows(f"SELECT * FROM simjoin_join('ta', 'id', {cols}, 'tb', 'id', {cols}, {eps!r}, "
                          f"{q(metric)})")
            compare(got, oracle(ids, x, eps, metric, ids_b, xb), what + " join, table and columns")
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
    # Table and column names are quoted: odd names work, and a name is never SQL.
    psql('DROP TABLE IF EXISTS "Odd T"; CREATE TABLE "Odd T" ("My id" int, "x""q" float8, y float8); '
         'INSERT INTO "Odd T" VALUES (1, 0, 0), (2, 0.5, 0), (3, 9, 9)')
    check(pg_rows("""SELECT * FROM simjoin_self_join('"Odd T"', 'My id', ARRAY['x"q', 'y'], 1)""")
          == [(1, 2, 0.5)], "pg table form: quoted names")
    r = psql("SELECT * FROM simjoin_self_join('ta', 'id', ARRAY['v FROM ta; DROP TABLE ta; --'], 1)",
             check_rc=False)
    check(r.returncode != 0 and "does not exist" in r.stderr
          and psql("SELECT count(*) > 0 FROM ta").stdout.strip() == "t",
          f"pg table form: a column name is not SQL: {r.stderr.strip()!r}")
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
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0', 1, 'hamming')", "unknown metric"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 0.0 UNION ALL SELECT 2, 1.0', 1, 'cosine')",
     "zero vector"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0', 1, 'euclidean', 'tpu')", "unknown backend"),
    ("SELECT * FROM simjoin_self_join('SELECT 1.5, 2.0', 1)", "integer id"),
    ("SELECT * FROM simjoin_self_join('SELECT NULL::int, 2.0', 1)", "NULL id"),
    ("SELECT * FROM simjoin_self_join('SELECT 1', 1)", "integer id and coordinates"),
    ("SELECT * FROM simjoin_self_join('SELEC 1', 1)", "syntax error"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, ARRAY[[1.0]]', 1)", "not a vector"),
    ("SELECT * FROM simjoin_self_join(NULL, 1)", "points must not be NULL"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0', NULL)", "eps must not be NULL"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0', 1, NULL)", "metric must not be NULL"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0', 1, 'cpu', NULL)", "backend must not be NULL"),
    ("SELECT * FROM simjoin_join('SELECT 1, 2.0', NULL, 1)", "points_b must not be NULL"),
    ("SELECT * FROM simjoin_join(NULL, 'SELECT 1, 2.0', 1)", "points_a must not be NULL"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 0.0 UNION ALL SELECT 1, 0.5', 1)",
     "id 1 appears more than once in the points query"),
    ("SELECT * FROM simjoin_join('SELECT 1, 0.0', 'SELECT 2, 0.0 UNION ALL SELECT 3, 1.0 "
     "UNION ALL SELECT 2, 1.0', 1)", "id 2 appears more than once in the points_b query"),
    ("SELECT * FROM simjoin_self_join('SELECT 1, 2.0; SELECT 2, 2.0', 1)", "returns rows"),
    ("SELECT * FROM simjoin_self_join('nosuchtable', 'id', ARRAY['x'], 1)", "does not exist"),
    ("SELECT * FROM simjoin_self_join(NULL::regclass, 'id', ARRAY['x'], 1)", "the table must not be NULL"),
    ("SELECT * FROM simjoin_self_join('pg_class', 'oid', ARRAY[]::text[], 1)", "at least one column"),
    ("SELECT * FROM simjoin_self_join('pg_class', 'oid', ARRAY[NULL], 1)", "must not hold NULL"),
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
    # The points query runs read-only: a data-modifying one is refused and changes nothing.
    psql("DROP TABLE IF EXISTS victim; CREATE TABLE victim AS SELECT g AS id, g::float8 AS x "
         "FROM generate_series(1, 5) g")
    for sql in ["DELETE FROM victim WHERE id = 1 RETURNING id, x",
                "WITH d AS (DELETE FROM victim RETURNING id, x) SELECT * FROM d",
                "UPDATE victim SET x = 0 RETURNING id, x",
                "INSERT INTO victim VALUES (9, 9) RETURNING id, x"]:
        r = psql(f"SELECT * FROM simjoin_self_join({q(sql)}, 1)", check_rc=False)
        check(r.returncode != 0 and "not allowed in a non-volatile function" in r.stderr,
              f"pg refuses the points query {sql!r}: {r.stderr.strip()!r}")
    check(psql("SELECT count(*), sum(x) FROM victim").stdout.strip() == "5|15",
          "pg: the refused points queries changed nothing")
    # The same id in points_a and points_b is fine (they are different sets).
    check(pg_rows("SELECT * FROM simjoin_join('SELECT 1, 0.0', 'SELECT 1, 0.5', 1)")
          == [(1, 1, 0.5)], "pg join: one id in both inputs")
    # Labels: stable, parallel restricted, not strict; the user-facing SQL functions are
    # inlined, so the plan streams through ProjectSet rather than storing a Function Scan.
    labels = psql("SELECT string_agg(DISTINCT format('%s:%s%s%s', proname, provolatile, proparallel, "
                  "proisstrict), ' ') FROM pg_proc WHERE proname LIKE 'simjoin%'").stdout.strip()
    check(labels == "simjoin_join:srf simjoin_join_rows:srf simjoin_points_query:ssf "
                    "simjoin_rows_support:sst simjoin_self_join:srf simjoin_self_join_rows:srf",
          f"pg function labels: {labels}")
    # Row estimate: a table's row count from its statistics for the table form.
    psql("ANALYZE victim")
    plan = psql("EXPLAIN SELECT * FROM simjoin_self_join('victim', 'id', ARRAY['x'], 1)").stdout
    check("rows=5 " in plan, f"pg row estimate from the table's statistics: {plan}")
    plan = psql("EXPLAIN SELECT * FROM simjoin_self_join('SELECT 1, 2.0', 1) LIMIT 10").stdout
    check("ProjectSet" in plan and "Function Scan" not in plan and "rows=10000" in plan,
          f"pg plan streams (ProjectSet) with a row estimate: {plan}")


def server_log():
    with open(ARGS.pg_log, errors="replace") as f:
        return f.read()


# A join that finds no pairs but compares almost every pair of 200k uniform points in
# [0,1)^32 at eps 0.5: it runs for many seconds and never hands a pair over.
PG_LONG = "SELECT count(*) FROM simjoin_self_join('SELECT id, v FROM u32', 0.5)"
# A reference join (200k 2-D points, ~1.5M pairs): its time before and after each stop.
PG_REF = "SELECT count(*) FROM simjoin_self_join('SELECT id, x, y FROM ref2', 0.005)"


def pg_stop_lines():
    return re.findall(r"sj_pipe: stop asked .*", server_log())


def pg_main_thread(sess):
    """The backend's own thread, left out of `threads_idle`: the join ran on it, and it
    returned (the statement ended), so what it does next is the server's: PostgreSQL 15
    flushes its statistics on a timer a moment after a statement, which took a tick in the
    window once (CI, 2026-11-28). The engine's threads are all the others."""
    return (sess.pid,)


def pg_check_stopped(what, sess, before, ref_time):
    """After a stop: the join logged as stopped (cancelled, in the join stage), no thread of
    the backend runs, the session's next join at its usual speed."""
    lines = pg_stop_lines()[before:]
    print("   server log:", lines, flush=True)
    check(len(lines) == 1 and "join ended" in lines[0] and "cancelled" in lines[0],
          f"{what}: the join itself must have stopped (log: {lines})")
    threads_idle(sess.pid, what, skip=pg_main_thread(sess))
    # The faster of two (a join left running would slow both; other load on the machine
    # rarely slows both).
    (n, t), (n2, t2) = sess.timed(PG_REF), sess.timed(PG_REF)
    check(n == n2, f"{what}: the next joins differ: {n} {n2}")
    t = min(t, t2)
    print(f"   next join in the session: {t * 1e3:.0f} ms (before: {ref_time * 1e3:.0f} ms)",
          flush=True)
    check(n == sess.ref_rows, f"{what}: the next join's result {n} (want {sess.ref_rows})")
    check(t < 2 * ref_time + 0.05, f"{what}: the next join took {t:.3f} s, {ref_time:.3f} s before")


def test_pg_cancel():
    print("-- PostgreSQL: statement_timeout and pg_cancel_backend stop a join", flush=True)
    psql("SELECT setseed(0.25); DROP TABLE IF EXISTS u32; CREATE TABLE u32 AS SELECT g AS id, "
         "ARRAY(SELECT random() FROM generate_series(1, 32) WHERE g > 0) AS v "
         "FROM generate_series(1, 200000) g; DROP TABLE IF EXISTS ref2; CREATE TABLE ref2 AS "
         "SELECT g AS id, random() AS x, random() AS y FROM generate_series(1, 200000) g")
    # Hint bits set now, so reading the points takes its usual time (~0.1 s) and the stops
    # below come while the join itself runs. (A stop during the index build waits for the
    # rest of it: the engine does not look at the stop flag there.)
    psql("VACUUM u32, ref2")
    sess, ctl = PgSession(), PgSession()
    sess.ref_rows = sess.run(PG_REF)
    ref_time = min(sess.timed(PG_REF)[1] for _ in range(2))
    for attempt in ("timeout", "cancel"):
        before = len(pg_stop_lines())
        if attempt == "timeout":
            sess.run("SET statement_timeout = '300ms'")
            t_req = time.time() + 0.3  # the server's clock starts a little later: lag <= measured
            sess.send(PG_LONG)
            want = "canceling statement due to statement timeout"
        else:
            sess.send(PG_LONG)
            time.sleep(0.6)
            t_req = time.time()
            r = ctl.run(f"SELECT pg_cancel_backend({sess.pid})")
            check(r == ["t"], f"pg cancel: {r}")
            want = "canceling statement due to user request"
        out, t_end = sess.wait()
        lag = t_end - t_req
        print(f"   {attempt}: the statement ended {lag * 1e3:.0f} ms after the request", flush=True)
        check(any(want in line for line in out), f"pg {attempt}: want {want!r}, got {out}")
        check(lag < 0.25, f"pg {attempt}: the statement took {lag * 1e3:.0f} ms to stop")
        if attempt == "timeout":
            sess.run("RESET statement_timeout")
        pg_check_stopped(f"pg {attempt}", sess, before, ref_time)
    # The same on the GPU backend (lavapipe in CI): the device opened by a first small join,
    # then statement_timeout stops a GPU join (in its planning or its batches). A first
    # statement, stopped at 3 s, compiles the join's kernel for these points (32-D; kernels
    # are kept per device and specialization), so the timed stop lands in the join itself.
    # (A stop during a compile returns at once too, the compile finishing on its own thread:
    # tests/vk_kernels.rs, a_stop_returns_during_a_kernel_compile.)
    gpu_small = "SELECT count(*) FROM simjoin_self_join('SELECT id, x, y FROM ref2 WHERE id <= 1000', 0.01, 'euclidean', 'gpu')"
    gpu_long = ("SELECT count(*) FROM simjoin_self_join('SELECT id, v FROM u32 WHERE id <= 50000', 0.5, "
                "'euclidean', 'gpu')")
    out = sess.run(gpu_small)
    if not (len(out) == 1 and out[0].isdigit()):
        print(f"   no GPU backend here, skipping the GPU stop: {out}", flush=True)
    else:
        sess.run("SET statement_timeout = '3s'")
        sess.send(gpu_long)
        out, _ = sess.wait()
        check(any("statement timeout" in line for line in out), f"pg GPU warm-up: {out}")
        before = len(pg_stop_lines())
        sess.run("SET statement_timeout = '1s'")
        t_req = time.time() + 1.0
        sess.send(gpu_long)
        out, t_end = sess.wait()
        lag = t_end - t_req
        print(f"   GPU timeout: the statement ended {lag * 1e3:.0f} ms after the request", flush=True)
        check(any("statement timeout" in line for line in out), f"pg GPU timeout: {out}")
        check(lag < 0.25, f"pg GPU timeout: the statement took {lag * 1e3:.0f} ms to stop")
        sess.run("RESET statement_timeout")
        pg_check_stopped("pg GPU timeout", sess, before, ref_time)
    ctl.close()
    sess.close()
    check(psql("SELECT 1").stdout.strip() == "1", "pg server answers after the cancels")


def test_pg_limit():
    print("-- PostgreSQL: rows stream (LIMIT stops the join)", flush=True)
    # 50k uniform 2-D points at eps 0.08: ~23M pairs.
    psql("SELECT setseed(0.75); DROP TABLE IF EXISTS dense; CREATE TABLE dense AS SELECT g AS id, "
         "random() AS x, random() AS y FROM generate_series(1, 50000) g")
    join = "simjoin_self_join('SELECT id, x, y FROM dense', 0.08)"
    sess = PgSession()
    sess.run(f"SELECT count(*) FROM simjoin_self_join('SELECT id, x, y FROM dense', 0.001)")  # warm up
    (n,), full = sess.timed(f"SELECT count(*) FROM {join}")
    n = int(n)
    times = {}
    for what, sql in [("LIMIT 10", f"SELECT * FROM {join} LIMIT 10"),
                      ("EXISTS", f"SELECT EXISTS (SELECT 1 FROM {join} WHERE distance < 0.01)")]:
        before = len(pg_stop_lines())
        runs = [sess.timed(sql) for _ in range(3)]
        rows, t = runs[0][0], sorted(r[1] for r in runs)[1]
        times[what] = t
        print(f"   {what}: {t * 1e3:.0f} ms against {full:.2f} s for all {n} pairs "
              f"({100 * t / full:.1f}%)", flush=True)
        check(n >= 20_000_000, f"pg LIMIT: {n} pairs, want at least 20M")
        check(t <= 0.05 * full, f"pg {what}: {t:.3f} s, more than 5% of the whole join ({full:.2f} s)")
        if what == "LIMIT 10":
            pairs = [tuple(line.split("|")) for line in rows]
            check(len(pairs) == 10 and all(float(d) <= 0.08 for _, _, d in pairs),
                  f"pg LIMIT 10 rows: {rows}")
        else:
            check(rows == ["t"], f"pg EXISTS: {rows}")
        lines = pg_stop_lines()[before:]
        check(len(lines) == 3 and all("cancelled" in x for x in lines),
              f"pg {what}: each early end stopped its join (log: {lines})")
    threads_idle(sess.pid, "pg LIMIT", skip=pg_main_thread(sess))
    sess.close()


def test_pg_limits():
    print("-- PostgreSQL: thread and memory limits", flush=True)
    status = "SELECT substring(pg_read_file('/proc/self/status') from 'Threads:\\s*(\\d+)')"
    join = "SELECT count(*) FROM simjoin_self_join('SELECT id, x, y FROM ref2', 0.001, 'euclidean', 'cpu')"
    # simjoin.threads is capped by simjoin.max_threads (default 4): a fresh backend has one
    # thread, and its pool at most max_threads more.
    out = psql(f"{status}; SET simjoin.threads = 64; {join}; {status}").stdout.split()
    check(out[0] == "1" and int(out[-1]) <= 1 + 4, f"pg threads, default cap 4: {out}")
    out = psql(f"SET simjoin.max_threads = 2; SET simjoin.threads = 64; {join}; {status}").stdout.split()
    check(int(out[-1]) <= 1 + 2, f"pg threads, cap 2: {out}")
    # Only a superuser changes the limits.
    psql("DROP ROLE IF EXISTS sj_user; CREATE ROLE sj_user; GRANT SELECT ON ref2 TO sj_user")
    for setting in ["simjoin.max_threads", "simjoin.max_memory"]:
        value = "8" if setting == "simjoin.max_threads" else "'10GB'"
        # Once the module is loaded: refused.
        r = psql(f"SET {setting} = {value}", settings=["SET ROLE sj_user", join], check_rc=False)
        check(r.returncode != 0 and "permission denied to set parameter" in r.stderr,
              f"pg: a plain user sets {setting}: {r.stderr.strip()!r}")
        # Set before the module is loaded: PostgreSQL ignores it when the module loads.
        r = psql(f"SHOW {setting}", settings=["SET ROLE sj_user", f"SET {setting} = {value}", join])
        check("permission denied to set parameter" in r.stderr
              and r.stdout.split()[-1] in ("4", "1GB"),
              f"pg: a plain user sets {setting} early: {r.stdout.split()[-1:]} {r.stderr.strip()!r}")
    r = psql(f"SET ROLE sj_user; SET simjoin.threads = 2; {join}", check_rc=False)
    check(r.returncode == 0 and int(r.stdout.split()[-1]) > 0, f"pg: a plain user joins: {r.stderr}")
    # Input beyond simjoin.max_memory: a clear error, the server up.
    r = psql(f"SET simjoin.max_memory = '2MB'; {join}", check_rc=False)
    check(r.returncode != 0 and "more points than simjoin.max_memory allows" in r.stderr,
          f"pg max_memory: {r.stderr.strip()!r}")
    r = psql("SET simjoin.max_memory = '2MB'; SELECT count(*) FROM simjoin_join("
             "'SELECT id, x, y FROM ref2 WHERE id <= 40000', 'SELECT id, x, y FROM ref2 WHERE id <= 40000', 0.001)",
             check_rc=False)
    check(r.returncode != 0 and "taken by the inputs before" in r.stderr,
          f"pg max_memory counts both inputs: {r.stderr.strip()!r}")
    check(psql(f"SET simjoin.max_memory = '20MB'; {join}").stdout.split()[-1] != "0",
          "pg max_memory: a join within the limit")


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
    check(after == before, "pg work_mem: rows stream to the client (no temporary file)")


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
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1', 1, 'hamming')", "unknown metric"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 0 UNION ALL SELECT 2, 1', 1, 'cosine')",
         "zero vector"),
        ("SELECT * FROM simjoin_self_join('SELECT 1', 1)", "integer id and coordinates"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1')", "usage"),
        ("SELECT * FROM simjoin_self_join('SELEC 1', 1)", "syntax error"),
        ("SELECT * FROM simjoin_self_join('SELECT * FROM nosuchtable', 1)", "no such table"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 0 UNION ALL SELECT 1, 1', 1)",
         "id 1 appears more than once in the points query"),
        ("SELECT * FROM simjoin_join('SELECT 1, 0', 'SELECT 2, 0 UNION ALL SELECT 2, 1', 1)",
         "id 2 appears more than once in the points_b query"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1', 1, 'euclidean', 'tpu')", "unknown backend"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1', 1, 'euclidean', 'cpu', -1)", "threads must be"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1', 1, 'euclidean', 'cpu', 1.5)", "threads must be"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1; SELECT 2, 2', 1)", "one statement"),
        ("SELECT * FROM simjoin_self_join('DELETE FROM big WHERE id = (SELECT min(id) FROM big) "
         "RETURNING id, c0, c1', 1)", "must be read-only"),
        ("SELECT * FROM simjoin_self_join('INSERT INTO big SELECT * FROM big RETURNING id, c0, c1', 1)",
         "must be read-only"),
        ("SELECT * FROM simjoin_self_join('SELECT 1, 1; DELETE FROM big', 1)", "one statement"),
    ]
    for sql, want_msg in errors:
        try:
            con.execute(sql).fetchall()
            check(False, f"sqlite error for {sql!r}: no error")
        except sqlite3.Error as e:
            check(want_msg in str(e), f"sqlite error for {sql!r}: want {want_msg!r}, got {e!r}")
    check(con.execute("SELECT count(*) FROM big").fetchone()[0] == 20000,
          "sqlite connection works after the errors (and the refused DML deleted nothing)")
    # A backend and a thread count.
    for backend, threads in [("cpu", 1), ("auto", 2), ("cpu", 0)]:
        got = con.execute("SELECT id_a, id_b, distance FROM simjoin_self_join("
                          "'SELECT id, c0, c1 FROM big', ?, 'euclidean', ?, ?)",
                          (eps, backend, threads)).fetchall()
        compare(got, want, f"sqlite backend {backend}, {threads} threads")


def sqlite_long_setup():
    """A connection with u (200k uniform points in [0,1)^32, made by SQL) and ref (200k
    uniform 2-D points)."""
    con = sqlite_connect()
    u = "(random() / 18446744073709551616.0 + 0.5)"
    con.execute(f"CREATE TABLE u (id INTEGER PRIMARY KEY, {', '.join(f'c{k} REAL' for k in range(32))})")
    con.execute(f"WITH RECURSIVE g(i) AS (VALUES(1) UNION ALL SELECT i + 1 FROM g WHERE i < 200000) "
                f"INSERT INTO u SELECT i, {', '.join([u] * 32)} FROM g")
    con.execute("CREATE TABLE ref (id INTEGER PRIMARY KEY, x REAL, y REAL)")
    con.execute(f"WITH RECURSIVE g(i) AS (VALUES(1) UNION ALL SELECT i + 1 FROM g WHERE i < 200000) "
                f"INSERT INTO ref SELECT i, {u}, {u} FROM g")
    return con


def test_sqlite_cancel():
    print("-- SQLite: sqlite3_interrupt and the progress handler stop a join; LIMIT", flush=True)
    con = sqlite_long_setup()
    long_join = ("SELECT count(*) FROM simjoin_self_join('SELECT id, "
                 + ", ".join(f"c{k}" for k in range(32)) + " FROM u', 0.5)")
    ref_join = "SELECT count(*) FROM simjoin_self_join('SELECT id, x, y FROM ref', 0.005)"

    def timed(sql):
        t0 = time.time()
        n = con.execute(sql).fetchone()[0]
        return n, time.time() - t0

    ref_rows = timed(ref_join)[0]
    ref_time = min(timed(ref_join)[1] for _ in range(2))
    # The request must come once the join runs, not while its points are read (a stop then is
    # SQLite's own, not the join's). Reading the 200k rows takes ~0.4 s here but more on a
    # slower machine and with a Python progress handler called every 1000 steps: time it so
    # (a join of the same rows with an eps that finds nothing: reading, indexing, no pairs).
    con.set_progress_handler(lambda: 0, 1000)
    read_time = timed(long_join.replace("FROM u', 0.5)", "FROM u', 1e-9)"))[1]
    con.set_progress_handler(None, 0)
    delay = max(0.7, 1.5 * read_time + 0.2)
    print(f"   reading the points: {read_time:.2f} s; the stop is asked {delay:.2f} s in", flush=True)
    # The extension logs each stopped join on stderr (SIMJOIN_PIPE_DEBUG): catch fd 2.
    os.environ["SIMJOIN_PIPE_DEBUG"] = "1"
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    for how in ("interrupt", "progress handler"):
        t_req = time.time() + delay
        if how == "interrupt":
            timer = threading.Timer(delay, con.interrupt)
            timer.start()
        else:
            con.set_progress_handler(lambda: int(time.time() >= t_req), 1000)
        err = None
        os.dup2(log.fileno(), 2)
        try:
            con.execute(long_join).fetchall()
        except sqlite3.OperationalError as e:
            err = str(e)
        finally:
            t_end = time.time()
            os.dup2(saved, 2)
        con.set_progress_handler(None, 0)
        lag = t_end - t_req
        print(f"   {how}: the statement ended {lag * 1e3:.0f} ms after the request", flush=True)
        check(err == "interrupted", f"sqlite {how}: got {err!r}")
        check(lag < 0.25, f"sqlite {how}: the statement took {lag * 1e3:.0f} ms to stop")
        log.seek(0)
        lines = re.findall(r"sj_pipe: stop asked .*", log.read().decode(errors="replace"))
        log.seek(0)
        log.truncate()
        print("   log:", lines, flush=True)
        check(len(lines) == 1 and "cancelled" in lines[0],
              f"sqlite {how}: the join itself must have stopped (log: {lines})")
        threads_idle(os.getpid(), f"sqlite {how}")
        (n, t), (n2, t2) = timed(ref_join), timed(ref_join)  # the faster of two, as for pg
        check(n == n2, f"sqlite {how}: the next joins differ: {n} {n2}")
        t = min(t, t2)
        print(f"   next join: {t * 1e3:.0f} ms (before: {ref_time * 1e3:.0f} ms)", flush=True)
        check(n == ref_rows and t < 2 * ref_time + 0.05,
              f"sqlite {how}: the next join: {n} rows in {t:.3f} s ({ref_rows} in {ref_time:.3f} s before)")
    os.close(saved)
    del os.environ["SIMJOIN_PIPE_DEBUG"]

    # Rows stream: LIMIT 10 on 20M+ pairs (40k uniform 2-D points at eps 0.14: ~44M) in at most 5%
    # of the whole join's time.
    u = "(random() / 18446744073709551616.0 + 0.5)"
    con.execute("CREATE TABLE dense (id INTEGER PRIMARY KEY, x REAL, y REAL)")
    con.execute(f"WITH RECURSIVE g(i) AS (VALUES(1) UNION ALL SELECT i + 1 FROM g WHERE i < 40000) "
                f"INSERT INTO dense SELECT i, {u}, {u} FROM g")
    join = "simjoin_self_join('SELECT id, x, y FROM dense', 0.14)"
    n, full = timed(f"SELECT count(*) FROM {join}")
    runs = []
    for _ in range(3):
        t0 = time.time()
        rows = con.execute(f"SELECT * FROM {join} LIMIT 10").fetchall()
        runs.append(time.time() - t0)
    t = sorted(runs)[1]
    print(f"   LIMIT 10: {t * 1e3:.1f} ms against {full:.2f} s for all {n} pairs ({100 * t / full:.1f}%)",
          flush=True)
    check(n >= 20_000_000, f"sqlite LIMIT: {n} pairs, want at least 20M")
    check(len(rows) == 10 and all(d <= 0.14 for _, _, d in rows), f"sqlite LIMIT 10 rows: {rows}")
    check(t <= 0.05 * full, f"sqlite LIMIT 10: {t:.3f} s, more than 5% of the whole join ({full:.2f} s)")
    threads_idle(os.getpid(), "sqlite LIMIT")
    con.close()


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


def test_pg_postgis(rng):
    """PostGIS geometry columns of points through the table form, exact against the oracle
    and against PostGIS's own ST_DWithin self-join (a GiST index) on the same rows."""
    print("-- PostgreSQL: PostGIS geometry points", flush=True)
    r = psql("CREATE EXTENSION IF NOT EXISTS postgis", check_rc=False)
    if r.returncode != 0:
        print("   skipped: PostGIS is not installed", flush=True)
        return
    ids, x = make_data(rng, 3000, 2, "clustered")
    pg_load("gpts", ids, x, "cols")
    psql("ALTER TABLE gpts ADD COLUMN geom geometry; UPDATE gpts SET geom = ST_MakePoint(c0, c1); "
         "CREATE INDEX ON gpts USING gist (geom); ANALYZE gpts")
    for metric in ["euclidean", "chebyshev"]:
        eps = pick_eps(x, metric, 5, rng)
        got = pg_rows(f"SELECT * FROM simjoin_self_join('gpts', 'id', ARRAY['geom'], {eps!r}, {q(metric)})")
        compare(got, oracle(ids, x, eps, metric), f"pg geometry column {metric}")
    eps = pick_eps(x, "euclidean", 5, rng)
    ours = {(a, b) for a, b, _ in pg_rows(
        f"SELECT * FROM simjoin_self_join('gpts', 'id', ARRAY['geom'], {eps!r})")}
    theirs = {(a, b) for a, b, _ in pg_rows(
        f"SELECT a.id, b.id, ST_Distance(a.geom, b.geom) FROM gpts a JOIN gpts b "
        f"ON a.id < b.id AND ST_DWithin(a.geom, b.geom, {eps!r})")}
    check(ours == theirs and len(ours) > 1000,
          f"pg geometry: the pairs of PostGIS's ST_DWithin ({len(ours)} vs {len(theirs)})")
    # geography: latitude and longitude on the sphere, metric 'haversine', eps in metres; the
    # pairs of ST_DWithin(geography, geography, eps, false) (PostGIS's sphere: its radius
    # differs from simjoin's R by 3e-8 relative, so eps is picked in a gap of 1e-6).
    n = 3000
    lat = np.concatenate([rng.uniform(48.80, 48.90, n - 200), rng.uniform(89.9, 90.0, 100),
                          rng.uniform(-10, 10, 100)])
    lon = np.concatenate([rng.uniform(2.25, 2.42, n - 200), rng.uniform(-180, 180, 100),
                          rng.choice([-180.0, 179.9995, 180.0], 100)])
    gids = np.arange(1, n + 1)
    psql("DROP TABLE IF EXISTS ggeo; CREATE TABLE ggeo (id int, g geography)")
    psql("\\copy ggeo FROM STDIN WITH (FORMAT csv)",
         input="".join(f"{i},SRID=4326;POINT({float(lo)!r} {float(la)!r})\n" for i, la, lo in zip(gids, lat, lon)))
    psql("CREATE INDEX ON ggeo USING gist (g); ANALYZE ggeo")
    phi = np.radians(lat)
    lam = np.radians(np.where(np.abs(lat) == 90, 0.0, lon))
    v = np.stack([np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)], axis=1)
    chord = np.sqrt(((v[:, None, :] - v[None, :, :]) ** 2).sum(axis=2))
    metres = 2 * 6371008.8 * np.arcsin(np.minimum(chord / 2, 1.0))
    d = np.unique(metres[np.triu_indices(n, 1)])
    k = int(np.searchsorted(d, 150.0))
    while d[k + 1] - d[k] < 1e-6 * d[k + 1]:
        k += 1
    eps = float((d[k] + d[k + 1]) / 2)
    ii, jj = np.nonzero(np.triu(metres <= eps, 1))
    want = {(int(gids[i]), int(gids[j])) for i, j in zip(ii, jj)}
    rows = pg_rows(f"SELECT * FROM simjoin_self_join('ggeo', 'id', ARRAY['g'], {eps!r}, 'haversine')")
    ours = {(a, b) for a, b, _ in rows}
    theirs = {(a, b) for a, b, _ in pg_rows(
        f"SELECT a.id, b.id, 0.0 FROM ggeo a JOIN ggeo b ON a.id < b.id AND "
        f"ST_DWithin(a.g, b.g, {eps!r}, false)")}
    check(ours == want and len(want) > 1000, f"pg geography: the oracle's pairs ({len(ours)} vs {len(want)})")
    check(ours == theirs, f"pg geography: ST_DWithin's pairs on the sphere ({len(ours)} vs {len(theirs)})")
    bad = [(a, b) for a, b, m in rows if abs(m - metres[a - 1, b - 1]) > 1e-6]
    check(not bad, f"pg geography: distances in metres differ at {bad[:3]}")
    # A longitude/latitude geometry column (x = longitude, y = latitude, as
    # ST_DistanceSphere takes it) under metric 'haversine': the geography's pairs, in metres.
    psql("DROP TABLE IF EXISTS gmet; CREATE TABLE gmet AS SELECT id, g::geometry AS geom FROM ggeo")
    rows = pg_rows(f"SELECT * FROM simjoin_self_join('gmet', 'id', ARRAY['geom'], {eps!r}, 'haversine')")
    check({(a, b) for a, b, _ in rows} == want, f"pg lon/lat geometry, haversine: the oracle's pairs ({len(rows)})")
    bad = [(a, b) for a, b, m in rows if abs(m - metres[a - 1, b - 1]) > 1e-6]
    check(not bad, f"pg lon/lat geometry, haversine: distances in metres differ at {bad[:3]}")
    theirs = {(a, b) for a, b, _ in pg_rows(
        f"SELECT a.id, b.id, 0.0 FROM gmet a JOIN gmet b ON a.id < b.id AND "
        f"ST_DistanceSphere(a.geom, b.geom) <= {eps!r}")}
    check(theirs == want, f"pg lon/lat geometry: ST_DistanceSphere's pairs ({len(theirs)} vs {len(want)})")
    r = psql("SELECT * FROM simjoin_self_join('ggeo', 'id', ARRAY['g'], 1)", check_rc=False)
    check(r.returncode != 0 and "haversine" in r.stderr, f"pg geography needs haversine: {r.stderr.strip()!r}")
    r = psql("DROP TABLE IF EXISTS gline; CREATE TABLE gline AS SELECT 1 AS id, "
             "'LINESTRING(0 0, 1 1)'::geometry AS g; "
             "SELECT * FROM simjoin_self_join('gline', 'id', ARRAY['g'], 1)", check_rc=False)
    check(r.returncode != 0 and "POINT" in r.stderr, f"pg geometry non-point refused: {r.stderr.strip()!r}")


ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SQL_PAGES = ["README.md", "docs/sql.md"]


def doc_block(page, marker, fence):
    """The block opened by `fence` after `marker` in `page` (a path from the repository root)."""
    text = open(os.path.join(ROOT, page)).read()
    return text.split(marker, 1)[1].split(fence + "\n", 1)[1].split("```", 1)[0]


def doc_sql(page):
    """The PostgreSQL example of `page` (the ```sql block after <!-- sql-example -->): its
    statements, each SELECT with the rows the page shows after it (None: none shown)."""
    block = doc_block(page, "<!-- sql-example -->", "```sql")
    steps, sql, shown = [], [], None
    for line in block.splitlines():
        if shown is not None:
            if line.strip():
                shown.append(line)
                continue
            steps[-1] = (steps[-1][0], shown)
            shown = None
            continue
        if not line.strip() or line.lstrip().startswith("--"):
            continue
        sql.append(line)
        if line.rstrip().endswith(";"):
            stmt = " ".join(sql)
            sql = []
            steps.append((stmt, None))
            if stmt.lstrip().upper().startswith("SELECT"):
                shown = []
    if shown is not None:
        steps[-1] = (steps[-1][0], shown)
    return steps


def test_docs_sql():
    """The PostgreSQL examples of the README and docs/sql.md: their statements in order, each
    SELECT's rows compared with the output the page shows."""
    print("-- PostgreSQL: the examples of " + " and ".join(SQL_PAGES), flush=True)
    for page in SQL_PAGES:
        steps = doc_sql(page)
        check(len(steps) >= 4 and any(shown for _, shown in steps),
              f"{page} sql example: {len(steps)} statements found, "
              f"{sum(bool(s) for _, s in steps)} with rows shown")
        psql("DROP TABLE IF EXISTS shops")
        for stmt, shown in steps:
            # The extension exists already in this database.
            stmt = stmt.replace("CREATE EXTENSION simjoin;", "CREATE EXTENSION IF NOT EXISTS simjoin;")
            out = psql(stmt).stdout
            if not shown:
                continue
            # The page shows psql's aligned output: a header, a rule, then the rows.
            want = [[c.strip() for c in line.split("|")] for line in shown[2:]]
            got = sorted(line.split("|") for line in out.splitlines() if line)
            want = sorted(want)
            same = len(got) == len(want) and all(
                len(g) == len(w) and all(float(a) == float(b) for a, b in zip(g, w)) for g, w in zip(got, want)
            )
            check(same, f"{page} sql example: {stmt!r} gave {got}, the page shows {want}")
        psql("DROP TABLE shops")


def test_docs_sqlite():
    """docs/sql.md's SQLite examples: the sqlite3 shell session typed into the shell, its
    output compared with the lines the page shows; the Python one run, its `# prints:` line
    compared."""
    print("-- SQLite: the examples of docs/sql.md", flush=True)
    ext = os.path.splitext(ARGS.sqlite_ext)[0]
    block = doc_block("docs/sql.md", "<!-- sqlite-example -->", "```")
    script, shown = [], []
    for line in block.splitlines():
        if line.startswith(("sqlite> ", "   ...> ")):  # the prompts, both 8 characters
            script.append(line[8:])
        elif line.strip():
            shown.append(line)
    check(script and script[0] == ".load build/sqlite/simjoin" and len(shown) >= 2,
          f"docs/sql.md sqlite example: {len(script)} input lines, {len(shown)} output lines")
    script[0] = f".load {ext}"
    r = subprocess.run(["sqlite3", "-batch", ":memory:"], input="\n".join(script) + "\n",
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and sorted(r.stdout.splitlines()) == sorted(shown),
          f"docs/sql.md sqlite example: printed {r.stdout!r} {r.stderr!r}, the page shows {shown}")

    block = doc_block("docs/sql.md", "<!-- sqlite-python-example -->", "```python")
    load = 'conn.load_extension("build/sqlite/simjoin")'
    shown = [line.strip()[len("# prints:"):].strip() for line in block.splitlines()
             if line.strip().startswith("# prints:")]
    check(load in block and shown, f"docs/sql.md sqlite python example: {load} and a # prints: line")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block.replace(load, f"conn.load_extension({ext!r})"), "docs/sql.md", "exec"), {})
    except Exception as e:  # noqa: BLE001 -- reported as a failure like the other checks
        check(False, f"docs/sql.md sqlite python example raised {e!r}")
    printed = [line.strip() for line in out.getvalue().splitlines()]
    check(printed == shown, f"docs/sql.md sqlite python example: printed {printed}, the page shows {shown}")


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
        # An install of 0.1.0 updated to the current version works like a fresh one.
        psql("DROP EXTENSION IF EXISTS simjoin; CREATE EXTENSION simjoin VERSION '0.1.0'")
        psql("ALTER EXTENSION simjoin UPDATE")
        check(psql("SELECT extversion FROM pg_extension WHERE extname = 'simjoin'").stdout.strip()
              == "0.2.0", "pg: extension updated to 0.2.0")
        check(pg_rows("SELECT * FROM simjoin_self_join('SELECT 1, 0.0 UNION ALL SELECT 2, 0.5', 1)")
              == [(1, 2, 0.5)], "pg: a join after the update")
        psql("DROP EXTENSION simjoin; CREATE EXTENSION simjoin")
        test_docs_sql()
        test_pg_correctness(rng)
        test_pg_errors()
        test_pg_postgis(rng)
        test_pg_work_mem(rng)
        test_pg_cancel()
        test_pg_limit()
        test_pg_limits()
        log = server_log()
        check("terminated by signal" not in log and "PANIC" not in log,
              "pg server log: no crashed backend")
    if ARGS.only != "pg":
        test_sqlite(rng)
        test_sqlite_cancel()
        test_sqlite_shell()
        test_docs_sqlite()
    print(f"db tests: {len(FAILURES)} failures, {time.time() - t0:.0f} s", flush=True)
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
