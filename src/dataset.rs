//! A borrowed, validated view over row-major point coordinates (f32 or f64).

use crate::error::{Error, Result};

/// Borrowed coordinates, row-major: point i is `data[i*dim .. (i+1)*dim]`.
#[derive(Clone, Copy, Debug)]
pub enum Coords<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
}

/// Coordinate precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Precision {
    F32,
    F64,
}

/// A validated point set: `n` points of `dim` finite coordinates each.
/// Point ids are u32, so n < 2^32.
#[derive(Clone, Copy, Debug)]
pub struct Dataset<'a> {
    coords: Coords<'a>,
    n: usize,
    dim: usize,
}

/// Largest number of points in one dataset: ids are u32 and u32::MAX is kept free as a
/// sentinel for kernels.
pub const MAX_POINTS: usize = u32::MAX as usize - 1;

impl<'a> Dataset<'a> {
    pub fn from_f32(data: &'a [f32], dim: usize) -> Result<Self> {
        Self::new(Coords::F32(data), dim)
    }
    pub fn from_f64(data: &'a [f64], dim: usize) -> Result<Self> {
        Self::new(Coords::F64(data), dim)
    }

    /// Validates shape and values: dim >= 1, len a multiple of dim, n <= MAX_POINTS, and
    /// every coordinate finite (NaN/inf would make "distance <= eps" meaningless).
    pub fn new(coords: Coords<'a>, dim: usize) -> Result<Self> {
        if dim == 0 {
            return Err(Error::invalid(
                "points must have at least one dimension (dim = 0)",
            ));
        }
        let len = match coords {
            Coords::F32(d) => d.len(),
            Coords::F64(d) => d.len(),
        };
        if len % dim != 0 {
            return Err(Error::invalid(format!(
                "coordinate array length {len} is not a multiple of dim {dim}"
            )));
        }
        let n = len / dim;
        if n > MAX_POINTS {
            return Err(Error::invalid(format!(
                "{n} points exceed the limit of {MAX_POINTS} (point ids are 32-bit)"
            )));
        }
        let bad = match coords {
            Coords::F32(d) => d.iter().position(|x| !x.is_finite()),
            Coords::F64(d) => d.iter().position(|x| !x.is_finite()),
        };
        if let Some(pos) = bad {
            return Err(Error::invalid(format!(
                "coordinate {} of point {} is not finite (NaN or infinite)",
                pos % dim,
                pos / dim
            )));
        }
        Ok(Dataset { coords, n, dim })
    }

    pub fn len(&self) -> usize {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    pub fn dim(&self) -> usize {
        self.dim
    }
    pub fn coords(&self) -> Coords<'a> {
        self.coords
    }
    pub fn precision(&self) -> Precision {
        match self.coords {
            Coords::F32(_) => Precision::F32,
            Coords::F64(_) => Precision::F64,
        }
    }
    /// Coordinate j of point i, widened to f64 (exact).
    pub fn get(&self, i: usize, j: usize) -> f64 {
        match self.coords {
            Coords::F32(d) => d[i * self.dim + j] as f64,
            Coords::F64(d) => d[i * self.dim + j],
        }
    }
}

/// Float16 coordinates (IEEE binary16 bit patterns, as NumPy's `float16` and C's
/// `_Float16` store them) widened to f32, exactly: the engine computes them in f32. NaN
/// and infinities stay so, and [`Dataset::new`] refuses them as for any input.
pub fn widen_f16(bits: &[u16]) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = Vec::with_capacity(bits.len());
    bits.par_iter()
        .map(|&b| half::f16::from_bits(b).to_f32())
        .collect_into_vec(&mut out);
    out
}
