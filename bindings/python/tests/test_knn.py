"""simjoin.knn against a NumPy brute-force oracle (exact: same indices, same distances, ties
by smaller index) and against scikit-learn's kneighbors / kneighbors_graph when installed."""
import gc

import numpy as np
import pytest

import simjoin


def oracle(X, k, query=None, metric="euclidean"):
    """Brute force in X's precision, canonical dimension order (no FMA: NumPy's elementwise ops)."""
    Q = X if query is None else query
    dt = X.dtype
    idx = np.empty((len(Q), k), dtype=np.uint32)
    dist = np.empty((len(Q), k), dtype=dt)
    for r in range(len(Q)):
        diff = (Q[r][None, :] - X).astype(dt)
        if metric == "euclidean":
            acc = np.zeros(len(X), dtype=dt)
            for d in range(X.shape[1]):  # sequential sum, one rounding per term
                acc = (acc + diff[:, d] * diff[:, d]).astype(dt)
        elif metric == "manhattan":
            acc = np.zeros(len(X), dtype=dt)
            for d in range(X.shape[1]):
                acc = (acc + np.abs(diff[:, d])).astype(dt)
        else:
            acc = np.abs(diff).max(axis=1).astype(dt)
        order = np.lexsort((np.arange(len(X)), acc))
        if query is None:
            order = order[order != r]
        order = order[:k]
        idx[r] = order
        a = acc[order]
        dist[r] = np.sqrt(a) if metric == "euclidean" else a
    return dist, idx


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("metric", ["euclidean", "manhattan", "chebyshev"])
@pytest.mark.parametrize("dim", [1, 3, 16])
def test_self_knn_matches_oracle(dtype, metric, dim):
    rng = np.random.default_rng(dim)
    X = rng.random((400, dim)).astype(dtype)
    X[50:60] = X[0]  # duplicates
    for k in (1, 7, 399):
        d, i = simjoin.knn(X, k, metric=metric, backend="cpu")
        wd, wi = oracle(X, k, metric=metric)
        assert d.shape == (400, k) and i.shape == (400, k)
        assert d.dtype == dtype
        np.testing.assert_array_equal(i, wi)
        np.testing.assert_array_equal(d, wd)


def test_a_to_b_and_brute():
    rng = np.random.default_rng(3)
    X = rng.random((500, 4))
    Q = rng.random((80, 4)) * 1.2
    for algorithm in ("auto", "kdtree", "grid", "brute"):
        d, i = simjoin.knn(X, 12, query=Q, algorithm=algorithm)
        wd, wi = oracle(X, 12, query=Q)
        np.testing.assert_array_equal(i, wi)
        np.testing.assert_array_equal(d, wd)


def test_lattice_ties_go_to_smaller_index():
    g = np.stack(np.meshgrid(np.arange(8.0), np.arange(8.0), indexing="ij"), -1).reshape(-1, 2)
    for k in (3, 4, 5, 8):
        d, i = simjoin.knn(g, k)
        wd, wi = oracle(g, k)
        np.testing.assert_array_equal(i, wi)
        np.testing.assert_array_equal(d, wd)


def test_matches_scikit_learn():
    neighbors = pytest.importorskip("sklearn.neighbors")
    rng = np.random.default_rng(5)
    X = rng.random((2000, 3))
    nn = neighbors.NearestNeighbors(n_neighbors=10).fit(X)
    sd, si = nn.kneighbors()  # self excluded, like simjoin.knn(X, k)
    d, i = simjoin.knn(X, 10)
    np.testing.assert_array_equal(i, si)  # continuous data: no ties
    np.testing.assert_allclose(d, sd, rtol=1e-12)
    g = simjoin.knn(X, 10, output="graph")
    sg = nn.kneighbors_graph(mode="distance")
    assert g.shape == sg.shape == (2000, 2000)
    assert abs(g - sg).max() < 1e-12
    np.testing.assert_array_equal(g.indices, sg.indices)
    Q = rng.random((100, 3))
    g = simjoin.knn(X, 5, query=Q, output="graph")
    sg = nn.kneighbors_graph(Q, n_neighbors=5, mode="distance")
    assert g.shape == (100, 2000)
    assert abs(g - sg).max() < 1e-12


def test_arrays_outlive_each_other():
    """The arrays view the engine's memory: it stays valid until the last one is gone."""
    X = np.random.default_rng(1).random((300, 2))
    d, i = simjoin.knn(X, 5)
    keep = i.copy()
    del d
    gc.collect()
    np.testing.assert_array_equal(i, keep)
    np.testing.assert_array_equal(i, oracle(X, 5)[1])


def test_errors_and_edges():
    X = np.random.default_rng(2).random((10, 2))
    with pytest.raises(simjoin.InvalidArgumentError, match="larger than"):
        simjoin.knn(X, 10)  # self-kNN: 9 candidates
    d, i = simjoin.knn(X, 10, query=X[:3])  # A-to-B: 10 candidates
    assert i.shape == (3, 10)
    for bad_k in (0, -1, 2.5, True):
        with pytest.raises(simjoin.InvalidArgumentError):
            simjoin.knn(X, bad_k)
    with pytest.raises(simjoin.InvalidArgumentError):
        simjoin.knn(X, 2, query=np.zeros((2, 3)))
    with pytest.raises(simjoin.InvalidArgumentError):
        simjoin.knn(np.array([[0.0, np.nan], [1.0, 1.0]]), 1)
    with pytest.raises(simjoin.InvalidArgumentError):
        simjoin.knn(X, 2, metric="hamming")
    # Cosine kNN: zero vectors are an error.
    with pytest.raises(simjoin.InvalidArgumentError, match="zero vector"):
        simjoin.knn(np.vstack([X, np.zeros((1, X.shape[1]))]), 2, metric="cosine")
    with pytest.raises(simjoin.InvalidArgumentError):
        simjoin.knn(X, 2, algorithm="ego")
    with pytest.raises(simjoin.InvalidArgumentError):
        simjoin.knn(X, 2, output="pairs")
    d, i = simjoin.knn(np.empty((0, 3)), 1)
    assert d.shape == (0, 1) and i.shape == (0, 1)
    d, i = simjoin.knn(X, 1, query=np.empty((0, 2)))
    assert i.shape == (0, 1)
    g = simjoin.knn(X, 1, query=np.empty((0, 2)), output="graph")
    assert g.shape == (0, 10)
    d, i = simjoin.knn([[0.0, 0.0], [3.0, 4.0]], 1)
    np.testing.assert_array_equal(i, [[1], [0]])
    np.testing.assert_array_equal(d, [[5.0], [5.0]])


def test_cosine_knn_matches_a_brute_force_ranking():
    # Random directions (no near-ties), scaled: cosine ignores the norms.
    rng = np.random.default_rng(5)
    X = rng.normal(size=(300, 24)) * rng.uniform(0.1, 10, size=(300, 1))
    Q = rng.normal(size=(40, 24))
    d, i = simjoin.knn(X, 7, query=Q, metric="cosine")
    u = X / np.linalg.norm(X, axis=1, keepdims=True)
    v = Q / np.linalg.norm(Q, axis=1, keepdims=True)
    full = 1.0 - v @ u.T
    want = np.argsort(full, axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(i, want)
    np.testing.assert_allclose(d, np.take_along_axis(full, want, axis=1), rtol=0, atol=1e-12)
    # Self-kNN leaves each row out.
    d, i = simjoin.knn(X, 3, metric="cosine")
    assert not (i == np.arange(300)[:, None]).any()
