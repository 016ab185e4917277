//! Results (`simjoin_result`, immutable) and their accessors: pairs, CSR, count, report.

use super::matrix::{simjoin_dtype, SIMJOIN_DTYPE_F32, SIMJOIN_DTYPE_F64};
use super::options::{
    simjoin_algorithm, simjoin_output, SIMJOIN_OUTPUT_COUNT, SIMJOIN_OUTPUT_CSR,
    SIMJOIN_OUTPUT_PAIRS,
};
use super::{guard, null_arg, simjoin_status};
use crate::error::Error;
use crate::result::{Distances, JoinOutput, JoinResult};
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A join result (opaque, immutable): the output (pairs, CSR or count) and a report of
/// what ran. Pointers it hands out stay valid until `simjoin_result_free`.
pub struct simjoin_result {
    pub(crate) result: JoinResult,
    backend: CString,
    device: CString,
}

pub(crate) fn into_handle(result: JoinResult) -> Box<simjoin_result> {
    let c = |s: &str| CString::new(s.replace('\0', " ")).unwrap_or_default();
    Box::new(simjoin_result {
        backend: c(&result.report.backend),
        device: c(&result.report.device),
        result,
    })
}

/// Frees a result (NULL is fine). Pointers obtained from it become invalid.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_free(result: *mut simjoin_result) {
    if !result.is_null() {
        // SAFETY: a handle from a join call, freed once, after its readers are done (header
        // contract).
        let _ = catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(result) })));
    }
}

/// The result's output form (`SIMJOIN_OUTPUT_*`; streaming results are COUNT).
/// Returns SIMJOIN_OUTPUT_COUNT for NULL.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_output(result: *const simjoin_result) -> simjoin_output {
    // SAFETY: NULL or a live result (header contract).
    match unsafe { result.as_ref() }.map(|r| &r.result.output) {
        Some(JoinOutput::Pairs(_)) => SIMJOIN_OUTPUT_PAIRS,
        Some(JoinOutput::Csr(_)) => SIMJOIN_OUTPUT_CSR,
        _ => SIMJOIN_OUTPUT_COUNT,
    }
}

/// Number of result pairs (unique pairs for a self-join), whatever the output form; 0 for
/// NULL.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_count(result: *const simjoin_result) -> u64 {
    // SAFETY: NULL or a live result (header contract).
    unsafe { result.as_ref() }.map_or(0, |r| r.result.report.pairs)
}

/// The pairs of a PAIRS result: `*pairs` points at `2 * *count` uint32 values (i0, j0,
/// i1, j1, ...), owned by the result. `*pairs` may be NULL when `*count` is 0.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_pairs(
    result: *const simjoin_result,
    pairs: *mut *const u32,
    count: *mut usize,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live result (header contract); checked for NULL here.
        let r = unsafe { result.as_ref() }.ok_or_else(|| null_arg("result"))?;
        if pairs.is_null() || count.is_null() {
            return Err(null_arg(if pairs.is_null() { "pairs" } else { "count" }));
        }
        let p = r.result.pairs().ok_or_else(|| {
            Error::invalid("the result holds no pairs (its output form is not PAIRS)")
        })?;
        let first = if p.is_empty() {
            std::ptr::null()
        } else {
            p.as_ptr() as *const u32
        };
        // SAFETY: both out-pointers are non-NULL (checked) and writable (header contract).
        unsafe {
            *pairs = first;
            *count = p.len();
        }
        Ok(())
    })
}

/// The neighbour table of a CSR result: row r's neighbours are
/// `neighbors[offsets[r] .. offsets[r+1]]`; `offsets` has `*rows + 1` entries and
/// `neighbors` has `*nnz`. Arrays are owned by the result; `*neighbors` may be NULL when
/// `*nnz` is 0.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_csr(
    result: *const simjoin_result,
    offsets: *mut *const u64,
    rows: *mut usize,
    neighbors: *mut *const u32,
    nnz: *mut usize,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live result (header contract); checked for NULL here.
        let r = unsafe { result.as_ref() }.ok_or_else(|| null_arg("result"))?;
        for (p, name) in [
            (offsets.is_null(), "offsets"),
            (rows.is_null(), "rows"),
            (neighbors.is_null(), "neighbors"),
            (nnz.is_null(), "nnz"),
        ] {
            if p {
                return Err(null_arg(name));
            }
        }
        let c = r.result.csr().ok_or_else(|| {
            Error::invalid("the result holds no CSR table (its output form is not CSR)")
        })?;
        let first = if c.neighbors.is_empty() {
            std::ptr::null()
        } else {
            c.neighbors.as_ptr()
        };
        // SAFETY: the four out-pointers are non-NULL (checked) and writable (header contract).
        unsafe {
            *offsets = c.offsets.as_ptr();
            *rows = c.offsets.len() - 1;
            *neighbors = first;
            *nnz = c.neighbors.len();
        }
        Ok(())
    })
}

/// The distances of a result joined with `opts->distances` set: `*distances` holds
/// `*count` values, one per pair (PAIRS, in the pairs' order) or per CSR neighbour entry
/// (CSR, in `neighbors`' order), `float` when `*dtype` is SIMJOIN_DTYPE_F32 and `double`
/// when SIMJOIN_DTYPE_F64 (the inputs' type); owned by the result; NULL when `*count` is
/// 0. SIMJOIN_INVALID_ARGUMENT when the join was run without distances.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_distances(
    result: *const simjoin_result,
    distances: *mut *const c_void,
    count: *mut usize,
    dtype: *mut simjoin_dtype,
) -> simjoin_status {
    guard(|| {
        // SAFETY: NULL or a live result (header contract); checked for NULL here.
        let r = unsafe { result.as_ref() }.ok_or_else(|| null_arg("result"))?;
        if distances.is_null() || count.is_null() {
            return Err(null_arg(if distances.is_null() {
                "distances"
            } else {
                "count"
            }));
        }
        let d = r.result.distances.as_ref().ok_or_else(|| {
            Error::invalid("the result has no distances (join with opts->distances set)")
        })?;
        let (ptr, ty) = match d {
            Distances::F32(v) => (v.as_ptr() as *const c_void, SIMJOIN_DTYPE_F32),
            Distances::F64(v) => (v.as_ptr() as *const c_void, SIMJOIN_DTYPE_F64),
        };
        // SAFETY: out-pointers non-NULL (checked; dtype may be NULL) and writable (header
        // contract).
        unsafe {
            *distances = if d.is_empty() { std::ptr::null() } else { ptr };
            *count = d.len();
            if let Some(t) = dtype.as_mut() {
                *t = ty;
            }
        }
        Ok(())
    })
}

/// What ran: the report of a result.
#[repr(C)]
pub struct simjoin_report {
    /// Number of result pairs.
    pub pairs: u64,
    /// Wall-clock seconds of the join.
    pub seconds: f64,
    /// Batches the work was split into.
    pub batches: u64,
    /// The algorithm that actually ran (never AUTO).
    pub algorithm: simjoin_algorithm,
    /// "cpu" or "vulkan" (owned by the result).
    pub backend: *const c_char,
    /// Device name (owned by the result).
    pub device: *const c_char,
}

/// A report for C; its strings point into `backend` and `device` (kept by the result).
pub(crate) fn c_report(
    rep: &crate::result::JoinReport,
    backend: &CString,
    device: &CString,
) -> simjoin_report {
    simjoin_report {
        pairs: rep.pairs,
        seconds: rep.seconds,
        batches: rep.batches as u64,
        algorithm: rep.algorithm as u32,
        backend: backend.as_ptr(),
        device: device.as_ptr(),
    }
}

/// Fills `*report` with the result's report; its strings live as long as the result.
#[no_mangle]
pub unsafe extern "C" fn simjoin_result_report(
    result: *const simjoin_result,
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
