"""simjoin: similarity (eps-distance) joins on a Vulkan GPU or the CPU.

    >>> import numpy as np, simjoin
    >>> X = np.array([[0.0, 0.0], [0.5, 0.0], [3.0, 3.0]])
    >>> simjoin.self_join(X, 0.5)
    array([[0, 1]], dtype=uint32)

Inputs are 2-D arrays of points (rows) by coordinates (columns). C-contiguous float16,
float32 and float64 arrays are passed to the engine without a copy (float16 is widened to
float32 inside it, exactly, and computed and answered in float32); anything else is
converted first.
Pairs come back as (m, 2) uint32 arrays, sorted lexicographically.
"""
import atexit
import ctypes
import threading

import numpy as np

from . import _control, _native
from ._control import Progress
from ._native import lib

__all__ = [
    "self_join", "join", "neighbour_counts", "knn", "dbscan", "DBSCAN", "Error", "InvalidArgumentError",
    "Progress", "__version__",
]
__version__ = lib.simjoin_version().decode()


class Error(RuntimeError):
    """A simjoin failure; `status` is the C status number, the message the engine's."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(Error, ValueError):
    """Bad input: NaN/inf coordinates, eps <= 0, zero dimensions, mismatched shapes, ..."""


def _check(status, message=None):
    """Raises the error for a failed call's status (`message`: the engine's, when the call
    ran on another thread; else this thread's last)."""
    if status != _native.OK:
        if message is None:
            message = _control.last_error()
        cls = InvalidArgumentError if status == _native.INVALID_ARGUMENT else Error
        raise cls(status, message)


def _checked_run(call, opts, progress):
    """Runs the engine call `call` stoppable and watched (see _control.run), raising its error."""
    _check(*_control.run(call, opts, progress))


def _as_points(X, name, dtype=None):
    """The array the engine will read: X itself when already C-contiguous float32/float64
    (no copy), otherwise a converted copy."""
    arr = np.asarray(X)
    if arr.ndim != 2:
        raise InvalidArgumentError(
            _native.INVALID_ARGUMENT, f"{name} must be a 2-D array (points x dimensions), got shape {arr.shape}"
        )
    # Real numbers only: a complex array would lose its imaginary parts, strings and dates
    # are no coordinates. Objects (e.g. Decimal) go through NumPy's float conversion.
    if arr.dtype.kind not in "biufO":
        raise InvalidArgumentError(
            _native.INVALID_ARGUMENT, f"{name} must hold real numbers, got dtype {arr.dtype}"
        )
    if dtype is None:
        # float16 goes to the engine as it is (widened to float32 there, no copy here).
        dtype = arr.dtype if arr.dtype in _FLOATS else np.float64
    # C order and aligned (arrays from pickles or buffers may be unaligned): a copy only then.
    try:
        return np.require(arr, dtype=dtype, requirements=["C", "A"])
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(
            _native.INVALID_ARGUMENT, f"{name} could not be read as real numbers: {e}"
        ) from None


_FLOATS = (np.float16, np.float32, np.float64)


def _matrix(arr):
    dtype = {np.dtype(np.float16): _native.DTYPE_F16, np.dtype(np.float32): _native.DTYPE_F32}.get(
        arr.dtype, _native.DTYPE_F64
    )
    data = arr.ctypes.data if arr.size else None
    return _native.Matrix(data, arr.shape[0], arr.shape[1], dtype)


def _lookup(table, what, value):
    try:
        return table[value.lower()]
    except (KeyError, AttributeError):
        raise InvalidArgumentError(
            _native.INVALID_ARGUMENT, f"unknown {what} {value!r} (expected one of: {', '.join(table)})"
        ) from None


def _options(eps, metric, backend, algorithm, output, sorted, return_distance=False, sphere_radius=None):
    opts = _native.Options()
    _check(lib.simjoin_options_init_sized(ctypes.byref(opts), ctypes.sizeof(opts)))
    opts.eps = float(eps)
    opts.metric = _lookup(_native.METRICS, "metric", metric)
    opts.backend = _lookup(_native.BACKENDS, "backend", backend)
    opts.algorithm = _lookup(_native.ALGORITHMS, "algorithm", algorithm)
    opts.output = _lookup(_native.OUTPUTS, "output", output)
    opts.sorted = 1 if sorted else 0
    opts.distances = 1 if return_distance else 0
    opts.sphere_radius = _sphere_radius(sphere_radius)
    return opts


def _sphere_radius(value):
    """A sphere_radius argument as the C options take it (0: the Earth's mean radius)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidArgumentError(_native.INVALID_ARGUMENT, f"sphere_radius must be a number of metres (got {value!r})")
    value = float(value)
    if value == 0.0:
        # 0 means the default in C; here it is a radius, and no radius.
        raise InvalidArgumentError(_native.INVALID_ARGUMENT, "sphere_radius = 0 m: it must be a finite, positive number of metres")
    return value


class _Engine:
    """Process-wide engines (thread-safe), one per CPU thread count asked for; each owns its
    device and worker threads and is freed at interpreter exit."""

    handles = {}
    lock = threading.Lock()

    @classmethod
    def get(cls, threads=None):
        key = None if threads is None else int(threads)
        if key is not None and key < 1:
            raise InvalidArgumentError(_native.INVALID_ARGUMENT, f"threads must be >= 1 (got {threads})")
        with cls.lock:
            handle = cls.handles.get(key)
            if handle is None:
                opts = _native.EngineOptions()
                _check(lib.simjoin_engine_options_init_sized(ctypes.byref(opts), ctypes.sizeof(opts)))
                opts.threads = key or 0
                handle = ctypes.c_void_p()
                _check(lib.simjoin_engine_new_with(ctypes.byref(opts), ctypes.byref(handle)))
                cls.handles[key] = handle
                atexit.register(lib.simjoin_engine_free, handle)
            return handle


class _ResultOwner:
    """Owns a join result; NumPy arrays viewing its memory keep it alive, and the last one
    to go frees it (the engine's arrays become the user's without a copy)."""

    def __init__(self, handle):
        self.handle = handle

    def __del__(self):
        lib.simjoin_result_free(self.handle)


def _distances(owner, result, dtype_hint):
    ptr, count, dtype = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_uint32()
    _check(lib.simjoin_result_distances(result, ctypes.byref(ptr), ctypes.byref(count), ctypes.byref(dtype)))
    ftype, fctype = (np.float32, ctypes.c_float) if dtype.value == _native.DTYPE_F32 else (np.float64, ctypes.c_double)
    if count.value == 0:
        return np.empty(0, dtype=ftype)
    return _view(owner, ptr.value, fctype, count.value, ftype, (count.value,))


def _collect(result, output, shape, return_distance=False):
    """Hands a result's output over as NumPy / SciPy objects viewing the engine's arrays."""
    owner = _ResultOwner(result)
    if output == "count":
        return int(lib.simjoin_result_count(result))
    if output == "pairs":
        ptr, count = ctypes.POINTER(ctypes.c_uint32)(), ctypes.c_size_t()
        _check(lib.simjoin_result_pairs(result, ctypes.byref(ptr), ctypes.byref(count)))
        if count.value == 0:
            pairs = np.empty((0, 2), dtype=np.uint32)
        else:
            address = ctypes.cast(ptr, ctypes.c_void_p).value
            pairs = _view(owner, address, ctypes.c_uint32, 2 * count.value, np.uint32, (count.value, 2))
        if return_distance:
            return pairs, _distances(owner, result, None)
        return pairs
    import scipy.sparse

    offsets, rows = ctypes.POINTER(ctypes.c_uint64)(), ctypes.c_size_t()
    neighbors, nnz = ctypes.POINTER(ctypes.c_uint32)(), ctypes.c_size_t()
    _check(
        lib.simjoin_result_csr(
            result, ctypes.byref(offsets), ctypes.byref(rows), ctypes.byref(neighbors), ctypes.byref(nnz)
        )
    )
    # offsets are uint64 below 2^63 and neighbours uint32 below the column count: when
    # that is below 2^31 they are valid int64 / int32 arrays as they are (no copy).
    indptr = _view(owner, ctypes.cast(offsets, ctypes.c_void_p).value, ctypes.c_int64, rows.value + 1,
                   np.int64, (rows.value + 1,))
    if nnz.value == 0:
        indices = np.empty(0, dtype=np.int32)
    elif shape[1] < 2**31:
        indices = _view(owner, ctypes.cast(neighbors, ctypes.c_void_p).value, ctypes.c_int32, nnz.value,
                        np.int32, (nnz.value,))
    else:
        indices = np.ctypeslib.as_array(neighbors, shape=(nnz.value,)).astype(np.int64)
    data = _distances(owner, result, None) if return_distance else np.ones(nnz.value, dtype=bool)
    # scipy keeps arrays of index dtype as given (checked by the tests: no copy is made).
    return scipy.sparse.csr_matrix((data, indices, indptr), shape=shape, copy=False)


_ARROW_OUTPUTS = ("arrow", "arrow_stream")


class _Keep:
    """Keeps the engine's inputs alive while an Arrow stream still reads them."""

    def __init__(self, *arrays):
        self.arrays = arrays


def _arrow(output, a, b, eps, metric, backend, algorithm, return_distance, threads, sphere_radius):
    """The join as Arrow record batches (columns i, j and optionally distance), produced
    while the join runs: a pyarrow.Table (output="arrow") or a pyarrow.RecordBatchReader
    (output="arrow_stream", for results larger than memory)."""
    import pyarrow as pa

    opts = _options(eps, metric, backend, algorithm, "pairs", False, return_distance, sphere_radius)
    stream = _native.ArrowArrayStream()
    ma = _matrix(a)
    engine = _Engine.get(threads)
    if b is None:
        _check(lib.simjoin_self_join_arrow(engine, ctypes.byref(ma), ctypes.byref(opts), ctypes.addressof(stream)))
    else:
        mb = _matrix(b)
        _check(lib.simjoin_join_arrow(engine, ctypes.byref(ma), ctypes.byref(mb), ctypes.byref(opts),
                                      ctypes.addressof(stream)))
    # pyarrow moves the stream out of `stream` (it owns the release from here on).
    reader = pa.RecordBatchReader._import_from_c(ctypes.addressof(stream))
    if str(output).lower() == "arrow":
        return reader.read_all()

    # The join reads `a` and `b` until the stream is released: tie their lifetime to the
    # reader's batches by wrapping it in a generator that holds them.
    keep = _Keep(a, b)

    def batches():
        _ = keep
        yield from reader

    return pa.RecordBatchReader.from_batches(reader.schema, batches())


def self_join(X, eps, *, metric="euclidean", backend="auto", algorithm="auto", output="pairs",
              sorted=True, return_distance=False, threads=None, progress=None, sphere_radius=None):
    """All pairs of rows of X within distance `eps` (dist <= eps).

    output="pairs": unique pairs (i < j) as an (m, 2) uint32 array (sorted unless
    sorted=False); with return_distance=True, `(pairs, distances)` (the distances in X's
    float type). output="csr": the full neighbour table as an (n, n)
    scipy.sparse.csr_matrix (both directions, no diagonal), boolean, or holding the
    distances with return_distance=True (like cKDTree.sparse_distance_matrix and
    radius_neighbors_graph(mode="distance"); duplicates are explicit zeros).
    output="count": the number of pairs as an int. metric: "euclidean", "manhattan",
    "chebyshev", "cosine" (1 - cos(a, b), as SciPy defines it; a zero row raises
    InvalidArgumentError) or "haversine" (X is 2 columns, latitude and longitude in
    degrees; eps and distances in metres on a sphere of radius 6,371,008.8 m, or of
    `sphere_radius` metres (sphere_radius=1: eps and distances in radians); a latitude
    outside [-90, 90] raises InvalidArgumentError); backend: "auto", "cpu" or "gpu"; algorithm: "auto", "grid",
    "ego", "brute" or "lss". Arrays view the engine's memory (no copy).
    output="arrow": a pyarrow.Table with columns i, j (uint32) and, with return_distance,
    distance; output="arrow_stream": a pyarrow.RecordBatchReader whose batches are made
    while the join runs (unsorted; for results larger than memory). DuckDB and Polars read
    both directly.

    Raises InvalidArgumentError (a ValueError) for NaN/inf coordinates, eps <= 0, and an eps
    the data's precision cannot compare exactly (Euclidean eps*eps overflowing or below the
    normal range: float64 eps outside about [1.5e-154, 1.3e154], float32 [1.1e-19, 1.8e19]).

    Ctrl-C stops the join within milliseconds and raises KeyboardInterrupt. progress: a
    callable given a `simjoin.Progress` (stage, fraction, pairs, elapsed) about every
    0.1 s from the calling thread, or True for a progress bar on stderr; an exception it
    raises stops the join and propagates.
    """
    points = _as_points(X, "X")
    if str(output).lower() in _ARROW_OUTPUTS:
        return _arrow(output, points, None, eps, metric, backend, algorithm, return_distance, threads,
                      sphere_radius)
    opts = _options(eps, metric, backend, algorithm, output, sorted, return_distance, sphere_radius)
    m = _matrix(points)
    result = ctypes.c_void_p()
    engine = _Engine.get(threads)
    _checked_run(
        lambda: lib.simjoin_self_join(engine, ctypes.byref(m), ctypes.byref(opts), ctypes.byref(result)),
        opts,
        progress,
    )
    return _collect(result, output.lower(), (points.shape[0], points.shape[0]), return_distance)


def neighbour_counts(X, eps, *, metric="euclidean", backend="auto", algorithm="auto", threads=None,
                     progress=None, sphere_radius=None):
    """Each row's number of rows of X within distance `eps`, the row itself included (the
    count behind DBSCAN's core samples; a density score for outlier detection), as a
    uint32 array of len(X). On a GPU the counts are made on the device (no pair leaves
    it); on the CPU they are counted from the join's streamed pairs, never collected.
    metric, backend, algorithm, progress and sphere_radius as for self_join.
    """
    points = _as_points(X, "X")
    opts = _options(eps, metric, backend, algorithm, "count", False, sphere_radius=sphere_radius)
    m = _matrix(points)
    counts = np.empty(points.shape[0], dtype=np.uint32)
    engine = _Engine.get(threads)
    _checked_run(
        lambda: lib.simjoin_neighbour_counts(
            engine,
            ctypes.byref(m),
            ctypes.byref(opts),
            counts.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)) if len(counts) else None,
            None,
        ),
        opts,
        progress,
    )
    return counts


def join(A, B, eps, *, metric="euclidean", backend="auto", algorithm="auto", output="pairs",
         sorted=True, return_distance=False, threads=None, progress=None, sphere_radius=None):
    """All pairs (i, j), row i of A and row j of B, within distance `eps`.

    output="pairs": an (m, 2) uint32 array of (i, j); output="csr": an (len(A), len(B))
    scipy.sparse.csr_matrix (boolean, or distances with return_distance=True, which also
    makes output="pairs" return `(pairs, distances)`); output="count": an int. A float32
    array joined with a float64 one is joined in float64. Ctrl-C, progress and
    sphere_radius as for self_join.
    """
    a, b = np.asarray(A), np.asarray(B)
    common = None
    if a.dtype != b.dtype or a.dtype not in _FLOATS:
        common = np.result_type(a.dtype, b.dtype)
        common = common if common in _FLOATS else np.float64
    a, b = _as_points(a, "A", common), _as_points(b, "B", common)
    if str(output).lower() in _ARROW_OUTPUTS:
        return _arrow(output, a, b, eps, metric, backend, algorithm, return_distance, threads, sphere_radius)
    opts = _options(eps, metric, backend, algorithm, output, sorted, return_distance, sphere_radius)
    ma, mb = _matrix(a), _matrix(b)
    result = ctypes.c_void_p()
    engine = _Engine.get(threads)
    _checked_run(
        lambda: lib.simjoin_join(engine, ctypes.byref(ma), ctypes.byref(mb), ctypes.byref(opts), ctypes.byref(result)),
        opts,
        progress,
    )
    return _collect(result, output.lower(), (a.shape[0], b.shape[0]), return_distance)



class _KnnOwner:
    """Owns a kNN result; the NumPy arrays viewing its memory keep it alive, and the last
    one to go frees it (no copy of the answer is ever made)."""

    def __init__(self, handle):
        self.handle = handle

    def __del__(self):
        lib.simjoin_knn_result_free(self.handle)


def _view(owner, address, ctype, count, dtype, shape):
    """A NumPy array over `count` values at `address`, keeping `owner` alive."""
    buf = (ctype * count).from_address(address)
    buf._simjoin_owner = owner
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def knn(X, k, *, query=None, metric="euclidean", backend="auto", algorithm="auto", output="arrays",
        threads=None, progress=None, sphere_radius=None):
    """The exact k nearest neighbours of every row of `query` among the rows of X, or, when
    `query` is None, of every row of X among the others (a point is not its own neighbour;
    an exact duplicate of it is, at distance 0).

    Returns `(distances, indices)`, two (m, k) arrays like scikit-learn's `kneighbors`:
    row r holds query r's neighbours nearest first, equal distances by smaller index.
    `indices` are uint32 row numbers of X; `distances` have X's float type (float32 or
    float64; float16 input is computed and answered in float32). With output="graph", an (m, len(X)) `scipy.sparse.csr_matrix` of distances,
    like `kneighbors_graph(mode="distance")`. metric: "euclidean", "manhattan",
    "chebyshev", "cosine" or "haversine" (latitude and longitude in degrees, distances in
    metres on the Earth or on a sphere of `sphere_radius` metres, as for self_join); backend: "auto", "cpu" or "gpu"; algorithm: "auto", "kdtree" (CPU),
    "grid" (CPU), "lss" (GPU) or "brute". k larger than the candidates raises InvalidArgumentError.
    The arrays view the engine's memory (no copy); it is freed with the last of them.
    Ctrl-C and progress as for self_join.
    """
    output = str(output).lower()
    if output not in ("arrays", "graph"):
        raise InvalidArgumentError(
            _native.INVALID_ARGUMENT, f"unknown output {output!r} (expected 'arrays' or 'graph')"
        )
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InvalidArgumentError(_native.INVALID_ARGUMENT, f"k must be an integer >= 1 (got {k!r})")
    data = _as_points(X, "X")
    q = None
    if query is not None:
        qa = np.asarray(query)
        common = data.dtype
        if qa.dtype != data.dtype:
            common = np.result_type(data.dtype, qa.dtype)
            common = common if common in _FLOATS else np.float64
            data = _as_points(data, "X", common)
        q = _as_points(qa, "query", common)
    opts = _native.KnnOptions()
    _check(lib.simjoin_knn_options_init_sized(ctypes.byref(opts), ctypes.sizeof(opts)))
    opts.metric = _lookup(_native.METRICS, "metric", metric)
    opts.backend = _lookup(_native.BACKENDS, "backend", backend)
    opts.algorithm = _lookup(_native.ALGORITHMS, "algorithm", algorithm)
    opts.sphere_radius = _sphere_radius(sphere_radius)
    md = _matrix(data)
    mq = _matrix(q) if q is not None else None
    handle = ctypes.c_void_p()
    engine = _Engine.get(threads)
    _checked_run(
        lambda: lib.simjoin_knn(
            engine,
            ctypes.byref(md),
            ctypes.byref(mq) if mq is not None else None,
            int(k),
            ctypes.byref(opts),
            ctypes.byref(handle),
        ),
        opts,
        progress,
    )
    owner = _KnnOwner(handle)
    rows, kk = ctypes.c_size_t(), ctypes.c_size_t()
    idx_p, dist_p, dtype = ctypes.POINTER(ctypes.c_uint32)(), ctypes.c_void_p(), ctypes.c_uint32()
    _check(
        lib.simjoin_knn_result_arrays(
            handle, ctypes.byref(rows), ctypes.byref(kk), ctypes.byref(idx_p), ctypes.byref(dist_p),
            ctypes.byref(dtype),
        )
    )
    shape, count = (rows.value, kk.value), rows.value * kk.value
    ftype, fctype = (np.float32, ctypes.c_float) if dtype.value == _native.DTYPE_F32 else (np.float64, ctypes.c_double)
    if count == 0:
        distances, indices = np.empty(shape, dtype=ftype), np.empty(shape, dtype=np.uint32)
    else:
        address = ctypes.cast(idx_p, ctypes.c_void_p).value
        indices = _view(owner, address, ctypes.c_uint32, count, np.uint32, shape)
        distances = _view(owner, dist_p.value, fctype, count, ftype, shape)
    del owner
    if output == "graph":
        import scipy.sparse

        indptr = np.arange(0, count + 1, kk.value if kk.value else 1, dtype=np.int64)[: rows.value + 1]
        return scipy.sparse.csr_matrix(
            (distances.reshape(-1), indices.reshape(-1), indptr), shape=(rows.value, data.shape[0])
        )
    return distances, indices


# DBSCAN (bindings/python/src/simjoin/_dbscan.py). `DBSCAN` is built on first use, so that
# `import simjoin` never imports scikit-learn (whose estimator base it takes when present).
from ._dbscan import dbscan  # noqa: E402


def __getattr__(name):
    if name == "DBSCAN":
        from ._dbscan import estimator_class

        return estimator_class()
    raise AttributeError(f"module 'simjoin' has no attribute {name!r}")
