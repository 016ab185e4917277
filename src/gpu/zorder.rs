//! Host side of LSS's set of Z-lists (Lieberman, Sankaranarayanan & Samet 2008, §IV):
//! coordinates quantised onto integers, the shifted copies, conservative box radii, the
//! number of lists; and a host reference of the Z-order comparison the kernels use.
//!
//! Quantisation: one scale for every dimension (the paper's unit hypercube), the largest
//! extent of A and B together mapped onto [0, QMAX], QMAX = 2^31 - 1, so a list shifted by
//! less than 2^31 still fits a u32. `q_j(v) = clamp(floor((v - lo_j) * scale), 0, QMAX)`
//! in f64, for data points and queries alike.
//!
//! Box radius: every pair that matches under `metric.rs` (accumulator <= thr, in the input
//! precision) has |x_j - y_j| <= r in every dimension, with r from `thr` widened over the
//! rounding of the test (see [`Quantizer::radius`]); then |q_j(x) - q_j(y)| <= ceil(r *
//! scale) + 1 (the f64 quantisation errs by far less than one unit below 2^31). The
//! kernels search the box [q(x) - R, q(x) + R] clamped to [0, QMAX]: by the dominance
//! property of Z-order (the paper's Lemma 4.1) every point in it lies in the interval
//! between the Z-positions of its two corners, in every list.

use crate::dataset::{Coords, Dataset};
use crate::metric::Coord;
use crate::options::Metric;
use crate::stats::bounds_and_variance;
use rayon::prelude::*;
#[cfg(test)]
use std::cmp::Ordering;

/// Largest quantised coordinate.
pub const QMAX: u32 = (1 << 31) - 1;

/// Relative widening of a radius over the rounding of the match test: the test's rounding
/// is at most a few units of 2^-24 (f32), so this is generous.
const RADIUS_WIDEN: f64 = 1.0 / (1u64 << 20) as f64;

/// Maps coordinates onto [0, QMAX].
#[derive(Clone, Debug)]
pub struct Quantizer {
    lo: Vec<f64>,
    scale: f64,
}

impl Quantizer {
    /// A quantiser over the bounds of A and B together.
    pub fn new(a: &Dataset, b: Option<&Dataset>) -> Self {
        let (lo, hi, _) = bounds_and_variance(a, b);
        let extent = lo
            .iter()
            .zip(&hi)
            .map(|(l, h)| if h > l { h - l } else { 0.0 })
            .fold(0.0f64, f64::max);
        let scale = if extent > 0.0 && extent.is_finite() {
            QMAX as f64 / extent
        } else {
            0.0
        };
        let lo = lo
            .into_iter()
            .map(|l| if l.is_finite() { l } else { 0.0 })
            .collect();
        Quantizer { lo, scale }
    }

    /// The quantised coordinate of value `v` in dimension `j` (monotone in `v`).
    #[inline]
    pub fn quantize(&self, v: f64, j: usize) -> u32 {
        let x = ((v - self.lo[j]) * self.scale).floor();
        if x >= QMAX as f64 {
            QMAX
        } else if x > 0.0 {
            x as u32
        } else {
            0
        }
    }

    /// Quantised rows of every point of `data`, row-major (dim u32 each).
    pub fn rows(&self, data: &Dataset) -> Vec<u32> {
        let d = data.dim();
        let mut out = vec![0u32; data.len() * d];
        match data.coords() {
            Coords::F32(x) => self.fill_rows(x, d, &mut out),
            Coords::F64(x) => self.fill_rows(x, d, &mut out),
        }
        out
    }

    fn fill_rows<T: Coord>(&self, x: &[T], d: usize, out: &mut [u32]) {
        out.par_chunks_mut(d * 1024)
            .zip(x.par_chunks(d * 1024))
            .for_each(|(o, p)| {
                for (t, (q, &v)) in o.iter_mut().zip(p).enumerate() {
                    *q = self.quantize(v.to_f64(), t % d);
                }
            });
    }

    /// Half-width of the quantised box that holds every point whose accumulator with the
    /// query is <= `thr` (computed in T as metric.rs does), clamped to QMAX.
    pub fn radius<T: Coord>(&self, metric: Metric, thr: T) -> u32 {
        if self.scale == 0.0 {
            return 0; // every point quantises to the origin
        }
        let r = radius_bound::<T>(metric, thr.to_f64());
        let units = r * self.scale * (1.0 + 1e-12);
        if !units.is_finite() || units >= QMAX as f64 {
            return QMAX;
        }
        (units.ceil() as u32 + 2).min(QMAX)
    }
}

/// A bound r on |x_j - y_j| (real numbers) for every pair whose accumulator computed in T is
/// <= thr. Euclidean: each term fl(d_j^2) <= acc (partial sums of non-negative terms never
/// decrease), fl(d_j^2) >= d_j^2 (1 - u) - (half the smallest subnormal), and the rounded
/// difference d_j = fl(x_j - y_j) >= |x_j - y_j| (1 - u) (exact when subnormal). Manhattan
/// and Chebyshev: fl(|d_j|) <= acc likewise. `RADIUS_WIDEN` covers the (1 - u) factors.
pub fn radius_bound<T: Coord>(metric: Metric, thr: f64) -> f64 {
    // The smallest positive subnormal of T: the most a product can lose to underflow.
    let tiny = if T::UNIT_ROUNDOFF > 1e-10 {
        f32::from_bits(1) as f64
    } else {
        f64::from_bits(1)
    };
    let r = match metric {
        Metric::Euclidean => (thr + tiny).sqrt(),
        Metric::Manhattan | Metric::Chebyshev => thr,
        Metric::Cosine => unreachable!("cosine joins run as Euclidean (src/cosine/)"),
        Metric::Haversine => unreachable!("haversine joins run as Euclidean (src/geo.rs)"),
    };
    r * (1.0 + RADIUS_WIDEN)
}

/// The shift between consecutive lists, in quantised units: list j is shifted by j/m of
/// the range, m = `lists` rounded up to an odd number (the paper's v(j) = j/(d+1) with d
/// even; odd m keeps every shift off the dyadic grid boundaries, which a shift by 1/2 or
/// 1/4 would map onto coarser boundaries).
pub fn shift_for(lists: usize) -> u32 {
    if lists <= 1 {
        return 0;
    }
    let m = if lists % 2 == 1 { lists } else { lists + 1 } as u64;
    ((1u64 << 31) / m) as u32
}

/// The number of lists when the caller gives none. One in 1-D (a Z-list is then sorted
/// order and the box interval holds exactly the box). Else the paper's findings (its
/// Fig. 8): the best SZL sizes were 9, 6 and 5 lists for d = 16, 64 and 256 (interpolated
/// in log d, 5 beyond), never more than the full set (d + 1, or d + 2 for odd d). On a
/// software device `lss::choose_lists` caps this (measured there: BENCHMARKS.md).
pub fn auto_lists(dim: usize) -> usize {
    if dim <= 1 {
        return 1;
    }
    let full = if dim.is_multiple_of(2) {
        dim + 1
    } else {
        dim + 2
    };
    let l = (dim as f64).log2();
    let table = if l <= 4.0 {
        9.0
    } else if l <= 6.0 {
        9.0 - 1.5 * (l - 4.0)
    } else if l <= 8.0 {
        6.0 - 0.5 * (l - 6.0)
    } else {
        5.0
    };
    (table.round() as usize).min(full)
}

/// Z-order (Morton) comparison of two quantised rows shifted by `shift`, by the dimension
/// of the most significant differing bit; the host reference of the kernels' comparison.
#[cfg(test)]
pub fn z_cmp(a: &[u32], b: &[u32], shift: u32) -> Ordering {
    let mut top = 0u32;
    let mut ord = Ordering::Equal;
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x + shift, y + shift);
        let diff = x ^ y;
        if top < diff && top < (diff ^ top) {
            top = diff;
            ord = x.cmp(&y);
        }
    }
    ord
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::{threshold, within};

    /// Bit-interleaved key (dimension 0 most significant at each level) for small rows.
    fn morton(row: &[u32], bits: u32) -> u128 {
        let mut key = 0u128;
        for b in (0..bits).rev() {
            for &x in row {
                key = (key << 1) | ((x >> b) & 1) as u128;
            }
        }
        key
    }

    fn lcg(s: &mut u64) -> u64 {
        *s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *s >> 33
    }

    #[test]
    fn z_cmp_is_morton_order() {
        let mut s = 5;
        for d in [1usize, 2, 3, 5] {
            for _ in 0..2000 {
                let a: Vec<u32> = (0..d).map(|_| (lcg(&mut s) % 64) as u32).collect();
                let b: Vec<u32> = (0..d).map(|_| (lcg(&mut s) % 64) as u32).collect();
                assert_eq!(
                    z_cmp(&a, &b, 0),
                    morton(&a, 6).cmp(&morton(&b, 6)),
                    "{a:?} {b:?}"
                );
                // Shifted rows: the comparison of the shifted values.
                let sh: Vec<u32> = a.iter().map(|x| x + 5).collect();
                let sb: Vec<u32> = b.iter().map(|x| x + 5).collect();
                assert_eq!(z_cmp(&a, &b, 5), morton(&sh, 7).cmp(&morton(&sb, 7)));
            }
        }
    }

    #[test]
    fn dominance_implies_z_order() {
        let mut s = 9;
        for _ in 0..5000 {
            let a: Vec<u32> = (0..4).map(|_| lcg(&mut s) as u32 % QMAX).collect();
            let b: Vec<u32> = a
                .iter()
                .map(|&x| x + (lcg(&mut s) as u32 % 1000).min(QMAX - x))
                .collect();
            assert_ne!(z_cmp(&a, &b, 12345), Ordering::Greater);
        }
    }

    #[test]
    fn radius_holds_every_matching_pair() {
        // Pairs exactly at and around eps, f32 and f64, every metric: the quantised
        // coordinates of matching points differ by at most the radius.
        let mut s = 17;
        for metric in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
            for eps in [1e-6, 0.01, 0.3, 1.0, 7.5] {
                let mut pts = Vec::new();
                for _ in 0..2000 {
                    let x = (lcg(&mut s) % 1000) as f64 / 100.0;
                    let dx = match lcg(&mut s) % 3 {
                        0 => eps,
                        1 => eps * (1.0 + 1e-7),
                        _ => eps * (1.0 - 1e-7),
                    };
                    pts.extend_from_slice(&[x as f32, 1.0, (x + dx) as f32, 1.0]);
                }
                let data = Dataset::from_f32(&pts, 2).unwrap();
                let q = Quantizer::new(&data, None);
                let thr: f32 = threshold(metric, eps);
                let r = q.radius(metric, thr);
                for p in pts.chunks(4) {
                    if within(metric, &p[..2], &p[2..], thr) {
                        let (a, b) = (q.quantize(p[0] as f64, 0), q.quantize(p[2] as f64, 0));
                        assert!(
                            a.abs_diff(b) <= r,
                            "{metric} eps {eps}: {p:?} {a} {b} r {r}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn lists_and_shifts() {
        assert_eq!(auto_lists(1), 1);
        assert_eq!(auto_lists(2), 3);
        assert_eq!(auto_lists(3), 5);
        assert_eq!(auto_lists(16), 9);
        assert_eq!(auto_lists(64), 6);
        assert_eq!(auto_lists(256), 5);
        assert_eq!(auto_lists(1000), 5);
        for lists in 1..=64 {
            let s = shift_for(lists) as u64;
            assert!(s * (lists as u64 - 1) < 1 << 31);
            assert!(s * (lists as u64 - 1) + QMAX as u64 <= u32::MAX as u64);
        }
        assert_eq!(shift_for(17), (1u32 << 31) / 17);
    }
}
