//! EGO*-join (Kalashnikov & Prabhakar, after Böhm et al.'s EGO-join): points sorted in
//! Epsilon Grid Order (lexicographic order of their eps-grid cell coordinates, dimensions
//! ordered by decreasing variance), then a recursive join of sequences that halves the
//! longer sequence and drops pairs of sequences the EGO*-heuristic proves non-joinable:
//! each sequence is bounded by the rectangle its first and last cells imply (equal leading
//! cell coordinates, the active dimension between them, the rest unbounded), and two
//! sequences whose rectangles are >= 2 cells apart in some dimension cannot hold a pair
//! (cells are at least eps wide; grid.rs proves no rounding case is lost).
//!
//! Beyond the paper: the recursion's halvings form a fixed binary tree over the sorted
//! points, and each node also keeps its true bounding box in real coordinates (built
//! bottom-up once). Two sequences whose boxes are farther apart than eps (with a rounding
//! margin) are dropped too, and at the leaves each point is screened against the other
//! leaf's box before any pair is computed. In high dimensions with eps near the data's
//! spread (few cells per dimension, nearly every cell pair adjacent) the cell rectangles
//! prune little; on the 16-D exponential benchmark (50k-point sample, leaves of 32) the
//! node boxes skipped ~30% of leaf pairs and the point screens ~88% of the remaining
//! point-leaf tests.
//!
//! Leaves are joined by the vectorised kernel in variance order (early exit) with a
//! safety margin, and every survivor is confirmed in canonical dimension order. From
//! FILTER_MIN_DIM Euclidean dimensions the leaves use dot_filter.rs instead: f32 dot
//! products reject under a proven bound, and survivors are confirmed the same way.

use super::dot_filter::{self, FilterBound, FilterPoints};
use super::emit::{Collector, Emitter};
use super::store::{
    avx2_available, confirm, reject_threshold, scan, scan_cols, MetricKind, Store, LANES,
};
use crate::control::Control;
use crate::grid::GridGeometry;
use crate::metric::reject_margin;
use crate::metric::Coord;
use crate::metric::{accumulate, within_fast};
use crate::options::Metric;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

/// Sequences at most this long are joined directly.
pub(crate) const LEAF: usize = 128;

/// From this many dimensions Euclidean leaves are joined through the dot-product filter
/// (measured: bench/CPU_RESULTS.md, "dot-product filter").
pub(crate) const FILTER_MIN_DIM: usize = 8;

/// Points in EGO order, and the tree of their recursive halvings.
pub(crate) struct EgoIndex<T> {
    pub store: Store<T>,
    /// Cell coordinates per slot (`k` per point, in `geom.dims` order).
    cells: Vec<u32>,
    k: usize,
    /// Node 0 is the root (when n > 0).
    nodes: Vec<Node>,
    /// Bounding box of node i: `lo[i*dim..(i+1)*dim]`, `hi[..]`, in store column order.
    lo: Vec<T>,
    hi: Vec<T>,
}

/// A sequence of consecutive slots; leaves have no children.
#[derive(Clone, Debug)]
struct Node {
    start: usize,
    end: usize,
    children: Option<(u32, u32)>,
}

impl<T: Coord> EgoIndex<T> {
    /// EGO-sorts `data` (row-major, `dim` wide) by the cells of `geom` (all dimensions,
    /// variance order); the store keeps columns in `geom.dims` order. `control` is read
    /// between the build's passes (each a fraction of a second on 10^5-10^6 points).
    pub fn build(
        data: &[T],
        dim: usize,
        geom: &GridGeometry,
        control: &Control,
    ) -> crate::error::Result<Self> {
        let n = data.len() / dim;
        let k = geom.k();
        let mut raw = vec![0u32; n * k];
        raw.par_chunks_mut(k).enumerate().for_each(|(i, c)| {
            for (axis, &j) in geom.dims.iter().enumerate() {
                c[axis] = geom.coord(axis, data[i * dim + j].to_f64()) as u32;
            }
        });
        control.check()?;
        let mut order: Vec<u32> = (0..n as u32).collect();
        order.par_sort_unstable_by(|&a, &b| {
            let (a, b) = (a as usize * k, b as usize * k);
            raw[a..a + k].cmp(&raw[b..b + k])
        });
        control.check()?;
        let mut cells = vec![0u32; n * k];
        cells
            .par_chunks_mut(k)
            .zip(order.par_iter())
            .for_each(|(dst, &i)| {
                dst.copy_from_slice(&raw[i as usize * k..(i as usize + 1) * k]);
            });
        let store = Store::gather(data, dim, order, &geom.dims);
        control.check()?;
        let mut index = EgoIndex {
            store,
            cells,
            k,
            nodes: Vec::new(),
            lo: Vec::new(),
            hi: Vec::new(),
        };
        if n > 0 {
            index.build_node(0..n, control);
        }
        control.check()?;
        Ok(index)
    }

    /// Appends the subtree over `r` (same halving as the join's recursion); returns its id.
    /// Once `control` is stopped the subtrees of 2^14 points or more are left empty (the
    /// caller then returns the stop; the index is never used): a stop need not wait for the
    /// whole serial build.
    fn build_node(&mut self, r: Range<usize>, control: &Control) -> u32 {
        let id = self.nodes.len();
        let dim = self.store.dim;
        self.nodes.push(Node {
            start: r.start,
            end: r.end,
            children: None,
        });
        self.lo.extend(std::iter::repeat_n(T::ZERO, dim));
        self.hi.extend(std::iter::repeat_n(T::ZERO, dim));
        if r.len() >= 1 << 14 && control.is_cancelled() {
            return id as u32;
        }
        if r.len() <= LEAF {
            let mut p = vec![T::ZERO; dim];
            self.store.point(r.start, &mut p);
            let (mut lo, mut hi) = (p.clone(), p.clone());
            for s in r.start + 1..r.end {
                self.store.point(s, &mut p);
                for c in 0..dim {
                    if p[c] < lo[c] {
                        lo[c] = p[c];
                    }
                    if p[c] > hi[c] {
                        hi[c] = p[c];
                    }
                }
            }
            self.lo[id * dim..(id + 1) * dim].copy_from_slice(&lo);
            self.hi[id * dim..(id + 1) * dim].copy_from_slice(&hi);
        } else {
            let mid = r.start + r.len() / 2;
            let left = self.build_node(r.start..mid, control) as usize;
            let right = self.build_node(mid..r.end, control) as usize;
            self.nodes[id].children = Some((left as u32, right as u32));
            for c in 0..dim {
                let (l1, l2) = (self.lo[left * dim + c], self.lo[right * dim + c]);
                let (h1, h2) = (self.hi[left * dim + c], self.hi[right * dim + c]);
                self.lo[id * dim + c] = if l2 < l1 { l2 } else { l1 };
                self.hi[id * dim + c] = if h2 > h1 { h2 } else { h1 };
            }
        }
        id as u32
    }

    /// The leaves' slot ranges, in node order.
    fn leaf_ranges(&self) -> Vec<Range<usize>> {
        let leaves = self.nodes.iter().filter(|n| n.children.is_none());
        leaves.map(|n| n.start..n.end).collect()
    }

    /// For each node id, its position in `leaf_ranges` (u32::MAX for inner nodes).
    fn leaf_numbers(&self) -> Vec<u32> {
        let mut out = vec![u32::MAX; self.nodes.len()];
        let leaves = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.children.is_none());
        for (number, (id, _)) in leaves.enumerate() {
            out[id] = number as u32;
        }
        out
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
fn ego_joinable<T: Coord>(x: &EgoIndex<T>, a: &Node, y: &EgoIndex<T>, b: &Node) -> bool {
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

/// Lower bound (in f64, for `metric`) of the distance between boxes `[alo, ahi]` and
/// `[blo, bhi]`, accumulated like the metric (squared for Euclidean).
#[inline(always)]
fn box_gap<T: Coord, M: MetricKind>(alo: &[T], ahi: &[T], blo: &[T], bhi: &[T]) -> f64 {
    let mut acc = 0.0f64;
    for c in 0..alo.len() {
        let g1 = blo[c].to_f64() - ahi[c].to_f64();
        let g2 = alo[c].to_f64() - bhi[c].to_f64();
        let g = g1.max(g2).max(0.0);
        acc = match M::METRIC {
            Metric::Euclidean => acc + g * g,
            Metric::Manhattan => acc + g,
            Metric::Chebyshev => acc.max(g),
            Metric::Cosine => unreachable!("cosine joins run as Euclidean (src/cosine/)"),
            Metric::Haversine => unreachable!("haversine joins run as Euclidean (src/geo.rs)"),
        };
    }
    acc
}

/// One join's fixed inputs.
struct Ctx<'a, T> {
    x: &'a EgoIndex<T>,
    y: &'a EgoIndex<T>,
    self_join: bool,
    /// Canonical threshold and its widened form for the variance-order kernel.
    thr: T,
    reject: T,
    /// Boxes farther apart than this (f64, metric's accumulation) hold no pair; infinite
    /// when eps is so small that rounding bounds could fail (underflow).
    box_reject: f64,
    /// canon[j] = store column holding dataset dimension j.
    canon: Vec<usize>,
    avx2: bool,
    filter: Option<Filter<'a, T>>,
    screen: ScreenStats,
    /// Read at every recursion step: a stop is seen within one leaf.
    control: &'a Control,
}

/// The dot-product filter's data for one join (dot_filter.rs).
struct Filter<'a, T> {
    /// x's and y's points as given: survivors are confirmed on these rows (one contiguous
    /// read per point instead of one cache line per store column).
    xrows: &'a [T],
    yrows: &'a [T],
    x: FilterPoints,
    /// None in a self-join (y is x).
    y: Option<FilterPoints>,
    /// Node id -> its position among the leaves (FilterPoints' block number).
    x_leaf: Vec<u32>,
    y_leaf: Vec<u32>,
    bound: FilterBound,
    kernel: dot_filter::Kernel,
}

impl<'a, T: Coord> Filter<'a, T> {
    /// None when the filter cannot be used safely or usefully on this join.
    fn new(
        x: &EgoIndex<T>,
        y: &EgoIndex<T>,
        rows: (&'a [T], &'a [T]),
        self_join: bool,
        thr: T,
    ) -> Option<Self> {
        let dim = x.store.dim;
        let bound = FilterBound::new(thr, dim)?;
        // Centre of the root boxes (both sets' points must share the centre).
        let center: Vec<f64> = (0..dim)
            .map(|c| {
                let lo = x.lo[c].to_f64().min(y.lo[c].to_f64());
                let hi = x.hi[c].to_f64().max(y.hi[c].to_f64());
                lo + (hi - lo) / 2.0
            })
            .collect();
        let fx = FilterPoints::build(&x.store, &center, &x.leaf_ranges())?;
        let fy = match self_join {
            true => None,
            false => Some(FilterPoints::build(&y.store, &center, &y.leaf_ranges())?),
        };
        let max_n2 = fx.max_n2().max(fy.as_ref().map_or(0.0, |f| f.max_n2()));
        if !bound.useful(max_n2) {
            return None;
        }
        Some(Filter {
            x_leaf: x.leaf_numbers(),
            y_leaf: y.leaf_numbers(),
            xrows: rows.0,
            yrows: rows.1,
            x: fx,
            y: fy,
            bound,
            kernel: dot_filter::Kernel::detect(),
        })
    }
}

impl<T: Coord> Ctx<'_, T> {
    fn boxes_apart<M: MetricKind>(&self, a: u32, b: u32) -> bool {
        let dim = self.x.store.dim;
        let (a, b) = (a as usize * dim, b as usize * dim);
        let (x, y) = (self.x, self.y);
        box_gap::<T, M>(
            &x.lo[a..a + dim],
            &x.hi[a..a + dim],
            &y.lo[b..b + dim],
            &y.hi[b..b + dim],
        ) > self.box_reject
    }

    /// Self-join of one node: its halves, and the halves against each other.
    fn self_rec<M: MetricKind>(&self, a: u32, em: &mut Emitter, q: &mut Scratch<T>) {
        let node = &self.x.nodes[a as usize];
        match node.children {
            None => self.leaf::<M>(a, a, em, q),
            Some((l, r)) => {
                self.self_rec::<M>(l, em, q);
                self.self_rec::<M>(r, em, q);
                self.pair_rec::<M>(l, r, em, q);
            }
        }
    }

    /// Join of node `a` (of x) with node `b` (of y), halving the longer one.
    fn pair_rec<M: MetricKind>(&self, a: u32, b: u32, em: &mut Emitter, q: &mut Scratch<T>) {
        let (na, nb) = (&self.x.nodes[a as usize], &self.y.nodes[b as usize]);
        if em.stopped()
            || self.control.is_cancelled()
            || !ego_joinable(self.x, na, self.y, nb)
            || self.boxes_apart::<M>(a, b)
        {
            return;
        }
        let split_a = match (na.children, nb.children) {
            (None, None) => return self.leaf::<M>(a, b, em, q),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(_), Some(_)) => na.end - na.start >= nb.end - nb.start,
        };
        if split_a {
            let (l, r) = na.children.unwrap();
            self.pair_rec::<M>(l, b, em, q);
            self.pair_rec::<M>(r, b, em, q);
        } else {
            let (l, r) = nb.children.unwrap();
            self.pair_rec::<M>(a, l, em, q);
            self.pair_rec::<M>(a, r, em, q);
        }
    }

    fn leaf<M: MetricKind>(&self, a: u32, b: u32, em: &mut Emitter, q: &mut Scratch<T>) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: avx2 was detected at run time.
            return unsafe { self.leaf_avx2::<M>(a, b, em, q) };
        }
        self.leaf_body::<M>(a, b, em, q)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn leaf_avx2<M: MetricKind>(
        &self,
        a: u32,
        b: u32,
        em: &mut Emitter,
        q: &mut Scratch<T>,
    ) {
        self.leaf_body::<M>(a, b, em, q)
    }

    /// Direct join of two leaves (`a == b` in a self-join: pairs inside one leaf). Across
    /// two leaves, each side's points are first screened, LANES at a time, against the
    /// other leaf's box; only survivors meet, the candidates copied into a small block.
    #[inline(always)]
    fn leaf_body<M: MetricKind>(&self, a: u32, b: u32, em: &mut Emitter, sc: &mut Scratch<T>) {
        if self.filter.is_some() {
            return self.leaf_filtered::<M>(a, b, em);
        }
        let (xs, ys) = (&self.x.store, &self.y.store);
        let (na, nb) = (&self.x.nodes[a as usize], &self.y.nodes[b as usize]);
        let dim = xs.dim;
        if self.self_join && a == b {
            for s in na.start..na.end {
                xs.point(s, &mut sc.q);
                let qid = xs.ids[s];
                let q = &sc.q;
                scan::<T, M>(q, ys, s + 1, nb.end, self.reject, true, |t| {
                    if confirm::<T, M>(q, ys, t, &self.canon, self.thr) {
                        let tid = ys.ids[t];
                        em.push(qid.min(tid), qid.max(tid));
                    }
                });
            }
            return;
        }
        let (alo, ahi) = (
            &self.x.lo[a as usize * dim..][..dim],
            &self.x.hi[a as usize * dim..][..dim],
        );
        let (blo, bhi) = (
            &self.y.lo[b as usize * dim..][..dim],
            &self.y.hi[b as usize * dim..][..dim],
        );
        // Candidates of b near a's box, copied column-major into sc.cand.
        let stride = LEAF + LANES;
        let mut found = 0;
        let mut t0 = nb.start;
        while t0 < nb.end {
            let mut mask = box_screen::<T, M>(ys, t0, alo, ahi, self.reject);
            if t0 + LANES > nb.end {
                mask &= (1u32 << (nb.end - t0)) - 1;
            }
            while mask != 0 {
                let t = t0 + mask.trailing_zeros() as usize;
                mask &= mask - 1;
                for c in 0..dim {
                    sc.cand[c * stride + found] = ys.block(c, t)[0];
                }
                sc.slot[found] = t as u32;
                found += 1;
            }
            t0 += LANES;
        }
        if found == 0 {
            return;
        }
        let mut s0 = na.start;
        while s0 < na.end {
            let mut mask = box_screen::<T, M>(xs, s0, blo, bhi, self.reject);
            if s0 + LANES > na.end {
                mask &= (1u32 << (na.end - s0)) - 1;
            }
            while mask != 0 {
                let s = s0 + mask.trailing_zeros() as usize;
                mask &= mask - 1;
                xs.point(s, &mut sc.q);
                let qid = xs.ids[s];
                let (q, slot) = (&sc.q, &sc.slot);
                scan_cols::<T, M>(q, &sc.cand, stride, 0, found, self.reject, true, |k| {
                    let t = slot[k] as usize;
                    if confirm::<T, M>(q, ys, t, &self.canon, self.thr) {
                        self.emit(em, qid, ys.ids[t]);
                    }
                });
            }
            s0 += LANES;
        }
    }

    /// A matching pair: (smaller id, larger id) in a self-join, (A id, B id) otherwise.
    #[inline(always)]
    fn emit(&self, em: &mut Emitter, qid: u32, tid: u32) {
        if self.self_join {
            em.push(qid.min(tid), qid.max(tid));
        } else {
            em.push(qid, tid);
        }
    }

    /// Leaf join through the dot-product filter (dot_filter.rs): the two leaves' f32
    /// copies are contiguous blocks, so they feed the kernel in place; the filter rejects
    /// what it provably can and `within` decides the rest canonically. Box screens only
    /// mark live points for the kernel to skip whole tiles (copying the screened points
    /// into compact blocks, as `leaf_body` does, measured 1.3-1.8x slower here).
    #[inline(always)]
    fn leaf_filtered<M: MetricKind>(&self, a: u32, b: u32, em: &mut Emitter) {
        let stats = &self.screen;
        let f = self
            .filter
            .as_ref()
            .expect("leaf_filtered runs with a filter");
        let (xs, ys) = (&self.x.store, &self.y.store);
        let (fx, fy) = (&f.x, f.y.as_ref().unwrap_or(&f.x));
        let (na, nb) = (&self.x.nodes[a as usize], &self.y.nodes[b as usize]);
        let diagonal = self.self_join && a == b;
        let (query, q_err, q_n2) = fx.block(f.x_leaf[a as usize] as usize);
        let (cand, c_err, c_n2) = fy.block(f.y_leaf[b as usize] as usize);
        let g = f.bound.cutoff(q_err, c_err, q_n2, c_n2);
        let dim = xs.dim;
        // Points near the other leaf's box (all of them inside one leaf): the kernel skips
        // tiles with none, and only these can pair. Screened on the first SCREEN_DIMS store
        // columns (the highest-variance ones; a prefix sum is still a lower bound), and only
        // while screening pays in this join (see ScreenStats).
        let (mut q_live, mut c_live) = ([!0u64; LEAF / 64], [!0u64; LEAF / 64]);
        if !diagonal && stats.on() {
            let k = dim.min(SCREEN_DIMS);
            let (alo, ahi) = (
                &self.x.lo[a as usize * dim..][..k],
                &self.x.hi[a as usize * dim..][..k],
            );
            let (blo, bhi) = (
                &self.y.lo[b as usize * dim..][..k],
                &self.y.hi[b as usize * dim..][..k],
            );
            screen_bits::<T, M>(ys, nb.start..nb.end, alo, ahi, self.reject, &mut c_live);
            let c_count: u32 = c_live.iter().map(|w| w.count_ones()).sum();
            if c_count == 0 {
                return stats.record(0, 1);
            }
            screen_bits::<T, M>(xs, na.start..na.end, blo, bhi, self.reject, &mut q_live);
            let q_count: u32 = q_live.iter().map(|w| w.count_ones()).sum();
            let all = (na.end - na.start) * (nb.end - nb.start);
            stats.record(q_count as usize * c_count as usize, all);
        }
        dot_filter::survivors(
            &query,
            &cand,
            dim,
            &[g],
            f.kernel,
            &q_live,
            &c_live,
            |i, j0, mut mask| {
                if diagonal && i >= j0 {
                    // Inside one leaf only pairs (i, j > i).
                    mask &= !((1u32 << (i - j0 + 1).min(16)) - 1) as u16;
                    if mask == 0 {
                        return;
                    }
                }
                let qid = xs.ids[na.start + i];
                let q = &f.xrows[qid as usize * dim..][..dim];
                while mask != 0 {
                    let tid = ys.ids[nb.start + j0 + mask.trailing_zeros() as usize];
                    mask &= mask - 1;
                    if within_fast(
                        M::METRIC,
                        q,
                        &f.yrows[tid as usize * dim..][..dim],
                        self.thr,
                    ) {
                        self.emit(em, qid, tid);
                    }
                }
            },
        );
    }
}

/// Box screens before the dot-product filter look at this many store columns at most.
const SCREEN_DIMS: usize = 16;

/// Whether box screens before the dot-product filter pay, judged over the join so far:
/// after SCREEN_TRIALS screened leaf pairs, screening stops unless at least one in eight
/// left under 3/4 of the point pairs (in 32-64-D with eps near the spread nearly every
/// point is near the other leaf's box and the screen only costs; at 200k 16-D points and
/// 0.4 neighbours per point it removes most of the work). Shared by the workers: counts
/// are relaxed atomics, a hint, not a synchronisation.
struct ScreenStats {
    trials: AtomicU32,
    useful: AtomicU32,
}

const SCREEN_TRIALS: u32 = 64;

impl ScreenStats {
    fn new() -> Self {
        ScreenStats {
            trials: AtomicU32::new(0),
            useful: AtomicU32::new(0),
        }
    }
    fn on(&self) -> bool {
        let trials = self.trials.load(Ordering::Relaxed);
        trials < SCREEN_TRIALS || self.useful.load(Ordering::Relaxed) * 8 >= trials
    }
    fn record(&self, live_pairs: usize, all_pairs: usize) {
        self.trials.fetch_add(1, Ordering::Relaxed);
        if live_pairs * 4 < all_pairs * 3 {
            self.useful.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Bit i of `bits` (words of 64) set when slot `r.start + i` passes `box_screen` against
/// `[lo, hi]`; bits past the range are cleared.
#[inline(always)]
fn screen_bits<T: Coord, M: MetricKind>(
    xs: &Store<T>,
    r: Range<usize>,
    lo: &[T],
    hi: &[T],
    reject: T,
    bits: &mut [u64],
) {
    bits.fill(0);
    let mut s0 = r.start;
    while s0 < r.end {
        let mut mask = box_screen::<T, M>(xs, s0, lo, hi, reject) as u64;
        if s0 + LANES > r.end {
            mask &= (1u64 << (r.end - s0)) - 1;
        }
        let i = s0 - r.start;
        bits[i / 64] |= mask << (i % 64);
        s0 += LANES;
    }
}

/// Per-worker buffers of the leaf join.
struct Scratch<T> {
    /// The query point, store column order.
    q: Vec<T>,
    /// Screened candidates, column-major with stride LEAF + LANES.
    cand: Vec<T>,
    /// Their slots.
    slot: [u32; LEAF],
}

impl<T: Coord> Scratch<T> {
    fn new(dim: usize) -> Self {
        Scratch {
            q: vec![T::ZERO; dim],
            cand: vec![T::ZERO; dim * (LEAF + LANES)],
            slot: [0; LEAF],
        }
    }
}

/// Mask of the LANES slots from `s` whose distance to the box `[lo, hi]`, accumulated in
/// T in store order, is `<= reject`. Safe to drop the others: each per-dimension gap is at
/// most the pair's rounded difference (rounding is monotone), so this sum is at most the
/// pair's sum in the same order, and `reject` covers the change to canonical order.
#[inline(always)]
fn box_screen<T: Coord, M: MetricKind>(
    xs: &Store<T>,
    s: usize,
    lo: &[T],
    hi: &[T],
    reject: T,
) -> u32 {
    let mut acc = [T::ZERO; LANES];
    for c in 0..lo.len() {
        let x = xs.block(c, s);
        let (l, h) = (lo[c], hi[c]);
        for k in 0..LANES {
            let gap = (l - x[k]).max(x[k] - h).max(T::ZERO);
            acc[k] = accumulate(M::METRIC, acc[k], gap, T::ZERO);
        }
    }
    let mut mask = 0u32;
    for (k, &a) in acc.iter().enumerate() {
        mask |= ((a <= reject) as u32) << k;
    }
    mask
}

/// A task of the parallel phase: a node's self-join or a pair of nodes.
enum Task {
    SelfJoin(u32),
    Pair(u32, u32),
}

/// Splits the top of the recursion into tasks of at most `grain` points per side.
fn plan_self<T: Coord, M: MetricKind>(ctx: &Ctx<T>, a: u32, grain: usize, out: &mut Vec<Task>) {
    let node = &ctx.x.nodes[a as usize];
    match node.children {
        Some((l, r)) if node.end - node.start > grain => {
            plan_self::<T, M>(ctx, l, grain, out);
            plan_self::<T, M>(ctx, r, grain, out);
            plan_pair::<T, M>(ctx, l, r, grain, out);
        }
        _ => out.push(Task::SelfJoin(a)),
    }
}

fn plan_pair<T: Coord, M: MetricKind>(
    ctx: &Ctx<T>,
    a: u32,
    b: u32,
    grain: usize,
    out: &mut Vec<Task>,
) {
    let (na, nb) = (&ctx.x.nodes[a as usize], &ctx.y.nodes[b as usize]);
    if !ego_joinable(ctx.x, na, ctx.y, nb) || ctx.boxes_apart::<M>(a, b) {
        return;
    }
    let (la, lb) = (na.end - na.start, nb.end - nb.start);
    if la <= grain && lb <= grain {
        return out.push(Task::Pair(a, b));
    }
    match (na.children, nb.children) {
        (Some((l, r)), _) if la >= lb || nb.children.is_none() => {
            plan_pair::<T, M>(ctx, l, b, grain, out);
            plan_pair::<T, M>(ctx, r, b, grain, out);
        }
        (_, Some((l, r))) => {
            plan_pair::<T, M>(ctx, a, l, grain, out);
            plan_pair::<T, M>(ctx, a, r, grain, out);
        }
        _ => out.push(Task::Pair(a, b)),
    }
}

/// EGO*-join of `x` with `y` (`self_join`: x is y). `canon` maps dataset dimensions to
/// store columns; `rows` are x's and y's points as given (row-major, dataset order).
/// Returns notes for the report.
#[allow(clippy::too_many_arguments)]
pub(crate) fn join<T: Coord, M: MetricKind>(
    x: &EgoIndex<T>,
    y: &EgoIndex<T>,
    rows: (&[T], &[T]),
    self_join: bool,
    thr: T,
    canon: Vec<usize>,
    out: &Collector,
    threads: usize,
    control: &Control,
) -> Vec<String> {
    let dim = x.store.dim;
    let (nx, ny) = (x.store.n, y.store.n);
    if nx == 0 || ny == 0 {
        return Vec::new();
    }
    // Box distances are computed in f64 from T values: a pair's canonical T sum is at
    // least the exact box gap less T's and f64's rounding, both covered by the margins.
    let tiny = if T::UNIT_ROUNDOFF > 1e-10 {
        1e-30
    } else {
        1e-290
    };
    let margin = 2.0 * reject_margin::<T>(dim) + 4.0 * reject_margin::<f64>(dim);
    let box_reject = if thr.to_f64() > tiny {
        thr.to_f64() * (1.0 + margin)
    } else {
        f64::INFINITY
    };
    let mut ctx = Ctx {
        x,
        y,
        self_join,
        thr,
        reject: reject_threshold(thr, dim),
        box_reject,
        canon,
        avx2: avx2_available(),
        filter: None,
        screen: ScreenStats::new(),
        control,
    };
    let mut notes = Vec::new();
    if M::METRIC == Metric::Euclidean && dim >= FILTER_MIN_DIM {
        let t = std::time::Instant::now();
        ctx.filter = Filter::new(x, y, rows, self_join, thr);
        notes.push(match &ctx.filter {
            Some(f) => format!(
                "ego: leaves through the f32 dot-product filter ({}, built in {:.3} s), survivors confirmed exactly",
                f.kernel.name(),
                t.elapsed().as_secs_f64()
            ),
            None => "ego: dot-product filter off (data or eps outside its safe range)".to_string(),
        });
    }
    let grain = (nx.max(ny) / (threads * 16)).max(LEAF);
    let mut tasks = Vec::new();
    if self_join {
        plan_self::<T, M>(&ctx, 0, grain, &mut tasks);
    } else {
        plan_pair::<T, M>(&ctx, 0, 0, grain, &mut tasks);
    }
    control.stage("join", tasks.len() as u64);
    tasks.par_iter().with_max_len(1).for_each(|task| {
        let mut em = out.emitter();
        let mut q = Scratch::new(dim);
        match *task {
            Task::SelfJoin(a) => ctx.self_rec::<M>(a, &mut em, &mut q),
            Task::Pair(a, b) => ctx.pair_rec::<M>(a, b, &mut em, &mut q),
        }
        control.advance(1, em.found());
    });
    notes
}
