"""metric="haversine" against scikit-learn's haversine BallTree and DBSCAN: simjoin's
joins and kNN take (latitude, longitude) in degrees and metres; simjoin.DBSCAN and
simjoin.dbscan take scikit-learn's convention (radians, eps in radians). The answers must
equal scikit-learn's except at pairs whose distance is within rounding of eps (counted)."""
import numpy as np
import pytest

import simjoin

sklearn = pytest.importorskip("sklearn")
from sklearn.cluster import DBSCAN as SkDBSCAN  # noqa: E402
from sklearn.neighbors import BallTree  # noqa: E402

R = 6371008.8


def gps(n, seed=0):
    """Clustered positions around hard places: the antimeridian, the north pole, London."""
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 179.999], [89.99, 0.0], [51.48, 0.0], [-33.86, 151.2]])
    c = centres[rng.integers(0, len(centres), n)]
    lat = np.clip(c[:, 0] + rng.normal(0, 0.01, n), -90, 90)
    lon = (c[:, 1] + rng.normal(0, 0.01, n) / np.maximum(np.cos(np.radians(lat)), 0.01) + 180) % 360 - 180
    x = np.column_stack([lat, lon])
    x[::9] = x[1::9][: len(x[::9])]  # duplicates
    return x


def sk_pairs(x, eps):
    """scikit-learn's unique pairs (i < j) within eps metres and every pair's distance."""
    tree = BallTree(np.radians(x), metric="haversine")
    ind, dist = tree.query_radius(np.radians(x), r=eps / R, return_distance=True)
    pairs = {(i, int(j)) for i, js in enumerate(ind) for j in js if i < j}
    return pairs


def near_eps(x, pairs, eps, tol):
    """The pairs whose haversine distance is within tol metres of eps."""
    from sklearn.metrics.pairwise import haversine_distances

    r = np.radians(x)
    out = set()
    for i, j in pairs:
        d = haversine_distances(r[[i]], r[[j]])[0, 0] * R
        if abs(d - eps) <= tol:
            out.add((i, j))
    return out


@pytest.mark.parametrize("eps", [5.0, 300.0, 2000.0])
def test_self_join_matches_balltree(eps):
    x = gps(3000)
    got, dist = simjoin.self_join(x, eps, metric="haversine", backend="cpu", return_distance=True)
    mine = {(int(i), int(j)) for i, j in got}
    theirs = sk_pairs(x, eps)
    differ = mine ^ theirs
    # Disagreements only at the boundary: within 1e-14 eps + 5 nm of eps.
    assert differ == near_eps(x, differ, eps, 1e-14 * eps + 5e-9)
    assert len(differ) <= 2
    assert len(mine) > len(x) // 9
    # Distances in metres agree with scikit-learn's haversine.
    from sklearn.metrics.pairwise import haversine_distances

    r = np.radians(x)
    d = np.array([haversine_distances(r[[i]], r[[j]])[0, 0] * R for i, j in got[:500]])
    np.testing.assert_allclose(dist[:500], d, rtol=1e-9, atol=1e-6)
    assert (dist <= eps * (1 + 1e-12)).all()


def test_join_one_side_at_the_pole_and_counts():
    a = gps(2000, seed=1)
    b = np.column_stack([90 - np.abs(np.random.default_rng(2).normal(0, 0.01, 500)),
                         np.random.default_rng(3).uniform(-180, 180, 500)])
    b[0] = [90.0, 0.0]
    eps = 1500.0
    got = simjoin.join(a, b, eps, metric="haversine", backend="cpu")
    tree = BallTree(np.radians(b), metric="haversine")
    ind = tree.query_radius(np.radians(a), r=eps / R)
    theirs = {(i, int(j)) for i, js in enumerate(ind) for j in js}
    mine = {(int(i), int(j)) for i, j in got}
    assert mine == theirs and len(mine) > 100
    assert simjoin.self_join(a, eps, metric="haversine", output="count") == len(
        simjoin.self_join(a, eps, metric="haversine"))


def test_knn_matches_balltree():
    x = gps(2000, seed=4)
    q = gps(300, seed=5)
    d, idx = simjoin.knn(x, 8, query=q, metric="haversine", backend="cpu")
    tree = BallTree(np.radians(x), metric="haversine")
    sd, sidx = tree.query(np.radians(q), k=8)
    np.testing.assert_allclose(d, sd * R, rtol=1e-9, atol=1e-6)
    # The same neighbours, except that (near-)ties (duplicates) may come in either order:
    # per row, the neighbours clearly nearer than the k-th are the same set.
    for r in range(len(q)):
        kth = sd[r, -1] * R
        mine = {int(j) for j, dj in zip(idx[r], d[r]) if dj < kth - 1e-6}
        theirs = {int(j) for j, dj in zip(sidx[r], sd[r] * R) if dj < kth - 1e-6}
        assert mine == theirs, r
    assert (idx == sidx).mean() > 0.8
    # Equal distances by smaller index (the engine's order).
    for r in range(len(q)):
        for c in range(7):
            if d[r, c] == d[r, c + 1]:
                assert idx[r, c] < idx[r, c + 1]


def test_dbscan_takes_sklearns_convention():
    x = gps(3000, seed=6)
    rad = np.radians(x)
    eps = 400.0 / R
    theirs = SkDBSCAN(eps=eps, min_samples=5, metric="haversine", algorithm="ball_tree").fit(rad)
    mine = simjoin.DBSCAN(eps=eps, min_samples=5, metric="haversine").fit(rad)
    np.testing.assert_array_equal(mine.core_sample_indices_, theirs.core_sample_indices_)
    np.testing.assert_array_equal(mine.labels_ < 0, theirs.labels_ < 0)
    # The same clusters of core samples, up to numbering.
    core = theirs.core_sample_indices_
    mapping = {}
    for a, b in zip(mine.labels_[core], theirs.labels_[core]):
        assert mapping.setdefault(a, b) == b
    assert len(set(mapping.values())) == len(mapping) >= 3
    np.testing.assert_array_equal(mine.components_, rad[core])
    labels = simjoin.dbscan(rad, eps, 5, metric="haversine")
    np.testing.assert_array_equal(labels, mine.labels_)


def test_bad_input_is_refused():
    with pytest.raises(simjoin.InvalidArgumentError, match="latitude 91"):
        simjoin.self_join(np.array([[0.0, 0.0], [91.0, 0.0]]), 10.0, metric="haversine")
    with pytest.raises(simjoin.InvalidArgumentError, match="2 columns"):
        simjoin.self_join(np.zeros((3, 3)), 10.0, metric="haversine")
    with pytest.raises(simjoin.InvalidArgumentError, match="2 columns"):
        simjoin.DBSCAN(eps=0.1, metric="haversine").fit(np.zeros((3, 3)))
    with pytest.raises(simjoin.InvalidArgumentError, match="latitude"):
        # Radians past pi/2: a latitude past 90 degrees.
        simjoin.dbscan(np.array([[1.6, 0.0], [0.0, 0.0]]), 0.1, 2, metric="haversine")


@pytest.mark.parametrize("radius, eps", [(1737400.0, 900.0), (1.0, 3e-4)])
def test_sphere_radius(radius, eps):
    """sphere_radius sets the sphere: the Moon's, and the unit sphere (eps and distances in
    radians, scikit-learn's haversine units), against BallTree's haversine on that sphere."""
    x = gps(2500, seed=8)
    q = gps(200, seed=9)
    got, dist = simjoin.self_join(x, eps, metric="haversine", backend="cpu", return_distance=True,
                                  sphere_radius=radius)
    tree = BallTree(np.radians(x), metric="haversine")
    ind = tree.query_radius(np.radians(x), r=eps / radius)
    theirs = {(i, int(j)) for i, js in enumerate(ind) for j in js if i < j}
    mine = {(int(i), int(j)) for i, j in got}
    assert len(mine) > len(x) // 9
    # Only pairs within rounding of eps may differ (as on the Earth's sphere).
    differ = mine ^ theirs
    assert len(differ) <= 2
    assert differ == near_eps(x, differ, eps * R / radius, 1e-13 * eps * R / radius + 5e-9)
    # Distances on that sphere: the Earth's scaled by radius / R.
    _, on_earth = simjoin.self_join(x, eps * R / radius, metric="haversine", backend="cpu",
                                    return_distance=True)
    common = min(len(dist), len(on_earth))
    assert common > 0
    earth = dict(zip(map(tuple, simjoin.self_join(x, eps * R / radius, metric="haversine",
                                                    backend="cpu").tolist()), on_earth))
    for (i, j), d in zip(got.tolist(), dist):
        if (i, j) in earth:
            assert d == pytest.approx(earth[(i, j)] * radius / R, rel=1e-12, abs=1e-300)
    assert dist.max() <= eps
    # A x B, counts and kNN take it too.
    ab = simjoin.join(q, x, eps, metric="haversine", sphere_radius=radius)
    ind = tree.query_radius(np.radians(q), r=eps / radius)
    assert abs(len(ab) - sum(len(i) for i in ind)) <= 2
    counts = simjoin.neighbour_counts(x, eps, metric="haversine", sphere_radius=radius)
    assert int(counts.sum()) == len(x) + 2 * len(mine)
    d, idx = simjoin.knn(x, 4, query=q, metric="haversine", sphere_radius=radius)
    sd, _ = tree.query(np.radians(q), k=4)
    np.testing.assert_allclose(d, sd * radius, rtol=1e-9, atol=1e-12 * radius)
    # The CSR and Arrow forms carry it as well.
    csr = simjoin.self_join(x, eps, metric="haversine", output="csr", return_distance=True,
                            sphere_radius=radius)
    assert csr.nnz == 2 * len(mine) and csr.data.max() <= eps
    pytest.importorskip("pyarrow")
    table = simjoin.self_join(x, eps, metric="haversine", output="arrow", return_distance=True,
                              sphere_radius=radius)
    assert table.num_rows == len(mine) and max(table.column("distance").to_pylist()) <= eps


def test_sphere_radius_is_checked():
    x = np.array([[0.0, 0.0], [0.0, 1.0]])
    for bad in [0, -1.0, float("nan"), float("inf"), "big", True]:
        with pytest.raises(simjoin.InvalidArgumentError, match="sphere_radius"):
            simjoin.self_join(x, 10.0, metric="haversine", sphere_radius=bad)
        with pytest.raises(simjoin.InvalidArgumentError, match="sphere_radius"):
            simjoin.knn(x, 1, metric="haversine", sphere_radius=bad)
    with pytest.raises(simjoin.InvalidArgumentError, match="haversine only"):
        simjoin.self_join(x, 10.0, sphere_radius=1.0)
