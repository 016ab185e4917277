#!/usr/bin/env python3
"""kNN join benchmark: simjoin.knn against scipy cKDTree.query(workers=-1), scikit-learn
NearestNeighbors(n_jobs=-1) and FAISS IndexFlatL2, on the same data in the same run.

Every system computes the self-kNN of the data set (each point's k nearest other points) and
hands back NumPy arrays: that is what is timed (index build included), median of --repeats.
`simjoin` is `algorithm="auto"` (the k-d tree, or the grid in up to 3-D on evenly spread data);
`simjoin-grid` forces the grid kNN (skipped above --grid-max-dim). Peers that return the point itself (cKDTree, FAISS) are asked for k + 1. Agreement: the
fraction of rows whose neighbour index set equals simjoin's (FAISS computes distances as
|x|^2 + |y|^2 - 2x.y in float32, so rows with near-ties may differ).

    python3 bench/knn_bench.py                    # the full set (~15 min on 2 cores)
    python3 bench/knn_bench.py --quick            # small sizes (~1 min)
    python3 bench/knn_bench.py --workloads uniform-3d --n 1000000

Writes bench/results/knn.json and bench/results/knn.md. Needs numpy, scipy, scikit-learn,
faiss-cpu and the simjoin Python package (pip install ./bindings/python).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from checkout import use_checkout  # noqa: E402

LIBRARY = use_checkout()  # this checkout's package and library, not an installed copy

# name: (generator, dim, default n)
WORKLOADS = {
    "uniform-3d": ("uniform", 3, 1_000_000),
    "uniform-8d": ("uniform", 8, 200_000),
    "uniform-16d": ("uniform", 16, 100_000),
    "uniform-32d": ("uniform", 32, 50_000),
    "uniform-64d": ("uniform", 64, 50_000),
    "expo-16d": ("expo", 16, 100_000),
    "expo-32d": ("expo", 32, 100_000),
    "expo-64d": ("expo", 64, 50_000),
    "clusters-8d": ("clusters", 8, 200_000),
}


def generate(kind, n, dim, seed):
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.random((n, dim), dtype=np.float32)
    if kind == "expo":  # GPU-JOIN's exponential data (lambda = 40)
        return rng.exponential(1 / 40, (n, dim)).astype(np.float32)
    centers = rng.random((50, dim))
    labels = rng.integers(0, 50, n)
    return (centers[labels] + rng.normal(0, 0.02, (n, dim))).astype(np.float32)


def run_simjoin(X, k):
    import simjoin

    d, i = simjoin.knn(X, k, backend="cpu")
    return i


def run_simjoin_grid(X, k):
    import simjoin

    d, i = simjoin.knn(X, k, backend="cpu", algorithm="grid")
    return i


def run_ckdtree(X, k):
    from scipy.spatial import cKDTree

    _, i = cKDTree(X).query(X, k=k + 1, workers=-1)
    return i[:, 1:]


def run_sklearn(X, k):
    from sklearn.neighbors import NearestNeighbors

    _, i = NearestNeighbors(n_neighbors=k, n_jobs=-1).fit(X).kneighbors()
    return i


def run_faiss(X, k):
    import faiss

    index = faiss.IndexFlatL2(X.shape[1])
    index.add(X)
    _, i = index.search(X, k + 1)
    # Drop the point itself (with duplicates it may not come first).
    rows = np.arange(len(X))[:, None]
    keep = i != rows
    out = np.empty((len(X), k), dtype=i.dtype)
    for r in range(len(X)):
        out[r] = i[r][keep[r]][:k]
    return out


SYSTEMS = {
    "simjoin": run_simjoin,
    "simjoin-grid": run_simjoin_grid,
    "scipy-ckdtree": run_ckdtree,
    "sklearn": run_sklearn,
    "faiss-flat": run_faiss,
}


def timed(fn, X, k, repeats, budget):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn(X, k)
        times.append(time.perf_counter() - t)
        if sum(times) > budget:
            break
    return statistics.median(times), len(times), out


def agreement(a, b):
    a = np.sort(np.asarray(a, dtype=np.int64), axis=1)
    b = np.sort(np.asarray(b, dtype=np.int64), axis=1)
    return float(np.mean(np.all(a == b, axis=1)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--systems", nargs="*", default=list(SYSTEMS))
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--n", type=int, help="points for every workload (default: per workload)")
    ap.add_argument("--quick", action="store_true", help="n / 20 for every workload")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=60.0, help="stop repeating after this many seconds")
    ap.add_argument("--faiss-max-work", type=float, default=2e10,
                    help="skip FAISS's brute force above n^2 * d of this (it would take minutes)")
    ap.add_argument("--grid-max-dim", type=int, default=8,
                    help="skip simjoin's grid kNN above this many dimensions (it indexes 3; minutes in 16-D+)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    load_start = [round(x, 2) for x in os.getloadavg()]
    rows = []
    for name in args.workloads:
        kind, dim, n = WORKLOADS[name]
        n = args.n or (n // 20 if args.quick else n)
        X = generate(kind, n, dim, args.seed)
        row = {"workload": name, "n": n, "dim": dim, "k": args.k, "systems": {},
               "load_average_1min": round(os.getloadavg()[0], 2)}
        ref = None
        for system in args.systems:
            if system == "faiss-flat" and float(n) * n * dim > args.faiss_max_work:
                row["systems"][system] = {"skipped": f"n^2 d = {float(n) * n * dim:.1e} > --faiss-max-work"}
                continue
            if system == "simjoin-grid" and dim > args.grid_max_dim:
                row["systems"][system] = {"skipped": f"{dim} dimensions > --grid-max-dim"}
                continue
            try:
                seconds, runs, out = timed(SYSTEMS[system], X, args.k, args.repeats, args.budget)
            except Exception as e:  # a peer that is not installed or fails: say so
                row["systems"][system] = {"error": f"{type(e).__name__}: {e}"}
                continue
            entry = {"seconds": round(seconds, 4), "runs": runs}
            if ref is None:
                ref = out
            else:
                entry["agreement"] = round(agreement(ref, out), 5)
            row["systems"][system] = entry
            print(f"{name} n={n} {system}: {seconds:.3f} s ({runs} runs) {entry.get('agreement', '')}",
                  file=sys.stderr)
        peers = [v["seconds"] for s, v in row["systems"].items() if not s.startswith("simjoin") and "seconds" in v]
        sj = row["systems"].get("simjoin", {}).get("seconds")
        if peers and sj:
            row["best_peer_over_simjoin"] = round(min(peers) / sj, 2)
        rows.append(row)
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine, "k": args.k, "command": " ".join(sys.argv), "rows": rows}
    (out / "knn.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# kNN join: simjoin vs scipy, scikit-learn, FAISS",
        "",
        f"Self-kNN, k = {args.k}, float32 data, NumPy arrays out, index build included; median seconds "
        f"({machine['cores']} cores, load average at the start {load_start}, at the end {machine['load_average_end']}).",
        f"Command: `{result['command']}`.",
        "",
        "| workload | n | " + " | ".join(args.systems) + " | best peer / simjoin |",
        "|---|---|" + "---|" * len(args.systems) + "---|",
    ]
    for r in rows:
        cells = []
        for s in args.systems:
            v = r["systems"].get(s, {})
            if "seconds" in v:
                agree = f" (agree {v['agreement']:.4f})" if "agreement" in v else ""
                cells.append(f"{v['seconds']:.3f}{agree}")
            else:
                cells.append("skipped" if "skipped" in v else "error")
        lines.append(f"| {r['workload']} | {r['n']} | " + " | ".join(cells) + f" | {r.get('best_peer_over_simjoin', '')} |")
    (out / "knn.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
