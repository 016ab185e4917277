"""simjoin.dask: the eps-join of Dask collections, partitioned with halos, exact.

    >>> import dask.array as da, simjoin.dask
    >>> X = da.random.random((1_000_000, 3), chunks=100_000)
    >>> pairs = simjoin.dask.self_join(X, 0.003)     # a lazy dask.dataframe: i, j
    >>> pairs.to_parquet("pairs/")                    # or pairs.compute()

Needs Dask (``pip install 'simjoin[dask]'``: dask[dataframe], distributed, pandas, pyarrow);
``import simjoin`` itself does not.

How the join is cut up
----------------------
1. Plan (on the client, eager): one pass over the input reads every chunk's length, checks
   that all coordinates are finite, and draws a random sample (``sample_size`` rows in all,
   an equal number from each chunk, each sampled row weighted by chunk length / rows drawn).
   The sample's own eps-pairs are counted with simjoin (subsampled if there are too many)
   to estimate where the pairs are. A k-d tree is then grown greedily: the most expensive
   leaf (cost = estimated points + estimated pairs / 4) is cut along one of its most spread
   dimensions at the cost-weighted median of its sample (a quantile), until there are
   ``partitions`` leaves; after that, any leaf still costing more than ``max_skew`` times
   the mean (total / partitions) is cut again where that helps (skew). A leaf that cannot be
   cut usefully (a cluster narrower than eps, thousands of duplicates) is split into
   blocks of its points instead (below). Leaves are numbered in depth-first order.
2. Route (one task per input chunk): every point gets exactly one home leaf (the leaf
   whose half-open box holds it) and is copied as a halo point into each other leaf whose
   box, widened by the halo width h in every cut dimension, holds it.
3. Join (one task per leaf, or per block pair of a split leaf): simjoin's engine on the
   worker joins the leaf's own points with themselves and with its halo; local row numbers
   are mapped back to global row numbers there.

Ownership rule (self-join), and why every pair comes out exactly once
---------------------------------------------------------------------
A leaf c receives as halo only points whose home leaf comes *after* c (home > c), and
computes own x own (a self-join, i < j) and own x halo (a join); halo x halo is never
computed. Take any pair (p, q), p != q, with dist(p, q) <= eps and home(p) <= home(q).
* It is found in leaf home(p): if home(p) == home(q) both are own points there and the
  self-join finds it once. Otherwise q is in home(p)'s halo: each coordinate difference is
  at most the distance for all three metrics (|p_k - q_k| <= dist <= eps <= h), so q lies in
  home(p)'s box widened by h (for every cut on p's path, p < cut gives q < cut + h and
  p >= cut gives q >= cut - h), and home(q) > home(p); the own x halo join finds it.
* It is found nowhere else: a leaf c computes only pairs with at least one own point, so
  c is home(p) or home(q). In leaf home(q), p would have to be an own point (it is not:
  home(p) != home(q)) or a halo point (it is not: halo points have home > c = home(q) >=
  home(p)). Within home(p) the three products (own x own with i < j, own x halo, and the
  block products below) are disjoint.
So no duplicate-elimination pass is needed. h is eps widened by a relative 2^-10 (and an
absolute 2^-40 x the largest cut): the engine decides dist <= eps in the input's precision
(float32 rounds), and a pair it accepts may be a rounding error beyond eps apart; a wider
halo only copies a few more points, it never changes which leaf owns a pair. Every pair is
decided by the same engine arithmetic as the single-machine join, so the pair set is
exactly that of ``simjoin.self_join`` on the whole input.

A join A x B uses the same tree (planned on a sample of both): a pair (a, b) belongs to
home(a); A points are routed to their home leaf only, B points to their home leaf and to
every leaf whose widened box holds them. Each a has one home, so each pair once.

Block splitting: a leaf's own points O are cut into k equal blocks O_1..O_k; task (i, i)
computes O_i x O_i (i < j) and O_i x halo, task (i, j), i < j, computes O_i x O_j. Each
unordered pair of own points falls in exactly one block pair, so the rule above still
gives every pair once. For A x B, task i computes A_i x B-near.

Results are a dask.dataframe with columns i, j (int64 global row numbers: positions in the
input, counted across chunks/partitions in order; i < j for a self-join) and, with
return_distance=True, ``distance``. Pairs within a partition are not sorted. Distances are
computed with NumPy on the worker from the two points, in the join's precision (float64
for float64 input, float32 for float32), with the same metric; they can differ from the
engine's own arithmetic in the last bits, so a pair at distance ~eps may show a distance a
rounding error above eps.

Cosine and haversine: the tree cuts the rows' unit vectors (cosine: each row over its
norm; haversine: (latitude, longitude) in degrees as a point on the unit sphere), where a
pair's coordinate differences are bounded by its Euclidean distance, which is bounded by
the metric's own: sqrt(2 eps) for cosine distance eps (plus an absolute 1e-12 under the
root, for the rounding of 1 - cos near 0), the chord 2 sin(eps / 2R) for eps metres on the
sphere of radius R. The halo h is that bound widened as above, so the ownership rule holds
unchanged; the workers route by the unit vectors but join the rows themselves, with the
engine's cosine or haversine rule, so the pair set is exactly the single-machine one.
Distances of these two metrics are the engine's own. ``Plan.boxes()`` then gives the
leaves' boxes in the unit vectors' coordinates.

The engine runs on the workers through the ordinary binding, which keeps one engine per
process (``simjoin._Engine``); tasks carry only NumPy arrays and module-level functions,
never a ctypes handle.
"""
import heapq
import math
import os

import numpy as np

try:
    import dask
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd
except ImportError as _exc:  # pragma: no cover - exercised only without dask
    raise ImportError(
        "simjoin.dask needs Dask and pandas: pip install 'simjoin[dask]' "
        "(or: pip install 'dask[dataframe]' distributed pandas pyarrow)"
    ) from _exc

from . import InvalidArgumentError, _native
from . import join as _sj_join
from . import self_join as _sj_self_join

__all__ = ["self_join", "join", "plan", "Plan"]

PAIR_COST = 0.25  # a pair costs a quarter of a point in the planner's cost model
DEFAULT_TASK_COST = 2_000_000.0  # partitions=None: about this much cost per task
SAMPLE_PAIR_CAP = 1_000_000  # sample pairs kept for the estimate
MAX_BLOCKS_SELF = 32  # a leaf split into at most 32 blocks (528 tasks)
MAX_BLOCKS_JOIN = 256


def _invalid(message):
    return InvalidArgumentError(_native.INVALID_ARGUMENT, message)


# --------------------------------------------------------------------------- input


class _Input:
    """A Dask collection as a list of delayed row chunks (NumPy arrays or pandas frames)."""

    def __init__(self, points, columns, name):
        if isinstance(points, dd.DataFrame):
            cols = list(points.columns) if columns is None else list(columns)
            if not cols:
                raise _invalid(f"{name}: no coordinate columns")
            missing = [c for c in cols if c not in points.columns]
            if missing:
                raise _invalid(f"{name}: no column(s) {missing!r}")
            frame = points[cols]
            kinds = []
            for c, t in zip(cols, frame.dtypes):
                try:
                    kinds.append(np.dtype(t))
                except TypeError:
                    kinds.append(np.dtype(object))
                if kinds[-1].kind not in "fiub":
                    raise _invalid(f"{name}: column {c!r} is not numeric ({t})")
            self.dtype = np.dtype(np.float32) if all(t == np.float32 for t in kinds) else np.dtype(np.float64)
            self.dims = len(cols)
            self.parts = list(frame.to_delayed())
            self.lengths = None
        else:
            if not isinstance(points, da.Array):
                arr = np.asarray(points)
                if arr.ndim != 2:
                    raise _invalid(f"{name} must be 2-D (points x dimensions), got shape {arr.shape}")
                points = da.from_array(arr, chunks=(max(1, min(len(arr), 1_000_000)), arr.shape[1]))
            if points.ndim != 2:
                raise _invalid(f"{name} must be 2-D (points x dimensions), got shape {points.shape}")
            if len(points.chunks[1]) > 1:
                points = points.rechunk({1: -1})
            dt = np.dtype(points.dtype)
            if dt.kind not in "fiub":
                raise _invalid(f"{name} must hold real numbers, got dtype {dt}")
            self.dtype = dt if dt in (np.float32, np.float64) else np.dtype(np.float64)
            self.dims = int(points.shape[1]) if not math.isnan(points.shape[1]) else None
            self.parts = list(points.to_delayed().ravel())
            lengths = points.chunks[0]
            self.lengths = None if any(math.isnan(x) for x in lengths) else [int(x) for x in lengths]
        self.token = dask.base.tokenize(points, columns)
        if self.dims is not None and self.dims < 1:
            raise _invalid(f"{name} has no dimensions (at least one dimension is needed)")


def _to_array(part, dtype):
    if isinstance(part, pd.DataFrame):
        return part.to_numpy(dtype=dtype)
    return np.ascontiguousarray(np.asarray(part), dtype=dtype)


def _summary(part, dtype, k, seed):
    """One input chunk: rows, column minima and maxima, all finite?, and a random sample of
    up to k rows (in the join's dtype)."""
    x = _to_array(part, dtype)
    n = len(x)
    finite = bool(np.isfinite(x).all()) if x.size else True
    take = min(k, n)
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(n, size=take, replace=False)) if take else np.empty(0, np.int64)
    return n, x.shape[1], finite, x[rows]


def _summaries(inp, total_sample, seed, base):
    k = max(2, -(-total_sample // max(1, len(inp.parts))))
    tasks = [
        dask.delayed(_summary, pure=True)(part, inp.dtype, k, seed * 1_000_003 + base + idx)
        for idx, part in enumerate(inp.parts)
    ]
    out = dask.compute(*tasks)
    lengths = [int(o[0]) for o in out]
    dims = {int(o[1]) for o in out if o[0] > 0} or ({inp.dims} if inp.dims else set())
    if len(dims) > 1:
        raise _invalid(f"chunks have different numbers of columns: {sorted(dims)}")
    if not all(o[2] for o in out):
        raise _invalid("points: a coordinate is not finite (NaN or infinity)")
    dim = dims.pop() if dims else (inp.dims or 1)
    xs, ws = [], []
    for n, _, _, s in out:
        if len(s):
            xs.append(s.reshape(len(s), -1))
            ws.append(np.full(len(s), n / len(s)))
    if xs:
        x = np.concatenate(xs).astype(inp.dtype, copy=False)
        w = np.concatenate(ws)
    else:
        x, w = np.empty((0, dim), inp.dtype), np.empty(0)
    return lengths, dim, x, w


def _lengths(inp):
    if inp.lengths is not None:
        return inp.lengths
    return [int(n) for n in dask.compute(*[dask.delayed(len, pure=True)(p) for p in inp.parts])]


# --------------------------------------------------------------------------- tree


class _Tree:
    """A k-d tree as flat arrays (picklable, a few KiB): node -> cut dimension, cut value,
    children (-1 at leaves) and leaf number (depth-first order; -1 at inner nodes)."""

    def __init__(self, dim, cut, left, right, leaf):
        self.dim = np.asarray(dim, np.int64)
        self.cut = np.asarray(cut, np.float64)
        self.left = np.asarray(left, np.int64)
        self.right = np.asarray(right, np.int64)
        self.leaf = np.asarray(leaf, np.int64)
        self.n_leaves = int((self.leaf >= 0).sum())

    def home(self, x):
        """The one leaf whose half-open box holds each row (x < cut goes left)."""
        node = np.zeros(len(x), np.int64)
        idx = np.arange(len(x))
        while len(idx):
            nd = node[idx]
            inner = self.left[nd] >= 0
            idx, nd = idx[inner], nd[inner]
            if not len(idx):
                break
            v = x[idx, self.dim[nd]]
            node[idx] = np.where(v < self.cut[nd], self.left[nd], self.right[nd])
        return self.leaf[node]

    def near(self, x, h):
        """Every (row, leaf) with the row inside the leaf's box widened by h in each cut
        dimension (left if x <= cut + h, right if x >= cut - h: both near a cut)."""
        lo, hi = self.cut - h, self.cut + h
        rows = np.arange(len(x))
        node = np.zeros(len(x), np.int64)
        out_r, out_l = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        while len(rows):
            at_leaf = self.left[node] < 0
            out_r.append(rows[at_leaf])
            out_l.append(self.leaf[node[at_leaf]])
            rows, node = rows[~at_leaf], node[~at_leaf]
            if not len(rows):
                break
            v = x[rows, self.dim[node]]
            go_l = v <= hi[node]
            go_r = v >= lo[node]
            rows = np.concatenate([rows[go_l], rows[go_r]])
            node = np.concatenate([self.left[node[go_l]], self.right[node[go_r]]])
        return np.concatenate(out_r), np.concatenate(out_l)

    def boxes(self, dims):
        """Leaf boxes [lo, hi) as two (n_leaves, dims) arrays (+-inf where unbounded)."""
        lo = np.full((self.n_leaves, dims), -np.inf)
        hi = np.full((self.n_leaves, dims), np.inf)
        stack = [(0, np.full(dims, -np.inf), np.full(dims, np.inf))]
        while stack:
            node, l, u = stack.pop()
            if self.left[node] < 0:
                lo[self.leaf[node]], hi[self.leaf[node]] = l, u
                continue
            k, c = self.dim[node], self.cut[node]
            u2, l2 = u.copy(), l.copy()
            u2[k], l2[k] = min(u[k], c), max(l[k], c)
            stack.append((self.left[node], l, u2))
            stack.append((self.right[node], l2, u))
        return lo, hi


def _space(x, metric):
    """The coordinates the tree cuts for `metric` (module docstring, "Cosine and
    haversine"): the rows themselves, or their unit vectors in float64."""
    if metric == "cosine":
        x64 = np.asarray(x, np.float64)
        norm = np.sqrt(np.einsum("ij,ij->i", x64, x64))[:, None]
        # A zero row stays at the origin (the engine rejects it in the join).
        return np.divide(x64, norm, out=np.zeros_like(x64), where=norm > 0)
    if metric == "haversine":
        if x.shape[1] != 2:
            raise _invalid(
                f"haversine points are 2 columns, (latitude, longitude) in degrees; the data have {x.shape[1]}"
            )
        lat, lon = np.radians(np.asarray(x[:, 0], np.float64)), np.radians(np.asarray(x[:, 1], np.float64))
        return np.stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=1)
    return x


def _coordinate_bound(metric, eps, sphere_radius=None):
    """The largest coordinate difference (in `_space`) of a pair within eps, before the
    halo's widening for rounding (haversine: on a sphere of `sphere_radius` metres, None
    for the Earth's)."""
    if metric == "cosine":
        return math.sqrt(2.0 * eps + 1e-12)
    if metric == "haversine":
        radius = _native.EARTH_RADIUS_M if sphere_radius is None else float(sphere_radius)
        return 2.0 * math.sin(min(eps / radius, math.pi) / 2.0)
    return eps


def _route_rows(tree, x, h, role):
    """(row, leaf, own?) for one chunk. role "self": own at home, halo in earlier leaves;
    "a": home only; "b": home and every other near leaf."""
    home = tree.home(x)
    n = len(x)
    if role == "a":
        return np.arange(n), home, np.ones(n, bool)
    r, leaf = tree.near(x, h)
    keep = leaf < home[r] if role == "self" else leaf != home[r]
    rows = np.concatenate([np.arange(n), r[keep]])
    leaves = np.concatenate([home, leaf[keep]])
    own = np.concatenate([np.ones(n, bool), np.zeros(int(keep.sum()), bool)])
    return rows, leaves, own


def _route(part, offset, dtype, tree, h, role, metric="euclidean"):
    """Worker task: one input chunk cut into per-leaf pieces, sorted by leaf; `starts`
    indexes them (piece c is rows starts[c]:starts[c+1]). Routed by `_space`'s coordinates,
    the rows themselves carried."""
    x = _to_array(part, dtype)
    rows, leaves, own = _route_rows(tree, _space(x, metric), h, role)
    order = np.argsort(leaves, kind="stable")
    rows, leaves, own = rows[order], leaves[order], own[order]
    starts = np.searchsorted(leaves, np.arange(tree.n_leaves + 1))
    return starts, rows.astype(np.int64) + offset, x[rows], own


def _piece(routed, c):
    starts, gids, x, own = routed
    s, e = starts[c], starts[c + 1]
    return gids[s:e].copy(), x[s:e].copy(), own[s:e].copy()


# --------------------------------------------------------------------------- joins

_FAULT_MARKER = None


def _testing_fault_once(marker):
    """Testing hook (run on workers with Client.run): the next join task on this worker
    process kills the process if `marker` does not exist yet (creating it first), so a test
    can check that a lost worker's tasks are recomputed and the result is still exact."""
    global _FAULT_MARKER
    _FAULT_MARKER = marker


def _maybe_fault():
    if _FAULT_MARKER is None:
        return
    try:
        fd = os.open(_FAULT_MARKER, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), 9)


def _gather(n_a, *pieces):
    """A leaf's pieces from every input chunk -> (own ids, own points, other ids, other
    points); "other" is the halo (self-join) or the near B points (join)."""

    def cat(ps, pick):
        g = [p[0] if pick is None else p[0][p[2] == pick] for p in ps]
        x = [p[1] if pick is None else p[1][p[2] == pick] for p in ps]
        return np.concatenate(g), np.concatenate(x)

    if n_a is None:  # self-join: the own flag separates own and halo points
        return cat(pieces, True) + cat(pieces, False)
    return cat(pieces[:n_a], None) + cat(pieces[n_a:], None)


def _distances(xa, xb, la, lb, metric):
    out = np.empty(len(la), dtype=xa.dtype)
    step = 1 << 20
    for s in range(0, len(la), step):
        d = xa[la[s : s + step]] - xb[lb[s : s + step]]
        if metric == "euclidean":
            out[s : s + step] = np.sqrt(np.einsum("ij,ij->i", d, d))
        elif metric == "manhattan":
            out[s : s + step] = np.abs(d).sum(axis=1)
        else:
            out[s : s + step] = np.abs(d).max(axis=1)
    return out


def _block(data, i, j, spec):
    """Worker task: the pairs of block pair (i, j) of one leaf as a pandas DataFrame."""
    _maybe_fault()
    mode, eps, metric, backend, threads, return_distance, k, sphere_radius = spec
    og, ox, hg, hx = data
    bounds = np.linspace(0, len(og), k + 1).astype(np.int64)
    kw = dict(metric=metric, backend=backend, sorted=False, threads=threads, sphere_radius=sphere_radius)
    parts = []  # (ids left, ids right, points left, points right, local pairs)

    # Cosine and haversine distances are the engine's (NumPy has not their rules).
    engine_distances = return_distance and metric in ("cosine", "haversine")
    if engine_distances:
        kw["return_distance"] = True

    def run(ga, xa, gb, xb):
        if not len(ga) or not len(gb):
            return
        p = _sj_self_join(xa, eps, **kw) if xb is None else _sj_join(xa, xb, eps, **kw)
        d = None
        if engine_distances:
            p, d = p
        if len(p):
            parts.append((ga, gb if xb is not None else ga, xa, xa if xb is None else xb, p, d))

    gi, xi = og[bounds[i] : bounds[i + 1]], ox[bounds[i] : bounds[i + 1]]
    if mode == "join":
        run(gi, xi, hg, hx)
    elif i == j:
        run(gi, xi, gi, None)
        run(gi, xi, hg, hx)
    else:
        run(gi, xi, og[bounds[j] : bounds[j + 1]], ox[bounds[j] : bounds[j + 1]])

    cols_i, cols_j, dists = [], [], []
    for ga, gb, xa, xb, p, d in parts:
        la, lb = p[:, 0].astype(np.int64), p[:, 1].astype(np.int64)
        a, b = ga[la], gb[lb]
        if mode == "self":
            a, b = np.minimum(a, b), np.maximum(a, b)
        cols_i.append(a)
        cols_j.append(b)
        if return_distance:
            dists.append(np.asarray(d, xa.dtype) if d is not None else _distances(xa, xb, la, lb, metric))
    frame = {
        "i": np.concatenate(cols_i) if cols_i else np.empty(0, np.int64),
        "j": np.concatenate(cols_j) if cols_j else np.empty(0, np.int64),
    }
    if return_distance:
        frame["distance"] = np.concatenate(dists) if dists else np.empty(0, ox.dtype)
    return pd.DataFrame(frame, copy=False)


def _leaf_join(spec, n_a, *pieces):
    """Worker task for an unsplit leaf: gather and join in one task."""
    return _block(_gather(n_a, *pieces), 0, 0, spec)


# --------------------------------------------------------------------------- planning


class Plan:
    """How a join is cut into tasks: the k-d tree, the halo width and, per leaf, the number
    of point blocks. ``stats`` holds the estimates (from the sample) the plan was built on:
    per-task own points, halo points and pairs, their max/mean ratios, and the totals. Pass
    a plan back to ``self_join``/``join`` (``plan=``) to run it without sampling again."""

    def __init__(self, mode, eps, metric, dims, dtype, tree, h, blocks, stats, token, lengths, sphere_radius=None):
        self.mode, self.eps, self.metric, self.dims, self.dtype = mode, eps, metric, dims, dtype
        self.sphere_radius = sphere_radius
        self.tree, self.h, self.blocks, self.stats = tree, h, blocks, stats
        self._token, self._lengths = token, lengths

    @property
    def n_leaves(self):
        return self.tree.n_leaves

    @property
    def n_tasks(self):
        return len(self.tasks)

    @property
    def tasks(self):
        """(leaf, i, j) for every join task, in output-partition order."""
        out = []
        for c, k in enumerate(self.blocks):
            if self.mode == "join":
                out.extend((c, i, i) for i in range(k))
            else:
                out.extend((c, i, j) for i in range(k) for j in range(i, k))
        return out

    def boxes(self):
        """Leaf boxes [lo, hi) as two (n_leaves, dims) arrays (+-inf where unbounded)."""
        return self.tree.boxes(self.stats.get("space_dims", self.dims))

    def __repr__(self):
        s = self.stats
        return (
            f"<simjoin.dask.Plan {self.mode} eps={self.eps} {self.metric}: {self.n_leaves} leaves, "
            f"{self.n_tasks} tasks, max/mean cost {s['max_mean_cost']:.2f}>"
        )


def _weighted_cut(v, w):
    """The cost-weighted median of v, moved up to the next distinct value if needed so that
    both sides (v < cut, v >= cut) are non-empty; None if all values are equal."""
    order = np.argsort(v, kind="stable")
    vs, ws = v[order], w[order]
    cum = np.cumsum(ws)
    idx = int(np.searchsorted(cum, cum[-1] / 2.0))
    cut = vs[min(idx, len(vs) - 1)]
    if cut <= vs[0]:
        above = vs[vs > vs[0]]
        if not len(above):
            return None
        cut = above[0]
    return float(cut)


def _make_plan(mode, eps, metric, inputs, partitions, sample_size, max_skew, seed, pair_cost=PAIR_COST,
               backend="cpu", sphere_radius=None):
    """Samples the input(s) and grows the tree (see the module docstring)."""
    eps = float(eps)
    if not (math.isfinite(eps) and eps > 0):
        raise _invalid("eps must be a finite number > 0")
    metric = str(metric).lower()
    if metric not in _native.METRICS:
        raise _invalid(f"unknown metric {metric!r} (expected one of: {', '.join(_native.METRICS)})")
    if partitions is not None and int(partitions) < 1:
        raise _invalid(f"partitions must be >= 1 (got {partitions})")
    dtype = inputs[0].dtype if len(inputs) == 1 else np.dtype(np.result_type(inputs[0].dtype, inputs[1].dtype))
    summaries = []
    for idx, inp in enumerate(inputs):
        inp.dtype = dtype
        share = sample_size if len(inputs) == 1 else sample_size // 2
        summaries.append(_summaries(inp, share, seed, idx * 7_919_113))
    dims = {s[1] for s in summaries}
    if len(dims) > 1:
        raise _invalid(f"A has {summaries[0][1]} dimensions but B has {summaries[1][1]}")
    dims = dims.pop()
    if dims < 1:
        raise _invalid("points have no dimensions (at least one dimension is needed)")
    n_total = [sum(s[0]) for s in summaries]
    xs = np.concatenate([s[2] for s in summaries]).astype(dtype, copy=False)
    ws = np.concatenate([s[3] for s in summaries])
    is_b = np.concatenate([np.full(len(s[2]), i == 1) for i, s in enumerate(summaries)])
    rng = np.random.default_rng(seed)

    # Sample pairs (p, q) (indices into xs; for a join p is from A, q from B) and weights.
    # (The engine checks sphere_radius: a number of metres, and only for haversine.)
    kw = dict(metric=metric, backend=backend, sphere_radius=sphere_radius)
    if mode == "self":
        count = _sj_self_join(xs, eps, output="count", **kw) if len(xs) else 0
        sub = np.arange(len(xs))
        if count > SAMPLE_PAIR_CAP:
            size = max(2, int(len(xs) * math.sqrt(SAMPLE_PAIR_CAP / count)))
            sub = np.sort(rng.choice(len(xs), size=size, replace=False))
        scale = (len(xs) / max(1, len(sub))) ** 2
        pairs = _sj_self_join(xs[sub], eps, sorted=False, **kw).astype(np.int64) if len(sub) else np.empty((0, 2), np.int64)
        P, Q = sub[pairs[:, 0]], sub[pairs[:, 1]]
    else:
        ia, ib = np.nonzero(~is_b)[0], np.nonzero(is_b)[0]
        count = _sj_join(xs[ia], xs[ib], eps, output="count", **kw) if len(ia) and len(ib) else 0
        scale = 1.0
        if count > SAMPLE_PAIR_CAP:
            frac = math.sqrt(SAMPLE_PAIR_CAP / count)
            na, nb = max(1, int(len(ia) * frac)), max(1, int(len(ib) * frac))
            scale = (len(ia) / na) * (len(ib) / nb)
            ia = np.sort(rng.choice(ia, size=na, replace=False))
            ib = np.sort(rng.choice(ib, size=nb, replace=False))
        if len(ia) and len(ib):
            pairs = _sj_join(xs[ia], xs[ib], eps, sorted=False, **kw).astype(np.int64)
        else:
            pairs = np.empty((0, 2), np.int64)
        P, Q = ia[pairs[:, 0]], ib[pairs[:, 1]]
    pw = ws[P] * ws[Q] * scale
    est_pairs = float(pw.sum())

    # Each sample point's cost: its own weight plus its share of the pairs' cost.
    pc = ws.copy()
    if mode == "self":
        np.add.at(pc, P, 0.5 * pair_cost * pw)
        np.add.at(pc, Q, 0.5 * pair_cost * pw)
    else:
        np.add.at(pc, P, pair_cost * pw)
    # The tree cuts `_space`'s coordinates (the rows, or their unit vectors).
    xs64 = np.asarray(_space(xs, metric), np.float64)
    space_dims = xs64.shape[1]
    h_rel = _coordinate_bound(metric, eps, sphere_radius) * (1.0 + 2.0**-10)

    # Tree growth. node_of: sample point -> leaf node; pair_owner: sample pair -> leaf node.
    dim_l, cut_l, left_l, right_l = [0], [0.0], [-1], [-1]
    members = {0: np.arange(len(xs))}
    owned = {0: np.arange(len(P))}
    node_of = np.zeros(len(xs), np.int64)
    cost = {0: float(ws.sum() + pair_cost * pw.sum())}
    total = cost[0]
    if partitions is None:
        parts = max(len(inputs[0].parts), math.ceil(total / DEFAULT_TASK_COST))
        partitions = int(min(parts, 10_000))
    partitions = int(partitions)
    target = total / partitions if total > 0 else 1.0
    max_leaves = max(4 * partitions, partitions + 64)
    heap = [(-cost[0], 0)]
    leaves, skew_splits, unsplittable = 1, 0, set()
    cut_dims = np.zeros(space_dims, np.int64)

    def evaluate(node, k, c):
        """Children's estimated costs when node is cut at x_k = c (left: own + halo from
        the right within h of the cut + pairs it would own)."""
        m = members[node]
        right = xs64[m, k] >= c
        wl, wr = ws[m][~right].sum(), ws[m][right].sum()
        near_cut_r = right & (xs64[m, k] <= c + h_rel)
        halo_l = ws[m][near_cut_r & (is_b[m] if mode == "join" else True)].sum()
        halo_r = ws[m][~right & (xs64[m, k] >= c - h_rel) & is_b[m]].sum() if mode == "join" else 0.0
        o = owned[node]
        in_left = np.zeros(len(xs), bool)
        in_left[m[~right]] = True
        if mode == "self":
            to_left = in_left[P[o]] | in_left[Q[o]]
        else:
            to_left = in_left[P[o]]
        pl = pw[o][to_left].sum()
        pr = pw[o][~to_left].sum()
        return wl + halo_l + pair_cost * pl, wr + halo_r + pair_cost * pr, right, to_left

    while heap and leaves < max_leaves:
        negc, node = heapq.heappop(heap)
        c_node = -negc
        phase_one = leaves < partitions
        if not phase_one and c_node <= max_skew * target:
            heapq.heappush(heap, (negc, node))
            break
        m = members[node]
        best = None
        if len(m) >= 2:
            spread = np.ptp(xs64[m], axis=0) if len(m) else np.zeros(space_dims)
            q = np.percentile(xs64[m], [5, 95], axis=0)
            spread = np.where(q[1] - q[0] > 0, q[1] - q[0], spread)
            for k in np.argsort(-spread, kind="stable")[: min(space_dims, 4)]:
                if spread[k] <= 0:
                    continue
                c = _weighted_cut(xs64[m, k], pc[m])
                if c is None:
                    continue
                cl, cr, right, to_left = evaluate(node, int(k), c)
                worst = max(cl, cr)
                useful = worst <= 0.85 * c_node
                if (useful or phase_one) and (best is None or worst < best[0]):
                    best = (worst, int(k), c, cl, cr, right, to_left, useful)
        if best is None:
            unsplittable.add(node)
            continue
        _, k, c, cl, cr, right, to_left, useful = best
        ln, rn = len(dim_l), len(dim_l) + 1
        dim_l[node], cut_l[node], left_l[node], right_l[node] = k, c, ln, rn
        for _ in range(2):
            dim_l.append(0), cut_l.append(0.0), left_l.append(-1), right_l.append(-1)
        members[ln], members[rn] = m[~right], m[right]
        node_of[members[ln]], node_of[members[rn]] = ln, rn
        o = owned.pop(node)
        owned[ln], owned[rn] = o[to_left], o[~to_left]
        del members[node], cost[node]
        cost[ln], cost[rn] = cl, cr
        heapq.heappush(heap, (-cl, ln))
        heapq.heappush(heap, (-cr, rn))
        leaves += 1
        cut_dims[k] += 1
        if not phase_one:
            skew_splits += 1

    # Number leaves depth-first.
    leaf_id = [-1] * len(dim_l)
    order, stack = [], [0]
    while stack:
        nd = stack.pop()
        if left_l[nd] < 0:
            leaf_id[nd] = len(order)
            order.append(nd)
        else:
            stack.append(right_l[nd])
            stack.append(left_l[nd])
    max_cut = max([abs(c) for c, l in zip(cut_l, left_l) if l >= 0] or [0.0])
    h = h_rel + 2.0**-40 * max_cut
    tree = _Tree(dim_l, cut_l, left_l, right_l, leaf_id)
    L = tree.n_leaves

    # Estimates per leaf, by routing the sample exactly as the workers will route the data.
    if mode == "self":
        rows, lv, own = _route_rows(tree, xs64, h, "self")
    else:
        ra, la, oa = _route_rows(tree, xs64[~is_b], h, "a")
        rb, lb, ob = _route_rows(tree, xs64[is_b], h, "b")
        ia, ib = np.nonzero(~is_b)[0], np.nonzero(is_b)[0]
        rows, lv, own = np.concatenate([ia[ra], ib[rb]]), np.concatenate([la, lb]), np.concatenate([oa, ~ob])
    w_rows = ws[rows]
    own_pts = np.bincount(lv[own], weights=w_rows[own], minlength=L)
    other_pts = np.bincount(lv[~own], weights=w_rows[~own], minlength=L)
    home = tree.home(xs64)
    owner = np.minimum(home[P], home[Q]) if mode == "self" else home[P]
    leaf_pairs = np.bincount(owner, weights=pw, minlength=L)
    leaf_cost = own_pts + other_pts + pair_cost * leaf_pairs
    target = max(leaf_cost.sum() / partitions, 1.0)

    # Block splitting for leaves the tree could not cut usefully.
    blocks = np.ones(L, np.int64)
    for c in range(L):
        if leaf_cost[c] > max_skew * target:
            if mode == "self":
                k = math.ceil(math.sqrt(2.0 * leaf_cost[c] / target))
                blocks[c] = min(max(k, 2), MAX_BLOCKS_SELF)
            else:
                blocks[c] = min(max(math.ceil(leaf_cost[c] / target), 2), MAX_BLOCKS_JOIN)
    # Per-task estimates.
    t_leaf, t_own, t_other, t_pairs = [], [], [], []
    for c in range(L):
        k = int(blocks[c])
        pairs_of = [(i, i) for i in range(k)] if mode == "join" else [(i, j) for i in range(k) for j in range(i, k)]
        for i, j in pairs_of:
            t_leaf.append(c)
            if mode == "join":
                t_own.append(own_pts[c] / k)
                t_other.append(other_pts[c])
                t_pairs.append(leaf_pairs[c] / k)
            elif i == j:
                t_own.append(own_pts[c] / k)
                t_other.append(other_pts[c])
                t_pairs.append(leaf_pairs[c] / (k * k))
            else:
                t_own.append(2 * own_pts[c] / k)
                t_other.append(0.0)
                t_pairs.append(2 * leaf_pairs[c] / (k * k))
    t_own, t_other, t_pairs = np.array(t_own), np.array(t_other), np.array(t_pairs)
    t_cost = t_own + t_other + pair_cost * t_pairs

    def ratio(v):
        return float(v.max() / v.mean()) if len(v) and v.mean() > 0 else 1.0

    stats = {
        "mode": mode,
        "points": n_total[0] if mode == "self" else tuple(n_total),
        "dims": dims,
        # The coordinates the tree cuts: the rows', or their unit vectors' (cosine, haversine).
        "space_dims": space_dims,
        "eps": eps,
        "halo_width": h,
        "sample_size": int(len(xs)),
        "sample_pairs": int(len(P)),
        "estimated_pairs": est_pairs,
        "partitions": partitions,
        "leaves": L,
        "tasks": len(t_cost),
        "skew_splits": skew_splits,
        "split_leaves": int((blocks > 1).sum()),
        "cuts_per_dim": cut_dims.tolist(),
        "estimated_halo_copies": float(other_pts.sum()),
        "task_leaf": t_leaf,
        "task_points": (t_own + t_other).tolist(),
        "task_pairs": t_pairs.tolist(),
        "task_cost": t_cost.tolist(),
        "max_mean_points": ratio(t_own + t_other),
        "max_mean_pairs": ratio(t_pairs),
        "max_mean_cost": ratio(t_cost),
    }
    lengths = [s[0] for s in summaries]
    token = tuple(inp.token for inp in inputs)
    return Plan(mode, eps, metric, dims, dtype, tree, h, blocks.tolist(), stats, token, lengths, sphere_radius)


# --------------------------------------------------------------------------- public API


def plan(points, eps, *, points_b=None, metric="euclidean", partitions=None, columns=None,
         sample_size=20_000, max_skew=1.5, pair_cost=PAIR_COST, seed=0, sphere_radius=None):
    """Plans a self-join of `points` (or, with `points_b`, the join points x points_b)
    without running it: returns a ``Plan`` whose ``stats`` dict reports the balance
    (per-task estimated points and pairs, max/mean ratios). Reads the input once (a sample
    and the chunk lengths). ``partitions``: the number of leaves to aim for (None: at least
    the number of input chunks, more for big inputs); ``max_skew``: leaves or tasks
    estimated to cost more than this many times the mean are split further; ``pair_cost``:
    the cost of a pair relative to a point in the planner's cost model (0 cuts on point
    counts alone, ignoring where the pairs are: for comparison); ``sphere_radius``: as for
    ``self_join``."""
    inputs = [_Input(points, columns, "points")]
    if points_b is not None:
        inputs.append(_Input(points_b, columns, "points_b"))
    mode = "self" if points_b is None else "join"
    return _make_plan(mode, eps, metric, inputs, partitions, int(sample_size), float(max_skew), seed,
                      float(pair_cost), sphere_radius=sphere_radius)


def _meta(dtype, return_distance):
    cols = {"i": np.empty(0, np.int64), "j": np.empty(0, np.int64)}
    if return_distance:
        cols["distance"] = np.empty(0, dtype)
    return pd.DataFrame(cols)


def _build(mode, inputs, eps, metric, backend, return_distance, partitions, threads, the_plan,
           sphere_radius=None):
    metric = str(metric).lower()
    if backend.lower() not in _native.BACKENDS:
        raise _invalid(f"unknown backend {backend!r} (expected one of: {', '.join(_native.BACKENDS)})")
    if the_plan is None:
        the_plan = _make_plan(mode, eps, metric, inputs, partitions, 20_000, 1.5, 0,
                              sphere_radius=sphere_radius)
        lengths = the_plan._lengths
    else:
        if the_plan.mode != mode:
            raise _invalid(f"the plan is for a {the_plan.mode} join")
        if float(eps) != the_plan.eps or metric != the_plan.metric or sphere_radius != the_plan.sphere_radius:
            raise _invalid("the plan was made for another eps, metric or sphere_radius")
        if the_plan._token == tuple(i.token for i in inputs):
            lengths = the_plan._lengths
        else:
            lengths = [_lengths(i) for i in inputs]
        dtype = inputs[0].dtype if len(inputs) == 1 else np.result_type(inputs[0].dtype, inputs[1].dtype)
        for inp in inputs:
            if inp.dims is not None and inp.dims != the_plan.dims:
                raise _invalid(f"the plan is for {the_plan.dims} dimensions, the points have {inp.dims}")
            inp.dtype = np.dtype(dtype)
    dtype = inputs[0].dtype
    tree, h = the_plan.tree, the_plan.h
    L = tree.n_leaves
    roles = ["self"] if mode == "self" else ["a", "b"]
    per_leaf = [[] for _ in range(L)]
    for inp, role, lens in zip(inputs, roles, lengths):
        offsets = np.concatenate([[0], np.cumsum(lens)])[:-1]
        for part, off in zip(inp.parts, offsets):
            routed = dask.delayed(_route, pure=False)(part, int(off), dtype, tree, h, role, metric)
            for c in range(L):
                per_leaf[c].append(dask.delayed(_piece, pure=False)(routed, c))
    n_a = None if mode == "self" else len(inputs[0].parts)
    out = []
    for c in range(L):
        k = int(the_plan.blocks[c])
        spec = (mode, float(eps), metric, backend, threads, bool(return_distance), k, sphere_radius)
        if k == 1:
            out.append(dask.delayed(_leaf_join, pure=False)(spec, n_a, *per_leaf[c]))
            continue
        data = dask.delayed(_gather, pure=False)(n_a, *per_leaf[c])
        pairs_of = [(i, i) for i in range(k)] if mode == "join" else [(i, j) for i in range(k) for j in range(i, k)]
        out.extend(dask.delayed(_block, pure=False)(data, i, j, spec) for i, j in pairs_of)
    return dd.from_delayed(out, meta=_meta(dtype, return_distance), verify_meta=False)


def self_join(points, eps, *, metric="euclidean", backend="auto", return_distance=False, partitions=None,
              columns=None, threads=None, plan=None, sphere_radius=None):
    """All pairs of rows of `points` within distance `eps`, as a lazy dask.dataframe with
    columns i, j (int64 global row numbers, i < j) and, with return_distance=True,
    ``distance`` (computed with NumPy on the worker in the input's precision: float64 for
    float64 input, float32 for float32).

    points: a dask.array of shape (n, d) (a NumPy array is wrapped), or a dask.dataframe
    whose coordinate columns are named by `columns` (None: all columns). The pair set is
    exactly that of ``simjoin.self_join`` on the whole input; every pair appears once.
    Planning samples the input now (one pass over it: ``.persist()`` an expensive input
    first); the join runs when the result is computed or written (``.to_parquet()``).
    metric and backend are simjoin's; threads: the engine's CPU threads per worker process
    (None: all cores). partitions: see ``plan()``; plan: a ``Plan`` from ``plan()``.
    sphere_radius: haversine's sphere in metres, as for ``simjoin.self_join`` (None: the
    Earth's mean radius).
    """
    return _build("self", [_Input(points, columns, "points")], eps, metric, backend, return_distance,
                  partitions, threads, plan, sphere_radius)


def join(points_a, points_b, eps, *, metric="euclidean", backend="auto", return_distance=False, partitions=None,
         columns=None, threads=None, plan=None, sphere_radius=None):
    """All pairs (i, j), row i of points_a and row j of points_b, within distance `eps`, as a
    lazy dask.dataframe (columns i, j, optionally distance); the pair set is exactly that of
    ``simjoin.join``. A float32 input joined with a float64 one is joined in float64.
    Keywords as for ``self_join``."""
    inputs = [_Input(points_a, columns, "points_a"), _Input(points_b, columns, "points_b")]
    return _build("join", inputs, eps, metric, backend, return_distance, partitions, threads, plan, sphere_radius)
