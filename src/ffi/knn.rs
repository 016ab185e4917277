//! The k-nearest-neighbour join (`simjoin_knn`), its options (`simjoin_knn_options`) and
//! its result (`simjoin_knn_result`: the (rows, k) index and distance arrays, the report).

use super::control::{control_of, simjoin_control};
use super::engine::simjoin_engine;
use super::matrix::{
    read_matrix, simjoin_dtype, simjoin_matrix, SIMJOIN_DTYPE_F32, SIMJOIN_DTYPE_F64,
};
use super::options::{
    enum_value, init_sized, optional_count, padded, read_sized, simjoin_algorithm, simjoin_backend,
    simjoin_metric, ALGORITHMS, BACKENDS, METRICS,
};
use super::result::{c_report, simjoin_report};
use super::{guard, null_arg, simjoin_status};
use crate::knn::{KnnOptions, KnnResult};
use crate::result::Distances;
use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// kNN options. Call `simjoin_knn_options_init` first: it sets `size` and every default.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct simjoin_knn_options {
    /// `sizeof(simjoin_knn_options)` as the caller compiled it.
    pub size: usize,
    pub metric: simjoin_metric,
    pub backend: simjoin_backend,
    /// AUTO, KDTREE (CPU), LSS (GPU) or BRUTE.
    pub algorithm: simjoin_algorithm,
    /// LSS: number of shifted Z-order lists, 1 to 64 (0 = automatic).
    pub lss_lists: u64,
    /// NULL, or a control that can stop the call and reports its progress. Added in 0.3.
    pub control: *const simjoin_control,
    /// SIMJOIN_METRIC_HAVERSINE: the sphere's radius in metres (0 = the mean Earth radius,
    /// SIMJOIN_EARTH_RADIUS_M); other metrics take only 0. Added in 0.3.
    pub sphere_radius: f64,
}

impl simjoin_knn_options {
    fn defaults() -> Self {
        let d = KnnOptions::default();
        simjoin_knn_options {
            size: std::mem::size_of::<simjoin_knn_options>(),
            metric: d.metric as u32,
            backend: d.backend as u32,
            algorithm: d.algorithm as u32,
            lss_lists: 0,
            control: std::ptr::null(),
            sphere_radius: 0.0,
        }
    }
}

/// The size of `simjoin_knn_options` in simjoin 0.2 (frozen: what
/// `simjoin_knn_options_init` writes).
const KNN_OPTIONS_0_2: usize = padded(
    std::mem::offset_of!(simjoin_knn_options, lss_lists) + std::mem::size_of::<u64>(),
    std::mem::align_of::<simjoin_knn_options>(),
);

/// Fills the caller's `simjoin_knn_options` of `size` bytes with the defaults (Euclidean,
/// automatic backend and algorithm) and sets `opts->size = size`, as
/// `simjoin_options_init_sized` does. The header's `simjoin_knn_options_init(opts)` macro
/// calls this with `sizeof *(opts)`.
#[no_mangle]
pub unsafe extern "C" fn simjoin_knn_options_init_sized(
    opts: *mut simjoin_knn_options,
    size: usize,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL (refused) or `size` writable bytes (header contract).
        unsafe {
            init_sized(
                opts,
                size,
                simjoin_knn_options::defaults(),
                std::mem::size_of::<usize>(),
                "simjoin_knn_options",
            )
        }
    })
}

/// For programs compiled against simjoin 0.2: `simjoin_knn_options_init_sized` with the
/// 0.2 size of the struct.
#[no_mangle]
pub unsafe extern "C" fn simjoin_knn_options_init(
    opts: *mut simjoin_knn_options,
) -> simjoin_status {
    // SAFETY: a 0.2 caller's struct has KNN_OPTIONS_0_2 writable bytes.
    unsafe { simjoin_knn_options_init_sized(opts, KNN_OPTIONS_0_2) }
}

/// A kNN result (opaque, immutable). Pointers it hands out stay valid until
/// `simjoin_knn_result_free`.
pub struct simjoin_knn_result {
    result: KnnResult,
    backend: CString,
    device: CString,
}

/// The exact k-nearest-neighbour join: for each row of `query` (or, when `query` is NULL,
/// of `data` itself, each point's own entry excluded), its `k` nearest rows of `data`,
/// nearest first, equal distances by smaller index. `opts` may be NULL (defaults). `k`
/// larger than the candidates is SIMJOIN_INVALID_ARGUMENT. On success `*out` holds a new
/// result (free it with `simjoin_knn_result_free`).
#[no_mangle]
pub unsafe extern "C" fn simjoin_knn(
    engine: *const simjoin_engine,
    data: *const simjoin_matrix,
    query: *const simjoin_matrix,
    k: usize,
    opts: *const simjoin_knn_options,
    out: *mut *mut simjoin_knn_result,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live engine (header contract); checked for NULL here.
        let engine = unsafe { engine.as_ref() }.ok_or_else(|| null_arg("engine"))?;
        if out.is_null() {
            return Err(null_arg("out"));
        }
        // SAFETY: NULL or live structs whose data outlive this call (header contract).
        let d_points = unsafe { read_matrix("data", data) }?;
        let d = d_points.dataset()?;
        let q_points = if query.is_null() {
            None
        } else {
            // SAFETY: as above, non-NULL.
            Some(unsafe { read_matrix("query", query) }?)
        };
        let q = q_points.as_ref().map(|p| p.dataset()).transpose()?;
        let o = if opts.is_null() {
            simjoin_knn_options::defaults()
        } else {
            let least = std::mem::size_of::<usize>();
            // SAFETY: non-NULL, a live simjoin_knn_options of its stated size (header contract).
            unsafe {
                read_sized(
                    opts,
                    simjoin_knn_options::defaults(),
                    least,
                    "simjoin_knn_options",
                )
            }?
        };
        let options = KnnOptions {
            metric: enum_value("metric", o.metric, &METRICS)?,
            sphere_radius: super::options::sphere_radius(o.sphere_radius),
            backend: enum_value("backend", o.backend, &BACKENDS)?,
            algorithm: enum_value("algorithm", o.algorithm, &ALGORITHMS)?,
            lss_lists: optional_count("lss_lists", o.lss_lists)?,
            // SAFETY: NULL or a live control (header contract).
            control: unsafe { control_of(o.control) },
        };
        let result = engine.engine.knn(&d, q.as_ref(), k, &options)?;
        let c = |s: &str| CString::new(s.replace('\0', " ")).unwrap_or_default();
        let handle = Box::new(simjoin_knn_result {
            backend: c(&result.report.backend),
            device: c(&result.report.device),
            result,
        });
        // SAFETY: `out` is non-NULL (checked) and writable (header contract).
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    })
}

/// Frees a kNN result (NULL is fine). Pointers obtained from it become invalid.
#[no_mangle]
pub unsafe extern "C" fn simjoin_knn_result_free(result: *mut simjoin_knn_result) {
    if !result.is_null() {
        // SAFETY: a handle from simjoin_knn, freed once, after its readers are done (header
        // contract).
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(result) })));
    }
}

/// The answer's arrays, row-major (rows x k), owned by the result: `*indices` holds data
/// row numbers (uint32); `*distances` the distances, `float` when `*dtype` is
/// SIMJOIN_DTYPE_F32 and `double` when SIMJOIN_DTYPE_F64 (the inputs' type). Both are NULL
/// when `*rows` is 0. Any out-pointer may be NULL when that value is not wanted.
#[no_mangle]
pub unsafe extern "C" fn simjoin_knn_result_arrays(
    result: *const simjoin_knn_result,
    rows: *mut usize,
    k: *mut usize,
    indices: *mut *const u32,
    distances: *mut *const c_void,
    dtype: *mut simjoin_dtype,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live result (header contract); checked for NULL here.
        let r = &unsafe { result.as_ref() }
            .ok_or_else(|| null_arg("result"))?
            .result;
        let empty = r.indices.is_empty();
        let (dist, ty) = match &r.distances {
            Distances::F32(d) => (d.as_ptr() as *const c_void, SIMJOIN_DTYPE_F32),
            Distances::F64(d) => (d.as_ptr() as *const c_void, SIMJOIN_DTYPE_F64),
        };
        // SAFETY: each out-pointer is NULL (skipped) or writable (header contract).
        unsafe {
            if let Some(p) = rows.as_mut() {
                *p = r.rows;
            }
            if let Some(p) = k.as_mut() {
                *p = r.k;
            }
            if let Some(p) = indices.as_mut() {
                *p = if empty {
                    std::ptr::null()
                } else {
                    r.indices.as_ptr()
                };
            }
            if let Some(p) = distances.as_mut() {
                *p = if empty { std::ptr::null() } else { dist };
            }
            if let Some(p) = dtype.as_mut() {
                *p = ty;
            }
        }
        Ok(())
    })
}

/// Fills `*report` with what ran (`pairs` is rows x k); its strings live as long as the
/// result.
#[no_mangle]
pub unsafe extern "C" fn simjoin_knn_result_report(
    result: *const simjoin_knn_result,
    report: *mut simjoin_report,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live result (header contract); checked for NULL here.
        let r = unsafe { result.as_ref() }.ok_or_else(|| null_arg("result"))?;
        // SAFETY: NULL or a writable simjoin_report (header contract); checked for NULL here.
        let out = unsafe { report.as_mut() }.ok_or_else(|| null_arg("report"))?;
        *out = c_report(&r.result.report, &r.backend, &r.device);
        Ok(())
    })
}
