//! The one definition of "a pair matches", shared by every backend.
//!
//! A join is a set, so every backend (CPU grid, EGO, brute force, every GPU kernel) must
//! decide every pair identically, bit for bit. The rules:
//! - arithmetic in the input precision `T` (f32 or f64);
//! - eps is rounded once to `T`; Euclidean compares the squared distance with
//!   `eps_T * eps_T` (computed in `T`), Manhattan the sum with `eps_T`, Chebyshev the max;
//! - terms are accumulated in the dataset's dimension order, one rounding per operation
//!   and no fused multiply-add (GLSL kernels mark the accumulator `precise`);
//! - `<=` is a match.
//!
//! Early exit (SHORTC) is exact: every term is >= 0 and rounding is monotone, so partial
//! sums never decrease and a partial sum above the threshold proves a non-match.
//! An implementation that visits dimensions in another order (REORDER) may only use that
//! order to *reject* with a safety margin (`reject_margin`) and must confirm survivors with
//! the canonical order.

use crate::dataset::Precision;
use crate::error::{Error, Result};
use crate::options::Metric;

/// A coordinate type: f32 or f64.
pub trait Coord:
    Copy
    + Send
    + Sync
    + PartialOrd
    + bytemuck::Pod
    + std::fmt::Debug
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + 'static
{
    const ZERO: Self;
    /// Unit roundoff (half an ulp of 1).
    const UNIT_ROUNDOFF: f64;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn abs(self) -> Self;
    fn max(self, other: Self) -> Self;
    /// Square root in the input precision (IEEE, correctly rounded).
    fn sqrt(self) -> Self;
}

impl Coord for f32 {
    const ZERO: Self = 0.0;
    const UNIT_ROUNDOFF: f64 = f32::EPSILON as f64 / 2.0;
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn abs(self) -> Self {
        f32::abs(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    #[inline(always)]
    fn max(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
}

impl Coord for f64 {
    const ZERO: Self = 0.0;
    const UNIT_ROUNDOFF: f64 = f64::EPSILON / 2.0;
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn abs(self) -> Self {
        f64::abs(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    #[inline(always)]
    fn max(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
}

/// The value the accumulated distance is compared with (`acc <= threshold`).
#[inline]
pub fn threshold<T: Coord>(metric: Metric, eps: f64) -> T {
    let e = T::from_f64(eps);
    match metric {
        Metric::Euclidean => e * e,
        Metric::Manhattan | Metric::Chebyshev => e,
    }
}

/// Checks that an eps-join with `eps` compares exactly in `precision`: the threshold
/// ([`threshold`] in that precision) must be a finite, normal number. Euclidean eps above
/// about 1.3e154 (f64; 1.8e19 for f32) squares to infinity, which every overflowed
/// squared distance would "match"; eps below about 1.5e-154 (f64; 1.1e-19 for f32)
/// squares to zero or a subnormal, which every tiny squared distance that underflowed
/// with it would match too. Both would be wrong answers, so they are errors.
pub fn check_eps(metric: Metric, eps: f64, precision: Precision) -> Result<()> {
    // Normality is tested in the data's own precision (an f32 subnormal is an f64 normal).
    let (thr, normal, name) = match precision {
        Precision::F32 => {
            let t = threshold::<f32>(metric, eps);
            (f64::from(t), t.is_normal(), "f32")
        }
        Precision::F64 => {
            let t = threshold::<f64>(metric, eps);
            (t, t.is_normal(), "f64")
        }
    };
    if normal {
        return Ok(());
    }
    let what = if metric == Metric::Euclidean {
        "eps squared"
    } else {
        "eps"
    };
    Err(Error::invalid(format!(
        "eps = {eps:e} is out of range for {name} coordinates: {what} is {} in {name}, so \
         distances could not be compared exactly; rescale the data (and eps)",
        if thr.is_infinite() {
            "infinite"
        } else if thr == 0.0 {
            "zero"
        } else {
            "subnormal"
        }
    )))
}

/// Checks that no distance between points within the per-dimension bounds `lo..=hi`
/// overflows in `precision`: an infinite distance would tie points that are not equally
/// far (kNN ranks them). Underflow stays as the input precision gives it: points closer
/// than the smallest normal square are at distance 0, ties broken by index (the oracle's
/// arithmetic, and an absolute error below that square).
pub fn check_extent(metric: Metric, lo: &[f64], hi: &[f64], precision: Precision) -> Result<()> {
    fn largest<T: Coord>(metric: Metric, lo: &[f64], hi: &[f64]) -> f64 {
        // Every coordinate difference is at most hi - lo, and rounding is monotone, so no
        // pair accumulates more than this.
        let mut acc = T::ZERO;
        for (&l, &h) in lo.iter().zip(hi) {
            if h >= l {
                acc = accumulate(metric, acc, T::from_f64(h - l), T::ZERO);
            }
        }
        acc.to_f64()
    }
    let (acc, name) = match precision {
        Precision::F32 => (largest::<f32>(metric, lo, hi), "f32"),
        Precision::F64 => (largest::<f64>(metric, lo, hi), "f64"),
    };
    if acc.is_finite() {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "the points' extent is out of range for {name} distances: the largest {} overflows, \
         so distances could not be ranked exactly; rescale the data",
        if metric == Metric::Euclidean {
            "squared distance"
        } else {
            "distance"
        }
    )))
}

/// One dimension's contribution and how it is folded into the accumulator.
#[inline(always)]
pub fn accumulate<T: Coord>(metric: Metric, acc: T, a: T, b: T) -> T {
    let d = a - b;
    match metric {
        Metric::Euclidean => acc + d * d,
        Metric::Manhattan => acc + d.abs(),
        Metric::Chebyshev => acc.max(d.abs()),
    }
}

/// The canonical match test: `dist(a, b) <= eps` with `thr = threshold(metric, eps)`.
/// Exits early (exactly) once the partial distance exceeds the threshold.
#[inline]
pub fn within<T: Coord>(metric: Metric, a: &[T], b: &[T], thr: T) -> bool {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = T::ZERO;
    // Check every 4 dimensions: cheap enough, and exact (partial sums are monotone).
    for (ca, cb) in a.chunks(4).zip(b.chunks(4)) {
        for (&x, &y) in ca.iter().zip(cb) {
            acc = accumulate(metric, acc, x, y);
        }
        if acc > thr {
            return false;
        }
    }
    acc <= thr
}

/// The accumulated distance (squared for Euclidean), in canonical order, no early exit.
#[inline]
pub fn distance_acc<T: Coord>(metric: Metric, a: &[T], b: &[T]) -> T {
    let mut acc = T::ZERO;
    for (&x, &y) in a.iter().zip(b) {
        acc = accumulate(metric, acc, x, y);
    }
    acc
}

/// The reported distance of an accumulator: its square root for Euclidean (in the input
/// precision), the accumulator itself otherwise.
#[inline(always)]
pub fn finish<T: Coord>(metric: Metric, acc: T) -> T {
    if metric == Metric::Euclidean {
        acc.sqrt()
    } else {
        acc
    }
}

/// Relative margin that makes a rejection by a sum in a *non-canonical* dimension order
/// safe: if `acc_any_order > thr * (1 + reject_margin)`, the canonical sum is > thr too.
/// (Any two summation orders of n non-negative terms differ by at most ~2(n-1)u relative.)
pub fn reject_margin<T: Coord>(dim: usize) -> f64 {
    4.0 * (dim as f64 + 1.0) * T::UNIT_ROUNDOFF
}

/// `thr` widened so that a sum in any other dimension order above it proves the canonical
/// sum is above `thr` (see [`reject_margin`]); twice the margin also covers rounding the
/// widened value to T. Used by the CPU and the GPU joins alike (REORDER rejections).
pub fn reject_threshold<T: Coord>(thr: T, dim: usize) -> T {
    T::from_f64(thr.to_f64() * (1.0 + 2.0 * reject_margin::<T>(dim)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundary_is_a_match() {
        // Points exactly eps apart (exactly representable) match under every metric.
        for m in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
            let t: f64 = threshold(m, 0.5);
            assert!(within(m, &[0.0f64, 1.0], &[0.5, 1.0], t));
            assert!(!within(m, &[0.0f64, 1.0], &[0.5000001, 1.0], t));
        }
    }

    #[test]
    fn metrics_differ() {
        let a = [0.0f32, 0.0];
        let b = [0.3f32, 0.4];
        assert!(within(
            Metric::Euclidean,
            &a,
            &b,
            threshold(Metric::Euclidean, 0.5001)
        ));
        assert!(!within(
            Metric::Manhattan,
            &a,
            &b,
            threshold(Metric::Manhattan, 0.5001)
        ));
        assert!(within(
            Metric::Chebyshev,
            &a,
            &b,
            threshold(Metric::Chebyshev, 0.4)
        ));
    }
}
