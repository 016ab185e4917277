#!/usr/bin/env python3
"""DBSCAN benchmark: simjoin.dbscan against scikit-learn's DBSCAN(n_jobs=-1), time and peak
memory, on the same data.

Each run is a child process of its own that generates the data (seeded, float64: the
precision scikit-learn computes in, so both answer the same question), clusters it and
reports its wall time for the clustering call alone and its peak resident memory (VmHWM:
the whole process, data and libraries included) just before the call and at the end, so
the clustering's own memory is the difference. (ru_maxrss from os.wait4 is recorded too,
but it counts this parent's size at the fork.)
The parent stops a run that exceeds --time-limit seconds or --mem-limit GiB of resident
memory (polled every 0.1 s) and records it as not finished. Where both finish, the answers
are compared: the same core samples, the same noise, the same clusters of core samples
(up to numbering).

Data: "blobs": 100 Gaussian blobs (sigma 0.02) with centres uniform in the unit cube,
plus 10% uniform noise; eps shrinks with n as n^(-1/d) so that the mean number of
neighbours stays the same at every size ("blobs-2d-dense": eps fixed, so neighbourhoods
grow with n); min_samples 10.

    python3 bench/dbscan_bench.py                  # the full set (long: see --help)
    python3 bench/dbscan_bench.py --quick          # 100k points only
    python3 bench/dbscan_bench.py --only blobs-2d --sizes 1000000

Writes bench/results/dbscan.json and prints a Markdown table.
"""
import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from checkout import use_checkout  # noqa: E402

# This checkout's package and library, not an installed copy (children inherit it).
LIBRARY = use_checkout() if "--child" not in sys.argv else None

# name: (dim, eps at 1M points, min_samples, sizes, whether eps shrinks as n^(-1/d))
WORKLOADS = {
    "blobs-2d": (2, 0.002, 10, [100_000, 300_000, 1_000_000, 3_000_000, 10_000_000], True),
    "blobs-3d": (3, 0.005, 10, [100_000, 1_000_000, 3_000_000, 10_000_000], True),
    "blobs-16d": (16, 0.1, 10, [100_000, 200_000], True),
    # The same blobs with eps fixed: neighbourhoods grow with n (about 330 neighbours per
    # point on average at 10M points).
    "blobs-2d-dense": (2, 0.002, 10, [1_000_000, 3_000_000, 10_000_000], False),
}


def generate(n, dim, seed=0, blobs=100, sigma=0.02):
    import numpy as np

    rng = np.random.default_rng(seed)
    centers = rng.random((blobs, dim))
    m = n - n // 10
    X = np.empty((n, dim))
    X[:m] = centers[rng.integers(0, blobs, m)] + rng.normal(0, sigma, (m, dim))
    X[m:] = rng.random((n - m, dim))
    return X


def eps_at(eps_1m, n, dim):
    return eps_1m * (1_000_000 / n) ** (1.0 / dim)


def vm_hwm_kib():
    """This process's peak resident memory (VmHWM), which, unlike ru_maxrss, starts afresh at
    exec: a child forked from a large parent does not inherit the parent's size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def child(args):
    """Runs one system on one data set; prints one JSON line."""
    import numpy as np

    X = generate(args.n, args.dim)
    if args.system == "simjoin":
        import simjoin

        est = simjoin.DBSCAN(
            eps=args.eps, min_samples=args.min_samples, backend=args.backend, algorithm=args.algorithm
        )
        # Outside the timing, as scikit-learn's imports are: the engine's one-time start
        # (worker threads; with backend auto, the probe for a hardware GPU).
        simjoin.dbscan(X[:2], args.eps, args.min_samples, backend=args.backend)
        before = vm_hwm_kib()
        t = time.perf_counter()
        est.fit(X)
        seconds = time.perf_counter() - t
        after = vm_hwm_kib()
        extra = {"backend": est.report_["backend"], "pairs": est.report_["pairs"]}
    else:
        from sklearn.cluster import DBSCAN

        before = vm_hwm_kib()
        t = time.perf_counter()
        est = DBSCAN(eps=args.eps, min_samples=args.min_samples, n_jobs=-1).fit(X)
        seconds = time.perf_counter() - t
        after = vm_hwm_kib()
        extra = {}
    labels = np.asarray(est.labels_, dtype=np.int64)
    core = np.asarray(est.core_sample_indices_, dtype=np.int64)
    np.save(os.path.join(args.out, f"{args.system}-labels.npy"), labels)
    np.save(os.path.join(args.out, f"{args.system}-core.npy"), core)
    print(
        json.dumps(
            {
                "seconds": seconds,
                "data_peak_kib": before,
                "peak_kib": after,
                "clusters": int(labels.max() + 1) if len(labels) else 0,
                "noise": int((labels < 0).sum()),
                "core_points": int(len(core)),
                **extra,
            }
        )
    )


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_one(system, n, dim, eps, min_samples, out, args):
    cmd = [
        sys.executable, __file__, "--child", system, "--n", str(n), "--dim", str(dim), "--eps", repr(eps),
        "--min-samples", str(min_samples), "--out", out, "--backend", args.backend,
        "--algorithm", args.algorithm,
    ]
    start = time.perf_counter()
    # Output to files, not pipes: a chatty child can never block on a full pipe.
    out_f = open(os.path.join(out, f"{system}.out"), "w+")
    err_f = open(os.path.join(out, f"{system}.err"), "w+")
    proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, text=True)
    killed = []
    # The watchers never reap the child (Popen.poll would, and os.wait4 below would then
    # fail with ChildProcessError): they stop polling once `finished` is set, which happens
    # after the child has exited but before it is reaped, under the lock they kill with --
    # so a kill never reaches a reaped child's pid, which the system may have reused.
    finished = threading.Event()
    lock = threading.Lock()

    def stop(why):
        with lock:
            if not finished.is_set():
                killed.append(why)
                os.kill(proc.pid, signal.SIGKILL)

    def watch():
        limit_kib = args.mem_limit * 1024 * 1024
        while not finished.wait(0.1):
            if time.perf_counter() - start > args.time_limit:
                return stop(f"over the time limit ({args.time_limit:.0f} s)")
            if rss_kib(proc.pid) > limit_kib:
                return stop(f"over the memory limit ({args.mem_limit:.0f} GiB resident)")

    polled = [0]

    def watch_rss():
        while not finished.wait(0.1):
            polled[0] = max(polled[0], rss_kib(proc.pid))

    threading.Thread(target=watch_rss, daemon=True).start()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # Wait for the exit without reaping (WNOWAIT), stop the watchers, then reap with
    # os.wait4: this child's own rusage (peak resident memory in KiB on Linux).
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    with lock:
        finished.set()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    watcher.join()
    out_f.seek(0)
    err_f.seek(0)
    stdout, stderr = out_f.read(), err_f.read()
    out_f.close()
    err_f.close()
    wall = time.perf_counter() - start
    # Peak memory: the child's own VmHWM when it finishes; when it was stopped, the largest
    # resident size polled. (ru_maxrss from wait4 would include this parent's size at fork.)
    row = {"system": system, "n": n, "dim": dim, "eps": eps, "min_samples": min_samples,
           "peak_rss_mib": polled[0] / 1024, "ru_maxrss_mib": usage.ru_maxrss / 1024,
           "process_seconds": wall}
    if killed or proc.returncode != 0:
        row["finished"] = False
        row["why"] = killed[0] if killed else f"exit {proc.returncode}: {stderr.strip()[-300:]}"
        return row
    row.update(json.loads(stdout.strip().splitlines()[-1]))
    row["peak_rss_mib"] = row.pop("peak_kib") / 1024
    row["finished"] = True
    row["data_peak_mib"] = row.pop("data_peak_kib") / 1024
    return row


def best_of(system, n, dim, eps, min_samples, out, args, repeats):
    """The run with the median time of `repeats` (all times kept), or the first failure."""
    runs = []
    for _ in range(repeats):
        r = run_one(system, n, dim, eps, min_samples, out, args)
        if not r["finished"]:
            return r
        runs.append(r)
    runs.sort(key=lambda r: r["seconds"])
    row = dict(runs[len(runs) // 2])
    row["all_seconds"] = [r["seconds"] for r in runs]
    row["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs)
    return row


def same_answer(out):
    import numpy as np

    a = np.load(os.path.join(out, "simjoin-labels.npy"))
    b = np.load(os.path.join(out, "sklearn-labels.npy"))
    ca = np.load(os.path.join(out, "simjoin-core.npy"))
    cb = np.load(os.path.join(out, "sklearn-core.npy"))
    if not np.array_equal(ca, cb) or not np.array_equal(a < 0, b < 0):
        return False
    la, lb = a[ca], b[ca]
    pairs = np.unique(np.stack([la, lb], axis=1), axis=0)
    return len(pairs) == len(np.unique(la)) == len(np.unique(lb))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", choices=["simjoin", "sklearn"])
    p.add_argument("--n", type=int)
    p.add_argument("--dim", type=int)
    p.add_argument("--eps", type=float)
    p.add_argument("--min-samples", type=int)
    p.add_argument("--out")
    p.add_argument("--backend", default="auto", help="simjoin's backend (default auto)")
    p.add_argument("--algorithm", default="auto", help="simjoin's join algorithm (default auto)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per system up to 300k points, the median reported (default 3; 1 above)")
    p.add_argument("--only", nargs="*", help="workloads to run")
    p.add_argument("--sizes", nargs="*", type=int, help="sizes to run (default: the workload's)")
    p.add_argument("--quick", action="store_true", help="100k points only")
    p.add_argument("--simjoin-only", action="store_true", help="skip scikit-learn")
    p.add_argument("--no-sklearn-above", type=int, default=10_000_000,
                   help="skip scikit-learn above this many points (default: run it everywhere)")
    p.add_argument("--time-limit", type=float, default=900.0, help="seconds per run (default 900)")
    p.add_argument("--mem-limit", type=float, default=12.0, help="GiB resident per run (default 12)")
    p.add_argument("--json", default=str(HERE / "results" / "dbscan.json"))
    args = p.parse_args()
    if args.child:
        args.system = args.child
        return child(args)

    rows = []
    for name, (dim, eps_1m, min_samples, sizes, scale) in WORKLOADS.items():
        if args.only and name not in args.only:
            continue
        for n in args.sizes or ([100_000] if args.quick else sizes):
            eps = eps_at(eps_1m, n, dim) if scale else eps_1m
            repeats = args.repeats if n <= 300_000 or args.simjoin_only else 1
            with tempfile.TemporaryDirectory() as out:
                ours = best_of("simjoin", n, dim, eps, min_samples, out, args, repeats)
                ours["workload"] = name
                ours["algorithm"] = args.algorithm
                rows.append(ours)
                print(json.dumps(ours), flush=True)
                if n > args.no_sklearn_above or args.simjoin_only:
                    continue
                ref = best_of("sklearn", n, dim, eps, min_samples, out, args, repeats)
                ref["workload"] = name
                if ref["finished"] and ours["finished"]:
                    ref["same_answer"] = bool(same_answer(out))
                    ref["speedup"] = ref["seconds"] / ours["seconds"]
                rows.append(ref)
                print(json.dumps(ref), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "time_limit_s": args.time_limit, "mem_limit_gib": args.mem_limit}
    Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print("\n| workload | n | eps | system | seconds | peak RSS (MiB) | before clustering (MiB) | clusters | noise | note |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["finished"]:
            note = ""
            if r["system"] == "sklearn":
                note = f"simjoin {r.get('speedup', 0):.1f}x faster; same answer: {r.get('same_answer')}"
            elif "pairs" in r:
                note = f"{r['pairs']:,} pairs, {r['backend']}, algorithm {r['algorithm']}"
            print(f"| {r['workload']} | {r['n']:,} | {r['eps']:.5g} | {r['system']} | {r['seconds']:.2f} | "
                  f"{r['peak_rss_mib']:.0f} | {r['data_peak_mib']:.0f} | {r['clusters']} | {r['noise']} | {note} |")
        else:
            print(f"| {r['workload']} | {r['n']:,} | {r['eps']:.5g} | {r['system']} | - | "
                  f"{r['peak_rss_mib']:.0f} | - | - | - | not finished: {r['why']} |")


if __name__ == "__main__":
    main()
