"""Results as Arrow: a pyarrow.Table / RecordBatchReader made while the join runs, read by
DuckDB and Polars directly; the same pair set (and distances) as the NumPy path."""
import gc

import numpy as np
import pytest

import simjoin

pa = pytest.importorskip("pyarrow")


def pair_set(i, j):
    return set(zip(np.asarray(i).tolist(), np.asarray(j).tolist()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_table_matches_numpy_pairs(dtype):
    X = np.random.default_rng(1).random((5000, 3)).astype(dtype)
    want, wd = simjoin.self_join(X, 0.05, return_distance=True)
    t = simjoin.self_join(X, 0.05, output="arrow", return_distance=True)
    assert t.column_names == ["i", "j", "distance"]
    assert t.schema.field("i").type == pa.uint32()
    assert t.schema.field("distance").type == (pa.float32() if dtype == np.float32 else pa.float64())
    assert t.num_rows == len(want)
    assert pair_set(t["i"], t["j"]) == pair_set(want[:, 0], want[:, 1])
    # Distances travel with their pairs.
    order = np.lexsort((t["j"].to_numpy(), t["i"].to_numpy()))
    np.testing.assert_array_equal(t["distance"].to_numpy()[order], wd)
    ab = simjoin.join(X[:2000], X[2000:], 0.05, output="arrow")
    want = simjoin.join(X[:2000], X[2000:], 0.05)
    assert ab.column_names == ["i", "j"]
    assert pair_set(ab["i"], ab["j"]) == pair_set(want[:, 0], want[:, 1])


def test_stream_in_batches_and_early_release():
    X = np.random.default_rng(2).random((300_000, 2))
    count = simjoin.self_join(X, 0.004, output="count")
    reader = simjoin.self_join(X, 0.004, output="arrow_stream")
    assert isinstance(reader, pa.RecordBatchReader)
    rows = sum(b.num_rows for b in reader)
    assert rows == count
    # A consumer that stops after one batch: the join is stopped, nothing leaks or hangs.
    reader = simjoin.self_join(X, 0.004, output="arrow_stream")
    first = reader.read_next_batch()
    assert first.num_rows > 0
    del reader, first
    gc.collect()
    # Errors of the join come out of the call (bad input) or the stream.
    with pytest.raises(simjoin.InvalidArgumentError):
        simjoin.self_join(X, -1.0, output="arrow")
    # An eps the precision cannot compare, and mismatched sets: the call's own error too,
    # not an error from the stream's first batch.
    huge = np.array([[0.0], [1e200], [3e200]])
    for output in ("arrow", "arrow_stream"):
        with pytest.raises(simjoin.InvalidArgumentError, match="out of range"):
            simjoin.self_join(huge, 2e200, output=output)
        with pytest.raises(simjoin.InvalidArgumentError, match="dimensions"):
            simjoin.join(X, np.zeros((3, 3)), 0.1, output=output)


def test_duckdb_and_polars_read_it():
    duckdb = pytest.importorskip("duckdb")
    pl = pytest.importorskip("polars")
    X = np.random.default_rng(3).random((20_000, 3))
    want = simjoin.self_join(X, 0.03)
    pairs_tbl = simjoin.self_join(X, 0.03, output="arrow")
    n, top = duckdb.sql("select count(*), max(j) from pairs_tbl").fetchall()[0]
    assert n == len(want) and top == want[:, 1].max()
    stream = simjoin.self_join(X, 0.03, output="arrow_stream")
    assert duckdb.sql("select count(*) from stream").fetchall()[0][0] == len(want)
    df = pl.from_arrow(simjoin.self_join(X, 0.03, output="arrow", return_distance=True))
    assert df.height == len(want) and df["distance"].max() <= 0.03
