"""DBSCAN on the eps-join: `simjoin.dbscan` and the scikit-learn style `simjoin.DBSCAN`.

The clustering is the engine's (src/dbscan.rs): a row with at least `min_samples` rows
within eps (itself included) is a core sample; core samples within eps of each other share
a cluster; a non-core row with a core row within eps is a border point of the cluster of
its nearest core row (equal distances: the smaller row); the rest is noise (-1). Clusters
are numbered by their smallest row. Memory beyond the input is proportional to the number
of rows, whatever the number of pairs (the join's pairs are streamed, never kept).

scikit-learn's `DBSCAN` gives the same core samples, the same clusters of core samples (up
to numbering) and the same noise; a border point within eps of core samples of two
clusters may go to either (scikit-learn: the cluster that reached it first; here: its
nearest core sample's).
"""
import ctypes
from ctypes import POINTER, c_char_p, c_double, c_int64, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p

import numpy as np

from . import _native
from ._native import lib

# scikit-learn's names for the engine's metrics, besides the engine's own.
_METRIC_ALIASES = {"l2": "euclidean", "l1": "manhattan", "cityblock": "manhattan", "infinity": "chebyshev"}
# scikit-learn's neighbour search structures: they change only how its answer is found, as
# the join's algorithm does here, so they mean "auto" ("brute" is the same in both).
_ALGORITHM_ALIASES = {"ball_tree": "auto", "kd_tree": "auto"}
_JOIN_ALGORITHMS = ("auto", "grid", "ego", "brute", "lss")


class _DbscanOptions(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("metric", c_uint32),
        ("backend", c_uint32),
        ("algorithm", c_uint32),
        ("sample_weight", POINTER(c_double)),
        ("control", c_void_p),
        ("sphere_radius", c_double),
    ]


class _DbscanReport(ctypes.Structure):
    _fields_ = [
        ("clusters", c_uint64),
        ("noise", c_uint64),
        ("core_points", c_uint64),
        ("pairs", c_uint64),
        ("seconds", c_double),
        ("backend", c_char_p),
    ]


lib.simjoin_dbscan_options_init_sized.restype = c_uint32
lib.simjoin_dbscan_options_init_sized.argtypes = [POINTER(_DbscanOptions), c_size_t]
lib.simjoin_dbscan.restype = c_uint32
lib.simjoin_dbscan.argtypes = [
    c_void_p,
    POINTER(_native.Matrix),
    c_double,
    c_uint64,
    POINTER(_DbscanOptions),
    POINTER(c_int64),
    POINTER(c_uint8),
    POINTER(_DbscanReport),
]


def _invalid(message):
    from . import InvalidArgumentError

    return InvalidArgumentError(_native.INVALID_ARGUMENT, message)


def _run(X, eps, min_samples, metric, backend, threads, algorithm="auto", sample_weight=None, progress=None):
    """(X as the engine read it, labels int64, core mask bool, report dict)."""
    from . import _Engine, _as_points, _checked_run, _lookup, _matrix, _check

    if isinstance(min_samples, bool) or not isinstance(min_samples, (int, np.integer)) or min_samples < 1:
        raise _invalid(f"min_samples must be an integer >= 1 (got {min_samples!r})")
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise _invalid(f"eps must be a number > 0 (got {eps!r})")
    if hasattr(X, "tocsr") or hasattr(X, "toarray"):
        raise _invalid("sparse inputs are not supported: pass a dense array")
    data = _as_points(X, "X")
    metric_name = _METRIC_ALIASES.get(str(metric).lower(), metric)
    engine_data = data
    opts = _DbscanOptions()
    _check(lib.simjoin_dbscan_options_init_sized(ctypes.byref(opts), ctypes.sizeof(opts)))
    if str(metric_name).lower() == "haversine":
        # scikit-learn's convention: (latitude, longitude) in radians, eps in radians. The
        # engine's: degrees, and eps in the sphere's units; on the unit sphere eps is the
        # angle itself.
        if data.ndim != 2 or data.shape[1] != 2:
            raise _invalid(f"haversine points are 2 columns, (latitude, longitude) in radians; "
                           f"X has shape {data.shape}")
        engine_data = np.ascontiguousarray(np.degrees(data.astype(np.float64)))
        opts.sphere_radius = 1.0
    opts.metric = _lookup(_native.METRICS, "metric", metric_name)
    opts.backend = _lookup(_native.BACKENDS, "backend", backend)
    algorithm_name = _ALGORITHM_ALIASES.get(str(algorithm).lower(), algorithm)
    if str(algorithm_name).lower() not in _JOIN_ALGORITHMS:
        raise _invalid(f"unknown algorithm {algorithm!r} (expected one of: {', '.join(_JOIN_ALGORITHMS)})")
    opts.algorithm = _native.ALGORITHMS[str(algorithm_name).lower()]
    n = data.shape[0]
    weights = None
    if sample_weight is not None:
        try:
            weights = np.require(np.asarray(sample_weight, dtype=np.float64), requirements=["C", "A"])
        except (TypeError, ValueError) as e:
            raise _invalid(f"sample_weight could not be read as real numbers: {e}") from None
        if weights.shape != (n,):
            raise _invalid(f"sample_weight must have one entry per row: shape {weights.shape} for {n} rows")
        if n:
            opts.sample_weight = weights.ctypes.data_as(POINTER(c_double))
    labels = np.empty(n, dtype=np.int64)
    core = np.empty(n, dtype=np.uint8)
    report = _DbscanReport()
    m = _matrix(engine_data)
    engine = _Engine.get(threads)
    _checked_run(
        lambda: lib.simjoin_dbscan(
            engine,
            ctypes.byref(m),
            float(eps),
            int(min_samples),
            ctypes.byref(opts),
            labels.ctypes.data_as(POINTER(c_int64)) if n else None,
            core.ctypes.data_as(POINTER(c_uint8)) if n else None,
            ctypes.byref(report),
        ),
        opts,
        progress,
    )
    stats = {
        "clusters": int(report.clusters),
        "noise": int(report.noise),
        "core_points": int(report.core_points),
        "pairs": int(report.pairs),
        "seconds": float(report.seconds),
        "backend": report.backend.decode(),
    }
    return data, labels, core.view(np.bool_), stats


def dbscan(X, eps, min_samples=5, *, metric="euclidean", backend="auto", algorithm="auto", threads=None,
           sample_weight=None, progress=None):
    """DBSCAN of the rows of X: an int64 array of labels, 0, 1, ... per cluster (numbered by
    their smallest row) and -1 for noise. A row with at least `min_samples` rows within
    `eps` (itself included, as scikit-learn counts) is a core sample; a non-core row with a
    core sample within eps joins the cluster of its nearest one. metric: "euclidean",
    "manhattan", "chebyshev", "cosine" (or scikit-learn's "l2", "l1", "cityblock", "infinity")
    or "haversine" in scikit-learn's convention: X is (latitude, longitude) in radians and
    eps in radians (a great-circle angle), as sklearn.cluster.DBSCAN(metric="haversine")
    takes them (the engine joins them as degrees on the unit sphere, sphere_radius 1, where
    eps is the angle; pairs within about 1e-14 of eps may differ from scikit-learn's, see
    src/metric.rs);
    backend: "auto", "cpu" or "gpu"; algorithm: the join's, "auto", "grid", "ego",
    "brute" or "lss" (GPU) -- the labels are the same whichever runs (scikit-learn's
    "kd_tree" and "ball_tree" mean "auto"). float32 inputs are clustered in float32 arithmetic,
    others in float64. Memory beyond X: a few bytes per row, whatever the number of pairs.
    sample_weight: one weight per row, as scikit-learn's: a row is core when the weights
    within eps, its own included, sum to at least min_samples (zero and negative weights
    allowed); summed exactly, so where NumPy's rounded float sum falls on the other side
    of min_samples the answer can differ from scikit-learn's (integer weights never do).
    Ctrl-C and progress as for simjoin.self_join.
    """
    return _run(X, eps, min_samples, metric, backend, threads, algorithm, sample_weight, progress)[1]


_estimator = None


def estimator_class():
    """`simjoin.DBSCAN`, built on first use: a scikit-learn estimator (BaseEstimator,
    ClusterMixin) when scikit-learn is importable, else a plain class with the same
    methods. (Built lazily so that `import simjoin` never imports scikit-learn.)"""
    global _estimator
    if _estimator is not None:
        return _estimator
    try:
        from sklearn.base import BaseEstimator, ClusterMixin

        bases = (ClusterMixin, BaseEstimator)
    except ImportError:
        bases = (_PlainEstimator,)
    methods = {k: v for k, v in vars(_Methods).items() if k not in ("__dict__", "__weakref__")}
    cls = type("DBSCAN", bases, methods)
    cls.__module__ = "simjoin"
    cls.__qualname__ = "DBSCAN"
    _estimator = cls
    return cls


class _PlainEstimator:
    """get_params / set_params / fit_predict / repr without scikit-learn."""

    _PARAMS = ("eps", "min_samples", "metric", "algorithm", "backend")

    def get_params(self, deep=True):
        return {p: getattr(self, p) for p in self._PARAMS}

    def set_params(self, **params):
        for key, value in params.items():
            if key not in self._PARAMS:
                raise ValueError(f"invalid parameter {key!r} for estimator {type(self).__name__}")
            setattr(self, key, value)
        return self

    def fit_predict(self, X, y=None, **kwargs):
        return self.fit(X, y, **kwargs).labels_

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"DBSCAN({args})"


class _Methods:
    """The estimator's own methods (combined with its bases in `estimator_class`)."""

    def __init__(self, eps=0.5, *, min_samples=5, metric="euclidean", algorithm="auto", backend="auto"):
        self.eps = eps
        self.min_samples = min_samples
        self.metric = metric
        self.algorithm = algorithm
        self.backend = backend

    def fit(self, X, y=None, sample_weight=None):
        """Clusters X (rows are samples). Sets `labels_` (int64, -1 for noise),
        `core_sample_indices_` (int64, ascending), `components_` (the core samples' rows),
        `n_features_in_` and `report_` (clusters, noise, core points, pairs, seconds,
        backend). sample_weight: as in `simjoin.dbscan`. Returns self."""
        data, labels, core, stats = _run(
            X, self.eps, self.min_samples, self.metric, self.backend, None, self.algorithm, sample_weight
        )
        self.labels_ = labels
        self.core_sample_indices_ = np.flatnonzero(core).astype(np.int64, copy=False)
        self.components_ = data[self.core_sample_indices_]  # fancy indexing: already a copy
        self.n_features_in_ = data.shape[1]
        self.report_ = stats
        return self

    def fit_predict(self, X, y=None, sample_weight=None):
        """`fit(X)` and its `labels_`."""
        return self.fit(X, y, sample_weight=sample_weight).labels_
