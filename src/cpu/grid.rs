//! Grid-join: an eps-grid over k indexed dimensions (highest variance first), points
//! sorted by linear cell id (so each cell, and each run of cells along the last indexed
//! dimension, is one contiguous slice), and a scan of the adjacent cells per query point.
//!
//! The 3^k neighbour cells of a cell form 3^(k-1) contiguous slot ranges (one per row along
//! the last indexed dimension), found by binary search in the sorted list of non-empty
//! cells. A self-join visits only the rows that are lexicographically >= its own (each
//! unordered cell pair once, like GPU-SJ's unicomp) and, in its own row, only slots after
//! the query point.

use super::emit::Hits;
use super::store::{avx2_available, scan_blocks, BlockHits, MetricKind, Store, LANES};
use crate::control::Control;
use crate::error::Result;
use crate::grid::GridGeometry;
use crate::metric::Coord;
use rayon::prelude::*;

/// Most points of one cell handled by one work item (large cells are split for balance).
const ITEM_POINTS: usize = 256;
/// Coordinates compared (candidates x dimensions) between two reads of the job's control
/// inside one work item: a few ms. An item's candidates are its neighbour cells' points,
/// which a wide eps in many dimensions makes the whole set (200,000 32-D points at eps
/// 0.5: one item of 256 queries ran 0.1-0.4 s, and CI's stop waited 290 ms for one).
const CHECK_WORK: usize = 1 << 22;
/// A grid with at most this many cells per point gets a direct cell -> slot table.
const DENSE_CELLS_PER_POINT: u64 = 4;

/// The sorted order's base pointer, shared by the scatter's workers (disjoint positions).
struct SlotsPtr(*mut u32);
// SAFETY: a plain pointer into a buffer that outlives the scoped workers; each worker
// writes only its own disjoint positions (see `at`), so sharing it races on nothing.
unsafe impl Send for SlotsPtr {}
// SAFETY: as above.
unsafe impl Sync for SlotsPtr {}
impl SlotsPtr {
    /// Caller guarantees `i` is in bounds and no other worker writes it.
    unsafe fn at(&self, i: usize) -> *mut u32 {
        self.0.add(i)
    }
}

/// Points sorted by grid cell.
pub(crate) struct GridIndex<T> {
    pub store: Store<T>,
    /// Sorted linear ids of the non-empty cells.
    pub cell_ids: Vec<u64>,
    /// Slot range of cell c: `cell_start[c]..cell_start[c + 1]`.
    pub cell_start: Vec<usize>,
    /// For a dense grid (few cells per point): first slot of every cell, empty or not
    /// (length total cells + 1), so neighbour rows need no search.
    dense: Option<Vec<u32>>,
}

impl<T: Coord> GridIndex<T> {
    /// Sorts `data` (row-major, `dim` wide) by cell of `geom` (whose total_cells must fit
    /// u64) and stores it in dataset dimension order.
    pub fn build(data: &[T], dim: usize, geom: &GridGeometry) -> Self {
        let n = data.len() / dim;
        let key = |i: usize| {
            let p = &data[i * dim..(i + 1) * dim];
            let mut id = 0u64;
            for (axis, &j) in geom.dims.iter().enumerate() {
                id = id * geom.cells[axis] + geom.coord(axis, p[j].to_f64());
            }
            id
        };
        let total = geom
            .total_cells()
            .expect("grid plans keep linear cell ids in u64");
        // Room for every cell up front: capacity is not touched until written, and growing
        // would copy (fresh pages and copies are much of a 10^5-point build's time).
        let mut cell_ids = Vec::with_capacity(n);
        let mut cell_start = Vec::with_capacity(n + 1);
        let (order, dense) = if total <= (DENSE_CELLS_PER_POINT * n as u64).max(1024) {
            // Counting sort: O(n), and the prefix sums double as a direct cell -> slot table.
            // Parallel: each part of the points counts its cells, then scatters its points
            // to its own (disjoint) positions within each cell, keeping the input order.
            // Cell ids fit u32 here (total <= 4n).
            let keys: Vec<u32> = (0..n)
                .into_par_iter()
                .with_min_len(4096)
                .map(|i| key(i) as u32)
                .collect();
            let total = total as usize;
            let parts = rayon::current_num_threads().clamp(1, 8);
            let part_len = n.div_ceil(parts).max(1);
            let mut next: Vec<Vec<u32>> = keys
                .par_chunks(part_len)
                .map(|ks| {
                    let mut h = vec![0u32; total];
                    for &k in ks {
                        h[k as usize] += 1;
                    }
                    h
                })
                .collect();
            let mut start = vec![0u32; total + 1];
            for c in 0..total {
                let mut acc = start[c];
                for h in next.iter_mut() {
                    let count = h[c];
                    h[c] = acc;
                    acc += count;
                }
                if acc > start[c] {
                    cell_ids.push(c as u64);
                    cell_start.push(start[c] as usize);
                }
                start[c + 1] = acc;
            }
            let mut order = Vec::with_capacity(n + LANES);
            order.resize(n, 0u32);
            let out = SlotsPtr(order.as_mut_ptr());
            keys.par_chunks(part_len)
                .zip(next.par_iter_mut())
                .enumerate()
                .for_each(|(p, (ks, pos))| {
                    for (i, &k) in ks.iter().enumerate() {
                        let at = &mut pos[k as usize];
                        // SAFETY: positions come from disjoint prefix-sum ranges, each < n.
                        unsafe { *out.at(*at as usize) = (p * part_len + i) as u32 };
                        *at += 1;
                    }
                });
            (order, Some(start))
        } else if total <= 1 << 32 {
            // Cell ids fit u32: a radix sort of (cell, point), stable, so each cell's points
            // stay in input order as the counting sort leaves them (10^5 clustered 3-D
            // points in 10^6 cells: the index build's sort 10% -> 1% of DBSCAN's time).
            let mut pairs: Vec<[u32; 2]> = (0..n)
                .into_par_iter()
                .with_min_len(4096)
                .map(|i| [key(i) as u32, i as u32])
                .collect();
            crate::result::radix::sort_by_first(&mut pairs);
            for (s, &[id, _]) in pairs.iter().enumerate() {
                if cell_ids.last() != Some(&u64::from(id)) {
                    cell_ids.push(u64::from(id));
                    cell_start.push(s);
                }
            }
            let mut order = Vec::with_capacity(n + LANES);
            order.extend(pairs.iter().map(|&[_, i]| i));
            (order, None)
        } else {
            let mut pairs: Vec<(u64, u32)> = (0..n)
                .into_par_iter()
                .with_min_len(4096)
                .map(|i| (key(i), i as u32))
                .collect();
            pairs.par_sort_unstable();
            for (s, &(id, _)) in pairs.iter().enumerate() {
                if cell_ids.last() != Some(&id) {
                    cell_ids.push(id);
                    cell_start.push(s);
                }
            }
            let mut order = Vec::with_capacity(n + LANES);
            order.extend(pairs.iter().map(|&(_, i)| i));
            (order, None)
        };
        cell_start.push(n);
        let dims: Vec<usize> = (0..dim).collect();
        GridIndex {
            store: Store::gather(data, dim, order, &dims),
            cell_ids,
            cell_start,
            dense,
        }
    }

    /// Slot range of the non-empty cells with linear ids in `lo..=hi`. `from`: where the
    /// previous lookup of this row of neighbours started in `cell_ids` (set to this one's
    /// start): the cells of a work chunk come in ascending order, and so does each row's
    /// `lo`, so the search gallops forward from there instead of bisecting the whole list
    /// (sparse grids: the binary searches were 37% of a 3-D join of 10^5 clustered points).
    #[inline]
    pub(crate) fn slots(&self, lo: u64, hi: u64, from: &mut usize) -> (usize, usize) {
        if let Some(start) = &self.dense {
            return (start[lo as usize] as usize, start[hi as usize + 1] as usize);
        }
        // Galloping from `from` needs every id before it to be < lo.
        if *from > 0 && self.cell_ids[*from - 1] >= lo {
            *from = 0;
        }
        let a = *from + gallop(&self.cell_ids[*from..], |&x| x < lo);
        let b = a + gallop(&self.cell_ids[a..], |&x| x <= hi);
        *from = a;
        (self.cell_start[a], self.cell_start[b])
    }
}

/// `s.partition_point(pred)` by exponential search from the start: O(log p) for a
/// partition point p, so cheap when it is near.
#[inline]
fn gallop(s: &[u64], pred: impl Fn(&u64) -> bool) -> usize {
    // Invariant: every element of s[..lo] satisfies pred.
    let (mut lo, mut step) = (0, 1);
    while step <= s.len() && pred(&s[step - 1]) {
        lo = step;
        step *= 2;
    }
    lo + s[lo..(step - 1).min(s.len())].partition_point(pred)
}

/// Cell coordinates of a linear id (row-major, last indexed dimension fastest).
fn decode(geom: &GridGeometry, mut id: u64, out: &mut [u64]) {
    for axis in (0..geom.k()).rev() {
        out[axis] = id % geom.cells[axis];
        id /= geom.cells[axis];
    }
}

/// Offsets in {-1,0,1}^(k-1) for the leading indexed dimensions; for a self-join only the
/// lexicographically non-negative ones. Returns (offsets flattened, index of the zero one).
fn row_offsets(k: usize, self_join: bool) -> (Vec<i64>, usize) {
    let lead = k - 1;
    let mut all = Vec::new();
    let mut zero = usize::MAX;
    let count = 3usize.pow(lead as u32);
    for m in 0..count {
        let mut v = vec![0i64; lead];
        let mut r = m;
        for x in v.iter_mut().rev() {
            *x = (r % 3) as i64 - 1;
            r /= 3;
        }
        let sign = v.iter().find(|&&x| x != 0).copied().unwrap_or(0);
        if self_join && sign < 0 {
            continue;
        }
        if sign == 0 {
            zero = all.len() / lead.max(1);
        }
        all.extend_from_slice(&v);
    }
    if lead == 0 {
        zero = 0;
    }
    (all, zero)
}

/// Joins query points (grid `qidx`) with the indexed points (`idx`): a self-join's half
/// stencil when `self_join` (then `qidx` is `idx`), else every adjacent cell. Hits go, as
/// original ids, to the worker's output that `out` makes; each query point's hits are given
/// together, by one worker, then `end_query`. `control` is read between items and told
/// of each task's items and pairs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn join<T: Coord, M: MetricKind, O: Hits<T>>(
    geom: &GridGeometry,
    qidx: &GridIndex<T>,
    idx: &GridIndex<T>,
    self_join: bool,
    thr: T,
    out: &(impl Fn() -> O + Sync),
    threads: usize,
    control: &Control,
) -> Result<()> {
    let k = geom.k();
    let lead = k - 1;
    let (offsets, zero_row) = row_offsets(k, self_join);
    let rows = offsets.len().checked_div(lead).unwrap_or(1);
    let last = k - 1;
    let last_cells = geom.cells[last];
    // Work items: (cell, first slot, end slot) with at most ITEM_POINTS query points.
    let mut items: Vec<(u32, u32, u32)> = Vec::with_capacity(qidx.cell_ids.len());
    for c in 0..qidx.cell_ids.len() {
        let (mut s, e) = (qidx.cell_start[c], qidx.cell_start[c + 1]);
        while s < e {
            let t = (s + ITEM_POINTS).min(e);
            items.push((c as u32, s as u32, t as u32));
            s = t;
        }
    }
    let dim = idx.store.dim;
    let early = dim > 4;
    let per_task = (items.len() / (threads * 64)).max(1);
    control.stage("join", items.len() as u64);
    let avx2 = avx2_available();
    // Buffers live per rayon job (not per chunk), so output buffers are reused.
    let scratch = || {
        let em = out();
        (
            em,
            vec![T::ZERO; dim],
            vec![0u64; k],
            Vec::<(usize, usize)>::with_capacity(rows),
            vec![0usize; rows],
        )
    };
    items
        .par_chunks(per_task)
        .for_each_init(scratch, |(em, q, cell, ranges, cursors), chunk| {
            let mut own_row_range = (0usize, 0usize);
            cursors.fill(0);
            let found = em.found();
            for &(c, s0, s1) in chunk {
                // Items are at most ITEM_POINTS query points: a stop is seen promptly.
                if em.stopped() || control.check().is_err() {
                    return;
                }
                decode(geom, qidx.cell_ids[c as usize], cell);
                ranges.clear();
                let x = cell[last];
                let (x_lo, x_hi) = (x.saturating_sub(1), (x + 1).min(last_cells - 1));
                'rows: for r in 0..rows {
                    // Linear id of (cell[..lead] + offset, 0).
                    let mut base = 0u64;
                    for a in 0..lead {
                        let v = cell[a] as i64 + offsets[r * lead + a];
                        if v < 0 || v as u64 >= geom.cells[a] {
                            continue 'rows;
                        }
                        base = base * geom.cells[a] + v as u64;
                    }
                    base *= last_cells;
                    let range = if self_join && r == zero_row {
                        // Own row: this cell and the next one along the last dimension.
                        idx.slots(base + x, base + x_hi, &mut cursors[r])
                    } else {
                        idx.slots(base + x_lo, base + x_hi, &mut cursors[r])
                    };
                    if self_join && r == zero_row {
                        own_row_range = range;
                    } else if range.0 < range.1 {
                        ranges.push(range);
                    }
                }
                // The item's queries in runs of about CHECK_WORK compared coordinates,
                // the control read between them (each query's hits stay together).
                let (s0, s1) = (s0 as usize, s1 as usize);
                let own = if self_join {
                    own_row_range.1.saturating_sub(s0)
                } else {
                    0
                };
                let candidates = own + ranges.iter().map(|r| r.1 - r.0).sum::<usize>();
                let step = (CHECK_WORK / (candidates * dim).max(1)).max(1);
                let mut from = s0;
                while from < s1 {
                    if from > s0 && (em.stopped() || control.check().is_err()) {
                        return;
                    }
                    let span = Span {
                        s0: from,
                        s1: (from + step).min(s1),
                        own_end: own_row_range.1,
                    };
                    from = span.s1;
                    #[cfg(target_arch = "x86_64")]
                    if avx2 {
                        // SAFETY: avx2 was detected at run time.
                        unsafe {
                            query_cell_avx2::<T, M, O>(
                                qidx, idx, span, ranges, self_join, thr, early, em, q,
                            )
                        };
                        continue;
                    }
                    query_cell_sized::<T, M, O, false>(
                        qidx, idx, span, ranges, self_join, thr, early, em, q,
                    );
                }
            }
            control.advance(chunk.len() as u64, em.found() - found);
        });
    Ok(())
}

/// Query slots `s0..s1` of one cell; a self-join also scans its own row up to `own_end`.
#[derive(Clone, Copy)]
struct Span {
    s0: usize,
    s1: usize,
    own_end: usize,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn query_cell_avx2<T: Coord, M: MetricKind, O: Hits<T>>(
    qidx: &GridIndex<T>,
    idx: &GridIndex<T>,
    span: Span,
    ranges: &[(usize, usize)],
    self_join: bool,
    thr: T,
    early: bool,
    em: &mut O,
    q: &mut [T],
) {
    query_cell_sized::<T, M, O, true>(qidx, idx, span, ranges, self_join, thr, early, em, q)
}

/// `query_cell` with the query in a fixed-size array for 1-4 dimensions, so that the
/// kernel's dimension loop is unrolled.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn query_cell_sized<T: Coord, M: MetricKind, O: Hits<T>, const AVX: bool>(
    qidx: &GridIndex<T>,
    idx: &GridIndex<T>,
    span: Span,
    ranges: &[(usize, usize)],
    self_join: bool,
    thr: T,
    early: bool,
    em: &mut O,
    q: &mut [T],
) {
    macro_rules! by_len {
        ($($n:literal),*) => {
            match q.len() {
                $($n => query_cell::<T, M, O, AVX>(
                    qidx, idx, span, ranges, self_join, thr, early, em, &mut [T::ZERO; $n],
                ),)*
                _ => query_cell::<T, M, O, AVX>(qidx, idx, span, ranges, self_join, thr, early, em, q),
            }
        };
    }
    by_len!(1, 2, 3, 4)
}

/// Scans the neighbour ranges for every query point of one work item.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn query_cell<T: Coord, M: MetricKind, O: Hits<T>, const AVX: bool>(
    qidx: &GridIndex<T>,
    idx: &GridIndex<T>,
    span: Span,
    ranges: &[(usize, usize)],
    self_join: bool,
    thr: T,
    early: bool,
    em: &mut O,
    q: &mut [T],
) {
    let ids = &idx.store.ids;
    for s in span.s0..span.s1 {
        qidx.store.point(s, q);
        let qid = qidx.store.ids[s];
        let mut to = ToOutput::<T, O, AVX> {
            em: &mut *em,
            q,
            qid,
            ids,
            unique: self_join,
        };
        if self_join {
            scan_blocks::<T, M, AVX>(q, &idx.store, s + 1, span.own_end, thr, early, &mut to);
        }
        for &(lo, hi) in ranges {
            scan_blocks::<T, M, AVX>(q, &idx.store, lo, hi, thr, early, &mut to);
        }
        em.end_query(s);
    }
}

/// One query's blocks with matches, to the worker's output.
struct ToOutput<'a, T, O, const AVX: bool> {
    em: &'a mut O,
    q: &'a [T],
    qid: u32,
    /// The index's ids by slot.
    ids: &'a [u32],
    /// A self-join's half stencil: pairs as `[min, max]`.
    unique: bool,
}

impl<T, O: Hits<T>, const AVX: bool> BlockHits for &mut ToOutput<'_, T, O, AVX> {
    #[inline(always)]
    fn hit(&mut self, b: usize, mask: u32) {
        self.em
            .hits::<AVX>(self.q, self.qid, b, &self.ids[b..], mask, self.unique)
    }
}

#[cfg(test)]
mod tests {
    use super::gallop;

    #[test]
    fn gallop_is_partition_point() {
        let s: Vec<u64> = (0..100).map(|x| x * 3).collect();
        for len in 0..=s.len() {
            for t in 0..310 {
                let s = &s[..len];
                assert_eq!(gallop(s, |&x| x < t), s.partition_point(|&x| x < t));
                assert_eq!(gallop(s, |&x| x <= t), s.partition_point(|&x| x <= t));
            }
        }
    }
}
