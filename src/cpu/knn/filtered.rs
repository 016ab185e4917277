//! High-dimensional Euclidean kNN: leaves of queries against leaves of points, through the
//! f32 dot-product filter of `dot_filter.rs`, every survivor confirmed in canonical
//! arithmetic. In 10 to 64+ dimensions a k-d tree prunes little and the exact per-dimension
//! kernel is the whole cost, while matrix-product peers (FAISS, scikit-learn's brute force)
//! run at the machine's flop rate; the filter gives that rate without their rounding.
//!
//! Per query leaf (a task), its queries' heaps meet the point leaves in order of the
//! box-to-box lower bound, nearest first, so the heaps tighten quickly; the scan stops at
//! the first leaf whose bound exceeds every heap's k-th accumulator (with the margin of
//! `Searcher::may_enter`). For each (query leaf, point leaf) the filter rejects a pair when
//! its F exceeds G(w), the cutoff of the query's heap: F > G(w) proves that the canonical
//! accumulator exceeds w, and a heap's w only ever decreases, so a rejected point could
//! never have entered. Queries whose heap the point leaf's box cannot enter are skipped. Survivors are measured exactly and offered to their heap.

use super::{key_less, Heap, Tree};
use crate::cpu::dot_filter::{self, FilterBound, FilterPoints};
use crate::cpu::store::Store;
use crate::error::Result;
use crate::metric::{accumulate, Coord};
use crate::options::Metric;
use rayon::prelude::*;

/// Points per leaf of both trees: a leaf pair is one call of the filter kernel.
const LEAF: usize = 64;

/// One side (points or queries): a tree in leaf order, its column store, the filter's f32
/// copy, and each leaf's range and bounding box.
struct Side<T> {
    tree: Tree<T>,
    fp: FilterPoints,
    leaves: Vec<std::ops::Range<usize>>,
    lo: Vec<f64>,
    hi: Vec<f64>,
}

impl<T: Coord> Side<T> {
    fn new(data: &[T], dim: usize, center: &[f64]) -> Option<Self> {
        let tree = Tree::build_with(data, dim, LEAF);
        let leaves: Vec<_> = tree
            .nodes
            .iter()
            .filter(|n| n.left == super::LEAF_MARK)
            .map(|n| n.start as usize..n.end as usize)
            .collect();
        let all: Vec<usize> = (0..dim).collect();
        // Slots in leaf order: slot s is the tree's point s.
        let store = Store::gather(data, dim, tree.ids.clone(), &all);
        let fp = FilterPoints::build(&store, center, &leaves)?;
        let mut lo = vec![f64::INFINITY; leaves.len() * dim];
        let mut hi = vec![f64::NEG_INFINITY; leaves.len() * dim];
        for (l, r) in leaves.iter().enumerate() {
            for p in r.clone() {
                for c in 0..dim {
                    let x = tree.pts[p * dim + c].to_f64();
                    lo[l * dim + c] = lo[l * dim + c].min(x);
                    hi[l * dim + c] = hi[l * dim + c].max(x);
                }
            }
        }
        Some(Side {
            tree,
            fp,
            leaves,
            lo,
            hi,
        })
    }
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

/// Runs the search into row-major `indices` / `acc` (accumulators, not yet square-rooted).
/// `Ok(None)` when the filter cannot be used on these data (norms too large for f32).
pub(super) fn search<T: Coord>(
    data: &[T],
    query: Option<&[T]>,
    dim: usize,
    k: usize,
    indices: &mut [u32],
    acc: &mut [T],
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
    let Some(points) = Side::new(data, dim, &center) else {
        return Ok(None);
    };
    let qside = match query {
        Some(q) => match Side::new(q, dim, &center) {
            Some(s) => Some(s),
            None => return Ok(None),
        },
        None => None,
    };
    let queries = qside.as_ref().unwrap_or(&points);
    let self_join = query.is_none();
    let fma = dot_filter::fma_available();
    let (margin, slack) = super::prune_margins::<T>(dim);
    // Leaves of identical points are not split: size the live masks for the largest.
    let widest = points
        .leaves
        .iter()
        .chain(&queries.leaves)
        .map(|r| r.len())
        .max()
        .unwrap_or(0);
    let live = vec![u64::MAX; widest.div_ceil(64) + 1];
    let nleaves = points.leaves.len();

    // Each query leaf's answers, in the queries' leaf order, then gathered into rows.
    let per_leaf: Vec<(usize, Vec<(T, u32)>)> = queries
        .leaves
        .par_iter()
        .enumerate()
        .map(|(ql, qr)| {
            let qn = qr.len();
            let mut heaps: Vec<Heap<T>> = (0..qn).map(|_| Heap::new(k)).collect();
            let (qblock, q_err, q_n2) = queries.fp.block(ql);
            // Point leaves by their box bound to this query leaf, nearest first.
            let qlo = &queries.lo[ql * dim..(ql + 1) * dim];
            let qhi = &queries.hi[ql * dim..(ql + 1) * dim];
            let mut order: Vec<(f64, u32)> = (0..nleaves)
                .map(|l| {
                    let b = box_bound(
                        qlo,
                        qhi,
                        &points.lo[l * dim..(l + 1) * dim],
                        &points.hi[l * dim..(l + 1) * dim],
                    );
                    (b, l as u32)
                })
                .collect();
            order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
            let qpts = &queries.tree.pts[qr.start * dim..qr.end * dim];
            let qids = &queries.tree.ids[qr.clone()];
            let mut q_live = vec![0u64; qn.div_ceil(64) + 1];
            let mut cut = vec![f32::INFINITY; qn];
            for &(bound, l) in &order {
                let l = l as usize;
                // Stop at the first leaf beyond every heap's k-th accumulator.
                let full = heaps.iter().all(|h| h.full());
                if full {
                    let loosest = heaps
                        .iter()
                        .map(|h| h.worst())
                        .fold(T::ZERO, |a, b| a.max(b));
                    if bound > loosest.to_f64() * margin + slack {
                        break;
                    }
                }
                // Live queries: those whose heap this leaf's box may still enter; the
                // cutoff is the loosest live one's.
                let (blo, bhi) = (
                    &points.lo[l * dim..(l + 1) * dim],
                    &points.hi[l * dim..(l + 1) * dim],
                );
                let (cblock, c_err, c_n2) = points.fp.block(l);
                q_live.iter_mut().for_each(|w| *w = 0);
                let mut any_live = false;
                for (i, h) in heaps.iter().enumerate() {
                    let gi = if !h.full() {
                        f32::INFINITY
                    } else {
                        let q = &qpts[i * dim..(i + 1) * dim];
                        let mut lb = 0.0;
                        for c in 0..dim {
                            let x = q[c].to_f64();
                            let gap = (blo[c] - x).max(x - bhi[c]).max(0.0);
                            lb += gap * gap;
                        }
                        let w = h.worst();
                        if lb > w.to_f64() * margin + slack {
                            continue;
                        }
                        match FilterBound::new(w, dim) {
                            Some(fb) => fb.cutoff(q_err, c_err, q_n2, c_n2),
                            None => f32::INFINITY,
                        }
                    };
                    q_live[i / 64] |= 1 << (i % 64);
                    cut[i] = gi;
                    any_live = true;
                }
                if !any_live {
                    continue;
                }
                let cr = points.leaves[l].clone();
                let cpts = &points.tree.pts[cr.start * dim..cr.end * dim];
                let cids = &points.tree.ids[cr.clone()];
                dot_filter::survivors(
                    &qblock,
                    &cblock,
                    dim,
                    &cut,
                    fma,
                    &q_live,
                    &live,
                    |i, j0, mask| {
                        let q = &qpts[i * dim..(i + 1) * dim];
                        let heap = &mut heaps[i];
                        let mut m = mask;
                        while m != 0 {
                            let j = j0 + m.trailing_zeros() as usize;
                            m &= m - 1;
                            let id = cids[j];
                            if self_join && id == qids[i] {
                                continue;
                            }
                            let p = &cpts[j * dim..(j + 1) * dim];
                            if heap.full() {
                                // Exact early exit: partial canonical sums never decrease.
                                let w = heap.worst();
                                let mut a = T::ZERO;
                                let mut out = false;
                                for (cq, cp) in q.chunks(8).zip(p.chunks(8)) {
                                    for (&x, &y) in cq.iter().zip(cp) {
                                        a = accumulate(Metric::Euclidean, a, x, y);
                                    }
                                    if a > w {
                                        out = true;
                                        break;
                                    }
                                }
                                if !out && key_less((a, id), heap.worst_item()) {
                                    heap.offer((a, id));
                                }
                            } else {
                                let mut a = T::ZERO;
                                for (&x, &y) in q.iter().zip(p) {
                                    a = accumulate(Metric::Euclidean, a, x, y);
                                }
                                heap.offer((a, id));
                            }
                        }
                    },
                );
            }
            let mut out = Vec::with_capacity(qn * k);
            for h in &mut heaps {
                out.extend(h.take_sorted());
            }
            (ql, out)
        })
        .collect();
    // Scatter rows: query slot s of leaf ql is the original row ids[s].
    let mut rows_of_leaf: Vec<&[(T, u32)]> = vec![&[]; queries.leaves.len()];
    for (ql, v) in &per_leaf {
        rows_of_leaf[*ql] = v;
    }
    let qids = &queries.tree.ids;
    let mut slot_of_row = vec![(0u32, 0u32); qids.len()];
    for (ql, r) in queries.leaves.iter().enumerate() {
        for (i, s) in r.clone().enumerate() {
            slot_of_row[qids[s] as usize] = (ql as u32, i as u32);
        }
    }
    indices
        .par_chunks_mut(k)
        .zip(acc.par_chunks_mut(k))
        .zip(slot_of_row.par_iter())
        .for_each(|((oi, oa), &(ql, i))| {
            let row = &rows_of_leaf[ql as usize][i as usize * k..(i as usize + 1) * k];
            for (c, &(a, id)) in row.iter().enumerate() {
                oi[c] = id;
                oa[c] = a;
            }
        });
    Ok(Some(format!(
        "dot-product filter ({} point leaves of <= {LEAF}, {} kernel)",
        nleaves,
        if fma { "FMA" } else { "portable" }
    )))
}
