"""float16 input (issue 40): passed to the engine as it is (SIMJOIN_DTYPE_F16), widened
there exactly to float32 and computed in float32, so every answer equals the same call on
x.astype(float32): joins (pairs, counts, distances, Arrow), A-to-B with mixed types, kNN,
cosine and DBSCAN; NaN and infinities refused as for any input."""
import numpy as np
import pytest

import simjoin


def data(n=2000, d=6, seed=3):
    rng = np.random.default_rng(seed)
    # Clustered, with exact duplicates: float16's coarse grid makes boundary pairs common.
    x = (rng.normal(size=(n, d)) * 0.3 + rng.integers(0, 4, size=(n, 1))).astype(np.float16)
    x[::17] = x[1::17][: len(x[::17])]
    return x


def test_joins_equal_the_float32_call():
    x = data()
    x32 = x.astype(np.float32)
    for eps in (0.05, 0.25):
        p16 = simjoin.self_join(x, eps, backend="cpu")
        p32 = simjoin.self_join(x32, eps, backend="cpu")
        np.testing.assert_array_equal(p16, p32)
        assert len(p16) > 0
        assert simjoin.self_join(x, eps, output="count", backend="cpu") == len(p32)
        (q16, d16), (q32, d32) = (
            simjoin.self_join(x, eps, return_distance=True, backend="cpu"),
            simjoin.self_join(x32, eps, return_distance=True, backend="cpu"),
        )
        np.testing.assert_array_equal(q16, q32)
        assert d16.dtype == np.float32
        np.testing.assert_array_equal(d16, d32)
    # A-to-B, float16 with float16 and float16 with float32 (joined in float32).
    a, b = x[:700], x[700:]
    want = simjoin.join(a.astype(np.float32), b.astype(np.float32), 0.25, backend="cpu")
    np.testing.assert_array_equal(simjoin.join(a, b, 0.25, backend="cpu"), want)
    np.testing.assert_array_equal(simjoin.join(a, b.astype(np.float32), 0.25, backend="cpu"), want)


def test_arrow_stream_of_float16():
    pytest.importorskip("pyarrow")
    x = data(1500)
    t = simjoin.self_join(x, 0.25, output="arrow_stream", backend="cpu").read_all()
    got = np.stack([t.column("i").to_numpy(), t.column("j").to_numpy()], axis=1)
    got = got[np.lexsort((got[:, 1], got[:, 0]))]
    np.testing.assert_array_equal(got, simjoin.self_join(x.astype(np.float32), 0.25, backend="cpu"))


def test_knn_cosine_and_dbscan():
    x = data(1200, 16)
    x32 = x.astype(np.float32)
    d16, i16 = simjoin.knn(x, 5, backend="cpu")
    d32, i32 = simjoin.knn(x32, 5, backend="cpu")
    assert d16.dtype == np.float32
    np.testing.assert_array_equal(i16, i32)
    np.testing.assert_array_equal(d16, d32)
    np.testing.assert_array_equal(
        simjoin.self_join(x, 0.01, metric="cosine", backend="cpu"),
        simjoin.self_join(x32, 0.01, metric="cosine", backend="cpu"),
    )
    np.testing.assert_array_equal(
        simjoin.dbscan(x, 0.3, 5, backend="cpu"), simjoin.dbscan(x32, 0.3, 5, backend="cpu")
    )


def test_non_finite_float16_refused():
    x = data(50)
    for bad in (np.nan, np.inf):
        y = x.copy()
        y[3, 2] = bad
        with pytest.raises(simjoin.InvalidArgumentError):
            simjoin.self_join(y, 0.1)
