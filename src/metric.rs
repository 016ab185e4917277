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
//!
//! Cosine (distance 1 - cos(a, b)) is not a sum of per-dimension terms, and has its own
//! rule ([`cosine_within`]): every coordinate widened exactly to f64, in the dataset's
//! dimension order, one rounding per operation, no fused multiply-add,
//! `na = sum a_i^2`, `nb = sum b_i^2`, `dot = sum a_i b_i`; the pair matches when
//! `dot >= (1 - e) * (sqrt(na) * sqrt(nb))`, `e` being eps rounded to the input precision
//! (then widened to f64); its distance is `1 - dot / (sqrt(na) * sqrt(nb))` rounded to
//! the input precision. A vector whose `na` is not a normal f64 (zero, or too small or
//! too large to square) is an error. The engine runs cosine joins as Euclidean joins of
//! normalised copies at a widened eps and confirms every candidate by this rule, but for
//! those whose f32 product proves that it accepts them (`src/cosine/mod.rs` `sure_dot`), so
//! every backend returns this set.
//!
//! Haversine (great-circle distance in metres between (latitude, longitude) points in
//! degrees, on a sphere of radius `R`: [`EARTH_RADIUS_M`] unless `JoinOptions::sphere_radius`
//! says otherwise) has its own rule too, all in f64 whatever the input precision
//! (coordinates widened exactly):
//! - each point becomes a unit vector ([`geo_unit_vector`]): the longitude is reduced
//!   exactly to [-180, 180) (`lon % 360`, then +-360; 180 becomes -180, so -180 and 180 are
//!   the same meridian bit for bit), a pole's longitude (latitude exactly +-90) is taken as
//!   0; `p = lat.to_radians()`, `q = lon.to_radians()` (Rust's f64 `to_radians`, one
//!   product), `v = (cos p * cos q, cos p * sin q, sin p)` with f64 `sin`/`cos`;
//! - the pair's chord squared is `c = (d0 * d0 + d1 * d1) + d2 * d2`, `dk = u_k - v_k`, one
//!   rounding per operation, no fused multiply-add ([`geo_chord2`]): exactly the Euclidean
//!   accumulator of the two f64 vectors;
//! - eps is rounded once to the input precision (as for every metric), widened to f64 as
//!   `e`; the chord threshold is `C = h * h`, `h = 2 * sin((e / R) / 2)`
//!   ([`geo_chord_threshold`]), or +infinity when `e >= pi * R` (half the circumference:
//!   every pair); the pair matches when `c <= C`;
//! - its distance is `2 R * asin(min(sqrt(c) / 2, 1))` in metres ([`geo_distance_m`]),
//!   rounded to the input precision; kNN ranks by `c` (f64) and then by index; DBSCAN
//!   sends a border point to its nearest core point by `c` rounded to the input precision
//!   ([`distance_acc`]), then by index.
//!
//! `sin`, `cos` and `asin` are the platform's libm (correctly rounded or within an ulp):
//! the engine computes the vectors and `C` once on the host and every backend follows
//! them, so all backends agree exactly. Relation to the plain haversine formula
//! `d = 2 R asin(sqrt(sin^2(dp / 2) + cos p1 cos p2 sin^2(dq / 2)))` evaluated in f64:
//! both are the same great-circle distance in exact arithmetic (`c = 4 hav`, the chord
//! `2 sin(d / 2R)`), so they can disagree only on pairs whose distance is within rounding
//! of eps: `tests/haversine.rs` places 24,000 pairs within a few 1e-14 of eps (eps 5 cm
//! to 19,000 km), counts about one in ten disagreeing, and checks that every one is at a
//! formula distance within `1e-14 eps + 5e-9 m` of eps (measured: at most 2.5e-9 m up to
//! eps 20 km, where both formulas' rounding of coordinates near 1 radian, about 1e-16 R,
//! dominates; about 1e-15 relative beyond). Near antipodes (eps within a few km of half
//! the circumference) `asin` near 1 resolves distances only to about 0.2 m, in both.
//! Latitudes outside [-90, 90] and non-finite coordinates are an error.

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
        Metric::Manhattan | Metric::Chebyshev | Metric::Cosine | Metric::Haversine => e,
    }
}

/// Checks that an eps-join with `eps` compares exactly in `precision`: the threshold
/// ([`threshold`] in that precision) must be a finite, normal number. Euclidean eps above
/// about 1.3e154 (f64; 1.8e19 for f32) squares to infinity, which every overflowed
/// squared distance would "match"; eps below about 1.5e-154 (f64; 1.1e-19 for f32)
/// squares to zero or a subnormal, which every tiny squared distance that underflowed
/// with it would match too. Both would be wrong answers, so they are errors.
/// Haversine's eps is checked on the Earth's sphere here, on another by [`check_geo_eps`].
pub fn check_eps(metric: Metric, eps: f64, precision: Precision) -> Result<()> {
    if metric == Metric::Haversine {
        return check_geo_eps(eps, EARTH_RADIUS_M, precision);
    }
    if metric == Metric::Cosine {
        // Compared in f64 (`cosine_within`): any positive eps is exact. eps rounded to an
        // f32 zero would match only parallel vectors; refuse it as a misuse.
        let e = threshold::<f64>(metric, eps);
        let rounded = match precision {
            Precision::F32 => f64::from(threshold::<f32>(metric, eps)),
            Precision::F64 => e,
        };
        return if rounded > 0.0 && rounded.is_finite() {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "cosine eps = {eps:e} rounds to zero in the data's precision"
            )))
        };
    }
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
        // Not a per-dimension sum: `within` and `distance_acc` take cosine's own rule.
        Metric::Cosine => unreachable!("cosine has no per-dimension accumulator"),
        Metric::Haversine => unreachable!("haversine has no per-dimension accumulator"),
    }
}

/// The canonical match test: `dist(a, b) <= eps` with `thr = threshold(metric, eps)`.
/// Exits early (exactly) once the partial distance exceeds the threshold.
#[inline]
pub fn within<T: Coord>(metric: Metric, a: &[T], b: &[T], thr: T) -> bool {
    debug_assert_eq!(a.len(), b.len());
    if metric == Metric::Cosine {
        return cosine_within(a, b, norm(a), norm(b), thr.to_f64());
    }
    if metric == Metric::Haversine {
        return geo_chord2(&geo_row(a), &geo_row(b))
            <= geo_chord_threshold(thr.to_f64(), EARTH_RADIUS_M);
    }
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

/// [`within`]'s answer, bit for bit, faster in many dimensions: for Euclidean and Manhattan
/// the accumulator summed in 16 lanes (vectorised) decides wherever it is farther from the
/// threshold than two summation orders can differ; only pairs within that margin take the
/// canonical sum. Other metrics take [`within`].
///
/// Why it is the same answer: each term (`accumulate`'s `d * d` or `|d|`, `d = a - b` in
/// T) is computed alike in both sums, and they are at least 0, so each sum is within
/// gamma_(dim-1) S of their exact sum S (a sum that underflows is exact); the two sums are
/// then within a factor (1 + gamma) / (1 - gamma) of each other, under 1 + 2
/// [`reject_margin`], and the comparisons below (in f64, of values of T) have room for their
/// own rounding. An EGO join of collinear rows spent 72% of its time in the canonical
/// sum's chain of dependent adds, one per pair.
#[inline]
pub fn within_fast<T: Coord>(metric: Metric, a: &[T], b: &[T], thr: T) -> bool {
    if !matches!(metric, Metric::Euclidean | Metric::Manhattan) || a.len() < 16 {
        return within(metric, a, b, thr);
    }
    let mut acc = [T::ZERO; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] = accumulate(metric, acc[l], x[l], y[l]);
        }
    }
    let mut sum = acc.iter().fold(T::ZERO, |s, &v| s + v);
    for (&x, &y) in ra.iter().zip(rb) {
        sum = accumulate(metric, sum, x, y);
    }
    let (fast, t) = (sum.to_f64(), thr.to_f64());
    let m = 1.0 + 2.0 * reject_margin::<T>(a.len());
    if !fast.is_finite() {
        within(metric, a, b, thr)
    } else if fast > t * m {
        false
    } else if fast * m <= t {
        true
    } else {
        within(metric, a, b, thr)
    }
}

/// The accumulated distance (squared for Euclidean), in canonical order, no early exit.
#[inline]
pub fn distance_acc<T: Coord>(metric: Metric, a: &[T], b: &[T]) -> T {
    if metric == Metric::Cosine {
        return T::from_f64(cosine_distance(a, b, norm(a), norm(b)));
    }
    if metric == Metric::Haversine {
        // The chord squared (kNN's and DBSCAN's ranking key), rounded to T.
        return T::from_f64(geo_chord2(&geo_row(a), &geo_row(b)));
    }
    let mut acc = T::ZERO;
    for (&x, &y) in a.iter().zip(b) {
        acc = accumulate(metric, acc, x, y);
    }
    acc
}

/// The reported distance of an accumulator: its square root for Euclidean (in the input
/// precision), metres for haversine (from the chord squared as `T` holds it: exact for
/// f64; the engine reports f32 data's distances from the f64 chord), the accumulator
/// itself otherwise.
#[inline(always)]
pub fn finish<T: Coord>(metric: Metric, acc: T) -> T {
    match metric {
        Metric::Euclidean => acc.sqrt(),
        Metric::Haversine => T::from_f64(geo_distance_m(acc.to_f64(), EARTH_RADIUS_M)),
        _ => acc,
    }
}

/// The sphere's radius of `Metric::Haversine` by default, in metres: the mean Earth radius
/// (IUGG, 2 a + b over 3 of WGS 84). `JoinOptions::sphere_radius` and
/// `KnnOptions::sphere_radius` set another (the functions below take it as `r`); [`within`]
/// and [`finish`], which take no options, use this one.
pub const EARTH_RADIUS_M: f64 = 6_371_008.8;

/// The smallest chord threshold squared a haversine join accepts (eps about 4e-118 m):
/// far above f64's subnormals, so the engine's Euclidean join of the vectors compares it
/// exactly.
pub const GEO_SMALLEST_CHORD2: f64 = 1e-280;

/// A (latitude, longitude) point in degrees as the rule's f64 unit vector (see the
/// module's rule: longitude reduced exactly to [-180, 180), a pole's longitude taken as 0).
/// The coordinates must have passed [`check_geo`].
#[inline]
pub fn geo_unit_vector(lat: f64, lon: f64) -> [f64; 3] {
    let mut l = lon % 360.0;
    // Exact (Sterbenz): |l| in (180, 360) and 360 are within a factor of two.
    if l > 180.0 {
        l -= 360.0;
    } else if l < -180.0 {
        l += 360.0;
    }
    if l == 180.0 {
        l = -180.0;
    }
    if lat == 90.0 || lat == -90.0 {
        l = 0.0;
    }
    let p = lat.to_radians();
    let q = l.to_radians();
    let (sp, cp) = (p.sin(), p.cos());
    let (sq, cq) = (q.sin(), q.cos());
    [cp * cq, cp * sq, sp]
}

/// A 2-column row (latitude, longitude) of the input as its unit vector.
#[inline]
pub fn geo_row<T: Coord>(row: &[T]) -> [f64; 3] {
    geo_unit_vector(row[0].to_f64(), row[1].to_f64())
}

/// The chord squared between two unit vectors under the rule: f64, canonical order, one
/// rounding per operation, no fused multiply-add (the Euclidean accumulator).
#[inline(always)]
pub fn geo_chord2(u: &[f64; 3], v: &[f64; 3]) -> f64 {
    let mut c = 0.0f64;
    for k in 0..3 {
        let d = u[k] - v[k];
        c += d * d;
    }
    c
}

/// The rule's chord threshold squared for `e` metres (eps rounded to the input precision,
/// widened to f64) on a sphere of radius `r` metres: `(2 sin((e / r) / 2))^2`, +infinity
/// at or past half the circumference.
#[inline]
pub fn geo_chord_threshold(e: f64, r: f64) -> f64 {
    if e >= std::f64::consts::PI * r {
        return f64::INFINITY;
    }
    let h = 2.0 * ((e / r) / 2.0).sin();
    h * h
}

/// The rule's distance in metres of a chord squared `c` on a sphere of radius `r` metres:
/// `2 r asin(min(sqrt(c) / 2, 1))`.
#[inline]
pub fn geo_distance_m(c: f64, r: f64) -> f64 {
    let h = (c.sqrt() / 2.0).min(1.0);
    (2.0 * r) * h.asin()
}

/// [`check_eps`] for a haversine join on a sphere of `radius` metres: the chord of eps
/// squared must be at least [`GEO_SMALLEST_CHORD2`] (or every pair's, past half the
/// circumference).
pub fn check_geo_eps(eps: f64, radius: f64, precision: Precision) -> Result<()> {
    let e = match precision {
        Precision::F32 => f64::from(threshold::<f32>(Metric::Haversine, eps)),
        Precision::F64 => eps,
    };
    let c = geo_chord_threshold(e, radius);
    // The engine's Euclidean join of the vectors compares with a square near `c`.
    if e > 0.0 && (c.is_infinite() || c >= GEO_SMALLEST_CHORD2) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "haversine eps = {eps:e} m is too small: its chord on the unit sphere squared \
             ({c:e}) is below {GEO_SMALLEST_CHORD2:e}, out of f64's exact range"
        )))
    }
}

/// `Ok` when `radius` (metres) can be a haversine join's sphere: finite and positive, and
/// normal so that `e / radius` is exact to f64's precision.
pub fn check_sphere_radius(radius: f64) -> Result<()> {
    if radius.is_normal() && radius > 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "sphere_radius = {radius:e} m: it must be a finite, positive number of metres"
        )))
    }
}

/// `Ok` when row `row`'s (latitude, longitude) can take part in a haversine join: both
/// finite, the latitude within [-90, 90].
pub fn check_geo(lat: f64, lon: f64, row: usize) -> Result<()> {
    if !lat.is_finite() || !lon.is_finite() {
        return Err(Error::invalid(format!(
            "row {row}: haversine needs finite latitude and longitude in degrees (got {lat}, \
             {lon})"
        )));
    }
    if !(-90.0..=90.0).contains(&lat) {
        return Err(Error::invalid(format!(
            "row {row}: latitude {lat} is outside [-90, 90] degrees (haversine points are \
             (latitude, longitude) in degrees, in that order)"
        )));
    }
    Ok(())
}

/// A vector's norm under cosine's rule: `sqrt(sum a_i^2)`, in f64, canonical order. The
/// sum must be a normal number for the vector to take part (see [`check_norm`]).
#[inline]
pub fn norm<T: Coord>(a: &[T]) -> f64 {
    let mut n = 0.0f64;
    for &x in a {
        let x = x.to_f64();
        n += x * x;
    }
    n.sqrt()
}

/// [`norm`] of each row of `rows` (`dim` wide) into `out`, eight rows side by side: each
/// lane is [`norm`]'s own sum, in the same order (so the same bits), but the eight chains
/// of dependent adds run together instead of one after the other (the one chain's latency
/// bounded the norms of 100,000 384-D rows at about 30 ms on 2 cores).
pub fn norms_into<T: Coord>(rows: &[T], dim: usize, out: &mut [f64]) {
    const LANES: usize = 8;
    assert_eq!(rows.len(), dim * out.len(), "a norm a row");
    if dim == 0 {
        out.fill(0.0);
        return;
    }
    let mut eights = out.chunks_exact_mut(LANES);
    let mut rest = rows.chunks_exact(LANES * dim);
    for (o, r) in (&mut eights).zip(&mut rest) {
        let mut n = [0.0f64; LANES];
        for i in 0..dim {
            for (l, n) in n.iter_mut().enumerate() {
                let x = r[l * dim + i].to_f64();
                *n += x * x;
            }
        }
        for (o, n) in o.iter_mut().zip(n) {
            *o = n.sqrt();
        }
    }
    for (o, r) in eights
        .into_remainder()
        .iter_mut()
        .zip(rest.remainder().chunks_exact(dim))
    {
        *o = norm(r);
    }
}

/// `Ok` when a vector of norm `norm` ([`norm`]) can take part in a cosine join: its
/// squared norm was a normal f64 (not zero, not under- or overflowed).
pub fn check_norm(norm: f64, row: usize) -> Result<()> {
    if (norm * norm).is_normal() && norm.is_normal() {
        return Ok(());
    }
    Err(Error::invalid(if norm == 0.0 {
        format!("row {row} is a zero vector: its cosine distance to anything is undefined")
    } else {
        format!(
            "row {row}'s squared norm is out of f64's normal range ({norm:e} squared): \
             cosine distances could not be computed exactly; rescale the data"
        )
    }))
}

/// `dot(a, b)` under cosine's rule: f64, canonical order, no fused multiply-add.
#[inline]
pub fn cosine_dot<T: Coord>(a: &[T], b: &[T]) -> f64 {
    let mut dot = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        dot += x.to_f64() * y.to_f64();
    }
    dot
}

/// Pairs [`cosine_dots`] takes at once where many pairs need the rule's sum.
pub const COSINE_LANES: usize = 4;

/// [`cosine_dot`] of `N` pairs (rows of one length), the same bits: each lane is the same
/// chain of f64 adds in the same order (no fused multiply-add), the chains side by side.
/// One sum is bound by its adds' latency, not their arithmetic: four side by side take
/// about 0.43x the time of four one after the other (384-D, measured on this VM's EPYC).
#[inline]
pub fn cosine_dots<T: Coord, const N: usize>(pairs: [(&[T], &[T]); N]) -> [f64; N] {
    let dim = pairs.first().map_or(0, |p| p.0.len());
    assert!(pairs.iter().all(|(a, b)| a.len() == dim && b.len() == dim));
    let mut acc = [0.0f64; N];
    for i in 0..dim {
        for (l, (a, b)) in pairs.iter().enumerate() {
            acc[l] += a[i].to_f64() * b[i].to_f64();
        }
    }
    acc
}

/// The cosine match test (the written rule above) for vectors of norms `na`, `nb` ([`norm`])
/// at `e` (eps rounded to the input precision, widened to f64).
#[inline]
pub fn cosine_within<T: Coord>(a: &[T], b: &[T], na: f64, nb: f64, e: f64) -> bool {
    cosine_accept(cosine_dot(a, b), na, nb, e)
}

/// The rule's comparison of a pair's [`cosine_dot`] with its threshold.
#[inline]
pub fn cosine_accept(dot: f64, na: f64, nb: f64, e: f64) -> bool {
    dot >= (1.0 - e) * (na * nb)
}

/// [`cosine_within`]'s answer, bit for bit, faster: the f64 dot product summed in eight
/// lanes (vectorised) decides wherever it is farther from the threshold than any two
/// summation orders can differ; only pairs within that margin take the canonical sum.
///
/// Why it is the same answer: any order's f64 sum of the products of `dim` pairs is within
/// gamma_(dim+1) sum |a_i b_i| <= gamma_(dim+1) |a| |b| of the exact sum (products rounded
/// or fused included; Cauchy-Schwarz), so two orders differ by at most twice that; `na`,
/// `nb` are the norms to f64's precision ([`norm`]), and the margin below, 4 (dim + 2) u
/// na nb, covers twice the bound with room for the rounding of the margin, the threshold's
/// product and the difference itself. The confirmation of a cosine join's candidates
/// (`src/cosine/`) spent half a 768-D join in the canonical sum's chain of dependent adds.
#[inline]
pub fn cosine_within_fast<T: Coord>(a: &[T], b: &[T], na: f64, nb: f64, e: f64) -> bool {
    cosine_verdict_fast(a, b, na, nb, e)
        .unwrap_or_else(|| cosine_accept(cosine_dot(a, b), na, nb, e))
}

/// [`cosine_within_fast`]'s answer where the vectorised sum decides it, None where the pair
/// lies within its margin of the threshold (the canonical sum decides: [`cosine_accept`]).
#[inline]
pub fn cosine_verdict_fast<T: Coord>(a: &[T], b: &[T], na: f64, nb: f64, e: f64) -> Option<bool> {
    let thr = (1.0 - e) * (na * nb);
    let fast = dot_lanes(a, b);
    let margin = 4.0 * (a.len() as f64 + 2.0) * (f64::EPSILON / 2.0) * (na * nb);
    if fast - thr > margin {
        Some(true)
    } else if thr - fast > margin {
        Some(false)
    } else {
        None
    }
}

/// [`cosine_distance`] to within [`cosine_distance_slack`], faster (the f64 dot product in
/// eight lanes, as [`cosine_within_fast`]): a kNN ranks its candidates by it and takes the
/// canonical distance only for those that can still be among the k nearest.
#[inline]
pub fn cosine_distance_fast<T: Coord>(a: &[T], b: &[T], na: f64, nb: f64) -> f64 {
    1.0 - dot_lanes(a, b) / (na * nb)
}

/// How far [`cosine_distance_fast`] and [`cosine_distance`] can differ over `dim`
/// dimensions: the two dot products by at most 4 (dim + 2) u na nb ([`cosine_within_fast`]'s
/// margin), so their quotients by na nb by 4 (dim + 2) u; each quotient (at most 1 + 2u in
/// size, Cauchy-Schwarz) and each subtraction from 1 is rounded once more, under 3u a
/// distance: 16 u covers both with room.
pub fn cosine_distance_slack(dim: usize) -> f64 {
    (4.0 * (dim as f64 + 2.0) + 16.0) * (f64::EPSILON / 2.0)
}

/// `sum a_i b_i` in f64 over eight lanes (an order the compiler vectorises).
#[inline]
pub(crate) fn dot_lanes<T: Coord>(a: &[T], b: &[T]) -> f64 {
    let mut acc = [0.0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l].to_f64() * y[l].to_f64();
        }
    }
    let mut tail = 0.0f64;
    for (&x, &y) in ra.iter().zip(rb) {
        tail += x.to_f64() * y.to_f64();
    }
    acc.iter().sum::<f64>() + tail
}

/// The cosine distance under the written rule, in f64 (reported rounded to the input
/// precision).
#[inline]
pub fn cosine_distance<T: Coord>(a: &[T], b: &[T], na: f64, nb: f64) -> f64 {
    cosine_distance_of(cosine_dot(a, b), na, nb)
}

/// The rule's distance of a pair from its [`cosine_dot`].
#[inline]
pub fn cosine_distance_of(dot: f64, na: f64, nb: f64) -> f64 {
    1.0 - dot / (na * nb)
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

    /// The vectorised Euclidean and Manhattan test answers as the canonical one: f32 and
    /// f64, 1-70 and 384 dimensions, rows near and far, thresholds at random and at the
    /// canonical accumulator itself and a step of T either side (where the two sums' orders
    /// disagree, only the canonical one may decide), and values that underflow.
    #[test]
    fn fast_within_is_the_canonical_one() {
        let mut s = 5u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        };
        fn check<T: Coord>(m: Metric, a: &[T], b: &[T], thr: T, seen: &mut [usize; 2]) {
            let want = within(m, a, b, thr);
            assert_eq!(
                within_fast(m, a, b, thr),
                want,
                "{m:?} dim {} thr {thr:?}",
                a.len()
            );
            seen[usize::from(want)] += 1;
        }
        fn steps<T: Coord>(acc: T) -> [T; 3] {
            let up = T::from_f64(acc.to_f64() * (1.0 + 2.0 * T::UNIT_ROUNDOFF));
            let down = T::from_f64(acc.to_f64() * (1.0 - 2.0 * T::UNIT_ROUNDOFF));
            [acc, up, down]
        }
        let mut seen = [0usize; 2];
        for dim in (1..=70).chain([384]) {
            for round in 0..30 {
                let scale = [1.0, 1e-20, 1e-160][round % 3];
                let a: Vec<f64> = (0..dim).map(|_| next() * scale).collect();
                let b: Vec<f64> = match round % 2 {
                    0 => a.iter().map(|x| x + 0.01 * scale * next()).collect(),
                    _ => (0..dim).map(|_| next() * scale).collect(),
                };
                let (a32, b32): (Vec<f32>, Vec<f32>) = (
                    a.iter().map(|&x| x as f32).collect(),
                    b.iter().map(|&x| x as f32).collect(),
                );
                for m in [Metric::Euclidean, Metric::Manhattan, Metric::Chebyshev] {
                    let at = distance_acc(m, &a, &b);
                    for thr in steps(at).into_iter().chain([next().abs() * at * 2.0]) {
                        check(m, &a, &b, thr, &mut seen);
                    }
                    let at = distance_acc(m, &a32, &b32);
                    for thr in steps(at)
                        .into_iter()
                        .chain([next().abs() as f32 * at * 2.0])
                    {
                        check(m, &a32, &b32, thr, &mut seen);
                    }
                }
            }
        }
        // Both answers came up often (the thresholds at the sum accept, those below reject).
        assert!(seen[0] > 3000 && seen[1] > 3000, "{seen:?}");
    }

    /// Pairs side by side are `cosine_dot`'s bits: f32 and f64, lengths 0-40 and 384, each
    /// lane its own rows (some shared), magnitudes from 1e-3 to 1e3 so that the sums round.
    #[test]
    fn cosine_dots_are_the_rules_dot_products() {
        let mut s = 11u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let m = ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0;
            m * 10f64.powi((s % 7) as i32 - 3)
        };
        fn check<T: Coord>(rows: &[Vec<T>]) {
            let pairs: [(&[T], &[T]); 4] =
                std::array::from_fn(|l| (&rows[l][..], &rows[(3 * l + 1) % rows.len()][..]));
            let got = cosine_dots(pairs);
            for (l, (a, b)) in pairs.iter().enumerate() {
                assert_eq!(got[l].to_bits(), cosine_dot(a, b).to_bits(), "lane {l}");
            }
            let one = cosine_dots([pairs[2]]);
            assert_eq!(one[0].to_bits(), got[2].to_bits());
        }
        for dim in (0..=40).chain([384]) {
            for _ in 0..20 {
                let rows: Vec<Vec<f64>> =
                    (0..5).map(|_| (0..dim).map(|_| next()).collect()).collect();
                let rows32: Vec<Vec<f32>> = rows
                    .iter()
                    .map(|r| r.iter().map(|&x| x as f32).collect())
                    .collect();
                check(&rows);
                check(&rows32);
            }
        }
    }

    /// The fast cosine test answers as the canonical one: random and clustered rows, f32
    /// and f64, 2-1024 dimensions, thresholds at random and at the canonical dot product
    /// itself (and a step of f64 either side), where only the canonical sum can decide.
    #[test]
    fn fast_cosine_test_is_the_canonical_one() {
        let mut s = 7u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        };
        let mut matched = 0;
        let mut widest = 0.0f64;
        for &dim in &[2usize, 3, 7, 8, 9, 16, 63, 100, 384, 768, 1024] {
            for round in 0..200 {
                let a: Vec<f64> = (0..dim).map(|_| next() * 10.0).collect();
                let b: Vec<f64> = if round % 2 == 0 {
                    a.iter().map(|x| x + 0.01 * next()).collect()
                } else {
                    (0..dim).map(|_| next()).collect()
                };
                let (a32, b32): (Vec<f32>, Vec<f32>) = (
                    a.iter().map(|&x| x as f32).collect(),
                    b.iter().map(|&x| x as f32).collect(),
                );
                fn both<T: Coord>(a: &[T], b: &[T], e: f64) -> (bool, bool) {
                    let (na, nb) = (norm(a), norm(b));
                    (
                        cosine_within_fast(a, b, na, nb, e),
                        cosine_within(a, b, na, nb, e),
                    )
                }
                // At the canonical cosine of the pair (the f64 rows'), a step either side,
                // and at random.
                let at = 1.0 - cosine_dot(&a, &b) / (norm(&a) * norm(&b));
                // The fast distance is within its slack of the rule's.
                fn gap<T: Coord>(a: &[T], b: &[T]) -> f64 {
                    let (na, nb) = (norm(a), norm(b));
                    (cosine_distance_fast(a, b, na, nb) - cosine_distance(a, b, na, nb)).abs()
                }
                for g in [gap(&a, &b), gap(&a32, &b32)] {
                    assert!(g <= cosine_distance_slack(dim), "dim {dim}: {g}");
                    widest = widest.max(g / cosine_distance_slack(dim));
                }
                for e in [
                    at,
                    at * (1.0 + 1e-15),
                    at * (1.0 - 1e-15),
                    next().abs() * 2.0,
                ] {
                    for (fast, canonical) in [both(&a, &b, e), both(&a32, &b32, e)] {
                        assert_eq!(fast, canonical, "dim {dim} round {round} e {e}");
                        matched += fast as usize;
                    }
                }
            }
        }
        assert!(matched > 0);
        // The orders do differ: a test of the slack that could not fail would say nothing.
        assert!(widest > 0.0, "{widest}");
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

    /// `norms_into` gives `norm`'s bits for every row: 0-19 rows (whole eights and a
    /// remainder), 1-70 dimensions, f32 and f64, values over many magnitudes (where the
    /// order of the sum decides the last bits).
    #[test]
    fn norms_into_is_norm_row_by_row() {
        let mut s = 11u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 2f64.powi((s % 40) as i32 - 20)
        };
        for dim in [1usize, 2, 7, 8, 9, 33, 70] {
            for n in [0usize, 1, 7, 8, 9, 16, 19] {
                let x64: Vec<f64> = (0..n * dim).map(|_| next()).collect();
                let x32: Vec<f32> = x64.iter().map(|&v| v as f32).collect();
                let mut o64 = vec![f64::NAN; n];
                let mut o32 = vec![f64::NAN; n];
                norms_into(&x64, dim, &mut o64);
                norms_into(&x32, dim, &mut o32);
                for r in 0..n {
                    let (a, b) = (norm(&x64[r * dim..][..dim]), norm(&x32[r * dim..][..dim]));
                    assert_eq!(o64[r].to_bits(), a.to_bits(), "f64 {dim}-D row {r} of {n}");
                    assert_eq!(o32[r].to_bits(), b.to_bits(), "f32 {dim}-D row {r} of {n}");
                }
            }
        }
    }
}
