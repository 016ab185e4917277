//! Grid kNN: a uniform grid over the few dimensions of highest variance (the eps-join's
//! `GridGeometry` and `GridIndex`), cells sized from the density so that a cell and its
//! neighbours hold about k points. Each query scans rings of cells of growing Chebyshev
//! radius around its own cell (a row of cells along the last indexed dimension is one
//! contiguous slot range) and stops once the k-th accumulator is below the lower bound of
//! every cell not yet visited.
//!
//! Exactness: a cell is skipped, and the search stops, only on a lower bound in the indexed
//! dimensions (the gap from the query to a cell's slab per axis, shrunk by `BOUNDARY_TOL`
//! for the rounding of cell assignment, combined by the metric) compared with the k-th
//! accumulator through `prune_margins`; candidates are measured with the canonical kernel
//! of `store.rs` and ordered by (accumulator, index), so the answer is `knn.rs`'s.

use super::{gather_rows, prune_margins, Heap, CHUNK};
use crate::control::Control;
use crate::cpu::grid::GridIndex;
use crate::cpu::store::{scan_acc, MetricKind};
use crate::dataset::Dataset;
use crate::error::Result;
use crate::grid::GridGeometry;
use crate::knn::alloc_stoppable;
use crate::metric::Coord;
use crate::options::Metric;
use crate::stats::{bounds_and_variance, order_by_variance};
use rayon::prelude::*;

/// Most dimensions indexed: 3 keeps a ring's rows ((2R+1)^2 of them) cheap to enumerate.
const MAX_INDEXED: usize = 3;
/// Points per cell, as a share of k / 3^g (g indexed dimensions): 1 puts about k points in
/// a cell's 3^g neighbourhood. Measured on uniform 2-D and 3-D, 300k points, k = 1 to 64:
/// 2 to 4 best (0.5 and 16 up to 25% slower).
const NEIGHBOURHOOD_SHARE: f64 = 2.0;
/// Fewest points per cell on average (small k would otherwise make most cells empty).
const MIN_CELL_POINTS: f64 = 0.5;
/// Points sampled to measure crowding.
const SAMPLE: usize = 1 << 16;
/// Relative rounding allowance of a cell boundary: cell coordinates are `floor((x -
/// origin) / width)` in f64, so a point may sit a few ulps of (|origin| + |x|) outside its
/// cell's exact slab; the gaps are shrunk by this much of the magnitudes involved.
const BOUNDARY_TOL: f64 = 8.0 * f64::EPSILON;

/// The grid for a kNN of `k` over `data`: the min(d, MAX_INDEXED) dimensions of highest
/// variance, square cells whose width gives each about `NEIGHBOURHOOD_SHARE * k / 3^g`
/// points if the points filled their bounding box evenly (an axis narrower than a cell
/// leaves that estimate: it has one cell). Returns the grid and its crowding (see
/// [`crowding`]) over that of evenly spread points: near 1 for uniform data, large for
/// clusters and skew, where cells sized from the bounding box are far too wide where the
/// points are (shrinking them was measured slower still: sparse regions then need many
/// rings).
pub(super) fn geometry(data: &Dataset, k: usize) -> Result<(GridGeometry, f64)> {
    let (lo, hi, var) = bounds_and_variance(data, None);
    let order = order_by_variance(&var);
    let g = data.dim().min(MAX_INDEXED);
    let dims = &order[..g];
    let n = data.len().max(1) as f64;
    let per_cell = (NEIGHBOURHOOD_SHARE * k as f64 / 3f64.powi(g as i32)).max(MIN_CELL_POINTS);
    let mut extents: Vec<f64> = dims
        .iter()
        .map(|&j| hi[j] - lo[j])
        .filter(|&e| e > 0.0)
        .collect();
    let mut width = 1.0;
    while !extents.is_empty() {
        // In logarithms: products of extents may overflow.
        let log_volume: f64 = extents.iter().map(|e| e.ln()).sum();
        width = ((log_volume + (per_cell / n).ln()) / extents.len() as f64).exp();
        let before = extents.len();
        extents.retain(|&e| e > width);
        if extents.len() == before {
            break;
        }
    }
    let geom = GridGeometry::new(dims, &lo, &hi, width)?;
    // Evenly spread points crowd a cell like a Poisson count: per_cell + 1 per point.
    let crowd = crowding(data, &geom) / (per_cell + 1.0);
    Ok((geom, crowd))
}

/// The grid's crowding: the mean number of points in a point's cell (the cost of a scan
/// per query), estimated from an evenly strided sample of at most `SAMPLE` points.
fn crowding(data: &Dataset, geom: &GridGeometry) -> f64 {
    let n = data.len();
    let step = n.div_ceil(SAMPLE).max(1);
    let mut counts = std::collections::HashMap::<Vec<u64>, u64>::new();
    let mut cell = vec![0; geom.k()];
    for i in (0..n).step_by(step) {
        geom.point_coords(data, i, &mut cell);
        *counts.entry(cell.clone()).or_default() += 1;
    }
    let s = counts.values().sum::<u64>() as f64;
    if s == 0.0 {
        return 0.0;
    }
    // A sample of fraction f sees count c as Binomial(c, f): E[c_s^2] = f^2 c^2 + f(1-f) c.
    let f = s / n as f64;
    let sq: f64 = counts.values().map(|&c| (c * c) as f64).sum();
    ((sq - (1.0 - f) * s) / (f * s)).max(1.0)
}

/// Searches every query into row-major `indices` / `acc` (accumulators). Returns a note.
#[allow(clippy::too_many_arguments)]
pub(super) fn search<T: Coord, M: MetricKind>(
    geom: &GridGeometry,
    data: &[T],
    query: Option<&[T]>,
    dim: usize,
    k: usize,
    indices: &mut [u32],
    acc: &mut [T],
    control: &Control,
) -> Result<String> {
    let idx = GridIndex::build(data, dim, geom);
    control.check()?;
    // Queries in cell order (close queries share cells): the index itself for a self-kNN.
    let qidx = query.map(|q| GridIndex::build(q, dim, geom));
    let queries = qidx.as_ref().unwrap_or(&idx);
    let rows = queries.store.n;
    let self_join = query.is_none();
    let (margin, slack) = prune_margins::<T>(dim);
    let mut pos_idx = alloc_stoppable(rows * k, 0u32, "index array", control)?;
    let mut pos_acc = alloc_stoppable(rows * k, T::ZERO, "distance array", control)?;
    control.stage("knn", rows.div_ceil(CHUNK) as u64);
    pos_idx
        .par_chunks_mut(CHUNK * k)
        .zip(pos_acc.par_chunks_mut(CHUNK * k))
        .enumerate()
        .for_each(|(c, (out_i, out_a))| {
            let mut s = Search::<T, M> {
                geom,
                idx: &idx,
                heap: Heap::new(k),
                q: vec![T::ZERO; dim],
                pos: vec![0.0; geom.k()],
                cell: vec![0; geom.k()],
                lead: vec![0; geom.k()],
                skip: u32::MAX,
                margin,
                slack,
                early: dim > 4,
                _m: std::marker::PhantomData,
            };
            let first = c * CHUNK;
            let rows = out_i.len() / k;
            for (r, (oi, oa)) in out_i.chunks_mut(k).zip(out_a.chunks_mut(k)).enumerate() {
                // A stop leaves the rest of the chunk's rows unset: the caller discards them.
                if control.check().is_err() {
                    return;
                }
                let slot = first + r;
                queries.store.point(slot, &mut s.q);
                s.skip = if self_join {
                    queries.store.ids[slot]
                } else {
                    u32::MAX
                };
                s.run();
                s.heap.drain_sorted(oi, oa);
            }
            control.advance(1, rows as u64);
        });
    control.check()?;
    gather_rows(
        &queries.store.ids[..rows],
        k,
        &pos_idx,
        &pos_acc,
        indices,
        acc,
    );
    Ok(format!(
        "grid: indexed dims {:?}, cell width {:.3e}, cells per dim {:?}, {} non-empty cells",
        geom.dims,
        geom.width[0],
        geom.cells,
        idx.cell_ids.len()
    ))
}

/// One worker's state: the current query and its heap.
struct Search<'a, T, M> {
    geom: &'a GridGeometry,
    idx: &'a GridIndex<T>,
    heap: Heap<T>,
    /// The query's coordinates (dataset order).
    q: Vec<T>,
    /// Per indexed axis: the query's coordinate (f64) and cell (clamped into the grid).
    pos: Vec<f64>,
    cell: Vec<u64>,
    /// The leading axes' cells of the ring row being visited.
    lead: Vec<u64>,
    /// The query's own index (self-kNN), excluded.
    skip: u32,
    margin: f64,
    slack: f64,
    early: bool,
    _m: std::marker::PhantomData<M>,
}

impl<T: Coord, M: MetricKind> Search<'_, T, M> {
    fn run(&mut self) {
        self.heap.clear();
        for (a, &j) in self.geom.dims.iter().enumerate() {
            self.pos[a] = self.q[j].to_f64();
            self.cell[a] = self.geom.coord(a, self.pos[a]);
        }
        for r in 0.. {
            self.ring(r);
            // The nearest cell beyond ring r, over every axis and direction that has one.
            let mut beyond = f64::INFINITY;
            for a in 0..self.geom.k() {
                let c = self.cell[a];
                if c + r + 1 < self.geom.cells[a] {
                    beyond = beyond.min(term::<M>(self.gap(a, c + r + 1)));
                }
                if c > r {
                    beyond = beyond.min(term::<M>(self.gap(a, c - r - 1)));
                }
            }
            if beyond == f64::INFINITY || !self.may_enter(beyond) {
                return;
            }
        }
    }

    /// Whether a region at lower bound `rd` may hold a candidate that enters the heap.
    #[inline(always)]
    fn may_enter(&self, rd: f64) -> bool {
        !self.heap.full() || rd <= self.heap.worst().to_f64() * self.margin + self.slack
    }

    /// Lower bound of |x - query| along indexed axis `a` for points x of cell `c`.
    #[inline]
    fn gap(&self, a: usize, c: u64) -> f64 {
        let g = self.geom;
        let (q, own) = (self.pos[a], self.cell[a]);
        let edge = |c: u64| g.origin[a] + c as f64 * g.width[a];
        let (gap, b) = if c > own {
            let b = edge(c);
            (b - q, b)
        } else if c < own {
            let b = edge(c + 1);
            (q - b, b)
        } else {
            return 0.0;
        };
        (gap - BOUNDARY_TOL * (g.origin[a].abs() + b.abs() + q.abs())).max(0.0)
    }

    /// Visits the cells at Chebyshev cell distance exactly `r` from the query's cell, row
    /// by row along the last indexed axis, skipping rows and cells the bound excludes.
    fn ring(&mut self, r: u64) {
        let g = self.geom;
        let last = g.k() - 1;
        for a in 0..last {
            self.lead[a] = self.span(a, r).0;
        }
        loop {
            // This row's bound in the leading axes; on the ring's surface if one of them
            // is r away, else only the row's two end cells belong to the ring.
            let mut rd = 0.0;
            let mut surface = r == 0;
            let mut base = 0u64;
            for a in 0..last {
                let c = self.lead[a];
                rd = combine::<M>(rd, term::<M>(self.gap(a, c)));
                surface |= c.abs_diff(self.cell[a]) == r;
                base = base * g.cells[a] + c;
            }
            if self.may_enter(rd) {
                base *= g.cells[last];
                let x = self.cell[last];
                let (mut lo, mut hi) = self.span(last, r);
                let near =
                    |s: &Self, c: u64| s.may_enter(combine::<M>(rd, term::<M>(s.gap(last, c))));
                if surface {
                    // Trim the row's ends that the bound excludes (the gap grows outwards).
                    while lo < x && !near(self, lo) {
                        lo += 1;
                    }
                    while hi > x && !near(self, hi) {
                        hi -= 1;
                    }
                    self.scan_cells(base + lo, base + hi);
                } else {
                    if x >= r && near(self, x - r) {
                        self.scan_cells(base + x - r, base + x - r);
                    }
                    if x + r < g.cells[last] && near(self, x + r) {
                        self.scan_cells(base + x + r, base + x + r);
                    }
                }
            }
            // Next row (odometer over the leading axes).
            let mut a = last;
            loop {
                if a == 0 {
                    return;
                }
                a -= 1;
                let (lo, hi) = self.span(a, r);
                if self.lead[a] < hi {
                    self.lead[a] += 1;
                    break;
                }
                self.lead[a] = lo;
            }
        }
    }

    /// The cells of axis `a` within `r` of the query's, clipped to the grid.
    #[inline]
    fn span(&self, a: usize, r: u64) -> (u64, u64) {
        let c = self.cell[a];
        (c.saturating_sub(r), (c + r).min(self.geom.cells[a] - 1))
    }

    /// Offers the points of the cells with linear ids `lo..=hi` to the heap.
    #[inline]
    fn scan_cells(&mut self, lo: u64, hi: u64) {
        let (s0, s1) = self.idx.slots(lo, hi, &mut 0);
        if s0 == s1 {
            return;
        }
        let open = T::from_f64(f64::INFINITY);
        let thr = if self.heap.full() {
            self.heap.worst()
        } else {
            open
        };
        let (heap, ids, skip) = (&mut self.heap, &self.idx.store.ids, self.skip);
        scan_acc::<T, M>(
            &self.q,
            &self.idx.store,
            s0,
            s1,
            thr,
            self.early,
            |b, acc, mask| {
                let mut m = mask;
                while m != 0 {
                    let l = m.trailing_zeros() as usize;
                    m &= m - 1;
                    let id = ids[b + l];
                    if id != skip {
                        heap.offer((acc[l], id));
                    }
                }
                if heap.full() {
                    heap.worst()
                } else {
                    open
                }
            },
        );
    }
}

/// A one-axis gap as a lower bound of that axis's term of the accumulator.
#[inline(always)]
fn term<M: MetricKind>(gap: f64) -> f64 {
    match M::METRIC {
        Metric::Euclidean => gap * gap,
        Metric::Manhattan | Metric::Chebyshev => gap,
        Metric::Cosine => unreachable!("no cosine kNN on the grid"),
        Metric::Haversine => unreachable!("haversine kNN runs as Euclidean (src/geo.rs)"),
    }
}

/// Two axes' bounds combined as the metric combines its terms.
#[inline(always)]
fn combine<M: MetricKind>(a: f64, b: f64) -> f64 {
    match M::METRIC {
        Metric::Chebyshev => a.max(b),
        Metric::Euclidean | Metric::Manhattan => a + b,
        Metric::Cosine => unreachable!("no cosine kNN on the grid"),
        Metric::Haversine => unreachable!("haversine kNN runs as Euclidean (src/geo.rs)"),
    }
}
