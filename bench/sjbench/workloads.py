"""The papers' synthetic workloads and the choice of eps by sampling.

Every workload is generated in float64 and then rounded to float32-representable values,
so that f64 systems (simjoin, scipy, scikit-learn) and f32-only systems (FAISS) are handed
exactly the same points; each system then computes distances in its own precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    name: str
    family: str  # "uniform", "exponential" or "clusters"
    dim: int
    default_n: int
    source: str  # the paper whose experiment it mirrors

    def describe(self) -> str:
        return {
            "uniform": f"uniform in [0,100]^{self.dim}",
            "exponential": f"exponential, lambda = 40, clipped to [0,1]^{self.dim}",
            "clusters": f"5 gaussian clusters (sigma = 0.05) in [0,1]^{self.dim}",
        }[self.family]


# Default sizes are scaled to a 2-core machine so the whole comparison takes ~20 minutes:
# the papers use 2M-10M points on a GPU and 100k-200k for the CPU joins, but here the
# peers (single-threaded cKDTree, O(n^2) brute force in high dimensions) would take
# minutes per eps. `--n` / `--scale` change them; the gpu mode takes `--sizes`.
WORKLOADS = {
    w.name: w
    for w in [
        Workload("uniform-2d", "uniform", 2, 100_000, "GPU-SJ (Gowanlock & Karsin 2018)"),
        Workload("uniform-3d", "uniform", 3, 100_000, "GPU-SJ (Gowanlock & Karsin 2018)"),
        Workload("uniform-6d", "uniform", 6, 50_000, "GPU-SJ (Gowanlock & Karsin 2018)"),
        Workload("expo-16d", "exponential", 16, 20_000, "GPU-JOIN (Gowanlock & Karsin 2019)"),
        Workload("expo-32d", "exponential", 32, 20_000, "GPU-JOIN (Gowanlock & Karsin 2019)"),
        Workload("expo-64d", "exponential", 64, 20_000, "GPU-JOIN (Gowanlock & Karsin 2019)"),
        Workload("clusters-4d", "clusters", 4, 50_000, "Kalashnikov & Prabhakar (skewed)"),
        Workload("clusters-9d", "clusters", 9, 40_000, "Kalashnikov & Prabhakar (skewed)"),
    ]
}


def generate(w: Workload, n: int, seed: int = 0) -> np.ndarray:
    """n points of workload w, C-contiguous float64 holding float32-representable values."""
    rng = np.random.default_rng([seed, w.dim, sum(map(ord, w.family))])
    if w.family == "uniform":
        x = rng.uniform(0.0, 100.0, size=(n, w.dim))
    elif w.family == "exponential":
        # GPU-JOIN: exponential with rate lambda = 40 (mean 1/40), coordinates in [0,1].
        x = np.clip(rng.exponential(scale=1.0 / 40.0, size=(n, w.dim)), 0.0, 1.0)
    elif w.family == "clusters":
        # Kalashnikov & Prabhakar "skewed": five clusters, normal with sigma 0.05 around
        # centres drawn uniformly in [0.2,0.8]^d (so clusters sit inside the unit cube).
        centres = rng.uniform(0.2, 0.8, size=(5, w.dim))
        which = rng.integers(0, 5, size=n)
        x = centres[which] + rng.normal(0.0, 0.05, size=(n, w.dim))
    else:
        raise ValueError(f"unknown workload family {w.family!r}")
    return np.ascontiguousarray(x.astype(np.float32).astype(np.float64))


def neighbour_distances(x: np.ndarray, sample: int, seed: int = 0, keep: int = 4000) -> tuple[np.ndarray, int]:
    """Distances from `sample` random points to their `keep` nearest other points, pooled.

    Returns (sorted pooled distances, number of sampled queries). The mean number of
    neighbours within eps over the sample is `searchsorted(pooled, eps, 'right') / m`,
    exact for the sample as long as no sampled point has more than `keep` neighbours.
    """
    n = len(x)
    m = min(sample, n)
    if m < 2:
        return np.zeros(0), max(m, 1)
    rng = np.random.default_rng(seed)
    queries = rng.choice(n, size=m, replace=False)
    keep = min(keep, n - 1)
    norms = np.einsum("ij,ij->i", x, x)
    pooled = []
    for start in range(0, m, 32):
        q = queries[start : start + 32]
        # |a-b|^2 by expansion is accurate enough to *choose* eps (not to count pairs).
        d2 = norms[q, None] + norms[None, :] - 2.0 * (x[q] @ x.T)
        d2[np.arange(len(q)), q] = np.inf  # exclude the query itself
        part = np.partition(d2, keep - 1, axis=1)[:, :keep]
        pooled.append(np.sqrt(np.maximum(part, 0.0)).ravel())
    return np.sort(np.concatenate(pooled)), m


def choose_eps(x: np.ndarray, targets: list[float], sample: int = 400, seed: int = 0) -> list[float]:
    """eps values giving about `targets` neighbours per point (self excluded), estimated on
    a random sample and rounded to 3 significant digits so they can be stated and reused."""
    pooled, m = neighbour_distances(x, sample, seed)
    out = []
    for t in targets:
        k = int(round(t * m))
        k = min(max(k, 1), len(pooled)) - 1 if len(pooled) else 0
        eps = float(pooled[k]) if len(pooled) else 1.0
        eps = float(f"{eps:.3g}") if eps > 0 else 1e-6
        out.append(eps)
    # Distinct, increasing eps (duplicate data can make two targets land on one value).
    return sorted(set(out))


def selectivity(pairs: int, n: int) -> float:
    """Average neighbours per point, self excluded: |R| - |D| over |D| with R both
    directions and self (GPU-JOIN's S_D), i.e. 2 * unique pairs / n."""
    return 2.0 * pairs / n if n else 0.0
