//! DBSCAN (`simjoin_dbscan`): labels into the caller's array, its options
//! (`simjoin_dbscan_options`, size-prefixed) and its report (`simjoin_dbscan_report`).

use super::control::{control_of, simjoin_control};
use super::engine::simjoin_engine;
use super::matrix::{read_matrix, simjoin_matrix};
use super::options::{
    enum_value, init_sized, padded, read_sized, simjoin_algorithm, simjoin_backend, simjoin_metric,
    ALGORITHMS, BACKENDS, METRICS,
};
use super::{guard, null_arg, simjoin_status};
use crate::dbscan::{dbscan_weighted, DbscanOptions};
use crate::error::Error;
use std::ffi::c_char;

/// DBSCAN options beyond eps and min_samples. Call `simjoin_dbscan_options_init` first: it
/// sets `size` and every default.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct simjoin_dbscan_options {
    /// `sizeof(simjoin_dbscan_options)` as the caller compiled it.
    pub size: usize,
    pub metric: simjoin_metric,
    pub backend: simjoin_backend,
    /// The join's algorithm: AUTO, GRID, EGO, BRUTE or LSS (GPU); the labels are the same
    /// whichever runs.
    pub algorithm: simjoin_algorithm,
    /// NULL (the default: every weight 1) or one weight per row, read during the call
    /// only (scikit-learn's `sample_weight`): a row is core when the weights within eps,
    /// its own included, sum to at least `min_samples`. Finite, below 2^63 in magnitude;
    /// zero and negative weights allowed; summed exactly (see `dbscan_weighted`). Callers
    /// compiled against a header without it pass a smaller `size` and get NULL.
    pub sample_weight: *const f64,
    /// NULL, or a control that can stop the call and reports its progress. Added in 0.3.
    pub control: *const simjoin_control,
    /// SIMJOIN_METRIC_HAVERSINE: the sphere's radius in metres (0 = the mean Earth radius,
    /// SIMJOIN_EARTH_RADIUS_M); eps is metres on it; other metrics
    /// take only 0. Added in 0.3.
    pub sphere_radius: f64,
}

impl simjoin_dbscan_options {
    fn defaults() -> Self {
        let d = DbscanOptions::new(1.0, 1);
        simjoin_dbscan_options {
            size: std::mem::size_of::<simjoin_dbscan_options>(),
            metric: d.metric as u32,
            backend: d.backend as u32,
            algorithm: d.algorithm as u32,
            sample_weight: std::ptr::null(),
            control: std::ptr::null(),
            sphere_radius: 0.0,
        }
    }
}

/// What a DBSCAN run found and how it ran.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct simjoin_dbscan_report {
    /// Number of clusters (labels run from 0 to clusters - 1).
    pub clusters: u64,
    /// Points labelled -1.
    pub noise: u64,
    pub core_points: u64,
    /// Unique pairs of the eps-join (each of its passes streams them all; none is kept).
    pub pairs: u64,
    /// Wall-clock seconds of the whole clustering.
    pub seconds: f64,
    /// "cpu" or "vulkan": where the join ran (a static string).
    pub backend: *const c_char,
}

/// The size of `simjoin_dbscan_options` in simjoin 0.2 (frozen: what
/// `simjoin_dbscan_options_init` writes).
const DBSCAN_OPTIONS_0_2: usize = padded(
    std::mem::offset_of!(simjoin_dbscan_options, sample_weight) + std::mem::size_of::<*const f64>(),
    std::mem::align_of::<simjoin_dbscan_options>(),
);

/// Fills the caller's `simjoin_dbscan_options` of `size` bytes with the defaults
/// (Euclidean, automatic backend and algorithm, no weights) and sets `opts->size = size`,
/// as `simjoin_options_init_sized` does. The header's `simjoin_dbscan_options_init(opts)`
/// macro calls this with `sizeof *(opts)`.
#[no_mangle]
pub unsafe extern "C" fn simjoin_dbscan_options_init_sized(
    opts: *mut simjoin_dbscan_options,
    size: usize,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL (refused) or `size` writable bytes (header contract).
        unsafe {
            init_sized(
                opts,
                size,
                simjoin_dbscan_options::defaults(),
                std::mem::size_of::<usize>(),
                "simjoin_dbscan_options",
            )
        }
    })
}

/// For programs compiled against simjoin 0.2: `simjoin_dbscan_options_init_sized` with
/// the 0.2 size of the struct.
#[no_mangle]
pub unsafe extern "C" fn simjoin_dbscan_options_init(
    opts: *mut simjoin_dbscan_options,
) -> simjoin_status {
    // SAFETY: a 0.2 caller's struct has DBSCAN_OPTIONS_0_2 writable bytes.
    unsafe { simjoin_dbscan_options_init_sized(opts, DBSCAN_OPTIONS_0_2) }
}

/// DBSCAN of the rows of `points` on the eps-join, in memory proportional to the number
/// of rows whatever the number of pairs. A row with at least `min_samples` rows within
/// `eps` (itself included, as scikit-learn counts) is a core point; core points within eps
/// of each other share a cluster; a non-core row with a core row within eps joins the
/// cluster of its nearest one (equal distances: the smaller row); the rest is noise.
/// Clusters are numbered 0, 1, ... by their smallest row. `eps` must be finite and > 0,
/// `min_samples` >= 1. `opts` may be NULL (defaults). On success `labels[i]` (an array of
/// `points->rows` entries; may be NULL only when rows is 0) holds row i's cluster or -1
/// for noise; `core` (NULL when not wanted, else `points->rows` bytes) holds 1 for a core
/// row and 0 otherwise; `*report` (NULL when not wanted) the counts.
#[no_mangle]
pub unsafe extern "C" fn simjoin_dbscan(
    engine: *const simjoin_engine,
    points: *const simjoin_matrix,
    eps: f64,
    min_samples: u64,
    opts: *const simjoin_dbscan_options,
    labels: *mut i64,
    core: *mut u8,
    report: *mut simjoin_dbscan_report,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live engine (header contract); checked for NULL here.
        let engine = unsafe { engine.as_ref() }.ok_or_else(|| null_arg("engine"))?;
        // SAFETY: NULL or a live matrix whose data outlive this call (header contract).
        let data_points = unsafe { read_matrix("points", points) }?;
        let data = data_points.dataset()?;
        if labels.is_null() && !data.is_empty() {
            return Err(null_arg("labels"));
        }
        let o = if opts.is_null() {
            simjoin_dbscan_options::defaults()
        } else {
            let least = std::mem::size_of::<usize>();
            // SAFETY: non-NULL, a live simjoin_dbscan_options of its stated size (header
            // contract).
            unsafe {
                read_sized(
                    opts,
                    simjoin_dbscan_options::defaults(),
                    least,
                    "simjoin_dbscan_options",
                )
            }?
        };
        let options = DbscanOptions {
            eps,
            min_samples: usize::try_from(min_samples).map_err(|_| {
                Error::invalid(format!("min_samples {min_samples} does not fit in size_t"))
            })?,
            metric: enum_value("metric", o.metric, &METRICS)?,
            sphere_radius: super::options::sphere_radius(o.sphere_radius),
            backend: enum_value("backend", o.backend, &BACKENDS)?,
            algorithm: enum_value("algorithm", o.algorithm, &ALGORITHMS)?,
            // SAFETY: NULL or a live control (header contract).
            control: unsafe { control_of(o.control) },
        };
        let weights = if o.sample_weight.is_null() || data.is_empty() {
            None
        } else {
            // SAFETY: non-NULL and readable for `points->rows` doubles during this call
            // (header contract).
            Some(unsafe { std::slice::from_raw_parts(o.sample_weight, data.len()) })
        };
        let r = dbscan_weighted(&engine.engine, &data, &options, weights)?;
        let n = r.labels.len();
        if n > 0 {
            // SAFETY: `labels` is non-NULL (checked above, n > 0) and writable for
            // `points->rows` = n entries (header contract); a separate allocation from ours.
            unsafe { std::ptr::copy_nonoverlapping(r.labels.as_ptr(), labels, n) };
            if !core.is_null() {
                // SAFETY: non-NULL and writable for n bytes (header contract).
                let out = unsafe { std::slice::from_raw_parts_mut(core, n) };
                for (o, &c) in out.iter_mut().zip(&r.core) {
                    *o = u8::from(c);
                }
            }
        }
        // SAFETY: NULL (skipped) or a writable simjoin_dbscan_report (header contract).
        if let Some(out) = unsafe { report.as_mut() } {
            let backend: &'static str = if r.report.backend == "vulkan" {
                "vulkan\0"
            } else {
                "cpu\0"
            };
            *out = simjoin_dbscan_report {
                clusters: r.clusters as u64,
                noise: r.noise as u64,
                core_points: r.core_points as u64,
                pairs: r.report.pairs,
                seconds: r.report.seconds,
                backend: backend.as_ptr() as *const c_char,
            };
        }
        Ok(())
    })
}
