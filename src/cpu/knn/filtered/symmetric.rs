//! The self-kNN's symmetric schedule of the filtered search (`super`): each pair of point
//! blocks is compared once, and each kernel value serves both points, the row's heap
//! through the row cutoff and the column's through `dot_filter::ColumnTest`. Where nothing
//! can be pruned (data without structure, most of all in high dimensions) that is half the
//! multiply-adds of meeting every block from both sides, and those are most of the search.
//!
//! Blocks of SB points are cut from the k-d tree's leaf order, P of them rounded up to a
//! power of two. Block a meets block a xor r for every r < P (r = 0: the block with
//! itself): for a given r that is a matching, so its pairs touch disjoint points. The r are
//! taken in groups of G: in round R, group ga (blocks ga G..) meets group ga xor R, and
//! one thread runs all pairs of the two groups (r = R G + s, s < G) while their 2 G blocks'
//! states stay in cache; the rounds' group pairs are disjoint and run in parallel without
//! waiting on each other. As blocks are in tree order, small r pairs near blocks: they
//! come first and tighten the bounds for the far ones. Every point keeps its state
//! (`Query`) through all rounds, so memory grows with n: above MAX_STATE_BYTES the
//! one-sided search runs instead.
//!
//! A pool is filled from both sides, so it holds F itself (`dot_filter::full_value`, from
//! below), compared with the point's full cutoff G (`FilterBound::cutoff`), and the k
//! smallest F from above bound the k-th accumulator (`canonical_upper`). The rest is the
//! one-sided search's: the same bounds, pools, confirmation and ranking.

use super::{box_bound, scatter_rows, Query, Side, POOL, ROWS};
use crate::control::Control;
use crate::cpu::dot_filter::{self, Block, ColumnTest, FilterBound};
use crate::cpu::knn::{key_less, Tree};
use crate::error::Result;
use crate::metric::Coord;
use rayon::prelude::*;
use std::sync::Mutex;

/// Points per block, as rows and as columns: a multiple of ROWS, COLS and the AVX-512
/// kernel's 32 candidates.
const SB: usize = 96;

/// Blocks per group (module doc): the pairs of two groups, 2 G blocks, run on one thread
/// while their states stay in cache (sphere 384-D, 20k: G = 4 took 1.77-1.80 s, G = 1
/// 1.90-2.03 s, G = 16 1.97 s).
const G: usize = 4;

/// The most the points' states may take together (pools full, heaps full).
const MAX_STATE_BYTES: usize = 1 << 30;

/// Whether a self-kNN of `n` points and `k` neighbours runs here: enough blocks for the
/// schedule to matter, and the states within MAX_STATE_BYTES.
pub(super) fn usable<T>(n: usize, k: usize) -> bool {
    let per_point = POOL * 8 + k * (std::mem::size_of::<T>() + 4 + 8) + 128;
    n >= 4 * SB && n.saturating_mul(per_point) <= MAX_STATE_BYTES
}

/// The join's constants: every point's bound uses the largest centring error and norm.
struct Ctx<'a, T> {
    dim: usize,
    err: f64,
    n2max: f64,
    tree: &'a Tree<T>,
}

impl<T: Coord> Ctx<'_, T> {
    /// The full cutoff G of a point of n2 `own` whose k-th accumulator is at most `w`.
    fn cut(&self, w: f64, own: f32) -> f32 {
        match FilterBound::from_f64::<T>(w, self.dim) {
            Some(fb) => fb.cutoff(self.err, self.err, own as f64, self.n2max),
            None => f32::INFINITY,
        }
    }

    /// The row cutoff G - n_a (`FilterBound::cutoff_less_own`).
    fn row_cut(&self, w: f64, own: f32) -> f32 {
        match FilterBound::from_f64::<T>(w, self.dim) {
            Some(fb) => fb.cutoff_less_own(self.err, self.err, own as f64, self.n2max, own),
            None => f32::INFINITY,
        }
    }

    /// Offers the point at slot `q` (n2 `own`, state `st`) the candidate at `slot`, whose
    /// kernel value is `f` (F - n_a) with the row's n2 `row_own`. True when its bound w
    /// tightened.
    #[allow(clippy::too_many_arguments)]
    fn offer(
        &self,
        st: &mut Query<T>,
        q: usize,
        own: f32,
        f: f32,
        row_own: f32,
        slot: usize,
    ) -> bool {
        let (lo, hi) = dot_filter::full_value(f, row_own);
        let id = self.tree.ids[slot];
        st.pool.push((lo, slot as u32));
        let mut tighter = false;
        if !hi.is_nan() && (!st.approx.full() || key_less((hi, id), st.approx.worst_item())) {
            st.approx.offer((hi, id));
            if st.approx.full() {
                let up = dot_filter::canonical_upper::<T>(
                    st.approx.worst(),
                    0.0,
                    self.err,
                    self.err,
                    own as f64,
                    self.n2max,
                    self.dim,
                );
                tighter = up < st.w;
                st.w = st.w.min(up);
            }
        }
        if st.pool.len() >= POOL {
            let qp = &self.tree.pts[q * self.dim..(q + 1) * self.dim];
            tighter |= st.trim(self.cut(st.w, own), qp, self.tree);
        }
        tighter
    }
}

/// Runs the symmetric self-kNN of `tree`'s points (as `super::search_with`, whose centre
/// and tree it shares) into row-major `indices` / `acc`. `Ok(None)` when the filter cannot
/// be used on these data.
#[allow(clippy::too_many_arguments)]
pub(super) fn search<T: Coord>(
    kernel: dot_filter::Kernel,
    tree: &Tree<T>,
    center: &[f64],
    k: usize,
    indices: &mut [u32],
    acc: &mut [T],
    control: &Control,
) -> Result<Option<String>> {
    let dim = tree.dim;
    let Some(side) = Side::new(tree, SB, center, false) else {
        return Ok(None);
    };
    control.check()?;
    let nb = side.blocks.len();
    let (mut err, mut n2max) = (0.0f64, 0.0f64);
    for b in 0..nb {
        let (_, e, n2) = side.fp.block(b);
        err = err.max(e);
        n2max = n2max.max(n2);
    }
    let ctx = Ctx {
        dim,
        err,
        n2max,
        tree,
    };
    let (margin, slack) = crate::cpu::knn::prune_margins::<T>(dim);
    let states: Vec<Mutex<Vec<Query<T>>>> = side
        .blocks
        .iter()
        .map(|r| Mutex::new(r.clone().map(|_| Query::new(k)).collect()))
        .collect();
    // The loosest bound of a block's points once all have one.
    let loosest = |st: &[Query<T>]| {
        st.iter()
            .try_fold(0.0f64, |m, s| s.w.is_finite().then(|| m.max(s.w)))
    };

    // Block a's rows against block b's columns (b == a: the block with itself, rows only,
    // each point's own pair left out).
    let pair = |a: usize, b: usize| {
        let (ab, _, _) = side.fp.block(a);
        let (bb, _, _) = side.fp.block(b);
        let (a0, b0) = (side.blocks[a].start, side.blocks[b].start);
        let mut sa = states[a].lock().unwrap_or_else(|p| p.into_inner());
        let mut sb_guard = (a != b).then(|| states[b].lock().unwrap_or_else(|p| p.into_inner()));
        let bound = {
            let (alo, ahi) = side.bounds(a, dim);
            let (blo, bhi) = side.bounds(b, dim);
            box_bound(alo, ahi, blo, bhi)
        };
        // Skipped when no point of either block can enter the other's heaps.
        let open = |w: Option<f64>| w.is_none_or(|w| bound <= w * margin + slack);
        let b_open = sb_guard.as_deref().is_some_and(|s| open(loosest(s)));
        if a != b && !open(loosest(&sa)) && !b_open {
            return;
        }
        // The kernel's row copy: -2 x~ (exact).
        let scaled: Vec<f32> = ab.cols.iter().map(|&v| -2.0 * v).collect();
        let rows = Block {
            cols: &scaled,
            stride: ab.stride,
            n2: ab.n2,
            len: ab.len,
        };
        let mut h = vec![f32::NEG_INFINITY; ab.len.next_multiple_of(ROWS)];
        for (i, st) in sa.iter().enumerate() {
            h[i] = ctx.row_cut(st.w, ab.n2[i]);
        }
        let mut cut = vec![f32::NEG_INFINITY; bb.n2.len()];
        if let Some(sb) = sb_guard.as_deref() {
            for (j, st) in sb.iter().enumerate() {
                cut[j] = ctx.cut(st.w, bb.n2[j]);
            }
        }
        let columns = ColumnTest {
            own: ab.n2,
            cut: &cut,
        };
        let mut sb = sb_guard.as_deref_mut();
        dot_filter::survivors_shifted(
            &rows,
            &bb,
            dim,
            &mut h,
            !0,
            b_open.then_some(&columns),
            kernel,
            |i, j0, mut m, mut cm, f| {
                let own = ab.n2[i];
                let mut tighter = false;
                while m != 0 {
                    let l = m.trailing_zeros() as usize;
                    m &= m - 1;
                    if a == b && j0 + l == i {
                        continue;
                    }
                    tighter |= ctx.offer(&mut sa[i], a0 + i, own, f[l], own, b0 + j0 + l);
                }
                if let Some(sb) = sb.as_deref_mut() {
                    while cm != 0 {
                        let l = cm.trailing_zeros() as usize;
                        cm &= cm - 1;
                        let j = j0 + l;
                        ctx.offer(&mut sb[j], b0 + j, bb.n2[j], f[l], own, a0 + i);
                    }
                }
                // The tightened row cutoff, for the rest of the pair.
                tighter.then(|| ctx.row_cut(sa[i].w, own))
            },
        );
    };

    // Rounds of groups of G blocks: group ga meets ga xor big, and within that, block a
    // meets a xor (big G + s) for s = 0..G, so the pairs of two groups run on one thread
    // while their states stay in cache.
    let p = nb.next_power_of_two();
    let g = G.min(p);
    let groups = p / g;
    control.stage("knn", groups as u64);
    for big in 0..groups {
        let gpairs: Vec<usize> = (0..groups)
            .filter(|&ga| ga <= ga ^ big && (ga ^ big) * g < nb)
            .collect();
        gpairs.par_iter().for_each(|&ga| {
            for s in 0..g {
                for a in ga * g..((ga + 1) * g).min(nb) {
                    let b = a ^ (big * g + s);
                    // A stop ends the remaining pairs at once.
                    if a <= b && b < nb && !control.is_cancelled() {
                        pair(a, b);
                    }
                }
            }
        });
        control.check()?;
        control.advance(1, 0);
    }

    // Confirm what the final bounds leave: the k nearest are among them.
    let per_block: Vec<Vec<(T, u32)>> = states
        .into_par_iter()
        .enumerate()
        .map(|(b, st)| {
            let mut st = st.into_inner().unwrap_or_else(|p| p.into_inner());
            let (bb, _, _) = side.fp.block(b);
            let b0 = side.blocks[b].start;
            let mut out = Vec::with_capacity(st.len() * k);
            for (i, st) in st.iter_mut().enumerate() {
                let q = &tree.pts[(b0 + i) * dim..(b0 + i + 1) * dim];
                st.finish(ctx.cut(st.w, bb.n2[i]), q, tree, &mut out);
            }
            out
        })
        .collect();
    control.check()?;
    scatter_rows(&tree.ids, SB, k, &per_block, indices, acc);
    Ok(Some(format!(
        "dot-product filter, symmetric: {nb} blocks of {SB} points in k-d tree order, each pair of blocks compared once ({groups} rounds of groups of {g} blocks, {} kernel), survivors confirmed exactly",
        kernel.name()
    )))
}
