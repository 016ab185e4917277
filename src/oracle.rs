//! Brute-force reference joins: O(n·m), single-threaded, the canonical `metric::within`
//! per pair. Tests compare every backend's pair set with these, exactly. Cosine takes the
//! rule's own steps (`metric::norm` once a row, `metric::cosine_dot` a pair, compared by
//! `metric::cosine_accept`), four pairs side by side (`cosine_dots`).

use crate::dataset::{Coords, Dataset};
use crate::metric::{
    cosine_accept, cosine_distance_of, distance_acc, geo_chord2, geo_distance_m, geo_row, norm,
    threshold, within, Coord,
};
use crate::options::Metric;
use crate::result::Pair;

/// `metric::cosine_dot(q, row)` of each row of `rows` (row-major, `dim` wide), in order,
/// passed to `f(index, dot)`. Four rows' sums run side by side: each is the same chain of
/// f64 adds in the same order (no fused multiply-add), so the same bits as `cosine_dot`,
/// about four times as fast (the chain's latency, not its arithmetic, bounds one sum).
fn cosine_dots<T: Coord>(q: &[T], rows: &[T], dim: usize, mut f: impl FnMut(usize, f64)) {
    let mut quads = rows.chunks_exact(4 * dim);
    let mut j = 0;
    for quad in quads.by_ref() {
        let (r0, rest) = quad.split_at(dim);
        let (r1, rest) = rest.split_at(dim);
        let (r2, r3) = rest.split_at(dim);
        let mut d = [0.0f64; 4];
        for (i, &x) in q.iter().enumerate() {
            let x = x.to_f64();
            d[0] += x * r0[i].to_f64();
            d[1] += x * r1[i].to_f64();
            d[2] += x * r2[i].to_f64();
            d[3] += x * r3[i].to_f64();
        }
        for (k, &dot) in d.iter().enumerate() {
            f(j + k, dot);
        }
        j += 4;
    }
    for r in quads.remainder().chunks_exact(dim) {
        f(j, crate::metric::cosine_dot(q, r));
        j += 1;
    }
}

fn norms<T: Coord>(x: &[T], dim: usize) -> Vec<f64> {
    x.chunks_exact(dim).map(norm).collect()
}

fn self_pairs<T: Coord>(x: &[T], dim: usize, metric: Metric, eps: f64) -> Vec<Pair> {
    let thr: T = threshold(metric, eps);
    if metric == Metric::Cosine && dim > 0 {
        let (nx, e) = (norms(x, dim), thr.to_f64());
        let mut out = Vec::new();
        for (i, a) in x.chunks_exact(dim).enumerate() {
            cosine_dots(a, &x[(i + 1) * dim..], dim, |k, dot| {
                let j = i + 1 + k;
                if cosine_accept(dot, nx[i], nx[j], e) {
                    out.push([i as u32, j as u32]);
                }
            });
        }
        return out;
    }
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
    if metric == Metric::Cosine && dim > 0 {
        let (na, nb, e) = (norms(a, dim), norms(b, dim), thr.to_f64());
        let mut out = Vec::new();
        for (i, pa) in a.chunks_exact(dim).enumerate() {
            cosine_dots(pa, b, dim, |j, dot| {
                if cosine_accept(dot, na[i], nb[j], e) {
                    out.push([i as u32, j as u32]);
                }
            });
        }
        return out;
    }
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
        let nx = if metric == Metric::Cosine {
            norms(x, dim)
        } else {
            vec![]
        };
        for (r, qp) in qs.chunks_exact(dim).enumerate() {
            // The ranking key widened to f64 (exact, so the order is the accumulator's);
            // haversine ranks by its f64 chord squared whatever the input precision.
            let key = |p: &[T]| match metric {
                Metric::Haversine => geo_chord2(&geo_row(qp), &geo_row(p)),
                // The rule's f64 distance, from `cosine_dots` below.
                Metric::Cosine => unreachable!("cosine ranks by cosine_dots"),
                _ => distance_acc(metric, qp, p).to_f64(),
            };
            let mut all: Vec<(f64, u32)> = if metric == Metric::Cosine {
                let (nq, mut all) = (norm(qp), Vec::with_capacity(nx.len()));
                cosine_dots(qp, x, dim, |j, dot| {
                    if q.is_some() || j != r {
                        all.push((cosine_distance_of(dot, nq, nx[j]), j as u32));
                    }
                });
                all
            } else {
                x.chunks_exact(dim)
                    .enumerate()
                    .filter(|&(j, _)| q.is_some() || j != r)
                    .map(|(j, p)| (key(p), j as u32))
                    .collect()
            };
            // The k smallest by (key, index), then those k in order: the same rows as a
            // full sort's first k.
            let order =
                |a: &(f64, u32), b: &(f64, u32)| a.0.partial_cmp(&b.0).unwrap().then(a.1.cmp(&b.1));
            if k < all.len() {
                all.select_nth_unstable_by(k, order);
                all.truncate(k);
            }
            all.sort_by(order);
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

#[cfg(test)]
mod tests {
    /// Four sums side by side are `cosine_dot`'s bits, at every remainder of four rows.
    #[test]
    fn cosine_dots_are_the_rules_dot_products() {
        let dim = 37;
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let rows: Vec<f32> = (0..11 * dim).map(|_| next() as f32 * 1e3).collect();
        let q: Vec<f32> = (0..dim).map(|_| next() as f32).collect();
        for n in 0..=11 {
            let mut seen = 0;
            super::cosine_dots(&q, &rows[..n * dim], dim, |j, dot| {
                assert_eq!(j, seen);
                let want = crate::metric::cosine_dot(&q, &rows[j * dim..(j + 1) * dim]);
                assert_eq!(dot.to_bits(), want.to_bits(), "row {j} of {n}");
                seen += 1;
            });
            assert_eq!(seen, n);
        }
    }
}
