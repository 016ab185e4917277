"""ctypes declarations mirroring include/simjoin.h, and loading of libsimjoin."""
import ctypes
import os
import sys
from ctypes import POINTER, c_char_p, c_double, c_size_t, c_uint32, c_uint64, c_void_p
from pathlib import Path

LIBRARY = {"darwin": "libsimjoin.dylib", "win32": "simjoin.dll"}.get(sys.platform, "libsimjoin.so")

# Fixed numbers from simjoin.h.
OK, INVALID_ARGUMENT, CANCELLED = 0, 1, 7
METRICS = {"euclidean": 0, "manhattan": 1, "chebyshev": 2, "cosine": 3, "haversine": 4}
# metric="haversine": the sphere's radius in metres unless sphere_radius= says otherwise
# (src/metric.rs EARTH_RADIUS_M).
EARTH_RADIUS_M = 6371008.8
BACKENDS = {"auto": 0, "cpu": 1, "gpu": 2}
ALGORITHMS = {"auto": 0, "grid": 1, "ego": 2, "brute": 3, "lss": 4, "kdtree": 5}
ALGORITHM_NAMES = {v: k for k, v in ALGORITHMS.items()}
OUTPUTS = {"pairs": 0, "csr": 1, "count": 2}
DTYPE_F32, DTYPE_F64, DTYPE_F16 = 0, 1, 2


class Options(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("eps", c_double),
        ("metric", c_uint32),
        ("backend", c_uint32),
        ("algorithm", c_uint32),
        ("output", c_uint32),
        ("sorted", c_uint32),
        ("include_self", c_uint32),
        ("indexed_dims", c_uint64),
        ("batch_points", c_uint64),
        ("result_buffer_pairs", c_uint64),
        ("lss_lists", c_uint64),
        ("distances", c_uint32),
        ("control", c_void_p),
        ("sphere_radius", c_double),
    ]


class EngineOptions(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("device", c_char_p),
        ("threads", c_uint64),
        ("validation", c_uint32),
    ]


class KnnOptions(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("metric", c_uint32),
        ("backend", c_uint32),
        ("algorithm", c_uint32),
        ("lss_lists", c_uint64),
        ("control", c_void_p),
        ("sphere_radius", c_double),
    ]


class Progress(ctypes.Structure):
    _fields_ = [
        ("stage", c_char_p),
        ("fraction", c_double),
        ("pairs", c_uint64),
        ("elapsed", c_double),
    ]


class ArrowArrayStream(ctypes.Structure):
    """The Arrow C stream interface's struct (filled by simjoin, consumed by pyarrow)."""

    _fields_ = [
        ("get_schema", c_void_p),
        ("get_next", c_void_p),
        ("get_last_error", c_void_p),
        ("release", c_void_p),
        ("private_data", c_void_p),
    ]


class Matrix(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("rows", c_size_t), ("cols", c_size_t), ("dtype", c_uint32)]


class Report(ctypes.Structure):
    _fields_ = [
        ("pairs", c_uint64),
        ("seconds", c_double),
        ("batches", c_uint64),
        ("algorithm", c_uint32),
        ("backend", c_char_p),
        ("device", c_char_p),
    ]


def _find_library():
    explicit = os.environ.get("SIMJOIN_LIBRARY")
    if explicit:
        return explicit
    bundled = Path(__file__).resolve().parent / LIBRARY
    if bundled.exists():
        return str(bundled)
    raise ImportError(
        f"simjoin: {LIBRARY} is not in the package; install with `pip install ./bindings/python` "
        "or set SIMJOIN_LIBRARY to the library's path"
    )


def _declare(lib):
    status = c_uint32
    engine_p, result_p = c_void_p, c_void_p
    signatures = {
        "simjoin_version": (c_char_p, []),
        "simjoin_status_str": (c_char_p, [c_uint32]),
        "simjoin_last_error_message": (c_size_t, [ctypes.c_char_p, c_size_t]),
        "simjoin_options_init_sized": (status, [POINTER(Options), c_size_t]),
        "simjoin_abi_version": (c_uint32, []),
        "simjoin_engine_options_init_sized": (status, [POINTER(EngineOptions), c_size_t]),
        "simjoin_engine_new": (status, [POINTER(engine_p)]),
        "simjoin_engine_new_with": (status, [POINTER(EngineOptions), POINTER(engine_p)]),
        "simjoin_engine_free": (None, [engine_p]),
        "simjoin_self_join": (status, [engine_p, POINTER(Matrix), POINTER(Options), POINTER(result_p)]),
        "simjoin_join": (
            status,
            [engine_p, POINTER(Matrix), POINTER(Matrix), POINTER(Options), POINTER(result_p)],
        ),
        "simjoin_result_free": (None, [result_p]),
        "simjoin_result_count": (c_uint64, [result_p]),
        "simjoin_result_pairs": (status, [result_p, POINTER(POINTER(c_uint32)), POINTER(c_size_t)]),
        "simjoin_result_csr": (
            status,
            [
                result_p,
                POINTER(POINTER(c_uint64)),
                POINTER(c_size_t),
                POINTER(POINTER(c_uint32)),
                POINTER(c_size_t),
            ],
        ),
        "simjoin_result_report": (status, [result_p, POINTER(Report)]),
        "simjoin_result_distances": (status, [result_p, POINTER(c_void_p), POINTER(c_size_t), POINTER(c_uint32)]),
        "simjoin_neighbour_counts": (
            status,
            [engine_p, POINTER(Matrix), POINTER(Options), POINTER(c_uint32), POINTER(c_uint64)],
        ),
        "simjoin_self_join_arrow": (status, [engine_p, POINTER(Matrix), POINTER(Options), c_void_p]),
        "simjoin_join_arrow": (status, [engine_p, POINTER(Matrix), POINTER(Matrix), POINTER(Options), c_void_p]),
        "simjoin_knn_options_init_sized": (status, [POINTER(KnnOptions), c_size_t]),
        "simjoin_knn": (
            status,
            [engine_p, POINTER(Matrix), POINTER(Matrix), c_size_t, POINTER(KnnOptions), POINTER(result_p)],
        ),
        "simjoin_knn_result_free": (None, [result_p]),
        "simjoin_knn_result_arrays": (
            status,
            [
                result_p,
                POINTER(c_size_t),
                POINTER(c_size_t),
                POINTER(POINTER(c_uint32)),
                POINTER(c_void_p),
                POINTER(c_uint32),
            ],
        ),
        "simjoin_knn_result_report": (status, [result_p, POINTER(Report)]),
        "simjoin_control_new": (status, [POINTER(c_void_p)]),
        "simjoin_control_cancel": (None, [c_void_p]),
        "simjoin_control_is_cancelled": (ctypes.c_int32, [c_void_p]),
        "simjoin_control_progress": (status, [c_void_p, POINTER(Progress)]),
        "simjoin_control_free": (None, [c_void_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


# ctypes.CDLL releases the GIL during each call, so joins from several Python threads run
# in parallel (the engine is thread-safe).
lib = _declare(ctypes.CDLL(_find_library()))

# The structs above mirror ABI version 2 of simjoin.h.
ABI_VERSION = 2
if lib.simjoin_abi_version() != ABI_VERSION:
    raise ImportError(
        f"simjoin: the library has C ABI version {lib.simjoin_abi_version()}, "
        f"these bindings need {ABI_VERSION}; reinstall the package"
    )
