"""Randomised differential tests of the installed `simjoin` package, every backend and
algorithm against an independent oracle, on adversarial data: duplicates, integer
lattices (points exactly eps apart, on cell edges), clusters, points on a line, dimensions
of wildly different spread, far-off coordinates, scales from 1e-100 to 1e100, f32 and f64,
n = 0..1500, 1-D to 100-D, self-joins and A x B.

    python tests/fuzz/fuzz.py join   [--seed S] [--iterations N]
    python tests/fuzz/fuzz.py knn    ...
    python tests/fuzz/fuzz.py dbscan ...

- join: the oracle is NumPy doing the engine's arithmetic (src/metric.rs: the input
  precision, dimensions in order, eps rounded once and squared in that precision), so sets
  must be equal exactly; an eps out of the precision's range must be an "out of range" error.
- knn: the oracle ranks the same accumulated distances by (distance, index).
- dbscan: scikit-learn's DBSCAN (a third of the cases with integer sample weights): the same core points, the same partition of them, the same
  noise, and every border point in a cluster with a core point within eps.

GPU cases run on whatever Vulkan device the loader gives (tests/run.sh pins lavapipe with
validation on) and only at sizes lavapipe runs quickly. A failure prints the case and saves
its points under $FUZZ_OUT (default /tmp); the exit status is the number of failures (capped).
Fixed seeds make a run reproducible; CI runs a few seeds, anyone can run more.
"""
import argparse
import os
import sys

import numpy as np

import simjoin

OUT = os.environ.get("FUZZ_OUT", "/tmp")
GPU_MAX_N = 400


def accumulate(X, Y, metric):
    """The engine's accumulator for every pair of rows of X and Y, in X's precision."""
    acc = np.zeros((len(X), len(Y)), dtype=X.dtype)
    for k in range(X.shape[1]):
        d = X[:, None, k] - Y[None, :, k]
        if metric == "euclidean":
            acc = acc + d * d
        elif metric == "manhattan":
            acc = acc + np.abs(d)
        else:
            acc = np.maximum(acc, np.abs(d))
    return acc


def threshold(eps, metric, dtype):
    e = dtype.type(eps)
    return e * e if metric == "euclidean" else e


def points(rng, n_choices=(0, 1, 2, 3, 50, 300, 1200), dims=(1, 2, 3, 5, 8, 13, 32, 64, 100)):
    kind = str(rng.choice(["uniform", "dups", "lattice", "clusters", "line", "wide", "far", "int"]))
    n, d = int(rng.choice(n_choices)), int(rng.choice(dims))
    if kind == "uniform":
        X = rng.random((n, d))
    elif kind == "dups":
        X = rng.integers(0, 3, (n, d)).astype(float) * 0.5
    elif kind == "lattice":
        X = rng.integers(0, 6, (n, d)).astype(float) * 0.25
    elif kind == "clusters":
        X = rng.normal(size=(n, d)) * 0.01 + rng.integers(0, 4, (n, 1))
    elif kind == "line":
        X = np.zeros((n, d))
        X[:, 0] = rng.random(n) * 1e6
    elif kind == "wide":
        X = rng.random((n, d)) * np.logspace(-6, 6, d)
    elif kind == "far":
        X = -rng.random((n, d)) - 1e3
    else:
        X = rng.integers(-(2**20), 2**20, (n, d)).astype(float)
    scale = float(rng.choice([1.0, 1e-100, 1e100, 2.0**-60, 2.0**40, 1e-160, 1e160]))
    X = X * scale
    if rng.random() < 0.3:
        with np.errstate(over="ignore"):
            X32 = X.astype(np.float32)
        if np.all(np.isfinite(X32)):
            X = X32
    return kind, X, scale


def fuzz_join(rng, failures):
    kind, X, scale = points(rng)
    n, d = X.shape
    if n >= 2 and rng.random() < 0.5:
        # eps = the distance of two of the points: a pair exactly at the boundary.
        a, b = rng.integers(0, n, 2)
        with np.errstate(over="ignore", under="ignore"):
            eps = float(np.sqrt(np.sum((X[a].astype(float) - X[b].astype(float)) ** 2)))
    else:
        eps = float(rng.choice([0.01, 0.1, 0.5, 1.0, 3.0])) * scale
        if kind in ("uniform", "clusters"):
            eps *= np.sqrt(d)
    if not (np.isfinite(eps) and eps > 0):
        eps = 0.25 * scale
    metric = str(rng.choice(["euclidean", "manhattan", "chebyshev"]))
    Y = None
    if n > 0 and rng.random() < 0.3:
        m = int(rng.choice([1, 10, 200]))
        with np.errstate(over="ignore", invalid="ignore"):
            jitter = (rng.random((m, d)) - 0.5) * eps
            Y = (X[rng.integers(0, n, m)].astype(float) + jitter).astype(X.dtype)
        if not np.all(np.isfinite(Y)):
            Y = None
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        thr = threshold(eps, metric, X.dtype)
        in_range = bool(np.isfinite(thr) and thr >= np.finfo(X.dtype).tiny)
        m = accumulate(X, X if Y is None else Y, metric) <= thr
    if Y is None:
        m = np.triu(m, 1)
    want = set(zip(*[a.tolist() for a in np.nonzero(m)]))
    runs = [("cpu", a) for a in ("auto", "grid", "ego", "brute")]
    if n <= GPU_MAX_N:
        runs += [("gpu", a) for a in ("grid", "lss", "brute")]
    for backend, algorithm in runs:
        what = f"join {kind} {X.shape} {X.dtype} eps={eps!r} {metric} {'AxB' if Y is not None else 'self'} {backend}/{algorithm}"
        try:
            if Y is None:
                r = simjoin.self_join(X, eps, metric=metric, backend=backend, algorithm=algorithm)
            else:
                r = simjoin.join(X, Y, eps, metric=metric, backend=backend, algorithm=algorithm)
            got = set(map(tuple, np.asarray(r).tolist()))
            if not in_range:
                fail(failures, what, "no error for an eps out of range", X)
            elif got != want:
                fail(failures, what, f"missing {len(want - got)}, extra {len(got - want)}", X)
        except simjoin.InvalidArgumentError as e:
            if in_range or "out of range" not in str(e):
                fail(failures, what, f"error: {e}", X)
    if in_range:
        # The CSR (both directions of a self-join), sorted or not, holds the same entries.
        sorted_rows = bool(rng.random() < 0.5)
        what = f"csr {kind} {X.shape} {X.dtype} eps={eps!r} {metric} {'AxB' if Y is not None else 'self'} sorted={sorted_rows}"
        try:
            if Y is None:
                c = simjoin.self_join(X, eps, metric=metric, backend="cpu", output="csr", sorted=sorted_rows)
            else:
                c = simjoin.join(X, Y, eps, metric=metric, backend="cpu", output="csr", sorted=sorted_rows)
            rows = np.repeat(np.arange(c.shape[0]), np.diff(c.indptr))
            got = list(zip(rows.tolist(), c.indices.tolist()))
            expect = want | {(j, i) for i, j in want} if Y is None else want
            if len(got) != len(expect) or set(got) != expect:
                fail(failures, what, f"{len(got)} entries, {len(expect)} expected", X)
            elif sorted_rows and any(np.any(np.diff(c.indices[a:b].astype(np.int64)) <= 0)
                                     for a, b in zip(c.indptr[:-1], c.indptr[1:])):
                fail(failures, what, "a row's neighbours not ascending", X)
        except simjoin.InvalidArgumentError as e:
            fail(failures, what, f"error: {e}", X)


def fuzz_knn(rng, failures):
    n, d = int(rng.choice([2, 3, 10, 100, 500])), int(rng.choice([1, 2, 3, 4, 7, 16, 40, 70]))
    kind = str(rng.choice(["uniform", "int", "dups", "clusters"]))
    if kind == "uniform":
        X = rng.random((n, d))
    elif kind == "int":
        X = rng.integers(0, 4, (n, d)).astype(float)
    elif kind == "dups":
        X = np.repeat(rng.random((max(1, n // 10), d)), 10, axis=0)[:n]
    else:
        X = rng.normal(size=(n, d)) * 0.01 + rng.integers(0, 3, (n, 1))
    n = len(X)
    if n < 2:
        return
    if rng.random() < 0.3:
        X = X.astype(np.float32)
    metric = str(rng.choice(["euclidean", "manhattan", "chebyshev"]))
    Q = None
    if rng.random() < 0.3:
        Q = (X[rng.integers(0, n, 20)] + rng.random((20, d)) * 0.1).astype(X.dtype)
    k = int(rng.integers(1, min(n - 1, 40) + 1))
    acc = accumulate(X if Q is None else Q, X, metric)
    if Q is None:
        np.fill_diagonal(acc, np.inf)
    index = np.arange(n)
    want = np.array([np.lexsort((index, row))[:k] for row in acc])
    for backend, algorithm in [("cpu", "auto"), ("cpu", "kdtree"), ("cpu", "grid"), ("cpu", "brute"),
                               ("gpu", "lss"), ("gpu", "brute")]:
        what = f"knn {kind} {X.shape} {X.dtype} k={k} {metric} {'queries' if Q is not None else 'self'} {backend}/{algorithm}"
        try:
            _, got = simjoin.knn(X, k, query=Q, metric=metric, backend=backend, algorithm=algorithm)
            if not np.array_equal(np.asarray(got), want):
                fail(failures, what, "indices differ", X)
        except simjoin.Error as e:
            fail(failures, what, f"error: {e}", X)


def fuzz_dbscan(rng, failures):
    from sklearn.cluster import DBSCAN

    n, d = int(rng.choice([1, 2, 3, 20, 200, 1500])), int(rng.choice([1, 2, 3, 5, 16, 40]))
    kind = str(rng.choice(["uniform", "int", "dups", "clusters"]))
    if kind == "uniform":
        X = rng.random((n, d))
    elif kind == "int":
        X = rng.integers(0, 5, (n, d)).astype(float)
    elif kind == "dups":
        X = np.repeat(rng.random((max(1, n // 7), d)), 7, axis=0)[:n]
    else:
        X = rng.normal(size=(n, d)) * 0.05 + rng.integers(0, 3, (n, 1))
    n = len(X)
    metric = str(rng.choice(["euclidean", "manhattan", "chebyshev"]))
    min_samples = int(rng.choice([1, 2, 3, 5, 10, 30]))
    if kind == "int":
        eps = float(rng.choice([1.0, 2.0]))
    else:
        eps = float(rng.choice([0.05, 0.1, 0.3])) * (np.sqrt(d) if kind == "uniform" else 1)
    # Integer sample weights (zero and negative included) in a third of the cases: exact
    # sums in both, so the answers must agree.
    weight = rng.integers(-1, 4, n).astype(float) if rng.random() < 0.3 else None
    if weight is not None and not weight.any():
        weight = None  # scikit-learn refuses all-zero weights (simjoin: every point noise)
    ref = DBSCAN(eps=eps, min_samples=min_samples, metric=metric).fit(X, sample_weight=weight)
    core = np.zeros(n, bool)
    core[ref.core_sample_indices_] = True
    for backend in ["cpu", "gpu"] if n <= GPU_MAX_N else ["cpu"]:
        what = f"dbscan {kind} {X.shape} eps={eps} min_samples={min_samples} {metric} {backend}{' weighted' if weight is not None else ''}"
        try:
            est = simjoin.DBSCAN(eps=eps, min_samples=min_samples, metric=metric, backend=backend)
            est.fit(X, sample_weight=weight)
        except simjoin.Error as e:
            fail(failures, what, f"error: {e}", X)
            continue
        labels = np.asarray(est.labels_)
        got_core = np.zeros(n, bool)
        got_core[est.core_sample_indices_] = True
        if not np.array_equal(got_core, core):
            fail(failures, what, "core points differ", X)
        elif not np.array_equal(partition(labels, core), partition(ref.labels_, core)):
            fail(failures, what, "clusters of core points differ", X)
        elif not np.array_equal(labels == -1, ref.labels_ == -1):
            fail(failures, what, "noise differs", X)
        else:
            for b in np.flatnonzero(~core & (labels >= 0)):
                diff = np.abs(X[core] - X[b])
                dist = {"euclidean": lambda: np.sqrt((diff**2).sum(1)), "manhattan": lambda: diff.sum(1),
                        "chebyshev": lambda: diff.max(1)}[metric]()
                if not np.any((dist <= eps * (1 + 1e-12)) & (labels[core] == labels[b])):
                    fail(failures, what, f"border point {b} has no core neighbour in its cluster", X)
                    break


def partition(labels, core):
    """Core points' labels renumbered by first appearance: equal for equal partitions."""
    first = {}
    return np.array([first.setdefault(l, len(first)) for l in labels[core]])


def fail(failures, what, why, X):
    failures.append(what)
    path = os.path.join(OUT, f"fuzz-failure-{len(failures)}.npy")
    np.save(path, X)
    print(f"FAIL {what}: {why} (points in {path})", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["join", "knn", "dbscan"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--iterations", type=int, default=200)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    failures = []
    step = {"join": fuzz_join, "knn": fuzz_knn, "dbscan": fuzz_dbscan}[args.what]
    for _ in range(args.iterations):
        step(rng, failures)
    print(f"fuzz {args.what}: seed {args.seed}, {args.iterations} cases, {len(failures)} failures")
    sys.exit(min(len(failures), 100))


if __name__ == "__main__":
    main()
