//! Expanded-distance filter for high-dimensional Euclidean joins.
//!
//! In high dimensions the exact kernel (a subtraction, multiplication and addition per
//! dimension and pair, in the canonical order every backend shares) is the whole cost,
//! while peers that compute |x|^2 + |y|^2 - 2 x.y with a matrix product run at the
//! machine's peak flop rate, but round differently from everyone else. This filter takes
//! the matrix product's speed without its answers: register-blocked FMA dot products of f32
//! copies of the centred points only decide which pairs can be *rejected*, under a proven
//! error bound, and every survivor is decided by `metric::within` in canonical arithmetic.
//! The pair set is therefore the one every other backend returns, bit for bit.
//!
//! The bound, for points a, b with real distance D (of their T values):
//! - each point is stored as x~ = f32(x - m) for a centre m (x - m taken in f64), so
//!   |x~ - (x - m)| <= (u32 + 2 u64) |x - m| per coordinate and, with D~ = |x~_a - x~_b|,
//!   D >= D~ - c_a - c_b where c_p = 1.01 u32 |x~_p| (+ an underflow term, which also
//!   covers flushing subnormal x~ to zero: `centred`);
//! - F = n_a + n_b - 2 x~_a.x~_b, evaluated in f32 in any order, with or without FMA (n_p is
//!   |x~_p|^2 rounded once to f32), is within E = kappa (n_a + n_b) + sigma of D~^2: the dot
//!   product's gamma_d sum|x~_a x~_b| <= gamma_d (n_a + n_b) / 2 plus three final roundings
//!   of at most 2 (n_a + n_b) each; kappa = 4 (d + 16) u32 leaves more than 2x spare;
//! - the canonical sum C (metric.rs, in T) is >= D^2 (1 - (d + 3) u_T) - 2 d tiny_T, so
//!   D^2 > t_real = (thr + 2 d tiny_T) / (1 - 2 (d + 3) u_T) implies C > thr.
//!
//! Hence F > G = (sqrt(t_real) + c_a + c_b)^2 + E implies D^2 > t_real: no match. G grows
//! with c and n, so one G built from a block's maxima serves every pair of the block.
//!
//! The kNN kernel (`survivors_shifted`) evaluates F as n_b + sum(-2 x~_a x~_b) in f32 (d
//! roundings, error <= gamma_d (n_b + 2 sum|x~_a x~_b|) <= 2 gamma_d (n_a + n_b)) and then
//! adds n_a exactly, by comparing with G - n_a rounded up (`cutoff_less_own`): one more
//! order of the same sum, inside E's spare (2 gamma_d + 2 u32 < kappa).
//! A NaN F (overflow) is never a rejection; data whose centred norms could overflow f32,
//! and thresholds so small that underflow terms matter, do not use the filter at all.
//!
//! The GPU grid join (src/gpu/dot_filter.rs) uses this bound too, with one G for the whole
//! join from the maxima over all points, and row-major copies (`centred_rows`). GPUs may
//! flush subnormals to zero: copies hold none (`centred`, `point_terms`), and each flushed
//! product or sum is off by less than f32::MIN_POSITIVE, 2d + 5 of them in F at most, which
//! sigma covers.

// `!(a <= b)` is deliberate here: it is also true when a is NaN, which must reject.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

use super::store::Store;
use crate::metric::Coord;
use rayon::prelude::*;

/// Query rows and candidate columns of one register tile (12 AVX2 accumulators).
pub(crate) const ROWS: usize = 6;
pub(crate) const COLS: usize = 16;

const U32: f64 = f32::EPSILON as f64 / 2.0;
/// Centred norms above this are refused (their squares and dot products stay far from
/// f32's overflow).
const MAX_NORM: f64 = 1e18;

/// The f32 centred copy of a store, packed leaf by leaf: each leaf (a range of slots the
/// join compares as a whole) is one contiguous column-major block, so the kernel streams
/// it from cache instead of touching one page per dimension of a store-wide column.
pub(crate) struct FilterPoints {
    dim: usize,
    /// Leaf l's column c, item i at `cols[dim * leaves[l].offset + c * leaves[l].stride + i]`.
    cols: Vec<f32>,
    /// |x~|^2 rounded once to f32, item i of leaf l at `n2[leaves[l].offset + i]`.
    n2: Vec<f32>,
    leaves: Vec<PackedLeaf>,
}

struct PackedLeaf {
    offset: usize,
    /// Points in the leaf.
    len: usize,
    /// Column length: `len` rounded up so that whole ROWS and 2 COLS tiles can be read.
    stride: usize,
    /// Largest centring error bound c_p and largest n2 among the leaf's points.
    max_err: f64,
    max_n2: f64,
}

impl FilterPoints {
    /// Centres `store` on `center` (one value per store column) and packs `leaves` (slot
    /// ranges). None when a centred norm would be too large for f32 arithmetic.
    pub fn build<T: Coord>(
        store: &Store<T>,
        center: &[f64],
        leaves: &[std::ops::Range<usize>],
    ) -> Option<Self> {
        let dim = store.dim;
        let mut offset = 0;
        let mut packed: Vec<PackedLeaf> = leaves
            .iter()
            .map(|r| {
                // Whole tiles of the widest kernel (2 COLS candidates) can be read.
                let stride = r
                    .len()
                    .next_multiple_of(ROWS)
                    .max(r.len().next_multiple_of(2 * COLS));
                let leaf = PackedLeaf {
                    offset,
                    len: r.len(),
                    stride,
                    max_err: 0.0,
                    max_n2: 0.0,
                };
                offset += stride;
                leaf
            })
            .collect();
        let mut cols = vec![0.0f32; dim * offset];
        let mut n2 = vec![0.0f32; offset];
        // Each leaf's block is written by one task (they are disjoint slices).
        let mut col_parts = Vec::with_capacity(packed.len());
        let mut n2_parts = Vec::with_capacity(packed.len());
        let (mut cols_rest, mut n2_rest) = (&mut cols[..], &mut n2[..]);
        for leaf in &packed {
            let (c, cr) = cols_rest.split_at_mut(dim * leaf.stride);
            let (n, nr) = n2_rest.split_at_mut(leaf.stride);
            col_parts.push(c);
            n2_parts.push(n);
            (cols_rest, n2_rest) = (cr, nr);
        }
        let ok = packed
            .par_iter_mut()
            .zip(leaves.par_iter())
            .zip(col_parts.into_par_iter().zip(n2_parts.into_par_iter()))
            .all(|((leaf, r), (cols, n2))| {
                for c in 0..dim {
                    let src = &store.column(c)[r.clone()];
                    for (dst, &x) in cols[c * leaf.stride..].iter_mut().zip(src) {
                        *dst = centred(x.to_f64(), center[c]);
                    }
                }
                for i in 0..leaf.len {
                    let q: f64 = (0..dim)
                        .map(|c| {
                            let v = cols[c * leaf.stride + i] as f64;
                            v * v
                        })
                        .sum();
                    let Some((n, err)) = point_terms(q, dim) else {
                        return false;
                    };
                    n2[i] = n;
                    leaf.max_err = leaf.max_err.max(err);
                    leaf.max_n2 = leaf.max_n2.max(n as f64);
                }
                true
            });
        ok.then_some(FilterPoints {
            dim,
            cols,
            n2,
            leaves: packed,
        })
    }

    /// Leaf `l` (its position in `build`'s list) as a kernel block, with its points'
    /// largest centring error and norm.
    pub fn block(&self, l: usize) -> (Block<'_>, f64, f64) {
        let leaf = &self.leaves[l];
        let block = Block {
            cols: &self.cols[self.dim * leaf.offset..][..self.dim * leaf.stride],
            stride: leaf.stride,
            n2: &self.n2[leaf.offset..][..leaf.stride],
            len: leaf.len,
        };
        (block, leaf.max_err, leaf.max_n2)
    }

    /// The largest n2 over all points.
    pub fn max_n2(&self) -> f64 {
        self.leaves.iter().fold(0.0, |m, l| l.max_n2.max(m))
    }
}

/// A coordinate's filter copy: f32(x - m), subnormals flushed to zero (as a GPU may).
#[inline]
pub(crate) fn centred(x: f64, m: f64) -> f32 {
    let v = (x - m) as f32;
    if v.abs() < f32::MIN_POSITIVE {
        0.0
    } else {
        v
    }
}

/// A point's n2 (|x~|^2 rounded once to f32, subnormal flushed) and centring error bound
/// c_p, from its copy's squared norm `q` summed in f64; None when the norm is too large
/// (or infinite: f64 coordinates beyond f32's range).
#[inline]
pub(crate) fn point_terms(q: f64, dim: usize) -> Option<(f32, f64)> {
    if !(q.sqrt() <= MAX_NORM) {
        return None;
    }
    let n2 = q as f32;
    let n2 = if n2 < f32::MIN_POSITIVE { 0.0 } else { n2 };
    // The underflow term: |flushed x~ - (x - m)| < MIN_POSITIVE per coordinate.
    Some((
        n2,
        1.01 * U32 * q.sqrt() + dim as f64 * f32::MIN_POSITIVE as f64,
    ))
}

/// Row-major filter copies of row-major `coords` (for the GPU kernels): point i's `dim`
/// centred coordinates then its n2, at `i * (dim + 1)`; with the largest c_p and n2.
/// None where `FilterPoints::build` would refuse the data.
#[cfg(feature = "gpu")]
pub(crate) fn centred_rows<T: Coord>(
    coords: &[T],
    dim: usize,
    center: &[f64],
) -> Option<(Vec<f32>, f64, f64)> {
    let mut rows = vec![0.0f32; coords.len() / dim.max(1) * (dim + 1)];
    rows.par_chunks_mut(dim + 1)
        .zip(coords.par_chunks(dim.max(1)))
        .map(|(row, x)| {
            let mut q = 0.0f64;
            for c in 0..dim {
                row[c] = centred(x[c].to_f64(), center[c]);
                q += row[c] as f64 * row[c] as f64;
            }
            let (n2, err) = point_terms(q, dim)?;
            row[dim] = n2;
            Some((err, n2 as f64))
        })
        .try_fold(
            || (0.0f64, 0.0f64),
            |(e, n), p| p.map(|(pe, pn)| (e.max(pe), n.max(pn))),
        )
        .try_reduce(|| (0.0, 0.0), |a, b| Some((a.0.max(b.0), a.1.max(b.1))))
        .map(|(err, n2)| (rows, err, n2))
}

/// The join's constants of the bound.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FilterBound {
    /// sqrt(t_real).
    root: f64,
    kappa: f64,
    sigma: f64,
}

impl FilterBound {
    /// For the canonical Euclidean threshold `thr` (in T) over `dim` dimensions; None when
    /// the threshold is so small that underflow could dominate.
    pub fn new<T: Coord>(thr: T, dim: usize) -> Option<Self> {
        Self::from_f64::<T>(thr.to_f64(), dim)
    }

    /// `new` for a threshold that need not be a T value (a kNN's bound on its k-th
    /// accumulator, `canonical_upper`): the canonical sum in T above `thr` is what it proves.
    pub fn from_f64<T: Coord>(thr: f64, dim: usize) -> Option<Self> {
        let d = dim as f64;
        let u = T::UNIT_ROUNDOFF;
        let t_real = (thr + 2.0 * d * tiny::<T>()) / (1.0 - 2.0 * (d + 3.0) * u);
        if !(t_real >= 1e-30) || !t_real.is_finite() {
            return None;
        }
        Some(FilterBound {
            root: t_real.sqrt(),
            kappa: kappa(dim),
            sigma: sigma(dim),
        })
    }

    /// G for a block whose points have centring errors <= `err_a`, `err_b` and norms
    /// <= `n2_a`, `n2_b`, rounded up to f32.
    pub fn cutoff(&self, err_a: f64, err_b: f64, n2_a: f64, n2_b: f64) -> f32 {
        round_up_f32(self.g(err_a, err_b, n2_a, n2_b))
    }

    /// The kNN kernel's cutoff (`survivors_shifted`): G - n_a for the query a whose n2 is
    /// `own` (<= `n2_a`), rounded up to f32. `F - n_a > G - n_a` is `F > G`; the f64
    /// subtraction's own rounding (< 2^-53 (G + n_a)) is covered by adding 1e-9 (G + n_a).
    pub fn cutoff_less_own(&self, err_a: f64, err_b: f64, n2_a: f64, n2_b: f64, own: f32) -> f32 {
        let g = self.g(err_a, err_b, n2_a, n2_b);
        let own = own as f64;
        round_up_f32(g - own + 1e-9 * (g + own))
    }

    /// G in f64, from above.
    fn g(&self, err_a: f64, err_b: f64, n2_a: f64, n2_b: f64) -> f64 {
        let r = self.root + err_a + err_b;
        // (1 + 1e-9) covers this f64 arithmetic's own rounding.
        (r * r + self.kappa * (n2_a + n2_b) + self.sigma) * (1.0 + 1e-9)
    }

    /// Whether the filter can reject anything for data whose centred norms reach
    /// `max_n2`: when the error term alone exceeds the threshold, it cannot.
    pub fn useful(&self, max_n2: f64) -> bool {
        2.0 * self.kappa * max_n2 < self.root * self.root
    }
}

/// The bound's relative error of F: kappa (n_a + n_b) + sigma is E (module doc).
fn kappa(dim: usize) -> f64 {
    4.0 * (dim as f64 + 16.0) * U32
}

/// The bound's absolute error of F from flushed subnormals (module doc).
fn sigma(dim: usize) -> f64 {
    (4.0 * dim as f64 + 16.0) * f32::MIN_POSITIVE as f64
}

/// T's smallest normal number: each canonical term's underflow error is below it.
fn tiny<T: Coord>() -> f64 {
    if T::UNIT_ROUNDOFF > 1e-10 {
        f32::MIN_POSITIVE as f64
    } else {
        f64::MIN_POSITIVE
    }
}

/// An upper bound (f64) on the canonical accumulator C (`metric::accumulate`'s sum in T)
/// of query a and candidate b, from the kNN kernel's value `f` = F - n_a of the pair
/// (`survivors_shifted`), the query's n2 `own`, and the same maxima of centring errors
/// and n2 that `FilterBound::cutoff_less_own` takes. The other side of the module's
/// bound: F = f + own is within E of D~^2, so D~ <= sqrt(F + E); the real distance D of
/// the T values is at most D~ + c_a + c_b; and each of C's d terms is (x - y)^2 with a
/// relative error of at most (1 + u)^2 and an absolute one below tiny (underflow), summed
/// with d - 1 more roundings of at most u: C <= D^2 (1 + u)^(d+1) + d tiny (1 + u)^d
/// <= D^2 (1 + 2 (d + 3) u) + 2 d tiny. The f64 arithmetic here is covered by the
/// relative 1e-9 and the absolute 1e-15 (F + E) where F + E cancels. Non-decreasing in
/// `f`; +inf for a NaN `f`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn canonical_upper<T: Coord>(
    f: f32,
    own: f32,
    err_a: f64,
    err_b: f64,
    n2_a: f64,
    n2_b: f64,
    dim: usize,
) -> f64 {
    if f.is_nan() {
        return f64::INFINITY;
    }
    let big_f = f as f64 + own as f64;
    let e = kappa(dim) * (n2_a + n2_b) + sigma(dim);
    let sq = big_f + e + 1e-15 * (big_f.abs() + e);
    let r = sq.max(0.0).sqrt() * (1.0 + 1e-9) + err_a + err_b;
    let d = dim as f64;
    (r * r * (1.0 + 2.0 * (d + 3.0) * T::UNIT_ROUNDOFF) + 2.0 * d * tiny::<T>()) * (1.0 + 1e-9)
}

/// The kNN kernel's F from its value `f` = F - n_a (`survivors_shifted`) and the query's
/// n2 `own`, in f32 from below and from above. F is the same number whichever of the two
/// points is the query, so a symmetric search keys both points' pools by it: the lower one
/// is compared with `FilterBound::cutoff` (F > G rejects), the upper one bounds the
/// accumulator through `canonical_upper` (with `own` 0). The f64 sum of two f32 values is
/// exact unless their exponents are far apart, and then within 2^-53 of it: the pad covers
/// that. NaN stays NaN (kept by a cutoff, never a bound).
pub(crate) fn full_value(f: f32, own: f32) -> (f32, f32) {
    let s = f as f64 + own as f64;
    let pad = s.abs() * f64::EPSILON;
    (-round_up_f32(-(s - pad)), round_up_f32(s + pad))
}

/// The f32 value nearest to `x` from above (x finite or infinite, not NaN).
fn round_up_f32(x: f64) -> f32 {
    let v = x as f32;
    if (v as f64) < x {
        v.next_up()
    } else {
        v
    }
}

/// A column-major f32 block: item i of column c at `cols[c * stride + i]`, `len` items.
/// Readable (padding included) up to item `len` rounded up to ROWS (as queries) or COLS
/// (as candidates) in every column, and `n2` likewise.
pub(crate) struct Block<'a> {
    pub cols: &'a [f32],
    pub stride: usize,
    pub n2: &'a [f32],
    pub len: usize,
}

impl Block<'_> {
    fn check(&self, dim: usize, pad: usize) {
        assert!(self.readable(dim, pad));
    }

    /// Whether every column and n2 can be read up to `len` rounded up to `pad`.
    fn readable(&self, dim: usize, pad: usize) -> bool {
        let need = self.len.next_multiple_of(pad);
        need <= self.stride
            && need <= self.n2.len()
            && (dim == 0 || (dim - 1) * self.stride + need <= self.cols.len())
    }
}

/// Calls `keep(i, j0, mask)` for every query i of `q` and tile of candidates
/// `j0..j0 + COLS` of `c` where bit l of `mask` marks candidate j0 + l (< c.len) as not
/// rejected: F <= g_i, or F not a number. `g` holds one cutoff for every query
/// (`g.len() == 1`) or one per query (`g.len() >= q.len`). Only queries and candidates whose bit is set in
/// `q_live`, `c_live` (words of 64 bits) are considered; tiles without any are skipped.
#[allow(clippy::too_many_arguments)]
pub(crate) fn survivors(
    q: &Block,
    c: &Block,
    dim: usize,
    g: &[f32],
    kernel: Kernel,
    q_live: &[u64],
    c_live: &[u64],
    mut keep: impl FnMut(usize, usize, u16),
) {
    q.check(dim, ROWS);
    c.check(dim, COLS);
    assert!(g.len() == 1 || g.len() >= q.len);
    assert!(q_live.len() * 64 >= q.len && c_live.len() * 64 >= c.len);
    let live = Live {
        q: q_live,
        c: c_live,
    };
    #[cfg(all(target_arch = "x86_64", simjoin_avx512))]
    if kernel == Kernel::Avx512 && c.readable(dim, WIDE) {
        // SAFETY: avx512f was detected at run time (Kernel::detect); q was checked above,
        // c just now for tiles of WIDE candidates.
        return unsafe { survivors_avx512(q, c, dim, g, &live, &mut keep) };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel != Kernel::Portable {
        // SAFETY: avx2 and fma were detected at run time (Kernel::detect; Avx512 implies
        // them); the blocks were checked above.
        return unsafe { survivors_fma(q, c, dim, g, &live, &mut keep) };
    }
    let _ = kernel;
    survivors_portable(q, c, dim, g, &live, &mut keep)
}

/// The live bits of a tile's rows and columns.
struct Live<'a> {
    q: &'a [u64],
    c: &'a [u64],
}

impl Live<'_> {
    /// `count` bits of `words` from bit `at` (count <= 32).
    #[inline(always)]
    fn bits(words: &[u64], at: usize, count: usize) -> u32 {
        let (w, o) = (at / 64, at % 64);
        let mut v = words[w] >> o;
        if o + count > 64 && w + 1 < words.len() {
            v |= words[w + 1] << (64 - o);
        }
        (v & ((1u64 << count) - 1)) as u32
    }
    #[inline(always)]
    fn rows(&self, i0: usize) -> u32 {
        Self::bits(self.q, i0, ROWS)
    }
    #[inline(always)]
    fn cols(&self, j0: usize) -> u32 {
        Self::bits(self.c, j0, COLS)
    }
    /// The live bits of `count` (<= 32) candidates from j0.
    #[cfg_attr(not(all(target_arch = "x86_64", simjoin_avx512)), allow(dead_code))]
    #[inline(always)]
    fn cols_n(&self, j0: usize, count: usize) -> u32 {
        Self::bits(self.c, j0, count)
    }
}

/// Mask of candidates `j0..` that exist.
#[inline(always)]
fn tail_mask(len: usize, j0: usize) -> u32 {
    if j0 + COLS > len {
        (1u32 << (len - j0)) - 1
    } else {
        (1u32 << COLS) - 1
    }
}

fn survivors_portable(
    q: &Block,
    c: &Block,
    dim: usize,
    g: &[f32],
    live: &Live,
    keep: &mut impl FnMut(usize, usize, u16),
) {
    for i0 in (0..q.len).step_by(ROWS) {
        let rows = live.rows(i0);
        if rows == 0 {
            continue;
        }
        for j0 in (0..c.len).step_by(COLS) {
            let cols = live.cols(j0);
            if cols == 0 {
                continue;
            }
            let mut acc = [[0.0f32; COLS]; ROWS];
            for k in 0..dim {
                let qa: &[f32; ROWS] = q.cols[k * q.stride + i0..][..ROWS].try_into().unwrap();
                let cb: &[f32; COLS] = c.cols[k * c.stride + j0..][..COLS].try_into().unwrap();
                for r in 0..ROWS {
                    for l in 0..COLS {
                        acc[r][l] += qa[r] * cb[l];
                    }
                }
            }
            for (r, row) in acc.iter().enumerate().take(q.len - i0) {
                if rows >> r & 1 == 0 {
                    continue;
                }
                let qn = q.n2[i0 + r];
                let g = if g.len() == 1 { g[0] } else { g[i0 + r] };
                let mut mask = 0u32;
                for (l, &dot) in row.iter().enumerate() {
                    let f = (qn + c.n2[j0 + l]) - 2.0 * dot;
                    mask |= (!(f > g) as u32) << l;
                }
                mask &= tail_mask(c.len, j0) & cols;
                if mask != 0 {
                    keep(i0 + r, j0, mask as u16);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn survivors_fma(
    q: &Block,
    c: &Block,
    dim: usize,
    g: &[f32],
    live: &Live,
    keep: &mut impl FnMut(usize, usize, u16),
) {
    use std::arch::x86_64::*;
    let two = _mm256_set1_ps(2.0);
    let mut i0 = 0;
    while i0 < q.len {
        let rows = live.rows(i0);
        let mut j0 = 0;
        while rows != 0 && j0 < c.len {
            let cols = live.cols(j0);
            if cols == 0 {
                j0 += COLS;
                continue;
            }
            let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
            let mut qp = q.cols.as_ptr().add(i0);
            let mut cp = c.cols.as_ptr().add(j0);
            for _ in 0..dim {
                let b0 = _mm256_loadu_ps(cp);
                let b1 = _mm256_loadu_ps(cp.add(8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm256_broadcast_ss(&*qp.add(r));
                    acc[0] = _mm256_fmadd_ps(a, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(a, b1, acc[1]);
                }
                qp = qp.add(q.stride);
                cp = cp.add(c.stride);
            }
            let cn0 = _mm256_loadu_ps(c.n2.as_ptr().add(j0));
            let cn1 = _mm256_loadu_ps(c.n2.as_ptr().add(j0 + 8));
            for (r, acc) in acc.iter().enumerate().take(q.len - i0) {
                if rows >> r & 1 == 0 {
                    continue;
                }
                let qn = _mm256_set1_ps(*q.n2.get_unchecked(i0 + r));
                let gv = _mm256_set1_ps(if g.len() == 1 { g[0] } else { g[i0 + r] });
                let f0 = _mm256_fnmadd_ps(two, acc[0], _mm256_add_ps(qn, cn0));
                let f1 = _mm256_fnmadd_ps(two, acc[1], _mm256_add_ps(qn, cn1));
                // "not greater than, unordered true": a NaN is kept.
                let m0 = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NGT_UQ>(f0, gv)) as u32;
                let m1 = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NGT_UQ>(f1, gv)) as u32;
                let mask = (m0 | m1 << 8) & tail_mask(c.len, j0) & cols;
                if mask != 0 {
                    keep(i0 + r, j0, mask as u16);
                }
            }
            j0 += COLS;
        }
        i0 += ROWS;
    }
}

/// `survivors_fma` in 512-bit registers: tiles of ROWS queries and WIDE candidates (12
/// accumulators of 16 lanes), F formed as there; each half of a tile is reported as the
/// COLS-wide tile it is to `keep`.
// Built only by compilers that have these intrinsics (build.rs sets simjoin_avx512 from
// Rust 1.89), so the MSRV lint does not apply.
#[cfg(all(target_arch = "x86_64", simjoin_avx512))]
#[allow(clippy::incompatible_msrv)]
#[target_feature(enable = "avx512f")]
unsafe fn survivors_avx512(
    q: &Block,
    c: &Block,
    dim: usize,
    g: &[f32],
    live: &Live,
    keep: &mut impl FnMut(usize, usize, u16),
) {
    use std::arch::x86_64::*;
    let two = _mm512_set1_ps(2.0);
    let mut i0 = 0;
    while i0 < q.len {
        let rows = live.rows(i0);
        let mut j0 = 0;
        while rows != 0 && j0 < c.len {
            // Candidates j0.. that exist and are live, bit l for candidate j0 + l.
            let n = WIDE.min(c.len - j0);
            let cols = live.cols_n(j0, n);
            if cols == 0 {
                j0 += WIDE;
                continue;
            }
            let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
            let mut qp = q.cols.as_ptr().add(i0);
            let mut cp = c.cols.as_ptr().add(j0);
            for _ in 0..dim {
                let b0 = _mm512_loadu_ps(cp);
                let b1 = _mm512_loadu_ps(cp.add(16));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_ps(*qp.add(r));
                    acc[0] = _mm512_fmadd_ps(a, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(a, b1, acc[1]);
                }
                qp = qp.add(q.stride);
                cp = cp.add(c.stride);
            }
            let cn0 = _mm512_loadu_ps(c.n2.as_ptr().add(j0));
            let cn1 = _mm512_loadu_ps(c.n2.as_ptr().add(j0 + 16));
            for (r, acc) in acc.iter().enumerate().take(q.len - i0) {
                if rows >> r & 1 == 0 {
                    continue;
                }
                let qn = _mm512_set1_ps(*q.n2.get_unchecked(i0 + r));
                let gv = _mm512_set1_ps(if g.len() == 1 { g[0] } else { g[i0 + r] });
                let f0 = _mm512_fnmadd_ps(two, acc[0], _mm512_add_ps(qn, cn0));
                let f1 = _mm512_fnmadd_ps(two, acc[1], _mm512_add_ps(qn, cn1));
                // "not greater than, unordered true": a NaN is kept.
                let m0 = _mm512_cmp_ps_mask::<_CMP_NGT_UQ>(f0, gv) as u32;
                let m1 = _mm512_cmp_ps_mask::<_CMP_NGT_UQ>(f1, gv) as u32;
                let mask = (m0 | m1 << 16) & cols;
                for half in 0..2 {
                    let m = (mask >> (half * COLS)) as u16;
                    if m != 0 {
                        keep(i0 + r, j0 + half * COLS, m);
                    }
                }
            }
            j0 += WIDE;
        }
        i0 += ROWS;
    }
}

/// The kNN form of `survivors`, for one query per row with its own cutoff: `q` holds the
/// queries' copies times -2 (exact: a power of two, and copies hold no subnormals), so each
/// tile's accumulators start at the candidates' n_b and sum -2 x~_a.x~_b onto them: F - n_a,
/// evaluated in another order (see the bound's note at `FilterBound`), compared with
/// `h[i]` = `FilterBound::cutoff_less_own` (or +inf: keep all, -inf: keep none). Calls
/// `keep(i, j0, mask, cmask, f)` for every query i < q.len and tile `j0..j0 + COLS` of `c`
/// where bit l of `mask` marks candidate j0 + l (< c.len) with `!(F - n_a > h[i])` (NaN
/// kept; lane l of `f` is that F - n_a, for `canonical_upper`), or bit l of `cmask` passes
/// `columns`' test (below; `cmask` is 0 without it), in row tiles `i0 / ROWS` whose bit is
/// set in `tiles` (the others are skipped); when it returns `Some(g)`, g is query i's cutoff
/// for the tiles after this one (a heap that tightened filters the rest of the block).
/// Candidates run in the outer loop (a tile of them stays in L1 while the queries pass);
/// tiles without a survivor cost one test.
#[allow(clippy::too_many_arguments)]
pub(crate) fn survivors_shifted(
    q: &Block,
    c: &Block,
    dim: usize,
    h: &mut [f32],
    tiles: u64,
    columns: Option<&ColumnTest>,
    kernel: Kernel,
    mut keep: impl FnMut(usize, usize, u16, u16, &[f32; COLS]) -> Option<f32>,
) {
    q.check(dim, ROWS);
    c.check(dim, COLS);
    assert!(h.len() >= q.len.next_multiple_of(ROWS));
    // Tiles past q.len are never visited: their bits may be anything.
    assert!(q.len <= 64 * ROWS);
    let none = ColumnTest { own: &[], cut: &[] };
    if let Some(ct) = columns {
        // Read as far as the norms are (whole tiles, padding included).
        assert!(ct.own.len() >= q.n2.len() && ct.cut.len() >= c.n2.len());
    }
    macro_rules! run {
        ($f:ident) => {
            match columns {
                None => $f::<false>(q, c, dim, h, tiles, &none, &mut keep),
                Some(ct) => $f::<true>(q, c, dim, h, tiles, ct, &mut keep),
            }
        };
    }
    #[cfg(all(target_arch = "x86_64", simjoin_avx512))]
    if kernel == Kernel::Avx512 && c.readable(dim, WIDE) {
        // SAFETY: avx512f was detected at run time (Kernel::detect); q, h and `columns`
        // were checked above, c just now for tiles of WIDE candidates (the column test's
        // cutoffs are as long as c's norms).
        return unsafe { run!(shifted_avx512) };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel != Kernel::Portable {
        // SAFETY: avx2 and fma were detected at run time (Kernel::detect; Avx512 implies
        // them); the blocks, h and `columns` were checked above.
        return unsafe { run!(shifted_fma) };
    }
    let _ = kernel;
    run!(shifted_portable)
}

/// The second test of `survivors_shifted`, for a symmetric self-kNN where each candidate is
/// also a query: candidate j is kept for itself when `!(F > cut[j])`, F = (F - n_a) + own[i]
/// rounded once more in f32 (one more order of the same sum, inside the bound's spare: see
/// the module doc) and `cut[j]` = `FilterBound::cutoff` for that candidate (+inf: keep all).
/// `own` is as long as the queries' norms, `cut` as the candidates'.
pub(crate) struct ColumnTest<'a> {
    pub own: &'a [f32],
    pub cut: &'a [f32],
}

/// Candidates per tile of the AVX-512 kernels (two 16-lane registers).
#[cfg(all(target_arch = "x86_64", simjoin_avx512))]
const WIDE: usize = 2 * COLS;

// Built only by compilers that have these intrinsics (build.rs sets simjoin_avx512 from
// Rust 1.89), so the MSRV lint does not apply.
#[cfg(all(target_arch = "x86_64", simjoin_avx512))]
#[allow(clippy::incompatible_msrv)]
#[target_feature(enable = "avx512f")]
unsafe fn shifted_avx512<const BOTH: bool>(
    q: &Block,
    c: &Block,
    dim: usize,
    h: &mut [f32],
    tiles: u64,
    ct: &ColumnTest,
    keep: &mut impl FnMut(usize, usize, u16, u16, &[f32; COLS]) -> Option<f32>,
) {
    use std::arch::x86_64::*;
    let mut j0 = 0;
    while j0 < c.len {
        let cn0 = _mm512_loadu_ps(c.n2.as_ptr().add(j0));
        let cn1 = _mm512_loadu_ps(c.n2.as_ptr().add(j0 + 16));
        let (g0, g1) = match BOTH {
            true => (
                _mm512_loadu_ps(ct.cut.as_ptr().add(j0)),
                _mm512_loadu_ps(ct.cut.as_ptr().add(j0 + 16)),
            ),
            false => (_mm512_setzero_ps(), _mm512_setzero_ps()),
        };
        let mut i0 = 0;
        while i0 < q.len {
            if tiles >> (i0 / ROWS) & 1 == 0 {
                i0 += ROWS;
                continue;
            }
            let mut acc = [[cn0, cn1]; ROWS];
            let mut qp = q.cols.as_ptr().add(i0);
            let mut cp = c.cols.as_ptr().add(j0);
            for _ in 0..dim {
                let b0 = _mm512_loadu_ps(cp);
                let b1 = _mm512_loadu_ps(cp.add(16));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm512_set1_ps(*qp.add(r));
                    acc[0] = _mm512_fmadd_ps(a, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(a, b1, acc[1]);
                }
                qp = qp.add(q.stride);
                cp = cp.add(c.stride);
            }
            // "not greater than, unordered true": a NaN is kept. One test for the tile.
            let mut kept = [[0u16; 2]; ROWS];
            let mut ckept = [[0u16; 2]; ROWS];
            let mut any = 0u16;
            for r in 0..ROWS {
                let hv = _mm512_set1_ps(*h.as_ptr().add(i0 + r));
                kept[r][0] = _mm512_cmp_ps_mask::<_CMP_NGT_UQ>(acc[r][0], hv);
                kept[r][1] = _mm512_cmp_ps_mask::<_CMP_NGT_UQ>(acc[r][1], hv);
                any |= kept[r][0] | kept[r][1];
                if BOTH {
                    let na = _mm512_set1_ps(*ct.own.as_ptr().add(i0 + r));
                    let f0 = _mm512_add_ps(acc[r][0], na);
                    let f1 = _mm512_add_ps(acc[r][1], na);
                    ckept[r][0] = _mm512_cmp_ps_mask::<_CMP_NGT_UQ>(f0, g0);
                    ckept[r][1] = _mm512_cmp_ps_mask::<_CMP_NGT_UQ>(f1, g1);
                    any |= ckept[r][0] | ckept[r][1];
                }
            }
            if any != 0 {
                for (r, k) in kept.iter().enumerate().take(q.len - i0) {
                    let mut m = k[0];
                    for half in 0..2 {
                        let j = j0 + half * COLS;
                        if j >= c.len {
                            break;
                        }
                        let tail = tail_mask(c.len, j);
                        let mask = m as u32 & tail;
                        let cmask = ckept[r][half] as u32 & tail;
                        m = k[1];
                        if mask | cmask != 0 {
                            let mut vals = [0.0f32; COLS];
                            _mm512_storeu_ps(vals.as_mut_ptr(), acc[r][half]);
                            let got = keep(i0 + r, j, mask as u16, cmask as u16, &vals);
                            if let Some(g) = got {
                                h[i0 + r] = g;
                                // The second half is a later tile: it sees the new cutoff.
                                let gv = _mm512_set1_ps(g);
                                m &= _mm512_cmp_ps_mask::<_CMP_NGT_UQ>(acc[r][1], gv);
                            }
                        }
                    }
                }
            }
            i0 += ROWS;
        }
        j0 += WIDE;
    }
}

fn shifted_portable<const BOTH: bool>(
    q: &Block,
    c: &Block,
    dim: usize,
    h: &mut [f32],
    tiles: u64,
    ct: &ColumnTest,
    keep: &mut impl FnMut(usize, usize, u16, u16, &[f32; COLS]) -> Option<f32>,
) {
    for j0 in (0..c.len).step_by(COLS) {
        let cn: &[f32; COLS] = c.n2[j0..][..COLS].try_into().unwrap();
        for i0 in (0..q.len).step_by(ROWS) {
            if tiles >> (i0 / ROWS) & 1 == 0 {
                continue;
            }
            let mut acc = [*cn; ROWS];
            for k in 0..dim {
                let qa: &[f32; ROWS] = q.cols[k * q.stride + i0..][..ROWS].try_into().unwrap();
                let cb: &[f32; COLS] = c.cols[k * c.stride + j0..][..COLS].try_into().unwrap();
                for r in 0..ROWS {
                    for l in 0..COLS {
                        acc[r][l] += qa[r] * cb[l];
                    }
                }
            }
            let tail = tail_mask(c.len, j0);
            for (r, row) in acc.iter().enumerate().take(q.len - i0) {
                let (mut mask, mut cmask) = (0u32, 0u32);
                for (l, &f) in row.iter().enumerate() {
                    mask |= (!(f > h[i0 + r]) as u32) << l;
                    if BOTH {
                        cmask |= (!(f + ct.own[i0 + r] > ct.cut[j0 + l]) as u32) << l;
                    }
                }
                mask &= tail;
                cmask &= tail;
                if mask | cmask != 0 {
                    if let Some(g) = keep(i0 + r, j0, mask as u16, cmask as u16, row) {
                        h[i0 + r] = g;
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn shifted_fma<const BOTH: bool>(
    q: &Block,
    c: &Block,
    dim: usize,
    h: &mut [f32],
    tiles: u64,
    ct: &ColumnTest,
    keep: &mut impl FnMut(usize, usize, u16, u16, &[f32; COLS]) -> Option<f32>,
) {
    use std::arch::x86_64::*;
    let mut j0 = 0;
    while j0 < c.len {
        let cn0 = _mm256_loadu_ps(c.n2.as_ptr().add(j0));
        let cn1 = _mm256_loadu_ps(c.n2.as_ptr().add(j0 + 8));
        let (g0, g1) = match BOTH {
            true => (
                _mm256_loadu_ps(ct.cut.as_ptr().add(j0)),
                _mm256_loadu_ps(ct.cut.as_ptr().add(j0 + 8)),
            ),
            false => (_mm256_setzero_ps(), _mm256_setzero_ps()),
        };
        let mut i0 = 0;
        while i0 < q.len {
            if tiles >> (i0 / ROWS) & 1 == 0 {
                i0 += ROWS;
                continue;
            }
            let mut acc = [[cn0, cn1]; ROWS];
            let mut qp = q.cols.as_ptr().add(i0);
            let mut cp = c.cols.as_ptr().add(j0);
            for _ in 0..dim {
                let b0 = _mm256_loadu_ps(cp);
                let b1 = _mm256_loadu_ps(cp.add(8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let a = _mm256_broadcast_ss(&*qp.add(r));
                    acc[0] = _mm256_fmadd_ps(a, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(a, b1, acc[1]);
                }
                qp = qp.add(q.stride);
                cp = cp.add(c.stride);
            }
            // "not greater than, unordered true": a NaN is kept. One test for the tile.
            let mut kept = [[_mm256_setzero_ps(); 2]; ROWS];
            let mut ckept = [[_mm256_setzero_ps(); 2]; ROWS];
            let mut any = _mm256_setzero_ps();
            for r in 0..ROWS {
                let hv = _mm256_broadcast_ss(&*h.as_ptr().add(i0 + r));
                kept[r][0] = _mm256_cmp_ps::<_CMP_NGT_UQ>(acc[r][0], hv);
                kept[r][1] = _mm256_cmp_ps::<_CMP_NGT_UQ>(acc[r][1], hv);
                any = _mm256_or_ps(any, _mm256_or_ps(kept[r][0], kept[r][1]));
                if BOTH {
                    let na = _mm256_broadcast_ss(&*ct.own.as_ptr().add(i0 + r));
                    let f0 = _mm256_add_ps(acc[r][0], na);
                    let f1 = _mm256_add_ps(acc[r][1], na);
                    ckept[r][0] = _mm256_cmp_ps::<_CMP_NGT_UQ>(f0, g0);
                    ckept[r][1] = _mm256_cmp_ps::<_CMP_NGT_UQ>(f1, g1);
                    any = _mm256_or_ps(any, _mm256_or_ps(ckept[r][0], ckept[r][1]));
                }
            }
            if _mm256_testz_ps(any, any) == 0 {
                let tail = tail_mask(c.len, j0);
                let bits = |v: &[__m256; 2]| {
                    (_mm256_movemask_ps(v[0]) as u32 | (_mm256_movemask_ps(v[1]) as u32) << 8)
                        & tail
                };
                for r in 0..(q.len - i0).min(ROWS) {
                    let mask = bits(&kept[r]);
                    let cmask = bits(&ckept[r]);
                    if mask | cmask != 0 {
                        let mut vals = [0.0f32; COLS];
                        _mm256_storeu_ps(vals.as_mut_ptr(), acc[r][0]);
                        _mm256_storeu_ps(vals.as_mut_ptr().add(8), acc[r][1]);
                        if let Some(g) = keep(i0 + r, j0, mask as u16, cmask as u16, &vals) {
                            h[i0 + r] = g;
                        }
                    }
                }
            }
            i0 += ROWS;
        }
        j0 += COLS;
    }
}

/// The kNN kernel's instruction set (`survivors_shifted`), chosen once per join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    Portable,
    /// AVX2 + FMA, 256-bit.
    Fma,
    /// AVX-512F, 512-bit (twice the multiply-adds per instruction; built with Rust >= 1.89).
    #[cfg_attr(not(simjoin_avx512), allow(dead_code))]
    Avx512,
}

impl Kernel {
    /// The widest the CPU runs: SIMJOIN_NO_AVX512 stops at AVX2, SIMJOIN_NO_AVX2 at the
    /// portable kernel.
    pub fn detect() -> Self {
        if !fma_available() {
            return Kernel::Portable;
        }
        #[cfg(all(target_arch = "x86_64", simjoin_avx512))]
        if std::env::var_os("SIMJOIN_NO_AVX512").is_none()
            && std::arch::is_x86_feature_detected!("avx512f")
        {
            return Kernel::Avx512;
        }
        Kernel::Fma
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Fma => "AVX2/FMA",
            Kernel::Avx512 => "AVX-512",
        }
    }
}

/// Whether the FMA kernel may run (checked once per join; SIMJOIN_NO_AVX2 turns it off).
pub(crate) fn fma_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::store::avx2_available() && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel (portable, AVX2, AVX-512 where the CPU has it) reports the live pairs
    /// whose F (computed in f64 here) is clearly below g, never one clearly above nor one
    /// of a dead query or candidate, on blocks with ragged edges.
    #[test]
    fn kernels_agree_with_f64_expansion() {
        let dim = 19;
        let (nq, nc) = (13usize, 37usize);
        let mut seed = 7u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        // Candidates' columns as the join packs them (whole tiles of 2 COLS readable).
        let (qs, cs) = (nq + ROWS, nc.next_multiple_of(2 * COLS));
        let mut qcols = vec![0.0f32; qs * dim];
        let mut ccols = vec![0.0f32; cs * dim];
        for k in 0..dim {
            for i in 0..nq {
                qcols[k * qs + i] = rnd();
            }
            for j in 0..nc {
                ccols[k * cs + j] = rnd();
            }
        }
        let norm = |cols: &[f32], s: usize, i: usize| -> f64 {
            (0..dim).map(|k| (cols[k * s + i] as f64).powi(2)).sum()
        };
        let mut qn2: Vec<f32> = (0..nq).map(|i| norm(&qcols, qs, i) as f32).collect();
        let mut cn2: Vec<f32> = (0..nc).map(|j| norm(&ccols, cs, j) as f32).collect();
        qn2.resize(qs, 0.0);
        cn2.resize(cs, 0.0);
        let q = Block {
            cols: &qcols,
            stride: qs,
            n2: &qn2,
            len: nq,
        };
        let c = Block {
            cols: &ccols,
            stride: cs,
            n2: &cn2,
            len: nc,
        };
        let exact = |i: usize, j: usize| -> f64 {
            (0..dim)
                .map(|k| (qcols[k * qs + i] as f64 - ccols[k * cs + j] as f64).powi(2))
                .sum()
        };
        let g = 2.6f32;
        let mut kernels = vec![Kernel::Portable];
        if fma_available() {
            kernels.push(Kernel::Fma);
        }
        if Kernel::detect() == Kernel::Avx512 {
            kernels.push(Kernel::Avx512);
        }
        // Every query and candidate live, then some of each (the kernels skip the others).
        let some = (0b1011_0110_1101u64, 0x0F0F_3C3C_A5A5_FF00u64);
        for (kernel, (q_live, c_live)) in
            kernels.into_iter().flat_map(|k| [(k, (!0, !0)), (k, some)])
        {
            let mut kept = vec![false; nq * nc];
            survivors(
                &q,
                &c,
                dim,
                &[g],
                kernel,
                &[q_live],
                &[c_live],
                |i, j0, mut mask| {
                    while mask != 0 {
                        let j = j0 + mask.trailing_zeros() as usize;
                        mask &= mask - 1;
                        assert!(j < nc && i < nq);
                        assert!(
                            q_live >> i & 1 == 1 && c_live >> j & 1 == 1,
                            "{kernel:?}: dead"
                        );
                        assert!(!kept[i * nc + j], "reported twice");
                        kept[i * nc + j] = true;
                    }
                },
            );
            let (mut inside, mut outside) = (0, 0);
            for i in 0..nq {
                for j in 0..nc {
                    let d2 = exact(i, j);
                    // Pairs of a dead query or candidate are never reported (asserted above).
                    let live = q_live >> i & 1 == 1 && c_live >> j & 1 == 1;
                    if d2 < g as f64 * 0.999 && live {
                        assert!(kept[i * nc + j], "{kernel:?}: ({i}, {j}) d2 {d2} dropped");
                        inside += 1;
                    } else if d2 > g as f64 * 1.001 {
                        assert!(!kept[i * nc + j], "{kernel:?}: ({i}, {j}) d2 {d2} kept");
                        outside += 1;
                    }
                }
            }
            assert!(inside > 20 && outside > 20, "{inside} {outside}");
        }
    }

    /// The kNN kernels (`survivors_shifted`): AVX2 and AVX-512 report the same survivors
    /// (the same FMA chain per lane), every kernel keeps each pair clearly below its query's
    /// cutoff and drops each one clearly above, skipped row tiles report nothing, and a
    /// cutoff returned by `keep` applies to the tiles after.
    #[test]
    fn shifted_kernels_agree() {
        let dim = 23;
        let (nq, nc) = (17usize, 77usize);
        let mut seed = 3u64;
        let mut rnd = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let (qs, cs) = (nq.next_multiple_of(ROWS), 128);
        let mut qcols = vec![0.0f32; qs * dim];
        let mut ccols = vec![0.0f32; cs * dim];
        for k in 0..dim {
            for i in 0..nq {
                qcols[k * qs + i] = rnd();
            }
            for j in 0..nc {
                ccols[k * cs + j] = rnd();
            }
        }
        let norm = |cols: &[f32], s: usize, i: usize| -> f64 {
            (0..dim).map(|k| (cols[k * s + i] as f64).powi(2)).sum()
        };
        let qn2: Vec<f32> = (0..qs).map(|i| norm(&qcols, qs, i) as f32).collect();
        let cn2: Vec<f32> = (0..cs).map(|j| norm(&ccols, cs, j) as f32).collect();
        let scaled: Vec<f32> = qcols.iter().map(|v| -2.0 * v).collect();
        let q = Block {
            cols: &scaled,
            stride: qs,
            n2: &qn2,
            len: nq,
        };
        let c = Block {
            cols: &ccols,
            stride: cs,
            n2: &cn2,
            len: nc,
        };
        let exact = |i: usize, j: usize| -> f64 {
            (0..dim)
                .map(|k| (qcols[k * qs + i] as f64 - ccols[k * cs + j] as f64).powi(2))
                .sum()
        };
        // Per query a cutoff on F around the typical distance (query 3: keep everything).
        let g: Vec<f64> = (0..nq).map(|i| 3.0 + 0.1 * i as f64).collect();
        let mut kernels = vec![Kernel::Portable];
        if fma_available() {
            kernels.push(Kernel::Fma);
        }
        if Kernel::detect() == Kernel::Avx512 {
            kernels.push(Kernel::Avx512);
        }
        let mut fast: Option<Vec<bool>> = None;
        let mut fast_cols: Option<Vec<bool>> = None;
        for kernel in kernels {
            let mut h = vec![f32::NEG_INFINITY; qs];
            for i in 0..nq {
                h[i] = round_up_f32(g[i] - qn2[i] as f64);
            }
            h[3] = f32::INFINITY;
            // Row tile 1 (queries 6..12) skipped.
            let tiles = !(1u64 << 1);
            let mut kept = vec![false; nq * nc];
            survivors_shifted(
                &q,
                &c,
                dim,
                &mut h,
                tiles,
                None,
                kernel,
                |i, j0, mut mask, _, f| {
                    while mask != 0 {
                        let l = mask.trailing_zeros() as usize;
                        let j = j0 + l;
                        // The values reported are F - n_a (within the bound's error).
                        let shifted = exact(i, j) - qn2[i] as f64;
                        assert!((f[l] as f64 - shifted).abs() < 1e-3, "{} {shifted}", f[l]);
                        mask &= mask - 1;
                        assert!(j < nc && i < nq);
                        assert!(!kept[i * nc + j], "reported twice");
                        kept[i * nc + j] = true;
                    }
                    None
                },
            );
            let (mut inside, mut outside) = (0, 0);
            for i in 0..nq {
                for j in 0..nc {
                    let d2 = exact(i, j);
                    let skipped = (6..12).contains(&i);
                    if skipped {
                        assert!(!kept[i * nc + j], "{kernel:?}: skipped tile reported");
                    } else if i == 3 || d2 < g[i] * 0.999 {
                        assert!(kept[i * nc + j], "{kernel:?}: ({i}, {j}) d2 {d2} dropped");
                        inside += 1;
                    } else if d2 > g[i] * 1.001 {
                        assert!(!kept[i * nc + j], "{kernel:?}: ({i}, {j}) d2 {d2} kept");
                        outside += 1;
                    }
                }
            }
            assert!(inside > 100 && outside > 100, "{inside} {outside}");
            if kernel != Kernel::Portable {
                match &fast {
                    None => fast = Some(kept),
                    Some(f) => assert_eq!(f, &kept, "AVX2 and AVX-512 differ"),
                }
            }
            // A cutoff of -inf returned for query 0 after its first report: nothing more.
            let mut h = vec![f32::INFINITY; qs];
            let mut reports = 0;
            survivors_shifted(&q, &c, dim, &mut h, !0, None, kernel, |i, _, _, _, _| {
                if i == 0 {
                    reports += 1;
                    return Some(f32::NEG_INFINITY);
                }
                None
            });
            assert_eq!(reports, 1, "{kernel:?}");

            // The column test (symmetric self-kNN): rows keep nothing (h = -inf), each
            // candidate j keeps the queries with F clearly below its own cutoff; candidate
            // 5 keeps everything.
            let gc: Vec<f64> = (0..cs).map(|j| 2.5 + 0.02 * j as f64).collect();
            let mut cut: Vec<f32> = gc.iter().map(|&g| round_up_f32(g)).collect();
            cut[5] = f32::INFINITY;
            let ct = ColumnTest {
                own: &qn2,
                cut: &cut,
            };
            let mut h = vec![f32::NEG_INFINITY; qs];
            let mut kept = vec![false; nq * nc];
            survivors_shifted(
                &q,
                &c,
                dim,
                &mut h,
                !0,
                Some(&ct),
                kernel,
                |i, j0, m, cm, f| {
                    assert_eq!(m, 0, "{kernel:?}: a row kept at -inf");
                    let mut cm = cm;
                    while cm != 0 {
                        let l = cm.trailing_zeros() as usize;
                        cm &= cm - 1;
                        let j = j0 + l;
                        assert!(j < nc && i < nq);
                        let full = f[l] as f64 + qn2[i] as f64;
                        assert!((full - exact(i, j)).abs() < 1e-3, "{full}");
                        assert!(!kept[i * nc + j], "reported twice");
                        kept[i * nc + j] = true;
                    }
                    None
                },
            );
            let (mut inside, mut outside) = (0, 0);
            for i in 0..nq {
                for j in 0..nc {
                    let d2 = exact(i, j);
                    if j == 5 || d2 < gc[j] * 0.999 {
                        assert!(kept[i * nc + j], "{kernel:?}: column ({i}, {j}) dropped");
                        inside += 1;
                    } else if d2 > gc[j] * 1.001 {
                        assert!(!kept[i * nc + j], "{kernel:?}: column ({i}, {j}) kept");
                        outside += 1;
                    }
                }
            }
            assert!(inside > 100 && outside > 100, "{inside} {outside}");
            if kernel != Kernel::Portable {
                match &fast_cols {
                    None => fast_cols = Some(kept),
                    Some(f) => assert_eq!(f, &kept, "AVX2 and AVX-512 columns differ"),
                }
            }
        }
    }

    #[test]
    fn cutoff_rounds_up_and_grows() {
        let b = FilterBound::new(0.25f32 * 0.25, 64).unwrap();
        let g = b.cutoff(0.0, 0.0, 0.0, 0.0);
        assert!(g as f64 >= 0.0625);
        assert!(b.cutoff(1e-6, 1e-6, 1.0, 1.0) > g);
        assert!(FilterBound::new(1e-36f32, 8).is_none());
        // The shifted cutoff: G - own from above, negative ones included.
        let g64 = b.g(0.0, 0.0, 0.0, 0.0);
        for own in [0.0f32, 0.01, 0.0625, 3.0] {
            let h = b.cutoff_less_own(0.0, 0.0, 0.0, 0.0, own);
            assert!(h as f64 >= g64 - own as f64, "{own}");
            assert!((h as f64) < g64 - own as f64 + 1e-6);
        }
        assert!(b.useful(1.0) && !b.useful(1e6));
    }
}
