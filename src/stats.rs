//! Per-dimension statistics every backend shares: bounds, variance and the variance order
//! (REORDER). One definition each, so the CPU and GPU joins plan from the same numbers.

use crate::dataset::{Coords, Dataset};
use crate::metric::Coord;
use rayon::prelude::*;

/// Per-dimension running statistics of a point set.
#[derive(Clone)]
struct Moments {
    lo: Vec<f64>,
    hi: Vec<f64>,
    /// Sums of (x - shift) and its square: shifting by a data value keeps the variance
    /// accurate.
    sum: Vec<f64>,
    sq: Vec<f64>,
    n: usize,
}

impl Moments {
    fn new(d: usize) -> Self {
        Moments {
            lo: vec![f64::INFINITY; d],
            hi: vec![f64::NEG_INFINITY; d],
            sum: vec![0.0; d],
            sq: vec![0.0; d],
            n: 0,
        }
    }
    fn merge(mut self, o: Moments) -> Self {
        for j in 0..self.lo.len() {
            self.lo[j] = self.lo[j].min(o.lo[j]);
            self.hi[j] = self.hi[j].max(o.hi[j]);
            self.sum[j] += o.sum[j];
            self.sq[j] += o.sq[j];
        }
        self.n += o.n;
        self
    }
}

/// Moments of the rows of `x` (`d` wide), in parallel.
fn moments<T: Coord>(x: &[T], d: usize, shift: &[f64]) -> Moments {
    x.par_chunks(d * 4096)
        .fold(
            || Moments::new(d),
            |mut m, chunk| {
                for p in chunk.chunks_exact(d) {
                    for j in 0..d {
                        let v = p[j].to_f64();
                        m.lo[j] = m.lo[j].min(v);
                        m.hi[j] = m.hi[j].max(v);
                        let t = v - shift[j];
                        m.sum[j] += t;
                        m.sq[j] += t * t;
                    }
                    m.n += 1;
                }
                m
            },
        )
        .reduce(|| Moments::new(d), Moments::merge)
}

/// Per-dimension bounds and variance over A and B together (one parallel pass each).
pub fn bounds_and_variance(a: &Dataset, b: Option<&Dataset>) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let d = a.dim();
    let first = if !a.is_empty() {
        Some(a)
    } else {
        b.filter(|b| !b.is_empty())
    };
    let shift: Vec<f64> = (0..d)
        .map(|j| first.map_or(0.0, |set| set.get(0, j)))
        .collect();
    let mut m = Moments::new(d);
    for set in std::iter::once(a).chain(b) {
        let part = match set.coords() {
            Coords::F32(x) => moments(x, d, &shift),
            Coords::F64(x) => moments(x, d, &shift),
        };
        m = m.merge(part);
    }
    let var = (0..d)
        .map(|j| {
            if m.n == 0 {
                0.0
            } else {
                (m.sq[j] / m.n as f64 - (m.sum[j] / m.n as f64).powi(2)).max(0.0)
            }
        })
        .collect();
    (m.lo, m.hi, var)
}

/// Dimensions by decreasing variance (ties by dimension number, so the order is stable):
/// the REORDER order of the CPU and GPU joins.
pub fn order_by_variance(var: &[f64]) -> Vec<usize> {
    let mut dims: Vec<usize> = (0..var.len()).collect();
    dims.sort_by(|&x, &y| var[y].total_cmp(&var[x]).then(x.cmp(&y)));
    dims
}

/// Per-dimension [min, max] of a dataset (all dimensions). Empty set: (+inf, -inf).
pub fn bounds(data: &Dataset) -> (Vec<f64>, Vec<f64>) {
    let (lo, hi, _) = bounds_and_variance(data, None);
    (lo, hi)
}
