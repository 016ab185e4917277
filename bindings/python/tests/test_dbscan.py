"""simjoin.dbscan / simjoin.DBSCAN against scikit-learn's DBSCAN: the same core samples, the
same clusters of core samples (up to numbering), the same noise, every border point in a
cluster with a core sample within eps (and in scikit-learn's cluster whenever only one
cluster is within reach), on clustered, uniform and duplicate-heavy data, 1-D to 64-D,
every metric; the estimator interface; the GPU backend (lavapipe when that is the Vulkan
device) giving the CPU's labels exactly; bad input."""
import pickle

import numpy as np
import pytest

import simjoin

sklearn_cluster = pytest.importorskip("sklearn.cluster")

METRICS = ["euclidean", "manhattan", "chebyshev"]


def pairwise_acc(X, metric):
    """Accumulated distances (squared for Euclidean) in X's precision, canonical order."""
    dt = X.dtype
    diff = (X[:, None, :] - X[None, :, :]).astype(dt)
    acc = np.zeros((len(X), len(X)), dtype=dt)
    for d in range(X.shape[1]):
        t = diff[:, :, d]
        if metric == "euclidean":
            acc = (acc + t * t).astype(dt)
        elif metric == "manhattan":
            acc = (acc + np.abs(t)).astype(dt)
        else:
            acc = np.maximum(acc, np.abs(t))
    return acc


def threshold(eps, metric, dt):
    e = dt.type(eps)
    return e * e if metric == "euclidean" else e


def make_data(kind, n, dim, seed):
    rng = np.random.default_rng(seed)
    if kind == "clustered":
        centers = rng.uniform(0, 1, size=(5, dim))
        X = centers[rng.integers(0, 5, n)] + rng.normal(0, 0.03, size=(n, dim))
        # some background noise
        X[: n // 10] = rng.uniform(-0.2, 1.2, size=(n // 10, dim))
    elif kind == "uniform":
        X = rng.uniform(0, 1, size=(n, dim))
    else:  # duplicate-heavy: 30 distinct points repeated, plus a few loners
        base = rng.uniform(0, 1, size=(30, dim))
        X = base[rng.integers(0, 30, n)]
        X[: n // 20] = rng.uniform(0, 1, size=(n // 20, dim))
    return np.ascontiguousarray(X)


def eps_for(kind, X, metric):
    """An eps between distances (never one of them): the 60th percentile of the distance to
    the 5th nearest neighbour, so that some points are core samples and some are not."""
    if kind == "duplicates":
        return 0.05
    from scipy.spatial.distance import cdist

    d = cdist(X, X, {"manhattan": "cityblock"}.get(metric, metric))
    kth = np.sort(d, axis=1)[:, min(5, len(X) - 1)]
    return float(np.quantile(kth, 0.6)) * (1 + 1e-6)


def check_against_sklearn(X, eps, min_samples, metric, labels, core, sample_weight=None):
    ref = sklearn_cluster.DBSCAN(eps=eps, min_samples=min_samples, metric=metric).fit(X, sample_weight=sample_weight)
    ref_labels = ref.labels_
    ref_core = np.zeros(len(X), dtype=bool)
    ref_core[ref.core_sample_indices_] = True
    # Same core samples and the same noise.
    np.testing.assert_array_equal(core, ref_core, err_msg="core samples differ")
    np.testing.assert_array_equal(labels < 0, ref_labels < 0, err_msg="noise differs")
    # The same partition of the core samples: a bijection between the numberings.
    ours, theirs = labels[core], ref_labels[core]
    pairs = set(zip(ours.tolist(), theirs.tolist()))
    assert len(pairs) == len(set(ours.tolist())) == len(set(theirs.tolist())), "core partitions differ"
    mapping = dict(pairs)
    # Clusters numbered 0, 1, ... in the order of their first row.
    seen = labels[labels >= 0]
    if len(seen):
        first = np.unique(seen, return_index=True)[1]
        np.testing.assert_array_equal(seen[np.sort(first)], np.arange(len(first)))
    # Border points: in a cluster with a core sample within eps; in scikit-learn's cluster
    # when only one cluster's core samples are within reach.
    border = np.flatnonzero((labels >= 0) & ~core)
    if len(border):
        acc = pairwise_acc(X, metric)
        thr = threshold(eps, metric, X.dtype)
        for p in border:
            near_cores = np.flatnonzero(core & (acc[p] <= thr))
            assert labels[p] in set(labels[near_cores].tolist()), f"border {p} not next to its cluster"
            if len(set(labels[near_cores].tolist())) == 1:
                assert mapping[labels[p]] == ref_labels[p], f"border {p} in another cluster"
            # The nearest core sample's cluster (ties: smaller index).
            best = near_cores[np.lexsort((near_cores, acc[p, near_cores]))[0]]
            assert labels[p] == labels[best]
    return ref


CASES = [
    (kind, dim, metric)
    for kind in ["clustered", "uniform", "duplicates"]
    for dim in [1, 2, 3, 8, 16, 64]
    for metric in METRICS
]


@pytest.mark.parametrize("kind,dim,metric", CASES)
def test_matches_sklearn(kind, dim, metric):
    n = 600 if dim <= 16 else 300
    X = make_data(kind, n, dim, seed=dim * 7 + len(kind))
    eps = eps_for(kind, X, metric)
    for min_samples in (1, 3, 5, 10):
        est = simjoin.DBSCAN(eps=eps, min_samples=min_samples, metric=metric, backend="cpu").fit(X)
        core = np.zeros(n, dtype=bool)
        core[est.core_sample_indices_] = True
        check_against_sklearn(X, eps, min_samples, metric, est.labels_, core)
        np.testing.assert_array_equal(
            simjoin.dbscan(X, eps, min_samples, metric=metric, backend="cpu"), est.labels_
        )


@pytest.mark.parametrize("metric", METRICS)
def test_float32_matches_sklearn(metric):
    X = make_data("clustered", 800, 2, seed=3).astype(np.float32)
    eps = eps_for("clustered", X.astype(np.float64), metric)
    est = simjoin.DBSCAN(eps=eps, min_samples=4, metric=metric).fit(X)
    assert est.components_.dtype == np.float32
    core = np.zeros(len(X), dtype=bool)
    core[est.core_sample_indices_] = True
    check_against_sklearn(X, eps, 4, metric, est.labels_, core)


def test_estimator_interface():
    X = make_data("clustered", 500, 3, seed=11)
    est = simjoin.DBSCAN(eps=0.05, min_samples=4)
    assert est.get_params() == {
        "eps": 0.05, "min_samples": 4, "metric": "euclidean", "algorithm": "auto", "backend": "auto"
    }
    assert est.fit(X) is est
    assert est.labels_.dtype == np.int64 and est.labels_.shape == (500,)
    assert est.core_sample_indices_.dtype == np.int64
    assert np.all(np.diff(est.core_sample_indices_) > 0)
    np.testing.assert_array_equal(est.components_, X[est.core_sample_indices_])
    assert est.n_features_in_ == 3
    assert est.report_["clusters"] == est.labels_.max() + 1
    assert est.report_["noise"] == int((est.labels_ == -1).sum())
    assert est.report_["core_points"] == len(est.core_sample_indices_)
    np.testing.assert_array_equal(est.fit_predict(X), est.labels_)
    assert est.set_params(min_samples=50) is est and est.min_samples == 50
    assert est.fit(X).labels_.max() < 5
    # scikit-learn's machinery: clone, repr, pickling, its metric aliases.
    from sklearn.base import ClusterMixin, clone

    assert isinstance(est, ClusterMixin)
    c = clone(est)
    assert c.get_params() == est.get_params() and not hasattr(c, "labels_")
    assert "DBSCAN" in repr(est)
    back = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(back.labels_, est.labels_)
    for alias, name in [("l2", "euclidean"), ("l1", "manhattan"), ("cityblock", "manhattan"), ("infinity", "chebyshev")]:
        np.testing.assert_array_equal(simjoin.dbscan(X, 0.05, 4, metric=alias), simjoin.dbscan(X, 0.05, 4, metric=name))
    # Every join algorithm (and scikit-learn's tree names) gives the same labels.
    for algorithm in ("grid", "ego", "brute", "kd_tree", "ball_tree"):
        np.testing.assert_array_equal(
            simjoin.DBSCAN(eps=0.05, min_samples=4, algorithm=algorithm, backend="cpu").fit_predict(X),
            simjoin.dbscan(X, 0.05, 4),
        )
    with pytest.raises(simjoin.InvalidArgumentError, match="algorithm"):
        simjoin.dbscan(X, 0.05, 4, algorithm="kdtree")
    # Lists work as inputs.
    assert simjoin.dbscan([[0.0], [0.1], [5.0]], 0.5, 2).tolist() == [0, 0, -1]


def test_import_does_not_need_sklearn():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['sklearn'] = None\n"
        "import simjoin, numpy as np\n"
        "assert 'sklearn.base' not in sys.modules or sys.modules['sklearn.base'] is None\n"
        "est = simjoin.DBSCAN(eps=0.5, min_samples=2)\n"
        "assert est.fit_predict(np.array([[0.0], [0.2], [9.0]])).tolist() == [0, 0, -1]\n"
        "assert est.get_params()['eps'] == 0.5 and est.set_params(eps=1.0).eps == 1.0\n"
        "assert list(est.core_sample_indices_) == [0, 1]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
    # Without the estimator asked for, `import simjoin` does not import scikit-learn.
    code = "import sys, simjoin; simjoin.dbscan([[0.0]], 1.0, 1); assert 'sklearn' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_tiny_inputs():
    for backend in ("cpu", "auto"):
        assert simjoin.dbscan(np.empty((0, 2)), 1.0, 5, backend=backend).shape == (0,)
        assert simjoin.dbscan(np.zeros((1, 2)), 1.0, 1, backend=backend).tolist() == [0]
        assert simjoin.dbscan(np.zeros((1, 2)), 1.0, 2, backend=backend).tolist() == [-1]
        two = np.array([[0.0, 0.0], [0.5, 0.0]])
        assert simjoin.dbscan(two, 1.0, 2, backend=backend).tolist() == [0, 0]
        assert simjoin.dbscan(two, 0.4, 1, backend=backend).tolist() == [0, 1]
        assert simjoin.dbscan(two, 0.4, 2, backend=backend).tolist() == [-1, -1]
    est = simjoin.DBSCAN().fit(np.empty((0, 3)))
    assert est.labels_.shape == (0,) and est.components_.shape == (0, 3)


def test_bad_input():
    X = np.random.default_rng(0).uniform(size=(20, 2))
    for eps in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(simjoin.InvalidArgumentError, match="eps"):
            simjoin.dbscan(X, eps, 5)
    for m in (0, -1, 2.5, True, None):
        with pytest.raises(simjoin.InvalidArgumentError, match="min_samples"):
            simjoin.dbscan(X, 0.1, m)
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(simjoin.InvalidArgumentError, match="not finite"):
        simjoin.dbscan(bad, 0.1, 5)
    with pytest.raises(simjoin.InvalidArgumentError, match="metric"):
        simjoin.dbscan(X, 0.1, 5, metric="hamming")
    with pytest.raises(simjoin.InvalidArgumentError, match="backend"):
        simjoin.dbscan(X, 0.1, 5, backend="tpu")
    with pytest.raises(simjoin.InvalidArgumentError):
        simjoin.dbscan(X[0], 0.1, 5)  # 1-D input
    with pytest.raises(simjoin.InvalidArgumentError, match="eps"):
        simjoin.DBSCAN(eps=-0.5).fit(X)
    for w in (np.ones(19), np.ones((20, 1)), np.r_[np.ones(19), np.nan], np.r_[np.ones(19), 1e300], ["a"] * 20):
        with pytest.raises(simjoin.InvalidArgumentError, match="sample_weight"):
            simjoin.DBSCAN().fit(X, sample_weight=w)
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError too
        simjoin.DBSCAN(min_samples=0).fit(X)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("weights", ["integers", "dyadic", "with_negatives"])
def test_sample_weight_matches_sklearn(metric, weights):
    """scikit-learn's sample_weight: core when the weights within eps sum to min_samples.
    Integer and dyadic weights sum exactly in both, so the answers must agree; zero and
    negative weights (which keep neighbours from being core) and a weight that makes a
    lone point core by itself included."""
    rng = np.random.default_rng(len(metric) * 3 + len(weights))
    n, dim = 500, 2
    X = make_data("clustered", n, dim, seed=5)
    eps = eps_for("clustered", X, metric)
    if weights == "integers":
        w = rng.integers(0, 4, n).astype(float)
    elif weights == "dyadic":
        w = rng.choice([0.25, 0.5, 1.0, 1.5, 2.75], n)
    else:
        w = rng.integers(-2, 4, n).astype(float)
    w[0] = 20.0  # core by itself whatever its neighbours
    for min_samples in (1, 3, 6, 15):
        for backend in ("cpu",) + (("gpu",) if gpu_available() else ()):
            est = simjoin.DBSCAN(eps=eps, min_samples=min_samples, metric=metric, backend=backend)
            est.fit(X, sample_weight=w)
            core = np.zeros(n, dtype=bool)
            core[est.core_sample_indices_] = True
            assert core[0]
            check_against_sklearn(X, eps, min_samples, metric, est.labels_, core, sample_weight=w)
            np.testing.assert_array_equal(
                simjoin.dbscan(X, eps, min_samples, metric=metric, backend=backend, sample_weight=w), est.labels_
            )
    # Unit weights are the unweighted clustering; the sums are exact and order-free: ten
    # points of weight 0.1 within eps reach min_samples = 1 (NumPy's sum: 0.9999999999999999).
    np.testing.assert_array_equal(simjoin.dbscan(X, eps, 5, sample_weight=np.ones(n)), simjoin.dbscan(X, eps, 5))
    ten = np.zeros((10, 1))
    assert (simjoin.dbscan(ten, 0.5, 1, sample_weight=np.full(10, 0.1)) == 0).all()


def gpu_available():
    try:
        simjoin.self_join(np.zeros((2, 1)), 1.0, backend="gpu")
        return True
    except simjoin.Error:
        return False


def gpu_or_skip():
    try:
        simjoin.dbscan(np.zeros((2, 1), dtype=np.float32), 1.0, 1, backend="gpu")
    except simjoin.Error as e:
        if e.status == 3:  # SIMJOIN_NO_DEVICE
            pytest.skip(f"no Vulkan device: {e}")
        raise


@pytest.mark.parametrize("kind", ["clustered", "uniform", "duplicates"])
@pytest.mark.parametrize("dim", [1, 2, 3, 16, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_equals_cpu(kind, dim, dtype):
    gpu_or_skip()
    n = 300 if dim <= 16 else 150
    X = make_data(kind, n, dim, seed=dim + 100).astype(dtype)
    for metric in METRICS:
        eps = eps_for(kind, X, metric)
        for min_samples in (2, 6):
            cpu = simjoin.DBSCAN(eps=eps, min_samples=min_samples, metric=metric, backend="cpu").fit(X)
            gpu = simjoin.DBSCAN(eps=eps, min_samples=min_samples, metric=metric, backend="gpu").fit(X)
            assert gpu.report_["backend"] == "vulkan"
            np.testing.assert_array_equal(gpu.labels_, cpu.labels_)
            np.testing.assert_array_equal(gpu.core_sample_indices_, cpu.core_sample_indices_)
            if dtype == np.float64:
                core = np.zeros(n, dtype=bool)
                core[gpu.core_sample_indices_] = True
                check_against_sklearn(X, eps, min_samples, metric, gpu.labels_, core)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_neighbour_counts(metric, dtype):
    """simjoin.neighbour_counts: each row's rows within eps, itself included, as the
    brute-force accumulators give them (scikit-learn's DBSCAN counts the same), on the CPU
    and on the GPU (counted on the device) when there is one; a lattice with distances of
    exactly eps; bad input."""
    X = make_data("clustered", 400, 3, 11).astype(dtype)
    lattice = np.array([[i * 0.5, j * 0.5] for i in range(8) for j in range(8)], dtype=dtype)
    for data, eps in [(X, 0.05), (lattice, 0.5)]:
        want = (pairwise_acc(data, metric) <= threshold(eps, metric, np.dtype(dtype))).sum(axis=1)
        got = simjoin.neighbour_counts(data, eps, metric=metric, backend="cpu")
        assert got.dtype == np.uint32 and len(got) == len(data)
        np.testing.assert_array_equal(got, want)
        try:
            gpu = simjoin.neighbour_counts(data, eps, metric=metric, backend="gpu")
        except simjoin.Error as e:
            if e.status != 3:  # SIMJOIN_NO_DEVICE: no Vulkan device here
                raise
            continue
        np.testing.assert_array_equal(gpu, want)
    assert simjoin.neighbour_counts(np.zeros((0, 2)), 0.1).shape == (0,)
    with pytest.raises(ValueError):
        simjoin.neighbour_counts(X, 0.0)
    with pytest.raises(ValueError):
        simjoin.neighbour_counts(np.array([[0.0, np.nan]]), 0.1)
