#!/usr/bin/env python3
"""How fast a join's result reaches the user (issue 12's table), against Super-EGO and
scipy's cKDTree, on the same data in the same run.

Per workload (uniform points in [0, 1]^d, float64, seeded), each row the median of --reps
(in-process paths: after one first call, timed and shown on its own, since a process's
first result of a size pays for fresh memory: on a VM, the host backing it, measured at
2-4x a warm call):
- CLI `self-join --stats`: the join counting only, and with `--output pairs.npy` the
  writer's seconds and GB/s, unsorted (streamed while the join runs) and sorted;
- Python `simjoin.self_join`: unsorted pairs (the base of the ratios: the join with its pairs
  in memory), sorted pairs (the default), the CSR with rows sorted (the default) and not,
  the CSR with distances, the count (each call from NumPy input to the NumPy/SciPy result;
  after their first calls the paths take turns, round by round, so that the machine's
  slow spells fall on all of them alike);
- Super-EGO (../shared/peers/super-ego, built here for the workload's dimension; its own
  timer: EGO sort + join, pairs kept in memory per thread, with all the machine's threads);
- cKDTree(X).query_pairs(eps, output_type="ndarray") (tree build included).
All systems must agree on the pair count. Ratios: each Python path over the unsorted call,
and the best peer over simjoin's sorted pairs.

usage: python3 bench/results_bench.py [--n 1000000] [--reps 3] [--out bench/RESULTS_BENCH.md]
Needs numpy and scipy (tests/run.sh's venv has them), g++ for Super-EGO, and cargo: it
measures this checkout's package and release library (bench/checkout.py) and its CLI.
"""
import argparse
import os
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from scipy.spatial import cKDTree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkout import ROOT, use_checkout  # noqa: E402

LIBRARY = use_checkout()
import simjoin  # noqa: E402

PEERS = os.path.join(os.path.dirname(ROOT), "shared", "peers")
# eps giving about 16 neighbours per point at 1M points (16M unique pairs), as the issue's.
WORKLOADS = {"uniform-2d": (2, 0.0032), "uniform-3d": (3, 0.0197)}


def median_time(f, reps):
    """The median of `reps` calls after a first one, that first call's seconds, and the
    last result."""
    times, out = [], None
    for _ in range(reps + 1):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:]), times[0], out


def interleaved(calls, reps):
    """Each call's first time, then `reps` rounds that make every call once in turn, so
    that the machine's slow spells fall on every path alike: per call, the median of its
    rounds, its first time and the unique pair count of its result (each result is
    dropped before the next call)."""
    first, times, counts = {}, {k: [] for k in calls}, {}
    for k, f in calls.items():
        t = time.perf_counter()
        r = f()
        first[k] = time.perf_counter() - t
        counts[k] = count_of(r)
        del r
    for _ in range(reps):
        for k, f in calls.items():
            t = time.perf_counter()
            r = f()
            times[k].append(time.perf_counter() - t)
            del r
    return {k: (statistics.median(times[k]), first[k], counts[k]) for k in calls}


def count_of(r):
    """Unique pairs in a self_join result of any form."""
    if isinstance(r, int):
        return r
    if isinstance(r, tuple):  # (pairs, distances)
        r = r[0]
    return r.nnz // 2 if hasattr(r, "nnz") else len(r)


def cli_binary():
    # Built every run (a no-op when fresh): a stale CLI would measure old code.
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "simjoin-cli"], cwd=ROOT, check=True)
    return os.path.join(ROOT, "target", "release", "simjoin")


def cli_stats(exe, data, eps, out=None, extra=()):
    cmd = [exe, "self-join", data, "--eps", repr(eps), "--backend", "cpu", "--stats"]
    if out:
        cmd += ["--output", out, *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def build_super_ego(dim, data_txt, work):
    src = os.path.join(PEERS, "super-ego")
    if not os.path.isdir(src) or not shutil.which("g++"):
        return None
    w = os.path.join(work, f"superego-{dim}")
    os.makedirs(w, exist_ok=True)
    for f in os.listdir(src):
        if f.endswith((".cpp", ".hpp", ".h")):
            shutil.copy(os.path.join(src, f), w)
    const = os.path.join(w, "const.h")
    text = open(const).read()
    text = re.sub(r"(?m)^const int NUM_DIM\s*=.*", f"const int NUM_DIM = {dim};", text)
    text = re.sub(r'(?m)^#define DATA_FILE.*"./ColorHist.txt"', f'#define DATA_FILE "{data_txt}"', text)
    open(const, "w").write(text)
    exe = os.path.join(w, "superego")
    cpps = [f for f in os.listdir(w) if f.endswith(".cpp")]
    subprocess.run(["g++", "-O3", "-march=native", "-pthread", "-w", "-DFIX", "-o", exe, *cpps],
                   cwd=w, check=True)
    return exe


def run_super_ego(exe, eps, n):
    """Super-EGO's own timer (sort + join) and its unique pair count."""
    threads = os.cpu_count() or 1
    res = subprocess.run([exe, repr(eps), str(n // 1000), str(n // 1000), "2", str(threads)],
                         capture_output=True, text=True, check=True)
    last = [l for l in res.stdout.splitlines() if l.strip()][-1].split()
    return float(last[3]), int(float(last[4])) // 2


def workload(name, dim, eps, n, reps, exe, work):
    x = np.random.default_rng(12).random((n, dim))
    data = os.path.join(work, f"{name}.npy")
    np.save(data, x)
    rows = []

    cli = [cli_stats(exe, data, eps) for _ in range(reps)]
    count_s = statistics.median(c["seconds"] for c in cli)
    pairs = cli[0]["pairs"]
    rows.append(("CLI --stats, no --output: the join counting only (index + join)", count_s, None))

    out = os.path.join(work, "pairs.npy")
    for label, extra in [("--unsorted: the writer's seconds", ["--unsorted"]),
                         ("(sorted): sort + write seconds", [])]:
        writes = []
        for _ in range(reps):
            s = cli_stats(exe, data, eps, out, extra)
            writes.append(s["write_seconds"])
            size = os.path.getsize(out)
            os.remove(out)
        w = statistics.median(writes)
        rows.append((f"CLI --output pairs.npy {label} ({size / w / 1e9:.2f} GB/s)", w, None))

    simjoin.self_join(x[:1000], eps, backend="cpu")  # engine start outside the timers
    # The base of the ratios (first): the join with its pairs in memory, as NumPy (the
    # unsorted call: index, join, and the zero-copy hand-over).
    calls = {
        "Python self_join(X, eps, sorted=False): the join, pairs in memory": dict(sorted=False),
        "Python self_join(X, eps) (sorted, the default)": {},
        'Python self_join(X, eps, output="csr") (rows sorted, the default)': dict(output="csr"),
        'Python self_join(X, eps, output="csr", sorted=False)': dict(output="csr", sorted=False),
        'Python self_join(X, eps, output="csr", return_distance=True)':
            dict(output="csr", return_distance=True),
        'Python self_join(X, eps, output="count")': dict(output="count"),
    }
    timed = interleaved({label: (lambda kw=kw: simjoin.self_join(x, eps, backend="cpu", **kw))
                         for label, kw in calls.items()}, reps)
    join_s = None
    for label, (t, first, count) in timed.items():
        assert count == pairs, (label, count, pairs)
        join_s = join_s or t
        rows.append((label, t, t / join_s, first))

    peers = {}
    txt = os.path.join(work, f"{name}.txt")
    np.savetxt(txt, np.column_stack([np.arange(n), x]), fmt=["%d"] + ["%.17g"] * dim)
    se = build_super_ego(dim, txt, work)
    if se and n % 1000 == 0:
        runs = [run_super_ego(se, eps, n) for _ in range(reps)]
        # Super-EGO's own distance arithmetic may decide a pair at exactly eps differently:
        # a few such pairs are reported, more is an error.
        diff = max(abs(r[1] - pairs) for r in runs)
        assert diff <= max(10, pairs // 100_000), (runs, pairs)
        peers["Super-EGO"] = statistics.median(r[0] for r in runs)
        rows.append((f"Super-EGO ({os.cpu_count()} threads, sort + join, pairs in memory"
                     + (f"; {diff} pair(s) at the boundary counted differently" if diff else "")
                     + ")", peers["Super-EGO"], None))
    t, first, r = median_time(lambda: cKDTree(x).query_pairs(eps, output_type="ndarray"), reps)
    assert len(r) == pairs, (len(r), pairs)
    peers["cKDTree"] = t
    rows.append(('scipy cKDTree(X).query_pairs(eps, output_type="ndarray")', t, None, first))
    sorted_s = rows[4][1]
    best = min(peers.values())
    return rows, pairs, join_s, sorted_s, best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "RESULTS_BENCH.md"))
    args = ap.parse_args()
    exe = cli_binary()
    lines = [
        "# Results at memory speed: the user's path against the join and the peers",
        "",
        f"`python3 bench/results_bench.py --n {args.n} --reps {args.reps}` on "
        f"{platform.node() or 'this machine'}, {os.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average at start "
        f"{os.getloadavg()[0]:.1f}. Medians of {args.reps} (in-process paths: after a first "
        f"call, shown on its own); CPU backend; float64 input; {LIBRARY}.",
        "",
    ]
    with tempfile.TemporaryDirectory() as work:
        for name in args.only.split(","):
            dim, eps = WORKLOADS[name]
            rows, pairs, join_s, sorted_s, best = workload(name, dim, eps, args.n, args.reps, exe, work)
            lines += [f"## {name}: {args.n:,} points, eps {eps} ({pairs:,} pairs)", "",
                      "| path | seconds | / join | first call s |", "| --- | ---: | ---: | ---: |"]
            for label, t, ratio, *first in rows:
                lines.append(f"| {label} | {t:.3f} | {'' if ratio is None else f'{ratio:.2f}x'} | "
                             f"{f'{first[0]:.3f}' if first else ''} |")
            lines += ["", f"Best peer {best:.3f} s; simjoin sorted pairs in Python take "
                      f"{sorted_s / best:.2f} of it ({best / sorted_s:.1f}x faster).", ""]
            print("\n".join(lines[-(len(rows) + 6):]), flush=True)
    lines.append(f"Load average at the end {os.getloadavg()[0]:.1f}.")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
