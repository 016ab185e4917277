//! Cosine joins (`Metric::Cosine`) on every backend: the vectors are normalised (a copy,
//! in the input precision), joined under Euclidean distance at an eps widened to cover
//! every rounding, and each candidate pair is confirmed by cosine's written rule
//! (`metric::cosine_within`, through `cosine_within_fast`'s proven shortcut), so the
//! answer is the rule's set whichever backend and algorithm found the candidates. (The
//! grouped join skips the confirmation where its own f32 product proves the rule accepts:
//! [`sure_dot`].)
//!
//! Why the widened Euclidean join finds every pair: for unit vectors u, v,
//! |u - v|^2 = 2 - 2 cos. A pair the rule accepts (f64 sums of at most D + 1 roundings
//! each, Cauchy-Schwarz bounding the dot's error by (D + 1) u64 |a| |b|) has a real
//! cosine of at least 1 - e - delta, delta = (2D + 16) u64 (1 + |1 - e|), so
//! |u - v| <= sqrt(2e + 2 delta). The copies are u and v rounded to T (each coordinate
//! within u_T relative, or within T's smallest normal where it underflows): at most
//! 2 (u_T |u| + sqrt(D) min_T) apart from them. The Euclidean kernel's squared distance
//! in T is within (D + 4) u_T of the copies' real one, and eps' rounded to T and squared
//! loses at most 3 u_T. `widened_eps` covers all of it with room to spare.

//! The files: `join.rs` the joins (the Euclidean pass, the projection, the grouped join),
//! `knn.rs` the kNN's entry and its shared ranking, `knn_grouped.rs` its search through the
//! grouped index, `knn_brute.rs` every query against every row (few queries). This file:
//! the rule's bounds that every path shares, and the normalised copies.

mod join;
mod knn;
mod knn_brute;
mod knn_grouped;

pub(crate) use join::run;
pub(crate) use knn::knn;

use crate::dataset::{Coords, Dataset};
use crate::engine::Engine;
use crate::error::Result;
use crate::metric::{
    check_norm, cosine_accept, cosine_dots, cosine_verdict_fast, norms_into, threshold, Coord,
    COSINE_LANES,
};
use crate::options::{JoinOptions, Metric};
use crate::result::{Confirm, JoinReport, Pair, PairSink};
use rayon::prelude::*;

/// The Euclidean eps under which the normalised copies in precision `T` hold every pair
/// whose cosine rule accepts `e` (see the module's proof).
fn widened_eps<T: Coord>(e: f64, dim: usize) -> f64 {
    let d = dim as f64;
    let u64_ = f64::EPSILON / 2.0;
    let delta = (2.0 * d + 16.0) * u64_ * (1.0 + (1.0 - e).abs());
    let slack = 4.0 * T::UNIT_ROUNDOFF + 2.0 * d.sqrt() * min_normal::<T>();
    ((2.0 * e + 2.0 * delta).max(0.0).sqrt() + slack) * (1.0 + (d + 8.0) * T::UNIT_ROUNDOFF)
}

/// The f32 dot product of two rows' f32 copies (normalised in f64, rounded to `T`, then to
/// f32) at or above which the cosine rule accepts the pair at `e` for certain, where
/// `slack` bounds the product's error as it does the join's floor (`partition::dot_slack`
/// for f32 tiles, `dot_slack_f16` for the matrix units'). A grouped join passes such pairs
/// on unconfirmed: on clustered data nearly all of them (the band between floor and this
/// is a few `slack`s wide), where the confirmation read both rows again in f64.
///
/// Why: with u = a / |a|, v = b / |b| and c = u.v the real cosine, each copy's coordinate
/// is u_i within rho |u_i| + 2^-126 (rho = 2 u_f32 + (D + 4) u64: the norm's and the
/// quotient's f64 roundings, one to `T`, one to f32; 2^-126 where f32 underflows or a
/// device flushes), so the copies' real dot product is within 2 rho + rho^2 (+ terms of
/// 2^-126) of c, and their f32 product (any order) within (D + 2) u_f32 |p| |q| of theirs:
/// together under `dot_slack`'s 4 (D + 4) u_f32. So c >= d - slack. The rule accepts
/// where c >= 1 - e + delta (the module's delta, the other way round: the f64 dot product
/// is within (D + 1) u64 |a| |b| of the real one, and the threshold (1 - e) na nb within
/// (2D + 8) u64 |1 - e| |a| |b| of (1 - e) |a| |b|). The sum is rounded up to f32 after a
/// margin for its own f64 roundings.
pub(crate) fn sure_dot(e: f64, dim: usize, slack: f64) -> f32 {
    let d = dim as f64;
    let u64_ = f64::EPSILON / 2.0;
    let delta = (2.0 * d + 16.0) * u64_ * (1.0 + (1.0 - e).abs());
    let tiny = 8.0 * (d + 4.0) * 2f64.powi(-126);
    let at = (1.0 - e) + delta + slack + tiny + 1e-14;
    let f = at as f32;
    if (f as f64) < at {
        f.next_up()
    } else {
        f
    }
}

/// Each row's norm under the cosine rule, checked (zero or unsquarable norms are errors).
fn norms<T: Coord>(x: &[T], dim: usize) -> Result<Vec<f64>> {
    // In runs of rows, eight at a time (`metric::norms_into`: `norm`'s bits, faster).
    const RUN: usize = 512;
    let mut out = vec![0.0f64; x.len() / dim];
    out.par_chunks_mut(RUN)
        .zip(x.par_chunks(RUN * dim))
        .for_each(|(o, rows)| norms_into(rows, dim, o));
    if let Some((row, &n)) = out
        .iter()
        .enumerate()
        .find(|(_, n)| !(**n * **n).is_normal() || !n.is_normal())
    {
        check_norm(n, row)?;
    }
    Ok(out)
}

/// The rows divided by their norms (in f64), rounded to `T`.
fn normalised<T: Coord>(x: &[T], dim: usize, norms: &[f64]) -> Vec<T> {
    let mut out = vec![T::ZERO; x.len()];
    out.par_chunks_mut(dim)
        .zip(x.par_chunks(dim).zip(norms))
        .for_each(|(o, (row, &n))| divide_row(row, n, o, unit));
    out
}

/// A coordinate of a row of norm `n` in the normalised copies ([`normalised`]): divided
/// in f64, rounded to `T`.
#[inline]
fn unit<T: Coord>(v: T, n: f64) -> T {
    T::from_f64(v.to_f64() / n)
}

/// The same coordinate in the f32 copies ([`as_f32`] of [`normalised`]), made without the
/// copy in `T`: the same bits.
#[inline]
fn unit_f32<T: Coord>(v: T, n: f64) -> f32 {
    unit(v, n).to_f64() as f32
}

/// Whether the CPU has AVX2 (and `SIMJOIN_NO_AVX2` is unset), looked up once:
/// `cpu::avx2_available` reads the environment, under a lock, each call.
fn avx2() -> bool {
    static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX2.get_or_init(crate::cpu::avx2_available)
}

/// `out[i] = f(row[i], n)` for a row of norm `n`: [`unit`] or [`unit_f32`] of each
/// coordinate, with AVX2 where the CPU has it (four f64 divisions an instruction, not two).
/// Divisions and conversions round correctly on every instruction set and nothing is
/// fused, so the bits are the same either way.
fn divide_row<T: Coord, O>(row: &[T], n: f64, out: &mut [O], f: impl Fn(T, f64) -> O) {
    #[inline(always)]
    fn each<T: Coord, O>(row: &[T], n: f64, out: &mut [O], f: impl Fn(T, f64) -> O) {
        for (o, &v) in out.iter_mut().zip(row) {
            *o = f(v, n);
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn each_avx2<T: Coord, O>(row: &[T], n: f64, out: &mut [O], f: impl Fn(T, f64) -> O) {
        each(row, n, out, f)
    }
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU has AVX2 (checked just above), the only requirement of a
        // function that enables it; the body is safe code.
        return unsafe { each_avx2(row, n, out, f) };
    }
    each(row, n, out, f)
}

/// The f32 unit copies ([`unit_f32`]) of rows `span` of `x` (`dim` wide, norms `norms`),
/// their first `width` coordinates each, one row after the other: a part of
/// [`as_f32`] of [`normalised`] made without the rest.
fn unit_rows_f32<T: Coord>(
    x: &[T],
    norms: &[f64],
    dim: usize,
    span: std::ops::Range<usize>,
    width: usize,
) -> Vec<f32> {
    let mut out = vec![0.0f32; span.len() * width];
    let rows = x[span.start * dim..span.end * dim].chunks_exact(dim);
    for ((o, r), &n) in out.chunks_exact_mut(width).zip(rows).zip(&norms[span]) {
        divide_row(&r[..width], n, o, unit_f32);
    }
    out
}

/// `x` in f32 for the grouped index and join: borrowed where `T` is f32 already (the
/// normalised copies), converted otherwise.
fn as_f32<T: Coord>(x: &[T]) -> std::borrow::Cow<'_, [f32]> {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(x))
    } else {
        x.par_iter()
            .map(|v| v.to_f64() as f32)
            .collect::<Vec<f32>>()
            .into()
    }
}

/// `sink` lent for a shorter while (`as_deref_mut` cannot shorten the trait object's
/// lifetime inside the Option).
fn reborrow<'s>(sink: &'s mut Option<&mut dyn PairSink>) -> Option<&'s mut dyn PairSink> {
    sink.as_mut().map(|s| &mut **s as &mut dyn PairSink)
}

/// Norms of `a` (and `b`), checked, and the normalised copies, on the engine's threads
/// (`copies`: of `a`, of `b`; an empty one where not asked).
type Prepared<T> = (Vec<f64>, Option<Vec<f64>>, Vec<T>, Option<Vec<T>>);
fn prepare<T: Coord>(
    engine: &Engine,
    a: &[T],
    b: Option<&[T]>,
    dim: usize,
    copies: (bool, bool),
) -> Result<Prepared<T>> {
    engine.install(|| -> Result<_> {
        let na = norms(a, dim)?;
        let nb = b.map(|b| norms(b, dim)).transpose()?;
        let copy = |x: &[T], n: &[f64], asked: bool| match asked {
            true => normalised(x, dim, n),
            false => Vec::new(),
        };
        let ca = copy(a, &na, copies.0);
        let cb = b.zip(nb.as_ref()).map(|(b, nb)| copy(b, nb, copies.1));
        Ok((na, nb, ca, cb))
    })?
}

/// The cosine rule over the original rows and their norms.
struct Rule<'a, T> {
    a: &'a [T],
    b: &'a [T],
    dim: usize,
    na: &'a [f64],
    nb: &'a [f64],
    e: f64,
}

impl<T: Coord> Rule<'_, T> {
    /// Pair `[i, j]`'s rows.
    fn rows(&self, [i, j]: Pair) -> (&[T], &[T]) {
        let (i, j, d) = (i as usize, j as usize, self.dim);
        (&self.a[i * d..(i + 1) * d], &self.b[j * d..(j + 1) * d])
    }

    /// The pairs of `chunk` the rule accepts, in order: [`cosine_within_fast`]'s answer,
    /// the pairs its vectorised sum leaves open taking the canonical sum
    /// [`COSINE_LANES`] at a time (ties and near-copies: every pair of a set of collinear
    /// rows at a small eps, or of rows on a lattice at one of its distances).
    fn keep(&self, chunk: &[Pair]) -> Vec<Pair> {
        let norms = |[i, j]: Pair| (self.na[i as usize], self.nb[j as usize]);
        let mut verdict: Vec<Option<bool>> = chunk
            .iter()
            .map(|&p| {
                let ((a, b), (na, nb)) = (self.rows(p), norms(p));
                cosine_verdict_fast(a, b, na, nb, self.e)
            })
            .collect();
        let open: Vec<usize> = (0..chunk.len()).filter(|&t| verdict[t].is_none()).collect();
        for lanes in open.chunks(COSINE_LANES) {
            // A short last group repeats its last pair.
            let at = |l: usize| lanes[l.min(lanes.len() - 1)];
            let dots =
                cosine_dots::<T, COSINE_LANES>(std::array::from_fn(|l| self.rows(chunk[at(l)])));
            for (l, &t) in lanes.iter().enumerate() {
                let (na, nb) = norms(chunk[t]);
                verdict[t] = Some(cosine_accept(dots[l], na, nb, self.e));
            }
        }
        chunk
            .iter()
            .zip(verdict)
            .filter_map(|(&p, v)| v.unwrap_or(false).then_some(p))
            .collect()
    }
}

/// Where the sample's leaders at eps grow by at least this much from half the sample to
/// all of it, the projection runs before the grouped index (which would need about a
/// leader a neighbourhood): 1 for clusters, 2 where no two rows share one. Measured
/// (2 threads, 2026-11-28): 200 clusters at 128-D (growth 1.09) took 1.1 s grouped, 2.9 s
/// projected; 8-D structure in 384-D (growth 1.41-1.76 at eps 0.2-0.1) 0.25-0.68 s
/// projected, 2.3-2.7 s grouped.
const PROJECTION_FIRST: f64 = 1.25;

/// T's smallest normal number (the bound on a coordinate's error where rounding to T
/// underflows).
fn min_normal<T: Coord>() -> f64 {
    if T::UNIT_ROUNDOFF > 1e-10 {
        f32::MIN_POSITIVE as f64
    } else {
        f64::MIN_POSITIVE
    }
}

/// A dataset over rows of `T` (f32 or f64).
pub(crate) trait FromRows<'x, T> {
    fn from_rows(x: &'x [T], dim: usize) -> Result<Dataset<'x>>;
}
impl<'x> FromRows<'x, f32> for Dataset<'x> {
    fn from_rows(x: &'x [f32], dim: usize) -> Result<Dataset<'x>> {
        Dataset::from_f32(x, dim)
    }
}
impl<'x> FromRows<'x, f64> for Dataset<'x> {
    fn from_rows(x: &'x [f64], dim: usize) -> Result<Dataset<'x>> {
        Dataset::from_f64(x, dim)
    }
}

#[cfg(test)]
mod tests {
    use super::knn::{rule_floor, rule_reach, up_to};
    use super::*;

    /// A row's f32 copy as the grouped join makes it ([`normalised`], then [`as_f32`]).
    fn f32_copy<T: Coord>(x: &[T], n: f64) -> Vec<f32> {
        as_f32(&normalised(x, x.len(), &[n])).into_owned()
    }

    /// The uncertain rows' join route, each query's list cut to its k nearest every 64 + k
    /// candidates while the join runs: 1,200 scalar multiples of one direction among 1,500
    /// rows (a third of them negative), each of them uncertain and meeting hundreds of
    /// candidates. The kNN equals the oracle's in indices and distance bits, f64 and f32,
    /// self and with queries.
    #[test]
    fn uncertain_rows_by_a_join_with_lists_cut_are_exact() {
        fn check<T: Coord>(x: &[T], data: &Dataset, query: bool, k: usize)
        where
            for<'x> Dataset<'x>: FromRows<'x, T>,
        {
            let dim = data.dim();
            let opts = crate::knn::KnnOptions {
                metric: Metric::Cosine,
                backend: crate::options::Backend::Cpu,
                ..Default::default()
            };
            let join = super::knn::Uncertain {
                brute_work: 0.0,
                held_pairs: 64,
            };
            let q = query.then_some(x);
            let got = super::knn::knn_search(&Engine::new(), x, q, dim, k, &opts, &join).unwrap();
            let (idx, dist) = crate::oracle::knn(data, query.then_some(data), k, Metric::Cosine);
            assert_eq!(got.indices, idx, "k {k} query {query}");
            let d: Vec<f64> = (0..got.rows)
                .flat_map(|r| (0..k).map(move |c| (r, c)))
                .map(|(r, c)| got.distance(r, c))
                .collect();
            assert_eq!(d, dist, "k {k} query {query}");
            let notes = got.report.notes.join("; ");
            let at = notes.find(" rows joined at eps").expect(&notes);
            let joined: usize = notes[..at].rsplit(' ').next().unwrap().parse().unwrap();
            assert!(joined >= 1000, "{notes}");
        }
        let dim = 6;
        let mut next = uniform(3);
        let base: Vec<f64> = (0..dim).map(|_| next()).collect();
        let mut x = Vec::new();
        for i in 0..1500 {
            if i % 5 == 0 {
                x.extend((0..dim).map(|_| next()));
            } else {
                let f = (0.25 + i as f64 / 1000.0) * if i % 3 == 0 { -1.0 } else { 1.0 };
                x.extend(base.iter().map(|v| v * f));
            }
        }
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let (d64, d32) = (
            Dataset::from_f64(&x, dim).unwrap(),
            Dataset::from_f32(&x32, dim).unwrap(),
        );
        for (query, k) in [(false, 1), (false, 10), (true, 10)] {
            check(&x, &d64, query, k);
            check(&x32, &d32, query, k);
        }
    }

    /// Values in [-0.5, 0.5) from a seeded linear congruential generator.
    fn uniform(mut s: u64) -> impl FnMut() -> f64 {
        move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        }
    }

    /// The grouped kNN's chain of bounds (an f32 dot product of the f32 copies, `dist_floor`,
    /// `rule_floor`) never exceeds the rule's computed distance: pairs from identical to
    /// far apart, scalar multiples, f32 and f64 rows, 16 to 384 dimensions.
    #[test]
    fn grouped_knn_bounds_stay_below_the_rule() {
        use crate::cpu::partition::{dist_floor, dot, dot_slack};
        use crate::metric::{cosine_distance, norm};
        fn check<T: Coord>(a: &[T], b: &[T]) -> bool {
            let dim = a.len();
            let (na, nb) = (norm(a), norm(b));
            let (ca, cb) = (f32_copy(a, na), f32_copy(b, nb));
            let apart = dist_floor(dot(&ca, &cb), dot_slack(dim));
            let bound = rule_floor(
                apart,
                dim,
                f32::EPSILON as f64 / 2.0,
                f32::MIN_POSITIVE as f64,
            );
            let rule = cosine_distance(a, b, na, nb);
            assert!(bound <= rule, "{dim}-D: bound {bound} > rule {rule}");
            bound > f64::NEG_INFINITY
        }
        let mut rnd = uniform(7);
        let mut proved = 0;
        for dim in [16usize, 64, 384] {
            for t in 0..3000 {
                let a: Vec<f64> = (0..dim).map(|_| rnd()).collect();
                let step = [0.0, 1e-9, 1e-6, 1e-4, 1e-2, 0.1, 1.0, 10.0][t % 8];
                let f = [1.0, 0.5, 3.0][t % 3];
                let b: Vec<f64> = a.iter().map(|v| (v + step * rnd()) * f).collect();
                let (a32, b32): (Vec<f32>, Vec<f32>) = (
                    a.iter().map(|&v| v as f32).collect(),
                    b.iter().map(|&v| v as f32).collect(),
                );
                proved += usize::from(check(&a, &b)) + usize::from(check(&a32, &b32));
            }
        }
        // The bound proves something for most pairs (the far ones), not only -inf.
        assert!(proved > 6000, "{proved}");
    }

    /// A pair whose copies' f32 dot product (by `partition::dot`, a plain sum either way
    /// round) reaches `sure_dot` is one the rule accepts: pairs placed within a few f32
    /// rounding errors of the threshold on either side, f32 and f64 rows of norms 1e-3 to
    /// 1e3, 2 to 1024 dimensions. The data must hold pairs the rule rejects whose product
    /// reaches 1 - e itself (a bound without the slack would take them), and `sure_dot`
    /// must stay within a slack of 1 - e (or it would take nothing).
    #[test]
    fn sure_dot_admits_only_pairs_the_rule_accepts() {
        use crate::cpu::partition::{dot, dot_slack};
        use crate::metric::{cosine_within, norm};
        let mut rnd = uniform(11);
        // (sure, rejected by the rule though the product reached 1 - e)
        let mut seen = (0usize, 0usize);
        fn check<T: Coord>(a: &[T], b: &[T], e: f64, seen: &mut (usize, usize)) {
            let dim = a.len();
            let (na, nb) = (norm(a), norm(b));
            let (ca, cb) = (f32_copy(a, na), f32_copy(b, nb));
            let sure = sure_dot(e, dim, dot_slack(dim));
            let accepts = cosine_within(a, b, na, nb, e);
            let forward = ca.iter().zip(&cb).fold(0.0f32, |s, (x, y)| s + x * y);
            let backward = ca.iter().zip(&cb).rev().fold(0.0f32, |s, (x, y)| s + x * y);
            for d in [dot(&ca, &cb), forward, backward] {
                if d >= sure {
                    assert!(
                        accepts,
                        "{dim}-D, e {e}: product {d} >= {sure}, rule rejects"
                    );
                    seen.0 += 1;
                }
                if !accepts && d as f64 >= 1.0 - e {
                    seen.1 += 1;
                }
            }
        }
        for dim in [2usize, 16, 64, 384, 1024] {
            let ulps = (dim as f64 + 4.0) * f32::EPSILON as f64 / 2.0;
            for e in [1e-3f32, 0.01, 0.1, 0.5] {
                let e = e as f64;
                let slack = dot_slack(dim);
                let sure = sure_dot(e, dim, slack) as f64;
                assert!(
                    sure > 1.0 - e && sure - (1.0 - e) < slack * 1.01 + 1e-7,
                    "{sure}"
                );
                for t in 0..400 {
                    // u, and w orthogonal to it, unit; b at cosine 1 - e + off from a.
                    let u: Vec<f64> = (0..dim).map(|_| rnd()).collect();
                    let nu = u.iter().map(|v| v * v).sum::<f64>().sqrt();
                    let u: Vec<f64> = u.iter().map(|v| v / nu).collect();
                    let mut w: Vec<f64> = (0..dim).map(|_| rnd()).collect();
                    let along: f64 = w.iter().zip(&u).map(|(x, y)| x * y).sum();
                    w.iter_mut().zip(&u).for_each(|(x, y)| *x -= along * y);
                    let nw = w.iter().map(|v| v * v).sum::<f64>().sqrt();
                    let off = [-4.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0][t % 9]
                        * ulps
                        * (1.0 + rnd());
                    let c = 1.0 - e + off;
                    let sin = (1.0 - c * c).max(0.0).sqrt();
                    let (fa, fb) = (10f64.powf(6.0 * rnd()), 10f64.powf(6.0 * rnd()));
                    let a: Vec<f64> = u.iter().map(|v| v * fa).collect();
                    let b: Vec<f64> = u
                        .iter()
                        .zip(&w)
                        .map(|(x, y)| (c * x + sin * y / nw) * fb)
                        .collect();
                    let (a32, b32): (Vec<f32>, Vec<f32>) = (
                        a.iter().map(|&v| v as f32).collect(),
                        b.iter().map(|&v| v as f32).collect(),
                    );
                    check(&a, &b, e, &mut seen);
                    check(&a32, &b32, e, &mut seen);
                }
            }
        }
        assert!(seen.0 > 2000 && seen.1 > 100, "{seen:?}");
    }

    /// `rule_reach` is at least the largest distance whose `rule_floor` is within the
    /// limit (found by bisection: the floor is non-decreasing), and hardly more (so the
    /// search's early rule-out has an effect), for f32 and f64 copies in 2-1024 dimensions.
    #[test]
    fn rule_reach_inverts_the_floor() {
        let mut next = uniform(17);
        for dim in [2usize, 16, 384, 1024] {
            for (u, min) in [
                (f32::EPSILON as f64 / 2.0, f32::MIN_POSITIVE as f64),
                (f64::EPSILON / 2.0, f64::MIN_POSITIVE),
            ] {
                for _ in 0..2000 {
                    // Limits from below zero (nothing ranked yet has a floor there) to 2.
                    let limit = 2.0 * next().powi(3) - 1e-3 * next();
                    let reach = rule_reach(limit, dim, u, min);
                    let (mut lo, mut hi) = (0.0f64, 4.0f64);
                    for _ in 0..200 {
                        let mid = (lo + hi) / 2.0;
                        match rule_floor(mid, dim, u, min) <= limit {
                            true => lo = mid,
                            false => hi = mid,
                        }
                    }
                    assert!(lo <= reach, "{dim}-D u {u:e} limit {limit}: {lo} > {reach}");
                    assert!(
                        reach <= lo * (1.0 + 1e-8) + 1e-11,
                        "{dim}-D: {reach} >> {lo}"
                    );
                    // Points beyond `reach` have floors above the limit.
                    let beyond = reach * (1.0 + 1e-15) + 1e-300;
                    assert!(rule_floor(beyond, dim, u, min) > limit, "{dim}-D {limit}");
                }
            }
        }
        assert_eq!(rule_reach(f64::INFINITY, 8, 1e-8, 0.0), f64::INFINITY);
    }

    /// `up_to` is the least value of T at or above e.
    #[test]
    fn up_to_rounds_up_to_the_precision() {
        for &e in &[1e-12, 0.1119809780682628, 0.25, 1.0 / 3.0, 1.9999999] {
            let (u32_, u64_) = (up_to::<f32>(e), up_to::<f64>(e));
            assert_eq!(u64_, e);
            assert_eq!(u32_ as f32 as f64, u32_);
            assert!(u32_ >= e);
            assert!(
                (f32::from_bits((u32_ as f32).to_bits() - 1) as f64) < e,
                "{e}"
            );
        }
    }

    #[test]
    fn widened_eps_covers_the_rule_and_is_close_to_it() {
        for dim in [2usize, 64, 1024] {
            for e in [1e-6, 0.01, 0.1, 0.5, 1.0, 1.9] {
                let w32 = widened_eps::<f32>(e, dim);
                let w64 = widened_eps::<f64>(e, dim);
                let exact = (2.0 * e).sqrt();
                assert!(w32 > exact && w64 > exact);
                assert!(w64 < exact * 1.0001 + 1e-12, "{w64} vs {exact}");
                assert!(w32 < exact * 1.001 + 1e-6, "{w32} vs {exact}");
            }
        }
    }
}
