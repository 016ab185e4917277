"""Randomised differential tests of the installed `simjoin` package, every backend and
algorithm against an independent oracle, on adversarial data: duplicates, integer
lattices (points exactly eps apart, on cell edges), clusters, points on a line, dimensions
of wildly different spread, far-off coordinates, scales from 1e-100 to 1e100, f32 and f64,
n = 0..1500, 1-D to 100-D, self-joins and A x B.

    python tests/fuzz/fuzz.py join   [--seed S] [--iterations N]
    python tests/fuzz/fuzz.py knn    ...
    python tests/fuzz/fuzz.py dbscan ...
    python tests/fuzz/fuzz.py cosine ...
    python tests/fuzz/fuzz.py cosine-knn ...

- join: the oracle is NumPy doing the engine's arithmetic (src/metric.rs: the input
  precision, dimensions in order, eps rounded once and squared in that precision), so sets
  must be equal exactly; an eps out of the precision's range must be an "out of range" error.
- knn: the oracle ranks the same accumulated distances by (distance, index).
- dbscan: scikit-learn's DBSCAN (a third of the cases with integer sample weights): the same core points, the same partition of them, the same
  noise, and every border point in a cluster with a core point within eps.
- cosine, cosine-knn: joins (self and A x B) and kNN under metric="cosine" on
  embedding-like rows (clusters of stated spread, copies and scalar multiples, low
  intrinsic dimension, sparse and one-hot rows, norms over 200 orders of magnitude; f64,
  f32, f16; 2-1024 dimensions; n up to 5,000, where the grouped index runs), eps at a
  pair's own distance half the time, zero vectors refused. The oracle is src/metric.rs's
  written rule: BLAS where it decides by a proven margin, the canonical f64 sum elsewhere.

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
U64 = 2.0**-53  # f64's unit roundoff


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


def cosine_points(rng, n_choices=(0, 1, 2, 3, 40, 300, 1000, 5000),
                  dims=(2, 3, 5, 16, 64, 128, 384, 768, 1024)):
    """Embedding-like rows for the cosine rule: clusters of stated spread, exact copies and
    scalar multiples (distance 0 and 2), low intrinsic dimension, sparse non-negative rows
    (orthogonal pairs: distance exactly 1), one-hot rows, small integers, uniform on the
    sphere; rows' norms spread over many orders of magnitude; f64, f32 or f16."""
    kind = str(rng.choice(["sphere", "clusters", "copies", "lowdim", "sparse", "onehot", "int", "wide"]))
    n, d = int(rng.choice(n_choices)), int(rng.choice(dims))
    if n * d > 4_200_000:  # the oracle's time; 4,100 rows at 1024-D (the grouped index's least)
        n = max(1, 4_200_000 // d)
    if kind == "sphere":
        X = rng.normal(size=(n, d))
    elif kind == "clusters":
        c = int(rng.choice([1, 3, 20, 200]))
        spread = float(rng.choice([1e-6, 1e-3, 0.03, 0.3]))
        X = rng.normal(size=(c, d))[rng.integers(0, c, n)] + spread * rng.normal(size=(n, d))
    elif kind == "copies":
        base = rng.normal(size=(max(1, n // 8), d))
        X = base[rng.integers(0, len(base), n)]
        X = X * rng.choice([1.0, 1.0, 2.0, 0.5, 3.0, -1.0, 1e10, -2.0**-30], (n, 1))
        nudge = rng.random(n) < 0.2
        X[nudge] += 1e-9 * rng.normal(size=(int(nudge.sum()), d))
    elif kind == "lowdim":
        k = int(rng.choice([1, 2, 4, 8]))
        X = rng.normal(size=(n, k)) @ rng.normal(size=(k, d))
    elif kind == "sparse":
        X = rng.random((n, d)) * (rng.random((n, d)) < float(rng.choice([0.02, 0.1, 0.5])))
        X[np.arange(n), rng.integers(0, d, n)] = 1.0
    elif kind == "onehot":
        X = np.zeros((n, d))
        X[np.arange(n), rng.integers(0, min(d, 6), n)] = rng.choice([1.0, 2.0, 0.25], n)
    elif kind == "int":
        X = rng.integers(-2, 3, (n, d)).astype(float)
        X[np.arange(n), rng.integers(0, d, n)] = 1.0  # no zero rows (they are tested apart)
    else:
        X = rng.normal(size=(n, d)) * np.logspace(-6, 6, d)
    spread = float(rng.choice([0, 0, 3, 30]))
    if spread and n:
        X = X * 10.0 ** rng.uniform(-spread, spread, (n, 1))
    X = X * float(rng.choice([1.0, 1.0, 1e-100, 1e100, 2.0**-70]))
    dtype = rng.choice(["f64", "f32", "f16"], p=[0.4, 0.4, 0.2])
    if dtype != "f64":
        t = np.float32 if dtype == "f32" else np.float16
        with np.errstate(over="ignore", under="ignore"):
            Xt = X.astype(t)
        if np.all(np.isfinite(Xt)) and np.all(np.abs(Xt).max(axis=1, initial=1) > 0):
            X = Xt
    if n >= 2 and rng.random() < 0.1:
        X[rng.integers(0, n)] = 0  # a zero vector: an error
    return kind, np.ascontiguousarray(X)


def rule_rows(X):
    """Rows widened to f64 (float16 is computed in float32, exactly widened) and their norms
    under the written rule (src/metric.rs: canonical order, f64, no fused multiply-add;
    np.cumsum adds in order); None where a norm is not usable (zero, or its square out of
    f64's normal range: the engine must refuse the data)."""
    W = X.astype(np.float64)
    with np.errstate(over="ignore", under="ignore"):
        nrm = np.sqrt(np.cumsum(W * W, axis=1)[:, -1]) if W.shape[1] else np.zeros(len(W))
        ok = np.all((np.abs(nrm * nrm) >= np.finfo(np.float64).tiny) & np.isfinite(nrm * nrm))
    return W, (nrm if ok else None)


def rule_dots(W, V, nw, nv, near):
    """The rule's dot products of the pairs of W and V: BLAS where it decides, the canonical
    sum for every pair within `near(approx, margin)`. BLAS's order is within
    2 gamma_D |a| |b| of any other order's; the margin is twice that."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        ws, vs = W / nw[:, None], V / nv[:, None]  # BLAS on unit rows: no overflow
        approx = (ws @ vs.T) * nw[:, None] * nv[None, :]
    margin = 8.0 * (W.shape[1] + 2) * U64 * nw[:, None] * nv[None, :] + 1e-300
    i, j = np.nonzero(near(approx, margin))
    exact = approx.copy()
    for s in range(0, len(i), 20000):
        a, b = i[s:s + 20000], j[s:s + 20000]
        with np.errstate(over="ignore", under="ignore"):
            exact[a, b] = np.cumsum(W[a] * V[b], axis=1)[:, -1]
    return exact


def cosine_e(eps, X):
    """eps rounded to the computing precision (float16 data is computed in float32)."""
    return float((np.float64 if X.dtype == np.float64 else np.float32)(eps))


def fuzz_cosine(rng, failures):
    kind, X = cosine_points(rng)
    n, d = X.shape
    W, nw = rule_rows(X)
    Y = None
    if n > 0 and rng.random() < 0.35:
        m = int(rng.choice([1, 7, 100, 300, 2000]))
        jitter = float(rng.choice([0.0, 1e-7, 0.01, 0.3]))
        Yf = W[rng.integers(0, n, m)] * (1 + jitter * rng.normal(size=(m, d)))
        Y = Yf.astype(X.dtype) if np.all(np.isfinite(Yf.astype(X.dtype))) else None
    V, nv = (W, nw) if Y is None else rule_rows(Y)
    if nw is not None and nv is not None and n >= 2 and rng.random() < 0.5:
        # eps = the rule's distance of two of the rows: a pair at the threshold.
        a, b = rng.integers(0, n), rng.integers(0, len(V))
        dot = float(np.cumsum(W[a] * V[b])[-1])
        eps = 1.0 - dot / (nw[a] * nv[b])
        if not eps > 0:
            eps = float(rng.choice([1e-12, 1e-7]))
    else:
        eps = float(rng.choice([1e-6, 1e-3, 0.01, 0.05, 0.1, 0.3, 1.0, 1.5, 2.0]))
    what = f"cosine {kind} {X.shape} {X.dtype} eps={eps!r} {'AxB ' + str(Y.shape) if Y is not None else 'self'}"
    refused = nw is None or nv is None
    want = None
    if not refused:
        e = cosine_e(eps, X)
        thr = (1.0 - e) * (nw[:, None] * nv[None, :])
        exact = rule_dots(W, V, nw, nv, lambda ap, mg: np.abs(ap - thr) <= mg)
        m = exact >= thr
        if Y is None:
            m = np.triu(m, 1)
        want = set(zip(*[a.tolist() for a in np.nonzero(m)]))
    runs = [("cpu", a) for a in ("auto", "brute", "ego", "grid")]
    if n * (n if Y is None else len(Y)) * d <= 2e7:  # what lavapipe runs in seconds
        runs += [("gpu", a) for a in ("auto", "brute", "grid", "lss")]
    for backend, algorithm in runs:
        w = f"{what} {backend}/{algorithm}"
        try:
            if Y is None:
                r = simjoin.self_join(X, eps, metric="cosine", backend=backend, algorithm=algorithm)
            else:
                r = simjoin.join(X, Y, eps, metric="cosine", backend=backend, algorithm=algorithm)
            got = set(map(tuple, np.asarray(r).tolist()))
            if refused:
                fail(failures, w, "no error for a zero or unsquarable vector", X)
            elif got != want:
                fail(failures, w, f"missing {len(want - got)}, extra {len(got - want)} of {len(want)}", X, Y)
        except simjoin.InvalidArgumentError as e:
            if not refused or not ("zero vector" in str(e) or "normal range" in str(e)):
                fail(failures, w, f"error: {e}", X, Y)


def fuzz_cosine_knn(rng, failures):
    kind, X = cosine_points(rng, n_choices=(2, 3, 40, 300, 1000, 5000))
    n, d = X.shape
    if n < 2:
        return
    W, nw = rule_rows(X)
    Q = None
    if rng.random() < 0.35:
        m = int(rng.choice([1, 20, 300]))
        Qf = W[rng.integers(0, n, m)] * (1 + float(rng.choice([0.0, 1e-6, 0.1])) * rng.normal(size=(m, d)))
        Q = Qf.astype(X.dtype) if np.all(np.isfinite(Qf.astype(X.dtype))) else None
    V, nv = (W, nw) if Q is None else rule_rows(Q)
    k = int(rng.choice([1, 2, 10, 50]))
    k = min(k, n - 1 if Q is None else n)
    what = f"cosine knn {kind} {X.shape} {X.dtype} k={k} {'queries ' + str(Q.shape) if Q is not None else 'self'}"
    refused = nw is None or nv is None
    want = None
    if not refused:
        # Distances (f64, the rule's) of every query to every row; each query's k-th by the
        # approximate products, then the canonical sum for every row that could rank by it.
        def near(approx, margin):
            dist = 1.0 - approx / (nv[:, None] * nw[None, :])
            slack = margin / (nv[:, None] * nw[None, :]) + 8 * U64
            if Q is None:
                np.fill_diagonal(dist, np.inf)
            kth = np.partition(dist, k - 1, axis=1)[:, k - 1:k]
            return dist <= kth + 2 * slack
        exact = rule_dots(V, W, nv, nw, near)
        dist = 1.0 - exact / (nv[:, None] * nw[None, :])
        if Q is None:
            np.fill_diagonal(dist, np.inf)
        index = np.arange(n)
        want = np.array([np.lexsort((index, row))[:k] for row in dist])
    runs = [("cpu", "auto"), ("cpu", "brute"), ("cpu", "kdtree"), ("cpu", "grid")]
    if n * (n if Q is None else len(Q)) * d <= 2e7:
        runs += [("gpu", "auto"), ("gpu", "brute"), ("gpu", "lss")]
    for backend, algorithm in runs:
        w = f"{what} {backend}/{algorithm}"
        try:
            _, got = simjoin.knn(X, k, query=Q, metric="cosine", backend=backend, algorithm=algorithm)
            if refused:
                fail(failures, w, "no error for a zero or unsquarable vector", X)
            elif not np.array_equal(np.asarray(got), want):
                bad = np.flatnonzero(np.any(np.asarray(got) != want, axis=1))
                fail(failures, w, f"indices differ in {len(bad)} rows (first {bad[:3].tolist()})", X, Q)
        except simjoin.InvalidArgumentError as e:
            if not refused or not ("zero vector" in str(e) or "normal range" in str(e)):
                fail(failures, w, f"error: {e}", X, Q)


def partition(labels, core):
    """Core points' labels renumbered by first appearance: equal for equal partitions."""
    first = {}
    return np.array([first.setdefault(l, len(first)) for l in labels[core]])


def fail(failures, what, why, X, Y=None):
    failures.append(what)
    path = os.path.join(OUT, f"fuzz-failure-{len(failures)}.npy")
    np.save(path, X)
    if Y is not None:
        np.save(path.replace(".npy", "-b.npy"), Y)
    print(f"FAIL {what}: {why} (points in {path})", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["join", "knn", "dbscan", "cosine", "cosine-knn"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--iterations", type=int, default=200)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    failures = []
    step = {"join": fuzz_join, "knn": fuzz_knn, "dbscan": fuzz_dbscan, "cosine": fuzz_cosine,
            "cosine-knn": fuzz_cosine_knn}[args.what]
    for _ in range(args.iterations):
        step(rng, failures)
    print(f"fuzz {args.what}: seed {args.seed}, {args.iterations} cases, {len(failures)} failures")
    sys.exit(min(len(failures), 100))


if __name__ == "__main__":
    main()
