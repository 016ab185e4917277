//! The exact k-nearest-neighbour join: for every query point, its k nearest data points.
//!
//! One definition of the answer, shared by every backend so that all agree bit for bit:
//! - the distance of a candidate is `metric::distance_acc` in the input precision (squared
//!   for Euclidean), canonical dimension order, no fused multiply-add;
//! - neighbours are ordered by (distance, index): equal distances go to the smaller data
//!   index, at the k-th place too;
//! - a self-kNN (no query set) excludes the point itself (by index; an exact duplicate of
//!   it is a neighbour at distance 0);
//! - reported distances are `sqrt(acc)` for Euclidean (computed on the host in the input
//!   precision, so a GPU's approximate `sqrt` never enters), `acc` otherwise.

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::metric::Coord;
use crate::options::{Algorithm, Backend, Metric};
use crate::result::{Distances, JoinReport};

/// How to run a k-nearest-neighbour join.
#[derive(Clone, Debug, PartialEq)]
pub struct KnnOptions {
    pub metric: Metric,
    /// `Metric::Haversine`: the sphere's radius in metres (distances are metres on it);
    /// [`crate::metric::EARTH_RADIUS_M`] by default.
    pub sphere_radius: f64,
    pub backend: Backend,
    /// `Auto`, `KdTree` (CPU), `Grid` (CPU), `Lss` (GPU) or `Brute` (both).
    pub algorithm: Algorithm,
    /// LSS: number of shifted Z-order lists (None = automatic).
    pub lss_lists: Option<usize>,
    /// Stops and watches the join (see [`crate::control`]; the default is inert).
    pub control: crate::control::Control,
}

impl Default for KnnOptions {
    fn default() -> Self {
        KnnOptions {
            metric: Metric::Euclidean,
            sphere_radius: crate::metric::EARTH_RADIUS_M,
            backend: Backend::Auto,
            algorithm: Algorithm::Auto,
            lss_lists: None,
            control: crate::control::Control::default(),
        }
    }
}

/// The answer: `rows` query points × `k` neighbours, row-major. Row r holds query r's
/// neighbours nearest first: `indices[r*k + c]` is a data point index.
#[derive(Clone, Debug)]
pub struct KnnResult {
    pub rows: usize,
    pub k: usize,
    pub indices: Vec<u32>,
    pub distances: Distances,
    pub report: JoinReport,
}

impl KnnResult {
    /// Row r's neighbour indices.
    pub fn row(&self, r: usize) -> &[u32] {
        &self.indices[r * self.k..(r + 1) * self.k]
    }
    /// Distance of row r's c-th neighbour, widened to f64.
    pub fn distance(&self, r: usize, c: usize) -> f64 {
        match &self.distances {
            Distances::F32(d) => d[r * self.k + c] as f64,
            Distances::F64(d) => d[r * self.k + c],
        }
    }
}

/// One kNN join to run; `query == None` is a self-kNN. Checked by [`KnnJob::new`].
pub(crate) struct KnnJob<'a> {
    pub data: Dataset<'a>,
    pub query: Option<Dataset<'a>>,
    pub k: usize,
    pub opts: &'a KnnOptions,
}

impl<'a> KnnJob<'a> {
    pub fn new(
        data: &Dataset<'a>,
        query: Option<&Dataset<'a>>,
        k: usize,
        opts: &'a KnnOptions,
    ) -> Result<Self> {
        crate::options::check_lss_lists(opts.lss_lists)?;
        if matches!(opts.algorithm, Algorithm::Ego) {
            return Err(Error::invalid(
                "'ego' is an eps-join algorithm; kNN uses auto, kdtree, grid, lss or brute",
            ));
        }
        if let Some(q) = query {
            if q.dim() != data.dim() {
                return Err(Error::invalid(format!(
                    "the data have {} dimensions but the queries have {}",
                    data.dim(),
                    q.dim()
                )));
            }
            if q.precision() != data.precision() {
                return Err(Error::invalid(
                    "data and queries must have the same precision (both f32 or both f64)",
                ));
            }
        }
        if k == 0 {
            return Err(Error::invalid("k must be >= 1"));
        }
        let candidates = data.len() - usize::from(query.is_none() && !data.is_empty());
        let rows = query.map_or(data.len(), |q| q.len());
        if rows > 0 && k > candidates {
            return Err(Error::invalid(format!(
                "k = {k} is larger than the {candidates} candidate points{}",
                if query.is_none() {
                    " (a self-kNN excludes the point itself)"
                } else {
                    ""
                }
            )));
        }
        if k > u32::MAX as usize || rows.checked_mul(k).is_none() {
            return Err(Error::invalid(format!(
                "a {rows} x {k} result does not fit in memory"
            )));
        }
        // Distances are ranked in the input precision: none may overflow (a pass over
        // the points, small beside the kNN search itself).
        let (lo, hi, _) = crate::stats::bounds_and_variance(data, query);
        crate::metric::check_extent(opts.metric, &lo, &hi, data.precision())?;
        Ok(KnnJob {
            data: *data,
            query: query.copied(),
            k,
            opts,
        })
    }

    pub fn rows(&self) -> usize {
        self.query.map_or(self.data.len(), |q| q.len())
    }
}

/// The ordering key of a candidate: (distance accumulator, index). Totally ordered because
/// accumulators are finite and never NaN (inputs are finite).
#[inline(always)]
pub(crate) fn key_less<T: Coord>(a: (T, u32), b: (T, u32)) -> bool {
    a.0 < b.0 || (a.0 == b.0 && a.1 < b.1)
}

/// Turns accumulators into reported distances (square root for Euclidean), in place.
pub(crate) fn finish_distances<T: Coord>(metric: Metric, acc: &mut [T]) {
    if metric == Metric::Euclidean {
        for a in acc {
            *a = crate::metric::finish(metric, *a);
        }
    }
}

/// Allocates a result array of `len` entries, or a clear out-of-memory error.
pub(crate) fn alloc<T: Clone + Send + Sync>(len: usize, fill: T, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| {
        Error::new(
            crate::error::ErrorKind::OutOfHostMemory,
            format!("cannot allocate the kNN {what} ({len} entries)"),
        )
    })?;
    crate::result::huge::advise(&mut v);
    // Filled by every engine thread: a kNN's arrays are hundreds of MB of first touches.
    use rayon::prelude::*;
    v.par_extend(rayon::iter::repeat_n(fill, len));
    Ok(v)
}

/// [`alloc`] filled in pieces, `control` checked between them (a few GB of first
/// touches take a second).
pub(crate) fn alloc_stoppable<T: Clone + Send + Sync>(
    len: usize,
    fill: T,
    what: &str,
    control: &crate::control::Control,
) -> Result<Vec<T>> {
    const PIECE: usize = 1 << 22;
    let mut v = alloc(len.min(PIECE), fill.clone(), what)?;
    if len > PIECE {
        v.try_reserve_exact(len - v.len()).map_err(|_| {
            Error::new(
                crate::error::ErrorKind::OutOfHostMemory,
                format!("cannot allocate the kNN {what} ({len} entries)"),
            )
        })?;
        crate::result::huge::advise(&mut v);
        use rayon::prelude::*;
        while v.len() < len {
            control.check()?;
            let piece = PIECE.min(len - v.len());
            v.par_extend(rayon::iter::repeat_n(fill.clone(), piece));
        }
    }
    control.check()?;
    Ok(v)
}
