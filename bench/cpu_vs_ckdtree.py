#!/usr/bin/env python3
"""simjoin's CPU backend against scipy's cKDTree on the same data, in the same run.

Both are timed the same way: index build included, producing the array of unique pairs
(cKDTree(x).query_pairs(eps, output_type='ndarray'); simjoin: Engine::self_join with the
CPU backend, via examples/cpu_bench.rs, which reads the same .npy file). Each workload is
run several times per system (each system's runs in one process: cKDTree's in
this Python process, simjoin's in one cpu_bench process), and the medians are compared;
the first (cold-process) simjoin run is reported too.

usage: python3 bench/cpu_vs_ckdtree.py [--reps N] [--only NAME,...] [--out bench/CPU_RESULTS.md]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from scipy.spatial import cKDTree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def uniform(n, d, lo, hi, seed):
    return np.random.default_rng(seed).uniform(lo, hi, (n, d))


def exponential(n, d, lam, seed):
    return np.clip(np.random.default_rng(seed).exponential(1.0 / lam, (n, d)), 0.0, 1.0)


def clusters(n, d, k, sd, seed):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0, 1, (k, d))
    return centres[rng.integers(0, k, n)] + rng.normal(0, sd, (n, d))


# name, data, eps. The first two are the targets.
WORKLOADS = [
    ("uniform-2d", lambda: uniform(1_000_000, 2, 0, 100, 1), 0.32, "<= 1/5"),
    ("exponential-16d", lambda: exponential(200_000, 16, 40.0, 2), 0.03, "<= 1/20"),
    ("uniform-3d", lambda: uniform(1_000_000, 3, 0, 1, 3), 0.012, ""),
    ("uniform-6d", lambda: uniform(200_000, 6, 0, 1, 4), 0.1, ""),
    ("clustered-2d", lambda: clusters(1_000_000, 2, 20, 0.02, 5), 0.001, ""),
    ("clustered-32d", lambda: clusters(50_000, 32, 10, 0.05, 6), 0.25, ""),
]


def time_ckdtree(x, eps):
    t = time.perf_counter()
    pairs = cKDTree(x).query_pairs(eps, output_type="ndarray")
    return time.perf_counter() - t, len(pairs)


def time_simjoin(binary, path, eps, reps):
    """`reps` joins in one process (as cKDTree's runs share one Python process)."""
    out = subprocess.run([binary, path, str(eps), "auto", str(reps)], check=True, capture_output=True, text=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["times"], r["pairs"], r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--slow", type=float, default=120.0, help="cKDTree runs longer than this are not repeated")
    args = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "--example", "cpu_bench"], cwd=ROOT, check=True)
    binary = os.path.join(ROOT, "target", "release", "examples", "cpu_bench")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, make, eps, target in WORKLOADS:
            if args.only and name not in args.only.split(","):
                continue
            x = make()
            path = os.path.join(tmp, name + ".npy")
            np.save(path, x)
            kd = []
            for rep in range(args.reps):
                if rep == 0 or kd[-1] < args.slow:
                    t, n_kd = time_ckdtree(x, eps)
                    kd.append(t)
            sj, n_sj, report = time_simjoin(binary, path, eps, args.reps)
            if n_kd != n_sj:
                sys.exit(f"{name}: pair counts differ: cKDTree {n_kd}, simjoin {n_sj}")
            row = dict(name=name, n=x.shape[0], d=x.shape[1], eps=eps, pairs=n_sj, kd=statistics.median(kd),
                       sj=statistics.median(sj), kd_runs=len(kd), sj_runs=len(sj), target=target,
                       algorithm=report["algorithm"], load=os.getloadavg()[0], sj_first=sj[0])
            row["ratio"] = row["sj"] / row["kd"]
            rows.append(row)
            print(f"{name:16} n={row['n']:>8} d={row['d']:>3} eps={eps:<6} pairs={n_sj:>10} "
                  f"cKDTree {row['kd']:8.3f}s ({len(kd)} runs)  simjoin[{row['algorithm']}] {row['sj']:7.3f}s "
                  f"({len(sj)} runs, first {sj[0]:.3f}s)  ratio {row['ratio']:.3f} (1/{1 / row['ratio']:.1f}) {target}  load {row['load']:.1f}",
                  flush=True)
    if args.out:
        write_table(args.out, rows)


def write_table(path, rows):
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    lines = [
        f"### Run of {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"Machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
        f"simjoin CPU backend on all cores, cKDTree single-threaded (scipy {__import__('scipy').__version__}). "
        "Times are medians, index build included, producing the unique-pair array. "
        "`load` is the 1-minute load average after the workload (the machine is shared).",
        "",
        "| workload | n | d | eps | pairs | cKDTree s (runs) | simjoin s (runs) | simjoin first run s | algorithm | simjoin / cKDTree | target | load |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['n']} | {r['d']} | {r['eps']} | {r['pairs']} | {r['kd']:.3f} ({r['kd_runs']}) | "
            f"{r['sj']:.3f} ({r['sj_runs']}) | {r['sj_first']:.3f} | {r['algorithm']} | {r['ratio']:.3f} (1/{1 / r['ratio']:.1f}) | "
            f"{r['target'] or '-'} | {r['load']:.1f} |")
    with open(path, "a") as f:
        f.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
