//! The high-dimensional filter of the GPU grid join: the CPU's f32 dot-product filter
//! (`cpu/dot_filter.rs`, its bound and its copies) per candidate in the kernel
//! (glsl/join_common.glsl `dot_rejects`), before the exact test, which decides every
//! survivor: the pair set does not change.
//!
//! One cutoff G serves the whole join, from the largest centring error and norm over all
//! points (centred on the middle of both sets' bounding box), passed in the push constants
//! (`JoinParams::dot_cutoff`). The copies are by point id, so one upload serves the host-
//! and the device-built index alike (the kernel reads them through the point lookup).
//! A real GPU would rather stage tiles of queries x candidates in shared memory; the
//! kernel's one-thread-per-query scan (each thread in its own cells) has no shared tile.

use super::device_data::{check_binding, coords_of};
use crate::cpu::dot_filter::{centred_rows, FilterBound};
use crate::dataset::Dataset;
use crate::error::Result;
use crate::metric::Coord;
use crate::options::Metric;
use crate::vk::{Buffer, Uploads};
use std::sync::Arc;

/// From this many dimensions Euclidean grid joins use the filter: the CPU's floor
/// (`cpu::ego::FILTER_MIN_DIM`), not yet measured on a real GPU.
const MIN_DIM: usize = 8;

/// The filter's device data for one join.
pub(super) struct DotFilter {
    /// Filter copies of the indexed points, by id.
    pub r_dot: Arc<Buffer>,
    /// Of the queries (None in a self-join: they are the indexed points).
    pub q_dot: Option<Arc<Buffer>>,
    /// G, rounded up to f32.
    pub cutoff: f32,
}

/// `SIMJOIN_GPU_DOT_FILTER=0` turns the filter off, `=1` on wherever it is safe (below
/// MIN_DIM too, and where it would reject little): for tests and measurements.
fn forced() -> Option<bool> {
    match std::env::var("SIMJOIN_GPU_DOT_FILTER").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    }
}

/// The midpoint of the bounding box of `sets` (row-major, `dim` columns), per dimension.
fn box_centre<T: Coord>(sets: &[&[T]], dim: usize) -> Vec<f64> {
    let mut lo = vec![f64::INFINITY; dim];
    let mut hi = vec![f64::NEG_INFINITY; dim];
    for set in sets {
        for p in set.chunks(dim) {
            for (c, &x) in p.iter().enumerate() {
                lo[c] = lo[c].min(x.to_f64());
                hi[c] = hi[c].max(x.to_f64());
            }
        }
    }
    lo.iter()
        .zip(&hi)
        .map(|(&l, &h)| l + (h - l) / 2.0)
        .collect()
}

/// Prepares the filter for the grid join of queries `q` with indexed points `r` (the same
/// set in a self-join) under threshold `thr`, uploading its copies; None (with the reason
/// in `notes`) where it is off, unsafe or useless.
pub(super) fn prepare<T: Coord>(
    uploads: &mut Uploads,
    r: &Dataset,
    q: Option<&Dataset>,
    metric: Metric,
    thr: T,
    notes: &mut Vec<String>,
) -> Result<Option<DotFilter>> {
    let dim = r.dim();
    let force = forced();
    if metric != Metric::Euclidean || force == Some(false) || (force.is_none() && dim < MIN_DIM) {
        return Ok(None);
    }
    let mut off = |why: &str| {
        notes.push(format!("GPU dot-product filter off: {why}"));
        Ok(None)
    };
    let Some(bound) = FilterBound::new(thr, dim) else {
        return off("eps too small for its bound");
    };
    let rc = coords_of::<T>(r);
    let qc = q.map(|q| coords_of::<T>(q));
    let centre = box_centre(&[rc, qc.unwrap_or(&[])], dim);
    let Some((r_rows, r_err, r_n2)) = centred_rows(rc, dim, &centre) else {
        return off("centred norms too large for f32");
    };
    let q_rows = match qc.map(|qc| centred_rows(qc, dim, &centre)) {
        Some(None) => return off("centred norms too large for f32"),
        rows => rows.flatten(),
    };
    let (q_err, q_n2) = q_rows.as_ref().map_or((r_err, r_n2), |q| (q.1, q.2));
    if force.is_none() && !bound.useful(r_n2.max(q_n2)) {
        return off("its error term would exceed eps^2 (spread far wider than eps)");
    }
    let too_big = |rows: &Vec<f32>| {
        check_binding(uploads.context(), 4 * rows.len() as u64, "filter copies").is_err()
    };
    if too_big(&r_rows) || q_rows.as_ref().is_some_and(|q| too_big(&q.0)) {
        return off("its copies exceed the device's binding limit");
    }
    let cutoff = bound.cutoff(q_err, r_err, q_n2, r_n2);
    let r_dot = uploads.upload(&r_rows, "filter copies (indexed)")?;
    let q_dot = match q_rows {
        Some((rows, ..)) => Some(uploads.upload(&rows, "filter copies (queries)")?),
        None => None,
    };
    notes.push(format!(
        "GPU dot-product filter on: f32 copies centred on the bounding box's middle, cutoff \
         G = {cutoff:e} for eps^2 = {:e}, survivors confirmed exactly",
        thr.to_f64()
    ));
    Ok(Some(DotFilter {
        r_dot,
        q_dot,
        cutoff,
    }))
}
