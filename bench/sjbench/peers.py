"""The peers, each timed as a user would call it: from points in memory to the result in
the system's own output form, index build included. Run as a worker process
(`python -m sjbench.peers SYSTEM DATA.npy EPS REPEATS`) so the harness can kill a run that
passes its timeout; it prints one JSON line per repetition.

Pair-count semantics, all normalised to unique unordered pairs {i, j}, i != j, dist <= eps:
- scipy cKDTree.query_pairs(r): unique pairs with distance <= r (f64) -> count as is.
- sklearn radius_neighbors_graph(include_self=False): both directions, self excluded,
  distance <= radius (f64) -> nnz / 2.
- FAISS IndexFlatL2.range_search(radius): squared L2 in f32, strict `<` radius, both
  directions and self -> radius = nextafter(f32(eps^2), +inf) so `<` means `<= eps^2`,
  then count the results (q, j) with j > q.
"""

from __future__ import annotations

import importlib
import json
import sys
import time

import numpy as np

PEERS = ("scipy-ckdtree", "sklearn-radius-graph", "faiss-flat-range")


def run_scipy(x: np.ndarray, eps: float) -> int:
    from scipy.spatial import cKDTree

    tree = cKDTree(x)
    pairs = tree.query_pairs(eps, output_type="ndarray")
    return len(pairs)


def run_sklearn(x: np.ndarray, eps: float) -> int:
    from sklearn.neighbors import radius_neighbors_graph

    graph = radius_neighbors_graph(x, eps, mode="connectivity", include_self=False, n_jobs=-1)
    assert graph.nnz % 2 == 0, "sklearn's graph should be symmetric"
    return graph.nnz // 2


def faiss_radius(eps: float) -> np.float32:
    """The FAISS radius that makes its strict `d2 < radius` mean `d2 <= f32(eps^2)`."""
    return np.nextafter(np.float32(eps * eps), np.float32(np.inf))


def faiss_range(x32: np.ndarray, eps: float):
    import faiss

    index = faiss.IndexFlatL2(x32.shape[1])
    index.add(x32)
    return index.range_search(x32, float(faiss_radius(eps)))


def faiss_count(lims: np.ndarray, labels: np.ndarray) -> int:
    query = np.repeat(np.arange(len(lims) - 1), np.diff(lims.astype(np.int64)))
    return int(np.count_nonzero(labels > query))


def run_simjoin_python(x: np.ndarray, eps: float) -> int:
    """simjoin through its Python bindings (ctypes over the C library), CPU backend, pairs
    materialised as an (m, 2) array like the peers' output (unsorted, as theirs are)."""
    import simjoin

    return len(simjoin.self_join(x, eps, backend="cpu", sorted=False))


RUNNERS = {
    "scipy-ckdtree": run_scipy,
    "sklearn-radius-graph": run_sklearn,
    "simjoin-python": run_simjoin_python,
}
MODULES = {
    "scipy-ckdtree": "scipy.spatial",
    "sklearn-radius-graph": "sklearn.neighbors",
    "faiss-flat-range": "faiss",
    "simjoin-python": "simjoin",
}


def timed(system: str, x: np.ndarray, eps: float) -> tuple[float, int]:
    if system == "faiss-flat-range":
        x32 = np.ascontiguousarray(x, dtype=np.float32)  # lossless: values are f32-representable
        t0 = time.perf_counter()
        lims, _dist, labels = faiss_range(x32, eps)
        seconds = time.perf_counter() - t0
        return seconds, faiss_count(lims, labels)
    t0 = time.perf_counter()
    pairs = RUNNERS[system](x, eps)
    return time.perf_counter() - t0, pairs


def main(argv: list[str]) -> int:
    system, path, eps, repeats = argv[0], argv[1], float(argv[2]), int(argv[3])
    budget = float(argv[4]) if len(argv) > 4 else float("inf")
    x = np.load(path)
    importlib.import_module(MODULES[system])  # import outside the timed region
    spent = 0.0
    for _ in range(repeats):
        seconds, pairs = timed(system, x, eps)
        print(json.dumps({"seconds": seconds, "pairs": pairs}), flush=True)
        spent += seconds
        if spent >= budget:  # long runs are measured fewer times (see runner.REPEAT_BUDGET_S)
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
