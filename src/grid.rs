//! Geometry of the eps-grid shared by the CPU and GPU grid joins: which dimensions are
//! indexed, and the cell coordinate of a value in each of them.
//!
//! Correctness contract: if two points match (`metric::within`), their cell coordinates
//! differ by at most 1 in every indexed dimension, so searching the 3^k adjacent cells
//! never loses a pair. Rounding could break that with cells exactly eps wide, so:
//! - cell coordinates are computed in f64 (exact subtraction for f32 inputs);
//! - each cell is `eps * (1 + 2^-18)` wide (at least), which covers the rounding of the
//!   f32/f64 distance test and of the f64 division while a dimension has < 2^31 cells;
//! - a dimension whose extent would need more cells gets wider cells instead;
//! - coordinates are clamped into the grid, which keeps "differ by <= 1" true, so points
//!   of another set (A ⋈ B queries) outside the indexed set's bounds are safe too.

use crate::dataset::Dataset;
use crate::error::{Error, Result};

/// Relative widening of cells over eps (see the module comment).
pub const CELL_WIDEN: f64 = 1.0 / (1u64 << 18) as f64;
/// Most cells along one dimension.
pub const MAX_CELLS_PER_DIM: u64 = 1 << 31;

#[derive(Clone, Debug, PartialEq)]
pub struct GridGeometry {
    /// Indexed dataset dimensions, in indexing order.
    pub dims: Vec<usize>,
    /// Lower bound per indexed dimension.
    pub origin: Vec<f64>,
    /// Cell width per indexed dimension (>= eps * (1 + CELL_WIDEN)).
    pub width: Vec<f64>,
    /// Number of cells per indexed dimension (>= 1).
    pub cells: Vec<u64>,
}

impl GridGeometry {
    /// A grid over `dims` (dataset dimension numbers) for points within [lo, hi] (indexed by
    /// dataset dimension), cells at least eps wide.
    pub fn new(dims: &[usize], lo: &[f64], hi: &[f64], eps: f64) -> Result<Self> {
        if !(eps.is_finite() && eps > 0.0) {
            return Err(Error::invalid(format!(
                "eps must be finite and > 0 (got {eps})"
            )));
        }
        let base = eps * (1.0 + CELL_WIDEN);
        let mut g = GridGeometry {
            dims: dims.to_vec(),
            origin: Vec::with_capacity(dims.len()),
            width: Vec::with_capacity(dims.len()),
            cells: Vec::with_capacity(dims.len()),
        };
        for &j in dims {
            let (l, h) = if lo[j] <= hi[j] {
                (lo[j], hi[j])
            } else {
                (0.0, 0.0)
            };
            let extent = h - l;
            let mut w = base;
            if extent / w >= (MAX_CELLS_PER_DIM - 2) as f64 {
                w = extent / (MAX_CELLS_PER_DIM / 2) as f64;
            }
            let n = ((extent / w).floor() as u64 + 1).min(MAX_CELLS_PER_DIM);
            g.origin.push(l);
            g.width.push(w);
            g.cells.push(n);
        }
        Ok(g)
    }

    /// Number of indexed dimensions k.
    pub fn k(&self) -> usize {
        self.dims.len()
    }

    /// Cell coordinate of value `x` along indexed dimension number `axis` (0..k), clamped.
    #[inline]
    pub fn coord(&self, axis: usize, x: f64) -> u64 {
        let t = (x - self.origin[axis]) / self.width[axis];
        // floor(t), clamped: for t > 0 the truncating cast is the floor (f64::floor is a
        // libm call on baseline x86-64: 1.4 ms of a 3.3 ms index build of 10^5 3-D points).
        if t > 0.0 {
            (t as u64).min(self.cells[axis] - 1)
        } else {
            0
        }
    }

    /// Total number of cells, if it fits in a u64 (linear cell ids need it to).
    pub fn total_cells(&self) -> Option<u64> {
        self.cells
            .iter()
            .try_fold(1u64, |acc, &c| acc.checked_mul(c))
    }

    /// Row-major linear id of a cell (last indexed dimension fastest). Requires
    /// `total_cells()` to be Some.
    #[inline]
    pub fn linear_id(&self, coords: &[u64]) -> u64 {
        let mut id = 0u64;
        for (c, n) in coords.iter().zip(&self.cells) {
            id = id * n + c;
        }
        id
    }

    /// Cell coordinates of point `i` of `data` along every indexed dimension.
    pub fn point_coords(&self, data: &Dataset, i: usize, out: &mut [u64]) {
        for (axis, &j) in self.dims.iter().enumerate() {
            out[axis] = self.coord(axis, data.get(i, j));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::{threshold, within};
    use crate::options::Metric;

    #[test]
    fn matching_points_are_in_adjacent_cells() {
        // Points exactly eps apart on and around cell edges, f32 and f64.
        let eps = 0.1f64;
        let lo = [0.0];
        let hi = [100.0];
        let g = GridGeometry::new(&[0], &lo, &hi, eps).unwrap();
        let thr32: f32 = threshold(Metric::Euclidean, eps);
        for step in 0..20000u32 {
            let a = step as f32 * 0.005;
            let b = a + eps as f32;
            for b in [
                b,
                f32::from_bits(b.to_bits() - 1),
                f32::from_bits(b.to_bits() + 1),
            ] {
                if within(Metric::Euclidean, &[a], &[b], thr32) {
                    let ca = g.coord(0, a as f64);
                    let cb = g.coord(0, b as f64);
                    assert!(cb.abs_diff(ca) <= 1, "a={a} b={b} ca={ca} cb={cb}");
                }
            }
        }
    }

    #[test]
    fn huge_extent_gets_wider_cells() {
        let g = GridGeometry::new(&[0], &[-1e30], &[1e30], 1e-3).unwrap();
        assert!(g.cells[0] <= MAX_CELLS_PER_DIM);
        assert!(g.width[0] >= 1e-3);
        assert_eq!(g.coord(0, 1e30), g.cells[0] - 1);
        assert_eq!(g.coord(0, -1e30), 0);
    }
}
