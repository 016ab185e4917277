//! Brute-force reference joins: O(n·m), single-threaded, the canonical `metric::within`
//! per pair. Tests compare every backend's pair set with these, exactly.

use crate::dataset::{Coords, Dataset};
use crate::metric::{distance_acc, geo_chord2, geo_distance_m, geo_row, threshold, within, Coord};
use crate::options::Metric;
use crate::result::Pair;

fn self_pairs<T: Coord>(x: &[T], dim: usize, metric: Metric, eps: f64) -> Vec<Pair> {
    let thr: T = threshold(metric, eps);
    let n = x.len().checked_div(dim).unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..n {
        let a = &x[i * dim..(i + 1) * dim];
        for j in i + 1..n {
            if within(metric, a, &x[j * dim..(j + 1) * dim], thr) {
                out.push([i as u32, j as u32]);
            }
        }
    }
    out
}

fn ab_pairs<T: Coord>(a: &[T], b: &[T], dim: usize, metric: Metric, eps: f64) -> Vec<Pair> {
    let thr: T = threshold(metric, eps);
    let mut out = Vec::new();
    for (i, pa) in a.chunks_exact(dim).enumerate() {
        for (j, pb) in b.chunks_exact(dim).enumerate() {
            if within(metric, pa, pb, thr) {
                out.push([i as u32, j as u32]);
            }
        }
    }
    out
}

/// Unique pairs (i < j) of a self-join, sorted.
pub fn self_join(data: &Dataset, metric: Metric, eps: f64) -> Vec<Pair> {
    match data.coords() {
        Coords::F32(x) => self_pairs(x, data.dim(), metric, eps),
        Coords::F64(x) => self_pairs(x, data.dim(), metric, eps),
    }
}

/// Pairs (i in A, j in B), sorted. Both sets must have the same precision and dim.
pub fn join(a: &Dataset, b: &Dataset, metric: Metric, eps: f64) -> Vec<Pair> {
    assert_eq!(a.dim(), b.dim());
    match (a.coords(), b.coords()) {
        (Coords::F32(x), Coords::F32(y)) => ab_pairs(x, y, a.dim(), metric, eps),
        (Coords::F64(x), Coords::F64(y)) => ab_pairs(x, y, a.dim(), metric, eps),
        _ => panic!("oracle::join needs both sets in the same precision"),
    }
}

/// Brute-force kNN: for each query (each data point when `query` is None, itself
/// excluded), the k nearest data points by (accumulator, index) as `knn.rs` defines, with
/// their reported distances widened to f64. Row-major `rows x k`. Cosine ranks by the
/// rule's f64 distance (`metric::cosine_distance`).
pub fn knn(
    data: &Dataset,
    query: Option<&Dataset>,
    k: usize,
    metric: Metric,
) -> (Vec<u32>, Vec<f64>) {
    fn rows<T: crate::metric::Coord>(
        x: &[T],
        q: Option<&[T]>,
        dim: usize,
        k: usize,
        metric: Metric,
    ) -> (Vec<u32>, Vec<f64>) {
        let qs = q.unwrap_or(x);
        let (mut idx, mut dist) = (Vec::new(), Vec::new());
        for (r, qp) in qs.chunks_exact(dim).enumerate() {
            // The ranking key widened to f64 (exact, so the order is the accumulator's);
            // haversine ranks by its f64 chord squared whatever the input precision.
            let key = |p: &[T]| match metric {
                Metric::Haversine => geo_chord2(&geo_row(qp), &geo_row(p)),
                // The rule's f64 distance (cosine has no per-dimension accumulator).
                Metric::Cosine => crate::metric::cosine_distance(
                    qp,
                    p,
                    crate::metric::norm(qp),
                    crate::metric::norm(p),
                ),
                _ => distance_acc(metric, qp, p).to_f64(),
            };
            let mut all: Vec<(f64, u32)> = x
                .chunks_exact(dim)
                .enumerate()
                .filter(|&(j, _)| q.is_some() || j != r)
                .map(|(j, p)| (key(p), j as u32))
                .collect();
            all.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1)));
            for &(a, j) in &all[..k] {
                idx.push(j);
                // The reported distance: sqrt in the input precision for Euclidean, metres
                // from the f64 chord squared for haversine.
                let d = match metric {
                    Metric::Euclidean => T::from_f64(a).to_f64().sqrt(),
                    Metric::Haversine => geo_distance_m(a, crate::metric::EARTH_RADIUS_M),
                    _ => a,
                };
                dist.push(if std::mem::size_of::<T>() == 4 {
                    (d as f32) as f64
                } else {
                    d
                });
            }
        }
        (idx, dist)
    }
    match (data.coords(), query.map(|q| q.coords())) {
        (Coords::F32(x), None) => rows(x, None, data.dim(), k, metric),
        (Coords::F32(x), Some(Coords::F32(q))) => rows(x, Some(q), data.dim(), k, metric),
        (Coords::F64(x), None) => rows(x, None, data.dim(), k, metric),
        (Coords::F64(x), Some(Coords::F64(q))) => rows(x, Some(q), data.dim(), k, metric),
        _ => panic!("mixed precision"),
    }
}
