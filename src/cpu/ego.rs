//! EGO*-join (Kalashnikov & Prabhakar, after Böhm et al.'s EGO-join): points sorted in
//! Epsilon Grid Order (lexicographic order of their eps-grid cell coordinates, dimensions
//! ordered by decreasing variance), then a recursive join of sequences that halves the
//! longer sequence and drops pairs of sequences the EGO*-heuristic proves non-joinable:
//! each sequence is bounded by the rectangle its first and last cells imply (equal leading
//! cell coordinates, the active dimension between them, the rest unbounded), and two
//! sequences whose rectangles are >= 2 cells apart in some dimension cannot hold a pair
//! (cells are at least eps wide; grid.rs proves no rounding case is lost).
//!
//! Short sequences are joined by the vectorised kernel in variance order (early exit)
//! with a safety margin, and every survivor is confirmed in canonical dimension order.

use super::emit::{Collector, Emitter};
use super::store::{confirm, reject_threshold, scan, MetricKind, Store};
use crate::grid::GridGeometry;
use crate::metric::Coord;
use rayon::prelude::*;
use std::ops::Range;

/// Sequences at most this long are joined directly.
pub(crate) const LEAF: usize = 64;

/// Points in EGO order.
pub(crate) struct EgoIndex<T> {
    pub store: Store<T>,
    /// Cell coordinates per slot (`k` per point, in `geom.dims` order).
    cells: Vec<u32>,
    k: usize,
}

impl<T: Coord> EgoIndex<T> {
    /// EGO-sorts `data` (row-major, `dim` wide) by the cells of `geom` (all dimensions,
    /// variance order); the store keeps columns in `geom.dims` order.
    pub fn build(data: &[T], dim: usize, geom: &GridGeometry) -> Self {
        let n = data.len() / dim;
        let k = geom.k();
        let mut raw = vec![0u32; n * k];
        raw.par_chunks_mut(k).enumerate().for_each(|(i, c)| {
            for (axis, &j) in geom.dims.iter().enumerate() {
                c[axis] = geom.coord(axis, data[i * dim + j].to_f64()) as u32;
            }
        });
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.par_sort_unstable_by(|&a, &b| {
            let (a, b) = (a as usize * k, b as usize * k);
            raw[a..a + k].cmp(&raw[b..b + k])
        });
        let mut cells = vec![0u32; n * k];
        cells
            .par_chunks_mut(k)
            .zip(order.par_iter())
            .for_each(|(dst, &i)| {
                dst.copy_from_slice(&raw[i as usize * k..(i as usize + 1) * k]);
            });
        EgoIndex {
            store: Store::gather(data, dim, order, &geom.dims),
            cells,
            k,
        }
    }

    #[inline]
    fn cell(&self, s: usize) -> &[u32] {
        &self.cells[s * self.k..(s + 1) * self.k]
    }
}

/// EGO*-heuristic: false when sequences `a` (of `x`) and `b` (of `y`) provably hold no pair.
/// Each sequence's bounding rectangle is exact on the leading dimensions where its first
/// and last cells agree, spans first..last on the next (active) one, and is unbounded after.
#[inline]
fn joinable<T: Coord>(
    x: &EgoIndex<T>,
    a: &Range<usize>,
    y: &EgoIndex<T>,
    b: &Range<usize>,
) -> bool {
    let (fa, la) = (x.cell(a.start), x.cell(a.end - 1));
    let (fb, lb) = (y.cell(b.start), y.cell(b.end - 1));
    for d in 0..x.k {
        // Cell coordinates are < 2^31, so +1 cannot overflow.
        if fa[d] > lb[d] + 1 || fb[d] > la[d] + 1 {
            return false;
        }
        // Past either sequence's active dimension its rectangle is unbounded.
        if fa[d] != la[d] || fb[d] != lb[d] {
            return true;
        }
    }
    true
}

/// One join's fixed inputs.
struct Ctx<'a, T> {
    x: &'a EgoIndex<T>,
    y: &'a EgoIndex<T>,
    self_join: bool,
    /// Canonical threshold and its widened form for the variance-order kernel.
    thr: T,
    reject: T,
    /// canon[j] = store column holding dataset dimension j.
    canon: Vec<usize>,
}

impl<T: Coord> Ctx<'_, T> {
    /// Self-join of one sequence: its halves, and the halves against each other.
    fn self_rec<M: MetricKind>(&self, r: Range<usize>, em: &mut Emitter, q: &mut [T]) {
        if r.len() <= LEAF {
            return self.leaf::<M>(r.clone(), r, em, q);
        }
        let mid = r.start + r.len() / 2;
        self.self_rec::<M>(r.start..mid, em, q);
        self.self_rec::<M>(mid..r.end, em, q);
        self.pair_rec::<M>(r.start..mid, mid..r.end, em, q);
    }

    /// Join of sequence `a` (of x) with `b` (of y), halving the longer one.
    fn pair_rec<M: MetricKind>(
        &self,
        a: Range<usize>,
        b: Range<usize>,
        em: &mut Emitter,
        q: &mut [T],
    ) {
        if em.stopped() || !joinable(self.x, &a, self.y, &b) {
            return;
        }
        if a.len() <= LEAF && b.len() <= LEAF {
            return self.leaf::<M>(a, b, em, q);
        }
        if a.len() >= b.len() {
            let mid = a.start + a.len() / 2;
            self.pair_rec::<M>(a.start..mid, b.clone(), em, q);
            self.pair_rec::<M>(mid..a.end, b, em, q);
        } else {
            let mid = b.start + b.len() / 2;
            self.pair_rec::<M>(a.clone(), b.start..mid, em, q);
            self.pair_rec::<M>(a, mid..b.end, em, q);
        }
    }

    /// Direct join of two short sequences (`a == b`: pairs inside one sequence).
    fn leaf<M: MetricKind>(&self, a: Range<usize>, b: Range<usize>, em: &mut Emitter, q: &mut [T]) {
        let same = self.self_join && a == b;
        let (xs, ys) = (&self.x.store, &self.y.store);
        for s in a {
            xs.point(s, q);
            let qid = xs.ids[s];
            let lo = if same { s + 1 } else { b.start };
            scan::<T, M>(q, ys, lo, b.end, self.reject, true, |t| {
                if confirm::<T, M>(q, ys, t, &self.canon, self.thr) {
                    let tid = ys.ids[t];
                    if self.self_join {
                        em.push(qid.min(tid), qid.max(tid));
                    } else {
                        em.push(qid, tid);
                    }
                }
            });
        }
    }
}

/// A task of the parallel phase: a sequence's self-join or a pair of sequences.
enum Task {
    SelfJoin(Range<usize>),
    Pair(Range<usize>, Range<usize>),
}

/// Splits the top of the recursion into tasks of at most `grain` points per side.
fn plan_self(r: Range<usize>, grain: usize, x: &EgoIndex<impl Coord>, out: &mut Vec<Task>) {
    if r.len() <= grain {
        out.push(Task::SelfJoin(r));
        return;
    }
    let mid = r.start + r.len() / 2;
    plan_self(r.start..mid, grain, x, out);
    plan_self(mid..r.end, grain, x, out);
    plan_pair(r.start..mid, mid..r.end, grain, x, x, out);
}

fn plan_pair<T: Coord>(
    a: Range<usize>,
    b: Range<usize>,
    grain: usize,
    x: &EgoIndex<T>,
    y: &EgoIndex<T>,
    out: &mut Vec<Task>,
) {
    if a.is_empty() || b.is_empty() || !joinable(x, &a, y, &b) {
        return;
    }
    if a.len() <= grain && b.len() <= grain {
        out.push(Task::Pair(a, b));
    } else if a.len() >= b.len() {
        let mid = a.start + a.len() / 2;
        plan_pair(a.start..mid, b.clone(), grain, x, y, out);
        plan_pair(mid..a.end, b, grain, x, y, out);
    } else {
        let mid = b.start + b.len() / 2;
        plan_pair(a.clone(), b.start..mid, grain, x, y, out);
        plan_pair(a, mid..b.end, grain, x, y, out);
    }
}

/// EGO*-join of `x` with `y` (`self_join`: x is y). `canon` maps dataset dimensions to
/// store columns.
pub(crate) fn join<T: Coord, M: MetricKind>(
    x: &EgoIndex<T>,
    y: &EgoIndex<T>,
    self_join: bool,
    thr: T,
    canon: Vec<usize>,
    out: &Collector,
    threads: usize,
) {
    let dim = x.store.dim;
    let ctx = Ctx {
        x,
        y,
        self_join,
        thr,
        reject: reject_threshold(thr, dim),
        canon,
    };
    let (nx, ny) = (x.store.n, y.store.n);
    if nx == 0 || ny == 0 {
        return;
    }
    let grain = (nx.max(ny) / (threads * 16)).max(LEAF);
    let mut tasks = Vec::new();
    if self_join {
        plan_self(0..nx, grain, x, &mut tasks);
    } else {
        plan_pair(0..nx, 0..ny, grain, x, y, &mut tasks);
    }
    tasks.par_iter().with_max_len(1).for_each(|task| {
        let mut em = out.emitter();
        let mut q = vec![T::ZERO; dim];
        match task {
            Task::SelfJoin(r) => ctx.self_rec::<M>(r.clone(), &mut em, &mut q),
            Task::Pair(a, b) => ctx.pair_rec::<M>(a.clone(), b.clone(), &mut em, &mut q),
        }
    });
}
