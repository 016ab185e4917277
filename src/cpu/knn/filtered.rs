//! High-dimensional Euclidean kNN: blocks of queries against blocks of points through the
//! f32 dot-product filter of `dot_filter.rs`, every survivor confirmed in canonical
//! arithmetic. From ~10 dimensions a k-d tree prunes almost nothing (bench/KNN_RESULTS.md:
//! every leaf pair was visited at 16-64-D; from 8-D these blocks beat its search) and the
//! cost is the n^2 d multiply-adds, which matrix-product peers (FAISS, scikit-learn's brute
//! force) run at the machine's flop rate; the filter gives that rate without their rounding.
//!
//! Both sides are put in k-d tree order (close points next to each other) and cut into
//! fixed-size blocks (QB queries, PB points: whole kernel tiles, no ragged leaves), each
//! with its bounding box. Per query block (a task), the point blocks are met nearest centre
//! first, so the heaps tighten quickly, and a block whose box bound exceeds every heap's
//! k-th accumulator (with the margin of `Searcher::may_enter`) is skipped, as is a kernel row
//! tile (6 queries) whose own box cannot enter any of its heaps.
//!
//! Each query has a cutoff h = G(w) - n_a (`FilterBound::cutoff_less_own`), where w is an
//! upper bound on its final k-th canonical accumulator, refreshed as soon as it tightens
//! (from the next tile on): the kernel (`survivors_shifted`) rejects a pair when
//! F - n_a > h, which proves that the canonical accumulator exceeds w, so the point cannot
//! be among the k nearest. w is the smaller of the k-th accumulator of the exact heap and
//! `dot_filter::canonical_upper` of the k-th smallest kernel value seen: any k candidates'
//! largest accumulator bounds the k-th nearest from above.
//!
//! Survivors are not measured at once (on 384-D uniform data a query met about 100 tiles
//! with a survivor, each a 384-long chain of dependent adds: a third of the search). They
//! wait in the query's pool with their kernel value; the pool drops what a tighter h rules
//! out, and what the final h leaves (the k nearest and the few within the bound's error of
//! them) is measured in canonical arithmetic, eight candidates' chains side by side, and
//! ranked by (accumulator, index). A pool that still holds POOL / 2 after dropping (ties,
//! duplicates) is measured then and there, so it stays small.

use super::{key_less, Heap, Tree};
use crate::control::Control;
use crate::cpu::dot_filter::{self, Block, FilterBound, FilterPoints};
use crate::cpu::store::Store;
use crate::error::Result;
use crate::metric::{accumulate, Coord};
use crate::options::Metric;
use rayon::prelude::*;
use std::ops::Range;

mod symmetric;

/// Candidates confirmed together below DEFER_MIN_DIM: one kernel column tile.
const TILE: usize = dot_filter::COLS;
/// Queries per task: 16 kernel row tiles (a multiple of `dot_filter::ROWS`).
const QB: usize = 96;
/// Points per block: 8 kernel column tiles (a multiple of `dot_filter::COLS`).
const PB: usize = 128;
/// Leaf size of the trees that order the points (blocks are cut from their leaf order).
const ORDER_LEAF: usize = 32;
/// Queries of a kernel row tile.
const ROWS: usize = dot_filter::ROWS;

/// One side (points or queries) cut into blocks of its tree's leaf order: the filter's f32
/// copy packed per block, each block's bounding box, and (points, below DEFER_MIN_DIM) the
/// exact coordinates column-major per block for the lane-wise confirmation.
struct Side<T> {
    blocks: Vec<Range<usize>>,
    fp: FilterPoints,
    lo: Vec<f64>,
    hi: Vec<f64>,
    /// Block b's column c, item j at `cols[(b * dim + c) * size + j]` (zero padded).
    cols: Vec<T>,
}

impl<T: Coord> Side<T> {
    /// Blocks of `size` of `tree`'s order, centred on `center`; None when the filter cannot
    /// take these data. `exact_cols`: keep the column-major exact copy.
    fn new(tree: &Tree<T>, size: usize, center: &[f64], exact_cols: bool) -> Option<Self> {
        let dim = tree.dim;
        let n = tree.ids.len();
        let blocks: Vec<Range<usize>> =
            (0..n).step_by(size).map(|s| s..(s + size).min(n)).collect();
        let all: Vec<usize> = (0..dim).collect();
        // Slots in tree order: slot s is the tree's point s.
        let store = Store::gather(&tree.pts, dim, (0..n as u32).collect(), &all);
        let fp = FilterPoints::build(&store, center, &blocks)?;
        let mut lo = vec![f64::INFINITY; blocks.len() * dim];
        let mut hi = vec![f64::NEG_INFINITY; blocks.len() * dim];
        lo.par_chunks_mut(dim)
            .zip(hi.par_chunks_mut(dim))
            .zip(blocks.par_iter())
            .for_each(|((lo, hi), r)| {
                for p in tree.pts[r.start * dim..r.end * dim].chunks_exact(dim) {
                    for c in 0..dim {
                        let x = p[c].to_f64();
                        lo[c] = lo[c].min(x);
                        hi[c] = hi[c].max(x);
                    }
                }
            });
        let mut cols = Vec::new();
        if exact_cols {
            cols = vec![T::ZERO; blocks.len() * dim * size];
            cols.par_chunks_mut(dim * size)
                .zip(blocks.par_iter())
                .for_each(|(out, r)| {
                    for (j, p) in tree.pts[r.start * dim..r.end * dim]
                        .chunks_exact(dim)
                        .enumerate()
                    {
                        for c in 0..dim {
                            out[c * size + j] = p[c];
                        }
                    }
                });
        }
        Some(Side {
            blocks,
            fp,
            lo,
            hi,
            cols,
        })
    }

    fn bounds(&self, b: usize, dim: usize) -> (&[f64], &[f64]) {
        (
            &self.lo[b * dim..(b + 1) * dim],
            &self.hi[b * dim..(b + 1) * dim],
        )
    }
}

/// Four times the squared distance between two boxes' centres: the order in which a query
/// block meets the point blocks (measured 5-12 % less time than nearest box bound first, in
/// 8-D to 64-D: in high dimensions box bounds are near zero for most blocks and say little).
fn centre_dist(alo: &[f64], ahi: &[f64], blo: &[f64], bhi: &[f64]) -> f64 {
    let mut s = 0.0;
    for c in 0..alo.len() {
        let g = (alo[c] + ahi[c]) - (blo[c] + bhi[c]);
        s += g * g;
    }
    s
}

/// Squared Euclidean lower bound between two boxes (f64).
fn box_bound(alo: &[f64], ahi: &[f64], blo: &[f64], bhi: &[f64]) -> f64 {
    let mut s = 0.0;
    for c in 0..alo.len() {
        let g = (alo[c] - bhi[c]).max(blo[c] - ahi[c]).max(0.0);
        s += g * g;
    }
    s
}

/// Canonical accumulators of query `q` against the TILE candidates of column-major `cols`
/// (column c at `cols[c * stride..]`): lane l is exactly `metric::accumulate` over the
/// dimensions in order for candidate l, the same sum the scalar search computes. None when
/// `w` is given and every lane of `lanes` exceeds it (partial sums never decrease, so
/// stopping early is exact).
#[inline(always)]
fn exact_tile<T: Coord>(
    q: &[T],
    cols: &[T],
    stride: usize,
    w: Option<T>,
    lanes: u16,
) -> Option<[T; TILE]> {
    let mut acc = [T::ZERO; TILE];
    for (c0, qc) in q.chunks(8).enumerate() {
        for (c, &x) in qc.iter().enumerate() {
            let col: &[T; TILE] = cols[(c0 * 8 + c) * stride..][..TILE].try_into().unwrap();
            for l in 0..TILE {
                acc[l] = accumulate(Metric::Euclidean, acc[l], x, col[l]);
            }
        }
        if let Some(w) = w {
            let mut open = 0u16;
            for (l, &a) in acc.iter().enumerate() {
                // Not above w (a NaN stays open, as in the kernel).
                open |= ((a.partial_cmp(&w) != Some(std::cmp::Ordering::Greater)) as u16) << l;
            }
            if open & lanes == 0 {
                return None;
            }
        }
    }
    Some(acc)
}

/// Offers the candidates at `slots` (of the points' tree order, row-major `pts`, ids
/// `ids`) to `heap` with their canonical accumulators against `q`: eight at a time, each
/// lane exactly `metric::accumulate` over the dimensions in order (eight independent
/// chains where one would wait on each add). A group stops once every lane exceeds a full
/// heap's k-th (partial sums never decrease, so those could not enter).
fn confirm<T: Coord>(
    q: &[T],
    pts: &[T],
    ids: &[u32],
    slots: impl Iterator<Item = u32>,
    heap: &mut Heap<T>,
) {
    const LANES: usize = 8;
    let dim = q.len();
    let mut slots = slots.peekable();
    while slots.peek().is_some() {
        let mut lane = [0u32; LANES];
        let mut m = 0;
        for s in slots.by_ref().take(LANES) {
            lane[m] = s;
            m += 1;
        }
        let rows: [&[T]; LANES] =
            std::array::from_fn(|l| &pts[lane[l.min(m - 1)] as usize * dim..][..dim]);
        let mut acc = [T::ZERO; LANES];
        let w = heap.full().then(|| heap.worst());
        let mut skip = false;
        for c0 in (0..dim).step_by(32) {
            for c in c0..(c0 + 32).min(dim) {
                let x = q[c];
                for l in 0..LANES {
                    acc[l] = accumulate(Metric::Euclidean, acc[l], x, rows[l][c]);
                }
            }
            // Every lane above w (a NaN stays open): none can enter.
            if let Some(w) = w {
                if acc[..m]
                    .iter()
                    .all(|a| a.partial_cmp(&w) == Some(std::cmp::Ordering::Greater))
                {
                    skip = true;
                    break;
                }
            }
        }
        if skip {
            continue;
        }
        for l in 0..m {
            let item = (acc[l], ids[lane[l] as usize]);
            if !heap.full() || key_less(item, heap.worst_item()) {
                heap.offer(item);
            }
        }
    }
}

/// Whether the kernel's cutoff `h` keeps a value `v` (not above it; a NaN kept), as the
/// kernel decides.
fn kept(v: f32, h: f32) -> bool {
    v.partial_cmp(&h) != Some(std::cmp::Ordering::Greater)
}

/// From this many dimensions survivors wait in the pool (module doc); below it each is
/// measured at once, a tile's 16 candidates in SIMD lanes (measured, k = 16, against
/// deferring: 8-24-D 3-25% faster at once; deferred 64-D 12% and 384-D 35% faster).
const DEFER_MIN_DIM: usize = 32;

/// Query blocks searched first to choose the schedule of a self-kNN.
const SAMPLE: usize = 4;

/// The share of point blocks a query block compares from which the symmetric schedule
/// runs (it compares each pair of blocks once, but in an order that prunes less: clusters
/// 32-D, 100k, where a query block compared few, took 1.3-1.5 s symmetric against
/// 0.8-0.9 s; uniform and exponential 64-D, where every block is compared, 13-27% less).
const SYMMETRIC_FROM: f64 = 0.6;

/// Pending candidates a query holds before confirming them.
const POOL: usize = 512;

/// A query's state in the search: the exact heap of confirmed (accumulator, id); the k
/// smallest kernel values seen (F - n_a, id), whose k-th bounds the k-th accumulator from
/// above (`dot_filter::canonical_upper`); and the candidates that passed the kernel, not
/// yet confirmed (value, point slot).
struct Query<T> {
    exact: Heap<T>,
    approx: Heap<f32>,
    pool: Vec<(f32, u32)>,
    /// The tightest bound on the final k-th accumulator so far (+inf until one is known).
    w: f64,
}

impl<T: Coord> Query<T> {
    fn new(k: usize) -> Self {
        Query {
            exact: Heap::new(k),
            approx: Heap::new(k),
            pool: Vec::new(),
            w: f64::INFINITY,
        }
    }

    /// For a full pool: drops what the cutoff `g` (on the pool's keys) now rules out, and
    /// confirms the rest against the query point `q` when that leaves many (ties,
    /// duplicates), so the pool stays small. True when that tightened w.
    fn trim(&mut self, g: f32, q: &[T], tree: &Tree<T>) -> bool {
        self.pool.retain(|&(v, _)| kept(v, g));
        if self.pool.len() < POOL / 2 {
            return false;
        }
        let slots = self.pool.drain(..).map(|(_, s)| s);
        confirm(q, &tree.pts, &tree.ids, slots, &mut self.exact);
        let tighter = self.exact.full() && self.exact.worst().to_f64() < self.w;
        if tighter {
            self.w = self.exact.worst().to_f64();
        }
        tighter
    }

    /// Confirms what the final cutoff `g` leaves of the pool (the k nearest are among it)
    /// and appends the k nearest to `out`, nearest first.
    fn finish(&mut self, g: f32, q: &[T], tree: &Tree<T>, out: &mut Vec<(T, u32)>) {
        self.pool.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        let slots = self.pool.iter().filter(|p| kept(p.0, g)).map(|p| p.1);
        confirm(q, &tree.pts, &tree.ids, slots, &mut self.exact);
        out.extend(self.exact.take_sorted());
    }
}

/// Writes answers kept per block of `size` slots of the tree order (k per slot) into rows
/// `indices` / `acc`: slot s is the original row `ids[s]`.
fn scatter_rows<T: Coord>(
    ids: &[u32],
    size: usize,
    k: usize,
    per_block: &[Vec<(T, u32)>],
    indices: &mut [u32],
    acc: &mut [T],
) {
    super::unpermute_rows(ids, k, indices, acc, |s, oi, oa| {
        let row = &per_block[s / size][(s % size) * k..(s % size + 1) * k];
        for (c, &(a, id)) in row.iter().enumerate() {
            oi[c] = id;
            oa[c] = a;
        }
    });
}

/// Runs the search into row-major `indices` / `acc` (accumulators, not yet square-rooted).
/// `Ok(None)` when the filter cannot be used on these data (norms too large for f32).
pub(super) fn search<T: Coord>(
    data: &[T],
    query: Option<&[T]>,
    dim: usize,
    k: usize,
    indices: &mut [u32],
    acc: &mut [T],
    control: &Control,
) -> Result<Option<String>> {
    search_with(
        dot_filter::Kernel::detect(),
        Schedule::Auto,
        data,
        query,
        dim,
        k,
        indices,
        acc,
        control,
    )
}

/// Whether a self-kNN takes the symmetric schedule (`symmetric.rs`) where it can.
#[derive(Clone, Copy, PartialEq)]
enum Schedule {
    #[cfg_attr(not(test), allow(dead_code))]
    OneSided,
    /// Where a sample shows that the blocks' bounds prune little.
    Auto,
    Symmetric,
}

/// `search` with a given kernel and schedule (the tests run each the CPU has).
#[allow(clippy::too_many_arguments)]
fn search_with<T: Coord>(
    kernel: dot_filter::Kernel,
    schedule: Schedule,
    data: &[T],
    query: Option<&[T]>,
    dim: usize,
    k: usize,
    indices: &mut [u32],
    acc: &mut [T],
    control: &Control,
) -> Result<Option<String>> {
    // One centre for both sides: the middle of the data's bounding box.
    let n = data.len() / dim;
    let mut center = vec![0.0; dim];
    for (c, m) in center.iter_mut().enumerate() {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for p in 0..n {
            let x = data[p * dim + c].to_f64();
            lo = lo.min(x);
            hi = hi.max(x);
        }
        *m = lo + (hi - lo) / 2.0;
    }
    control.check()?;
    let ptree = Tree::build_with(data, dim, ORDER_LEAF);
    control.check()?;
    let Some(points) = Side::new(&ptree, PB, &center, dim < DEFER_MIN_DIM) else {
        return Ok(None);
    };
    control.check()?;
    let qtree_own = query.map(|q| Tree::build_with(q, dim, ORDER_LEAF));
    let qtree = qtree_own.as_ref().unwrap_or(&ptree);
    let Some(queries) = Side::new(qtree, QB, &center, false) else {
        return Ok(None);
    };
    control.check()?;
    let self_join = query.is_none();
    let (margin, slack) = super::prune_margins::<T>(dim);
    // The point side's largest centring error and norm: one per join, so a query's cutoff
    // changes only with its heap.
    let (mut p_err, mut p_n2) = (0.0f64, 0.0f64);
    for b in 0..points.blocks.len() {
        let (_, e, n2) = points.fp.block(b);
        p_err = p_err.max(e);
        p_n2 = p_n2.max(n2);
    }
    let nblocks = points.blocks.len();

    // Each query block's answers, in the queries' tree order, then gathered into rows.
    control.stage("knn", queries.blocks.len() as u64);
    // One query block's answers and the number of point blocks it compared.
    let search_block = |qb: usize| -> (Vec<(T, u32)>, usize) {
        let qr = &queries.blocks[qb];
        let mut visited = 0;
        // Once stopped, the remaining blocks end before their setup (sorting every
        // point block by distance, the tiles' boxes): together it is tens of ms.
        if control.is_cancelled() {
            return (Vec::new(), 0);
        }
        let qn = qr.len();
        let mut states: Vec<Query<T>> = (0..qn).map(|_| Query::new(k)).collect();
        let (qblock, q_err, _) = queries.fp.block(qb);
        // The kernel's cutoff for a query of n2 `own` whose k-th accumulator is at most w.
        let cutoff = |w: f64, own: f32| match FilterBound::from_f64::<T>(w, dim) {
            Some(fb) => fb.cutoff_less_own(q_err, p_err, own as f64, p_n2, own),
            None => f32::INFINITY,
        };
        // The kernel's query copy: -2 x~ (exact).
        let scaled: Vec<f32> = qblock.cols.iter().map(|&v| -2.0 * v).collect();
        let sblock = Block {
            cols: &scaled,
            stride: qblock.stride,
            n2: qblock.n2,
            len: qn,
        };
        // Cutoffs: +inf until a heap is full; padding rows never survive.
        let mut h = vec![f32::NEG_INFINITY; qn.next_multiple_of(ROWS)];
        h[..qn].iter_mut().for_each(|x| *x = f32::INFINITY);
        // Point blocks by their centre's distance to this query block's, nearest first,
        // each with its box bound: a block beyond every heap's k-th value is skipped.
        let (qlo, qhi) = queries.bounds(qb, dim);
        let mut order: Vec<(f64, f64, u32)> = (0..nblocks)
            .map(|b| {
                let (blo, bhi) = points.bounds(b, dim);
                let key = centre_dist(qlo, qhi, blo, bhi);
                (key, box_bound(qlo, qhi, blo, bhi), b as u32)
            })
            .collect();
        order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        let qpts = &qtree.pts[qr.start * dim..qr.end * dim];
        // Each kernel row tile's bounding box.
        let ntiles = qn.div_ceil(ROWS);
        let mut tile_lo = vec![f64::INFINITY; ntiles * dim];
        let mut tile_hi = vec![f64::NEG_INFINITY; ntiles * dim];
        for (i, p) in qpts.chunks_exact(dim).enumerate() {
            let t = i / ROWS;
            for (c, &x) in p.iter().enumerate() {
                let x = x.to_f64();
                tile_lo[t * dim + c] = tile_lo[t * dim + c].min(x);
                tile_hi[t * dim + c] = tile_hi[t * dim + c].max(x);
            }
        }
        let qids = &qtree.ids[qr.clone()];
        // The loosest bound on a k-th accumulator once every query has one.
        let loosest = |states: &[Query<T>]| {
            states
                .iter()
                .try_fold(0.0f64, |m, st| st.w.is_finite().then(|| m.max(st.w)))
        };
        let mut loose: Option<f64> = None;
        for &(_, bound, b) in &order {
            // A stop leaves the block's heaps short: the caller discards them.
            if control.is_cancelled() {
                break;
            }
            if let Some(w) = loose {
                if bound > w * margin + slack {
                    continue;
                }
            }
            let b = b as usize;
            let (cblock, _, _) = points.fp.block(b);
            let pr = points.blocks[b].clone();
            let cids = &ptree.ids[pr.clone()];
            let ccols = match points.cols.is_empty() {
                true => &[][..],
                false => &points.cols[b * dim * PB..(b + 1) * dim * PB],
            };
            // Row tiles whose box may still enter one of their heaps.
            let (blo, bhi) = points.bounds(b, dim);
            let mut tiles = 0u64;
            for (t, rows) in states.chunks(ROWS).enumerate() {
                let open = match loosest(rows) {
                    None => true,
                    Some(w) => {
                        let (tlo, thi) = (&tile_lo[t * dim..][..dim], &tile_hi[t * dim..][..dim]);
                        box_bound(tlo, thi, blo, bhi) <= w * margin + slack
                    }
                };
                tiles |= (open as u64) << t;
            }
            if tiles == 0 {
                continue;
            }
            visited += 1;
            // A tile's candidates (lane, id) in `mask`, a self-kNN's query left out.
            let others = |i: usize, j0: usize, mut mask: u16| {
                std::iter::from_fn(move || {
                    let l = mask.trailing_zeros() as usize;
                    mask &= mask.wrapping_sub(1);
                    (l < dot_filter::COLS).then_some(l)
                })
                .map(move |l| (l, cids[j0 + l]))
                .filter(move |&(_, id)| !(self_join && id == qids[i]))
            };
            let mut changed = false;
            dot_filter::survivors_shifted(
                &sblock,
                &cblock,
                dim,
                &mut h,
                tiles,
                None,
                kernel,
                |i, j0, mask, _, f| {
                    let st = &mut states[i];
                    let mut tighter = false;
                    if dim < DEFER_MIN_DIM {
                        // Measured at once, 16 lanes from the column copy: cheap here,
                        // and the exact k-th is the tightest bound.
                        let w = st.exact.full().then(|| st.exact.worst());
                        let q = &qpts[i * dim..(i + 1) * dim];
                        let a = exact_tile(q, &ccols[j0..], PB, w, mask)?;
                        let heap = &mut st.exact;
                        let mut offered = false;
                        for (l, id) in others(i, j0, mask) {
                            if !heap.full() || key_less((a[l], id), heap.worst_item()) {
                                heap.offer((a[l], id));
                                offered = true;
                            }
                        }
                        if !offered || !heap.full() {
                            return None;
                        }
                        st.w = heap.worst().to_f64();
                        changed = true;
                        return Some(cutoff(st.w, qblock.n2[i]));
                    }
                    for (l, id) in others(i, j0, mask) {
                        let v = f[l];
                        st.pool.push((v, (pr.start + j0 + l) as u32));
                        if !v.is_nan()
                            && (!st.approx.full() || key_less((v, id), st.approx.worst_item()))
                        {
                            st.approx.offer((v, id));
                            tighter |= st.approx.full();
                        }
                    }
                    let own = qblock.n2[i];
                    if tighter {
                        let up = dot_filter::canonical_upper::<T>(
                            st.approx.worst(),
                            own,
                            q_err,
                            p_err,
                            own as f64,
                            p_n2,
                            dim,
                        );
                        tighter = up < st.w;
                        st.w = st.w.min(up);
                    }
                    if st.pool.len() >= POOL {
                        let q = &qpts[i * dim..(i + 1) * dim];
                        tighter |= st.trim(cutoff(st.w, own), q, &ptree);
                    }
                    if !tighter {
                        return None;
                    }
                    changed = true;
                    // The tightened cutoff, for the rest of this block and the next.
                    Some(cutoff(st.w, own))
                },
            );
            if changed {
                loose = loosest(&states);
            }
        }
        // Confirm what the final bounds leave: the k nearest are among them.
        let mut out = Vec::with_capacity(qn * k);
        for (i, st) in states.iter_mut().enumerate() {
            let q = &qpts[i * dim..(i + 1) * dim];
            st.finish(cutoff(st.w, qblock.n2[i]), q, &ptree, &mut out);
        }
        control.advance(1, qn as u64);
        (out, visited)
    };
    // A self-kNN from DEFER_MIN_DIM dimensions takes the symmetric schedule where the
    // blocks' bounds prune little: a sample of query blocks, searched first, shows how many
    // point blocks a query block compares (their answers are kept otherwise).
    let nq = queries.blocks.len();
    let sample: Vec<usize> = (0..SAMPLE.min(nq))
        .map(|i| i * nq / SAMPLE.min(nq))
        .collect();
    let mut done: Vec<Option<Vec<(T, u32)>>> = vec![None; nq];
    let can = self_join && dim >= DEFER_MIN_DIM && symmetric::usable::<T>(n, k);
    if can && schedule == Schedule::Symmetric {
        return symmetric::search(kernel, &ptree, &center, k, indices, acc, control);
    }
    if can && schedule == Schedule::Auto {
        let probe: Vec<(Vec<(T, u32)>, usize)> =
            sample.par_iter().map(|&qb| search_block(qb)).collect();
        control.check()?;
        let compared: usize = probe.iter().map(|p| p.1).sum();
        if compared as f64 > SYMMETRIC_FROM * (sample.len() * nblocks) as f64 {
            return symmetric::search(kernel, &ptree, &center, k, indices, acc, control);
        }
        for (&qb, (out, _)) in sample.iter().zip(probe) {
            done[qb] = Some(out);
        }
    }
    let per_block: Vec<Vec<(T, u32)>> = done
        .into_par_iter()
        .enumerate()
        .map(|(qb, out)| out.unwrap_or_else(|| search_block(qb).0))
        .collect();
    // Blocks cut short by a stop have short rows: they are never read.
    control.check()?;
    scatter_rows(&qtree.ids, QB, k, &per_block, indices, acc);
    Ok(Some(format!(
        "dot-product filter: blocks of {QB} queries x {PB} points in k-d tree order ({} point blocks, {} kernel), survivors confirmed exactly",
        nblocks,
        kernel.name()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dot_filter::Kernel;

    /// Every kernel the CPU runs gives the canonical brute force's answer: same indices, same
    /// accumulators bit for bit, ties by smaller index (integer data: many exact ties).
    #[test]
    fn kernels_match_brute_force() {
        let mut kernels = vec![Kernel::Portable];
        if dot_filter::fma_available() {
            kernels.push(Kernel::Fma);
        }
        if Kernel::detect() == Kernel::Avx512 {
            kernels.push(Kernel::Avx512);
        }
        let mut seed = 99u64;
        let mut rnd = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed >> 33
        };
        // Data: 0 reals, 1 small integers (many exact ties), 2 nine distinct points (ties in
        // their hundreds: from 32-D a query's pending candidates pass POOL and are
        // confirmed in the middle of the search).
        for (dim, n, m, k, data_kind) in [
            (8, 700, 0, 16, 0),
            (13, 300, 0, 299, 0),
            (64, 450, 0, 1, 0),
            (17, 400, 0, 9, 1),
            (40, 260, 150, 33, 1),
            (70, 200, 97, 200, 0),
            (48, 1400, 0, 7, 2),
            (48, 1400, 300, 600, 2),
            (384, 700, 300, 26, 0),
            (384, 700, 0, 26, 0),
            (40, 500, 0, 33, 1),
            (48, 1400, 0, 1, 2),
        ] {
            let mut gen = |count: usize| -> Vec<f32> {
                (0..count * dim)
                    .map(|i| match data_kind {
                        0 => (rnd() % 1_000_000) as f32 / 1e6 + 100.0,
                        1 => (rnd() % 3) as f32,
                        _ => ((i % dim < 2) as u64 * (rnd() % 3)) as f32,
                    })
                    .collect()
            };
            let data = gen(n);
            let query = (m > 0).then(|| gen(m));
            let rows = if m > 0 { m } else { n };
            // The oracle: every pair in canonical arithmetic, sorted by (accumulator, index).
            let mut want = Vec::with_capacity(rows * k);
            for r in 0..rows {
                let q = match &query {
                    Some(qs) => &qs[r * dim..(r + 1) * dim],
                    None => &data[r * dim..(r + 1) * dim],
                };
                let mut all: Vec<(f32, u32)> = (0..n)
                    .filter(|&j| m > 0 || j != r)
                    .map(|j| {
                        let p = &data[j * dim..(j + 1) * dim];
                        let a = q
                            .iter()
                            .zip(p)
                            .fold(0.0, |a, (&x, &y)| accumulate(Metric::Euclidean, a, x, y));
                        (a, j as u32)
                    })
                    .collect();
                all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                want.extend_from_slice(&all[..k]);
            }
            // A self-kNN from 384 points and DEFER_MIN_DIM dimensions also through the
            // symmetric schedule.
            let symmetric = m == 0 && dim >= DEFER_MIN_DIM && symmetric::usable::<f32>(n, k);
            let schedules = [Schedule::OneSided, Schedule::Auto, Schedule::Symmetric];
            let runs = kernels
                .iter()
                .flat_map(|&kn| schedules.map(|s| (kn, s)))
                .filter(|&(_, s)| s == Schedule::OneSided || symmetric);
            for (kernel, schedule) in runs {
                let mut idx = vec![0u32; rows * k];
                let mut acc = vec![0.0f32; rows * k];
                let done = search_with(
                    kernel,
                    schedule,
                    &data,
                    query.as_deref(),
                    dim,
                    k,
                    &mut idx,
                    &mut acc,
                    &Control::default(),
                )
                .unwrap();
                let sym = done.unwrap().contains("symmetric");
                assert!(schedule == Schedule::Auto || sym == (schedule == Schedule::Symmetric));
                let got: Vec<(f32, u32)> = acc.iter().copied().zip(idx.iter().copied()).collect();
                for (r, (g, w)) in got.chunks(k).zip(want.chunks(k)).enumerate() {
                    assert!(
                        g.iter()
                            .zip(w)
                            .all(|(a, b)| a.0.to_bits() == b.0.to_bits() && a.1 == b.1),
                        "{kernel:?} symmetric {sym} dim {dim} n {n} m {m} k {k} row {r}: {g:?} vs {w:?}"
                    );
                }
            }
        }
    }

    /// `dot_filter::canonical_upper` bounds every pair's canonical accumulator from above,
    /// from the kernel's value, and within the error of F: 1024-D, near-duplicates
    /// (cancellation) and points far from the centre with near-duplicate partners (centring
    /// error), in f32 and f64.
    #[test]
    fn kernel_values_bound_the_accumulator() {
        let mut seed = 7u64;
        let mut rnd = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        for (dim, scale, twin) in [(1024, 1.0, 0.0), (384, 0.1, 1e-4), (64, 1e3, 1e-3)] {
            let n = 160;
            let mut x = vec![0.0f64; n * dim];
            for p in 0..n {
                for c in 0..dim {
                    x[p * dim + c] = if p % 2 == 1 && twin > 0.0 {
                        x[(p - 1) * dim + c] + twin * rnd()
                    } else {
                        scale * rnd()
                    };
                }
            }
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            check_upper(&x, dim);
            check_upper(&x32, dim);
        }
    }

    fn check_upper<T: Coord>(x: &[T], dim: usize) {
        let tree = Tree::build_with(x, dim, ORDER_LEAF);
        let center = vec![0.0; dim];
        let side = Side::new(&tree, PB, &center, false).unwrap();
        let n = tree.ids.len();
        let mut checked = 0;
        for qb in 0..side.blocks.len() {
            let (qblock, q_err, _) = side.fp.block(qb);
            let scaled: Vec<f32> = qblock.cols.iter().map(|&v| -2.0 * v).collect();
            let sblock = Block {
                cols: &scaled,
                stride: qblock.stride,
                n2: qblock.n2,
                len: qblock.len,
            };
            let q0 = side.blocks[qb].start;
            let mut h = vec![f32::INFINITY; qblock.len.next_multiple_of(ROWS)];
            for b in 0..side.blocks.len() {
                let (cblock, p_err, p_n2) = side.fp.block(b);
                let p0 = side.blocks[b].start;
                let kernel = dot_filter::Kernel::detect();
                dot_filter::survivors_shifted(
                    &sblock,
                    &cblock,
                    dim,
                    &mut h,
                    !0,
                    None,
                    kernel,
                    |i, j0, mut m, _, f| {
                        while m != 0 {
                            let l = m.trailing_zeros() as usize;
                            m &= m - 1;
                            let (a, p) = (q0 + i, p0 + j0 + l);
                            let c = tree.pts[a * dim..(a + 1) * dim]
                                .iter()
                                .zip(&tree.pts[p * dim..(p + 1) * dim])
                                .fold(T::ZERO, |s, (&u, &v)| {
                                    accumulate(Metric::Euclidean, s, u, v)
                                })
                                .to_f64();
                            let own = qblock.n2[i];
                            let up = dot_filter::canonical_upper::<T>(
                                f[l], own, q_err, p_err, own as f64, p_n2, dim,
                            );
                            assert!(c <= up, "{dim}-D ({a}, {p}): accumulator {c} above {up}");
                            // No looser than the error of F allows: (sqrt(C) + sqrt(E))^2, E the
                            // f32 dot product's error bound on these norms.
                            let e = 4.0
                                * (dim as f64 + 16.0)
                                * f32::EPSILON as f64
                                * (own as f64 + p_n2);
                            let most = (c.sqrt() + e.sqrt()).powi(2) * 1.001 + 1e-30;
                            assert!(up <= most, "{dim}-D: {up} for {c} (at most {most})");
                            checked += 1;
                        }
                        None
                    },
                );
            }
        }
        assert_eq!(checked, n * n);
    }
}
