//! The CPU's exact k-nearest-neighbour join: a k-d tree (median splits on the widest
//! dimension, small leaves, points copied into leaf order) searched depth-first, nearest
//! child first, with the classic incremental distance to the far child's half-space
//! (Arya & Mount). Queries run in parallel, in the tree's leaf order for a self-kNN (close
//! queries share cache lines and search paths), and every candidate is measured with the
//! canonical arithmetic of `metric.rs`, so the answer is the one `knn.rs` defines, bit for bit.
//!
//! Exactness of the pruning: a subtree is skipped only when its lower bound, computed in
//! f64, exceeds the current k-th accumulator by a relative margin that covers the rounding
//! of both (see `prune_bound`); candidates at exactly the k-th distance are always visited,
//! so ties go to the smaller index. Brute force (`algorithm = brute`) scans every point.

use super::store::{Chebyshev, Euclid, Manhattan, MetricKind};
use crate::dataset::Coords;
use crate::error::{Error, Result};
use crate::grid::GridGeometry;
use crate::knn::{alloc_stoppable, finish_distances, key_less, KnnJob, KnnResult};
use crate::metric::{accumulate, reject_margin, Coord};
use crate::options::{Algorithm, Metric};
use crate::result::Distances;
use crate::result::JoinReport;
use rayon::prelude::*;
use std::time::Instant;

/// Points per leaf: small enough that pruning works, large enough that leaf scans (tight
/// loops over contiguous coordinates) dominate the tree walk.
const LEAF: usize = 24;
/// Queries per parallel task.
const CHUNK: usize = 512;
/// From this many dimensions, Euclidean kNN compares blocks of queries with blocks of
/// points through the f32 dot-product filter (`filtered`), confirming survivors exactly.
/// Measured (bench/KNN_RESULTS.md, CPU seconds, 200k points, k = 16): 8-D uniform 4.3 vs
/// the k-d tree's 5.9, exponential 4.4 vs 7.3, clusters 1.3 vs 2.8; 6-D uniform 1.9 vs 2.1.
const FILTER_MIN_DIM: usize = 8;
/// `auto` considers the grid up to this many dimensions (measured: it loses from 4-D on,
/// where its 3 indexed dimensions bound too little).
const GRID_AUTO_MAX_DIM: usize = 3;
/// `auto` leaves the grid when a point's cell holds more than this many times the points
/// evenly spread data would put there (measured: uniform ~1 wins, exponential 3-D ~190
/// loses; clusters in between).
const GRID_AUTO_MAX_CROWDING: f64 = 8.0;

mod filtered;
mod grid;

pub(crate) fn run(job: &KnnJob, threads: usize) -> Result<KnnResult> {
    let mut notes = Vec::new();
    let (algorithm, geom) = match job.opts.algorithm {
        Algorithm::KdTree => (Algorithm::KdTree, None),
        Algorithm::Brute => (Algorithm::Brute, None),
        Algorithm::Grid => (Algorithm::Grid, Some(grid::geometry(&job.data, job.k)?.0)),
        Algorithm::Auto => choose(job, &mut notes)?,
        other => {
            return Err(Error::unsupported(format!(
                "the CPU backend has no '{other}' kNN algorithm (use auto, kdtree, grid or brute)"
            )))
        }
    };
    let plan = Plan {
        algorithm,
        geom: geom.as_ref(),
    };
    let mut result = match (job.data.coords(), job.query.map(|q| q.coords())) {
        (Coords::F32(d), None) => by_metric::<f32>(job, d, None, plan),
        (Coords::F32(d), Some(Coords::F32(q))) => by_metric::<f32>(job, d, Some(q), plan),
        (Coords::F64(d), None) => by_metric::<f64>(job, d, None, plan),
        (Coords::F64(d), Some(Coords::F64(q))) => by_metric::<f64>(job, d, Some(q), plan),
        _ => Err(Error::invalid(
            "data and queries must have the same precision",
        )),
    }?;
    notes.append(&mut result.report.notes);
    result.report.notes = notes;
    result.report.backend = "cpu".into();
    result.report.device = format!("cpu ({threads} threads)");
    result.report.algorithm = algorithm;
    result.report.batches = 1;
    Ok(result)
}

/// `auto`: the grid where it measured faster than the k-d tree (bench/KNN_RESULTS.md: up
/// to 3-D on evenly spread data, 1.3-1.7x), else the k-d tree. Skewed or clustered data
/// crowd the grid's cells (sized from the bounding box), which a sample measures.
fn choose(job: &KnnJob, notes: &mut Vec<String>) -> Result<(Algorithm, Option<GridGeometry>)> {
    let dim = job.data.dim();
    if dim > GRID_AUTO_MAX_DIM {
        notes.push(if dim >= FILTER_MIN_DIM && job.opts.metric == Metric::Euclidean {
            format!(
                "auto: k-d tree order, blocks through the dot-product filter ({dim} dimensions >= {FILTER_MIN_DIM})"
            )
        } else {
            format!(
                "auto: k-d tree, {dim} dimensions > {GRID_AUTO_MAX_DIM} (the grid wins only below)"
            )
        });
        return Ok((Algorithm::KdTree, None));
    }
    let (geom, crowd) = grid::geometry(&job.data, job.k)?;
    if crowd > GRID_AUTO_MAX_CROWDING {
        notes.push(format!(
            "auto: k-d tree, the data crowd the grid's cells {crowd:.1}x more than evenly spread points (> {GRID_AUTO_MAX_CROWDING})"
        ));
        return Ok((Algorithm::KdTree, None));
    }
    notes.push(format!(
        "auto: grid, {dim} dimensions, cells crowded {crowd:.1}x evenly spread points"
    ));
    Ok((Algorithm::Grid, Some(geom)))
}

/// The algorithm to run, and the grid's geometry when it is the grid.
#[derive(Clone, Copy)]
struct Plan<'g> {
    algorithm: Algorithm,
    geom: Option<&'g GridGeometry>,
}

/// The distances array of the input precision.
pub(crate) trait DistanceType: Coord {
    fn wrap(v: Vec<Self>) -> Distances;
}
impl DistanceType for f32 {
    fn wrap(v: Vec<f32>) -> Distances {
        Distances::F32(v)
    }
}
impl DistanceType for f64 {
    fn wrap(v: Vec<f64>) -> Distances {
        Distances::F64(v)
    }
}

fn by_metric<T: DistanceType>(
    job: &KnnJob,
    data: &[T],
    query: Option<&[T]>,
    plan: Plan,
) -> Result<KnnResult> {
    match job.opts.metric {
        Metric::Euclidean => knn::<T, Euclid>(job, data, query, plan),
        Metric::Manhattan => knn::<T, Manhattan>(job, data, query, plan),
        Metric::Chebyshev => knn::<T, Chebyshev>(job, data, query, plan),
        Metric::Cosine => Err(Error::unsupported("no cosine kNN")),
        Metric::Haversine => unreachable!("haversine kNN runs as Euclidean (src/geo.rs)"),
    }
}

fn knn<T: DistanceType, M: MetricKind>(
    job: &KnnJob,
    data: &[T],
    query: Option<&[T]>,
    plan: Plan,
) -> Result<KnnResult> {
    let algorithm = plan.algorithm;
    let dim = job.data.dim();
    let k = job.k;
    let rows = job.rows();
    let control = &job.opts.control;
    let mut indices = alloc_stoppable(rows * k, 0u32, "index array", control)?;
    let mut acc = alloc_stoppable(rows * k, T::ZERO, "distance array", control)?;
    let mut phases = Vec::new();
    let mut notes = Vec::new();
    // The filtered search, or the tree search below it; the result is assembled once.
    'search: {
        if rows == 0 {
            break 'search;
        }
        let t0 = Instant::now();
        if let Some(geom) = plan.geom {
            notes.push(grid::search::<T, M>(
                geom,
                data,
                query,
                dim,
                k,
                &mut indices,
                &mut acc,
                &job.opts.control,
            )?);
            phases.push(("search".to_string(), t0.elapsed().as_secs_f64()));
            break 'search;
        }
        if algorithm == Algorithm::KdTree && M::METRIC == Metric::Euclidean && dim >= FILTER_MIN_DIM
        {
            if let Some(done) = filtered::search(
                data,
                query,
                dim,
                k,
                &mut indices,
                &mut acc,
                &job.opts.control,
            )? {
                phases.push(("search".to_string(), t0.elapsed().as_secs_f64()));
                notes.push(done);
                break 'search;
            }
            notes.push("dot-product filter not usable (norms too large): plain k-d tree".into());
        }
        let tree = match algorithm {
            Algorithm::Brute => Tree::flat(data, dim),
            _ => Tree::build(data, dim),
        };
        phases.push(("index build".to_string(), t0.elapsed().as_secs_f64()));
        notes.push(format!(
            "{} nodes, {} points per leaf at most",
            tree.nodes.len(),
            tree.leaf_size()
        ));
        let t1 = Instant::now();
        // Query order: the tree's leaf order for a self-kNN; for A-to-B, the order of a
        // tree built over the queries (close queries next to each other).
        let (qpts, qids): (std::borrow::Cow<[T]>, std::borrow::Cow<[u32]>) = match query {
            None => (tree.pts.as_slice().into(), tree.ids.as_slice().into()),
            Some(q) => {
                let qt = Tree::build(q, dim);
                (qt.pts.into(), qt.ids.into())
            }
        };
        let self_join = query.is_none();
        let (thr_margin, slack) = prune_margins::<T>(dim);
        // Results in query-order position, gathered into rows afterwards.
        let mut pos_idx = alloc_stoppable(rows * k, 0u32, "index array", control)?;
        let mut pos_acc = alloc_stoppable(rows * k, T::ZERO, "distance array", control)?;
        control.stage("knn", rows.div_ceil(CHUNK) as u64);
        pos_idx
            .par_chunks_mut(CHUNK * k)
            .zip(pos_acc.par_chunks_mut(CHUNK * k))
            .enumerate()
            .for_each(|(c, (out_i, out_a))| {
                let mut s = Searcher::<T, M> {
                    tree: &tree,
                    q: &[],
                    skip: u32::MAX,
                    heap: Heap::new(k),
                    off: vec![0.0; dim],
                    margin: thr_margin,
                    slack,
                    _m: std::marker::PhantomData,
                };
                let first = c * CHUNK;
                let n = out_i.len() / k;
                for (r, (oi, oa)) in out_i.chunks_mut(k).zip(out_a.chunks_mut(k)).enumerate() {
                    // A stop leaves the chunk's other rows unset: the caller discards them.
                    if control.check().is_err() {
                        return;
                    }
                    let p = first + r;
                    s.q = &qpts[p * dim..(p + 1) * dim];
                    s.skip = if self_join { qids[p] } else { u32::MAX };
                    s.heap.clear();
                    s.off.iter_mut().for_each(|o| *o = 0.0);
                    s.search(0, 0.0);
                    s.heap.drain_sorted(oi, oa);
                }
                control.advance(1, n as u64);
            });
        control.check()?;
        gather_rows(&qids, k, &pos_idx, &pos_acc, &mut indices, &mut acc);
        phases.push(("search".to_string(), t1.elapsed().as_secs_f64()));
    }
    finish_distances(M::METRIC, &mut acc);
    Ok(KnnResult {
        rows,
        k,
        indices,
        distances: T::wrap(acc),
        report: JoinReport {
            pairs: (rows * k) as u64,
            phases,
            notes,
            ..Default::default()
        },
    })
}

/// The pruning rule's constants for `dim` dimensions: a region at lower bound `rd` (f64)
/// may hold a candidate that enters a full heap iff `rd <= worst * margin + slack`.
/// Rounding: the canonical accumulator of a point at real distance D is at least
/// D (1 - (d+1)u) and a bound computed in f64 is at most the real one (1 + 1e-13); `margin`
/// covers both. `slack` covers terms that underflow to zero in T (f32 squares below ~1e-45).
fn prune_margins<T: Coord>(dim: usize) -> (f64, f64) {
    (
        1.0 + 2.0 * reject_margin::<T>(dim) + 1e-13,
        (dim + 2) as f64 * 1e-44,
    )
}

/// Copies answers computed in query order (position p is query `qids[p]`) into rows.
fn gather_rows<T: Coord>(
    qids: &[u32],
    k: usize,
    pos_idx: &[u32],
    pos_acc: &[T],
    indices: &mut [u32],
    acc: &mut [T],
) {
    unpermute_rows(qids, k, indices, acc, |p, oi, oa| {
        oi.copy_from_slice(&pos_idx[p * k..(p + 1) * k]);
        oa.copy_from_slice(&pos_acc[p * k..(p + 1) * k]);
    });
}

/// Fills rows `indices` / `acc` (k per row, in the rows' order) from answers kept in a
/// search's order, where position p answered row `ids[p]`: `fill(p, row's indices, row's
/// accumulators)`, rows in parallel.
fn unpermute_rows<T: Coord>(
    ids: &[u32],
    k: usize,
    indices: &mut [u32],
    acc: &mut [T],
    fill: impl Fn(usize, &mut [u32], &mut [T]) + Sync,
) {
    let mut position_of = vec![0u32; ids.len()];
    for (p, &id) in ids.iter().enumerate() {
        position_of[id as usize] = p as u32;
    }
    indices
        .par_chunks_mut(k)
        .zip(acc.par_chunks_mut(k))
        .zip(position_of.par_iter())
        .for_each(|((oi, oa), &p)| fill(p as usize, oi, oa));
}

/// A node: an inner node splits on `dim` at `split` (left: coordinate <= split, right:
/// >= split); a leaf (`left == LEAF_MARK`) holds points `start..end` of the leaf order.
#[derive(Clone, Copy)]
struct Node {
    dim: u32,
    left: u32,
    right: u32,
    start: u32,
    end: u32,
    split: f64,
}
const LEAF_MARK: u32 = u32::MAX;

struct Tree<T> {
    nodes: Vec<Node>,
    /// Coordinates in leaf order.
    pts: Vec<T>,
    /// Original index of each point in leaf order.
    ids: Vec<u32>,
    dim: usize,
}

impl<T: Coord> Tree<T> {
    fn leaf_size(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.left == LEAF_MARK)
            .map(|n| (n.end - n.start) as usize)
            .max()
            .unwrap_or(0)
    }

    /// One leaf holding every point: the search degenerates into an exact brute force.
    fn flat(data: &[T], dim: usize) -> Self {
        let n = data.len() / dim;
        Tree {
            nodes: vec![Node {
                dim: 0,
                left: LEAF_MARK,
                right: LEAF_MARK,
                start: 0,
                end: n as u32,
                split: 0.0,
            }],
            pts: data.to_vec(),
            ids: (0..n as u32).collect(),
            dim,
        }
    }

    fn build(data: &[T], dim: usize) -> Self {
        Self::build_with(data, dim, LEAF)
    }

    /// A tree whose leaves hold at most `leaf` points.
    fn build_with(data: &[T], dim: usize, leaf: usize) -> Self {
        let n = data.len() / dim;
        let mut perm: Vec<u32> = (0..n as u32).collect();
        let mut nodes = Vec::with_capacity(2 * n / leaf + 2);
        build_node(data, dim, &mut perm, 0, leaf, &mut nodes);
        let mut pts = Vec::with_capacity(n * dim);
        for &i in &perm {
            pts.extend_from_slice(&data[i as usize * dim..(i as usize + 1) * dim]);
        }
        Tree {
            nodes,
            pts,
            ids: perm,
            dim,
        }
    }
}

/// Builds the subtree over `perm` (positions `start..` of the leaf order) into `nodes`,
/// returning its node number. Large subtrees build their halves in parallel.
fn build_node<T: Coord>(
    data: &[T],
    dim: usize,
    perm: &mut [u32],
    start: usize,
    leaf_max: usize,
    nodes: &mut Vec<Node>,
) -> u32 {
    let me = nodes.len() as u32;
    let leaf = Node {
        dim: 0,
        left: LEAF_MARK,
        right: LEAF_MARK,
        start: start as u32,
        end: (start + perm.len()) as u32,
        split: 0.0,
    };
    nodes.push(leaf);
    if perm.len() <= leaf_max {
        return me;
    }
    // The widest dimension of this subset (rows read whole, in order: a column at a time
    // would touch a cache line per point and dimension).
    let coord = |i: u32, d: usize| data[i as usize * dim + d].to_f64();
    let mut lo = vec![f64::INFINITY; dim];
    let mut hi = vec![f64::NEG_INFINITY; dim];
    for &i in perm.iter() {
        let row = &data[i as usize * dim..(i as usize + 1) * dim];
        for ((l, h), x) in lo.iter_mut().zip(hi.iter_mut()).zip(row) {
            let x = x.to_f64();
            *l = l.min(x);
            *h = h.max(x);
        }
    }
    let mut best = (0usize, -1.0f64);
    for d in 0..dim {
        if hi[d] - lo[d] > best.1 {
            best = (d, hi[d] - lo[d]);
        }
    }
    if best.1 <= 0.0 {
        // Every point identical: nothing to split on.
        return me;
    }
    let sd = best.0;
    let mid = perm.len() / 2;
    perm.select_nth_unstable_by(mid, |&a, &b| coord(a, sd).total_cmp(&coord(b, sd)));
    let split = coord(perm[mid], sd);
    let (lp, rp) = perm.split_at_mut(mid);
    // In parallel where the halves are large (by coordinates read: high dimensions too).
    let (left, right) = if (lp.len() + rp.len()) * dim.max(8) > 1 << 19 {
        let (mut ln, mut rn) = (Vec::new(), Vec::new());
        rayon::join(
            || build_node(data, dim, lp, start, leaf_max, &mut ln),
            || build_node(data, dim, rp, start + mid, leaf_max, &mut rn),
        );
        // Splice the two subtrees in, renumbering their links.
        let lbase = nodes.len() as u32;
        let rbase = lbase + ln.len() as u32;
        for (nodes_of, base) in [(ln, lbase), (rn, rbase)] {
            nodes.extend(nodes_of.into_iter().map(|mut n| {
                if n.left != LEAF_MARK {
                    n.left += base;
                    n.right += base;
                }
                n
            }));
        }
        (lbase, rbase)
    } else {
        let l = build_node(data, dim, lp, start, leaf_max, nodes);
        let r = build_node(data, dim, rp, start + mid, leaf_max, nodes);
        (l, r)
    };
    nodes[me as usize] = Node {
        dim: sd as u32,
        left,
        right,
        start: start as u32,
        end: (start + perm.len()) as u32,
        split,
    };
    me
}

/// The k best candidates so far, by (accumulator, index). Up to `SORTED_MAX` it is a sorted
/// array (insertion by shifting; no final sort), beyond a binary max-heap.
struct Heap<T> {
    k: usize,
    sorted: bool,
    items: Vec<(T, u32)>,
}

/// Largest k kept as a sorted array.
const SORTED_MAX: usize = 48;

impl<T: Coord> Heap<T> {
    fn new(k: usize) -> Self {
        Heap {
            k,
            sorted: k <= SORTED_MAX,
            items: Vec::with_capacity(k + 1),
        }
    }
    fn clear(&mut self) {
        self.items.clear();
    }
    fn full(&self) -> bool {
        self.items.len() == self.k
    }
    /// The k-th candidate (the bound), when full.
    #[inline(always)]
    fn worst_item(&self) -> (T, u32) {
        if self.sorted {
            self.items[self.items.len() - 1]
        } else {
            self.items[0]
        }
    }
    /// The k-th accumulator, when full.
    #[inline(always)]
    fn worst(&self) -> T {
        self.worst_item().0
    }
    #[inline]
    fn offer(&mut self, item: (T, u32)) {
        if self.sorted {
            let h = &mut self.items;
            if h.len() == self.k {
                if !key_less(item, h[h.len() - 1]) {
                    return;
                }
                h.pop();
            }
            // Shift larger entries up by one (k is small: a short linear walk).
            let mut i = h.len();
            h.push(item);
            while i > 0 && key_less(item, h[i - 1]) {
                h[i] = h[i - 1];
                i -= 1;
            }
            h[i] = item;
            return;
        }
        let h = &mut self.items;
        if h.len() < self.k {
            // Sift up.
            h.push(item);
            let mut i = h.len() - 1;
            while i > 0 {
                let parent = (i - 1) / 2;
                if key_less(h[parent], h[i]) {
                    h.swap(parent, i);
                    i = parent;
                } else {
                    break;
                }
            }
        } else if key_less(item, h[0]) {
            // Replace the worst and sift down.
            h[0] = item;
            let n = h.len();
            let mut i = 0;
            loop {
                let (l, r) = (2 * i + 1, 2 * i + 2);
                let mut big = i;
                if l < n && key_less(h[big], h[l]) {
                    big = l;
                }
                if r < n && key_less(h[big], h[r]) {
                    big = r;
                }
                if big == i {
                    break;
                }
                h.swap(i, big);
                i = big;
            }
        }
    }
    /// The candidates nearest first (the heap is left empty).
    fn take_sorted(&mut self) -> std::vec::Drain<'_, (T, u32)> {
        if !self.sorted {
            self.items
                .sort_unstable_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1)));
        }
        self.items.drain(..)
    }
    /// Writes the candidates nearest first and empties the heap.
    fn drain_sorted(&mut self, idx: &mut [u32], acc: &mut [T]) {
        for (c, (a, i)) in self.take_sorted().enumerate() {
            idx[c] = i;
            acc[c] = a;
        }
    }
}

struct Searcher<'t, T, M> {
    tree: &'t Tree<T>,
    q: &'t [T],
    /// The query's own index (self-kNN), excluded.
    skip: u32,
    heap: Heap<T>,
    /// Per dimension, the query's offset to the current cell (the incremental bound).
    off: Vec<f64>,
    margin: f64,
    slack: f64,
    _m: std::marker::PhantomData<M>,
}

impl<T: Coord, M: MetricKind> Searcher<'_, T, M> {
    /// Whether a region at lower bound `rd` (f64) may hold a candidate that enters the
    /// heap (see `prune_margins`).
    #[inline(always)]
    fn may_enter(&self, rd: f64) -> bool {
        !self.heap.full() || rd <= self.heap.worst().to_f64() * self.margin + self.slack
    }

    fn search(&mut self, node: u32, rd: f64) {
        let n = self.tree.nodes[node as usize];
        if n.left == LEAF_MARK {
            self.scan(n.start as usize, n.end as usize);
            return;
        }
        let sd = n.dim as usize;
        let diff = self.q[sd].to_f64() - n.split;
        let (near, far) = if diff <= 0.0 {
            (n.left, n.right)
        } else {
            (n.right, n.left)
        };
        self.search(near, rd);
        let old = self.off[sd];
        let far_rd = match M::METRIC {
            Metric::Euclidean => rd - old * old + diff * diff,
            Metric::Manhattan => rd - old.abs() + diff.abs(),
            Metric::Chebyshev => rd.max(diff.abs()),
            Metric::Cosine => unreachable!("no cosine kNN in the k-d tree"),
            Metric::Haversine => unreachable!("haversine kNN runs as Euclidean (src/geo.rs)"),
        };
        if self.may_enter(far_rd) {
            self.off[sd] = diff;
            self.search(far, far_rd);
            self.off[sd] = old;
        }
    }

    #[inline]
    fn scan(&mut self, start: usize, end: usize) {
        let dim = self.tree.dim;
        let pts = &self.tree.pts[start * dim..end * dim];
        let ids = &self.tree.ids[start..end];
        for (p, &id) in pts.chunks_exact(dim).zip(ids) {
            if id == self.skip {
                continue;
            }
            if self.heap.full() {
                // Canonical accumulation with an exact early exit (partial sums never
                // decrease): above the k-th accumulator it cannot enter.
                let bound = self.heap.worst();
                let mut acc = T::ZERO;
                let mut out = false;
                for (cq, cp) in self.q.chunks(8).zip(p.chunks(8)) {
                    for (&x, &y) in cq.iter().zip(cp) {
                        acc = accumulate(M::METRIC, acc, x, y);
                    }
                    if acc > bound {
                        out = true;
                        break;
                    }
                }
                if !out {
                    self.heap.offer((acc, id));
                }
            } else {
                let mut acc = T::ZERO;
                for (&x, &y) in self.q.iter().zip(p) {
                    acc = accumulate(M::METRIC, acc, x, y);
                }
                self.heap.offer((acc, id));
            }
        }
    }
}
