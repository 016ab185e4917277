//! A filter for vectors of low intrinsic dimension (many coordinates, few directions of
//! variance): each vector x maps to z(x) = (P(x - mu), |R(x - mu)|), its coordinates along
//! the sample's m principal directions (the rows of P, orthonormal) and the norm of what
//! they leave (R = I - P^T P). For any x, y:
//!
//!   |x - y|^2 = |P(x - y)|^2 + |R(x - y)|^2 >= |P(x - y)|^2 + (|R(x - mu)| - |R(y - mu)|)^2
//!             = |z(x) - z(y)|^2
//!
//! (Pythagoras, then the triangle inequality on R's part), so a Euclidean join of the
//! (m + 1)-dimensional z at eps holds every pair of the vectors within eps. Where the data
//! lie near an m-dimensional subspace the bound is nearly tight: the low-dimensional join
//! (grids and EGO prune well there) returns little more than the answer. The caller
//! confirms every candidate by its exact rule, so the filter only has to keep every pair
//! within eps, which [`Projection::eps`]'s margins make sure of under rounding.
//!
//! Whether it is worth it is measured, not guessed: on a sample, the pairs the bound keeps
//! are counted against the pairs truly within eps, for m = 4 and 8.

use crate::control::Control;
use crate::metric::Coord;
use rayon::prelude::*;

/// Sample rows for the principal directions, and for counting pairs.
const SAMPLE: usize = 2048;
const PAIR_SAMPLE: usize = 1024;
/// Sample rows whose nearest neighbours set a kNN's scale ([`Projection::fit_knn`]).
const KNN_SAMPLE: usize = 512;
/// Principal directions found (the subspace iterated: the top ones converge faster with
/// more; at most 8 are kept).
const MAX_M: usize = 16;
/// Below this many vectors or dimensions, the joins of the raw vectors are already cheap.
const MIN_POINTS: usize = 4096;
const MIN_DIM: usize = 32;
/// Above this many dimensions the sample's covariance (dim^2 floats: 64 MiB here) would
/// cost more than the filter saves.
const MAX_DIM: usize = 4096;
/// Subspace iterations: the bound holds for any orthonormal directions, so a few suffice.
const ITERATIONS: usize = 4;

/// The principal directions kept and what the sample measured.
pub(crate) struct Projection {
    dim: usize,
    /// Directions kept (z has m + 1 coordinates).
    pub(crate) m: usize,
    mean: Vec<f64>,
    /// m orthonormal rows of `dim`.
    basis: Vec<f64>,
    /// The share of the sample's variance along the m directions.
    pub(crate) share: f64,
    /// Sample pairs within eps, and those the bound kept, of `sampled`.
    pub(crate) within: u64,
    pub(crate) kept: u64,
    pub(crate) sampled: u64,
    /// Leaders at eps among all the sample's rows over those among every other one: near 1
    /// for clusters, near 2 where each row's neighbourhood is its own.
    pub(crate) growth: f64,
}

/// Rows `step`-spaced through `x` (at most `count`), as f64.
fn sample<T: Coord>(x: &[T], dim: usize, count: usize) -> Vec<f64> {
    let n = x.len() / dim;
    let step = n.div_ceil(count).max(1);
    (0..n)
        .step_by(step)
        .flat_map(|i| x[i * dim..(i + 1) * dim].iter().map(|v| v.to_f64()))
        .collect()
}

/// f64 products summed over eight lanes (the cosine rule's shortcut; any order will do).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    crate::metric::dot_lanes(a, b)
}

fn dot32(a: &[f32], b: &[f32]) -> f32 {
    crate::cpu::partition::dot(a, b)
}

fn dist2(a: &[f64], b: &[f64]) -> f64 {
    let mut s = [0.0f64; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| (x - y) * (x - y))
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..4 {
            s[l] += (x[l] - y[l]) * (x[l] - y[l]);
        }
    }
    s[0] + s[1] + s[2] + s[3] + tail
}

/// Orthonormalises the `m` rows of `v` (each `dim` long), modified Gram-Schmidt twice.
fn orthonormalise(v: &mut [f64], dim: usize) {
    let m = v.len() / dim;
    for _ in 0..2 {
        for i in 0..m {
            let (done, rest) = v.split_at_mut(i * dim);
            let row = &mut rest[..dim];
            for j in 0..i {
                let q = &done[j * dim..(j + 1) * dim];
                let c = dot(row, q);
                row.iter_mut().zip(q).for_each(|(r, &q)| *r -= c * q);
            }
            let norm = dot(row, row).sqrt();
            if norm > 0.0 {
                row.iter_mut().for_each(|r| *r /= norm);
            }
        }
    }
}

/// The eigenvalues and eigenvectors (columns of the returned row-major matrix) of the
/// symmetric `m` x `m` matrix `h`, by cyclic Jacobi rotations.
fn jacobi(mut h: Vec<f64>, m: usize) -> (Vec<f64>, Vec<f64>) {
    let mut w = vec![0.0f64; m * m];
    (0..m).for_each(|i| w[i * m + i] = 1.0);
    for _ in 0..64 {
        let off: f64 = (0..m)
            .flat_map(|i| (0..m).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| h[i * m + j] * h[i * m + j])
            .sum();
        let diag: f64 = (0..m).map(|i| h[i * m + i] * h[i * m + i]).sum();
        if off <= 1e-30 * diag.max(f64::MIN_POSITIVE) {
            break;
        }
        for p in 0..m {
            for q in p + 1..m {
                let apq = h[p * m + q];
                if apq == 0.0 {
                    continue;
                }
                let theta = (h[q * m + q] - h[p * m + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..m {
                    let (hkp, hkq) = (h[k * m + p], h[k * m + q]);
                    h[k * m + p] = c * hkp - s * hkq;
                    h[k * m + q] = s * hkp + c * hkq;
                }
                for k in 0..m {
                    let (hpk, hqk) = (h[p * m + k], h[q * m + k]);
                    h[p * m + k] = c * hpk - s * hqk;
                    h[q * m + k] = s * hpk + c * hqk;
                }
                for k in 0..m {
                    let (wkp, wkq) = (w[k * m + p], w[k * m + q]);
                    w[k * m + p] = c * wkp - s * wkq;
                    w[k * m + q] = s * wkp + c * wkq;
                }
            }
        }
    }
    ((0..m).map(|i| h[i * m + i]).collect(), w)
}

impl Projection {
    /// The principal directions of a sample of `a` (and `b`), and the smallest m whose
    /// bound keeps few sample pairs beyond those within `eps` (Euclidean, on these rows):
    /// at most 1.25 times those plus 1/16384 of the pairs. None where no m does (clusters
    /// spread over many directions, uniform data), or the data are small.
    pub(crate) fn fit<T: Coord>(a: &[T], b: Option<&[T]>, dim: usize, eps: f64) -> Option<Self> {
        let n = (a.len() + b.map_or(0, |b| b.len())) / dim.max(1);
        if !(MIN_DIM..=MAX_DIM).contains(&dim) || n < MIN_POINTS {
            return None;
        }
        let parts = [Some(a), b].into_iter().flatten().collect::<Vec<_>>();
        let s: Vec<f64> = parts
            .iter()
            .flat_map(|x| {
                sample(
                    x,
                    dim,
                    (1usize << 19).div_ceil(dim).clamp(256, SAMPLE) / parts.len(),
                )
            })
            .collect();
        let rows = s.len() / dim;
        let mut mean = vec![0.0f64; dim];
        s.chunks_exact(dim)
            .for_each(|r| mean.iter_mut().zip(r).for_each(|(m, &v)| *m += v));
        mean.iter_mut().for_each(|m| *m /= rows as f64);
        // The centred sample by coordinate, then its covariance (dim x dim, symmetric), in
        // f32: the directions need not be exact (the bound holds for any orthonormal ones,
        // made orthonormal in f64 below), only cheap to find.
        let mut cols = vec![0.0f32; dim * rows];
        for (i, r) in s.chunks_exact(dim).enumerate() {
            for (c, (&v, &m)) in r.iter().zip(&mean).enumerate() {
                cols[c * rows + i] = (v - m) as f32;
            }
        }
        let mut cov = vec![0.0f32; dim * dim];
        cov.par_chunks_mut(dim).enumerate().for_each(|(i, row)| {
            let ci = &cols[i * rows..(i + 1) * rows];
            for (j, out) in row.iter_mut().enumerate().skip(i) {
                *out = dot32(ci, &cols[j * rows..(j + 1) * rows]);
            }
        });
        for i in 0..dim {
            for j in 0..i {
                cov[i * dim + j] = cov[j * dim + i];
            }
        }
        let total: f64 = (0..dim).map(|i| cov[i * dim + i] as f64).sum();
        if total.is_nan() || total <= 0.0 {
            return None;
        }
        // The top MAX_M directions by subspace iteration from a fixed start (a simple
        // generator: the result depends only on the data), then Rayleigh-Ritz to order them.
        let big = MAX_M.min(dim / 4);
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut v: Vec<f64> = (0..big * dim)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
            })
            .collect();
        orthonormalise(&mut v, dim);
        let times = |v: &[f64]| -> Vec<f64> {
            let v32: Vec<f32> = v.iter().map(|&x| x as f32).collect();
            let mut out = vec![0.0f64; v.len()];
            out.par_chunks_mut(dim)
                .zip(v32.par_chunks(dim))
                .for_each(|(o, q)| {
                    o.iter_mut()
                        .enumerate()
                        .for_each(|(i, x)| *x = dot32(&cov[i * dim..(i + 1) * dim], q) as f64)
                });
            out
        };
        for _ in 0..ITERATIONS {
            v = times(&v);
            orthonormalise(&mut v, dim);
        }
        let cv = times(&v);
        let h: Vec<f64> = (0..big * big)
            .map(|k| dot(&v[(k / big) * dim..][..dim], &cv[(k % big) * dim..][..dim]))
            .collect();
        let (values, w) = jacobi(h, big);
        let mut order: Vec<usize> = (0..big).collect();
        order.sort_by(|&x, &y| values[y].total_cmp(&values[x]));
        let mut basis = vec![0.0f64; big * dim];
        for (r, &e) in order.iter().enumerate() {
            let out = &mut basis[r * dim..(r + 1) * dim];
            for (k, q) in v.chunks_exact(dim).enumerate() {
                let c = w[k * big + e];
                out.iter_mut().zip(q).for_each(|(o, &x)| *o += c * x);
            }
        }
        orthonormalise(&mut basis, dim);
        // Pairs of an even sample: kept by each m's bound, and within eps. The bound only
        // tightens as m grows (the reverse triangle inequality in the plane of the next
        // direction and the rest), so the pairs within eps are among those the largest m
        // keeps: only those take a whole distance.
        let ps: Vec<f64> = parts
            .iter()
            .flat_map(|x| sample(x, dim, PAIR_SAMPLE / parts.len()))
            .collect();
        let pn = ps.len() / dim;
        // Each sample row's coordinates along the directions and its centred norm^2.
        let coords: Vec<(Vec<f64>, f64)> = ps
            .par_chunks_exact(dim)
            .map(|r| {
                let c: Vec<f64> = r.iter().zip(&mean).map(|(v, m)| v - m).collect();
                let p = basis.chunks_exact(dim).map(|q| dot(q, &c)).collect();
                (p, dot(&c, &c))
            })
            .collect();
        // At most 8 directions: a join of 9 coordinates is fast (grids prune); at 17 it
        // is a high-dimensional join again (200k 64-D vectors in 5,000 clusters: 2.9 s in
        // 17 coordinates, where the grouped index took 1.1 s).
        let ms: Vec<usize> = [4, 8].into_iter().filter(|&m| m <= big).collect();
        let e2 = eps * eps;
        // For each pair, the largest m (index into ms, plus one) whose bound keeps it.
        let kept_to = |i: usize, j: usize| -> usize {
            let ((px, nx), (py, ny)) = (&coords[i], &coords[j]);
            let (mut along, mut kx, mut ky) = (0.0f64, *nx, *ny);
            let mut from = 0;
            for (k, &m) in ms.iter().enumerate() {
                for t in from..m {
                    along += (px[t] - py[t]) * (px[t] - py[t]);
                    kx -= px[t] * px[t];
                    ky -= py[t] * py[t];
                }
                from = m;
                let rest = kx.max(0.0).sqrt() - ky.max(0.0).sqrt();
                if along + rest * rest > e2 {
                    return k;
                }
            }
            ms.len()
        };
        let add = |a: Vec<u64>, b: Vec<u64>| a.iter().zip(&b).map(|(x, y)| x + y).collect();
        let counts: Vec<u64> = (0..pn)
            .into_par_iter()
            .map(|i| {
                let mut c = vec![0u64; ms.len() + 1];
                for j in i + 1..pn {
                    c[kept_to(i, j)] += 1;
                }
                c
            })
            .reduce(|| vec![0u64; ms.len() + 1], add);
        // kept[k]: pairs the bound at ms[k] keeps.
        let kept: Vec<u64> = (1..=ms.len()).map(|k| counts[k..].iter().sum()).collect();
        let sampled = (pn * pn.saturating_sub(1) / 2) as u64;
        // A filter keeping over 1/64 of all pairs is no better than the joins that follow.
        if kept.last().is_none_or(|&k| k > sampled / 64) {
            return None;
        }
        // The sample's pairs within eps (few: at most those the bound kept).
        let (all, rows_of) = (ms.len(), &ps);
        let kept_to = &kept_to;
        let near: Vec<(u32, u32)> = (0..pn)
            .into_par_iter()
            .flat_map_iter(|i| {
                (i + 1..pn)
                    .filter(move |&j| {
                        kept_to(i, j) == all
                            && dist2(
                                &rows_of[i * dim..(i + 1) * dim],
                                &rows_of[j * dim..(j + 1) * dim],
                            ) <= e2
                    })
                    .map(move |j| (i as u32, j as u32))
            })
            .collect();
        let within = near.len() as u64;
        // Leaders at eps (each row farther than eps from every earlier leader leads), among
        // every other sample row and among all: the grouped index suits data whose count
        // stops growing with the sample (clusters), not data whose eps-balls keep finding
        // new ground (a low-dimensional manifold, near-duplicates).
        let leaders = |stride: usize| -> usize {
            let mut adj = vec![vec![]; pn];
            for &(i, j) in &near {
                adj[j as usize].push(i as usize);
            }
            let mut lead = vec![false; pn];
            for i in (0..pn).step_by(stride) {
                lead[i] = !adj[i].iter().any(|&j| lead[j]);
            }
            lead.iter().filter(|&&l| l).count()
        };
        let growth = leaders(1) as f64 / leaders(2).max(1) as f64;
        // Nearly tight: the low-dimensional join then returns little beyond the answer.
        let allowed = within + within / 4 + sampled / 16384;
        let (k, &m) = ms.iter().enumerate().find(|&(k, _)| kept[k] <= allowed)?;
        basis.truncate(m * dim);
        let share = order[..m].iter().map(|&e| values[e]).sum::<f64>() / total;
        Some(Projection {
            dim,
            m,
            mean,
            basis,
            share,
            within,
            kept: kept[k],
            sampled,
            growth,
        })
    }

    /// [`Projection::fit`] at the scale of a kNN's answers (unit vectors `a`, queries
    /// `b`): eps is the median distance from a sample row of `a` to its nearest other
    /// sample row (about the distance of the (n / sample)-th nearest in all of `a`).
    pub(crate) fn fit_knn<T: Coord>(a: &[T], b: Option<&[T]>, dim: usize) -> Option<Self> {
        if !(MIN_DIM..=MAX_DIM).contains(&dim) || a.len() / dim < MIN_POINTS {
            return None;
        }
        let s: Vec<f32> = sample(a, dim, KNN_SAMPLE)
            .into_iter()
            .map(|v| v as f32)
            .collect();
        let rows: Vec<&[f32]> = s.chunks_exact(dim).collect();
        let sq: Vec<f32> = rows.iter().map(|r| dot32(r, r)).collect();
        let mut nearest: Vec<f32> = (0..rows.len())
            .into_par_iter()
            .map(|i| {
                (0..rows.len())
                    .filter(|&j| j != i)
                    .map(|j| sq[i] + sq[j] - 2.0 * dot32(rows[i], rows[j]))
                    .fold(f32::INFINITY, f32::min)
            })
            .collect();
        nearest.sort_by(f32::total_cmp);
        let eps = (nearest[nearest.len() / 2].max(0.0) as f64).sqrt();
        // Mostly duplicates: no scale to fit at (the other paths handle them).
        (eps > 1e-6).then(|| Self::fit(a, b, dim, eps)).flatten()
    }

    /// The rows of `x` as z: m coordinates along the directions and the norm left, f32;
    /// None once `control` stops (checked every few thousand rows).
    pub(crate) fn apply<T: Coord>(&self, x: &[T], control: &Control) -> Option<Vec<f32>> {
        let (dim, w) = (self.dim, self.m + 1);
        let mut out = vec![0.0f32; x.len() / dim * w];
        const ROWS: usize = 4096;
        out.par_chunks_mut(ROWS * w)
            .zip(x.par_chunks(ROWS * dim))
            .for_each(|(zs, rs)| {
                if control.is_cancelled() {
                    return;
                }
                for (z, r) in zs.chunks_exact_mut(w).zip(rs.chunks_exact(dim)) {
                    let c: Vec<f64> = r
                        .iter()
                        .zip(&self.mean)
                        .map(|(v, m)| v.to_f64() - m)
                        .collect();
                    let mut left = dot(&c, &c);
                    for (o, q) in z.iter_mut().zip(self.basis.chunks_exact(dim)) {
                        let p = dot(q, &c);
                        left -= p * p;
                        *o = p as f32;
                    }
                    z[self.m] = left.max(0.0).sqrt() as f32;
                }
            });
        control.check().ok()?;
        Some(out)
    }

    /// The eps for the join of z that keeps every pair of the rows within `eps`. The bound
    /// holds in real arithmetic for orthonormal directions (these are, to about 1e-15).
    /// For a row c = x - mu, the f64 sums put each coordinate within dim 2^-53 |c| of its
    /// value and the norm left (|c|^2 less the coordinates' squares, dim + m terms) within
    /// sqrt((dim + m) 2^-52) |c|; rounding to f32 moves z by at most 2^-24 |z| <= 2^-24 |c|.
    /// Two rows, |c| <= 1 + |mu| for unit vectors: the margin below covers both twice over,
    /// and the relative 1e-5 the join's own rounding of an (m + 1)-term sum.
    pub(crate) fn eps(&self, eps: f64) -> f64 {
        (eps + self.margin()) * (1.0 + 1e-5)
    }

    /// [`Projection::eps`]'s inverse, for a kNN of the z: rows whose z are `d` apart as the
    /// Euclidean rule computes it (a join's or a kNN's) are at least this far apart (if
    /// they were at most e apart, their z would be at most `eps(e)` apart).
    pub(crate) fn apart(&self, d: f64) -> f64 {
        d / (1.0 + 1e-5) - self.margin()
    }

    /// The additive part of [`Projection::eps`]'s margin.
    fn margin(&self) -> f64 {
        let scale = self.mean.iter().map(|m| m * m).sum::<f64>().sqrt() + 1.0;
        let u = f64::EPSILON / 2.0;
        let per_row = ((self.dim + self.m + 2) as f64 * 2.0 * u).sqrt() + 2f64.powi(-23);
        4.0 * per_row * scale
    }
}
