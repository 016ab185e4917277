"""Python bindings: exact agreement with scipy's cKDTree, every output form, A join B, tiny
inputs, no-copy input, errors with the engine's message. (The documentation's examples are
run by test_docs.py.)"""
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse
from scipy.spatial import cKDTree

import simjoin

P_OF = {"euclidean": 2, "manhattan": 1, "chebyshev": np.inf}


def kdtree_pairs(X, eps, metric):
    pairs = cKDTree(X).query_pairs(eps, p=P_OF[metric], output_type="ndarray")
    return np.array(sorted(map(tuple, pairs)), dtype=np.int64).reshape(-1, 2)


@pytest.mark.parametrize("metric", ["euclidean", "manhattan", "chebyshev"])
@pytest.mark.parametrize("dim", [1, 2, 3, 8])
def test_self_join_agrees_with_ckdtree(metric, dim):
    rng = np.random.default_rng(dim)
    X = rng.random((1500, dim))
    # About a thousand pairs under each metric: the balls' volumes differ.
    eps = {1: 0.001, 2: 0.02, 3: 0.06, 8: 0.35}[dim]
    eps *= {"euclidean": 1.0, "manhattan": np.sqrt(dim), "chebyshev": 0.5}[metric]
    want = kdtree_pairs(X, eps, metric)
    assert len(want) > 50
    got = simjoin.self_join(X, eps, metric=metric, backend="cpu")
    assert got.dtype == np.uint32 and got.shape == (len(want), 2)
    np.testing.assert_array_equal(got.astype(np.int64), want)
    assert simjoin.self_join(X, eps, metric=metric, output="count") == len(want)


def test_clustered_and_duplicate_points():
    rng = np.random.default_rng(7)
    centres = rng.random((10, 3))
    X = centres[rng.integers(0, 10, 2000)] + 0.01 * rng.standard_normal((2000, 3))
    X[-100:] = X[:100]  # exact duplicates (distance 0)
    want = kdtree_pairs(X, 0.01, "euclidean")
    np.testing.assert_array_equal(simjoin.self_join(X, 0.01).astype(np.int64), want)


def test_boundary_points_exactly_eps_apart():
    # A lattice with spacing eps (exact in binary): 4-neighbours are exactly eps apart.
    g = np.arange(20) * 0.25
    X = np.array([(x, y) for y in g for x in g])
    pairs = simjoin.self_join(X, 0.25)
    assert len(pairs) == 2 * 20 * 19
    np.testing.assert_array_equal(pairs.astype(np.int64), kdtree_pairs(X, 0.25, "euclidean"))
    X32 = X.astype(np.float32)
    assert len(simjoin.self_join(X32, 0.25)) == 2 * 20 * 19


def test_float32_uses_float32_arithmetic():
    rng = np.random.default_rng(3)
    X = rng.random((800, 2)).astype(np.float32)
    eps = 0.03
    # The engine's rule in 2-D: (d0*d0 + d1*d1) <= eps32*eps32, all in float32.
    d = X[:, None, :] - X[None, :, :]
    d2 = d[..., 0] * d[..., 0] + d[..., 1] * d[..., 1]
    thr = np.float32(eps) * np.float32(eps)
    i, j = np.nonzero(np.triu(d2 <= thr, k=1))
    want = np.stack([i, j], axis=1)
    np.testing.assert_array_equal(simjoin.self_join(X, eps).astype(np.int64), want)


def test_csr_is_the_symmetric_neighbour_table():
    rng = np.random.default_rng(1)
    X = rng.random((600, 2))
    pairs = simjoin.self_join(X, 0.05)
    csr = simjoin.self_join(X, 0.05, output="csr")
    assert isinstance(csr, scipy.sparse.csr_matrix) and csr.shape == (600, 600)
    dense = np.zeros((600, 600), dtype=bool)
    dense[pairs[:, 0], pairs[:, 1]] = True
    dense[pairs[:, 1], pairs[:, 0]] = True
    np.testing.assert_array_equal(csr.toarray(), dense)


def test_join_agrees_with_ckdtree():
    rng = np.random.default_rng(2)
    A, B = rng.random((700, 3)), rng.random((500, 3))
    eps = 0.08
    lists = cKDTree(A).query_ball_tree(cKDTree(B), eps)
    want = np.array(sorted((i, j) for i, js in enumerate(lists) for j in js), dtype=np.int64)
    got = simjoin.join(A, B, eps)
    np.testing.assert_array_equal(got.astype(np.int64), want)
    csr = simjoin.join(A, B, eps, output="csr")
    assert csr.shape == (700, 500) and csr.nnz == len(want)
    assert simjoin.join(A, B, eps, output="count") == len(want)
    # Mixed precisions are joined in float64.
    np.testing.assert_array_equal(simjoin.join(A, B.astype(np.float32), eps).shape[1], 2)


@pytest.mark.parametrize("n", [0, 1, 2])
def test_tiny_inputs(n):
    X = np.array([[0.0, 0.0], [0.5, 0.0]])[:n]
    pairs = simjoin.self_join(X, 0.5)
    assert pairs.shape == (max(n - 1, 0), 2)
    assert simjoin.self_join(X, 0.5, output="count") == max(n - 1, 0)
    assert simjoin.self_join(X, 0.5, output="csr").shape == (n, n)


def test_no_copy_for_c_contiguous_float_arrays():
    X = np.zeros((10, 3), dtype=np.float32)
    assert simjoin._as_points(X, "X") is X
    X64 = np.zeros((10, 3))
    assert simjoin._as_points(X64, "X") is X64
    F = np.asfortranarray(X64)
    assert simjoin._as_points(F, "X") is not F  # converted, and the answer is the same
    ints = np.arange(6).reshape(3, 2)
    assert simjoin._as_points(ints, "X").dtype == np.float64
    np.testing.assert_array_equal(simjoin.self_join(F, 0.1), simjoin.self_join(X64, 0.1))


def test_errors_carry_the_engine_message():
    X = np.random.default_rng(0).random((10, 2))
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(simjoin.InvalidArgumentError, match="not finite"):
        simjoin.self_join(bad, 0.1)
    bad[3, 1] = np.inf
    with pytest.raises(ValueError, match="not finite"):
        simjoin.self_join(bad, 0.1)
    for eps in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(simjoin.InvalidArgumentError, match="eps must be a finite number > 0"):
            simjoin.self_join(X, eps)
    with pytest.raises(simjoin.InvalidArgumentError, match="at least one dimension"):
        simjoin.self_join(np.zeros((5, 0)), 0.1)
    with pytest.raises(simjoin.InvalidArgumentError, match="2 dimensions but B has 3"):
        simjoin.join(X, np.zeros((4, 3)), 0.1)
    with pytest.raises(simjoin.InvalidArgumentError, match="2-D array"):
        simjoin.self_join(np.zeros(5), 0.1)
    with pytest.raises(simjoin.InvalidArgumentError, match="unknown metric 'hamming'"):
        simjoin.self_join(X, 0.1, metric="hamming")
    with pytest.raises(simjoin.InvalidArgumentError, match="unknown output"):
        simjoin.self_join(X, 0.1, output="dict")
    # eps whose square overflows or underflows the data's precision: an error, not every
    # pair (the squared distances would overflow or underflow with it).
    huge = np.array([[0.0], [1e200], [3e200]])
    with pytest.raises(simjoin.InvalidArgumentError, match="eps squared is infinite in f64"):
        simjoin.self_join(huge, 2e200)
    with pytest.raises(simjoin.InvalidArgumentError, match="eps squared is zero in f64"):
        simjoin.self_join(np.array([[0.0], [1e-300], [3e-300]]), 1e-300)
    with pytest.raises(simjoin.InvalidArgumentError, match="eps squared is infinite in f32"):
        simjoin.self_join(np.array([[0.0], [1e19]], dtype=np.float32), 2e19)
    with pytest.raises(simjoin.InvalidArgumentError, match="out of range"):
        simjoin.dbscan(huge, 2e200)
    with pytest.raises(simjoin.InvalidArgumentError, match="overflows"):
        simjoin.knn(huge, 1)
    # Not real numbers: complex (its imaginary part would be dropped), strings, objects
    # that are not numbers.
    for bad in (X.astype(complex), X.astype(str), np.array([[1.0, 2j]], dtype=object)):
        with pytest.raises(simjoin.InvalidArgumentError, match="real numbers"):
            simjoin.self_join(bad, 0.1)
    with pytest.raises(simjoin.InvalidArgumentError, match="real numbers"):
        simjoin.knn(X.astype(complex), 1)
    # An algorithm the chosen backend does not have: a status error, not a crash.
    with pytest.raises(simjoin.Error) as info:
        simjoin.self_join(X, 0.1, backend="cpu", algorithm="lss")
    assert info.value.status != 0 and str(info.value)


def test_threads_share_the_engine():
    rng = np.random.default_rng(5)
    X = rng.random((1000, 2))
    want = simjoin.self_join(X, 0.03)
    results = [None] * 4

    def work(k):
        results[k] = simjoin.self_join(X, 0.03)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_array_equal(r, want)


def test_version_is_the_crate_version():
    cargo = Path(__file__).resolve().parents[3] / "Cargo.toml"
    if not cargo.exists():
        pytest.skip("not run from a source checkout")
    version = re.search(r'^version\s*=\s*"([^"]+)"', cargo.read_text(), re.MULTILINE).group(1)
    assert simjoin.__version__ == version


def test_pairs_are_handed_over_without_a_copy():
    """The pair array views the engine's buffer (kept alive by the array, freed with it)."""
    import gc

    X = np.random.default_rng(4).random((3000, 2))
    pairs = simjoin.self_join(X, 0.03)
    assert pairs.base is not None and not pairs.flags.owndata
    view = pairs[::2]
    del pairs
    gc.collect()
    again = simjoin.self_join(X, 0.03)
    np.testing.assert_array_equal(view, again[::2])


def test_unaligned_input_is_accepted():
    """An unaligned float64 array (as unpickled buffers can be) is copied, not refused."""
    X = np.random.default_rng(6).random((500, 3))
    raw = np.zeros(X.nbytes + 1, dtype=np.uint8)
    unaligned = np.frombuffer(raw.data, dtype=np.float64, count=X.size, offset=1).reshape(X.shape)
    unaligned[...] = X
    assert not unaligned.flags.aligned
    np.testing.assert_array_equal(simjoin.self_join(unaligned, 0.1), simjoin.self_join(X, 0.1))
    d, i = simjoin.knn(unaligned, 3)
    np.testing.assert_array_equal(i, simjoin.knn(X, 3)[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("metric,p", [("euclidean", 2), ("manhattan", 1), ("chebyshev", np.inf)])
def test_distances_with_pairs_and_csr(dtype, metric, p):
    from scipy.spatial import cKDTree

    X = np.random.default_rng(8).random((1500, 3)).astype(dtype)
    eps = 0.08
    pairs, dist = simjoin.self_join(X, eps, metric=metric, return_distance=True)
    assert dist.dtype == dtype and dist.shape == (len(pairs),)
    assert np.array_equal(pairs, simjoin.self_join(X, eps, metric=metric))
    diff = (X[pairs[:, 0]] - X[pairs[:, 1]]).astype(np.float64)
    want = np.linalg.norm(diff, ord=p, axis=1)
    np.testing.assert_allclose(dist, want, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert (dist <= dtype(eps) * (1 + 1e-6)).all()
    # CSR of distances, like cKDTree.sparse_distance_matrix (both directions).
    g = simjoin.self_join(X, eps, metric=metric, output="csr", return_distance=True)
    ref = cKDTree(X.astype(np.float64)).sparse_distance_matrix(cKDTree(X.astype(np.float64)), eps, p=p).tocsr()
    ref.setdiag(0)
    ref.eliminate_zeros()
    assert g.shape == ref.shape and g.dtype == dtype
    # The same entries as the boolean table, exactly; the values equal cKDTree's in float64.
    conn = simjoin.self_join(X, eps, metric=metric, output="csr")
    np.testing.assert_array_equal(g.indptr, conn.indptr)
    np.testing.assert_array_equal(g.indices, conn.indices)
    if dtype == np.float64:
        assert g.nnz == ref.nnz
        np.testing.assert_allclose(g.toarray(), ref.toarray(), rtol=1e-12)
    # A join B with distances.
    ab, d_ab = simjoin.join(X[:700], X[700:], eps, metric=metric, return_distance=True)
    want = np.linalg.norm((X[:700][ab[:, 0]] - X[700:][ab[:, 1]]).astype(np.float64), ord=p, axis=1)
    np.testing.assert_allclose(d_ab, want, rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_distances_of_duplicates_are_explicit_zeros():
    X = np.array([[0.0, 0.0], [0.0, 0.0], [0.5, 0.0]])
    g = simjoin.self_join(X, 0.6, output="csr", return_distance=True)
    assert g.nnz == 6
    assert g[0, 1] == 0.0 and g.has_canonical_format
    np.testing.assert_array_equal(g.data[g.indptr[0]:g.indptr[1]], [0.0, 0.5])


def test_cosine_agrees_with_scikit_learn_and_refuses_zero_rows():
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(11)
    centres = rng.normal(size=(8, 64))
    X = centres[rng.integers(0, 8, 1500)] + 0.3 * rng.normal(size=(1500, 64))
    X *= rng.uniform(0.1, 10.0, size=(1500, 1))  # cosine ignores norms
    eps = 0.05
    graph = NearestNeighbors(radius=eps, metric="cosine", algorithm="brute").fit(X).radius_neighbors_graph(X)
    graph.setdiag(0)
    graph.eliminate_zeros()
    want = np.array(sorted((i, j) for i, j in zip(*graph.nonzero()) if i < j)).reshape(-1, 2)
    assert len(want) > 1000
    for backend in ("cpu", "auto"):
        got, dist = simjoin.self_join(X, eps, metric="cosine", backend=backend, return_distance=True)
        np.testing.assert_array_equal(got.astype(np.int64), want)
        expect = 1.0 - np.einsum("ij,ij->i", X[got[:, 0]], X[got[:, 1]]) / (
            np.linalg.norm(X[got[:, 0]], axis=1) * np.linalg.norm(X[got[:, 1]], axis=1)
        )
        np.testing.assert_allclose(dist, expect, atol=1e-12)
    X32 = X.astype(np.float32)
    assert simjoin.self_join(X32, eps, metric="cosine", output="count") == len(
        simjoin.self_join(X32, eps, metric="cosine")
    )
    labels = simjoin.dbscan(X, eps, 5, metric="cosine")
    from sklearn.cluster import DBSCAN

    ref = DBSCAN(eps=eps, min_samples=5, metric="cosine").fit(X)
    core = np.zeros(len(X), dtype=bool)
    core[ref.core_sample_indices_] = True
    np.testing.assert_array_equal(labels < 0, ref.labels_ < 0)
    # The same clusters of core samples (numbered differently: ours by first row).
    assert len(set(zip(labels[core], ref.labels_[core]))) == len(set(ref.labels_[core])) > 1
    X[3] = 0.0
    with pytest.raises(simjoin.InvalidArgumentError, match="row 3 is a zero vector"):
        simjoin.self_join(X, eps, metric="cosine")
