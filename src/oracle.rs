//! Brute-force reference joins: O(n·m), single-threaded, the canonical `metric::within`
//! per pair. Tests compare every backend's pair set with these, exactly.

use crate::dataset::{Coords, Dataset};
use crate::metric::{threshold, within, Coord};
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
