"""simjoin.dask on a real distributed cluster of processes: exact set equality with the
single-machine join (uniform, clustered, duplicate-heavy, 2-D to 24-D data, every metric:
cosine on clustered embeddings, haversine across the antimeridian and the poles,
both join forms, one and many partitions), no duplicate pairs, a worker killed mid-join,
empty chunks and leaves, eps wider than a leaf, distances, skew splitting, Parquet output,
errors, and the module's import without Dask."""
import os
import pickle
import subprocess
import sys
import zlib

import numpy as np
import pytest

dask = pytest.importorskip("dask")
pytest.importorskip("dask.dataframe")
pytest.importorskip("distributed")
pytest.importorskip("pandas")

import dask.array as da  # noqa: E402
import dask.dataframe as dd  # noqa: E402
import pandas as pd  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import simjoin  # noqa: E402
import simjoin.dask as sjd  # noqa: E402

METRICS = ["euclidean", "manhattan", "chebyshev"]


@pytest.fixture(scope="module")
def client():
    with LocalCluster(
        processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None, silence_logs=40
    ) as cluster, Client(cluster) as c:
        yield c


def pair_array(frame):
    """(m, 2) int64 pairs of a computed result, sorted lexicographically."""
    p = frame[["i", "j"]].to_numpy(dtype=np.int64)
    return p[np.lexsort((p[:, 1], p[:, 0]))]


def assert_same_pairs(result, want):
    """The Dask result holds exactly the pairs of `want` (a simjoin (m, 2) uint32 array),
    each once: same length and, sorted, the same rows."""
    got = pair_array(result)
    want = np.asarray(want, dtype=np.int64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)


def dataset(kind, rng):
    if kind == "uniform-2d":
        return rng.random((3000, 2)), 0.02
    if kind == "clustered-3d":  # 80% in five tight clusters, the rest uniform
        X = rng.random((3000, 3))
        centres = rng.random((5, 3))
        m = 2400
        X[:m] = centres[rng.integers(0, 5, m)] + 0.004 * rng.standard_normal((m, 3))
        return X, 0.006
    if kind == "duplicates-8d":  # 60 distinct points, each 25 times, plus noise points
        X = np.concatenate([np.repeat(rng.random((60, 8)), 25, axis=0), rng.random((500, 8))])
        return X[rng.permutation(len(X))], 0.2
    if kind == "uniform-16d":
        return rng.random((1500, 16)), 0.75
    raise ValueError(kind)


METRIC_SCALE = {"euclidean": 1.0, "manhattan": 1.6, "chebyshev": 0.5}


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("kind", ["uniform-2d", "clustered-3d", "duplicates-8d", "uniform-16d"])
def test_exact_against_single_machine(client, kind, metric):
    rng = np.random.default_rng(zlib.crc32(f"{kind}/{metric}".encode()))
    X, eps = dataset(kind, rng)
    eps *= METRIC_SCALE[metric] * (np.sqrt(X.shape[1]) / 2 if metric == "manhattan" and X.shape[1] > 3 else 1)
    want = simjoin.self_join(X, eps, metric=metric)
    assert len(want) > 100, len(want)  # the data make pairs under every metric
    A, B = X[:1100], X[1100:]
    want_ab = simjoin.join(A, B, eps, metric=metric)
    assert len(want_ab) > 20
    for partitions in (1, 12):
        got = sjd.self_join(da.from_array(X, chunks=700), eps, metric=metric, backend="cpu", partitions=partitions)
        frame = got.compute()
        assert list(frame.columns) == ["i", "j"]
        assert (frame["i"] < frame["j"]).all()
        assert_same_pairs(frame, want)
        ab = sjd.join(
            da.from_array(A, chunks=400), da.from_array(B, chunks=900), eps, metric=metric, backend="cpu",
            partitions=partitions,
        )
        assert_same_pairs(ab.compute(), want_ab)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_points_exactly_eps_apart_across_cuts(client, dtype):
    """A lattice with spacing eps: cuts fall on lattice coordinates, so pairs exactly eps
    apart straddle every cut; none may be lost or doubled (float32 and float64)."""
    g = np.arange(30) * 0.25
    X = np.array([(x, y, z) for z in g[:4] for y in g for x in g], dtype=dtype)
    for metric in METRICS:
        want = simjoin.self_join(X, 0.25, metric=metric)
        got = sjd.self_join(da.from_array(X, chunks=1500), 0.25, metric=metric, partitions=16, backend="cpu")
        assert_same_pairs(got.compute(), want)
    A, B = X[::2], X[1::2]
    got = sjd.join(da.from_array(A, chunks=1000), da.from_array(B, chunks=700), 0.25, partitions=16, backend="cpu")
    assert_same_pairs(got.compute(), simjoin.join(A, B, 0.25))


def test_every_pair_once_per_task_and_tasks_disjoint(client):
    """The ownership rule: the per-task results are disjoint and their union is exact, also
    with leaves split into blocks (duplicate-heavy data)."""
    rng = np.random.default_rng(11)
    X = np.concatenate([np.repeat(rng.random((4, 3)), 300, axis=0), rng.random((800, 3))])
    eps = 0.05
    plan = sjd.plan(da.from_array(X, chunks=500), eps, partitions=6)
    assert plan.stats["split_leaves"] >= 1 and plan.n_tasks > plan.n_leaves
    result = sjd.self_join(da.from_array(X, chunks=500), eps, plan=plan, backend="cpu")
    parts = [p.compute() for p in result.partitions]
    assert len(parts) == plan.n_tasks
    seen = set()
    for p in parts:
        keys = set(zip(p["i"].tolist(), p["j"].tolist()))
        assert len(keys) == len(p)  # no duplicate inside a task
        assert not (keys & seen)  # nor across tasks
        seen |= keys
    assert_same_pairs(pd.concat(parts), simjoin.self_join(X, eps))


def test_dataframe_input_float32_and_columns(client):
    rng = np.random.default_rng(3)
    X = rng.random((2500, 3)).astype(np.float32)
    pdf = pd.DataFrame({"x": X[:, 0], "label": np.arange(2500), "y": X[:, 1], "z": X[:, 2]})
    ddf = dd.from_pandas(pdf, npartitions=5)
    eps = 0.03
    got = sjd.self_join(ddf, eps, columns=["x", "y", "z"], backend="cpu", partitions=4, return_distance=True)
    frame = got.compute()
    assert frame["distance"].dtype == np.float32
    assert_same_pairs(frame, simjoin.self_join(X, eps))
    # A join of a dataframe with an array, float32 x float64 -> float64.
    B = rng.random((700, 3))
    ab = sjd.join(ddf, da.from_array(B, chunks=300), eps, columns=["x", "y", "z"], backend="cpu",
                  return_distance=True).compute()
    assert ab["distance"].dtype == np.float64
    assert_same_pairs(ab, simjoin.join(X, B, eps))
    # Plans made first and passed back (self-join and join).
    cols = ["x", "y", "z"]
    p = sjd.plan(ddf, eps, columns=cols, partitions=3)
    assert p.mode == "self" and p.dims == 3
    assert_same_pairs(sjd.self_join(ddf, eps, columns=cols, plan=p, backend="cpu").compute(),
                      simjoin.self_join(X, eps))
    pj = sjd.plan(ddf, eps, points_b=da.from_array(B, chunks=300), columns=cols, partitions=3)
    assert pj.mode == "join"
    got = sjd.join(ddf, da.from_array(B, chunks=300), eps, columns=cols, plan=pj, backend="cpu").compute()
    assert_same_pairs(got, simjoin.join(X, B, eps))
    with pytest.raises(simjoin.InvalidArgumentError, match="plan"):
        sjd.self_join(ddf, eps, columns=cols, plan=pj)


@pytest.mark.parametrize("metric", METRICS)
def test_return_distance_matches_numpy(client, metric):
    rng = np.random.default_rng(5)
    X = rng.random((2000, 4))
    eps = {"euclidean": 0.1, "manhattan": 0.15, "chebyshev": 0.06}[metric]
    frame = sjd.self_join(da.from_array(X, chunks=600), eps, metric=metric, return_distance=True,
                          partitions=5, backend="cpu").compute()
    assert len(frame) > 100 and frame["distance"].dtype == np.float64
    d = X[frame["i"].to_numpy()] - X[frame["j"].to_numpy()]
    want = {
        "euclidean": np.sqrt((d * d).sum(axis=1)),
        "manhattan": np.abs(d).sum(axis=1),
        "chebyshev": np.abs(d).max(axis=1),
    }[metric]
    np.testing.assert_allclose(frame["distance"].to_numpy(), want, rtol=1e-12, atol=0)
    assert (frame["distance"] <= eps * (1 + 1e-12)).all()


def test_empty_chunks_empty_leaves_and_empty_input(client):
    rng = np.random.default_rng(8)
    X = rng.random((1200, 2))
    eps = 0.04
    want = simjoin.self_join(X, eps)
    # Zero-row chunks in the input.
    dx = da.from_array(X, chunks=((0, 500, 0, 700, 0), (2,)))
    assert_same_pairs(sjd.self_join(dx, eps, partitions=6, backend="cpu").compute(), want)
    # A plan made on other data (all in one corner) leaves most leaves empty here.
    corner = rng.random((1200, 2)) * 0.1
    plan = sjd.plan(da.from_array(corner, chunks=400), eps, partitions=10)
    parts = sjd.self_join(dx, eps, plan=plan, backend="cpu")
    sizes = parts.map_partitions(len).compute()
    assert (sizes == 0).sum() >= 1
    assert_same_pairs(parts.compute(), want)
    # Nothing at all.
    empty = sjd.self_join(da.zeros((0, 3), chunks=1), 0.1, backend="cpu").compute()
    assert len(empty) == 0 and list(empty.columns) == ["i", "j"]
    ab = sjd.join(da.zeros((0, 2), chunks=1), dx, eps, backend="cpu").compute()
    assert len(ab) == 0


def test_eps_wider_than_a_leaf(client):
    rng = np.random.default_rng(9)
    X = rng.random((1500, 2))
    eps = 0.3
    plan = sjd.plan(da.from_array(X, chunks=500), eps, partitions=40)
    lo, hi = plan.boxes()
    width = hi - lo
    assert plan.n_leaves >= 32
    # Some leaf is narrower than eps in both dimensions, so its halo spans several leaves.
    assert np.any(np.all(width < eps, axis=1))
    got = sjd.self_join(da.from_array(X, chunks=500), eps, plan=plan, backend="cpu").compute()
    assert_same_pairs(got, simjoin.self_join(X, eps))
    A, B = X[:600], X[600:]
    got = sjd.join(da.from_array(A, chunks=200), da.from_array(B, chunks=450), eps, partitions=40,
                   backend="cpu", metric="chebyshev").compute()
    assert_same_pairs(got, simjoin.join(A, B, eps, metric="chebyshev"))


def test_skew_is_split_and_balanced(client):
    """Clustered data: cutting where the pairs are (the default cost model) balances the
    pairs per task far better than cutting on point counts alone; and a leaf that no cut can
    split (2000 copies of one point: 2 million pairs) is split into blocks."""
    rng = np.random.default_rng(12)
    n = 8000
    X = rng.random((n, 3))
    X[:3000] = 0.5 + 0.002 * rng.standard_normal((3000, 3))  # a cluster narrower than eps
    eps = 0.01
    dx = da.from_array(X, chunks=2000)
    plan = sjd.plan(dx, eps, partitions=8)
    naive = sjd.plan(dx, eps, partitions=8, pair_cost=0.0, max_skew=1e9)
    assert plan.stats["max_mean_pairs"] < 2.0 < 2 * plan.stats["max_mean_pairs"] < naive.stats["max_mean_pairs"]
    sizes = sjd.self_join(dx, eps, plan=plan, backend="cpu").map_partitions(len).compute().to_numpy()
    naive_sizes = sjd.self_join(dx, eps, plan=naive, backend="cpu").map_partitions(len).compute().to_numpy()
    assert sizes.sum() == naive_sizes.sum() == simjoin.self_join(X, eps, output="count")
    assert sizes.max() / sizes.mean() < 2.0 < naive_sizes.max() / naive_sizes.mean()

    D = X.copy()
    D[:2000] = 0.25  # exact duplicates: no cut separates them
    dd_ = da.from_array(D, chunks=2000)
    plan = sjd.plan(dd_, eps, partitions=8)
    s = plan.stats
    assert s["split_leaves"] >= 1 and s["tasks"] > s["leaves"]
    assert len(s["task_pairs"]) == s["tasks"] == plan.n_tasks
    assert s["max_mean_pairs"] < 3.0
    unsplit = sjd.plan(dd_, eps, partitions=8, max_skew=1e9)
    assert unsplit.stats["split_leaves"] == 0 and unsplit.stats["max_mean_pairs"] > 5.0
    result = sjd.self_join(dd_, eps, plan=plan, backend="cpu")
    sizes = result.map_partitions(len).compute().to_numpy()
    assert len(sizes) == plan.n_tasks and sizes.max() / sizes.mean() < 3.0
    assert_same_pairs(result.compute(), simjoin.self_join(D, eps))


def test_parquet_output(client, tmp_path):
    rng = np.random.default_rng(13)
    X = rng.random((3000, 3))
    eps = 0.05
    out = tmp_path / "pairs"
    sjd.self_join(da.from_array(X, chunks=1000), eps, partitions=4, backend="cpu",
                  return_distance=True).to_parquet(str(out))
    back = pd.read_parquet(out)
    assert set(back.columns) >= {"i", "j", "distance"}
    assert_same_pairs(back, simjoin.self_join(X, eps))


def test_worker_killed_during_the_join(client, tmp_path):
    """A join task kills its own worker process the first time it runs (a marker file makes
    it happen once); distributed recomputes the lost tasks elsewhere and the result is
    still exact."""
    rng = np.random.default_rng(14)
    X = rng.random((4000, 3))
    eps = 0.04
    marker = str(tmp_path / "killed")
    client.run(sjd._testing_fault_once, marker)
    try:
        result = sjd.self_join(da.from_array(X, chunks=1000), eps, partitions=6, backend="cpu")
        frame = client.compute(result, retries=2).result(timeout=120)
        assert os.path.exists(marker)  # a worker really died
        assert_same_pairs(frame, simjoin.self_join(X, eps))
    finally:
        client.run(sjd._testing_fault_once, None)
        client.wait_for_workers(2, timeout=60)


def test_nothing_unpicklable_and_one_engine_per_worker(client):
    rng = np.random.default_rng(15)
    X = rng.random((2000, 2))
    result = sjd.self_join(da.from_array(X, chunks=500), 0.03, partitions=4, backend="cpu")
    import cloudpickle

    cloudpickle.dumps(dict(result.__dask_graph__()))  # ctypes pointers would fail here
    pickle.dumps(sjd.plan(da.from_array(X, chunks=500), 0.03))
    result.compute()
    engines = client.run(lambda: sorted(map(str, __import__("simjoin")._Engine.handles)))
    assert all(len(keys) <= 1 for keys in engines.values()), engines


def embeddings(rng, n, d, clusters=6):
    """Clustered directions (cosine), with near-duplicates and antipodal pairs."""
    centres = rng.standard_normal((clusters, d))
    X = centres[rng.integers(0, clusters, n)] + 0.15 * rng.standard_normal((n, d))
    X[1::17] = X[0::17][: len(X[1::17])] * 3.0  # the same direction, longer
    X[2::19] = -X[0::19][: len(X[2::19])]  # opposite directions
    return X


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cosine_exact_against_single_machine(client, dtype):
    rng = np.random.default_rng(40)
    X = embeddings(rng, 3000, 24).astype(dtype)
    Y = embeddings(rng, 1500, 24).astype(dtype)
    for eps in (0.02, 0.3, 1.5):
        want = simjoin.self_join(X, eps, metric="cosine")
        got = sjd.self_join(da.from_array(X, chunks=700), eps, metric="cosine", partitions=12).compute()
        assert_same_pairs(got, want)
        want_ab = simjoin.join(X, Y, eps, metric="cosine")
        got_ab = sjd.join(da.from_array(X, chunks=900), da.from_array(Y, chunks=400), eps, metric="cosine",
                          partitions=9).compute()
        assert_same_pairs(got_ab, want_ab)
    # Distances: the engine's, pair for pair.
    pairs, dist = simjoin.self_join(X, 0.3, metric="cosine", return_distance=True)
    got = sjd.self_join(da.from_array(X, chunks=700), 0.3, metric="cosine", partitions=12,
                        return_distance=True).compute()
    got = got.sort_values(["i", "j"])
    np.testing.assert_array_equal(got[["i", "j"]].to_numpy(), pairs.astype(np.int64))
    np.testing.assert_array_equal(got["distance"].to_numpy(), dist)
    # A plan cuts the unit vectors: many leaves, not one.
    plan = sjd.plan(da.from_array(X, chunks=700), 0.3, metric="cosine", partitions=12)
    assert plan.n_leaves >= 8 and plan.boxes()[0].shape == (plan.n_leaves, 24)


def test_haversine_exact_across_the_antimeridian_and_the_poles(client):
    rng = np.random.default_rng(41)
    parts = [
        np.column_stack([rng.uniform(-60, 60, 1500), rng.uniform(-180, 180, 1500)]),
        # Around the antimeridian, as -180 and 180 too.
        np.column_stack([rng.uniform(-5, 5, 600), rng.choice([-1, 1], 600) * rng.uniform(179.0, 180.0, 600)]),
        np.array([[0.0, -180.0], [0.0, 180.0], [10.0, 180.0], [10.0, -180.0]]),
        # At and near both poles, any longitude.
        np.column_stack([rng.choice([-1, 1], 600) * rng.uniform(89.0, 90.0, 600), rng.uniform(-180, 180, 600)]),
        np.array([[90.0, 0.0], [90.0, 77.0], [-90.0, -10.0], [-90.0, 180.0]]),
    ]
    X = np.concatenate(parts)
    Y = np.column_stack([rng.uniform(85, 90, 400), rng.uniform(-180, 180, 400)])  # one side near a pole
    for eps in (50_000.0, 400_000.0, 2.0e7):
        want = simjoin.self_join(X, eps, metric="haversine")
        got = sjd.self_join(da.from_array(X, chunks=800), eps, metric="haversine", partitions=10).compute()
        assert_same_pairs(got, want)
        want_ab = simjoin.join(X, Y, eps, metric="haversine")
        got_ab = sjd.join(da.from_array(X, chunks=800), da.from_array(Y, chunks=150), eps,
                          metric="haversine", partitions=8).compute()
        assert_same_pairs(got_ab, want_ab)
    pairs, dist = simjoin.self_join(X, 400_000.0, metric="haversine", return_distance=True)
    got = sjd.self_join(da.from_array(X, chunks=800), 400_000.0, metric="haversine", partitions=10,
                        return_distance=True).compute().sort_values(["i", "j"])
    np.testing.assert_array_equal(got[["i", "j"]].to_numpy(), pairs.astype(np.int64))
    np.testing.assert_array_equal(got["distance"].to_numpy(), dist)


def test_haversine_on_another_sphere(client):
    """sphere_radius as simjoin's: eps and distances in metres on that sphere (radians on
    the unit sphere); the halo follows it (a wrong one would lose pairs across leaves)."""
    rng = np.random.default_rng(43)
    X = np.column_stack([rng.uniform(-80, 80, 3000), rng.uniform(-180, 180, 3000)])
    Y = np.column_stack([rng.uniform(-80, 80, 500), rng.uniform(-180, 180, 500)])
    for radius, eps in ((1.0, 0.02), (1_737_400.0, 40_000.0)):  # radians; the Moon, metres
        want = simjoin.self_join(X, eps, metric="haversine", sphere_radius=radius)
        assert len(want) > 100
        got = sjd.self_join(da.from_array(X, chunks=700), eps, metric="haversine", partitions=12,
                            sphere_radius=radius).compute()
        assert_same_pairs(got, want)
        want_ab = simjoin.join(X, Y, eps, metric="haversine", sphere_radius=radius)
        got_ab = sjd.join(da.from_array(X, chunks=700), da.from_array(Y, chunks=200), eps, metric="haversine",
                          partitions=8, sphere_radius=radius).compute()
        assert_same_pairs(got_ab, want_ab)
        pairs, dist = simjoin.self_join(X, eps, metric="haversine", sphere_radius=radius, return_distance=True)
        got = sjd.self_join(da.from_array(X, chunks=700), eps, metric="haversine", partitions=12,
                            sphere_radius=radius, return_distance=True).compute().sort_values(["i", "j"])
        np.testing.assert_array_equal(got[["i", "j"]].to_numpy(), pairs.astype(np.int64))
        np.testing.assert_array_equal(got["distance"].to_numpy(), dist)
    p = sjd.plan(da.from_array(X, chunks=700), 0.02, metric="haversine", sphere_radius=1.0, partitions=6)
    with pytest.raises(simjoin.InvalidArgumentError, match="sphere_radius"):
        sjd.self_join(da.from_array(X, chunks=700), 0.02, metric="haversine", plan=p)
    with pytest.raises(simjoin.InvalidArgumentError, match="sphere_radius"):
        sjd.self_join(da.from_array(X, chunks=700), 0.02, metric="haversine", sphere_radius=-1.0)


def test_errors(client):
    X = np.random.default_rng(0).random((100, 2))
    bad = X.copy()
    bad[7, 1] = np.nan
    with pytest.raises(simjoin.InvalidArgumentError, match="not finite"):
        sjd.self_join(da.from_array(bad, chunks=50), 0.1)
    for eps in (0.0, -1.0, float("nan")):
        with pytest.raises(simjoin.InvalidArgumentError, match="eps"):
            sjd.self_join(da.from_array(X, chunks=50), eps)
    with pytest.raises(simjoin.InvalidArgumentError, match="unknown metric"):
        sjd.self_join(da.from_array(X, chunks=50), 0.1, metric="hamming")
    with pytest.raises(simjoin.InvalidArgumentError, match="2 columns"):
        sjd.self_join(da.from_array(np.zeros((10, 3)), chunks=5), 100.0, metric="haversine")
    lat_bad = np.array([[10.0, 20.0]] * 50 + [[95.0, 0.0]] * 50)
    with pytest.raises(simjoin.InvalidArgumentError, match="latitude"):
        sjd.self_join(da.from_array(lat_bad, chunks=25), 100.0, metric="haversine").compute()
    with pytest.raises(simjoin.InvalidArgumentError, match="dimensions"):
        sjd.join(da.from_array(X, chunks=50), da.zeros((10, 3), chunks=5), 0.1)
    with pytest.raises(simjoin.InvalidArgumentError, match="column"):
        sjd.self_join(dd.from_pandas(pd.DataFrame({"x": [0.0]}), npartitions=1), 0.1, columns=["y"])
    with pytest.raises(simjoin.InvalidArgumentError, match="real numbers"):
        sjd.self_join(da.from_array(X.astype(complex), chunks=50), 0.1)
    with pytest.raises(simjoin.InvalidArgumentError, match="out of range"):
        sjd.self_join(da.from_array(X * 1e200, chunks=50), 1e200)


def test_import_simjoin_without_dask():
    code = (
        "import sys; sys.modules['dask'] = None\n"
        "import numpy as np, simjoin\n"
        "assert len(simjoin.self_join(np.array([[0.0], [0.1]]), 0.2)) == 1\n"
        "try:\n    import simjoin.dask\nexcept ImportError as e:\n    print('ImportError:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert "ImportError: simjoin.dask needs Dask" in out.stdout
